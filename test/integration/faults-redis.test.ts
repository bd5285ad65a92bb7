import http from 'node:http';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { USAGE_HEADER_KEYS, expectTwoFields, send, type Reply } from '../helpers/http.js';
import { startRedisServer, type RedisProcess } from '../helpers/redis.js';
import { startRedisProxy, type RedisProxy } from '../helpers/redis-proxy.js';
import { accessLine, metricValue, readyz, sleep, timed, usageOfRow, waitFor, waitReady } from '../helpers/faults.js';

/**
 * Redis faults (docs/operations.md "When parts fail"; /readyz in "The admin listener"), each against a redis-server of
 * the test's own: killed, slow (CLIENT PAUSE), and killed and restarted in the middle of
 * traffic. After each: fast answers, the right answer per mode, readiness, the fallback
 * metric, no unit lost or counted twice, and the gateway serving again.
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Small, route: "GET /symbols", per_hour: 3, per_day: 5 }
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100000, per_day: 1000000 }
  - { name: Order List, route: "GET /orders", per_hour: 150, per_day: 100000 }
`;

const TOO_MANY = '{"error":"Rate Limit Exceeded","message":"Too Many Requests"}';
/** "Well under 1 s": the command timeout is 200 ms and a dead Redis must fail at once. */
const FAST_MS = 600;

let n = 0;
const newKey = (label: string): string => `${label}-${Date.now()}-${++n}`;
const newId = (label: string): string => `${label}-${Date.now()}-${++n}`;

async function get(gw: TestGateway, path: string, key: string): Promise<{ reply: Reply; ms: number; id: string }> {
  const id = newId('rq');
  const { value, ms } = await timed(() =>
    send(gw.url, { path, headers: { 'X-API-Key': key, 'X-Request-Id': id }, agent: false, timeoutMs: 5000 }),
  );
  return { reply: value, ms, id };
}

/** Waits until the access-log line of `id` is written, and returns its `counter` field (undefined: the counter store). */
async function counterOf(gw: TestGateway, id: string): Promise<unknown> {
  await waitFor(`access log line of ${id}`, () => accessLine(gw, id) !== undefined, 2000, 10);
  return accessLine(gw, id)?.counter;
}

function startGw(redis: RedisProcess, mode: string | undefined): Promise<TestGateway> {
  return startTestGateway({
    limits: LIMITS,
    redis: redis.url,
    env: { REDIS_FAILURE_MODE: mode, REDIS_TIMEOUT_MS: '200', LOG_LEVEL: 'info' },
  });
}

/** `CLIENT PAUSE <ms> ALL` from a client of the test's own: every other client's commands wait. */
async function pauseRedis(redis: RedisProcess, ms: number): Promise<void> {
  const admin = new Redis(redis.url, { maxRetriesPerRequest: 0 });
  try {
    await admin.call('CLIENT', 'PAUSE', String(ms), 'ALL');
  } finally {
    admin.disconnect();
  }
}

