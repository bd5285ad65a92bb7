import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import RateLimiterMemory from 'rate-limiter-flexible/lib/RateLimiterMemory.js';
import RateLimiterRedis from 'rate-limiter-flexible/lib/RateLimiterRedis.js';
import RateLimiterRes from 'rate-limiter-flexible/lib/RateLimiterRes.js';
import * as rateLimiterFlexible from 'rate-limiter-flexible';
import * as undici from 'undici';
import Pool from 'undici/lib/dispatcher/pool.js';
import { describe, expect, it } from 'vitest';

/**
 * Two packages are loaded by one file each rather than by their index, which would load
 * everything they offer (docs/performance.md "Memory"): undici's Pool alone, and the three
 * rate-limiter-flexible classes the guard uses. These deep paths are not the packages' documented
 * entry points, so an upgrade that moves them must fail here, not at start-up.
 */

const SRC = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

describe('partial imports of undici and rate-limiter-flexible', () => {
  it('are the very classes the package index exports', () => {
    expect(Pool).toBe(undici.Pool);
    expect(RateLimiterMemory).toBe(rateLimiterFlexible.RateLimiterMemory);
    expect(RateLimiterRedis).toBe(rateLimiterFlexible.RateLimiterRedis);
    expect(RateLimiterRes).toBe(rateLimiterFlexible.RateLimiterRes);
  });

  it('the Pool alone can dispatch (the index adds request/stream helpers the forwarder does not use)', () => {
    expect(typeof Pool.prototype.dispatch).toBe('function');
    expect(typeof Pool.prototype.destroy).toBe('function');
  });

  it('no file of src/ loads either package by its index (type-only imports load nothing)', () => {
    const indexImports: string[] = [];
    for (const file of sourceFiles(SRC)) {
      const text = readFileSync(file, 'utf8');
      for (const match of text.matchAll(/^import\s+(type\s+)?[^;]*?from\s+'(undici|rate-limiter-flexible)';/gms)) {
        if (!match[1]) indexImports.push(`${relative(SRC, file)}: ${match[0]}`);
      }
    }
    expect(indexImports).toEqual([]);
  });
});
