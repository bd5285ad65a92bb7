import { createHash } from 'node:crypto';

/** SHA-256 of a string, as lower-case hex: how API keys are kept and compared (README "API keys and plans"). */
export function sha256Hex(value: string): string {
  return createHash('sha256').update(value).digest('hex');
}
