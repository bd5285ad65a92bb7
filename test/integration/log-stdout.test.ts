import { execFile, execFileSync, spawn } from 'node:child_process';
import { closeSync, constants, mkdtempSync, openSync, readSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

/**
 * The process's stdout log, in a process of its own (the built logger from dist/): lines are
 * batched, so these pin that none is lost when the process ends before the next batch is due.
 */

const LOGGER = new URL('../../dist/observability/logger.js', import.meta.url).href;

async function runScript(body: string): Promise<{ code: number; stdout: string; stderr: string }> {
  const script = `const { createLogger } = await import(${JSON.stringify(LOGGER)});\n${body}`;
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], {
      timeout: 10_000,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

const messages = (stdout: string): string[] =>
  stdout
    .split('\n')
    .filter(Boolean)
    .map((l) => (JSON.parse(l) as { msg: string }).msg);

describe('the stdout log', () => {
  it('writes the lines gathered before process.exit()', async () => {
    const result = await runScript(`
      const log = createLogger('info');
      log.info('one');
      log.error('two');
      process.exit(3);
    `);
    expect(result.code).toBe(3);
    expect(messages(result.stdout)).toEqual(['one', 'two']);
  });

  it('writes the lines gathered before an uncaught exception', async () => {
    const result = await runScript(`
      const log = createLogger('info');
      log.info('before the crash');
      setTimeout(() => { throw new Error('boom'); }, 0);
    `);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain('boom');
    expect(messages(result.stdout)).toEqual(['before the crash']);
  });

  it('keeps the order of lines from several loggers of one process (one destination for all)', async () => {
    const result = await runScript(`
      const a = createLogger('info');
      const b = createLogger('info');
      for (let i = 0; i < 5; i++) { a.info('a' + i); b.info('b' + i); }
    `);
    expect(result.code).toBe(0);
    expect(messages(result.stdout)).toEqual(['a0', 'b0', 'a1', 'b1', 'a2', 'b2', 'a3', 'b3', 'a4', 'b4']);
  });

  // WORKERS=n: every worker writes to the stdout it inherited, in a container a pipe that the log
  // collector may read slowly. Linux writes at most PIPE_BUF (4096) bytes to a pipe at once
  // (pipe(7)); a longer write can be split around another process's when the pipe is full.
  it('keeps every line whole when two processes share one slow pipe (the lines of WORKERS=2)', async () => {
    const dir = mkdtempSync(join(os.tmpdir(), 'oapi-log-pipe-'));
    const fifo = join(dir, 'stdout');
    execFileSync('mkfifo', [fifo]);
    const reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    const writer = openSync(fifo, 'w');
    const LINES = 300;
    // Lines of about 1 KB: the gateway's own are shorter, which only makes more of them per batch.
    const script = (name: string): string => `
      const { createLogger } = await import(${JSON.stringify(LOGGER)});
      const log = createLogger('info');
      for (let i = 0; i < ${LINES}; i++) log.info({ w: '${name}', i, pad: 'x'.repeat(900) }, 'line');
    `;
    const writers = ['a', 'b'].map((name) => {
      const child = spawn(process.execPath, ['--input-type=module', '-e', script(name)], {
        stdio: ['ignore', writer, 'inherit'],
      });
      return new Promise<number | null>((resolve) => child.once('exit', resolve));
    });
    closeSync(writer);
    let received = '';
    try {
      // The pipe fills while nobody reads, then is read a little at a time, so that both
      // processes keep finding it full.
      await sleep(300);
      const chunk = Buffer.alloc(2048);
      for (let turn = 0; turn < 5000; turn++) {
        let n: number;
        try {
          n = readSync(reader, chunk);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err;
          n = -1;
        }
        if (n === 0) break; // both processes have closed their end: everything is read
        if (n > 0) received += chunk.toString('utf8', 0, n);
        await sleep(1);
      }
      expect(await Promise.all(writers)).toEqual([0, 0]);
    } finally {
      closeSync(reader);
      rmSync(dir, { recursive: true, force: true });
    }
    const lines = received.split('\n').filter(Boolean);
    const whole = lines.filter((line) => {
      try {
        JSON.parse(line);
        return true;
      } catch {
        return false;
      }
    });
    expect(lines.length - whole.length).toBe(0);
    for (const name of ['a', 'b']) {
      const own = whole.map((l) => JSON.parse(l) as { w: string; i: number }).filter((l) => l.w === name);
      expect(own.map((l) => l.i)).toEqual(Array.from({ length: LINES }, (_, i) => i));
    }
  });
});
