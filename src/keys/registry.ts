import { randomBytes } from 'node:crypto';
import { sha256Hex } from '../lib/hash.js';
import type { KeyRecord } from './key-file.js';

/**
 * The issued API keys (README "API keys and plans"): keys of the key file, and keys issued through the admin
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

/** A fresh API key: 32 random bytes (256 bits, far beyond guessing); the prefix makes a leaked key easy to recognise. */
export function newApiKey(): string {
  return 'oapi_' + randomBytes(32).toString('base64url');
}

export type CreateResult =
  | { readonly created: true; readonly key: string; readonly record: KeyRecord }
  | { readonly created: false; readonly reason: 'id-taken' };
export type RevokeResult = 'revoked' | 'not-found' | 'in-key-file';
/** What the store says of a key: issued (its record), not issued, or nothing (it cannot be reached). */
export type Resolved = KeyRecord | 'not-issued' | 'unavailable';

export class KeyRegistry {
  readonly #store: IssuedKeyStore;
  #fileKeys = new Map<string, KeyRecord>();
  #issued = new Map<string, KeyRecord>();
  #version: string | undefined;
  #poller: NodeJS.Timeout | undefined;
  #refreshing: Promise<void> | undefined;
  #refreshAgain: Promise<void> | undefined;
  readonly #resolving = new Map<string, Promise<Resolved>>();
  /** The issued keys were read from the store at least once (until then an unknown key may be one of them). */
  #loaded = false;
  readonly #onError: (err: unknown) => void;
  readonly #refreshed: Array<() => void> = [];
  readonly #plansChanged: Array<() => void> = [];

  constructor(store: IssuedKeyStore, onError: (err: unknown) => void = () => {}) {
    this.#store = store;
    this.#onError = onError;
  }

  /** The key with this SHA-256 hex, if issued and known here. Synchronous: the request path does not wait on it. */
  lookup(keyHash: string): KeyRecord | undefined {
    return this.#fileKeys.get(keyHash) ?? this.#issued.get(keyHash);
  }

  /** Whether the issued keys were read from the store at least once: until then the instance is not ready. */
  get loaded(): boolean {
    return this.#loaded;
  }

  /**
   * A key this instance does not know yet may have been issued on another one a moment ago:
   * asks the store (one round trip; only unknown keys ever get here, and the invalid-key guard
   * throttles addresses that keep sending them). Concurrent asks for one hash share one call.
   * `unavailable`: the store could not say — the key is neither valid nor invalid (README "API
   * keys and plans").
   */
  resolve(keyHash: string): Promise<Resolved> {
    const known = this.lookup(keyHash);
    if (known) return Promise.resolve(known);
    let pending = this.#resolving.get(keyHash);
    if (!pending) {
      pending = this.#store
        .find(keyHash)
        .then(
          (record): Resolved => {
            if (record) this.#issued.set(record.sha256, record);
            return record ?? 'not-issued';
          },
          (err: unknown): Resolved => {
            this.#onError(err);
            return 'unavailable';
          },
        )
        .finally(() => this.#resolving.delete(keyHash));
      this.#resolving.set(keyHash, pending);
    }
    return pending;
  }

  /**
   * The issued key with this id, if known here. Should an id name a key of each kind (a key file loaded
   * while the issued keys could not be read), the one issued through the admin API, as for revoke().
   */
  byId(id: string): KeyRecord | undefined {
    for (const record of this.#issued.values()) if (record.id === id) return record;
    for (const record of this.#fileKeys.values()) if (record.id === id) return record;
    return undefined;
  }

  /** The ids of the keys issued through the admin API known here (the key file may not take them). */
  issuedIds(): Set<string> {
    return new Set([...this.#issued.values()].map((k) => k.id));
  }

  /**
   * Ids both the key file and the admin API gave a key: possible only when the issued keys were read
   * after the file (Redis away at start-up, or another instance issued the id), sorted.
   */
  idsOfBoth(): string[] {
    const issued = this.issuedIds();
    return [...this.#fileKeys.values()]
      .map((k) => k.id)
      .filter((id) => issued.has(id))
      .sort();
  }

  /** Calls `listener` after each reload of the admin-issued keys. */
  onRefreshed(listener: () => void): void {
    this.#refreshed.push(listener);
  }

  list(): KeyRecord[] {
    return [...this.#fileKeys.values(), ...this.#issued.values()].sort((a, b) => a.id.localeCompare(b.id));
  }

  /**
   * Calls `listener` when a new key file gives a key another plan than it had (a key added to the
   * file or taken out of it included): its numbers are others.
   */
  onPlansChanged(listener: () => void): void {
    this.#plansChanged.push(listener);
  }

  setFileKeys(keys: readonly KeyRecord[]): void {
    const before = this.#fileKeys;
    this.#fileKeys = new Map(keys.map((k) => [k.sha256, k]));
    const planOf = (file: Map<string, KeyRecord>, hash: string) => (file.get(hash) ?? this.#issued.get(hash))?.plan;
    const hashes = [...before.keys(), ...this.#fileKeys.keys()];
    if (hashes.some((hash) => planOf(before, hash) !== planOf(this.#fileKeys, hash)))
      for (const listener of this.#plansChanged) listener();
  }

  /**
   * Reloads the admin-issued keys. Calls while a reload is out share one more reload after it: the
   * one out may have read the keys before the change that asked for this call (a revocation would
   * then wait for the version check, README "API keys and plans").
   */
  refresh(): Promise<void> {
    if (this.#refreshing) {
      this.#refreshAgain ??= this.#refreshing
        .catch(() => {})
        .then(() => {
          this.#refreshAgain = undefined;
          return this.refresh();
        });
      return this.#refreshAgain;
    }
    this.#refreshing = (async () => {
      try {
        const version = await this.#store.version();
        const keys = await this.#store.all();
        this.#issued = new Map(keys.map((k) => [k.sha256, k]));
        this.#version = version;
        this.#loaded = true;
      } finally {
        this.#refreshing = undefined;
      }
      for (const listener of this.#refreshed) listener();
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
    const key = newApiKey();
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

  /**
   * Revokes the key issued through the admin API with this id. The store is asked first, whatever the
   * key file holds: a key file read while the issued keys could not be may name an issued id too, and
   * an issued key must always be revocable (README "API keys and plans"). Only an id that no issued
   * key has and the key file has is the file's to remove.
   */
  async revoke(id: string): Promise<RevokeResult> {
    const removed = await this.#store.remove(id);
    for (const [hash, record] of this.#issued) if (record.id === id) this.#issued.delete(hash);
    if (removed) return 'revoked';
    return [...this.#fileKeys.values()].some((k) => k.id === id) ? 'in-key-file' : 'not-found';
  }
}
