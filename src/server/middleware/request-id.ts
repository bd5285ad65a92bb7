import { randomUUID } from 'node:crypto';
import type { MiddlewareHandler } from 'hono';
import type { GatewayEnv } from '../context.js';
import { requestHeader } from '../request-header.js';

/** `X-Request-Id`: the client's own when it is sane (short, plain characters), else a new UUID. */
const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function requestId(): MiddlewareHandler<GatewayEnv> {
  return function requestId(c, next) {
    const given = requestHeader(c, 'x-request-id');
    c.set('requestId', given !== undefined && SANE_REQUEST_ID.test(given) ? given : randomUUID());
    return next();
  };
}
