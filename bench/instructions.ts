import { copyFileSync, existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join, relative } from 'node:path';
import { distinctLabels, fileNameOf, parseVariants, type Variant } from './ab-stats.js';
import { buildOf } from './builds.js';
import { Callgrind, callgrindOptions, medianWindow, type InstructionCount } from './callgrind.js';
import { BARE, FLOOR, instructionTable, type Counted } from './instructions-report.js';
import { KnobError, intKnob, reportFailure } from './knobs.js';
import { writeBenchLimits } from './limits.js';
import { apiKeys, quoteWorkload, sendExactly, tokenWorkload, type Workload } from './load.js';
import {
  REPO_ROOT,
  compileServers,
  forkServer,
  killAllChildrenNow,
  startGateway,
  startRedis,
  stopAllChildren,
  stopChildrenOnSignal,
  stopChild,
  type Child,
} from './processes.js';

/**
 * `npm run bench:instructions -- [<ref> [flags] …]` (docs/performance.md "Counting instructions"):
 * the machine instructions per request of the bare proxy, the hono floor and gateway builds (this
 * checkout's dist/ when no ref is given; refs as `npm run bench:ab` takes them), counted by
 * valgrind's callgrind. Unlike CPU time the count does not move with what else the machine is
 * doing: a change of 2 % shows in one run. Each target runs alone under callgrind with counting
 * off for BENCH_INSTR_WARMUP requests of each workload (the JIT's warm-up), then counts
 * BENCH_INSTR_WINDOWS windows of BENCH_INSTR_REQUESTS requests of each, BENCH_INSTR_CONNECTIONS at
 * a time; the median window is the figure. BENCH_INSTR_CALLGRIND: further callgrind options.
 */

const log = (line: string): void => void process.stdout.write(line + '\n');

/** Where each window's main-thread profile is kept, for `callgrind_annotate`; replaced by every run. */
const PROFILES_DIR = join(REPO_ROOT, '.bench', 'instructions');

/**
 * The variables vgdb names its FIFOs after (callgrind.ts): every process here, and this one, whose
 * environment callgrind_control inherits, must see the same. A gateway's HOST is its listen address.
 */
const VGDB_NAMING = ['LOGNAME', 'USER', 'HOST', 'HOSTNAME'];

interface Target {
  readonly label: string;
  /** Starts it under `callgrind`; resolves with its process and URL. */
  start(callgrind: Callgrind): Promise<{ child: Child; url: string }>;
}

function dividedBy(count: InstructionCount, requests: number): InstructionCount {
  return { mainThread: count.mainThread / requests, allThreads: count.allThreads / requests };
}

async function countTarget(
  target: Target,
  tempDir: string,
  position: number,
  workloads: readonly Workload[],
  knobs: { warmup: number; requests: number; windows: number; connections: number; callgrind: readonly string[] },
): Promise<Counted[]> {
  const callgrind = new Callgrind(tempDir, `target-${position}`, knobs.callgrind);
  const { child, url } = await target.start(callgrind);
  callgrind.attach(child.pid);
  const send = async (workload: Workload, count: number): Promise<void> => {
    const statuses = await sendExactly(url, workload.requests, count, knobs.connections);
    const others = Object.entries(statuses).filter(([status]) => status !== '200');
    if (others.length > 0)
      throw new Error(`${target.label}, ${workload.label}: answers other than 200: ${JSON.stringify(others)}`);
  };
  const counted: Counted[] = [];
  try {
    for (const workload of workloads) await send(workload, knobs.warmup);
    callgrind.start();
    const windows = new Map(workloads.map((w) => [w, [] as InstructionCount[]]));
    for (let window = 1; window <= knobs.windows; window++) {
      for (const workload of workloads) {
        callgrind.zero();
        await send(workload, knobs.requests);
        const kept = fileNameOf(`${target.label}-${workload.name}-${window}.callgrind`);
        windows.get(workload)?.push(dividedBy(callgrind.dump(join(PROFILES_DIR, kept)), knobs.requests));
      }
    }
    for (const workload of workloads) {
      const { median, range } = medianWindow(windows.get(workload) ?? []);
      counted.push({ target: target.label, workload, perRequest: median, range });
    }
  } finally {
    await stopChild(child, 60_000);
    // With --perf-basic-prof after a ref, V8 wrote its code map to /tmp: kept beside the profiles.
    const perfMap = `/tmp/perf-${child.pid}.map`;
    if (existsSync(perfMap)) renameOrCopy(perfMap, join(PROFILES_DIR, fileNameOf(`${target.label}.perf-map`)));
  }
  log(`  ${target.label}: counted`);
  return counted;
}

