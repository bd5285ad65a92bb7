import { describe, expect, it } from 'vitest';
import { headerObject } from '../../src/ws/bridge-proxy.js';

/** The upgrade request's fields as http-proxy gets them (it writes the request from an object). */

describe('headerObject', () => {
  it('keeps every line of a repeated field, in order, whatever the case of its name', () => {
    const object = headerObject(['Cookie', 'a=1', 'X-Tag', 'one', 'cookie', 'b=2', 'COOKIE', 'c=3', 'x-tag', 'two']);
    expect({ ...object }).toEqual({ cookie: ['a=1', 'b=2', 'c=3'], 'x-tag': ['one', 'two'] });
  });

  it('gives a field sent once a plain value', () => {
    expect({ ...headerObject(['Upgrade', 'websocket', 'X-Request-Id', 'r1']) }).toEqual({
      upgrade: 'websocket',
      'x-request-id': 'r1',
    });
  });

  it('takes names that are properties of plain objects as fields like any other', () => {
    const object = headerObject(['constructor', 'a', 'Constructor', 'b', 'toString', 'c', 'hasOwnProperty', 'd']);
    expect(Object.keys(object)).toEqual(['constructor', 'tostring', 'hasownproperty']);
    expect(object['constructor']).toEqual(['a', 'b']);
    expect(object['tostring']).toBe('c');
  });
});
