import http, { type ClientRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import { BRIDGES, type BridgeName } from '../config/settings.js';
import type { HeaderList } from '../limits/headers.js';
import { writeAnswer } from '../server/answers.js';
import { START, isEnded, step, type ExchangeAction, type ExchangeEvent, type ExchangeState } from './exchange.js';
import { requestHeaderList, responseHeaderList, type BodyFraming } from './headers.js';

/**
 * HTTP forwarding to the bridges with node:http: one keep-alive agent per bridge, one
 * `http.request` per exchange, bodies streamed both ways with backpressure. The bridge's status,
 * headers and body come back unchanged, in one `writeHead` with the gateway's usage headers added.
 * What happens when is decided by the state machine of proxy/exchange.ts; this module only turns
 * socket events into its events and its actions into socket calls. (WebSocket upgrades are
 * joined in ws/bridge-proxy.ts.)
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
  /** Request fields never forwarded (lower case). */
  readonly droppedHeaders?: ReadonlySet<string>;
}

export interface ForwardResult {
  /** What the client got (499: it left first). */
  readonly status: number;
  /** Milliseconds until the bridge's status line (absent when it never came). */
  readonly upstreamMs: number | undefined;
}

export interface ForwarderOptions {
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly timeoutMs: number;
  readonly onError?: (err: Error, context: { bridge: BridgeName; phase: string }) => void;
}

/** Where one bridge is, and the connections to it. */
export interface BridgeTarget {
  readonly name: BridgeName;
  readonly request: typeof http.request;
  readonly agent: http.Agent;
  readonly hostname: string;
  readonly port: number;
  /** The bridge URL's path, to which the normalised path is appended (no trailing slash). */
  readonly basePath: string;
  /** `Host` as the bridge expects it. */
  readonly host: string;
}

export function bridgeTarget(name: BridgeName, url: URL): BridgeTarget {
  const secure = url.protocol === 'https:';
  const agent = new (secure ? https.Agent : http.Agent)({
    keepAlive: true,
    keepAliveMsecs: 1000,
    maxFreeSockets: 256,
    scheduling: 'lifo',
  });
  return {
    name,
    request: secure ? https.request : http.request,
    agent,
    hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: Number(url.port || (secure ? 443 : 80)),
    basePath: url.pathname.replace(/\/+$/, ''),
    host: url.host,
  };
}

/** Logged as the status of a request whose client left before its answer (nginx's convention). */
const CLIENT_GONE = 499;
const RESENDABLE_METHODS = new Set(['GET', 'HEAD']);

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
    for (const bridge of BRIDGES) this.#targets[bridge].agent.destroy();
  }
}

