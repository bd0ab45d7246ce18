/**
 * Runs one test body against every storage backend (memory and
 * PostgreSQL): `forBackends(title, async (t, make) => ...)` registers
 * `[memory] title` and `[postgres] title`; `make` builds a ready
 * orchestrator of that backend.
 *
 * Postgres: `JOBFORGE_PG_URL` (default postgres://postgres@127.0.0.1:5432/test)
 * names the server. Every orchestrator gets its own schema
 * (`jf_t_<pid>_<n>`), migrated before the test body runs and dropped at
 * teardown. Postgres variants are `test.serial`: each orchestrator holds
 * connections, and a hundred concurrent tests would exhaust the server.
 *
 * Reachability is probed once per test file, synchronously (ava needs every
 * test declared synchronously, so the skip decision cannot wait for a
 * promise). Unreachable: the postgres variants are skipped with one message,
 * unless `JOBFORGE_REQUIRE_PG=1` (CI), where each of them fails instead.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { spawnSync } from 'node:child_process';
import { JobOrchestrator } from '../dist';
import type { JobOrchestratorOptions, WorkerHandle, WorkerOptions } from '../dist';
import { silentLogger } from './helpers';

export type Backend = 'memory' | 'postgres';

export const PG_URL = process.env.JOBFORGE_PG_URL || 'postgres://postgres@127.0.0.1:5432/test';
const REQUIRE_PG = process.env.JOBFORGE_REQUIRE_PG === '1';

/** Builds orchestrators of one backend for one test. */
export interface Make {
  /** `new JobOrchestrator(opts)` on this backend, migrated (Postgres) and torn down after the test. */
  (opts?: JobOrchestratorOptions): Promise<JobOrchestrator>;
  /** Manual clock, silent logger (like helpers' `manual()`). */
  manual(opts?: Omit<JobOrchestratorOptions, 'clock'>): Promise<JobOrchestrator>;
  /** System clock, silent logger (like helpers' `system()`). */
  system(opts?: Omit<JobOrchestratorOptions, 'clock'>): Promise<JobOrchestrator>;
  /**
   * The full options `make(opts)` would use (Postgres: a fresh schema,
   * dropped at teardown), without building anything: for orchestrators
   * built elsewhere, e.g. in a child process (which must `migrate()`).
   */
  options(opts?: JobOrchestratorOptions): JobOrchestratorOptions;
  readonly backend: Backend;
}

export type BackendTest = (t: ExecutionContext, make: Make) => void | Promise<void>;

// ── reachability (once per file) ──────────────────────────────────────

/**
 * Connects and runs `SELECT 1` in a child process (synchronous for the
 * caller). Uses the `pg` client when installed, else a bare TCP connect to
 * the URL's host and port. Returns null when reachable, else the reason.
 */
function probe(url: string): string | null {
  const script = `
    const url = process.argv[1];
    const fail = (e) => { process.stdout.write(String(e && e.message || e)); process.exit(1); };
    let pg = null;
    try { pg = require('pg'); } catch {}
    if (pg) {
      const c = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
      c.connect().then(() => c.query('SELECT 1')).then(() => c.end()).then(() => process.exit(0), fail);
    } else {
      const u = new URL(url);
      const s = require('node:net').connect(Number(u.port || 5432), u.hostname || '127.0.0.1');
      s.setTimeout(3000, () => fail('TCP connect timed out'));
      s.on('connect', () => { s.destroy(); process.exit(0); });
      s.on('error', fail);
    }
  `;
  const res = spawnSync(process.execPath, ['-e', script, url], {
    cwd: __dirname,
    encoding: 'utf8',
    timeout: 10_000,
  });
  if (res.status === 0) return null;
  if (res.error) return res.error.message;
  return (res.stdout || res.stderr || `probe exited with ${String(res.status ?? res.signal)}`).trim();
}

const unreachable: string | null = probe(PG_URL);
if (unreachable !== null) {
  const msg = REQUIRE_PG
    ? `jobforge tests: PostgreSQL at JOBFORGE_PG_URL=${PG_URL} is unreachable (${unreachable}) and JOBFORGE_REQUIRE_PG=1: every [postgres] test fails.`
    : `jobforge tests: PostgreSQL at JOBFORGE_PG_URL=${PG_URL} is unreachable (${unreachable}): [postgres] tests are skipped (set JOBFORGE_PG_URL, or JOBFORGE_REQUIRE_PG=1 to fail instead).`;
  console.warn(msg);
}

/** Whether the postgres variants run in this process. */
export const postgresAvailable = unreachable === null;

// ── schema cleanup ─────────────────────────────────────────────────────

type PgPool = { query(sql: string): Promise<unknown>; end(): Promise<void> };
let dropPool: PgPool | null = null;

