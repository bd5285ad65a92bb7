import { createHash } from 'node:crypto';
import pino, { type DestinationStream, type Logger } from 'pino';
import type { LogLevel } from '../config/settings.js';

/**
 * JSON lines on stdout (pino). Secrets never reach a line because no line is ever given one:
 * callers pass named fields only — an API key as a short hash, never a body, a header or a
 * query string — and a test scans the whole log for every secret it sent. (pino's redaction
 * would check every line for paths that are never there, at a cost on every request.)
 */

export type { Logger };

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

export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}
