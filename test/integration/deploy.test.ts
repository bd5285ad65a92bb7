import { execFile, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { DEMO_PASSWORD, DEMO_USERNAME } from '../../src/sandbox/bodies.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { outputOf, waitForOutput } from '../helpers/child-gateway.js';
import { send } from '../helpers/http.js';

/**
 * The dashboard and the alert rules against a running gateway: every metric their PromQL uses
 * is one its /metrics exports, with labels it has. And the sandbox bridge entry point that
 * deploy/docker-compose.yml runs.
 */

const ROOT = new URL('../../', import.meta.url).pathname;
const run = promisify(execFile);

interface Rule {
  readonly alert?: string;
  readonly expr: string;
  readonly for?: string;
  readonly labels?: Record<string, string>;
  readonly annotations?: Record<string, string>;
}
const rules = (
  parse(readFileSync(join(ROOT, 'deploy/prometheus/alerts.yaml'), 'utf8')) as {
    groups: Array<{ name: string; rules: Rule[] }>;
  }
).groups.flatMap((g) => g.rules);

interface Panel {
  readonly id: number;
  readonly type: string;
  readonly title: string;
  readonly datasource?: { readonly uid: string };
  readonly targets?: Array<{ readonly expr: string }>;
  readonly panels?: Panel[];
}
const dashboard = JSON.parse(readFileSync(join(ROOT, 'deploy/grafana/oapi-gateway.json'), 'utf8')) as {
  panels: Panel[];
  templating: { list: Array<{ name: string; type: string }> };
};
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
const dashboardExprs = panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));

/** Labels Prometheus adds to every scraped series, and the bucket label of histograms. */
const TARGET_LABELS = ['instance', 'job', 'le'];

interface Exported {
  readonly types: Map<string, string>;
  readonly labels: Map<string, Set<string>>;
}

/** Metric names as the /metrics text declares them (`# TYPE`), and the labels of each. */
function exported(text: string, declared: Map<string, readonly string[]>): Exported {
  const types = new Map<string, string>();
  const labels = new Map<string, Set<string>>();
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1] as string, type[2] as string);
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} /.exec(line);
    if (sample) {
      const name = (sample[1] as string).replace(/_(bucket|sum|count)$/, '');
      const set = labels.get(name) ?? labels.set(name, new Set()).get(name);
      for (const m of (sample[2] as string).matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) set?.add(m[1] as string);
    }
  }
  // Labels of series that no request has created yet (a WebSocket, a Redis outage) come from the declaration.
  for (const [name, names] of declared)
    for (const l of names) (labels.get(name) ?? labels.set(name, new Set()).get(name))?.add(l);
  return { types, labels };
}

/** The exported metric a name in an expression stands for (a histogram's series count as their base name). */
function metricOf(name: string, metrics: Exported): string | undefined {
  if (metrics.types.has(name)) return name;
  const base = name.replace(/_(bucket|sum|count)$/, '');
  const type = metrics.types.get(base);
  return type === 'histogram' || type === 'summary' ? base : undefined;
}

/** Problems of one PromQL expression: unknown metric names, labels no metric of it has. */
function problems(expr: string, metrics: Exported): string[] {
  const out: string[] = [];
  const used = [...expr.matchAll(/\boapi_gateway_[a-zA-Z0-9_]+/g)].map((m) => m[0]);
  if (used.length === 0) out.push(`no gateway metric in ${expr}`);
  const known = new Set<string>(TARGET_LABELS);
  for (const name of used) {
    const metric = metricOf(name, metrics);
    if (!metric) out.push(`${name} is not exported`);
    else for (const l of metrics.labels.get(metric) ?? []) known.add(l);
  }
  for (const m of expr.matchAll(/\b(oapi_gateway_[a-zA-Z0-9_]+)\s*\{([^}]*)\}/g)) {
    const metric = metricOf(m[1] as string, metrics);
    const own = new Set([...(metrics.labels.get(metric ?? '') ?? []), ...TARGET_LABELS]);
    for (const l of (m[2] as string).matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)/g))
      if (!own.has(l[1] as string)) out.push(`${m[1]} has no label ${l[1]}`);
  }
  for (const m of expr.matchAll(/\b(?:by|without|on|ignoring)\s*\(([^)]*)\)/g))
    for (const l of (m[1] as string)
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean))
      if (!known.has(l)) out.push(`no metric of the expression has label ${l}`);
  return out;
}

