import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { outputOf, waitForListening, type ListeningLine } from '../helpers/child-gateway.js';
import { sleep, waitFor } from '../helpers/faults.js';
import { ADMIN_TOKEN } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';
import { redisClient, REDIS_URL, uniquePrefix } from '../helpers/redis.js';

/** The gateway as a process: SIGHUP reloads, SIGTERM and SIGINT drain and exit 0. */

const ROOT = new URL('../../', import.meta.url).pathname;
const LIMITS = readFileSync(join(ROOT, 'limits.yaml'), 'utf8');
const children: ChildProcess[] = [];

/** A bridge that answers after `delayMs`, to have requests in flight. */
let slowBridge: http.Server;
let slowUrl: string;
beforeAll(async () => {
  slowBridge = http.createServer((req, res) => {
    const delay = Number(new URL(req.url ?? '/', 'http://x').searchParams.get('delay') ?? 0);
    req.resume();
    setTimeout(() => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end('{"slow":true}');
    }, delay);
  });
  await new Promise<void>((r) => slowBridge.listen(0, '127.0.0.1', r));
  slowUrl = `http://127.0.0.1:${(slowBridge.address() as AddressInfo).port}`;
});
afterAll(() => {
  slowBridge.closeAllConnections();
  slowBridge.close();
});
/** Gateways started under npm: their own pids, killed too should a test fail before they stop. */
const gatewayPids: number[] = [];
afterEach(() => {
  for (const child of children.splice(0)) if (child.exitCode === null) child.kill('SIGKILL');
  for (const pid of gatewayPids.splice(0)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // Already gone, as it should be.
    }
  }
});

/**
 * The environment of a gateway process in `dir`: its table (npm runs the script in the package's
 * folder, so LIMITS_FILE names this test's own), loopback ports of its own, both bridges the slow
 * one; `env` on top (no Redis unless it names one).
 */
function processEnv(dir: string, env: Record<string, string | undefined>): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    LIMITS_FILE: join(dir, 'limits.yaml'),
    PORT: '0',
    HOST: '127.0.0.1',
    ADMIN_PORT: '0',
    ADMIN_TOKEN,
    EQT_BRIDGE_URL: slowUrl,
    FNO_BRIDGE_URL: slowUrl,
    API_KEY_MODE: 'any',
    ...env,
  };
}

