import { readFile } from 'node:fs/promises';
import {
  byPosition,
  describe,
  entries,
  isYamlMap,
  isYamlSeq,
  scalarValue,
  YamlSource,
  type SourceError,
} from '../lib/yaml-source.js';

/**
 * `config/api-keys.yaml`: statically issued keys, stored as the SHA-256 hex of the key
 * (INTERFACE §10). Validated like the limit table: every problem with its line.
 */

export interface KeyRecord {
  readonly id: string;
  /** SHA-256 hex of the key, lower case. */
  readonly sha256: string;
  readonly plan: string | undefined;
  readonly source: 'file' | 'admin';
  readonly createdAt?: string;
}

export type KeyFileLoad =
  | { readonly ok: true; readonly keys: readonly KeyRecord[] }
  | { readonly ok: false; readonly errors: readonly SourceError[] };

export const KEY_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const SHA256_HEX = /^[0-9a-fA-F]{64}$/;
const ENTRY_KEYS = ['id', 'sha256', 'plan'];

export async function readKeyFile(path: string, displayName: string, plans: ReadonlySet<string>): Promise<KeyFileLoad> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'file not found' : 'file cannot be read';
    return { ok: false, errors: [{ file: displayName, line: 1, column: 1, message: reason }] };
  }
  return parseKeyFile(text, displayName, plans);
}

export function parseKeyFile(text: string, file: string, plans: ReadonlySet<string>): KeyFileLoad {
  const { source, errors } = YamlSource.parse(file, text);
  if (errors.length > 0) return { ok: false, errors };
  const root = source.root;
  if (root === null || root === undefined) return { ok: true, keys: [] };
  if (!isYamlMap(root)) return { ok: false, errors: [source.error(root, 'the file must be a mapping with "keys"')] };

  let list: unknown;
  for (const { key, pair, value } of entries(root)) {
    if (key === 'keys') list = value;
    else errors.push(source.error(pair.key, `unknown key "${key}" (expected keys)`));
  }
  const keys: KeyRecord[] = [];
  if (list === null || list === undefined) return errors.length ? { ok: false, errors } : { ok: true, keys };
  if (!isYamlSeq(list))
    return { ok: false, errors: [...errors, source.error(list, `keys must be a list, got ${describe(list)}`)] };

  const ids = new Map<string, number>();
  const hashes = new Map<string, number>();
  list.items.forEach((item, index) => {
    const row = index + 1;
    if (!isYamlMap(item)) {
      errors.push(source.error(item, 'an entry must be a mapping with id and sha256', { row }));
      return;
    }
    const fields = new Map(entries(item).map((e) => [e.key, e]));
    const id = scalarValue(fields.get('id')?.value);
    const at = { row, ...(typeof id === 'string' ? { rowName: id } : {}) };
    const before = errors.length;
    const fail = (node: unknown, message: string): void => void errors.push(source.error(node, message, at));
    for (const { key, pair } of fields.values())
      if (!ENTRY_KEYS.includes(key)) fail(pair.key, `unknown key "${key}" (expected one of ${ENTRY_KEYS.join(', ')})`);
    for (const required of ['id', 'sha256']) if (!fields.has(required)) fail(item, `missing "${required}"`);

    const idNode = fields.get('id')?.value;
    if (fields.has('id')) {
      if (typeof id !== 'string' || !KEY_ID.test(id))
        fail(idNode, `id must be letters, digits, ".", "_" and "-" (at most 64), got ${describe(idNode)}`);
      else if (ids.has(id)) fail(idNode, `id "${id}" is already used by entry ${ids.get(id)}`);
      else ids.set(id, row);
    }
    const hashNode = fields.get('sha256')?.value;
    const hash = scalarValue(hashNode);
    let sha256: string | undefined;
    if (fields.has('sha256')) {
      if (typeof hash !== 'string' || !SHA256_HEX.test(hash))
        fail(
          hashNode,
          `sha256 must be 64 hex digits (npx oapi-gateway keys hash KEY prints it), got ${describe(hashNode)}`,
        );
      else if (hashes.has(hash.toLowerCase()))
        fail(hashNode, `this sha256 is already used by entry ${hashes.get(hash.toLowerCase())}`);
      else hashes.set((sha256 = hash.toLowerCase()), row);
    }
    const planNode = fields.get('plan')?.value;
    const plan = scalarValue(planNode);
    if (fields.has('plan') && plan !== null) {
      if (typeof plan !== 'string') fail(planNode, `plan must be a plan name, got ${describe(planNode)}`);
      else if (!plans.has(plan))
        fail(planNode, `unknown plan "${plan}" (plans of limits.yaml: ${[...plans].join(', ') || 'none'})`);
    }
    if (errors.length === before && typeof id === 'string' && sha256) {
      keys.push({ id, sha256, plan: typeof plan === 'string' ? plan : undefined, source: 'file' });
    }
  });
  return errors.length ? { ok: false, errors: byPosition(errors) } : { ok: true, keys };
}
