import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loginFailedBody, LOGIN_FAILED_STATUS } from '../../src/sandbox/bodies.js';
import { startSandboxBridge, type SandboxBridge } from '../../src/sandbox/bridge.js';

/**
 * The sandbox bridge on its own, over a real loopback socket: whatever a client sends to a token
 * operation, it answers as the specification describes and keeps serving (in `npm run sandbox` it
 * runs in the gateway's own process).
 */

let bridge: SandboxBridge;
beforeAll(async () => {
  bridge = await startSandboxBridge('eqt');
});
afterAll(async () => {
  await bridge.close();
});

describe('a login body that is JSON but not an object', () => {
  // `POST /auth/token` is not a credential route: the gateway forwards its body unchecked.
  it.each(['null', '"demo"', '42', '[]'])(
    'gets the failed-login body, and the bridge still serves (regression: `null` threw and ended the process): %s',
    async (body) => {
      const reply = await fetch(`${bridge.url}/auth/token`, { method: 'POST', body });
      expect(reply.status).toBe(LOGIN_FAILED_STATUS);
      expect(await reply.text()).toBe(loginFailedBody('eqt'));
      expect((await fetch(`${bridge.url}/orders/1`)).status).toBe(200);
    },
  );
});
