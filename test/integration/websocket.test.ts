import { createHash, randomBytes } from 'node:crypto';
import http, { type IncomingHttpHeaders } from 'node:http';
import net, { type AddressInfo, type Socket } from 'node:net';
import WebSocket, { WebSocketServer, type RawData } from 'ws';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';
import { metricValue, sleep, waitFor } from '../helpers/faults.js';
import { refusingPort } from '../helpers/redis.js';

/**
 * WebSocket rows (README "WebSocket channels") over real sockets with a real `ws` client: an upgrade is
 * counted as one connection against its row, proxied to the bridge both ways, refused with
 * the answers of README "Headers and answers" without touching the bridge, released when either side goes, and closed
 * with 1001 at shutdown once the HTTP requests in flight have completed.
 */

const ORDERS = 'WS /ws/orders';

const table = (wsPerHour: number, wsPerDay: number): string => `
timezone: UTC
limits:
  - name: Order List
    route: GET /orders
    per_hour: 100
    per_day: 100
  - name: WebSocket, Orders
    route: ${ORDERS}
    per_hour: ${wsPerHour}
    per_day: ${wsPerDay}
`;
const LIMITS = table(500, 1000);
/** The small table of the limit test. */
const SMALL_LIMITS = table(3, 10);

const FAST_ENV = { UPSTREAM_TIMEOUT_MS: '2000', SHUTDOWN_TIMEOUT_MS: '3000' };

let keyN = 0;
const newKey = (label = 'ws'): string => `${label}-${Date.now()}-${++keyN}-${randomBytes(4).toString('hex')}`;

// ---------------------------------------------------------------------------------------------
// A bridge whose server side the tests can see and drive.

interface BridgeSide {
  readonly ws: WebSocket;
  /** The request target of the upgrade as the bridge received it. */
  readonly url: string;
  readonly headers: IncomingHttpHeaders;
  /** The upgrade request's header lines as the bridge received them (flat: name, value, …). */
  readonly rawHeaders: readonly string[];
  readonly messages: Array<{ data: Buffer; binary: boolean }>;
  /** Resolves with the close code and reason the bridge's socket saw. */
  readonly closed: Promise<{ code: number; reason: string }>;
  isClosed: boolean;
  /** The bridge's TCP socket of this connection has closed. */
  socketClosed: boolean;
}

interface TestBridge {
  readonly url: string;
  /** TCP connections accepted so far. */
  tcpAccepted(): number;
  /** TCP connections open now. */
  tcpOpen(): number;
  /** WebSocket connections accepted, in order. */
  readonly sides: BridgeSide[];
  /** Plain HTTP requests received (their targets). */
  readonly httpRequests: string[];
  close(): Promise<void>;
}

