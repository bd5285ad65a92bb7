#!/usr/bin/env node
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import type { LimitTable } from './limits/limit-table.js';
import { limitsFor } from './limits/limit-table.js';
import { readLimitsFile } from './config/load-limits.js';
import { openApiSettings, SettingsError } from './config/settings.js';
import { formatSourceError } from './lib/yaml-source.js';
import { readKeyFile } from './keys/key-file.js';
import { newApiKey } from './keys/registry.js';
import { sha256Hex } from './lib/hash.js';
import { adminOpenApi } from './openapi/admin.js';
import { publicOpenApi } from './openapi/public.js';
import { VERSION } from './lib/version.js';

/**
 * `npx oapi-gateway check [FILE] [--keys FILE]`: validates a limits file (and the key file),
 * prints the table, exits 1 with every error and its line when something is wrong.
 * `npx oapi-gateway keys hash KEY|-`: prints the line for `config/api-keys.yaml` (`-`: the key from
 * standard input, which keeps it out of shell history and `ps`). `keys new`: a fresh key and its line.
 * `npx oapi-gateway openapi [FILE] | --admin`: prints the OpenAPI 3.1 document of the public API
 * of a limits file, or of the admin listener.
 */

const USAGE = `usage:
  oapi-gateway check [LIMITS_FILE] [--keys KEYS_FILE]   validate a limits file (default: $LIMITS_FILE or limits.yaml)
  oapi-gateway keys hash KEY                          print the sha256 line of a key for config/api-keys.yaml
  oapi-gateway keys hash -                            the same, the key read from standard input (one line)
  oapi-gateway keys new                               print a fresh key, then its sha256 line
  oapi-gateway openapi [LIMITS_FILE]                  print the OpenAPI 3.1 document of the public API of a limits file
  oapi-gateway openapi --admin                        print the OpenAPI 3.1 document of the admin listener`;

/** The table of a limits file, or undefined after printing every error as `check` does. */
async function readTable(file: string): Promise<LimitTable | undefined> {
  const result = await readLimitsFile(resolve(file), file);
  if (result.ok) return result.table;
  for (const error of result.errors) process.stderr.write(formatSourceError(error) + '\n');
  process.stderr.write(`${file}: ${result.errors.length} error${result.errors.length === 1 ? '' : 's'}; not valid\n`);
  return undefined;
}

async function check(args: string[]): Promise<number> {
  let keysFile: string | undefined;
  const positional: string[] = [];
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--keys') keysFile = args[++i];
    else positional.push(args[i] as string);
  }
  // A `--keys` without its file, or a second file, would be ignored and the rest said valid.
  if ((args.includes('--keys') && !keysFile) || positional.length > 1) {
    process.stderr.write(USAGE + '\n');
    return 2;
  }
  const file = positional[0] ?? process.env.LIMITS_FILE ?? 'limits.yaml';
  const table = await readTable(file);
  if (!table) return 1;
  process.stdout.write(renderTable(table, file));

  const keys =
    keysFile ?? process.env.API_KEYS_FILE ?? (existsSync('config/api-keys.yaml') ? 'config/api-keys.yaml' : undefined);
  if (keys) {
    const keyResult = await readKeyFile(resolve(keys), keys, new Set(table.plans.keys()));
    if (!keyResult.ok) {
      for (const error of keyResult.errors) process.stderr.write(formatSourceError(error) + '\n');
      process.stderr.write(
        `${keys}: ${keyResult.errors.length} error${keyResult.errors.length === 1 ? '' : 's'}; not valid\n`,
      );
      return 1;
    }
    process.stdout.write(`\n${keys}: ${keyResult.keys.length} key${keyResult.keys.length === 1 ? '' : 's'}, valid\n`);
  }
  return 0;
}

