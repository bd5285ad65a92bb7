import { readFileSync } from 'node:fs';

/**
 * Where the gateway's CPU goes, from a V8 CPU profile (`node --cpu-prof`, which the benchmark
 * passes with BENCH_PROFILE=1): the sampled time of the main thread, by who ran it — a package,
 * a part of Node.js, a module of the gateway, GC — in microseconds per request. Self time only:
 * each sample counts once, for the function that was running.
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
  readonly samples: readonly number[];
  /** Microseconds since the previous sample. */
  readonly timeDeltas: readonly number[];
}

export interface ProfilePart {
  readonly part: string;
  readonly usPerRequest: number;
  /** Of the sampled busy time. */
  readonly share: number;
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

export function summariseProfile(profile: CpuProfile, requests: number): ProfilePart[] {
  const frames = new Map(profile.nodes.map((node) => [node.id, node.callFrame]));
  const byPart = new Map<string, number>();
  let busy = 0;
  profile.samples.forEach((id, i) => {
    const frame = frames.get(id);
    const part = frame ? partOf(frame) : 'other';
    if (part === undefined) return;
    const us = profile.timeDeltas[i] ?? 0;
    busy += us;
    byPart.set(part, (byPart.get(part) ?? 0) + us);
  });
  const n = Math.max(1, requests);
  return [...byPart]
    .map(([part, us]) => ({ part, usPerRequest: us / n, share: busy > 0 ? us / busy : 0 }))
    .sort((a, b) => b.usPerRequest - a.usPerRequest);
}

export function readProfile(path: string): CpuProfile {
  return JSON.parse(readFileSync(path, 'utf8')) as CpuProfile;
}

/** The largest parts one per line, the rest together. */
export function profileLines(parts: readonly ProfilePart[], shown = 22): string[] {
  const total = parts.reduce((sum, p) => sum + p.usPerRequest, 0);
  const line = (name: string, us: number, share: number): string =>
    `  ${name.padEnd(40)} ${us.toFixed(1).padStart(7)} µs  ${(share * 100).toFixed(1).padStart(5)} %`;
  const lines = parts.slice(0, shown).map((p) => line(p.part, p.usPerRequest, p.share));
  const rest = parts.slice(shown);
  if (rest.length > 0) {
    lines.push(
      line(
        `(${rest.length} more)`,
        rest.reduce((s, p) => s + p.usPerRequest, 0),
        rest.reduce((s, p) => s + p.share, 0),
      ),
    );
  }
  lines.push(line('total sampled on the main thread', total, 1));
  return lines;
}
