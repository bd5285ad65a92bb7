import type { DestinationStream } from 'pino';

/**
 * The log's output: lines gathered into batches of at most `batchBytes` bytes and handed to the
 * writer (pino's own sonic-boom destination, which writes them synchronously and retries a full
 * pipe) one batch at a time, or every `flushMs` when fewer come, so a quiet gateway's lines still
 * appear at once. Every line pino writes comes through here too, so lines keep their order.
 *
 * The bound is what keeps lines whole with WORKERS=n, whose processes share the stdout they
 * inherited: a write of at most PIPE_BUF bytes to a pipe is never split or mixed with another
 * process's, a longer one can be when the pipe is full (pipe(7); docs/operations.md "Logs").
 * A single line longer than a batch is handed over alone.
 *
 * sonic-boom's own `minLength` gathers lines by appending each to one growing string and
 * measuring its UTF-8 length again on every line, which flattens and copies the whole pending
 * batch once per line; here a line is measured once and pushed to an array, and a batch is
 * joined once (docs/performance.md, change 9).
 */

/** What the batch is handed to: sonic-boom, or any writable stream in tests. */
export interface LineWriter {
  write(chunk: string): unknown;
  flush?(cb?: (err?: Error | null) => void): void;
  flushSync?(): void;
}

export interface BatchedDestination extends DestinationStream {
  /** Hands what is gathered to the writer now, then lets the writer flush (pino's `logger.flush()`). */
  flush(cb?: (err?: Error | null) => void): void;
  /** Hands what is gathered to the writer now, synchronously. */
  flushSync(): void;
}

export function batchedDestination(
  writer: LineWriter,
  options: { readonly batchBytes: number; readonly flushMs: number },
): BatchedDestination {
  const { batchBytes } = options;
  let lines: string[] = [];
  /** UTF-8 bytes of `lines`. */
  let pending = 0;

  const handOver = (): void => {
    if (lines.length === 0) return;
    const batch = lines.length === 1 ? (lines[0] as string) : lines.join('');
    lines = [];
    pending = 0;
    writer.write(batch);
  };

  const timer = setInterval(handOver, options.flushMs);
  timer.unref();

  return {
    write(line: string): void {
      const bytes = Buffer.byteLength(line);
      if (pending + bytes > batchBytes) handOver();
      lines.push(line);
      pending += bytes;
      if (pending >= batchBytes) handOver();
    },
    flush(cb) {
      handOver();
      if (writer.flush) writer.flush(cb);
      else cb?.();
    },
    flushSync() {
      handOver();
      writer.flushSync?.();
    },
  };
}
