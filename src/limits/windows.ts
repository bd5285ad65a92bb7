import { DateTime, IANAZone } from 'luxon';

/**
 * Fixed windows of the limit table: each clock hour, and each day from 00:00, both in the
 * table's timezone (so a +05:30 zone has hours starting at :30 UTC, and a DST day lasts 23 or
 * 25 hours). Window boundaries are computed once per hour; the request path only compares
 * two numbers.
 */

export interface Clock {
  now(): number;
}

export const systemClock: Clock = { now: () => Date.now() };

/** The windows in force at one instant, in epoch milliseconds. */
export interface Windows {
  readonly hourStart: number;
  readonly hourEnd: number;
  readonly dayStart: number;
  readonly dayEnd: number;
}

export function isValidTimezone(zone: string): boolean {
  return IANAZone.isValidZone(zone);
}

export class WindowCalendar {
  readonly timezone: string;
  #current: Windows | undefined;

  constructor(timezone: string) {
    if (!isValidTimezone(timezone)) throw new Error(`unknown timezone "${timezone}"`);
    this.timezone = timezone;
  }

  at(now: number): Windows {
    const current = this.#current;
    if (
      current &&
      now >= current.hourStart &&
      now < current.hourEnd &&
      now >= current.dayStart &&
      now < current.dayEnd
    ) {
      return current;
    }
    const instant = DateTime.fromMillis(now, { zone: this.timezone });
    // The clock hour in progress, back to its :00 in the offset in force now. (luxon's startOf('hour')
    // reads a repeated local time in the earlier offset: where clocks go back half an hour, as on Lord
    // Howe Island, that hour would already have ended.) An hour later is the next clock hour, across DST too.
    const hourStart = now - (instant.minute * 60_000 + instant.second * 1000 + instant.millisecond);
    const day = instant.startOf('day');
    const windows: Windows = {
      hourStart,
      hourEnd: hourStart + 3_600_000,
      dayStart: firstOf(day),
      dayEnd: firstOf(day.plus({ days: 1 }).startOf('day')),
    };
    this.#current = windows;
    return windows;
  }
}

/**
 * The instant a local time first comes. (luxon reads a repeated local time in the offset in force:
 * where clocks go back from 01:00 to 00:00, as in Havana, the day would start again an hour in.)
 */
function firstOf(time: DateTime): number {
  return Math.min(time.toMillis(), ...time.getPossibleOffsets().map((t) => t.toMillis()));
}

/** Whole seconds until `end`, never 0 while the window is still open. */
export function secondsUntil(end: number, now: number): number {
  return Math.max(0, Math.ceil((end - now) / 1000));
}
