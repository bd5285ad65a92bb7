import type { Cluster } from 'ioredis';
import { CONSUME_SCRIPT, pushConsumeArgs, RECEIPTS_KEPT } from '../limits/count-rules.js';
import { StoreUnavailableError, type ConsumeRequest, type Counts } from '../limits/store.js';
import { commandsWaiting, MAX_COMMANDS_WAITING, RedisBehindError, type RedisClient } from './connection.js';
import type { DownMasters } from './down-masters.js';
import { toStoreError } from './errors.js';
import type { ReceiptLedger } from './receipt-ledger.js';

/**
 * Counting requests with the consume script (docs/performance.md "Counting costs one
 * round trip"). On a single Redis, requests are counted together: one script call is out at a
 * time, and the requests that come while it is out go together in the next, which leaves as soon
 * as the one before is answered, or after MAX_WAIT_MS if that answer is slow in coming. Each
 * request still waits on exactly one round trip of its own, but the client and the server handle
 * one command (one write, one read, one reply) per batch instead of one per request, and each
 * counter of the batch is read and written once. (ioredis' own auto-pipelining only joins
 * commands of the same tick, and every connection's request is a tick of its own; it is off, see
 * connection.ts.) On a Cluster the keys of one script must share a slot, so there each request's
 * script goes alone.
 *
 * A request so waits for its counting at most MAX_WAIT_MS longer than REDIS_TIMEOUT_MS
 * (docs/operations.md "Redis"): never for a second timeout behind the first.
 *
 * Every call carries a receipt from the ledger, which is told how every call ended
 * (redis/receipt-ledger.ts). No call is sent on a connection that is not ready (it could not
 * run), nor while MAX_CALLS_OUT are out: its requests are decided as when Redis is away. On a
 * Cluster, a call that fails on its master's connection marks that master as away until a call
 * there is answered (redis/down-masters.ts), and the calls for its slots are not sent meanwhile,
 * but for one a second that tries it again: the failures of both kinds are the store's `part` only.
 */

/**
 * How long requests wait for the call before theirs to be answered before they go in a call of
 * their own. Far longer than a call takes under load (a millisecond or two), so it seldom fires;
 * it only bounds the wait behind a slow call.
 */
export const MAX_WAIT_MS = 5;

/**
 * Calls out at once at most (docs/operations.md "Redis"), on a single Redis, or per counter on a
 * Cluster: half the receipts a counter keeps of one instance, so that the calls between one in
 * doubt and its undo never push its receipt out. Far more than are out even behind a stalled
 * Redis (REDIS_TIMEOUT_MS / MAX_WAIT_MS with batching, one per request waiting on a Cluster).
 */
export const MAX_CALLS_OUT = RECEIPTS_KEPT / 2;

interface Pending {
  readonly key: string;
  readonly request: ConsumeRequest;
  readonly resolve: (counts: Counts) => void;
  readonly reject: (err: StoreUnavailableError) => void;
}

interface ConsumeCommands {
  /** One counter: its key, the windows, its limits, the receipt. */
  oapiConsume(key: string, ...args: Array<string | number>): Promise<number[]>;
  /** `numberOfKeys`, the counters, the windows, the limits of every counter, the receipt. */
  oapiConsumeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number[]>;
}

export class ConsumeBatcher {
  readonly #client: RedisClient & ConsumeCommands;
  readonly #ledger: ReceiptLedger;
  readonly #batching: boolean;
  /** Requests waiting for the next call. */
  #batch: Pending[] = [];
  /** Calls sent and not answered yet: one, or more behind a slow one (MAX_WAIT_MS) or at a window boundary. */
  #inFlight = 0;
  /** Without batching (a Cluster), the calls out per counter: a node that is down holds back only its own. */
  readonly #inFlightByKey = new Map<string, number>();
  /** The next call is due in the next check phase of the event loop (setImmediate). */
  #due = false;
  readonly #maxWaitMs: number;
  readonly #downMasters: DownMasters | undefined;
  /** Sends the waiting requests if the call before them is still out after #maxWaitMs. */
  #waitLimit: NodeJS.Timeout | undefined;