describe('REDIS_FAILURE_MODE=insurance (the default)', () => {
  let redis: RedisProcess;
  let gw: TestGateway;

  beforeAll(async () => {
    redis = await startRedisServer({ persist: true });
    gw = await startGw(redis, undefined);
  });
  afterAll(async () => {
    await gw?.stop();
    await redis?.stop();
  });

  it('keeps limiting from per-instance counters while Redis is dead, fast, degraded, with fallbacks counted; then counts in Redis again by itself', async () => {
    // Before: a key uses 2 of its 3 in Redis.
    const early = newKey('ins-early');
    for (const remaining of ['2', '1']) {
      const { reply } = await get(gw, '/symbols', early);
      expect(reply.status).toBe(200);
      expect(reply.headers['x-ratelimit-remaining-hour']).toBe(remaining);
    }
    expect((await usageOfRow(gw, early, 'GET /symbols')).hour.used).toBe(2);
    expect(await readyz(gw)).toEqual({ status: 200, body: { status: 'ok' } });
    const fallbacksBefore = await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'insurance' });
    const bridgeBefore = gw.eqt.requests.length;

    await redis.kill();

    // A small row still refuses at its limit, from the instance's own counters.
    const key = newKey('ins-outage');
    const outage = [];
    for (let i = 0; i < 5; i++) outage.push(await get(gw, '/symbols', key));
    expect(outage.map((o) => o.reply.status)).toEqual([200, 200, 200, 429, 429]);
    for (const o of outage) expect(o.ms).toBeLessThan(FAST_MS);
    expect(outage.slice(0, 3).map((o) => o.reply.headers['x-ratelimit-remaining-hour'])).toEqual(['2', '1', '0']);
    for (const o of outage.slice(3)) {
      expect(o.reply.text).toBe(TOO_MANY);
      expect(Number(o.reply.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    for (const o of outage) for (const h of USAGE_HEADER_KEYS) expect(o.reply.headers[h], h).toBeDefined();
    for (const o of outage) expect(await counterOf(gw, o.id)).toBe('insurance');
    expect(gw.eqt.requests.length - bridgeBefore).toBe(3);

    const ready = await readyz(gw);
    expect(ready.status).toBe(200);
    expect(ready.body.status).toBe('degraded');
    expect(typeof ready.body.reason).toBe('string');
    expect(String(ready.body.reason).length).toBeGreaterThan(0);
    expect(Object.keys(ready.body).sort()).toEqual(['reason', 'status']);

    expect((await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'insurance' })) - fallbacksBefore).toBe(
      5,
    );
    expect(await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'connection' })).toBeGreaterThanOrEqual(1);

    await redis.restart();
    await waitReady(gw, 8000);
    // With the connection back, and before any request, the outage's 3 admissions reach Redis.
    await waitFor(
      'the outage admissions in Redis',
      async () => (await usageOfRow(gw, key, 'GET /symbols')).day.used === 3,
      3000,
      50,
    );

    // Back in Redis, nothing lost across the kill: the early key has exactly one unit left.
    const third = await get(gw, '/symbols', early);
    expect(third.reply.status).toBe(200);
    expect(third.reply.headers['x-ratelimit-remaining-hour']).toBe('0');
    expect(await counterOf(gw, third.id)).toBeUndefined();
    expect((await usageOfRow(gw, early, 'GET /symbols')).hour.used).toBe(3);
    const fourth = await get(gw, '/symbols', early);
    expect(fourth.reply.status).toBe(429);
    expect(fourth.reply.text).toBe(TOO_MANY);

    // A new key's count lands in Redis again.
    const fresh = newKey('ins-after');
    const after = await get(gw, '/orders/7', fresh);
    expect(after.reply.status).toBe(200);
    expect(await counterOf(gw, after.id)).toBeUndefined();
    expect((await usageOfRow(gw, fresh, 'GET /orders/{id}')).hour.used).toBe(1);
    expect(await readyz(gw)).toEqual({ status: 200, body: { status: 'ok' } });
  });

  it('treats a slow Redis (CLIENT PAUSE 2000 ALL) like a dead one, counts no insurance-decided request in Redis twice, and adds them once when it answers again', async () => {
    const key = newKey('ins-slow');
    const first = await get(gw, '/symbols', key);
    expect(first.reply.status).toBe(200);
    expect(await counterOf(gw, first.id)).toBeUndefined();
    const fallbacksBefore = await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'insurance' });
    const timeoutsBefore = await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'timeout' });

    const pausedAt = Date.now();
    await pauseRedis(redis, 2000);
    const slow = [];
    for (let i = 0; i < 4; i++) slow.push(await get(gw, '/symbols', key));
    const ready = await readyz(gw);
    expect(Date.now() - pausedAt).toBeLessThan(1900); // all of it happened while Redis was paused

    // The instance's own counters decide: 3 (a fresh count for this instance), then refuse.
    expect(slow.map((o) => o.reply.status)).toEqual([200, 200, 200, 429]);
    for (const o of slow) expect(o.ms).toBeLessThan(FAST_MS);
    for (const o of slow) expect(await counterOf(gw, o.id)).toBe('insurance');
    expect(ready.status).toBe(200);
    expect(ready.body.status).toBe('degraded');
    expect(typeof ready.body.reason).toBe('string');
    expect((await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'insurance' })) - fallbacksBefore).toBe(
      4,
    );
    expect(
      (await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'timeout' })) - timeoutsBefore,
    ).toBeGreaterThanOrEqual(1);

    await sleep(Math.max(0, pausedAt + 2100 - Date.now()));
    await waitReady(gw, 5000);
    // Exactly the one request Redis decided is counted in Redis: none of those answered from
    // the insurance counters also used a unit there (their calls timed out and were taken back).
    expect((await usageOfRow(gw, key, 'GET /symbols')).hour.used).toBe(1);
    // The gateway serves from Redis again, and with its first answer from Redis hands over the
    // 3 units it admitted on its own: Redis then holds every admission of this key once.
    const mergedBefore = await metricValue(gw, 'oapi_gateway_insurance_merged_total', { result: 'ok' });
    const after = await get(gw, '/orders/8', newKey('ins-slow-after'));
    expect(after.reply.status).toBe(200);
    expect(await counterOf(gw, after.id)).toBeUndefined();
    await waitFor(
      'the insurance units merged',
      async () => (await usageOfRow(gw, key, 'GET /symbols')).hour.used === 4,
      2000,
      20,
    );
    expect(await usageOfRow(gw, key, 'GET /symbols')).toMatchObject({ hour: { used: 4 }, day: { used: 4 } });
    expect(await metricValue(gw, 'oapi_gateway_insurance_merged_total', { result: 'ok' })).toBeGreaterThan(
      mergedBefore,
    );
    const refused = await get(gw, '/symbols', key);
    expect(refused.reply.status).toBe(429);
    expect(refused.reply.text).toBe(TOO_MANY);
  });
});

