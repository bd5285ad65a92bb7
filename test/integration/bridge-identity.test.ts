import { createHash } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxBridge } from '../../src/sandbox/bridge.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';

/**
 * What a bridge learns of the caller (README "Forwarding"): never the client's API key, in a header
 * or in the WebSocket `api_key` parameter; for an issued key its id in `X-Consumer-Id`
 * (`CONSUMER_ID_HEADER`), which a client cannot send in its own name.
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100, per_day: 100 }
  - { name: Order Stream, route: "WS /ws/orders", per_hour: 100, per_day: 100 }
`;
const ISSUED_KEY = 'issued-key-for-identity-0123456789';
const sha = (key: string): string => createHash('sha256').update(key).digest('hex');

/** Headers of the upgrade requests both bridges receive, newest last. */
function upgradesOf(gw: TestGateway): IncomingHttpHeaders[] {
  const seen: IncomingHttpHeaders[] = [];
  for (const bridge of [gw.eqt, gw.fno] as SandboxBridge[])
    bridge.wss.on('connection', (_ws, req) => seen.push(req.headers));
  return seen;
}

async function openSocket(gw: TestGateway, path: string, headers: Record<string, string> = {}): Promise<WebSocket> {
  const ws = new WebSocket(`ws://127.0.0.1:${gw.port}${path}`, { headers });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  return ws;
}

async function lastBridgeRequest(gw: TestGateway, reply: { status: number }): Promise<IncomingHttpHeaders> {
  expect(reply.status).toBe(200);
  const last = [...gw.eqt.requests, ...gw.fno.requests].at(-1);
  expect(last).toBeDefined();
  return (last as { headers: IncomingHttpHeaders }).headers;
}

