// What only the PostgreSQL backend has: several orchestrators (as separate
// processes would) sharing one database — a cancel in one fires ctx.signal
// in the one running the handler, waitForRun sees runs finished elsewhere,
// leases expire and are swept — plus migrations (CLI, registration order),
// orphaned job types, database failures as typed errors, and option checks.
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { JobInputInvalidError, JobOrchestrator, JobStoreError } from '../dist';
import type { JobOrchestratorOptions } from '../dist';
import { pair, PG_URL, postgresOnly } from './backends';
import { silentLogger } from './helpers';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A client of its own on the test server (closed at teardown), to change tables behind jobforge's back. */
async function adminClient(t: ExecutionContext): Promise<import('pg').Client> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { Client } = require('pg') as typeof import('pg');
  const admin = new Client({ connectionString: PG_URL });
  await admin.connect();
  t.teardown(() => admin.end());
  return admin;
}

/** Collects what is written to console.error (the orchestrator's default logger) until `restore()` or teardown. */
function captureConsoleError(t: ExecutionContext): { logged: string[]; restore: () => void } {
  const logged: string[] = [];
  const consoleError = console.error;
  console.error = (...a: unknown[]) => void logged.push(a.map(String).join(' '));
  const restore = () => {
    console.error = consoleError;
  };
  t.teardown(restore);
  return { logged, restore };
}

async function until<T>(what: string, f: () => Promise<T | null | undefined | false>, ms = 10_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await f();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

// Cross-process behaviour: needs two orchestrators on one database.
postgresOnly('a schema name of 55+ bytes: an idle worker is still woken by a start in another orchestrator (the wake-up channel fits 63 bytes)', async (t, make) => {
  // `jobforge_<schema>` over 63 bytes was cut by LISTEN and refused by
  // pg_notify: such a worker only ever found runs by polling.
  const schema = `jf_long_${process.pid}_${Date.now()}_`.padEnd(60, 'x');
  const admin = await adminClient(t);
  t.teardown(() => admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).then(() => undefined));
  const [a, b] = await pair(t, make, { postgres: { url: PG_URL, schema, pollMs: 100_000, leaseMs: 600_000 } });
  let startedAt = 0;
  a.registerHandler('wake', {}, async () => {
    startedAt = Date.now();
  });
  b.registerHandler('wake', {}, async () => undefined);
  const worker = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  await sleep(300); // the worker has looked, found nothing, and sleeps
  const t0 = Date.now();
  const run = await b.start('wake', {});
  await until('the handler to start', async () => startedAt > 0, 5_000);
  t.true(startedAt - t0 < 1_000, `started ${startedAt - t0} ms after the start in the other orchestrator`);
  t.is((await b.waitForRun(run.id, { timeoutMs: 5_000 })).status, 'completed');
});

postgresOnly('a cancel from another orchestrator fires ctx.signal where the handler runs', async (t, make) => {
  const [a, b] = await pair(t, make);
  let aborted: unknown = null;
  let started = false;
  a.registerHandler('long', {}, async (ctx) => {
    started = true;
    await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
    aborted = ctx.signal.reason;
    return { late: true };
  });
  b.registerHandler('long', {}, async () => undefined);
  const worker = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  const run = await b.start('long', {});
  await until('the handler to start', async () => started);
  await b.cancel(run.id);
  await until('the signal', async () => aborted !== null);
  t.is(aborted, 'canceled');
  await worker.stop();
  const row = await b.findById(run.id);
  t.is(row?.status, 'canceled');
  t.is(row?.output, null, 'the late return is ignored');
});

postgresOnly('notifications reach another orchestrator at once: an idle worker wakes for a start, a running handler for a cancel (no polling)', async (t, make) => {
  // Polling and lease renewal far beyond the test: only NOTIFY can explain
  // a wake-up within the second.
  const [a, b] = await pair(t, make, { postgres: { url: PG_URL, pollMs: 100_000, leaseMs: 600_000 } });
  let startedAt = 0;
  let abortedAt = 0;
  a.registerHandler('wake', {}, async (ctx) => {
    startedAt = Date.now();
    if ((ctx.input as { wait?: boolean }).wait) {
      await new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve()));
      abortedAt = Date.now();
    }
  });
  b.registerHandler('wake', {}, async () => undefined);
  const worker = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  await sleep(300); // the worker has looked, found nothing, and sleeps
  for (const round of [1, 2, 3]) {
    startedAt = 0;
    const t0 = Date.now();
    const run = await b.start('wake', {});
    await until(`round ${round}: the handler to start`, async () => startedAt > 0, 5_000);
    t.true(startedAt - t0 < 1_000, `round ${round}: started ${startedAt - t0} ms after the start in the other orchestrator`);
    await b.waitForRun(run.id, { timeoutMs: 5_000 });
    await sleep(100);
  }
  startedAt = 0;
  const run = await b.start('wake', { wait: true });
  await until('the waiting handler to start', async () => startedAt > 0, 5_000);
  const c0 = Date.now();
  await b.cancel(run.id);
  await until('the signal', async () => abortedAt > 0, 5_000);
  t.true(abortedAt - c0 < 1_000, `the handler's signal fired ${abortedAt - c0} ms after the cancel`);
});

