import http, { type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import { Readable, type Duplex } from 'node:stream';
import { createProxyMiddleware, proxyEventsPlugin, type RequestHandler } from 'http-proxy-middleware';
import { BRIDGES, type BridgeName } from '../config/settings.js';
import type { HeaderList } from '../limits/headers.js';
import { rawAnswer, writeAnswer } from '../server/answers.js';
import { prepareRequestHeaders, responseHeaderList } from './headers.js';

/**
 * Forwarding to the bridges (INTERFACE §5.5) with http-proxy-middleware: one proxy and one
 * keep-alive agent per bridge. The bridge's status, headers and body come back unchanged, in
 * one `writeHead` with the gateway's usage headers added. A bridge that cannot be reached
 * gets the client a 502, one that has not answered within `timeoutMs` of receiving the whole
 * request a 504 (a slow upload is the client's, bounded by the server's request timeout); once the
 * bridge's status line was sent, a broken or stalled bridge closes the client connection.
 */

export interface ForwardRequest {
  readonly incoming: IncomingMessage;
  readonly outgoing: ServerResponse;
  readonly bridge: BridgeName;
  /** Normalised path and the original query. */
  readonly target: string;
  /** A body the gateway already read (credential routes); otherwise the client's body is streamed. */
  readonly body: Buffer | undefined;
  readonly maxBodyBytes: number;
  readonly requestId: string;
  readonly clientAddress: string;
  /** Added to the bridge's answer, and to a 502/504/413 the forwarder writes. */
  readonly answerHeaders: HeaderList;
}

type ForwardOutcome = 'answered' | 'unreachable' | 'timeout' | 'too-large' | 'broken' | 'client-gone';

export interface ForwardResult {
  /** What the client got (499: it left first). */
  readonly status: number;
  /** Milliseconds until the bridge's status line (absent when it never came). */
  readonly upstreamMs: number | undefined;
}

export interface UpgradeRequest {
  readonly incoming: IncomingMessage;
  readonly socket: Duplex;
  readonly head: Buffer;
  readonly bridge: BridgeName;
  readonly target: string;
  readonly requestId: string;
  readonly clientAddress: string;
  /** Added to the 101 and to a 502/504 the forwarder writes. */
  readonly answerHeaders: HeaderList;
  /** Called once the bridge accepted the upgrade and the two sockets are joined, before a byte flows between them. */
  readonly onOpen: (client: Duplex, bridge: Socket) => void;
  readonly onDone: (status: number) => void;
}

interface Exchange {
  readonly request: ForwardRequest;
  readonly started: number;
  readonly timer: NodeJS.Timeout;
  readonly resolve: (result: ForwardResult) => void;
  proxyReq: ClientRequest | undefined;
  status: number | undefined;
  upstreamMs: number | undefined;
  outcome: ForwardOutcome | undefined;
  retried: boolean;
}

interface UpgradeExchange {
  readonly request: UpgradeRequest;
  readonly timer: NodeJS.Timeout;
  settled: boolean;
  proxyReq: ClientRequest | undefined;
}

const EXCHANGE = Symbol('oapi.exchange');
const UPGRADE = Symbol('oapi.upgrade');
type Tagged = IncomingMessage & { [EXCHANGE]?: Exchange; [UPGRADE]?: UpgradeExchange };

const RETRYABLE = new Set(['GET', 'HEAD']);
/** Logged as the status of a request whose client left before its answer (nginx's convention). */
const CLIENT_GONE = 499;

export interface ForwarderOptions {
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly timeoutMs: number;
  readonly onError?: (err: Error, context: { bridge: BridgeName; phase: string }) => void;
}

export class Forwarder {
  readonly #proxies = new Map<BridgeName, RequestHandler>();
  /** Accepted upgrades between the bridge's 101 and http-proxy joining the sockets. */
  readonly #joining = new WeakMap<Socket, UpgradeExchange>();
  readonly #agents: Array<http.Agent>;
  readonly #timeoutMs: number;
  readonly #onError: NonNullable<ForwarderOptions['onError']>;

  constructor(options: ForwarderOptions) {
    this.#timeoutMs = options.timeoutMs;
    this.#onError = options.onError ?? (() => {});
    this.#agents = [];
    for (const bridge of BRIDGES) {
      const url = options.bridges[bridge];
      const secure = url.protocol === 'https:';
      const agent = new (secure ? https.Agent : http.Agent)({
        keepAlive: true,
        keepAliveMsecs: 1000,
        maxFreeSockets: 256,
        scheduling: 'lifo',
      });
      this.#agents.push(agent);
      this.#proxies.set(bridge, this.#createProxy(bridge, url, agent));
    }
  }

  /** Forwards one request; resolves when the client's answer is complete (or the client left). */
  forward(request: ForwardRequest): Promise<ForwardResult> {
    return new Promise((resolve) => {
      const { incoming, outgoing } = request;
      // The client left while its request was checked: nothing goes to the bridge.
      if (outgoing.destroyed || incoming.socket.destroyed) {
        resolve({ status: CLIENT_GONE, upstreamMs: undefined });
        return;
      }
      const exchange: Exchange = {
        request,
        started: performance.now(),
        timer: setTimeout(() => this.#timedOut(exchange), this.#timeoutMs),
        resolve,
        proxyReq: undefined,
        status: undefined,
        upstreamMs: undefined,
        outcome: undefined,
        retried: false,
      };
      outgoing.once('close', () => {
        clearTimeout(exchange.timer);
        if (!outgoing.writableFinished) {
          exchange.outcome ??= 'client-gone';
          exchange.proxyReq?.destroy();
        }
        resolve({
          status: exchange.outcome === 'client-gone' ? CLIENT_GONE : (exchange.status ?? outgoing.statusCode),
          upstreamMs: exchange.upstreamMs,
        });
      });

      prepareRequestHeaders(incoming.headers, {
        clientAddress: request.clientAddress,
        proto: isEncrypted(incoming) ? 'https' : 'http',
        requestId: request.requestId,
        bodyLength: request.body?.length,
      });
      if (!request.body && incoming.headers['transfer-encoding'] !== undefined) this.#capStreamedBody(exchange);
      if (!request.body && !declaresBody(incoming)) {
        // By its headers this request has no body, so none is sent. Bytes that arrive all the same
        // were framed by a header the gateway did not see: the connection cannot be trusted any more.
        incoming.once('data', () => {
          this.#onError(new Error('body bytes on a request without Content-Length or Transfer-Encoding'), {
            bridge: request.bridge,
            phase: 'request',
          });
          this.#broken(exchange, outgoing);
          incoming.socket.destroy();
        });
      }
      this.#send(exchange);
    });
  }

  /** Hands an accepted WebSocket upgrade to the bridge (INTERFACE §8); frames then flow both ways. */
  upgrade(request: UpgradeRequest): void {
    const { incoming, socket } = request;
    if (socket.destroyed) {
      request.onDone(CLIENT_GONE);
      return;
    }
    const exchange: UpgradeExchange = {
      request,
      settled: false,
      proxyReq: undefined,
      timer: setTimeout(() => this.#upgradeFailed(exchange, 504, 'Bridge did not answer in time'), this.#timeoutMs),
    };
    socket.once('close', () => {
      clearTimeout(exchange.timer);
      // The client left before the bridge answered: nothing is waiting for the bridge any more.
      if (!exchange.settled) {
        exchange.settled = true;
        exchange.proxyReq?.destroy();
        request.onDone(CLIENT_GONE);
      }
    });
    prepareRequestHeaders(incoming.headers, {
      clientAddress: request.clientAddress,
      proto: isEncrypted(incoming) ? 'https' : 'http',
      requestId: request.requestId,
      upgrade: true,
    });
    incoming.url = request.target;
    (incoming as Tagged)[UPGRADE] = exchange;
    const proxy = this.#proxies.get(request.bridge) as RequestHandler & {
      upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
    };
    proxy.upgrade(incoming, socket, request.head);
  }

  close(): void {
    for (const agent of this.#agents) agent.destroy();
  }

  #send(exchange: Exchange): void {
    const { request } = exchange;
    const source =
      request.body || !declaresBody(request.incoming)
        ? bufferedRequest(request.incoming, request.body)
        : request.incoming;
    source.url = request.target;
    (source as Tagged)[EXCHANGE] = exchange;
    const proxy = this.#proxies.get(request.bridge) as RequestHandler;
    void proxy(source, request.outgoing, (err?: unknown) => {
      if (err) this.#failed(exchange, err as Error);
    });
  }

  #createProxy(bridge: BridgeName, url: URL, agent: http.Agent): RequestHandler {
    const hostname = url.hostname.replace(/^\[(.*)\]$/, '$1');
    // The bridge's base path, to which the normalised path is appended.
    const basePath = url.pathname.replace(/\/+$/, '');
    // A pre-parsed target spares http-proxy a URL parse per request.
    const target = {
      protocol: url.protocol,
      host: url.hostname,
      hostname,
      port: url.port || (url.protocol === 'https:' ? '443' : '80'),
      path: url.pathname === '/' ? '' : url.pathname,
    };
    return createProxyMiddleware<IncomingMessage, ServerResponse>({
      target: target,
      agent,
      changeOrigin: true,
      // Spares http-proxy a URL parse of the path; the exact path is set on each request (proxyReq below).
      toProxy: true,
      selfHandleResponse: true,
      ejectPlugins: true,
      plugins: [proxyEventsPlugin],
      on: {
        proxyReq: (proxyReq, req) => {
          const exchange = (req as Tagged)[EXCHANGE];
          if (!exchange) return;
          if (exchange.outcome !== undefined) {
            proxyReq.destroy();
            return;
          }
          exchange.proxyReq = proxyReq;
          // Exactly the path that was counted: http-proxy's own join rewrites "http:/" inside a path.
          // (This event comes before the request head is written.)
          proxyReq.path = basePath + exchange.request.target;
          // The bridge has UPSTREAM_TIMEOUT_MS to answer from the moment it has the whole request.
          proxyReq.once('finish', () => {
            if (exchange.status === undefined) exchange.timer.refresh();
          });
        },
        proxyRes: (proxyRes, req, res) => this.#answer((req as Tagged)[EXCHANGE], proxyRes, res),
        error: (err, req, res) => {
          const upgrade = (req as Tagged)[UPGRADE];
          if (upgrade) {
            this.#onError(err, { bridge, phase: 'upgrade' });
            this.#upgradeFailed(upgrade, 502, 'Bridge unreachable');
            return;
          }
          const exchange = (req as Tagged)[EXCHANGE];
          if (exchange) this.#failed(exchange, err);
          else if (res && 'destroy' in res) (res as Duplex).destroy();
        },
        // Emitted by http-proxy right after it piped the two sockets, before any byte flows.
        open: (bridgeSocket: Socket) => {
          const upgrade = this.#joining.get(bridgeSocket);
          if (!upgrade) return;
          this.#joining.delete(bridgeSocket);
          upgrade.request.onOpen(upgrade.request.socket, bridgeSocket);
        },
        proxyReqWs: (proxyReq, req) => {
          const upgrade = (req as Tagged)[UPGRADE];
          if (!upgrade) return;
          upgrade.proxyReq = proxyReq;
          proxyReq.path = basePath + upgrade.request.target;
          proxyReq.once('upgrade', (res: IncomingMessage, bridgeSocket: Socket) => {
            // http-proxy writes the 101 from res.headers right after this listener.
            for (const [name, value] of upgrade.request.answerHeaders) res.headers[name.toLowerCase()] = value;
            upgrade.settled = true;
            clearTimeout(upgrade.timer);
            // Watching the sockets must wait for http-proxy's pipes ('open'): a reader attached
            // now would take the frames the bridge sent along with its 101 before the client's pipe exists.
            this.#joining.set(bridgeSocket, upgrade);
            upgrade.request.onDone(101);
          });
          proxyReq.once('response', (res: IncomingMessage) => {
            // The bridge refused the upgrade; http-proxy passes its answer through as it is.
            upgrade.settled = true;
            clearTimeout(upgrade.timer);
            upgrade.request.onDone(res.statusCode ?? 502);
          });
        },
      },
    });
  }

  #answer(exchange: Exchange | undefined, proxyRes: IncomingMessage, res: ServerResponse): void {
    if (!exchange || exchange.outcome !== undefined || res.headersSent) {
      proxyRes.destroy();
      return;
    }
    exchange.status = proxyRes.statusCode ?? 502;
    exchange.upstreamMs = performance.now() - exchange.started;
    // From here the same timer watches for a bridge that stalls mid-body.
    exchange.timer.refresh();
    proxyRes.on('data', () => exchange.timer.refresh());
    proxyRes.once('error', () => this.#broken(exchange, res));
    proxyRes.once('aborted', () => this.#broken(exchange, res));
    proxyRes.once('end', () => clearTimeout(exchange.timer));
    res.writeHead(
      exchange.status,
      proxyRes.statusMessage,
      responseHeaderList(proxyRes.rawHeaders, proxyRes.headers.connection, exchange.request.answerHeaders),
    );
    proxyRes.pipe(res);
  }

  #timedOut(exchange: Exchange): void {
    if (exchange.status === undefined && !exchange.request.incoming.complete && !exchange.proxyReq?.writableNeedDrain) {
      // The client is still sending its body and the bridge takes all that comes: the client is
      // the slow one, which the server's REQUEST_TIMEOUT_MS bounds (408). A bridge that stops
      // reading makes writes back up (needDrain), and then it is the bridge's 504; once the whole
      // request has arrived, any further wait is the bridge's (or the connection to it).
      exchange.timer.refresh();
      return;
    }
    if (exchange.status !== undefined) {
      // Headers were sent and the bridge stalled: all that is left is to close.
      this.#broken(exchange, exchange.request.outgoing);
      return;
    }
    exchange.outcome = 'timeout';
    exchange.proxyReq?.destroy();
    this.#write(exchange, 504, 'Bridge did not answer in time');
  }

  #failed(exchange: Exchange, err: Error): void {
    if (exchange.outcome !== undefined) return;
    const code = (err as NodeJS.ErrnoException).code;
    if (
      exchange.status === undefined &&
      !exchange.retried &&
      exchange.proxyReq?.reusedSocket &&
      code === 'ECONNRESET' &&
      RETRYABLE.has(exchange.request.incoming.method ?? '')
    ) {
      // A kept-alive socket the bridge had just closed: a safe request is sent once more (RFC 9112 §9.3.1).
      exchange.retried = true;
      exchange.proxyReq = undefined;
      this.#send(exchange);
      return;
    }
    this.#onError(err, {
      bridge: exchange.request.bridge,
      phase: exchange.status === undefined ? 'request' : 'response',
    });
    if (exchange.status !== undefined) {
      this.#broken(exchange, exchange.request.outgoing);
      return;
    }
    exchange.outcome = 'unreachable';
    this.#write(exchange, 502, 'Bridge unreachable');
  }

  #broken(exchange: Exchange, res: ServerResponse): void {
    clearTimeout(exchange.timer);
    exchange.outcome ??= 'broken';
    exchange.proxyReq?.destroy();
    res.destroy();
  }

  #write(exchange: Exchange, status: number, message: string, extra: HeaderList = []): void {
    clearTimeout(exchange.timer);
    const { outgoing, answerHeaders } = exchange.request;
    if (outgoing.headersSent || outgoing.destroyed) {
      outgoing.destroy();
      return;
    }
    exchange.status = status;
    writeAnswer(outgoing, status, message, [...answerHeaders, ...extra]);
  }

  /** Streams a body without a length, cutting it off at `maxBodyBytes` instead of buffering it. */
  #capStreamedBody(exchange: Exchange): void {
    const { incoming, maxBodyBytes } = exchange.request;
    let seen = 0;
    const count = (chunk: Buffer): void => {
      seen += chunk.length;
      if (seen <= maxBodyBytes) return;
      incoming.off('data', count);
      exchange.outcome = 'too-large';
      incoming.unpipe();
      exchange.proxyReq?.destroy();
      // The rest of the body is never read: the connection closes after the answer.
      exchange.request.outgoing.shouldKeepAlive = false;
      this.#write(exchange, 413, `Request body is larger than ${maxBodyBytes} bytes`, [['Connection', 'close']]);
    };
    incoming.on('data', count);
  }

  #upgradeFailed(exchange: UpgradeExchange, status: number, message: string): void {
    const { socket } = exchange.request;
    if (exchange.settled) {
      socket.destroy();
      return;
    }
    exchange.settled = true;
    clearTimeout(exchange.timer);
    exchange.proxyReq?.destroy();
    exchange.request.onDone(status);
    if (socket.writable) socket.end(rawAnswer(status, message, exchange.request.answerHeaders));
    else socket.destroy();
  }
}

