import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { getRequestListener } from '@hono/node-server';
import type { Hono } from 'hono';
import type { Settings } from '../config/settings.js';
import { clientErrorAnswer, rawAnswer } from '../lib/answers.js';
import type { Logger } from '../observability/logger.js';
import type { GatewayMetrics } from '../observability/metrics.js';
import type { Forwarder } from '../proxy/forwarder.js';
import type { GatewayEnv } from '../server/context.js';
import { createPublicServer } from '../server/http-server.js';
import { upgradeListener } from '../server/upgrade.js';
import type { WebSocketConnections } from '../ws/connections.js';
import type { Closers } from './closers.js';
import { StartupError } from './startup-error.js';

/**
 * The two listeners (docs/operations.md): the admin listener first, the public one last, so that
 * at shutdown the public one stops first — it stops accepting, lets the requests in flight finish
 * (at most SHUTDOWN_TIMEOUT_MS), closes WebSockets with 1001 — while /readyz still says so.
 */

/** Where a listener is: a URL to reach it from this host, and the address as bound (for the log). */
export interface Listening {
  readonly url: string;
  readonly bound: string;
}

export async function startAdminServer(app: Hono, settings: Settings, closers: Closers): Promise<Listening> {
  const server = http.createServer(getRequestListener(app.fetch));
  // Malformed requests get the two-field answer of the public listener, not Node's empty one.
  server.on('clientError', function answerClientError(err: NodeJS.ErrnoException, socket: Duplex) {
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const [status, , message] = clientErrorAnswer(err.code);
    socket.end(rawAnswer(status, message));
  });
  await listen(server, settings.adminPort, settings.adminHost, 'ADMIN_PORT');
  closers.add('admin listener', async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    server.closeAllConnections();
  });
  return listening(server);
}

export interface PublicServerParts {
  readonly app: Hono<GatewayEnv>;
  readonly forwarder: Forwarder;
  readonly websockets: WebSocketConnections;
  readonly accepting: () => boolean;
}

export async function startPublicServer(
  parts: PublicServerParts,
  settings: Settings,
  observe: { logger: Logger; metrics: GatewayMetrics },
  closers: Closers,
): Promise<Listening> {
  const publicServer = createPublicServer(parts.app, settings, observe, upgradeListener(parts.app, parts.accepting));
  const { server } = publicServer;
  await listen(server, settings.port, settings.host, 'PORT');
  closers.add('public listener', async () => {
    server.close();
    const deadline = Date.now() + settings.shutdownTimeoutMs;
    // Connections kept alive become idle as their last answer completes: close them as they do.
    while (publicServer.inFlight() > 0 && Date.now() < deadline) {
      server.closeIdleConnections();
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    server.closeIdleConnections();
    await parts.websockets.closeAll(Math.max(0, Math.min(2000, deadline - Date.now())));
    server.closeAllConnections();
    parts.forwarder.close();
  });
  return listening(server);
}

/** Listens, or stops start-up with one line naming the setting when the port cannot be had. */
function listen(server: http.Server, port: number, host: string, setting: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const failed = (err: NodeJS.ErrnoException): void => {
      const why =
        err.code === 'EADDRINUSE'
          ? 'the port is already in use'
          : err.code === 'EACCES'
            ? 'this user may not listen on that port'
            : err.code === 'EADDRNOTAVAIL'
              ? `${host} is not an address of this host`
              : err.message;
      reject(new StartupError(`${setting}=${port}: ${why} (${host}:${port})`, 'listener'));
    };
    server.once('error', failed);
    server.listen(port, host, () => {
      server.off('error', failed);
      resolve();
    });
  });
}

function listening(server: http.Server): Listening {
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  // A wildcard address is reached on loopback from this host.
  const reachable = host === '0.0.0.0' ? '127.0.0.1' : host === '[::]' ? '[::1]' : host;
  return { url: `http://${reachable}:${address.port}`, bound: `${host}:${address.port}` };
}
