import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { runCli } from '../helpers/cli.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';

/** Live changes of limits.yaml (docs/operations.md "Changing limits while it serves"): a good table takes over, a bad one changes nothing. */

const table = (perHour: number, perDay: number, name = 'Order List', timezone = 'UTC'): string => `
timezone: ${timezone}
limits:
  - { name: ${name}, route: "GET /orders", per_hour: ${perHour}, per_day: ${perDay} }
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 1000, per_day: 1000 }
`;

const admin = (gw: TestGateway, path: string, method = 'GET') =>
  send(gw.adminUrl, { path, method, headers: authHeader() });
const limitsHash = async (gw: TestGateway): Promise<string> =>
  (await admin(gw, '/admin/limits')).json<{ hash: string }>().hash;
const orderListLimit = async (gw: TestGateway, key: string): Promise<string | undefined> =>
  (await send(gw.url, { path: '/orders', headers: { 'X-API-Key': key } })).headers['x-ratelimit-limit-hour'] as
    string | undefined;

async function waitFor<T>(probe: () => Promise<T>, accept: (value: T) => boolean, timeoutMs = 5000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let value = await probe();
  while (!accept(value) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    value = await probe();
  }
  return value;
}

describe('POST /admin/limits/reload', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: table(5, 10) });
  });
  afterAll(async () => {
    await gw.stop();
  });

  it('loads a valid table and keeps every row its counters when its numbers and name change', async () => {
    const key = `carry-${Date.now()}`;
    for (let i = 0; i < 5; i++) await send(gw.url, { path: '/orders', headers: { 'X-API-Key': key } });
    expect((await send(gw.url, { path: '/orders', headers: { 'X-API-Key': key } })).status).toBe(429);

    writeFileSync(gw.limitsPath, table(8, 20, 'Orders renamed'));
    const reply = await admin(gw, '/admin/limits/reload', 'POST');
    expect(reply.status).toBe(200);
    const body = reply.json<{ hash: string; loadedAt: string; changed: boolean }>();
    expect(body.hash).toMatch(/^sha256:[0-9a-f]{64}$/);
    // The file watch may have loaded the new table first (150 ms after the write; a loaded machine
    // can take longer than that to serve the POST): then the POST finds it in force, unchanged.
    const loads = gw.logs.filter((l) => l.msg === 'limit table loaded' && l.hash === body.hash).map((l) => l.trigger);
    expect(body.changed ? loads : loads.slice(0, 1)).toEqual([body.changed ? 'admin' : 'file']);
    expect(await limitsHash(gw)).toBe(body.hash);

    // The same counters, under the new numbers: 5 used of 8, and the remembered refusal is gone.
    const next = await send(gw.url, { path: '/orders', headers: { 'X-API-Key': key } });
    expect(next.status).toBe(200);
    expect(next.headers['x-ratelimit-limit-hour']).toBe('8');
    expect(next.headers['x-ratelimit-remaining-hour']).toBe('2');
    expect(next.headers['x-ratelimit-remaining-day']).toBe('14');
  });

  it('goes on counting the day and the hour when the timezone changes, either way (regression: a zone whose day began later gave every key a fresh day)', async () => {
    const key = `zone-${Date.now()}`;
    const inForce = readFileSync(gw.limitsPath, 'utf8');
    const order = () => send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key } });
    for (let i = 0; i < 3; i++) expect((await order()).status).toBe(200);
    // Whatever the hour, one of these changes moves the start of the day in progress later and the
    // other earlier (Ho Chi Minh City's day begins at 17:00 UTC); Kolkata's hours begin on the half hour.
    let used = 3;
    for (const zone of ['Asia/Ho_Chi_Minh', 'UTC', 'Asia/Kolkata', 'UTC']) {
      writeFileSync(gw.limitsPath, table(5, 10, 'Order List', zone));
      expect((await admin(gw, '/admin/limits/reload', 'POST')).status).toBe(200);
      const reply = await order();
      used++;
      expect(reply.status).toBe(200);
      expect([reply.headers['x-ratelimit-remaining-hour'], reply.headers['x-ratelimit-remaining-day']]).toEqual([
        String(1000 - used),
        String(1000 - used),
      ]);
    }
    writeFileSync(gw.limitsPath, inForce);
    expect((await admin(gw, '/admin/limits/reload', 'POST')).status).toBe(200);
  });

  it('refuses an invalid table with the errors check prints, logs and counts it, and keeps the table in force', async () => {
    const before = await limitsHash(gw);
    const invalid =
      'timezone: UTC\nlimits:\n  - { name: Order List, route: "GET /orders", per_hour: 50, per_day: 5 }\n  - { name: X, route: "FETCH /x", per_hour: 1, per_day: 1 }\n';
    writeFileSync(gw.limitsPath, invalid);
    const reply = await admin(gw, '/admin/limits/reload', 'POST');
    expect(reply.status).toBe(422);
    // RFC 9110's phrase on the status line too (regression: Node's "Unprocessable Entity").
    expect(reply.statusText).toBe('Unprocessable Content');
    const body = reply.json<{ error: string; message: string; errors: string[] }>();
    expect(body.error).toBe('Unprocessable Content');

    const check = await runCli(['check', gw.limitsPath]).catch((e: { stderr: string }) => e);
    const printed = check.stderr.trimEnd().split('\n').slice(0, -1);
    expect(printed).toHaveLength(2);
    expect(body.errors).toEqual(printed);

    expect(await limitsHash(gw)).toBe(before);
    expect(await orderListLimit(gw, `after-bad-${Date.now()}`)).toBe('8');
    await new Promise((r) => setTimeout(r, 20));
    // The file watch may have read the file in the middle of the test's writing too (its read is
    // asynchronous) and refused what it read then: the admin reload's refusal is one of the lines.
    const refusals = gw.logs.filter((l) => l.msg === 'limit table refused; the table in force stays');
    expect(refusals.map((l) => l.errors)).toContainEqual(printed);
    const metrics = (await send(gw.adminUrl, { path: '/metrics' })).text;
    expect(metrics).toMatch(/^oapi_gateway_limits_reloads_total\{result="invalid"\} [1-9]\d*$/m);
    writeFileSync(gw.limitsPath, table(8, 20, 'Orders renamed'));
  });
});

