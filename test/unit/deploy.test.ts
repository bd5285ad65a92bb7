import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { parseLimits } from '../../src/config/load-limits.js';
import { loadSettings, SETTING_VARIABLES, type Settings } from '../../src/config/settings.js';
import { adminOpenApi } from '../../src/openapi/admin.js';

/**
 * deploy/ as the gateway reads it: every variable a manifest sets is a setting and loads,
 * ports and probes are the gateway's, the image runs as non-root, the ConfigMap is the shipped
 * limits.yaml. The dashboard and alert rules are checked against a running gateway's /metrics
 * in test/integration/deploy.test.ts.
 */

const ROOT = new URL('../../', import.meta.url).pathname;
const K8S = join(ROOT, 'deploy/kubernetes');
const TEST_TOKEN = 'deploy-test-token-0123456789';

// The parts of the manifests this test reads, as Kubernetes and Compose define them.
interface Meta {
  readonly name: string;
  readonly labels?: Record<string, string>;
}
interface EnvVar {
  readonly name: string;
  readonly value?: string;
  readonly valueFrom?: { readonly secretKeyRef?: { readonly name: string; readonly key: string } };
}
interface Probe {
  readonly httpGet: { readonly path: string; readonly port: string | number };
}
interface ContainerPort {
  readonly name?: string;
  readonly containerPort: number;
}
interface Container {
  readonly name: string;
  readonly env: EnvVar[];
  readonly ports: ContainerPort[];
  readonly readinessProbe: Probe;
  readonly livenessProbe: Probe;
  readonly resources: { readonly requests: Record<string, string>; readonly limits: Record<string, string> };
  readonly securityContext: Record<string, unknown>;
  readonly volumeMounts: Array<{ readonly name: string; readonly mountPath: string; readonly subPath?: string }>;
}
interface PodSpec {
  readonly containers: Container[];
  readonly volumes: Array<{ readonly name: string; readonly configMap?: { readonly name: string } }>;
  readonly securityContext: { readonly runAsNonRoot?: boolean; readonly runAsUser?: number };
  readonly terminationGracePeriodSeconds: number;
}
interface Manifest {
  readonly kind: string;
  readonly metadata: Meta;
  readonly spec?: unknown;
  readonly data?: Record<string, string>;
  readonly stringData?: Record<string, string>;
  readonly resources?: string[];
}
interface Deployment extends Manifest {
  readonly spec: {
    readonly selector: { readonly matchLabels: Record<string, string> };
    readonly template: { readonly metadata: { readonly labels: Record<string, string> }; readonly spec: PodSpec };
  };
}
interface Service extends Manifest {
  readonly spec: {
    readonly selector: Record<string, string>;
    readonly ports: Array<{ readonly port: number; readonly targetPort: string | number }>;
  };
}
interface Budget extends Manifest {
  readonly spec: {
    readonly maxUnavailable: number;
    readonly selector: { readonly matchLabels: Record<string, string> };
  };
}
interface Autoscaler extends Manifest {
  readonly spec: {
    readonly minReplicas: number;
    readonly scaleTargetRef: { readonly kind: string; readonly name: string };
  };
}
interface ComposeService {
  readonly build?: { readonly context: string; readonly dockerfile: string };
  readonly command?: string[];
  readonly environment?: Record<string, string>;
  readonly healthcheck?: { readonly test?: string[] };
  readonly ports?: string[];
  readonly volumes?: string[];
}

const manifests: Array<{ file: string; doc: Manifest }> = readdirSync(K8S)
  .filter((f) => f.endsWith('.yaml'))
  .flatMap((file) =>
    parseAllDocuments(readFileSync(join(K8S, file), 'utf8')).map((d) => {
      if (d.errors.length) throw new Error(`${file}: ${d.errors[0]?.message}`);
      return { file, doc: d.toJS() as Manifest };
    }),
  );
