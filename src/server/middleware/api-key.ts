import type { Context } from 'hono';
import type { ApiKeyMode } from '../../config/settings.js';
import type { InvalidKeyGuard } from '../../keys/guard.js';
import type { KeyRegistry } from '../../keys/registry.js';
import type { GatewayMetrics } from '../../observability/metrics.js';
import { sha256Hex } from '../../lib/hash.js';
import { boundedCache } from '../../lib/bounded-cache.js';
import { answer } from '../answers.js';
import type { Next, Step } from '../chain.js';
import type { GatewayEnv } from '../context.js';
import { requestHeader } from '../request-header.js';

/**
 * Step 1 of README "A request, step by step": the API key. Only its SHA-256 hash travels further. In `registered`
 * mode only issued keys pass (README "API keys and plans"); in `any` mode every non-empty key is its own bucket.
 * Missing and unknown keys feed the invalid-key guard, which answers 429 to an address that
 * keeps sending them.
 */

/** A key that cannot be checked (the store is away): how soon to try again. */
const UNCHECKED_RETRY_SECONDS = 2;

/** Issued keys are 48 characters; anything this long is not a key. */
export const MAX_API_KEY_LENGTH = 256;

export interface ApiKeyOptions {
  readonly header: string;
  readonly mode: ApiKeyMode;
  readonly registry: KeyRegistry;
  readonly guard: InvalidKeyGuard;
  readonly metrics: GatewayMetrics;
  readonly clientAddress: (c: Context<GatewayEnv>) => string;
}

export function apiKeyAuth(options: ApiKeyOptions): Step {
  const { registry, guard, metrics, mode, clientAddress } = options;
  const header = options.header.toLowerCase();
  // Clients send the same key again and again: its hash is computed once.
  const hashes = boundedCache<string, string>(10_000);
  const hashOf = (key: string): string => {
    let hash = hashes.get(key);
    if (hash === undefined) hashes.set(key, (hash = sha256Hex(key)));
    return hash;
  };
  const challenge: [string, string] = ['WWW-Authenticate', `APIKey header="${options.header}"`];

  const throttled = (c: Context<GatewayEnv>, ms: number): Response => {
    metrics.invalidKeys.labels('throttled').inc();
    return answer(c, 'guard', 429, 'Too Many Requests', [['Retry-After', String(Math.max(1, Math.ceil(ms / 1000)))]]);
  };

  const refuse = async (
    c: Context<GatewayEnv>,
    address: string,
    reason: 'missing-key' | 'unknown-key',
    message: string,
  ): Promise<Response> => {
    const blockedMs = await guard.failed(address);
    if (blockedMs > 0) return throttled(c, blockedMs);
    metrics.invalidKeys.labels('rejected').inc();
    return answer(c, reason, 401, message, [challenge]);
  };

  /**
   * A key this instance does not know yet may have been issued on another one a moment ago. One the
   * store cannot check is no invalid key: it gets a 503 to try again, and never counts as a guess.
   */
  const resolveThenNext = async (
    c: Context<GatewayEnv>,
    next: Next,
    address: string,
    keyHash: string,
  ): Promise<Response> => {
    const issued = await registry.resolve(keyHash);
    if (issued === 'unavailable') {
      return answer(c, 'redis-unavailable', 503, 'API keys cannot be checked right now', [
        ['Retry-After', String(UNCHECKED_RETRY_SECONDS)],
      ]);
    }
    if (issued === 'not-issued') return refuse(c, address, 'unknown-key', 'Invalid API key');
    c.set('client', { keyHash, keyId: issued.id, plan: issued.plan });
    return next();
  };

  // Not async: a known key goes straight on, without a promise of its own per request.
  return function apiKeyAuth(c, next) {
    const address = clientAddress(c);
    c.set('clientAddress', address);
    const blockedMs = guard.blockedFor(address);
    if (blockedMs > 0) return throttled(c, blockedMs);

    // Browsers cannot set headers on a WebSocket upgrade: there, and only there, the key may be a query parameter.
    const key = requestHeader(c, header) || (c.env?.upgrade ? apiKeyFromQuery(c.env.incoming.url ?? '') : undefined);
    if (!key) return refuse(c, address, 'missing-key', 'Missing API key');
    if (key.length > MAX_API_KEY_LENGTH) return refuse(c, address, 'unknown-key', 'Invalid API key');
    const keyHash = hashOf(key);
    const issued = registry.lookup(keyHash);
    if (!issued && mode === 'registered') return resolveThenNext(c, next, address, keyHash);
    c.set('client', { keyHash, keyId: issued?.id, plan: issued?.plan });
    return next();
  };
}

export function apiKeyFromQuery(target: string): string | undefined {
  const q = target.indexOf('?');
  if (q === -1) return undefined;
  return new URLSearchParams(target.slice(q + 1)).get('api_key') || undefined;
}

/**
 * Query parameters never forwarded: `api_key` (README "Forwarding": the bridge never receives the
 * client's key), and `_method`, with which some frameworks (Symfony, Laravel) let a POST act as
 * another method than the one counted, as the override headers do (proxy/headers.ts).
 */
const NOT_FORWARDED_PARAMS: ReadonlySet<string> = new Set(['api_key', '_method']);

/**
 * A parameter's name as PHP registers it (php_register_variable_ex), which is how Symfony and
 * Laravel find `_method`: cut at its first NUL (PHP takes the decoded name as a C string, so
 * `_method%00x` is `_method`), leading spaces dropped, the other spaces and dots made `_` (so
 * `.method` and `+_method` are `_method` there) up to a first `[`, where an array's name ends when
 * a `]` follows (`api_key[]` and `api_key[0]` are `api_key`), and which is `_` when none does.
 * Every name the URLSearchParams decoding gives as it is reads the same here.
 */
function phpName(name: string): string {
  const nul = name.indexOf('\0');
  const cut = (nul === -1 ? name : name.slice(0, nul)).replace(/^ +/, '');
  const bracket = cut.indexOf('[');
  if (bracket === -1) return cut.replace(/[ .]/g, '_');
  const base = cut.slice(0, bracket).replace(/[ .]/g, '_');
  return cut.includes(']', bracket) ? base : base + '_' + cut.slice(bracket + 1);
}

/** The query string the bridge receives: without the parameters above; the others stay byte for byte. */
export function forwardedQuery(query: string): string {
  // A name that reads as one of them ends so (`api.key` is `api_key` to PHP), or holds an escape:
  // any other query goes as it came.
  if (query.length <= 1 || (!query.includes('key') && !query.includes('method') && !query.includes('%'))) return query;
  // Each part's name decoded as URLSearchParams decodes it, so that every spelling apiKeyFromQuery accepts is removed.
  const kept = query
    .slice(1)
    .split('&')
    .filter((part) => !NOT_FORWARDED_PARAMS.has(phpName(new URLSearchParams(part).keys().next().value ?? '')));
  return kept.length ? '?' + kept.join('&') : '';
}
