import type { ServerResponse } from 'node:http';
import { Hono, type Context, type ErrorHandler, type MiddlewareHandler } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import type { ReloadResult, TableHolder } from '../config/table-holder.js';
import type { EventBus } from '../events/bus.js';
import type { ApiKeyMode } from '../config/settings.js';
import type { InvalidKeyGuard } from '../keys/guard.js';
import type { KeyRegistry } from '../keys/registry.js';
import { STATUS_PHRASES } from '../lib/answers.js';
import { sha256Hex } from '../lib/hash.js';
import type { Limiter } from '../limits/limiter.js';
import { StoreUnavailableError } from '../limits/store.js';
import { shortKeyHash, type Logger } from '../observability/logger.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import { refusal } from './common.js';
import { blocksApp } from './blocks.js';
import { keysApp } from './keys.js';
import { limitsApp } from './limits.js';
import { statusApp } from './status.js';
import { usageApp } from './usage.js';

/**
 * The admin listener (docs/operations.md "The admin listener"): health, readiness, metrics and documents for
 * the platform, and the bearer-protected `/admin/*` API — one sub-app per resource. Errors are
 * mapped to answers in one place: a store that does not answer is a 503, anything else a 500.
 */

/**
 * What the admin reload answers: the table holder's result, or (WORKERS=n) why the workers did not
 * all reach the table the primary loaded (README "Running it").
 */
export type AdminReloadResult = ReloadResult | { readonly ok: false; readonly unsettled: string };

export interface AdminDeps {
  readonly adminToken: string | undefined;
  readonly tables: TableHolder;
  readonly limiter: Limiter;
  readonly registry: KeyRegistry;
  readonly guard: InvalidKeyGuard;
  /** `registered`: only issued keys have usage; any other key is unknown (404). */
  readonly apiKeyMode: ApiKeyMode;
  /** False until the issued keys were read once: the instance cannot tell valid keys yet. */
  readonly keysReady: () => Promise<boolean>;
  readonly events: EventBus;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  /** Undefined when the counter store answers; otherwise why it does not. */
  readonly storeProblem: () => Promise<string | undefined>;
  readonly shuttingDown: () => boolean;
  /** Reloads the limit table (and what depends on it); the admin endpoint and SIGHUP share it. */
  readonly reload: () => Promise<AdminReloadResult>;
  /** Metrics text; with WORKERS>1 the primary aggregates its workers'. */
  readonly metricsText?: () => Promise<string>;
  /** Why no public request is served although the process runs (WORKERS=n: no worker serves); /readyz says so. */
  readonly notServing?: () => string | undefined;
  /** For `/openapi.json`: the API-key header and the routes whose body must be credentials. */
  readonly apiKeyHeader: string;
  readonly credentialRoutes?: ReadonlySet<string>;
}

export function createAdminApp(deps: AdminDeps): Hono {
  const app = new Hono();
  app.use(statusLines());
  app.use(adminLog(deps.logger));
  app.route('/', statusApp(deps));
  app.use('/admin/*', adminAuth(deps.adminToken));
  app.route('/admin/limits', limitsApp(deps));
  app.route('/admin/usage', usageApp(deps));
  app.route('/admin/keys', keysApp(deps));
  app.route('/admin/blocks', blocksApp(deps));
  const allowedMethods = methodsOfPaths(app);
  app.notFound((c) => {
    // A path the listener has for other methods: 405 with Allow, as on the public listener (README "Headers and answers").
    const allow = allowedMethods(c.req.path);
    if (allow.length === 0) return refusal(c, 404, 'No such admin endpoint');
    c.header('Allow', allow.join(', '));
    return refusal(c, 405, 'Method not allowed for this endpoint');
  });
  app.onError(adminErrors(deps.logger));
  return app;
}

/**
 * The methods each path of the app's routes answers (HEAD with GET, as hono serves it), for a
 * request that met no route: the middleware (`ALL`) and the wildcards are no path of their own.
 */
function methodsOfPaths(app: Hono): (path: string) => string[] {
  const patterns = new Map<string, { readonly pattern: RegExp; readonly methods: Set<string> }>();
  for (const { method, path } of app.routes) {
    if (method === 'ALL' || path.includes('*')) continue;
    const entry = patterns.get(path) ?? {
      pattern: new RegExp(`^${path.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/:[^/]+/g, '[^/]+')}$`),
      methods: new Set<string>(),
    };
    entry.methods.add(method);
    if (method === 'GET') entry.methods.add('HEAD');
    patterns.set(path, entry);
  }
  return (path) => {
    const allowed = new Set<string>();
    for (const { pattern, methods } of patterns.values())
      if (pattern.test(path)) methods.forEach((m) => allowed.add(m));
    return [...allowed];
  };
}

/**
 * Status lines with the reason phrases of RFC 9110, like the public listener's (lib/answers.ts):
 * Node's own table still says "Unprocessable Entity" for 422. node-server's `writeHead(status,
 * headers)` keeps a status message already set.
 */
function statusLines(): MiddlewareHandler {
  return async function statusLines(c, next) {
    await next();
    const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
    const phrase = STATUS_PHRASES[c.res.status];
    if (outgoing && phrase !== undefined) outgoing.statusMessage = phrase;
  };
}

function adminLog(logger: Logger): MiddlewareHandler {
  return async function adminLog(c, next) {
    await next();
    // The route pattern, not the path: an API key in the path is a secret.
    const apiKey = c.req.param('apiKey');
    logger.info(
      {
        admin: true,
        method: c.req.method,
        route: c.req.routePath,
        status: c.res.status,
        key: apiKey ? shortKeyHash(sha256Hex(apiKey)) : undefined,
      },
      'admin request',
    );
  };
}

function adminErrors(logger: Logger): ErrorHandler {
  return function adminErrors(err, c) {
    if (err instanceof StoreUnavailableError) {
      const keysStore = c.req.routePath.startsWith('/admin/keys') && !c.req.routePath.endsWith('/usage');
      return refusal(c, 503, keysStore ? 'Key store unavailable' : 'Counter store unavailable');
    }
    // hono's own errors (the bearer middleware's) carry their answer.
    if ('getResponse' in err && typeof err.getResponse === 'function') return err.getResponse();
    logger.error({ err }, 'admin error');
    return refusal(c, 500, 'Unexpected error');
  };
}

function adminAuth(token: string | undefined): MiddlewareHandler {
  if (!token) {
    return async function adminDisabled(c) {
      return refusal(c, 403, 'The admin API is disabled: ADMIN_TOKEN is not set');
    };
  }
  // hono's bearer middleware compares in constant time (hashes of both, then timingSafeEqual).
  return bearerAuth({
    token,
    noAuthenticationHeader: { message: (c: Context) => refusal(c, 401, 'Missing bearer token') },
    invalidAuthenticationHeader: { message: (c: Context) => refusal(c, 401, 'Malformed Authorization header') },
    invalidToken: { message: (c: Context) => refusal(c, 401, 'Invalid bearer token') },
  });
}