/** Moves a file, across file systems too. */
function renameOrCopy(from: string, to: string): void {
  try {
    renameSync(from, to);
  } catch {
    copyFileSync(from, to);
    rmSync(from, { force: true });
  }
}

async function main(): Promise<void> {
  const knobs = {
    warmup: intKnob('BENCH_INSTR_WARMUP', 30_000, 0, 1_000_000),
    requests: intKnob('BENCH_INSTR_REQUESTS', 2000, 1, 100_000),
    windows: intKnob('BENCH_INSTR_WINDOWS', 3, 1, 20),
    connections: intKnob('BENCH_INSTR_CONNECTIONS', 8, 1, 1000),
    callgrind: callgrindOptions(process.env.BENCH_INSTR_CALLGRIND),
  };
  const argv = process.argv.slice(2);
  const variants: Variant[] =
    argv.length === 0 ? [{ ref: '.', nodeArgs: [], env: {}, label: '.' }] : parseVariants(argv);
  const labels = distinctLabels(variants.map((v) => v.label));
  const builds = variants.map((v, i) => ({
    ...v,
    label: `gateway ${labels[i] as string}`,
    main: buildOf(v.ref, i),
  }));
  for (const { label, main } of builds) if (!existsSync(main)) throw new Error(`${label}: no build at ${main}`);
  for (const { label, env } of builds)
    for (const name of VGDB_NAMING)
      if (name in env)
        throw new KnobError(`${label}: ${name} cannot be set here (callgrind_control finds processes by it)`);
  for (const name of VGDB_NAMING) delete process.env[name];
  process.env.HOST = '127.0.0.1';

  const tempDir = mkdtempSync(join(os.tmpdir(), 'oapi-bench-instructions-'));
  rmSync(PROFILES_DIR, { recursive: true, force: true });
  mkdirSync(PROFILES_DIR, { recursive: true });
  // Whatever ends the run, no process under valgrind outlives it and the temporary files go.
  process.once('exit', () => {
    killAllChildrenNow();
    rmSync(tempDir, { recursive: true, force: true });
  });
  stopChildrenOnSignal('bench:instructions');
  const keys = apiKeys(64);
  const workloads = [quoteWorkload(keys), tokenWorkload(keys)];
  try {
    const redis = await startRedis(tempDir);
    const serversDir = compileServers();
    const upstream = await forkServer('upstream', serversDir, 'upstream.js');
    const limits = writeBenchLimits(tempDir);
    const serverTarget = (label: string, file: string): Target => ({
      label,
      start: (callgrind) => forkServer(label, serversDir, file, [upstream.url], [], callgrind.launcher()),
    });
    const gatewayTarget = (build: (typeof builds)[number], position: number): Target => ({
      label: build.label,
      start: (callgrind) =>
        startGateway(
          {
            REDIS_URL: redis.url,
            REDIS_KEY_PREFIX: `oapi-instructions-${position}:`,
            EQT_BRIDGE_URL: upstream.url,
            FNO_BRIDGE_URL: upstream.url,
            API_KEY_MODE: 'any',
            LOG_LEVEL: 'info',
            LIMITS_FILE: limits,
            ...build.env,
          },
          {
            nodeArgs: build.nodeArgs,
            name: build.label,
            entry: build.main,
            launcher: callgrind.launcher(),
          },
        ),
    });
    const targets = [
      serverTarget(BARE, 'bare-proxy.js'),
      serverTarget(FLOOR, 'hono-floor.js'),
      ...builds.map(gatewayTarget),
    ];
    log(
      `counting instructions: each target alone under callgrind, ${knobs.warmup} requests of each workload uncounted, then ${knobs.windows} windows of ${knobs.requests} counted (the median window is the figure), ${knobs.connections} connections`,
    );
    const counted: Counted[] = [];
    for (const [position, target] of targets.entries())
      counted.push(...(await countTarget(target, tempDir, position, workloads, knobs)));
    log('');
    for (const line of instructionTable(
      counted,
      workloads,
      targets.map((t) => t.label),
    ))
      log(line);
    log('');
    log('main thread: where the event loop and all JavaScript run, and what limits a process at full load.');
    log(
      `each window's main-thread profile is in ${relative(process.cwd(), PROFILES_DIR)} (callgrind_annotate --inclusive=no FILE)`,
    );
  } finally {
    await stopAllChildren();
  }
}

main().catch((err: unknown) => reportFailure('bench:instructions', err));
