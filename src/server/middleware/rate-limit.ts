import type { Context } from 'hono';
import { limitsFor } from '../../limits/limit-table.js';
import { rateLimitHeaders, retryAfterHeader } from '../../limits/headers.js';
import { RETRY_STORE_AFTER_MS, type Decision, type Limiter } from '../../limits/limiter.js';
import type { GatewayMetrics } from '../../observability/metrics.js';
import { answer } from '../answers.js';
import type { Next, Step } from '../chain.js';
import type { GatewayEnv } from '../context.js';

/**
 * Step 3 of README "A request, step by step": the hour and day windows of the matched row, for this key's plan.
 * A refusal is the exact 429 of README "Headers and answers"; from here on every answer carries the usage headers.
 */

/**
 * `REDIS_FAILURE_MODE=closed` while Redis is away: a known key gets its answer or a 503 with
 * `Retry-After` (README "API keys and plans"), the second in which the instance tries Redis again.
 */
const STORE_RETRY_AFTER: [string, string] = ['Retry-After', String(Math.ceil(RETRY_STORE_AFTER_MS / 1000))];

/** An allowed request that leaves less than this share of a window counts as "near the limit". */
const NEAR_LIMIT_SHARE = 0.1;

export function rateLimit(options: { limiter: Limiter; metrics: GatewayMetrics }): Step {
  const { limiter, metrics } = options;

  const decided = (c: Context<GatewayEnv>, next: Next, decision: Decision): Promise<Response> | Response => {
    c.set('decision', decision);
    if (decision.kind === 'unavailable')
      return answer(c, 'redis-unavailable', 503, 'Rate limiting is unavailable', [STORE_RETRY_AFTER]);
    if (decision.kind === 'counted') {
      c.set('usageHeaders', rateLimitHeaders(decision, decision.at));
      const endpoint = c.get('endpoint').row.route.text;
      if (decision.spent) {
        // One request, counted once: `window` is the window spent, or `both`.
        metrics.refusals.labels(endpoint, decision.spent, decision.allowed ? 'true' : 'false').inc();
      } else {
        if (decision.hour.remaining < decision.hour.limit * NEAR_LIMIT_SHARE)
          metrics.nearLimit.labels(endpoint, 'hour').inc();
        if (decision.day.remaining < decision.day.limit * NEAR_LIMIT_SHARE)
          metrics.nearLimit.labels(endpoint, 'day').inc();
      }
      if (!decision.allowed) {
        // Both spent: the day is what keeps it refused longest.
        const reason = decision.spent === 'hour' ? 'hour-spent' : 'day-spent';
        return answer(c, reason, 429, 'Too Many Requests', [retryAfterHeader(decision, decision.at)]);
      }
    }
    return next();
  };

  // Not async: one promise chain per request rather than an async frame (docs/performance.md).
  return function rateLimit(c, next) {
    const { row } = c.get('endpoint');
    const client = c.get('client');
    const table = c.get('table');
    const limits = limitsFor(table, row, client.plan);
    return limiter
      .check({ keyHash: client.keyHash, row, limits, calendar: table.calendar })
      .then((decision) => decided(c, next, decision));
  };
}
