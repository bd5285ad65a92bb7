import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';

/**
 * Pipelined requests are served one at a time per connection, as nginx does: a request that
 * arrives while an earlier answer on its connection is not yet written waits for that answer.
 * When the earlier answer closes the connection (a refusal that says `Connection: close`, a
 * client gone), the requests behind it are never served, counted or forwarded: their answers
 * could not be delivered, and a client retries requests left unanswered on a closed connection
 * (RFC 9112 §9.3.2). Whatever Node itself answers on a connection (a parser error, an upgrade,
 * CONNECT) waits for the answers before it the same way (docs/operations.md "Hostile clients").
 *
 * A request whose turn has come is served a microtask later, once Node's parser is done with the
 * bytes that came with it: framing the parser refuses only after handing the request over (a
 * `Transfer-Encoding` it rejects after the head, a malformed first chunk) is then seen before
 * the request is counted, and the request is never served (README: a refused request uses no unit).
 */

/**
 * Requests that may wait on one connection. Requests that wait produce no answer bytes, so Node's
 * own backpressure never stops reading them: past this many the client is flooding, and its
 * connection is closed (nothing waiting was served; no HTTP client pipelines this deep).
 */
export const MAX_WAITING = 64;

export interface Exchange {
  readonly req: IncomingMessage;
  readonly res: ServerResponse;
}

/** An exchange as the order holds it: whether serving began, or must never begin. */
interface Entry extends Exchange {
  served: boolean;
  withheld: boolean;
}

interface Line {
  active: Entry | undefined;
  readonly waiting: Entry[];
  /** Called once nothing is open on the connection: `open` is false when it is closing. */
  readonly idle: Array<(open: boolean) => void>;
}

/** Whether Node closes the connection after this answer (`Connection: close`, a client that half-closed, HTTP/1.0). */
function closesConnection(res: ServerResponse): boolean {
  return (res as { _last?: boolean })._last === true;
}

export class ConnectionOrder {
  readonly #lines = new WeakMap<Duplex, Line>();
  readonly #serve: (exchange: Exchange) => void;
  readonly #dropped: (exchange: Exchange) => void;
  /** Requests taken in whose answer is not complete yet (those waiting their turn included). */
  inFlight = 0;

  /**
   * `serve` handles an exchange whose turn has come; `dropped` is told of one that never will
   * (its connection closed before its turn).
   */
  constructor(serve: (exchange: Exchange) => void, dropped: (exchange: Exchange) => void) {
    this.#serve = serve;
    this.#dropped = dropped;
  }

  /** Serves the exchange now when its connection has nothing else open, else when its turn comes. */
  take(req: IncomingMessage, res: ServerResponse): void {
    this.inFlight++;
    const line = this.#line(req.socket);
    const exchange: Entry = { req, res, served: false, withheld: false };
    if (!line.active) {
      this.#start(line, exchange);
      return;
    }
    line.waiting.push(exchange);
    if (line.waiting.length > MAX_WAITING) {
      for (const waiting of line.waiting.splice(0)) this.#drop(waiting);
      req.socket.destroy();
    }
  }

  /** The exchanges of a connection not answered yet: the one being served first, then those waiting. */
  pending(socket: Duplex): Exchange[] {
    const line = this.#lines.get(socket);
    if (!line?.active) return [];
    return [line.active, ...line.waiting];
  }

  /** Runs `then` once every answer open on the connection is written (`open`: the connection stays usable). */
  whenIdle(socket: Duplex, then: (open: boolean) => void): void {
    const line = this.#lines.get(socket);
    if (line?.active) line.idle.push(then);
    else then(!socket.destroyed && socket.writable);
  }

  /**
   * Stops the exchange being served when serving has not begun (its turn came in the same read of
   * the connection): true when it never will be, false when it already is being served.
   * `exchange` is one `pending` gave.
   */
  withhold(exchange: Exchange): boolean {
    const entry = exchange as Entry;
    if (entry.served) return false;
    entry.withheld = true;
    return true;
  }

  /** Gives up a waiting exchange and every one behind it: the connection will not reach them. */
  dropFrom(socket: Duplex, first: Exchange): void {
    const line = this.#lines.get(socket);
    const at = line ? line.waiting.indexOf(first as Entry) : -1;
    if (!line || at === -1) return;
    for (const exchange of line.waiting.splice(at)) this.#drop(exchange);
  }

  #line(socket: Duplex): Line {
    let line = this.#lines.get(socket);
    if (!line) this.#lines.set(socket, (line = { active: undefined, waiting: [], idle: [] }));
    return line;
  }

  #start(line: Line, exchange: Entry): void {
    line.active = exchange;
    const { res } = exchange;
    let turnOver = false;
    const next = (written: boolean): void => {
      if (turnOver) return;
      turnOver = true;
      this.#next(line, exchange, written);
    };
    // Before Node's own 'finish' listener, which closes a connection whose answer says so.
    res.prependOnceListener('finish', () => next(true));
    res.once('close', () => {
      this.inFlight--;
      next(false);
    });
    queueMicrotask(() => {
      if (exchange.withheld || res.destroyed) return;
      exchange.served = true;
      this.#serve(exchange);
    });
  }

  /** The turn of `done` is over: `written` when its answer was written whole, not cut off. */
  #next(line: Line, done: Entry, written: boolean): void {
    line.active = undefined;
    const socket = done.req.socket;
    const writable = written && !socket.destroyed && socket.writable;
    const following = writable && !closesConnection(done.res) ? line.waiting.shift() : undefined;
    if (following) {
      this.#start(line, following);
      return;
    }
    for (const exchange of line.waiting.splice(0)) this.#drop(exchange);
    // A client that half-closed still reads what comes before the gateway closes its side.
    const open = writable && (!closesConnection(done.res) || socket.readableEnded);
    for (const then of line.idle.splice(0)) then(open);
  }

  #drop(exchange: Entry): void {
    this.inFlight--;
    this.#dropped(exchange);
  }
}
