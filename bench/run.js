#!/usr/bin/env node
'use strict';
/**
 * jobforge benchmark suite: every scenario for jobforge and the seed
 * TypeScript orchestrator (../shared/baseline) in one run, implementations
 * alternating inside each repetition, medians over repetitions and the
 * ratio jobforge/baseline. See BENCHMARKS.md for what each scenario times.
 *
 *   npm run bench                       full suite: n = 1k, 10k, 100k, 1M
 *   npm run bench -- --quick            n up to 100k, fewer repetitions
 *   node bench/run.js --render <file>   regenerate BENCHMARKS.md + chart from a results file
 *
 * Options: --reps <k>, --sizes 1000,10000, --only start,keyed,claim,shapes,memory,worker,pg,breakdown,waits,
 * --limit <seconds per point> (default 60), --no-baseline, --docs / --no-docs
 * (a full run updates BENCHMARKS.md and bench/chart.svg, a quick run does not
 * unless --docs is given), --pg-reps <k> (repetitions of bench/pg.js; default
 * 3, quick 1).
 *
 * Sizes: start and claim at the sizes above; keyed at those and 20k;
 * shapes (`start` for every call shape) at 1k and 100k, quick runs too.
 * `--sizes` sets the sizes of every scenario.
 *
 * `pg` runs bench/pg.js (jobforge's PostgreSQL backend against
 * graphile-worker, database JOBFORGE_PG_URL) in a child process; when no
 * server answers it is reported as skipped, not as a failure.
 *
 * Writes bench/results-<timestamp>.json (gitignored).
 */
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { randomUUID } = require('node:crypto');
const report = require('./report');

const ROOT = path.resolve(__dirname, '..');
const BASELINE_PATH = path.resolve(__dirname, '../../shared/baseline/dist');
const WORKER_BENCH = path.join(__dirname, 'worker.js');
const WAITS_BENCH = path.join(__dirname, 'waits.js');
const PG_BENCH = path.join(__dirname, 'pg.js');
const PG_DEFAULT_URL = 'postgres://postgres@127.0.0.1:5432/test'; // bench/pg.js's default
const DOCS = path.join(ROOT, 'BENCHMARKS.md');
const CHART = path.join(__dirname, 'chart.svg');

const NOOP = 'bench.noop';
const CONC = 'bench.conc';
const DEDUPE = 'bench.dedupe';
const POOL = 'batch';

// ── arguments ──────────────────────────────────────────────────────────

