import calculateSlot from 'cluster-key-slot';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../../src/limits/count-rules.js';
import type { ConsumeRequest, StoreUnavailableError } from '../../src/limits/store.js';
import { ConsumeBatcher, MAX_CALLS_OUT, MAX_WAIT_MS } from '../../src/redis/consume-batcher.js';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { DownMasters } from '../../src/redis/down-masters.js';
import { ReceiptLedger } from '../../src/redis/receipt-ledger.js';
import { request } from '../helpers/store-contract.js';
import { connectedClient, redisClient, startRedisServer, type RedisProcess } from '../helpers/redis.js';
import { startRedisProxy } from '../helpers/redis-proxy.js';

/**
 * The batcher on a Redis of the file's own, whose INFO commandstats count the script
 * calls (docs/performance.md "Counting costs one round trip").
 */

let own: RedisProcess;
let c: RedisClient;
let inspect: ReturnType<typeof redisClient>;
let ledger: ReceiptLedger;

beforeAll(async () => {
  own = await startRedisServer();
  c = await connectedClient(own.url, 1000);
  inspect = redisClient(own.url);
  ledger = new ReceiptLedger(c);
  // Loads the script, so that every call below is one EVALSHA.
  await new ConsumeBatcher(c, ledger).consume('warm', request());
});
afterAll(async () => {
  ledger.close();
  inspect.disconnect();
  c.disconnect();
  await own.stop();
});

let stats: Record<string, number> = {};
beforeEach(async () => {
  await c.config('RESETSTAT');
});
async function commandCalls(): Promise<Record<string, number>> {
  const text = await inspect.info('commandstats');
  stats = {};
  for (const m of text.matchAll(/^cmdstat_(\w+):calls=(\d+)/gm)) stats[m[1] as string] = Number(m[2]);
  return stats;
}
const scriptCalls = async (): Promise<number> => {
  const s = await commandCalls();
  return (s.evalsha ?? 0) + (s.eval ?? 0);
};

