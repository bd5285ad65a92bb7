import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Readable } from 'node:stream';
import type { Dispatcher, Client as IndexClient } from 'undici';
import Client from 'undici/lib/dispatcher/client.js';
import Pool from 'undici/lib/dispatcher/pool.js';
import { BRIDGES, type BridgeName } from '../config/settings.js';
import type { HeaderList } from '../lib/header-list.js';
import { CLIENT_GONE, writablePhrase, writeAnswer, type Reason } from '../lib/answers.js';
import { CLIENT_FAILED, clientFailure } from '../lib/client-failure.js';
import {
  START,
  isEnded,
  resendable,
  step,
  type ExchangeAction,
  type ExchangeEvent,
  type ExchangeState,
} from './exchange.js';
import { requestHeaderList, responseHeaderList, type BodyFraming } from './headers.js';

/**
 * HTTP forwarding to the bridges with undici: one connection pool per bridge (kept alive, one
 * request at a time per connection), one `dispatch` per exchange, bodies streamed both ways with
 * backpressure, but for a request body of known length up to GATHERED_BODY_BYTES, which is read
 * whole and written with the head (undici corks the two into one write). undici's dispatch API
 * costs far less per request than `http.request` (no ClientRequest or IncomingMessage objects,
 * no agent bookkeeping): docs/performance.md
 * has the measurements. The bridge's status, headers and body come back unchanged, in one
 * `writeHead` with the gateway's usage headers added. What happens when is decided by the state
 * machine of proxy/exchange.ts; this module only turns undici's callbacks into its events and its
 * actions into calls. (WebSocket upgrades are joined in ws/bridge-proxy.ts.)
 */

export interface ForwardRequest {
  readonly incoming: IncomingMessage;
  readonly outgoing: ServerResponse;
  readonly bridge: BridgeName;
  /** Normalised path and the original query. */
  readonly target: string;
  /** A body the gateway already read (credential routes); otherwise the client's body is read here. */
  readonly body: Buffer | undefined;
  readonly maxBodyBytes: number;
  readonly requestId: string;
  readonly clientAddress: string;
  /** The usage headers, added (with `X-Request-Id`) to the bridge's answer and to a 502/504/413 the forwarder writes. */
  readonly usageHeaders: HeaderList;
  /** The gateway answers CORS (README "CORS"): the bridge's `Access-Control-*` fields are dropped. */
  readonly ownsCors?: boolean;
  /** Request fields never forwarded (lower case). */
  readonly droppedHeaders?: ReadonlySet<string>;
  /** Fields added for the bridge (flat list): who is calling (README "Forwarding"). */
  readonly addedHeaders?: readonly string[] | undefined;
}

export interface ForwardResult {
  /** What the client got (499: it left first). */
  readonly status: number;
  /** Why, when the forwarder answered itself (502, 504, 413, or a client failure's 408, 400, 413). */
  readonly reason?: Reason | undefined;
  /** Milliseconds until the bridge's status line (absent when it never came). */
  readonly upstreamMs: number | undefined;
}

export interface ForwarderOptions {
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly timeoutMs: number;
  readonly onError?: (err: Error, context: { bridge: BridgeName; phase: string }) => void;
}

/** Where one bridge is, and the connections to it. */
interface BridgeTarget {
  readonly name: BridgeName;
  readonly pool: Pool;
  /** The bridge URL's path, to which the normalised path is appended (no trailing slash). */
  readonly basePath: string;
  /** `Host` as the bridge expects it. */
  readonly host: string;
}

function bridgeTarget(name: BridgeName, url: URL): BridgeTarget {
  const pool = new Pool(url.origin, {
    // One request per connection at a time: a pipelined connection would tie one client's answer
    // to another's (docs/operations.md "Hostile clients").
    pipelining: 1,
    // The exchange's own timer applies UPSTREAM_TIMEOUT_MS by its rules (proxy/exchange.ts).
    headersTimeout: 0,
    bodyTimeout: 0,
    // The pool calls only `dispatch` and the lifecycle methods of what it makes (see src/types/undici.d.ts).
    factory: (origin, options) => new BridgeClient(origin, options) as unknown as Dispatcher,
  });
  return { name, pool, basePath: url.pathname.replace(/\/+$/, ''), host: url.host };
}