function parseArgs(argv) {
  const a = { quick: false, reps: null, pgReps: null, sizes: null, only: null, limitS: 60, baseline: true, docs: null, render: null, child: null };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i];
    const val = () => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${k} needs a value`);
      return v;
    };
    if (k === '--quick') a.quick = true;
    else if (k === '--reps') a.reps = Number(val());
    else if (k === '--pg-reps') a.pgReps = Number(val());
    else if (k === '--sizes') a.sizes = val().split(',').map(Number);
    else if (k === '--only') a.only = new Set(val().split(','));
    else if (k === '--limit') a.limitS = Number(val());
    else if (k === '--no-baseline') a.baseline = false;
    else if (k === '--docs') a.docs = true;
    else if (k === '--no-docs') a.docs = false;
    else if (k === '--render') a.render = val();
    else if (k === '--child') a.child = val(); // internal: memory child process
    else if (k === '--impl') a.impl = val();
    else if (k === '--n') a.n = Number(val());
    else throw new Error(`unknown option ${k}`);
  }
  if (a.reps !== null && !(Number.isInteger(a.reps) && a.reps >= 1)) throw new Error('--reps needs a positive integer');
  if (a.pgReps !== null && !(Number.isInteger(a.pgReps) && a.pgReps >= 1)) throw new Error('--pg-reps needs a positive integer');
  const known = ['start', 'keyed', 'claim', 'shapes', 'memory', 'worker', 'pg', 'breakdown', 'waits'];
  for (const s of a.only ?? []) if (!known.includes(s)) throw new Error(`--only takes ${known.join(',')}; got ${s}`);
  if (a.sizes && a.sizes.some((n) => !(Number.isInteger(n) && n >= 10))) throw new Error('--sizes needs integers ≥ 10');
  return a;
}

// ── timing helpers ─────────────────────────────────────────────────────

const now = () => Number(process.hrtime.bigint());
const sec = (ns) => ns / 1e9;

async function fullGc() {
  // A collected engine is freed by its napi finalizer, which runs on a
  // later turn of the event loop; an engine of 1M runs takes tens of ms to
  // free. Several rounds, so that no earlier point's engine is freed
  // inside the next timed section.
  for (let i = 0; i < 3; i++) {
    global.gc();
    await new Promise((r) => setImmediate(r));
  }
  await new Promise((r) => setTimeout(r, 0));
  global.gc();
}

function medianOf(xs) {
  const v = xs.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// ── implementations ────────────────────────────────────────────────────

class NoopHandler {
  async run() {
    return {};
  }
}

const META = {
  [NOOP]: { pool: POOL },
  [CONC]: { pool: POOL, concurrency: { key: 'c:{{k}}', collisionMode: 'queue' } },
  [DEDUPE]: { pool: POOL, dedupe: { key: 'd:{{k}}', windowMs: 60_000 } },
};

const quietLogger = { log() {}, warn() {}, error() {}, debug() {} };

// Scenario 7 (`shapes`): the types of the call shapes users asked about,
// registered apart from META so that scenarios 1–3 time the orchestrators
// they always did.
const PLAIN = 'plain';
const LANED = 'laned';
const DEDUPED = 'deduped';
const SHAPE_META = {
  [PLAIN]: { pool: POOL },
  [LANED]: { pool: POOL, concurrency: { key: 'c:{{k}}', collisionMode: 'queue' } },
  [DEDUPED]: { pool: POOL, dedupe: { key: 'd:{{k}}', windowMs: 60_000 } },
};

/**
 * The call shapes of scenario 7 (report.js titles them): `call(o, i)` is
 * the timed `start`, the same on both sides; `check(run, i)` is what the
 * i-th returned row must hold. `scans`: the baseline's `start` scans every live run for this
 * shape (a new concurrency key finds no incumbent, a new dedupe key no
 * candidate), so its loop of n starts is O(n²); `copy(i)` then gives the
 * fields of the i-th run for building its live set by copying rows (see
 * `pointShape`).
 */
const SHAPES = [
  { key: 'plain', call: (o, i) => o.start(PLAIN, { n: i }), check: () => true },
  {
    key: 'priority',
    call: (o, i) => o.start(PLAIN, { n: i }, { priority: i % 5 }),
    check: (r, i) => r.priority === i % 5,
  },
  {
    key: 'scope',
    call: (o, i) => o.start(PLAIN, { n: i }, { scope: { entityType: 'order', entityId: 'o' + (i % 100) } }),
    check: (r, i) => r.scopeEntityType === 'order' && r.scopeEntityId === `o${i % 100}`,
  },
  {
    key: 'runAt',
    call: (o, i) => o.start(PLAIN, { n: i }, { runAt: new Date(Date.now() + 60_000) }),
    check: (r) => r.runAt.getTime() > Date.now() + 30_000,
  },
  {
    key: 'tenant',
    multiTenant: true,
    call: (o, i) => o.start(PLAIN, { n: i }, { tenantId: 't' + (i % 10) }),
    check: (r, i) => r.tenantId === `t${i % 10}`,
  },
  {
    key: 'laneDistinct',
    call: (o, i) => o.start(LANED, { k: i, n: i }),
    check: (r, i) => r.concurrencyKey === `c:${i}`,
    scans: true,
    copy: (i) => ({ concurrencyKey: `c:${i}`, input: { k: i, n: i } }),
  },
  {
    key: 'laneShared',
    call: (o, i) => o.start(LANED, { k: i % 50, n: i }),
    check: (r, i) => r.concurrencyKey === `c:${i % 50}`,
  },
  {
    key: 'dedupe',
    call: (o, i) => o.start(DEDUPED, { k: i }),
    check: (r, i) => r.dedupeKey === `d:${i}`,
    scans: true,
    copy: (i) => ({ dedupeKey: `d:${i}`, input: { k: i } }),
  },
];
// report.js titles the shapes by key, in this order.
if (SHAPES.map((sh) => sh.key).join() !== report.SHAPES.map((sh) => sh.key).join()) throw new Error('bench/run.js SHAPES and bench/report.js SHAPES differ');
const TENANTS = Array.from({ length: 10 }, (_, i) => `t${i}`);

function loadImpls(wantBaseline) {
  const jf = require(path.join(ROOT, 'dist'));
  const impls = {
    jobforge: {
      name: 'jobforge',
      create({ meta = META, multiTenant = false } = {}) {
        const o = new jf.JobOrchestrator({ loggerFactory: () => quietLogger, ...(multiTenant ? { multiTenant: true } : {}) });
        for (const [type, m] of Object.entries(meta)) o.registerHandler(type, m, NoopHandler);
        return { o, multiTenant };
      },
      /** n live runs of the keyed type, distinct keys, through the public API. */
      async seedKeyed(inst, type, n) {
        for (let i = 0; i < n; i++) await inst.o.start(type, { k: `s${i}` });
      },
      async status(inst, id) {
        return (await inst.o.findById(id))?.status;
      },
      /** Runs it holds, any status (a multi-tenant engine counts per tenant). */
      async count(inst) {
        const sum = (rows) => rows.reduce((a, c) => a + c.count, 0);
        if (!inst.multiTenant) return sum(await inst.o.countByPoolAndStatus());
        let total = 0;
        for (const t of TENANTS) total += sum(await inst.o.countByPoolAndStatus(t));
        return total;
      },
    },
  };
  const baseline = { present: false, path: BASELINE_PATH, error: null };
  if (!wantBaseline) {
    baseline.error = 'disabled with --no-baseline';
  } else {
    try {
      const b = require(BASELINE_PATH);
      impls.baseline = {
        name: 'baseline',
        create({ meta = META, multiTenant = false } = {}) {
          const store = new b.MemoryJobStore();
          // Its third argument is the multi-tenant switch (JOBS_MULTI_TENANT).
          const o = new b.MemoryJobOrchestrator(store, new b.MemoryJobStepService(store), multiTenant);
          for (const [type, m] of Object.entries(meta)) o.registerHandler(type, m, NoopHandler);
          return { o, store };
        },
        /**
         * n live runs of the keyed type, distinct keys. Through `start` this
         * is O(n²) (every keyed start scans all runs), so the first run goes
         * through `start` and the rest are copies of its row with their own
         * id, key, input and timestamps, written to the store exactly as
         * `start` writes them. The timed sample afterwards uses `start`.
         */
        async seedKeyed(inst, type, n) {
          const tpl = await inst.o.start(type, { k: 's0' });
          const field = type === CONC ? 'concurrencyKey' : 'dedupeKey';
          const prefix = type === CONC ? 'c:' : 'd:';
          this.copyRuns(inst, tpl, 1, n, (i) => ({ [field]: `${prefix}s${i}`, input: { k: `s${i}` } }));
        },
        /**
         * Runs i = from … to − 1 as copies of the row `tpl` that `start`
         * wrote, each with its own id, timestamps and the fields `fieldsOf(i)`
         * (key, input), written to the store as `start` writes a row
         * (every key already in `tpl`, so the rows keep its shape).
         */
        copyRuns(inst, tpl, from, to, fieldsOf) {
          for (let i = from; i < to; i++) {
            const id = randomUUID();
            const at = new Date();
            inst.store.runs.set(id, { ...tpl, id, rootRunId: id, tags: {}, runAt: at, createdAt: at, updatedAt: at, ...fieldsOf(i) });
          }
        },
        async status(inst, id) {
          return inst.store.runs.get(id)?.status;
        },
        async count(inst) {
          return inst.store.runs.size;
        },
      };
      baseline.present = true;
    } catch (e) {
      baseline.error = `cannot load ${BASELINE_PATH}: ${e.message.split('\n')[0]}`;
    }
  }
  return { impls, baseline };
}

/**
 * Fixed sample sizes (claims or keyed starts timed per point). jobforge:
 * min(1000, n/10). Baseline: at most 100, and 10 at 1M, because each of its
 * calls scans all n runs (a 1M claim sorts the whole backlog).
 */
function sampleSize(impl, n) {
  const jf = Math.max(1, Math.min(1000, Math.floor(n / 10)));
  if (impl === 'jobforge') return jf;
  return Math.max(1, Math.min(jf, 100, Math.max(10, Math.floor(1e7 / n))));
}

// ── scenario points ────────────────────────────────────────────────────

/**
 * Scenario 1 and 3 share one build: n unkeyed starts into an empty
 * orchestrator (scenario 1 times them), then a fixed sample of
 * claimNext + tick on that backlog of n pending runs (scenario 3).
 */
async function pointStartClaim(impl, n, want) {
  const w0 = now();
  const inst = impl.create();
  await fullGc();
  const o = inst.o;
  const lastWindow = Math.max(1, Math.min(1000, Math.floor(n / 10)));
  const lastFrom = n - lastWindow;
  const t0 = now();
  let tLast = t0;
  let last = null;
  for (let i = 0; i < n; i++) {
    if (i === lastFrom) tLast = now();
    last = await o.start(NOOP, { n: i });
  }
  // jobforge answers plain starts in JS and hands them to the engine in
  // batches; a read makes it hand over the rest, so the timed section ends
  // with every run in the engine (the baseline's are in its store already).
  if (impl.name === 'jobforge') await o.findById(last.id);
  const t1 = now();
  const out = {};
  if (want.start) {
    out.start = { nsPerOp: (t1 - t0) / n, marginalNsPerOp: (t1 - tLast) / lastWindow, lastWindow, wallS: sec(now() - w0) };
  }
  if (want.claim) {
    await fullGc();
    const S = sampleSize(impl.name, n);
    let lastId = null;
    const c0 = now();
    let c1 = c0;
    for (let i = 0; i < S; i++) {
      const run = await o.claimNext(POOL);
      if (!run) throw new Error(`${impl.name}: backlog empty after ${i} claims at n = ${n}`);
      await o.tick(run.id);
      if (i === 0) c1 = now();
      lastId = run.id;
    }
    const c2 = now();
    const st = await impl.status(inst, lastId);
    if (st !== 'completed') throw new Error(`${impl.name}: claimed run ended '${st}', expected 'completed'`);
    out.claim = {
      nsPerOp: (c2 - c0) / S,
      firstNs: c1 - c0,
      steadyNsPerOp: S > 1 ? (c2 - c1) / (S - 1) : null,
      sample: S,
      wallS: sec(now() - w0),
    };
  }
  return out; // the orchestrator is collected by the next point's GC, before it times anything
}

/** Scenario 2: n live runs of a keyed type (distinct keys), then a fixed sample of keyed starts with new keys. */
async function pointKeyed(impl, type, n, rep) {
  const w0 = now();
  const inst = impl.create();
  await fullGc();
  const s0 = now();
  await impl.seedKeyed(inst, type, n);
  const seedNs = now() - s0;
  await fullGc();
  const S = sampleSize(impl.name, n);
  const keyField = type === CONC ? 'concurrencyKey' : 'dedupeKey';
  const prefix = type === CONC ? 'c:' : 'd:';
  let last = null;
  const ids = new Set();
  const t0 = now();
  for (let i = 0; i < S; i++) {
    last = await inst.o.start(type, { k: `r${rep}_${i}` });
    ids.add(last.id);
  }
  const t1 = now();
  // Sanity: every sample start created a new, claimable run with its own key.
  if (ids.size !== S || last.status !== 'pending' || last[keyField] !== `${prefix}r${rep}_${S - 1}` || last.runAt.getTime() > Date.now() + 1000) {
    throw new Error(`${impl.name}: keyed start sample did not create ${S} distinct claimable runs`);
  }
  return {
    nsPerOp: (t1 - t0) / S,
    sample: S,
    seedNsPerOp: impl.name === 'jobforge' ? seedNs / n : null, // the baseline's seed bypasses start
    wallS: sec(now() - w0),
  };
}

/**
 * Scenario 7: one call shape, timed the way scenario 1 times unkeyed
 * starts. `loop`: a fresh orchestrator, n awaited `shape.call`s one after
 * another (live runs grow 0 → n); ops/s = n ÷ their time, and the cost of
 * the last min(1000, n/10) of them, with about n runs live. `copy` (only
 * for the baseline's `scans` shapes, whose loop is O(n²)): its first run
 * through `start`, the next ones up to the last window copies of that row
 * (`copyRuns`, as scenario 2 builds its live set), then only the last
 * window goes through `start` and is timed. jobforge's timed section ends
 * with a `findById` of the last run, so every run is in the engine when
 * the clock stops (it may answer starts in JS and hand them over in
 * batches).
 */
async function pointShape(impl, shape, n, mode) {
  const w0 = now();
  const inst = impl.create({ meta: SHAPE_META, multiTenant: shape.multiTenant === true });
  const o = inst.o;
  const lastWindow = Math.max(1, Math.min(1000, Math.floor(n / 10)));
  const lastFrom = n - lastWindow;
  let from = 0;
  if (mode === 'copy') {
    const tpl = await shape.call(o, 0);
    impl.copyRuns(inst, tpl, 1, lastFrom, shape.copy);
    from = lastFrom;
  }
  await fullGc();
  const t0 = now();
  let tLast = t0;
  let last = null;
  for (let i = from; i < n; i++) {
    if (i === lastFrom) tLast = now();
    last = await shape.call(o, i);
  }
  if (impl.name === 'jobforge') await o.findById(last.id, shape.multiTenant ? { tenantId: last.tenantId } : undefined);
  const t1 = now();
  // Sanity, off the clock: n runs held, the last one as the shape asked.
  const held = await impl.count(inst);
  if (held !== n || last.status !== 'pending' || !shape.check(last, n - 1)) {
    throw new Error(`${impl.name}: shape ${shape.key} at n = ${n}: ${held} runs held, last ${last.status}, check ${shape.check(last, n - 1)}`);
  }
  return {
    mode,
    nsPerOp: mode === 'loop' ? (t1 - t0) / n : null,
    marginalNsPerOp: (t1 - tLast) / lastWindow,
    lastWindow,
    wallS: sec(now() - w0),
  };
}

// ── time box ───────────────────────────────────────────────────────────

/**
 * Per scenario and implementation: a point (one repetition, setup
 * included) may take at most `limitS`. Before a new n, the wall time is
 * extrapolated from the previous sizes (exponent from the last two, at
 * least `minExp`: 1, or 2 for a loop known to be quadratic, since points
 * of a few ms are too short to show it); when it predicts more, that size
 * and larger are skipped. A repetition that takes longer stops the
 * remaining repetitions and sizes.
 */
class TimeBox {
  constructor(limitS) {
    this.limitS = limitS;
    this.state = new Map();
  }

  entry(key) {
    if (!this.state.has(key)) this.state.set(key, { walls: new Map(), stopped: null, repStop: new Set() });
    return this.state.get(key);
  }

  allowed(key, n, minExp = 1) {
    const e = this.entry(key);
    if (e.stopped) return false;
    if (e.repStop.has(n)) return false;
    if (e.walls.has(n)) return true;
    const prev = [...e.walls.entries()].filter(([m]) => m < n).sort((a, b) => a[0] - b[0]);
    if (prev.length) {
      const [n1, w1s] = prev[prev.length - 1];
      const w1 = medianOf(w1s);
      let exp = minExp;
      if (prev.length >= 2) {
        const [n0, w0s] = prev[prev.length - 2];
        const w0 = medianOf(w0s);
        if (w0 > 0.05) exp = Math.min(2.5, Math.max(minExp, Math.log(w1 / w0) / Math.log(n1 / n0)));
      }
      const predicted = w1 * (n / n1) ** exp;
      if (predicted > this.limitS) {
        e.stopped = {
          atN: n,
          reason: `one point would take about ${predicted.toFixed(0)} s (> ${this.limitS} s), extrapolated from ${report.fmtS(w1)} at n = ${report.fmtN(n1)} with exponent ${exp.toFixed(2)}`,
        };
        return false;
      }
    }
    e.walls.set(n, []);
    return true;
  }

  record(key, n, wallS, nextN) {
    const e = this.entry(key);
    e.walls.get(n).push(wallS);
    if (wallS > this.limitS) {
      e.repStop.add(n);
      e.stopped = {
        atN: nextN ?? n * 10,
        reason: `one repetition at n = ${report.fmtN(n)} took ${wallS.toFixed(1)} s (> ${this.limitS} s); later repetitions and larger sizes skipped`,
      };
    }
  }

  stopped(key) {
    return this.entry(key).stopped;
  }
}

/**
 * Scenario 7: how one implementation measures one shape at n, decided at
 * its first repetition and kept for the others: 'loop' while the time box
 * allows the whole loop (exponent at least `minExp`), else 'copy' where
 * the implementation can build the live set by copying rows and the time
 * box allows that; null: skipped (time box).
 */
function shapePointMode(box, modes, k, n, rep, minExp, canCopy) {
  const id = `${k}@${n}`;
  if (rep === 0 || !modes.has(id)) {
    let mode = null;
    if (box.allowed(k, n, minExp)) mode = 'loop';
    else if (canCopy && box.allowed(`${k}:copy`, n)) mode = 'copy';
    modes.set(id, mode);
    return mode;
  }
  const mode = modes.get(id);
  if (mode === 'loop') return box.allowed(k, n, minExp) ? 'loop' : null;
  if (mode === 'copy') return box.allowed(`${k}:copy`, n) ? 'copy' : null;
  return null;
}

// ── memory (child processes) ───────────────────────────────────────────

async function childMemory(implName, n) {
  const { impls } = loadImpls(implName === 'baseline');
  const impl = impls[implName];
  if (!impl) throw new Error(`implementation ${implName} not available`);
  {
    // Warm the code paths in a throwaway instance, so compiled code is not counted.
    const w = impl.create();
    for (let i = 0; i < 2000; i++) await w.o.start(NOOP, { n: i });
  }
  const inst = impl.create();
  await fullGc();
  await fullGc();
  const before = process.memoryUsage();
  for (let i = 0; i < n; i++) await inst.o.start(NOOP, { n: i });
  await fullGc();
  await fullGc();
  const after = process.memoryUsage();
  // Keep the orchestrator alive until after the measurement, and check it holds n pending runs.
  let pending;
  if (implName === 'jobforge') {
    const counts = await inst.o.countByPoolAndStatus();
    pending = counts.filter((c) => c.status === 'pending').reduce((s, c) => s + c.count, 0);
  } else {
    pending = [...inst.store.runs.values()].filter((r) => r.status === 'pending').length;
  }
  if (pending !== n) throw new Error(`expected ${n} pending runs, found ${pending}`);
  const per = (k) => (after[k] - before[k]) / n;
  const res = {
    n,
    addon: addonIdentity(),
    heapPerRun: per('heapUsed'),
    externalPerRun: per('external'),
    rssPerRun: per('rss'),
    rssBefore: before.rss,
    rssAfter: after.rss,
    heapBefore: before.heapUsed,
    heapAfter: after.heapUsed,
  };
  process.stdout.write(`RESULT ${JSON.stringify(res)}\n`);
}

function runMemoryChild(implName, n, extraArgs) {
  return new Promise((resolve) => {
    const args = ['--expose-gc', `--max-old-space-size=${heapLimitMb()}`, __filename, '--child', 'memory', '--impl', implName, '--n', String(n), ...extraArgs];
    const p = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    p.on('close', (code) => {
      const line = out.split('\n').find((l) => l.startsWith('RESULT '));
      if (code === 0 && line) resolve(JSON.parse(line.slice(7)));
      else resolve({ n, error: `child exited ${code}: ${(err || out).trim().split('\n').slice(-3).join(' / ')}` });
    });
  });
}

// ── worker end to end (bench/worker.js, written separately) ────────────

/**
 * Runs bench/worker.js (jobforge's worker against a bare JS loop; the
 * baseline has no worker) in a child process and keeps its output; the
 * `median …` / `ratio …` lines are picked out for the table.
 */
function runWorkerBench(quick) {
  if (!fs.existsSync(WORKER_BENCH)) return Promise.resolve({ present: false });
  const extra = quick ? ['--n', '10000'] : [];
  const args = ['--expose-gc', WORKER_BENCH, ...extra];
  const command = ['node', '--expose-gc', path.relative(ROOT, WORKER_BENCH), ...extra].join(' ');
  return new Promise((resolve) => {
    const t0 = now();
    const p = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      p.kill('SIGTERM');
    }, 20 * 60 * 1000);
    p.stdout.on('data', (d) => {
      out += d;
      process.stdout.write(String(d).replace(/^(?=.)/gm, '  [worker] '));
    });
    p.stderr.on('data', (d) => (err += d));
    p.on('close', (status) => {
      clearTimeout(timer);
      const lines = out.split('\n');
      const num = (s) => Number(s.replace(/,/g, ''));
      const medians = {};
      for (const l of lines) {
        const m = /^median (\S+):\s*([\d.,]+) ms = ([\d.,]+) jobs\/s/.exec(l.trim());
        if (m) medians[m[1]] = { ms: num(m[2]), jobsPerS: num(m[3]) };
      }
      resolve({
        present: true,
        command,
        status,
        timedOut,
        wallS: sec(now() - t0),
        medians,
        ratioLine: lines.find((l) => l.startsWith('ratio')) ?? null,
        drain: drainOf(lines, medians),
        stdout: lines.slice(-60).join('\n'),
        stderrTail: err.split('\n').slice(-20).join('\n'),
      });
    });
  });
}

/**
 * The drain of bench/worker.js (a started backlog run by
 * `startWorker({ pools: { batch: { concurrency: 64 } } })`, against the
 * bare loop at the same n), picked out of its `# drain: …`, `median
 * drain…` and `ratio drain/bare: …` lines; null when it printed none.
 */
function drainOf(lines, medians) {
  const head = lines.map((l) => /^# drain: ([\d,]+) runs/.exec(l)).find(Boolean);
  const ratio = lines.map((l) => /^ratio drain\/bare: throughput ([\d.]+)/.exec(l.trim())).find(Boolean);
  const j = medians.drain;
  const b = medians['drain-bare'];
  if (!head || !ratio || !j || !b) return null;
  return { n: Number(head[1].replace(/,/g, '')), ms: j.ms, jobsPerS: j.jobsPerS, bareMs: b.ms, bareJobsPerS: b.jobsPerS, ratio: Number(ratio[1]) };
}

// ── PostgreSQL vs graphile-worker (bench/pg.js, written separately) ──

/**
 * Runs bench/pg.js in a child process with `--json <temp file>` and keeps
 * the JSON it writes (its `skipped` is set when no server answers: that is
 * reported as skipped, not as a failure) plus the tail of its output.
 * Quick runs pass the quick flags; the database comes from JOBFORGE_PG_URL
 * (inherited), as bench/pg.js reads it.
 */
function runPgBench(quick, reps) {
  if (!fs.existsSync(PG_BENCH)) return Promise.resolve({ present: false });
  const jsonFile = path.join(os.tmpdir(), `jobforge-pg-bench-${process.pid}-${Date.now()}.json`);
  const extra = [...(quick ? ['--n', '5000', '--seconds', '2', '--enqueue-n', '500'] : []), '--reps', String(reps)];
  const args = [PG_BENCH, ...extra, '--json', jsonFile];
  const url = process.env.JOBFORGE_PG_URL || PG_DEFAULT_URL;
  const envNote = process.env.JOBFORGE_PG_URL ? `JOBFORGE_PG_URL=${redactUrl(url)} ` : '';
  const command = `${envNote}node ${path.relative(ROOT, PG_BENCH)} ${extra.join(' ')} --json <file>`;
  return new Promise((resolve) => {
    const t0 = now();
    const p = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      p.kill('SIGTERM');
    }, 30 * 60 * 1000);
    p.stdout.on('data', (d) => {
      out += d;
      process.stdout.write(String(d).replace(/^(?=.)/gm, '  [pg] '));
    });
    p.stderr.on('data', (d) => {
      err += d;
      process.stderr.write(String(d).replace(/^(?=.)/gm, '  [pg] '));
    });
    p.on('close', (status, signal) => {
      clearTimeout(timer);
      let data = null;
      let error = null;
      try {
        data = JSON.parse(fs.readFileSync(jsonFile, 'utf8'));
      } catch (e) {
        error = `bench/pg.js wrote no results (exit ${status ?? signal}${timedOut ? ', timed out after 30 min' : ''}): ${(err || out).trim().split('\n').slice(-3).join(' / ') || e.message}`;
      }
      fs.rmSync(jsonFile, { force: true });
      resolve({
        present: true,
        command,
        url: redactUrl(url),
        status,
        signal,
        timedOut,
        wallS: sec(now() - t0),
        error,
        data,
        stdout: out.split('\n').slice(-80).join('\n'),
        stderrTail: err.split('\n').slice(-20).join('\n'),
      });
    });
  });
}

function redactUrl(url) {
  return url.replace(/(\/\/[^:/@]+):[^@]*@/, '$1:***@');
}

// ── per-call breakdown (diagnostic) ────────────────────────────────────

async function breakdown(impls) {
  const N = 20000;
  const out = {};
  const timeSync = (f) => {
    const t0 = now();
    for (let i = 0; i < N; i++) f(i);
    return (now() - t0) / N;
  };
  const timeAsync = async (f) => {
    const t0 = now();
    for (let i = 0; i < N; i++) await f(i);
    return (now() - t0) / N;
  };
  {
    // jobforge: the layers of one start and one claim + tick. Reads the
    // orchestrator's private native engine (`store.native`) and the dist
    // helpers directly;
    // an item whose internals changed shape is reported as skipped.
    const inst = impls.jobforge.create();
    const o = inst.o;
    const items = [];
    const tryItem = async (label, f) => {
      try {
        items.push({ label, ns: await f() });
      } catch (e) {
        items.push({ label, ns: null, note: `skipped: ${String(e.message).split('\n')[0]}` });
      }
    };
    await fullGc();
    await tryItem('`await start(type, {n})` (public API)', () => timeAsync((i) => o.start(NOOP, { n: i })));
    let toJsonText;
    let parseRun;
    let OP = {};
    try {
      ({ toJsonText } = require(path.join(ROOT, 'dist/json')));
      ({ parseRun } = require(path.join(ROOT, 'dist/wire')));
      ({ OP } = require(path.join(ROOT, 'dist/native')));
    } catch {
      /* reported below as skipped */
    }
    const nat = o.store?.native;
    await tryItem('  input check + JSON text (`toJsonText`)', async () => timeSync((i) => toJsonText({ n: i }, 'input')));
    await tryItem('  a bare napi call (native `now()`, returns a number)', async () => timeSync(() => nat.now()));
    await tryItem('  native hand-over of buffered starts (`startBatch` of 256 lines into a new engine, per run)', async () => {
      // What a plain start costs in the engine: JS answers the start and
      // queues a line; the lines reach the engine 256 at a time.
      let ns = 0;
      let runs = 0;
      for (let r = 0; r < 40; r++) {
        const fresh = impls.jobforge.create().o;
        const eng = fresh.store.native;
        for (let b = 0; b < 4; b++) {
          const ids = eng.newRunIds(256);
          const at = eng.now();
          let text = '';
          for (let i = 0; i < 256; i++) text += `${ids.slice(i * 36, i * 36 + 36)}${at},${NOOP.length}:${NOOP}{"n":${i}}\n`;
          const t0 = now();
          eng.startBatch(text, false);
          ns += now() - t0;
          runs += 256;
        }
      }
      return ns / runs;
    });
    let row = '';
    const startReq = `{"type":${JSON.stringify(NOOP)},"input":{"n":1}}`;
    await tryItem('  native `start` (napi call, engine, row JSON out)', async () => timeSync(() => (row = nat.callSync(OP.start, startReq))));
    await tryItem(`  parse of the returned row (\`parseRun\`, ${row.length} chars of JSON)`, async () => timeSync(() => parseRun(row)));
    // Claim path, steady state: the first claim moves the due backlog into the ready index.
    const first = await o.claimNext(POOL);
    await o.tick(first.id);
    const M = 5000;
    let claimRows = [];
    await tryItem('`await claimNext()` + `await tick()` (public API, after the first claim)', async () => {
      let c = 0;
      let t = 0;
      for (let i = 0; i < M; i++) {
        const t0 = now();
        const run = await o.claimNext(POOL);
        const t1 = now();
        await o.tick(run.id);
        t += now() - t1;
        c += t1 - t0;
      }
      claimRows = [
        { label: '  `await claimNext()`', ns: c / M },
        { label: '  `await tick()` of a no-op handler (begin attempt, run handler, finish attempt)', ns: t / M },
      ];
      return (c + t) / M;
    });
    items.push(...claimRows);
    let parseRows = [];
    await tryItem('  native `claimNext` alone', async () => {
      const rows = [];
      const t0 = now();
      const claimReq = JSON.stringify({ pool: POOL });
      for (let i = 0; i < M; i++) rows.push(nat.callSync(OP.claimNext, claimReq));
      const ns = (now() - t0) / M;
      const t1 = now();
      for (const r of rows) parseRun(r);
      parseRows = [{ label: '  parse of the claimed row (`parseRun`)', ns: (now() - t1) / M }];
      return ns;
    });
    items.push(...parseRows);
    out.jobforge = items;
  }
  out.start1k = await startAccounting(impls);
  // The same for a start with one option (`{ priority }`): the floor reads it too.
  out.startPriority1k = await startAccounting(impls, 1000, 21, (i) => ({ priority: i % 5 }));
  // Every option shape of scenario 7 whose target is missed, at both of its
  // sizes: the design's bound for each (baseline ÷ (floor + hand-over)).
  out.shapes = [];
  for (const [n, reps] of [[1000, 21], [100000, 5]]) {
    for (const sh of ACCOUNTED_SHAPES) {
      out.shapes.push(await startAccounting(impls, n, reps, sh.opts, { multiTenant: sh.multiTenant === true, key: sh.key }));
    }
  }
  // Keyed start (target: 50× at 20k live runs): how much of it is the engine's own call.
  try {
    out.keyed20k = await keyedAccounting(impls, CONC, 20000);
  } catch (e) {
    out.keyed20k = { skipped: String(e.message).split('\n')[0] };
  }
  await fullGc();
  if (impls.baseline) {
    const inst = impls.baseline.create();
    const o = inst.o;
    const items = [];
    items.push({ label: '`await start(type, {n})` (public API)', ns: await timeAsync((i) => o.start(NOOP, { n: i })) });
    items.push({ label: '  `crypto.randomUUID()`', ns: timeSync(() => randomUUID()) });
    items.push({ label: '  one pass through its promise mutex (`mutex.run(async () => null)`)', ns: await timeAsync(() => o.mutex.run(async () => null)) });
    out.baseline = items;
  }
  await fullGc();
  return out;
}

