import type { Redis } from 'ioredis';

/**
 * The calls `npm run bench:script` counts Redis's work on (bench/script.ts): a build's consume
 * script, sent as the gateway sends it (the build's own pushConsumeArgs), one call out at a time.
 */

/** What bench:script needs of a build's limits/count-rules.js. */
export interface CountRules {
  readonly CONSUME_SCRIPT: string;
  pushConsumeArgs(
    out: Array<string | number>,
    items: ReadonlyArray<{ readonly request: object }>,
    receipt: { field: string; seq: number; oldestUnsettled: number },
  ): void;
}

/** One build's script loaded into Redis, and the calls it is counted on. */
export class ScriptUnderCount {
  readonly #rules: CountRules;
  readonly #redis: Redis;
  readonly #prefix: string;
  readonly #batch: number;
  #sha = '';
  #seq = 0;
  /** Every call counts in the same windows, whatever the clock does meanwhile (a run across an hour's end counts the same). */
  readonly #hourStart = Math.floor(Date.now() / 3_600_000) * 3600;
  readonly #dayStart = this.#hourStart - (this.#hourStart % 86_400);

  constructor(rules: CountRules, redis: Redis, prefix: string, batch: number) {
    this.#rules = rules;
    this.#redis = redis;
    this.#prefix = prefix;
    this.#batch = batch;
  }

  async load(): Promise<void> {
    this.#sha = (await this.#redis.script('LOAD', this.#rules.CONSUME_SCRIPT)) as string;
  }

  /** `count` calls, one after the other; fails unless every request of every call was allowed. */
  async send(count: number): Promise<void> {
    const hourStart = this.#hourStart;
    const dayStart = this.#dayStart;
    for (let call = 0; call < count; call++) {
      const seq = ++this.#seq;
      const items = Array.from({ length: this.#batch }, (_, i) => ({
        key: `${this.#prefix}{bench-key-${(seq * this.#batch + i) % 64}}:quote`,
        request: {
          keyHash: 'bench',
          counterId: 'quote',
          hourStart,
          dayStart,
          zone: 'Asia/Ho_Chi_Minh',
          hourLimit: 1e9,
          dayLimit: 1e9,
          expireAt: (dayStart + 2 * 86_400) * 1000,
          force: false,
        },
      }));
      const keysThenArgs: Array<string | number> = items.map((item) => item.key);
      this.#rules.pushConsumeArgs(keysThenArgs, items, { field: 'rc:bench', seq, oldestUnsettled: seq });
      const reply = (await this.#redis.evalsha(this.#sha, items.length, ...keysThenArgs)) as number[];
      for (let i = 0; i < items.length; i++)
        if (reply[3 * i] !== 1)
          throw new Error(`call ${seq}: request ${i + 1} was not allowed: ${JSON.stringify(reply)}`);
    }
  }
}
