import type { Context } from 'hono';
import type { GatewayEnv } from './context.js';

/**
 * A request header by its lower-case name. Over a socket it comes straight from Node's parsed
 * headers (hono's accessor validates the name and, for some headers, copies the raw header list
 * on every call); in-process (app.request()) from the Request.
 */
export function requestHeader(c: Context<GatewayEnv>, name: string): string | undefined {
  const incoming = c.env?.incoming;
  if (!incoming) return c.req.header(name);
  const value = incoming.headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
}
