import type { Cluster, Redis } from 'ioredis';
import type { Settings } from '../config/settings.js';
import { LocalEventBus, type EventBus } from '../events/bus.js';
import { MemoryIssuedKeyStore, type IssuedKeyStore } from '../keys/registry.js';
import type { FailureMode } from '../limits/limiter.js';
import { MemoryCounterStore } from '../limits/memory-store.js';
import type { CounterStore } from '../limits/store.js';
import type { Clock } from '../limits/windows.js';
import type { Logger } from '../observability/logger.js';
import { connectWithin, createRedisClient, createSubscriber, isReady, type RedisClient } from '../redis/connection.js';
import { RedisCounterStore } from '../redis/counter-store.js';
import { RedisEventBus } from '../redis/events.js';
import { evictingNodes, onNewMasters } from '../redis/eviction.js';
import { RedisIssuedKeyStore } from '../redis/issued-keys.js';
import type { Closers } from './closers.js';
import { StartupError } from './startup-error.js';

/**
 * Where an instance keeps what it shares with the others (README "A request, step by step", docs/operations.md "When
 * parts fail"): the counters, the issued keys and the event channel — in Redis (or a Redis
 * Cluster), or in this process when no Redis is configured.
 */
export interface Backend {
  readonly kind: 'memory' | 'redis' | 'redis-cluster';
  readonly store: CounterStore;
  /** Per-instance counters used while Redis is away (insurance mode). */
  readonly insurance: CounterStore | undefined;
  readonly failureMode: FailureMode;
  readonly issuedKeys: IssuedKeyStore;
  readonly events: EventBus;
  /** The client the invalid-key guard counts in (rate-limiter-flexible takes ioredis as it is). */
  readonly client: (Redis | Cluster) | undefined;
  /** Undefined while the counter store answers; otherwise why it does not (for /readyz). */
  problem(): Promise<string | undefined>;
  /** Calls `listener` whenever the connection to Redis is (back) up. */
  onConnected(listener: () => void): void;
  /** Another instance reset a key's counters on these rows: what this one still holds to add to them goes. */
  forgetKey(keyHash: string, counterIds: readonly string[]): Promise<void>;
}

export interface BackendOptions {
  readonly logger: Logger;
  readonly clock?: Clock | undefined;
  /** Told how the merge calls the Redis store kept to send again ended (as LimiterObserver.merged). */
  readonly merged?: ((counters: number, result: 'ok' | 'failed') => void) | undefined;
}

export async function openBackend(settings: Settings, options: BackendOptions, closers: Closers): Promise<Backend> {
  if (!settings.redisUrl && !settings.redisClusterNodes) return memoryBackend(options);
  return redisBackend(settings, options, closers);
}

function memoryBackend(options: BackendOptions): Backend {
  options.logger.warn('REDIS_URL is not set: counters live in this process, which suits one instance only');
  const clock = options.clock;
  return {
    kind: 'memory',
    store: new MemoryCounterStore(clock ? { now: () => clock.now() } : {}),
    insurance: undefined,
    // Without Redis there is no outage to survive: the store is this process.
    failureMode: 'closed',
    issuedKeys: new MemoryIssuedKeyStore(),
    events: new LocalEventBus(),
    client: undefined,
    problem: () => Promise.resolve(undefined),
    onConnected: () => {},
    forgetKey: () => Promise.resolve(),
  };
}

