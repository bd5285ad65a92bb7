import { cors } from 'hono/cors';
import type { HeaderList } from '../../lib/header-list.js';
import { USAGE_HEADER_NAMES } from '../../limits/headers.js';
import type { Step } from '../chain.js';
import { requestHeader } from '../request-header.js';

/**
 * CORS for browser clients (README "CORS"), on only when `CORS_ORIGINS` lists origins. A preflight
 * (`OPTIONS` with `Origin` and `Access-Control-Request-Method`, Fetch standard §3.2.2) is answered
 * here, before the API key is asked for: it is not counted, not forwarded and no guess for the
 * invalid-key guard. A listed origin's preflight gets hono's `cors` answer; any other origin's gets a
 * 204 without CORS fields, which the browser reads as a refusal. Every other answer to a listed
 * origin carries `Access-Control-Allow-Origin` and exposes the usage headers, `Retry-After` and
 * `X-Request-Id`; the gateway's answers and the bridges' alike (server/answers.ts, forward.ts), and
 * those of the HTTP layer and the request gate (server/http-server.ts).
 */

export interface CorsOptions {
  readonly origins: readonly string[];
  /** The API key's header: a browser must be allowed to send it. */
  readonly apiKeyHeader: string;
}

/** What a browser script may read of an answer: the usage headers, `Retry-After`, `X-Request-Id`. */
export const EXPOSED_HEADERS = [...USAGE_HEADER_NAMES, 'Retry-After', 'X-Request-Id'];

/** How long a browser may keep a preflight's answer (seconds). */
const PREFLIGHT_MAX_AGE = 600;

/** The CORS fields of the answers to each `Origin` (also those of the HTTP layer, server/http-server.ts). */
export interface CorsFields {
  /** A listed origin's: allowed, and the headers a page may read; undefined for any other origin, or none. */
  listed(origin: string | undefined): HeaderList | undefined;
  /** Every other answer's: the answer depends on Origin whenever CORS is on, so a cache must keep one per origin. */
  readonly others: HeaderList;
}

export function corsFields(origins: readonly string[]): CorsFields {
  const exposed: [string, string] = ['Access-Control-Expose-Headers', EXPOSED_HEADERS.join(', ')];
  const forOrigin = new Map<string, HeaderList>(
    origins.map((origin) => [origin, [['Access-Control-Allow-Origin', origin], exposed, ['Vary', 'Origin']]]),
  );
  return {
    listed: (origin) => (origin === undefined ? undefined : forOrigin.get(origin)),
    others: [['Vary', 'Origin']],
  };
}

export function corsHeaders(options: CorsOptions): Step {
  const listed = new Set(options.origins);
  const preflight = cors({
    origin: (origin) => (listed.has(origin) ? origin : null),
    allowMethods: ['GET', 'HEAD', 'PUT', 'POST', 'DELETE', 'PATCH'],
    allowHeaders: [options.apiKeyHeader, 'Authorization', 'Content-Type', 'x-otp-token', 'X-Request-Id'],
    exposeHeaders: EXPOSED_HEADERS,
    maxAge: PREFLIGHT_MAX_AGE,
  });
  const fields = corsFields(options.origins);

  return function corsHeaders(c, next) {
    const origin = requestHeader(c, 'origin');
    const allowed = fields.listed(origin);
    const isPreflight =
      c.req.method === 'OPTIONS' &&
      origin !== undefined &&
      requestHeader(c, 'access-control-request-method') !== undefined;
    if (isPreflight) {
      c.header('X-Request-Id', c.get('requestId'));
      // The gateway's own answer: its access line says why (docs/operations.md "Logs").
      c.set('answered', { status: 204, reason: 'preflight' });
      // hono's cors answers a preflight itself (a 204 with the CORS fields); it never calls next.
      if (allowed) return preflight(c, () => next().then(() => undefined)).then((response) => response ?? c.res);
      return c.body(null, 204, { Vary: 'Origin' });
    }
    c.set('corsHeaders', allowed ?? fields.others);
    return next();
  };
}
