/**
 * CONTRACT.md, rule by rule: rows, registration, start (steps 1–6),
 * claimNext, tick (outcomes, retries, timeouts, steps, spawnChild),
 * cancel and the parent-close cascade, replay, queries, errors.
 * Every test runs on both backends (memory and PostgreSQL, see backends.ts).
 */
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import * as path from 'node:path';
import {
  JobClockError,
  JobCollisionError,
  JobHandlerBase,
  JobInputInvalidError,
  JobKeyFunctionUnavailableError,
  JobNotReplayableError,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepTimeoutError,
  JobTemplateFieldMissingError,
  JobTypeNotFoundError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from '../dist';
import type { JobContext, JobLogger, JobRun } from '../dist';
import {
  DEFINITION_FIELDS,
  RUN_DATE_FIELDS,
  RUN_FIELDS,
  STEP_FIELDS,
  UUID_V4,
  advanceUntil,
  claim,
  claimAll,
  codedError,
  get,
  hanging,
  nextTurn,
  realSleep,
  runNext,
  statusOf,
  stepsById,
  waitFor,
} from './helpers';
import { forBackends } from './backends';
import type { Make } from './backends';

type Input = Record<string, unknown>;
const ok = async (): Promise<Record<string, never>> => ({});
const asRecord = (v: unknown): Record<string, unknown> => v as Record<string, unknown>;
const ms = (d: Date | null): number => {
  if (d === null) throw new Error('expected a Date, got null');
  return d.getTime();
};

// ─── Rows ───────────────────────────────────────────────────────────────────

forBackends('row: every JobRun field is present at every stage and none is undefined', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('row.shape', {}, async () => ({ done: true }));
  const started = await o.start('row.shape', { a: 1 });
  const rows: JobRun[] = [started, await get(o, started.id)];
  const claimed = await claim(o);
  rows.push(claimed);
  await o.tick(claimed.id);
  rows.push(await get(o, started.id));
  for (const r of rows) {
    t.deepEqual(Object.keys(r).sort(), [...RUN_FIELDS].sort());
    for (const f of RUN_FIELDS) t.not(asRecord(r)[f], undefined, `field ${f} is undefined`);
  }
});

forBackends('row: a new root run — uuid v4 id, rootRunId === id, nulls for absent values, Dates', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('row.root', {}, ok);
  const now = o.now();
  const r = await o.start('row.root', { a: 1 });
  t.regex(r.id, UUID_V4);
  t.is(r.rootRunId, r.id);
  t.is(r.parentRunId, null);
  t.is(r.jobType, 'row.root');
  t.is(r.jobVersion, 1);
  t.is(r.status, 'pending');
  t.deepEqual(r.input, { a: 1 });
  t.is(r.attempts, 0);
  for (const f of ['output', 'error', 'startedAt', 'finishedAt', 'claimedAt', 'waitKind', 'resumeToken', 'waitDeadline',
    'scopeEntityType', 'scopeEntityId', 'tenantId', 'concurrencyKey', 'dedupeKey', 'triggerRef'] as const) {
    t.is(r[f], null, `${f} should be null`);
  }
  for (const f of ['runAt', 'createdAt', 'updatedAt'] as const) {
    t.true(r[f] instanceof Date, `${f} is a Date`);
    t.is(r[f].getTime(), now.getTime(), `${f} is now`);
  }
  const again = await o.start('row.root', { a: 1 });
  t.not(again.id, r.id);
  t.regex(again.id, UUID_V4);
});

forBackends('row: timestamps of a finished run are Dates (claimedAt/startedAt at claim, finishedAt at the end)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('row.times', {}, async () => {
    o.advanceTime(250);
    return { ok: true };
  });
  const r = await o.start('row.times', {});
  o.advanceTime(1000);
  const claimedAt = o.now().getTime();
  const done = await runNext(o);
  for (const f of RUN_DATE_FIELDS) {
    const v = done[f];
    if (f === 'waitDeadline') t.is(v, null);
    else t.true(v instanceof Date && !Number.isNaN(v.getTime()), `${f} is a valid Date`);
  }
  t.is(ms(done.claimedAt), claimedAt);
  t.is(ms(done.startedAt), claimedAt);
  t.is(ms(done.finishedAt), claimedAt + 250);
  t.is(done.createdAt.getTime(), r.createdAt.getTime());
});

forBackends('row: a JobStep row has every field, kind task, null not undefined, Dates', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('row.step', {}, async (ctx) => {
    await ctx.step('one', async () => ({ x: 1 }));
    return {};
  });
  const r = await o.start('row.step', {});
  await runNext(o);
  const steps = await o.listSteps(r.id);
  t.is(steps.length, 1);
  const s = steps[0]!;
  t.deepEqual(Object.keys(s).sort(), [...STEP_FIELDS].sort());
  for (const f of STEP_FIELDS) t.not(asRecord(s)[f], undefined, `step field ${f}`);
  t.regex(s.id, UUID_V4);
  t.is(s.jobRunId, r.id);
  t.is(s.stepId, 'one');
  t.is(s.kind, 'task');
  t.is(s.seq, 1);
  t.is(s.status, 'completed');
  t.deepEqual(s.output, { x: 1 });
  t.is(s.error, null);
  t.is(s.attempts, 1);
  t.true(s.startedAt instanceof Date);
  t.true(s.finishedAt instanceof Date);
});

forBackends('definition: defaults for empty meta (pool batch, retry 1/fixed/0, queue, last_checkpoint, priority 0, version 1)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('def.defaults', {}, ok);
  const d = await o.getDefinition('def.defaults');
  if (d === null) return t.fail('definition missing');
  t.deepEqual(Object.keys(d).sort(), [...DEFINITION_FIELDS].sort());
  t.is(d.type, 'def.defaults');
  t.is(d.version, 1);
  t.is(d.pool, 'batch');
  t.is(d.scopeEntityType, null);
  t.is(d.retryPolicy.attempts, 1);
  t.is(d.retryPolicy.backoff, 'fixed');
  t.is(d.retryPolicy.baseMs, 0);
  t.is(d.timeoutMs, null);
  t.is(d.concurrencyKeyTemplate, null);
  t.is(d.collisionMode, 'queue');
  t.is(d.dedupeKeyTemplate, null);
  t.is(d.dedupeWindowMs, null);
  t.is(d.priorityDefault, 0);
  t.is(d.replayFrom, 'last_checkpoint');
  t.true(d.createdAt instanceof Date);
  t.true(d.updatedAt instanceof Date);
  t.is(await o.getDefinition('def.unknown'), null);
});

forBackends('definition: reflects meta; function keys are stored as the template <fn>', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ id: string; acct: string }>(
    'def.full',
    {
      pool: 'emails',
      scope: { entity: 'invoice', from: (i) => i.id },
      retry: { attempts: 4, backoff: 'exponential', baseMs: 50, nonRetryableErrors: ['Fatal'] },
      concurrency: { key: 'acct:{{acct}}', collisionMode: 'reject' },
      dedupe: { key: 'inv:{{id}}', windowMs: 60_000 },
      timeoutMs: 5000,
      replayFrom: 'scratch',
    },
    ok,
  );
  const d = await o.getDefinition('def.full');
  if (d === null) return t.fail('definition missing');
  t.is(d.pool, 'emails');
  t.is(d.scopeEntityType, 'invoice');
  t.deepEqual(d.retryPolicy, { attempts: 4, backoff: 'exponential', baseMs: 50, nonRetryableErrors: ['Fatal'] });
  t.is(d.concurrencyKeyTemplate, 'acct:{{acct}}');
  t.is(d.collisionMode, 'reject');
  t.is(d.dedupeKeyTemplate, 'inv:{{id}}');
  t.is(d.dedupeWindowMs, 60_000);
  t.is(d.timeoutMs, 5000);
  t.is(d.replayFrom, 'scratch');

  o.registerHandler<{ acct: string }>(
    'def.fn',
    {
      concurrency: { key: (i) => `acct:${i.acct}`, collisionMode: 'replace' },
      dedupe: { key: (i) => `d:${i.acct}`, windowMs: 10 },
    },
    ok,
  );
  const f = await o.getDefinition('def.fn');
  t.is(f?.concurrencyKeyTemplate, '<fn>');
  t.is(f?.dedupeKeyTemplate, '<fn>');
  t.is(f?.collisionMode, 'replace');
  // the function itself is what computes the run's key
  const r = await o.start('def.fn', { acct: 'A7' });
  t.is(r.concurrencyKey, 'acct:A7');
  t.is(r.dedupeKey, 'd:A7');
});

forBackends('registerHandler replaces the definition and the handler of a type', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('re.reg', { pool: 'p1' }, async () => ({ v: 1 }));
  const first = await o.getDefinition('re.reg');
  o.advanceTime(10);
  o.registerHandler('re.reg', { pool: 'p2' }, async () => ({ v: 2 }));
  const d = await o.getDefinition('re.reg');
  t.is(d?.pool, 'p2');
  t.true((d?.updatedAt.getTime() ?? 0) >= (first?.updatedAt.getTime() ?? Infinity));
  const r = await o.start('re.reg', {});
  t.is(r.pool, 'p2');
  t.deepEqual((await runNext(o, 'p2')).output, { v: 2 });
  t.is(o.getHandlerRegistration('re.reg')?.meta.pool, 'p2');
});

forBackends('handlers: a class with run(ctx), an async function and an object with run all execute', async (t, make) => {
  const o = await make.manual();
  class Doubler extends JobHandlerBase<{ n: number }, { n: number }> {
    async run(ctx: JobContext<{ n: number }>): Promise<{ n: number }> {
      return { n: ctx.input.n * 2 };
    }
  }
  o.registerHandler('h.class', {}, Doubler);
  o.registerHandler<{ n: number }>('h.fn', {}, async (ctx) => ({ n: ctx.input.n + 1 }));
  o.registerHandler<{ n: number }>('h.obj', {}, { run: async (ctx) => ({ n: ctx.input.n - 1 }) });
  const a = await o.start('h.class', { n: 5 });
  const b = await o.start('h.fn', { n: 5 });
  const c = await o.start('h.obj', { n: 5 });
  for (let i = 0; i < 3; i++) await runNext(o);
  t.deepEqual((await get(o, a.id)).output, { n: 10 });
  t.deepEqual((await get(o, b.id)).output, { n: 6 });
  t.deepEqual((await get(o, c.id)).output, { n: 4 });
});

forBackends('upsertJobRows registers every entry and returns {orphaned: []}', async (t, make) => {
  const o = await make.manual();
  class A extends JobHandlerBase {
    async run(): Promise<unknown> {
      return { from: 'A' };
    }
  }
  class B extends JobHandlerBase {
    async run(): Promise<unknown> {
      return { from: 'B' };
    }
  }
  const res = await o.upsertJobRows(
    [
      { type: 'up.a', meta: { pool: 'pa' }, handlerClass: A },
      { type: 'up.b', meta: { retry: { attempts: 2, backoff: 'fixed', baseMs: 5 } }, handlerClass: B },
    ],
    new Map([['pa', { queue: 'pa', concurrency: 1, reserved: false }]]),
  );
  t.deepEqual(res, { orphaned: [] });
  t.is((await o.getDefinition('up.a'))?.pool, 'pa');
  t.is((await o.getDefinition('up.b'))?.retryPolicy.attempts, 2);
  t.is(o.getHandlerRegistration('up.a')?.handlerClass, A);
  t.is(o.getHandlerRegistration('up.b')?.type, 'up.b');
  await o.start('up.a', {});
  await o.start('up.b', {});
  t.deepEqual((await runNext(o, 'pa')).output, { from: 'A' });
  t.deepEqual((await runNext(o)).output, { from: 'B' });
});

forBackends('registration: malformed meta or handlers are rejected with JobInputInvalidError and change nothing', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('reg.keep', { pool: 'kept' }, async () => ({ v: 'original' }));
  const bad: [string, unknown, unknown][] = [
    ['reg.keep', {}, 42],
    ['reg.keep', {}, { notRun: true }],
    ['reg.keep', { retry: { attempts: 0, backoff: 'fixed', baseMs: 0 } }, ok],
    ['reg.keep', { concurrency: { key: 17 } }, ok],
    ['reg.keep', { timeoutMs: -5 }, ok],
    ['', {}, ok],
  ];
  for (const [type, meta, handler] of bad) {
    t.throws(() => o.registerHandler(type, meta as never, handler as never), { instanceOf: JobInputInvalidError });
  }
  await t.throwsAsync(
    o.upsertJobRows([
      { type: 'reg.new', meta: {}, handlerClass: ok },
      { type: 'reg.keep', meta: {}, handlerClass: 'not a handler' },
    ]),
    { instanceOf: JobInputInvalidError },
  );
  t.is((await o.getDefinition('reg.keep'))?.pool, 'kept');
  await o.start('reg.keep', {});
  t.deepEqual((await runNext(o, 'kept')).output, { v: 'original' });
});

// ─── start: 1. tenant gate ─────────────────────────────────────────────────

