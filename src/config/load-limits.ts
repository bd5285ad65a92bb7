import { readFile } from 'node:fs/promises';
import type { YAMLMap } from 'yaml';
import { parseRoute, type Route } from '../limits/route.js';
import { isValidTimezone } from '../limits/windows.js';
import { buildTable, type LimitRow, type LimitTable, type Plan, type RowLimits } from '../limits/limit-table.js';
import {
  describe,
  entries,
  isYamlMap,
  isYamlSeq,
  scalarValue,
  YamlSource,
  byPosition,
  type SourceError,
} from '../lib/yaml-source.js';

/**
 * Reads and validates `limits.yaml` (INTERFACE §4, plans of §10). Every problem is reported,
 * each with its line, column and row; a file with any problem yields no table at all.
 */

export type LimitsLoad =
  { readonly ok: true; readonly table: LimitTable } | { readonly ok: false; readonly errors: readonly SourceError[] };

const TOP_KEYS = ['timezone', 'limits', 'plans'];
const ROW_KEYS = ['name', 'route', 'also', 'per_hour', 'per_day', 'shadow'];
const PLAN_KEYS = ['scale', 'rows'];
const PLAN_ROW_KEYS = ['per_hour', 'per_day'];
const PLAN_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const DEFAULT_TIMEZONE = 'UTC';

export async function readLimitsFile(path: string, displayName = path): Promise<LimitsLoad> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'file not found' : 'file cannot be read';
    return { ok: false, errors: [{ file: displayName, line: 1, column: 1, message: reason }] };
  }
  return parseLimits(text, displayName);
}

export function parseLimits(text: string, file: string, loadedAt = new Date()): LimitsLoad {
  const { source, errors } = YamlSource.parse(file, text);
  if (errors.length > 0) return { ok: false, errors: withRows(text, errors) };
  const root = source.root;
  if (!isYamlMap(root)) {
    return {
      ok: false,
      errors: [source.error(root, 'the file must be a mapping with "limits" (and optionally "timezone" and "plans")')],
    };
  }

  let timezone = DEFAULT_TIMEZONE;
  let limitsNode: unknown;
  let plansNode: unknown;
  for (const { key, pair, value } of entries(root)) {
    if (key === 'timezone') {
      const tz = scalarValue(value);
      if (typeof tz !== 'string' || !isValidTimezone(tz))
        errors.push(source.error(value, `unknown timezone ${describe(value)}`));
      else timezone = tz;
    } else if (key === 'limits') {
      limitsNode = value;
    } else if (key === 'plans') {
      plansNode = value;
    } else {
      errors.push(source.error(pair.key, `unknown key "${key}" (expected one of ${TOP_KEYS.join(', ')})`));
    }
  }

  const routesSeen = new Set<string>();
  const rows = readRows(source, root, limitsNode, errors, routesSeen);
  const plans =
    plansNode === undefined || plansNode === null
      ? new Map<string, Plan>()
      : readPlans(source, plansNode, rows, routesSeen, errors);
  if (errors.length > 0) return { ok: false, errors: byPosition(errors) };
  return { ok: true, table: buildTable({ file, text, timezone, rows, plans, loadedAt }) };
}

type DraftRow = Omit<LimitRow, 'counterId'>;

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
    if (/^[^\s-]/.test(line) || /^(---|\.\.\.)(\s|$)/.test(line)) break;
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

