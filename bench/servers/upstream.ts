import http from 'node:http';
import { listenAndAnnounce } from './announce.js';

/**
 * The stand-in bridge: answers every request, after reading its body, with one small fixed
 * JSON body. As cheap as a Node HTTP server gets, so that what the benchmark sees of it is
 * mostly the cost of whatever sits in front.
 */

const BODY = Buffer.from(
  JSON.stringify({ status: 200, data: { symbol: 'VNM', price: 61200, volume: 1250300, accessToken: 'bench-token' } }),
);
const HEADERS = { 'Content-Type': 'application/json', 'Content-Length': String(BODY.length) };

const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => res.writeHead(200, HEADERS).end(BODY));
});
// Longer than any pause between measurements, so the proxies' kept-alive sockets are never
// closed under them (a request racing that close would show up as a 502 that is not theirs).
server.keepAliveTimeout = 120_000;
listenAndAnnounce(server);
