import { existsSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { isAbsolute, relative } from 'node:path';
import type { DestinationStream } from 'pino';
import { createAdminApp } from './admin/app.js';
import { getRequestListener } from '@hono/node-server';
import type { Settings } from './config/settings.js';
import { TableHolder, type ReloadResult } from './config/table-holder.js';
import { watchFile, type FileWatch } from './lib/file-watcher.js';
import { formatSourceError } from './lib/yaml-source.js';
import { InvalidKeyGuard } from './keys/guard.js';
import { readKeyFile, type KeyFileLoad } from './keys/key-file.js';
import { KeyRegistry, MemoryIssuedKeyStore } from './keys/registry.js';
import { RedisIssuedKeyStore } from './redis/issued-keys.js';
import { Limiter } from './limits/limiter.js';
import { MemoryCounterStore } from './limits/memory-store.js';
import type { Clock } from './limits/windows.js';
import { createLogger, type Logger } from './observability/logger.js';
import { GatewayMetrics } from './observability/metrics.js';
import { Forwarder } from './proxy/forwarder.js';
import { WebSocketProxy } from './ws/bridge-proxy.js';
import { connectWithin, createRedisClient, createSubscriber, isReady, type RedisClient } from './redis/connection.js';
import { RedisCounterStore } from './redis/counter-store.js';
import { LocalEventBus, type EventBus } from './events/bus.js';
import { RedisEventBus } from './redis/events.js';
import { createPublicServer } from './server/http-server.js';
import { createPublicApp } from './server/public-app.js';
import { WebSocketConnections } from './ws/connections.js';
import { upgradeListener } from './server/upgrade.js';

/**
 * Wires one gateway instance: settings → counter store → limit table → keys → limiter →
 * public and admin listeners; and takes it down again in order.
 */

export interface GatewayOptions {
  readonly settings: Settings;
  readonly clock?: Clock;
  readonly logDestination?: DestinationStream;
  readonly logger?: Logger;
  /** Listen on the admin port (false in node:cluster workers: the primary has the one admin listener). */
  readonly admin?: boolean;
  /** Listen on the public port (false in the node:cluster primary: its workers serve). */
  readonly public?: boolean;
  /** Poll interval of the file watchers (tests shorten it). */
  readonly watchPollMs?: number;
  readonly metricsText?: () => Promise<string>;
}

export interface Gateway {
  readonly publicUrl: string | undefined;
  readonly adminUrl: string | undefined;
  readonly logger: Logger;
  readonly metrics: GatewayMetrics;
  readonly tables: TableHolder;
  readonly registry: KeyRegistry;
  readonly limiter: Limiter;
  readonly redis: RedisClient | undefined;
  /** Reloads the limit table and the key file (SIGHUP, the admin endpoint). */
  reload(trigger?: 'signal' | 'admin'): Promise<ReloadResult>;
  /** Stops accepting, lets requests in flight finish (bounded), closes WebSockets with 1001, then Redis. */
  stop(): Promise<void>;
}

export class StartupError extends Error {
  override name = 'StartupError';
}

const ISSUED_KEYS_POLL_MS = 500;

export async function startGateway(options: GatewayOptions): Promise<Gateway> {
  const { settings } = options;
  const logger = options.logger ?? createLogger(settings.logLevel, options.logDestination);
  const metrics = new GatewayMetrics();
  // As an operator would write it: relative to the working directory when inside it.
  const displayName = (path: string): string => {
    const rel = relative(process.cwd(), path);
    return rel === '' || rel.startsWith('..') || isAbsolute(rel) ? path : rel;
  };

  // Counter store
  let redis: RedisClient | undefined;
  let subscriber: RedisClient | undefined;
  let events: EventBus;
  const redisTarget = {
    url: settings.redisUrl,
    clusterNodes: settings.redisClusterNodes,
    commandTimeoutMs: settings.redisTimeoutMs,
  };
  if (settings.redisUrl || settings.redisClusterNodes) {
    redis = createRedisClient(redisTarget);
    redis.on('error', (err: Error) => logger.debug({ err: err.message }, 'redis error'));
    let wasReady = false;
    redis.on('ready', () => {
      if (wasReady) logger.warn('redis is back; counting in redis again');
      wasReady = true;
    });
    redis.on('close', () => {
      if (wasReady) logger.warn({ mode: settings.redisFailureMode }, 'redis connection lost');
    });
    if (!(await connectWithin(redis, Math.max(2000, settings.redisTimeoutMs * 10)))) {
      logger.warn(
        { mode: settings.redisFailureMode },
        'redis is not reachable at start-up; serving in failure mode until it is',
      );
    }
    subscriber = createSubscriber(redisTarget);
    subscriber.on('error', () => {});
    void subscriber.connect().catch(() => {});
    events = new RedisEventBus(redis, subscriber, `${settings.redisKeyPrefix}events`);
  } else {
    logger.warn('REDIS_URL is not set: counters live in this process, which suits one instance only');
    events = new LocalEventBus();
  }
  const store = redis
    ? new RedisCounterStore(redis, settings.redisKeyPrefix)
    : new MemoryCounterStore(options.clock ? { now: () => options.clock!.now() } : {});
  const limiter = new Limiter({
    store,
    insurance: redis ? new MemoryCounterStore(options.clock ? { now: () => options.clock!.now() } : {}) : undefined,
    failureMode: redis ? settings.redisFailureMode : 'closed',
    ...(options.clock ? { clock: options.clock } : {}),
    observer: metrics,
  });
  redis?.on('ready', () => limiter.storeAvailable());

  // Limit table
  const tables = new TableHolder({
    path: settings.limitsFile,
    displayName: displayName(settings.limitsFile),
    logger,
    metrics,
  });
  const first = await tables.reload('start');
  if (!first.ok) {
    await redis?.quit().catch(() => {});
    subscriber?.disconnect();
    throw new StartupError(first.errors.map(formatSourceError).join('\n'));
  }

  // API keys
  const registry = new KeyRegistry(
    redis ? new RedisIssuedKeyStore(redis, settings.redisKeyPrefix) : new MemoryIssuedKeyStore(),
    (err) => logger.debug({ err: (err as Error).message }, 'issued keys could not be checked'),
  );
  // The key file is optional: while there is none, only keys issued through the admin API pass.
  // It is watched all the same, so a file written later (or removed) takes effect.
  const keyFileName = displayName(settings.apiKeysFile);
  const readKeys = async (): Promise<KeyFileLoad> =>
    existsSync(settings.apiKeysFile)
      ? readKeyFile(settings.apiKeysFile, keyFileName, new Set(tables.current()?.plans.keys() ?? []))
      : { ok: true, keys: [] };
  const reloadKeyFile = async (): Promise<void> => {
    const result = await readKeys();
    if (!result.ok) {
      logger.error({ errors: result.errors.map(formatSourceError) }, 'key file refused; the keys in force stay');
      return;
    }
    registry.setFileKeys(result.keys);
    logger.info(
      { file: keyFileName, keys: result.keys.length },
      existsSync(settings.apiKeysFile) ? 'key file loaded' : 'no key file; only keys issued through the admin API pass',
    );
  };
  const keyFile = await readKeys();
  if (!keyFile.ok) throw new StartupError(keyFile.errors.map(formatSourceError).join('\n'));
  registry.setFileKeys(keyFile.keys);
  if (settings.apiKeyMode === 'registered') {
    logger.info(
      { file: keyFileName, keys: keyFile.keys.length },
      existsSync(settings.apiKeysFile) ? 'key file loaded' : 'no key file; only keys issued through the admin API pass',
    );
  }
  await registry
    .refresh()
    .catch((err: Error) => logger.warn({ err: err.message }, 'issued keys could not be loaded yet'));
  registry.startPolling(ISSUED_KEYS_POLL_MS);

  const guard = new InvalidKeyGuard({
    client: redis,
    prefix: settings.redisKeyPrefix,
    attempts: settings.invalidKeyAttempts,
    windowSeconds: settings.invalidKeyWindowSeconds,
    // Every instance refuses the address from now on, not only those that see it guess.
    onBlock: (address, ms) => void events.publish({ type: 'address-blocked', address, ms }).catch(() => {}),
  });
  events.subscribe((event) => {
    if (event.type === 'usage-reset') void limiter.forgetKey(event.keyHash, tables.current()?.rows ?? []);
    else if (event.type === 'keys-changed') void registry.refresh().catch(() => {});
    else if (event.type === 'address-blocked') guard.block(event.address, event.ms);
    else {
      // Messages may have been lost while the subscription was down.
      limiter.forgetAll();
      void registry.refresh().catch(() => {});
    }
  });
  tables.onChange((table, previous) => {
    if (previous) limiter.forgetAll();
    const missing = registry.list().filter((k) => k.plan !== undefined && !table.plans.has(k.plan));
    if (missing.length)
      logger.warn(
        { keys: missing.map((k) => k.id) },
        'keys name plans the table no longer has; they get the table as written',
      );
  });

  const reload = async (trigger: 'signal' | 'admin' = 'admin'): Promise<ReloadResult> => {
    const result = await tables.reload(trigger);
    if (result.ok) await reloadKeyFile();
    return result;
  };

  const bridgeOptions = {
    bridges: settings.bridges,
    timeoutMs: settings.upstreamTimeoutMs,
    onError: (err: Error, context: { bridge: string; phase: string }) =>
      logger.warn({ ...context, code: (err as NodeJS.ErrnoException).code, err: err.message }, 'bridge error'),
  };
  const forwarder = new Forwarder(bridgeOptions);
  const webSocketProxy = new WebSocketProxy(bridgeOptions);
  const websockets = new WebSocketConnections(metrics);
  const app = createPublicApp({
    settings,
    table: () => tables.current(),
    limiter,
    registry,
    guard,
    forwarder,
    webSocketProxy,
    websockets,
    metrics,
    logger,
  });

  let shuttingDown = false;
  const publicServer = createPublicServer(
    app,
    settings,
    logger,
    upgradeListener(app, () => !shuttingDown),
  );
  if (options.public !== false) await listen(publicServer.server, settings.port, settings.host);

  let adminServer: http.Server | undefined;
  if (options.admin !== false) {
    const adminApp = createAdminApp({
      adminToken: settings.adminToken,
      tables,
      limiter,
      registry,
      events,
      metrics,
      logger,
      storeProblem: async () => {
        if (!redis) return undefined;
        if (!isReady(redis)) return `counter store unreachable (${redis.status})`;
        try {
          await redis.ping();
          return limiter.storeTrouble();
        } catch (err) {
          return `counter store does not answer: ${(err as Error).message}`;
        }
      },
      shuttingDown: () => shuttingDown,
      reload: () => reload('admin'),
      ...(options.metricsText ? { metricsText: options.metricsText } : {}),
      apiKeyHeader: settings.apiKeyHeader,
      credentialRoutes: settings.credentialRoutes,
    });
    adminServer = http.createServer(getRequestListener(adminApp.fetch));
    await listen(adminServer, settings.adminPort, settings.adminHost);
  }

  // Reloads on change of the files on disk.
  tables.watch(options.watchPollMs);
  const keyFileWatch: FileWatch = watchFile(
    settings.apiKeysFile,
    () => void reloadKeyFile(),
    options.watchPollMs ? { pollMs: options.watchPollMs } : {},
  );

  const publicUrl = publicServer.server.listening ? urlOf(publicServer.server) : undefined;
  const adminUrl = adminServer ? urlOf(adminServer) : undefined;
  logger.info(
    {
      public: publicServer.server.listening ? boundAddress(publicServer.server) : undefined,
      admin: adminServer ? boundAddress(adminServer) : undefined,
      counters: redis ? (settings.redisClusterNodes ? 'redis-cluster' : 'redis') : 'memory',
      keys: settings.apiKeyMode,
    },
    'gateway listening',
  );

  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      shuttingDown = true;
      tables.close();
      keyFileWatch.close();
      registry.stop();
      const server = publicServer.server;
      if (server.listening) server.close();
      const deadline = Date.now() + settings.shutdownTimeoutMs;
      // Connections kept alive become idle as their last answer completes: close them as they do.
      while (publicServer.inFlight() > 0 && Date.now() < deadline) {
        server.closeIdleConnections();
        await sleep(25);
      }
      server.closeIdleConnections();
      await websockets.closeAll(Math.max(0, Math.min(2000, deadline - Date.now())));
      server.closeAllConnections();
      forwarder.close();
      await new Promise<void>((resolve) => (adminServer ? adminServer.close(() => resolve()) : resolve()));
      adminServer?.closeAllConnections();
      await events.close();
      if (store instanceof RedisCounterStore) {
        await store.reconcile();
        store.close();
      }
      if (redis) await redis.quit().catch(() => redis?.disconnect());
      logger.info('gateway stopped');
      logger.flush();
    })());

  return { publicUrl, adminUrl, logger, metrics, tables, registry, limiter, redis, reload, stop };
}

function listen(server: http.Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** host:port as bound (0.0.0.0 stays 0.0.0.0). */
function boundAddress(server: http.Server): string {
  const address = server.address() as AddressInfo;
  return address.family === 'IPv6' ? `[${address.address}]:${address.port}` : `${address.address}:${address.port}`;
}

/** A URL to reach the server at from this host (a wildcard address becomes loopback). */
function urlOf(server: http.Server): string {
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return `http://${host === '0.0.0.0' ? '127.0.0.1' : host === '[::]' ? '[::1]' : host}:${address.port}`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
