import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Hono } from 'hono';
import { rawAnswer, statusPhrase } from '../lib/answers.js';
import type { GatewayEnv } from './context.js';
import { endAndLinger } from '../lib/linger.js';
import { requestIdSource } from './middleware/request-id.js';
import type { WebSocketConnections } from '../ws/connections.js';

/**
 * WebSocket upgrades (README "WebSocket channels") go through the same middleware chain as every request:
 * key, endpoint (as method `WS`), limits. When the chain answers (401, 404, 429 …) the answer
 * is written to the socket as plain HTTP and no WebSocket is opened; when it passes, the
 * final handler has already handed the socket to the bridge.
 *
 * Every such answer closes the connection lingering (lib/linger.ts): the client's socket is
 * released even when the client never closes its side (docs/operations.md "Bridges").
 */

/** The header with which @hono/node-server marks a response a handler has already written itself (read off its own constant). */
const ALREADY_SENT = [...RESPONSE_ALREADY_SENT.headers.keys()][0] as string;

export function upgradeListener(
  app: Hono<GatewayEnv>,
  accepting: () => boolean,
  websockets: Pick<WebSocketConnections, 'handshake'>,
): (req: IncomingMessage, socket: Duplex, head: Buffer) => void {
  // The 503 at shutdown never reaches the app: its request id is drawn here (README "Headers and answers").
  const nextId = requestIdSource();
  return function onUpgrade(req, socket, head) {
    socket.on('error', () => socket.destroy());
    // Shutdown waits for the handshake: the app resolves once the answer is written or the sockets are joined.
    const settled = websockets.handshake(socket);
    handle(req, socket, head)
      .catch(() => socket.destroy())
      .finally(settled);
  };

  async function handle(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    if (!accepting()) {
      endAndLinger(socket, rawAnswer(503, 'Shutting down', [['X-Request-Id', nextId()]]));
      return;
    }
    // The chain reads headers from the Node request itself; the Request carries only the URL. (The
    // request gate has refused an upgrade to anything but a WebSocket, and a target that is no URL.)
    const request = new Request(`http://${req.headers.host ?? 'gateway'}${req.url ?? '/'}`);
    const response = await app.fetch(request, {
      incoming: req,
      outgoing: undefined as never,
      upgrade: { socket, head },
    });
    if (response.headers.get(ALREADY_SENT)) return;
    await writeResponse(socket, response);
  }
}

async function writeResponse(socket: Duplex, response: Response): Promise<void> {
  const body = Buffer.from(await response.arrayBuffer());
  let head = `HTTP/1.1 ${response.status} ${statusPhrase(response.status)}\r\n`;
  response.headers.forEach((value, name) => {
    if (name !== 'content-length' && name !== 'connection') head += `${name}: ${value}\r\n`;
  });
  head += `Content-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
  if (socket.writable) endAndLinger(socket, Buffer.concat([Buffer.from(head, 'latin1'), body]));
  else socket.destroy();
}
