import http from 'node:http';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startSandboxBridge, type SandboxBridge } from '../../src/sandbox/bridge.js';
import { DEMO_PASSWORD, DEMO_USERNAME } from '../../src/sandbox/bodies.js';
import { GATHERED_BODY_BYTES } from '../../src/proxy/forwarder.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { USAGE_HEADER_KEYS, expectTwoFields, type Reply } from '../helpers/http.js';
import { refusingPort } from '../helpers/redis.js';
import { attempt, usageOfRow, waitFor } from '../helpers/faults.js';
import {
  OK_BODY,
  startFaultyBridge,
  startUnreachableInTimeBridge,
  type FaultyBridge,
  type UnreachableInTimeBridge,
} from '../helpers/faulty-bridge.js';

/**
 * Bridges that fail (README "Forwarding"; docs/operations.md "Bridges"): refused, reset mid-answer, silent, stalled
 * after the headers, dropped, garbage. Each gets the client a clean 502/504 or a closed
 * connection (never a wrong 200), every bridge socket of a failed exchange is closed, the
 * request was counted exactly once, and the next request works.
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
  - { name: Order Update, route: "POST /orders/{id}", per_hour: 100000, per_day: 1000000 }
`;

const UPSTREAM_TIMEOUT_MS = 300;

let bridge: FaultyBridge;
let fnoPort: number;
let fno: SandboxBridge | undefined;
let gw: TestGateway;
let n = 0;
const newKey = (): string => `bridge-${Date.now()}-${++n}`;

beforeAll(async () => {
  bridge = await startFaultyBridge();
  fnoPort = await refusingPort(); // nothing listens there (yet): connections are refused
  gw = await startTestGateway({
    limits: LIMITS,
    env: {
      EQT_BRIDGE_URL: bridge.url,
      FNO_BRIDGE_URL: `http://127.0.0.1:${fnoPort}`,
      UPSTREAM_TIMEOUT_MS: String(UPSTREAM_TIMEOUT_MS),
      LOG_LEVEL: 'warn',
    },
  });
});
afterAll(async () => {
  await gw?.stop();
  await fno?.close();
  await bridge?.close();
});

const order = (mode: string, key: string, to: TestGateway = gw) =>
  attempt(to.url, { path: `/orders/${mode}`, headers: { 'X-API-Key': key }, agent: false, timeoutMs: 5000 });

function expectGatewayAnswer(reply: Reply | undefined, status: number, error: string): void {
  expect(reply?.status).toBe(status);
  expect(reply?.headers['content-type']).toMatch(/^application\/json/);
  expect(expectTwoFields(reply as Reply).error).toBe(error);
  // No internal address, port, error code or stack trace.
  expect(reply?.text).not.toMatch(/127\.0\.0\.1|localhost|:\d{4,5}|E[A-Z]{4,}|at .+\.js/);
  // A counted request: its answer carries the usage headers (README "Headers and answers").
  for (const h of USAGE_HEADER_KEYS) expect(reply?.headers[h], h).toBeDefined();
}

/** The next request through the same bridge works, and every request of `key` was counted exactly once. */
async function expectServingAndCounted(key: string, sent: number, to: TestGateway = gw): Promise<void> {
  const next = await order('ok', key, to);
  expect(next.error).toBeUndefined();
  expect(next.reply?.status).toBe(200);
  expect(next.reply?.text).toBe(OK_BODY);
  expect((await usageOfRow(to, key, 'GET /orders/{id}')).hour.used).toBe(sent + 1);
}

async function expectBridgeSocketsClosed(mode: string): Promise<void> {
  expect(bridge.connectionsFor(mode).length).toBeGreaterThan(0);
  await waitFor(
    `every bridge socket that carried /orders/${mode} to be closed`,
    () => bridge.connectionsFor(mode).every((c) => c.closed),
    2000,
  );
}

