import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { secondsUntil, WindowCalendar } from '../../src/limits/windows.js';

const at = (iso: string): number => new Date(iso).getTime();
const iso = (ms: number): string => new Date(ms).toISOString();

describe('WindowCalendar', () => {
  it('uses clock hours and days from 00:00 in UTC', () => {
    const w = new WindowCalendar('UTC').at(at('2026-11-22T10:17:45.123Z'));
    expect([iso(w.hourStart), iso(w.hourEnd), iso(w.dayStart), iso(w.dayEnd)]).toEqual([
      '2026-11-22T10:00:00.000Z',
      '2026-11-22T11:00:00.000Z',
      '2026-11-22T00:00:00.000Z',
      '2026-11-23T00:00:00.000Z',
    ]);
  });

  it('starts the day at local midnight of the table timezone (Vietnam, UTC+7)', () => {
    const w = new WindowCalendar('Asia/Ho_Chi_Minh').at(at('2026-11-22T18:30:00Z'));
    expect(iso(w.dayStart)).toBe('2026-11-22T17:00:00.000Z');
    expect(iso(w.dayEnd)).toBe('2026-11-23T17:00:00.000Z');
  });

  it('starts local clock hours at :30 UTC in a UTC+05:30 zone', () => {
    const w = new WindowCalendar('Asia/Kolkata').at(at('2026-11-22T10:17:00Z'));
    expect([iso(w.hourStart), iso(w.hourEnd)]).toEqual(['2026-11-22T09:30:00.000Z', '2026-11-22T10:30:00.000Z']);
  });

  it('has 23- and 25-hour days where daylight saving time changes', () => {
    const ny = new WindowCalendar('America/New_York');
    const spring = ny.at(at('2026-03-08T12:00:00Z'));
    expect((spring.dayEnd - spring.dayStart) / 3_600_000).toBe(23);
    const autumn = ny.at(at('2026-11-01T12:00:00Z'));
    expect((autumn.dayEnd - autumn.dayStart) / 3_600_000).toBe(25);
    // Every hour window is one hour long, including the repeated hour.
    const repeated = ny.at(at('2026-11-01T06:30:00Z'));
    expect(repeated.hourEnd - repeated.hourStart).toBe(3_600_000);
  });

  it("is in an hour that has not ended where clocks go back half an hour (regression: Lord Howe Island's repeated half hour got the hour before)", () => {
    // 2025-04-06 02:00 at +11:00 became 01:30 at +10:30, at 15:00 UTC.
    const w = new WindowCalendar('Australia/Lord_Howe').at(at('2025-04-05T15:05:00Z'));
    expect([iso(w.hourStart), iso(w.hourEnd)]).toEqual(['2025-04-05T14:30:00.000Z', '2025-04-05T15:30:00.000Z']);
  });

  it('keeps one day across a midnight that comes twice (regression: in Havana, where clocks go back from 01:00 to 00:00, the day started again an hour in)', () => {
    // 2026-11-01 01:00 at -04:00 became 00:00 at -05:00, at 05:00 UTC.
    const havana = new WindowCalendar('America/Havana');
    const first = havana.at(at('2026-11-01T04:30:00Z'));
    const second = havana.at(at('2026-11-01T05:30:00Z'));
    expect([iso(second.dayStart), iso(second.dayEnd)]).toEqual([
      '2026-11-01T04:00:00.000Z',
      '2026-11-02T05:00:00.000Z',
    ]);
    expect(second.dayStart).toBe(first.dayStart);
    expect(havana.at(at('2026-10-31T12:00:00Z')).dayEnd).toBe(first.dayStart);
  });

  it('always gives windows that hold the instant, an hour long and a day of 23 to 25 hours, in zones with odd offsets and DST', () => {
    const zones = [
      'UTC',
      'Asia/Ho_Chi_Minh',
      'Asia/Kolkata',
      'Asia/Kathmandu',
      'Pacific/Chatham',
      'Australia/Lord_Howe',
      'America/New_York',
      'America/Santiago',
      'Asia/Beirut',
      'America/Havana',
    ];
    const calendars = zones.map((zone) => new WindowCalendar(zone));
    const instants = fc.integer({ min: at('2024-01-01T00:00:00Z'), max: at('2028-01-01T00:00:00Z') });
    fc.assert(
      fc.property(fc.constantFrom(...calendars), instants, (calendar, now) => {
        const w = calendar.at(now);
        expect(w.hourStart).toBeLessThanOrEqual(now);
        expect(now).toBeLessThan(w.hourEnd);
        expect(w.hourEnd - w.hourStart).toBe(3_600_000);
        expect(w.dayStart).toBeLessThanOrEqual(now);
        expect(now).toBeLessThan(w.dayEnd);
        expect(w.dayEnd - w.dayStart).toBeGreaterThanOrEqual(23 * 3_600_000);
        expect(w.dayEnd - w.dayStart).toBeLessThanOrEqual(25 * 3_600_000);
        // Days follow one another: the day before this one ends where this one starts.
        expect(calendar.at(w.dayStart - 1).dayEnd).toBe(w.dayStart);
      }),
      { numRuns: 3000 },
    );
  });

  it('moves to the next window exactly at the boundary', () => {
    const calendar = new WindowCalendar('UTC');
    const before = calendar.at(at('2026-11-22T10:59:59.999Z'));
    const after = calendar.at(at('2026-11-22T11:00:00.000Z'));
    expect(after.hourStart).toBe(before.hourEnd);
    const lastOfDay = calendar.at(at('2026-11-22T23:59:59.999Z'));
    const nextDay = calendar.at(at('2026-11-23T00:00:00.000Z'));
    expect(nextDay.dayStart).toBe(lastOfDay.dayEnd);
  });

  it('refuses an unknown timezone', () => {
    expect(() => new WindowCalendar('Mars/Olympus')).toThrow('unknown timezone "Mars/Olympus"');
  });
});

describe('secondsUntil', () => {
  it('rounds up, so a window still open never reads 0', () => {
    expect(secondsUntil(10_000, 9_999)).toBe(1);
    expect(secondsUntil(10_000, 8_000)).toBe(2);
    expect(secondsUntil(10_000, 10_000)).toBe(0);
  });
});
