import { execFile } from 'node:child_process';
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
