import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { expectTwoFields, send } from '../helpers/http.js';
import { rawConnect, sleep, usageOf, waitFor } from '../helpers/faults.js';

/**
 * Request smuggling and its relatives, tried as an attacker would over raw sockets: framing
 * headers hidden past Node's header-count cap, transfer codings the parser refuses only after
 * the request was handed over, pipelined garbage behind a valid request, headers that would let
 * a bridge reinterpret a request, and requests Node answers on its own. Nothing hidden in a body
 * may reach a bridge, a refused request uses no unit, and every client gets its own answers.
 * (docs/operations.md "Hostile clients"; SECURITY.md.)
 */

const LIMITS = `
timezone: UTC
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 3, per_day: 10 }
  - { name: Place Order, route: "POST /orders", per_hour: 100000, per_day: 1000000 }
  - { name: Symbols List, route: "GET /symbols", per_hour: 100000, per_day: 1000000 }
  - { name: "WebSocket, Market Data", route: "WS /ws/marketdata", per_hour: 100000, per_day: 1000000 }
`;

let gw: TestGateway;
let n = 0;
const newKey = (): string => `smuggle-${Date.now()}-${++n}`;

beforeAll(async () => {
  gw = await startTestGateway({
    limits: LIMITS,
    env: { LOG_LEVEL: 'warn', INVALID_KEY_MAX_ATTEMPTS: '100000', REQUEST_TIMEOUT_MS: '5000' },
  });
});
afterAll(async () => {
  await gw?.stop();
});

/** Every request either bridge received whose target contains `marker`. */
function reachedBridges(marker: string): string[] {
  return [...gw.eqt.requests, ...gw.fno.requests].map((r) => r.url).filter((url) => url.includes(marker));
}

/** Units a key used, summed over every row and both windows. */
async function unitsUsed(key: string): Promise<number> {
  return (await usageOf(gw, key)).reduce((sum, e) => sum + e.hour.used + e.day.used, 0);
}

/** `count` empty header lines: enough of them push a later header past Node's default cap of 2000. */
const filler = (count: number): string => 'a:\r\n'.repeat(count);
const chunk = (text: string): string => `${Buffer.byteLength(text).toString(16)}\r\n${text}\r\n`;
const smuggledRequest = (marker: string): string =>
  `GET /orders/${marker} HTTP/1.1\r\nHost: x\r\nX-API-Key: not-a-valid-key\r\n\r\n`;

/** Statuses of the HTTP answers in a raw byte stream, in order. */
function statuses(raw: string): number[] {
  return [...raw.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));
}

/** The bodies of the answers in a raw stream of Content-Length answers, in order. */
function bodies(raw: string): string[] {
  const out: string[] = [];
  let rest = raw;
  for (;;) {
    const end = rest.indexOf('\r\n\r\n');
    if (end === -1) return out;
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(rest.slice(0, end))?.[1] ?? 0);
    out.push(rest.slice(end + 4, end + 4 + length));
    rest = rest.slice(end + 4 + length);
  }
}

/** Writes `bytes` (then half-closes when `halfOpen`), and reads until the gateway closes (or 5 s). */
function exchange(bytes: string, options: { halfOpen?: boolean } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port: gw.port, host: '127.0.0.1', allowHalfOpen: true });
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => socket.destroy(), 5000);
    socket.on('connect', () => {
      socket.write(bytes);
      if (options.halfOpen) socket.end();
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    // The gateway closed its side: so does the client (it keeps its own side open until then).
    socket.on('end', () => socket.end());
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString('utf8'));
    });
    socket.on('error', (err) => {
      clearTimeout(timer);
      if (chunks.length) resolve(Buffer.concat(chunks).toString('utf8'));
      else reject(err);
    });
  });
}

function expectTwoFieldBody(body: string | undefined): { error: string; message: string } {
  const parsed = JSON.parse(body ?? '') as Record<string, unknown>;
  expect(Object.keys(parsed).sort()).toEqual(['error', 'message']);
  return parsed as { error: string; message: string };
}

async function stillServes(): Promise<void> {
  const reply = await send(gw.url, { path: '/symbols', headers: { 'X-API-Key': newKey() }, agent: false });
  expect(reply.status).toBe(200);
}

