import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxBridge } from '../../src/sandbox/bridge.js';
import {
  authHeader,
  startGatewayPair,
  startTestGateway,
  type GatewayPair,
  type TestGateway,
} from '../helpers/gateway.js';
import { sleep, waitFor, waitReady } from '../helpers/faults.js';
import { expectTwoFields, send } from '../helpers/http.js';
import {
  connectedClient,
  redisClient,
  startRedisServer,
  startRedisWithUser,
  uniquePrefix,
  type RedisProcess,
} from '../helpers/redis.js';
import { startRedisProxy } from '../helpers/redis-proxy.js';
import { InvalidKeyGuard } from '../../src/keys/guard.js';

/** API keys and plans (README "API keys and plans") over real sockets. */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 4, per_day: 10 }
  - { name: Latest Quote, route: "GET /marketdata/quote/{symbol}", per_hour: 3, per_day: 6 }
plans:
  premium: { scale: 5 }
  market-maker:
    rows:
      GET /marketdata/quote/{symbol}: { per_hour: 100, per_day: 200 }
`;

const sha = (key: string): string => createHash('sha256').update(key).digest('hex');
const FILE_KEY = 'file-key-for-tests-0123456789';
const FILE_PREMIUM_KEY = 'file-premium-key-0123456789';
const keyFile = (extra = ''): string => `keys:
  - id: file-basic
    sha256: ${sha(FILE_KEY)}
  - id: file-premium
    sha256: ${sha(FILE_PREMIUM_KEY)}
    plan: premium