// A rolling deploy, or an API process beside workers with more handlers:
// processes sharing the tables register different job types. A worker
// takes only runs of the types its process registered (with handlers);
// it used to claim the others and fail them ("No handler registered").
postgresOnly('a worker claims only runs of the job types its process registered; the others wait for a process that has them', async (t, make) => {
  const [a, b] = await pair(t, make);
  a.registerHandler('old.x', {}, async () => 'a');
  b.registerHandler('old.x', {}, async () => 'b');
  b.registerHandler('new.x', {}, async () => 'b');
  // a's worker is idle first: before the fix it took every run it saw.
  const wa = a.startWorker({ pools: { batch: { concurrency: 4 } } });
  t.teardown(() => wa.stop());
  await sleep(200);
  const runs = [];
  for (let i = 0; i < 20; i++) runs.push(await b.start('new.x', { i }));
  await sleep(500);
  t.deepEqual(
    (await b.countByPoolAndStatus()).filter((c) => c.count > 0),
    [{ pool: 'batch', status: 'pending', count: 20 }],
    "a's worker left them pending",
  );
  const wb = b.startWorker({ pools: { batch: { concurrency: 4 } } });
  for (const r of runs) {
    const done = await b.waitForRun(r.id, { timeoutMs: 10_000 });
    t.deepEqual([done.status, done.output], ['completed', 'b']);
  }
  await wb.stop();
  // Registered later, a type is served from then on.
  a.registerHandler('new.x', {}, async () => 'a');
  const late = await b.start('new.x', { late: true });
  const done = await b.waitForRun(late.id, { timeoutMs: 10_000 });
  t.deepEqual([done.status, done.output], ['completed', 'a']);
});

postgresOnly('waitForRun resolves for a run another orchestrator executes', async (t, make) => {
  const [a, b] = await pair(t, make);
  a.registerHandler('work', {}, async (ctx) => ({ doubled: (ctx.input as { n: number }).n * 2 }));
  b.registerHandler('work', {}, async () => undefined);
  const run = await b.start('work', { n: 21 });
  const waiting = b.waitForRun(run.id, { timeoutMs: 10_000 });
  const worker = a.startWorker({ pools: { batch: { concurrency: 1 } } });
  const done = await waiting;
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { doubled: 42 });
  await worker.stop();
});

postgresOnly('an expired lease is swept back to pending and run by another worker', async (t, make) => {
  const [a, b] = await pair(t, make, { postgres: { url: PG_URL, leaseMs: 300, pollMs: 50 } });
  let ran = 0;
  a.registerHandler('leased', {}, async () => undefined);
  b.registerHandler('leased', {}, async () => {
    ran++;
  });
  const run = await a.start('leased', {});
  // `a` claims and never executes it (as if its process died mid-run).
  const claimed = await a.claimNext('batch');
  t.is(claimed?.id, run.id);
  const worker = b.startWorker({ pools: { batch: { concurrency: 1 } } });
  const done = await b.waitForRun(run.id, { timeoutMs: 10_000 });
  t.is(done.status, 'completed');
  t.is(ran, 1);
  t.is(done.attempts, 1, 'the lost attempt is not counted as a failure');
  await worker.stop();
});

postgresOnly('a prefetched run dropped because its lease may have lapsed is given back at once, not left running for the sweeper (manual clock)', async (t, make) => {
  const o = await make.manual({ logger: silentLogger, postgres: { url: PG_URL, pollMs: 5_000 } });
  let started = 0;
  // Ignores ctx.signal: its slot stays taken until abandonAfterMs.
  o.registerHandler('stuck', { timeoutMs: 1_000 }, async () => {
    started++;
    return new Promise(() => {});
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 200 });
  try {
    const first = await o.start('stuck', {});
    const second = await o.start('stuck', {});
    await until('the first run started', async () => started === 1);
    await until('the second run prefetched', async () => (await o.findById(second.id))?.status === 'running');
    await o.advanceTime(1_000); // the first times out; its handler keeps the slot
    await sleep(100);
    // Past abandonAfterMs (30 s) and the lease (30 s): the freed slot drops
    // the prefetched run, whose lease may have lapsed. It was left running
    // until the sweeper's next pass (a third of a lease, real time).
    await o.advanceTime(30_000);
    await until('the second run given back and started', async () => started === 2, 3_000);
    t.is((await o.findById(first.id))?.status, 'timed_out');
  } finally {
    await w.stop();
  }
});

