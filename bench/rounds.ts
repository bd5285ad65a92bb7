import type { Redis } from 'ioredis';
import {
  addCounts,
  commandCounts,
  commandDiff,
  metricTotal,
  redisCpuSeconds,
  scriptCalls,
  totalCalls,
  type CommandCounts,
} from './counters.js';
import { SPENT_PER_HOUR } from './limits.js';
import { measure, type Measurement, type Workload } from './load.js';
import { isRunning, processTree, sleep, treeCpuTicks, type Child, type GatewayProcess } from './processes.js';
import {
  GATEWAYS,
  TARGETS,
  type RedisFigures,
  type RoundResult,
  type RssByTarget,
  type SpentKeyResult,
  type TargetName,
  type TargetResult,
  type WorkloadResult,
} from './report.js';
import { mean, percentile, sortedCopy, stdev } from './stats.js';

/**
 * The measurements: a smoke test, the interleaved rounds, the spent key. Each measurement
 * reads the CPU of the process under test and, for the gateway, Redis's command counts and
 * the gateway's own counters just before and just after the load.
 */

/** Lets the gateway finish requests still in flight when autocannon stops before its counters are read. */
const SETTLE_MS = 250;

export interface Knobs {
  readonly seconds: number;
  readonly warmupSeconds: number;
  readonly rounds: number;
  readonly connections: number;
}

export interface Setup {
  readonly redis: Redis;
  readonly upstream: { child: Child; url: string };
  readonly bare: { child: Child; url: string };
  /** hono + node-server + the gateway's Forwarder, nothing else (bench/servers/hono-floor.ts). */
  readonly floor: { child: Child; url: string };
  readonly gateway: GatewayProcess;
  /** The gateway with WORKERS=2 (a primary and two workers). */
  readonly workers2: GatewayProcess;
  readonly gatewayEnv: Record<string, string>;
  readonly ticksPerSecond: number;
  /** RSS (MB) of the gateway, the hono floor and the bare proxy once started, before any load. */
  readonly startRssMB: RssByTarget;
  /** Requests sent to each target so far, by every measurement (warm-ups and the spent key included). */
  readonly requestsSent: Record<TargetName, number>;
  /** Anything odd seen on the way (non-200 answers, errors, counters that disagree), for the report. */
  readonly problems: string[];
}

/**
 * Taken just before and just after one gateway measurement, and their difference: Redis's
 * command counts and CPU seconds, the gateway's store calls and requests counted.
 */
interface GatewayReading {
  readonly commands: CommandCounts;
  readonly storeCalls: number;
  readonly counted: number;
  readonly redisCpuSeconds: number;
}

export function log(line: string): void {
  process.stdout.write(line + '\n');
}

function serverOf(setup: Setup, target: TargetName): { child: Child; url: string } {
  return target === 'direct' ? setup.upstream : setup[target];
}

function urlOf(setup: Setup, target: TargetName): string {
  return serverOf(setup, target).url;
}

/** One request of each workload through each target: the same answer everywhere, and the gateway's usage headers. */
export async function smokeTest(setup: Setup, workloads: readonly Workload[]): Promise<void> {
  for (const workload of workloads) {
    const request = workload.requests[0];
    if (!request) continue;
    const bodies: string[] = [];
    for (const target of TARGETS) {
      const response = await fetch(urlOf(setup, target) + (request.path ?? '/'), {
        method: request.method ?? 'GET',
        headers: { ...request.headers, 'x-api-key': 'bench-smoke-test' },
        ...(request.body === undefined ? {} : { body: request.body }),
      });
      const body = await response.text();
      bodies.push(body);
      if (response.status !== 200)
        setup.problems.push(
          `smoke test: ${workload.label} through ${target} answered ${response.status}: ${body.slice(0, 200)}`,
        );
      if (GATEWAYS.has(target) && !response.headers.get('x-ratelimit-limit-hour'))
        setup.problems.push(`smoke test: the gateway's answer to ${workload.label} has no X-RateLimit-Limit-Hour`);
    }
    if (new Set(bodies).size !== 1)
      setup.problems.push(
        `smoke test: ${workload.label} got different bodies: ${bodies.map((b) => b.slice(0, 80)).join(' | ')}`,
      );
  }
}

async function readGateway(setup: Setup, gateway: GatewayProcess): Promise<GatewayReading> {
  const storeCalls = await metricTotal(gateway.adminUrl, 'oapi_gateway_store_calls_total');
  const counted = await metricTotal(gateway.adminUrl, 'oapi_gateway_requests_total');
  const commands = await commandCounts(setup.redis);
  return { commands, storeCalls, counted, redisCpuSeconds: await redisCpuSeconds(setup.redis) };
}