let gw: TestGateway;
let metricsText = '';
let metrics: Exported;
beforeAll(async () => {
  gw = await startTestGateway({
    limits: `
limits:
  - { name: Auth, route: "POST /auth/token", per_hour: 5, per_day: 50 }
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 2, per_day: 20 }
  - { name: Quote, route: "GET /marketdata/quote/{symbol}", per_hour: 1, per_day: 5, shadow: true }
  - { name: Socket, route: "WS /ws/orders", per_hour: 5, per_day: 50 }
`,
  });
  const key = { 'X-API-Key': 'deploy-metrics' };
  // Traffic that creates the labelled series: answers, refusals (enforced and shadow), near-limit, the bridge, a bad key.
  for (let i = 0; i < 3; i++) await send(gw.url, { path: '/orders/1', headers: key });
  for (let i = 0; i < 2; i++) await send(gw.url, { path: '/marketdata/quote/X', headers: key });
  await send(gw.url, {
    method: 'POST',
    path: '/auth/token',
    headers: { ...key, 'Content-Type': 'application/json' },
    body: JSON.stringify({ username: DEMO_USERNAME, password: DEMO_PASSWORD }),
  });
  await send(gw.url, { path: '/orders/1' });
  const text = (metricsText = (await send(gw.adminUrl, { path: '/metrics' })).text);
  const declared = new Map<string, readonly string[]>();
  for (const metric of gw.gateway.metrics.registry.getMetricsAsArray()) {
    // prom-client keeps a metric's declared labels on the metric (not in its typings).
    const names = (metric as unknown as { labelNames?: unknown }).labelNames;
    expect(Array.isArray(names), metric.name).toBe(true);
    declared.set(metric.name, names as string[]);
  }
  metrics = exported(text, declared);
  expect(text).toMatch(
    /^oapi_gateway_refusals_total\{endpoint="GET \/orders\/\{id\}",window="hour",shadow="false"\} 1$/m,
  );
  expect(text).toMatch(/^oapi_gateway_build_info\{version="[^"]+",node="v\d+[^"]*"\} 1$/m);
});
afterAll(async () => {
  await gw?.stop();
});

describe('the Grafana dashboard', () => {
  it('uses only metrics and labels the gateway exports', () => {
    expect(dashboardExprs.length).toBeGreaterThan(10);
    for (const expr of dashboardExprs) expect(problems(expr, metrics), expr).toEqual([]);
  });

  it('covers requests, refusals, latency, Redis, merges, WebSockets, reloads, invalid keys and the build', () => {
    const all = dashboardExprs.join('\n');
    for (const name of [
      'oapi_gateway_requests_total',
      'oapi_gateway_refusals_total',
      'oapi_gateway_request_duration_seconds_bucket',
      'oapi_gateway_upstream_duration_seconds_bucket',
      'oapi_gateway_store_calls_total',
      'oapi_gateway_store_errors_total',
      'oapi_gateway_store_fallbacks_total',
      'oapi_gateway_insurance_merged_total',
      'oapi_gateway_websocket_connections',
      'oapi_gateway_limits_reloads_total',
      'oapi_gateway_invalid_keys_total',
      'oapi_gateway_build_info',
    ])
      expect(all).toContain(name);
  });

  it('is a dashboard Grafana can import: unique panel ids, one Prometheus data source variable', () => {
    const ids = panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(dashboard.templating.list).toContainEqual(
      expect.objectContaining({ name: 'datasource', type: 'datasource' }),
    );
    for (const p of panels.filter((p) => p.targets)) expect(p.datasource?.uid, p.title).toBe('${datasource}');
  });
});

