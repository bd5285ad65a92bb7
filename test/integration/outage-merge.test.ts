import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../../src/limits/count-rules.js';
import { MergeFailedError, type CounterKey, type MergeEntry } from '../../src/limits/store.js';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { RedisCounterStore } from '../../src/redis/counter-store.js';
import { MERGE_CHUNK, OutageMerge } from '../../src/redis/outage-merge.js';
import { sleep, waitFor } from '../helpers/faults.js';
import { startRedisProxy, type RedisProxy } from '../helpers/redis-proxy.js';
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

/** The one merge mark (`mg:…`) among a counter's fields. */
function markOf(fields: Record<string, string>): string {
  const marks = Object.keys(fields).filter((f) => f.startsWith('mg:'));
  expect(marks).toHaveLength(1);
  return marks[0] as string;
}

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
    // The instance's mark: the number of the call that added to the counter.
    const mark = markOf(await inspect.hgetall(key));
    expect(await inspect.hgetall(key)).toEqual({
      hs: String(r.hourStart),
      hc: '2',
      ds: String(r.dayStart),
      dc: '3',
      [mark]: '1',
    });
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
      [mark]: '2',
    });
  });

  it('merges many counters in waves of 200, and after a failed wave sends no other, naming those it never sent', async () => {
    expect(MERGE_CHUNK).toBe(200);
    const merge = new OutageMerge(client, keyOf);
    const many = entries('waves', 450);
    await merge.merge(many);
    for (const e of [many[0], many[199], many[200], many[449]] as MergeEntry[])
      expect(await counter(e)).toEqual(merged);

    // An entry Redis refuses in the second wave (an expiry that is no number) stops that wave's
    // script: the third is never sent.
    const broken = entries('broken', 650);
    broken[250] = { ...(broken[250] as MergeEntry), expireAt: Number.NaN };
    const failure = await failureOf(merge.merge(broken));
    expect(failure.kind).toBe('reply');
    expect(failure.notApplied).toEqual(broken.slice(400));
    // The refused wave is kept, to be sent again (the entry that cannot be taken is dropped then: no day of its own).
    expect([failure.applied, failure.kept]).toEqual([200, 200]);
    expect(await counter(broken[0] as MergeEntry)).toEqual(merged);
    expect(await counter(broken[400] as MergeEntry)).toEqual(untouched);
  });
});

describe('OutageMerge and a key that holds something else', () => {
  it.each([true, false])(
    'adds to the other counters of its call and of the waves after it, and names the entry refused (batching: %s)',
    async (batching) => {
      const merge = new OutageMerge(client, keyOf, { batching });
      const some = entries(`other-type-${batching}`, 450);
      await inspect.set(keyOf(some[150] as MergeEntry), 'not a hash');
      const failure = await failureOf(merge.merge(some));
      expect([failure.kind, failure.notApplied, failure.applied, failure.kept]).toEqual(['reply', [], 449, 0]);
      for (const e of [some[0], some[149], some[151], some[449]] as MergeEntry[])
        expect(await counter(e)).toEqual(merged);
      expect(await inspect.get(keyOf(some[150] as MergeEntry))).toBe('not a hash');
    },
  );
});

