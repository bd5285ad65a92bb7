import { createHash } from 'node:crypto';
import http from 'node:http';
import { Writable } from 'node:stream';
import calculateSlot from 'cluster-key-slot';
import { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectWithin, createClusterClient, createRedisClient, type RedisClient } from '../../src/redis/connection.js';
import { RedisCounterStore } from '../../src/redis/counter-store.js';
import { evictingNodes } from '../../src/redis/eviction.js';
import { UNDO_SCRIPT } from '../../src/redis/receipt-ledger.js';
import { parseLimits } from '../../src/config/load-limits.js';
import { CONSUME_SCRIPT } from '../../src/limits/count-rules.js';
import type { LimitRow } from '../../src/limits/limit-table.js';
import { Limiter, RETRY_STORE_AFTER_MS } from '../../src/limits/limiter.js';
import { MemoryCounterStore } from '../../src/limits/memory-store.js';
import { StoreUnavailableError, type Counts } from '../../src/limits/store.js';
import { createLogger } from '../../src/observability/logger.js';
import { startSandboxBridge, type SandboxBridge } from '../../src/sandbox/bridge.js';
import { warnOfEviction } from '../../src/wiring/backend.js';
import { authHeader, startTestGateway, type TestGateway } from '../helpers/gateway.js';
import { send } from '../helpers/http.js';
import { sleep, waitFor } from '../helpers/faults.js';
import { startRedisCluster, type RedisCluster } from '../helpers/redis-cluster.js';
import { startRedisProxy, type RedisProxy } from '../helpers/redis-proxy.js';
import { uniquePrefix } from '../helpers/redis.js';
import { describeCounterStore, request } from '../helpers/store-contract.js';

/**
 * REDIS_CLUSTER_NODES: the counters on a Redis Cluster of three masters of the file's own
 * (loopback ports, stopped by PID). The store contract holds there, and limits stay exact for
 * keys whose counters sit in different slots on different masters.
 */

let cluster: RedisCluster;
let client: RedisClient;
const storePrefix = uniquePrefix('cluster-store');

beforeAll(async () => {
  cluster = await startRedisCluster();
  client = createRedisClient({
    clusterNodes: cluster.ports.map((port) => ({ host: '127.0.0.1', port })),
    commandTimeoutMs: 1000,
  });
  client.on('error', () => {});
  await connectWithin(client, 10_000);
}, 30_000);

afterAll(async () => {
  await client?.quit().catch(() => client.disconnect());
  await cluster?.stop();
});

// One store per client, as the gateway has it.
let shared: RedisCounterStore | undefined;
describeCounterStore(
  'RedisCounterStore on a Redis Cluster',
  () => (shared ??= new RedisCounterStore(client, storePrefix)),
);

describe('RedisCounterStore on a Redis Cluster, with keys in many slots', () => {
  const run = Date.now().toString(36);
  const keyHashes = Array.from({ length: 12 }, (_, i) => `slots-${run}-${i}`);
  const row = request().counterId;
  const inManySlots = (store: RedisCounterStore): number =>
    new Set(keyHashes.map((k) => calculateSlot(store.counterKey(k, row)))).size;

  it('counts requests of one turn whose counters sit in different slots (each request goes in a call of its own)', async () => {
    const store = new RedisCounterStore(client, storePrefix);
    expect(inManySlots(store)).toBeGreaterThan(1);
    const counts = await Promise.all(keyHashes.map((keyHash) => store.consume(request({ keyHash }))));
    expect(counts).toEqual(keyHashes.map(() => ({ allowed: true, hour: 1, day: 1 })));
  });

  it('merges counters of keys in different slots (one call per counter)', async () => {
    const store = new RedisCounterStore(client, storePrefix);
    const { hourStart, dayStart, expireAt } = request();
    const merged = keyHashes.map((k) => ({
      keyHash: `merge-${k}`,
      counterId: row,
      hourStart,
      hour: 2,
      dayStart,
      day: 3,
      expireAt,
    }));
    expect(new Set(merged.map((e) => calculateSlot(store.counterKey(e.keyHash, row)))).size).toBeGreaterThan(1);
    await store.merge(merged);
    for (const { keyHash } of merged)
      expect(await store.usage(keyHash, [{ counterId: row, hourStart, dayStart }])).toEqual([{ hour: 2, day: 3 }]);
  });
});

