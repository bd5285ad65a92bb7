import { createRequire } from 'node:module';

/**
 * The gateway's version, from package.json. `src/lib/` and `dist/lib/` both sit two levels below it
 * (the image copies package.json too), so the same relative path works from either.
 */
export const VERSION: string = (createRequire(import.meta.url)('../../package.json') as { version: string }).version;
