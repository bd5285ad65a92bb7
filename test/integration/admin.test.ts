import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ADMIN_TOKEN, authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { expectTwoFields, rawExchange, send } from '../helpers/http.js';
import { startRedisServer, startRedisWithUser } from '../helpers/redis.js';

/** The admin listener (docs/operations.md "The admin listener"), over real sockets. */

const LIMITS = `
timezone: UTC
limits:
  - name: Authentication
    route: POST /auth/token
    also: [POST /oapi/auth/gen-secret-key/underlying]
    per_hour: 60
    per_day: 500
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 4, per_day: 6 }
  - { name: Trial Quote, route: "GET /marketdata/quote/{symbol}", per_hour: 2, per_day: 100, shadow: true }
  - { name: Both Windows, route: "GET /both/{id}", per_hour: 2, per_day: 2 }
plans:
  premium: { scale: 5 }
`;

let gw: TestGateway;
beforeAll(async () => {
  gw = await startTestGateway({ limits: LIMITS });
});
afterAll(async () => {
  await gw.stop();
});

const admin = (path: string, init: { method?: string; headers?: Record<string, string>; body?: string } = {}) =>
  send(gw.adminUrl, {
    path,
    method: init.method ?? 'GET',
    headers: init.headers ?? authHeader(),
    ...(init.body ? { body: init.body } : {}),
  });

describe('health and readiness', () => {
  it('answer without a token', async () => {
    const health = await admin('/healthz', { headers: {} });
    expect(health.status).toBe(200);
    expect(health.json()).toEqual({ status: 'ok' });
    const ready = await admin('/readyz', { headers: {} });
    expect(ready.status).toBe(200);
    expect(ready.json()).toEqual({ status: 'ok' });
  });

  it('serves Prometheus text without a token', async () => {
    await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': 'metrics-key' } });
    const metrics = await admin('/metrics', { headers: {} });
    expect(metrics.status).toBe(200);
    expect(metrics.headers['content-type']).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(metrics.text).toMatch(/^oapi_gateway_requests_total\{endpoint="GET \/orders\/\{id\}",status="200"\} \d+$/m);
  });
});

describe('/admin/* authentication', () => {
  it('answers 401 in two-field JSON without a token or with a wrong one', async () => {
    const attempts: Array<Record<string, string>> = [
      {},
      { Authorization: 'Bearer wrong-token-0123456789' },
      { Authorization: `Basic ${ADMIN_TOKEN}` },
    ];
    for (const headers of attempts) {
      const reply = await admin('/admin/limits', { headers });
      expect(reply.status).toBe(401);
      expect(expectTwoFields(reply).error).toBe('Unauthorized');
      expect(reply.headers['www-authenticate']).toMatch(/^Bearer/);
    }
  });

  it('answers 404 in two-field JSON for an unknown admin path', async () => {
    const reply = await admin('/admin/nothing');
    expect(reply.status).toBe(404);
    expect(expectTwoFields(reply).error).toBe('Not Found');
  });

  it('answers 405 with Allow in two-field JSON for a method a path does not have (regression: 404 "No such admin endpoint")', async () => {
    const cases: Array<[string, string, string]> = [
      ['PUT', '/admin/limits', 'GET, HEAD'],
      ['GET', '/admin/limits/reload', 'POST'],
      ['DELETE', '/admin/keys', 'POST, GET, HEAD'],
      ['POST', '/admin/usage/some-key', 'GET, HEAD, DELETE'],
      ['PATCH', '/admin/blocks/198.51.100.7', 'DELETE'],
      ['POST', '/healthz', 'GET, HEAD'],
      ['POST', '/openapi.json', 'GET, HEAD'],
    ];
    for (const [method, path, allow] of cases) {
      const reply = await admin(path, { method });
      expect(reply.status, `${method} ${path}`).toBe(405);
      expect(reply.headers.allow).toBe(allow);
      expect(expectTwoFields(reply)).toEqual({
        error: 'Method Not Allowed',
        message: 'Method not allowed for this endpoint',
      });
    }
    // Still 401 first without the token, and 404 for a path the listener has for no method.
    expect((await admin('/admin/limits', { method: 'PUT', headers: {} })).status).toBe(401);
    expect((await admin('/openapiXjson')).status).toBe(404);
    expect((await admin('/admin/limits/')).status).toBe(404);
  });

  it('answers 403 to every /admin/* request when ADMIN_TOKEN is unset', async () => {
    const locked = await startTestGateway({ limits: LIMITS, env: { ADMIN_TOKEN: undefined } });
    try {
      for (const path of ['/admin/limits', '/admin/usage/x', '/admin/keys']) {
        const reply = await send(locked.adminUrl, { path, headers: authHeader() });
        expect(reply.status).toBe(403);
        expect(expectTwoFields(reply)).toEqual({
          error: 'Forbidden',
          message: 'The admin API is disabled: ADMIN_TOKEN is not set',
        });
      }
      expect((await send(locked.adminUrl, { path: '/healthz' })).status).toBe(200);
    } finally {
      await locked.stop();
    }
  });

  it('accepts every ADMIN_TOKEN start-up accepts: all the characters RFC 6750 allows (regression: a token start-up took answered every call 401)', async () => {
    const token = 'Az09-._~+/Az09-._~+/==';
    const special = await startTestGateway({ limits: LIMITS, redis: false, env: { ADMIN_TOKEN: token } });
    try {
      const reply = await send(special.adminUrl, {
        path: '/admin/limits',
        headers: { Authorization: `Bearer ${token}` },
      });
      expect(reply.status).toBe(200);
      const wrong = await send(special.adminUrl, { path: '/admin/limits', headers: authHeader() });
      expect(wrong.status).toBe(401);
    } finally {
      await special.stop();
    }
  });
});

