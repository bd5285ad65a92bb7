import { readFileSync } from 'node:fs';

/**
 * Where the CPU of the gateway and of the hono floor goes, from V8 CPU profiles (`node --cpu-prof`,
 * which the benchmark passes to both with BENCH_PROFILE=1): the sampled time of the main thread, by
 * who ran it — a package, a part of Node.js, a module of the gateway, GC — in microseconds per
 * request, and the two side by side: what the gateway costs on top of the stack it is built on,
 * part by part. Self time only: each sample counts once, for the function that was running.
 */

interface CallFrame {
  readonly functionName: string;
  readonly url: string;
}

interface ProfileNode {
  readonly id: number;
  readonly callFrame: CallFrame;
}

export interface CpuProfile {
  readonly nodes: readonly ProfileNode[];
  /** Microseconds on the monotonic clock that `process.hrtime` reads, in every process of the machine. */
  readonly startTime: number;
  readonly samples: readonly number[];
  /** Microseconds since the previous sample (the first: since startTime). */
  readonly timeDeltas: readonly number[];
}

export interface ProfilePart {
  readonly part: string;
  readonly usPerRequest: number;
}

const NODE_GROUPS: ReadonlyArray<[RegExp, string]> = [
  [/^node:_http_/, 'node: http'],
  [/^node:(net|internal\/stream_base_commons)$/, 'node: net'],
  [/^node:(stream|internal\/streams\/)/, 'node: streams'],
  [/^node:events$/, 'node: events'],
  [/^node:(timers|internal\/timers)$/, 'node: timers'],
  [/^node:internal\/process\/task_queues$/, 'node: nextTick queue'],
];

/** Who ran a sampled function. `undefined`: the thread was idle (not counted). */
export function partOf(frame: CallFrame): string | undefined {
  const { url, functionName } = frame;
  if (functionName === '(idle)') return undefined;
  if (functionName === '(garbage collector)') return 'garbage collection';
  if (!url)
    return functionName === '(program)' ? 'V8 and native code outside JS' : `native: ${functionName || '(anonymous)'}`;
  if (url.startsWith('node:')) return NODE_GROUPS.find(([pattern]) => pattern.test(url))?.[1] ?? 'node: other';
  const pkg = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url);
  if (pkg?.[1]) return pkg[1];
  // The gateway's compiled modules, by their folder under src/ (dist/ mirrors it).
  const folder = /\/dist\/([^/]+)\/.+\.js$/.exec(url);
  if (folder?.[1]) return `gateway: src/${folder[1]}`;
  if (/\/dist\/[^/]+\.js$/.test(url)) return 'gateway: src';
  return 'other';
}

/**
 * The parts of the samples taken up to `untilUs` (on the profile's clock; all of them by default),
 * per request of the `requests` answered in that time.
 */
export function summariseProfile(profile: CpuProfile, requests: number, untilUs = Infinity): ProfilePart[] {
  const frames = new Map(profile.nodes.map((node) => [node.id, node.callFrame]));
  const byPart = new Map<string, number>();
  let at = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    const us = profile.timeDeltas[i] ?? 0;
    at += us;
    if (at > untilUs) break;
    const frame = frames.get(profile.samples[i] as number);
    const part = frame ? partOf(frame) : 'other';
    if (part === undefined) continue;
    byPart.set(part, (byPart.get(part) ?? 0) + us);
  }
  const n = Math.max(1, requests);
  return [...byPart]
    .map(([part, us]) => ({ part, usPerRequest: us / n }))
    .sort((a, b) => b.usPerRequest - a.usPerRequest);
}

export function readProfile(path: string): CpuProfile {
  return JSON.parse(readFileSync(path, 'utf8')) as CpuProfile;
}

/** One part in both profiles, per request. */
export interface PartDifference {
  readonly part: string;
  readonly floorUs: number;
  readonly gatewayUs: number;
}

/** Every part of either profile, the largest excess of the gateway over the floor first. */
export function compareProfiles(floor: readonly ProfilePart[], gateway: readonly ProfilePart[]): PartDifference[] {
  const rows = new Map<string, { floorUs: number; gatewayUs: number }>();
  for (const p of floor) rows.set(p.part, { floorUs: p.usPerRequest, gatewayUs: 0 });
  for (const p of gateway) rows.set(p.part, { floorUs: rows.get(p.part)?.floorUs ?? 0, gatewayUs: p.usPerRequest });
  return [...rows]
    .map(([part, r]) => ({ part, ...r }))
    .sort((a, b) => b.gatewayUs - b.floorUs - (a.gatewayUs - a.floorUs));
}

/**
 * The `shown` parts whose difference is largest either way one per line (the gateway's excess
 * first, then where it costs less than the floor), the rest together, then the totals.
 */
export function differenceLines(rows: readonly PartDifference[], shown = 22): string[] {
  const difference = (r: PartDifference): number => r.gatewayUs - r.floorUs;
  const line = (name: string, floorUs: number, gatewayUs: number): string =>
    `  ${name.padEnd(40)} ${floorUs.toFixed(1).padStart(8)} ${gatewayUs.toFixed(1).padStart(9)} ${(gatewayUs - floorUs).toFixed(1).padStart(10)}`;
  const sum = (list: readonly PartDifference[], field: 'floorUs' | 'gatewayUs'): number =>
    list.reduce((total, r) => total + r[field], 0);
  const largest = new Set([...rows].sort((a, b) => Math.abs(difference(b)) - Math.abs(difference(a))).slice(0, shown));
  const lines = [
    `  ${'µs per request'.padEnd(40)} ${'floor'.padStart(8)} ${'gateway'.padStart(9)} ${'difference'.padStart(10)}`,
  ];
  for (const r of rows.filter((row) => largest.has(row))) lines.push(line(r.part, r.floorUs, r.gatewayUs));
  const rest = rows.filter((row) => !largest.has(row));
  if (rest.length > 0) lines.push(line(`(${rest.length} more)`, sum(rest, 'floorUs'), sum(rest, 'gatewayUs')));
  lines.push(line('total sampled on the main thread', sum(rows, 'floorUs'), sum(rows, 'gatewayUs')));
  return lines;
}
