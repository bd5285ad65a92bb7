import { AggregatorRegistry, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { LabelledHistogram } from '../../src/observability/hot-metrics.js';

/** The request-path histogram renders exactly as prom-client's own Histogram given the same observations. */

describe('LabelledHistogram', () => {
  it('renders and aggregates like prom-client’s Histogram', async () => {
    const buckets = [0.001, 0.01, 0.1, 1];
    const ours = new Registry();
    const theirs = new Registry();
    const hot = new LabelledHistogram({ name: 'x_seconds', help: 'h', labelName: 'endpoint', buckets, registry: ours });
    const reference = new Histogram({
      name: 'x_seconds',
      help: 'h',
      labelNames: ['endpoint'],
      buckets,
      registers: [theirs],
    });
    const observations: Array<[string, number]> = [
      ['GET /a', 0.0005],
      ['GET /a', 0.001],
      ['GET /a', 0.05],
      ['POST /b', 3],
      ['GET /a', 0.2],
      ['POST /b', 0.01],
    ];
    for (const [label, value] of observations) {
      hot.observe(label, value);
      reference.labels(label).observe(value);
    }
    expect(await ours.metrics()).toBe(await theirs.metrics());
    // With WORKERS=n the primary adds up its workers' metrics from this JSON.
    const twoOfOurs = AggregatorRegistry.aggregate([await ours.getMetricsAsJSON(), await ours.getMetricsAsJSON()]);
    const twoOfTheirs = AggregatorRegistry.aggregate([
      await theirs.getMetricsAsJSON(),
      await theirs.getMetricsAsJSON(),
    ]);
    expect(await twoOfOurs.metrics()).toBe(await twoOfTheirs.metrics());
    hot.reset();
    reference.reset();
    expect(await ours.metrics()).toBe(await theirs.metrics());
  });
});
