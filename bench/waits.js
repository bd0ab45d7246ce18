#!/usr/bin/env node
/*
 * Durable waits benchmark (issue 22). Every figure is measured in this run,
 * each scenario in a fresh child process (so RSS and CPU are its own):
 *
 * 1. RSS per run, memory store: N runs started and left pending (no
 *    worker) against N runs started and parked in `ctx.sleep` by the
 *    worker (an hour away); RSS after a full GC minus RSS before, per run.
 * 2. Park + resume, memory worker: N runs, each `await ctx.sleep('s', 1000)`
 *    on the manual clock: the worker parks all of them, `advanceTime(1000)`
 *    resumes all, the worker completes all. Runs/s = N / (time from
 *    `startWorker` until the last completion), so each run is executed
 *    twice and parked once inside the timed section.
 * 3. Resume lateness (system clock): S sleepers whose deadlines fall due
 *    together (memory: spread over 2 s; PostgreSQL: all at one instant);
 *    for each, the time from its deadline to its handler running again
 *    past the sleep. p50 / p99 / max.
 * 4. Idle CPU: N far-off sleepers parked, then CPU time of the process
 *    over 5 s of wall time with nothing due, as % of one core.
 * 5. Signal round trip: one run at a time waits for a signal; the time
 *    from `signal()` to its handler continuing past the wait. p50 / p99.
 *
 * 6. Bounds: one memoized ctx call to the engine, a run with no wait in the
 *    same harness, and the PostgreSQL resume statement alone on 10k runs.
 *
 *   node bench/waits.js [--n 100000] [--pg-n 20000] [--lateness-n 10000] [--only memory|postgres] [--json <file>] [--docs]
 *   JOBFORGE_PG_URL   database URL (default postgres://postgres@127.0.0.1:5432/test); PostgreSQL parts
 *                     are skipped with a message when no server answers.
 * `--docs` rewrites the "Durable waits" section of BENCHMARKS.md.
 */
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { performance } = require('node:perf_hooks');

const ROOT = path.join(__dirname, '..');
const DEFAULT_URL = 'postgres://postgres@127.0.0.1:5432/test';
const quiet = { log() {}, warn() {}, error() {}, debug() {} };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nowMs = () => performance.timeOrigin + performance.now();

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

function pct(xs, p) {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

// ── child scenarios ────────────────────────────────────────────────────

async function make(backend, clock) {
  const { JobOrchestrator } = require(path.join(ROOT, 'dist'));
  const opts = { clock, loggerFactory: () => quiet };
  if (backend === 'postgres') {
    const schema = `jf_wbench_${process.pid}`;
    opts.backend = 'postgres';
    opts.postgres = { url: process.env.JOBFORGE_PG_URL || DEFAULT_URL, schema, maxConnections: 10 };
  }
  const o = new JobOrchestrator(opts);
  if (backend === 'postgres') await o.migrate();
  return o;
}

async function drop(o, backend) {
  if (backend !== 'postgres') return;
  const { Client } = require('pg');
  const c = new Client({ connectionString: process.env.JOBFORGE_PG_URL || DEFAULT_URL });
  await c.connect();
  await c.query(`DROP SCHEMA IF EXISTS jf_wbench_${process.pid} CASCADE`);
  await c.end();
}

async function countStatus(o, status) {
  return (await o.countByPoolAndStatus()).filter((c) => c.status === status).reduce((a, c) => a + c.count, 0);
}

/**
 * Whether any run still waits with a deadline. Memory: the orchestrator's
 * count. PostgreSQL: one probe of `job_run_wait_deadline_idx` (about a
 * millisecond), so the poll does not blur what it measures.
 */
async function waitingProbe(o, backend) {
  if (backend !== 'postgres') {
    const probe = async () => (await countStatus(o, 'waiting')) > 0;
    probe.close = async () => {};
    return probe;
  }
  const { Client } = require('pg');
  const c = new Client({ connectionString: process.env.JOBFORGE_PG_URL || DEFAULT_URL });
  await c.connect();
  const sql = `SELECT 1 FROM jf_wbench_${process.pid}.job_run WHERE status = 'waiting' AND wait_deadline IS NOT NULL LIMIT 1`;
  const probe = async () => (await c.query(sql)).rowCount > 0;
  probe.close = () => c.end();
  return probe;
}

async function until(cond, limitMs) {
  const end = Date.now() + limitMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error('bench: timed out');
    await sleep(2);
  }
}

