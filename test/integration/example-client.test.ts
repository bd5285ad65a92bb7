import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GatewayClient, readUsage, retryAfterMs, type Wait } from '../../examples/client.js';
import { FakeClock } from '../helpers/clock.js';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';

/**
 * examples/client.ts against a real gateway over sockets. The gateway runs on a fake clock that
 * the client's injected sleep moves, so hours and days pass in milliseconds: alone with its
 * key, the client never sends a request that is sure to be refused, and every wait is what the
 * answer before it said.
 */

const LIMITS = `
limits:
  - { name: Order Status, route: "GET /orders/{id}", per_hour: 3, per_day: 100 }
  - { name: Symbols, route: "GET /symbols", per_hour: 2, per_day: 3 }
`;

// A day in the future: Redis expires counters by its own clock, so they must not lie in the past.
const day = new Date(Math.ceil(Date.now() / 86_400_000) * 86_400_000 + 86_400_000);
const clock = new FakeClock(`${day.toISOString().slice(0, 10)}T10:00:00Z`);
const JITTER_MS = 1000;
const RANDOM = 0.25; // so the jitter of every wait is 250 ms

let gw: TestGateway;
beforeAll(async () => {
  gw = await startTestGateway({ limits: LIMITS, clock, env: { LOG_LEVEL: 'warn' } });
});
afterAll(async () => {
  await gw.stop();
});

interface Sent {
  readonly at: number;
  readonly status: number;
  readonly rateLimit: string | null;
  readonly retryAfter: string | null;
}

function client(key: string): { client: GatewayClient; sent: Sent[]; waits: Wait[] } {
  const sent: Sent[] = [];
  const waits: Wait[] = [];
  const c = new GatewayClient({
    baseUrl: gw.url,
    apiKey: key,
    jitterMs: JITTER_MS,
    random: () => RANDOM,
    now: () => clock.now(),
    sleep: async (ms) => clock.advance(ms),
    onWait: (w) => waits.push(w),
    fetch: async (input, init) => {
      const response = await fetch(input, init);
      sent.push({
        at: clock.now(),
        status: response.status,
        rateLimit: response.headers.get('RateLimit'),
        retryAfter: response.headers.get('Retry-After'),
      });
      return response;
    },
  });
  return { client: c, sent, waits };
}

/** `t` of the window that the answer says is spent (the later one when both are). */
function resetOfSpent(rateLimit: string | null): number {
  const spent = [...(rateLimit ?? '').matchAll(/"(\w+)";r=(\d+);t=(\d+)/g)].filter((m) => m[2] === '0');
  return Math.max(...spent.map((m) => Number(m[3])));
}

describe('examples/client.ts, alone with its key', () => {
  it('waits out a spent hour and never receives a 429', async () => {
    const { client: c, sent, waits } = client(`example-hour-${Date.now()}`);
    for (let i = 0; i < 10; i++) {
      const { response, usage } = await c.call('GET', '/orders/1');
      expect(response.status).toBe(200);
      expect(usage?.windows.map((w) => w.name)).toEqual(['hour', 'day']);
      expect(usage?.limitHour).toBe(3);
      await response.text();
    }
    expect(sent.map((s) => s.status)).toEqual(Array(10).fill(200));
    // After every third call the hour is spent: one wait each, as long as that answer's `t` said.
    expect(waits).toHaveLength(3);
    const spentAnswers = sent.filter((s) => /"hour";r=0;/.test(s.rateLimit ?? ''));
    expect(spentAnswers).toHaveLength(3);
    waits.forEach((wait, i) => {
      expect(wait).toEqual({
        endpoint: 'GET /orders/1',
        reason: 'window-spent',
        ms: resetOfSpent(spentAnswers[i]?.rateLimit ?? null) * 1000 + RANDOM * JITTER_MS,
      });
    });
    expect(c.waitFor('GET /orders/1')).toBe(0);
  });

  it('waits out a spent day, the later reset when both windows are spent', async () => {
    const { client: c, sent, waits } = client(`example-day-${Date.now()}`);
    for (let i = 0; i < 5; i++) expect((await c.call('GET', '/symbols')).response.status).toBe(200);
    expect(sent.map((s) => s.status)).toEqual([200, 200, 200, 200, 200]);
    // 2 in the hour, then 1 (the day's third), then the next day: 2 waits, the second to midnight.
    expect(waits).toHaveLength(2);
    const dayWait = waits[1] as Wait;
    const dayAnswer = sent[2] as Sent;
    expect(dayAnswer.rateLimit).toMatch(/"day";r=0;t=\d+/);
    expect(dayWait.ms).toBe(resetOfSpent(dayAnswer.rateLimit) * 1000 + RANDOM * JITTER_MS);
    expect(new Date(dayAnswer.at + dayWait.ms).getUTCHours()).toBe(0); // just past midnight, UTC
  });
});

