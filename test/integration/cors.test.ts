import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { USAGE_HEADER_KEYS, send, type Reply } from '../helpers/http.js';

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
    } finally {
      await gw.stop();
    }
  });
});
