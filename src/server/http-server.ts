import http, { type IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { getRequestListener } from '@hono/node-server';
import type { Hono } from 'hono';
import type { Settings } from '../config/settings.js';
import type { Logger } from '../observability/logger.js';
import { errorBody, rawAnswer } from './answers.js';
import type { GatewayEnv } from './context.js';

/**
 * The public HTTP server: Node's parser with bounded headers and timeouts against slow
 * senders, and a two-field JSON answer for every request it refuses before the app sees it
 * (oversized headers 431, a request that took too long 408, malformed HTTP 400, including a
 * request with both Content-Length and Transfer-Encoding, RFC 9112 §6.3).
 */

/** How long a connection refused by clientError is read from before it is closed. */
const LINGER_MS = 2000;

export interface PublicServer {
  readonly server: http.Server;
  /** Requests whose answer is not complete yet. */
  inFlight(): number;
}

export function createPublicServer(
  app: Hono<GatewayEnv>,
  settings: Pick<Settings, 'maxHeaderBytes' | 'headersTimeoutMs' | 'requestTimeoutMs'>,
  logger: Logger,
  onUpgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
): PublicServer {
  const listener = getRequestListener(app.fetch, {
    // A request node-server cannot turn into a URL (bad Host header, absolute-form oddities).
    errorHandler: () =>
      new Response(errorBody(400, 'Malformed request'), {
        status: 400,
        headers: { 'Content-Type': 'application/json' },
      }),
  });
  const server = http.createServer(
    {
      maxHeaderSize: settings.maxHeaderBytes,
      headersTimeout: settings.headersTimeoutMs,
      requestTimeout: settings.requestTimeoutMs,
      // Node checks both timeouts only this often (30 s by default, far longer than the timeouts themselves).
      connectionsCheckingInterval: Math.max(
        50,
        Math.min(1000, Math.floor(Math.min(settings.headersTimeoutMs, settings.requestTimeoutMs) / 4)),
      ),
      keepAliveTimeout: 5000,
    },
    listener,
  );
  let inFlight = 0;
  server.on('request', (_req, res: http.ServerResponse) => {
    inFlight++;
    res.once('close', () => inFlight--);
  });
  server.on('upgrade', onUpgrade);
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    // Nothing is written into an answer that has begun (a timeout can strike while one streams).
    const answering = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent;
    if (err.code === 'ECONNRESET' || !socket.writable || answering) {
      socket.destroy();
      return;
    }
    const [status, message] = clientErrorAnswer(err.code);
    logger.debug({ code: err.code, status }, 'client error');
    socket.end(rawAnswer(status, message));
    // A lingering close, as nginx does it: what the client still sends is read and dropped for a
    // moment, so that the answer is not lost to a reset, and then the connection is closed, also
    // when the client never closes its side (the server allows half-open connections).
    socket.resume();
    setTimeout(() => socket.destroy(), LINGER_MS).unref();
  });
  return { server, inFlight: () => inFlight };
}

function clientErrorAnswer(code: string | undefined): [number, string] {
  switch (code) {
    case 'HPE_HEADER_OVERFLOW':
      return [431, 'Request headers are too large'];
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return [408, 'Request took too long to arrive'];
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return [413, 'Chunk extensions are too large'];
    case 'HPE_UNEXPECTED_CONTENT_LENGTH':
      return [400, 'Content-Length and Transfer-Encoding together are not accepted'];
    default:
      return [400, 'Malformed HTTP request'];
  }
}
