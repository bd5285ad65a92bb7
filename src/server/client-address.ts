import type { Context } from 'hono';
import { canonicalAddress } from '../lib/address.js';
import type { GatewayEnv } from './context.js';

/**
 * The client's address, for `X-Forwarded-For` and the invalid-key guard. With
 * `TRUST_PROXY_HOPS=n`, n proxies of the operator's own stand in front of the gateway and
 * the address is the one the outermost of them saw (the n-th entry from the right of
 * `X-Forwarded-For`); entries further left were written by the client and are not trusted.
 */
export function clientAddressOf(trustProxyHops: number): (c: Context<GatewayEnv>) => string {
  return function clientAddress(c) {
    const remote = canonicalAddress(c.env?.incoming?.socket.remoteAddress ?? 'unknown');
    if (trustProxyHops === 0) return remote;
    const forwarded = c.env?.incoming?.headers['x-forwarded-for'];
    if (typeof forwarded !== 'string') return remote;
    const hops = forwarded
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
    const found = hops[hops.length - trustProxyHops] ?? hops[0];
    return found === undefined ? remote : canonicalAddress(found);
  };
}