postgresOnly('connections the server ends (restart, failover, pg_terminate_backend) are replaced without failing a call', async (t, make) => {
  // One transaction per start (no grouping), so the concurrent starts below fill the pool.
  const opts = make.options({ loggerFactory: () => silentLogger, postgres: { url: PG_URL, maxConnections: 3, groupStarts: false } });
  const app = `jobforge:${opts.postgres?.schema}`; // what the pool names its connections
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('job', {}, async (ctx) => ({ n: (ctx.input as { n: number }).n }));
  // Concurrent calls fill the pool with idle connections.
  const first = await Promise.all([0, 1, 2, 3, 4, 5].map((n) => o.start('job', { n })));
  t.is(first.length, 6);

  const admin = await adminClient(t);
  const pids = (await admin.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE application_name = $1', [app])).rows.map((r) => r.pid);
  t.true(pids.length >= 2, `the pool holds ${pids.length} connections named ${app}`);
  await admin.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [pids]);
  // Once they are gone, each idle pooled connection has the server's FATAL waiting on it.
  await until('the ended backends to exit', async () => {
    const left = await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ANY($1::int[])', [pids]);
    return left.rows[0].n === 0;
  });

  // Reads and writes right after: none fails (before, each dead connection
  // failed one call with a JobStoreError).
  t.is((await o.findById(first[0].id))?.status, 'pending');
  t.deepEqual(await o.countByPoolAndStatus(), [{ pool: 'batch', status: 'pending', count: 6 }]);
  const second = await Promise.all([10, 11, 12].map((n) => o.start('job', { n })));
  const worker = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  for (const r of [...first, ...second]) {
    const done = await o.waitForRun(r.id, { timeoutMs: 10_000 });
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { n: (r.input as { n: number }).n });
  }
});

postgresOnly('definitions whose write failed (database down) are written by the next call once it answers', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger });
  const a = new JobOrchestrator(opts);
  t.teardown(() => a.close());
  // The schema has no tables yet, so the background write of this
  // definition fails, as it would with the database down.
  a.registerHandler('late', { pool: 'late-pool' }, async () => ({ ok: true }));
  const err = await t.throwsAsync(a.start('late', {}));
  t.true(err instanceof JobStoreError, String(err));
  // Another process creates the tables: the database "is back". `a` never
  // calls migrate(); its next call writes the definition, then starts.
  const b = new JobOrchestrator(opts);
  t.teardown(() => b.close());
  await b.migrate();
  const run = await a.start('late', {});
  t.is(run.status, 'pending');
  t.is(run.pool, 'late-pool');
  t.is((await b.getDefinition('late'))?.pool, 'late-pool');
});

for (const backAfterMs of [300, null]) {
  const when = backAfterMs === null ? 'stays unable' : 'can again after 300 ms';
  postgresOnly(`stop() waits for finished attempts' outcomes to be stored; the database ${when}`, async (t, make) => {
    const opts = make.options({ loggerFactory: () => silentLogger, postgres: { url: PG_URL, leaseMs: 60_000, pollMs: 50 } });
    const table = `"${opts.postgres?.schema}".job_run`;
    const o = new JobOrchestrator(opts);
    t.teardown(() => o.close());
    await o.migrate();
    let started = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    o.registerHandler('held', {}, async () => {
      started++;
      await gate;
      return { ok: true };
    });
    const runs = await Promise.all([1, 2].map(() => o.start('held', {})));
    const worker = o.startWorker({ pools: { batch: { concurrency: 2 } }, shutdownTimeoutMs: 500 });
    await until('both handlers to start', async () => started === 2);

    const admin = await adminClient(t);
    // From now on no outcome can be stored (as with the database down).
    await admin.query(`ALTER TABLE ${table} RENAME TO job_run_away`);
    const logged: string[] = [];
    const consoleError = console.error;
    // Only stop()'s own line (the worker also reports the failing calls).
    console.error = (...a: unknown[]) => {
      const line = a.map(String).join(' ');
      if (line.includes('worker stopped')) logged.push(line);
    };
    t.teardown(() => (console.error = consoleError));
    release();
    const back = async () => admin.query(`ALTER TABLE "${opts.postgres?.schema}".job_run_away RENAME TO job_run`);
    if (backAfterMs !== null) setTimeout(() => void back(), backAfterMs);

    const t0 = Date.now();
    await worker.stop();
    const stopMs = Date.now() - t0;
    console.error = consoleError;
    if (backAfterMs !== null) {
      // stop() returned once both outcomes were stored, not before.
      t.true(stopMs >= backAfterMs - 50, `stop() took ${stopMs} ms`);
      t.deepEqual(logged, []);
      for (const r of runs) t.is((await o.findById(r.id))?.status, 'completed');
    } else {
      // Bounded: max(shutdownTimeoutMs, 1 s) for the outcomes, then it says what is left.
      t.true(stopMs >= 900 && stopMs < 5000, `stop() took ${stopMs} ms`);
      t.is(logged.length, 1, logged.join('\n'));
      t.regex(logged[0], /before every finished attempt was settled/);
      // The engine keeps trying: once the table is back, the outcomes land.
      await back();
      for (const r of runs) await until(`run ${r.id} stored`, async () => (await o.findById(r.id))?.status === 'completed');
      t.pass();
    }
  });
}

