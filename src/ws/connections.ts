import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { LimitRow } from '../limits/limit-table.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import { closeFrame, FrameBoundary } from './frames.js';

/**
 * The open proxied WebSocket connections: counted per row in a metric, released when either
 * side goes away (a peer that vanishes without a Close frame included), and closed with
 * 1001 "going away" on both sides at shutdown, between frames. Upgrades still in their handshake
 * at shutdown are waited for too: one that opens then gets its 1001 at once (README "WebSocket channels").
 */

const GOING_AWAY = 1001;
/** After one side is gone, the other gets this long to flush and close before it is destroyed. */
const LINGER_MS = 2000;

interface Connection {
  readonly endpoint: string;
  readonly client: Duplex;
  readonly bridge: Socket;
  /** Frames from the bridge to the client, and from the client to the bridge. */
  readonly toClient: FrameBoundary;
  readonly toBridge: FrameBoundary;
  readonly closed: Promise<void>;
}

export class WebSocketConnections {
  readonly #open = new Set<Connection>();
  /** The client sockets of upgrades between their arrival and their answer or join. */
  readonly #handshakes = new Set<Duplex>();
  readonly #metrics: GatewayMetrics;
  #closing = false;
  /** While shutdown waits: called as each connection or handshake ends. */
  #onSettled: (() => void) | undefined;

  constructor(metrics: GatewayMetrics) {
    this.#metrics = metrics;
  }

  get size(): number {
    return this.#open.size;
  }

  /**
   * An upgrade has arrived on `client`. Until the returned function is called (once its answer is
   * written, or its sockets are joined by add()), shutdown waits for it.
   */
  handshake(client: Duplex): () => void {
    this.#handshakes.add(client);
    return () => {
      if (this.#handshakes.delete(client)) this.#onSettled?.();
    };
  }

  /** Must be called as the two sockets are joined, before any byte flows between them. */
  add(row: LimitRow, client: Duplex, bridge: Socket): void {
    const endpoint = row.route.text;
    const toClient = new FrameBoundary();
    const toBridge = new FrameBoundary();
    bridge.on('data', (chunk: Buffer) => void toClient.advance(chunk));
    client.on('data', (chunk: Buffer) => void toBridge.advance(chunk));

    let release!: () => void;
    const closed = new Promise<void>((resolve) => (release = resolve));
    const connection: Connection = { endpoint, client, bridge, toClient, toBridge, closed };
    this.#open.add(connection);
    this.#metrics.websockets.labels(endpoint).inc();

    let gone = 0;
    const onClose = (other: Duplex) => (): void => {
      if (!other.destroyed) {
        other.end();
        setTimeout(() => other.destroy(), LINGER_MS).unref();
      }
      if (++gone === 2 || (client.destroyed && bridge.destroyed)) finish();
    };
    let finished = false;
    const finish = (): void => {
      if (finished) return;
      finished = true;
      this.#open.delete(connection);
      this.#metrics.websockets.labels(endpoint).dec();
      release();
      this.#onSettled?.();
    };
    client.once('close', onClose(bridge));
    bridge.once('close', onClose(client));
    // (The client socket already has its error handler, from the upgrade listener.)
    bridge.on('error', () => bridge.destroy());
    // An upgrade whose handshake shutdown waited for: it opens only to be closed.
    if (this.#closing) goAway(connection);
  }

  /**
   * Sends 1001 to both sides of every connection, and of every one that opens from a handshake in
   * progress; waits for them all to close (at most `timeoutMs`), then drops the rest.
   */
  async closeAll(timeoutMs: number): Promise<void> {
    this.#closing = true;
    for (const connection of this.#open) goAway(connection);
    const settled = (): boolean => this.#open.size === 0 && this.#handshakes.size === 0;
    if (!settled()) {
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.#onSettled = () => settled() && resolve();
        timer = setTimeout(resolve, timeoutMs);
      });
      clearTimeout(timer);
      this.#onSettled = undefined;
    }
    for (const connection of this.#open) {
      connection.client.destroy();
      connection.bridge.destroy();
    }
    for (const client of this.#handshakes) client.destroy();
  }
}

/** Stops a direction at the next frame boundary, then sends a Close frame in it and ends it. */
function stopBetweenFrames(from: Duplex, to: Duplex, frames: FrameBoundary, masked: boolean): void {
  from.unpipe(to);
  from.removeAllListeners('data');
  const close = (): void => {
    if (to.writable) to.end(closeFrame(GOING_AWAY, 'gateway shutting down', masked));
    // Keep reading (and discarding) what the sender still has: its Close reply and its end, which release the connection.
    from.resume();
  };
  if (frames.atBoundary) {
    close();
    return;
  }
  // The rest of the current frame still has to pass, and nothing after it; as fast as the receiver
  // reads it, as the pipe it replaces: a frame may be far larger than what the gateway may hold.
  const resume = (): void => void from.resume();
  from.on('data', function finishFrame(chunk: Buffer) {
    const upTo = frames.advance(chunk, true);
    if (upTo > 0 && to.writable && !to.write(chunk.subarray(0, upTo))) {
      from.pause();
      to.once('drain', resume);
    }
    if (frames.atBoundary) {
      from.off('data', finishFrame);
      to.off('drain', resume);
      close();
    }
  });
  from.resume();
}

function goAway(connection: Connection): void {
  // The gateway speaks as a server to the client (unmasked frames) and as a client to the bridge (masked frames).
  stopBetweenFrames(connection.bridge, connection.client, connection.toClient, false);
  stopBetweenFrames(connection.client, connection.bridge, connection.toBridge, true);
}
