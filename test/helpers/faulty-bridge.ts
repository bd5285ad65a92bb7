import { spawn } from 'node:child_process';
import net from 'node:net';
import { outputOf, waitForOutput } from './child-gateway.js';

/**
 * A bridge that misbehaves on purpose, written on raw sockets so that every byte and every
 * close is the test's choice. `GET /orders/<mode>` picks the behaviour:
 *
 *  - `ok`             a complete 200 (kept alive)
 *  - `informational`  a 102 Processing and a 103 Early Hints, then the complete 200 of `ok`
 *  - `control-reason` the complete 200 of `ok`, its reason phrase holding a control character
 *  - `not-modified`   a 304 with the `Content-Length` of the representation it validates (RFC 9110 §8.6), no body
 *  - `reset-length`   status line, Content-Length 1000, part of the body, then a TCP reset
 *  - `close-chunked`  status line, chunked, one chunk, then a plain close (FIN) with no last chunk
 *  - `silent`         reads the request and never answers
 *  - `stall`          status line, Content-Length 1000, part of the body, then nothing
 *  - `drop`           closes the connection without a byte
 *  - `garbage`        answers bytes that are not HTTP
 *  - `noread`         stops reading at the request head: a body piles up in the socket buffers
 *  - `stale`          on a connection that carried an earlier request, closes it without a byte: to
 *                     the gateway, a kept-alive connection the bridge had just closed; on a new
 *                     connection, `ok`
 *
 * Every connection is recorded with the paths it carried and whether it is closed.
 */

export interface BridgeConnection {
  readonly paths: string[];
  closed: boolean;
}

export interface FaultyBridge {
  readonly url: string;
  readonly port: number;
  readonly connections: BridgeConnection[];
  /** Connections whose last request asked for `mode`. */
  connectionsFor(mode: string): BridgeConnection[];
  close(): Promise<void>;
}

export const OK_BODY = '{"ok":true,"from":"faulty-bridge"}';

/** Modes whose answer is whole and leaves the connection open for the next request. */
const KEPT_ALIVE_MODES: ReadonlySet<string> = new Set(['ok', 'informational', 'control-reason', 'not-modified']);

export async function startFaultyBridge(): Promise<FaultyBridge> {
  const connections: BridgeConnection[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    const record: BridgeConnection = { paths: [], closed: false };
    connections.push(record);
    sockets.add(socket);
    socket.on('close', () => {
      record.closed = true;
      sockets.delete(socket);
    });
    socket.on('error', () => {});
    let buffer = Buffer.alloc(0);
    let stopped = false;
    // A request's path is recorded as soon as its head arrives, before its body.
    let headSeen = false;
    socket.on('data', (chunk: Buffer) => {
      if (stopped) return;
      buffer = Buffer.concat([buffer, chunk]);
      for (;;) {
        const end = buffer.indexOf('\r\n\r\n');
        if (end === -1) return;
        const head = buffer.subarray(0, end).toString('latin1');
        const path = head.split(' ')[1] ?? '/';
        if (!headSeen) record.paths.push(path);
        headSeen = true;
        if (path.split('?')[0]?.endsWith('/noread')) {
          stopped = true;
          socket.pause();
          return;
        }
        const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
        if (buffer.length < end + 4 + length) return;
        buffer = buffer.subarray(end + 4 + length);
        headSeen = false;
        const asked = path.split('?')[0]?.split('/').at(-1) ?? '';
        const mode = asked === 'stale' ? (record.paths.length > 1 ? 'drop' : 'ok') : asked;
        if (!KEPT_ALIVE_MODES.has(mode)) stopped = true;
        answer(socket, mode);
        if (stopped) return;
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    connections,
    connectionsFor: (mode) =>
      connections.filter((c) =>
        c.paths
          .at(-1)
          ?.split('?')[0]
          ?.endsWith('/' + mode),
      ),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function answer(socket: net.Socket, mode: string): void {
  const partialHead = 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n';
  switch (mode) {
    case 'ok':
      socket.write(
        `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ${OK_BODY.length}\r\n\r\n${OK_BODY}`,
      );
      return;
    case 'control-reason':
      socket.write(
        `HTTP/1.1 200 O\x01K\r\nContent-Type: application/json\r\nContent-Length: ${OK_BODY.length}\r\n\r\n${OK_BODY}`,
      );
      return;
    case 'not-modified':
      socket.write('HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nContent-Length: 1000\r\n\r\n');
      return;
    case 'informational':
      socket.write('HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </orders>; rel=preload\r\n\r\n');
      answer(socket, 'ok');
      return;
    case 'reset-length':
      socket.write(partialHead + '{"partial":"', () => setTimeout(() => socket.resetAndDestroy(), 30));
      return;
    case 'close-chunked':
      socket.write(
        'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nc\r\n{"partial":"\r\n',
        () => setTimeout(() => socket.end(), 30),
      );
      return;
    case 'silent':
      return;
    case 'stall':
      socket.write(partialHead + '{"partial":"');
      return;
    case 'drop':
      socket.destroy();
      return;
    case 'garbage':
      socket.end('THIS IS NOT HTTP\r\n\r\n');
      return;
    default:
      socket.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n');
  }
}

export interface UnreachableInTimeBridge {
  readonly url: string;
  close(): Promise<void>;
}

/**
 * A listening port whose accept queue is full: a new connection to it neither succeeds nor fails
 * (Linux drops the SYN and the client retries it after a second, then later), the way a bridge
 * overwhelmed by connections looks from the gateway. The listener lives in a child process whose
 * event loop is blocked, so nothing ever accepts; the queue (backlog 1) is filled with two
 * connections of the test's own. The child exits by itself after `lifetimeMs`.
 */
export async function startUnreachableInTimeBridge(lifetimeMs = 30_000): Promise<UnreachableInTimeBridge> {
  const script = `
    const net = require('node:net');
    const server = net.createServer();
    server.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => {
      process.stdout.write(server.address().port + '\\n', () => {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ${lifetimeMs});
        process.exit(0);
      });
    });`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  const port = Number((await waitForOutput(child, outputOf(child), '\n', 5000)).trim());
  // Backlog 1 holds two completed connections (Linux: full when more than the backlog wait).
  const fillers = await Promise.all(
    [0, 1].map(
      () =>
        new Promise<net.Socket>((resolve, reject) => {
          const socket = net.connect({ port, host: '127.0.0.1' }, () => resolve(socket));
          socket.on('error', reject);
        }),
    ),
  );
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      for (const socket of fillers) socket.destroy();
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once('exit', resolve));
        child.kill('SIGKILL');
        await exited;
      }
    },
  };
}
