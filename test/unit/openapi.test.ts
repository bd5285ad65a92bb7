import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { createAdminApp, type AdminDeps } from '../../src/admin/app.js';
import type { LimitTable } from '../../src/limits/limit-table.js';
import { parseLimits } from '../../src/config/load-limits.js';
import { TableHolder } from '../../src/config/table-holder.js';
import { createLogger } from '../../src/observability/logger.js';
import { GatewayMetrics } from '../../src/observability/metrics.js';
import { adminOpenApi } from '../../src/openapi/admin.js';
import type { Json, OpenApiDocument, OpenApiOperation, OpenApiPathItem } from '../../src/openapi/common.js';
import { REASON_PHRASES } from '../../src/openapi/common.js';
import { publicOpenApi } from '../../src/openapi/public.js';
import { tokenSetBody } from '../../src/sandbox/bodies.js';
import { REASONS, errorBody } from '../../src/lib/answers.js';
import { SHIPPED_LIMITS } from '../helpers/gateway.js';
import { USAGE_HEADERS } from '../helpers/http.js';
import { schemaChecker, validateDocument } from '../helpers/openapi.js';

const OPTIONS = { apiKeyHeader: 'X-API-Key', version: '9.8.7' };
const DOCUMENTED_HEADERS = [...USAGE_HEADERS, 'X-Request-Id'];

function table(text: string): LimitTable {
  const result = parseLimits(text, 'limits.yaml');
  if (!result.ok) throw new Error(JSON.stringify(result.errors));
  return result.table;
}

/** Follows one `$ref` of the document (`#/components/...`). */
function resolve<T = Json>(doc: OpenApiDocument, value: unknown): T {
  const ref = (value as { $ref?: string }).$ref;
  if (!ref) return value as T;
  const target = ref
    .slice(2)
    .split('/')
    .reduce<unknown>((node, key) => (node as Record<string, unknown>)[key], doc);
  if (target === undefined) throw new Error(`dangling ${ref}`);
  return target as T;
}

/** The operation a route of the table becomes: `WS` rows are GETs with `x-websocket`. */
function operationOf(doc: OpenApiDocument, routeText: string): OpenApiOperation | undefined {
  const [method = '', path = ''] = routeText.split(' ');
  const item = doc.paths[path];
  return method === 'WS' ? item?.get : item?.[method.toLowerCase() as 'get'];
}

function operations(doc: OpenApiDocument): OpenApiOperation[] {
  return Object.values(doc.paths).flatMap((item: OpenApiPathItem) =>
    (['get', 'put', 'post', 'delete', 'patch'] as const).flatMap((m) => (item[m] ? [item[m]] : [])),
  );
}

