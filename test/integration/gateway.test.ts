import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loginFailedBody, DEMO_PASSWORD, DEMO_USERNAME } from '../../src/sandbox/bodies.js';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { expectTwoFields, rawExchange, send } from '../helpers/http.js';

/** The gateway core over real sockets: README "A request, step by step" and "Headers and answers". */

const LIMITS = `
timezone: UTC
limits:
  - name: Authentication
    route: POST /auth/token
    also:
      - POST /oapi/auth/gen-secret-key/underlying
      - POST /oapi/auth/gen-secret-key/derivative
    per_hour: 6
    per_day: 8
  - name: Order Status
    route: GET /orders/{id}
    per_hour: 1000
    per_day: 2000
  - name: Order List
    route: GET /orders
    per_hour: 3
    per_day: 5
  - name: Place Order
    route: POST /orders
    per_hour: 100
    per_day: 100
  - name: Account Balance
    route: GET /accounts/{id}/balance
    per_hour: 100
    per_day: 100
  - name: WebSocket, Orders
    route: WS /ws/orders
    per_hour: 5
    per_day: 10
`;

let gw: TestGateway;
let keyN = 0;
const newKey = (): string => `key-${Date.now()}-${++keyN}`;

const get = (path: string, key?: string, headers: Record<string, string> = {}) =>
  send(gw.url, { path, headers: key ? { 'X-API-Key': key, ...headers } : headers });

async function usageOf(
  key: string,
  route: string,
): Promise<{ hour: { used: number; remaining: number }; day: { used: number; remaining: number } }> {
  const reply = await send(gw.adminUrl, { path: `/admin/usage/${encodeURIComponent(key)}`, headers: authHeader() });
  expect(reply.status).toBe(200);
  const entry = reply
    .json<{ endpoints: Array<{ route: string; hour: never; day: never }> }>()
    .endpoints.find((e) => e.route === route);
  if (!entry) throw new Error(`no usage entry for ${route}`);
  return entry;
}

beforeAll(async () => {
  gw = await startTestGateway({ limits: LIMITS, env: { MAX_BODY_BYTES: '2048' } });
});
afterAll(async () => {
  await gw.stop();
});

describe('step 1: the API key', () => {
  it('answers 401 without a key, before anything else, and counts nothing', async () => {
    const before = gw.eqt.requests.length;
    for (const path of ['/orders/1', '/no/such/path']) {
      const reply = await get(path);
      expect(reply.status).toBe(401);
      expect(expectTwoFields(reply)).toEqual({ error: 'Unauthorized', message: 'Missing API key' });
      expect(reply.headers['x-ratelimit-limit-hour']).toBeUndefined();
      expect(reply.headers['x-request-id']).toBeTruthy();
    }
    expect((await get('/orders/1', '')).status).toBe(401);
    expect(gw.eqt.requests.length).toBe(before);
  });

  it('refuses an absurdly long key', async () => {
    const reply = await get('/orders/1', 'k'.repeat(300));
    expect(reply.status).toBe(401);
    expect(expectTwoFields(reply).message).toBe('Invalid API key');
  });
});

describe('step 2: the endpoint', () => {
  it('answers 404 for a path of no row, 405 with Allow for a method of no row, and forwards neither', async () => {
    const key = newKey();
    const before = gw.eqt.requests.length;
    const missing = await get('/orders/1/items', key);
    expect(missing.status).toBe(404);
    expect(expectTwoFields(missing)).toEqual({ error: 'Not Found', message: 'No such endpoint' });
    const wrong = await send(gw.url, { method: 'DELETE', path: '/orders', headers: { 'X-API-Key': key } });
    expect(wrong.status).toBe(405);
    expect(wrong.headers.allow).toBe('GET, POST');
    expect(expectTwoFields(wrong).error).toBe('Method Not Allowed');
    expect(gw.eqt.requests.length).toBe(before);
    expect((await usageOf(key, 'GET /orders')).hour.used).toBe(0);
  });

  it('answers 426 to a plain request on a WebSocket route', async () => {
    const reply = await get('/ws/orders', newKey());
    expect(reply.status).toBe(426);
    expect(reply.headers.upgrade).toBe('websocket');
  });

  it('refuses paths that servers read differently, with 400', async () => {
    // A ";" begins path parameters, which servlet containers cut off: /orders/; would reach them as /orders/.
    for (const path of ['/orders/%2F1', '/orders/%zz', '/orders%5C1', '/orders/;', '/orders;x=1']) {
      const reply = await get(path, newKey());
      expect(reply.status).toBe(400);
      expectTwoFields(reply);
    }
  });

  it('counts every spelling of a path against the row it matches, and forwards the normalised path', async () => {
    const key = newKey();
    const spellings = [
      '/orders/1',
      '/orders//1',
      '/orders/1/',
      '/orders/./1',
      '/orders/x/../1',
      '/%6Frders/1',
      '/orders/%31',
      '//orders///1//',
      '/../orders/1',
    ];
    const start = gw.eqt.requests.length;
    for (const path of spellings) {
      const reply = await get(path + '?q=%2F..', key);
      expect(reply.status).toBe(200);
    }
    const received = gw.eqt.requests.slice(start).map((r) => r.url);
    expect(received).toEqual(spellings.map(() => '/orders/1?q=%2F..'));
    expect(await usageOf(key, 'GET /orders/{id}')).toMatchObject({
      hour: { used: spellings.length },
      day: { used: spellings.length },
    });
  });
});