describe('REDIS_FAILURE_MODE=open', () => {
  let redis: RedisProcess;
  let gw: TestGateway;

  beforeAll(async () => {
    redis = await startRedisServer();
    gw = await startGw(redis, 'open');
  });
  afterAll(async () => {
    await gw?.stop();
    await redis?.stop();
  });

  it('stops limiting while Redis is dead: requests pass fast without usage headers; degraded; fallbacks counted; limiting resumes on return', async () => {
    const fallbacksBefore = await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'open' });
    const bridgeBefore = gw.eqt.requests.length;
    await redis.kill();

    const key = newKey('open-outage');
    const outage = [];
    for (let i = 0; i < 6; i++) outage.push(await get(gw, '/symbols', key)); // twice the hourly limit
    expect(outage.map((o) => o.reply.status)).toEqual([200, 200, 200, 200, 200, 200]);
    for (const o of outage) {
      expect(o.ms).toBeLessThan(FAST_MS);
      expect(o.reply.json()).toEqual({ bridge: 'eqt', method: 'GET', path: '/symbols', query: '' });
      for (const h of USAGE_HEADER_KEYS) expect(o.reply.headers[h], h).toBeUndefined();
      expect(o.reply.headers['retry-after']).toBeUndefined();
      expect(await counterOf(gw, o.id)).toBeUndefined();
      expect(accessLine(gw, o.id)?.limit).toBe('uncounted');
    }
    expect(gw.eqt.requests.length - bridgeBefore).toBe(6);

    const ready = await readyz(gw);
    expect(ready.status).toBe(200);
    expect(ready.body.status).toBe('degraded');
    expect(ready.body.reason).toEqual(expect.stringMatching(/./));
    expect((await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'open' })) - fallbacksBefore).toBe(6);

    await redis.restart();
    await waitReady(gw, 8000);
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await get(gw, '/symbols', key)).reply.status);
    expect(statuses).toEqual([200, 200, 200, 429]);
    expect((await usageOfRow(gw, key, 'GET /symbols')).hour.used).toBe(3);
  });

  it('lets requests pass fast without usage headers while Redis is slow (CLIENT PAUSE)', async () => {
    const key = newKey('open-slow');
    const pausedAt = Date.now();
    await pauseRedis(redis, 1500);
    const slow = [];
    for (let i = 0; i < 3; i++) slow.push(await get(gw, '/orders/9', key));
    const ready = await readyz(gw);
    expect(Date.now() - pausedAt).toBeLessThan(1400);
    for (const o of slow) {
      expect(o.reply.status).toBe(200);
      expect(o.ms).toBeLessThan(FAST_MS);
      expect(o.reply.headers['x-ratelimit-limit-hour']).toBeUndefined();
    }
    expect(ready.status).toBe(200);
    expect(ready.body.status).toBe('degraded');
    await sleep(Math.max(0, pausedAt + 1600 - Date.now()));
    await waitReady(gw, 5000);
    expect((await get(gw, '/orders/9', newKey('open-slow-after'))).reply.headers['x-ratelimit-limit-hour']).toBe(
      '100000',
    );
  });
});