forBackends('start 1: multi-tenant start without tenantId → MissingTenantIdError {method: start}, checked before the job type', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('mt.job', {}, ok);
  const e1 = await t.throwsAsync(o.start('mt.job', {}), { instanceOf: MissingTenantIdError });
  t.is(e1.method, 'start');
  t.is(e1.code, 'MISSING_TENANT_ID');
  t.is(e1.name, 'MissingTenantIdError');
  // gate comes first: an unknown type without tenant still reports the tenant
  await t.throwsAsync(o.start('mt.nope', {}), { instanceOf: MissingTenantIdError });
  await t.throwsAsync(o.start('mt.job', {}, { tenantId: undefined }), { instanceOf: MissingTenantIdError });
  t.is(await o.claimNext('batch'), null);
  const cross = await o.start('mt.job', {}, { tenantId: null });
  t.is(cross.tenantId, null);
  const acme = await o.start('mt.job', {}, { tenantId: 'acme' });
  t.is(acme.tenantId, 'acme');
});

forBackends('start 1: single-tenant mode stores tenantId as null and needs none', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('st.job', {}, ok);
  const a = await o.start('st.job', {}, { tenantId: 'acme' });
  t.is(a.tenantId, null);
  const b = await o.start('st.job', {});
  t.is(b.tenantId, null);
  await o.cancel(b.id);
  t.is(await statusOf(o, b.id), 'canceled');
});

// ─── start: 2. unknown type ────────────────────────────────────────────────

forBackends('start 2: unknown job type → JobTypeNotFoundError {jobType}, nothing created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('known', {}, ok);
  const e = await t.throwsAsync(o.start('unknown.type', { a: 1 }), { instanceOf: JobTypeNotFoundError });
  t.is(e.jobType, 'unknown.type');
  t.is(e.code, 'JOB_TYPE_NOT_FOUND');
  t.is(e.name, 'JobTypeNotFoundError');
  t.true(e instanceof Error);
  t.is(await o.claimNext('batch'), null);
});

// ─── start: 3. dedupe ──────────────────────────────────────────────────────

forBackends('start 3: dedupe returns the existing run strictly inside the window, a new run at/after its end', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd.win', { dedupe: { key: 'order:{{orderId}}', windowMs: 1000 } }, ok);
  const a = await o.start('dd.win', { orderId: 7, n: 1 });
  t.is(a.dedupeKey, 'order:7');
  o.advanceTime(999);
  const b = await o.start('dd.win', { orderId: 7, n: 2 });
  t.is(b.id, a.id);
  t.deepEqual(b.input, { orderId: 7, n: 1 }, 'the existing run is returned as is');
  const other = await o.start('dd.win', { orderId: 8 });
  t.not(other.id, a.id);
  o.advanceTime(1); // exactly windowMs after a was created: no longer strictly inside
  const c = await o.start('dd.win', { orderId: 7, n: 3 });
  t.not(c.id, a.id);
  t.deepEqual(c.input, { orderId: 7, n: 3 });
  const d = await o.start('dd.win', { orderId: 7, n: 4 });
  t.is(d.id, c.id);
  t.deepEqual(new Set(await claimAll(o)), new Set([a.id, other.id, c.id]));
});

forBackends('start 3: dedupe ignores canceled and failed runs but not completed (or running) ones', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ k: string; fail?: boolean }>('dd.excl', { dedupe: { key: '{{k}}', windowMs: 60_000 } }, async (ctx) => {
    if (ctx.input.fail) throw new Error('failing on purpose');
    return { ok: true };
  });
  const a = await o.start('dd.excl', { k: 'x' });
  await o.cancel(a.id);
  const b = await o.start('dd.excl', { k: 'x', fail: true });
  t.not(b.id, a.id, 'canceled run is not a dedupe hit');
  const claimedB = await claim(o);
  t.is(claimedB.id, b.id);
  t.is((await o.start('dd.excl', { k: 'x' })).id, b.id, 'running run is a dedupe hit');
  await o.tick(b.id);
  t.is(await statusOf(o, b.id), 'failed');
  const c = await o.start('dd.excl', { k: 'x' });
  t.not(c.id, b.id, 'failed run is not a dedupe hit');
  t.not(c.id, a.id);
  await runNext(o);
  t.is(await statusOf(o, c.id), 'completed');
  const d = await o.start('dd.excl', { k: 'x' });
  t.is(d.id, c.id, 'completed run inside the window is a dedupe hit');
});

forBackends('start 3: dedupe returns the newest matching run', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd.newest', { dedupe: { key: '{{k}}', windowMs: 100 } }, ok);
  const a = await o.start('dd.newest', { k: 1 });
  o.advanceTime(100);
  const b = await o.start('dd.newest', { k: 1 });
  t.not(b.id, a.id);
  o.advanceTime(10);
  // widen the window so both runs are inside it
  o.registerHandler('dd.newest', { dedupe: { key: '{{k}}', windowMs: 10_000 } }, ok);
  const c = await o.start('dd.newest', { k: 1 });
  t.is(c.id, b.id);
});

forBackends('start 3: dedupe is per job type and key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd.t1', { dedupe: { key: '{{k}}', windowMs: 10_000 } }, ok);
  o.registerHandler('dd.t2', { dedupe: { key: '{{k}}', windowMs: 10_000 } }, ok);
  const a = await o.start('dd.t1', { k: 1 });
  const b = await o.start('dd.t2', { k: 1 });
  t.not(b.id, a.id);
  t.is(b.dedupeKey, a.dedupeKey);
  t.is((await o.start('dd.t1', { k: 1 })).id, a.id);
  t.is((await o.start('dd.t2', { k: 1 })).id, b.id);
});

forBackends('start 3: dedupe with a function key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ user: string }>('dd.fn', { dedupe: { key: (i) => `u-${i.user.toLowerCase()}`, windowMs: 500 } }, ok);
  const a = await o.start('dd.fn', { user: 'Bob' });
  t.is(a.dedupeKey, 'u-bob');
  t.is((await o.start('dd.fn', { user: 'BOB' })).id, a.id);
  o.advanceTime(500);
  t.not((await o.start('dd.fn', { user: 'bob' })).id, a.id);
});

forBackends('start 3 before 4: a dedupe hit returns the run instead of a reject collision', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd.rej', { dedupe: { key: '{{k}}', windowMs: 1000 }, concurrency: { key: '{{k}}', collisionMode: 'reject' } }, ok);
  const a = await o.start('dd.rej', { k: 1 });
  const b = await o.start('dd.rej', { k: 1 });
  t.is(b.id, a.id);
  o.advanceTime(1000);
  const e = await t.throwsAsync(o.start('dd.rej', { k: 1 }), { instanceOf: JobCollisionError });
  t.is(e.incumbent.id, a.id);
});

// ─── start: 4. concurrency ─────────────────────────────────────────────────

forBackends('start 4: reject (template key) → JobCollisionError {jobType, concurrencyKey, incumbent}, nothing created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cc.rej', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'reject' } }, ok);
  const a = await o.start('cc.rej', { acct: 1 });
  t.is(a.concurrencyKey, 'acct:1');
  const e = await t.throwsAsync(o.start('cc.rej', { acct: 1, extra: true }), { instanceOf: JobCollisionError });
  t.is(e.name, 'JobCollisionError');
  t.is(e.code, 'JOB_COLLISION');
  t.is(e.jobType, 'cc.rej');
  t.is(e.concurrencyKey, 'acct:1');
  t.is(e.incumbent.id, a.id);
  t.is(e.incumbent.status, 'pending');
  t.true(e.incumbent.createdAt instanceof Date, 'incumbent is a row with Dates');
  t.deepEqual(e.incumbent.input, { acct: 1 });
  const other = await o.start('cc.rej', { acct: 2 });
  t.deepEqual(await claimAll(o), [a.id, other.id], 'the rejected start created nothing');
  // a running incumbent also rejects; once terminal the key is free again
  await t.throwsAsync(o.start('cc.rej', { acct: 1 }), { instanceOf: JobCollisionError });
  await o.tick(a.id);
  t.is(await statusOf(o, a.id), 'completed');
  const c = await o.start('cc.rej', { acct: 1 });
  t.is(c.status, 'pending');
});

forBackends('start 4: reject with a function key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ acct: number }>('cc.rejfn', { concurrency: { key: (i) => `fn:${i.acct}`, collisionMode: 'reject' } }, ok);
  const a = await o.start('cc.rejfn', { acct: 3 });
  t.is(a.concurrencyKey, 'fn:3');
  const e = await t.throwsAsync(o.start('cc.rejfn', { acct: 3 }), { instanceOf: JobCollisionError });
  t.is(e.concurrencyKey, 'fn:3');
  t.is(e.incumbent.id, a.id);
  await o.cancel(a.id);
  t.is((await o.start('cc.rejfn', { acct: 3 })).status, 'pending');
});

forBackends('start 4: replace (template key) cancels the lane with cascade and the new run is claimable', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('cc.rep', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'replace' } }, h.handler);
  o.registerHandler('leaf', {}, ok);
  const a = await o.start('cc.rep', { acct: 1 });
  const child = await o.start('leaf', {}, { parentRunId: a.id });
  await claim(o); // a
  const tick = o.tick(a.id);
  const att = await h.entered();
  const b = await o.start('cc.rep', { acct: 1 });
  t.not(b.id, a.id);
  t.is(b.status, 'pending');
  const aRow = await get(o, a.id);
  t.is(aRow.status, 'canceled');
  t.is(await statusOf(o, child.id), 'canceled', 'the incumbent was canceled with cascade');
  await waitFor(() => att.signal.aborted, 'replaced running run signal');
  await tick;
  t.deepEqual(await claimAll(o), [b.id]);
});

forBackends('start 4: replace with a function key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ acct: number }>('cc.repfn', { concurrency: { key: (i) => `r${i.acct}`, collisionMode: 'replace' } }, ok);
  const a = await o.start('cc.repfn', { acct: 1 });
  const other = await o.start('cc.repfn', { acct: 2 });
  const b = await o.start('cc.repfn', { acct: 1 });
  t.is(await statusOf(o, a.id), 'canceled');
  t.is(await statusOf(o, other.id), 'pending', 'another key is untouched');
  t.is(b.concurrencyKey, 'r1');
  t.deepEqual(new Set(await claimAll(o)), new Set([other.id, b.id]));
});

forBackends('start 4: queue (template key) — the new run waits at the lane tail and runs after the incumbent', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cc.q', { concurrency: { key: 'lane:{{k}}' } }, ok);
  const a = await o.start('cc.q', { k: 1 });
  const b = await o.start('cc.q', { k: 1 });
  const c = await o.start('cc.q', { k: 2 });
  t.is(b.status, 'pending');
  t.is(b.concurrencyKey, 'lane:1');
  t.deepEqual(await claimAll(o), [a.id, c.id], 'b waits behind a');
  await o.tick(a.id);
  t.deepEqual(await claimAll(o), [b.id]);
});

forBackends('start 4: queue with a function key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ k: number }>('cc.qfn', { concurrency: { key: (i) => `q${i.k % 2}`, collisionMode: 'queue' } }, ok);
  const a = await o.start('cc.qfn', { k: 1 });
  const b = await o.start('cc.qfn', { k: 3 }); // same key q1
  const c = await o.start('cc.qfn', { k: 2 });
  t.is(b.concurrencyKey, 'q1');
  t.deepEqual(await claimAll(o), [a.id, c.id]);
  await o.tick(a.id);
  t.deepEqual(await claimAll(o), [b.id]);
});

forBackends('start 4: a lane holds every non-terminal run with the key string, whatever its job type', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('lane.qa', { concurrency: { key: 'acct:{{acct}}' } }, ok);
  o.registerHandler<{ acct: number }>('lane.qb', { concurrency: { key: (i) => `acct:${i.acct}` } }, ok);
  o.registerHandler('lane.rb', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'reject' } }, ok);
  o.registerHandler('lane.rp', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'replace' } }, ok);
  const a = await o.start('lane.qa', { acct: 1 });
  const b = await o.start('lane.qb', { acct: 1 });
  const e = await t.throwsAsync(o.start('lane.rb', { acct: 1 }), { instanceOf: JobCollisionError });
  t.is(e.jobType, 'lane.rb');
  t.is(e.incumbent.jobType, 'lane.qa');
  t.is(e.incumbent.id, a.id);
  t.deepEqual(await claimAll(o), [a.id], 'the lane.qb run waits behind the lane.qa run');
  await o.tick(a.id);
  t.deepEqual(await claimAll(o), [b.id]);
  const c = await o.start('lane.rp', { acct: 1 });
  t.is(await statusOf(o, b.id), 'canceled', 'replace of another type clears the shared lane');
  t.deepEqual(await claimAll(o), [c.id]);
});

// ─── start: 5. lineage ─────────────────────────────────────────────────────

forBackends('start 5: a child gets its parent id and the parent\'s rootRunId, down the tree', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('lin', {}, ok);
  const root = await o.start('lin', {});
  const child = await o.start('lin', {}, { parentRunId: root.id });
  const grand = await o.start('lin', {}, { parentRunId: child.id });
  t.is(child.parentRunId, root.id);
  t.is(child.rootRunId, root.id);
  t.not(child.id, child.rootRunId);
  t.is(grand.parentRunId, child.id);
  t.is(grand.rootRunId, root.id);
});

