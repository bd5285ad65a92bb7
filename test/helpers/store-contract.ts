import { beforeEach, describe, expect, it } from 'vitest';
import type { ConsumeRequest, CounterStore } from '../../src/limits/store.js';

/**
 * The behaviour every counter-store backend must have, run against each of them (the
 * in-memory store in the unit suite, Redis and Redis Cluster in the integration suite).
 */

let n = 0;
// Windows around the real present: Redis expires counters against its own clock.
const H = Math.floor(Date.now() / 3_600_000) * 3600; // an hour window start, epoch seconds
const D = H - (H % 86_400);

export function request(over: Partial<ConsumeRequest> = {}): ConsumeRequest {
  return {
    keyHash: 'k',
    counterId: 'row',
    hourStart: H,
    dayStart: D,
    hourLimit: 3,
    dayLimit: 5,
    expireAt: (D + 3 * 86_400) * 1000,
    force: false,
    ...over,
  };
}

export function describeCounterStore(name: string, makeStore: () => CounterStore | Promise<CounterStore>): void {
  describe(`${name} (counter-store contract)`, () => {
    let store: CounterStore;
    let keyHash: string;
    const req = (over: Partial<ConsumeRequest> = {}): ConsumeRequest => request({ keyHash, ...over });

    beforeEach(async () => {
      store = await makeStore();
      keyHash = `key${++n}x${Math.random().toString(36).slice(2, 8)}`;
    });

    it('admits up to the hour limit, one unit of each window per request', async () => {
      expect(await store.consume(req())).toEqual({ allowed: true, hour: 1, day: 1 });
      expect(await store.consume(req())).toEqual({ allowed: true, hour: 2, day: 2 });
      expect(await store.consume(req())).toEqual({ allowed: true, hour: 3, day: 3 });
      expect(await store.consume(req())).toEqual({ allowed: false, hour: 3, day: 3 });
    });

    it('uses nothing for a refused request: hammering past the hour does not burn the day', async () => {
      for (let i = 0; i < 3; i++) await store.consume(req());
      for (let i = 0; i < 20; i++) expect((await store.consume(req())).allowed).toBe(false);
      expect(await store.usage(keyHash, [{ counterId: 'row', hourStart: H, dayStart: D }])).toEqual([
        { hour: 3, day: 3 },
      ]);
      // The next hour has room again, and the day counted only the three admitted requests.
      expect(await store.consume(req({ hourStart: H + 3600 }))).toEqual({ allowed: true, hour: 1, day: 4 });
    });

    it('refuses on a spent day without touching the hour window', async () => {
      for (let h = 0; h < 2; h++) for (let i = 0; i < 3; i++) await store.consume(req({ hourStart: H + h * 3600 }));
      expect(await store.consume(req({ hourStart: H + 7200 }))).toEqual({ allowed: false, hour: 0, day: 5 });
      expect(await store.consume(req({ hourStart: H + 7200, dayLimit: 6 }))).toEqual({
        allowed: true,
        hour: 1,
        day: 6,
      });
    });

    it('starts a new day window', async () => {
      for (let i = 0; i < 3; i++) await store.consume(req());
      expect(await store.consume(req({ hourStart: H + 86_400, dayStart: D + 86_400 }))).toEqual({
        allowed: true,
        hour: 1,
        day: 1,
      });
    });

    it("goes on counting when the table's timezone changes, either way, and starts the new zone's next window afresh (regression: a new timezone gave every key a fresh day)", async () => {
      const limited = (windows: Partial<ConsumeRequest>) => req({ ...windows, hourLimit: 100, dayLimit: 5 });
      const utc = { hourStart: H, dayStart: D, zone: 'UTC' };
      for (let i = 0; i < 3; i++) await store.consume(limited(utc));
      // A zone 7 hours east: its day began 7 hours before UTC's, and has not ended.
      const east = { hourStart: H, dayStart: D - 7 * 3600, zone: 'Asia/Ho_Chi_Minh' };
      expect(await store.consume(limited(east))).toEqual({ allowed: true, hour: 4, day: 4 });
      expect(await store.usage(keyHash, [{ counterId: 'row', ...east }])).toEqual([{ hour: 4, day: 4 }]);
      // And back: UTC's day began 7 hours after that one, which has not ended either.
      expect(await store.consume(limited(utc))).toEqual({ allowed: true, hour: 5, day: 5 });
      expect(await store.consume(limited(utc))).toEqual({ allowed: false, hour: 5, day: 5 });
      // Units counted elsewhere in the east zone's bounds are this day's too.
      const entry = { keyHash, counterId: 'row', ...east, hour: 1, day: 1, expireAt: (D + 3 * 86_400) * 1000 };
      await store.merge([entry]);
      expect(await store.usage(keyHash, [{ counterId: 'row', ...utc }])).toEqual([{ hour: 6, day: 6 }]);
      // The next UTC day is a new one, as is a day of another zone that began more than a day later.
      const nextDay = { hourStart: H + 86_400, dayStart: D + 86_400, zone: 'UTC' };
      expect(await store.consume(limited(nextDay))).toEqual({ allowed: true, hour: 1, day: 1 });
      const later = { hourStart: H + 3 * 86_400, dayStart: D + 3 * 86_400 - 7 * 3600, zone: 'Asia/Ho_Chi_Minh' };
      expect(await store.consume(limited(later))).toEqual({ allowed: true, hour: 1, day: 1 });
    });

    it("moves a counter to a new zone's bounds even on a refusal, so the new zone's next day starts afresh (regression: a key spent at the change stayed refused a day longer)", async () => {
      const limited = (windows: Partial<ConsumeRequest>) => req({ ...windows, hourLimit: 100, dayLimit: 2 });
      for (let i = 0; i < 2; i++) await store.consume(limited({ hourStart: H, dayStart: D, zone: 'UTC' }));
      // Honolulu's day began 14 hours before UTC's: still this one, and spent.
      const honolulu = { hourStart: H, dayStart: D - 14 * 3600, zone: 'Pacific/Honolulu' };
      expect(await store.consume(limited(honolulu))).toEqual({ allowed: false, hour: 2, day: 2 });
      const next = { hourStart: H + 24 * 3600, dayStart: D + 10 * 3600, zone: 'Pacific/Honolulu' };
      expect(await store.consume(limited(next))).toEqual({ allowed: true, hour: 1, day: 1 });
    });

    it('never moves a window back: an instance whose clock lags counts in the newer window', async () => {
      await store.consume(req({ hourStart: H + 3600 }));
      expect(await store.consume(req({ hourStart: H }))).toEqual({ allowed: true, hour: 2, day: 2 });
      expect(await store.usage(keyHash, [{ counterId: 'row', hourStart: H + 3600, dayStart: D }])).toEqual([
        { hour: 2, day: 2 },
      ]);
    });

    it('counts past the limits when forced (shadow rows)', async () => {
      for (let i = 0; i < 7; i++) expect((await store.consume(req({ force: true }))).allowed).toBe(true);
      expect(await store.usage(keyHash, [{ counterId: 'row', hourStart: H, dayStart: D }])).toEqual([
        { hour: 7, day: 7 },
      ]);
    });

    it('keeps rows and keys apart', async () => {
      await store.consume(req());
      await store.consume(req({ counterId: 'other' }));
      await store.consume(req({ keyHash: keyHash + 'b' }));
      expect(
        await store.usage(keyHash, [
          { counterId: 'row', hourStart: H, dayStart: D },
          { counterId: 'other', hourStart: H, dayStart: D },
          { counterId: 'none', hourStart: H, dayStart: D },
        ]),
      ).toEqual([
        { hour: 1, day: 1 },
        { hour: 1, day: 1 },
        { hour: 0, day: 0 },
      ]);
    });

    it('reports usage of past windows as 0', async () => {
      await store.consume(req());
      expect(await store.usage(keyHash, [{ counterId: 'row', hourStart: H + 3600, dayStart: D + 86_400 }])).toEqual([
        { hour: 0, day: 0 },
      ]);
    });

    it('resets a key on the given rows', async () => {
      for (let i = 0; i < 3; i++) await store.consume(req());
      await store.consume(req({ counterId: 'kept' }));
      await store.reset(keyHash, ['row']);
      expect(await store.consume(req())).toEqual({ allowed: true, hour: 1, day: 1 });
      expect(await store.usage(keyHash, [{ counterId: 'kept', hourStart: H, dayStart: D }])).toEqual([
        { hour: 1, day: 1 },
      ]);
    });

    it('merges units counted elsewhere into the windows they name, past the limits, leaving later windows alone', async () => {
      await store.consume(req());
      const entry = {
        keyHash,
        counterId: 'row',
        hourStart: H,
        hour: 4,
        dayStart: D,
        day: 4,
        expireAt: (D + 3 * 86_400) * 1000,
      };
      await store.merge([entry, { ...entry, counterId: 'fresh', hour: 2, day: 3 }]);
      expect(
        await store.usage(keyHash, [
          { counterId: 'row', hourStart: H, dayStart: D },
          { counterId: 'fresh', hourStart: H, dayStart: D },
        ]),
      ).toEqual([
        { hour: 5, day: 5 },
        { hour: 2, day: 3 },
      ]);
      expect(await store.consume(req())).toEqual({ allowed: false, hour: 5, day: 5 });
      // Units of an hour that is over are not added to the next one, which the counter is already in.
      await store.consume(req({ counterId: 'moved', hourStart: H + 3600 }));
      await store.merge([{ ...entry, counterId: 'moved', hour: 3, day: 3 }]);
      expect(await store.usage(keyHash, [{ counterId: 'moved', hourStart: H + 3600, dayStart: D }])).toEqual([
        { hour: 1, day: 4 },
      ]);
      // Nor units of a day that is over to the next day.
      await store.consume(req({ counterId: 'next-day', hourStart: H + 86_400, dayStart: D + 86_400 }));
      await store.merge([{ ...entry, counterId: 'next-day', hour: 3, day: 3 }]);
      expect(
        await store.usage(keyHash, [{ counterId: 'next-day', hourStart: H + 86_400, dayStart: D + 86_400 }]),
      ).toEqual([{ hour: 1, day: 1 }]);
    });

    it('admits exactly the limit under concurrent requests', async () => {
      const results = await Promise.all(
        Array.from({ length: 200 }, () => store.consume(req({ hourLimit: 50, dayLimit: 60 }))),
      );
      expect(results.filter((r) => r.allowed)).toHaveLength(50);
      expect(await store.usage(keyHash, [{ counterId: 'row', hourStart: H, dayStart: D }])).toEqual([
        { hour: 50, day: 50 },
      ]);
    });
  });
}