describe('step 3: the hour and day windows', () => {
  it('admits up to the hour limit with exact headers, then answers the exact 429', async () => {
    const key = newKey();
    for (let i = 1; i <= 3; i++) {
      const reply = await get('/orders', key);
      expect(reply.status).toBe(200);
      expect(reply.headers['x-ratelimit-limit-hour']).toBe('3');
      expect(reply.headers['x-ratelimit-remaining-hour']).toBe(String(3 - i));
      expect(reply.headers['x-ratelimit-limit-day']).toBe('5');
      expect(reply.headers['x-ratelimit-remaining-day']).toBe(String(5 - i));
      expect(reply.headers['ratelimit-policy']).toBe('"hour";q=3;w=3600, "day";q=5;w=86400');
      const now = Date.now();
      const hourT = Math.ceil((Math.ceil(now / 3_600_000) * 3_600_000 - now) / 1000);
      const dayT = Math.ceil((Math.ceil(now / 86_400_000) * 86_400_000 - now) / 1000);
      const m = /^"hour";r=(\d+);t=(\d+), "day";r=(\d+);t=(\d+)$/.exec(reply.headers.ratelimit as string);
      expect(m).not.toBeNull();
      expect(Number(m![1])).toBe(3 - i);
      expect(Math.abs(Number(m![2]) - hourT)).toBeLessThanOrEqual(2);
      expect(Number(m![3])).toBe(5 - i);
      expect(Math.abs(Number(m![4]) - dayT)).toBeLessThanOrEqual(2);
    }
    const before = gw.eqt.requests.length;
    const refused = await get('/orders', key);
    expect(refused.status).toBe(429);
    expect(refused.statusText).toBe('Too Many Requests');
    expect(refused.headers['content-type']).toBe('application/json');
    expect(refused.text).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    const retryAfter = Number(refused.headers['retry-after']);
    const now = Date.now();
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(Math.abs(retryAfter - Math.ceil((Math.ceil(now / 3_600_000) * 3_600_000 - now) / 1000))).toBeLessThanOrEqual(
      2,
    );
    expect(refused.headers['x-ratelimit-remaining-hour']).toBe('0');
    expect(refused.headers['x-ratelimit-remaining-day']).toBe('2');
    expect(refused.headers['x-request-id']).toBeTruthy();
    expect(gw.eqt.requests.length).toBe(before);
  });

  it('uses nothing for refused requests: hammering past the hour leaves the day untouched', async () => {
    const key = newKey();
    for (let i = 0; i < 3; i++) await get('/orders', key);
    for (let i = 0; i < 25; i++) expect((await get('/orders', key)).status).toBe(429);
    expect(await usageOf(key, 'GET /orders')).toMatchObject({
      hour: { used: 3, remaining: 0 },
      day: { used: 3, remaining: 2 },
    });
  });

  it('keeps keys apart and rows apart', async () => {
    const a = newKey();
    const b = newKey();
    for (let i = 0; i < 3; i++) await get('/orders', a);
    expect((await get('/orders', a)).status).toBe(429);
    expect((await get('/orders', b)).status).toBe(200);
    expect((await get('/orders/9', a)).status).toBe(200);
  });

  it('counts the token operations on the POST /auth/token row', async () => {
    const key = newKey();
    const body = JSON.stringify({ username: DEMO_USERNAME, password: DEMO_PASSWORD });
    const headers = { 'X-API-Key': key, 'Content-Type': 'application/json' };
    await send(gw.url, { method: 'POST', path: '/oapi/auth/gen-secret-key/underlying', headers, body });
    await send(gw.url, { method: 'POST', path: '/oapi/auth/gen-secret-key/derivative', headers, body });
    await send(gw.url, { method: 'POST', path: '/auth/token', headers, body });
    expect((await usageOf(key, 'POST /auth/token')).hour.used).toBe(3);
  });
});