/** A row name as written: quotes taken off (an unclosed one too), a trailing comment dropped. */
function unquoted(value: string): string {
  const quoted = /^(["'])(.*?)\1/.exec(value);
  if (quoted) return quoted[2] as string;
  return value.replace(/^["']/, '').replace(/\s+#.*$/, '');
}

/** Reads the rows; `routesSeen` gets every well-formed route, also those of rows with errors. */
function readRows(
  source: YamlSource,
  root: YAMLMap<unknown, unknown>,
  node: unknown,
  errors: SourceError[],
  routesSeen: Set<string>,
): DraftRow[] {
  if (node === undefined) {
    errors.push(source.error(root, 'missing "limits"'));
    return [];
  }
  if (!isYamlSeq(node) || node.items.length === 0) {
    errors.push(source.error(node, 'limits must be a non-empty list of rows'));
    return [];
  }
  const rows: DraftRow[] = [];
  const seen = new Map<string, { row: number; name: string; line: number }>();

  node.items.forEach((item, index) => {
    const rowNumber = index + 1;
    if (!isYamlMap(item)) {
      errors.push(
        source.error(item, 'a row must be a mapping with name, route, per_hour and per_day', { row: rowNumber }),
      );
      return;
    }
    const fields = new Map(entries(item).map((e) => [e.key, e]));
    const name = scalarValue(fields.get('name')?.value);
    const at = { row: rowNumber, ...(typeof name === 'string' && name.trim() ? { rowName: name } : {}) };
    const rowErrors: SourceError[] = [];
    const fail = (n: unknown, message: string): void => void rowErrors.push(source.error(n, message, at));

    for (const { key, pair } of fields.values()) {
      if (!ROW_KEYS.includes(key)) fail(pair.key, `unknown key "${key}" (expected one of ${ROW_KEYS.join(', ')})`);
    }
    for (const required of ['name', 'route', 'per_hour', 'per_day']) {
      if (!fields.has(required)) fail(item, `missing "${required}"`);
    }
    if (fields.has('name') && (typeof name !== 'string' || name.trim() === '')) {
      fail(fields.get('name')?.value, `name must be a non-empty string, got ${describe(fields.get('name')?.value)}`);
    }

    const routes: Route[] = [];
    const readRouteNode = (routeNode: unknown): void => {
      const text = scalarValue(routeNode);
      if (typeof text !== 'string')
        return fail(routeNode, `a route must be a string "METHOD /path", got ${describe(routeNode)}`);
      const route = parseRoute(text);
      if (typeof route === 'string') return fail(routeNode, route);
      const line = source.position(routeNode).line;
      const first = seen.get(route.key);
      if (first) {
        return fail(
          routeNode,
          `route "${route.text}" is already used by row ${first.row} (${first.name}) at line ${first.line}`,
        );
      }
      seen.set(route.key, { row: rowNumber, name: typeof name === 'string' ? name : '?', line });
      routesSeen.add(route.key);
      routes.push(route);
    };
    const routeField = fields.get('route');
    if (routeField) readRouteNode(routeField.value);
    const alsoField = fields.get('also');
    if (alsoField) {
      if (!isYamlSeq(alsoField.value))
        fail(alsoField.value, `also must be a list of routes, got ${describe(alsoField.value)}`);
      else for (const alsoNode of alsoField.value.items) readRouteNode(alsoNode);
    }

    const perHour = positiveInteger(fields.get('per_hour')?.value, 'per_hour', fields.has('per_hour'), fail);
    const perDay = positiveInteger(fields.get('per_day')?.value, 'per_day', fields.has('per_day'), fail);
    if (perHour !== undefined && perDay !== undefined && perDay < perHour) {
      fail(fields.get('per_day')?.value, `per_day (${perDay}) is below per_hour (${perHour})`);
    }
    let shadow = false;
    const shadowField = fields.get('shadow');
    if (shadowField) {
      const value = scalarValue(shadowField.value);
      if (typeof value !== 'boolean')
        fail(shadowField.value, `shadow must be true or false, got ${describe(shadowField.value)}`);
      else shadow = value;
    }

    errors.push(...rowErrors);
    const [route, ...also] = routes;
    if (rowErrors.length === 0 && route && perHour !== undefined && perDay !== undefined && typeof name === 'string') {
      rows.push({ index: rows.length, id: route.key, name, route, also, limits: { perHour, perDay }, shadow });
    }
  });
  return rows;
}

function positiveInteger(
  node: unknown,
  field: string,
  present: boolean,
  fail: (n: unknown, m: string) => void,
): number | undefined {
  if (!present) return undefined;
  const value = scalarValue(node);
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value <= 0) {
    fail(node, `${field} must be a positive integer, got ${describe(node)}`);
    return undefined;
  }
  return value;
}

function readPlans(
  source: YamlSource,
  node: unknown,
  rows: readonly DraftRow[],
  routesSeen: ReadonlySet<string>,
  errors: SourceError[],
): Map<string, Plan> {
  const plans = new Map<string, Plan>();
  if (!isYamlMap(node)) {
    errors.push(source.error(node, `plans must be a mapping of plan names, got ${describe(node)}`));
    return plans;
  }
  const rowByRoute = new Map<string, DraftRow>();
  for (const row of rows) for (const route of [row.route, ...row.also]) rowByRoute.set(route.key, row);

  for (const { key: name, pair, value } of entries(node)) {
    const planErrors: SourceError[] = [];
    const fail = (n: unknown, message: string): void =>
      void planErrors.push(source.error(n, `plan "${name}": ${message}`));
    if (!PLAN_NAME.test(name)) fail(pair.key, 'a plan name is letters, digits, ".", "_" and "-" (at most 64)');
    if (!isYamlMap(value)) {
      errors.push(source.error(value ?? pair.key, `plan "${name}": must be a mapping with "scale" and/or "rows"`));
      continue;
    }
    let scale = 1;
    const overrides = new Map<number, { perHour?: number; perDay?: number; node: unknown }>();
    for (const { key, pair: field, value: fieldValue } of entries(value)) {
      if (key === 'scale') {
        const s = scalarValue(fieldValue);
        if (typeof s !== 'number' || !Number.isFinite(s) || s <= 0)
          fail(fieldValue, `scale must be a positive number, got ${describe(fieldValue)}`);
        else scale = s;
      } else if (key === 'rows') {
        if (!isYamlMap(fieldValue)) {
          fail(fieldValue, `rows must be a mapping of routes to per_hour/per_day, got ${describe(fieldValue)}`);
          continue;
        }
        for (const { key: routeText, pair: rowPair, value: numbers } of entries(fieldValue)) {
          const route = parseRoute(routeText);
          if (typeof route === 'string') {
            fail(rowPair.key, route);
            continue;
          }
          const row = rowByRoute.get(route.key);
          if (!row) {
            // A row that exists but has errors of its own is reported there, not again here.
            if (!routesSeen.has(route.key)) fail(rowPair.key, `no row of the table has route "${route.text}"`);
            continue;
          }
          if (!isYamlMap(numbers)) {
            fail(numbers ?? rowPair.key, `"${route.text}" must map to per_hour and/or per_day`);
            continue;
          }
          const override: { perHour?: number; perDay?: number; node: unknown } = { node: rowPair.key };
          for (const { key: numberKey, pair: numberPair, value: numberNode } of entries(numbers)) {
            if (!PLAN_ROW_KEYS.includes(numberKey)) {
              fail(numberPair.key, `unknown key "${numberKey}" (expected per_hour or per_day)`);
              continue;
            }
            const n = positiveInteger(numberNode, numberKey, true, fail);
            if (n !== undefined) override[numberKey === 'per_hour' ? 'perHour' : 'perDay'] = n;
          }
          overrides.set(row.index, override);
        }
      } else {
        fail(field.key, `unknown key "${key}" (expected one of ${PLAN_KEYS.join(', ')})`);
      }
    }

    const limits: RowLimits[] = rows.map((row) => {
      const scaled = {
        perHour: Math.max(1, Math.floor(row.limits.perHour * scale)),
        perDay: Math.max(1, Math.floor(row.limits.perDay * scale)),
      };
      const override = overrides.get(row.index);
      const result = { perHour: override?.perHour ?? scaled.perHour, perDay: override?.perDay ?? scaled.perDay };
      if (result.perDay < result.perHour) {
        fail(
          override?.node ?? value,
          `row ${row.index + 1} (${row.name}): per_day (${result.perDay}) is below per_hour (${result.perHour})`,
        );
      }
      return result;
    });
    errors.push(...planErrors);
    if (planErrors.length === 0) plans.set(name, { name, limits });
  }
  return plans;
}
