import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { limitsFor } from '../../src/limits/limit-table.js';
import { parseLimits, readLimitsFile } from '../../src/config/load-limits.js';
import { formatSourceError } from '../../src/lib/yaml-source.js';

const fixtures = new URL('../fixtures/limits/invalid/', import.meta.url);

/** The specification's limit table, as printed there (README "The limit table"). */
const SEED_TABLE: Array<[string, string, number, number]> = [
  ['Authentication', 'POST /auth/token', 60, 500],
  ['Authentication', 'POST /auth/refresh', 120, 1000],
  ['Place Order', 'POST /orders', 3600, 50000],
  ['Modify Order', 'PUT /orders/{id}', 3600, 50000],
  ['Cancel Order', 'DELETE /orders/{id}', 3600, 50000],
  ['Order Status', 'GET /orders/{id}', 7200, 100000],
  ['Order List', 'GET /orders', 1800, 20000],
  ['Account Information', 'GET /accounts/{id}', 1800, 20000],
  ['Account Balance', 'GET /accounts/{id}/balance', 3600, 40000],
  ['Portfolio Information', 'GET /portfolio/{id}', 1800, 20000],
  ['Portfolio Positions', 'GET /portfolio/{id}/positions', 1800, 20000],
  ['Latest Quote', 'GET /marketdata/quote/{symbol}', 18000, 200000],
  ['Order Book', 'GET /marketdata/orderbook/{symbol}', 10000, 100000],
  ['Price History', 'GET /marketdata/history/{symbol}', 3600, 30000],
  ['Instruments List', 'GET /instruments', 3600, 20000],
  ['Symbols List', 'GET /symbols', 3600, 20000],
  ['WebSocket, Market Data', 'WS /ws/marketdata', 60, 500],
  ['WebSocket, Orders', 'WS /ws/orders', 60, 500],
];

describe('the shipped limits.yaml', () => {
  it('holds the 18 rows of the specification, names and numbers as there, in order', async () => {
    const result = await readLimitsFile('limits.yaml');
    if (!result.ok) throw new Error(result.errors.map(formatSourceError).join('\n'));
    expect(result.table.rows.map((r) => [r.name, r.route.text, r.limits.perHour, r.limits.perDay])).toEqual(SEED_TABLE);
    expect(result.table.timezone).toBe('Asia/Ho_Chi_Minh');
    expect(result.table.rows.every((r) => !r.shadow)).toBe(true);
  });

  it("counts days from midnight in Vietnam, the broker's time zone (17:00 UTC)", async () => {
    const result = await readLimitsFile('limits.yaml');
    if (!result.ok) throw new Error(result.errors.map(formatSourceError).join('\n'));
    const windows = result.table.calendar.at(new Date('2026-11-23T02:15:00Z').getTime());
    expect(new Date(windows.dayStart).toISOString()).toBe('2026-11-22T17:00:00.000Z');
    expect(new Date(windows.dayEnd).toISOString()).toBe('2026-11-23T17:00:00.000Z');
  });

  it('counts the two token operations of the specification on the POST /auth/token row', async () => {
    const result = await readLimitsFile('limits.yaml');
    if (!result.ok) throw new Error('invalid');
    const auth = result.table.rows[0];
    expect(auth?.also.map((r) => r.text)).toEqual([
      'POST /oapi/auth/gen-secret-key/underlying',
      'POST /oapi/auth/gen-secret-key/derivative',
    ]);
    for (const path of [
      ['oapi', 'auth', 'gen-secret-key', 'underlying'],
      ['oapi', 'auth', 'gen-secret-key', 'derivative'],
      ['auth', 'token'],
    ]) {
      const match = result.table.matcher.match('POST', path);
      expect(match.kind === 'match' && match.entry.value).toBe(auth);
    }
  });

  it('defines the premium and market-maker plans of the shipped limits.yaml', async () => {
    const result = await readLimitsFile('limits.yaml');
    if (!result.ok) throw new Error('invalid');
    const { table } = result;
    const quote = table.rows.find((r) => r.route.text === 'GET /marketdata/quote/{symbol}')!;
    const orders = table.rows.find((r) => r.route.text === 'GET /orders')!;
    expect(limitsFor(table, orders, 'premium')).toEqual({ perHour: 1800 * 5, perDay: 20000 * 5 });
    expect(limitsFor(table, quote, 'market-maker')).toEqual({ perHour: 100000, perDay: 1000000 });
    expect(limitsFor(table, orders, 'market-maker')).toEqual({ perHour: 1800, perDay: 20000 });
    expect(limitsFor(table, orders, undefined)).toBe(orders.limits);
  });
});

