import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../observability/logger.js';
import type { RedisClient } from '../redis/connection.js';
import { toStoreError } from '../redis/errors.js';
import type { KeyRecord } from './key-file.js';

/**
 * The issued API keys (INTERFACE §10): keys of the key file, and keys issued through the admin
 * API, kept as hashes in Redis so that every instance knows them. Each instance holds all of
 * them in memory, so a lookup on the request path costs no Redis round trip; it reloads the
 * admin-issued ones when an instance announces a change (pub/sub) and, as a backstop for a
 * lost message, whenever the shared version number moves (checked every `pollMs`).
 */

export interface IssuedKeyStore {
  all(): Promise<KeyRecord[]>;
  /** The issued key with this SHA-256 hex, if any. */
  find(keyHash: string): Promise<KeyRecord | undefined>;
  /** Adds a key unless its id is taken; returns false when it is. */
  add(record: KeyRecord): Promise<boolean>;
  remove(id: string): Promise<boolean>;
  /** Changes whenever the set of keys changes. */
  version(): Promise<string>;
}

export class MemoryIssuedKeyStore implements IssuedKeyStore {
  readonly #keys = new Map<string, KeyRecord>();
  #version = 0;

  async all(): Promise<KeyRecord[]> {
    return [...this.#keys.values()];
  }

  async find(keyHash: string): Promise<KeyRecord | undefined> {
    return [...this.#keys.values()].find((k) => k.sha256 === keyHash);
  }

  async add(record: KeyRecord): Promise<boolean> {
    if (this.#keys.has(record.id)) return false;
    this.#keys.set(record.id, record);
    this.#version++;
    return true;
  }

  async remove(id: string): Promise<boolean> {
    const removed = this.#keys.delete(id);
    if (removed) this.#version++;
    return removed;
  }

  async version(): Promise<string> {
    return String(this.#version);
  }
}

// Two views of the same keys, changed together: by id (listing, unique ids) and by hash (lookup).
const ADD_SCRIPT = `
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
redis.call('INCR', KEYS[3])
return 1
`;
const REMOVE_SCRIPT = `
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if not stored then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], cjson.decode(stored).sha256)
redis.call('INCR', KEYS[3])
return 1
`;
const FIND_SCRIPT = `
local id = redis.call('HGET', KEYS[2], ARGV[1])
if not id then return false end
local stored = redis.call('HGET', KEYS[1], id)
if not stored then return false end
return {id, stored}
`;

interface KeyScripts {
  oapiAddKey(byId: string, byHash: string, version: string, id: string, sha256: string, json: string): Promise<number>;
  oapiRemoveKey(byId: string, byHash: string, version: string, id: string): Promise<number>;
  oapiFindKey(byId: string, byHash: string, sha256: string): Promise<[string, string] | null>;
}

export class RedisIssuedKeyStore implements IssuedKeyStore {
  readonly #client: RedisClient & KeyScripts;
  readonly #byId: string;
  readonly #byHash: string;
  readonly #versionKey: string;

  constructor(client: RedisClient, prefix: string) {
    client.defineCommand('oapiAddKey', { numberOfKeys: 3, lua: ADD_SCRIPT });
    client.defineCommand('oapiRemoveKey', { numberOfKeys: 3, lua: REMOVE_SCRIPT });
    client.defineCommand('oapiFindKey', { numberOfKeys: 2, lua: FIND_SCRIPT });
    this.#client = client as RedisClient & KeyScripts;
    // One hash tag, so the three keys sit in one Cluster slot and change in one script.
    this.#byId = `${prefix}{keys}`;
    this.#byHash = `${prefix}{keys}:by-hash`;
    this.#versionKey = `${prefix}{keys}:version`;
  }

  async all(): Promise<KeyRecord[]> {
    const entries = await this.#client.hgetall(this.#byId).catch(rethrow);
    const records: KeyRecord[] = [];
    for (const [id, json] of Object.entries(entries)) {
      const record = parseRecord(id, json);
      if (record) records.push(record);
    }
    return records;
  }

  async find(keyHash: string): Promise<KeyRecord | undefined> {
    const found = await this.#client.oapiFindKey(this.#byId, this.#byHash, keyHash).catch(rethrow);
    return found ? parseRecord(found[0], found[1]) : undefined;
  }

  async add(record: KeyRecord): Promise<boolean> {
    const json = JSON.stringify({ sha256: record.sha256, plan: record.plan, createdAt: record.createdAt });
    return (
      (await this.#client
        .oapiAddKey(this.#byId, this.#byHash, this.#versionKey, record.id, record.sha256, json)
        .catch(rethrow)) === 1
    );
  }

  async remove(id: string): Promise<boolean> {
    return (await this.#client.oapiRemoveKey(this.#byId, this.#byHash, this.#versionKey, id).catch(rethrow)) === 1;
  }

  async version(): Promise<string> {
    return (await this.#client.get(this.#versionKey).catch(rethrow)) ?? '0';
  }
}

function parseRecord(id: string, json: string): KeyRecord | undefined {
  try {
    const stored = JSON.parse(json) as { sha256: string; plan?: string; createdAt?: string };
    return {
      id,
      sha256: stored.sha256,
      plan: stored.plan,
      source: 'admin',
      ...(stored.createdAt ? { createdAt: stored.createdAt } : {}),
    };
  } catch {
    return undefined; // a damaged entry is skipped rather than taking every key down
  }
}

function rethrow(err: unknown): never {
  throw toStoreError(err);
}

export type CreateResult =
  | { readonly created: true; readonly key: string; readonly record: KeyRecord }
  | { readonly created: false; readonly reason: 'id-taken' };
export type RevokeResult = 'revoked' | 'not-found' | 'in-key-file';

export class KeyRegistry {
  readonly #store: IssuedKeyStore;
  #fileKeys = new Map<string, KeyRecord>();
  #issued = new Map<string, KeyRecord>();
  #version: string | undefined;
  #poller: NodeJS.Timeout | undefined;
  #refreshing: Promise<void> | undefined;
  readonly #resolving = new Map<string, Promise<KeyRecord | undefined>>();
  readonly #onError: (err: unknown) => void;

  constructor(store: IssuedKeyStore, onError: (err: unknown) => void = () => {}) {
    this.#store = store;
    this.#onError = onError;
  }

  /** The key with this SHA-256 hex, if issued and known here. Synchronous: the request path does not wait on it. */
  lookup(keyHash: string): KeyRecord | undefined {
    return this.#fileKeys.get(keyHash) ?? this.#issued.get(keyHash);
  }

  /**
   * A key this instance does not know yet may have been issued on another one a moment ago:
   * asks the store (one round trip; only unknown keys ever get here, and the invalid-key guard
   * throttles addresses that keep sending them). Concurrent asks for one hash share one call.
   */
  resolve(keyHash: string): Promise<KeyRecord | undefined> {
    const known = this.lookup(keyHash);
    if (known) return Promise.resolve(known);
    let pending = this.#resolving.get(keyHash);
    if (!pending) {
      pending = this.#store
        .find(keyHash)
        .then((record) => {
          if (record) this.#issued.set(record.sha256, record);
          return record;
        })
        .catch((err: unknown) => {
          this.#onError(err);
          return undefined;
        })
        .finally(() => this.#resolving.delete(keyHash));
      this.#resolving.set(keyHash, pending);
    }
    return pending;
  }

  list(): KeyRecord[] {
    return [...this.#fileKeys.values(), ...this.#issued.values()].sort((a, b) => a.id.localeCompare(b.id));
  }

  setFileKeys(keys: readonly KeyRecord[]): void {
    this.#fileKeys = new Map(keys.map((k) => [k.sha256, k]));
  }

  /** Reloads the admin-issued keys (coalesced: concurrent calls share one reload). */
  refresh(): Promise<void> {
    this.#refreshing ??= (async () => {
      try {
        const version = await this.#store.version();
        const keys = await this.#store.all();
        this.#issued = new Map(keys.map((k) => [k.sha256, k]));
        this.#version = version;
      } finally {
        this.#refreshing = undefined;
      }
    })();
    return this.#refreshing;
  }

  /** Checks the shared version every `pollMs` and reloads when it moved. */
  startPolling(pollMs: number): void {
    this.#poller = setInterval(() => {
      this.#store
        .version()
        .then((version) => (version !== this.#version ? this.refresh() : undefined))
        .catch(this.#onError);
    }, pollMs);
    this.#poller.unref();
  }

  stop(): void {
    clearInterval(this.#poller);
  }

  async create(id: string, plan: string | undefined): Promise<CreateResult> {
    if ([...this.#fileKeys.values()].some((k) => k.id === id)) return { created: false, reason: 'id-taken' };
    // 32 random bytes: 256 bits, far beyond guessing; the prefix makes a leaked key easy to recognise.
    const key = 'oapi_' + randomBytes(32).toString('base64url');
    const record: KeyRecord = {
      id,
      sha256: sha256Hex(key),
      plan,
      source: 'admin',
      createdAt: new Date().toISOString(),
    };
    if (!(await this.#store.add(record))) return { created: false, reason: 'id-taken' };
    this.#issued.set(record.sha256, record);
    return { created: true, key, record };
  }

  async revoke(id: string): Promise<RevokeResult> {
    if ([...this.#fileKeys.values()].some((k) => k.id === id)) return 'in-key-file';
    const removed = await this.#store.remove(id);
    for (const [hash, record] of this.#issued) if (record.id === id) this.#issued.delete(hash);
    return removed ? 'revoked' : 'not-found';
  }
}
