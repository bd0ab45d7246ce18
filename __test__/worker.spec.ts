// The worker runtime: `startWorker` / `stop`, the Rust scheduler (timers, not
// polling), per-attempt and per-step time limits, cancel of running runs,
// run events and `waitForRun`. Timing assertions use generous bounds (a
// loaded 2-core machine): "within a few ms" is asserted as < 50 ms.
//
// Timing-sensitive tests are `test.serial`: AVA runs serial tests first, one
// at a time, so the concurrent tests of this file cannot skew them.
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import * as path from 'node:path';
import {
  JobInputInvalidError,
  JobOrchestrator,
  JobRunNotFoundError,
  JobRunStateError,
  JobWaitTimeoutError,
  JobWorkerStateError,
} from '../dist';
import type { JobContext, JobRun, RunEventName, WorkerHandle, WorkerOptions } from '../dist';
import { deferred, hanging, manual, realSleep, runNext, system, waitFor } from './helpers';

/** "Within a few ms", on a loaded machine. */
const FEW_MS = 50;

/** Starts a worker that is stopped when the test ends (short grace by default). */
function startW(t: ExecutionContext, o: JobOrchestrator, opts: WorkerOptions = {}): WorkerHandle {
  const w = o.startWorker({ shutdownTimeoutMs: 100, ...opts });
  t.teardown(() => w.stop());
  return w;
}

const input = <T>(ctx: JobContext<unknown>): T => ctx.input as T;

async function row(o: JobOrchestrator, id: string): Promise<JobRun> {
  const r = await o.findById(id);
  if (!r) throw new Error(`run ${id} not found`);
  return r;
}

/** Records every run event of an orchestrator, in order. */
function recordEvents(o: JobOrchestrator): { event: RunEventName; run: JobRun }[] {
  const seen: { event: RunEventName; run: JobRun }[] = [];
  for (const event of ['run:completed', 'run:failed', 'run:canceled', 'run:timed_out', 'run:retrying'] as const) {
    o.on(event, (run) => seen.push({ event, run }));
  }
  return seen;
}

const DIST = path.resolve(__dirname, '..', 'dist');

/** Runs `script` in a child `node` (CommonJS); resolves with how it ended. */
function runChild(
  script: string,
  timeoutMs: number,
): Promise<{ code: number | null; signal: string | null; killed: boolean; stdout: string; stderr: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    execFile(process.execPath, ['-e', script], { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      const e = err as (Error & { code?: number | string; signal?: string; killed?: boolean }) | null;
      resolve({
        code: e ? (typeof e.code === 'number' ? e.code : null) : 0,
        signal: e?.signal ?? null,
        killed: e?.killed ?? false,
        stdout: String(stdout),
        stderr: String(stderr),
        ms: Date.now() - t0,
      });
    });
  });
}

// ── timers, not polling (serial: timing-sensitive) ──────────────────────

test.serial('a scheduled run starts within a few ms of its runAt, never before', async (t) => {
  const o = system();
  const lateness = new Map<number, number>();
  o.registerHandler('at', {}, async (ctx) => {
    lateness.set(input<{ i: number }>(ctx).i, Date.now() - ctx.run.runAt.getTime());
    return {};
  });
  startW(t, o, { pools: { batch: { concurrency: 4 } } });
  await realSleep(30); // the scheduler is asleep with nothing due
  const base = Date.now();
  const runs: JobRun[] = [];
  for (const [i, delay] of [150, 300, 80].entries()) {
    runs.push(await o.start('at', { i }, { runAt: new Date(base + delay) }));
  }
  for (const r of runs) t.is((await o.waitForRun(r.id, { timeoutMs: 3000 })).status, 'completed');
  t.is(lateness.size, 3);
  for (const [i, late] of lateness) {
    t.true(late >= 0, `run ${i} started ${-late} ms before its runAt`);
    t.true(late < FEW_MS, `run ${i} started ${late} ms after its runAt`);
  }
});

test.serial('start() wakes an idle pool at once', async (t) => {
  const o = system();
  const delays: number[] = [];
  o.registerHandler('now', {}, async (ctx) => {
    delays.push(Date.now() - ctx.run.createdAt.getTime());
    return {};
  });
  startW(t, o, { pools: { batch: { concurrency: 2 } } });
  for (let i = 0; i < 3; i++) {
    await realSleep(60); // idle: nothing due, no timer armed
    const r = await o.start('now', {});
    await o.waitForRun(r.id, { timeoutMs: 2000 });
  }
  t.is(delays.length, 3);
  for (const d of delays) t.true(d < FEW_MS, `started ${d} ms after start()`);
});

test.serial('a retry waits out its backoff and then starts within a few ms', async (t) => {
  const o = system();
  const starts: { attempt: number; runAt: number; at: number }[] = [];
  const failedAt: number[] = [];
  o.registerHandler('flaky', { retry: { attempts: 3, backoff: 'fixed', baseMs: 120 } }, async (ctx) => {
    starts.push({ attempt: ctx.run.attempts + 1, runAt: ctx.run.runAt.getTime(), at: Date.now() });
    if (ctx.run.attempts < 2) {
      failedAt.push(Date.now());
      throw new Error(`boom ${ctx.run.attempts + 1}`);
    }
    return { ok: true };
  });
  startW(t, o, { pools: { batch: { concurrency: 2 } } });
  const r = await o.start('flaky', {});
  const done = await o.waitForRun(r.id, { timeoutMs: 3000 });
  t.is(done.status, 'completed');
  t.is(done.attempts, 3);
  t.deepEqual(done.output, { ok: true });
  t.deepEqual(
    starts.map((s) => s.attempt),
    [1, 2, 3],
  );
  for (let k = 1; k < 3; k++) {
    const s = starts[k]!;
    t.true(s.runAt - failedAt[k - 1]! >= 120, `retry ${k} runAt is only ${s.runAt - failedAt[k - 1]!} ms after the failure`);
    t.true(s.at - s.runAt >= 0, `retry ${k} started before its runAt`);
    t.true(s.at - s.runAt < FEW_MS, `retry ${k} started ${s.at - s.runAt} ms late`);
  }
});

test.serial('a lane run starts within a few ms of its predecessor finishing; a not-yet-due head holds the lane', async (t) => {
  const o = system();
  const log: { name: string; start: number; end: number }[] = [];
  o.registerHandler('lane', { concurrency: { key: '{{k}}' } }, async (ctx) => {
    const start = Date.now();
    await realSleep(60);
    log.push({ name: input<{ name: string }>(ctx).name, start, end: Date.now() });
    return {};
  });
  startW(t, o, { pools: { batch: { concurrency: 5 } } });
  const base = Date.now();
  const head = await o.start('lane', { k: 'L', name: 'head' }, { runAt: new Date(base + 150) });
  const second = await o.start('lane', { k: 'L', name: 'second' }); // due now, but behind the head
  const third = await o.start('lane', { k: 'L', name: 'third' });
  await realSleep(60);
  t.is((await row(o, second.id)).status, 'pending', 'a due run behind a not-yet-due head must wait');
  for (const r of [head, second, third]) t.is((await o.waitForRun(r.id, { timeoutMs: 3000 })).status, 'completed');
  t.deepEqual(
    log.map((l) => l.name),
    ['head', 'second', 'third'],
  );
  const headLate = log[0]!.start - (base + 150);
  t.true(headLate >= 0 && headLate < FEW_MS, `head started ${headLate} ms after its runAt`);
  for (let k = 1; k < 3; k++) {
    const gap = log[k]!.start - log[k - 1]!.end;
    t.true(gap >= 0, 'lane runs overlapped');
    t.true(gap < FEW_MS, `lane run ${k} started ${gap} ms after its predecessor finished`);
  }
});

test.serial('rescheduling a far-future run earlier re-arms the timer: it starts within a few ms of its new runAt', async (t) => {
  const o = system();
  let late: number | null = null;
  o.registerHandler('moved', {}, async (ctx) => {
    late = Date.now() - ctx.run.runAt.getTime();
    return {};
  });
  startW(t, o);
  const r = await o.start('moved', {}, {
    scope: { entityType: 'doc', entityId: 'd1' },
    runAt: new Date(Date.now() + 3_600_000),
  });
  await realSleep(50); // the scheduler sleeps on the 1 h timer
  const newRunAt = new Date(Date.now() + 120);
  t.is(await o.rescheduleForScope('doc', 'd1', newRunAt), 1);
  const done = await o.waitForRun(r.id, { timeoutMs: 3000 });
  t.is(done.status, 'completed');
  t.is(done.runAt.getTime(), newRunAt.getTime());
  t.not(late, null);
  t.true(late! >= 0 && late! < FEW_MS, `started ${late} ms after its new runAt`);
});

