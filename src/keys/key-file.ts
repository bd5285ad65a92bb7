import * as v from 'valibot';
import { readConfigFile } from '../lib/config-file.js';
import { YamlSource, type SourceError } from '../lib/yaml-source.js';
import { closed, describe, got, issuesOf, sourceErrors, valid, type Issue } from '../lib/yaml-schema.js';

/**
 * `config/api-keys.yaml`: statically issued keys, stored as the SHA-256 hex of the key
 * (README "API keys and plans"). Validated like the limit table: every problem with its line.
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

/**
 * Like `got`, but a string is described by its length only: a malformed sha256 is most likely the
 * key itself, pasted in place of its hash, and a key is never logged (README "API keys and plans").
 */
const notQuoted =
  (what: string) =>
  (issue: { readonly input: unknown }): string =>
    `${what}, got ${typeof issue.input === 'string' ? `${issue.input.length} characters` : describe(issue.input)}`;

const keyFile = (plans: ReadonlySet<string>) => {
  const entry = closed(
    {
      id: valid(v.string, (id) => KEY_ID.test(id), got('id must be letters, digits, ".", "_" and "-" (at most 64)')),
      sha256: valid(
        v.string,
        (hash) => SHA256_HEX.test(hash),
        notQuoted(
          'sha256 must be 64 hex digits ("npx oapi-gateway keys hash -" prints it from the key on standard input)',
        ),
      ),
      plan: v.nullish(
        v.pipe(
          v.string(got('plan must be a plan name')),
          v.check(
            (plan) => plans.has(plan),
            (issue) => `unknown plan "${issue.input}" (plans of limits.yaml: ${[...plans].join(', ') || 'none'})`,
          ),
        ),
      ),
    },
    () => 'an entry must be a mapping with id and sha256',
  );
  const file = closed(
    { keys: v.nullish(v.array(entry, got('keys must be a list')), []) },
    () => 'the file must be a mapping with "keys"',
    (key) => `unknown key "${key}" (expected keys)`,
  );
  return v.nullish(file, { keys: [] });
};

/** Some eighty thousand keys; a larger file is refused unread (lib/config-file.ts). */
export const MAX_KEY_FILE_BYTES = 8 * 1024 * 1024;

/**
 * `issuedIds`: the ids of the keys issued through the admin API that this instance knows. Ids are unique
 * across both ways of issuing (README "API keys and plans"), so an entry that takes one is refused.
 */
export async function readKeyFile(
  path: string,
  displayName: string,
  plans: ReadonlySet<string>,
  issuedIds: ReadonlySet<string> = new Set(),
): Promise<KeyFileLoad> {
  const read = await readConfigFile(path, MAX_KEY_FILE_BYTES);
  if ('problem' in read)
    return { ok: false, errors: [{ file: displayName, line: 1, column: 1, message: read.problem }] };
  return parseKeyFile(read.text, displayName, plans, issuedIds);
}

export function parseKeyFile(
  text: string,
  file: string,
  plans: ReadonlySet<string>,
  issuedIds: ReadonlySet<string> = new Set(),
): KeyFileLoad {
  const { source, errors } = YamlSource.parse(file, text);
  if (errors.length > 0) return { ok: false, errors };
  const result = v.safeParse(keyFile(plans), source.data);
  const issues = issuesOf(result.issues);
  const keys = result.typed ? result.output.keys : [];
  issues.push(...duplicates(keys), ...issuedElsewhere(keys, issuedIds));
  if (issues.length > 0) {
    // An issue in an entry names the entry by its number and id.
    const entries = (source.data as { keys: Array<{ id?: unknown }> } | null)?.keys;
    const inEntry = (issue: Issue): Issue => {
      const [, at] = issue.path;
      if (typeof at !== 'number') return issue;
      const id = entries?.[at]?.id;
      return { ...issue, row: { row: at + 1, ...(typeof id === 'string' ? { rowName: id } : {}) } };
    };
    return { ok: false, errors: sourceErrors(source, issues.map(inEntry)) };
  }
  return {
    ok: true,
    keys: keys.map(({ id, sha256, plan }) => ({
      id,
      sha256: sha256.toLowerCase(),
      plan: plan ?? undefined,
      source: 'file',
    })),
  };
}

/** An id, and a key (its hash), are used once in the file; a malformed one is reported as such, not here. */
function duplicates(keys: ReadonlyArray<{ id: string; sha256: string }>): Issue[] {
  const issues: Issue[] = [];
  const firstUse = new Map<string, number>();
  const once = (value: string, path: [string, number, string], message: string): void => {
    const first = firstUse.get(value);
    if (first) issues.push({ path, message: `${message} by entry ${first}` });
    else firstUse.set(value, path[1] + 1);
  };
  keys.forEach(({ id, sha256 }, i) => {
    if (KEY_ID.test(id)) once(`id ${id}`, ['keys', i, 'id'], `id "${id}" is already used`);
    if (SHA256_HEX.test(sha256)) once(sha256.toLowerCase(), ['keys', i, 'sha256'], 'this sha256 is already used');
  });
  return issues;
}

/**
 * An id issued through the admin API is that key's: a file entry with it would make the id name two
 * keys, and DELETE /admin/keys/{id} could not tell which one to revoke (README "API keys and plans").
 */
function issuedElsewhere(keys: ReadonlyArray<{ id: string }>, issuedIds: ReadonlySet<string>): Issue[] {
  return keys.flatMap(({ id }, i) =>
    issuedIds.has(id)
      ? [{ path: ['keys', i, 'id'], message: `id "${id}" is taken by a key issued through the admin API` }]
      : [],
  );
}