postgresOnly('waitForRun keeps its timeout while the database does not answer its lookups', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger });
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('w', {}, async () => undefined);
  const run = await o.start('w', {});
  const admin = await adminClient(t);
  // Every read of job_run now waits for this lock, as for a server that stopped answering.
  await admin.query('BEGIN');
  await admin.query(`LOCK TABLE "${opts.postgres?.schema}".job_run IN ACCESS EXCLUSIVE MODE`);
  const t0 = Date.now();
  const err = await t.throwsAsync(o.waitForRun(run.id, { timeoutMs: 300 }));
  const ms = Date.now() - t0;
  await admin.query('ROLLBACK');
  t.is((err as Error).name, 'JobWaitTimeoutError', String(err));
  t.true(ms >= 290 && ms < 3000, `rejected after ${ms} ms`);
  // The lookup left behind finishes once the lock is gone; nothing else is affected.
  t.is((await o.findById(run.id))?.status, 'pending');
});

postgresOnly('a worker that cannot reach its tables says so once (not per attempt), and says when it can again', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger, postgres: { url: PG_URL, leaseMs: 600, pollMs: 20 } });
  const schema = opts.postgres?.schema;
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('n', {}, async () => undefined);
  const worker = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  await o.waitForRun((await o.start('n', {})).id, { timeoutMs: 5000 });
  const { logged, restore } = captureConsoleError(t);
  const admin = await adminClient(t);
  await admin.query(`ALTER TABLE "${schema}".job_run RENAME TO job_run_away`);
  // The sweeper runs every lease/3 = 200 ms: several failures in this second.
  await sleep(1000);
  const failing = logged.filter((l) => l.includes('database calls are failing'));
  t.is(failing.length, 1, logged.join('\n'));
  t.regex(failing[0], /job_run/);
  await admin.query(`ALTER TABLE "${schema}".job_run_away RENAME TO job_run`);
  await until('the recovery notice', async () => logged.some((l) => l.includes('succeed again')));
  restore();
  // And it works: a new run completes.
  t.is((await o.waitForRun((await o.start('n', {})).id, { timeoutMs: 5000 })).status, 'completed');
});

postgresOnly('a missing schedule table (a database not migrated since schedules) is reported once, apart from the claim loop, and its recovery too', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger, postgres: { url: PG_URL, pollMs: 20 } });
  const schema = opts.postgres?.schema;
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('n', {}, async () => undefined);
  const worker = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => worker.stop());
  const { logged, restore } = captureConsoleError(t);
  const admin = await adminClient(t);
  // A database migrated by a jobforge without schedules, say.
  await admin.query(`ALTER TABLE "${schema}".job_schedule RENAME TO job_schedule_away`);
  await sleep(1000);
  const failing = logged.filter((l) => l.includes('schedules'));
  t.is(failing.length, 1, logged.join('\n'));
  t.regex(failing[0]!, /fires no schedules.*no job_schedule table.*migrate\(\)/);
  t.false(logged.some((l) => l.includes('database calls')), 'the claim loop is fine and says nothing');
  // Runs still work meanwhile.
  t.is((await o.waitForRun((await o.start('n', {})).id, { timeoutMs: 5000 })).status, 'completed');
  await admin.query(`ALTER TABLE "${schema}".job_schedule_away RENAME TO job_schedule`);
  await until('the recovery notice', async () => logged.some((l) => l.includes('fires schedules again')), 15_000);
  restore();
  const t0 = Date.now();
  await o.schedule('after', { jobType: 'n', everyMs: 50 });
  const ran = await until('a scheduled run', async () => (await o.listJobRuns({})).items.find((r) => r.triggerRef === 'after'));
  t.true(ran.runAt.getTime() - t0 < 1_000);
});

postgresOnly('handlers registered before migrate() on a fresh schema are stored by migrate()', async (t, make) => {
  const o = new JobOrchestrator(make.options({ loggerFactory: () => silentLogger }));
  t.teardown(() => o.close());
  o.registerHandler('early', { retry: { attempts: 3, backoff: 'fixed', baseMs: 5 } }, async () => undefined);
  await o.migrate();
  const run = await o.start('early', {});
  t.is(run.status, 'pending');
  t.is((await o.getDefinition('early'))?.retryPolicy.attempts, 3);
});

postgresOnly('upsertJobRows reports the stored job types no entry names', async (t, make) => {
  const [a, b] = await pair(t, make);
  await a.upsertJobRows([
    { type: 'kept', meta: {}, handlerClass: async () => undefined },
    { type: 'gone', meta: {}, handlerClass: async () => undefined },
  ]);
  const { orphaned } = await b.upsertJobRows([{ type: 'kept', meta: {}, handlerClass: async () => undefined }]);
  t.deepEqual(orphaned, ['gone']);
});

