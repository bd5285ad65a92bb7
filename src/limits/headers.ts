import { retryAfterSeconds, type Decision } from './limiter.js';
import type { HeaderList } from '../lib/header-list.js';
import { secondsUntil } from './windows.js';

/**
 * Usage headers of every counted response (README "Headers and answers"): the `X-RateLimit-*` pairs, and the
 * IETF draft-ietf-httpapi-ratelimit-headers-11 `RateLimit-Policy` / `RateLimit` fields, whose
 * items are quoted policy names with `q` (quota), `w` (window seconds), `r` (remaining) and
 * `t` (seconds until reset) parameters.
 */

/** The names of the usage headers, in the order they are written. */
export const USAGE_HEADER_NAMES = [
  'X-RateLimit-Limit-Hour',
  'X-RateLimit-Remaining-Hour',
  'X-RateLimit-Limit-Day',
  'X-RateLimit-Remaining-Day',
  'RateLimit-Policy',
  'RateLimit',
] as const;

type CountedDecision = Extract<Decision, { kind: 'counted' }>;

const DAY_SECONDS = 86_400;
const HOUR_SECONDS = 3_600;

/** The fields that depend only on the numbers (the same for every request of a row and plan), built once. */
interface FixedFields {
  readonly limitHour: [string, string];
  readonly limitDay: [string, string];
  readonly policy: [string, string];
}
/** By hour limit, then day limit: numbers as keys, where a string key would be built, hashed and compared per request. */
const fixedFields = new Map<number, Map<number, FixedFields>>();
let fixedCount = 0;
const MAX_FIXED = 10_000;

function fixedFieldsOf(hourLimit: number, dayLimit: number): FixedFields {
  let byDay = fixedFields.get(hourLimit);
  let fields = byDay?.get(dayLimit);
  if (!fields) {
    fields = {
      limitHour: ['X-RateLimit-Limit-Hour', String(hourLimit)],
      limitDay: ['X-RateLimit-Limit-Day', String(dayLimit)],
      policy: ['RateLimit-Policy', `"hour";q=${hourLimit};w=${HOUR_SECONDS}, "day";q=${dayLimit};w=${DAY_SECONDS}`],
    };
    if (fixedCount < MAX_FIXED) {
      if (!byDay) fixedFields.set(hourLimit, (byDay = new Map<number, FixedFields>()));
      byDay.set(dayLimit, fields);
      fixedCount++;
    }
  }
  return fields;
}

/** The usage headers of one decision. The fixed pairs are shared between requests: a HeaderList is read, never changed. */
export function rateLimitHeaders(decision: CountedDecision, now: number): HeaderList {
  const { hour, day } = decision;
  const fixed = fixedFieldsOf(hour.limit, day.limit);
  return [
    fixed.limitHour,
    ['X-RateLimit-Remaining-Hour', String(hour.remaining)],
    fixed.limitDay,
    ['X-RateLimit-Remaining-Day', String(day.remaining)],
    fixed.policy,
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
