import { Cluster, Redis, type ClusterNode, type ClusterOptions, type Command, type RedisOptions } from 'ioredis';

/**
 * Redis clients for the counters. Tuned so that no request waits long on a Redis that is
 * down or slow (docs/operations.md "Redis"): commands fail at once while disconnected
 * (no offline queue), time out after `commandTimeoutMs`, and are never re-sent after a
 * reconnect (a re-sent increment could count a request twice). A single Redis's connection that
 * stays silent while commands wait on it is closed and opened again (silentConnectionMs), and
 * holds at most MAX_COMMANDS_WAITING of them meanwhile (CountersRedis).
 *
 * No auto-pipelining: ioredis keeps one auto-pipeline in flight per connection and queues later
 * commands behind it, so while Redis is slow a request could wait for the one before it to time out
 * and then for its own timeout too. The counter store batches a turn's requests itself
 * (redis/consume-batcher.ts); every command starts its own REDIS_TIMEOUT_MS when it is sent.
 */

export type RedisClient = Redis | Cluster;

export interface RedisTarget {
  readonly url?: string | undefined;
  readonly clusterNodes?: ReadonlyArray<{ host: string; port: number }> | undefined;
  readonly commandTimeoutMs: number;
}

const reconnectDelay = (times: number): number => Math.min(50 * 2 ** Math.min(times, 6), 2000);

function commonOptions(commandTimeoutMs: number): RedisOptions {
  return {
    // Shown by CLIENT LIST: which process holds a connection.
    connectionName: `oapi-gateway:${process.pid}`,
    commandTimeout: commandTimeoutMs,
    connectTimeout: Math.max(1000, commandTimeoutMs * 4),
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    enableAutoPipelining: false,
    lazyConnect: true,
  };
}

/** The counters' Cluster client options. */
function clusterOptions(commandTimeoutMs: number): ClusterOptions {
  return {
    enableOfflineQueue: false,
    enableAutoPipelining: false,
    lazyConnect: true,
    clusterRetryStrategy: reconnectDelay,
    // ioredis sends a command again when its node's connection closed, also one that ran and whose
    // reply was lost, and also after the command has failed (timed out) and its units were taken
    // back: never (docs/operations.md "Redis": no unit is counted twice). Without that retry a
    // command for a node whose connection is still opening fails (a node not yet connecting takes
    // it), so connectWithin opens every master's connection before the gateway serves.
    retryDelayOnFailover: 0,
    // Nor a while after a CLUSTERDOWN answer (a slot no master serves): ioredis would send the
    // command again later through its delay queue, past CountersCluster's guard, even after it
    // had timed out. At 0 the answer fails the command as Redis's refusal: nothing ran.
    retryDelayOnClusterDown: 0,
    // Node connections stay lazy: ioredis's ready check fails on a node still connecting, and
    // eager ones made it reconnect over and over.
    redisOptions: commonOptions(commandTimeoutMs),
  };
}

/**
 * The counters' Cluster client: a command that has failed (timed out) never follows a redirection
 * that comes for it afterwards. ioredis sends a command on at once wherever a master's answer
 * points it (MOVED, ASK), even one it has already rejected: a consume call that timed out on a
 * master whose slot has moved since is then run by the new master after its receipt's undo ran
 * there, and counts once more (docs/operations.md "Redis": no unit is counted twice). ioredis
 * follows redirections through the `reject` it puts on each command it sends without a node;
 * this puts one more in front of it, which drops what comes once the command's promise has
 * failed. (The answers ioredis retries after a delay instead, CLUSTERDOWN and TRYAGAIN, go
 * through its delay queue, which this cannot see: clusterOptions makes CLUSTERDOWN final, and
 * TRYAGAIN only comes for commands of several keys, which the counters never send to a Cluster.)
 * test/integration/redis-cluster.test.ts pins both on a real cluster.
 */
export class CountersCluster extends Cluster {
  override sendCommand(command: Command, stream?: Parameters<Cluster['sendCommand']>[1], node?: unknown): unknown {
    const sent = super.sendCommand(command, stream, node);
    if (node === undefined && !guarded.has(command)) {
      guarded.add(command);
      let failed = false;
      command.promise.catch(() => {
        failed = true;
      });
      const followRedirection = command.reject;
      command.reject = (err: Error): void => {
        if (!failed) followRedirection(err);
      };
    }
    return sent;
  }
}

/** Commands a CountersCluster has put its guard on (ioredis puts its own on a command once, too). */
const guarded = new WeakSet<Command>();

/** A Cluster client for the counters; `extra` options for tests (natMap). */
export function createClusterClient(
  nodes: readonly ClusterNode[],
  commandTimeoutMs: number,
  extra: Partial<ClusterOptions> = {},
): CountersCluster {
  return new CountersCluster([...nodes], { ...clusterOptions(commandTimeoutMs), ...extra });
}

