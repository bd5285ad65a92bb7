import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import {
  CONSUME_SCRIPT,
  countStep,
  MERGE_SCRIPT,
  mergeArgs,
  mergeStep,
  pushConsumeArgs,
  RECEIPTS_KEPT,
  type Receipt,
  type StoredCounter,
} from '../../src/limits/count-rules.js';
import type { ConsumeRequest, MergeEntry } from '../../src/limits/store.js';
import { redisClient, uniquePrefix } from '../helpers/redis.js';
import { request } from '../helpers/store-contract.js';

/**
 * Each Lua script against the TypeScript rule it mirrors, on random counters in a real Redis:
 * the in-memory store and the Redis store must count alike (limits/count-rules.ts).
 */

const client = redisClient();
const prefix = uniquePrefix('rules');
afterAll(() => client.disconnect());

const H = Math.floor(Date.now() / 3_600_000) * 3600;
const D = H - (H % 86_400);
const EXPIRE_AT = (D + 3 * 86_400) * 1000;
let run = 0;

/**
 * Window starts around the current hour and day: the windows before and after, and starts that a
 * new timezone moved by less than a window (half an hour, 7 hours) or by just that much (a day
 * that lost an hour to daylight saving time is 23 hours long).
 */
const hourStarts = fc.constantFrom(-7200, -3600, -1800, 0, 1800, 3600, 7200).map((o) => H + o);
const dayStarts = fc.constantFrom(-86_400, -82_800, -82_799, -25_200, 0, 25_200, 82_800, 86_400).map((o) => D + o);
/** The table's timezone a counter's windows or a call's are of: the same, another, or none given. */
const zones = fc.constantFrom<string | undefined>(undefined, 'Zone/A', 'Zone/B');
const stored = fc.option(
  fc.record({ hourStart: hourStarts, hour: fc.nat(6), dayStart: dayStarts, day: fc.nat(8), zone: zones }),
  { nil: undefined },
);
/** This instance's field, and another instance's (the script must never touch it). */
const FIELD = 'rc:this';
const OTHER_FIELD = 'rc:other';
/** The sequence number of the call under test: receipts already in a counter are older. */
const SEQ = 1000;
const receiptOf = (seq: number, oldestUnsettled: number): Receipt => ({ field: FIELD, seq, oldestUnsettled });
/**
 * Receipts already in a counter, newest first: sequence numbers below SEQ, descending, but for one
 * pair now and then that ran the other way round (a call redirected on a Cluster runs behind
 * later ones).
 */
const receipts = fc
  .record({
    entries: fc.array(fc.record({ gap: fc.integer({ min: 1, max: 9 }), units: fc.integer({ min: 1, max: 3 }) }), {
      maxLength: 10,
    }),
    swapAt: fc.option(fc.nat(), { nil: undefined }),
  })
  .map(({ entries, swapAt }) => {
    let seq = SEQ;
    const rc = entries.map(({ gap, units }) => ({ seq: (seq -= gap), units }));
    if (swapAt !== undefined && rc.length >= 2) {
      const k = swapAt % (rc.length - 1);
      [rc[k], rc[k + 1]] = [rc[k + 1] as (typeof rc)[number], rc[k] as (typeof rc)[number]];
    }
    return rc;
  });
/** Receipts as the script writes them: `seq:units:hourStart:dayStart,` (the windows the units went in). */
type Receipts = ReadonlyArray<{ seq: number; units: number; hourStart?: number; dayStart?: number }>;
const receiptText = (rc: Receipts): string =>
  rc.map((r) => `${r.seq}:${r.units}:${r.hourStart ?? 0}:${r.dayStart ?? 0},`).join('');
const windows = fc.record({ hourStart: hourStarts, dayStart: dayStarts, zone: zones });
const otherZone = (a: string | undefined, b: string | undefined): boolean =>
  a !== undefined && b !== undefined && a !== b;

async function setCounter(key: string, counter: StoredCounter | undefined, rc: Receipts): Promise<void> {
  if (!counter) return;
  const { hourStart, hour, dayStart, day, zone } = counter;
  await client.hset(key, {
    hs: hourStart,
    hc: hour,
    ds: dayStart,
    dc: day,
    [FIELD]: receiptText(rc),
    [OTHER_FIELD]: '7:1,3:2,',
    ...(zone === undefined ? {} : { tz: zone }),
  });
}