describe('the public OpenAPI document of the shipped limits.yaml', () => {
  const doc = publicOpenApi(table(SHIPPED_LIMITS), OPTIONS);

  it('is a valid OpenAPI 3.1 document', async () => {
    expect(doc.openapi).toBe('3.1.0');
    expect(doc.info.version).toBe('9.8.7');
    expect(await validateDocument(doc)).toEqual({ valid: true, messages: [], warnings: [] });
  });

  it('has every route and also route of the file, with its exact numbers and its plan numbers', () => {
    // Read from the YAML itself, plans computed by their rule (scale rounded down, rows override).
    const raw = parse(SHIPPED_LIMITS) as {
      limits: Array<{ route: string; also?: string[]; per_hour: number; per_day: number }>;
      plans: Record<string, { scale?: number; rows?: Record<string, { per_hour?: number; per_day?: number }> }>;
    };
    let routes = 0;
    for (const row of raw.limits) {
      const plans = Object.fromEntries(
        Object.entries(raw.plans).map(([name, plan]) => {
          const override = plan.rows?.[row.route] ?? {};
          const scale = plan.scale ?? 1;
          return [
            name,
            {
              per_hour: override.per_hour ?? Math.floor(row.per_hour * scale),
              per_day: override.per_day ?? Math.floor(row.per_day * scale),
            },
          ];
        }),
      );
      for (const route of [row.route, ...(row.also ?? [])]) {
        routes++;
        const operation = operationOf(doc, route);
        expect(operation, route).toBeDefined();
        expect(operation?.['x-ratelimit'], route).toEqual({ per_hour: row.per_hour, per_day: row.per_day, plans });
        if (route.startsWith('WS ')) expect(operation?.['x-websocket'], route).toBe(true);
      }
    }
    expect(routes).toBe(20);
    expect(operations(doc)).toHaveLength(routes);
    expect(operationOf(doc, 'GET /marketdata/quote/{symbol}')?.['x-ratelimit']).toEqual({
      per_hour: 18000,
      per_day: 200000,
      plans: {
        premium: { per_hour: 90000, per_day: 1000000 },
        'market-maker': { per_hour: 100000, per_day: 1000000 },
      },
    });
  });

  it('says which row an also route shares its counters with', () => {
    const derivative = operationOf(doc, 'POST /oapi/auth/gen-secret-key/derivative');
    expect(derivative?.['x-ratelimit-row']).toBe('POST /auth/token');
    expect(derivative?.description).toContain('`POST /auth/token`');
    expect(operationOf(doc, 'POST /auth/token')?.['x-ratelimit-row']).toBeUndefined();
  });

  it('describes the API-key header as the security scheme of every operation', () => {
    expect(doc.security).toEqual([{ ApiKey: [] }]);
    expect(doc.components.securitySchemes?.ApiKey).toMatchObject({ type: 'apiKey', in: 'header', name: 'X-API-Key' });
    const other = publicOpenApi(table(SHIPPED_LIMITS), { ...OPTIONS, apiKeyHeader: 'X-Client-Key' });
    expect(other.components.securitySchemes?.ApiKey).toMatchObject({ name: 'X-Client-Key' });
    // WebSocket routes also take the key as the api_key query parameter (browsers cannot set headers there).
    expect(operationOf(doc, 'WS /ws/orders')?.security).toEqual([{ ApiKey: [] }, { ApiKeyQuery: [] }]);
    expect(doc.components.securitySchemes?.ApiKeyQuery).toMatchObject({ type: 'apiKey', in: 'query', name: 'api_key' });
  });

  it('has the usage headers on every response, and Retry-After on 429', () => {
    for (const operation of operations(doc)) {
      for (const [status, response] of Object.entries(operation.responses)) {
        const headers = resolve<{ headers?: Record<string, unknown> }>(doc, response).headers ?? {};
        expect(Object.keys(headers), `${operation.operationId} ${status}`).toEqual(
          expect.arrayContaining(DOCUMENTED_HEADERS),
        );
      }
      const tooMany = resolve<{ headers: Record<string, unknown> }>(doc, operation.responses['429']);
      expect(resolve(doc, tooMany.headers['Retry-After'])).toMatchObject({
        required: true,
        schema: { type: 'integer', minimum: 1 },
      });
    }
  });

  it('lists the answers the gateway gives a counted request that it does not forward (regression: no 408, and no Retry-After on 503)', () => {
    for (const operation of operations(doc).filter((o) => !o['x-websocket'])) {
      // A body that does not all arrive within REQUEST_TIMEOUT_MS: counted, with the usage headers.
      expect(resolve<Json>(doc, operation.responses['408']), operation.operationId).toMatchObject({
        content: { 'application/json': { example: { error: 'Request Timeout' } } },
      });
    }
    // Both 503s (REDIS_FAILURE_MODE=closed, a key that cannot be checked) carry Retry-After.
    const unavailable = resolve<{ headers: Record<string, unknown> }>(
      doc,
      doc.components.responses?.ServiceUnavailable,
    );
    expect(resolve(doc, unavailable.headers['Retry-After'])).toMatchObject({ schema: { type: 'integer', minimum: 1 } });
  });

  it('gives the exact 429 body, and a schema that admits only it', () => {
    const tooMany = resolve<{ content: Record<string, { example: unknown; schema: unknown }> }>(
      doc,
      doc.components.responses?.TooManyRequests,
    );
    const json = tooMany.content['application/json'];
    expect(JSON.stringify(json?.example)).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    expect(JSON.stringify(json?.example)).toBe(errorBody(429, 'Too Many Requests'));
    const check = schemaChecker(doc);
    expect(check('RateLimitExceeded', json?.example)).toBeUndefined();
    expect(check('RateLimitExceeded', { error: 'Rate Limit Exceeded', message: 'Slow down' })).toBeDefined();
    expect(check('RateLimitExceeded', { ...(json?.example as object), retry: 1 })).toBeDefined();
  });

  it('describes the gateway’s own answers with the two-field body and the gateway’s reason phrases', () => {
    const check = schemaChecker(doc);
    expect(check('Error', { error: 'Not Found', message: 'No such endpoint' })).toBeUndefined();
    expect(check('Error', { error: 'Not Found' })).toBeDefined();
    expect(check('Error', { error: 'Not Found', message: 'x', stack: 'at …' })).toBeDefined();
    for (const [status, phrase] of Object.entries(REASON_PHRASES)) expect(REASONS[Number(status)]).toBe(phrase);

    const http = operationOf(doc, 'GET /orders/{id}') as OpenApiOperation;
    expect(Object.keys(http.responses).sort()).toEqual(
      ['200', '400', '401', '404', '405', '408', '413', '429', '502', '503', '504', 'default'].sort(),
    );
    for (const status of ['400', '401', '404', '405', '408', '413', '429', '502', '503', '504']) {
      const response = resolve<{ content: Record<string, { example: { error: string; message: string } }> }>(
        doc,
        http.responses[status],
      );
      const example = response.content['application/json']?.example;
      // The body the gateway itself writes for that status and message.
      expect(JSON.stringify(example), status).toBe(errorBody(Number(status), example?.message ?? ''));
      expect(check('Error', example)).toBeUndefined();
    }
    // The bridge's own answers pass through: any JSON.
    const bridge = resolve<{ content: Record<string, { schema: unknown }> }>(doc, http.responses['200']);
    expect(check('BridgeBody', { anything: [1, 'two'] })).toBeUndefined();
    expect(resolve(doc, bridge.content['application/json']?.schema)).toEqual({
      description: expect.any(String) as unknown,
    });
  });

  it('gives the token operations a credentials body, 415 and the token set', () => {
    const check = schemaChecker(doc);
    for (const route of ['POST /oapi/auth/gen-secret-key/underlying', 'POST /oapi/auth/gen-secret-key/derivative']) {
      const operation = operationOf(doc, route) as OpenApiOperation;
      expect(operation.requestBody, route).toMatchObject({ required: true });
      expect(Object.keys(operation.responses)).toContain('415');
      expect(operation.responses['200']).toEqual({ $ref: '#/components/responses/TokenSet' });
    }
    expect(check('Credentials', { username: 'demo', password: 'demo-password' })).toBeUndefined();
    expect(check('Credentials', { username: '', password: 'x' })).toBeDefined();
    expect(check('Credentials', { username: 'demo' })).toBeDefined();
    expect(check('Credentials', { username: 'demo', password: 5 })).toBeDefined();
    // The token set as the bridges send it.
    const tokens = JSON.parse(tokenSetBody({ access: 'a', refresh: 'r', otp: 'o' })) as Record<string, unknown>;
    expect(check('TokenSet', tokens)).toBeUndefined();
    expect(resolve<{ required: string[] }>(doc, doc.components.schemas?.TokenSet).required.sort()).toEqual(
      Object.keys(tokens).sort(),
    );
    // Other routes have no 415 and take any body.
    expect(Object.keys(operationOf(doc, 'POST /auth/token')?.responses ?? {})).not.toContain('415');
    expect(operationOf(doc, 'POST /orders')?.requestBody).toMatchObject({ required: false });
  });

  it('describes a WebSocket row as a GET with Upgrade: websocket and a 101', () => {
    const ws = operationOf(doc, 'WS /ws/marketdata') as OpenApiOperation;
    expect(ws['x-websocket']).toBe(true);
    expect(ws.parameters).toContainEqual({ $ref: '#/components/parameters/Upgrade' });
    expect(doc.components.parameters?.Upgrade).toMatchObject({ in: 'header', name: 'Upgrade', required: true });
    expect(Object.keys(ws.responses)).toEqual(expect.arrayContaining(['101', '401', '426', '429']));
    expect(Object.keys(ws.responses)).not.toContain('200');
  });

  it('names the path parameters of every templated path', () => {
    expect(doc.paths['/marketdata/quote/{symbol}']?.parameters).toEqual([
      { $ref: '#/components/parameters/path.symbol' },
    ]);
    expect(doc.components.parameters?.['path.symbol']).toMatchObject({ in: 'path', name: 'symbol', required: true });
  });
});

