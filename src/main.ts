import type { Settings } from './config/settings.js';

/**
 * `npm start`: reads `config/gateway.yaml`, `limits.yaml` and the environment, and serves.
 * A wrong setting or an invalid table stops start-up with exit code 1 and a precise message.
 */

// A SIGHUP without a listener ends the process: one that asks for a reload while the gateway
// starts (its modules take 100–200 ms to load, its Redis connection may take seconds) is kept for
// when it serves (README "Running it"). So the listener comes first, and the modules after it.
let reloadAsked = false;
const askEarly = (): void => {
  reloadAsked = true;
};
process.on('SIGHUP', askEarly);
/** For the listener that takes over (installed first): ends the early one, and says whether a reload was asked meanwhile. */
const takeEarlyReload = (): boolean => {
  process.off('SIGHUP', askEarly);
  return reloadAsked;
};
const { loadSettings, SettingsError } = await import('./config/settings.js');
const { startGateway, StartupError } = await import('./runner.js');

function fail(message: string): never {
  process.stderr.write(`oapi-gateway: ${message}\n`);
  process.exit(1);
}

async function main(): Promise<void> {
  let settings: Settings;
  try {
    settings = loadSettings();
  } catch (err) {
    if (err instanceof SettingsError) fail(err.message);
    throw err;
  }
  if (settings.workers > 1) {
    const { runCluster } = await import('./cluster.js');
    await runCluster(settings, takeEarlyReload);
    return;
  }
  const gateway = await startGateway({ settings }).catch((err: unknown) => {
    // A setting that names what cannot be had is one line naming it; a table's errors come under a heading.
    if (err instanceof StartupError)
      fail(err.reason !== 'files' ? err.message : `the gateway cannot start:\n${err.message}`);
    throw err;
  });
  process.on('SIGHUP', () => void gateway.reload('signal'));
  if (takeEarlyReload()) void gateway.reload('signal');
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