/** `npm`: the gateway as `npm start` runs it, the npm process being the child (as a process manager sees it). */
async function startProcess(env: Record<string, string> = {}, how: 'node' | 'npm' = 'node') {
  const dir = mkdtempSync(join(tmpdir(), 'oapi-proc-'));
  writeFileSync(join(dir, 'limits.yaml'), LIMITS);
  const prefix = uniquePrefix('proc');
  const [command, args] =
    how === 'npm' ? ['npm', ['start', '--silent', '--prefix', ROOT]] : [process.execPath, [join(ROOT, 'dist/main.js')]];
  const child = spawn(command, args, {
    cwd: dir,
    env: processEnv(dir, {
      HOME: process.env.HOME,
      REDIS_URL,
      REDIS_KEY_PREFIX: prefix,
      SHUTDOWN_TIMEOUT_MS: '5000',
      ...env,
    }),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const output = outputOf(child);
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const { url, adminUrl, lines } = await waitForListening(child, output);
  const pid = (lines[0] as ListeningLine).pid;
  if (how === 'npm') gatewayPids.push(pid);
  return {
    child,
    dir,
    url,
    adminUrl,
    prefix,
    log: () => output.stdout(),
    /** The gateway's own pid (under npm, the child is npm). */
    pid,
    exited,
  };
}

describe('SIGHUP', () => {
  it('reloads the limit table', async () => {
    const gw = await startProcess();
    writeFileSync(join(gw.dir, 'limits.yaml'), LIMITS.replace('per_hour: 7200', 'per_hour: 7100'));
    gw.child.kill('SIGHUP');
    const deadline = Date.now() + 3000;
    while (!gw.log().includes('"trigger":"signal"') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 25));
    const line = gw
      .log()
      .split('\n')
      .find((l) => l.includes('"trigger":"signal"'));
    expect(JSON.parse(line ?? '{}')).toMatchObject({ msg: 'limit table loaded', trigger: 'signal', rows: 18 });
    const reply = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': 'hup' }, agent: false });
    expect(reply.headers['x-ratelimit-limit-hour']).toBe('7100');
  });
});

describe.each([
  ['SIGTERM', 'node'],
  ['SIGINT', 'node'],
  ['SIGTERM', 'npm'],
  ['SIGINT', 'npm'],
] as const)('%s sent to the %s process', (signal, how) => {
  it('stops accepting, lets requests in flight finish, closes Redis and exits 0', async () => {
    const gw = await startProcess({}, how);
    const redis = redisClient();
    const ownConnections = async (): Promise<number> =>
      String(await redis.client('LIST'))
        .split('\n')
        .filter((l: string) => l.includes(` name=oapi-gateway:${gw.pid} `)).length;
    expect(await ownConnections()).toBeGreaterThanOrEqual(2); // counters and the event channel
    const inFlight = send(gw.url, { path: '/orders/1?delay=700', headers: { 'X-API-Key': 'drain' }, agent: false });
    await new Promise((r) => setTimeout(r, 200));
    const stopAt = Date.now();
    gw.child.kill(signal);
    await new Promise((r) => setTimeout(r, 100));
    // No new connection is accepted once the shutdown began.
    const refused = await send(gw.url, { path: '/orders/2', headers: { 'X-API-Key': 'late' }, agent: false }).then(
      () => 'accepted',
      (err: NodeJS.ErrnoException) => err.code,
    );
    expect(refused).toBe('ECONNREFUSED');
    const reply = await inFlight;
    expect(reply.status).toBe(200);
    expect(reply.text).toBe('{"slow":true}');
    // npm passes the signal on to the gateway (package.json `start` execs node) and ends as the gateway did.
    expect(await gw.exited).toBe(0);
    expect(Date.now() - stopAt).toBeLessThan(5000);
    expect(gw.log()).toContain('"msg":"gateway stopped"');
    // Its node process is gone too, not left running without its graceful shutdown (regression: `npm start`).
    expect(gw.pid).toBeGreaterThan(0);
    expect(() => process.kill(gw.pid, 0)).toThrow();
    expect(await ownConnections()).toBe(0);
    redis.disconnect();
  });
});

describe('an answer completed during the shutdown', () => {
  // docs/operations.md "Shutdown": kept-alive connections close as their last answer completes. An
  // answer that still said `keep-alive` had the client send its next request on that connection,
  // to meet a reset (regression: the second request of a kept-alive client was lost, ECONNRESET).
  it('says Connection: close, so the client does not send its next request on that connection', async () => {
    const gw = await startProcess({ SHUTDOWN_TIMEOUT_MS: '5000' });
    const { port, hostname } = new URL(gw.url);
    const socket = net.connect(Number(port), hostname);
    let received = '';
    socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
    socket.on('error', () => {});
    let closed = false;
    socket.once('close', () => (closed = true));
    await new Promise((r) => socket.once('connect', r));
    // The first answer on the connection, before the shutdown, keeps it alive.
    socket.write('GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: kept\r\n\r\n');
    await waitFor('the first answer', () => received.includes('{"slow":true}'), 3000);
    expect(received).toMatch(/\r\nConnection: keep-alive\r\n/i);
    received = '';
    socket.write('GET /orders/2?delay=600 HTTP/1.1\r\nHost: x\r\nX-API-Key: kept\r\n\r\n');
    await sleep(200);
    gw.child.kill('SIGTERM');
    await waitFor('the answer in flight', () => received.includes('{"slow":true}'), 3000);
    expect(received).toMatch(/^HTTP\/1\.1 200 /);
    expect(received).toMatch(/\r\nConnection: close\r\n/i);
    expect(received).not.toMatch(/keep-alive/i);
    await waitFor('the gateway to close the connection', () => closed, 3000);
    expect(await gw.exited).toBe(0);
  });
});

describe.each(['SIGTERM', 'SIGINT'] as const)('%s sent twice', (signal) => {
  // Under `npm start` a signal to the process group (Ctrl-C, systemd's default KillMode) reaches the
  // gateway twice: from the group, and from npm passing it on.
  it('regression: the second does not end the process before its graceful shutdown', async () => {
    const gw = await startProcess();
    const inFlight = send(gw.url, { path: '/orders/1?delay=700', headers: { 'X-API-Key': 'twice' }, agent: false });
    await new Promise((r) => setTimeout(r, 200));
    gw.child.kill(signal);
    await new Promise((r) => setTimeout(r, 50));
    gw.child.kill(signal);
    const reply = await inFlight;
    expect(reply.status).toBe(200);
    expect(reply.text).toBe('{"slow":true}');
    expect(await gw.exited).toBe(0);
    expect(gw.log()).toContain('"msg":"gateway stopped"');
  });
});

/**
 * The gateway as a process that is still starting: `dist/main.js` under `nodeArgs`, with the
 * table and both bridges, and no Redis unless `env` names one; the test waits for what it needs.
 */
function spawnStarting(
  env: Record<string, string>,
  nodeArgs: string[] = [],
  dir = mkdtempSync(join(tmpdir(), 'oapi-proc-')),
) {
  writeFileSync(join(dir, 'limits.yaml'), LIMITS);
  const child = spawn(process.execPath, [...nodeArgs, join(ROOT, 'dist/main.js')], {
    cwd: dir,
    env: processEnv(dir, env),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  return { child, output: outputOf(child) };
}

/** A Redis that takes the connection and never answers: it holds the start-up in its connection wait. */
async function silentRedis(): Promise<{ url: string; connecting: Promise<void>; close(): void }> {
  const sockets: net.Socket[] = [];
  let connected!: () => void;
  const connecting = new Promise<void>((resolve) => (connected = resolve));
  const silent = net.createServer((socket) => {
    sockets.push(socket);
    connected();
  });
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  return {
    url: `redis://127.0.0.1:${(silent.address() as AddressInfo).port}`,
    connecting,
    close: () => {
      for (const socket of sockets) socket.destroy();
      silent.close();
    },
  };
}

describe('SIGHUP while the gateway starts', () => {
  it('regression: does not end the process, and reloads once it serves', async () => {
    const redis = await silentRedis();
    try {
      const { child, output } = spawnStarting({ REDIS_URL: redis.url });
      await redis.connecting;
      child.kill('SIGHUP');
      const { url } = await waitForListening(child, output);
      const reply = await send(url, { path: '/orders/1', headers: { 'X-API-Key': 'early' }, agent: false });
      expect(reply.status).toBe(200);
      await waitFor('the reload of the signal', () => output.stdout().includes('"trigger":"signal"'), 3000);
      expect(child.signalCode).toBeNull();
    } finally {
      redis.close();
    }
  });

  it('with WORKERS=2, one sent to the primary is done by the primary once it serves (regression: dropped)', async () => {
    const redis = await silentRedis();
    try {
      const { child, output } = spawnStarting({ REDIS_URL: redis.url, WORKERS: '2' });
      // Only the primary starts before the signal: its workers are forked once it serves.
      await redis.connecting;
      child.kill('SIGHUP');
      const { lines } = await waitForListening(child, output, { count: 3 });
      const primary = lines.find((l) => l.admin && !l.public)?.pid;
      expect(primary).toBe(child.pid);
      const reloadedByPrimary = (): boolean =>
        output
          .stdout()
          .split('\n')
          .some((l) => l.includes('"trigger":"signal"') && l.includes(`"pid":${child.pid},`));
      await waitFor("the primary's reload of the signal", reloadedByPrimary, 3000);
      expect(child.signalCode).toBeNull();
    } finally {
      redis.close();
    }
  });
});

describe('SIGHUP while the gateway loads its modules', () => {
  it('regression: does not end the process (the listener came only after every module had loaded, 100–200 ms)', async () => {
    // A module hook holds the load of dist/runner.js (the bulk of the gateway) until the test lets it go.
    const dir = mkdtempSync(join(tmpdir(), 'oapi-hold-'));
    const release = join(dir, 'release');
    writeFileSync(
      join(dir, 'hooks.mjs'),
      `import { existsSync, writeSync } from 'node:fs';
export async function load(url, context, nextLoad) {
  if (url.endsWith('/dist/runner.js')) {
    writeSync(2, 'holding runner.js\\n');
    const until = Date.now() + 10000;
    while (!existsSync(${JSON.stringify(release)}) && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
  }
  return nextLoad(url, context);
}
`,
    );
    writeFileSync(
      join(dir, 'register.mjs'),
      "import { register } from 'node:module';\nregister('./hooks.mjs', import.meta.url);\n",
    );
    const { child, output } = spawnStarting({}, ['--import', join(dir, 'register.mjs')], dir);
    await waitFor(
      'the hook holding runner.js',
      () => output.stderr().includes('holding runner.js') || child.exitCode !== null,
      10_000,
      10,
    );
    expect(output.stderr()).toContain('holding runner.js');
    child.kill('SIGHUP');
    await sleep(200);
    expect([child.exitCode, child.signalCode]).toEqual([null, null]);
    writeFileSync(release, '');
    await waitForListening(child, output);
    await waitFor('the reload of the signal', () => output.stdout().includes('"trigger":"signal"'), 3000);
  });
});

describe('a request that outlasts SHUTDOWN_TIMEOUT_MS', () => {
  it('is cut off and the process still exits 0', async () => {
    const gw = await startProcess({ SHUTDOWN_TIMEOUT_MS: '300', UPSTREAM_TIMEOUT_MS: '20000' });
    const inFlight = send(gw.url, { path: '/orders/1?delay=5000', headers: { 'X-API-Key': 'cut' }, agent: false }).then(
      (r) => r.status,
      (err: Error) => err.message,
    );
    await new Promise((r) => setTimeout(r, 200));
    const stopAt = Date.now();
    gw.child.kill('SIGTERM');
    expect(await gw.exited).toBe(0);
    expect(Date.now() - stopAt).toBeLessThan(3000);
    expect(await inFlight).toBe('socket hang up');
  });
});

describe('an admin request that never completes', () => {
  // Node stops its header and request timeouts once a server closes, and the admin listener's
  // close waited for every connection with a request begun (regression: a client that sent half
  // its request to /metrics held the shutdown, and the process never exited).
  it('is cut off at SHUTDOWN_TIMEOUT_MS and the process still exits 0', async () => {
    const gw = await startProcess({ SHUTDOWN_TIMEOUT_MS: '300' });
    const { port, hostname } = new URL(gw.adminUrl);
    const socket = net.connect(Number(port), hostname);
    socket.on('error', () => {});
    let closed = false;
    socket.once('close', () => (closed = true));
    await new Promise((r) => socket.once('connect', r));
    socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n');
    await sleep(100);
    const stopAt = Date.now();
    gw.child.kill('SIGTERM');
    expect(await gw.exited).toBe(0);
    expect(Date.now() - stopAt).toBeLessThan(3000);
    expect(gw.log()).toContain('"msg":"gateway stopped"');
    await waitFor('the admin connection to be closed', () => closed, 1000);
  });
});
