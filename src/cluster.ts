import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry } from 'prom-client';
import type { Settings } from './config/settings.js';
import { startGateway, StartupError } from './runner.js';

/**
 * `WORKERS=n`: n gateway processes on one host (node:cluster), all serving the public port
 * and sharing their counters in Redis. The primary serves nothing public: it holds the one
 * admin listener (metrics aggregated over the workers), restarts a worker that dies, and
 * passes SIGHUP and shutdown on to the workers.
 */

type ClusterMessage = { readonly type: 'oapi:reload' } | { readonly type: 'oapi:shutdown' };

/** A worker that lived this long died of something else than its start-up. */
const WORKER_STEADY_MS = 30_000;
const MAX_RESTART_DELAY_MS = 30_000;

export async function runCluster(settings: Settings): Promise<void> {
  if (cluster.isPrimary) await runPrimary(settings);
  else await runWorker(settings);
}

async function runPrimary(settings: Settings): Promise<void> {
  const aggregator = new AggregatorRegistry();
  const primary = await startGateway({ settings, public: false, metricsText: () => aggregator.clusterMetrics() }).catch(
    (err: unknown) => {
      if (err instanceof StartupError) {
        const text = err.reason === 'listener' ? err.message : `the gateway cannot start:\n${err.message}`;
        process.stderr.write(`oapi-gateway: ${text}\n`);
        process.exit(1);
      }
      throw err;
    },
  );
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
  const broadcast = (message: ClusterMessage): void => {
    for (const worker of Object.values(cluster.workers ?? {})) worker?.send(message);
  };
  // Each worker watches the file itself; a SIGHUP to the primary reaches them as a message.
  process.on('SIGHUP', () => {
    void primary.reload('signal');
    broadcast({ type: 'oapi:reload' });
  });
  const shutdown = (signal: string): void => {
    if (stopping) return;
    stopping = true;
    primary.logger.info({ signal }, 'shutting down workers');
    broadcast({ type: 'oapi:shutdown' });
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
      .then(() => process.exit(0));
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

async function runWorker(settings: Settings): Promise<void> {
  const worker = await startGateway({ settings, admin: false }).catch((err: unknown) => {
    if (err instanceof StartupError) {
      const text = err.reason === 'listener' ? err.message : `a worker cannot start:\n${err.message}`;
      process.stderr.write(`oapi-gateway: ${text}\n`);
      process.exit(1);
    }
    throw err;
  });
  // Constructing one installs prom-client's listener that answers the primary's metric requests.
  new AggregatorRegistry();
  AggregatorRegistry.setRegistries([worker.metrics.registry]);
  process.on('message', (message: ClusterMessage) => {
    if (message?.type === 'oapi:reload') void worker.reload('signal');
    else if (message?.type === 'oapi:shutdown') void worker.stop().then(() => process.exit(0));
  });
  // The primary decides when to stop and when to reload; a signal sent to the whole process group is left to it.
  process.on('SIGTERM', () => {});
  process.on('SIGINT', () => {});
  process.on('SIGHUP', () => {});
}
