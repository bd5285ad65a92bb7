import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { rawExchange, send, type Reply } from '../helpers/http.js';
import { metricValue } from '../helpers/faults.js';
import { REDIS_URL, refusingPort, startRedisServer, type RedisProcess } from '../helpers/redis.js';
import { startRedisProxy, type RedisProxy } from '../helpers/redis-proxy.js';

/**
 * Every answer the gateway writes itself has an access line that says why (docs/operations.md
 * "Logs"): its `reason`, the client `address`, and the key's id or hash prefix; and it counts in
 * `oapi_gateway_own_answers_total` under the same reason. Each reason of the pinned list is
 * produced here over real sockets and found in the log.
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 2, per_day: 100 }
  - { name: Orders List, route: "GET /orders", per_hour: 1, per_day: 1 }
  - { name: Order Create, route: "POST /orders", per_hour: 100, per_day: 100 }
  - name: Authentication
    route: POST /auth/token
    also: [POST /oapi/auth/gen-secret-key/underlying]
    per_hour: 100
    per_day: 100
  - { name: Market Data Stream, route: "WS /ws/marketdata", per_hour: 100, per_day: 100 }
`;

/** A credential route: the gateway reads its JSON body itself (README "Forwarding"). */
const CREDENTIALS = '/oapi/auth/gen-secret-key/underlying';

/** The access line of the answer that carried this request id. */
function lineOf(gw: TestGateway, reply: Reply): Record<string, unknown> {
  const id = reply.headers['x-request-id'];
  expect(typeof id).toBe('string');
  const line = gw.logs.find((l) => l.msg === 'request' && l.reqId === id);
  expect(line, `access line of ${String(id)}`).toBeDefined();
  return line as Record<string, unknown>;
}

/** Waits until the access line of an answer is written (it is written once the answer is complete). */
async function settledLineOf(gw: TestGateway, reply: Reply): Promise<Record<string, unknown>> {
  for (let i = 0; i < 40 && !gw.logs.some((l) => l.reqId === reply.headers['x-request-id']); i++) {
    await new Promise((r) => setTimeout(r, 25));
  }
  return lineOf(gw, reply);
}

const key = (k: string) => ({ 'X-API-Key': k });

