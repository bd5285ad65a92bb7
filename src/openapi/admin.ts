import {
  ERROR_SCHEMA,
  errorExample,
  jsonContent,
  OPENAPI_VERSION,
  ref,
  type Json,
  type OpenApiDocument,
  type OpenApiOperation,
} from './common.js';

/**
 * The OpenAPI 3.1 document of the admin listener (docs/operations.md): health, readiness,
 * metrics, version and the two documents without a token, and the bearer-protected `/admin/*`
 * API — the limit table, a key's usage (by key or by id), issued keys and blocked addresses.
 */

export interface AdminOpenApiOptions {
  /** The gateway's version (package.json), the document's `info.version`. */
  readonly version: string;
}

const open = { security: [] as Array<Record<string, string[]>> };
const bearer = (responses: Record<string, Json>): Record<string, Json> => ({
  ...responses,
  '401': ref('responses', 'Unauthorized'),
  '403': ref('responses', 'Disabled'),
});

const json = (description: string, schemaName: string): Json => ({
  description,
  content: jsonContent(ref('schemas', schemaName)),
});
const noContent = (description: string): Json => ({ description });

function operation(
  operationId: string,
  summary: string,
  responses: Record<string, Json>,
  extra: Partial<OpenApiOperation> = {},
): OpenApiOperation {
  return { operationId, summary, ...extra, responses };
}

export function adminOpenApi(options: AdminOpenApiOptions): OpenApiDocument {
  return {
    openapi: OPENAPI_VERSION,
    info: {
      title: 'oapi-gateway admin API',
      version: options.version,
      description:
        'The admin listener (`ADMIN_HOST:ADMIN_PORT`, loopback by default: keep it off the public network). `/admin/*` needs `Authorization: Bearer $ADMIN_TOKEN`: without `ADMIN_TOKEN` it answers `403`, a missing or wrong token `401`, an unknown path `404`, a method the path does not have `405` with `Allow`, all with the two-field error body. The other paths need no token. An API key in a path is a secret: the admin log shows only its hash.',
    },
    security: [{ Bearer: [] }],
    paths: {
      ...statusPaths(),
      ...limitsPaths(),
      ...usagePaths(),
      ...keysPaths(),
      ...blocksPaths(),
    },
    components: COMPONENTS,
  };
}

