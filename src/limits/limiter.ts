import type { LRUCache } from 'lru-cache';
import { boundedCache } from '../lib/bounded-cache.js';
import type { LimitRow, RowLimits } from './limit-table.js';
import { mergeStep } from './count-rules.js';
import {
  MergeFailedError,
  StoreUnavailableError,
  type CounterStore,
  type Counts,
  type MergeEntry,
  type Usage,
} from './store.js';
import { secondsUntil, systemClock, type Clock, type WindowCalendar, type Windows } from './windows.js';

/**
 * The limiting policy, in one place: which windows apply, asking the store, refusing from
 * memory a key that has already spent a window, and what happens while the store is away.
 */

export type FailureMode = 'insurance' | 'open' | 'closed';

export interface WindowState {
  readonly limit: number;
  readonly used: number;
  readonly remaining: number;
  /** Epoch milliseconds at which the window ends. */
  readonly resetAt: number;
}

export type Spent = 'hour' | 'day' | 'both';

export type Decision =
  | {
      readonly kind: 'counted';
      readonly allowed: boolean;
      /**
       * The windows that are full: why a request was refused, or for a shadow row, the
       * windows it went past (it would have been refused).
       */
      readonly spent: Spent | undefined;
      readonly hour: WindowState;
      readonly day: WindowState;
      /** `store`: the counter store; `cache`: refused from memory; `insurance`: per-instance counters while the store is away. */
      readonly source: 'store' | 'cache' | 'insurance';
      /** The instant the decision was taken (epoch ms); reset times are counted from it. */
      readonly at: number;
    }
  /** `open` failure mode while the store is away: admitted without counting. */
  | { readonly kind: 'uncounted'; readonly allowed: true }
  /** `closed` failure mode while the store is away. */
  | { readonly kind: 'unavailable'; readonly allowed: false };

/** A key's usage on some rows (Limiter.usage), in the windows of one instant. */
export interface KeyUsage {
  /** Epoch milliseconds of the reading; reset times are counted from it. */
  readonly at: number;
  readonly windows: Windows;
  /** One per row asked for, in that order. */
  readonly rows: readonly Usage[];
}

export interface LimitRequest {
  readonly keyHash: string;
  readonly row: LimitRow;
  readonly limits: RowLimits;
  readonly calendar: WindowCalendar;
}

export interface LimiterObserver {
  storeError(kind: StoreUnavailableError['kind']): void;
  fallback(mode: FailureMode): void;
  storeCall(): void;
  /**
   * Counters of insurance-counted units handed to the store once it was back: `ok` added,
   * `failed` perhaps added, perhaps not (not tried again). Those the store keeps to send again
   * (MergeFailedError's `kept`) are reported by the store once it has sent them again (those it
   * drops unsent, their day over or their key reset, are not reported).
   */
  merged?(counters: number, result: 'ok' | 'failed'): void;
}

export interface LimiterOptions {
  readonly store: CounterStore;
  /** Per-instance counters used while `store` is away in `insurance` mode. */
  readonly insurance?: CounterStore | undefined;
  readonly failureMode: FailureMode;
  readonly clock?: Clock;
  readonly observer?: LimiterObserver;
  /** After a store failure, requests skip the store for this long, then try it again. */
  readonly retryStoreAfterMs?: number;
  /** Bound on remembered spent (key, row) pairs. */
  readonly maxSpentEntries?: number;
}

/** A (key, row) pair known to be spent until `until`: refused without asking the store. */
interface SpentEntry {
  /** The numbers it was spent against: a key whose plan changed is asked about again. */
  readonly limits: RowLimits;
  readonly until: number;
  readonly hourStart: number;
  readonly hourUsed: number;
  readonly dayUsed: number;
}

/** Counters are kept a little past the end of their day, so instances with skewed clocks still find them. */
const EXPIRY_SLACK_MS = 3_600_000;
/** How long the store is taken as away after a failure of it, by default (docs/operations.md "Redis"). */
export const RETRY_STORE_AFTER_MS = 1000;

/** Bound on (key, row) pairs whose insurance-counted units wait to be added to the store. */
const MAX_UNMERGED = 200_000;