  /**
   * `batching`: requests share calls; by default on a single Redis only. `maxWaitMs`: how long
   * requests wait behind a call that is out (MAX_WAIT_MS; the tests set it). `downMasters`: on a
   * Cluster, the masters taken as away (shared with the outage merge).
   */
  constructor(
    client: RedisClient,
    ledger: ReceiptLedger,
    options: { readonly batching?: boolean; readonly maxWaitMs?: number; readonly downMasters?: DownMasters } = {},
  ) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and
    // with the number of keys given per call, for a batch.
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    client.defineCommand('oapiConsumeMany', { lua: CONSUME_SCRIPT });
    this.#client = client as RedisClient & ConsumeCommands;
    this.#ledger = ledger;
    this.#batching = options.batching ?? !(client as Cluster).isCluster;
    this.#maxWaitMs = options.maxWaitMs ?? MAX_WAIT_MS;
    this.#downMasters = this.#batching ? undefined : options.downMasters;
  }

  /** Counts one request on the counter `key`, by the rule of countStep. */
  consume(key: string, request: ConsumeRequest): Promise<Counts> {
    return new Promise((resolve, reject) => {
      const pending: Pending = { key, request, resolve, reject };
      if (!this.#batching) {
        this.#run([pending]);
        return;
      }
      // One call counts in one pair of windows: a request of other windows (a boundary just passed)
      // sends the requests before it at once and starts the next batch.
      const first = this.#batch[0]?.request;
      if (first && !sameWindows(first, request)) this.#run(this.#take());
      this.#batch.push(pending);
      this.#sendWhenFree();
    });
  }

  /**
   * Schedules the next call for the check phase of this turn; while a call is out, its answer
   * schedules it, or MAX_WAIT_MS does.
   */
  #sendWhenFree(): void {
    if (this.#due || this.#batch.length === 0) return;
    if (this.#inFlight > 0) {
      this.#waitLimit ??= setTimeout(this.#sendAnyway, this.#maxWaitMs);
      return;
    }
    this.#due = true;
    setImmediate(this.#send);
  }

  readonly #send = (): void => {
    this.#due = false;
    if (this.#inFlight === 0) {
      if (this.#batch.length > 0) this.#run(this.#take());
    } else this.#sendWhenFree();
  };

  readonly #sendAnyway = (): void => {
    this.#waitLimit = undefined;
    if (this.#batch.length > 0) this.#run(this.#take());
  };

  #take(): Pending[] {
    clearTimeout(this.#waitLimit);
    this.#waitLimit = undefined;
    const batch = this.#batch;
    this.#batch = [];
    return batch;
  }

  /** One script call for the whole batch: its counters, its windows, their limits, the call's receipt. */
  #run(batch: readonly Pending[]): void {
    const notSent = this.#cannotSend(batch);
    if (notSent) {
      for (const pending of batch) pending.reject(notSent);
      return;
    }
    const alone = this.#batching ? undefined : (batch[0] as Pending).key;
    // On a Cluster (never batching), a master taken as away gets no call but the one that tries it again.
    const down = alone === undefined ? undefined : this.#downMasters;
    const gate = down?.tryFor(alone as string) ?? 'send';
    if (gate === 'away') {
      const away = new StoreUnavailableError(
        'connection',
        `Redis unavailable: Cluster master ${down?.masterOf(alone as string)} is away`,
        { part: true },
      );
      for (const pending of batch) pending.reject(away);
      return;
    }
    if (alone !== undefined) this.#inFlightByKey.set(alone, (this.#inFlightByKey.get(alone) ?? 0) + 1);
    const receipt = this.#ledger.issue(alone);
    const keysThenArgs: Array<string | number> = batch.map((p) => p.key);
    pushConsumeArgs(keysThenArgs, batch, receipt);
    const [firstKey, ...rest] = keysThenArgs as [string, ...Array<string | number>];
    const reply =
      batch.length === 1
        ? this.#client.oapiConsume(firstKey, ...rest)
        : this.#client.oapiConsumeMany(batch.length, ...keysThenArgs);
    this.#inFlight++;
    const failed = (err: unknown): void => {
      this.#answered(alone);
      // One master's connection failed, or the call that tried a master taken as away failed in
      // any way, while the Cluster still answers for the others: that master is marked first, so
      // that the ledger sends no undo there but the one a second that tries it.
      let part = false;
      if (down && (gate === 'probe' || toStoreError(err).kind === 'connection')) part = down.failed(alone as string);
      const failure = this.#ledger.failed(receipt, { keys: batch.map((p) => p.key) }, err);
      const typed = part
        ? new StoreUnavailableError(failure.kind, failure.message, { cause: failure.cause, part })
        : failure;
      for (const pending of batch) pending.reject(typed);
      this.#sendWhenFree();
    };
    reply.then((counts) => {
      // Three counts per counter, or the reply is not this call's (a connection out of step):
      // whether the call counted is then in doubt, as for a connection lost mid-call.
      if (!Array.isArray(counts) || counts.length !== batch.length * 3) {
        failed(new Error('the counting script answered with a reply of another shape'));
        return;
      }
      this.#answered(alone);
      // A master taken as away answers again (the ledger then sends the undos held back for it).
      down?.answered(alone as string);
      this.#ledger.settled(receipt);
      this.#sendWhenFree();
      batch.forEach((pending, i) => {
        const allowed = counts[i * 3];
        if (allowed === -1) return pending.reject(otherTypeAt(pending.key));
        pending.resolve({
          allowed: allowed === 1,
          hour: counts[i * 3 + 1] as number,
          day: counts[i * 3 + 2] as number,
        });
      });
    }, failed);
  }

  /** A call is no longer out (`alone`: its one counter, without batching). */
  #answered(alone: string | undefined): void {
    this.#inFlight--;
    if (alone === undefined) return;
    const out = (this.#inFlightByKey.get(alone) ?? 1) - 1;
    if (out > 0) this.#inFlightByKey.set(alone, out);
    else this.#inFlightByKey.delete(alone);
  }

  /** Why a call cannot be sent now, if it cannot: it would not run, or its receipt could not be kept. */
  #cannotSend(batch: readonly Pending[]): StoreUnavailableError | undefined {
    if (this.#client.status !== 'ready') {
      return new StoreUnavailableError('connection', `Redis unavailable: connection ${this.#client.status}`);
    }
    // Not even sent (no receipt in doubt): the connection holds as many unanswered commands as it may.
    if (commandsWaiting(this.#client) >= MAX_COMMANDS_WAITING) return toStoreError(new RedisBehindError());
    const out = this.#batching ? this.#inFlight : (this.#inFlightByKey.get((batch[0] as Pending).key) ?? 0);
    if (out >= MAX_CALLS_OUT) {
      return new StoreUnavailableError('timeout', `Redis is behind: ${MAX_CALLS_OUT} calls out`);
    }
    return undefined;
  }
}

function sameWindows(a: ConsumeRequest, b: ConsumeRequest): boolean {
  return a.hourStart === b.hourStart && a.dayStart === b.dayStart && a.expireAt === b.expireAt && a.zone === b.zone;
}

/**
 * A request whose counter key holds something else than a counter (another program wrote it):
 * Redis answered, about that key only, so the store is not away (`part`); the request is decided
 * as when Redis is away, and the other keys are counted in Redis meanwhile.
 */
function otherTypeAt(key: string): StoreUnavailableError {
  return new StoreUnavailableError('reply', `Redis refused the command: ${key} holds something else than a counter`, {
    part: true,
  });
}
