import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';

/** The Redis every developer machine and CI has (or REDIS_URL). */
export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';

/** A key prefix of one's own, so test files never see each other's counters; the run's keys are deleted after it. */
export function uniquePrefix(label = 't'): string {
  return `test:${process.env.OAPI_TEST_RUN ?? 'local'}:${label}:${randomBytes(4).toString('hex')}:`;
}

export function redisClient(url = REDIS_URL): Redis {
  return new Redis(url, { maxRetriesPerRequest: 1 });
}

/**
 * The gateway's own client (no offline queue, commands time out after `commandTimeoutMs`),
 * connected, with its errors swallowed: the tests that use it stop, pause or lose the Redis
 * behind it on purpose, and look at what the commands answer instead.
 */
export async function connectedClient(url: string, commandTimeoutMs: number): Promise<RedisClient> {
  const client = createRedisClient({ url, commandTimeoutMs });
  client.on('error', () => {});
  await client.connect();
  return client;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/**
 * A loopback port where connections are refused, and that no other test takes meanwhile: the
 * suite's servers listen on ports the kernel picks (32768 and up) or, for a Redis Cluster, on
 * 20000-39999; this one comes from 10000-19999. (A port from freePort() may be taken by
 * another test's server between the check and its use.)
 */
export async function refusingPort(): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 10000 + Math.floor(Math.random() * 10000);
    const refused = await new Promise<boolean>((resolve) => {
      const socket = net.connect(port, '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(false);
      });
      socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
    });
    if (refused) return port;
  }
  throw new Error('no refusing port found in 10000-19999');
}

