#!/usr/bin/env node
/*
 * End-to-end worker benchmark: N no-op async handlers, started with
 * `start()` and run to completion by `startWorker()` (default pools), against
 * a bare JS loop that builds the same `ctx`-shaped object a handler receives
 * (input, run row object, step fn, spawnChild fn, logger, signal getter) and
 * awaits the same handler N times. The two alternate for several rounds;
 * medians and the ratio jobforge/bare are printed.
 *
 * Then the drain, as a user with a backlog sees it: DRAIN_N runs started
 * first (every `await start()` done, no worker yet), then
 * `startWorker({ pools: { batch: { concurrency: 64 } } })` runs them all;
 * only the drain is timed (from `startWorker` until all DRAIN_N are
 * completed), against the same bare loop at DRAIN_N, alternating.
 *
 *   node bench/worker.js [--n 100000] [--rounds 3] [--drain-n 50000] [--drain-rounds 5]
 *                        (or env N=..., ROUNDS=..., DRAIN_N=..., DRAIN_ROUNDS=...)
 */
'use strict';

const path = require('node:path');
const os = require('node:os');

const ROOT = path.join(__dirname, '..');
const { JobOrchestrator } = require(path.join(ROOT, 'dist'));

function arg(name, envName, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  const raw = i >= 0 ? process.argv[i + 1] : process.env[envName];
  if (raw === undefined) return dflt;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be a positive integer, got ${raw}`);
  return v;
}

const N = arg('n', 'N', 100000);
const ROUNDS = arg('rounds', 'ROUNDS', 3);
const DRAIN_N = arg('drain-n', 'DRAIN_N', 50000);
// A drain of 50k takes ~150 ms: more rounds than the loop above, as cheap as one of its rounds.
const DRAIN_ROUNDS = arg('drain-rounds', 'DRAIN_ROUNDS', 5);
const DRAIN_CONCURRENCY = 64;

const quiet = { log() {}, warn() {}, error() {}, debug() {} };

/** The handler both sides run: a no-op async function. */
const handler = async (ctx) => {
  void ctx;
};

const tick = () => new Promise((r) => setImmediate(r));

/** Full GC before a timed drain or bare loop: napi finalizers of the last orchestrator run on a later turn. */
async function settle() {
  if (!global.gc) return;
  for (let i = 0; i < 3; i++) {
    global.gc();
    await tick();
  }
}

/** jobforge: start N runs and let the worker run them all to completion. */
async function jobforgeRound(n) {
  const o = new JobOrchestrator({ loggerFactory: () => quiet });
  o.registerHandler('noop', {}, handler);
  const t0 = process.hrtime.bigint();
  const w = o.startWorker(); // default pools: batch (5), interactive (20)
  for (let i = 0; i < n; i++) await o.start('noop', { i });
  const started = process.hrtime.bigint();
  for (;;) {
    const counts = await o.countByPoolAndStatus();
    const done = counts.find((c) => c.pool === 'batch' && c.status === 'completed');
    if (done && done.count === n) break;
    const failed = counts.find((c) => c.status === 'failed' && c.count > 0);
    if (failed) throw new Error(`bench: ${failed.count} runs failed`);
    await tick();
  }
  const ns = process.hrtime.bigint() - t0;
  await w.stop();
  return { ms: Number(ns) / 1e6, startMs: Number(started - t0) / 1e6 };
}

/**
 * The drain: n runs started before the worker exists, then the worker
 * runs them all. The clock starts at `startWorker` and stops when all n
 * are completed. Completion is detected without listening to every run (a
 * `run:completed` listener would make the engine report every transition
 * to JS and slow the worker): `waitForRun` of the last run started (the
 * engine reports that one run's transition only), then the count polled on
 * `setImmediate` for the few still in flight beside it.
 */
async function drainRound(n) {
  const o = new JobOrchestrator({ loggerFactory: () => quiet });
  o.registerHandler('noop', {}, handler);
  let last = null;
  for (let i = 0; i < n; i++) last = await o.start('noop', { i });
  await settle();
  const t0 = process.hrtime.bigint();
  const w = o.startWorker({ pools: { batch: { concurrency: DRAIN_CONCURRENCY } } });
  await o.waitForRun(last.id);
  for (;;) {
    const counts = await o.countByPoolAndStatus();
    const done = counts.find((c) => c.pool === 'batch' && c.status === 'completed');
    if (done && done.count === n) break;
    const failed = counts.find((c) => c.status === 'failed' && c.count > 0);
    if (failed) throw new Error(`bench: ${failed.count} runs failed`);
    await tick();
  }
  const ns = process.hrtime.bigint() - t0;
  await w.stop();
  return Number(ns) / 1e6;
}

/** A JobRun-shaped row, built fresh per execution like the worker's. */
function runRow(i, now) {
  const id = `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`;
  const d = new Date(now);
  return {
    id,
    jobType: 'noop',
    jobVersion: 1,
    parentRunId: null,
    rootRunId: id,
    parentClosePolicy: 'terminate',
    scopeEntityType: null,
    scopeEntityId: null,
    tenantId: null,
    tags: {},
    pool: 'batch',
    priority: 0,
    concurrencyKey: null,
    dedupeKey: null,
    status: 'running',
    input: { i },
    output: null,
    error: null,
    triggerSource: 'manual',
    triggerRef: null,
    runAt: d,
    startedAt: new Date(now),
    finishedAt: null,
    claimedAt: new Date(now),
    attempts: 0,
    waitKind: null,
    resumeToken: null,
    waitDeadline: null,
    createdAt: new Date(now),
    updatedAt: new Date(now),
  };
}

/** Bare loop: build the ctx a handler receives and await the handler, N times. */
async function bareRound(n) {
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const run = runRow(i, Date.now());
    let controller;
    let logger;
    const ctx = {
      input: run.input,
      run,
      get signal() {
        return (controller ??= new AbortController()).signal;
      },
      get logger() {
        return (logger ??= quiet);
      },
      step: async (stepId, fn) => fn(),
      spawnChild: async (type, input) => ({ ...runRow(i, Date.now()), jobType: type, input }),
    };
    await handler(ctx);
  }
  const ns = process.hrtime.bigint() - t0;
  return Number(ns) / 1e6;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const rate = (ms, n = N) => Math.round((n / ms) * 1000);
const fmt = (x) => x.toLocaleString('en-US');

async function main() {
  console.log(`# reproduce: cd ${ROOT} && node bench/worker.js --n ${N} --rounds ${ROUNDS} --drain-n ${DRAIN_N} --drain-rounds ${DRAIN_ROUNDS}`);
  console.log(`# node ${process.version}, ${os.cpus().length} CPU(s) (${os.cpus()[0]?.model ?? '?'}), N=${fmt(N)}, rounds=${ROUNDS}, DRAIN_N=${fmt(DRAIN_N)}, drain rounds=${DRAIN_ROUNDS}`);
  // Warm-up (not reported).
  await jobforgeRound(Math.min(N, 2000));
  await bareRound(Math.min(N, 2000));

  const jf = [];
  const bare = [];
  for (let r = 1; r <= ROUNDS; r++) {
    const { ms: a, startMs } = await jobforgeRound(N);
    jf.push(a);
    const b = await bareRound(N);
    bare.push(b);
    console.log(
      `round ${r}: jobforge ${a.toFixed(1)} ms (${fmt(rate(a))} jobs/s; start() loop ${startMs.toFixed(0)} ms of it) | bare ${b.toFixed(1)} ms (${fmt(rate(b))} jobs/s)`,
    );
    if (global.gc) global.gc();
  }
  const mj = median(jf);
  const mb = median(bare);
  console.log(`median jobforge: ${mj.toFixed(1)} ms = ${fmt(rate(mj))} jobs/s`);
  console.log(`median bare:     ${mb.toFixed(1)} ms = ${fmt(rate(mb))} jobs/s`);
  console.log(
    `ratio jobforge/bare: throughput ${(rate(mj) / rate(mb)).toFixed(4)} (jobforge takes ${(mj / mb).toFixed(1)}x the bare loop's time)`,
  );
  await drain();
}

