// The forwarder loads only undici's Pool: the package index also loads fetch, WebSocket,
// EventSource, the caches and mock agents and more (about 1.1 MB of source), 3.7–7 MB of RSS the
// gateway never uses (docs/performance.md "What was changed"). The index's `Pool` is this same
// class, but the index also adds its helper methods (request, stream, pipeline, connect, upgrade)
// to every dispatcher: without it they are missing, so the type leaves them out and only
// `dispatch` and the lifecycle methods compile. test/unit/partial-imports.test.ts pins both.
declare module 'undici/lib/dispatcher/pool.js' {
  import type { Pool as IndexPool } from 'undici';

  type Pool = Omit<IndexPool, 'request' | 'stream' | 'pipeline' | 'connect' | 'upgrade'>;
  const Pool: new (...args: ConstructorParameters<typeof IndexPool>) => Pool;
  export default Pool;
}

// The pool's connections: a bridge's pool makes its own (proxy/forwarder.ts, BridgeClient). The
// same class as the index's `Client`, without its helper methods, for the reason above; `dispatch`
// is declared as the method it is, which a subclass may override.
declare module 'undici/lib/dispatcher/client.js' {
  import type { Dispatcher, Client as IndexClient } from 'undici';

  interface Client extends Omit<IndexClient, 'request' | 'stream' | 'pipeline' | 'connect' | 'upgrade' | 'dispatch'> {
    dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean;
  }
  const Client: new (...args: ConstructorParameters<typeof IndexClient>) => Client;
  export default Client;
}
