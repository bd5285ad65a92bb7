import { limitsFor, type LimitRow, type LimitTable, type RowLimits } from '../limits/limit-table.js';
import { DEFAULT_CREDENTIAL_ROUTES } from '../config/settings.js';
import { USAGE_HEADER_NAMES } from '../limits/headers.js';
import { parseRoute, type Route } from '../limits/route.js';
import {
  ERROR_SCHEMA,
  errorExample,
  jsonContent,
  OPENAPI_VERSION,
  ref,
  type Json,
  type OpenApiDocument,
  type OpenApiOperation,
  type OpenApiPathItem,
  type OperationMethod,
} from './common.js';

/**
 * The OpenAPI 3.1 document of the public API, generated from a limit table: one operation per
 * route of every row (its `also` routes included), each with its row's numbers in `x-ratelimit`,
 * the API-key security scheme, the usage headers and the gateway's own answers (README
 * "Headers and answers"). What the bridges answer is passed through and not known here, so it
 * is described as any JSON; only the token set of the two token operations is known.
 *
 * WebSocket rows (`WS /path`) become a `GET` with `x-websocket: true`, a required
 * `Upgrade: websocket` header and a `101` answer: that is the request a client sends. Should a
 * table also have a plain `GET` row on the same path, the WebSocket operation goes under the
 * path item's `x-websocket` extension instead, as a path item holds one `get`.
 */

export interface PublicOpenApiOptions {
  /** `API_KEY_HEADER`: the header that carries the API key. */
  readonly apiKeyHeader: string;
  /** The gateway's version (package.json), the document's `info.version`. */
  readonly version: string;
  /**
   * Routes whose body must be JSON credentials (`credential_routes` of config/gateway.yaml, as
   * route texts or canonical keys); the two token operations by default.
   */
  readonly credentialRoutes?: Iterable<string>;
}

/** `x-ratelimit` of an operation: its row's numbers per API key, and per plan. */
export interface RateLimitExtension {
  readonly per_hour: number;
  readonly per_day: number;
  readonly plans?: Readonly<Record<string, { readonly per_hour: number; readonly per_day: number }>>;
}

const USAGE_HEADERS = [...USAGE_HEADER_NAMES, 'X-Request-Id'] as const;

export function publicOpenApi(table: LimitTable, options: PublicOpenApiOptions): OpenApiDocument {
  const { paths, templates } = describePaths(table, options);
  return {
    openapi: OPENAPI_VERSION,
    info: {
      title: 'oapi-gateway public API',
      version: options.version,
      description: infoDescription(table, options.apiKeyHeader),
      'x-limits': { hash: table.hash, timezone: table.timezone },
    },
    security: [{ ApiKey: [] }],
    paths,
    components: {
      securitySchemes: {
        ApiKey: {
          type: 'apiKey',
          in: 'header',
          name: options.apiKeyHeader,
          description: 'Your API key. Missing or not issued: `401`.',
        },
        ApiKeyQuery: {
          type: 'apiKey',
          in: 'query',
          name: 'api_key',
          description:
            'On WebSocket routes only (a browser cannot set headers on a WebSocket): the key as a query parameter, removed before forwarding.',
        },
      },
      parameters: parametersOf(templates.values()),
      headers: HEADERS,
      schemas: SCHEMAS,
      responses: RESPONSES,
    },
  };
}

interface PathTemplate {
  readonly path: string;
  readonly names: string[];
}

