import { Hono, type Context, type MiddlewareHandler } from 'hono';
import { bearerAuth } from 'hono/bearer-auth';
import type { ReloadResult, TableHolder } from '../config/table-holder.js';
import { limitsFor, type LimitTable } from '../limits/limit-table.js';
import { formatSourceError } from '../lib/yaml-source.js';
import { KEY_ID } from '../keys/key-file.js';
import type { KeyRegistry } from '../keys/registry.js';
import type { Limiter } from '../limits/limiter.js';
import { StoreUnavailableError } from '../limits/store.js';
import { secondsUntil } from '../limits/windows.js';
import type { Logger } from '../observability/logger.js';
import { sha256Hex } from '../lib/hash.js';
import { shortKeyHash } from '../observability/logger.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import { adminOpenApi } from '../openapi/admin.js';
import type { OpenApiDocument } from '../openapi/common.js';
import { publicOpenApi } from '../openapi/public.js';
import type { EventBus } from '../events/bus.js';
import { errorBody } from '../lib/answers.js';
import { VERSION } from '../lib/version.js';

/**
 * The admin listener (INTERFACE §7): health, readiness and metrics for the platform, and the
 * bearer-protected `/admin/*` API for the limit table, a key's usage and issued keys.
 */

export interface AdminDeps {
  readonly adminToken: string | undefined;
  readonly tables: TableHolder;
  readonly limiter: Limiter;
  readonly registry: KeyRegistry;
  readonly events: EventBus;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
  /** Undefined when the counter store answers; otherwise why it does not. */
  readonly storeProblem: () => Promise<string | undefined>;
  readonly shuttingDown: () => boolean;
  /** Reloads the limit table (and what depends on it); the admin endpoint and SIGHUP share it. */
  readonly reload: () => Promise<ReloadResult>;
  /** Metrics text; with WORKERS>1 the primary aggregates its workers'. */
  readonly metricsText?: () => Promise<string>;
  /** For `/openapi.json`: the API-key header and the routes whose body must be credentials. */
  readonly apiKeyHeader: string;
  readonly credentialRoutes?: ReadonlySet<string>;
}

const json = (c: Context, status: number, error: string): Response =>
  c.newResponse(errorBody(status, error), status as 400, { 'Content-Type': 'application/json' });

