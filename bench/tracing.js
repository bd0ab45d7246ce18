#!/usr/bin/env node
/*
 * What OpenTelemetry tracing costs (issue 25), in one process, rounds
 * alternating the order of the three modes; the median of each:
 *
 * - `off`: `tracing: false` (the API is never loaded);
 * - `idle`: the default with `@opentelemetry/api` installed but no tracer
 *   provider registered (what every user with the API pulled in by another
 *   package pays: one check per start and per attempt);
 * - `live`: an SDK registered (`BasicTracerProvider`, its
 *   `BatchSpanProcessor` — the production configuration — and an exporter
 *   that drops the batches, so the cost measured is jobforge's and the
 *   SDK's, not a network's), runs started inside an active span: each
 *   attempt is a span, each `ctx.step` a child span.
 *
 * Work: runs of a handler doing one `ctx.step`.
 * 1. memory, `claimNext` + `tick` over N pending runs;
 * 2. memory, the worker's drain of N runs (concurrency 64);
 * 3. PostgreSQL (skipped with a message without a server at
 *    JOBFORGE_PG_URL): the worker's drain of PG_N runs (concurrency 24,
 *    10 connections).
 *
 *   node --expose-gc bench/tracing.js [--n 20000] [--pg-n 5000] [--rounds 3] [--docs]
 *
 * `--docs` rewrites the "Tracing" section of BENCHMARKS.md.
 */
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');
const ROOT = path.resolve(__dirname, '..');
const { JobOrchestrator } = require(path.join(ROOT, 'dist'));

let api;
let sdk;
let hooks;
try {
  api = require('@opentelemetry/api');
  sdk = require('@opentelemetry/sdk-trace-base');
  hooks = require('@opentelemetry/context-async-hooks');
} catch (e) {
  console.log(`bench/tracing: skipped, the OpenTelemetry dev dependencies are not installed (npm ci): ${e.message}`);
  process.exit(0);
}

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
}
const N = arg('n', 20000);
const PG_N = arg('pg-n', 5000);
const ROUNDS = arg('rounds', 3);
const PG_URL = process.env.JOBFORGE_PG_URL || 'postgres://postgres@127.0.0.1:5432/test';
const quiet = { log() {}, info() {}, warn() {}, error() {}, debug() {} };
const handler = async (ctx) => {
  await ctx.step('one', () => 1);
  return {};
};
const now = () => Number(process.hrtime.bigint()) / 1e6;
const turn = () => new Promise((r) => setImmediate(r));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (x) => Math.round(x).toLocaleString('en-US');
const gc = async () => {
  if (global.gc) global.gc();
  await turn();
};

// ── the three modes ────────────────────────────────────────────────────
let exported = 0;
const dropExporter = {
  export(spans, done) {
    exported += spans.length;
    done({ code: 0 });
  },
  shutdown: () => Promise.resolve(),
};
let provider = null;
const contextManager = new hooks.AsyncLocalStorageContextManager().enable();
api.context.setGlobalContextManager(contextManager);

async function setMode(mode) {
  if (provider !== null) {
    await provider.forceFlush();
    await provider.shutdown();
    api.trace.disable();
    provider = null;
  }
  if (mode === 'live') {
    provider = new sdk.BasicTracerProvider({
      spanProcessors: [new sdk.BatchSpanProcessor(dropExporter, { maxQueueSize: 1_000_000, maxExportBatchSize: 2048, scheduledDelayMillis: 200 })],
    });
    api.trace.setGlobalTracerProvider(provider);
  }
}

/** Starts `n` runs (not timed), inside an active span when tracing is live. */
async function startAll(o, n, mode) {
  const go = async () => {
    let last = null;
    for (let i = 0; i < n; i += 1000) {
      const batch = [];
      for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ type: 'work', input: { i: j } });
      const runs = await o.startMany(batch);
      last = runs[runs.length - 1];
    }
    return last;
  };
  if (mode !== 'live') return go();
  const tracer = api.trace.getTracer('bench');
  return tracer.startActiveSpan('enqueue', async (span) => {
    try {
      return await go();
    } finally {
      span.end();
    }
  });
}

