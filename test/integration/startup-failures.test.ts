import { spawn, type ChildProcess } from 'node:child_process';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/settings.js';
import { startGateway, StartupError } from '../../src/runner.js';
import { outputOf } from '../helpers/child-gateway.js';
import { SHIPPED_LIMITS } from '../helpers/gateway.js';
import { redisClient, refusingPort, startRedisServer, uniquePrefix, type RedisProcess } from '../helpers/redis.js';

/**
 * A start-up step that fails closes everything the steps before it opened (README "Running it"):
 * the Redis connections, the admin listener, the watchers. Each case runs against a Redis of its
 * own, whose client list shows what the gateway left open.
 */

let redis: RedisProcess;
let dir: string;
beforeAll(async () => {
  redis = await startRedisServer();
  dir = mkdtempSync(join(tmpdir(), 'oapi-startup-'));
});
afterAll(async () => {
  await redis?.stop();
});

/** Connections to the test's Redis other than the one asking. */
async function gatewayConnections(): Promise<number> {
  const inspector = redisClient(redis.url);
  try {
    const list = (await inspector.call('CLIENT', 'LIST')) as string;
    return list.split('\n').filter((line) => line.includes('name=oapi-gateway')).length;
  } finally {
    inspector.disconnect();
  }
}

function refused(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', () => resolve(true));
  });
}

