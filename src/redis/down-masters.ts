import calculateSlot from 'cluster-key-slot';
import type { Cluster } from 'ioredis';
import { RETRY_STORE_AFTER_MS } from '../limits/limiter.js';

/**
 * How long a Cluster master whose connection failed is taken as away before one call tries it
 * again: as long as the limiter takes the whole store as away after a failure of it.
 */
const MASTER_DOWN_MS = RETRY_STORE_AFTER_MS;

/** A slot's mark that ran out this long ago, its master not marked (a fail-over, or a NAT map's other name), is dropped. */
const FORGOTTEN_AFTER_MS = 60_000;

/** What of the Cluster client this reads: its slot map (node keys per slot) and whether it is up. */
export type ClusterView = Pick<Cluster, 'slots' | 'status'>;

/**
 * On a Redis Cluster, the masters whose connection failed (docs/operations.md "Redis": one master
 * away). A master stays marked until a call on it is answered. While it is marked, calls for keys
 * in its slots are not sent (they fail at once, before any receipt is issued: nothing ran, so
 * there is nothing to take back), but for one call every MASTER_DOWN_MS that tries it again (a
 * counting call, or an undo); the outage merge sends nothing there. The other masters go on
 * counting.
 *
 * Each mark is kept under the master's node key and under the slot of the call that failed: behind
 * a NAT map (natMap) ioredis names a master in its slot map by its mapped address or, after a
 * redirection, by the one the cluster announces.
 */
export class DownMasters {
  readonly #cluster: ClusterView;
  readonly #now: () => number;
  /** Master (its node key) or slot (its number) to the moment a call may try it again. */
  readonly #until = new Map<string | number, number>();
  /** When marks that ran out long ago are dropped next. */
  #sweepAt = 0;
  readonly #onBack: Array<() => void> = [];

  /** `now`: milliseconds of a clock that never goes back; performance.now unless given (tests). */
  constructor(cluster: ClusterView, options: { readonly now?: () => number } = {}) {
    this.#cluster = cluster;
    this.#now = options.now ?? (() => performance.now());
  }

  /** Whether any master is marked: when none is (nearly always), nothing here computes a slot. */
  get any(): boolean {
    return this.#until.size > 0;
  }

  /** Called whenever marks are cleared: what was held back for a master may go. */
  onBack(listener: () => void): void {
    this.#onBack.push(listener);
  }

  /**
   * Whether a call for `key` may go now: `send` (its master is not marked), `away` (it is), or
   * `probe` (it is, and its time has come: this call tries it, and the next only MASTER_DOWN_MS
   * later; the caller tells answered() or failed()).
   */
  tryFor(key: string): 'send' | 'probe' | 'away' {
    if (this.#until.size === 0) return 'send';
    const now = this.#now();
    if (now >= this.#sweepAt) this.#sweep(now);
    const { marks } = this.#marksOf(key);
    if (marks.length === 0) return 'send';
    if (marks.some((m) => (this.#until.get(m) as number) > now)) return 'away';
    for (const m of marks) this.#until.set(m, now + MASTER_DOWN_MS);
    return 'probe';
  }

  /** Whether `key`'s master is marked, whatever its time (the outage merge sends nothing there until it answers). */
  marked(key: string): boolean {
    return this.#until.size > 0 && this.#marksOf(key).marks.length > 0;
  }

  /** The master of `key`'s slot, as the slot map names it (for messages). */
  masterOf(key: string): string {
    const { slot, master } = this.#marksOf(key);
    return master ?? `of slot ${slot}`;
  }

  /**
   * A call for `key` failed on its connection, or tried its master and failed: the master (and
   * the slot) is marked, while the Cluster client is up (down as a whole, it is the whole store's
   * failure). Whether it marked.
   */
  failed(key: string): boolean {
    if (this.#cluster.status !== 'ready') return false;
    const { slot, master } = this.#marksOf(key);
    const until = this.#now() + MASTER_DOWN_MS;
    this.#until.set(slot, until);
    if (master !== undefined) this.#until.set(master, until);
    return true;
  }

  /** A call for `key` was answered: its master is back, with every slot the slot map gives it. */
  answered(key: string): void {
    if (this.#until.size === 0) return;
    const before = this.#until.size;
    const { slot, master } = this.#marksOf(key);
    const slotWasMarked = this.#until.delete(slot);
    const masterWasMarked = master !== undefined && this.#until.delete(master);
    // Its other slots' marks only when its own slot or the master was marked (after a fail-over the
    // slot map names a new master, never marked, for slots marked under the old one): a call
    // answered on a master that was not costs no walk over the marks.
    if (master !== undefined && (slotWasMarked || masterWasMarked)) {
      for (const mark of this.#until.keys())
        if (typeof mark === 'number' && this.#cluster.slots[mark]?.[0] === master) this.#until.delete(mark);
    }
    if (this.#until.size < before) this.#tellBack();
  }

  /** `key`'s slot, its master as the slot map names it, and which of the two are marked. */
  #marksOf(key: string): { slot: number; master: string | undefined; marks: Array<string | number> } {
    const slot = calculateSlot(key);
    const master = this.#cluster.slots[slot]?.[0];
    const marks: Array<string | number> = [];
    if (master !== undefined && this.#until.has(master)) marks.push(master);
    if (this.#until.has(slot)) marks.push(slot);
    return { slot, master, marks };
  }

  #tellBack(): void {
    for (const listener of this.#onBack) listener();
  }

  /**
   * Drops the marks of a master the slot map no longer names (replaced by a fail-over), and the
   * marks of slots whose master now is not marked, that no call has tried for a minute. A master
   * that is still named stays marked, tried or not, until a call there is answered.
   */
  #sweep(now: number): void {
    this.#sweepAt = now + MASTER_DOWN_MS;
    const before = this.#until.size;
    const named = new Set<string>();
    for (const nodes of this.#cluster.slots) if (nodes?.[0] !== undefined) named.add(nodes[0]);
    for (const [mark, until] of this.#until) {
      if (typeof mark === 'string') {
        if (!named.has(mark)) this.#until.delete(mark);
        continue;
      }
      const master = this.#cluster.slots[mark]?.[0];
      if (until + FORGOTTEN_AFTER_MS < now && (master === undefined || !this.#until.has(master)))
        this.#until.delete(mark);
    }
    if (this.#until.size < before) this.#tellBack();
  }
}
