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
 * The nodes (a single Redis, or every master of a Cluster) whose `maxmemory-policy` may evict
 * counters. A node that does not answer `CONFIG GET` (a managed Redis may rename or forbid it) is
 * left out: nothing is known of it.
 */
export async function evictingNodes(client: RedisClient): Promise<EvictingNode[]> {
  const nodes: Redis[] = client instanceof Cluster ? client.nodes('master') : [client];
  const policies = await Promise.all(nodes.map((node) => policyOf(node)));
  return nodes.flatMap((node, i) => {
    const policy = policies[i];
    if (policy === undefined || policy === 'noeviction') return [];
    return [{ node: `${node.options.host ?? ''}:${node.options.port ?? ''}`, policy }];
  });
}

async function policyOf(node: Redis): Promise<string | undefined> {
  try {
    const reply: unknown = await node.config('GET', 'maxmemory-policy');
    return Array.isArray(reply) && typeof reply[1] === 'string' ? reply[1] : undefined;
  } catch {
    return undefined;
  }
}
