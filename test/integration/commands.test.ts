import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { CLI, ROOT, runCli, runCliWithInput } from '../helpers/cli.js';
import { outputOf, waitForListening, waitForOutput } from '../helpers/child-gateway.js';

/** The commands of README "Running it", run as a user runs them (from the built `dist/`). */

const run = promisify(execFile);
const children: ChildProcess[] = [];

afterEach(() => {
  for (const child of children.splice(0)) child.kill('SIGKILL');
});

async function start(
  env: Record<string, string>,
  cwd = ROOT,
): Promise<{ code: number | null; stderr: string; stdout: string }> {
  const child = spawn(process.execPath, [join(ROOT, 'dist/main.js')], {
    cwd,
    env: { PATH: process.env.PATH, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const code = await new Promise<number | null>((resolve) => {
    const timer = setTimeout(() => resolve(null), 8000);
    child.once('exit', (c) => {
      clearTimeout(timer);
      resolve(c);
    });
  });
  return { code, stdout, stderr };
}

describe('npm start', () => {
  it('exits 1 with one line naming a missing bridge URL', async () => {
    const result = await start({});
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      'oapi-gateway: EQT_BRIDGE_URL is not set: the base URL of the eqt bridge is required, e.g. http://127.0.0.1:7001\n',
    );
  });

  it('exits 1 with one line naming a bad value', async () => {
    const result = await start({
      EQT_BRIDGE_URL: 'http://127.0.0.1:1',
      FNO_BRIDGE_URL: 'http://127.0.0.1:2',
      PORT: '70000',
    });
    expect(result.code).toBe(1);
    expect(result.stderr).toBe('oapi-gateway: PORT=70000: must be a port number (0-65535)\n');
  });

  it('exits 1 with every error of an invalid limit table', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-start-'));
    writeFileSync(join(dir, 'limits.yaml'), 'limits:\n  - {name: A, route: "GET /a", per_hour: 0, per_day: 1}\n');
    const result = await start(
      { EQT_BRIDGE_URL: 'http://127.0.0.1:1', FNO_BRIDGE_URL: 'http://127.0.0.1:2', PORT: '0', ADMIN_PORT: '0' },
      dir,
    );
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      'oapi-gateway: the gateway cannot start:\nlimits.yaml:2:42: row 1 (A): per_hour must be a positive integer, got 0\n',
    );
  });

  it('serves without REDIS_URL, warning that in-memory counters suit one instance only, and stops cleanly on SIGTERM', async () => {
    const child = spawn(process.execPath, [join(ROOT, 'dist/main.js')], {
      cwd: ROOT,
      env: {
        PATH: process.env.PATH,
        EQT_BRIDGE_URL: 'http://127.0.0.1:1',
        FNO_BRIDGE_URL: 'http://127.0.0.1:2',
        PORT: '0',
        HOST: '127.0.0.1',
        ADMIN_PORT: '0',
        API_KEY_MODE: 'any',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(child);
    const output = outputOf(child);
    const { url } = await waitForListening(child, output);
    const warning = output
      .stdout()
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { level: string; msg: string })
      .find((l) => l.level === 'warn');
    expect(warning?.msg).toBe('REDIS_URL is not set: counters live in this process, which suits one instance only');
    const reply = await fetch(`${url}/orders/1`, { headers: { 'X-API-Key': 'k' } });
    expect(reply.status).toBe(502);
    child.kill('SIGTERM');
    const code = await new Promise((resolve) => child.once('exit', resolve));
    expect(code).toBe(0);
  });
});

describe('npx oapi-gateway', () => {
  it("runs the package's own CLI from the repository, as the README says (no install step, no self-dependency), and leaves dist/ as it is (regression: its first run rebuilt dist/ under the other test files)", async () => {
    // The first npx in a checkout runs the package's `prepare` (a build) as it links it into npm's
    // cache: it would write dist/ again while other test files load it (README "Running it"). A
    // cache of the test's own makes every run a first one.
    const cache = mkdtempSync(join(tmpdir(), 'oapi-npx-'));
    const built = statSync(CLI).mtimeMs;
    try {
      const { stdout } = await run('npx', ['--no', 'oapi-gateway', 'help'], {
        cwd: ROOT,
        env: { ...process.env, npm_config_cache: cache, npm_config_ignore_scripts: 'true' },
      });
      expect(stdout).toContain('oapi-gateway check');
    } finally {
      rmSync(cache, { recursive: true, force: true });
    }
    expect(statSync(CLI).mtimeMs).toBe(built);
  });

  it('check prints the shipped table and exits 0', async () => {
    const { stdout } = await runCli(['check', 'limits.yaml']);
    expect(stdout).toMatch(/^limits\.yaml: valid, 18 rows, timezone Asia\/Ho_Chi_Minh, sha256:[0-9a-f]{64}\n/);
    expect(stdout).toContain('Latest Quote');
    expect(stdout).toContain('+ POST /oapi/auth/gen-secret-key/derivative');
    expect(stdout).toMatch(/WS \/ws\/orders\s+60\s+500/);
    expect(stdout).toContain('plan premium: 18 of 18 rows differ from the table');
  });

  it('check keeps its exit code when the reader of its output stops early (regression: `check | head -2` exited 1 with EPIPE)', async () => {
    // `true` exits at once, before node has started: every write of check meets a closed pipe.
    const script = 'set -o pipefail; node dist/cli.js check limits.yaml | true';
    const { stderr } = await run('bash', ['-c', script], { cwd: ROOT });
    expect(stderr).toBe('');
    const failed = await run(
      'bash',
      ['-c', 'set -o pipefail; node dist/cli.js check test/fixtures/limits/invalid/several-errors.yaml | true'],
      { cwd: ROOT },
    ).catch((e: { code: number }) => e);
    expect((failed as { code: number }).code).toBe(1);
  });

  it('check exits 1 with the errors and their lines', async () => {
    const fixture = join(ROOT, 'test/fixtures/limits/invalid/several-errors.yaml');
    const error = await runCli(['check', fixture]).catch((e: { code: number; stderr: string }) => e);
    expect((error as { code: number }).code).toBe(1);
    expect((error as { stderr: string }).stderr).toBe(
      `${fixture}:6:14: row 1 (Order List): per_day (200) is below per_hour (1800)\n` +
        `${fixture}:7:5: row 2: missing "name"\n` +
        `${fixture}:14:5: row 3 (Cancel Order): unknown key "burst" (expected one of name, route, also, per_hour, per_day, shadow)\n` +
        `${fixture}: 3 errors; not valid\n`,
    );
  });

  it.each([
    ['--keys without its file', ['check', 'limits.yaml', '--keys']],
    ['a second limits file', ['check', 'limits.yaml', 'config/api-keys.example.yaml']],
  ])('check refuses %s with the usage and exit 2 (regression: it ignored it and said valid)', async (_what, args) => {
    const error = await runCli(args).catch((e: { code: number; stdout: string; stderr: string }) => e);
    expect((error as { code: number }).code).toBe(2);
    expect((error as { stdout: string }).stdout).toBe('');
    expect((error as { stderr: string }).stderr).toMatch(/^usage:\n/);
  });

  it('check accepts the shipped example key file', async () => {
    const { stdout } = await runCli(['check', 'limits.yaml', '--keys', 'config/api-keys.example.yaml']);
    expect(stdout).toContain('config/api-keys.example.yaml: 1 key, valid');
  });

  it('check says "1 row" of a table of one row (it said "1 rows")', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-check-'));
    const table = join(dir, 'limits.yaml');
    writeFileSync(table, 'limits:\n  - { name: Orders, route: "GET /orders", per_hour: 1, per_day: 1 }\n');
    const { stdout } = await runCli(['check', table]);
    expect(stdout).toMatch(new RegExp(`^${table}: valid, 1 row, timezone UTC, sha256:`));
    rmSync(dir, { recursive: true, force: true });
  });

  it('check validates the key file against the plans of the table', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-check-'));
    const keys = join(dir, 'api-keys.yaml');
    writeFileSync(keys, `keys:\n  - id: acme\n    sha256: ${'a'.repeat(64)}\n    plan: premium\n`);
    const ok = await runCli(['check', 'limits.yaml', '--keys', keys]);
    expect(ok.stdout).toContain(`${keys}: 1 key, valid`);
    writeFileSync(
      keys,
      `keys:\n  - id: acme\n    sha256: ${'a'.repeat(64)}\n    plan: gold\n  - id: acme\n    sha256: xyz\n`,
    );
    const error = await runCli(['check', 'limits.yaml', '--keys', keys]).catch(
      (e: { code: number; stderr: string }) => e,
    );
    expect((error as { code: number }).code).toBe(1);
    expect((error as { stderr: string }).stderr).toBe(
      `${keys}:4:11: row 1 (acme): unknown plan "gold" (plans of limits.yaml: premium, market-maker)\n` +
        `${keys}:5:9: row 2 (acme): id "acme" is already used by entry 1\n` +
        `${keys}:6:13: row 2 (acme): sha256 must be 64 hex digits ("npx oapi-gateway keys hash -" prints it from the key on standard input), got 3 characters\n` +
        `${keys}: 3 errors; not valid\n`,
    );
  });

  it('keys hash prints the line for the key file', async () => {
    const { stdout } = await runCli(['keys', 'hash', 'foo']);
    expect(stdout).toBe('    sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\n');
  });

  it.each([
    ['a line with its newline', 'foo\n'],
    ['a line without one', 'foo'],
    ['a line ending in CRLF', 'foo\r\n'],
  ])('keys hash - reads the key from standard input: %s, and prints only the line', async (_what, input) => {
    const result = await runCliWithInput(['keys', 'hash', '-'], input);
    expect(result).toEqual({
      code: 0,
      stdout: '    sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\n',
      stderr: '',
    });
  });

  it('keys hash - refuses more than one line rather than hashing the first (regression: it hashed "a" of "a\\nb\\n")', async () => {
    const result = await runCliWithInput(['keys', 'hash', '-'], 'foo\nbar\n');
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr: 'keys hash -: standard input holds more than one line; give it one key\n',
    });
  });

  it('keys hash - decodes a character split between two reads (regression: each read was decoded alone, and hashed as U+FFFD)', async () => {
    const key = Buffer.from('clé-key\n');
    const split = key.indexOf(0xa9); // the second byte of é
    const result = await runCliWithInput(['keys', 'hash', '-'], [key.subarray(0, split), key.subarray(split)]);
    const sha = createHash('sha256').update('clé-key').digest('hex');
    expect(result).toEqual({ code: 0, stdout: `    sha256: ${sha}\n`, stderr: '' });
  });

  it('keys hash - refuses empty standard input with exit 1', async () => {
    const result = await runCliWithInput(['keys', 'hash', '-'], '\n');
    expect(result).toEqual({ code: 1, stdout: '', stderr: 'keys hash -: no key on standard input\n' });
  });

  it('keys new prints a fresh key and the sha256 line that admits it', async () => {
    const first = (await runCli(['keys', 'new'])).stdout;
    const second = (await runCli(['keys', 'new'])).stdout;
    const [key, line, rest] = first.split('\n');
    expect(key).toMatch(/^oapi_[A-Za-z0-9_-]{43}$/);
    expect(line).toBe(
      `    sha256: ${createHash('sha256')
        .update(key ?? '')
        .digest('hex')}`,
    );
    expect(rest).toBe('');
    expect(second.split('\n')[0]).not.toBe(key);
  });
});

