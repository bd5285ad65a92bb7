import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { USAGE_HEADER_KEYS, rawExchange, send, type Reply } from '../helpers/http.js';

/**
 * CORS for browser clients (README "CORS"): off unless CORS_ORIGINS lists origins; a preflight is
 * answered by the gateway, never counted, forwarded or taken for a guess; answers to a listed origin
 * let the page read the usage headers, Retry-After and X-Request-Id; other origins get no CORS fields.
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 2, per_day: 100 }
`;
const APP = 'https://app.example.com';
const LOCAL = 'http://localhost:3000';
const OTHER = 'https://evil.example.net';

const corsFields = (reply: Reply): string[] =>
  Object.keys(reply.headers).filter((name) => name.startsWith('access-control-'));
const listOf = (value: string | string[] | undefined): string[] =>
  String(value ?? '')
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter(Boolean);
const preflight = (gw: TestGateway, origin: string, requestHeaders = 'x-api-key') =>
  send(gw.url, {
    method: 'OPTIONS',
    path: '/orders/1',
    headers: {
      Origin: origin,
      'Access-Control-Request-Method': 'GET',
      'Access-Control-Request-Headers': requestHeaders,
    },
  });

describe('CORS_ORIGINS set', () => {
  let gw: TestGateway;
  /** A bridge that writes CORS fields of its own. */
  let bridge: http.Server;
  beforeAll(async () => {
    bridge = http.createServer((req, res) => {
      req.resume();
      res.writeHead(200, { 'Content-Type': 'application/json', 'Access-Control-Allow-Origin': '*', Vary: 'Accept' });
      res.end('{"ok":true}');
    });
    await new Promise<void>((r) => bridge.listen(0, '127.0.0.1', r));
    gw = await startTestGateway({
      limits: LIMITS,
      env: {
        CORS_ORIGINS: `${APP},${LOCAL}`,
        INVALID_KEY_MAX_ATTEMPTS: '3',
        EQT_BRIDGE_URL: `http://127.0.0.1:${(bridge.address() as AddressInfo).port}`,
      },
    });
  });
  afterAll(async () => {
    await gw.stop();
    bridge.closeAllConnections();
    bridge.close();
  });

  it('answers a listed origin its preflight: 204, the allowed headers, never counted, forwarded or taken for a guess', async () => {
    let bridged = 0;
    bridge.on('request', () => bridged++);
    // More preflights than the invalid-key guard allows attempts: none of them has or needs a key.
    for (let i = 0; i < 5; i++) {
      const reply = await preflight(gw, i % 2 ? LOCAL : APP);
      expect(reply.status).toBe(204);
      expect(reply.headers['access-control-allow-origin']).toBe(i % 2 ? LOCAL : APP);
      expect(listOf(reply.headers['access-control-allow-headers'])).toEqual([
        'x-api-key',
        'authorization',
        'content-type',
        'x-otp-token',
        'x-request-id',
      ]);
      expect(listOf(reply.headers['access-control-allow-methods'])).toContain('get');
      expect(reply.headers['x-ratelimit-remaining-hour']).toBeUndefined();
      expect(reply.body.length).toBe(0);
    }
    expect(bridged).toBe(0);
    // The key's two requests of the hour are all still there.
    const first = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': 'cors-key', Origin: APP } });
    expect(first.status).toBe(200);
    expect(first.headers['x-ratelimit-remaining-hour']).toBe('1');
    expect(bridged).toBe(1);
  });

  it('logs each preflight with the client address and reason preflight, listed origin or not (regression: neither was in the line)', async () => {
    for (const origin of [APP, OTHER]) {
      const reply = await preflight(gw, origin);
      const id = String(reply.headers['x-request-id']);
      await new Promise((r) => setTimeout(r, 150)); // the access line is written in batches
      const line = gw.logs.find((l) => l.msg === 'request' && l.reqId === id);
      expect(line).toMatchObject({ method: 'OPTIONS', status: 204, reason: 'preflight', address: '127.0.0.1' });
    }
  });

  it('gives another origin no CORS fields, on its preflight (204, not forwarded) and on its answers', async () => {
    const reply = await preflight(gw, OTHER);
    expect(reply.status).toBe(204);
    expect(corsFields(reply)).toEqual([]);
    const answer = await send(gw.url, { path: '/orders/2', headers: { 'X-API-Key': 'cors-other', Origin: OTHER } });
    expect(answer.status).toBe(200);
    expect(corsFields(answer)).toEqual([]);
    expect(listOf(answer.headers.vary)).toContain('origin');
  });

  it("lets a listed origin read the bridge's answer and its usage headers, in the gateway's CORS fields alone", async () => {
    const reply = await send(gw.url, { path: '/orders/3', headers: { 'X-API-Key': 'cors-read', Origin: APP } });
    expect(reply.status).toBe(200);
    expect(reply.text).toBe('{"ok":true}');
    const origins = reply.rawHeaders.filter(
      (_, i) => i % 2 === 0 && reply.rawHeaders[i]?.toLowerCase() === 'access-control-allow-origin',
    );
    expect(origins).toHaveLength(1);
    expect(reply.headers['access-control-allow-origin']).toBe(APP);
    expect(listOf(reply.headers['access-control-expose-headers'])).toEqual([
      ...USAGE_HEADER_KEYS,
      'retry-after',
      'x-request-id',
    ]);
    expect(listOf(reply.headers.vary)).toEqual(['accept', 'origin']);
  });

  it("lets a listed origin read the gateway's own refusals", async () => {
    const headers = { 'X-API-Key': 'cors-spent', Origin: LOCAL };
    for (let i = 0; i < 2; i++) expect((await send(gw.url, { path: '/orders/4', headers })).status).toBe(200);
    const refused = await send(gw.url, { path: '/orders/4', headers });
    expect(refused.status).toBe(429);
    expect(refused.headers['access-control-allow-origin']).toBe(LOCAL);
    expect(refused.headers['retry-after']).toBeDefined();
    const missing = await send(gw.url, { path: '/orders/4', headers: { Origin: LOCAL } });
    expect(missing.status).toBe(401);
    expect(missing.headers['access-control-allow-origin']).toBe(LOCAL);
  });
});

