import { EventEmitter } from 'node:events';
import { ReplyError } from 'ioredis';
import { readEvent, type EventBus, type GatewayEvent } from '../events/bus.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/** The event bus between instances: Redis pub/sub on one channel (events/bus.ts says which events). */

export class RedisEventBus implements EventBus {
  readonly #publisher: RedisClient;
  readonly #subscriber: RedisClient;
  readonly #channel: string;
  readonly #emitter = new EventEmitter();
  #readyOnce = false;

  /** `onRefused`: Redis refused this user the channel (NOPERM: an ACL user without it), not the connection. */
  constructor(publisher: RedisClient, subscriber: RedisClient, channel: string, onRefused?: (reason: string) => void) {
    this.#publisher = publisher;
    this.#subscriber = subscriber;
    this.#channel = channel;
    subscriber.on('message', (ch: string, message: string) => {
      if (ch !== channel) return;
      const event = readEvent(message);
      if (event) this.#emitter.emit('event', event);
    });
    // ioredis subscribes again after a reconnect only to the channels it was subscribed to: a
    // SUBSCRIBE that failed (queued while the connection was opening, then failed with it, as on a
    // WRONGPASS or NOAUTH) is sent again here on each connection until it succeeds.
    let subscribed = false;
    let subscribing = false;
    const subscribe = (): void => {
      if (subscribed || subscribing) return;
      subscribing = true;
      subscriber.subscribe(channel).then(
        () => {
          subscribed = true;
          subscribing = false;
        },
        (err: unknown) => {
          subscribing = false;
          // Only NOPERM is Redis refusing this user the channel; another answer (WRONGPASS, NOAUTH)
          // failed the connection the SUBSCRIBE was queued on.
          if (err instanceof ReplyError && (err as Error).message.startsWith('NOPERM'))
            onRefused?.((err as Error).message);
        },
      );
    };
    subscriber.on('ready', () => {
      if (this.#readyOnce) this.#emitter.emit('event', { type: 'resync' } satisfies GatewayEvent);
      this.#readyOnce = true;
      subscribe();
    });
    subscribe();
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
