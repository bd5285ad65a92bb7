import { randomBytes } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import type { ConsumeRequest, CounterStore, Counts, StoreUnavailableError, Usage, WindowIds } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * Counters in Redis, shared by every gateway instance: one hash per (API key, row) with the
 * start and count of the hour and the day window, updated by one Lua script per request
 * (one round trip, atomic). The key's hash tag is the API-key hash, so all rows of one key
 * live in one Redis Cluster slot and a reset or usage read is one round trip too.
 *
 * On a single Redis, the requests that arrive in one turn of the event loop are counted by one
 * script call together: each request still waits on exactly one round trip, but the client and
 * the server handle one command (one write, one read, one reply) per batch instead of one per
 * request. (ioredis' own auto-pipelining only joins commands of the same tick, and every
 * connection's request is a tick of its own.) On a Cluster the keys of one script must share a
 * slot, so there each request's script goes alone.
 *
 * A script whose answer never arrives (it timed out, or the connection died before the
 * reply) may or may not have counted; the caller counts the request elsewhere (insurance) or
 * refuses it (503), so a unit left in Redis would be counted twice. Every consume therefore
 * carries a receipt: the script records the receipts of its last admissions in the counter
 * hash itself, and once Redis answers again the store takes back the unit of every receipt it
 * never heard about — on the same connection, so after the doubtful script if that ever runs.
 */

/** Receipts kept per counter: enough for the requests of one instance in flight on one key and row. */
const RECEIPTS_KEPT = 8;

// Mirrors countStep() in limits/store.ts: windows only move forward; refuse without writing.
// For each counter key KEYS[i], seven arguments: hourStart, dayStart, hourLimit, dayLimit,
// expireAt, force, receipt. Answers three numbers per key: allowed, hour count, day count.
const CONSUME_SCRIPT = `
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 7
  local v = redis.call('HMGET', KEYS[i], 'hs', 'hc', 'ds', 'dc', 'rc')
  local hs = tonumber(ARGV[a + 1])
  local ds = tonumber(ARGV[a + 2])
  local hc = 0
  local dc = 0
  local shs = tonumber(v[1])
  local sds = tonumber(v[3])
  if shs and shs >= hs then hs = shs; hc = tonumber(v[2]) end
  if sds and sds >= ds then ds = sds; dc = tonumber(v[4]) end
  if ARGV[a + 6] ~= '1' and (hc >= tonumber(ARGV[a + 3]) or dc >= tonumber(ARGV[a + 4])) then
    out[#out + 1] = 0
  else
    hc = hc + 1
    dc = dc + 1
    local rc = ARGV[a + 7] .. ',' .. (v[5] or '')
    local cut = 0
    for _ = 1, ${RECEIPTS_KEPT} do
      cut = string.find(rc, ',', cut + 1, true)
      if not cut then break end
    end
    if cut then rc = string.sub(rc, 1, cut) end
    redis.call('HSET', KEYS[i], 'hs', hs, 'hc', hc, 'ds', ds, 'dc', dc, 'rc', rc)
    if dc == 1 then redis.call('PEXPIREAT', KEYS[i], ARGV[a + 5]) end
    out[#out + 1] = 1
  end
  out[#out + 1] = hc
  out[#out + 1] = dc
end
return out
`;

// Takes back the unit counted under a receipt, if (and only if) that receipt is recorded.
// ARGV: receipt, hourStart, dayStart (the windows the request was counted in).
const UNDO_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc', 'rc')
if not v[5] then return 0 end
local s, e = string.find(',' .. v[5], ',' .. ARGV[1] .. ',', 1, true)
if not s then return 0 end
local rc = string.sub(v[5], 1, s - 1) .. string.sub(v[5], e)
local hc = tonumber(v[2])
local dc = tonumber(v[4])
if tonumber(v[1]) == tonumber(ARGV[2]) and hc > 0 then hc = hc - 1 end
if tonumber(v[3]) == tonumber(ARGV[3]) and dc > 0 then dc = dc - 1 end
redis.call('HSET', KEYS[1], 'hc', hc, 'dc', dc, 'rc', rc)
return 1
`;

type ConsumeArgs = [key: string, hourStart: number, dayStart: number, hourLimit: number, dayLimit: number, expireAt: number, force: string, receipt: string];

interface Pending {
  readonly args: ConsumeArgs;
  readonly resolve: (counts: Counts) => void;
  readonly reject: (err: StoreUnavailableError) => void;
}

interface InDoubt {
  readonly key: string;
  readonly hourStart: number;
  readonly dayStart: number;
}

interface ScriptCommands {
  /** One key and its seven arguments. */
  oapiConsume(key: string, ...args: Array<string | number>): Promise<number[]>;
  /** `numberOfKeys`, the keys, then seven arguments per key. */
  oapiConsumeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number[]>;
  oapiUndo(key: string, receipt: string, hourStart: number, dayStart: number): Promise<number>;
}

/** Doubtful receipts remembered at most; beyond, the oldest are given up (their unit may stay counted twice). */
const MAX_IN_DOUBT = 10_000;
const RECONCILE_EVERY_MS = 500;


export class RedisCounterStore implements CounterStore {
  readonly #client: RedisClient & ScriptCommands;
  readonly #prefix: string;
  readonly #batching: boolean;
  #batch: Pending[] = [];
  /** Receipt prefix of this store: receipts of different instances never collide. */
  readonly #instance = randomBytes(5).toString('base64url');
  #sequence = 0;
  readonly #inDoubt = new Map<string, InDoubt>();
  #reconciling: Promise<void> | undefined;
  #reconcileTimer: NodeJS.Timeout | undefined;

  constructor(client: RedisClient, prefix: string) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and
    // with the number of keys given per call, for a batch.
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    client.defineCommand('oapiConsumeMany', { lua: CONSUME_SCRIPT });
    client.defineCommand('oapiUndo', { numberOfKeys: 1, lua: UNDO_SCRIPT });
    this.#client = client as RedisClient & ScriptCommands;
    this.#prefix = prefix;
    this.#batching = !(client as Cluster).isCluster;
    client.on('ready', () => void this.reconcile());
  }

  counterKey(keyHash: string, counterId: string): string {
    return `${this.#prefix}c:{${keyHash}}:${counterId}`;
  }

  /** Receipts whose outcome is not known yet. */
  get inDoubt(): number {
    return this.#inDoubt.size;
  }

  consume(r: ConsumeRequest): Promise<Counts> {
    const args: ConsumeArgs = [
      this.counterKey(r.keyHash, r.counterId),
      r.hourStart,
      r.dayStart,
      r.hourLimit,
      r.dayLimit,
      r.expireAt,
      r.force ? '1' : '0',
      this.#instance + (this.#sequence++).toString(36),
    ];
    return new Promise((resolve, reject) => {
      const pending: Pending = { args, resolve, reject };
      if (!this.#batching) this.#run([pending]);
      else if (this.#batch.push(pending) === 1) setImmediate(this.#send);
    });
  }

  readonly #send = (): void => {
    const batch = this.#batch;
    this.#batch = [];
    this.#run(batch);
  };

  /** One script call for the whole batch: its keys, then the arguments of each key in turn. */
  #run(batch: readonly Pending[]): void {
    let reply: Promise<number[]>;
    if (batch.length === 1) {
      reply = this.#client.oapiConsume(...(batch[0] as Pending).args);
    } else {
      const keysThenArgs: Array<string | number> = batch.map((p) => p.args[0]);
      for (const { args } of batch) keysThenArgs.push(args[1], args[2], args[3], args[4], args[5], args[6], args[7]);
      reply = this.#client.oapiConsumeMany(batch.length, ...keysThenArgs);
    }
    reply.then(
      (reply) => {
        batch.forEach((pending, i) => pending.resolve({ allowed: reply[i * 3] === 1, hour: reply[i * 3 + 1] as number, day: reply[i * 3 + 2] as number }));
      },
      (err: unknown) => {
        for (const pending of batch) pending.reject(this.#failed(pending.args, err));
      },
    );
  }

  /** A consume failed: unless Redis refused the script outright, it may have counted. */
  #failed(args: ConsumeArgs, err: unknown): StoreUnavailableError {
    const failure = toStoreError(err);
    if (failure.kind !== 'reply') {
      const [key, hourStart, dayStart, , , , , receipt] = args;
      if (this.#inDoubt.size >= MAX_IN_DOUBT) this.#inDoubt.delete(this.#inDoubt.keys().next().value as string);
      this.#inDoubt.set(receipt, { key, hourStart, dayStart });
      this.#reconcileTimer ??= setInterval(() => void this.reconcile(), RECONCILE_EVERY_MS).unref();
    }
    return failure;
  }

  /** Takes back the units of doubtful receipts that Redis did count. Safe to call at any time. */
  reconcile(): Promise<void> {
    if (this.#inDoubt.size === 0 || this.#client.status !== 'ready') return Promise.resolve();
    this.#reconciling ??= (async () => {
      const pending = [...this.#inDoubt];
      try {
        // Commands of one connection run in order, so each undo runs after its doubtful consume (if that ever runs).
        await Promise.all(pending.map(([receipt, d]) => this.#client.oapiUndo(d.key, receipt, d.hourStart, d.dayStart)));
        for (const [receipt] of pending) this.#inDoubt.delete(receipt);
        if (this.#inDoubt.size === 0) {
          clearInterval(this.#reconcileTimer);
          this.#reconcileTimer = undefined;
        }
      } catch {
        // Redis is away again: the next attempt takes them.
      } finally {
        this.#reconciling = undefined;
      }
    })();
    return this.#reconciling;
  }

  async usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]> {
    await this.reconcile();
    try {
      const pipeline = (this.#client as Redis | Cluster).pipeline();
      for (const row of rows) pipeline.hmget(this.counterKey(keyHash, row.counterId), 'hs', 'hc', 'ds', 'dc');
      const replies = (await pipeline.exec()) ?? [];
      return rows.map((row, i) => {
        const [err, value] = replies[i] ?? [new Error('missing reply'), null];
        if (err) throw err;
        const [hs, hc, ds, dc] = (value as Array<string | null>).map((x) => (x === null ? undefined : Number(x)));
        return {
          hour: hs !== undefined && hs >= row.hourStart ? (hc ?? 0) : 0,
          day: ds !== undefined && ds >= row.dayStart ? (dc ?? 0) : 0,
        };
      });
    } catch (err) {
      throw toStoreError(err);
    }
  }

  async reset(keyHash: string, counterIds: readonly string[]): Promise<void> {
    if (counterIds.length === 0) return;
    try {
      await this.#client.unlink(...counterIds.map((id) => this.counterKey(keyHash, id)));
    } catch (err) {
      throw toStoreError(err);
    }
  }

  close(): void {
    clearInterval(this.#reconcileTimer);
  }
}
