import { randomBytes } from 'node:crypto';
import type { Cluster } from 'ioredis';
import { MERGE_SCRIPT, mergeArgs } from '../limits/count-rules.js';
import { MergeFailedError, StoreUnavailableError, type CounterKey, type MergeEntry } from '../limits/store.js';
import type { RedisClient } from './connection.js';
import type { DownMasters } from './down-masters.js';
import { toStoreError } from './errors.js';

/**
 * Adds the units an instance admitted during an outage to the Redis counters (docs/operations.md
 * "Redis": the outage's admissions end up in Redis), by the rule of mergeStep
 * (limits/count-rules.ts), each unit once.
 *
 * A call that failed (it timed out, the connection died, or Redis refused it, perhaps part-way)
 * may or may not have added its units. It is kept, and sent again as it was until it is answered
 * (or its counters have expired): before every later merge, once a second, and when the
 * connection is ready again. Every call carries this instance's mark and a sequence number,
 * which the script writes into each counter it adds to (`mg:…`), and a counter whose mark is
 * already at that number or past it is left as it is, so
 * a call sent again adds only to the counters the first sending did not reach. No later call goes
 * to a counter of a kept call until it is answered, so no later number overtakes its mark.
 */

/** Counters per merge call on a single Redis: a bound on how long one script holds Redis. */
export const MERGE_CHUNK = 200;

/** How often kept calls are sent again while no merge brings them. */
const RESEND_EVERY_MS = 1000;

/** Each call answers the positions (from 1) of its keys that hold something else than a counter. */
interface MergeCommands {
  oapiMerge(key: string, ...args: Array<number | string>): Promise<number[]>;
  oapiMergeMany(numberOfKeys: number, ...keysThenArgs: Array<string | number>): Promise<number[]>;
}

/** A call whose answer never came: sent again, with its number and entries as they were, until answered. */
interface KeptCall {
  readonly seq: number;
  readonly entries: readonly MergeEntry[];
}

export interface OutageMergeOptions {
  /** One script call per wave; by default on a single Redis only, since on a Cluster a script's keys must share a slot. */
  readonly batching?: boolean;
  /** On a Cluster, the masters taken as away (shared with the consume batcher). */
  readonly downMasters?: DownMasters;
  /** Told how kept calls ended once sent again: `ok` added, `failed` its key holds something else than a counter. */
  readonly keptSettled?: (counters: number, result: 'ok' | 'failed') => void;
  /** Epoch milliseconds (tests): a kept entry whose counter has expired is dropped. */
  readonly now?: () => number;
  /** How often kept calls are sent again by the timer (tests); RESEND_EVERY_MS unless given. */
  readonly resendEveryMs?: number;
}

export class OutageMerge {
  readonly #client: RedisClient & MergeCommands;
  readonly #keyOf: (counter: CounterKey) => string;
  readonly #batching: boolean;
  readonly #downMasters: DownMasters | undefined;
  readonly #keptSettled: OutageMergeOptions['keptSettled'];
  readonly #now: () => number;
  readonly #resendEveryMs: number;
  /** This instance's mark in every counter it merges into: the marks of different instances never meet. */
  readonly #field = 'mg:' + randomBytes(6).toString('base64url');
  #nextSeq = 1;
  #kept: KeptCall[] = [];
  #resendTimer: NodeJS.Timeout | undefined;
  /** The resend the timer queued, until it has run: one at a time. */
  #timedResend: Promise<void> | undefined;
  /** Merges, resends and forgets run one after the other. */
  #busy: Promise<unknown> = Promise.resolve();

