import type { IncomingMessage } from 'node:http';
import type { Context } from 'hono';
import { CLIENT_GONE } from '../../lib/answers.js';
import { CLIENT_FAILED, clientFailure, type ClientFailure } from '../../lib/client-failure.js';
import { answer } from '../answers.js';
import type { Next, Step } from '../chain.js';
import type { GatewayEnv } from '../context.js';
import { requestHeader } from '../request-header.js';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';

/**
 * Step 4 of README "A request, step by step", after counting: the body. Any body longer than `maxBodyBytes` is
 * refused with 413. On the credential routes (the specification's token operations) the body must be
 * a JSON object with non-empty string `username` and `password`, sent as
 * `application/json` (415 otherwise, 400 for the body); it is read once, bounded, and then
 * forwarded byte for byte. A body that has not all come within REQUEST_TIMEOUT_MS, or that Node's
 * parser failed on, gets this request's own answer to that failure (lib/client-failure.ts).
 */

/** Credentials are a few hundred bytes; a larger JSON body on a token route is refused, not parsed. */
export const MAX_CREDENTIALS_BYTES = 16 * 1024;
/** Deeper JSON than this is refused before parsing. */
export const MAX_JSON_DEPTH = 16;

export interface BodyOptions {
  readonly maxBodyBytes: number;
  /** Canonical keys of the credential routes. */
  readonly credentialRoutes: ReadonlySet<string>;
}

export function bodyRules(options: BodyOptions): Step {
  const { maxBodyBytes, credentialRoutes } = options;
  const tooLarge = (c: Context<GatewayEnv>): Response =>
    answer(c, 'body-size', 413, `Request body is larger than ${maxBodyBytes} bytes`, [['Connection', 'close']]);
  // The rest of the body may still come, or not be HTTP: the connection cannot be used again.
  const failed = (c: Context<GatewayEnv>, [status, reason, message]: ClientFailure): Response => {
    // The HTTP layer closed the connection meanwhile (an earlier step waited past its LINGER_MS,
    // server/http-server.ts): no answer reaches the client, whose line is a 499 (docs/operations.md "Logs").
    if (c.env?.outgoing?.destroyed) {
      c.set('forwarded', { status: CLIENT_GONE, upstreamMs: undefined });
      return RESPONSE_ALREADY_SENT;
    }
    return answer(c, reason, status, message, [['Connection', 'close']]);
  };

  const credentials = async (c: Context<GatewayEnv>, next: Next): Promise<Response> => {
    if (!isJsonMediaType(requestHeader(c, 'content-type')))
      return answer(c, 'content-type', 415, 'Content-Type must be application/json');
    const body = await readBody(c, Math.min(maxBodyBytes, MAX_CREDENTIALS_BYTES));
    if (body === 'too-large')
      return maxBodyBytes <= MAX_CREDENTIALS_BYTES
        ? tooLarge(c)
        : answer(c, 'credentials', 400, 'Credentials body is too large', [['Connection', 'close']]);
    if (body === 'aborted') return answer(c, 'credentials', 400, 'Request body was not received');
    if (!Buffer.isBuffer(body)) return failed(c, body);
    const problem = credentialsProblem(body);
    if (problem) return answer(c, 'credentials', 400, problem);
    c.set('body', body);
    return next();
  };

  // Not async: a request without a body to check goes straight on.
  return function bodyRules(c, next) {
    // The parser failed on the body (or it stopped coming) while an earlier step waited (on Redis):
    // nobody was reading it yet.
    const incoming = c.env?.incoming;
    const failure = incoming === undefined ? undefined : clientFailure(incoming);
    if (failure !== undefined) return failed(c, failure);
    const length = requestHeader(c, 'content-length');
    if (length !== undefined && Number(length) > maxBodyBytes) return tooLarge(c);
    if (credentialRoutes.has(c.get('endpoint').route.key)) return credentials(c, next);
    return next();
  };
}

/**
 * `application/json`, with at most a `charset` parameter (RFC 9110 §8.3.1: a token or a quoted
 * string), whatever charset it names: the body itself is read as UTF-8 all the same (RFC 8259
 * §8.1: JSON is UTF-8), and one that is not gets a 400 (credentialsProblem).
 */
export function isJsonMediaType(value: string | undefined): boolean {
  if (!value) return false;
  const [type, ...params] = value.split(';').map((p) => p.trim());
  if (type?.toLowerCase() !== 'application/json') return false;
  return (
    params.length <= 1 && params.every((param) => /^charset\s*=\s*(?:[\w!#$%&'*+.^`|~-]+|"[^"\\]+")$/i.test(param))
  );
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Why a credentials body is refused, or undefined when it is acceptable. Never echoes the body. */
export function credentialsProblem(body: Buffer): string | undefined {
  let text: string;
  try {
    text = utf8.decode(body);
  } catch {
    return 'Body is not valid UTF-8';
  }
  if (jsonDepth(text) > MAX_JSON_DEPTH) return 'JSON is nested too deeply';
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    // The parser's message quotes the body, and the body holds a password: it is not repeated.
    return 'Body is not valid JSON';
  }
  const shape = 'Body must be a JSON object with non-empty string "username" and "password"';
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return shape;
  const { username, password } = value as Record<string, unknown>;
  if (typeof username !== 'string' || username === '' || typeof password !== 'string' || password === '') return shape;
  return undefined;
}

/** Greatest nesting of objects and arrays, outside strings; a linear scan with no recursion. */
function jsonDepth(text: string): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (inString) {
      if (ch === 92)
        i++; // backslash: skip the escaped character
      else if (ch === 34) inString = false;
    } else if (ch === 34) inString = true;
    else if (ch === 123 || ch === 91) max = Math.max(max, ++depth);
    else if (ch === 125 || ch === 93) depth--;
  }
  return max;
}

/** What reading a body gives: the body, or why there is none (a ClientFailure: lib/client-failure.ts). */
type BodyRead = Buffer | 'too-large' | 'aborted' | ClientFailure;

/** Reads the body, stopping as soon as it passes `limit` bytes (it is never buffered past that). */
async function readBody(c: Context<GatewayEnv>, limit: number): Promise<BodyRead> {
  const incoming = c.env?.incoming;
  if (!incoming) {
    const body = Buffer.from(await c.req.arrayBuffer());
    return body.length > limit ? 'too-large' : body;
  }
  return readIncoming(incoming, limit);
}

function readIncoming(incoming: IncomingMessage, limit: number): Promise<BodyRead> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (result: BodyRead): void => {
      incoming.off('data', onData);
      incoming.off('end', onEnd);
      incoming.off('close', onClose);
      incoming.off('error', onClose);
      incoming.off(CLIENT_FAILED, onFailure);
      resolve(result);
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        incoming.pause();
        done('too-large');
      } else chunks.push(chunk);
    };
    const onEnd = (): void => done(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size));
    const onClose = (): void => done('aborted');
    const onFailure = (): void => done(clientFailure(incoming) ?? 'aborted');
    incoming.on('data', onData);
    incoming.once('end', onEnd);
    incoming.once('close', onClose);
    incoming.once('error', onClose);
    // Only a body still on its way can fail.
    if (!incoming.complete) incoming.once(CLIENT_FAILED, onFailure);
  });
}
