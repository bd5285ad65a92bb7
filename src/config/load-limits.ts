import * as v from 'valibot';
import { parseRoute, type Route } from '../limits/route.js';
import { isValidTimezone } from '../limits/windows.js';
import { buildTable, type LimitRow, type LimitTable, type Plan } from '../limits/limit-table.js';
import { readConfigFile } from '../lib/config-file.js';
import { YamlSource, type SourceError } from '../lib/yaml-source.js';
import {
  closed,
  describe,
  got,
  issuesOf,
  mapping,
  record,
  sourceErrors,
  valid,
  type Issue,
} from '../lib/yaml-schema.js';

/**
 * Reads and validates `limits.yaml` (README "The limit table"; plans: "API keys and plans").
 * Every problem is reported, each with its line, column and row; a file with any problem yields
 * no table at all. The schema checks each row and plan on its own; what it cannot see (routes
 * unique across rows, plans naming rows) is checked once the file has the schema's shape.
 */

export type LimitsLoad =
  | { readonly ok: true; readonly table: LimitTable }
  /** `unread`: why the file was not read at all (lib/config-file.ts), when it was not. */
  | { readonly ok: false; readonly errors: readonly SourceError[]; readonly unread?: string };

const isLimit = (n: number): boolean => Number.isSafeInteger(n) && n > 0;
const positiveInteger = (field: string) => valid(v.number, isLimit, got(`${field} must be a positive integer`));

/** `METHOD /path` (limits/route.ts), read into a route. */
export const ROUTE = v.pipe(
  v.string(got('a route must be a string "METHOD /path"')),
  v.rawTransform(({ dataset, addIssue, NEVER }) => {
    const route = parseRoute(dataset.value);
    if (typeof route !== 'string') return route;
    addIssue({ message: route });
    return NEVER;
  }),
);

/** `METHOD /path` kept as written: a key of a mapping. */
export const ROUTE_TEXT = valid(
  v.string,
  (text) => typeof parseRoute(text) !== 'string',
  (issue) => parseRoute(String(issue.input)) as string,
);

const ROW = v.pipe(
  closed(
    {
      name: valid(v.string, (name) => name.trim() !== '', got('name must be a non-empty string')),
      route: ROUTE,
      also: v.optional(v.array(ROUTE, got('also must be a list of routes')), []),
      per_hour: positiveInteger('per_hour'),
      per_day: positiveInteger('per_day'),
      shadow: v.optional(v.boolean(got('shadow must be true or false')), false),
    },
    () => 'a row must be a mapping with name, route, per_hour and per_day',
  ),
  v.forward(
    v.partialCheck(
      [['per_hour'], ['per_day']],
      // valibot runs this on numbers that failed their own check too: one of those is reported once, there.
      (row) => !isLimit(row.per_hour) || !isLimit(row.per_day) || row.per_day >= row.per_hour,
      (issue) => `per_day (${issue.input.per_day}) is below per_hour (${issue.input.per_hour})`,
    ),
    ['per_day'],
  ),
);

const PLAN_ROW = closed(
  { per_hour: v.optional(positiveInteger('per_hour')), per_day: v.optional(positiveInteger('per_day')) },
  () => 'must map to per_hour and/or per_day',
  (key) => `unknown key "${key}" (expected per_hour or per_day)`,
);
const PLAN = closed(
  {
    scale: v.optional(
      valid(v.number, (n) => Number.isFinite(n) && n > 0, got('scale must be a positive number')),
      1,
    ),
    rows: v.optional(
      v.pipe(
        mapping(got('rows must be a mapping of routes to per_hour/per_day')),
        record(ROUTE_TEXT, PLAN_ROW, (key) => `route "${key}" must be "METHOD /path"`),
      ),
      {},
    ),
  },
  () => 'must be a mapping with "scale" and/or "rows"',
);
const PLAN_NAME = v.pipe(
  v.string(),
  v.regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/, 'a plan name is letters, digits, ".", "_" and "-" (at most 64)'),
);

