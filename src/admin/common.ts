import type { Context, MiddlewareHandler } from 'hono';
import type { TableHolder } from '../config/table-holder.js';
import { errorBody } from '../lib/answers.js';

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
