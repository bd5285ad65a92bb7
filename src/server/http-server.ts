import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { getRequestListener } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Hono } from 'hono';
import type { Settings } from '../config/settings.js';
import { accessLogWriter, type Logger } from '../observability/logger.js';
import { UNMATCHED, type GatewayMetrics } from '../observability/metrics.js';
import { answerResponse, clientErrorAnswer, rawAnswer, writeAnswer, type Reason } from '../lib/answers.js';
import { markClientFailure, type ClientFailure } from '../lib/client-failure.js';
import type { HeaderList } from '../lib/header-list.js';
import type { GatewayEnv } from './context.js';
import { corsFields } from './middleware/cors.js';
import { requestIdSource } from './middleware/request-id.js';
import { ConnectionOrder, type Exchange } from './connection-order.js';
import { gateRefusal } from './request-gate.js';
import { endAndLinger, LINGER_MS } from '../lib/linger.js';

/**
 * The public HTTP server: Node's parser with bounded headers and timeouts against slow senders,
 * the request gate (server/request-gate.ts) before the app sees a request, and a two-field JSON
 * answer for everything refused at this level: oversized headers 431, a request that took too
 * long 408, malformed HTTP 400 (including Content-Length with Transfer-Encoding, RFC 9112 §6.3),
 * an `Expect` other than 100-continue 417, CONNECT 501.
 *
 * Each of these answers carries the CORS fields of README "CORS" when the request's head is known,
 * and `Vary: Origin` alone when it is not (the parser failed before the head was whole), as any
 * other answer while CORS is on. Each has an access line with its reason and counts in the metrics, like any
 * other answer the gateway writes itself (docs/operations.md "Logs"). A request the app is already
 * serving when the parser fails on its body (malformed, or not all come within REQUEST_TIMEOUT_MS)
 * gets that answer from the app instead, in its own name (lib/client-failure.ts).
 *
 * Pipelined requests keep their answers: when the parser fails on a request that follows others
 * still being answered, those get their answers first and the refusal comes after them
 * (docs/operations.md "Hostile clients").
 */

export interface PublicServer {
  readonly server: http.Server;
  /** Requests whose answer is not complete yet. */
  inFlight(): number;
}

type ServerSettings = Pick<
  Settings,
  'maxHeaderBytes' | 'maxHeaderCount' | 'headersTimeoutMs' | 'requestTimeoutMs' | 'corsOrigins'
>;

/** An answer of this level, for its access line. */
interface HttpRefusal {
  readonly status: number;
  readonly reason: Reason;
  readonly socket: Duplex;
  readonly method?: string | undefined;
  readonly requestId: string;
}
type RefusalLog = (refusal: HttpRefusal) => void;

/** Access lines and metrics of the answers written at this level (the app's own come from its access log). */
function refusalLog(logger: Logger, metrics: GatewayMetrics): RefusalLog {
  const writeLine = accessLogWriter(logger);
  return function logRefusal(r) {
    metrics.request(UNMATCHED, r.status, 0, r.reason);
    writeLine({
      reqId: r.requestId,
      method: r.method,
      endpoint: UNMATCHED,
      status: r.status,
      ms: 0,
      address: (r.socket as { remoteAddress?: string }).remoteAddress,
      reason: r.reason,
    });
  };
}

/** The answers written at this level, each with its request id, CORS fields, access line and metrics. */
interface Refusals {
  /** On an exchange's response, closing the connection after it. */
  answer(exchange: Exchange, status: number, reason: Reason, message: string): void;
  /**
   * Straight onto a connection Node has handed over (an upgrade, CONNECT, a parser failure), about
   * `req` when its head is known; `method` is what the access line says (the request's by default).
   */
  linger(socket: Duplex, status: number, reason: Reason, message: string, req?: IncomingMessage, method?: string): void;
}

/** The CORS fields of an answer of this level to `req` (undefined: its head is not known). */
type CorsOf = (req: IncomingMessage | undefined) => HeaderList;

const NO_FIELDS: HeaderList = [];

