'use strict';
/**
 * Turns a results object of bench/run.js (the JSON written to
 * bench/results-<timestamp>.json) into the console summary, the target
 * verdicts, the generated section of BENCHMARKS.md and bench/chart.svg.
 * Pure functions of the results: `node bench/run.js --render <file>`
 * regenerates the docs from a saved run without measuring again.
 */
const fs = require('node:fs');

const IMPLS = ['jobforge', 'baseline'];

/** Timed scenarios: key in results.scenarios, title, what one op is. */
const SCENARIOS = [
  { key: 'start', title: '1. `start`, unkeyed, awaited one after another', op: 'start' },
  { key: 'conc', title: '2a. keyed `start`: concurrency key (queue mode, distinct keys)', op: 'start' },
  { key: 'dedupe', title: '2b. keyed `start`: dedupe key (distinct keys, 60 s window)', op: 'start' },
  { key: 'claim', title: '3. `claimNext` + `tick` of a no-op handler, backlog of n pending runs', op: 'claimed run' },
];

/**
 * Scenario 7's call shapes (results.scenarios[`shape.${key}`]), in the
 * order bench/run.js measures them (it checks that its list matches).
 * `min1k`: the target ratio at n = 1k (at 100k every shape needs 2×).
 */
const SHAPES = [
  { key: 'plain', label: "plain: `start('plain', {n: i})`", short: 'plain', min1k: 1.2 },
  { key: 'priority', label: '`{ priority: i % 5 }`', short: '`{ priority }`', min1k: 1 },
  { key: 'scope', label: "`{ scope: { entityType: 'order', entityId: 'o' + (i % 100) } }`", short: '`{ scope }`', min1k: 1 },
  { key: 'runAt', label: '`{ runAt: new Date(Date.now() + 60_000) }`', short: '`{ runAt }`', min1k: 1 },
  { key: 'tenant', label: "multi-tenant orchestrator, `{ tenantId: 't' + (i % 10) }`", short: 'multi-tenant `{ tenantId }`', min1k: 1 },
  { key: 'laneDistinct', label: "concurrency key (queue mode), distinct keys: `start('laned', {k: i, n: i})`", short: 'concurrency key, distinct keys', min1k: 1 },
  { key: 'laneShared', label: "concurrency key (queue mode), 50 shared lanes: `start('laned', {k: i % 50, n: i})`", short: 'concurrency key, 50 shared lanes', min1k: 1 },
  { key: 'dedupe', label: "dedupe key (60 s window), distinct keys: `start('deduped', {k: i})`", short: 'dedupe key, distinct keys', min1k: 1 },
];
const SHAPE_MIN_100K = 2;

const CHART_SERIES = [
  { key: 'start', label: 'start (unkeyed)', color: '#1f77b4' },
  { key: 'conc', label: 'start, concurrency key', color: '#2ca02c' },
  { key: 'dedupe', label: 'start, dedupe key', color: '#9467bd' },
  { key: 'claim', label: 'claimNext + tick', color: '#d62728' },
];

// ── formatting ─────────────────────────────────────────────────────────