async function startBridge(options: { httpDelayMs?: number } = {}): Promise<TestBridge> {
  const open = new Set<Socket>();
  let accepted = 0;
  const httpRequests: string[] = [];
  const server = http.createServer((req, res) => {
    httpRequests.push(req.url ?? '');
    req.resume();
    req.on('end', () => {
      const reply = (): void => {
        const body = JSON.stringify({ slow: true, url: req.url });
        res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
        res.end(body);
      };
      if (options.httpDelayMs) setTimeout(reply, options.httpDelayMs);
      else reply();
    });
  });
  server.on('connection', (socket: Socket) => {
    accepted++;
    open.add(socket);
    socket.once('close', () => open.delete(socket));
  });
  const wss = new WebSocketServer({ server });
  const sides: BridgeSide[] = [];
  wss.on('connection', (ws, req) => {
    // eslint-disable-next-line prefer-const -- assigned inside the promise executor below, read by its callbacks
    let side!: BridgeSide;
    const closed = new Promise<{ code: number; reason: string }>((resolve) => {
      ws.once('close', (code, reason) => {
        side.isClosed = true;
        resolve({ code, reason: reason.toString('utf8') });
      });
    });
    side = {
      ws,
      url: req.url ?? '',
      headers: req.headers,
      rawHeaders: req.rawHeaders,
      messages: [],
      closed,
      isClosed: false,
      socketClosed: false,
    };
    req.socket.once('close', () => (side.socketClosed = true));
    sides.push(side);
    ws.on('error', () => {});
    ws.on('message', (data: RawData, isBinary: boolean) => {
      const buffer = toBuffer(data);
      side.messages.push({ data: buffer, binary: isBinary });
      ws.send(buffer, { binary: isBinary });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    tcpAccepted: () => accepted,
    tcpOpen: () => open.size,
    sides,
    httpRequests,
    close: async () => {
      for (const client of wss.clients) client.terminate();
      wss.close();
      server.closeAllConnections();
      for (const socket of open) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function toBuffer(data: RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

/**
 * A bridge that speaks WebSocket by hand over a raw TCP socket, so that a test can write half
 * a frame, wait, and write the rest. `silent`: it accepts TCP connections and never answers.
 */
interface RawBridge {
  readonly url: string;
  readonly sockets: Socket[];
  /** Bytes received after the handshake, per socket. */
  readonly received: Map<Socket, Buffer>;
  close(): Promise<void>;
}

async function startRawBridge(
  options: {
    silent?: boolean;
    greeting?: string;
    /** The 101 waits for it. */
    holdHandshake?: Promise<void>;
    /** Header lines added to the 101, each ending in CRLF. */
    handshakeFields?: string;
  } = {},
): Promise<RawBridge> {
  const sockets: Socket[] = [];
  const received = new Map<Socket, Buffer>();
  // allowHalfOpen: the bridge can go on writing after the gateway has ended its side.
  const server = net.createServer({ allowHalfOpen: true }, (socket) => {
    sockets.push(socket);
    socket.on('error', () => {});
    let head = Buffer.alloc(0);
    let upgraded = false;
    socket.on('data', (chunk: Buffer) => {
      if (options.silent) return;
      if (upgraded) {
        received.set(socket, Buffer.concat([received.get(socket) ?? Buffer.alloc(0), chunk]));
        return;
      }
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end === -1) return;
      const key = /^sec-websocket-key:\s*(\S+)\s*$/im.exec(head.subarray(0, end).toString('latin1'))?.[1] ?? '';
      const accept = createHash('sha1')
        .update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11')
        .digest('base64');
      upgraded = true;
      received.set(socket, head.subarray(end + 4));
      const handshake = Buffer.from(
        `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n${options.handshakeFields ?? ''}\r\n`,
      );
      // A greeting goes out in the same write as the 101, as a market-data bridge sends its snapshot.
      const greeting =
        options.greeting === undefined
          ? Buffer.alloc(0)
          : Buffer.concat([Buffer.from([0x81, Buffer.byteLength(options.greeting)]), Buffer.from(options.greeting)]);
      if (options.holdHandshake)
        void options.holdHandshake.then(() => socket.write(Buffer.concat([handshake, greeting])));
      else socket.write(Buffer.concat([handshake, greeting]));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    sockets,
    received,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** An unmasked binary frame as a server sends it (RFC 6455 §5.2), 64-bit length form. */
function serverBinaryFrame(payload: Buffer): Buffer {
  const header = Buffer.alloc(10);
  header[0] = 0x82;
  header[1] = 127;
  header.writeBigUInt64BE(BigInt(payload.length), 2);
  return Buffer.concat([header, payload]);
}

/** The code of the first frame of `bytes` when it is a masked Close frame (as a client sends it). */
function maskedCloseCode(bytes: Buffer): number | undefined {
  if (bytes.length < 8 || bytes[0] !== 0x88 || ((bytes[1] as number) & 0x80) === 0) return undefined;
  const mask = bytes.subarray(2, 6);
  return (((bytes[6] as number) ^ (mask[0] as number)) << 8) | ((bytes[7] as number) ^ (mask[1] as number));
}

// ---------------------------------------------------------------------------------------------
// Client helpers: every wait is bounded.

const wsUrl = (gw: TestGateway, target: string): string => gw.url.replace(/^http:/, 'ws:') + target;

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<T>(
      (_, reject) => (timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms)),
    ),
  ]);
}

/** Every client a test opened, so that afterEach can drop what a failed test left behind. */
const clients = new Set<WebSocket>();

interface Opened {
  readonly ws: WebSocket;
  /** The 101 answer's headers. */
  readonly headers: IncomingHttpHeaders;
  /** Resolves with the close code and reason the client saw. */
  readonly closed: Promise<{ code: number; reason: string }>;
}

/**
 * Opens a WebSocket through the gateway; rejects on anything but a 101 within `timeoutMs`. A field
 * given several values is sent one line per value (ws hands the headers to http.request).
 */
function open(url: string, headers: Record<string, string | string[]> = {}, timeoutMs = 5000): Promise<Opened> {
  return withTimeout(
    new Promise<Opened>((resolve, reject) => {
      const ws = new WebSocket(url, {
        // (ws's typings allow one value per field; it passes them to http.request as they are.)
        headers: headers as Record<string, string>,
        handshakeTimeout: timeoutMs,
        maxPayload: 16 * 1024 * 1024,
      });
      clients.add(ws);
      let upgradeHeaders: IncomingHttpHeaders = {};
      const closed = new Promise<{ code: number; reason: string }>((res) => {
        ws.once('close', (code, reason) => {
          clients.delete(ws);
          res({ code, reason: reason.toString('utf8') });
        });
      });
      ws.on('upgrade', (res) => (upgradeHeaders = res.headers));
      ws.once('open', () => resolve({ ws, headers: upgradeHeaders, closed }));
      ws.on('error', (err) => reject(err));
      ws.once('unexpected-response', (_req, res) => {
        res.resume();
        reject(new Error(`upgrade answered ${res.statusCode}`));
        ws.terminate();
      });
    }),
    timeoutMs + 500,
    `open ${url}`,
  );
}

interface Refusal {
  readonly status: number;
  /** The status line's reason phrase. */
  readonly statusText: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}

/** An upgrade the gateway must answer with plain HTTP: its status, headers and body, read from 'unexpected-response'. */
function refused(url: string, headers: Record<string, string> = {}, timeoutMs = 5000): Promise<Refusal> {
  return withTimeout(
    new Promise<Refusal>((resolve, reject) => {
      const ws = new WebSocket(url, { headers, handshakeTimeout: timeoutMs });
      ws.on('error', () => {}); // terminate() below reports the aborted handshake as an error
      ws.once('open', () => {
        ws.terminate();
        reject(new Error('the upgrade was accepted'));
      });
      ws.once('unexpected-response', (_req, res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          resolve({
            status: res.statusCode ?? 0,
            statusText: res.statusMessage ?? '',
            headers: res.headers,
            body: Buffer.concat(chunks).toString('utf8'),
          });
          ws.terminate();
        });
      });
    }),
    timeoutMs + 500,
    `refused upgrade ${url}`,
  );
}

function nextMessage(ws: WebSocket, timeoutMs = 5000): Promise<{ data: Buffer; binary: boolean }> {
  return withTimeout(
    new Promise((resolve) =>
      ws.once('message', (data: RawData, binary: boolean) => resolve({ data: toBuffer(data), binary })),
    ),
    timeoutMs,
    'a message',
  );
}

async function echo(ws: WebSocket, data: string | Buffer, binary: boolean): Promise<{ data: Buffer; binary: boolean }> {
  const reply = nextMessage(ws, 10_000);
  ws.send(data, { binary });
  return reply;
}

// ---------------------------------------------------------------------------------------------
// Admin helpers.

async function usageOf(
  gw: TestGateway,
  key: string,
  route = ORDERS,
): Promise<{ hour: { used: number; remaining: number }; day: { used: number; remaining: number } }> {
  const reply = await send(gw.adminUrl, { path: `/admin/usage/${encodeURIComponent(key)}`, headers: authHeader() });
  expect(reply.status).toBe(200);
  const entry = reply
    .json<{ endpoints: Array<{ route: string; hour: never; day: never }> }>()
    .endpoints.find((e) => e.route === route);
  if (!entry) throw new Error(`no usage entry for ${route}`);
  return entry;
}

/** The value of `oapi_gateway_websocket_connections{endpoint=…}` (0 when the series is absent). */
async function gauge(gw: TestGateway, endpoint = ORDERS): Promise<number> {
  const reply = await send(gw.adminUrl, { path: '/metrics' });
  expect(reply.status).toBe(200);
  const line = reply.text
    .split('\n')
    .find((l) => l.startsWith(`oapi_gateway_websocket_connections{endpoint="${endpoint}"} `));
  if (!line) return 0;
  return Number(line.slice(line.lastIndexOf(' ') + 1));
}

// ---------------------------------------------------------------------------------------------

let gw: TestGateway;
let bridge: TestBridge;

beforeAll(async () => {
  bridge = await startBridge();
  gw = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: bridge.url } });
});
afterEach(async () => {
  for (const ws of clients) ws.terminate();
  clients.clear();
  // Every test starts with no connection open through the main gateway.
  await waitFor('no WebSocket left open', async () => (await gauge(gw)) === 0, 5000);
});
afterAll(async () => {
  await gw?.stop();
  await bridge?.close();
});

describe('an accepted upgrade', () => {
  it('is counted as one connection against its row and proxied to the bridge', async () => {
    const key = newKey();
    const before = await usageOf(gw, key);
    expect(before.hour.used).toBe(0);
    expect(before.day.used).toBe(0);
    const sidesBefore = bridge.sides.length;

    const { ws } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': key });
    await waitFor('the bridge to accept the WebSocket', () => bridge.sides.length === sidesBefore + 1, 3000);
    const side = bridge.sides[sidesBefore]!;
    expect(side.url).toBe('/ws/orders');
    expect(side.headers['x-request-id']).toBeTruthy();

    const after = await usageOf(gw, key);
    expect(after.hour.used).toBe(1);
    expect(after.day.used).toBe(1);
    expect(after.hour.remaining).toBe(499);
    expect(after.day.remaining).toBe(999);
    // Nothing else of the table was counted.
    expect((await usageOf(gw, key, 'GET /orders')).hour.used).toBe(0);
    ws.close();
  });

  it('answers the upgrade with 101 carrying the usage headers (README "Headers and answers") and X-Request-Id', async () => {
    const key = newKey();
    const { ws, headers } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': key });
    expect(headers['x-ratelimit-limit-hour']).toBe('500');
    expect(headers['x-ratelimit-remaining-hour']).toBe('499');
    expect(headers['x-ratelimit-limit-day']).toBe('1000');
    expect(headers['x-ratelimit-remaining-day']).toBe('999');
    expect(headers['ratelimit-policy']).toBe('"hour";q=500;w=3600, "day";q=1000;w=86400');
    expect(headers['ratelimit']).toMatch(/^"hour";r=499;t=\d+, "day";r=999;t=\d+$/);
    expect(headers['x-request-id']).toBeTruthy();
    ws.close();
  });

  it('carries text and binary frames both ways, a 1 MB binary message included', async () => {
    const { ws } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor(
      'the bridge side',
      () => bridge.sides.length > 0 && bridge.sides.at(-1)!.ws.readyState === WebSocket.OPEN,
      3000,
    );
    const side = bridge.sides.at(-1)!;

    const text = await echo(ws, 'héllo, bridge', false);
    expect(text.binary).toBe(false);
    expect(text.data.toString('utf8')).toBe('héllo, bridge');

    const small = randomBytes(1000);
    const binary = await echo(ws, small, true);
    expect(binary.binary).toBe(true);
    expect(binary.data.equals(small)).toBe(true);

    const large = randomBytes(1024 * 1024);
    const big = await echo(ws, large, true);
    expect(big.binary).toBe(true);
    expect(big.data.length).toBe(large.length);
    expect(big.data.equals(large)).toBe(true);

    // What the bridge received is what the client sent, frame for frame.
    expect(side.messages.map((m) => [m.binary, m.data.length])).toEqual([
      [false, Buffer.byteLength('héllo, bridge')],
      [true, 1000],
      [true, 1024 * 1024],
    ]);
    expect(side.messages[2]!.data.equals(large)).toBe(true);

    // And a message the bridge starts reaches the client.
    const pushed = nextMessage(ws);
    side.ws.send('from the bridge');
    const got = await pushed;
    expect(got.binary).toBe(false);
    expect(got.data.toString('utf8')).toBe('from the bridge');
    ws.close();
  });

  it('passes the client close code and reason to the bridge', async () => {
    const sidesBefore = bridge.sides.length;
    const { ws, closed } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    const side = bridge.sides[sidesBefore]!;
    ws.close(4000, 'bye');
    expect(await withTimeout(side.closed, 3000, 'the bridge side to close')).toEqual({ code: 4000, reason: 'bye' });
    // The bridge echoes the close, as RFC 6455 §5.5.1 has it, and the client sees that.
    expect(await withTimeout(closed, 3000, 'the client to close')).toEqual({ code: 4000, reason: 'bye' });
  });

  it('passes the bridge close code and reason to the client', async () => {
    const sidesBefore = bridge.sides.length;
    const { closed } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    const side = bridge.sides[sidesBefore]!;
    side.ws.close(4001, 'done');
    expect(await withTimeout(closed, 3000, 'the client to close')).toEqual({ code: 4001, reason: 'done' });
    expect(await withTimeout(side.closed, 3000, 'the bridge side to close')).toEqual({ code: 4001, reason: 'done' });
  });
});

/** The values of the lines named `name` (any case) in a flat header list. */
function linesOf(raw: readonly string[], name: string): string[] {
  const values: string[] = [];
  for (let i = 0; i < raw.length; i += 2) if (raw[i]?.toLowerCase() === name) values.push(raw[i + 1] as string);
  return values;
}

/** The bytes of a WebSocket upgrade request for `target`, with further header lines. */
function upgradeRequest(target: string, lines: readonly string[], host = '127.0.0.1'): string {
  return [
    `GET ${target} HTTP/1.1`,
    `Host: ${host}`,
    'Upgrade: websocket',
    'Connection: Upgrade',
    `Sec-WebSocket-Key: ${randomBytes(16).toString('base64')}`,
    'Sec-WebSocket-Version: 13',
    ...lines,
    '',
    '',
  ].join('\r\n');
}

/** An upgrade request written by hand, for header lines no Node client sends (two `Cookie` lines); resolves with the answer's head. */
function handWrittenUpgrade(gw: TestGateway, target: string, lines: readonly string[]): Promise<string> {
  const socket = net.connect({ port: gw.port, host: '127.0.0.1' });
  socket.on('error', () => {});
  let received = '';
  const head = new Promise<string>((resolve, reject) => {
    socket.on('data', (chunk: Buffer) => {
      received += chunk.toString('latin1');
      const end = received.indexOf('\r\n\r\n');
      if (end !== -1) resolve(received.slice(0, end));
    });
    socket.once('close', () => reject(new Error(`closed before an answer: ${JSON.stringify(received)}`)));
  });
  socket.write(upgradeRequest(target, lines));
  return withTimeout(head, 5000, `the answer to ${target}`).finally(() => socket.destroy());
}

/** Everything the gateway answers on a connection that sends `bytes`, until it closes it (bounded). */
function wholeAnswer(gw: TestGateway, bytes: string): Promise<string> {
  const socket = net.connect({ port: gw.port, host: '127.0.0.1' });
  socket.on('error', () => {});
  let received = '';
  socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
  const closed = new Promise<string>((resolve) => socket.once('close', () => resolve(received)));
  socket.write(bytes);
  return withTimeout(closed, 5000, 'the gateway to answer and close').finally(() => socket.destroy());
}

describe('regression: an upgrade whose Host is no URL authority got no answer at all, or was forwarded where the HTTP path refuses it', () => {
  // docs/operations.md "Hostile clients": a Host and target that do not form a URL get a two-field
  // 400 with an X-Request-Id, are not counted and never forwarded, as an HTTP request with that Host is.
  const hosts = ['a@127.0.0.1', 'user:secret@127.0.0.1', 'foo/bar', '127.0.0.1\\x'];
  for (const host of hosts) {
    it(`(Host: ${host}) gets the 400 the HTTP path gives, nothing counted or forwarded`, async () => {
      const key = newKey('host');
      const sidesBefore = bridge.sides.length;
      const http = await wholeAnswer(gw, `GET /orders HTTP/1.1\r\nHost: ${host}\r\nX-API-Key: ${key}\r\n\r\n`);
      expect(http).toMatch(/^HTTP\/1\.1 400 /);

      const answer = await wholeAnswer(gw, upgradeRequest('/ws/orders', [`X-API-Key: ${key}`], host));
      expect(answer).toMatch(/^HTTP\/1\.1 400 /);
      const [head, body] = answer.split('\r\n\r\n') as [string, string];
      expect(head).toMatch(/\r\ncontent-type: application\/json/i);
      expect(head).toMatch(/\r\nx-request-id: \S+/i);
      expect(JSON.parse(body)).toEqual({ error: 'Bad Request', message: 'Malformed request' });
      await sleep(100);
      expect(bridge.sides.length).toBe(sidesBefore);
      expect((await usageOf(gw, key)).hour.used).toBe(0);
    });
  }
});

describe('the upgrade request the bridge receives', () => {
  it('carries every line of a repeated field, as a forwarded HTTP request does (regression: only the last one reached the bridge)', async () => {
    const sidesBefore = bridge.sides.length;
    const { ws } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey(), 'X-Client-Tag': ['one', 'two'] });
    await waitFor('the bridge to accept the WebSocket', () => bridge.sides.length === sidesBefore + 1, 3000);
    expect(linesOf(bridge.sides[sidesBefore]!.rawHeaders, 'x-client-tag')).toEqual(['one', 'two']);
    expect(await echo(ws, 'still joined', false)).toEqual({ data: Buffer.from('still joined'), binary: false });
    ws.close();
  });

  it('carries both Cookie lines, joined with "; " (RFC 6265 §5.4), and both Sec-WebSocket-Protocol lines, whose first the bridge picks', async () => {
    const sidesBefore = bridge.sides.length;
    const head = await handWrittenUpgrade(gw, '/ws/orders', [
      `X-API-Key: ${newKey()}`,
      'Cookie: a=1',
      'Cookie: b=2',
      'Sec-WebSocket-Protocol: chat',
      'Sec-WebSocket-Protocol: superchat',
    ]);
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    expect(head).toMatch(/\r\nsec-websocket-protocol: chat\r\n/i);
    await waitFor('the bridge to accept the WebSocket', () => bridge.sides.length === sidesBefore + 1, 3000);
    const { rawHeaders } = bridge.sides[sidesBefore]!;
    expect(linesOf(rawHeaders, 'cookie')).toEqual(['a=1; b=2']);
    expect(linesOf(rawHeaders, 'sec-websocket-protocol')).toEqual(['chat', 'superchat']);
  });
});

