import type { Context } from 'hono';
import type { Logger } from '../../observability/logger.js';
import { accessLogWriter, shortKeyHash } from '../../observability/logger.js';
import { UNMATCHED, type GatewayMetrics } from '../../observability/metrics.js';
import type { Decision } from '../../limits/limiter.js';
import type { Step } from '../chain.js';
import type { GatewayEnv } from '../context.js';

/**
 * One JSON line and one set of metrics per request, written when its answer is complete:
 * time, request id, endpoint, status, duration, upstream duration, a short hash of the API
 * key and the limit decision. Never the key, a body, a header or the query string.
 */

export function accessLog(options: {
  logger: Logger;
  metrics: GatewayMetrics;
  /** The client's address, for a request answered before the key step set it (a CORS preflight). */
  clientAddress: (c: Context<GatewayEnv>) => string;
}): Step {
  const { logger, metrics, clientAddress } = options;
  const writeLine = accessLogWriter(logger);
  const written = (c: Context<GatewayEnv>, started: number, response: Response): void => {
    const ms = performance.now() - started;
    const endpoint = c.get('endpoint');
    const forwarded = c.get('forwarded');
    const answered = c.get('answered');
    const status = forwarded?.status ?? answered?.status ?? response.status;
    const reason = forwarded?.reason ?? answered?.reason;
    const label = endpoint?.row.route.text ?? c.get('pathRow')?.route.text ?? UNMATCHED;
    metrics.request(label, status, ms / 1000, reason);
    if (forwarded?.upstreamMs !== undefined && endpoint) metrics.upstream(endpoint.bridge, forwarded.upstreamMs / 1000);
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
      address: c.get('clientAddress') ?? clientAddress(c),
      key: client ? shortKeyHash(client.keyHash) : undefined,
      keyId: client?.keyId,
      limit: limitOf(decision),
      spent: decision?.kind === 'counted' ? decision.spent : undefined,
      counter: decision?.kind === 'counted' && decision.source !== 'store' ? decision.source : undefined,
      reason,
    });
  };
  // Not async: the line is written in the chain's own continuation, without an async frame per request.
  return function accessLog(c, next) {
    const started = performance.now();
    return next().then((response) => {
      written(c, started, response);
      return response;
    });
  };
}

function limitOf(decision: Decision | undefined): string | undefined {
  if (decision === undefined) return undefined;
  if (decision.kind !== 'counted') return decision.kind;
  if (!decision.allowed) return 'refused';
  return decision.spent ? 'shadow-over' : 'allowed';
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
