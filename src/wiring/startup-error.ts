/**
 * Why an instance cannot start: the errors of an invalid table or key file (one per line), or a
 * setting that names what cannot be had (one line naming the variable, README "Running it").
 */
export class StartupError extends Error {
  override name = 'StartupError';
  /**
   * `listener`: a port or address that cannot be had; `setting`: a file a variable names that
   * cannot be read. Either is told in one line of its own.
   */
  readonly reason: 'files' | 'listener' | 'setting';

  constructor(message: string, cause: 'files' | 'listener' | 'setting' = 'files') {
    super(message);
    this.reason = cause;
  }
}
