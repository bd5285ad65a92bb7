import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { buildOf } from './builds.js';
import {
  distinctLabels,
  parseVariants,
  roundOrder,
  summariseBuilds,
  type ProcessSamples,
  type Variant,
} from './ab-stats.js';
import { intKnob, reportFailure } from './knobs.js';
import { mean } from './stats.js';
import { writeBenchLimits } from './limits.js';
import { apiKeys, measure, orderWorkload, quoteWorkload, tokenWorkload, type Workload } from './load.js';
import {
  clockTicksPerSecond,
  cpuTicks,
  forkServer,
  compileServers,
  killAllChildrenNow,
  peakRssMB,
  processTree,
  sleep,
  startGateway,
  startRedis,
  stopAllChildren,
  stopChildrenOnSignal,
  type GatewayProcess,
} from './processes.js';

/**
 * `npm run bench:ab -- <ref> [flags] <ref> [flags] …` (docs/performance.md "Measuring a small
 * change"): the CPU per request and peak RSS of gateway builds side by side, to tell a change of a
 * few per cent from the noise. Each ref is a git commit, branch or tag, built into .bench/builds/
 * with this checkout's node_modules, or `.` for this checkout's own dist/; node flags (`--…`) and
 * `NAME=value` after a ref are that build's (parseVariants). Every build runs as BENCH_AB_PROCESSES
 * processes against one Redis and one upstream; the processes under test share CPU 0, the load
 * generator, the upstream and Redis the other CPUs (with taskset, when the machine has two or
 * more); the processes take turns, one measurement each per workload and round, in an order
 * rotated every round. Knobs: BENCH_AB_ROUNDS (6), BENCH_AB_DURATION (s, 2), BENCH_AB_PROCESSES
 * (3), BENCH_AB_WORKLOADS (quote,token; also order), BENCH_CONNECTIONS (50).
 */

const log = (line: string): void => void process.stdout.write(line + '\n');

