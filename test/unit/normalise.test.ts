import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { normaliseTarget } from '../../src/limits/normalise.js';

const ok = (target: string) => {
  const result = normaliseTarget(target);
  if (!result.ok) throw new Error(`refused ${target}: ${result.reason}`);
  return result;
};

describe('normaliseTarget', () => {
  it.each([
    ['/orders/1', '/orders/1'],
    ['/orders//1', '/orders/1'],
    ['/orders/1/', '/orders/1'],
    ['//orders///1//', '/orders/1'],
    ['/orders/./1', '/orders/1'],
    ['/orders/x/../1', '/orders/1'],
    ['/../../orders/1', '/orders/1'],
    ['/orders/%2e/1', '/orders/1'],
    ['/orders/%2E%2e/orders/1', '/orders/1'],
    ['/%6Frders/1', '/orders/1'],
    ['/orders/%7e1', '/orders/~1'],
    ['/orders/%c3%a9', '/orders/%C3%A9'],
    // Bridges decode these before routing: `a%3Ab` is the literal `a:b` (test below).
    ['/x/a%3Ab', '/x/a:b'],
    ['/x/%40%21%24%26%27%28%29%2A%2B%2C%3D%3a', "/x/@!$&'()*+,=:"],
    ['/x/a%3Bb', '/x/a%3Bb'],
    ['/x/%20%25%3F%23', '/x/%20%25%3F%23'],
    ['/', '/'],
    ['/./', '/'],
    ['/..', '/'],
  ])('%s → %s', (target, path) => {
    expect(ok(target).path).toBe(path);
  });

  it('keeps the query string exactly as sent', () => {
    expect(ok('/orders/1/?a=1&b=%2F&c=/../x').query).toBe('?a=1&b=%2F&c=/../x');
    expect(ok('/orders/1').query).toBe('');
  });

  it('accepts the absolute form and keeps only its path and query (RFC 9112 §3.2.2)', () => {
    const result = ok('http://gateway.example:8080/orders//1?x=2');
    expect(result.path).toBe('/orders/1');
    expect(result.query).toBe('?x=2');
    expect(ok('https://gateway.example').path).toBe('/');
  });

  it.each([
    ['/orders/%2F1', 'Encoded slash in path'],
    ['/orders/%2f1', 'Encoded slash in path'],
    ['/orders/%5C1', 'Encoded slash in path'],
    ['/orders/%00', 'Encoded control character in path'],
    ['/orders/%zz', 'Malformed percent-encoding in path'],
    ['/orders/1%', 'Malformed percent-encoding in path'],
    ['/orders\\1', 'Invalid character in path'],
    ['/orders/;', 'Semicolon in path'],
    ['/orders;jsessionid=1/1', 'Semicolon in path'],
    ['/orders/<1>', 'Invalid character in path'],
    ['/orders/1#frag', 'Malformed request target'],
    ['orders/1', 'Malformed request target'],
    ['*', 'Malformed request target'],
  ])('refuses %s', (target, reason) => {
    expect(normaliseTarget(target)).toEqual({ ok: false, reason });
  });

  const segment = fc.oneof(
    fc.constantFrom('', '.', '..', '%2e', '%2E%2e', 'orders', '1', 'a%41', '%7E', 'x.y', '~', '@:'),
    fc.stringMatching(/^[A-Za-z0-9._~-]{1,6}$/),
  );
  const path = fc.array(segment, { maxLength: 8 }).map((parts) => '/' + parts.join('/'));

  it('always yields a path in normal form: no empty, "." or ".." segment, no trailing slash', () => {
    fc.assert(
      fc.property(path, (target) => {
        const result = ok(target);
        expect(result.path.startsWith('/')).toBe(true);
        expect(result.path === '/' || !result.path.endsWith('/')).toBe(true);
        for (const s of result.segments) {
          expect(s).not.toBe('');
          expect(s).not.toBe('.');
          expect(s).not.toBe('..');
        }
        expect(result.path).toBe('/' + result.segments.join('/'));
      }),
      { numRuns: 2000 },
    );
  });

  it('is idempotent: a normalised path normalises to itself', () => {
    fc.assert(
      fc.property(path, (target) => {
        const once = ok(target);
        expect(ok(once.path).path).toBe(once.path);
      }),
      { numRuns: 2000 },
    );
  });

  it('gives a path already in normal form back as sent, split at its slashes', () => {
    // Every pchar of RFC 3986 but ";", which is refused (above).
    const plain = fc.array(fc.stringMatching(/^[A-Za-z0-9._~!$&'()*+,=:@-]{1,8}$/), { minLength: 1, maxLength: 8 });
    fc.assert(
      fc.property(plain, fc.constantFrom('', '?a=1', '?b=/../x'), (parts, query) => {
        fc.pre(parts.every((p) => p !== '.' && p !== '..'));
        const result = ok('/' + parts.join('/') + query);
        expect(result.path).toBe('/' + parts.join('/'));
        expect(result.segments).toEqual(parts);
        expect(result.query).toBe(query);
      }),
      { numRuns: 2000 },
    );
  });

  it('decodes an escape in the middle of a segment and keeps the characters after it', () => {
    expect(ok('/or%64ers/a%41b%c3%A9c/x').segments).toEqual(['orders', 'aAb%C3%A9c', 'x']);
    expect(ok('/or%64ers/a%41b%c3%A9c/x').path).toBe('/orders/aAb%C3%A9c/x');
    expect(ok('/a/%2e%2e/b').path).toBe('/b');
  });
});