function isEncrypted(incoming: IncomingMessage): boolean {
  return Boolean((incoming.socket as Socket & { encrypted?: boolean }).encrypted);
}

/** Whether the request's own headers announce a body (RFC 9112 §6.3: without either field, a request has none). */
function declaresBody(incoming: IncomingMessage): boolean {
  return incoming.headers['transfer-encoding'] !== undefined || (incoming.headers['content-length'] ?? '0') !== '0';
}

/**
 * The client's request with a body the gateway already read (or with none), for http-proxy to pipe
 * as if it came from the socket: nothing the client sends afterwards reaches the bridge.
 */
function bufferedRequest(incoming: IncomingMessage, body: Buffer | undefined): IncomingMessage {
  // A plain stream that pushes the body once (Readable.from would go through an async iterator).
  const stream = new Readable({
    read() {
      if (body?.length) this.push(body);
      this.push(null);
    },
  });
  return Object.assign(stream, {
    method: incoming.method,
    url: incoming.url,
    headers: incoming.headers,
    rawHeaders: incoming.rawHeaders,
    httpVersion: incoming.httpVersion,
    httpVersionMajor: incoming.httpVersionMajor,
    httpVersionMinor: incoming.httpVersionMinor,
    socket: incoming.socket,
    connection: incoming.socket,
  }) as unknown as IncomingMessage;
}
