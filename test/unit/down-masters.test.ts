import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { DownMasters } from '../../src/redis/down-masters.js';

/** Three keys: two in slots of master a, one in a slot of master b (the slot map as ioredis keeps it). */
const [first, second, other] = ['{k1}:row', '{k2}:row', '{k3}:row'] as [string, string, string];
const A = '10.0.0.1:6379';

function make(): { clock: { now: number }; slots: string[][]; down: DownMasters } {
  const slots: string[][] = [];
  slots[calculateSlot(first)] = [A];
  slots[calculateSlot(second)] = [A];
  slots[calculateSlot(other)] = ['10.0.0.2:6379'];
  const clock = { now: 0 };
  const down = new DownMasters({ slots } as unknown as Cluster, { downMs: 1000, now: () => clock.now });
  return { clock, slots, down };
}

describe('DownMasters', () => {
  it('marks the master of a key whose call failed, for every slot it serves and no other, and lets one call try it again each downMs until one is answered', () => {
    const { clock, down } = make();
    expect(down.any).toBe(false);
    expect(down.downFor(first)).toBeUndefined();
    down.failed(first);
    expect(down.any).toBe(true);
    expect(down.downFor(first)).toBe(A);
    expect(down.downFor(second)).toBe(A);
    expect(down.downFor(other)).toBeUndefined();
    clock.now = 999;
    expect(down.downFor(second)).toBe(A);
    // Its time has come: one call goes, the next waits another downMs.
    clock.now = 1000;
    expect(down.downFor(second)).toBeUndefined();
    expect(down.downFor(first)).toBe(A);
    clock.now = 1999;
    expect(down.downFor(first)).toBe(A);
    clock.now = 2000;
    expect(down.downFor(first)).toBeUndefined();
    // That one is answered: the master is back.
    down.answered(first);
    expect(down.any).toBe(false);
    expect(down.downFor(second)).toBeUndefined();
  });

  it('keeps a master marked for merges and undos, whatever its time, until a call there is answered', () => {
    const { clock, down } = make();
    down.failed(first);
    clock.now = 5000;
    expect(down.marked(second)).toBe(true);
    expect(down.marked(other)).toBe(false);
    down.answered(second);
    expect(down.marked(first)).toBe(false);
  });

  it('keeps the slot of the failed call marked when the slot map names its master otherwise since (natMap after a redirection)', () => {
    const { slots, down } = make();
    down.failed(first);
    slots[calculateSlot(first)] = ['172.16.0.1:7000'];
    expect(down.downFor(first)).toBe('172.16.0.1:7000');
    expect(down.marked(first)).toBe(true);
    expect(down.downFor(other)).toBeUndefined();
  });

  it('keeps a master the slot map still names marked, tried or not, until a call there is answered (regression: after a minute untried, a merge was sent to a master still away)', () => {
    const { clock, down } = make();
    down.failed(first);
    clock.now = 120_000;
    expect(down.downFor(other)).toBeUndefined();
    expect(down.marked(first)).toBe(true);
    expect(down.marked(second)).toBe(true);
  });

  it('forgets the marks of a master replaced by a fail-over, so that nothing is computed per call again', () => {
    const { clock, slots, down } = make();
    down.failed(first);
    // A fail-over: the slot map names a new master for every slot of the old one.
    slots[calculateSlot(first)] = ['10.0.0.9:6379'];
    slots[calculateSlot(second)] = ['10.0.0.9:6379'];
    down.answered(second);
    expect(down.any).toBe(true);
    clock.now = 61_001;
    expect(down.downFor(other)).toBeUndefined();
    expect(down.any).toBe(false);
  });
});
