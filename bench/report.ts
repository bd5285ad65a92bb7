import type { CommandCounts } from './counters.js';
import { SPENT_ROUTE } from './limits.js';
import type { WorkloadName } from './load.js';

/**
 * What a run found, as data (written to .bench/last.json) and as the printed table with the
 * targets of the issue beside the figures.
 */

export type TargetName = 'direct' | 'bare' | 'floor' | 'gateway' | 'workers2';
export const TARGETS: readonly TargetName[] = ['direct', 'bare', 'floor', 'gateway', 'workers2'];
const TARGET_LABEL: Record<TargetName, string> = {
  direct: 'direct',
  bare: 'bare proxy',
  floor: 'hono floor',
  gateway: 'gateway',
  workers2: 'gateway ×2',
};
/** Targets whose requests go through a gateway (Redis figures are read for them). */
export const GATEWAYS: ReadonlySet<TargetName> = new Set(['gateway', 'workers2']);

export interface RoundResult {
  readonly round: number;
  readonly seconds: number;
  readonly completed: number;
  readonly sent: number;
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly cpuUsPerRequest: number;
  readonly statusCounts: Record<string, number>;
  readonly errors: number;
  readonly timeouts: number;
}

export interface RedisFigures {
  /** Requests the figures are divided by: those autocannon sent to the gateway. */
  readonly requests: number;
  /** Requests the gateway counted in oapi_gateway_requests_total over the same time. */
  readonly gatewayCounted: number;
  /** Redis's own CPU (INFO cpu) over the same time, per request: CPU the floor does not cost the machine. */
  readonly cpuUsPerRequest: number;
  readonly commands: CommandCounts;
  readonly commandsPerRequest: number;
  /** Lua scripts Redis ran (evalsha + eval), per request: below 1 when requests share a script call. */
  readonly scriptsPerRequest: number;
  /** oapi_gateway_store_calls_total over the same time, per request: each waits for one Redis reply. */
  readonly roundTripsPerRequest: number;
}

export interface TargetResult {
  readonly target: TargetName;
  readonly rounds: RoundResult[];
  readonly reqPerSec: number;
  readonly reqPerSecStdev: number;
  /** Over every response of the measured rounds together. */
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** CPU of the processes that answer the client (upstream, bare proxy, floor, gateway and its workers) per request sent. */
  readonly cpuUsPerRequest: number;
  readonly redis?: RedisFigures;
}

export interface WorkloadResult {
  readonly workload: WorkloadName;
  readonly label: string;
  readonly targets: Record<TargetName, TargetResult>;
}

export interface SpentKeyResult {
  readonly primingStatuses: number[];
  readonly seconds: number;
  readonly completed: number;
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly statusCounts: Record<string, number>;
  readonly cpuUsPerRequest: number;
  readonly redis: RedisFigures;
}

export interface Check {
  readonly name: string;
  readonly pass: boolean;
  readonly detail: string;
}

/** One memory figure (MB) of the gateway, the hono floor and the bare proxy: VmRSS at one moment, or VmHWM, the peak so far. */
export interface RssByTarget {
  readonly gateway: number;
  readonly floor: number;
  readonly bare: number;
}

export interface BenchResult {
  readonly startedAt: string;
  readonly machine: {
    cpuModel: string;
    cores: number;
    totalMemoryMB: number;
    node: string;
    os: string;
    redis: string;
    loadAverageStart: number[];
    loadAverageEnd: number[];
  };
  readonly settings: {
    durationSeconds: number;
    warmupSeconds: number;
    rounds: number;
    connections: number;
    apiKeys: number;
    clockTicksPerSecond: number;
    gatewayEnv: Record<string, string>;
    profiled: boolean;
  };
  readonly workloads: WorkloadResult[];
  readonly spentKey: SpentKeyResult;
  /** VmRSS after start-up; VmHWM, the peak; VmRSS after the last measurement (what stays once the load's transients are over). */
  readonly startRssMB: RssByTarget;
  readonly peakRssMB: RssByTarget;
  readonly endRssMB: RssByTarget;
  readonly checks: Check[];
  readonly problems: string[];
}

/** The targets of the speed issue, as ratios measured in one run (docs/performance.md). */
export const LIMITS = {
  vsBare: 0.65,
  vsFloor: 0.85,
  p99VsBare: 1.6,
  cpuVsBare: 1.5,
  rssMB: 100,
};

