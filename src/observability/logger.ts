import pino, { type DestinationStream, type Logger } from 'pino';
import { batchedDestination, type BatchedDestination } from './log-destination.js';

/**
 * JSON lines on stdout (pino). Secrets never reach a line because no line is ever given one:
 * callers pass named fields only — an API key as a short hash, never a body, a header or a
 * query string — and a test scans the whole log for every secret it sent. (pino's redaction
 * would check every line for paths that are never there, at a cost on every request.)
 */

export type { Logger };
export type LogLevel = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';

let stdout: BatchedDestination | undefined;

/** Linux's bound on a write to a pipe that is never split (pipe(7)). */
const PIPE_BUF = 4096;

/**
 * The process's one stdout destination, shared by every logger in it so their lines keep their
 * order. Lines are written in batches of at most PIPE_BUF (4 KB), or every 100 ms when fewer come:
 * one write call per dozen lines instead of one per request, no line cut into by another worker's
 * (log-destination.ts), and a quiet gateway's lines still appear at once.
 * A batch is written synchronously: a write of 4 KB costs less than handing it to the thread
 * pool. What is gathered is written out on the process's 'exit' event: a normal end,
 * process.exit() (the gateway's own after SIGTERM or SIGINT), an uncaught exception or
 * unhandled rejection. A process killed outright (SIGKILL) or ended by a fatal V8 error (out of
 * memory) has no 'exit' event, and loses up to 100 ms of lines (docs/operations.md "Logs").
 */
function stdoutDestination(): BatchedDestination {
  if (!stdout) {
    const destination = batchedDestination(pino.destination({ dest: 1, sync: true }), {
      batchBytes: PIPE_BUF,
      flushMs: 100,
    });
    process.once('exit', () => {
      try {
        destination.flushSync();
      } catch {
        // stdout is gone (closed, or a broken pipe): the lines cannot be written anywhere, and an
        // exception here would change the exit code.
      }
    });
    stdout = destination;
  }
  return stdout;
}

export function createLogger(level: LogLevel, destination?: DestinationStream): Logger {
  const options = {
    level,
    base: { pid: process.pid },
    // pino's default "time": epoch milliseconds (an ISO string per line costs a Date per request).
    formatters: { level: (label: string) => ({ level: label }) },
  };
  return pino(options, destination ?? stdoutDestination());
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
 * `pid`, the fields, `msg`; absent fields left out), byte for byte what JSON.stringify would
 * write for them (test/unit/access-log-writer.test.ts checks it on random records): every request
 * has one, and a line put together from its parts costs a fraction of a serializer's walk over
 * an object (docs/performance.md, change 9). Every other line goes through pino as usual.
 */
export function accessLogWriter(logger: Logger): (record: AccessRecord) => void {
  const stream = (logger as unknown as Record<symbol, { write(line: string): void } | undefined>)[
    pino.symbols.streamSym
  ];
  const head = `{"level":"info","time":`;
  const pidField = `,"pid":${process.pid}`;
  // Epoch milliseconds are past V8's small integers, and each new one goes through its slow
  // number-to-text path: under load a dozen lines share a millisecond, and its text.
  let timeMs = 0;
  let timeText = '0';
  return function writeAccessLine(r) {
    if (!stream || !logger.isLevelEnabled('info')) return;
    const now = Date.now();
    if (now !== timeMs) timeText = String((timeMs = now));
    let line = head + timeText + pidField + ',"reqId":' + jsonString(r.reqId);
    if (r.method !== undefined) line += ',"method":' + jsonString(r.method);
    line += ',"endpoint":' + jsonString(r.endpoint);
    if (r.path !== undefined) line += ',"path":' + jsonString(r.path);
    line += ',"status":' + jsonNumber(r.status) + ',"ms":' + jsonNumber(r.ms);
    if (r.upstreamMs !== undefined) line += ',"upstreamMs":' + jsonNumber(r.upstreamMs);
    if (r.bridge !== undefined) line += ',"bridge":' + jsonString(r.bridge);
    if (r.address !== undefined) line += ',"address":' + jsonString(r.address);
    if (r.key !== undefined) line += ',"key":' + jsonString(r.key);
    if (r.keyId !== undefined) line += ',"keyId":' + jsonString(r.keyId);
    if (r.limit !== undefined) line += ',"limit":' + jsonString(r.limit);
    if (r.spent !== undefined) line += ',"spent":' + jsonString(r.spent);
    if (r.counter !== undefined) line += ',"counter":' + jsonString(r.counter);
    if (r.reason !== undefined) line += ',"reason":' + jsonString(r.reason);
    stream.write(line + ',"msg":"request"}\n');
  };
}

/** Characters JSON.stringify writes escaped: controls, `"`, `\\`, and surrogates (escaped when unpaired). */
// eslint-disable-next-line no-control-regex -- the control characters are what is looked for
const NEEDS_ESCAPE = /[\u0000-\u001f"\\\ud800-\udfff]/;

/** A string as JSON.stringify writes it; the fields of an access line almost never need escaping. */
export function jsonString(value: string): string {
  return NEEDS_ESCAPE.test(value) ? JSON.stringify(value) : '"' + value + '"';
}

/**
 * A number as JSON.stringify writes it. The access line's durations are hundredths of a
 * millisecond, and V8 writes a fraction through its slow shortest-digits path: one with at most
 * two decimals is written from its whole part and its hundredths, small integers V8 keeps the
 * text of. The same digits: the two-decimal form reads back as the same number, and no shorter
 * one does at these magnitudes.
 */
export function jsonNumber(value: number): string {
  if (value >= 0 && value < 1e9) {
    const hundredths = Math.round(value * 100);
    if (hundredths / 100 === value) {
      const whole = Math.floor(value);
      const fraction = hundredths - whole * 100;
      if (fraction === 0) return String(whole);
      if (fraction % 10 === 0) return whole + '.' + fraction / 10;
      return whole + (fraction < 10 ? '.0' : '.') + fraction;
    }
  }
  return Number.isFinite(value) ? String(value) : 'null';
}
