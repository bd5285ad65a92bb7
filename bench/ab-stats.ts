import { mean, median } from './stats.js';

/**
 * What `npm run bench:ab` makes of its samples (docs/performance.md "Measuring a small change").
 * Two processes of the same build differ by 5 % and more in CPU per request, and keep their
 * difference for their whole life, so a build is measured as several processes: each process's figure is the median of its rounds, and a build's is the
 * mean of its processes', shown with their spread so that a difference between builds can be
 * read against the difference within one.
 */

/** CPU microseconds per request of one process, one value per measured round. */
export interface ProcessSamples {
  readonly build: string;
  readonly cpuUsPerRequest: readonly number[];
  readonly reqPerSec: readonly number[];
  /** Redis's CPU microseconds per request in the same rounds (only the process measured uses Redis then). */
  readonly redisUsPerRequest: readonly number[];
}

export interface BuildSummary {
  readonly build: string;
  /** Mean over the build's processes of each process's median round. */
  readonly cpuUsPerRequest: number;
  /** The lowest and highest of those process medians. */
  readonly processRange: readonly [number, number];
  readonly reqPerSec: number;
  /** Mean over the build's processes of each process's median round of Redis's CPU per request. */
  readonly redisUsPerRequest: number;
  /** cpuUsPerRequest less the first build's (negative: cheaper). */
  readonly difference: number;
  /** difference as a share of the first build's figure. */
  readonly relative: number;
}

/** One summary per build, in the order the builds first appear; differences are to the first. */
export function summariseBuilds(samples: readonly ProcessSamples[]): BuildSummary[] {
  const builds = [...new Set(samples.map((s) => s.build))];
  const figures = builds.map((build) => {
    const processes = samples.filter((s) => s.build === build);
    const cpu = processes.map((p) => median(p.cpuUsPerRequest));
    return {
      build,
      cpuUsPerRequest: mean(cpu),
      processRange: [Math.min(...cpu), Math.max(...cpu)] as const,
      reqPerSec: mean(processes.map((p) => median(p.reqPerSec))),
      redisUsPerRequest: mean(processes.map((p) => median(p.redisUsPerRequest))),
    };
  });
  const reference = figures[0]?.cpuUsPerRequest ?? Number.NaN;
  return figures.map((f) => ({
    ...f,
    difference: f.cpuUsPerRequest - reference,
    relative: (f.cpuUsPerRequest - reference) / reference,
  }));
}

/**
 * The order of the processes under test in one round: rotated by one each round, so that no
 * process always follows the same one (the one measured just before leaves the machine warmer or
 * colder for the next).
 */
export function roundOrder<T>(processes: readonly T[], round: number): T[] {
  if (processes.length === 0) return [];
  const k = round % processes.length;
  return [...processes.slice(k), ...processes.slice(0, k)];
}

/** A git ref or a target's label as a file or directory name under .bench/. */
export function fileNameOf(ref: string): string {
  return ref.replace(/[^\w.-]+/g, '_');
}

/** The builds' labels as reports name them: a label given twice (an A/A run) is the second time labelled with its position. */
export function distinctLabels(given: readonly string[]): string[] {
  return given.map((label, i) => (given.indexOf(label) === i ? label : `${label}#${i + 1}`));
}

/** One build under test: a ref, and the node flags and environment its processes run with. */
export interface Variant {
  readonly ref: string;
  readonly nodeArgs: readonly string[];
  readonly env: Readonly<Record<string, string>>;
  /** The ref with its flags and environment, as given: how the report names it. */
  readonly label: string;
}

/**
 * The command line of `npm run bench:ab`: refs, each followed by the node flags (`--…`) and
 * environment variables (`NAME=value`) its processes run with, so that a flag can be measured
 * like a change: `. . --max-semi-space-size=8` is this checkout twice, the second with the flag.
 */
export function parseVariants(argv: readonly string[]): Variant[] {
  const variants: Array<{ ref: string; nodeArgs: string[]; env: Record<string, string>; words: string[] }> = [];
  for (const word of argv) {
    const last = variants[variants.length - 1];
    const env = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(word);
    if (word.startsWith('-') || env) {
      if (!last) throw new Error(`${word}: a node flag or variable comes after the ref it is for`);
      if (env) last.env[env[1] as string] = env[2] as string;
      else last.nodeArgs.push(word);
      last.words.push(word);
    } else variants.push({ ref: word, nodeArgs: [], env: {}, words: [word] });
  }
  return variants.map(({ ref, nodeArgs, env, words }) => ({ ref, nodeArgs, env, label: words.join(' ') }));
}