forBackends('start 5: multi-tenant — a child without tenantId gets its parent\'s tenant', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('lin.mt', {}, ok);
  const root = await o.start('lin.mt', {}, { tenantId: 'acme' });
  const child = await o.start('lin.mt', {}, { parentRunId: root.id });
  t.is(child.tenantId, 'acme');
  t.is(child.rootRunId, root.id);
  const explicit = await o.start('lin.mt', {}, { parentRunId: child.id, tenantId: 'acme' });
  t.is(explicit.tenantId, 'acme');
  t.is(explicit.rootRunId, root.id);
});

forBackends('start 5: unknown parentRunId → ParentRunNotFoundError {parentRunId}, nothing created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('lin.bad', {}, ok);
  const missing = randomUUID();
  const e = await t.throwsAsync(o.start('lin.bad', {}, { parentRunId: missing }), { instanceOf: ParentRunNotFoundError });
  t.is(e.parentRunId, missing);
  t.is(e.code, 'PARENT_RUN_NOT_FOUND');
  t.is(e.name, 'ParentRunNotFoundError');
  const e2 = await t.throwsAsync(o.start('lin.bad', {}, { parentRunId: 'not-a-uuid' }), { instanceOf: ParentRunNotFoundError });
  t.is(e2.parentRunId, 'not-a-uuid');
  t.is(await o.claimNext('batch'), null);
});

forBackends('start: checks are atomic — a replace start that fails lineage cancels nothing', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('atom.rep', { concurrency: { key: '{{k}}', collisionMode: 'replace' } }, ok);
  const a = await o.start('atom.rep', { k: 1 });
  await t.throwsAsync(o.start('atom.rep', { k: 1 }, { parentRunId: randomUUID() }), { instanceOf: ParentRunNotFoundError });
  t.is(await statusOf(o, a.id), 'pending');
  t.deepEqual(await claimAll(o), [a.id]);
});

// ─── start: 6. create ──────────────────────────────────────────────────────

forBackends('start 6: defaults — pool from the definition, priority 0, runAt now, manual trigger, terminate, no scope', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cr.def', { pool: 'emails' }, ok);
  const now = o.now().getTime();
  const r = await o.start('cr.def', { x: 1 });
  t.is(r.pool, 'emails');
  t.is(r.priority, 0);
  t.is(r.runAt.getTime(), now);
  t.is(r.triggerSource, 'manual');
  t.is(r.triggerRef, null);
  t.is(r.parentClosePolicy, 'terminate');
  t.is(r.scopeEntityType, null);
  t.is(r.scopeEntityId, null);
  t.deepEqual(r.tags, {});
});

forBackends('start 6: options override pool, priority, runAt, tags, trigger, close policy and scope', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cr.opts', { pool: 'emails', scope: { entity: 'meta-entity', from: () => 'meta-id' } }, ok);
  const runAt = new Date(o.now().getTime() + 60_000);
  const r = await o.start(
    'cr.opts',
    { x: 1 },
    {
      pool: 'reports',
      priority: 9,
      runAt,
      tags: { team: 'billing' },
      triggerSource: 'event',
      triggerRef: 'evt-42',
      parentClosePolicy: 'abandon',
      scope: { entityType: 'invoice', entityId: 'inv-1' },
    },
  );
  t.is(r.pool, 'reports');
  t.is(r.priority, 9);
  t.is(r.runAt.getTime(), runAt.getTime());
  t.deepEqual(r.tags, { team: 'billing' });
  t.is(r.triggerSource, 'event');
  t.is(r.triggerRef, 'evt-42');
  t.is(r.parentClosePolicy, 'abandon');
  t.is(r.scopeEntityType, 'invoice', 'opts.scope wins over meta.scope');
  t.is(r.scopeEntityId, 'inv-1');
  const stored = await get(o, r.id);
  t.deepEqual(stored, r);
});

forBackends('start 6: scope comes from meta.scope (entity + from(input)) when opts.scope is absent', async (t, make) => {
  const o = await make.manual();
  const seen: unknown[] = [];
  o.registerHandler<{ invoiceId: string }>(
    'cr.scope',
    {
      scope: {
        entity: 'invoice',
        from: (i) => {
          seen.push(i);
          return `inv-${i.invoiceId}`;
        },
      },
    },
    ok,
  );
  const r = await o.start('cr.scope', { invoiceId: '9' });
  t.is(r.scopeEntityType, 'invoice');
  t.is(r.scopeEntityId, 'inv-9');
  t.deepEqual(seen, [{ invoiceId: '9' }]);
  t.is((await o.getDefinition('cr.scope'))?.scopeEntityType, 'invoice');
});

forBackends('start: a template field that is missing, undefined or null → JobTemplateFieldMissingError {template, field}, nothing created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tpl.cc', { concurrency: { key: 'lane:{{k}}', collisionMode: 'reject' } }, ok);
  o.registerHandler('tpl.dd', { dedupe: { key: 'dd-{{ d }}-x', windowMs: 1000 } }, ok);
  for (const input of [{}, { k: undefined }, { k: null }, { other: 1 }] as Input[]) {
    const e = await t.throwsAsync(o.start('tpl.cc', input), { instanceOf: JobTemplateFieldMissingError });
    t.is(e.template, 'lane:{{k}}');
    t.is(e.field, 'k');
    t.is(e.code, 'JOB_TEMPLATE_FIELD_MISSING');
    t.is(e.name, 'JobTemplateFieldMissingError');
  }
  for (const input of [undefined, {}, { d: undefined }, { d: null }] as (Input | undefined)[]) {
    const e = await t.throwsAsync(o.start('tpl.dd', input), { instanceOf: JobTemplateFieldMissingError });
    t.is(e.template, 'dd-{{ d }}-x');
    t.is(e.field, 'd');
  }
  t.is(await o.claimNext('batch'), null, 'nothing was created');
  // falsy but present values are fine
  const zero = await o.start('tpl.cc', { k: 0 });
  t.is(zero.concurrencyKey, 'lane:0');
  const no = await o.start('tpl.cc', { k: false });
  t.is(no.concurrencyKey, 'lane:false');
  const empty = await o.start('tpl.dd', { d: '' });
  t.is(empty.dedupeKey, 'dd--x');
});

forBackends('start: input that is not a JSON value → JobInputInvalidError {reason}, nothing created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('inp.bad', { dedupe: { key: 'k', windowMs: 60_000 } }, ok);
  const cyclic: Input = { a: 1 };
  cyclic.self = cyclic;
  const deep: { a: { b: unknown[] } } = { a: { b: [] } };
  deep.a.b.push(deep);
  const bad: unknown[] = [() => 1, Symbol('s'), 10n, { n: 10n }, { f: () => 1 }, { s: Symbol('t') }, [1, 2n], cyclic, deep];
  for (const input of bad) {
    const e = await t.throwsAsync(o.start('inp.bad', input), { instanceOf: JobInputInvalidError });
    t.is(e.code, 'JOB_INPUT_INVALID');
    t.is(e.name, 'JobInputInvalidError');
    t.is(typeof e.reason, 'string');
    t.true(e.reason.length > 0);
  }
  t.is(await o.claimNext('batch'), null, 'nothing was created');
  // no dedupe entry was left behind either: a valid start creates a fresh run
  const good = await o.start('inp.bad', { fine: true });
  t.deepEqual(good.input, { fine: true });
  t.deepEqual(await claimAll(o), [good.id]);
});

forBackends('start: a missing input is stored as {}', async (t, make) => {
  const o = await make.manual();
  const seen: unknown[] = [];
  o.registerHandler('inp.none', {}, async (ctx) => {
    seen.push(ctx.input);
    return {};
  });
  const a = await o.start('inp.none');
  const b = await o.start('inp.none', undefined);
  t.deepEqual(a.input, {});
  t.deepEqual(b.input, {});
  t.deepEqual((await get(o, a.id)).input, {});
  await runNext(o);
  t.deepEqual(seen, [{}]);
});

forBackends('start: an exception thrown by a key function reaches the caller unchanged and nothing is created', async (t, make) => {
  const o = await make.manual();
  const boom = new Error('key function exploded');
  o.registerHandler<{ acct?: number }>(
    'fk.cc',
    {
      concurrency: {
        key: (i) => {
          if (i.acct === undefined) throw boom;
          return `a${i.acct}`;
        },
        collisionMode: 'reject',
      },
    },
    ok,
  );
  const e = await t.throwsAsync(o.start('fk.cc', {}), { is: boom });
  t.is(e.message, 'key function exploded');
  // a non-Error throw is passed through as is too
  o.registerHandler('fk.dd', { dedupe: { key: () => { throw 'plain string'; }, windowMs: 10 } }, ok);
  const thrown = await o.start('fk.dd', {}).then(
    () => 'resolved',
    (err: unknown) => err,
  );
  t.is(thrown, 'plain string');
  const scopeErr = new RangeError('no scope');
  o.registerHandler('fk.scope', { scope: { entity: 'x', from: () => { throw scopeErr; } } }, ok);
  await t.throwsAsync(o.start('fk.scope', {}), { is: scopeErr });
  t.is(await o.claimNext('batch'), null, 'nothing was created');
  t.is((await o.getDefinition('fk.cc'))?.concurrencyKeyTemplate, '<fn>');
  t.is((await o.getDefinition('fk.dd'))?.dedupeKeyTemplate, '<fn>');
  // the key is free: a successful start is not rejected by a phantom run
  const ok1 = await o.start('fk.cc', { acct: 1 });
  t.is(ok1.concurrencyKey, 'a1');
});

forBackends('start: the tenant gate precedes a throwing key function', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const boom = new Error('key fn');
  o.registerHandler('fk.mt', { concurrency: { key: () => { throw boom; } } }, ok);
  await t.throwsAsync(o.start('fk.mt', {}), { instanceOf: MissingTenantIdError });
  await t.throwsAsync(o.start('fk.mt', {}, { tenantId: 't1' }), { is: boom });
});

forBackends('start: malformed options are JobInputInvalidError and leave the store working', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('opt.bad', {}, ok);
  const bad = [
    { priority: 1.5 },
    { runAt: new Date(Number.NaN) },
    { triggerSource: 'bogus' },
    { parentClosePolicy: 'nope' },
    { pool: '' },
  ];
  for (const opts of bad) {
    await t.throwsAsync(o.start('opt.bad', {}, opts as never), { instanceOf: JobInputInvalidError });
  }
  t.is(await o.claimNext('batch'), null);
  const r = await o.start('opt.bad', { fine: 1 });
  t.is((await runNext(o)).id, r.id);
  t.is(await statusOf(o, r.id), 'completed');
});

// ─── claimNext ─────────────────────────────────────────────────────────────

forBackends('claimNext: highest priority, then earliest runAt, then earliest created', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cl.order', {}, ok);
  const now = o.now().getTime();
  const at = (d: number): Date => new Date(now + d);
  const low1 = await o.start('cl.order', { n: 'low1' }, { runAt: at(0) });
  const high = await o.start('cl.order', { n: 'high' }, { priority: 5, runAt: at(0) });
  const early = await o.start('cl.order', { n: 'early' }, { runAt: at(-1000) });
  const low2 = await o.start('cl.order', { n: 'low2' }, { runAt: at(0) });
  const neg = await o.start('cl.order', { n: 'neg' }, { priority: -1, runAt: at(-5000) });
  const highLate = await o.start('cl.order', { n: 'highLate' }, { priority: 5, runAt: at(-1) });
  t.deepEqual(await claimAll(o), [highLate.id, high.id, early.id, low1.id, low2.id, neg.id]);
});

forBackends('claimNext: a future runAt is not claimable until the clock reaches it', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cl.future', {}, ok);
  const due = new Date(o.now().getTime() + 1000);
  const f = await o.start('cl.future', {}, { runAt: due });
  t.is(await o.claimNext('batch'), null);
  o.advanceTime(999);
  t.is(await o.claimNext('batch'), null);
  o.advanceTime(1);
  const c = await claim(o);
  t.is(c.id, f.id);
  t.is(c.runAt.getTime(), due.getTime());
});

forBackends('claimNext: runs of other pools are invisible', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cl.pool', { pool: 'emails' }, ok);
  o.registerHandler('cl.batch', {}, ok);
  const e = await o.start('cl.pool', {});
  const r = await o.start('cl.pool', {}, { pool: 'reports' });
  const b = await o.start('cl.batch', {});
  t.deepEqual(await claimAll(o, 'batch'), [b.id]);
  t.deepEqual(await claimAll(o, 'nowhere'), []);
  t.deepEqual(await claimAll(o, 'emails'), [e.id]);
  t.deepEqual(await claimAll(o, 'reports'), [r.id]);
});

