/** A wrong BENCH_* value or argument: reported in one line, without a stack. */
export class KnobError extends Error {}

/** A benchmark's failure on stderr, in one line for a KnobError, with the stack for any other error; exit code 1. */
export function reportFailure(benchmark: string, err: unknown): void {
  const text = err instanceof KnobError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
  process.stderr.write(`${benchmark} failed: ${text}\n`);
  process.exitCode = 1;
}

/** A whole-number knob from the environment, `fallback` when unset or empty. */
export function intKnob(name: string, fallback: number, min: number, max: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new KnobError(`${name}=${raw}: must be a whole number from ${min} to ${max}`);
  return value;
}