const optionsOf = (mode) => ({ tracing: mode === 'off' ? false : undefined, loggerFactory: () => quiet });

async function claimTick(mode) {
  const o = new JobOrchestrator({ clock: 'manual', ...optionsOf(mode) });
  o.registerHandler('work', {}, handler);
  const last = await startAll(o, N, mode);
  await gc();
  const t0 = now();
  for (let i = 0; i < N; i++) {
    const run = await o.claimNext('batch');
    await o.tick(run.id);
  }
  const ms = now() - t0;
  if ((await o.findById(last.id)).status !== 'completed') throw new Error('bench: last run not completed');
  return ms;
}

async function drainUntilDone(o, n, last) {
  await o.waitForRun(last.id, { timeoutMs: 600_000 });
  for (;;) {
    const counts = await o.countByPoolAndStatus();
    const done = counts.find((c) => c.pool === 'batch' && c.status === 'completed');
    if (done && done.count === n) return;
    if (counts.some((c) => c.status === 'failed' && c.count > 0)) throw new Error('bench: runs failed');
    await turn();
  }
}

async function memoryDrain(mode) {
  const o = new JobOrchestrator(optionsOf(mode));
  o.registerHandler('work', {}, handler);
  const last = await startAll(o, N, mode);
  await gc();
  const t0 = now();
  const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
  await drainUntilDone(o, N, last);
  const ms = now() - t0;
  await w.stop();
  return ms;
}

async function pgClient() {
  let pg;
  try {
    pg = require('pg');
  } catch {
    return { why: "the 'pg' package is not installed (npm ci)" };
  }
  const c = new pg.Client({ connectionString: PG_URL, connectionTimeoutMillis: 3000 });
  try {
    await c.connect();
    return { c };
  } catch (e) {
    return { why: `no server at ${PG_URL} (${e.message})` };
  }
}

let pgc = null;
let round = 0;

async function pgDrain(mode) {
  const schema = `jf_bench_tr_${process.pid}_${round++}`;
  const o = new JobOrchestrator({ backend: 'postgres', ...optionsOf(mode), postgres: { url: PG_URL, schema, maxConnections: 10 } });
  await o.migrate();
  o.registerHandler('work', {}, handler);
  const last = await startAll(o, PG_N, mode);
  await pgc.query('CHECKPOINT');
  const t0 = now();
  const w = o.startWorker({ pools: { batch: { concurrency: 24 } } });
  await drainUntilDone(o, PG_N, last);
  const ms = now() - t0;
  await w.stop();
  await o.close();
  await pgc.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  return ms;
}

/**
 * The bound: what the SDK alone costs for what jobforge asks of it per
 * run — an attempt span under a remote parent with its attributes, a step
 * span under it, both ended — in a loop with nothing else.
 */
async function sdkBound() {
  await setMode('live');
  const tracer = api.trace.getTracer('bound');
  const parent = api.trace.setSpanContext(api.ROOT_CONTEXT, {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    traceFlags: 1,
    isRemote: true,
  });
  const loop = (n) => {
    const t0 = now();
    for (let i = 0; i < n; i++) {
      const a = tracer.startSpan('run work', { kind: 4, attributes: { 'jobforge.run.id': 'x', 'jobforge.job_type': 'work', 'jobforge.pool': 'batch', 'jobforge.attempt': 1 } }, parent);
      const ctx = api.trace.setSpan(parent, a);
      const s = tracer.startSpan('step one', { attributes: { 'jobforge.step.id': 'one' } }, ctx);
      s.setAttribute('jobforge.step.attempt', 1);
      s.end();
      a.setAttribute('jobforge.outcome', 'completed');
      a.end();
    }
    return ((now() - t0) * 1000) / n;
  };
  loop(N); // warm-up
  const us = [];
  for (let r = 0; r < ROUNDS; r++) {
    await gc();
    us.push(loop(N));
  }
  await setMode('off');
  say(`# bound, the SDK alone (the two spans a run asks for, in a loop, BatchSpanProcessor): ${median(us).toFixed(2)} µs per run`);
}

