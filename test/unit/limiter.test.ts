import { beforeEach, describe, expect, it } from 'vitest';
import { parseLimits } from '../../src/config/load-limits.js';
import type { LimitRow, LimitTable } from '../../src/limits/limit-table.js';
import { rateLimitHeaders, retryAfterHeader } from '../../src/limits/headers.js';
import { Limiter, type Decision, type FailureMode } from '../../src/limits/limiter.js';
import { MemoryCounterStore } from '../../src/limits/memory-store.js';
import {
  MergeFailedError,
  StoreUnavailableError,
  type ConsumeRequest,
  type CounterStore,
  type Counts,
} from '../../src/limits/store.js';
import { FakeClock } from '../helpers/clock.js';

const TABLE = `
timezone: UTC
limits:
  - { name: Small, route: "GET /small", per_hour: 3, per_day: 5 }
  - { name: Shadowed, route: "GET /shadow", per_hour: 2, per_day: 10, shadow: true }
`;

function table(): LimitTable {
  const result = parseLimits(TABLE, 'limits.yaml');
  if (!result.ok) throw new Error('invalid test table');
  return result.table;
}

/** A store wrapper that counts calls and can be switched to fail like an unreachable Redis. */
class ObservedStore implements CounterStore {
  calls = 0;
  failing: StoreUnavailableError | Error | undefined;
  constructor(private readonly inner: CounterStore) {}
  async consume(r: ConsumeRequest): Promise<Counts> {
    this.calls++;
    if (this.failing) throw this.failing;
    return this.inner.consume(r);
  }
  merges: Array<Parameters<CounterStore['merge']>[0]> = [];
  async merge(entries: Parameters<CounterStore['merge']>[0]): Promise<void> {
    this.merges.push(entries);
    if (this.failing) throw this.failing;
    return this.inner.merge(entries);
  }
  usage = (...args: Parameters<CounterStore['usage']>) => this.inner.usage(...args);
  reset = (...args: Parameters<CounterStore['reset']>) => this.inner.reset(...args);
}

type Counted = Extract<Decision, { kind: 'counted' }>;
const counted = (d: Decision): Counted => {
  if (d.kind !== 'counted') throw new Error(`not counted: ${d.kind}`);
  return d;
};

