import { Hono } from 'hono';
import { formatSourceError } from '../lib/yaml-source.js';
import { limitsFor, type LimitTable } from '../limits/limit-table.js';
import type { AdminDeps } from './app.js';
import { refusal, withTable } from './common.js';

/** `/admin/limits` (docs/operations.md "Changing limits while it serves"): the table in force, and a reload now. */
export function limitsApp(deps: AdminDeps): Hono {
  const { tables } = deps;
  const app = new Hono();
  app.get('/', withTable(tables), (c) => c.json(describeTable(c.get('table'), tables.displayName)));

  app.post('/reload', async (c) => {
    const result = await deps.reload();
    // WORKERS=n: a worker did not answer, or has another table (the file changed meanwhile).
    if (!result.ok && 'unsettled' in result) return refusal(c, 503, result.unsettled);
    if (!result.ok) {
      return c.json(
        {
          error: 'Unprocessable Content',
          message: `${tables.displayName} is not valid; the table in force stays`,
          errors: result.errors.map(formatSourceError),
        },
        422,
      );
    }
    return c.json({ hash: result.table.hash, loadedAt: result.table.loadedAt.toISOString(), changed: result.changed });
  });
  return app;
}

function describeTable(table: LimitTable, file: string): object {
  return {
    file,
    hash: table.hash,
    loadedAt: table.loadedAt.toISOString(),
    timezone: table.timezone,
    limits: table.rows.map((row) => ({
      name: row.name,
      route: row.route.text,
      ...(row.also.length ? { also: row.also.map((r) => r.text) } : {}),
      per_hour: row.limits.perHour,
      per_day: row.limits.perDay,
      ...(row.shadow ? { shadow: true } : {}),
    })),
    plans: Object.fromEntries(
      [...table.plans.values()].map((plan) => [
        plan.name,
        table.rows.map((row) => {
          const limits = limitsFor(table, row, plan.name);
          return { route: row.route.text, per_hour: limits.perHour, per_day: limits.perDay };
        }),
      ]),
    ),
  };
}
