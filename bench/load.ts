import http from 'node:http';
import autocannon from 'autocannon';

/**
 * The workloads and one measurement with autocannon. Every target gets byte-for-byte the
 * same requests, API-key header included, so the only difference is what sits in front of
 * the upstream.
 */

export type WorkloadName = 'token' | 'quote' | 'order';

export interface Workload {
  readonly name: WorkloadName;
  readonly label: string;
  /** One request per API key of the pool; each connection loops over them from its own offset. */
  readonly requests: autocannon.Request[];
}

export const TOKEN_PATH = '/oapi/auth/gen-secret-key/underlying';
export const ORDER_PATH = '/orders';
const SYMBOLS = ['VNM', 'FPT', 'HPG', 'VCB', 'MWG', 'SSI', 'VIC', 'MSN'];

export function apiKeys(count: number, prefix = 'bench-key'): string[] {
  return Array.from({ length: count }, (_, i) => `${prefix}-${String(i).padStart(3, '0')}`);
}

/** The same JSON `POST` from every key of the pool. */
function jsonPostWorkload(name: WorkloadName, path: string, payload: object, keys: readonly string[]): Workload {
  const body = JSON.stringify(payload);
  return {
    name,
    label: `POST ${path}`,
    requests: keys.map((key) => ({
      method: 'POST',
      path,
      headers: { 'content-type': 'application/json', 'x-api-key': key },
      body,
    })),
  };
}

export function tokenWorkload(keys: readonly string[]): Workload {
  return jsonPostWorkload('token', TOKEN_PATH, { username: 'demo', password: 'demo-password' }, keys);
}

/**
 * An order placed: a small JSON body on a route that is not a credential route, which the gateway
 * forwards as it came (`npm run bench:ab` with BENCH_AB_WORKLOADS=order; docs/performance.md,
 * change 14).
 */
export function orderWorkload(keys: readonly string[]): Workload {
  const order = { account: '0001', symbol: 'VNM', side: 'buy', quantity: 100, price: 61500 };
  return jsonPostWorkload('order', ORDER_PATH, order, keys);
}

export function quoteWorkload(keys: readonly string[]): Workload {
  return {
    name: 'quote',
    label: 'GET /marketdata/quote/{symbol}',
    requests: keys.map((key, i) => ({
      method: 'GET',
      path: `/marketdata/quote/${SYMBOLS[i % SYMBOLS.length]}`,
      headers: { 'x-api-key': key },
    })),
  };
}

export interface Measurement {
  readonly completed: number;
  readonly sent: number;
  readonly seconds: number;
  readonly reqPerSec: number;
  /** Every response time of the run, in milliseconds (autocannon's own histogram keeps whole ms only). */
  readonly latenciesMs: Float64Array;
  readonly statusCounts: Record<string, number>;
  readonly errors: number;
  readonly timeouts: number;
}

let running: autocannon.Instance | undefined;

/** Stops the measurement in progress (SIGINT). */
export function stopRunningLoad(): void {
  running?.stop();
}

/** Rotates the request list so that connection i starts at key i: keys spread over connections from the first second. */
function spreadOverConnections(requests: readonly autocannon.Request[]): (client: autocannon.Client) => void {
  let next = 0;
  return (client) => {
    const offset = next++ % requests.length;
    client.setRequests(
      [...requests.slice(offset), ...requests.slice(0, offset)].map((r) => ({ ...r, headers: { ...r.headers } })),
    );
  };
}

export function measure(
  url: string,
  requests: readonly autocannon.Request[],
  options: { connections: number; seconds: number },
): Promise<Measurement> {
  const latencies: number[] = [];
  return new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url,
        connections: options.connections,
        duration: options.seconds,
        timeout: 10,
        requests: [...requests],
        setupClient: spreadOverConnections(requests),
      },
      (err, result) => {
        running = undefined;
        if (err) return reject(err instanceof Error ? err : new Error(String(err)));
        const statusCounts: Record<string, number> = {};
        for (const [status, { count }] of Object.entries(result.statusCodeStats ?? {}))
          statusCounts[status] = count ?? 0;
        resolve({
          completed: result.requests.total,
          sent: result.requests.sent,
          seconds: result.duration,
          reqPerSec: result.requests.total / result.duration,
          latenciesMs: Float64Array.from(latencies),
          statusCounts,
          errors: result.errors,
          timeouts: result.timeouts,
        });
      },
    );
    instance.on('response', (_client, _status, _bytes, responseTime) => {
      latencies.push(responseTime);
    });
    running = instance;
  });
}

/**
 * Exactly `count` requests, `connections` at a time on kept-alive connections, taking the
 * workload's requests in turn; every answer is read to its end. Resolves with the answers'
 * status counts; rejects at the first request that fails or waits more than `timeoutMs` for its
 * answer, and then sends no more. For `npm run bench:instructions`, which divides by a known
 * number of requests.
 */
export async function sendExactly(
  url: string,
  requests: readonly autocannon.Request[],
  count: number,
  connections: number,
  timeoutMs = 60_000,
): Promise<Record<string, number>> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections });
  const statusCounts: Record<string, number> = {};
  let next = 0;
  let failed = false;
  const sendOne = (request: autocannon.Request): Promise<number> =>
    new Promise((resolve, reject) => {
      const outgoing = http.request(new URL(request.path ?? '/', url), {
        agent,
        method: request.method ?? 'GET',
        headers: request.headers,
      });
      outgoing.setTimeout(timeoutMs, () => outgoing.destroy(new Error(`no answer within ${timeoutMs} ms`)));
      outgoing.once('error', reject);
      outgoing.once('response', (response) => {
        response.resume();
        response.once('end', () => resolve(response.statusCode ?? 0));
        response.once('error', reject);
      });
      outgoing.end(request.body);
    });
  const connection = async (): Promise<void> => {
    while (next < count && !failed) {
      const request = requests[next++ % requests.length];
      if (!request) return;
      try {
        const status = String(await sendOne(request));
        statusCounts[status] = (statusCounts[status] ?? 0) + 1;
      } catch (err) {
        failed = true;
        throw err;
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(connections, count) }, connection));
  } finally {
    agent.destroy();
  }
  return statusCounts;
}