export class Limiter {
  readonly #store: CounterStore;
  readonly #insurance: CounterStore | undefined;
  readonly #mode: FailureMode;
  readonly #clock: Clock;
  readonly #observer: LimiterObserver | undefined;
  readonly #retryAfterMs: number;
  readonly #spent: LRUCache<string, SpentEntry>;
  #storeDownUntil = 0;
  #lastStoreError: string | undefined;
  /** Bumped whenever remembered refusals are forgotten; an answer that started before cannot be remembered after. */
  #generation = 0;
  /** Units admitted from the insurance counters, per (key, row), not yet added to the store. */
  #unmerged = new Map<string, MergeEntry>();
  #merging: Promise<void> | undefined;
  /** After a failed merge, the next is tried with a request only from then on (a part of the store may still be away). */
  #mergeNotBefore = 0;

  constructor(options: LimiterOptions) {
    if (options.failureMode === 'insurance' && !options.insurance)
      throw new Error('insurance mode needs an insurance store');
    this.#store = options.store;
    this.#insurance = options.insurance;
    this.#mode = options.failureMode;
    this.#clock = options.clock ?? systemClock;
    this.#observer = options.observer;
    this.#retryAfterMs = options.retryStoreAfterMs ?? RETRY_STORE_AFTER_MS;
    this.#spent = boundedCache(options.maxSpentEntries ?? 100_000);
  }

  get failureMode(): FailureMode {
    return this.#mode;
  }

  /** Whether the store failed recently (the last failure, for /readyz). */
  storeTrouble(): string | undefined {
    return this.#clock.now() < this.#storeDownUntil ? this.#lastStoreError : undefined;
  }

  /**
   * The decision on one request. A chain of promises rather than async functions: every request
   * takes this path, and each async frame costs a promise and a resumption of its own
   * (docs/performance.md, change 10).
   */
  check(request: LimitRequest): Promise<Decision> {
    try {
      return this.#check(request);
    } catch (err) {
      // As an async function would: a failure is a rejected promise, never a throw.
      return Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
  }

  #check(request: LimitRequest): Promise<Decision> {
    const now = this.#clock.now();
    const windows = request.calendar.at(now);
    const { row, limits } = request;
    const spentKey = request.keyHash + ':' + row.counterId;

    if (!row.shadow) {
      const known = this.#spent.get(spentKey);
      if (known && now < known.until && known.limits === limits) {
        const hourUsed = known.hourStart === windows.hourStart ? known.hourUsed : 0;
        return Promise.resolve(decide(false, hourUsed, known.dayUsed, limits, windows, 'cache', false, now));
      }
    }

    const consume = {
      keyHash: request.keyHash,
      counterId: row.counterId,
      hourStart: windows.hourStart / 1000,
      dayStart: windows.dayStart / 1000,
      zone: request.calendar.timezone,
      hourLimit: limits.perHour,
      dayLimit: limits.perDay,
      expireAt: windows.dayEnd + EXPIRY_SLACK_MS,
      force: row.shadow,
    };
    const generation = this.#generation;
    const fromStore = (counts: Counts): Decision => {
      const decision = decide(counts.allowed, counts.hour, counts.day, limits, windows, 'store', row.shadow, now);
      if (!counts.allowed && generation === this.#generation && decision.kind === 'counted')
        this.#rememberSpent(spentKey, decision, counts, limits, windows, now);
      return decision;
    };
    if (now < this.#storeDownUntil) return this.#withoutStore(consume, limits, windows, row.shadow, now);
    this.#observer?.storeCall();
    return this.#store.consume(consume).then(
      (counts) => {
        // The store answers again: what was admitted without it is added to it now.
        if (this.#unmerged.size > 0 && now >= this.#mergeNotBefore) this.#mergeIntoStore();
        return fromStore(counts);
      },
      (err: unknown) => {
        if (!(err instanceof StoreUnavailableError)) throw err;
        this.#observer?.storeError(err.kind);
        // A part of the store away (a Cluster master) is the store's to skip: the rest still counts.
        if (!err.part) this.#storeFailed(err);
        return this.#withoutStore(consume, limits, windows, row.shadow, now);
      },
    );
  }

  /** Counters only grow until their window ends, so the pair stays spent until then on every instance. */
  #rememberSpent(
    spentKey: string,
    decision: Extract<Decision, { kind: 'counted' }>,
    counts: Counts,
    limits: RowLimits,
    windows: Windows,
    now: number,
  ): void {
    const until = Math.max(
      decision.spent !== 'day' ? windows.hourEnd : 0,
      decision.spent !== 'hour' ? windows.dayEnd : 0,
    );
    this.#spent.set(
      spentKey,
      { limits, until, hourStart: windows.hourStart, hourUsed: counts.hour, dayUsed: counts.day },
      { ttl: until - now },
    );
  }

