import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { writeBenchLimits } from './limits.js';
import { apiKeys, quoteWorkload, stopRunningLoad, tokenWorkload } from './load.js';
import { compareProfiles, differenceLines, readProfile, summariseProfile, type ProfilePart } from './profile.js';
import {
  REPO_ROOT,
  clockTicksPerSecond,
  type Child,
  compileServers,
  forkServer,
  killAllChildrenNow,
  peakRssMB,
  rssMB,
  startGateway,
  startRedis,
  stopAllChildren,
  stopChildrenOnSignal,
  stopChild,
} from './processes.js';
import { TARGETS, judge, printReport, type BenchResult, type RssByTarget, type TargetName } from './report.js';
import { intKnob, reportFailure } from './knobs.js';
import { assertAlive, log, runRounds, runSpentKey, smokeTest, type Knobs, type Setup } from './rounds.js';

/**
 * `npm run bench` (docs/performance.md): the upstream directly, a bare Node proxy, the
 * hono floor, the Redis-backed gateway and the gateway with WORKERS=2, measured in one run with their
 * rounds interleaved, so that whatever else the machine is doing spreads over all of them instead of
 * favouring one.
 *
 * Knobs: BENCH_DURATION (seconds per measurement, 5), BENCH_ROUNDS (3), BENCH_CONNECTIONS (50),
 * BENCH_PROFILE (1: run the gateway under V8's CPU profiler and print where its CPU went).
 */

const API_KEY_COUNT = 64;

function readKnobs(): Knobs {
  const seconds = intKnob('BENCH_DURATION', 5, 1, 600);
  return {
    seconds,
    // Long enough for the JIT and the connection pools; shorter than a measurement to keep the run near two minutes.
    warmupSeconds: Math.max(1, Math.ceil(seconds / 2)),
    rounds: intKnob('BENCH_ROUNDS', 3, 1, 50),
    connections: intKnob('BENCH_CONNECTIONS', 50, 1, 1000),
  };
}

/** One memory figure (`read`: VmRSS or VmHWM, MB) of the gateway, the hono floor and the bare proxy. */
function memoryOf(
  processes: Record<keyof RssByTarget, { readonly child: { readonly pid: number } }>,
  read: (pid: number) => number,
): RssByTarget {
  return {
    gateway: read(processes.gateway.child.pid),
    floor: read(processes.floor.child.pid),
    bare: read(processes.bare.child.pid),
  };
}

async function startEverything(tempDir: string, profileDir: string | undefined): Promise<Setup> {
  const redisServer = await startRedis(tempDir);
  const serversDir = compileServers();
  const upstream = await forkServer('upstream', serversDir, 'upstream.js');
  const bare = await forkServer('bare proxy', serversDir, 'bare-proxy.js', [upstream.url]);
  const profiled = (name: string): string[] =>
    profileDir ? ['--cpu-prof', `--cpu-prof-dir=${join(profileDir, name)}`] : [];
  const floor = await forkServer('hono floor', serversDir, 'hono-floor.js', [upstream.url], profiled('floor'));
  const gatewayEnv = {
    REDIS_URL: redisServer.url,
    EQT_BRIDGE_URL: upstream.url,
    FNO_BRIDGE_URL: upstream.url,
    API_KEY_MODE: 'any',
    LOG_LEVEL: 'info',
    LIMITS_FILE: writeBenchLimits(tempDir),
  };
  const gateway = await startGateway(gatewayEnv, { nodeArgs: profiled('gateway') });
  // Its own key prefix: its counters never meet the single worker's.
  const workers2 = await startGateway(
    { ...gatewayEnv, WORKERS: '2', REDIS_KEY_PREFIX: 'oapi-w2:' },
    { name: 'gateway (WORKERS=2)' },
  );
  const redis = new Redis(redisServer.url, { maxRetriesPerRequest: 1, lazyConnect: true });
  await redis.connect();
  const startRssMB = memoryOf({ gateway, floor, bare }, rssMB);
  return {
    redis,
    upstream,
    bare,
    floor,
    gateway,
    workers2,
    gatewayEnv,
    ticksPerSecond: clockTicksPerSecond(),
    startRssMB,
    requestsSent: Object.fromEntries(TARGETS.map((target) => [target, 0])) as Record<TargetName, number>,
    problems: [],
  };
}

function redisVersion(): string {
  try {
    const text = execFileSync('redis-server', ['--version'], { encoding: 'utf8' });
    return `Redis ${/v=(\S+)/.exec(text)?.[1] ?? text.trim()}`;
  } catch {
    return 'Redis (version unknown)';
  }
}

const RESULTS_DIR = join(REPO_ROOT, '.bench');

function writeJson(result: BenchResult): string {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, 'last.json');
  writeFileSync(path, JSON.stringify(result, null, 2) + '\n');
  return path;
}

/** Where the rounds ended: the moment (on the profiles' clock) and the requests sent to each target until then. */
interface RoundsEnd {
  readonly atUs: number;
  readonly sent: Readonly<Record<'floor' | 'gateway', number>>;
}

/** Stops a profiled process (V8 writes its profile as it exits) and keeps the profile in .bench/ for Chrome DevTools. */
async function keepProfile(child: Child, dir: string, name: string): Promise<string | undefined> {
  await stopChild(child, 15_000);
  const file = readdirSync(dir).find((entry) => entry.endsWith('.cpuprofile'));
  if (!file) {
    log(`BENCH_PROFILE=1: the ${name} left no CPU profile`);
    return undefined;
  }
  mkdirSync(RESULTS_DIR, { recursive: true });
  const kept = join(RESULTS_DIR, `${name.replace(/\W+/g, '-')}.cpuprofile`);
  copyFileSync(join(dir, file), kept);
  return kept;
}