/**
 * Where the time of scenario 1 at n = 1k goes (the point whose target is
 * missed): the same loop as `pointStartClaim`, repeated, three ways
 * alternating: jobforge as it is, with the time of its native hand-overs
 * (`startBatch`) summed inside the loop; jobforge with the hand-over
 * replaced by a no-op (its JS side alone, which no engine work can go
 * below; the runs are never created); the contract floor (below); and the
 * baseline. Medians.
 */
async function startAccounting(impls, n = 1000, reps = 21, opts = null, { multiTenant = false, key = null } = {}) {
  const kinds = ['jobforge', 'jsOnly', 'floor', ...(impls.baseline ? ['baseline'] : [])];
  const samples = Object.fromEntries(kinds.map((k) => [k, []]));
  const handOver = [];
  const idBlock = Array.from({ length: 256 }, () => randomUUID()).join('');
  const once = async (kind) => {
    const inst = kind === 'floor' ? { o: contractFloor(idBlock) } : (kind === 'baseline' ? impls.baseline : impls.jobforge).create({ multiTenant });
    const o = inst.o;
    let inNative = 0;
    if (kind === 'jobforge' || kind === 'jsOnly') {
      const eng = o.store?.native; // private: the in-memory NativeEngine
      if (typeof eng?.startBatch !== 'function') throw new Error('internals changed: no engine.startBatch');
      const real = eng.startBatch.bind(eng);
      eng.startBatch =
        kind === 'jsOnly'
          ? () => ''
          : (text, fed) => {
              const t = now();
              const r = real(text, fed);
              inNative += now() - t;
              return r;
            };
    }
    await fullGc();
    const t0 = now();
    let last = null;
    for (let i = 0; i < n; i++) last = await o.start(NOOP, { n: i }, opts === null ? undefined : opts(i));
    if (kind === 'jobforge' || kind === 'jsOnly') await o.findById(last.id, multiTenant ? { tenantId: last.tenantId } : undefined);
    const ns = (now() - t0) / n;
    return { ns, inNative: inNative / n };
  };
  for (const k of kinds) await once(k); // warm-up
  for (let r = 0; r < reps; r++) {
    for (const k of r % 2 ? [...kinds].reverse() : kinds) {
      const { ns, inNative } = await once(k);
      samples[k].push(ns);
      if (k === 'jobforge') handOver.push(inNative);
    }
  }
  return {
    n,
    reps,
    key,
    shape: opts === null ? null : JSON.stringify(opts(1)),
    jobforgeNs: medianOf(samples.jobforge),
    handOverNs: medianOf(handOver),
    jsOnlyNs: medianOf(samples.jsOnly),
    floorNs: medianOf(samples.floor),
    baselineNs: impls.baseline ? medianOf(samples.baseline) : null,
  };
}

