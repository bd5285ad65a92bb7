import { randomBytes } from 'node:crypto';
import type { Receipt } from '../limits/count-rules.js';
import type { StoreUnavailableError } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

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
 * (redis/connection.ts), and should one run after its undo all the same (on a Cluster that is
 * resharding, a call that timed out is redirected to its slot's new master once the old one
 * answers, and may run there after its undo), the undo left a receipt with no units in each of its
 * counters, which stays for TAKEN_BACK_KEPT_MS, and the script counts nothing for a call whose
 * receipt it holds.
 *
 * A call is unsettled from the moment it is sent until it is answered, or, in doubt, until its
 * units were taken back; each call tells the script the oldest unsettled one, and the script
 * keeps every receipt from there on (up to RECEIPTS_KEPT of the instance). So a receipt is still
 * there when its undo runs: the undo is sent as soon as the call fails on a live connection, or
 * when a new one is ready, so the calls that run between a call in doubt and its undo are those
 * that were out with it, fewer than the batcher lets out at once (MAX_CALLS_OUT).
 */

/**
 * Takes back the units a call added to a counter, if (and only if) its receipt is recorded there,
 * and leaves the receipt with no units, so a second undo takes nothing, and the call itself counts
 * nothing should it ever run afterwards (the consume script knows a call it holds a receipt of).
 * Where the call has not run, the undo leaves such a receipt all the same (on a Cluster, a call
 * that timed out can still be redirected to its slot's new master and run there after its undo);
 * a key that held no counter then lives only for ARGV[3] ms. ARGV: the receipt's field and
 * sequence number, that lifetime. The receipt names the windows the units went in: a window the
 * counter has left since keeps its count. Answers the units taken back.
 */
export const UNDO_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc', ARGV[1])
local s, e
if v[5] then s, e = string.find(',' .. v[5], ',' .. ARGV[2] .. ':', 1, true) end
if not s then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':0:0:0,' .. (v[5] or ''))
  if not v[1] and not v[3] then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return 0
end
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

/**
 * How long the receipts a call taken back leaves in its counters (with no units) stay there, and
 * a key the undo made for one lives: a call that timed out on a Cluster master and is redirected
 * to its slot's new master once the old one answers (MOVED, ASK) finds it there within this time
 * and counts nothing (docs/operations.md "Redis").
 */
export const TAKEN_BACK_KEPT_MS = 60_000;

/**
 * An undo Redis refused because the key is no counter (something else was written there) has
 * nothing to take back: the call is settled, or it would stay unsettled for good. Any other
 * refusal (out of memory, a read-only replica, a busy script) leaves it in doubt, tried again.
 */
function notACounter(err: unknown): number {
  if (err instanceof Error && err.name === 'ReplyError' && err.message.startsWith('WRONGTYPE')) return 0;
  throw err;
}

/** A counting call: its counters (repeats allowed). */
export interface CountingCall {
  readonly keys: Iterable<string>;
}

interface DoubtfulCall {
  readonly keys: ReadonlySet<string>;
}

interface UndoCommand {
  oapiUndo(key: string, field: string, seq: number, keptMs: number): Promise<number>;
}

export interface ReceiptLedgerOptions {
  /** TAKEN_BACK_KEPT_MS unless given (tests). */
  readonly takenBackKeptMs?: number;
  /** Milliseconds of a clock that never goes back; performance.now unless given. */
  readonly now?: () => number;
}

export class ReceiptLedger {
  readonly #client: RedisClient & UndoCommand;
  /** This instance's field in every counter: receipts of different instances never meet. */
  readonly #field = 'rc:' + randomBytes(6).toString('base64url');
  #nextSeq = 0;
  /** Sequence numbers of calls sent and not settled yet, ascending; settled ones leave lazily (#settledEarly). */
  readonly #unsettled: number[] = [];
  #unsettledHead = 0;
  /** Calls settled while an older one is still unsettled. */
  readonly #settledEarly = new Set<number>();
  readonly #inDoubt = new Map<number, DoubtfulCall>();
  /** Calls taken back, and until when their receipts stay. */
  readonly #takenBack: Array<{ readonly seq: number; readonly until: number }> = [];
  readonly #takenBackKeptMs: number;
  readonly #now: () => number;
  #reconciling: Promise<void> | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;