forBackends('claimNext: the claimed run becomes running with claimedAt = startedAt = now', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cl.state', {}, ok);
  const r = await o.start('cl.state', {});
  o.advanceTime(500);
  const now = o.now().getTime();
  const c = await claim(o);
  t.is(c.id, r.id);
  t.is(c.status, 'running');
  t.is(ms(c.claimedAt), now);
  t.is(ms(c.startedAt), now);
  t.is(c.runAt.getTime(), r.runAt.getTime());
  t.deepEqual(await get(o, r.id), c);
  t.is(await o.claimNext('batch'), null, 'a running run is not claimed twice');
});

// ─── tick ──────────────────────────────────────────────────────────────────

forBackends('tick: a run that is not running → JobRunStateError {runId, status}', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tk.state', {}, ok);
  const r = await o.start('tk.state', {});
  const e = await t.throwsAsync(o.tick(r.id), { instanceOf: JobRunStateError });
  t.is(e.runId, r.id);
  t.is(e.status, 'pending');
  t.is(e.code, 'JOB_RUN_STATE');
  t.is(e.name, 'JobRunStateError');
  await runNext(o);
  const e2 = await t.throwsAsync(o.tick(r.id), { instanceOf: JobRunStateError });
  t.is(e2.status, 'completed');
  const c = await o.start('tk.state', {});
  await o.cancel(c.id);
  t.is((await t.throwsAsync(o.tick(c.id), { instanceOf: JobRunStateError })).status, 'canceled');
  t.is(await statusOf(o, r.id), 'completed', 'the failed tick changed nothing');
});

forBackends('tick: resolve → completed with the output (undefined/null become {}), attempts + 1, finishedAt = now', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ ret: string }>('tk.out', {}, async (ctx) => {
    if (ctx.input.ret === 'undefined') return undefined;
    if (ctx.input.ret === 'null') return null;
    return { sum: 3, nested: { list: [1, 'two'] } };
  });
  const a = await o.start('tk.out', { ret: 'value' });
  const b = await o.start('tk.out', { ret: 'undefined' });
  const c = await o.start('tk.out', { ret: 'null' });
  o.advanceTime(40);
  for (let i = 0; i < 3; i++) await runNext(o);
  const ra = await get(o, a.id);
  t.is(ra.status, 'completed');
  t.deepEqual(ra.output, { sum: 3, nested: { list: [1, 'two'] } });
  t.is(ra.attempts, 1);
  t.is(ra.error, null);
  t.is(ms(ra.finishedAt), o.now().getTime());
  t.deepEqual((await get(o, b.id)).output, {});
  t.deepEqual((await get(o, c.id)).output, {});
});

forBackends('tick: the handler gets ctx.input, ctx.run (the running row), ctx.logger and an unfired ctx.signal', async (t, make) => {
  const logs: string[] = [];
  const loggerRuns: string[] = [];
  const o = await make({
    clock: 'manual',
    loggerFactory: (run) => {
      loggerRuns.push(run.id);
      const rec = (level: string) => (m: unknown) => {
        logs.push(`${level}:${String(m)}`);
      };
      const l: JobLogger = { log: rec('log'), warn: rec('warn'), error: rec('error'), debug: rec('debug') };
      return l;
    },
  });
  let seen: JobContext<unknown> | undefined;
  o.registerHandler('tk.ctx', {}, async (ctx) => {
    seen = ctx;
    ctx.logger.log('hello');
    ctx.logger.warn('careful');
    return { aborted: ctx.signal.aborted };
  });
  const r = await o.start('tk.ctx', { p: [1, 2] });
  await runNext(o);
  if (seen === undefined) return t.fail('handler not called');
  t.deepEqual(seen.input, { p: [1, 2] });
  t.is(seen.run.id, r.id);
  t.is(seen.run.status, 'running');
  t.is(seen.run.attempts, 0);
  t.true(seen.run.claimedAt instanceof Date);
  t.true(seen.signal instanceof AbortSignal);
  t.deepEqual((await get(o, r.id)).output, { aborted: false });
  t.deepEqual(logs, ['log:hello', 'warn:careful']);
  t.deepEqual(loggerRuns, [r.id]);
  for (const m of ['log', 'warn', 'error', 'debug'] as const) t.is(typeof seen.logger[m], 'function');
});

forBackends('tick: output = value ?? {} — falsy and non-object JSON values are kept', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ v: unknown }>('tk.vals', {}, async (ctx) => ctx.input.v);
  const values: unknown[] = [0, false, '', 'text', 5, [1, 2], { a: null }];
  const ids: string[] = [];
  for (const v of values) ids.push((await o.start('tk.vals', { v })).id);
  for (let i = 0; i < values.length; i++) await runNext(o);
  for (let i = 0; i < values.length; i++) {
    const row = await get(o, ids[i]!);
    t.is(row.status, 'completed');
    t.deepEqual(row.output as unknown, values[i], JSON.stringify(values[i]));
  }
});

forBackends('tick: a handler output that is not JSON fails the run without harming the store', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tk.badout', {}, async () => {
    const c: Input = {};
    c.c = c;
    return c;
  });
  o.registerHandler('tk.after', {}, async () => ({ fine: true }));
  const r = await o.start('tk.badout', {});
  const done = await runNext(o);
  t.is(done.id, r.id);
  t.is(done.status, 'failed');
  t.is(typeof done.error?.message, 'string');
  await o.start('tk.after', {});
  t.deepEqual((await runNext(o)).output, { fine: true });
});

forBackends('tick: a thrown Error is serialised as {message, stack, retryable, attempt} and the run fails', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tk.fail', {}, async () => {
    throw new TypeError('kaboom');
  });
  const r = await o.start('tk.fail', {});
  const done = await runNext(o);
  t.is(done.id, r.id);
  t.is(done.status, 'failed');
  t.is(done.attempts, 1);
  t.is(done.output, null);
  t.true(done.finishedAt instanceof Date);
  if (done.error === null) return t.fail('no error stored');
  t.is(done.error.message, 'kaboom');
  t.is(typeof done.error.stack, 'string');
  t.true(done.error.stack?.includes('kaboom'));
  t.is(done.error.retryable, false);
  t.is(done.error.attempt, 1);
});

forBackends('tick: a non-Error throw becomes its string form', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ v: string }>('tk.nonerr', {}, async (ctx) => {
    const values: Record<string, unknown> = {
      str: 'plain string',
      num: 42,
      undef: undefined,
      obj: { toString: () => 'custom string form' },
    };
    throw values[ctx.input.v];
  });
  const expected: Record<string, string> = {
    str: 'plain string',
    num: '42',
    undef: 'undefined',
    obj: 'custom string form',
  };
  for (const v of Object.keys(expected)) await o.start('tk.nonerr', { v });
  for (let i = 0; i < 4; i++) {
    const done = await runNext(o);
    const v = String(done.input.v);
    t.is(done.status, 'failed');
    t.is(done.error?.message, expected[v], v);
    t.is(done.error?.attempt, 1);
    t.is(done.error?.retryable, false);
  }
});

forBackends('tick: fixed-backoff retries — pending, runAt = now + baseMs, claim times cleared, error.retryable, then failed', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('rt.fixed', { retry: { attempts: 3, backoff: 'fixed', baseMs: 1000 } }, async () => {
    calls++;
    throw new Error(`fail ${calls}`);
  });
  const r = await o.start('rt.fixed', {});
  for (let attempt = 1; attempt <= 2; attempt++) {
    await runNext(o);
    const row = await get(o, r.id);
    const now = o.now().getTime();
    t.is(row.status, 'pending');
    t.is(row.attempts, attempt);
    t.is(row.runAt.getTime(), now + 1000);
    t.is(row.claimedAt, null);
    t.is(row.startedAt, null);
    t.is(row.finishedAt, null);
    t.deepEqual({ ...row.error, stack: undefined }, { message: `fail ${attempt}`, stack: undefined, retryable: true, attempt });
    t.is(await o.claimNext('batch'), null, 'not claimable before the backoff');
    o.advanceTime(999);
    t.is(await o.claimNext('batch'), null);
    o.advanceTime(1);
  }
  const last = await runNext(o);
  t.is(last.status, 'failed');
  t.is(last.attempts, 3);
  t.is(last.error?.retryable, false);
  t.is(last.error?.attempt, 3);
  t.is(last.error?.message, 'fail 3');
  t.is(calls, 3);
});

forBackends('tick: exponential backoff is baseMs * 2^(attempts-1)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rt.exp', { retry: { attempts: 4, backoff: 'exponential', baseMs: 100 } }, async () => {
    throw new Error('again');
  });
  const r = await o.start('rt.exp', {});
  const delays: number[] = [];
  for (let i = 0; i < 3; i++) {
    await runNext(o);
    const row = await get(o, r.id);
    t.is(row.status, 'pending');
    const d = row.runAt.getTime() - o.now().getTime();
    delays.push(d);
    o.advanceTime(d);
  }
  t.deepEqual(delays, [100, 200, 400]);
  const last = await runNext(o);
  t.is(last.status, 'failed');
  t.is(last.attempts, 4);
});

forBackends('tick: a retry that succeeds ends completed with the attempts counted', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('rt.ok', { retry: { attempts: 3, backoff: 'fixed', baseMs: 0 } }, async () => {
    calls++;
    if (calls < 2) throw new Error('once');
    return { calls };
  });
  const r = await o.start('rt.ok', {});
  await runNext(o);
  t.is(await statusOf(o, r.id), 'pending');
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.is(done.attempts, 2);
  t.deepEqual(done.output, { calls: 2 });
});

forBackends('tick: a huge exponential backoff is capped and still a valid Date', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rt.cap', { retry: { attempts: 3, backoff: 'exponential', baseMs: Number.MAX_SAFE_INTEGER } }, async () => {
    throw new Error('x');
  });
  const r = await o.start('rt.cap', {});
  await runNext(o);
  const row = await get(o, r.id);
  t.is(row.status, 'pending');
  t.false(Number.isNaN(row.runAt.getTime()), 'runAt is a valid Date');
  t.true(row.runAt.getTime() > o.now().getTime() + 1e15, 'runAt is far in the future');
  o.advanceTime(365 * 24 * 3600 * 1000);
  t.is(await o.claimNext('batch'), null);
});

forBackends('tick: nonRetryableErrors matches the error name or code; other errors retry', async (t, make) => {
  const o = await make.manual();
  class FatalError extends Error {
    override name = 'FatalError';
  }
  o.registerHandler<{ kind: string }>(
    'rt.nonretry',
    { retry: { attempts: 5, backoff: 'fixed', baseMs: 0, nonRetryableErrors: ['FatalError', 'E_FATAL'] } },
    async (ctx) => {
      if (ctx.input.kind === 'name') throw new FatalError('by name');
      if (ctx.input.kind === 'code') throw codedError('by code', 'E_FATAL');
      throw new Error('transient');
    },
  );
  const byName = await o.start('rt.nonretry', { kind: 'name' });
  const byCode = await o.start('rt.nonretry', { kind: 'code' });
  const other = await o.start('rt.nonretry', { kind: 'other' });
  for (let i = 0; i < 3; i++) await runNext(o);
  for (const id of [byName.id, byCode.id]) {
    const row = await get(o, id);
    t.is(row.status, 'failed');
    t.is(row.attempts, 1);
    t.is(row.error?.retryable, false);
  }
  const o3 = await get(o, other.id);
  t.is(o3.status, 'pending');
  t.is(o3.error?.retryable, true);
});

forBackends('tick: timeoutMs elapsing with a never-resolving handler → timed_out, signal fired', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('to.run', { timeoutMs: 1000 }, h.handler);
  const r = await o.start('to.run', {});
  await claim(o);
  const tick = o.tick(r.id);
  const att = await h.entered();
  o.advanceTime(999);
  await realSleep(20);
  t.is(await statusOf(o, r.id), 'running', 'not timed out before timeoutMs');
  t.false(att.signal.aborted);
  o.advanceTime(1);
  await tick;
  const row = await get(o, r.id);
  t.is(row.status, 'timed_out');
  t.is(row.attempts, 1);
  t.is(ms(row.finishedAt), o.now().getTime());
  t.regex(row.error?.message ?? '', /time/i);
  t.is(row.error?.retryable, false);
  t.is(row.error?.attempt, 1);
  await waitFor(() => att.signal.aborted, 'signal of the timed-out attempt');
  t.true(att.signal.aborted);
  att.release({ late: true });
  await realSleep(10);
  const after = await get(o, r.id);
  t.is(after.status, 'timed_out', 'a late resolution is ignored');
  t.is(after.output, null);
});

forBackends('tick: timeoutMs on the system clock (real timer, 60 ms)', async (t, make) => {
  const o = await make.system();
  const h = hanging();
  o.registerHandler('to.sys', { timeoutMs: 60 }, h.handler);
  const r = await o.start('to.sys', {});
  await claim(o);
  const began = Date.now();
  await o.tick(r.id);
  const elapsed = Date.now() - began;
  t.true(elapsed >= 55, `timed out after ${elapsed} ms`);
  const row = await get(o, r.id);
  t.is(row.status, 'timed_out');
  t.true(ms(row.finishedAt) - ms(row.startedAt) >= 55);
  await waitFor(() => h.attempts[0]?.signal.aborted === true, 'signal');
});

