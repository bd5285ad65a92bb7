import { randomBytes } from 'node:crypto';
import { loadSettings, SettingsError } from '../config/settings.js';
import { startGateway, StartupError } from '../runner.js';
import { DEMO_PASSWORD, DEMO_USERNAME } from './bodies.js';
import { startSandboxBridge } from './bridge.js';

/**
 * `npm run sandbox`: the gateway on :8080 with two sandbox bridges, in-memory counters and a
 * key issued for this run; prints curl commands that work as pasted.
 */

const eqt = await startSandboxBridge('eqt');
const fno = await startSandboxBridge('fno');
// An empty ADMIN_TOKEN is no token (the admin API would answer 403): the sandbox makes one, as when unset.
const adminToken = process.env.ADMIN_TOKEN || randomBytes(18).toString('base64url');

const env: NodeJS.ProcessEnv = {
  ...process.env,
  EQT_BRIDGE_URL: eqt.url,
  FNO_BRIDGE_URL: fno.url,
  HOST: process.env.HOST ?? '127.0.0.1',
  ADMIN_TOKEN: adminToken,
  API_KEY_MODE: 'registered',
  LOG_LEVEL: process.env.LOG_LEVEL ?? 'warn',
  WORKERS: '1',
};
// In-memory counters: the sandbox needs nothing else running.
delete env.REDIS_URL;
delete env.REDIS_CLUSTER_NODES;

let gateway;
let settings;
try {
  settings = loadSettings({ env });
  gateway = await startGateway({ settings });
} catch (err) {
  if (err instanceof SettingsError || err instanceof StartupError) {
    process.stderr.write(`oapi-gateway sandbox: ${err.message}\n`);
    process.exit(1);
  }
  throw err;
}

const issued = await gateway.registry.create(`sandbox-${Date.now()}`, undefined);
if (!issued.created) throw new Error('could not issue the sandbox key');
const key = issued.key;
const base = gateway.publicUrl;
// The header the gateway reads the key from: API_KEY_HEADER, or config/gateway.yaml's, or X-API-Key.
const keyHeader = `-H '${settings.apiKeyHeader}: ${key}'`;
const login = (password: string): string =>
  `curl -i -X POST ${base}/oapi/auth/gen-secret-key/underlying ${keyHeader} -H 'Content-Type: application/json' -d '{"username":"${DEMO_USERNAME}","password":"${password}"}'`;

process.stdout.write(`
oapi-gateway sandbox
  gateway   ${base}   in-memory counters, limits from ${gateway.tables.displayName}
  bridges   eqt ${eqt.url}, fno ${fno.url}   (sandbox stand-ins)
  admin     ${gateway.adminUrl}   bearer token ${adminToken}
  API key   ${key}   (issued for this run, id ${issued.record.id})

Log in as the demo account (a token set comes back, with the usage headers):
  ${login(DEMO_PASSWORD)}

A wrong password gets the bridge's own error body, Vietnamese text intact:
  ${login('wrong')}

Call another endpoint, then see the key's usage:
  curl -i ${base}/orders/42 ${keyHeader}
  curl -s ${gateway.adminUrl}/admin/usage/${key} -H 'Authorization: Bearer ${adminToken}'

Ctrl-C stops it.
`);

const shutdown = (): void => {
  void gateway
    .stop()
    .then(() => Promise.all([eqt.close(), fno.close()]))
    .then(() => process.exit(0));
};
process.once('SIGINT', shutdown);
process.once('SIGTERM', shutdown);
