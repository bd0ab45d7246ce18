#!/usr/bin/env node
/*
 * What the run timeline costs (issue 25: an event costs ≤ 15 % of the
 * throughput of `claimNext + tick` and of the PostgreSQL drain). The same
 * work with `timeline: true` (the default) and `timeline: false`, in one
 * process, rounds alternating which goes first; the median of each side.
 *
 * 1. memory, `claimNext` + `tick` of a no-op handler over a backlog of N
 *    pending runs (2 events a run: started, completed).
 * 2. memory, the worker's drain of N started runs (concurrency 64).
 * 3. PostgreSQL (skipped with a message without a server at
 *    JOBFORGE_PG_URL): the worker's drain of PG_N runs started by
 *    `startMany` (not timed), concurrency 24, 10 connections, one process.
 *
 *   node --expose-gc bench/timeline.js [--n 20000] [--pg-n 10000] [--rounds 3] [--docs]
 *
 * `--docs` rewrites the "Run timeline" section of BENCHMARKS.md.
 */
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');
const ROOT = path.resolve(__dirname, '..');
const { JobOrchestrator } = require(path.join(ROOT, 'dist'));

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : fallback;
}
const N = arg('n', 20000);
const PG_N = arg('pg-n', 10000);
const ROUNDS = arg('rounds', 3);
const PG_URL = process.env.JOBFORGE_PG_URL || 'postgres://postgres@127.0.0.1:5432/test';
const quiet = { log() {}, info() {}, warn() {}, error() {}, debug() {} };
const noop = async () => ({});
const now = () => Number(process.hrtime.bigint()) / 1e6;
const turn = () => new Promise((r) => setImmediate(r));
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const fmt = (x) => Math.round(x).toLocaleString('en-US');
const gc = async () => {
  if (global.gc) global.gc();
  await turn();
};

async function claimTick(timeline) {
  const o = new JobOrchestrator({ clock: 'manual', timeline, loggerFactory: () => quiet });
  o.registerHandler('noop', {}, noop);
  let last = null;
  for (let i = 0; i < N; i++) last = await o.start('noop', { i });
  await o.findById(last.id); // hands the buffered starts to the engine
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

async function memoryDrain(timeline) {
  const o = new JobOrchestrator({ timeline, loggerFactory: () => quiet });
  o.registerHandler('noop', {}, noop);
  let last = null;
  for (let i = 0; i < N; i++) last = await o.start('noop', { i });
  await o.findById(last.id);
  await gc();
  const t0 = now();
  const w = o.startWorker({ pools: { batch: { concurrency: 64 } } });
  await drainUntilDone(o, N, last);
  const ms = now() - t0;
  await w.stop();
  return ms;
}

/** A client for dropping schemas, or the reason there is none. */
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

async function pgDrain(timeline) {
  // A fresh schema per round: no earlier round's rows or events.
  const schema = `jf_bench_tl_${process.pid}_${round++}`;
  const o = new JobOrchestrator({
    backend: 'postgres',
    timeline,
    loggerFactory: () => quiet,
    postgres: { url: PG_URL, schema, maxConnections: 10 },
  });
  await o.migrate();
  o.registerHandler('noop', {}, noop);
  let last = null;
  for (let i = 0; i < PG_N; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(PG_N, i + 1000); j++) batch.push({ type: 'noop', input: { i: j } });
    const runs = await o.startMany(batch);
    last = runs[runs.length - 1];
  }
  await pgc.query('CHECKPOINT');
  const t0 = now();
  const w = o.startWorker({ pools: { batch: { concurrency: 24 } } });
  await drainUntilDone(o, PG_N, last);
  const ms = now() - t0;
  await w.stop();
  await o.close?.();
  await pgc.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  return ms;
}

/** The lines printed, for `--docs`. */
const out = [];
function say(line) {
  console.log(line);
  out.push(line);
}

async function compare(title, n, f) {
  await f(true); // warm-up, not reported
  const on = [];
  const off = [];
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 ? [false, true] : [true, false];
    for (const t of order) (t ? on : off).push(await f(t));
  }
  const a = median(on);
  const b = median(off);
  const cost = 1 - b / a; // throughput lost: 1 - (on rate / off rate)
  say(
    `| ${title} | ${fmt((n / a) * 1000)} | ${fmt((n / b) * 1000)} | ${(cost * 100).toFixed(1)} % | ≤ 15 % | ${cost <= 0.15 ? '**PASS**' : 'MISS'} |`,
  );
}

async function main() {
  say(`# reproduce: cd ${ROOT} && node --expose-gc bench/timeline.js --n ${N} --pg-n ${PG_N} --rounds ${ROUNDS}`);
  say(`# node ${process.version}, ${os.cpus().length} CPU(s) (${os.cpus()[0]?.model ?? '?'}); medians of ${ROUNDS} rounds each, alternating`);
  say('');
  say('| work | runs/s, timeline on | runs/s, off | throughput cost | target | |');
  say('|---|---|---|---|---|---|');
  await compare(`memory, \`claimNext\` + \`tick\`, ${fmt(N)} runs`, N, claimTick);
  await compare(`memory, worker drain of ${fmt(N)} runs (concurrency 64)`, N, memoryDrain);
  const { c, why } = await pgClient();
  if (!c) {
    say(`| PostgreSQL | skipped: ${why} | | | | |`);
    return writeDocs();
  }
  pgc = c;
  try {
    await compare(`PostgreSQL, worker drain of ${fmt(PG_N)} runs (concurrency 24, 10 connections)`, PG_N, pgDrain);
  } finally {
    await c.end();
  }
  writeDocs();
}

function writeDocs() {
  if (!process.argv.includes('--docs')) return;
  const file = path.join(ROOT, 'BENCHMARKS.md');
  const begin = '<!-- timeline:begin -->';
  const end = '<!-- timeline:end -->';
  const lines = [
    begin,
    '## Run timeline',
    '',
    'What recording every transition costs (issue 25: ≤ 15 % of the throughput), by `node --expose-gc bench/timeline.js --docs`:',
    'the same work with `timeline: true` (the default) and `false` in one process, rounds alternating which goes first.',
    'Two events are stored per run here (`started`, `completed`; `created` is the row). See below the table for how much runs of it',
    'vary, and for the bound (the engine alone).',
    '',
    ...out.map((l) => (l.startsWith('#') ? `\`${l.slice(2)}\`` : l)),
    '',
    end,
  ];
  let doc = fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : '';
  const i = doc.indexOf(begin);
  const j = doc.indexOf(end);
  doc = i >= 0 && j > i ? doc.slice(0, i) + lines.join('\n') + doc.slice(j + end.length) : `${doc.trimEnd()}\n\n${lines.join('\n')}\n`;
  fs.writeFileSync(file, doc);
  console.log('wrote the Run timeline section of BENCHMARKS.md');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
