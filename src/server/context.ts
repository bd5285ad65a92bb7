import type { Duplex } from 'node:stream';
import type { HttpBindings } from '@hono/node-server';
import type { LimitRow, LimitTable } from '../limits/limit-table.js';
import type { BridgeName } from '../config/settings.js';
import type { Decision } from '../limits/limiter.js';
import type { Reason } from '../lib/answers.js';
import type { HeaderList } from '../lib/header-list.js';
import type { Route } from '../limits/route.js';

/** Request-scoped values, filled in as the request flows through the middleware chain. */

/** A WebSocket upgrade runs through the same chain; the final handler takes over the socket. */
export interface UpgradeBinding {
  readonly socket: Duplex;
  readonly head: Buffer;
}

export type GatewayBindings = HttpBindings & { readonly upgrade?: UpgradeBinding };
export type GatewayEnv = { Bindings: GatewayBindings };

export interface Client {
  /** SHA-256 hex of the API key. */
  readonly keyHash: string;
  /** Id of the issued key (absent for `API_KEY_MODE=any` keys that were never issued). */
  readonly keyId: string | undefined;
  readonly plan: string | undefined;
}

export interface Endpoint {
  readonly row: LimitRow;
  /** The route that matched: the row's `route` or one of its `also` routes. */
  readonly route: Route;
  readonly bridge: BridgeName;
  /** Normalised path. */
  readonly path: string;
  /** The query string as sent, with its `?` (or empty). */
  readonly query: string;
}

export interface Forwarded {
  readonly status: number;
  /** Why, when the forwarder answered itself (502, 504, 413). */
  readonly reason?: Reason | undefined;
  readonly upstreamMs: number | undefined;
}

declare module 'hono' {
  interface ContextVariableMap {
    requestId: string;
    /** The client's address (see server/client-address.ts). */
    clientAddress: string;
    client: Client;
    /** The limit-table snapshot this request uses from start to end. */
    table: LimitTable;
    endpoint: Endpoint;
    /** The row of a path the table has for other methods only (405, 426): what logs and metrics name. */
    pathRow: LimitRow;
    decision: Decision;
    /** Usage headers (README "Headers and answers") for this request (empty when it was not counted). */
    usageHeaders: HeaderList;
    /** CORS fields of every answer to this request (middleware/cors.ts); unset while CORS is off. */
    corsHeaders: HeaderList;
    /** An answer the gateway wrote itself (server/answers.ts): its status and why. */
    answered: { readonly status: number; readonly reason: Reason };
    /** Set when the answer came from a bridge. */
    forwarded: Forwarded;
    /** The key an admin request is about (admin/keys.ts), by its hash. */
    keyHash: string;
    /** Body already read by the gateway (credential routes), forwarded byte for byte. */
    body: Buffer;
  }
}
