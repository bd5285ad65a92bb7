import { mkdtempSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadSettings, SETTING_VARIABLES } from '../../src/config/settings.js';

const BRIDGES = { EQT_BRIDGE_URL: 'http://127.0.0.1:7001', FNO_BRIDGE_URL: 'http://127.0.0.1:7002' };
const empty = mkdtempSync(join(tmpdir(), 'oapi-settings-'));
const load = (env: Record<string, string>) => loadSettings({ env, cwd: empty });
const errorOf = (load: () => unknown): string => {
  try {
    load();
  } catch (err) {
    return (err as Error).message;
  }
  return 'no error';
};
const message = (env: Record<string, string>): string => errorOf(() => load(env));
/** Settings from `text` as gw.yaml, the bridges (and `env`) from the environment. */
const withFile = (text: string, env: Record<string, string> = {}) => {
  const dir = mkdtempSync(join(tmpdir(), 'oapi-settings-'));
  writeFileSync(join(dir, 'gw.yaml'), text);
  return loadSettings({ env: { ...BRIDGES, ...env }, cwd: dir, configFile: 'gw.yaml' });
};
const fileMessage = (text: string): string => errorOf(() => withFile(text));

/** Values each variable refuses, with the one line that says why. */
const REFUSED: Array<[Record<string, string>, string]> = [
  [{}, 'EQT_BRIDGE_URL is not set: the base URL of the eqt bridge is required, e.g. http://127.0.0.1:7001'],
  [
    { EQT_BRIDGE_URL: 'http://a:1' },
    'FNO_BRIDGE_URL is not set: the base URL of the fno bridge is required, e.g. http://127.0.0.1:7001',
  ],
  [{ ...BRIDGES, PORT: '99999' }, 'PORT=99999: must be a port number (0-65535)'],
  [{ ...BRIDGES, PORT: 'eighty' }, 'PORT=eighty: must be a port number (0-65535)'],
  [{ ...BRIDGES, ADMIN_PORT: '-1' }, 'ADMIN_PORT=-1: must be a port number (0-65535)'],
  [{ ...BRIDGES, REDIS_FAILURE_MODE: 'maybe' }, 'REDIS_FAILURE_MODE=maybe: must be one of insurance, open, closed'],
  [
    { ...BRIDGES, REDIS_URL: 'http://127.0.0.1:6379' },
    'REDIS_URL=http://127.0.0.1:6379: must be a redis:// or rediss:// URL',
  ],
  // ioredis would select database NaN, and the process end with a stack trace on connecting.
  [
    { ...BRIDGES, REDIS_URL: 'redis://u:hunter2@127.0.0.1:6379/counters' },
    'REDIS_URL=redis://…@127.0.0.1:6379/counters: the path must be a database number, such as redis://redis:6379/0',
  ],
  [
    // regression: the database check parsed what was no URL and ended start-up with a stack trace
    { ...BRIDGES, REDIS_URL: 'redis://[::1' },
    'REDIS_URL=redis://[::1: is not a valid URL: check its host and port',
  ],
  // regression: ioredis connected to localhost, and `redis:6379` passed the database check with "379"
  [{ ...BRIDGES, REDIS_URL: 'redis:6379' }, 'REDIS_URL=redis:6379: must name its host, such as redis://redis:6379'],
  [{ ...BRIDGES, REDIS_URL: 'redis://' }, 'REDIS_URL=redis://: must name its host, such as redis://redis:6379'],
  // regression: taken, and no connection could ever be made (every request a 502, or Redis away for good)
  [
    { ...BRIDGES, EQT_BRIDGE_URL: 'http://127.0.0.1:0' },
    'EQT_BRIDGE_URL=http://127.0.0.1:0: must name a port other than 0',
  ],
  [{ ...BRIDGES, REDIS_URL: 'redis://127.0.0.1:0' }, 'REDIS_URL=redis://127.0.0.1:0: must name a port other than 0'],
  [
    { ...BRIDGES, REDIS_URL: 'redis://127.0.0.1:6379?db=two' },
    'REDIS_URL=redis://127.0.0.1:6379?db=two: the path must be a database number, such as redis://redis:6379/0',
  ],
  [
    { ...BRIDGES, REDIS_URL: 'redis://user:secret@127.0.0.1:6379', REDIS_CLUSTER_NODES: '127.0.0.1:7000' },
    'REDIS_URL and REDIS_CLUSTER_NODES are both set: choose one',
  ],
  [{ ...BRIDGES, REDIS_CLUSTER_NODES: '127.0.0.1' }, 'REDIS_CLUSTER_NODES=127.0.0.1: "127.0.0.1" is not host:port'],
  [{ ...BRIDGES, EQT_BRIDGE_URL: 'not a url' }, 'EQT_BRIDGE_URL=not a url: must be an http:// or https:// URL'],
  [{ ...BRIDGES, FNO_BRIDGE_URL: 'ftp://x' }, 'FNO_BRIDGE_URL=ftp://x: must be an http:// or https:// URL'],
  // An http:// URL that does not parse is no wrong scheme: the line says what is wrong with it.
  [
    { ...BRIDGES, EQT_BRIDGE_URL: 'http://127.0.0.1:99999' },
    'EQT_BRIDGE_URL=http://127.0.0.1:99999: is not a valid URL: check its host and port',
  ],
  [
    { ...BRIDGES, REDIS_URL: 'redis://:secret@127.0.0.1:99999' },
    'REDIS_URL=redis://…@127.0.0.1:99999: is not a valid URL: check its host and port',
  ],
  [{ ...BRIDGES, UPSTREAM_TIMEOUT_MS: '0' }, 'UPSTREAM_TIMEOUT_MS=0: must be milliseconds (1-600000)'],
  [{ ...BRIDGES, API_KEY_HEADER: 'X API Key' }, 'API_KEY_HEADER=X API Key: must be an HTTP header name'],
  [
    { ...BRIDGES, API_KEY_HEADER: 'Authorization' },
    'API_KEY_HEADER=Authorization: that header has another meaning; choose a header of its own, such as X-API-Key',
  ],
  [{ ...BRIDGES, MAX_BODY_BYTES: '1.5' }, 'MAX_BODY_BYTES=1.5: must be a byte count (0-1073741824)'],
  [
    { ...BRIDGES, LOG_LEVEL: 'verbose' },
    'LOG_LEVEL=verbose: must be one of fatal, error, warn, info, debug, trace, silent',
  ],
  [{ ...BRIDGES, WORKERS: '0' }, 'WORKERS=0: must be a process count (1-64)'],
  [
    { ...BRIDGES, WORKERS: '4' },
    'WORKERS=4: several processes must share their counters, so REDIS_URL or REDIS_CLUSTER_NODES is required',
  ],
  [{ ...BRIDGES, API_KEY_MODE: 'open' }, 'API_KEY_MODE=open: must be one of registered, any'],
  [{ ...BRIDGES, API_KEYS_FILE: 'nope.yaml' }, 'API_KEYS_FILE=nope.yaml: file not found'],
  [
    { ...BRIDGES, ADMIN_TOKEN: 'short' },
    'ADMIN_TOKEN=…: must be at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
  ],
  // A bearer token cannot hold these (RFC 6750 §2.1): start-up refuses what the admin API would refuse.
  [
    { ...BRIDGES, ADMIN_TOKEN: 'with!exclamation-0123456789' },
    'ADMIN_TOKEN=…: must be at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
  ],
  [
    { ...BRIDGES, ADMIN_TOKEN: 'with#hash-0123456789abcdef' },
    'ADMIN_TOKEN=…: must be at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
  ],
  [
    { ...BRIDGES, ADMIN_TOKEN: 'padding=in-the-middle-0123456789' },
    'ADMIN_TOKEN=…: must be at least 16 characters of A-Z a-z 0-9 - . _ ~ + /, optionally ending in = (RFC 6750 §2.1)',
  ],
  [{ ...BRIDGES, MAX_HEADER_COUNT: '5' }, 'MAX_HEADER_COUNT=5: must be a count of header lines (10-10000)'],
  [{ ...BRIDGES, CONSUMER_ID_HEADER: 'X Consumer' }, 'CONSUMER_ID_HEADER=X Consumer: must be an HTTP header name'],
  [
    { ...BRIDGES, CONSUMER_ID_HEADER: 'Host' },
    'CONSUMER_ID_HEADER=Host: that header has another meaning; choose a header of its own, such as X-Consumer-Id',
  ],
  // Regression: accepted, and the bridge got the key id as the first address of X-Forwarded-For
  // (`X-Forwarded-For: acme-prod, 127.0.0.1`), or an `Expect` the bridge refused.
  ...['X-Forwarded-For', 'x_forwarded_host', 'Forwarded', 'X-Real-IP', 'Expect', 'X-HTTP-Method-Override'].map(
    (name): [Record<string, string>, string] => [
      { ...BRIDGES, CONSUMER_ID_HEADER: name },
      `CONSUMER_ID_HEADER=${name}: the gateway states or removes that header itself; choose a header of its own, such as X-Consumer-Id`,
    ],
  ),
  [
    { ...BRIDGES, CONSUMER_ID_HEADER: 'x-api-key' },
    'CONSUMER_ID_HEADER=x-api-key: API_KEY_HEADER is that header; choose another, or an empty value to send none',
  ],
  [
    { ...BRIDGES, API_KEY_HEADER: 'X-Consumer-Id' },
    'CONSUMER_ID_HEADER=X-Consumer-Id: API_KEY_HEADER is that header; choose another, or an empty value to send none',
  ],
  [
    { ...BRIDGES, CORS_ORIGINS: 'https://app.example.com,*' },
    'CORS_ORIGINS=https://app.example.com,*: "*" is not allowed: list the origins, such as https://app.example.com',
  ],
  ...['https://app.example.com/', 'https://app.example.com/app', 'app.example.com', 'ftp://files.example.com'].map(
    (origin): [Record<string, string>, string] => [
      { ...BRIDGES, CORS_ORIGINS: `http://localhost:3000, ${origin}` },
      `CORS_ORIGINS=http://localhost:3000, ${origin}: "${origin}" is not an origin: scheme://host[:port] as browsers send it, such as https://app.example.com`,
    ],
  ),
  [
    { ...BRIDGES, CORS_ORIGINS: 'https://App.Example.com:443' },
    'CORS_ORIGINS=https://App.Example.com:443: "https://App.Example.com:443" is not an origin: scheme://host[:port] as browsers send it, such as https://app.example.com',
  ],
];

