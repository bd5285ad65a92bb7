import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../src/observability/logger.js';
import { listen, LISTENER_ERROR_LOG_MS, PUBLIC_SETTINGS } from '../../src/wiring/servers.js';
import { waitFor } from '../helpers/faults.js';

/**
 * A listener's error once it listens: libuv reports a connection it could not accept (ENOBUFS,
 * ENOMEM, EMFILE past its reserve descriptor) as the server's 'error', which no client can be made
 * to cause on demand here; the test emits what Node emits then.
 */
describe('a listener error after start-up', () => {
  it('is logged, at most one line a second, and the listener goes on serving (regression: with no listener for it, the error ended the process)', async () => {
    const lines: string[] = [];
    const logger = createLogger(
      'info',
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(chunk.toString('utf8'));
          done();
        },
      }),
    );
    const server = http.createServer((_req, res) => res.end('ok'));
    await listen(server, 0, '127.0.0.1', PUBLIC_SETTINGS, logger);
    try {
      const failure = Object.assign(new Error('accept ENOBUFS'), { code: 'ENOBUFS', syscall: 'accept' });
      expect(() => server.emit('error', failure)).not.toThrow();
      const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(logged).toEqual([
        expect.objectContaining({
          level: 'error',
          listener: 'PORT',
          code: 'ENOBUFS',
          err: 'accept ENOBUFS',
          msg: 'listener error; still listening',
        }),
      ]);
      for (let i = 0; i < 500; i++) server.emit('error', failure);
      expect(lines).toHaveLength(1);
      await waitFor('the repeated errors told', () => lines.length === 2, LISTENER_ERROR_LOG_MS + 1000, 20);
      expect(JSON.parse(lines[1]!)).toEqual(
        expect.objectContaining({
          level: 'error',
          listener: 'PORT',
          code: 'ENOBUFS',
          repeated: 500,
          msg: 'listener error repeated; still listening',
        }),
      );
      const { port } = server.address() as AddressInfo;
      const reply = await fetch(`http://127.0.0.1:${port}/`);
      expect(await reply.text()).toBe('ok');
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
