import { execFile } from 'node:child_process';
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
});
