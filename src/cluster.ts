import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry } from 'prom-client';
import type { AdminReloadResult } from './admin/app.js';
import type { Settings } from './config/settings.js';
import type { ReloadResult } from './config/table-holder.js';
import { formatSourceError } from './lib/yaml-source.js';
import { WorkersMetrics } from './observability/workers-metrics.js';
import { startGateway, StartupError, type Gateway } from './runner.js';

/**
 * `WORKERS=n`: n gateway processes on one host (node:cluster), all serving the public port
 * and sharing their counters in Redis. The primary serves nothing public: it holds the one
 * admin listener (metrics aggregated over the workers), restarts a worker that dies, and
 * passes SIGHUP, the admin reload and shutdown on to the workers (docs/performance.md "`WORKERS=n`").
 */

/** From the primary: a reload (with an `id`, the admin reload waits for the answer), or stop. */
type ToWorker = { readonly type: 'oapi:reload'; readonly id?: number } | { readonly type: 'oapi:shutdown' };

/** From a worker: it serves (and takes messages), it cannot listen (its one line), or a reload's result. */
type ToPrimary =
  | { readonly type: 'oapi:serving' }
  | { readonly type: 'oapi:cannot-listen'; readonly line: string }
  | { readonly type: 'oapi:reloaded'; readonly id: number; readonly result: WorkerReload };

type WorkerReload =
  | { readonly ok: true; readonly hash: string; readonly changed: boolean }
  | { readonly ok: false; readonly errors: readonly string[] };

/** A worker that lived this long died of something else than its start-up. */
const WORKER_STEADY_MS = 30_000;
const MAX_RESTART_DELAY_MS = 30_000;
/** How long the admin reload waits for each worker's answer (a reload takes milliseconds). */
const RELOAD_ANSWER_MS = 5_000;

/** `takeEarlyReload`: main.ts's SIGHUP listener of the start-up ends; true when a reload was asked meanwhile. */
export async function runCluster(settings: Settings, takeEarlyReload: () => boolean): Promise<void> {
  if (cluster.isPrimary) await runPrimary(settings, takeEarlyReload);
  else await runWorker(settings, takeEarlyReload);
}

