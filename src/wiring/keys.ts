import { existsSync } from 'node:fs';
import type { Settings } from '../config/settings.js';
import type { TableHolder } from '../config/table-holder.js';
import { InvalidKeyGuard } from '../keys/guard.js';
import { readKeyFile, type KeyFileLoad } from '../keys/key-file.js';
import { KeyRegistry } from '../keys/registry.js';
import { settledRead, watchFile } from '../lib/file-watcher.js';
import { formatSourceError, refusalText } from '../lib/yaml-source.js';
import type { LimitTable } from '../limits/limit-table.js';
import type { Logger } from '../observability/logger.js';
import type { Backend } from './backend.js';
import type { Closers } from './closers.js';
import { StartupError } from './startup-error.js';

/**
 * The API keys of one instance (README "API keys and plans"): the key file (optional, watched even
 * before it exists), the keys issued through the admin API (in the backend, polled as a backstop for
 * a lost announcement), and the invalid-key guard.
 */
export interface KeyAssembly {
  readonly registry: KeyRegistry;
  readonly guard: InvalidKeyGuard;
  /**
   * Reads the key file again, against the plans of the table in force: SIGHUP and the admin endpoint
   * reload both files (README), also when the table is refused. A new table re-reads it on its own.
   */
  reloadKeyFile(since?: number): Promise<void>;
  /** Now, for `reloadKeyFile(since)`: a read of the key file begun after it is as good as a new one. */
  keyFileClock(): number;
  /**
   * Whether this instance can tell valid keys: in `registered` mode only once it read the issued
   * keys (it tries again now if it has not yet).
   */
  readonly ready: () => Promise<boolean>;
}

const ISSUED_KEYS_POLL_MS = 500;

export async function assembleKeys(
  settings: Settings,
  backend: Backend,
  tables: TableHolder,
  logger: Logger,
  closers: Closers,
  options: { displayName: (path: string) => string; watchPollMs?: number | undefined },
): Promise<KeyAssembly> {
  const registry = new KeyRegistry(backend.issuedKeys, (err) =>
    logger.debug({ err: (err as Error).message }, 'issued keys could not be checked'),
  );
  const keyFile = keyFileLoads(settings, registry, tables, logger, options.displayName(settings.apiKeysFile));
  // The issued keys first: the key file may not take their ids (when they cannot be read yet, revoke()
  // still reaches an issued key whose id the file takes).
  await registry
    .refresh()
    .catch((err: Error) => logger.warn({ err: err.message }, 'issued keys could not be loaded yet'));
  await keyFile.first();
  const reloadKeyFile = keyFile.reload;

  // An issued key read after the key file (Redis was away at start-up, or another instance issued
  // the id) may take the id of one of its entries: the file is read again and refused, saying so,
  // once per such set of ids (README "API keys and plans").
  let takenIds = registry.idsOfBoth().join(',');
  let issuedIds = registry.issuedIds();
  registry.onRefreshed(() => {
    const taken = registry.idsOfBoth().join(',');
    if (taken !== takenIds && taken !== '') void reloadKeyFile();
    takenIds = taken;
    // A file refused for the id of an issued key is read again once that key is revoked, as it is once a
    // table brings a plan it lacked: it would otherwise stay refused until its next edit. Read as the
    // watcher reads it, a refusal found again is not told again, and a file unchanged says nothing.
    const ids = registry.issuedIds();
    if ([...issuedIds].some((id) => !ids.has(id))) void keyFile.watched();
    issuedIds = ids;
  });
  registry.startPolling(ISSUED_KEYS_POLL_MS);
  // Keys that could not be read at start-up (docs/operations.md "Redis") are read as soon as Redis is back.
  backend.onConnected(() => void registry.refresh().catch(() => {}));
  closers.add('issued-key polling', () => registry.stop());
  const watch = watchFile(settings.apiKeysFile, () => void keyFile.watched(), {
    ...(options.watchPollMs ? { pollMs: options.watchPollMs } : {}),
  });
  closers.add('key file watch', () => watch.close());

  const ready = async (): Promise<boolean> =>
    settings.apiKeyMode !== 'registered' ||
    registry.loaded ||
    registry.refresh().then(
      () => true,
      () => false,
    );
  return {
    registry,
    guard: invalidKeyGuard(settings, backend, logger),
    reloadKeyFile,
    keyFileClock: keyFile.clock,
    ready,
  };
}

/**
 * The loads of the key file: against the plans of the table in force and the ids issued through the
 * admin API (README "API keys and plans"). `first` stops start-up on a bad file; a later load that is
 * refused leaves the keys in force.
 */
