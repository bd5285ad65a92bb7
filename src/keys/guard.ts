import type { LRUCache } from 'lru-cache';
import { boundedCache } from '../lib/bounded-cache.js';
import { guardedNetwork } from '../lib/address.js';
import type { RateLimiterAbstract } from 'rate-limiter-flexible';
import RateLimiterMemory from 'rate-limiter-flexible/lib/RateLimiterMemory.js';
import RateLimiterRedis from 'rate-limiter-flexible/lib/RateLimiterRedis.js';
import RateLimiterRes from 'rate-limiter-flexible/lib/RateLimiterRes.js';
import type { Cluster, Redis } from 'ioredis';

/**
 * Throttles clients that send missing or unknown API keys (README "API keys and plans"): after `attempts`
 * failures within `windowSeconds` from one address, every request from that address is
 * answered 429 for `windowSeconds`, so keys cannot be guessed and the 401 path is no free
 * flood. An address is counted and blocked as its network (`guardedNetwork`: an IPv6 client by
 * its /64), which is what every method here takes and what blocks are listed and announced as.
 * Counting is rate-limiter-flexible's: in Redis (shared by every instance) with an in-memory
 * insurance limiter, or in memory alone. The block itself is also remembered here,
 * so a blocked address is refused without any store call, and announced (`onBlock`) so that
 * every other instance refuses it too (`block`), not only those that see it guess.
 */

export class InvalidKeyGuard {
  readonly #limiter: RateLimiterAbstract;
  /** The limiter's in-memory insurance when it counts in Redis (it counts while Redis is away). */
  readonly #insurance: RateLimiterAbstract | undefined;
  readonly #blocked: LRUCache<string, number>;
  readonly #now: () => number;
  readonly #maxBlockMs: number;
  readonly #onBlock: (address: string, ms: number) => void;

  constructor(options: {
    client?: Redis | Cluster | undefined;
    prefix: string;
    attempts: number;
    windowSeconds: number;
    now?: () => number;
    onBlock?: (address: string, ms: number) => void;
  }) {
    const policy = { points: options.attempts, duration: options.windowSeconds, blockDuration: options.windowSeconds };
    const memory = new RateLimiterMemory({ ...policy, keyPrefix: 'badkey' });
    this.#limiter = options.client
      ? new RateLimiterRedis({
          ...policy,
          storeClient: options.client,
          keyPrefix: `${options.prefix}badkey`,
          insuranceLimiter: memory,
          rejectIfRedisNotReady: true,
        })
      : memory;
    this.#insurance = options.client ? memory : undefined;
    this.#now = options.now ?? Date.now;
    this.#blocked = boundedCache(100_000);
    this.#maxBlockMs = options.windowSeconds * 1000;
    this.#onBlock = options.onBlock ?? (() => {});
  }

  /** Refuses `address` for `ms` from now: a block another instance announced. Never longer than a window. */
  block(address: string, ms: number): void {
    const network = guardedNetwork(address);
    const span = Math.min(ms, this.#maxBlockMs);
    if (!(span > 0) || this.#blockedMs(network) >= span) return;
    this.#blocked.set(network, this.#now() + span, { ttl: span });
  }

  /** Milliseconds this address stays blocked (0: not blocked). */
  blockedFor(address: string): number {
    return this.#blockedMs(guardedNetwork(address));
  }

  #blockedMs(network: string): number {
    const until = this.#blocked.get(network);
    if (until === undefined) return 0;
    const left = until - this.#now();
    if (left <= 0) this.#blocked.delete(network);
    return Math.max(0, left);
  }

  /** The networks blocked now (an IPv4 address, an IPv6 /64), and for how many more whole seconds (at least 1). */
  blocks(): Array<{ address: string; seconds: number }> {
    const out: Array<{ address: string; seconds: number }> = [];
    for (const address of [...this.#blocked.keys()]) {
      const ms = this.#blockedMs(address);
      if (ms > 0) out.push({ address, seconds: Math.max(1, Math.ceil(ms / 1000)) });
    }
    return out.sort((a, b) => a.address.localeCompare(b.address));
  }

  /**
   * Lifts the block of an address here (an operator's unblock, announced to every instance), and
   * forgets its failed attempts so that the next one does not block it again at once.
   */
  async unblock(address: string): Promise<boolean> {
    const network = guardedNetwork(address);
    const wasBlocked = this.#blockedMs(network) > 0;
    this.#blocked.delete(network);
    await this.#limiter.delete(network).catch(() => false);
    // Else the attempts counted while Redis was away would block the address again at its next one.
    await this.#insurance?.delete(network).catch(() => false);
    return wasBlocked;
  }

  /** Records one failed attempt; returns the milliseconds the address is now blocked for (0: not blocked). */
  async failed(address: string): Promise<number> {
    const network = guardedNetwork(address);
    try {
      await this.#limiter.consume(network);
      return 0;
    } catch (res) {
      if (!(res instanceof RateLimiterRes)) return 0; // the store failed and so did its insurance: do not block on a fault
      const ms = Math.max(1000, res.msBeforeNext);
      // Requests that were already past the check when the block began end here too: announced once.
      const known = this.#blockedMs(network) > 0;
      this.#blocked.set(network, this.#now() + ms, { ttl: ms });
      if (!known) this.#onBlock(network, ms);
      return ms;
    }
  }
}