describe('OutageMerge and a counter hash without its day', () => {
  it('merges into it, so that its call is not refused (and sent again) for ever', async () => {
    const merge = new OutageMerge(client, keyOf);
    const [entry] = entries('no-day', 1) as [MergeEntry];
    // Written by another program: an hour and a zone, no day.
    await inspect.hset(keyOf(entry), 'hs', String(r.hourStart), 'tz', 'Europe/Paris');
    await merge.merge([{ ...entry, zone: 'UTC' }]);
    expect(await counter(entry)).toEqual([String(r.hourStart), '1', String(r.dayStart), '1']);
    expect(merge.keptCounters).toBe(0);
    merge.close();
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
    broken[250] = { ...(broken[250] as MergeEntry), expireAt: Number.NaN };
    await c.config('RESETSTAT');
    const failure = await failureOf(merge.merge(broken));
    expect(failure.kind).toBe('reply');
    expect(failure.notApplied).toEqual(broken.slice(400));
    expect(scripts(await calls())).toBe(400);
    for (const e of [broken[0], broken[249], broken[251], broken[399]] as MergeEntry[])
      expect(await counter(e, direct)).toEqual(merged);
    expect(await counter(broken[400] as MergeEntry, direct)).toEqual(untouched);
  });

  it('keeps a call Redis refused (out of memory) and sends it again until Redis takes it, each unit once', async () => {
    const settled: Array<[number, 'ok' | 'failed']> = [];
    const merge = new OutageMerge(c, keyOf, { keptSettled: (n, result) => settled.push([n, result]) });
    await merge.merge(entries('warm-oom', 1));
    const three = entries('oom', 3);
    await direct.config('SET', 'maxmemory', '1');
    try {
      const failure = await failureOf(merge.merge(three));
      expect([failure.kind, failure.notApplied, failure.applied, failure.kept]).toEqual(['reply', [], 0, 3]);
      expect(merge.keptCounters).toBe(3);
    } finally {
      await direct.config('SET', 'maxmemory', '0');
    }
    await waitFor('the kept call sent again and answered', () => merge.keptCounters === 0, 5000, 20);
    expect(settled).toEqual([[3, 'ok']]);
    for (const e of three) expect(await counter(e, direct)).toEqual(merged);
    merge.close();
  });

  // Last: it stops the Redis.
  it('names every entry as not applied when Redis is gone, and keeps none', async () => {
    const merge = new OutageMerge(c, keyOf);
    await own.stop();
    await waitFor('the connection down', () => c.status !== 'ready', 5000, 10);
    const many = entries('gone', 450);
    const failure = await failureOf(merge.merge(many));
    expect([failure.kind, failure.notApplied, failure.applied, failure.kept]).toEqual(['connection', many, 0, 0]);
    expect(merge.keptCounters).toBe(0);
  });
});