test.serial('an idle worker uses no CPU (process.cpuUsage over 2 s)', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => ({}));
  o.on('run:completed', () => undefined);
  const w = startW(t, o); // default pools
  const r = await o.start('x', {});
  await o.waitForRun(r.id, { timeoutMs: 2000 });
  // A run far in the future: the scheduler must sleep on a timer, not poll.
  const far = await o.start('x', {}, { runAt: new Date(Date.now() + 3_600_000) });
  await realSleep(100);
  const before = process.cpuUsage();
  await realSleep(2000);
  const used = process.cpuUsage(before);
  const ms = (used.user + used.system) / 1000;
  t.log(`CPU over 2 s idle: ${ms.toFixed(1)} ms`);
  t.true(ms < 50, `idle worker used ${ms.toFixed(1)} ms of CPU in 2 s`);
  t.true(w.running);
  t.is((await row(o, far.id)).status, 'pending');
});

test.serial('timeoutMs: a never-resolving handler times out, its signal aborts, and the run ends timed_out', async (t) => {
  const o = system();
  const signals: AbortSignal[] = [];
  const starts: number[] = [];
  o.registerHandler('hang', { timeoutMs: 80 }, (ctx) => {
    signals.push(ctx.signal);
    starts.push(Date.now());
    return new Promise(() => undefined); // never settles, ignores the signal
  });
  startW(t, o);
  const r = await o.start('hang', {});
  const done = await o.waitForRun(r.id, { timeoutMs: 3000 });
  const elapsed = Date.now() - starts[0]!;
  t.is(done.status, 'timed_out');
  t.is(done.attempts, 1);
  t.not(done.finishedAt, null);
  t.regex(done.error!.message, /timed out/i);
  t.is(done.error!.retryable, false);
  t.is(done.error!.attempt, 1);
  t.is(signals.length, 1);
  t.true(signals[0]!.aborted, 'ctx.signal must abort on timeout');
  t.true(elapsed >= 75 && elapsed < 80 + 500, `timed out after ${elapsed} ms`);
  // Another run of the pool executes (in another of its five slots: the
  // timed-out handler, still running, holds its own).
  o.registerHandler('ok', {}, async () => ({ ok: 1 }));
  const next = await o.start('ok', {});
  t.is((await o.waitForRun(next.id, { timeoutMs: 2000 })).status, 'completed');
});

// ── manual clock ────────────────────────────────────────────────────────

test('manual clock: advanceTime makes a scheduled run start, not before', async (t) => {
  const o = manual();
  const started: string[] = [];
  o.registerHandler('m', {}, async (ctx) => {
    started.push(ctx.run.id);
    return {};
  });
  startW(t, o);
  const r = await o.start('m', {}, { runAt: new Date(o.now().getTime() + 1000) });
  await realSleep(80);
  t.deepEqual(started, []);
  o.advanceTime(999);
  await realSleep(80);
  t.deepEqual(started, [], 'started before its runAt');
  o.advanceTime(1);
  const done = await o.waitForRun(r.id, { timeoutMs: 2000 });
  t.is(done.status, 'completed');
  t.deepEqual(started, [r.id]);
});

test('manual clock: retry backoff and timeoutMs follow advanceTime', async (t) => {
  const o = manual();
  let calls = 0;
  o.registerHandler('flaky', { retry: { attempts: 2, backoff: 'fixed', baseMs: 500 } }, async () => {
    calls++;
    if (calls === 1) throw new Error('first');
    return { second: true };
  });
  const h = hanging();
  o.registerHandler('hang', { timeoutMs: 1000 }, h.handler);
  startW(t, o);

  const f = await o.start('flaky', {});
  await waitFor(async () => (await row(o, f.id)).attempts === 1, 'first attempt failed');
  t.is((await row(o, f.id)).status, 'pending');
  o.advanceTime(499);
  await realSleep(80);
  t.is(calls, 1, 'retried before its backoff elapsed');
  o.advanceTime(1);
  t.is((await o.waitForRun(f.id, { timeoutMs: 2000 })).status, 'completed');
  t.is(calls, 2);

  const r = await o.start('hang', {});
  const a = await h.entered(1);
  await realSleep(50);
  o.advanceTime(999);
  await realSleep(50);
  t.is((await row(o, r.id)).status, 'running');
  t.false(a.signal.aborted);
  o.advanceTime(1);
  const done = await o.waitForRun(r.id, { timeoutMs: 2000 });
  t.is(done.status, 'timed_out');
  t.true(a.signal.aborted);
});

// ── pools and concurrency ──────────────────────────────────────────────

test('default pools: batch runs 5 at a time, interactive 20, other pools are not served', async (t) => {
  const o = system();
  const gate = deferred();
  const active: Record<string, number> = { batch: 0, interactive: 0 };
  const max: Record<string, number> = { batch: 0, interactive: 0 };
  const handler = async (ctx: JobContext<unknown>) => {
    const p = ctx.run.pool;
    active[p] = (active[p] ?? 0) + 1;
    max[p] = Math.max(max[p] ?? 0, active[p]!);
    await gate.promise;
    active[p]!--;
    return {};
  };
  o.registerHandler('b', {}, handler); // default pool: batch
  o.registerHandler('i', { pool: 'interactive' }, handler);
  o.registerHandler('x', { pool: 'other' }, handler);
  const runs: JobRun[] = [];
  for (let k = 0; k < 30; k++) runs.push(await o.start('b', { k }), await o.start('i', { k }));
  const other = await o.start('x', {});
  const w = o.startWorker();
  t.teardown(() => w.stop());
  await waitFor(() => active.batch === 5 && active.interactive === 20, 'both pools full');
  await realSleep(80);
  t.deepEqual(active, { batch: 5, interactive: 20 });
  t.is(w.inFlight, 25);
  gate.resolve();
  for (const r of runs) t.is((await o.waitForRun(r.id, { timeoutMs: 5000 })).status, 'completed');
  t.deepEqual(max, { batch: 5, interactive: 20 });
  t.is((await row(o, other.id)).status, 'pending', "a pool the worker doesn't serve is not claimed");
});

test('a pool never runs more than its concurrency, and drains a backlog', async (t) => {
  const o = system();
  let active = 0;
  let max = 0;
  o.registerHandler('w', { pool: 'p' }, async () => {
    active++;
    max = Math.max(max, active);
    await realSleep(2);
    active--;
    return {};
  });
  startW(t, o, { pools: { p: { concurrency: 3 } } });
  const runs: JobRun[] = [];
  for (let k = 0; k < 60; k++) runs.push(await o.start('w', { k }));
  for (const r of runs) t.is((await o.waitForRun(r.id, { timeoutMs: 5000 })).status, 'completed');
  t.is(max, 3);
});

test('1,000 queued runs on one lane execute strictly one at a time in start order', async (t) => {
  const o = system();
  const active: Record<string, number> = {};
  const maxPerLane: Record<string, number> = {};
  const order: Record<string, number[]> = { A: [], B: [] };
  let all = 0;
  let maxAll = 0;
  o.registerHandler('lane', { concurrency: { key: '{{k}}' } }, async (ctx) => {
    const { k, i } = input<{ k: string; i: number }>(ctx);
    active[k] = (active[k] ?? 0) + 1;
    maxPerLane[k] = Math.max(maxPerLane[k] ?? 0, active[k]!);
    maxAll = Math.max(maxAll, ++all);
    order[k]!.push(i);
    await new Promise((r) => setImmediate(r));
    active[k]!--;
    all--;
    return { i };
  });
  startW(t, o, { pools: { batch: { concurrency: 8 } } });
  const last: Record<string, JobRun> = {};
  for (let i = 0; i < 1000; i++) {
    last.A = await o.start('lane', { k: 'A', i });
    if (i < 300) last.B = await o.start('lane', { k: 'B', i });
  }
  t.is((await o.waitForRun(last.A!.id, { timeoutMs: 20_000 })).status, 'completed');
  t.is((await o.waitForRun(last.B!.id, { timeoutMs: 20_000 })).status, 'completed');
  t.is(maxPerLane.A, 1, 'lane A ran two runs at once');
  t.is(maxPerLane.B, 1, 'lane B ran two runs at once');
  t.deepEqual(order.A, Array.from({ length: 1000 }, (_, i) => i));
  t.deepEqual(order.B, Array.from({ length: 300 }, (_, i) => i));
  t.true(maxAll >= 2, 'two different lanes should run side by side in a pool of 8');
  const counts = await o.countByPoolAndStatus();
  t.deepEqual(
    counts.filter((c) => c.status !== 'completed' && c.count > 0),
    [],
  );
});

