import type { Context, MiddlewareHandler } from 'hono';
import type { TableHolder } from '../config/table-holder.js';
import type { EventBus, GatewayEvent } from '../events/bus.js';
import { errorBody } from '../lib/answers.js';
import type { Logger } from '../observability/logger.js';

/** An admin refusal: the two-field JSON of every answer the gateway writes (README "Headers and answers"). */
export function refusal(c: Context, status: number, message: string): Response {
  return c.newResponse(errorBody(status, message), status as 400, { 'Content-Type': 'application/json' });
}

/** Answers 503 while no valid table is loaded; otherwise the handlers read the snapshot in force as `table`. */
export function withTable(tables: TableHolder): MiddlewareHandler {
  return async function withTable(c, next) {
    const table = tables.current();
    if (!table) return refusal(c, 503, 'No valid limit table is loaded');
    c.set('table', table);
    await next();
  };
}

/**
 * Tells the other instances of a change already made here (a key issued or revoked, a usage reset,
 * an unblock). An announcement that fails (Redis away a moment, an ACL user without the events
 * channel: docs/operations.md "Redis") must not answer 503 for a change that was made: it is logged
 * with `warning`, and the others learn of it late or not at all.
 */
export function announce(
  deps: { readonly events: EventBus; readonly logger: Logger },
  event: GatewayEvent,
  warning: string,
): Promise<void> {
  return deps.events.publish(event).catch((err: Error) => {
    deps.logger.warn({ err: err.message }, warning);
  });
}