describe('a bridge that refuses connections', () => {
  it('gets the client a fast, clean 502, counted; the same request works once the bridge listens', async () => {
    const key = newKey();
    const login = () =>
      attempt(gw.url, {
        method: 'POST',
        path: '/oapi/auth/gen-secret-key/derivative',
        headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
        body: JSON.stringify({ username: DEMO_USERNAME, password: DEMO_PASSWORD }),
        agent: false,
      });
    const refused = await login();
    expect(refused.error).toBeUndefined();
    expectGatewayAnswer(refused.reply, 502, 'Bad Gateway');
    expect(refused.ms).toBeLessThan(1000);

    fno = await startSandboxBridge('fno', { port: fnoPort });
    const next = await login();
    expect(next.reply?.status).toBe(200);
    expect(Object.keys(next.reply?.json<object>() ?? {}).sort()).toEqual([
      'access_token',
      'expires_in',
      'otp_token',
      'refresh_token',
      'token_type',
    ]);
    expect((await usageOfRow(gw, key, 'POST /auth/token')).hour.used).toBe(2);
  });
});

describe('a bridge that breaks off its answer', () => {
  it('with a reset after the status line and part of a Content-Length body: the client connection is closed, never a 200 body', async () => {
    const key = newKey();
    const out = await order('reset-length', key);
    expect(out.reply).toBeUndefined();
    expect(out.error).toBeDefined();
    expect(out.ms).toBeLessThan(2000);
    await expectBridgeSocketsClosed('reset-length');
    await expectServingAndCounted(key, 1);
  });

  it('with a close after one chunk of a chunked body: the client connection is closed, not a complete short 200', async () => {
    const key = newKey();
    const out = await order('close-chunked', key);
    expect(out.reply).toBeUndefined();
    expect(out.error).toBeDefined();
    expect(out.ms).toBeLessThan(2000);
    await expectBridgeSocketsClosed('close-chunked');
    await expectServingAndCounted(key, 1);
  });

  it('with a close before any byte: a clean 502', async () => {
    const key = newKey();
    const out = await order('drop', key);
    expect(out.error).toBeUndefined();
    expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
    await expectBridgeSocketsClosed('drop');
    await expectServingAndCounted(key, 1);
  });

  it('with bytes that are not HTTP: a clean 502, and the socket is not kept', async () => {
    const key = newKey();
    const out = await order('garbage', key);
    expect(out.error).toBeUndefined();
    expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
    await expectBridgeSocketsClosed('garbage');
    await expectServingAndCounted(key, 1);
  });
});

describe("regression: a bridge's informational answer (1xx) before its final one cut the client's connection", () => {
  it('is not passed on: the client gets the final 200 whole, and the next request on the bridge connection works', async () => {
    // undici hands a 102 or 103 to the handler as a status line of its own: the gateway wrote it as
    // the answer's head and then failed on the 200's (headers already sent), closing the client's
    // connection with nothing.
    const key = newKey();
    const out = await order('informational', key);
    expect(out.error).toBeUndefined();
    expect(out.reply?.status).toBe(200);
    expect(out.reply?.text).toBe(OK_BODY);
    for (const h of USAGE_HEADER_KEYS) expect(out.reply?.headers[h], h).toBeDefined();
    await expectServingAndCounted(key, 1);
  });
});

describe("regression: a bridge's reason phrase with a control character cut the client's connection", () => {
  it("is replaced by Node's own phrase for the status; the answer is otherwise the bridge's, whole", async () => {
    // undici passes the phrase on, and Node's writeHead throws on it (ERR_INVALID_CHAR).
    const key = newKey();
    const out = await order('control-reason', key);
    expect(out.error).toBeUndefined();
    expect(out.reply?.status).toBe(200);
    expect(out.reply?.text).toBe(OK_BODY);
    await expectServingAndCounted(key, 1);
  });
});

