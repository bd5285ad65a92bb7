import { describe, expect, it } from 'vitest';
import type { KeyRecord } from '../../src/keys/key-file.js';
import { KeyRegistry, MemoryIssuedKeyStore } from '../../src/keys/registry.js';

const fileKey: KeyRecord = { id: 'acme', sha256: 'a'.repeat(64), plan: undefined, source: 'file' };
const issuedKey: KeyRecord = { id: 'acme', sha256: 'b'.repeat(64), plan: undefined, source: 'admin' };

describe('the key registry', () => {
  it('revokes an issued key whose id a key file took while the issued keys could not be read (regression: 409 "in the key file", and the issued key went on passing)', async () => {
    const store = new MemoryIssuedKeyStore();
    await store.add(issuedKey);
    const registry = new KeyRegistry(store);
    registry.setFileKeys([fileKey]);
    await registry.refresh();
    // The admin API's paths by id name the issued key, as revoke() does.
    expect(registry.byId('acme')).toEqual(issuedKey);
    expect(await registry.revoke('acme')).toBe('revoked');
    expect(await store.all()).toEqual([]);
    expect(registry.lookup(issuedKey.sha256)).toBeUndefined();
    // What is left is the key file's.
    expect(registry.byId('acme')).toEqual(fileKey);
    expect(await registry.revoke('acme')).toBe('in-key-file');
    expect(await registry.revoke('nobody')).toBe('not-found');
  });

  it('reloads once more for a change made while a reload was out (regression: the change waited for the version check)', async () => {
    const store = new MemoryIssuedKeyStore();
    await store.add(issuedKey);
    const registry = new KeyRegistry(store);
    await registry.refresh();
    // The next reload reads the keys before the revocation, and answers after it.
    const all = store.all.bind(store);
    let release: () => void = () => {};
    const held = new Promise<void>((resolve) => (release = resolve));
    let reads = 0;
    store.all = async () => {
      reads++;
      const keys = await all();
      if (reads === 1) await held;
      return keys;
    };
    const first = registry.refresh();
    await new Promise((r) => setTimeout(r, 0));
    expect(await store.remove(issuedKey.id)).toBe(true);
    const second = registry.refresh();
    release();
    await first;
    expect(registry.lookup(issuedKey.sha256)).toEqual(issuedKey); // the first reload's stale read
    await second;
    expect(registry.lookup(issuedKey.sha256)).toBeUndefined();
    expect(reads).toBe(2);
  });
});
