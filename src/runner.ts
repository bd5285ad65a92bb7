import { isAbsolute, relative } from 'node:path';
import type { DestinationStream } from 'pino';
import { createAdminApp, type AdminReloadResult } from './admin/app.js';
import { strayRoutes } from './config/route-settings.js';
import type { Settings } from './config/settings.js';
import { TableHolder, type ReloadResult } from './config/table-holder.js';
import type { KeyRegistry } from './keys/registry.js';
import { formatSourceError } from './lib/yaml-source.js';
import type { LimitTable } from './limits/limit-table.js';
import { Limiter } from './limits/limiter.js';
import type { Clock } from './limits/windows.js';
import { createLogger, type Logger } from './observability/logger.js';
import { GatewayMetrics } from './observability/metrics.js';
import { Forwarder } from './proxy/forwarder.js';
import { createPublicApp } from './server/public-app.js';
import { openBackend, type Backend } from './wiring/backend.js';
import { Closers } from './wiring/closers.js';
import { assembleKeys, type KeyAssembly } from './wiring/keys.js';
import { startAdminServer, startPublicServer, type Listening } from './wiring/servers.js';
import { StartupError } from './wiring/startup-error.js';
import { WebSocketProxy } from './ws/bridge-proxy.js';
import { WebSocketConnections } from './ws/connections.js';

/**
 * Wires one gateway instance in a few steps — the backend (memory or Redis), the limit table, the
 * keys, the limiter, the two listeners — each registering what it opened with the closers. stop()
 * runs them in reverse order of construction; a step that fails at start-up does the same for what
 * was opened before it, so a failed start leaves nothing open.
 */

export { StartupError };

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
  /** Why the instance serves no public request although it runs (the node:cluster primary without a serving worker). */
  readonly notServing?: () => string | undefined;
  /** The rest of an admin reload that took a table here (the node:cluster primary: its workers' reloads). */
  readonly reloadElsewhere?: (own: Extract<ReloadResult, { ok: true }>) => Promise<AdminReloadResult>;
}

export interface Gateway {
  readonly publicUrl: string | undefined;
  readonly adminUrl: string | undefined;
  readonly logger: Logger;
  readonly metrics: GatewayMetrics;
  readonly tables: TableHolder;
  readonly registry: KeyRegistry;
  readonly limiter: Limiter;
  /** The Redis client of the counters (absent without Redis). */
  readonly redis: Backend['client'];
  /** Reloads the limit table and the key file (SIGHUP, the admin endpoint). */
  reload(trigger?: 'signal' | 'admin'): Promise<ReloadResult>;
  /** Stops accepting, lets requests in flight finish (bounded), closes WebSockets with 1001, then Redis. */
  stop(): Promise<void>;
}

/** What the steps share. */
interface Parts {
  readonly settings: Settings;
  readonly options: GatewayOptions;
  readonly logger: Logger;
  readonly metrics: GatewayMetrics;
  readonly closers: Closers;
  readonly displayName: (path: string) => string;
}

export async function startGateway(options: GatewayOptions): Promise<Gateway> {
  const { settings } = options;
  const logger = options.logger ?? createLogger(settings.logLevel, options.logDestination);
  const closers = new Closers();
  closers.add('log', () => logger.flush());
  const parts: Parts = { settings, options, logger, metrics: new GatewayMetrics(), closers, displayName };
  try {
    return await start(parts);
  } catch (err) {
    await closers.closeAll((name, e) => logger.warn({ step: name, err: (e as Error).message }, 'could not close'));
    throw err;
  }
}

/** The limiter over the backend's stores; on shutdown it hands the store what it admitted without it. */
function openLimiter(parts: Parts, backend: Backend): Limiter {
  const { options, logger, metrics, closers } = parts;
  const limiter = new Limiter({
    store: backend.store,
    insurance: backend.insurance,
    failureMode: backend.failureMode,
    ...(options.clock ? { clock: options.clock } : {}),
    observer: metrics,
  });
  backend.onConnected(() => limiter.storeAvailable());
  // Closed after the listeners and before the store: no request comes any more, and the store is still there.
  closers.add('outage units', async () => {
    const waiting = await limiter.mergeWaiting();
    if (waiting > 0) logger.warn({ counters: waiting }, 'units admitted while redis was away could not be added to it');
  });
  return limiter;
}

async function start(parts: Parts): Promise<Gateway> {
  const { settings, options, logger, metrics, closers } = parts;
  const backend = await openBackend(
    settings,
    { logger, clock: options.clock, merged: (counters, result) => metrics.merged(counters, result) },
    closers,
  );
  const limiter = openLimiter(parts, backend);
  const tables = await loadTables(parts);
  const keys = await assembleKeys(settings, backend, tables, logger, closers, {
    displayName,
    watchPollMs: options.watchPollMs,
  });
  followEvents(backend, limiter, tables, keys, logger);
  const reload = async (trigger: 'signal' | 'admin' = 'admin'): Promise<ReloadResult> => {
    const since = keys.keyFileClock();
    const result = await tables.reload(trigger);
    // A new table that changed the plans has read the key file already: once is enough.
    await keys.reloadKeyFile(since);
    return result;
  };
  let shuttingDown = false;
  const admin =
    options.admin === false
      ? undefined
      : await startAdminServer(
          createAdminApp({
            adminToken: settings.adminToken,
            tables,
            limiter,
            registry: keys.registry,
            guard: keys.guard,
            apiKeyMode: settings.apiKeyMode,
            keysReady: keys.ready,
            events: backend.events,
            metrics,
            logger,
            storeProblem: async () => (await backend.problem()) ?? limiter.storeTrouble(),
            shuttingDown: () => shuttingDown,
            reload: async () => {
              const own = await reload('admin');
              return own.ok && options.reloadElsewhere ? options.reloadElsewhere(own) : own;
            },
            ...(options.metricsText ? { metricsText: options.metricsText } : {}),
            ...(options.notServing ? { notServing: options.notServing } : {}),
            apiKeyHeader: settings.apiKeyHeader,
            credentialRoutes: settings.credentialRoutes,
          }),
          settings,
          logger,
          closers,
        );
  const publicListener =
    options.public === false ? undefined : await startPublic(parts, tables, limiter, keys, () => !shuttingDown);
  logger.info(
    { public: publicListener?.bound, admin: admin?.bound, counters: backend.kind, keys: settings.apiKeyMode },
    'gateway listening',
  );
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      // /readyz turns 503 and upgrades are refused before anything closes.
      shuttingDown = true;
      await closers.closeAll((name, e) => logger.warn({ step: name, err: (e as Error).message }, 'could not close'));
      logger.info('gateway stopped');
      logger.flush();
    })());
  return {
    publicUrl: publicListener?.url,
    adminUrl: admin?.url,
    logger,
    metrics,
    tables,
    registry: keys.registry,
    limiter,
    redis: backend.client,
    reload,
    stop,
  };
}

