import type { ClientRequest, IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { Transform, type Duplex } from 'node:stream';
import type * as HttpProxyMiddleware from 'http-proxy-middleware';
import type { RequestHandler } from 'http-proxy-middleware';
import { BRIDGES, type BridgeName } from '../config/settings.js';
import type { HeaderList } from '../lib/header-list.js';
import { requestHeaderList, responseHeaderList } from '../proxy/headers.js';
import { CLIENT_GONE, rawAnswer, statusPhrase, writablePhrase, type Reason } from '../lib/answers.js';
import { endAndLinger } from '../lib/linger.js';

/**
 * WebSocket upgrades to the bridges (README "WebSocket channels"), through http-proxy-middleware,
 * which joins the handshake and the two sockets. The upgrade request gets the same header rules
 * as any forwarded request (proxy/headers.ts); the bridge's 101 carries the usage headers. A bridge
 * that cannot be reached gets the client a 502, one that does not answer the upgrade within
 * `timeoutMs` a 504; a bridge that refuses the upgrade has its answer passed through, with the usage
 * headers added. Every answer that opens no WebSocket closes the client's connection lingering
 * (lib/linger.ts): its socket is released in each case (docs/operations.md "Bridges").
 */

export interface UpgradeRequest {
  readonly incoming: IncomingMessage;
  readonly socket: Duplex;
  readonly head: Buffer;
  readonly bridge: BridgeName;
  readonly target: string;
  readonly requestId: string;
  readonly clientAddress: string;
  /** Added to the 101, to a bridge's refusal and to a 502/504 the proxy writes. */
  readonly answerHeaders: HeaderList;
  /** CORS is on: the gateway's own Access-Control-* fields are among `answerHeaders` and a bridge's are dropped (README "CORS"). */
  readonly ownsCors?: boolean;
  /** Request fields never forwarded (lower case). */
  readonly droppedHeaders?: ReadonlySet<string>;
  /** Fields added for the bridge (flat list): who is calling (README "Forwarding"). */
  readonly addedHeaders?: readonly string[] | undefined;
  /** Called once the bridge accepted the upgrade and the two sockets are joined, before a byte flows between them. */
  readonly onOpen: (client: Duplex, bridge: Socket) => void;
  /** The upgrade's outcome; `reason` when the gateway answered itself (docs/operations.md "Logs"). */
  readonly onDone: (status: number, reason?: Reason) => void;
}

/**
 * Where an upgrade stands: waiting for the bridge; answered without a WebSocket (a refusal of the
 * bridge, the gateway's 502 or 504, or the client gone), the connection closing on its own; open.
 */
type UpgradeState = 'waiting' | 'answered' | 'open';

interface Upgrade {
  readonly request: UpgradeRequest;
  readonly timer: NodeJS.Timeout;
  state: UpgradeState;
  bridgeRequest: ClientRequest | undefined;
}

/**
 * A flat header list as the object http-proxy passes to `http.request`, every line kept: a
 * repeated field becomes an array, which Node sends one line per value (several `Cookie` lines
 * as one, joined with "; ", as RFC 6265 §5.4 asks), as the HTTP path keeps repeated fields
 * (README "Forwarding"). Names lower-cased, as Node's own objects have them, or with `keepCase` as
 * they are (the 101 http-proxy writes from one).
 */
export function headerObject(list: readonly string[], keepCase = false): Record<string, string | string[]> {
  // No prototype: a field may be named `constructor` or `__proto__`.
  const object = Object.create(null) as Record<string, string | string[]>;
  for (let i = 0; i < list.length; i += 2) {
    const name = keepCase ? (list[i] as string) : (list[i] as string).toLowerCase();
    const value = list[i + 1] as string;
    const earlier = object[name];
    if (earlier === undefined) object[name] = value;
    else if (typeof earlier === 'string') object[name] = [earlier, value];
    else earlier.push(value);
  }
  return object;
}

export interface WebSocketProxyOptions {
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly timeoutMs: number;
  readonly onError?: (err: Error, context: { bridge: BridgeName; phase: string }) => void;
}

type UpgradeHandler = RequestHandler & { upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void };

export class WebSocketProxy {
  /** Loaded with the first upgrade: an instance that never sees one does not carry http-proxy in its memory. */
  #proxies: Promise<Map<BridgeName, UpgradeHandler>> | undefined;
  readonly #urls: Readonly<Record<BridgeName, URL>>;
  readonly #hosts = new Map<BridgeName, string>();
  /** Upgrades on their way, by the client's request (http-proxy's events name only the request). */
  readonly #upgrades = new WeakMap<IncomingMessage, Upgrade>();
  /** Accepted upgrades between the bridge's 101 and http-proxy joining the sockets. */
  readonly #joining = new WeakMap<Socket, Upgrade>();
  readonly #timeoutMs: number;
  readonly #onError: NonNullable<WebSocketProxyOptions['onError']>;

  constructor(options: WebSocketProxyOptions) {
    this.#timeoutMs = options.timeoutMs;
    this.#onError = options.onError ?? (() => {});
    this.#urls = options.bridges;
    for (const bridge of BRIDGES) this.#hosts.set(bridge, options.bridges[bridge].host);
  }

  #loadProxies(): Promise<Map<BridgeName, UpgradeHandler>> {
    this.#proxies ??= import('http-proxy-middleware').then(
      (library) => new Map(BRIDGES.map((bridge) => [bridge, this.#createProxy(library, bridge, this.#urls[bridge])])),
    );
    return this.#proxies;
  }

  /** Hands an accepted WebSocket upgrade to the bridge; frames then flow both ways. */
  upgrade(request: UpgradeRequest): void {
    const { incoming, socket } = request;
    if (socket.destroyed) {
      request.onDone(CLIENT_GONE);
      return;
    }
    const upgrade: Upgrade = {
      request,
      state: 'waiting',
      bridgeRequest: undefined,
      timer: setTimeout(
        () => this.#failed(upgrade, 504, 'bridge-timeout', 'Bridge did not answer in time'),
        this.#timeoutMs,
      ),
    };
    socket.once('close', () => {
      clearTimeout(upgrade.timer);
      // The client left before the bridge answered: nothing is waiting for the bridge any more.
      if (upgrade.state === 'waiting') {
        upgrade.state = 'answered';
        upgrade.bridgeRequest?.destroy();
        request.onDone(CLIENT_GONE);
      }
    });
    const headers = requestHeaderList(incoming.rawHeaders, {
      bridgeHost: this.#hosts.get(request.bridge) as string,
      clientAddress: request.clientAddress,
      proto: (incoming.socket as Socket & { encrypted?: boolean }).encrypted ? 'https' : 'http',
      requestId: request.requestId,
      framing: { kind: 'none' },
      upgrade: incoming.headers.upgrade ?? 'websocket',
      dropped: request.droppedHeaders,
      added: request.addedHeaders,
      clientTarget: incoming.url,
    });
    // http-proxy writes the upgrade request from req.headers.
    incoming.headers = headerObject(headers);
    incoming.url = request.target;
    this.#upgrades.set(incoming, upgrade);
    void this.#loadProxies().then((proxies) => {
      if (upgrade.state === 'waiting') proxies.get(request.bridge)?.upgrade(incoming, socket, request.head);
    });
  }

  #createProxy(library: typeof HttpProxyMiddleware, bridge: BridgeName, url: URL): UpgradeHandler {
    const { createProxyMiddleware, proxyEventsPlugin } = library;
    const hostname = url.hostname.replace(/^\[(.*)\]$/, '$1');
    const basePath = url.pathname.replace(/\/+$/, '');
    const target = {
      protocol: url.protocol,
      host: url.hostname,
      hostname,
      port: url.port || (url.protocol === 'https:' ? '443' : '80'),
      path: url.pathname === '/' ? '' : url.pathname,
    };
    // (Its typings name the client socket a net.Socket; an upgrade's socket is a Duplex, which is all it uses.)
    return createProxyMiddleware<IncomingMessage, ServerResponse>({
      target: target,
      changeOrigin: true,
      toProxy: true,
      ejectPlugins: true,
      plugins: [proxyEventsPlugin],
      on: {
        error: (err, req, res) => {
          const upgrade = this.#upgrades.get(req);
          if (!upgrade) {
            if (res && 'destroy' in res) (res as Duplex).destroy();
            return;
          }
          // An upgrade already answered had its request to the bridge destroyed by the gateway (after
          // a 504, or a client gone mid-handshake): that hang-up is no fault of the bridge's.
          if (upgrade.state !== 'answered') this.#onError(err, { bridge, phase: 'upgrade' });
          this.#failed(upgrade, 502, 'bridge-unreachable', 'Bridge unreachable');
        },
        // Emitted by http-proxy right after it piped the two sockets, before any byte flows.
        open: (bridgeSocket: Socket) => {
          const upgrade = this.#joining.get(bridgeSocket);
          if (!upgrade) return;
          this.#joining.delete(bridgeSocket);
          upgrade.request.onOpen(upgrade.request.socket, bridgeSocket);
        },
        proxyReqWs: (bridgeRequest, req) => {
          const upgrade = this.#upgrades.get(req);
          if (!upgrade) return;
          upgrade.bridgeRequest = bridgeRequest;
          // Exactly the path that was counted: http-proxy's own join rewrites "http:/" inside a path.
          bridgeRequest.path = basePath + upgrade.request.target;
          bridgeRequest.once('upgrade', (res: IncomingMessage, bridgeSocket: Socket) => {
            // http-proxy writes the 101 from res.headers right after this listener.
            res.headers = switchingFields(res, upgrade.request.answerHeaders, upgrade.request.ownsCors === true);
            writeNextAsLatin1(upgrade.request.socket);
            upgrade.state = 'open';
            clearTimeout(upgrade.timer);
            // Watching the sockets must wait for http-proxy's pipes ('open'): a reader attached
            // now would take the frames the bridge sent along with its 101 before the client's pipe exists.
            this.#joining.set(bridgeSocket, upgrade);
            upgrade.request.onDone(101);
          });
          const onRefusal = (res: IncomingMessage): void => this.#refused(upgrade, res, bridge);
          bridgeRequest.once('response', onRefusal);
          // http-proxy adds a 'response' listener of its own right after this event (ws-incoming.js),
          // which writes the bridge's refusal as it is: `Transfer-Encoding: chunked` over a body it has
          // already de-chunked, no usage headers, the bridge's CORS fields. The refusal is the gateway's
          // to write (#refused); that listener is taken off before the bridge can have answered (no
          // I/O comes before the next tick). (Marking the answer `upgrade` instead would make Node's
          // client take it for a 101 and join the sockets.)
          process.nextTick(() => {
            for (const listener of bridgeRequest.listeners('response')) {
              if (listener !== onRefusal) bridgeRequest.removeListener('response', listener as () => void);
            }
          });
        },
      },
    }) as unknown as UpgradeHandler;
  }

  /** The bridge answered the upgrade without a 101: its answer goes to the client, and no WebSocket opens. */
  #refused(upgrade: Upgrade, res: IncomingMessage, bridge: BridgeName): void {
    if (upgrade.state !== 'waiting') {
      res.destroy();
      return;
    }
    if (res.statusCode === 101) {
      // A 101 without `Upgrade` and `Connection: upgrade` (RFC 9110 §15.2.2) opens nothing: passed
      // on, it would tell the client a WebSocket had opened. It is a broken answer, as on the HTTP path.
      res.destroy();
      this.#onError(new Error('the bridge answered 101 without switching protocols'), { bridge, phase: 'upgrade' });
      this.#failed(upgrade, 502, 'bridge-unreachable', 'Bridge unreachable');
      return;
    }
    upgrade.state = 'answered';
    clearTimeout(upgrade.timer);
    const { socket, answerHeaders, ownsCors, incoming } = upgrade.request;
    upgrade.request.onDone(res.statusCode ?? 502);
    const chunking = incoming.httpVersionMajor === 1 && incoming.httpVersionMinor >= 1;
    passRefusal(socket, res, answerHeaders, { ownsCors: ownsCors === true, chunking }, this.#timeoutMs);
  }

  #failed(upgrade: Upgrade, status: number, reason: Reason, message: string): void {
    const { socket } = upgrade.request;
    // An open WebSocket whose bridge side failed: the client's side goes too.
    if (upgrade.state === 'open') socket.destroy();
    // An answered upgrade closes on its own (its answer lingers, or the client is gone).
    if (upgrade.state !== 'waiting') return;
    upgrade.state = 'answered';
    clearTimeout(upgrade.timer);
    upgrade.bridgeRequest?.destroy();
    upgrade.request.onDone(status, reason);
    if (socket.writable) endAndLinger(socket, rawAnswer(status, message, upgrade.request.answerHeaders));
    else socket.destroy();
  }
}