describe('answers of the app', () => {
  let gw: TestGateway;
  let registered: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, env: { MAX_BODY_BYTES: '64', INVALID_KEY_MAX_ATTEMPTS: '3' } });
    registered = await startTestGateway({ limits: LIMITS, env: { API_KEY_MODE: 'registered' } });
  });
  afterAll(async () => {
    await Promise.all([gw?.stop(), registered?.stop()]);
  });

  it.each([
    ['no-route', 404, { path: '/nowhere', headers: key('r-no-route') }, 'unmatched'],
    ['method', 405, { method: 'DELETE', path: '/orders/1', headers: key('r-method') }, 'GET /orders/{id}'],
    ['not-websocket', 426, { path: '/ws/marketdata', headers: key('r-ws') }, 'WS /ws/marketdata'],
    ['bad-path', 400, { path: '/orders/a%2Fb', headers: key('r-bad-path') }, 'unmatched'],
    [
      'body-size',
      413,
      {
        method: 'POST',
        path: '/orders',
        headers: { ...key('r-body'), 'Content-Type': 'application/json' },
        body: 'x'.repeat(65),
      },
      'POST /orders',
    ],
    [
      'content-type',
      415,
      { method: 'POST', path: CREDENTIALS, headers: { ...key('r-ct'), 'Content-Type': 'text/plain' }, body: 'x' },
      'POST /auth/token',
    ],
    [
      'credentials',
      400,
      {
        method: 'POST',
        path: CREDENTIALS,
        headers: { ...key('r-cred'), 'Content-Type': 'application/json' },
        body: '{',
      },
      'POST /auth/token',
    ],
  ] as const)(
    '%s: status %i, labelled with its row in the log and the metrics',
    async (reason, status, request, endpoint) => {
      const before = await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint, reason });
      const reply = await send(gw.url, request);
      expect(reply.status).toBe(status);
      const line = await settledLineOf(gw, reply);
      expect(line).toMatchObject({ reason, status, endpoint, address: '127.0.0.1' });
      expect(line.key).toMatch(/^[0-9a-f]{8,}/);
      expect(await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint, reason })).toBe(before + 1);
    },
  );

  it('hour-spent and day-spent: which window refused', async () => {
    for (let i = 0; i < 2; i++)
      expect((await send(gw.url, { path: '/orders/1', headers: key('r-hour') })).status).toBe(200);
    const hour = await send(gw.url, { path: '/orders/1', headers: key('r-hour') });
    expect(hour.status).toBe(429);
    expect(await settledLineOf(gw, hour)).toMatchObject({ reason: 'hour-spent', endpoint: 'GET /orders/{id}' });
    // Both windows spent: the day is what keeps the key refused longest.
    expect((await send(gw.url, { path: '/orders', headers: key('r-day') })).status).toBe(200);
    const day = await send(gw.url, { path: '/orders', headers: key('r-day') });
    expect(day.status).toBe(429);
    expect(await settledLineOf(gw, day)).toMatchObject({ reason: 'day-spent', endpoint: 'GET /orders' });
  });

  it('missing-key, then guard once the address is blocked; unknown-key in registered mode', async () => {
    const missing = await send(gw.url, { path: '/orders/1' });
    expect(missing.status).toBe(401);
    expect(await settledLineOf(gw, missing)).toMatchObject({ reason: 'missing-key', address: '127.0.0.1' });
    let last = missing;
    for (let i = 0; i < 3 && last.status !== 429; i++) last = await send(gw.url, { path: '/orders/1' });
    expect(last.status).toBe(429);
    expect(await settledLineOf(gw, last)).toMatchObject({ reason: 'guard', status: 429 });

    const unknown = await send(registered.url, { path: '/orders/1', headers: key('never-issued') });
    expect(unknown.status).toBe(401);
    const line = await settledLineOf(registered, unknown);
    expect(line).toMatchObject({ reason: 'unknown-key', address: '127.0.0.1' });
    expect(line.keyId).toBeUndefined();
  });

  it('names the issued key by its id; a bridge answer has no reason', async () => {
    const issued = await send(registered.adminUrl, {
      method: 'POST',
      path: '/admin/keys',
      headers: { Authorization: 'Bearer test-admin-token-0123456789', 'Content-Type': 'application/json' },
      body: JSON.stringify({ id: 'reasons-client' }),
    });
    const { key: apiKey } = issued.json<{ key: string }>();
    const reply = await send(registered.url, { path: '/orders/1', headers: key(apiKey) });
    expect(reply.status).toBe(200);
    const line = await settledLineOf(registered, reply);
    expect(line).toMatchObject({ keyId: 'reasons-client', status: 200, bridge: 'eqt' });
    expect(line.reason).toBeUndefined();
  });
});

describe('answers of the HTTP layer', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({
      limits: LIMITS,
      env: { MAX_HEADER_BYTES: '2048', REQUEST_TIMEOUT_MS: '300', HEADERS_TIMEOUT_MS: '300', MAX_HEADER_COUNT: '20' },
    });
  });
  afterAll(async () => {
    await gw.stop();
  });

  /** The line of a raw exchange's answer, found by the request id it carried. */
  async function lineOfRaw(answer: string): Promise<Record<string, unknown>> {
    const id = /\r\nX-Request-Id: ([^\r]+)\r\n/i.exec(answer)?.[1];
    expect(id, answer).toBeDefined();
    for (let i = 0; i < 40 && !gw.logs.some((l) => l.reqId === id); i++) await new Promise((r) => setTimeout(r, 25));
    const line = gw.logs.find((l) => l.msg === 'request' && l.reqId === id);
    expect(line, `access line of ${String(id)}`).toBeDefined();
    return line as Record<string, unknown>;
  }

  it.each([
    [
      'header-size',
      431,
      'too many header lines',
      `GET /orders/1 HTTP/1.1\r\nHost: x\r\n${'X-A: b\r\n'.repeat(25)}\r\n`,
    ],
    [
      'header-size',
      431,
      'headers over MAX_HEADER_BYTES',
      `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(4096)}\r\n\r\n`,
    ],
    ['bad-request', 400, 'no Host', 'GET /orders/1 HTTP/1.1\r\nX-API-Key: k\r\n\r\n'],
    ['bad-request', 400, 'garbage', 'NOT HTTP AT ALL\r\n\r\n'],
    // Regressions: node-server's answer to a Host it cannot make a URL of, and the upgrade handler's
    // own answers, had no request id, access line or metric.
    ['bad-request', 400, 'a Host that is no host name', 'GET /orders/1 HTTP/1.1\r\nHost: a b\r\n\r\n'],
    [
      'bad-request',
      400,
      'an upgrade to h2c',
      'GET /orders/1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n',
    ],
    [
      'not-implemented',
      501,
      'a coding before chunked',
      'POST /orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n',
    ],
    [
      'expectation',
      417,
      'an Expect other than 100-continue',
      'GET /orders/1 HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n\r\n',
    ],
    // A body that stops coming on a request the app serves is the app's own 408 (below).
    ['client-timeout', 408, 'headers that never end', 'GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: slow\r\n'],
  ] as const)('%s (%i): %s', async (reason, status, _what, bytes) => {
    const before = await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint: 'unmatched', reason });
    const answer = await rawExchange(gw.port, bytes, 3000);
    expect(answer.startsWith(`HTTP/1.1 ${status} `), answer).toBe(true);
    const line = await lineOfRaw(answer);
    expect(line).toMatchObject({ reason, status, endpoint: 'unmatched', address: '127.0.0.1' });
    expect(await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint: 'unmatched', reason })).toBeGreaterThan(
      before,
    );
  });
});