describe('a change of the file on disk', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: table(5, 10) });
  });
  afterAll(async () => {
    await gw.stop();
  });

  it('is loaded when the file is written in place', async () => {
    writeFileSync(gw.limitsPath, table(11, 20));
    expect(
      await waitFor(
        () => orderListLimit(gw, `inplace-${Date.now()}`),
        (v) => v === '11',
      ),
    ).toBe('11');
  });

  it('is loaded when an editor replaces the file by a rename', async () => {
    const tmp = join(gw.dir, '.limits.yaml.swp');
    writeFileSync(tmp, table(12, 20));
    renameSync(tmp, gw.limitsPath);
    expect(
      await waitFor(
        () => orderListLimit(gw, `rename-${Date.now()}`),
        (v) => v === '12',
      ),
    ).toBe('12');
  });

  it('keeps the table in force when the new file is invalid', async () => {
    writeFileSync(gw.limitsPath, 'limits: [oops');
    await new Promise((r) => setTimeout(r, 800));
    expect(await orderListLimit(gw, `stay-${Date.now()}`)).toBe('12');
    writeFileSync(gw.limitsPath, table(13, 20));
    expect(
      await waitFor(
        () => orderListLimit(gw, `back-${Date.now()}`),
        (v) => v === '13',
      ),
    ).toBe('13');
  });

  it('says so when a refused file is put back to the table in force (regression: the last line stayed "refused")', async () => {
    writeFileSync(gw.limitsPath, 'limits: [oops again');
    await waitFor(
      async () => gw.logs.filter((l) => l.msg === 'limit table refused; the table in force stays').length,
      (n) => n >= 2,
    );
    writeFileSync(gw.limitsPath, table(13, 20));
    const restored = await waitFor(
      async () => gw.logs.find((l) => l.msg === 'limit table valid again; the table in force is unchanged'),
      (line) => line !== undefined,
    );
    expect(restored).toMatchObject({ level: 'info', trigger: 'file' });
    expect(gw.logs.at(-1)?.msg).not.toMatch(/refused/);
    expect(await orderListLimit(gw, `restored-${Date.now()}`)).toBe('13');
  });
});

describe('an invalid file next to a busy neighbour', () => {
  it('is reported once, and writes to other files of the directory reload nothing (regression: a log file there caused a reload loop)', async () => {
    const gw = await startTestGateway({ limits: table(5, 10) });
    try {
      writeFileSync(gw.limitsPath, 'limits: [oops');
      await new Promise((r) => setTimeout(r, 600));
      for (let i = 0; i < 20; i++) {
        writeFileSync(join(gw.dir, 'gateway.log'), `line ${i}\n`, { flag: 'a' });
        await new Promise((r) => setTimeout(r, 40));
      }
      await new Promise((r) => setTimeout(r, 500));
      expect(gw.logs.filter((l) => l.msg === 'limit table refused; the table in force stays')).toHaveLength(1);
      const metrics = (await send(gw.adminUrl, { path: '/metrics' })).text;
      expect(metrics).toMatch(/^oapi_gateway_limits_reloads_total\{result="invalid"\} 1$/m);
    } finally {
      await gw.stop();
    }
  });
});

