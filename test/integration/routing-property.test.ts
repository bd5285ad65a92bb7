import http from 'node:http';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';
import { usageOf } from '../helpers/faults.js';

/**
 * Property: nothing reaches a bridge without having been counted against the row it matched
 * (README "A request, step by step"). Generated request paths mix table literals, ids, dot segments, empty
 * segments, percent-encodings (of unreserved characters, dots, slashes, backslashes), raw
 * backslashes and random strings, with or without a query. Each one is checked against a
 * reference model written from the README's rules (independent of src/), and in the end the
 * bridge's requests and the per-row usage must agree exactly.
 */

const ROWS = [
  { route: 'GET /orders', method: 'GET', pattern: ['orders'] },
  { route: 'GET /orders/{id}', method: 'GET', pattern: ['orders', '*'] },
  { route: 'POST /orders', method: 'POST', pattern: ['orders'] },
  { route: 'GET /marketdata/{symbol}', method: 'GET', pattern: ['marketdata', '*'] },
  { route: 'GET /marketdata/{symbol}/quotes', method: 'GET', pattern: ['marketdata', '*', 'quotes'] },
  { route: 'GET /orders:batch', method: 'GET', pattern: ['orders:batch'] },
] as const;

const LIMITS = `
timezone: UTC
limits:
${ROWS.map((r, i) => `  - { name: Row ${i}, route: "${r.route}", per_hour: 1000000, per_day: 10000000 }`).join('\n')}
`;

// ---- reference model, from the README: "A request, step by step", step 2 ----

const UNRESERVED = /^[A-Za-z0-9\-._~]$/;
const PCHAR = /^[A-Za-z0-9\-._~!$&'()*+,;=:@]$/;

/** The normalised path, or undefined when the path must be refused with 400. */
function referenceNormalise(rawPath: string): string | undefined {
  const out: string[] = [];
  for (const raw of rawPath.split('/')) {
    let segment = '';
    for (let i = 0; i < raw.length; i++) {
      const ch = raw[i] as string;
      if (ch === '%') {
        const hex = raw.slice(i + 1, i + 3);
        if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined; // malformed escape
        const byte = parseInt(hex, 16);
        if (byte === 0x2f || byte === 0x5c) return undefined; // encoded slash or backslash
        if (byte < 0x20 || byte === 0x7f) return undefined; // encoded control character
        const decoded = String.fromCharCode(byte);
        // Unreserved characters and the rest of pchar but `;` are decoded; other escapes kept, upper-cased.
        segment +=
          UNRESERVED.test(decoded) || (PCHAR.test(decoded) && decoded !== ';') ? decoded : '%' + hex.toUpperCase();
        i += 2;
      } else if (ch === ';')
        return undefined; // path parameters to some servers
      else if (PCHAR.test(ch)) segment += ch;
      else return undefined; // raw backslash and anything else outside pchar
    }
    if (segment === '' || segment === '.') continue;
    if (segment === '..') out.pop();
    else out.push(segment);
  }
  return '/' + out.join('/');
}

function rowsMatching(path: string, method?: string): Array<(typeof ROWS)[number]> {
  const segments = path === '/' ? [] : path.slice(1).split('/');
  return ROWS.filter(
    (row) =>
      (method === undefined || row.method === method) &&
      row.pattern.length === segments.length &&
      row.pattern.every((p, i) => p === '*' || p === segments[i]),
  );
}

// ---- generators ----

const segment = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom('orders', 'marketdata', 'quotes') },
  { weight: 4, arbitrary: fc.constantFrom('1', '42', 'VNM', 'abc-DEF_1.2~x') },
  { weight: 4, arbitrary: fc.constantFrom('.', '..', '', '%2e', '%2E', '.%2e', '%2e%2E', '%2E.', '...') },
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      '%6Frders',
      '%6F%72%64%65%72%73',
      'o%72ders',
      'market%64ata',
      'MARKETDATA',
      'quote%73',
      '%71uotes',
      '%41',
      '%7e',
      '%7E%2D',
    ),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom('%2F', '%2f', 'orders%2F1', '%5C', '%5c', '..%2F', '%2e%2e%5c', '\\', 'a\\b'),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom(
      '%20',
      '%zz',
      '%4',
      '%',
      '%00',
      '%7F',
      "a!$&'()*+,;=:@b",
      "a!$&'()*+,=:@b",
      '%C3%A9',
      'a%3Ab',
      '%40%2B%2c%3D',
      '%3F',
      '%25',
    ),
  },
  { weight: 1, arbitrary: fc.constantFrom(';', ';x=1', '1;jsessionid=2', '%3B', 'a%3bb') },
  { weight: 3, arbitrary: fc.stringMatching(/^[A-Za-z0-9\-._~]{1,8}$/) },
);

/** Paths shaped like a row, spelled in many ways, with detours: most of these should reach a bridge. */
const SPELLINGS: Record<string, readonly string[]> = {
  orders: ['orders', 'orders', '%6Frders', 'o%72ders', '%6F%72%64%65%72%73', 'ord%65rs'],
  marketdata: ['marketdata', 'marketdata', 'market%64ata', '%6Darketdata'],
  quotes: ['quotes', 'quote%73', '%71uotes'],
  'orders:batch': ['orders:batch', 'orders%3Abatch', 'orders%3abatch', '%6Frders%3Abatch'],
};
const detour = fc.constantFrom(
  '',
  '',
  '',
  '',
  '',
  './',
  '/',
  '%2e/',
  'junk/../',
  'a/b/../../',
  'x/%2e%2e/',
  'x%2F/../',
  '\\/',
  '%5C/',
);
const rowShaped = fc
  .constantFrom(...ROWS)
  .chain((row) =>
    fc.tuple(
      ...row.pattern.map((p) => fc.tuple(detour, p === '*' ? segment : fc.constantFrom(...(SPELLINGS[p] as string[])))),
    ),
  )
  .map((parts) => parts.map(([d, s]) => d + s));

