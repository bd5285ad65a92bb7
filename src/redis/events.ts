import { EventEmitter } from 'node:events';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * Events every gateway instance must hear at once: a key's counters were reset (forget its
 * remembered refusals), the issued keys changed (reload them), and an address was blocked by
 * the invalid-key guard (refuse it here too). Redis pub/sub between
 * instances; a plain emitter for a single in-memory instance. `resync` is raised locally when
 * the subscription comes back after a gap, since messages sent during the gap are lost.
 */

export type GatewayEvent =
  | { readonly type: 'usage-reset'; readonly keyHash: string }
  | { readonly type: 'keys-changed' }
  /** `ms`: how long the block lasts from now (a duration, not a time: clocks of instances differ). */
  | { readonly type: 'address-blocked'; readonly address: string; readonly ms: number }
  | { readonly type: 'resync' };

/** A message from the channel, if it is a well-formed event of ours (anyone who can publish there could send anything). */
export function readEvent(message: string): GatewayEvent | undefined {
  let event: unknown;
  try {
    event = JSON.parse(message);
  } catch {
    return undefined;
  }
  if (typeof event !== 'object' || event === null) return undefined;
  const e = event as Record<string, unknown>;
  if (e.type === 'usage-reset' && typeof e.keyHash === 'string') return { type: 'usage-reset', keyHash: e.keyHash };
  if (e.type === 'keys-changed') return { type: 'keys-changed' };
  if (
    e.type === 'address-blocked' &&
    typeof e.address === 'string' &&
    e.address.length <= 256 &&
    typeof e.ms === 'number' &&
    Number.isFinite(e.ms)
  ) {
    return { type: 'address-blocked', address: e.address, ms: e.ms };
  }
  return undefined;
}

export interface EventBus {
  publish(event: GatewayEvent): Promise<void>;
  subscribe(listener: (event: GatewayEvent) => void): void;
  close(): Promise<void>;
}

export class LocalEventBus implements EventBus {
  readonly #emitter = new EventEmitter();

  async publish(event: GatewayEvent): Promise<void> {
    this.#emitter.emit('event', event);
  }

  subscribe(listener: (event: GatewayEvent) => void): void {
    this.#emitter.on('event', listener);
  }

  async close(): Promise<void> {
    this.#emitter.removeAllListeners();
  }
}

export class RedisEventBus implements EventBus {
  readonly #publisher: RedisClient;
  readonly #subscriber: RedisClient;
  readonly #channel: string;
  readonly #emitter = new EventEmitter();
  #readyOnce = false;

  constructor(publisher: RedisClient, subscriber: RedisClient, channel: string) {
    this.#publisher = publisher;
    this.#subscriber = subscriber;
    this.#channel = channel;
    subscriber.on('message', (ch: string, message: string) => {
      if (ch !== channel) return;
      const event = readEvent(message);
      if (event) this.#emitter.emit('event', event);
    });
    subscriber.on('ready', () => {
      if (this.#readyOnce) this.#emitter.emit('event', { type: 'resync' } satisfies GatewayEvent);
      this.#readyOnce = true;
    });
    subscriber.subscribe(channel).catch(() => {
      // retried by ioredis when the connection comes back
    });
  }

  async publish(event: GatewayEvent): Promise<void> {
    try {
      await this.#publisher.publish(this.#channel, JSON.stringify(event));
    } catch (err) {
      throw toStoreError(err);
    }
  }

  subscribe(listener: (event: GatewayEvent) => void): void {
    this.#emitter.on('event', listener);
  }

  async close(): Promise<void> {
    this.#emitter.removeAllListeners();
    this.#subscriber.disconnect();
  }
}
