import { pathToFileURL } from 'node:url';

/**
 * A client of oapi-gateway that keeps to its limits (README, "Headers and answers").
 *
 * - It reads the usage headers of every answer: `RateLimit-Policy` ("hour";q=60;w=3600, …),
 *   `RateLimit` ("hour";r=48;t=1800, …: r requests left, t seconds until that window resets)
 *   and the `X-RateLimit-*` pairs.
 * - When an answer says a window has 0 left, it does not send the next request to that
 *   endpoint before the window resets: that request would surely be refused.
 * - On a `429` (another client with the same key may have spent the window) it waits
 *   `Retry-After` seconds, plus a little jitter so that many clients do not all come back in
 *   the same second, and tries again.
 *
 * The client itself needs only global `fetch` (Node.js 18 and later, browsers). Time is
 * injectable (`now`, `sleep`), real time by default. Try it against `npm run sandbox`:
 *
 *   OAPI_KEY=oapi_… npx tsx examples/client.ts /orders/42 5
 */

export interface ClientOptions {
  /** The gateway, e.g. `https://api.example.com`. */
  readonly baseUrl: string;
  readonly apiKey: string;
  /** The gateway's `API_KEY_HEADER`. */
  readonly apiKeyHeader?: string;
  /** Retries after a `429` before its answer is returned as it is. */
  readonly maxRetries?: number;
  /** At most this much is added to every wait, at random. */
  readonly jitterMs?: number;
  readonly fetch?: typeof fetch;
  /** Epoch milliseconds. */
  readonly now?: () => number;
  readonly sleep?: (ms: number) => Promise<void>;
  /** In [0, 1). */
  readonly random?: () => number;
  /** Told of every wait before it starts. */
  readonly onWait?: (wait: Wait) => void;
}

export interface Wait {
  readonly endpoint: string;
  readonly ms: number;
  /** `window-spent`: an answer said 0 left; `retry-after`: the gateway answered 429. */
  readonly reason: 'window-spent' | 'retry-after';
}

/** One window as `RateLimit-Policy` and `RateLimit` describe it. */
export interface WindowUsage {
  readonly name: string;
  /** Requests allowed per window (`q`), and its length in seconds (`w`). */
  readonly quota?: number;
  readonly windowSeconds?: number;
  /** Requests left (`r`) and whole seconds until the window resets (`t`). */
  readonly remaining: number;
  readonly resetSeconds: number;
}

export interface Usage {
  readonly windows: readonly WindowUsage[];
  /** The `X-RateLimit-*` headers. */
  readonly limitHour?: number;
  readonly remainingHour?: number;
  readonly limitDay?: number;
  readonly remainingDay?: number;
}

export interface CallOptions {
  readonly body?: unknown;
  readonly headers?: Record<string, string>;
  /**
   * The key under which limits are remembered: by default `METHOD /path`. Calls that share a
   * row of the limit table (`/orders/1` and `/orders/2` under `GET /orders/{id}`) should pass the
   * same key, the route of the row (`x-ratelimit-row`, or the operation's path, in the gateway's
   * `GET /openapi.json`).
   */
  readonly endpoint?: string;
}

export interface CallResult {
  readonly response: Response;
  /** Undefined when the answer had no usage headers (an answer not counted). */
  readonly usage: Usage | undefined;
  readonly attempts: number;
}

/** Items of a structured header list (RFC 9651): `"hour";r=48;t=1800, "day";r=360;t=30000`. */
function items(header: string | null): Array<{ name: string; params: Map<string, number> }> {
  if (!header) return [];
  return header.split(',').flatMap((item) => {
    const [name, ...params] = item.trim().split(';');
    if (!name) return [];
    const values = new Map<string, number>();
    for (const param of params) {
      const [key, value] = param.split('=');
      if (key && value !== undefined && /^\d+$/.test(value.trim())) values.set(key.trim(), Number(value));
    }
    return [{ name: name.replace(/^"|"$/g, ''), params: values }];
  });
}

/** The usage an answer reports, or undefined when it carries no `RateLimit` header. */
export function readUsage(headers: Headers): Usage | undefined {
  const policy = new Map(items(headers.get('RateLimit-Policy')).map((i) => [i.name, i.params]));
  const windows: WindowUsage[] = [];
  for (const { name, params } of items(headers.get('RateLimit'))) {
    const remaining = params.get('r');
    const resetSeconds = params.get('t');
    if (remaining === undefined || resetSeconds === undefined) continue;
    windows.push({
      name,
      quota: policy.get(name)?.get('q'),
      windowSeconds: policy.get(name)?.get('w'),
      remaining,
      resetSeconds,
    });
  }
  if (windows.length === 0) return undefined;
  const number = (name: string): number | undefined => {
    const value = headers.get(name);
    return value !== null && /^\d+$/.test(value) ? Number(value) : undefined;
  };
  return {
    windows,
    limitHour: number('X-RateLimit-Limit-Hour'),
    remainingHour: number('X-RateLimit-Remaining-Hour'),
    limitDay: number('X-RateLimit-Limit-Day'),
    remainingDay: number('X-RateLimit-Remaining-Day'),
  };
}