/**
 * The gateway's CPU beside the hono floor's, by package, part of Node.js and gateway module, per
 * request over the rounds (the spent key's refusals, which the floor never sees, left out).
 */
async function reportProfiles(setup: Setup, profileDir: string, roundsEnd: RoundsEnd): Promise<void> {
  const floor = await keepProfile(setup.floor.child, join(profileDir, 'floor'), 'hono floor');
  const gateway = await keepProfile(setup.gateway.child, join(profileDir, 'gateway'), 'gateway');
  if (!floor || !gateway) return;
  log('');
  log(
    `where the CPU went, per request over the rounds (warm-up included: ${roundsEnd.sent.floor} requests to the floor, ${roundsEnd.sent.gateway} to the gateway), the hono floor beside the gateway, largest difference first (self time sampled on the main thread; the profiler's own cost included):`,
  );
  const parts = (path: string, requests: number): ProfilePart[] =>
    summariseProfile(readProfile(path), requests, roundsEnd.atUs);
  const rows = compareProfiles(parts(floor, roundsEnd.sent.floor), parts(gateway, roundsEnd.sent.gateway));
  for (const line of differenceLines(rows)) log(line);
  log(`profiles written to ${floor} and ${gateway} (open them in Chrome DevTools, Performance tab)`);
}

async function run(tempDir: string): Promise<void> {
  const knobs = readKnobs();
  const profileDir = intKnob('BENCH_PROFILE', 0, 0, 1) === 1 ? join(tempDir, 'profile') : undefined;
  const startedAt = new Date().toISOString();
  const loadAverageStart = os.loadavg();
  log(
    `oapi-gateway benchmark: starting redis-server, upstream, bare proxy, hono floor and gateways (temp dir ${tempDir})`,
  );
  const setup = await startEverything(tempDir, profileDir);
  try {
    const keys = apiKeys(API_KEY_COUNT);
    const workloads = [tokenWorkload(keys), quoteWorkload(keys)];
    await smokeTest(setup, workloads);
    const total =
      (knobs.warmupSeconds + knobs.rounds * knobs.seconds) * workloads.length * TARGETS.length + knobs.seconds;
    log(
      `measuring: about ${total} s of load (${knobs.rounds} rounds × ${knobs.seconds} s after a ${knobs.warmupSeconds} s warm-up, ${knobs.connections} connections)`,
    );
    const results = await runRounds(setup, workloads, knobs);
    const roundsEnd: RoundsEnd = {
      atUs: Number(process.hrtime.bigint() / 1000n),
      sent: { floor: setup.requestsSent.floor, gateway: setup.requestsSent.gateway },
    };
    log('  spent key ...');
    const spentKey = await runSpentKey(setup, knobs);
    assertAlive(setup);

    const peak = memoryOf(setup, peakRssMB);
    const end = memoryOf(setup, rssMB);
    const gatewayStderr = setup.gateway.child.stderrTail().trim();
    if (gatewayStderr) setup.problems.push(`the gateway wrote to stderr: ${gatewayStderr.slice(-1000)}`);
    const cpus = os.cpus();
    const result: BenchResult = {
      startedAt,
      machine: {
        cpuModel: cpus[0]?.model ?? 'unknown',
        cores: cpus.length,
        totalMemoryMB: Math.round(os.totalmem() / 1024 / 1024),
        node: process.version,
        os: `${os.type()} ${os.release()} ${os.arch()}`,
        redis: redisVersion(),
        loadAverageStart,
        loadAverageEnd: os.loadavg(),
      },
      settings: {
        durationSeconds: knobs.seconds,
        warmupSeconds: knobs.warmupSeconds,
        rounds: knobs.rounds,
        connections: knobs.connections,
        apiKeys: API_KEY_COUNT,
        clockTicksPerSecond: setup.ticksPerSecond,
        gatewayEnv: {
          ...setup.gatewayEnv,
          REDIS_URL: 'redis://127.0.0.1:<bench port>',
          LIMITS_FILE: '<temp dir>/bench-limits.yaml',
        },
        profiled: profileDir !== undefined,
      },
      workloads: results,
      spentKey,
      startRssMB: setup.startRssMB,
      peakRssMB: peak,
      endRssMB: end,
      checks: judge(results, spentKey, peak.gateway),
      problems: setup.problems,
    };
    printReport(result, log);
    log('');
    log(`results written to ${writeJson(result)}`);
    if (profileDir) await reportProfiles(setup, profileDir, roundsEnd);
  } finally {
    setup.redis.disconnect();
  }
}

let cleaning: Promise<void> | undefined;
function cleanUp(tempDir: string): Promise<void> {
  cleaning ??= (async () => {
    stopRunningLoad();
    await stopAllChildren();
    rmSync(tempDir, { recursive: true, force: true });
  })();
  return cleaning;
}

async function main(): Promise<void> {
  const tempDir = mkdtempSync(join(os.tmpdir(), 'oapi-bench-'));
  stopChildrenOnSignal('the benchmark', () => cleanUp(tempDir));
  // Should anything still run at exit (an uncaught error), it dies with us.
  process.once('exit', () => {
    killAllChildrenNow();
    rmSync(tempDir, { recursive: true, force: true });
  });
  try {
    await run(tempDir);
  } catch (err) {
    reportFailure('benchmark', err);
  } finally {
    await cleanUp(tempDir);
  }
}

await main();