describe('a framing header hidden past the 2000th header line', () => {
  const cases: Array<[string, (key: string, marker: string) => string]> = [
    [
      'Transfer-Encoding on a GET',
      (key, marker) =>
        `GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${filler(1998)}Transfer-Encoding: chunked\r\n\r\n` +
        chunk(smuggledRequest(marker)) +
        '0\r\n\r\n',
    ],
    [
      'Content-Length on a POST',
      (key, marker) =>
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${filler(1998)}` +
        `Content-Length: ${Buffer.byteLength(smuggledRequest(marker))}\r\n\r\n${smuggledRequest(marker)}`,
    ],
    [
      'Transfer-Encoding on a WebSocket upgrade',
      (key, marker) =>
        `GET /ws/marketdata HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n${filler(1994)}` +
        `Transfer-Encoding: chunked\r\n\r\n${chunk(smuggledRequest(marker))}0\r\n\r\n`,
    ],
  ];
  for (const [name, build] of cases) {
    it(`(${name}) is refused with a two-field 431 before counting, and nothing of its body reaches a bridge`, async () => {
      const key = newKey();
      const marker = `SMUGGLED-${n}`;
      const raw = await exchange(build(key, marker));
      expect(statuses(raw)).toEqual([431]);
      expect(expectTwoFieldBody(bodies(raw)[0])).toEqual({
        error: 'Request Header Fields Too Large',
        message: 'Too many request headers',
      });
      await sleep(100);
      expect(reachedBridges(marker)).toEqual([]);
      expect(await unitsUsed(key)).toBe(0);
      await stillServes();
    });
  }

  it('a request with MAX_HEADER_COUNT (100) header lines passes, one with 101 gets 431', async () => {
    const under = await exchange(
      `GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nConnection: close\r\n${filler(97)}\r\n`,
    );
    expect(statuses(under)).toEqual([200]);
    const over = await exchange(`GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\n${filler(99)}\r\n`);
    expect(statuses(over)).toEqual([431]);
  });
});

describe('a bridge connection after refused requests', () => {
  it('never carries one client’s answer to another, whatever the refusals before it', async () => {
    const victimKey = newKey();
    const attackerKey = newKey();
    const attacks = [
      // Each of these is refused; none may leave bytes on a bridge connection.
      (m: string) =>
        `GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${attackerKey}\r\n${filler(1998)}Transfer-Encoding: chunked\r\n\r\n${chunk(smuggledRequest(m))}0\r\n\r\n`,
      (m: string) =>
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${attackerKey}\r\n${filler(1998)}Content-Length: ${Buffer.byteLength(smuggledRequest(m))}\r\n\r\n${smuggledRequest(m)}`,
      (m: string) =>
        `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${attackerKey}\r\nTransfer-Encoding: gzip, chunked\r\n\r\n${chunk(smuggledRequest(m))}0\r\n\r\n`,
      (m: string) =>
        `GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${attackerKey}\r\nTransfer-Encoding: identity\r\n\r\n${smuggledRequest(m)}`,
      (m: string) =>
        `GET /symbols HTTP/1.1\r\nHost: x\r\nX-API-Key: ${attackerKey}\r\n\r\n${smuggledRequest(m).replace('GET', 'G=T')}`,
    ];
    const victim = async (i: number): Promise<string> => {
      const reply = await send(gw.url, { path: `/symbols?victim=${i}`, headers: { 'X-API-Key': victimKey } });
      expect(reply.status).toBe(200);
      return reply.json<{ query: string }>().query;
    };
    const seen: string[] = [];
    for (let round = 0; round < 4; round++) {
      const markers = attacks.map((_, i) => `ATTACK-${round}-${i}`);
      const [answers] = await Promise.all([
        Promise.all(Array.from({ length: 10 }, (_, i) => victim(round * 10 + i))),
        Promise.all(attacks.map((attack, i) => exchange(attack(markers[i] as string)))),
      ]);
      seen.push(...answers);
    }
    // Each victim request got the answer to its own query, in order, and no attacker bytes reached a bridge.
    expect(seen).toEqual(Array.from({ length: 40 }, (_, i) => `?victim=${i}`));
    expect(reachedBridges('ATTACK-')).toEqual([]);
  });
});

