import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { batchedDestination } from '../../src/observability/log-destination.js';
import { accessLogWriter, createLogger } from '../../src/observability/logger.js';

/** Log lines reach the writer in batches, in the order they were written, and none is held back for long. */

function recordingWriter(): {
  batches: string[];
  write(chunk: string): void;
  flushed: number;
  flush(cb?: () => void): void;
} {
  return {
    batches: [],
    flushed: 0,
    write(chunk) {
      this.batches.push(chunk);
    },
    flush(cb) {
      this.flushed++;
      cb?.();
    },
  };
}

describe('batchedDestination', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('hands lines over in one batch once they fill the batch size, in order; a longer line goes alone', () => {
    const writer = recordingWriter();
    const destination = batchedDestination(writer, { batchBytes: 10, flushMs: 100 });
    destination.write('aaaa\n');
    expect(writer.batches).toEqual([]);
    destination.write('bbbb\n');
    expect(writer.batches).toEqual(['aaaa\nbbbb\n']);
    destination.write('c\n');
    destination.write('dddddddddd\n');
    expect(writer.batches).toEqual(['aaaa\nbbbb\n', 'c\n', 'dddddddddd\n']);
  });

  it('counts a batch in UTF-8 bytes, not characters: no batch passes the bound', () => {
    const writer = recordingWriter();
    const destination = batchedDestination(writer, { batchBytes: 10, flushMs: 100 });
    // 4 characters, 7 bytes each: two would be 8 characters but 14 bytes.
    destination.write('ééé\n');
    destination.write('ééé\n');
    expect(writer.batches).toEqual(['ééé\n']);
    destination.flushSync();
    expect(writer.batches).toEqual(['ééé\n', 'ééé\n']);
  });

  it('hands over every line once, in order, in batches within the bound unless a line alone is longer', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.string({ unit: 'binary', maxLength: 40 }).map((text) => text.replaceAll('\n', '') + '\n'),
          { maxLength: 60 },
        ),
        fc.integer({ min: 1, max: 120 }),
        (lines, batchBytes) => {
          const writer = recordingWriter();
          const destination = batchedDestination(writer, { batchBytes, flushMs: 100 });
          for (const line of lines) destination.write(line);
          destination.flushSync();
          expect(writer.batches.join('')).toBe(lines.join(''));
          for (const batch of writer.batches) {
            const bytes = Buffer.byteLength(batch);
            const oneLine = batch.indexOf('\n') === batch.length - 1;
            expect(bytes <= batchBytes || oneLine).toBe(true);
          }
        },
      ),
      { numRuns: 500 },
    );
  });

  it('hands over what is gathered every flushMs, and nothing when nothing came', () => {
    const writer = recordingWriter();
    const destination = batchedDestination(writer, { batchBytes: 4096, flushMs: 100 });
    destination.write('one\n');
    vi.advanceTimersByTime(99);
    expect(writer.batches).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(writer.batches).toEqual(['one\n']);
    vi.advanceTimersByTime(500);
    expect(writer.batches).toEqual(['one\n']);
  });

  it('flush() hands over at once and then flushes the writer', () => {
    const writer = recordingWriter();
    const destination = batchedDestination(writer, { batchBytes: 4096, flushMs: 100 });
    destination.write('two\n');
    const done = vi.fn();
    destination.flush(done);
    expect(writer.batches).toEqual(['two\n']);
    expect(writer.flushed).toBe(1);
    expect(done).toHaveBeenCalledOnce();
    destination.write('three\n');
    destination.flushSync();
    expect(writer.batches).toEqual(['two\n', 'three\n']);
  });

  it('keeps pino’s own lines and access lines in the order they were written', () => {
    const writer = recordingWriter();
    const logger = createLogger('info', batchedDestination(writer, { batchBytes: 4096, flushMs: 100 }));
    const access = accessLogWriter(logger);
    logger.info('first');
    access({ reqId: 'r1', endpoint: 'GET /x', status: 200, ms: 1 });
    logger.warn('third');
    logger.flush();
    const lines = writer.batches
      .join('')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as { msg: string; reqId?: string });
    expect(lines.map((l) => l.reqId ?? l.msg)).toEqual(['first', 'r1', 'third']);
  });
});