describe("regression: a bridge's 304 with a Content-Length cut the client's connection", () => {
  it('passes the 304 on, headers and all; the next request works', async () => {
    // A 304 may state the length of the representation it validates (RFC 9110 §8.6) and has no
    // body whatever it says; undici failed the answer for the body it never got, after its head was
    // passed on: the client's connection was closed with nothing, and the access line said 304.
    const key = newKey();
    const out = await order('not-modified', key);
    expect(out.error).toBeUndefined();
    expect(out.reply?.status).toBe(304);
    expect(out.reply?.headers.etag).toBe('"v1"');
    expect(out.reply?.headers['content-length']).toBe('1000');
    expect(out.reply?.text).toBe('');
    for (const h of USAGE_HEADER_KEYS) expect(out.reply?.headers[h], h).toBeDefined();
    await expectServingAndCounted(key, 1);
  });
});

describe('the one resend: a GET is sent again only after meeting a kept-alive connection the bridge had closed', () => {
  // A gateway of its own for each test: its pool has no connection to the bridge until the test opens one.
  let own: TestGateway;
  beforeEach(async () => {
    own = await startTestGateway({
      limits: LIMITS,
      redis: false,
      env: { EQT_BRIDGE_URL: bridge.url, UPSTREAM_TIMEOUT_MS: String(UPSTREAM_TIMEOUT_MS), LOG_LEVEL: 'warn' },
    });
  });
  afterEach(async () => {
    await own?.stop();
  });

  /** A path of `mode` no other request carries, so that the bridge's records of it are this test's. */
  const once = (mode: string): string => `${mode}?try=${newKey()}`;
  /** The bridge connections that carried `/orders/<asked>`, with every path each carried. */
  const carriers = (asked: string): string[][] =>
    bridge.connections.filter((c) => c.paths.includes(`/orders/${asked}`)).map((c) => [...c.paths]);

  it('a GET the bridge reads and drops on a new connection: a 502, and the bridge received it once', async () => {
    const asked = once('drop');
    const out = await order(asked, newKey(), own);
    expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
    expect(carriers(asked)).toEqual([[`/orders/${asked}`]]);
  });

  it('a GET answered with bytes that are not HTTP on a new connection: a 502, and the bridge received it once', async () => {
    const asked = once('garbage');
    const out = await order(asked, newKey(), own);
    expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
    expect(carriers(asked)).toEqual([[`/orders/${asked}`]]);
  });

  it('a GET answered with bytes that are not HTTP on a kept-alive connection: a 502, and the bridge received it once (an answer that is not HTTP is no closed connection)', async () => {
    const key = newKey();
    expect((await order('ok', key, own)).reply?.status).toBe(200);
    const asked = once('garbage');
    const out = await order(asked, key, own);
    expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
    expect(carriers(asked)).toEqual([['/orders/ok', `/orders/${asked}`]]);
  });

  it('a GET that meets a kept-alive connection the bridge had closed: sent once more on a new connection, answered, and counted once', async () => {
    const key = newKey();
    expect((await order('ok', key, own)).reply?.status).toBe(200);
    const asked = once('stale');
    const out = await order(asked, key, own);
    expect(out.error).toBeUndefined();
    expect(out.reply?.status).toBe(200);
    expect(out.reply?.text).toBe(OK_BODY);
    // First on the connection that had carried the earlier GET, then on a new one.
    expect(carriers(asked)).toEqual([['/orders/ok', `/orders/${asked}`], [`/orders/${asked}`]]);
    expect((await usageOfRow(own, key, 'GET /orders/{id}')).hour.used).toBe(2);
  });
});

describe('a bridge that does not answer in time', () => {
  it('that never answers: a clean 504 after UPSTREAM_TIMEOUT_MS, and the gateway closes its socket to the bridge', async () => {
    const key = newKey();
    const out = await order('silent', key);
    expect(out.error).toBeUndefined();
    expectGatewayAnswer(out.reply, 504, 'Gateway Timeout');
    expect(out.ms).toBeGreaterThanOrEqual(UPSTREAM_TIMEOUT_MS - 20);
    expect(out.ms).toBeLessThan(UPSTREAM_TIMEOUT_MS + 1000);
    await expectBridgeSocketsClosed('silent');
    await expectServingAndCounted(key, 1);
  });

  it('that sends its headers and then stalls: the client connection is closed after the timeout, and so is the bridge socket', async () => {
    const key = newKey();
    const out = await order('stall', key);
    expect(out.reply).toBeUndefined();
    expect(out.error).toBeDefined();
    expect(out.ms).toBeGreaterThanOrEqual(UPSTREAM_TIMEOUT_MS - 20);
    expect(out.ms).toBeLessThan(UPSTREAM_TIMEOUT_MS + 1500);
    await expectBridgeSocketsClosed('stall');
    await expectServingAndCounted(key, 1);
  });
});