/**
 * README "CORS": every answer to a listed origin carries its CORS fields, the gateway's own refusals
 * included (a browser reads one without them as a failed request, not as the refusal it is), and
 * every answer says `Vary: Origin` while CORS is on; the same fields as the app's (middleware/cors.ts).
 */
function corsOfRequests(origins: readonly string[]): CorsOf {
  if (origins.length === 0) return () => NO_FIELDS;
  const fields = corsFields(origins);
  return (req) => fields.listed(req?.headers.origin) ?? fields.others;
}

function refusals(observe: { logger: Logger; metrics: GatewayMetrics }, corsOf: CorsOf): Refusals {
  const logRefusal = refusalLog(observe.logger, observe.metrics);
  const nextId = requestIdSource();
  return {
    answer({ req, res }, status, reason, message) {
      const requestId = nextId();
      writeAnswer(res, status, message, [['Connection', 'close'], ['X-Request-Id', requestId], ...corsOf(req)]);
      logRefusal({ status, reason, socket: req.socket, method: req.method, requestId });
    },
    linger(socket, status, reason, message, req, method = req?.method) {
      socket.on('error', () => socket.destroy());
      const requestId = nextId();
      // Straight to the connection, closing it lingering (lib/linger.ts).
      endAndLinger(socket, rawAnswer(status, message, [['X-Request-Id', requestId], ...corsOf(req)]));
      logRefusal({ status, reason, socket, method, requestId });
    },
  };
}

export function createPublicServer(
  app: Hono<GatewayEnv>,
  settings: ServerSettings,
  observe: { logger: Logger; metrics: GatewayMetrics },
  onUpgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
): PublicServer {
  const refuse = refusals(observe, corsOfRequests(settings.corsOrigins));
  const order = servingInOrder(app, settings.maxHeaderCount, refuse, observe.logger);
  const server: http.Server = http.createServer({
    ...serverOptions(settings),
    ServerResponse: closingWhenNotListening(() => server.listening),
  });
  // Every header line the parser reads is kept, so the framing it used is framing the gateway sees;
  // MAX_HEADER_COUNT bounds them instead (the gate).
  server.maxHeadersCount = 0;
  // A client that half-closes after its request still gets the answer: Node would end the connection at
  // once. (An undocumented switch of Node's http.Server, read by its end-of-input handler since Node 0.x;
  // the half-open tests in test/integration/hostile-smuggling.test.ts pin it.)
  (server as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;

  server.on('request', function takeRequest(req: IncomingMessage, res: ServerResponse) {
    if (closing(req)) return;
    order.take(req, res);
  });
  // Node asks before answering 100 Continue itself: an unsupported Expect is refused in its turn (417).
  server.on('checkExpectation', function takeExpectation(req: IncomingMessage, res: ServerResponse) {
    if (closing(req)) return;
    order.take(req, res);
  });

  server.on('upgrade', function gatedUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer) {
    handedOver(socket);
    order.whenIdle(socket, function upgradeInTurn(open) {
      if (!open) return void socket.destroy();
      const refusal = gateRefusal(req, settings.maxHeaderCount, true);
      if (!refusal) return onUpgrade(req, socket, head);
      refuse.linger(socket, refusal.status, refusal.reason, refusal.message, req, 'WS');
    });
  });

  server.on('connect', function refuseConnect(req: IncomingMessage, socket: Duplex) {
    handedOver(socket);
    order.whenIdle(socket, function connectInTurn(open) {
      if (!open) return void socket.destroy();
      refuse.linger(socket, 501, 'not-implemented', 'CONNECT is not supported', req);
    });
  });

  server.on('clientError', clientErrorHandler(order, observe.logger, refuse));
  return { server, inFlight: () => order.inFlight };
}

/**
 * A connection Node has handed over (an upgrade, CONNECT) has lost Node's own 'error' listener with
 * its parser, and may wait for the answers before it (pipelining): a client that resets it meanwhile
 * would raise an 'error' nobody listens to, which ends the process. It is destroyed instead.
 */
function handedOver(socket: Duplex): void {
  socket.on('error', () => socket.destroy());
}