/** One path item per path of the table, one operation per route. */
function describePaths(
  table: LimitTable,
  options: PublicOpenApiOptions,
): { paths: Record<string, OpenApiPathItem>; templates: Map<string, PathTemplate> } {
  const credentialKeys = new Set([...(options.credentialRoutes ?? DEFAULT_CREDENTIAL_ROUTES)].map(routeKeyOf));
  const hasPlans = table.plans.size > 0;
  const paths: Record<string, OpenApiPathItem> = {};
  // Paths that differ only in parameter names are one path to OpenAPI (and to the gateway's
  // matcher): the first route written for it names the parameters.
  const templates = new Map<string, PathTemplate>();
  const getPaths = new Set<string>();
  for (const row of table.rows)
    for (const route of [row.route, ...row.also]) if (route.method === 'GET') getPaths.add(canonicalPath(route));
  const operationIds = new Set<string>();

  for (const row of table.rows) {
    for (const route of [row.route, ...row.also]) {
      const canonical = canonicalPath(route);
      let template = templates.get(canonical);
      if (!template) {
        template = { path: route.path, names: paramNames(route) };
        templates.set(canonical, template);
        paths[template.path] = template.names.length
          ? { parameters: template.names.map((name) => ref('parameters', pathParameterName(name))) }
          : {};
      }
      const item = paths[template.path] as OpenApiPathItem;
      const operation = describeOperation(table, row, route, {
        credential: credentialKeys.has(route.key),
        hasPlans,
        operationId: uniqueId(operationIdOf(route), operationIds),
      });
      if (route.method !== 'WS') item[route.method.toLowerCase() as OperationMethod] = operation;
      else if (getPaths.has(canonical)) item['x-websocket'] = operation;
      else item.get = operation;
    }
  }
  return { paths, templates };
}

function parametersOf(templates: Iterable<PathTemplate>): Record<string, Json> {
  const parameters: Record<string, Json> = {
    RequestId: {
      name: 'X-Request-Id',
      in: 'header',
      required: false,
      description:
        'Your own request id, kept and passed to the bridge when it is 1-128 characters of `A-Za-z0-9._:-`; otherwise the gateway makes one. Either way it comes back in `X-Request-Id`.',
      schema: { type: 'string' },
    },
    Upgrade: {
      name: 'Upgrade',
      in: 'header',
      required: true,
      description: 'A WebSocket channel is opened with an HTTP/1.1 upgrade (RFC 6455).',
      schema: { type: 'string', enum: ['websocket'] },
    },
  };
  for (const { names } of templates) {
    for (const name of names) {
      parameters[pathParameterName(name)] = {
        name,
        in: 'path',
        required: true,
        description: 'One non-empty path segment.',
        schema: { type: 'string', minLength: 1 },
      };
    }
  }
  return parameters;
}

interface OperationKind {
  readonly credential: boolean;
  readonly hasPlans: boolean;
  readonly operationId: string;
}

function describeOperation(table: LimitTable, row: LimitRow, route: Route, how: OperationKind): OpenApiOperation {
  const ws = route.method === 'WS';
  const operation: OpenApiOperation = {
    operationId: how.operationId,
    summary: row.name,
    description: operationText(row, route, how),
    parameters: ws ? [ref('parameters', 'Upgrade'), ref('parameters', 'RequestId')] : [ref('parameters', 'RequestId')],
    responses: responsesOf(ws, how.credential),
    'x-ratelimit': rateLimitOf(table, row, how.hasPlans),
  };
  if (how.credential) {
    operation.requestBody = { required: true, content: jsonContent(ref('schemas', 'Credentials')) };
  } else if (route.method === 'POST' || route.method === 'PUT' || route.method === 'PATCH') {
    operation.requestBody = {
      required: false,
      description: 'Passed to the bridge byte for byte.',
      content: jsonContent(ref('schemas', 'BridgeBody')),
    };
  }
  if (ws) {
    operation.security = [{ ApiKey: [] }, { ApiKeyQuery: [] }];
    operation['x-websocket'] = true;
  }
  if (route !== row.route) operation['x-ratelimit-row'] = row.route.text;
  if (row.shadow) operation['x-ratelimit-shadow'] = true;
  return operation;
}