describe('step 4: the body', () => {
  const token = '/oapi/auth/gen-secret-key/underlying';

  it('refuses a body over MAX_BODY_BYTES with 413, counted and with usage headers', async () => {
    const key = newKey();
    const reply = await send(gw.url, {
      method: 'POST',
      path: '/orders',
      headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
      body: 'x'.repeat(3000),
      agent: false,
    });
    expect(reply.status).toBe(413);
    // RFC 9110's phrase, on the status line too (regression: Node's "Payload Too Large").
    expect(reply.statusText).toBe('Content Too Large');
    expect(expectTwoFields(reply).error).toBe('Content Too Large');
    expect(reply.headers['x-ratelimit-remaining-hour']).toBe('99');
    expect((await usageOf(key, 'POST /orders')).hour.used).toBe(1);
  });

  it('refuses a chunked body that passes MAX_BODY_BYTES, cutting it off', async () => {
    const key = newKey();
    const reply = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = http.request(
        {
          host: '127.0.0.1',
          port: gw.port,
          method: 'POST',
          path: '/orders',
          headers: { 'X-API-Key': key, 'Transfer-Encoding': 'chunked' },
        },
        (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on('error', reject);
      let sent = 0;
      const pump = (): void => {
        while (sent < 64 * 1024) {
          sent += 1024;
          if (!req.write('y'.repeat(1024))) return void req.once('drain', pump);
        }
        req.end();
      };
      pump();
    }).catch((err: Error) => ({ status: -1, body: err.message }));
    expect(reply.status).toBe(413);
    expect(reply.body).toBe('{"error":"Content Too Large","message":"Request body is larger than 2048 bytes"}');
  });

  it('requires application/json on the token routes (415), counted', async () => {
    const key = newKey();
    const reply = await send(gw.url, {
      method: 'POST',
      path: token,
      headers: { 'X-API-Key': key, 'Content-Type': 'text/plain' },
      body: '{"username":"a","password":"b"}',
    });
    expect(reply.status).toBe(415);
    expect(expectTwoFields(reply)).toEqual({
      error: 'Unsupported Media Type',
      message: 'Content-Type must be application/json',
    });
    expect(reply.headers['x-ratelimit-remaining-hour']).toBe('5');
  });

  it('requires non-empty string username and password (400), counted, and forwards nothing', async () => {
    const key = newKey();
    const before = gw.eqt.requests.length;
    for (const body of ['{"username":"demo"}', 'not json', '{"username":"demo","password":""}', '['.repeat(50)]) {
      const reply = await send(gw.url, {
        method: 'POST',
        path: token,
        headers: { 'X-API-Key': key, 'Content-Type': 'application/json; charset=utf-8' },
        body,
      });
      expect(reply.status).toBe(400);
      expect(expectTwoFields(reply).error).toBe('Bad Request');
      expect(reply.headers['x-ratelimit-limit-hour']).toBe('6');
    }
    expect(gw.eqt.requests.length).toBe(before);
    expect((await usageOf(key, 'POST /auth/token')).hour.used).toBe(4);
  });
});