describe('a body that stops coming while the app serves its request', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, env: { REQUEST_TIMEOUT_MS: '300', HEADERS_TIMEOUT_MS: '300' } });
  });
  afterAll(async () => {
    await gw?.stop();
  });

  const requestLines = (id: string) => gw.logs.filter((l) => l.msg === 'request' && l.reqId === id);
  const counts = async (endpoint: string) => ({
    own: await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint, reason: 'client-timeout' }),
    requests: await metricValue(gw, 'oapi_gateway_requests_total', { endpoint, status: '408' }),
    unmatched: await metricValue(gw, 'oapi_gateway_requests_total', { endpoint: 'unmatched', status: '408' }),
  });

  // Regression: the HTTP layer wrote a 408 of its own (a new request id, no usage headers, an
  // "unmatched" line) while the app went on serving the request, which then had a second line
  // (400 credentials, or 499 from the bridge) for an answer the client never got.
  it.each([
    ['a credentials body the gateway reads itself', CREDENTIALS, 'POST /auth/token', 100],
    ['a small body read whole before it is sent', '/orders', 'POST /orders', 100],
    ['a body streamed to the bridge', '/orders', 'POST /orders', 64 * 1024],
  ] as const)(
    '%s: its own 408 with its id and usage headers, one access line, counted once',
    async (_what, path, endpoint, length) => {
      const id = `slow-body-${length}-${path.length}`;
      const before = await counts(endpoint);
      const answer = await rawExchange(
        gw.port,
        `POST ${path} HTTP/1.1\r\nHost: x\r\nX-API-Key: slow-body\r\nX-Request-Id: ${id}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${length}\r\n\r\n{"use`,
        4000,
      );
      expect(answer.startsWith('HTTP/1.1 408 '), answer).toBe(true);
      expect(answer).toContain(`\r\nX-Request-Id: ${id}\r\n`);
      expect(answer).toMatch(/\r\nX-RateLimit-Remaining-Hour: \d+\r\n/);
      expect(answer).toMatch(/\r\nConnection: close\r\n/i);
      expect(answer.slice(answer.indexOf('\r\n\r\n') + 4)).toBe(
        JSON.stringify({ error: 'Request Timeout', message: 'Request took too long to arrive' }),
      );
      for (let i = 0; i < 40 && requestLines(id).length === 0; i++) await new Promise((r) => setTimeout(r, 25));
      // Long enough for a second line to show (the log is written at least every 100 ms).
      await new Promise((r) => setTimeout(r, 300));
      const lines = requestLines(id);
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({ status: 408, reason: 'client-timeout', endpoint, limit: 'allowed' });
      const after = await counts(endpoint);
      expect(after).toEqual({ own: before.own + 1, requests: before.requests + 1, unmatched: before.unmatched });
    },
  );
});

/**
 * Writes `parts` one after the other, `gapMs` apart (so each later part comes in a read of its own,
 * after the request is served), and reads until the server closes or `timeoutMs`.
 */
