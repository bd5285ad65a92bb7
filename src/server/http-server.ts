import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { getRequestListener } from '@hono/node-server';
import type { Hono } from 'hono';
import type { Settings } from '../config/settings.js';
import { accessLogWriter, type Logger } from '../observability/logger.js';
import { UNMATCHED, type GatewayMetrics } from '../observability/metrics.js';
import { errorBody, rawAnswer, writeAnswer, type Reason } from '../lib/answers.js';
import type { GatewayEnv } from './context.js';
import { requestIdSource } from './middleware/request-id.js';
import { gateRefusal } from './request-gate.js';

/**
 * The public HTTP server: Node's parser with bounded headers and timeouts against slow senders,
 * the request gate (server/request-gate.ts) before the app sees a request, and a two-field JSON
 * answer for everything refused at this level: oversized headers 431, a request that took too
 * long 408, malformed HTTP 400 (including Content-Length with Transfer-Encoding, RFC 9112 §6.3),
 * an `Expect` other than 100-continue 417, CONNECT 501.
 *
 * Each of these answers has an access line with its reason and counts in the metrics, like any
 * other answer the gateway writes itself (docs/operations.md "Logs").
 *
 * Pipelined requests keep their answers: when the parser fails on a request that follows others
 * still being answered, those get their answers first and the refusal comes after them
 * (docs/operations.md "Hostile clients").
 */

/** How long a connection refused at this level is read from (and the bytes dropped) before it is closed. */
const LINGER_MS = 2000;

export interface PublicServer {
  readonly server: http.Server;
  /** Requests whose answer is not complete yet. */
  inFlight(): number;
}

type ServerSettings = Pick<Settings, 'maxHeaderBytes' | 'maxHeaderCount' | 'headersTimeoutMs' | 'requestTimeoutMs'>;

interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
}

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

