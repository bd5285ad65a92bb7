import { describe, expect, it } from 'vitest';
import { Closers } from '../../src/wiring/closers.js';

describe('Closers', () => {
  it('closes the last opened first, each once, and goes on past one that fails', async () => {
    const closers = new Closers();
    const ran: string[] = [];
    closers.add('redis', () => void ran.push('redis'));
    closers.add('watch', () => {
      ran.push('watch');
      throw new Error('already closed');
    });
    closers.add('listener', async () => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      ran.push('listener');
    });
    expect(closers.pending()).toEqual(['listener', 'watch', 'redis']);
    const failures: string[] = [];
    await closers.closeAll((name, err) => failures.push(`${name}: ${(err as Error).message}`));
    expect(ran).toEqual(['listener', 'watch', 'redis']);
    expect(failures).toEqual(['watch: already closed']);
    await closers.closeAll();
    expect(ran).toHaveLength(3);
    expect(closers.pending()).toEqual([]);
  });
});
