import http from 'node:http';
import { listenAndAnnounce } from './announce.js';

/**
 * The baseline: a reverse proxy with no limiting at all — the cost of forwarding alone.
 * Same kept-alive agent settings as the gateway's forwarder; bodies piped both ways.
 */

const target = new URL(process.argv[2] ?? '');
const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 256, scheduling: 'lifo' });

const server = http.createServer((req, res) => {
  const upstream = http.request(
    { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers, agent },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    },
  );
  upstream.on('error', () => {
    if (!res.headersSent) res.writeHead(502);
    res.end();
  });
  req.pipe(upstream);
});
server.keepAliveTimeout = 120_000;
listenAndAnnounce(server);
