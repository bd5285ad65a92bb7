import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { parseLimits } from '../../src/config/load-limits.js';
import { limitsFor, type LimitRow, type LimitTable } from '../../src/limits/limit-table.js';
import { Limiter, retryAfterSeconds, type Decision } from '../../src/limits/limiter.js';
import { RedisCounterStore } from '../../src/redis/counter-store.js';
import { createRedisClient } from '../../src/redis/connection.js';
import { FakeClock } from '../helpers/clock.js';
import { REDIS_URL, redisClient, uniquePrefix } from '../helpers/redis.js';

/**
 * Counting against a model (README "The limit table", "A request, step by step" step 3, "Headers
 * and answers", "API keys and plans"): random sequences of requests on two instances (two
 * Limiters, each with its own Redis client, on one counter prefix in the real Redis), clock moves
 * (within an hour, to a window's end, across days and daylight saving changes), resets, reloaded
 * tables (numbers, plan scale, timezone) and keys changing plan, each decision compared with a
 * reference written from the README alone: an allowed request uses one unit of each window, a
 * refused one none; windows are the clock hours and the days from 00:00 of the table's zone.
 */

const HOUR_MS = 3_600_000;
const DAY_MS = 86_400_000;

const clientA = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 5000 });
const clientB = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 5000 });
await Promise.all([clientA.connect(), clientB.connect()]);
const prefix = uniquePrefix('model');
const storeA = new RedisCounterStore(clientA, prefix);
const storeB = new RedisCounterStore(clientB, prefix);
afterAll(async () => {
  storeA.close();
  storeB.close();
  const cleaner = redisClient();
  let cursor = '0';
  for (let i = 0; i < 1000; i++) {
    const [next, keys] = await cleaner.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    if (keys.length) await cleaner.unlink(...keys);
    cursor = next;
    if (cursor === '0') break;
  }
  cleaner.disconnect();
  await Promise.all([clientA.quit(), clientB.quit()]);
});

// ---- The reference: windows from Intl (not luxon, which the product uses), counts from the README.

const formatters = new Map<string, Intl.DateTimeFormat>();
function localParts(zone: string, at: number): { date: string; minute: number; second: number } {
  let format = formatters.get(zone);
  if (!format) {
    format = new Intl.DateTimeFormat('en-CA', {
      timeZone: zone,
      hourCycle: 'h23',
      year: 'numeric',
      month: '2-digit',
      day: '2-digit',
      hour: '2-digit',
      minute: '2-digit',
      second: '2-digit',
    });
    formatters.set(zone, format);
  }
  const parts = Object.fromEntries(format.formatToParts(new Date(at)).map((p) => [p.type, p.value]));
  return {
    date: `${parts.year}-${parts.month}-${parts.day}`,
    minute: Number(parts.minute),
    second: Number(parts.second),
  };
}

/** The first instant in (lo, hi] whose local date is at least `date` (the local date only grows with time). */
function firstDateAtLeast(zone: string, date: string, lo: number, hi: number): number {
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (localParts(zone, mid).date >= date) hi = mid;
    else lo = mid;
  }
  return hi;
}

interface ModelWindows {
  hourStart: number;
  hourEnd: number;
  dayStart: number;
  dayEnd: number;
}

/** Clock hours (the local :00 to the next), days from local 00:00 to the next local 00:00. */
function modelWindows(zone: string, at: number): ModelWindows {
  const here = localParts(zone, at);
  const hourStart = at - (here.minute * 60 + here.second) * 1000 - (at % 1000);
  const dayStart = firstDateAtLeast(zone, here.date, at - 27 * HOUR_MS, at);
  // The next local date, whatever it is: the first instant whose date is past today's.
  const next = (d: number) => localParts(zone, d).date > here.date;
  let hi = at + 27 * HOUR_MS;
  while (!next(hi)) hi += HOUR_MS;
  let lo = at;
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    if (next(mid)) hi = mid;
    else lo = mid;
  }
  return { hourStart, hourEnd: hourStart + HOUR_MS, dayStart, dayEnd: hi };
}

