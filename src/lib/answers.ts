import { STATUS_CODES, type ServerResponse } from 'node:http';
import type { HeaderList } from './header-list.js';

/**
 * Every answer the gateway writes itself (README "Headers and answers"): JSON of exactly two string fields,
 * `error` and `message`, never a stack trace, an internal address or a secret. A counted
 * request's answer carries its usage headers; every answer carries `X-Request-Id`.
 */

/**
 * Why the gateway answered itself, as its access line says (docs/operations.md "Logs"). The last
 * four are answers of the HTTP layer and the 500 of a bug.
 */
export type Reason =
  | 'missing-key'
  | 'unknown-key'
  | 'guard'
  | 'hour-spent'
  | 'day-spent'
  | 'no-route'
  | 'method'
  | 'not-websocket'
  | 'bad-path'
  | 'body-size'
  | 'content-type'
  | 'credentials'
  | 'redis-unavailable'
  | 'bridge-unreachable'
  | 'bridge-timeout'
  | 'client-timeout'
  | 'header-size'
  | 'bad-request'
  | 'expectation'
  | 'not-implemented'
  | 'preflight'
  | 'internal';

/**
 * The reason phrases of RFC 9110 §15 for the statuses the gateway writes. Every status line the
 * gateway writes itself uses them: Node's own table still has the older names of 413 and 422
 * ("Payload Too Large", "Unprocessable Entity").
 */
export const STATUS_PHRASES: Readonly<Record<number, string>> = {
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
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  500: 'Internal Server Error',
  501: 'Not Implemented',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** The status line's reason phrase of `status` (Node's for a status the gateway never writes itself). */
export function statusPhrase(status: number): string {
  return STATUS_PHRASES[status] ?? STATUS_CODES[status] ?? 'Error';
}

/**
 * Whether Node writes `phrase` as a status line's reason phrase (its check of header values): a
 * bridge's phrase with a control character is replaced by Node's own for the status, as clients
 * ignore the phrase (RFC 9112 §4; docs/operations.md "Bridges").
 */
export function writablePhrase(phrase: string): boolean {
  return !NOT_WRITABLE.test(phrase);
}

const NOT_WRITABLE = /[^\t\x20-\x7e\x80-\xff]/;

/**
 * The `error` field of an answer: the status line's reason phrase, but for a refusal for a limit,
 * whose body is the specification's own (README "Headers and answers").
 */
export const REASONS: Readonly<Record<number, string>> = { ...STATUS_PHRASES, 429: 'Rate Limit Exceeded' };

/** `errorBody(429, 'Too Many Requests')` is the exact body of a refusal for a limit (README "Headers and answers"). */
export function errorBody(status: number, message: string): string {
  return JSON.stringify({ error: REASONS[status] ?? 'Error', message });
}

/**
 * Logged as the status of a request (or upgrade) whose client left before its answer, nginx's
 * convention (docs/operations.md "Logs"); never sent.
 */
export const CLIENT_GONE = 499;

export const JSON_TYPE = 'application/json';

/** A gateway answer as a fetch Response (node-server's error handlers, which answer with one). */
export function answerResponse(status: number, message: string): Response {
  return new Response(errorBody(status, message), { status, headers: { 'Content-Type': JSON_TYPE } });
}

/** A gateway answer written straight to a Node response (forwarding errors, client errors). */
export function writeAnswer(res: ServerResponse, status: number, message: string, headers: HeaderList = []): void {
  const body = errorBody(status, message);
  const list: string[] = ['Content-Type', JSON_TYPE, 'Content-Length', String(Buffer.byteLength(body))];
  for (const [name, value] of headers) list.push(name, value);
  res.writeHead(status, statusPhrase(status), list);
  res.end(body);
}

/** The same answer as raw HTTP/1.1 bytes, for a socket that is not (or no longer) an HTTP response. */
export function rawAnswer(status: number, message: string, headers: HeaderList = []): string {
  const body = errorBody(status, message);
  let head = `HTTP/1.1 ${status} ${statusPhrase(status)}\r\nContent-Type: ${JSON_TYPE}\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n`;
  for (const [name, value] of headers) head += `${name}: ${value}\r\n`;
  return head + '\r\n' + body;
}

/** The answer to a request Node's HTTP parser failed on (by its error code), on either listener. */
export function clientErrorAnswer(code: string | undefined): [number, Reason, string] {
  switch (code) {
    case 'HPE_HEADER_OVERFLOW':
      return [431, 'header-size', 'Request headers are too large'];
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return [408, 'client-timeout', 'Request took too long to arrive'];
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return [413, 'body-size', 'Chunk extensions are too large'];
    // llhttp's code for a second Content-Length. Content-Length with Transfer-Encoding comes as an
    // invalid Transfer-Encoding or Content-Length, the codes of a malformed value too: those get the
    // general message below.
    case 'HPE_UNEXPECTED_CONTENT_LENGTH':
      return [400, 'bad-request', 'More than one Content-Length header'];
    default:
      return [400, 'bad-request', 'Malformed HTTP request'];
  }
}
