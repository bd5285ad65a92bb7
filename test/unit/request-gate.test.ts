import type { IncomingMessage } from 'node:http';
import { describe, expect, it } from 'vitest';
import { gateRefusal } from '../../src/server/request-gate.js';

/** The request gate on request heads built by hand (no socket): what it refuses, and with which status. */

function head(lines: Array<[string, string]>, version = '1.1', method = 'GET'): IncomingMessage {
  const headers: Record<string, string> = {};
  for (const [name, value] of lines) {
    const key = name.toLowerCase();
    headers[key] = headers[key] === undefined ? value : `${headers[key]}, ${value}`;
  }
  const [major, minor] = version.split('.').map(Number);
  return {
    rawHeaders: lines.flat(),
    headers,
    httpVersionMajor: major,
    httpVersionMinor: minor,
    method,
    url: '/ws/marketdata',
  } as unknown as IncomingMessage;
}

describe('gateRefusal', () => {
  it('passes an ordinary request', () => {
    expect(
      gateRefusal(
        head([
          ['Host', 'x'],
          ['X-API-Key', 'k'],
        ]),
        100,
      ),
    ).toBeUndefined();
    expect(
      gateRefusal(
        head([
          ['Host', 'x'],
          ['Transfer-Encoding', 'chunked'],
        ]),
        100,
      ),
    ).toBeUndefined();
    expect(
      gateRefusal(
        head([
          ['Host', 'x'],
          ['Transfer-Encoding', ' Chunked '],
        ]),
        100,
      ),
    ).toBeUndefined();
  });

  it('refuses more header lines than the bound with 431, at exactly one past it', () => {
    const lines = (count: number): Array<[string, string]> => [
      ['Host', 'x'],
      ...Array.from({ length: count - 1 }, (_, i): [string, string] => [`X-${i}`, 'v']),
    ];
    expect(gateRefusal(head(lines(100)), 100)).toBeUndefined();
    expect(gateRefusal(head(lines(101)), 100)).toEqual({
      status: 431,
      reason: 'header-size',
      message: 'Too many request headers',
    });
  });

  it('wants exactly one Host on HTTP/1.1, none on HTTP/1.0', () => {
    expect(gateRefusal(head([['X-API-Key', 'k']]), 100)).toEqual({
      status: 400,
      reason: 'bad-request',
      message: 'Missing Host header',
    });
    expect(
      gateRefusal(
        head([
          ['Host', 'a'],
          ['host', 'b'],
        ]),
        100,
      ),
    ).toEqual({
      status: 400,
      reason: 'bad-request',
      message: 'More than one Host header',
    });
    expect(gateRefusal(head([['X-API-Key', 'k']], '1.0'), 100)).toBeUndefined();
  });

  it.each([
    ['identity', 400],
    ['gzip', 400],
    ['chunked, identity', 400],
    ['chunked;ext=1', 400],
    ['', 400],
    ['gzip, chunked', 501],
    ['deflate,chunked', 501],
  ])('refuses Transfer-Encoding: %j with %i', (coding, status) => {
    const refusal = gateRefusal(
      head([
        ['Host', 'x'],
        ['Transfer-Encoding', coding],
      ]),
      100,
    );
    expect(refusal?.status).toBe(status);
    expect(refusal?.reason).toBe(status === 501 ? 'not-implemented' : 'bad-request');
  });

  const WEBSOCKET: Array<[string, string]> = [
    ['Host', 'x'],
    ['Connection', 'Upgrade'],
    ['Upgrade', 'websocket'],
  ];

  it('refuses an upgrade that announces a body, and only an upgrade', () => {
    const withLength = head([...WEBSOCKET, ['Content-Length', '5']]);
    expect(gateRefusal(withLength, 100, true)).toEqual({
      status: 400,
      reason: 'bad-request',
      message: 'An upgrade request carries no body',
    });
    expect(gateRefusal(withLength, 100, false)).toBeUndefined();
    expect(gateRefusal(head([...WEBSOCKET, ['Content-Length', '0']]), 100, true)).toBeUndefined();
    expect(gateRefusal(head([...WEBSOCKET, ['Transfer-Encoding', 'chunked']]), 100, true)?.status).toBe(400);
  });

  it('refuses an upgrade to anything but a WebSocket by GET, and one whose Host and target form no URL', () => {
    const onlyWebSocket = { status: 400, reason: 'bad-request', message: 'Only WebSocket upgrades are accepted' };
    expect(
      gateRefusal(
        head([
          ['Host', 'x'],
          ['Upgrade', 'h2c'],
        ]),
        100,
        true,
      ),
    ).toEqual(onlyWebSocket);
    expect(gateRefusal(head(WEBSOCKET, '1.1', 'POST'), 100, true)).toEqual(onlyWebSocket);
    expect(
      gateRefusal(
        head([
          ['Host', 'a b'],
          ['Upgrade', 'websocket'],
        ]),
        100,
        true,
      ),
    ).toEqual({ status: 400, reason: 'bad-request', message: 'Malformed request' });
    expect(gateRefusal(head(WEBSOCKET), 100, true)).toBeUndefined();
  });
});
