import * as v from 'valibot';
import { byPosition, type SourceError, type YamlSource } from './yaml-source.js';

/**
 * The schema side of the loaders of `limits.yaml`, `gateway.yaml` and the API key file: they
 * validate a file's plain data with valibot, and each issue is mapped back to the YAML node it
 * is about, for its file, line and column.
 *
 * valibot rather than zod 4: both run on Node 20, but importing valibot adds about 1.6 MB to a
 * process's RSS (8 ms), where zod adds about 12.7 MB (80 ms) and zod/mini 12 MB, and the gateway
 * does not yet meet its target of 100 MB peak RSS (docs/performance.md "`npm run bench`").
 */

/** One problem: where in the data (`key`: at the key of the last step, not its value) and what. */
export interface Issue {
  readonly path: readonly (string | number)[];
  readonly key?: boolean;
  readonly message: string;
  readonly row?: { readonly row: number; readonly rowName?: string };
}

export function issuesOf(issues: readonly v.BaseIssue<unknown>[] | undefined): Issue[] {
  return (issues ?? []).map(({ path = [], message }) => ({
    path: path.map((step) => step.key as string | number),
    key: path.at(-1)?.origin === 'key',
    message,
  }));
}

/** The issues as errors of `source`, in the order of the file. */
export function sourceErrors(source: YamlSource, issues: readonly Issue[]): SourceError[] {
  return byPosition(issues.map((i) => source.error(source.at(i.path, i.key), i.message, i.row)));
}

/** Describes a value for a message: `60`, `"60"`, `true`, `null`, `a mapping`, `a list`, `nothing`. */
export function describe(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (Array.isArray(value)) return 'a list';
  if (typeof value === 'object' && value !== null) return 'a mapping';
  return JSON.stringify(value) ?? String(typeof value);
}

type Message = (issue: { readonly input: unknown }) => string;

/** A message that ends by naming the value it is about: `per_hour must be a positive integer, got "60"`. */
export const got =
  (what: string): Message =>
  (issue) =>
    `${what}, got ${describe(issue.input)}`;

/** A value of a type (`v.string`, `v.number`, …) that passes `test`; either failing says `message`. */
export function valid<I, T>(
  type: (message: Message) => v.GenericSchema<I, T>,
  test: (value: T) => boolean,
  message: Message,
) {
  return v.pipe(type(message), v.check(test, message));
}

const isMapping = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** A YAML mapping (valibot's object and record schemas would take a list as one too). */
export const mapping = (message: Message) => v.custom<Record<string, unknown>>(isMapping, message);

/**
 * A mapping of `entries` and no other key: a missing key is reported at the mapping, and every
 * unknown key at itself (valibot's strictObject reports the first one only).
 *
 * The keys are read from the mapping as written, beside the object schema rather than after it:
 * valibot's object output leaves out the keys `__proto__`, `constructor` and `prototype`, which
 * would otherwise pass as known (README "The limit table": unknown keys are errors).
 */
export function closed<const E extends v.ObjectEntries>(
  entries: E,
  wrongType: Message,
  unknownKey = (key: string) => `unknown key "${key}" (expected one of ${Object.keys(entries).join(', ')})`,
) {
  const noUnknownKey = v.pipe(
    v.unknown(),
    v.rawCheck(({ dataset, addIssue }) => {
      const input: unknown = dataset.value;
      if (!isMapping(input)) return;
      for (const [key, value] of Object.entries(input)) {
        if (Object.hasOwn(entries, key)) continue;
        addIssue({ message: unknownKey(key), path: [{ type: 'object', origin: 'key', input, key, value }] });
      }
    }),
    v.transform(() => ({})),
  );
  const object = v.looseObject(entries, (issue) => `missing ${issue.expected}`);
  // Typed as the object schema: its output is the object's (the other's is empty), which TypeScript
  // cannot work out through an intersection of generic entries.
  return v.pipe(mapping(wrongType), v.intersect([object, noUnknownKey]) as unknown as typeof object);
}

/** Keys valibot's object and record schemas pass over, their values unread. */
const SKIPPED_KEYS = ['__proto__', 'constructor', 'prototype'] as const;

/**
 * valibot's record, with every key of the mapping read: valibot's passes over the keys
 * `__proto__`, `constructor` and `prototype` without a word, and their values unchecked (a plan
 * named `constructor`, with any scale at all, was a file without that plan). Such a key is
 * reported at itself, with the key schema's message when it fails that, else with `reserved`'s.
 */
export function record<const K extends v.GenericSchema<string, string>, const V extends v.GenericSchema>(
  key: K,
  value: V,
  reserved: (key: string) => string,
) {
  const skipped = v.pipe(
    v.unknown(),
    v.rawCheck(({ dataset, addIssue }) => {
      const input: unknown = dataset.value;
      if (!isMapping(input)) return;
      for (const name of SKIPPED_KEYS) {
        if (!Object.hasOwn(input, name)) continue;
        const asKey = v.safeParse(key, name);
        addIssue({
          message: asKey.success ? reserved(name) : (asKey.issues[0]?.message ?? reserved(name)),
          path: [{ type: 'object', origin: 'key', input, key: name, value: input[name] }],
        });
      }
    }),
    v.transform(() => ({})),
  );
  const schema = v.record(key, value);
  // Typed as the record: its output is the record's (the other's is empty), as in closed().
  return v.intersect([schema, skipped]) as unknown as typeof schema;
}
