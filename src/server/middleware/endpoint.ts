import type { LimitTable } from '../../limits/limit-table.js';
import { bridgeFor, type Settings } from '../../config/settings.js';
import { normaliseTarget } from '../../limits/normalise.js';
import { answer } from '../answers.js';
import type { Step } from '../chain.js';

/**
 * Step 2 of README "A request, step by step": normalise the path and find its row in the table snapshot in force,
 * which the request then keeps to its end. A WebSocket upgrade matches as method `WS`.
 */

export interface EndpointOptions {
  readonly table: () => LimitTable | undefined;
  readonly routing: Pick<Settings, 'routing'>;
}

export function matchEndpoint(options: EndpointOptions): Step {
  // Not async: a request that matches goes straight on, without a promise of its own.
  return function matchEndpoint(c, next) {
    const table = options.table();
    if (!table) return answer(c, 'internal', 503, 'Limit table not loaded');
    const target = normaliseTarget(c.env?.incoming?.url ?? pathAndQuery(c.req.url));
    if (!target.ok) return answer(c, 'bad-path', 400, target.reason);

    const method = c.env?.upgrade ? 'WS' : c.req.method;
    const match = table.matcher.match(method, target.segments);
    if (match.kind === 'not-found') return answer(c, 'no-route', 404, 'No such endpoint');
    if (match.kind === 'method-not-allowed') {
      // Labelled with the path's first row in the table, not as "unmatched": the path is one of the table's.
      c.set(
        'pathRow',
        match.entries.map((e) => e.value).reduce((a, b) => (b.index < a.index ? b : a)),
      );
      const allow = match.allow.filter((m) => m !== 'WS');
      if (allow.length === 0) {
        // RFC 9110 §15.5.22: the resource needs an upgrade to another protocol.
        return answer(c, 'not-websocket', 426, 'This endpoint is a WebSocket: connect with Upgrade: websocket', [
          ['Upgrade', 'websocket'],
          ['Connection', 'Upgrade'],
        ]);
      }
      return answer(c, 'method', 405, 'Method not allowed for this endpoint', [['Allow', allow.join(', ')]]);
    }
    const { route, value: row } = match.entry;
    c.set('table', table);
    c.set('endpoint', {
      row,
      route,
      bridge: bridgeFor(options.routing, route),
      path: target.path,
      query: target.query,
    });
    return next();
  };
}

function pathAndQuery(url: string): string {
  const start = url.indexOf('/', url.indexOf('//') + 2);
  return start === -1 ? '/' : url.slice(start);
}
