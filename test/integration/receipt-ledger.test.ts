import calculateSlot from 'cluster-key-slot';
import { afterAll, describe, expect, it } from 'vitest';
import { CONSUME_SCRIPT, pushConsumeArgs, RECEIPTS_KEPT, type Receipt } from '../../src/limits/count-rules.js';
import { createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { DownMasters } from '../../src/redis/down-masters.js';
import { ReceiptLedger } from '../../src/redis/receipt-ledger.js';
import { request } from '../helpers/store-contract.js';
import {
  connectedClient,
  REDIS_URL,
  redisClient,
  startRedisServer,
  uniquePrefix,
  type RedisProcess,
} from '../helpers/redis.js';

/**
 * The receipt ledger on a real Redis: units of calls whose answer never came are taken back
 * (docs/operations.md "When parts fail" → "Redis": no unit is counted twice), and only those.
 */

const client = createRedisClient({ url: REDIS_URL, commandTimeoutMs: 1000 });
await client.connect();
const inspect = redisClient();
const prefix = uniquePrefix('ledger');
/** Redis servers of single tests, stopped after the file too, should a test fail before it stops its own. */
const servers: RedisProcess[] = [];
const ownRedis = async (): Promise<RedisProcess> => {
  const own = await startRedisServer();
  servers.push(own);
  return own;
};
afterAll(async () => {
  inspect.disconnect();
  await client.quit();
  await Promise.all(servers.map((own) => own.stop()));
});

const { hourStart: H, dayStart: D } = request();
let n = 0;
const newKey = (): string => `${prefix}${++n}`;
/** What the ledger is told of a call it may have to undo when the connection died before the reply. */
const connectionLost = new Error('Connection is closed.');

/** A receipt as the script writes it: the call's units and the windows they went in. */
const entry = (seq: number, units: number, hourStart = H, dayStart = D): string =>
  `${seq}:${units}:${hourStart}:${dayStart},`;

/** A receipt of another instance, whose field no ledger here touches. */
const other = (seq: number): Receipt => ({ field: 'rc:other', seq, oldestUnsettled: seq });

/** One consume call with the given receipt, as the store sends it: `keys` (repeats allowed) in windows `hourStart`, `dayStart`. */
async function count(
  c: RedisClient,
  receipt: Receipt,
  keys: string[],
  hourStart = H,
  limit = 100,
  dayStart = D,
): Promise<void> {
  const items = keys.map((key) => ({
    key,
    request: request({ hourStart, dayStart, hourLimit: limit, dayLimit: limit }),
  }));
  const keysThenArgs: Array<string | number> = [...keys];
  pushConsumeArgs(keysThenArgs, items, receipt);
  await c.eval(CONSUME_SCRIPT, keys.length, ...keysThenArgs);
}

/** A counter's windows, counts, and the receipts in `field` (a ledger's own, from its receipts). */
const counter = (key: string, field = 'rc:other'): Promise<Array<string | null>> =>
  inspect.hmget(key, 'hs', 'hc', 'ds', 'dc', field);

/**
 * A call of one counter that counted, then fell in doubt on its Cluster master's connection: the
 * master (the only one of a slot map of the key's slot) is marked as away. `now`: DownMasters' clock.
 */
async function inDoubtOnMasterAway(
  now?: () => number,
): Promise<{ key: string; downMasters: DownMasters; ledger: ReceiptLedger; doubtful: Receipt }> {
  const key = newKey();
  const slots: string[][] = [];
  slots[calculateSlot(key)] = ['10.0.0.1:6379'];
  const downMasters = new DownMasters({ slots, status: 'ready' }, now ? { now } : {});
  const ledger = new ReceiptLedger(client, { downMasters });
  const doubtful = ledger.issue(key);
  await count(client, doubtful, [key]);
  downMasters.failed(key);
  ledger.failed(doubtful, { keys: [key] }, connectionLost);
  return { key, downMasters, ledger, doubtful };
}

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
    await count(client, other(1), [a], H + 3600);
    const failure = ledger.failed(doubtful, { keys: [a, a, a, b, b] }, connectionLost);
    expect(failure.kind).toBe('connection');
    expect(ledger.inDoubt).toBe(1);
    expect(ledger.unsettled).toBe(1);
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(0);
    expect(ledger.unsettled).toBe(0);
    // The new hour keeps its unit; the day gives back the call's three.
    expect(await counter(a)).toEqual([String(H + 3600), '1', String(D), '1', entry(1, 1, H + 3600)]);
    // Its receipts stay, with no units: the call counts nothing should it run again (a Cluster's resend).
    expect(await counter(a, doubtful.field)).toEqual([String(H + 3600), '1', String(D), '1', entry(doubtful.seq, 0)]);
    expect(await counter(b, doubtful.field)).toEqual([String(H), '0', String(D), '0', entry(doubtful.seq, 0)]);
    ledger.close();
  });

  it('leaves a call it took back nothing to count should the call run after all (on a Cluster, ioredis sends a command again by itself after its connection closed)', async () => {
    const ledger = new ReceiptLedger(client);
    const key = newKey();
    const doubtful = ledger.issue();
    await count(client, doubtful, [key, key]);
    ledger.failed(doubtful, { keys: [key] }, connectionLost);
    await ledger.reconcile();
    expect((await counter(key, doubtful.field)).slice(0, 4)).toEqual([String(H), '0', String(D), '0']);
    await count(client, doubtful, [key, key]);
    expect(await counter(key, doubtful.field)).toEqual([String(H), '0', String(D), '0', entry(doubtful.seq, 0)]);
    ledger.close();
  });

  it('takes back the units a call counted in a later window than its own, where another instance had moved the counter (its clock ahead)', async () => {
    const ledger = new ReceiptLedger(client);
    const key = newKey();
    await count(client, other(1), [key], H + 3600, 100, D + 86_400);
    const doubtful = ledger.issue();
    await count(client, doubtful, [key]);
    expect((await counter(key)).slice(0, 4)).toEqual([String(H + 3600), '2', String(D + 86_400), '2']);
    ledger.failed(doubtful, { keys: [key] }, connectionLost);
    await ledger.reconcile();
    expect((await counter(key, doubtful.field)).slice(0, 5)).toEqual([
      String(H + 3600),
      '1',
      String(D + 86_400),
      '1',
      entry(doubtful.seq, 0, H + 3600, D + 86_400),
    ]);
    ledger.close();
  });

  it('takes nothing back for a call that never ran, nor twice for one that did', async () => {
    const ledger = new ReceiptLedger(client);
    const key = newKey();
    await count(client, other(2), [key, key]);
    const neverRan = ledger.issue();
    ledger.failed(neverRan, { keys: [key] }, connectionLost);
    await ledger.reconcile();
    expect(await counter(key)).toEqual([String(H), '2', String(D), '2', entry(2, 2)]);

    const ran = ledger.issue();
    await count(client, ran, [key]);
    ledger.failed(ran, { keys: [key] }, connectionLost);
    await ledger.reconcile();
    // The same receipt in doubt again (as if told twice): its units are gone already.
    ledger.failed(ran, { keys: [key] }, connectionLost);
    await ledger.reconcile();
    expect(await counter(key)).toEqual([String(H), '2', String(D), '2', entry(2, 2)]);
    expect(ledger.unsettled).toBe(0);
    ledger.close();
  });

  it('holds nothing in doubt when Redis refused the command (it never ran)', async () => {
    const ledger = new ReceiptLedger(client);
    const refusal = await client.call('OAPI-NO-SUCH-COMMAND').catch((err: unknown) => err);
    const failure = ledger.failed(ledger.issue(), { keys: [newKey()] }, refusal);
    expect(failure.kind).toBe('reply');
    expect(ledger.inDoubt).toBe(0);
    expect(ledger.unsettled).toBe(0);
    ledger.close();
  });

  it.each([
    ['of its own instance', false],
    ['of another instance, which has a receipt field of its own', true],
  ])(
    'keeps a receipt in its counter through 20 later calls %s while its call is unsettled (regression: a counter kept the last 8 receipts of all instances, and a call in doubt behind more calls than that left its units counted twice)',
    async (_, another) => {
      const ours = new ReceiptLedger(client);
      const theirs = another ? new ReceiptLedger(client) : ours;
      const key = newKey();
      const doubtful = ours.issue();
      await count(client, doubtful, [key]);
      for (let i = 0; i < 20; i++) {
        const answered = theirs.issue();
        await count(client, answered, [key]);
        theirs.settled(answered);
      }
      ours.failed(doubtful, { keys: [key] }, connectionLost);
      await ours.reconcile();
      expect((await counter(key, doubtful.field)).slice(1, 4)).toEqual(['20', String(D), '20']);
      ours.close();
      theirs.close();
    },
  );

  it('lets the script drop the receipts of settled calls: a counter holds those of unsettled calls and the newest', async () => {
    const ledger = new ReceiptLedger(client);
    const key = newKey();
    const first = ledger.issue();
    const second = ledger.issue();
    await count(client, first, [key]);
    await count(client, second, [key]);
    ledger.settled(second); // answered before the first: the first is still unsettled
    const third = ledger.issue();
    expect(third.oldestUnsettled).toBe(first.seq);
    await count(client, third, [key]);
    expect((await counter(key, first.field))[4]).toBe(entry(third.seq, 1) + entry(second.seq, 1) + entry(first.seq, 1));
    ledger.settled(first);
    ledger.settled(third);
    expect(ledger.unsettled).toBe(0);
    const fourth = ledger.issue();
    expect(fourth.oldestUnsettled).toBe(fourth.seq);
    await count(client, fourth, [key]);
    expect((await counter(key, first.field))[4]).toBe(entry(fourth.seq, 1));
    ledger.settled(fourth);
    ledger.close();
  });

  it('settles a call in doubt whose counter has become something else, instead of holding it unsettled for good', async () => {
    const ledger = new ReceiptLedger(client);
    const [key, other] = [newKey(), newKey()];
    const doubtful = ledger.issue();
    await count(client, doubtful, [key, other]);
    await inspect.set(key, 'not a counter');
    ledger.failed(doubtful, { keys: [key, other] }, connectionLost);
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(0);
    expect(ledger.unsettled).toBe(0);
    // The counter that is one still gets its unit back.
    expect((await counter(other, doubtful.field)).slice(1, 4)).toEqual(['0', String(D), '0']);
    ledger.close();
  });

  it('names in the receipt of a call of one counter the oldest unsettled call of that counter: a call in doubt keeps receipts in its own counters only (regression: on a Cluster, one behind a master away kept 512 in every counter of the others)', () => {
    const ledger = new ReceiptLedger(client);
    const doubtful = ledger.issue('a');
    ledger.failed(doubtful, { keys: ['a'] }, connectionLost);
    const elsewhere = ledger.issue('b');
    expect(elsewhere.oldestUnsettled).toBe(elsewhere.seq);
    const again = ledger.issue('a');
    expect(again.oldestUnsettled).toBe(doubtful.seq);
    ledger.settled(elsewhere);
    ledger.settled(again);
    ledger.settled(again); // told twice: nothing changes
    expect(ledger.unsettled).toBe(1);
    // One ledger's calls are all of one counter each, or none is.
    expect(() => ledger.issue()).toThrow(/one counter and of several/);
    ledger.close();
  });

  it('lets the undo of a call in doubt on a Cluster master taken as away try the master once a second, and takes the units back when it answers, with no request for its keys (a master no request touches would hold it in doubt for good)', async () => {
    let now = 0;
    const { key, downMasters, ledger, doubtful } = await inDoubtOnMasterAway(() => now);
    now = 999;
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(1);
    expect((await counter(key, doubtful.field)).slice(1, 4)).toEqual(['1', String(D), '1']);
    now = 1000;
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(0);
    expect(downMasters.any).toBe(false);
    expect((await counter(key, doubtful.field)).slice(1, 4)).toEqual(['0', String(D), '0']);
    ledger.close();
  });

  it('sends the undos held back for a Cluster master at once when a call there is answered again, ahead of the calls after it (regression: they waited for the next reconcile round, and 512 calls on the counter pushed the receipt out)', async () => {
    const { key, downMasters, ledger, doubtful } = await inDoubtOnMasterAway();
    // The master answers a call again (the ledger is told), and at once many calls count on the counter.
    downMasters.answered(key);
    expect(downMasters.any).toBe(false);
    const later = Array.from({ length: 600 }, () => ledger.issue(key));
    await Promise.all(later.map((receipt) => count(client, receipt, [key], H, 1000)));
    for (const receipt of later) ledger.settled(receipt);
    await until(() => ledger.inDoubt === 0, 2000);
    expect(ledger.inDoubt).toBe(0);
    expect((await counter(key, doubtful.field)).slice(1, 4)).toEqual(['600', String(D), '600']);
    ledger.close();
  });

  it('counts its unsettled calls whatever order they are settled in, and names the oldest in each receipt', () => {
    const ledger = new ReceiptLedger(client);
    const receipts = Array.from({ length: 5 }, () => ledger.issue());
    expect(ledger.unsettled).toBe(5);
    ledger.settled(receipts[1] as Receipt);
    ledger.settled(receipts[3] as Receipt);
    expect(ledger.unsettled).toBe(3);
    expect(ledger.issue().oldestUnsettled).toBe(0); // the first is still out
    ledger.settled(receipts[0] as Receipt);
    expect(ledger.unsettled).toBe(3); // the third, the fifth, the sixth
    ledger.settled(receipts[0] as Receipt); // told twice: nothing changes
    expect(ledger.unsettled).toBe(3);
    ledger.settled(receipts[2] as Receipt);
    expect(ledger.issue().oldestUnsettled).toBe(4);
    ledger.close();
  });
});