describe.each([
  ['X-API-Key', 'X-Consumer-Id'],
  ['X-Client-Key', 'X-Caller'],
])('with API_KEY_HEADER=%s and CONSUMER_ID_HEADER=%s', (apiKeyHeader, consumerHeader) => {
  let gw: TestGateway;
  let dir: string;
  let upgrades: IncomingHttpHeaders[];
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-identity-'));
    writeFileSync(join(dir, 'keys.yaml'), `keys:\n  - id: acme-desk\n    sha256: ${sha(ISSUED_KEY)}\n`);
    gw = await startTestGateway({
      limits: LIMITS,
      env: {
        API_KEY_HEADER: apiKeyHeader,
        CONSUMER_ID_HEADER: consumerHeader,
        API_KEYS_FILE: join(dir, 'keys.yaml'),
      },
    });
    upgrades = upgradesOf(gw);
  });
  afterAll(async () => {
    await gw.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends an issued key as its id, never the key, and a client cannot pose as another consumer', async () => {
    const reply = await send(gw.url, {
      path: '/orders/1',
      headers: { [apiKeyHeader]: ISSUED_KEY, [consumerHeader]: 'someone-else' },
    });
    const headers = await lastBridgeRequest(gw, reply);
    expect(headers[apiKeyHeader.toLowerCase()]).toBeUndefined();
    expect(headers[consumerHeader.toLowerCase()]).toBe('acme-desk');
    expect(JSON.stringify(headers)).not.toContain(ISSUED_KEY);
  });

  it('keeps the key out of the query of an HTTP route too, every other parameter byte for byte (regression: ?api_key= reached the bridge)', async () => {
    const reply = await send(gw.url, {
      path: `/orders/1?a=1&api_key=${ISSUED_KEY}&b=%2F&api%5Fkey=${ISSUED_KEY}&c`,
      headers: { [apiKeyHeader]: ISSUED_KEY },
    });
    await lastBridgeRequest(gw, reply);
    const last = [...gw.eqt.requests, ...gw.fno.requests].at(-1) as { url: string };
    expect(last.url).toBe('/orders/1?a=1&b=%2F&c');
  });

  it('drops a consumer or key header spelt with underscores (regression: X_Consumer_Id reached the bridge, which a CGI-style server reads as X-Consumer-Id)', async () => {
    const underscored = (name: string): string => name.replaceAll('-', '_');
    const reply = await send(gw.url, {
      path: '/orders/underscores',
      headers: {
        [apiKeyHeader]: ISSUED_KEY,
        [underscored(consumerHeader)]: 'victim',
        [underscored(apiKeyHeader)]: 'another-key',
        X_Forwarded_For: '203.0.113.9',
        X_Kept_Field: 'yes',
      },
    });
    const headers = await lastBridgeRequest(gw, reply);
    expect(headers[underscored(consumerHeader).toLowerCase()]).toBeUndefined();
    expect(headers[underscored(apiKeyHeader).toLowerCase()]).toBeUndefined();
    expect(headers.x_forwarded_for).toBeUndefined();
    expect(headers[consumerHeader.toLowerCase()]).toBe('acme-desk');
    // Other names with underscores are the client's own business.
    expect(headers.x_kept_field).toBe('yes');
    expect(JSON.stringify(headers)).not.toContain('victim');

    const before = upgrades.length;
    const ws = await openSocket(gw, '/ws/orders', {
      [apiKeyHeader]: ISSUED_KEY,
      [underscored(consumerHeader)]: 'victim',
    });
    for (let i = 0; i < 40 && upgrades.length < before + 1; i++) await new Promise((r) => setTimeout(r, 25));
    expect(JSON.stringify(upgrades.at(-1))).not.toContain('victim');
    expect(upgrades.at(-1)?.[consumerHeader.toLowerCase()]).toBe('acme-desk');
    ws.close();
  });

  it('sends no consumer for a key that is not issued (API_KEY_MODE=any), also not the one the client wrote', async () => {
    const reply = await send(gw.url, {
      path: '/orders/2',
      headers: { [apiKeyHeader]: 'just-some-key', [consumerHeader]: 'acme-desk' },
    });
    const headers = await lastBridgeRequest(gw, reply);
    expect(headers[apiKeyHeader.toLowerCase()]).toBeUndefined();
    expect(headers[consumerHeader.toLowerCase()]).toBeUndefined();
    expect(JSON.stringify(headers)).not.toContain('just-some-key');
  });

  it('keeps the key out of a WebSocket upgrade, as a header and as api_key, and names the consumer', async () => {
    const before = upgrades.length;
    const byHeader = await openSocket(gw, '/ws/orders', { [apiKeyHeader]: ISSUED_KEY, [consumerHeader]: 'x' });
    const byQuery = await openSocket(gw, `/ws/orders?api_key=${ISSUED_KEY}`);
    for (let i = 0; i < 40 && upgrades.length < before + 2; i++) await new Promise((r) => setTimeout(r, 25));
    expect(upgrades).toHaveLength(before + 2);
    for (const headers of upgrades.slice(before)) {
      expect(JSON.stringify(headers)).not.toContain(ISSUED_KEY);
      expect(headers[consumerHeader.toLowerCase()]).toBe('acme-desk');
    }
    byHeader.close();
    byQuery.close();
  });
});

describe('CONSUMER_ID_HEADER set empty', () => {
  it('sends no consumer header, and still never the key', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-identity-'));
    writeFileSync(join(dir, 'keys.yaml'), `keys:\n  - id: acme-desk\n    sha256: ${sha(ISSUED_KEY)}\n`);
    const gw = await startTestGateway({
      limits: LIMITS,
      env: { CONSUMER_ID_HEADER: '', API_KEYS_FILE: join(dir, 'keys.yaml') },
    });
    try {
      const reply = await send(gw.url, { path: '/orders/3', headers: { 'X-API-Key': ISSUED_KEY } });
      const headers = await lastBridgeRequest(gw, reply);
      expect(headers['x-api-key']).toBeUndefined();
      expect(headers['x-consumer-id']).toBeUndefined();
      expect(JSON.stringify(headers)).not.toContain('acme-desk');
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
