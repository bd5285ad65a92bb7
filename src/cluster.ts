import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry } from 'prom-client';
import type { Settings } from './config/settings.js';
import { startGateway, StartupError, type Gateway } from './runner.js';

/**
 * `WORKERS=n`: n gateway processes on one host (node:cluster), all serving the public port
 * and sharing their counters in Redis. The primary serves nothing public: it holds the one
 * admin listener (metrics aggregated over the workers), restarts a worker that dies, and
 * passes SIGHUP and shutdown on to the workers (docs/performance.md "`WORKERS=n`").
 */

/** From the primary: reload, or stop. */
type ToWorker = { readonly type: 'oapi:reload' } | { readonly type: 'oapi:shutdown' };

/** From a worker: it serves (and takes messages), or it cannot listen (its one line). */
type ToPrimary = { readonly type: 'oapi:serving' } | { readonly type: 'oapi:cannot-listen'; readonly line: string };

/** A worker that lived this long died of something else than its start-up. */
const WORKER_STEADY_MS = 30_000;
const MAX_RESTART_DELAY_MS = 30_000;

export async function runCluster(settings: Settings): Promise<void> {
  if (cluster.isPrimary) await runPrimary(settings);
  else await runWorker(settings);
}

async function runPrimary(settings: Settings): Promise<void> {
  // Workers that said they serve: they listen and take the primary's messages.
  const serving = new Set<number>();
  const primary = await startPrimary(settings, serving);
  let stopping = false;
  const startedAt = new Map<number, number>();
  let quickDeaths = 0;
  const fork = (): void => {
    if (stopping) return;
    const worker: Worker = cluster.fork();
    startedAt.set(worker.id, Date.now());
  };
  for (let i = 0; i < settings.workers; i++) fork();
  cluster.on('exit', (worker, code, signal) => {
    serving.delete(worker.id);
    if (stopping) return;
    // A worker that dies soon after it started (it cannot start while the file is invalid, say)
    // is restarted with a growing delay, not in a tight loop.
    const lived = Date.now() - (startedAt.get(worker.id) ?? 0);
    startedAt.delete(worker.id);
    quickDeaths = lived < WORKER_STEADY_MS ? quickDeaths + 1 : 0;
    const delay = quickDeaths === 0 ? 0 : Math.min(MAX_RESTART_DELAY_MS, 500 * 2 ** (quickDeaths - 1));
    primary.logger.error(
      { worker: worker.process.pid, code, signal, restartInMs: delay },
      'worker died; starting another',
    );
    setTimeout(fork, delay).unref();
  });
  const broadcast = (message: ToWorker): void => {
    for (const worker of Object.values(cluster.workers ?? {})) worker?.send(message);
  };
  // Each worker watches the file itself; a SIGHUP to the primary reaches them as a message.
  process.on('SIGHUP', () => {
    void primary.reload('signal');
    broadcast({ type: 'oapi:reload' });
  });
  const stopWorkers = (exitCode: number): void => {
    stopping = true;
    broadcast({ type: 'oapi:shutdown' });
    // A worker still starting takes no message yet, and serves nothing: the signal ends it.
    for (const worker of Object.values(cluster.workers ?? {}))
      if (worker && !serving.has(worker.id)) worker.process.kill('SIGTERM');
    const waitForWorkers = new Promise<void>((resolve) => {
      const check = (): void => {
        if (Object.keys(cluster.workers ?? {}).length === 0) resolve();
      };
      cluster.on('exit', check);
      check();
    });
    const deadline = new Promise<void>((resolve) => setTimeout(resolve, settings.shutdownTimeoutMs + 5000).unref());
    void Promise.race([waitForWorkers, deadline])
      .then(() => primary.stop())
      .then(() => process.exit(exitCode));
  };
  const shutdown = (signal: string): void => {
    if (stopping) return;
    primary.logger.info({ signal }, 'shutting down workers');
    stopWorkers(0);
  };
  // A worker that cannot listen means none can: they all share the one listener the primary binds
  // for them, so nothing would serve. The gateway ends as a single process does, exit 1 with the
  // worker's one line naming the variable (README "Running it"), rather than restart it for ever
  // while /readyz says ok.
  const cannotListen = (line: string): void => {
    if (stopping) return;
    process.stderr.write(`oapi-gateway: ${line}\n`);
    primary.logger.error({ line }, 'a worker cannot listen; stopping');
    stopWorkers(1);
  };
  cluster.on('message', (worker: Worker, message: ToPrimary) => {
    if (message?.type === 'oapi:serving') serving.add(worker.id);
    else if (message?.type === 'oapi:cannot-listen') cannotListen(message.line);
  });
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

/** The primary's gateway: the admin listener, no public one; a start-up error ends the process. */
function startPrimary(settings: Settings, serving: ReadonlySet<number>): Promise<Gateway> {
  const aggregator = new AggregatorRegistry();
  return startGateway({
    settings,
    public: false,
    metricsText: () => aggregator.clusterMetrics(),
    // Ready only while a worker serves: the primary's own table and Redis say nothing of the public port.
    notServing: () => (serving.size === 0 ? 'no worker serves the public port' : undefined),
  }).catch((err: unknown) => {
    if (err instanceof StartupError) {
      const text = err.reason === 'listener' ? err.message : `the gateway cannot start:\n${err.message}`;
      process.stderr.write(`oapi-gateway: ${text}\n`);
      process.exit(1);
    }
    throw err;
  });
}

async function runWorker(settings: Settings): Promise<void> {
  const worker = await startGateway({ settings, admin: false }).catch(failToStart);
  // Constructing one installs prom-client's listener that answers the primary's metric requests.
  new AggregatorRegistry();
  AggregatorRegistry.setRegistries([worker.metrics.registry]);
  process.on('message', (message: ToWorker) => {
    if (message?.type === 'oapi:reload') void worker.reload('signal');
    else if (message?.type === 'oapi:shutdown') void worker.stop().then(() => process.exit(0));
  });
  // The primary decides when to stop and when to reload; a signal sent to the whole process group is left to it.
  process.on('SIGTERM', () => {});
  process.on('SIGINT', () => {});
  process.on('SIGHUP', () => {});
  tell({ type: 'oapi:serving' });
}

/**
 * A worker that cannot listen leaves its one line to the primary, which ends the gateway with it;
 * one that cannot read its files says why and exits, to be retried with a growing delay
 * (docs/performance.md "`WORKERS=n`").
 */
async function failToStart(err: unknown): Promise<never> {
  if (err instanceof StartupError && err.reason === 'listener') {
    await new Promise<void>((resolve) => tell({ type: 'oapi:cannot-listen', line: err.message }, resolve));
    process.exit(1);
  }
  if (err instanceof StartupError) {
    process.stderr.write(`oapi-gateway: a worker cannot start:\n${err.message}\n`);
    process.exit(1);
  }
  throw err;
}

function tell(message: ToPrimary, sent: () => void = () => {}): void {
  if (!process.send) return sent();
  process.send(message, undefined, undefined, () => sent());
}
