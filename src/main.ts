import { loadSettings, SettingsError, type Settings } from './config/settings.js';
import { startGateway, StartupError } from './runner.js';

/**
 * `npm start`: reads `config/gateway.yaml`, `limits.yaml` and the environment, and serves.
 * A wrong setting or an invalid table stops start-up with exit code 1 and a precise message.
 */

function fail(message: string): never {
  process.stderr.write(`oapi-gateway: ${message}\n`);
  process.exit(1);
}

export async function main(): Promise<void> {
  // A SIGHUP without a listener ends the process: one that asks for a reload while the gateway
  // starts (its Redis connection may take seconds) is kept for when it serves (README "Running it").
  let reloadAsked = false;
  const askEarly = (): void => {
    reloadAsked = true;
  };
  process.on('SIGHUP', askEarly);
  let settings: Settings;
  try {
    settings = loadSettings();
  } catch (err) {
    if (err instanceof SettingsError) fail(err.message);
    throw err;
  }
  if (settings.workers > 1) {
    const { runCluster } = await import('./cluster.js');
    await runCluster(settings);
    return;
  }
  const gateway = await startGateway({ settings }).catch((err: unknown) => {
    // A setting that names what cannot be had is one line naming it; a table's errors come under a heading.
    if (err instanceof StartupError)
      fail(err.reason !== 'files' ? err.message : `the gateway cannot start:\n${err.message}`);
    throw err;
  });
  process.off('SIGHUP', askEarly);
  process.on('SIGHUP', () => void gateway.reload('signal'));
  if (reloadAsked) void gateway.reload('signal');
  let stopping = false;
  const shutdown = (signal: string): void => {
    if (stopping) return;
    stopping = true;
    gateway.logger.info({ signal }, 'shutting down');
    void gateway.stop().then(() => process.exit(0));
  };
  // Kept for the whole shutdown: a signal without a listener ends the process at once, and under
  // `npm start` the gateway gets one twice (from the process group, and from npm passing it on).
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

await main();
