import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';

/**
 * How long a Cluster master whose connection failed is taken as away: as long as the limiter
 * takes the whole store as away after a failure of it (limits/limiter.ts, retryStoreAfterMs).
 */
export const MASTER_DOWN_MS = 1000;

/**
 * On a Redis Cluster, the masters whose connection failed lately (docs/operations.md "Redis": one
 * master away). While one is away, the calls for keys in its slots are not sent: they fail at once,
 * before any receipt is issued (nothing ran, so there is nothing to take back), and only the
 * requests on its counters are decided without Redis; the other masters go on counting.
 */
export class DownMasters {
  readonly #cluster: Cluster;
  readonly #downMs: number;
  readonly #now: () => number;
  /**
   * Master (its node key, as the slot map names it) to the moment it is tried again; and the slot
   * of the call that failed, by its number: behind a NAT map (natMap), ioredis names a master in
   * its slot map by its mapped address or, after a redirection, by the one the cluster announces.
   */
  readonly #until = new Map<string | number, number>();

  constructor(cluster: Cluster, options: { readonly downMs?: number; readonly now?: () => number } = {}) {
    this.#cluster = cluster;
    this.#downMs = options.downMs ?? MASTER_DOWN_MS;
    this.#now = options.now ?? (() => performance.now());
  }

  /** The master serving `key`'s slot, when it is taken as away. */
  downFor(key: string): string | undefined {
    // Nearly always none is: no slot is computed then.
    if (this.#until.size === 0) return undefined;
    const slot = calculateSlot(key);
    const master = this.#cluster.slots[slot]?.[0];
    if (master !== undefined && this.#isAway(master)) return master;
    return this.#isAway(slot) ? (master ?? `of slot ${slot}`) : undefined;
  }

  /** A call for `key` failed on its connection: its master (and its slot) is taken as away for a while. */
  failed(key: string): void {
    const slot = calculateSlot(key);
    const until = this.#now() + this.#downMs;
    this.#until.set(slot, until);
    const master = this.#cluster.slots[slot]?.[0];
    if (master !== undefined) this.#until.set(master, until);
  }

  #isAway(masterOrSlot: string | number): boolean {
    const until = this.#until.get(masterOrSlot);
    if (until === undefined) return false;
    if (until > this.#now()) return true;
    this.#until.delete(masterOrSlot);
    return false;
  }
}