forBackends('tick: a timeout is retried like any error and ends timed_out when no attempt remains', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('to.retry', { timeoutMs: 500, retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, h.handler);
  const r = await o.start('to.retry', {});
  await claim(o);
  let tick = o.tick(r.id);
  await h.entered(1);
  o.advanceTime(500);
  await tick;
  const mid = await get(o, r.id);
  t.is(mid.status, 'pending');
  t.is(mid.attempts, 1);
  t.is(mid.error?.retryable, true);
  await claim(o);
  tick = o.tick(r.id);
  await h.entered(2);
  o.advanceTime(500);
  await tick;
  const end = await get(o, r.id);
  t.is(end.status, 'timed_out');
  t.is(end.attempts, 2);
  t.is(end.error?.retryable, false);
});

forBackends('tick: no handler for the type → failed with a clear message (reached by dropping the JS handler)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('nh.type', { retry: { attempts: 3, backoff: 'fixed', baseMs: 0 } }, ok);
  // No public API removes a handler; drop it from the orchestrator's private
  // registry so the engine dispatches a run whose handler is gone.
  const handlers = Reflect.get(o, 'handlers') as Map<string, unknown>;
  t.true(handlers.delete('nh.type'));
  const r = await o.start('nh.type', {});
  const done = await runNext(o);
  t.is(done.id, r.id);
  t.is(done.status, 'failed');
  t.regex(done.error?.message ?? '', /handler/i);
  t.regex(done.error?.message ?? '', /nh\.type/);
});

// ─── ctx.step ──────────────────────────────────────────────────────────────

forBackends('ctx.step: a completed step is memoized across ticks — fn is not called again', async (t, make) => {
  const o = await make.manual();
  let aCalls = 0;
  let bCalls = 0;
  o.registerHandler('st.memo', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async (ctx) => {
    const a = await ctx.step('a', async () => {
      aCalls++;
      return { v: aCalls * 10 };
    });
    const b = await ctx.step('b', async () => {
      bCalls++;
      if (bCalls === 1) throw new Error('b flaky');
      return { w: a.v + 1 };
    });
    return { a, b };
  });
  const r = await o.start('st.memo', {});
  await runNext(o);
  let steps = await stepsById(o, r.id);
  t.is(steps.a?.status, 'completed');
  t.is(steps.a?.seq, 1);
  t.is(steps.a?.attempts, 1);
  t.deepEqual(steps.a?.output, { v: 10 });
  t.is(steps.b?.status, 'failed');
  t.is(steps.b?.seq, 2);
  t.is(steps.b?.attempts, 1);
  t.is(steps.b?.error?.message, 'b flaky');
  t.is(await statusOf(o, r.id), 'pending');
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.is(aCalls, 1, 'memoized step a was not re-executed');
  t.is(bCalls, 2);
  t.deepEqual(done.output, { a: { v: 10 }, b: { w: 11 } });
  steps = await stepsById(o, r.id);
  t.is(steps.a?.attempts, 1);
  t.is(steps.b?.status, 'completed');
  t.is(steps.b?.attempts, 2);
  t.is(steps.b?.seq, 2, 'a step keeps its seq across attempts');
  t.deepEqual(steps.b?.output, { w: 11 });
  t.is((await o.listSteps(r.id)).length, 2, 'one row per (run, stepId)');
});

forBackends('ctx.step: the memoized output is the stored one, and a repeated step id in one attempt is memoized too', async (t, make) => {
  const o = await make.manual();
  let counter = 0;
  const results: unknown[] = [];
  o.registerHandler('st.same', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async (ctx) => {
    const first = await ctx.step('s', async () => ({ n: ++counter }));
    const second = await ctx.step('s', async () => ({ n: ++counter }));
    results.push(first, second);
    if (ctx.run.attempts === 0) throw new Error('retry me');
    return {};
  });
  await o.start('st.same', {});
  await runNext(o);
  await runNext(o);
  t.is(counter, 1);
  t.deepEqual(results, [{ n: 1 }, { n: 1 }, { n: 1 }, { n: 1 }]);
});

forBackends('ctx.step: the first attempt gets the output as stored too (a Date as its ISO string), as a retry does; nothing returned is undefined, then null', async (t, make) => {
  const o = await make.manual();
  const seen: unknown[][] = [];
  o.registerHandler('st.stored', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async (ctx) => {
    const d = await ctx.step('d', async () => ({ at: new Date(0), gone: undefined, n: 1 }));
    const u = await ctx.step('u', async () => undefined);
    seen.push([d, u]);
    if (ctx.run.attempts === 0) throw new Error('retry me');
    return {};
  });
  await o.start('st.stored', {});
  await runNext(o);
  await runNext(o);
  const d = { at: '1970-01-01T00:00:00.000Z', n: 1 };
  t.deepEqual(seen, [[d, undefined], [d, null]], 'the same object on the first attempt and on the retry');
  t.false(Object.prototype.hasOwnProperty.call(seen[0][0], 'gone'), 'an undefined field is dropped, as JSON drops it');
});

forBackends('ctx.step: an output that is not JSON fails the step without re-running fn (its work is done), even with a retry policy', async (t, make) => {
  const o = await make.manual();
  class Receipt {
    id = 'r1';
  }
  let calls = 0;
  let caught: unknown;
  o.registerHandler('st.unstorable', {}, async (ctx) => {
    try {
      await ctx.step(
        'send',
        async () => {
          calls++;
          return new Receipt();
        },
        { retry: { attempts: 3, backoff: 'fixed', baseMs: 0 } },
      );
    } catch (e) {
      caught = e;
      throw e;
    }
  });
  const r = await o.start('st.unstorable', {});
  const done = await runNext(o);
  t.is(calls, 1, 'fn ran once');
  t.true(caught instanceof JobInputInvalidError);
  t.regex((caught as Error).message, /step 'send' output is a Receipt instance.*not retried/);
  t.is(done.status, 'failed');
  const steps = await stepsById(o, r.id);
  t.is(steps.send?.status, 'failed');
  t.is(steps.send?.attempts, 1);
  t.is(steps.send?.output, null);
});

forBackends('ctx.step: rows get seq in call order; a step is recorded running while fn runs', async (t, make) => {
  const o = await make.manual();
  const during: unknown[] = [];
  o.registerHandler('st.seq', {}, async (ctx) => {
    await ctx.step('x', () => 1);
    await ctx.step('y', async () => {
      const live = (await o.listSteps(ctx.run.id)).find((s) => s.stepId === 'y');
      during.push({ status: live?.status, attempts: live?.attempts, seq: live?.seq });
      return 2;
    });
    await ctx.step('z', () => 'three');
    return {};
  });
  const r = await o.start('st.seq', {});
  await runNext(o);
  const steps = await o.listSteps(r.id);
  t.deepEqual(
    steps.map((s) => [s.stepId, s.seq, s.status, s.output]),
    [
      ['x', 1, 'completed', 1],
      ['y', 2, 'completed', 2],
      ['z', 3, 'completed', 'three'],
    ],
  );
  t.deepEqual(during, [{ status: 'running', attempts: 1, seq: 2 }]);
});

forBackends('ctx.step: a failing fn records the step failed with its error and rethrows to the handler', async (t, make) => {
  const o = await make.manual();
  let caught: unknown;
  o.registerHandler('st.fail', {}, async (ctx) => {
    try {
      await ctx.step('bad', async () => {
        throw new Error('step broke');
      });
    } catch (e) {
      caught = e;
    }
    return { recovered: true };
  });
  const r = await o.start('st.fail', {});
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.true(caught instanceof Error);
  t.is((caught as Error).message, 'step broke');
  const [s] = await o.listSteps(r.id);
  t.is(s?.status, 'failed');
  t.is(s?.attempts, 1);
  t.is(s?.error?.message, 'step broke');
  t.is(s?.error?.attempt, 1);
  t.is(s?.error?.retryable, false);
  t.true(s?.finishedAt instanceof Date);
});

forBackends('ctx.step: opts.retry retries the step in place and records its attempts', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('st.retry', {}, async (ctx) => {
    const v = await ctx.step(
      'flaky',
      async () => {
        calls++;
        if (calls < 3) throw new Error(`flaky ${calls}`);
        return { calls };
      },
      { retry: { attempts: 3, backoff: 'fixed', baseMs: 0 } },
    );
    return v;
  });
  const r = await o.start('st.retry', {});
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.is(done.attempts, 1, 'the run itself did not retry');
  t.deepEqual(done.output, { calls: 3 });
  const [s] = await o.listSteps(r.id);
  t.is(s?.status, 'completed');
  t.is(s?.attempts, 3);
  t.is(s?.seq, 1);
});

forBackends('ctx.step: opts.retry exhausted → step failed, error reaches the run', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('st.exhaust', {}, async (ctx) =>
    ctx.step(
      'never',
      async () => {
        calls++;
        throw new Error(`nope ${calls}`);
      },
      { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } },
    ),
  );
  const r = await o.start('st.exhaust', {});
  const done = await runNext(o);
  t.is(calls, 2);
  t.is(done.status, 'failed');
  t.is(done.error?.message, 'nope 2');
  const [s] = await o.listSteps(r.id);
  t.is(s?.status, 'failed');
  t.is(s?.attempts, 2);
  t.is(s?.error?.message, 'nope 2');
});

forBackends('ctx.step: opts.retry honours nonRetryableErrors', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('st.nonretry', {}, async (ctx) =>
    ctx.step(
      'fatal',
      async () => {
        calls++;
        throw codedError('fatal', 'E_STOP');
      },
      { retry: { attempts: 5, backoff: 'fixed', baseMs: 0, nonRetryableErrors: ['E_STOP'] } },
    ),
  );
  const r = await o.start('st.nonretry', {});
  await runNext(o);
  t.is(calls, 1);
  t.is((await o.listSteps(r.id))[0]?.attempts, 1);
});

forBackends('ctx.step: opts.retry waits its backoff in engine time (exponential)', async (t, make) => {
  const o = await make.manual();
  const times: number[] = [];
  let finished = false;
  o.registerHandler('st.backoff', {}, async (ctx) =>
    ctx.step(
      'slow',
      async () => {
        times.push(o.now().getTime());
        if (times.length < 3) throw new Error('later');
        return { ok: true };
      },
      { retry: { attempts: 3, backoff: 'exponential', baseMs: 1000 } },
    ),
  );
  const r = await o.start('st.backoff', {});
  await claim(o);
  const tick = o.tick(r.id).then(() => {
    finished = true;
  });
  // Small steps: the clock moves while a Postgres round trip is under way, so a
  // gap ends up to (round trip / 1 ms) steps late.
  await advanceUntil(o, () => finished, 20);
  await tick;
  t.is(await statusOf(o, r.id), 'completed');
  t.is(times.length, 3);
  const gap1 = times[1]! - times[0]!;
  const gap2 = times[2]! - times[1]!;
  t.true(gap1 >= 1000 && gap1 < 2000, `first backoff ${gap1} (baseMs)`);
  t.true(gap2 >= 2000 && gap2 < 4000, `second backoff ${gap2} (baseMs * 2)`);
});

forBackends('ctx.step: opts.retry backoff and opts.timeoutMs on the system clock (real timers)', async (t, make) => {
  const o = await make.system();
  const times: number[] = [];
  let timeoutErr: unknown;
  let timeoutAfter = 0;
  o.registerHandler('st.sys', {}, async (ctx) => {
    await ctx.step(
      'retrying',
      () => {
        times.push(Date.now());
        if (times.length < 2) throw new Error('first try fails');
        return 'ok';
      },
      { retry: { attempts: 2, backoff: 'fixed', baseMs: 40 } },
    );
    const began = Date.now();
    try {
      await ctx.step('stuck', () => new Promise<never>(() => undefined), { timeoutMs: 50 });
    } catch (e) {
      timeoutErr = e;
      timeoutAfter = Date.now() - began;
    }
    return {};
  });
  await o.start('st.sys', {});
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.is(times.length, 2);
  t.true(times[1]! - times[0]! >= 35, `backoff waited ${times[1]! - times[0]!} ms`);
  t.true(timeoutErr instanceof JobStepTimeoutError);
  t.true(timeoutAfter >= 45, `step timed out after ${timeoutAfter} ms`);
});

forBackends('ctx.step: opts.timeoutMs fails the step with JobStepTimeoutError {stepId, timeoutMs}', async (t, make) => {
  const o = await make.manual();
  let caught: unknown;
  let startedAt = 0;
  let failedAt = 0;
  let finished = false;
  o.registerHandler('st.timeout', {}, async (ctx) => {
    startedAt = o.now().getTime();
    try {
      await ctx.step('stuck', () => new Promise<never>(() => undefined), { timeoutMs: 500 });
    } catch (e) {
      caught = e;
      failedAt = o.now().getTime();
    }
    return { caught: (caught as Error | undefined)?.name ?? null };
  });
  const r = await o.start('st.timeout', {});
  await claim(o);
  const tick = o.tick(r.id).then(() => {
    finished = true;
  });
  await advanceUntil(o, () => finished, 50);
  await tick;
  t.true(caught instanceof JobStepTimeoutError);
  const e = caught as JobStepTimeoutError;
  t.is(e.stepId, 'stuck');
  t.is(e.timeoutMs, 500);
  t.is(e.code, 'JOB_STEP_TIMEOUT');
  t.true(failedAt - startedAt >= 500, 'not before timeoutMs of engine time');
  const done = await get(o, r.id);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { caught: 'JobStepTimeoutError' });
  const [s] = await o.listSteps(r.id);
  t.is(s?.status, 'failed');
  t.regex(s?.error?.message ?? '', /time/i);
});