interface RowNumbers {
  perHour: number;
  perDay: number;
}
interface TableSpec {
  zone: string;
  rows: [RowNumbers, RowNumbers, RowNumbers];
  scale: number;
  /** The `mm` plan's own numbers for row 0. */
  mm: RowNumbers;
}
type PlanName = 'premium' | 'mm' | undefined;

const ROUTES = ['GET /a', 'GET /b/{id}', 'GET /s'] as const;

function tableText(spec: TableSpec): string {
  const [r0, r1, r2] = spec.rows;
  return `
timezone: ${spec.zone}
limits:
  - { name: A, route: "GET /a", per_hour: ${r0.perHour}, per_day: ${r0.perDay} }
  - { name: B, route: "GET /b/{id}", also: ["POST /b"], per_hour: ${r1.perHour}, per_day: ${r1.perDay} }
  - { name: S, route: "GET /s", per_hour: ${r2.perHour}, per_day: ${r2.perDay}, shadow: true }
plans:
  premium: { scale: ${spec.scale} }
  mm: { rows: { "GET /a": { per_hour: ${spec.mm.perHour}, per_day: ${spec.mm.perDay} } } }
`;
}

function buildTable(spec: TableSpec): LimitTable {
  const result = parseLimits(tableText(spec), 'limits.yaml');
  if (!result.ok) throw new Error(`test table refused: ${JSON.stringify(result.errors)}`);
  return result.table;
}

/** README "API keys and plans": every number × scale, rounded down (at least 1); a plan's rows override. */
function modelLimits(spec: TableSpec, row: number, plan: PlanName): RowNumbers {
  const base = spec.rows[row] as RowNumbers;
  if (plan === 'premium')
    return {
      perHour: Math.max(1, Math.floor(base.perHour * spec.scale)),
      perDay: Math.max(1, Math.floor(base.perDay * spec.scale)),
    };
  if (plan === 'mm' && row === 0) return spec.mm;
  return base;
}

interface ModelCounter {
  zone: string;
  hourStart: number;
  hour: number;
  dayStart: number;
  day: number;
}

/**
 * What a counter holds in the windows `w` of `zone`: a window not over counts. A counter of another
 * zone keeps each window that still overlaps the new one, the old taken as an hour and a day long
 * (README "Whose midnight").
 */
function heldIn(counter: ModelCounter | undefined, zone: string, w: ModelWindows): { hour: number; day: number } {
  if (!counter) return { hour: 0, day: 0 };
  if (counter.zone !== zone)
    return {
      hour: counter.hourStart + HOUR_MS > w.hourStart ? counter.hour : 0,
      day: counter.dayStart + DAY_MS > w.dayStart ? counter.day : 0,
    };
  return {
    hour: counter.hourStart >= w.hourStart ? counter.hour : 0,
    day: counter.dayStart >= w.dayStart ? counter.day : 0,
  };
}

interface Expected {
  allowed: boolean;
  spent: 'hour' | 'day' | 'both' | undefined;
  hour: { limit: number; used: number; remaining: number; resetAt: number };
  day: { limit: number; used: number; remaining: number; resetAt: number };
}

class Model {
  readonly counters = new Map<string, ModelCounter>();
  readonly plans: PlanName[] = [undefined, 'premium', 'mm'];
  constructor(public spec: TableSpec) {}

  /** One request of key `k` on row `r` at `now`: both windows have room, or it uses nothing. */
  consume(k: number, r: number, now: number): Expected {
    const { zone } = this.spec;
    const w = modelWindows(zone, now);
    const id = `${k}:${r}`;
    const held = heldIn(this.counters.get(id), zone, w);
    const limits = modelLimits(this.spec, r, this.plans[k]);
    const shadow = r === 2;
    const allowed = shadow || (held.hour < limits.perHour && held.day < limits.perDay);
    const hour = held.hour + (allowed ? 1 : 0);
    const day = held.day + (allowed ? 1 : 0);
    // A counter holds the windows it last counted in; a refusal moves only a counter of another zone,
    // to the new bounds (README "Whose midnight"), so a window a refusal saw end is still the one held.
    const counter = this.counters.get(id);
    if (allowed || (counter && counter.zone !== zone))
      this.counters.set(id, { zone, hourStart: w.hourStart, hour, dayStart: w.dayStart, day });
    const hourFull = allowed ? shadow && hour > limits.perHour : hour >= limits.perHour;
    const dayFull = allowed ? shadow && day > limits.perDay : day >= limits.perDay;
    return {
      allowed,
      spent: hourFull ? (dayFull ? 'both' : 'hour') : dayFull ? 'day' : undefined,
      hour: { limit: limits.perHour, used: hour, remaining: Math.max(0, limits.perHour - hour), resetAt: w.hourEnd },
      day: { limit: limits.perDay, used: day, remaining: Math.max(0, limits.perDay - day), resetAt: w.dayEnd },
    };
  }