describe('npm run sandbox', () => {
  /** What `npm run sandbox` prints under `env` once it is serving, and its curl lines, trimmed. */
  const sandbox = async (env: Record<string, string>): Promise<{ out: string; curls: string[] }> => {
    const child = spawn(process.execPath, [join(ROOT, 'dist/sandbox/main.js')], {
      cwd: ROOT,
      env: { PATH: process.env.PATH, PORT: '0', ADMIN_PORT: '0', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(child);
    const out = await waitForOutput(child, outputOf(child), 'Ctrl-C stops it.');
    const curls = out
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l.startsWith('curl '));
    return { out, curls };
  };

  it('makes a bearer token of its own when ADMIN_TOKEN is empty, so that the printed usage command works (regression: it printed an empty token, and got 403)', async () => {
    const usage = (await sandbox({ ADMIN_TOKEN: '' })).curls.find((l) => l.startsWith('curl -s '));
    expect(JSON.parse((await run('bash', ['-c', usage as string])).stdout)).toHaveProperty('endpoints');
  });

  it('prints curl commands with the key header the gateway reads (regression: X-API-Key whatever API_KEY_HEADER said, and they got 401)', async () => {
    const curls = (await sandbox({ API_KEY_HEADER: 'X-Client-Key' })).curls.filter((l) => l.includes('oapi_'));
    expect(curls).toHaveLength(4);
    for (const curl of curls.slice(0, 3)) expect(curl).toContain("-H 'X-Client-Key: oapi_");
    const order = (await run('bash', ['-c', curls[2] as string])).stdout;
    expect(order).toMatch(/^HTTP\/1\.1 200 OK/);
  });

  it('prints curl commands that work as pasted', async () => {
    const { out, curls } = await sandbox({});
    expect(curls).toHaveLength(4);

    const sh = async (command: string): Promise<string> => (await run('bash', ['-c', command])).stdout;
    const login = await sh(curls[0] as string);
    expect(login).toMatch(/^HTTP\/1\.1 200 OK/);
    expect(login).toContain('X-RateLimit-Remaining-Hour: 59');
    const tokens = JSON.parse(login.split('\r\n\r\n')[1] as string) as Record<string, unknown>;
    expect(Object.keys(tokens).sort()).toEqual([
      'access_token',
      'expires_in',
      'otp_token',
      'refresh_token',
      'token_type',
    ]);
    expect(tokens.token_type).toBe('Bearer');

    const wrong = await sh(curls[1] as string);
    expect(wrong).toMatch(/^HTTP\/1\.1 500 /);
    expect(wrong.split('\r\n\r\n')[1]).toBe(
      '{"code":"OAPI_EQT_500","messageParams":{"error":"server_error","error_description":"-107: Tên đăng nhập hoặc mật khẩu không đúng","s":500},"params":null,"source":"oapi-bridge-eqt","message":null}',
    );

    expect(await sh(curls[2] as string)).toMatch(/^HTTP\/1\.1 200 OK/);
    const usage = JSON.parse(await sh(curls[3] as string)) as {
      endpoints: Array<{ route: string; hour: { used: number } }>;
    };
    expect(usage.endpoints.find((e) => e.route === 'POST /auth/token')?.hour.used).toBe(2);
    expect(usage.endpoints.find((e) => e.route === 'GET /orders/{id}')?.hour.used).toBe(1);
    // The key's id, which the admin API's key paths take, is printed beside it.
    const id = /id (sandbox-\d+)\)/.exec(out)?.[1];
    expect(id).toBeDefined();
    const byId = await sh(curls[3]!.replace(/\/admin\/usage\/\S+/, `/admin/keys/${id}/usage`));
    // The same key's usage; the two reads may fall on either side of a second, so a reset may be a second shorter.
    const resets = (u: unknown): number[] =>
      JSON.stringify(u)
        .match(/"resetSeconds":\d+/g)!
        .map((f) => Number(f.slice(15)));
    const withoutResets = (u: unknown): string => JSON.stringify(u).replace(/"resetSeconds":\d+/g, '"resetSeconds":0');
    expect(withoutResets(JSON.parse(byId))).toBe(withoutResets(usage));
    resets(JSON.parse(byId)).forEach((r, i) =>
      expect([resets(usage)[i], (resets(usage)[i] as number) - 1]).toContain(r),
    );
  });
});