const byKind = (kind: string): Manifest[] => manifests.filter((m) => m.doc.kind === kind).map((m) => m.doc);
function one<T extends Manifest = Manifest>(kind: string): T {
  const found = byKind(kind);
  expect(found, kind).toHaveLength(1);
  return found[0] as T;
}

const deployment = one<Deployment>('Deployment');
const podSpec = deployment.spec.template.spec;
const container = podSpec.containers.find((c) => c.name === 'gateway') as Container;
const secret = one('Secret');
const configMap = one('ConfigMap');

/** The container's environment as the gateway would see it (secret references resolved). */
function containerEnv(): Record<string, string> {
  const env: Record<string, string> = {};
  for (const entry of container.env) {
    if (entry.value !== undefined) env[entry.name] = String(entry.value);
    else {
      const ref = entry.valueFrom?.secretKeyRef;
      expect(ref?.name, entry.name).toBe(secret.metadata.name);
      const value = secret.stringData?.[ref?.key ?? ''];
      expect(value, `${entry.name} in the Secret`).toBeDefined();
      // An empty token in the shipped Secret means "set one": the admin API stays off until then.
      env[entry.name] = entry.name === 'ADMIN_TOKEN' && value === '' ? TEST_TOKEN : (value as string);
    }
  }
  return env;
}

function settingsOf(env: Record<string, string>): Settings {
  // The settings file of the image (config/gateway.yaml) is read too, as in the container.
  return loadSettings({ env, cwd: ROOT });
}

function portOf(ports: ContainerPort[], ref: string | number): number | undefined {
  return typeof ref === 'number' ? ref : ports.find((p) => p.name === ref)?.containerPort;
}

/** `128Mi` → bytes. */
function bytes(quantity: string): number {
  const m = /^(\d+)(Ki|Mi|Gi|k|M|G)?$/.exec(quantity);
  if (!m) throw new Error(`quantity ${quantity}`);
  const unit = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, k: 1e3, M: 1e6, G: 1e9 }[m[2] ?? ''] ?? 1;
  return Number(m[1]) * unit;
}

