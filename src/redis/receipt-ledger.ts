import { randomBytes } from 'node:crypto';
import { RECEIPTS_KEPT, type Receipt } from '../limits/count-rules.js';
import type { StoreUnavailableError, WindowIds } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * The receipts of this instance's counting calls (docs/operations.md "Redis": no unit is counted
 * twice). A call whose answer never came (it timed out, or the connection died before the
 * reply) may or may not have counted; the caller counts its requests elsewhere (insurance) or
 * refuses them (503), so units it left in Redis would be counted twice. Every call therefore
 * carries a receipt from this ledger, which the consume script (limits/count-rules.ts) records
 * as `seq:units` in the instance's own field of each counter it added to; the ledger takes back
 * the units of every receipt it never heard about — at once after a timeout, otherwise as soon
 * as Redis answers again, and always on the same connection, so after the doubtful call if that
 * ever runs.
 *
 * A call is unsettled from the moment it is sent until it is answered, or, in doubt, until its
 * units were taken back; each call tells the script the oldest unsettled one, and the script
 * keeps every receipt from there on (up to RECEIPTS_KEPT of the instance). So a receipt is still
 * there when its undo comes, however many calls went in between: the calls sent after a call in
 * doubt and before its undo are at most those unsettled with it, fewer than MAX_UNSETTLED_CALLS.
 */

/**
 * Takes back the units a call added to a counter, if (and only if) its receipt is recorded there,
 * and drops the receipt, so a second undo takes nothing. ARGV: the receipt's field and sequence
 * number, hourStart, dayStart (the windows the call counted in: a window the counter has left
 * since keeps its count).
 */
const UNDO_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc', ARGV[1])
if not v[5] then return 0 end
local s, e = string.find(',' .. v[5], ',' .. ARGV[2] .. ':', 1, true)
if not s then return 0 end
local stop = string.find(v[5], ',', e, true)
local units = tonumber(string.sub(v[5], e, stop - 1))
local rc = string.sub(v[5], 1, s - 1) .. string.sub(v[5], stop + 1)
local hc = tonumber(v[2])
local dc = tonumber(v[4])
if tonumber(v[1]) == tonumber(ARGV[3]) then hc = math.max(0, hc - units) end
if tonumber(v[3]) == tonumber(ARGV[4]) then dc = math.max(0, dc - units) end
redis.call('HSET', KEYS[1], 'hc', hc, 'dc', dc, ARGV[1], rc)
return units
`;

/**
 * Unsettled calls of one instance at most (docs/operations.md "Redis"). Beyond, a request is not
 * sent (it is decided as when Redis is away). Far more than one instance has out even behind a
 * stalled Redis (REDIS_TIMEOUT_MS / 5 ms); half of what a counter keeps of one instance.
 */
export const MAX_UNSETTLED_CALLS = RECEIPTS_KEPT / 2;
const RECONCILE_EVERY_MS = 500;

/**
 * An undo Redis refused (the key is no counter: something else was written there) has nothing to
 * take back; the call is settled like the others, or it would stay unsettled for good and, past
 * MAX_UNSETTLED_CALLS, keep the instance from counting in Redis at all.
 */
function notACounter(err: unknown): number {
  if (toStoreError(err).kind === 'reply') return 0;
  throw err;
}

/** A counting call: its counters (repeats allowed) and the windows it counted in. */
export interface CountingCall extends WindowIds {
  readonly keys: Iterable<string>;
}

interface DoubtfulCall extends WindowIds {
  readonly keys: ReadonlySet<string>;
}

interface UndoCommand {
  oapiUndo(key: string, field: string, seq: number, hourStart: number, dayStart: number): Promise<number>;
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
  #reconciling: Promise<void> | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;

  constructor(client: RedisClient) {
    client.defineCommand('oapiUndo', { numberOfKeys: 1, lua: UNDO_SCRIPT });
    this.#client = client as RedisClient & UndoCommand;
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
    return { field: this.#field, seq, oldestUnsettled: this.#oldestUnsettled() };
  }

  /** The call was answered: nothing to take back. */
  settled(receipt: Receipt): void {
    const { seq } = receipt;
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
   * its receipt is held in doubt until reconciled. Returns the failure as the typed store error.
   */
  failed(receipt: Receipt, call: CountingCall, err: unknown): StoreUnavailableError {
    const failure = toStoreError(err);
    if (failure.kind === 'reply') {
      this.settled(receipt);
      return failure;
    }
    this.#inDoubt.set(receipt.seq, { keys: new Set(call.keys), hourStart: call.hourStart, dayStart: call.dayStart });
    this.#reconcileTimer ??= setInterval(() => void this.reconcile(), RECONCILE_EVERY_MS).unref();
    // A timed-out call is still queued on a live connection: the undo goes right behind it.
    if (failure.kind === 'timeout') void this.reconcile();
    return failure;
  }

  /** Takes back the units of doubtful calls that Redis did count. Safe to call at any time. */
  reconcile(): Promise<void> {
    if (this.#inDoubt.size === 0 || this.#client.status !== 'ready') return Promise.resolve();
    this.#reconciling ??= (async () => {
      const pending = [...this.#inDoubt];
      let done = false;
      try {
        // Commands of one connection run in order, so each undo runs after its doubtful call (if that ever runs).
        await Promise.all(
          pending.flatMap(([seq, call]) =>
            [...call.keys].map((key) =>
              this.#client.oapiUndo(key, this.#field, seq, call.hourStart, call.dayStart).catch(notACounter),
            ),
          ),
        );
        for (const [seq] of pending) {
          this.#inDoubt.delete(seq);
          this.settled({ field: this.#field, seq, oldestUnsettled: 0 });
        }
        if (this.#inDoubt.size === 0) {
          clearInterval(this.#reconcileTimer);
          this.#reconcileTimer = undefined;
        }
        done = true;
      } catch {
        // Redis is away again (or the undo timed out behind a slow Redis, where it still runs): the next attempt settles it.
      } finally {
        this.#reconciling = undefined;
      }
      // Calls that fell in doubt while this round was out are taken back at once, not at the next tick of the timer.
      if (done && this.#inDoubt.size > 0) await this.reconcile();
    })();
    return this.#reconciling;
  }

  /** Stops reconciling by itself (on shutdown, after a last reconcile()). */
  close(): void {
    clearInterval(this.#reconcileTimer);
    this.#client.off('ready', this.#onReady);
  }
}
