/**
 * A route of the limit table: `METHOD /path`, where a `{name}` segment matches exactly one
 * non-empty path segment. Routes are compared by their canonical key, in which parameter
 * names are dropped: `GET /orders/{id}` and `GET /orders/{orderId}` are the same route, so
 * renaming a parameter neither dodges the duplicate check nor loses the row's counters.
 */

export const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'WS'] as const;
export type Method = (typeof METHODS)[number];

export type Segment =
  { readonly kind: 'literal'; readonly value: string } | { readonly kind: 'param'; readonly name: string };

export interface Route {
  readonly method: Method;
  /** The path as written in the table. */
  readonly path: string;
  readonly segments: readonly Segment[];
  /** Canonical identity: method and path with every parameter written `{}`. */
  readonly key: string;
  /** `METHOD /path` as written. */
  readonly text: string;
}

// RFC 3986 §3.3 pchar, without percent-encoding (a table literal is written as it is matched), and
// without ";": the gateway refuses a request path that holds one (limits/normalise.ts), so a row
// with one could never be matched.
const LITERAL_SEGMENT = /^[A-Za-z0-9\-._~!$&'()*+,=:@]+$/;
const PARAM_SEGMENT = /^\{([A-Za-z_][A-Za-z0-9_]*)\}$/;

function isMethod(value: string): value is Method {
  return (METHODS as readonly string[]).includes(value);
}

/** Parses `METHOD /path`; returns the route, or a sentence saying what is wrong with it. */
export function parseRoute(text: string): Route | string {
  const match = /^(\S+) +(\S+)$/.exec(text.trim());
  if (!match) return `route "${text}" must be "METHOD /path"`;
  const [, method = '', path = ''] = match;
  if (!isMethod(method)) return `route "${text}": unknown method "${method}" (one of ${METHODS.join(' ')})`;
  if (!path.startsWith('/')) return `route "${text}": the path must start with "/"`;
  const segments: Segment[] = [];
  if (path !== '/') {
    const parts = path.slice(1).split('/');
    for (const part of parts) {
      if (part === '') return `route "${text}": empty path segment (repeated or trailing "/")`;
      if (part === '.' || part === '..') return `route "${text}": dot segment "${part}"`;
      const param = PARAM_SEGMENT.exec(part);
      if (param) {
        const name = param[1] ?? '';
        if (segments.some((s) => s.kind === 'param' && s.name === name)) {
          return `route "${text}": parameter {${name}} appears twice`;
        }
        segments.push({ kind: 'param', name });
      } else if (part.includes(';')) {
        return `route "${text}": ";" in a path (the gateway refuses every request path that holds one)`;
      } else if (LITERAL_SEGMENT.test(part)) {
        segments.push({ kind: 'literal', value: part });
      } else {
        return `route "${text}": segment "${part}" is neither a literal nor a {name} parameter`;
      }
    }
  }
  const canonicalPath = '/' + segments.map((s) => (s.kind === 'param' ? '{}' : s.value)).join('/');
  return { method, path, segments, key: `${method} ${canonicalPath}`, text: `${method} ${path}` };
}
