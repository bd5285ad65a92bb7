import type { InstructionCount } from './callgrind.js';
import type { Workload } from './load.js';

/** The table `npm run bench:instructions` prints (bench/instructions.ts). */

export interface Counted {
  readonly target: string;
  readonly workload: Workload;
  /** The median window's instructions per request. */
  readonly perRequest: InstructionCount;
  /** The lowest and highest main-thread instructions per request of its windows. */
  readonly range: readonly [number, number];
}

/** The names the gateway builds are compared with. */
export const BARE = 'bare proxy';
export const FLOOR = 'hono floor';

function thousands(instructions: number): string {
  return `${(instructions / 1000).toFixed(1)}k`;
}

function ratio(value: number, reference: number | undefined): string {
  return reference === undefined ? '' : `${(value / reference).toFixed(2)}×`;
}

/** One line per workload and target, in the order counted, with ratios to the bare proxy and the floor. */
export function instructionTable(
  counted: readonly Counted[],
  workloads: readonly Workload[],
  labels: readonly string[],
): string[] {
  const width = Math.max(12, ...labels.map((l) => l.length));
  const workloadWidth = Math.max(...workloads.map((w) => w.label.length));
  const lines = [
    `${'workload'.padEnd(workloadWidth)} ${'target'.padEnd(width)}  main thread   × bare  × floor  its windows     all threads   × bare  × floor`,
  ];
  for (const workload of workloads) {
    const rows = counted.filter((c) => c.workload === workload);
    const bare = rows.find((r) => r.target === BARE)?.perRequest;
    const floor = rows.find((r) => r.target === FLOOR)?.perRequest;
    for (const [i, row] of rows.entries()) {
      const { mainThread, allThreads } = row.perRequest;
      lines.push(
        [
          (i === 0 ? workload.label : '').padEnd(workloadWidth),
          row.target.padEnd(width),
          '',
          thousands(mainThread).padStart(11),
          ratio(mainThread, bare?.mainThread).padStart(8),
          ratio(mainThread, floor?.mainThread).padStart(8),
          ` ${(row.range[0] / 1000).toFixed(1)}–${thousands(row.range[1])}`.padEnd(15),
          thousands(allThreads).padStart(13),
          ratio(allThreads, bare?.allThreads).padStart(8),
          ratio(allThreads, floor?.allThreads).padStart(8),
        ].join(' '),
      );
    }
  }
  return lines;
}
