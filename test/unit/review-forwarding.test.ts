import { describe, expect, it } from 'vitest';
import { requestHeaderList, type ForwardHeaderValues } from '../../src/proxy/headers.js';
import { forwardedQuery } from '../../src/server/middleware/api-key.js';

/**
 * Review of README "Forwarding": what a client can still make a bridge read as another method, or
 * as its own address in the element SECURITY.md tells a bridge to trust.
 */

const VALUES: ForwardHeaderValues = {
  bridgeHost: '127.0.0.1:9001',
  clientAddress: '198.51.100.7',
  proto: 'http',
  requestId: 'req-1',
  framing: { kind: 'none' },
};

/** RFC 7239 §4: the elements of a Forwarded value, split at commas outside quoted strings. */
function elements(value: string): string[] {
  const out: string[] = [];
  let current = '';
  let quoted = false;
  for (let i = 0; i < value.length; i++) {
    const ch = value[i] as string;
    if (quoted && ch === '\\') {
      current += ch + (value[++i] ?? '');
      continue;
    }
    if (ch === '"') quoted = !quoted;
    if (ch === ',' && !quoted) {
      out.push(current.trim());
      current = '';
    } else current += ch;
  }
  out.push(current.trim());
  return out;
}

/** The `for` parameter of an element (quotes taken off). */
function forOf(element: string): string | undefined {
  return /(?:^|;)\s*for=("(?:[^"\\]|\\.)*"|[^;]*)/i.exec(element)?.[1]?.replace(/^"|"$/g, '');
}

describe("review: a client's Forwarded with an unclosed quoted string", () => {
  it("leaves the gateway's element the last one, with the address the gateway found", () => {
    const list = requestHeaderList(['Host', 'gw.example:8080', 'Forwarded', 'for=203.0.113.9;x="'], VALUES);
    const value = list[list.findIndex((v, i) => i % 2 === 0 && v.toLowerCase() === 'forwarded') + 1] as string;
    // Today: `for=203.0.113.9;x=", for=198.51.100.7;proto=http;host="gw.example:8080"`: the gateway's
    // element is inside the client's quoted string, and the last (only) element names the client's claim.
    expect(forOf(elements(value).at(-1) as string)).toBe('198.51.100.7');
  });
});

describe('review: _method as PHP reads a query (php_register_variable_ex)', () => {
  // PHP drops leading spaces of a parameter name and turns the other spaces and dots into "_":
  // Symfony's and Laravel's Request then find `_method` in the query.
  it.each(['?.method=DELETE', '?+_method=DELETE', '?%20_method=DELETE', '?%2Emethod=DELETE', '?a=1&.method=PUT'])(
    '%s is not forwarded',
    (query) => {
      expect(forwardedQuery(query)).not.toMatch(/method/);
    },
  );
});
