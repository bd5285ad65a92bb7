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

export class RedisIssuedKeyStore implements IssuedKeyStore {
  readonly #client: RedisClient;
  readonly #hash: string;
  readonly #versionKey: string;

  constructor(client: RedisClient, prefix: string) {
    this.#client = client;
    // One hash tag, so both keys sit in one Cluster slot and change in one transaction.
    this.#hash = `${prefix}{keys}`;
    this.#versionKey = `${prefix}{keys}:version`;
  }

  async all(): Promise<KeyRecord[]> {
    const entries = await this.#client.hgetall(this.#hash).catch(rethrow);
    const records: KeyRecord[] = [];
    for (const [id, json] of Object.entries(entries)) {
      try {
        const stored = JSON.parse(json) as { sha256: string; plan?: string; createdAt?: string };
        records.push({ id, sha256: stored.sha256, plan: stored.plan, source: 'admin', ...(stored.createdAt ? { createdAt: stored.createdAt } : {}) });
      } catch {
        // a damaged entry is skipped rather than taking every key down
      }
    }
    return records;
  }

  async add(record: KeyRecord): Promise<boolean> {
    const value = JSON.stringify({ sha256: record.sha256, plan: record.plan, createdAt: record.createdAt });
    const replies = await this.#client.multi().hsetnx(this.#hash, record.id, value).incr(this.#versionKey).exec().catch(rethrow);
    return replies?.[0]?.[1] === 1;
  }

  async remove(id: string): Promise<boolean> {
    const replies = await this.#client.multi().hdel(this.#hash, id).incr(this.#versionKey).exec().catch(rethrow);
    return replies?.[0]?.[1] === 1;
  }

  async version(): Promise<string> {
    return (await this.#client.get(this.#versionKey).catch(rethrow)) ?? '0';
  }
}

function rethrow(err: unknown): never {
  throw toStoreError(err);
}

export type CreateResult = { readonly created: true; readonly key: string; readonly record: KeyRecord } | { readonly created: false; readonly reason: 'id-taken' };
export type RevokeResult = 'revoked' | 'not-found' | 'in-key-file';

export class KeyRegistry {
  readonly #store: IssuedKeyStore;
  #fileKeys = new Map<string, KeyRecord>();
  #issued = new Map<string, KeyRecord>();
  #version: string | undefined;
  #poller: NodeJS.Timeout | undefined;
  #refreshing: Promise<void> | undefined;
  readonly #onError: (err: unknown) => void;

  constructor(store: IssuedKeyStore, onError: (err: unknown) => void = () => {}) {
    this.#store = store;
    this.#onError = onError;
  }

  /** The key with this SHA-256 hex, if issued. Synchronous: the request path never waits on it. */
  lookup(keyHash: string): KeyRecord | undefined {
    return this.#fileKeys.get(keyHash) ?? this.#issued.get(keyHash);
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
    const record: KeyRecord = { id, sha256: sha256Hex(key), plan, source: 'admin', createdAt: new Date().toISOString() };
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
