import { expect, it } from 'vitest';
import { MemoryCounterStore } from '../../src/limits/memory-store.js';
import { describeCounterStore, request } from '../helpers/store-contract.js';

describeCounterStore('MemoryCounterStore', () => new MemoryCounterStore());

it('keeps at most maxCounters pairs, forgetting the least recently used', async () => {
  const store = new MemoryCounterStore({ maxCounters: 100 });
  for (let i = 0; i < 1000; i++) await store.consume(request({ keyHash: `k${i}` }));
  expect(store.size).toBe(100);
});

it('drops a pair when its expiry passes', async () => {
  let now = Date.now();
  const store = new MemoryCounterStore({ now: () => now });
  const first = request({ expireAt: now + 1000 });
  const windows = [{ counterId: first.counterId, hourStart: first.hourStart, dayStart: first.dayStart }];
  await store.consume(first);
  expect(await store.usage('k', windows)).toEqual([{ hour: 1, day: 1 }]);
  now += 1001;
  expect(await store.usage('k', windows)).toEqual([{ hour: 0, day: 0 }]);
});