postgresOnly('a string the database cannot store is JobInputInvalidError and stores nothing', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('t', {}, async () => undefined);
  // The key function makes a NUL the input does not hold.
  o.registerHandler('laned', { concurrency: { key: (i: { k: string }) => i.k.replace('~', '\u0000'), collisionMode: 'replace' } }, async () => undefined);
  const incumbent = await o.start('laned', { k: 'same' });
  const cases: [string, () => Promise<unknown>][] = [
    ['NUL in the input', () => o.start('t', { s: 'a\u0000b' })],
    ['lone surrogate in the input', () => o.start('t', { s: 'a\ud800b' })],
    ['NUL in a tag', () => o.start('t', {}, { tags: { a: 'x\u0000' } })],
    ['NUL in the scope', () => o.start('t', {}, { scope: { entityType: 'user', entityId: 'u\u0000' } })],
    ['NUL in a function key', () => o.start('laned', { k: 'k~' })],
    ['NUL in triggerRef', () => o.start('t', {}, { triggerRef: 'r\u0000' })],
  ];
  for (const [label, call] of cases) {
    const err = await t.throwsAsync(call(), undefined, label);
    t.true(err instanceof JobInputInvalidError, `${label}: ${String(err)}`);
    t.regex(err!.message, /cannot be stored/, label);
  }
  t.deepEqual(await o.countByPoolAndStatus(), [{ pool: 'batch', status: 'pending', count: 1 }]);
  t.is((await o.findById(incumbent.id))?.status, 'pending', 'nothing changed, the lane incumbent included');
  // The orchestrator is still usable.
  t.is((await o.start('t', { s: 'fine' })).status, 'pending');
});

postgresOnly('an output or error the database cannot store still ends the run (failed, with the reason), never left running', async (t, make) => {
  const o = await make.manual();
  const results: Record<string, () => unknown> = {
    'out.nul': () => ({ v: 'a\u0000b' }),
    'out.lone': () => ({ v: 'a\ud800b' }),
    'err.nul': () => {
      throw new Error('bad \u0000 byte');
    },
    'err.lone': () => {
      throw new Error('half \ud800 a pair');
    },
  };
  for (const [type, f] of Object.entries(results)) o.registerHandler(type, {}, async () => f());
  // A step whose output cannot be stored fails (it is not left running), and
  // ctx.step throws JobInputInvalidError.
  let stepError: unknown = null;
  o.registerHandler('step.nul', {}, async (ctx) => {
    try {
      await ctx.step('a', async () => ({ v: 'x\u0000' }));
    } catch (e) {
      stepError = e;
      throw e;
    }
  });
  const s = await o.start('step.nul', {});
  t.is((await o.claimNext('batch'))?.id, s.id);
  await o.tick(s.id);
  t.true(stepError instanceof JobInputInvalidError, String(stepError));
  t.is((await o.findById(s.id))?.status, 'failed');
  const [step] = await o.listSteps(s.id);
  t.is(step.status, 'failed');
  t.regex(step.error!.message, /step 'a' output cannot be stored: it holds a NUL character/);
  for (const type of Object.keys(results)) {
    const run = await o.start(type, {});
    t.is((await o.claimNext('batch'))?.id, run.id);
    await o.tick(run.id);
    const row = await o.findById(run.id);
    t.is(row?.status, 'failed', type);
    t.is(row?.output, null, type);
    if (type.startsWith('out.')) {
      t.regex(row!.error!.message, /^handler output cannot be stored: it holds a (NUL character|lone surrogate)/, type);
    } else {
      // The message is kept, with U+FFFD for what cannot be stored.
      t.is(row?.error?.message, type === 'err.nul' ? 'bad \ufffd byte' : 'half \ufffd a pair', type);
    }
  }
});

postgresOnly('advanceTime on a manual clock wakes the worker at once, whatever its poll interval', async (t, make) => {
  const o = await make.manual({ postgres: { url: PG_URL, pollMs: 100_000 } });
  let startedAfter: number | null = null;
  let movedAt = 0;
  o.registerHandler('later', {}, async () => {
    startedAfter = Date.now() - movedAt;
  });
  const worker = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  const run = await o.start('later', {}, { runAt: new Date(o.now().getTime() + 3_600_000) });
  await sleep(300); // the worker has looked and gone to sleep for its poll interval
  t.is((await o.findById(run.id))?.status, 'pending');
  movedAt = Date.now();
  o.advanceTime(3_600_000);
  const done = await o.waitForRun(run.id, { timeoutMs: 5_000 });
  t.is(done.status, 'completed');
  t.true(startedAfter !== null && startedAfter < 2_000, `started ${startedAfter} ms after advanceTime`);
});

postgresOnly('a lease renewal moves updatedAt with claimedAt', async (t, make) => {
  const o = await make.system({ postgres: { url: PG_URL, leaseMs: 300, pollMs: 50 } });
  let release: () => void = () => undefined;
  const gate = new Promise<void>((r) => (release = r));
  o.registerHandler('slow', {}, async () => {
    await gate;
  });
  const worker = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  t.teardown(async () => {
    release();
    await worker.stop();
  });
  const run = await o.start('slow', {});
  // Renewed every leaseMs / 3: claimedAt soon moves past startedAt.
  const running = await until('a renewed lease', async () => {
    const r = await o.findById(run.id);
    return r && r.status === 'running' && r.claimedAt!.getTime() > r.startedAt!.getTime() + 150 ? r : null;
  });
  t.true(running.updatedAt.getTime() >= running.claimedAt!.getTime(), 'updatedAt is not older than the renewed claimedAt');
  release();
  const done = await o.waitForRun(run.id, { timeoutMs: 10_000 });
  t.is(done.status, 'completed');
  t.true(done.finishedAt!.getTime() >= done.claimedAt!.getTime(), 'finishedAt is not before claimedAt');
});