async function redisBackend(settings: Settings, options: BackendOptions, closers: Closers): Promise<Backend> {
  const { logger, clock } = options;
  const target = {
    url: settings.redisUrl,
    clusterNodes: settings.redisClusterNodes,
    commandTimeoutMs: settings.redisTimeoutMs,
  };
  const redis = createRedisClient(target);
  closers.add('redis', () =>
    redis.quit().then(
      () => undefined,
      () => redis.disconnect(),
    ),
  );
  watchConnection(redis, settings.redisFailureMode, logger);
  const setting = settings.redisClusterNodes ? 'REDIS_CLUSTER_NODES' : 'REDIS_URL';
  const refusals = watchSettingRefusals(redis, setting, logger);
  const reachable = await connectWithin(redis, Math.max(2000, settings.redisTimeoutMs * 10));
  const refused = refusals.started();
  if (refused) throw new StartupError(`${setting}: ${refused}`, 'setting');
  if (!reachable) {
    logger.warn(
      { mode: settings.redisFailureMode },
      'redis is not reachable at start-up; serving in failure mode until it is',
    );
  }
  const subscriber = createSubscriber(target);
  closers.add('redis subscriber', () => subscriber.disconnect());
  subscriber.on('error', () => {});
  void subscriber.connect().catch(() => {});
  const channel = `${settings.redisKeyPrefix}events`;
  const events = new RedisEventBus(redis, subscriber, channel, (reason) =>
    logger.error(
      { channel, err: reason },
      "redis refused the events channel: the other instances do not hear this one's blocks, usage resets and key changes at once; give the redis user the channel",
    ),
  );
  closers.add('event bus', () => events.close());
  const store = new RedisCounterStore(redis, settings.redisKeyPrefix, { keptMergesSettled: options.merged });
  // Calls in doubt are settled while the connection is still there.
  closers.add('counter store', async () => {
    await store.reconcile();
    store.close();
    const kept = store.keptMergeCounters;
    if (kept > 0) logger.warn({ counters: kept }, 'units admitted while redis was away could not be added to it');
  });
  return {
    kind: settings.redisClusterNodes ? 'redis-cluster' : 'redis',
    store,
    insurance: new MemoryCounterStore(clock ? { now: () => clock.now() } : {}),
    failureMode: settings.redisFailureMode,
    issuedKeys: new RedisIssuedKeyStore(redis, settings.redisKeyPrefix),
    events,
    client: redis,
    problem: () => redisProblem(redis),
    onConnected: (listener) => void redis.on('ready', listener),
    forgetKey: (keyHash, counterIds) => store.forget(keyHash, counterIds),
  };
}

/** Warns of each Redis, or master of a Cluster, whose policy may evict counters (docs/operations.md "Redis"). */
export function warnOfEviction(redis: RedisClient, logger: Logger): void {
  onNewMasters(redis, (only) => {
    void evictingNodes(redis, only).then((nodes) => {
      for (const { node, policy } of nodes) {
        logger.warn(
          { node, policy },
          'redis may evict counters, and a key get its quota afresh: set maxmemory-policy noeviction',
        );
      }
    });
  });
}

function watchConnection(redis: RedisClient, mode: FailureMode, logger: Logger): void {
  redis.on('error', (err: Error) => logger.debug({ err: err.message }, 'redis error'));
  let wasReady = false;
  redis.on('ready', () => {
    if (wasReady) logger.warn('redis is back; counting in redis again');
    wasReady = true;
  });
  warnOfEviction(redis, logger);
  redis.on('close', () => {
    if (wasReady) logger.warn({ mode }, 'redis connection lost');
  });
}

/**
 * What Redis refuses of its setting. ioredis goes on in database 0 when it cannot select the
 * database REDIS_URL names (one the server does not have): the counters and issued keys would be
 * another database's, and nothing would say so. At start-up that is a wrong REDIS_URL (README
 * "Running it"); later, an error line. Credentials it refuses (`WRONGPASS`, `NOAUTH`) keep the
 * gateway in failure mode until it takes them (a user may be enabled after the gateway starts):
 * an error line, once until the connection is ready again.
 */
function watchSettingRefusals(redis: RedisClient, setting: string, logger: Logger): { started(): string | undefined } {
  let starting = true;
  let refused: string | undefined;
  let told: string | undefined;
  redis.on('ready', () => (told = undefined));
  redis.on('error', (err: Error & { command?: { name?: string; args?: unknown[] } }) => {
    if (err.command?.name === 'select') {
      refused = `database ${String(err.command.args?.[0])} cannot be selected (${err.message})`;
      if (!starting) logger.error(`${setting}: ${refused}; redis counts in database 0 now`);
    } else if (/^(?:WRONGPASS|NOAUTH)\b/.test(err.message) && told !== err.message) {
      told = err.message;
      logger.error(
        `${setting}: redis refused the credentials (${err.message}); serving in failure mode until it takes them`,
      );
    }
  });
  return {
    started: () => {
      starting = false;
      return refused;
    },
  };
}

async function redisProblem(redis: RedisClient): Promise<string | undefined> {
  if (!isReady(redis)) return `counter store unreachable (${redis.status})`;
  try {
    await redis.ping();
    return undefined;
  } catch (err) {
    return `counter store does not answer: ${(err as Error).message}`;
  }
}
