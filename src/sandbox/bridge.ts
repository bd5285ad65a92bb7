import { randomBytes } from 'node:crypto';
import http, { type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { WebSocketServer } from 'ws';
import {
  DEMO_PASSWORD,
  DEMO_USERNAME,
  LOGIN_FAILED_STATUS,
  loginFailedBody,
  tokenSetBody,
  type BridgeKind,
} from './bodies.js';

/**
 * A stand-in for the `eqt` or `fno` bridge, for `npm run sandbox` and the tests. Its token
 * operations answer as the specification describes (a token set for the demo login, the specification's
 * error body otherwise); the operations whose payloads the specification does not show answer with a
 * small JSON description of the request; its WebSocket channels echo every message.
 */

export interface RecordedRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: IncomingHttpHeaders;
  readonly body: Buffer;
}

export interface SandboxBridge {
  readonly kind: BridgeKind;
  readonly url: string;
  readonly port: number;
  /** Requests received, newest last (the last 1000). */
  readonly requests: RecordedRequest[];
  readonly server: http.Server;
  readonly wss: WebSocketServer;
  close(): Promise<void>;
}

const TOKEN_PATHS: Record<BridgeKind, string> = {
  eqt: '/oapi/auth/gen-secret-key/underlying',
  fno: '/oapi/auth/gen-secret-key/derivative',
};

export async function startSandboxBridge(
  kind: BridgeKind,
  options: { port?: number; host?: string } = {},
): Promise<SandboxBridge> {
  const requests: RecordedRequest[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      if (requests.length > 1000) requests.shift();
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'POST' && (path === TOKEN_PATHS[kind] || path === '/auth/token'))
        return login(kind, body, res);
      const answer = JSON.stringify({
        bridge: kind,
        method: req.method,
        path,
        query: (req.url ?? '').slice((path ?? '').length),
      });
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(answer) });
      res.end(answer);
    });
  });
  const wss = new WebSocketServer({ server });
  wss.on('connection', (socket) => {
    socket.on('message', (data, isBinary) => socket.send(data, { binary: isBinary }));
  });
  await new Promise<void>((resolve) => server.listen(options.port ?? 0, options.host ?? '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    kind,
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    server,
    wss,
    close: async () => {
      for (const client of wss.clients) client.terminate();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function login(kind: BridgeKind, body: Buffer, res: http.ServerResponse): void {
  let credentials: { username?: unknown; password?: unknown } = {};
  try {
    // `null` is JSON too (`POST /auth/token` reaches here unchecked): a failed login, as any other body.
    credentials = (JSON.parse(body.toString('utf8')) as typeof credentials | null) ?? {};
  } catch {
    // answered as a failed login below
  }
  const ok = credentials.username === DEMO_USERNAME && credentials.password === DEMO_PASSWORD;
  const answer = ok
    ? tokenSetBody({
        access: randomBytes(24).toString('base64url'),
        refresh: randomBytes(24).toString('base64url'),
        otp: randomBytes(12).toString('base64url'),
      })
    : loginFailedBody(kind);
  res.writeHead(ok ? 200 : LOGIN_FAILED_STATUS, {
    'Content-Type': 'application/json; charset=utf-8',
    'Content-Length': Buffer.byteLength(answer),
  });
  res.end(answer);
}