describe('step 5: forwarding', () => {
  it('sends the derivative token operation to fno and the underlying one to eqt, body byte for byte', async () => {
    const key = newKey();
    const body = Buffer.from(`{ "password": "${DEMO_PASSWORD}",\n  "username": "${DEMO_USERNAME}", "note": "Nguyễn" }`);
    const headers = { 'X-API-Key': key, 'Content-Type': 'application/json' };
    const eqtBefore = gw.eqt.requests.length;
    const fnoBefore = gw.fno.requests.length;
    const under = await send(gw.url, { method: 'POST', path: '/oapi/auth/gen-secret-key/underlying', headers, body });
    const deriv = await send(gw.url, { method: 'POST', path: '/oapi/auth/gen-secret-key/derivative', headers, body });
    expect(under.status).toBe(200);
    expect(deriv.status).toBe(200);
    expect(Object.keys(deriv.json<object>()).sort()).toEqual([
      'access_token',
      'expires_in',
      'otp_token',
      'refresh_token',
      'token_type',
    ]);
    expect(gw.eqt.requests.length).toBe(eqtBefore + 1);
    expect(gw.fno.requests.length).toBe(fnoBefore + 1);
    expect(gw.eqt.requests.at(-1)?.body.equals(body)).toBe(true);
    expect(gw.fno.requests.at(-1)?.body.equals(body)).toBe(true);
    expect(gw.fno.requests.at(-1)?.headers['content-length']).toBe(String(body.length));
  });

  it('sends a body that arrives in pieces to the bridge whole and byte for byte (read whole up to GATHERED_BODY_BYTES)', async () => {
    // MAX_BODY_BYTES is 2048 here, so 2048 bytes are the most this gateway reads whole.
    const body = Buffer.from(Array.from({ length: 2048 }, (_, i) => (i * 131 + 7) % 256));
    const before = gw.eqt.requests.length;
    const reply = await new Promise<number>((resolve, reject) => {
      const request = http.request(
        `${gw.url}/orders`,
        { method: 'POST', agent: false, headers: { 'X-API-Key': newKey(), 'Content-Length': String(body.length) } },
        (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        },
      );
      request.on('error', reject);
      request.flushHeaders();
      // Three writes, apart: the gateway gets the body in more than one read.
      const parts = [body.subarray(0, 1), body.subarray(1, 1000), body.subarray(1000)];
      const next = (i: number): void => {
        if (i === parts.length) request.end();
        else request.write(parts[i], () => setTimeout(() => next(i + 1), 30));
      };
      next(0);
    });
    expect(reply).toBe(200);
    expect(gw.eqt.requests.length).toBe(before + 1);
    const received = gw.eqt.requests.at(-1);
    expect(received?.body.equals(body)).toBe(true);
    expect(received?.headers['content-length']).toBe('2048');
  });

  it('passes the bridge error body back byte for byte, Vietnamese text included', async () => {
    const reply = await send(gw.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/derivative',
      headers: { 'X-API-Key': newKey(), 'Content-Type': 'application/json' },
      body: JSON.stringify({ username: DEMO_USERNAME, password: 'wrong' }),
    });
    expect(reply.status).toBe(500);
    expect(reply.body.equals(Buffer.from(loginFailedBody('fno'), 'utf8'))).toBe(true);
    expect(reply.json<{ messageParams: { error_description: string } }>().messageParams.error_description).toBe(
      '-107: Tên đăng nhập hoặc mật khẩu không đúng',
    );
    expect(reply.headers['content-type']).toBe('application/json; charset=utf-8');
    expect(reply.headers['x-ratelimit-limit-hour']).toBe('6');
  });

  it('drops hop-by-hop headers, passes the bridge credentials untouched, and adds X-Forwarded-* and X-Request-Id', async () => {
    const reply = await send(gw.url, {
      path: '/orders/77?x=1',
      headers: {
        'X-API-Key': newKey(),
        Connection: 'keep-alive, X-Hop',
        'X-Hop': 'drop me',
        'Keep-Alive': 'timeout=5',
        TE: 'trailers',
        'Proxy-Authorization': 'Basic eDp5',
        Authorization: 'Bearer access-token-123',
        'x-otp-token': 'otp-456',
        'X-Forwarded-For': '203.0.113.9',
        'X-Request-Id': 'client-req-42',
        'X-Custom': 'kept',
      },
    });
    expect(reply.status).toBe(200);
    expect(reply.headers['x-request-id']).toBe('client-req-42');
    const seen = gw.eqt.requests.at(-1)!;
    expect(seen.url).toBe('/orders/77?x=1');
    expect(seen.headers['x-hop']).toBeUndefined();
    expect(seen.headers.te).toBeUndefined();
    expect(seen.headers['proxy-authorization']).toBeUndefined();
    expect(seen.headers['keep-alive']).toBeUndefined();
    expect(seen.headers.authorization).toBe('Bearer access-token-123');
    expect(seen.headers['x-otp-token']).toBe('otp-456');
    expect(seen.headers['x-custom']).toBe('kept');
    expect(seen.headers['x-forwarded-for']).toBe('203.0.113.9, 127.0.0.1');
    expect(seen.headers['x-forwarded-proto']).toBe('http');
    expect(seen.headers['x-forwarded-host']).toBe(`127.0.0.1:${gw.port}`);
    expect(seen.headers['x-request-id']).toBe('client-req-42');
  });

  it("gives the bridge an absolute-form target's authority as X-Forwarded-Host, not Host (regression: RFC 9112 §3.2.2 says Host is ignored then)", async () => {
    const head = await rawExchange(
      gw.port,
      `GET http://api.example:8443/orders/78?x=1 HTTP/1.1\r\nHost: 127.0.0.1:${gw.port}\r\n` +
        `X-API-Key: ${newKey()}\r\nForwarded: for=203.0.113.51\r\nConnection: close\r\n\r\n`,
    );
    expect(head).toMatch(/^HTTP\/1\.1 200 /);
    const seen = gw.eqt.requests.at(-1)!;
    expect(seen.url).toBe('/orders/78?x=1');
    expect(seen.headers['x-forwarded-host']).toBe('api.example:8443');
    expect(seen.headers.forwarded).toBe('for=203.0.113.51, for=127.0.0.1;proto=http;host="api.example:8443"');
  });

  it('gives the bridge the address it found in X-Real-IP, and appends its own element to Forwarded (regression: a client wrote both)', async () => {
    const reply = await send(gw.url, {
      path: '/orders/79',
      headers: { 'X-API-Key': newKey(), 'X-Real-IP': '203.0.113.50', Forwarded: 'for=203.0.113.51' },
    });
    expect(reply.status).toBe(200);
    const seen = gw.eqt.requests.at(-1)!;
    expect(seen.headers['x-real-ip']).toBe('127.0.0.1');
    expect(seen.headers.forwarded).toBe(`for=203.0.113.51, for=127.0.0.1;proto=http;host="127.0.0.1:${gw.port}"`);
  });

  it('forwards exactly the counted path, also when a segment ends in "http:" (regression: the proxy library rewrote it)', async () => {
    for (const path of ['/accounts/http:/balance', '/accounts/https:/balance']) {
      const reply = await get(path, newKey());
      expect(reply.status).toBe(200);
      expect(gw.eqt.requests.at(-1)?.url).toBe(path);
    }
  });

  it('replaces an insane X-Request-Id with a fresh one', async () => {
    const reply = await get('/orders/78', newKey(), { 'X-Request-Id': 'bad id with spaces\u00e9' });
    expect(reply.headers['x-request-id']).toMatch(
      /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );
    expect(gw.eqt.requests.at(-1)?.headers['x-request-id']).toBe(reply.headers['x-request-id']);
  });

  it('keeps the bridge headers, repeated ones included, in one answer', async () => {
    const reply = await get('/orders/79', newKey());
    expect(reply.rawHeaders.filter((h, i) => i % 2 === 0 && h.toLowerCase() === 'x-ratelimit-limit-hour')).toHaveLength(
      1,
    );
    expect(reply.headers['content-type']).toBe('application/json');
    expect(reply.json()).toEqual({ bridge: 'eqt', method: 'GET', path: '/orders/79', query: '' });
  });
});

