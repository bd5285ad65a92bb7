import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ConnectionOrder, MAX_WAITING, type Exchange } from '../../src/server/connection-order.js';

/**
 * The order of pipelined requests on one connection (src/server/connection-order.ts), without
 * sockets: a connection and its answers are stand-ins with the few fields the order reads.
 */

interface FakeSocket {
  destroyed: boolean;
  writable: boolean;
  readableEnded: boolean;
  destroy(): void;
}

class FakeAnswer extends EventEmitter {
  /** Node's mark of an answer after which it closes the connection. */
  _last = false;
  destroyed = false;
  /** The answer is written whole (Node: 'finish', then 'close'). */
  written(): void {
    this.emit('finish');
    this.emit('close');
  }
}

function connection(): FakeSocket {
  return {
    destroyed: false,
    writable: true,
    readableEnded: false,
    destroy() {
      this.destroyed = true;
    },
  };
}

function request(socket: FakeSocket): { req: IncomingMessage; res: FakeAnswer } {
  const res = new FakeAnswer();
  return { req: { socket, complete: true } as unknown as IncomingMessage, res };
}

function setUp(): { order: ConnectionOrder; served: FakeAnswer[]; dropped: FakeAnswer[] } {
  const served: FakeAnswer[] = [];
  const dropped: FakeAnswer[] = [];
  const order = new ConnectionOrder(
    (e: Exchange) => served.push(e.res as unknown as FakeAnswer),
    (e: Exchange) => dropped.push(e.res as unknown as FakeAnswer),
  );
  return { order, served, dropped };
}

const take = (order: ConnectionOrder, socket: FakeSocket): FakeAnswer => {
  const { req, res } = request(socket);
  order.take(req, res as unknown as ServerResponse);
  return res;
};
const microtask = (): Promise<void> => new Promise((resolve) => queueMicrotask(resolve));

describe('ConnectionOrder', () => {
  it('serves one request of a connection at a time, in the order they came, and other connections at once', async () => {
    const { order, served } = setUp();
    const socket = connection();
    const other = connection();
    const [a, b, c] = [take(order, socket), take(order, socket), take(order, socket)];
    const d = take(order, other);
    await microtask();
    expect(served).toEqual([a, d]);
    a.written();
    await microtask();
    expect(served).toEqual([a, d, b]);
    b.written();
    await microtask();
    expect(served).toEqual([a, d, b, c]);
    c.written();
    d.written();
    expect(order.inFlight).toBe(0);
  });

  it('never serves what waits behind an answer that closes the connection, and counts it out of flight', async () => {
    const { order, served, dropped } = setUp();
    const socket = connection();
    const [a, b, c] = [take(order, socket), take(order, socket), take(order, socket)];
    await microtask();
    expect(order.inFlight).toBe(3);
    a._last = true;
    a.written();
    await microtask();
    expect(served).toEqual([a]);
    expect(dropped).toEqual([b, c]);
    expect(order.inFlight).toBe(0);
  });

  it('drops what waits when the client goes away before the answer was written', async () => {
    const { order, served, dropped } = setUp();
    const socket = connection();
    const [a, b] = [take(order, socket), take(order, socket)];
    await microtask();
    socket.destroyed = true;
    a.emit('close');
    expect(served).toEqual([a]);
    expect(dropped).toEqual([b]);
    expect(order.inFlight).toBe(0);
  });

  it('does not serve a request withheld before its turn began (a parser failure in the same read)', async () => {
    const { order, served } = setUp();
    const socket = connection();
    take(order, socket);
    const [exchange] = order.pending(socket as unknown as Duplex);
    expect(order.withhold(exchange as Exchange)).toBe(true);
    await microtask();
    expect(served).toEqual([]);
  });

  it('cannot withhold a request already being served', async () => {
    const { order } = setUp();
    const socket = connection();
    take(order, socket);
    await microtask();
    const [exchange] = order.pending(socket as unknown as Duplex);
    expect(order.withhold(exchange as Exchange)).toBe(false);
  });

  it('runs what waits for idleness after the last answer: open unless that answer closes the connection', async () => {
    const { order } = setUp();
    const seen: boolean[] = [];
    const idle = connection();
    order.whenIdle(idle as unknown as Duplex, (open) => seen.push(open));
    expect(seen).toEqual([true]);

    const socket = connection();
    const a = take(order, socket);
    order.whenIdle(socket as unknown as Duplex, (open) => seen.push(open));
    await microtask();
    expect(seen).toEqual([true]);
    a.written();
    expect(seen).toEqual([true, true]);

    const closing = connection();
    const b = take(order, closing);
    order.whenIdle(closing as unknown as Duplex, (open) => seen.push(open));
    b._last = true;
    b.written();
    expect(seen).toEqual([true, true, false]);

    // A client that half-closed still reads what comes before the gateway closes its side.
    const halfClosed = connection();
    const c = take(order, halfClosed);
    order.whenIdle(halfClosed as unknown as Duplex, (open) => seen.push(open));
    halfClosed.readableEnded = true;
    c._last = true;
    c.written();
    expect(seen).toEqual([true, true, false, true]);
  });

  it('closes a connection that floods it with more waiting requests than MAX_WAITING, serving none of them', async () => {
    const { order, served, dropped } = setUp();
    const socket = connection();
    const first = take(order, socket);
    for (let i = 0; i < MAX_WAITING; i++) take(order, socket);
    expect(socket.destroyed).toBe(false);
    take(order, socket);
    expect(socket.destroyed).toBe(true);
    expect(dropped).toHaveLength(MAX_WAITING + 1);
    await microtask();
    expect(served).toEqual([first]);
    first.emit('close');
    expect(order.inFlight).toBe(0);
  });
});
