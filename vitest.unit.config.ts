import { defineConfig } from 'vitest/config';

/** `npm run test:unit`: the unit tests alone, which need neither a Redis nor a build of dist/. */
export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts'],
    pool: 'threads',
  },
});
