import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * The folders of src/ in the order a request's code may depend on them (ARCHITECTURE.md): each may
 * import only folders before it, so no two folders ever import each other. wiring/ and the root
 * files (the runner and the entry points) put an instance together; the sandbox starts the runner.
 */
const LAYERS = [
  'lib',
  'limits',
  'events',
  'keys',
  'observability',
  'config',
  'openapi',
  'redis',
  'proxy',
  'ws',
  'server',
  'admin',
  'wiring',
  '(root)',
  'sandbox',
];

const SRC = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    // Declaration files (src/types) describe packages; they are no layer of their own.
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

function folderOf(path: string): string {
  const rel = relative(SRC, path);
  return rel.includes('/') ? (rel.split('/')[0] as string) : '(root)';
}

describe('src/ folders', () => {
  it('are all placed in the layer order', () => {
    const folders = new Set(sourceFiles(SRC).map(folderOf));
    expect([...folders].filter((f) => !LAYERS.includes(f))).toEqual([]);
  });

  it('import only folders below their own: dependencies run one way', () => {
    const wrong: string[] = [];
    for (const file of sourceFiles(SRC)) {
      const from = folderOf(file);
      const text = readFileSync(file, 'utf8');
      for (const match of text.matchAll(/(?:from\s+|import\()['"](\.{1,2}\/[^'"]+)['"]/g)) {
        const to = folderOf(resolve(dirname(file), match[1] as string));
        if (to !== from && LAYERS.indexOf(to) > LAYERS.indexOf(from)) {
          wrong.push(`${relative(SRC, file)} imports ${match[1] as string} (${from} → ${to})`);
        }
      }
    }
    expect(wrong).toEqual([]);
  });
});

describe('comments', () => {
  const ROOT = resolve(SRC, '..');
  const headings = (file: string): Set<string> =>
    new Set(
      readFileSync(join(ROOT, file), 'utf8')
        .split('\n')
        .filter((line) => line.startsWith('#'))
        .map((line) => line.replace(/^#+\s*/, '')),
    );

  it('cite sections that exist in the README and docs/, and no document outside the repository', () => {
    const docs = new Map<string, Set<string>>();
    const missing: string[] = [];
    const outside: string[] = [];
    for (const file of sourceFiles(SRC)) {
      const text = readFileSync(file, 'utf8');
      for (const match of text.matchAll(/(README|docs\/[a-z-]+\.md) "([^"]+)"/g)) {
        const doc = match[1] === 'README' ? 'README.md' : (match[1] as string);
        // A citation may run over a comment's line break.
        const section = (match[2] as string).replace(/\s*\n\s*(\*|\/\/)?\s*/g, ' ');
        if (!docs.has(doc)) docs.set(doc, headings(doc));
        if (!docs.get(doc)?.has(section)) missing.push(`${relative(SRC, file)}: ${doc} "${section}"`);
      }
      if (/INTERFACE|\bthe seed\b/.test(text)) outside.push(relative(SRC, file));
    }
    expect(missing).toEqual([]);
    expect(outside).toEqual([]);
  });
});
