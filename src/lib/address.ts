/** Client addresses, as the public app reads them and the admin API takes them. */

import { isIPv6 } from 'node:net';

const IPV4 = /^\d{1,3}(?:\.\d{1,3}){3}$/;
const IPV4_PORT = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/;
const BRACKETED_IPV6 = /^\[([0-9A-Fa-f:.]+)\](?::\d{1,5})?$/;

/**
 * One client address in one spelling, so that the invalid-key guard counts a client once, and a
 * block names it, and is lifted, as the operator knows it (README "API keys and plans"): an IPv4
 * client of a listener on `::` is `::ffff:198.51.100.7` to Node, and some proxies write the
 * client's port into `X-Forwarded-For` (`198.51.100.7:50123`, `[2001:db8::7]:443`), another one
 * on each connection.
 */
export function canonicalAddress(address: string): string {
  if (!address.includes(':')) return address;
  if (address.startsWith('::ffff:') && IPV4.test(address.slice(7))) return address.slice(7);
  const ported = IPV4_PORT.exec(address) ?? BRACKETED_IPV6.exec(address);
  return ported ? canonicalAddress(ported[1]!) : address;
}

/**
 * What the invalid-key guard counts and blocks a client as (README "API keys and plans"): an IPv4
 * address alone, an IPv6 address by its /64 (`2001:db8:0:7::/64`), since a provider gives each
 * IPv6 customer a whole /64, 2^64 addresses to guess from. An IPv4 address written in IPv6
 * (`::ffff:c633:6407`, `::ffff:198.51.100.7`) is that IPv4 address. A /64 in this spelling reads
 * as itself, and any other text (no address at all) as it is.
 */
export function guardedNetwork(address: string): string {
  const canonical = canonicalAddress(address);
  if (!canonical.includes(':')) return canonical;
  const prefix = canonical.endsWith('/64') ? canonical.slice(0, -3) : canonical;
  if (!isIPv6(prefix)) return canonical;
  const groups = ipv6Groups(prefix);
  if (groups.slice(0, 6).join() === '0,0,0,0,0,65535') {
    const [hi = 0, lo = 0] = groups.slice(6);
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  const network = groups.slice(0, 4);
  // RFC 5952: the four zero groups of the host part are the longest run, so `::` stands for them
  // and for any zero groups of the network before them.
  while (network.length > 0 && network[network.length - 1] === 0) network.pop();
  return `${network.map((g) => g.toString(16)).join(':')}::/64`;
}

/** The eight 16-bit groups of an address `isIPv6` accepts. */
function ipv6Groups(address: string): number[] {
  const zone = address.indexOf('%');
  let text = zone === -1 ? address : address.slice(0, zone);
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (dotted) {
    const [a = 0, b = 0, c = 0, d = 0] = dotted.slice(1).map(Number);
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const read = (part: string): number[] => (part ? part.split(':').map((g) => parseInt(g, 16)) : []);
  const [head = '', tail] = text.split('::');
  const left = read(head);
  if (tail === undefined) return left;
  const right = read(tail);
  return [...left, ...Array<number>(8 - left.length - right.length).fill(0), ...right];
}
