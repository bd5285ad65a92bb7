import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';

/**
 * Before any test: build `dist/` from the current sources (tests that start the gateway as a
 * process run what `npm start` runs), and make sure the Redis the suite talks to answers.
 * Every key the run writes there starts with `test:<run>:` (helpers/redis.ts uniquePrefix);
 * after the run they are deleted, and a run going on beside it keeps its own. The redis-servers
 * tests start of their own and leave running (a test that failed before stopping its own) are
 * killed after the run (helpers/redis.ts spawnRedis).
 */
export default async function setup(): Promise<() => Promise<void>> {
  const run = randomBytes(4).toString('hex');
  process.env.OAPI_TEST_RUN = run;
  const redisPids = mkdtempSync(join(tmpdir(), 'oapi-test-redis-pids-'));
  process.env.OAPI_TEST_REDIS_PIDS = redisPids;
  execFileSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], {
    stdio: 'inherit',
  });
  // The package's bin, run by `npx oapi-gateway` (as `npm run build` leaves it).
  chmodSync('dist/cli.js', 0o755);
  const url = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: 2000 });
  try {
    await redis.connect();
    await redis.ping();
  } catch {
    throw new Error(`the test suite needs a Redis at ${url} (set REDIS_URL)`);
  } finally {
    redis.disconnect();
  }
  return async function teardown() {
    killLeftRedisServers(redisPids);
    const client = new Redis(url, { maxRetriesPerRequest: 1 });
    try {
      let cursor = '0';
      for (let i = 0; i < 10_000; i++) {
        const [next, keys] = await client.scan(cursor, 'MATCH', `test:${run}:*`, 'COUNT', 1000);
        if (keys.length) await client.unlink(...keys);
        cursor = next;
        if (cursor === '0') break;
      }
    } finally {
      client.disconnect();
    }
  };
}

/** Kills each redis-server named in `dir` that still runs (by PID, after checking it is one), and removes `dir`. */
function killLeftRedisServers(dir: string): void {
  for (const name of readdirSync(dir)) {
    const pid = Number(name);
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('redis-server')) process.kill(pid, 'SIGKILL');
    } catch {
      // Gone already.
    }
  }
  rmSync(dir, { recursive: true, force: true });
}
