import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { TableHolder } from '../../src/config/table-holder.js';
import { createLogger } from '../../src/observability/logger.js';
import { GatewayMetrics } from '../../src/observability/metrics.js';

const table = (perHour: number): string => `
timezone: UTC
limits:
  - { name: Orders, route: "GET /orders", per_hour: ${perHour}, per_day: 1000 }
`;

describe('TableHolder', () => {
  const dir = mkdtempSync(join(tmpdir(), 'oapi-table-holder-'));
  const lines: Array<Record<string, unknown>> = [];
  const logger = createLogger(
    'info',
    new Writable({
      write: (chunk: Buffer, _e, cb) => {
        lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
        cb();
      },
    }),
  );
  let holder: TableHolder | undefined;
  const holderOf = (path: string, displayName: string, metrics = new GatewayMetrics({ defaultMetrics: false })) =>
    new TableHolder({ path, displayName, logger, metrics });
  afterEach(() => holder?.close());
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('takes an edit made between the first read and the start of the watch (regression: unseen until the next edit)', async () => {
    const path = join(dir, 'limits.yaml');
    writeFileSync(path, table(5));
    holder = holderOf(path, 'limits.yaml');
    expect((await holder.reload('start')).ok).toBe(true);
    writeFileSync(path, table(7));
    // A poll far slower than the test, and no event for a write made before the watch: only the
    // look the watch takes as it starts (lib/file-watcher.ts) can see the edit.
    holder.watch(60_000);
    for (let i = 0; i < 40 && holder.current()?.rows[0]?.limits.perHour !== 7; i++)
      await new Promise((r) => setTimeout(r, 25));
    expect(holder.current()?.rows[0]?.limits.perHour).toBe(7);
  });

  it('says nothing when the file is as it was when the watch starts', async () => {
    const path = join(dir, 'same.yaml');
    writeFileSync(path, table(5));
    holder = holderOf(path, 'same.yaml');
    await holder.reload('start');
    const before = lines.length;
    holder.watch(60_000);
    await new Promise((r) => setTimeout(r, 300)); // past the watch's own look (150 ms after it starts)
    expect(lines.slice(before)).toEqual([]);
  });

  it('does not refuse an edit the file watch read half written (regression: a spurious "limit table refused" and invalid reload)', async () => {
    const path = join(dir, 'half.yaml');
    writeFileSync(path, table(5));
    const metrics = new GatewayMetrics({ defaultMetrics: false });
    holder = holderOf(path, 'half.yaml', metrics);
    await holder.reload('start');
    const before = lines.length;
    const whole = table(7);
    writeFileSync(path, whole.slice(0, whole.indexOf('per_hour'))); // an unterminated flow mapping
    const reload = holder.reload('file'); // what the watch does on the write's first event
    await new Promise((r) => setTimeout(r, 40));
    writeFileSync(path, whole);
    const result = await reload;
    expect(result.ok).toBe(true);
    expect(holder.current()?.rows[0]?.limits.perHour).toBe(7);
    expect(lines.slice(before).map((l) => l.msg)).toEqual(['limit table loaded']);
    const reloads = await metrics.registry.getSingleMetric('oapi_gateway_limits_reloads_total')?.get();
    expect(reloads?.values.find((v) => v.labels.result === 'invalid')?.value).toBe(0);
  });

  it('refuses, once, a file the watch finds invalid and left as it is', async () => {
    const path = join(dir, 'bad.yaml');
    writeFileSync(path, table(5));
    holder = holderOf(path, 'bad.yaml');
    await holder.reload('start');
    const before = lines.length;
    writeFileSync(path, table(5).replace('per_hour: 5', 'per_hour: -5'));
    expect((await holder.reload('file')).ok).toBe(false);
    expect((await holder.reload('file')).ok).toBe(false);
    expect(lines.slice(before).map((l) => l.msg)).toEqual(['limit table refused; the table in force stays']);
    expect(holder.current()?.rows[0]?.limits.perHour).toBe(5);
  });
});
