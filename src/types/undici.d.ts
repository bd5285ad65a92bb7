// The forwarder loads only undici's Pool: the package index also loads fetch, WebSocket,
// EventSource, the cache and mock agents and more (about 1.1 MB of source), some 7 MB of memory
// the gateway never uses (docs/performance.md "Memory"). The index's `Pool` is this same class;
// a unit test pins that.
declare module 'undici/lib/dispatcher/pool.js' {
  import { Pool } from 'undici';
  export default Pool;
}