describe('ReceiptLedger: when it reconciles', () => {
  it('tries an undo that failed again every half second while calls are in doubt, and no longer once closed', async () => {
    const own = await ownRedis();
    const quick = await connectedClient(own.url, 100);
    const direct = redisClient(own.url);
    const [open, closed] = [new ReceiptLedger(quick), new ReceiptLedger(quick)];
    for (const [ledger, key] of [
      [open, 'k1'],
      [closed, 'k2'],
    ] as const) {
      const receipt = ledger.issue();
      await count(quick, receipt, [key]);
    }
    // Both undos, sent at once, time out behind a pause.
    await direct.call('CLIENT', 'PAUSE', '250', 'ALL');
    open.failed(open.issue(), { keys: ['k1'] }, connectionLost);
    closed.failed(closed.issue(), { keys: ['k2'] }, connectionLost);
    closed.close();
    await until(() => open.inDoubt === 0, 1500);
    await new Promise((r) => setTimeout(r, 600));
    expect(open.inDoubt).toBe(0);
    expect(closed.inDoubt).toBe(1);
    open.close();
    direct.disconnect();
    quick.disconnect();
    await own.stop();
  });

  it('sends the undo of a call that falls in doubt at once, ahead of the calls after it, even while other undos are out (regression: it waited for the next round, and 512 answered calls pushed its receipt out)', async () => {
    const own = await ownRedis();
    const quick = await connectedClient(own.url, 100);
    const direct = redisClient(own.url);
    const ledger = new ReceiptLedger(quick);
    const key = 'hot';
    const call = async (): Promise<boolean> => {
      const receipt = ledger.issue();
      try {
        await count(quick, receipt, [key], H, 10_000);
        ledger.settled(receipt);
        return true;
      } catch (err) {
        ledger.failed(receipt, { keys: [key] }, err);
        return false;
      }
    };
    await call(); // loads the script
    await direct.call('CLIENT', 'PAUSE', '220', 'ALL');
    // The first call times out and its undo goes out; the second times out while that undo is still out.
    const first = call();
    await new Promise((r) => setTimeout(r, 50));
    const second = call();
    expect(await Promise.all([first, second])).toEqual([false, false]);
    await new Promise((r) => setTimeout(r, 150)); // the pause is over
    let answered = 1;
    for (let i = 0; i < RECEIPTS_KEPT + 100; i++) if (await call()) answered++;
    await until(() => ledger.inDoubt === 0, 2000);
    expect(ledger.inDoubt).toBe(0);
    expect(await direct.hget(key, 'hc')).toBe(String(answered));
    ledger.close();
    direct.disconnect();
    quick.disconnect();
    await own.stop();
  });

  it('sends one undo a round, not one per call in doubt, while its undos time out on a connection that stays up (regression: behind a stalled Redis every round queued another undo of every call, and the commands piled up quadratically)', async () => {
    const own = await ownRedis();
    const quick = await connectedClient(own.url, 100);
    const direct = redisClient(own.url);
    const ledger = new ReceiptLedger(quick);
    const calls = 20;
    const doubtful: Receipt[] = [];
    for (let i = 0; i < calls; i++) {
      const receipt = ledger.issue();
      await count(quick, receipt, [`stalled${i}`]);
      doubtful.push(receipt);
    }
    await direct.config('RESETSTAT');
    // Redis stops answering (a host frozen or cut off without a reset): the connection stays up.
    process.kill(own.pid, 'SIGSTOP');
    try {
      for (const [i, receipt] of doubtful.entries()) ledger.failed(receipt, { keys: [`stalled${i}`] }, connectionLost);
      await new Promise((r) => setTimeout(r, 2100)); // four rounds
    } finally {
      process.kill(own.pid, 'SIGCONT');
    }
    await until(() => ledger.inDoubt === 0, 2000);
    expect(ledger.inDoubt).toBe(0);
    for (let i = 0; i < calls; i++) expect(await direct.hget(`stalled${i}`, 'hc')).toBe('0');
    const stats = await direct.info('commandstats');
    const undos = [...stats.matchAll(/^cmdstat_(?:eval|evalsha):calls=(\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0);
    // Each call's undo at once, one a round behind the stall, and each once more when Redis answers again.
    expect(undos).toBeLessThanOrEqual(2 * calls + 6);
    ledger.close();
    direct.disconnect();
    quick.disconnect();
    await own.stop();
  });

  it('keeps a call in doubt when Redis refuses its undo for another reason than a key of another type (out of memory)', async () => {
    const own = await ownRedis();
    const c = createRedisClient({ url: own.url, commandTimeoutMs: 1000 });
    await c.connect();
    const direct = redisClient(own.url);
    const ledger = new ReceiptLedger(c);
    const receipt = ledger.issue();
    await count(c, receipt, ['full']);
    await direct.config('SET', 'maxmemory-policy', 'noeviction');
    await direct.config('SET', 'maxmemory', '1');
    ledger.failed(receipt, { keys: ['full'] }, connectionLost);
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(1);
    await direct.config('SET', 'maxmemory', '0');
    await ledger.reconcile();
    expect(ledger.inDoubt).toBe(0);
    expect(await direct.hmget('full', 'hc', 'dc')).toEqual(['0', '0']);
    ledger.close();
    direct.disconnect();
    c.disconnect();
    await own.stop();
  });

  it('keeps calls in doubt while Redis is away, and takes their units back as soon as the connection is ready again', async () => {
    const own = await ownRedis();
    const c = await connectedClient(own.url, 1000);
    const ledger = new ReceiptLedger(c);
    const key = 'away';
    const receipt = ledger.issue();
    await count(c, receipt, [key, key]);
    c.disconnect();
    ledger.failed(receipt, { keys: [key] }, connectionLost);
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
    expect(await direct.hmget(key, 'hc', 'dc', receipt.field)).toEqual(['0', '0', entry(receipt.seq, 0)]);
    ledger.close();
    direct.disconnect();
    c.disconnect();
    await own.stop();
  });
});