/**
 * Scenario 2a's keyed start at n live runs, three ways, alternating
 * repetitions: the public `start` (as scenario 2a times it); the engine's
 * own call for the same start (`callSync('start')` with the request text
 * built beforehand and the answer not read: napi crossing, request parse,
 * key, lane, insert, answer text); and the contract floor (answering the
 * row, no store). The engine must decide a keyed start before it is
 * answered (a new key may join a lane, hit a dedupe window, collide), so
 * no keyed start of this design costs less than engine call + floor.
 */
async function keyedAccounting(impls, type, n, reps = 5, sample = 1000) {
  const { startRequest } = require(path.join(ROOT, 'dist/wire'));
  const { OP } = require(path.join(ROOT, 'dist/native'));
  const pub = [];
  const eng = [];
  const floor = [];
  const idBlock = Array.from({ length: 256 }, () => randomUUID()).join('');
  for (let r = 0; r < reps + 1; r++) {
    const inst = impls.jobforge.create();
    await impls.jobforge.seedKeyed(inst, type, n);
    const nat = inst.o.store?.native;
    if (typeof nat?.callSync !== 'function') throw new Error('internals changed: no engine.callSync');
    const reqs = Array.from({ length: sample }, (_, i) => startRequest(type, JSON.stringify({ k: `e${r}_${i}` }), null, true));
    await fullGc();
    const order = r % 2 ? ['engine', 'public', 'floor'] : ['public', 'engine', 'floor'];
    for (const k of order) {
      const t0 = now();
      if (k === 'public') for (let i = 0; i < sample; i++) await inst.o.start(type, { k: `p${r}_${i}` });
      else if (k === 'engine') for (let i = 0; i < sample; i++) nat.callSync(OP.start, reqs[i]);
      else {
        const f = contractFloor(idBlock);
        for (let i = 0; i < sample; i++) await f.start(type, { k: `f${r}_${i}` });
      }
      const ns = (now() - t0) / sample;
      if (r > 0) (k === 'public' ? pub : k === 'engine' ? eng : floor).push(ns); // r = 0 warms up
    }
  }
  return { n, reps, sample, type, publicNs: medianOf(pub), engineNs: medianOf(eng), floorNs: medianOf(floor) };
}