function operationText(row: LimitRow, route: Route, how: OperationKind): string {
  const ws = route.method === 'WS';
  const unit = ws ? 'connections opened' : 'requests';
  const lines = [
    `Counted per API key against the row \`${row.route.text}\` (${row.name}): ${row.limits.perHour} ${unit} per clock hour and ${row.limits.perDay} per day${how.hasPlans ? ', or the numbers of the key’s plan (`x-ratelimit`)' : ''}.`,
  ];
  const sharing = [row.route, ...row.also].filter((r) => r !== route).map((r) => `\`${r.text}\``);
  if (sharing.length) lines.push(`Shares these counters with ${sharing.join(', ')}.`);
  if (row.shadow) lines.push('A shadow row: counted and reported in the usage headers, never refused.');
  if (ws)
    lines.push(
      'A WebSocket channel: send a `GET` with `Upgrade: websocket`. The `101` carries the usage headers; frames then flow both ways untouched. A refusal is an HTTP answer to the upgrade, and no socket is opened.',
    );
  if (how.credential)
    lines.push(
      'The body must be a JSON object with non-empty string `username` and `password` (`415` without `Content-Type: application/json`, `400` otherwise). A failed login is the bridge’s own error body, passed through.',
    );
  return lines.join('\n\n');
}

function rateLimitOf(table: LimitTable, row: LimitRow, hasPlans: boolean): RateLimitExtension {
  const numbers = (limits: RowLimits): { per_hour: number; per_day: number } => ({
    per_hour: limits.perHour,
    per_day: limits.perDay,
  });
  return {
    ...numbers(row.limits),
    ...(hasPlans
      ? {
          plans: Object.fromEntries(
            [...table.plans.keys()].map((plan) => [plan, numbers(limitsFor(table, row, plan))]),
          ),
        }
      : {}),
  };
}

function responsesOf(ws: boolean, credential: boolean): Record<string, Json> {
  const gateway = {
    '401': ref('responses', 'Unauthorized'),
    '404': ref('responses', 'NotFound'),
  };
  const tail = {
    '429': ref('responses', 'TooManyRequests'),
    '502': ref('responses', 'BadGateway'),
    '503': ref('responses', 'ServiceUnavailable'),
    '504': ref('responses', 'GatewayTimeout'),
  };
  if (ws) {
    return {
      '101': ref('responses', 'SwitchingProtocols'),
      '400': ref('responses', 'BadRequest'),
      ...gateway,
      '426': ref('responses', 'UpgradeRequired'),
      ...tail,
    };
  }
  return {
    '200': ref('responses', credential ? 'TokenSet' : 'BridgeAnswer'),
    '400': ref('responses', credential ? 'CredentialsBadRequest' : 'BadRequest'),
    ...gateway,
    '405': ref('responses', 'MethodNotAllowed'),
    '408': ref('responses', 'RequestTimeout'),
    '413': ref('responses', 'ContentTooLarge'),
    ...(credential ? { '415': ref('responses', 'UnsupportedMediaType') } : {}),
    ...tail,
    default: ref('responses', 'BridgeAnswer'),
  };
}

function infoDescription(table: LimitTable, apiKeyHeader: string): string {
  return [
    `Every call carries an API key in \`${apiKeyHeader}\`. Each operation is counted against a row of the limit table, per API key: \`x-ratelimit\` gives the row's requests per clock hour and per day (and per plan). Hour windows are clock hours and day windows start at 00:00, both in ${table.timezone}. A request is allowed while both windows have room; a refused request uses no unit.`,
    'Every answer to a counted request carries the usage headers (`X-RateLimit-*`, and `RateLimit-Policy` / `RateLimit` of draft-ietf-httpapi-ratelimit-headers). A `429` also carries `Retry-After`: wait that many seconds before the next call to that operation.',
    'Statuses described with the two-field error body are answers the gateway writes itself. Everything else is the bridge’s answer, passed through unchanged; a bridge may also answer those statuses with a body of its own.',
  ].join('\n\n');
}

const usageHeaders = (): Record<string, Json> =>
  Object.fromEntries(USAGE_HEADERS.map((name) => [name, ref('headers', name)]));

