import type { Logger } from '../observability/logger.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import { settledRead, watchFile, type FileWatch } from '../lib/file-watcher.js';
import type { LimitTable } from '../limits/limit-table.js';
import { readLimitsFile, type LimitsLoad } from './load-limits.js';
import { formatSourceError, refusalText, type SourceError } from '../lib/yaml-source.js';

/**
 * The limit table in force, and its reloads (docs/operations.md "Changing limits while it serves"): on a change of the file, on
 * SIGHUP and on the admin endpoint. A table that fails validation is logged, counted and
 * refused, and the one in force stays. Requests read the snapshot through `current()` once
 * and keep it, so a swap never changes the rules under a request in flight.
 */

export type ReloadTrigger = 'start' | 'file' | 'signal' | 'admin';
export type ReloadResult =
  | { readonly ok: true; readonly table: LimitTable; readonly changed: boolean }
  | { readonly ok: false; readonly errors: readonly SourceError[]; readonly unread?: string };

export class TableHolder {
  readonly path: string;
  readonly displayName: string;
  readonly #logger: Logger;
  readonly #metrics: GatewayMetrics;
  readonly #listeners: Array<(table: LimitTable, previous: LimitTable | undefined) => void> = [];
  #current: LimitTable | undefined;
  /** Content of the last refused file: a watcher firing again for it says nothing new. */
  #refusedContent: string | undefined;
  #queue: Promise<unknown> = Promise.resolve();
  #watch: FileWatch | undefined;

  constructor(options: { path: string; displayName: string; logger: Logger; metrics: GatewayMetrics }) {
    this.path = options.path;
    this.displayName = options.displayName;
    this.#logger = options.logger;
    this.#metrics = options.metrics;
  }

  current(): LimitTable | undefined {
    return this.#current;
  }

  onChange(listener: (table: LimitTable, previous: LimitTable | undefined) => void): void {
    this.#listeners.push(listener);
  }

  /** Loads the file afresh; loads never overlap. */
  reload(trigger: ReloadTrigger): Promise<ReloadResult> {
    const run = this.#queue.then(() => this.#load(trigger));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  watch(pollMs?: number): void {
    this.#watch ??= watchFile(this.path, () => void this.reload('file'), pollMs === undefined ? {} : { pollMs });
  }

  close(): void {
    this.#watch?.close();
  }

  async #load(trigger: ReloadTrigger): Promise<ReloadResult> {
    const read = (): Promise<LimitsLoad> => readLimitsFile(this.path, this.displayName);
    // The watch may fire on an editor's write half done: refuse only a file that stays as it is.
    const result = trigger === 'file' ? await settledRead(read, refusalText) : await read();
    if (!result.ok) {
      const content = refusalText(result)!;
      if (trigger === 'file' && content === this.#refusedContent) return result;
      this.#refusedContent = content;
      this.#metrics.reloads.labels('invalid').inc();
      this.#logger.error(
        { trigger, file: this.displayName, errors: result.errors.map(formatSourceError) },
        this.#current ? 'limit table refused; the table in force stays' : 'limit table refused',
      );
      return result;
    }
    const wasRefused = this.#refusedContent !== undefined;
    this.#refusedContent = undefined;
    const previous = this.#current;
    if (previous && previous.hash === result.table.hash) {
      // A file put back to the table in force after a refusal: the last line said "refused", so say it is good again.
      if (trigger !== 'file' || wasRefused) {
        this.#metrics.reloads.labels('unchanged').inc();
        this.#logger.info(
          { trigger, file: this.displayName, hash: previous.hash },
          wasRefused ? 'limit table valid again; the table in force is unchanged' : 'limit table unchanged',
        );
      }
      return { ok: true, table: previous, changed: false };
    }
    this.#current = result.table;
    this.#metrics.reloads.labels('ok').inc();
    this.#metrics.tableLoaded.set(result.table.loadedAt.getTime() / 1000);
    this.#metrics.tableRows.set(result.table.rows.length);
    this.#logger.info(
      { trigger, file: this.displayName, hash: result.table.hash, rows: result.table.rows.length },
      'limit table loaded',
    );
    for (const listener of this.#listeners) listener(result.table, previous);
    return { ok: true, table: result.table, changed: true };
  }
}
