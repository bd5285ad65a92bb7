import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sha256Hex } from '../../src/lib/hash.js';
import { startSandboxBridge } from '../../src/sandbox/bridge.js';
import { authHeader, startGatewayPair, type GatewayPair, type TestGateway } from '../helpers/gateway.js';
import {
  listeningLines,
  outputOf,
  spawnWorkersGateway,
  waitForListening,
  type ChildOutput,
} from '../helpers/child-gateway.js';
import { send } from '../helpers/http.js';
import { startRedisServer, type RedisProcess } from '../helpers/redis.js';

/** What one request costs Redis, and several processes on one host. */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order List, route: "GET /orders", per_hour: 5, per_day: 50 }
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100000, per_day: 100000 }
`;

let redis: RedisProcess;
let stats: Redis;
beforeAll(async () => {
  redis = await startRedisServer();
  stats = new Redis(redis.url);
});
afterAll(async () => {
  stats.disconnect();
  await redis.stop();
});

async function commandCalls(): Promise<Record<string, number>> {
  const text = await stats.info('commandstats');
  const calls: Record<string, number> = {};
  for (const m of text.matchAll(/^cmdstat_([a-z|_-]+):calls=(\d+)/gm)) calls[m[1] as string] = Number(m[2]);
  return calls;
}
const scriptCalls = (c: Record<string, number>): number => (c.evalsha ?? 0) + (c.eval ?? 0);

describe('Redis round trips per request', () => {
  let pair: GatewayPair;
  let a: TestGateway;
  let b: TestGateway;

  beforeAll(async () => {
    pair = await startGatewayPair({ limits: LIMITS, redis: redis.url, label: 'scale', env: { LOG_LEVEL: 'warn' } });
    ({ a, b } = pair);
  });
  afterAll(async () => {
    await pair.stop();
  });

  it('is one Lua script for both windows of an allowed request', async () => {
    const key = `one-trip-${Date.now()}`;
    await send(a.url, { path: '/orders/0', headers: { 'X-API-Key': key } });
    const before = await commandCalls();
    for (let i = 1; i <= 30; i++)
      expect((await send(a.url, { path: `/orders/${i}`, headers: { 'X-API-Key': key } })).status).toBe(200);
    const after = await commandCalls();
    expect(scriptCalls(after) - scriptCalls(before)).toBe(30);
    // Inside the script: one read and one write of the key's hash.
    expect((after.hmget ?? 0) - (before.hmget ?? 0)).toBe(30);
    expect((after.hset ?? 0) - (before.hset ?? 0)).toBe(30);
  });

  it('is none for a key that has spent a window: refused from memory until the window resets, on every instance', async () => {
    const key = `spent-${Date.now()}`;
    for (let i = 0; i < 5; i++)
      expect((await send(a.url, { path: '/orders', headers: { 'X-API-Key': key } })).status).toBe(200);
    // Each instance learns it with one call (the refusal from Redis) ...
    expect((await send(a.url, { path: '/orders', headers: { 'X-API-Key': key } })).status).toBe(429);
    expect((await send(b.url, { path: '/orders', headers: { 'X-API-Key': key } })).status).toBe(429);
    // ... and from then on answers from memory.
    const before = await commandCalls();
    for (let i = 0; i < 40; i++) {
      const reply = await send(i % 2 ? a.url : b.url, { path: '/orders', headers: { 'X-API-Key': key } });
      expect(reply.status).toBe(429);
      expect(reply.headers['x-ratelimit-remaining-hour']).toBe('0');
      expect(reply.headers['x-ratelimit-remaining-day']).toBe('45');
      expect(Number(reply.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
    const after = await commandCalls();
    expect(scriptCalls(after) - scriptCalls(before)).toBe(0);
    const metrics = (await send(a.adminUrl, { path: '/metrics' })).text;
    expect(metrics).toMatch(/^oapi_gateway_store_calls_total \d+$/m);
  });
});

/** A `WORKERS=2` gateway process serving `dir`'s limits.yaml through one sandbox bridge. */
interface WorkersProcess {
  readonly child: ChildProcess;
  readonly output: ChildOutput;
  /** Both streams, for the messages the tests look for ("a worker cannot start" is on stderr). */
  readonly log: () => string;
  readonly exited: Promise<number | null>;
}

async function spawnWorkers(dir: string, label: string, env: Record<string, string> = {}): Promise<WorkersProcess> {
  const eqt = await startSandboxBridge('eqt');
  const child = spawnWorkersGateway({ dir, bridgeUrl: eqt.url, redisUrl: redis.url, label, env });
  const output = outputOf(child);
  let log = '';
  child.stdout?.on('data', (c: Buffer) => (log += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (log += c.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  exited.then(
    () => eqt.close(),
    () => eqt.close(),
  );
  return { child, output, log: () => log, exited };
}

describe('WORKERS=2', () => {
  let dir: string;
  let child: ChildProcess;
  let url: string;
  let adminUrl: string;
  let log: () => string;
  let output: ChildOutput;
  let exited: Promise<number | null>;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-workers-'));
    writeFileSync(join(dir, 'limits.yaml'), LIMITS);
    ({ child, output, log, exited } = await spawnWorkers(dir, 'workers'));
    // Workers that listen on port 0 share one port, which the primary binds for the first of them
    // and holds while any of them listens (Node's cluster module).
    ({ url, adminUrl } = await waitForListening(child, output, { count: 3 }));
  });
  afterAll(() => {
    if (child.exitCode === null) child.kill('SIGKILL');
  });

  it('runs two serving processes and one admin listener, sharing the counters', async () => {
    const listening = listeningLines(output.stdout());
    expect(listening).toHaveLength(3);
    expect(new Set(listening.filter((l) => l.public).map((l) => l.public))).toEqual(
      new Set([url.slice('http://'.length)]),
    );
    expect(listening.filter((l) => l.public && !l.admin)).toHaveLength(2);
    expect(listening.filter((l) => l.admin && !l.public)).toHaveLength(1);

    // New connections are spread over both workers, which share one limit.
    const replies = await Promise.all(
      Array.from({ length: 24 }, () =>
        send(url, { path: '/orders', headers: { 'X-API-Key': 'shared' }, agent: false }),
      ),
    );
    expect(replies.filter((r) => r.status === 200)).toHaveLength(5);
    expect(replies.filter((r) => r.status === 429)).toHaveLength(19);
    await new Promise((r) => setTimeout(r, 100));
    const servedBy = new Set(
      log()
        .split('\n')
        .filter((l) => l.includes('"msg":"request"'))
        .map((l) => (JSON.parse(l) as { pid: number }).pid),
    );
    expect(servedBy.size).toBe(2);

    const usage = await send(adminUrl, { path: '/admin/usage/shared', headers: authHeader() });
    expect(usage.json<{ endpoints: Array<{ hour: { used: number } }> }>().endpoints[0]?.hour.used).toBe(5);
    const metrics = (await send(adminUrl, { path: '/metrics' })).text;
    const total = [
      ...metrics.matchAll(/^oapi_gateway_requests_total\{endpoint="GET \/orders",status="(\d+)"\} (\d+)$/gm),
    ].reduce((sum, m) => sum + Number(m[2]), 0);
    expect(total).toBe(24);
    // The table's gauges are the table's, not their sum over the workers (regression: 4 rows for a table of 2).
    expect(metrics).toMatch(/^oapi_gateway_limits_rows 2$/m);
    const loadedAt = Number(/^oapi_gateway_limits_loaded_timestamp_seconds (\S+)$/m.exec(metrics)?.[1]);
    expect(loadedAt).toBeLessThanOrEqual(Date.now() / 1000);
    expect(loadedAt).toBeGreaterThan(Date.now() / 1000 - 300);
  });

  it('restarts a worker that cannot start with a growing delay, while the other serves (regression: a tight respawn loop)', async () => {
    writeFileSync(join(dir, 'limits.yaml'), 'limits: [oops');
    await new Promise((r) => setTimeout(r, 500));
    const workerPid = listeningLines(output.stdout()).find((l) => l.public)?.pid;
    expect(workerPid).toBeTypeOf('number');
    process.kill(workerPid as number, 'SIGKILL');
    const deathsSoFar = (): number => (log().match(/"msg":"worker died; starting another"/g) ?? []).length;
    // The killed one, and at least one that could not start (a worker takes a while to start on a busy machine).
    const killedAt = Date.now();
    while (deathsSoFar() < 2 && Date.now() - killedAt < 8000) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 1000));
    const elapsed = Date.now() - killedAt;
    const deaths = deathsSoFar();
    expect(deaths).toBeGreaterThanOrEqual(2);
    // Restarts come 0 ms, then 500, 1000, 2000 ms … apart: within `elapsed` at most this many deaths
    // (a tight respawn loop would have dozens).
    expect(deaths).toBeLessThanOrEqual(2 + Math.ceil(Math.log2(1 + elapsed / 500)));
    expect(log()).toContain('a worker cannot start');
    expect((await send(url, { path: '/orders/1', headers: { 'X-API-Key': 'still' }, agent: false })).status).toBe(200);
    writeFileSync(join(dir, 'limits.yaml'), LIMITS);
    const { lines } = await waitForListening(child, output, { count: 4 });
    expect(lines).toHaveLength(4);
    // The new worker listens where the others do: the survivor kept the primary's port open.
    expect(lines[3]?.public).toBe(url.slice('http://'.length));
  });

  it('stops every process on SIGTERM and exits 0', async () => {
    const agent = new http.Agent({ keepAlive: false });
    expect((await send(url, { path: '/orders/1', headers: { 'X-API-Key': 'bye' }, agent })).status).toBe(200);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect((log().match(/"msg":"gateway stopped"/g) ?? []).length).toBe(3);
  });
});

describe('WORKERS=2, SIGTERM sent twice', () => {
  it('regression: the second does not end the primary, and the workers with it, before their graceful shutdown', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-workers-twice-'));
    writeFileSync(join(dir, 'limits.yaml'), LIMITS);
    const { child, output, log, exited } = await spawnWorkers(dir, 'workers-twice');
    try {
      const { url } = await waitForListening(child, output, { count: 3 });
      expect((await send(url, { path: '/orders/1', headers: { 'X-API-Key': 'twice' }, agent: false })).status).toBe(
        200,
      );
      child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 50));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect((log().match(/"msg":"gateway stopped"/g) ?? []).length).toBe(3);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });
});

describe('WORKERS=2: the admin listener answers for the workers', () => {
  let dir: string;
  let gateway: WorkersProcess;
  let url: string;
  let adminUrl: string;
  const keysFile = (...keys: string[]): string =>
    `keys:\n${keys.map((key) => `  - id: ${key}\n    sha256: ${sha256Hex(key)}\n`).join('')}`;
  const alive = (pid: number): boolean => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };
  const workerPids = (): number[] =>
    listeningLines(gateway.output.stdout())
      .filter((l) => l.public)
      .map((l) => l.pid)
      .filter(alive);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-workers-admin-'));
    writeFileSync(join(dir, 'limits.yaml'), LIMITS);
    writeFileSync(join(dir, 'keys.yaml'), keysFile('first'));
    gateway = await spawnWorkers(dir, 'workers-admin', {
      API_KEY_MODE: 'registered',
      API_KEYS_FILE: join(dir, 'keys.yaml'),
    });
    ({ url, adminUrl } = await waitForListening(gateway.child, gateway.output, { count: 3 }));
  });
  afterAll(() => {
    // A worker the tests stopped must run again to see its primary go.
    for (const pid of workerPids()) process.kill(pid, 'SIGCONT');
    if (gateway.child.exitCode === null) gateway.child.kill('SIGKILL');
  });

  it('POST /admin/limits/reload answers once every worker has the new table and key file (regression: only the primary reloaded)', async () => {
    writeFileSync(join(dir, 'limits.yaml'), LIMITS.replace('per_hour: 5,', 'per_hour: 7,'));
    writeFileSync(join(dir, 'keys.yaml'), keysFile('first', 'second'));
    // At once: the workers' own file watchers wait 150 ms for the writes to settle.
    const reloaded = await send(adminUrl, { method: 'POST', path: '/admin/limits/reload', headers: authHeader() });
    expect(reloaded.status).toBe(200);
    const body = reloaded.json<{ hash: string; changed: boolean }>();
    expect(body.changed).toBe(true);
    const inForce = await send(adminUrl, { path: '/admin/limits', headers: authHeader() });
    expect(body.hash).toBe(inForce.json<{ hash: string }>().hash);
    // New connections go to both workers in turn.
    const replies = await Promise.all(
      Array.from({ length: 4 }, () => send(url, { path: '/orders', headers: { 'X-API-Key': 'second' }, agent: false })),
    );
    expect(replies.map((r) => [r.status, r.headers['x-ratelimit-limit-hour']])).toEqual(
      Array.from({ length: 4 }, () => [200, '7']),
    );
  });

  it('POST /admin/limits/reload answers 503 naming a worker that does not answer', async () => {
    const [stopped] = workerPids();
    process.kill(stopped as number, 'SIGSTOP');
    try {
      const reloaded = await send(adminUrl, { method: 'POST', path: '/admin/limits/reload', headers: authHeader() });
      expect(reloaded.status).toBe(503);
      const { error, message } = reloaded.json<{ error: string; message: string }>();
      expect(error).toBe('Service Unavailable');
      expect(message).toMatch(/^not every worker has sha256:[0-9a-f]{64}: /);
      expect(message).toContain(`worker ${stopped} did not answer within 5 s`);
    } finally {
      process.kill(stopped as number, 'SIGCONT');
    }
    // Running again, it answers the next reload.
    expect((await send(adminUrl, { method: 'POST', path: '/admin/limits/reload', headers: authHeader() })).status).toBe(
      200,
    );
  });

  it('/readyz says unavailable while no worker serves (regression: ok from the primary alone)', async () => {
    const readiness = async () => (await send(adminUrl, { path: '/readyz' })).json<{ status: string }>();
    expect(await readiness()).toEqual({ status: 'ok' });
    expect((await send(url, { path: '/orders/1', headers: { 'X-API-Key': 'first' }, agent: false })).status).toBe(200);
    const before = listeningLines(gateway.output.stdout()).length;
    for (const pid of workerPids()) process.kill(pid, 'SIGKILL');
    // Quick deaths are restarted 0.5 s and 1 s later: until then no worker serves.
    const deadline = Date.now() + 3000;
    let ready = await readiness();
    while (ready.status === 'ok' && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 25));
      ready = await readiness();
    }
    expect(ready).toEqual({ status: 'unavailable', reason: 'no worker serves the public port' });
    const { lines } = await waitForListening(gateway.child, gateway.output, { count: before + 2 });
    const again = Date.now() + 3000;
    while ((await readiness()).status !== 'ok' && Date.now() < again) await new Promise((r) => setTimeout(r, 25));
    expect(await readiness()).toEqual({ status: 'ok' });
    // With PORT=0 the new workers listen on a port of their own (docs/performance.md).
    const now = `http://${lines.at(-1)?.public}`;
    expect((await send(now, { path: '/orders/1', headers: { 'X-API-Key': 'first' }, agent: false })).status).toBe(200);
  });
});