describe('Limiter', () => {
  let clock: FakeClock;
  let store: ObservedStore;
  let insurance: MemoryCounterStore;
  let t: LimitTable;
  let small: LimitRow;
  let shadow: LimitRow;

  const make = (failureMode: FailureMode = 'insurance') =>
    new Limiter({ store, insurance, failureMode, clock, retryStoreAfterMs: 1000 });
  const check = (limiter: Limiter, row: LimitRow, keyHash = 'key') =>
    limiter.check({ keyHash, row, limits: row.limits, calendar: t.calendar });

  beforeEach(() => {
    clock = new FakeClock('2026-11-22T10:15:00Z');
    store = new ObservedStore(new MemoryCounterStore({ now: () => clock.now() }));
    insurance = new MemoryCounterStore({ now: () => clock.now() });
    t = table();
    [small, shadow] = t.rows as [LimitRow, LimitRow];
  });

  it('admits up to the hour limit, then refuses with the hour spent', async () => {
    const limiter = make();
    for (let i = 1; i <= 3; i++)
      expect(counted(await check(limiter, small))).toMatchObject({
        allowed: true,
        hour: { used: i, remaining: 3 - i },
        day: { used: i },
      });
    const refused = counted(await check(limiter, small));
    expect(refused).toMatchObject({
      allowed: false,
      spent: 'hour',
      hour: { remaining: 0 },
      day: { used: 3, remaining: 2 },
    });
    expect(retryAfterHeader(refused, clock.now())).toEqual(['Retry-After', String(45 * 60)]);
  });

  it('refuses a spent key from memory until its window ends, without asking the store', async () => {
    const limiter = make();
    for (let i = 0; i < 4; i++) await check(limiter, small);
    const callsAfterFirstRefusal = store.calls;
    for (let i = 0; i < 50; i++)
      expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'cache', day: { used: 3 } });
    expect(store.calls).toBe(callsAfterFirstRefusal);
    clock.set('2026-11-22T11:00:00Z');
    expect(counted(await check(limiter, small))).toMatchObject({
      allowed: true,
      source: 'store',
      hour: { used: 1 },
      day: { used: 4 },
    });
  });

  it('reports a spent day, with Retry-After until the day ends, and an hour of 0 used in later hours', async () => {
    const limiter = make();
    for (let i = 0; i < 3; i++) await check(limiter, small);
    clock.set('2026-11-22T11:05:00Z');
    for (let i = 0; i < 2; i++) await check(limiter, small);
    const refused = counted(await check(limiter, small));
    expect(refused).toMatchObject({ allowed: false, spent: 'day', hour: { used: 2 }, day: { used: 5, remaining: 0 } });
    expect(retryAfterHeader(refused, clock.now())[1]).toBe(String((24 - 11) * 3600 - 5 * 60));
    clock.set('2026-11-22T15:00:00Z');
    const later = counted(await check(limiter, small));
    expect(later).toMatchObject({ allowed: false, source: 'cache', spent: 'day', hour: { used: 0, remaining: 3 } });
    clock.set('2026-11-23T00:00:00Z');
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: true, hour: { used: 1 }, day: { used: 1 } });
  });

  it('never refuses a shadow row, and says which windows it went past', async () => {
    const limiter = make();
    const decisions = [];
    for (let i = 0; i < 4; i++) decisions.push(counted(await check(limiter, shadow)));
    expect(decisions.map((d) => [d.allowed, d.spent, d.hour.used])).toEqual([
      [true, undefined, 1],
      [true, undefined, 2],
      [true, 'hour', 3],
      [true, 'hour', 4],
    ]);
    expect(decisions[3]?.hour.remaining).toBe(0);
  });

  it('forgets remembered refusals of a key when its counters are reset elsewhere', async () => {
    const limiter = make();
    for (let i = 0; i < 4; i++) await check(limiter, small);
    await store.reset('key', [small.counterId]);
    expect(counted(await check(limiter, small)).allowed).toBe(false); // still remembered
    await limiter.forgetKey('key', [small]);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: true, hour: { used: 1 } });
  });

  it('asks the store again for a key whose plan changed (regression: an upgraded key stayed refused from memory)', async () => {
    const limiter = make();
    for (let i = 0; i < 4; i++) await check(limiter, small);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'cache' });
    const premium = { perHour: 15, perDay: 25 };
    const upgraded = counted(
      await limiter.check({ keyHash: 'key', row: small, limits: premium, calendar: t.calendar }),
    );
    expect(upgraded).toMatchObject({ allowed: true, source: 'store', hour: { limit: 15, used: 4, remaining: 11 } });
  });

  it('forgets the insurance counters of a key reset elsewhere', async () => {
    const limiter = make('insurance');
    store.failing = new StoreUnavailableError('connection', 'down');
    for (let i = 0; i < 3; i++) await check(limiter, small);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'insurance' });
    await limiter.forgetKey('key', [small]);
    expect(counted(await check(limiter, small))).toMatchObject({
      allowed: true,
      source: 'insurance',
      hour: { used: 1 },
    });
  });

  it('keeps counting in the insurance store while the store is away, and goes back when it returns', async () => {
    const limiter = make('insurance');
    await check(limiter, small);
    store.failing = new StoreUnavailableError('connection', 'down');
    const during = counted(await check(limiter, small));
    expect(during).toMatchObject({ allowed: true, source: 'insurance', hour: { used: 1 } });
    expect(limiter.storeTrouble()).toBe('down');
    const callsWhileDown = store.calls;
    for (let i = 0; i < 2; i++) await check(limiter, small);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'insurance' });
    expect(store.calls).toBe(callsWhileDown); // no request waits on a store known to be down
    store.failing = undefined;
    clock.advance(1001);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: true, source: 'store', hour: { used: 2 } });
    expect(limiter.storeTrouble()).toBeUndefined();
  });

  it('decides a request on a part of the store that is away (a Cluster master) without the store, and asks the store for the next: the rest still counts', async () => {
    const limiter = make('insurance');
    store.failing = new StoreUnavailableError('connection', 'master away', { part: true });
    expect(counted(await check(limiter, small, 'on-the-master-away'))).toMatchObject({
      allowed: true,
      source: 'insurance',
    });
    expect(limiter.storeTrouble()).toBeUndefined();
    store.failing = undefined;
    const calls = store.calls;
    expect(counted(await check(limiter, small, 'elsewhere'))).toMatchObject({ allowed: true, source: 'store' });
    expect(store.calls).toBe(calls + 1);
  });

  /** Key `a` admitted while a part of the store was away, then every merge failing; returns what makes merges work again. */
  const admittedWhileMergesFail = async (limiter: Limiter): Promise<() => void> => {
    store.failing = new StoreUnavailableError('connection', 'master away', { part: true });
    await check(limiter, small, 'a');
    store.failing = undefined;
    const mergeWorks = store.merge.bind(store);
    store.merge = async (entries) => {
      store.merges.push(entries);
      throw new MergeFailedError(new StoreUnavailableError('connection', 'master away', { part: true }), entries);
    };
    return () => {
      store.merge = mergeWorks;
    };
  };

  it('tries a failed merge again with a request only once retryStoreAfterMs has passed (a part of the store can stay away while the rest answers)', async () => {
    const limiter = make('insurance');
    const mergesWork = await admittedWhileMergesFail(limiter);
    await check(limiter, small, 'b');
    await limiter.merged();
    await check(limiter, small, 'c');
    await limiter.merged();
    expect(store.merges).toHaveLength(1);
    mergesWork();
    clock.advance(1000);
    await check(limiter, small, 'd');
    await limiter.merged();
    expect(store.merges).toEqual([
      [expect.objectContaining({ keyHash: 'a', hour: 1 })],
      [expect.objectContaining({ keyHash: 'a', hour: 1 })],
    ]);
  });

  it('hands the units still waiting to the store at shutdown (mergeWaiting), whenever the last merge failed, and says how many counters are left', async () => {
    const limiter = make('insurance');
    const mergesWork = await admittedWhileMergesFail(limiter);
    await check(limiter, small, 'b'); // the first merge fails: the next waits for a request a second later
    await limiter.merged();
    expect(await limiter.mergeWaiting()).toBe(1); // tried at once, failed again: one counter left
    expect(store.merges).toHaveLength(2);
    mergesWork();
    expect(await limiter.mergeWaiting()).toBe(0);
    expect(store.merges).toHaveLength(3);
    expect((await limiter.usage('a', [small], t.calendar)).rows).toEqual([{ hour: 1, day: 1 }]);
    expect(await limiter.mergeWaiting()).toBe(0); // nothing waits: nothing is sent
    expect(store.merges).toHaveLength(3);
  });

  /** An insurance-mode limiter whose observer records what it reports of merges. */
  function reportingMerges(): { limiter: Limiter; merged: Array<[number, string]> } {
    const merged: Array<[number, string]> = [];
    const limiter = new Limiter({
      store,
      insurance,
      failureMode: 'insurance',
      clock,
      retryStoreAfterMs: 1000,
      observer: {
        storeError: () => {},
        fallback: () => {},
        storeCall: () => {},
        merged: (n, r) => merged.push([n, r]),
      },
    });
    return { limiter, merged };
  }

  it('reports the units of a merge that failed part-way by what became of them: added, kept for another try, or perhaps added (the metric of docs/operations.md "Metrics")', async () => {
    const { limiter, merged } = reportingMerges();
    store.failing = new StoreUnavailableError('connection', 'master away', { part: true });
    for (const keyHash of ['added', 'kept', 'perhaps']) await check(limiter, small, keyHash);
    store.failing = undefined;
    store.merge = async (entries) => {
      store.merges.push(entries);
      const failure = new StoreUnavailableError('connection', 'master away', { part: true });
      throw new MergeFailedError(
        failure,
        entries.filter((e) => e.keyHash === 'kept'),
        1,
      );
    };
    await check(limiter, small, 'other');
    await limiter.merged();
    expect(merged).toEqual([
      [1, 'ok'],
      [1, 'failed'],
    ]);
  });

  it("leaves the counters a failed merge's store keeps to send again (MergeFailedError's kept) to the store to report, and reports them neither ok nor failed itself", async () => {
    const { limiter, merged } = reportingMerges();
    store.failing = new StoreUnavailableError('connection', 'down');
    for (const keyHash of ['added', 'retry', 'kept', 'perhaps']) await check(limiter, small, keyHash);
    store.failing = undefined;
    clock.advance(1001);
    store.merge = async (entries) => {
      store.merges.push(entries);
      // One added, one never sent, one kept by the store, one perhaps added.
      throw new MergeFailedError(
        new StoreUnavailableError('timeout', 'Redis command timed out'),
        entries.filter((e) => e.keyHash === 'retry'),
        1,
        1,
      );
    };
    await check(limiter, small, 'other');
    await limiter.merged();
    expect(merged).toEqual([
      [1, 'ok'],
      [1, 'failed'],
    ]);
    // Only the one never sent waits here.
    expect(
      store.merges
        .at(-1)
        ?.map((e) => e.keyHash)
        .sort(),
    ).toEqual(['added', 'kept', 'perhaps', 'retry']);
    store.merge = async (entries) => {
      store.merges.push(entries);
    };
    expect(await limiter.mergeWaiting()).toBe(0);
    expect(store.merges.at(-1)?.map((e) => e.keyHash)).toEqual(['retry']);
  });

  it('adds what it admitted from the insurance counters to the store once the store answers again, once', async () => {
    const limiter = make('insurance');
    await check(limiter, small); // 1 in the store
    store.failing = new StoreUnavailableError('connection', 'down');
    for (let i = 0; i < 2; i++)
      expect(counted(await check(limiter, small))).toMatchObject({ allowed: true, source: 'insurance' });
    await check(limiter, shadow, 'other'); // a shadow row's units count too
    expect(store.merges).toEqual([]); // nothing is sent while the store is away

    store.failing = undefined;
    clock.advance(1001);
    // This request is counted by the store as usual (2), and the outage's 2 units follow it.
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: true, source: 'store', hour: { used: 2 } });
    await limiter.merged();
    expect(store.merges).toHaveLength(1);
    const windows = t.calendar.at(clock.now());
    expect(store.merges[0]).toEqual([
      expect.objectContaining({
        keyHash: 'key',
        counterId: small.counterId,
        hourStart: windows.hourStart / 1000,
        hour: 2,
        dayStart: windows.dayStart / 1000,
        day: 2,
      }),
      expect.objectContaining({ keyHash: 'other', counterId: shadow.counterId, hour: 1, day: 1 }),
    ]);
    // The store now holds every admission: 4 of 3 used, so the next request is refused.
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'store', hour: { used: 4 } });
    await limiter.merged();
    expect(store.merges).toHaveLength(1); // merged once, not again
  });

  it('does not repeat a merge that failed (it may have counted), and drops the units of a key reset elsewhere', async () => {
    const limiter = make('insurance');
    store.failing = new StoreUnavailableError('connection', 'down');
    await check(limiter, small);
    await check(limiter, small, 'reset-me');
    await limiter.forgetKey('reset-me', [small]);
    store.failing = undefined;
    clock.advance(1001);
    const mergeFails = store.merge.bind(store);
    store.merge = async (entries) => {
      store.merges.push(entries);
      throw new StoreUnavailableError('timeout', 'lost');
    };
    await check(limiter, small, 'third');
    await limiter.merged();
    expect(store.merges).toEqual([[expect.objectContaining({ keyHash: 'key', hour: 1 })]]);
    store.merge = mergeFails;
    await check(limiter, small, 'third');
    await limiter.merged();
    expect(store.merges).toHaveLength(1);
  });

  it('tries again the units a failed merge never sent, together with those counted since', async () => {
    const limiter = make('insurance');
    const down = new StoreUnavailableError('connection', 'down');
    store.failing = down;
    await check(limiter, small, 'a');
    await check(limiter, small, 'b');
    store.failing = undefined;
    clock.advance(1001);
    const mergeWorks = store.merge.bind(store);
    store.merge = async (entries) => {
      store.merges.push(entries);
      // The first wave failed: 'a' may be in, 'b' was never sent.
      throw new MergeFailedError(
        new StoreUnavailableError('connection', 'down'),
        entries.filter((e) => e.keyHash === 'b'),
      );
    };
    await check(limiter, small, 'c');
    await limiter.merged();
    store.merge = mergeWorks;
    // Away again: one more unit of 'b' from the insurance counters.
    store.failing = down;
    await check(limiter, small, 'd');
    expect(counted(await check(limiter, small, 'b'))).toMatchObject({ allowed: true, source: 'insurance' });
    store.failing = undefined;
    clock.advance(1001);
    await check(limiter, small, 'e');
    await limiter.merged();
    expect(store.merges).toHaveLength(2);
    expect(store.merges[1]).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ keyHash: 'b', hour: 2, day: 2 }),
        expect.objectContaining({ keyHash: 'd', hour: 1 }),
      ]),
    );
    expect(store.merges[1]?.some((e) => e.keyHash === 'a')).toBe(false);
  });

  it('lets a merge in flight land before a reset of its key (regression: the merge undid the reset)', async () => {
    const limiter = make('insurance');
    store.failing = new StoreUnavailableError('connection', 'down');
    await check(limiter, small);
    store.failing = undefined;
    clock.advance(1001);
    const order: string[] = [];
    let release = (): void => {};
    const gate = new Promise<void>((resolve) => (release = resolve));
    const mergeWorks = store.merge.bind(store);
    store.merge = async (entries) => {
      await gate;
      await mergeWorks(entries);
      order.push('merge');
    };
    const resetWorks = store.reset;
    store.reset = async (...args) => {
      order.push('reset');
      return resetWorks(...args);
    };
    await check(limiter, small, 'other'); // back: the merge of 'key' starts, and waits at the gate
    const resetting = limiter.reset('key', [small]);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(order).toEqual([]);
    release();
    await resetting;
    expect(order).toEqual(['merge', 'reset']);
    const windows = t.calendar.at(clock.now());
    expect(
      await store.usage('key', [
        { counterId: small.counterId, hourStart: windows.hourStart / 1000, dayStart: windows.dayStart / 1000 },
      ]),
    ).toEqual([{ hour: 0, day: 0 }]);
  });

  it('keeps the units waiting for the store of a key whose reset failed (regression: they were dropped all the same)', async () => {
    const limiter = make('insurance');
    const down = new StoreUnavailableError('connection', 'down');
    store.failing = down;
    await check(limiter, small);
    const resetWorks = store.reset;
    store.reset = async () => {
      throw down;
    };
    await expect(limiter.reset('key', [small])).rejects.toBe(down);
    store.reset = resetWorks;
    store.failing = undefined;
    clock.advance(1001);
    await check(limiter, small, 'other');
    await limiter.merged();
    expect(store.merges).toEqual([[expect.objectContaining({ keyHash: 'key', hour: 1, day: 1 })]]);
  });

  it('keeps the insurance counts and remembered refusals of a key whose reset failed (regression: a failed reset gave the key a fresh local quota)', async () => {
    const limiter = make('insurance');
    const down = new StoreUnavailableError('connection', 'down');
    for (let i = 0; i < 4; i++) await check(limiter, small, 'remembered');
    store.failing = down;
    for (let i = 0; i < 3; i++) await check(limiter, small);
    store.reset = async () => {
      throw down;
    };
    await expect(limiter.reset('key', [small])).rejects.toBe(down);
    await expect(limiter.reset('remembered', [small])).rejects.toBe(down);
    expect(counted(await check(limiter, small))).toMatchObject({ allowed: false, source: 'insurance' });
    store.failing = undefined;
    expect(counted(await check(limiter, small, 'remembered'))).toMatchObject({ allowed: false, source: 'cache' });
  });

  it('admits without counting in open mode, and answers unavailable in closed mode', async () => {
    store.failing = new StoreUnavailableError('timeout', 'slow');
    const open = make('open');
    for (let i = 0; i < 5; i++) expect(await check(open, small)).toEqual({ kind: 'uncounted', allowed: true });
    expect(await check(make('closed'), small)).toEqual({ kind: 'unavailable', allowed: false });
    // Nothing of them was counted anywhere, nor is merged once the store is back.
    store.failing = undefined;
    clock.advance(1000);
    expect(counted(await check(open, small))).toMatchObject({ allowed: true, source: 'store', hour: { used: 1 } });
    expect(store.merges).toEqual([]);
  });

  it('admits a shadow row without counting in closed mode (regression: a row "never refused" got the 503)', async () => {
    store.failing = new StoreUnavailableError('connection', 'down');
    expect(await check(make('closed'), shadow)).toEqual({ kind: 'uncounted', allowed: true });
  });

  it('remembers at most maxSpentEntries spent pairs; a forgotten one simply asks the store again', async () => {
    const limiter = new Limiter({ store, insurance, failureMode: 'insurance', clock, maxSpentEntries: 10 });
    const spend = async (keyHash: string): Promise<void> => {
      for (let i = 0; i < 4; i++) await check(limiter, small, keyHash);
    };
    for (let k = 0; k < 20; k++) await spend(`many-${k}`);
    const calls = store.calls;
    for (let k = 10; k < 20; k++) expect(counted(await check(limiter, small, `many-${k}`)).source).toBe('cache');
    expect(store.calls).toBe(calls);
    const oldest = counted(await check(limiter, small, 'many-0'));
    expect(oldest).toMatchObject({ allowed: false, source: 'store' });
    expect(store.calls).toBe(calls + 1);
  });

  it('lets a programming error through rather than reading it as a store outage', async () => {
    store.failing = new TypeError('bug');
    await expect(check(make(), small)).rejects.toThrow('bug');
  });

  it('answers a failure of its own steps with a rejected promise, never a throw (as an async function would)', async () => {
    const throwing: CounterStore = {
      ...store,
      consume: () => {
        throw new TypeError('thrown at once');
      },
      merge: store.merge.bind(store),
    };
    const limiter = new Limiter({ store: throwing, insurance, failureMode: 'insurance', clock });
    let answer: Promise<Decision> | undefined;
    expect(() => {
      answer = check(limiter, small);
    }).not.toThrow();
    await expect(answer).rejects.toThrow('thrown at once');
  });
});