describe('malformed requests to the admin listener', () => {
  it("get the two-field answers of the public listener, not an empty one (regression: Node's bare 400 and 431)", async () => {
    const port = Number(new URL(gw.adminUrl).port);
    const garbage = await rawExchange(port, 'THIS IS NOT HTTP\r\n\r\n');
    expect(garbage).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
    expect(JSON.parse(garbage.slice(garbage.indexOf('\r\n\r\n') + 4))).toEqual({
      error: 'Bad Request',
      message: 'Malformed HTTP request',
    });
    const huge = await rawExchange(port, `GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(huge).toMatch(/^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
    expect(JSON.parse(huge.slice(huge.indexOf('\r\n\r\n') + 4))).toEqual({
      error: 'Request Header Fields Too Large',
      message: 'Request headers are too large',
    });
  });

  it('that Node parses but that form no URL (bad Host, OPTIONS *, a backslash) get a two-field 400 (regression: an empty 400)', async () => {
    const port = Number(new URL(gw.adminUrl).port);
    const requests = [
      'GET /healthz HTTP/1.1\r\nHost: a b\r\nConnection: close\r\n\r\n',
      'OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n',
      'GET /admin\\keys HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n',
    ];
    for (const request of requests) {
      const reply = await rawExchange(port, request);
      expect(reply).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      expect(reply.toLowerCase()).toContain('content-type: application/json');
      expect(JSON.parse(reply.slice(reply.indexOf('\r\n\r\n') + 4))).toEqual({
        error: 'Bad Request',
        message: 'Malformed request',
      });
    }
  });
});

describe('GET /admin/limits', () => {
  it('shows the table in force, its file, hash and load time', async () => {
    const reply = await admin('/admin/limits');
    expect(reply.status).toBe(200);
    const body = reply.json<Record<string, unknown>>();
    expect(body).toMatchObject({ file: gw.limitsPath, timezone: 'UTC' });
    expect(body.hash).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(new Date(body.loadedAt as string).toISOString()).toBe(body.loadedAt);
    expect((body.limits as unknown[])[0]).toEqual({
      name: 'Authentication',
      route: 'POST /auth/token',
      also: ['POST /oapi/auth/gen-secret-key/underlying'],
      per_hour: 60,
      per_day: 500,
    });
    expect((body.limits as unknown[])[2]).toEqual({
      name: 'Trial Quote',
      route: 'GET /marketdata/quote/{symbol}',
      per_hour: 2,
      per_day: 100,
      shadow: true,
    });
  });
});

describe('/admin/usage/{apiKey}', () => {
  it('reports one entry per row, in table order, with the exact shape of docs/operations.md "The admin listener"', async () => {
    const key = `usage-${Date.now()}`;
    for (let i = 0; i < 3; i++) await send(gw.url, { path: `/orders/${i}`, headers: { 'X-API-Key': key } });
    const reply = await admin(`/admin/usage/${key}`);
    expect(reply.status).toBe(200);
    const { endpoints } = reply.json<{ endpoints: Array<Record<string, unknown>> }>();
    expect(endpoints.map((e) => e.route)).toEqual([
      'POST /auth/token',
      'GET /orders/{id}',
      'GET /marketdata/quote/{symbol}',
      'GET /both/{id}',
    ]);
    const orders = endpoints[1] as { name: string; hour: Record<string, number>; day: Record<string, number> };
    expect(Object.keys(orders)).toEqual(['name', 'route', 'hour', 'day']);
    expect(orders.name).toBe('Order Status');
    expect(orders.hour).toMatchObject({ limit: 4, used: 3, remaining: 1 });
    expect(orders.day).toMatchObject({ limit: 6, used: 3, remaining: 3 });
    expect(Object.keys(orders.hour)).toEqual(['limit', 'used', 'remaining', 'resetSeconds']);
    const now = Date.now();
    expect(
      Math.abs(orders.hour.resetSeconds! - Math.ceil((Math.ceil(now / 3_600_000) * 3_600_000 - now) / 1000)),
    ).toBeLessThanOrEqual(2);
  });

  it('DELETE resets the key on every row, at once on the instance that had it spent', async () => {
    const key = `reset-${Date.now()}`;
    for (let i = 0; i < 4; i++) await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key } });
    expect((await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key } })).status).toBe(429);
    const reset = await admin(`/admin/usage/${key}`, { method: 'DELETE' });
    expect(reset.status).toBe(204);
    expect(reset.text).toBe('');
    const after = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key } });
    expect(after.status).toBe(200);
    expect(after.headers['x-ratelimit-remaining-hour']).toBe('3');
  });

  it('DELETE reaches the other instances through Redis, which forget their remembered refusals', async () => {
    const other = await startTestGateway({ limits: LIMITS, prefix: gw.prefix, bridges: { eqt: gw.eqt, fno: gw.fno } });
    try {
      const key = `reset-far-${Date.now()}`;
      for (let i = 0; i < 4; i++) await send(other.url, { path: '/orders/1', headers: { 'X-API-Key': key } });
      expect((await send(other.url, { path: '/orders/1', headers: { 'X-API-Key': key } })).status).toBe(429);
      expect((await admin(`/admin/usage/${key}`, { method: 'DELETE' })).status).toBe(204);
      const deadline = Date.now() + 2000;
      let status = 429;
      while (status === 429 && Date.now() < deadline) {
        status = (await send(other.url, { path: '/orders/1', headers: { 'X-API-Key': key } })).status;
        if (status === 429) await new Promise((r) => setTimeout(r, 20));
      }
      expect(status).toBe(200);
    } finally {
      await other.stop();
    }
  });

  it('never writes the key of the path to the log', async () => {
    const key = `secret-usage-key-${Date.now()}`;
    await admin(`/admin/usage/${key}`);
    await admin(`/admin/usage/${key}`, { method: 'DELETE' });
    await new Promise((r) => setTimeout(r, 20));
    expect(gw.logText()).not.toContain(key);
    const lines = gw.logs.filter((l) => l.admin === true && l.route === '/admin/usage/:apiKey');
    expect(lines.length).toBeGreaterThanOrEqual(2);
    expect(lines.every((l) => typeof l.key === 'string' && /^[0-9a-f]{12}$/.test(l.key))).toBe(true);
  });
});

describe('shadow rows', () => {
  it('are counted and reported in headers, usage and metrics, and never refused', async () => {
    const key = `shadow-${Date.now()}`;
    const replies = [];
    for (let i = 0; i < 5; i++)
      replies.push(await send(gw.url, { path: '/marketdata/quote/VNM', headers: { 'X-API-Key': key } }));
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect(replies.map((r) => r.headers['x-ratelimit-remaining-hour'])).toEqual(['1', '0', '0', '0', '0']);
    const usage = (await admin(`/admin/usage/${key}`)).json<{
      endpoints: Array<{ route: string; hour: { used: number; remaining: number } }>;
    }>();
    expect(usage.endpoints[2]?.hour).toMatchObject({ used: 5, remaining: 0 });
    const metrics = (await admin('/metrics', { headers: {} })).text;
    const shadowRefusals =
      /^oapi_gateway_refusals_total\{endpoint="GET \/marketdata\/quote\/\{symbol\}",window="hour",shadow="true"\} (\d+)$/m.exec(
        metrics,
      );
    expect(Number(shadowRefusals?.[1])).toBeGreaterThanOrEqual(3);
    expect(metrics).not.toMatch(
      /oapi_gateway_refusals_total\{endpoint="GET \/marketdata\/quote\/\{symbol\}",window="hour",shadow="false"\}/,
    );
  });
});

describe('metrics', () => {
  it('count a request refused with both windows spent once, as window="both" (regression: once per window)', async () => {
    const key = `both-${Date.now()}`;
    const statuses = [];
    for (let i = 0; i < 4; i++)
      statuses.push((await send(gw.url, { path: '/both/1', headers: { 'X-API-Key': key } })).status);
    expect(statuses).toEqual([200, 200, 429, 429]);
    const text = (await admin('/metrics', { headers: {} })).text;
    const refusals = [
      ...text.matchAll(
        /^oapi_gateway_refusals_total\{endpoint="GET \/both\/\{id\}",window="(\w+)",shadow="false"\} (\d+)$/gm,
      ),
    ];
    expect(refusals.map((m) => [m[1], Number(m[2])])).toEqual([['both', 2]]);
  });

  it('count requests, refusals, near-limit answers, latencies and the table, with bounded labels', async () => {
    const key = `metrics-${Date.now()}`;
    for (let i = 0; i < 5; i++)
      await send(gw.url, { path: `/orders/${i}-${Math.random()}`, headers: { 'X-API-Key': key } });
    await send(gw.url, { path: '/not/a/route', headers: { 'X-API-Key': key } });
    const text = (await admin('/metrics', { headers: {} })).text;
    expect(text).toMatch(
      /^oapi_gateway_refusals_total\{endpoint="GET \/orders\/\{id\}",window="hour",shadow="false"\} [1-9]\d*$/m,
    );
    expect(text).toMatch(/^oapi_gateway_near_limit_total\{endpoint="GET \/orders\/\{id\}",window="hour"\} [1-9]\d*$/m);
    expect(text).toMatch(/^oapi_gateway_requests_total\{endpoint="unmatched",status="404"\} [1-9]\d*$/m);
    expect(text).toMatch(
      /^oapi_gateway_request_duration_seconds_bucket\{le="[0-9.]+",endpoint="GET \/orders\/\{id\}"\} \d+$/m,
    );
    expect(text).toMatch(/^oapi_gateway_upstream_duration_seconds_count\{bridge="eqt"\} [1-9]\d*$/m);
    expect(text).toMatch(/^oapi_gateway_limits_rows 4$/m);
    expect(text).toMatch(/^oapi_gateway_limits_reloads_total\{result="ok"\} 1$/m);
    expect(text).toMatch(/^oapi_gateway_store_calls_total [1-9]\d*$/m);
    expect(text).toMatch(/^# TYPE oapi_gateway_store_fallbacks_total counter$/m);
    expect(text).toMatch(/^# TYPE oapi_gateway_websocket_connections gauge$/m);
    // No raw path or key ever becomes a label value.
    expect(text).not.toContain(key);
    expect(text).not.toContain('/not/a/route');
    expect(text).not.toMatch(/endpoint="\/orders\//);
  });
});

describe('a store that does not answer', () => {
  it('gets the admin API a two-field 503 naming the store, from the one error mapping of the app', async () => {
    const own = await startRedisServer();
    const down = await startTestGateway({ limits: LIMITS, redis: own.url, env: { REDIS_TIMEOUT_MS: '100' } });
    try {
      await own.kill();
      const usage = await send(down.adminUrl, { path: '/admin/usage/some-key', headers: authHeader() });
      expect(usage.status).toBe(503);
      expect(expectTwoFields(usage)).toEqual({ error: 'Service Unavailable', message: 'Counter store unavailable' });
      const issue = await send(down.adminUrl, {
        method: 'POST',
        path: '/admin/keys',
        headers: { ...authHeader(), 'Content-Type': 'application/json' },
        body: '{"id":"while-down"}',
      });
      expect(issue.status).toBe(503);
      expect(expectTwoFields(issue)).toEqual({ error: 'Service Unavailable', message: 'Key store unavailable' });
    } finally {
      await down.stop();
      await own.stop();
    }
  });
});

describe('a usage reset or an unblock whose announcement fails', () => {
  it('is made and answered 204, the failed announcement logged (regression: 503 "Counter store unavailable" for a change made)', async () => {
    const { redis, url, admin: acl } = await startRedisWithUser('resetchannels');
    acl.disconnect();
    const own = await startTestGateway({ limits: LIMITS, redis: url, env: { INVALID_KEY_MAX_ATTEMPTS: '1' } });
    const ownAdmin = (method: string, path: string) => send(own.adminUrl, { method, path, headers: authHeader() });
    try {
      const key = `unannounced-${Date.now()}`;
      const call = () => send(own.url, { path: '/both/1', headers: { 'X-API-Key': key } });
      for (let i = 0; i < 2; i++) expect((await call()).status).toBe(200);
      expect((await call()).status).toBe(429);
      expect((await ownAdmin('DELETE', `/admin/usage/${key}`)).status).toBe(204);
      expect((await call()).status).toBe(200);
      expect(own.logText()).toContain('usage reset not announced');

      // Missing keys past INVALID_KEY_MAX_ATTEMPTS: the address is blocked, valid key or not.
      for (let i = 0; i < 2; i++) await send(own.url, { path: '/both/1' });
      expect((await send(own.url, { path: '/both/1', headers: { 'X-API-Key': key } })).status).toBe(429);
      expect((await ownAdmin('DELETE', '/admin/blocks/127.0.0.1')).status).toBe(204);
      expect((await call()).status).toBe(200);
      expect(own.logText()).toContain('unblock not announced');
      expect(own.logText()).toContain('"msg":"address unblocked"');
    } finally {
      await own.stop();
      await redis.stop();
    }
  });
});