describe('the Kubernetes manifests', () => {
  it('parse, and the kustomization lists each of them', () => {
    const files = readdirSync(K8S).filter((f) => f.endsWith('.yaml') && f !== 'kustomization.yaml');
    expect(one('Kustomization').resources?.slice().sort()).toEqual(files.sort());
    for (const kind of [
      'Deployment',
      'Service',
      'ConfigMap',
      'Secret',
      'PodDisruptionBudget',
      'HorizontalPodAutoscaler',
    ])
      expect(byKind(kind), kind).toHaveLength(1);
  });

  it('set only real settings, with values the gateway accepts', () => {
    const env = containerEnv();
    for (const name of Object.keys(env)) expect(SETTING_VARIABLES, name).toContain(name);
    expect(() => settingsOf(env)).not.toThrow();
    // Secrets come from the Secret, never from a literal in the Deployment.
    const adminToken = container.env.find((e) => e.name === 'ADMIN_TOKEN');
    expect(adminToken?.valueFrom?.secretKeyRef?.key).toBe('ADMIN_TOKEN');
    expect(adminToken?.value).toBeUndefined();
  });

  it('name the gateway’s ports, and probe the admin listener where it listens', () => {
    const settings = settingsOf(containerEnv());
    const ports = container.ports;
    expect(portOf(ports, 'http')).toBe(settings.port);
    expect(portOf(ports, 'admin')).toBe(settings.adminPort);
    expect(settings.adminHost).toBe('0.0.0.0'); // on loopback the kubelet could not reach it
    expect(settings.host).toBe('0.0.0.0');

    const open = Object.entries(adminOpenApi({ version: '0' }).paths)
      .filter(([, item]) => item.get?.security?.length === 0)
      .map(([path]) => path);
    const readiness = container.readinessProbe.httpGet;
    const liveness = container.livenessProbe.httpGet;
    expect(readiness.path).toBe('/readyz');
    expect(liveness.path).toBe('/healthz');
    for (const probe of [readiness, liveness]) {
      expect(open).toContain(probe.path);
      expect(portOf(ports, probe.port)).toBe(settings.adminPort);
    }
  });

  it('expose only the public port in the Service', () => {
    const settings = settingsOf(containerEnv());
    const service = one<Service>('Service');
    expect(service.spec.selector).toEqual(deployment.spec.template.metadata.labels);
    const targets = service.spec.ports.map((p) => portOf(container.ports, p.targetPort));
    expect(targets).toEqual([settings.port]);
  });

  it('mount the ConfigMap as the directory of LIMITS_FILE, without subPath', () => {
    const settings = settingsOf(containerEnv());
    const volume = podSpec.volumes.find((v) => v.configMap?.name === configMap.metadata.name);
    expect(volume).toBeDefined();
    const mount = container.volumeMounts.find((m) => m.name === volume?.name);
    expect(mount).toBeDefined();
    expect(mount?.subPath).toBeUndefined();
    expect(mount?.mountPath).toBe(dirname(settings.limitsFile));
    expect(Object.keys(configMap.data ?? {})).toEqual([basename(settings.limitsFile)]);
  });

  it('hold a ConfigMap limits.yaml that is valid and the shipped one', () => {
    const text = configMap.data?.['limits.yaml'] as string;
    const result = parseLimits(text, 'limits.yaml');
    expect(result.ok).toBe(true);
    // Regenerate deploy/kubernetes/configmap.yaml from limits.yaml when this fails.
    expect(text).toBe(readFileSync(join(ROOT, 'limits.yaml'), 'utf8'));
  });

  it('run the image as non-root, on a read-only root filesystem', () => {
    const users = readFileSync(join(ROOT, 'Dockerfile'), 'utf8')
      .split('\n')
      .filter((l) => /^USER\s/.test(l));
    const user = users.at(-1)?.split(/\s+/)[1];
    expect(user).toBeDefined();
    expect(['root', '0']).not.toContain(user?.split(':')[0]);
    expect(podSpec.securityContext).toMatchObject({ runAsNonRoot: true });
    expect(podSpec.securityContext.runAsUser).toBeGreaterThan(0);
    expect(container.securityContext).toMatchObject({
      runAsNonRoot: true,
      readOnlyRootFilesystem: true,
      allowPrivilegeEscalation: false,
      capabilities: { drop: ['ALL'] },
    });
  });

  it('request the measured peak memory and limit it with room to spare', () => {
    const { requests, limits } = container.resources;
    // docs/performance.md: 85 MB RSS idle, 121 MB peak at 50 connections.
    expect(bytes(requests.memory as string)).toBeGreaterThanOrEqual(121e6);
    expect(bytes(limits.memory as string)).toBeGreaterThanOrEqual(1.5 * bytes(requests.memory as string));
    expect(bytes(limits.memory as string)).toBeLessThanOrEqual(512 * 1024 ** 2);
    expect(requests.cpu).toBeDefined(); // the HPA's utilisation is relative to it
  });

  it('keep a replica serving through disruptions and scaling', () => {
    const pdb = one<Budget>('PodDisruptionBudget');
    const hpa = one<Autoscaler>('HorizontalPodAutoscaler');
    expect(pdb.spec.selector.matchLabels).toEqual(deployment.spec.selector.matchLabels);
    expect(hpa.spec.scaleTargetRef).toMatchObject({ kind: 'Deployment', name: deployment.metadata.name });
    expect(hpa.spec.minReplicas).toBeGreaterThanOrEqual(2);
    expect(pdb.spec.maxUnavailable).toBeLessThan(hpa.spec.minReplicas);
    // Shutdown (SHUTDOWN_TIMEOUT_MS, then WebSockets) fits in the grace period with the preStop pause.
    const settings = settingsOf(containerEnv());
    expect(podSpec.terminationGracePeriodSeconds * 1000).toBeGreaterThan(settings.shutdownTimeoutMs + 2000 + 5000);
  });
});

