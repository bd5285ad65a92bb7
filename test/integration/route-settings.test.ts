import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';

/**
 * `routing.routes` and `credential_routes` name routes of the limit table; an entry that names
 * none does nothing (a typo would send the derivative token route to the default bridge, its body
 * unchecked). The gateway says so on every load of the table (README "Configuration").
 */

const TOKEN_ROWS = `
  - name: Authentication
    route: POST /auth/token
    also: [POST /oapi/auth/gen-secret-key/underlying, POST /oapi/auth/gen-secret-key/derivative]
    per_hour: 100
    per_day: 1000`;
const ORDERS_ROW = `
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100, per_day: 1000 }`;
const table = (...rows: string[]) => `timezone: UTC\nlimits:${rows.join('')}\n`;

const ROUTING_WARNING =
  'routing.routes names routes the limit table does not have: their requests go to the default bridge';
const CREDENTIALS_WARNING =
  'credential_routes names routes the limit table does not have: their bodies are not checked as credentials';

let gw: TestGateway | undefined;
afterEach(async () => {
  await gw?.stop();
  gw = undefined;
});

const warnings = (msg: string) => (gw as TestGateway).logs.filter((l) => l.level === 'warn' && l.msg === msg);

async function reloadTable(text: string): Promise<void> {
  const { limitsPath, adminUrl } = gw as TestGateway;
  writeFileSync(limitsPath, text);
  const reply = await fetch(`${adminUrl}/admin/limits/reload`, { method: 'POST', headers: authHeader() });
  expect(reply.status).toBe(200);
}

describe('routes of the settings that the limit table does not have', () => {
  it('are named at start-up and on a reload that still lacks them, and no longer once the table has them', async () => {
    // The default settings route the derivative token operation to fno and check both token bodies.
    gw = await startTestGateway({ limits: table(ORDERS_ROW) });
    expect(warnings(ROUTING_WARNING)).toEqual([
      expect.objectContaining({ routes: ['POST /oapi/auth/gen-secret-key/derivative'], bridge: 'eqt' }),
    ]);
    expect(warnings(CREDENTIALS_WARNING)).toEqual([
      expect.objectContaining({
        routes: ['POST /oapi/auth/gen-secret-key/underlying', 'POST /oapi/auth/gen-secret-key/derivative'],
      }),
    ]);
    await reloadTable(table(ORDERS_ROW, `\n  - { name: Orders, route: "POST /orders", per_hour: 1, per_day: 1 }`));
    expect(warnings(ROUTING_WARNING)).toHaveLength(2);
    expect(warnings(CREDENTIALS_WARNING)).toHaveLength(2);
    // Named as an `also` route of a row, a route is the table's.
    await reloadTable(table(TOKEN_ROWS, ORDERS_ROW));
    expect(warnings(ROUTING_WARNING)).toHaveLength(2);
    expect(warnings(CREDENTIALS_WARNING)).toHaveLength(2);
  });

  it('as a typo in config/gateway.yaml, are named with the bridge their requests go to instead', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-route-settings-'));
    try {
      const config = join(dir, 'gateway.yaml');
      writeFileSync(config, 'routing:\n  default: eqt\n  routes:\n    POST /oapi/auth/gen-secret-key/derivativ: fno\n');
      gw = await startTestGateway({ limits: table(TOKEN_ROWS, ORDERS_ROW), env: { GATEWAY_CONFIG: config } });
      expect(warnings(ROUTING_WARNING)).toEqual([
        expect.objectContaining({ routes: ['POST /oapi/auth/gen-secret-key/derivativ'], bridge: 'eqt' }),
      ]);
      expect(warnings(CREDENTIALS_WARNING)).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