describe('a Kubernetes ConfigMap update', () => {
  it('is loaded when the ..data symlink is swapped to a new directory', async () => {
    // The layout the kubelet writes: limits.yaml -> ..data/limits.yaml, ..data -> ..<timestamp>/
    const { mkdtempSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(join(tmpdir(), 'oapi-cm-'));
    mkdirSync(join(dir, '..2026_11_22_10_00_00.1'));
    writeFileSync(join(dir, '..2026_11_22_10_00_00.1', 'limits.yaml'), table(21, 30));
    symlinkSync('..2026_11_22_10_00_00.1', join(dir, '..data'));
    symlinkSync('..data/limits.yaml', join(dir, 'limits.yaml'));
    const gw = await startTestGateway({ dir, env: {} });
    try {
      expect(await orderListLimit(gw, `cm-${Date.now()}`)).toBe('21');
      mkdirSync(join(dir, '..2026_11_22_10_05_00.2'));
      writeFileSync(join(dir, '..2026_11_22_10_05_00.2', 'limits.yaml'), table(22, 30));
      symlinkSync('..2026_11_22_10_05_00.2', join(dir, '..data_tmp'));
      renameSync(join(dir, '..data_tmp'), join(dir, '..data'));
      expect(
        await waitFor(
          () => orderListLimit(gw, `cm2-${Date.now()}`),
          (v) => v === '22',
        ),
      ).toBe('22');
    } finally {
      await gw.stop();
    }
  });
});

describe('a reload under load', () => {
  it('loses no request and answers every one correctly', async () => {
    const gw = await startTestGateway({ limits: table(100_000, 1_000_000), env: { LOG_LEVEL: 'warn' } });
    const agent = new http.Agent({ keepAlive: true, maxSockets: 20 });
    try {
      let stop = false;
      const statuses: number[] = [];
      const errors: string[] = [];
      const client = async (n: number): Promise<void> => {
        for (let i = 0; i < 2000 && !stop; i++) {
          try {
            const reply = await send(gw.url, {
              path: `/orders/${n}-${i}`,
              headers: { 'X-API-Key': `load-${n}` },
              agent,
            });
            statuses.push(reply.status);
          } catch (err) {
            errors.push((err as Error).message);
          }
        }
      };
      const clients = Array.from({ length: 10 }, (_, n) => client(n));
      for (let r = 0; r < 6; r++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        writeFileSync(gw.limitsPath, table(100_000 + r, 1_000_000) + `# reload ${r}\n`);
        const reply = await admin(gw, '/admin/limits/reload', 'POST');
        expect(reply.status).toBe(200);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      stop = true;
      await Promise.all(clients);
      expect(errors).toEqual([]);
      expect(statuses.length).toBeGreaterThan(100);
      expect(statuses.every((s) => s === 200)).toBe(true);
      const usage = (await admin(gw, '/admin/usage/load-0')).json<{
        endpoints: Array<{ route: string; hour: { used: number } }>;
      }>();
      expect(usage.endpoints[1]?.hour.used).toBeGreaterThan(0);
    } finally {
      agent.destroy();
      await gw.stop();
    }
  });
});

// regression: a FIFO in the table's place held the reload (and every one queued behind it) until
// something wrote to it, and a file of hundreds of megabytes blocked the event loop for seconds.
describe('a limits.yaml that is no table to read', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: table(5, 10) });
  });
  afterAll(async () => {
    await gw.stop();
  });

  it.each([
    ['a FIFO', (path: string) => execFileSync('mkfifo', [path]), 'not a file'],
    [
      'a file over 1 MiB',
      (path: string) => writeFileSync(path, `# ${'x'.repeat(2 * 1024 * 1024)}\n${table(7, 7)}`),
      'file of 2.0 MiB, over the 1.0 MiB such a file may have',
    ],
  ])('(%s) is refused unread with one line, and the table in force stays', async (_what, make, message) => {
    const before = await limitsHash(gw);
    rmSync(gw.limitsPath);
    make(gw.limitsPath);
    try {
      const reply = await admin(gw, '/admin/limits/reload', 'POST');
      expect(reply.status).toBe(422);
      expect(reply.json<{ errors: string[] }>().errors).toEqual([`${gw.limitsPath}:1:1: ${message}`]);
      expect(await limitsHash(gw)).toBe(before);
      expect(await orderListLimit(gw, `unread-${Date.now()}`)).toBe('5');
    } finally {
      rmSync(gw.limitsPath);
      writeFileSync(gw.limitsPath, table(5, 10));
    }
  });
});