/** A request in the current windows (this file's H and D). */
const inTheWindows = (over: Partial<ConsumeRequest> = {}): ConsumeRequest =>
  request({ hourStart: H, dayStart: D, expireAt: EXPIRE_AT, ...over });
const nineInAWindow = (): ConsumeRequest => inTheWindows({ hourLimit: 9, dayLimit: 9 });

const fields = (c: StoredCounter): string[] => [c.hourStart, c.hour, c.dayStart, c.day].map(String);

describe('CONSUME_SCRIPT', () => {
  it('counts every request of a call as countStep does, one after the other, recording the call receipt in the counters it added to', async () => {
    const call = fc.record({
      counters: fc.array(fc.record({ stored, rc: receipts }), { minLength: 1, maxLength: 3 }),
      oldestUnsettled: fc.integer({ min: SEQ - 100, max: SEQ }),
      windows,
      requests: fc.array(
        fc.record({ counter: fc.nat(2), hourLimit: fc.nat(6), dayLimit: fc.nat(8), force: fc.boolean() }),
        { minLength: 1, maxLength: 6 },
      ),
    });
    await fc.assert(
      fc.asyncProperty(call, async ({ counters, oldestUnsettled, windows: w, requests }) => {
        const keys = counters.map((_, i) => `${prefix}c${++run}:${i}`);
        for (const [i, c] of counters.entries()) await setCounter(keys[i] as string, c.stored, c.rc);
        const items = requests.map((r) => ({
          key: keys[r.counter % counters.length] as string,
          index: r.counter % counters.length,
          request: { keyHash: 'k', counterId: 'row', ...w, ...r, expireAt: EXPIRE_AT } satisfies ConsumeRequest,
        }));
        const keysThenArgs: Array<string | number> = items.map((item) => item.key);
        pushConsumeArgs(keysThenArgs, items, receiptOf(SEQ, oldestUnsettled));
        const reply = (await client.eval(CONSUME_SCRIPT, items.length, ...keysThenArgs)) as number[];

        // The rule, one request after the other, on the same counters.
        const state = counters.map((c) => c.stored);
        const added = counters.map(() => 0);
        const moved = counters.map(() => false);
        const expected: number[] = [];
        for (const { index, request } of items) {
          const next = countStep(state[index], request);
          if (next.allowed || next.moved) {
            const { hourStart, hour, dayStart, day, zone } = next;
            state[index] = { hourStart, hour, dayStart, day, zone };
          }
          if (next.moved) moved[index] = true;
          if (next.allowed) added[index] = (added[index] as number) + 1;
          expected.push(next.allowed ? 1 : 0, next.hour, next.day);
        }
        expect(reply).toEqual(expected);

        for (const [i, c] of counters.entries()) {
          const key = keys[i] as string;
          const now = await client.hmget(key, 'hs', 'hc', 'ds', 'dc', FIELD, OTHER_FIELD, 'tz');
          const units = added[i] as number;
          const other = c.stored ? '7:1,3:2,' : null;
          if (units === 0 && moved[i]) {
            // Refusals only, but the counter moved to the call's zone: its bounds, counts and zone, no receipt.
            const after = state[i] as StoredCounter;
            expect(now).toEqual([...fields(after), receiptText(c.rc), other, after.zone ?? null]);
            expect(await client.pexpiretime(key)).toBe(EXPIRE_AT);
            continue;
          }
          if (units === 0) {
            // A counter of refusals only is not written at all.
            expect(now).toEqual(
              c.stored
                ? [...fields(c.stored), receiptText(c.rc), other, c.stored.zone ?? null]
                : [null, null, null, null, null, null, null],
            );
            continue;
          }
          // The call's receipt in front; of the ones before, those of calls still unsettled stay.
          const kept = (c.stored ? c.rc : []).filter((r) => r.seq >= oldestUnsettled);
          const after = state[i] as StoredCounter;
          const rc = receiptText([{ seq: SEQ, units, hourStart: after.hourStart, dayStart: after.dayStart }, ...kept]);
          expect(now).toEqual([...fields(after), rc, other, after.zone ?? null]);
          // The counter expires after the day it was moved to (or a new zone's); one already in that day keeps its expiry.
          const newDay = !c.stored || otherZone(c.stored.zone, w.zone) || c.stored.dayStart < w.dayStart;
          expect(await client.pexpiretime(key)).toBe(newDay ? EXPIRE_AT : -1);
        }
      }),
      { numRuns: 150 },
    );
  });

  it('counts nothing for a call it runs again (ioredis resends a command whose connection closed on a Cluster), and answers each request as its first run did', async () => {
    // Limits and shadow (force) are a row's, so the same for every request on one counter.
    const call = fc.record({
      counters: fc.array(
        fc.record({ stored, rc: receipts, hourLimit: fc.nat(6), dayLimit: fc.nat(8), force: fc.boolean() }),
        { minLength: 1, maxLength: 3 },
      ),
      oldestUnsettled: fc.integer({ min: SEQ - 100, max: SEQ }),
      windows,
      requests: fc.array(fc.nat(2), { minLength: 1, maxLength: 6 }),
    });
    await fc.assert(
      fc.asyncProperty(call, async ({ counters, oldestUnsettled, windows: w, requests }) => {
        const keys = counters.map((_, i) => `${prefix}again${++run}:${i}`);
        for (const [i, c] of counters.entries()) await setCounter(keys[i] as string, c.stored, c.rc);
        const items = requests.map((n) => {
          const { hourLimit, dayLimit, force } = counters[n % counters.length] as (typeof counters)[number];
          return {
            key: keys[n % counters.length] as string,
            request: inTheWindows({ ...w, hourLimit, dayLimit, force }),
          };
        });
        const keysThenArgs: Array<string | number> = items.map((item) => item.key);
        pushConsumeArgs(keysThenArgs, items, receiptOf(SEQ, oldestUnsettled));
        const snapshot = (): Promise<unknown[]> =>
          Promise.all(keys.map(async (k) => [await client.hgetall(k), await client.pexpiretime(k)]));

        const first = (await client.eval(CONSUME_SCRIPT, items.length, ...keysThenArgs)) as number[];
        const afterFirst = await snapshot();
        const again = (await client.eval(CONSUME_SCRIPT, items.length, ...keysThenArgs)) as number[];
        expect(again).toEqual(first);
        expect(await snapshot()).toEqual(afterFirst);
      }),
      { numRuns: 150 },
    );
  });

  it('knows a call it runs again behind the receipts of later calls of its instance (several calls out at once on a Cluster)', async () => {
    const key = `${prefix}behind${++run}`;
    const one = [{ key, request: nineInAWindow() }];
    const callOf = (seq: number): Array<string | number> => {
      const keysThenArgs: Array<string | number> = [key];
      pushConsumeArgs(keysThenArgs, one, receiptOf(seq, SEQ));
      return keysThenArgs;
    };
    // SEQ is still unsettled while SEQ + 1 and SEQ + 2 run, so its receipt stays behind theirs.
    for (const seq of [SEQ, SEQ + 1, SEQ + 2]) await client.eval(CONSUME_SCRIPT, 1, ...callOf(seq));
    expect(await client.hget(key, FIELD)).toBe(
      receiptText([SEQ + 2, SEQ + 1, SEQ].map((seq) => ({ seq, units: 1, hourStart: H, dayStart: D }))),
    );
    // Allowed, as the first run was, with the counts the counter holds now (the later calls' units included).
    expect(await client.eval(CONSUME_SCRIPT, 1, ...callOf(SEQ))).toEqual([1, 3, 3]);
    expect(await client.hmget(key, 'hc', 'dc')).toEqual(['3', '3']);
  });

  it(`keeps at most ${RECEIPTS_KEPT} receipts of one instance in a counter, the newest`, async () => {
    const key = `${prefix}many${++run}`;
    const older = Array.from({ length: RECEIPTS_KEPT + 50 }, (_, i) => ({ seq: SEQ - 1 - i, units: 1 }));
    await client.hset(key, { hs: H, hc: 1, ds: D, dc: 1, [FIELD]: receiptText(older) });
    const keysThenArgs: Array<string | number> = [key];
    pushConsumeArgs(keysThenArgs, [{ request: nineInAWindow() }], receiptOf(SEQ, 0));
    await client.eval(CONSUME_SCRIPT, 1, ...keysThenArgs);
    expect(await client.hget(key, FIELD)).toBe(
      receiptText([{ seq: SEQ, units: 1, hourStart: H, dayStart: D }, ...older.slice(0, RECEIPTS_KEPT - 1)]),
    );
  });

  it('reads the limits of each request of a call, large ones too, and refuses a call without limits for every key', async () => {
    const key = `${prefix}big${++run}`;
    const limited = (hourLimit: number, dayLimit: number, force = false): ConsumeRequest =>
      inTheWindows({ hourLimit, dayLimit, force });
    // The counter at 1,000,000 of its day: limits past 2^31 and up to 2^53 - 1 are read whole.
    await client.hset(key, { hs: H, hc: 5, ds: D, dc: 1_000_000 });
    const items = [
      limited(2 ** 53 - 1, 2 ** 53 - 1),
      limited(10, 1_000_001), // day full after the first
      limited(6, 3_000_000_000), // hour full after the first
      limited(1, 1, true),
    ].map((r) => ({ request: r }));
    const keysThenArgs: Array<string | number> = items.map(() => key);
    pushConsumeArgs(keysThenArgs, items, receiptOf(1, 0));
    expect(await client.eval(CONSUME_SCRIPT, items.length, ...keysThenArgs)).toEqual([
      1, 6, 1_000_001, 0, 6, 1_000_001, 0, 6, 1_000_001, 1, 7, 1_000_002,
    ]);

    // One request's limits for two keys: an error, and nothing counted.
    const short: Array<string | number> = [key, key];
    pushConsumeArgs(short, [{ request: limited(100, 10_000_000) }], receiptOf(2, 0));
    await expect(client.eval(CONSUME_SCRIPT, 2, ...short)).rejects.toThrow('consume: no limits for key 2');
    expect(await client.hmget(key, 'hc', 'dc')).toEqual(['7', '1000002']);
  });
});