  usage(k: number, now: number): Array<{ hour: number; day: number }> {
    const w = modelWindows(this.spec.zone, now);
    return ROUTES.map((_, r) => heldIn(this.counters.get(`${k}:${r}`), this.spec.zone, w));
  }

  reset(k: number): void {
    for (let r = 0; r < ROUTES.length; r++) this.counters.delete(`${k}:${r}`);
  }
}

// ---- The operations.

type Op =
  | { op: 'consume'; inst: 0 | 1; key: number; row: number }
  | { op: 'burst'; key: number; row: number; n: number }
  | { op: 'advance'; to: 'by' | 'hourEnd' | 'dayEnd'; ms: number }
  | { op: 'reset'; inst: 0 | 1; key: number }
  | { op: 'usage'; inst: 0 | 1; key: number }
  | { op: 'numbers'; row: number; perHour: number; extraDay: number }
  | { op: 'scale'; scale: number }
  | { op: 'mm'; perHour: number; extraDay: number }
  | { op: 'zone'; zone: string }
  | { op: 'plan'; key: number; plan: PlanName };

const KEYS = 3;
const ZONES = [
  'UTC',
  'Asia/Ho_Chi_Minh',
  'Asia/Kolkata',
  'America/New_York',
  'Europe/Berlin',
  'Australia/Lord_Howe',
  'America/Havana',
];
/** Daylight saving changes a year ahead (Redis expires counters by its own clock: never in the past), and a plain day. */
const ANCHORS = [
  '2027-11-07T06:00:00Z', // New York back
  '2027-03-14T07:00:00Z', // New York forward
  '2027-10-31T01:00:00Z', // Berlin back
  '2027-04-03T15:00:00Z', // Lord Howe back half an hour
  '2027-10-02T15:30:00Z', // Lord Howe forward half an hour
  '2027-11-07T05:00:00Z', // Havana back from 01:00 to 00:00: the day starts at its first 00:00
  '2027-06-15T17:00:00Z', // midnight in Vietnam
].map((t) => Date.parse(t));

const numbers = fc.record({ perHour: fc.integer({ min: 1, max: 4 }), perDay: fc.integer({ min: 0, max: 4 }) });
const rowNumbers = numbers.map(({ perHour, perDay }) => ({ perHour, perDay: perHour + perDay }));
/** Mostly one key and one row, so that sequences dwell on one counter long enough to spend it. */
const key = fc.oneof({ weight: 3, arbitrary: fc.constant(0) }, fc.integer({ min: 0, max: KEYS - 1 }));
const row = fc.oneof({ weight: 3, arbitrary: fc.constant(0) }, fc.integer({ min: 0, max: ROUTES.length - 1 }));
const inst = fc.constantFrom<0 | 1>(0, 1);
const opArb: fc.Arbitrary<Op> = fc.oneof(
  { weight: 12, arbitrary: fc.record({ op: fc.constant('consume' as const), inst, key, row }) },
  {
    weight: 2,
    arbitrary: fc.record({ op: fc.constant('burst' as const), key, row, n: fc.integer({ min: 2, max: 7 }) }),
  },
  {
    weight: 4,
    arbitrary: fc.oneof(
      fc.record({
        op: fc.constant('advance' as const),
        to: fc.constant('by' as const),
        ms: fc.integer({ min: 1, max: 30 * 60_000 }),
      }),
      fc.record({
        op: fc.constant('advance' as const),
        to: fc.constantFrom('hourEnd' as const, 'dayEnd' as const),
        ms: fc.integer({ min: -1500, max: 1500 }),
      }),
      fc.record({
        op: fc.constant('advance' as const),
        to: fc.constant('by' as const),
        ms: fc.integer({ min: 1, max: 30 }).map((h) => h * HOUR_MS),
      }),
    ),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('reset' as const), inst, key }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('usage' as const), inst, key }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('numbers' as const),
      row,
      perHour: fc.integer({ min: 1, max: 4 }),
      extraDay: fc.integer({ min: 0, max: 4 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('scale' as const), scale: fc.constantFrom(0.5, 1, 1.5, 2, 3) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('mm' as const),
      perHour: fc.integer({ min: 1, max: 4 }),
      extraDay: fc.integer({ min: 0, max: 4 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('zone' as const), zone: fc.constantFrom(...ZONES) }) },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('plan' as const),
      key,
      plan: fc.constantFrom<PlanName>(undefined, 'premium', 'mm'),
    }),
  },
);

