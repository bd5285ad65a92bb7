import { describe, expect, it } from 'vitest';
import { partOf, profileLines, summariseProfile, type CpuProfile } from '../../bench/profile.js';

describe('bench CPU profile summary', () => {
  it('names who ran each sampled function', () => {
    expect(partOf({ functionName: '(idle)', url: '' })).toBeUndefined();
    expect(partOf({ functionName: '(garbage collector)', url: '' })).toBe('garbage collection');
    expect(partOf({ functionName: '(program)', url: '' })).toBe('V8 and native code outside JS');
    expect(partOf({ functionName: 'writev', url: '' })).toBe('native: writev');
    expect(partOf({ functionName: 'ClientRequest', url: 'node:_http_client' })).toBe('node: http');
    expect(partOf({ functionName: 'Readable.pipe', url: 'node:internal/streams/readable' })).toBe('node: streams');
    expect(partOf({ functionName: 'x', url: 'node:internal/url' })).toBe('node: other');
    expect(partOf({ functionName: 'dispatch', url: 'file:///app/node_modules/hono/dist/compose.js' })).toBe('hono');
    expect(partOf({ functionName: 'x', url: 'file:///app/node_modules/@hono/node-server/dist/index.mjs' })).toBe(
      '@hono/node-server',
    );
    expect(partOf({ functionName: 'rateLimit', url: 'file:///app/dist/server/middleware/rate-limit.js' })).toBe(
      'gateway: src/server',
    );
    expect(partOf({ functionName: 'main', url: 'file:///app/dist/main.js' })).toBe('gateway: src');
  });

  it('adds up self time per part, leaves idle time out and divides by the requests', () => {
    const profile: CpuProfile = {
      nodes: [
        { id: 1, callFrame: { functionName: '(idle)', url: '' } },
        { id: 2, callFrame: { functionName: 'dispatch', url: 'file:///app/node_modules/hono/dist/compose.js' } },
        { id: 3, callFrame: { functionName: 'Context', url: 'file:///app/node_modules/hono/dist/context.js' } },
        { id: 4, callFrame: { functionName: '(garbage collector)', url: '' } },
      ],
      samples: [1, 2, 3, 4, 2, 1],
      timeDeltas: [500, 100, 200, 300, 100, 900],
    };
    const parts = summariseProfile(profile, 10);
    expect(parts).toEqual([
      { part: 'hono', usPerRequest: 40, share: 400 / 700 },
      { part: 'garbage collection', usPerRequest: 30, share: 300 / 700 },
    ]);
    const lines = profileLines(parts, 1);
    expect(lines).toHaveLength(3);
    expect(lines[1]).toMatch(/\(1 more\)\s+30\.0 µs\s+42\.9 %/);
    expect(lines[2]).toMatch(/total sampled on the main thread\s+70\.0 µs\s+100\.0 %/);
  });
});
