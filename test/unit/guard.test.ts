import { describe, expect, it } from 'vitest';
import { InvalidKeyGuard } from '../../src/keys/guard.js';
import { readEvent } from '../../src/events/bus.js';

describe('InvalidKeyGuard (in memory)', () => {
  it('blocks after the allowed attempts and announces the block once, with its length', async () => {
    let now = 1_000_000;
    const announced: Array<[string, number]> = [];
    const guard = new InvalidKeyGuard({
      prefix: 't:',
      attempts: 2,
      windowSeconds: 60,
      now: () => now,
      onBlock: (a, ms) => announced.push([a, ms]),
    });
    expect(await guard.failed('10.0.0.1')).toBe(0);
    expect(await guard.failed('10.0.0.1')).toBe(0);
    const ms = await guard.failed('10.0.0.1');
    expect(ms).toBeGreaterThan(59_000);
    expect(announced).toEqual([['10.0.0.1', ms]]);
    expect(guard.blockedFor('10.0.0.1')).toBe(ms);
    expect(guard.blockedFor('10.0.0.2')).toBe(0);
    // Requests already past the check when the block began fail too, without a new announcement.
    await Promise.all(Array.from({ length: 20 }, () => guard.failed('10.0.0.1')));
    expect(announced).toHaveLength(1);
    now += ms;
    expect(guard.blockedFor('10.0.0.1')).toBe(0);
  });

  it('takes a block announced by another instance, never longer than one window, and ignores a void one', () => {
    const now = 5_000_000;
    const guard = new InvalidKeyGuard({ prefix: 't:', attempts: 2, windowSeconds: 60, now: () => now });
    guard.block('10.0.0.3', 30_000);
    expect(guard.blockedFor('10.0.0.3')).toBe(30_000);
    guard.block('10.0.0.4', 3_600_000); // a forged length
    expect(guard.blockedFor('10.0.0.4')).toBe(60_000);
    guard.block('10.0.0.5', -1);
    guard.block('10.0.0.6', Number.NaN);
    expect(guard.blockedFor('10.0.0.5') + guard.blockedFor('10.0.0.6')).toBe(0);
    // A shorter announcement does not cut a longer block short.
    guard.block('10.0.0.3', 1000);
    expect(guard.blockedFor('10.0.0.3')).toBe(30_000);
  });
});

describe('regression: the guard counted each IPv6 address of a /64 apart', () => {
  it('counts, blocks, takes announced blocks and unblocks an IPv6 client by its /64', async () => {
    const now = 7_000_000;
    const announced: string[] = [];
    const guard = new InvalidKeyGuard({
      prefix: 't:',
      attempts: 2,
      windowSeconds: 60,
      now: () => now,
      onBlock: (a) => announced.push(a),
    });
    expect(await guard.failed('2001:db8:0:7::1')).toBe(0);
    expect(await guard.failed('2001:db8:0:7::2')).toBe(0);
    expect(await guard.failed('2001:db8:0:7:a:b:c:d')).toBeGreaterThan(0);
    expect(announced).toEqual(['2001:db8:0:7::/64']);
    expect(guard.blockedFor('2001:db8:0:7::ffff')).toBeGreaterThan(0);
    expect(guard.blockedFor('2001:db8:0:8::1')).toBe(0);
    expect(guard.blocks().map((b) => b.address)).toEqual(['2001:db8:0:7::/64']);
    expect(await guard.unblock('2001:db8:0:7::5')).toBe(true);
    expect(guard.blockedFor('2001:db8:0:7::1')).toBe(0);
    // As another instance announces it.
    guard.block('2001:db8:0:9::/64', 30_000);
    expect(guard.blockedFor('2001:DB8:0:9::42')).toBe(30_000);
    expect(await guard.unblock('2001:db8:0:9::/64')).toBe(true);
  });
});

describe('gateway events read from the channel', () => {
  it('are taken only when well formed', () => {
    expect(readEvent('{"type":"address-blocked","address":"10.0.0.1","ms":5000}')).toEqual({
      type: 'address-blocked',
      address: '10.0.0.1',
      ms: 5000,
    });
    expect(readEvent('{"type":"usage-reset","keyHash":"abc"}')).toEqual({ type: 'usage-reset', keyHash: 'abc' });
    expect(readEvent('{"type":"keys-changed","extra":1}')).toEqual({ type: 'keys-changed' });
    for (const bad of [
      'not json',
      'null',
      '[]',
      '{"type":"resync"}',
      '{"type":"address-blocked","address":"x"}',
      '{"type":"address-blocked","address":1,"ms":5}',
      `{"type":"address-blocked","address":"${'x'.repeat(300)}","ms":5}`,
      '{"type":"usage-reset"}',
    ]) {
      expect(readEvent(bad), bad).toBeUndefined();
    }
  });
});