describe('many failing exchanges at once', () => {
  // Its own gateway with a longer UPSTREAM_TIMEOUT_MS: on a busy machine 35 exchanges at once can
  // take longer than 300 ms to reach a bridge that drops them, which would then be a (right) 504.
  const BUSY_TIMEOUT_MS = 2000;
  let busy: TestGateway;
  beforeAll(async () => {
    busy = await startTestGateway({
      limits: LIMITS,
      env: {
        EQT_BRIDGE_URL: bridge.url,
        FNO_BRIDGE_URL: `http://127.0.0.1:${fnoPort}`,
        UPSTREAM_TIMEOUT_MS: String(BUSY_TIMEOUT_MS),
        LOG_LEVEL: 'warn',
      },
    });
  });
  afterAll(async () => {
    await busy?.stop();
  });

  it('answers each one right, counts each once, and leaves no bridge socket of a failed exchange open', async () => {
    const key = newKey();
    const modes = ['ok', 'silent', 'stall', 'reset-length', 'close-chunked', 'drop', 'garbage'];
    const plan = Array.from({ length: 35 }, (_, i) => modes[i % modes.length] as string);
    const outs = await Promise.all(plan.map((mode) => order(mode, key, busy).then((out) => ({ mode, ...out }))));
    for (const out of outs) {
      switch (out.mode) {
        case 'ok':
          expect(out.reply?.status).toBe(200);
          expect(out.reply?.text).toBe(OK_BODY);
          break;
        case 'silent':
          expectGatewayAnswer(out.reply, 504, 'Gateway Timeout');
          break;
        case 'drop':
        case 'garbage':
          expectGatewayAnswer(out.reply, 502, 'Bad Gateway');
          break;
        default: // the status line was already passed on: all that is right is a closed connection
          expect(out.reply, out.mode).toBeUndefined();
          expect(out.error, out.mode).toBeDefined();
      }
      expect(out.ms).toBeLessThan(BUSY_TIMEOUT_MS + 2000);
    }
    // (A connection the pool opened for a request that was over before it got one carried nothing:
    // it is an idle pooled connection, closed by the pool's idle timeout, not one of a failed exchange.)
    await waitFor(
      'every bridge socket of a failed exchange to be closed',
      () => bridge.connections.every((c) => c.closed || c.paths.length === 0 || c.paths.at(-1) === '/orders/ok'),
      2000,
    );
    await expectServingAndCounted(key, plan.length, busy);
  });
});

/** A POST whose body the client sends in `chunks` pieces, `gapMs` apart (`stallAfter`: stops sending after that many). */
function slowUpload(
  path: string,
  key: string,
  chunks: number,
  gapMs: number,
  stallAfter = chunks,
  to: TestGateway = gw,
  pieceBytes = 500,
): Promise<{ status: number; text: string; ms: number }> {
  const piece = 'x'.repeat(pieceBytes);
  const t0 = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request(
      `${to.url}${path}`,
      {
        method: 'POST',
        agent: false,
        headers: {
          'X-API-Key': key,
          'Content-Type': 'application/octet-stream',
          'Content-Length': String(piece.length * chunks),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text, ms: performance.now() - t0 }));
      },
    );
    req.on('error', reject);
    let sent = 0;
    const next = (): void => {
      if (sent >= stallAfter) return;
      req.write(piece);
      sent++;
      if (sent < chunks) setTimeout(next, gapMs);
      else req.end();
    };
    next();
  });
}

