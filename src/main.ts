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
  process.on('SIGHUP', () => void gateway.reload('signal'));
  const shutdown = (signal: string): void => {
    gateway.logger.info({ signal }, 'shutting down');
    void gateway.stop().then(() => process.exit(0));
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

await main();
