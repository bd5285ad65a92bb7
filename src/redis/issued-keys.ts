import type { IssuedKeyStore } from '../keys/registry.js';
import type { KeyRecord } from '../keys/key-file.js';
import type { RedisClient } from './connection.js';
import { toStoreError } from './errors.js';

/**
 * The issued keys in Redis (README "API keys and plans"): two hashes changed together by one script,
 * by id (listing, unique ids) and by hash (lookup), and a version that moves with every change.
 */

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
