import type { Context } from 'hono';
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

const IPV4 = /^\d{1,3}(?:\.\d{1,3}){3}$/;
const IPV4_PORT = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/;
const BRACKETED_IPV6 = /^\[([0-9A-Fa-f:.]+)\](?::\d{1,5})?$/;

/**
 * One client address in one spelling, so that the invalid-key guard counts a client once and a
 * block names it as the operator knows it (README "API keys and plans"): an IPv4 client of a listener on
 * `::` is `::ffff:198.51.100.7` to Node, and some proxies write the client's port into
 * `X-Forwarded-For` (`198.51.100.7:50123`, `[2001:db8::7]:443`), another one on each connection.
 */
export function canonicalAddress(address: string): string {
  if (!address.includes(':')) return address;
  if (address.startsWith('::ffff:') && IPV4.test(address.slice(7))) return address.slice(7);
  const ported = IPV4_PORT.exec(address) ?? BRACKETED_IPV6.exec(address);
  return ported ? canonicalAddress(ported[1]!) : address;
}
