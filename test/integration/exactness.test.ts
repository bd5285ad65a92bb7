import http from 'node:http';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FakeClock } from '../helpers/clock.js';
import {
  authHeader,
  startGatewayPair,
  startTestGateway,
  type GatewayPair,
  type TestGateway,
} from '../helpers/gateway.js';
import { expectTwoFields, send } from '../helpers/http.js';
import { refusingPort } from '../helpers/redis.js';

/** Counting is the product: exact under concurrency, across instances, and across windows. */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order List, route: "GET /orders", per_hour: 50, per_day: 60 }
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 10, per_day: 1000 }
  - { name: Small, route: "GET /symbols", per_hour: 3, per_day: 5 }
  - { name: Authentication, route: "POST /auth/token", also: ["POST /oapi/auth/gen-secret-key/derivative"], per_hour: 10, per_day: 20 }
`;

describe('two gateway instances on one Redis', () => {
  let pair: GatewayPair;
  let a: TestGateway;
  let b: TestGateway;

  beforeAll(async () => {
    // Counting in Redis is what is checked here: on a machine loaded by the rest of the suite a
    // call may outlast the default 200 ms, and its requests are then decided by each instance's
    // insurance counters (README "Configuration", REDIS_TIMEOUT_MS), whose remaining values are
    // the instance's own (a flake of the remaining-values check, the counts still exact).
    pair = await startGatewayPair({ limits: LIMITS, env: { LOG_LEVEL: 'warn', REDIS_TIMEOUT_MS: '3000' } });
    ({ a, b } = pair);
  });
  afterAll(async () => {
    await pair.stop();
  });

  it('admit exactly the limit together, with hundreds of concurrent requests on one key', async () => {
    const key = `pair-${Date.now()}`;
    const agent = new http.Agent({ keepAlive: true, maxSockets: 100 });
    const replies = await Promise.all(
      Array.from({ length: 400 }, (_, i) =>
        send(i % 2 ? a.url : b.url, { path: '/orders', headers: { 'X-API-Key': key }, agent }),
      ),
    );
    agent.destroy();
    const statuses = replies.map((r) => r.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(50);
    expect(statuses.filter((s) => s === 429)).toHaveLength(350);
    for (const reply of replies.filter((r) => r.status === 429))
      expect(reply.text).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    // Every admitted request saw its own count: remaining values 49..0 each exactly once.
    const remaining = replies
      .filter((r) => r.status === 200)
      .map((r) => Number(r.headers['x-ratelimit-remaining-hour']))
      .sort((x, y) => x - y);
    expect(remaining).toEqual(Array.from({ length: 50 }, (_, i) => i));
    const usage = await send(a.adminUrl, { path: `/admin/usage/${key}`, headers: authHeader() });
    expect(
      usage.json<{ endpoints: Array<{ route: string; hour: { used: number }; day: { used: number } }> }>().endpoints[0],
    ).toMatchObject({ route: 'GET /orders', hour: { used: 50 }, day: { used: 50 } });
  });

  it('keep many keys exact at once', async () => {
    const keys = Array.from({ length: 20 }, (_, i) => `many-${Date.now()}-${i}`);
    const agent = new http.Agent({ keepAlive: true, maxSockets: 100 });
    const replies = await Promise.all(
      keys.flatMap((key, k) =>
        Array.from({ length: 25 }, (_, i) =>
          send((i + k) % 2 ? a.url : b.url, { path: `/orders/${i}`, headers: { 'X-API-Key': key }, agent }).then(
            (r) => ({ key, status: r.status }),
          ),
        ),
      ),
    );
    agent.destroy();
    for (const key of keys) {
      const statuses = replies.filter((r) => r.key === key).map((r) => r.status);
      expect(statuses.filter((status) => status === 200)).toHaveLength(10);
      expect(statuses.filter((status) => status === 429)).toHaveLength(15);
      // The 15 refusals spent nothing: Redis holds the 10 admitted, in both windows.
      const usage = await send(a.adminUrl, { path: `/admin/usage/${key}`, headers: authHeader() });
      const row = usage
        .json<{ endpoints: Array<{ route: string; hour: { used: number }; day: { used: number } }> }>()
        .endpoints.find((e) => e.route === 'GET /orders/{id}');
      expect(row).toMatchObject({ hour: { used: 10 }, day: { used: 10 } });
    }
  });

  it('refuse, on the second instance, a key the first one spent', async () => {
    const key = `spent-${Date.now()}`;
    for (let i = 0; i < 3; i++)
      expect((await send(a.url, { path: '/symbols', headers: { 'X-API-Key': key } })).status).toBe(200);
    expect((await send(b.url, { path: '/symbols', headers: { 'X-API-Key': key } })).status).toBe(429);
    expect((await send(a.url, { path: '/symbols', headers: { 'X-API-Key': key } })).status).toBe(429);
  });
});

describe('windows over time', () => {
  // A day in the future: Redis expires counters by its own clock, so they must not lie in the past.
  const day = new Date(Math.ceil(Date.now() / 86_400_000) * 86_400_000 + 86_400_000);
  const at = (time: string): string => `${day.toISOString().slice(0, 10)}T${time}Z`;
  const clock = new FakeClock(at('10:59:58'));
  let gw: TestGateway;

  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, clock, env: { LOG_LEVEL: 'warn' } });
  });
  afterAll(async () => {
    await gw.stop();
  });

  const call = (key: string) => send(gw.url, { path: '/symbols', headers: { 'X-API-Key': key } });

  it('open a new hour at the clock hour, carry the day, and close the day at midnight', async () => {
    const key = `clock-${Date.now()}`;
    for (let i = 0; i < 3; i++) expect((await call(key)).status).toBe(200);
    const spentHour = await call(key);
    expect(spentHour.status).toBe(429);
    expect(spentHour.headers['retry-after']).toBe('2');

    clock.set(at('11:00:00'));
    const nextHour = await call(key);
    expect(nextHour.status).toBe(200);
    expect(nextHour.headers['x-ratelimit-remaining-hour']).toBe('2');
    expect(nextHour.headers['x-ratelimit-remaining-day']).toBe('1');
    expect(nextHour.headers.ratelimit).toBe('"hour";r=2;t=3600, "day";r=1;t=46800');
    expect((await call(key)).status).toBe(200);

    const spentDay = await call(key);
    expect(spentDay.status).toBe(429);
    expect(spentDay.headers['x-ratelimit-remaining-day']).toBe('0');
    expect(spentDay.headers['retry-after']).toBe(String(13 * 3600));

    clock.set(at('12:30:00'));
    const stillSpent = await call(key);
    expect(stillSpent.status).toBe(429);
    expect(stillSpent.headers['x-ratelimit-remaining-hour']).toBe('3');
    expect(stillSpent.headers['retry-after']).toBe(String(11 * 3600 + 1800));

    clock.advance((11 * 3600 + 1800) * 1000); // midnight
    const nextDay = await call(key);
    expect(nextDay.status).toBe(200);
    expect(nextDay.headers['x-ratelimit-remaining-day']).toBe('4');
  });

  it('reports usage on the clock the requests are counted by: the counts and resets of one instant', async () => {
    clock.set(at('13:59:59.250'));
    const key = `usage-clock-${Date.now()}`;
    for (let i = 0; i < 3; i++) expect((await call(key)).status).toBe(200);
    expect((await call(key)).headers.ratelimit).toBe('"hour";r=0;t=1, "day";r=2;t=36001');
    const usage = async () => {
      const reply = await send(gw.adminUrl, { path: `/admin/usage/${key}`, headers: authHeader() });
      expect(reply.status).toBe(200);
      const { endpoints } = reply.json<{ endpoints: Array<{ route: string; hour: unknown; day: unknown }> }>();
      return endpoints.find((e) => e.route === 'GET /symbols');
    };
    expect(await usage()).toMatchObject({
      hour: { limit: 3, used: 3, remaining: 0, resetSeconds: 1 },
      day: { limit: 5, used: 3, remaining: 2, resetSeconds: 36001 },
    });
    clock.set(at('14:00:00'));
    expect(await usage()).toMatchObject({
      hour: { limit: 3, used: 0, remaining: 3, resetSeconds: 3600 },
      day: { limit: 5, used: 3, remaining: 2, resetSeconds: 36000 },
    });
  });
});

describe('the shipped limits.yaml over time', () => {
  // A day in the future, as above.
  const day = new Date(Math.ceil(Date.now() / 86_400_000) * 86_400_000 + 86_400_000);
  const at = (time: string): string => `${day.toISOString().slice(0, 10)}T${time}Z`;
  const clock = new FakeClock(at('16:30:00'));
  let gw: TestGateway;

  beforeAll(async () => {
    gw = await startTestGateway({ clock, env: { LOG_LEVEL: 'warn' } });
  });
  afterAll(async () => {
    await gw.stop();
  });

  it('starts the day at 00:00 in Hanoi (17:00 UTC), not at midnight UTC', async () => {
    const key = `hanoi-${Date.now()}`;
    const call = () => send(gw.url, { path: '/orders', method: 'POST', headers: { 'X-API-Key': key } });
    // 23:30 in Hanoi: the day ends in half an hour.
    const late = await call();
    expect(late.headers['x-ratelimit-remaining-day']).toBe('49999');
    expect(late.headers.ratelimit).toBe('"hour";r=3599;t=1800, "day";r=49999;t=1800');
    await call();
    clock.set(at('16:59:59'));
    expect((await call()).headers['x-ratelimit-remaining-day']).toBe('49997');
    // 00:00 in Hanoi: a new day (in UTC the day would carry on to 24:00 UTC, 07:00 in Hanoi).
    clock.set(at('17:00:00'));
    const nextDay = await call();
    expect(nextDay.headers['x-ratelimit-remaining-day']).toBe('49999');
    expect(nextDay.headers.ratelimit).toBe('"hour";r=3599;t=3600, "day";r=49999;t=86400');
  });
});

describe('bridges that fail', () => {
  let unreachable: TestGateway;
  let silent: TestGateway;
  let silentServer: net.Server;
  const held: net.Socket[] = [];

  beforeAll(async () => {
    const closedPort = await refusingPort();
    unreachable = await startTestGateway({
      limits: LIMITS,
      env: { EQT_BRIDGE_URL: `http://127.0.0.1:${closedPort}`, LOG_LEVEL: 'warn' },
    });
    silentServer = net.createServer((socket) => {
      held.push(socket);
      socket.on('error', () => {});
    });
    await new Promise<void>((r) => silentServer.listen(0, '127.0.0.1', r));
    silent = await startTestGateway({
      limits: LIMITS,
      env: {
        EQT_BRIDGE_URL: `http://127.0.0.1:${(silentServer.address() as net.AddressInfo).port}`,
        UPSTREAM_TIMEOUT_MS: '300',
        LOG_LEVEL: 'warn',
      },
    });
  });
  afterAll(async () => {
    for (const s of held) s.destroy();
    silentServer.close();
    await Promise.all([unreachable.stop(), silent.stop()]);
  });

  it('answer 502 when the bridge cannot be reached, counted, with no internal address', async () => {
    const reply = await send(unreachable.url, { path: '/orders/1', headers: { 'X-API-Key': 'k502' } });
    expect(reply.status).toBe(502);
    expect(expectTwoFields(reply)).toEqual({ error: 'Bad Gateway', message: 'Bridge unreachable' });
    expect(reply.text).not.toMatch(/127\.0\.0\.1|ECONNREFUSED/);
    expect(reply.headers['x-ratelimit-remaining-hour']).toBe('9');
    // Once (regression: the forwarder's own answers repeated it).
    expect(reply.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'x-request-id')).toHaveLength(1);
  });

  it('answer 504 when the bridge does not answer within UPSTREAM_TIMEOUT_MS, and serve the next request', async () => {
    const started = Date.now();
    const reply = await send(silent.url, { path: '/orders/1', headers: { 'X-API-Key': 'k504' } });
    expect(reply.status).toBe(504);
    expect(expectTwoFields(reply)).toEqual({ error: 'Gateway Timeout', message: 'Bridge did not answer in time' });
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(reply.headers['x-ratelimit-remaining-hour']).toBe('9');
    // The fno bridge still works through the same gateway.
    const other = await send(silent.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/derivative',
      headers: { 'X-API-Key': 'k504', 'Content-Type': 'application/json' },
      body: '{"username":"demo","password":"demo-password"}',
    });
    expect(other.status).toBe(200);
  });
});
