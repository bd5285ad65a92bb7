import { Cluster, type Redis } from 'ioredis';
import type { RedisClient } from './connection.js';

/**
 * Every counter has an expiry (shortly after its day window ends), so a Redis whose `maxmemory-policy`
 * evicts keys under memory pressure, `volatile-*` as much as `allkeys-*`, can drop a key's counters
 * and give it its quota afresh without a word. Under `noeviction` (Redis's default) a full Redis
 * refuses the writes instead, and the gateway serves in its failure mode (docs/operations.md
 * "Redis").
 */

/** A node whose policy may evict counters. */
export interface EvictingNode {
  /** `host:port`. */
  readonly node: string;
  readonly policy: string;
}

/**
 * The nodes (a single Redis, or every master of a Cluster, or `only` those) whose
 * `maxmemory-policy` may evict counters. A node that does not answer `CONFIG GET` (a managed Redis may rename or forbid it) is
 * left out: nothing is known of it.
 */
export async function evictingNodes(client: RedisClient, only?: readonly Redis[]): Promise<EvictingNode[]> {
  const nodes: readonly Redis[] = only ?? (client instanceof Cluster ? client.nodes('master') : [client]);
  const policies = await Promise.all(nodes.map((node) => policyOf(node)));
  return nodes.flatMap((node, i) => {
    const policy = policies[i];
    if (policy === undefined || policy === 'noeviction') return [];
    return [{ node: nodeName(node), policy }];
  });
}

/**
 * Calls `check` for the nodes to look at: on every connection of a single Redis (the Redis behind
 * the address may be another one now), and on a Cluster for each node that has become a master
 * since the last look (at the first slot map, a replica a failover promoted, a node given slots),
 * all of them again after the client reconnects.
 */
export function onNewMasters(client: RedisClient, check: (nodes?: readonly Redis[]) => void): void {
  if (!(client instanceof Cluster)) {
    client.on('ready', () => check());
    return;
  }
  let seen = new Set<string>();
  // The slot map is read while the client connects too: its masters are looked at once it is ready.
  const look = (): void => {
    if (client.status !== 'ready') return;
    const masters = client.nodes('master');
    const fresh = masters.filter((node) => !seen.has(nodeName(node)));
    seen = new Set(masters.map(nodeName));
    if (fresh.length > 0) check(fresh);
  };
  client.on('ready', look);
  client.on('refresh', look);
  client.on('close', () => {
    seen = new Set();
  });
}

function nodeName(node: Redis): string {
  return `${node.options.host ?? ''}:${node.options.port ?? ''}`;
}

async function policyOf(node: Redis): Promise<string | undefined> {
  try {
    const reply: unknown = await node.config('GET', 'maxmemory-policy');
    return Array.isArray(reply) && typeof reply[1] === 'string' ? reply[1] : undefined;
  } catch {
    return undefined;
  }
}
