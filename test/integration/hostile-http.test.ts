import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { expectTwoFields, rawExchange, send } from '../helpers/http.js';
import { attempt, rawConnect, sleep, usageOf, usageOfRow } from '../helpers/faults.js';

/**
 * The public listener against hostile HTTP: slow headers (408 or a closed connection within
 * a bounded time), oversized headers (431), ambiguous framing (400, never forwarded), bodies
 * over MAX_BODY_BYTES (413 before the sender is done), hostile JSON on the token route (a
 * fast 400 while other requests keep being served), absurd API keys (401).
 */

const LIMITS = `
timezone: UTC
limits:
  - name: Authentication
    route: POST /auth/token
    also: [POST /oapi/auth/gen-secret-key/underlying, POST /oapi/auth/gen-secret-key/derivative]
    per_hour: 100000
    per_day: 1000000
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 100000, per_day: 1000000 }
  - { name: Place Order, route: "POST /orders", per_hour: 100000, per_day: 1000000 }
`;

const HEADERS_TIMEOUT_MS = 1000;
const MAX_BODY_BYTES = 65_536;
const MAX_HEADER_BYTES = 8192;
const TOKEN = '/oapi/auth/gen-secret-key/underlying';

let gw: TestGateway;
let n = 0;
const newKey = (): string => `hostile-${Date.now()}-${++n}`;

beforeAll(async () => {
  gw = await startTestGateway({
    limits: LIMITS,
    env: {
      HEADERS_TIMEOUT_MS: String(HEADERS_TIMEOUT_MS),
      REQUEST_TIMEOUT_MS: '5000',
      MAX_BODY_BYTES: String(MAX_BODY_BYTES),
      MAX_HEADER_BYTES: String(MAX_HEADER_BYTES),
      INVALID_KEY_MAX_ATTEMPTS: '100000',
      LOG_LEVEL: 'warn',
    },
  });
});
afterAll(async () => {
  await gw?.stop();
});

function rawBody(raw: string): { error: string; message: string } {
  const body = raw.slice(raw.indexOf('\r\n\r\n') + 4);
  const parsed = JSON.parse(body) as Record<string, unknown>;
  expect(Object.keys(parsed).sort()).toEqual(['error', 'message']);
  return parsed as { error: string; message: string };
}

/** Units a key used, summed over every row of the table. */
async function usedOnAllRows(key: string): Promise<number> {
  return (await usageOf(gw, key)).reduce((sum, e) => sum + e.hour.used + e.day.used, 0);
}

async function stillServes(): Promise<void> {
  const reply = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': newKey() }, agent: false });
  expect(reply.status).toBe(200);
}

describe('a client that sends its headers slowly', () => {
  it('gets the two-field 408 soon after HEADERS_TIMEOUT_MS, its connection closed, and nothing is forwarded (the test took a bare close, or any message, as well)', async () => {
    const before = gw.eqt.requests.length;
    const key = newKey();
    const socket = await rawConnect(gw.port);
    const t0 = performance.now();
    const received: Buffer[] = [];
    let closedAt: number | undefined;
    socket.on('data', (c: Buffer) => received.push(c));
    socket.on('error', () => {});
    socket.on('close', () => (closedAt = performance.now() - t0));
    socket.write(`GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nX-Slow: `);
    // One byte every 100 ms, never the end of the headers; bounded at 8 s.
    const GIVE_UP_MS = 8000;
    while (closedAt === undefined && performance.now() - t0 < GIVE_UP_MS) {
      if (!socket.destroyed) socket.write('a');
      await sleep(100);
    }
    socket.destroy();
    // Node checks header timeouts periodically, not at the exact instant: allow a few times the timeout, never the 30 s default check interval.
    expect(closedAt, 'the gateway never closed the slow connection').toBeDefined();
    expect(closedAt as number).toBeGreaterThanOrEqual(HEADERS_TIMEOUT_MS - 50);
    expect(closedAt as number).toBeLessThan(HEADERS_TIMEOUT_MS * 4);
    // README "Headers and answers": a request too slow to arrive gets the two-field 408, not a bare close.
    const raw = Buffer.concat(received).toString('utf8');
    expect(raw).toMatch(/^HTTP\/1\.1 408 /);
    expect(rawBody(raw)).toEqual({ error: 'Request Timeout', message: 'Request took too long to arrive' });
    expect(gw.eqt.requests.length).toBe(before);
    expect(await usedOnAllRows(key)).toBe(0);
    await stillServes();
  }, 15_000);
});