postgresOnly('a run finishes when its handler did, not when its outcome could be stored', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger, logger: silentLogger, postgres: { url: PG_URL, pollMs: 50 } });
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  let release: () => void = () => undefined;
  const gate = new Promise<void>((r) => (release = r));
  let endedAt = 0;
  o.registerHandler('held', {}, async () => {
    await gate;
    endedAt = Date.now();
  });
  const worker = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  const run = await o.start('held', {});
  await until('the run to start', async () => (await o.findById(run.id))?.status === 'running');
  // The table is away for ~800 ms: storing the outcome fails and is retried.
  const admin = await adminClient(t);
  const schema = opts.postgres!.schema;
  await admin.query(`ALTER TABLE ${schema}.job_run RENAME TO job_run_away`);
  release();
  await until('the handler to end', async () => endedAt > 0);
  await sleep(800);
  await admin.query(`ALTER TABLE ${schema}.job_run_away RENAME TO job_run`);
  const done = await o.waitForRun(run.id, { timeoutMs: 10_000 });
  t.is(done.status, 'completed');
  const lag = done.finishedAt!.getTime() - endedAt;
  t.true(lag < 400, `finishedAt is ${lag} ms after the handler ended (stored 800+ ms later)`);
  t.true(done.updatedAt.getTime() >= done.finishedAt!.getTime());
});

test('an unreachable database is a typed error, not a crash', async (t) => {
  const o = new JobOrchestrator({
    backend: 'postgres',
    postgres: { url: 'postgres://nobody@127.0.0.1:1/none', maxConnections: 1 },
  });
  o.registerHandler('t', {}, async () => undefined);
  const err = await t.throwsAsync(o.migrate());
  t.true(err instanceof JobStoreError, String(err));
  t.is((err as JobStoreError).code, 'JOB_STORE_ERROR');
  t.true((err as JobStoreError).retryable, 'a refused connection may work later');
  const err2 = await t.throwsAsync(o.findById('00000000-0000-4000-8000-000000000000'));
  t.true(err2 instanceof JobStoreError);
  await o.close();
});

test('a database server that accepts connections and never answers: calls reject with JobStoreError after connect_timeout, not never', async (t) => {
  // A proxy with no backend behind it, or a stopped server: TCP connects,
  // the startup message is read, no answer ever comes.
  const net = await import('node:net');
  const sockets = new Set<import('node:net').Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('data', () => undefined);
    socket.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    return new Promise<void>((r) => server.close(() => r()));
  });
  const port = (server.address() as { port: number }).port;
  const o = new JobOrchestrator({
    backend: 'postgres',
    postgres: { url: `postgres://nobody@127.0.0.1:${port}/none?connect_timeout=1`, maxConnections: 1 },
    loggerFactory: () => silentLogger,
  });
  o.registerHandler('t', {}, async () => undefined);
  const t0 = Date.now();
  const err = await t.throwsAsync(o.migrate());
  const took = Date.now() - t0;
  t.true(err instanceof JobStoreError, String(err));
  t.true((err as JobStoreError).retryable, 'the server may answer later');
  t.regex((err as Error).message, /did not answer/);
  t.true(took >= 900 && took < 5000, `migrate gave up after ${took} ms (connect_timeout=1)`);
  // With its one connection attempt still unanswered, the next call fails at once.
  const t1 = Date.now();
  t.true((await t.throwsAsync(o.findById('00000000-0000-4000-8000-000000000000'))) instanceof JobStoreError);
  t.true(Date.now() - t1 < 1000, `second call took ${Date.now() - t1} ms`);
  await o.close();
});

