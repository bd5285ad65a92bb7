import type { Context } from 'hono';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { HeaderList } from '../../lib/header-list.js';
import type { Forwarder } from '../../proxy/forwarder.js';
import type { WebSocketProxy } from '../../ws/bridge-proxy.js';
import type { WebSocketConnections } from '../../ws/connections.js';
import { answer } from '../answers.js';
import type { Step } from '../chain.js';
import type { Forwarded, GatewayEnv, UpgradeBinding } from '../context.js';
import { forwardedQuery } from './api-key.js';

/**
 * Step 5 of README "A request, step by step": forward to the bridge, which answers the client directly. A
 * WebSocket upgrade is handed to the bridge and then joined both ways.
 */

export interface ForwardOptions {
  readonly forwarder: Forwarder;
  readonly webSocketProxy: WebSocketProxy;
  readonly websockets: WebSocketConnections;
  readonly maxBodyBytes: number;
  /** The client's API key never reaches a bridge (README "Forwarding"). */
  readonly apiKeyHeader: string;
  /** Tells the bridge the issued key's id; undefined: not sent. A client's own field of this name is dropped. */
  readonly consumerIdHeader: string | undefined;
}

const NO_HEADERS: HeaderList = [];

export function forward(options: ForwardOptions): Step {
  const { forwarder, webSocketProxy, websockets, maxBodyBytes, consumerIdHeader } = options;
  const droppedHeaders: ReadonlySet<string> = new Set(
    [options.apiKeyHeader, consumerIdHeader ?? ''].filter(Boolean).map((name) => name.toLowerCase()),
  );
  const consumerOf = (keyId: string | undefined): string[] | undefined =>
    keyId !== undefined && consumerIdHeader ? [consumerIdHeader, keyId] : undefined;

  const upgraded = (
    c: Context<GatewayEnv>,
    upgrade: UpgradeBinding,
    usageHeaders: HeaderList,
    ownsCors: boolean,
  ): Promise<Response> => {
    const endpoint = c.get('endpoint');
    const requestId = c.get('requestId');
    return new Promise<Forwarded>((resolve) => {
      webSocketProxy.upgrade({
        incoming: c.env.incoming,
        socket: upgrade.socket,
        head: upgrade.head,
        bridge: endpoint.bridge,
        target: endpoint.path + forwardedQuery(endpoint.query),
        requestId,
        clientAddress: c.get('clientAddress'),
        answerHeaders: [...usageHeaders, ['X-Request-Id', requestId]],
        ownsCors,
        droppedHeaders,
        addedHeaders: consumerOf(c.get('client')?.keyId),
        onOpen: (client, bridge) => websockets.add(endpoint.row, client, bridge),
        // A 502/504 of the gateway's own has its reason, for its access line and metrics (docs/operations.md "Logs").
        onDone: (status, reason) => resolve({ status, reason, upstreamMs: undefined }),
      });
    }).then((forwarded) => {
      c.set('forwarded', forwarded);
      return RESPONSE_ALREADY_SENT;
    });
  };

  // Not async: one promise per request, the forwarder's own (docs/performance.md).
  return function forward(c) {
    const incoming = c.env?.incoming;
    // Only an in-process app.request() has no socket; there is nothing to forward it over.
    if (!incoming) return answer(c, 'internal', 500, 'No connection to forward');
    // Added to the bridge's answer (the 101 of an upgrade included) and to a 502/504 the gateway writes.
    const cors = c.get('corsHeaders');
    const usage = c.get('usageHeaders') ?? NO_HEADERS;
    const usageHeaders = cors ? [...usage, ...cors] : usage;
    if (c.env.upgrade) return upgraded(c, c.env.upgrade, usageHeaders, cors !== undefined);

    const endpoint = c.get('endpoint');
    return forwarder
      .forward({
        incoming,
        outgoing: c.env.outgoing,
        bridge: endpoint.bridge,
        target: endpoint.path + forwardedQuery(endpoint.query),
        body: c.get('body'),
        maxBodyBytes,
        requestId: c.get('requestId'),
        clientAddress: c.get('clientAddress'),
        usageHeaders,
        ownsCors: cors !== undefined,
        droppedHeaders,
        addedHeaders: consumerOf(c.get('client')?.keyId),
      })
      .then((result) => {
        c.set('forwarded', result);
        return RESPONSE_ALREADY_SENT;
      });
  };
}