export function assertAlive(setup: Setup): void {
  for (const child of [
    setup.upstream.child,
    setup.bare.child,
    setup.floor.child,
    setup.gateway.child,
    setup.workers2.child,
  ]) {
    if (!isRunning(child))
      throw new Error(
        `${child.name} exited (code ${child.process.exitCode}, signal ${child.process.signalCode}):\n${child.stderrTail()}`,
      );
  }
}

interface Sample {
  readonly measurement: Measurement;
  readonly cpuUsPerRequest: number;
  readonly redis?: GatewayReading;
}

/** One measurement of one target, with the CPU it cost and, for the gateway, what it asked of Redis. */
async function sample(
  setup: Setup,
  target: TargetName,
  requests: Workload['requests'],
  seconds: number,
  connections: number,
): Promise<Sample> {
  assertAlive(setup);
  // The process that answers, and with WORKERS=2 its workers too.
  const pids = processTree(serverOf(setup, target).child.pid);
  const gateway = target === 'gateway' || target === 'workers2' ? setup[target] : undefined;
  // Counters are read outside the CPU window: a /metrics scrape is not the gateway's request work.
  const before = gateway ? await readGateway(setup, gateway) : undefined;
  const ticksBefore = treeCpuTicks(pids);
  const measurement = await measure(urlOf(setup, target), requests, { connections, seconds });
  setup.requestsSent[target] += measurement.sent;
  await sleep(SETTLE_MS);
  const ticksAfter = treeCpuTicks(pids);
  const after = gateway ? await readGateway(setup, gateway) : undefined;
  const cpuUsPerRequest = (((ticksAfter - ticksBefore) / setup.ticksPerSecond) * 1e6) / Math.max(1, measurement.sent);
  const redis =
    before && after
      ? {
          commands: commandDiff(before.commands, after.commands),
          storeCalls: after.storeCalls - before.storeCalls,
          counted: after.counted - before.counted,
          redisCpuSeconds: after.redisCpuSeconds - before.redisCpuSeconds,
        }
      : undefined;
  return { measurement, cpuUsPerRequest, ...(redis ? { redis } : {}) };
}

function noteOddAnswers(problems: string[], where: string, m: Measurement, expected: string): void {
  const odd = Object.entries(m.statusCounts).filter(([status]) => status !== expected);
  if (odd.length > 0) problems.push(`${where}: ${odd.map(([s, n]) => `${n}× ${s}`).join(', ')} (of ${m.completed})`);
  if (m.errors > 0 || m.timeouts > 0) problems.push(`${where}: ${m.errors} connection errors, ${m.timeouts} timeouts`);
}

function redisFigures(reading: GatewayReading, requests: number): RedisFigures {
  const { commands, storeCalls, counted, redisCpuSeconds } = reading;
  const n = Math.max(1, requests);
  return {
    requests,
    gatewayCounted: counted,
    cpuUsPerRequest: (redisCpuSeconds * 1e6) / n,
    commands,
    commandsPerRequest: totalCalls(commands) / n,
    scriptsPerRequest: scriptCalls(commands) / n,
    // Each counter-store call on a request's path waits for exactly one Redis reply.
    roundTripsPerRequest: storeCalls / n,
  };
}

function summarise(target: TargetName, samples: readonly Sample[], rounds: readonly RoundResult[]): TargetResult {
  const sorted = sortedCopy(samples.map((s) => s.measurement.latenciesMs));
  const sent = samples.reduce((n, s) => n + s.measurement.sent, 0);
  const cpuUs = samples.reduce((us, s) => us + s.cpuUsPerRequest * s.measurement.sent, 0) / Math.max(1, sent);
  let redis: RedisFigures | undefined;
  if (GATEWAYS.has(target)) {
    const commands: CommandCounts = {};
    let storeCalls = 0;
    let counted = 0;
    let redisCpuSeconds = 0;
    for (const s of samples) {
      if (!s.redis) continue;
      addCounts(commands, s.redis.commands);
      storeCalls += s.redis.storeCalls;
      counted += s.redis.counted;
      redisCpuSeconds += s.redis.redisCpuSeconds;
    }
    redis = redisFigures({ commands, storeCalls, counted, redisCpuSeconds }, sent);
  }
  return {
    target,
    rounds: [...rounds],
    reqPerSec: mean(rounds.map((r) => r.reqPerSec)),
    reqPerSecStdev: stdev(rounds.map((r) => r.reqPerSec)),
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    cpuUsPerRequest: cpuUs,
    ...(redis ? { redis } : {}),
  };
}

