import { execFileSync } from 'node:child_process';
import { copyFileSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { KnobError } from './knobs.js';
import type { Launcher } from './processes.js';

/**
 * A process under valgrind's callgrind, which counts the machine instructions each of its threads
 * executes: the same figure for the same code and requests whatever else the machine is doing
 * (docs/performance.md "Counting instructions"). The process starts with counting off (it runs
 * many times faster so, for the JIT's warm-up); `callgrind_control` switches it on, zeroes the
 * counters and dumps them, one file per thread.
 */

/**
 * The callgrind options BENCH_INSTR_CALLGRIND may add: they change how costs are attributed or
 * written into a dump, never what a window counts. (Others would: a dump or a zeroing of their own
 * shifts the numbered dump files the benchmark reads, a toggle counts part of a window only.)
 */
const ATTRIBUTION_OPTIONS =
  /^--(separate-callers[0-9]*|separate-recs[0-9]*|fn-skip|dump-instr|dump-line|compress-strings|compress-pos)=\S+$/;

/**
 * Further callgrind options (BENCH_INSTR_CALLGRIND, separated by spaces: a function with spaces
 * in its name is given with wildcards), e.g. `--separate-callers6=*Runtime_*`: V8's runtime
 * functions told apart by their callers, which names the JavaScript that calls them
 * (docs/performance.md "Counting instructions").
 */
export function callgrindOptions(raw: string | undefined): string[] {
  const options = (raw ?? '').split(' ').filter(Boolean);
  for (const option of options)
    if (!ATTRIBUTION_OPTIONS.test(option))
      throw new KnobError(
        `BENCH_INSTR_CALLGRIND: "${option}" is not one it takes (--separate-callers[N], --separate-recs[N], --fn-skip, ` +
          '--dump-instr, --dump-line, --compress-strings or --compress-pos, each =value): others change what a window counts',
      );
  return options;
}

/** Instructions of one dump: the main thread's (where the event loop and all JavaScript run) and all threads'. */
export interface InstructionCount {
  readonly mainThread: number;
  readonly allThreads: number;
}

export class Callgrind {
  readonly #dir: string;
  readonly #name: string;
  #dumps = 0;
  #pid: number | undefined;
  readonly #options: readonly string[];

  /** Its files go to `dir` (a temporary directory), named after `name`; `options` are callgrind's own, from callgrindOptions. */
  constructor(dir: string, name: string, options: readonly string[] = []) {
    this.#dir = dir;
    this.#name = name;
    this.#options = options;
  }

  /** valgrind in front of `program` (node, or redis-server: bench/script.ts). */
  launcher(program: string = process.execPath): Launcher {
    return {
      command: 'valgrind',
      args: [
        '--tool=callgrind',
        '--quiet',
        '--separate-threads=yes',
        '--instr-atstart=no',
        `--vgdb-prefix=${this.#vgdbPrefix()}`,
        `--callgrind-out-file=${join(this.#dir, `${this.#name}.out`)}`,
        ...this.#options,
        program,
      ],
      // Node starts some ten times slower under valgrind.
      startTimeoutMs: 180_000,
    };
  }

  /** The process started with launcher(). */
  attach(pid: number): void {
    this.#pid = pid;
  }

  /** Counting on, from zero. */
  start(): void {
    this.#control('--instr=on');
    this.#control('--zero');
  }

  /** Zeroes the counters. */
  zero(): void {
    this.#control('--zero');
  }

  /**
   * The instructions since the counters were last zeroed. The main thread's profile is copied to
   * `keepMainThreadAs` (callgrind_annotate reads it); the dump's own files are removed.
   */
  dump(keepMainThreadAs: string): InstructionCount {
    this.#dumps++;
    this.#control(`--dump=${this.#dumps}`);
    const prefix = `${this.#name}.out.${this.#dumps}-`;
    const files = readdirSync(this.#dir)
      .filter((file) => file.startsWith(prefix))
      .map((file) => join(this.#dir, file));
    try {
      // Thread 1 is the main thread (--separate-threads=yes numbers them from 01).
      const main = join(this.#dir, `${prefix}01`);
      if (!files.includes(main)) throw new Error(`callgrind wrote no ${prefix}01 (main thread) file`);
      let mainThread = 0;
      let allThreads = 0;
      for (const file of files) {
        const instructions = summaryOf(readFileSync(file, 'utf8'));
        allThreads += instructions;
        if (file === main) mainThread = instructions;
      }
      copyFileSync(main, keepMainThreadAs);
      return { mainThread, allThreads };
    } finally {
      for (const file of files) rmSync(file, { force: true });
    }
  }

  #vgdbPrefix(): string {
    return join(this.#dir, `${this.#name}-vgdb`);
  }

  #control(action: string): void {
    if (this.#pid === undefined) throw new Error(`${this.#name}: no process attached`);
    // vgdb finds the process by FIFO names made of LOGNAME or USER and HOST (or HOSTNAME) as the
    // process saw them: callgrind_control must run with the same (bench/instructions.ts gives every
    // process it starts, and itself, the same).
    const said = execFileSync('callgrind_control', [`--vgdb-prefix=${this.#vgdbPrefix()}`, action, String(this.#pid)], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'pipe'],
      timeout: 60_000,
    });
    // It exits 0 whatever happened; what it says tells.
    if (!said.includes('OK.')) throw new Error(`callgrind_control ${action} ${this.#pid}: ${said.trim()}`);
  }
}

/**
 * The window of median main-thread instructions, and the lowest and highest of them. Now and then
 * a window costs the gateway up to half as much again (garbage collection, and code running
 * unoptimized again: docs/performance.md "Counting instructions"); the median leaves it out.
 */
export function medianWindow(windows: readonly InstructionCount[]): {
  median: InstructionCount;
  range: readonly [number, number];
} {
  const sorted = [...windows].sort((a, b) => a.mainThread - b.mainThread);
  const median = sorted[Math.floor((sorted.length - 1) / 2)];
  if (!median) throw new Error('no window was counted');
  return { median, range: [sorted[0]?.mainThread ?? 0, sorted[sorted.length - 1]?.mainThread ?? 0] };
}

/** The `summary:` line of a callgrind output file: its instruction count. */
export function summaryOf(text: string): number {
  const match = /^summary: (\d+)/m.exec(text);
  if (!match) throw new Error('callgrind output without a summary line');
  return Number(match[1]);
}
