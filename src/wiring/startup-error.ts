/**
 * Why an instance cannot start: the errors of an invalid table or key file (one per line), or a
 * listener that cannot have its port or address (one line naming the variable, README "Running it").
 */
export class StartupError extends Error {
  override name = 'StartupError';
  /** `listener`: a port or address that cannot be had, told in one line of its own. */
  readonly reason: 'files' | 'listener';

  constructor(message: string, cause: 'files' | 'listener' = 'files') {
    super(message);
    this.reason = cause;
  }
}
