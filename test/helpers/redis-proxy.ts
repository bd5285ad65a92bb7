import net from 'node:net';

/**
 * A TCP proxy in front of a Redis of the test's own. While `loseReplies` is on, the first
 * bytes Redis sends back on a connection are thrown away and that connection is closed: the
 * command reached Redis and ran, but its client never hears the answer (what a Redis killed
 * between executing a command and writing its reply looks like to the client). While
 * `delayRepliesMs` is above 0, every answer reaches its client that much later, in order (a slow
 * Redis that still answers; once it is lowered, no answer overtakes one still delayed).
 */
export interface RedisProxy {
  readonly url: string;
  readonly port: number;
  loseReplies: boolean;
  /**
   * The next command any client sends is lost: swallowed before Redis sees it (`'request'`), or
   * run by Redis with its reply swallowed (`'reply'`); that connection carries nothing more and
   * closes `closeAfterMs` later. Commands after it, on other connections, pass.
   */
  failNextCommand(lost: 'request' | 'reply', closeAfterMs?: number): void;
  /**
   * The next command that holds `marker` is held here, with everything its connection sends after
   * it, until `release()` forwards all of it in order (a Redis slow to read one connection).
   */
  holdNextCommand(marker: string): { readonly held: boolean; release(): void };
  /** From now on, how often `marker` passes to Redis (not counting a command failNextCommand loses). */
  countForwarded(marker: string): () => number;
  /** From now on, how often `marker` passes from Redis to its clients (in replies, `-MOVED` say). */
  countReplies(marker: string): () => number;
  delayRepliesMs: number;
  /** While true, every connection is closed, and new ones are closed as they come (a Redis that is away). */
  away: boolean;
  /**
   * The connections open now carry nothing more either way (what is sent on them is dropped) and
   * stay open, as behind a proxy that stopped forwarding them; later connections pass.
   */
  silenceOpenConnections(): void;
  /** Connections closed because a command or a reply was lost. */
  readonly lost: number;
  close(): Promise<void>;
}

export async function startRedisProxy(redisPort: number): Promise<RedisProxy> {
  const sockets = new Set<net.Socket>();
  /** Per open connection: makes it carry nothing more. */
  const silencers = new Set<() => void>();
  const state = {
    loseReplies: false,
    next: undefined as { lost: 'request' | 'reply'; closeAfterMs: number } | undefined,
    delayRepliesMs: 0,
    away: false,
    lost: 0,
    markers: [] as Array<{ needle: Buffer; count: number }>,
    replyMarkers: [] as Array<{ needle: Buffer; count: number }>,
    hold: undefined as { needle: Buffer; held: Buffer[] | undefined; release: () => void } | undefined,
  };
  const server = net.createServer((client) => {
    if (state.away) {
      client.destroy();
      return;
    }
    const upstream = net.connect(redisPort, '127.0.0.1');
    /** This connection lost a command: it carries nothing more until it closes. */
    let failed = false;
    /** What this connection sends while a command of it is held, in order. */
    let held: Buffer[] | undefined;
    /** Delayed replies, written in order, and how many are still to be written. */
    let replies = Promise.resolve();
    let delayed = 0;
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {});
    }
    const silence = (): void => {
      failed = true;
    };
    silencers.add(silence);
    client.on('close', () => {
      silencers.delete(silence);
      upstream.destroy();
    });
    upstream.on('close', () => client.destroy());
    client.on('data', (chunk: Buffer) => {
      if (failed) return;
      const next = state.next;
      if (next) {
        state.next = undefined;
        state.lost++;
        failed = true;
        if (next.lost === 'reply') upstream.write(chunk);
        setTimeout(() => {
          client.destroy();
          upstream.destroy();
        }, next.closeAfterMs);
        return;
      }
      if (held) {
        held.push(chunk);
        return;
      }
      const hold = state.hold;
      if (hold && !hold.held && chunk.includes(hold.needle)) {
        held = hold.held = [chunk];
        hold.release = () => {
          for (const c of held ?? []) forward(c);
          held = undefined;
        };
        return;
      }
      forward(chunk);
    });
    const forward = (chunk: Buffer): void => {
      countIn(chunk, state.markers);
      upstream.write(chunk);
    };
    upstream.on('data', (chunk: Buffer) => {
      if (failed) return;
      if (state.loseReplies) {
        state.lost++;
        client.destroy();
        upstream.destroy();
        return;
      }
      countIn(chunk, state.replyMarkers);
      // Never before a reply still being delayed: lowering the delay (to 0 at a test's end) would
      // let a later reply overtake it, and the client would take it for the answer to another command.
      if (state.delayRepliesMs <= 0 && delayed === 0) return void client.write(chunk);
      const due = performance.now() + state.delayRepliesMs;
      delayed++;
      replies = replies.then(
        () =>
          new Promise<void>((resolve) =>
            setTimeout(
              () => {
                delayed--;
                client.write(chunk);
                resolve();
              },
              Math.max(0, due - performance.now()),
            ),
          ),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    failNextCommand(lost, closeAfterMs = 0) {
      state.next = { lost, closeAfterMs };
    },
    holdNextCommand(text) {
      const hold = { needle: Buffer.from(text), held: undefined as Buffer[] | undefined, release: () => {} };
      state.hold = hold;
      return {
        get held() {
          return hold.held !== undefined;
        },
        release: () => {
          if (state.hold === hold) state.hold = undefined;
          hold.release();
        },
      };
    },
    countForwarded(text) {
      const marker = { needle: Buffer.from(text), count: 0 };
      state.markers.push(marker);
      return () => marker.count;
    },
    countReplies(text) {
      const marker = { needle: Buffer.from(text), count: 0 };
      state.replyMarkers.push(marker);
      return () => marker.count;
    },
    get loseReplies() {
      return state.loseReplies;
    },
    set loseReplies(on: boolean) {
      state.loseReplies = on;
    },
    get delayRepliesMs() {
      return state.delayRepliesMs;
    },
    set delayRepliesMs(ms: number) {
      state.delayRepliesMs = ms;
    },
    get away() {
      return state.away;
    },
    set away(away: boolean) {
      state.away = away;
      if (away) for (const s of sockets) s.destroy();
    },
    silenceOpenConnections() {
      for (const silence of silencers) silence();
    },
    get lost() {
      return state.lost;
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Adds to each marker's count the times its needle occurs in `chunk`. */
function countIn(chunk: Buffer, markers: ReadonlyArray<{ needle: Buffer; count: number }>): void {
  for (const marker of markers)
    for (let at = chunk.indexOf(marker.needle); at !== -1; at = chunk.indexOf(marker.needle, at + 1)) marker.count++;
}