async function startMany(o, type, n, input = () => ({})) {
  const inflight = [];
  for (let i = 0; i < n; i++) {
    inflight.push(o.start(type, input(i)));
    if (inflight.length >= 200) await Promise.all(inflight.splice(0));
  }
  await Promise.all(inflight);
}

/** RSS and V8's heap size after a few full collections. */
async function rss() {
  for (let i = 0; i < 4; i++) {
    global.gc();
    await sleep(20);
  }
  const m = process.memoryUsage();
  return { rss: m.rss, heapTotal: m.heapTotal };
}

/**
 * Per run: RSS, and RSS outside V8's heap (what the engine holds). V8's
 * young generation grows while handlers run and is shrunk only once the
 * process has been quiet a while, so after executions RSS carries tens of
 * megabytes of it whatever n is; the second figure leaves it out.
 */
function perRun(before, after, n) {
  return {
    bytesPerRun: (after.rss - before.rss) / n,
    outsideHeapPerRun: (after.rss - after.heapTotal - (before.rss - before.heapTotal)) / n,
  };
}

const scenarios = {
  async 'rss-pending'({ n }) {
    const o = await make('memory', 'system');
    o.registerHandler('s', {}, async (ctx) => ctx.sleep('s', 3_600_000));
    const before = await rss();
    await startMany(o, 's', n);
    const after = await rss();
    return perRun(before, after, n);
  },
  // Pending runs that have run once (each failed and waits an hour for its
  // retry): the same execution behind them as a parked run has.
  async 'rss-retrying'({ n }) {
    const o = await make('memory', 'system');
    o.registerHandler('f', { retry: { attempts: 2, backoff: 'fixed', baseMs: 3_600_000 } }, async () => {
      throw new Error('later');
    });
    const before = await rss();
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    await startMany(o, 'f', n);
    await until(async () => (await countStatus(o, 'pending')) === n && (await countStatus(o, 'running')) === 0, 600_000);
    const after = await rss();
    await w.stop();
    return perRun(before, after, n);
  },
  async 'rss-waiting'({ n }) {
    const o = await make('memory', 'system');
    o.registerHandler('s', {}, async (ctx) => ctx.sleep('s', 3_600_000));
    const before = await rss();
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    await startMany(o, 's', n);
    await until(async () => (await countStatus(o, 'waiting')) === n, 600_000);
    const after = await rss();
    await w.stop();
    return perRun(before, after, n);
  },
  async 'park-resume'({ n }) {
    const o = await make('memory', 'manual');
    let done = 0;
    o.registerHandler('s', {}, async (ctx) => {
      await ctx.sleep('s', 1000);
      done++;
    });
    await startMany(o, 's', n);
    const t0 = nowMs();
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    await until(async () => (await countStatus(o, 'waiting')) === n, 600_000);
    const parkedMs = nowMs() - t0;
    o.advanceTime(1000);
    await until(() => done === n, 600_000);
    const ms = nowMs() - t0;
    await w.stop();
    return { n, ms, parkedMs, runsPerS: n / (ms / 1000) };
  },
  async lateness({ backend, n }) {
    const o = await make(backend, 'system');
    const late = [];
    o.registerHandler('s', {}, async (ctx) => {
      await ctx.sleepUntil('s', new Date(ctx.input.at));
      late.push(Date.now() - ctx.input.at);
    });
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    // Deadlines after every start and park is done: far enough ahead.
    const lead = backend === 'postgres' ? Math.max(5_000, n * 2) : Math.max(2_000, n / 5);
    const base = Date.now() + lead;
    const spread = backend === 'postgres' ? 0 : 2_000;
    await startMany(o, 's', n, (i) => ({ at: base + (spread === 0 ? 0 : Math.floor((i * spread) / n)) }));
    await until(async () => (await countStatus(o, 'waiting')) === n || Date.now() > base, lead + 60_000);
    const parkedInTime = Date.now() < base;
    // When the last sleeper was resumed (turned pending), as a poll of the
    // waiting count sees it: the resumer's own lateness, without the time
    // the workers then take to run them all.
    await until(async () => Date.now() >= base + spread, lead + spread + 60_000);
    // On PostgreSQL a grouped count takes ~30 ms under this load, as long
    // as the resumption it times: ask the deadline index instead (a
    // waiting run with a deadline left?), on a connection of its own.
    const stillWaiting = await waitingProbe(o, backend);
    await until(async () => !(await stillWaiting()), 120_000);
    const allResumedMs = Date.now() - (base + spread);
    await stillWaiting.close();
    await until(() => late.length === n, lead + spread + 120_000);
    await w.stop();
    await drop(o, backend);
    return { n, parkedInTime, allResumedMs, p50: pct(late, 50), p99: pct(late, 99), max: pct(late, 100), together: spread === 0 };
  },
  async 'idle-cpu'({ backend, n }) {
    const o = await make(backend, 'system');
    o.registerHandler('s', {}, async (ctx) => ctx.sleep('s', 3_600_000));
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    await startMany(o, 's', n);
    await until(async () => (await countStatus(o, 'waiting')) === n, 1_200_000);
    await sleep(1000);
    const c0 = process.cpuUsage();
    const t0 = nowMs();
    await sleep(5000);
    const c = process.cpuUsage(c0);
    const wall = nowMs() - t0;
    await w.stop();
    await drop(o, backend);
    return { n, cpuPercent: ((c.user + c.system) / 1000 / wall) * 100 };
  },
  async 'signal-rtt'({ backend, n }) {
    const o = await make(backend, 'system');
    let resolveNext = null;
    o.registerHandler('s', {}, async (ctx) => {
      await ctx.waitForSignal('go');
      if (resolveNext) resolveNext(nowMs());
    });
    const w = o.startWorker({ pools: { batch: { concurrency: 8 } } });
    const rtt = [];
    for (let i = 0; i < n; i++) {
      const r = await o.start('s', {});
      await until(async () => (await o.findById(r.id)).status === 'waiting', 10_000);
      const continued = new Promise((res) => (resolveNext = res));
      const t0 = nowMs();
      await o.signal(r.id, 'go');
      rtt.push((await continued) - t0);
    }
    await w.stop();
    await drop(o, backend);
    return { n, p50: pct(rtt, 50), p99: pct(rtt, 99) };
  },

  // The bound of park + resume: what one memoized ctx call to the engine
  // costs (a sleep, a step), and a run with no wait at all, in the same
  // harness as 'park-resume' (a run that parks once is two executions and
  // two wait calls).
  async 'ctx-calls'({ n }) {
    const o = await make('memory', 'manual');
    const out = {};
    o.registerHandler('calls', {}, async (ctx) => {
      await ctx.sleep('s', 0);
      await ctx.step('t', () => 1);
      const K = 100_000;
      let t0 = nowMs();
      for (let i = 0; i < K; i++) await ctx.sleep('s', 0);
      out.sleepCallUs = ((nowMs() - t0) * 1000) / K;
      t0 = nowMs();
      for (let i = 0; i < K; i++) await ctx.step('t', () => 1);
      out.stepCallUs = ((nowMs() - t0) * 1000) / K;
    });
    const r = await o.start('calls', {});
    await o.claimNext('batch');
    await o.tick(r.id);
    let done = 0;
    o.registerHandler('plain', {}, async () => {
      done++;
    });
    await startMany(o, 'plain', n);
    const t0 = nowMs();
    const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
    await until(() => done === n, 600_000);
    out.plainRunsPerS = n / ((nowMs() - t0) / 1000);
    await w.stop();
    return out;
  },
  // The bound of resuming on PostgreSQL: the resume statement alone on
  // 10k due waiting runs, no worker, no other load (the table with all its
  // indexes, as migrated).
  async 'pg-resume-bound'({ n }) {
    const o = await make('postgres', 'system');
    await o.close();
    const { Client } = require('pg');
    const c = new Client({ connectionString: process.env.JOBFORGE_PG_URL || DEFAULT_URL });
    await c.connect();
    const s = `jf_wbench_${process.pid}`;
    await c.query(`INSERT INTO ${s}.job_run (id, job_type, root_run_id, pool, status, wait_kind, wait_deadline, input)
      SELECT gen_random_uuid(), 's', gen_random_uuid(), 'batch', 'waiting', 'sleep', now() - interval '1 second', '{}' FROM generate_series(1, $1::int)`, [n]);
    await c.query(`VACUUM ANALYZE ${s}.job_run`);
    await c.query('CHECKPOINT');
    const indexes = Number((await c.query(`SELECT count(*)::int AS c FROM pg_indexes WHERE schemaname = $1 AND tablename = 'job_run'`, [s])).rows[0].c);
    const sql = `WITH due AS (SELECT id FROM ${s}.job_run WHERE status = 'waiting' AND wait_deadline IS NOT NULL AND wait_deadline <= now() ORDER BY wait_deadline, seq LIMIT 5000 FOR UPDATE SKIP LOCKED) UPDATE ${s}.job_run r SET status = 'pending', run_at = now(), wait_kind = NULL, wait_deadline = NULL, updated_at = now() FROM due WHERE r.id = due.id`;
    const t0 = nowMs();
    let resumed = 0;
    for (;;) {
      await c.query('BEGIN');
      const r = await c.query(sql);
      await c.query('COMMIT');
      resumed += r.rowCount;
      if (r.rowCount < 5000) break;
    }
    const ms = nowMs() - t0;
    await c.end();
    await drop(o, 'postgres');
    return { n: resumed, ms, indexes };
  },
};