/**
 * The fields of the 101 the client gets, by the rule of every answer the gateway passes on
 * (responseHeaderList: the bridge's fields with their names and repeats, hop-by-hop ones and those
 * its Connection names dropped, the gateway's own added; with CORS on, the gateway alone says which
 * origins may read it, README "CORS"), and the two that make it an upgrade on this hop (RFC 9110
 * §7.8). http-proxy writes one line per key, and per value of an array.
 */
function switchingFields(res: IncomingMessage, own: HeaderList, ownsCors: boolean): IncomingMessage['headers'] {
  const upgrade = ['Upgrade', res.headers.upgrade ?? 'websocket', 'Connection', 'Upgrade'];
  return headerObject([...upgrade, ...responseHeaderList(res.rawHeaders, own, ownsCors)], true);
}

/**
 * http-proxy writes the 101 head as a string (ws-incoming.js), which a socket encodes as UTF-8; the
 * parser hands the bridge's field values over as latin1, so a byte above 0x7f would reach the client
 * as two. The socket's next write, that head, is made latin1: the fields go byte for byte, as the
 * HTTP path passes them (README "Forwarding").
 */
function writeNextAsLatin1(socket: Duplex): void {
  const write = socket.write.bind(socket) as (chunk: unknown, encoding?: BufferEncoding) => boolean;
  // An own property over the prototype's write, for one call; deleting it gives the socket its write back.
  const own = socket as unknown as { write?: (chunk: unknown) => boolean };
  own.write = (chunk) => {
    delete own.write;
    return typeof chunk === 'string' ? write(chunk, 'latin1') : write(chunk);
  };
}

