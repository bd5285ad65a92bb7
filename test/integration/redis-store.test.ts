import { afterAll, describe, expect, it } from 'vitest';
import { RedisCounterStore } from '../../src/redis/counter-store.js';
import { createRedisClient } from '../../src/redis/connection.js';
import { StoreUnavailableError } from '../../src/limits/store.js';
import { describeCounterStore, request } from '../helpers/store-contract.js';
import { connectedClient, REDIS_URL, redisClient, startRedisServer, uniquePrefix } from '../helpers/redis.js';

const client = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 1000 });
await client.connect();
const prefix = uniquePrefix('store');
afterAll(async () => {
  await client.quit();
});

// One store per client, as the gateway has it.
const shared = new RedisCounterStore(client, prefix);
describeCounterStore('RedisCounterStore', () => shared);

/** The receipt fields of a counter (one per instance that counted in it): `[field, receipts]`. */
const receiptFields = (counter: Record<string, string>): Array<[string, string]> =>
  Object.entries(counter).filter(([field]) => field.startsWith('rc:'));

describe('RedisCounterStore in Redis', () => {
  it('keeps one hash per key and row, in the key hash slot, expiring after its day', async () => {
    const store = new RedisCounterStore(client, prefix);
    const r = request({ keyHash: 'slotcheck' });
    await store.consume(r);
    const key = store.counterKey('slotcheck', r.counterId);
    expect(key).toBe(`${prefix}c:{slotcheck}:${r.counterId}`);
    const inspect = redisClient();
    const stored = await inspect.hgetall(key);
    expect(stored).toMatchObject({ hs: String(r.hourStart), hc: '1', ds: String(r.dayStart), dc: '1' });
    // The receipt of the call, and the units it added, in the instance's own field.
    expect(receiptFields(stored)).toEqual([
      [expect.stringMatching(/^rc:[A-Za-z0-9_-]+$/), expect.stringMatching(/^\d+:1:\d+:\d+,$/)],
    ]);
    expect(await inspect.pexpiretime(key)).toBe(r.expireAt);
    inspect.disconnect();
  });

  it('keeps no receipt of a call that was answered once a later call counts, and none of refusals', async () => {
    const store = new RedisCounterStore(client, prefix);
    for (let i = 0; i < 20; i++) await store.consume(request({ keyHash: 'receipts', hourLimit: 12, dayLimit: 100 }));
    const inspect = redisClient();
    const fields = receiptFields(await inspect.hgetall(store.counterKey('receipts', request().counterId)));
    inspect.disconnect();
    // Twelve admitted one after the other, each answered before the next: only the last one's receipt is left.
    expect(fields).toHaveLength(1);
    expect(fields[0]?.[1]).toMatch(/^\d+:1:\d+:\d+,$/);
  });

  it('takes back every unit of a call that timed out, however many requests of one key it held (regression: only the last 8 were)', async () => {
    const own = await startRedisServer();
    const c = await connectedClient(own.url, 100);
    const store = new RedisCounterStore(c, 'x:');
    await store.consume(request({ keyHash: 'warm' })); // loads the script
    const pauser = redisClient(own.url);
    await pauser.call('CLIENT', 'PAUSE', '400', 'WRITE');
    const results = await Promise.allSettled(
      Array.from({ length: 12 }, () => store.consume(request({ keyHash: 'paused', hourLimit: 100, dayLimit: 100 }))),
    );
    expect(
      results.every((r) => r.status === 'rejected' && (r.reason as StoreUnavailableError).kind === 'timeout'),
    ).toBe(true);
    await new Promise((r) => setTimeout(r, 700));
    await store.reconcile();
    expect(
      await store.usage('paused', [
        { counterId: request().counterId, hourStart: request().hourStart, dayStart: request().dayStart },
      ]),
    ).toEqual([{ hour: 0, day: 0 }]);
    // The call's receipt stays, with no units (the script counts nothing for it should it run again).
    expect(receiptFields(await pauser.hgetall(store.counterKey('paused', request().counterId)))).toEqual([
      [expect.stringMatching(/^rc:/), expect.stringMatching(/^\d+:0:\d+:\d+,$/)],
    ]);
    pauser.disconnect();
    c.disconnect();
    await own.stop();
  });

  it('fails with a typed store error, quickly, when Redis is gone', async () => {
    const own = await startRedisServer();
    const c = await connectedClient(own.url, 200);
    const store = new RedisCounterStore(c, 'x:');
    await own.stop();
    const started = Date.now();
    const err = await store.consume(request()).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StoreUnavailableError);
    expect(Date.now() - started).toBeLessThan(1000);
    c.disconnect();
  });
});
