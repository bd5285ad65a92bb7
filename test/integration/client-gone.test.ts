import net from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { redisClient, startRedisServer, type RedisProcess } from '../helpers/redis.js';

/**
 * A client that leaves while its request is being checked (here: while Redis holds the
 * counting script) gets nothing sent to the bridge, and its request still gets its log line
 * and metric (regression: the forwarder waited for a close that had already happened, and the
 * bridge connection idled until the timeout). "Leaves" is a connection reset: a client that only
 * closes its sending side may still be reading, and gets its answer (hostile-smuggling.test.ts).
 */

let redis: RedisProcess;
let gw: TestGateway;
beforeAll(async () => {
  redis = await startRedisServer();
  gw = await startTestGateway({ redis: redis.url, env: { REDIS_TIMEOUT_MS: '2000' } });
});
afterAll(async () => {
  await gw.stop();
  await redis.stop();
});

it('sends nothing to the bridge for a client that left during the checks, and logs it as 499', async () => {
  const key = `gone-${Date.now()}`;
  await fetch(`${gw.url}/orders/1`, { headers: { 'X-API-Key': key } }); // loads the script
  const before = gw.eqt.requests.length;
  const pauser = redisClient(redis.url);
  await pauser.call('CLIENT', 'PAUSE', '400', 'WRITE');
  const socket = net.connect(gw.port, '127.0.0.1');
  await new Promise((r) => socket.once('connect', r));
  socket.write(`GET /orders/2 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nX-Request-Id: gone-1\r\n\r\n`);
  await new Promise((r) => setTimeout(r, 100));
  socket.resetAndDestroy();
  await new Promise((r) => setTimeout(r, 600));
  pauser.disconnect();
  expect(gw.eqt.requests.length).toBe(before);
  const line = gw.logs.find((l) => l.msg === 'request' && l.reqId === 'gone-1');
  expect(line).toMatchObject({ status: 499, endpoint: 'GET /orders/{id}' });
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text();
  expect(metrics).toMatch(/^oapi_gateway_requests_total\{endpoint="GET \/orders\/\{id\}",status="499"\} 1$/m);
});

it('sends nothing to the bridge for a client that left while its small body was still coming, and logs it as 499', async () => {
  const key = `gone-body-${Date.now()}`;
  const before = gw.eqt.requests.length;
  const socket = net.connect(gw.port, '127.0.0.1');
  await new Promise((r) => socket.once('connect', r));
  // A body read whole before it is sent (GATHERED_BODY_BYTES): 10 of its 100 bytes come.
  socket.write(
    `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nX-Request-Id: gone-2\r\nContent-Length: 100\r\n\r\n${'x'.repeat(10)}`,
  );
  await new Promise((r) => setTimeout(r, 300));
  socket.resetAndDestroy();
  await new Promise((r) => setTimeout(r, 300));
  expect(gw.eqt.requests.length).toBe(before);
  const line = gw.logs.find((l) => l.msg === 'request' && l.reqId === 'gone-2');
  expect(line).toMatchObject({ status: 499, endpoint: 'POST /orders' });
});