describe('OutageMerge: a call whose answer never came (a proxy in front of a Redis of its own)', () => {
  let own: RedisProcess;
  let proxy: RedisProxy;
  let direct: ReturnType<typeof redisClient>;
  const clients: RedisClient[] = [];

  beforeAll(async () => {
    own = await startRedisServer();
    proxy = await startRedisProxy(own.port);
    direct = redisClient(own.url);
  });
  afterAll(async () => {
    for (const c of clients) c.disconnect();
    direct.disconnect();
    await proxy.close();
    await own.stop();
  });

  /** A merge through the proxy, its script loaded, and what its kept calls came to. */
  async function mergeViaProxy(options: { batching?: boolean; resendEveryMs?: number } = {}): Promise<{
    merge: OutageMerge;
    settled: Array<[number, 'ok' | 'failed']>;
  }> {
    const c = await connectedClient(proxy.url, 300);
    clients.push(c);
    const settled: Array<[number, 'ok' | 'failed']> = [];
    const merge = new OutageMerge(c, keyOf, { ...options, keptSettled: (n, result) => settled.push([n, result]) });
    // The script is loaded first: a lost EVALSHA that Redis answered NOSCRIPT would have run nothing.
    await merge.merge(entries(`warm-${clients.length}`, 1));
    return { merge, settled };
  }

  const allIn = async (merge: OutageMerge): Promise<void> =>
    waitFor('the kept calls sent again and answered', () => merge.keptCounters === 0, 5000, 20);

  it('sends a call that ran but whose reply was lost again, and the counters it reached are not added to twice (regression: its units were lost for good)', async () => {
    const { merge, settled } = await mergeViaProxy();
    const three = entries('lost-reply', 3);
    proxy.failNextCommand('reply');
    const failure = await failureOf(merge.merge(three));
    expect(failure.kind).toBe('connection');
    expect([failure.notApplied, failure.applied, failure.kept]).toEqual([[], 0, 3]);
    // The call ran in Redis all the same.
    for (const e of three) expect(await counter(e, direct)).toEqual(merged);
    // Sent again once the connection is back; the counters it already reached keep one unit each.
    await allIn(merge);
    expect(settled).toEqual([[3, 'ok']]);
    for (const e of three) expect(await counter(e, direct)).toEqual(merged);
  });

  it('sends a kept call again as soon as the connection is ready again, not only with the timer', async () => {
    const { merge, settled } = await mergeViaProxy({ resendEveryMs: 60_000 });
    const two = entries('on-ready', 2);
    proxy.failNextCommand('request', 50);
    expect((await failureOf(merge.merge(two))).kept).toBe(2);
    await allIn(merge);
    expect(settled).toEqual([[2, 'ok']]);
    for (const e of two) expect(await counter(e, direct)).toEqual(merged);
  });

  it('sends a call Redis never saw again, and its units are added once', async () => {
    const { merge, settled } = await mergeViaProxy();
    const three = entries('lost-request', 3);
    proxy.failNextCommand('request');
    const failure = await failureOf(merge.merge(three));
    expect(failure.kept).toBe(3);
    for (const e of three) expect(await counter(e, direct)).toEqual(untouched);
    await allIn(merge);
    expect(settled).toEqual([[3, 'ok']]);
    for (const e of three) expect(await counter(e, direct)).toEqual(merged);
  });

  it('sends no later units to a counter of a kept call until it is answered, and the other counters go', async () => {
    const { merge, settled } = await mergeViaProxy({ batching: false });
    const [held, other] = entries('held', 2) as [MergeEntry, MergeEntry];
    // A slow Redis: each call runs, and its answer comes after the call has timed out.
    proxy.delayRepliesMs = 600;
    expect((await failureOf(merge.merge([held]))).kept).toBe(1);
    // Its call sent again times out too: the new units of its counter wait, the other counter's go (and are kept).
    const blocked = await failureOf(merge.merge([{ ...held, hour: 2, day: 2 }, other]));
    expect([blocked.notApplied, blocked.applied, blocked.kept]).toEqual([[{ ...held, hour: 2, day: 2 }], 0, 1]);
    proxy.delayRepliesMs = 0;
    await allIn(merge);
    expect(settled.reduce((n, [counters]) => n + counters, 0)).toBe(2);
    // Each call ran more than once, and added once.
    for (const e of [held, other]) expect(await counter(e, direct)).toEqual(merged);
    await merge.merge([{ ...held, hour: 2, day: 2 }]);
    expect(await counter(held, direct)).toEqual([String(r.hourStart), '3', String(r.dayStart), '3']);
  });

  it("forgets a reset key's units of a kept call, and keeps the other keys'", async () => {
    const { merge } = await mergeViaProxy();
    const [reset, kept] = entries('forget', 2) as [MergeEntry, MergeEntry];
    proxy.delayRepliesMs = 600;
    expect((await failureOf(merge.merge([reset, kept]))).kept).toBe(2);
    await merge.forget(reset.keyHash, [reset.counterId]);
    expect(merge.keptCounters).toBe(1);
    // The reset itself: the call had run.
    await direct.unlink(keyOf(reset));
    proxy.delayRepliesMs = 0;
    await allIn(merge);
    expect(await counter(reset, direct)).toEqual(untouched);
    expect(await counter(kept, direct)).toEqual(merged);
  });

  it('sends nothing on a connection that is not ready, and keeps nothing', async () => {
    const { merge } = await mergeViaProxy();
    const c = clients.at(-1) as RedisClient;
    proxy.away = true;
    await waitFor('the connection down', () => c.status !== 'ready', 5000, 10);
    const two = entries('not-ready', 2);
    const failure = await failureOf(merge.merge(two));
    expect([failure.kind, failure.notApplied, failure.kept]).toEqual(['connection', two, 0]);
    proxy.away = false;
  });

  it('queues no more than one timed resend behind a Redis that stays slow, so a reset or the last resend at shutdown waits one timeout, not one per second of the stall (REDIS_TIMEOUT_MS above 1 s)', async () => {
    const timeoutMs = 2000;
    const c = await connectedClient(proxy.url, timeoutMs);
    clients.push(c);
    const merge = new OutageMerge(c, keyOf);
    await merge.merge(entries('stall-warm', 1));
    const [entry] = entries('stall', 1) as [MergeEntry];
    // A Redis that stays slow: every answer comes long after its call timed out.
    proxy.delayRepliesMs = 60_000;
    try {
      expect((await failureOf(merge.merge([entry]))).kept).toBe(1);
      // The resend timer ticks once a second; each resend waits out a whole timeout.
      await sleep(5500);
      const started = performance.now();
      // What a reset (forget) and the shutdown's last reconcile (resendKept) wait for.
      await merge.forget('unrelated', [entry.counterId]);
      expect(performance.now() - started).toBeLessThan(timeoutMs * 1.5);
    } finally {
      merge.close();
      c.disconnect();
      proxy.delayRepliesMs = 0;
    }
  }, 40_000);
});

