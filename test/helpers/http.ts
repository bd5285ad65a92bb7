import http from 'node:http';
import net from 'node:net';

/**
 * HTTP over real sockets, sending the path exactly as given (fetch() would resolve dot
 * segments before sending, and the gateway's own normalisation is what is under test).
 */

export interface Reply {
  readonly status: number;
  /** The status line's reason phrase. */
  readonly statusText: string;
  readonly headers: http.IncomingHttpHeaders;
  readonly rawHeaders: string[];
  readonly body: Buffer;
  readonly text: string;
  json<T = unknown>(): T;
}

export interface SendOptions {
  readonly method?: string;
  readonly path?: string;
  readonly headers?: Record<string, string | string[]>;
  readonly body?: string | Buffer;
  readonly agent?: http.Agent | false;
  readonly timeoutMs?: number;
}

/**
 * The usage headers as README "Headers and answers" names them, in the order the gateway writes
 * them: the tests' own copy, kept apart from src/limits/headers.ts so a renamed header fails them.
 */
export const USAGE_HEADERS = [
  'X-RateLimit-Limit-Hour',
  'X-RateLimit-Remaining-Hour',
  'X-RateLimit-Limit-Day',
  'X-RateLimit-Remaining-Day',
  'RateLimit-Policy',
  'RateLimit',
] as const;

/** USAGE_HEADERS as Node's `IncomingMessage.headers` keys them. */
export const USAGE_HEADER_KEYS = USAGE_HEADERS.map((name) => name.toLowerCase());

export const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 64 });

export function send(baseUrl: string, options: SendOptions = {}): Promise<Reply> {
  const url = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: url.hostname,
        port: url.port,
        method: options.method ?? 'GET',
        path: options.path ?? '/',
        headers: options.headers,
        agent: options.agent ?? keepAlive,
        timeout: options.timeoutMs ?? 15_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          resolve({
            status: res.statusCode ?? 0,
            statusText: res.statusMessage ?? '',
            headers: res.headers,
            rawHeaders: res.rawHeaders,
            body,
            text: body.toString('utf8'),
            json: <T>() => JSON.parse(body.toString('utf8')) as T,
          });
        });
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error('request timed out')));
    req.on('error', reject);
    req.end(options.body);
  });
}

/** Writes raw bytes to a port and reads until the server closes (or `timeoutMs`). */
export function rawExchange(port: number, bytes: string | Buffer, timeoutMs = 5000): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => socket.destroy(), timeoutMs);
    socket.on('connect', () => socket.write(bytes));
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks).toString('utf8'));
    });
    socket.on('error', (err) => {
      clearTimeout(timer);
      if (chunks.length) resolve(Buffer.concat(chunks).toString('utf8'));
      else reject(err);
    });
  });
}

/**
 * The two-field error body (README "Headers and answers"): `error` is the status line's reason
 * phrase (RFC 9110's), but for the specification's own 429 body.
 */
export function expectTwoFields(reply: Reply): { error: string; message: string } {
  const body = reply.json<Record<string, unknown>>();
  if (Object.keys(body).length !== 2 || typeof body.error !== 'string' || typeof body.message !== 'string') {
    throw new Error(`not a two-field error body: ${reply.text}`);
  }
  const phrase = reply.status === 429 ? 'Rate Limit Exceeded' : reply.statusText;
  if (body.error !== phrase) {
    throw new Error(`"error" is not the reason phrase: ${reply.status} ${reply.statusText}, ${reply.text}`);
  }
  if (reply.status === 429 && reply.statusText !== 'Too Many Requests') {
    throw new Error(`a 429 whose status line says "${reply.statusText}"`);
  }
  return body as { error: string; message: string };
}
