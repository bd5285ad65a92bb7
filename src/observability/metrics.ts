import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { LabelledHistogram } from './hot-metrics.js';
import type { FailureMode, LimiterObserver } from '../limits/limiter.js';
import type { StoreUnavailableError } from '../limits/store.js';
import { VERSION } from '../lib/version.js';

/**
 * Prometheus metrics (prom-client). Label values stay bounded: `endpoint` is the route of a
 * table row (or `unmatched`), never a raw path or a key. What every request records (its count,
 * its latencies, its store call) costs one map lookup or less on the request path, and reaches
 * prom-client when it is scraped.
 */

export const UNMATCHED = 'unmatched';

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

export class GatewayMetrics implements LimiterObserver {
  readonly registry = new Registry();

  /** Requests answered but not yet handed to `requests` (see request()). */
  readonly #answered = new Map<string, Map<number, number>>();
  readonly requests: Counter<'endpoint' | 'status'> = new Counter({
    name: 'oapi_gateway_requests_total',
    help: 'Public requests answered, by endpoint (table route) and status code.',
    labelNames: ['endpoint', 'status'] as const,
    registers: [this.registry],
    // Counted in a plain map on the request path and added here when scraped: prom-client's label
    // checks on every request cost more than the rest of the request's metrics together.
    collect: () => {
      for (const [endpoint, statuses] of this.#answered) {
        for (const [status, count] of statuses) this.requests.labels(endpoint, String(status)).inc(count);
      }
      this.#answered.clear();
    },
  });
  /** Answers the gateway wrote itself not yet handed to `ownAnswers`. */
  readonly #own = new Map<string, Map<string, number>>();
  readonly ownAnswers: Counter<'endpoint' | 'reason'> = new Counter({
    name: 'oapi_gateway_own_answers_total',
    help: 'Answers the gateway wrote itself (refusals, 502/504), by endpoint and reason (the reason of the access line).',
    labelNames: ['endpoint', 'reason'] as const,
    registers: [this.registry],
    collect: () => {
      for (const [endpoint, reasons] of this.#own) {
        for (const [reason, count] of reasons) this.ownAnswers.labels(endpoint, reason).inc(count);
      }
      this.#own.clear();
    },
  });
  readonly refusals = new Counter({
    name: 'oapi_gateway_refusals_total',
    help: 'Requests refused for a spent window, each once (window: hour, day or both; shadow="true": counted on a shadow row, which would have refused them).',
    labelNames: ['endpoint', 'window', 'shadow'] as const,
    registers: [this.registry],
  });
  readonly nearLimit = new Counter({
    name: 'oapi_gateway_near_limit_total',
    help: 'Allowed requests that left less than 10% of a window.',
    labelNames: ['endpoint', 'window'] as const,
    registers: [this.registry],
  });
  readonly requestDuration = new LabelledHistogram({
    name: 'oapi_gateway_request_duration_seconds',
    help: 'Time from request to the end of the answer, by endpoint.',
    labelName: 'endpoint',
    buckets: LATENCY_BUCKETS,
    registry: this.registry,
  });
  readonly upstreamDuration = new LabelledHistogram({
    name: 'oapi_gateway_upstream_duration_seconds',
    help: 'Time from forwarding to the bridge answer headers, by bridge.',
    labelName: 'bridge',
    buckets: LATENCY_BUCKETS,
    registry: this.registry,
  });
  #storeCalls = 0;
  readonly storeCalls: Counter = new Counter({
    name: 'oapi_gateway_store_calls_total',
    help: 'Requests counted in the counter store; each waited for one round trip (requests that come while a call is out share the next).',
    registers: [this.registry],
    collect: () => {
      this.storeCalls.inc(this.#storeCalls);
      this.#storeCalls = 0;
    },
  });
  readonly storeErrors = new Counter({
    name: 'oapi_gateway_store_errors_total',
    help: 'Counter-store calls that failed, by kind (timeout, connection, reply).',
    labelNames: ['kind'] as const,
    registers: [this.registry],
  });
  readonly storeFallbacks = new Counter({
    name: 'oapi_gateway_store_fallbacks_total',
    help: 'Requests decided without the counter store, by REDIS_FAILURE_MODE.',
    labelNames: ['mode'] as const,
    registers: [this.registry],
  });
  readonly insuranceMerges = new Counter({
    name: 'oapi_gateway_insurance_merged_total',
    help: 'Counters (key, row) whose units admitted from the insurance counters during a Redis outage were handed to Redis once it was back, by result (ok: added; failed: not added and not sent again, as their key holds something else than a counter). A call that fails is sent again until answered, and counted then.',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  readonly reloads = new Counter({
    name: 'oapi_gateway_limits_reloads_total',
    help: 'Limit-table loads, by result (ok, unchanged, invalid).',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  // With WORKERS=n the primary reports its workers' metrics together: each worker holds the table,
  // so these are the latest of theirs, not their sum.
  readonly tableLoaded = new Gauge({
    name: 'oapi_gateway_limits_loaded_timestamp_seconds',
    help: 'When the limit table in force was loaded.',
    registers: [this.registry],
    aggregator: 'max',
  });
  readonly tableRows = new Gauge({
    name: 'oapi_gateway_limits_rows',
    help: 'Rows of the limit table in force.',
    registers: [this.registry],
    aggregator: 'max',
  });
  readonly websockets = new Gauge({
    name: 'oapi_gateway_websocket_connections',
    help: 'Open proxied WebSocket connections, by endpoint.',
    labelNames: ['endpoint'] as const,
    registers: [this.registry],
  });
  readonly invalidKeys = new Counter({
    name: 'oapi_gateway_invalid_keys_total',
    help: 'Requests refused by the API-key check, by outcome (rejected: 401, a missing or unknown key; throttled: 429, any request from an address the invalid-key guard blocks).',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });

  readonly buildInfo = new Gauge({
    name: 'oapi_gateway_build_info',
    help: 'Always 1; the labels say which gateway version runs on which Node.js.',
    labelNames: ['version', 'node'] as const,
    registers: [this.registry],
    // With WORKERS>1 the primary sums its workers' metrics; a sum would make this the worker count.
    aggregator: 'first',
  });

  constructor(options: { defaultMetrics?: boolean } = {}) {
    if (options.defaultMetrics !== false) collectDefaultMetrics({ register: this.registry, prefix: 'oapi_gateway_' });
    this.buildInfo.labels(VERSION, process.version).set(1);
    // Series that exist from the start: increase() over a series that appears with its first
    // event misses that event, and a single refused reload would never alert.
    for (const result of ['ok', 'unchanged', 'invalid']) this.reloads.labels(result).inc(0);
    for (const result of ['ok', 'failed']) this.insuranceMerges.labels(result).inc(0);
    for (const kind of ['timeout', 'connection', 'reply']) this.storeErrors.labels(kind).inc(0);
    for (const outcome of ['rejected', 'throttled']) this.invalidKeys.labels(outcome).inc(0);
  }

  request(endpoint: string, status: number, seconds: number, reason?: string): void {
    let statuses = this.#answered.get(endpoint);
    if (!statuses) this.#answered.set(endpoint, (statuses = new Map<number, number>()));
    statuses.set(status, (statuses.get(status) ?? 0) + 1);
    this.requestDuration.observe(endpoint, seconds);
    if (reason === undefined) return;
    let reasons = this.#own.get(endpoint);
    if (!reasons) this.#own.set(endpoint, (reasons = new Map<string, number>()));
    reasons.set(reason, (reasons.get(reason) ?? 0) + 1);
  }

  upstream(bridge: string, seconds: number): void {
    this.upstreamDuration.observe(bridge, seconds);
  }

  // LimiterObserver
  storeCall(): void {
    this.#storeCalls++;
  }

  storeError(kind: StoreUnavailableError['kind']): void {
    this.storeErrors.labels(kind).inc();
  }

  fallback(mode: FailureMode): void {
    this.storeFallbacks.labels(mode).inc();
  }

  merged(counters: number, result: 'ok' | 'failed'): void {
    this.insuranceMerges.labels(result).inc(counters);
  }
}