function renderTable(table: LimitTable, file: string): string {
  const header = ['#', 'name', 'route', 'per_hour', 'per_day', ''];
  const rows = table.rows.map((row) => [
    String(row.index + 1),
    row.name,
    row.route.text,
    String(row.limits.perHour),
    String(row.limits.perDay),
    row.shadow ? 'shadow' : '',
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] as string).length)));
  const line = (cells: string[]): string =>
    cells
      .map((cell, i) => (i === 3 || i === 4 ? cell.padStart(widths[i] as number) : cell.padEnd(widths[i] as number)))
      .join('  ')
      .trimEnd() + '\n';
  let out =
    `${file}: valid, ${table.rows.length} ${table.rows.length === 1 ? 'row' : 'rows'}, timezone ${table.timezone}, ${table.hash}\n\n` +
    line(header);
  for (const row of table.rows) {
    out += line(rows[row.index] as string[]);
    for (const also of row.also)
      out += ' '.repeat((widths[0] as number) + (widths[1] as number) + 4) + `+ ${also.text}\n`;
  }
  for (const plan of table.plans.values()) {
    const changed = table.rows
      .map((row) => ({ row, limits: limitsFor(table, row, plan.name) }))
      .filter(({ row, limits }) => limits.perHour !== row.limits.perHour || limits.perDay !== row.limits.perDay);
    out += `\nplan ${plan.name}: ${changed.length} of ${table.rows.length} rows differ from the table\n`;
    for (const { row, limits } of changed)
      out += `  ${row.route.text}: per_hour ${limits.perHour}, per_day ${limits.perDay}\n`;
  }
  return out;
}

async function keys(args: string[]): Promise<number> {
  if (args[0] === 'new' && args.length === 1) {
    const key = newApiKey();
    process.stdout.write(`${key}\n    sha256: ${sha256Hex(key)}\n`);
    return 0;
  }
  if (args[0] !== 'hash' || args.length !== 2 || !args[1]) {
    process.stderr.write(USAGE + '\n');
    return 2;
  }
  const key = args[1] === '-' ? await onlyLine(process.stdin) : args[1];
  if (key instanceof Error) {
    process.stderr.write(`keys hash -: ${key.message}\n`);
    return 1;
  }
  if (!key) {
    process.stderr.write('keys hash -: no key on standard input\n');
    return 1;
  }
  process.stdout.write(`    sha256: ${sha256Hex(key)}\n`);
  return 0;
}

/** Longer than any API key the gateway accepts (256 characters), with room for a line ending. */
const MAX_KEY_INPUT = 4096;

/**
 * The one line of a stream, without its line ending; an error when it holds more than one (a
 * pasted file, two keys) or more than any key, rather than hashing a part of it.
 */
async function onlyLine(input: NodeJS.ReadableStream): Promise<string | Error> {
  // Decoded once whole: a chunk may end inside a character.
  const chunks: Buffer[] = [];
  let length = 0;
  for await (const chunk of input) {
    const bytes = Buffer.isBuffer(chunk) ? chunk : Buffer.from(String(chunk));
    chunks.push(bytes);
    length += bytes.length;
    if (length > MAX_KEY_INPUT) return new Error('standard input is longer than a key');
  }
  const text = Buffer.concat(chunks).toString('utf8');
  const line = text.replace(/\r?\n$/, '');
  if (/[\r\n]/.test(line)) return new Error('standard input holds more than one line; give it one key');
  return line;
}

async function openapi(args: string[]): Promise<number> {
  const admin = args.includes('--admin');
  const positional = args.filter((a) => a !== '--admin');
  if (positional.length > (admin ? 0 : 1) || positional.some((a) => a.startsWith('-'))) {
    process.stderr.write(USAGE + '\n');
    return 2;
  }
  if (admin) {
    process.stdout.write(JSON.stringify(adminOpenApi({ version: VERSION }), null, 2) + '\n');
    return 0;
  }
  const file = positional[0] ?? process.env.LIMITS_FILE ?? 'limits.yaml';
  const table = await readTable(file);
  if (!table) return 1;
  let settings: ReturnType<typeof openApiSettings>;
  try {
    settings = openApiSettings();
  } catch (err) {
    if (!(err instanceof SettingsError)) throw err;
    process.stderr.write(`oapi-gateway: ${err.message}\n`);
    return 1;
  }
  process.stdout.write(JSON.stringify(publicOpenApi(table, { ...settings, version: VERSION }), null, 2) + '\n');
  return 0;
}

async function run(argv: string[]): Promise<number> {
  const [command, ...args] = argv;
  switch (command) {
    case 'check':
      return check(args);
    case 'keys':
      return keys(args);
    case 'openapi':
      return openapi(args);
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(USAGE + '\n');
      return 0;
    default:
      process.stderr.write(USAGE + '\n');
      return 2;
  }
}

// A reader that stops early (`check | head -2`) closes the pipe: what it did not read is no failure
// of the command, whose exit code stays its own (a valid table must not read as invalid).
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code !== 'EPIPE') throw err;
});

process.exitCode = await run(process.argv.slice(2));
