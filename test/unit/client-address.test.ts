import type { Context } from 'hono';
import { describe, expect, it } from 'vitest';
import { canonicalAddress, guardedNetwork } from '../../src/lib/address.js';
import { clientAddressOf } from '../../src/server/client-address.js';
import type { GatewayEnv } from '../../src/server/context.js';

const request = (remoteAddress: string, forwardedFor?: string): Context<GatewayEnv> =>
  ({
    env: {
      incoming: {
        socket: { remoteAddress },
        headers: forwardedFor === undefined ? {} : { 'x-forwarded-for': forwardedFor },
      },
    },
  }) as unknown as Context<GatewayEnv>;

describe('regression: one client counted by the invalid-key guard under several addresses', () => {
  it.each([
    ['198.51.100.7', '198.51.100.7'],
    // An IPv4 client of a listener on `::` (HOST=::).
    ['::ffff:198.51.100.7', '198.51.100.7'],
    // A port some proxies write into X-Forwarded-For, another one for each connection.
    ['198.51.100.7:50123', '198.51.100.7'],
    ['[2001:db8::7]:443', '2001:db8::7'],
    ['[2001:db8::7]', '2001:db8::7'],
    ['[::ffff:198.51.100.7]:443', '198.51.100.7'],
  ])('%s is %s', (written, address) => {
    expect(canonicalAddress(written)).toBe(address);
  });

  it.each(['2001:db8::7', '::1', '::ffff:0:198.51.100.7', 'unknown', 'not:an:address:1'])(
    '%s stays as it is',
    (address) => {
      expect(canonicalAddress(address)).toBe(address);
    },
  );

  it('reads the socket address and the trusted X-Forwarded-For entry in that spelling', () => {
    expect(clientAddressOf(0)(request('::ffff:203.0.113.9', '198.51.100.7:1'))).toBe('203.0.113.9');
    expect(clientAddressOf(1)(request('::ffff:10.0.0.2', '192.0.2.1, 198.51.100.7:50123'))).toBe('198.51.100.7');
    expect(clientAddressOf(2)(request('10.0.0.2', '192.0.2.1:9, 198.51.100.7:50123'))).toBe('192.0.2.1');
    expect(clientAddressOf(1)(request('::ffff:10.0.0.2'))).toBe('10.0.0.2');
  });
});

describe('regression: the invalid-key guard counted an IPv6 client per address, not per /64', () => {
  it.each([
    ['198.51.100.7', '198.51.100.7'],
    ['198.51.100.7:50123', '198.51.100.7'],
    ['::ffff:198.51.100.7', '198.51.100.7'],
    ['::ffff:c633:6407', '198.51.100.7'],
    ['[::FFFF:c633:6407]:443', '198.51.100.7'],
    ['2001:db8::7', '2001:db8::/64'],
    ['2001:DB8:0:0:1::7', '2001:db8::/64'],
    ['2001:0db8:0000:0007:ffff:0:0:1', '2001:db8:0:7::/64'],
    ['[2001:db8:0:7::9]:443', '2001:db8:0:7::/64'],
    ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2::/64'],
    ['1:0:0:4::', '1:0:0:4::/64'],
    ['0:0:0:1::9', '0:0:0:1::/64'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4::/64'],
    ['fe80::1%eth0', 'fe80::/64'],
    ['::1', '::/64'],
    // A /64 as listed, in another spelling, or with a host part, reads as that /64.
    ['2001:db8:0:7::/64', '2001:db8:0:7::/64'],
    ['2001:db8:0:0::/64', '2001:db8::/64'],
    ['2001:db8::7/64', '2001:db8::/64'],
  ])('%s is counted as %s', (written, network) => {
    expect(guardedNetwork(written)).toBe(network);
  });

  it.each(['unknown', 'not:an:address', '2001:db8::/48', '2001:db8::g'])('%s stays as it is', (text) => {
    expect(guardedNetwork(text)).toBe(text);
  });
});
