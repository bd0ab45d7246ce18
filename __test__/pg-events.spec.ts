// Run events across processes on PostgreSQL (issue 21): an orchestrator
// that did not execute a run hears its transitions (`run:completed`,
// `run:failed`, `run:canceled`, `run:timed_out`, `run:retrying`) through
// LISTEN/NOTIFY; the one that executed it hears each exactly once (its own
// event, not the notification's echo); nobody listening means no LISTEN
// connection; `close()` stops listening; and a process that only listens
// exits once it closes its orchestrator.
//
// Postgres only (`postgresOnly`): the memory backend lives in one process.
// Two orchestrators on one schema are two processes as far as the engine
// is concerned (each has its own store, pool and listener); the last test
// uses a real child process.
import type { ExecutionContext } from 'ava';
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { JobOrchestrator } from '../dist';
import type { JobOrchestratorOptions, JobRun, RunEventName } from '../dist';
import { PG_URL, postgresOnly } from './backends';
import type { Make } from './backends';
import { silentLogger } from './helpers';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const EVENTS: RunEventName[] = ['run:completed', 'run:failed', 'run:canceled', 'run:timed_out', 'run:retrying'];

type Admin = { query<R = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<{ rows: R[] }> };

/** A `pg` client of the test's own (ended at teardown), to look at `pg_stat_activity`. */
async function adminClient(t: ExecutionContext): Promise<Admin> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { Client } = require('pg') as typeof import('pg');
  const admin = new Client({ connectionString: PG_URL });
  await admin.connect();
  t.teardown(() => admin.end());
  return admin as unknown as Admin;
}

