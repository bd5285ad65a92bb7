import { StoreUnavailableError } from '../limits/store.js';
import { RedisBehindError } from './connection.js';

/** Any failure of a Redis call, as the typed store error the callers tell apart from answers. */
export function toStoreError(err: unknown): StoreUnavailableError {
  if (err instanceof StoreUnavailableError) return err;
  // Not sent: what is waiting on the connection already has not been answered (connection.ts).
  if (err instanceof RedisBehindError) return new StoreUnavailableError('timeout', err.message, { cause: err });
  const message = err instanceof Error ? err.message : String(err);
  if (/timed out/i.test(message))
    return new StoreUnavailableError('timeout', 'Redis command timed out', { cause: err });
  if (err instanceof Error && err.name === 'ReplyError')
    return new StoreUnavailableError('reply', `Redis refused the command: ${message}`, { cause: err });
  return new StoreUnavailableError('connection', `Redis unavailable: ${message}`, { cause: err });
}

/** Redis refused a command because its key holds something else than a counter: the server answered, about that key only. */
export function notACounter(err: unknown): boolean {
  return err instanceof Error && err.name === 'ReplyError' && err.message.startsWith('WRONGTYPE');
}
