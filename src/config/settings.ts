import { existsSync, readFileSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import * as v from 'valibot';
import type { FailureMode } from '../limits/limiter.js';
import type { LogLevel } from '../observability/logger.js';
import { parseRoute, type Route } from '../limits/route.js';
import { isGatewayField } from '../lib/gateway-fields.js';
import { formatSourceError, YamlSource } from '../lib/yaml-source.js';
import { closed, describe, got, issuesOf, mapping, record, sourceErrors, type Issue } from '../lib/yaml-schema.js';
import { ROUTE, ROUTE_TEXT } from './load-limits.js';

/**
 * Settings of one gateway process: `config/gateway.yaml`, overridden by the environment
 * (README "Configuration"). Checked once at start-up; a bad value stops start-up with one line
 * naming the variable (or the file, line and key) and what is wrong with it.
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
  /**
   * Where `config/gateway.yaml` set the limits file (`limits_file in config/gateway.yaml`), for its
   * error line; undefined when the environment or the default did.
   */
  readonly limitsFileOrigin: string | undefined;
  readonly bridges: Readonly<Record<BridgeName, URL>>;
  readonly upstreamTimeoutMs: number;
  readonly apiKeyHeader: string;
  /** The header that tells a bridge the id of an issued key; undefined: none is sent. */
  readonly consumerIdHeader: string | undefined;
  /** Browser origins answered with CORS headers (`scheme://host[:port]`); empty: no CORS. */
  readonly corsOrigins: readonly string[];
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
  /** Routes whose body must be JSON credentials (README "Configuration", `credential_routes`). */
  readonly credentialRoutes: ReadonlySet<string>;
}

export class SettingsError extends Error {
  override name = 'SettingsError';
}

/*
 * A setting is one scalar, a string from the environment or a YAML string, number or boolean
 * from the file. Messages name the value as `got "…"`; a line about the environment drops that
 * part, since it shows the value first (`PORT=99999: must be a port number (0-65535)`).
 */
type Raw = string | number | boolean;
const SCALAR = v.custom<Raw>(
  (raw) => ['string', 'number', 'boolean'].includes(typeof raw),
  (issue) => `must be a single value, got ${describe(issue.input)}`,
);
const asText = v.pipe(SCALAR, v.transform(String));
const mustBe = (what: string) => (issue: { input: unknown }) => `must be ${what}, got "${String(issue.input)}"`;

const int = (min: number, max: number, what: string) =>
  v.pipe(
    asText,
    v.check((s) => /^\s*\d+\s*$/.test(s) && Number(s) >= min && Number(s) <= max, mustBe(`${what} (${min}-${max})`)),
    v.transform(Number),
  );
const port = int(0, 65535, 'a port number');
const text = (what: string, pattern = /./) =>
  v.pipe(
    asText,
    v.check((s) => pattern.test(s.trim()), mustBe(what)),
    v.transform((s) => s.trim()),
  );
const oneOf = <const T extends string>(values: readonly T[]) =>
  v.pipe(asText, v.picklist(values, mustBe(`one of ${values.join(', ')}`)));

const urlOf = (text: string): URL | undefined => (URL.canParse(text) ? new URL(text) : undefined);
const protocolOf = (url: string): string | undefined => urlOf(url)?.protocol;
/** The scheme a URL is written with, valid or not (`http:` of `http://h:99999`, which names no port). */
const schemeOf = (url: string): string => /^[A-Za-z][A-Za-z0-9+.-]*:/.exec(url)?.[0].toLowerCase() ?? '';
const NOT_A_URL = 'is not a valid URL: check its host and port';
/** Port 0 is no port a server listens on: every connection to it fails (a listener's `PORT=0` takes a free port). */
const NO_PORT_ZERO = 'must name a port other than 0';
const HOST = /^[A-Za-z0-9.:\-[\]]+$/;
// RFC 9110 §5.1: a field name is a token.
const HEADER_TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** Headers a request needs for itself, or that the gateway reads: no setting may name one of them. */
const RESERVED_HEADERS = new Set([
  ...['host', 'connection', 'content-length', 'content-type', 'transfer-encoding', 'upgrade', 'te', 'trailer'],
  ...['keep-alive', 'authorization', 'x-otp-token', 'x-request-id'],
]);

const bridgeUrl = v.pipe(
  asText,
  v.check((s) => /^https?:$/.test(schemeOf(s.trim())), mustBe('an http:// or https:// URL')),
  v.check((s) => URL.canParse(s.trim()), NOT_A_URL),
  v.transform((s) => new URL(s.trim())),
  v.check((url) => !url.username && !url.password, 'must not carry credentials'),
  v.check((url) => !url.search && !url.hash, 'must not have a query or fragment'),
  v.check((url) => url.port !== '0', NO_PORT_ZERO),
);

