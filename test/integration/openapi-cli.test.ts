import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parseLimits } from '../../src/config/load-limits.js';
import { adminOpenApi } from '../../src/openapi/admin.js';
import type { OpenApiDocument } from '../../src/openapi/common.js';
import { publicOpenApi } from '../../src/openapi/public.js';
import { validateDocument } from '../helpers/openapi.js';

/** `npx oapi-gateway openapi`, run as a user runs it: the built `dist/cli.js`, as a child process. */

const execFileAsync = promisify(execFile);
const ROOT = new URL('../../', import.meta.url).pathname;
const CLI = join(ROOT, 'dist/cli.js');
const VERSION = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

interface Outcome {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

async function cli(args: string[], env: Record<string, string> = {}, cwd = ROOT): Promise<Outcome> {
  try {
    const { stdout, stderr } = await execFileAsync(process.execPath, [CLI, ...args], {
      cwd,
      env: { PATH: process.env.PATH, ...env },
      maxBuffer: 16 * 1024 * 1024,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

function expected(file: string, apiKeyHeader = 'X-API-Key'): string {
  const result = parseLimits(readFileSync(join(ROOT, file), 'utf8'), file);
  if (!result.ok) throw new Error('invalid');
  return JSON.stringify(publicOpenApi(result.table, { apiKeyHeader, version: VERSION }), null, 2) + '\n';
}

describe('npx oapi-gateway openapi', () => {
  it('prints the public document of limits.yaml, indented by two spaces, with the package version', async () => {
    const out = await cli(['openapi']);
    expect(out).toMatchObject({ code: 0, stderr: '' });
    expect(out.stdout).toBe(expected('limits.yaml'));
    const doc = JSON.parse(out.stdout) as OpenApiDocument;
    expect(doc.info.version).toBe(VERSION);
    expect(await validateDocument(doc)).toEqual({ valid: true, messages: [], warnings: [] });
  });

  it('takes the key header from config/gateway.yaml as the gateway does, the environment first (regression: the file was not read)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-openapi-'));
    writeFileSync(
      join(dir, 'limits.yaml'),
      'limits:\n  - { name: Quote, route: "GET /quote/{symbol}", per_hour: 7, per_day: 70 }\n',
    );
    mkdirSync(join(dir, 'config'));
    writeFileSync(join(dir, 'config', 'gateway.yaml'), 'api_key_header: X-Desk-Key\n');
    const nameOf = (out: Outcome): unknown =>
      (JSON.parse(out.stdout) as OpenApiDocument).components.securitySchemes?.ApiKey?.name;
    expect(nameOf(await cli(['openapi'], {}, dir))).toBe('X-Desk-Key');
    expect(nameOf(await cli(['openapi'], { API_KEY_HEADER: 'X-Client-Key' }, dir))).toBe('X-Client-Key');
    writeFileSync(join(dir, 'config', 'gateway.yaml'), 'api_key_header: X Bad Name\n');
    const bad = await cli(['openapi'], {}, dir);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/^oapi-gateway: config\/gateway\.yaml:1:\d+: api_key_header /);
  });

  it('takes credential_routes from config/gateway.yaml as the gateway does, like the admin listener’s /openapi.json (regression: the CLI always described the default two)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-openapi-'));
    writeFileSync(
      join(dir, 'limits.yaml'),
      'limits:\n  - { name: Login, route: "POST /auth/token", per_hour: 7, per_day: 70 }\n' +
        '  - { name: Orders, route: "POST /orders", per_hour: 7, per_day: 70 }\n',
    );
    mkdirSync(join(dir, 'config'));
    writeFileSync(join(dir, 'config', 'gateway.yaml'), 'credential_routes:\n  - POST /auth/token\n');
    const doc = JSON.parse((await cli(['openapi'], {}, dir)).stdout) as OpenApiDocument;
    expect(Object.keys(doc.paths['/auth/token']?.post?.responses ?? {})).toContain('415');
    expect(Object.keys(doc.paths['/orders']?.post?.responses ?? {})).not.toContain('415');
  });

  it('reads FILE, else $LIMITS_FILE, and takes the key header from $API_KEY_HEADER', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-openapi-'));
    const file = join(dir, 'small.yaml');
    writeFileSync(file, 'limits:\n  - { name: Quote, route: "GET /quote/{symbol}", per_hour: 7, per_day: 70 }\n');
    for (const out of [
      await cli(['openapi', file], { API_KEY_HEADER: 'X-Client-Key' }),
      await cli(['openapi'], { LIMITS_FILE: file, API_KEY_HEADER: 'X-Client-Key' }),
    ]) {
      expect(out.code).toBe(0);
      const doc = JSON.parse(out.stdout) as OpenApiDocument;
      expect(Object.keys(doc.paths)).toEqual(['/quote/{symbol}']);
      expect(doc.paths['/quote/{symbol}']?.get?.['x-ratelimit']).toEqual({ per_hour: 7, per_day: 70 });
      expect(doc.components.securitySchemes?.ApiKey).toMatchObject({ name: 'X-Client-Key' });
    }
  });

  it('exits 1 with the same lines as check for an invalid file, and prints no document', async () => {
    const fixture = 'test/fixtures/limits/invalid/several-errors.yaml';
    const openapi = await cli(['openapi', fixture]);
    const check = await cli(['check', fixture]);
    expect(openapi.code).toBe(1);
    expect(openapi.stdout).toBe('');
    expect(openapi.stderr).toBe(check.stderr);
    expect(openapi.stderr).toContain(`${fixture}: 3 errors; not valid\n`);
    const missing = await cli(['openapi', 'no-such-file.yaml']);
    expect(missing).toEqual({
      code: 1,
      stdout: '',
      stderr: 'no-such-file.yaml:1:1: file not found\nno-such-file.yaml: 1 error; not valid\n',
    });
  });

  it('--admin prints the admin document', async () => {
    const out = await cli(['openapi', '--admin']);
    expect(out.code).toBe(0);
    expect(out.stdout).toBe(JSON.stringify(adminOpenApi({ version: VERSION }), null, 2) + '\n');
  });

  it('refuses extra arguments with the usage', async () => {
    const out = await cli(['openapi', 'a.yaml', 'b.yaml']);
    expect(out.code).toBe(2);
    expect(out.stderr).toContain('oapi-gateway openapi [LIMITS_FILE]');
  });
});
