import type { ChildProcess } from 'node:child_process';

/** What a gateway process says when it serves: one line per process (workers and the primary's admin listener). */
export interface ListeningLine {
  readonly pid: number;
  /** `host:port` of the public listener. */
  readonly public?: string;
  /** `host:port` of the admin listener. */
  readonly admin?: string;
}

/** The "gateway listening" lines of a log so far. */
export function listeningLines(log: string): ListeningLine[] {
  return log
    .split('\n')
    .filter((l) => l.includes('"msg":"gateway listening"'))
    .map((l) => JSON.parse(l) as ListeningLine);
}

/**
 * Waits until a gateway process started with PORT=0 and ADMIN_PORT=0 has said `count` times
 * that it listens, and gives its addresses. Ports the kernel picks at bind time cannot be taken
 * by another test in between, as a port from freePort() can (regression: the WORKERS=2 test
 * found its port taken on a busy CI run and waited for a gateway that never listened).
 * Throws, with everything the process printed, when it exits or the time is up first.
 */
export async function waitForListening(
  child: ChildProcess,
  log: () => string,
  options: { readonly count?: number; readonly timeoutMs?: number } = {},
): Promise<{ readonly url: string; readonly adminUrl: string; readonly lines: ListeningLine[] }> {
  const count = options.count ?? 1;
  const deadline = Date.now() + (options.timeoutMs ?? 20_000);
  let lines = listeningLines(log());
  while (lines.length < count && child.exitCode === null && child.signalCode === null && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 25));
    lines = listeningLines(log());
  }
  const publicAt = lines.find((l) => l.public)?.public;
  const adminAt = lines.find((l) => l.admin)?.admin;
  if (lines.length < count || !publicAt || !adminAt)
    throw new Error(`the gateway did not say it listens (${lines.length} of ${count} lines); it printed:\n${log()}`);
  return { url: `http://${publicAt}`, adminUrl: `http://${adminAt}`, lines };
}
