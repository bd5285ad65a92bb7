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
 * An error thrown or rejected after the first step becomes `unexpected`'s answer, which the first
 * step's `next()` gives, so that the first step (the access log) sees every request's answer; an
 * error in the first step itself reaches the app's `onError` through hono.
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
  const run = (c: StepContext, i: number): Response | Promise<Response> =>
    (steps[i] as Step)(c, i === last ? none : () => asPromise(run(c, i + 1)));
  const afterFirst = (c: StepContext): Promise<Response> => {
    let answer: Response | Promise<Response>;
    try {
      answer = run(c, 1);
    } catch (err) {
      return Promise.resolve(unexpected(err, c));
    }
    return asPromise(answer).catch((err: unknown) => unexpected(err, c));
  };
  const first = steps[0];
  if (last === 0)
    return function chained(c) {
      return first(c, none);
    };
  return function chained(c) {
    return first(c, () => afterFirst(c));
  };
}

function asPromise(answer: Response | Promise<Response>): Promise<Response> {
  return answer instanceof Promise ? answer : Promise.resolve(answer);
}