function sig3(x) {
  if (!Number.isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

function fmtNs(ns) {
  if (ns === null || ns === undefined || !Number.isFinite(ns)) return '–';
  if (ns < 1e3) return `${sig3(ns)} ns`;
  if (ns < 1e6) return `${sig3(ns / 1e3)} µs`;
  if (ns < 1e9) return `${sig3(ns / 1e6)} ms`;
  return `${sig3(ns / 1e9)} s`;
}

function fmtOps(nsPerOp) {
  if (nsPerOp === null || nsPerOp === undefined || !Number.isFinite(nsPerOp)) return '–';
  const ops = 1e9 / nsPerOp;
  if (ops >= 100) return Math.round(ops).toLocaleString('en-US');
  return sig3(ops);
}

function fmtRatio(r) {
  if (r === null || r === undefined || !Number.isFinite(r)) return '–';
  if (r >= 100) return `${Math.round(r).toLocaleString('en-US')}×`;
  if (r >= 10) return `${r.toFixed(1)}×`;
  if (r >= 0.1) return `${r.toFixed(2)}×`;
  return `${r.toPrecision(2)}×`;
}

function fmtBytes(b) {
  if (b === null || b === undefined || !Number.isFinite(b)) return '–';
  if (Math.abs(b) < 10) return `${b.toFixed(1)} B`;
  return `${Math.round(b).toLocaleString('en-US')} B`;
}

function fmtN(n) {
  if (n >= 1e6 && n % 1e6 === 0) return `${n / 1e6}M`;
  if (n >= 1e3 && n % 1e3 === 0) return `${n / 1e3}k`;
  return String(n);
}

function fmtS(s) {
  return `${s < 10 ? s.toFixed(2) : s.toFixed(1)} s`;
}

// ── access ─────────────────────────────────────────────────────────────

function point(results, scen, impl, n) {
  return results.scenarios?.[scen]?.[impl]?.points?.[String(n)] ?? null;
}

function median(results, scen, impl, n, metric = 'nsPerOp') {
  const p = point(results, scen, impl, n);
  return p && p.median ? p.median[metric] ?? null : null;
}

/** Throughput ratio jobforge/baseline (= baseline cost ÷ jobforge cost). */
function speedup(results, scen, n, metric = 'nsPerOp') {
  const j = median(results, scen, 'jobforge', n, metric);
  const b = median(results, scen, 'baseline', n, metric);
  return j && b ? b / j : null;
}

/** The sizes a scenario was measured at: the run's sizes and any other n it has points for (keyed at 20k). */
function sizesIn(results, scen) {
  const ns = new Set(results.config.sizes);
  for (const impl of IMPLS) for (const n of Object.keys(results.scenarios?.[scen]?.[impl]?.points ?? {})) ns.add(Number(n));
  return [...ns].sort((a, b) => a - b);
}

/**
 * Scenario 7's ratio for one shape at n: over the whole loop (n ÷ time)
 * when both implementations ran it; over the last min(1000, n/10) starts
 * when the baseline's live set was built by copying rows (its loop is
 * O(n²) and over the time box), the one figure both then have.
 */
function shapeRatio(results, key, n) {
  const scen = `shape.${key}`;
  const j = point(results, scen, 'jobforge', n);
  const b = point(results, scen, 'baseline', n);
  if (!j || !b) return { r: null, basis: null };
  if (j.mode !== 'copy' && b.mode !== 'copy' && j.median.nsPerOp && b.median.nsPerOp) return { r: b.median.nsPerOp / j.median.nsPerOp, basis: 'loop' };
  const jl = j.median.marginalNsPerOp;
  const bl = b.median.marginalNsPerOp;
  return { r: jl && bl ? bl / jl : null, basis: 'last' };
}

const COPY_NOTE = 'over the last min(1000, n/10) starts: the baseline built its first runs by copying rows, its O(n²) loop being over the time box';

// ── targets ────────────────────────────────────────────────────────────

function computeTargets(results) {
  const hasBl = results.baseline?.present === true;
  const t = [];
  const vs = (id, label, scen, n, min) => {
    const r = hasBl ? speedup(results, scen, n) : null;
    const why = !hasBl ? 'baseline absent' : r === null ? `no measured pair at n = ${fmtN(n)}` : null;
    t.push({ id, label, measured: r, display: fmtRatio(r), threshold: `≥ ${min}×`, pass: r === null ? null : r >= min, note: why });
  };
  vs('start-1k', 'unkeyed `start` ops/s, jobforge/baseline, n = 1k', 'start', 1000, 2);
  vs('conc-20k', 'keyed `start` (concurrency key) ops/s, jobforge/baseline, n = 20k', 'conc', 20000, 50);
  vs('dedupe-20k', 'keyed `start` (dedupe key) ops/s, jobforge/baseline, n = 20k', 'dedupe', 20000, 50);
  vs('conc-100k', 'keyed `start` (concurrency key) ops/s, jobforge/baseline, n = 100k', 'conc', 100000, 100);
  vs('dedupe-100k', 'keyed `start` (dedupe key) ops/s, jobforge/baseline, n = 100k', 'dedupe', 100000, 100);
  vs('claim-1k', '`claimNext` + `tick` claims/s, jobforge/baseline, n = 1k', 'claim', 1000, 1);
  vs('claim-100k', '`claimNext` + `tick` claims/s, jobforge/baseline, n = 100k', 'claim', 100000, 100);
  for (const [n, minOf] of [
    [1000, (sh) => sh.min1k],
    [100000, () => SHAPE_MIN_100K],
  ]) {
    for (const sh of SHAPES) {
      const min = minOf(sh);
      const { r, basis } = hasBl ? shapeRatio(results, sh.key, n) : { r: null };
      let note = null;
      if (!hasBl) note = 'baseline absent';
      else if (r === null) note = `no measured pair at n = ${fmtN(n)}`;
      else if (basis === 'last') note = COPY_NOTE;
      t.push({
        id: `shape-${sh.key}-${fmtN(n)}`,
        label: `\`start\` ${sh.short} ops/s, jobforge/baseline, n = ${fmtN(n)}`,
        measured: r,
        display: fmtRatio(r),
        threshold: `≥ ${min}×`,
        pass: r === null ? null : r >= min,
        note,
      });
    }
  }
  {
    const a = median(results, 'claim', 'jobforge', 1000);
    const b = median(results, 'claim', 'jobforge', 1000000);
    const r = a && b ? b / a : null;
    const sa = median(results, 'claim', 'jobforge', 1000, 'steadyNsPerOp');
    const sb = median(results, 'claim', 'jobforge', 1000000, 'steadyNsPerOp');
    t.push({
      id: 'claim-scaling',
      label: 'jobforge cost per claim at n = 1M ÷ its cost at n = 1k',
      measured: r,
      display: fmtRatio(r),
      threshold: '≤ 2×',
      pass: r === null ? null : r <= 2,
      note: r === null ? 'n = 1M not measured (quick run?)' : sa && sb ? `without the first claim of the sample: ${fmtRatio(sb / sa)}` : null,
    });
  }
  {
    // The drain of a started backlog (bench/worker.js) against the bare loop: no baseline involved.
    const d = results.worker?.drain ?? null;
    let note = null;
    if (!results.worker) note = 'bench/worker.js not run';
    else if (!d) note = 'bench/worker.js printed no drain figures';
    t.push({
      id: 'worker-drain',
      label: `worker drain of ${d ? fmtN(d.n) : '50k'} started runs (concurrency 64), jobs/s, jobforge/bare JS loop`,
      measured: d?.ratio ?? null,
      display: d ? d.ratio.toFixed(2) : '–',
      threshold: '≥ 0.30',
      pass: d ? d.ratio >= 0.3 : null,
      note,
    });
  }
  for (const n of [100000, 1000000]) {
    const j = results.memory?.jobforge?.[String(n)];
    const b = results.memory?.baseline?.[String(n)];
    const r = hasBl && j && b && b.rssPerRun > 0 ? j.rssPerRun / b.rssPerRun : null;
    let note = null;
    if (!hasBl) note = 'baseline absent';
    else if (!j || !b) note = `not measured at n = ${fmtN(n)}`;
    t.push({
      id: `memory-${fmtN(n)}`,
      label: `memory per pending run (RSS), jobforge/baseline, n = ${fmtN(n)}`,
      measured: r,
      display: fmtRatio(r),
      threshold: '≤ 0.33× (1/3)',
      pass: r === null ? null : r <= 1 / 3,
      note,
    });
  }
  return t;
}

// ── PostgreSQL vs graphile-worker (bench/pg.js) ─────────────────────────

/** Target of the issue: jobforge ≥ 1.5× graphile-worker's throughput at 1, 2 and 4 processes, latency ratio ≤ 1. */
const PG_THROUGHPUT_MIN = 1.5;
const PG_LATENCY_MAX = 1;
const PG_PROCS = [1, 2, 4];
/**
 * Issue 23: drain ≥ 1.5× graphile-worker batched and ≥ 2× BullMQ at 1, 2
 * and 4 processes; latency p50 and p99 ≤ graphile-worker batched. A system
 * bench/pg.js skipped (BullMQ without Redis) gives n/a rows with its reason.
 */
const PG_RIVALS = [
  { key: 'graphileBatched', label: 'graphile-worker batched', min: 1.5, latency: true },
  { key: 'bullmq', label: 'BullMQ', min: 2, latency: false },
];
/** Every system bench/pg.js may report, in table order (jobforge first). */
const PG_SYSTEMS = ['jobforge', 'graphile', 'graphileBatched', 'bullmq'];

/** Why the PostgreSQL comparison has no figures, or null when it has them. */
function pgUnavailable(results) {
  const pg = results.pg;
  if (!pg) return 'not run (`--only` excluded it, or a results file from before it existed)';
  if (!pg.present) return 'bench/pg.js does not exist';
  if (pg.data?.skipped) return `skipped: ${pg.data.skipped}`;
  if (!pg.data) return pg.error ?? 'bench/pg.js wrote no results';
  const off = ['jobforge', 'graphile'].map((k) => pg.data.systems?.[k]).filter((s) => !s?.available);
  if (off.length) return off.map((s) => `${s?.label ?? '?'} skipped: ${s?.reason ?? 'not run'}`).join('; ');
  return null;
}

function pgRatio(a, b) {
  return Number.isFinite(a) && Number.isFinite(b) && b > 0 ? a / b : null;
}

function computePgTargets(results) {
  const why0 = pgUnavailable(results);
  // One short reason per target row; the section and the console summary give the full one.
  const why = !why0 ? null : results.pg?.data?.skipped ? 'bench/pg.js skipped: no PostgreSQL server (see section 6)' : why0;
  const d = results.pg?.data;
  const jf = d?.systems?.jobforge;
  const gw = d?.systems?.graphile;
  const t = [];
  for (const p of PG_PROCS) {
    const j = jf?.throughput?.[p];
    const g = gw?.throughput?.[p];
    const r = why ? null : pgRatio(j?.jobsPerS, g?.jobsPerS);
    const flags = [j?.timedOut && 'jobforge timed out', g?.timedOut && 'graphile-worker timed out'].filter(Boolean).join(', ');
    t.push({
      id: `pg-throughput-${p}p`,
      label: `PostgreSQL no-op jobs/s, ${p} worker process${p > 1 ? 'es' : ''}, jobforge/graphile-worker`,
      measured: r,
      display: fmtRatio(r),
      threshold: `≥ ${PG_THROUGHPUT_MIN}×`,
      pass: r === null ? null : r >= PG_THROUGHPUT_MIN,
      note: why ?? (r === null ? `not measured at ${p} process${p > 1 ? 'es' : ''}` : flags || null),
    });
  }
  for (const rival of PG_RIVALS) {
    const o = d?.systems?.[rival.key];
    const off = why ?? (!o ? `${rival.label} not run by this bench/pg.js` : !o.available ? `${rival.label} skipped: ${o.reason}` : null);
    for (const p of PG_PROCS) {
      const r = off ? null : pgRatio(jf?.throughput?.[p]?.jobsPerS, o.throughput?.[p]?.jobsPerS);
      t.push({
        id: `pg-throughput-${rival.key}-${p}p`,
        label: `PostgreSQL no-op jobs/s, ${p} worker process${p > 1 ? 'es' : ''}, jobforge/${rival.label}`,
        measured: r,
        display: fmtRatio(r),
        threshold: `≥ ${rival.min}×`,
        pass: r === null ? null : r >= rival.min,
        note: off ?? (r === null ? `not measured at ${p} process${p > 1 ? 'es' : ''}` : null),
      });
    }
    if (!rival.latency) continue;
    for (const k of ['p50', 'p99']) {
      const r = off ? null : pgRatio(jf?.latency?.[k], o.latency?.[k]);
      t.push({
        id: `pg-latency-${rival.key}-${k}`,
        label: `PostgreSQL enqueue-to-start latency ${k}, jobforge/${rival.label}`,
        measured: r,
        display: fmtRatio(r),
        threshold: `≤ ${PG_LATENCY_MAX}×`,
        pass: r === null ? null : r <= PG_LATENCY_MAX,
        note: off ?? (r === null ? 'not measured' : null),
      });
    }
  }
  for (const k of ['p50', 'p99']) {
    const r = why ? null : pgRatio(jf?.latency?.[k], gw?.latency?.[k]);
    t.push({
      id: `pg-latency-${k}`,
      label: `PostgreSQL enqueue-to-start latency ${k}, jobforge/graphile-worker`,
      measured: r,
      display: fmtRatio(r),
      threshold: `≤ ${PG_LATENCY_MAX}×`,
      pass: r === null ? null : r <= PG_LATENCY_MAX,
      note: why ?? (r === null ? 'not measured' : null),
    });
  }
  return t;
}

const fmtJobs = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : '–');
const fmtMs = (x) => (Number.isFinite(x) ? `${x < 10 ? x.toFixed(2) : x.toFixed(1)} ms` : '–');

function pgSection(results) {
  const why = pgUnavailable(results);
  const pg = results.pg;
  const d = pg?.data;
  const lines = [];
  if (!pg || !pg.present) return `_${why}._`;
  lines.push(
    "jobforge's PostgreSQL backend against [graphile-worker](https://worker.graphile.org/) on the same database, the same machine and in the same run: " +
      'in its default mode and in its batched mode (local queue, batched completions), and against BullMQ on the local Redis when one answers: ' +
      'no-op jobs/s with 1, 2 and 4 worker processes, and enqueue-to-start latency. ' +
      `Targets: jobforge ≥ ${PG_THROUGHPUT_MIN}× graphile-worker's throughput at each process count, with equal or lower latency (p50 and p99 ratio ≤ ${PG_LATENCY_MAX}); ` +
      `issue 23: ${PG_RIVALS.map((r) => `≥ ${r.min}× ${r.label}`).join(' and ')} at each process count, latency p50 and p99 ≤ graphile-worker batched.`,
  );
  lines.push('');
  if (pg.direct) {
    // Written by `node bench/pg.js --docs` itself (this section only).
    lines.push(`Command: \`${pg.command}\` (run directly; it rewrote this section only; exit ${pg.status}, ${fmtS(pg.wallS)}).`);
  } else {
    lines.push(`Command: \`${pg.command}\`, run by \`${results.command}\` as a child process (exit ${pg.status ?? pg.signal}${pg.timedOut ? ', timed out' : ''}, ${fmtS(pg.wallS)}).`);
    if (d?.command) lines.push(`bench/pg.js recorded its command line as \`${d.command}\` (the JSON went to a temporary file).`);
  }
  lines.push('');
  if (d?.skipped) {
    lines.push(`**Skipped** (no server, not a failure): ${d.skipped}`);
    return lines.join('\n');
  }
  if (!d) {
    lines.push(`**No results**: ${pg.error ?? 'bench/pg.js wrote no JSON'}`);
    if (pg.stderrTail?.trim()) lines.push('', '```', pg.stderrTail.trimEnd(), '```');
    return lines.join('\n');
  }
  const m = d.machine ?? {};
  const la = (l) => (Array.isArray(l) ? l.map((x) => x.toFixed(2)).join(' / ') : '–');
  const c = d.config ?? {};
  lines.push('**Machine.** ' +
    `PostgreSQL ${m.postgres ?? '?'} at \`${d.url}\` on the same machine as the rest of this run (${m.cpuModel ?? '?'}, ${m.cpus ?? '?'} CPUs, Node.js ${m.node ?? '?'}); ` +
    `client, worker processes and server share those CPUs. Load average (1 / 5 / 15 min) ${la(d.load?.start)} when bench/pg.js started, ${la(d.load?.end)} when it ended; ` +
    `it started ${d.startedAt} and took ${Number.isFinite(d.durationS) ? fmtS(d.durationS) : '–'}.`);
  lines.push('');
  const jf = d.systems?.jobforge;
  const gw = d.systems?.graphile;
  lines.push('**Configuration.**');
  lines.push('');
  const all = PG_SYSTEMS.map((k) => d.systems?.[k]).filter(Boolean);
  const live = all.filter((s) => s.available);
  for (const s of all) {
    lines.push(s.available ? `- ${s.config}${s.schema ? ` (schema \`${s.schema}\`)` : ''}` : `- ${s.label}: **skipped**: ${s.reason}`);
  }
  lines.push(
    `- each worker process: concurrency ${c.concurrency}, a pool of ${c.pool} connections; throughput N = ${fmtJobs(c.n)} jobs per point; ` +
      `${c.reps > 1 ? `${c.reps} repetitions, every figure the median over repetitions` : '1 repetition'}; time limit ${c.limitS} s per throughput point.`,
  );
  lines.push('');
  if (why) lines.push(`**No comparison**: ${why}.`, '');
  lines.push("**Method** (bench/pg.js's own description, as recorded in its results):");
  lines.push('');
  const meth = c.method ?? {};
  for (const [k, label] of [
    ['throughput', 'throughput, and how the backlog was enqueued'],
    ['latency', 'latency'],
    ['enqueue', 'enqueue'],
    ['repetitions', 'repetitions'],
  ]) {
    if (meth[k]) lines.push(`- ${label}: ${meth[k]}`);
  }
  const hows = new Set();
  for (const s of live) {
    for (const r of Object.values(s?.throughput ?? {})) if (r?.backlog?.how) hows.add(`${s.label}: ${r.backlog.how}`);
  }
  if (hows.size) lines.push(`- backlog enqueued in this run by: ${[...hows].join('; ')}`);
  lines.push('');

  const T = computePgTargets(results);
  lines.push('**Throughput** (no-op jobs/s, first handler start to last handler return across all worker processes):');
  lines.push('');
  const procs = c.procs ?? PG_PROCS;
  const tput = procs.map((p) => [String(p), ...live.map((s) => fmtJobs(s.throughput?.[p]?.jobsPerS))]);
  lines.push(mdTable(['worker processes', ...live.map((s) => `${s.label} jobs/s`)], tput));
  lines.push('');
  const cell = (t) => (t ? `${t.display} (${t.threshold}): **${verdict(t)}**` : '–');
  const vs = [['graphile', 'graphile-worker', (p) => `pg-throughput-${p}p`], ...PG_RIVALS.map((r) => [r.key, r.label, (p) => `pg-throughput-${r.key}-${p}p`])];
  lines.push(
    mdTable(
      ['worker processes', ...vs.map(([, label]) => `jobforge/${label}`)],
      procs.map((p) => [String(p), ...vs.map(([, , id]) => cell(T.find((x) => x.id === id(p))))]),
    ),
  );
  const offs = T.filter((x) => x.id.startsWith('pg-throughput-') && x.pass === null && x.note).map((x) => x.note);
  if (offs.length) lines.push('', ...[...new Set(offs)].map((n) => `- n/a: ${n}`));
  lines.push('');
  const detail = [];
  for (const p of procs) {
    for (const s of live) {
      const r = s?.throughput?.[p];
      if (!r) continue;
      const bits = [
        `${fmtJobs(r.ran)} jobs in ${Number.isFinite(r.seconds) ? fmtS(r.seconds) : '–'}`,
        r.perProc ? `per process ${r.perProc.map(fmtJobs).join(' / ')}` : null,
        Number.isFinite(r.startSkewMs) ? `start skew ${fmtMs(r.startSkewMs)}` : null,
        Number.isFinite(r.settleLagMs) ? `table settled ${fmtMs(r.settleLagMs)} after the last handler (${fmtJobs(r.settledJobsPerS)} jobs/s counted to that point)` : null,
        r.backlog ? `backlog ${r.backlog.how}, ${fmtS(r.backlog.seconds)}` : null,
        r.timedOut ? '**timed out**' : null,
        r.missing ? `**${r.missing} missing**` : null,
        r.duplicates ? `**${r.duplicates} ran twice**` : null,
        r.pendingAfter ? `**${r.pendingAfter} not completed in the table**` : null,
      ].filter(Boolean);
      const reps = (s.reps?.throughput?.[p] ?? []).map((x) => fmtJobs(x.jobsPerS));
      detail.push([String(p), s.label, bits.join('; '), reps.length > 1 ? reps.join(' / ') : '']);
    }
  }
  if (detail.length) {
    lines.push(mdTable(['processes', 'system', 'detail (medians)', 'jobs/s per repetition'], detail));
    lines.push('');
  }

  lines.push(`**Enqueue-to-start latency** (one idle worker process, ${fmtJobs(c.rate)} jobs/s for ${c.seconds} s after ${fmtJobs(Math.ceil((c.rate ?? 0) / 2))} warm-up jobs):`);
  lines.push('');
  const latRows = [];
  const latVs = [['graphile', 'graphile-worker', (k) => `pg-latency-${k}`], ['graphileBatched', 'graphile-worker batched', (k) => `pg-latency-graphileBatched-${k}`]];
  for (const k of ['p50', 'p90', 'p99', 'max']) {
    latRows.push([
      k,
      ...live.map((s) => fmtMs(s.latency?.[k])),
      ...latVs.map(([key, , id]) => {
        const t = T.find((x) => x.id === id(k));
        return t ? cell(t) : `${fmtRatio(pgRatio(jf?.latency?.[k], d.systems?.[key]?.latency?.[k]))} (not a target)`;
      }),
    ]);
  }
  latRows.push([
    'jobs measured / achieved enqueue rate',
    ...live.map((s) => (s.latency ? `${fmtJobs(s.latency.measured)} / ${fmtJobs(s.latency.achievedRate)}/s${s.latency.timedOut ? ' (timed out)' : ''}` : '–')),
    ...latVs.map(() => ''),
  ]);
  lines.push(mdTable(['latency', ...live.map((s) => s.label), ...latVs.map(([, label]) => `jobforge/${label}`)], latRows));
  lines.push('');

  lines.push('**Enqueue** (not a target):');
  lines.push('');
  const enq = [
    [
      `single-job calls, ${fmtJobs(jf?.enqueue?.jobs ?? gw?.enqueue?.jobs ?? c.enqueueN)} jobs, ${c.inflight} in flight, empty schema, no worker (jobs/s)`,
      fmtJobs(jf?.enqueue?.jobsPerS),
      fmtJobs(gw?.enqueue?.jobsPerS),
      fmtRatio(pgRatio(jf?.enqueue?.jobsPerS, gw?.enqueue?.jobsPerS)),
    ],
    ['one enqueue call during the latency run, p50', fmtMs(jf?.latency?.enqueueCallP50), fmtMs(gw?.latency?.enqueueCallP50), fmtRatio(pgRatio(jf?.latency?.enqueueCallP50, gw?.latency?.enqueueCallP50))],
    ['one enqueue call during the latency run, p99', fmtMs(jf?.latency?.enqueueCallP99), fmtMs(gw?.latency?.enqueueCallP99), fmtRatio(pgRatio(jf?.latency?.enqueueCallP99, gw?.latency?.enqueueCallP99))],
  ];
  for (const p of procs) {
    const j = jf?.throughput?.[p]?.backlog;
    const g = gw?.throughput?.[p]?.backlog;
    if (!j && !g) continue;
    enq.push([
      `throughput backlog of ${fmtJobs(c.n)} jobs before the ${p}-process point (not timed for the target; jobforge: ${j?.how ?? '–'}, graphile-worker: ${g?.how ?? '–'})`,
      j ? `${fmtS(j.seconds)} (${fmtJobs(c.n / j.seconds)} jobs/s)` : '–',
      g ? `${fmtS(g.seconds)} (${fmtJobs(c.n / g.seconds)} jobs/s)` : '–',
      '',
    ]);
  }
  lines.push(mdTable(['', 'jobforge', 'graphile-worker', 'jobforge/graphile-worker'], enq));
  lines.push('');
  lines.push('Ratios are jobforge ÷ graphile-worker: above 1 means jobforge is faster for throughput and enqueue; below 1 means jobforge starts jobs sooner (latency) or its enqueue call is quicker.');
  const problems = [...(d.problems ?? []), ...live.flatMap((s) => (s?.errors ?? []).map((e) => `${s.label}: ${e.split('\n')[0]}`))];
  const uniq = [...new Set(problems)];
  if (uniq.length) {
    lines.push('', '**Problems reported by bench/pg.js:**', '', ...uniq.map((x) => `- ${x}`));
  }
  return lines.join('\n');
}

const verdict = (t) => (t.pass === null ? 'n/a' : t.pass ? 'PASS' : 'MISS');

// ── tables ─────────────────────────────────────────────────────────────

function mdTable(header, rows) {
  const line = (cells) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

function stopNote(results, scen, impl) {
  const s = results.scenarios?.[scen]?.[impl]?.stopped;
  return s ? `${impl} stopped before n = ${fmtN(s.atN)}: ${s.reason}` : null;
}

function repsOf(p) {
  return p ? p.reps.length : 0;
}

function scenarioTable(results, scen) {
  const sizes = sizesIn(results, scen);
  const rows = [];
  for (const n of sizes) {
    const j = point(results, scen, 'jobforge', n);
    const b = point(results, scen, 'baseline', n);
    if (!j && !b) continue;
    const r = speedup(results, scen, n);
    if (scen === 'start') {
      rows.push([
        fmtN(n),
        fmtOps(j?.median.nsPerOp),
        fmtNs(j?.median.nsPerOp),
        fmtNs(j?.median.marginalNsPerOp),
        fmtOps(b?.median.nsPerOp),
        fmtNs(b?.median.nsPerOp),
        fmtNs(b?.median.marginalNsPerOp),
        fmtRatio(r),
        `${repsOf(j)} / ${repsOf(b)}`,
      ]);
    } else if (scen === 'claim') {
      rows.push([
        fmtN(n),
        fmtNs(j?.median.nsPerOp),
        fmtNs(j?.median.firstNs),
        fmtNs(j?.median.steadyNsPerOp),
        fmtNs(b?.median.nsPerOp),
        fmtNs(b?.median.firstNs),
        fmtRatio(r),
        fmtRatio(speedup(results, scen, n, 'steadyNsPerOp')),
        `${j?.sample ?? '–'} / ${b?.sample ?? '–'}`,
        `${repsOf(j)} / ${repsOf(b)}`,
      ]);
    } else {
      rows.push([
        fmtN(n),
        fmtNs(j?.median.nsPerOp),
        fmtOps(j?.median.nsPerOp),
        fmtNs(b?.median.nsPerOp),
        fmtOps(b?.median.nsPerOp),
        fmtRatio(r),
        fmtNs(j?.median.seedNsPerOp),
        `${j?.sample ?? '–'} / ${b?.sample ?? '–'}`,
        `${repsOf(j)} / ${repsOf(b)}`,
      ]);
    }
  }
  let header;
  if (scen === 'start') {
    header = [
      'n',
      'jobforge ops/s',
      'jobforge per op',
      'jobforge per op, last min(1000, n/10) starts',
      'baseline ops/s',
      'baseline per op',
      'baseline per op, last min(1000, n/10) starts',
      'jobforge/baseline',
      'reps (jf / bl)',
    ];
  } else if (scen === 'claim') {
    header = [
      'n',
      'jobforge per claim',
      'jobforge 1st claim',
      'jobforge per claim after the 1st',
      'baseline per claim',
      'baseline 1st claim',
      'jobforge/baseline',
      'jobforge/baseline after the 1st',
      'sample (jf / bl)',
      'reps (jf / bl)',
    ];
  } else {
    header = [
      'n',
      'jobforge per start',
      'jobforge ops/s',
      'baseline per start',
      'baseline ops/s',
      'jobforge/baseline',
      'jobforge: building the n live runs, per start',
      'sample (jf / bl)',
      'reps (jf / bl)',
    ];
  }
  const notes = IMPLS.map((i) => stopNote(results, scen, i)).filter(Boolean);
  return { table: rows.length ? mdTable(header, rows) : '_not measured_', notes };
}

/** The sizes scenario 7 has points at (any shape, either implementation). */
function shapeSizesIn(results) {
  const ns = new Set();
  for (const sh of SHAPES) for (const impl of IMPLS) for (const n of Object.keys(results.scenarios?.[`shape.${sh.key}`]?.[impl]?.points ?? {})) ns.add(Number(n));
  return [...ns].sort((a, b) => a - b);
}

/** Scenario 7: one row per shape and n; null when the run did not measure it. */
function shapesSection(results) {
  if (!SHAPES.some((sh) => results.scenarios?.[`shape.${sh.key}`])) return null;
  const rows = [];
  let copied = false;
  for (const n of shapeSizesIn(results)) {
    for (const sh of SHAPES) {
      const scen = `shape.${sh.key}`;
      const j = point(results, scen, 'jobforge', n);
      const b = point(results, scen, 'baseline', n);
      if (!j && !b) continue;
      const { r, basis } = shapeRatio(results, sh.key, n);
      const bCopy = b?.mode === 'copy';
      copied ||= bCopy;
      const lastRatio = j && b && j.median.marginalNsPerOp && b.median.marginalNsPerOp ? b.median.marginalNsPerOp / j.median.marginalNsPerOp : null;
      rows.push([
        fmtN(n),
        sh.label,
        fmtOps(j?.median.nsPerOp),
        bCopy ? 'not run (†)' : fmtOps(b?.median.nsPerOp),
        basis === 'loop' ? fmtRatio(r) : '–',
        fmtNs(j?.median.marginalNsPerOp),
        `${fmtNs(b?.median.marginalNsPerOp)}${bCopy ? ' †' : ''}`,
        fmtRatio(lastRatio),
        `${repsOf(j)} / ${repsOf(b)}`,
      ]);
    }
  }
  const lines = [
    "Each shape timed as in scenario 1: a fresh orchestrator, n awaited starts of that shape one after another (live runs grow 0 → n), ops/s = n ÷ their time; " +
      "beside it the cost per start of the last min(1000, n/10), with about n runs live. jobforge's timed section ends with a `findById` of the last run.",
    '',
    rows.length
      ? mdTable(
          [
            'n',
            'shape',
            'jobforge ops/s',
            'baseline ops/s',
            'jobforge/baseline',
            'jobforge per start, last min(1000, n/10)',
            'baseline per start, last min(1000, n/10)',
            'jobforge/baseline, last min(1000, n/10)',
            'reps (jf / bl)',
          ],
          rows,
        )
      : '_not measured_',
  ];
  if (copied) {
    lines.push(
      '',
      "_† The baseline's `start` of this shape scans every live run, so its loop of n starts is O(n²) and over the time box here: " +
        'its first run went through `start`, the next ones up to the last min(1000, n/10) were copies of that row (own id, key, input, timestamps), ' +
        'and only those last starts went through `start` and were timed. The target ratio at this n is then the one over the last starts._',
    );
  }
  for (const sh of SHAPES) {
    for (const impl of IMPLS) {
      const e = results.scenarios?.[`shape.${sh.key}`]?.[impl];
      if (e?.stopped) lines.push('', `_${sh.short}, ${impl}: the 0 → n loop stopped before n = ${fmtN(e.stopped.atN)}: ${e.stopped.reason}._`);
      if (e?.copyStopped) lines.push('', `_${sh.short}, ${impl}: copying rows stopped before n = ${fmtN(e.copyStopped.atN)}: ${e.copyStopped.reason}._`);
    }
  }
  return lines.join('\n');
}

function memoryTable(results) {
  const rows = [];
  for (const n of results.config.memorySizes ?? []) {
    for (const impl of IMPLS) {
      const m = results.memory?.[impl]?.[String(n)];
      if (!m) continue;
      rows.push([
        fmtN(n),
        impl,
        fmtBytes(m.heapPerRun),
        fmtBytes(m.externalPerRun),
        fmtBytes(m.rssPerRun),
        `${(m.rssAfter / 2 ** 20).toFixed(0)} MiB`,
        m.error ? `error: ${m.error}` : '',
      ]);
    }
    const j = results.memory?.jobforge?.[String(n)];
    const b = results.memory?.baseline?.[String(n)];
    if (j && b && b.rssPerRun > 0) {
      rows.push([fmtN(n), '**jobforge/baseline**', '', '', `**${fmtRatio(j.rssPerRun / b.rssPerRun)}**`, '', 'RSS-based totals compared']);
    }
  }
  if (!rows.length) return '_not measured_';
  return mdTable(['n', 'implementation', 'heap per run', 'external per run', 'RSS per run', 'RSS after', 'note'], rows);
}

function targetsTable(results) {
  const rows = computeTargets(results).map((t) => [
    t.label,
    t.display,
    t.threshold,
    `**${verdict(t)}**${t.note ? ` (${t.note})` : ''}`,
  ]);
  return mdTable(['target', 'measured', 'needed', 'result'], rows);
}

function coverageLines(results) {
  const out = [];
  if (!results.baseline?.present) {
    out.push(`- Baseline absent (${results.baseline?.error ?? 'not loaded'}): jobforge only.`);
    return out;
  }
  const maxN = Math.max(...results.config.sizes);
  for (const s of SCENARIOS) {
    const e = results.scenarios?.[s.key]?.baseline;
    if (!e) continue;
    const measured = Object.keys(e.points).map(Number);
    const top = measured.length ? Math.max(...measured) : null;
    const longest = Math.max(0, ...Object.values(e.points).flatMap((p) => p.reps.map((r) => r.wallS)));
    if (e.stopped) {
      out.push(`- ${s.title}: baseline measured up to n = ${top === null ? '–' : fmtN(top)}; stopped before n = ${fmtN(e.stopped.atN)} because ${e.stopped.reason}.`);
    } else {
      out.push(
        `- ${s.title}: baseline measured at every n up to ${fmtN(top ?? maxN)}; its longest point (one repetition, setup included) took ${fmtS(longest)}, under the ${results.config.limitS} s limit.`,
      );
    }
  }
  for (const s of SCENARIOS) {
    const e = results.scenarios?.[s.key]?.jobforge;
    if (e?.stopped) out.push(`- ${s.title}: jobforge stopped before n = ${fmtN(e.stopped.atN)} because ${e.stopped.reason}.`);
  }
  // Scenario 7: a line per shape where the baseline's loop stopped; one for the others.
  const whole = [];
  for (const sh of SHAPES) {
    const e = results.scenarios?.[`shape.${sh.key}`]?.baseline;
    if (!e) continue;
    if (!e.stopped && !e.copyStopped) {
      whole.push(sh.short);
      continue;
    }
    const pts = Object.entries(e.points);
    const loops = pts.filter(([, p]) => p.mode !== 'copy').map(([n]) => Number(n));
    const copies = pts.filter(([, p]) => p.mode === 'copy').map(([n]) => Number(n));
    const bits = [`baseline's 0 → n loop measured at n = ${loops.length ? loops.map(fmtN).join(', ') : '–'}`];
    if (e.stopped) bits.push(`stopped before n = ${fmtN(e.stopped.atN)} because ${e.stopped.reason}`);
    if (copies.length) bits.push(`at n = ${copies.map(fmtN).join(', ')} its live set was built by copying rows and only the last min(1000, n/10) starts timed`);
    if (e.copyStopped) bits.push(`copying stopped before n = ${fmtN(e.copyStopped.atN)} because ${e.copyStopped.reason}`);
    out.push(`- 7. \`start\`, ${sh.short}: ${bits.join('; ')}.`);
  }
  if (whole.length) out.push(`- 7. \`start\`, ${whole.join(', ')}: baseline's 0 → n loop measured at every n of the scenario.`);
  return out;
}

function breakdownTable(results) {
  const bd = results.breakdown;
  if (!bd) return null;
  const rows = [];
  for (const impl of IMPLS) {
    for (const item of bd[impl] ?? []) rows.push([impl, item.label, fmtNs(item.ns), item.note ?? '']);
  }
  // Derived from the scenario medians: the baseline's per-row scan costs.
  if (results.baseline?.present) {
    for (const [scen, what] of [
      ['conc', 'keyed `start` (concurrency key) per live run scanned'],
      ['dedupe', 'keyed `start` (dedupe key) per live run scanned'],
      ['claim', '`claimNext` + `tick` per pending run scanned and sorted'],
    ]) {
      const pts = results.scenarios?.[scen]?.baseline?.points ?? {};
      const ns = Object.keys(pts).map(Number);
      if (!ns.length) continue;
      const top = Math.max(...ns);
      rows.push(['baseline', `${what} (median at n = ${fmtN(top)} ÷ n)`, fmtNs(pts[top].median.nsPerOp / top), 'derived']);
    }
  }
  return mdTable(['implementation', 'call', 'cost per call', 'note'], rows);
}

/** The accounting of scenario 1 at n = 1k (see `startAccounting` in run.js). */
function startAccountingSection(a) {
  if (!a || !Number.isFinite(a.jobforgeNs)) return null;
  const rows = [
    ['jobforge, the scenario 1 loop (public API)', fmtNs(a.jobforgeNs)],
    ['  of which the native hand-over of the buffered runs (`startBatch`, timed inside the loop)', fmtNs(a.handOverNs)],
    ['jobforge with the hand-over replaced by a no-op: its JS side alone (runs never created)', fmtNs(a.jsOnlyNs)],
  ];
  if (Number.isFinite(a.floorNs)) {
    rows.push(['contract floor: an async `start` that only answers with the contract\'s row (three `Date`s, the input as given; no checks, no JSON, no store)', fmtNs(a.floorNs)]);
  }
  if (Number.isFinite(a.baselineNs)) rows.push(['baseline, the same loop', fmtNs(a.baselineNs)]);
  const lines = [
    `The loop of scenario 1 at n = ${fmtN(a.n)} (a fresh orchestrator, ${fmtN(a.n)} awaited starts, then one \`findById\`), ` +
      `run ${a.reps} times for each line, alternating; medians per start.`,
    '',
    mdTable(['measurement', 'per start'], rows),
  ];
  if (Number.isFinite(a.baselineNs)) {
    lines.push(
      '',
      `jobforge/baseline in this measurement: ${fmtRatio(a.baselineNs / a.jobforgeNs)}. ` +
        `Were creating the runs in the engine free, it would be at most ${fmtRatio(a.baselineNs / a.jsOnlyNs)} (baseline ÷ JS side alone).`,
    );
    if (Number.isFinite(a.floorNs)) {
      lines.push(
        '',
        `No implementation that answers with the contract's row can exceed ${fmtRatio(a.baselineNs / a.floorNs)} here (baseline ÷ contract floor), ` +
          `and one that also hands each run to a native store at this hand-over's cost no more than ${fmtRatio(a.baselineNs / (a.floorNs + a.handOverNs))} ` +
          `(baseline ÷ (contract floor + hand-over)).`,
      );
    }
  }
  return lines.join('\n');
}

/**
 * The option shapes' accounting (`breakdown` in run.js): for each shape and
 * size, where a start's time goes and the bounds of this design.
 */
function shapeAccountingSection(results) {
  const list = (results.breakdown?.shapes ?? []).filter((a) => a && Number.isFinite(a.jobforgeNs) && Number.isFinite(a.baselineNs));
  if (list.length === 0) return null;
  const title = (key) => SHAPES.find((sh) => sh.key === key)?.label ?? key;
  const rows = list.map((a) => [
    fmtN(a.n),
    title(a.key),
    fmtNs(a.jobforgeNs),
    fmtNs(a.handOverNs),
    fmtNs(a.jsOnlyNs),
    fmtNs(a.floorNs),
    fmtNs(a.baselineNs),
    fmtRatio(a.baselineNs / a.jobforgeNs),
    fmtRatio(a.baselineNs / a.jsOnlyNs),
    fmtRatio(a.baselineNs / (a.floorNs + a.handOverNs)),
    fmtRatio(a.baselineNs / a.floorNs),
  ]);
  return [
    'The loop of scenario 7 for each option shape (a fresh orchestrator, n awaited starts of the shape, then one `findById`), ' +
      'four ways alternating: jobforge (its native hand-overs timed inside the loop); jobforge with the hand-over replaced by a no-op ' +
      '(its JS side alone; the runs are never created); the contract floor (an async `start` that only answers with the contract\'s row, ' +
      'reading the option; no checks, no JSON, no store); the baseline. Medians per start over the repetitions ' +
      `(${[...new Set(list.map((a) => `${a.reps} at n = ${fmtN(a.n)}`))].join(', ')}).`,
    '',
    mdTable(
      [
        'n',
        'shape',
        'jobforge',
        'of it, native hand-over',
        'JS side alone',
        'contract floor',
        'baseline',
        'jobforge/baseline here',
        'at most, engine free (baseline ÷ JS side)',
        'at most, this hand-over (baseline ÷ (floor + hand-over))',
        'at most, any implementation (baseline ÷ floor)',
      ],
      rows,
    ),
  ].join('\n');
}

/** The keyed start accounting (`keyedAccounting` in run.js) against scenario 2a's baseline at the same n. */
function keyedAccountingSection(results) {
  const a = results.breakdown?.keyed20k;
  if (!a || !Number.isFinite(a.publicNs)) return null;
  const b = median(results, 'conc', 'baseline', a.n);
  const rows = [
    ['jobforge, public `start` with a new key (as scenario 2a)', fmtNs(a.publicNs)],
    ["  the engine's own call for it (`callSync('start')`, request text built beforehand, answer not read)", fmtNs(a.engineNs)],
    ["contract floor: an async `start` that only answers with the contract's row", fmtNs(a.floorNs)],
  ];
  if (Number.isFinite(b)) rows.push([`baseline, scenario 2a at n = ${fmtN(a.n)} (same run)`, fmtNs(b)]);
  const lines = [
    `${fmtN(a.n)} live runs of the concurrency-keyed type (distinct keys), then ${fmtN(a.sample)} starts with new keys each way, ` +
      `alternating, ${a.reps} repetitions (fresh orchestrators); medians per start.`,
    '',
    mdTable(['measurement', 'per start'], rows),
  ];
  if (Number.isFinite(b)) {
    lines.push(
      '',
      `jobforge/baseline here: ${fmtRatio(b / a.publicNs)}. The engine decides a keyed start before it is answered, so its call plus the ` +
        `contract floor bound this design: at most ${fmtRatio(b / (a.engineNs + a.floorNs))} (baseline ÷ (engine call + floor)); ` +
        `the JS around the call (request text, short answer, row) is ${fmtNs(Math.max(0, a.publicNs - a.engineNs - a.floorNs))} above that.`,
    );
  }
  return lines.join('\n');
}

/** One console line for the same accounting. */
function startAccountingLine(a) {
  if (!a || !Number.isFinite(a.jobforgeNs)) return null;
  const base = Number.isFinite(a.baselineNs)
    ? `; baseline ${fmtNs(a.baselineNs)} → ratio ${fmtRatio(a.baselineNs / a.jobforgeNs)}, at most ${fmtRatio(a.baselineNs / a.jsOnlyNs)} with a free engine` +
      (Number.isFinite(a.floorNs)
        ? `; contract floor ${fmtNs(a.floorNs)}: at most ${fmtRatio(a.baselineNs / a.floorNs)} for any implementation, ` +
          `${fmtRatio(a.baselineNs / (a.floorNs + a.handOverNs))} with this native hand-over`
        : '')
    : '';
  return `start${a.shape ? ` ${a.shape}` : ''} at n = ${fmtN(a.n)}: jobforge ${fmtNs(a.jobforgeNs)}/start (native hand-over ${fmtNs(a.handOverNs)}, JS side alone ${fmtNs(a.jsOnlyNs)})${base}`;
}

function workerSection(results) {
  const w = results.worker;
  if (!w) return '_bench/worker.js was not run (`--only` excluded it)._';
  if (!w.present) return '_bench/worker.js does not exist: scenario not run._';
  const lines = [
    'jobforge\'s worker (`startWorker()`, default pools) running n no-op handlers to completion, against a bare JS loop that builds the same ' +
      '`ctx` and awaits the same handler (the baseline has no worker). Run as a child process:',
    '',
    `Command: \`${w.command}\` (exit ${w.status}${w.timedOut ? ', timed out' : ''}, ${fmtS(w.wallS)}).`,
    '',
  ];
  // The drain's medians are shown in a table of their own, below.
  const med = Object.fromEntries(Object.entries(w.medians ?? {}).filter(([k]) => !k.startsWith('drain')));
  if (Object.keys(med).length) {
    lines.push(
      mdTable(
        ['implementation', 'median time', 'jobs/s'],
        Object.entries(med).map(([k, v]) => [k, `${v.ms.toLocaleString('en-US')} ms`, v.jobsPerS.toLocaleString('en-US')]),
      ),
    );
    if (w.ratioLine) lines.push('', w.ratioLine);
    lines.push('');
  }
  const d = w.drain;
  if (d) {
    lines.push(
      `**Drain of a started backlog**: ${fmtN(d.n)} runs started first (every \`await start()\` done before the worker exists), then ` +
        '`startWorker({ pools: { batch: { concurrency: 64 } } })`; only the drain is timed, from `startWorker` until all are completed, ' +
        `against the bare loop at the same n. Target: jobforge/bare ≥ 0.30.`,
      '',
      mdTable(
        ['', 'median time', 'jobs/s'],
        [
          ['jobforge worker, drain', `${d.ms.toLocaleString('en-US')} ms`, d.jobsPerS.toLocaleString('en-US')],
          ['bare JS loop', `${d.bareMs.toLocaleString('en-US')} ms`, d.bareJobsPerS.toLocaleString('en-US')],
          ['**jobforge/bare**', '', `**${d.ratio.toFixed(2)}**`],
        ],
      ),
      '',
    );
  }
  lines.push('Its output:', '', '```', (w.stdout || '(no output)').trimEnd(), '```');
  return lines.join('\n');
}

// ── markdown ───────────────────────────────────────────────────────────

function renderMarkdown(results, { resultsFile, chartFile }) {
  const m = results.machine;
  const out = [];
  out.push(`Generated by \`bench/run.js\` from \`${resultsFile}\` (the results file itself is not committed).`);
  out.push('');
  out.push('### Machine and run');
  out.push('');
  out.push(`- CPU: ${m.cpuModel}, nproc = ${m.nproc}`);
  out.push(`- memory: ${(m.memTotalBytes / 2 ** 30).toFixed(1)} GiB`);
  out.push(`- Node.js ${m.node} (V8 ${m.v8}), ${m.platform} ${m.kernel}`);
  out.push(`- jobforge commit: ${m.jobforgeCommit ?? 'unknown'}${m.dirty ? ' (working tree had uncommitted changes)' : ''}`);
  for (const [f, v] of Object.entries(m.addon ?? {})) {
    out.push(`- measured build: \`${f}\` ${v.sha256 ? `sha256 ${v.sha256}…, ` : ''}modified ${v.mtime}`);
  }
  out.push(`- command: \`${results.command}\``);
  out.push(`- started ${results.startedAt}, took ${fmtS(results.durationS)}`);
  if (results.load) {
    const la = (l) => l.map((x) => x.toFixed(2)).join(' / ');
    out.push(`- load average (1 / 5 / 15 min) at start ${la(results.load.start)}, at end ${la(results.load.end)}`);
  }
  const other = [
    results.config.keyedSizes && results.scenarios?.conc ? `keyed \`start\`: ${results.config.keyedSizes.map(fmtN).join(', ')}` : null,
    results.config.shapeSizes && shapeSizesIn(results).length ? `call shapes: ${results.config.shapeSizes.map(fmtN).join(', ')}` : null,
  ].filter(Boolean);
  out.push(
    `- sizes n = ${results.config.sizes.map(fmtN).join(', ')}${other.length ? ` (${other.join('; ')})` : ''}; ${results.config.reps} repetitions per point (n ≤ 10k: ${results.config.smallReps}), ` +
      'implementations alternating within each repetition; every figure is the median over repetitions.',
  );
  if (results.buildChanged) {
    const { start, end } = results.buildChanged;
    for (const f of new Set([...Object.keys(start), ...Object.keys(end)])) {
      const a = start[f];
      const b = end[f];
      if (JSON.stringify(a) === JSON.stringify(b)) continue;
      const same = a?.sha256 && b?.sha256 && a.sha256 === b.sha256;
      const what = same
        ? 'was rewritten with the same content (sha256 unchanged)'
        : a?.sha256 && b?.sha256
          ? `changed (sha256 ${a.sha256}… → ${b.sha256}…): the main process kept the build it loaded at the start, the memory, worker and pg child processes may have loaded the new one`
          : 'was rewritten (only its modification time was recorded): the memory, worker and pg child processes may have loaded another build';
      out.push(`- during the run \`${f}\` ${what} (modified ${a?.mtime ?? '–'} → ${b?.mtime ?? '–'}).`);
    }
  }
  if (!results.baseline.present) out.push(`- **baseline absent** (${results.baseline.error}): jobforge only.`);
  out.push('');
  out.push('### Targets');
  out.push('');
  out.push('Ratios are jobforge/baseline throughput (baseline cost ÷ jobforge cost; above 1 = jobforge faster), except memory (jobforge bytes ÷ baseline bytes), the scaling row and the worker drain (jobforge ÷ a bare JS loop).');
  out.push('');
  out.push(targetsTable(results));
  out.push('');
  if (results.pg !== undefined) {
    const pt = computePgTargets(results);
    const v = pt.map(verdict);
    const summary = v.every((x) => x === 'n/a') ? `n/a (${pgUnavailable(results)})` : pt.map((t) => `${t.id.replace(/^pg-/, '')} **${verdict(t)}**`).join(', ');
    out.push(`PostgreSQL backend against graphile-worker (section 6): ${summary}.`);
    out.push('');
  }
  out.push('### Chart');
  out.push('');
  out.push(`![cost per operation against n, log–log, jobforge solid, baseline dashed](${chartFile})`);
  out.push('');
  for (const s of SCENARIOS) {
    const { table, notes } = scenarioTable(results, s.key);
    out.push(`### ${s.title}`);
    out.push('');
    out.push(table);
    for (const nt of notes) out.push('', `_${nt}_`);
    out.push('');
  }
  out.push('### 4. Memory per pending run (fresh child process per implementation and size)');
  out.push('');
  out.push(memoryTable(results));
  out.push('');
  out.push('### 5. Worker end to end (`bench/worker.js`)');
  out.push('');
  out.push(workerSection(results));
  out.push('');
  out.push('### 6. PostgreSQL backend vs graphile-worker (`bench/pg.js`)');
  out.push('');
  out.push(pgSection(results));
  out.push('');
  const shapes = shapesSection(results);
  if (shapes) {
    out.push('### 7. `start` for every call shape');
    out.push('');
    out.push(shapes);
    out.push('');
  }
  out.push('### Where the baseline stopped');
  out.push('');
  out.push(...coverageLines(results));
  out.push('');
  const bd = breakdownTable(results);
  if (bd) {
    out.push('### Per-call costs (diagnostic, not a target)');
    out.push('');
    out.push(bd);
    out.push('');
  }
  const acct = startAccountingSection(results.breakdown?.start1k);
  if (acct) {
    out.push(`### Unkeyed \`start\` at n = ${fmtN(results.breakdown.start1k.n)}: where the time goes (diagnostic)`);
    out.push('');
    out.push(acct);
    out.push('');
  }
  const acctP = startAccountingSection(results.breakdown?.startPriority1k);
  if (acctP) {
    out.push(`### \`start\` with \`${results.breakdown.startPriority1k.shape}\` at n = ${fmtN(results.breakdown.startPriority1k.n)}: where the time goes (diagnostic)`);
    out.push('');
    out.push(acctP.replace('the scenario 1 loop', 'the same loop with `{ priority }`').replace(' (three `Date`s,', ' (its priority read, three `Date`s,'));
    out.push('');
  }
  const sa = shapeAccountingSection(results);
  if (sa) {
    out.push('### `start` with options at n = 1k and 100k: where the time goes (diagnostic)');
    out.push('');
    out.push(sa);
    out.push('');
  }
  const ka = keyedAccountingSection(results);
  if (ka) {
    out.push(`### Keyed \`start\` at n = ${fmtN(results.breakdown.keyed20k.n)} live runs: where the time goes (diagnostic)`);
    out.push('');
    out.push(ka);
    out.push('');
  }
  return out.join('\n');
}

const BEGIN = '<!-- bench:begin (generated by bench/run.js; edit outside these markers) -->';
const END = '<!-- bench:end -->';

function updateBenchmarksMd(file, generated) {
  let text = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : `# Benchmarks\n\n${BEGIN}\n${END}\n`;
  const a = text.indexOf(BEGIN);
  const b = text.indexOf(END);
  if (a < 0 || b < a) text = `${text.trimEnd()}\n\n${BEGIN}\n${END}\n`;
  const start = text.indexOf(BEGIN) + BEGIN.length;
  const end = text.indexOf(END);
  text = `${text.slice(0, start)}\n${generated.trimEnd()}\n${text.slice(end)}`;
  fs.writeFileSync(file, text);
}

// ── chart ──────────────────────────────────────────────────────────────

function esc(s) {
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function renderSvg(results) {
  const W = 960;
  const H = 560;
  const L = 86;
  const R = 250;
  const T = 64;
  const B = 64;
  const pw = W - L - R;
  const ph = H - T - B;
  const series = [];
  for (const s of CHART_SERIES) {
    for (const impl of IMPLS) {
      const pts = results.scenarios?.[s.key]?.[impl]?.points ?? {};
      const xy = Object.keys(pts)
        .map(Number)
        .sort((a, b) => a - b)
        .map((n) => [n, pts[n].median.nsPerOp / 1e3])
        .filter(([, y]) => Number.isFinite(y) && y > 0);
      if (xy.length) series.push({ ...s, impl, xy });
    }
  }
  const xs = series.flatMap((s) => s.xy.map(([x]) => x));
  const ys = series.flatMap((s) => s.xy.map(([, y]) => y));
  if (!xs.length) xs.push(1000, 1000000);
  if (!ys.length) ys.push(1, 1000);
  const x0 = Math.log10(Math.min(...xs)) - 0.15;
  const x1 = Math.log10(Math.max(...xs)) + 0.15;
  const y0 = Math.floor(Math.log10(Math.min(...ys)));
  const y1 = Math.max(y0 + 1, Math.ceil(Math.log10(Math.max(...ys))));
  const px = (n) => L + ((Math.log10(n) - x0) / (x1 - x0)) * pw;
  const py = (us) => T + ph - ((Math.log10(us) - y0) / (y1 - y0)) * ph;
  const f = (v) => v.toFixed(1);
  const yLabel = (e) => {
    const us = 10 ** e;
    if (us < 1) return `${us * 1e3} ns`;
    if (us < 1e3) return `${us} µs`;
    if (us < 1e6) return `${us / 1e3} ms`;
    return `${us / 1e6} s`;
  };
  const o = [];
  o.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="Helvetica, Arial, sans-serif" font-size="12">`);
  o.push(`<title>jobforge vs baseline: cost per operation against live runs n (log–log)</title>`);
  o.push(`<desc>Generated by bench/run.js from measured medians (${esc(results.startedAt)}).</desc>`);
  o.push(`<rect width="${W}" height="${H}" fill="#ffffff"/>`);
  o.push(`<text x="${L}" y="26" font-size="16" font-weight="bold">Cost per operation against live runs n (log–log, median of repetitions)</text>`);
  const m = results.machine;
  const load = results.load ? `; load average ${results.load.start[0].toFixed(1)} at start, ${results.load.end[0].toFixed(1)} at end` : '';
  o.push(`<text x="${L}" y="46" fill="#555">${esc(`${m.cpuModel}, ${m.nproc} cores, Node.js ${m.node}; ${results.startedAt.slice(0, 10)}${load}`)}</text>`);
  // grid
  for (let e = y0; e <= y1; e++) {
    const y = py(10 ** e);
    o.push(`<line x1="${L}" y1="${f(y)}" x2="${L + pw}" y2="${f(y)}" stroke="#ccc"/>`);
    o.push(`<text x="${L - 8}" y="${f(y + 4)}" text-anchor="end">${esc(yLabel(e))}</text>`);
    if (e < y1) {
      for (const k of [2, 5]) {
        const ym = py(k * 10 ** e);
        o.push(`<line x1="${L}" y1="${f(ym)}" x2="${L + pw}" y2="${f(ym)}" stroke="#eee"/>`);
      }
    }
  }
  const sizes = [...new Set(xs)].sort((a, b) => a - b);
  for (const n of sizes) {
    const x = px(n);
    o.push(`<line x1="${f(x)}" y1="${T}" x2="${f(x)}" y2="${T + ph}" stroke="#ddd"/>`);
    o.push(`<text x="${f(x)}" y="${T + ph + 18}" text-anchor="middle">${fmtN(n)}</text>`);
  }
  o.push(`<rect x="${L}" y="${T}" width="${pw}" height="${ph}" fill="none" stroke="#333"/>`);
  o.push(`<text x="${L + pw / 2}" y="${H - 18}" text-anchor="middle">live runs n (log)</text>`);
  o.push(`<text transform="translate(22 ${T + ph / 2}) rotate(-90)" text-anchor="middle">cost per operation (log)</text>`);
  // series
  for (const s of series) {
    const dash = s.impl === 'baseline' ? ' stroke-dasharray="7 5"' : '';
    const pts = s.xy.map(([x, y]) => `${f(px(x))},${f(py(y))}`).join(' ');
    o.push(`<polyline points="${pts}" fill="none" stroke="${s.color}" stroke-width="2"${dash}/>`);
    for (const [x, y] of s.xy) {
      const cx = px(x);
      const cy = py(y);
      const tip = `<title>${esc(`${s.label}, ${s.impl}, n = ${fmtN(x)}: ${fmtNs(y * 1e3)}`)}</title>`;
      if (s.impl === 'baseline') {
        o.push(`<rect x="${f(cx - 4)}" y="${f(cy - 4)}" width="8" height="8" fill="#fff" stroke="${s.color}" stroke-width="2">${tip}</rect>`);
      } else {
        o.push(`<circle cx="${f(cx)}" cy="${f(cy)}" r="4" fill="${s.color}">${tip}</circle>`);
      }
    }
  }
  // legend
  let ly = T + 8;
  const lx = L + pw + 20;
  o.push(`<text x="${lx}" y="${ly + 4}" font-weight="bold">operation</text>`);
  ly += 20;
  for (const s of CHART_SERIES) {
    o.push(`<line x1="${lx}" y1="${ly}" x2="${lx + 28}" y2="${ly}" stroke="${s.color}" stroke-width="3"/>`);
    o.push(`<text x="${lx + 36}" y="${ly + 4}">${esc(s.label)}</text>`);
    ly += 20;
  }
  ly += 10;
  o.push(`<text x="${lx}" y="${ly + 4}" font-weight="bold">implementation</text>`);
  ly += 20;
  o.push(`<line x1="${lx}" y1="${ly}" x2="${lx + 28}" y2="${ly}" stroke="#333" stroke-width="2"/><circle cx="${lx + 14}" cy="${ly}" r="4" fill="#333"/>`);
  o.push(`<text x="${lx + 36}" y="${ly + 4}">jobforge</text>`);
  ly += 20;
  o.push(`<line x1="${lx}" y1="${ly}" x2="${lx + 28}" y2="${ly}" stroke="#333" stroke-width="2" stroke-dasharray="7 5"/><rect x="${lx + 10}" y="${ly - 4}" width="8" height="8" fill="#fff" stroke="#333" stroke-width="2"/>`);
  o.push(`<text x="${lx + 36}" y="${ly + 4}">baseline (seed TS)</text>`);
  if (!results.baseline?.present) {
    ly += 20;
    o.push(`<text x="${lx}" y="${ly + 4}" fill="#a00">baseline absent</text>`);
  }
  ly += 30;
  const stops = [];
  for (const s of CHART_SERIES) {
    const st = results.scenarios?.[s.key]?.baseline?.stopped;
    if (st) stops.push(`${s.label}: baseline stops before ${fmtN(st.atN)}`);
  }
  for (const line of stops) {
    o.push(`<text x="${lx}" y="${ly}" fill="#555" font-size="11">${esc(line)}</text>`);
    ly += 16;
  }
  o.push('</svg>');
  return `${o.join('\n')}\n`;
}

// ── console ────────────────────────────────────────────────────────────

function pgConsole(results) {
  const pad = (s, w) => String(s).padEnd(w);
  const out = ['6. PostgreSQL backend vs graphile-worker (bench/pg.js)'];
  const why = pgUnavailable(results);
  const d = results.pg?.data;
  if (d?.skipped) {
    out.push(`  SKIPPED (no server; not a failure): ${d.skipped}`);
    return out;
  }
  if (!d) {
    out.push(`  not measured: ${why}`);
    return out;
  }
  if (why) out.push(`  no comparison: ${why}`);
  const jf = d.systems?.jobforge;
  const gw = d.systems?.graphile;
  const c = d.config ?? {};
  out.push(`  PostgreSQL ${d.machine?.postgres ?? '?'} at ${d.url}; load ${(d.load?.start ?? []).map((x) => x.toFixed(2)).join(' / ')} at start; ${c.reps} repetition(s), N = ${fmtJobs(c.n)}`);
  out.push(`  ${pad('', 22)}${pad('jobforge', 14)}${pad('graphile', 14)}ratio jf/gw`);
  for (const p of c.procs ?? PG_PROCS) {
    const j = jf?.throughput?.[p]?.jobsPerS;
    const g = gw?.throughput?.[p]?.jobsPerS;
    out.push(`  ${pad(`jobs/s, ${p} process${p > 1 ? 'es' : ''}`, 22)}${pad(fmtJobs(j), 14)}${pad(fmtJobs(g), 14)}${fmtRatio(pgRatio(j, g))}`);
  }
  for (const k of ['p50', 'p99']) {
    const j = jf?.latency?.[k];
    const g = gw?.latency?.[k];
    out.push(`  ${pad(`latency ${k}`, 22)}${pad(fmtMs(j), 14)}${pad(fmtMs(g), 14)}${fmtRatio(pgRatio(j, g))}`);
  }
  {
    const j = jf?.enqueue?.jobsPerS;
    const g = gw?.enqueue?.jobsPerS;
    out.push(`  ${pad('enqueue jobs/s', 22)}${pad(fmtJobs(j), 14)}${pad(fmtJobs(g), 14)}${fmtRatio(pgRatio(j, g))}`);
  }
  for (const p of d.problems ?? []) out.push(`  PROBLEM ${p}`);
  return out;
}

function consoleSummary(results) {
  const out = [];
  const pad = (s, w) => String(s).padEnd(w);
  for (const s of SCENARIOS) {
    if (!results.scenarios?.[s.key]) continue;
    out.push('', s.title.replace(/`/g, ''));
    out.push(`  ${pad('n', 6)}${pad('jobforge/op', 14)}${pad('baseline/op', 14)}ratio jf/bl`);
    for (const n of sizesIn(results, s.key)) {
      const j = median(results, s.key, 'jobforge', n);
      const b = median(results, s.key, 'baseline', n);
      if (j === null && b === null) continue;
      out.push(`  ${pad(fmtN(n), 6)}${pad(fmtNs(j), 14)}${pad(fmtNs(b), 14)}${fmtRatio(speedup(results, s.key, n))}`);
    }
    for (const impl of IMPLS) {
      const nt = stopNote(results, s.key, impl);
      if (nt) out.push(`  (${nt})`);
    }
  }
  if (shapeSizesIn(results).length) {
    out.push('', '7. start for every call shape (ops/s over the 0 → n loop; last = per start, last min(1000, n/10); † baseline rows copied)');
    out.push(`  ${pad('n', 6)}${pad('shape', 34)}${pad('jf ops/s', 11)}${pad('bl ops/s', 11)}${pad('ratio', 9)}${pad('jf last', 10)}${pad('bl last', 12)}ratio last`);
    for (const n of shapeSizesIn(results)) {
      for (const sh of SHAPES) {
        const scen = `shape.${sh.key}`;
        const j = point(results, scen, 'jobforge', n);
        const b = point(results, scen, 'baseline', n);
        if (!j && !b) continue;
        const jl = j?.median.marginalNsPerOp;
        const bl = b?.median.marginalNsPerOp;
        out.push(
          `  ${pad(fmtN(n), 6)}${pad(sh.short.replace(/`/g, ''), 34)}${pad(fmtOps(j?.median.nsPerOp), 11)}${pad(b?.mode === 'copy' ? '†' : fmtOps(b?.median.nsPerOp), 11)}` +
            `${pad(fmtRatio(speedup(results, scen, n)), 9)}${pad(fmtNs(jl), 10)}${pad(`${fmtNs(bl)}${b?.mode === 'copy' ? ' †' : ''}`, 12)}${fmtRatio(jl && bl ? bl / jl : null)}`,
        );
      }
    }
  }
  if (results.memory && Object.keys(results.memory).length) {
    out.push('', '4. memory per pending run');
    for (const n of results.config.memorySizes ?? []) {
      for (const impl of IMPLS) {
        const m = results.memory?.[impl]?.[String(n)];
        if (m) out.push(`  ${pad(fmtN(n), 6)}${pad(impl, 10)}heap ${pad(fmtBytes(m.heapPerRun), 10)} external ${pad(fmtBytes(m.externalPerRun), 10)} RSS ${fmtBytes(m.rssPerRun)}`);
      }
    }
  }
  if (results.pg !== undefined && results.pg !== null) out.push('', ...pgConsole(results));
  out.push('', 'Targets');
  const targets = [...computeTargets(results), ...(results.pg !== undefined ? computePgTargets(results) : [])];
  for (const t of targets) {
    out.push(`  ${pad(verdict(t), 5)} ${pad(t.display, 10)} (needs ${t.threshold}) ${t.label.replace(/`/g, '')}${t.note ? ` [${t.note}]` : ''}`);
  }
  return out.join('\n');
}

module.exports = {
  pgSection,
  SCENARIOS,
  SHAPES,
  computePgTargets,
  computeTargets,
  consoleSummary,
  fmtN,
  fmtNs,
  fmtS,
  renderMarkdown,
  renderSvg,
  startAccountingLine,
  updateBenchmarksMd,
  verdict,
};
