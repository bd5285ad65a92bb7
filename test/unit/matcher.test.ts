import { describe, expect, it } from 'vitest';
import { RouteMatcher } from '../../src/limits/matcher.js';
import { parseRoute, type Route } from '../../src/limits/route.js';

function route(text: string): Route {
  const r = parseRoute(text);
  if (typeof r === 'string') throw new Error(r);
  return r;
}

function matcherOf(...texts: string[]): RouteMatcher<string> {
  const m = new RouteMatcher<string>();
  for (const t of texts) m.add(route(t), t);
  return m;
}

const segs = (path: string): string[] => path.split('/').filter(Boolean);

describe('parseRoute', () => {
  it('gives routes a canonical key without parameter names', () => {
    expect(route('GET /orders/{id}').key).toBe('GET /orders/{}');
    expect(route('GET /orders/{orderId}').key).toBe(route('GET /orders/{id}').key);
    expect(route('GET /').key).toBe('GET /');
    expect(route('WS /ws/orders').method).toBe('WS');
  });

  it.each([
    ['GET', 'route "GET" must be "METHOD /path"'],
    ['FETCH /x', 'route "FETCH /x": unknown method "FETCH" (one of GET POST PUT PATCH DELETE WS)'],
    ['get /x', 'route "get /x": unknown method "get" (one of GET POST PUT PATCH DELETE WS)'],
    ['GET x', 'route "GET x": the path must start with "/"'],
    ['GET /x/', 'route "GET /x/": empty path segment (repeated or trailing "/")'],
    ['GET /x//y', 'route "GET /x//y": empty path segment (repeated or trailing "/")'],
    ['GET /x/../y', 'route "GET /x/../y": dot segment ".."'],
    ['GET /x/{a}/{a}', 'route "GET /x/{a}/{a}": parameter {a} appears twice'],
    ['GET /x/{a b}', 'route "GET /x/{a b}" must be "METHOD /path"'],
    ['GET /x/a{b}', 'route "GET /x/a{b}": segment "a{b}" is neither a literal nor a {name} parameter'],
  ])('refuses %s', (text, message) => {
    expect(parseRoute(text)).toBe(message);
  });
});

describe('RouteMatcher', () => {
  const m = matcherOf(
    'GET /orders',
    'POST /orders',
    'GET /orders/{id}',
    'PUT /orders/{id}',
    'DELETE /orders/{id}',
    'GET /accounts/{id}',
    'GET /accounts/{id}/balance',
    'GET /accounts/me',
    'WS /ws/orders',
  );

  it('matches literal and parameter segments', () => {
    expect(m.match('GET', segs('/orders'))).toMatchObject({ kind: 'match', entry: { value: 'GET /orders' } });
    expect(m.match('GET', segs('/orders/42'))).toMatchObject({ kind: 'match', entry: { value: 'GET /orders/{id}' } });
    expect(m.match('DELETE', segs('/orders/42'))).toMatchObject({
      kind: 'match',
      entry: { value: 'DELETE /orders/{id}' },
    });
  });

  it('lets a literal segment win over a parameter', () => {
    expect(m.match('GET', segs('/accounts/me'))).toMatchObject({ kind: 'match', entry: { value: 'GET /accounts/me' } });
    expect(m.match('GET', segs('/accounts/7'))).toMatchObject({
      kind: 'match',
      entry: { value: 'GET /accounts/{id}' },
    });
  });

  it('falls back to the parameter branch when the literal one has no route for the rest', () => {
    expect(m.match('GET', segs('/accounts/me/balance'))).toMatchObject({
      kind: 'match',
      entry: { value: 'GET /accounts/{id}/balance' },
    });
  });

  it('a parameter takes exactly one segment', () => {
    expect(m.match('GET', segs('/orders/1/2'))).toEqual({ kind: 'not-found' });
    expect(m.match('GET', segs('/accounts'))).toEqual({ kind: 'not-found' });
  });

  it('answers method-not-allowed with every method the path has', () => {
    const allowed = (method: string, path: string) => {
      const result = m.match(method, segs(path));
      if (result.kind !== 'method-not-allowed') return result;
      // The routes the path has, one per allowed method, in the same order.
      expect(result.entries.map((e) => e.route.method)).toEqual(result.allow);
      return { kind: result.kind, allow: result.allow, routes: result.entries.map((e) => e.route.text) };
    };
    expect(allowed('PATCH', '/orders/1')).toEqual({
      kind: 'method-not-allowed',
      allow: ['GET', 'PUT', 'DELETE'],
      routes: ['GET /orders/{id}', 'PUT /orders/{id}', 'DELETE /orders/{id}'],
    });
    expect(allowed('GET', '/ws/orders')).toMatchObject({ kind: 'method-not-allowed', allow: ['WS'] });
    expect(allowed('WS', '/orders')).toMatchObject({ kind: 'method-not-allowed', allow: ['GET', 'POST'] });
  });

  it('is case-sensitive in paths and methods', () => {
    expect(m.match('GET', segs('/Orders'))).toEqual({ kind: 'not-found' });
    expect(m.match('get', segs('/orders'))).toMatchObject({ kind: 'method-not-allowed', allow: ['GET', 'POST'] });
  });

  it('reports the entry already holding a canonical route', () => {
    const matcher = matcherOf('GET /orders/{id}');
    expect(matcher.add(route('GET /orders/{other}'), 'second')?.value).toBe('GET /orders/{id}');
    expect(matcher.add(route('PUT /orders/{other}'), 'third')).toBeUndefined();
  });
});