describe('the Cluster client', () => {
  it('names each master whose maxmemory-policy may evict counters (docs/operations.md "Redis")', async () => {
    expect(await evictingNodes(client)).toEqual([]);
    const port = cluster.ports[1] as number;
    const node = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
    try {
      await node.config('SET', 'maxmemory-policy', 'volatile-lru');
      expect(await evictingNodes(client)).toEqual([{ node: `127.0.0.1:${port}`, policy: 'volatile-lru' }]);
    } finally {
      await node.config('SET', 'maxmemory-policy', 'noeviction');
      node.disconnect();
    }
  });

  it('gets ready and counts through a seed address the cluster does not announce, a load balancer in front of it (regression: with node connections opened at once, its ready check failed again and again)', async () => {
    const seed = await startRedisProxy(cluster.ports[0] as number);
    const viaSeed = createClusterClient([{ host: '127.0.0.1', port: seed.port }], 1000);
    viaSeed.on('error', () => {});
    try {
      expect(await connectWithin(viaSeed, 5000)).toBe(true);
      const store = new RedisCounterStore(viaSeed, storePrefix);
      const keyHash = `seed-${Date.now().toString(36)}`;
      expect(await store.consume(request({ keyHash }))).toEqual({ allowed: true, hour: 1, day: 1 });
    } finally {
      viaSeed.disconnect();
      await seed.close();
    }
  });
});

/**
 * A Cluster client as the gateway makes one, with every master behind a proxy of the test's own:
 * the cluster names its nodes' real ports, which natMap maps to the proxies.
 */
async function proxiedCluster(
  timeoutMs: number,
): Promise<{ client: Cluster; proxies: RedisProxy[]; close: () => Promise<void> }> {
  const proxies = await Promise.all(cluster.ports.map((port) => startRedisProxy(port)));
  const natMap = Object.fromEntries(
    cluster.ports.map((port, i) => [`127.0.0.1:${port}`, { host: '127.0.0.1', port: proxies[i]?.port ?? 0 }]),
  );
  const proxied = createClusterClient(
    proxies.map((p) => ({ host: '127.0.0.1', port: p.port })),
    timeoutMs,
    { natMap },
  );
  proxied.on('error', () => {});
  return {
    client: proxied,
    proxies,
    close: async () => {
      proxied.disconnect();
      await Promise.all(proxies.map((p) => p.close()));
    },
  };
}

/** Which master (its index in the cluster's ports) serves `key`'s slot now. */
async function masterOf(key: string): Promise<number> {
  const node = new Redis({ host: '127.0.0.1', port: cluster.ports[0], maxRetriesPerRequest: 1 });
  try {
    const slot = calculateSlot(key);
    const owner = (await slotOwners(node)).find((r) => slot >= r.start && slot <= r.end)?.port;
    return cluster.ports.indexOf(owner as number);
  } finally {
    node.disconnect();
  }
}

/** A counter of its own in `store` (a key named after `name`), and a request on it with room for a hundred. */
function ownCounter(
  store: RedisCounterStore,
  name: string,
): { keyHash: string; key: string; consume: () => Promise<Counts> } {
  const keyHash = `${name}-${Date.now().toString(36)}`;
  return {
    keyHash,
    key: store.counterKey(keyHash, request().counterId),
    consume: () => store.consume(request({ keyHash, hourLimit: 100, dayLimit: 100 })),
  };
}

/** Moves a slot and its keys from one master to another (CLUSTER SETSLOT, MIGRATE), as a resharding does. */
async function moveSlot(slot: number, from: number, to: number): Promise<void> {
  const nodes = cluster.ports.map((port) => new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 }));
  try {
    const [oldNode, newNode] = [nodes[from] as Redis, nodes[to] as Redis];
    const [fromId, toId] = await Promise.all([oldNode.cluster('MYID'), newNode.cluster('MYID')]);
    await newNode.cluster('SETSLOT', slot, 'IMPORTING', fromId);
    await oldNode.cluster('SETSLOT', slot, 'MIGRATING', toId);
    const keys = await oldNode.cluster('GETKEYSINSLOT', slot, 1000);
    if (keys.length > 0)
      await oldNode.call('MIGRATE', '127.0.0.1', String(cluster.ports[to]), '', '0', '5000', 'KEYS', ...keys);
    for (const node of nodes) await node.cluster('SETSLOT', slot, 'NODE', toId);
  } finally {
    for (const node of nodes) node.disconnect();
  }
}

