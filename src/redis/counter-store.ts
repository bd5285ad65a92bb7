import type { Cluster, Redis } from 'ioredis';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../limits/count-rules.js';
import {
  type ConsumeRequest,
  type CounterStore,
  type Counts,
  type MergeEntry,
  type StoreUnavailableError,
  type Usage,
  type WindowIds,
} from '../limits/store.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';
import { OutageMerge } from './outage-merge.js';
import { ReceiptLedger } from './receipt-ledger.js';

/**
 * Counters in Redis, shared by every gateway instance: one hash per (API key, row) with the
 * start and count of the hour and the day window, updated by one Lua script per request
 * (one round trip, atomic). The key's hash tag is the API-key hash, so all rows of one key
 * live in one Redis Cluster slot and a reset or usage read is one round trip too.
 *
 * On a single Redis, the requests that arrive in one turn of the event loop are counted by one
 * script call together: each request still waits on exactly one round trip, but the client and
 * the server handle one command (one write, one read, one reply) per batch instead of one per
 * request, and each counter of the batch is read and written once. (ioredis' own
 * auto-pipelining only joins commands of the same tick, and every connection's request is a
 * tick of its own.) On a Cluster the keys of one script must share a slot, so there each
 * request's script goes alone.
 *
 * A script call whose answer never arrives (it timed out, or the connection died before the
 * reply) may or may not have counted; the caller counts its requests elsewhere (insurance) or
 * refuses them (503), so units left in Redis would be counted twice. Every call therefore
 * carries a receipt: the script records `receipt:units` in each counter it added to (the last
 * 8 calls per counter), and the store takes back the units of every receipt it never heard
 * about — at once after a timeout, otherwise as soon as Redis answers again, and always on the
 * same connection, so after the doubtful call if that ever runs.
 */

interface Pending {
  readonly key: string;
  readonly request: ConsumeRequest;
  readonly resolve: (counts: Counts) => void;
  readonly reject: (err: StoreUnavailableError) => void;
}

interface ScriptCommands {
  /** One counter: its key, the windows, its three arguments, the receipt. */
  oapiConsume(key: string, ...args: Array<string | number>): Promise<number[]>;
  /** `numberOfKeys`, the counters, the windows, three arguments per counter, the receipt. */
  oapiConsumeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number[]>;
}

export class RedisCounterStore implements CounterStore {
  readonly #client: RedisClient & ScriptCommands;
  readonly #prefix: string;
  readonly #batching: boolean;
  #batch: Pending[] = [];
  readonly #ledger: ReceiptLedger;
  readonly #merge: OutageMerge;

  constructor(client: RedisClient, prefix: string) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and
    // with the number of keys given per call, for a batch.
    client.defineCommand('oapiConsume', { numberOfKeys: 1, lua: CONSUME_SCRIPT });
    client.defineCommand('oapiConsumeMany', { lua: CONSUME_SCRIPT });
    this.#client = client as RedisClient & ScriptCommands;
    this.#prefix = prefix;
    this.#batching = !(client as Cluster).isCluster;
    this.#ledger = new ReceiptLedger(client);
    this.#merge = new OutageMerge(client, (e) => this.counterKey(e.keyHash, e.counterId));
  }

  counterKey(keyHash: string, counterId: string): string {
    return `${this.#prefix}c:{${keyHash}}:${counterId}`;
  }

  consume(request: ConsumeRequest): Promise<Counts> {
    return new Promise((resolve, reject) => {
      const pending: Pending = { key: this.counterKey(request.keyHash, request.counterId), request, resolve, reject };
      if (!this.#batching) {
        this.#run([pending]);
        return;
      }
      // One call counts in one pair of windows: a request of other windows (a boundary just passed) starts a new call.
      const first = this.#batch[0]?.request;
      if (first && !sameWindows(first, request)) this.#send();
      if (this.#batch.push(pending) === 1) setImmediate(this.#send);
    });
  }

  readonly #send = (): void => {
    const batch = this.#batch;
    if (batch.length === 0) return;
    this.#batch = [];
    this.#run(batch);
  };

  /** One script call for the whole batch: its counters, its windows, three arguments per counter, the call's receipt. */
  #run(batch: readonly Pending[]): void {
    const receipt = this.#ledger.issue();
    const keysThenArgs: Array<string | number> = batch.map((p) => p.key);
    pushConsumeArgs(keysThenArgs, batch, receipt);
    const [firstKey, ...rest] = keysThenArgs as [string, ...Array<string | number>];
    const reply =
      batch.length === 1
        ? this.#client.oapiConsume(firstKey, ...rest)
        : this.#client.oapiConsumeMany(batch.length, ...keysThenArgs);
    reply.then(
      (counts) => {
        batch.forEach((pending, i) =>
          pending.resolve({
            allowed: counts[i * 3] === 1,
            hour: counts[i * 3 + 1] as number,
            day: counts[i * 3 + 2] as number,
          }),
        );
      },
      (err: unknown) => {
        const { hourStart, dayStart } = (batch[0] as Pending).request;
        const failure = this.#ledger.failed(receipt, { keys: batch.map((p) => p.key), hourStart, dayStart }, err);
        for (const pending of batch) pending.reject(failure);
      },
    );
  }

  /** Takes back the units of doubtful calls that Redis did count. Safe to call at any time. */
  reconcile(): Promise<void> {
    return this.#ledger.reconcile();
  }

  /** Adds units counted during an outage, in waves (see OutageMerge). */
  merge(entries: readonly MergeEntry[]): Promise<void> {
    return this.#merge.merge(entries);
  }

  async usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]> {
    await this.reconcile();
    try {
      const pipeline = (this.#client as Redis | Cluster).pipeline();
      for (const row of rows) pipeline.hmget(this.counterKey(keyHash, row.counterId), 'hs', 'hc', 'ds', 'dc');
      const replies = (await pipeline.exec()) ?? [];
      return rows.map((row, i) => {
        const [err, value] = replies[i] ?? [new Error('missing reply'), null];
        if (err) throw err;
        const [hs, hc, ds, dc] = (value as Array<string | null>).map((x) => (x === null ? undefined : Number(x)));
        return {
          hour: hs !== undefined && hs >= row.hourStart ? (hc ?? 0) : 0,
          day: ds !== undefined && ds >= row.dayStart ? (dc ?? 0) : 0,
        };
      });
    } catch (err) {
      throw toStoreError(err);
    }
  }

  async reset(keyHash: string, counterIds: readonly string[]): Promise<void> {
    if (counterIds.length === 0) return;
    try {
      await this.#client.unlink(...counterIds.map((id) => this.counterKey(keyHash, id)));
    } catch (err) {
      throw toStoreError(err);
    }
  }

  close(): void {
    this.#ledger.close();
  }
}

function sameWindows(a: ConsumeRequest, b: ConsumeRequest): boolean {
  return a.hourStart === b.hourStart && a.dayStart === b.dayStart && a.expireAt === b.expireAt;
}