describe('usage headers', () => {
  it('carry the numbers of README "Headers and answers" in both syntaxes', async () => {
    const clock = new FakeClock('2026-11-22T10:30:00Z');
    const t = table();
    const row = t.rows[0]!;
    const limiter = new Limiter({ store: new MemoryCounterStore(), failureMode: 'closed', clock });
    const d = counted(await limiter.check({ keyHash: 'h', row, limits: row.limits, calendar: t.calendar }));
    expect(rateLimitHeaders(d, clock.now())).toEqual([
      ['X-RateLimit-Limit-Hour', '3'],
      ['X-RateLimit-Remaining-Hour', '2'],
      ['X-RateLimit-Limit-Day', '5'],
      ['X-RateLimit-Remaining-Day', '4'],
      ['RateLimit-Policy', '"hour";q=3;w=3600, "day";q=5;w=86400'],
      ['RateLimit', '"hour";r=2;t=1800, "day";r=4;t=48600'],
    ]);
  });

  it('give a Retry-After of the later reset when both windows are spent, and at least 1', () => {
    const base = { kind: 'counted' as const, allowed: false, source: 'store' as const, at: 0 };
    const hour = { limit: 1, used: 1, remaining: 0, resetAt: 10_000 };
    const day = { limit: 1, used: 1, remaining: 0, resetAt: 50_000 };
    expect(retryAfterHeader({ ...base, spent: 'both', hour, day }, 0)).toEqual(['Retry-After', '50']);
    expect(retryAfterHeader({ ...base, spent: 'hour', hour, day }, 9_999)).toEqual(['Retry-After', '1']);
    expect(retryAfterHeader({ ...base, spent: 'hour', hour, day }, 10_000)).toEqual(['Retry-After', '1']);
  });
});
