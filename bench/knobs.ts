/** A wrong BENCH_* value or argument: reported in one line, without a stack. */
export class KnobError extends Error {}

/** What a benchmark prints when it fails: a KnobError's message alone, any other error's stack. */
export function failureText(err: unknown): string {
  return err instanceof KnobError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
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