describe('deploy/docker-compose.yml', () => {
  // Compose merges `<<:` keys (the services share their image settings that way).
  const compose = parse(readFileSync(join(ROOT, 'deploy/docker-compose.yml'), 'utf8'), { merge: true }) as {
    services: Record<string, ComposeService>;
  };
  const gateway = compose.services.gateway as ComposeService;

  const env = (): Record<string, string> =>
    Object.fromEntries(
      Object.entries(gateway.environment ?? {}).map(([k, v]) => [
        k,
        String(v).startsWith('${') ? TEST_TOKEN : String(v),
      ]),
    );

  it('sets only real settings on the gateway, with values it accepts', () => {
    for (const name of Object.keys(gateway.environment ?? {})) expect(SETTING_VARIABLES, name).toContain(name);
    expect(() => settingsOf(env())).not.toThrow();
    expect(String(gateway.environment?.ADMIN_TOKEN)).toMatch(/^\$\{ADMIN_TOKEN:\?/); // never a literal token
  });

  it('runs Redis and the two sandbox bridges the gateway points at, from the repository’s Dockerfile', () => {
    const settings = settingsOf(env());
    const build = gateway.build;
    expect(build).toBeDefined();
    expect(existsSync(join(ROOT, 'deploy', build?.context ?? '', build?.dockerfile ?? ''))).toBe(true);
    expect(join(ROOT, 'deploy', build?.context ?? '', '/')).toBe(ROOT);
    for (const kind of ['eqt', 'fno'] as const) {
      const url = settings.bridges[kind];
      const service = compose.services[url.hostname];
      expect(service, url.hostname).toBeDefined();
      const command = service?.command ?? [];
      expect(command.slice(0, 3)).toEqual(['node', 'dist/sandbox/bridge-main.js', kind]);
      expect(existsSync(join(ROOT, 'src/sandbox/bridge-main.ts'))).toBe(true);
      expect(command[command.indexOf('--port') + 1]).toBe(url.port);
      expect(service?.environment).toBeUndefined();
    }
    expect(new URL(settings.redisUrl as string).hostname).toBe('redis');
    expect(compose.services.redis).toBeDefined();
  });

  it('checks the health of each bridge on its own port (regression: the image’s HEALTHCHECK, which asks the admin port, left them unhealthy)', () => {
    const settings = settingsOf(env());
    const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
    expect(dockerfile).toMatch(/^HEALTHCHECK .*ADMIN_PORT/m);
    for (const kind of ['eqt', 'fno'] as const) {
      const url = settings.bridges[kind];
      const test = compose.services[url.hostname]?.healthcheck?.test ?? [];
      expect(test[0], url.hostname).toBe('CMD');
      expect(test.join(' '), url.hostname).toContain(`http://127.0.0.1:${url.port}/`);
      expect(test.join(' '), url.hostname).not.toContain('ADMIN_PORT');
    }
  });

  it('keeps Redis on a volume with its append-only file: the issued API keys live only there (regression: a restart revoked them all)', () => {
    const redis = compose.services.redis as ComposeService;
    const command = redis.command ?? [];
    expect(command[command.indexOf('--appendonly') + 1]).toBe('yes');
    expect(command).not.toContain('--save');
    expect(redis.volumes).toEqual(['redis-data:/data']);
  });

  it('publishes the public port, the admin one on loopback only, and mounts limits.yaml where LIMITS_FILE says', () => {
    const settings = settingsOf(env());
    expect(gateway.ports).toEqual([
      `${settings.port}:${settings.port}`,
      `127.0.0.1:${settings.adminPort}:${settings.adminPort}`,
    ]);
    expect(gateway.volumes).toContain(`../limits.yaml:${settings.limitsFile}:ro`);
    expect(existsSync(join(ROOT, 'limits.yaml'))).toBe(true);
  });
});