async function child() {
  const name = arg('child');
  const params = JSON.parse(arg('params', '{}'));
  const out = await scenarios[name](params);
  process.stdout.write(`\nRESULT ${JSON.stringify(out)}\n`);
  process.exit(0);
}

function runChild(name, params) {
  const r = spawnSync(process.execPath, ['--expose-gc', __filename, '--child', name, '--params', JSON.stringify(params)], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 30 * 60 * 1000,
    maxBuffer: 1 << 26,
  });
  const line = (r.stdout || '').split('\n').find((l) => l.startsWith('RESULT '));
  if (!line) throw new Error(`${name} failed (exit ${r.status}): ${(r.stderr || '').trim().split('\n').slice(-5).join(' / ')}`);
  return JSON.parse(line.slice(7));
}

function pgReachable() {
  const url = process.env.JOBFORGE_PG_URL || DEFAULT_URL;
  const script = `const {Client}=require('pg');const c=new Client({connectionString:process.argv[1]});c.connect().then(()=>c.query('select 1')).then(()=>c.end()).then(()=>process.exit(0),(e)=>{process.stdout.write(String(e.message));process.exit(1)})`;
  const r = spawnSync(process.execPath, ['-e', script, url], { cwd: ROOT, encoding: 'utf8', timeout: 10_000 });
  return r.status === 0 ? null : (r.stdout || r.stderr || 'no answer').trim();
}