const specArb: fc.Arbitrary<TableSpec> = fc.record({
  zone: fc.constantFrom(...ZONES),
  rows: fc.tuple(rowNumbers, rowNumbers, rowNumbers),
  scale: fc.constantFrom(0.5, 1, 1.5, 2),
  mm: rowNumbers,
});
const startArb = fc
  .tuple(fc.constantFrom(...ANCHORS), fc.integer({ min: 0, max: 30 * 60 }))
  .map(([anchor, minutes]) => anchor - minutes * 60_000 - 1000);

// ---- The system under test, and one run.

function seen(d: Decision, now: number): Expected & { retryAfter?: number } {
  if (d.kind !== 'counted') throw new Error(`decision not counted: ${d.kind}`);
  const out = {
    allowed: d.allowed,
    spent: d.spent,
    hour: { limit: d.hour.limit, used: d.hour.used, remaining: d.hour.remaining, resetAt: d.hour.resetAt },
    day: { limit: d.day.limit, used: d.day.used, remaining: d.day.remaining, resetAt: d.day.resetAt },
  };
  return d.allowed ? out : { ...out, retryAfter: retryAfterSeconds(d, now) };
}

/** README "Headers and answers": Retry-After is whole seconds, at least 1, to the spent window's reset (the later when both). */
function withRetry(e: Expected, now: number): Expected & { retryAfter?: number } {
  if (e.allowed) return e;
  const end = Math.max(
    e.spent === 'hour' || e.spent === 'both' ? e.hour.resetAt : 0,
    e.spent === 'day' || e.spent === 'both' ? e.day.resetAt : 0,
  );
  return { ...e, retryAfter: Math.max(1, Math.ceil((end - now) / 1000)) };
}

let runs = 0;

class System {
  readonly clock: FakeClock;
  readonly limiters: [Limiter, Limiter];
  readonly keyHashes: string[];
  readonly plans: PlanName[] = [undefined, 'premium', 'mm'];
  table: LimitTable;
  constructor(
    public spec: TableSpec,
    start: number,
  ) {
    const run = runs++;
    this.clock = new FakeClock(start);
    const make = (store: RedisCounterStore) => new Limiter({ store, failureMode: 'closed', clock: this.clock });
    this.limiters = [make(storeA), make(storeB)];
    this.keyHashes = Array.from({ length: KEYS }, (_, k) => `run${run}-key${k}`);
    this.table = buildTable(spec);
  }

  check(inst: 0 | 1, k: number, r: number): Promise<Decision> {
    const row = this.table.rows[r] as LimitRow;
    const limits = limitsFor(this.table, row, this.plans[k]);
    return this.limiters[inst].check({
      keyHash: this.keyHashes[k] as string,
      row,
      limits,
      calendar: this.table.calendar,
    });
  }

  /** A new table in force: every instance forgets its remembered refusals (src/runner.ts). */
  reload(spec: TableSpec): void {
    this.spec = spec;
    this.table = buildTable(spec);
    for (const limiter of this.limiters) limiter.forgetAll();
  }
}

function describeOp(op: Op): string {
  return JSON.stringify(op);
}

