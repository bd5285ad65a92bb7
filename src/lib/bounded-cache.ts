import { LRUCache } from 'lru-cache';

/**
 * An LRU cache of at most `entries` entries that takes memory only as it fills. (lru-cache
 * preallocates arrays for every slot when bounded by `max`; bounded by `maxSize` with each
 * entry of size 1 it grows on demand, with the same bound.)
 */
export function boundedCache<K extends NonNullable<unknown>, V extends NonNullable<unknown>>(
  entries: number,
  options: { now?: () => number } = {},
): LRUCache<K, V> {
  return new LRUCache<K, V>({
    maxSize: entries,
    sizeCalculation: () => 1,
    ttlAutopurge: false,
    ...(options.now
      ? {
          // Read the (injectable) clock on every check rather than lru-cache's cached "now".
          ttlResolution: 0,
          perf: { now: options.now },
        }
      : {}),
  });
}