describe('the Prometheus alert rules', () => {
  it('use only metrics and labels the gateway exports', () => {
    for (const rule of rules) expect(problems(rule.expr, metrics), rule.alert).toEqual([]);
  });

  it('each name an alert, a severity and a summary', () => {
    const names = rules.map((r) => r.alert);
    expect(new Set(names).size).toBe(rules.length);
    for (const rule of rules) {
      expect(rule.alert).toMatch(/^OapiGateway[A-Za-z]+$/);
      expect(['critical', 'warning', 'info']).toContain(rule.labels?.severity);
      expect(rule.annotations?.summary, rule.alert).toBeTruthy();
    }
  });

  it('alert on Redis trouble, a refusal-rate jump, bridge 502/504 and a refused reload', () => {
    const uses = (pattern: RegExp): boolean => rules.some((r) => pattern.test(r.expr));
    expect(uses(/oapi_gateway_store_(errors|fallbacks)_total/)).toBe(true);
    expect(uses(/oapi_gateway_refusals_total\{shadow="false"\}/)).toBe(true);
    // The gateway's own 502/504 only (regression: a bridge's own 502/504 counted too).
    expect(uses(/oapi_gateway_own_answers_total\{reason=~"bridge-unreachable\|bridge-timeout"\}/)).toBe(true);
    expect(uses(/status=~"502\|504"/)).toBe(false);
    expect(uses(/oapi_gateway_limits_reloads_total\{result="invalid"\}/)).toBe(true);
    // increase() misses a series' first event: the refused-reload series must exist before any reload is refused.
    expect(metrics.labels.get('oapi_gateway_limits_reloads_total')).toContain('result');
    expect(metricsText).toMatch(/^oapi_gateway_limits_reloads_total\{result="invalid"\} 0$/m);
  });

  const promtool = (process.env.PATH ?? '').split(delimiter).some((dir) => dir && existsSync(join(dir, 'promtool')));
  it.skipIf(!promtool)('pass promtool check rules (skipped: promtool is not on PATH)', async () => {
    const { stdout } = await run('promtool', ['check', 'rules', join(ROOT, 'deploy/prometheus/alerts.yaml')]);
    expect(stdout).toContain('SUCCESS');
  });
});

describe('node dist/sandbox/bridge-main.js', () => {
  it('serves one sandbox bridge of the kind and port given, and stops on SIGTERM', async () => {
    // Port 0: the kernel picks one that no other test can take in between; the line says which.
    const child = spawn(process.execPath, [join(ROOT, 'dist/sandbox/bridge-main.js'), 'fno', '--port', '0'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    try {
      const out = await waitForOutput(child, outputOf(child), '\n', 8000);
      expect(out).toMatch(/^sandbox fno bridge listening on 127\.0\.0\.1:\d+\n$/);
      const port = Number(/:(\d+)\n$/.exec(out)?.[1]);
      expect(port).toBeGreaterThan(0);
      const login = await send(`http://127.0.0.1:${port}`, {
        method: 'POST',
        path: '/oapi/auth/gen-secret-key/derivative',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ username: DEMO_USERNAME, password: DEMO_PASSWORD }),
        agent: false,
      });
      expect(login.status).toBe(200);
      expect(login.json()).toMatchObject({ token_type: 'Bearer' });
      const exit = new Promise<number | null>((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      expect(await exit).toBe(0);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('exits 2 with its usage on a wrong kind', async () => {
    const error = await run(process.execPath, [join(ROOT, 'dist/sandbox/bridge-main.js'), 'xyz']).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect(error).toMatchObject({ code: 2, stderr: expect.stringMatching(/^usage: /) as unknown });
  });
});