// Both ways a body reaches the bridge: read whole first (up to GATHERED_BODY_BYTES), or streamed.
describe.each([
  ['read whole', 500],
  ['streamed', Math.ceil((GATHERED_BODY_BYTES + 1) / 3)],
])('a client that uploads slowly, its body %s', (_, pieceBytes) => {
  it('is not answered 504 while its body still arrives: the bridge gets UPSTREAM_TIMEOUT_MS from the end of the upload (regression: the upload time counted against the bridge)', async () => {
    const out = await slowUpload('/orders/ok', newKey(), 6, 150, 6, gw, pieceBytes);
    expect(out.ms).toBeGreaterThan(UPSTREAM_TIMEOUT_MS * 2);
    expect(out.status).toBe(200);
    expect(out.text).toBe(OK_BODY);
  });

  it('still gets a 504 from a bridge that takes the whole body and never answers', async () => {
    const out = await slowUpload('/orders/silent', newKey(), 3, 100, 3, gw, pieceBytes);
    expect(out.status).toBe(504);
    // Counted from the end of the upload (~200 ms), not from its start.
    expect(out.ms).toBeGreaterThanOrEqual(200 + UPSTREAM_TIMEOUT_MS - 20);
    expect(out.ms).toBeLessThan(200 + UPSTREAM_TIMEOUT_MS + 1000);
  });
});

describe('a bridge that cannot be reached in time, after a slow upload of a small body', () => {
  let unreachable: UnreachableInTimeBridge;
  let late: TestGateway;
  beforeAll(async () => {
    unreachable = await startUnreachableInTimeBridge();
    late = await startTestGateway({
      limits: LIMITS,
      env: {
        EQT_BRIDGE_URL: unreachable.url,
        FNO_BRIDGE_URL: unreachable.url,
        UPSTREAM_TIMEOUT_MS: String(UPSTREAM_TIMEOUT_MS),
        LOG_LEVEL: 'warn',
      },
    });
  });
  afterAll(async () => {
    await late?.stop();
    await unreachable?.close();
  });

  it('gets its 504 UPSTREAM_TIMEOUT_MS after the upload ended, not sooner (regression: a body read whole reached for the bridge on time the upload had used)', async () => {
    // Two pieces 450 ms apart: the body is read whole, and only then does the gateway connect to the
    // bridge, whose full accept queue keeps the connection from ever completing.
    const uploadMs = 450;
    const out = await slowUpload('/orders/ok', newKey(), 2, uploadMs, 2, late, 500);
    expect(out.status).toBe(504);
    expect(JSON.parse(out.text)).toEqual({ error: 'Gateway Timeout', message: 'Bridge did not answer in time' });
    // The bridge's time starts when the body is all here. Counted from the request's start, it would
    // have ended at 2 × UPSTREAM_TIMEOUT_MS (600 ms), the upload's own refresh of the timer included.
    expect(out.ms).toBeGreaterThanOrEqual(uploadMs + UPSTREAM_TIMEOUT_MS - 20);
    expect(out.ms).toBeLessThan(uploadMs + UPSTREAM_TIMEOUT_MS + 1000);
  });
});

/** More than the loopback socket buffers of both hops hold. */
const BIG_BODY_BYTES = 48 * 1024 * 1024;