/** The limit table: an invalid one stops start-up with every error and its line. */
async function loadTables(parts: Parts): Promise<TableHolder> {
  const { settings, logger, metrics, closers, options } = parts;
  const tables = new TableHolder({
    path: settings.limitsFile,
    displayName: displayName(settings.limitsFile),
    logger,
    metrics,
  });
  tables.onChange((table) => warnOfStrayRoutes(settings, table, logger));
  const first = await tables.reload('start');
  if (!first.ok && first.unread) {
    // A file that cannot be read is a wrong LIMITS_FILE: one line naming it (README "Running it").
    const origin = settings.limitsFileOrigin ? ` (${settings.limitsFileOrigin})` : '';
    throw new StartupError(`LIMITS_FILE=${displayName(settings.limitsFile)}${origin}: ${first.unread}`, 'setting');
  }
  if (!first.ok) throw new StartupError(first.errors.map(formatSourceError).join('\n'));
  tables.watch(options.watchPollMs);
  closers.add('limit table watch', () => tables.close());
  return tables;
}

/** Entries of `routing.routes` and `credential_routes` that name no route of the table do nothing: said on every load. */
function warnOfStrayRoutes(settings: Settings, table: LimitTable, logger: Logger): void {
  const stray = strayRoutes(settings, table);
  if (stray.routing.length > 0) {
    logger.warn(
      { routes: stray.routing, bridge: settings.routing.defaultBridge },
      'routing.routes names routes the limit table does not have: their requests go to the default bridge',
    );
  }
  if (stray.credentialRoutes.length > 0) {
    logger.warn(
      { routes: stray.credentialRoutes },
      'credential_routes names routes the limit table does not have: their bodies are not checked as credentials',
    );
  }
}

/** What every instance must learn at once from the others, and what follows a new table. */
function followEvents(
  backend: Backend,
  limiter: Limiter,
  tables: TableHolder,
  keys: KeyAssembly,
  logger: Logger,
): void {
  const { registry, guard } = keys;
  backend.events.subscribe((event) => {
    if (event.type === 'usage-reset') {
      const rows = tables.current()?.rows ?? [];
      void limiter.forgetKey(event.keyHash, rows);
      void backend.forgetKey(
        event.keyHash,
        rows.map((row) => row.counterId),
      );
    } else if (event.type === 'keys-changed') void registry.refresh().catch(() => {});
    else if (event.type === 'address-blocked') guard.block(event.address, event.ms);
    else if (event.type === 'address-unblocked') void guard.unblock(event.address);
    else {
      // Messages may have been lost while the subscription was down.
      limiter.forgetAll();
      void registry.refresh().catch(() => {});
    }
  });
  // A key that changed plan may have used more under the other numbers than a refusal remembered of it.
  registry.onPlansChanged(() => limiter.forgetAll());
  tables.onChange((table, previous) => {
    if (previous) limiter.forgetAll();
    const missing = registry.list().filter((k) => k.plan !== undefined && !table.plans.has(k.plan));
    if (missing.length)
      logger.warn(
        { keys: missing.map((k) => k.id) },
        'keys name plans the table no longer has; they get the table as written',
      );
  });
}

async function startPublic(
  parts: Parts,
  tables: TableHolder,
  limiter: Limiter,
  keys: KeyAssembly,
  accepting: () => boolean,
): Promise<Listening> {
  const { settings, logger, metrics, closers } = parts;
  const bridgeOptions = {
    bridges: settings.bridges,
    timeoutMs: settings.upstreamTimeoutMs,
    onError: (err: Error, context: { bridge: string; phase: string }) =>
      logger.warn({ ...context, code: (err as NodeJS.ErrnoException).code, err: err.message }, 'bridge error'),
  };
  const forwarder = new Forwarder(bridgeOptions);
  const websockets = new WebSocketConnections(metrics);
  const app = createPublicApp({
    settings,
    table: () => tables.current(),
    limiter,
    registry: keys.registry,
    guard: keys.guard,
    forwarder,
    webSocketProxy: new WebSocketProxy(bridgeOptions),
    websockets,
    metrics,
    logger,
  });
  return startPublicServer({ app, forwarder, websockets, accepting }, settings, { logger, metrics }, closers);
}

/** A path as an operator would write it: relative to the working directory when inside it. */
function displayName(path: string): string {
  const rel = relative(process.cwd(), path);
  return rel === '' || rel.startsWith('..') || isAbsolute(rel) ? path : rel;
}
