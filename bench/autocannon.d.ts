/**
 * The part of autocannon's programmatic API the benchmark uses (autocannon ships no types,
 * and @types/autocannon is not a dependency of this repo).
 */
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events';

  namespace autocannon {
    interface Request {
      method?: string;
      path?: string;
      headers?: Record<string, string>;
      body?: string | Buffer;
    }

    interface Client extends EventEmitter {
      setRequests(requests: Request[]): void;
    }

    interface Options {
      url: string;
      connections?: number;
      duration?: number;
      amount?: number;
      timeout?: number;
      pipelining?: number;
      method?: string;
      headers?: Record<string, string>;
      body?: string | Buffer;
      requests?: Request[];
      setupClient?: (client: Client) => void;
      title?: string;
    }

    interface Histogram {
      average: number;
      mean: number;
      stddev: number;
      min: number;
      max: number;
      total: number;
      p50: number;
      p99: number;
      [percentile: string]: number;
    }

    interface Result {
      title?: string;
      url: string;
      duration: number;
      errors: number;
      timeouts: number;
      mismatches: number;
      non2xx: number;
      resets: number;
      start: Date;
      finish: Date;
      latency: Histogram;
      requests: Histogram & { sent: number };
      throughput: Histogram;
      statusCodeStats: Record<string, { count: number }>;
    }

    interface Instance extends EventEmitter, PromiseLike<Result> {
      stop(): void;
      on(
        event: 'response',
        listener: (client: Client, statusCode: number, resBytes: number, responseTime: number) => void,
      ): this;
      on(event: 'reqError', listener: (error: Error) => void): this;
      on(event: string, listener: (...args: unknown[]) => void): this;
    }
  }

  function autocannon(options: autocannon.Options): autocannon.Instance;
  function autocannon(
    options: autocannon.Options,
    callback: (err: Error | null, result: autocannon.Result) => void,
  ): autocannon.Instance;

  export = autocannon;
}
