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
 * On a single Redis, the scripts of all requests that arrive in one turn of the event loop
 * go out together, in one pipeline: still one round trip per request, but one write and one
 * read (on both sides) for the whole batch instead of one per request. (ioredis' own
 * auto-pipelining only joins commands of the same tick, and every connection's request is a
 * tick of its own.) A Cluster pipeline must stay in one slot, so there each script goes alone.
 */

// Mirrors countStep() in limits/store.ts: windows only move forward; refuse without writing.
const CONSUME_SCRIPT = `
local v = redis.call('HMGET', KEYS[1], 'hs', 'hc', 'ds', 'dc')
local hs = tonumber(ARGV[1])
local ds = tonumber(ARGV[2])
local hc = 0
local dc = 0
local shs = tonumber(v[1])
local sds = tonumber(v[3])
if shs and shs >= hs then hs = shs; hc = tonumber(v[2]) end
if sds and sds >= ds then ds = sds; dc = tonumber(v[4]) end
if ARGV[6] ~= '1' and (hc >= tonumber(ARGV[3]) or dc >= tonumber(ARGV[4])) then
  return {0, hc, dc}
end
hc = hc + 1
dc = dc + 1
redis.call('HSET', KEYS[1], 'hs', hs, 'hc', hc, 'ds', ds, 'dc', dc)
if dc == 1 then redis.call('PEXPIREAT', KEYS[1], ARGV[5]) end
return {1, hc, dc}
`;

type ConsumeReply = [number, number, number];

interface Pending {
  readonly request: ConsumeRequest;
  readonly resolve: (counts: Counts) => void;
  readonly reject: (err: StoreUnavailableError) => void;
}

interface ScriptCommands {
  oapiConsume(key: string, hourStart: number, dayStart: number, hourLimit: number, dayLimit: number, expireAt: number, force: string): Promise<ConsumeReply>;
}

function toCounts([allowed, hour, day]: ConsumeReply): Counts {
  return { allowed: allowed === 1, hour, day };
}

export class RedisCounterStore implements CounterStore {
  readonly #client: RedisClient & ScriptCommands;
  readonly #prefix: string;
  readonly #batching: boolean;
  #batch: Pending[] = [];

  constructor(client: RedisClient, prefix: string) {
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    this.#client = client as RedisClient & ScriptCommands;
    this.#prefix = prefix;
    this.#batching = !(client as Cluster).isCluster;
  }

  counterKey(keyHash: string, counterId: string): string {
    return `${this.#prefix}c:{${keyHash}}:${counterId}`;
  }

  consume(request: ConsumeRequest): Promise<Counts> {
    if (!this.#batching) return this.#consumeAlone(request);
    return new Promise((resolve, reject) => {
      if (this.#batch.push({ request, resolve, reject }) === 1) setImmediate(this.#send);
    });
  }

  async #consumeAlone(r: ConsumeRequest): Promise<Counts> {
    try {
      return toCounts(await this.#client.oapiConsume(...this.#args(r)));
    } catch (err) {
      throw toStoreError(err);
    }
  }

  #args(r: ConsumeRequest): Parameters<ScriptCommands['oapiConsume']> {
    return [this.counterKey(r.keyHash, r.counterId), r.hourStart, r.dayStart, r.hourLimit, r.dayLimit, r.expireAt, r.force ? '1' : '0'];
  }

  readonly #send = (): void => {
    const batch = this.#batch;
    this.#batch = [];
    if (batch.length === 1) {
      const [only] = batch as [Pending];
      this.#consumeAlone(only.request).then(only.resolve, only.reject);
      return;
    }
    const pipeline = (this.#client as Redis).pipeline() as ReturnType<Redis['pipeline']> & ScriptCommands;
    for (const { request } of batch) void pipeline.oapiConsume(...this.#args(request));
    pipeline.exec().then(
      (replies) => {
        batch.forEach((pending, i) => {
          const [err, reply] = replies?.[i] ?? [new Error('missing reply'), null];
          if (err) pending.reject(toStoreError(err));
          else pending.resolve(toCounts(reply as ConsumeReply));
        });
      },
      (err: unknown) => {
        const failure = toStoreError(err);
        for (const pending of batch) pending.reject(failure);
      },
    );
  };

  async usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]> {
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
}