${extra}`;

/** A directory of its own (`oapi-keys-<name>-…`) holding `api-keys.yaml` with `content`. */
function keyFileIn(name: string, content: string): { dir: string; keysPath: string } {
  const dir = mkdtempSync(join(tmpdir(), `oapi-keys-${name}-`));
  const keysPath = join(dir, 'api-keys.yaml');
  writeFileSync(keysPath, content);
  return { dir, keysPath };
}

const call = (gw: TestGateway, key: string | undefined, path = '/orders/1', headers: Record<string, string> = {}) =>
  send(gw.url, { path, headers: key === undefined ? headers : { 'X-API-Key': key, ...headers } });
const issue = async (gw: TestGateway, id: string, plan?: string) => {
  const reply = await send(gw.adminUrl, {
    method: 'POST',
    path: '/admin/keys',
    headers: { ...authHeader(), 'Content-Type': 'application/json' },
    body: JSON.stringify({ id, ...(plan ? { plan } : {}) }),
  });
  return reply;
};

describe('registered keys, shared by two instances', () => {
  let pair: GatewayPair;
  let eqt: SandboxBridge;
  let a: TestGateway;
  let b: TestGateway;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-keys-'));
    writeFileSync(join(dir, 'api-keys.yaml'), keyFile());
    // Many deliberate 401s come from one address here; the guard has a test of its own below.
    const env = {
      API_KEY_MODE: 'registered',
      API_KEYS_FILE: join(dir, 'api-keys.yaml'),
      INVALID_KEY_MAX_ATTEMPTS: '10000',
    };
    pair = await startGatewayPair({ limits: LIMITS, env, dir, label: 'keys' });
    ({ a, b, eqt } = pair);
  });
  afterAll(async () => {
    await pair.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('refuses a key that was never issued with the 401 of README "API keys and plans", before counting or forwarding', async () => {
    const before = eqt.requests.length;
    const reply = await call(a, 'made-up-key');
    expect(reply.status).toBe(401);
    expect(reply.text).toBe('{"error":"Unauthorized","message":"Invalid API key"}');
    expect(reply.headers['x-ratelimit-limit-hour']).toBeUndefined();
    expect(eqt.requests.length).toBe(before);
    // A made-up string is no key: no usage of zeros for it.
    const usage = await send(a.adminUrl, { path: '/admin/usage/made-up-key', headers: authHeader() });
    expect(usage.status).toBe(404);
    expect(expectTwoFields(usage)).toEqual({ error: 'Not Found', message: 'No issued key is this key' });
  });

  it('admits the keys of the key file, with their plans', async () => {
    const basic = await call(a, FILE_KEY);
    expect(basic.status).toBe(200);
    expect(basic.headers['x-ratelimit-limit-hour']).toBe('4');
    const premium = await call(b, FILE_PREMIUM_KEY);
    expect(premium.status).toBe(200);
    expect(premium.headers['x-ratelimit-limit-hour']).toBe('20');
    expect(premium.headers['x-ratelimit-limit-day']).toBe('50');
    expect(premium.headers['ratelimit-policy']).toBe('"hour";q=20;w=3600, "day";q=50;w=86400');
  });

  it('issues a key through the admin API, shown once, usable on every instance at once', async () => {
    const reply = await issue(a, 'acme-prod', 'market-maker');
    expect(reply.status).toBe(201);
    const body = reply.json<{ id: string; key: string; plan: string }>();
    expect(body.id).toBe('acme-prod');
    expect(body.plan).toBe('market-maker');
    expect(body.key).toMatch(/^oapi_[A-Za-z0-9_-]{43}$/);
    const onB = await call(b, body.key, '/marketdata/quote/VNM');
    expect(onB.status).toBe(200);
    expect(onB.headers['x-ratelimit-limit-hour']).toBe('100');
    expect((await call(b, body.key, '/orders/1')).headers['x-ratelimit-limit-hour']).toBe('4');
    // Only a hash is kept, in Redis.
    const redis = redisClient();
    const stored = await redis.hget(`${a.prefix}{keys}`, 'acme-prod');
    expect(await redis.hget(`${a.prefix}{keys}:by-hash`, sha(body.key))).toBe('acme-prod');
    redis.disconnect();
    expect(stored).not.toContain(body.key);
    expect((JSON.parse(stored ?? '{}') as { sha256?: string }).sha256).toBe(sha(body.key));
    expect(a.logText() + b.logText()).not.toContain(body.key);
  });

  it('refuses a taken id, a bad id and an unknown plan', async () => {
    expect((await issue(a, 'file-basic')).status).toBe(409);
    expect((await issue(a, 'acme-prod')).status).toBe(409);
    const bad = await issue(a, 'no spaces please');
    expect(bad.status).toBe(400);
    expectTwoFields(bad);
    const plan = await issue(a, 'new-one', 'platinum');
    expect(plan.status).toBe(400);
    expect(expectTwoFields(plan).message).toBe('Unknown plan; plans of the table: premium, market-maker');
  });

  it('lists ids, plans and sources, never a key or a hash', async () => {
    const reply = await send(a.adminUrl, { path: '/admin/keys', headers: authHeader() });
    expect(reply.status).toBe(200);
    const { keys } = reply.json<{ keys: Array<Record<string, unknown>> }>();
    expect(keys.find((k) => k.id === 'file-premium')).toEqual({
      id: 'file-premium',
      plan: 'premium',
      source: 'key-file',
    });
    expect(keys.find((k) => k.id === 'acme-prod')).toMatchObject({
      id: 'acme-prod',
      plan: 'market-maker',
      source: 'admin-api',
    });
    expect(reply.text).not.toContain(sha(FILE_KEY));
    expect(reply.text).not.toContain('oapi_');
  });

  it('revokes at once on every instance: the next request on the other one gets 401', async () => {
    const { key } = (await issue(a, `short-lived-${Date.now()}`)).json<{ key: string; id: string }>();
    const id = (await send(a.adminUrl, { path: '/admin/keys', headers: authHeader() }))
      .json<{ keys: Array<{ id: string }> }>()
      .keys.find((k) => k.id.startsWith('short-lived-'))!.id;
    expect((await call(b, key)).status).toBe(200);
    const revokedAt = Date.now();
    expect(
      (await send(a.adminUrl, { method: 'DELETE', path: `/admin/keys/${id}`, headers: authHeader() })).status,
    ).toBe(204);
    // Until the revocation lands, the key is valid (200, or 429 once the row is spent).
    let status = 200;
    while (status !== 401 && Date.now() - revokedAt < 2000) {
      status = (await call(b, key)).status;
      if (status !== 401) await new Promise((r) => setTimeout(r, 10));
    }
    expect(status).toBe(401);
    expect(Date.now() - revokedAt).toBeLessThan(1000);
    expect(
      (await send(a.adminUrl, { method: 'DELETE', path: `/admin/keys/${id}`, headers: authHeader() })).status,
    ).toBe(404);
    expect(
      (await send(a.adminUrl, { method: 'DELETE', path: '/admin/keys/file-basic', headers: authHeader() })).status,
    ).toBe(409);
  });

  it('notices a revocation within a second even when the announcement is lost', async () => {
    const { key } = (await issue(a, 'silent-revoke')).json<{ key: string }>();
    expect((await call(b, key)).status).toBe(200);
    // Remove the key the way another instance would, but without publishing the change.
    const redis = redisClient();
    const stored = JSON.parse((await redis.hget(`${a.prefix}{keys}`, 'silent-revoke')) ?? '{}') as { sha256: string };
    await redis
      .multi()
      .hdel(`${a.prefix}{keys}`, 'silent-revoke')
      .hdel(`${a.prefix}{keys}:by-hash`, stored.sha256)
      .incr(`${a.prefix}{keys}:version`)
      .exec();
    redis.disconnect();
    const removedAt = Date.now();
    let status = 200;
    while (status !== 401 && Date.now() - removedAt < 2000) {
      status = (await call(b, key)).status;
      if (status !== 401) await new Promise((r) => setTimeout(r, 20));
    }
    expect(status).toBe(401);
    expect(Date.now() - removedAt).toBeLessThan(1000);
  });

  it('shows the plan numbers in /admin/usage and refuses at the plan limit', async () => {
    const usedBefore = (
      await send(a.adminUrl, { path: `/admin/usage/${FILE_PREMIUM_KEY}`, headers: authHeader() })
    ).json<{ endpoints: Array<{ hour: { used: number } }> }>().endpoints[0]!.hour.used;
    for (let i = usedBefore; i < 20; i++) expect((await call(a, FILE_PREMIUM_KEY, `/orders/${i}`)).status).toBe(200);
    const refused = await call(a, FILE_PREMIUM_KEY, '/orders/x');
    expect(refused.status).toBe(429);
    expect(refused.headers['x-ratelimit-limit-hour']).toBe('20');
    const usage = await send(a.adminUrl, { path: `/admin/usage/${FILE_PREMIUM_KEY}`, headers: authHeader() });
    expect(usage.json<{ endpoints: Array<{ hour: unknown; day: unknown }> }>().endpoints[0]).toMatchObject({
      hour: { limit: 20, used: 20, remaining: 0 },
      day: { limit: 50 },
    });
  });

  it('reports and resets usage by key id, on every instance, as /admin/usage/{apiKey} does', async () => {
    const { key } = (await issue(a, 'support-client')).json<{ key: string }>();
    for (let i = 0; i < 3; i++) expect((await call(b, key)).status).toBe(200);
    const byId = await send(a.adminUrl, { path: '/admin/keys/support-client/usage', headers: authHeader() });
    const byKey = await send(a.adminUrl, { path: `/admin/usage/${key}`, headers: authHeader() });
    expect(byId.status).toBe(200);
    type Usage = { endpoints: Array<{ route: string; hour: { used: number; limit: number }; day: { used: number } }> };
    const used = (u: Usage) => u.endpoints.map((e) => [e.route, e.hour.used, e.hour.limit, e.day.used]);
    expect(used(byId.json<Usage>())).toEqual(used(byKey.json<Usage>()));
    expect(used(byId.json<Usage>())[0]).toEqual(['GET /orders/{id}', 3, 4, 3]);

    const reset = await send(a.adminUrl, {
      method: 'DELETE',
      path: '/admin/keys/support-client/usage',
      headers: authHeader(),
    });
    expect(reset.status).toBe(204);
    const afterReset = await send(b.adminUrl, { path: '/admin/keys/support-client/usage', headers: authHeader() });
    expect(used(afterReset.json<Usage>())[0]).toEqual(['GET /orders/{id}', 0, 4, 0]);
    expect((await call(b, key)).headers['x-ratelimit-remaining-hour']).toBe('3');

    // Keys of the key file have ids too.
    const fileKey = await send(b.adminUrl, { path: '/admin/keys/file-basic/usage', headers: authHeader() });
    expect(fileKey.status).toBe(200);
    for (const method of ['GET', 'DELETE']) {
      const unknown = await send(a.adminUrl, { method, path: '/admin/keys/nobody/usage', headers: authHeader() });
      expect(unknown.status).toBe(404);
      expect(expectTwoFields(unknown)).toEqual({ error: 'Not Found', message: 'No key with id "nobody"' });
    }
  });

  it('reloads the key file on change, refusing a bad one and keeping the keys in force', async () => {
    const added = 'added-later-key-0123456789';
    const loadedLines = () => a.logs.filter((l) => l.msg === 'key file loaded').length;
    const loadedBefore = loadedLines();
    writeFileSync(join(dir, 'api-keys.yaml'), keyFile(`  - id: added-later\n    sha256: ${sha(added)}\n`));
    let status = 401;
    const deadline = Date.now() + 5000;
    while (status !== 200 && Date.now() < deadline) {
      status = (await call(a, added)).status;
      if (status !== 200) await new Promise((r) => setTimeout(r, 50));
    }
    expect(status).toBe(200);
    // The watcher may see one write twice: it is loaded and logged once (regression: "key file loaded" twice).
    await new Promise((r) => setTimeout(r, 800));
    expect(loadedLines()).toBe(loadedBefore + 1);
    const refusals = () => a.logs.filter((l) => l.msg === 'key file refused; the keys in force stay').length;
    const refusedBefore = refusals();
    writeFileSync(join(dir, 'api-keys.yaml'), 'keys:\n  - id: broken\n    sha256: not-a-hash\n');
    await waitFor('the bad key file refused', () => refusals() === refusedBefore + 1, 5000);
    expect((await call(a, added)).status).toBe(200);
    // Known still: its answer is its row's (429 once the test file has spent its hour), not 401 or 503.
    expect([200, 429]).toContain((await call(a, FILE_KEY)).status);
    writeFileSync(join(dir, 'api-keys.yaml'), keyFile());
  });
});

describe('a key pasted into the key file in place of its hash', () => {
  it('is refused without the key reaching the log (regression: the refusal quoted the value, the key itself)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-keys-pasted-'));
    const file = join(dir, 'api-keys.yaml');
    writeFileSync(file, keyFile());
    const gw = await startTestGateway({ limits: LIMITS, env: { API_KEY_MODE: 'registered', API_KEYS_FILE: file } });
    try {
      const pasted = 'oapi_' + 'Zq3'.repeat(14) + 'x';
      writeFileSync(file, keyFile(`  - id: pasted\n    sha256: ${pasted}\n`));
      const deadline = Date.now() + 5000;
      while (!gw.logs.some((l) => l.msg === 'key file refused; the keys in force stay') && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 50));
      const refusal = gw.logs.find((l) => l.msg === 'key file refused; the keys in force stay');
      expect(JSON.stringify(refusal)).toContain('sha256 must be 64 hex digits');
      expect(gw.logText()).not.toContain(pasted);
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the default key file', () => {
  it('is picked up when it is written after start, and its keys go when it is removed (regression: a file missing at start was never watched)', async () => {
    const gw = await startTestGateway({ limits: LIMITS, env: { API_KEY_MODE: 'registered' } });
    const untilStatus = async (key: string, status: number): Promise<number> => {
      const deadline = Date.now() + 5000;
      let got = (await call(gw, key)).status;
      while (got !== status && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
        got = (await call(gw, key)).status;
      }
      return got;
    };
    try {
      expect(gw.logs.some((l) => l.msg === 'no key file; only keys issued through the admin API pass')).toBe(true);
      expect((await call(gw, FILE_KEY)).status).toBe(401);
      mkdirSync(join(gw.dir, 'config'));
      writeFileSync(join(gw.dir, 'config', 'api-keys.yaml'), keyFile());
      expect(await untilStatus(FILE_KEY, 200)).toBe(200);
      rmSync(join(gw.dir, 'config', 'api-keys.yaml'));
      expect(await untilStatus(FILE_KEY, 401)).toBe(401);
    } finally {
      await gw.stop();
    }
  });
});

describe('the key file and the plans of the table in force', () => {
  const GOLD_KEY = 'gold-plan-key-0123456789';
  const goldFile = `keys:\n  - id: gold-client\n    sha256: ${sha(GOLD_KEY)}\n    plan: gold\n`;
  let gw: TestGateway;
  let dir: string;
  let keysPath: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-keys-plans-'));
    keysPath = join(dir, 'api-keys.yaml');
    writeFileSync(keysPath, 'keys: []\n');
    // Its deliberate 401s are no guesses to block.
    const env = { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath, INVALID_KEY_MAX_ATTEMPTS: '10000' };
    gw = await startTestGateway({ limits: LIMITS, dir, env });
  });
  afterAll(async () => {
    await gw.stop();
    rmSync(dir, { recursive: true, force: true });
  });
  const until = async (done: () => boolean | Promise<boolean>, ms: number): Promise<void> => {
    const deadline = Date.now() + ms;
    while (!(await done()) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  };

  it('reads a key file refused for an unknown plan again when a new table brings the plan (regression: 401 until the key file changed again)', async () => {
    const refusedGold = () =>
      gw.logs.some((l) => l.msg === 'key file refused; the keys in force stay' && String(l.errors).includes('"gold"'));
    writeFileSync(keysPath, goldFile);
    await until(refusedGold, 5000);
    expect(refusedGold()).toBe(true);
    expect((await call(gw, GOLD_KEY)).status).toBe(401);

    // A second later, so the key file's own watcher has long been quiet: only the new table can bring the key in.
    await new Promise((r) => setTimeout(r, 1000));
    writeFileSync(gw.limitsPath, `${LIMITS}  gold: { scale: 2 }\n`);
    await until(() => gw.logs.some((l) => l.msg === 'limit table loaded' && l.trigger === 'file'), 5000);
    let reply = await call(gw, GOLD_KEY);
    const deadline = Date.now() + 3000;
    while (reply.status !== 200 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      reply = await call(gw, GOLD_KEY);
    }
    expect(reply.status).toBe(200);
    expect(reply.headers['x-ratelimit-limit-hour']).toBe('8');
  });

  it('reads the key file on SIGHUP also when the table is refused (regression: the refused table skipped it)', async () => {
    writeFileSync(gw.limitsPath, 'limits: [\n');
    // The key file's watcher waits 150 ms after a write: a key known sooner came with the signal.
    // A reload slower than that (a loaded machine) tells nothing, and is tried again with a new key.
    let told = false;
    for (let attempt = 0; attempt < 3 && !told; attempt++) {
      const later = `sighup-key-${attempt}-0123456789`;
      writeFileSync(keysPath, `${goldFile}  - id: sighup-client-${attempt}\n    sha256: ${sha(later)}\n`);
      const writtenAt = Date.now();
      const result = await gw.gateway.reload('signal');
      const known = gw.gateway.registry.lookup(sha(later))?.id;
      if (Date.now() - writtenAt >= 150) continue;
      told = true;
      expect(result.ok).toBe(false);
      expect(known).toBe(`sighup-client-${attempt}`);
    }
    expect(told, 'three reloads each slower than the watcher: the machine is too slow to tell').toBe(true);
    expect((await call(gw, GOLD_KEY)).headers['x-ratelimit-limit-hour']).toBe('8');
  });

  it('reads the key file once for a SIGHUP whose new table changes the plans (regression: twice, its refusal logged twice)', async () => {
    const refusals = () =>
      gw.logs.filter(
        (l) => l.msg === 'key file refused; the keys in force stay' && String(l.errors).includes('"platinum"'),
      ).length;
    writeFileSync(
      keysPath,
      `${goldFile}  - id: platinum-client\n    sha256: ${sha('platinum-key-0123456789')}\n    plan: platinum\n`,
    );
    await until(() => refusals() > 0, 5000);
    await new Promise((r) => setTimeout(r, 600)); // the key file's watcher may see its write twice: let it be quiet
    // The table's watcher waits 150 ms after a write: a reload that does not find the table new
    // itself (a loaded machine) tells nothing, and is tried again with another plan.
    let told = false;
    for (let attempt = 0; attempt < 3 && !told; attempt++) {
      writeFileSync(gw.limitsPath, `${LIMITS}  gold: { scale: 2 }\n  silver-${attempt}: { scale: 3 }\n`);
      const before = refusals();
      const result = await gw.gateway.reload('signal');
      if (!result.ok || !result.changed) continue;
      told = true;
      await new Promise((r) => setTimeout(r, 400)); // a second read, were there one, would be logged by now
      expect(refusals() - before).toBe(1);
    }
    expect(told, 'three reloads each slower than the watcher: the machine is too slow to tell').toBe(true);
  });
});

describe("a key file that changes a key's plan and back", () => {
  it('answers the refused key with its usage, not the one it had when it was last refused (regression: units used under the other plan were missing from its headers)', async () => {
    const KEY = 'replanned-key-0123456789';
    const withPlan = (plan?: string) =>
      `keys:\n  - id: replanned\n    sha256: ${sha(KEY)}\n${plan ? `    plan: ${plan}\n` : ''}`;
    const { dir, keysPath } = keyFileIn('replan', withPlan());
    const gw = await startTestGateway({
      limits: LIMITS,
      dir,
      env: { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath },
    });
    const planIs = (plan: string | undefined) => () => gw.gateway.registry.lookup(sha(KEY))?.plan === plan;
    try {
      for (let i = 0; i < 4; i++) expect((await call(gw, KEY)).status).toBe(200);
      expect((await call(gw, KEY)).status).toBe(429); // the hour spent: 4 of 4, 4 of 10 today
      writeFileSync(keysPath, withPlan('premium'));
      await waitFor('the premium plan', planIs('premium'), 5000);
      for (let i = 0; i < 2; i++) expect((await call(gw, KEY)).status).toBe(200); // 6 used under premium's 20
      writeFileSync(keysPath, withPlan());
      await waitFor('no plan', planIs(undefined), 5000);
      const refused = await call(gw, KEY);
      expect(refused.status).toBe(429);
      expect(refused.headers['x-ratelimit-remaining-day']).toBe('4');
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a key file refused', () => {
  it('is told once per content when the watcher reads it again, and again on SIGHUP (regression: its event and its poll logged it twice)', async () => {
    const { dir, keysPath } = keyFileIn('refused', 'keys: []\n');
    const gw = await startTestGateway({
      limits: LIMITS,
      dir,
      env: { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath },
    });
    const refusals = () => gw.logs.filter((l) => l.msg === 'key file refused; the keys in force stay').length;
    const settle = () => new Promise((r) => setTimeout(r, 600)); // past the watch's debounce and its 200 ms poll
    try {
      await settle();
      writeFileSync(keysPath, 'keys:\n  - id: x\n    sha256: nope\n');
      await settle();
      expect(refusals()).toBe(1);
      // The same content seen again (its event and its poll both fire for a touched file): nothing new to say.
      const later = new Date(Date.now() + 5000);
      utimesSync(keysPath, later, later);
      await settle();
      expect(refusals()).toBe(1);
      // Asked for, it is told again.
      await gw.gateway.reload('signal');
      expect(refusals()).toBe(2);
      // Another refusal is told.
      writeFileSync(keysPath, 'keys:\n  - id: y\n    sha256: nope\n');
      await settle();
      expect(refusals()).toBe(3);
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a key file the watcher reads half written', () => {
  it('is read again and loaded, not refused (regression: a spurious "key file refused" for an edit in progress)', async () => {
    const { dir, keysPath } = keyFileIn('half', 'keys: []\n');
    const gw = await startTestGateway({
      limits: LIMITS,
      dir,
      env: { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath },
    });
    const said = (msg: string) => gw.logs.filter((l) => l.msg === msg).length;
    try {
      await new Promise((r) => setTimeout(r, 600)); // past the watch's look as it starts
      const loadedBefore = said('key file loaded');
      const whole = keyFile();
      // An editor's write in two parts: the first ends inside a sha256 (a refusal, read alone).
      writeFileSync(keysPath, whole.slice(0, whole.indexOf(sha(FILE_KEY)) + 10));
      await new Promise((r) => setTimeout(r, 200)); // the watch reads it 150 ms after its event
      writeFileSync(keysPath, whole);
      await waitFor('the key file loaded', () => said('key file loaded') > loadedBefore, 3000);
      expect(said('key file refused; the keys in force stay')).toBe(0);
      expect((await call(gw, FILE_KEY)).status).toBe(200);
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('a key file entry with the id of a key issued through the admin API', () => {
  it('is refused with its line, and the issued key stays revocable at once (regression: it loaded, and DELETE answered 409)', async () => {
    const { dir, keysPath } = keyFileIn('taken', keyFile());
    const env = { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath, INVALID_KEY_MAX_ATTEMPTS: '10000' };
    const gw = await startTestGateway({ limits: LIMITS, dir, env });
    try {
      const { key } = (await issue(gw, 'acme')).json<{ key: string }>();
      const other = 'file-acme-key-0123456789';
      writeFileSync(keysPath, keyFile(`  - id: acme\n    sha256: ${sha(other)}\n`));
      const refused = () => gw.logs.find((l) => l.msg === 'key file refused; the keys in force stay');
      const deadline = Date.now() + 5000;
      while (!refused() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(refused()?.errors).toEqual([
        `${keysPath}:7:9: row 3 (acme): id "acme" is taken by a key issued through the admin API`,
      ]);
      expect((await call(gw, other)).status).toBe(401);
      const { keys } = (await send(gw.adminUrl, { path: '/admin/keys', headers: authHeader() })).json<{
        keys: Array<{ id: string; source: string }>;
      }>();
      expect(keys.filter((k) => k.id === 'acme')).toEqual([expect.objectContaining({ source: 'admin-api' })]);
      expect((await call(gw, key)).status).toBe(200);
      // An instance started on that file refuses it as it refuses any bad key file.
      const second = await startTestGateway({ limits: LIMITS, dir, env, prefix: gw.prefix, bridges: gw }).then(
        async (started) => {
          await started.stop();
          return 'started';
        },
        (err: Error) => err.message,
      );
      expect(second).toContain('row 3 (acme): id "acme" is taken by a key issued through the admin API');
      const revoked = await send(gw.adminUrl, { method: 'DELETE', path: '/admin/keys/acme', headers: authHeader() });
      expect(revoked.status).toBe(204);
      expect((await call(gw, key)).status).toBe(401);
    } finally {
      await gw.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('regression: a key file refused for the id of an issued key stayed refused once that key was revoked', () => {
  it('is read again when the issued key is revoked, on every instance, and its entry passes', async () => {
    const { dir, keysPath } = keyFileIn('freed', keyFile());
    const env = { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath, INVALID_KEY_MAX_ATTEMPTS: '10000' };
    const pair = await startGatewayPair({ limits: LIMITS, dir, env, label: 'keys-freed' });
    const { a, b } = pair;
    try {
      expect((await issue(a, 'moving')).status).toBe(201);
      // The client moves to a key of the key file under the same id: the file is refused while the issued key lives.
      const fileKey = 'file-moving-key-0123456789';
      writeFileSync(keysPath, keyFile(`  - id: moving\n    sha256: ${sha(fileKey)}\n`));
      const refused = (gw: TestGateway) => gw.logs.some((l) => l.msg === 'key file refused; the keys in force stay');
      await waitFor('both instances to refuse the key file', () => refused(a) && refused(b), 5000);
      // Past the watch's polls, which may read the write once more.
      await new Promise((r) => setTimeout(r, 1000));
      expect((await call(b, fileKey)).status).toBe(401);
      const revoked = await send(a.adminUrl, { method: 'DELETE', path: '/admin/keys/moving', headers: authHeader() });
      expect(revoked.status).toBe(204);
      // Nothing else touches the file: the revocation alone lets it in, on both instances.
      for (const gw of [a, b]) {
        let status = 401;
        const deadline = Date.now() + 3000;
        while (status !== 200 && Date.now() < deadline) {
          status = (await call(gw, fileKey)).status;
          if (status !== 200) await new Promise((r) => setTimeout(r, 50));
        }
        expect(status).toBe(200);
      }
    } finally {
      await pair.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('regression: an issued id read after the key file, that an entry of the file takes, was not told until the file changed', () => {
  it('has the instance read its key file again and log the refusal with the entry, once', async () => {
    const { dir, keysPath } = keyFileIn(
      'later',
      keyFile(`  - id: shared-id\n    sha256: ${sha('file-shared-key-0123456789')}\n`),
    );
    const env = { API_KEY_MODE: 'registered', API_KEYS_FILE: keysPath, INVALID_KEY_MAX_ATTEMPTS: '10000' };
    const first = await startTestGateway({ limits: LIMITS, dir, env });
    // Another instance, whose key file has no such entry, issues the id.
    const otherDir = mkdtempSync(join(tmpdir(), 'oapi-keys-other-'));
    const other = await startTestGateway({
      limits: LIMITS,
      dir: otherDir,
      env: { API_KEY_MODE: 'registered' },
      prefix: first.prefix,
      bridges: first,
    });
    const refusals = () => first.logs.filter((l) => l.msg === 'key file refused; the keys in force stay');
    try {
      // Past the key-file watch's first look and its polls: nothing but the issued key can make it read the file again.
      await new Promise((r) => setTimeout(r, 600));
      expect(refusals()).toEqual([]);
      expect((await issue(other, 'shared-id')).status).toBe(201);
      const deadline = Date.now() + 5000;
      while (refusals().length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      expect(refusals().map((l) => l.errors)).toEqual([
        [`${keysPath}:7:9: row 3 (shared-id): id "shared-id" is taken by a key issued through the admin API`],
      ]);
      // Told once: the next reloads of the issued keys (another key issued) find the same id.
      expect((await issue(other, 'another-id')).status).toBe(201);
      await new Promise((r) => setTimeout(r, 1200));
      expect(refusals()).toHaveLength(1);
    } finally {
      await other.stop();
      await first.stop();
      rmSync(dir, { recursive: true, force: true });
      rmSync(otherDir, { recursive: true, force: true });
    }
  });
});

describe('API_KEY_MODE=any', () => {
  it('lets every non-empty key be its own bucket, and still applies an issued key its plan', async () => {
    const gw = await startTestGateway({ limits: LIMITS, env: { API_KEY_MODE: 'any' } });
    try {
      expect((await call(gw, `anything-${Date.now()}`)).status).toBe(200);
      expect((await call(gw, '')).status).toBe(401);
      const { key } = (await issue(gw, 'planned', 'premium')).json<{ key: string }>();
      expect((await call(gw, key)).headers['x-ratelimit-limit-hour']).toBe('20');
    } finally {
      await gw.stop();
    }
  });
});

describe('keys without Redis', () => {
  it('are issued and revoked in the process', async () => {
    const gw = await startTestGateway({ limits: LIMITS, redis: false, env: { API_KEY_MODE: 'registered' } });
    try {
      const { key } = (await issue(gw, 'local')).json<{ key: string }>();
      expect((await call(gw, key)).status).toBe(200);
      expect(
        (await send(gw.adminUrl, { method: 'DELETE', path: '/admin/keys/local', headers: authHeader() })).status,
      ).toBe(204);
      expect((await call(gw, key)).status).toBe(401);
    } finally {
      await gw.stop();
    }
  });
});

describe('regression: POST /admin/keys read a body of any size whole (2 MB issued a key)', () => {
  it('refuses a body over 4 KiB with a two-field 413, with a length or chunked, and issues nothing', async () => {
    const gw = await startTestGateway({ limits: LIMITS, redis: false, env: { API_KEY_MODE: 'registered' } });
    try {
      const body = JSON.stringify({ id: 'padded', pad: 'a'.repeat(5000) });
      const framings: Array<Record<string, string>> = [{}, { 'Transfer-Encoding': 'chunked' }];
      for (const framing of framings) {
        const reply = await send(gw.adminUrl, {
          method: 'POST',
          path: '/admin/keys',
          headers: { ...authHeader(), 'Content-Type': 'application/json', ...framing },
          body,
        });
        expect(reply.status).toBe(413);
        expect(expectTwoFields(reply)).toEqual({
          error: 'Content Too Large',
          message: 'Request body is larger than 4096 bytes',
        });
      }
      const listed = await send(gw.adminUrl, { path: '/admin/keys', headers: authHeader() });
      expect(listed.json<{ keys: Array<{ id: string }> }>().keys.map((k) => k.id)).not.toContain('padded');
      // A body within the bound is still read, and a non-JSON one refused as before.
      expect((await issue(gw, 'small')).status).toBe(201);
      const notJson = await send(gw.adminUrl, {
        method: 'POST',
        path: '/admin/keys',
        headers: { ...authHeader(), 'Content-Type': 'application/json' },
        body: 'id=small-2',
      });
      expect(notJson.status).toBe(400);
      expectTwoFields(notJson);
    } finally {
      await gw.stop();
    }
  });
});

describe('a key change whose announcement fails', () => {
  it('still answers 201 with the key, and 204 to its revocation (regression: 503, the key issued and never shown)', async () => {
    const { redis, url, admin } = await startRedisWithUser('resetchannels');
    admin.disconnect();
    const gw = await startTestGateway({ limits: LIMITS, redis: url, env: { API_KEY_MODE: 'registered' } });
    try {
      const reply = await issue(gw, 'unannounced');
      expect(reply.status).toBe(201);
      const { key } = reply.json<{ key: string }>();
      expect((await call(gw, key)).status).toBe(200);
      const revoked = await send(gw.adminUrl, {
        method: 'DELETE',
        path: '/admin/keys/unannounced',
        headers: authHeader(),
      });
      expect(revoked.status).toBe(204);
      expect((await call(gw, key)).status).toBe(401);
      expect(gw.logText()).toContain('key change not announced');
    } finally {
      await gw.stop();
      await redis.stop();
    }
  });
});

describe('regression: usage by id on an instance that had not yet heard of a key issued on another answered 404', () => {
  it('asks Redis for an id it does not know: 200 with the plan numbers, and its reset 204', async () => {
    // No announcement reaches the other instance: it would know the key only at its next poll.
    const { redis, url, admin } = await startRedisWithUser('resetchannels');
    admin.disconnect();
    const a = await startTestGateway({ limits: LIMITS, redis: url, env: { API_KEY_MODE: 'registered' } });
    const b = await startTestGateway({
      limits: LIMITS,
      redis: url,
      prefix: a.prefix,
      bridges: { eqt: a.eqt, fno: a.fno },
      env: { API_KEY_MODE: 'registered' },
    });
    try {
      expect((await issue(a, 'fresh-elsewhere', 'premium')).status).toBe(201);
      const usage = await send(b.adminUrl, { path: '/admin/keys/fresh-elsewhere/usage', headers: authHeader() });
      expect(usage.status).toBe(200);
      const first = usage.json<{ endpoints: Array<{ hour: { limit: number } }> }>().endpoints[0];
      expect(first?.hour.limit).toBe(20);
      expect((await issue(a, 'fresh-elsewhere-2')).status).toBe(201);
      const reset = await send(b.adminUrl, {
        method: 'DELETE',
        path: '/admin/keys/fresh-elsewhere-2/usage',
        headers: authHeader(),
      });
      expect(reset.status).toBe(204);
      // An id no key has is still a 404.
      const unknown = await send(b.adminUrl, { path: '/admin/keys/never-issued/usage', headers: authHeader() });
      expect(unknown.status).toBe(404);
    } finally {
      await b.stop();
      await a.stop();
      await redis.stop();
    }
  });
});

describe('regression: an events channel the Redis user may not subscribe to went untold', () => {
  it('is logged as an error naming the channel', async () => {
    const { redis, url, admin } = await startRedisWithUser('resetchannels');
    admin.disconnect();
    const gw = await startTestGateway({
      limits: LIMITS,
      redis: url,
    });
    try {
      await waitFor('the refusal logged', () => gw.logs.some((l) => l.level === 'error'), 5000);
      expect(gw.logs.filter((l) => l.level === 'error')).toEqual([
        expect.objectContaining({
          channel: `${gw.prefix}events`,
          err: expect.stringMatching(/^NOPERM /) as unknown,
          msg: expect.stringMatching(/^redis refused the events channel: /) as unknown,
        }),
      ]);
    } finally {
      await gw.stop();
      await redis.stop();
    }
  });

  it('is not logged when the user has the channel', async () => {
    const { redis, url, admin } = await startRedisWithUser('allchannels');
    admin.disconnect();
    const gw = await startTestGateway({
      limits: LIMITS,
      redis: url,
    });
    const inspector = redisClient(redis.url);
    const subscribers = async () =>
      ((await inspector.call('PUBSUB', 'NUMSUB', `${gw.prefix}events`)) as [string, number])[1];
    try {
      await waitFor('the subscription', async () => (await subscribers()) === 1, 5000);
      expect(gw.logs.filter((l) => l.level === 'error')).toEqual([]);
    } finally {
      inspector.disconnect();
      await gw.stop();
      await redis.stop();
    }
  });

  it('regression: credentials Redis refuses are logged as an error naming REDIS_URL, once while they stay refused (they were at debug level only)', async () => {
    const { redis, url, admin } = await startRedisWithUser('allchannels', 'off');
    const gw = await startTestGateway({ limits: LIMITS, redis: url });
    const told = () =>
      gw.logs.filter(
        (l) =>
          l.level === 'error' &&
          l.msg ===
            'REDIS_URL: redis refused the credentials (WRONGPASS invalid username-password pair or user is disabled.); serving in failure mode until it takes them',
      ).length;
    try {
      await waitFor('the refusal logged', () => told() === 1, 5000);
      // Reconnects come at most 2 s apart (README "When Redis is away"): two or more are refused meanwhile.
      await sleep(4500);
      expect(told()).toBe(1);
      expect(gw.logText()).not.toContain('gateway-password');
      await admin.call('ACL', 'SETUSER', 'gateway', 'on');
      await waitReady(gw, 8000); // it took them, unasked
    } finally {
      admin.disconnect();
      await gw.stop();
      await redis.stop();
    }
  });

  it('regression: a user Redis does not take yet is no refusal of the channel, and the subscription follows once it is taken', async () => {
    // The queued SUBSCRIBE failed with the WRONGPASS of the connection: it was logged as a refused
    // channel ("give the redis user the channel"), and never sent again once the user was enabled.
    const { redis, url, admin } = await startRedisWithUser('allchannels', 'off');
    const gw = await startTestGateway({
      limits: LIMITS,
      redis: url,
    });
    const subscribers = async () =>
      ((await admin.call('PUBSUB', 'NUMSUB', `${gw.prefix}events`)) as [string, number])[1];
    try {
      await admin.call('ACL', 'SETUSER', 'gateway', 'on');
      await waitFor('the subscription', async () => (await subscribers()) === 1, 8000);
      expect(gw.logText()).not.toContain('redis refused the events channel');
    } finally {
      admin.disconnect();
      await gw.stop();
      await redis.stop();
    }
  });
});

describe('a client guessing keys', () => {
  let gw: TestGateway;
  let redis: RedisProcess;
  beforeAll(async () => {
    redis = await startRedisServer();
    gw = await startTestGateway({
      limits: LIMITS,
      redis: redis.url,
      env: {
        API_KEY_MODE: 'registered',
        INVALID_KEY_MAX_ATTEMPTS: '5',
        INVALID_KEY_WINDOW_SECONDS: '60',
        TRUST_PROXY_HOPS: '1',
      },
    });
  });
  afterAll(async () => {
    await gw.stop();
    await redis.stop();
  });

  it('is refused with 429 after the allowed attempts, while other addresses are served', async () => {
    const guesser = { 'X-Forwarded-For': '198.51.100.7' };
    const statuses: number[] = [];
    for (let i = 0; i < 8; i++) statuses.push((await call(gw, `guess-${i}`, '/orders/1', guesser)).status);
    expect(statuses).toEqual([401, 401, 401, 401, 401, 429, 429, 429]);
    const throttled = await call(gw, undefined, '/orders/1', guesser);
    expect(throttled.status).toBe(429);
    expect(throttled.text).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    expect(Number(throttled.headers['retry-after'])).toBeGreaterThan(50);
    expect(Number(throttled.headers['retry-after'])).toBeLessThanOrEqual(60);
    // A different client address is not affected.
    expect((await call(gw, 'guess-other', '/orders/1', { 'X-Forwarded-For': '198.51.100.8' })).status).toBe(401);
    const metrics = (await send(gw.adminUrl, { path: '/metrics' })).text;
    expect(metrics).toMatch(/^oapi_gateway_invalid_keys_total\{outcome="throttled"\} [1-9]\d*$/m);
  });

  it('costs no Redis round trip per request for a known key in the steady state', async () => {
    // A plan with room for every request: a spent key would be refused from memory, with no Redis call at all.
    const { key } = (await issue(gw, 'steady', 'market-maker')).json<{ key: string }>();
    await call(gw, key);
    const admin = redisClient(redis.url);
    await admin.config('RESETSTAT');
    const started = Date.now();
    for (let i = 0; i < 40; i++)
      expect(
        (await call(gw, key, `/marketdata/quote/S${i % 2}`, { 'X-Forwarded-For': '198.51.100.20' })).status,
      ).toBeLessThan(500);
    const elapsed = Date.now() - started;
    const stats = await admin.info('commandstats');
    admin.disconnect();
    const calls = (name: string): number => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
    expect(calls('evalsha') + calls('eval')).toBe(40);
    expect(calls('hgetall') + calls('hget')).toBe(0);
    // The only other traffic is the issued-keys version check, twice a second.
    expect(calls('get')).toBeLessThanOrEqual(Math.ceil(elapsed / 500) + 1);
  });

  it('counts and blocks an IPv6 client by its /64, listed and lifted as such (regression: each of its 2^64 addresses had attempts of its own)', async () => {
    const from = (address: string) => ({ 'X-Forwarded-For': address });
    const blocked = async () =>
      (await send(gw.adminUrl, { path: '/admin/blocks', headers: authHeader() })).json<{
        blocks: Array<{ address: string }>;
      }>().blocks;
    const guessFromFive = async () => {
      // A new address of the /64 for every guess, as a guesser with a /64 would.
      const statuses: number[] = [];
      for (let i = 1; i <= 6; i++)
        statuses.push((await call(gw, `v6-guess-${i}`, '/orders/1', from(`2001:db8:0:7::${i}`))).status);
      expect(statuses).toEqual([401, 401, 401, 401, 401, 429]);
    };
    await guessFromFive();
    // Any address of that /64 is refused, valid key or not, in any spelling; another /64 is not.
    const { key } = (await issue(gw, 'v6-client', 'market-maker')).json<{ key: string }>();
    const refused = await call(gw, key, '/marketdata/quote/VNM', from('2001:DB8:0:7:ffff:1:2:3'));
    expect(refused.status).toBe(429);
    expect(refused.text).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(50);
    expect((await call(gw, key, '/marketdata/quote/VNM', from('[2001:db8:0:8::1]:443'))).status).toBe(200);
    expect(
      gw.logs.find(
        (l) =>
          l.msg === 'address blocked for sending invalid API keys' &&
          l.seconds === 60 &&
          String(l.address).includes(':'),
      ),
    ).toMatchObject({ address: '2001:db8:0:7::/64' });
    expect((await blocked()).map((b) => b.address)).toContain('2001:db8:0:7::/64');

    // Lifted by the /64 as listed, its slash as it is or as %2F, or by any address in it.
    for (const written of ['2001:db8:0:7::/64', '2001:db8:0:7::%2F64', '2001:db8:0:7:0:0:0:abcd']) {
      const lifted = await send(gw.adminUrl, {
        method: 'DELETE',
        path: `/admin/blocks/${written}`,
        headers: authHeader(),
      });
      expect(lifted.status, written).toBe(204);
      expect((await blocked()).map((b) => b.address)).not.toContain('2001:db8:0:7::/64');
      expect((await call(gw, key, '/marketdata/quote/VNM', from('2001:db8:0:7::99'))).status).toBe(200);
      await guessFromFive();
    }
    const notBlocked = await send(gw.adminUrl, {
      method: 'DELETE',
      path: '/admin/blocks/2001:db8:0:9::1',
      headers: authHeader(),
    });
    expect(notBlocked.status).toBe(404);
    expect(expectTwoFields(notBlocked)).toEqual({
      error: 'Not Found',
      message: 'Address 2001:db8:0:9::/64 is not blocked',
    });

    // An IPv4 client is counted alone, in IPv4-mapped IPv6 spellings too.
    const statuses: number[] = [];
    for (const address of [
      '203.0.113.40',
      '::ffff:cb00:7128',
      '[::ffff:203.0.113.40]:1',
      '::ffff:203.0.113.40',
      '203.0.113.40',
      '203.0.113.40',
    ])
      statuses.push((await call(gw, 'v4-guess', '/orders/1', from(address))).status);
    expect(statuses).toEqual([401, 401, 401, 401, 401, 429]);
    expect((await call(gw, 'v4-guess', '/orders/1', from('203.0.113.41'))).status).toBe(401);
    expect((await blocked()).map((b) => b.address)).toContain('203.0.113.40');
  });
});

describe('a client guessing keys on one of two instances', () => {
  let pair: GatewayPair;
  let dir: string;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'oapi-guess-'));
    const env = {
      API_KEY_MODE: 'registered',
      INVALID_KEY_MAX_ATTEMPTS: '3',
      INVALID_KEY_WINDOW_SECONDS: '60',
      TRUST_PROXY_HOPS: '1',
    };
    pair = await startGatewayPair({ limits: LIMITS, env, dir, label: 'guess' });
  });
  afterAll(async () => {
    await pair?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('is refused by the other instance too, valid key or not, as soon as one blocks it (regression: only instances that saw it guess refused it)', async () => {
    // A plan with room for every request below: a 429 from b can only be the block.
    const { key } = (await issue(pair.a, 'shared-client', 'market-maker')).json<{ key: string }>();
    const quote = '/marketdata/quote/VNM';
    const guesser = { 'X-Forwarded-For': '198.51.100.60' };
    expect((await call(pair.b, key, quote, guesser)).status).toBe(200);

    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await call(pair.a, `guess-${i}`, '/orders/1', guesser)).status);
    expect(statuses).toEqual([401, 401, 401, 429]);

    // Instance b never saw a bad key from this address; the block reaches it over pub/sub.
    const deadline = Date.now() + 1500;
    let onB = await call(pair.b, key, quote, guesser);
    while (onB.status !== 429 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      onB = await call(pair.b, key, quote, guesser);
    }
    expect(onB.status).toBe(429);
    expect(onB.text).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    expect(onB.headers['x-ratelimit-remaining-hour']).toBeUndefined(); // refused before counting: the block, not the key's limit
    expect(Number(onB.headers['retry-after'])).toBeGreaterThan(50);
    expect(Number(onB.headers['retry-after'])).toBeLessThanOrEqual(60);
    // Another address with the same key is served on both.
    for (const gw of [pair.a, pair.b])
      expect((await call(gw, key, quote, { 'X-Forwarded-For': '198.51.100.61' })).status).toBe(200);
  });

  it('is logged with its address, listed by GET /admin/blocks on both, and unblocked on both by one DELETE (in any spelling of the address: regression, ::ffff:a.b.c.d got 404)', async () => {
    const address = '198.51.100.60';
    expect(pair.a.logs.find((l) => l.msg === 'address blocked for sending invalid API keys')).toMatchObject({
      level: 'warn',
      address,
      seconds: 60,
    });
    for (const gw of [pair.a, pair.b]) {
      const listed = await send(gw.adminUrl, { path: '/admin/blocks', headers: authHeader() });
      expect(listed.status).toBe(200);
      const { blocks } = listed.json<{ blocks: Array<{ address: string; seconds: number }> }>();
      expect(blocks).toHaveLength(1);
      expect(blocks[0]?.address).toBe(address);
      expect(blocks[0]?.seconds).toBeGreaterThan(0);
      expect(blocks[0]?.seconds).toBeLessThanOrEqual(60);
    }
    const noToken = await send(pair.a.adminUrl, { path: '/admin/blocks' });
    expect(noToken.status).toBe(401);

    // One DELETE, on the instance that never saw the address guess, in Node's spelling of it on a listener on `::`.
    const lifted = await send(pair.b.adminUrl, {
      method: 'DELETE',
      path: `/admin/blocks/::ffff:${address}`,
      headers: authHeader(),
    });
    expect(lifted.status).toBe(204);
    const { key } = (await issue(pair.a, 'unblocked-client', 'market-maker')).json<{ key: string }>();
    const quote = '/marketdata/quote/VNM';
    const from = { 'X-Forwarded-For': address };
    for (const gw of [pair.a, pair.b]) {
      const deadline = Date.now() + 1500;
      let reply = await call(gw, key, quote, from);
      while (reply.status === 429 && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 25));
        reply = await call(gw, key, quote, from);
      }
      expect(reply.status).toBe(200);
      const listed = await send(gw.adminUrl, { path: '/admin/blocks', headers: authHeader() });
      expect(listed.json()).toEqual({ blocks: [] });
    }
    expect(pair.b.logs.find((l) => l.msg === 'address unblocked')).toMatchObject({ address });
    // Its earlier failures are forgotten: one more bad key is a 401, not an instant block.
    expect((await call(pair.a, 'guess-again', '/orders/1', from)).status).toBe(401);

    const again = await send(pair.a.adminUrl, {
      method: 'DELETE',
      path: '/admin/blocks/203.0.113.99',
      headers: authHeader(),
    });
    expect(again.status).toBe(404);
    expect(expectTwoFields(again)).toEqual({ error: 'Not Found', message: 'Address 203.0.113.99 is not blocked' });
  });
});

describe('a gateway started while Redis is down (API_KEY_MODE=registered)', () => {
  it('never answers 401 nor counts a guess for a key it cannot check, is not ready, and serves the key once Redis is back', async () => {
    const redis = await startRedisServer({ persist: true });
    const dir = mkdtempSync(join(tmpdir(), 'oapi-keys-down-'));
    writeFileSync(join(dir, 'api-keys.yaml'), keyFile());
    const env = {
      API_KEY_MODE: 'registered',
      API_KEYS_FILE: join(dir, 'api-keys.yaml'),
      INVALID_KEY_MAX_ATTEMPTS: '2',
      REDIS_TIMEOUT_MS: '200',
    };
    const first = await startTestGateway({ limits: LIMITS, redis: redis.url, env });
    const { key } = (await issue(first, 'issued-before')).json<{ key: string }>();
    await first.stop();
    await redis.kill();
    const gw = await startTestGateway({ limits: LIMITS, redis: redis.url, env, prefix: first.prefix });
    try {
      // Redis is away (insurance mode): degraded, still serving the keys of the key file.
      const ready = await send(gw.adminUrl, { path: '/readyz' });
      expect(ready.status).toBe(200);
      expect(ready.json()).toEqual({
        status: 'degraded',
        reason: 'the issued API keys could not be read yet: Redis unreachable',
      });
      // Nor does it list the keys as if none had been issued (regression: 200 {"keys":[]}).
      const listing = await send(gw.adminUrl, { path: '/admin/keys', headers: authHeader() });
      expect(listing.status).toBe(503);
      expect(expectTwoFields(listing)).toEqual({ error: 'Service Unavailable', message: 'Key store unavailable' });
      // Nor does it say an issued key's id is no key's (regression: 404 "No key with id").
      for (const method of ['GET', 'DELETE']) {
        const usage = await send(gw.adminUrl, {
          method,
          path: '/admin/keys/issued-before/usage',
          headers: authHeader(),
        });
        expect(usage.status).toBe(503);
        expect(expectTwoFields(usage)).toEqual({ error: 'Service Unavailable', message: 'Key store unavailable' });
        // By the key itself too: what cannot be read is whether it was issued (regression: "Counter store unavailable").
        const byKey = await send(gw.adminUrl, { method, path: `/admin/usage/${key}`, headers: authHeader() });
        expect(byKey.status).toBe(503);
        expect(expectTwoFields(byKey)).toEqual({ error: 'Service Unavailable', message: 'Key store unavailable' });
      }
      // Far more attempts than the guard allows: none is a guess.
      for (const apiKey of [key, key, key, key, 'made-up-key', 'made-up-key']) {
        const reply = await call(gw, apiKey);
        expect(reply.status).toBe(503);
        expect(reply.headers['retry-after']).toBe('2');
        expect(expectTwoFields(reply)).toEqual({
          error: 'Service Unavailable',
          message: 'API keys cannot be checked right now',
        });
      }
      // A key the instance knows (the key file) is served all along, counted in memory meanwhile.
      const fileKeyReply = await call(gw, FILE_KEY);
      expect(fileKeyReply.status, fileKeyReply.text).toBe(200);
      const metrics = (await send(gw.adminUrl, { path: '/metrics' })).text;
      expect(metrics).toMatch(/^oapi_gateway_invalid_keys_total\{outcome="rejected"\} 0$/m);
      expect(metrics).toMatch(/^oapi_gateway_invalid_keys_total\{outcome="throttled"\} 0$/m);
      expect(gw.logs.filter((l) => l.msg === 'request' && (l.status === 401 || l.status === 429))).toEqual([]);

      await redis.restart();
      const deadline = Date.now() + 10_000;
      let served = await call(gw, key);
      while (served.status !== 200 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        served = await call(gw, key);
      }
      expect(served.status).toBe(200);
      expect((await send(gw.adminUrl, { path: '/readyz' })).status).toBe(200);
      // Now that Redis answers, a key that was never issued is what it is.
      expect((await call(gw, 'made-up-key')).status).toBe(401);
    } finally {
      await gw.stop();
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the invalid-key guard counting in Redis', () => {
  it('forgets on unblock the attempts its insurance counted while Redis was away (regression: the next attempt in another outage blocked the address again at once)', async () => {
    const redis = await startRedisServer();
    const proxy = await startRedisProxy(redis.port);
    const client = await connectedClient(proxy.url, 200);
    client.on('error', () => {});
    try {
      const guard = new InvalidKeyGuard({ client, prefix: uniquePrefix('guard'), attempts: 2, windowSeconds: 60 });
      proxy.away = true;
      await waitFor('the client to see Redis away', () => client.status !== 'ready', 2000, 10);
      for (let i = 0; i < 2; i++) expect(await guard.failed('10.0.0.9')).toBe(0);
      expect(await guard.failed('10.0.0.9')).toBeGreaterThan(0);
      proxy.away = false;
      await waitFor('the client back', () => client.status === 'ready', 5000, 10);
      expect(await guard.unblock('10.0.0.9')).toBe(true);
      proxy.away = true;
      await waitFor('the client to see Redis away again', () => client.status !== 'ready', 2000, 10);
      expect(await guard.failed('10.0.0.9')).toBe(0);
    } finally {
      client.disconnect();
      await proxy.close();
      await redis.stop();
    }
  });
});
