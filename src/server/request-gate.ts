import type { IncomingMessage } from 'node:http';

/**
 * Checks of a request's framing and head, made before anything else looks at it (before the API
 * key, before counting), so that a request the gateway will not forward uses no unit and no
 * request can hide in another one's body (docs/operations.md "Hostile clients", SECURITY.md):
 *
 * - more header lines than `maxHeaderCount`: 431. (Node's parser frames a body by every header
 *   line it reads, also those past its own header-count cap; the server is set to keep them all,
 *   and this bound replaces that cap.)
 * - an HTTP/1.1 request without exactly one `Host`: 400 (RFC 9112 §3.2).
 * - a `Transfer-Encoding` that does not end in `chunked`: 400, as RFC 9112 §6.3 requires; a
 *   coding before `chunked` (`gzip, chunked`): 501 (RFC 9112 §6.1), since the gateway forwards
 *   bodies byte for byte and cannot pass such a coding on.
 * - an upgrade to anything but a WebSocket by `GET`, or one that announces a body: 400 (an
 *   upgrade's bytes after its head belong to the new protocol, RFC 9110 §7.8), or whose Host and
 *   target do not form a URL: 400.
 */

export interface GateRefusal {
  readonly status: 400 | 431 | 501;
  readonly reason: 'header-size' | 'bad-request' | 'not-implemented';
  readonly message: string;
}

export function gateRefusal(req: IncomingMessage, maxHeaderCount: number, upgrade = false): GateRefusal | undefined {
  const raw = req.rawHeaders;
  if (raw.length / 2 > maxHeaderCount)
    return { status: 431, reason: 'header-size', message: 'Too many request headers' };
  if (req.httpVersionMajor === 1 && req.httpVersionMinor === 1) {
    let hosts = 0;
    for (let i = 0; i < raw.length; i += 2) if ((raw[i] as string).length === 4 && isHost(raw[i] as string)) hosts++;
    if (hosts === 0) return { status: 400, reason: 'bad-request', message: 'Missing Host header' };
    if (hosts > 1) return { status: 400, reason: 'bad-request', message: 'More than one Host header' };
  }
  const transferEncoding = req.headers['transfer-encoding'];
  if (transferEncoding !== undefined) {
    const codings = transferEncoding
      .split(',')
      .map((coding) => coding.trim().toLowerCase())
      .filter(Boolean);
    if (codings.at(-1) !== 'chunked')
      return { status: 400, reason: 'bad-request', message: 'Transfer-Encoding must end with chunked' };
    if (codings.length > 1)
      return { status: 501, reason: 'not-implemented', message: 'Only the chunked transfer coding is supported' };
  }
  return upgrade ? upgradeRefusal(req) : undefined;
}

function upgradeRefusal(req: IncomingMessage): GateRefusal | undefined {
  if ((req.headers.upgrade ?? '').toLowerCase() !== 'websocket' || req.method !== 'GET')
    return { status: 400, reason: 'bad-request', message: 'Only WebSocket upgrades are accepted' };
  if (req.headers['transfer-encoding'] !== undefined || (req.headers['content-length'] ?? '0') !== '0')
    return { status: 400, reason: 'bad-request', message: 'An upgrade request carries no body' };
  // The chain reads an upgrade's target as a URL of its Host (server/upgrade.ts).
  if (!formsUrl(req.headers.host ?? 'gateway', req.url ?? '/'))
    return { status: 400, reason: 'bad-request', message: 'Malformed request' };
  return undefined;
}

/** A Host @hono/node-server takes as it is, without parsing a URL (its own shortcut). */
const PLAIN_HOST = /^[a-z0-9._-]+(?::(?:[1-5]\d{3,4}|[6-9]\d{3}))?$/;

/**
 * Whether an upgrade's Host and target form the URL the chain reads, by the rule the HTTP path's
 * requests meet in @hono/node-server (400 otherwise, docs/operations.md "Hostile clients"): no user
 * info (a Request refuses a URL with credentials), and for an origin-form target a Host that is the
 * URL's authority — not `foo/bar` or `host\x`, whose URL has another host and another path.
 * (An absolute-form target names its own authority, RFC 9112 §3.2.2.)
 */
function formsUrl(host: string, target: string): boolean {
  let url: URL;
  try {
    url = new URL(`http://${host}${target}`);
  } catch {
    return false;
  }
  if (url.username !== '' || url.password !== '') return false;
  if (!target.startsWith('/') || PLAIN_HOST.test(host)) return true;
  return url.hostname.length === host.length || url.hostname === host.replace(/:\d+$/, '').toLowerCase();
}

function isHost(name: string): boolean {
  return name.toLowerCase() === 'host';
}
