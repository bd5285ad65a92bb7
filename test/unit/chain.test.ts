import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { chain, type Step, type Unexpected } from '../../src/server/chain.js';
import type { GatewayEnv } from '../../src/server/context.js';

/** An app whose one route is the chain; what the first step saw of each answer is kept in `seen`. */
function appOf(...later: Step[]): { app: Hono<GatewayEnv>; seen: number[]; errors: string[] } {
  const seen: number[] = [];
  const errors: string[] = [];
  const unexpected: Unexpected = (err, c) => {
    errors.push(`chain: ${(err as Error).message}`);
    return c.text('unexpected', 500);
  };
  const first: Step = (_c, next) =>
    next().then((response) => {
      seen.push(response.status);
      return response;
    });
  const app = new Hono<GatewayEnv>();
  app.all('*', chain(unexpected, first, ...later));
  app.onError((err, c) => {
    errors.push(`onError: ${err.message}`);
    return c.text('onError', 500);
  });
  return { app, seen, errors };
}

const passOn =
  (order: string[], name: string): Step =>
  (_c, next) => {
    order.push(name);
    return next();
  };

describe('chain', () => {
  it('runs the steps in order, and each gets the answer of the steps after it', async () => {
    const order: string[] = [];
    const { app, seen } = appOf(passOn(order, 'a'), passOn(order, 'b'), (c) => {
      order.push('last');
      return c.text('done', 201);
    });
    const res = await app.request('/x');
    expect(res.status).toBe(201);
    expect(await res.text()).toBe('done');
    expect(order).toEqual(['a', 'b', 'last']);
    expect(seen).toEqual([201]);
  });

  it('stops at a step that answers: the steps after it never run', async () => {
    const order: string[] = [];
    const { app, seen } = appOf(
      (c) => {
        order.push('answers');
        return Promise.resolve(c.text('no', 429));
      },
      passOn(order, 'never'),
      (c) => c.text('never', 200),
    );
    const res = await app.request('/x');
    expect(res.status).toBe(429);
    expect(order).toEqual(['answers']);
    expect(seen).toEqual([429]);
  });

  it('turns a later step that throws into the unexpected answer, which the first step sees', async () => {
    const { app, seen, errors } = appOf(
      () => {
        throw new Error('thrown');
      },
      (c) => c.text('never', 200),
    );
    const res = await app.request('/x');
    expect(res.status).toBe(500);
    expect(await res.text()).toBe('unexpected');
    expect(seen).toEqual([500]);
    expect(errors).toEqual(['chain: thrown']);
  });

  it('turns a rejected step after a wait into the unexpected answer, which the first step sees', async () => {
    const { app, seen, errors } = appOf(
      (_c, next) => new Promise((resolve) => setImmediate(resolve)).then(() => next()),
      () => Promise.reject(new Error('rejected')),
    );
    const res = await app.request('/x');
    expect(res.status).toBe(500);
    expect(seen).toEqual([500]);
    expect(errors).toEqual(['chain: rejected']);
  });

  it('turns a throw two steps deep into the unexpected answer, which the first step sees', async () => {
    const order: string[] = [];
    const { app, seen, errors } = appOf(passOn(order, 'a'), () => {
      throw new Error('deep');
    });
    const res = await app.request('/x');
    expect(res.status).toBe(500);
    expect(order).toEqual(['a']);
    expect(seen).toEqual([500]);
    expect(errors).toEqual(['chain: deep']);
  });

  it("gives a step a rejected next() when a step after it throws at once, so the step's own catch sees it", async () => {
    const { app, seen, errors } = appOf(
      (c, next) => next().catch(() => c.text('caught', 418)),
      () => {
        throw new Error('at once');
      },
    );
    const res = await app.request('/x');
    expect(res.status).toBe(418);
    expect(seen).toEqual([418]);
    expect(errors).toEqual([]);
  });

  it('refuses a second next() from one step: the steps after it run once', async () => {
    let runs = 0;
    let second: unknown;
    const { app, seen } = appOf(
      (_c, next) =>
        next().then((response) =>
          next().then(
            () => response,
            (err: unknown) => {
              second = err;
              return response;
            },
          ),
        ),
      (c) => {
        runs++;
        return c.text('once', 200);
      },
    );
    const res = await app.request('/x');
    expect(res.status).toBe(200);
    expect(runs).toBe(1);
    expect(seen).toEqual([200]);
    expect((second as Error).message).toBe('next() called twice by one step');
  });

  it("leaves an error of the first step, thrown or rejected, to the app's onError", async () => {
    for (const first of [
      (): Response => {
        throw new Error('first');
      },
      (): Promise<Response> => Promise.reject(new Error('first')),
    ]) {
      const app = new Hono<GatewayEnv>();
      app.all(
        '*',
        chain(
          (_err, c) => c.text('unexpected', 500),
          first,
          (c) => c.text('never', 200),
        ),
      );
      app.onError((err, c) => c.text(`onError: ${err.message}`, 500));
      const res = await app.request('/x');
      expect(await res.text()).toBe('onError: first');
    }
  });

  it("leaves a failure of the unexpected answer itself to the app's onError", async () => {
    const app = new Hono<GatewayEnv>();
    const seen: string[] = [];
    app.all(
      '*',
      chain(
        () => {
          throw new Error('unexpected failed');
        },
        (_c, next) =>
          next().then((response) => {
            seen.push('answered');
            return response;
          }),
        () => Promise.reject(new Error('step')),
      ),
    );
    app.onError((err, c) => c.text(`onError: ${err.message}`, 500));
    const res = await app.request('/x');
    expect(await res.text()).toBe('onError: unexpected failed');
    expect(seen).toEqual([]);
  });

  it('refuses a next() from the last step rather than answering nothing', async () => {
    const { app, seen, errors } = appOf((_c, next) => next());
    const res = await app.request('/x');
    expect(res.status).toBe(500);
    expect(seen).toEqual([500]);
    expect(errors).toEqual(['chain: the last step of the chain has no next step']);
  });

  it("a chain of one step: its answer is the app's, and it has no next step", async () => {
    const app = new Hono<GatewayEnv>();
    app.all(
      '*',
      chain(
        (_err, c) => c.text('unexpected', 500),
        (c, next) => (c.req.path === '/next' ? next() : c.text('only', 202)),
      ),
    );
    app.onError((err, c) => c.text(`onError: ${err.message}`, 500));
    const res = await app.request('/x');
    expect(res.status).toBe(202);
    expect(await res.text()).toBe('only');
    expect(await (await app.request('/next')).text()).toBe('onError: the last step of the chain has no next step');
  });
});