describe('examples/client.ts, when another client spent the window', () => {
  it('waits Retry-After plus jitter after a 429, then succeeds', async () => {
    const key = `example-429-${Date.now()}`;
    // Someone else with the same key uses the hour: the example client cannot know.
    for (let i = 0; i < 3; i++) await send(gw.url, { path: '/orders/9', headers: { 'X-API-Key': key } });
    const { client: c, sent, waits } = client(key);
    const { response, attempts } = await c.call('GET', '/orders/9');
    expect(response.status).toBe(200);
    expect(attempts).toBe(2);
    expect(sent.map((s) => s.status)).toEqual([429, 200]);
    expect(waits).toEqual([
      {
        endpoint: 'GET /orders/9',
        reason: 'retry-after',
        ms: Number(sent[0]?.retryAfter) * 1000 + RANDOM * JITTER_MS,
      },
    ]);
  });

  it('gives up after maxRetries and returns the 429', async () => {
    const key = `example-give-up-${Date.now()}`;
    for (let i = 0; i < 3; i++) await send(gw.url, { path: '/orders/8', headers: { 'X-API-Key': key } });
    // A sleep that lets no time pass: every retry meets the same spent window.
    const { response, attempts } = await new GatewayClient({
      baseUrl: gw.url,
      apiKey: key,
      maxRetries: 2,
      now: () => clock.now(),
      sleep: async () => {},
    }).call('GET', '/orders/8');
    expect(response.status).toBe(429);
    expect(attempts).toBe(3);
  });
});

describe('header parsing', () => {
  it('reads RateLimit, RateLimit-Policy and X-RateLimit-*', () => {
    const usage = readUsage(
      new Headers({
        'RateLimit-Policy': '"hour";q=60;w=3600, "day";q=500;w=86400',
        RateLimit: '"hour";r=48;t=1800, "day";r=360;t=30000',
        'X-RateLimit-Limit-Hour': '60',
        'X-RateLimit-Remaining-Hour': '48',
        'X-RateLimit-Limit-Day': '500',
        'X-RateLimit-Remaining-Day': '360',
      }),
    );
    expect(usage).toEqual({
      windows: [
        { name: 'hour', quota: 60, windowSeconds: 3600, remaining: 48, resetSeconds: 1800 },
        { name: 'day', quota: 500, windowSeconds: 86400, remaining: 360, resetSeconds: 30000 },
      ],
      limitHour: 60,
      remainingHour: 48,
      limitDay: 500,
      remainingDay: 360,
    });
    expect(readUsage(new Headers())).toBeUndefined();
  });

  it('reads Retry-After as seconds or as a date', () => {
    expect(retryAfterMs('120', 0)).toBe(120_000);
    expect(retryAfterMs('Thu, 01 Jan 1970 00:00:30 GMT', 10_000)).toBe(20_000);
    expect(retryAfterMs(null, 0)).toBe(1000);
  });
});
