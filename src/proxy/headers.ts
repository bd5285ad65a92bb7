import { USAGE_HEADER_NAMES } from '../limits/headers.js';
import { CLIENT_ADDRESS_FIELDS, HOP_BY_HOP, isGatewayField, REWRITTEN } from '../lib/gateway-fields.js';

/**
 * Header rules of one proxy hop (README "Forwarding"). Hop-by-hop fields (RFC 9110 §7.6.1, plus
 * every field named in `Connection`) describe one connection and are not forwarded; `Expect` is
 * answered by the gateway's own server (RFC 9110 §10.1.1); framing is the gateway's own; fields
 * that would let a bridge act on another method or path than the one counted are dropped. The
 * bridges' credentials (`Authorization`, `x-otp-token`) are end-to-end and pass untouched.
 *
 * Headers travel as flat `[name, value, name, value, …]` lists, as Node reads them (rawHeaders)
 * and writes them (http.request, writeHead): names and repeated fields stay exactly as sent.
 */

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

const NO_TOKENS: readonly string[] = [];

/**
 * Lower-case field names, remembered: the same few dozen names come with every request and answer,
 * and lowering each one anew is a string allocation per field. Bounded, for names nobody sends twice.
 */
const lowered = new Map<string, string>();
const MAX_LOWERED = 1024;

function lower(name: string): string {
  let value = lowered.get(name);
  if (value === undefined) {
    value = name.toLowerCase();
    if (lowered.size < MAX_LOWERED) lowered.set(name, value);
  }
  return value;
}

/** The field names a `Connection` header lists (RFC 9110 §7.6.1). */
export function connectionTokens(value: string | string[] | undefined): readonly string[] {
  // The usual values name only hop-by-hop fields, which are dropped anyway.
  if (value === undefined || value === 'keep-alive' || value === 'close' || value === 'Keep-Alive') return NO_TOKENS;
  return (Array.isArray(value) ? value.join(',') : value)
    .split(',')
    .map((t) => t.trim().toLowerCase())
    .filter(Boolean);
}

export type BodyFraming =
  /** No body: neither field is sent. */
  | { readonly kind: 'none' }
  /** A body of this many bytes. */
  | { readonly kind: 'length'; readonly length: number }
  /** A body of unknown length, sent chunked (framing is per hop). */
  | { readonly kind: 'chunked' };

export interface ForwardHeaderValues {
  /** `Host` for the bridge: its own host and port. */
  readonly bridgeHost: string;
  readonly clientAddress: string;
  readonly proto: 'http' | 'https';
  readonly requestId: string;
  readonly framing: BodyFraming;
  /** Further fields never forwarded (lower case), e.g. the API key's header. */
  readonly dropped?: ReadonlySet<string> | undefined;
  /** Fields the gateway adds for the bridge (flat list), e.g. the consumer's key id. */
  readonly added?: readonly string[] | undefined;
  /** A WebSocket upgrade keeps `Connection: Upgrade` and `Upgrade`: they are the request. */
  readonly upgrade?: string | undefined;
  /** The request target as the client sent it: an absolute-form one names the host the client used. */
  readonly clientTarget?: string | undefined;
}

/** The authority of an absolute-form request target (`http://api.example/x` → `api.example`). */
function absoluteAuthority(target: string): string | undefined {
  return /^https?:\/\/([^/?#]+)/i.exec(target)?.[1];
}

/**
 * A name with underscores that reads as a field the gateway removes or writes itself once its
 * underscores are dashes (`X_Consumer_Id`): servers that map headers to CGI-style variables
 * (WSGI, Rack, PHP) would take it for that field. (nginx drops every such name by default.)
 */
function posesAsControlled(field: string, dropped: ReadonlySet<string> | undefined): boolean {
  const dashed = field.replaceAll('_', '-');
  return isGatewayField(dashed) || dropped?.has(dashed) === true;
}

/** The headers the bridge receives, from the client's raw headers. */
export function requestHeaderList(rawHeaders: readonly string[], values: ForwardHeaderValues): string[] {
  const out: string[] = [];
  let connection: string | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (lower(rawHeaders[i] as string) === 'connection') {
      connection = connection === undefined ? rawHeaders[i + 1] : `${connection},${rawHeaders[i + 1]}`;
    }
  }
  const named = connectionTokens(connection);
  let forwardedFor: string | undefined;
  let clientHost = '';
  // Rare: only when the client sent such fields.
  let forwarded: string | undefined;
  let addressFields: Set<string> | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i] as string;
    const value = rawHeaders[i + 1] as string;
    const field = lower(name);
    if (field === 'x-forwarded-for') forwardedFor = forwardedFor === undefined ? value : `${forwardedFor}, ${value}`;
    else if (field === 'host') clientHost ||= value;
    if (REWRITTEN.has(field)) {
      if (field === 'forwarded') forwarded = forwarded === undefined ? value : `${forwarded}, ${value}`;
      else if (CLIENT_ADDRESS_FIELDS.has(field) && !addressFields?.has(field)) {
        (addressFields ??= new Set()).add(field);
        out.push(name, values.clientAddress);
      }
      continue;
    }
    if (HOP_BY_HOP.has(field) || values.dropped?.has(field)) continue;
    if (field.includes('_') && posesAsControlled(field, values.dropped)) continue;
    if (named.length > 0 && named.includes(field) && !PROTECTED.has(field)) continue;
    out.push(name, value);
  }
  // RFC 9112 §3.2.2: for an absolute-form target the server ignores Host and uses the target's authority.
  const target = values.clientTarget;
  if (target !== undefined && !target.startsWith('/')) clientHost = absoluteAuthority(target) ?? clientHost;
  out.push('Host', values.bridgeHost);
  if (values.added) for (const field of values.added) out.push(field);
  if (values.upgrade !== undefined) out.push('Connection', 'Upgrade', 'Upgrade', values.upgrade);
  const { framing } = values;
  if (framing.kind === 'length') out.push('Content-Length', String(framing.length));
  else if (framing.kind === 'chunked') out.push('Transfer-Encoding', 'chunked');
  out.push(
    'X-Forwarded-For',
    forwardedFor ? `${forwardedFor}, ${values.clientAddress}` : values.clientAddress,
    // The gateway is the public edge: it states the scheme and host the client used.
    'X-Forwarded-Proto',
    values.proto,
    'X-Forwarded-Host',
    clientHost,
    'X-Request-Id',
    values.requestId,
  );
  // RFC 7239 §4: a proxy appends its element to the client's `Forwarded`, as to `X-Forwarded-For`.
  // A value whose elements cannot be told apart (a quoted string left open would take this hop's
  // element in) is replaced by this hop's element alone: it must stay the last one.
  if (forwarded !== undefined) {
    const element = forwardedElement(values, clientHost);
    out.push('Forwarded', separableElements(forwarded) ? `${forwarded}, ${element}` : element);
  }
  return out;
}

