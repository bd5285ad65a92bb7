import { describe, expect, it } from 'vitest';
import { requestHeaderList, type ForwardHeaderValues } from '../../src/proxy/headers.js';

/**
 * The client-address fields of README "Forwarding": a client's own `X-Real-IP` (and kin) never
 * reaches a bridge as the client wrote it, and a client's `Forwarded` gets this hop's element
 * appended (RFC 7239 §4), as `X-Forwarded-For` gets the address.
 */

const VALUES: ForwardHeaderValues = {
  bridgeHost: '127.0.0.1:9001',
  clientAddress: '198.51.100.7',
  proto: 'http',
  requestId: 'req-1',
  framing: { kind: 'none' },
};

/** Every value the bridge gets for `field` (case-insensitive), in order. */
function valuesOf(list: readonly string[], field: string): string[] {
  const found: string[] = [];
  for (let i = 0; i < list.length; i += 2) if (list[i]!.toLowerCase() === field) found.push(list[i + 1]!);
  return found;
}

describe('regression: a client could tell the bridge any address in X-Real-IP or Forwarded', () => {
  it('replaces each single-address field the client sent with the address the gateway found, once per field', () => {
    const list = requestHeaderList(
      [
        'Host',
        'api.example.com',
        'X-Real-IP',
        '10.0.0.1',
        'X-Real-IP',
        '10.0.0.2',
        'True-Client-IP',
        '10.0.0.3',
        'CF-Connecting-IP',
        '10.0.0.4',
        'X-Client-IP',
        '10.0.0.5',
        'X-Cluster-Client-IP',
        '10.0.0.6',
        'Fastly-Client-IP',
        '10.0.0.7',
      ],
      VALUES,
    );
    for (const field of [
      'x-real-ip',
      'true-client-ip',
      'cf-connecting-ip',
      'x-client-ip',
      'x-cluster-client-ip',
      'fastly-client-ip',
    ]) {
      expect(valuesOf(list, field), field).toEqual(['198.51.100.7']);
    }
  });

  it('drops such a field spelt with underscores, which CGI-style servers read as the same field', () => {
    const list = requestHeaderList(['Host', 'h', 'X_Real_IP', '10.0.0.1'], VALUES);
    expect(valuesOf(list, 'x_real_ip')).toEqual([]);
    expect(valuesOf(list, 'x-real-ip')).toEqual([]);
  });

  it("appends this hop's element to the client's Forwarded lines, joined into one field", () => {
    const list = requestHeaderList(
      ['Host', 'api.example.com', 'Forwarded', 'for=10.0.0.1', 'Forwarded', 'for=10.0.0.2;proto=https'],
      VALUES,
    );
    expect(valuesOf(list, 'forwarded')).toEqual([
      'for=10.0.0.1, for=10.0.0.2;proto=https, for=198.51.100.7;proto=http;host=api.example.com',
    ]);
  });

  it('quotes an IPv6 address in brackets and a host with a port (RFC 7239 §6)', () => {
    const list = requestHeaderList(['Host', 'gw.example:8080', 'Forwarded', 'for=unknown'], {
      ...VALUES,
      clientAddress: '2001:db8::1',
      proto: 'https',
    });
    expect(valuesOf(list, 'forwarded')).toEqual([
      'for=unknown, for="[2001:db8::1]";proto=https;host="gw.example:8080"',
    ]);
  });

  it('adds no Forwarded or X-Real-IP of its own to a request that had none', () => {
    const list = requestHeaderList(['Host', 'api.example.com', 'Accept', '*/*'], VALUES);
    expect(valuesOf(list, 'forwarded')).toEqual([]);
    expect(valuesOf(list, 'x-real-ip')).toEqual([]);
    expect(valuesOf(list, 'accept')).toEqual(['*/*']);
  });
});
