import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  listeningLines,
  outputOf,
  spawnWorkersGateway,
  waitForListening,
  type ChildOutput,
} from '../helpers/child-gateway.js';
import { send } from '../helpers/http.js';
import { REDIS_URL } from '../helpers/redis.js';

/** WORKERS=2: what the primary's admin listener says of its workers (readiness, metrics). */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100000, per_day: 100000 }
`;

/** A bridge that answers `GET …?delay=N` after N ms, and tells when a request has arrived. */
interface SlowBridge {
  readonly url: string;
  readonly arrived: () => number;
  close(): Promise<void>;
}

async function slowBridge(): Promise<SlowBridge> {
  let arrived = 0;
  const server = http.createServer((req, res) => {
    arrived++;
    const delay = Number(/[?&]delay=(\d+)/.exec(req.url ?? '')?.[1] ?? 0);
    setTimeout(() => res.end('{"ok":true}'), delay);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arrived: () => arrived,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

interface Workers {
  readonly child: ChildProcess;
  readonly output: ChildOutput;
  readonly exited: Promise<number | null>;
  readonly url: string;
  readonly adminUrl: string;
  readonly bridge: SlowBridge;
}

const started: Workers[] = [];
afterEach(async () => {
  for (const w of started.splice(0)) {
    if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
    await w.bridge.close();
  }
});

async function startWorkers(label: string): Promise<Workers> {
  const bridge = await slowBridge();
  const dir = mkdtempSync(join(tmpdir(), 'oapi-workers-obs-'));
  writeFileSync(join(dir, 'limits.yaml'), LIMITS);
  const child = spawnWorkersGateway({
    dir,
    bridgeUrl: bridge.url,
    redisUrl: REDIS_URL,
    label,
    env: { SHUTDOWN_TIMEOUT_MS: '10000' },
  });
  const output = outputOf(child);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const workers = { child, output, exited, bridge, url: '', adminUrl: '' };
  started.push(workers);
  const { url, adminUrl } = await waitForListening(child, output, { count: 3 });
  return { ...workers, url, adminUrl };
}

describe('WORKERS=2, SIGTERM', () => {
  it('/readyz of the primary turns 503 while its workers finish their requests (regression: ok until they had exited)', async () => {
    const gw = await startWorkers('workers-readyz-drain');
    expect((await send(gw.adminUrl, { path: '/readyz' })).status).toBe(200);
    const slow = send(gw.url, { path: '/orders/1?delay=2500', headers: { 'X-API-Key': 'drain' }, agent: false });
    const deadline = Date.now() + 5000;
    while (gw.bridge.arrived() === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(gw.bridge.arrived()).toBe(1);
    gw.child.kill('SIGTERM');
    // docs/operations.md "Shutdown": /readyz turns 503 as the listener stops accepting.
    await new Promise((r) => setTimeout(r, 300));
    const ready = await send(gw.adminUrl, { path: '/readyz', agent: false });
    expect(ready.status).toBe(503);
    expect(ready.json()).toEqual({ status: 'unavailable', reason: 'shutting down' });
    // The request in flight still gets its answer, and every process ends.
    expect((await slow).status).toBe(200);
    expect(await gw.exited).toBe(0);
  });
});

/** The pids of the workers that said they listen, and still run. */
function workerPids(gw: Workers): number[] {
  return listeningLines(gw.output.stdout())
    .filter((l) => l.public)
    .map((l) => l.pid)
    .filter((pid) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    });
}

describe('WORKERS=2, /metrics of the primary', () => {
  it('answers while a worker that died is being started again (regression: 500 after 5 s, waiting for a worker that did not take the question yet)', async () => {
    const gw = await startWorkers('workers-metrics-restart');
    expect((await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': 'm' }, agent: false })).status).toBe(200);
    expect((await send(gw.adminUrl, { path: '/metrics' })).status).toBe(200);
    const before = listeningLines(gw.output.stdout()).length;
    const [victim] = workerPids(gw);
    process.kill(victim as number, 'SIGKILL');
    // Scrapes every 100 ms from the death until the new worker listens (bounded in count and time).
    const scrapes: Array<Promise<{ status: number; ms: number }>> = [];
    const deadline = Date.now() + 10_000;
    while (listeningLines(gw.output.stdout()).length === before && Date.now() < deadline && scrapes.length < 100) {
      const at = Date.now();
      scrapes.push(
        send(gw.adminUrl, { path: '/metrics', agent: false, timeoutMs: 8000 }).then((r) => ({
          status: r.status,
          ms: Date.now() - at,
        })),
      );
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(listeningLines(gw.output.stdout()).length).toBe(before + 1);
    const results = await Promise.all(scrapes);
    expect(results.length).toBeGreaterThan(0);
    expect(results.filter((r) => r.status !== 200 || r.ms > 2000)).toEqual([]);
  });

  it("never shows a counter going down when a worker dies and another takes its place (regression: the dead worker's counts left the sum)", async () => {
    const gw = await startWorkers('workers-metrics-monotonic');
    const replies = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        send(gw.url, { path: `/orders/${i}`, headers: { 'X-API-Key': 'mono' }, agent: false }),
      ),
    );
    expect(replies.every((r) => r.status === 200)).toBe(true);
    const total = (text: string, metric: string): number =>
      [...text.matchAll(new RegExp(`^${metric}\\{.*\\} (\\S+)$`, 'gm'))].reduce((sum, m) => sum + Number(m[1]), 0);
    const scrape = async (): Promise<string> => {
      const reply = await send(gw.adminUrl, { path: '/metrics', agent: false });
      expect(reply.status).toBe(200);
      return reply.text;
    };
    const first = await scrape();
    expect(total(first, 'oapi_gateway_requests_total')).toBe(12);
    // A worker that served some of them dies (a crash); the primary starts another.
    await new Promise((r) => setTimeout(r, 200));
    const servedBy = new Set(
      gw.output
        .stdout()
        .split('\n')
        .filter((l) => l.includes('"msg":"request"'))
        .map((l) => (JSON.parse(l) as { pid: number }).pid),
    );
    const victim = workerPids(gw).find((pid) => servedBy.has(pid));
    expect(victim).toBeTypeOf('number');
    const before = listeningLines(gw.output.stdout()).length;
    process.kill(victim as number, 'SIGKILL');
    await waitForListening(gw.child, gw.output, { count: before + 1 });
    const after = await scrape();
    // Counters only go up (Prometheus reads a decrease as a reset, and rate() then counts everything again).
    expect(total(after, 'oapi_gateway_requests_total')).toBeGreaterThanOrEqual(12);
    expect(total(after, 'oapi_gateway_request_duration_seconds_count')).toBeGreaterThanOrEqual(12);
    expect(Number(/^oapi_gateway_store_calls_total (\S+)$/m.exec(after)?.[1])).toBeGreaterThanOrEqual(
      Number(/^oapi_gateway_store_calls_total (\S+)$/m.exec(first)?.[1]),
    );
  });
});