  /** The decision while the store is away, by REDIS_FAILURE_MODE. */
  async #withoutStore(
    consume: Parameters<CounterStore['consume']>[0],
    limits: RowLimits,
    windows: Windows,
    shadow: boolean,
    now: number,
  ): Promise<Decision> {
    const fallback = await this.#fallback(consume);
    // A shadow row is never refused (README "The limit table"), also where nothing can count it.
    if (fallback.kind === 'unavailable' && shadow) return { kind: 'uncounted', allowed: true };
    if (fallback.kind !== 'counted') return fallback;
    const { counts } = fallback;
    if (counts.allowed) this.#addUnmerged({ ...consume, hour: 1, day: 1 });
    return decide(counts.allowed, counts.hour, counts.day, limits, windows, 'insurance', shadow, now);
  }

  /**
   * What one key has used on the given rows, from the counter store, with the instant and windows
   * it was read in: its resets count from that instant, on the limiter's clock (a usage read across
   * a window boundary must not pair the old window's counts with the new window's reset).
   */
  async usage(keyHash: string, rows: readonly LimitRow[], calendar: WindowCalendar): Promise<KeyUsage> {
    const at = this.#clock.now();
    const windows = calendar.at(at);
    const ids = rows.map((row) => ({
      counterId: row.counterId,
      hourStart: windows.hourStart / 1000,
      dayStart: windows.dayStart / 1000,
      zone: calendar.timezone,
    }));
    return { at, windows, rows: await this.#store.usage(keyHash, ids) };
  }

  /** Drops a key's counters on the given rows, in the store and in this instance's memory. */
  async reset(keyHash: string, rows: readonly LimitRow[]): Promise<void> {
    // A merge in flight may carry this key's outage units: they must land before the reset, not after it.
    while (this.#merging) await this.#merging;
    // Taken out before the store's reset, so that no merge sends them after it.
    const waiting: MergeEntry[] = [];
    for (const [key, entry] of this.#unmerged)
      if (entry.keyHash === keyHash) {
        waiting.push(entry);
        this.#unmerged.delete(key);
      }
    try {
      await this.#store.reset(
        keyHash,
        rows.map((row) => row.counterId),
      );
    } catch (err) {
      // The counters were not reset: the units admitted without the store still go to them, and the
      // key's remembered refusals and insurance counts still hold.
      for (const entry of waiting) this.#addUnmerged(entry);
      throw err;
    }
    await this.forgetKey(keyHash, rows);
  }

  /** Forgets what this instance holds of a key: remembered refusals and insurance counters (its counters were reset elsewhere). */
  async forgetKey(keyHash: string, rows: readonly LimitRow[]): Promise<void> {
    this.#generation++;
    for (const key of this.#spent.keys()) if (key.startsWith(keyHash + ':')) this.#spent.delete(key);
    for (const key of this.#unmerged.keys()) if (key.startsWith(keyHash + ':')) this.#unmerged.delete(key);
    await this.#insurance?.reset(
      keyHash,
      rows.map((row) => row.counterId),
    );
  }

  /** Forgets every remembered refusal (the table changed: a window may have room now). */
  forgetAll(): void {
    this.#generation++;
    this.#spent.clear();
  }

  /** The store's connection is back: what was admitted without it is handed over now, not only with the next request. */
  storeAvailable(): void {
    if (this.#unmerged.size > 0) this.#mergeIntoStore();
  }

  /**
   * At shutdown: the units admitted without the store that still wait for it are handed to it
   * now, whenever the last merge failed (they would otherwise go only with a later request, and
   * the process is ending). Resolves with the number of counters still waiting, whose units end
   * with the process.
   */
  async mergeWaiting(): Promise<number> {
    while (this.#merging) await this.#merging;
    if (this.#unmerged.size > 0) {
      this.#mergeIntoStore();
      await this.merged();
    }
    return this.#unmerged.size;
  }

  /** Resolves once the units handed to the store after an outage are in (or the attempt failed). */
  merged(): Promise<void> {
    return this.#merging ?? Promise.resolve();
  }

  /** Pairs whose counters have expired anyway hold nothing worth adding. */
  #dropEndedDays(): void {
    const now = this.#clock.now();
    for (const [key, entry] of this.#unmerged) if (entry.expireAt <= now) this.#unmerged.delete(key);
  }

  /**
   * Adds the units admitted during an outage to the store, once. Units a failed merge may have
   * added are not sent again from here (an outage counted twice would refuse clients wrongly):
   * the store keeps those it can send again without counting them twice (`kept`), and the others
   * stay in this instance only. Those it certainly did not add wait for the next try.
   */
  #mergeIntoStore(): void {
    if (this.#merging) return;
    const entries = [...this.#unmerged.values()];
    this.#unmerged = new Map();
    this.#merging = this.#store
      .merge(entries)
      .then(
        () => this.#observer?.merged?.(entries.length, 'ok'),
        (err: unknown) => {
          const failure = err instanceof MergeFailedError ? err : undefined;
          const retry = failure?.notApplied ?? [];
          const applied = failure?.applied ?? 0;
          for (const entry of retry) this.#addUnmerged(entry);
          this.#mergeNotBefore = this.#clock.now() + this.#retryAfterMs;
          if (applied > 0) this.#observer?.merged?.(applied, 'ok');
          // The store reports its kept entries itself once they are in (wiring/backend.ts).
          const lost = entries.length - retry.length - applied - (failure?.kept ?? 0);
          if (lost > 0) this.#observer?.merged?.(lost, 'failed');
        },
      )
      .finally(() => {
        this.#merging = undefined;
      });
  }

  /**
   * Adds units to those waiting for the store, by the rule of mergeStep: one admitted from the
   * insurance counters, or those a failed merge never sent.
   */
  #addUnmerged(units: MergeEntry): void {
    const key = units.keyHash + ':' + units.counterId;
    const waiting = this.#unmerged.get(key);
    if (!waiting) {
      if (this.#unmerged.size >= MAX_UNMERGED) this.#dropEndedDays();
      // Past the bound, the units of further pairs stay in this instance only (as if never merged).
      if (this.#unmerged.size >= MAX_UNMERGED) return;
    }
    const { keyHash, counterId, expireAt } = units;
    this.#unmerged.set(key, {
      keyHash,
      counterId,
      ...mergeStep(waiting, units),
      expireAt: Math.max(expireAt, waiting?.expireAt ?? 0),
    });
  }

  #storeFailed(err: StoreUnavailableError): void {
    this.#lastStoreError = err.message;
    this.#storeDownUntil = this.#clock.now() + this.#retryAfterMs;
  }

  async #fallback(
    consume: Parameters<CounterStore['consume']>[0],
  ): Promise<
    { kind: 'counted'; counts: Counts; source: 'insurance' } | Extract<Decision, { kind: 'uncounted' | 'unavailable' }>
  > {
    this.#observer?.fallback(this.#mode);
    if (this.#mode === 'open') return { kind: 'uncounted', allowed: true };
    if (this.#mode === 'closed' || !this.#insurance) return { kind: 'unavailable', allowed: false };
    return { kind: 'counted', counts: await this.#insurance.consume(consume), source: 'insurance' };
  }
}

function decide(
  allowed: boolean,
  hourUsed: number,
  dayUsed: number,
  limits: RowLimits,
  windows: Windows,
  source: 'store' | 'cache' | 'insurance',
  shadow: boolean,
  at: number,
): Decision {
  // A refusal names the full windows; a shadow admission names those it went past.
  const hourFull = allowed ? shadow && hourUsed > limits.perHour : hourUsed >= limits.perHour;
  const dayFull = allowed ? shadow && dayUsed > limits.perDay : dayUsed >= limits.perDay;
  return {
    kind: 'counted',
    allowed,
    spent: hourFull ? (dayFull ? 'both' : 'hour') : dayFull ? 'day' : undefined,
    hour: {
      limit: limits.perHour,
      used: hourUsed,
      remaining: Math.max(0, limits.perHour - hourUsed),
      resetAt: windows.hourEnd,
    },
    day: {
      limit: limits.perDay,
      used: dayUsed,
      remaining: Math.max(0, limits.perDay - dayUsed),
      resetAt: windows.dayEnd,
    },
    source,
    at,
  };
}

/** Seconds until a refused request could next be allowed: the reset of the spent window, or the later one. */
export function retryAfterSeconds(decision: Extract<Decision, { kind: 'counted' }>, now: number): number {
  const hour = decision.spent === 'hour' || decision.spent === 'both' ? decision.hour.resetAt : 0;
  const day = decision.spent === 'day' || decision.spent === 'both' ? decision.day.resetAt : 0;
  return Math.max(1, secondsUntil(Math.max(hour, day), now));
}
