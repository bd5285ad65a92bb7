import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { Callgrind, summaryOf } from '../../bench/callgrind.js';
import { sendExactly } from '../../bench/load.js';
import { startRedis, stopChild } from '../../bench/processes.js';
import { ScriptUnderCount } from '../../bench/script-calls.js';
import * as countRules from '../../src/limits/count-rules.js';

/**
 * `npm run bench:instructions` (bench/instructions.ts) divides callgrind's instruction counts by a
 * number of requests: that number must be exact, and the counts must follow the requests.
 */

const tempDir = mkdtempSync(join(os.tmpdir(), 'oapi-test-callgrind-'));
afterAll(() => rmSync(tempDir, { recursive: true, force: true }));

describe('sendExactly', () => {
  it('fails when an answer does not come in time, and sends nothing after', async () => {
    let seen = 0;
    const server = http.createServer((request, response) => {
      seen++;
      request.resume();
      if (seen !== 3) response.end('ok'); // the third is never answered
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      await expect(sendExactly(url, [{ method: 'GET', path: '/' }], 10, 1, 300)).rejects.toThrow(
        'no answer within 300 ms',
      );
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect(seen).toBe(3);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('sends exactly the count asked for, in turn, on no more connections than asked, and reads every answer', async () => {
    const seen: string[] = [];
    const sockets = new Set<unknown>();
    const server = http.createServer((request, response) => {
      sockets.add(request.socket);
      let body = '';
      request.setEncoding('utf8');
      request.on('data', (chunk: string) => (body += chunk));
      request.on('end', () => {
        seen.push(`${request.method} ${request.url} ${String(request.headers['x-api-key'])} ${body}`);
        response.statusCode = request.url === '/b' ? 404 : 200;
        response.end('answer');
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const statuses = await sendExactly(
        url,
        [
          { method: 'POST', path: '/a', headers: { 'x-api-key': 'k1' }, body: 'payload' },
          { method: 'GET', path: '/b', headers: { 'x-api-key': 'k2' } },
        ],
        37,
        4,
      );
      expect(statuses).toEqual({ '200': 19, '404': 18 });
      expect(seen).toHaveLength(37);
      expect(seen.filter((s) => s === 'POST /a k1 payload')).toHaveLength(19);
      expect(seen.filter((s) => s === 'GET /b k2 ')).toHaveLength(18);
      expect(sockets.size).toBeLessThanOrEqual(4);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

// valgrind is a system package that only `npm run bench:instructions` needs, not the gateway.
const hasValgrind = spawnSync('valgrind', ['--version']).status === 0;

describe.skipIf(!hasValgrind)('Callgrind (needs valgrind)', () => {
  it('counts what a process executes between zero and dump, in proportion to the requests it serves', async () => {
    const callgrind = new Callgrind(tempDir, 'echo');
    const launcher = callgrind.launcher();
    const script = `require('node:http').createServer((q, r) => r.end('ok')).listen(0, '127.0.0.1', function () { process.stdout.write(this.address().port + '\\n'); });`;
    const child = spawn(launcher.command, [...launcher.args, '-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const port = await new Promise<number>((resolve, reject) => {
        let out = '';
        child.stdout.setEncoding('utf8');
        child.stdout.on('data', (chunk: string) => {
          out += chunk;
          if (out.includes('\n')) resolve(Number(out.trim()));
        });
        child.once('exit', (code) => reject(new Error(`node under valgrind exited with ${code}`)));
      });
      const url = `http://127.0.0.1:${port}`;
      const requests = [{ method: 'GET' as const, path: '/', headers: {} }];
      callgrind.attach(child.pid ?? 0);
      await sendExactly(url, requests, 300, 2); // uncounted: the JIT's warm-up
      callgrind.start();
      await sendExactly(url, requests, 200, 2);
      const twoHundred = callgrind.dump(join(tempDir, 'two-hundred.callgrind'));
      callgrind.zero();
      await sendExactly(url, requests, 400, 2);
      const fourHundred = callgrind.dump(join(tempDir, 'four-hundred.callgrind'));
      callgrind.zero();
      const none = callgrind.dump(join(tempDir, 'none.callgrind'));

      expect(twoHundred.mainThread).toBeGreaterThan(0);
      expect(twoHundred.allThreads).toBeGreaterThanOrEqual(twoHundred.mainThread);
      // Twice the requests, about twice the instructions; none, next to nothing.
      expect(fourHundred.mainThread / twoHundred.mainThread).toBeGreaterThan(1.6);
      expect(fourHundred.mainThread / twoHundred.mainThread).toBeLessThan(2.4);
      expect(none.mainThread).toBeLessThan(twoHundred.mainThread / 20);
      // The main thread's profile is kept where asked; the dumps' own files are gone.
      expect(summaryOf(readFileSync(join(tempDir, 'four-hundred.callgrind'), 'utf8'))).toBe(fourHundred.mainThread);
      expect(readdirSync(tempDir).filter((f) => f.startsWith('echo.out.'))).toEqual([]);

      // A process callgrind_control cannot reach is an error, not a silent zero.
      child.kill('SIGKILL');
      await new Promise((resolve) => child.once('exit', resolve));
      expect(() => callgrind.zero()).toThrow(/callgrind_control --zero/);
    } finally {
      child.kill('SIGKILL');
    }
  }, 120_000);
});

describe.skipIf(!hasValgrind)('bench:script (needs valgrind)', () => {
  it("counts Redis's work for a build's consume script in proportion to the calls, and more per request for calls of fewer requests", async () => {
    const callgrind = new Callgrind(tempDir, 'redis');
    const server = await startRedis(tempDir, callgrind.launcher('redis-server'));
    const client = new Redis(server.url, { maxRetriesPerRequest: 0 });
    try {
      callgrind.attach(server.child.pid);
      const batched = new ScriptUnderCount(countRules, client, 'batched:', 21);
      const alone = new ScriptUnderCount(countRules, client, 'alone:', 1);
      for (const script of [batched, alone]) {
        await script.load();
        await script.send(10);
      }
      callgrind.start();
      await batched.send(20);
      const twenty = callgrind.dump(join(tempDir, 'script-20.callgrind')).mainThread / (20 * 21);
      callgrind.zero();
      await batched.send(40);
      const forty = callgrind.dump(join(tempDir, 'script-40.callgrind')).mainThread / (40 * 21);
      callgrind.zero();
      await alone.send(40);
      const one = callgrind.dump(join(tempDir, 'script-1.callgrind')).mainThread / 40;

      expect(twenty).toBeGreaterThan(10_000);
      // Per request, the same for twice the calls; a call of one request pays the whole call.
      expect(forty / twenty).toBeGreaterThan(0.9);
      expect(forty / twenty).toBeLessThan(1.1);
      expect(one).toBeGreaterThan(1.5 * forty);
      // Every request of every call was counted (and allowed) in Redis.
      const counts = await Promise.all(
        Array.from({ length: 64 }, (_, i) => client.hget(`batched:{bench-key-${i}}:quote`, 'hc')),
      );
      expect(counts.reduce((sum, hc) => sum + Number(hc ?? 0), 0)).toBe((10 + 20 + 40) * 21);
    } finally {
      client.disconnect();
      await stopChild(server.child, 30_000);
    }
  }, 120_000);
});