export function createAdminApp(deps: AdminDeps): Hono {
  const app = new Hono();
  const { tables, limiter, registry, logger } = deps;

  app.use(async function adminLog(c, next) {
    await next();
    // The route pattern, not the path: an API key in the path is a secret.
    logger.info(
      {
        admin: true,
        method: c.req.method,
        route: c.req.routePath,
        status: c.res.status,
        key: c.req.param('apiKey') ? shortKeyHash(sha256Hex(c.req.param('apiKey') as string)) : undefined,
      },
      'admin request',
    );
  });

  app.get('/healthz', (c) => c.json({ status: 'ok' }));

  app.get('/readyz', async (c) => {
    if (deps.shuttingDown()) return c.json({ status: 'unavailable', reason: 'shutting down' }, 503);
    if (!tables.current()) return c.json({ status: 'unavailable', reason: 'no valid limit table is loaded' }, 503);
    const problem = await deps.storeProblem();
    if (!problem) return c.json({ status: 'ok' });
    if (limiter.failureMode === 'closed') return c.json({ status: 'unavailable', reason: problem }, 503);
    // Still serving (insurance or open): taking every instance out of rotation would turn a Redis blip into an outage.
    return c.json({ status: 'degraded', reason: problem });
  });

  app.get('/metrics', async (c) => {
    const text = deps.metricsText ? await deps.metricsText() : await deps.metrics.registry.metrics();
    return c.text(text, 200, { 'Content-Type': deps.metrics.registry.contentType });
  });

  // Documents and version need no token, like /metrics: they hold nothing secret.
  app.get('/version', (c) => c.json({ version: VERSION, node: process.version }));
  let published: { table: LimitTable; document: OpenApiDocument } | undefined;
  app.get('/openapi.json', (c) => {
    const table = tables.current();
    if (!table) return json(c, 503, 'No valid limit table is loaded');
    if (published?.table !== table) {
      const options = { apiKeyHeader: deps.apiKeyHeader, version: VERSION, credentialRoutes: deps.credentialRoutes };
      published = { table, document: publicOpenApi(table, options) };
    }
    return c.json(published.document);
  });
  const adminDocument = adminOpenApi({ version: VERSION });
  app.get('/openapi-admin.json', (c) => c.json(adminDocument));

  app.use('/admin/*', adminAuth(deps.adminToken));

  app.get('/admin/limits', (c) => {
    const table = tables.current();
    if (!table) return json(c, 503, 'No valid limit table is loaded');
    return c.json(describeTable(table, tables.displayName));
  });

  app.post('/admin/limits/reload', async (c) => {
    const result = await deps.reload();
    if (!result.ok) {
      return c.json(
        {
          error: 'Unprocessable Content',
          message: `${tables.displayName} is not valid; the table in force stays`,
          errors: result.errors.map(formatSourceError),
        },
        422,
      );
    }
    return c.json({ hash: result.table.hash, loadedAt: result.table.loadedAt.toISOString(), changed: result.changed });
  });

  app.get('/admin/usage/:apiKey', async (c) => {
    const table = tables.current();
    if (!table) return json(c, 503, 'No valid limit table is loaded');
    const keyHash = sha256Hex(c.req.param('apiKey'));
    const plan = registry.lookup(keyHash)?.plan;
    let usage;
    try {
      usage = await limiter.usage(keyHash, table.rows, table.calendar);
    } catch (err) {
      if (err instanceof StoreUnavailableError) return json(c, 503, 'Counter store unavailable');
      throw err;
    }
    const now = Date.now();
    const windows = table.calendar.at(now);
    return c.json({
      endpoints: table.rows.map((row, i) => {
        const limits = limitsFor(table, row, plan);
        const used = usage[i] ?? { hour: 0, day: 0 };
        return {
          name: row.name,
          route: row.route.text,
          hour: {
            limit: limits.perHour,
            used: used.hour,
            remaining: Math.max(0, limits.perHour - used.hour),
            resetSeconds: secondsUntil(windows.hourEnd, now),
          },
          day: {
            limit: limits.perDay,
            used: used.day,
            remaining: Math.max(0, limits.perDay - used.day),
            resetSeconds: secondsUntil(windows.dayEnd, now),
          },
        };
      }),
    });
  });

  app.delete('/admin/usage/:apiKey', async (c) => {
    const table = tables.current();
    if (!table) return json(c, 503, 'No valid limit table is loaded');
    const keyHash = sha256Hex(c.req.param('apiKey'));
    try {
      await limiter.reset(keyHash, table.rows);
      await deps.events.publish({ type: 'usage-reset', keyHash });
    } catch (err) {
      if (err instanceof StoreUnavailableError) return json(c, 503, 'Counter store unavailable');
      throw err;
    }
    return c.body(null, 204);
  });

  app.post('/admin/keys', async (c) => {
    let body: unknown;
    try {
      body = await c.req.json();
    } catch {
      return json(c, 400, 'Body must be JSON: {"id":"…","plan":"…"}');
    }
    const { id, plan } = (typeof body === 'object' && body !== null ? body : {}) as { id?: unknown; plan?: unknown };
    if (typeof id !== 'string' || !KEY_ID.test(id))
      return json(c, 400, 'id must be letters, digits, ".", "_" and "-" (at most 64)');
    if (plan !== undefined && plan !== null && (typeof plan !== 'string' || !tables.current()?.plans.has(plan))) {
      return json(
        c,
        400,
        `Unknown plan; plans of the table: ${[...(tables.current()?.plans.keys() ?? [])].join(', ') || 'none'}`,
      );
    }
    try {
      const result = await registry.create(id, typeof plan === 'string' ? plan : undefined);
      if (!result.created) return json(c, 409, `A key with id "${id}" exists`);
      await deps.events.publish({ type: 'keys-changed' });
      logger.info({ keyId: id, plan: result.record.plan, key: shortKeyHash(result.record.sha256) }, 'api key issued');
      return c.json({ id, key: result.key, plan: result.record.plan ?? null }, 201);
    } catch (err) {
      if (err instanceof StoreUnavailableError) return json(c, 503, 'Key store unavailable');
      throw err;
    }
  });

  app.get('/admin/keys', (c) =>
    c.json({
      keys: registry.list().map((k) => ({
        id: k.id,
        plan: k.plan ?? null,
        source: k.source === 'file' ? 'key-file' : 'admin-api',
        ...(k.createdAt ? { createdAt: k.createdAt } : {}),
      })),
    }),
  );

  app.delete('/admin/keys/:id', async (c) => {
    const id = c.req.param('id');
    try {
      const result = await registry.revoke(id);
      if (result === 'in-key-file') return json(c, 409, `Key "${id}" comes from the key file: remove it there`);
      if (result === 'not-found') return json(c, 404, `No key with id "${id}"`);
      await deps.events.publish({ type: 'keys-changed' });
      logger.info({ keyId: id }, 'api key revoked');
      return c.body(null, 204);
    } catch (err) {
      if (err instanceof StoreUnavailableError) return json(c, 503, 'Key store unavailable');
      throw err;
    }
  });

  app.notFound((c) => json(c, 404, 'No such admin endpoint'));
  app.onError((err, c) => {
    if ('getResponse' in err && typeof err.getResponse === 'function') return err.getResponse();
    logger.error({ err }, 'admin error');
    return json(c, 500, 'Unexpected error');
  });
  return app;
}

function adminAuth(token: string | undefined): MiddlewareHandler {
  if (!token) {
    return async function adminDisabled(c) {
      return json(c, 403, 'The admin API is disabled: ADMIN_TOKEN is not set');
    };
  }
  // hono's bearer middleware compares in constant time (hashes of both, then timingSafeEqual).
  return bearerAuth({
    token,
    noAuthenticationHeader: { message: (c: Context) => json(c, 401, 'Missing bearer token') },
    invalidAuthenticationHeader: { message: (c: Context) => json(c, 401, 'Malformed Authorization header') },
    invalidToken: { message: (c: Context) => json(c, 401, 'Invalid bearer token') },
  });
}

function describeTable(table: LimitTable, file: string): object {
  return {
    file,
    hash: table.hash,
    loadedAt: table.loadedAt.toISOString(),
    timezone: table.timezone,
    limits: table.rows.map((row) => ({
      name: row.name,
      route: row.route.text,
      ...(row.also.length ? { also: row.also.map((r) => r.text) } : {}),
      per_hour: row.limits.perHour,
      per_day: row.limits.perDay,
      ...(row.shadow ? { shadow: true } : {}),
    })),
    plans: Object.fromEntries(
      [...table.plans.values()].map((plan) => [
        plan.name,
        table.rows.map((row) => ({ route: row.route.text, ...toYamlNames(limitsFor(table, row, plan.name)) })),
      ]),
    ),
  };
}

function toYamlNames(limits: { perHour: number; perDay: number }): { per_hour: number; per_day: number } {
  return { per_hour: limits.perHour, per_day: limits.perDay };
}