describe('a bridge that speaks first', () => {
  it('delivers the frames it sent together with its 101 (regression: they were read before the client pipe existed)', async () => {
    const bridge = await startRawBridge({ greeting: 'snapshot' });
    const gw = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: bridge.url } });
    try {
      const ws = new WebSocket(wsUrl(gw, '/ws/orders'), { headers: { 'X-API-Key': newKey('first') } });
      clients.add(ws);
      const first = await withTimeout(nextMessage(ws), 3000, 'the greeting');
      expect(first.data.toString()).toBe('snapshot');
      ws.terminate();
    } finally {
      await gw.stop();
      await bridge.close();
    }
  });
});

describe('refused upgrades: the answers of README "Headers and answers", and no socket at the bridge', () => {
  let small: TestGateway;
  let smallBridge: TestBridge;
  beforeAll(async () => {
    smallBridge = await startBridge();
    small = await startTestGateway({ limits: SMALL_LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: smallBridge.url } });
  });
  afterAll(async () => {
    await small?.stop();
    await smallBridge?.close();
  });

  it('answers 429 over the limit, with Retry-After and the usage headers, and opens nothing at the bridge', async () => {
    const key = newKey('limit');
    for (let i = 0; i < 3; i++) {
      const { ws, closed } = await open(wsUrl(small, '/ws/orders'), { 'X-API-Key': key });
      ws.close();
      await withTimeout(closed, 3000, 'a close');
    }
    await waitFor('three connections at the bridge', () => smallBridge.sides.length === 3, 3000);
    const tcpBefore = smallBridge.tcpAccepted();
    expect(tcpBefore).toBe(3);

    const answer = await refused(wsUrl(small, '/ws/orders'), { 'X-API-Key': key });
    expect(answer.status).toBe(429);
    // The status line is RFC 9110's; the body is the specification's (regression: "429 Rate Limit Exceeded").
    expect(answer.statusText).toBe('Too Many Requests');
    expect(answer.body).toBe('{"error":"Rate Limit Exceeded","message":"Too Many Requests"}');
    expect(answer.headers['content-type']).toMatch(/^application\/json/);
    const retryAfter = Number(answer.headers['retry-after']);
    expect(Number.isInteger(retryAfter)).toBe(true);
    expect(retryAfter).toBeGreaterThanOrEqual(1);
    expect(retryAfter).toBeLessThanOrEqual(3600);
    expect(answer.headers['x-ratelimit-limit-hour']).toBe('3');
    expect(answer.headers['x-ratelimit-remaining-hour']).toBe('0');
    expect(answer.headers['x-ratelimit-limit-day']).toBe('10');
    expect(answer.headers['x-ratelimit-remaining-day']).toBe('7');
    expect(answer.headers['ratelimit-policy']).toBe('"hour";q=3;w=3600, "day";q=10;w=86400');
    const ratelimit = /^"hour";r=0;t=(\d+), "day";r=7;t=(\d+)$/.exec(answer.headers['ratelimit'] as string);
    expect(ratelimit).not.toBeNull();
    // Only the hour window is spent: Retry-After is its reset.
    expect(retryAfter).toBe(Math.max(1, Number(ratelimit![1])));
    expect(answer.headers['x-request-id']).toBeTruthy();

    // A second refusal too; and the refused upgrades used none of the day's quota.
    expect((await refused(wsUrl(small, '/ws/orders'), { 'X-API-Key': key })).status).toBe(429);
    const usage = await usageOf(small, key);
    expect(usage.hour.used).toBe(3);
    expect(usage.day.used).toBe(3);

    await sleep(100);
    expect(smallBridge.tcpAccepted()).toBe(tcpBefore);
    expect(smallBridge.sides.length).toBe(3);
  });

  it('answers 401 to an upgrade without a key, 404 to an unknown WebSocket path, opening nothing', async () => {
    const tcpBefore = smallBridge.tcpAccepted();

    const missing = await refused(wsUrl(small, '/ws/orders'));
    expect(missing.status).toBe(401);
    expect(missing.headers['content-type']).toMatch(/^application\/json/);
    expect(JSON.parse(missing.body)).toEqual({ error: 'Unauthorized', message: 'Missing API key' });

    const empty = await refused(wsUrl(small, '/ws/orders?api_key='));
    expect(empty.status).toBe(401);
    expect(JSON.parse(empty.body)).toEqual({ error: 'Unauthorized', message: 'Missing API key' });

    const unknown = await refused(wsUrl(small, '/ws/nowhere'), { 'X-API-Key': newKey() });
    expect(unknown.status).toBe(404);
    expect(unknown.headers['content-type']).toMatch(/^application\/json/);
    const body = JSON.parse(unknown.body) as Record<string, unknown>;
    expect(Object.keys(body).sort()).toEqual(['error', 'message']);
    expect(body.error).toBe('Not Found');
    expect(typeof body.message).toBe('string');

    await sleep(100);
    expect(smallBridge.tcpAccepted()).toBe(tcpBefore);
  });

  it('answers 502 when the bridge cannot be reached', async () => {
    const closedPort = await refusingPort();
    const down = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { ...FAST_ENV, EQT_BRIDGE_URL: `http://127.0.0.1:${closedPort}` },
    });
    try {
      const answer = await refused(wsUrl(down, '/ws/orders'), { 'X-API-Key': newKey() });
      expect(answer.status).toBe(502);
      expect(answer.headers['content-type']).toMatch(/^application\/json/);
      expect(JSON.parse(answer.body)).toEqual({ error: 'Bad Gateway', message: 'Bridge unreachable' });
      expect(answer.body).not.toContain(String(closedPort));
      expect(await gauge(down)).toBe(0);
      // The gateway's own answer says why, in its access line and its metric (docs/operations.md "Logs").
      const line = await accessLine(down, answer.headers['x-request-id']);
      expect(line).toMatchObject({ status: 502, reason: 'bridge-unreachable', endpoint: ORDERS });
      expect(
        await metricValue(down, 'oapi_gateway_own_answers_total', { endpoint: ORDERS, reason: 'bridge-unreachable' }),
      ).toBe(1);
    } finally {
      await down.stop();
    }
  });

  it('carries the usage headers on the 502 of a counted upgrade', async () => {
    const closedPort = await refusingPort();
    const down = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { ...FAST_ENV, EQT_BRIDGE_URL: `http://127.0.0.1:${closedPort}` },
    });
    try {
      const key = newKey();
      const answer = await refused(wsUrl(down, '/ws/orders'), { 'X-API-Key': key });
      expect(answer.status).toBe(502);
      // The upgrade was counted (step 3 came before forwarding) ...
      expect((await usageOf(down, key)).hour.used).toBe(1);
      // ... so its answer carries the usage headers, as an HTTP 502 does.
      expect(answer.headers['x-ratelimit-limit-hour']).toBe('3');
      expect(answer.headers['x-ratelimit-remaining-hour']).toBe('2');
      expect(answer.headers['x-ratelimit-remaining-day']).toBe('9');
      expect(answer.headers['ratelimit-policy']).toBe('"hour";q=3;w=3600, "day";q=10;w=86400');
      expect(answer.headers['x-request-id']).toBeTruthy();
    } finally {
      await down.stop();
    }
  });

  it('answers 504 when the bridge does not answer the upgrade in time, and drops its socket to the bridge', async () => {
    const silent = await startRawBridge({ silent: true });
    const slow = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { ...FAST_ENV, UPSTREAM_TIMEOUT_MS: '400', EQT_BRIDGE_URL: silent.url },
    });
    try {
      const started = performance.now();
      const answer = await refused(wsUrl(slow, '/ws/orders'), { 'X-API-Key': newKey() });
      expect(answer.status).toBe(504);
      expect(JSON.parse(answer.body)).toEqual({ error: 'Gateway Timeout', message: 'Bridge did not answer in time' });
      const line = await accessLine(slow, answer.headers['x-request-id']);
      expect(line).toMatchObject({ status: 504, reason: 'bridge-timeout', endpoint: ORDERS });
      expect(
        await metricValue(slow, 'oapi_gateway_own_answers_total', { endpoint: ORDERS, reason: 'bridge-timeout' }),
      ).toBe(1);
      // Its request to the bridge was abandoned by the gateway: no bridge error is logged for it.
      await sleep(100);
      expect(slow.logs.filter((l) => l.msg === 'bridge error')).toEqual([]);
      expect(performance.now() - started).toBeLessThan(2000);
      expect(silent.sockets.length).toBe(1);
      // The upgrade is abandoned: the gateway must not keep a connection to the bridge open for it.
      await waitFor(
        'the gateway to drop its socket to the bridge',
        () => silent.sockets[0]!.destroyed || silent.sockets[0]!.readableEnded,
        2000,
      );
    } finally {
      await slow.stop();
      await silent.close();
    }
  });
});