const HEADERS: Record<string, Json> = {
  'X-RateLimit-Limit-Hour': {
    description: 'Requests allowed in the current clock hour (on every answer to a counted request).',
    schema: { type: 'integer', minimum: 1 },
  },
  'X-RateLimit-Remaining-Hour': {
    description: 'Requests left in the current clock hour.',
    schema: { type: 'integer', minimum: 0 },
  },
  'X-RateLimit-Limit-Day': {
    description: 'Requests allowed in the current day.',
    schema: { type: 'integer', minimum: 1 },
  },
  'X-RateLimit-Remaining-Day': {
    description: 'Requests left in the current day.',
    schema: { type: 'integer', minimum: 0 },
  },
  'RateLimit-Policy': {
    description: 'The two windows: `q` the quota, `w` the window in seconds (draft-ietf-httpapi-ratelimit-headers).',
    schema: { type: 'string', examples: ['"hour";q=60;w=3600, "day";q=500;w=86400'] },
  },
  RateLimit: {
    description:
      'What is left: `r` remaining, `t` whole seconds until that window resets (draft-ietf-httpapi-ratelimit-headers).',
    schema: { type: 'string', examples: ['"hour";r=48;t=1800, "day";r=360;t=30000'] },
  },
  'X-Request-Id': {
    description: 'The id of the request (yours when it was acceptable), also given to the bridge and in the log.',
    schema: { type: 'string' },
  },
  'Retry-After': {
    description:
      'Whole seconds, at least 1, until the request could next be allowed (RFC 9110 §10.2.3): the reset of the spent window, or the later reset when both are spent.',
    required: true,
    schema: { type: 'integer', minimum: 1 },
  },
  RetryAfterUnavailable: {
    description: 'Whole seconds before trying again: when the instance next tries Redis, or checks the key again.',
    schema: { type: 'integer', minimum: 1 },
  },
  'WWW-Authenticate': {
    description: 'The challenge of RFC 9110 §11.6.1, naming the API-key header.',
    schema: { type: 'string' },
  },
  Allow: { description: 'The methods the path has.', required: true, schema: { type: 'string' } },
};

const SCHEMAS: Record<string, Json> = {
  Error: ERROR_SCHEMA,
  RateLimitExceeded: {
    description: 'The exact body of a `429`.',
    allOf: [ref('schemas', 'Error')],
    properties: { error: { const: 'Rate Limit Exceeded' }, message: { const: 'Too Many Requests' } },
  },
  Credentials: {
    type: 'object',
    required: ['username', 'password'],
    properties: {
      username: { type: 'string', minLength: 1 },
      password: { type: 'string', minLength: 1, format: 'password' },
    },
  },
  TokenSet: {
    type: 'object',
    description: 'The token set of the Account Token Service specification (section 2.1).',
    required: ['access_token', 'refresh_token', 'expires_in', 'otp_token', 'token_type'],
    properties: {
      access_token: { type: 'string', description: 'Sent to the bridge as `Authorization: Bearer …`.' },
      refresh_token: { type: 'string' },
      expires_in: { type: 'integer', description: 'Seconds until the access token expires.' },
      otp_token: { type: 'string', description: 'Sent to the bridge as `x-otp-token`.' },
      token_type: { type: 'string', const: 'Bearer' },
    },
  },
  BridgeBody: { description: 'Any JSON: the bridge’s body, passed through as it is.' },
};

const gatewayAnswer = (description: string, example: Json, headers: Record<string, Json> = {}): Json => ({
  description,
  headers: { ...usageHeaders(), ...headers },
  content: jsonContent(ref('schemas', 'Error'), example),
});