describe('pipelined requests', () => {
  const placeOrder = (key: string, marker: string): string =>
    `POST /orders?${marker} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}`;
  const followers: Array<[string, string, number]> = [
    ['a broken request line', 'BROKEN REQUEST LINE\r\n\r\n', 400],
    ['oversized headers', `GET /symbols HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(20_000)}\r\n\r\n`, 431],
  ];
  for (const [name, follower, status] of followers) {
    for (const halfOpen of [false, true]) {
      it(`a valid request followed by ${name} gets its own answer first, then the ${status}${halfOpen ? ' (half-open client)' : ''}`, async () => {
        const key = newKey();
        const marker = `PIPELINED-${n}`;
        const raw = await exchange(placeOrder(key, marker) + follower, { halfOpen });
        expect(statuses(raw)).toEqual([200, status]);
        const [order, refusal] = bodies(raw);
        expect(JSON.parse(order ?? '')).toMatchObject({ path: '/orders', query: `?${marker}` });
        expectTwoFieldBody(refusal);
        expect(reachedBridges(marker)).toHaveLength(1);
      });
    }
  }

  it('several valid requests before the malformed one all get their answers, in order', async () => {
    const key = newKey();
    const raw = await exchange(
      [1, 2, 3].map((i) => `GET /symbols?p=${i} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n\r\n`).join('') +
        'BROKEN REQUEST LINE\r\n\r\n',
    );
    expect(statuses(raw)).toEqual([200, 200, 200, 400]);
    expect(
      bodies(raw)
        .slice(0, 3)
        .map((b) => (JSON.parse(b) as { query: string }).query),
    ).toEqual(['?p=1', '?p=2', '?p=3']);
  });

  it('a half-open client that sends one request and closes its side still gets the answer', async () => {
    const raw = await exchange(`GET /symbols?half HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\n\r\n`, {
      halfOpen: true,
    });
    expect(statuses(raw)).toEqual([200]);
  });
});

describe('requests pipelined around a refusal (regressions from the review of 2026-11-23)', () => {
  const order = (key: string, marker: string, extra = ''): string =>
    `POST /orders?${marker} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${extra}Content-Length: 2\r\n\r\n{}`;
  const closingRefusals: Array<[string, (key: string) => string, number, number]> = [
    // [name, the refused request, its status, units the refused request itself uses]
    ['a request without Host', (key) => `GET /orders/1 HTTP/1.1\r\nX-API-Key: ${key}\r\n\r\n`, 400, 0],
    [
      'an Expect other than 100-continue',
      (key) => `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nExpect: teapot\r\n\r\n`,
      417,
      0,
    ],
    [
      'more than MAX_HEADER_COUNT header lines',
      (key) => `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${filler(120)}\r\n`,
      431,
      0,
    ],
    // Over MAX_BODY_BYTES by its Content-Length: counted, then refused (README "Headers and answers").
    [
      'a body announced over MAX_BODY_BYTES',
      (key) => `POST /orders HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nContent-Length: 99999999\r\n\r\n`,
      413,
      2,
    ],
  ];
  for (const [name, refused, status, units] of closingRefusals) {
    it(`a request behind ${name} (${status}, Connection: close) is never counted or forwarded`, async () => {
      const key = newKey();
      const first = `FIRST-${n}`;
      const third = `THIRD-${n}`;
      const raw = await exchange(order(key, first) + refused(key) + order(key, third));
      expect(statuses(raw)).toEqual([200, status]);
      expect(JSON.parse(bodies(raw)[0] ?? '')).toMatchObject({ query: `?${first}` });
      await sleep(100);
      expect(reachedBridges(first)).toHaveLength(1);
      expect(reachedBridges(third)).toEqual([]);
      // The first order's hour and day units, and the refused request's own when it is counted.
      expect(await unitsUsed(key)).toBe(2 + units);
    });
  }

  const refusedAtOnce: Array<[string, (key: string, marker: string) => string, number]> = [
    [
      'a WebSocket upgrade that announces a body',
      (key, m) =>
        `GET /ws/marketdata?${m} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 3\r\n\r\nabc`,
      400,
    ],
    [
      'an upgrade to h2c',
      (key, m) =>
        `GET /symbols?${m} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n`,
      400,
    ],
    ['CONNECT', () => `CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n`, 501],
    [
      'a chunked body with a malformed chunk size',
      (key, m) =>
        `POST /orders?${m} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`,
      400,
    ],
    [
      'Transfer-Encoding: chunked and a tab',
      (key, m) =>
        `POST /orders?${m} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nTransfer-Encoding: chunked\t\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
      400,
    ],
  ];
  for (const [name, follower, status] of refusedAtOnce) {
    it(`a valid request keeps its answer when ${name} follows it (${status} after the 200), and the follower uses nothing`, async () => {
      const key = newKey();
      const first = `FIRST-${n}`;
      const second = `SECOND-${n}`;
      const raw = await exchange(order(key, first) + follower(key, second));
      expect(statuses(raw)).toEqual([200, status]);
      expect(JSON.parse(bodies(raw)[0] ?? '')).toMatchObject({ query: `?${first}` });
      expectTwoFieldBody(bodies(raw)[1]);
      await sleep(100);
      expect(reachedBridges(first)).toHaveLength(1);
      expect(reachedBridges(second)).toEqual([]);
      expect(await unitsUsed(key)).toBe(2);
    });
  }

  it('a connection flooded with more pipelined requests than can wait is closed, and none of them is forwarded', async () => {
    const key = newKey();
    const marker = `FLOOD-${n}`;
    const request = (i: number): string =>
      `GET /symbols?${marker}-${i} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n\r\n`;
    const raw = await exchange(Array.from({ length: 80 }, (_, i) => request(i)).join(''));
    expect(statuses(raw)).toEqual([]);
    await sleep(100);
    expect(reachedBridges(marker)).toEqual([]);
    await stillServes();
  });

  it('a valid WebSocket upgrade pipelined behind an order opens only after the order’s answer', async () => {
    const key = newKey();
    const socket = await rawConnect(gw.port);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.write(
      order(key, `BEFORE-UPGRADE-${n}`) +
        `GET /ws/marketdata HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
    );
    await waitFor('the 101', () => Buffer.concat(chunks).toString('latin1').includes('HTTP/1.1 101 '), 3000);
    socket.destroy();
    expect(statuses(Buffer.concat(chunks).toString('latin1'))).toEqual([200, 101]);
  });
});

