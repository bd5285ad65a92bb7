import type { Cluster } from 'ioredis';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../limits/count-rules.js';
import type { ConsumeRequest, Counts, StoreUnavailableError } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import type { ReceiptLedger } from './receipt-ledger.js';

/**
 * Counting requests with the consume script (docs/performance.md "Counting costs one
 * round trip"). On a single Redis, the requests that arrive in one turn of the event loop are
 * counted by one script call together: each request still waits on exactly one round trip, but
 * the client and the server handle one command (one write, one read, one reply) per batch
 * instead of one per request, and each counter of the batch is read and written once. (ioredis'
 * own auto-pipelining only joins commands of the same tick, and every connection's request is a
 * tick of its own; it is off, see connection.ts.) On a Cluster the keys of one script must share
 * a slot, so there each request's script goes alone.
 *
 * Every call carries a receipt from the ledger, which is told of every call whose answer never
 * came (redis/receipt-ledger.ts).
 */

interface Pending {
  readonly key: string;
  readonly request: ConsumeRequest;
  readonly resolve: (counts: Counts) => void;
  readonly reject: (err: StoreUnavailableError) => void;
}

interface ConsumeCommands {
  /** One counter: its key, the windows, its three arguments, the receipt. */
  oapiConsume(key: string, ...args: Array<string | number>): Promise<number[]>;
  /** `numberOfKeys`, the counters, the windows, three arguments per counter, the receipt. */
  oapiConsumeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number[]>;
}

export class ConsumeBatcher {
  readonly #client: RedisClient & ConsumeCommands;
  readonly #ledger: ReceiptLedger;
  readonly #batching: boolean;
  #batch: Pending[] = [];

  /** `batching`: requests of one turn share a call; by default on a single Redis only. */
  constructor(client: RedisClient, ledger: ReceiptLedger, options: { readonly batching?: boolean } = {}) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and
    // with the number of keys given per call, for a batch.
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    client.defineCommand('oapiConsumeMany', { lua: CONSUME_SCRIPT });
    this.#client = client as RedisClient & ConsumeCommands;
    this.#ledger = ledger;
    this.#batching = options.batching ?? !(client as Cluster).isCluster;
  }

  /** Counts one request on the counter `key`, by the rule of countStep. */
  consume(key: string, request: ConsumeRequest): Promise<Counts> {
    return new Promise((resolve, reject) => {
      const pending: Pending = { key, request, resolve, reject };
      if (!this.#batching) {
        this.#run([pending]);
        return;
      }
      // One call counts in one pair of windows: a request of other windows (a boundary just passed) starts a new call.
      const first = this.#batch[0]?.request;
      if (first && !sameWindows(first, request)) this.#send();
      if (this.#batch.push(pending) === 1) setImmediate(this.#send);
    });
  }

  readonly #send = (): void => {
    const batch = this.#batch;
    if (batch.length === 0) return;
    this.#batch = [];
    this.#run(batch);
  };

  /** One script call for the whole batch: its counters, its windows, three arguments per counter, the call's receipt. */
  #run(batch: readonly Pending[]): void {
    const receipt = this.#ledger.issue();
    const keysThenArgs: Array<string | number> = batch.map((p) => p.key);
    pushConsumeArgs(keysThenArgs, batch, receipt);
    const [firstKey, ...rest] = keysThenArgs as [string, ...Array<string | number>];
    const reply =
      batch.length === 1
        ? this.#client.oapiConsume(firstKey, ...rest)
        : this.#client.oapiConsumeMany(batch.length, ...keysThenArgs);
    reply.then(
      (counts) => {
        batch.forEach((pending, i) =>
          pending.resolve({
            allowed: counts[i * 3] === 1,
            hour: counts[i * 3 + 1] as number,
            day: counts[i * 3 + 2] as number,
          }),
        );
      },
      (err: unknown) => {
        const { hourStart, dayStart } = (batch[0] as Pending).request;
        const failure = this.#ledger.failed(receipt, { keys: batch.map((p) => p.key), hourStart, dayStart }, err);
        for (const pending of batch) pending.reject(failure);
      },
    );
  }
}

function sameWindows(a: ConsumeRequest, b: ConsumeRequest): boolean {
  return a.hourStart === b.hourStart && a.dayStart === b.dayStart && a.expireAt === b.expireAt;
}
