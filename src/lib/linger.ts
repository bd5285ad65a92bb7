import type { Duplex } from 'node:stream';

/**
 * Closing a connection the gateway has answered without keeping it (docs/operations.md "Hostile
 * clients", "Bridges"): the answer goes out, what the client still sends is read and dropped for a
 * moment so that the answer is not lost to a reset (as nginx lingers), and then the connection is
 * destroyed, also when the client never closes its side. The public server is half-open
 * (httpAllowHalfOpen) and a socket Node has handed over for an upgrade has no HTTP timeout left:
 * without the last step such a client would hold its socket for good.
 */

/** How long a connection answered and closed is still read from (and the bytes dropped) before it is destroyed. */
export const LINGER_MS = 2000;

/** Ends `socket` after `last` (if any), reading and dropping what still comes, and destroys it after LINGER_MS. */
export function endAndLinger(socket: Duplex, last?: string | Buffer): void {
  if (last === undefined) socket.end();
  else socket.end(last);
  socket.resume();
  setTimeout(() => socket.destroy(), LINGER_MS).unref();
}
