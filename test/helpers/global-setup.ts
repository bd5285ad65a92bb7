import { execFileSync } from 'node:child_process';
import { Redis } from 'ioredis';

/**
 * Before any test: build `dist/` from the current sources (tests that start the gateway as a
 * process run what `npm start` runs), and make sure the Redis the suite talks to answers.
 */
export default async function setup(): Promise<void> {
  execFileSync(process.execPath, ['node_modules/typescript/bin/tsc', '-p', 'tsconfig.build.json'], { stdio: 'inherit' });
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
}