function rawInParts(port: number, parts: readonly string[], gapMs: number, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let data = '';
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    socket.on('data', (chunk: Buffer) => (data += chunk.toString('latin1')));
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(data);
    });
    parts.forEach((part, i) => setTimeout(() => socket.writable && socket.write(part), i * gapMs));
  });
}

describe('regression: a malformed body of a request the app serves was answered by the HTTP layer', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS });
  });
  afterAll(async () => {
    await gw?.stop();
  });

  const requestLines = (id: string) => gw.logs.filter((l) => l.msg === 'request' && l.reqId === id);
  const counts = async (endpoint: string, status: number, reason: string) => ({
    own: await metricValue(gw, 'oapi_gateway_own_answers_total', { endpoint, reason }),
    requests: await metricValue(gw, 'oapi_gateway_requests_total', { endpoint, status: String(status) }),
    unmatched: await metricValue(gw, 'oapi_gateway_requests_total', { endpoint: 'unmatched', status: String(status) }),
  });

  // The HTTP layer wrote the parser's answer itself (a new request id, no usage headers, an
  // "unmatched" line) while the app went on serving the request, which then had a line of its own
  // (400 credentials, or 499 from the bridge) for an answer the client never got. The request's
  // head and first chunk come in one read; the chunk Node's parser fails on comes in a later one.
  const malformed = [400, 'bad-request', { error: 'Bad Request', message: 'Malformed HTTP request' }] as const;
  it.each([
    ['an invalid chunk size in a credentials body', CREDENTIALS, 'POST /auth/token', 'zz\r\n', malformed],
    ['an invalid chunk size in a body streamed to the bridge', '/orders', 'POST /orders', 'zz\r\n', malformed],
    [
      'a bad chunk extension in a body streamed to the bridge',
      '/orders',
      'POST /orders',
      '4;a\x01\r\nabcd\r\n',
      malformed,
    ],
    [
      'chunk extensions over 16 KiB in a body streamed to the bridge',
      '/orders',
      'POST /orders',
      `4;${'a'.repeat(20_000)}\r\n`,
      [413, 'body-size', { error: 'Content Too Large', message: 'Chunk extensions are too large' }] as const,
    ],
  ] as const)(
    '%s: its own answer with its id and usage headers, one access line, counted once',
    async (what, path, endpoint, broken, [status, reason, body]) => {
      const id = `broken-body-${what.length}-${Date.now()}`;
      const before = await counts(endpoint, status, reason);
      const answer = await rawInParts(
        gw.port,
        [
          `POST ${path} HTTP/1.1\r\nHost: x\r\nX-API-Key: broken-body\r\nX-Request-Id: ${id}\r\n` +
            `Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"use\r\n`,
          broken,
        ],
        200,
      );
      expect(answer.startsWith(`HTTP/1.1 ${status} `), answer).toBe(true);
      expect(answer.match(/HTTP\/1\.1 /g)).toHaveLength(1);
      expect(answer).toContain(`\r\nX-Request-Id: ${id}\r\n`);
      expect(answer).toMatch(/\r\nX-RateLimit-Remaining-Hour: \d+\r\n/);
      expect(answer).toMatch(/\r\nConnection: close\r\n/i);
      expect(answer.slice(answer.indexOf('\r\n\r\n') + 4)).toBe(JSON.stringify(body));
      for (let i = 0; i < 40 && requestLines(id).length === 0; i++) await new Promise((r) => setTimeout(r, 25));
      // Long enough for a second line to show (the log is written at least every 100 ms).
      await new Promise((r) => setTimeout(r, 300));
      const lines = requestLines(id);
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({ status, reason, endpoint, limit: 'allowed' });
      // Answered by the forwarder, which was sending the body on, or by the credentials reader.
      expect(lines[0]?.bridge).toBe(path === '/orders' ? 'eqt' : undefined);
      const after = await counts(endpoint, status, reason);
      expect(after).toEqual({ own: before.own + 1, requests: before.requests + 1, unmatched: before.unmatched });
    },
  );
});