/**
 * The least any implementation of the contract does per awaited `start`:
 * an async call that answers with the contract's row (its three `Date`s,
 * an id sliced from a pre-made block, the caller's input as it is). It
 * checks nothing, copies nothing, writes no JSON and stores nothing, so
 * the baseline's time over this one bounds the ratio any store, however
 * cheap, could reach in scenario 1.
 */
/** The option shapes of scenario 7 (same options) that `breakdown` accounts for. */
const ACCOUNTED_SHAPES = [
  { key: 'priority', opts: (i) => ({ priority: i % 5 }) },
  { key: 'scope', opts: (i) => ({ scope: { entityType: 'order', entityId: 'o' + (i % 100) } }) },
  { key: 'runAt', opts: () => ({ runAt: new Date(Date.now() + 60_000) }) },
  { key: 'tenant', multiTenant: true, opts: (i) => ({ tenantId: 't' + (i % 10) }) },
];

function contractFloor(idBlock) {
  let next = 0;
  return {
    async start(jobType, input, opts) {
      const at = Date.now();
      const id = idBlock.slice(next, next + 36);
      next = (next + 36) % idBlock.length;
      return {
        id,
        jobType,
        jobVersion: 1,
        parentRunId: null,
        rootRunId: id,
        parentClosePolicy: 'terminate',
        scopeEntityType: opts?.scope ? opts.scope.entityType : null,
        scopeEntityId: opts?.scope ? opts.scope.entityId : null,
        tenantId: opts?.tenantId ?? null,
        tags: {},
        pool: POOL,
        priority: opts?.priority ?? 0,
        concurrencyKey: null,
        dedupeKey: null,
        status: 'pending',
        input,
        output: null,
        error: null,
        triggerSource: 'manual',
        triggerRef: null,
        // A row of its own: not the caller's Date.
        runAt: opts?.runAt ? new Date(opts.runAt.getTime()) : new Date(at),
        startedAt: null,
        finishedAt: null,
        claimedAt: null,
        attempts: 0,
        waitKind: null,
        resumeToken: null,
        waitDeadline: null,
        createdAt: new Date(at),
        updatedAt: new Date(at),
      };
    },
  };
}

