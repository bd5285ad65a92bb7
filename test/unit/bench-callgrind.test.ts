import { describe, expect, it } from 'vitest';
import { callgrindOptions, medianWindow, summaryOf } from '../../bench/callgrind.js';

/** The figures `npm run bench:instructions` takes from callgrind's dumps (bench/callgrind.ts). */

describe('bench callgrind figures', () => {
  it('reads the instruction count of a dump from its summary line', () => {
    const dump =
      'version: 1\ncreator: callgrind-3.19.0\nthread: 1\nevents: Ir\nsummary: 549222628\ntotals: 549222635\n';
    expect(summaryOf(dump)).toBe(549_222_628);
    expect(() => summaryOf('events: Ir\n')).toThrow('without a summary line');
  });

  it('takes the median window by main-thread instructions, leaving out a window far above the others', () => {
    const windows = [
      { mainThread: 274_600, allThreads: 276_000 },
      { mainThread: 326_300, allThreads: 390_000 },
      { mainThread: 276_100, allThreads: 277_100 },
    ];
    expect(medianWindow(windows)).toEqual({
      median: { mainThread: 276_100, allThreads: 277_100 },
      range: [274_600, 326_300],
    });
    expect(medianWindow([{ mainThread: 5, allThreads: 6 }])).toEqual({
      median: { mainThread: 5, allThreads: 6 },
      range: [5, 5],
    });
    // Of an even number, the lower middle one.
    expect(medianWindow(windows.slice(0, 2)).median.mainThread).toBe(274_600);
    expect(() => medianWindow([])).toThrow('no window was counted');
  });

  it('takes further callgrind options, and refuses one the benchmark sets or one that is not an option', () => {
    expect(callgrindOptions(undefined)).toEqual([]);
    expect(callgrindOptions(' --separate-callers6=*Runtime_*  --dump-instr=yes')).toEqual([
      '--separate-callers6=*Runtime_*',
      '--dump-instr=yes',
    ]);
    expect(() => callgrindOptions('--callgrind-out-file=x')).toThrow(
      'BENCH_INSTR_CALLGRIND: --callgrind-out-file is set by the benchmark itself',
    );
    expect(() => callgrindOptions('--instr-atstart=yes')).toThrow('--instr-atstart is set by the benchmark itself');
    expect(() => callgrindOptions('node')).toThrow(
      'BENCH_INSTR_CALLGRIND: "node" is not an option (--name or --name=value)',
    );
  });
});
