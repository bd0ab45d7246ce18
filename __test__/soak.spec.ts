/**
 * Soak and shutdown under load.
 *
 * The soak runs SOAK_N (default 1,000,000) no-op runs through the worker in
 * a child process (`node --expose-gc`, dist required by absolute path) with
 * a short retention so the store stays bounded, and compares RSS (after a
 * forced gc) and the thread count after the first 100,000 runs and at the
 * end. Both samples are taken in the same state: the worker idle and every
 * run older than the retention purged. RSS at the end is held against the
 * highest RSS of the first half (the 100k sample and the traces up to
 * N/2): the allocator's high-water mark may still rise early on, a leak
 * keeps growing through the second half (10 % of ~100 MB over 500,000
 * runs is ~20 bytes per run).
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { execFile } from 'node:child_process';
import * as path from 'node:path';
import type { JobOrchestrator, JobRun, WorkerHandle, WorkerOptions } from '../dist';
import { deferred, realSleep, system, waitFor } from './helpers';

const DIST = path.resolve(__dirname, '..', 'dist');
const SOAK_N = Number(process.env.SOAK_N ?? 1_000_000);
/** Short retention: completed runs are purged this long after they finish. */
const RETENTION_MS = 250;

interface Sample {
  label: string;
  executed: number;
  rss: number;
  heapUsed: number;
  external: number;
  threads: number;
  retained: number;
  atMs: number;
}

interface SoakResult {
  n: number;
  executed: number;
  failed: number;
  samples: Sample[];
  trace: { started: number; rss: number; threads: number; atMs: number }[];
  totalMs: number;
}

const SOAK_SCRIPT = `
const fs = require('node:fs');
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const N = ${SOAK_N};
const MARK = Math.min(100000, N);
const BATCH = 10000;
const silent = { log() {}, warn() {}, error() {}, debug() {} };
const threads = () => Number(/^Threads:\\s+(\\d+)/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))[1]);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
(async () => {
  const t0 = Date.now();
  const o = new JobOrchestrator({
    retention: { completedMs: ${RETENTION_MS}, failedMs: ${RETENTION_MS} },
    loggerFactory: () => silent,
  });
  let executed = 0;
  o.registerHandler('noop', {}, async () => { executed++; });
  let failed = 0;
  o.on('run:failed', () => failed++);
  const w = o.startWorker({ pools: { batch: { concurrency: 64 } }, shutdownTimeoutMs: 1000 });
  let probes = 0;
  const sample = async (label) => {
    // Same state at every sample: idle, then one more run past the
    // retention so every earlier run is purged, then a forced gc.
    while (executed < Math.min(started, N) + probes) await sleep(2);
    await sleep(${RETENTION_MS} + 100);
    probes++;
    const probe = await o.start('noop');
    await o.waitForRun(probe.id);
    global.gc(); global.gc();
    const m = process.memoryUsage();
    const counts = await o.countByPoolAndStatus();
    return { label, executed, rss: m.rss, heapUsed: m.heapUsed, external: m.external, threads: threads(),
      retained: counts.reduce((s, c) => s + c.count, 0), atMs: Date.now() - t0 };
  };
  const samples = [];
  const trace = [];
  let started = 0;
  while (started < N) {
    const n = Math.min(BATCH, N - started);
    let last;
    for (let j = 0; j < n; j++) last = await o.start('noop');
    started += n;
    // At most one batch outstanding: wait for the last run of this one.
    await o.waitForRun(last.id);
    if (started === MARK) samples.push(await sample('after ' + MARK));
    if (started % 100000 === 0) {
      global.gc();
      trace.push({ started, rss: process.memoryUsage().rss, threads: threads(), atMs: Date.now() - t0 });
    }
  }
  samples.push(await sample('end'));
  await w.stop();
  process.stdout.write(JSON.stringify({ n: N, executed: executed - probes, failed, samples, trace, totalMs: Date.now() - t0 }) + '\\n');
})().catch((e) => { console.error(e); process.exit(1); });
`;

function runSoakChild(timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--expose-gc', '-e', SOAK_SCRIPT],
      { timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const e = err as (Error & { code?: number | string }) | null;
        resolve({ code: e ? (typeof e.code === 'number' ? e.code : null) : 0, stdout: String(stdout), stderr: String(stderr), ms: Date.now() - t0 });
      },
    );
  });
}

