import net from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort, isRunning, startGateway, stopAllChildren } from '../../bench/processes.js';

/**
 * The benchmark's gateway start (bench/processes.ts): its log goes to /dev/null, so its ports
 * are drawn before it starts, and one taken in between by another process must not fail the run.
 */

const env = {
  EQT_BRIDGE_URL: 'http://127.0.0.1:9',
  FNO_BRIDGE_URL: 'http://127.0.0.1:9',
  API_KEY_MODE: 'any',
  LOG_LEVEL: 'warn',
};

function listeningServer(): Promise<{ port: number; close: () => Promise<void> }> {
  return new Promise((resolve, reject) => {
    const server = net.createServer((socket) => socket.destroy());
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      resolve({
        port: (server.address() as net.AddressInfo).port,
        close: () => new Promise((done) => server.close(() => done())),
      });
    });
  });
}

afterAll(stopAllChildren);

describe('bench startGateway', () => {
  it('draws new ports when one it drew was taken before the gateway could bind it', async () => {
    const taken = await listeningServer();
    try {
      const drawn: number[] = [];
      const draws = [taken.port];
      const gateway = await startGateway(env, {
        drawPort: async () => {
          const port = draws.shift() ?? (await freePort());
          drawn.push(port);
          return port;
        },
      });
      expect(drawn).toHaveLength(4);
      expect(drawn[0]).toBe(taken.port);
      expect(new URL(gateway.url).port).toBe(String(drawn[2]));
      expect((await fetch(`${gateway.adminUrl}/readyz`)).status).toBe(200);
      expect(isRunning(gateway.child)).toBe(true);
    } finally {
      await taken.close();
    }
  }, 30_000);

  it('gives up after three draws that were all taken, saying why', async () => {
    const taken = await listeningServer();
    try {
      let draws = 0;
      const start = startGateway(env, {
        drawPort: () => {
          draws++;
          return Promise.resolve(taken.port);
        },
      });
      await expect(start).rejects.toThrow('the port is already in use');
      expect(draws).toBe(6);
    } finally {
      await taken.close();
    }
  }, 30_000);
});