/** A raw answer's status and fields (lower-case names, every value of a repeated one). */
function parseRaw(answer: string): { status: number; fields: Map<string, string[]> } {
  const [head = ''] = answer.split('\r\n\r\n');
  const [statusLine = '', ...lines] = head.split('\r\n');
  const fields = new Map<string, string[]>();
  for (const line of lines) {
    const at = line.indexOf(':');
    const name = line.slice(0, at).trim().toLowerCase();
    fields.set(name, [...(fields.get(name) ?? []), line.slice(at + 1).trim()]);
  }
  return { status: Number(statusLine.split(' ')[1]), fields };
}

describe('CORS_ORIGINS set: the answers of the HTTP layer and the request gate', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, env: { CORS_ORIGINS: `${APP},${LOCAL}` } });
  });
  afterAll(async () => {
    await gw?.stop();
  });

  const corsOf = (fields: Map<string, string[]>): string[] =>
    [...fields.keys()].filter((name) => name.startsWith('access-control-'));

  // Regression: they carried Connection and X-Request-Id alone, which a browser reads as a CORS failure.
  it.each([
    ['431, too many header lines', `GET /orders/1 HTTP/1.1\r\nHost: x\r\n${'X-A: b\r\n'.repeat(100)}`, 431],
    ['417, an Expect other than 100-continue', 'GET /orders/1 HTTP/1.1\r\nHost: x\r\nExpect: tea\r\n', 417],
    ['400, an upgrade to h2c', 'GET /orders/1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n', 400],
    ['501, CONNECT', 'CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n', 501],
  ] as const)('%s: a listed origin may read it, another gets Vary: Origin alone', async (_what, head, status) => {
    const listed = parseRaw(await rawExchange(gw.port, `${head}Origin: ${APP}\r\n\r\n`, 3000));
    expect(listed.status).toBe(status);
    expect(listed.fields.get('access-control-allow-origin')).toEqual([APP]);
    expect(listOf(listed.fields.get('access-control-expose-headers'))).toEqual([
      ...USAGE_HEADER_KEYS,
      'retry-after',
      'x-request-id',
    ]);
    expect(listed.fields.get('vary')).toEqual(['Origin']);
    expect(listed.fields.get('x-request-id')).toHaveLength(1);

    const other = parseRaw(await rawExchange(gw.port, `${head}Origin: ${OTHER}\r\n\r\n`, 3000));
    expect(other.status).toBe(status);
    expect(corsOf(other.fields)).toEqual([]);
    expect(other.fields.get('vary')).toEqual(['Origin']);
  });

  it('says Vary: Origin on an answer to bytes the parser failed on before the head was whole (no Origin known)', async () => {
    const answer = parseRaw(
      await rawExchange(
        gw.port,
        `GET /orders/1 HTTP/1.1\r\nHost: x\r\nOrigin: ${APP}\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`,
        3000,
      ),
    );
    expect(answer.status).toBe(431);
    expect(corsOf(answer.fields)).toEqual([]);
    expect(answer.fields.get('vary')).toEqual(['Origin']);
  });
});

describe('CORS_ORIGINS unset (the default)', () => {
  it('answers no preflight itself and writes no CORS field', async () => {
    const gw = await startTestGateway({ limits: LIMITS });
    try {
      const before = gw.eqt.requests.length;
      const reply = await preflight(gw, APP);
      // An OPTIONS without a key, like any request without one.
      expect(reply.status).toBe(401);
      expect(corsFields(reply)).toEqual([]);
      const answer = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': 'no-cors', Origin: APP } });
      expect(answer.status).toBe(200);
      expect(corsFields(answer)).toEqual([]);
      expect(answer.headers.vary).toBeUndefined();
      expect(gw.eqt.requests.length).toBe(before + 1);
      const refused = await rawExchange(
        gw.port,
        `GET /orders/1 HTTP/1.1\r\nHost: x\r\nExpect: tea\r\nOrigin: ${APP}\r\n\r\n`,
      );
      expect(refused).toMatch(/^HTTP\/1\.1 417 /);
      expect(refused.toLowerCase()).not.toMatch(/\r\n(?:vary|access-control-[a-z-]+):/);
    } finally {
      await gw.stop();
    }
  });
});
