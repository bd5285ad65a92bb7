import { describe, expect, it } from 'vitest';
import { formatSourceError } from '../../src/lib/yaml-source.js';
import { parseKeyFile } from '../../src/keys/key-file.js';

const A = 'a'.repeat(64);
const B = 'B'.repeat(64);
const plans = new Set(['premium']);
const errors = (text: string): string[] => {
  const result = parseKeyFile(text, 'api-keys.yaml', plans);
  return result.ok ? [] : result.errors.map(formatSourceError);
};

describe('the key file', () => {
  it('reads ids, hashes (lower-cased) and plans', () => {
    const result = parseKeyFile(
      `keys:\n  - id: acme\n    sha256: ${A}\n    plan: premium\n  - id: beta\n    sha256: ${B}\n`,
      'k.yaml',
      plans,
    );
    expect(result).toEqual({
      ok: true,
      keys: [
        { id: 'acme', sha256: A, plan: 'premium', source: 'file' },
        { id: 'beta', sha256: B.toLowerCase(), plan: undefined, source: 'file' },
      ],
    });
  });

  it('accepts an empty file, and a keys key with no value', () => {
    expect(parseKeyFile('', 'k.yaml', plans)).toEqual({ ok: true, keys: [] });
    expect(parseKeyFile('keys:\n', 'k.yaml', plans)).toEqual({ ok: true, keys: [] });
  });

  it('refuses what is not a key file, with the line of each problem', () => {
    expect(errors('- id: acme\n')).toEqual(['api-keys.yaml:1:1: the file must be a mapping with "keys"']);
    expect(errors('key:\n  - id: acme\n')).toEqual(['api-keys.yaml:1:1: unknown key "key" (expected keys)']);
    expect(errors('keys:\n  id: acme\n')).toEqual(['api-keys.yaml:2:3: keys must be a list, got a mapping']);
    expect(errors(`keys:\n  - acme\n  - id: [acme]\n    sha256: ${A}\n    plan: 5\n`)).toEqual([
      'api-keys.yaml:2:5: row 1: an entry must be a mapping with id and sha256',
      'api-keys.yaml:3:9: row 2: id must be letters, digits, ".", "_" and "-" (at most 64), got a list',
      'api-keys.yaml:5:11: row 2: plan must be a plan name, got 5',
    ]);
  });

  it('refuses bad hashes, unknown plans, duplicate ids and hashes, unknown keys, each with its line', () => {
    expect(errors(`keys:\n  - id: acme\n    sha256: abc\n`)).toEqual([
      'api-keys.yaml:3:13: row 1 (acme): sha256 must be 64 hex digits ("npx oapi-gateway keys hash -" prints it from the key on standard input), got 3 characters',
    ]);
    expect(errors(`keys:\n  - id: acme\n    sha256: ${A}\n    plan: gold\n`)).toEqual([
      'api-keys.yaml:4:11: row 1 (acme): unknown plan "gold" (plans of limits.yaml: premium)',
    ]);
    expect(errors(`keys:\n  - id: acme\n    sha256: ${A}\n  - id: acme\n    sha256: ${B}\n`)).toEqual([
      'api-keys.yaml:4:9: row 2 (acme): id "acme" is already used by entry 1',
    ]);
    expect(errors(`keys:\n  - id: acme\n    sha256: ${A}\n  - id: beta\n    sha256: ${A.toUpperCase()}\n`)).toEqual([
      'api-keys.yaml:5:13: row 2 (beta): this sha256 is already used by entry 1',
    ]);
    // Ids are unique across the key file and the admin API.
    const issued = parseKeyFile(
      `keys:\n  - id: beta\n    sha256: ${B}\n  - id: acme\n    sha256: ${A}\n`,
      'api-keys.yaml',
      plans,
      new Set(['acme']),
    );
    expect(issued.ok ? [] : issued.errors.map(formatSourceError)).toEqual([
      'api-keys.yaml:4:9: row 2 (acme): id "acme" is taken by a key issued through the admin API',
    ]);
    expect(errors(`keys:\n  - id: acme\n    key: secret\n`)).toEqual([
      'api-keys.yaml:2:5: row 1 (acme): missing "sha256"',
      'api-keys.yaml:3:5: row 1 (acme): unknown key "key" (expected one of id, sha256, plan)',
    ]);
    expect(errors(`keys:\n  - id: acme\n    sha256: ${A}\n    key: secret\n    plans: premium\n`)).toEqual([
      'api-keys.yaml:4:5: row 1 (acme): unknown key "key" (expected one of id, sha256, plan)',
      'api-keys.yaml:5:5: row 1 (acme): unknown key "plans" (expected one of id, sha256, plan)',
    ]);
  });
});