describe('RedisCounterStore: a reset and the merge calls it keeps', () => {
  let own: RedisProcess;
  let proxy: RedisProxy;
  let direct: ReturnType<typeof redisClient>;
  let c: RedisClient;
  let store: RedisCounterStore;

  beforeAll(async () => {
    own = await startRedisServer();
    proxy = await startRedisProxy(own.port);
    direct = redisClient(own.url);
  });
  afterAll(async () => {
    direct.disconnect();
    await proxy.close();
    await own.stop();
  });
  beforeEach(async () => {
    c = await connectedClient(proxy.url, 300);
    store = new RedisCounterStore(c, prefix);
  });
  afterEach(() => {
    proxy.delayRepliesMs = 0;
    proxy.away = false;
    store.close();
    c.disconnect();
  });

  it("drops the reset rows' units from the kept calls before the reset, so that sending them again cannot bring them back", async () => {
    const [reset, kept] = entries('store-reset', 2) as [MergeEntry, MergeEntry];
    await store.merge(entries('store-warm', 1));
    proxy.delayRepliesMs = 600;
    expect((await failureOf(store.merge([reset, kept]))).kept).toBe(2);
    proxy.delayRepliesMs = 0;
    // The late answer comes first (the reset's own would wait behind it past its timeout).
    await sleep(400);
    expect(store.keptMergeCounters).toBe(2);
    await store.reset(reset.keyHash, [reset.counterId]);
    await store.reconcile();
    expect(store.keptMergeCounters).toBe(0);
    expect(await counter(reset, direct)).toEqual(untouched);
    expect(await counter(kept, direct)).toEqual(merged);
  });

  it('keeps them when the reset fails, so that they still reach the counters (regression: they were dropped all the same)', async () => {
    const [reset, kept] = entries('failed-reset', 2) as [MergeEntry, MergeEntry];
    await store.merge(entries('failed-reset-warm', 1));
    // The call never reaches Redis, and the connection goes away with it.
    proxy.failNextCommand('request', 10_000);
    const merging = failureOf(store.merge([reset, kept]));
    await sleep(50);
    proxy.away = true;
    expect((await merging).kept).toBe(2);
    await waitFor('the connection down', () => c.status !== 'ready', 5000, 10);
    await expect(store.reset(reset.keyHash, [reset.counterId])).rejects.toMatchObject({ kind: 'connection' });
    expect(store.keptMergeCounters).toBe(2);
    proxy.away = false;
    await waitFor('the kept call sent again', () => store.keptMergeCounters === 0, 5000, 20);
    expect(await counter(reset, direct)).toEqual(merged);
    expect(await counter(kept, direct)).toEqual(merged);
  });
});
