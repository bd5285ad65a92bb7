import net from 'node:net';

/**
 * A TCP proxy in front of a Redis of the test's own. While `loseReplies` is on, the first
 * bytes Redis sends back on a connection are thrown away and that connection is closed: the
 * command reached Redis and ran, but its client never hears the answer (what a Redis killed
 * between executing a command and writing its reply looks like to the client). While
 * `delayRepliesMs` is above 0, every answer reaches its client that much later, in order (a slow
 * Redis that still answers).
 */
export interface RedisProxy {
  readonly url: string;
  readonly port: number;
  loseReplies: boolean;
  /** Loses the next reply only, as `loseReplies` does, and passes the ones after it. */
  loseNextReply(): void;
  delayRepliesMs: number;
  /** Connections closed because a reply was lost. */
  readonly lost: number;
  close(): Promise<void>;
}

export async function startRedisProxy(redisPort: number): Promise<RedisProxy> {
  const sockets = new Set<net.Socket>();
  const state = { loseReplies: false, loseNext: false, delayRepliesMs: 0, lost: 0 };
  const server = net.createServer((client) => {
    const upstream = net.connect(redisPort, '127.0.0.1');
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
      s.on('error', () => {});
    }
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.on('data', (chunk: Buffer) => upstream.write(chunk));
    upstream.on('data', (chunk: Buffer) => {
      if (state.loseReplies || state.loseNext) {
        state.loseNext = false;
        state.lost++;
        client.destroy();
        upstream.destroy();
        return;
      }
      if (state.delayRepliesMs > 0) setTimeout(() => client.write(chunk), state.delayRepliesMs);
      else client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    loseNextReply() {
      state.loseNext = true;
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
    get lost() {
      return state.lost;
    },
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