/**
 * One connection of a bridge's pool: undici's Client holds one socket at a time and, with
 * pipelining 1, one exchange on it at a time. It counts the answers its socket has carried, which
 * tells an attempt whether it went out on a kept-alive connection, the one case of a resend
 * (README "Forwarding"). undici's errors cannot tell: a reset carries nothing of its socket, and a
 * new TLS connection has read bytes (its handshake) before its first request.
 */
class BridgeClient extends Client {
  /** Whole answers the current socket has carried; a new socket has carried none. */
  answered = 0;

  constructor(origin: URL, options: IndexClient.Options) {
    super(origin, options);
    this.on('connect', () => {
      this.answered = 0;
    });
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    // The pool gives each request to one client, which writes it on the socket it holds then.
    if (handler instanceof Attempt) handler.client = this;
    return super.dispatch(options, handler);
  }
}

/**
 * Errors of a connection the bridge closed or reset: undici's own when the socket ended or closed
 * under a request, and the system's when it was reset or written after the bridge's close. An
 * answer that is not HTTP (HPE_*) or whose head is too long is the bridge failing the request.
 */
const CONNECTION_CLOSED = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);

/** Statuses whose answer never has a body, whatever its `Content-Length` says (RFC 9110 §6.4.1). */
const BODILESS_STATUSES: ReadonlySet<number> = new Set([204, 304]);

/**
 * undici takes a 204's or 304's `Content-Length` for a body still to come and fails the answer when
 * none does (it makes that exception for HEAD only): the answer was whole. A 304 states there the
 * length of the representation it validates (RFC 9110 §8.6).
 */
function bodilessAnswer(status: number | undefined, err: Error): boolean {
  return (
    status !== undefined &&
    BODILESS_STATUSES.has(status) &&
    (err as NodeJS.ErrnoException).code === 'UND_ERR_RES_CONTENT_LENGTH_MISMATCH'
  );
}

export class Forwarder {
  readonly #targets: Readonly<Record<BridgeName, BridgeTarget>>;
  readonly #timeoutMs: number;
  readonly #onError: NonNullable<ForwarderOptions['onError']>;

  constructor(options: ForwarderOptions) {
    this.#timeoutMs = options.timeoutMs;
    this.#onError = options.onError ?? (() => {});
    const targets = {} as Record<BridgeName, BridgeTarget>;
    for (const bridge of BRIDGES) targets[bridge] = bridgeTarget(bridge, options.bridges[bridge]);
    this.#targets = targets;
  }

  /** Forwards one request; resolves when the client's answer is complete (or the client left). */
  forward(request: ForwardRequest): Promise<ForwardResult> {
    return new Promise((resolve) => {
      new HttpExchange(this.#targets[request.bridge], this.#timeoutMs, this.#onError, request, resolve).start();
    });
  }

  close(): void {
    for (const bridge of BRIDGES) void this.#targets[bridge].pool.destroy();
  }
}

/**
 * A request body of known length up to this is read whole before it is sent, as one buffer with
 * the head; a longer one, or one without a length, is streamed. Streaming a small body cost the
 * gateway about 30 % more CPU per request: under load, whole requests outlived V8's young
 * generation and filled the old one (docs/performance.md, change 14). The bound is what a
 * streamed body holds in its buffers anyway.
 */
export const GATHERED_BODY_BYTES = 16 * 1024;

/**
 * How the request's body reaches the bridge: `buffered`, read by the gateway before (credential
 * routes); `gathered`, read whole here first; `streamed`; or `none`.
 */
type BodySource = 'buffered' | 'gathered' | 'none' | 'streamed';

/**
 * One dispatch to the bridge, as undici's handler. A resend is a new attempt: whatever the one
 * before it still reports is ignored.
 */
class Attempt implements Dispatcher.DispatchHandler {
  readonly #exchange: HttpExchange;
  #abort: ((reason?: Error) => void) | undefined;
  #cancelled = false;
  #keptAlive = false;
  resume: (() => void) | undefined;
  /** The pool's connection that took the attempt. */
  client: BridgeClient | undefined;

  constructor(exchange: HttpExchange) {
    this.#exchange = exchange;
  }

  /** Ends the attempt now, or as soon as undici starts it (a request still waiting for a connection has no abort yet). */
  cancel(): void {
    this.#cancelled = true;
    this.#abort?.(new Error('forwarding ended by the gateway'));
  }

  /** Whether the attempt was written on a connection that had carried earlier answers. */
  get keptAlive(): boolean {
    return this.#keptAlive;
  }