describe('settings from the environment', () => {
  it('reads a bracketed IPv6 address of REDIS_CLUSTER_NODES as the address (regression: ioredis got "[::1]", a host name that never resolves)', () => {
    const s = load({ ...BRIDGES, REDIS_CLUSTER_NODES: '[::1]:7000,[fd00::2]:7001,redis-0:7002' });
    expect(s.redisClusterNodes).toEqual([
      { host: '::1', port: 7000 },
      { host: 'fd00::2', port: 7001 },
      { host: 'redis-0', port: 7002 },
    ]);
    expect(s.redisClusterNodes?.slice(0, 2).map((n) => isIP(n.host))).toEqual([6, 6]);
    expect(message({ ...BRIDGES, REDIS_CLUSTER_NODES: '[::1:7000' })).toBe(
      'REDIS_CLUSTER_NODES=[::1:7000: "[::1:7000" is not host:port',
    );
  });

  it('has the defaults of README "Configuration"', () => {
    const s = load(BRIDGES);
    expect(s).toMatchObject({
      port: 8080,
      host: '0.0.0.0',
      adminPort: 9090,
      adminHost: '127.0.0.1',
      adminToken: undefined,
      redisUrl: undefined,
      redisFailureMode: 'insurance',
      upstreamTimeoutMs: 10_000,
      apiKeyHeader: 'X-API-Key',
      maxBodyBytes: 1_048_576,
      logLevel: 'info',
      workers: 1,
      apiKeyMode: 'registered',
      consumerIdHeader: 'X-Consumer-Id',
      corsOrigins: [],
    });
    expect(s.limitsFile).toBe(join(empty, 'limits.yaml'));
    expect(s.routing.routes.get('POST /oapi/auth/gen-secret-key/derivative')).toBe('fno');
    expect(s.routing.defaultBridge).toBe('eqt');
  });

  it.each(REFUSED)('refuses %j with one line naming the variable', (env, expected) => {
    const text = message(env);
    expect(text).toBe(expected);
    expect(text).not.toContain('\n');
  });

  it('takes a REDIS_URL with a database number, or none', () => {
    for (const url of ['redis://h:6379', 'redis://h:6379/', 'redis://h:6379/2', 'rediss://:pw@h:6380/15?db=3'])
      expect(load({ ...BRIDGES, REDIS_URL: url }).redisUrl).toBe(url);
  });

  it('never gives the headers longer than the whole request (regression: REQUEST_TIMEOUT_MS under 10000 alone crashed start-up)', () => {
    expect(load({ ...BRIDGES, REQUEST_TIMEOUT_MS: '1000' })).toMatchObject({
      requestTimeoutMs: 1000,
      headersTimeoutMs: 1000,
    });
    expect(load({ ...BRIDGES, REQUEST_TIMEOUT_MS: '1000', HEADERS_TIMEOUT_MS: '400' })).toMatchObject({
      requestTimeoutMs: 1000,
      headersTimeoutMs: 400,
    });
  });

  it('never repeats a secret in an error', () => {
    expect(message({ ...BRIDGES, ADMIN_TOKEN: 'tiny' })).not.toContain('tiny');
    expect(message({ ...BRIDGES, REDIS_URL: 'redis://u:hunter2@h:1', REDIS_CLUSTER_NODES: 'h:1' })).not.toContain(
      'hunter2',
    );
    expect(message({ ...BRIDGES, REDIS_URL: 'http://u:hunter2@h:1' })).toBe(
      'REDIS_URL=http://…@h:1: must be a redis:// or rediss:// URL',
    );
    expect(message({ ...BRIDGES, EQT_BRIDGE_URL: 'http://svc:hunter2@eqt:8000' })).toBe(
      'EQT_BRIDGE_URL=http://…@eqt:8000: must not carry credentials',
    );
    const dir = mkdtempSync(join(tmpdir(), 'oapi-settings-'));
    writeFileSync(join(dir, 'gw.yaml'), 'admin_token: shortsecret\n');
    expect(() => loadSettings({ env: BRIDGES, cwd: dir, configFile: 'gw.yaml' })).toThrow(
      /^gw\.yaml:1:14: admin_token must be at least 16 characters of A-Z a-z 0-9 - \. _ ~ \+ \/, optionally ending in = \(RFC 6750 §2\.1\)$/,
    );
    writeFileSync(join(dir, 'gw.yaml'), 'redis_url: "http://u:hunter2@h:1"\n');
    expect(() => loadSettings({ env: BRIDGES, cwd: dir, configFile: 'gw.yaml' })).toThrow(
      /^gw\.yaml:1:12: redis_url must be a redis:\/\/ or rediss:\/\/ URL$/,
    );
  });
});