describe('framing the parser refuses after the head, on the first request of a connection', () => {
  const framings: Array<[string, string]> = [
    ['Transfer-Encoding: chunked and a tab', 'Transfer-Encoding: chunked\t\r\n\r\n2\r\n{}\r\n0\r\n\r\n'],
    ['a malformed first chunk size', 'Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n'],
  ];
  for (const [name, rest] of framings) {
    it(`(${name}) gets a two-field 400, uses no unit and reaches no bridge`, async () => {
      const key = newKey();
      const marker = `FRAMING-${n}`;
      const raw = await exchange(`GET /orders/${marker} HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n${rest}`);
      expect(statuses(raw)).toEqual([400]);
      expectTwoFieldBody(bodies(raw)[0]);
      await sleep(100);
      expect(await unitsUsed(key)).toBe(0);
      expect(reachedBridges(marker)).toEqual([]);
    });
  }
});

describe('answers written before the app (regressions from the review of 2026-11-23; their access lines: access-reasons.test.ts)', () => {
  const heads: Array<[string, string, string]> = [
    ['a Host that is no host name', 'GET /symbols HTTP/1.1\r\nHost: a b\r\n', 'Malformed request'],
    [
      'an upgrade to h2c',
      'GET /symbols HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n',
      'Only WebSocket upgrades are accepted',
    ],
    [
      'an upgrade by POST',
      'POST /ws/marketdata HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n',
      'Only WebSocket upgrades are accepted',
    ],
  ];
  for (const [name, head, message] of heads) {
    it(`${name} gets a two-field 400 with its X-Request-Id`, async () => {
      const raw = await exchange(`${head}X-API-Key: ${newKey()}\r\n\r\n`);
      expect(statuses(raw)).toEqual([400]);
      expect(expectTwoFieldBody(bodies(raw)[0]).message).toBe(message);
      expect(raw).toMatch(/\r\nX-Request-Id: [0-9a-f-]{36}\r\n/i);
    });
  }

  it('HEAD gets its answer without node-server writing the head twice, and the connection stays usable (regression: a stack trace per HEAD)', async () => {
    const errors = vi.spyOn(console, 'error').mockImplementation(() => undefined);
    try {
      const key = newKey();
      const raw = await exchange(
        `HEAD /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\n\r\n` +
          `GET /symbols?after-head HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nConnection: close\r\n\r\n`,
      );
      expect(statuses(raw)).toEqual([405, 200]);
      expect(errors).not.toHaveBeenCalled();
    } finally {
      errors.mockRestore();
    }
  });
});

