import { spawn, type ChildProcess } from 'node:child_process';
import { ADMIN_TOKEN } from './gateway.js';
import { uniquePrefix } from './redis.js';

/** What a gateway process says when it serves: one line per process (workers and the primary's admin listener). */
export interface ListeningLine {
  readonly pid: number;
  /** `host:port` of the public listener. */
  readonly public?: string;
  /** `host:port` of the admin listener. */
  readonly admin?: string;
}

/** Everything a child process has written so far, stdout and stderr apart. */
export interface ChildOutput {
  stdout(): string;
  stderr(): string;
}

/** Starts gathering a child's stdout and stderr (both must be pipes). */
export function outputOf(child: ChildProcess): ChildOutput {
  let stdout = '';
  let stderr = '';
  child.stdout?.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr?.on('data', (c: Buffer) => (stderr += c.toString()));
  return { stdout: () => stdout, stderr: () => stderr };
}

/**
 * The "gateway listening" lines of a log so far. Only whole lines are read: the last one may
 * still be arriving.
 */
export function listeningLines(log: string): ListeningLine[] {
  const whole = log.slice(0, log.lastIndexOf('\n') + 1);
  return whole
    .split('\n')
    .filter((l) => l.includes('"msg":"gateway listening"'))
    .map((l) => JSON.parse(l) as ListeningLine);
}

/**
 * Waits until a child's stdout holds `text`, and gives its stdout then. Throws, with everything
 * the child wrote, when it exits or the time is up first.
 */
export async function waitForOutput(
  child: ChildProcess,
  output: ChildOutput,
  text: string,
  timeoutMs = 10_000,
): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  const gone = (): boolean => child.exitCode !== null || child.signalCode !== null;
  while (!output.stdout().includes(text) && !gone() && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 25));
  if (!output.stdout().includes(text))
    throw new Error(
      `the process did not print "${text}"; exit ${child.exitCode ?? child.signalCode ?? 'none yet'}\nstdout:\n${output.stdout()}\nstderr:\n${output.stderr()}`,
    );
  return output.stdout();
}

/** `host:port` as a URL to connect to: a wildcard address is reached on loopback. */
function urlOf(bound: string): string {
  return `http://${bound.replace(/^0\.0\.0\.0:/, '127.0.0.1:').replace(/^\[::\]:/, '[::1]:')}`;
}

/**
 * Waits until a gateway process started with PORT=0 and ADMIN_PORT=0 has said `count` times
 * that it listens, and gives its addresses. Ports the kernel picks at bind time cannot be taken
 * by another test in between, as a port from freePort() can (regression: the WORKERS=2 test
 * found its port taken on a busy CI run and waited for a gateway that never listened).
 * Throws, with everything the process wrote to stdout and stderr, when it exits or the time is
 * up first.
 */
export async function waitForListening(
  child: ChildProcess,
  output: ChildOutput,
  options: { readonly count?: number; readonly timeoutMs?: number } = {},
): Promise<{ readonly url: string; readonly adminUrl: string; readonly lines: ListeningLine[] }> {
  const count = options.count ?? 1;
  const deadline = Date.now() + (options.timeoutMs ?? 20_000);
  const gone = (): boolean => child.exitCode !== null || child.signalCode !== null;
  let lines = listeningLines(output.stdout());
  while (lines.length < count && !gone() && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 25));
    lines = listeningLines(output.stdout());
  }
  const publicAt = lines.find((l) => l.public)?.public;
  const adminAt = lines.find((l) => l.admin)?.admin;
  if (lines.length < count || !publicAt || !adminAt) {
    // 'exit' can come before the pipes are drained: wait (briefly) for 'close' to show it all.
    if (gone())
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, 2000);
        child.once('close', () => {
          clearTimeout(timer);
          resolve(undefined);
        });
      });
    throw new Error(
      `the gateway did not say it listens (${lines.length} of ${count} lines); ` +
        `exit ${child.exitCode ?? child.signalCode ?? 'none yet'}\nstdout:\n${output.stdout()}\nstderr:\n${output.stderr()}`,
    );
  }
  return { url: urlOf(publicAt), adminUrl: urlOf(adminAt), lines };
}

/**
 * `node dist/main.js` with `WORKERS=2` in `dir` (its limits.yaml), on loopback ports of its own,
 * both bridges at `bridgeUrl`, counting in `redisUrl` under a prefix of its own; `env` on top.
 */
export function spawnWorkersGateway(options: {
  readonly dir: string;
  readonly bridgeUrl: string;
  readonly redisUrl: string;
  readonly label: string;
  readonly env?: Record<string, string>;
}): ChildProcess {
  return spawn(process.execPath, [new URL('../../dist/main.js', import.meta.url).pathname], {
    cwd: options.dir,
    env: {
      PATH: process.env.PATH,
      WORKERS: '2',
      PORT: '0',
      HOST: '127.0.0.1',
      ADMIN_PORT: '0',
      ADMIN_TOKEN,
      EQT_BRIDGE_URL: options.bridgeUrl,
      FNO_BRIDGE_URL: options.bridgeUrl,
      REDIS_URL: options.redisUrl,
      REDIS_KEY_PREFIX: uniquePrefix(options.label),
      API_KEY_MODE: 'any',
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}