describe('REDIS_FAILURE_MODE=closed', () => {
  let redis: RedisProcess;
  let gw: TestGateway;

  beforeAll(async () => {
    redis = await startRedisServer();
    gw = await startGw(redis, 'closed');
  });
  afterAll(async () => {
    await gw?.stop();
    await redis?.stop();
  });

  it('answers a fast two-field 503 while Redis is dead and forwards nothing; /readyz 503; fallbacks counted; serves again on return', async () => {
    const fallbacksBefore = await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'closed' });
    const bridgeBefore = gw.eqt.requests.length;
    await redis.kill();

    const key = newKey('closed-outage');
    const outage = [];
    for (let i = 0; i < 3; i++) outage.push(await get(gw, '/orders/1', key));
    for (const o of outage) {
      expect(o.reply.status).toBe(503);
      expect(o.ms).toBeLessThan(FAST_MS);
      expect(o.reply.headers['content-type']).toMatch(/^application\/json/);
      expect(expectTwoFields(o.reply).error).toBe('Service Unavailable');
      // A known key gets its answer or a 503 with Retry-After (README "API keys and plans").
      expect(o.reply.headers['retry-after']).toBe('1');
      expect(o.reply.text).not.toMatch(/127\.0\.0\.1|ECONNREFUSED|redis:\/\/|at .*\.js/);
    }
    expect(gw.eqt.requests.length).toBe(bridgeBefore);

    const ready = await readyz(gw);
    expect(ready.status).toBe(503);
    expect(ready.body.reason).toEqual(expect.stringMatching(/./));
    expect((await metricValue(gw, 'oapi_gateway_store_fallbacks_total', { mode: 'closed' })) - fallbacksBefore).toBe(3);

    await redis.restart();
    await waitReady(gw, 8000);
    const after = await get(gw, '/orders/1', key);
    expect(after.reply.status).toBe(200);
    expect(after.reply.headers['x-ratelimit-remaining-hour']).toBe('99999');
    expect((await usageOfRow(gw, key, 'GET /orders/{id}')).hour.used).toBe(1);
  });

  it('answers a fast 503 while Redis is slow (CLIENT PAUSE), and a refused request uses no unit in Redis afterwards', async () => {
    const key = newKey('closed-slow');
    const pausedAt = Date.now();
    await pauseRedis(redis, 1500);
    const slow = [];
    for (let i = 0; i < 3; i++) slow.push(await get(gw, '/orders/2', key));
    const ready = await readyz(gw);
    expect(Date.now() - pausedAt).toBeLessThan(1400);
    for (const o of slow) {
      expect(o.reply.status).toBe(503);
      expect(o.ms).toBeLessThan(FAST_MS);
      expect(expectTwoFields(o.reply).error).toBe('Service Unavailable');
      expect(o.reply.headers['retry-after']).toBe('1');
    }
    expect(ready.status).toBe(503);
    await sleep(Math.max(0, pausedAt + 1600 - Date.now()));
    await waitReady(gw, 5000);
    // None of those requests was served: none may have used a unit.
    expect((await usageOfRow(gw, key, 'GET /orders/{id}')).hour.used).toBe(0);
    expect((await get(gw, '/orders/2', key)).reply.status).toBe(200);
  });
});

describe('a Redis reply lost with its connection (the command ran, the gateway never heard back)', () => {
  let redis: RedisProcess;
  let proxy: RedisProxy;
  let gw: TestGateway;

  beforeAll(async () => {
    redis = await startRedisServer();
    proxy = await startRedisProxy(redis.port);
    gw = await startTestGateway({
      limits: LIMITS,
      redis: proxy.url,
      env: { REDIS_TIMEOUT_MS: '200', LOG_LEVEL: 'info' },
    });
  });
  afterAll(async () => {
    await gw?.stop();
    await proxy?.close();
    await redis?.stop();
  });

  it('answers from the insurance counters, fast, and leaves Redis holding each admission once', async () => {
    const key = newKey('lost-reply');
    const first = await get(gw, '/symbols', key);
    expect(first.reply.status).toBe(200);
    expect(await counterOf(gw, first.id)).toBeUndefined();

    proxy.loseReplies = true;
    const second = await get(gw, '/symbols', key);
    proxy.loseReplies = false;
    expect(proxy.lost).toBeGreaterThanOrEqual(1);
    expect(second.reply.status).toBe(200);
    expect(second.ms).toBeLessThan(FAST_MS);
    expect(await counterOf(gw, second.id)).toBe('insurance');

    await waitReady(gw, 5000);
    // One admission was decided by Redis, one by the insurance counters. The doubtful call is
    // taken back and the insurance admission handed over once the connection is back: Redis
    // ends holding 2, each admission once (3 would be the lost call counted as well).
    await waitFor(
      'the insurance admission in Redis',
      async () => (await usageOfRow(gw, key, 'GET /symbols')).day.used === 2,
      3000,
      50,
    );
    await sleep(300);
    expect(await usageOfRow(gw, key, 'GET /symbols')).toMatchObject({ day: { used: 2 } });
  });
});