describe('the public OpenAPI document of other tables', () => {
  const odd = table(`timezone: Asia/Ho_Chi_Minh
limits:
  - { name: Read, route: "GET /things/{id}", per_hour: 5, per_day: 50 }
  - { name: Drop, route: "DELETE /things/{thingId}", per_hour: 1, per_day: 2, shadow: true }
  - { name: Feed, route: "GET /feed", per_hour: 1, per_day: 1 }
  - { name: Feed socket, route: "WS /feed", per_hour: 2, per_day: 3 }
  - { name: Root, route: "GET /", per_hour: 1, per_day: 1 }
`);
  const doc = publicOpenApi(odd, OPTIONS);

  it('is valid, and has no plans in x-ratelimit when the table has none', async () => {
    expect(await validateDocument(doc)).toEqual({ valid: true, messages: [], warnings: [] });
    expect(doc.paths['/things/{id}']?.get?.['x-ratelimit']).toEqual({ per_hour: 5, per_day: 50 });
    expect(doc.info.description).toContain('Asia/Ho_Chi_Minh');
    expect(doc.paths['/']?.get?.['x-ratelimit']).toEqual({ per_hour: 1, per_day: 1 });
  });

  it('puts routes that differ only in parameter names on one path, named as first written', () => {
    expect(Object.keys(doc.paths)).not.toContain('/things/{thingId}');
    expect(doc.paths['/things/{id}']?.delete?.['x-ratelimit']).toEqual({ per_hour: 1, per_day: 2 });
    expect(doc.paths['/things/{id}']?.delete?.['x-ratelimit-shadow']).toBe(true);
  });

  it('keeps a WebSocket row beside a GET row of the same path under x-websocket', () => {
    const item = doc.paths['/feed'] as OpenApiPathItem;
    expect(item.get?.['x-ratelimit']).toEqual({ per_hour: 1, per_day: 1 });
    expect((item['x-websocket'] as OpenApiOperation)['x-ratelimit']).toEqual({ per_hour: 2, per_day: 3 });
  });

  it('follows credential_routes', () => {
    const custom = publicOpenApi(odd, { ...OPTIONS, credentialRoutes: ['GET /feed'] });
    expect(Object.keys(custom.paths['/feed']?.get?.responses ?? {})).toContain('415');
    expect(custom.paths['/feed']?.get?.responses['200']).toEqual({ $ref: '#/components/responses/TokenSet' });
  });
});

