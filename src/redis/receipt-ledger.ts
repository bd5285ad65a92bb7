import { randomBytes } from 'node:crypto';
import type { Receipt } from '../limits/count-rules.js';
import type { StoreUnavailableError } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import type { DownMasters } from './down-masters.js';
import { notACounter, toStoreError } from './errors.js';

/**
 * The receipts of this instance's counting calls (docs/operations.md "Redis": no unit is counted
 * twice). A call whose answer never came (it timed out, or the connection died before the
 * reply) may or may not have counted; the caller counts its requests elsewhere (insurance) or
 * refuses them (503), so units it left in Redis would be counted twice. Every call therefore
 * carries a receipt from this ledger, which the consume script (limits/count-rules.ts) records
 * as `seq:units:hourStart:dayStart` in the instance's own field of each counter it added to (the
 * windows the units went in); the ledger takes back the units of every receipt it never heard
 * about — at once after a timeout, otherwise as soon as Redis answers again; on a single Redis on
 * the same connection, so after the doubtful call if that ever runs. A call is never sent twice
 * (redis/connection.ts), and should one run again after its undo all the same, the undo left its
 * receipt with no units, and the script counts nothing for a call whose receipt it holds. (Nor does
 * the Cluster client follow a redirection for a call that has failed: redis/connection.ts.)
 *
 * A call is unsettled from the moment it is sent until it is answered, or, in doubt, until its
 * units were taken back; each call tells the script the oldest unsettled one, and the script
 * keeps every receipt from there on (up to RECEIPTS_KEPT of the instance). A call of one counter
 * (on a Cluster, every call) names the oldest unsettled call of that counter: a call in doubt
 * behind a master that is away then keeps no receipts in the counters of the other masters. So a
 * receipt is still there when its undo runs: the undo is sent as soon as the call fails on a live connection, or
 * when a new one is ready, or (a Cluster master taken as away) as soon as a call there is
 * answered again, so the calls that run between a call in doubt and its undo are those that were
 * out with it, fewer than the batcher lets out at once (MAX_CALLS_OUT), or the one that tried the
 * master again.
 */

/**
 * Takes back the units a call added to a counter, if (and only if) its receipt is recorded there,
 * and leaves the receipt with no units, so a second undo takes nothing, and the call itself counts
 * nothing should it ever run afterwards (the consume script knows a call it holds a receipt of).
 * ARGV: the receipt's field and sequence number. The receipt names the windows the units went
 * in: a window the counter has left since keeps its count.
 */
export const UNDO_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc', ARGV[1])
if not v[5] then return 0 end
local s, e = string.find(',' .. v[5], ',' .. ARGV[2] .. ':', 1, true)
if not s then return 0 end
local stop = string.find(v[5], ',', e, true)
local units, hs, ds = string.match(string.sub(v[5], e, stop - 1), '^(%d+):(%d+):(%d+)$')
local before, after = string.sub(v[5], 1, s - 1), string.sub(v[5], stop + 1)
-- The receipt stays with no units (one that cannot be read goes).
local rc = units and (before .. ARGV[2] .. ':0:' .. hs .. ':' .. ds .. ',' .. after) or (before .. after)
local hc = tonumber(v[2])
local dc = tonumber(v[4])
if units then
  if tonumber(v[1]) == tonumber(hs) then hc = math.max(0, hc - tonumber(units)) end
  if tonumber(v[3]) == tonumber(ds) then dc = math.max(0, dc - tonumber(units)) end