const f1 = (x) => (x === null || x === undefined ? '–' : x < 10 ? x.toFixed(2) : x.toFixed(1));
const int = (x) => Math.round(x).toLocaleString('en-US');

async function main() {
  const n = Number(arg('n', 100000));
  const pgN = Number(arg('pg-n', 20000));
  const latN = Number(arg('lateness-n', 10000));
  const only = arg('only', null);
  const res = { machine: `${require('node:os').cpus().length} cores, Node ${process.version}`, memory: null, postgres: null };
  if (only !== 'postgres') {
    console.log(`# memory: ${int(n)} runs`);
    const pending = runChild('rss-pending', { n });
    const waiting = runChild('rss-waiting', { n });
    const retrying = runChild('rss-retrying', { n });
    console.log(`rss per run: pending ${int(pending.bytesPerRun)} B, waiting ${int(waiting.bytesPerRun)} B, ratio ${(waiting.bytesPerRun / pending.bytesPerRun).toFixed(2)}; pending after one attempt (retry backoff) ${int(retrying.bytesPerRun)} B, waiting/that ${(waiting.bytesPerRun / retrying.bytesPerRun).toFixed(2)}`);
    console.log(`rss outside V8's heap per run: pending ${int(pending.outsideHeapPerRun)} B, waiting ${int(waiting.outsideHeapPerRun)} B, ratio ${(waiting.outsideHeapPerRun / pending.outsideHeapPerRun).toFixed(2)}`);
    const park = runChild('park-resume', { n });
    console.log(`park + resume: ${int(park.runsPerS)} runs/s (${int(park.ms)} ms, parked all in ${int(park.parkedMs)} ms)`);
    const late = runChild('lateness', { backend: 'memory', n: latN });
    console.log(`resume lateness (${int(latN)} sleepers over 2 s): p50 ${f1(late.p50)} ms, p99 ${f1(late.p99)} ms, max ${f1(late.max)} ms`);
    const idle = runChild('idle-cpu', { backend: 'memory', n });
    console.log(`idle CPU with ${int(n)} far-off sleepers: ${idle.cpuPercent.toFixed(2)} % of a core`);
    const sig = runChild('signal-rtt', { backend: 'memory', n: 1000 });
    console.log(`signal round trip: p50 ${f1(sig.p50)} ms, p99 ${f1(sig.p99)} ms`);
    const calls = runChild('ctx-calls', { n });
    console.log(`bound: a memoized ctx call ${f1(calls.sleepCallUs)} µs (sleep), ${f1(calls.stepCallUs)} µs (step); a run with no wait ${int(calls.plainRunsPerS)} runs/s`);
    res.memory = {
      calls, n, pending, waiting, retrying, rssRatio: waiting.bytesPerRun / pending.bytesPerRun, park, late, idle, sig };
  }
  if (only !== 'memory') {
    const why = pgReachable();
    if (why !== null) {
      console.log(`# postgres: skipped (${why})`);
      res.postgres = { skipped: why };
    } else {
      console.log(`# postgres: ${int(pgN)} idle sleepers, ${int(latN)} due together`);
      const late = runChild('lateness', { backend: 'postgres', n: latN });
      console.log(`resume lateness (${int(latN)} sleepers due together): all resumed ${int(late.allResumedMs)} ms after the deadline; handler continuing p50 ${f1(late.p50)} ms, p99 ${f1(late.p99)} ms, max ${f1(late.max)} ms`);
      const idle = runChild('idle-cpu', { backend: 'postgres', n: pgN });
      console.log(`idle CPU with ${int(pgN)} far-off sleepers: ${idle.cpuPercent.toFixed(2)} % of a core (this process; the server's own CPU not counted)`);
      const sig = runChild('signal-rtt', { backend: 'postgres', n: 300 });
      console.log(`signal round trip: p50 ${f1(sig.p50)} ms, p99 ${f1(sig.p99)} ms`);
      const bound = runChild('pg-resume-bound', { n: latN });
      console.log(`bound: the resume statement alone on ${int(bound.n)} due runs: ${int(bound.ms)} ms (${bound.indexes} indexes on job_run)`);
      res.postgres = { n: pgN, late, idle, sig, bound };
    }
  }
  const json = arg('json', null);
  if (json) fs.writeFileSync(json, JSON.stringify(res, null, 2));
  if (process.argv.includes('--docs')) writeDocs(res, { n, pgN, latN });
}

