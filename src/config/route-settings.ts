import type { LimitTable } from '../limits/limit-table.js';
import type { Settings } from './settings.js';

/**
 * `routing.routes` and `credential_routes` (README "Configuration") name routes of the limit
 * table, which changes while the gateway serves and `config/gateway.yaml` does not. An entry that
 * names no route of the table does nothing: a typo in the derivative token route would send it to
 * the default bridge, and its body would go unchecked, without a word. The table in force is
 * compared with them on every load, and what names nothing is logged.
 */

/** The entries of each setting that name no route (nor `also` route) of `table`, by route key. */
export interface StrayRoutes {
  readonly routing: readonly string[];
  readonly credentialRoutes: readonly string[];
}

export function strayRoutes(settings: Pick<Settings, 'routing' | 'credentialRoutes'>, table: LimitTable): StrayRoutes {
  const known = new Set(table.rows.flatMap((row) => [row.route.key, ...row.also.map((route) => route.key)]));
  return {
    routing: [...settings.routing.routes.keys()].filter((key) => !known.has(key)),
    credentialRoutes: [...settings.credentialRoutes].filter((key) => !known.has(key)),
  };
}