/** `Retry-After` in milliseconds: delay-seconds or an HTTP date (RFC 9110 §10.2.3); 1 s when absent. */
export function retryAfterMs(header: string | null, now: number): number {
  if (header && /^\d+$/.test(header.trim())) return Number(header) * 1000;
  const date = header ? Date.parse(header) : NaN;
  return Number.isNaN(date) ? 1000 : Math.max(0, date - now);
}

export class GatewayClient {
  readonly #options: Required<Omit<ClientOptions, 'onWait'>> & Pick<ClientOptions, 'onWait'>;
  /** Per endpoint: no request before this instant (epoch ms), and why. */
  readonly #notBefore = new Map<string, { at: number; reason: Wait['reason'] }>();

  constructor(options: ClientOptions) {
    this.#options = {
      apiKeyHeader: 'X-API-Key',
      maxRetries: 3,
      jitterMs: 1000,
      fetch: (input, init) => fetch(input, init),
      now: () => Date.now(),
      sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
      random: Math.random,
      ...options,
    };
  }

  /** Milliseconds before a request to `endpoint` could be allowed, as far as this client knows. */
  waitFor(endpoint: string): number {
    const notBefore = this.#notBefore.get(endpoint);
    return notBefore ? Math.max(0, notBefore.at - this.#options.now()) : 0;
  }

  async call(method: string, path: string, options: CallOptions = {}): Promise<CallResult> {
    const o = this.#options;
    const endpoint = options.endpoint ?? `${method.toUpperCase()} ${path.split('?')[0]}`;
    const headers: Record<string, string> = { ...options.headers, [o.apiKeyHeader]: o.apiKey };
    let body: string | undefined;
    if (options.body !== undefined) {
      body = JSON.stringify(options.body);
      headers['Content-Type'] = 'application/json';
    }
    for (let attempt = 1; ; attempt++) {
      const wait = this.waitFor(endpoint);
      if (wait > 0) {
        const ms = wait + Math.floor(o.random() * o.jitterMs);
        o.onWait?.({ endpoint, ms, reason: this.#notBefore.get(endpoint)?.reason ?? 'window-spent' });
        await o.sleep(ms);
      }
      const response = await o.fetch(new URL(path, o.baseUrl), { method, headers, body });
      const now = o.now();
      const usage = readUsage(response.headers);
      // A spent window: nothing is sent to this endpoint until it resets (t is rounded up by the gateway).
      const spent = (usage?.windows ?? []).filter((w) => w.remaining === 0).map((w) => now + w.resetSeconds * 1000);
      if (spent.length) this.#notBefore.set(endpoint, { at: Math.max(...spent), reason: 'window-spent' });
      else if (usage) this.#notBefore.delete(endpoint);
      if (response.status !== 429 || attempt > o.maxRetries) return { response, usage, attempts: attempt };
      await response.body?.cancel();
      const at = now + retryAfterMs(response.headers.get('Retry-After'), now);
      this.#notBefore.set(endpoint, {
        at: Math.max(at, this.#notBefore.get(endpoint)?.at ?? 0),
        reason: 'retry-after',
      });
    }
  }
}

async function main(): Promise<void> {
  const apiKey = process.env.OAPI_KEY;
  if (!apiKey) throw new Error('set OAPI_KEY to an API key (npm run sandbox prints one)');
  const [path = '/orders/42', count = '3'] = process.argv.slice(2);
  const client = new GatewayClient({
    baseUrl: process.env.OAPI_URL ?? 'http://127.0.0.1:8080',
    apiKey,
    onWait: (w) => console.log(`waiting ${(w.ms / 1000).toFixed(1)} s before ${w.endpoint} (${w.reason})`),
  });
  for (let i = 0; i < Number(count); i++) {
    const { response, usage } = await client.call('GET', path);
    const left = usage?.windows.map((w) => `${w.name} ${w.remaining}/${w.quota ?? '?'} (reset in ${w.resetSeconds} s)`);
    console.log(response.status, left?.join(', ') ?? 'no usage headers', await response.text());
  }
}

// Run as a script (not when imported, as the tests do).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