const listMessage = 'limits must be a non-empty list of rows';
const FILE = closed(
  {
    timezone: v.optional(
      valid(v.string, isValidTimezone, (issue) => `unknown timezone ${describe(issue.input)}`),
      'UTC',
    ),
    limits: v.pipe(v.array(ROW, listMessage), v.nonEmpty(listMessage)),
    plans: v.nullish(
      v.pipe(
        mapping(got('plans must be a mapping of plan names')),
        record(PLAN_NAME, PLAN, () => 'the name is reserved'),
      ),
      {},
    ),
  },
  () => 'the file must be a mapping with "limits" (and optionally "timezone" and "plans")',
);

type Table = v.InferOutput<typeof FILE>;
type DraftRow = Omit<LimitRow, 'counterId'>;

/** A limit table of thousands of rows is well under this; a larger file is refused unread (lib/config-file.ts). */
export const MAX_LIMITS_FILE_BYTES = 1024 * 1024;

export async function readLimitsFile(path: string, displayName = path): Promise<LimitsLoad> {
  const read = await readConfigFile(path, MAX_LIMITS_FILE_BYTES);
  if ('problem' in read) {
    return {
      ok: false,
      unread: read.problem,
      errors: [{ file: displayName, line: 1, column: 1, message: read.problem }],
    };
  }
  return parseLimits(read.text, displayName);
}

export function parseLimits(text: string, file: string, loadedAt = new Date()): LimitsLoad {
  const { source, errors } = YamlSource.parse(file, text);
  if (errors.length > 0) return { ok: false, errors: withRows(text, errors) };
  const result = v.safeParse(FILE, source.data);
  const issues = issuesOf(result.issues);
  // A route used twice is reported whatever else is wrong, in those rows or others.
  issues.push(...duplicateRoutes(source, routesOfRows(source.data)));
  // What a plan says about the rows is checked once every row and plan has its shape.
  if (!result.typed) return { ok: false, errors: sourceErrors(source, issues.map(inContext(source.data))) };

  const rows: DraftRow[] = result.output.limits.map((row, index) => ({
    index,
    id: row.route.key,
    name: row.name,
    route: row.route,
    also: row.also,
    limits: { perHour: row.per_hour, perDay: row.per_day },
    shadow: row.shadow,
  }));
  const plans = readPlans(result.output.plans, rows, issues);
  if (issues.length > 0) return { ok: false, errors: sourceErrors(source, issues.map(inContext(source.data))) };
  return { ok: true, table: buildTable({ file, text, timezone: result.output.timezone, rows, plans, loadedAt }) };
}

/** The routes each row of the file names (`route` and `also`), of those that read as routes. */
interface RowRoutes {
  readonly index: number;
  readonly name: string | undefined;
  readonly routes: ReadonlyArray<readonly [Route, Issue['path']]>;
}

function routesOfRows(data: unknown): RowRoutes[] {
  const rows = (data as { limits?: unknown } | null)?.limits;
  if (!Array.isArray(rows)) return [];
  return rows.map((row: unknown, index): RowRoutes => {
    const { name, route, also } = (row ?? {}) as { name?: unknown; route?: unknown; also?: unknown };
    const named: Array<[unknown, Issue['path']]> = [[route, ['limits', index, 'route']]];
    if (Array.isArray(also)) also.forEach((text, i) => named.push([text, ['limits', index, 'also', i]]));
    // One route written without its list is an error of its own, and still a route used.
    else if (typeof also === 'string') named.push([also, ['limits', index, 'also']]);
    const routes: Array<readonly [Route, Issue['path']]> = [];
    for (const [text, path] of named) {
      const parsed = typeof text === 'string' ? parseRoute(text) : undefined;
      if (parsed !== undefined && typeof parsed !== 'string') routes.push([parsed, path]);
    }
    return { index, name: typeof name === 'string' && name.trim() ? name : undefined, routes };
  });
}

/** A route appears once in the whole file. */
function duplicateRoutes(source: YamlSource, rows: readonly RowRoutes[]): Issue[] {
  const issues: Issue[] = [];
  const seen = new Map<string, { row: RowRoutes; line: number }>();
  for (const row of rows) {
    for (const [route, path] of row.routes) {
      const first = seen.get(route.key);
      if (!first) seen.set(route.key, { row, line: source.position(source.at(path)).line });
      else {
        const name = first.row.name === undefined ? '' : ` (${first.row.name})`;
        const where = `row ${first.row.index + 1}${name} at line ${first.line}`;
        issues.push({ path, message: `route "${route.text}" is already used by ${where}` });
      }
    }
  }
  return issues;
}

