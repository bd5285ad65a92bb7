import { retryAfterSeconds, type Decision } from './limiter.js';
import { secondsUntil } from './windows.js';

/**
 * Usage headers of every counted response (INTERFACE §6): the `X-RateLimit-*` pairs, and the
 * IETF draft-ietf-httpapi-ratelimit-headers-11 `RateLimit-Policy` / `RateLimit` fields, whose
 * items are quoted policy names with `q` (quota), `w` (window seconds), `r` (remaining) and
 * `t` (seconds until reset) parameters.
 */

export type HeaderList = Array<[string, string]>;
type CountedDecision = Extract<Decision, { kind: 'counted' }>;

const DAY_SECONDS = 86_400;
const HOUR_SECONDS = 3_600;

export function rateLimitHeaders(decision: CountedDecision, now: number): HeaderList {
  const { hour, day } = decision;
  return [
    ['X-RateLimit-Limit-Hour', String(hour.limit)],
    ['X-RateLimit-Remaining-Hour', String(hour.remaining)],
    ['X-RateLimit-Limit-Day', String(day.limit)],
    ['X-RateLimit-Remaining-Day', String(day.remaining)],
    ['RateLimit-Policy', `"hour";q=${hour.limit};w=${HOUR_SECONDS}, "day";q=${day.limit};w=${DAY_SECONDS}`],
    [
      'RateLimit',
      `"hour";r=${hour.remaining};t=${secondsUntil(hour.resetAt, now)}, "day";r=${day.remaining};t=${secondsUntil(day.resetAt, now)}`,
    ],
  ];
}

/** `Retry-After` of a refusal: whole seconds, at least 1 (RFC 9110 §10.2.3). */
export function retryAfterHeader(decision: CountedDecision, now: number): [string, string] {
  return ['Retry-After', String(retryAfterSeconds(decision, now))];
}