test('a lane run waiting for a retry keeps its place: the next lane run waits for it', async (t) => {
  const o = system();
  const log: string[] = [];
  o.registerHandler(
    'lane-retry',
    { concurrency: { key: '{{k}}' }, retry: { attempts: 2, backoff: 'fixed', baseMs: 100 } },
    async (ctx) => {
      const { name } = input<{ name: string }>(ctx);
      log.push(`${name}#${ctx.run.attempts + 1}`);
      if (name === 'head' && ctx.run.attempts === 0) throw new Error('retry me');
      return {};
    },
  );
  startW(t, o, { pools: { batch: { concurrency: 4 } } });
  const head = await o.start('lane-retry', { k: 'L', name: 'head' });
  const next = await o.start('lane-retry', { k: 'L', name: 'next' });
  const [h, n] = await Promise.all([head, next].map((r) => o.waitForRun(r.id, { timeoutMs: 3000 })));
  t.is(h!.status, 'completed');
  t.is(n!.status, 'completed');
  t.is(h!.attempts, 2);
  t.deepEqual(log, ['head#1', 'head#2', 'next#1'], 'the lane run behind a retrying head must wait');
  t.true(n!.startedAt!.getTime() >= h!.finishedAt!.getTime());
});

test('replay of a terminal run wakes the worker and runs it again', async (t) => {
  const o = system();
  let calls = 0;
  o.registerHandler('again', {}, async () => ({ call: ++calls }));
  startW(t, o);
  const r = await o.start('again', {});
  t.deepEqual((await o.waitForRun(r.id, { timeoutMs: 2000 })).output, { call: 1 });
  await realSleep(30);
  await o.replay(r.id);
  await waitFor(() => calls === 2, 'replayed run executed');
  const done = await o.waitForRun(r.id, { timeoutMs: 2000 });
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { call: 2 });
});

test('a backlog is executed in priority order (then start order)', async (t) => {
  const o = system();
  const order: number[] = [];
  o.registerHandler('p', {}, async (ctx) => {
    order.push(input<{ i: number }>(ctx).i);
    return {};
  });
  const priorities = [0, 5, 1, 5, 10, -3, 1, 0, 10, 7];
  const runs: JobRun[] = [];
  for (const [i, priority] of priorities.entries()) runs.push(await o.start('p', { i }, { priority }));
  startW(t, o, { pools: { batch: { concurrency: 1 } } });
  for (const r of runs) await o.waitForRun(r.id, { timeoutMs: 3000 });
  const expected = priorities
    .map((p, i) => ({ p, i }))
    .sort((a, b) => b.p - a.p || a.i - b.i)
    .map((x) => x.i);
  t.deepEqual(order, expected);
});

test('runs started behind a busy slot are taken by priority when it frees', async (t) => {
  const o = system();
  const order: string[] = [];
  const gate = deferred();
  o.registerHandler('p', {}, async (ctx) => {
    const { name } = input<{ name: string }>(ctx);
    order.push(name);
    if (name === 'blocker') await gate.promise;
    return {};
  });
  startW(t, o, { pools: { batch: { concurrency: 1 } } });
  const blocker = await o.start('p', { name: 'blocker' });
  await waitFor(() => order.length === 1, 'blocker running');
  const low = await o.start('p', { name: 'low' }, { priority: 1 });
  const high = await o.start('p', { name: 'high' }, { priority: 9 });
  const mid = await o.start('p', { name: 'mid' }, { priority: 5 });
  gate.resolve();
  for (const r of [blocker, low, high, mid]) await o.waitForRun(r.id, { timeoutMs: 3000 });
  t.deepEqual(order, ['blocker', 'high', 'mid', 'low']);
});

// ── failures, retries, steps ───────────────────────────────────────────

test('a handler that throws synchronously, rejects with a string or returns a BigInt fails cleanly', async (t) => {
  const o = system();
  o.registerHandler('sync-throw', {}, (() => {
    throw new TypeError('sync boom');
  }) as () => never);
  o.registerHandler('reject-string', {}, () => Promise.reject('plain string'));
  o.registerHandler('bigint', {}, async () => 10n);
  o.registerHandler('bigint-field', {}, async () => ({ n: 10n }));
  o.registerHandler('ok', {}, async () => ({ fine: true }));
  startW(t, o, { pools: { batch: { concurrency: 2 } } });
  const sync = await o.start('sync-throw', {});
  const str = await o.start('reject-string', {});
  const big = await o.start('bigint', {});
  const bigField = await o.start('bigint-field', {});
  const s = await o.waitForRun(sync.id, { timeoutMs: 2000 });
  t.is(s.status, 'failed');
  t.is(s.error?.message, 'sync boom');
  t.is(s.error?.attempt, 1);
  t.is(s.attempts, 1);
  const r = await o.waitForRun(str.id, { timeoutMs: 2000 });
  t.is(r.status, 'failed');
  t.is(r.error?.message, 'plain string');
  for (const b of [big, bigField]) {
    const done = await o.waitForRun(b.id, { timeoutMs: 2000 });
    t.is(done.status, 'failed');
    t.regex(done.error!.message, /handler output/);
    t.is(done.output, null);
  }
  // The worker goes on after the failures.
  const ok = await o.start('ok', {});
  t.deepEqual((await o.waitForRun(ok.id, { timeoutMs: 2000 })).output, { fine: true });
});

test('timeoutMs with retries: each attempt times out, run:retrying fires, then the run ends timed_out', async (t) => {
  const o = system();
  const events = recordEvents(o);
  const h = hanging();
  o.registerHandler('hang', { timeoutMs: 60, retry: { attempts: 2, backoff: 'fixed', baseMs: 10 } }, h.handler);
  startW(t, o);
  const r = await o.start('hang', {});
  const done = await o.waitForRun(r.id, { timeoutMs: 3000 });
  t.is(done.status, 'timed_out');
  t.is(done.attempts, 2);
  t.is(done.error?.attempt, 2);
  t.regex(done.error!.message, /timed out/i);
  t.is(h.attempts.length, 2);
  t.true(h.attempts.every((a) => a.signal.aborted), 'every timed-out attempt aborts its signal');
  // A handler resolving after its timeout changes nothing.
  for (const a of h.attempts) a.release({ late: true });
  await realSleep(30);
  t.is((await row(o, r.id)).status, 'timed_out');
  const mine = events.filter((e) => e.run.id === r.id);
  t.deepEqual(
    mine.map((e) => e.event),
    ['run:retrying', 'run:timed_out'],
  );
  t.is(mine[0]!.run.status, 'pending');
  t.is(mine[0]!.run.attempts, 1);
  t.is(mine[0]!.run.error?.retryable, true);
  t.regex(mine[0]!.run.error!.message, /timed out/i);
});

test('StepOptions.retry retries a step in place; exhausted, the run fails', async (t) => {
  const o = system();
  let flakyCalls = 0;
  let badCalls = 0;
  o.registerHandler('steps', {}, async (ctx) => {
    const v = await ctx.step(
      'flaky',
      () => {
        flakyCalls++;
        if (flakyCalls < 3) throw new Error(`flaky ${flakyCalls}`);
        return { n: flakyCalls };
      },
      { retry: { attempts: 3, backoff: 'fixed', baseMs: 15 } },
    );
    return { v };
  });
  o.registerHandler('bad-step', {}, async (ctx) => {
    await ctx.step(
      'bad',
      () => {
        badCalls++;
        throw new Error('always');
      },
      { retry: { attempts: 2, backoff: 'fixed', baseMs: 5 } },
    );
    return {};
  });
  startW(t, o);
  const a = await o.start('steps', {});
  const b = await o.start('bad-step', {});
  const da = await o.waitForRun(a.id, { timeoutMs: 3000 });
  t.is(da.status, 'completed');
  t.deepEqual(da.output, { v: { n: 3 } });
  t.is(flakyCalls, 3);
  const [sa] = await o.listSteps(a.id);
  t.is(sa?.status, 'completed');
  t.is(sa?.attempts, 3);
  const db = await o.waitForRun(b.id, { timeoutMs: 3000 });
  t.is(db.status, 'failed');
  t.is(db.error?.message, 'always');
  t.is(badCalls, 2);
  const [sb] = await o.listSteps(b.id);
  t.is(sb?.status, 'failed');
  t.is(sb?.attempts, 2);
});

