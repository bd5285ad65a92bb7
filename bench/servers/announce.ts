import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * Child servers of the benchmark listen on a port the kernel picks (no race for a "free"
 * port) and tell the parent which one over the IPC channel `fork()` opened.
 */
export function listenAndAnnounce(server: Server): void {
  server.listen(0, '127.0.0.1', () => {
    const { port } = server.address() as AddressInfo;
    process.send?.({ port });
  });
  // The parent going away (even by SIGKILL) closes the IPC channel: never outlive it.
  process.on('disconnect', () => process.exit(0));
  // Stopped by the parent: a normal exit, so that a process under `--cpu-prof` writes its profile.
  process.once('SIGTERM', () => process.exit(0));
}
