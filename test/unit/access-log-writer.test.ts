import { Writable } from 'node:stream';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  accessLogWriter,
  createLogger,
  jsonNumber,
  jsonString,
  type AccessRecord,
} from '../../src/observability/logger.js';

/** Access lines are written into the logger's output in pino's line format, and only at info and below. */

function capture(level: 'info' | 'warn'): {
  lines: () => Array<Record<string, unknown>>;
  raw: () => string;
  write: ReturnType<typeof accessLogWriter>;
  info: (msg: string) => void;
} {
  const chunks: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _encoding, done) {
      chunks.push(chunk.toString('utf8'));
      done();
    },
  });
  const logger = createLogger(level, destination);
  return {
    raw: () => chunks.join(''),
    lines: () =>
      chunks
        .join('')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    write: accessLogWriter(logger),
    info: (msg) => logger.info(msg),
  };
}

describe('accessLogWriter', () => {
  it('writes pino’s fields, the record’s present fields, and no absent ones', () => {
    const out = capture('info');
    out.info('before');
    out.write({
      reqId: 'r1',
      method: 'GET',
      endpoint: 'GET /orders/{id}',
      path: '/orders/"1"\n',
      status: 200,
      ms: 1.5,
    });
    const [pinoLine, accessLine] = out.lines();
    expect(Object.keys(accessLine ?? {}).slice(0, 3)).toEqual(['level', 'time', 'pid']);
    expect(accessLine).toEqual({
      level: pinoLine?.level,
      time: expect.any(Number) as number,
      pid: pinoLine?.pid,
      reqId: 'r1',
      method: 'GET',
      endpoint: 'GET /orders/{id}',
      path: '/orders/"1"\n',
      status: 200,
      ms: 1.5,
      msg: 'request',
    });
    expect(Math.abs((accessLine?.time as number) - Date.now())).toBeLessThan(5000);
  });

  it('writes nothing when the level is above info', () => {
    const out = capture('warn');
    out.write({ reqId: 'r2', method: 'GET', endpoint: 'unmatched', status: 404, ms: 0.2 });
    expect(out.lines()).toEqual([]);
  });
});

describe('the access line', () => {
  // Any string JSON can hold, escapes and lone surrogates included, or a field left out.
  const text = fc.oneof(fc.string({ unit: 'binary' }), fc.string(), fc.constantFrom('', '"', '\\', '\u0000', '\ud800'));
  const optionalText = fc.option(text, { nil: undefined });
  const number = fc.oneof(fc.integer(), fc.double(), fc.constantFrom(-0, 0.1 + 0.2, 1e21, 5e-7));
  const record = fc.record({
    reqId: text,
    method: optionalText,
    endpoint: text,
    path: optionalText,
    status: number,
    ms: number,
    upstreamMs: fc.option(number, { nil: undefined }),
    bridge: optionalText,
    address: optionalText,
    key: optionalText,
    keyId: optionalText,
    limit: optionalText,
    spent: optionalText,
    counter: optionalText,
    reason: optionalText,
  });

  it('is byte for byte what JSON.stringify writes for the same fields in the same order', () => {
    const out = capture('info');
    const records: AccessRecord[] = [];
    fc.assert(
      fc.property(record, (r) => {
        records.push(r);
        out.write(r);
      }),
      { numRuns: 500 },
    );
    const written = out.raw().split('\n').filter(Boolean);
    expect(written).toHaveLength(records.length);
    written.forEach((line, i) => {
      const r = records[i] as AccessRecord;
      const { time, pid } = JSON.parse(line) as { time: number; pid: number };
      expect(line).toBe(JSON.stringify({ level: 'info', time, pid, ...r, msg: 'request' }));
    });
  });

  it('quotes a string only as much as JSON.stringify does', () => {
    for (const value of ['plain', 'a"b', 'back\\slash', 'tab\t', '\u001f', 'é ✓ 🙂', '\udc00x', 'x\ud83d'])
      expect(jsonString(value)).toBe(JSON.stringify(value));
    for (const value of [0, -0, 1.25, NaN, Infinity, -Infinity, 1e21])
      expect(jsonNumber(value)).toBe(JSON.stringify(value));
  });

  it('writes durations of hundredths, and any other number, as JSON.stringify does', () => {
    // The access line's durations (Math.round(ms * 100) / 100), written from their whole part and hundredths.
    const hundredths = fc.integer({ min: 0, max: 2e11 }).map((n) => n / 100);
    for (const value of [0.01, 0.05, 0.1, 0.5, 0.99, 1, 1.01, 1.1, 1.13, 2.3, 10.07, 999_999_999.99, 1e9, 1e9 + 0.5])
      expect(jsonNumber(value)).toBe(JSON.stringify(value));
    fc.assert(
      fc.property(fc.oneof(hundredths, fc.double(), fc.integer()), (value) => {
        expect(jsonNumber(value)).toBe(JSON.stringify(value));
      }),
      { numRuns: 5000 },
    );
  });
});
