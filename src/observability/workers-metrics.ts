import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry, type Registry } from 'prom-client';

/**
 * The primary's /metrics: its serving workers' metrics added up (docs/performance.md "`WORKERS=n`").
 * Only workers that said they serve are asked: they answer prom-client's question (cluster.ts runWorker), where
 * a worker still starting does not yet, and prom-client's own clusterMetrics() asks every worker and
 * fails the whole scrape after 5 s for want of that one's answer. One that does not answer within
 * 5 s fails the scrape, as before. The primary constructs no AggregatorRegistry: prom-client's
 * listener for the answers would take these ones, whose ids it does not know, and throw.
 *
 * A counter never goes down (Prometheus takes a decrease for a restart from 0, and rate() would
 * count the whole sum again): the counters and histograms a worker last reported stay in the sum
 * when it dies, and the worker started in its place adds to them from 0.
 */
export class WorkersMetrics {
  /** What each living worker last answered. */
  readonly #last = new Map<number, RegistryJson[]>();
  /** The counters and histograms of the workers gone, added up, by name. */
  readonly #retired = new Map<string, MetricJson>();
  #nextId = 1;

  constructor() {
    cluster.on('exit', (worker) => this.#retire(worker.id));
  }

  async text(serving: ReadonlySet<number>): Promise<string> {
    const id = this.#nextId++;
    // Taken now: a worker that dies during the scrape is in it once, by its answer or its last one.
    const retired = [...this.#retired.values()];
    const asked = [...serving].flatMap((workerId) => cluster.workers?.[workerId] ?? []);
    const answers = await Promise.all(
      asked.map((worker) =>
        // A worker that exits first is in it by its last answer (read as it exits, before #retire).
        metricsOf(worker, id, () => this.#last.get(worker.id) ?? []).then((metrics) => {
          if (worker.isConnected()) this.#last.set(worker.id, metrics);
          return metrics;
        }),
      ),
    );
    return AggregatorRegistry.aggregate([...answers.flat(), retired]).metrics();
  }

  /** A worker exited: what it last reported of its counters and histograms stays in the sum. */
  #retire(workerId: number): void {
    const last = this.#last.get(workerId);
    this.#last.delete(workerId);
    for (const metric of last?.flat() ?? []) {
      // A string at run time ('counter'), whatever prom-client's typings say.
      const type = String(metric.type);
      if ((type !== 'counter' && type !== 'histogram') || (metric.aggregator ?? 'sum') !== 'sum') continue;
      const before = this.#retired.get(metric.name);
      this.#retired.set(metric.name, before ? addedUp(before, metric) : metric);
    }
  }
}

/** prom-client's messages between the primary and a worker (prom-client/lib/cluster.js). */
type RegistryJson = Awaited<ReturnType<Registry['getMetricsAsJSON']>>;
type MetricJson = RegistryJson[number];
interface MetricsAnswer {
  readonly type?: string;
  readonly requestId?: number;
  readonly metrics?: RegistryJson[];
  readonly error?: string;
}
const METRICS_ANSWER_MS = 5_000;

/** Two snapshots of one metric, each series' values added. */
function addedUp(a: MetricJson, b: MetricJson): MetricJson {
  const series = new Map<string, MetricJson['values'][number]>();
  for (const value of [...a.values, ...b.values]) {
    const name = (value as { metricName?: string }).metricName ?? '';
    const key = `${name} ${JSON.stringify(Object.entries(value.labels).sort(([x], [y]) => (x < y ? -1 : 1)))}`;
    const before = series.get(key);
    series.set(key, before ? { ...before, value: before.value + value.value } : value);
  }
  return { ...a, values: [...series.values()] };
}

/** One worker's registries as JSON; `ifGone()` when it exits first. */
function metricsOf(worker: Worker, id: number, ifGone: () => RegistryJson[]): Promise<RegistryJson[]> {
  return new Promise((resolve, reject) => {
    const done = (result: RegistryJson[] | Error): void => {
      clearTimeout(timer);
      worker.off('message', onMessage);
      worker.off('exit', onExit);
      if (result instanceof Error) reject(result);
      else resolve(result);
    };
    const onMessage = (message: MetricsAnswer): void => {
      if (message?.type !== 'prom-client:getMetricsRes' || message.requestId !== id) return;
      done(message.error !== undefined ? new Error(message.error) : (message.metrics ?? []));
    };
    const onExit = (): void => done(ifGone());
    const timer = setTimeout(
      () => done(new Error(`worker ${worker.process.pid} did not answer within ${METRICS_ANSWER_MS / 1000} s`)),
      METRICS_ANSWER_MS,
    );
    worker.on('message', onMessage);
    worker.on('exit', onExit);
    worker.send({ type: 'prom-client:getMetricsReq', requestId: id }, (err) => {
      if (err) done(ifGone());
    });
  });
}
