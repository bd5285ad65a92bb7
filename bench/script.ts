import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { distinctLabels, parseVariants } from './ab-stats.js';
import { buildOf } from './builds.js';
import { Callgrind, medianWindow, type InstructionCount } from './callgrind.js';
import { KnobError, intKnob, reportFailure } from './knobs.js';
import { killAllChildrenNow, startRedis, stopAllChildren, stopChildrenOnSignal } from './processes.js';
import { ScriptUnderCount, type CountRules } from './script-calls.js';

/**
 * `npm run bench:script -- [<ref> …]` (docs/performance.md "Counting Redis's work"): the machine
 * instructions Redis executes per counted request for each build's consume script, counted by
 * callgrind in a redis-server of the run's own. Every build sends the same calls, as the gateway
 * sends them (each build's own pushConsumeArgs): BENCH_SCRIPT_BATCH requests per call on distinct
 * counters, what a call holds under `npm run bench`'s load, the counters of 64 keys in turn, one
 * call out at a time. After BENCH_SCRIPT_WARMUP calls uncounted (every counter exists), each
 * build counts BENCH_SCRIPT_WINDOWS windows of BENCH_SCRIPT_CALLS calls, the builds taking turns;
 * the median window is the figure. All of Redis's work for a call counts: reading it, the script,
 * the commands it runs, the reply.
 */

const log = (line: string): void => void process.stdout.write(line + '\n');

async function main(): Promise<void> {
  const knobs = {
    batch: intKnob('BENCH_SCRIPT_BATCH', 21, 1, 64),
    calls: intKnob('BENCH_SCRIPT_CALLS', 300, 1, 100_000),
    warmup: intKnob('BENCH_SCRIPT_WARMUP', 50, 0, 100_000),
    windows: intKnob('BENCH_SCRIPT_WINDOWS', 3, 1, 20),
  };
  const argv = process.argv.slice(2);
  const variants = argv.length === 0 ? parseVariants(['.']) : parseVariants(argv);
  for (const v of variants)
    if (v.nodeArgs.length > 0 || Object.keys(v.env).length > 0)
      throw new KnobError(`${v.label}: bench:script takes refs only (no node flags or variables)`);
  const labels = distinctLabels(variants.map((v) => v.label));
  const builds = await Promise.all(
    variants.map(async (v, i) => {
      const rulesFile = join(dirname(buildOf(v.ref, i)), 'limits', 'count-rules.js');
      return { label: labels[i] as string, rules: (await import(pathToFileURL(rulesFile).href)) as CountRules };
    }),
  );

  const tempDir = mkdtempSync(join(os.tmpdir(), 'oapi-bench-script-'));
  process.once('exit', () => {
    killAllChildrenNow();
    rmSync(tempDir, { recursive: true, force: true });
  });
  stopChildrenOnSignal('bench:script');
  const callgrind = new Callgrind(tempDir, 'redis');
  let client: Redis | undefined;
  try {
    const server = await startRedis(tempDir, callgrind.launcher('redis-server'));
    callgrind.attach(server.child.pid);
    client = new Redis(server.url, { maxRetriesPerRequest: 0, commandTimeout: 120_000 });
    const underCount = builds.map(
      ({ rules }, i) => new ScriptUnderCount(rules, client as Redis, `oapi-script-${i}:`, knobs.batch),
    );
    for (const script of underCount) {
      await script.load();
      await script.send(knobs.warmup);
    }
    log(
      `counting Redis's instructions: ${knobs.windows} windows of ${knobs.calls} calls of ${knobs.batch} requests on distinct counters per build, builds in turn, after ${knobs.warmup} calls uncounted`,
    );
    callgrind.start();
    const windows = underCount.map(() => [] as InstructionCount[]);
    for (let window = 0; window < knobs.windows; window++) {
      for (const [i, script] of underCount.entries()) {
        callgrind.zero();
        await script.send(knobs.calls);
        const count = callgrind.dump(join(tempDir, 'last-window.callgrind'));
        const requests = knobs.calls * knobs.batch;
        windows[i]?.push({ mainThread: count.mainThread / requests, allThreads: count.allThreads / requests });
      }
    }
    log('');
    const width = Math.max(12, ...labels.map((l) => l.length));
    log(`${'build'.padEnd(width)}  Redis instructions per request  its windows        × first`);
    const reference = medianWindow(windows[0] ?? []).median.mainThread;
    for (const [i, { label }] of builds.entries()) {
      const { median, range } = medianWindow(windows[i] ?? []);
      const k = (n: number): string => `${(n / 1000).toFixed(2)}k`;
      log(
        `${label.padEnd(width)}  ${k(median.mainThread).padStart(30)}  ${`${k(range[0])}–${k(range[1])}`.padEnd(17)}  ${(median.mainThread / reference).toFixed(3)}×`,
      );
    }
    log('');
    log("Redis's main thread, where it reads a call, runs the script and writes the reply.");
  } finally {
    client?.disconnect();
    await stopAllChildren();
  }
}

main().catch((err: unknown) => reportFailure('bench:script', err));
