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

  /** `onRefused`: Redis refused the subscription itself (an ACL user without the channel), not the connection. */
  constructor(publisher: RedisClient, subscriber: RedisClient, channel: string, onRefused?: (reason: string) => void) {
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
    subscriber.subscribe(channel).catch((err: unknown) => {
      // A connection that fails is retried by ioredis when it comes back; a refusal is an answer.
      if (err instanceof ReplyError) onRefused?.((err as Error).message);
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
