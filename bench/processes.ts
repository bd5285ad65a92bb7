import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/**
 * The processes of a benchmark run — Redis, the upstream, the bare proxy, the gateway — and
 * what /proc says about them. Every child is registered so that one call stops them all, by
 * PID, whatever happened before.
 */

export const REPO_ROOT = fileURLToPath(new URL('..', import.meta.url));

export interface Child {
  readonly name: string;
  readonly pid: number;
  readonly process: ChildProcess;
  /** The last few KB of its stderr, for error messages. */
  stderrTail(): string;
}

const children: Child[] = [];

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

function register(name: string, child: ChildProcess): Child {
  if (child.pid === undefined) throw new Error(`${name} did not start`);
  let tail = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (chunk: string) => {
    tail = (tail + chunk).slice(-8192);
  });
  const entry: Child = { name, pid: child.pid, process: child, stderrTail: () => tail };
  children.push(entry);
  return entry;
}

export function isRunning(child: Child): boolean {
  return child.process.exitCode === null && child.process.signalCode === null;
}

function exited(child: Child, timeoutMs: number): Promise<boolean> {
  if (!isRunning(child)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    child.process.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** SIGTERM, then SIGKILL if it has not gone within `graceMs`. */
export async function stopChild(child: Child, graceMs = 5000): Promise<void> {
  if (!isRunning(child)) return;
  process.kill(child.pid, 'SIGTERM');
  if (await exited(child, graceMs)) return;
  process.kill(child.pid, 'SIGKILL');
  await exited(child, 2000);
}

/** Stops every child started so far, the most recent first. */
export async function stopAllChildren(): Promise<void> {
  for (const child of [...children].reverse()) {
    await stopChild(child).catch(() => {});
  }
}

/** Last resort on process exit: nothing may outlive the benchmark. */
export function killAllChildrenNow(): void {
  for (const child of children) {
    if (isRunning(child)) {
      try {
        process.kill(child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}

/**
 * Ctrl-C or a SIGTERM stops every child (`cleanUp`) before the benchmark exits. A signal can come
 * twice (a terminal sends SIGINT to tsx and to the script it runs, and tsx passes its own on): the
 * later ones are ignored rather than ending the process before its children are stopped.
 */
export function stopChildrenOnSignal(name: string, cleanUp: () => Promise<void> = stopAllChildren): void {
  let stopping = false;
  const interrupt = (signal: NodeJS.Signals): void => {
    if (stopping) return;
    stopping = true;
    process.stderr.write(`\n${signal}: stopping every process ${name} started\n`);
    void cleanUp().finally(() => process.exit(130));
  };
  process.on('SIGINT', interrupt);
  process.on('SIGTERM', interrupt);
}

async function waitFor(what: string, check: () => Promise<boolean>, child: Child, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!isRunning(child))
      throw new Error(`${what} exited during start-up (code ${child.process.exitCode}):\n${child.stderrTail()}`);
    if (await check().catch(() => false)) return;
    await sleep(100);
  }
  throw new Error(`${what} not ready after ${timeoutMs} ms:\n${child.stderrTail()}`);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** A throw-away Redis: loopback only, no persistence; `launcher` puts e.g. valgrind in front of it. */
export async function startRedis(dir: string, launcher?: Launcher): Promise<{ child: Child; url: string }> {
  const port = await freePort();
  const args = [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--save',
    '',
    '--appendonly',
    'no',
    '--dir',
    dir,
    '--daemonize',
    'no',
    '--loglevel',
    'warning',
  ];
  const [command, before] = launcher ? [launcher.command, launcher.args] : ['redis-server', []];
  const child = register('redis-server', spawn(command, [...before, ...args], { stdio: ['ignore', 'ignore', 'pipe'] }));
  await waitFor('redis-server', () => canConnect(port), child, launcher?.startTimeoutMs ?? 5000);
  return { child, url: `redis://127.0.0.1:${port}` };
}

/**
 * bench/servers/*.ts compiled to plain JavaScript in `.bench/servers/` of the repository: the
 * servers then run on plain `node` like the gateway does, without a TypeScript loader in the process
 * (tsx would add some 35 MB of RSS and a loader thread to the baseline), and their imports of
 * packages resolve to the repository's node_modules. An import of `../../src/…` becomes the built
 * `../../dist/…`. Returns the directory.
 */
export function compileServers(): string {
  const source = fileURLToPath(new URL('./servers/', import.meta.url));
  const out = join(REPO_ROOT, '.bench', 'servers');
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, 'package.json'), '{"type":"module"}\n');
  for (const file of readdirSync(source).filter((f) => f.endsWith('.ts'))) {
    const { outputText } = ts.transpileModule(readFileSync(join(source, file), 'utf8'), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: true },
      fileName: file,
    });
    writeFileSync(join(out, file.replace(/\.ts$/, '.js')), outputText.replaceAll("'../../src/", "'../../dist/"));
  }
  return out;
}

/**
 * What starts a child: node itself, or a program in front of it (valgrind, for `npm run
 * bench:instructions`) whose arguments end with node's path. Node's flags and the script follow `args`.
 */
export interface Launcher {
  readonly command: string;
  readonly args: readonly string[];
  /** How long the child may take to start listening. */
  readonly startTimeoutMs: number;
}

export const PLAIN_NODE: Launcher = { command: process.execPath, args: [], startTimeoutMs: 15_000 };

/**
 * One of the compiled bench/servers in a Node process of its own; resolves with the port it listens on.
 * `nodeArgs` go to node before the script (the CPU profiler's flags with BENCH_PROFILE=1).
 */
export async function forkServer(
  name: string,
  serversDir: string,
  file: string,
  args: string[] = [],
  nodeArgs: string[] = [],
  launcher: Launcher = PLAIN_NODE,
): Promise<{ child: Child; url: string }> {
  const path = join(serversDir, file);
  // fork() runs `execPath ...execArgv path ...args`, with the IPC channel the port is announced on.
  const child = register(
    name,
    fork(path, args, {
      cwd: serversDir,
      execPath: launcher.command,
      execArgv: [...launcher.args, ...nodeArgs],
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
    }),
  );
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${name} did not announce its port:\n${child.stderrTail()}`)),
      launcher.startTimeoutMs,
    );
    child.process.once('message', (message: { port?: number }) => {
      clearTimeout(timer);
      if (typeof message.port === 'number') resolve(message.port);
      else reject(new Error(`${name}: unexpected message ${JSON.stringify(message)}`));
    });
    child.process.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited during start-up (code ${code}):\n${child.stderrTail()}`));
    });
  });
  return { child, url: `http://127.0.0.1:${port}` };
}

