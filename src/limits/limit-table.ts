import { createHash } from 'node:crypto';
import { RouteMatcher } from './matcher.js';
import type { Route } from './route.js';
import { WindowCalendar } from './windows.js';

/** One immutable snapshot of `limits.yaml`. The request path reads one snapshot from start to end. */

export interface RowLimits {
  readonly perHour: number;
  readonly perDay: number;
}

export interface LimitRow {
  /** Position in the table, from 0. */
  readonly index: number;
  /** Stable identity: the canonical key of the row's `route`. Names and numbers may change. */
  readonly id: string;
  /** Short hash of `id`, used in counter-store keys. */
  readonly counterId: string;
  readonly name: string;
  readonly route: Route;
  readonly also: readonly Route[];
  readonly limits: RowLimits;
  readonly shadow: boolean;
}

export interface Plan {
  readonly name: string;
  /** Numbers per row, indexed by `LimitRow.index`. */
  readonly limits: readonly RowLimits[];
}

export interface LimitTable {
  readonly file: string;
  readonly hash: string;
  readonly loadedAt: Date;
  readonly timezone: string;
  readonly calendar: WindowCalendar;
  readonly rows: readonly LimitRow[];
  readonly plans: ReadonlyMap<string, Plan>;
  readonly matcher: RouteMatcher<LimitRow>;
}

function counterIdOf(rowId: string): string {
  return createHash('sha256').update(rowId).digest('hex').slice(0, 16);
}

/** The numbers that apply to `row` for a key on `plan` (no plan, or a plan the table lacks: the table as written). */
export function limitsFor(table: LimitTable, row: LimitRow, plan: string | undefined): RowLimits {
  if (plan === undefined) return row.limits;
  return table.plans.get(plan)?.limits[row.index] ?? row.limits;
}

function contentHash(text: string): string {
  return 'sha256:' + createHash('sha256').update(text).digest('hex');
}

export interface TableParts {
  readonly file: string;
  readonly text: string;
  readonly timezone: string;
  readonly rows: readonly Omit<LimitRow, 'counterId'>[];
  readonly plans: ReadonlyMap<string, Plan>;
  readonly loadedAt: Date;
}

/** Builds the snapshot from validated parts (the loader guarantees routes are unique). */
export function buildTable(parts: TableParts): LimitTable {
  const matcher = new RouteMatcher<LimitRow>();
  const rows: LimitRow[] = parts.rows.map((row) => ({ ...row, counterId: counterIdOf(row.id) }));
  for (const row of rows) {
    for (const route of [row.route, ...row.also]) matcher.add(route, row);
  }
  return {
    file: parts.file,
    hash: contentHash(parts.text),
    loadedAt: parts.loadedAt,
    timezone: parts.timezone,
    calendar: new WindowCalendar(parts.timezone),
    rows,
    plans: parts.plans,
    matcher,
  };
}
