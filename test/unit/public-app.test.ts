import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parseLimits } from '../../src/config/load-limits.js';
import { loadSettings } from '../../src/config/settings.js';
import { InvalidKeyGuard } from '../../src/keys/guard.js';
import { KeyRegistry, MemoryIssuedKeyStore } from '../../src/keys/registry.js';
import { Limiter, type Decision } from '../../src/limits/limiter.js';
import { MemoryCounterStore } from '../../src/limits/memory-store.js';
import { createLogger } from '../../src/observability/logger.js';
import { GatewayMetrics } from '../../src/observability/metrics.js';
import { Forwarder } from '../../src/proxy/forwarder.js';
import { createPublicApp } from '../../src/server/public-app.js';
import { WebSocketProxy } from '../../src/ws/bridge-proxy.js';
import { WebSocketConnections } from '../../src/ws/connections.js';

/**
 * The middleware chain in-process (hono's app.request()): the order of the steps of README "A request, step by step".
 * Forwarding needs a socket and is covered over real sockets in the integration suite; here a
 * request that passes every step reaches the forward handler, which answers 500 in-process.
 */

const table = parseLimits(
  `limits:
  - { name: Auth, route: "POST /auth/token", also: ["POST /oapi/auth/gen-secret-key/underlying"], per_hour: 2, per_day: 10 }
  - { name: Orders, route: "GET /orders", per_hour: 1, per_day: 10 }
  - { name: WS, route: "WS /ws/orders", per_hour: 1, per_day: 10 }
`,
  'limits.yaml',
);
if (!table.ok) throw new Error('invalid');

function app(mode: 'any' | 'registered' = 'any', options: { limiter?: Limiter; log?: string[] } = {}) {
  const settings = loadSettings({
    env: {
      EQT_BRIDGE_URL: 'http://127.0.0.1:9',
      FNO_BRIDGE_URL: 'http://127.0.0.1:9',
      API_KEY_MODE: mode,
      MAX_BODY_BYTES: '100',
    },
    cwd: '/nonexistent',
  });
  const metrics = new GatewayMetrics({ defaultMetrics: false });
  const limiter = options.limiter ?? new Limiter({ store: new MemoryCounterStore(), failureMode: 'closed' });
  const log = options.log;
  return createPublicApp({
    settings,
    table: () => (table.ok ? table.table : undefined),
    limiter,
    registry: new KeyRegistry(new MemoryIssuedKeyStore()),
    guard: new InvalidKeyGuard({ prefix: 't:', attempts: 100, windowSeconds: 60 }),
    forwarder: new Forwarder({ bridges: settings.bridges, timeoutMs: 100 }),
    webSocketProxy: new WebSocketProxy({ bridges: settings.bridges, timeoutMs: 100 }),
    websockets: new WebSocketConnections(metrics),
    metrics,
    logger: log
      ? createLogger(
          'info',
          new Writable({
            write: (chunk: Buffer, _e, cb) => {
              log.push(...chunk.toString().split('\n').filter(Boolean));
              cb();
            },
          }),
        )
      : createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() })),
  });
}

const key = { 'X-API-Key': 'in-process' };

describe('the public app, in-process', () => {
  it('checks the key before the endpoint', async () => {
    const a = app();
    expect((await a.request('/nowhere')).status).toBe(401);
    expect((await a.request('/nowhere', { headers: key })).status).toBe(404);
  });

  it('in registered mode, refuses a key that was not issued', async () => {
    const reply = await app('registered').request('/orders', { headers: key });
    expect(reply.status).toBe(401);
    expect(await reply.json()).toEqual({ error: 'Unauthorized', message: 'Invalid API key' });
  });

  it('matches before counting: 405 and 404 count nothing', async () => {
    const a = app();
    expect((await a.request('/orders', { method: 'DELETE', headers: key })).status).toBe(405);
    expect((await a.request('/orders/1', { headers: key })).status).toBe(404);
    expect((await a.request('/orders', { headers: key })).status).toBe(500); // reached forwarding: counted once
    expect((await a.request('/orders', { headers: key })).status).toBe(429);
  });

  it('counts before the body checks: 415 and 400 use the window', async () => {
    const a = app();
    const post = (headers: Record<string, string>, body: string) =>
      a.request('/oapi/auth/gen-secret-key/underlying', { method: 'POST', headers: { ...key, ...headers }, body });
    const unsupported = await post({ 'Content-Type': 'text/plain' }, '{}');
    expect(unsupported.status).toBe(415);
    expect(unsupported.headers.get('x-ratelimit-remaining-hour')).toBe('1');
    const bad = await post({ 'Content-Type': 'application/json' }, '{"username":""}');
    expect(bad.status).toBe(400);
    expect(bad.headers.get('x-ratelimit-remaining-hour')).toBe('0');
    const spent = await post({ 'Content-Type': 'application/json' }, '{"username":"u","password":"p"}');
    expect(spent.status).toBe(429);
    expect(await spent.text()).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
  });

  it('answers 413 from Content-Length before reading the body', async () => {
    const reply = await app().request('/oapi/auth/gen-secret-key/underlying', {
      method: 'POST',
      headers: { ...key, 'Content-Type': 'application/json', 'Content-Length': '101' },
      body: 'x'.repeat(101),
    });
    expect(reply.status).toBe(413);
    expect(reply.headers.get('connection')).toBe('close');
  });

  it('answers a step that fails, at once or later, with the 500 that the access log records', async () => {
    const failures = {
      thrown: (): Promise<Decision> => {
        throw new Error('limiter threw');
      },
      rejected: (): Promise<Decision> => Promise.reject(new Error('limiter rejected')),
    };
    for (const [how, check] of Object.entries(failures)) {
      const limiter = new Limiter({ store: new MemoryCounterStore(), failureMode: 'closed' });
      limiter.check = check;
      const log: string[] = [];
      const reply = await app('any', { limiter, log }).request('/orders', { headers: key });
      expect(reply.status, how).toBe(500);
      expect(await reply.json(), how).toEqual({ error: 'Internal Server Error', message: 'Unexpected error' });
      const lines = log.map((line) => JSON.parse(line) as Record<string, unknown>);
      expect(
        lines.find((l) => l.msg === 'unexpected error'),
        how,
      ).toMatchObject({ level: 'error' });
      expect(
        lines.filter((l) => l.status !== undefined),
        how,
      ).toEqual([expect.objectContaining({ endpoint: 'GET /orders', status: 500, reason: 'internal' })]);
    }
  });
});