const redisUrl = v.pipe(
  asText,
  v.transform((s) => s.trim()),
  v.check((s) => /^rediss?:$/.test(schemeOf(s)), 'must be a redis:// or rediss:// URL'),
  v.check((s) => URL.canParse(s), NOT_A_URL),
  // (A text that is no URL at all has its message from the check above, and passes the two below.)
  // Without a host ioredis connects to localhost, whatever else the text says (`redis:6379`).
  v.check((s) => urlOf(s)?.hostname !== '', 'must name its host, such as redis://redis:6379'),
  v.check((s) => urlOf(s)?.port !== '0', NO_PORT_ZERO),
  // ioredis reads the path (or a `db` parameter) as the database number, and selects NaN for any
  // other text: the first connection then ends the process with a stack trace.
  v.check((s) => {
    const url = urlOf(s);
    return !url || /^\d*$/.test(url.pathname.slice(1) || (url.searchParams.get('db') ?? ''));
  }, 'the path must be a database number, such as redis://redis:6379/0'),
);

/** A comma-separated list, blanks dropped. */
const list = v.pipe(
  asText,
  v.transform((s) => s.split(',').flatMap((item) => item.trim() || [])),
);

const clusterNodes = v.pipe(
  list,
  v.nonEmpty('must list host:port,host:port,…'),
  v.array(
    v.pipe(
      v.string(),
      v.rawTransform(({ dataset: { value: node }, addIssue, NEVER }) => {
        // An IPv6 address is written in brackets (RFC 3986 §3.2.2), and given to ioredis without
        // them: it looks `[::1]` up as a host name, which never resolves.
        const [, bracketed, plain, port] = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9.:-]+)):(\d{1,5})$/.exec(node) ?? [];
        const host = bracketed ?? plain;
        if (host && Number(port) >= 1 && Number(port) <= 65535) return { host, port: Number(port) };
        addIssue({ message: `"${node}" is not host:port` });
        return NEVER;
      }),
    ),
  ),
);

/** An empty value turns the header off. */
const headerOrNone = v.pipe(
  asText,
  v.check((s) => s.trim() === '' || HEADER_TOKEN.test(s.trim()), mustBe('an HTTP header name')),
  v.transform((s) => s.trim() || undefined),
);

// An origin as a browser sends it in `Origin` (RFC 6454 §6.2, ASCII serialization): `http(s)://host[:port]`.
const corsOrigins = v.pipe(
  list,
  v.array(
    v.pipe(
      v.string(),
      v.check((origin) => origin !== '*', '"*" is not allowed: list the origins, such as https://app.example.com'),
      v.check(
        (origin) => /^https?:$/.test(protocolOf(origin) ?? '') && new URL(origin).origin === origin,
        (issue) =>
          `"${issue.input}" is not an origin: scheme://host[:port] as browsers send it, such as https://app.example.com`,
      ),
    ),
  ),
);

const DEFAULT_FAILURE_MODE: FailureMode = 'insurance';
const DEFAULT_LOG_LEVEL: LogLevel = 'info';
const DEFAULT_API_KEY_MODE: ApiKeyMode = 'registered';

interface Field<T> {
  /** The variable; its key in the file is the same in lower case (README "Configuration"). */
  readonly env: string;
  readonly schema: v.GenericSchema<unknown, T>;
  readonly fallback: T;
  /** An empty variable is a value (it turns the setting off), not an unset one. */
  readonly blank?: boolean;
}

