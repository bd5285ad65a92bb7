import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    pool: 'forks',
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Integration files start servers and Redis instances of their own; a few at a time keeps a 2-core machine responsive.
    maxWorkers: 3,
    minWorkers: 1,
  },
});
