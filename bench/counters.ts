import type { Redis } from 'ioredis';

/**
 * Counters read around each measurement: Redis's per-command call counts (INFO
 * commandstats, which also counts the commands a Lua script runs) and the gateway's own
 * Prometheus counters.
 */

export type CommandCounts = Record<string, number>;

export async function commandCounts(redis: Redis): Promise<CommandCounts> {
  const text = await redis.info('commandstats');
  const counts: CommandCounts = {};
  for (const line of text.split('\n')) {
    const match = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    if (match?.[1] !== undefined) counts[match[1]] = Number(match[2]);
  }
  return counts;
}

/**
 * CPU seconds Redis has used since it started (INFO cpu: user + system, all its threads).
 * The gateway's counting costs Redis CPU that the floor and the bare proxy do not, and on the
 * benchmark's machine Redis shares the cores with everything else.
 */
export async function redisCpuSeconds(redis: Redis): Promise<number> {
  return cpuSecondsOfInfo(await redis.info('cpu'));
}

/** used_cpu_user + used_cpu_sys of an INFO cpu answer. */
export function cpuSecondsOfInfo(text: string): number {
  const field = (name: string): number => {
    const match = new RegExp(`^${name}:(\\d+(?:\\.\\d+)?)\\r?$`, 'm').exec(text);
    if (match?.[1] === undefined) throw new Error(`INFO cpu has no ${name}`);
    return Number(match[1]);
  };
  return field('used_cpu_user') + field('used_cpu_sys');
}

/**
 * What the measured process sent between two readings: our own INFO calls are left out
 * (nothing else on this Redis calls INFO during a run).
 */
export function commandDiff(before: CommandCounts, after: CommandCounts): CommandCounts {
  const diff: CommandCounts = {};
  for (const [name, calls] of Object.entries(after)) {
    if (name === 'info') continue;
    const delta = calls - (before[name] ?? 0);
    if (delta !== 0) diff[name] = delta;
  }
  return diff;
}

export function addCounts(into: CommandCounts, more: CommandCounts): void {
  for (const [name, calls] of Object.entries(more)) into[name] = (into[name] ?? 0) + calls;
}

export function totalCalls(counts: CommandCounts): number {
  return Object.values(counts).reduce((sum, n) => sum + n, 0);
}

/**
 * Lua scripts Redis ran for the counters. One per request when requests come one at a time; on
 * a single Redis the requests that come while a call is out share the next, so fewer under load.
 */
export function scriptCalls(counts: CommandCounts): number {
  return (counts.evalsha ?? 0) + (counts.eval ?? 0);
}

/** Sum of every sample of one Prometheus counter (all label sets), from the admin /metrics. */
export async function metricTotal(adminUrl: string, name: string): Promise<number> {
  const response = await fetch(`${adminUrl}/metrics`);
  if (!response.ok) throw new Error(`GET /metrics answered ${response.status}`);
  const text = await response.text();
  let total = 0;
  let found = false;
  for (const line of text.split('\n')) {
    if (line.startsWith(name + ' ') || line.startsWith(name + '{'))
      total += Number(line.slice(line.lastIndexOf(' ') + 1));
    else if (line === `# TYPE ${name} counter`) found = true;
  }
  if (!found) throw new Error(`/metrics has no ${name}`);
  return total;
}