async function burst(sys: System, model: Model, op: Extract<Op, { op: 'burst' }>, log: string): Promise<void> {
  const now = sys.clock.now();
  const expected = Array.from({ length: op.n }, () => model.consume(op.key, op.row, now));
  const decisions = await Promise.all(
    Array.from({ length: op.n }, (_, i) => sys.check((i % 2) as 0 | 1, op.key, op.row)),
  );
  // Concurrent requests are decided in some order: the same decisions as the model's sequence, as a set.
  const order = (e: Expected & { retryAfter?: number }) => `${e.allowed ? 0 : 1}:${e.hour.used}:${e.day.used}`;
  const got = decisions.map((d) => seen(d, now)).sort((x, y) => order(x).localeCompare(order(y)));
  const want = expected.map((e) => withRetry(e, now)).sort((x, y) => order(x).localeCompare(order(y)));
  expect(got, log).toEqual(want);
}

async function step(sys: System, model: Model, op: Op, log: string): Promise<void> {
  const now = sys.clock.now();
  switch (op.op) {
    case 'consume': {
      const expected = withRetry(model.consume(op.key, op.row, now), now);
      expect(seen(await sys.check(op.inst, op.key, op.row), now), log).toEqual(expected);
      return;
    }
    case 'burst':
      return burst(sys, model, op, log);
    case 'advance': {
      const w = modelWindows(sys.spec.zone, now);
      const target = op.to === 'by' ? now + op.ms : (op.to === 'hourEnd' ? w.hourEnd : w.dayEnd) + op.ms;
      if (target > now) sys.clock.set(target);
      return;
    }
    case 'reset': {
      const keyHash = sys.keyHashes[op.key] as string;
      await sys.limiters[op.inst].reset(keyHash, sys.table.rows);
      // The other instance hears of it (README "Looking a client up": on every instance).
      await sys.limiters[op.inst === 0 ? 1 : 0].forgetKey(keyHash, sys.table.rows);
      model.reset(op.key);
      return;
    }
    case 'usage': {
      const usage = await sys.limiters[op.inst].usage(
        sys.keyHashes[op.key] as string,
        sys.table.rows,
        sys.table.calendar,
      );
      expect(usage.rows, log).toEqual(model.usage(op.key, now));
      return;
    }
    case 'plan':
      // The key file gives the key another plan, on both instances (src/runner.ts: forgetting their refusals).
      if (sys.plans[op.key] !== op.plan) for (const limiter of sys.limiters) limiter.forgetAll();
      sys.plans[op.key] = op.plan;
      model.plans[op.key] = op.plan;
      return;
    default:
      return reloadStep(sys, model, op);
  }
}

function reloadStep(sys: System, model: Model, op: Extract<Op, { op: 'numbers' | 'scale' | 'mm' | 'zone' }>): void {
  const spec: TableSpec = { ...sys.spec, rows: [...sys.spec.rows] };
  if (op.op === 'numbers') spec.rows[op.row] = { perHour: op.perHour, perDay: op.perHour + op.extraDay };
  else if (op.op === 'scale') spec.scale = op.scale;
  else if (op.op === 'mm') spec.mm = { perHour: op.perHour, perDay: op.perHour + op.extraDay };
  else spec.zone = op.zone;
  sys.reload(spec);
  model.spec = spec;
}

async function runSequence(spec: TableSpec, start: number, ops: readonly Op[]): Promise<void> {
  const sys = new System(spec, start);
  const model = new Model(spec);
  const done: string[] = [];
  for (const op of ops) {
    done.push(`${new Date(sys.clock.now()).toISOString()} ${describeOp(op)}`);
    await step(sys, model, op, done.join('\n'));
  }
}

describe('counting, against a model of the README', () => {
  it('decides every request of two instances on one Redis as the model does', async () => {
    // Bounded in count and in time: on a loaded machine fewer runs are made, none is cut short.
    await fc.assert(
      fc.asyncProperty(specArb, startArb, fc.array(opArb, { minLength: 1, maxLength: 60 }), runSequence),
      { numRuns: 1000, interruptAfterTimeLimit: 15_000 },
    );
  }, 60_000);
});