describe('the api_key query parameter', () => {
  it('is accepted on a WebSocket route, removed before forwarding, other parameters kept', async () => {
    const key = newKey('query');
    const sidesBefore = bridge.sides.length;
    const { ws } = await open(wsUrl(gw, `/ws/orders?symbol=VN30&api_key=${key}&depth=5`));
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    expect(bridge.sides[sidesBefore]!.url).toBe('/ws/orders?symbol=VN30&depth=5');
    expect((await usageOf(gw, key)).hour.used).toBe(1);
    const reply = await echo(ws, 'ping', false);
    expect(reply.data.toString('utf8')).toBe('ping');
    ws.close();

    // Alone, it leaves no query at all.
    const alone = newKey('query');
    const { ws: ws2 } = await open(wsUrl(gw, `/ws/orders?api_key=${alone}`));
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 2, 3000);
    expect(bridge.sides[sidesBefore + 1]!.url).toBe('/ws/orders');
    ws2.close();

    expect(gw.logText()).not.toContain(key);
    expect(gw.logText()).not.toContain(alone);
  });

  it('keeps the other parameters byte for byte', async () => {
    const key = newKey('query');
    const sidesBefore = bridge.sides.length;
    const { ws } = await open(wsUrl(gw, `/ws/orders?symbols=AAA,BBB&api_key=${key}&note=a%20b&flag`));
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    expect(bridge.sides[sidesBefore]!.url).toBe('/ws/orders?symbols=AAA,BBB&note=a%20b&flag');
    ws.close();
  });

  it('never reaches the bridge, whatever the spelling of its name', async () => {
    // `api%5Fkey` is `api_key` once decoded: if the gateway takes the key from it, it must remove it too.
    const key = newKey('query');
    const sidesBefore = bridge.sides.length;
    const outcome = await open(wsUrl(gw, `/ws/orders?api%5Fkey=${key}&x=1`)).then(
      (o) => o,
      () => undefined,
    );
    if (outcome) await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    for (const side of bridge.sides) expect(side.url).not.toContain(key);
    expect(gw.logText()).not.toContain(key);
    outcome?.ws.close();
  });

  it('is not accepted on a plain HTTP route', async () => {
    const key = newKey('http');
    const before = bridge.httpRequests.length;
    const reply = await send(gw.url, { path: `/orders?api_key=${key}` });
    expect(reply.status).toBe(401);
    expect(reply.json()).toEqual({ error: 'Unauthorized', message: 'Missing API key' });
    expect(bridge.httpRequests.length).toBe(before);
    expect((await usageOf(gw, key, 'GET /orders')).hour.used).toBe(0);
    expect(gw.logText()).not.toContain(key);

    // The same key in the header works on that route.
    const ok = await send(gw.url, { path: '/orders', headers: { 'X-API-Key': key } });
    expect(ok.status).toBe(200);
  });
});