const FIELDS = {
  port: { env: 'PORT', schema: port, fallback: 8080 },
  host: { env: 'HOST', schema: text('a host name or address', HOST), fallback: '0.0.0.0' },
  adminPort: { env: 'ADMIN_PORT', schema: port, fallback: 9090 },
  adminHost: { env: 'ADMIN_HOST', schema: text('a host name or address', HOST), fallback: '127.0.0.1' },
  adminToken: {
    env: 'ADMIN_TOKEN',
    // RFC 6750 §2.1 b64token: what a bearer token may hold, so that every token accepted here is one the admin API accepts.
    schema: text(
      'at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
      /^[A-Za-z0-9._~+/-]{16,}=*$/,
    ),
    fallback: undefined,
  },
  redisUrl: { env: 'REDIS_URL', schema: redisUrl, fallback: undefined },
  redisClusterNodes: { env: 'REDIS_CLUSTER_NODES', schema: clusterNodes, fallback: undefined },
  redisFailureMode: {
    env: 'REDIS_FAILURE_MODE',
    schema: oneOf<FailureMode>(['insurance', 'open', 'closed']),
    fallback: DEFAULT_FAILURE_MODE,
  },
  redisTimeoutMs: { env: 'REDIS_TIMEOUT_MS', schema: int(10, 60_000, 'milliseconds'), fallback: 200 },
  redisKeyPrefix: {
    env: 'REDIS_KEY_PREFIX',
    schema: text('a key prefix without spaces or braces', /^[^\s{}]{1,64}$/),
    fallback: 'oapi:',
  },
  limitsFile: { env: 'LIMITS_FILE', schema: text('a file path'), fallback: 'limits.yaml' },
  eqt: { env: 'EQT_BRIDGE_URL', schema: bridgeUrl, fallback: undefined },
  fno: { env: 'FNO_BRIDGE_URL', schema: bridgeUrl, fallback: undefined },
  upstreamTimeoutMs: { env: 'UPSTREAM_TIMEOUT_MS', schema: int(1, 600_000, 'milliseconds'), fallback: 10_000 },
  apiKeyHeader: { env: 'API_KEY_HEADER', schema: text('an HTTP header name', HEADER_TOKEN), fallback: 'X-API-Key' },
  consumerIdHeader: { env: 'CONSUMER_ID_HEADER', schema: headerOrNone, fallback: 'X-Consumer-Id', blank: true },
  corsOrigins: { env: 'CORS_ORIGINS', schema: corsOrigins, fallback: [], blank: true },
  maxBodyBytes: { env: 'MAX_BODY_BYTES', schema: int(0, 1024 ** 3, 'a byte count'), fallback: 1_048_576 },
  logLevel: {
    env: 'LOG_LEVEL',
    schema: oneOf<LogLevel>(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
    fallback: DEFAULT_LOG_LEVEL,
  },
  workers: { env: 'WORKERS', schema: int(1, 64, 'a process count'), fallback: 1 },
  apiKeyMode: { env: 'API_KEY_MODE', schema: oneOf<ApiKeyMode>(['registered', 'any']), fallback: DEFAULT_API_KEY_MODE },
  apiKeysFile: { env: 'API_KEYS_FILE', schema: text('a file path'), fallback: undefined },
  invalidKeyAttempts: { env: 'INVALID_KEY_MAX_ATTEMPTS', schema: int(1, 1_000_000, 'a count'), fallback: 20 },
  invalidKeyWindowSeconds: { env: 'INVALID_KEY_WINDOW_SECONDS', schema: int(1, 86_400, 'seconds'), fallback: 300 },
  shutdownTimeoutMs: { env: 'SHUTDOWN_TIMEOUT_MS', schema: int(0, 600_000, 'milliseconds'), fallback: 10_000 },
  headersTimeoutMs: { env: 'HEADERS_TIMEOUT_MS', schema: int(100, 600_000, 'milliseconds'), fallback: 10_000 },
  requestTimeoutMs: { env: 'REQUEST_TIMEOUT_MS', schema: int(100, 3_600_000, 'milliseconds'), fallback: 30_000 },
  maxHeaderBytes: { env: 'MAX_HEADER_BYTES', schema: int(1024, 1_048_576, 'a byte count'), fallback: 16_384 },
  maxHeaderCount: { env: 'MAX_HEADER_COUNT', schema: int(10, 10_000, 'a count of header lines'), fallback: 100 },
  trustProxyHops: { env: 'TRUST_PROXY_HOPS', schema: int(0, 10, 'a count of proxies'), fallback: 0 },
} satisfies Record<string, Field<unknown>>;

type Values = {
  -readonly [K in keyof typeof FIELDS]: (typeof FIELDS)[K]['fallback'] | v.InferOutput<(typeof FIELDS)[K]['schema']>;
};
const FIELD_LIST = Object.entries(FIELDS) as Array<[keyof Values, Field<unknown>]>;

/** Every environment variable the settings are read from (deploy manifests are held to this list). */
export const SETTING_VARIABLES: readonly string[] = ['GATEWAY_CONFIG', ...FIELD_LIST.map(([, f]) => f.env)];

export const DEFAULT_API_KEYS_FILE = 'config/api-keys.yaml';
export const DEFAULT_CREDENTIAL_ROUTES = [
  'POST /oapi/auth/gen-secret-key/underlying',
  'POST /oapi/auth/gen-secret-key/derivative',
];
export const DEFAULT_ROUTING: Record<string, BridgeName> = { 'POST /oapi/auth/gen-secret-key/derivative': 'fno' };

const BRIDGE = v.picklist(BRIDGES, got('a bridge is eqt or fno'));
const ROUTING = closed(
  {
    default: v.optional(BRIDGE, 'eqt'),
    routes: v.nullish(
      v.pipe(
        mapping(got('routing.routes must map routes to bridges')),
        record(ROUTE_TEXT, BRIDGE, (key) => `route "${key}" must be "METHOD /path"`),
        v.rawCheck(({ dataset, addIssue }) => {
          if (!dataset.typed) return;
          // `GET /orders/{id}` and `GET /orders/{orderId}` are one route: a second bridge for it would
          // silently win (the limit table and its plans refuse a route set twice as well).
          const input = dataset.value;
          const first = new Map<string, string>();
          for (const [text, value] of Object.entries(input)) {
            const key = (parseRoute(text) as Route).key;
            const earlier = first.get(key);
            if (earlier === undefined) first.set(key, text);
            else
              addIssue({
                message: `route "${text}" is already set by "${earlier}"`,
                path: [{ type: 'object', origin: 'key', input, key: text, value }],
              });
          }
        }),
        v.transform(
          (routes) => new Map(Object.entries(routes).map(([r, bridge]) => [(parseRoute(r) as Route).key, bridge])),
        ),
      ),
      {},
    ),
  },
  got('routing must be a mapping with "default" and "routes"'),
  (key) => `unknown key "${key}" in routing (expected default, routes)`,
);
const CREDENTIAL_ROUTES = v.array(
  v.pipe(
    ROUTE,
    v.check(
      (route) => route.method !== 'WS',
      (issue) => `"${issue.input.text}" is a WS route`,
    ),
  ),
  got('credential_routes must be a list of routes'),
);

/** `gateway.yaml`: each setting under its key (`key:` with no value keeps the default), and the two mappings of its own. */
const FILE = v.nullish(
  closed(
    {
      ...Object.fromEntries(FIELD_LIST.map(([, f]) => [f.env.toLowerCase(), v.nullish(f.schema)])),
      routing: v.optional(ROUTING, { routes: DEFAULT_ROUTING }),
      credential_routes: v.optional(CREDENTIAL_ROUTES, DEFAULT_CREDENTIAL_ROUTES),
    },
    () => 'must be a mapping of settings',
    (key) => `unknown setting "${key}"`,
  ),
  {},
);

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
  const fromFile = readConfigFile(options.configFile ?? env.GATEWAY_CONFIG, cwd);
  const values = Object.fromEntries(FIELD_LIST.map(([name, f]) => [name, f.fallback])) as Values;
  const fromEnv = fromEnvironment(env);
  Object.assign(values, fromFile.values, fromEnv);
  checkTogether(values);
  // A path the file set is named as such too: it is read from the working directory, not the file's.
  const originOf = (name: 'limitsFile' | 'apiKeysFile'): string | undefined =>
    fromEnv[name] === undefined && fromFile.values[name] !== undefined
      ? `${FIELDS[name].env.toLowerCase()} in ${fromFile.name}`
      : undefined;

  const file = (p: string): string => (isAbsolute(p) ? p : resolve(cwd, p));
  const apiKeysFile = file(values.apiKeysFile ?? DEFAULT_API_KEYS_FILE);
  if (values.apiKeysFile && !existsSync(apiKeysFile)) {
    const origin = originOf('apiKeysFile');
    throw new SettingsError(`API_KEYS_FILE=${values.apiKeysFile}${origin ? ` (${origin})` : ''}: file not found`);
  }
  const { eqt, fno, ...rest } = values;
  return {
    ...rest,
    limitsFile: file(values.limitsFile),
    limitsFileOrigin: originOf('limitsFile'),
    bridges: { eqt: eqt as URL, fno: fno as URL },
    apiKeysFile,
    // The headers are part of the request: they can never have longer than all of it (Node refuses a longer headersTimeout).
    headersTimeoutMs: Math.min(values.headersTimeoutMs, values.requestTimeoutMs),
    routing: { defaultBridge: fromFile.routing.default, routes: fromFile.routing.routes },
    credentialRoutes: new Set(fromFile.credentialRoutes.map((route) => route.key)),
  };
}

