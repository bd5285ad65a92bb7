/**
 * The counter-store contract. A backend implements four small methods; the policy (windows,
 * plans, refusal cache, what to do while the store is away) lives in the limiter.
 *
 * One counter holds both windows of one (API key, row) pair. `consume` is a single atomic
 * step: when both windows have room it adds one to each, otherwise it changes nothing, so a
 * refused request uses none of either window (README "A request, step by step", step 3). The
 * rules every backend follows, countStep and mergeStep, are in count-rules.ts.
 */

export interface CounterKey {
  /** Hash of the API key (the key itself never reaches a store). */
  readonly keyHash: string;
  /** `LimitRow.counterId`. */
  readonly counterId: string;
}

export interface WindowIds {
  /** Start of the hour window, epoch seconds. */
  readonly hourStart: number;
  /** Start of the day window, epoch seconds. */
  readonly dayStart: number;
  /**
   * The table's timezone the windows are of (the gateway always gives it). A counter written
   * under another one had other bounds, and keeps its count while its windows overlap these
   * (count-rules.ts, README "The limit table").
   */
  readonly zone?: string | undefined;
}

export interface ConsumeRequest extends CounterKey, WindowIds {
  readonly hourLimit: number;
  readonly dayLimit: number;
  /** Epoch milliseconds after which the counter may be dropped (the end of its day, plus slack). */
  readonly expireAt: number;
  /** Count even past the limits (shadow rows: counted, never refused). */
  readonly force: boolean;
}

export interface Counts {
  readonly allowed: boolean;
  /** Units used in the hour and day windows after this step. */
  readonly hour: number;
  readonly day: number;
}

export interface Usage {
  readonly hour: number;
  readonly day: number;
}

/**
 * Units one instance counted on its own (its insurance counters, while the store was away),
 * to be added to the store's counter of the same (key, row) once the store is back.
 */
export interface MergeEntry extends CounterKey, WindowIds {
  /** Units counted in the hour window starting at `hourStart`, and in the day window starting at `dayStart`. */
  readonly hour: number;
  readonly day: number;
  /** As in ConsumeRequest: when the counter may be dropped. */
  readonly expireAt: number;
}

export interface CounterStore {
  consume(request: ConsumeRequest): Promise<Counts>;
  /** Adds units counted elsewhere to their windows, past the limits if need be (see mergeStep in count-rules.ts). */
  merge(entries: readonly MergeEntry[]): Promise<void>;
  /** Units used by one key in the given windows of several rows, in the order asked. */
  usage(keyHash: string, rows: ReadonlyArray<{ readonly counterId: string } & WindowIds>): Promise<Usage[]>;
  /** Drops the counters of one key on the given rows. */
  reset(keyHash: string, counterIds: readonly string[]): Promise<void>;
}

/**
 * The store could not answer (unreachable, timed out, refused the command). Told apart from
 * an over-limit answer by type, so a store fault never reads as a refusal or an admission.
 * `part`: only a part of the store failed (a Redis Cluster master, which the store itself takes
 * as away until it answers again; or one counter's key, which holds something else), and the
 * rest still answers: only requests on that part are decided without the store.
 */
export class StoreUnavailableError extends Error {
  readonly kind: 'timeout' | 'connection' | 'reply';
  readonly part: boolean;

  constructor(
    kind: 'timeout' | 'connection' | 'reply',
    message: string,
    options?: { cause?: unknown; part?: boolean },
  ) {
    super(message, options);
    this.name = 'StoreUnavailableError';
    this.kind = kind;
    this.part = options?.part ?? false;
  }
}

/**
 * A merge that failed part-way. `notApplied` are the entries it certainly did not add, which may
 * be tried again; `applied` of the others it certainly added (their calls were answered); `kept`
 * of them the store holds and adds itself once it can (calls whose answer never came, sent again
 * until answered: redis/outage-merge.ts); the rest may have been added.
 */
export class MergeFailedError extends StoreUnavailableError {
  readonly notApplied: readonly MergeEntry[];
  readonly applied: number;
  readonly kept: number;

  constructor(cause: StoreUnavailableError, notApplied: readonly MergeEntry[], applied = 0, kept = 0) {
    super(cause.kind, cause.message, { cause, part: cause.part });
    this.name = 'MergeFailedError';
    this.notApplied = notApplied;
    this.applied = applied;
    this.kept = kept;
  }
}