describe('open connections', () => {
  it('are visible per row in the metric, going back down on close', async () => {
    expect(await gauge(gw)).toBe(0);
    const a = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('gauge 1', async () => (await gauge(gw)) === 1, 3000);
    const b = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('gauge 2', async () => (await gauge(gw)) === 2, 3000);

    a.ws.close(1000, 'first');
    await withTimeout(a.closed, 3000, 'a to close');
    await waitFor('gauge back to 1', async () => (await gauge(gw)) === 1, 3000);
    b.ws.close();
    await withTimeout(b.closed, 3000, 'b to close');
    await waitFor('gauge back to 0', async () => (await gauge(gw)) === 0, 3000);
  });

  it('are released when the bridge closes first', async () => {
    const sidesBefore = bridge.sides.length;
    const { ws, closed } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    expect(await gauge(gw)).toBe(1);
    const side = bridge.sides[sidesBefore]!;
    side.ws.close(4002, 'server going');
    expect(await withTimeout(closed, 3000, 'the client to close')).toEqual({ code: 4002, reason: 'server going' });
    const clientSocket = (ws as unknown as { _socket: Socket | null })._socket;
    expect(clientSocket === null || clientSocket.destroyed).toBe(true);
    await waitFor('the gateway to release the connection', async () => (await gauge(gw)) === 0, 3000);
    await waitFor('the bridge socket to close', () => side.socketClosed, 3000);
  });

  it('are released when the bridge vanishes without a Close frame', async () => {
    const sidesBefore = bridge.sides.length;
    const { closed } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    const side = bridge.sides[sidesBefore]!;
    side.ws.terminate();
    expect((await withTimeout(closed, 4000, 'the client to close')).code).toBe(1006);
    await waitFor('the gateway to release the connection', async () => (await gauge(gw)) === 0, 4000);
    await waitFor('the bridge socket to close', () => side.socketClosed, 3000);
  });

  it('are released when the client vanishes without a Close frame', async () => {
    const sidesBefore = bridge.sides.length;
    const { ws } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 1, 3000);
    expect(await gauge(gw)).toBe(1);
    const side = bridge.sides[sidesBefore]!;
    (ws as unknown as { _socket: Socket })._socket.destroy();
    const seen = await withTimeout(side.closed, 4000, 'the bridge to see the connection closed');
    expect(seen.code).toBe(1006);
    await waitFor('the bridge socket to close', () => side.socketClosed, 3000);
    await waitFor('the gateway to release the connection', async () => (await gauge(gw)) === 0, 4000);

    // The same with terminate().
    const { ws: ws2 } = await open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': newKey() });
    await waitFor('the bridge side', () => bridge.sides.length === sidesBefore + 2, 3000);
    const side2 = bridge.sides[sidesBefore + 1]!;
    ws2.terminate();
    expect((await withTimeout(side2.closed, 4000, 'the bridge to see it closed')).code).toBe(1006);
    await waitFor('the bridge socket to close', () => side2.socketClosed, 3000);
    await waitFor('the gateway to release the connection', async () => (await gauge(gw)) === 0, 4000);
  });

  it('leak nothing when the client leaves while the bridge is still answering the upgrade', async () => {
    const server = http.createServer();
    const wss = new WebSocketServer({ noServer: true });
    const bridgeSockets: Socket[] = [];
    let upgradesSeen = 0;
    server.on('upgrade', (req, socket, head) => {
      upgradesSeen++;
      bridgeSockets.push(socket as Socket);
      socket.on('error', () => {});
      // The bridge accepts, but only after the client has given up.
      setTimeout(() => {
        if (!socket.destroyed) wss.handleUpgrade(req, socket, head, (ws) => ws.on('error', () => {}));
      }, 300);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const late = await startTestGateway({
      limits: LIMITS,
      env: { ...FAST_ENV, EQT_BRIDGE_URL: `http://127.0.0.1:${(server.address() as AddressInfo).port}` },
    });
    try {
      const ws = new WebSocket(wsUrl(late, '/ws/orders'), { headers: { 'X-API-Key': newKey() } });
      ws.on('error', () => {});
      await waitFor('the upgrade to reach the bridge', () => upgradesSeen === 1, 3000);
      ws.terminate();
      // The bridge accepts 300 ms after it saw the upgrade; then the gateway must let go of both sides.
      await sleep(400);
      await waitFor('the bridge socket to close', () => bridgeSockets[0]!.destroyed, 3000);
      await waitFor('no WebSocket counted open', async () => (await gauge(late)) === 0, 3000);
    } finally {
      await late.stop();
      for (const client of wss.clients) client.terminate();
      server.closeAllConnections();
      for (const socket of bridgeSockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it('serve 100 connections at once, each echoing its own message', async () => {
    const key = newKey('many');
    const n = 100;
    const all = await Promise.all(
      Array.from({ length: n }, () => open(wsUrl(gw, '/ws/orders'), { 'X-API-Key': key }, 10_000)),
    );
    await waitFor(`gauge ${n}`, async () => (await gauge(gw)) === n, 5000);
    const replies = await Promise.all(
      all.map(({ ws }, i) =>
        echo(ws, `message ${i} ${randomBytes(6).toString('hex')}-${i}`, false).then(
          (r) => [i, r.data.toString('utf8')] as const,
        ),
      ),
    );
    for (const [i, text] of replies) expect(text).toMatch(new RegExp(`^message ${i} [0-9a-f]{12}-${i}$`));
    // Each connection got its own message back, not another's.
    expect(new Set(replies.map(([, text]) => text)).size).toBe(n);
    const usage = await usageOf(gw, key);
    expect(usage.hour.used).toBe(n);
    expect(usage.day.used).toBe(n);

    for (const { ws } of all) ws.close();
    await withTimeout(Promise.all(all.map((o) => o.closed)), 5000, 'every client to close');
    await waitFor('gauge back to 0', async () => (await gauge(gw)) === 0, 5000);
  });
});

describe('shutdown', () => {
  it('lets the HTTP request in flight complete, then closes the WebSocket with 1001 on both sides', async () => {
    const slow = await startBridge({ httpDelayMs: 500 });
    const down = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: slow.url } });
    try {
      const key = newKey('shutdown');
      const { ws, closed } = await open(wsUrl(down, '/ws/orders'), { 'X-API-Key': key });
      await waitFor('the bridge side', () => slow.sides.length === 1, 3000);
      const side = slow.sides[0]!;
      expect((await echo(ws, 'before', false)).data.toString('utf8')).toBe('before');

      let clientClosedAt = 0;
      void closed.then(() => (clientClosedAt = performance.now()));
      let httpDoneAt = 0;
      const inFlight = send(down.url, {
        path: '/orders',
        headers: { 'X-API-Key': key },
        agent: false,
        timeoutMs: 5000,
      }).then((r) => {
        httpDoneAt = performance.now();
        return r;
      });
      await waitFor('the HTTP request to reach the bridge', () => slow.httpRequests.length === 1, 3000);

      const stopping = down.gateway.stop();
      const reply = await inFlight;
      expect(reply.status).toBe(200);
      expect(reply.json()).toEqual({ slow: true, url: '/orders' });

      expect(await withTimeout(closed, 5000, 'the client to get a Close')).toEqual({
        code: 1001,
        reason: 'gateway shutting down',
      });
      expect(clientClosedAt).toBeGreaterThanOrEqual(httpDoneAt);
      expect((await withTimeout(side.closed, 5000, 'the bridge side to get a Close')).code).toBe(1001);
      await withTimeout(stopping, 8000, 'stop()');
      await waitFor('every bridge socket to close', () => slow.tcpOpen() === 0, 3000);
    } finally {
      await down.stop();
      await slow.close();
    }
  });

  it('finishes a frame in flight before the 1001, and sends the bridge a 1001 too', async () => {
    const raw = await startRawBridge();
    const down = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: raw.url } });
    try {
      const { ws, closed } = await open(wsUrl(down, '/ws/orders'), { 'X-API-Key': newKey('frame') });
      const events: string[] = [];
      let message: Buffer | undefined;
      ws.on('message', (data: RawData) => {
        message = toBuffer(data);
        events.push('message');
      });
      void closed.then(() => events.push('close'));
      await waitFor(
        'the raw bridge handshake',
        () => raw.sockets.length === 1 && raw.received.has(raw.sockets[0]!),
        3000,
      );
      const bridgeSocket = raw.sockets[0]!;
      const clientSocket = (ws as unknown as { _socket: Socket })._socket;

      const payload = randomBytes(200_000);
      const frame = serverBinaryFrame(payload);
      const half = 100_000;
      const readBefore = clientSocket.bytesRead;
      bridgeSocket.write(frame.subarray(0, half));
      await waitFor('half a frame to reach the client', () => clientSocket.bytesRead - readBefore >= half, 3000);

      const stopping = down.gateway.stop();
      // The client-to-bridge direction is between frames: the bridge gets its 1001 at once.
      await waitFor('a Close frame at the bridge', () => (raw.received.get(bridgeSocket)?.length ?? 0) >= 8, 3000);
      expect(maskedCloseCode(raw.received.get(bridgeSocket)!)).toBe(1001);
      expect(events).toEqual([]);

      // The rest of the frame still passes, then the 1001.
      bridgeSocket.write(frame.subarray(half));
      expect(await withTimeout(closed, 5000, 'the client to get a Close')).toEqual({
        code: 1001,
        reason: 'gateway shutting down',
      });
      expect(events).toEqual(['message', 'close']);
      expect(message?.equals(payload)).toBe(true);
      await withTimeout(stopping, 8000, 'stop()');
    } finally {
      await down.stop();
      await raw.close();
    }
  });

  it('finishes a frame in flight only as fast as the client reads it (regression: the rest of a large frame was buffered whole for a slow client)', async () => {
    const raw = await startRawBridge();
    const down = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: raw.url } });
    let pumping = true;
    try {
      const { ws } = await open(wsUrl(down, '/ws/orders'), { 'X-API-Key': newKey('slow') });
      await waitFor(
        'the raw bridge handshake',
        () => raw.sockets.length === 1 && raw.received.has(raw.sockets[0]!),
        3000,
      );
      const bridgeSocket = raw.sockets[0]!;
      // A client that reads nothing, and a bridge in the middle of a 64 MB frame that writes as fast as it may.
      (ws as unknown as { _socket: Socket })._socket.pause();
      const megabyte = Buffer.alloc(1024 * 1024, 7);
      const header = Buffer.alloc(10);
      header[0] = 0x82;
      header[1] = 127;
      header.writeBigUInt64BE(BigInt(64 * megabyte.length), 2);
      bridgeSocket.write(header);
      let written = 0;
      const pump = async (): Promise<void> => {
        const until = Date.now() + 8000;
        while (pumping && written < 64 && Date.now() < until) {
          written++;
          bridgeSocket.write(megabyte);
          // The next megabyte once the gateway has read this one (bounded: the loop ends with the shutdown).
          while (pumping && bridgeSocket.writableNeedDrain && Date.now() < until) await sleep(20);
        }
      };
      const pumped = pump();
      await sleep(500);
      const writtenBefore = written;
      const stopping = down.gateway.stop();
      // Within the 2 s the shutdown gives the connection (then it is dropped), the gateway read
      // no faster than before it, when the pipe held the bridge back.
      await sleep(1500);
      const writtenDuring = written - writtenBefore;
      pumping = false;
      await pumped;
      await withTimeout(stopping, 8000, 'stop()');
      expect(writtenDuring).toBeLessThan(8);
    } finally {
      pumping = false;
      await down.stop();
      await raw.close();
    }
  });

  it('lets go of a connection as soon as both sides have answered the 1001', async () => {
    const echoBridge = await startBridge();
    // The deadline is far: nothing but the connection itself should hold stop() up.
    const down = await startTestGateway({
      limits: LIMITS,
      env: { ...FAST_ENV, SHUTDOWN_TIMEOUT_MS: '10000', EQT_BRIDGE_URL: echoBridge.url },
    });
    try {
      const { closed } = await open(wsUrl(down, '/ws/orders'), { 'X-API-Key': newKey('release') });
      await waitFor('the bridge side', () => echoBridge.sides.length === 1, 3000);
      const side = echoBridge.sides[0]!;
      const stopping = down.gateway.stop();
      let stoppedAt = 0;
      void stopping.then(() => (stoppedAt = performance.now()));
      expect((await withTimeout(closed, 3000, 'the client to get a Close')).code).toBe(1001);
      expect((await withTimeout(side.closed, 3000, 'the bridge to get a Close')).code).toBe(1001);
      await waitFor('the bridge socket to close', () => side.socketClosed, 3000);
      const bothClosedAt = performance.now();
      // Both peers have closed their ends: the gateway sees it and stops without waiting out its 2 s bound.
      await withTimeout(stopping, 5000, 'stop()');
      expect(stoppedAt - bothClosedAt).toBeLessThan(1000);
    } finally {
      await down.stop();
      await echoBridge.close();
    }
  });
});