function roundResult(round: number, s: Sample): RoundResult {
  const sorted = sortedCopy([s.measurement.latenciesMs]);
  const m = s.measurement;
  return {
    round,
    seconds: m.seconds,
    completed: m.completed,
    sent: m.sent,
    reqPerSec: m.reqPerSec,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    cpuUsPerRequest: s.cpuUsPerRequest,
    statusCounts: m.statusCounts,
    errors: m.errors,
    timeouts: m.timeouts,
  };
}

/** Round-robin over workloads and targets; round 0 is the warm-up and is not kept. */
export async function runRounds(setup: Setup, workloads: readonly Workload[], knobs: Knobs): Promise<WorkloadResult[]> {
  const kept = new Map<string, { samples: Sample[]; rounds: RoundResult[] }>();
  for (let round = 0; round <= knobs.rounds; round++) {
    const warmup = round === 0;
    const seconds = warmup ? knobs.warmupSeconds : knobs.seconds;
    for (const workload of workloads) {
      const line: string[] = [];
      for (const target of TARGETS) {
        const s = await sample(setup, target, workload.requests, seconds, knobs.connections);
        const where = `${workload.name} through ${target}, ${warmup ? 'warm-up' : `round ${round}`}`;
        noteOddAnswers(setup.problems, where, s.measurement, '200');
        if (s.redis && Math.abs(s.redis.counted - s.measurement.sent) > knobs.connections) {
          setup.problems.push(
            `${where}: autocannon sent ${s.measurement.sent} requests, the gateway's oapi_gateway_requests_total grew by ${s.redis.counted}`,
          );
        }
        if (s.redis && (scriptCalls(s.redis.commands) > s.redis.storeCalls || scriptCalls(s.redis.commands) === 0)) {
          setup.problems.push(
            `${where}: oapi_gateway_store_calls_total grew by ${s.redis.storeCalls}, Redis ran ${scriptCalls(s.redis.commands)} scripts`,
          );
        }
        line.push(`${target} ${s.measurement.reqPerSec.toFixed(0)} req/s`);
        if (warmup) continue;
        const entry = kept.get(workload.name + target) ?? { samples: [], rounds: [] };
        entry.samples.push(s);
        entry.rounds.push(roundResult(round, s));
        kept.set(workload.name + target, entry);
      }
      log(`  ${warmup ? 'warm-up' : `round ${round}/${knobs.rounds}`}  ${workload.name.padEnd(5)}  ${line.join(', ')}`);
    }
  }
  return workloads.map((workload) => {
    const targets = Object.fromEntries(
      TARGETS.map((target) => {
        const entry = kept.get(workload.name + target) ?? { samples: [], rounds: [] };
        return [target, summarise(target, entry.samples, entry.rounds)];
      }),
    ) as Record<TargetName, TargetResult>;
    return { workload: workload.name, label: workload.label, targets };
  });
}

/**
 * A key whose hour window is full: after the one refusal that comes from Redis, the gateway
 * should refuse it from memory, without a round trip.
 */
export async function runSpentKey(setup: Setup, knobs: Knobs): Promise<SpentKeyResult> {
  const key = 'bench-spent-key';
  const path = '/marketdata/orderbook/VNM';
  const primingStatuses: number[] = [];
  // SPENT_PER_HOUR allowed requests fill the hour window; the next refusal is the one that comes from Redis.
  for (let i = 0; i <= SPENT_PER_HOUR; i++) {
    const response = await fetch(setup.gateway.url + path, { headers: { 'x-api-key': key } });
    await response.arrayBuffer();
    primingStatuses.push(response.status);
  }
  const expected = [...Array<number>(SPENT_PER_HOUR).fill(200), 429];
  if (primingStatuses.join() !== expected.join())
    setup.problems.push(
      `spent key: priming answers were ${primingStatuses.join(', ')}, expected ${expected.join(', ')}`,
    );

  const s = await sample(
    setup,
    'gateway',
    [{ method: 'GET', path, headers: { 'x-api-key': key } }],
    knobs.seconds,
    knobs.connections,
  );
  noteOddAnswers(setup.problems, 'spent key', s.measurement, '429');
  const sorted = sortedCopy([s.measurement.latenciesMs]);
  const redis = s.redis ?? { commands: {}, storeCalls: Number.NaN, counted: Number.NaN, redisCpuSeconds: Number.NaN };
  return {
    primingStatuses,
    seconds: s.measurement.seconds,
    completed: s.measurement.completed,
    reqPerSec: s.measurement.reqPerSec,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    statusCounts: s.measurement.statusCounts,
    cpuUsPerRequest: s.cpuUsPerRequest,
    redis: redisFigures(redis, s.measurement.sent),
  };
}