/**
 * Each plan's numbers for every row: the row's scaled by `scale` (at least 1), or the plan's own.
 * Adds to `issues` a plan row whose route no row has, and a plan row whose per_day ends up below
 * its per_hour, or a scale that takes a number past the largest integer (rows and plans with errors
 * of their own are reported there, not again here).
 */
function readPlans(plans: Table['plans'], rows: readonly DraftRow[], issues: Issue[]): Map<string, Plan> {
  const before = [...issues];
  const invalid = (section: string, at: string | number) =>
    before.some((issue) => issue.path[0] === section && issue.path[1] === at);
  const rowByRoute = new Map(rows.flatMap((row) => [row.route, ...row.also].map((route) => [route.key, row])));
  const result = new Map<string, Plan>();
  for (const [name, plan] of Object.entries(plans)) {
    const overrides = new Map<number, { perHour?: number; perDay?: number; text: string }>();
    for (const [text, numbers] of Object.entries(plan.rows)) {
      const route = parseRoute(text);
      if (typeof route === 'string') continue;
      const row = rowByRoute.get(route.key);
      // A row set twice (its route under two parameter names, or beside an `also` route) would take
      // the numbers of whichever comes last: as with a route used twice, the file says which it means.
      const first = row && overrides.get(row.index);
      if (row && !first) overrides.set(row.index, { perHour: numbers.per_hour, perDay: numbers.per_day, text });
      else
        issues.push({
          path: ['plans', name, 'rows', text],
          key: true,
          message: first
            ? `row ${row.index + 1} (${row.name}) is already set by "${first.text}"`
            : `no row of the table has route "${route.text}"`,
        });
    }
    let overflow = false;
    const limits = rows.map((row) => {
      const override = overrides.get(row.index);
      const perHour = override?.perHour ?? Math.max(1, scaled(row.limits.perHour, plan.scale));
      const perDay = override?.perDay ?? Math.max(1, scaled(row.limits.perDay, plan.scale));
      // A scaled number is a limit like any other: a positive integer (README "The limit table"),
      // not a float past 2^53 or Infinity. Said once per plan, at its scale.
      const past = (
        [
          ['per_hour', perHour],
          ['per_day', perDay],
        ] as const
      ).find(([, n]) => !Number.isSafeInteger(n));
      if (past !== undefined && !overflow && !invalid('limits', row.index) && !invalid('plans', name)) {
        overflow = true;
        issues.push({
          path: ['plans', name, 'scale'],
          message: `scale ${plan.scale} makes ${past[0]} of row ${row.index + 1} (${row.name}) ${past[1]}, past the largest limit (${Number.MAX_SAFE_INTEGER})`,
        });
      }
      if (perDay < perHour && !invalid('limits', row.index) && !invalid('plans', name)) {
        issues.push({
          path: override ? ['plans', name, 'rows', override.text] : ['plans', name],
          key: override !== undefined,
          message: `row ${row.index + 1} (${row.name}): per_day (${perDay}) is below per_hour (${perHour})`,
        });
      }
      return { perHour, perDay };
    });
    result.set(name, { name, limits });
  }
  return result;
}

/**
 * `n` × `scale` rounded down, `scale` taken as the decimal it is written as: a float product is
 * off by a hair for most scales (100 × 2.3 is 229.99999999999997), and rounding it down lost a unit.
 */
function scaled(n: number, scale: number): number {
  const [digits = '', exponent = '0'] = String(scale).split('e');
  const [whole = '', fraction = ''] = digits.split('.');
  const product = BigInt(n) * BigInt(whole + fraction);
  const shift = fraction.length - Number(exponent);
  return Number(shift > 0 ? product / 10n ** BigInt(shift) : product * 10n ** BigInt(-shift));
}

/** An issue as it reads in its place: in a row, with the row's number and name; in a plan, after the plan's name. */
const inContext =
  (data: unknown) =>
  (issue: Issue): Issue => {
    const [section, at, , route] = issue.path;
    if (section === 'limits' && typeof at === 'number') {
      const name = (data as { limits: Array<{ name?: unknown }> }).limits[at]?.name;
      return { ...issue, row: { row: at + 1, ...(typeof name === 'string' && name.trim() ? { rowName: name } : {}) } };
    }
    if (section !== 'plans' || at === undefined) return issue;
    // At a plan row's value itself, the issue is that it is no mapping: say which route's it is.
    const which = issue.path.length === 4 && !issue.key ? `"${route}" ` : '';
    return { ...issue, message: `plan "${at}": ${which}${issue.message}` };
  };