function writeDocs(r, { n, pgN, latN }) {
  const file = path.join(ROOT, 'BENCHMARKS.md');
  const begin = '<!-- waits:begin -->';
  const end = '<!-- waits:end -->';
  const m = r.memory;
  const p = r.postgres;
  const ok = (cond) => (cond ? 'PASS' : 'MISS');
  const lines = [
    begin,
    '## Durable waits',
    '',
    `Measured by \`node bench/waits.js --docs\` (${r.machine}); each scenario in a fresh process. Targets from issue 22.`,
    '',
    '| what | measured | target | |',
    '|---|---|---|---|',
  ];
  if (m) {
    lines.push(
      `| RSS per run, memory, ${int(n)} runs: waiting in \`ctx.sleep\` / pending (never run) | ${int(m.waiting.bytesPerRun)} B / ${int(m.pending.bytesPerRun)} B = **${m.rssRatio.toFixed(2)}×** | ≤ 1.5× | ${ok(m.rssRatio <= 1.5)} |`,
      `| … outside V8's heap (the engine's memory: V8's young generation, grown by the executions, is shrunk only once the process has been quiet a while) | ${int(m.waiting.outsideHeapPerRun)} B / ${int(m.pending.outsideHeapPerRun)} B = **${(m.waiting.outsideHeapPerRun / m.pending.outsideHeapPerRun).toFixed(2)}×** | (report) | |`,
      `| … waiting / pending after one attempt (its retry an hour away: the same execution behind it) | ${int(m.waiting.bytesPerRun)} B / ${int(m.retrying.bytesPerRun)} B = **${(m.waiting.bytesPerRun / m.retrying.bytesPerRun).toFixed(2)}×** | (bound) | |`,
      `| park + resume of ${int(n)} runs, memory worker | **${int(m.park.runsPerS)} runs/s** | ≥ 50,000 | ${ok(m.park.runsPerS >= 50_000)} |`,
      `| resume lateness, memory worker, ${int(latN)} sleepers due over 2 s | p50 ${f1(m.late.p50)} ms, **p99 ${f1(m.late.p99)} ms** | p99 ≤ 10 ms | ${ok(m.late.p99 <= 10)} |`,
      `| idle CPU, memory, ${int(n)} far-off sleepers | **${m.idle.cpuPercent.toFixed(2)} %** of a core | < 1 % | ${ok(m.idle.cpuPercent < 1)} |`,
      `| signal round trip (send → handler continues), memory | **p50 ${f1(m.sig.p50)} ms**, p99 ${f1(m.sig.p99)} ms | (report) | |`,
      `| bound of park + resume: one memoized ctx call (sleep / step); a run with no wait, same harness | ${f1(m.calls.sleepCallUs)} µs / ${f1(m.calls.stepCallUs)} µs; ${int(m.calls.plainRunsPerS)} runs/s | (bound) | |`,
    );
  }
  if (p && !p.skipped) {
    lines.push(
      `| resume lateness, PostgreSQL, ${int(latN)} sleepers due together: every one resumed (pending) | **${int(p.late.allResumedMs)} ms** after the deadline (a probe of the deadline index every 2 ms, ~1 ms each) | ≤ 250 ms | ${ok(p.late.allResumedMs <= 250)} |`,
      `| … and each handler continuing past its sleep (includes running all ${int(latN)} again on one worker, concurrency 64) | p50 ${f1(p.late.p50)} ms, **p99 ${f1(p.late.p99)} ms** | p99 ≤ 250 ms | ${ok(p.late.p99 <= 250)} |`,
      `| idle CPU, PostgreSQL, ${int(pgN)} far-off sleepers (this process) | **${p.idle.cpuPercent.toFixed(2)} %** of a core | < 1 % | ${ok(p.idle.cpuPercent < 1)} |`,
      `| signal round trip, PostgreSQL | **p50 ${f1(p.sig.p50)} ms**, p99 ${f1(p.sig.p99)} ms | (report) | |`,
      `| bound of the PostgreSQL resume: the resume statement alone on ${int(p.bound.n)} due runs, no other load (${p.bound.indexes} indexes on job_run) | **${int(p.bound.ms)} ms** | (bound) | |`,
    );
  } else if (p) {
    lines.push(`| PostgreSQL | skipped: ${p.skipped} | | |`);
  }
  lines.push('', end);
  let doc = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  const i = doc.indexOf(begin);
  const j = doc.indexOf(end);
  doc = i >= 0 && j > i ? doc.slice(0, i) + lines.join('\n') + doc.slice(j + end.length) : `${doc.trimEnd()}\n\n${lines.join('\n')}\n`;
  fs.writeFileSync(file, doc);
  console.log('wrote the Durable waits section of BENCHMARKS.md');
}

if (process.argv.includes('--child')) {
  child().catch((e) => {
    process.stderr.write(String(e && e.stack ? e.stack : e));
    process.exit(1);
  });
} else {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