const out = [];
function say(line) {
  console.log(line);
  out.push(line);
}

const MODES = ['off', 'idle', 'live'];

async function compare(title, n, f) {
  const times = { off: [], idle: [], live: [] };
  await setMode('live');
  await f('live'); // warm-up, not reported
  for (let r = 0; r < ROUNDS; r++) {
    // Rotate which mode goes first.
    const order = MODES.slice(r % 3).concat(MODES.slice(0, r % 3));
    for (const m of order) {
      await setMode(m);
      times[m].push(await f(m));
    }
  }
  await setMode('off');
  const rate = (m) => (n / median(times[m])) * 1000;
  const cost = (m) => `${((1 - rate(m) / rate('off')) * 100).toFixed(1)} %`;
  say(`| ${title} | ${fmt(rate('off'))} | ${fmt(rate('idle'))} (${cost('idle')}) | ${fmt(rate('live'))} (${cost('live')}) |`);
}

async function main() {
  say(`# reproduce: cd ${ROOT} && node --expose-gc bench/tracing.js --n ${N} --pg-n ${PG_N} --rounds ${ROUNDS}`);
  say(`# node ${process.version}, ${os.cpus().length} CPU(s) (${os.cpus()[0]?.model ?? '?'}); medians of ${ROUNDS} rounds each, order rotating`);
  say('');
  say('| work (a handler doing one `ctx.step`) | runs/s, `tracing: false` | API, no provider (cost) | SDK live: 2 spans a run (cost) |');
  say('|---|---|---|---|');
  await compare(`memory, \`claimNext\` + \`tick\`, ${fmt(N)} runs`, N, claimTick);
  await compare(`memory, worker drain of ${fmt(N)} runs (concurrency 64)`, N, memoryDrain);
  const { c, why } = await pgClient();
  if (!c) {
    say(`| PostgreSQL | skipped: ${why} | | |`);
  } else {
    pgc = c;
    try {
      await compare(`PostgreSQL, worker drain of ${fmt(PG_N)} runs (concurrency 24, 10 connections)`, PG_N, pgDrain);
    } finally {
      await c.end();
    }
  }
  if (exported === 0) throw new Error('bench: no span was exported in live mode');
  await sdkBound();
  say('');
  say(`# spans exported in live rounds: ${fmt(exported)}`);
  writeDocs();
}

function writeDocs() {
  if (!process.argv.includes('--docs')) return;
  const file = path.join(ROOT, 'BENCHMARKS.md');
  const begin = '<!-- tracing:begin -->';
  const end = '<!-- tracing:end -->';
  const lines = [
    begin,
    '## Tracing (OpenTelemetry)',
    '',
    'What tracing costs, by `node --expose-gc bench/tracing.js --docs`: the same work with `tracing: false`, with',
    '`@opentelemetry/api` installed but no provider registered (the default for anyone who has the API), and with an SDK live',
    '(`BasicTracerProvider` + `BatchSpanProcessor`, an exporter that drops batches; runs started inside an active span, so every',
    'attempt is a span under it and its step a child span). One process, rounds rotating the order.',
    '',
    ...out.map((l) => (l.startsWith('#') ? `\`${l.slice(2)}\`` : l)),
    '',
    end,
  ];
  let doc = fs.readFileSync(file, 'utf8');
  const i = doc.indexOf(begin);
  const j = doc.indexOf(end);
  doc = i >= 0 && j > i ? doc.slice(0, i) + lines.join('\n') + doc.slice(j + end.length) : `${doc.trimEnd()}\n\n${lines.join('\n')}\n`;
  fs.writeFileSync(file, doc);
  console.log('wrote the Tracing section of BENCHMARKS.md');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