/**
 * Commands sent on one connection and not answered yet, at most (docs/operations.md "Redis").
 * Far more than are out with a Redis that answers, even a slow one under load: with batching,
 * counting sends a few calls at a time.
 */
export const MAX_COMMANDS_WAITING = 10_000;

/** A command not sent: MAX_COMMANDS_WAITING wait on the connection for an answer already. */
export class RedisBehindError extends Error {
  constructor() {
    super(`Redis is behind: ${MAX_COMMANDS_WAITING} commands wait for an answer`);
    this.name = 'RedisBehindError';
  }
}

/**
 * Commands sent on one connection and not answered yet. A command that timed out stays among them
 * until its answer comes: Redis answers in order, so ioredis keeps its place.
 */
export function commandsWaiting(client: RedisClient): number {
  return client instanceof Redis ? client.commandQueue.length : 0;
}

/**
 * The counters' client for one Redis: a command beyond MAX_COMMANDS_WAITING fails at once, unsent.
 * A Redis that stops answering (a stopped process, a proxy that no longer forwards) keeps its
 * connection, and a command that times out stays queued in ioredis, with its arguments, until
 * its answer comes: every request of an unknown key, every readiness probe and the key poller
 * would add one for as long as the stall lasts. (Commands of a pipeline or a transaction are written
 * together, so one of them is never held back alone: those pass.)
 */
export class CountersRedis extends Redis {
  override sendCommand(command: Command, stream?: Parameters<Redis['sendCommand']>[1]): unknown {
    if (stream === undefined && this.status === 'ready' && this.commandQueue.length >= MAX_COMMANDS_WAITING) {
      command.reject(new RedisBehindError());
      return command.promise;
    }
    return super.sendCommand(command, stream);
  }
}

export function createRedisClient(target: RedisTarget): RedisClient {
  if (target.clusterNodes && target.clusterNodes.length > 0) {
    return createClusterClient(target.clusterNodes, target.commandTimeoutMs);
  }
  if (!target.url) throw new Error('createRedisClient: neither a URL nor cluster nodes');
  const options = commonOptions(target.commandTimeoutMs);
  return new CountersRedis(target.url, {
    ...options,
    enableOfflineQueue: false,
    retryStrategy: reconnectDelay,
    socketTimeout: silentConnectionMs(target.commandTimeoutMs),
  });
}

/**
 * How long a connection may stay silent while commands wait on it before it is closed and opened
 * again (docs/operations.md "Redis"). A proxy that stops forwarding keeps the connection up for
 * good, while a new one may reach Redis at once; a slow Redis that still answers sends something
 * far sooner (every command times out after `commandTimeoutMs`).
 */
export function silentConnectionMs(commandTimeoutMs: number): number {
  return Math.max(5000, commandTimeoutMs * 10);
}

/**
 * A client for subscribing to the event channel: it keeps an offline queue so that its
 * subscription survives reconnects (ioredis re-subscribes by itself).
 */
export function createSubscriber(target: RedisTarget): RedisClient {
  const options: RedisOptions = {
    ...commonOptions(target.commandTimeoutMs),
    commandTimeout: undefined,
    enableAutoPipelining: false,
    maxRetriesPerRequest: null,
  };
  if (target.clusterNodes && target.clusterNodes.length > 0) {
    return new Cluster([...target.clusterNodes], {
      lazyConnect: true,
      clusterRetryStrategy: reconnectDelay,
      redisOptions: options,
    });
  }
  if (!target.url) throw new Error('createSubscriber: neither a URL nor cluster nodes');
  return new Redis(target.url, { ...options, retryStrategy: reconnectDelay });
}

export function isReady(client: RedisClient): boolean {
  return client.status === 'ready';
}

/**
 * Connects, waiting at most `timeoutMs` (not at all once the connection is refused); a Redis that
 * is down at start-up is not fatal (it reconnects by itself). On a Cluster, until the connection
 * to every master is ready too. Readiness is polled: a Cluster whose ready check fails reconnects
 * by itself and never settles the promise connect() returned.
 */
export async function connectWithin(client: RedisClient, timeoutMs: number): Promise<boolean> {
  let refused = false;
  if (client.status === 'wait')
    client.connect().catch(() => {
      refused = true;
    });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (connected(client)) return true;
    if (refused || Date.now() >= deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Ready to count: on a Cluster, every master's connection too (this opens those not opened yet). */
function connected(client: RedisClient): boolean {
  if (client.status !== 'ready') return false;
  if (!(client instanceof Cluster)) return true;
  const masters = client.nodes('master');
  for (const node of masters) if (node.status === 'wait') node.connect().catch(() => {});
  // Every master the slot map names has a ready connection (a master that is down has none).
  const named = new Set(client.slots.map((nodes) => nodes[0]).filter((key) => key !== undefined));
  return named.size > 0 && masters.length >= named.size && masters.every((node) => node.status === 'ready');
}
