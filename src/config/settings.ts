import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import type { FailureMode } from '../limits/limiter.js';
import type { LogLevel } from '../observability/logger.js';
import { parseRoute, type Route } from '../limits/route.js';
import {
  describe,
  entries,
  isYamlMap,
  isYamlSeq,
  scalarValue,
  YamlSource,
  formatSourceError,
} from '../lib/yaml-source.js';

/**
 * Settings of one gateway process: `config/gateway.yaml`, overridden by the environment
 * (INTERFACE §3). Checked once at start-up; a bad value stops start-up with one line naming
 * the variable (or the file, line and key) and what is wrong with it.
 */

export type BridgeName = 'eqt' | 'fno';
export const BRIDGES: readonly BridgeName[] = ['eqt', 'fno'];
export type ApiKeyMode = 'registered' | 'any';

export interface Settings {
  readonly port: number;
  readonly host: string;
  readonly adminPort: number;
  readonly adminHost: string;
  readonly adminToken: string | undefined;
  readonly redisUrl: string | undefined;
  readonly redisClusterNodes: ReadonlyArray<{ host: string; port: number }> | undefined;
  readonly redisFailureMode: FailureMode;
  readonly redisTimeoutMs: number;
  readonly redisKeyPrefix: string;
  readonly limitsFile: string;
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly upstreamTimeoutMs: number;
  readonly apiKeyHeader: string;
  readonly maxBodyBytes: number;
  readonly logLevel: LogLevel;
  readonly workers: number;
  readonly apiKeyMode: ApiKeyMode;
  /** The key file; it may not exist (yet), unless API_KEYS_FILE named it. */
  readonly apiKeysFile: string;
  readonly invalidKeyAttempts: number;
  readonly invalidKeyWindowSeconds: number;
  readonly shutdownTimeoutMs: number;
  readonly headersTimeoutMs: number;
  readonly requestTimeoutMs: number;
  readonly maxHeaderBytes: number;
  /** More header lines than this get 431 (server/request-gate.ts). */
  readonly maxHeaderCount: number;
  /** Proxies of the operator's own in front of the gateway (see server/client-address.ts). */
  readonly trustProxyHops: number;
  /** Which bridge serves a route (by canonical route key); the rest go to `defaultBridge`. */
  readonly routing: { readonly defaultBridge: BridgeName; readonly routes: ReadonlyMap<string, BridgeName> };
  /** Routes whose body must be JSON credentials (INTERFACE §5.4). */
  readonly credentialRoutes: ReadonlySet<string>;
}

export class SettingsError extends Error {
  override name = 'SettingsError';
}

type Raw = string | number | boolean;
type Parse<T> = (raw: Raw) => T | { error: string };

interface Field<T> {
  readonly env: string;
  readonly file: string;
  readonly parse: Parse<T>;
  readonly fallback: T;
}

const err = (error: string): { error: string } => ({ error });

const int =
  (min: number, max: number, what: string): Parse<number> =>
  (raw) => {
    const n = typeof raw === 'number' ? raw : /^\s*\d+\s*$/.test(String(raw)) ? Number(raw) : NaN;
    return Number.isSafeInteger(n) && n >= min && n <= max ? n : err(`must be ${what} (${min}-${max}), got "${raw}"`);
  };
const port = int(0, 65535, 'a port number');
const text =
  (what: string, pattern?: RegExp): Parse<string> =>
  (raw) => {
    const s = String(raw).trim();
    if (s === '' || (pattern && !pattern.test(s))) return err(`must be ${what}, got "${raw}"`);
    return s;
  };
const oneOf =
  <T extends string>(values: readonly T[]): Parse<T> =>
  (raw) =>
    (values as readonly string[]).includes(String(raw))
      ? (String(raw) as T)
      : err(`must be one of ${values.join(', ')}, got "${raw}"`);
const HOST = /^[A-Za-z0-9.:\-[\]]+$/;
const HEADER_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const RESERVED_HEADERS = new Set([
  'host',
  'connection',
  'content-length',
  'content-type',
  'transfer-encoding',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
  'authorization',
  'x-otp-token',
  'x-request-id',
]);

