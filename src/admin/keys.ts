import { Hono } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import { KEY_ID } from '../keys/key-file.js';
import { shortKeyHash } from '../observability/logger.js';
import type { AdminDeps } from './app.js';
import { announce, refusal, withTable } from './common.js';
import { resetAnswer, usageAnswer } from './usage.js';

/** `{"id","plan"}` is under 200 bytes: a larger body is refused unread, not buffered whole. */
export const MAX_NEW_KEY_BODY_BYTES = 4096;

/** Issued API keys (README "API keys and plans"): issue, list, revoke. */
export function keysApp(deps: AdminDeps): Hono {
  const { registry, tables, logger } = deps;
  const app = new Hono();

  // A 503 for a change made would lose the key shown once. The other instances also follow the
  // version of the issued keys, within half a second (README "API keys and plans": revocation).
  const announced = (): Promise<void> =>
    announce(deps, { type: 'keys-changed' }, 'key change not announced; other instances see it within a second');

  const bounded = bodyLimit({
    maxSize: MAX_NEW_KEY_BODY_BYTES,
    onError: (c) => refusal(c, 413, `Request body is larger than ${MAX_NEW_KEY_BODY_BYTES} bytes`),
  });
  app.post('/', bounded, async (c) => {
    const body: unknown = await c.req.json().catch(() => undefined);
    if (typeof body !== 'object' || body === null) return refusal(c, 400, 'Body must be JSON: {"id":"…","plan":"…"}');
    const { id, plan } = body as { id?: unknown; plan?: unknown };
    if (typeof id !== 'string' || !KEY_ID.test(id))
      return refusal(c, 400, 'id must be letters, digits, ".", "_" and "-" (at most 64)');
    const plans = tables.current()?.plans;
    if (plan !== undefined && plan !== null && (typeof plan !== 'string' || !plans?.has(plan))) {
      return refusal(c, 400, `Unknown plan; plans of the table: ${[...(plans?.keys() ?? [])].join(', ') || 'none'}`);
    }
    const result = await registry.create(id, typeof plan === 'string' ? plan : undefined);
    if (!result.created) return refusal(c, 409, `A key with id "${id}" exists`);
    await announced();
    logger.info({ keyId: id, plan: result.record.plan, key: shortKeyHash(result.record.sha256) }, 'api key issued');
    return c.json({ id, key: result.key, plan: result.record.plan ?? null }, 201);
  });

  app.get('/', async (c) => {
    // Until the issued keys were read once, a listing would leave every one of them out.
    if (!registry.loaded) await registry.refresh().catch(() => undefined);
    if (!registry.loaded) return refusal(c, 503, 'Key store unavailable');
    return c.json({
      keys: registry.list().map((k) => ({
        id: k.id,
        plan: k.plan ?? null,
        source: k.source === 'file' ? 'key-file' : 'admin-api',
        ...(k.createdAt ? { createdAt: k.createdAt } : {}),
      })),
    });
  });

  // Usage by id: support knows a client's key id, never the key itself (it is shown once).
  app.use('/:id/usage', withTable(tables), async (c, next) => {
    const id = c.req.param('id') ?? '';
    let record = registry.byId(id);
    // An id unknown here may be an issued key's: one not read yet, or issued on another instance a
    // moment ago (this one hears of it within half a second). Redis is asked before a 404; when it
    // does not answer, the id cannot be told unknown (as for the listing).
    if (!record) {
      const read = await registry.refresh().then(
        () => true,
        () => false,
      );
      if (!read) return refusal(c, 503, 'Key store unavailable');
      record = registry.byId(id);
    }
    if (!record) return refusal(c, 404, `No key with id "${id}"`);
    c.set('keyHash', record.sha256);
    await next();
  });
  app.get('/:id/usage', (c) => usageAnswer(c, deps, c.get('keyHash')));
  app.delete('/:id/usage', (c) => resetAnswer(c, deps, c.get('keyHash')));

  app.delete('/:id', async (c) => {
    const id = c.req.param('id');
    const result = await registry.revoke(id);
    if (result === 'in-key-file') return refusal(c, 409, `Key "${id}" comes from the key file: remove it there`);
    if (result === 'not-found') return refusal(c, 404, `No key with id "${id}"`);
    await announced();
    logger.info({ keyId: id }, 'api key revoked');
    return c.body(null, 204);
  });
  return app;
}