describe('the consumer id header and CORS settings', () => {
  it('reads CONSUMER_ID_HEADER from the file and the environment; an empty value turns it off', () => {
    expect(load({ ...BRIDGES, CONSUMER_ID_HEADER: 'X-Client-Id' }).consumerIdHeader).toBe('X-Client-Id');
    expect(load({ ...BRIDGES, CONSUMER_ID_HEADER: '' }).consumerIdHeader).toBeUndefined();
    expect(load({ ...BRIDGES, CONSUMER_ID_HEADER: '', API_KEY_HEADER: 'X-Consumer-Id' })).toMatchObject({
      apiKeyHeader: 'X-Consumer-Id',
      consumerIdHeader: undefined,
    });
    expect(withFile('consumer_id_header: X-Org-Id\n').consumerIdHeader).toBe('X-Org-Id');
    expect(withFile('consumer_id_header: ""\n').consumerIdHeader).toBeUndefined();
    expect(withFile('consumer_id_header:\n').consumerIdHeader).toBe('X-Consumer-Id'); // no value: the default
    expect(withFile('consumer_id_header: X-Org-Id\n', { CONSUMER_ID_HEADER: '' }).consumerIdHeader).toBeUndefined();
    expect(withFile('consumer_id_header: ""\n', { CONSUMER_ID_HEADER: 'X-Env-Id' }).consumerIdHeader).toBe('X-Env-Id');
    expect(fileMessage('consumer_id_header: X Org\n')).toBe(
      'gw.yaml:1:21: consumer_id_header must be an HTTP header name, got "X Org"',
    );
  });

  it('reads CORS_ORIGINS as a comma-separated list of origins, none when unset or empty', () => {
    expect(load({ ...BRIDGES, CORS_ORIGINS: ' https://app.example.com , http://localhost:3000,' }).corsOrigins).toEqual(
      ['https://app.example.com', 'http://localhost:3000'],
    );
    expect(load({ ...BRIDGES, CORS_ORIGINS: 'http://[::1]:8080' }).corsOrigins).toEqual(['http://[::1]:8080']);
    expect(load({ ...BRIDGES, CORS_ORIGINS: '' }).corsOrigins).toEqual([]);
    expect(withFile('cors_origins: https://app.example.com\n').corsOrigins).toEqual(['https://app.example.com']);
    expect(withFile('cors_origins: https://app.example.com\n', { CORS_ORIGINS: '' }).corsOrigins).toEqual([]);
    expect(fileMessage('cors_origins: "https://app.example.com, *"\n')).toBe(
      'gw.yaml:1:15: cors_origins "*" is not allowed: list the origins, such as https://app.example.com',
    );
    // Credentials in a URL are masked, as in every other setting.
    expect(message({ ...BRIDGES, CORS_ORIGINS: 'https://user:hunter2@app.example.com' })).toBe(
      'CORS_ORIGINS=https://…@app.example.com: "https://…@app.example.com" is not an origin: scheme://host[:port] as browsers send it, such as https://app.example.com',
    );
    expect(SETTING_VARIABLES).toEqual(expect.arrayContaining(['CONSUMER_ID_HEADER', 'CORS_ORIGINS']));
  });
});