test('StepOptions.timeoutMs fails a step that never resolves (and retries it when asked)', async (t) => {
  const o = system();
  let calls = 0;
  o.registerHandler('slow-step', {}, async (ctx) => {
    await ctx.step('s', () => new Promise(() => undefined), { timeoutMs: 40 });
    return {};
  });
  o.registerHandler('slow-step-retry', {}, async (ctx) => {
    await ctx.step(
      's',
      () => {
        calls++;
        return new Promise(() => undefined);
      },
      { timeoutMs: 30, retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } },
    );
    return {};
  });
  startW(t, o);
  const a = await o.start('slow-step', {});
  const b = await o.start('slow-step-retry', {});
  const da = await o.waitForRun(a.id, { timeoutMs: 3000 });
  t.is(da.status, 'failed');
  t.regex(da.error!.message, /timed out/i);
  const [sa] = await o.listSteps(a.id);
  t.is(sa?.status, 'failed');
  const db = await o.waitForRun(b.id, { timeoutMs: 3000 });
  t.is(db.status, 'failed');
  t.is(calls, 2);
  t.is((await o.listSteps(b.id))[0]?.attempts, 2);
});

// ── cancel ─────────────────────────────────────────────────────────────

test('cancel() of a running run fires its signal, ends it canceled at once and ignores its late result; its slot frees when the handler settles', async (t) => {
  const o = system();
  const events = recordEvents(o);
  const h = hanging();
  o.registerHandler('hang', {}, h.handler);
  let nextStarted = 0;
  o.registerHandler('next', {}, async () => {
    nextStarted = Date.now();
    return {};
  });
  startW(t, o, { pools: { batch: { concurrency: 1 } } });
  const r = await o.start('hang', {});
  const a = await h.entered(1);
  const queued = await o.start('next', {});
  await realSleep(30);
  t.is((await row(o, queued.id)).status, 'pending', 'the only slot is busy');
  t.false(a.signal.aborted);
  await o.cancel(r.id);
  t.true(a.signal.aborted, 'ctx.signal fires on cancel');
  const after = await row(o, r.id);
  t.is(after.status, 'canceled');
  t.not(after.finishedAt, null);
  // The handler ignores its signal and runs on: it keeps the only slot.
  await realSleep(30);
  t.is((await row(o, queued.id)).status, 'pending', 'the slot is held while the canceled handler runs');
  const releasedAt = Date.now();
  a.release({ late: true });
  // The freed slot takes the next run.
  t.is((await o.waitForRun(queued.id, { timeoutMs: 2000 })).status, 'completed');
  t.true(nextStarted - releasedAt < FEW_MS * 4, `next run started ${nextStarted - releasedAt} ms after the handler settled`);
  // Against the release itself, not 30 ms after the cancel: under load a
  // timer of libuv's cached loop clock can fire a little early by
  // Date.now() (this failed once in a full CI run).
  t.true(nextStarted >= releasedAt, 'not before the canceled handler settled');
  await realSleep(30);
  const final = await row(o, r.id);
  t.is(final.status, 'canceled');
  t.is(final.output, null);
  t.deepEqual(
    events.filter((e) => e.run.id === r.id).map((e) => e.event),
    ['run:canceled'],
  );
});

// ── events ─────────────────────────────────────────────────────────────

test('events fire once per transition with the right rows', async (t) => {
  const o = system();
  const events = recordEvents(o);
  let flakyCalls = 0;
  o.registerHandler('ok', {}, async () => ({ ok: 1 }));
  o.registerHandler('flaky', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async () => {
    if (++flakyCalls === 1) throw new Error('transient');
    return { second: true };
  });
  o.registerHandler('bad', {}, async () => {
    throw new Error('bad thing');
  });
  o.registerHandler('slow', { timeoutMs: 40 }, () => new Promise(() => undefined));
  o.registerHandler('child', {}, async () => ({}));
  const children: Record<string, JobRun> = {};
  o.registerHandler('parent', {}, async (ctx) => {
    const later = new Date(Date.now() + 3_600_000); // children stay pending
    children.terminate = await ctx.spawnChild('child', { c: 1 }, { runAt: later });
    children.cancel = await ctx.spawnChild('child', { c: 2 }, { runAt: later, closePolicy: 'cancel' });
    children.abandon = await ctx.spawnChild('child', { c: 3 }, { runAt: later, closePolicy: 'abandon' });
    throw new Error('parent failed');
  });
  startW(t, o);
  const runs = {
    ok: await o.start('ok', {}),
    flaky: await o.start('flaky', {}),
    bad: await o.start('bad', {}),
    slow: await o.start('slow', {}),
    parent: await o.start('parent', {}),
  };
  for (const r of Object.values(runs)) await o.waitForRun(r.id, { timeoutMs: 3000 });
  await realSleep(50); // nothing fires twice later
  const of = (id: string) => events.filter((e) => e.run.id === id);
  const names = (id: string) => of(id).map((e) => e.event);

  t.deepEqual(names(runs.ok.id), ['run:completed']);
  t.deepEqual(of(runs.ok.id)[0]!.run, await row(o, runs.ok.id));
  t.deepEqual(of(runs.ok.id)[0]!.run.output, { ok: 1 });

  t.deepEqual(names(runs.flaky.id), ['run:retrying', 'run:completed']);
  const retrying = of(runs.flaky.id)[0]!.run;
  t.is(retrying.status, 'pending');
  t.is(retrying.attempts, 1);
  t.is(retrying.startedAt, null);
  t.is(retrying.claimedAt, null);
  t.deepEqual({ ...retrying.error!, stack: undefined }, { message: 'transient', stack: undefined, retryable: true, attempt: 1 });
  t.deepEqual(of(runs.flaky.id)[1]!.run, await row(o, runs.flaky.id));
  t.is(of(runs.flaky.id)[1]!.run.attempts, 2);

  t.deepEqual(names(runs.bad.id), ['run:failed']);
  t.deepEqual(of(runs.bad.id)[0]!.run, await row(o, runs.bad.id));
  t.is(of(runs.bad.id)[0]!.run.error?.message, 'bad thing');

  t.deepEqual(names(runs.slow.id), ['run:timed_out']);
  t.deepEqual(of(runs.slow.id)[0]!.run, await row(o, runs.slow.id));

  t.deepEqual(names(runs.parent.id), ['run:failed']);
  t.deepEqual(names(children.terminate!.id), ['run:canceled'], 'terminate child canceled by the failure cascade');
  t.deepEqual(names(children.cancel!.id), ['run:canceled'], 'cancel child canceled by the failure cascade');
  t.deepEqual(names(children.abandon!.id), [], 'abandon child left alone');
  for (const c of [children.terminate!, children.cancel!]) {
    t.deepEqual(of(c.id)[0]!.run, await row(o, c.id));
  }
  t.is((await row(o, children.abandon!.id)).status, 'pending');
  // Exactly the transitions above, nothing else.
  t.is(events.length, 1 + 2 + 1 + 1 + 1 + 2);
});

test('cancel of a running parent emits run:canceled for it and its pending descendants, children first', async (t) => {
  const o = system();
  const events = recordEvents(o);
  let child!: JobRun;
  let grandchild!: JobRun;
  const spawned = deferred();
  o.registerHandler('leaf', {}, async () => ({}));
  o.registerHandler('mid', {}, () => new Promise(() => undefined));
  o.registerHandler('root', {}, async (ctx) => {
    child = await ctx.spawnChild('mid', {}, { runAt: new Date(Date.now() + 3_600_000) });
    spawned.resolve();
    return new Promise(() => undefined);
  });
  startW(t, o);
  const root = await o.start('root', {});
  await spawned.promise;
  grandchild = await o.start('leaf', {}, { parentRunId: child.id, runAt: new Date(Date.now() + 3_600_000) });
  await o.cancel(root.id);
  t.deepEqual(
    events.map((e) => [e.event, e.run.id]),
    [
      ['run:canceled', grandchild.id],
      ['run:canceled', child.id],
      ['run:canceled', root.id],
    ],
  );
  for (const e of events) t.deepEqual(e.run, await row(o, e.run.id));
  await realSleep(30);
  t.is(events.length, 3);
});

