import { constants } from 'node:fs';
import { open } from 'node:fs/promises';

/**
 * Reading a file the operator edits while the gateway serves (limits.yaml, the key file): what
 * is not a regular file, or is far larger than such a file can sensibly be, is refused with one
 * line before it is read. A FIFO put in its place would hold the read (and every reload queued
 * behind it) until something writes to it, and a file of hundreds of megabytes blocks the event
 * loop for seconds while it is parsed: either way the table in force must simply stay
 * (README "The limit table").
 */

/** The text of the file, or why it was not read (the message of its error line). */
export type ConfigFileText = { readonly text: string } | { readonly problem: string };

export async function readConfigFile(path: string, maxBytes: number): Promise<ConfigFileText> {
  let handle;
  try {
    // Non-blocking, so that opening a FIFO does not wait for a writer.
    handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    return { problem: (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'file not found' : 'file cannot be read' };
  }
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) return { problem: 'not a file' };
    if (stats.size > maxBytes)
      return {
        problem: `file of ${megabytes(stats.size)} MiB, over the ${megabytes(maxBytes)} MiB such a file may have`,
      };
    return { text: await handle.readFile('utf8') };
  } catch {
    return { problem: 'file cannot be read' };
  } finally {
    await handle.close().catch(() => {});
  }
}

function megabytes(bytes: number): string {
  return (bytes / 1024 / 1024).toFixed(bytes < 10 * 1024 * 1024 ? 1 : 0);
}
