import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';

/**
 * A connection the gateway answered with `Connection: close` and then closes lingering
 * (lib/linger.ts) is still read by Node's HTTP parser when that parser has not failed (a request
 * timeout): a request the client sends during the linger is emitted, served, counted and forwarded,
 * and its answer can never reach the client (RFC 9112 §9.6: a server that sends "close" MUST NOT
 * process any further requests received on that connection).
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100, per_day: 100 }
  - { name: Order Create, route: "POST /orders", per_hour: 100, per_day: 100 }
`;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends `first`, waits for an answer's head, then sends `then` within the linger; the client never closes first. */
async function afterAnswer(port: number, first: string, then: string): Promise<string> {
  const socket = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  socket.on('error', () => {});
  let data = '';
  socket.on('data', (c: Buffer) => (data += c.toString('latin1')));
  await new Promise((r) => socket.once('connect', r));
  socket.write(first);
  for (let i = 0; i < 60 && !data.includes('\r\n\r\n'); i++) await sleep(50);
  if (socket.writable) socket.write(then);
  await sleep(2500);
  socket.destroy();
  return data;
}

describe('regression: a request read during the linger after a 408 was served, counted and forwarded', () => {
  let gw: TestGateway;
  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, env: { REQUEST_TIMEOUT_MS: '300', HEADERS_TIMEOUT_MS: '300' } });
  });
  afterAll(async () => {
    await gw?.stop();
  });

  const served = (id: string) => ({
    lines: gw.logs.filter((l) => l.msg === 'request' && l.reqId === id).map((l) => l.status),
    atBridge: gw.eqt.requests.filter((r) => JSON.stringify(r).includes(id)).length,
  });

  it("after the app's 408 to a body that stopped coming, an order sent behind the rest of the body is not placed", async () => {
    const id = `after-app-408-${Date.now()}`;
    const data = await afterAnswer(
      gw.port,
      'POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: linger-key\r\nContent-Type: application/json\r\n' +
        'Content-Length: 10\r\n\r\n{"use',
      'r":1}' +
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: linger-key\r\nX-Request-Id: ${id}\r\n` +
        'Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}',
    );
    expect(data.startsWith('HTTP/1.1 408 '), data).toBe(true);
    expect(data.match(/HTTP\/1\.1 /g)).toHaveLength(1);
    expect(served(id)).toEqual({ lines: [], atBridge: 0 });
  });

  // The 408 goes through the same lingering close as the malformed body's 400 (the regression
  // test in hostile-http.test.ts): without it the socket was destroyed once the 408 was written,
  // and a client that reads only once its upload is done met a reset that cost it the answer.
  it("the app's 408: a client still sending, that reads only afterwards, gets its 408, and is let go of LINGER_MS later", async () => {
    const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true });
    socket.pause();
    socket.on('error', () => {});
    await new Promise((r) => socket.once('connect', r));
    socket.write(
      'POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: linger-key\r\nContent-Type: application/json\r\n' +
        'Content-Length: 100000\r\n\r\n{"use',
    );
    // REQUEST_TIMEOUT_MS is 300 and the server checks its connections at least that often.
    await sleep(900);
    const sendingFrom = performance.now();
    for (let i = 0; i < 6 && !socket.destroyed; i++) {
      socket.write('x'.repeat(1000));
      await sleep(100);
    }
    const received: Buffer[] = [];
    socket.on('data', (c: Buffer) => received.push(c));
    socket.resume();
    while (!socket.destroyed && performance.now() - sendingFrom < 6000) {
      await sleep(100);
      if (!socket.destroyed) socket.write('x');
    }
    const releasedAfterMs = performance.now() - sendingFrom;
    socket.destroy();
    const raw = Buffer.concat(received).toString('latin1');
    expect(raw.startsWith('HTTP/1.1 408 '), raw).toBe(true);
    expect(raw).toMatch(/\r\nConnection: close\r\n/i);
    // The 408 was written 300–600 ms before sendingFrom; LINGER_MS (2 s) after it the gateway lets go.
    expect(releasedAfterMs).toBeGreaterThan(1000);
    expect(releasedAfterMs).toBeLessThan(4000);
  });

  it("after the HTTP layer's 408 to headers that never ended, their end does not make a request (before the change too)", async () => {
    const id = `after-layer-408-${Date.now()}`;
    const data = await afterAnswer(
      gw.port,
      `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: linger-key\r\nX-Request-Id: ${id}\r\n`,
      '\r\n',
    );
    expect(data.startsWith('HTTP/1.1 408 '), data).toBe(true);
    expect(served(id)).toEqual({ lines: [], atBridge: 0 });
  });
});