describe('framing headers in conflict', () => {
  it('are refused with 400, a second Content-Length told as such (regression: it was told as Content-Length with Transfer-Encoding)', async () => {
    const before = gw.eqt.requests.length;
    const head = `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\n`;
    for (const [framing, message] of [
      ['Content-Length: 2\r\nContent-Length: 3\r\n', 'More than one Content-Length header'],
      // Equal values too (RFC 9112 §6.3 lets a recipient refuse them): not "conflicting" then.
      ['Content-Length: 2\r\nContent-Length: 2\r\n', 'More than one Content-Length header'],
      // llhttp gives these the codes of a malformed value: the general message, which is not wrong.
      ['Content-Length: 2\r\nTransfer-Encoding: chunked\r\n', 'Malformed HTTP request'],
      ['Transfer-Encoding: chunked\r\nContent-Length: 2\r\n', 'Malformed HTTP request'],
    ] as const) {
      const raw = await rawExchange(gw.port, `${head}${framing}\r\n{}`);
      expect(raw).toMatch(/^HTTP\/1\.1 400 /);
      expect(rawBody(raw)).toEqual({ error: 'Bad Request', message });
    }
    expect(gw.eqt.requests.length).toBe(before);
  });
});

describe('oversized headers', () => {
  it('answer 431 in the two-field shape, one big header or many small ones, while a request under the limit passes', async () => {
    const key = newKey();
    const before = gw.eqt.requests.length;
    for (const headers of [
      `X-Big: ${'a'.repeat(MAX_HEADER_BYTES + 100)}\r\n`,
      Array.from({ length: 200 }, (_, i) => `X-H${i}: ${'b'.repeat(60)}\r\n`).join(''),
    ]) {
      const raw = await rawExchange(
        gw.port,
        `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${headers}\r\n`,
      );
      expect(raw).toMatch(/^HTTP\/1\.1 431 /);
      expect(rawBody(raw)).toEqual({
        error: 'Request Header Fields Too Large',
        message: 'Request headers are too large',
      });
    }
    expect(gw.eqt.requests.length).toBe(before);
    expect(await usedOnAllRows(key)).toBe(0);
    const under = await send(gw.url, {
      path: '/orders/1',
      headers: { 'X-API-Key': newKey(), 'X-Big': 'c'.repeat(MAX_HEADER_BYTES / 2) },
      agent: false,
    });
    expect(under.status).toBe(200);
  });
});

describe('ambiguous request framing', () => {
  const K = `framing-${Date.now()}`;
  const smuggled = `GET /orders/smuggled HTTP/1.1\r\nHost: x\r\nX-API-Key: ${K}\r\n\r\n`;
  const cases: Array<[string, string]> = [
    [
      'Content-Length with Transfer-Encoding',
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${smuggled}`,
    ],
    [
      'Transfer-Encoding with Content-Length',
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nTransfer-Encoding: chunked\r\nContent-Length: ${4 + smuggled.length}\r\n\r\n0\r\n\r\n${smuggled}`,
    ],
    [
      'two different Content-Lengths',
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nContent-Length: 0\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`,
    ],
    [
      'chunked not the final transfer coding',
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: k\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n${smuggled}`,
    ],
  ];
  for (const [name, bytes] of cases) {
    it(`refuses ${name} with a two-field 400 and never forwards anything of it`, async () => {
      const before = gw.eqt.requests.length;
      const raw = await rawExchange(gw.port, bytes, 3000);
      expect(raw).toMatch(/^HTTP\/1\.1 400 /);
      expect(raw.match(/HTTP\/1\.1 /g)).toHaveLength(1); // one answer, then the connection closes
      expect(rawBody(raw).error).toBe('Bad Request');
      await sleep(50);
      expect(gw.eqt.requests.length).toBe(before);
      expect(gw.eqt.requests.some((r) => r.url.includes('smuggled'))).toBe(false);
      expect(await usedOnAllRows(K)).toBe(0);
      await stillServes();
    });
  }
});