export interface RedisProcess {
  readonly port: number;
  readonly url: string;
  readonly pid: number;
  /** SIGKILL: Redis dies at once, mid-traffic. */
  kill(): Promise<void>;
  /** Starts it again on the same port (and data directory). */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * A `redis-server` of the test's own on a free loopback port, stopped by PID. With
 * `persist`, it keeps an append-only file (fsync on every write) in a temporary directory, so
 * its counters survive a kill and restart.
 */
export async function startRedisServer(
  options: {
    persist?: boolean;
    args?: string[];
    port?: number;
    /** Where a port is drawn from when `port` is not given (freePort; a test gives another). */
    pickPort?: () => Promise<number>;
  } = {},
): Promise<RedisProcess> {
  const pickPort = options.pickPort ?? freePort;
  let port = options.port ?? (await pickPort());
  const dir = mkdtempSync(join(tmpdir(), 'oapi-redis-'));
  const args = [
    ...(options.persist ? ['--appendonly', 'yes', '--appendfsync', 'always'] : ['--appendonly', 'no']),
    ...(options.args ?? []),
  ];
  let child: ChildProcess | undefined;

  const waitExit = (c: ChildProcess | undefined): Promise<void> =>
    new Promise((resolve) => {
      if (!c || c.exitCode !== null || c.signalCode !== null) return resolve();
      c.once('exit', () => resolve());
    });
  const fail = (message: string): never => {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(message);
  };

  // A port from freePort() can be taken by another test's socket before redis-server binds it
  // (connections' local ports come from the same range): then it says so and exits, and another
  // port is tried. Any other failure is reported with what redis-server printed.
  for (let attempt = 1; ; attempt++) {
    const started = await spawnRedis(port, dir, args);
    child = started.child;
    if (started.outcome === 'up') break;
    if (started.outcome === 'exited' && portTaken(started.output()) && options.port === undefined && attempt < 5) {
      port = await pickPort();
      continue;
    }
    started.child.kill('SIGKILL');
    fail(`redis-server on port ${port} (127.0.0.1): ${started.outcome}\n${started.output()}`);
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    get pid() {
      return child?.pid ?? -1;
    },
    kill: async () => {
      const c = child;
      c?.kill('SIGKILL');
      await waitExit(c);
    },
    restart: async () => {
      const started = await spawnRedis(port, dir, args);
      child = started.child;
      if (started.outcome !== 'up') {
        started.child.kill('SIGKILL');
        throw new Error(`redis-server on port ${port} (127.0.0.1) again: ${started.outcome}\n${started.output()}`);
      }
    },
    stop: async () => {
      const c = child;
      c?.kill('SIGKILL');
      await waitExit(c);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** What redis-server prints when its port is in use. */
export function portTaken(output: string): boolean {
  return output.includes('Address already in use');
}

/**
 * Starts one redis-server on a loopback `port`, keeping its files in `dir` (no snapshots), with
 * `args` on top, and waits until it answers: `up` once PING is answered on `port` by that very
 * process (not by another test's Redis there), `exited` when it ended first, `timeout` after
 * `timeoutMs`. What it printed is kept for the error message.
 */
/**
 * Each redis-server started here is named by a file in the run's directory of them (set by the
 * global setup) until it exits: the run's teardown kills those still there, so that a test failing
 * before it stops its own leaves no server behind (the test process itself ends without its
 * 'exit' event).
 */
function stopAfterTheRun(child: ChildProcess): void {
  const dir = process.env.OAPI_TEST_REDIS_PIDS;
  if (!dir || child.pid === undefined) return;
  const file = join(dir, String(child.pid));
  writeFileSync(file, '');
  child.once('exit', () => rmSync(file, { force: true }));
}

export async function spawnRedis(
  port: number,
  dir: string,
  args: readonly string[],
  timeoutMs = 5000,
): Promise<{ child: ChildProcess; outcome: 'up' | 'exited' | 'timeout'; output: () => string }> {
  const common = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--dir', dir, '--daemonize', 'no'];
  const child = spawn('redis-server', [...common, '--loglevel', 'warning', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  stopAfterTheRun(child);
  let output = '';
  child.stdout?.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (output += c.toString()));
  let ended = false;
  const exited = new Promise<'exited'>((resolve) =>
    child.once('exit', () => {
      ended = true;
      resolve('exited');
    }),
  );
  const answered = waitForPing(port, timeoutMs, { pid: child.pid, stop: () => ended }).then(
    (up) => (up ? ('up' as const) : ('exited' as const)),
    () => 'timeout' as const,
  );
  const outcome = await Promise.race([answered, exited]);
  // 'exit' can come before the pipes are drained.
  if (outcome === 'exited')
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, 2000);
      child.once('close', () => {
        clearTimeout(timer);
        resolve(undefined);
      });
    });
  return { child, outcome, output: () => output };
}

/**
 * Resolves true once PING is answered on `port` (by the process `pid`, when given), false when
 * `stop()` says to give up; rejects after `timeoutMs`. Each try is bounded: a listener that
 * accepts and never answers does not hold it.
 */
export async function waitForPing(
  port: number,
  timeoutMs: number,
  options: { readonly pid?: number | undefined; readonly stop?: () => boolean } = {},
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (options.stop?.()) return false;
    const client = new Redis({
      port,
      host: '127.0.0.1',
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      connectTimeout: 500,
      enableReadyCheck: false,
      commandTimeout: 500,
    });
    client.on('error', () => {}); // refused until the server is up
    try {
      await client.connect();
      await client.ping();
      if (options.pid === undefined) return true;
      const pid = Number(/^process_id:(\d+)/m.exec(await client.info('server'))?.[1]);
      if (pid === options.pid) return true;
    } catch {
      // not up yet
    } finally {
      client.disconnect();
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`redis on port ${port} did not answer within ${timeoutMs} ms`);
}

/**
 * A Redis of the test's own with an ACL user `gateway` that may use every key and command, and
 * the pub/sub channels only with `allchannels` (Redis 7 gives a new user none: `resetchannels`).
 * `url` logs in as that user; `admin` is the default user's connection, for ACL changes meanwhile.
 */
export async function startRedisWithUser(
  channels: 'allchannels' | 'resetchannels',
  state: 'on' | 'off' = 'on',
): Promise<{ redis: RedisProcess; url: string; admin: Redis }> {
  const redis = await startRedisServer();
  const admin = redisClient(redis.url);
  await admin.call('ACL', 'SETUSER', 'gateway', state, '>gateway-password', '~*', channels, '+@all');
  return { redis, url: `redis://gateway:gateway-password@127.0.0.1:${redis.port}`, admin };
}