/** The targets, each judged on every workload. */
export function judge(workloads: readonly WorkloadResult[], spent: SpentKeyResult, peakRssMB: number): Check[] {
  const checks: Check[] = [];
  const each = (name: string, test: (w: WorkloadResult) => { pass: boolean; shown: string }): void => {
    const parts = workloads.map((w) => ({ w, ...test(w) }));
    checks.push({
      name,
      pass: parts.every((p) => p.pass),
      detail: parts.map((p) => `${p.w.workload} ${p.shown}`).join(', '),
    });
  };
  each(`gateway req/s ≥ ${LIMITS.vsBare}× bare proxy`, (w) => {
    const r = w.targets.gateway.reqPerSec / w.targets.bare.reqPerSec;
    return { pass: r >= LIMITS.vsBare, shown: `${r.toFixed(2)}×` };
  });
  each(`gateway req/s ≥ ${LIMITS.vsFloor}× hono floor`, (w) => {
    const r = w.targets.gateway.reqPerSec / w.targets.floor.reqPerSec;
    return { pass: r >= LIMITS.vsFloor, shown: `${r.toFixed(2)}×` };
  });
  each(`gateway p99 ≤ ${LIMITS.p99VsBare}× bare proxy p99`, (w) => {
    const r = w.targets.gateway.p99Ms / w.targets.bare.p99Ms;
    return { pass: r <= LIMITS.p99VsBare, shown: `${r.toFixed(2)}×` };
  });
  each(`gateway CPU/request ≤ ${LIMITS.cpuVsBare}× bare proxy`, (w) => {
    const r = w.targets.gateway.cpuUsPerRequest / w.targets.bare.cpuUsPerRequest;
    return {
      pass: r <= LIMITS.cpuVsBare,
      shown: `${r.toFixed(2)}× (${w.targets.gateway.cpuUsPerRequest.toFixed(0)} µs)`,
    };
  });
  checks.push({
    name: `gateway peak RSS ≤ ${LIMITS.rssMB} MB`,
    pass: peakRssMB <= LIMITS.rssMB,
    detail: `${peakRssMB.toFixed(1)} MB`,
  });
  each('1 Redis round trip per allowed request', (w) => {
    const rt = w.targets.gateway.redis?.roundTripsPerRequest ?? Number.NaN;
    // The divisor is requests sent; the few still in flight when a round stops make it inexact by a hair.
    return { pass: Math.abs(rt - 1) <= 0.01, shown: rt.toFixed(3) };
  });
  checks.push({
    name: '0 Redis round trips for a spent key',
    pass: spent.redis.roundTripsPerRequest === 0 && spent.redis.scriptsPerRequest === 0,
    detail: `${spent.redis.roundTripsPerRequest.toFixed(4)} over ${spent.redis.requests} requests`,
  });
  return checks;
}

function pad(text: string, width: number, right = false): string {
  return right ? text.padStart(width) : text.padEnd(width);
}

function fixed(value: number | undefined, digits: number): string {
  return value === undefined || !Number.isFinite(value) ? '–' : value.toFixed(digits);
}

function statusSummary(counts: Record<string, number>): string {
  return Object.entries(counts)
    .map(([status, n]) => `${status}×${n}`)
    .join(' ');
}

