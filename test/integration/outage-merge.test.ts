import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../../src/limits/count-rules.js';
import { MergeFailedError, type CounterKey, type MergeEntry } from '../../src/limits/store.js';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { MERGE_CHUNK, OutageMerge } from '../../src/redis/outage-merge.js';
import { request } from '../helpers/store-contract.js';
import {
  connectedClient,
  REDIS_URL,
  redisClient,
  startRedisServer,
  uniquePrefix,
  type RedisProcess,
} from '../helpers/redis.js';

/**
 * The merge of an outage's counts on a real Redis (docs/operations.md "When parts fail" → "Redis"): waves
 * of MERGE_CHUNK counters one after the other, and what a failed wave leaves to try again.
 */

const client = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 1000 });
await client.connect();
const inspect = redisClient();
const prefix = uniquePrefix('merge');
afterAll(async () => {
  inspect.disconnect();
  await client.quit();
});

const r = request();
const keyOf = (c: CounterKey): string => `${prefix}c:{${c.keyHash}}:${c.counterId}`;
const entries = (tag: string, n: number): MergeEntry[] =>
  Array.from({ length: n }, (_, i) => ({
    keyHash: `${tag}${i}`,
    counterId: r.counterId,
    hourStart: r.hourStart,
    hour: 1,
    dayStart: r.dayStart,
    day: 1,
    expireAt: r.expireAt,
  }));
const counter = (e: MergeEntry, via = inspect): Promise<Array<string | null>> =>
  via.hmget(keyOf(e), 'hs', 'hc', 'ds', 'dc');
const merged = [String(r.hourStart), '1', String(r.dayStart), '1'];
const untouched = [null, null, null, null];

async function failureOf(work: Promise<void>): Promise<MergeFailedError> {
  const failure = await work.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(failure).toBeInstanceOf(MergeFailedError);
  return failure as MergeFailedError;
}

describe('OutageMerge', () => {
  it('merges into a new counter with the expiry of its day, and keeps the receipts of one it merges into', async () => {
    const merge = new OutageMerge(client, keyOf);
    const [entry] = entries('merge-new', 1) as [MergeEntry];
    await merge.merge([{ ...entry, hour: 2, day: 3 }]);
    const key = keyOf(entry);
    expect(await inspect.hgetall(key)).toEqual({ hs: String(r.hourStart), hc: '2', ds: String(r.dayStart), dc: '3' });
    expect(await inspect.pexpiretime(key)).toBe(r.expireAt);
    // A counted request leaves its receipt, which the merge must not drop: the ledger may still need it.
    const keysThenArgs: Array<string | number> = [key];
    pushConsumeArgs(keysThenArgs, [{ request: r }], { field: 'rc:one', seq: 1, oldestUnsettled: 1 });
    await client.eval(CONSUME_SCRIPT, 1, ...keysThenArgs);
    await merge.merge([entry]);
    expect(await inspect.hgetall(key)).toEqual({
      hs: String(r.hourStart),
      hc: '4',
      ds: String(r.dayStart),
      dc: '5',
      'rc:one': `1:1:${r.hourStart}:${r.dayStart},`,
    });
  });

  it('merges many counters in waves of 200, and after a failed wave sends no other, naming those it never sent', async () => {
    expect(MERGE_CHUNK).toBe(200);
    const merge = new OutageMerge(client, keyOf);
    const many = entries('waves', 450);
    await merge.merge(many);
    for (const e of [many[0], many[199], many[200], many[449]] as MergeEntry[])
      expect(await counter(e)).toEqual(merged);

    // A key of the wrong type in the second wave stops that wave's script: the third is never sent.
    const broken = entries('broken', 650);
    await inspect.set(keyOf(broken[250] as MergeEntry), 'not a hash');
    const failure = await failureOf(merge.merge(broken));
    expect(failure.kind).toBe('reply');
    expect(failure.notApplied).toEqual(broken.slice(400));
    expect(await counter(broken[0] as MergeEntry)).toEqual(merged);
    expect(await counter(broken[400] as MergeEntry)).toEqual(untouched);
  });
});

describe('OutageMerge on a Redis of its own (INFO commandstats)', () => {
  let own: RedisProcess;
  let c: RedisClient;
  let direct: ReturnType<typeof redisClient>;
  const calls = async (): Promise<Record<string, number>> => {
    const stats = await c.info('commandstats');
    const out: Record<string, number> = {};
    for (const m of stats.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)) out[m[1] as string] = Number(m[2]);
    return out;
  };
  const scripts = (s: Record<string, number>): number => (s.evalsha ?? 0) + (s.eval ?? 0);

  beforeAll(async () => {
    own = await startRedisServer();
    c = await connectedClient(own.url, 1000);
    direct = redisClient(own.url);
  });
  afterAll(async () => {
    direct.disconnect();
    c.disconnect();
    await own.stop();
  });

  it('sends one script call per wave on a single Redis', async () => {
    const merge = new OutageMerge(c, keyOf);
    await merge.merge(entries('warm', 1)); // loads the script
    await c.config('RESETSTAT');
    await merge.merge(entries('one-call', 450));
    const stats = await calls();
    expect(scripts(stats)).toBe(3);
    expect(stats.hmget).toBe(450);
    expect(stats.hset).toBe(450);
  });

  it('with one call per counter (as on a Cluster), adds the other counters of a failed wave and sends no later wave', async () => {
    const merge = new OutageMerge(c, keyOf, { batching: false });
    await merge.merge(entries('warm-solo', 1));
    const broken = entries('solo', 650);
    await direct.set(keyOf(broken[250] as MergeEntry), 'not a hash');
    await c.config('RESETSTAT');
    const failure = await failureOf(merge.merge(broken));
    expect(failure.kind).toBe('reply');
    expect(failure.notApplied).toEqual(broken.slice(400));
    expect(scripts(await calls())).toBe(400);
    for (const e of [broken[0], broken[249], broken[251], broken[399]] as MergeEntry[])
      expect(await counter(e, direct)).toEqual(merged);
    expect(await counter(broken[400] as MergeEntry, direct)).toEqual(untouched);
  });

  // Last: it stops the Redis.
  it('names every wave after the first as not applied when Redis is gone', async () => {
    const merge = new OutageMerge(c, keyOf);
    await own.stop();
    const many = entries('gone', 450);
    const failure = await failureOf(merge.merge(many));
    expect(failure.kind).toBe('connection');
    expect(failure.notApplied).toEqual(many.slice(200));
  });
});