describe('MERGE_SCRIPT', () => {
  it('merges each counter of a call as mergeStep does, leaving its receipts as they are, and the same call sent again adds nothing', async () => {
    const entry = fc.record({ windows, hour: fc.nat(5), day: fc.nat(5) });
    const call = fc.array(fc.record({ stored, rc: receipts, entry }), { minLength: 1, maxLength: 3 });
    await fc.assert(
      fc.asyncProperty(call, async (counters) => {
        const keys = counters.map((_, i) => `${prefix}m${++run}:${i}`);
        for (const [i, c] of counters.entries()) await setCounter(keys[i] as string, c.stored, c.rc);
        const entries: MergeEntry[] = counters.map(({ entry: e }) => ({
          keyHash: 'k',
          counterId: 'row',
          ...e.windows,
          hour: e.hour,
          day: e.day,
          expireAt: EXPIRE_AT,
        }));
        const mergeCall = (): Promise<unknown> =>
          client.eval(MERGE_SCRIPT, keys.length, ...keys, 'mg:test', 7, ...entries.flatMap(mergeArgs));
        expect(await mergeCall()).toEqual([]);
        const once = await Promise.all(keys.map((key) => client.hgetall(key)));
        // Sent again (its answer was lost): every counter carries the call's mark, and nothing changes.
        expect(await mergeCall()).toEqual([]);
        expect(await Promise.all(keys.map((key) => client.hgetall(key)))).toEqual(once);
        for (const fields of once) expect(fields['mg:test']).toBe('7');

        for (const [i, c] of counters.entries()) {
          const key = keys[i] as string;
          const e = entries[i] as MergeEntry;
          const rc = c.stored ? receiptText(c.rc) : null;
          const merged = mergeStep(c.stored, e);
          expect(await client.hmget(key, 'hs', 'hc', 'ds', 'dc', FIELD, 'tz')).toEqual([
            ...fields(merged),
            rc,
            merged.zone ?? null,
          ]);
          // Across zones only a day of the counter's that is over gives way to the entry's, and its expiry.
          const newDay = !c.stored
            ? true
            : otherZone(c.stored.zone, e.zone)
              ? c.stored.dayStart + 86_400 <= e.dayStart
              : c.stored.dayStart < e.dayStart;
          expect(await client.pexpiretime(key)).toBe(newDay ? EXPIRE_AT : -1);
        }
      }),
      { numRuns: 150 },
    );
  });
});
