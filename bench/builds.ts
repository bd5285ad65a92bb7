import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileNameOf } from './ab-stats.js';
import { KnobError } from './knobs.js';
import { REPO_ROOT } from './processes.js';

/**
 * The main.js of a git ref's build, for the benchmarks that compare builds (`npm run bench:ab`,
 * `npm run bench:instructions`): `.` is this checkout's dist/ (built by the npm script). Builds go
 * to .bench/builds/<position>-<ref>, so that two refs never share a directory, and resolve their
 * packages from this checkout's node_modules (.bench/ lies inside it).
 */
export function buildOf(ref: string, position: number): string {
  if (ref === '.') return join(REPO_ROOT, 'dist', 'main.js');
  try {
    execFileSync('git', ['rev-parse', '--verify', '--quiet', `${ref}^{commit}`], { cwd: REPO_ROOT, stdio: 'ignore' });
  } catch {
    throw new KnobError(`${ref}: not a git commit, branch or tag (a node flag's value goes after "=": --flag=value)`);
  }
  const dir = join(REPO_ROOT, '.bench', 'builds', `${position + 1}-${fileNameOf(ref)}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const files = ['src', 'package.json', 'tsconfig.json', 'tsconfig.build.json'];
  const tar = execFileSync('git', ['archive', '--format=tar', ref, ...files], { cwd: REPO_ROOT, maxBuffer: 1 << 28 });
  execFileSync('tar', ['-x', '-C', dir], { input: tar });
  execFileSync(
    process.execPath,
    [join(REPO_ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', dir + '/tsconfig.build.json'],
    { stdio: 'inherit' },
  );
  return join(dir, 'dist', 'main.js');
}