export function printReport(result: BenchResult, out: (line: string) => void): void {
  const { machine, settings } = result;
  out('');
  out(`oapi-gateway benchmark, ${result.startedAt}`);
  out(
    `machine: ${machine.cpuModel}, ${machine.cores} cores, ${machine.totalMemoryMB} MB, Node ${machine.node}, ${machine.os}, ${machine.redis}`,
  );
  out(
    `load average at start ${machine.loadAverageStart.map((l) => l.toFixed(2)).join(' ')}, at end ${machine.loadAverageEnd.map((l) => l.toFixed(2)).join(' ')}`,
  );
  out(
    `run: ${settings.rounds} measured rounds of ${settings.durationSeconds} s per target after a ${settings.warmupSeconds} s warm-up round, interleaved direct → bare → hono floor → gateway → gateway with WORKERS=2; ` +
      `${settings.connections} connections, ${settings.apiKeys} API keys`,
  );
  out(
    `gateway: node dist/main.js, LOG_LEVEL=${settings.gatewayEnv.LOG_LEVEL} (its log to /dev/null), API_KEY_MODE=${settings.gatewayEnv.API_KEY_MODE}, Redis of its own on loopback`,
  );
  if (settings.profiled)
    out(
      "BENCH_PROFILE=1: the gateway ran under V8's CPU profiler, which slows it: its figures in this run are not its usual ones",
    );
  out('');

  const header = [
    pad('workload', 8),
    pad('target', 11),
    pad('req/s', 8, true),
    pad('±', 6, true),
    pad('p50 ms', 7, true),
    pad('p99 ms', 7, true),
    pad('×direct', 8, true),
    pad('×bare', 6, true),
    pad('×floor', 7, true),
    pad('CPU µs/req¹', 12, true),
    pad('scripts/req', 12, true),
    pad('round trips/req', 16, true),
  ];
  out(header.join('  '));
  out('-'.repeat(header.join('  ').length));
  for (const w of result.workloads) {
    for (const name of TARGETS) {
      const t = w.targets[name];
      const vsDirect = t.reqPerSec / w.targets.direct.reqPerSec;
      const vsBare = name === 'direct' || name === 'bare' ? undefined : t.reqPerSec / w.targets.bare.reqPerSec;
      const vsFloor = GATEWAYS.has(name) ? t.reqPerSec / w.targets.floor.reqPerSec : undefined;
      out(
        [
          pad(name === 'direct' ? w.workload : '', 8),
          pad(TARGET_LABEL[name], 11),
          pad(t.reqPerSec.toFixed(0), 8, true),
          pad(t.reqPerSecStdev.toFixed(0), 6, true),
          pad(fixed(t.p50Ms, 2), 7, true),
          pad(fixed(t.p99Ms, 2), 7, true),
          pad(name === 'direct' ? '1.00' : fixed(vsDirect, 2), 8, true),
          pad(fixed(vsBare, 2), 6, true),
          pad(fixed(vsFloor, 2), 7, true),
          pad(fixed(t.cpuUsPerRequest, 0), 12, true),
          pad(fixed(t.redis?.scriptsPerRequest, 3), 12, true),
          pad(fixed(t.redis?.roundTripsPerRequest, 3), 16, true),
        ].join('  '),
      );
    }
  }
  out(
    '¹ CPU time (utime+stime from /proc) of the processes that answer the client: the upstream, the bare proxy, the hono floor, the gateway (with WORKERS=2: its primary and both workers).',
  );
  out(
    "  hono floor: hono + @hono/node-server + the gateway's own Forwarder (undici's Pool), nothing else — the cost of the chosen stack alone.",
  );
  out(
    '  req/s: mean over the measured rounds (± their standard deviation); p50/p99: over every response of those rounds.',
  );
  out('');

  out('WORKERS=2 beside one worker (requests per CPU-second of the gateway processes: throughput per core used):');
  for (const w of result.workloads) {
    const one = w.targets.gateway;
    const two = w.targets.workers2;
    out(
      `  ${pad(w.workload, 6)} 1 worker ${one.reqPerSec.toFixed(0)} req/s, ${(1e6 / one.cpuUsPerRequest).toFixed(0)} per CPU-second; ` +
        `2 workers ${two.reqPerSec.toFixed(0)} req/s (${(two.reqPerSec / one.reqPerSec).toFixed(2)}×), ${(1e6 / two.cpuUsPerRequest).toFixed(0)} per CPU-second`,
    );
  }
  out('');

  out('gateway and Redis, per request sent to the gateway (one worker):');
  for (const w of result.workloads) {
    const r = w.targets.gateway.redis;
    if (!r) continue;
    const perCommand = Object.entries(r.commands)
      .sort((a, b) => b[1] - a[1])
      .map(([cmd, n]) => `${cmd} ${(n / r.requests).toFixed(4)}`)
      .join(', ');
    out(
      `  ${pad(w.workload, 6)} ${r.requests} requests; round trips (oapi_gateway_store_calls_total) ${r.roundTripsPerRequest.toFixed(4)}; scripts run (evalsha+eval) ${r.scriptsPerRequest.toFixed(4)}; commands ${r.commandsPerRequest.toFixed(4)} [${perCommand}]; Redis CPU ${fixed(r.cpuUsPerRequest, 1)} µs`,
    );
  }
  const memory = (target: keyof RssByTarget): string =>
    `${TARGET_LABEL[target]} ${[result.startRssMB, result.peakRssMB, result.endRssMB].map((mb) => mb[target].toFixed(1)).join(' / ')}`;
  out(
    `  memory (MB RSS after start-up / peak (VmHWM) / after the last measurement): ` +
      `${memory('gateway')}; ${memory('floor')}; ${memory('bare')}`,
  );
  out('');

  const s = result.spentKey;
  out(`spent key (${SPENT_ROUTE}, hour window full; priming answers ${s.primingStatuses.join(', ')}):`);
  out(
    `  ${s.completed} requests in ${s.seconds.toFixed(1)} s: ${s.reqPerSec.toFixed(0)} req/s, p50 ${fixed(s.p50Ms, 2)} ms, p99 ${fixed(s.p99Ms, 2)} ms, answers ${statusSummary(s.statusCounts)}; ` +
      `Redis round trips/request ${s.redis.roundTripsPerRequest.toFixed(4)}, scripts/request ${s.redis.scriptsPerRequest.toFixed(4)}, commands/request ${s.redis.commandsPerRequest.toFixed(4)}, Redis CPU ${fixed(s.redis.cpuUsPerRequest, 1)} µs/request, ` +
      `gateway CPU ${fixed(s.cpuUsPerRequest, 0)} µs/request`,
  );
  out('');

  out('targets:');
  for (const check of result.checks) out(`  [${check.pass ? 'PASS' : 'FAIL'}] ${pad(check.name, 42)} ${check.detail}`);
  out('');
  if (result.problems.length === 0) out('problems seen: none');
  else {
    out('problems seen:');
    for (const p of result.problems) out(`  - ${p}`);
  }
}