const CONSUME_SHA = createHash('sha1').update(CONSUME_SCRIPT).digest('hex');
const CONSUME_FIRST_LINE = CONSUME_SCRIPT.trim().split('\n')[0] as string;
const UNDO_SHA = createHash('sha1').update(UNDO_SCRIPT).digest('hex');
const UNDO_FIRST_LINE = UNDO_SCRIPT.trim().split('\n')[0] as string;

describe('RedisCounterStore on a Redis Cluster, when a node connection closes during a script call', () => {
  /** REDIS_TIMEOUT_MS's default. */
  const TIMEOUT_MS = 200;
  it.each([
    ['the script ran and its reply was lost, the connection closing at once', 'reply', 0],
    ['the script ran and its reply was lost, the connection closing 150 ms into the call', 'reply', 150],
    ['the script never reached Redis, the connection closing 150 ms into the call', 'request', 150],
  ] as const)(
    'counts the failed call nowhere and never sends it again, while the counter goes on counting: %s (regression: ioredis sent it again by itself, after its units were taken back)',
    async (_case, lost, closeAfterMs) => {
      const { client: proxied, proxies, close } = await proxiedCluster(TIMEOUT_MS);
      try {
        expect(await connectWithin(proxied, 5000)).toBe(true);
        const store = new RedisCounterStore(proxied, storePrefix);
        const { key, consume } = ownCounter(store, `lost-${lost}-${closeAfterMs}`);
        const proxy = proxies[await masterOf(key)] as RedisProxy;

        expect(await consume()).toEqual({ allowed: true, hour: 1, day: 1 });
        // A consume call is sent as EVALSHA, or as EVAL with the script on a new connection (ioredis).
        const bySha = proxy.countForwarded(CONSUME_SHA);
        const byText = proxy.countForwarded(CONSUME_FIRST_LINE);
        const consumeRuns = (): number => bySha() + byText();
        proxy.failNextCommand(lost, closeAfterMs);
        await expect(consume()).rejects.toBeInstanceOf(StoreUnavailableError);
        expect(proxy.lost).toBe(1);
        // Its master is marked as away: the next call within a second (MASTER_DOWN_MS) is not sent.
        await expect(consume()).rejects.toMatchObject({ kind: 'connection', part: true });
        // The same counter keeps counting once the master answers again: one call every 10 ms, 20
        // once one was answered (before, the master is tried once a second, and a loaded machine may
        // take more than one try to open the connection again).
        let allowed = 0;
        let calls = 0;
        const deadline = Date.now() + 5000;
        while (calls < 20 && Date.now() < deadline) {
          if (
            await consume().then(
              (c) => c.allowed,
              () => false,
            )
          )
            allowed++;
          if (allowed > 0) calls++;
          await new Promise((r) => setTimeout(r, 10));
        }
        // Past any retry ioredis would make (100 ms after a connection closes, by default), and the undos.
        await new Promise((r) => setTimeout(r, 600));
        await store.reconcile();
        expect(allowed).toBeGreaterThan(0);
        expect(await client.hget(key, 'hc')).toBe(String(1 + allowed));
        // The lost call never reached Redis again: every consume that did was answered.
        expect(consumeRuns()).toBe(allowed);
      } finally {
        await close();
      }
    },
    15_000,
  );
});

