import { Hono, type Context, type MiddlewareHandler } from 'hono';
import { sha256Hex } from '../lib/hash.js';
import { limitsFor } from '../limits/limit-table.js';
import { secondsUntil } from '../limits/windows.js';
import type { AdminDeps } from './app.js';
import { announce, refusal, withTable } from './common.js';

/**
 * A key's usage on every row, in table order, and its reset (docs/operations.md "The admin listener"). The key
 * in the path is a secret like any other: only its hash goes further.
 */
export function usageApp(deps: AdminDeps): Hono {
  const app = new Hono();
  app.use(withTable(deps.tables));
  if (deps.apiKeyMode === 'registered') app.use('/:apiKey', issuedKeysOnly(deps));
  app.get('/:apiKey', (c) => usageAnswer(c, deps, sha256Hex(c.req.param('apiKey'))));
  app.delete('/:apiKey', (c) => resetAnswer(c, deps, sha256Hex(c.req.param('apiKey'))));
  return app;
}

/** In `registered` mode only issued keys have usage: a made-up string is no key (404), not one with zeros. */
function issuedKeysOnly(deps: AdminDeps): MiddlewareHandler {
  return async function issuedKeysOnly(c, next) {
    const issued = await deps.registry.resolve(sha256Hex(c.req.param('apiKey') ?? ''));
    if (issued === 'unavailable') return refusal(c, 503, 'Key store unavailable');
    if (issued === 'not-issued') return refusal(c, 404, 'No issued key is this key');
    await next();
  };
}

/** The usage JSON of one key (by its hash), on the table in force; store failures reach the app's onError. */
export async function usageAnswer(c: Context, deps: AdminDeps, keyHash: string): Promise<Response> {
  const table = c.get('table');
  const plan = deps.registry.lookup(keyHash)?.plan;
  // The counts and the resets of one instant, the limiter's (its clock is the one requests are counted by).
  const { at, windows, rows: usage } = await deps.limiter.usage(keyHash, table.rows, table.calendar);
  const window = (limit: number, used: number, end: number) => ({
    limit,
    used,
    remaining: Math.max(0, limit - used),
    resetSeconds: secondsUntil(end, at),
  });
  return c.json({
    endpoints: table.rows.map((row, i) => {
      const limits = limitsFor(table, row, plan);
      const used = usage[i] ?? { hour: 0, day: 0 };
      return {
        name: row.name,
        route: row.route.text,
        hour: window(limits.perHour, used.hour, windows.hourEnd),
        day: window(limits.perDay, used.day, windows.dayEnd),
      };
    }),
  });
}

/** Resets one key's counters on every row, on every instance at once. */
export async function resetAnswer(c: Context, deps: AdminDeps, keyHash: string): Promise<Response> {
  await deps.limiter.reset(keyHash, c.get('table').rows);
  await announce(
    deps,
    { type: 'usage-reset', keyHash },
    'usage reset not announced; other instances may refuse the key from memory until its window ends',
  );
  return c.body(null, 204);
}