// ── machine ────────────────────────────────────────────────────────────

function machineInfo() {
  let cpuModel = os.cpus()[0]?.model ?? 'unknown';
  let memTotalBytes = os.totalmem();
  try {
    const m = /^model name\s*:\s*(.+)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'));
    if (m) cpuModel = m[1].trim();
  } catch {
    /* not Linux */
  }
  try {
    const m = /^MemTotal:\s*(\d+) kB/m.exec(fs.readFileSync('/proc/meminfo', 'utf8'));
    if (m) memTotalBytes = Number(m[1]) * 1024;
  } catch {
    /* not Linux */
  }
  const np = spawnSync('nproc', { encoding: 'utf8' });
  const nproc = np.status === 0 ? Number(np.stdout.trim()) : os.availableParallelism?.() ?? os.cpus().length;
  const git = (args) => {
    const r = spawnSync('git', args, { cwd: ROOT, encoding: 'utf8' });
    return r.status === 0 ? r.stdout.trim() : null;
  };
  return {
    cpuModel,
    nproc,
    memTotalBytes,
    node: process.version,
    v8: process.versions.v8,
    platform: `${os.platform()}-${os.arch()}`,
    kernel: os.release(),
    jobforgeCommit: git(['rev-parse', '--short', 'HEAD']),
    addon: addonIdentity(),
    dirty: (git(['status', '--porcelain', '--untracked-files=no']) ?? '') !== '',
  };
}

