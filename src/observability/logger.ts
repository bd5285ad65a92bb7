import { createHash } from 'node:crypto';
import pino, { type DestinationStream, type Logger } from 'pino';
import type { LogLevel } from '../config/settings.js';

/**
 * JSON lines on stdout (pino). Secrets never reach a line: API keys appear only as a short
 * hash, bodies, headers and query strings are never logged, and the redaction below is a
 * second line of defence should a field of that name ever be added to a line.
 */

export type { Logger };

const REDACT = ['password', '*.password', 'authorization', '*.authorization', 'headers', '*.headers', 'body', '*.body', 'apiKey', '*.apiKey', 'token', '*.token'];

export function createLogger(level: LogLevel, destination?: DestinationStream): Logger {
  const options = {
    level,
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: { paths: REDACT, censor: '[redacted]' },
    formatters: { level: (label: string) => ({ level: label }) },
  };
  // Asynchronous writes keep logging off the request path: lines written while a write is in
  // flight are coalesced into the next one. No minimum length: a quiet gateway's lines still go out at once.
  return pino(options, destination ?? pino.destination({ dest: 1, sync: false }));
}

/** The short, non-reversible name of an API key (or of its full SHA-256 hash) used in logs. */
export function shortKeyHash(keyHash: string): string {
  return keyHash.slice(0, 12);
}

export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}
