import net from 'node:net';
import { authHeader, type TestGateway } from './gateway.js';
import { send, type Reply, type SendOptions } from './http.js';

/** Small tools shared by the fault tests: bounded waits, timings, metrics, usage and readiness. */

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `check` until it returns true, at most `timeoutMs`; throws with `what` when it never does. */
export async function waitFor(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  intervalMs = 25,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(intervalMs);
  }
}

export interface Timed<T> {
  readonly value: T;
  readonly ms: number;
}

export async function timed<T>(work: () => Promise<T>): Promise<Timed<T>> {
  const t0 = performance.now();
  const value = await work();
  return { value, ms: performance.now() - t0 };
}

/** A request whose outcome is either a complete reply or the error that ended it (never a rejection). */
export async function attempt(
  baseUrl: string,
  options: SendOptions,
): Promise<{ reply?: Reply; error?: Error; ms: number }> {
  const t0 = performance.now();
  try {
    const reply = await send(baseUrl, options);
    return { reply, ms: performance.now() - t0 };
  } catch (err) {
    return { error: err as Error, ms: performance.now() - t0 };
  }
}

export interface UsageEntry {
  readonly name: string;
  readonly route: string;
  readonly hour: { limit: number; used: number; remaining: number };
  readonly day: { limit: number; used: number; remaining: number };
}

/** `GET /admin/usage/<key>`: every row's usage of one key, read from the counter store. */
export async function usageOf(gw: TestGateway, key: string): Promise<UsageEntry[]> {
  const reply = await send(gw.adminUrl, {
    path: `/admin/usage/${encodeURIComponent(key)}`,
    headers: authHeader(),
    agent: false,
  });
  if (reply.status !== 200) throw new Error(`usage of a key answered ${reply.status}: ${reply.text}`);
  return reply.json<{ endpoints: UsageEntry[] }>().endpoints;
}

export async function usageOfRow(gw: TestGateway, key: string, route: string): Promise<UsageEntry> {
  const entry = (await usageOf(gw, key)).find((e) => e.route === route);
  if (!entry) throw new Error(`no usage entry for ${route}`);
  return entry;
}

/** Value of one sample of the admin `/metrics` text (0 when the series does not exist yet). */
export async function metricValue(gw: TestGateway, name: string, labels: Record<string, string> = {}): Promise<number> {
  const reply = await send(gw.adminUrl, { path: '/metrics', agent: false });
  if (reply.status !== 200) throw new Error(`/metrics answered ${reply.status}`);
  const wanted = Object.entries(labels);
  for (const line of reply.text.split('\n')) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = new Map<string, string>();
    for (const pair of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
      have.set(pair[1] as string, pair[2] as string);
    if (wanted.every(([k, v]) => have.get(k) === v) && have.size === wanted.length) return Number(m[3]);
  }
  return 0;
}

export async function readyz(gw: TestGateway): Promise<{ status: number; body: Record<string, unknown> }> {
  const reply = await send(gw.adminUrl, { path: '/readyz', agent: false, timeoutMs: 5000 });
  return { status: reply.status, body: reply.json<Record<string, unknown>>() };
}

export async function waitReady(gw: TestGateway, timeoutMs: number): Promise<void> {
  await waitFor(
    '/readyz to say {"status":"ok"}',
    async () => {
      const r = await readyz(gw);
      return r.status === 200 && r.body.status === 'ok';
    },
    timeoutMs,
    50,
  );
}

/** The access-log line of one request, found by its X-Request-Id. */
export function accessLine(gw: TestGateway, reqId: string): Record<string, unknown> | undefined {
  return gw.logs.find((l) => l.msg === 'request' && l.reqId === reqId);
}

/** A raw TCP connection to a loopback port. */
export function rawConnect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => resolve(socket));
    socket.once('error', reject);
  });
}