export interface GatewayProcess {
  readonly child: Child;
  readonly url: string;
  readonly adminUrl: string;
}

export interface GatewayOptions {
  /** Go to node before the script (the CPU profiler's flags with BENCH_PROFILE=1). */
  readonly nodeArgs?: readonly string[];
  readonly name?: string;
  /** Another build's main.js (`npm run bench:ab`); dist/main.js by default. */
  readonly entry?: string;
  readonly launcher?: Launcher;
  /** Where ports come from (a test gives taken ones). */
  readonly drawPort?: () => Promise<number>;
}

/**
 * The built gateway (`node dist/main.js`) with a clean environment: only what is set here,
 * so nothing from the caller's shell (a REDIS_URL, WORKERS, GATEWAY_CONFIG…) changes what is
 * measured. Its log goes to /dev/null; stderr is kept for error messages.
 */
export async function startGateway(env: Record<string, string>, options: GatewayOptions = {}): Promise<GatewayProcess> {
  const {
    nodeArgs = [],
    name = 'gateway',
    entry = 'dist/main.js',
    launcher = PLAIN_NODE,
    drawPort = freePort,
  } = options;
  // A port drawn free can be taken by another process before the gateway binds it (the gateway's
  // log, which would name the ports of PORT=0, goes to /dev/null here): then new ones are drawn.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startGatewayOn([await drawPort(), await drawPort()], env, nodeArgs, name, entry, launcher);
    } catch (err) {
      if (attempt >= PORT_ATTEMPTS || !(err instanceof Error) || !err.message.includes(PORT_TAKEN)) throw err;
    }
  }
}

/** How often startGateway draws ports before it gives up. */
const PORT_ATTEMPTS = 3;
/** What the gateway prints when a port is taken (src/wiring/servers.ts). */
const PORT_TAKEN = 'the port is already in use';

async function startGatewayOn(
  [port, adminPort]: [number, number],
  env: Record<string, string>,
  nodeArgs: readonly string[],
  name: string,
  entry: string,
  launcher: Launcher,
): Promise<GatewayProcess> {
  const fullEnv: Record<string, string> = {
    PATH: process.env.PATH ?? '/usr/bin:/bin',
    HOME: process.env.HOME ?? '/tmp',
    ...env,
    HOST: '127.0.0.1',
    PORT: String(port),
    ADMIN_HOST: '127.0.0.1',
    ADMIN_PORT: String(adminPort),
  };
  const child = register(
    name,
    spawn(launcher.command, [...launcher.args, ...nodeArgs, entry], {
      cwd: REPO_ROOT,
      env: fullEnv,
      stdio: ['ignore', 'ignore', 'pipe'],
    }),
  );
  const adminUrl = `http://127.0.0.1:${adminPort}`;
  const timeoutMs = launcher.startTimeoutMs;
  await waitFor(name, async () => (await fetch(`${adminUrl}/readyz`)).status === 200, child, timeoutMs);
  // With WORKERS=n the admin listener (the primary) is ready before the workers serve the public port.
  const workers = Number(env.WORKERS ?? 1);
  await waitFor(
    `${name}'s public port`,
    async () => (workers === 1 || processTree(child.pid).length > workers) && (await canConnect(port)),
    child,
    timeoutMs,
  );
  return { child, url: `http://127.0.0.1:${port}`, adminUrl };
}

/** Clock ticks per second of utime/stime in /proc/<pid>/stat. */
export function clockTicksPerSecond(): number {
  try {
    const value = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());
    return Number.isFinite(value) && value > 0 ? value : 100;
  } catch {
    return 100;
  }
}

/** Fields 3 and later of /proc/<pid>/stat (the command name, field 2, may contain spaces). */
function statFields(pid: number): string[] {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** utime + stime of a process, in clock ticks. */
export function cpuTicks(pid: number): number {
  // Fields 14 and 15 of proc(5), counted from field 3 here.
  const fields = statFields(pid);
  return Number(fields[11]) + Number(fields[12]);
}

/** The process and its children (a WORKERS=n gateway: the primary and its workers). */
export function processTree(pid: number): number[] {
  const children: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      // Field 4 of proc(5), the parent's PID.
      if (Number(statFields(Number(entry))[1]) === pid) children.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return [pid, ...children];
}

/** utime + stime of a process and its children, in clock ticks. */
export function treeCpuTicks(pids: readonly number[]): number {
  let ticks = 0;
  for (const pid of pids) ticks += cpuTicks(pid);
  return ticks;
}

function statusField(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
  return match ? Number(match[1]) / 1024 : Number.NaN;
}

/** Peak resident set size (VmHWM) of a process, in MB. */
export function peakRssMB(pid: number): number {
  return statusField(pid, 'VmHWM');
}

/** Resident set size now (VmRSS) of a process, in MB. */
export function rssMB(pid: number): number {
  return statusField(pid, 'VmRSS');
}
