/** Client addresses, as the public app reads them and the admin API takes them. */

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