function keyFileLoads(
  settings: Settings,
  registry: KeyRegistry,
  tables: TableHolder,
  logger: Logger,
  fileName: string,
): {
  readonly first: () => Promise<void>;
  readonly reload: (since?: number) => Promise<void>;
  /** The watcher's: a refusal it finds again is not told again. */
  readonly watched: () => Promise<void>;
  readonly clock: () => number;
} {
  const read = async (): Promise<KeyFileLoad> =>
    existsSync(settings.apiKeysFile)
      ? readKeyFile(settings.apiKeysFile, fileName, new Set(tables.current()?.plans.keys() ?? []), registry.issuedIds())
      : { ok: true, keys: [] };
  // What was loaded last: a write that changes nothing (the watcher may see one write twice) says nothing.
  let loadedKeys: string | undefined;
  let refused = false;
  const apply = (result: Extract<KeyFileLoad, { ok: true }>, announce: boolean): void => {
    registry.setFileKeys(result.keys);
    const signature = result.keys.map((k) => `${k.id}:${k.sha256}:${k.plan ?? ''}`).join(',');
    const wasRefused = refused;
    refused = false;
    if (signature === loadedKeys) {
      // After a refusal the last line said "refused": say that the file is good again.
      if (wasRefused)
        logger.info(
          { file: fileName, keys: result.keys.length },
          'key file valid again; the keys in force are unchanged',
        );
      return;
    }
    loadedKeys = signature;
    if (!announce) return;
    const present = existsSync(settings.apiKeysFile);
    logger.info(
      { file: fileName, keys: result.keys.length },
      present ? 'key file loaded' : 'no key file; only keys issued through the admin API pass',
    );
  };

  const loadFirst = async (): Promise<void> => {
    const result = await read();
    if (!result.ok) throw new StartupError(result.errors.map(formatSourceError).join('\n'));
    apply(result, settings.apiKeyMode === 'registered');
  };

  // The watcher may see one write twice (its event and its poll): a refusal of the content refused
  // last says nothing new then, as for the table. A SIGHUP, the admin reload or a new table says it again.
  let refusedErrors: string | undefined;
  let loud = false;
  const load = async (settle = false): Promise<void> => {
    const sayRefusal = loud;
    loud = false;
    // The watch may fire on an editor's write half done: refuse only a file that stays as it is.
    const result = settle ? await settledRead(read, refusalText) : await read();
    if (!result.ok) {
      refused = true;
      const errors = result.errors.map(formatSourceError);
      if (sayRefusal || errors.join('\n') !== refusedErrors)
        logger.error({ errors }, 'key file refused; the keys in force stay');
      refusedErrors = errors.join('\n');
      return;
    }
    refusedErrors = undefined;
    apply(result, true);
  };
  const runs = serialRuns();
  const reload = (since?: number): Promise<void> => {
    loud = true;
    return runs.again(load, since);
  };
  tables.onChange((table, previous) => {
    if (refused || !samePlans(table, previous)) void reload();
  });
  return { first: () => runs.run(loadFirst), reload, watched: () => runs.again(() => load(true)), clock: runs.clock };
}

interface SerialRuns {
  /** Runs `step` once the runs before it are done. */
  readonly run: (step: () => Promise<void>) => Promise<void>;
  /** Runs `step` once more, unless a run queued and not begun yet, or one begun after `since`, will do. */
  readonly again: (step: () => Promise<void>, since?: number) => Promise<void>;
  /** The number of runs begun: a `since` for `again`. */
  readonly clock: () => number;
}

/**
 * Loads of the key file one at a time, so that an older read never replaces a newer one (the
 * watcher, SIGHUP and a new table may meet). A load queued and not begun reads after every request
 * made meanwhile, so they share it; one begun after `since` is as good (a new table may have read
 * the file during a SIGHUP's reload, which then need not read it again).
 */
function serialRuns(): SerialRuns {
  let done: Promise<unknown> = Promise.resolve();
  let begun = 0;
  let begunAt = 0;
  let waiting: Promise<void> | undefined;
  let latest: Promise<void> = Promise.resolve();
  const run = (step: () => Promise<void>): Promise<void> => {
    const next = done.then(() => {
      begunAt = ++begun;
      return step();
    });
    done = next.catch(() => undefined);
    return next;
  };
  const again = (step: () => Promise<void>, since?: number): Promise<void> => {
    if (since !== undefined && begunAt > since) return latest;
    waiting ??= latest = run(() => {
      waiting = undefined;
      return step();
    });
    return waiting;
  };
  return { run, again, clock: () => begun };
}

/**
 * Whether two tables name the same plans. The key file is valid only against the plans of the table in
 * force (README "API keys and plans"): a file refused for a plan the table lacked is read again when a
 * table brings the plan, rather than waiting for its next edit or a SIGHUP.
 */
function samePlans(table: LimitTable, previous: LimitTable | undefined): boolean {
  if (!previous || previous.plans.size !== table.plans.size) return false;
  for (const plan of table.plans.keys()) if (!previous.plans.has(plan)) return false;
  return true;
}

function invalidKeyGuard(settings: Settings, backend: Backend, logger: Logger): InvalidKeyGuard {
  return new InvalidKeyGuard({
    client: backend.client,
    prefix: settings.redisKeyPrefix,
    attempts: settings.invalidKeyAttempts,
    windowSeconds: settings.invalidKeyWindowSeconds,
    // Every instance refuses the address from now on, not only those that see it guess.
    onBlock: (address, ms) => {
      logger.warn({ address, seconds: Math.ceil(ms / 1000) }, 'address blocked for sending invalid API keys');
      void backend.events.publish({ type: 'address-blocked', address, ms }).catch(() => {});
    },
  });
}