test('a worker whose database refuses connections backs off instead of reconnecting ten times a second', async (t) => {
  // A "database" that accepts every connection and closes it at once.
  const net = await import('node:net');
  let connections = 0;
  const server = net.createServer((socket) => {
    connections++;
    socket.destroy();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.address() as { port: number }).port;
  const o = new JobOrchestrator({
    backend: 'postgres',
    postgres: { url: `postgres://nobody@127.0.0.1:${port}/none`, maxConnections: 2, pollMs: 50 },
    loggerFactory: () => silentLogger,
  });
  o.registerHandler('t', {}, async () => undefined);
  const consoleError = console.error;
  console.error = () => undefined; // the worker reports the failing calls
  t.teardown(() => (console.error = consoleError));
  const worker = o.startWorker({ pools: { batch: { concurrency: 2 } }, shutdownTimeoutMs: 0 });
  await sleep(3000);
  const seen = connections;
  await worker.stop();
  await o.close();
  // Without backoff the loop retried every 100 ms and the listener every
  // 500 ms: 38 connections in 3 s, measured. Now the loop's waits double
  // from 100 ms and the listener's from 500 ms: 12, measured.
  t.log(`${seen} connection attempts in 3 s`);
  t.true(seen >= 3 && seen <= 20, `${seen} connection attempts in 3 s`);
});

test('postgres options are checked at construction', (t) => {
  const bad: [unknown, RegExp][] = [
    [{ backend: 'postgres' }, /postgres\.url/],
    [{ backend: 'postgres', postgres: { url: '' } }, /postgres\.url/],
    [{ backend: 'postgres', postgres: { url: 'not a url' } }, /connection string/],
    [{ backend: 'postgres', postgres: { url: PG_URL, schema: '' } }, /schema/],
    [{ backend: 'postgres', postgres: { url: PG_URL, maxConnections: 0 } }, /maxConnections/],
    [{ backend: 'postgres', postgres: { url: PG_URL, leaseMs: -1 } }, /leaseMs/],
    [{ backend: 'mysql' }, /backend/],
    // Refused, not ignored: a misspelt key, postgres options without the
    // backend (the runs would live in memory), a schema name PostgreSQL
    // would cut (two names, one schema's tables) or cannot take.
    [{ backend: 'postgres', postgres: { url: PG_URL, maxConnection: 50 } }, /unknown key 'maxConnection'/],
    [{ backend: 'postgres', postgres: { url: PG_URL, ssl: true } }, /unknown key 'ssl'/],
    [{ postgres: { url: PG_URL } }, /backend is not 'postgres'/],
    [{ backend: 'postgres', postgres: { url: PG_URL, schema: 'x'.repeat(64) } }, /63 bytes/],
    [{ backend: 'postgres', postgres: { url: PG_URL, schema: "it's" } }, /apostrophe/],
    [{ backend: 'postgres', postgres: { url: PG_URL, schema: 'a\u0000b' } }, /NUL/],
    [{ backend: 'postgres', postgres: { url: PG_URL, schema: 'a$jobforge$b' } }, /\$jobforge\$/],
  ];
  for (const [opts, msg] of bad) {
    const err = t.throws(() => new JobOrchestrator(opts as JobOrchestratorOptions));
    t.true(err instanceof JobInputInvalidError, `${JSON.stringify(opts)}: ${String(err)}`);
    t.regex(err!.message, msg);
  }
});

// An empty value (`--schema=`, an unset shell variable) fell back to the
// default and migrated `public` (exit 0).
test('jobforge migrate: an option given empty is a usage error (exit 2), not its default', (t) => {
  const cli = path.join(__dirname, '..', 'bin', 'jobforge.js');
  for (const args of [['--schema='], ['--schema', ''], ['--url', '']]) {
    const r = spawnSync(process.execPath, [cli, 'migrate', '--url', 'postgres://nobody@127.0.0.1:1/none', ...args], { encoding: 'utf8' });
    t.is(r.status, 2, args.join(' '));
    t.regex(r.stderr, /needs a value/, args.join(' '));
  }
});

postgresOnly('npx jobforge migrate creates the schema, idempotently', async (t, make) => {
  const opts = make.options();
  const schema = opts.postgres!.schema!;
  const cli = path.join(__dirname, '..', 'bin', 'jobforge.js');
  for (let i = 0; i < 2; i++) {
    const r = spawnSync(process.execPath, [cli, 'migrate', '--url', PG_URL, '--schema', schema], { encoding: 'utf8' });
    t.is(r.status, 0, r.stderr);
    t.regex(r.stdout, new RegExp(`schema "${schema}" is up to date`));
  }
  const bad = spawnSync(process.execPath, [cli, 'migrate'], {
    encoding: 'utf8',
    env: { ...process.env, JOBFORGE_PG_URL: '', DATABASE_URL: '' },
  });
  t.is(bad.status, 2);
  t.regex(bad.stderr, /--url/);
  // A mistyped option is refused (it would otherwise migrate the default schema, public).
  for (const args of [['--shcema', schema], ['--url', PG_URL, '--shema=jobs'], [schema]]) {
    const typo = spawnSync(process.execPath, [cli, 'migrate', ...args], { encoding: 'utf8' });
    t.is(typo.status, 2, `${args.join(' ')}: ${typo.stdout}${typo.stderr}`);
    t.regex(typo.stderr, /unknown option|unexpected argument/);
    t.notRegex(typo.stdout, /up to date/);
  }
  // The tables it made are usable without another migrate().
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  o.registerHandler('x', {}, async () => undefined);
  t.is((await o.start('x', {})).status, 'pending');
});

// Cross-process behaviour: two orchestrators' workers share one schedule.
postgresOnly('schedules: the workers of two orchestrators start each occurrence once, and both run them', async (t, make) => {
  const [a, b] = await pair(t, make, { postgres: { url: PG_URL, pollMs: 200 } });
  const ranBy: Record<string, string> = {};
  for (const [name, o] of [['a', a], ['b', b]] as const) {
    o.registerHandler('tick', {}, async (ctx) => {
      ranBy[ctx.run.id] = name;
      await sleep(5);
    });
  }
  await a.schedule('fast', { jobType: 'tick', everyMs: 40 });
  const wa = a.startWorker();
  const wb = b.startWorker();
  t.teardown(async () => {
    await wa.stop();
    await wb.stop();
  });
  await until('occurrences run by both workers', async () => {
    const who = Object.values(ranBy);
    return who.length >= 20 && who.includes('a') && who.includes('b');
  });
  await b.unschedule('fast');
  await sleep(300);
  const { items: rows } = await a.listJobRuns({ limit: 500 });
  t.true(rows.length >= 20);
  const times = rows.map((r) => r.runAt.getTime());
  t.is(new Set(times).size, times.length, 'an occurrence started twice');
  for (const r of rows) {
    t.is(r.triggerSource, 'schedule');
    t.is((r.runAt.getTime() - rows[rows.length - 1]!.runAt.getTime()) % 40, 0, 'fire times keep the phase');
  }
  const settled = await until('every run to finish', async () => {
    const live = await a.listJobRuns({ status: ['pending', 'running'] });
    return live.items.length === 0;
  });
  t.true(settled);
});


postgresOnly('a process that only cancels runs others execute does not keep their abort notices', async (t, make) => {
  const [a, b] = await pair(t, make);
  let running = 0;
  a.registerHandler('long', {}, async (ctx) => {
    running++;
    await new Promise((r) => ctx.signal.addEventListener('abort', r));
  });
  b.registerHandler('long', {}, async () => undefined);
  const w = a.startWorker({ pools: { batch: { concurrency: 20 } } });
  t.teardown(() => w.stop());
  const ids: string[] = [];
  for (let i = 0; i < 20; i++) ids.push((await b.start('long', {})).id);
  await until('every handler running', async () => running === 20);
  // b has no worker, no listener and no wait: nobody in b wants notices.
  for (const id of ids) await b.cancel(id);
  await sleep(300);
  const queued = (b as unknown as { store: { native: { takeNotices(): string | null } } }).store.native.takeNotices();
  t.is(queued === null ? 0 : (JSON.parse(queued) as { aborts: unknown[] }).aborts.length, 0, 'abort notices left in the queue');
});

postgresOnly('a due timeout against a refusing database is asked for less and less often, one expiry at a time', async (t, make) => {
  // A proxy in front of the database that forwards until told to refuse.
  const net = await import('node:net');
  let refuse = false;
  let connections = 0;
  const sockets = new Set<import('node:net').Socket>();
  const server = net.createServer((c) => {
    connections++;
    if (refuse) return void c.destroy();
    const up = net.connect(Number(new URL(PG_URL).port || 5432), new URL(PG_URL).hostname);
    sockets.add(c);
    sockets.add(up);
    c.pipe(up);
    up.pipe(c);
    const end = () => {
      c.destroy();
      up.destroy();
    };
    for (const s of [c, up]) s.on('error', end).on('close', end);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = new URL(PG_URL);
  url.host = `127.0.0.1:${(server.address() as { port: number }).port}`;
  const base = make.options({});
  const o = new JobOrchestrator({
    ...base,
    postgres: { ...base.postgres!, url: url.toString(), maxConnections: 2, pollMs: 200 },
    logger: silentLogger,
    loggerFactory: () => silentLogger,
  });
  await o.migrate();
  let started!: () => void;
  const running = new Promise<void>((r) => (started = r));
  o.registerHandler('slow', { timeoutMs: 800 }, async () => {
    started();
    await new Promise(() => undefined);
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 0 });
  await o.start('slow', {});
  await running;
  refuse = true;
  for (const s of sockets) s.destroy();
  const before = connections;
  await sleep(4000);
  const seen = connections - before;
  refuse = false;
  await Promise.race([w.stop(), sleep(3000)]);
  await o.close();
  // Asked every 100 ms without backoff, each expiry a new connection: over
  // 5,000 in 5 s, measured. The worker's own loop and the timer's backoff
  // (100 ms doubling to 5 s) stay in the tens.
  t.log(`${seen} connection attempts in 4 s`);
  t.true(seen <= 60, `${seen} connection attempts in 4 s`);
});

postgresOnly('listRunEvents: event kinds of a newer version are left out, and the pages after them still come', async (t, make) => {
  const opts = make.options({ loggerFactory: () => silentLogger, clock: 'manual' });
  const o = new JobOrchestrator(opts);
  t.teardown(() => o.close());
  await o.migrate();
  o.registerHandler('ev.newer', {}, () => ({ ok: true }));
  const run = await o.start('ev.newer', {});
  const c = await o.claimNext('batch');
  t.is(c?.id, run.id);
  await o.tick(run.id);
  const admin = await adminClient(t);
  // Five events only a newer version knows, then a known one after them.
  await admin.query(
    `INSERT INTO "${opts.postgres?.schema}".job_event (run_id, at, kind, attempt, data)
     SELECT $1, now(), 'from_a_newer_version', 1, NULL FROM generate_series(1, 5)`,
    [run.id],
  );
  await o.replay(run.id);
  const types: string[] = [];
  let cursor: string | undefined;
  for (let pages = 0; pages < 20; pages++) {
    const page = await o.listRunEvents(run.id, { cursor, limit: 2 });
    types.push(...page.items.map((e) => e.type));
    if (page.nextCursor === null) break;
    cursor = page.nextCursor;
  }
  t.deepEqual(types, ['created', 'started', 'completed', 'replayed']);
});
