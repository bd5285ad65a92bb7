import type { MiddlewareHandler } from 'hono';
import type { Logger } from '../../observability/logger.js';
import { accessLogWriter, shortKeyHash } from '../../observability/logger.js';
import { UNMATCHED, type GatewayMetrics } from '../../observability/metrics.js';
import type { GatewayEnv } from '../context.js';

/**
 * One JSON line and one set of metrics per request, written when its answer is complete:
 * time, request id, endpoint, status, duration, upstream duration, a short hash of the API
 * key and the limit decision. Never the key, a body, a header or the query string.
 */

export function accessLog(options: { logger: Logger; metrics: GatewayMetrics }): MiddlewareHandler<GatewayEnv> {
  const { logger, metrics } = options;
  const writeLine = accessLogWriter(logger);
  return async function accessLog(c, next) {
    const started = performance.now();
    await next();
    const ms = performance.now() - started;
    const endpoint = c.get('endpoint');
    const forwarded = c.get('forwarded');
    const status = forwarded?.status ?? c.get('answered') ?? c.res.status;
    const label = endpoint?.row.route.text ?? UNMATCHED;
    metrics.request(label, status, ms / 1000);
    if (forwarded?.upstreamMs !== undefined && endpoint) metrics.upstream(endpoint.bridge, forwarded.upstreamMs / 1000);
    if (!logger.isLevelEnabled('info')) return;

    const client = c.get('client');
    const decision = c.get('decision');
    writeLine({
      reqId: c.get('requestId'),
      method: c.env?.upgrade ? 'WS' : (c.env?.incoming?.method ?? c.req.method),
      endpoint: label,
      path: endpoint?.path,
      status,
      ms: round(ms),
      upstreamMs: forwarded?.upstreamMs === undefined ? undefined : round(forwarded.upstreamMs),
      bridge: forwarded ? endpoint?.bridge : undefined,
      key: client ? shortKeyHash(client.keyHash) : undefined,
      keyId: client?.keyId,
      limit:
        decision === undefined
          ? undefined
          : decision.kind !== 'counted'
            ? decision.kind
            : decision.allowed
              ? decision.spent
                ? 'shadow-over'
                : 'allowed'
              : 'refused',
      spent: decision?.kind === 'counted' ? decision.spent : undefined,
      counter: decision?.kind === 'counted' && decision.source !== 'store' ? decision.source : undefined,
    });
  };
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
