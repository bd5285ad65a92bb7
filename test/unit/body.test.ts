import { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { clientErrorAnswer } from '../../src/lib/answers.js';
import { markClientFailure } from '../../src/lib/client-failure.js';
import type { GatewayEnv } from '../../src/server/context.js';
import { bodyRules, credentialsProblem, isJsonMediaType } from '../../src/server/middleware/body.js';

describe('isJsonMediaType', () => {
  it.each([
    'application/json',
    'Application/JSON',
    'application/json; charset=utf-8',
    'application/json;charset=UTF-8',
    'application/json; charset="utf-8"',
    // A charset parameter is allowed whatever it names; the body is read as UTF-8 all the same.
    'application/json; charset=latin1',
    'application/json; charset=ISO-8859-1',
    'application/json;charset=us-ascii',
  ])('accepts %s', (t) => {
    expect(isJsonMediaType(t)).toBe(true);
  });
  it.each([
    undefined,
    '',
    'text/plain',
    'application/json-patch+json',
    'application/x-www-form-urlencoded',
    'application/json; boundary=x',
    'application/json; charset=utf-8; charset=latin1',
    'application/json; charset=',
    'application/json; charset=""',
    'application/json; charset=utf 8',
  ])('refuses %s', (t) => {
    expect(isJsonMediaType(t)).toBe(false);
  });
});

describe('credentialsProblem', () => {
  const shape = 'Body must be a JSON object with non-empty string "username" and "password"';
  it('accepts non-empty string credentials, extra fields included', () => {
    expect(credentialsProblem(Buffer.from('{"username":"demo","password":"p"}'))).toBeUndefined();
    expect(credentialsProblem(Buffer.from('{"username":"Nguyễn","password":"mật khẩu","device":"x"}'))).toBeUndefined();
  });
  it.each([
    ['', 'Body is not valid JSON'],
    ['{"username":"demo","password":"secret-pw"', 'Body is not valid JSON'],
    ['[1,2]', shape],
    ['null', shape],
    ['{"username":"demo"}', shape],
    ['{"username":"","password":"x"}', shape],
    ['{"username":"demo","password":42}', shape],
    ['[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]', 'JSON is nested too deeply'],
  ])('refuses %s', (body, problem) => {
    expect(credentialsProblem(Buffer.from(body))).toBe(problem);
  });
  it('refuses invalid UTF-8', () => {
    expect(credentialsProblem(Buffer.from([0x7b, 0xff, 0x7d]))).toBe('Body is not valid UTF-8');
  });
  it('never quotes the body (it holds a password)', () => {
    expect(credentialsProblem(Buffer.from('{"username":"demo","password":"hunter2"'))).not.toContain('hunter2');
  });
  it('does not count brackets inside strings as nesting', () => {
    expect(
      credentialsProblem(
        Buffer.from(JSON.stringify({ username: '[[[[[[[[[[[[[[[[[[[[', password: '{{{{{{{{{{{{{{{{{{{{"' })),
      ),
    ).toBeUndefined();
  });
});

describe('bodyRules on a request the HTTP layer marked with a parser failure', () => {
  // The mark came while an earlier step waited (on Redis): the body step answers it itself.
  it.each([
    [
      'a body that stopped coming',
      'ERR_HTTP_REQUEST_TIMEOUT',
      408,
      'Request Timeout',
      'Request took too long to arrive',
    ],
    ['a malformed chunk', 'HPE_INVALID_CHUNK_SIZE', 400, 'Bad Request', 'Malformed HTTP request'],
  ] as const)(
    '%s: answers %s as %i with Connection: close before looking at the body',
    async (_what, code, status, error, message) => {
      const incoming = new IncomingMessage(new Socket());
      markClientFailure(incoming, clientErrorAnswer(code));
      const app = new Hono<GatewayEnv>();
      const step = bodyRules({ maxBodyBytes: 10, credentialRoutes: new Set() });
      let forwarded = false;
      app.post('*', (c) =>
        step(c, () => {
          forwarded = true;
          return Promise.resolve(c.body(null, 200));
        }),
      );
      const reply = await app.request('/orders', { method: 'POST', body: 'x' }, { incoming });
      expect(reply.status).toBe(status);
      expect(reply.headers.get('connection')).toBe('close');
      expect(await reply.json()).toEqual({ error, message });
      expect(forwarded).toBe(false);
    },
  );
});
