/**
 * What a running gateway must close, in the order it was opened. Each start-up step adds its own
 * closer as soon as it has opened something; stopping (or a start-up step that fails) runs them
 * all, the last opened first, so nothing is closed while something opened after it still uses it.
 */
export class Closers {
  readonly #steps: Array<{ readonly name: string; readonly close: () => void | Promise<void> }> = [];

  add(name: string, close: () => void | Promise<void>): void {
    this.#steps.push({ name, close });
  }

  /** Runs every closer, last added first; one that fails does not keep the others from running. */
  async closeAll(onError: (name: string, err: unknown) => void = () => {}): Promise<void> {
    for (const step of this.#steps.splice(0).reverse()) {
      try {
        await step.close();
      } catch (err) {
        onError(step.name, err);
      }
    }
  }

  /** The names of the closers not yet run, in the order they will run (for tests and logs). */
  pending(): string[] {
    return this.#steps.map((s) => s.name).reverse();
  }
}
