import { execFile, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { spawnRedis } from './redis.js';

/**
 * A Redis Cluster of the test's own: three masters (no replicas) started with the installed
 * `redis-server` on loopback ports, joined with `redis-cli --cluster create`, and stopped by
 * PID. Each node also needs its cluster bus port (port + 10000) free, so ports are drawn from
 * 20000–29999 (bus ports 30000–39999) and both are checked before use.
 */

export interface RedisCluster {
  /** `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`, as REDIS_CLUSTER_NODES takes it. */
  readonly nodes: string;
  readonly ports: readonly number[];
  readonly pids: readonly number[];
  /**
   * Starts one more node and joins it as a master without slots (`redis-cli --cluster add-node`);
   * resolves with its port (also added to `ports`) once every node knows it and serves.
   */
  addMaster(): Promise<number>;
  /** Kills every node by PID and removes the data directory. */
  stop(): Promise<void>;
}

const HOST = '127.0.0.1';
const MASTERS = 3;

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, HOST, () => server.close(() => resolve(true)));
  });
}

/** A port in 20000–29999 that is free, whose bus port (+10000) is free too, and not in `taken`. */
async function freeClusterPort(taken: ReadonlySet<number>): Promise<number> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const port = 20000 + Math.floor(Math.random() * 10000);
    if (taken.has(port)) continue;
    if ((await portIsFree(port)) && (await portIsFree(port + 10000))) return port;
  }
  throw new Error('no free loopback port pair (port, port + 10000) found in 20000-29999');
}

function waitExit(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
  });
}

function run(file: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(file, args, { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${file} ${args.join(' ')} failed: ${err.message}\n${stdout}\n${stderr}`));
      else resolve(stdout);
    });
  });
}

async function clusterStateOk(port: number): Promise<boolean> {
  const client = new Redis({
    port,
    host: HOST,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 500,
    commandTimeout: 500,
  });
  client.on('error', () => {});
  try {
    await client.connect();
    const info = await client.cluster('INFO');
    return /^cluster_state:ok\r?$/m.test(info);
  } catch {
    return false;
  } finally {
    client.disconnect();
  }
}

export async function startRedisCluster(options: { readyTimeoutMs?: number } = {}): Promise<RedisCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'oapi-redis-cluster-'));
  const children: ChildProcess[] = [];
  const ports: number[] = [];

  const stop = async (): Promise<void> => {
    for (const child of children) {
      if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
        try {
          process.kill(child.pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    }
    await Promise.all(children.map(waitExit));
    rmSync(dir, { recursive: true, force: true });
  };

  /** Starts one node; a port taken between the check and the bind makes it exit, and another is tried. */
  const launch = async (): Promise<void> => {
    let last = '';
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = await freeClusterPort(new Set(ports));
      const { child, outcome, output } = await spawnRedis(port, dir, [
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        join(dir, `nodes-${port}.conf`),
        '--cluster-node-timeout',
        '5000',
        '--appendonly',
        'no',
      ]);
      children.push(child);
      if (outcome === 'up') {
        ports.push(port);
        return;
      }
      last = `${outcome}\n${output()}`;
      child.kill('SIGKILL');
      await waitExit(child);
    }
    throw new Error(`redis-server (cluster mode) did not start after 5 attempts; the last: ${last}`);
  };

  try {
    for (let i = 0; i < MASTERS; i++) await launch();
    await run(
      'redis-cli',
      ['--cluster', 'create', ...ports.map((p) => `${HOST}:${p}`), '--cluster-replicas', '0', '--cluster-yes'],
      15_000,
    );

    const deadline = Date.now() + (options.readyTimeoutMs ?? 10_000);
    for (;;) {
      const states = await Promise.all(ports.map(clusterStateOk));
      if (states.every(Boolean)) break;
      if (Date.now() > deadline)
        throw new Error(`redis cluster on ports ${ports.join(', ')} did not reach cluster_state:ok in time`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (err) {
    await stop();
    throw err;
  }

  const addMaster = async (): Promise<number> => {
    await launch();
    const port = ports[ports.length - 1] as number;
    await run('redis-cli', ['--cluster', 'add-node', `${HOST}:${port}`, `${HOST}:${ports[0] as number}`], 15_000);
    const id = (await run('redis-cli', ['-h', HOST, '-p', String(port), 'CLUSTER', 'MYID'], 5_000)).trim();
    const deadline = Date.now() + 10_000;
    for (;;) {
      const views = await Promise.all(
        ports.map((p) => run('redis-cli', ['-h', HOST, '-p', String(p), 'CLUSTER', 'NODES'], 5_000)),
      );
      const states = await Promise.all(ports.map(clusterStateOk));
      if (views.every((view) => view.includes(id)) && states.every(Boolean)) return port;
      if (Date.now() > deadline) throw new Error(`the node on port ${port} did not become known to every node in time`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  return {
    nodes: ports.map((p) => `${HOST}:${p}`).join(','),
    ports,
    addMaster,
    pids: children.filter((c) => c.exitCode === null && c.signalCode === null).map((c) => c.pid ?? -1),
    stop,
  };
}
