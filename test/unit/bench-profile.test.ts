import { describe, expect, it } from 'vitest';
import { compareProfiles, differenceLines, partOf, summariseProfile, type CpuProfile } from '../../bench/profile.js';

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

  const profile: CpuProfile = {
    nodes: [
      { id: 1, callFrame: { functionName: '(idle)', url: '' } },
      { id: 2, callFrame: { functionName: 'dispatch', url: 'file:///app/node_modules/hono/dist/compose.js' } },
      { id: 3, callFrame: { functionName: 'Context', url: 'file:///app/node_modules/hono/dist/context.js' } },
      { id: 4, callFrame: { functionName: '(garbage collector)', url: '' } },
    ],
    startTime: 10_000,
    samples: [1, 2, 3, 4, 2, 1],
    // Sample times: 10 500, 10 600, 10 800, 11 100, 11 200, 12 100.
    timeDeltas: [500, 100, 200, 300, 100, 900],
  };

  it('adds up self time per part, leaves idle time out and divides by the requests', () => {
    expect(summariseProfile(profile, 10)).toEqual([
      { part: 'hono', usPerRequest: 40 },
      { part: 'garbage collection', usPerRequest: 30 },
    ]);
  });

  it('counts only the samples taken up to the given moment', () => {
    expect(summariseProfile(profile, 2, 11_000)).toEqual([{ part: 'hono', usPerRequest: 150 }]);
    expect(summariseProfile(profile, 2, 11_100)).toEqual([
      { part: 'hono', usPerRequest: 150 },
      { part: 'garbage collection', usPerRequest: 150 },
    ]);
  });

  it('puts the floor beside the gateway, the largest excess of the gateway first', () => {
    const rows = compareProfiles(
      [
        { part: 'native: writev', usPerRequest: 30 },
        { part: 'garbage collection', usPerRequest: 25 },
        { part: 'hono', usPerRequest: 20 },
      ],
      [
        { part: 'native: writev', usPerRequest: 35 },
        { part: 'gateway: src/server', usPerRequest: 15 },
        { part: 'hono', usPerRequest: 19 },
        { part: 'garbage collection', usPerRequest: 10 },
      ],
    );
    expect(rows).toEqual([
      { part: 'gateway: src/server', floorUs: 0, gatewayUs: 15 },
      { part: 'native: writev', floorUs: 30, gatewayUs: 35 },
      { part: 'hono', floorUs: 20, gatewayUs: 19 },
      { part: 'garbage collection', floorUs: 25, gatewayUs: 10 },
    ]);
    // The two largest differences either way are shown; writev's and hono's go into the rest.
    const lines = differenceLines(rows, 2);
    expect(lines).toHaveLength(5);
    expect(lines[0]).toMatch(/µs per request\s+floor\s+gateway\s+difference$/);
    expect(lines[1]).toMatch(/gateway: src\/server\s+0\.0\s+15\.0\s+15\.0$/);
    expect(lines[2]).toMatch(/garbage collection\s+25\.0\s+10\.0\s+-15\.0$/);
    expect(lines[3]).toMatch(/\(2 more\)\s+50\.0\s+54\.0\s+4\.0$/);
    expect(lines[4]).toMatch(/total sampled on the main thread\s+75\.0\s+79\.0\s+4\.0$/);
  });
});