describe('the admin OpenAPI document', () => {
  const doc = adminOpenApi({ version: '9.8.7' });

  it('is a valid OpenAPI 3.1 document', async () => {
    expect(await validateDocument(doc)).toEqual({ valid: true, messages: [], warnings: [] });
    expect(doc.info.version).toBe('9.8.7');
  });

  it('has every admin path, the open ones without the bearer token', () => {
    const methods = Object.fromEntries(
      Object.entries(doc.paths).map(([path, item]) => [
        path,
        (['get', 'post', 'delete'] as const).filter((m) => item[m]).map((m) => m.toUpperCase()),
      ]),
    );
    expect(methods).toEqual({
      '/healthz': ['GET'],
      '/readyz': ['GET'],
      '/metrics': ['GET'],
      '/version': ['GET'],
      '/openapi.json': ['GET'],
      '/openapi-admin.json': ['GET'],
      '/admin/limits': ['GET'],
      '/admin/limits/reload': ['POST'],
      '/admin/usage/{apiKey}': ['GET', 'DELETE'],
      '/admin/keys': ['GET', 'POST'],
      '/admin/keys/{id}': ['DELETE'],
      '/admin/keys/{id}/usage': ['GET', 'DELETE'],
      '/admin/blocks': ['GET'],
      '/admin/blocks/{address}': ['DELETE'],
    });
    expect(doc.security).toEqual([{ Bearer: [] }]);
    expect(doc.components.securitySchemes?.Bearer).toEqual(expect.objectContaining({ type: 'http', scheme: 'bearer' }));
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const operation of [item.get, item.post, item.delete].filter(Boolean) as OpenApiOperation[]) {
        if (path.startsWith('/admin/')) {
          expect(operation.security, path).toBeUndefined();
          expect(Object.keys(operation.responses), path).toEqual(expect.arrayContaining(['401', '403']));
        } else expect(operation.security, path).toEqual([]);
      }
    }
  });

  it('describes the bodies of the admin API', () => {
    const check = schemaChecker(doc);
    expect(check('Version', { version: '0.1.0', node: 'v20.20.2' })).toBeUndefined();
    expect(check('Version', { version: '0.1.0' })).toBeDefined();
    expect(check('Blocks', { blocks: [{ address: '203.0.113.7', seconds: 120 }] })).toBeUndefined();
    expect(check('Blocks', { blocks: [{ address: '203.0.113.7' }] })).toBeDefined();
    expect(check('IssuedKey', { id: 'acme', key: 'oapi_' + 'a'.repeat(43), plan: null })).toBeUndefined();
    expect(check('ReloadRefused', { error: 'Unprocessable Content', message: 'm', errors: ['x:1:1: y'] })).toBe(
      undefined,
    );
    expect(check('Readiness', { status: 'degraded', reason: 'counter store unreachable (end)' })).toBeUndefined();
    expect(check('Readiness', { status: 'fine' })).toBeDefined();
  });
});

describe('the admin listener’s documents, in-process', () => {
  const silent = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() }));
  const metrics = new GatewayMetrics({ defaultMetrics: false });

  function adminApp(tables: TableHolder) {
    // Only what the documents and /version touch; the rest of the admin API is tested over sockets.
    const deps = { adminToken: 'admin-token-0123456789', tables, metrics, logger: silent, apiKeyHeader: 'X-Key' };
    return createAdminApp(deps as unknown as AdminDeps);
  }

  it('answers /openapi.json with 503 and the two-field body while no table is loaded', async () => {
    const tables = new TableHolder({
      path: '/nonexistent/limits.yaml',
      displayName: 'limits.yaml',
      logger: silent,
      metrics,
    });
    const reply = await adminApp(tables).request('/openapi.json');
    expect(reply.status).toBe(503);
    expect(await reply.text()).toBe('{"error":"Service Unavailable","message":"No valid limit table is loaded"}');
  });
});
