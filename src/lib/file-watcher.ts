import { watch, type FSWatcher } from 'node:fs';
import { stat } from 'node:fs/promises';
import { setTimeout as pause } from 'node:timers/promises';
import { basename, dirname } from 'node:path';

/**
 * Calls `onChange` soon after a file changes on disk, however it was changed: written in
 * place, replaced by an editor's rename, or swapped by a Kubernetes ConfigMap update (a
 * symlink to a directory that is replaced atomically). The directory is watched, since a
 * rename replaces the file's inode, and the file is also polled (`stat` follows symlinks)
 * for file systems where watching is unreliable. Callers compare contents; a spurious call
 * costs one read. It is also called once as the watch starts: a change between the caller's
 * first read and the watch would otherwise go unseen until the next one.
 */

export interface FileWatch {
  close(): void;
}

export function watchFile(
  path: string,
  onChange: () => void,
  options: { pollMs?: number; debounceMs?: number } = {},
): FileWatch {
  const pollMs = options.pollMs ?? 2000;
  const debounceMs = options.debounceMs ?? 150;
  let debounce: NodeJS.Timeout | undefined;
  let lastSignature: string | undefined;
  let closed = false;

  const fire = (): void => {
    if (closed) return;
    clearTimeout(debounce);
    debounce = setTimeout(onChange, debounceMs);
    debounce.unref();
  };

  const signature = async (): Promise<string> => {
    try {
      const s = await stat(path);
      return `${s.ino}:${s.size}:${s.mtimeMs}`;
    } catch {
      return 'missing';
    }
  };

  let watcher: FSWatcher | undefined;
  try {
    const name = basename(path);
    // The file itself, or a ConfigMap's "..data" / "..<timestamp>" entries that lead to it;
    // other files of the directory (a log written next to it) are none of its business.
    watcher = watch(dirname(path), { persistent: false }, (_event, filename) => {
      if (filename === null || filename === name || String(filename).startsWith('..')) fire();
    });
    watcher.on('error', () => watcher?.close());
  } catch {
    watcher = undefined; // polling alone
  }

  const poller = setInterval(() => {
    void signature().then((s) => {
      if (lastSignature !== undefined && s !== lastSignature) fire();
      lastSignature = s;
    });
  }, pollMs);
  poller.unref();

  // The look as the watch starts. The poll's baseline is taken with it: one taken earlier could
  // predate what the look reads (a file written and removed again between two polls).
  const firstLook = setTimeout(() => {
    void signature().then((s) => {
      lastSignature = s;
      if (!closed) onChange();
    });
  }, debounceMs);
  firstLook.unref();

  return {
    close(): void {
      closed = true;
      clearTimeout(firstLook);
      clearTimeout(debounce);
      clearInterval(poller);
      watcher?.close();
    },
  };
}

/**
 * A watched file's read, for a caller that refuses what it reads: the watch can fire while an
 * editor's write is half done, and the half-written file is not what its author wrote. A read
 * that `refusal` describes is read again after `pauseMs`, until two reads in a row agree (at most
 * `reads` reads), so that a refusal is only told of a file that stays as it is (docs/operations.md
 * "Changing limits while it serves").
 */
export async function settledRead<T>(
  read: () => Promise<T>,
  refusal: (result: T) => string | undefined,
  options: { pauseMs?: number; reads?: number } = {},
): Promise<T> {
  const pauseMs = options.pauseMs ?? 150;
  const reads = options.reads ?? 4;
  let result = await read();
  let last = refusal(result);
  for (let n = 1; n < reads && last !== undefined; n++) {
    await pause(pauseMs);
    result = await read();
    const now = refusal(result);
    if (now === last) break;
    last = now;
  }
  return result;
}
