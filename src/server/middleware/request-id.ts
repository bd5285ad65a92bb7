import { randomBytes } from 'node:crypto';
import type { Step } from '../chain.js';
import { requestHeader } from '../request-header.js';

/** `X-Request-Id`: the client's own when it is sane (short, plain characters), else a new UUID. */
const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * New request ids: UUIDs of version 8 (RFC 9562 §5.8, whose layout is the issuer's), 74 bits drawn
 * at random once per process and then a 48-bit counter. Unique across instances and restarts, and
 * one string concatenation per request rather than fresh random bits and their formatting.
 */
export function requestIdSource(): () => string {
  const r = randomBytes(10);
  const hex = (from: number, to: number): string => r.subarray(from, to).toString('hex');
  const version = (0x8000 | (r.readUInt16BE(6) & 0x0fff)).toString(16);
  const variant = (0x8000 | (r.readUInt16BE(8) & 0x3fff)).toString(16);
  const prefix = `${hex(0, 4)}-${hex(4, 6)}-${version}-${variant}-`;
  let counter = 0;
  return () => prefix + (counter++).toString(16).padStart(12, '0');
}

export function requestId(): Step {
  const nextId = requestIdSource();
  return function requestId(c, next) {
    const given = requestHeader(c, 'x-request-id');
    c.set('requestId', given !== undefined && SANE_REQUEST_ID.test(given) ? given : nextId());
    return next();
  };
}