describe('ConsumeBatcher: script calls', () => {
  it('counts the requests of one turn with one script call, in order, reading and writing each counter once', async () => {
    const batcher = new ConsumeBatcher(c, ledger);
    const limited = (key: string): ConsumeRequest => request({ keyHash: key, hourLimit: 6, dayLimit: 100 });
    const counts = await Promise.all(
      Array.from({ length: 20 }, (_, i) => batcher.consume(i % 2 ? 'turn-b' : 'turn-a', limited(i % 2 ? 'b' : 'a'))),
    );
    // Each counter's requests in the order they came: six admitted, then refused without counting.
    const expected = Array.from({ length: 10 }, (_, i) =>
      i < 6 ? { allowed: true, hour: i + 1, day: i + 1 } : { allowed: false, hour: 6, day: 6 },
    );
    expect(counts.filter((_, i) => i % 2 === 0)).toEqual(expected);
    expect(counts.filter((_, i) => i % 2 === 1)).toEqual(expected);
    expect(await scriptCalls()).toBe(1);
    expect(stats.hmget).toBe(2);
    expect(stats.hset).toBe(2);
    expect(await inspect.hmget('turn-a', 'hc', 'dc')).toEqual(['6', '6']);
  });

  it('runs one Lua script per consume, reading and writing with two commands', async () => {
    const batcher = new ConsumeBatcher(c, ledger);
    for (let i = 0; i < 10; i++) await batcher.consume('one-by-one', request({ hourLimit: 100, dayLimit: 100 }));
    expect(await scriptCalls()).toBe(10);
    expect(stats.hmget).toBe(10);
    expect(stats.hset).toBe(10);
  });

  it('counts requests of one turn in their own windows when a window boundary falls between them (they go in separate calls)', async () => {
    const batcher = new ConsumeBatcher(c, ledger);
    const before = request({ keyHash: 'boundary' });
    const after = request({ keyHash: 'boundary', hourStart: before.hourStart + 3600 });
    const other = request({ keyHash: 'boundary-2', hourStart: before.hourStart + 3600 });
    // Sent together: without the split they would share one call and one pair of windows.
    const counts = await Promise.all([
      batcher.consume('boundary', before),
      batcher.consume('boundary', after),
      batcher.consume('boundary-2', other),
    ]);
    expect(counts).toEqual([
      { allowed: true, hour: 1, day: 1 },
      // The next hour starts afresh; the day goes on.
      { allowed: true, hour: 1, day: 2 },
      { allowed: true, hour: 1, day: 1 },
    ]);
    expect(await inspect.hmget('boundary', 'hs', 'hc', 'dc')).toEqual([String(after.hourStart), '1', '2']);
    // The first call holds the request before the boundary, the second both after it.
    expect(await scriptCalls()).toBe(2);
  });

  it('sends one call at a time: the requests that come while a call is out go together in the next one', async () => {
    // No wait limit: only the first call's answer may send the next.
    const batcher = new ConsumeBatcher(c, ledger, { maxWaitMs: 60_000 });
    await inspect.call('CLIENT', 'PAUSE', '150', 'WRITE');
    const first = batcher.consume('queued', request({ hourLimit: 100, dayLimit: 100 }));
    // Three more turns of the event loop while the first call waits on the paused server: each
    // turn would have had a call of its own.
    const later: Array<Promise<unknown>> = [];
    for (let i = 0; i < 3; i++) {
      await new Promise((resolve) => setImmediate(resolve));
      later.push(batcher.consume('queued', request({ hourLimit: 100, dayLimit: 100 })));
    }
    expect((await first).hour).toBe(1);
    expect((await Promise.all(later)).map((x) => (x as { hour: number }).hour)).toEqual([2, 3, 4]);
    expect(await scriptCalls()).toBe(2);
  });

  it('sends the next call as soon as the one before it is answered', async () => {
    const batcher = new ConsumeBatcher(c, ledger, { maxWaitMs: 60_000 });
    const first = batcher.consume('answered', request({ hourLimit: 100, dayLimit: 100 }));
    // The first call has left (a check phase has passed); this one waits for its answer.
    await new Promise((resolve) => setImmediate(resolve));
    const second = batcher.consume('answered', request({ hourLimit: 100, dayLimit: 100 }));
    const tooLong = new Promise((_, reject) => setTimeout(() => reject(new Error('never sent')), 2000));
    const counts = await Promise.race([Promise.all([first, second]), tooLong]);
    expect((counts as Array<{ hour: number }>).map((x) => x.hour)).toEqual([1, 2]);
    expect(await scriptCalls()).toBe(2);
  });

  it('does not hold requests behind a slow call for longer than MAX_WAIT_MS: they go in a call of their own', async () => {
    const proxy = await startRedisProxy(Number(new URL(own.url).port));
    const slow = createRedisClient({ url: proxy.url, commandTimeoutMs: 2000 });
    slow.on('error', () => {});
    await slow.connect();
    const slowLedger = new ReceiptLedger(slow);
    const batcher = new ConsumeBatcher(slow, slowLedger, { maxWaitMs: MAX_WAIT_MS });
    await batcher.consume('slow-warm', request()); // loads the script on this connection
    const DELAY_MS = 300;
    proxy.delayRepliesMs = DELAY_MS;
    const doneAt = (p: Promise<unknown>): Promise<number> => p.then(() => performance.now());
    const first = doneAt(batcher.consume('slow-a', request()));
    await new Promise((resolve) => setTimeout(resolve, 30));
    const second = doneAt(batcher.consume('slow-b', request()));
    const [firstDone, secondDone] = await Promise.all([first, second]);
    // Sent MAX_WAIT_MS after it came, its answer follows the first's by about 30 ms: had it waited
    // for that answer before leaving, a whole DELAY_MS more.
    expect(secondDone - firstDone).toBeLessThan(30 + MAX_WAIT_MS + DELAY_MS / 2);
    expect(await inspect.hmget('slow-b', 'hc')).toEqual(['1']);
    slowLedger.close();
    slow.disconnect();
    await proxy.close();
  });

  it('with batching off (as on a Cluster), sends each request of a turn alone', async () => {
    // A ledger of its own: its calls are of one counter each.
    const perCounter = new ReceiptLedger(c);
    const batcher = new ConsumeBatcher(c, perCounter, { batching: false });
    const counts = await Promise.all(
      Array.from({ length: 5 }, () => batcher.consume('alone', request({ hourLimit: 100, dayLimit: 100 }))),
    );
    expect(counts.map((x) => x.hour).sort()).toEqual([1, 2, 3, 4, 5]);
    expect(await scriptCalls()).toBe(5);
    perCounter.close();
  });
});