describe('an invalid table', () => {
  const names = readdirSync(fixtures)
    .filter((f) => f.endsWith('.yaml'))
    .sort();

  it('has a fixture for every rule of README "The limit table"', () => {
    expect(names.length).toBeGreaterThanOrEqual(20);
  });

  it.each(names)('%s is refused with its row and line', (name) => {
    const text = readFileSync(new URL(name, fixtures), 'utf8');
    const expected = readFileSync(new URL(name.replace(/\.yaml$/, '.errors'), fixtures), 'utf8')
      .trimEnd()
      .split('\n');
    const result = parseLimits(text, name);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.errors.map(formatSourceError)).toEqual(expected);
  });

  it('reports every unknown key of a mapping, each at its key, and a missing key at its mapping', () => {
    const text = 'limits:\n  - name: A\n    routes: GET /a\n    per_hour: 1\n    per_day: 2\n    burst: 3\n';
    const result = parseLimits(text, 'x.yaml');
    expect(result.ok).toBe(false);
    if (!result.ok)
      expect(result.errors.map(formatSourceError)).toEqual([
        'x.yaml:2:5: row 1 (A): missing "route"',
        'x.yaml:3:5: row 1 (A): unknown key "routes" (expected one of name, route, also, per_hour, per_day, shadow)',
        'x.yaml:6:5: row 1 (A): unknown key "burst" (expected one of name, route, also, per_hour, per_day, shadow)',
      ]);
  });

  it('names the route of a plan row that maps to something other than per_hour and per_day', () => {
    const text =
      'limits:\n  - {name: A, route: GET /a, per_hour: 1, per_day: 2}\nplans:\n  p:\n    rows:\n      GET /a: 5\n';
    const result = parseLimits(text, 'x.yaml');
    expect(result.ok).toBe(false);
    if (!result.ok)
      expect(result.errors.map(formatSourceError)).toEqual([
        'x.yaml:6:15: plan "p": "GET /a" must map to per_hour and/or per_day',
      ]);
  });

  it('yields no table at all, even when most rows are fine', () => {
    const text = readFileSync(new URL('several-errors.yaml', fixtures), 'utf8');
    expect(parseLimits(text, 'x.yaml')).not.toHaveProperty('table');
  });
});

describe('a valid table', () => {
  it('keeps a row identity that survives renaming the row, its parameter and its numbers', () => {
    const a = parseLimits('limits:\n  - {name: A, route: "GET /orders/{id}", per_hour: 1, per_day: 2}\n', 'a.yaml');
    const b = parseLimits(
      'limits:\n  - {name: B, route: "GET /orders/{orderId}", per_hour: 10, per_day: 20}\n',
      'b.yaml',
    );
    if (!a.ok || !b.ok) throw new Error('invalid');
    expect(a.table.rows[0]?.counterId).toBe(b.table.rows[0]?.counterId);
    expect(a.table.hash).not.toBe(b.table.hash);
  });

  it('defaults the timezone to UTC and reads shadow rows', () => {
    const result = parseLimits(
      'limits:\n  - {name: A, route: "GET /a", per_hour: 1, per_day: 2, shadow: true}\n',
      'a.yaml',
    );
    if (!result.ok) throw new Error('invalid');
    expect(result.table.timezone).toBe('UTC');
    expect(result.table.rows[0]?.shadow).toBe(true);
  });

  it('reads a plans key with no value as no plans, and YAML aliases as their values', () => {
    const result = parseLimits(
      'limits:\n  - {name: A, route: GET /a, per_hour: &n 10, per_day: *n}\nplans:\n',
      'a.yaml',
    );
    if (!result.ok) throw new Error(result.errors.map(formatSourceError).join('\n'));
    expect(result.table.rows[0]?.limits).toEqual({ perHour: 10, perDay: 10 });
    expect(result.table.plans.size).toBe(0);
  });

  it("scales a row by the plan's scale as written, rounded down (regression: 100 × 2.3 was 229, the float product rounded down)", () => {
    const result = parseLimits(
      'limits:\n  - {name: A, route: GET /a, per_hour: 100, per_day: 1000}\nplans:\n' +
        '  a: {scale: 2.3}\n  b: {scale: 1.15}\n  c: {scale: 0.29}\n  d: {scale: 1.005}\n  e: {scale: 2.5e-2}\n  f: {scale: 1e2}\n',
      'a.yaml',
    );
    if (!result.ok) throw new Error(result.errors.map(formatSourceError).join('\n'));
    const row = result.table.rows[0]!;
    expect(['a', 'b', 'c', 'd', 'e', 'f'].map((plan) => limitsFor(result.table, row, plan))).toEqual([
      { perHour: 230, perDay: 2300 },
      { perHour: 115, perDay: 1150 },
      { perHour: 29, perDay: 290 },
      { perHour: 100, perDay: 1005 },
      { perHour: 2, perDay: 25 },
      { perHour: 10000, perDay: 100000 },
    ]);
  });

  it('reports a missing file as an error, not a crash', async () => {
    const result = await readLimitsFile('does-not-exist.yaml');
    expect(result.ok).toBe(false);
    if (!result.ok) expect(formatSourceError(result.errors[0]!)).toBe('does-not-exist.yaml:1:1: file not found');
  });
});
