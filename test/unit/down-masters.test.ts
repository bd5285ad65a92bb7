import calculateSlot from 'cluster-key-slot';
import { describe, expect, it } from 'vitest';
import { DownMasters } from '../../src/redis/down-masters.js';

/** Three keys: two in slots of master a, one in a slot of master b (the slot map as ioredis keeps it). */
const [first, second, other] = ['{k1}:row', '{k2}:row', '{k3}:row'] as [string, string, string];
const A = '10.0.0.1:6379';

function make(): { clock: { now: number }; slots: string[][]; down: DownMasters; back: () => number } {
  const slots: string[][] = [];
  slots[calculateSlot(first)] = [A];
  slots[calculateSlot(second)] = [A];
  slots[calculateSlot(other)] = ['10.0.0.2:6379'];
  const clock = { now: 0 };
  const down = new DownMasters({ slots, status: 'ready' }, { now: () => clock.now });
  let told = 0;
  down.onBack(() => told++);
  return { clock, slots, down, back: () => told };
}

describe('DownMasters', () => {
  it('marks the master of a key whose call failed, for every slot it serves and no other, and lets one call try it again each downMs until one is answered', () => {
    const { clock, down, back } = make();
    expect(down.any).toBe(false);
    expect(down.tryFor(first)).toBe('send');
    down.failed(first);
    expect(down.any).toBe(true);
    expect(down.tryFor(first)).toBe('away');
    expect(down.tryFor(second)).toBe('away');
    expect(down.masterOf(second)).toBe(A);
    expect(down.tryFor(other)).toBe('send');
    clock.now = 999;
    expect(down.tryFor(second)).toBe('away');
    // Its time has come: one call tries it, the next waits another downMs.
    clock.now = 1000;
    expect(down.tryFor(second)).toBe('probe');
    expect(down.tryFor(first)).toBe('away');
    clock.now = 1999;
    expect(down.tryFor(first)).toBe('away');
    clock.now = 2000;
    expect(down.tryFor(first)).toBe('probe');
    // That one is answered: the master is back, and the listeners are told.
    expect(back()).toBe(0);
    down.answered(first);
    expect(back()).toBe(1);
    expect(down.any).toBe(false);
    expect(down.tryFor(second)).toBe('send');
    // An answer from a master that was not marked tells nobody.
    down.answered(other);
    expect(back()).toBe(1);
  });

  it('keeps a master marked for the outage merge, whatever its time, until a call there is answered', () => {
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
    expect(down.tryFor(first)).toBe('away');
    expect(down.marked(first)).toBe(true);
    expect(down.tryFor(other)).toBe('send');
  });

  it('keeps a master the slot map still names marked, tried or not, until a call there is answered (regression: after a minute untried, a merge was sent to a master still away)', () => {
    const { clock, down } = make();
    down.failed(first);
    clock.now = 120_000;
    expect(down.tryFor(other)).toBe('send');
    expect(down.marked(first)).toBe(true);
    expect(down.marked(second)).toBe(true);
  });

  it('forgets the marks of a master replaced by a fail-over, and tells the listeners (the undos held back for it can go), so that nothing is computed per call again', () => {
    const { clock, slots, down, back } = make();
    down.failed(first);
    // A fail-over: the slot map names a new master for every slot of the old one.
    slots[calculateSlot(first)] = ['10.0.0.9:6379'];
    slots[calculateSlot(second)] = ['10.0.0.9:6379'];
    down.answered(second);
    expect(back()).toBe(0);
    expect(down.any).toBe(true);
    clock.now = 61_001;
    expect(down.tryFor(other)).toBe('send');
    expect(down.any).toBe(false);
    expect(back()).toBe(1);
  });

  it("clears, on an answer from the master a fail-over put in place, the marks of the old one's other slots too (their calls failed on it)", () => {
    const { slots, down, back } = make();
    down.failed(first);
    down.failed(second);
    slots[calculateSlot(first)] = ['10.0.0.9:6379'];
    slots[calculateSlot(second)] = ['10.0.0.9:6379'];
    down.answered(first);
    expect(down.marked(second)).toBe(false);
    expect(back()).toBe(1);
  });
});