describe('ConsumeBatcher: failed calls', () => {
  it('fails every request of a call Redis refused with the typed error, and holds none in doubt', async () => {
    const batcher = new ConsumeBatcher(c, ledger);
    // Redis out of memory (no eviction) refuses a script at its first write: nothing is written.
    await inspect.config('SET', 'maxmemory', '1');
    try {
      const results = await Promise.allSettled([
        batcher.consume('refused-a', request()),
        batcher.consume('refused-b', request()),
      ]);
      for (const r of results) {
        expect(r.status).toBe('rejected');
        expect((r as PromiseRejectedResult).reason).toMatchObject({
          name: 'StoreUnavailableError',
          kind: 'reply',
          part: false,
        });
      }
    } finally {
      await inspect.config('SET', 'maxmemory', '0');
    }
    expect(ledger.inDoubt).toBe(0);
    expect(await inspect.exists('refused-a', 'refused-b')).toBe(0);
  });

  it('refuses only the requests whose counter key holds something else, as a part of the store, and counts the others of the call (regression: the whole call failed, and the instance left Redis for a second)', async () => {
    const batcher = new ConsumeBatcher(c, ledger);
    await inspect.set('other-type', 'not a hash');
    const results = await Promise.allSettled([
      batcher.consume('other-good', request()),
      batcher.consume('other-type', request()),
      batcher.consume('other-good', request()),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((results[1] as PromiseRejectedResult).reason).toMatchObject({
      name: 'StoreUnavailableError',
      kind: 'reply',
      part: true,
    });
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value.hour : undefined))).toEqual([1, undefined, 2]);
    expect(await scriptCalls()).toBe(1);
    expect(ledger.inDoubt).toBe(0);
    expect(await inspect.get('other-type')).toBe('not a hash');
  });

  it('hands a call whose answer never came to the ledger, with every counter of it, so its units are taken back', async () => {
    const quick = await connectedClient(own.url, 100);
    const quickLedger = new ReceiptLedger(quick);
    const batcher = new ConsumeBatcher(quick, quickLedger);
    await batcher.consume('doubt-warm', request()); // loads the script on this connection
    await inspect.call('CLIENT', 'PAUSE', '300', 'WRITE');
    const results = await Promise.allSettled(
      ['doubt-a', 'doubt-b', 'doubt-a'].map((key) => batcher.consume(key, request())),
    );
    expect(results.map((r) => r.status === 'rejected' && (r.reason as StoreUnavailableError).kind)).toEqual([
      'timeout',
      'timeout',
      'timeout',
    ]);
    expect(quickLedger.inDoubt).toBe(1);
    const deadline = Date.now() + 3000;
    while (quickLedger.inDoubt > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(quickLedger.inDoubt).toBe(0);
    for (const key of ['doubt-a', 'doubt-b']) {
      const { hc, dc, ...rest } = await inspect.hgetall(key);
      expect([hc, dc]).toEqual(['0', '0']);
      // The receipt has no units left (and the call would count nothing should it run again).
      expect(Object.entries(rest).filter(([field]) => field.startsWith('rc:'))).toEqual([
        [expect.stringMatching(/^rc:/), expect.stringMatching(/^\d+:0:\d+:\d+,$/)],
      ]);
    }
    quickLedger.close();
    quick.disconnect();
  });

  it('regression: a reply of another shape threw a TypeError and left its requests unanswered; it is a store error, and the call is in doubt', async () => {
    // The real script runs and counts; its client is handed another reply, as on a connection out of step.
    type WithConsume = RedisClient & { oapiConsume(...args: Array<string | number>): Promise<number[]> };
    const outOfStep = new Proxy(c as WithConsume, {
      get(target, property) {
        if (property === 'oapiConsume')
          return (...args: Array<string | number>) => target.oapiConsume(...args).then(() => null);
        const value: unknown = Reflect.get(target, property, target);
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
    const shapeLedger = new ReceiptLedger(c);
    const batcher = new ConsumeBatcher(outOfStep, shapeLedger);
    const result = await Promise.race([
      batcher.consume('shape-a', request()).then(
        () => 'resolved',
        (err: unknown) => err,
      ),
      new Promise((resolve) => setTimeout(() => resolve('no answer'), 2000)),
    ]);
    expect(result).toMatchObject({ name: 'StoreUnavailableError', kind: 'connection' });
    expect(shapeLedger.inDoubt).toBe(1);
    const deadline = Date.now() + 3000;
    while (shapeLedger.inDoubt > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    expect(shapeLedger.inDoubt).toBe(0);
    // It had counted: its units were taken back.
    expect(await inspect.hmget('shape-a', 'hc', 'dc')).toEqual(['0', '0']);
    shapeLedger.close();
  });

  it('takes back the units of every call in doubt, however many went out behind a stalled Redis (regression: a counter kept only 8 receipts, and the calls of a longer stall stayed counted)', async () => {
    const quick = await connectedClient(own.url, 100);
    const quickLedger = new ReceiptLedger(quick);
    const batcher = new ConsumeBatcher(quick, quickLedger);
    await batcher.consume('stall-warm', request()); // loads the script on this connection
    await inspect.call('CLIENT', 'PAUSE', '300', 'WRITE');
    // One request every 6 ms on one counter, for longer than the pause: a call goes out every MAX_WAIT_MS
    // behind the stalled one, some forty in all, and the last requests are counted after the pause.
    // Settled as they come (true: counted), so that no rejection waits for a handler.
    const results: Array<Promise<boolean>> = [];
    for (let i = 0; i < 60; i++) {
      const counted = batcher.consume('stall-hot', request({ hourLimit: 1000, dayLimit: 1000 }));
      results.push(
        counted.then(
          () => true,
          () => false,
        ),
      );
      await new Promise((r) => setTimeout(r, 6));
    }
    const outcomes = await Promise.all(results);
    const admitted = outcomes.filter(Boolean).length;
    const inDoubt = outcomes.length - admitted;
    expect(inDoubt).toBeGreaterThan(8);
    const deadline = Date.now() + 3000;
    while ((quickLedger.inDoubt > 0 || quickLedger.unsettled > 0) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(quickLedger.inDoubt).toBe(0);
    // Exactly the answered requests stay counted.
    expect(await inspect.hmget('stall-hot', 'hc', 'dc')).toEqual([String(admitted), String(admitted)]);
    quickLedger.close();
    quick.disconnect();
  });

  it('sends nothing on a connection that is not ready, and holds nothing in doubt for it', async () => {
    const gone = await connectedClient(own.url, 1000);
    const goneLedger = new ReceiptLedger(gone);
    const batcher = new ConsumeBatcher(gone, goneLedger);
    const ended = new Promise((resolve) => gone.once('end', resolve));
    gone.disconnect();
    await ended;
    const failure = await batcher.consume('gone', request()).catch((err: unknown) => err);
    expect(failure).toMatchObject({ name: 'StoreUnavailableError', kind: 'connection' });
    expect(goneLedger.inDoubt).toBe(0);
    expect(goneLedger.unsettled).toBe(0);
    goneLedger.close();
  });

  it(`sends no call while ${MAX_CALLS_OUT} are out: the calls between one in doubt and its undo are fewer than a counter keeps receipts`, async () => {
    // Batching off (as on a Cluster): every request is a call of its own, all out at once behind a pause.
    const perCounter = new ReceiptLedger(c);
    const batcher = new ConsumeBatcher(c, perCounter, { batching: false });
    await inspect.call('CLIENT', 'PAUSE', '300', 'WRITE');
    const out = Array.from({ length: MAX_CALLS_OUT }, () =>
      batcher.consume('behind', request({ hourLimit: 1000, dayLimit: 1000 })),
    );
    const failure = await batcher.consume('behind', request()).catch((err: unknown) => err);
    expect(failure).toMatchObject({ name: 'StoreUnavailableError', kind: 'timeout' });
    expect((failure as Error).message).toBe(`Redis is behind: ${MAX_CALLS_OUT} calls out`);
    // Without batching the bound is per counter: one behind a Cluster node that is down holds back no other.
    expect(await batcher.consume('not-behind', request())).toMatchObject({ allowed: true, hour: 1 });
    // The calls that were out are answered after the pause; the one refused was never sent.
    expect((await Promise.all(out)).every((counts) => counts.allowed)).toBe(true);
    expect(await inspect.hget('behind', 'hc')).toBe(String(MAX_CALLS_OUT));
    expect(await batcher.consume('behind', request({ hourLimit: 1000, dayLimit: 1000 }))).toMatchObject({
      allowed: true,
    });
    perCounter.close();
  });
});

describe('ConsumeBatcher on a Cluster master taken as away', () => {
  /**
   * A batcher as on a Cluster (batching off) whose DownMasters has a slot map of `key`'s slot on
   * one master, a clock the test moves, and a ledger of its own; the master is marked as away at 0.
   */
  function withMasterAway(name: string): {
    key: string;
    clock: { now: number };
    downMasters: DownMasters;
    perCounter: ReceiptLedger;
    batcher: ConsumeBatcher;
  } {
    const key = `${name}-${Date.now().toString(36)}`;
    const slots: string[][] = [];
    slots[calculateSlot(key)] = ['10.0.0.1:6379'];
    const clock = { now: 0 };
    const downMasters = new DownMasters({ slots, status: 'ready' }, { now: () => clock.now });
    const perCounter = new ReceiptLedger(c, { downMasters });
    const batcher = new ConsumeBatcher(c, perCounter, { batching: false, downMasters });
    downMasters.failed(key);
    return { key, clock, downMasters, perCounter, batcher };
  }

  it("sends the undos held back for the master as soon as a call there is answered, ahead of the calls after it (regression: they waited for the ledger's next round, and the calls on the counter pushed the receipt out)", async () => {
    const { key, clock, perCounter, batcher } = withMasterAway('away');
    const plenty = request({ hourLimit: 10_000, dayLimit: 10_000 });
    // A call that counted, then fell in doubt on the master's connection, which is marked.
    const doubtful = perCounter.issue(key);
    const keysThenArgs: Array<string | number> = [key];
    pushConsumeArgs(keysThenArgs, [{ request: plenty }], doubtful);
    await c.eval(CONSUME_SCRIPT, 1, ...keysThenArgs);
    perCounter.failed(doubtful, { keys: [key] }, new Error('Connection is closed.'));
    await perCounter.reconcile();
    expect(perCounter.inDoubt).toBe(1);
    // Its time has come: this call tries the master, which answers, and many calls count on the
    // counter right after.
    clock.now = 1000;
    expect(await batcher.consume(key, plenty)).toMatchObject({ allowed: true });
    for (let wave = 0; wave < 3; wave++)
      await Promise.all(Array.from({ length: 200 }, () => batcher.consume(key, plenty)));
    for (let i = 0; i < 100 && perCounter.inDoubt > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(perCounter.inDoubt).toBe(0);
    expect(await inspect.hmget(key, 'hc', 'dc')).toEqual(['601', '601']);
    perCounter.close();
  });

  it("takes the master as away again when the call that tries it fails in any way, a timeout too, and says the failure is the store's part only (the limiter would otherwise decide every request without Redis for a second)", async () => {
    const { key, clock, downMasters, perCounter, batcher } = withMasterAway('probe');
    await expect(batcher.consume(key, request())).rejects.toMatchObject({ kind: 'connection', part: true });
    // Its time has come: this call tries the master, which is slow; the call fails at 1500.
    clock.now = 1000;
    await inspect.call('CLIENT', 'PAUSE', '1300', 'ALL');
    const tried = batcher.consume(key, request());
    clock.now = 1500;
    await expect(tried).rejects.toMatchObject({ kind: 'timeout', part: true });
    // Marked again from its failure: the next try a whole downMs later.
    expect(downMasters.tryFor(key)).toBe('away');
    clock.now = 2000;
    expect(downMasters.tryFor(key)).toBe('away');
    clock.now = 2500;
    expect(downMasters.tryFor(key)).toBe('probe');
    // The pause ends; the call that timed out ran then, and is taken back (its undo tries the master).
    clock.now = 10_000;
    for (let i = 0; i < 100 && perCounter.inDoubt > 0; i++) {
      await perCounter.reconcile();
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(perCounter.inDoubt).toBe(0);
    expect(await inspect.hget(key, 'hc')).toBe('0');
    perCounter.close();
  });

  it('takes a master as back when the call that tries it finds its key no counter (the master answered)', async () => {
    const { key, clock, downMasters, perCounter, batcher } = withMasterAway('wrongtype');
    await inspect.set(key, 'not a counter');
    clock.now = 1000;
    await expect(batcher.consume(key, request())).rejects.toMatchObject({ kind: 'reply', part: true });
    expect(downMasters.any).toBe(false);
    perCounter.close();
  });
});