/** Sessions listening on the schema's run-event channel (their last statement is its LISTEN). */
async function eventListeners(admin: Admin, schema: string): Promise<number> {
  const r = await admin.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE query = $1`,
    [`LISTEN "jobforge:events:${schema}"`],
  );
  return r.rows[0]!.n;
}

/**
 * Gives a listener time to open (its LISTEN runs on a thread of its own);
 * does not fail, so the event assertions after it say what is missing.
 */
async function listening(admin: Admin, schema: string, n: number): Promise<void> {
  await until(`${n} listener(s)`, async () => (await eventListeners(admin, schema)) >= n, 3000).catch(() => undefined);
}

async function until(what: string, f: () => Promise<boolean> | boolean, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await f())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(20);
  }
}

/** Orchestrators on one fresh schema (closed at teardown) and the schema's name. */
function onOneSchema(t: ExecutionContext, make: Make, opts: JobOrchestratorOptions = {}) {
  const full = make.options({ loggerFactory: () => silentLogger, logger: silentLogger, ...opts });
  const schema = full.postgres!.schema!;
  const made: JobOrchestrator[] = [];
  t.teardown(async () => {
    for (const o of made) await o.close();
  });
  const orchestrator = (extra: JobOrchestratorOptions = {}) => {
    const o = new JobOrchestrator({ ...full, ...extra });
    made.push(o);
    return o;
  };
  return { orchestrator, schema, options: full };
}

/** Records every run event an orchestrator emits, as `<event> <run id> <attempts>`. */
function record(o: JobOrchestrator): { seen: string[]; of: (id: string) => string[] } {
  const seen: string[] = [];
  for (const e of EVENTS) o.on(e, (r: JobRun) => void seen.push(`${e} ${r.id} ${r.attempts} ${r.status}`));
  return { seen, of: (id) => seen.filter((s) => s.split(' ')[1] === id) };
}

/** Handlers of every outcome: ok, bad (fails), flaky (fails once, retried after 300 ms), slow (times out), hang (waits for its signal). */
function registerOutcomes(o: JobOrchestrator): void {
  o.registerHandler('ev.ok', { pool: 'ev' }, async () => ({ ok: true }));
  o.registerHandler('ev.bad', { pool: 'ev' }, async () => {
    throw new Error('bad');
  });
  o.registerHandler('ev.flaky', { pool: 'ev', retry: { attempts: 2, backoff: 'fixed', baseMs: 300 } }, async (ctx) => {
    if (ctx.run.attempts === 0) throw new Error('first attempt fails');
    return { second: true };
  });
  o.registerHandler('ev.slow', { pool: 'ev', timeoutMs: 100 }, async (ctx) => {
    await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
    return {};
  });
  o.registerHandler('ev.hang', { pool: 'ev' }, async (ctx) => {
    await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
    return {};
  });
}

/** Starts one run of each outcome on `o`; cancels the hanging one (from `canceler`) once it runs. */
async function runEachOutcome(o: JobOrchestrator, canceler: JobOrchestrator) {
  const ok = await o.start('ev.ok', {});
  const bad = await o.start('ev.bad', {});
  const flaky = await o.start('ev.flaky', {});
  const slow = await o.start('ev.slow', {});
  const hang = await o.start('ev.hang', {});
  await until('the hanging run to run', async () => (await o.findById(hang.id))?.status === 'running');
  await canceler.cancel(hang.id);
  for (const r of [ok, bad, flaky, slow, hang]) await o.waitForRun(r.id, { timeoutMs: 10_000 });
  return { ok, bad, flaky, slow, hang };
}

const expected = (runs: Awaited<ReturnType<typeof runEachOutcome>>) => ({
  [runs.ok.id]: [`run:completed ${runs.ok.id} 1 completed`],
  [runs.bad.id]: [`run:failed ${runs.bad.id} 1 failed`],
  [runs.flaky.id]: [`run:retrying ${runs.flaky.id} 1 pending`, `run:completed ${runs.flaky.id} 2 completed`],
  [runs.slow.id]: [`run:timed_out ${runs.slow.id} 1 timed_out`],
  [runs.hang.id]: [`run:canceled ${runs.hang.id} 0 canceled`],
});

postgresOnly('run events reach an orchestrator that did not execute the run (completed, failed, retrying, timed_out, canceled)', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  registerOutcomes(a);
  const b = orchestrator(); // only listens: no handler, no worker
  const heard = record(b);
  await listening(admin, schema, 1);

  const worker = a.startWorker({ pools: { ev: { concurrency: 10 } } });
  t.teardown(() => worker.stop());
  const runs = await runEachOutcome(a, a);
  const want = expected(runs);
  await until('B to hear every transition', () => heard.seen.length >= 6, 5000).catch(() => undefined);
  for (const [id, events] of Object.entries(want)) t.deepEqual(heard.of(id), events, `B's events of ${id}`);
  t.is(heard.seen.length, 6);
});

postgresOnly('the orchestrator that executed a run emits each of its events once (its own, not the notification echo); a listener elsewhere once too', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  registerOutcomes(a);
  const b = orchestrator();
  const heardA = record(a);
  const heardB = record(b);
  await listening(admin, schema, 2);

  const worker = a.startWorker({ pools: { ev: { concurrency: 10 } } });
  t.teardown(() => worker.stop());
  // The hanging run is canceled from B: B's event is its own, A's the notification's.
  const runs = await runEachOutcome(a, b);
  const want = expected(runs);
  await until('B to hear every transition', () => heardB.seen.length >= 6, 5000).catch(() => undefined);
  // Echoes would arrive within milliseconds: give them time to show.
  await sleep(500);
  for (const [id, events] of Object.entries(want)) {
    t.deepEqual(heardA.of(id), events, `A's events of ${id}`);
    t.deepEqual(heardB.of(id), events, `B's events of ${id}`);
  }
  t.is(heardA.seen.length, 6);
  t.is(heardB.seen.length, 6);
});

