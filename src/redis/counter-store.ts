import type { Cluster, Redis } from 'ioredis';
import { type ConsumeRequest, type CounterStore, type Counts, type Usage, type WindowIds } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * Counters in Redis, shared by every gateway instance: one hash per (API key, row) with the
 * start and count of the hour and the day window, updated by one Lua script per request
 * (one round trip, atomic). The key's hash tag is the API-key hash, so all rows of one key
 * live in one Redis Cluster slot and a reset or usage read is one round trip too.
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

interface ScriptCommands {
  oapiConsume(key: string, hourStart: number, dayStart: number, hourLimit: number, dayLimit: number, expireAt: number, force: string): Promise<[number, number, number]>;
}

export class RedisCounterStore implements CounterStore {
  readonly #client: RedisClient & ScriptCommands;
  readonly #prefix: string;

  constructor(client: RedisClient, prefix: string) {
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    this.#client = client as RedisClient & ScriptCommands;
    this.#prefix = prefix;
  }

  counterKey(keyHash: string, counterId: string): string {
    return `${this.#prefix}c:{${keyHash}}:${counterId}`;
  }

  async consume(r: ConsumeRequest): Promise<Counts> {
    try {
      const [allowed, hour, day] = await this.#client.oapiConsume(
        this.counterKey(r.keyHash, r.counterId), r.hourStart, r.dayStart, r.hourLimit, r.dayLimit, r.expireAt, r.force ? '1' : '0',
      );
      return { allowed: allowed === 1, hour, day };
    } catch (err) {
      throw toStoreError(err);
    }
  }

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