/** What the platform reads without a token. */
function statusPaths(): Record<string, Json> {
  return {
    '/healthz': {
      get: operation('healthz', 'Liveness: the process serves', { '200': json('`{"status":"ok"}`', 'Health') }, open),
    },
    '/readyz': {
      get: operation(
        'readyz',
        'Readiness',
        {
          '200': json(
            '`ok`; or `degraded` with the reason while Redis is away in `insurance` and `open` mode (the instance still serves).',
            'Readiness',
          ),
          '503': json(
            '`unavailable`: while shutting down, when no valid limit table is loaded, with `WORKERS` above 1 while no worker serves the public port, or while Redis is away in `closed` mode (in `registered` mode, issued keys never read yet count as Redis away).',
            'Readiness',
          ),
        },
        open,
      ),
    },
    '/metrics': {
      get: operation(
        'metrics',
        'Prometheus metrics',
        {
          '200': {
            description: 'Prometheus text exposition format (all names start with `oapi_gateway_`).',
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
        },
        open,
      ),
    },
    '/version': {
      get: operation(
        'version',
        'The gateway’s version and Node.js version',
        { '200': json('The running build.', 'Version') },
        open,
      ),
    },
    '/openapi.json': {
      get: operation(
        'publicOpenApi',
        'OpenAPI 3.1 document of the public API, for the limit table in force',
        {
          '200': json('Every route of the table with its `x-ratelimit` numbers.', 'OpenApiDocument'),
          '503': errorAnswer('No valid limit table is loaded.', 503, 'No valid limit table is loaded'),
        },
        open,
      ),
    },
    '/openapi-admin.json': {
      get: operation(
        'adminOpenApi',
        'This document',
        { '200': json('The OpenAPI 3.1 document of the admin listener.', 'OpenApiDocument') },
        open,
      ),
    },
  };
}

/** The table in force and its reload. */
function limitsPaths(): Record<string, Json> {
  return {
    '/admin/limits': {
      get: operation(
        'getLimits',
        'The limit table in force',
        bearer({
          '200': json('The table, its file, content hash, load time and plans.', 'Limits'),
          '503': ref('responses', 'NoTable'),
        }),
      ),
    },
    '/admin/limits/reload': {
      post: operation(
        'reloadLimits',
        'Reload the limit table now',
        bearer({
          '200': json('The table in force after the reload.', 'Reloaded'),
          '422': json(
            'The file is not valid; the table in force stays. `errors` are the lines `npx oapi-gateway check` prints.',
            'ReloadRefused',
          ),
          '503': errorAnswer(
            'With `WORKERS` above 1: a worker did not answer within 5 s, or loaded another table (the file changed during the reload); each worker still reloads on its own when the file changes.',
            503,
            'not every worker has sha256:…: worker 4242 did not answer within 5 s. Each worker also reloads on its own when the file changes; try again',
          ),
        }),
      ),
    },
  };
}

/** A key's usage by the key itself. */
function usagePaths(): Record<string, Json> {
  return {
    '/admin/usage/{apiKey}': {
      parameters: [
        {
          name: 'apiKey',
          in: 'path',
          required: true,
          description: 'The API key itself (a secret: only its hash is logged).',
          schema: { type: 'string', minLength: 1 },
        },
      ],
      get: operation(
        'getUsageByKey',
        'A key’s usage on every row, in table order',
        bearer({
          '200': json('Usage of the key under its plan.', 'Usage'),
          '404': errorAnswer('In `registered` mode, a key that was never issued.', 404, 'No issued key is this key'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
      delete: operation(
        'resetUsageByKey',
        'Reset a key’s counters on every row, on every instance',
        bearer({
          '204': noContent('Reset.'),
          '404': errorAnswer('In `registered` mode, a key that was never issued.', 404, 'No issued key is this key'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
    },
  };
}

/** Issued keys, and usage by key id. */
function keysPaths(): Record<string, Json> {
  return {
    '/admin/keys': {
      get: operation(
        'listKeys',
        'Issued keys (never a key or a hash)',
        bearer({
          '200': json('Every key of the key file and of the admin API.', 'KeyList'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
      post: operation(
        'issueKey',
        'Issue a random key',
        bearer({
          '201': json('The key, shown this once; only its hash is kept.', 'IssuedKey'),
          '400': errorAnswer(
            'A body that is not `{"id","plan"}`, a malformed id or an unknown plan.',
            400,
            'id must be letters, digits, ".", "_" and "-" (at most 64)',
          ),
          '409': errorAnswer('A key with this id exists.', 409, 'A key with id "acme-prod" exists'),
          '413': errorAnswer('A body over 4096 bytes (it is not read).', 413, 'Request body is larger than 4096 bytes'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
        { requestBody: { required: true, content: jsonContent(ref('schemas', 'NewKey')) } },
      ),
    },
    '/admin/keys/{id}': {
      parameters: [ref('parameters', 'KeyId')],
      delete: operation(
        'revokeKey',
        'Revoke an issued key at once, on every instance',
        bearer({
          '204': noContent('Revoked.'),
          '404': ref('responses', 'NoSuchKey'),
          '409': errorAnswer(
            'The key comes from the key file: remove it there.',
            409,
            'Key "acme-prod" comes from the key file: remove it there',
          ),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
    },
    '/admin/keys/{id}/usage': {
      parameters: [ref('parameters', 'KeyId')],
      get: operation(
        'getUsageById',
        'The usage of the key with this id, as `/admin/usage/{apiKey}` answers it',
        bearer({
          '200': json('Usage of the key under its plan.', 'Usage'),
          '404': ref('responses', 'NoSuchKey'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
      delete: operation(
        'resetUsageById',
        'Reset the counters of the key with this id on every row, on every instance',
        bearer({
          '204': noContent('Reset.'),
          '404': ref('responses', 'NoSuchKey'),
          '503': ref('responses', 'StoreUnavailable'),
        }),
      ),
    },
  };
}

/** Addresses the invalid-key guard blocks. */
function blocksPaths(): Record<string, Json> {
  return {
    '/admin/blocks': {
      get: operation(
        'listBlocks',
        'Client addresses refused for sending missing or unknown keys',
        bearer({ '200': json('Each blocked address and the seconds its block has left.', 'Blocks') }),
      ),
    },
    '/admin/blocks/{address}': {
      parameters: [
        {
          name: 'address',
          in: 'path',
          required: true,
          description:
            'A blocked IPv4 address, or an IPv6 /64 as `GET /admin/blocks` lists it (`2001:db8:0:7::/64`, its slash as is or `%2F`) or by any address in it.',
          schema: { type: 'string', minLength: 1 },
        },
      ],
      delete: operation(
        'unblockAddress',
        'Unblock an address on every instance',
        bearer({
          '204': noContent('Unblocked.'),
          '404': errorAnswer('The address is not blocked.', 404, 'Address 198.51.100.7 is not blocked'),
        }),
      ),
    },
  };
}

function errorAnswer(description: string, status: Parameters<typeof errorExample>[0], message: string): Json {
  return { description, content: jsonContent(ref('schemas', 'Error'), errorExample(status, message)) };
}

const WINDOW_USAGE: Json = {
  type: 'object',
  required: ['limit', 'used', 'remaining', 'resetSeconds'],
  properties: {
    limit: { type: 'integer', minimum: 1 },
    used: { type: 'integer', minimum: 0 },
    remaining: { type: 'integer', minimum: 0 },
    resetSeconds: { type: 'integer', minimum: 0, description: 'Whole seconds until the window resets.' },
  },
  additionalProperties: false,
};

const NUMBERS = {
  per_hour: { type: 'integer', minimum: 1 },
  per_day: { type: 'integer', minimum: 1 },
};

const SCHEMAS: Record<string, Json> = {
  Error: ERROR_SCHEMA,
  Health: {
    type: 'object',
    required: ['status'],
    properties: { status: { const: 'ok' } },
    additionalProperties: false,
  },
  Readiness: {
    type: 'object',
    required: ['status'],
    properties: {
      status: { enum: ['ok', 'degraded', 'unavailable'] },
      reason: { type: 'string', description: 'Why the instance is not simply `ok`.' },
    },
    additionalProperties: false,
  },
  Version: {
    type: 'object',
    required: ['version', 'node'],
    properties: {
      version: { type: 'string', description: 'The gateway’s version (package.json).', examples: ['0.1.0'] },
      node: { type: 'string', description: 'The Node.js version running it.', examples: ['v20.20.2'] },
    },
    additionalProperties: false,
  },
  OpenApiDocument: {
    type: 'object',
    required: ['openapi', 'info', 'paths'],
    properties: { openapi: { type: 'string', pattern: '^3\\.1\\.' } },
  },
  Limits: {
    type: 'object',
    required: ['file', 'hash', 'loadedAt', 'timezone', 'limits', 'plans'],
    properties: {
      file: { type: 'string', examples: ['limits.yaml'] },
      hash: { type: 'string', pattern: '^sha256:[0-9a-f]{64}$' },
      loadedAt: { type: 'string', format: 'date-time' },
      timezone: { type: 'string', examples: ['UTC'] },
      limits: {
        type: 'array',
        items: {
          type: 'object',
          required: ['name', 'route', 'per_hour', 'per_day'],
          properties: {
            name: { type: 'string' },
            route: { type: 'string', examples: ['GET /orders/{id}'] },
            also: { type: 'array', items: { type: 'string' } },
            ...NUMBERS,
            shadow: { const: true },
          },
          additionalProperties: false,
        },
      },
      plans: {
        type: 'object',
        description: 'Per plan, the numbers of every row.',
        additionalProperties: {
          type: 'array',
          items: {
            type: 'object',
            required: ['route', 'per_hour', 'per_day'],
            properties: { route: { type: 'string' }, ...NUMBERS },
            additionalProperties: false,
          },
        },
      },
    },
  },
  Reloaded: {
    type: 'object',
    required: ['hash', 'loadedAt', 'changed'],
    properties: {
      hash: { type: 'string', pattern: '^sha256:[0-9a-f]{64}$' },
      loadedAt: { type: 'string', format: 'date-time' },
      changed: { type: 'boolean', description: 'false: the file was the table already in force.' },
    },
    additionalProperties: false,
  },
  ReloadRefused: {
    type: 'object',
    required: ['error', 'message', 'errors'],
    properties: {
      error: { const: 'Unprocessable Content' },
      message: { type: 'string' },
      errors: {
        type: 'array',
        items: { type: 'string' },
        examples: [['limits.yaml:6:14: row 1 (Order List): per_day (200) is below per_hour (1800)']],
      },
    },
    additionalProperties: false,
  },
  Usage: {
    type: 'object',
    required: ['endpoints'],
    properties: {
      endpoints: {
        type: 'array',
        description: 'One entry per row of the table, in table order.',
        items: {
          type: 'object',
          required: ['name', 'route', 'hour', 'day'],
          properties: {
            name: { type: 'string' },
            route: { type: 'string' },
            hour: WINDOW_USAGE,
            day: WINDOW_USAGE,
          },
          additionalProperties: false,
        },
      },
    },
    additionalProperties: false,
  },
  NewKey: {
    type: 'object',
    required: ['id'],
    properties: {
      id: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' },
      plan: { type: ['string', 'null'], description: 'A plan of the table; none: the table as written.' },
    },
  },
  IssuedKey: {
    type: 'object',
    required: ['id', 'key', 'plan'],
    properties: {
      id: { type: 'string' },
      key: { type: 'string', pattern: '^oapi_[A-Za-z0-9_-]{43}$', description: 'Shown this once.' },
      plan: { type: ['string', 'null'] },
    },
    additionalProperties: false,
  },
  KeyList: {
    type: 'object',
    required: ['keys'],
    properties: {
      keys: {
        type: 'array',
        items: {
          type: 'object',
          required: ['id', 'plan', 'source'],
          properties: {
            id: { type: 'string' },
            plan: { type: ['string', 'null'] },
            source: { enum: ['key-file', 'admin-api'] },
            createdAt: { type: 'string', format: 'date-time', description: 'Keys issued through the admin API.' },
          },
          additionalProperties: false,
        },
      },
    },
    additionalProperties: false,
  },
  Blocks: {
    type: 'object',
    required: ['blocks'],
    properties: {
      blocks: {
        type: 'array',
        items: {
          type: 'object',
          required: ['address', 'seconds'],
          properties: {
            address: { type: 'string', description: 'An IPv4 address, or an IPv6 /64 (`2001:db8:0:7::/64`).' },
            seconds: { type: 'integer', minimum: 0, description: 'Seconds the block has left.' },
          },
          additionalProperties: false,
        },
      },
    },
    additionalProperties: false,
  },
};

const COMPONENTS: Record<string, Record<string, Json>> = {
  securitySchemes: {
    Bearer: { type: 'http', scheme: 'bearer', description: '`ADMIN_TOKEN` (at least 16 characters).' },
  },
  parameters: {
    KeyId: {
      name: 'id',
      in: 'path',
      required: true,
      description: 'The id of an issued key.',
      schema: { type: 'string', pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' },
    },
  },
  schemas: SCHEMAS,
  responses: {
    Unauthorized: errorAnswer('A missing or wrong bearer token.', 401, 'Missing bearer token'),
    Disabled: errorAnswer(
      '`ADMIN_TOKEN` is not set: the admin API is disabled.',
      403,
      'The admin API is disabled: ADMIN_TOKEN is not set',
    ),
    NoSuchKey: errorAnswer('No key has this id.', 404, 'No key with id "acme-prod"'),
    NoTable: errorAnswer('No valid limit table is loaded.', 503, 'No valid limit table is loaded'),
    StoreUnavailable: errorAnswer('Redis cannot be reached.', 503, 'Counter store unavailable'),
  },
};