// ─── ctx.spawnChild ────────────────────────────────────────────────────────

forBackends('ctx.spawnChild: parent trigger, triggerRef, lineage, close policy and start options', async (t, make) => {
  const o = await make.manual();
  const childAt = new Date(o.now().getTime() + 5000);
  o.registerHandler('sp.parent', {}, async (ctx) => {
    const c1 = await ctx.spawnChild('sp.child', { n: 1 });
    const c2 = await ctx.spawnChild('sp.leaf', { n: 2 }, { closePolicy: 'abandon', priority: 7, runAt: childAt, tags: { via: 'spawn' } });
    const c3 = await ctx.spawnChild('sp.leaf', { n: 3 }, { closePolicy: 'cancel' });
    return { c1: c1.id, c2: c2.id, c3: c3.id };
  });
  o.registerHandler('sp.child', {}, async (ctx) => {
    const g = await ctx.spawnChild('sp.leaf', { n: 4 });
    return { g: g.id };
  });
  o.registerHandler('sp.leaf', {}, ok);
  const p = await o.start('sp.parent', {});
  const done = await runNext(o);
  const out = done.output as { c1: string; c2: string; c3: string };
  const c1 = await get(o, out.c1);
  const c2 = await get(o, out.c2);
  const c3 = await get(o, out.c3);
  for (const c of [c1, c2, c3]) {
    t.is(c.parentRunId, p.id);
    t.is(c.rootRunId, p.id);
    t.is(c.triggerSource, 'parent');
    t.is(c.triggerRef, p.id);
    t.is(c.status, 'pending');
  }
  t.deepEqual(c1.input, { n: 1 });
  t.is(c1.parentClosePolicy, 'terminate');
  t.is(c2.parentClosePolicy, 'abandon');
  t.is(c2.priority, 7);
  t.is(c2.runAt.getTime(), childAt.getTime());
  t.deepEqual(c2.tags, { via: 'spawn' });
  t.is(c3.parentClosePolicy, 'cancel');
  // c1 is due now and runs next; its own child keeps the tree's root
  const childDone = await runNext(o);
  t.is(childDone.id, c1.id);
  const g = await get(o, (childDone.output as { g: string }).g);
  t.is(g.parentRunId, c1.id);
  t.is(g.rootRunId, p.id);
  t.is(g.triggerRef, c1.id);
});

// ─── cancel ────────────────────────────────────────────────────────────────

forBackends('cancel: unknown or terminal runs are a no-op', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cn.noop', {}, ok);
  await t.notThrowsAsync(o.cancel(randomUUID()));
  await t.notThrowsAsync(o.cancel('not-a-uuid'));
  const r = await o.start('cn.noop', {});
  await runNext(o);
  const before = await get(o, r.id);
  o.advanceTime(1000);
  await o.cancel(r.id);
  t.deepEqual(await get(o, r.id), before, 'a completed run is untouched');
  const c = await o.start('cn.noop', {});
  await o.cancel(c.id);
  const canceled = await get(o, c.id);
  o.advanceTime(1000);
  await o.cancel(c.id);
  t.deepEqual(await get(o, c.id), canceled, 'a canceled run is untouched');
});

forBackends('cancel: a pending run becomes canceled with finishedAt = now and is not claimable', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cn.pending', {}, ok);
  const r = await o.start('cn.pending', {});
  o.advanceTime(77);
  await o.cancel(r.id, { reason: 'user asked' });
  const row = await get(o, r.id);
  t.is(row.status, 'canceled');
  t.is(ms(row.finishedAt), o.now().getTime());
  t.is(await o.claimNext('batch'), null);
});

forBackends('cancel: cascade (default) cancels descendants via terminate/cancel, skips abandon subtrees, children first', async (t, make) => {
  const o = await make.system();
  o.registerHandler('cn.tree', {}, ok);
  const root = await o.start('cn.tree', {});
  const term = await o.start('cn.tree', {}, { parentRunId: root.id, parentClosePolicy: 'terminate' });
  const canc = await o.start('cn.tree', {}, { parentRunId: root.id, parentClosePolicy: 'cancel' });
  const aband = await o.start('cn.tree', {}, { parentRunId: root.id, parentClosePolicy: 'abandon' });
  const termKid = await o.start('cn.tree', {}, { parentRunId: term.id, parentClosePolicy: 'cancel' });
  const abandKid = await o.start('cn.tree', {}, { parentRunId: aband.id, parentClosePolicy: 'terminate' });
  const other = await o.start('cn.tree', {});
  await o.cancel(root.id);
  const rootRow = await get(o, root.id);
  t.is(rootRow.status, 'canceled');
  for (const r of [term, canc, termKid]) {
    const row = await get(o, r.id);
    t.is(row.status, 'canceled');
    t.true(ms(row.finishedAt) <= ms(rootRow.finishedAt), 'child finished no later than its parent');
  }
  t.true(ms((await get(o, termKid.id)).finishedAt) <= ms((await get(o, term.id)).finishedAt));
  t.is(await statusOf(o, aband.id), 'pending');
  t.is(await statusOf(o, abandKid.id), 'pending');
  t.is(await statusOf(o, other.id), 'pending');
});

forBackends('cancel: cascade false cancels only the run', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('cn.nocascade', {}, ok);
  const root = await o.start('cn.nocascade', {});
  const kid = await o.start('cn.nocascade', {}, { parentRunId: root.id });
  await o.cancel(root.id, { cascade: false });
  t.is(await statusOf(o, root.id), 'canceled');
  t.is(await statusOf(o, kid.id), 'pending');
  await o.cancel(root.id);
  t.is(await statusOf(o, kid.id), 'pending', 'a second cancel of a terminal run is a no-op');
});

forBackends('cancel: a running handler\'s ctx.signal fires, tick returns, its late outcome is ignored', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('cn.running', {}, h.handler);
  const r = await o.start('cn.running', {});
  await claim(o);
  const tick = o.tick(r.id);
  const att = await h.entered();
  t.false(att.signal.aborted);
  await o.cancel(r.id);
  await nextTurn();
  await waitFor(() => att.signal.aborted, 'ctx.signal abort');
  t.true(att.signal.aborted);
  await tick;
  att.release({ late: true });
  await realSleep(10);
  const row = await get(o, r.id);
  t.is(row.status, 'canceled');
  t.is(row.output, null);
  t.is(row.attempts, 0);
});

forBackends('cancel: after cancel + replay + re-claim, the stale attempt can neither finish the run nor write steps', async (t, make) => {
  const o = await make.manual();
  type Entry = { ctx: JobContext<unknown>; release: (v: unknown) => void };
  const entries: Entry[] = [];
  o.registerHandler('cn.stale', {}, (ctx) => new Promise((resolve) => entries.push({ ctx, release: resolve })));
  const r = await o.start('cn.stale', {});
  await claim(o);
  const tick1 = o.tick(r.id);
  await waitFor(() => entries.length === 1, 'first attempt');
  await o.cancel(r.id);
  await waitFor(() => entries[0]!.ctx.signal.aborted, 'first attempt aborted');
  await tick1;
  await o.replay(r.id);
  t.is((await claim(o)).id, r.id);
  const tick2 = o.tick(r.id);
  await waitFor(() => entries.length === 2, 'second attempt');
  const [stale, live] = entries as [Entry, Entry];
  await t.throwsAsync(stale.ctx.step('from-stale', async () => 1));
  t.deepEqual(await o.listSteps(r.id), [], 'the stale attempt wrote no step');
  stale.release({ from: 'stale' });
  await realSleep(10);
  t.is(await statusOf(o, r.id), 'running', 'the stale outcome is ignored');
  t.is(await live.ctx.step('from-live', async () => 2), 2);
  live.release({ from: 'live' });
  await tick2;
  const row = await get(o, r.id);
  t.is(row.status, 'completed');
  t.deepEqual(row.output, { from: 'live' });
  t.deepEqual((await o.listSteps(r.id)).map((s) => s.stepId), ['from-live']);
});

// Regression: the abort of a canceled running attempt once travelled only
// through a weak threadsafe function, so when nothing else kept the event
// loop alive the process exited before ctx.signal fired and the pending
// tick() never settled. Checked in a child process, ten cancel-then-await-
// tick rounds in a row. (Postgres: the child builds its orchestrators on
// the test's schema, migrates and closes them.)
forBackends('cancel: awaiting the tick of a canceled running run settles even when nothing else keeps Node alive', async (t, make) => {
  const dist = path.resolve(__dirname, '..', 'dist');
  const opts = make.options({ clock: 'manual' });
  const script = `
    const { JobOrchestrator } = require(${JSON.stringify(dist)});
    const opts = JSON.parse(process.argv[1]);
    (async () => {
      for (let i = 0; i < 10; i++) {
        const o = new JobOrchestrator(opts);
        await o.migrate();
        let signal;
        o.registerHandler('hang', {}, (ctx) => { signal = ctx.signal; return new Promise(() => {}); });
        const r = await o.start('hang', {});
        await o.claimNext('batch');
        const tick = o.tick(r.id);
        while (signal === undefined) await new Promise((res) => setImmediate(res));
        await o.cancel(r.id);
        await tick;
        if (!signal.aborted) { console.log('signal not fired'); process.exit(2); }
        await o.close();
      }
      console.log('all ticks settled');
    })();
  `;
  const res = spawnSync(process.execPath, ['-e', script, JSON.stringify(opts)], { encoding: 'utf8', timeout: 30_000 });
  t.is(res.status, 0, res.stderr);
  t.is(res.stdout.trim(), 'all ticks settled');
});

forBackends('cancel: a running child\'s signal fires when its parent is canceled', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('cn.parent', {}, ok);
  o.registerHandler('cn.kid', {}, h.handler);
  const p = await o.start('cn.parent', {}, { runAt: new Date(o.now().getTime() + 10_000) });
  const k = await o.start('cn.kid', {}, { parentRunId: p.id });
  await claim(o);
  const tick = o.tick(k.id);
  const att = await h.entered();
  await o.cancel(p.id);
  await waitFor(() => att.signal.aborted, 'child signal');
  await tick;
  t.is(await statusOf(o, k.id), 'canceled');
});

forBackends('cancel: multi-tenant gate — undefined throws, another tenant is a silent no-op', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('cn.mt', {}, ok);
  const a = await o.start('cn.mt', {}, { tenantId: 'a' });
  const e = await t.throwsAsync(o.cancel(a.id), { instanceOf: MissingTenantIdError });
  t.is(e.method, 'cancel');
  await t.throwsAsync(o.cancel(a.id, { cascade: true }), { instanceOf: MissingTenantIdError });
  await o.cancel(a.id, { tenantId: 'b' });
  t.is(await statusOf(o, a.id, 'a'), 'pending');
  await o.cancel(a.id, { tenantId: null });
  t.is(await statusOf(o, a.id, 'a'), 'pending', 'null matches only null-tenant runs');
  await o.cancel(a.id, { tenantId: 'a' });
  t.is(await statusOf(o, a.id, 'a'), 'canceled');
});

// ─── parent-close cascade ──────────────────────────────────────────────────

forBackends('cascade: a failed run cancels its terminate/cancel descendants, not abandon ones', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('pc.fail', {}, async (ctx) => {
    await ctx.spawnChild('pc.leaf', { p: 'terminate' });
    await ctx.spawnChild('pc.leaf', { p: 'cancel' }, { closePolicy: 'cancel' });
    await ctx.spawnChild('pc.leaf', { p: 'abandon' }, { closePolicy: 'abandon' });
    throw new Error('parent failed');
  });
  o.registerHandler('pc.leaf', {}, ok);
  const p = await o.start('pc.fail', {}, { priority: 10 });
  const pRow = await runNext(o);
  t.is(pRow.status, 'failed');
  const kids = await claimAll(o);
  t.is(kids.length, 1, 'only the abandon child is still claimable');
  const survivor = await get(o, kids[0]!);
  t.is(survivor.parentClosePolicy, 'abandon');
  t.is(survivor.parentRunId, p.id);
  t.is(survivor.status, 'running');
});