/**
 * A bridge's refusal of an upgrade as the client gets it, as the HTTP path passes a bridge's answer
 * (README "Headers and answers", "Forwarding"): its status and fields but the hop-by-hop ones
 * (RFC 9110 §7.6.1; `Transfer-Encoding` among them: the body arrives here de-chunked), the usage
 * headers and `X-Request-Id` added, with CORS on the gateway's Access-Control-* fields alone
 * (README "CORS"). The body follows as it came, with the bridge's Content-Length, or else chunked
 * anew for an HTTP/1.1 client as the HTTP path's answers are (a body delimited by the close would
 * pass for whole when the bridge's is cut short, RFC 9112 §6.3); then the connection closes lingering.
 */
function passRefusal(
  socket: Duplex,
  res: IncomingMessage,
  answerHeaders: HeaderList,
  options: { ownsCors: boolean; chunking: boolean },
  idleMs: number,
): void {
  if (!socket.writable) {
    res.destroy();
    socket.destroy();
    return;
  }
  const fields = responseHeaderList(res.rawHeaders, answerHeaders, options.ownsCors);
  const status = res.statusCode ?? 502;
  const chunked =
    options.chunking &&
    res.headers['content-length'] === undefined &&
    status >= 200 &&
    status !== 204 &&
    status !== 304;
  const phrase = res.statusMessage ?? '';
  let head = `HTTP/1.1 ${status} ${writablePhrase(phrase) ? phrase : statusPhrase(status)}\r\n`;
  for (let i = 0; i < fields.length; i += 2) head += `${fields[i]}: ${fields[i + 1]}\r\n`;
  head += chunked ? 'Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n' : 'Connection: close\r\n\r\n';
  // (The parser hands header values over as latin1: written back byte for byte.)
  socket.write(Buffer.from(head, 'latin1'));
  // A client that leaves stops the bridge's answer too; a body cut short is not made to look complete.
  // A body that makes no progress for the upstream timeout (the bridge quiet, or the client not
  // reading) is cut as the HTTP path cuts it: every socket is released (docs/operations.md "Bridges").
  const idle = setTimeout(() => {
    res.destroy();
    socket.destroy();
  }, idleMs);
  idle.unref();
  const progress = (): void => void idle.refresh();
  res.on('data', progress);
  socket.on('drain', progress);
  socket.once('close', () => {
    clearTimeout(idle);
    res.destroy();
  });
  res.once('error', () => socket.destroy());
  const body = chunked ? res.pipe(chunkEncoder()) : res;
  body.once('end', () => {
    clearTimeout(idle);
    endAndLinger(socket);
  });
  body.pipe(socket, { end: false });
}

/** Chunked transfer coding (RFC 9112 §7.1): only a complete body ends with the last chunk. */
function chunkEncoder(): Transform {
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      if (chunk.length === 0) return done();
      done(null, Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, CRLF]));
    },
    flush(done) {
      done(null, LAST_CHUNK);
    },
  });
}

const CRLF = Buffer.from('\r\n');
const LAST_CHUNK = Buffer.from('0\r\n\r\n');
