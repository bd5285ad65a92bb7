import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { getRequestListener, RequestError } from '@hono/node-server';
import type { Hono } from 'hono';
import type { Settings } from '../config/settings.js';
import { answerResponse, clientErrorAnswer, rawAnswer } from '../lib/answers.js';
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

export async function startAdminServer(
  app: Hono,
  settings: Settings,
  logger: Logger,
  closers: Closers,
): Promise<Listening> {
  const server = http.createServer(
    getRequestListener(app.fetch, {
      // A request Node parsed but node-server cannot turn into a URL (a bad Host, `OPTIONS *`, a
      // backslash in the path) gets the two-field 400 of every admin refusal (docs/operations.md
      // "The admin listener"), not node-server's empty one.
      errorHandler: (err) =>
        err instanceof RequestError
          ? answerResponse(400, 'Malformed request')
          : answerResponse(500, 'Unexpected error'),
    }),
  );
  // Malformed requests get the two-field answer of the public listener, not Node's empty one.
  server.on('clientError', function answerClientError(err: NodeJS.ErrnoException, socket: Duplex) {
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const [status, , message] = clientErrorAnswer(err.code);
    socket.end(rawAnswer(status, message));
  });
  await listen(server, settings.adminPort, settings.adminHost, ADMIN_SETTINGS, logger);
  closers.add('admin listener', async () => {
    // Node stops its header and request timeouts once the server closes: a request begun and never
    // finished would hold the shutdown for ever. Its requests in flight get SHUTDOWN_TIMEOUT_MS, as
    // the public listener's do; connections kept alive close as they become idle.
    let closed = false;
    server.close(() => (closed = true));
    const deadline = Date.now() + settings.shutdownTimeoutMs;
    while (!closed && Date.now() < deadline) {
      server.closeIdleConnections();
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
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
  const publicServer = createPublicServer(
    parts.app,
    settings,
    observe,
    upgradeListener(parts.app, parts.accepting, parts.websockets),
  );
  const { server } = publicServer;
  await listen(server, settings.port, settings.host, PUBLIC_SETTINGS, observe.logger);
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

/** The variables that place a listener, for the line that names the wrong one. */
interface ListenerSettings {
  readonly port: 'PORT' | 'ADMIN_PORT';
  readonly host: 'HOST' | 'ADMIN_HOST';
}
export const PUBLIC_SETTINGS: ListenerSettings = { port: 'PORT', host: 'HOST' };
const ADMIN_SETTINGS: ListenerSettings = { port: 'ADMIN_PORT', host: 'ADMIN_HOST' };

/** Errors of the address rather than the port: the name does not resolve, or is not this host's. */
const HOST_ERRORS: Readonly<Record<string, string>> = {
  EADDRNOTAVAIL: 'not an address of this host',
  ENOTFOUND: 'not an address of this host, nor a name it resolves',
  EAI_NONAME: 'not an address of this host, nor a name it resolves',
  EAI_FAIL: 'the name could not be resolved',
  EAI_AGAIN: 'the name could not be resolved now (EAI_AGAIN)',
  EAFNOSUPPORT: 'this host has no network of that address family',
};

/**
 * Listens, or stops start-up with one line naming the variable that is wrong (README "Running it":
 * a bad value exits 1 with one line naming the variable): the host's for an address that cannot be
 * had, the port's otherwise. Once it listens, an error of the listener (a connection it could not
 * accept: out of memory or buffers) is logged, and it goes on listening; with no listener for it
 * the error would end the process, with every request in flight.
 */
export function listen(
  server: http.Server,
  port: number,
  host: string,
  names: ListenerSettings,
  logger: Logger,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const failed = (err: NodeJS.ErrnoException): void => {
      const hostWhy = err.code === undefined ? undefined : HOST_ERRORS[err.code];
      const line =
        hostWhy !== undefined
          ? `${names.host}=${host}: ${hostWhy} (${host}:${port})`
          : `${names.port}=${port}: ${portProblem(err)} (${host}:${port})`;
      reject(new StartupError(line, 'listener'));
    };
    server.once('error', failed);
    server.listen(port, host, () => {
      server.off('error', failed);
      server.on('error', listenerErrorLog(logger, names.port));
      resolve();
    });
  });
}

/**
 * At most one line per listener a second: an accept failure that lasts comes once per event-loop
 * turn. The errors in between are told in one line with their number (`repeated`) and the last one.
 */
export const LISTENER_ERROR_LOG_MS = 1000;

function listenerErrorLog(logger: Logger, listener: string): (err: NodeJS.ErrnoException) => void {
  let loggedAt = -Infinity;
  let repeated = 0;
  let last: NodeJS.ErrnoException | undefined;
  let summary: NodeJS.Timeout | undefined;
  const logRepeated = (): void => {
    summary = undefined;
    loggedAt = Date.now();
    logger.error(
      { listener, code: last?.code, err: last?.message, repeated },
      'listener error repeated; still listening',
    );
    repeated = 0;
  };
  return function logListenerError(err) {
    const now = Date.now();
    if (now - loggedAt >= LISTENER_ERROR_LOG_MS && summary === undefined) {
      loggedAt = now;
      logger.error({ listener, code: err.code, err: err.message }, 'listener error; still listening');
      return;
    }
    repeated++;
    last = err;
    summary ??= setTimeout(logRepeated, loggedAt + LISTENER_ERROR_LOG_MS - now).unref();
  };
}

function portProblem(err: NodeJS.ErrnoException): string {
  if (err.code === 'EADDRINUSE') return 'the port is already in use';
  if (err.code === 'EACCES') return 'this user may not listen on that port';
  return err.message;
}

function listening(server: http.Server): Listening {
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  // A wildcard address is reached on loopback from this host.
  const reachable = host === '0.0.0.0' ? '127.0.0.1' : host === '[::]' ? '[::1]' : host;
  return { url: `http://${reachable}:${address.port}`, bound: `${host}:${address.port}` };
}
