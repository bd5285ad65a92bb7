import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { readConfigFile } from '../../src/lib/config-file.js';

/** The files the operator edits while the gateway serves (limits.yaml, the key file): what is read, what is refused unread. */

const dir = mkdtempSync(join(tmpdir(), 'oapi-config-file-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('readConfigFile', () => {
  it('reads a regular file within its size', async () => {
    const path = join(dir, 'ok.yaml');
    writeFileSync(path, 'limits: []\n');
    expect(await readConfigFile(path, 100)).toEqual({ text: 'limits: []\n' });
  });

  it('refuses a file over its size unread, naming both sizes', async () => {
    const path = join(dir, 'big.yaml');
    writeFileSync(path, 'x'.repeat(3 * 1024 * 1024 + 1));
    expect(await readConfigFile(path, 1024 * 1024)).toEqual({
      problem: 'file of 3.0 MiB, over the 1.0 MiB such a file may have',
    });
  });

  it('says a missing file is not found, and a directory or a FIFO is not a file (the FIFO without waiting for a writer)', async () => {
    expect(await readConfigFile(join(dir, 'missing.yaml'), 100)).toEqual({ problem: 'file not found' });
    expect(await readConfigFile(dir, 100)).toEqual({ problem: 'not a file' });
    const fifo = join(dir, 'fifo.yaml');
    execFileSync('mkfifo', [fifo]);
    expect(await readConfigFile(fifo, 100)).toEqual({ problem: 'not a file' });
  });
});
