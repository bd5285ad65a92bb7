import type { IncomingMessage, ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type * as HonoModule from 'hono';
import type * as NodeServerModule from '@hono/node-server';
import type * as ResponseModule from '@hono/node-server/utils/response';
import type * as ForwarderModule from '../../src/proxy/forwarder.js';
import { listenAndAnnounce } from './announce.js';

/**
 * The floor of the chosen stack: hono on @hono/node-server, forwarding through the gateway's
 * own Forwarder (http-proxy-middleware, keep-alive agents, one writeHead) — and nothing else:
 * no key check, no limiting, no logging, no metrics. The distance from the bare proxy to this
 * is what the stack costs; the distance from this to the gateway is what the gateway's own work
 * costs.
 */

const [upstream = '', root = ''] = process.argv.slice(2);
const require = createRequire(join(root, 'package.json'));
const load = async <T>(specifier: string): Promise<T> =>
  (await import(pathToFileURL(require.resolve(specifier)).href)) as T;

const { Hono } = await load<typeof HonoModule>('hono');
const { getRequestListener } = await load<typeof NodeServerModule>('@hono/node-server');
const { RESPONSE_ALREADY_SENT } = (await import(
  pathToFileURL(join(root, 'node_modules/@hono/node-server/dist/utils/response.mjs')).href
)) as typeof ResponseModule;
const { Forwarder } = (await import(
  pathToFileURL(join(root, 'dist/proxy/forwarder.js')).href
)) as typeof ForwarderModule;

const target = new URL(upstream);
const forwarder = new Forwarder({ bridges: { eqt: target, fno: target }, timeoutMs: 10_000 });
const app = new Hono<{
  Bindings: { incoming: IncomingMessage; outgoing: ServerResponse };
}>();
app.all('*', async function forward(c) {
  const incoming = c.env.incoming;
  await forwarder.forward({
    incoming,
    outgoing: c.env.outgoing,
    bridge: 'eqt',
    target: incoming.url ?? '/',
    body: undefined,
    maxBodyBytes: 1_048_576,
    requestId: 'floor',
    clientAddress: incoming.socket.remoteAddress ?? '',
    answerHeaders: [],
  });
  return RESPONSE_ALREADY_SENT;
});

const http = await import('node:http');
const server = http.createServer({ keepAliveTimeout: 120_000 }, getRequestListener(app.fetch as never));
listenAndAnnounce(server);