describe('a client that stops sending its body, and a bridge that stops reading one', () => {
  let strict: TestGateway;
  beforeAll(async () => {
    strict = await startTestGateway({
      limits: LIMITS,
      env: {
        EQT_BRIDGE_URL: bridge.url,
        FNO_BRIDGE_URL: bridge.url,
        UPSTREAM_TIMEOUT_MS: String(UPSTREAM_TIMEOUT_MS),
        REQUEST_TIMEOUT_MS: '1000',
        MAX_BODY_BYTES: String(BIG_BODY_BYTES),
        LOG_LEVEL: 'warn',
      },
    });
  });
  afterAll(async () => {
    await strict?.stop();
  });

  it('gets the 408 of REQUEST_TIMEOUT_MS, not a 504 blaming the bridge', async () => {
    const out = await slowUpload('/orders/ok', newKey(), 6, 50, 2, strict);
    expect(out.status).toBe(408);
    expect(JSON.parse(out.text)).toEqual({ error: 'Request Timeout', message: 'Request took too long to arrive' });
    expect(out.ms).toBeGreaterThanOrEqual(1000 - 20);
    expect(out.ms).toBeLessThan(2500);
  });

  /** A client that sends the head and 10 bytes of its body, then nothing, and never closes its side. */
  const stalledUpload = (path: string, contentLength: number) => {
    // allowHalfOpen: this client does not close its side when the gateway closes its own.
    const socket = net.connect({ port: Number(new URL(strict.url).port), host: '127.0.0.1', allowHalfOpen: true });
    socket.on('error', () => {});
    socket.setEncoding('latin1');
    const seen = { received: '', ended: false, closed: false };
    socket.on('data', (chunk: string) => (seen.received += chunk));
    socket.on('end', () => (seen.ended = true));
    socket.on('close', () => (seen.closed = true));
    socket.write(
      `POST ${path} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nContent-Length: ${contentLength}\r\n\r\n${'x'.repeat(10)}`,
    );
    return { socket, seen };
  };

  it('closes the connection of a client that stalls and never closes its side, and the bridge connection with it (regression: both stayed open for good)', async () => {
    const before = bridge.connections.length;
    const reused = bridge.connections.filter((c) => !c.closed);
    // Longer than GATHERED_BODY_BYTES: the body streams to the bridge as it comes.
    const { socket, seen } = stalledUpload('/orders/half', GATHERED_BODY_BYTES + 1000);
    try {
      await waitFor('the 408', () => seen.received.startsWith('HTTP/1.1 408 '), 3000);
      const carrier = () =>
        [...reused, ...bridge.connections.slice(before)].filter((c) => c.paths.at(-1) === '/orders/half');
      await waitFor(
        'the bridge connection of the stalled request to close',
        () => carrier().length === 1 && carrier().every((c) => c.closed),
        4000,
      );
      // The client's connection: the gateway closes its side, and lets go of the socket LINGER_MS
      // later, after which what the client still sends meets a reset.
      await waitFor('the gateway to close its side', () => seen.ended, 4000);
      await waitFor(
        'the gateway to let go of the client connection',
        () => {
          if (!socket.destroyed) socket.write('x');
          return seen.closed;
        },
        5000,
        100,
      );
    } finally {
      socket.destroy();
    }
  });

  it('never sends the bridge a small body that stalls, and closes the client connection', async () => {
    // Up to GATHERED_BODY_BYTES a body is read whole before anything goes to the bridge.
    const { socket, seen } = stalledUpload('/orders/half-small', 1000);
    try {
      await waitFor('the 408', () => seen.received.startsWith('HTTP/1.1 408 '), 3000);
      await waitFor('the gateway to close its side', () => seen.ended, 4000);
      expect(bridge.connections.filter((c) => c.paths.includes('/orders/half-small'))).toEqual([]);
    } finally {
      socket.destroy();
    }
  });

  it('gets a bridge that stops reading the body its 504 after UPSTREAM_TIMEOUT_MS without progress', async () => {
    const t0 = performance.now();
    const reply = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const req = http.request(
        `${strict.url}/orders/noread`,
        { method: 'POST', agent: false, headers: { 'X-API-Key': newKey(), 'Content-Length': String(BIG_BODY_BYTES) } },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
        },
      );
      req.on('error', reject);
      req.end(Buffer.alloc(BIG_BODY_BYTES, 120));
    });
    const ms = performance.now() - t0;
    expect(reply.status).toBe(504);
    expect(JSON.parse(reply.text)).toEqual({ error: 'Gateway Timeout', message: 'Bridge did not answer in time' });
    expect(ms).toBeLessThan(1000); // before REQUEST_TIMEOUT_MS: the bridge is the one to blame
  });
});