describe('RedisCounterStore on a Redis Cluster, when the slot of a call in doubt moves to another master', () => {
  /** Long enough for the slot to move and the client to learn it before the held call times out, on a slow machine too. */
  const TIMEOUT_MS = 1500;
  it('never sends a call that timed out on to the new master when the old one answers it with MOVED after the undo and a later call ran on the new one (regression: ioredis sent the call it had already rejected on, where it ran after its undo, and counted)', async () => {
    const { client: proxied, proxies, close } = await proxiedCluster(TIMEOUT_MS);
    const nodes = cluster.ports.map((port) => new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 }));
    try {
      expect(await connectWithin(proxied, 5000)).toBe(true);
      const store = new RedisCounterStore(proxied, storePrefix);
      const { key, consume } = ownCounter(store, 'moved');
      const slot = calculateSlot(key);
      const from = await masterOf(key);
      const to = (from + 1) % cluster.ports.length;
      const newNode = nodes[to] as Redis;
      expect(await consume()).toEqual({ allowed: true, hour: 1, day: 1 });

      // The old master reads the next call only once the slot has moved on.
      const held = (proxies[from] as RedisProxy).holdNextCommand(CONSUME_SHA);
      const newProxy = proxies[to] as RedisProxy;
      const consumeRunsOnNew = [newProxy.countForwarded(CONSUME_SHA), newProxy.countForwarded(CONSUME_FIRST_LINE)];
      const undosOnNew = [newProxy.countForwarded(UNDO_SHA), newProxy.countForwarded(UNDO_FIRST_LINE)];
      const doubtful = consume().then(
        () => 'answered',
        (err: unknown) => err,
      );
      for (let i = 0; i < 100 && !held.held; i++) await new Promise((r) => setTimeout(r, 10));
      expect(held.held).toBe(true);

      // The slot moves to the new master, and the client learns it.
      await moveSlot(slot, from, to);
      await new Promise<void>((resolve, reject) => proxied.refreshSlotsCache((err) => (err ? reject(err) : resolve())));

      // The call times out; its undo goes to the new master, where the call has not run.
      expect(await doubtful).toBeInstanceOf(StoreUnavailableError);
      await store.reconcile();
      expect(undosOnNew.reduce((sum, runs) => sum + runs(), 0)).toBeGreaterThan(0);
      // A later call on the counter, on the new master.
      expect(await consume()).toEqual({ allowed: true, hour: 2, day: 2 });
      const runsBefore = consumeRunsOnNew.reduce((sum, runs) => sum + runs(), 0);

      // The old master reads the held call at last and answers MOVED, for a call that failed long ago.
      const readByOld = (proxies[from] as RedisProxy).countForwarded(CONSUME_SHA);
      const moved = (proxies[from] as RedisProxy).countReplies('-MOVED');
      held.release();
      const deadline = Date.now() + 3000;
      while (moved() === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      // (A second MOVED, for the call's undo, comes only when the slot took longer than the timeout to move.)
      expect(readByOld()).toBe(1);
      expect(moved()).toBeGreaterThanOrEqual(1);
      // Loopback: a call sent on to the new master would be there within milliseconds.
      await new Promise((r) => setTimeout(r, 300));
      expect(consumeRunsOnNew.reduce((sum, runs) => sum + runs(), 0)).toBe(runsBefore);
      expect(await newNode.hmget(key, 'hc', 'dc')).toEqual(['2', '2']);
      expect(await consume()).toEqual({ allowed: true, hour: 3, day: 3 });
    } finally {
      for (const node of nodes) node.disconnect();
      await close();
    }
  }, 20_000);
});

describe('RedisCounterStore on a Redis Cluster, when a slot moves to another master', () => {
  it("follows the old master's MOVED for a call that has not failed, and counts it on the new master once", async () => {
    const { key, consume } = ownCounter(new RedisCounterStore(client, storePrefix), 'follows');
    expect(await consume()).toEqual({ allowed: true, hour: 1, day: 1 });
    const from = await masterOf(key);
    const to = (from + 1) % cluster.ports.length;
    await moveSlot(calculateSlot(key), from, to);
    // The client still sends it to the old master, which answers MOVED.
    expect(await consume()).toEqual({ allowed: true, hour: 2, day: 2 });
    const newNode = new Redis({ host: '127.0.0.1', port: cluster.ports[to], maxRetriesPerRequest: 1 });
    try {
      expect(await newNode.hmget(key, 'hc', 'dc')).toEqual(['2', '2']);
    } finally {
      newNode.disconnect();
    }
  });
});