/** What may stand outside a quoted string in `Forwarded` (RFC 7239 §4): tchar, "=", ";", "," and OWS. */
const FORWARDED_OUTSIDE = /^[!#$%&'*+.^_`|~0-9A-Za-z=;, \t-]$/;

/**
 * Whether a `Forwarded` value splits into elements unambiguously at its commas: every quoted string
 * closed (a quoted-pair escapes one character), nothing but tokens and separators outside them.
 * One pass, no backtracking: the value is the client's.
 */
function separableElements(value: string): boolean {
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const ch = value[i] as string;
    if (quoted) {
      if (ch === '\\') i++;
      else if (ch === '"') quoted = false;
    } else if (ch === '"') quoted = true;
    else if (!FORWARDED_OUTSIDE.test(ch)) return false;
  }
  return !quoted;
}

/** This hop's `Forwarded` element (RFC 7239 §4–6): an IPv6 address and a host with a port are quoted. */
function forwardedElement(values: ForwardHeaderValues, host: string): string {
  const element = `for=${forwardedValue(values.clientAddress, true)};proto=${values.proto}`;
  return host === '' ? element : `${element};host=${forwardedValue(host, false)}`;
}

/**
 * A value of a `Forwarded` parameter: a token as it is, anything else a quoted string (an IPv6
 * address in brackets). The address is text from `X-Forwarded-For` with TRUST_PROXY_HOPS, and the
 * host the client's: neither may add a parameter or an element of its own.
 */
function forwardedValue(value: string, address: boolean): string {
  if (/^[A-Za-z0-9._-]+$/.test(value)) return value;
  const text = address && /^[0-9A-Fa-f:.]+$/.test(value) && value.includes(':') ? `[${value}]` : value;
  return `"${text.replace(/["\\]/g, '\\$&')}"`;
}

/** Fields the gateway itself writes on every counted answer (README "Headers and answers"). */
const GATEWAY_FIELDS = new Set([...USAGE_HEADER_NAMES, 'X-Request-Id'].map((name) => name.toLowerCase()));

/**
 * The bridge's response headers as a flat list for one `writeHead`: hop-by-hop fields dropped,
 * names and repeated fields kept exactly, the gateway's own fields added (they replace a bridge
 * field of the same name; with `ownsCors`, every `Access-Control-*` field of the bridge too).
 */
export function responseHeaderList(
  rawHeaders: readonly string[],
  own: ReadonlyArray<readonly [string, string]>,
  ownsCors = false,
): string[] {
  let connection: string | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (lower(rawHeaders[i] as string) === 'connection') {
      connection = connection === undefined ? rawHeaders[i + 1] : `${connection},${rawHeaders[i + 1]}`;
    }
  }
  const named = connectionTokens(connection);
  const out: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i] as string;
    const field = lower(name);
    if (HOP_BY_HOP.has(field) || GATEWAY_FIELDS.has(field) || (named.length > 0 && named.includes(field))) continue;
    // With CORS on, the gateway alone says which origins may read an answer.
    if (ownsCors && field.startsWith('access-control-')) continue;
    out.push(name, rawHeaders[i + 1] as string);
  }
  for (const [name, value] of own) out.push(name, value);
  return out;
}
