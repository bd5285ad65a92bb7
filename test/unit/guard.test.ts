import { describe, expect, it } from 'vitest';
import { InvalidKeyGuard } from '../../src/keys/guard.js';

describe('InvalidKeyGuard (in memory)', () => {
  it('blocks after the allowed attempts and announces the block once, with its end', async () => {
    let now = 1_000_000;
    const announced: Array<[string, number]> = [];
    const guard = new InvalidKeyGuard({ prefix: 't:', attempts: 2, windowSeconds: 60, now: () => now, onBlock: (a, until) => announced.push([a, until]) });
    expect(await guard.failed('10.0.0.1')).toBe(0);
    expect(await guard.failed('10.0.0.1')).toBe(0);
    const ms = await guard.failed('10.0.0.1');
    expect(ms).toBeGreaterThan(59_000);
    expect(announced).toEqual([['10.0.0.1', now + ms]]);
    expect(guard.blockedFor('10.0.0.1')).toBe(ms);
    expect(guard.blockedFor('10.0.0.2')).toBe(0);
    now += ms;
    expect(guard.blockedFor('10.0.0.1')).toBe(0);
  });

  it('takes a block announced by another instance, never longer than one window, and ignores one already over', () => {
    const now = 5_000_000;
    const guard = new InvalidKeyGuard({ prefix: 't:', attempts: 2, windowSeconds: 60, now: () => now });
    guard.block('10.0.0.3', now + 30_000);
    expect(guard.blockedFor('10.0.0.3')).toBe(30_000);
    guard.block('10.0.0.4', now + 3_600_000); // a skewed or forged end
    expect(guard.blockedFor('10.0.0.4')).toBe(60_000);
    guard.block('10.0.0.5', now - 1);
    expect(guard.blockedFor('10.0.0.5')).toBe(0);
    // A shorter announcement does not cut a longer block short.
    guard.block('10.0.0.3', now + 1000);
    expect(guard.blockedFor('10.0.0.3')).toBe(30_000);
  });
});