const mb = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MB`;

test.serial(`soak: ${SOAK_N.toLocaleString('en-US')} no-op runs through the worker — RSS and threads stay flat`, async (t) => {
  t.timeout(15 * 60_000);
  const child = await runSoakChild(14 * 60_000);
  t.is(child.code, 0, `soak child failed (code ${child.code}): ${child.stderr.slice(0, 2000)}`);
  const r = JSON.parse(child.stdout.trim().split('\n').pop()!) as SoakResult;
  const [first, end] = r.samples as [Sample, Sample];
  t.log(`runtime: ${(r.totalMs / 1000).toFixed(1)} s in the child, ${(child.ms / 1000).toFixed(1)} s wall (N = ${r.n}, SOAK_N env ${process.env.SOAK_N ?? 'unset'})`);
  t.log(`${first.label}: RSS ${mb(first.rss)}, heap ${mb(first.heapUsed)}, threads ${first.threads}, runs retained ${first.retained}`);
  t.log(`${end.label}: RSS ${mb(end.rss)}, heap ${mb(end.heapUsed)}, threads ${end.threads}, runs retained ${end.retained}`);
  t.log(`RSS end / RSS ${first.label}: ${((end.rss / first.rss - 1) * 100).toFixed(1)} %`);
  t.log(`trace (after gc, not settled): ${r.trace.map((x) => `${x.started / 1000}k ${mb(x.rss)} ${x.threads}t`).join(', ')}`);

  t.is(r.executed, r.n, 'every run executed exactly once');
  t.is(r.failed, 0);
  // Retention keeps the store bounded: only the probe run is left at each sample.
  t.true(first.retained <= 2, `runs retained at the first sample: ${first.retained}`);
  t.true(end.retained <= 2, `runs retained at the end: ${end.retained}`);
  const firstHalf = Math.max(first.rss, ...r.trace.filter((x) => x.started <= r.n / 2).map((x) => x.rss));
  t.true(end.rss <= firstHalf * 1.1, `RSS grew from ${mb(firstHalf)} (highest in the first half) to ${mb(end.rss)} (> 10 %)`);
  t.true(Math.abs(end.threads - first.threads) <= 1, `threads went from ${first.threads} to ${end.threads}`);
});

// ── shutdown under load ───────────────────────────────────────────────────

function startW(t: ExecutionContext, o: JobOrchestrator, opts: WorkerOptions): WorkerHandle {
  const w = o.startWorker({ shutdownTimeoutMs: 100, ...opts });
  t.teardown(() => w.stop());
  return w;
}

/** Every run listed by listJobRuns pages, each then read whole (a page shows a summary). */
async function allRuns(o: JobOrchestrator): Promise<JobRun[]> {
  const ids: string[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await o.listJobRuns({ limit: 500, cursor });
    ids.push(...page.items.map((r) => r.runId));
    if (page.nextCursor === null) break;
    cursor = page.nextCursor;
  }
  return Promise.all(
    ids.map(async (id) => {
      const r = await o.getRun(id);
      if (r === null) throw new Error(`listed run ${id} not found`);
      return r;
    }),
  );
}

const total = async (o: JobOrchestrator) => (await o.countByPoolAndStatus()).reduce((s, c) => s + c.count, 0);

test.serial('shutdown under load: stop() with 1,000 runs in flight leaves every run terminal or pending, none lost', async (t) => {
  t.timeout(120_000);
  const o = system();
  const gate = deferred(); // held handlers: never opened during the load phase
  const stopping = deferred(); // timer handlers: start their timer when stop() is called
  const executions = new Map<string, number>();
  const signals = new Map<string, AbortSignal>();
  let phase: 'load' | 'restart' = 'load';
  o.registerHandler('held', {}, async (ctx) => {
    executions.set(ctx.run.id, (executions.get(ctx.run.id) ?? 0) + 1);
    if (phase === 'restart') return { second: true };
    signals.set(ctx.run.id, ctx.signal);
    await gate.promise; // ignores its signal
    return { late: true };
  });
  o.registerHandler('timer', {}, async (ctx) => {
    executions.set(ctx.run.id, (executions.get(ctx.run.id) ?? 0) + 1);
    if (phase === 'restart') return { second: true };
    await stopping.promise;
    await realSleep(Math.floor(Math.random() * 100)); // ends inside the 300 ms grace
    return { timer: true };
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1000 } }, shutdownTimeoutMs: 300 });
  t.teardown(() => w.stop());
  const runs: JobRun[] = [];
  for (let i = 0; i < 1200; i++) runs.push(await o.start(i % 4 === 0 ? 'timer' : 'held', { i }));
  await waitFor(() => w.inFlight === 1000 && executions.size === 1000, '1,000 attempts in flight', 20_000);
  const inFlightIds = new Set(executions.keys());
  t.deepEqual([...inFlightIds].sort(), runs.slice(0, 1000).map((r) => r.id).sort(), 'the first 1,000 runs are in flight');
  const t0 = Date.now();
  stopping.resolve();
  await w.stop();
  const took = Date.now() - t0;
  t.is(w.inFlight, 0);
  t.false(w.running);
  t.true(took >= 250 && took < 5000, `stop took ${took} ms with a 300 ms grace`);

  const rows = await allRuns(o);
  t.is(rows.length, 1200, 'listJobRuns: every run is there');
  t.is(await total(o), 1200, 'countByPoolAndStatus: every run is counted');
  const byStatus: Record<string, number> = {};
  for (const r of rows) byStatus[r.status] = (byStatus[r.status] ?? 0) + 1;
  t.log(`after stop(): ${JSON.stringify(byStatus)} in ${took} ms`);
  // 250 timer runs in flight finish in the grace; 750 held runs go back to
  // pending; 200 runs never started stay pending.
  t.deepEqual(byStatus, { completed: 250, pending: 950 }, 'every run is terminal (completed) or pending');
  const counts = Object.fromEntries((await o.countByPoolAndStatus()).map((c) => [c.status, c.count]));
  t.deepEqual(counts, byStatus, 'countByPoolAndStatus agrees with the rows');
  const rowById = new Map(rows.map((r) => [r.id, r]));
  t.is(signals.size, 750);
  for (const [id, signal] of signals) {
    const r = rowById.get(id)!;
    t.is(r.status, 'pending', 'an interrupted held run is back to pending');
    t.is(r.attempts, 0, 'the shutdown did not use up an attempt');
    t.is(r.claimedAt, null);
    t.true(signal.aborted, 'its signal fired');
  }
  for (const r of rows) if (r.jobType === 'timer' && inFlightIds.has(r.id)) t.is(r.status, 'completed');
  t.is(executions.size, 1000, 'no run started after stop()');

  // Late results of the aborted handlers change nothing.
  gate.resolve();
  await realSleep(50);
  t.deepEqual(Object.fromEntries((await o.countByPoolAndStatus()).map((c) => [c.status, c.count])), byStatus);

  // None lost: a new worker finishes every run; interrupted ones run again
  // (at least once), the others exactly once.
  phase = 'restart';
  startW(t, o, { pools: { batch: { concurrency: 64 } } });
  const finals = await Promise.all(runs.map((r) => o.waitForRun(r.id, { timeoutMs: 30_000 })));
  t.true(finals.every((r) => r.status === 'completed'));
  t.deepEqual(await o.countByPoolAndStatus(), [{ pool: 'batch', status: 'completed', count: 1200 }]);
  const wrong = runs.filter((r) => (executions.get(r.id) ?? 0) !== (signals.has(r.id) ? 2 : 1));
  t.deepEqual(wrong.map((r) => `${r.id}:${executions.get(r.id)}`), [], 'executions per run: 2 if interrupted, else 1');
});

// Discrepancy (see report): stop() only waits for attempts JS already
// knows about. Attempts the Rust scheduler claimed just before workerStop()
// but whose tickets had not reached JS yet are missed: stop() resolves with
// inFlight 0 while those runs are 'running', and their handlers are called
// after stop() resolved.
test.serial('stop() right after a burst of starts: no run is left running and no handler is called after stop() resolves', async (t) => {
  const o = system();
  let stopped = false;
  let lateCalls = 0;
  o.registerHandler('x', {}, async () => {
    if (stopped) lateCalls++;
    return {};
  });
  const w = startW(t, o, { pools: { batch: { concurrency: 64 } } });
  for (let i = 0; i < 1000; i++) await o.start('x', { i });
  await w.stop();
  stopped = true;
  const runningAfterStop = (await o.countByPoolAndStatus()).find((c) => c.status === 'running')?.count ?? 0;
  await realSleep(100);
  t.log(`right after stop(): ${runningAfterStop} runs running; handlers called after stop(): ${lateCalls}`);
  t.is(runningAfterStop, 0, "runs 'running' after stop() resolved");
  t.is(lateCalls, 0, 'handlers called after stop() resolved');
  const rows = await allRuns(o);
  t.is(rows.length, 1000);
  t.deepEqual(rows.filter((r) => r.status !== 'completed' && r.status !== 'pending').map((r) => r.status), []);
});