postgresOnly('waitForRun in an orchestrator that does not execute the run resolves from the notification', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  let release = () => undefined as void;
  const gate = new Promise<void>((r) => (release = r));
  a.registerHandler('ev.gated', { pool: 'ev' }, async () => {
    await gate;
    return { done: true };
  });
  const b = orchestrator();
  const run = await a.start('ev.gated', {});
  const worker = a.startWorker({ pools: { ev: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  await until('the run to run', async () => (await a.findById(run.id))?.status === 'running');
  // The wait's row checks, counted: the ones that found the run finished.
  const findById = b.findById.bind(b);
  let finishedLooks = 0;
  b.findById = async (...args: Parameters<typeof findById>) => {
    const row = await findById(...args);
    if (row?.status === 'completed') finishedLooks++;
    return row;
  };
  const waiting = b.waitForRun(run.id, { timeoutMs: 10_000 });
  waiting.catch(() => undefined); // awaited below; a failure before that is not unhandled
  // A pending wait is someone listening: B opens its listener for it.
  await until('B to listen for its wait', async () => (await eventListeners(admin, schema)) === 1);
  // Let the row checks back off to one a second.
  await sleep(1600);
  release();
  const done = await waiting;
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { done: true });
  // The notification resolved it, not a row check (only the fallback now).
  t.is(finishedLooks, 0);
  // The wait is over: nobody listens, the listener goes.
  await until('B to stop listening', async () => (await eventListeners(admin, schema)) === 0, 3000);
});

postgresOnly('no LISTEN connection while nobody listens; on() opens one, off() and close() end it, a later on() listens again', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  a.registerHandler('ev.ok', { pool: 'ev' }, async () => ({}));
  const worker = a.startWorker({ pools: { ev: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  const b = orchestrator();
  // Runs complete (their transitions notify), nobody listens: no listener anywhere.
  for (let i = 0; i < 5; i++) await a.waitForRun((await a.start('ev.ok', { i })).id, { timeoutMs: 10_000 });
  await sleep(300);
  t.is(await eventListeners(admin, schema), 0, 'nobody listens: no LISTEN connection');

  const seen: string[] = [];
  const listener = (r: JobRun) => void seen.push(r.id);
  b.on('run:completed', listener);
  await until('on() to open the listener', async () => (await eventListeners(admin, schema)) === 1);
  const r1 = await a.start('ev.ok', { n: 1 });
  await until('B to hear r1', () => seen.includes(r1.id), 5000);

  b.off('run:completed', listener);
  await until('off() to end the listener', async () => (await eventListeners(admin, schema)) === 0, 3000);

  b.on('run:completed', listener);
  await until('on() to open it again', async () => (await eventListeners(admin, schema)) === 1);
  await b.close();
  await until('close() to end the listener', async () => (await eventListeners(admin, schema)) === 0, 3000);
  const r2 = await a.start('ev.ok', { n: 2 });
  await a.waitForRun(r2.id, { timeoutMs: 10_000 });
  await sleep(300);
  t.false(seen.includes(r2.id), 'a closed orchestrator hears nothing');

  // Used again after close (as the pool reconnects): a new on() listens again.
  b.on('run:failed', () => undefined);
  await until('on() after close() to listen again', async () => (await eventListeners(admin, schema)) === 1);
  const r3 = await a.start('ev.ok', { n: 3 });
  await until('B to hear r3', () => seen.includes(r3.id), 5000);
});

/**
 * A child Node process running `body` with `JobOrchestrator` and `options`
 * (the test's, without its logger functions) in scope: its output so far,
 * and its exit code once it ends. Killed at teardown.
 */
function listenerProcess(t: ExecutionContext, options: JobOrchestratorOptions, flags: string[], body: string): { out(): string; err(): string; exited: Promise<number | null> } {
  const dist = path.resolve(__dirname, '../dist');
  const script = `
    const { JobOrchestrator } = require(${JSON.stringify(dist)});
    const options = JSON.parse(process.argv[1]);
    ${body}
  `;
  const { loggerFactory: _f, logger: _l, ...plain } = options;
  const child = spawn(process.execPath, [...flags, '-e', script, JSON.stringify(plain)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  t.teardown(() => void child.kill('SIGKILL'));
  return { out: () => out, err: () => err, exited };
}

postgresOnly('a process that only listens hears a run another process executed, and exits once it closes its orchestrator', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema, options } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  a.registerHandler('ev.ok', { pool: 'ev' }, async () => ({ from: 'parent' }));
  // The child: one orchestrator, one listener, no worker, no timer; it
  // closes the orchestrator after the first event and must then exit by
  // itself (no process.exit).
  const child = listenerProcess(t, options, [], `
    const o = new JobOrchestrator(options);
    o.on('run:completed', (run) => {
      process.stdout.write(JSON.stringify({ id: run.id, status: run.status, output: run.output }) + '\\n');
      void o.close();
    });
  `);
  await listening(admin, schema, 1);

  const worker = a.startWorker({ pools: { ev: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  const run = await a.start('ev.ok', {});
  const code = await Promise.race([child.exited, sleep(15_000).then(() => 'still running')]);
  t.is(code, 0, `child: ${String(code)}; stderr: ${child.err()}`);
  t.deepEqual(JSON.parse(child.out().trim()), { id: run.id, status: 'completed', output: { from: 'parent' } });
  // The child is gone; its backend leaves pg_stat_activity a moment after
  // the disconnect (later on a loaded machine).
  const gone = Date.now() + 3_000;
  while ((await eventListeners(admin, schema)) !== 0 && Date.now() < gone) await sleep(25);
  t.is(await eventListeners(admin, schema), 0);
});

postgresOnly('a listener keeps its orchestrator, and the process, alive: one nothing else references still hears events after a full GC', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema, options } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  a.registerHandler('ev.ok', { pool: 'ev' }, async () => ({ from: 'parent' }));
  // The child: an orchestrator referenced only by what it holds itself (the
  // listener does not name it), then full collections in a later turn. It
  // was held weakly: collected, it stopped listening and the process exited.
  const child = listenerProcess(t, options, ['--expose-gc'], `
    (() => {
      const o = new JobOrchestrator(options);
      o.on('run:completed', (run) => {
        process.stdout.write(JSON.stringify({ id: run.id }) + '\\n');
        process.exit(0);
      });
    })();
    setTimeout(() => {
      for (let i = 0; i < 4; i++) global.gc();
      process.stdout.write('collected\\n');
    }, 50);
  `);
  await listening(admin, schema, 1);
  const deadline = Date.now() + 10_000;
  while (!child.out().includes('collected') && Date.now() < deadline) await sleep(20);
  t.true(child.out().includes('collected'), `child: ${child.out()} ${child.err()}`);

  const worker = a.startWorker({ pools: { ev: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  const run = await a.start('ev.ok', {});
  const code = await Promise.race([child.exited, sleep(12_000).then(() => 'still running')]);
  t.is(code, 0, `child: ${String(code)}; stderr: ${child.err()}`);
  t.true(child.out().includes(JSON.stringify({ id: run.id })), `the child heard the run: ${child.out()}`);
});

postgresOnly('a listener whose connection the server ends logs it, reconnects, logs that, and hears events again', async (t, make) => {
  const admin = await adminClient(t);
  const { orchestrator, schema } = onOneSchema(t, make);
  const a = orchestrator();
  await a.migrate();
  a.registerHandler('ev.ok', { pool: 'ev' }, async () => ({}));
  const worker = a.startWorker({ pools: { ev: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  const logged: string[] = [];
  const logger = { ...silentLogger, error: (...m: unknown[]) => void logged.push(m.map(String).join(' ')) };
  const b = orchestrator({ logger });
  const seen: string[] = [];
  b.on('run:completed', (r) => void seen.push(r.id));
  await until('B to listen', async () => (await eventListeners(admin, schema)) === 1);
  await admin.query(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`, [`LISTEN "jobforge:events:${schema}"`]);
  await until('the loss to be logged', () => logged.some((m) => /not received/.test(m)), 5000);
  await until('B to listen again', async () => (await eventListeners(admin, schema)) === 1, 10_000);
  await until('the recovery to be logged', () => logged.some((m) => /received again/.test(m)), 5000);
  t.is(logged.length, 2, logged.join('\n'));
  const r = await a.start('ev.ok', {});
  await until('B to hear a run after the reconnect', () => seen.includes(r.id), 5000);
  t.pass();
});
