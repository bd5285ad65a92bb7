import { execFile, spawn } from 'node:child_process';
import { promisify } from 'node:util';

/** The repository root, where `npx oapi-gateway` is run. */
export const ROOT = new URL('../../', import.meta.url).pathname;
/** What the package's `bin` entry runs: `npx oapi-gateway …` is `node dist/cli.js …`. */
export const CLI = new URL('../../dist/cli.js', import.meta.url).pathname;

const execFileAsync = promisify(execFile);

/** Runs `oapi-gateway ARGS` as the built CLI; rejects (with code, stdout, stderr) on a non-zero exit. */
export function runCli(args: readonly string[], options: { cwd?: string; env?: NodeJS.ProcessEnv } = {}) {
  return execFileAsync(process.execPath, [CLI, ...args], { cwd: options.cwd ?? ROOT, env: options.env ?? process.env });
}

/** Runs `oapi-gateway ARGS` with `input` on its standard input; resolves with its exit code and output. */
export function runCliWithInput(
  args: readonly string[],
  input: string | readonly Buffer[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    if (typeof input === 'string') child.stdin.end(input);
    else {
      // Parts written 600 ms apart reach the child as separate reads (once it has started: it takes ~150 ms).
      const [first, ...rest] = input;
      child.stdin.write(first ?? Buffer.alloc(0));
      setTimeout(() => child.stdin.end(Buffer.concat(rest)), 600);
    }
  });
}
