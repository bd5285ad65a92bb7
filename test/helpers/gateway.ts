import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { loadSettings } from '../../src/config/settings.js';
import type { Clock } from '../../src/limits/windows.js';
import { startGateway, type Gateway } from '../../src/runner.js';
import { startSandboxBridge, type SandboxBridge } from '../../src/sandbox/bridge.js';
import { REDIS_URL, uniquePrefix } from './redis.js';

export const ADMIN_TOKEN = 'test-admin-token-0123456789';
export const SHIPPED_LIMITS = readFileSync(new URL('../../limits.yaml', import.meta.url), 'utf8');

export interface TestGatewayOptions {
  /** YAML of the limit table (the shipped limits.yaml by default). */
  readonly limits?: string;
  /** Environment on top of the defaults below (undefined removes a default). */
  readonly env?: Record<string, string | undefined>;
  readonly clock?: Clock;
  /** `false`: in-memory counters. A URL: that Redis. Default: the suite's Redis. */
  readonly redis?: string | false;
  /** Reuse bridges (for several instances in front of the same ones). */
  readonly bridges?: { readonly eqt: SandboxBridge; readonly fno: SandboxBridge };
  /** Share a key prefix with another instance. */
  readonly prefix?: string;
  /** Share a directory (and so a limits file) with another instance. */
  readonly dir?: string;
}

export interface TestGateway {
  readonly gateway: Gateway;
  readonly url: string;
  readonly port: number;
  readonly adminUrl: string;
  readonly eqt: SandboxBridge;
  readonly fno: SandboxBridge;
  readonly prefix: string;
  readonly dir: string;
  readonly limitsPath: string;
  /** Every log line written so far, parsed. */
  readonly logs: Array<Record<string, unknown>>;
  /** Every log line written so far, as written. */
  readonly logText: () => string;
  stop(): Promise<void>;
}

/** A gateway over real sockets on loopback ports, with sandbox bridges and its own key prefix. */
export async function startTestGateway(options: TestGatewayOptions = {}): Promise<TestGateway> {
  const ownBridges = !options.bridges;
  const eqt = options.bridges?.eqt ?? (await startSandboxBridge('eqt'));
  const fno = options.bridges?.fno ?? (await startSandboxBridge('fno'));
  const ownDir = !options.dir;
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), 'oapi-gw-'));
  const limitsPath = join(dir, 'limits.yaml');
  if (options.limits !== undefined || ownDir) writeFileSync(limitsPath, options.limits ?? SHIPPED_LIMITS);
  const prefix = options.prefix ?? uniquePrefix('gw');

  const env: Record<string, string | undefined> = {
    PORT: '0',
    HOST: '127.0.0.1',
    ADMIN_PORT: '0',
    ADMIN_TOKEN,
    EQT_BRIDGE_URL: eqt.url,
    FNO_BRIDGE_URL: fno.url,
    REDIS_URL: options.redis === false ? undefined : (options.redis ?? REDIS_URL),
    REDIS_KEY_PREFIX: prefix,
    LIMITS_FILE: limitsPath,
    API_KEY_MODE: 'any',
    LOG_LEVEL: 'info',
    UPSTREAM_TIMEOUT_MS: '3000',
    SHUTDOWN_TIMEOUT_MS: '3000',
    ...options.env,
  };
  for (const [k, v] of Object.entries(env)) if (v === undefined) delete env[k];

  const lines: string[] = [];
  const destination = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
  const settings = loadSettings({ env: env, cwd: dir });
  const gateway = await startGateway({
    settings,
    logDestination: destination,
    watchPollMs: 200,
    ...(options.clock ? { clock: options.clock } : {}),
  });
  const url = gateway.publicUrl as string;
  return {
    gateway,
    url,
    port: Number(new URL(url).port),
    adminUrl: gateway.adminUrl as string,
    eqt,
    fno,
    prefix,
    dir,
    limitsPath,
    get logs() {
      return lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    },
    logText: () => lines.join('\n'),
    stop: async () => {
      await gateway.stop();
      if (ownBridges) await Promise.all([eqt.close(), fno.close()]);
      if (ownDir) rmSync(dir, { recursive: true, force: true });
    },
  };
}

export function authHeader(): Record<string, string> {
  return { Authorization: `Bearer ${ADMIN_TOKEN}` };
}

export interface GatewayPair {
  readonly a: TestGateway;
  readonly b: TestGateway;
  readonly eqt: SandboxBridge;
  readonly fno: SandboxBridge;
  readonly prefix: string;
  stop(): Promise<void>;
}

/** Two gateway instances in front of the same bridges, sharing one key prefix (and so their counters). */
export async function startGatewayPair(
  options: Omit<TestGatewayOptions, 'bridges' | 'prefix'> & { readonly label?: string } = {},
): Promise<GatewayPair> {
  const eqt = await startSandboxBridge('eqt');
  const fno = await startSandboxBridge('fno');
  const shared = { ...options, prefix: uniquePrefix(options.label ?? 'pair'), bridges: { eqt, fno } };
  const a = await startTestGateway(shared);
  const b = await startTestGateway(shared);
  return {
    a,
    b,
    eqt,
    fno,
    prefix: shared.prefix,
    stop: async () => {
      await Promise.all([a.stop(), b.stop()]);
      await Promise.all([eqt.close(), fno.close()]);
    },
  };
}