describe('RedisCounterStore on a Redis Cluster, when no master serves a slot for a while', () => {
  it('fails a call for it at once as a refusal (nothing ran), and never sends it again (regression: ioredis sent it again 100 ms after CLUSTERDOWN, through its delay queue, also after the call had timed out)', async () => {
    const { key, consume } = ownCounter(new RedisCounterStore(client, storePrefix), 'clusterdown');
    expect(await consume()).toEqual({ allowed: true, hour: 1, day: 1 });
    const slot = calculateSlot(key);
    const owner = new Redis({ host: '127.0.0.1', port: cluster.ports[await masterOf(key)], maxRetriesPerRequest: 1 });
    try {
      await owner.cluster('DELSLOTS', slot);
      try {
        await expect(consume()).rejects.toMatchObject({ kind: 'reply' });
      } finally {
        await owner.cluster('ADDSLOTS', slot);
      }
      // Past the delay ioredis would send it again after (100 ms by default), with the slot served again.
      await new Promise((r) => setTimeout(r, 300));
      expect(await owner.hmget(key, 'hc', 'dc')).toEqual(['1', '1']);
      expect(await consume()).toEqual({ allowed: true, hour: 2, day: 2 });
    } finally {
      owner.disconnect();
    }
  });
});

describe('a Limiter on a Redis Cluster, when one master is away', () => {
  it("decides only the requests on that master's counters without Redis, counts the others in the cluster meanwhile, and adds what it admitted to the master once it is back (regression: the whole instance counted in memory, every key, for as long as the master was away)", async () => {
    // A master away fails its calls at once; the timeout only keeps a slow moment of a loaded machine from reading as one.
    const { client: proxied, proxies, close } = await proxiedCluster(1000);
    try {
      expect(await connectWithin(proxied, 5000)).toBe(true);
      const parsed = parseLimits(
        'timezone: UTC\nlimits:\n  - { name: Orders, route: "GET /orders", per_hour: 1000, per_day: 2000 }\n',
        'limits.yaml',
      );
      if (!parsed.ok) throw new Error('invalid test table');
      const row = parsed.table.rows[0] as LimitRow;
      const store = new RedisCounterStore(proxied, storePrefix);
      let lostInMerges = 0;
      const limiter = new Limiter({
        store,
        insurance: new MemoryCounterStore(),
        failureMode: 'insurance',
        observer: {
          storeError: () => {},
          fallback: () => {},
          storeCall: () => {},
          merged: (units, result) => {
            if (result === 'failed') lostInMerges += units;
          },
        },
      });
      const check = async (keyHash: string): Promise<string> => {
        const d = await limiter.check({ keyHash, row, limits: row.limits, calendar: parsed.table.calendar });
        if (d.kind !== 'counted' || !d.allowed) throw new Error(`not admitted: ${JSON.stringify(d)}`);
        return d.source;
      };
      // One key whose counter sits on the master that goes away, one on another master.
      const run = Date.now().toString(36);
      const keysOn = async (master: number | 'other', away: number): Promise<string> => {
        for (let i = 0; i < 200; i++) {
          const at = await masterOf(store.counterKey(`${run}-${i}`, row.counterId));
          if (master === 'other' ? at !== away : at === master) return `${run}-${i}`;
        }
        throw new Error('no such key');
      };
      const onAway = await keysOn(0, 0);
      const elsewhere = await keysOn('other', 0);
      expect(await check(onAway)).toBe('store');

      (proxies[0] as RedisProxy).away = true;
      const sources: Record<string, string[]> = { [onAway]: [], [elsewhere]: [] };
      for (let i = 0; i < 10; i++) {
        for (const keyHash of [onAway, elsewhere]) sources[keyHash]?.push(await check(keyHash));
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(sources[elsewhere]).toEqual(Array.from({ length: 10 }, () => 'store'));
      expect(sources[onAway]).toEqual(Array.from({ length: 10 }, () => 'insurance'));
      // Then, for 1.5 s, requests on the other master only: the merges they bring send nothing to
      // the master away (regression: a form whose marks ran out after a second sent one, which
      // failed, and its units stayed in this instance only).
      for (let i = 0; i < 20; i++) {
        expect(await check(elsewhere)).toBe('store');
        await new Promise((r) => setTimeout(r, 75));
      }
      await limiter.merged();
      expect(lostInMerges).toBe(0);
      // A call in doubt on the master away keeps no receipts in the other master's counters
      // (regression: it kept every receipt since, up to 512, and each call there scanned them all).
      const receipts = Object.entries(await client.hgetall(store.counterKey(elsewhere, row.counterId)))
        .filter(([field]) => field.startsWith('rc:'))
        .map(([, rc]) => rc.split(',').length - 1);
      expect(receipts).toEqual([1]);

      (proxies[0] as RedisProxy).away = false;
      let source = 'insurance';
      // One counted in the cluster before, ten in the insurance counters meanwhile.
      let admitted = 11;
      const deadline = Date.now() + 8000;
      while (source !== 'store' && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        source = await check(onAway);
        admitted++;
      }
      expect(source).toBe('store');
      // A merge that failed while the master's connection opened again is tried once the limiter's wait has passed.
      await new Promise((r) => setTimeout(r, RETRY_STORE_AFTER_MS));
      await check(elsewhere);
      await limiter.merged();
      await store.reconcile();
      // Every admission of the key is in its counter, once: those counted there, and those admitted meanwhile.
      expect(await client.hmget(store.counterKey(onAway, row.counterId), 'hc', 'dc')).toEqual([
        String(admitted),
        String(admitted),
      ]);
      // Ten with the key away, twenty with the other master only, one to bring the last merge.
      expect(await client.hmget(store.counterKey(elsewhere, row.counterId), 'hc', 'dc')).toEqual(['31', '31']);
      expect(lostInMerges).toBe(0);
    } finally {
      await close();
    }
  }, 30_000);
});

const LIMITS = `
timezone: UTC
limits:
  - { name: Order List, route: "GET /orders", per_hour: 20, per_day: 30 }
`;

const sha256Hex = (s: string): string => createHash('sha256').update(s).digest('hex');

/** Slot ranges to the port of the master serving them (CLUSTER SLOTS). */
async function slotOwners(node: Redis): Promise<Array<{ start: number; end: number; port: number }>> {
  const reply = await node.cluster('SLOTS');
  return reply.map(([start, end, master]) => {
    if (!master) throw new Error(`slots ${start}-${end} have no master`);
    return { start, end, port: Number(master[1]) };
  });
}

describe('two gateway instances on a Redis Cluster (REDIS_CLUSTER_NODES)', () => {
  let eqt: SandboxBridge;
  let fno: SandboxBridge;
  let a: TestGateway;
  let b: TestGateway;
  let nodes: Map<number, Redis>;
  let spentKeys: string[] = [];

  beforeAll(async () => {
    eqt = await startSandboxBridge('eqt');
    fno = await startSandboxBridge('fno');
    const prefix = uniquePrefix('cluster-gw');
    // REDIS_URL is left unset (redis: false); failures would answer 503 rather than count in memory.
    const env = {
      REDIS_CLUSTER_NODES: cluster.nodes,
      REDIS_FAILURE_MODE: 'closed',
      REDIS_TIMEOUT_MS: '1000',
      LOG_LEVEL: 'warn',
    };
    a = await startTestGateway({ limits: LIMITS, prefix, bridges: { eqt, fno }, redis: false, env });
    b = await startTestGateway({ limits: LIMITS, prefix, bridges: { eqt, fno }, redis: false, env });
    nodes = new Map(
      cluster.ports.map((port) => [port, new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 })]),
    );
  }, 30_000);

  afterAll(async () => {
    for (const node of nodes?.values() ?? []) node.disconnect();
    await Promise.all([a?.stop(), b?.stop()]);
    await Promise.all([eqt?.close(), fno?.close()]);
  });

  it('count in the cluster, and report ready', async () => {
    for (const gw of [a, b]) {
      expect(gw.gateway.redis).toBeInstanceOf(Cluster);
      const ready = await send(gw.adminUrl, { path: '/readyz' });
      expect(ready.json()).toEqual({ status: 'ok' });
    }
  });

  it('admit exactly the limit for keys whose counters sit on every master, under concurrent requests through both instances', async () => {
    const row = a.gateway.tables.current()?.rows[0];
    expect(row?.route.text).toBe('GET /orders');
    const counterId = row!.counterId;
    const counterKey = (apiKey: string): string => `${a.prefix}c:{${sha256Hex(apiKey)}}:${counterId}`;

    // Two keys per master, each in a slot of its own.
    const owners = await slotOwners(nodes.get(cluster.ports[0]!)!);
    const ownerOf = (slot: number): number => owners.find((o) => slot >= o.start && slot <= o.end)!.port;
    expect(new Set(owners.map((o) => o.port)).size).toBe(3);
    const run = Date.now().toString(36);
    const chosen: Array<{ apiKey: string; slot: number; port: number }> = [];
    const perNode = new Map<number, number>();
    for (let i = 0; i < 1000 && chosen.length < 6; i++) {
      const apiKey = `cluster-${run}-${i}`;
      const slot = calculateSlot(counterKey(apiKey));
      const port = ownerOf(slot);
      if ((perNode.get(port) ?? 0) >= 2 || chosen.some((c) => c.slot === slot)) continue;
      // A slot of its own: the checks below count the keys in it (regression: a slot that earlier
      // tests of this file had written to held their keys too, and the count failed now and then).
      if ((await nodes.get(port)!.cluster('COUNTKEYSINSLOT', slot)) !== 0) continue;
      perNode.set(port, (perNode.get(port) ?? 0) + 1);
      chosen.push({ apiKey, slot, port });
    }
    expect(chosen).toHaveLength(6);
    expect(new Set(chosen.map((c) => c.port))).toEqual(new Set(cluster.ports));

    const agent = new http.Agent({ keepAlive: true, maxSockets: 100 });
    const replies = await Promise.all(
      chosen.flatMap(({ apiKey }, k) =>
        Array.from({ length: 60 }, (_, i) =>
          send((i + k) % 2 ? a.url : b.url, { path: '/orders', headers: { 'X-API-Key': apiKey }, agent }).then((r) => ({
            apiKey,
            reply: r,
          })),
        ),
      ),
    );
    agent.destroy();

    const problems = [...a.logs, ...b.logs].filter((l) => Number(l.level) >= 40);
    for (const { apiKey } of chosen) {
      const mine = replies.filter((r) => r.apiKey === apiKey).map((r) => r.reply);
      const statuses = mine.map((r) => r.status);
      expect(
        statuses.filter((s) => s === 200),
        `${apiKey}: ${JSON.stringify(statuses)} ${JSON.stringify(problems)}`,
      ).toHaveLength(20);
      expect(statuses.filter((s) => s === 429)).toHaveLength(40);
      // Every admitted request saw its own count.
      const remaining = mine
        .filter((r) => r.status === 200)
        .map((r) => Number(r.headers['x-ratelimit-remaining-hour']))
        .sort((x, y) => x - y);
      expect(remaining).toEqual(Array.from({ length: 20 }, (_, i) => i));
    }

    for (const { apiKey } of chosen) {
      for (const gw of [a, b]) {
        const usage = await send(gw.adminUrl, { path: `/admin/usage/${apiKey}`, headers: authHeader() });
        expect(usage.status).toBe(200);
        expect(usage.json<{ endpoints: unknown[] }>().endpoints[0]).toMatchObject({
          route: 'GET /orders',
          hour: { used: 20 },
          day: { used: 20 },
        });
      }
    }

    // The counters really live on different masters: each in its slot, on its owner only.
    for (const { apiKey, slot, port } of chosen) {
      const key = counterKey(apiKey);
      const owner = nodes.get(port)!;
      expect(await owner.cluster('KEYSLOT', key)).toBe(slot);
      expect(await owner.exists(key)).toBe(1);
      expect(await owner.hmget(key, 'hc', 'dc')).toEqual(['20', '20']);
      for (const [otherPort, other] of nodes) {
        expect(await other.cluster('COUNTKEYSINSLOT', slot), `slot ${slot} on ${otherPort}`).toBe(
          otherPort === port ? 1 : 0,
        );
      }
    }
    expect(problems).toEqual([]);
    spentKeys = chosen.map((c) => c.apiKey);
  });

  it('reset a key through one instance, and the other admits it again at once (pub/sub on the cluster)', async () => {
    expect(spentKeys).toHaveLength(6);
    for (const apiKey of spentKeys.slice(0, 3)) {
      // Both instances remember the refusal.
      expect((await send(a.url, { path: '/orders', headers: { 'X-API-Key': apiKey } })).status).toBe(429);
      expect((await send(b.url, { path: '/orders', headers: { 'X-API-Key': apiKey } })).status).toBe(429);
      const reset = await send(a.adminUrl, { method: 'DELETE', path: `/admin/usage/${apiKey}`, headers: authHeader() });
      expect(reset.status).toBe(204);
      // The event reaches b asynchronously; a refusal from b's memory consumes nothing, so retrying is harmless.
      let status = 0;
      const deadline = Date.now() + 3000;
      for (let i = 0; i < 60 && Date.now() < deadline; i++) {
        status = (await send(b.url, { path: '/orders', headers: { 'X-API-Key': apiKey } })).status;
        if (status === 200) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      expect(status, `${apiKey} after a reset through the other instance`).toBe(200);
      const usage = await send(a.adminUrl, { path: `/admin/usage/${apiKey}`, headers: authHeader() });
      expect(usage.json<{ endpoints: unknown[] }>().endpoints[0]).toMatchObject({
        hour: { used: 1 },
        day: { used: 1 },
      });
    }
  });

  it('issue a key through one instance (MULTI in one slot), and the other knows it at once', async () => {
    const id = `cluster-issued-${Date.now()}`;
    const created = await send(a.adminUrl, {
      method: 'POST',
      path: '/admin/keys',
      headers: { ...authHeader(), 'Content-Type': 'application/json' },
      body: JSON.stringify({ id }),
    });
    expect(created.status, created.text).toBe(201);
    let listed = false;
    const deadline = Date.now() + 3000;
    for (let i = 0; i < 60 && Date.now() < deadline && !listed; i++) {
      const keys = await send(b.adminUrl, { path: '/admin/keys', headers: authHeader() });
      listed = keys.json<{ keys: Array<{ id: string }> }>().keys.some((k) => k.id === id);
      if (!listed) await new Promise((r) => setTimeout(r, 50));
    }
    expect(listed).toBe(true);
    expect(
      (await send(b.adminUrl, { method: 'DELETE', path: `/admin/keys/${id}`, headers: authHeader() })).status,
    ).toBe(204);
  });

  // Last: it blocks 127.0.0.1 on both instances.
  it('share the invalid-key guard between instances through the cluster', async () => {
    for (let i = 0; i < 20; i++) {
      const reply = await send(i % 2 ? a.url : b.url, { path: '/orders' });
      expect(reply.status, `missing key #${i + 1}`).toBe(401);
    }
    // 20 attempts in all, 10 on each instance: only a shared count blocks now.
    expect((await send(a.url, { path: '/orders' })).status).toBe(429);
    expect((await send(b.url, { path: '/orders', headers: { 'X-API-Key': spentKeys[5]! } })).status).toBe(429);
  });
});