  constructor(client: RedisClient, options: ReceiptLedgerOptions = {}) {
    client.defineCommand('oapiUndo', { numberOfKeys: 1, lua: UNDO_SCRIPT });
    this.#client = client as RedisClient & UndoCommand;
    this.#takenBackKeptMs = options.takenBackKeptMs ?? TAKEN_BACK_KEPT_MS;
    this.#now = options.now ?? (() => performance.now());
    client.on('ready', this.#onReady);
  }

  readonly #onReady = (): void => void this.reconcile();

  /** Calls whose units may still have to be taken back. */
  get inDoubt(): number {
    return this.#inDoubt.size;
  }

  /** Calls sent and not settled yet (answered, or taken back). */
  get unsettled(): number {
    return this.#unsettled.length - this.#unsettledHead - this.#settledEarly.size;
  }

  /** The receipt of a new call, which is unsettled from now on until settled() or failed() and taken back. */
  issue(): Receipt {
    const seq = this.#nextSeq++;
    this.#unsettled.push(seq);
    const oldestUnsettled = this.#oldestUnsettled();
    const oldestTakenBack = this.#takenBack.length === 0 ? oldestUnsettled : this.#oldestTakenBack(oldestUnsettled);
    return { field: this.#field, seq, oldestUnsettled, oldestTakenBack };
  }

  /** The oldest call taken back whose receipts still stay, or `oldestUnsettled` when it is older; forgets the others. */
  #oldestTakenBack(oldestUnsettled: number): number {
    const now = this.#now();
    let oldest = oldestUnsettled;
    let kept = 0;
    for (const call of this.#takenBack) {
      if (call.until <= now) continue;
      this.#takenBack[kept++] = call;
      oldest = Math.min(oldest, call.seq);
    }
    this.#takenBack.length = kept;
    return oldest;
  }

  /** The call was answered: nothing to take back. */
  settled(receipt: Receipt): void {
    this.#settle(receipt.seq);
  }

  #settle(seq: number): void {
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
    if (this.#client.status === 'ready') void this.#undo(receipt.seq, doubtful);
    return failure;
  }

  /** Takes back the units of doubtful calls that Redis did count. Safe to call at any time. */
  reconcile(): Promise<void> {
    if (this.#inDoubt.size === 0 || this.#client.status !== 'ready') return Promise.resolve();
    // Each call is settled as soon as its own undo is through: one counter on a Cluster node that
    // is down holds back no other. What fails is tried again by the timer, or on 'ready'.
    this.#reconciling ??= Promise.all([...this.#inDoubt].map(([seq, call]) => this.#undo(seq, call))).then(() => {
      this.#reconciling = undefined;
    });
    return this.#reconciling;
  }

  /** The undo of one doubtful call, on every counter it touched; the call is settled once it is through. */
  async #undo(seq: number, call: DoubtfulCall): Promise<void> {
    try {
      // Commands of one connection run in order, so each undo runs after its doubtful call (if that ever runs).
      await Promise.all(
        [...call.keys].map((key) =>
          this.#client.oapiUndo(key, this.#field, seq, this.#takenBackKeptMs).catch(notACounter),
        ),
      );
    } catch {
      // Redis is away again (or the undo timed out behind a slow Redis, where it still runs): tried again later.
      return;
    }
    if (this.#inDoubt.delete(seq)) {
      this.#settle(seq);
      this.#takenBack.push({ seq, until: this.#now() + this.#takenBackKeptMs });
    }
    if (this.#inDoubt.size === 0) {
      clearInterval(this.#reconcileTimer);
      this.#reconcileTimer = undefined;
    }
  }

  /** Stops reconciling by itself (on shutdown, after a last reconcile()). */
  close(): void {
    clearInterval(this.#reconcileTimer);
    this.#client.off('ready', this.#onReady);
  }
}