describe('answers about the parts behind the gateway', () => {
  let redis: RedisProcess;
  let closed: TestGateway;
  let unreachable: TestGateway;
  let slow: TestGateway;
  let silentBridge: http.Server;
  beforeAll(async () => {
    redis = await startRedisServer();
    closed = await startTestGateway({
      limits: LIMITS,
      redis: redis.url,
      env: { REDIS_FAILURE_MODE: 'closed', REDIS_TIMEOUT_MS: '200' },
    });
    unreachable = await startTestGateway({
      limits: LIMITS,
      env: { EQT_BRIDGE_URL: `http://127.0.0.1:${await refusingPort()}` },
    });
    silentBridge = http.createServer(() => {
      // Takes the request and never answers.
    });
    await new Promise<void>((r) => silentBridge.listen(0, '127.0.0.1', r));
    slow = await startTestGateway({
      limits: LIMITS,
      env: {
        EQT_BRIDGE_URL: `http://127.0.0.1:${(silentBridge.address() as AddressInfo).port}`,
        UPSTREAM_TIMEOUT_MS: '300',
      },
    });
  });
  afterAll(async () => {
    // Also after a failed set-up: nothing of it may outlive the run.
    await Promise.all([closed?.stop(), unreachable?.stop(), slow?.stop()]);
    silentBridge?.closeAllConnections();
    silentBridge?.close();
    await redis?.stop();
  });

  it('redis-unavailable: Redis is down and REDIS_FAILURE_MODE=closed', async () => {
    await redis.kill();
    const reply = await send(closed.url, { path: '/orders/1', headers: key('r-redis') });
    expect(reply.status).toBe(503);
    expect(await settledLineOf(closed, reply)).toMatchObject({ reason: 'redis-unavailable', status: 503 });
  });

  it('bridge-unreachable (502) and bridge-timeout (504)', async () => {
    const refused = await send(unreachable.url, { path: '/orders/1', headers: key('r-502') });
    expect(refused.status).toBe(502);
    expect(await settledLineOf(unreachable, refused)).toMatchObject({ reason: 'bridge-unreachable', bridge: 'eqt' });
    const late = await send(slow.url, { path: '/orders/1', headers: key('r-504') });
    expect(late.status).toBe(504);
    expect(await settledLineOf(slow, late)).toMatchObject({ reason: 'bridge-timeout', bridge: 'eqt' });
  });
});

describe('regression: a 408 logged for a request whose connection the HTTP layer had already closed', () => {
  let redis: RedisProcess;
  let proxy: RedisProxy;
  let gw: TestGateway;
  beforeAll(async () => {
    redis = await startRedisServer();
    proxy = await startRedisProxy(redis.port);
    gw = await startTestGateway({
      limits: `
timezone: UTC
limits:
  - { name: Order Create, route: "POST /orders", per_hour: 1000, per_day: 1000 }
`,
      redis: proxy.url,
      env: { REQUEST_TIMEOUT_MS: '300', HEADERS_TIMEOUT_MS: '300', REDIS_TIMEOUT_MS: '5000' },
    });
  });
  afterAll(async () => {
    await gw?.stop();
    await proxy?.close();
    await redis?.stop();
  });

  it('logs a 499 without a reason when its counting outlasted the 2 s the connection is given after the timeout', async () => {
    // The body stops coming while the request waits on a slow Redis; the HTTP layer marks it at
    // 300 ms and closes the connection 2 s later, before the counting answers at 2.8 s.
    proxy.delayRepliesMs = 2800;
    const id = `gone-${Date.now()}`;
    const received = await new Promise<string>((resolve) => {
      const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true });
      let data = '';
      socket.on('data', (chunk: Buffer) => (data += chunk.toString('latin1')));
      socket.on('error', () => {});
      socket.on('close', () => resolve(data));
      socket.write(
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: slow-${id}\r\nX-Request-Id: ${id}\r\nContent-Length: 100\r\n\r\n{"u`,
      );
      setTimeout(() => socket.destroy(), 6000);
    });
    proxy.delayRepliesMs = 0;
    expect(received).toBe('');
    let line: Record<string, unknown> | undefined;
    for (let i = 0; i < 40 && !line; i++) {
      await new Promise((r) => setTimeout(r, 100));
      line = gw.logs.find((l) => l.msg === 'request' && l.reqId === id);
    }
    expect(line).toMatchObject({ status: 499 });
    expect(line?.reason).toBeUndefined();
    expect(gw.logs.filter((l) => l.msg === 'request' && l.reqId === id)).toHaveLength(1);
  }, 15_000);
});

