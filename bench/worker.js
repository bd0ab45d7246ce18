#!/usr/bin/env node
/*
 * End-to-end worker benchmark: N no-op async handlers, started with
 * `start()` and run to completion by `startWorker()` (default pools), against
 * a bare JS loop that builds the same `ctx`-shaped object a handler receives
 * (input, run row object, step fn, spawnChild fn, logger, signal getter) and
 * awaits the same handler N times. The two alternate for several rounds;
 * medians and the ratio jobforge/bare are printed.
 *
 *   node bench/worker.js [--n 100000] [--rounds 3]      (or env N=..., ROUNDS=...)
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

const quiet = { log() {}, warn() {}, error() {}, debug() {} };

/** The handler both sides run: a no-op async function. */
const handler = async (ctx) => {
  void ctx;
};

const tick = () => new Promise((r) => setImmediate(r));

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
const rate = (ms) => Math.round((N / ms) * 1000);
const fmt = (x) => x.toLocaleString('en-US');

async function main() {
  console.log(`# reproduce: cd ${ROOT} && node bench/worker.js --n ${N} --rounds ${ROUNDS}`);
  console.log(`# node ${process.version}, ${os.cpus().length} CPU(s) (${os.cpus()[0]?.model ?? '?'}), N=${fmt(N)}, rounds=${ROUNDS}`);
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
}

main().catch((e) => {
  console.error(e);
  process.exitCode = 1;
});
