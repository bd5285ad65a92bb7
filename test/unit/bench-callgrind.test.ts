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

  it('takes further callgrind options that change only how costs are attributed, and refuses any other', () => {
    expect(callgrindOptions(undefined)).toEqual([]);
    expect(callgrindOptions(' --separate-callers6=*Runtime_*  --dump-instr=yes --fn-skip=*Builtins_CEntry*')).toEqual([
      '--separate-callers6=*Runtime_*',
      '--dump-instr=yes',
      '--fn-skip=*Builtins_CEntry*',
    ]);
    // Set by the benchmark itself, or a dump or zeroing of their own (the benchmark reads its dumps by number),
    // or a count of part of a window.
    for (const option of [
      '--callgrind-out-file=x',
      '--instr-atstart=yes',
      '--dump-every-bb=20000000',
      '--dump-before=f',
      '--zero-before=f',
      '--combine-dumps=yes',
      '--toggle-collect=f',
      '--vgdb=no',
      '--separate-callers6',
      'node',
    ])
      expect(() => callgrindOptions(option)).toThrow(`BENCH_INSTR_CALLGRIND: "${option}" is not one it takes`);
  });
});