  /** undici calls it as it writes the request on its client's socket. */
  onConnect(abort: (reason?: Error) => void): void {
    this.#keptAlive = (this.client?.answered ?? 0) > 0;
    this.#abort = abort;
    if (this.#cancelled) abort(new Error('forwarding ended by the gateway'));
  }

  onRequestSent(): void {
    this.#exchange.requestSent(this);
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void, statusText: string): boolean {
    // undici reports an informational answer (102 Processing, 103 Early Hints) as a status line of
    // its own, before the final one: it is not passed on, as nginx does not (it is only
    // informational, RFC 9110 §15.2); taken for the answer, its head went out and the final one's
    // could not follow.
    if (statusCode < 200) return true;
    this.resume = resume;
    return this.#exchange.response(this, statusCode, rawHeaders, statusText);
  }

  onData(chunk: Buffer): boolean {
    return this.#exchange.data(this, chunk);
  }

  onComplete(): void {
    // Counted before the client can write its next request on the socket.
    if (this.client) this.client.answered++;
    this.#exchange.complete(this);
  }

  onError(err: Error): void {
    this.#exchange.failed(this, err);
  }
}

/** The sockets of one exchange; every decision is step()'s. */
class HttpExchange {
  readonly #target: BridgeTarget;
  readonly #timeoutMs: number;
  readonly #onError: NonNullable<ForwarderOptions['onError']>;
  readonly #request: ForwardRequest;
  readonly #resolve: (result: ForwardResult) => void;
  readonly #started = performance.now();
  readonly #source: BodySource;
  readonly #headers: string[];
  #state: ExchangeState = START;
  #timer: NodeJS.Timeout | undefined;
  #attempt: Attempt | undefined;
  /** The client's streamed body as the bridge reads it (never the client's stream itself, which undici would destroy on an abort). */
  #body: Readable | undefined;
  /** The parts of a gathered body as they arrive. */
  #gathered: Buffer[] = [];
  #status: number | undefined;
  #reason: Reason | undefined;
  #upstreamMs: number | undefined;
  #bodyBytes = 0;

  constructor(
    target: BridgeTarget,
    timeoutMs: number,
    onError: NonNullable<ForwarderOptions['onError']>,
    request: ForwardRequest,
    resolve: (result: ForwardResult) => void,
  ) {
    this.#target = target;
    this.#timeoutMs = timeoutMs;
    this.#onError = onError;
    this.#request = request;
    this.#resolve = resolve;
    const { incoming } = request;
    const transferEncoding = incoming.headers['transfer-encoding'];
    const contentLength = incoming.headers['content-length'];
    let framing: BodyFraming;
    if (request.body) {
      this.#source = 'buffered';
      framing = { kind: 'length', length: request.body.length };
    } else if (transferEncoding !== undefined) {
      this.#source = 'streamed';
      // undici sends a body of unknown length chunked by itself.
      framing = { kind: 'none' };
    } else if (contentLength !== undefined && contentLength !== '0') {
      const length = Number(contentLength);
      // Within MAX_BODY_BYTES too: a longer body is cut at the limit as it streams (413).
      this.#source = length <= Math.min(GATHERED_BODY_BYTES, request.maxBodyBytes) ? 'gathered' : 'streamed';
      framing = { kind: 'length', length };
    } else {
      // RFC 9112 §6.3: without either field a request has no body, and none is sent.
      this.#source = 'none';
      framing = contentLength === '0' ? { kind: 'length', length: 0 } : { kind: 'none' };
    }
    this.#headers = requestHeaderList(incoming.rawHeaders, {
      bridgeHost: target.host,
      clientAddress: request.clientAddress,
      proto: (incoming.socket as Socket & { encrypted?: boolean }).encrypted ? 'https' : 'http',
      requestId: request.requestId,
      framing,
      dropped: request.droppedHeaders,
      added: request.addedHeaders,
      clientTarget: incoming.url,
    });
  }