/** Pins a process and all its threads to the given CPUs; false when taskset is not there. */
function pin(pid: number, cpus: string): boolean {
  try {
    execFileSync('taskset', ['-a', '-pc', cpus, String(pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

interface UnderTest {
  readonly build: string;
  readonly gateway: GatewayProcess;
}

async function main(): Promise<void> {
  const ROUNDS = intKnob('BENCH_AB_ROUNDS', 6, 1, 100);
  const SECONDS = intKnob('BENCH_AB_DURATION', 2, 1, 60);
  const PROCESSES = intKnob('BENCH_AB_PROCESSES', 3, 1, 10);
  const CONNECTIONS = intKnob('BENCH_CONNECTIONS', 50, 1, 1000);
  const usage = 'usage: npm run bench:ab -- <git ref or .> [--node-flag …] [NAME=value …] [<git ref or .> …]\n';
  let variants: Variant[] = [];
  try {
    variants = parseVariants(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`bench:ab: ${(err as Error).message}\n`);
  }
  if (variants.length === 0) {
    process.stderr.write(usage);
    process.exit(2);
  }
  const workloadNames = (process.env.BENCH_AB_WORKLOADS ?? 'quote,token').split(',');
  const keys = apiKeys(64);
  const all: Record<string, Workload> = {
    quote: quoteWorkload(keys),
    token: tokenWorkload(keys),
    order: orderWorkload(keys),
  };
  const workloads = workloadNames.map((name) => {
    const workload = all[name];
    if (!workload) throw new Error(`BENCH_AB_WORKLOADS: no workload "${name}" (quote, token, order)`);
    return workload;
  });
  // A build given twice (an A/A run) is two builds: the second is labelled with its position.
  const given = variants.map((v) => v.label);
  const labels = distinctLabels(given);
  const entries = variants.map((v, i) => ({ ...v, ref: labels[i] as string, main: buildOf(v.ref, i) }));
  for (const { ref, main } of entries) if (!existsSync(main)) throw new Error(`${ref}: no build at ${main}`);

  const cpus = os.cpus().length;
  // The load generator, the upstream and Redis (started below, so they inherit it) on CPUs 1…n-1.
  const others = cpus > 2 ? `CPUs 1-${cpus - 1}` : 'CPU 1';
  const pinned = cpus >= 2 && pin(process.pid, others.replace(/^CPUs? /, ''));
  log(
    pinned
      ? `processes under test on CPU 0; load generator, upstream and Redis on ${others}`
      : 'not pinned (taskset missing or one CPU): expect more noise',
  );
  const tempDir = mkdtempSync(join(os.tmpdir(), 'oapi-bench-ab-'));
  process.once('exit', () => {
    killAllChildrenNow();
    rmSync(tempDir, { recursive: true, force: true });
  });
  stopChildrenOnSignal('bench:ab');
  try {
    const redis = await startRedis(tempDir);
    const upstream = await forkServer('upstream', compileServers(), 'upstream.js');
    const limits = writeBenchLimits(tempDir);
    const underTest: UnderTest[] = [];
    for (let p = 0; p < PROCESSES; p++) {
      for (const { ref, main, nodeArgs, env: ownEnv } of entries) {
        const env = {
          REDIS_URL: redis.url,
          REDIS_KEY_PREFIX: `oapi-ab-${underTest.length}:`,
          EQT_BRIDGE_URL: upstream.url,
          FNO_BRIDGE_URL: upstream.url,
          API_KEY_MODE: 'any',
          LOG_LEVEL: 'info',
          LIMITS_FILE: limits,
          // The build's own variables last: they may replace the ones above (HOST, PORT and the
          // admin listener's are startGateway's).
          ...ownEnv,
        };
        const gateway = await startGateway(env, { nodeArgs, name: `${ref} #${p + 1}`, entry: main });
        if (pinned) pin(gateway.child.pid, '0');
        underTest.push({ build: ref, gateway });
      }
    }
    const ticks = clockTicksPerSecond();
    const width = Math.max(24, ...labels.map((l) => l.length));
    // Per workload, per process under test: one CPU and one req/s figure per measured round.
    const samples = new Map<string, Map<UnderTest, { cpu: number[]; rps: number[]; redis: number[] }>>(
      workloads.map((w) => [w.name, new Map(underTest.map((t) => [t, { cpu: [], rps: [], redis: [] }]))]),
    );
    log(`${ROUNDS} rounds of ${SECONDS} s per process and workload after a warm-up, ${CONNECTIONS} connections`);
    for (let round = 0; round <= ROUNDS; round++) {
      for (const workload of workloads) {
        for (const target of roundOrder(underTest, round)) {
          const before = cpuTicks(target.gateway.child.pid);
          const redisBefore = cpuTicks(redis.child.pid);
          const m = await measure(target.gateway.url, workload.requests, {
            connections: CONNECTIONS,
            seconds: SECONDS,
          });
          await sleep(200);
          const perRequest = (ticksUsed: number): number => (ticksUsed / ticks / Math.max(1, m.completed)) * 1e6;
          const cpu = perRequest(cpuTicks(target.gateway.child.pid) - before);
          const redisCpu = perRequest(cpuTicks(redis.child.pid) - redisBefore);
          const bad = Object.entries(m.statusCounts).filter(([status]) => status !== '200');
          if (bad.length > 0) throw new Error(`${target.build}: answers other than 200: ${JSON.stringify(bad)}`);
          if (round === 0) continue; // warm-up
          const mine = samples.get(workload.name)?.get(target);
          mine?.cpu.push(cpu);
          mine?.rps.push(m.reqPerSec);
          mine?.redis.push(redisCpu);
        }
      }
      if (round > 0) log(`  round ${round}/${ROUNDS} done`);
    }
    // Over the whole run, both workloads, as `npm run bench` gives it.
    // With WORKERS=n, the sum of its processes' peaks (an upper bound of their peak together).
    const peaks = new Map(
      underTest.map((t) => [t, processTree(t.gateway.child.pid).reduce((sum, pid) => sum + peakRssMB(pid), 0)]),
    );
    for (const workload of workloads) {
      // In the order the refs were given: the first is the reference.
      const processSamples: ProcessSamples[] = underTest
        .map((target) => ({ target, s: samples.get(workload.name)?.get(target) }))
        .sort((a, b) => labels.indexOf(a.target.build) - labels.indexOf(b.target.build))
        .map(({ target, s }) => ({
          build: target.build,
          cpuUsPerRequest: s?.cpu ?? [],
          reqPerSec: s?.rps ?? [],
          redisUsPerRequest: s?.redis ?? [],
        }));
      log('');
      log(
        `${workload.label}: CPU µs per request (mean of ${PROCESSES} processes' medians, their range), req/s, Redis's CPU µs per request`,
      );
      for (const [i, b] of summariseBuilds(processSamples).entries()) {
        const sign = b.difference >= 0 ? '+' : '';
        const diff =
          i === 0 ? '(reference)' : `${sign}${b.difference.toFixed(1)} µs (${sign}${(b.relative * 100).toFixed(1)} %)`;
        log(
          `  ${b.build.padEnd(width)} ${b.cpuUsPerRequest.toFixed(1).padStart(7)}  [${b.processRange[0].toFixed(1)}–${b.processRange[1].toFixed(1)}]  ${b.reqPerSec.toFixed(0).padStart(7)} req/s  Redis ${b.redisUsPerRequest.toFixed(1).padStart(5)} µs  ${diff}`,
        );
      }
    }
    log('');
    log(`peak RSS (VmHWM at the end, mean of ${PROCESSES} processes)`);
    for (const label of labels) {
      const peak = mean(underTest.filter((t) => t.build === label).map((t) => peaks.get(t) ?? Number.NaN));
      log(`  ${label.padEnd(width)} ${peak.toFixed(1).padStart(7)} MB`);
    }
  } finally {
    await stopAllChildren();
  }
}

main().catch((err: unknown) => reportFailure('bench:ab', err));