export function createPublicServer(
  app: Hono<GatewayEnv>,
  settings: ServerSettings,
  observe: { logger: Logger; metrics: GatewayMetrics },
  onUpgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void,
): PublicServer {
  const logRefusal = refusalLog(observe.logger, observe.metrics);
  const nextId = requestIdSource();
  const listener = getRequestListener(app.fetch, {
    // A request node-server cannot turn into a URL (bad Host header, absolute-form oddities).
    errorHandler: () =>
      new Response(errorBody(400, 'Malformed request'), {
        status: 400,
        headers: { 'Content-Type': 'application/json' },
      }),
  });
  const server = http.createServer(serverOptions(settings));
  // Every header line the parser reads is kept, so the framing it used is framing the gateway sees;
  // MAX_HEADER_COUNT bounds them instead (the gate).
  server.maxHeadersCount = 0;
  // A client that half-closes after its request still gets the answer: Node would end the connection at
  // once. (An undocumented switch of Node's http.Server, read by its end-of-input handler since Node 0.x;
  // the half-open tests in test/integration/hostile-smuggling.test.ts pin it.)
  (server as http.Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
  const answers = new OpenAnswers();

  server.on('request', function gatedRequest(req: IncomingMessage, res: ServerResponse) {
    answers.track(req, res);
    const refusal = gateRefusal(req, settings.maxHeaderCount);
    if (refusal) {
      const requestId = nextId();
      writeAnswer(res, refusal.status, refusal.message, [
        ['Connection', 'close'],
        ['X-Request-Id', requestId],
      ]);
      logRefusal({ status: refusal.status, reason: refusal.reason, socket: req.socket, method: req.method, requestId });
      return;
    }
    void listener(req, res);
  });

  server.on('upgrade', function gatedUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer) {
    const refusal = gateRefusal(req, settings.maxHeaderCount, true);
    if (!refusal) return onUpgrade(req, socket, head);
    socket.on('error', () => socket.destroy());
    const requestId = nextId();
    answerAndLinger(socket, refusal.status, refusal.message, requestId);
    logRefusal({ status: refusal.status, reason: refusal.reason, socket, method: 'WS', requestId });
  });

  server.on('checkExpectation', function unsupportedExpectation(req: IncomingMessage, res: ServerResponse) {
    const requestId = nextId();
    writeAnswer(res, 417, 'Only Expect: 100-continue is supported', [
      ['Connection', 'close'],
      ['X-Request-Id', requestId],
    ]);
    logRefusal({ status: 417, reason: 'expectation', socket: req.socket, method: req.method, requestId });
  });

  server.on('connect', function refuseConnect(req: IncomingMessage, socket: Duplex) {
    socket.on('error', () => socket.destroy());
    const requestId = nextId();
    answerAndLinger(socket, 501, 'CONNECT is not supported', requestId);
    logRefusal({ status: 501, reason: 'not-implemented', socket, method: req.method, requestId });
  });

  server.on(
    'clientError',
    clientErrorHandler(answers, observe.logger, (status, reason, socket, method) => {
      const requestId = nextId();
      logRefusal({ status, reason, socket, method, requestId });
      return requestId;
    }),
  );
  return { server, inFlight: () => answers.inFlight };
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

/** The answers of each connection that are not complete yet, in the order their requests came. */
class OpenAnswers {
  readonly #open = new WeakMap<Duplex, Set<ServerResponse>>();
  inFlight = 0;

  track(req: IncomingMessage, res: ServerResponse): void {
    this.inFlight++;
    let answers = this.#open.get(req.socket);
    if (!answers) this.#open.set(req.socket, (answers = new Set()));
    answers.add(res);
    res.once('close', this.#closed);
  }

  pending(socket: Duplex): Exchange[] {
    return [...(this.#open.get(socket) ?? [])].map((res) => ({ req: res.req, res }));
  }

  /** One listener for every answer: Node calls it with the answer as `this`. */
  readonly #closed: (this: ServerResponse) => void;

  constructor() {
    const open = this.#open;
    const count = (by: number): void => {
      this.inFlight += by;
    };
    this.#closed = function answerClosed(this: ServerResponse) {
      count(-1);
      open.get(this.req.socket)?.delete(this);
    };
  }
}

/**
 * Node's parser failed on a connection. The request whose own bytes broke off is refused at once;
 * a failure in a request that follows complete ones still being answered waits for their answers.
 */
function clientErrorHandler(
  answers: OpenAnswers,
  logger: Logger,
  answered: (status: number, reason: Reason, socket: Duplex, method: string | undefined) => string,
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
    const [status, reason, message] = clientErrorAnswer(err.code);
    logger.debug({ code: err.code, status }, 'client error');
    const refuse = (method?: string): void =>
      answerAndLinger(socket, status, message, answered(status, reason, socket, method));
    const pending = answers.pending(socket);
    // A request whose own bytes broke off (or stopped coming) can never be answered by a bridge.
    const broken = pending.find((e) => !e.req.complete);
    if (broken) {
      if (!broken.res.headersSent) refuse(broken.req.method);
      // The gate's refusal of this very request is on its way and closes the connection.
      else if (!broken.res.writableEnded) socket.destroy();
      return;
    }
    const last = pending.at(-1);
    if (!last) {
      refuse();
      return;
    }
    // The failure is in a request that follows complete ones still being answered: they get their
    // answers first, then this refusal (unless the last of them closes the connection anyway: a
    // client that half-closed, or a refusal that said Connection: close).
    last.res.prependOnceListener('finish', () => {
      if (last.res.shouldKeepAlive && socket.writable) refuse();
    });
  };
}

/**
 * Writes a gateway answer straight to the connection and closes it lingering, as nginx does:
 * what the client still sends is read and dropped for a moment, so that the answer is not lost to
 * a reset, and then the connection is closed, also when the client never closes its side.
 */
function answerAndLinger(socket: Duplex, status: number, message: string, requestId: string): void {
  socket.end(rawAnswer(status, message, [['X-Request-Id', requestId]]));
  socket.resume();
  setTimeout(() => socket.destroy(), LINGER_MS).unref();
}

function clientErrorAnswer(code: string | undefined): [number, Reason, string] {
  switch (code) {
    case 'HPE_HEADER_OVERFLOW':
      return [431, 'header-size', 'Request headers are too large'];
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return [408, 'client-timeout', 'Request took too long to arrive'];
    case 'HPE_CHUNK_EXTENSIONS_OVERFLOW':
      return [413, 'body-size', 'Chunk extensions are too large'];
    case 'HPE_UNEXPECTED_CONTENT_LENGTH':
      return [400, 'bad-request', 'Content-Length and Transfer-Encoding together are not accepted'];
    default:
      return [400, 'bad-request', 'Malformed HTTP request'];
  }
}
