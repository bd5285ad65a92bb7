import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startTestGateway, type TestGateway } from '../helpers/gateway.js';

/**
 * A bug of the gateway's own while it serves (README "Headers and answers"): the request gets the
 * two-field 500 over its real socket, the access log records it, the error's text stays in the log,
 * and the connection and the gateway go on serving. The fault is injected into the limiter of a
 * running gateway: a throw and a rejection, the two ways a step can fail.
 */

const LIMITS = `
timezone: UTC
limits:
  - name: Order List
    route: GET /orders
    per_hour: 100
    per_day: 100
`;

let gw: TestGateway;
beforeAll(async () => {
  gw = await startTestGateway({ limits: LIMITS, redis: false });
});
afterAll(() => gw.stop());

interface Reply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly body: string;
  /** The request went out on a socket an earlier one had used (keep-alive). */
  readonly reusedSocket: boolean;
}

function getOrders(agent: http.Agent, key: string): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const request = http.get(`${gw.url}/orders`, { agent, headers: { 'X-API-Key': key } }, (response) => {
      let body = '';
      response.setEncoding('utf8');
      response.on('data', (chunk: string) => (body += chunk));
      response.on('end', () =>
        resolve({
          status: response.statusCode ?? 0,
          headers: response.headers,
          body,
          reusedSocket: request.reusedSocket,
        }),
      );
    });
    request.once('error', reject);
  });
}

describe('an unexpected error of the gateway over a real socket', () => {
  const failures: Record<string, () => never | Promise<never>> = {
    thrown: () => {
      throw new Error('secret detail of a limiter bug (thrown)');
    },
    rejected: () => Promise.reject(new Error('secret detail of a limiter bug (rejected)')),
  };

  for (const [how, failure] of Object.entries(failures)) {
    it(`answers a step that fails (${how}) with the two-field 500, then serves on on the same connection`, async () => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const key = `unexpected-${how}`;
      try {
        const spy = vi.spyOn(gw.gateway.limiter, 'check').mockImplementationOnce(failure);
        const failed = await getOrders(agent, key);
        expect(spy).toHaveBeenCalledTimes(1);
        spy.mockRestore();

        expect(failed.status).toBe(500);
        expect(failed.headers['content-type']).toMatch(/^application\/json/);
        expect(JSON.parse(failed.body)).toEqual({ error: 'Internal Server Error', message: 'Unexpected error' });
        expect(failed.body).not.toContain('secret detail');
        const requestId = failed.headers['x-request-id'];
        expect(requestId).toEqual(expect.any(String));
        expect(failed.headers.connection).not.toBe('close');

        const after = await getOrders(agent, key);
        expect(after.status).toBe(200);
        expect(after.reusedSocket).toBe(true);
        expect(after.headers['x-ratelimit-remaining-hour']).toBe('99');

        const lines = gw.logs.filter((l) => l.reqId === requestId);
        expect(lines).toEqual(
          expect.arrayContaining([
            expect.objectContaining({ level: 'error', msg: 'unexpected error' }),
            expect.objectContaining({ msg: 'request', endpoint: 'GET /orders', status: 500, reason: 'internal' }),
          ]),
        );
        expect(gw.logText()).toContain(`secret detail of a limiter bug (${how})`);
      } finally {
        agent.destroy();
      }
    });
  }
});