test('off() stops a listener; a throwing listener does not break the worker and is reported to options.logger', async (t) => {
  const errors: unknown[][] = [];
  const logger = { log() {}, warn() {}, debug() {}, error: (...a: unknown[]) => void errors.push(a) };
  const o = system({ logger });
  const seen: string[] = [];
  const listener = (r: JobRun) => seen.push(r.id);
  o.on('run:completed', listener);
  o.on('run:completed', () => {
    throw new Error('listener bug');
  });
  o.registerHandler('ok', {}, async () => ({}));
  startW(t, o);
  const a = await o.start('ok', {});
  await o.waitForRun(a.id, { timeoutMs: 2000 });
  o.off('run:completed', listener);
  const b = await o.start('ok', {});
  t.is((await o.waitForRun(b.id, { timeoutMs: 2000 })).status, 'completed');
  t.deepEqual(seen, [a.id]);
  await waitFor(() => errors.length >= 2, 'both logged errors');
  t.regex(String(errors[0][0]), /'run:completed' listener threw/);
  t.is((errors[0][1] as Error).message, 'listener bug');
});

test('an async listener that rejects is reported to options.logger; the process and the worker go on', async (t) => {
  const errors: unknown[][] = [];
  const logger = { log() {}, warn() {}, debug() {}, error: (...a: unknown[]) => void errors.push(a) };
  const o = system({ logger });
  o.on('run:completed', async () => {
    await null;
    throw new Error('async listener bug');
  });
  // A thenable whose then() throws, from a listener typed as void.
  o.on('run:completed', (() => ({
    get then() {
      throw new Error('hostile thenable');
    },
  })) as unknown as () => void);
  o.registerHandler('ok', {}, async () => ({}));
  startW(t, o);
  for (let i = 0; i < 2; i++) {
    const r = await o.start('ok', {});
    t.is((await o.waitForRun(r.id, { timeoutMs: 2000 })).status, 'completed');
  }
  await waitFor(() => errors.length >= 4, 'every rejection logged');
  const messages = errors.map((e) => `${String(e[0])} ${(e[1] as Error).message}`).sort();
  t.deepEqual(messages, [
    "jobforge: a 'run:completed' listener threw async listener bug",
    "jobforge: a 'run:completed' listener threw async listener bug",
    "jobforge: a 'run:completed' listener threw hostile thenable",
    "jobforge: a 'run:completed' listener threw hostile thenable",
  ]);
});

test('the default ctx.logger prints an Error with its stack and a BigInt or a cyclic value without throwing', async (t) => {
  const printed: unknown[][] = [];
  const saved = { log: console.log, error: console.error };
  console.log = (...a: unknown[]) => void printed.push(a);
  console.error = (...a: unknown[]) => void printed.push(a);
  try {
    const o = new JobOrchestrator(); // the default loggerFactory: consoleLogger
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = cyclic;
    o.registerHandler('logs', {}, async (ctx) => {
      ctx.logger.error(new Error('db down'));
      ctx.logger.log({ n: 10n });
      ctx.logger.log(cyclic);
      ctx.logger.log('plain text', 42);
      return { logged: true };
    });
    const r = await o.start('logs', {});
    const done = await runNext(o);
    t.is(done.status, 'completed', JSON.stringify(done.error));
    const tag = `[JobRun:${r.id}]`;
    t.deepEqual(printed.map((a) => a[0]), [tag, tag, tag, tag]);
    t.true(printed[0][1] instanceof Error && (printed[0][1] as Error).message === 'db down', 'the Error itself reaches console');
    t.deepEqual(printed[1][1], { n: 10n });
    t.is(printed[2][1], cyclic);
    t.deepEqual(printed[3].slice(1), ['plain text', 42]);
  } finally {
    console.log = saved.log;
    console.error = saved.error;
  }
});

test('a logger without error() and warn() is refused', (t) => {
  for (const bad of [null, 5, {}, { error() {} }]) {
    t.throws(() => new JobOrchestrator({ logger: bad as never }), { instanceOf: JobInputInvalidError, message: /logger/ });
  }
});

test('with retention on, a canceled run deleted at once still has ctx.run and ctx.logger in its abort listener', async (t) => {
  const lines: string[] = [];
  const o = new JobOrchestrator({
    retention: { completedMs: 60_000, failedMs: 0 },
    loggerFactory: (run) => ({ log() {}, debug() {}, error() {}, warn: (m: unknown) => void lines.push(`${run.id} ${String(m)}`) }),
  });
  const seen: string[] = [];
  o.registerHandler(
    'job',
    {},
    (ctx) =>
      new Promise<void>((resolve) => {
        ctx.signal.addEventListener('abort', () => {
          // Before, both threw JobRunNotFoundError here (an uncaught exception).
          ctx.logger.warn('canceled, cleaning up');
          seen.push(ctx.run.id);
          resolve();
        });
      }),
  );
  const w = startW(t, o);
  const run = await o.start('job', {});
  await waitFor(() => w.inFlight === 1, 'the handler to start');
  await o.cancel(run.id);
  await waitFor(() => seen.length === 1, 'the abort listener');
  t.deepEqual(seen, [run.id]);
  t.deepEqual(lines, [`${run.id} canceled, cleaning up`]);
  t.is(await o.findById(run.id), null, 'retention deleted it');
});

test('a malformed ctx.step retry policy is refused before the step runs; no step row is left', async (t) => {
  const o = manual();
  let ran = 0;
  const bad = [
    { attempts: NaN, backoff: 'fixed', baseMs: 10 },
    { attempts: 3, baseMs: 10 },
    { attempts: 2, backoff: 'quadratic', baseMs: 0 },
    { attempts: 2, backoff: 'fixed', baseMs: 0, jitter: 'sometimes' },
    { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMs: -1 },
    { attempts: 2, backoff: 'fixed', baseMs: 0, retyr: 1 },
    { attempts: 2, backoff: 'fixed', baseMs: 1.5 },
    { attempts: 2, backoff: 'fixed', baseMs: Infinity },
    { attempts: 0, backoff: 'fixed', baseMs: 0 },
    { attempts: 2, backoff: 'fixed', baseMs: 0, nonRetryableErrors: 'Fatal' },
    'twice',
  ];
  o.registerHandler('s', {}, async (ctx) => {
    const i = (ctx.input as { i: number }).i;
    return ctx.step('charge', async () => ++ran, { retry: bad[i] as never });
  });
  for (let i = 0; i < bad.length; i++) {
    const run = await o.start('s', { i });
    await o.claimNext('batch');
    await o.tick(run.id);
    const done = await o.findById(run.id);
    t.is(done?.status, 'failed', `policy ${i}`);
    t.regex(done?.error?.message ?? '', /step 'charge' retry/, `policy ${i}`);
    t.deepEqual(await o.listSteps(run.id), [], `policy ${i}: no step row`);
  }
  t.is(ran, 0, 'no step function ran');
  // null means no policy, as undefined does.
  o.registerHandler('n', {}, async (ctx) => ctx.step('once', async () => 7, { retry: null as never }));
  const ok = await o.start('n', {});
  await o.claimNext('batch');
  await o.tick(ok.id);
  t.is((await o.findById(ok.id))?.status, 'completed');
});

test('ctx.spawnChild after the attempt ended (canceled parent) throws JobRunStateError and creates no child', async (t) => {
  const o = system();
  const gate = deferred();
  let spawnError: unknown = null;
  o.registerHandler('parent', {}, async (ctx) => {
    await gate.promise; // does not watch ctx.signal
    try {
      await ctx.spawnChild('child', {});
    } catch (e) {
      spawnError = e;
    }
  });
  o.registerHandler('child', {}, async () => ({}));
  const w = startW(t, o);
  const parent = await o.start('parent', {});
  await waitFor(() => w.inFlight === 1, 'the parent to start');
  await o.cancel(parent.id);
  gate.resolve();
  await waitFor(() => spawnError !== null, 'the late spawnChild');
  t.true(spawnError instanceof JobRunStateError, String(spawnError));
  t.is((spawnError as JobRunStateError).status, 'canceled');
  t.deepEqual((await o.getRunTree(parent.id))?.children, []);
  t.deepEqual(
    (await o.countByPoolAndStatus()).map((c) => [c.status, c.count]),
    [['canceled', 1]],
  );
});

// ── waitForRun ─────────────────────────────────────────────────────────

