import { startSandboxBridge } from './bridge.js';
import type { BridgeKind } from './bodies.js';

/**
 * One sandbox bridge as a process of its own, for deploy/docker-compose.yml:
 * `node dist/sandbox/bridge-main.js eqt|fno [--port 8000] [--host 0.0.0.0]`.
 * It stops on SIGTERM and SIGINT: as a container's first process nothing else would.
 */

const USAGE = 'usage: node dist/sandbox/bridge-main.js eqt|fno [--port PORT] [--host HOST]\n';

function parse(argv: string[]): { kind: BridgeKind; port: number; host: string } | undefined {
  const [kind, ...rest] = argv;
  if (kind !== 'eqt' && kind !== 'fno') return undefined;
  let port = 8000;
  let host = '127.0.0.1';
  for (let i = 0; i < rest.length; i += 2) {
    const value = rest[i + 1];
    if (value === undefined) return undefined;
    if (rest[i] === '--port' && /^\d{1,5}$/.test(value) && Number(value) <= 65535) port = Number(value);
    else if (rest[i] === '--host' && value !== '') host = value;
    else return undefined;
  }
  return { kind, port, host };
}

const options = parse(process.argv.slice(2));
if (!options) {
  process.stderr.write(USAGE);
  process.exit(2);
}
const bridge = await startSandboxBridge(options.kind, { port: options.port, host: options.host });
process.stdout.write(`sandbox ${options.kind} bridge listening on ${options.host}:${bridge.port}\n`);

const stop = (): void => void bridge.close().then(() => process.exit(0));
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
