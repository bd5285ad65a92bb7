import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StoreUnavailableError } from '../../src/limits/store.js';
import { ConsumeBatcher } from '../../src/redis/consume-batcher.js';
import {
  commandsWaiting,
  MAX_COMMANDS_WAITING,
  RedisBehindError,
  silentConnectionMs,
  type RedisClient,
} from '../../src/redis/connection.js';
import { ReceiptLedger } from '../../src/redis/receipt-ledger.js';
import { waitFor } from '../helpers/faults.js';
import { connectedClient, redisClient, startRedisServer, type RedisProcess } from '../helpers/redis.js';
import { startRedisProxy } from '../helpers/redis-proxy.js';
import { request } from '../helpers/store-contract.js';

/**
 * A Redis that stops answering while the kernel keeps its connection (the process stopped with
 * SIGSTOP, as a proxy that no longer forwards would look): docs/operations.md "Redis".
 */

let own: RedisProcess;
let client: RedisClient;
let ledger: ReceiptLedger;

beforeAll(async () => {
  own = await startRedisServer();
  client = await connectedClient(own.url, 200);
  ledger = new ReceiptLedger(client);
});
afterAll(async () => {
  ledger.close();
  client.disconnect();
  await own.stop();
});

/** Stops the test's Redis until `resume()`; the connection stays up (the kernel still accepts). */
function stopRedis(): { resume(): void } {
  process.kill(own.pid, 'SIGSTOP');
  let resumed = false;
  return {
    resume: () => {
      if (resumed) return;
      resumed = true;
      process.kill(own.pid, 'SIGCONT');
    },
  };
}

describe('a Redis that stops answering', () => {
  it('holds at most MAX_COMMANDS_WAITING commands on the connection, fails the others unsent, and answers again when Redis does (regression: every command of the stall stayed queued, with its arguments, until Redis answered)', async () => {
    const batcher = new ConsumeBatcher(client, ledger);
    await batcher.consume('stall-warm', request());
    const stopped = stopRedis();
    try {
      const extra = 50;
      const outcomes = Array.from({ length: MAX_COMMANDS_WAITING + extra }, () =>
        client.ping().then(
          () => 'answered',
          (err: Error) => (err instanceof RedisBehindError ? 'not sent' : err.message),
        ),
      );
      expect(commandsWaiting(client)).toBe(MAX_COMMANDS_WAITING);
      // A request to count is decided without Redis, and leaves no call in doubt: it was never sent.
      const counted = await batcher.consume('stall-counter', request()).catch((err: unknown) => err);
      expect(counted).toBeInstanceOf(StoreUnavailableError);
      expect((counted as StoreUnavailableError).kind).toBe('timeout');
      expect(ledger.inDoubt).toBe(0);
      const settled = await Promise.all(outcomes);
      expect(settled.filter((o) => o === 'not sent')).toHaveLength(extra);
      expect(settled.filter((o) => o === 'Command timed out')).toHaveLength(MAX_COMMANDS_WAITING);
      expect(client.status).toBe('ready');
    } finally {
      stopped.resume();
    }
    // The stalled commands' answers come in order and empty the queue; the connection counts again.
    await waitFor('the stalled commands answered', () => commandsWaiting(client) === 0, 5000, 20);
    expect(await client.ping()).toBe('PONG');
    expect(await batcher.consume('stall-counter', request())).toEqual({ allowed: true, hour: 1, day: 1 });
  });

  it('behind a proxy that stops forwarding its connection, opens another after a silence of silentConnectionMs, and counts in Redis again, exactly (regression: the gateway waited on the silent connection for good, deciding every request without Redis)', async () => {
    const proxy = await startRedisProxy(own.port);
    const behind = await connectedClient(proxy.url, 200);
    const behindLedger = new ReceiptLedger(behind);
    const inspect = redisClient(own.url);
    try {
      const batcher = new ConsumeBatcher(behind, behindLedger);
      expect(await batcher.consume('silent-counter', request())).toEqual({ allowed: true, hour: 1, day: 1 });
      proxy.silenceOpenConnections();
      // Swallowed by the proxy: never run, in doubt until a connection that answers takes it back.
      const lost = await batcher.consume('silent-counter', request()).catch((err: unknown) => err);
      expect((lost as StoreUnavailableError).kind).toBe('timeout');
      expect(behindLedger.inDoubt).toBe(1);
      await waitFor(
        'a new connection through the proxy',
        async () => behind.status === 'ready' && behindLedger.inDoubt === 0,
        silentConnectionMs(200) + 5000,
        50,
      );
      expect(await batcher.consume('silent-counter', request())).toEqual({ allowed: true, hour: 2, day: 2 });
      expect(await inspect.hmget('silent-counter', 'hc', 'dc')).toEqual(['2', '2']);
    } finally {
      behindLedger.close();
      behind.disconnect();
      inspect.disconnect();
      await proxy.close();
    }
  });
});
