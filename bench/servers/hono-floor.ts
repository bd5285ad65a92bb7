import http from 'node:http';
import { getRequestListener, type HttpBindings } from '@hono/node-server';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono } from 'hono';
// Compiled next to the repository (.bench/servers/), this import becomes the built dist/ module.
import { Forwarder } from '../../src/proxy/forwarder.js';
import { listenAndAnnounce } from './announce.js';

/**
 * The hono floor: hono on @hono/node-server, forwarding through the gateway's own Forwarder — and
 * nothing else: no key check, no limiting, no usage headers, no logging, no metrics. The distance
 * from the bare proxy to this is what the chosen stack costs; the distance from this to the gateway
 * is what the gateway's own work costs.
 */

const target = new URL(process.argv[2] ?? '');
const forwarder = new Forwarder({ bridges: { eqt: target, fno: target }, timeoutMs: 10_000 });
const app = new Hono<{ Bindings: HttpBindings }>();
app.all('*', async function forward(c) {
  const { incoming, outgoing } = c.env;
  await forwarder.forward({
    incoming,
    outgoing,
    bridge: 'eqt',
    target: incoming.url ?? '/',
    body: undefined,
    maxBodyBytes: 1_048_576,
    requestId: 'floor',
    clientAddress: incoming.socket.remoteAddress ?? '',
    usageHeaders: [],
  });
  return RESPONSE_ALREADY_SENT;
});

const server = http.createServer({ keepAliveTimeout: 120_000 }, getRequestListener(app.fetch));
listenAndAnnounce(server);
