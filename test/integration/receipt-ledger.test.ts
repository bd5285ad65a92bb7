import { afterAll, describe, expect, it } from 'vitest';
import { CONSUME_SCRIPT, pushConsumeArgs } from '../../src/limits/count-rules.js';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { ReceiptLedger } from '../../src/redis/receipt-ledger.js';
import { request } from '../helpers/store-contract.js';
import { REDIS_URL, redisClient, startRedisServer, uniquePrefix } from '../helpers/redis.js';

/**
 * The receipt ledger on a real Redis: units of calls whose answer never came are taken back
 * (README "When parts fail" → "Redis": no unit is counted twice), and only those.
 */

const client = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 1000 });
await client.connect();
const inspect = redisClient();
const prefix = uniquePrefix('ledger');
afterAll(async () => {
  inspect.disconnect();
  await client.quit();
});

const { hourStart: H, dayStart: D } = request();
let n = 0;
const newKey = (): string => `${prefix}${++n}`;
/** What the ledger is told of a call it may have to undo when the connection died before the reply. */
const connectionLost = new Error('Connection is closed.');

/** One consume call with the given receipt, as the store sends it: `keys` (repeats allowed) in windows `hourStart`, `dayStart`. */
async function count(c: RedisClient, receipt: string, keys: string[], hourStart = H): Promise<void> {
  const items = keys.map((key) => ({ key, request: request({ hourStart, hourLimit: 100, dayLimit: 100 }) }));
  const keysThenArgs: Array<string | number> = [...keys];
  pushConsumeArgs(keysThenArgs, items, receipt);
  await c.eval(CONSUME_SCRIPT, keys.length, ...keysThenArgs);
}

const counter = (key: string): Promise<Array<string | null>> => inspect.hmget(key, 'hs', 'hc', 'ds', 'dc', 'rc');

async function until(condition: () => boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
}

describe('ReceiptLedger: what it takes back', () => {
  it('takes back every unit a call in doubt added, only in the windows it counted in, and leaves other calls their units', async () => {
    const ledger = new ReceiptLedger(client);
    const [a, b] = [newKey(), newKey()];
    const doubtful = ledger.issue();
    await count(client, doubtful, [a, a, a, b, b]);
    // Another instance has since moved `a` to the next hour and counted once there.
    await count(client, 'other1', [a], H + 3600);
    const failure = ledger.failed(doubtful, { keys: [a, a, a, b, b], hourStart: H, dayStart: D }, connectionLost);
    expect(failure.kind).toBe('connection');
    expect(ledger.inDoubt).toBe(1);
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(0);
    // The new hour keeps its unit; the day gives back the call's three.
    expect(await counter(a)).toEqual([String(H + 3600), '1', String(D), '1', 'other1:1,']);
    expect(await counter(b)).toEqual([String(H), '0', String(D), '0', '']);
    ledger.close();
  });

  it('takes nothing back for a call that never ran, nor twice for one that did', async () => {
    const ledger = new ReceiptLedger(client);
    const key = newKey();
    await count(client, 'other2', [key, key]);
    const neverRan = ledger.issue();
    ledger.failed(neverRan, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    await ledger.reconcile();
    expect(await counter(key)).toEqual([String(H), '2', String(D), '2', 'other2:2,']);

    const ran = ledger.issue();
    await count(client, ran, [key]);
    ledger.failed(ran, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    await ledger.reconcile();
    // The same receipt in doubt again (as if told twice): its units are gone already.
    ledger.failed(ran, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    await ledger.reconcile();
    expect(await counter(key)).toEqual([String(H), '2', String(D), '2', 'other2:2,']);
    ledger.close();
  });

  it('holds nothing in doubt when Redis refused the command (it never ran)', async () => {
    const ledger = new ReceiptLedger(client);
    const refusal = await client.call('OAPI-NO-SUCH-COMMAND').catch((err: unknown) => err);
    const failure = ledger.failed(ledger.issue(), { keys: [newKey()], hourStart: H, dayStart: D }, refusal);
    expect(failure.kind).toBe('reply');
    expect(ledger.inDoubt).toBe(0);
    ledger.close();
  });

  it('gives up the oldest calls in doubt beyond its bound: their units stay counted', async () => {
    const ledger = new ReceiptLedger(client, { maxInDoubt: 2 });
    const keys = [newKey(), newKey(), newKey()];
    for (const key of keys) {
      const receipt = ledger.issue();
      await count(client, receipt, [key]);
      ledger.failed(receipt, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    }
    expect(ledger.inDoubt).toBe(2);
    await ledger.reconcile();
    expect((await counter(keys[0] as string)).slice(1, 4)).toEqual(['1', String(D), '1']);
    for (const key of keys.slice(1)) expect((await counter(key)).slice(1, 4)).toEqual(['0', String(D), '0']);
    ledger.close();
  });
});

describe('ReceiptLedger: when it reconciles', () => {
  it('reconciles by itself every half second while calls are in doubt, and no longer once closed', async () => {
    const [open, closed] = [new ReceiptLedger(client), new ReceiptLedger(client)];
    const [k1, k2] = [newKey(), newKey()];
    for (const [ledger, key] of [
      [open, k1],
      [closed, k2],
    ] as const) {
      const receipt = ledger.issue();
      await count(client, receipt, [key]);
      ledger.failed(receipt, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    }
    closed.close();
    await until(() => open.inDoubt === 0, 1500);
    await new Promise((r) => setTimeout(r, 600));
    expect(open.inDoubt).toBe(0);
    expect((await counter(k1))[1]).toBe('0');
    expect(closed.inDoubt).toBe(1);
    expect((await counter(k2))[1]).toBe('1');
    open.close();
  });

  it('keeps calls in doubt while Redis is away, and takes their units back as soon as the connection is ready again', async () => {
    const own = await startRedisServer();
    const c = createRedisClient({ url: own.url, commandTimeoutMs: 1000 });
    c.on('error', () => {});
    await c.connect();
    const ledger = new ReceiptLedger(c);
    const key = 'away';
    const receipt = ledger.issue();
    await count(c, receipt, [key, key]);
    c.disconnect();
    ledger.failed(receipt, { keys: [key], hourStart: H, dayStart: D }, connectionLost);
    await ledger.reconcile(); // not connected: nothing to do yet
    expect(ledger.inDoubt).toBe(1);
    const direct = redisClient(own.url);
    expect(await direct.hget(key, 'hc')).toBe('2');
    // Past the first half-second retry (a no-op while disconnected), well before the next one:
    // the connection's 'ready' starts the undo.
    await new Promise((r) => setTimeout(r, 550));
    await c.connect();
    await until(() => ledger.inDoubt === 0, 250);
    expect(ledger.inDoubt).toBe(0);
    expect(await direct.hmget(key, 'hc', 'dc', 'rc')).toEqual(['0', '0', '']);
    ledger.close();
    direct.disconnect();
    c.disconnect();
    await own.stop();
  });
});
