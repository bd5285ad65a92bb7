import type { LRUCache } from 'lru-cache';
import { boundedCache } from '../lib/bounded-cache.js';
import { countStep, mergeStep, usageIn, type StoredCounter } from './count-rules.js';
import {
  type ConsumeRequest,
  type CounterStore,
  type Counts,
  type MergeEntry,
  type Usage,
  type WindowIds,
} from './store.js';

/**
 * Counters in this process: the store when no Redis is configured (one instance only), and
 * the insurance store while Redis is away. Bounded: at most `maxCounters` (API key, row)
 * pairs, each dropped at the end of its day; past the bound the least recently used pair is
 * forgotten, which can only ever admit more, never refuse wrongly.
 */

export const DEFAULT_MAX_COUNTERS = 200_000;

export class MemoryCounterStore implements CounterStore {
  readonly #entries: LRUCache<string, StoredCounter>;
  readonly #now: () => number;

  constructor(options: { maxCounters?: number; now?: () => number } = {}) {
    this.#now = options.now ?? Date.now;
    this.#entries = boundedCache(options.maxCounters ?? DEFAULT_MAX_COUNTERS, { now: () => this.#now() });
  }

  get size(): number {
    return this.#entries.size;
  }

  async consume(request: ConsumeRequest): Promise<Counts> {
    const key = request.keyHash + ':' + request.counterId;
    const next = countStep(this.#entries.get(key), request);
    // A refusal writes nothing, but for a counter that moves to a new zone's bounds.
    if (next.allowed || next.moved) {
      const ttl = Math.max(1, request.expireAt - this.#now());
      this.#entries.set(
        key,
        { hourStart: next.hourStart, hour: next.hour, dayStart: next.dayStart, day: next.day, zone: next.zone },
        { ttl },
      );
    }
    return { allowed: next.allowed, hour: next.hour, day: next.day };
  }

  async merge(entries: readonly MergeEntry[]): Promise<void> {
    for (const entry of entries) {
      const key = entry.keyHash + ':' + entry.counterId;
      // A counter already in a later day keeps its own, later, expiry.
      const ttl = Math.max(1, entry.expireAt - this.#now(), this.#entries.getRemainingTTL(key));
      this.#entries.set(key, mergeStep(this.#entries.get(key), entry), { ttl });
    }
  }

  async usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]> {
    return rows.map((row) => usageIn(this.#entries.get(keyHash + ':' + row.counterId), row));
  }

  async reset(keyHash: string, counterIds: readonly string[]): Promise<void> {
    for (const id of counterIds) this.#entries.delete(keyHash + ':' + id);
  }
}
