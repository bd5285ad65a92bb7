import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { REPO_ROOT } from './processes.js';

/**
 * The limit table the benchmarked gateway runs with: the shipped `limits.yaml` (all its rows,
 * so route matching costs what it costs in production) with the measured rows raised far
 * beyond what a run can use, so no allowed request is refused, and one row lowered to a tiny
 * hourly limit for the spent-key measurement.
 */

export const HUGE = 1_000_000_000;
export const TOKEN_ROUTE = 'POST /auth/token';
export const QUOTE_ROUTE = 'GET /marketdata/quote/{symbol}';
export const ORDER_ROUTE = 'POST /orders';
export const SPENT_ROUTE = 'GET /marketdata/orderbook/{symbol}';
export const SPENT_PER_HOUR = 2;
const SPENT_PER_DAY = 1000;

interface Row {
  route: string;
  per_hour: number;
  per_day: number;
  [field: string]: unknown;
}

function setLimits(rows: Row[], route: string, perHour: number, perDay: number): void {
  const row = rows.find((r) => r.route === route);
  if (!row) throw new Error(`limits.yaml has no row "${route}"; the benchmark needs it`);
  row.per_hour = perHour;
  row.per_day = perDay;
}

/** Writes the benchmark's table into `dir` and returns its path. */
export function writeBenchLimits(dir: string): string {
  const table = parse(readFileSync(join(REPO_ROOT, 'limits.yaml'), 'utf8')) as { limits: Row[] };
  setLimits(table.limits, TOKEN_ROUTE, HUGE, HUGE);
  setLimits(table.limits, QUOTE_ROUTE, HUGE, HUGE);
  setLimits(table.limits, ORDER_ROUTE, HUGE, HUGE);
  setLimits(table.limits, SPENT_ROUTE, SPENT_PER_HOUR, SPENT_PER_DAY);
  const path = join(dir, 'bench-limits.yaml');
  writeFileSync(path, `# Written by bench/limits.ts for one benchmark run.\n${stringify(table)}`);
  return path;
}
