import { describe, expect, it } from 'vitest';
import { distinctLabels, fileNameOf, parseVariants, roundOrder, summariseBuilds } from '../../bench/ab-stats.js';
import { median } from '../../bench/stats.js';

describe('bench:ab comparison', () => {
  it('takes each process’s median round, a build’s mean over its processes, and differences to the first build', () => {
    const summary = summariseBuilds([
      // One round of the first process was disturbed (80): its median ignores it.
      { build: 'main', cpuUsPerRequest: [70, 71, 80], reqPerSec: [1000, 1010, 900], redisUsPerRequest: [9, 8, 20] },
      { build: 'main', cpuUsPerRequest: [74, 73, 75], reqPerSec: [950, 960, 940], redisUsPerRequest: [10, 11, 10] },
      { build: 'change', cpuUsPerRequest: [66, 67, 65], reqPerSec: [1100, 1090, 1110], redisUsPerRequest: [7, 7, 6] },
      { build: 'change', cpuUsPerRequest: [68, 69, 68], reqPerSec: [1050, 1040, 1060], redisUsPerRequest: [6, 5, 6] },
    ]);
    expect(summary.map((b) => b.build)).toEqual(['main', 'change']);
    const [main, change] = summary;
    expect(main).toMatchObject({
      cpuUsPerRequest: 72.5,
      processRange: [71, 74],
      reqPerSec: 975,
      redisUsPerRequest: 9.5,
      difference: 0,
    });
    expect(change).toMatchObject({
      cpuUsPerRequest: 67,
      processRange: [66, 68],
      reqPerSec: 1075,
      redisUsPerRequest: 6.5,
    });
    expect(change?.difference).toBeCloseTo(-5.5, 10);
    expect(change?.relative).toBeCloseTo(-5.5 / 72.5, 10);
  });

  it('finds the median of odd and even counts', () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(median([])).toBeNaN();
  });

  it('labels a build given twice (an A/A run) with its position the second time', () => {
    expect(distinctLabels(['main', '.', 'main', '. --x'])).toEqual(['main', '.', 'main#3', '. --x']);
  });

  it('rotates the order of the processes by one each round', () => {
    expect([0, 1, 2, 3].map((round) => roundOrder(['a', 'b', 'c'], round).join(''))).toEqual([
      'abc',
      'bca',
      'cab',
      'abc',
    ]);
    expect(roundOrder([], 5)).toEqual([]);
  });

  it('names a build directory after its ref without path separators', () => {
    expect(fileNameOf('origin/main~2')).toBe('origin_main_2');
    expect(fileNameOf('v1.2.3')).toBe('v1.2.3');
  });

  it('reads node flags and variables after a ref as that build’s, named as given', () => {
    expect(
      parseVariants([
        'main',
        '.',
        '--max-semi-space-size=8',
        'MALLOC_ARENA_MAX=2',
        '.',
        '--liftoff-only',
        'http_proxy=',
      ]),
    ).toEqual([
      { ref: 'main', nodeArgs: [], env: {}, label: 'main' },
      {
        ref: '.',
        nodeArgs: ['--max-semi-space-size=8'],
        env: { MALLOC_ARENA_MAX: '2' },
        label: '. --max-semi-space-size=8 MALLOC_ARENA_MAX=2',
      },
      { ref: '.', nodeArgs: ['--liftoff-only'], env: { http_proxy: '' }, label: '. --liftoff-only http_proxy=' },
    ]);
    expect(() => parseVariants(['--liftoff-only', 'main'])).toThrow(
      '--liftoff-only: a node flag or variable comes after the ref it is for',
    );
  });
});
