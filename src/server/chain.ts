import type { Context, Handler } from 'hono';
import type { GatewayEnv } from './context.js';

/**
 * The public steps of README "A request, step by step", run in order as one hono handler.
 *
 * hono's compose gives every middleware an async frame of its own: a promise and a resumption per
 * step, nine per request here, whether the step waits for anything or not. A route with a single
 * handler hono calls directly, so the steps are chained here instead (docs/performance.md, change
 * 12). The contract is simpler than hono's: a step answers by returning its Response, or returns
 * what `next()` gives, which is the answer of the steps after it. No step reads or sets `c.res`: a
 * step that wants the answer (the access log) takes it from `next()`.
 *
 * Errors: `next()` never throws; a step after it that throws or is rejected makes it rejected, as
 * hono's would be. After the first step, such an error becomes `unexpected`'s answer, which the
 * first step's `next()` gives, so that the first step (the access log) sees every request's
 * answer. An error of the first step itself, or of `unexpected`, is a rejection that hono hands to
 * the app's `onError`. A second `next()` from one step is refused: it would count and forward the
 * request twice.
 */

/** A request's context as hono gives it to a handler of any path. */
export type StepContext = Context<GatewayEnv, string>;

/** The answer of the steps after this one. */
export type Next = () => Promise<Response>;

/** One step: its own answer, or `next()`'s. */
export type Step = (c: StepContext, next: Next) => Response | Promise<Response>;

/** The answer to a request whose step failed. */
export type Unexpected = (err: unknown, c: StepContext) => Response;

export function chain(unexpected: Unexpected, ...steps: readonly [Step, ...Step[]]): Handler<GatewayEnv, string> {
  const last = steps.length - 1;
  const none: Next = () => Promise.reject(new Error('the last step of the chain has no next step'));
  /** Step i with its `next`; a throw becomes a rejection. */
  const run = (c: StepContext, i: number, next: Next): Promise<Response> => {
    try {
      const answer = (steps[i] as Step)(c, next);
      return answer instanceof Promise ? answer : Promise.resolve(answer);
    } catch (err) {
      // eslint-disable-next-line @typescript-eslint/prefer-promise-reject-errors -- passed on as thrown, as hono's compose does
      return Promise.reject(err);
    }
  };
  /** The `next` that runs step i (made when the step before it is run); `boundary`: the first step's. */
  const nextOf = (c: StepContext, i: number, boundary: boolean): Next => {
    if (i > last) return none;
    let called = false;
    return () => {
      if (called) return Promise.reject(new Error('next() called twice by one step'));
      called = true;
      const answer = run(c, i, nextOf(c, i + 1, false));
      return boundary ? answer.catch((err: unknown) => unexpected(err, c)) : answer;
    };
  };
  return function chained(c) {
    return run(c, 0, nextOf(c, 1, true));
  };
}