describe('transfer codings the gateway does not forward', () => {
  const codings: Array<[string, number]> = [
    ['identity', 400],
    ['gzip', 400],
    ['chunked, identity', 400],
    ['gzip, chunked', 501],
  ];
  for (const [coding, status] of codings) {
    it(`Transfer-Encoding: ${coding} is refused with a two-field ${status} and uses no unit`, async () => {
      const key = newKey();
      const raw = await exchange(
        `GET /orders/1 HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nTransfer-Encoding: ${coding}\r\n\r\n0\r\n\r\n`,
      );
      expect(statuses(raw)).toEqual([status]);
      expectTwoFieldBody(bodies(raw)[0]);
      expect(await unitsUsed(key)).toBe(0);
      // The row allows 3 an hour: all 3 are still there.
      for (let i = 0; i < 3; i++) {
        const reply = await send(gw.url, { path: '/orders/1', headers: { 'X-API-Key': key }, agent: false });
        expect(reply.status).toBe(200);
      }
    });
  }

  it('a WebSocket upgrade that announces a body is refused with 400 and uses no unit', async () => {
    const key = newKey();
    const raw = await exchange(
      `GET /ws/marketdata HTTP/1.1\r\nHost: x\r\nX-API-Key: ${key}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 5\r\n\r\nhello`,
    );
    expect(statuses(raw)).toEqual([400]);
    expectTwoFieldBody(bodies(raw)[0]);
    expect(await unitsUsed(key)).toBe(0);
  });
});

describe('headers that would let a bridge reinterpret a counted request', () => {
  it('are removed before forwarding', async () => {
    const overrides = [
      'X-HTTP-Method-Override',
      'X-HTTP-Method',
      'X-Method-Override',
      'X-Original-URL',
      'X-Rewrite-URL',
    ];
    const headers: Record<string, string> = { 'X-API-Key': newKey(), 'X-Kept': 'yes' };
    for (const name of overrides) headers[name] = name.endsWith('URL') ? '/admin/secret' : 'DELETE';
    const reply = await send(gw.url, { path: '/symbols?overrides', headers, agent: false });
    expect(reply.status).toBe(200);
    const received = gw.eqt.requests.findLast((r) => r.url === '/symbols?overrides');
    expect(received?.headers['x-kept']).toBe('yes');
    for (const name of overrides) expect(received?.headers[name.toLowerCase()], name).toBeUndefined();
  });

  it('include the _method query parameter, in every spelling, the other parameters byte for byte (regression: ?_method=DELETE reached the bridge)', async () => {
    const reply = await send(gw.url, {
      path: '/symbols?a=1&_method=DELETE&b=%2F&%5Fmethod=PUT&_method&c',
      headers: { 'X-API-Key': newKey() },
      agent: false,
    });
    expect(reply.status).toBe(200);
    expect(gw.eqt.requests.at(-1)?.url).toBe('/symbols?a=1&b=%2F&c');
  });
});

describe('requests Node would answer on its own', () => {
  it('an HTTP/1.1 request without Host gets a two-field 400', async () => {
    const raw = await exchange(`GET /symbols HTTP/1.1\r\nX-API-Key: ${newKey()}\r\n\r\n`);
    expect(statuses(raw)).toEqual([400]);
    expect(expectTwoFieldBody(bodies(raw)[0]).error).toBe('Bad Request');
  });

  it('an Expect other than 100-continue gets a two-field 417, not forwarded', async () => {
    const raw = await exchange(
      `GET /symbols?expect HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nExpect: teapot\r\nConnection: close\r\n\r\n`,
    );
    expect(statuses(raw)).toEqual([417]);
    expect(expectTwoFieldBody(bodies(raw)[0]).error).toBe('Expectation Failed');
    expect(reachedBridges('?expect')).toEqual([]);
  });

  it('CONNECT gets a two-field answer and nothing is forwarded', async () => {
    const raw = await exchange(`CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n`);
    expect(statuses(raw)).toEqual([501]);
    expect(expectTwoFieldBody(bodies(raw)[0]).error).toBe('Not Implemented');
  });

  it('Expect: 100-continue still works', async () => {
    const socket = await rawConnect(gw.port);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.write(
      `POST /orders?continue HTTP/1.1\r\nHost: x\r\nX-API-Key: ${newKey()}\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n`,
    );
    await waitFor('100 Continue', () => Buffer.concat(chunks).toString().startsWith('HTTP/1.1 100 '), 3000);
    socket.write('{}');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(statuses(Buffer.concat(chunks).toString())).toEqual([100, 200]);
  });
});

describe('a refusal over a real socket', () => {
  it('is a two-field body, and leaves the gateway serving', async () => {
    const reply = await send(gw.url, { path: '/nowhere', headers: { 'X-API-Key': newKey() }, agent: false });
    expect(reply.status).toBe(404);
    expectTwoFields(reply);
    await stillServes();
  });
});