/** Which build of the addon and dist/ was measured (the tree may change between runs). */
function addonIdentity() {
  const out = {};
  for (const f of fs.readdirSync(ROOT).filter((x) => x.endsWith('.node'))) {
    const buf = fs.readFileSync(path.join(ROOT, f));
    out[f] = { sha256: require('node:crypto').createHash('sha256').update(buf).digest('hex').slice(0, 16), mtime: fs.statSync(path.join(ROOT, f)).mtime.toISOString() };
  }
  try {
    const dist = path.join(ROOT, 'dist');
    const files = fs.readdirSync(dist).filter((x) => x.endsWith('.js')).sort();
    const h = require('node:crypto').createHash('sha256');
    let mtime = 0;
    for (const f of files) {
      h.update(f).update(fs.readFileSync(path.join(dist, f)));
      mtime = Math.max(mtime, fs.statSync(path.join(dist, f)).mtimeMs);
    }
    out['dist/*.js'] = { sha256: h.digest('hex').slice(0, 16), mtime: new Date(mtime).toISOString() };
  } catch {
    /* no dist */
  }
  return out;
}

function heapLimitMb() {
  return Math.max(4096, Math.min(16384, Math.floor((os.totalmem() / 2 ** 20) * 0.6)));
}

// ── docs ───────────────────────────────────────────────────────────────

function writeDocs(results, resultsFile) {
  const rel = path.relative(ROOT, resultsFile);
  fs.writeFileSync(CHART, report.renderSvg(results));
  report.updateBenchmarksMd(DOCS, report.renderMarkdown(results, { resultsFile: rel, chartFile: path.relative(ROOT, CHART) }));
  console.log(`\nwrote ${path.relative(ROOT, CHART)} and the generated section of ${path.relative(ROOT, DOCS)} from ${rel}`);
}

// ── main ───────────────────────────────────────────────────────────────