const bridgeUrl: Parse<URL> = (raw) => {
  let url: URL;
  try {
    url = new URL(String(raw).trim());
  } catch {
    return err(`must be an http:// or https:// URL, got "${raw}"`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    return err(`must be an http:// or https:// URL, got "${raw}"`);
  if (url.username || url.password) return err('must not carry credentials');
  if (url.search || url.hash) return err('must not have a query or fragment');
  return url;
};

const redisUrl: Parse<string> = (raw) => {
  const s = String(raw).trim();
  try {
    const url = new URL(s);
    if (url.protocol === 'redis:' || url.protocol === 'rediss:') return s;
  } catch {
    // fall through
  }
  return err('must be a redis:// or rediss:// URL');
};

const clusterNodes: Parse<Array<{ host: string; port: number }>> = (raw) => {
  const nodes = String(raw)
    .split(',')
    .map((n) => n.trim())
    .filter(Boolean);
  if (nodes.length === 0) return err('must list host:port,host:port,…');
  const parsed: Array<{ host: string; port: number }> = [];
  for (const node of nodes) {
    const m = /^(.+):(\d{1,5})$/.exec(node);
    const p = m ? Number(m[2]) : NaN;
    if (!m || !HOST.test(m[1] ?? '') || p < 1 || p > 65535) return err(`"${node}" is not host:port`);
    parsed.push({ host: m[1] as string, port: p });
  }
  return parsed;
};

const DEFAULT_FAILURE_MODE: FailureMode = 'insurance';
const DEFAULT_LOG_LEVEL: LogLevel = 'info';
const DEFAULT_API_KEY_MODE: ApiKeyMode = 'registered';

const FIELDS = {
  port: { env: 'PORT', file: 'port', parse: port, fallback: 8080 },
  host: { env: 'HOST', file: 'host', parse: text('a host name or address', HOST), fallback: '0.0.0.0' },
  adminPort: { env: 'ADMIN_PORT', file: 'admin_port', parse: port, fallback: 9090 },
  adminHost: {
    env: 'ADMIN_HOST',
    file: 'admin_host',
    parse: text('a host name or address', HOST),
    fallback: '127.0.0.1',
  },
  adminToken: {
    env: 'ADMIN_TOKEN',
    file: 'admin_token',
    // RFC 6750 §2.1 b64token: what a bearer token may hold, so that every token accepted here is one the admin API accepts.
    parse: text(
      'at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
      /^[A-Za-z0-9._~+/-]{16,}=*$/,
    ),
    fallback: undefined,
  },
  redisUrl: { env: 'REDIS_URL', file: 'redis_url', parse: redisUrl, fallback: undefined },
  redisClusterNodes: {
    env: 'REDIS_CLUSTER_NODES',
    file: 'redis_cluster_nodes',
    parse: clusterNodes,
    fallback: undefined,
  },
  redisFailureMode: {
    env: 'REDIS_FAILURE_MODE',
    file: 'redis_failure_mode',
    parse: oneOf<FailureMode>(['insurance', 'open', 'closed']),
    fallback: DEFAULT_FAILURE_MODE,
  },
  redisTimeoutMs: {
    env: 'REDIS_TIMEOUT_MS',
    file: 'redis_timeout_ms',
    parse: int(10, 60_000, 'milliseconds'),
    fallback: 200,
  },
  redisKeyPrefix: {
    env: 'REDIS_KEY_PREFIX',
    file: 'redis_key_prefix',
    parse: text('a key prefix without spaces or braces', /^[^\s{}]{1,64}$/),
    fallback: 'oapi:',
  },
  limitsFile: { env: 'LIMITS_FILE', file: 'limits_file', parse: text('a file path'), fallback: 'limits.yaml' },
  eqt: { env: 'EQT_BRIDGE_URL', file: 'eqt_bridge_url', parse: bridgeUrl, fallback: undefined },
  fno: { env: 'FNO_BRIDGE_URL', file: 'fno_bridge_url', parse: bridgeUrl, fallback: undefined },
  upstreamTimeoutMs: {
    env: 'UPSTREAM_TIMEOUT_MS',
    file: 'upstream_timeout_ms',
    parse: int(1, 600_000, 'milliseconds'),
    fallback: 10_000,
  },
  apiKeyHeader: {
    env: 'API_KEY_HEADER',
    file: 'api_key_header',
    parse: text('an HTTP header name', HEADER_TOKEN),
    fallback: 'X-API-Key',
  },
  maxBodyBytes: {
    env: 'MAX_BODY_BYTES',
    file: 'max_body_bytes',
    parse: int(0, 1024 ** 3, 'a byte count'),
    fallback: 1_048_576,
  },
  logLevel: {
    env: 'LOG_LEVEL',
    file: 'log_level',
    parse: oneOf<LogLevel>(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    fallback: DEFAULT_LOG_LEVEL,
  },
  workers: { env: 'WORKERS', file: 'workers', parse: int(1, 64, 'a process count'), fallback: 1 },
  apiKeyMode: {
    env: 'API_KEY_MODE',
    file: 'api_key_mode',
    parse: oneOf<ApiKeyMode>(['registered', 'any']),
    fallback: DEFAULT_API_KEY_MODE,
  },
  apiKeysFile: { env: 'API_KEYS_FILE', file: 'api_keys_file', parse: text('a file path'), fallback: undefined },
  invalidKeyAttempts: {
    env: 'INVALID_KEY_MAX_ATTEMPTS',
    file: 'invalid_key_max_attempts',
    parse: int(1, 1_000_000, 'a count'),
    fallback: 20,
  },
  invalidKeyWindowSeconds: {
    env: 'INVALID_KEY_WINDOW_SECONDS',
    file: 'invalid_key_window_seconds',
    parse: int(1, 86_400, 'seconds'),
    fallback: 300,
  },
  shutdownTimeoutMs: {
    env: 'SHUTDOWN_TIMEOUT_MS',
    file: 'shutdown_timeout_ms',
    parse: int(0, 600_000, 'milliseconds'),
    fallback: 10_000,
  },
  headersTimeoutMs: {
    env: 'HEADERS_TIMEOUT_MS',
    file: 'headers_timeout_ms',
    parse: int(100, 600_000, 'milliseconds'),
    fallback: 10_000,
  },
  requestTimeoutMs: {
    env: 'REQUEST_TIMEOUT_MS',
    file: 'request_timeout_ms',
    parse: int(100, 3_600_000, 'milliseconds'),
    fallback: 30_000,
  },
  maxHeaderBytes: {
    env: 'MAX_HEADER_BYTES',
    file: 'max_header_bytes',
    parse: int(1024, 1_048_576, 'a byte count'),
    fallback: 16_384,
  },
  maxHeaderCount: {
    env: 'MAX_HEADER_COUNT',
    file: 'max_header_count',
    parse: int(10, 10_000, 'a count of header lines'),
    fallback: 100,
  },
  trustProxyHops: {
    env: 'TRUST_PROXY_HOPS',
    file: 'trust_proxy_hops',
    parse: int(0, 10, 'a count of proxies'),
    fallback: 0,
  },
} satisfies Record<string, Field<unknown>>;

type Values = {
  -readonly [K in keyof typeof FIELDS]:
    (typeof FIELDS)[K]['fallback'] | Exclude<ReturnType<(typeof FIELDS)[K]['parse']>, { error: string }>;
};

/** Every environment variable the settings are read from (deploy manifests are held to this list). */
export const SETTING_VARIABLES: readonly string[] = ['GATEWAY_CONFIG', ...Object.values(FIELDS).map((f) => f.env)];

const FILE_KEYS = new Set<string>([...Object.values(FIELDS).map((f) => f.file), 'routing', 'credential_routes']);

export const DEFAULT_API_KEYS_FILE = 'config/api-keys.yaml';
export const DEFAULT_CREDENTIAL_ROUTES = [
  'POST /oapi/auth/gen-secret-key/underlying',
  'POST /oapi/auth/gen-secret-key/derivative',
];
export const DEFAULT_ROUTING: Record<string, BridgeName> = { 'POST /oapi/auth/gen-secret-key/derivative': 'fno' };

export interface LoadOptions {
  readonly env?: NodeJS.ProcessEnv;
  /** Where relative paths are resolved; the process's working directory by default. */
  readonly cwd?: string;
  /** Overrides the `GATEWAY_CONFIG` variable (default `config/gateway.yaml`, optional). */
  readonly configFile?: string;
}

export function loadSettings(options: LoadOptions = {}): Settings {
  const env = options.env ?? process.env;
  const cwd = options.cwd ?? process.cwd();
  const configName = options.configFile ?? env.GATEWAY_CONFIG ?? 'config/gateway.yaml';
  const configPath = resolve(cwd, configName);
  const explicitConfig = options.configFile !== undefined || env.GATEWAY_CONFIG !== undefined;

  const values = Object.fromEntries(Object.entries(FIELDS).map(([k, f]) => [k, f.fallback])) as Values;
  let routing = { defaultBridge: 'eqt' as BridgeName, routes: new Map<string, BridgeName>() };
  let routingFromFile = false;
  let credentialRoutes: string[] = DEFAULT_CREDENTIAL_ROUTES;

  if (existsSync(configPath)) {
    const { source, errors } = YamlSource.parse(configName, readFileSync(configPath, 'utf8'));
    if (errors[0]) throw new SettingsError(formatSourceError(errors[0]));
    const root = source.root;
    if (root !== null && root !== undefined) {
      if (!isYamlMap(root))
        throw new SettingsError(formatSourceError(source.error(root, 'must be a mapping of settings')));
      for (const { key, pair, value } of entries(root)) {
        const fail = (node: unknown, message: string): never => {
          throw new SettingsError(formatSourceError(source.error(node, message)));
        };
        if (!FILE_KEYS.has(key)) fail(pair.key, `unknown setting "${key}"`);
        if (key === 'routing') {
          routing = readRouting(value, fail);
          routingFromFile = true;
          continue;
        }
        if (key === 'credential_routes') {
          if (!isYamlSeq(value)) fail(value, `credential_routes must be a list of routes, got ${describe(value)}`);
          credentialRoutes = (isYamlSeq(value) ? value.items : []).map((item) => {
            const route = scalarValue(item);
            return typeof route === 'string' ? route : fail(item, `a route must be a string, got ${describe(item)}`);
          });
          continue;
        }
        const [name, field] = Object.entries(FIELDS).find(([, f]) => f.file === key) as [keyof Values, Field<unknown>];
        const raw = scalarValue(value);
        if (raw === null || raw === undefined) continue; // `key:` with no value keeps the default
        if (typeof raw !== 'string' && typeof raw !== 'number' && typeof raw !== 'boolean')
          fail(value, `${key}: expected a value, got ${describe(value)}`);
        const parsed = field.parse(raw as Raw);
        if (isError(parsed)) fail(value, `${key} ${withoutSecrets(field.env, parsed.error)}`);
        (values as Record<string, unknown>)[name] = parsed;
      }
    }
  } else if (explicitConfig) {
    throw new SettingsError(`GATEWAY_CONFIG=${configName}: file not found`);
  }

  for (const [name, field] of Object.entries(FIELDS) as Array<[keyof Values, Field<unknown>]>) {
    const raw = env[field.env];
    if (raw === undefined || raw === '') continue;
    const parsed = field.parse(raw);
    if (isError(parsed))
      throw new SettingsError(
        `${field.env}=${shown(field.env, raw)}: ${withoutSecrets(field.env, parsed.error.replace(`, got "${raw}"`, ''))}`,
      );
    (values as Record<string, unknown>)[name] = parsed;
  }

  for (const bridge of BRIDGES) {
    if (!values[bridge]) {
      throw new SettingsError(
        `${FIELDS[bridge].env} is not set: the base URL of the ${bridge} bridge is required, e.g. http://127.0.0.1:7001`,
      );
    }
  }
  if (values.redisUrl && values.redisClusterNodes)
    throw new SettingsError('REDIS_URL and REDIS_CLUSTER_NODES are both set: choose one');
  if (values.workers > 1 && !values.redisUrl && !values.redisClusterNodes) {
    throw new SettingsError(
      `WORKERS=${values.workers}: several processes must share their counters, so REDIS_URL or REDIS_CLUSTER_NODES is required`,
    );
  }
  if (RESERVED_HEADERS.has(values.apiKeyHeader.toLowerCase())) {
    throw new SettingsError(
      `API_KEY_HEADER=${values.apiKeyHeader}: that header has another meaning; choose a header of its own, such as X-API-Key`,
    );
  }
  if (!routingFromFile)
    routing = {
      defaultBridge: 'eqt',
      routes: new Map(Object.entries(DEFAULT_ROUTING).map(([r, b]) => [routeKey(r), b])),
    };

  const credentialKeys = new Set<string>();
  for (const text of credentialRoutes) {
    const route = parseRoute(text);
    if (typeof route === 'string' || route.method === 'WS')
      throw new SettingsError(`credential_routes: ${typeof route === 'string' ? route : `"${text}" is a WS route`}`);
    credentialKeys.add(route.key);
  }

  const file = (p: string): string => (isAbsolute(p) ? p : resolve(cwd, p));
  const apiKeysFile = file(values.apiKeysFile ?? DEFAULT_API_KEYS_FILE);
  if (values.apiKeysFile && !existsSync(apiKeysFile))
    throw new SettingsError(`API_KEYS_FILE=${values.apiKeysFile}: file not found`);

  return {
    port: values.port,
    host: values.host,
    adminPort: values.adminPort,
    adminHost: values.adminHost,
    adminToken: values.adminToken,
    redisUrl: values.redisUrl,
    redisClusterNodes: values.redisClusterNodes,
    redisFailureMode: values.redisFailureMode,
    redisTimeoutMs: values.redisTimeoutMs,
    redisKeyPrefix: values.redisKeyPrefix,
    limitsFile: file(values.limitsFile),
    bridges: { eqt: values.eqt as URL, fno: values.fno as URL },
    upstreamTimeoutMs: values.upstreamTimeoutMs,
    apiKeyHeader: values.apiKeyHeader,
    maxBodyBytes: values.maxBodyBytes,
    logLevel: values.logLevel,
    workers: values.workers,
    apiKeyMode: values.apiKeyMode,
    apiKeysFile,
    invalidKeyAttempts: values.invalidKeyAttempts,
    invalidKeyWindowSeconds: values.invalidKeyWindowSeconds,
    shutdownTimeoutMs: values.shutdownTimeoutMs,
    // The headers are part of the request: they can never have longer than all of it (Node refuses a longer headersTimeout).
    headersTimeoutMs: Math.min(values.headersTimeoutMs, values.requestTimeoutMs),
    requestTimeoutMs: values.requestTimeoutMs,
    maxHeaderBytes: values.maxHeaderBytes,
    maxHeaderCount: values.maxHeaderCount,
    trustProxyHops: values.trustProxyHops,
    routing,
    credentialRoutes: credentialKeys,
  };
}

function readRouting(
  node: unknown,
  fail: (node: unknown, message: string) => never,
): { defaultBridge: BridgeName; routes: Map<string, BridgeName> } {
  if (!isYamlMap(node))
    return fail(node, `routing must be a mapping with "default" and "routes", got ${describe(node)}`);
  let defaultBridge: BridgeName = 'eqt';
  const routes = new Map<string, BridgeName>();
  const bridge = (n: unknown): BridgeName => {
    const v = scalarValue(n);
    return v === 'eqt' || v === 'fno' ? v : fail(n, `a bridge is eqt or fno, got ${describe(n)}`);
  };
  for (const { key, pair, value } of entries(node)) {
    if (key === 'default') defaultBridge = bridge(value);
    else if (key === 'routes') {
      if (value === null || value === undefined || (isYamlMap(value) && value.items.length === 0)) continue;
      if (!isYamlMap(value)) fail(value, `routing.routes must map routes to bridges, got ${describe(value)}`);
      for (const { key: text, pair: routePair, value: target } of entries(value)) {
        const route = parseRoute(text);
        if (typeof route === 'string') fail(routePair.key, route);
        else routes.set(route.key, bridge(target));
      }
    } else fail(pair.key, `unknown key "${key}" in routing (expected default, routes)`);
  }
  return { defaultBridge, routes };
}

function routeKey(text: string): string {
  const route = parseRoute(text);
  if (typeof route === 'string') throw new Error(route);
  return route.key;
}

function isError(value: unknown): value is { error: string } {
  return (
    typeof value === 'object' && value !== null && 'error' in value && !(value instanceof URL) && !Array.isArray(value)
  );
}

const SECRET_SETTINGS = new Set(['ADMIN_TOKEN', 'REDIS_URL']);

/** Secrets are never echoed back in an error line: not a token, not the credentials of a URL. */
function shown(env: string, raw: string): string {
  if (env === 'ADMIN_TOKEN') return '…';
  const masked = maskCredentials(raw);
  return masked.length > 80 ? masked.slice(0, 77) + '…' : masked;
}

function withoutSecrets(env: string, message: string): string {
  return SECRET_SETTINGS.has(env) ? message.replace(/, got ".*"$/s, '') : maskCredentials(message);
}

function maskCredentials(text: string): string {
  return text.replace(/\/\/[^@/\s"]*@/g, '//…@');
}

export function bridgeFor(settings: Pick<Settings, 'routing'>, route: Route): BridgeName {
  return settings.routing.routes.get(route.key) ?? settings.routing.defaultBridge;
}
