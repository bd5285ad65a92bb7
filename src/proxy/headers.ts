import type { IncomingHttpHeaders } from 'node:http';

/**
 * Header rules of one proxy hop. Hop-by-hop fields (RFC 9110 §7.6.1, plus every field named
 * in `Connection`) describe one connection and are not forwarded; `Expect` is answered by the
 * gateway's own server (RFC 9110 §10.1.1) and not passed on. The bridges' credentials
 * (`Authorization`, `x-otp-token`) are end-to-end and pass untouched.
 */

export const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
]);

/**
 * Fields with which some frameworks let a request claim another method or path than the one it
 * was counted for (README "Forwarding"): the bridge must act on exactly what was counted.
 */
export const REINTERPRETING = [
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
  'x-original-url',
  'x-rewrite-url',
];

const NO_TOKENS: string[] = [];

function connectionTokens(value: string | string[] | undefined): string[] {
  // The usual values name only hop-by-hop fields, which are dropped anyway.
  if (value === undefined || value === 'keep-alive' || value === 'close' || value === 'Keep-Alive') return NO_TOKENS;
  return (Array.isArray(value) ? value.join(',') : value)
    .split(',')
    .map((t) => t.trim().toLowerCase())
    .filter(Boolean);
}

export interface ForwardHeaderValues {
  readonly clientAddress: string;
  readonly proto: 'http' | 'https';
  readonly requestId: string;
  /** Length of a body the gateway already read (it replaces the original framing). */
  readonly bodyLength?: number | undefined;
  /** WebSocket upgrades keep `Upgrade` and `Connection`: they are the request. */
  readonly upgrade?: boolean;
}

/** Rewrites the client's headers in place into the headers the bridge receives. */
export function prepareRequestHeaders(headers: IncomingHttpHeaders, values: ForwardHeaderValues): void {
  const chunked = headers['transfer-encoding'] !== undefined && headers['content-length'] === undefined;
  const dropped = connectionTokens(headers.connection);
  const upgrade = values.upgrade ? { connection: headers.connection, upgrade: headers.upgrade } : undefined;
  for (const name of HOP_BY_HOP) delete headers[name];
  for (const name of REINTERPRETING) delete headers[name];
  for (const name of dropped) if (!PROTECTED.has(name)) delete headers[name];
  delete headers.expect;
  if (upgrade) {
    headers.connection = upgrade.connection;
    headers.upgrade = upgrade.upgrade;
  }

  if (values.bodyLength !== undefined) headers['content-length'] = String(values.bodyLength);
  // Framing is per hop: a chunked body stays chunked on the next hop.
  else if (chunked) headers['transfer-encoding'] = 'chunked';

  const forwardedFor = headers['x-forwarded-for'];
  headers['x-forwarded-for'] = forwardedFor ? `${String(forwardedFor)}, ${values.clientAddress}` : values.clientAddress;
  // The gateway is the public edge: it states the scheme and host the client used.
  headers['x-forwarded-proto'] = values.proto;
  headers['x-forwarded-host'] = headers.host ?? '';
  headers['x-request-id'] = values.requestId;
}

/** Fields a `Connection` header may not remove: they are the request itself, or the gateway's own. */
const PROTECTED = new Set([
  'host',
  'content-length',
  'x-request-id',
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'authorization',
  'x-otp-token',
]);

/** Fields the gateway itself writes on every counted answer (INTERFACE §6). */
const GATEWAY_FIELDS = new Set([
  'x-ratelimit-limit-hour',
  'x-ratelimit-remaining-hour',
  'x-ratelimit-limit-day',
  'x-ratelimit-remaining-day',
  'ratelimit-policy',
  'ratelimit',
  'x-request-id',
]);

/**
 * The bridge's response headers as a flat `[name, value, …]` list for one `writeHead`: hop-by-hop
 * fields dropped, names and repeated fields kept exactly, the gateway's own fields added
 * (they replace a bridge field of the same name).
 */
export function responseHeaderList(
  rawHeaders: readonly string[],
  connection: string | string[] | undefined,
  own: ReadonlyArray<readonly [string, string]>,
): string[] {
  const dropped = connectionTokens(connection);
  const out: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i] as string;
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || GATEWAY_FIELDS.has(lower) || (dropped.length > 0 && dropped.includes(lower))) continue;
    out.push(name, rawHeaders[i + 1] as string);
  }
  for (const [name, value] of own) out.push(name, value);
  return out;
}
