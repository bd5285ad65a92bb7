import pino, { type DestinationStream, type Logger } from 'pino';

/**
 * JSON lines on stdout (pino). Secrets never reach a line because no line is ever given one:
 * callers pass named fields only — an API key as a short hash, never a body, a header or a
 * query string — and a test scans the whole log for every secret it sent. (pino's redaction
 * would check every line for paths that are never there, at a cost on every request.)
 */

export type { Logger };
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';

export function createLogger(level: LogLevel, destination?: DestinationStream): Logger {
  const options = {
    level,
    base: { pid: process.pid },
    // pino's default "time": epoch milliseconds (an ISO string per line costs a Date per request).
    formatters: { level: (label: string) => ({ level: label }) },
  };
  // Lines are written in batches of 4 KB, or every 100 ms when fewer come: one write call per
  // dozen lines instead of one per request, and a quiet gateway's lines still appear at once.
  // The batch is written synchronously: a write of 4 KB costs less than handing it to the
  // thread pool. The runner flushes what is left at shutdown.
  return pino(options, destination ?? pino.destination({ dest: 1, sync: true, minLength: 4096, periodicFlush: 100 }));
}

/** The short, non-reversible name of an API key (or of its full SHA-256 hash) used in logs. */
export function shortKeyHash(keyHash: string): string {
  return keyHash.slice(0, 12);
}

/** One access-log line's fields (docs/operations.md "Logs"); absent ones are left out of the line. */
export interface AccessRecord {
  reqId: string;
  /** Absent when the request could not be read (an answer of the HTTP parser's failure). */
  method?: string | undefined;
  endpoint: string;
  path?: string | undefined;
  status: number;
  ms: number;
  upstreamMs?: number | undefined;
  bridge?: string | undefined;
  address?: string | undefined;
  key?: string | undefined;
  keyId?: string | undefined;
  limit?: string | undefined;
  spent?: string | undefined;
  counter?: string | undefined;
  reason?: string | undefined;
}

/**
 * Writes access-log lines into the logger's own output, in pino's line format (`level`, `time`,
 * `pid`, the fields, `msg`; absent fields left out), with one JSON.stringify: every request has one,
 * and pino's generic serializer, which quotes every key and checks every value anew, costs about
 * twice as much (docs/performance.md). Every other line goes through pino as usual.
 */
export function accessLogWriter(logger: Logger): (record: AccessRecord) => void {
  const stream = (logger as unknown as Record<symbol, { write(line: string): void } | undefined>)[
    pino.symbols.streamSym
  ];
  const pid = process.pid;
  return function writeAccessLine(r) {
    if (!stream || !logger.isLevelEnabled('info')) return;
    // Built field by field, in one shape for every line: JSON.stringify is fastest on such an object.
    const line = {
      level: 'info',
      time: Date.now(),
      pid,
      reqId: r.reqId,
      method: r.method,
      endpoint: r.endpoint,
      path: r.path,
      status: r.status,
      ms: r.ms,
      upstreamMs: r.upstreamMs,
      bridge: r.bridge,
      address: r.address,
      key: r.key,
      keyId: r.keyId,
      limit: r.limit,
      spent: r.spent,
      counter: r.counter,
      reason: r.reason,
      msg: 'request',
    };
    stream.write(JSON.stringify(line) + '\n');
  };
}