  start(): void {
    const { incoming, outgoing } = this.#request;
    // The client left while its request was checked: nothing goes to the bridge.
    if (outgoing.destroyed || incoming.socket.destroyed) {
      this.#resolve({ status: CLIENT_GONE, upstreamMs: undefined });
      return;
    }
    outgoing.once('close', this.#onClientClose);
    this.#timer = setTimeout(this.#onTimer, this.#timeoutMs);
    // Only a body still on its way can fail (lib/client-failure.ts).
    if (this.#source !== 'none' && !incoming.complete) incoming.once(CLIENT_FAILED, this.#onClientFailure);
    if (this.#source === 'gathered') {
      // Sent once it is all here: until then any wait is the client's (the 'timer' event's rules).
      incoming.on('data', this.#onGatheredData);
      incoming.once('end', this.#onGatheredEnd);
      return;
    }
    if (this.#source === 'streamed') {
      this.#body = new Readable({ read: () => void incoming.resume() });
      incoming.on('data', this.#onBodyData);
      incoming.once('end', this.#onBodyEnd);
    } else if (this.#source === 'none') {
      // Bytes for a request that announced none were framed by something the gateway did not see.
      incoming.once('data', this.#onUnannouncedBody);
    }
    this.#send();
  }

  #send(): void {
    const { incoming, target, body } = this.#request;
    const attempt = new Attempt(this);
    this.#attempt = attempt;
    try {
      this.#target.pool.dispatch(
        {
          method: incoming.method ?? 'GET',
          path: this.#target.basePath + target,
          headers: this.#headers,
          body: this.#bodyToSend(body),
        },
        attempt,
      );
    } catch (err) {
      // undici refused the request outright (it checks header names and values as Node's parser did).
      this.failed(attempt, err as Error);
    }
  }

  #bodyToSend(buffered: Buffer | undefined): Buffer | Readable | null {
    switch (this.#source) {
      case 'buffered':
        return buffered ?? null;
      case 'gathered': {
        const whole = this.#gathered.length === 1 ? (this.#gathered[0] as Buffer) : Buffer.concat(this.#gathered);
        this.#gathered = [];
        return whole;
      }
      case 'streamed':
        return this.#body ?? null;
      case 'none':
        return null;
    }
  }

  #dispatch(event: ExchangeEvent): void {
    const { state, actions } = step(this.#state, event);
    this.#state = state;
    for (const action of actions) this.#act(action);
  }

  #act(action: ExchangeAction): void {
    switch (action) {
      case 'refresh-timer':
        this.#timer?.refresh();
        return;
      case 'clear-timer':
        clearTimeout(this.#timer);
        return;
      case 'abort-bridge':
        this.#attempt?.cancel();
        this.#body?.destroy();
        return;
      case 'resend':
        this.#send();
        return;
      case 'pass-answer':
        // The head is written in response(), where the bridge's raw headers are at hand.
        return;
      case 'answer-502':
        this.#answer('bridge-unreachable', 502, 'Bridge unreachable');
        return;
      case 'answer-504':
        this.#answer('bridge-timeout', 504, 'Bridge did not answer in time');
        return;
      case 'answer-413':
        this.#answer('body-size', 413, `Request body is larger than ${this.#request.maxBodyBytes} bytes`, [
          ['Connection', 'close'],
        ]);
        return;
      case 'answer-client-failure': {
        // The answer the HTTP layer marked the request with, in this request's name (lib/client-failure.ts).
        const failure = clientFailure(this.#request.incoming);
        if (failure) this.#answer(failure[1], failure[0], failure[2], [['Connection', 'close']]);
        return;
      }
      case 'stop-reading': {
        const { incoming, outgoing } = this.#request;
        incoming.off('data', this.#onBodyData);
        incoming.pause();
        // The rest of the body is never read: the connection closes after the answer.
        outgoing.shouldKeepAlive = false;
        return;
      }
      case 'close-client':
        this.#request.outgoing.destroy();
        this.#request.incoming.socket.destroy();
        return;
    }
  }

  /** A gateway answer; only ever before the bridge's status line was passed on (step() sees to it). */
  #answer(reason: Reason, status: number, message: string, extra: HeaderList = []): void {
    const { outgoing, usageHeaders, requestId } = this.#request;
    if (outgoing.headersSent || outgoing.destroyed) {
      outgoing.destroy();
      return;
    }
    this.#status = status;
    this.#reason = reason;
    writeAnswer(outgoing, status, message, [...usageHeaders, ['X-Request-Id', requestId], ...extra]);
  }

  // undici's callbacks, through the attempt that is current.

  requestSent(attempt: Attempt): void {
    if (attempt === this.#attempt) this.#dispatch({ type: 'request-sent' });
  }

  response(attempt: Attempt, statusCode: number, rawHeaders: Buffer[], statusText: string): boolean {
    if (attempt !== this.#attempt) return false;
    this.#status = statusCode;
    this.#upstreamMs = performance.now() - this.#started;
    this.#dispatch({ type: 'response' });
    if (this.#state.phase !== 'streaming') return false;
    const { outgoing, usageHeaders, requestId, ownsCors } = this.#request;
    const headers = responseHeaderList(latin1(rawHeaders), usageHeaders, ownsCors);
    headers.push('X-Request-Id', requestId);
    // A reason phrase Node will not write (a control character: undici passes one on) would throw
    // here and cut the answer: Node's own phrase for the status then (clients ignore it, RFC 9112 §4).
    outgoing.writeHead(statusCode, writablePhrase(statusText) ? statusText : undefined, headers);
    return true;
  }

  data(attempt: Attempt, chunk: Buffer): boolean {
    if (attempt !== this.#attempt || isEnded(this.#state)) return false;
    // Progress of the answer keeps a bridge that is still sending from being taken for a stalled one.
    this.#timer?.refresh();
    const { outgoing } = this.#request;
    if (outgoing.write(chunk)) return true;
    // A client that stops reading stops the bridge too; UPSTREAM_TIMEOUT_MS without progress ends it.
    outgoing.once('drain', this.#onClientDrain);
    return false;
  }

  complete(attempt: Attempt): void {
    if (attempt !== this.#attempt || isEnded(this.#state)) return;
    this.#request.outgoing.end();
    this.#dispatch({ type: 'response-end' });
  }

  failed(attempt: Attempt, err: Error): void {
    // An attempt already given up (aborted, or replaced by a resend) has nothing more to say.
    if (attempt !== this.#attempt || isEnded(this.#state)) return;
    if (bodilessAnswer(this.#status, err)) {
      this.complete(attempt);
      return;
    }
    const again = resendable({
      method: this.#request.incoming.method ?? '',
      hasBody: this.#source !== 'none',
      answered: this.#status !== undefined,
      keptAlive: attempt.keptAlive,
      connectionClosed: CONNECTION_CLOSED.has((err as NodeJS.ErrnoException).code ?? ''),
    });
    if (!again || this.#state.resent) {
      this.#onError(err, { bridge: this.#target.name, phase: this.#status === undefined ? 'request' : 'response' });
    }
    this.#dispatch({ type: 'bridge-error', resendable: again });
  }

  readonly #onClientDrain = (): void => {
    this.#attempt?.resume?.();
  };

  readonly #onTimer = (): void => {
    this.#dispatch({
      type: 'timer',
      // The client is the slow one while its body still arrives and the bridge reads all of it; a
      // bridge that stops reading leaves the body's buffer full.
      clientStillSending: !this.#request.incoming.complete,
      bridgeBackedUp: this.#body !== undefined && this.#body.readableLength >= this.#body.readableHighWaterMark,
    });
  };

  readonly #onBodyData = (chunk: Buffer): void => {
    this.#bodyBytes += chunk.length;
    if (this.#bodyBytes > this.#request.maxBodyBytes) {
      this.#dispatch({ type: 'body-too-large' });
      return;
    }
    if (!(this.#body as Readable).push(chunk)) this.#request.incoming.pause();
  };

  readonly #onGatheredData = (chunk: Buffer): void => {
    this.#gathered.push(chunk);
  };

  readonly #onGatheredEnd = (): void => {
    this.#dispatch({ type: 'body-read' });
    // The client left (or the exchange ended otherwise) while its body came: nothing is sent.
    if (!isEnded(this.#state)) this.#send();
  };

  readonly #onBodyEnd = (): void => {
    if (!isEnded(this.#state)) this.#body?.push(null);
  };

  readonly #onUnannouncedBody = (): void => {
    this.#onError(new Error('body bytes on a request whose headers announce no body'), {
      bridge: this.#target.name,
      phase: 'request',
    });
    this.#dispatch({ type: 'framing-mismatch' });
  };

  readonly #onClientFailure = (): void => {
    this.#dispatch({ type: 'client-failed' });
  };

  readonly #onClientClose = (): void => {
    const { outgoing } = this.#request;
    if (!outgoing.writableFinished) this.#dispatch({ type: 'client-gone' });
    clearTimeout(this.#timer);
    this.#resolve({
      status: this.#state.phase === 'client-gone' ? CLIENT_GONE : (this.#status ?? outgoing.statusCode),
      reason: this.#reason,
      upstreamMs: this.#upstreamMs,
    });
  };
}

/** undici's raw header names and values (latin1, as on the wire). */
function latin1(raw: readonly Buffer[]): string[] {
  const out = new Array<string>(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = (raw[i] as Buffer).toString('latin1');
  return out;
}
