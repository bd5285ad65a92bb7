import type { ServerResponse } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Context } from 'hono';
import { errorBody, JSON_TYPE, writeAnswer, type Reason } from '../lib/answers.js';
import type { HeaderList } from '../lib/header-list.js';

/**
 * A gateway answer inside the hono chain. Over a socket it is written straight to Node's response
 * (a Response object and node-server's conversion of it cost more than the whole answer); in-process
 * (app.request()) and on an upgrade's socket it is a Response.
 */
export function answer(
  c: Context,
  reason: Reason,
  status: number,
  message: string,
  headers: HeaderList = [],
): Response {
  c.set('answered', { status, reason });
  const requestId = c.get('requestId');
  const usage = c.get('usageHeaders');
  const cors = c.get('corsHeaders');
  const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
  if (outgoing && !outgoing.headersSent) {
    const list: HeaderList = requestId ? [['X-Request-Id', requestId]] : [];
    if (usage) list.push(...usage);
    if (cors) list.push(...cors);
    list.push(...headers);
    writeAnswer(outgoing, status, message, list);
    return RESPONSE_ALREADY_SENT;
  }
  const out = new Headers();
  out.set('Content-Type', JSON_TYPE);
  if (requestId) out.set('X-Request-Id', requestId);
  for (const [name, value] of usage ?? []) out.set(name, value);
  for (const [name, value] of cors ?? []) out.set(name, value);
  for (const [name, value] of headers) out.set(name, value);
  return new Response(errorBody(status, message), { status, headers: out });
}
