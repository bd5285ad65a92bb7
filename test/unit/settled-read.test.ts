import { describe, expect, it } from 'vitest';
import { settledRead } from '../../src/lib/file-watcher.js';

/** A read that returns the scripted results one by one; `refusal` of a result is itself unless it is 'ok'. */
function scripted(results: string[]): { read: () => Promise<string>; reads: () => number } {
  let n = 0;
  return { read: async () => results[Math.min(n++, results.length - 1)]!, reads: () => n };
}
const refusal = (result: string): string | undefined => (result === 'ok' ? undefined : result);

describe('settledRead', () => {
  it('reads a good file once', async () => {
    const file = scripted(['ok']);
    expect(await settledRead(file.read, refusal, { pauseMs: 1 })).toBe('ok');
    expect(file.reads()).toBe(1);
  });

  it('takes the good file that follows a refusal', async () => {
    const file = scripted(['half', 'ok']);
    expect(await settledRead(file.read, refusal, { pauseMs: 1 })).toBe('ok');
    expect(file.reads()).toBe(2);
  });

  it('gives a refusal once two reads in a row agree on it', async () => {
    const file = scripted(['half', 'bad', 'bad', 'ok']);
    expect(await settledRead(file.read, refusal, { pauseMs: 1 })).toBe('bad');
    expect(file.reads()).toBe(3);
  });

  it('stops after its number of reads for a file that keeps changing', async () => {
    const file = scripted(['a', 'b', 'c', 'd', 'e', 'ok']);
    expect(await settledRead(file.read, refusal, { pauseMs: 1, reads: 4 })).toBe('d');
    expect(file.reads()).toBe(4);
  });
});