const request = fc.record({
  method: fc.constantFrom('GET', 'GET', 'GET', 'POST'),
  leading: fc.constantFrom('/', '/', '//', '/./', '/../'),
  segments: fc.oneof(
    { weight: 1, arbitrary: fc.array(segment, { minLength: 0, maxLength: 5 }) },
    { weight: 2, arbitrary: rowShaped },
  ),
  trailing: fc.constantFrom('', '', '/', '//', '/.', '/..'),
  query: fc.constantFrom('', '', '?a=1', '?q=%2F..%2e&x=y', '?', '?p=/orders/../x'),
});

describe('path normalisation and routing, as a property over real sockets', () => {
  let gw: TestGateway;
  const key = `prop-${Date.now()}`;
  const tag = `prop${Date.now()}`;
  const agent = new http.Agent({ keepAlive: true, maxSockets: 4 });
  let sent = 0;

  beforeAll(async () => {
    gw = await startTestGateway({ limits: LIMITS, env: { LOG_LEVEL: 'warn', INVALID_KEY_MAX_ATTEMPTS: '100000' } });
  });
  afterAll(async () => {
    agent.destroy();
    await gw?.stop();
  });

  it('forwards exactly the normalised path of a matched row, refuses the rest, and counts every forwarded request on its row', async () => {
    await fc.assert(
      fc.asyncProperty(request, async (r) => {
        const rawPath = r.leading + r.segments.join('/') + r.trailing;
        const id = `${tag}-${++sent}`;
        const before = gw.eqt.requests.length;
        const reply = await send(gw.url, {
          method: r.method,
          path: rawPath + r.query,
          headers: { 'X-API-Key': key, 'X-Request-Id': id },
          agent,
        });
        const received = gw.eqt.requests.slice(before).filter((q) => q.headers['x-request-id'] === id);

        const normalised = referenceNormalise(rawPath);
        if (normalised === undefined) {
          expect(reply.status, rawPath).toBe(400);
          expect(received, rawPath).toHaveLength(0);
          return;
        }
        const rows = rowsMatching(normalised, r.method);
        expect(rows.length, normalised).toBeLessThanOrEqual(1); // the table is unambiguous
        if (rows.length === 0) {
          expect(reply.status, `${r.method} ${rawPath} -> ${normalised}`).toBe(
            rowsMatching(normalised).length > 0 ? 405 : 404,
          );
          expect(received, rawPath).toHaveLength(0);
          return;
        }
        expect(reply.status, `${r.method} ${rawPath} -> ${normalised}`).toBe(200);
        expect(received, rawPath).toHaveLength(1);
        expect(received[0]?.method).toBe(r.method);
        expect(received[0]?.url, rawPath).toBe(normalised + r.query);
      }),
      { numRuns: 150, endOnFailure: true },
    );

    // Every request the bridge received has a normalised path of exactly one row...
    const forwarded = gw.eqt.requests.filter((q) => String(q.headers['x-request-id'] ?? '').startsWith(`${tag}-`));
    const perRow = new Map<string, number>();
    for (const q of forwarded) {
      const path = q.url.split('?')[0] as string;
      expect(referenceNormalise(path), q.url).toBe(path);
      const rows = rowsMatching(path, q.method);
      expect(rows, q.url).toHaveLength(1);
      const route = (rows[0] as (typeof ROWS)[number]).route;
      perRow.set(route, (perRow.get(route) ?? 0) + 1);
    }
    expect(forwarded.length).toBeGreaterThan(20); // the generator does reach the rows
    // ...and each row's usage is exactly the number of bridge requests for that row.
    const usage = await usageOf(gw, key);
    for (const row of ROWS) {
      const entry = usage.find((e) => e.route === row.route);
      expect(entry?.hour.used, row.route).toBe(perRow.get(row.route) ?? 0);
      expect(entry?.day.used, row.route).toBe(perRow.get(row.route) ?? 0);
    }
  });
});

describe('regression: an encoded ":" passed a spent literal row as the {id} of another', () => {
  let gw: TestGateway;

  beforeAll(async () => {
    gw = await startTestGateway({
      limits: `
timezone: UTC
limits:
  - { name: Literal, route: "GET /x/a:b", per_hour: 1, per_day: 10 }
  - { name: Any, route: "GET /x/{id}", per_hour: 100, per_day: 1000 }
`,
      env: { LOG_LEVEL: 'warn' },
    });
  });
  afterAll(async () => {
    await gw?.stop();
  });

  it('reads /x/a%3Ab as /x/a:b, as the bridges do: counted on the literal row, refused once it is spent', async () => {
    const key = `colon-${Date.now()}`;
    const get = (path: string) => send(gw.url, { path, headers: { 'X-API-Key': key }, agent: false });
    expect((await get('/x/a:b')).status).toBe(200);
    const encoded = await get('/x/a%3Ab');
    expect(encoded.status).toBe(429);
    expect(encoded.headers['x-ratelimit-limit-hour']).toBe('1');
    expect((await get('/x/a%3ab')).status).toBe(429);
    expect(gw.eqt.requests.map((q) => q.url)).toEqual(['/x/a:b']);
    const usage = await usageOf(gw, key);
    expect(usage.find((e) => e.route === 'GET /x/{id}')?.hour.used).toBe(0);
  });
});