/**
 * A request Node's parser read on a connection the gateway has already ended, closing it lingering
 * (lib/linger.ts) after a 408 whose parser had not failed: its answer could never be written, and a
 * server that said `Connection: close` processes no further request (RFC 9112 §9.6). It is never
 * served, counted or forwarded; its bytes are read and dropped with the rest until the socket goes.
 */
function closing(req: IncomingMessage): boolean {
  if (!req.socket.writableEnded && !req.socket.destroyed) return false;
  req.resume();
  return true;
}

/** Each request in its turn on its connection: the Expect check, the gate, then the app. */
function servingInOrder(
  app: Hono<GatewayEnv>,
  maxHeaderCount: number,
  refuse: Refusals,
  logger: Logger,
): ConnectionOrder {
  /** The exchange node-server is turning into a Request right now (its errorHandler runs in that same call). */
  let converting: Exchange | undefined;
  const listener = getRequestListener(fetchKeepingWrittenHead(app), {
    errorHandler: function malformedRequest() {
      // A request node-server cannot turn into a URL (bad Host header, absolute-form oddities).
      if (converting) return refuse.answer(converting, 400, 'bad-request', 'Malformed request');
      // Only when the app's own error handler fails: the chain's errors reach it as rejections
      // (server/chain.ts), after this request's conversion is over.
      return answerResponse(500, 'Unexpected error');
    },
  });
  return new ConnectionOrder(
    function serveInTurn(exchange) {
      const expectation = exchange.req.headers.expect;
      if (expectation !== undefined && !/^100-continue$/i.test(expectation)) {
        refuse.answer(exchange, 417, 'expectation', 'Only Expect: 100-continue is supported');
        return;
      }
      const refusal = gateRefusal(exchange.req, maxHeaderCount);
      if (refusal) {
        refuse.answer(exchange, refusal.status, refusal.reason, refusal.message);
        return;
      }
      converting = exchange;
      try {
        void listener(exchange.req, exchange.res);
      } finally {
        converting = undefined;
      }
    },
    function neverServed({ req }) {
      logger.debug({ method: req.method }, 'pipelined request behind an answer that closed its connection: not served');
    },
  );
}

/**
 * hono answers HEAD by running the GET chain and copying its answer into a new Response, which
 * loses node-server's mark of an answer the chain has already written itself (every answer of the
 * gateway's own, server/answers.ts): node-server would then write the head a second time.
 */
function fetchKeepingWrittenHead(app: Hono<GatewayEnv>): Hono<GatewayEnv>['fetch'] {
  return function fetch(request, env, executionCtx) {
    if (request.method !== 'HEAD') return app.fetch(request, env, executionCtx);
    const outgoing = env && 'outgoing' in env ? env.outgoing : undefined;
    return Promise.resolve(app.fetch(request, env, executionCtx)).then((response) =>
      outgoing?.headersSent ? RESPONSE_ALREADY_SENT : response,
    );
  };
}

/**
 * docs/operations.md "Shutdown": once the listener stops accepting, kept-alive connections close as
 * their last answer completes. Such an answer says so (`Connection: close`, whatever writes it: the
 * forwarder, the gateway's own answers, node-server): one that said `keep-alive` had the client send
 * its next request on a connection about to close, to meet a reset it cannot tell from a request
 * lost on its way (and must not send again unless idempotent).
 */
function closingWhenNotListening(listening: () => boolean): typeof http.ServerResponse {
  class ClosingResponse extends http.ServerResponse {
    // Three parameters, as Node's own writeHead has (its reason is optional): no rest array per answer.
    override writeHead(statusCode: number, reason?: unknown, headers?: unknown): this {
      if (!listening()) this.shouldKeepAlive = false;
      return super.writeHead(statusCode, reason as string, headers as http.OutgoingHttpHeaders);
    }
  }
  return ClosingResponse as typeof http.ServerResponse;
}

