import type { Clock } from '../../src/limits/windows.js';

/** A clock the test moves by hand, for windows that would otherwise take an hour or a day. */
export class FakeClock implements Clock {
  #now: number;

  constructor(start: number | string | Date) {
    this.#now = new Date(start).getTime();
  }

  now(): number {
    return this.#now;
  }

  set(to: number | string | Date): void {
    this.#now = new Date(to).getTime();
  }

  advance(ms: number): void {
    this.#now += ms;
  }
}
