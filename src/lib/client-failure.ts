import type { IncomingMessage } from 'node:http';
import type { Reason } from './answers.js';

/**
 * A request the app is already serving whose body Node's parser failed on: a body that has not
 * all come within REQUEST_TIMEOUT_MS, or a malformed one (an invalid chunk size, a bad chunk
 * extension, any other HPE_* error after the head). The parser tells the HTTP layer
 * (server/http-server.ts), which cannot answer it as it answers requests that never reached the
 * app: the request is counted, so its answer carries its own `X-Request-Id` and usage headers
 * (README "Headers and answers"), and it has one access line, the app's (docs/operations.md
 * "Logs"). The HTTP layer marks the request with the answer it would have written itself
 * (clientErrorAnswer in lib/answers.ts: 408, 400, 413) and tells whoever reads its body
 * (server/middleware/body.ts, proxy/forwarder.ts), which writes that answer in the app's name.
 */

/** The answer to a parser failure: status, reason and message (clientErrorAnswer). */
export type ClientFailure = readonly [status: number, reason: Reason, message: string];

const FAILED = Symbol('client failed');

type Marked = IncomingMessage & { [FAILED]?: ClientFailure };

/** Emitted on a request once it is marked: a body still being read is never going to come whole. */
export const CLIENT_FAILED = 'oapi-gateway:client-failed';

/** Marks a request the app serves with the answer to its parser failure, and tells its body's reader. */
export function markClientFailure(req: IncomingMessage, failure: ClientFailure): void {
  (req as Marked)[FAILED] = failure;
  req.emit(CLIENT_FAILED);
}

/** The answer the HTTP layer marked the request with: a field read, the only cost on the request path. */
export function clientFailure(req: IncomingMessage): ClientFailure | undefined {
  return (req as Marked)[FAILED];
}
