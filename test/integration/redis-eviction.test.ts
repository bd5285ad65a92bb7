import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedisClient, connectWithin, type RedisClient } from '../../src/redis/connection.js';
import { evictingNodes } from '../../src/redis/eviction.js';
import { waitFor } from '../helpers/faults.js';
import { startTestGateway } from '../helpers/gateway.js';
import { startRedisServer, type RedisProcess } from '../helpers/redis.js';

/**
 * A Redis that may evict keys under memory pressure can drop a key's counters (they all expire)
 * and give it its quota afresh. The gateway cannot stop that, but says so on every connection
 * (docs/operations.md "Redis"). Redises of the test's own, whose policy it may change.
 */

let evicting: RedisProcess;
let noConfig: RedisProcess;
const clients: RedisClient[] = [];

async function clientOf(url: string): Promise<RedisClient> {
  const client = createRedisClient({ url, commandTimeoutMs: 1000 });
  client.on('error', () => {});
  clients.push(client);
  await connectWithin(client, 5000);
  return client;
}

beforeAll(async () => {
  evicting = await startRedisServer({ args: ['--maxmemory-policy', 'allkeys-lru'] });
  // A managed Redis may forbid CONFIG: nothing is known then, and nothing is said.
  noConfig = await startRedisServer({ args: ['--maxmemory-policy', 'allkeys-lru', '--rename-command', 'CONFIG', ''] });
}, 20_000);

afterAll(async () => {
  for (const client of clients) client.disconnect();
  await evicting?.stop();
  await noConfig?.stop();
});

describe('a Redis whose maxmemory-policy may evict counters', () => {
  it('is named with its policy, and no longer once the policy is noeviction', async () => {
    const client = await clientOf(evicting.url);
    expect(await evictingNodes(client)).toEqual([{ node: `127.0.0.1:${evicting.port}`, policy: 'allkeys-lru' }]);
    await client.config('SET', 'maxmemory-policy', 'volatile-ttl');
    expect(await evictingNodes(client)).toEqual([{ node: `127.0.0.1:${evicting.port}`, policy: 'volatile-ttl' }]);
    await client.config('SET', 'maxmemory-policy', 'noeviction');
    expect(await evictingNodes(client)).toEqual([]);
    await client.config('SET', 'maxmemory-policy', 'allkeys-lru');
  });

  it('is not named when it does not answer CONFIG GET', async () => {
    const client = await clientOf(noConfig.url);
    await expect(client.config('GET', 'maxmemory-policy')).rejects.toThrow(/unknown command/i);
    expect(await evictingNodes(client)).toEqual([]);
  });

  it('gets a warning in the gateway log when the gateway connects to it', async () => {
    const gw = await startTestGateway({ redis: evicting.url });
    try {
      const warned = () =>
        gw.logs.filter((l) => typeof l.msg === 'string' && l.msg.startsWith('redis may evict counters'));
      await waitFor('the eviction warning', () => warned().length > 0, 5000);
      expect(warned()).toHaveLength(1);
      expect(warned()[0]).toMatchObject({ level: 'warn', node: `127.0.0.1:${evicting.port}`, policy: 'allkeys-lru' });
    } finally {
      await gw.stop();
    }
  });
});