describe('regression: an upgrade in its handshake at shutdown opened after it and never got a 1001', () => {
  it('is waited for, and closed with 1001 on both sides as soon as it opens', async () => {
    let answer!: () => void;
    const raw = await startRawBridge({ holdHandshake: new Promise<void>((resolve) => (answer = resolve)) });
    const down = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: raw.url } });
    try {
      const opening = open(wsUrl(down, '/ws/orders'), { 'X-API-Key': newKey('handshake') });
      await waitFor(
        'the bridge to get the upgrade',
        () => raw.sockets.length === 1 && raw.received.has(raw.sockets[0]!),
        3000,
      );
      const bridgeSocket = raw.sockets[0]!;
      const stopping = down.gateway.stop();
      let stopped = false;
      void stopping.then(() => (stopped = true));
      await sleep(300);
      // stop() waits for the handshake rather than ending with nothing to close.
      expect(stopped).toBe(false);
      answer();
      const { closed } = await opening;
      expect(await withTimeout(closed, 3000, 'the client to get a Close')).toEqual({
        code: 1001,
        reason: 'gateway shutting down',
      });
      await waitFor('a Close frame at the bridge', () => (raw.received.get(bridgeSocket)?.length ?? 0) >= 8, 3000);
      expect(maskedCloseCode(raw.received.get(bridgeSocket)!)).toBe(1001);
      await withTimeout(stopping, 5000, 'stop()');
    } finally {
      answer();
      await down.stop();
      await raw.close();
    }
  });
});

describe("regression: a bridge's 101 reached the client with its non-ASCII field values re-encoded", () => {
  it('passes the bytes of its fields unchanged, as the HTTP path passes a bridge\'s fields (README "Forwarding")', async () => {
    // A Vietnamese note in UTF-8 (startRawBridge writes the fields as UTF-8 bytes).
    const note = 'Đã kết nối';
    const raw = await startRawBridge({ handshakeFields: `X-Bridge-Note: ${note}\r\n` });
    const behind = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: raw.url } });
    try {
      const head = await handWrittenUpgrade(behind, '/ws/orders', [`X-API-Key: ${newKey('bytes')}`]);
      expect(head).toMatch(/^HTTP\/1\.1 101 /);
      // The head as latin1: each byte one character. The bridge's bytes, not each of them UTF-8-encoded anew.
      const value = /\r\nx-bridge-note: ([^\r]*)/i.exec(head)?.[1];
      expect(value).toBe(Buffer.from(note, 'utf8').toString('latin1'));
    } finally {
      await behind.stop();
      await raw.close();
    }
  });
});

