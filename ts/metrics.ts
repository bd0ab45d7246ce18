/**
 * The orchestrator's metrics in a `prom-client` registry (an optional peer
 * dependency): `registerMetrics(orchestrator, registry)` adds one metric
 * per family of `orchestrator.metrics()`, read from that text at each
 * scrape (one `metrics()` call serves every family of a scrape), so an app
 * that already serves its registry at `/metrics` shows them too.
 */
import { JobInputInvalidError } from './errors';

/** A sample as prom-client's `get()` answers it. */
interface Sample {
  metricName?: string;
  labels: Record<string, string>;
  value: number;
}

interface Family {
  name: string;
  help: string;
  type: string;
  values: Sample[];
}

/** The part of a prom-client `Registry` used here. */
export interface PromRegistryLike {
  registerMetric(metric: unknown): void;
  removeSingleMetric(name: string): void;
}

/** Reads label values written by the engine (`\\`, `\"` and `\n` escaped). */
function parseLabels(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    out[m[1]!] = m[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
  }
  return out;
}

/** The families of a text exposition the engine wrote (`# HELP`, `# TYPE`, samples). */
export function parseExposition(text: string): Family[] {
  const families = new Map<string, Family>();
  let current: Family | null = null;
  for (const line of text.split('\n')) {
    if (line === '') continue;
    const help = /^# HELP (\S+) (.*)$/.exec(line);
    if (help) {
      current = { name: help[1]!, help: help[2]!, type: 'untyped', values: [] };
      families.set(current.name, current);
      continue;
    }
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) {
      const f = families.get(type[1]!);
      if (f) f.type = type[2]!;
      continue;
    }
    const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!sample || !current) continue;
    const metricName = sample[1]!;
    current.values.push({
      ...(metricName === current.name ? {} : { metricName }),
      labels: parseLabels(sample[2] ?? ''),
      value: Number(sample[3]),
    });
  }
  return [...families.values()];
}

/** The family names `orchestrator.metrics()` writes (registered even before a run exists). */
const FAMILIES: [string, string][] = [
  ['jobforge_runs_created_total', 'counter'],
  ['jobforge_runs_completed_total', 'counter'],
  ['jobforge_runs_failed_total', 'counter'],
  ['jobforge_runs_timed_out_total', 'counter'],
  ['jobforge_runs_canceled_total', 'counter'],
  ['jobforge_run_retries_total', 'counter'],
  ['jobforge_queue_wait_seconds', 'histogram'],
  ['jobforge_run_duration_seconds', 'histogram'],
  ['jobforge_runs', 'gauge'],
];

/**
 * Registers the orchestrator's series in `registry` (prom-client's
 * `register` or a `new Registry()`); answers a function that removes them.
 */
export function registerPromMetrics(source: { metrics(): Promise<string> }, registry: PromRegistryLike): () => void {
  if (registry === null || typeof registry !== 'object' || typeof registry.registerMetric !== 'function') {
    throw new JobInputInvalidError('registerMetrics needs a prom-client Registry (its register, or a new Registry())');
  }
  // One read of the engine per scrape: the families of one scrape ask together.
  let pending: Promise<Map<string, Family>> | null = null;
  const scrape = (): Promise<Map<string, Family>> => {
    pending ??= source.metrics().then((text) => {
      queueMicrotask(() => (pending = null));
      return new Map(parseExposition(text).map((f) => [f.name, f]));
    });
    const p = pending;
    p.catch(() => (pending = null));
    return p;
  };
  const added: string[] = [];
  try {
    for (const [name, type] of FAMILIES) {
      registry.registerMetric({
        name,
        help: name,
        type,
        aggregator: 'sum',
        // `this.name`: an OpenMetrics registry renames counters (drops `_total`).
        async get(this: { name: string }) {
          // A failed read (the database away, the orchestrator closed) answers
          // no samples rather than failing every metric of the app's scrape.
          const f = await scrape().then(
            (m) => m.get(name),
            () => undefined,
          );
          return { name: this.name, help: f?.help ?? name, type, aggregator: 'sum', values: f?.values ?? [] };
        },
        reset() {},
      });
      added.push(name);
    }
  } catch (e) {
    // All or none: a name the registry already holds leaves nothing of ours.
    for (const name of added) registry.removeSingleMetric(name);
    throw e;
  }
  return () => {
    for (const name of added) registry.removeSingleMetric(name);
  };
}