function pool(): PgPool | null {
  if (dropPool !== null) return dropPool;
  let pg: { Pool: new (o: object) => PgPool };
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    pg = require('pg');
  } catch {
    return null; // no client: schemas are left behind (harmless, uniquely named)
  }
  dropPool = new pg.Pool({ connectionString: PG_URL, max: 1, allowExitOnIdle: true });
  return dropPool;
}

test.after.always('close the schema-cleanup connection', async () => {
  if (dropPool !== null) await dropPool.end();
});

async function dropSchema(schema: string): Promise<void> {
  const p = pool();
  if (p === null) return;
  try {
    // lock_timeout: a connection still mid-transaction must not hang the suite.
    await p.query(`SET lock_timeout = '5s'`);
    await p.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  } catch (e) {
    console.warn(`jobforge tests: could not drop schema ${schema}: ${(e as Error).message}`);
  }
}

let schemaCounter = 0;

// ── the makers ─────────────────────────────────────────────────────────

function maker(t: ExecutionContext, backend: Backend): Make {
  const options = (opts: JobOrchestratorOptions = {}): JobOrchestratorOptions => {
    if (backend === 'memory') return { ...opts };
    const schema = `jf_t_${process.pid}_${++schemaCounter}`;
    t.teardown(() => dropSchema(schema));
    return {
      ...opts,
      backend: 'postgres',
      postgres: { url: PG_URL, schema, maxConnections: 2, ...opts.postgres },
    };
  };
  const build = async (opts: JobOrchestratorOptions = {}): Promise<JobOrchestrator> => {
    if (backend === 'memory') return new JobOrchestrator(opts);
    const full = options(opts);
    const o = new JobOrchestrator(full);
    // Registered after the schema drop, so it runs first (teardowns run in
    // reverse order): stop workers, close connections, then drop.
    const workers: WorkerHandle[] = [];
    const startWorker = o.startWorker.bind(o);
    o.startWorker = (w?: WorkerOptions): WorkerHandle => {
      const h = startWorker(w);
      workers.push(h);
      return h;
    };
    t.teardown(async () => {
      for (const h of workers) {
        if (h.running) await Promise.race([h.stop(), new Promise((r) => setTimeout(r, 5000))]);
      }
      await o.close();
    });
    await o.migrate();
    return o;
  };
  const make = build as Make;
  make.manual = (opts = {}) => build({ loggerFactory: () => silentLogger, ...opts, clock: 'manual' });
  make.system = (opts = {}) => build({ loggerFactory: () => silentLogger, ...opts, clock: 'system' });
  make.options = options;
  Object.defineProperty(make, 'backend', { value: backend, enumerable: true });
  return make;
}

function register(backend: Backend, title: string, impl: BackendTest): void {
  const full = `[${backend}] ${title}`;
  if (backend === 'memory') {
    test(full, (t) => impl(t, maker(t, 'memory')));
    return;
  }
  if (unreachable === null) {
    test.serial(full, (t) => impl(t, maker(t, 'postgres')));
  } else if (REQUIRE_PG) {
    test.serial(full, (t) => {
      t.fail(`PostgreSQL at JOBFORGE_PG_URL=${PG_URL} is unreachable (${unreachable}) and JOBFORGE_REQUIRE_PG=1`);
    });
  } else {
    test.skip(full, () => undefined);
  }
}

/** Registers `[memory] title` and `[postgres] title`, both running `impl`. */
export function forBackends(title: string, impl: BackendTest): void {
  register('memory', title, impl);
  register('postgres', title, impl);
}

/**
 * Registers `[memory] title` only. For a test that cannot apply to a
 * database backend; the call site must say why in a comment.
 */
export function memoryOnly(title: string, impl: BackendTest): void {
  register('memory', title, impl);
}

/**
 * Registers `[postgres] title` only. For a test that cannot apply to the
 * memory backend (e.g. several processes sharing one database); the call
 * site must say why in a comment.
 */
export function postgresOnly(title: string, impl: BackendTest): void {
  register('postgres', title, impl);
}

/**
 * Two orchestrators on one fresh schema (as two processes sharing a
 * database would be), closed at teardown; the first has migrated it.
 */
export async function pair(
  t: ExecutionContext,
  make: Make,
  opts: JobOrchestratorOptions = {},
): Promise<[JobOrchestrator, JobOrchestrator]> {
  const full = make.options({ loggerFactory: () => silentLogger, ...opts });
  const a = new JobOrchestrator(full);
  const b = new JobOrchestrator(full);
  t.teardown(async () => {
    await a.close();
    await b.close();
  });
  await a.migrate();
  return [a, b];
}