forBackends('cascade: failure reaches grandchildren through the tree', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('pc.leaf2', {}, ok);
  o.registerHandler('pc.mid', {}, ok);
  let ids: string[] = [];
  o.registerHandler('pc.root', {}, async (ctx) => {
    const mid = await ctx.spawnChild('pc.mid', {});
    const grand = await o.start('pc.leaf2', {}, { parentRunId: mid.id, parentClosePolicy: 'cancel' });
    const abMid = await ctx.spawnChild('pc.mid', {}, { closePolicy: 'abandon' });
    const abGrand = await o.start('pc.leaf2', {}, { parentRunId: abMid.id });
    ids = [mid.id, grand.id, abMid.id, abGrand.id];
    throw new Error('down it goes');
  });
  await o.start('pc.root', {});
  await runNext(o);
  const [mid, grand, abMid, abGrand] = ids as [string, string, string, string];
  t.is(await statusOf(o, mid), 'canceled');
  t.is(await statusOf(o, grand), 'canceled');
  t.is(await statusOf(o, abMid), 'pending');
  t.is(await statusOf(o, abGrand), 'pending');
});

forBackends('cascade: a timed-out run cancels its children', async (t, make) => {
  const o = await make.manual();
  let kid = '';
  const entered: boolean[] = [];
  o.registerHandler('pc.slow', { timeoutMs: 100 }, async (ctx) => {
    kid = (await ctx.spawnChild('pc.leaf3', {})).id;
    entered.push(true);
    return new Promise(() => undefined);
  });
  o.registerHandler('pc.leaf3', {}, ok);
  const p = await o.start('pc.slow', {});
  await claim(o);
  const tick = o.tick(p.id);
  await waitFor(() => entered.length === 1, 'child spawned');
  o.advanceTime(100);
  await tick;
  t.is(await statusOf(o, p.id), 'timed_out');
  t.is(await statusOf(o, kid), 'canceled');
});

forBackends('cascade: a failing parent fires the signal of a running child', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('pc.failing', {}, async () => {
    throw new Error('parent down');
  });
  o.registerHandler('pc.busy', {}, h.handler);
  const p = await o.start('pc.failing', {});
  const k = await o.start('pc.busy', {}, { parentRunId: p.id });
  t.is((await claim(o)).id, p.id);
  t.is((await claim(o)).id, k.id);
  const kidTick = o.tick(k.id);
  const att = await h.entered();
  await o.tick(p.id);
  t.is(await statusOf(o, p.id), 'failed');
  t.is(await statusOf(o, k.id), 'canceled');
  await waitFor(() => att.signal.aborted, 'running child signal');
  await kidTick;
  t.is(await statusOf(o, k.id), 'canceled');
});

forBackends('cascade: a lane run canceled by a cascade frees its lane', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('pc.owner', {}, ok);
  o.registerHandler('pc.laned', { concurrency: { key: 'shared' } }, ok);
  const owner = await o.start('pc.owner', {}, { runAt: new Date(o.now().getTime() + 1e6) });
  const head = await o.start('pc.laned', { n: 1 }, { parentRunId: owner.id });
  const next = await o.start('pc.laned', { n: 2 });
  t.deepEqual(await claimAll(o), [head.id]);
  await o.cancel(owner.id);
  t.is(await statusOf(o, head.id), 'canceled');
  t.deepEqual(await claimAll(o), [next.id]);
});

forBackends('cascade: a completed parent leaves its children running/pending', async (t, make) => {
  const o = await make.manual();
  let kid = '';
  o.registerHandler('pc.done', {}, async (ctx) => {
    kid = (await ctx.spawnChild('pc.leaf4', { x: 1 })).id;
    return {};
  });
  o.registerHandler('pc.leaf4', {}, async () => ({ child: 'ran' }));
  await o.start('pc.done', {});
  const p = await runNext(o);
  t.is(p.status, 'completed');
  t.is(await statusOf(o, kid), 'pending');
  const c = await runNext(o);
  t.is(c.id, kid);
  t.deepEqual(c.output, { child: 'ran' });
});

forBackends('cascade: a failure that is retried (not terminal) leaves the children alone', async (t, make) => {
  const o = await make.manual();
  const kids: string[] = [];
  o.registerHandler('pc.retry', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, async (ctx) => {
    kids.push((await ctx.spawnChild('pc.leaf5', {})).id);
    throw new Error('retry');
  });
  o.registerHandler('pc.leaf5', {}, ok);
  const p = await o.start('pc.retry', {});
  await runNext(o);
  t.is(await statusOf(o, p.id), 'pending');
  t.is(await statusOf(o, kids[0]!), 'pending');
  await o.claimNext('batch'); // the child (the parent waits for its backoff)
  o.advanceTime(1000);
  await runNext(o);
  t.is(await statusOf(o, p.id), 'failed');
  t.is(await statusOf(o, kids[1]!), 'canceled');
  t.is(await statusOf(o, kids[0]!), 'canceled', 'the running first child is canceled at the terminal failure');
});

// ─── replay ────────────────────────────────────────────────────────────────

async function replayScenario(make: Make, mode: 'scratch' | 'last_step' | 'last_checkpoint' | undefined) {
  const o = await make.manual();
  const calls = { a: 0, b: 0 };
  let failB = true;
  o.registerHandler(`rp.${mode ?? 'default'}`, mode === undefined ? {} : { replayFrom: mode }, async (ctx) => {
    const a = await ctx.step('a', async () => ({ a: ++calls.a }));
    const b = await ctx.step('b', async () => {
      calls.b++;
      if (failB) throw new Error('b fails');
      return { b: calls.b };
    });
    return { a, b };
  });
  const r = await o.start(`rp.${mode ?? 'default'}`, {});
  await runNext(o);
  const failed = await get(o, r.id);
  const stepsBefore = await o.listSteps(r.id);
  failB = false;
  const replayed = await o.replay(r.id);
  const stepsAfter = await o.listSteps(r.id);
  const done = await runNext(o);
  return { o, r, failed, stepsBefore, replayed, stepsAfter, done, calls };
}

forBackends('replay: scratch deletes every step and re-executes them all', async (t, make) => {
  const s = await replayScenario(make, 'scratch');
  t.is(s.failed.status, 'failed');
  t.deepEqual(s.stepsBefore.map((x) => [x.stepId, x.status]), [['a', 'completed'], ['b', 'failed']]);
  t.deepEqual(s.stepsAfter, []);
  t.is(s.done.status, 'completed');
  t.deepEqual(s.calls, { a: 2, b: 2 });
  t.deepEqual(s.done.output, { a: { a: 2 }, b: { b: 2 } });
});

for (const mode of ['last_step', 'last_checkpoint', undefined] as const) {
  forBackends(`replay: ${mode ?? 'default (last_checkpoint)'} keeps completed steps memoized and deletes the others`, async (t, make) => {
    const s = await replayScenario(make, mode);
    t.is(s.failed.status, 'failed');
    t.deepEqual(s.stepsAfter.map((x) => [x.stepId, x.status, x.output]), [['a', 'completed', { a: 1 }]]);
    t.is(s.done.status, 'completed');
    t.deepEqual(s.calls, { a: 1, b: 2 });
    t.deepEqual(s.done.output, { a: { a: 1 }, b: { b: 2 } });
  });
}

forBackends('replay: the same row is reset (pending, attempts 0, runAt now, timestamps/error/output null), lineage kept', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rp.parent', {}, ok);
  o.registerHandler('rp.row', {}, async () => {
    throw new Error('first time');
  });
  const parent = await o.start('rp.parent', {}, { runAt: new Date(o.now().getTime() + 1e6) });
  const r = await o.start('rp.row', { q: 1 }, { parentRunId: parent.id, priority: 3, tags: { t: 'x' }, parentClosePolicy: 'cancel' });
  await runNext(o);
  const failed = await get(o, r.id);
  t.is(failed.status, 'failed');
  o.advanceTime(5000);
  const replayed = await o.replay(r.id);
  const now = o.now().getTime();
  t.is(replayed.id, r.id);
  t.is(replayed.status, 'pending');
  t.is(replayed.attempts, 0);
  t.is(replayed.runAt.getTime(), now);
  for (const f of ['startedAt', 'finishedAt', 'claimedAt', 'error', 'output'] as const) t.is(replayed[f], null, f);
  t.is(replayed.parentRunId, parent.id);
  t.is(replayed.rootRunId, parent.id);
  t.is(replayed.parentClosePolicy, 'cancel');
  t.is(replayed.priority, 3);
  t.deepEqual(replayed.tags, { t: 'x' });
  t.deepEqual(replayed.input, { q: 1 });
  t.is(replayed.createdAt.getTime(), failed.createdAt.getTime());
  t.deepEqual(await get(o, r.id), replayed);
  t.is((await claim(o)).id, r.id, 'the replayed run is claimable');
});

forBackends('replay: a completed or canceled run can be replayed; output is cleared', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rp.done', {}, async () => ({ out: 1 }));
  const a = await o.start('rp.done', {});
  await runNext(o);
  t.deepEqual((await get(o, a.id)).output, { out: 1 });
  const ra = await o.replay(a.id);
  t.is(ra.status, 'pending');
  t.is(ra.output, null);
  await runNext(o);
  const b = await o.start('rp.done', {});
  await o.cancel(b.id);
  const rb = await o.replay(b.id);
  t.is(rb.status, 'pending');
  t.is(rb.finishedAt, null);
  t.is((await runNext(o)).id, b.id);
});

forBackends('replay: a non-terminal run → JobNotReplayableError {runId, currentStatus}', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rp.live', {}, ok);
  const r = await o.start('rp.live', {});
  const e = await t.throwsAsync(o.replay(r.id), { instanceOf: JobNotReplayableError });
  t.is(e.runId, r.id);
  t.is(e.currentStatus, 'pending');
  t.is(e.code, 'JOB_NOT_REPLAYABLE');
  t.is(e.name, 'JobNotReplayableError');
  await claim(o);
  const e2 = await t.throwsAsync(o.replay(r.id), { instanceOf: JobNotReplayableError });
  t.is(e2.currentStatus, 'running');
  t.is(await statusOf(o, r.id), 'running');
});

forBackends('replay: an unknown run → JobRunNotFoundError {runId}', async (t, make) => {
  const o = await make.manual();
  const id = randomUUID();
  const e = await t.throwsAsync(o.replay(id), { instanceOf: JobRunNotFoundError });
  t.is(e.runId, id);
  t.is(e.code, 'JOB_RUN_NOT_FOUND');
  t.is(e.name, 'JobRunNotFoundError');
  const e2 = await t.throwsAsync(o.replay('garbage'), { instanceOf: JobRunNotFoundError });
  t.is(e2.runId, 'garbage');
});

forBackends('replay: a run with a concurrency key rejoins its lane at the tail', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('rp.lane', { concurrency: { key: 'L' } }, ok);
  const a = await o.start('rp.lane', { n: 'a' }, { priority: 10 });
  const b = await o.start('rp.lane', { n: 'b' });
  t.is((await runNext(o)).id, a.id);
  await o.replay(a.id);
  // a has the higher priority, yet b is ahead of it in the lane
  const c1 = await claim(o);
  t.is(c1.id, b.id);
  t.is(await o.claimNext('batch'), null, 'a waits for b');
  await o.tick(b.id);
  t.is((await claim(o)).id, a.id);
});

// ─── lanes (queue) ─────────────────────────────────────────────────────────

forBackends('lane: strictly one at a time in lane order, the next becomes claimable on any terminal transition', async (t, make) => {
  const o = await make.manual();
  o.registerHandler<{ n: number; fail?: boolean }>('ln.seq', { concurrency: { key: 'L' } }, async (ctx) => {
    if (ctx.input.fail) throw new Error('x');
    return {};
  });
  const runs: JobRun[] = [];
  runs.push(await o.start('ln.seq', { n: 0 }));
  runs.push(await o.start('ln.seq', { n: 1, fail: true }, { priority: 50 }));
  runs.push(await o.start('ln.seq', { n: 2 }, { priority: 100 }));
  runs.push(await o.start('ln.seq', { n: 3 }));
  const order: string[] = [];
  // 0 completes, 1 fails, 2 is canceled while running, 3 completes
  let c = await claim(o);
  order.push(c.id);
  t.is(await o.claimNext('batch'), null);
  await o.tick(c.id);
  c = await claim(o);
  order.push(c.id);
  t.is(await o.claimNext('batch'), null);
  await o.tick(c.id);
  t.is(await statusOf(o, c.id), 'failed');
  c = await claim(o);
  order.push(c.id);
  t.is(await o.claimNext('batch'), null);
  await o.cancel(c.id);
  c = await claim(o);
  order.push(c.id);
  await o.tick(c.id);
  t.deepEqual(order, runs.map((r) => r.id));
  t.is(await o.claimNext('batch'), null);
});

forBackends('lane: a not-yet-due head holds the lane; a waiter keeps its own runAt', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('ln.due', { concurrency: { key: 'K' } }, ok);
  const t0 = o.now().getTime();
  const head = await o.start('ln.due', {}, { runAt: new Date(t0 + 1000) });
  const waiter = await o.start('ln.due', {}, { runAt: new Date(t0 + 500) });
  t.is(waiter.runAt.getTime(), t0 + 500);
  o.advanceTime(600);
  t.is(await o.claimNext('batch'), null, 'the due waiter is held by the lane head');
  o.advanceTime(400);
  t.is((await runNext(o)).id, head.id);
  const w = await get(o, waiter.id);
  t.is(w.runAt.getTime(), t0 + 500, 'being blocked is not written into the row');
  t.is((await claim(o)).id, waiter.id);
});

