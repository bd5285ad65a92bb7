import { Hono } from 'hono';
import type { AdminDeps } from './app.js';
import { guardedNetwork } from '../lib/address.js';
import { announce, refusal } from './common.js';

/**
 * Addresses the invalid-key guard blocks (README "API keys and plans"): the list this instance
 * holds, and an unblock that every instance hears at once.
 */
export function blocksApp(deps: AdminDeps): Hono {
  const app = new Hono();
  app.get('/', (c) => c.json({ blocks: deps.guard.blocks() }));
  // `{.+}`: a /64 may be written with its slash as it is listed (`/admin/blocks/2001:db8::/64`) or as `%2F`.
  app.delete('/:address{.+}', async (c) => {
    // As the guard counts it: `::ffff:198.51.100.7` unblocks `198.51.100.7`, `2001:db8::7` its /64.
    const address = guardedNetwork(c.req.param('address'));
    if (!(await deps.guard.unblock(address))) return refusal(c, 404, `Address ${address} is not blocked`);
    await announce(
      deps,
      { type: 'address-unblocked', address },
      'unblock not announced; other instances may refuse the address until its block ends',
    );
    deps.logger.info({ address }, 'address unblocked');
    return c.body(null, 204);
  });
  return app;
}
