import type { Cluster } from 'ioredis';
import { MERGE_SCRIPT, mergeArgs } from '../limits/count-rules.js';
import { MergeFailedError, StoreUnavailableError, type CounterKey, type MergeEntry } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import type { DownMasters } from './down-masters.js';
import { toStoreError } from './errors.js';

/**
 * Adds the units an instance admitted during an outage to the Redis counters (docs/operations.md
 * "Redis": the outage's admissions end up in Redis), by the rule of mergeStep
 * (limits/count-rules.ts).
 */

/** Counters per merge call on a single Redis: a bound on how long one script holds Redis. */
export const MERGE_CHUNK = 200;

interface MergeCommands {
  oapiMerge(key: string, ...args: Array<number | string>): Promise<number>;
  oapiMergeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number>;
}

export class OutageMerge {
  readonly #client: RedisClient & MergeCommands;
  readonly #keyOf: (counter: CounterKey) => string;
  readonly #batching: boolean;
  readonly #downMasters: DownMasters | undefined;

  /**
   * `keyOf` names an entry's counter. `batching`: one script call per wave; by default on a
   * single Redis only, since on a Cluster a script's keys must share a slot. `downMasters`: on a
   * Cluster, the masters taken as away (shared with the consume batcher).
   */
  constructor(
    client: RedisClient,
    keyOf: (counter: CounterKey) => string,
    options: { readonly batching?: boolean; readonly downMasters?: DownMasters } = {},
  ) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and with
    // the number of keys given per call, for a wave.
    client.defineCommand('oapiMerge', { numberOfKeys: 1, lua: MERGE_SCRIPT });
    client.defineCommand('oapiMergeMany', { lua: MERGE_SCRIPT });
    this.#client = client as RedisClient & MergeCommands;
    this.#keyOf = keyOf;
    this.#batching = options.batching ?? !(client as Cluster).isCluster;
    this.#downMasters = this.#batching ? undefined : options.downMasters;
  }

  /**
   * In waves of MERGE_CHUNK counters, one after the other, so that requests counted meanwhile
   * never queue behind a long merge: one script call per wave when batching, else one per
   * counter. After a failed call no further wave is sent, and the error (MergeFailedError) names
   * the entries certainly not added: those of the waves not sent, and on a Cluster those of
   * masters taken as away, which are not sent either (a call that fails on its master's
   * connection marks that master, until a counting call there is answered).
   */
  async merge(entries: readonly MergeEntry[]): Promise<void> {
    const notApplied: MergeEntry[] = [];
    let failure: StoreUnavailableError | undefined;
    let away: StoreUnavailableError | undefined;
    /** Entries whose call was answered. */
    let applied = 0;
    for (let i = 0; i < entries.length; i += MERGE_CHUNK) {
      let wave = entries.slice(i, i + MERGE_CHUNK);
      if (failure) {
        notApplied.push(...wave);
        continue;
      }
      if (this.#downMasters?.any) {
        // Nothing goes to a master taken as away until a call there is answered.
        const sent: MergeEntry[] = [];
        for (const e of wave) (this.#downMasters.marked(this.#keyOf(e)) ? notApplied : sent).push(e);
        if (sent.length < wave.length) {
          away ??= new StoreUnavailableError('connection', 'Redis unavailable: a Cluster master is away', {
            part: true,
          });
          wave = sent;
        }
      }
      // A failed call may have added some of its counters (a script stopped by an error keeps
      // the writes it made), so only the waves never sent count as not applied.
      const results = await Promise.allSettled(this.#send(wave));
      results.forEach((result, k) => {
        if (result.status === 'fulfilled') {
          applied += this.#batching ? wave.length : 1;
          return;
        }
        const error = toStoreError(result.reason);
        if (error.kind === 'connection') this.#downMasters?.failed(this.#keyOf(wave[k] as MergeEntry));
        failure ??= error;
      });
    }
    const error = failure ?? away;
    if (error) throw new MergeFailedError(error, notApplied, applied);
  }

  #send(wave: readonly MergeEntry[]): Array<Promise<number>> {
    if (!this.#batching) return wave.map((e) => this.#client.oapiMerge(this.#keyOf(e), ...mergeArgs(e)));
    return [this.#client.oapiMergeMany(wave.length, ...wave.map(this.#keyOf), ...wave.flatMap(mergeArgs))];
  }
}