  /** `keyOf` names an entry's counter. */
  constructor(client: RedisClient, keyOf: (counter: CounterKey) => string, options: OutageMergeOptions = {}) {
    // The same script twice: with one key (ioredis routes it by that key on a Cluster), and with
    // the number of keys given per call, for a wave.
    client.defineCommand('oapiMerge', { numberOfKeys: 1, lua: MERGE_SCRIPT });
    client.defineCommand('oapiMergeMany', { lua: MERGE_SCRIPT });
    this.#client = client as RedisClient & MergeCommands;
    this.#keyOf = keyOf;
    this.#batching = options.batching ?? !(client as Cluster).isCluster;
    this.#downMasters = this.#batching ? undefined : options.downMasters;
    this.#keptSettled = options.keptSettled;
    this.#now = options.now ?? Date.now;
    this.#resendEveryMs = options.resendEveryMs ?? RESEND_EVERY_MS;
    client.on('ready', this.#onReady);
  }

  readonly #onReady = (): void => void this.resendKept();

  /** Counters of calls kept to be sent again. */
  get keptCounters(): number {
    let n = 0;
    for (const call of this.#kept) n += call.entries.length;
    return n;
  }

  /**
   * Sends the kept calls again, then the entries in waves of MERGE_CHUNK counters (none while the
   * connection is not ready), one after the other, so that requests counted meanwhile never queue behind a long merge: one script call
   * per wave when batching, else one per counter. After a failed call no further wave is sent,
   * and the error (MergeFailedError) names the entries not added (those of the waves not sent,
   * on a Cluster those of masters taken as away, and those of counters a kept call still holds),
   * which may be tried again, and how many the failed calls hold, which are kept here. A call that
   * fails on its master's connection marks that master, until a counting call there is answered.
   */
  merge(entries: readonly MergeEntry[]): Promise<void> {
    return this.#exclusive(() => this.#merge(entries));
  }

  /** Sends the kept calls again now. Safe to call at any time. */
  resendKept(): Promise<void> {
    return this.#exclusive(() => this.#resendKept());
  }

  /**
   * Drops the entries of a key's counters on the given rows from the kept calls (they were reset),
   * after what is out. With `reset`, that is done first, with nothing sent meanwhile, and the
   * entries are dropped only if it succeeds (a reset that failed leaves the counters as they were).
   */
  forget(keyHash: string, counterIds: readonly string[], reset?: () => Promise<void>): Promise<void> {
    const rows = new Set(counterIds);
    const ofReset = (e: MergeEntry): boolean => e.keyHash === keyHash && rows.has(e.counterId);
    return this.#exclusive(async () => {
      await reset?.();
      this.#kept = this.#kept
        .map((call) => ({ seq: call.seq, entries: call.entries.filter((e) => !ofReset(e)) }))
        .filter((call) => call.entries.length > 0);
      this.#stopResendingIfDone();
    });
  }

  /** Stops sending kept calls by itself (on shutdown, after a last resendKept()). */
  close(): void {
    clearInterval(this.#resendTimer);
    this.#resendTimer = undefined;
    this.#client.off('ready', this.#onReady);
  }

  #exclusive(work: () => Promise<void>): Promise<void> {
    const run = this.#busy.then(work);
    this.#busy = run.catch(() => {});
    return run;
  }