async function main(args) {
  const wall0 = now();
  const startedAt = new Date().toISOString();
  const sizes = args.sizes ?? (args.quick ? [1000, 10000, 100000] : [1000, 10000, 100000, 1000000]);
  // Keyed start also at 20k (its own target there); the call shapes at 1k and 100k only (eight shapes a point).
  const keyedSizes = args.sizes ?? [...new Set([...sizes, 20000])].sort((a, b) => a - b);
  const shapeSizes = args.sizes ?? [1000, 100000];
  const reps = args.reps ?? (args.quick ? 3 : 5);
  const smallReps = reps * 3; // n ≤ 10k points take milliseconds: three times the repetitions
  const memorySizes = (args.quick ? [100000] : [100000, 1000000]).filter((n) => !args.sizes || n <= Math.max(...sizes));
  const on = (s) => !args.only || args.only.has(s);
  const { impls, baseline } = loadImpls(args.baseline);
  const names = Object.keys(impls);
  const command = `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(' ')}` : ''}`;

  console.log(`jobforge benchmarks: ${command}`);
  console.log(
    `sizes ${sizes.map(report.fmtN).join(', ')} (keyed: ${keyedSizes.map(report.fmtN).join(', ')}; shapes: ${shapeSizes.map(report.fmtN).join(', ')}); ` +
      `${reps} repetitions (n ≤ 10k: ${smallReps}); time box ${args.limitS} s per point`,
  );
  if (!baseline.present) console.log(`baseline absent (${baseline.error}): reporting jobforge only`);

  const results = {
    version: 1,
    startedAt,
    command,
    machine: machineInfo(),
    load: { start: os.loadavg(), end: null },
    baseline,
    config: { sizes, keyedSizes, shapeSizes, reps, smallReps, memorySizes, limitS: args.limitS, quick: args.quick, pgReps: args.pgReps ?? (args.quick ? 1 : 3), samples: {} },
    scenarios: {},
    memory: null,
    worker: null,
    pg: null,
    breakdown: null,
  };
  const scenKeys = [
    ...(on('start') ? ['start'] : []),
    ...(on('keyed') ? ['conc', 'dedupe'] : []),
    ...(on('claim') ? ['claim'] : []),
    ...(on('shapes') ? SHAPES.map((sh) => `shape.${sh.key}`) : []),
  ];
  // The sizes of each scenario; the loop below goes through their union.
  const sizesOf = { start: sizes, claim: sizes, conc: keyedSizes, dedupe: keyedSizes };
  for (const sh of SHAPES) sizesOf[`shape.${sh.key}`] = shapeSizes;
  const allSizes = [...new Set(scenKeys.flatMap((s) => sizesOf[s]))].sort((a, b) => a - b);
  const at = (s, n) => scenKeys.includes(s) && sizesOf[s].includes(n);
  const nextOf = (s, n) => sizesOf[s].find((m) => m > n);
  for (const n of allSizes) results.config.samples[n] = { jobforge: sampleSize('jobforge', n), baseline: sampleSize('baseline', n) };
  const raw = {};
  for (const s of scenKeys) {
    results.scenarios[s] = {};
    raw[s] = {};
    for (const i of names) raw[s][i] = {};
  }
  const box = new TimeBox(args.limitS);
  const key = (s, i) => `${s}/${i}`;
  // Scenario 7: how each implementation measures each shape at each n ('loop' or 'copy'), decided at its first repetition.
  const shapeMode = new Map();

  if (scenKeys.length) {
    // Warm-up (not recorded): every code path of every implementation.
    process.stdout.write('warm-up… ');
    for (const i of names) {
      await pointStartClaim(impls[i], 2000, { start: true, claim: true });
      await pointKeyed(impls[i], CONC, 2000, -1);
      await pointKeyed(impls[i], DEDUPE, 2000, -1);
      if (on('shapes')) {
        for (const sh of SHAPES) {
          await pointShape(impls[i], sh, 2000, 'loop');
          if (sh.copy && impls[i].copyRuns) await pointShape(impls[i], sh, 2000, 'copy');
        }
      }
    }
    console.log('done');
  }

  for (let si = 0; si < allSizes.length; si++) {
    const n = allSizes[si];
    const k = n <= 10000 ? smallReps : reps;
    for (let rep = 0; rep < k; rep++) {
      const order = rep % 2 === 0 ? names : [...names].reverse();
      for (const i of order) {
        const impl = impls[i];
        const line = [];
        const rw0 = now();
        const want = {
          start: at('start', n) && box.allowed(key('start', i), n),
          claim: at('claim', n) && box.allowed(key('claim', i), n),
        };
        if (want.start || want.claim) {
          const r = await pointStartClaim(impl, n, want);
          for (const s of ['start', 'claim']) {
            if (!r[s]) continue;
            (raw[s][i][n] ??= []).push(r[s]);
            box.record(key(s, i), n, r[s].wallS, nextOf(s, n));
            line.push(`${s} ${report.fmtNs(r[s].nsPerOp)}`);
          }
        }
        for (const [s, type] of [
          ['conc', CONC],
          ['dedupe', DEDUPE],
        ]) {
          if (!at(s, n) || !box.allowed(key(s, i), n)) continue;
          const r = await pointKeyed(impl, type, n, rep);
          (raw[s][i][n] ??= []).push(r);
          box.record(key(s, i), n, r.wallS, nextOf(s, n));
          line.push(`${s} ${report.fmtNs(r.nsPerOp)}`);
        }
        for (const sh of SHAPES) {
          const s = `shape.${sh.key}`;
          if (!at(s, n)) continue;
          const mode = shapePointMode(box, shapeMode, key(s, i), n, rep, sh.scans && impl.name === 'baseline' ? 2 : 1, !!(sh.copy && impl.copyRuns));
          if (!mode) continue;
          const r = await pointShape(impl, sh, n, mode);
          (raw[s][i][n] ??= []).push(r);
          box.record(mode === 'loop' ? key(s, i) : `${key(s, i)}:copy`, n, r.wallS, nextOf(s, n));
          line.push(`${sh.key}${mode === 'copy' ? ' (copy)' : ''} ${report.fmtNs(r.nsPerOp ?? r.marginalNsPerOp)}`);
        }
        if (line.length) {
          console.log(`n=${report.fmtN(n).padEnd(4)} rep ${rep + 1}/${k} ${i.padEnd(8)} ${line.join(' | ')}  (${report.fmtS(sec(now() - rw0))})`);
        }
      }
    }
  }

  for (const s of scenKeys) {
    for (const i of names) {
      const points = {};
      for (const [n, reps_] of Object.entries(raw[s][i])) {
        const metrics = Object.keys(reps_[0]).filter((m) => typeof reps_[0][m] === 'number' && m !== 'sample' && m !== 'lastWindow');
        const median = {};
        for (const m of metrics) median[m] = medianOf(reps_.map((r) => r[m]));
        points[n] = { reps: reps_, median, sample: reps_[0].sample ?? null, ...(reps_[0].mode ? { mode: reps_[0].mode } : {}) };
      }
      results.scenarios[s][i] = { points, stopped: box.stopped(key(s, i)) };
      if (s.startsWith('shape.')) results.scenarios[s][i].copyStopped = box.stopped(`${key(s, i)}:copy`);
    }
  }

  if (on('breakdown')) {
    process.stdout.write('per-call breakdown… ');
    results.breakdown = await breakdown(impls);
    console.log('done');
    for (const a of [results.breakdown.start1k, results.breakdown.startPriority1k, ...(results.breakdown.shapes ?? [])]) {
      const line = report.startAccountingLine(a);
      if (line) console.log(line);
    }
  }

  if (on('memory')) {
    results.memory = {};
    for (const n of memorySizes) {
      for (const i of names) {
        process.stdout.write(`memory n=${report.fmtN(n)} ${i}: `);
        const r = await runMemoryChild(i, n, args.baseline ? [] : ['--no-baseline']);
        (results.memory[i] ??= {})[n] = r;
        console.log(r.error ? r.error : `heap ${Math.round(r.heapPerRun)} B/run, external ${Math.round(r.externalPerRun)} B/run, RSS ${Math.round(r.rssPerRun)} B/run`);
      }
    }
  }

  if (on('worker')) {
    if (fs.existsSync(WORKER_BENCH)) console.log('worker end to end: bench/worker.js');
    results.worker = await runWorkerBench(args.quick);
    if (!results.worker.present) console.log('worker end to end: bench/worker.js does not exist, skipped');
  }

  if (on('pg')) {
    if (fs.existsSync(PG_BENCH)) console.log('PostgreSQL backend vs graphile-worker: bench/pg.js');
    results.pg = await runPgBench(args.quick, results.config.pgReps);
    if (!results.pg.present) console.log('PostgreSQL: bench/pg.js does not exist, skipped');
    else if (results.pg.data?.skipped) console.log(`PostgreSQL: SKIPPED, not failed: ${results.pg.data.skipped}`);
    else if (results.pg.error) console.log(`PostgreSQL: ${results.pg.error}`);
  }

  if (on('waits') && fs.existsSync(WAITS_BENCH)) {
    // Durable waits: its own script and its own section of BENCHMARKS.md
    // (outside the generated one), each scenario in a fresh process.
    console.log('durable waits: bench/waits.js');
    const docs = (args.docs ?? !args.quick) ? ['--docs'] : [];
    const quick = args.quick ? ['--n', '20000', '--pg-n', '5000', '--lateness-n', '2000'] : [];
    const r = spawnSync(process.execPath, [WAITS_BENCH, ...quick, ...docs], { cwd: ROOT, stdio: 'inherit' });
    results.waits = { status: r.status, command: ['node', path.relative(ROOT, WAITS_BENCH), ...quick, ...docs].join(' ') };
  }

  results.durationS = sec(now() - wall0);
  results.load.end = os.loadavg();
  // Another process may rebuild the addon or dist/ during a long run: children started after that load the new build.
  const endBuild = addonIdentity();
  if (JSON.stringify(endBuild) !== JSON.stringify(results.machine.addon)) {
    results.buildChanged = { start: results.machine.addon, end: endBuild };
    console.log('WARNING: the addon or dist/ changed on disk during this run; child processes (memory, worker, pg) may have measured another build');
  }
  results.targets = report.computeTargets(results);
  results.pgTargets = report.computePgTargets(results);
  const stamp = startedAt.replace(/[:.]/g, '-');
  const file = path.join(__dirname, `results-${stamp}.json`);
  fs.writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);

  console.log(report.consoleSummary(results));
  console.log(`\nresults: ${path.relative(ROOT, file)} (${report.fmtS(results.durationS)})`);
  const docs = args.docs ?? !args.quick;
  if (docs) writeDocs(results, file);
  else console.log(`BENCHMARKS.md and bench/chart.svg left as they are (${args.docs === false ? '--no-docs' : 'quick run'}; pass --docs to update them)`);
}

async function entry() {
  const args = parseArgs(process.argv.slice(2));
  if (args.render) {
    const file = path.resolve(args.render);
    const results = JSON.parse(fs.readFileSync(file, 'utf8'));
    console.log(report.consoleSummary(results));
    writeDocs(results, file);
    return;
  }
  if (typeof global.gc !== 'function') {
    // Re-run with a callable gc and a heap large enough for 1M baseline rows.
    const r = spawnSync(process.execPath, ['--expose-gc', `--max-old-space-size=${heapLimitMb()}`, __filename, ...process.argv.slice(2)], { stdio: 'inherit' });
    process.exit(r.status ?? 1);
  }
  if (args.child === 'memory') return childMemory(args.impl, args.n);
  return main(args);
}

entry().catch((e) => {
  console.error(e);
  process.exit(1);
});