// Serial: it times an answer in ms, which the file's concurrent tests (busy
// loops among them) would delay.
test.serial('waitForRun resolves with the terminal row; at once when already terminal', async (t) => {
  const o = system();
  const gate = deferred();
  o.registerHandler('g', {}, async () => {
    await gate.promise;
    return { v: 42 };
  });
  // Already terminal, no worker: canceled while pending.
  const c = await o.start('g', {});
  await o.cancel(c.id);
  const t0 = Date.now();
  const cRow = await o.waitForRun(c.id, { timeoutMs: 5 });
  t.true(Date.now() - t0 < FEW_MS);
  t.deepEqual(cRow, await row(o, c.id));
  t.is(cRow.status, 'canceled');

  startW(t, o);
  const r = await o.start('g', {});
  const w1 = o.waitForRun(r.id);
  const w2 = o.waitForRun(r.id, { timeoutMs: 3000 });
  await realSleep(30);
  gate.resolve();
  const [a, b] = await Promise.all([w1, w2]);
  t.is(a.status, 'completed');
  t.deepEqual(a.output, { v: 42 });
  t.deepEqual(a, b);
  t.deepEqual(a, await row(o, r.id));
  // And again, now that it is terminal.
  t.deepEqual(await o.waitForRun(r.id), a);
});

test('waitForRun: unknown run → JobRunNotFoundError; timeout → JobWaitTimeoutError', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => ({}));
  const missing = randomUUID();
  const e1 = await t.throwsAsync(o.waitForRun(missing), { instanceOf: JobRunNotFoundError });
  t.is(e1?.runId, missing);
  await t.throwsAsync(o.waitForRun('not-a-uuid', { timeoutMs: 100 }), { instanceOf: JobRunNotFoundError });
  const r = await o.start('x', {}); // no worker: stays pending
  const t0 = Date.now();
  const e2 = await t.throwsAsync(o.waitForRun(r.id, { timeoutMs: 60 }), { instanceOf: JobWaitTimeoutError });
  const waited = Date.now() - t0;
  t.is(e2?.runId, r.id);
  t.is(e2?.timeoutMs, 60);
  t.is(e2?.code, 'JOB_WAIT_TIMEOUT');
  t.true(waited >= 55 && waited < 1000, `gave up after ${waited} ms`);
  t.is((await row(o, r.id)).status, 'pending');
});

// ── worker state and options ───────────────────────────────────────────

test('a second startWorker while one runs → JobWorkerStateError; after stop() a new one may start', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => ({ ok: 1 }));
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  t.teardown(() => w.stop());
  const err = t.throws(() => o.startWorker(), { instanceOf: JobWorkerStateError });
  t.is(err?.code, 'JOB_WORKER_STATE');
  t.throws(() => o.startWorker({ pools: { other: { concurrency: 3 } } }), { instanceOf: JobWorkerStateError });
  // The first worker is unaffected.
  t.true(w.running);
  const a = await o.start('x', {});
  t.is((await o.waitForRun(a.id, { timeoutMs: 2000 })).status, 'completed');
  await w.stop();
  t.false(w.running);
  t.is(w.inFlight, 0);
  const w2 = startW(t, o, { pools: { batch: { concurrency: 1 } } });
  t.true(w2.running);
  const b = await o.start('x', {});
  t.is((await o.waitForRun(b.id, { timeoutMs: 2000 })).status, 'completed');
});

test('bad pool options → JobInputInvalidError, and no worker is left running', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => ({}));
  const bad: unknown[] = [
    { pools: {} },
    { pools: { batch: { concurrency: 0 } } },
    { pools: { batch: { concurrency: -1 } } },
    { pools: { batch: { concurrency: 1.5 } } },
    { pools: { batch: { concurrency: Number.NaN } } },
    { pools: { batch: { concurrency: Number.POSITIVE_INFINITY } } },
    { pools: { batch: { concurrency: '2' } } },
    { pools: { batch: {} } },
    { pools: { batch: null } },
    { pools: { batch: { concurrency: 2 }, interactive: { concurrency: 0 } } },
    { pools: 5 },
    { pools: 'batch' },
    { shutdownTimeoutMs: -1 },
    { shutdownTimeoutMs: Number.NaN },
    { shutdownTimeoutMs: '100' },
  ];
  for (const opts of bad) {
    t.throws(() => o.startWorker(opts as WorkerOptions), { instanceOf: JobInputInvalidError }, JSON.stringify(opts));
  }
  // Nothing was started by the rejected calls: a run stays pending, and a
  // valid worker can still start.
  const r = await o.start('x', {});
  await realSleep(50);
  t.is((await row(o, r.id)).status, 'pending');
  startW(t, o, { pools: { batch: { concurrency: 1 } } });
  t.is((await o.waitForRun(r.id, { timeoutMs: 2000 })).status, 'completed');
});

// ── stop() ─────────────────────────────────────────────────────────────

test('stop() lets in-flight handlers finish within shutdownTimeoutMs and stops claiming', async (t) => {
  const o = system();
  const signals: AbortSignal[] = [];
  // A gate, not a sleep: on a loaded machine a 100 ms handler could finish
  // before the scheduler thread delivers the second claimed attempt.
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  o.registerHandler('slow', {}, async (ctx) => {
    signals.push(ctx.signal);
    await gate;
    return { done: true };
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } }, shutdownTimeoutMs: 3000 });
  t.teardown(() => w.stop());
  const a = await o.start('slow', {});
  const b = await o.start('slow', {});
  const queued = await o.start('slow', {});
  await waitFor(() => signals.length === 2, 'two attempts in flight');
  t.is(w.inFlight, 2);
  const t0 = Date.now();
  setTimeout(release, 100);
  await w.stop();
  const took = Date.now() - t0;
  t.false(w.running);
  t.is(w.inFlight, 0);
  t.true(took < 1500, `stop waited ${took} ms for 100 ms handlers`);
  for (const r of [a, b]) {
    const done = await row(o, r.id);
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { done: true });
  }
  t.false(signals.some((s) => s.aborted), 'a handler finishing within the grace period is not aborted');
  await w.stop(); // idempotent
  await realSleep(50);
  t.is((await row(o, queued.id)).status, 'pending', 'a stopped worker claims nothing');
  t.is(signals.length, 2);
});

test('shutdown with in-flight runs leaves every run terminal or pending (none lost, none running)', async (t) => {
  const o = system();
  const hangingSignals = new Map<string, AbortSignal>();
  const quickDone: string[] = [];
  const releases: ((v: unknown) => void)[] = [];
  let mode: 'first' | 'second' = 'first';
  o.registerHandler('mixed', { concurrency: undefined }, async (ctx) => {
    const { kind } = input<{ kind: string }>(ctx);
    if (mode === 'second') return { second: true };
    if (kind === 'quick') {
      await realSleep(20);
      quickDone.push(ctx.run.id);
      return { quick: true };
    }
    hangingSignals.set(ctx.run.id, ctx.signal);
    return new Promise((resolve) => releases.push(resolve)); // ignores the signal
  });
  // A lane too: its head hangs, the rest of the lane waits behind it.
  o.registerHandler('laned', { concurrency: { key: '{{k}}' } }, async (ctx) => {
    if (mode === 'second') return { second: true };
    hangingSignals.set(ctx.run.id, ctx.signal);
    return new Promise((resolve) => releases.push(resolve));
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 4 } }, shutdownTimeoutMs: 150 });
  t.teardown(() => w.stop());
  const runs: JobRun[] = [];
  runs.push(await o.start('mixed', { kind: 'hang' }));
  runs.push(await o.start('mixed', { kind: 'hang' }));
  runs.push(await o.start('laned', { k: 'L' }));
  runs.push(await o.start('laned', { k: 'L' }));
  runs.push(await o.start('mixed', { kind: 'quick' }));
  for (let i = 0; i < 5; i++) runs.push(await o.start('mixed', { kind: 'quick' }));
  await waitFor(() => hangingSignals.size === 3, 'three hanging attempts in flight');
  const t0 = Date.now();
  await w.stop();
  const took = Date.now() - t0;
  t.true(took >= 140 && took < 2000, `stop took ${took} ms with a 150 ms grace`);
  t.is(w.inFlight, 0);
  for (const [id, s] of hangingSignals) t.true(s.aborted, `run ${id}: signal aborted at shutdown`);

  const rows = await Promise.all(runs.map((r) => row(o, r.id)));
  t.deepEqual(
    rows.filter((r) => r.status !== 'completed' && r.status !== 'pending').map((r) => r.status),
    [],
    'every run is completed or pending',
  );
  for (const id of hangingSignals.keys()) {
    const r = rows.find((x) => x.id === id)!;
    t.is(r.status, 'pending', 'an interrupted run goes back to pending');
    t.is(r.attempts, 0, 'a shutdown does not use up an attempt');
    t.is(r.startedAt, null);
    t.is(r.claimedAt, null);
  }
  for (const id of quickDone) t.is(rows.find((x) => x.id === id)!.status, 'completed');

  // Late results of aborted handlers are ignored.
  for (const release of releases) release({ late: true });
  await realSleep(30);
  for (const id of hangingSignals.keys()) t.is((await row(o, id)).status, 'pending');

  // Nothing lost: a new worker finishes every run, the lane still in order.
  mode = 'second';
  startW(t, o, { pools: { batch: { concurrency: 4 } } });
  const finals = await Promise.all(runs.map((r) => o.waitForRun(r.id, { timeoutMs: 3000 })));
  t.true(finals.every((r) => r.status === 'completed'));
  const [l1, l2] = [finals[2]!, finals[3]!];
  t.true(l1.finishedAt!.getTime() <= l2.startedAt!.getTime(), 'the lane head runs first after the restart');
});