function serverOptions(settings: ServerSettings): http.ServerOptions {
  return {
    maxHeaderSize: settings.maxHeaderBytes,
    headersTimeout: settings.headersTimeoutMs,
    requestTimeout: settings.requestTimeoutMs,
    // Node checks both timeouts only this often (30 s by default, far longer than the timeouts themselves).
    connectionsCheckingInterval: Math.max(
      50,
      Math.min(1000, Math.floor(Math.min(settings.headersTimeoutMs, settings.requestTimeoutMs) / 4)),
    ),
    keepAliveTimeout: 5000,
    // The gate answers a request without Host in the gateway's own shape.
    requireHostHeader: false,
  };
}

/**
 * Node's parser failed on a connection. The request whose own bytes broke off is refused at once
 * when it is the one being served; otherwise the refusal waits for the answers before it, and a
 * broken request still waiting its turn is never served.
 */
function clientErrorHandler(
  order: ConnectionOrder,
  logger: Logger,
  refusals: Refusals,
): (err: NodeJS.ErrnoException, socket: Duplex) => void {
  /** Connections whose parser failed: the first failure is the one answered. */
  const failed = new WeakSet<Duplex>();
  return function onClientError(err, socket) {
    if (failed.has(socket)) return;
    failed.add(socket);
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const answer = clientErrorAnswer(err.code);
    const [status, reason, message] = answer;
    logger.debug({ code: err.code, status }, 'client error');
    const refuse = (req?: IncomingMessage): void => refusals.linger(socket, status, reason, message, req);
    const pending = order.pending(socket);
    // A request whose own bytes broke off (or stopped coming) can never be answered by a bridge.
    const broken = pending.find((e) => !e.req.complete);
    if (broken && broken === pending[0]) {
      // Not served yet (the failure came in the same read as its head, and now never will be): refused now.
      if (order.withhold(broken)) refuse(broken.req);
      // An answer has begun: the gate's refusal of this very request is on its way and closes the connection.
      else if (broken.res.headersSent) {
        if (!broken.res.writableEnded) socket.destroy();
      }
      // Served with no answer begun: the app answers, in the request's name.
      else appAnswersFailure(broken, answer);
      return;
    }
    if (broken) order.dropFrom(socket, broken);
    // The failure is in a request that follows others still being answered: they get their answers
    // first, then this refusal (unless the last of them closes the connection anyway: a client that
    // half-closed, or a refusal that said Connection: close).
    order.whenIdle(socket, function refuseInTurn(open) {
      if (open) refuse(broken?.req);
    });
  };
}

/**
 * The app is serving a request whose body the parser failed on (malformed, or stopped coming):
 * the answer this level would have written (clientErrorAnswer) is the app's, with the request's
 * id, usage headers and its one access line (docs/operations.md "Logs"), written by whoever reads
 * the body or by the body step once an earlier step is done waiting (lib/client-failure.ts). The
 * answer, and any other the app writes instead, says `Connection: close` and the connection closes
 * lingering, as after a refusal of this level; should no answer be complete within LINGER_MS, it
 * is closed all the same.
 */
function appAnswersFailure({ req, res }: Exchange, failure: ClientFailure): void {
  // Node closes the connection after an answer that says so with the socket's destroySoon()
  // (node:_http_server's resOnFinish), which destroys it once the answer's last byte is written:
  // what the client still sends then meets a reset that can cost it the answer (RFC 9112 §9.6).
  // This one socket's destroySoon is the lingering close instead (Node sets its own per instance
  // too, on stdout); the test "regression: the app's answer to a malformed body closed the
  // connection at once" in test/integration/hostile-http.test.ts pins it, and for the 408
  // test/integration/linger-after-answer.test.ts.
  const socket = req.socket;
  socket.destroySoon = () => endAndLinger(socket);
  // Whatever the app answers closes the connection (a 429 once the counting is back, say): the
  // parser has failed on it, or the rest of the body may still come, and no next request on it is
  // served (closing() above).
  res.shouldKeepAlive = false;
  markClientFailure(req, failure);
  setTimeout(() => {
    if (!res.writableFinished) req.socket.destroy();
  }, LINGER_MS).unref();
}