describe('settings from gateway.yaml', () => {
  it('reads config/gateway.yaml, and the environment overrides it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-settings-'));
    writeFileSync(
      join(dir, 'gw.yaml'),
      'port: 7000\nupstream_timeout_ms: 2500\nrouting:\n  default: fno\n  routes:\n    GET /orders: eqt\n',
    );
    const s = loadSettings({ env: { ...BRIDGES, PORT: '7100' }, cwd: dir, configFile: 'gw.yaml' });
    expect(s.port).toBe(7100);
    expect(s.upstreamTimeoutMs).toBe(2500);
    expect(s.routing.defaultBridge).toBe('fno');
    expect(s.routing.routes.get('GET /orders')).toBe('eqt');
  });

  // regression: a path set in the file was named only as its variable, which the user never set
  it('names a key file or limits file it set that is not there as set there, and the variable as set in the environment', () => {
    expect(fileMessage('api_keys_file: nope.yaml\n')).toBe(
      'API_KEYS_FILE=nope.yaml (api_keys_file in gw.yaml): file not found',
    );
    expect(errorOf(() => withFile('api_keys_file: other.yaml\n', { API_KEYS_FILE: 'nope.yaml' }))).toBe(
      'API_KEYS_FILE=nope.yaml: file not found',
    );
    expect(withFile('limits_file: rules/limits.yaml\n').limitsFileOrigin).toBe('limits_file in gw.yaml');
    expect(withFile('limits_file: rules/limits.yaml\n', { LIMITS_FILE: 'x.yaml' }).limitsFileOrigin).toBeUndefined();
    expect(withFile('port: 8080\n').limitsFileOrigin).toBeUndefined();
  });

  it('names the file, line and key of a bad setting in gateway.yaml', () => {
    const dir = mkdtempSync(join(tmpdir(), 'oapi-settings-'));
    writeFileSync(join(dir, 'gw.yaml'), 'port: 8080\nredis_failure_mode: sometimes\n');
    expect(() => loadSettings({ env: BRIDGES, cwd: dir, configFile: 'gw.yaml' })).toThrow(
      'gw.yaml:2:21: redis_failure_mode must be one of insurance, open, closed, got "sometimes"',
    );
    writeFileSync(join(dir, 'gw.yaml'), 'prot: 8080\n');
    expect(() => loadSettings({ env: BRIDGES, cwd: dir, configFile: 'gw.yaml' })).toThrow(
      'gw.yaml:1:1: unknown setting "prot"',
    );
    writeFileSync(join(dir, 'gw.yaml'), 'routing:\n  routes:\n    GET /orders: xyz\n');
    expect(() => loadSettings({ env: BRIDGES, cwd: dir, configFile: 'gw.yaml' })).toThrow(
      'gw.yaml:3:18: a bridge is eqt or fno, got "xyz"',
    );
  });

  it('refuses the keys an object schema leaves out as unknown settings (regression: __proto__, constructor and prototype passed)', () => {
    expect(fileMessage('port: 8080\nconstructor: 1\n')).toBe('gw.yaml:2:1: unknown setting "constructor"');
    expect(fileMessage('routing:\n  default: eqt\n  __proto__: fno\n')).toBe(
      'gw.yaml:3:3: unknown key "__proto__" in routing (expected default, routes)',
    );
    // regression: a route keyed so was passed over without a word by the record of routing.routes
    expect(fileMessage('routing:\n  routes:\n    GET /orders: eqt\n    constructor: fno\n')).toMatch(
      /^gw\.yaml:4:5: route "constructor"/,
    );
  });

  it('names the line and column of every kind of problem in gateway.yaml, the first in the file first', () => {
    expect(fileMessage('prot: 1\nport: 99999\n')).toBe('gw.yaml:1:1: unknown setting "prot"');
    expect(fileMessage('port: 99999\nprot: 1\n')).toBe(
      'gw.yaml:1:7: port must be a port number (0-65535), got "99999"',
    );
    expect(fileMessage('port: [8080]\n')).toBe('gw.yaml:1:7: port must be a single value, got a list');
    expect(fileMessage('- port: 8080\n')).toBe('gw.yaml:1:1: must be a mapping of settings');
    expect(fileMessage('redis_cluster_nodes: "a:1,b"\n')).toBe(
      'gw.yaml:1:22: redis_cluster_nodes "b" is not host:port',
    );
    expect(fileMessage('routing:\n  default: fno\n  route: {}\n')).toBe(
      'gw.yaml:3:3: unknown key "route" in routing (expected default, routes)',
    );
    expect(fileMessage('routing:\n  routes:\n    GET /orders/: eqt\n')).toBe(
      'gw.yaml:3:5: route "GET /orders/": empty path segment (repeated or trailing "/")',
    );
    expect(fileMessage('routing:\n  routes:\n    GET /orders/{id}: fno\n    GET /orders/{orderId}: eqt\n')).toBe(
      'gw.yaml:4:5: route "GET /orders/{orderId}" is already set by "GET /orders/{id}"',
    );
    expect(fileMessage('credential_routes:\n  - POST /a\n  - WS /ws/orders\n')).toBe(
      'gw.yaml:3:5: "WS /ws/orders" is a WS route',
    );
    expect(fileMessage('credential_routes: POST /a\n')).toBe(
      'gw.yaml:1:20: credential_routes must be a list of routes, got "POST /a"',
    );
  });

  it('keeps the default of a key with no value, and reads empty routing as routing everything to its default', () => {
    const s = withFile('port:\nrouting:\n  default: fno\n  routes:\ncredential_routes: []\n');
    expect(s.port).toBe(8080);
    expect(s.routing.defaultBridge).toBe('fno');
    expect(s.routing.routes.size).toBe(0);
    expect(s.credentialRoutes.size).toBe(0);
  });

  it('ships a config/gateway.yaml that loads', () => {
    const s = loadSettings({ env: BRIDGES, cwd: process.cwd() });
    expect(s.credentialRoutes).toEqual(
      new Set(['POST /oapi/auth/gen-secret-key/underlying', 'POST /oapi/auth/gen-secret-key/derivative']),
    );
    expect(s.routing.routes.get('POST /oapi/auth/gen-secret-key/derivative')).toBe('fno');
  });
});
