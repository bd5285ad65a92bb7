import { Hono } from 'hono';
import { VERSION } from '../lib/version.js';
import type { LimitTable } from '../limits/limit-table.js';
import { adminOpenApi } from '../openapi/admin.js';
import type { OpenApiDocument } from '../openapi/common.js';
import { publicOpenApi } from '../openapi/public.js';
import type { AdminDeps } from './app.js';
import { withTable } from './common.js';

/**
 * What the platform reads without a token (docs/operations.md "The admin listener"): liveness, readiness,
 * metrics, the version and the OpenAPI documents — none of it secret.
 */
export function statusApp(deps: AdminDeps): Hono {
  const app = new Hono();
  app.get('/healthz', (c) => c.json({ status: 'ok' }));

  app.get('/readyz', async (c) => {
    if (deps.shuttingDown()) return c.json({ status: 'unavailable', reason: 'shutting down' }, 503);
    if (!deps.tables.current()) return c.json({ status: 'unavailable', reason: 'no valid limit table is loaded' }, 503);
    // WORKERS=n: the primary's table and Redis say nothing of whether a worker serves the public port.
    const notServing = deps.notServing?.();
    if (notServing) return c.json({ status: 'unavailable', reason: notServing }, 503);
    // Issued keys never read are Redis being away too: the keys of the key file are still served,
    // and the issued ones answered 503 with Retry-After (README "API keys and plans").
    const problem = (await deps.keysReady())
      ? await deps.storeProblem()
      : 'the issued API keys could not be read yet: Redis unreachable';
    if (!problem) return c.json({ status: 'ok' });
    if (deps.limiter.failureMode === 'closed') return c.json({ status: 'unavailable', reason: problem }, 503);
    // Still serving (insurance or open): taking every instance out of rotation would turn a Redis blip into an outage.
    return c.json({ status: 'degraded', reason: problem });
  });

  app.get('/metrics', async (c) => {
    const text = deps.metricsText ? await deps.metricsText() : await deps.metrics.registry.metrics();
    return c.text(text, 200, { 'Content-Type': deps.metrics.registry.contentType });
  });

  app.get('/version', (c) => c.json({ version: VERSION, node: process.version }));

  // The public document follows the table in force; it is built once per table.
  let published: { table: LimitTable; document: OpenApiDocument } | undefined;
  app.get('/openapi.json', withTable(deps.tables), (c) => {
    const table = c.get('table');
    if (published?.table !== table) {
      const options = { apiKeyHeader: deps.apiKeyHeader, version: VERSION, credentialRoutes: deps.credentialRoutes };
      published = { table, document: publicOpenApi(table, options) };
    }
    return c.json(published.document);
  });
  const adminDocument = adminOpenApi({ version: VERSION });
  app.get('/openapi-admin.json', (c) => c.json(adminDocument));
  return app;
}