describe("regression: a bridge's 101 reached the client by http-proxy's rule, not the gateway's", () => {
  it('keeps repeated fields and names, drops hop-by-hop ones and the bridge\'s own usage headers, as the HTTP path does (README "Forwarding")', async () => {
    const raw = await startRawBridge({
      handshakeFields:
        'X-Bridge-Tag: a\r\nContent-Language: vi\r\nX-Bridge-Tag: b\r\nContent-Language: en\r\n' +
        'Keep-Alive: timeout=5\r\nConnection: X-Hop\r\nX-Hop: 1\r\nX-RateLimit-Limit-Hour: 999999\r\n',
    });
    const behind = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: raw.url } });
    try {
      const head = await handWrittenUpgrade(behind, '/ws/orders', [`X-API-Key: ${newKey('fields')}`]);
      const lines = head.split('\r\n');
      expect(lines[0]).toMatch(/^HTTP\/1\.1 101 /);
      expect(lines.filter((l) => /^x-bridge-tag:/i.test(l))).toEqual(['X-Bridge-Tag: a', 'X-Bridge-Tag: b']);
      expect(lines.filter((l) => /^content-language:/i.test(l))).toEqual([
        'Content-Language: vi',
        'Content-Language: en',
      ]);
      expect(lines.filter((l) => /^(keep-alive|x-hop):/i.test(l))).toEqual([]);
      expect(lines.filter((l) => /^x-ratelimit-limit-hour:/i.test(l))).toEqual(['X-RateLimit-Limit-Hour: 500']);
      expect(lines.filter((l) => /^(upgrade|connection):/i.test(l))).toEqual([
        'Upgrade: websocket',
        'Connection: Upgrade',
      ]);
    } finally {
      await behind.stop();
      await raw.close();
    }
  });
});

/**
 * A bridge that refuses every upgrade with `answer` (the bytes of a whole HTTP answer) and keeps its
 * connection open, as a keep-alive server does; with `thenClose`, closes it (a FIN) right after.
 */
async function startRefusingBridge(answer: string, thenClose = false): Promise<RawBridge> {
  const sockets: Socket[] = [];
  const server = net.createServer((socket) => {
    sockets.push(socket);
    socket.on('error', () => {});
    let head = '';
    socket.on('data', (chunk: Buffer) => {
      head += chunk.toString('latin1');
      if (!head.includes('\r\n\r\n')) return;
      head = '';
      socket.write(answer);
      if (thenClose) socket.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    sockets,
    received: new Map(),
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const REFUSAL_BODY = '{"error":"forbidden","detail":"no market data for this account"}';
/** A chunked 403 with CORS and usage fields of the bridge's own, its body in two chunks. */
const CHUNKED_REFUSAL = [
  'HTTP/1.1 403 Forbidden',
  'Content-Type: application/json',
  'Transfer-Encoding: chunked',
  'Access-Control-Allow-Origin: *',
  'X-RateLimit-Remaining-Hour: 99999',
  'X-Bridge-Note: refused',
  '',
  `${(20).toString(16)}\r\n${REFUSAL_BODY.slice(0, 20)}`,
  `${(REFUSAL_BODY.length - 20).toString(16)}\r\n${REFUSAL_BODY.slice(20)}`,
  '0',
  '',
  '',
].join('\r\n');

/** The access line of the answer that carried `requestId`, once written. */
async function accessLine(gw: TestGateway, requestId: unknown): Promise<Record<string, unknown>> {
  expect(typeof requestId).toBe('string');
  await waitFor('the access line', () => gw.logs.some((l) => l.msg === 'request' && l.reqId === requestId), 3000);
  return gw.logs.find((l) => l.msg === 'request' && l.reqId === requestId)!;
}

describe("regression: a bridge's Access-Control-* fields passed on the 101 with CORS on", () => {
  it('gives the client the gateway\'s CORS fields alone, as on the HTTP path (README "CORS")', async () => {
    const origin = 'https://app.example';
    const raw = await startRawBridge({
      handshakeFields:
        'Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Credentials: true\r\nX-Bridge-Note: open\r\n',
    });
    const cors = await startTestGateway({
      limits: LIMITS,
      env: { ...FAST_ENV, CORS_ORIGINS: origin, EQT_BRIDGE_URL: raw.url },
    });
    try {
      const { ws, headers } = await open(wsUrl(cors, '/ws/orders'), { 'X-API-Key': newKey('cors'), Origin: origin });
      expect(headers['access-control-allow-origin']).toBe(origin);
      expect(headers['access-control-allow-credentials']).toBeUndefined();
      expect(headers['x-bridge-note']).toBe('open');
      ws.terminate();
    } finally {
      await raw.close();
      await cors.stop();
    }
  });
});

describe('a bridge that refuses the upgrade', () => {
  it('has its answer passed to the client with the usage headers, X-Request-Id and the gateway\'s CORS fields, framed anew (regression: "transfer-encoding: chunked" over a de-chunked body, no usage headers)', async () => {
    const origin = 'https://app.example';
    const refusing = await startRefusingBridge(CHUNKED_REFUSAL);
    const cors = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { ...FAST_ENV, CORS_ORIGINS: origin, EQT_BRIDGE_URL: refusing.url },
    });
    try {
      const answer = await refused(wsUrl(cors, '/ws/orders'), { 'X-API-Key': newKey('refusal'), Origin: origin });
      expect(answer.status).toBe(403);
      expect(answer.statusText).toBe('Forbidden');
      expect(answer.body).toBe(REFUSAL_BODY);
      // Chunked anew, as the HTTP path frames a body without Content-Length: the client read it whole.
      expect(answer.headers['transfer-encoding']).toBe('chunked');
      expect(answer.headers['content-type']).toBe('application/json');
      expect(answer.headers['x-bridge-note']).toBe('refused');
      // The upgrade was counted: the usage headers are the gateway's, not the bridge's.
      expect(answer.headers['x-ratelimit-limit-hour']).toBe('3');
      expect(answer.headers['x-ratelimit-remaining-hour']).toBe('2');
      expect(answer.headers['ratelimit-policy']).toBe('"hour";q=3;w=3600, "day";q=10;w=86400');
      expect(answer.headers['x-request-id']).toBeTruthy();
      // With CORS on, the gateway alone says which origins may read it (README "CORS").
      expect(answer.headers['access-control-allow-origin']).toBe(origin);
      expect(answer.headers.connection).toBe('close');
      // A bridge's own answer: its status, no reason.
      const line = await accessLine(cors, answer.headers['x-request-id']);
      expect(line).toMatchObject({ status: 403, endpoint: ORDERS, bridge: 'eqt' });
      expect(line.reason).toBeUndefined();
    } finally {
      await cors.stop();
      await refusing.close();
    }
  });
});

describe("regression: a bridge's refusal whose reason phrase holds a control character passed it to the client", () => {
  it('reaches the client with Node\'s phrase for its status, as on the HTTP path (docs/operations.md "Bridges")', async () => {
    const refusing = await startRefusingBridge('HTTP/1.1 403 For\x01bidden\r\nContent-Length: 2\r\n\r\nno');
    const behind = await startTestGateway({ limits: SMALL_LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: refusing.url } });
    try {
      const answer = await refused(wsUrl(behind, '/ws/orders'), { 'X-API-Key': newKey('phrase') });
      expect(answer.status).toBe(403);
      expect(answer.statusText).toBe('Forbidden');
      expect(answer.body).toBe('no');
    } finally {
      await behind.stop();
      await refusing.close();
    }
  });
});

describe('regression: a bridge answering 101 without switching protocols had it passed to the client', () => {
  it('gets the client a 502, and is logged as a bridge error (README "WebSockets": 502 when the bridge cannot be reached)', async () => {
    const refusing = await startRefusingBridge('HTTP/1.1 101 Switching Protocols\r\nContent-Length: 0\r\n\r\n');
    const behind = await startTestGateway({ limits: SMALL_LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: refusing.url } });
    try {
      const answer = await refused(wsUrl(behind, '/ws/orders'), { 'X-API-Key': newKey('no-switch') });
      expect(answer.status).toBe(502);
      expect(JSON.parse(answer.body)).toEqual({ error: 'Bad Gateway', message: 'Bridge unreachable' });
      await waitFor('the bridge error logged', () => behind.logs.some((l) => l.msg === 'bridge error'), 2000);
      expect(behind.logs.find((l) => l.msg === 'bridge error')).toMatchObject({ bridge: 'eqt', phase: 'upgrade' });
    } finally {
      await behind.stop();
      await refusing.close();
    }
  });
});

describe('regression: a chunked bridge refusal cut short reached the client as a whole body', () => {
  it('is cut for the client too (docs/operations.md "Bridges": a cut answer, never a wrong one)', async () => {
    // The first chunk, then the bridge closes without the last chunk.
    const cutShort = CHUNKED_REFUSAL.slice(0, CHUNKED_REFUSAL.indexOf(REFUSAL_BODY.slice(20)));
    const refusing = await startRefusingBridge(cutShort, true);
    const behind = await startTestGateway({ limits: SMALL_LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: refusing.url } });
    try {
      const outcome = await withTimeout(
        new Promise<string>((resolve) => {
          const ws = new WebSocket(wsUrl(behind, '/ws/orders'), { headers: { 'X-API-Key': newKey('cut') } });
          ws.on('error', () => {});
          ws.once('open', () => resolve('opened'));
          ws.once('unexpected-response', (_req, res) => {
            let body = '';
            res.on('data', (c: Buffer) => (body += c.toString('utf8')));
            res.once('error', () => resolve(`cut after ${JSON.stringify(body)}`));
            res.once('end', () => resolve(`whole: ${JSON.stringify(body)}`));
          });
        }),
        5000,
        'the refusal',
      );
      // Before the fix, the body was delimited by the gateway's close: "whole" at 20 of its 64 bytes.
      expect(outcome).toBe(`cut after ${JSON.stringify(REFUSAL_BODY.slice(0, 20))}`);
    } finally {
      await behind.stop();
      await refusing.close();
    }
  });
});