const RESPONSES: Record<string, Json> = {
  BridgeAnswer: {
    description: 'The bridge’s answer, passed through unchanged: status, headers and body.',
    headers: usageHeaders(),
    content: jsonContent(ref('schemas', 'BridgeBody')),
  },
  TokenSet: {
    description: 'The bridge’s token set (a successful login).',
    headers: usageHeaders(),
    content: jsonContent(ref('schemas', 'TokenSet')),
  },
  SwitchingProtocols: {
    description: 'The WebSocket is open, joined to the bridge’s.',
    headers: usageHeaders(),
  },
  BadRequest: gatewayAnswer(
    'A malformed request or path (an encoded slash, a control character, a malformed escape, a `;`, …).',
    errorExample(400, 'Malformed request'),
  ),
  CredentialsBadRequest: gatewayAnswer(
    'A malformed request, or a body that is not a JSON object with non-empty string `username` and `password`.',
    errorExample(400, 'Body must be a JSON object with non-empty string "username" and "password"'),
  ),
  Unauthorized: gatewayAnswer(
    'The API key is missing, unknown or absurdly long. Not counted.',
    errorExample(401, 'Missing API key'),
    { 'WWW-Authenticate': ref('headers', 'WWW-Authenticate') },
  ),
  NotFound: gatewayAnswer(
    'No row of the limit table has the path. Not counted.',
    errorExample(404, 'No such endpoint'),
  ),
  MethodNotAllowed: gatewayAnswer(
    'The path exists for other methods only. Not counted.',
    errorExample(405, 'Method not allowed for this endpoint'),
    { Allow: ref('headers', 'Allow') },
  ),
  RequestTimeout: gatewayAnswer(
    'The request’s body did not all arrive within the gateway’s `REQUEST_TIMEOUT_MS` (30 s by default). Counted.',
    errorExample(408, 'Request took too long to arrive'),
  ),
  ContentTooLarge: gatewayAnswer(
    'The body is over the gateway’s limit (`MAX_BODY_BYTES`, 1 MiB by default). Counted.',
    errorExample(413, 'Request body is larger than 1048576 bytes'),
  ),
  UnsupportedMediaType: gatewayAnswer(
    'A token operation without `Content-Type: application/json`. Counted.',
    errorExample(415, 'Content-Type must be application/json'),
  ),
  UpgradeRequired: gatewayAnswer(
    'A plain request on a WebSocket route. Not counted.',
    errorExample(426, 'This endpoint is a WebSocket: connect with Upgrade: websocket'),
  ),
  TooManyRequests: {
    description:
      'A window of the row is spent for this key (the usage headers say which), or the client address sent too many missing or unknown keys. Wait `Retry-After` seconds.',
    headers: { ...usageHeaders(), 'Retry-After': ref('headers', 'Retry-After') },
    content: jsonContent(ref('schemas', 'RateLimitExceeded'), errorExample(429, 'Too Many Requests')),
  },
  BadGateway: gatewayAnswer('The bridge cannot be reached.', errorExample(502, 'Bridge unreachable')),
  ServiceUnavailable: gatewayAnswer(
    'Rate limiting is unavailable (`REDIS_FAILURE_MODE=closed` while Redis is down), or the API key cannot be checked right now (`API keys cannot be checked right now`, with `Retry-After`): try again.',
    errorExample(503, 'Rate limiting is unavailable'),
    { 'Retry-After': ref('headers', 'RetryAfterUnavailable') },
  ),
  GatewayTimeout: gatewayAnswer(
    'The bridge did not answer within the gateway’s upstream timeout.',
    errorExample(504, 'Bridge did not answer in time'),
  ),
};

/** `/orders/{}`: the path with parameter names dropped, as the matcher sees it. */
function canonicalPath(route: Route): string {
  return route.key.slice(route.key.indexOf(' ') + 1);
}

function paramNames(route: Route): string[] {
  return route.segments.flatMap((s) => (s.kind === 'param' ? [s.name] : []));
}

function pathParameterName(name: string): string {
  return `path.${name}`;
}

/** `GET /orders/{id}` → `getOrdersById`; `WS /ws/orders` → `connectWsOrders`. */
function operationIdOf(route: Route): string {
  const words = route.segments.flatMap((s) =>
    s.kind === 'param' ? ['by', ...s.name.split(/[^A-Za-z0-9]+/)] : s.value.split(/[^A-Za-z0-9]+/),
  );
  const verb = route.method === 'WS' ? 'connect' : route.method.toLowerCase();
  return (
    verb +
    words
      .filter(Boolean)
      .map((w) => w.charAt(0).toUpperCase() + w.slice(1))
      .join('')
  );
}

function uniqueId(id: string, used: Set<string>): string {
  let candidate = id;
  for (let n = 2; used.has(candidate); n++) candidate = `${id}${n}`;
  used.add(candidate);
  return candidate;
}

/** A credential route as written (`POST /a/{x}`) or as a canonical key (`POST /a/{}`), as its key. */
function routeKeyOf(text: string): string {
  const route = parseRoute(text);
  return typeof route === 'string' ? text : route.key;
}