// Last in the file: it adds a fourth master to the file's cluster.
describe('the eviction warning on a Redis Cluster', () => {
  /** The index in cluster.ports of the master that serves `slot` now. */
  async function ownerOf(slot: number): Promise<number> {
    const node = new Redis({ host: '127.0.0.1', port: cluster.ports[0], maxRetriesPerRequest: 1 });
    try {
      const ranges = await node.cluster('SLOTS');
      const range = ranges.find(([first, last]) => first <= slot && slot <= last);
      return cluster.ports.indexOf(range?.[2]?.[1] ?? -1);
    } finally {
      node.disconnect();
    }
  }

  it('names a node that becomes a master while the gateway runs (regression: only the masters of a connection’s start were looked at)', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = createLogger(
      'warn',
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(JSON.parse(chunk.toString('utf8')) as Record<string, unknown>);
          done();
        },
      }),
    );
    const watched = createRedisClient({
      clusterNodes: cluster.ports.map((port) => ({ host: '127.0.0.1', port })),
      commandTimeoutMs: 1000,
    });
    watched.on('error', () => {});
    warnOfEviction(watched, logger);
    expect(await connectWithin(watched, 10_000)).toBe(true);
    try {
      const port = await cluster.addMaster();
      const newcomer = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: 1 });
      await newcomer.config('SET', 'maxmemory-policy', 'allkeys-lru');
      newcomer.disconnect();
      const key = uniquePrefix('eviction-newcomer');
      const slot = calculateSlot(key);
      await moveSlot(slot, await ownerOf(slot), cluster.ports.indexOf(port));
      // The client's next call there meets MOVED, and it reads the slot map again.
      await watched.get(key);
      await waitFor('the warning for the new master', () => lines.length > 0, 5000, 20);
      await sleep(100);
      expect(lines).toEqual([
        expect.objectContaining({
          level: 'warn',
          node: `127.0.0.1:${port}`,
          policy: 'allkeys-lru',
          msg: 'redis may evict counters, and a key get its quota afresh: set maxmemory-policy noeviction',
        }),
      ]);
    } finally {
      await watched.quit().catch(() => watched.disconnect());
    }
  });
});