/**
 * An upgrade written by hand from a client that never closes its side (allowHalfOpen) and, once
 * answered, goes on sending a byte now and then: resolves with the answer and how long after it the
 * gateway let go of the connection (the client's next write is then refused, and its socket closes).
 */
function halfOpenUpgrade(
  gw: TestGateway,
  lines: readonly string[],
): Promise<{ head: string; releasedAfterMs: number }> {
  const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true });
  socket.on('error', () => {});
  let received = '';
  let answeredAt = 0;
  let ticker: NodeJS.Timeout | undefined;
  const released = new Promise<{ head: string; releasedAfterMs: number }>((resolve) => {
    socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
    socket.once('end', () => {
      answeredAt = performance.now();
      let ticks = 0;
      ticker = setInterval(() => {
        if (++ticks > 50) clearInterval(ticker);
        else if (!socket.destroyed) socket.write('x');
      }, 100);
    });
    socket.once('close', () => {
      clearInterval(ticker);
      resolve({
        head: received.slice(0, received.indexOf('\r\n\r\n')),
        releasedAfterMs: performance.now() - answeredAt,
      });
    });
  });
  socket.write(upgradeRequest('/ws/orders', lines));
  return withTimeout(released, 6000, 'the gateway to let go of a refused upgrade').finally(() => {
    clearInterval(ticker);
    socket.destroy();
  });
}

describe('a refused upgrade whose client never closes its side (docs/operations.md "Bridges": every socket is released)', () => {
  it("is released after the gateway's own refusal (401)", async () => {
    const { head, releasedAfterMs } = await halfOpenUpgrade(gw, []);
    expect(head).toMatch(/^HTTP\/1\.1 401 /);
    expect(releasedAfterMs).toBeLessThan(3500);
  });

  it('is released after a 502 for a bridge that cannot be reached', async () => {
    const down = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { ...FAST_ENV, EQT_BRIDGE_URL: `http://127.0.0.1:${await refusingPort()}` },
    });
    try {
      const { head, releasedAfterMs } = await halfOpenUpgrade(down, [`X-API-Key: ${newKey('linger')}`]);
      expect(head).toMatch(/^HTTP\/1\.1 502 /);
      expect(releasedAfterMs).toBeLessThan(3500);
    } finally {
      await down.stop();
    }
  });

  it("is released after the bridge's own refusal", async () => {
    const refusing = await startRefusingBridge(CHUNKED_REFUSAL);
    const behind = await startTestGateway({ limits: SMALL_LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: refusing.url } });
    try {
      const { head, releasedAfterMs } = await halfOpenUpgrade(behind, [`X-API-Key: ${newKey('linger')}`]);
      expect(head).toMatch(/^HTTP\/1\.1 403 /);
      expect(releasedAfterMs).toBeLessThan(3500);
    } finally {
      await behind.stop();
      await refusing.close();
    }
  });
});

describe('regression: a bridge refusal whose body stalls held both sockets for good', () => {
  it('is cut after UPSTREAM_TIMEOUT_MS without progress, the client and the bridge socket released', async () => {
    const stalling = await startRefusingBridge('HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\npartial');
    const behind = await startTestGateway({
      limits: SMALL_LIMITS,
      env: { UPSTREAM_TIMEOUT_MS: '1000', EQT_BRIDGE_URL: stalling.url },
    });
    try {
      const socket = net.connect({ port: behind.port, host: '127.0.0.1', allowHalfOpen: true });
      socket.on('error', () => {});
      let received = '';
      socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')));
      const sentAt = performance.now();
      // Half-open: the gateway's close arrives as the end of what it sends.
      const closed = new Promise<number>((resolve) => socket.once('end', () => resolve(performance.now() - sentAt)));
      socket.write(upgradeRequest('/ws/orders', [`X-API-Key: ${newKey('stall')}`]));
      const closedAfterMs = await withTimeout(closed, 6000, 'the stalled refusal to be cut');
      expect(received).toMatch(/^HTTP\/1\.1 403 /);
      expect(received.endsWith('partial')).toBe(true);
      expect(closedAfterMs).toBeLessThan(3000);
      await new Promise((r) => setTimeout(r, 100));
      expect(stalling.sockets.every((s) => s.destroyed || s.readableEnded)).toBe(true);
    } finally {
      await behind.stop();
      await stalling.close();
    }
  });
});

describe('regression: a client that reset its connection while its upgrade waited behind a pipelined answer ended the process', () => {
  // Node takes its own 'error' listener off a connection it hands over (an upgrade, CONNECT); one
  // that waits for the answer before it had none, and the client's reset was an uncaught ECONNRESET.
  const handedOver = {
    'a WebSocket upgrade': upgradeRequest('/ws/orders', [`X-API-Key: ${newKey('reset')}`]),
    CONNECT: 'CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n',
  };
  for (const [name, request] of Object.entries(handedOver)) {
    it(`(${name}): the reset is no uncaught error, and the gateway goes on serving`, async () => {
      const slow = await startBridge({ httpDelayMs: 600 });
      const behind = await startTestGateway({ limits: LIMITS, env: { ...FAST_ENV, EQT_BRIDGE_URL: slow.url } });
      const uncaught: unknown[] = [];
      const onUncaught = (err: unknown): void => void uncaught.push(err);
      process.on('uncaughtException', onUncaught);
      try {
        const key = newKey('reset');
        const socket = net.connect({ port: behind.port, host: '127.0.0.1' });
        socket.on('error', () => {});
        await new Promise((resolve) => socket.once('connect', resolve));
        socket.write(`GET /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: ${key}\r\n\r\n${request}`);
        await waitFor('the order to reach the bridge', () => slow.httpRequests.length === 1, 3000);
        // The order's answer is still on its way (the bridge takes 600 ms): the second request waits for it.
        socket.resetAndDestroy();
        await sleep(900);
        expect(uncaught).toEqual([]);
        const reply = await send(behind.url, { path: '/orders', headers: { 'X-API-Key': key }, agent: false });
        expect(reply.status).toBe(200);
      } finally {
        process.off('uncaughtException', onUncaught);
        await behind.stop();
        await slow.close();
      }
    });
  }
});
