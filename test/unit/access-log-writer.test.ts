import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { accessLogWriter, createLogger } from '../../src/observability/logger.js';

/** Access lines are written into the logger's output in pino's line format, and only at info and below. */

function capture(level: 'info' | 'warn'): {
  lines: () => Array<Record<string, unknown>>;
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
