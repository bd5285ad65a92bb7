import { describe, expect, it } from 'vitest';
import { requestIdSource } from '../../src/server/middleware/request-id.js';

/** New request ids are RFC 9562 version 8 UUIDs, distinct within a process and between processes. */

const UUID_V8 = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('requestIdSource', () => {
  it('gives version 8, variant 10 UUIDs', () => {
    const next = requestIdSource();
    for (let i = 0; i < 1000; i++) expect(next()).toMatch(UUID_V8);
  });

  it('never repeats an id, within one source or across sources', () => {
    const ids = new Set<string>();
    for (let s = 0; s < 20; s++) {
      const next = requestIdSource();
      for (let i = 0; i < 500; i++) ids.add(next());
    }
    expect(ids.size).toBe(20 * 500);
  });
});
