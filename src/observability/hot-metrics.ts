import type { MetricValueWithName, Registry } from 'prom-client';

/** What prom-client's registry reads from a metric when it renders or aggregates it. */
interface MetricSnapshot {
  readonly name: string;
  readonly help: string;
  readonly type: 'histogram';
  readonly values: Array<MetricValueWithName<string>>;
  readonly aggregator: 'sum';
}

/**
 * A latency histogram observed on every request, kept in plain arrays and handed to prom-client's
 * registry only when it is scraped. prom-client's Histogram checks and hashes its labels on every
 * observation, which cost more than everything else a request's metrics do (docs/performance.md);
 * this takes one map lookup. It renders, aggregates over WORKERS and resets exactly as
 * prom-client's Histogram does, because the registry reads it through the same `get()`.
 */

interface Series {
  /** Observations per bucket (not cumulative); the last one is +Inf. */
  readonly counts: number[];
  sum: number;
  count: number;
}

/** A histogram with one label. */
export class LabelledHistogram {
  readonly type = 'histogram' as const;
  readonly aggregator = 'sum' as const;
  readonly name: string;
  readonly help: string;
  /** As on prom-client's metrics. */
  readonly labelNames: readonly string[];
  readonly #label: string;
  readonly #buckets: readonly number[];
  #series = new Map<string, Series>();

  constructor(options: {
    name: string;
    help: string;
    labelName: string;
    buckets: readonly number[];
    registry: Registry;
  }) {
    this.name = options.name;
    this.help = options.help;
    this.#label = options.labelName;
    this.labelNames = [options.labelName];
    this.#buckets = [...options.buckets].sort((a, b) => a - b);
    options.registry.registerMetric(this as never);
  }

  observe(label: string, value: number): void {
    let series = this.#series.get(label);
    if (!series)
      this.#series.set(
        label,
        (series = { counts: new Array<number>(this.#buckets.length + 1).fill(0), sum: 0, count: 0 }),
      );
    let i = 0;
    while (i < this.#buckets.length && value > (this.#buckets[i] as number)) i++;
    (series.counts[i] as number)++;
    series.sum += value;
    series.count++;
  }

  get(): Promise<MetricSnapshot> {
    const values: Array<MetricValueWithName<string>> = [];
    for (const [label, series] of this.#series) {
      let cumulative = 0;
      this.#buckets.forEach((bound, i) => {
        cumulative += series.counts[i] as number;
        values.push({
          metricName: `${this.name}_bucket`,
          value: cumulative,
          labels: { le: bound, [this.#label]: label },
        });
      });
      values.push({
        metricName: `${this.name}_bucket`,
        value: series.count,
        labels: { le: '+Inf', [this.#label]: label },
      });
      values.push({ metricName: `${this.name}_sum`, value: series.sum, labels: { [this.#label]: label } });
      values.push({ metricName: `${this.name}_count`, value: series.count, labels: { [this.#label]: label } });
    }
    return Promise.resolve({ name: this.name, help: this.help, type: this.type, values, aggregator: 'sum' });
  }

  reset(): void {
    this.#series = new Map();
  }
}