async function runPrimary(settings: Settings, takeEarlyReload: () => boolean): Promise<void> {
  // Workers that said they serve: they listen and take the primary's messages.
  const serving = new Set<number>();
  // Set as the shutdown begins: /readyz turns 503 while the workers still finish their requests (docs/operations.md "Shutdown").
  let stopping = false;
  const primary = await startPrimary(settings, serving, () => stopping);
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
  // One that came while the primary started (README "Running it"): its workers, forked just now, read the files as they start.
  if (takeEarlyReload()) void primary.reload('signal');
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
  // Kept for the whole shutdown, as a single process does (main.ts): a second signal would end the primary at once.
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

/** The primary's gateway: the admin listener, no public one; a start-up error ends the process. */
function startPrimary(settings: Settings, serving: ReadonlySet<number>, stopping: () => boolean): Promise<Gateway> {
  const metrics = new WorkersMetrics();
  return startGateway({
    settings,
    public: false,
    metricsText: () => metrics.text(serving),
    // Ready only while a worker serves: the primary's own table and Redis say nothing of the public port.
    notServing: () =>
      stopping() ? 'shutting down' : serving.size === 0 ? 'no worker serves the public port' : undefined,
    reloadElsewhere: (own) => reloadWorkers(own, serving),
  }).catch((err: unknown) => {
    if (err instanceof StartupError) {
      const text = err.reason !== 'files' ? err.message : `the gateway cannot start:\n${err.message}`;
      process.stderr.write(`oapi-gateway: ${text}\n`);
      process.exit(1);
    }
    throw err;
  });
}

/**
 * The admin reload with workers: the primary has loaded the table; each serving worker reloads
 * (the table and the key file) and answers, so that the answer is the table in force where the
 * requests are served (README "Running it"). Workers that do not reach the primary's table in
 * RELOAD_ANSWER_MS make it a 503 naming them; a worker still starting reads the file as it starts.
 */
async function reloadWorkers(
  own: Extract<ReloadResult, { ok: true }>,
  serving: ReadonlySet<number>,
): Promise<AdminReloadResult> {
  const id = nextReloadId++;
  const asked = [...serving].flatMap((workerId) => cluster.workers?.[workerId] ?? []);
  const answers = await Promise.all(asked.map((worker) => reloadOf(worker, id)));
  const problems = answers.flatMap((answer) => disagreement(answer, own.table.hash));
  if (problems.length)
    return {
      ok: false,
      unsettled: `not every worker has ${own.table.hash}: ${problems.join('; ')}. Each worker also reloads on its own when the file changes; try again`,
    };
  // `changed`: the reload put a new table in force in some process (a worker's watcher may have been first here).
  const changed = own.changed || answers.some((a) => typeof a.result === 'object' && a.result.ok && a.result.changed);
  return { ok: true, table: own.table, changed };
}

let nextReloadId = 1;

interface WorkerAnswer {
  readonly pid: number | undefined;
  /** `gone`: the worker exited meanwhile (the one started in its place reads the file itself). */
  readonly result: WorkerReload | 'no answer' | 'gone';
}

/** Asks one worker to reload, and waits (bounded) for its answer. */
function reloadOf(worker: Worker, id: number): Promise<WorkerAnswer> {
  return new Promise((resolve) => {
    const done = (result: WorkerAnswer['result']): void => {
      clearTimeout(timer);
      worker.off('message', onMessage);
      worker.off('exit', onExit);
      resolve({ pid: worker.process.pid, result });
    };
    const onMessage = (message: ToPrimary): void => {
      if (message?.type === 'oapi:reloaded' && message.id === id) done(message.result);
    };
    const onExit = (): void => done('gone');
    const timer = setTimeout(() => done('no answer'), RELOAD_ANSWER_MS);
    worker.on('message', onMessage);
    worker.on('exit', onExit);
    worker.send({ type: 'oapi:reload', id } satisfies ToWorker, (err) => {
      if (err) done('gone');
    });
  });
}

/** Why a worker's answer is not the primary's table, if it is not. */
function disagreement({ pid, result }: WorkerAnswer, hash: string): string[] {
  if (result === 'gone') return [];
  if (result === 'no answer') return [`worker ${pid} did not answer within ${RELOAD_ANSWER_MS / 1000} s`];
  if (!result.ok) return [`worker ${pid} found the file not valid (${result.errors[0] ?? 'no error given'})`];
  return result.hash === hash ? [] : [`worker ${pid} loaded ${result.hash}`];
}

async function runWorker(settings: Settings, takeEarlyReload: () => boolean): Promise<void> {
  const worker = await startGateway({ settings, admin: false }).catch(failToStart);
  // Constructing one installs prom-client's listener that answers the primary's metric requests.
  new AggregatorRegistry();
  AggregatorRegistry.setRegistries([worker.metrics.registry]);
  process.on('message', (message: ToWorker) => {
    if (message?.type === 'oapi:reload' && message.id !== undefined) void answerReload(worker, message.id);
    else if (message?.type === 'oapi:reload') void worker.reload('signal');
    else if (message?.type === 'oapi:shutdown') void worker.stop().then(() => process.exit(0));
  });
  // The primary decides when to stop and when to reload; a signal sent to the whole process group is left to it.
  process.on('SIGTERM', () => {});
  process.on('SIGINT', () => {});
  process.on('SIGHUP', () => {});
  takeEarlyReload();
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

async function answerReload(worker: Gateway, id: number): Promise<void> {
  const result: WorkerReload = await worker.reload('admin').then(
    (r): WorkerReload =>
      r.ok
        ? { ok: true, hash: r.table.hash, changed: r.changed }
        : { ok: false, errors: r.errors.map(formatSourceError) },
    (e: unknown): WorkerReload => ({ ok: false, errors: [(e as Error).message] }),
  );
  tell({ type: 'oapi:reloaded', id, result });
}

function tell(message: ToPrimary, sent: () => void = () => {}): void {
  if (!process.send) return sent();
  process.send(message, undefined, undefined, () => sent());
}