/** The drain of a started backlog against the bare loop at the same n, alternating. */
async function drain() {
  console.log(`# drain: ${fmt(DRAIN_N)} runs started first, then startWorker({ pools: { batch: { concurrency: ${DRAIN_CONCURRENCY} } } }); only the drain is timed`);
  await drainRound(Math.min(DRAIN_N, 2000)); // warm-up (not reported)
  const dj = [];
  const db = [];
  for (let r = 1; r <= DRAIN_ROUNDS; r++) {
    // Alternate which goes first: the second of a pair runs on a heap the first left.
    const pair = r % 2 ? [drainRound, bareRound] : [bareRound, drainRound];
    for (const f of pair) {
      if (f === bareRound) await settle(); // drainRound settles after its starts, before its clock
      (f === drainRound ? dj : db).push(await f(DRAIN_N));
    }
    const a = dj[dj.length - 1];
    const b = db[db.length - 1];
    console.log(`drain round ${r}: jobforge ${a.toFixed(1)} ms (${fmt(rate(a, DRAIN_N))} jobs/s) | bare ${b.toFixed(1)} ms (${fmt(rate(b, DRAIN_N))} jobs/s)`);
  }
  const mj = median(dj);
  const mb = median(db);
  console.log(`median drain: ${mj.toFixed(1)} ms = ${fmt(rate(mj, DRAIN_N))} jobs/s`);
  console.log(`median drain-bare: ${mb.toFixed(1)} ms = ${fmt(rate(mb, DRAIN_N))} jobs/s`);
  console.log(`ratio drain/bare: throughput ${(rate(mj, DRAIN_N) / rate(mb, DRAIN_N)).toFixed(4)} (the drain takes ${(mj / mb).toFixed(1)}x the bare loop's time)`);
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