/**
 * Names the row a YAML syntax error is in. Rows are found in the text, by their `-` lines under
 * `limits:`, not in what the parser made of a broken file: a misindented line there reads as
 * a row of its own, and would be blamed on a row that does not exist.
 */
function withRows(text: string, errors: SourceError[]): SourceError[] {
  const rows = rowsInText(text);
  return errors.map((e) => {
    const row = rows.findLast((r) => r.line <= e.line && e.line <= r.lastLine);
    return row ? { ...e, row: row.row, ...(row.name ? { rowName: row.name } : {}) } : e;
  });
}

interface RowInText {
  readonly row: number;
  name: string | undefined;
  /** First and last line of the row (1-based). */
  readonly line: number;
  lastLine: number;
  /** Column of the row's own keys (after its `- `); a `name:` deeper in is not the row's. */
  readonly keyIndent: number;
}

function rowsInText(text: string): RowInText[] {
  const lines = text.split(/\r?\n/);
  const rows: RowInText[] = [];
  const start = lines.findIndex((l) => /^limits\s*:/.test(l));
  if (start === -1) return rows;
  // Column of the first row's `-`; a `-` left of its keys starts a row even when misindented.
  let rowIndent: number | undefined;
  for (let i = start + 1; i < lines.length; i++) {
    const line = lines[i] as string;
    if (/^\s*(#|$)/.test(line)) continue;
    // The next top-level key, or the end of the YAML document, ends the rows.
    if (/^[^\s-]/.test(line) || /^(---|\.\.\.)(\s|$)/.test(line)) return rows;
    const dash = /^([ \t]*)-([ \t]+|$)/.exec(line);
    const dashIndent = dash?.[1]?.length;
    rowIndent ??= dashIndent;
    if (dash && dashIndent !== undefined && rowIndent !== undefined && dashIndent < rowIndent + 2) {
      rows.push({ row: rows.length + 1, name: undefined, line: i + 1, lastLine: i + 1, keyIndent: dash[0].length });
    }
    const current = rows[rows.length - 1];
    if (!current) continue;
    current.lastLine = i + 1;
    current.name ??= rowName(line, current.line === i + 1, current.keyIndent);
  }
  // The rows run to the end of the file, and so does the last one: a parser that reaches the end
  // in it (a bracket of its last line left open) stops past its last line.
  const last = rows[rows.length - 1];
  if (last) last.lastLine = lines.length;
  return rows;
}

/** The row's `name` if this line gives it: `- name: X`, `- { name: X, … }` on its first line, or `name: X` at the row's own key column. */
function rowName(line: string, first: boolean, keyIndent: number): string | undefined {
  if (first) {
    const flow = /^[ \t]*-[ \t]+\{.*?\bname\s*:\s*("[^"]*"|'[^']*'|[^,}]*)/.exec(line)?.[1];
    if (flow !== undefined) return unquoted(flow.trim());
    const block = /^[ \t]*-[ \t]+name\s*:\s*(.*?)\s*$/.exec(line)?.[1];
    if (block) return unquoted(block);
  }
  const indent = /^[ \t]*/.exec(line)?.[0].length ?? 0;
  const nested = indent === keyIndent ? /^[ \t]*name\s*:\s*(.*?)\s*$/.exec(line)?.[1] : undefined;
  return nested ? unquoted(nested) : undefined;
}

/**
 * A row name as written: quotes taken off (an unclosed one too), a trailing comment dropped. A
 * value that opens a flow collection (`[`, `{`) is no name, being likely what broke the file; nor
 * is one that begins with a block scalar's, an anchor's, a tag's or an alias's sign.
 */
function unquoted(value: string): string | undefined {
  const quoted = /^(["'])(.*?)\1/.exec(value);
  if (quoted) return quoted[2];
  if (/^[[{|>&!*]/.test(value)) return undefined;
  return value.replace(/^["']/, '').replace(/\s+#.*$/, '');
}
