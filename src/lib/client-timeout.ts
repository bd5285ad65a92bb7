import type { IncomingMessage } from 'node:http';
import { clientErrorAnswer } from './answers.js';

/**
 * A request the app is already serving whose body has not all come within REQUEST_TIMEOUT_MS.
 * Node's parser tells the HTTP layer (server/http-server.ts), which cannot answer it as it answers
 * requests that never reached the app: the request is counted, so its 408 carries its own
 * `X-Request-Id` and usage headers (README "Headers and answers"), and it has one access line,
 * the app's (docs/operations.md "Logs"). The HTTP layer marks the request and tells whoever reads
 * its body (server/middleware/body.ts, proxy/forwarder.ts), which answers the 408 in the app's name.
 */

const TIMED_OUT = Symbol('client timed out');

type Marked = IncomingMessage & { [TIMED_OUT]?: true };

/** Emitted on a request once it is marked: a body still being read is never going to come whole. */
export const CLIENT_TIMEOUT = 'oapi-gateway:client-timeout';

/** The 408 of the HTTP layer, as the app writes it (its status, reason and message). */
export const CLIENT_TIMEOUT_ANSWER = clientErrorAnswer('ERR_HTTP_REQUEST_TIMEOUT');

/** Marks a request the app serves as timed out, and tells its body's reader. */
export function markClientTimeout(req: IncomingMessage): void {
  (req as Marked)[TIMED_OUT] = true;
  req.emit(CLIENT_TIMEOUT);
}

/** Whether the HTTP layer marked the request: a field check, the only cost on the request path. */
export function clientTimedOut(req: IncomingMessage): boolean {
  return (req as Marked)[TIMED_OUT] === true;
}
