import type { ServerResponse } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Context } from 'hono';
import type { HeaderList } from '../limits/headers.js';

/**
 * Every answer the gateway writes itself (INTERFACE §6): JSON of exactly two string fields,
 * `error` and `message`, never a stack trace, an internal address or a secret. A counted
 * request's answer carries its usage headers; every answer carries `X-Request-Id`.
 */

export const REASONS: Readonly<Record<number, string>> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'Not Found',
  405: 'Method Not Allowed',
  408: 'Request Timeout',
  409: 'Conflict',
  413: 'Content Too Large',
  415: 'Unsupported Media Type',
  417: 'Expectation Failed',
  422: 'Unprocessable Content',
  426: 'Upgrade Required',
  429: 'Rate Limit Exceeded',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
  501: 'Not Implemented',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** `errorBody(429, 'Too Many Requests')` is the exact body of INTERFACE §6 and the seed's section 7. */
export function errorBody(status: number, message: string): string {
  return JSON.stringify({ error: REASONS[status] ?? 'Error', message });
}

const JSON_TYPE = 'application/json';

/**
 * A gateway answer inside the hono chain. Over a socket it is written straight to Node's response
 * (a Response object and node-server's conversion of it cost more than the whole answer); in-process
 * (app.request()) and on an upgrade's socket it is a Response.
 */
export function answer(c: Context, status: number, message: string, headers: HeaderList = []): Response {
  c.set('answered', status);
  const requestId = c.get('requestId');
  const usage = c.get('usageHeaders');
  const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
  if (outgoing && !outgoing.headersSent) {
    const list: HeaderList = requestId ? [['X-Request-Id', requestId]] : [];
    if (usage) list.push(...usage);
    list.push(...headers);
    writeAnswer(outgoing, status, message, list);
    return RESPONSE_ALREADY_SENT;
  }
  const out = new Headers();
  out.set('Content-Type', JSON_TYPE);
  if (requestId) out.set('X-Request-Id', requestId);
  for (const [name, value] of usage ?? []) out.set(name, value);
  for (const [name, value] of headers) out.set(name, value);
  return new Response(errorBody(status, message), { status, headers: out });
}

/** `answer()` as a middleware's result. */
export function answered(c: Context, status: number, message: string, headers: HeaderList = []): Promise<Response> {
  return Promise.resolve(answer(c, status, message, headers));
}

/** A gateway answer written straight to a Node response (forwarding errors, client errors). */
export function writeAnswer(res: ServerResponse, status: number, message: string, headers: HeaderList = []): void {
  const body = errorBody(status, message);
  const list: string[] = ['Content-Type', JSON_TYPE, 'Content-Length', String(Buffer.byteLength(body))];
  for (const [name, value] of headers) list.push(name, value);
  res.writeHead(status, list);
  res.end(body);
}

/** The same answer as raw HTTP/1.1 bytes, for a socket that is not (or no longer) an HTTP response. */
export function rawAnswer(status: number, message: string, headers: HeaderList = []): string {
  const body = errorBody(status, message);
  let head = `HTTP/1.1 ${status} ${REASONS[status] ?? 'Error'}\r\nContent-Type: ${JSON_TYPE}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n`;
  for (const [name, value] of headers) head += `${name}: ${value}\r\n`;
  return head + '\r\n' + body;
}