describe('a body over MAX_BODY_BYTES', () => {
  it('streamed without a length, is answered 413 before the sender is done, and never reaches the bridge whole', async () => {
    const before = gw.eqt.requests.length;
    const key = newKey();
    const socket = await rawConnect(gw.port);
    const TOTAL = 32 * 1024 * 1024;
    const CHUNK = 16 * 1024;
    const t0 = performance.now();
    let sent = 0;
    let sentAtAnswer: number | undefined;
    let answeredAtMs: number | undefined;
    const received: Buffer[] = [];
    let closed = false;
    socket.on('data', (c: Buffer) => {
      if (sentAtAnswer === undefined) {
        sentAtAnswer = sent;
        answeredAtMs = performance.now() - t0;
      }
      received.push(c);
    });
    socket.on('error', () => {});
    socket.on('close', () => (closed = true));
    socket.write(
      `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n`,
    );
    const piece = `${CHUNK.toString(16)}\r\n${'z'.repeat(CHUNK)}\r\n`;
    // Send until answered, closed, all sent, or 10 s; wait for drain on backpressure (bounded).
    while (sentAtAnswer === undefined && !closed && sent < TOTAL && performance.now() - t0 < 10_000) {
      const ok = socket.write(piece);
      sent += CHUNK;
      if (!ok) await Promise.race([new Promise((r) => socket.once('drain', r)), sleep(200)]);
    }
    const finishedSending = sent >= TOTAL;
    await Promise.race([new Promise((r) => (closed ? r(undefined) : socket.once('close', r))), sleep(2000)]);
    socket.destroy();

    const raw = Buffer.concat(received).toString('utf8');
    expect(raw).toMatch(/^HTTP\/1\.1 413 /);
    expect(rawBody(raw)).toEqual({
      error: 'Content Too Large',
      message: `Request body is larger than ${MAX_BODY_BYTES} bytes`,
    });
    expect(finishedSending).toBe(false);
    expect(sentAtAnswer).toBeDefined();
    expect(sentAtAnswer as number).toBeLessThan(TOTAL / 4);
    expect(answeredAtMs as number).toBeLessThan(5000);
    expect(gw.eqt.requests.slice(before).some((r) => r.body.length > MAX_BODY_BYTES)).toBe(false);
    // Refused after counting (README "A request, step by step", step 4): counted exactly once.
    expect((await usageOfRow(gw, key, 'POST /orders')).hour.used).toBe(1);
    await stillServes();
  });

  it('announced by Content-Length, is answered 413 at once without waiting for the body', async () => {
    const before = gw.eqt.requests.length;
    const key = newKey();
    const socket = await rawConnect(gw.port);
    const t0 = performance.now();
    const raw = await new Promise<string>((resolve) => {
      const chunks: Buffer[] = [];
      const timer = setTimeout(() => socket.destroy(), 3000);
      socket.on('data', (c: Buffer) => {
        chunks.push(c);
        if (Buffer.concat(chunks).includes('}')) {
          clearTimeout(timer);
          resolve(Buffer.concat(chunks).toString('utf8'));
          socket.destroy();
        }
      });
      socket.on('error', () => {});
      socket.on('close', () => {
        clearTimeout(timer);
        resolve(Buffer.concat(chunks).toString('utf8'));
      });
      socket.write(
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nContent-Length: ${10 * 1024 * 1024 * 1024}\r\n\r\n`,
      );
    });
    expect(performance.now() - t0).toBeLessThan(1000);
    expect(raw).toMatch(/^HTTP\/1\.1 413 /);
    expect(rawBody(raw).error).toBe('Content Too Large');
    expect(gw.eqt.requests.length).toBe(before);
    expect((await usageOfRow(gw, key, 'POST /orders')).hour.used).toBe(1);
    await stillServes();
  });
});

describe('hostile JSON on the token route', () => {
  const deep = (depth: number): string =>
    `{"username":"u","password":"p","x":${'['.repeat(depth)}${']'.repeat(depth)}}`;
  const bodies: Array<[string, string]> = [
    ['nested 5000 deep', deep(5000)],
    ['only opening brackets', '['.repeat(15_000)],
    ['nested objects 3000 deep', '{"a":'.repeat(3000) + '1' + '}'.repeat(3000)],
    ['huge (60 KB) credentials', JSON.stringify({ username: 'u', password: 'p', pad: 'x'.repeat(60_000) })],
    ['huge (60 KB) array of numbers', '[' + Array.from({ length: 15_000 }, () => '123').join(',') + ']'],
  ];

  it('is refused with a fast two-field 400, never forwarded, while other requests keep being served', async () => {
    const key = newKey();
    const before = gw.eqt.requests.length;
    const hostile = bodies.flatMap(([name, body]) =>
      Array.from({ length: 4 }, () =>
        attempt(gw.url, {
          method: 'POST',
          path: TOKEN,
          headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
          body,
          agent: false,
        }).then((out) => ({ name, ...out })),
      ),
    );
    const normalKey = newKey();
    const normal = Array.from({ length: 20 }, (_, i) =>
      attempt(gw.url, { path: `/orders/${i}`, headers: { 'X-API-Key': normalKey }, agent: false }),
    );
    const [hostileOuts, normalOuts] = await Promise.all([Promise.all(hostile), Promise.all(normal)]);
    for (const out of hostileOuts) {
      expect(out.reply?.status, out.name).toBe(400);
      expect(expectTwoFields(out.reply!).error).toBe('Bad Request');
      expect(out.reply?.text).not.toMatch(/"pad"|xxxx|\[\[/); // the body is never echoed
      expect(out.ms, out.name).toBeLessThan(1000);
    }
    for (const out of normalOuts) {
      expect(out.reply?.status).toBe(200);
      expect(out.ms).toBeLessThan(1000);
    }
    expect(gw.eqt.requests.slice(before).filter((r) => r.url === TOKEN)).toHaveLength(0);
    // Refused after counting (README "A request, step by step", step 4): each counted exactly once.
    expect((await usageOfRow(gw, key, 'POST /auth/token')).hour.used).toBe(hostileOuts.length);
  });

  it('streamed without a length and far over the credentials size, is refused with 400 before the sender is done', async () => {
    const socket = await rawConnect(gw.port);
    const t0 = performance.now();
    let sent = 0;
    let sentAtAnswer: number | undefined;
    const received: Buffer[] = [];
    let closed = false;
    socket.on('data', (c: Buffer) => {
      sentAtAnswer ??= sent;
      received.push(c);
    });
    socket.on('error', () => {});
    socket.on('close', () => (closed = true));
    socket.write(
      `POST ${TOKEN} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`,
    );
    const TOTAL = 16 * 1024 * 1024;
    const piece = `4000\r\n${'['.repeat(0x4000)}\r\n`;
    while (sentAtAnswer === undefined && !closed && sent < TOTAL && performance.now() - t0 < 10_000) {
      const ok = socket.write(piece);
      sent += 0x4000;
      if (!ok) await Promise.race([new Promise((r) => socket.once('drain', r)), sleep(200)]);
    }
    await Promise.race([new Promise((r) => (closed ? r(undefined) : socket.once('close', r))), sleep(2000)]);
    socket.destroy();
    const raw = Buffer.concat(received).toString('utf8');
    expect(raw).toMatch(/^HTTP\/1\.1 400 /);
    expect(rawBody(raw).error).toBe('Bad Request');
    expect(sentAtAnswer as number).toBeLessThan(TOTAL / 4);
    await stillServes();
  });
});

describe('absurd API keys', () => {
  it('are refused with a two-field 401 and a challenge, never forwarded nor counted, while a normal-length key passes', async () => {
    const before = gw.eqt.requests.length;
    for (const length of [1000, 4000]) {
      const key = 'k'.repeat(length);
      const reply = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key }, agent: false });
      expect(reply.status).toBe(401);
      expect(expectTwoFields(reply).error).toBe('Unauthorized');
      expect(reply.headers['www-authenticate']).toBe('APIKey header="X-API-Key"');
      expect(reply.headers['x-ratelimit-limit-hour']).toBeUndefined();
      expect(reply.text).not.toContain('kkkk');
      expect((await usageOfRow(gw, key, 'GET /orders/{id}')).hour.used).toBe(0);
    }
    expect(gw.eqt.requests.length).toBe(before);
    const normal = 'n'.repeat(64) + Date.now();
    expect((await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': normal }, agent: false })).status).toBe(
      200,
    );
  });
});

describe("regression: the app's answer to a malformed body closed the connection at once", () => {
  /**
   * A client that reads only once its upload is done, as many do, and whose second chunk Node's
   * parser fails on: it sends on for 600 ms after the failure, then reads, and sends a byte every
   * 100 ms until the gateway takes no more (its writes fail once the gateway resets the connection).
   */
  async function stillSendingAfterFailure(path: string): Promise<{ raw: string; releasedAfterMs: number }> {
    const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true });
    socket.pause();
    socket.on('error', () => {});
    await new Promise((r) => socket.once('connect', r));
    socket.write(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nContent-Type: application/json\r\n` +
        'Transfer-Encoding: chunked\r\n\r\n5\r\n{"use\r\n',
    );
    await sleep(150);
    socket.write('zz\r\n');
    const brokeAt = performance.now();
    for (let i = 0; i < 6 && !socket.destroyed; i++) {
      await sleep(100);
      socket.write('x'.repeat(1000));
    }
    const received: Buffer[] = [];
    socket.on('data', (c: Buffer) => received.push(c));
    socket.resume();
    while (!socket.destroyed && performance.now() - brokeAt < 6000) {
      await sleep(100);
      if (!socket.destroyed) socket.write('x');
    }
    const releasedAfterMs = performance.now() - brokeAt;
    socket.destroy();
    return { raw: Buffer.concat(received).toString('latin1'), releasedAfterMs };
  }

  // The answer went out and the socket was destroyed right after it: what the client still sent met a
  // reset, and its next write failed before it had read the answer (RFC 9112 §9.6). The HTTP layer's
  // own answers close lingering (lib/linger.ts): read and drop for LINGER_MS, then destroy.
  it.each([
    ['a body streamed to the bridge', '/orders'],
    ['a credentials body', TOKEN],
  ])(
    '%s: the client still sending reads its 400, and the connection is let go of LINGER_MS later',
    async (_what, path) => {
      const { raw, releasedAfterMs } = await stillSendingAfterFailure(path);
      expect(raw).toMatch(/^HTTP\/1\.1 400 /);
      expect(rawBody(raw)).toEqual({ error: 'Bad Request', message: 'Malformed HTTP request' });
      expect(raw.match(/HTTP\/1\.1 /g)).toHaveLength(1);
      // Released LINGER_MS (2 s) after the answer, also while the client still sends.
      expect(releasedAfterMs).toBeGreaterThan(1500);
      expect(releasedAfterMs).toBeLessThan(4000);
    },
  );
});