describe('regression: a malformed body of a request waiting on Redis was answered by the HTTP layer', () => {
  let proxy: RedisProxy;
  let gw: TestGateway;
  beforeAll(async () => {
    // Only this test's connections pass the proxy: slowing them slows no one else on the shared Redis.
    proxy = await startRedisProxy(Number(new URL(REDIS_URL).port || 6379));
    gw = await startTestGateway({ limits: LIMITS, redis: proxy.url, env: { REDIS_TIMEOUT_MS: '5000' } });
  });
  afterAll(async () => {
    await gw?.stop();
    await proxy?.close();
  });

  const requestLines = (id: string) => gw.logs.filter((l) => l.msg === 'request' && l.reqId === id);
  /** A streamed body whose second chunk Node's parser fails on, 150 ms after the head, while the counting waits. */
  const brokenWhileCounting = (id: string, delayMs: number, target = 'POST /orders'): Promise<string> => {
    proxy.delayRepliesMs = delayMs;
    return rawInParts(
      gw.port,
      [
        `${target} HTTP/1.1\r\nHost: x\r\nX-API-Key: counting-${id}\r\nX-Request-Id: ${id}\r\n` +
          `Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`,
        'zz\r\n',
      ],
      150,
      6000,
    ).finally(() => (proxy.delayRepliesMs = 0));
  };
  const settledLines = async (id: string) => {
    for (let i = 0; i < 40 && requestLines(id).length === 0; i++) await new Promise((r) => setTimeout(r, 100));
    await new Promise((r) => setTimeout(r, 300));
    return requestLines(id);
  };

  it("the body step answers it in the request's name once the counting is done", async () => {
    const id = `counting-${Date.now()}`;
    const answer = await brokenWhileCounting(id, 600);
    expect(answer.startsWith('HTTP/1.1 400 '), answer).toBe(true);
    expect(answer.match(/HTTP\/1\.1 /g)).toHaveLength(1);
    expect(answer).toContain(`\r\nX-Request-Id: ${id}\r\n`);
    expect(answer).toMatch(/\r\nX-RateLimit-Remaining-Hour: \d+\r\n/);
    expect(answer.slice(answer.indexOf('\r\n\r\n') + 4)).toBe(
      JSON.stringify({ error: 'Bad Request', message: 'Malformed HTTP request' }),
    );
    const lines = await settledLines(id);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ status: 400, reason: 'bad-request', endpoint: 'POST /orders', limit: 'allowed' });
    expect(lines[0]?.bridge).toBeUndefined();
  });

  it('logs a 499 without a reason when the counting outlasted the 2 s the connection is given after the failure', async () => {
    const id = `gone-broken-${Date.now()}`;
    expect(await brokenWhileCounting(id, 2800)).toBe('');
    const lines = await settledLines(id);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ status: 499, endpoint: 'POST /orders' });
    expect(lines[0]?.reason).toBeUndefined();
  }, 15_000);

  // An answer the app wrote before its body step (a refusal for the limit, once the counting came
  // back) said keep-alive on a connection whose parser had failed: Node read nothing more from it,
  // a next request on it was never answered, and it stayed open until the keep-alive timeout.
  it('regression: a 429 to it (its counting refused it meanwhile) kept the connection open', async () => {
    const id = `refused-${Date.now()}`;
    // GET /orders allows one request an hour and a day: the first takes it.
    expect((await send(gw.url, { path: '/orders', headers: key(`counting-${id}`) })).status).toBe(200);
    const t0 = performance.now();
    const answer = await brokenWhileCounting(id, 600, 'GET /orders');
    expect(answer.startsWith('HTTP/1.1 429 '), answer).toBe(true);
    expect(answer).toContain(`\r\nX-Request-Id: ${id}\r\n`);
    expect(answer).toMatch(/\r\nConnection: close\r\n/i);
    // Closed once answered, lingering (LINGER_MS, 2 s, at most), not at the keep-alive timeout.
    expect(performance.now() - t0).toBeLessThan(3000);
    const lines = await settledLines(id);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ status: 429, reason: 'day-spent', endpoint: 'GET /orders' });
  });
});
