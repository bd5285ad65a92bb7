import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import RateLimiterMemory from 'rate-limiter-flexible/lib/RateLimiterMemory.js';
import RateLimiterRedis from 'rate-limiter-flexible/lib/RateLimiterRedis.js';
import RateLimiterRes from 'rate-limiter-flexible/lib/RateLimiterRes.js';
import * as rateLimiterFlexible from 'rate-limiter-flexible';
import * as undici from 'undici';
import Client from 'undici/lib/dispatcher/client.js';
import Pool from 'undici/lib/dispatcher/pool.js';
import { describe, expect, it } from 'vitest';

/**
 * Two packages are loaded by their own files rather than by their index, which would load
 * everything they offer (docs/performance.md "What was changed"): undici's Pool and its Client
 * (the forwarder makes its pools' connections itself; pool.js loads client.js anyway), and the
 * three rate-limiter-flexible classes the guard uses. These deep paths are not the packages'
 * documented entry points, so an upgrade that moves them must fail here, not at start-up.
 */

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const SRC = join(ROOT, 'src');
const PACKAGES = ['undici', 'rate-limiter-flexible'];

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

/** Statements of `text` that load one of PACKAGES by its index (type-only imports load nothing). */
function indexLoads(text: string): string[] {
  const name = `(?:${PACKAGES.join('|')})(?:/index\\.js)?`;
  const statement = new RegExp(
    [
      `^\\s*(?:import|export)\\s+(type\\s+)?[^;]*?from\\s*['"]${name}['"]`,
      `^\\s*import\\s*['"]${name}['"]`,
      `\\bimport\\s*\\(\\s*['"]${name}['"]`,
    ].join('|'),
    'gms',
  );
  return [...text.matchAll(statement)].filter((m) => !m[1]).map((m) => m[0].trim());
}

describe('partial imports of undici and rate-limiter-flexible', () => {
  it('are the very classes the package index exports', () => {
    expect(Pool).toBe(undici.Pool);
    expect(Client).toBe(undici.Client);
    expect(RateLimiterMemory).toBe(rateLimiterFlexible.RateLimiterMemory);
    expect(RateLimiterRedis).toBe(rateLimiterFlexible.RateLimiterRedis);
    expect(RateLimiterRes).toBe(rateLimiterFlexible.RateLimiterRes);
  });

  it('the forwarder, loaded alone, loads undici without its index', () => {
    // A process of its own: this test file has loaded the index itself.
    const forwarder = pathToFileURL(join(SRC, 'proxy/forwarder.ts')).href;
    const script = [
      `await import(${JSON.stringify(forwarder)});`,
      `const { createRequire } = await import('node:module');`,
      `const files = Object.keys(createRequire(import.meta.url).cache).filter((f) => f.includes('/node_modules/undici/'));`,
      `console.log(JSON.stringify({ files: files.length, index: files.some((f) => f.endsWith('/node_modules/undici/index.js')) }));`,
    ].join('\n');
    const child = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: ROOT,
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(child.stderr).toBe('');
    const loaded = JSON.parse(child.stdout) as { files: number; index: boolean };
    expect(loaded.files).toBeGreaterThan(0);
    expect(loaded.index).toBe(false);
  });

  it('no file of src/ loads either package by its index', () => {
    const found = sourceFiles(SRC).flatMap((file) =>
      indexLoads(readFileSync(file, 'utf8')).map((s) => `${relative(SRC, file)}: ${s}`),
    );
    expect(found).toEqual([]);
  });

  it('the check above finds every way of loading the index, and passes type-only imports', () => {
    const loads = [
      `import { Pool } from 'undici';`,
      `import {\n  Pool,\n  type Dispatcher,\n} from "undici";`,
      `export { Pool } from 'undici';`,
      `import 'undici';`,
      `const u = await import('undici');`,
      `import { RateLimiterRedis } from 'rate-limiter-flexible/index.js';`,
    ];
    for (const text of loads) expect(indexLoads(text), text).toHaveLength(1);
    const fine = [
      `import type { Dispatcher } from 'undici';`,
      `import type {\n  Dispatcher,\n} from 'undici';`,
      `import Pool from 'undici/lib/dispatcher/pool.js';`,
      `import RateLimiterRes from 'rate-limiter-flexible/lib/RateLimiterRes.js';`,
    ];
    for (const text of fine) expect(indexLoads(text), text).toEqual([]);
  });
});