async function start(env: Record<string, string>): Promise<unknown> {
  const limits = join(dir, `limits-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(limits, env.LIMITS ?? SHIPPED_LIMITS);
  const settings = loadSettings({
    cwd: dir,
    env: {
      EQT_BRIDGE_URL: 'http://127.0.0.1:9',
      FNO_BRIDGE_URL: 'http://127.0.0.1:9',
      REDIS_URL: redis.url,
      HOST: '127.0.0.1',
      ADMIN_HOST: '127.0.0.1',
      PORT: '0',
      ADMIN_PORT: '0',
      LOG_LEVEL: 'silent',
      LIMITS_FILE: limits,
      ...env,
    },
  });
  try {
    const gateway = await startGateway({ settings, watchPollMs: 100 });
    await gateway.stop();
    return 'started';
  } catch (err) {
    return err;
  }
}

async function expectNothingOpen(): Promise<void> {
  // A disconnect reaches Redis a moment later.
  for (let i = 0; i < 40 && (await gatewayConnections()) > 0; i++) await new Promise((r) => setTimeout(r, 25));
  expect(await gatewayConnections()).toBe(0);
}

describe('a start-up step that fails', () => {
  it('(an invalid limit table) closes the Redis connections opened before it', async () => {
    const err = await start({ LIMITS: 'limits: []\n' });
    expect(err).toBeInstanceOf(StartupError);
    await expectNothingOpen();
  });

  it('(a LIMITS_FILE that does not exist) says so in one line naming LIMITS_FILE', async () => {
    const missing = join(dir, 'no-such-limits.yaml');
    const err = await start({ LIMITS_FILE: missing });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as StartupError).reason).toBe('setting');
    expect((err as Error).message).toBe(`LIMITS_FILE=${missing}: file not found`);
    await expectNothingOpen();
  });

  it('(a limits_file of config/gateway.yaml that does not exist) says where it was set (regression: only LIMITS_FILE, which was not set)', async () => {
    writeFileSync(join(dir, 'gw-missing-limits.yaml'), 'limits_file: no-such-limits.yaml\n');
    // An empty variable is an unset one.
    const err = await start({ LIMITS_FILE: '', GATEWAY_CONFIG: 'gw-missing-limits.yaml' });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toBe(
      `LIMITS_FILE=${join(dir, 'no-such-limits.yaml')} (limits_file in gw-missing-limits.yaml): file not found`,
    );
    await expectNothingOpen();
  });

  it('(a LIMITS_FILE that is a directory) says so in one line naming LIMITS_FILE', async () => {
    const err = await start({ LIMITS_FILE: dir });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as StartupError).reason).toBe('setting');
    expect((err as Error).message).toBe(`LIMITS_FILE=${dir}: not a file`);
    await expectNothingOpen();
  });

  it('(a REDIS_URL database the server does not have) says so in one line naming REDIS_URL', async () => {
    // ioredis would go on in database 0, and the counters and issued keys be another database's.
    const err = await start({ REDIS_URL: `${redis.url}/99` });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as StartupError).reason).toBe('setting');
    expect((err as Error).message).toBe('REDIS_URL: database 99 cannot be selected (ERR DB index is out of range)');
    await expectNothingOpen();
  });

  it('(an invalid key file) closes the Redis connections and the table watch', async () => {
    const keys = join(dir, 'bad-keys.yaml');
    writeFileSync(keys, 'keys:\n  - id: x\n    sha256: nope\n');
    const err = await start({ API_KEYS_FILE: keys });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toMatch(/sha256 must be 64 hex digits/);
    await expectNothingOpen();
  });

  it('(the public port in use) says so in one line naming PORT, and closes the admin listener it had opened', async () => {
    // The blocker takes a port the kernel picks, which no other test can take first.
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const port = (blocker.address() as net.AddressInfo).port;
    // Out of the kernel's range: no other test's socket takes it before the check below.
    const adminPort = await refusingPort();
    try {
      const err = await start({ PORT: String(port), ADMIN_PORT: String(adminPort) });
      expect(err).toBeInstanceOf(StartupError);
      expect((err as Error).message).toBe(`PORT=${port}: the port is already in use (127.0.0.1:${port})`);
      expect(await refused(adminPort)).toBe(true);
      await expectNothingOpen();
    } finally {
      blocker.close();
    }
  });

  it('(the admin port in use) says so in one line naming ADMIN_PORT', async () => {
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const adminPort = (blocker.address() as net.AddressInfo).port;
    try {
      const err = await start({ ADMIN_PORT: String(adminPort) });
      expect((err as Error).message).toBe(
        `ADMIN_PORT=${adminPort}: the port is already in use (127.0.0.1:${adminPort})`,
      );
      await expectNothingOpen();
    } finally {
      blocker.close();
    }
  });

  it('(a HOST that is no address of this host) says so in one line naming HOST, not PORT', async () => {
    // TEST-NET-1 (RFC 5737): never an address of this host, and refused without a packet sent
    // (a name that does not resolve would be asked of the resolver, off this host).
    const err = await start({ HOST: '192.0.2.1' });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toBe('HOST=192.0.2.1: not an address of this host (192.0.2.1:0)');
    await expectNothingOpen();
  });

  it('(an ADMIN_HOST not of this host) says so in one line naming ADMIN_HOST, not ADMIN_PORT', async () => {
    // TEST-NET-1 (RFC 5737): never an address of this host.
    const err = await start({ ADMIN_HOST: '192.0.2.1' });
    expect(err).toBeInstanceOf(StartupError);
    expect((err as Error).message).toBe('ADMIN_HOST=192.0.2.1: not an address of this host (192.0.2.1:0)');
    await expectNothingOpen();
  });

  it('and a start that succeeds leaves nothing open after stop()', async () => {
    expect(await start({})).toBe('started');
    await expectNothingOpen();
  });
});

/** The exit code of a child once its output is all read, or 'still running' (and it is killed) after `ms`. */
function exitOf(child: ChildProcess, ms: number): Promise<number | 'still running'> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      // Its workers exit as their channel to it closes.
      child.kill('SIGKILL');
      resolve('still running');
    }, ms);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve(code ?? -1);
    });
  });
}

describe('WORKERS=2 with a public listener that cannot be had', () => {
  // The workers listen on the public port, the primary on the admin one only: the failure is a
  // worker's (regression: the primary restarted the workers for ever and /readyz said ok).
  it.each([
    ['the port in use', 'PORT'],
    ['a HOST that is no address of this host', 'HOST'],
  ])('(%s) ends start-up with exit 1 and the one line naming %s, as one process does', async (_case, variable) => {
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    const port = (blocker.address() as net.AddressInfo).port;
    const limits = join(dir, 'workers-limits.yaml');
    writeFileSync(limits, SHIPPED_LIMITS);
    const host = variable === 'HOST' ? '192.0.2.1' : '127.0.0.1';
    try {
      const child = spawn(process.execPath, [new URL('../../dist/main.js', import.meta.url).pathname], {
        cwd: dir,
        env: {
          PATH: process.env.PATH,
          WORKERS: '2',
          PORT: String(port),
          HOST: host,
          ADMIN_PORT: '0',
          EQT_BRIDGE_URL: 'http://127.0.0.1:9',
          FNO_BRIDGE_URL: 'http://127.0.0.1:9',
          REDIS_URL: redis.url,
          REDIS_KEY_PREFIX: uniquePrefix('workers-listen'),
          LIMITS_FILE: limits,
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      const output = outputOf(child);
      expect(await exitOf(child, 15_000)).toBe(1);
      const line =
        variable === 'HOST'
          ? `HOST=192.0.2.1: not an address of this host (192.0.2.1:${port})`
          : `PORT=${port}: the port is already in use (127.0.0.1:${port})`;
      // Both workers fail; the line is said once.
      expect(output.stderr()).toBe(`oapi-gateway: ${line}\n`);
    } finally {
      blocker.close();
    }
  });
});