test(
  'a worker started while the previous one is still draining keeps its own concurrency accounting',
  // Regression: attempts of a draining worker were once counted against
  // the new worker's slots. A second worker is now refused until the first
  // has stopped (JobWorkerStateError); the test accepts either outcome.
  async (t) => {
    const o = system();
    let active = 0;
    let max = 0;
    const gate = deferred();
    o.registerHandler('x', {}, async (ctx) => {
      if (input<{ i: number }>(ctx).i === 0) {
        await gate.promise;
        return {};
      }
      active++;
      max = Math.max(max, active);
      await realSleep(10);
      active--;
      return {};
    });
    const a = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 5000 });
    t.teardown(() => a.stop());
    const r0 = await o.start('x', { i: 0 });
    await waitFor(() => a.inFlight === 1, 'first attempt in flight');
    const draining = a.stop();
    let b: WorkerHandle;
    try {
      b = startW(t, o, { pools: { batch: { concurrency: 1 } } });
    } catch (e) {
      // Refusing a new worker while one drains would be fine too.
      t.true(e instanceof JobWorkerStateError);
      gate.resolve();
      await draining;
      return;
    }
    // Runs queued while the old worker drains, and runs started afterwards.
    const before: JobRun[] = [];
    for (let i = 1; i <= 5; i++) before.push(await o.start('x', { i }));
    await realSleep(5);
    gate.resolve();
    await draining;
    t.is((await row(o, r0.id)).status, 'completed');
    const settle = (runs: JobRun[]) =>
      Promise.all(runs.map((r) => o.waitForRun(r.id, { timeoutMs: 1000 }).then((x) => x.status, () => 'stuck')));
    t.deepEqual(await settle(before), Array(5).fill('completed'), 'runs queued during the drain');
    const after: JobRun[] = [];
    for (let i = 6; i <= 10; i++) after.push(await o.start('x', { i }));
    t.deepEqual(await settle(after), Array(5).fill('completed'), 'the new worker stalled after the old one drained');
    t.true(max <= 1, `a concurrency-1 pool ran ${max} attempts at once`);
    t.true(b.running);
  },
);

// ── time limits above setTimeout's 32-bit range ─────────────────────────
// Node's setTimeout turns any delay above 2^31-1 ms (~24.8 days) into 1 ms
// (TimeoutOverflowWarning). Each of these limits is accepted, so it must be
// honoured, or else be rejected up front as invalid input.

const OVER_INT32_MS = 3_000_000_000; // ~35 days

test('a per-attempt timeoutMs above 2^31-1 ms is honoured (or rejected), not turned into 1 ms', async (t) => {
  const o = system();
  try {
    o.registerHandler('long', { timeoutMs: OVER_INT32_MS }, async () => {
      await realSleep(50);
      return { ok: true };
    });
  } catch (e) {
    t.true(e instanceof JobInputInvalidError);
    return;
  }
  startW(t, o);
  const r = await o.start('long', {});
  const done = await o.waitForRun(r.id, { timeoutMs: 3000 });
  t.is(done.status, 'completed', `a 50 ms handler with a 35-day timeout ended ${done.status}: ${done.error?.message}`);
});

test('StepOptions.timeoutMs and step retry backoff above 2^31-1 ms are honoured (or rejected)', async (t) => {
  const o = system();
  let retryCalls = 0;
  o.registerHandler('long-step', {}, async (ctx) => ctx.step('s', async () => (await realSleep(50), 1), { timeoutMs: OVER_INT32_MS }));
  o.registerHandler('long-backoff', {}, async (ctx) =>
    ctx.step(
      's',
      () => {
        retryCalls++;
        throw new Error('fails');
      },
      { retry: { attempts: 2, backoff: 'fixed', baseMs: OVER_INT32_MS } },
    ),
  );
  startW(t, o);
  const a = await o.start('long-step', {});
  const da = await o.waitForRun(a.id, { timeoutMs: 3000 });
  const rejected = (r: JobRun) => r.status === 'failed' && /invalid input/.test(r.error?.message ?? '');
  t.true(da.status === 'completed' || rejected(da), `a 50 ms step with a 35-day timeout: ${da.status} ${da.error?.message}`);
  const b = await o.start('long-backoff', {});
  await realSleep(200);
  const db = await row(o, b.id);
  t.true(
    (db.status === 'running' && retryCalls === 1) || rejected(db),
    `a step with a 35-day backoff was retried ${retryCalls - 1} time(s) within 200 ms (run ${db.status})`,
  );
});

test('shutdownTimeoutMs: Infinity or above 2^31-1 ms waits for in-flight handlers (or is rejected)', async (t) => {
  for (const shutdownTimeoutMs of [Number.POSITIVE_INFINITY, OVER_INT32_MS]) {
    const o = system();
    const started = deferred();
    o.registerHandler('slow', {}, async () => {
      started.resolve();
      await realSleep(150);
      return { finished: true };
    });
    let w: WorkerHandle;
    try {
      w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs });
    } catch (e) {
      t.true(e instanceof JobInputInvalidError);
      continue;
    }
    const r = await o.start('slow', {});
    await started.promise;
    await w.stop();
    const after = await row(o, r.id);
    t.is(after.status, 'completed', `shutdownTimeoutMs ${shutdownTimeoutMs}: in-flight run ended ${after.status}`);
  }
});

test('waitForRun({ timeoutMs: Infinity }) waits (or is rejected), not a 1 ms timeout', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => {
    await realSleep(100);
    return {};
  });
  startW(t, o);
  const r = await o.start('x', {});
  let done: JobRun;
  try {
    done = await o.waitForRun(r.id, { timeoutMs: Number.POSITIVE_INFINITY });
  } catch (e) {
    t.true(e instanceof JobInputInvalidError, `rejected with ${(e as Error).name}`);
    return;
  }
  t.is(done.status, 'completed');
});

// ── process exit ───────────────────────────────────────────────────────

const childScript = (stop: boolean) => `
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const quiet = { log() {}, warn() {}, error() {}, debug() {} };
(async () => {
  const o = new JobOrchestrator({ loggerFactory: () => quiet });
  let completed = 0;
  o.on('run:completed', () => completed++);
  o.registerHandler('work', { retry: { attempts: 2, backoff: 'fixed', baseMs: 5 } }, async (ctx) => {
    await new Promise((r) => setTimeout(r, 2));
    if (ctx.input.i % 7 === 0 && ctx.run.attempts === 0) throw new Error('transient');
    return { i: ctx.input.i };
  });
  o.registerHandler('hang', { timeoutMs: 60000 }, () => new Promise(() => {}));
  const w = o.startWorker({ pools: { batch: { concurrency: 4 } }, shutdownTimeoutMs: 100 });
  const runs = [];
  for (let i = 0; i < 50; i++) runs.push(await o.start('work', { i }));
  for (const r of runs) await o.waitForRun(r.id, { timeoutMs: 5000 });
  const hung = await o.start('hang', {});
  await o.start('work', { i: 1 }, { runAt: new Date(Date.now() + 3600000) });
  await new Promise((r) => setTimeout(r, 50));
  ${stop ? 'await w.stop();' : ''}
  const status = (await o.findById(hung.id)).status;
  console.log('DONE ' + JSON.stringify({ completed, hung: status, running: w.running }));
})().catch((e) => { console.error(e); process.exitCode = 3; });
`;