  async #merge(entries: readonly MergeEntry[]): Promise<void> {
    // A call on a connection that is not ready could not run: none is sent, and none is kept.
    if (this.#client.status !== 'ready')
      throw new MergeFailedError(new StoreUnavailableError('connection', 'Redis unavailable: not connected'), entries);
    await this.#resendKept();
    const notApplied: MergeEntry[] = [];
    let failure: StoreUnavailableError | undefined;
    let away: StoreUnavailableError | undefined;
    const heldBack = this.#keptKeys();
    if (heldBack.size > 0) {
      const free: MergeEntry[] = [];
      for (const e of entries) (heldBack.has(this.#keyOf(e)) ? notApplied : free).push(e);
      if (free.length < entries.length)
        away = new StoreUnavailableError(
          'connection',
          'Redis unavailable: an earlier merge call of these counters is still to be answered',
        );
      entries = free;
    }
    /** Entries whose call was answered, those whose key holds something else, and those kept. */
    let applied = 0;
    let otherType = 0;
    let kept = 0;
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
      const seq = this.#nextSeq++;
      const results = await Promise.allSettled(this.#send(seq, wave));
      results.forEach((result, k) => {
        const entriesOfCall = this.#batching ? wave : [wave[k] as MergeEntry];
        if (result.status === 'fulfilled') {
          otherType += result.value.length;
          applied += entriesOfCall.length - result.value.length;
          return;
        }
        // Refused too (out of memory, BUSY, READONLY: most refusals pass): sent again, it adds nothing twice.
        failure ??= this.#failed(entriesOfCall, result.reason);
        this.#keep({ seq, entries: entriesOfCall });
        kept += entriesOfCall.length;
      });
    }
    const error = failure ?? away ?? (otherType > 0 ? otherTypeError() : undefined);
    if (error) throw new MergeFailedError(error, notApplied, applied, kept);
  }

  async #resendKept(): Promise<void> {
    if (this.#kept.length === 0 || this.#client.status !== 'ready') return;
    const now = this.#now();
    const calls = this.#kept
      // A counter whose day is over has expired: nothing is left to add to.
      .map((call) => ({ seq: call.seq, entries: call.entries.filter((e) => e.expireAt > now) }))
      .filter((call) => call.entries.length > 0);
    // Nothing goes to a master taken as away until a call there is answered.
    const toSend: KeptCall[] = [];
    const stay: KeptCall[] = [];
    for (const call of calls)
      (this.#downMasters?.any && call.entries.some((e) => this.#downMasters?.marked(this.#keyOf(e)))
        ? stay
        : toSend
      ).push(call);
    // A kept call's counters are no other kept call's: they can go at once.
    const results = await Promise.allSettled(toSend.map((call) => Promise.all(this.#send(call.seq, call.entries))));
    let ok = 0;
    let failed = 0;
    results.forEach((result, k) => {
      const call = toSend[k] as KeptCall;
      if (result.status === 'fulfilled') {
        const others = result.value.reduce((n, positions) => n + positions.length, 0);
        ok += call.entries.length - others;
        failed += others;
      } else {
        this.#failed(call.entries, result.reason);
        stay.push(call);
      }
    });
    this.#kept = stay;
    this.#stopResendingIfDone();
    if (ok > 0) this.#keptSettled?.(ok, 'ok');
    if (failed > 0) this.#keptSettled?.(failed, 'failed');
  }

  /** A call failed: on a Cluster, a failure on its master's connection marks the master. */
  #failed(entries: readonly MergeEntry[], reason: unknown): StoreUnavailableError {
    const error = toStoreError(reason);
    if (error.kind === 'connection' && !this.#batching)
      this.#downMasters?.failed(this.#keyOf(entries[0] as MergeEntry));
    return error;
  }

  #keep(call: KeptCall): void {
    this.#kept.push(call);
    this.#resendTimer ??= setInterval(this.#onTick, this.#resendEveryMs).unref();
  }

  /**
   * Behind a Redis that stays slow a resend takes a whole REDIS_TIMEOUT_MS, which may be more than
   * a second: a tick while the last tick's resend is still queued or out adds none, or they would
   * pile up in front of every later merge, reset and the last resend at shutdown.
   */
  readonly #onTick = (): void => {
    if (this.#timedResend) return;
    const done = (): void => {
      this.#timedResend = undefined;
    };
    this.#timedResend = this.resendKept().then(done, done);
  };

  #stopResendingIfDone(): void {
    if (this.#kept.length > 0) return;
    clearInterval(this.#resendTimer);
    this.#resendTimer = undefined;
  }

  #keptKeys(): Set<string> {
    const keys = new Set<string>();
    for (const call of this.#kept) for (const e of call.entries) keys.add(this.#keyOf(e));
    return keys;
  }

  /** One call per wave when batching, else one per entry; each with this instance's mark and the wave's number. */
  #send(seq: number, wave: readonly MergeEntry[]): Array<Promise<number[]>> {
    if (!this.#batching)
      return wave.map((e) => this.#client.oapiMerge(this.#keyOf(e), this.#field, seq, ...mergeArgs(e)));
    return [
      this.#client.oapiMergeMany(wave.length, ...wave.map(this.#keyOf), this.#field, seq, ...wave.flatMap(mergeArgs)),
    ];
  }
}

/** Keys that hold something else than a counter (another program wrote them) get no units: they are refused. */
function otherTypeError(): StoreUnavailableError {
  return new StoreUnavailableError('reply', 'Redis refused the command: a counter key holds something else');
}
