import type { Cluster } from 'ioredis';
import { usageIn, type StoredCounter } from '../limits/count-rules.js';
import type { ConsumeRequest, CounterStore, Counts, MergeEntry, Usage, WindowIds } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { ConsumeBatcher } from './consume-batcher.js';
import { DownMasters } from './down-masters.js';
import { toStoreError } from './errors.js';
import { OutageMerge, type OutageMergeOptions } from './outage-merge.js';
import { ReceiptLedger } from './receipt-ledger.js';

/**
 * Counters in Redis, shared by every gateway instance (README "A request, step by step": how
 * counting works): one hash per (API key, row) with the start and count of the hour and the day
 * window, and the receipts of its last calls. The key's hash tag is the API-key hash, so all
 * rows of one key live in one Redis Cluster slot and a reset or usage read is one round trip too.
 *
 * Three parts, one client: the batcher counts requests (one script call out at a time, for the
 * requests that came while the one before it was out), the receipt ledger takes back the units
 * of calls whose answer never came, and the outage merge adds what the instance admitted
 * without Redis (and sends its calls whose answer never came again, until answered).
 */
export class RedisCounterStore implements CounterStore {
  readonly #client: RedisClient;
  readonly #prefix: string;
  readonly #ledger: ReceiptLedger;
  readonly #batcher: ConsumeBatcher;
  readonly #merge: OutageMerge;

  /** `keptMergesSettled`: how the merge calls kept to be sent again ended (see OutageMerge). */
  constructor(
    client: RedisClient,
    prefix: string,
    options: { readonly keptMergesSettled?: OutageMergeOptions['keptSettled'] } = {},
  ) {
    this.#client = client;
    this.#prefix = prefix;
    const downMasters = (client as Cluster).isCluster ? new DownMasters(client as Cluster) : undefined;
    this.#ledger = new ReceiptLedger(client, { downMasters });
    this.#batcher = new ConsumeBatcher(client, this.#ledger, { downMasters });
    this.#merge = new OutageMerge(client, (e) => this.counterKey(e.keyHash, e.counterId), {
      downMasters,
      keptSettled: options.keptMergesSettled,
    });
  }

  counterKey(keyHash: string, counterId: string): string {
    return `${this.#prefix}c:{${keyHash}}:${counterId}`;
  }

  consume(request: ConsumeRequest): Promise<Counts> {
    return this.#batcher.consume(this.counterKey(request.keyHash, request.counterId), request);
  }

  /** Adds units counted during an outage, in waves (see OutageMerge). */
  merge(entries: readonly MergeEntry[]): Promise<void> {
    return this.#merge.merge(entries);
  }

  /**
   * Takes back the units of doubtful counting calls that Redis did count, and sends the merge
   * calls in doubt again. Safe to call at any time.
   */
  async reconcile(): Promise<void> {
    await Promise.all([this.#ledger.reconcile(), this.#merge.resendKept()]);
  }

  /** Counters of merge calls still in doubt (their units end with the process unless sent again). */
  get keptMergeCounters(): number {
    return this.#merge.keptCounters;
  }

  /** Another instance reset a key's counters on the given rows: the merge calls in doubt no longer add to them. */
  forget(keyHash: string, counterIds: readonly string[]): Promise<void> {
    return this.#merge.forget(keyHash, counterIds);
  }

  async usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]> {
    // Units of calls in doubt are not usage: they are taken back first; merges in doubt are sent again.
    await this.reconcile();
    try {
      const pipeline = this.#client.pipeline();
      for (const row of rows) pipeline.hmget(this.counterKey(keyHash, row.counterId), 'hs', 'hc', 'ds', 'dc', 'tz');
      const replies = (await pipeline.exec()) ?? [];
      return rows.map((row, i) => {
        const [err, value] = replies[i] ?? [new Error('missing reply'), null];
        if (err) throw err;
        const fields = value as Array<string | null>;
        const [hs, hc, ds, dc] = fields.slice(0, 4).map((x) => (x === null ? NaN : Number(x)));
        const zone = fields[4] ?? undefined;
        // A counter is written whole, its four numbers at once (count-rules.ts).
        const stored = Number.isNaN(hs) ? undefined : { hourStart: hs, hour: hc, dayStart: ds, day: dc, zone };
        return usageIn(stored as StoredCounter | undefined, row);
      });
    } catch (err) {
      throw toStoreError(err);
    }
  }

  async reset(keyHash: string, counterIds: readonly string[]): Promise<void> {
    if (counterIds.length === 0) return;
    // A merge call in doubt sent again after the reset would bring the old units back: its
    // entries go with the reset, and none is sent between the two.
    await this.#merge.forget(keyHash, counterIds, async () => {
      try {
        await this.#client.unlink(...counterIds.map((id) => this.counterKey(keyHash, id)));
      } catch (err) {
        throw toStoreError(err);
      }
    });
  }

  /** Stops the ledger's own reconciling and the merge's own resending (on shutdown, after a last reconcile()). */
  close(): void {
    this.#ledger.close();
    this.#merge.close();
  }
}