test('after stop() the Node process exits on its own', async (t) => {
  const res = await runChild(childScript(true), 10_000);
  t.is(res.stderr, '');
  t.is(res.signal, null, `child was killed after ${res.ms} ms (kept alive after stop())`);
  t.is(res.code, 0);
  t.regex(res.stdout, /DONE /);
  const summary = JSON.parse(res.stdout.split('DONE ')[1]!) as { completed: number; hung: string; running: boolean };
  t.deepEqual(summary, { completed: 50, hung: 'pending', running: false });
  t.true(res.ms < 5000, `child took ${res.ms} ms to exit`);
});

test('control: without stop() a running worker keeps the process alive', async (t) => {
  const res = await runChild(childScript(false), 2000);
  t.regex(res.stdout, /DONE /);
  t.true(res.killed, 'the child exited although its worker was still running');
});

test('a startWorker the engine refuses does not keep the process alive', async (t) => {
  const script = `
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const o = new JobOrchestrator();
o.registerHandler('t', {}, async () => ({}));
try { o.startWorker({ pools: { 'p\\nq': { concurrency: 1 } } }); } catch (e) { console.log('REFUSED ' + e.code); }
`;
  const res = await runChild(script, 5000);
  t.regex(res.stdout, /REFUSED JOB_INPUT_INVALID/);
  t.is(res.signal, null, `child was killed after ${res.ms} ms (kept alive by the refused worker)`);
  t.is(res.code, 0);
});

// ── the event loop keeps turning ───────────────────────────────────────

// Handlers that settle without I/O chain outcome reports through
// microtasks; the worker must still let timers, I/O and signal handlers run.
test('a job that starts its own successor does not starve the event loop: a timer fires and stops the worker', async (t) => {
  const script = `
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const o = new JobOrchestrator();
let runs = 0;
o.registerHandler('again', {}, async () => { runs++; await o.start('again', {}); });
const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
const t0 = Date.now();
setTimeout(async () => {
  const late = Date.now() - t0;
  await w.stop();
  console.log('DONE ' + JSON.stringify({ late, runs }));
}, 20);
void o.start('again', {});
`;
  const res = await runChild(script, 10_000);
  t.false(res.killed, 'the 20 ms timer never fired (killed after 10 s)');
  const done = JSON.parse(res.stdout.split('DONE ')[1] ?? 'null') as { late: number; runs: number } | null;
  t.truthy(done, res.stderr);
  t.true(done!.late < 1000, `the timer fired ${done!.late} ms after it was set (20 ms asked)`);
  t.true(done!.runs > 1, 'the chain ran');
  t.log(`timer after ${done!.late} ms, ${done!.runs} runs by then`);
});

test('a backlog of quick runs drains in slices: a timer fires long before the backlog is done', async (t) => {
  const script = `
const { JobOrchestrator } = require(${JSON.stringify(DIST)});
const o = new JobOrchestrator();
o.registerHandler('quick', {}, async () => ({}));
(async () => {
  const n = 100000;
  for (let i = 0; i < n; i++) await o.start('quick', { i });
  let done = 0;
  o.on('run:completed', () => { done++; });
  const w = o.startWorker({ pools: { batch: { concurrency: 20 } } });
  const t0 = Date.now();
  let gaps = 0, last = t0;
  const beat = setInterval(() => { const now = Date.now(); gaps = Math.max(gaps, now - last); last = now; }, 1);
  await new Promise((r) => setTimeout(r, 5));
  const atTimer = done;
  const late = Date.now() - t0;
  while (done < n) await new Promise((r) => setTimeout(r, 5));
  clearInterval(beat);
  await w.stop();
  console.log('DONE ' + JSON.stringify({ atTimer, late, total: Date.now() - t0, gaps, n }));
})();
`;
  const res = await runChild(script, 60_000);
  const done = JSON.parse(res.stdout.split('DONE ')[1] ?? 'null') as { atTimer: number; late: number; total: number; gaps: number; n: number } | null;
  t.truthy(done, res.stderr || `no report (${res.ms} ms)`);
  t.true(done!.atTimer < done!.n, `the 5 ms timer fired only after all ${done!.n} runs were done`);
  // Slices are ~5 ms; allow for a slow, shared machine.
  t.true(done!.gaps < 250, `the event loop stalled for ${done!.gaps} ms`);
  t.log(`timer after ${done!.late} ms with ${done!.atTimer} runs done; drained in ${done!.total} ms; longest stall ${done!.gaps} ms`);
});

// ── buffered plain starts ──────────────────────────────────────────────

test('plain starts answered in JS: every read sees them at once, in start order, with the rows start returned', async (t) => {
  const o = system();
  o.registerHandler('plain', {}, async () => undefined);
  const rows: JobRun[] = [];
  // More than one hand-over batch (256), and no turn of the event loop.
  for (let i = 0; i < 600; i++) rows.push(await o.start('plain', { i, s: `v${i}` }));
  t.is(new Set(rows.map((r) => r.id)).size, 600);
  const stored = await o.findById(rows[599].id);
  t.deepEqual(stored, rows[599]);
  const counts = await o.countByPoolAndStatus();
  t.is(counts.find((c) => c.pool === 'batch' && c.status === 'pending')?.count, 600);
  for (let i = 0; i < 600; i++) {
    const claimed = await o.claimNext('batch');
    t.is(claimed?.id, rows[i].id);
  }
});

test('ctx.run of a worker ticket is read on first use and shows the running attempt', async (t) => {
  const o = system();
  const seen = deferred<JobRun>();
  o.registerHandler('reads-run', {}, async (ctx) => {
    seen.resolve(ctx.run);
  });
  const w = startW(t, o);
  const run = await o.start('reads-run', { a: 1 });
  const inside = await seen.promise;
  t.is(inside.id, run.id);
  t.is(inside.status, 'running');
  t.is(inside.attempts, 0);
  t.deepEqual(inside.input, { a: 1 });
  t.truthy(inside.claimedAt);
  await o.waitForRun(run.id, { timeoutMs: 5000 });
  await w.stop();
});

test('attempts that end in the same turn are recorded in one report, each with its own outcome', async (t) => {
  const o = system();
  const gate = deferred();
  let running = 0;
  const after = async <T>(f: () => T): Promise<T> => {
    running++;
    await gate.promise;
    return f();
  };
  o.registerHandler('value', {}, (ctx) => after(() => ({ v: input<{ i: number }>(ctx).i })));
  o.registerHandler('nothing', {}, () => after(() => undefined));
  o.registerHandler('throws', {}, () =>
    after(() => {
      throw new RangeError('no');
    }),
  );
  o.registerHandler('bigint', {}, () => after(() => 1n));
  o.registerHandler('retried', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, (ctx) =>
    after(() => {
      if (ctx.run.attempts === 0) throw new Error('first attempt fails');
      return { second: true };
    }),
  );
  // Count what each native report carries (one line per attempt).
  const engine = (o as unknown as { store: { native: { workerReport(report: string, starts: string | null): string } } }).store.native;
  const report = engine.workerReport.bind(engine);
  const sizes: number[] = [];
  engine.workerReport = (text, starts) => {
    sizes.push(text.split('\n').filter((l) => l.length > 0).length);
    return report(text, starts);
  };
  startW(t, o, { pools: { batch: { concurrency: 8 } } });
  const runs = [
    await o.start('value', { i: 7 }),
    await o.start('nothing', {}),
    await o.start('throws', {}),
    await o.start('bigint', {}),
    await o.start('retried', {}),
    await o.start('value', { i: 8 }),
  ];
  await waitFor(() => running === runs.length, 'every handler running');
  gate.resolve();
  const done = await Promise.all(runs.map((r) => o.waitForRun(r.id, { timeoutMs: 2000 })));
  // The six ended in one turn: one report recorded them all.
  t.is(sizes[0], runs.length);
  t.deepEqual(done[0].output, { v: 7 });
  t.is(done[0].status, 'completed');
  t.is(done[1].status, 'completed');
  t.deepEqual(done[1].output, {});
  t.is(done[2].status, 'failed');
  t.is(done[2].error?.message, 'no');
  t.is(done[3].status, 'failed');
  t.regex(done[3].error!.message, /handler output/);
  t.is(done[4].status, 'completed');
  t.is(done[4].attempts, 2);
  t.deepEqual(done[4].output, { second: true });
  t.deepEqual(done[5].output, { v: 8 });
  t.is(done.filter((r) => r.attempts === 1).length, 5);
});