describe('regression: the units admitted while Redis was slow were lost when the gateway stopped before another request', () => {
  let redis: RedisProcess;
  let proxy: RedisProxy;

  beforeAll(async () => {
    redis = await startRedisServer();
    proxy = await startRedisProxy(redis.port);
  });
  afterAll(async () => {
    await proxy?.close();
    await redis?.stop();
  });

  /** The hour counts of every counter in this test's own Redis, added up. */
  async function hourCountsInRedis(): Promise<number> {
    const inspect = new Redis(redis.url, { maxRetriesPerRequest: 1 });
    try {
      let total = 0;
      for (const counter of await inspect.keys('*c:{*')) total += Number((await inspect.hget(counter, 'hc')) ?? 0);
      return total;
    } finally {
      inspect.disconnect();
    }
  }

  it('hands them to Redis on shutdown (a slow Redis never drops the connection, so no reconnection merges them)', async () => {
    const gw = await startTestGateway({
      limits: LIMITS,
      redis: proxy.url,
      env: { REDIS_TIMEOUT_MS: '200', LOG_LEVEL: 'info' },
    });
    const key = newKey('stop-merge');
    const first = await get(gw, '/orders/1', key);
    expect(await counterOf(gw, first.id)).toBeUndefined(); // counted in Redis
    proxy.delayRepliesMs = 500;
    const second = await get(gw, '/orders/1', key);
    proxy.delayRepliesMs = 0;
    expect(second.reply.status).toBe(200);
    expect(await counterOf(gw, second.id)).toBe('insurance');
    // The late answer comes and the call in doubt is taken back; no request follows.
    await sleep(1500);
    expect(await hourCountsInRedis()).toBe(1);
    await gw.stop();
    // Two requests were admitted and forwarded: Redis holds both.
    expect(await hourCountsInRedis()).toBe(2);
  });
});