forBackends('lane: a run waiting for a retry keeps its place', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('ln.retry', { concurrency: { key: 'R' }, retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, async () => {
    calls++;
    if (calls === 1) throw new Error('first attempt fails');
    return {};
  });
  const a = await o.start('ln.retry', {});
  const b = await o.start('ln.retry', {});
  await runNext(o);
  t.is(await statusOf(o, a.id), 'pending');
  t.is(await o.claimNext('batch'), null, 'b does not overtake a waiting for its retry');
  o.advanceTime(1000);
  t.is((await runNext(o)).id, a.id);
  t.is((await claim(o)).id, b.id);
});

forBackends('lane: a reject incumbent waiting for its retry still holds the key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('ln.rejretry', { concurrency: { key: 'X' , collisionMode: 'reject' }, retry: { attempts: 2, backoff: 'fixed', baseMs: 500 } }, async () => {
    throw new Error('nope');
  });
  const a = await o.start('ln.rejretry', {});
  await runNext(o);
  t.is(await statusOf(o, a.id), 'pending');
  const e = await t.throwsAsync(o.start('ln.rejretry', {}), { instanceOf: JobCollisionError });
  t.is(e.incumbent.id, a.id);
  t.is(e.incumbent.attempts, 1);
});

// ─── queries, time ─────────────────────────────────────────────────────────

forBackends('queries: multi-tenant findById/listSteps take the tenant gate', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('q.mt', {}, async (ctx) => ctx.step('s', () => ({ ok: 1 })));
  const a = await o.start('q.mt', {}, { tenantId: 'a' });
  const n = await o.start('q.mt', {}, { tenantId: null });
  await o.tick((await claim(o)).id); // a, the first created
  const e = await t.throwsAsync(o.findById(a.id), { instanceOf: MissingTenantIdError });
  t.is(e.method, 'findById');
  const e2 = await t.throwsAsync(o.listSteps(a.id), { instanceOf: MissingTenantIdError });
  t.is(e2.method, 'listSteps');
  t.is(await o.findById(a.id, { tenantId: 'b' }), null);
  t.is(await o.findById(a.id, { tenantId: null }), null, 'null matches only null-tenant rows');
  t.is((await o.findById(a.id, { tenantId: 'a' }))?.id, a.id);
  t.is((await o.findById(n.id, { tenantId: null }))?.id, n.id);
  t.is(await o.findById(n.id, { tenantId: 'a' }), null);
  t.deepEqual(await o.listSteps(a.id, { tenantId: 'b' }), []);
  t.is((await o.listSteps(a.id, { tenantId: 'a' })).length, 1);
});

forBackends('queries: findById of an unknown id is null; listSteps of a run without steps is []', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('q.none', {}, ok);
  t.is(await o.findById(randomUUID()), null);
  t.is(await o.findById('garbage'), null);
  const r = await o.start('q.none', {});
  t.deepEqual(await o.listSteps(r.id), []);
});

forBackends('clock: advanceTime moves a manual clock; on the system clock it throws JobClockError', async (t, make) => {
  const o = await make.manual();
  const before = o.now().getTime();
  const after = o.advanceTime(1234);
  t.true(after instanceof Date);
  t.is(after.getTime(), before + 1234);
  t.is(o.now().getTime(), before + 1234);
  t.throws(() => o.advanceTime(-1), { instanceOf: JobInputInvalidError });
  const s = await make.system();
  const e = t.throws(() => s.advanceTime(10), { instanceOf: JobClockError });
  t.is(e.code, 'JOB_CLOCK');
  t.true(Math.abs(s.now().getTime() - Date.now()) < 5000);
});

// ─── errors ────────────────────────────────────────────────────────────────

forBackends('errors: every contract error is an Error subclass with a stable name, code and its fields', async (t, make) => {
  const o = await make.manual();
  void o;
  const incumbent = {} as JobRun;
  const cases: [Error & { code: string }, string, Record<string, unknown>][] = [
    [new JobTypeNotFoundError('t'), 'JobTypeNotFoundError', { jobType: 't' }],
    [new JobCollisionError('t', 'k', incumbent), 'JobCollisionError', { jobType: 't', concurrencyKey: 'k', incumbent }],
    [new JobNotReplayableError('r', 'pending'), 'JobNotReplayableError', { runId: 'r', currentStatus: 'pending' }],
    [new JobTemplateFieldMissingError('{{a}}', 'a'), 'JobTemplateFieldMissingError', { template: '{{a}}', field: 'a' }],
    [new MissingTenantIdError('start'), 'MissingTenantIdError', { method: 'start' }],
    [new JobKeyFunctionUnavailableError('t', 'dedupe'), 'JobKeyFunctionUnavailableError', { jobType: 't', kind: 'dedupe' }],
    [new JobRunNotFoundError('r'), 'JobRunNotFoundError', { runId: 'r' }],
    [new ParentRunNotFoundError('p'), 'ParentRunNotFoundError', { parentRunId: 'p' }],
    [new JobInputInvalidError('why'), 'JobInputInvalidError', { reason: 'why' }],
    [new JobRunStateError('r', 'failed'), 'JobRunStateError', { runId: 'r', status: 'failed' }],
  ];
  const codes = new Set<string>();
  for (const [err, name, fields] of cases) {
    t.true(err instanceof Error, name);
    t.is(err.name, name);
    t.is(typeof err.code, 'string');
    t.true(err.code.length > 0);
    codes.add(err.code);
    t.is(typeof err.message, 'string');
    t.true(err.message.length > 0);
    for (const [k, v] of Object.entries(fields)) t.is(asRecord(err)[k], v, `${name}.${k}`);
  }
  t.is(codes.size, cases.length, 'codes are distinct');
});

forBackends('errors: JobKeyFunctionUnavailableError {jobType, kind} when a <fn> key has no function in this process', async (t, make) => {
  // In memory mode the only definition whose key function is unavailable is
  // one registered with the stored form '<fn>' itself (what another process
  // reading a database definition would see).
  const o = await make.manual();
  o.registerHandler('kfu.cc', { concurrency: { key: '<fn>' } }, ok);
  o.registerHandler('kfu.dd', { dedupe: { key: '<fn>', windowMs: 100 } }, ok);
  const e = await t.throwsAsync(o.start('kfu.cc', {}), { instanceOf: JobKeyFunctionUnavailableError });
  t.is(e.jobType, 'kfu.cc');
  t.is(e.kind, 'concurrency');
  t.is(e.code, 'JOB_KEY_FUNCTION_UNAVAILABLE');
  const e2 = await t.throwsAsync(o.start('kfu.dd', {}), { instanceOf: JobKeyFunctionUnavailableError });
  t.is(e2.kind, 'dedupe');
  t.is(await o.claimNext('batch'), null);
});

forBackends('retention: dedupe never answers with a run past its retention (the same start would delete it)', async (t, make) => {
  const o = await make.manual({ retention: { completedMs: 100 } });
  o.registerHandler('ret.dd', { dedupe: { key: 'k', windowMs: 10_000 } }, ok);
  const first = await o.start('ret.dd', {});
  const claimed = await o.claimNext('batch');
  t.is(claimed?.id, first.id);
  await o.tick(first.id);
  o.advanceTime(99);
  t.is((await o.start('ret.dd', {})).id, first.id, 'within its retention the completed run dedupes');
  o.advanceTime(1);
  const second = await o.start('ret.dd', {});
  t.not(second.id, first.id, 'past its retention: a new run');
  t.is(second.status, 'pending');
  t.is((await o.findById(second.id))?.id, second.id, 'the answered run exists');
  t.is(await o.findById(first.id), null);
});

forBackends('retention: a finished run past its retention is gone for reads with no write in between (memory), or after the next write (postgres)', async (t, make) => {
  const o = await make.manual({ retention: { completedMs: 100, failedMs: 100 } });
  o.registerHandler('ret.ok', {}, ok);
  o.registerHandler('ret.bad', {}, async () => {
    throw new Error('no');
  });
  const good = await o.start('ret.ok', {});
  const bad = await o.start('ret.bad', {});
  for (const r of [good, bad]) {
    t.is((await o.claimNext('batch'))?.id, r.id);
    await o.tick(r.id);
  }
  o.advanceTime(100);
  if (make.backend === 'postgres') {
    // A database purges in writes only; reads before one may still see them.
    await o.start('ret.ok', {});
  }
  t.is(await o.findById(good.id), null);
  t.is(await o.findById(bad.id), null);
  t.deepEqual(await o.listRecentFailed(), []);
  const counts = await o.countByPoolAndStatus();
  t.deepEqual(
    counts.filter((c) => c.status !== 'pending'),
    [],
    'no finished run is counted',
  );
});

forBackends('cancel: a run canceled while claimed, then replayed, is not stopped by a later unrelated cancel', async (t, make) => {
  // The first cancel found the run claimed but not executing: its abort
  // notice belongs to that attempt only, not to the replayed run's next one.
  const o = await make.manual();
  let aborted: unknown = null;
  let entered: () => void = () => undefined;
  const inside = new Promise<void>((r) => (entered = r));
  let finish: () => void = () => undefined;
  const gate = new Promise<void>((r) => (finish = r));
  o.registerHandler('stale.abort', {}, async (ctx) => {
    ctx.signal.addEventListener('abort', () => (aborted = ctx.signal.reason));
    entered();
    await gate;
    return { done: true };
  });
  const other = await o.start('stale.abort', {}, { pool: 'elsewhere' });
  const run = await o.start('stale.abort', {});
  t.is((await o.claimNext('batch'))?.id, run.id);
  await o.cancel(run.id);
  await o.replay(run.id);
  t.is((await o.claimNext('batch'))?.id, run.id);
  const ticking = o.tick(run.id);
  await inside;
  await o.cancel(randomUUID()); // unknown: a no-op
  await o.cancel(other.id); // another run
  finish();
  await ticking;
  t.is(aborted, null, 'the signal of the running attempt did not fire');
  const row = await o.findById(run.id);
  t.is(row?.status, 'completed');
  t.is(row?.attempts, 1);
  t.deepEqual(row?.output, { done: true });
});

forBackends('definitions: createdAt/updatedAt are the time of registerHandler, even when the write lands later', async (t, make) => {
  const o = await make.manual();
  const at = o.now().getTime();
  o.registerHandler('def.when', {}, ok);
  // Postgres writes definitions in the background: move the clock before it lands.
  o.advanceTime(1_000);
  const def = await o.getDefinition('def.when');
  t.is(def?.createdAt.getTime(), at);
  t.is(def?.updatedAt.getTime(), at);
  o.registerHandler('def.when', { pool: 'other' }, ok);
  const again = await o.getDefinition('def.when');
  t.is(again?.createdAt.getTime(), at, 'createdAt stays');
  t.is(again?.updatedAt.getTime(), at + 1_000);
});

// ─── stored text ─────────────────────────────────────────────────────────────

forBackends('stored text: an error message holding NUL reads the same from waitForRun, findById, run events and listRecentFailed', async (t, make) => {
  const o = await make.system();
  // PostgreSQL's jsonb cannot hold U+0000: it stores U+FFFD. Memory holds it.
  const expected = make.backend === 'postgres' ? 'a\ufffdb' : 'a\u0000b';
  o.registerHandler('nul.throws', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1 } }, async () => {
    throw new Error('a\u0000b');
  });
  const heard: { event: string; message: string | undefined; stack: string | undefined }[] = [];
  const listen = (event: 'run:failed' | 'run:retrying') =>
    o.on(event, (run) => heard.push({ event, message: run.error?.message, stack: run.error?.stack }));
  listen('run:retrying');
  listen('run:failed');
  const run = await o.start('nul.throws', {});
  const worker = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  t.teardown(() => worker.stop());
  const done = await o.waitForRun(run.id, { timeoutMs: 10_000 });
  t.is(done.status, 'failed');
  t.is(done.error?.message, expected, 'waitForRun');
  const found = await o.findById(run.id);
  t.is(found?.error?.message, expected, 'findById');
  t.is(done.error?.stack, found?.error?.stack, 'the stack (it holds the message) reads the same too');
  t.true(found?.error?.stack?.includes(expected) ?? false, 'the stack holds the stored message');
  await waitFor(() => heard.length === 2, 'both run events');
  // (Each attempt threw its own error: only the last one's stack is the row's.)
  t.deepEqual(
    heard.map((h) => [h.event, h.message, h.stack?.includes(expected)]),
    [
      ['run:retrying', expected, true],
      ['run:failed', expected, true],
    ],
    'run events',
  );
  t.is(heard[1]?.stack, found?.error?.stack, 'the run:failed stack is the stored one');
  const failures = await o.listRecentFailed();
  t.deepEqual(
    failures.map((f) => [f.runId, f.errorMessage]),
    [[run.id, expected]],
    'listRecentFailed',
  );
});