/**
 * What `npx oapi-gateway openapi` needs of the settings, which needs no other: `API_KEY_HEADER` as the
 * gateway takes it (the environment, else `config/gateway.yaml`, else its default) and the file's
 * `credential_routes` (as route keys), so that it prints what the admin listener's `/openapi.json` serves.
 */
export function openApiSettings(
  env: NodeJS.ProcessEnv = process.env,
  cwd = process.cwd(),
): { apiKeyHeader: string; credentialRoutes: ReadonlySet<string> } {
  const file = readConfigFile(env.GATEWAY_CONFIG, cwd);
  const fromFile = file.values.apiKeyHeader;
  return {
    apiKeyHeader:
      env.API_KEY_HEADER?.trim() || (typeof fromFile === 'string' ? fromFile : FIELDS.apiKeyHeader.fallback),
    credentialRoutes: new Set(file.credentialRoutes.map((route) => route.key)),
  };
}

/** The settings file: the values of the settings it sets, its routing and its credential routes (or their defaults). */
function readConfigFile(name: string | undefined, cwd: string) {
  const configName = name ?? 'config/gateway.yaml';
  const path = resolve(cwd, configName);
  if (name !== undefined && !existsSync(path)) throw new SettingsError(`GATEWAY_CONFIG=${configName}: file not found`);
  const { source, errors } = YamlSource.parse(configName, existsSync(path) ? readFileSync(path, 'utf8') : '');
  if (errors[0]) throw new SettingsError(formatSourceError(errors[0]));
  const result = v.safeParse(FILE, source.data);
  if (!result.success)
    throw new SettingsError(
      sourceErrors(source, issuesOf(result.issues).map(withSettingName)).map(formatSourceError)[0],
    );
  const written = (source.data ?? {}) as Record<string, unknown>;
  const values: Partial<Record<keyof Values, unknown>> = {};
  for (const [name, { env }] of FIELD_LIST) {
    if (written[env.toLowerCase()] != null) values[name] = result.output[env.toLowerCase()];
  }
  return {
    name: configName,
    values,
    routing: result.output.routing,
    credentialRoutes: result.output.credential_routes,
  };
}

