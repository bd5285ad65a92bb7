import { readFileSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminOpenApi } from '../../src/openapi/admin.js';
import type { OpenApiDocument } from '../../src/openapi/common.js';
import { publicOpenApi } from '../../src/openapi/public.js';
import { DEMO_PASSWORD, DEMO_USERNAME } from '../../src/sandbox/bodies.js';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { USAGE_HEADER_KEYS, send } from '../helpers/http.js';
import { schemaChecker, validateDocument, type SchemaCheck } from '../helpers/openapi.js';

/**
 * The documents and the version on the admin listener, over real sockets: served without the
 * bearer token, for the table in force, and true to what the gateway really answers.
 */

const VERSION = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

const LIMITS = `
limits:
  - name: Authentication
    route: POST /auth/token
    also: [POST /oapi/auth/gen-secret-key/underlying]
    per_hour: 60
    per_day: 500
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 2, per_day: 6 }
  - { name: Orders socket, route: "WS /ws/orders", per_hour: 2, per_day: 6 }
plans:
  premium: { scale: 5 }
`;

let gw: TestGateway;
let pub: SchemaCheck;
let adm: SchemaCheck;
beforeAll(async () => {
  gw = await startTestGateway({ limits: LIMITS, env: { API_KEY_HEADER: 'X-Client-Key' } });
  adm = schemaChecker(adminOpenApi({ version: VERSION }));
});
afterAll(async () => {
  await gw.stop();
});

const admin = (path: string, init: { method?: string; headers?: Record<string, string>; body?: string } = {}) =>
  send(gw.adminUrl, { path, method: init.method ?? 'GET', headers: init.headers ?? {}, body: init.body });

describe('without the bearer token', () => {
  it('GET /openapi.json answers the public document of the table in force', async () => {
    const reply = await admin('/openapi.json');
    expect(reply.status).toBe(200);
    expect(reply.headers['content-type']).toMatch(/^application\/json/);
    const doc = reply.json<OpenApiDocument>();
    expect(await validateDocument(doc)).toEqual({ valid: true, messages: [], warnings: [] });
    const table = gw.gateway.tables.current();
    if (!table) throw new Error('no table');
    expect(doc).toEqual(
      JSON.parse(JSON.stringify(publicOpenApi(table, { apiKeyHeader: 'X-Client-Key', version: VERSION }))),
    );
    expect(doc.components.securitySchemes?.ApiKey).toMatchObject({ in: 'header', name: 'X-Client-Key' });
    expect(doc.paths['/orders/{id}']?.get?.['x-ratelimit']).toEqual({
      per_hour: 2,
      per_day: 6,
      plans: { premium: { per_hour: 10, per_day: 30 } },
    });
    pub = schemaChecker(doc);
  });

  it('GET /openapi-admin.json answers the admin document', async () => {
    const reply = await admin('/openapi-admin.json');
    expect(reply.status).toBe(200);
    expect(reply.json()).toEqual(JSON.parse(JSON.stringify(adminOpenApi({ version: VERSION }))));
  });

  it('GET /version answers the package version and the Node.js version', async () => {
    const reply = await admin('/version');
    expect(reply.status).toBe(200);
    expect(reply.text).toBe(JSON.stringify({ version: VERSION, node: process.version }));
    expect(adm('Version', reply.json())).toBeUndefined();
  });

  it('GET /metrics has oapi_gateway_build_info', async () => {
    const reply = await admin('/metrics');
    expect(reply.text).toContain(`oapi_gateway_build_info{version="${VERSION}",node="${process.version}"} 1\n`);
  });

  it('/admin/* still needs it', async () => {
    expect((await admin('/admin/limits')).status).toBe(401);
  });
});

describe('the documents say what the gateway answers', () => {
  const key = { 'X-Client-Key': 'openapi-client' };
  const usageHeaders = [...USAGE_HEADER_KEYS, 'x-request-id'];

  it('a login answers the token set, with the usage headers', async () => {
    const reply = await send(gw.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/underlying',
      headers: { ...key, 'Content-Type': 'application/json' },
      body: JSON.stringify({ username: DEMO_USERNAME, password: DEMO_PASSWORD }),
    });
    expect(reply.status).toBe(200);
    expect(pub('TokenSet', reply.json())).toBeUndefined();
    for (const name of usageHeaders) expect(reply.headers[name], name).toBeDefined();
    const bad = await send(gw.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/underlying',
      headers: { ...key, 'Content-Type': 'application/json' },
      body: JSON.stringify({ username: DEMO_USERNAME }),
    });
    expect(bad.status).toBe(400);
    expect(pub('Error', bad.json())).toBeUndefined();
  });

  it('a spent window answers the documented 429', async () => {
    let reply = await send(gw.url, { path: '/orders/1', headers: key });
    for (let i = 0; i < 3 && reply.status !== 429; i++) reply = await send(gw.url, { path: '/orders/1', headers: key });
    expect(reply.status).toBe(429);
    expect(pub('RateLimitExceeded', reply.json())).toBeUndefined();
    expect(Number(reply.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    for (const name of usageHeaders) expect(reply.headers[name], name).toBeDefined();
    const missing = await send(gw.url, { path: '/orders/1' });
    expect(missing.status).toBe(401);
    expect(pub('Error', missing.json())).toBeUndefined();
  });

  it('the admin API answers the documented bodies', async () => {
    const auth = authHeader();
    expect(adm('Health', (await admin('/healthz')).json())).toBeUndefined();
    expect(adm('Readiness', (await admin('/readyz')).json())).toBeUndefined();
    expect(adm('Limits', (await admin('/admin/limits', { headers: auth })).json())).toBeUndefined();
    expect(adm('Usage', (await admin('/admin/usage/openapi-client', { headers: auth })).json())).toBeUndefined();
    const issued = await admin('/admin/keys', {
      method: 'POST',
      headers: { ...auth, 'Content-Type': 'application/json' },
      body: JSON.stringify({ id: 'openapi-doc', plan: 'premium' }),
    });
    expect(issued.status).toBe(201);
    expect(adm('IssuedKey', issued.json())).toBeUndefined();
    expect(adm('KeyList', (await admin('/admin/keys', { headers: auth })).json())).toBeUndefined();
    const reload = await admin('/admin/limits/reload', { method: 'POST', headers: auth });
    expect(adm('Reloaded', reload.json())).toBeUndefined();
  });
});

describe('after a reload', () => {
  it('/openapi.json follows the table in force', async () => {
    writeFileSync(gw.limitsPath, LIMITS.replace('per_hour: 2, per_day: 6 }', 'per_hour: 3, per_day: 7 }'));
    const reload = await admin('/admin/limits/reload', { method: 'POST', headers: authHeader() });
    expect(reload.json()).toMatchObject({ changed: true });
    const doc = (await admin('/openapi.json')).json<OpenApiDocument>();
    expect(doc.paths['/orders/{id}']?.get?.['x-ratelimit']).toEqual({
      per_hour: 3,
      per_day: 7,
      plans: { premium: { per_hour: 15, per_day: 35 } },
    });
    expect(doc.info['x-limits']).toEqual({ hash: gw.gateway.tables.current()?.hash, timezone: 'UTC' });
  });
});
