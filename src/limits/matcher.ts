import { METHODS, type Method, type Route } from './route.js';

/**
 * Matches a normalised path against the routes of the table. A literal segment wins over a
 * `{name}` segment at the first place where they differ; when the literal branch has no
 * route for the rest of the path, the parameter branch is tried (so adding a literal route
 * never hides a parameter route for other paths).
 */

export interface RouteEntry<T> {
  readonly route: Route;
  readonly value: T;
}

export type MatchResult<T> =
  | { readonly kind: 'match'; readonly entry: RouteEntry<T> }
  /** `entries`: the routes the path has, for other methods, in METHODS order. */
  | {
      readonly kind: 'method-not-allowed';
      readonly allow: readonly Method[];
      readonly entries: readonly RouteEntry<T>[];
    }
  | { readonly kind: 'not-found' };

class Node<T> {
  readonly literals = new Map<string, Node<T>>();
  param: Node<T> | undefined;
  methods: Map<Method, RouteEntry<T>> | undefined;
}

const NOT_FOUND = { kind: 'not-found' } as const;

export class RouteMatcher<T> {
  readonly #root = new Node<T>();

  /** Adds a route; returns the entry already holding the same canonical route, if any. */
  add(route: Route, value: T): RouteEntry<T> | undefined {
    let node = this.#root;
    for (const segment of route.segments) {
      if (segment.kind === 'literal') {
        let next = node.literals.get(segment.value);
        if (!next) node.literals.set(segment.value, (next = new Node<T>()));
        node = next;
      } else {
        node = node.param ??= new Node<T>();
      }
    }
    node.methods ??= new Map();
    const existing = node.methods.get(route.method);
    if (existing) return existing;
    node.methods.set(route.method, { route, value });
    return undefined;
  }

  match(method: string, segments: readonly string[]): MatchResult<T> {
    const entry = this.#find(this.#root, segments, 0, method);
    if (entry) return { kind: 'match', entry };
    const found = new Map<Method, RouteEntry<T>>();
    this.#collectEntries(this.#root, segments, 0, found);
    if (found.size === 0) return NOT_FOUND;
    const allow = METHODS.filter((m) => found.has(m));
    return { kind: 'method-not-allowed', allow, entries: allow.map((m) => found.get(m) as RouteEntry<T>) };
  }

  #find(node: Node<T>, segments: readonly string[], depth: number, method: string): RouteEntry<T> | undefined {
    if (depth === segments.length) return node.methods?.get(method as Method);
    const segment = segments[depth] as string;
    const literal = node.literals.get(segment);
    if (literal) {
      const found = this.#find(literal, segments, depth + 1, method);
      if (found) return found;
    }
    return node.param ? this.#find(node.param, segments, depth + 1, method) : undefined;
  }

  /** The routes of every method the path has, a literal route before a parameter one (as #find prefers it). */
  #collectEntries(node: Node<T>, segments: readonly string[], depth: number, into: Map<Method, RouteEntry<T>>): void {
    if (depth === segments.length) {
      for (const [m, entry] of node.methods ?? []) if (!into.has(m)) into.set(m, entry);
      return;
    }
    const literal = node.literals.get(segments[depth] as string);
    if (literal) this.#collectEntries(literal, segments, depth + 1, into);
    if (node.param) this.#collectEntries(node.param, segments, depth + 1, into);
  }
}