/** A setting's issue in the file reads `key message`, without the value when it is a secret. */
function withSettingName(issue: Issue): Issue {
  const [key] = issue.path;
  const field = FIELD_LIST.find(([, f]) => f.env.toLowerCase() === key)?.[1];
  if (!field || issue.key) return issue;
  return { ...issue, message: `${key} ${withoutSecrets(field.env, issue.message)}` };
}

function fromEnvironment(env: NodeJS.ProcessEnv): Partial<Values> {
  const values: Partial<Record<keyof Values, unknown>> = {};
  for (const [name, field] of FIELD_LIST) {
    const raw = env[field.env];
    if (raw === undefined || (raw === '' && !field.blank)) continue;
    const result = v.safeParse(field.schema, raw);
    if (result.issues) {
      const message = withoutSecrets(field.env, result.issues[0].message.replace(`, got "${raw}"`, ''));
      throw new SettingsError(`${field.env}=${shown(field.env, raw)}: ${message}`);
    }
    values[name] = result.output;
  }
  return values as Partial<Values>;
}

/** Settings that are each fine but do not go together. */
function checkTogether(values: Values): void {
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
  const ownHeader = (env: string, header: string, example: string): void => {
    if (RESERVED_HEADERS.has(header.toLowerCase()))
      throw new SettingsError(
        `${env}=${header}: that header has another meaning; choose a header of its own, such as ${example}`,
      );
  };
  ownHeader('API_KEY_HEADER', values.apiKeyHeader, 'X-API-Key');
  if (values.consumerIdHeader === undefined) return;
  ownHeader('CONSUMER_ID_HEADER', values.consumerIdHeader, 'X-Consumer-Id');
  // A consumer field of such a name would sit beside the gateway's own value
  // (`X-Forwarded-For: acme-prod, 198.51.100.7`), or be one a bridge must never act on; read with
  // underscores as dashes, as the forwarder reads a client's fields.
  if (isGatewayField(values.consumerIdHeader.toLowerCase().replaceAll('_', '-'))) {
    throw new SettingsError(
      `CONSUMER_ID_HEADER=${values.consumerIdHeader}: the gateway states or removes that header itself; choose a header of its own, such as X-Consumer-Id`,
    );
  }
  if (values.consumerIdHeader.toLowerCase() === values.apiKeyHeader.toLowerCase()) {
    throw new SettingsError(
      `CONSUMER_ID_HEADER=${values.consumerIdHeader}: API_KEY_HEADER is that header; choose another, or an empty value to send none`,
    );
  }
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