describe('client errors the HTTP server answers itself', () => {
  it('refuses Content-Length together with Transfer-Encoding and never forwards it', async () => {
    const before = gw.eqt.requests.length;
    const raw = await rawExchange(
      gw.port,
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
    );
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(raw).toContain('{"error":"Bad Request"');
    expect(gw.eqt.requests.length).toBe(before);
  });

  it('answers oversized headers with 431 in the two-field shape', async () => {
    const raw = await rawExchange(gw.port, `GET /orders HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`);
    expect(raw).toMatch(/^HTTP\/1\.1 431 /);
    expect(raw).toContain('{"error":"Request Header Fields Too Large","message":"Request headers are too large"}');
  });

  it('answers garbage with a two-field 400 and keeps serving', async () => {
    const raw = await rawExchange(gw.port, '\x00\x01GARBAGE\r\n\r\n');
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(raw.split('\r\n\r\n')[1]).toBe('{"error":"Bad Request","message":"Malformed HTTP request"}');
    expect((await get('/orders/80', newKey())).status).toBe(200);
  });
});

describe('the access log', () => {
  it('writes one JSON line per request with the decision, and no key', async () => {
    const key = newKey();
    const reply = await get('/orders/81', key);
    await new Promise((r) => setTimeout(r, 20));
    const line = gw.logs.find((l) => l.reqId === reply.headers['x-request-id']);
    expect(line).toMatchObject({
      msg: 'request',
      method: 'GET',
      endpoint: 'GET /orders/{id}',
      path: '/orders/81',
      status: 200,
      bridge: 'eqt',
      limit: 'allowed',
    });
    expect(typeof line?.ms).toBe('number');
    expect(typeof line?.upstreamMs).toBe('number');
    expect(line?.key).toMatch(/^[0-9a-f]{12}$/);
    expect(gw.logText()).not.toContain(key);
  });
});
