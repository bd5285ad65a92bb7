import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { DownMasters } from '../../src/redis/down-masters.js';

/** Three keys: two in slots of master a, one in a slot of master b (the slot map as ioredis keeps it). */
const [first, second, other] = ['{k1}:row', '{k2}:row', '{k3}:row'];
const slots: string[][] = [];
slots[calculateSlot(first)] = ['10.0.0.1:6379'];
slots[calculateSlot(second)] = ['10.0.0.1:6379'];
slots[calculateSlot(other)] = ['10.0.0.2:6379'];

describe('DownMasters', () => {
  const make = () => {
    const clock = { now: 0 };
    const cluster = { slots } as unknown as Cluster;
    return { clock, down: new DownMasters(cluster, { downMs: 1000, now: () => clock.now }) };
  };

  it('takes the master of a key whose call failed as away for downMs, for every slot it serves, and no other', () => {
    const { clock, down } = make();
    expect(down.downFor(first)).toBeUndefined();
    down.failed(first);
    expect(down.downFor(first)).toBe('10.0.0.1:6379');
    expect(down.downFor(second)).toBe('10.0.0.1:6379');
    expect(down.downFor(other)).toBeUndefined();
    clock.now = 999;
    expect(down.downFor(second)).toBe('10.0.0.1:6379');
    clock.now = 1000;
    expect(down.downFor(first)).toBeUndefined();
    expect(down.downFor(second)).toBeUndefined();
  });

  it('keeps the slot of the failed call away when the slot map names its master otherwise since (natMap after a redirection)', () => {
    const { down } = make();
    const renamed = [...slots];
    const cluster = { slots: renamed } as unknown as Cluster;
    const clock = { now: 0 };
    const d = new DownMasters(cluster, { downMs: 1000, now: () => clock.now });
    d.failed(first);
    renamed[calculateSlot(first)] = ['172.16.0.1:7000'];
    expect(d.downFor(first)).toBe('172.16.0.1:7000');
    expect(d.downFor(other)).toBeUndefined();
    expect(down.downFor(first)).toBeUndefined();
  });
});