end
redis.call('HSET', KEYS[1], 'hc', hc, 'dc', dc, ARGV[1], rc)
return tonumber(units) or 0
`;

const RECONCILE_EVERY_MS = 500;

/** A counting call: its counters (repeats allowed). */
export interface CountingCall {
  readonly keys: Iterable<string>;
}

interface DoubtfulCall {
  readonly keys: ReadonlySet<string>;
}

interface UndoCommand {
  oapiUndo(key: string, field: string, seq: number): Promise<number>;
}

export class ReceiptLedger {
  readonly #client: RedisClient & UndoCommand;
  /** This instance's field in every counter: receipts of different instances never meet. */
  readonly #field = 'rc:' + randomBytes(6).toString('base64url');
  #nextSeq = 0;
  /** Calls of several counters sent and not settled yet, ascending; settled ones leave lazily (#settledEarly). */
  readonly #unsettled: number[] = [];
  #unsettledHead = 0;
  /** Calls settled while an older one is still unsettled. */
  readonly #settledEarly = new Set<number>();
  readonly #inDoubt = new Map<number, DoubtfulCall>();
  /** Whether this ledger's calls are of one counter each (set by the first). */
  #ofOneCounter: boolean | undefined;
  /** Calls of one counter not settled yet, per counter, in the order they were issued. */
  readonly #unsettledOf = new Map<string, number[]>();
  /** The counter of each such call. */
  readonly #counterOf = new Map<number, string>();
  readonly #downMasters: DownMasters | undefined;
  #reconciling: Promise<void> | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;
  /** Calls whose undo is out. */
  readonly #undoing = new Set<number>();
  /** Whether #sendHeldBackUndos() is sending, and was told again meanwhile. */
  #heldBack: 'idle' | 'sending' | 'again' = 'idle';
  /**
   * On a single Redis, an undo timed out on the connection that is still up: Redis is stalled, and
   * what is sent queues behind it. A round then sends one undo, which tries it, and the others only
   * once one is answered (or a new connection is ready): one undo of every call in doubt each round
   * would pile up there, more each round, for as long as the stall lasts.
   */
  #stalled = false;

  /** `downMasters`: on a Cluster, the masters taken as away, to which no undo is sent but the one a second that tries them. */
  constructor(client: RedisClient, options: { readonly downMasters?: DownMasters } = {}) {
    client.defineCommand('oapiUndo', { numberOfKeys: 1, lua: UNDO_SCRIPT });
    this.#client = client as RedisClient & UndoCommand;
    this.#downMasters = options.downMasters;
    this.#downMasters?.onBack(() => this.#sendHeldBackUndos());
    client.on('ready', this.#onReady);
  }

  readonly #onReady = (): void => {
    this.#stalled = false;
    void this.reconcile();
  };

  /** Calls whose units may still have to be taken back. */
  get inDoubt(): number {
    return this.#inDoubt.size;
  }

  /** Calls sent and not settled yet (answered, or taken back). */
  get unsettled(): number {
    if (this.#ofOneCounter) return this.#counterOf.size;
    return this.#unsettled.length - this.#unsettledHead - this.#settledEarly.size;
  }

  /**
   * The receipt of a new call, which is unsettled from now on until settled() or failed() and
   * taken back; `counter`: the call's one counter. A ledger's calls are all of one counter each
   * (a Cluster's), or none is.
   */
  issue(counter?: string): Receipt {
    const seq = this.#nextSeq++;
    this.#ofOneCounter ??= counter !== undefined;
    if (this.#ofOneCounter !== (counter !== undefined))
      throw new Error('ReceiptLedger: calls of one counter and of several in one ledger');
    if (counter === undefined) {
      this.#unsettled.push(seq);
      return { field: this.#field, seq, oldestUnsettled: this.#oldestUnsettled() };
    }
    let calls = this.#unsettledOf.get(counter);
    if (!calls) this.#unsettledOf.set(counter, (calls = []));
    calls.push(seq);
    this.#counterOf.set(seq, counter);
    return { field: this.#field, seq, oldestUnsettled: calls[0] as number };
  }

  /** The call was answered: nothing to take back. */
  settled(receipt: Receipt): void {
    this.#settle(receipt.seq);
  }

  #settle(seq: number): void {
    if (this.#ofOneCounter) {
      const counter = this.#counterOf.get(seq);
      if (counter === undefined) return; // settled before
      this.#counterOf.delete(seq);
      const calls = this.#unsettledOf.get(counter) as number[];
      calls.splice(calls.indexOf(seq), 1);
      if (calls.length === 0) this.#unsettledOf.delete(counter);
      return;
    }
    if (seq < this.#oldestUnsettled()) return; // settled before
    if (this.#unsettled[this.#unsettledHead] !== seq) {
      this.#settledEarly.add(seq);
      return;
    }
    this.#unsettledHead++;
    while (
      this.#unsettledHead < this.#unsettled.length &&
      this.#settledEarly.delete(this.#unsettled[this.#unsettledHead] as number)
    ) {
      this.#unsettledHead++;
    }
    // The array only grows at its end and is read from its head: drop the read part now and then.
    if (this.#unsettledHead > 1024 && this.#unsettledHead * 2 > this.#unsettled.length) {
      this.#unsettled.splice(0, this.#unsettledHead);
      this.#unsettledHead = 0;
    }
  }

  #oldestUnsettled(): number {
    return this.#unsettledHead < this.#unsettled.length
      ? (this.#unsettled[this.#unsettledHead] as number)
      : this.#nextSeq;
  }

  /**
   * A call failed: unless Redis refused it outright (then nothing ran), it may have counted, and
   * its receipt is held in doubt until its units were taken back. Returns the failure as the
   * typed store error.
   */
  failed(receipt: Receipt, call: CountingCall, err: unknown): StoreUnavailableError {
    const failure = toStoreError(err);
    if (failure.kind === 'reply') {
      this.settled(receipt);
      return failure;
    }
    const doubtful = { keys: new Set(call.keys) };
    this.#inDoubt.set(receipt.seq, doubtful);
    this.#reconcileTimer ??= setInterval(() => void this.reconcile(), RECONCILE_EVERY_MS).unref();
    // On a connection still up (a timed-out call is still queued on it) the undo goes at once: right
    // behind the doubtful call and ahead of every call sent after this, none of which can then push
    // its receipt out first. On a connection that is down, 'ready' sends it, before any new call.
    if (this.#client.status === 'ready' && !this.#behindMasterAway(doubtful)) void this.#undo(receipt.seq, doubtful);
    return failure;
  }

  /**
   * Marks of a Cluster master taken as away were cleared (it answered a call, or a fail-over
   * replaced it): the undos held back for it go now, on its connection ahead of every call sent
   * after this (so none of those can push a receipt out first), not with the next reconcile round.
   */
  #sendHeldBackUndos(): void {
    if (this.#inDoubt.size === 0 || this.#client.status !== 'ready') return;
    // A sweep of the marks while this runs (tryFor) tells it again: it goes round once more then,
    // rather than within itself.
    if (this.#heldBack !== 'idle') {
      this.#heldBack = 'again';
      return;
    }
    do {
      this.#heldBack = 'sending';
      for (const [seq, call] of this.#inDoubt)
        if (!this.#undoing.has(seq) && !this.#behindMasterAway(call)) void this.#undo(seq, call);
    } while ((this.#heldBack as 'sending' | 'again') === 'again');
    this.#heldBack = 'idle';
  }

  /** Takes back the units of doubtful calls that Redis did count. Safe to call at any time. */
  reconcile(): Promise<void> {
    if (this.#inDoubt.size === 0 || this.#client.status !== 'ready') return Promise.resolve();
    // Each call is settled as soon as its own undo is through: one counter on a Cluster node that
    // is down holds back no other. What fails is tried again by the timer, or on 'ready'; a call
    // of a master taken as away waits, but for the one undo a second that tries the master.
    this.#reconciling ??= this.#round().then(() => {
      this.#reconciling = undefined;
    });
    return this.#reconciling;
  }

  /** One round of undos: every call in doubt's, or behind a stalled Redis the first's, and the others' once it is answered. */
  async #round(): Promise<void> {
    const calls = [...this.#inDoubt].filter(([, call]) => !this.#behindMasterAway(call));
    if (this.#stalled && calls.length > 0) {
      const [seq, call] = calls.shift() as [number, DoubtfulCall];
      await this.#undo(seq, call);
      if (this.#stalled) return;
    }
    await Promise.all(calls.map(([seq, call]) => this.#undo(seq, call)));
  }

  /**
   * Whether the undo of `call` must wait: a counter of it is on a master taken as away. Once a
   * second the undo itself tries the master (an undo is harmless to send twice), so that its calls
   * in doubt are taken back even when no request comes for its keys.
   */
  #behindMasterAway(call: DoubtfulCall): boolean {
    if (!this.#downMasters?.any) return false;
    for (const key of call.keys) if (this.#downMasters.tryFor(key) === 'away') return true;
    return false;
  }

  /** The undo of one doubtful call, on every counter it touched; the call is settled once it is through. */
  async #undo(seq: number, call: DoubtfulCall): Promise<void> {
    this.#undoing.add(seq);
    try {
      // Commands of one connection run in order, so each undo runs after its doubtful call (if that ever runs).
      await Promise.all(
        [...call.keys].map((key) =>
          this.#client.oapiUndo(key, this.#field, seq).catch((err: unknown) => this.#undoFailed(key, err)),
        ),
      );
    } catch (err) {
      // Redis is away again (or the undo timed out behind a slow Redis, where it still runs): tried again later.
      // A refusal (out of memory) is an answer: the connection is not stalled.
      this.#stalled = !this.#downMasters && this.#client.status === 'ready' && toStoreError(err).kind === 'timeout';
      return;
    } finally {
      this.#undoing.delete(seq);
    }
    this.#stalled = false;
    if (this.#inDoubt.delete(seq)) this.#settle(seq);
    // Its masters answered: one taken as away is back.
    for (const key of call.keys) this.#downMasters?.answered(key);
    if (this.#inDoubt.size === 0) {
      clearInterval(this.#reconcileTimer);
      this.#reconcileTimer = undefined;
    }
  }

  /**
   * An undo that failed on one counter. One Redis refused because the key is no counter has
   * nothing to take back: the call is settled, or it would stay unsettled for good. Any other
   * failure leaves it in doubt, tried again; on a Cluster it marks the counter's master as away
   * (a master that fails an undo in any way fails the calls counted there too).
   */
  #undoFailed(key: string, err: unknown): number {
    if (notACounter(err)) return 0;
    this.#downMasters?.failed(key);
    throw err;
  }

  /** Stops reconciling by itself (on shutdown, after a last reconcile()). */
  close(): void {
    clearInterval(this.#reconcileTimer);
    this.#client.off('ready', this.#onReady);
  }
}