describe('Redis killed (SIGKILL) and restarted during traffic (insurance mode, persistent Redis)', () => {
  let redis: RedisProcess;
  let gw: TestGateway;
  const LIMIT = 150;

  beforeAll(async () => {
    redis = await startRedisServer({ persist: true });
    gw = await startGw(redis, 'insurance');
  });
  afterAll(async () => {
    await gw?.stop();
    await redis?.stop();
  });

  it('gives no wrong answer, keeps each counter source within the limit, and ends with every admission counted once in Redis', async () => {
    const key = newKey('kill');
    const tag = `kill${Date.now()}`;
    interface Result {
      readonly id: string;
      readonly status: number;
      readonly ms: number;
      readonly text: string;
      readonly remaining: string | undefined;
      readonly error?: string;
    }
    const results: Result[] = [];
    let stop = false;
    let issued = 0;
    const MAX_REQUESTS = 4000;
    const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
    const worker = async (): Promise<void> => {
      while (!stop && issued < MAX_REQUESTS) {
        const id = `${tag}-${issued++}`;
        const t0 = performance.now();
        try {
          const r = await send(gw.url, {
            path: '/orders',
            headers: { 'X-API-Key': key, 'X-Request-Id': id },
            agent,
            timeoutMs: 5000,
          });
          results.push({
            id,
            status: r.status,
            ms: performance.now() - t0,
            text: r.text,
            remaining: r.headers['x-ratelimit-remaining-hour'] as string | undefined,
          });
        } catch (err) {
          results.push({
            id,
            status: -1,
            ms: performance.now() - t0,
            text: '',
            remaining: undefined,
            error: (err as Error).message,
          });
        }
        await sleep(8);
      }
    };
    const workers = Array.from({ length: 6 }, () => worker());
    try {
      // Some traffic counted in Redis, then the kill in the middle of it.
      await waitFor(
        '20 admissions before the kill',
        () => results.filter((r) => r.status === 200).length >= 20,
        10_000,
        5,
      );
      await redis.kill();
      const killedAt = results.length;
      await waitFor('traffic during the outage', () => results.length >= killedAt + 40, 10_000, 10);
      await sleep(600);
      await redis.restart();
      await waitReady(gw, 8000);
      const backAt = results.length;
      await waitFor('traffic after Redis returned', () => results.length >= backAt + 60, 10_000, 10);
    } finally {
      stop = true;
      await Promise.all(workers);
      agent.destroy();
    }

    // Every answer is a right one: the bridge's answer, or the exact 429. No error, no 5xx.
    expect(results.filter((r) => r.status !== 200 && r.status !== 429)).toEqual([]);
    for (const r of results) {
      if (r.status === 200)
        expect(JSON.parse(r.text)).toEqual({ bridge: 'eqt', method: 'GET', path: '/orders', query: '' });
      else expect(r.text).toBe(TOO_MANY);
      expect(r.ms).toBeLessThan(1000);
    }

    // Where each decision came from, from its access-log line.
    await waitFor('every access-log line', () => results.every((r) => accessLine(gw, r.id) !== undefined), 3000, 20);
    const source = (r: Result): string => (accessLine(gw, r.id)?.counter as string | undefined) ?? 'store';
    const ok = results.filter((r) => r.status === 200);
    const fromStore = ok.filter((r) => source(r) === 'store');
    const fromInsurance = ok.filter((r) => source(r) === 'insurance');
    expect(ok.length).toBe(fromStore.length + fromInsurance.length); // never admitted from the refusal cache
    expect(fromStore.length).toBeGreaterThan(0);
    expect(fromInsurance.length).toBeGreaterThan(0); // the outage really happened mid-traffic

    // Per counter source, no admission past the limit and each unit handed out once.
    expect(fromStore.length).toBeLessThanOrEqual(LIMIT);
    expect(fromInsurance.length).toBeLessThanOrEqual(LIMIT);
    const remainings = (rs: Result[]): number[] => rs.map((r) => Number(r.remaining)).sort((a, b) => a - b);
    expect(new Set(remainings(fromStore)).size).toBe(fromStore.length);
    expect(new Set(remainings(fromInsurance)).size).toBe(fromInsurance.length);

    // Redis ends up holding every admission exactly once: those it decided, and those of the
    // outage, added in one merge when it answered again. (Before the merge existed, the outage's
    // admissions never reached Redis, and a key could use its whole limit again afterwards.)
    const why = async (): Promise<string> => {
      const usage = await usageOfRow(gw, key, 'GET /orders');
      return (
        `Redis counted ${usage.hour.used}/${usage.day.used}; admitted ${fromStore.length} by Redis, ${fromInsurance.length} by insurance; store errors during the run: ` +
        `timeout ${await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'timeout' })}, ` +
        `connection ${await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'connection' })}, ` +
        `reply ${await metricValue(gw, 'oapi_gateway_store_errors_total', { kind: 'reply' })}; ` +
        `merged ok ${await metricValue(gw, 'oapi_gateway_insurance_merged_total', { result: 'ok' })}`
      );
    };
    // (The day count: a run that crosses an hour boundary starts a new hour window.)
    await waitFor(
      'the outage merged into Redis',
      async () => (await usageOfRow(gw, key, 'GET /orders')).day.used === ok.length,
      3000,
      50,
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${await why()}`);
    });
    // One counter merged once. (On a busy machine the merge's reply can outlast REDIS_TIMEOUT_MS
    // after Redis applied it: the gateway then sends the call again, which adds nothing, and
    // reports the counter once that call is answered.)
    await waitFor(
      'the merge reported',
      async () => (await metricValue(gw, 'oapi_gateway_insurance_merged_total', { result: 'ok' })) === 1,
      3000,
      50,
    );
    expect(await metricValue(gw, 'oapi_gateway_insurance_merged_total', { result: 'failed' })).toBe(0);

    // Nothing reached the bridge without an admission.
    const forwarded = gw.eqt.requests.filter((q) => String(q.headers['x-request-id'] ?? '').startsWith(`${tag}-`));
    expect(forwarded.length).toBe(ok.length);

    // And the gateway still serves.
    expect((await get(gw, '/orders/5', newKey('kill-after'))).reply.status).toBe(200);
  });
});

describe('a Redis busy with one long command (DEBUG SLEEP)', () => {
  const TIMEOUT_MS = 300;
  let redis: RedisProcess;
  let gw: TestGateway;

  beforeAll(async () => {
    redis = await startRedisServer({ args: ['--enable-debug-command', 'yes'] });
    gw = await startTestGateway({
      limits: LIMITS,
      redis: redis.url,
      env: { REDIS_TIMEOUT_MS: String(TIMEOUT_MS), LOG_LEVEL: 'info' },
    });
  });
  afterAll(async () => {
    await gw?.stop();
    await redis?.stop();
  });

  it('keeps every request’s wait for its counting near REDIS_TIMEOUT_MS (regression: ioredis’ auto-pipeline queued a request behind the timed-out one before it, up to twice that)', async () => {
    const warm = await get(gw, '/orders/1', newKey('busy-warm'));
    expect(await counterOf(gw, warm.id)).toBeUndefined();
    const admin = new Redis(redis.url, { maxRetriesPerRequest: 0 });
    const busy = admin.call('DEBUG', 'SLEEP', '1.5');
    await sleep(20);
    // Requests spread over the first REDIS_TIMEOUT_MS, while the first of them still waits.
    const outcomes = await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        await sleep(i * 35);
        return get(gw, '/orders/1', newKey('busy'));
      }),
    );
    await busy;
    admin.disconnect();
    for (const o of outcomes) expect(o.reply.status).toBe(200);
    // Each was decided by Redis in time or by the insurance counters after one timeout at most.
    for (const o of outcomes) expect(o.ms).toBeLessThan(TIMEOUT_MS * 1.6);
    expect(new Set(await Promise.all(outcomes.map((o) => counterOf(gw, o.id))))).toEqual(new Set(['insurance']));
  });
});

describe('a usage reset heard from another instance while this one keeps a merge Redis refused', () => {
  let redis: RedisProcess;
  let proxy: RedisProxy;
  let control: Redis;

  beforeAll(async () => {
    redis = await startRedisServer();
    proxy = await startRedisProxy(redis.port);
    control = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  });
  afterAll(async () => {
    control?.disconnect();
    await proxy?.close();
    await redis?.stop();
  });

  /** Subscribers of the event channels of this test's own Redis. */
  async function subscribers(): Promise<number> {
    const channels = (await control.call('PUBSUB', 'CHANNELS')) as string[];
    if (channels.length === 0) return 0;
    const counts = (await control.call('PUBSUB', 'NUMSUB', ...channels)) as Array<string | number>;
    return counts.filter((_, i) => i % 2 === 1).reduce<number>((sum, c) => sum + Number(c), 0);
  }

  it('drops the key’s kept units (the runner’s usage-reset wiring), so they never land after the reset', async () => {
    const far = await startTestGateway({
      limits: LIMITS,
      redis: proxy.url,
      env: { REDIS_TIMEOUT_MS: '200', LOG_LEVEL: 'info' },
    });
    const near = await startTestGateway({
      limits: LIMITS,
      redis: redis.url,
      prefix: far.prefix,
      bridges: { eqt: far.eqt, fno: far.fno },
    });
    try {
      const key = newKey('kept-reset');
      proxy.away = true;
      for (let i = 0; i < 3; i++) {
        const { reply, id } = await get(far, '/orders/1', key);
        expect(reply.status).toBe(200);
        expect(await counterOf(far, id)).toBe('insurance');
      }
      // Redis out of memory under noeviction refuses the merge's writes: the instance keeps the
      // call and sends it again once a second (docs/operations.md "The outage's admissions end up in Redis").
      await control.config('SET', 'maxmemory-policy', 'noeviction');
      await control.config('SET', 'maxmemory', '1');
      const merges = proxy.countForwarded('mg:');
      proxy.away = false;
      await waitFor('the refused merge sent again', () => merges() >= 2, 5000, 20);
      await waitFor('both instances subscribed', async () => (await subscribers()) === 2, 5000, 20);

      const reset = await send(near.adminUrl, {
        path: `/admin/usage/${key}`,
        method: 'DELETE',
        headers: authHeader(),
      });
      expect(reset.status).toBe(204);
      // The event reaches the far instance over loopback pub/sub within milliseconds.
      await sleep(200);
      const after = proxy.countForwarded('mg:');
      await control.config('SET', 'maxmemory', '0');
      // Two of the far instance's once-a-second resends would have come by now.
      await sleep(2500);
      expect(after()).toBe(0);
      expect(await usageOfRow(near, key, 'GET /orders/{id}')).toMatchObject({ hour: { used: 0 }, day: { used: 0 } });
    } finally {
      await near.stop();
      await far.stop();
    }
  });
});
