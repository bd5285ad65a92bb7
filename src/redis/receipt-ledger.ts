import { randomBytes } from 'node:crypto';
import type { StoreUnavailableError, WindowIds } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * The receipts of counting calls whose answer never came (docs/operations.md "Redis":
 * no unit is counted twice). Such a call (it timed out, or the connection died before the
 * reply) may or may not have counted; the caller counts its requests elsewhere (insurance) or
 * refuses them (503), so units it left in Redis would be counted twice. Every call therefore
 * carries a receipt from this ledger, which the consume script (limits/count-rules.ts) records
 * as `receipt:units` in each counter it added to; the ledger takes back the units of every
 * receipt it never heard about — at once after a timeout, otherwise as soon as Redis answers
 * again, and always on the same connection, so after the doubtful call if that ever runs.
 */

/**
 * Takes back the units a call added to a counter, if (and only if) its receipt is recorded there,
 * and drops the receipt, so a second undo takes nothing. ARGV: receipt, hourStart, dayStart (the
 * windows the call counted in: a window the counter has left since keeps its count).
 */
const UNDO_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc', 'rc')
if not v[5] then return 0 end
local s, e = string.find(',' .. v[5], ',' .. ARGV[1] .. ':', 1, true)
if not s then return 0 end
local stop = string.find(v[5], ',', e, true)
local units = tonumber(string.sub(v[5], e, stop - 1))
local rc = string.sub(v[5], 1, s - 1) .. string.sub(v[5], stop + 1)
local hc = tonumber(v[2])
local dc = tonumber(v[4])
if tonumber(v[1]) == tonumber(ARGV[2]) then hc = math.max(0, hc - units) end
if tonumber(v[3]) == tonumber(ARGV[3]) then dc = math.max(0, dc - units) end
redis.call('HSET', KEYS[1], 'hc', hc, 'dc', dc, 'rc', rc)
return units
`;

/** Calls in doubt remembered at most; beyond, the oldest are given up (their units may stay counted twice). */
const MAX_IN_DOUBT = 10_000;
const RECONCILE_EVERY_MS = 500;

/** A counting call: its counters (repeats allowed) and the windows it counted in. */
export interface CountingCall extends WindowIds {
  readonly keys: Iterable<string>;
}

interface DoubtfulCall extends WindowIds {
  readonly keys: ReadonlySet<string>;
}

interface UndoCommand {
  oapiUndo(key: string, receipt: string, hourStart: number, dayStart: number): Promise<number>;
}

export class ReceiptLedger {
  readonly #client: RedisClient & UndoCommand;
  readonly #maxInDoubt: number;
  /** Receipt prefix of this ledger: receipts of different instances never collide. */
  readonly #instance = randomBytes(5).toString('base64url');
  #sequence = 0;
  readonly #inDoubt = new Map<string, DoubtfulCall>();
  #reconciling: Promise<void> | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;

  /** `maxInDoubt`: the bound on calls remembered (tests lower it). */
  constructor(client: RedisClient, options: { readonly maxInDoubt?: number } = {}) {
    client.defineCommand('oapiUndo', { numberOfKeys: 1, lua: UNDO_SCRIPT });
    this.#client = client as RedisClient & UndoCommand;
    this.#maxInDoubt = options.maxInDoubt ?? MAX_IN_DOUBT;
    client.on('ready', this.#onReady);
  }

  readonly #onReady = (): void => void this.reconcile();

  /** Calls whose units may still have to be taken back. */
  get inDoubt(): number {
    return this.#inDoubt.size;
  }

  /** The receipt of a new call. */
  issue(): string {
    return this.#instance + (this.#sequence++).toString(36);
  }

  /**
   * A call failed: unless Redis refused it outright (then nothing ran), it may have counted, and
   * its receipt is held in doubt until reconciled. Returns the failure as the typed store error.
   */
  failed(receipt: string, call: CountingCall, err: unknown): StoreUnavailableError {
    const failure = toStoreError(err);
    if (failure.kind === 'reply') return failure;
    if (this.#inDoubt.size >= this.#maxInDoubt) this.#inDoubt.delete(this.#inDoubt.keys().next().value as string);
    this.#inDoubt.set(receipt, { keys: new Set(call.keys), hourStart: call.hourStart, dayStart: call.dayStart });
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
      try {
        // Commands of one connection run in order, so each undo runs after its doubtful call (if that ever runs).
        await Promise.all(
          pending.flatMap(([receipt, call]) =>
            [...call.keys].map((key) => this.#client.oapiUndo(key, receipt, call.hourStart, call.dayStart)),
          ),
        );
        for (const [receipt] of pending) this.#inDoubt.delete(receipt);
        if (this.#inDoubt.size === 0) {
          clearInterval(this.#reconcileTimer);
          this.#reconcileTimer = undefined;
        }
      } catch {
        // Redis is away again (or the undo timed out behind a slow Redis, where it still runs): the next attempt settles it.
      } finally {
        this.#reconciling = undefined;
      }
    })();
    return this.#reconciling;
  }

  /** Stops reconciling by itself (on shutdown, after a last reconcile()). */
  close(): void {
    clearInterval(this.#reconcileTimer);
    this.#client.off('ready', this.#onReady);
  }
}
