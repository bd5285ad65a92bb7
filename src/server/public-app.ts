import { Hono } from 'hono';
import type { LimitTable } from '../limits/limit-table.js';
import type { Settings } from '../config/settings.js';
import type { InvalidKeyGuard } from '../keys/guard.js';
import type { KeyRegistry } from '../keys/registry.js';
import type { Limiter } from '../limits/limiter.js';
import type { Logger } from '../observability/logger.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import type { Forwarder } from '../proxy/forwarder.js';
import type { WebSocketProxy } from '../ws/bridge-proxy.js';
import type { WebSocketConnections } from '../ws/connections.js';
import { answer } from './answers.js';
import { chain, type Unexpected } from './chain.js';
import { clientAddressOf } from './client-address.js';
import type { GatewayEnv } from './context.js';
import { accessLog } from './middleware/access-log.js';
import { apiKeyAuth } from './middleware/api-key.js';
import { bodyRules } from './middleware/body.js';
import { corsHeaders } from './middleware/cors.js';
import { matchEndpoint } from './middleware/endpoint.js';
import { forward } from './middleware/forward.js';
import { rateLimit } from './middleware/rate-limit.js';
import { requestId } from './middleware/request-id.js';

/**
 * The public listener's app: a request flows one way through the steps of README "A request, step by step",
 * each a step of one chain (server/chain.ts) that either answers or passes on.
 */

export interface PublicAppDeps {
  readonly settings: Settings;
  readonly table: () => LimitTable | undefined;
  readonly limiter: Limiter;
  readonly registry: KeyRegistry;
  readonly guard: InvalidKeyGuard;
  readonly forwarder: Forwarder;
  readonly webSocketProxy: WebSocketProxy;
  readonly websockets: WebSocketConnections;
  readonly metrics: GatewayMetrics;
  readonly logger: Logger;
}

export function createPublicApp(deps: PublicAppDeps): Hono<GatewayEnv> {
  const { settings, metrics, logger } = deps;
  const clientAddress = clientAddressOf(settings.trustProxyHops);
  const app = new Hono<GatewayEnv>();
  const unexpected: Unexpected = (err, c) => {
    logger.error({ err, reqId: c.get('requestId') }, 'unexpected error');
    return answer(c, 'internal', 500, 'Unexpected error');
  };
  app.all(
    '*',
    chain(
      unexpected,
      accessLog({ logger, metrics, clientAddress }),
      requestId(),
      ...(settings.corsOrigins.length > 0
        ? [corsHeaders({ origins: settings.corsOrigins, apiKeyHeader: settings.apiKeyHeader })]
        : []),
      apiKeyAuth({
        header: settings.apiKeyHeader,
        mode: settings.apiKeyMode,
        registry: deps.registry,
        guard: deps.guard,
        metrics,
        clientAddress,
      }),
      matchEndpoint({ table: deps.table, routing: settings }),
      rateLimit({ limiter: deps.limiter, metrics }),
      bodyRules({ maxBodyBytes: settings.maxBodyBytes, credentialRoutes: settings.credentialRoutes }),
      forward({
        forwarder: deps.forwarder,
        webSocketProxy: deps.webSocketProxy,
        websockets: deps.websockets,
        maxBodyBytes: settings.maxBodyBytes,
        apiKeyHeader: settings.apiKeyHeader,
        consumerIdHeader: settings.consumerIdHeader,
      }),
    ),
  );
  // Errors of the chain's first step, or of hono itself, outside the chain's own boundary (server/chain.ts).
  app.onError(unexpected);
  return app;
}
