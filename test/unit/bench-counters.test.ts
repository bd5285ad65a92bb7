import { describe, expect, it } from 'vitest';
import { commandDiff, cpuSecondsOfInfo } from '../../bench/counters.js';

// An INFO cpu answer of Redis 7.0, as it comes over the wire (CRLF line ends).
const INFO_CPU = [
  '# CPU',
  'used_cpu_sys:0.094657',
  'used_cpu_user:1.174907',
  'used_cpu_sys_children:0.000000',
  'used_cpu_user_children:0.000000',
  'used_cpu_sys_main_thread:0.094345',
  'used_cpu_user_main_thread:1.174995',
  '',
].join('\r\n');

describe('bench Redis counters', () => {
  it("adds Redis's user and system CPU, not its children's or the main thread's again", () => {
    expect(cpuSecondsOfInfo(INFO_CPU)).toBeCloseTo(1.269564, 6);
  });

  it('refuses an answer without the fields rather than reporting NaN', () => {
    expect(() => cpuSecondsOfInfo('# CPU\r\nused_cpu_sys:0.1\r\n')).toThrow('INFO cpu has no used_cpu_user');
  });

  it("leaves the benchmark's own INFO calls out of a command diff", () => {
    expect(commandDiff({ info: 3, evalsha: 10 }, { info: 9, evalsha: 12, hset: 4 })).toEqual({ evalsha: 2, hset: 4 });
  });
});
