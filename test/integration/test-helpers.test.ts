import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listeningLines } from '../helpers/child-gateway.js';
import { freePort, startRedisServer } from '../helpers/redis.js';

/** The suite's own helpers, where a flaw would show up as a flaky test elsewhere. */

describe('startRedisServer', () => {
  let taken: net.Server;
  let takenPort: number;
  beforeAll(async () => {
    taken = net.createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    takenPort = (taken.address() as net.AddressInfo).port;
  });
  afterAll(() => {
    taken.close();
  });

  it('draws another port when the one drawn is taken before redis-server binds it (regression: a flaky start)', async () => {
    const drawn: number[] = [];
    const redis = await startRedisServer({
      pickPort: async () => {
        const port = drawn.length === 0 ? takenPort : await freePort();
        drawn.push(port);
        return port;
      },
    });
    try {
      expect(drawn).toHaveLength(2);
      expect(redis.port).toBe(drawn[1]);
      expect(redis.url).toBe(`redis://127.0.0.1:${drawn[1]}`);
    } finally {
      await redis.stop();
    }
  });

  it('says that a port it was given is taken, with what redis-server printed', async () => {
    await expect(startRedisServer({ port: takenPort })).rejects.toThrow(
      new RegExp(`^redis-server on port ${takenPort} \\(127\\.0\\.0\\.1\\): exited\\n[^]*Address already in use`),
    );
  });

  it('does not take another Redis that answers on the drawn port for its own', async () => {
    const other = await startRedisServer();
    const drawn: number[] = [];
    const redis = await startRedisServer({
      pickPort: async () => {
        const port = drawn.length === 0 ? other.port : await freePort();
        drawn.push(port);
        return port;
      },
    });
    try {
      expect(drawn).toHaveLength(2);
      expect(redis.port).toBe(drawn[1]);
      expect(redis.pid).not.toBe(other.pid);
    } finally {
      await redis.stop();
      await other.stop();
    }
  });
});

describe('listeningLines', () => {
  it('reads whole lines only: the last may still be arriving', () => {
    const first = '{"level":"info","pid":1,"public":"127.0.0.1:1","msg":"gateway listening"}\n';
    const partial = '{"level":"info","pid":2,"admin":"127.0.0.1:2","msg":"gateway listening"';
    expect(listeningLines(first + partial)).toEqual([
      { level: 'info', pid: 1, public: '127.0.0.1:1', msg: 'gateway listening' },
    ]);
    expect(listeningLines(first + partial + '}\n')).toHaveLength(2);
  });
});
