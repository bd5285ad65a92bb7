import { afterAll, beforeAll, expect, it } from 'vitest';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';
import { refusingPort } from '../helpers/redis.js';

/**
 * No password, token, raw API key or request body ever reaches the log — also not in error
 * lines. Secrets are sent through every path a request can take, at the most verbose log
 * level, and the whole log is searched for them.
 */

const SECRETS = {
  apiKey: 'api-key-SECRET-a1b2c3',
  wrongKey: 'wrong-key-SECRET-d4e5',
  password: 'hunter2-SECRET-pw',
  badJsonPassword: 'broken-SECRET-pw',
  accessToken: 'access-token-SECRET-f6g7',
  otp: 'otp-SECRET-h8i9',
  adminKey: 'admin-path-key-SECRET-j0',
  queryToken: 'query-SECRET-k1',
  wsKey: 'ws-query-key-SECRET-l2',
};

let gw: TestGateway;
let broken: TestGateway;
let strict: TestGateway;

beforeAll(async () => {
  gw = await startTestGateway({ env: { LOG_LEVEL: 'trace' } });
  broken = await startTestGateway({
    env: { LOG_LEVEL: 'trace', EQT_BRIDGE_URL: `http://127.0.0.1:${await refusingPort()}` },
  });
  strict = await startTestGateway({ env: { LOG_LEVEL: 'trace', API_KEY_MODE: 'registered' } });
});
afterAll(async () => {
  await Promise.all([gw.stop(), broken.stop(), strict.stop()]);
});

it('holds no secret after traffic through every path, errors included', async () => {
  const json = { 'Content-Type': 'application/json' };
  const bridgeCredentials = { Authorization: `Bearer ${SECRETS.accessToken}`, 'x-otp-token': SECRETS.otp };
  for (const target of [gw, broken, strict]) {
    const key = { 'X-API-Key': SECRETS.apiKey };
    await send(target.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/underlying',
      headers: { ...key, ...json },
      body: JSON.stringify({ username: 'demo', password: SECRETS.password }),
    });
    await send(target.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/derivative',
      headers: { ...key, ...json },
      body: `{"username":"demo","password":"${SECRETS.badJsonPassword}"`,
    });
    await send(target.url, {
      method: 'POST',
      path: '/oapi/auth/gen-secret-key/underlying',
      headers: { ...key, 'Content-Type': 'text/plain' },
      body: SECRETS.password,
    });
    await send(target.url, {
      path: `/orders/1?token=${SECRETS.queryToken}`,
      headers: { ...key, ...bridgeCredentials },
    });
    await send(target.url, {
      method: 'POST',
      path: '/orders',
      headers: { ...key, ...json, ...bridgeCredentials },
      body: JSON.stringify({ note: SECRETS.password }),
    });
    await send(target.url, { path: '/orders/1', headers: { 'X-API-Key': SECRETS.wrongKey, ...bridgeCredentials } });
    await send(target.url, { path: `/ws/orders?api_key=${SECRETS.wsKey}`, headers: key });
    await send(target.adminUrl, { path: `/admin/usage/${SECRETS.adminKey}`, headers: authHeader() });
    await send(target.adminUrl, { method: 'DELETE', path: `/admin/usage/${SECRETS.adminKey}`, headers: authHeader() });
    await send(target.adminUrl, { path: '/admin/limits', headers: { Authorization: `Bearer ${SECRETS.accessToken}` } });
  }
  await new Promise((r) => setTimeout(r, 50));

  const log = [gw, broken, strict].map((t) => t.logText()).join('\n');
  // The traffic really produced request lines and error lines.
  expect(gw.logs.filter((l) => l.msg === 'request').length).toBeGreaterThanOrEqual(7);
  expect(broken.logs.some((l) => l.msg === 'bridge error')).toBe(true);
  expect(strict.logs.some((l) => l.msg === 'request' && l.status === 401)).toBe(true);
  for (const [name, secret] of Object.entries(SECRETS)) {
    expect(log.includes(secret), `${name} found in the log`).toBe(false);
  }
  expect(log).not.toContain('"password"');
  expect(log.toLowerCase()).not.toContain('authorization');
});