/** How the request's body reaches the bridge. */
type BodySource = 'buffered' | 'none' | 'streamed';

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
  #bridgeRequest: ClientRequest | undefined;
  #bridgeResponse: IncomingMessage | undefined;
  #status: number | undefined;
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
      framing = { kind: 'chunked' };
    } else if (contentLength !== undefined && contentLength !== '0') {
      this.#source = 'streamed';
      framing = { kind: 'length', length: Number(contentLength) };
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
      ...(request.droppedHeaders ? { dropped: request.droppedHeaders } : {}),
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
    this.#send();
    if (this.#source === 'streamed') {
      incoming.on('data', this.#onBodyData);
      incoming.once('end', this.#onBodyEnd);
    } else if (this.#source === 'none') {
      // Bytes for a request that announced none were framed by something the gateway did not see.
      incoming.once('data', this.#onUnannouncedBody);
    }
  }

  #send(): void {
    const { incoming, target, body } = this.#request;
    const bridgeRequest = this.#target.request({
      agent: this.#target.agent,
      hostname: this.#target.hostname,
      port: this.#target.port,
      method: incoming.method,
      path: this.#target.basePath + target,
      headers: this.#headers,
      setHost: false,
    });
    this.#bridgeRequest = bridgeRequest;
    bridgeRequest.once('response', this.#onResponse);
    bridgeRequest.once('finish', this.#onRequestSent);
    bridgeRequest.on('error', (err: NodeJS.ErrnoException) => this.#onBridgeError(bridgeRequest, err));
    if (this.#source === 'buffered') bridgeRequest.end(body);
    else if (this.#source === 'none') bridgeRequest.end();
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
        this.#bridgeRequest?.destroy();
        this.#bridgeResponse?.destroy();
        return;
      case 'resend':
        this.#send();
        return;
      case 'pass-answer':
        this.#passAnswer();
        return;
      case 'answer-502':
        this.#answer(502, 'Bridge unreachable');
        return;
      case 'answer-504':
        this.#answer(504, 'Bridge did not answer in time');
        return;
      case 'answer-413':
        this.#answer(413, `Request body is larger than ${this.#request.maxBodyBytes} bytes`, [['Connection', 'close']]);
        return;
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

  #passAnswer(): void {
    const response = this.#bridgeResponse as IncomingMessage;
    const { outgoing, answerHeaders } = this.#request;
    outgoing.writeHead(
      this.#status as number,
      response.statusMessage,
      responseHeaderList(response.rawHeaders, response.headers.connection, answerHeaders),
    );
    response.on('data', this.#onResponseData);
    response.once('end', this.#onResponseEnd);
    response.once('close', this.#onResponseClose);
    response.pipe(outgoing);
  }

  /** A gateway answer; only ever before the bridge's status line was passed on (step() sees to it). */
  #answer(status: number, message: string, extra: HeaderList = []): void {
    const { outgoing, answerHeaders } = this.#request;
    if (outgoing.headersSent || outgoing.destroyed) {
      outgoing.destroy();
      return;
    }
    this.#status = status;
    writeAnswer(outgoing, status, message, extra.length ? [...answerHeaders, ...extra] : answerHeaders);
  }

  readonly #onRequestSent = (): void => this.#dispatch({ type: 'request-sent' });

  readonly #onResponse = (response: IncomingMessage): void => {
    this.#bridgeResponse = response;
    this.#status = response.statusCode ?? 502;
    this.#upstreamMs = performance.now() - this.#started;
    this.#dispatch({ type: 'response' });
  };

  // Progress of the answer keeps a bridge that is still sending from being taken for a stalled one.
  readonly #onResponseData = (): void => {
    this.#timer?.refresh();
  };
  readonly #onResponseEnd = (): void => this.#dispatch({ type: 'response-end' });
  readonly #onResponseClose = (): void => {
    if (!this.#bridgeResponse?.complete) this.#dispatch({ type: 'response-broken' });
  };

  #onBridgeError(bridgeRequest: ClientRequest, err: NodeJS.ErrnoException): void {
    // An attempt already given up (aborted, or replaced by a resend) has nothing more to say.
    if (bridgeRequest !== this.#bridgeRequest || isEnded(this.#state)) return;
    const resendable =
      this.#status === undefined &&
      this.#source === 'none' &&
      bridgeRequest.reusedSocket &&
      err.code === 'ECONNRESET' &&
      RESENDABLE_METHODS.has(this.#request.incoming.method ?? '');
    if (!resendable || this.#state.resent) {
      this.#onError(err, { bridge: this.#target.name, phase: this.#status === undefined ? 'request' : 'response' });
    }
    this.#dispatch({ type: 'bridge-error', resendable });
  }

  readonly #onTimer = (): void => {
    this.#dispatch({
      type: 'timer',
      // The client is the slow one while its body still arrives and the bridge reads all of it; a
      // bridge that stops reading makes the writes back up.
      clientStillSending: !this.#request.incoming.complete,
      bridgeBackedUp: this.#bridgeRequest?.writableNeedDrain ?? false,
    });
  };

  readonly #onBodyData = (chunk: Buffer): void => {
    this.#bodyBytes += chunk.length;
    if (this.#bodyBytes > this.#request.maxBodyBytes) {
      this.#dispatch({ type: 'body-too-large' });
      return;
    }
    const bridgeRequest = this.#bridgeRequest as ClientRequest;
    if (!bridgeRequest.write(chunk)) {
      const { incoming } = this.#request;
      incoming.pause();
      bridgeRequest.once('drain', () => {
        if (!isEnded(this.#state)) incoming.resume();
      });
    }
  };

  readonly #onBodyEnd = (): void => {
    if (!isEnded(this.#state)) this.#bridgeRequest?.end();
  };

  readonly #onUnannouncedBody = (): void => {
    this.#onError(new Error('body bytes on a request whose headers announce no body'), {
      bridge: this.#target.name,
      phase: 'request',
    });
    this.#dispatch({ type: 'framing-mismatch' });
  };

  readonly #onClientClose = (): void => {
    const { outgoing } = this.#request;
    if (!outgoing.writableFinished) this.#dispatch({ type: 'client-gone' });
    clearTimeout(this.#timer);
    this.#resolve({
      status: this.#state.phase === 'client-gone' ? CLIENT_GONE : (this.#status ?? outgoing.statusCode),
      upstreamMs: this.#upstreamMs,
    });
  };
}
