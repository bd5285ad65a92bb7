import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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

  it('says that a port it was given is taken (redis-server exited), not that Redis did not answer', async () => {
    await expect(startRedisServer({ port: takenPort })).rejects.toThrow(
      `redis-server could not listen on port ${takenPort} (127.0.0.1)`,
    );
  });
});
