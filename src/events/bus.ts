import { EventEmitter } from 'node:events';

/**
 * Events every gateway instance must hear at once: a key's counters were reset (forget its
 * remembered refusals), the issued keys changed (reload them), and an address was blocked by
 * the invalid-key guard (refuse it here too). Redis pub/sub between instances
 * (redis/events.ts); a plain emitter for a single in-memory instance. `resync` is raised locally
 * when the subscription comes back after a gap, since messages sent during the gap are lost.
 */

export type GatewayEvent =
  | { readonly type: 'usage-reset'; readonly keyHash: string }
  | { readonly type: 'keys-changed' }
  /** `ms`: how long the block lasts from now (a duration, not a time: clocks of instances differ). */
  | { readonly type: 'address-blocked'; readonly address: string; readonly ms: number }
  /** An operator lifted the block of an address. */
  | { readonly type: 'address-unblocked'; readonly address: string }
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
  if (e.type === 'address-unblocked' && typeof e.address === 'string' && e.address.length <= 256) {
    return { type: 'address-unblocked', address: e.address };
  }
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
