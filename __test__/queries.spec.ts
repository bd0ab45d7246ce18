/**
 * Run-service queries (CONTRACT.md "Queries (run service)" and the tenant
 * rules): findById, listForScope, cancelForScope, rescheduleForScope,
 * countByPoolAndStatus, listRecentFailed, listJobRuns (keyset pagination),
 * getRunTree, listSteps, findStep, recordStep — filters, ordering, limits,
 * pagination under concurrent starts, and tenant isolation of every method.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import * as path from 'node:path';
import {
  JobInputInvalidError,
  JobOrchestrator,
  JobRunNotFoundError,
  MissingTenantIdError,
} from '../dist';
import type { JobContext, JobRun, JobRunStatus, JobRunSummary, ListForScopeOptions, ListJobRunsOptions, PoolStatusCount, RunTreeNode } from '../dist';
import { UUID_V4, hanging, manual, nextTurn, system, waitFor } from './helpers';
import { forBackends } from './backends';

// ─── local helpers ──────────────────────────────────────────────────────────

type Tenant = string | null | undefined;

const ok = async (): Promise<Record<string, never>> => ({});
const boom = async (): Promise<never> => {
  throw new Error('boom');
};

let poolSeq = 0;
/** A pool name no other run uses, so `claimNext(pool)` picks exactly one run. */
const uniqPool = (): string => `qpool-${++poolSeq}`;

const tOpt = (tenant: Tenant): { tenantId?: string | null } => (tenant === undefined ? {} : { tenantId: tenant });

/** findById that must find the run. */
async function row(o: JobOrchestrator, id: string, tenant?: Tenant): Promise<JobRun> {
  const r = await o.findById(id, tOpt(tenant));
  if (r === null) throw new Error(`run ${id} not found`);
  return r;
}

/** Claims `run` (it must be the next claimable run of its pool) without executing it. */
async function claimRun(o: JobOrchestrator, run: JobRun): Promise<JobRun> {
  const c = await o.claimNext(run.pool);
  if (c === null || c.id !== run.id) throw new Error(`expected to claim ${run.id} from '${run.pool}', got ${c?.id}`);
  return c;
}

/** Claims and executes `run`; returns its fresh row. */
async function execRun(o: JobOrchestrator, run: JobRun, tenant?: Tenant): Promise<JobRun> {
  const c = await claimRun(o, run);
  await o.tick(c.id);
  return row(o, run.id, tenant);
}

/** A run's row, or a run as a list shows it (`JobRunSummary`, `JobRunFailure`: `runId`). */
type Listed = { id: string } | { runId: string };
const idOf = (r: Listed): string => ('runId' in r ? r.runId : r.id);

/** (createdAt, id) keyset comparison: > 0 when a is newer than b. */
function cmpKey(a: Listed & { createdAt: Date }, b: Listed & { createdAt: Date }): number {
  const d = a.createdAt.getTime() - b.createdAt.getTime();
  if (d !== 0) return d;
  return idOf(a) < idOf(b) ? -1 : idOf(a) > idOf(b) ? 1 : 0;
}

/** Newest first by (createdAt, id). */
const newestFirst = (rows: JobRun[]): JobRun[] => [...rows].sort((a, b) => cmpKey(b, a));

/** Index of the first pair that is not strictly newest-first, or -1. */
function firstOrderViolation(rows: (Listed & { createdAt: Date })[]): number {
  for (let i = 1; i < rows.length; i++) if (cmpKey(rows[i - 1]!, rows[i]!) <= 0) return i;
  return -1;
}

const ids = (rows: Listed[]): string[] => rows.map(idOf);

/** Every page of a listJobRuns walk; `between` runs after each fetched page. */
async function walkPages(
  o: JobOrchestrator,
  opts: ListJobRunsOptions,
  between?: (page: number) => Promise<void>,
  maxPages = 100_000,
): Promise<{ pages: JobRunSummary[][]; items: JobRunSummary[] }> {
  const pages: JobRunSummary[][] = [];
  let cursor: string | undefined;
  for (let i = 0; i < maxPages; i++) {
    const page = await o.listJobRuns({ ...opts, cursor });
    pages.push(page.items);
    if (page.nextCursor === null) return { pages, items: pages.flat() };
    if (typeof page.nextCursor !== 'string') throw new Error('nextCursor must be a string or null');
    cursor = page.nextCursor;
    if (between) await between(i);
  }
  throw new Error('walk did not end');
}

/** Counts per (pool, status) computed from rows, in the documented order. */
function countsOf(rows: JobRun[]): PoolStatusCount[] {
  const m = new Map<string, PoolStatusCount>();
  for (const r of rows) {
    const k = `${r.pool}\u0000${r.status}`;
    const c = m.get(k) ?? { pool: r.pool, status: r.status, count: 0 };
    c.count++;
    m.set(k, c);
  }
  return [...m.values()].sort((a, b) =>
    a.pool < b.pool ? -1 : a.pool > b.pool ? 1 : a.status < b.status ? -1 : a.status > b.status ? 1 : 0,
  );
}

/** Deterministic PRNG (LCG) for reproducible data sets. */
function prng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** Asserts `p` rejects with JobInputInvalidError (without dumping a resolved value). */
async function isInvalid(t: ExecutionContext, p: Promise<unknown>, what: string): Promise<void> {
  const outcome = await p.then(
    (value) => ({ resolved: true as const, value }),
    (error: unknown) => ({ resolved: false as const, error }),
  );
  if (outcome.resolved) {
    const v = outcome.value as { items?: unknown[] } | unknown[] | null;
    const size = Array.isArray(v) ? `${v.length} rows` : v && Array.isArray(v.items) ? `${v.items.length} rows` : String(v);
    t.fail(`${what}: resolved (${size}) instead of rejecting with JobInputInvalidError`);
    return;
  }
  t.true(outcome.error instanceof JobInputInvalidError, `${what}: ${String(outcome.error)}`);
  t.is((outcome.error as JobInputInvalidError).code, 'JOB_INPUT_INVALID', what);
}

async function isMissingTenant(t: ExecutionContext, p: Promise<unknown>, method: string): Promise<void> {
  const e = await t.throwsAsync(p, { instanceOf: MissingTenantIdError }, method);
  t.is(e?.code, 'MISSING_TENANT_ID', method);
  t.is((e as MissingTenantIdError | undefined)?.method, method);
}

// ─── findById ───────────────────────────────────────────────────────────────

test('findById: returns the current row; unknown or malformed ids → null', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, async () => ({ done: 1 }));
  const r = await o.start('q.ok', { x: 1 }, { pool: uniqPool() });
  const before = await row(o, r.id);
  t.is(before.status, 'pending');
  t.deepEqual(before.input, { x: 1 });
  t.true(before.createdAt instanceof Date);
  await execRun(o, r);
  const after = await o.findById(r.id);
  t.is(after?.status, 'completed');
  t.deepEqual(after?.output, { done: 1 });
  t.is(after?.id, r.id);
  t.is(await o.findById(randomUUID()), null);
  t.is(await o.findById('not-a-uuid'), null);
  t.is(await o.findById(''), null);
});

// ─── listForScope ───────────────────────────────────────────────────────────

test('listForScope: scope from start opts or meta.scope; only that scope; newest first, asc is the exact reverse', async (t) => {
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  o.registerHandler('q.b', {}, ok);
  o.registerHandler('q.meta', { scope: { entity: 'Order', from: (i: { orderId: string }) => i.orderId } }, ok);
  const S = { entityType: 'Order', entityId: '1' };
  const r1 = await o.start('q.a', {}, { scope: S });
  o.advanceTime(1);
  const r2 = await o.start('q.meta', { orderId: '1' });
  o.advanceTime(1);
  await o.start('q.a', {}, { scope: { entityType: 'Order', entityId: '2' } });
  await o.start('q.a', {}, { scope: { entityType: 'Customer', entityId: '1' } });
  await o.start('q.a', {});
  await o.start('q.meta', { orderId: '11' });
  o.advanceTime(1);
  const r3 = await o.start('q.b', {}, { scope: S });
  o.advanceTime(1);
  // opts.scope wins over meta.scope
  const r4 = await o.start('q.meta', { orderId: '9' }, { scope: S });

  const desc = await o.listForScope('Order', '1');
  t.deepEqual(ids(desc), [r4.id, r3.id, r2.id, r1.id]);
  for (const r of desc) {
    t.is(r.scopeEntityType, 'Order');
    t.is(r.scopeEntityId, '1');
  }
  t.deepEqual(ids(await o.listForScope('Order', '1', { orderBy: 'createdAt:desc' })), ids(desc));
  t.deepEqual(ids(await o.listForScope('Order', '1', { orderBy: 'createdAt:asc' })), ids(desc).reverse());
  t.deepEqual(await o.listForScope('Order', '9'), []);
  t.is((await o.listForScope('Order', '11')).length, 1);
  t.deepEqual(await o.listForScope('order', '1'), [], 'entityType is matched exactly');
  t.deepEqual(await o.listForScope('Nope', 'x'), []);

  // Same-millisecond runs (system clock): desc is still the exact reverse of asc, ordered by createdAt.
  const s = system();
  s.registerHandler('q.a', {}, ok);
  for (let i = 0; i < 300; i++) await s.start('q.a', { i }, { scope: S });
  const d = await s.listForScope('Order', '1', { limit: 500 });
  const a = await s.listForScope('Order', '1', { limit: 500, orderBy: 'createdAt:asc' });
  t.is(d.length, 300);
  t.deepEqual(ids(a), ids(d).reverse());
  t.true(d.every((r, i) => i === 0 || r.createdAt.getTime() <= d[i - 1]!.createdAt.getTime()), 'desc by createdAt');
});

test('listForScope: status (one or several) and jobType filters, alone and combined', async (t) => {
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  o.registerHandler('q.b', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  const S = { entityType: 'Job', entityId: 'f' };
  const start = async (type: string): Promise<JobRun> => {
    const r = await o.start(type, {}, { scope: S, pool: uniqPool() });
    o.advanceTime(1);
    return r;
  };
  const aPending = await start('q.a');
  const aRunning = await start('q.a');
  await claimRun(o, aRunning);
  const bDone = await start('q.b');
  await execRun(o, bDone);
  const failed = await start('q.boom');
  await execRun(o, failed);
  const aCanceled = await start('q.a');
  await o.cancel(aCanceled.id);
  const bPending = await start('q.b');
  await o.start('q.a', {}, { scope: { entityType: 'Job', entityId: 'other' } });

  const L = (opts: Parameters<JobOrchestrator['listForScope']>[2]) => o.listForScope('Job', 'f', opts).then(ids);
  t.deepEqual(await L({}), [bPending.id, aCanceled.id, failed.id, bDone.id, aRunning.id, aPending.id]);
  t.deepEqual(await L({ status: 'pending' }), [bPending.id, aPending.id]);
  t.deepEqual(await L({ status: 'running' }), [aRunning.id]);
  t.deepEqual(await L({ status: ['completed', 'failed', 'canceled'] }), [aCanceled.id, failed.id, bDone.id]);
  t.deepEqual(await L({ status: ['failed'] }), [failed.id]);
  t.deepEqual(await L({ status: 'timed_out' }), []);
  t.deepEqual(await L({ status: [] }), [], 'an empty status list matches nothing');
  t.deepEqual(await L({ jobType: 'q.a' }), [aCanceled.id, aRunning.id, aPending.id]);
  t.deepEqual(await L({ jobType: 'q.b', status: 'pending' }), [bPending.id]);
  t.deepEqual(await L({ jobType: 'q.a', status: ['pending', 'running'], orderBy: 'createdAt:asc' }), [
    aPending.id,
    aRunning.id,
  ]);
  t.deepEqual(await L({ jobType: 'nope' }), []);
  for (const r of await o.listForScope('Job', 'f', { status: ['pending', 'running'] })) {
    t.true(r.status === 'pending' || r.status === 'running');
  }
});

test('listForScope: offset and limit page the filtered list; default limit 50, maximum 500', async (t) => {
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  const S = { entityType: 'Bulk', entityId: '1' };
  const all: JobRun[] = [];
  for (let i = 0; i < 520; i++) {
    const r = await o.start('q.a', { i }, { scope: S });
    if (i % 3 === 0) await o.cancel(r.id);
    all.push(r);
    o.advanceTime(1);
  }
  const descIds = ids(all).reverse();
  t.deepEqual(ids(await o.listForScope('Bulk', '1')), descIds.slice(0, 50), 'default limit 50');
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 500 })), descIds.slice(0, 500));
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 501 })), descIds.slice(0, 500), 'clamped to 500');
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 1e9 })), descIds.slice(0, 500), 'clamped to 500');
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 7, offset: 10 })), descIds.slice(10, 17));
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 500, offset: 100 })), descIds.slice(100, 520));
  t.deepEqual(
    ids(await o.listForScope('Bulk', '1', { limit: 5, offset: 515, orderBy: 'createdAt:asc' })),
    ids(all).slice(515),
  );
  t.deepEqual(await o.listForScope('Bulk', '1', { offset: 520 }), []);
  const canceledDesc = ids(all.filter((_, i) => i % 3 === 0)).reverse();
  t.deepEqual(
    ids(await o.listForScope('Bulk', '1', { status: 'canceled', offset: 2, limit: 3 })),
    canceledDesc.slice(2, 5),
    'offset applies after the filter',
  );
  t.deepEqual(ids(await o.listForScope('Bulk', '1', { limit: 1 })), [descIds[0]]);
});

test('listForScope: malformed query values are JobInputInvalidError', async (t) => {
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  await o.start('q.a', {}, { scope: { entityType: 'E', entityId: '1' } });
  await isInvalid(t, o.listForScope('E', '1', { limit: 0 }), 'limit 0');
  await isInvalid(t, o.listForScope('E', '1', { limit: -1 }), 'limit -1');
  await isInvalid(t, o.listForScope('E', '1', { limit: 2.5 }), 'limit 2.5');
  await isInvalid(t, o.listForScope('E', '1', { limit: '10' as unknown as number }), "limit '10'");
  await isInvalid(t, o.listForScope('E', '1', { offset: -1 }), 'offset -1');
  await isInvalid(t, o.listForScope('E', '1', { offset: 0.5 }), 'offset 0.5');
  await isInvalid(t, o.listForScope('E', '1', { orderBy: 'id:desc' as 'createdAt:desc' }), 'orderBy');
  await isInvalid(t, o.listForScope('E', '1', { status: 'nope' as JobRunStatus }), 'status');
  await isInvalid(t, o.listForScope('E', '1', { status: ['pending', 'nope' as JobRunStatus] }), 'status list');
  t.is((await o.listForScope('E', '1')).length, 1, 'the store still answers');
});

// ─── cancelForScope ─────────────────────────────────────────────────────────

test('cancelForScope: cancels the live runs of the scope with cascade; terminal runs and other scopes untouched', async (t) => {
  const o = manual();
  const h = hanging();
  o.registerHandler('q.a', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler('q.hang', {}, h.handler);
  const S = { entityType: 'Order', entityId: 'c' };
  const running = await o.start('q.hang', {}, { scope: S, pool: uniqPool() });
  await claimRun(o, running);
  const tick = o.tick(running.id);
  const att = await h.entered();
  const pending = await o.start('q.a', {}, { scope: S, pool: uniqPool() });
  const kid = await o.start('q.a', {}, { parentRunId: pending.id, pool: uniqPool() });
  const abandoned = await o.start('q.a', {}, { parentRunId: pending.id, parentClosePolicy: 'abandon', pool: uniqPool() });
  const done = await o.start('q.a', {}, { scope: S, pool: uniqPool() });
  await execRun(o, done);
  const failed = await o.start('q.boom', {}, { scope: S, pool: uniqPool() });
  await execRun(o, failed);
  const other = await o.start('q.a', {}, { scope: { entityType: 'Order', entityId: 'other' } });
  const doneBefore = await row(o, done.id);
  const failedBefore = await row(o, failed.id);
  o.advanceTime(5);

  t.is(await o.cancelForScope('Order', 'c'), 2, 'the pending and the running run of the scope');
  await waitFor(() => att.signal.aborted, 'signal of the running run');
  await tick;
  const now = o.now().getTime();
  for (const id of [running.id, pending.id, kid.id]) {
    const r = await row(o, id);
    t.is(r.status, 'canceled', id);
    t.is(r.finishedAt?.getTime(), now);
  }
  t.true((await row(o, kid.id)).finishedAt!.getTime() <= (await row(o, pending.id)).finishedAt!.getTime());
  t.is((await row(o, abandoned.id)).status, 'pending', 'abandon child is left alone');
  t.deepEqual(await row(o, done.id), doneBefore, 'completed run unchanged');
  t.deepEqual(await row(o, failed.id), failedBefore, 'failed run unchanged');
  t.is((await row(o, other.id)).status, 'pending', 'other scope untouched');
  t.is(await o.cancelForScope('Order', 'c'), 0, 'nothing live is left');
  t.is(await o.cancelForScope('Order', 'nope'), 0);
});

test('cancelForScope: the count includes scope runs canceled through the cascade of another scope run', async (t) => {
  // Doc comment of Engine::cancel_for_scope: "returns how many of the scope's runs were canceled".
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  const S = { entityType: 'Order', entityId: 'nested' };
  const parent = await o.start('q.a', {}, { scope: S });
  o.advanceTime(1);
  const child = await o.start('q.a', {}, { scope: S, parentRunId: parent.id });
  const n = await o.cancelForScope('Order', 'nested');
  t.is((await row(o, parent.id)).status, 'canceled');
  t.is((await row(o, child.id)).status, 'canceled');
  t.is(n, 2, 'two runs of the scope went from live to canceled');
});

// ─── rescheduleForScope ─────────────────────────────────────────────────────

test('rescheduleForScope: moves runAt of pending runs only; running and terminal runs keep theirs', async (t) => {
  const o = manual();
  const h = hanging();
  o.registerHandler('q.a', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler('q.hang', {}, h.handler);
  o.registerHandler('q.retry', { retry: { attempts: 3, backoff: 'fixed', baseMs: 60_000 } }, boom);
  const S = { entityType: 'Order', entityId: 'r' };
  const P = uniqPool();
  // A pending run waiting for its retry (status pending, error set).
  const retrying = await o.start('q.retry', {}, { scope: S, pool: P });
  await execRun(o, retrying);
  t.is((await row(o, retrying.id)).status, 'pending');
  o.advanceTime(1);
  const due = await o.start('q.a', {}, { scope: S, pool: P });
  const future = await o.start('q.a', {}, { scope: S, pool: P, runAt: new Date(o.now().getTime() + 3_600_000) });
  const running = await o.start('q.hang', {}, { scope: S, pool: uniqPool() });
  await claimRun(o, running);
  const tick = o.tick(running.id);
  await h.entered();
  const done = await o.start('q.a', {}, { scope: S, pool: uniqPool() });
  await execRun(o, done);
  const failed = await o.start('q.boom', {}, { scope: S, pool: uniqPool() });
  await execRun(o, failed);
  const canceled = await o.start('q.a', {}, { scope: S, pool: uniqPool() });
  await o.cancel(canceled.id);
  const otherScope = await o.start('q.a', {}, { scope: { entityType: 'Order', entityId: 'r2' }, pool: P });
  const keep = new Map<string, number>();
  for (const r of [running, done, failed, canceled, otherScope]) keep.set(r.id, (await row(o, r.id)).runAt.getTime());

  o.advanceTime(10);
  const target = new Date(o.now().getTime() + 5 * 3_600_000);
  t.is(await o.rescheduleForScope('Order', 'r', target), 3);
  for (const r of [retrying, due, future]) {
    const x = await row(o, r.id);
    t.is(x.runAt.getTime(), target.getTime(), `${r.id} moved`);
    t.is(x.status, 'pending');
  }
  for (const [id, runAt] of keep) t.is((await row(o, id)).runAt.getTime(), runAt, `${id} keeps its runAt`);
  t.is((await row(o, running.id)).status, 'running');

  // The moved runs are not claimable before the new runAt; the other scope's run still is.
  t.is((await o.claimNext(P))?.id, otherScope.id);
  t.is(await o.claimNext(P), null);
  o.advanceTime(target.getTime() - o.now().getTime() - 1);
  t.is(await o.claimNext(P), null);
  o.advanceTime(1);
  t.is((await o.claimNext(P))?.id, retrying.id);

  // Moving into the past makes a future run claimable now.
  const P2 = uniqPool();
  const later = await o.start('q.a', {}, { scope: { entityType: 'Order', entityId: 'r3' }, pool: P2, runAt: new Date(o.now().getTime() + 99_999) });
  t.is(await o.claimNext(P2), null);
  const past = new Date(o.now().getTime() - 1000);
  t.is(await o.rescheduleForScope('Order', 'r3', past), 1);
  t.is((await row(o, later.id)).runAt.getTime(), past.getTime());
  t.is((await o.claimNext(P2))?.id, later.id);
  t.is(await o.rescheduleForScope('Order', 'r3', past), 0, 'the now-running run is not pending');
  t.is(await o.rescheduleForScope('Order', 'none', past), 0);

  h.attempts[0]!.release();
  await tick;
});

test('rescheduleForScope: an invalid Date is JobInputInvalidError and moves nothing', async (t) => {
  const o = manual();
  o.registerHandler('q.a', {}, ok);
  const r = await o.start('q.a', {}, { scope: { entityType: 'E', entityId: '1' } });
  await isInvalid(t, o.rescheduleForScope('E', '1', new Date(NaN)), 'NaN date');
  await isInvalid(t, o.rescheduleForScope('E', '1', 123 as unknown as Date), 'number');
  t.is((await row(o, r.id)).runAt.getTime(), r.runAt.getTime());
});

// ─── countByPoolAndStatus ───────────────────────────────────────────────────

test('countByPoolAndStatus: groups sorted by pool then status, zero groups omitted, right across transitions', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler('q.retry', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, boom);
  const created: string[] = [];
  const check = async (expected: PoolStatusCount[], label: string): Promise<void> => {
    const got = await o.countByPoolAndStatus();
    t.deepEqual(got, expected, label);
    const rows = await Promise.all(created.map((id) => row(o, id)));
    t.deepEqual(got, countsOf(rows), `${label}: agrees with the rows`);
  };
  await check([], 'empty store');
  const start = async (type: string, pool: string): Promise<JobRun> => {
    const r = await o.start(type, {}, { pool });
    created.push(r.id);
    o.advanceTime(1);
    return r;
  };
  const a1 = await start('q.ok', 'batch');
  const a2 = await start('q.ok', 'batch');
  const a3 = await start('q.ok', 'batch');
  const f1 = await start('q.boom', 'fast');
  const r1 = await start('q.retry', 'fast');
  const z1 = await start('q.ok', 'alpha');
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'pending', count: 3 },
      { pool: 'fast', status: 'pending', count: 2 },
    ],
    'after start',
  );
  t.is((await o.claimNext('batch'))?.id, a1.id);
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'batch', status: 'running', count: 1 },
      { pool: 'fast', status: 'pending', count: 2 },
    ],
    'after claim',
  );
  await o.tick(a1.id);
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'fast', status: 'pending', count: 2 },
    ],
    'after complete',
  );
  t.is((await o.claimNext('fast'))?.id, f1.id);
  await o.tick(f1.id);
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'fast', status: 'failed', count: 1 },
      { pool: 'fast', status: 'pending', count: 1 },
    ],
    'after fail',
  );
  t.is((await o.claimNext('fast'))?.id, r1.id);
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'fast', status: 'failed', count: 1 },
      { pool: 'fast', status: 'running', count: 1 },
    ],
    'after claiming the retrying run (fast pending group gone)',
  );
  await o.tick(r1.id);
  t.is((await row(o, r1.id)).status, 'pending');
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'fast', status: 'failed', count: 1 },
      { pool: 'fast', status: 'pending', count: 1 },
    ],
    'after a failed attempt that will retry',
  );
  await o.cancel(a2.id);
  await o.cancel(z1.id);
  await check(
    [
      { pool: 'alpha', status: 'canceled', count: 1 },
      { pool: 'batch', status: 'canceled', count: 1 },
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 1 },
      { pool: 'fast', status: 'failed', count: 1 },
      { pool: 'fast', status: 'pending', count: 1 },
    ],
    'after cancel',
  );
  await o.replay(f1.id);
  await o.replay(a1.id);
  await o.replay(z1.id);
  await check(
    [
      { pool: 'alpha', status: 'pending', count: 1 },
      { pool: 'batch', status: 'canceled', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
      { pool: 'fast', status: 'pending', count: 2 },
    ],
    'after replay',
  );
  // Drain everything: retry exhausts, replayed runs finish again.
  o.advanceTime(5000);
  for (;;) {
    const c = (await o.claimNext('fast')) ?? (await o.claimNext('batch')) ?? (await o.claimNext('alpha'));
    if (c === null) break;
    await o.tick(c.id);
  }
  t.is((await row(o, a3.id)).status, 'completed');
  await check(
    [
      { pool: 'alpha', status: 'completed', count: 1 },
      { pool: 'batch', status: 'canceled', count: 1 },
      { pool: 'batch', status: 'completed', count: 2 },
      { pool: 'fast', status: 'failed', count: 2 },
    ],
    'after draining',
  );
});

test('countByPoolAndStatus: cascades, replace collisions and timeouts are counted too', async (t) => {
  const o = manual();
  const h = hanging();
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler('q.slow', { timeoutMs: 10, pool: 'slow' }, h.handler);
  o.registerHandler('q.repl', { concurrency: { key: '{{k}}', collisionMode: 'replace' }, pool: 'repl' }, ok);
  const created: string[] = [];
  const track = (r: JobRun): JobRun => {
    created.push(r.id);
    return r;
  };
  const parent = track(await o.start('q.boom', {}, { pool: 'p' }));
  for (let i = 0; i < 3; i++) track(await o.start('q.ok', {}, { parentRunId: parent.id, pool: 'kids' }));
  track(await o.start('q.repl', { k: 'x' }));
  track(await o.start('q.repl', { k: 'x' }));
  track(await o.start('q.repl', { k: 'x' }));
  const slow = track(await o.start('q.slow', {}));
  await execRun(o, parent); // fails → cascades to 3 kids
  await claimRun(o, slow);
  const tick = o.tick(slow.id);
  await h.entered();
  o.advanceTime(10);
  await tick;
  const expected: PoolStatusCount[] = [
    { pool: 'kids', status: 'canceled', count: 3 },
    { pool: 'p', status: 'failed', count: 1 },
    { pool: 'repl', status: 'canceled', count: 2 },
    { pool: 'repl', status: 'pending', count: 1 },
    { pool: 'slow', status: 'timed_out', count: 1 },
  ];
  t.deepEqual(await o.countByPoolAndStatus(), expected);
  t.deepEqual(await o.countByPoolAndStatus(), countsOf(await Promise.all(created.map((id) => row(o, id)))));
});

// ─── listRecentFailed ───────────────────────────────────────────────────────

test('listRecentFailed: failed runs only, most recently finished first (ties by id desc), limit; replay removes, re-failure moves to front', async (t) => {
  const o = manual();
  const h = hanging();
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler('q.slow', { timeoutMs: 5 }, h.handler);
  // created in this order, but finished in a different one
  const f1 = await o.start('q.boom', {}, { pool: uniqPool() });
  const f2 = await o.start('q.boom', {}, { pool: uniqPool() });
  const f3 = await o.start('q.boom', {}, { pool: uniqPool() });
  const f4 = await o.start('q.boom', {}, { pool: uniqPool() });
  const f5 = await o.start('q.boom', {}, { pool: uniqPool() });
  await execRun(o, f4);
  o.advanceTime(10);
  // f1, f2, f5 finish in the same millisecond
  await execRun(o, f5);
  await execRun(o, f1);
  await execRun(o, f2);
  o.advanceTime(10);
  const timedOut = await o.start('q.slow', {}, { pool: uniqPool() });
  await claimRun(o, timedOut);
  const tick = o.tick(timedOut.id);
  await h.entered();
  o.advanceTime(5);
  await tick;
  t.is((await row(o, timedOut.id)).status, 'timed_out');
  const canceled = await o.start('q.boom', {}, { pool: uniqPool() });
  await o.cancel(canceled.id);
  const done = await o.start('q.ok', {}, { pool: uniqPool() });
  await execRun(o, done);
  o.advanceTime(10);
  await execRun(o, f3);

  const tie = [f1, f2, f5].map((r) => r.id).sort().reverse();
  const expected = [f3.id, ...tie, f4.id];
  const list = await o.listRecentFailed();
  t.deepEqual(ids(list), expected);
  for (const r of list) t.is((await row(o, r.runId)).status, 'failed');
  for (let i = 1; i < list.length; i++) {
    t.true(list[i - 1]!.failedAt.getTime() >= list[i]!.failedAt.getTime());
  }
  t.deepEqual(ids(await o.listRecentFailed(2)), expected.slice(0, 2));
  t.deepEqual(ids(await o.listRecentFailed(1)), expected.slice(0, 1));

  await o.replay(f4.id);
  t.deepEqual(ids(await o.listRecentFailed()), expected.slice(0, 4), 'a replayed run is no longer failed');
  o.advanceTime(10);
  await execRun(o, f4);
  t.deepEqual(ids(await o.listRecentFailed()), [f4.id, ...expected.slice(0, 4)], 'failing again puts it first');
});

test('listRecentFailed: default limit 50, maximum 500; a malformed limit is JobInputInvalidError', async (t) => {
  const o = manual();
  o.registerHandler('q.boom', {}, boom);
  const runs: JobRun[] = [];
  for (let i = 0; i < 520; i++) runs.push(await o.start('q.boom', { i }));
  for (const r of runs) {
    await execRun(o, r);
    o.advanceTime(1);
  }
  const desc = ids(runs).reverse();
  t.deepEqual(ids(await o.listRecentFailed()), desc.slice(0, 50));
  t.deepEqual(ids(await o.listRecentFailed(500)), desc.slice(0, 500));
  t.deepEqual(ids(await o.listRecentFailed(501)), desc.slice(0, 500));
  t.deepEqual(ids(await o.listRecentFailed(1e9)), desc.slice(0, 500));
  t.deepEqual(ids(await o.listRecentFailed(3)), desc.slice(0, 3));
  await isInvalid(t, o.listRecentFailed(0), 'limit 0');
  await isInvalid(t, o.listRecentFailed(-5), 'limit -5');
  await isInvalid(t, o.listRecentFailed(1.5), 'limit 1.5');
  await isInvalid(t, o.listRecentFailed(NaN), 'limit NaN');
  await isInvalid(t, o.listRecentFailed('5' as unknown as number), "limit '5'");
});

// ─── listJobRuns ────────────────────────────────────────────────────────────

test('listJobRuns: newest first by (createdAt, id) — runs of one millisecond are ordered by id descending', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const older: JobRun[] = [];
  const newer: JobRun[] = [];
  for (let i = 0; i < 25; i++) older.push(await o.start('q.ok', { i }));
  o.advanceTime(1);
  for (let i = 0; i < 25; i++) newer.push(await o.start('q.ok', { i }));
  const byIdDesc = (rs: JobRun[]) => ids(rs).sort().reverse();
  const expected = [...byIdDesc(newer), ...byIdDesc(older)];
  const all = await o.listJobRuns({ limit: 500 });
  t.deepEqual(ids(all.items), expected);
  t.is(all.nextCursor, null);
  for (const limit of [1, 3, 4, 24, 25, 26, 49]) {
    const w = await walkPages(o, { limit });
    t.deepEqual(ids(w.items), expected, `pages of ${limit}`);
    t.true(w.pages.slice(0, -1).every((p) => p.length === limit));
  }
});

test('listJobRuns: system clock — many runs share a millisecond and the order is still (createdAt desc, id desc)', async (t) => {
  const o = system();
  o.registerHandler('q.ok', {}, ok);
  const runs: JobRun[] = [];
  for (let i = 0; i < 3000; i++) runs.push(await o.start('q.ok', { i }));
  const perMs = new Map<number, number>();
  for (const r of runs) perMs.set(r.createdAt.getTime(), (perMs.get(r.createdAt.getTime()) ?? 0) + 1);
  t.true([...perMs.values()].some((n) => n > 1), 'some runs share a millisecond');
  const w = await walkPages(o, { limit: 97 });
  t.deepEqual(ids(w.items), ids(newestFirst(runs)));
  t.is(firstOrderViolation(w.items), -1);
});

test('listJobRuns: poolId, status (one or a set), since and rootRunId filters, alone and combined, with paging', async (t) => {
  const o = manual();
  const rnd = prng(42);
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  const pools = ['p0', 'p1', 'p2'];
  const created: JobRun[] = [];
  const roots: JobRun[] = [];
  for (let i = 0; i < 400; i++) {
    const pool = pools[Math.floor(rnd() * 3)]!;
    const parent = roots.length > 0 && rnd() < 0.5 ? created[Math.floor(rnd() * created.length)] : undefined;
    const r = await o.start(rnd() < 0.3 ? 'q.boom' : 'q.ok', { i }, { pool, parentRunId: parent?.id });
    created.push(r);
    if (!parent) roots.push(r);
    const roll = rnd();
    if (roll < 0.25) {
      const c = await o.claimNext(pool);
      if (c && rnd() < 0.7) await o.tick(c.id);
    } else if (roll < 0.35) {
      await o.cancel(r.id, { cascade: false });
    }
    if (rnd() < 0.4) o.advanceTime(Math.floor(rnd() * 3));
  }
  const rows = await Promise.all(created.map((r) => row(o, r.id)));
  const statuses = new Set(rows.map((r) => r.status));
  t.true(statuses.size >= 4, `varied statuses: ${[...statuses].join(',')}`);
  const bigRoot = [...roots].sort(
    (a, b) => rows.filter((r) => r.rootRunId === b.id).length - rows.filter((r) => r.rootRunId === a.id).length,
  )[0]!;
  t.true(rows.filter((r) => r.rootRunId === bigRoot.id).length >= 5, 'a tree with several runs');
  const times = rows.map((r) => r.createdAt.getTime()).sort((a, b) => a - b);
  const mid = new Date(times[Math.floor(times.length / 2)]!);

  const poolOpts = [undefined, 'p0', 'p2', 'nope'];
  const statusOpts: (JobRunStatus | JobRunStatus[] | undefined)[] = [
    undefined,
    'pending',
    'running',
    'completed',
    'failed',
    'canceled',
    ['pending', 'running'],
    ['failed', 'canceled', 'failed'],
    [],
  ];
  const rootOpts = [undefined, bigRoot.id, roots[1]!.id, randomUUID()];
  const sinceOpts = [undefined, mid, new Date(times[0]!), new Date(times[times.length - 1]! + 1)];
  let combos = 0;
  for (const poolId of poolOpts)
    for (const status of statusOpts)
      for (const rootRunId of rootOpts)
        for (const since of sinceOpts) {
          const expected = newestFirst(
            rows.filter(
              (r) =>
                (poolId === undefined || r.pool === poolId) &&
                (status === undefined || (Array.isArray(status) ? status.includes(r.status) : r.status === status)) &&
                (rootRunId === undefined || r.rootRunId === rootRunId) &&
                (since === undefined || r.createdAt.getTime() >= since.getTime()),
            ),
          );
          const label = JSON.stringify({ poolId, status, rootRunId, since });
          const limit = 1 + (combos % 9);
          const w = await walkPages(o, { poolId, status, rootRunId, since, limit });
          if (ids(w.items).join() !== ids(expected).join()) {
            t.deepEqual(ids(w.items), ids(expected), label);
            return;
          }
          if (!w.pages.slice(0, -1).every((p) => p.length === limit)) {
            t.fail(`${label}: a non-final page is short`);
            return;
          }
          combos++;
        }
  t.is(combos, poolOpts.length * statusOpts.length * rootOpts.length * sinceOpts.length);
  // one explicit spot-check of inclusive since
  const exact = rows.filter((r) => r.createdAt.getTime() === mid.getTime());
  const got = (await o.listJobRuns({ since: mid, limit: 500 })).items;
  for (const r of exact) t.true(ids(got).includes(r.id), 'since is inclusive');
});

forBackends('listJobRuns: a status set lists the runs in any of its statuses, newest first, in pages', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('qs.ok', {}, ok);
  o.registerHandler('qs.boom', {}, boom);
  const started: JobRun[] = [];
  for (let i = 0; i < 36; i++) {
    const pool = i % 3 === 0 ? 'qs1' : 'qs0';
    const r = await o.start(i % 4 === 0 ? 'qs.boom' : 'qs.ok', { i }, { pool });
    started.push(r);
    if (i % 5 === 1) await o.cancel(r.id);
    else if (i % 5 === 2 || i % 5 === 3) {
      const c = await o.claimNext(pool);
      if (c && i % 5 === 2) await o.tick(c.id);
    }
    if (i % 2 === 0) o.advanceTime(1);
  }
  const rows = await Promise.all(started.map((r) => row(o, r.id)));
  for (const s of ['pending', 'running', 'completed', 'failed', 'canceled'] as const) {
    t.true(rows.some((r) => r.status === s), `some run is ${s}`);
  }
  const sets: JobRunStatus[][] = [['pending', 'running'], ['completed', 'failed', 'canceled'], ['failed', 'failed'], []];
  for (const status of sets)
    for (const poolId of [undefined, 'qs1']) {
      const want = newestFirst(rows.filter((r) => status.includes(r.status) && (poolId === undefined || r.pool === poolId)));
      const w = await walkPages(o, { status, poolId, limit: 4 });
      t.deepEqual(ids(w.items), ids(want), JSON.stringify({ status, poolId }));
    }
  await isInvalid(t, o.listJobRuns({ status: ['running', 'nope' as JobRunStatus] }), 'unknown status in a set');
});

test('listJobRuns: limit default 50 and maximum 500; nextCursor null on the last page (also when it is exactly full)', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const runs: JobRun[] = [];
  for (let i = 0; i < 600; i++) {
    runs.push(await o.start('q.ok', { i }));
    if (i % 7 === 0) o.advanceTime(1);
  }
  const desc = ids(newestFirst(runs));
  const d = await o.listJobRuns();
  t.deepEqual(ids(d.items), desc.slice(0, 50), 'default limit 50');
  t.is(typeof d.nextCursor, 'string');
  const big = await o.listJobRuns({ limit: 1e9 });
  t.deepEqual(ids(big.items), desc.slice(0, 500), 'clamped to 500');
  const max = await o.listJobRuns({ limit: 501 });
  t.is(max.items.length, 500);
  const rest = await o.listJobRuns({ limit: 501, cursor: max.nextCursor! });
  t.deepEqual(ids(rest.items), desc.slice(500));
  t.is(rest.nextCursor, null);
  // 600 = 6 pages of exactly 100: the sixth page is full and has no next cursor.
  const w = await walkPages(o, { limit: 100 });
  t.is(w.pages.length, 6);
  t.true(w.pages.every((p) => p.length === 100));
  t.deepEqual(ids(w.items), desc);
  const one = await o.listJobRuns({ limit: 600 });
  t.is(one.items.length, 500);
  // Empty result
  const none = await o.listJobRuns({ poolId: 'nope' });
  t.deepEqual(none, { items: [], nextCursor: null });
  await isInvalid(t, o.listJobRuns({ limit: 0 }), 'limit 0');
  await isInvalid(t, o.listJobRuns({ limit: -3 }), 'limit -3');
  await isInvalid(t, o.listJobRuns({ limit: 2.5 }), 'limit 2.5');
  await isInvalid(t, o.listJobRuns({ limit: '5' as unknown as number }), "limit '5'");
  await isInvalid(t, o.listJobRuns({ status: 'nope' as JobRunStatus }), 'status');
  await isInvalid(t, o.listJobRuns({ status: ['pending', 'nope' as JobRunStatus] }), 'status set');
  await isInvalid(t, o.listJobRuns({ status: [7 as unknown as JobRunStatus] }), 'status set of numbers');
  await isInvalid(t, o.listJobRuns({ since: new Date(NaN) }), 'since');
  await isInvalid(t, o.listJobRuns({ poolId: 5 as unknown as string }), 'poolId');
});

test('listJobRuns: NaN and Infinity limits are rejected (or clamped), never silently replaced by the default', async (t) => {
  // src/lib.rs page_limit: "anything but a positive integer is an error"; listRecentFailed(NaN) throws.
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  for (let i = 0; i < 120; i++) await o.start('q.ok', { i }, { scope: { entityType: 'E', entityId: '1' } });
  await isInvalid(t, o.listRecentFailed(NaN), 'listRecentFailed NaN');
  await isInvalid(t, o.listJobRuns({ limit: NaN }), 'listJobRuns NaN');
  await isInvalid(t, o.listForScope('E', '1', { limit: NaN }), 'listForScope NaN');
  for (const [label, p] of [
    ['listJobRuns Infinity', o.listJobRuns({ limit: Infinity }).then((r) => r.items.length)],
    ['listForScope Infinity', o.listForScope('E', '1', { limit: Infinity }).then((r) => r.length)],
  ] as const) {
    const n = await p.catch((e: unknown) => (e instanceof JobInputInvalidError ? 'invalid' : e));
    t.true(n === 'invalid' || n === 120, `${label}: got ${String(n)} (expected JobInputInvalidError or the clamped maximum)`);
  }
});

test('listJobRuns: a malformed cursor is JobInputInvalidError', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  for (let i = 0; i < 5; i++) await o.start('q.ok', { i });
  const { nextCursor } = await o.listJobRuns({ limit: 2 });
  t.is(typeof nextCursor, 'string');
  const c = nextCursor!;
  const bad = [
    '',
    'x',
    'not-a-cursor',
    c.slice(0, -1),
    `${c}0`,
    `${c.slice(0, -1)}g`,
    `zz${c.slice(2)}`,
    c.split('').reverse().join(''),
    Buffer.from(c).toString('base64'),
    ' '.repeat(c.length),
    '{"createdAt":1,"id":"x"}',
  ];
  for (const b of bad) await isInvalid(t, o.listJobRuns({ cursor: b }), `cursor ${JSON.stringify(b)}`);
  await isInvalid(t, o.listJobRuns({ cursor: 42 as unknown as string }), 'numeric cursor');
  await isInvalid(t, o.listJobRuns({ cursor: {} as unknown as string }), 'object cursor');
  // The real cursor still works afterwards.
  t.is((await o.listJobRuns({ cursor: c, limit: 500 })).items.length, 3);
});

test('listJobRuns: a cursor with a sign character is malformed too', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  for (let i = 0; i < 3; i++) await o.start('q.ok', { i });
  const c = (await o.listJobRuns({ limit: 1 })).nextCursor!;
  // The cursor is opaque; '+' is not a character the API ever produces in one.
  const signed = `${c.slice(0, 2)}+${c.slice(3)}`;
  t.not(signed, c);
  await isInvalid(t, o.listJobRuns({ cursor: signed }), `cursor ${signed}`);
});

test('listJobRuns: a malformed cursor with multi-byte characters is a typed error and does not crash the process', (t) => {
  // CONTRACT.md "Errors": no input, however malformed, may crash the process.
  const dist = path.join(__dirname, '..', 'dist');
  const script = `
    const { JobOrchestrator } = require(${JSON.stringify(dist)});
    (async () => {
      const o = new JobOrchestrator({ clock: 'manual' });
      o.registerHandler('a', {}, async () => ({}));
      for (let i = 0; i < 3; i++) await o.start('a', {});
      const bad = ['c1' + 'a'.repeat(15) + '\\u00e9' + 'a'.repeat(31), 'c1' + '\\u20ac'.repeat(16), 'c1' + '\\u00e9'.repeat(24)];
      const out = [];
      for (const c of bad) {
        try { await o.listJobRuns({ cursor: c }); out.push('accepted'); } catch (e) { out.push(e && e.name); }
      }
      console.log(JSON.stringify(out));
    })();
  `;
  const res = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30_000 });
  t.is(res.signal, null, `killed by ${res.signal}: ${res.stderr.slice(0, 400)}`);
  t.is(res.status, 0, res.stderr.slice(0, 400));
  t.deepEqual(res.stdout.trim(), JSON.stringify(['JobInputInvalidError', 'JobInputInvalidError', 'JobInputInvalidError']));
});

test('listJobRuns: rootRunId returns only runs whose rootRunId is that id (a child id is not a root)', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const root = await o.start('q.ok', {});
  o.advanceTime(1);
  const child = await o.start('q.ok', {}, { parentRunId: root.id });
  o.advanceTime(1);
  const grandchild = await o.start('q.ok', {}, { parentRunId: child.id });
  t.deepEqual(ids((await o.listJobRuns({ rootRunId: root.id })).items), [grandchild.id, child.id, root.id]);
  const page = await o.listJobRuns({ rootRunId: child.id });
  for (const r of page.items) t.is(r.rootRunId, child.id, `run ${r.runId} has rootRunId ${r.rootRunId}`);
  t.deepEqual(ids(page.items), []);
});

test('listJobRuns: walking 10,000 runs in pages of 100 while new runs start — each earlier run exactly once, no gap (system clock)', async (t) => {
  const o = system();
  o.registerHandler('q.ok', {}, ok);
  const before: JobRun[] = [];
  for (let i = 0; i < 10_000; i++) before.push(await o.start('q.ok', { i }, { pool: i % 4 === 0 ? 'other' : 'batch' }));
  const perMs = new Map<number, number>();
  for (const r of before) perMs.set(r.createdAt.getTime(), (perMs.get(r.createdAt.getTime()) ?? 0) + 1);
  t.true([...perMs.values()].some((n) => n > 1), 'ties on createdAt exist');

  const startedDuring: string[] = [];
  const w = await walkPages(o, { limit: 100 }, async (page) => {
    for (let k = 0; k < 5; k++) startedDuring.push((await o.start('q.ok', { page, k })).id);
    if (page % 10 === 0) {
      const c = await o.claimNext('batch');
      if (c) await o.tick(c.id);
    }
    await nextTurn();
  });
  const seen = new Map<string, number>();
  for (const r of w.items) seen.set(r.runId, (seen.get(r.runId) ?? 0) + 1);
  t.is(seen.size, w.items.length, 'no row appears twice');
  const missing = before.filter((r) => seen.get(r.id) !== 1);
  t.is(missing.length, 0, `runs not seen exactly once: ${missing.length}`);
  t.is(firstOrderViolation(w.items), -1, 'strictly newest first across pages');
  t.true(w.pages.slice(0, -1).every((p) => p.length === 100), 'every page but the last is full');
  t.true(w.pages.length >= 100);
  t.true(w.pages[w.pages.length - 1]!.length <= 100);
  t.true(startedDuring.length >= 99 * 5);
  // After the walk, everything (earlier + new) is listed newest-first.
  const after = await walkPages(o, { limit: 500 });
  t.is(after.items.length, 10_000 + startedDuring.length);
});

test('listJobRuns: walking 10,000 runs (three tenants, pool filter, manual clock) while new runs start — each earlier run of the tenant exactly once', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('q.ok', {}, ok);
  const tenants: (string | null)[] = ['A', 'B', null];
  const before: JobRun[] = [];
  for (let i = 0; i < 10_000; i++) {
    const tenantId = tenants[i % 3]!;
    before.push(await o.start('q.ok', { i }, { tenantId, pool: i % 5 === 0 ? 'rare' : 'batch' }));
    if (i % 13 === 0) o.advanceTime(1);
  }
  let extra = 0;
  const between = async (page: number): Promise<void> => {
    for (const tenantId of tenants) {
      await o.start('q.ok', { page }, { tenantId, pool: 'batch' });
      await o.start('q.ok', { page }, { tenantId, pool: 'rare' });
      extra += 2;
    }
    if (page % 2 === 0) o.advanceTime(1);
  };
  for (const [tenantId, poolId] of [
    ['A', undefined],
    [null, 'batch'],
    ['B', 'rare'],
  ] as const) {
    const label = `tenant ${tenantId} pool ${poolId}`;
    const expected = before.filter((r) => r.tenantId === tenantId && (poolId === undefined || r.pool === poolId));
    const w = await walkPages(o, { tenantId, poolId, limit: 100 }, between);
    const seen = new Map<string, number>();
    for (const r of w.items) seen.set(r.runId, (seen.get(r.runId) ?? 0) + 1);
    t.is(seen.size, w.items.length, `${label}: no duplicates`);
    t.is(expected.filter((r) => seen.get(r.id) !== 1).length, 0, `${label}: every earlier run exactly once`);
    t.true(
      w.items.every((r) => r.tenantId === tenantId && (poolId === undefined || r.pool === poolId)),
      `${label}: only matching rows`,
    );
    t.is(firstOrderViolation(w.items), -1, `${label}: strictly newest first`);
    t.true(w.pages.slice(0, -1).every((p) => p.length === 100), `${label}: full pages`);
  }
  t.true(extra > 0);
});

/** Rows a listJobRuns page examines at most when it checks them one by one (`PAGE_WALK_BUDGET` in the engine). */
const WALK_BUDGET = 5000;

/** Starts `n` runs of `type` through startMany, in batches. */
async function startN(o: JobOrchestrator, type: string, n: number, opts?: { tenantId?: string; scope?: { entityType: string; entityId: string } }): Promise<JobRun[]> {
  const out: JobRun[] = [];
  for (let i = 0; i < n; i += 1000) {
    const k = Math.min(1000, n - i);
    out.push(...(await o.startMany(Array.from({ length: k }, (_, j) => ({ type, input: { i: i + j }, opts })))));
  }
  return out;
}

forBackends('listJobRuns jobType: a page that examined 5,000 runs before it filled returns what it found and a cursor; paging on finds every match once', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('qt.rare', {}, ok);
  o.registerHandler('qt.common', {}, ok);
  o.registerHandler('qt.none', {}, ok);
  const old = await startN(o, 'qt.rare', 3);
  o.advanceTime(1);
  await startN(o, 'qt.common', WALK_BUDGET + 500);
  o.advanceTime(1);
  const young = await startN(o, 'qt.rare', 2);
  const rare = newestFirst([...old, ...young]);

  const w = await walkPages(o, { jobType: 'qt.rare', limit: 4 });
  t.deepEqual(w.pages.map((p) => p.length), [2, 3], 'the first page ran out of rows to examine with 2 of its 4');
  t.deepEqual(ids(w.items), ids(rare), 'every rare run once, newest first');
  t.true(w.items.every((r) => r.jobType === 'qt.rare'));
  const first = await o.listJobRuns({ jobType: 'qt.rare', limit: 4 });
  t.is(first.items.length, 2);
  t.is(typeof first.nextCursor, 'string', 'a short page with a cursor is not the last');

  // No run of the type: empty pages with a cursor, then the end.
  const none = await walkPages(o, { jobType: 'qt.none', limit: 50 });
  t.deepEqual(none.pages.map((p) => p.length), [0, 0]);
  // A dense type fills its pages.
  const common = await o.listJobRuns({ jobType: 'qt.common', limit: 500 });
  t.is(common.items.length, 500);
  t.true(common.items.every((r) => r.jobType === 'qt.common'));

  // With a status and a pool: the walk is over those runs.
  await o.cancel(old[1]!.id);
  const canceled = await walkPages(o, { jobType: 'qt.rare', status: 'canceled', limit: 4 });
  t.deepEqual(ids(canceled.items), [old[1]!.id]);
  const pending = await walkPages(o, { jobType: 'qt.rare', status: ['pending'], poolId: 'batch', limit: 1 });
  t.deepEqual(ids(pending.items), ids(rare.filter((r) => r.id !== old[1]!.id)));
});

forBackends('listJobRuns scope: the scope\'s runs newest first in pages, with a job type, each tenant its own', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('qsc.a', {}, ok);
  o.registerHandler('qsc.b', {}, ok);
  const acct = (entityId: string) => ({ entityType: 'acct', entityId });
  const mine: JobRun[] = [];
  for (let i = 0; i < 24; i++) {
    mine.push(await o.start(i % 3 === 0 ? 'qsc.b' : 'qsc.a', { i }, { tenantId: 'x', scope: acct(i % 4 === 0 ? '2' : '1') }));
    await o.start('qsc.a', { i }, { tenantId: 'y', scope: acct('1') });
    if (i % 5 === 0) o.advanceTime(1);
  }
  await o.start('qsc.a', {}, { tenantId: 'x' });
  const scope1 = newestFirst(mine.filter((r) => r.scopeEntityId === '1'));
  for (const limit of [1, 4, 50]) {
    const w = await walkPages(o, { tenantId: 'x', scopeEntityType: 'acct', scopeEntityId: '1', limit });
    t.deepEqual(ids(w.items), ids(scope1), `pages of ${limit}`);
    t.true(w.pages.slice(0, -1).every((p) => p.length === limit), `full pages of ${limit}`);
  }
  const b = await walkPages(o, { tenantId: 'x', scopeEntityType: 'acct', scopeEntityId: '1', jobType: 'qsc.b', limit: 2 });
  t.deepEqual(ids(b.items), ids(scope1.filter((r) => r.jobType === 'qsc.b')));
  t.true(b.items.length > 0);
  t.deepEqual((await o.listJobRuns({ tenantId: 'y', scopeEntityType: 'acct', scopeEntityId: '1', jobType: 'qsc.b' })).items, []);
  t.is((await o.listJobRuns({ tenantId: 'y', scopeEntityType: 'acct', scopeEntityId: '1', limit: 500 })).items.length, 24);
  t.deepEqual(await o.listJobRuns({ tenantId: 'z', scopeEntityType: 'acct', scopeEntityId: '1' }), { items: [], nextCursor: null });
  t.deepEqual((await o.listJobRuns({ tenantId: 'x', scopeEntityType: 'acct', scopeEntityId: 'none' })).items, []);
});

forBackends('listJobRuns jobType and scope: the tenant gate, and bad values are JobInputInvalidError', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('qg.a', {}, ok);
  const a = await o.start('qg.a', {}, { tenantId: 'a', scope: { entityType: 'acct', entityId: '1' } });
  const b = await o.start('qg.a', {}, { tenantId: 'b', scope: { entityType: 'acct', entityId: '1' } });
  t.deepEqual(ids((await o.listJobRuns({ tenantId: 'a', jobType: 'qg.a' })).items), [a.id]);
  t.deepEqual(ids((await o.listJobRuns({ tenantId: 'b', scopeEntityType: 'acct', scopeEntityId: '1' })).items), [b.id]);
  await isMissingTenant(t, o.listJobRuns({ jobType: 'qg.a' }), 'listJobRuns');
  await isMissingTenant(t, o.listJobRuns({ scopeEntityType: 'acct', scopeEntityId: '1' }), 'listJobRuns');
  const before = await o.listJobRuns({ tenantId: 'a' });
  const bad: [string, ListJobRunsOptions][] = [
    ['jobType 7', { jobType: 7 as unknown as string }],
    ['jobType object', { jobType: {} as unknown as string }],
    ['scopeEntityType alone', { scopeEntityType: 'acct' }],
    ['scopeEntityId alone', { scopeEntityId: '1' }],
    ['scopeEntityId number', { scopeEntityType: 'acct', scopeEntityId: 1 as unknown as string }],
    ['scope object (unknown key)', { scope: { entityType: 'acct', entityId: '1' } } as unknown as ListJobRunsOptions],
  ];
  for (const [what, q] of bad) await isInvalid(t, o.listJobRuns({ tenantId: 'a', ...q }), what);
  t.deepEqual(await o.listJobRuns({ tenantId: 'a' }), before, 'nothing changed');
});

// ─── getRunTree ─────────────────────────────────────────────────────────────

function treeIds(n: RunTreeNode): unknown {
  return { id: n.run.id, status: n.run.status, children: n.children.map(treeIds) };
}

test('getRunTree: the root with its descendants (parent → children, created order), each with its current status', async (t) => {
  const o = manual();
  const hk1 = hanging();
  const spawned: JobRun[] = [];
  o.registerHandler(
    'tr.root',
    { pool: 'tr' },
    async (ctx: JobContext<unknown>) => {
      spawned.push(await ctx.spawnChild('tr.k1', { n: 1 }));
      o.advanceTime(1);
      spawned.push(await ctx.spawnChild('tr.k2', { n: 2 }, { closePolicy: 'abandon' }));
      return { ok: true };
    },
  );
  o.registerHandler('tr.k1', { pool: 'k1' }, hk1.handler);
  o.registerHandler('tr.k2', { pool: 'k2' }, boom);
  o.registerHandler('tr.k3', { pool: 'k3' }, ok);
  o.registerHandler('tr.g', { pool: 'g' }, ok);
  const root = await o.start('tr.root', {});
  const other = await o.start('tr.k3', {}, { pool: uniqPool() });
  await o.start('tr.k3', {}, { parentRunId: other.id, pool: uniqPool() });
  await execRun(o, root);
  const [k1, k2] = spawned as [JobRun, JobRun];
  o.advanceTime(1);
  const k3 = await o.start('tr.k3', {}, { parentRunId: root.id });
  o.advanceTime(1);
  const g1 = await o.start('tr.g', {}, { parentRunId: k1.id });
  o.advanceTime(1);
  const g2 = await o.start('tr.g', {}, { parentRunId: k2.id });
  o.advanceTime(1);
  const gg = await o.start('tr.g', {}, { parentRunId: g1.id, pool: uniqPool() });
  // statuses: k1 running, k2 failed (its child g2 canceled by the cascade), k3 canceled, g1 completed, gg pending
  await claimRun(o, k1);
  const tick = o.tick(k1.id);
  await hk1.entered();
  await execRun(o, k2);
  await o.cancel(k3.id);
  await execRun(o, g1);

  const tree = await o.getRunTree(root.id);
  t.truthy(tree);
  t.deepEqual(treeIds(tree!), {
    id: root.id,
    status: 'completed',
    children: [
      {
        id: k1.id,
        status: 'running',
        children: [{ id: g1.id, status: 'completed', children: [{ id: gg.id, status: 'pending', children: [] }] }],
      },
      { id: k2.id, status: 'failed', children: [{ id: g2.id, status: 'canceled', children: [] }] },
      { id: k3.id, status: 'canceled', children: [] },
    ],
  });
  // Nodes are full rows equal to findById, and each child's parent is its node's run.
  const visit = async (n: RunTreeNode): Promise<number> => {
    t.deepEqual(n.run, await row(o, n.run.id));
    t.is(n.run.rootRunId, root.id);
    let count = 1;
    for (const c of n.children) {
      t.is(c.run.parentRunId, n.run.id);
      count += await visit(c);
    }
    return count;
  };
  t.is(await visit(tree!), 7, 'the other root and its child are not part of the tree');
  t.is((await o.getRunTree(other.id))!.children.length, 1);
  t.is(await o.getRunTree(randomUUID()), null);
  t.is(await o.getRunTree('garbage'), null);
  hk1.attempts[0]!.release();
  await tick;
  t.is((await o.getRunTree(root.id))!.children[0]!.run.status, 'completed', 'status is current');
});

test('getRunTree: a deep chain nests correctly (1,000 levels)', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const root = await o.start('q.ok', {});
  const chain = [root.id];
  for (let i = 0; i < 999; i++) chain.push((await o.start('q.ok', {}, { parentRunId: chain[chain.length - 1] })).id);
  let node = await o.getRunTree(root.id);
  const got: string[] = [];
  while (node) {
    got.push(node.run.id);
    t.true(node.children.length <= 1);
    node = node.children[0] ?? null;
  }
  t.deepEqual(got, chain);
});

test('getRunTree: given a non-root run id, it returns null or that run with its real subtree (never a truncated tree)', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const root = await o.start('q.ok', {});
  const mid = await o.start('q.ok', {}, { parentRunId: root.id });
  const leaf = await o.start('q.ok', {}, { parentRunId: mid.id });
  const tree = await o.getRunTree(mid.id);
  if (tree === null) {
    t.pass('non-root ids are not trees');
  } else {
    t.deepEqual(treeIds(tree), {
      id: mid.id,
      status: 'pending',
      children: [{ id: leaf.id, status: 'pending', children: [] }],
    });
  }
});

// ─── steps: listSteps, findStep, recordStep ─────────────────────────────────

test('listSteps: the run\'s steps in seq order (not insertion order); other runs\' steps excluded; unknown run → []', async (t) => {
  const o = manual();
  o.registerHandler(
    'st.run',
    {},
    async (ctx: JobContext<unknown>) => {
      await ctx.step('one', () => ({ v: 1 }));
      await ctx.step('two', () => ({ v: 2 }));
      await ctx.step('three', () => {
        throw new Error('step three');
      });
    },
  );
  const r = await o.start('st.run', {}, { pool: uniqPool() });
  const other = await o.start('st.run', {}, { pool: uniqPool() });
  await execRun(o, r);
  await execRun(o, other);
  const steps = await o.listSteps(r.id);
  t.deepEqual(
    steps.map((s) => [s.stepId, s.seq, s.status]),
    [
      ['one', 1, 'completed'],
      ['two', 2, 'completed'],
      ['three', 3, 'failed'],
    ],
  );
  t.true(steps.every((s) => s.jobRunId === r.id && UUID_V4.test(s.id) && s.kind === 'task'));
  t.deepEqual(steps[0]!.output, { v: 1 });
  t.is(steps[2]!.error?.message, 'step three');
  // recorded rows with explicit seq: listed by seq, whatever the insertion order
  await o.recordStep({ jobRunId: r.id, stepId: 'z', seq: 10, status: 'pending' });
  await o.recordStep({ jobRunId: r.id, stepId: 'y', seq: 5, status: 'pending' });
  t.deepEqual(
    (await o.listSteps(r.id)).map((s) => [s.stepId, s.seq]),
    [
      ['one', 1],
      ['two', 2],
      ['three', 3],
      ['y', 5],
      ['z', 10],
    ],
  );
  t.is((await o.listSteps(other.id)).length, 3);
  t.deepEqual(await o.listSteps(randomUUID()), []);
  t.deepEqual(await o.listSteps('garbage'), []);
});

test('findStep: the row of (run, stepId) whatever its status; null for an unknown step or run', async (t) => {
  const o = manual();
  o.registerHandler(
    'st.find',
    {},
    async (ctx: JobContext<unknown>) => {
      await ctx.step('good', () => ({ g: 1 }));
      await ctx.step('bad', () => {
        throw new Error('bad step');
      });
    },
  );
  const r = await o.start('st.find', {}, { pool: uniqPool() });
  await execRun(o, r);
  const good = await o.findStep(r.id, 'good');
  t.is(good?.status, 'completed');
  t.deepEqual(good?.output, { g: 1 });
  t.is(good?.seq, 1);
  t.true(good?.finishedAt instanceof Date);
  const bad = await o.findStep(r.id, 'bad');
  t.is(bad?.status, 'failed');
  t.is(bad?.error?.message, 'bad step');
  t.deepEqual(bad, (await o.listSteps(r.id)).find((s) => s.stepId === 'bad'));
  t.is(await o.findStep(r.id, 'nope'), null);
  t.is(await o.findStep(randomUUID(), 'good'), null);
  t.is(await o.findStep('garbage', 'good'), null);
});

test('recordStep: inserts (seq = max + 1 or the given one), upserts one row per (run, stepId) keeping id/seq and absent fields', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const r = await o.start('q.ok', {});
  const started = new Date(o.now().getTime() - 500);
  const a = await o.recordStep({ jobRunId: r.id, stepId: 'a', status: 'running', input: { i: 1 }, startedAt: started, attempts: 1 });
  t.true(UUID_V4.test(a.id));
  t.is(a.jobRunId, r.id);
  t.is(a.seq, 1);
  t.is(a.kind, 'task');
  t.is(a.status, 'running');
  t.deepEqual(a.input, { i: 1 });
  t.is(a.output, null);
  t.is(a.error, null);
  t.is(a.attempts, 1);
  t.is(a.startedAt?.getTime(), started.getTime());
  t.is(a.finishedAt, null);
  const b = await o.recordStep({ jobRunId: r.id, stepId: 'b', status: 'completed', output: { o: 'b' } });
  t.is(b.seq, 2);
  t.is(b.attempts, 0);
  const c = await o.recordStep({ jobRunId: r.id, stepId: 'c', seq: 7, status: 'skipped' });
  t.is(c.seq, 7);
  const d = await o.recordStep({ jobRunId: r.id, stepId: 'd', status: 'pending' });
  t.is(d.seq, 8, 'max seq + 1');

  const finished = o.now();
  const a2 = await o.recordStep({
    jobRunId: r.id,
    stepId: 'a',
    status: 'failed',
    error: { message: 'nope', retryable: false, attempt: 1 },
    finishedAt: finished,
  });
  t.is(a2.id, a.id, 'same row');
  t.is(a2.seq, 1);
  t.is(a2.status, 'failed');
  t.deepEqual(a2.input, { i: 1 }, 'absent input kept');
  t.is(a2.attempts, 1, 'absent attempts kept');
  t.is(a2.startedAt?.getTime(), started.getTime(), 'absent startedAt kept');
  t.is(a2.finishedAt?.getTime(), finished.getTime());
  t.is(a2.error?.message, 'nope');
  const a3 = await o.recordStep({ jobRunId: r.id, stepId: 'a', status: 'completed', output: { done: true }, attempts: 2 });
  t.is(a3.status, 'completed');
  t.deepEqual(a3.output, { done: true });
  t.is(a3.attempts, 2);
  t.deepEqual(await o.findStep(r.id, 'a'), a3);
  const all = await o.listSteps(r.id);
  t.deepEqual(
    all.map((s) => [s.stepId, s.seq, s.status]),
    [
      ['a', 1, 'completed'],
      ['b', 2, 'completed'],
      ['c', 7, 'skipped'],
      ['d', 8, 'pending'],
    ],
  );
});

test('recordStep: a recorded completed step is memoized by ctx.step; new steps continue the seq', async (t) => {
  const o = manual();
  let calls = 0;
  const seen: unknown[] = [];
  o.registerHandler(
    'st.memo',
    {},
    async (ctx: JobContext<unknown>) => {
      seen.push(
        await ctx.step('pre', () => {
          calls++;
          return { fresh: true };
        }),
      );
      seen.push(await ctx.step('next', () => ({ n: 1 })));
    },
  );
  const r = await o.start('st.memo', {}, { pool: uniqPool() });
  await o.recordStep({ jobRunId: r.id, stepId: 'pre', status: 'completed', output: { recorded: 42 } });
  t.is((await execRun(o, r)).status, 'completed');
  t.is(calls, 0, 'fn of a recorded completed step is not called');
  t.deepEqual(seen, [{ recorded: 42 }, { n: 1 }]);
  t.deepEqual(
    (await o.listSteps(r.id)).map((s) => [s.stepId, s.seq]),
    [
      ['pre', 1],
      ['next', 2],
    ],
  );
});

test('recordStep: unknown run → JobRunNotFoundError; bad status, empty stepId or non-JSON values → JobInputInvalidError; nothing stored', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  const r = await o.start('q.ok', {});
  const unknown = randomUUID();
  const e = await t.throwsAsync(o.recordStep({ jobRunId: unknown, stepId: 's', status: 'completed' }), {
    instanceOf: JobRunNotFoundError,
  });
  t.is(e?.runId, unknown);
  await t.throwsAsync(o.recordStep({ jobRunId: 'garbage', stepId: 's', status: 'completed' }), {
    instanceOf: JobRunNotFoundError,
  });
  await isInvalid(t, o.recordStep({ jobRunId: r.id, stepId: 's', status: 'done' as 'completed' }), 'bad status');
  await isInvalid(t, o.recordStep({ jobRunId: r.id, stepId: '', status: 'completed' }), 'empty stepId');
  await isInvalid(t, o.recordStep({ jobRunId: r.id, stepId: 's', status: 'completed', output: () => 1 }), 'function output');
  await isInvalid(t, o.recordStep({ jobRunId: r.id, stepId: 's', status: 'completed', input: 1n }), 'BigInt input');
  await isInvalid(t, o.recordStep({ jobRunId: r.id, stepId: 's', status: 'completed', startedAt: new Date(NaN) }), 'bad date');
  await isInvalid(t, o.recordStep(null as unknown as Parameters<JobOrchestrator['recordStep']>[0]), 'null input');
  t.deepEqual(await o.listSteps(r.id), []);
  t.is(await o.findStep(r.id, 's'), null);
});

forBackends('recordStep: a value or step id the store cannot hold (NUL on PostgreSQL) is JobInputInvalidError, with nothing stored', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('q.ok', {}, ok);
  const r = await o.start('q.ok', {});
  const attempts = [
    { jobRunId: r.id, stepId: 's', status: 'completed' as const, output: { text: 'a\u0000b' } },
    { jobRunId: r.id, stepId: 's', status: 'completed' as const, input: 'a\u0000b' },
    { jobRunId: r.id, stepId: 'a\u0000b', status: 'completed' as const },
  ];
  for (const rec of attempts) {
    if (make.backend === 'postgres') await isInvalid(t, o.recordStep(rec), JSON.stringify(rec));
    else await o.recordStep(rec); // memory holds any text
  }
  if (make.backend === 'postgres') t.deepEqual(await o.listSteps(r.id), [], 'nothing stored');
  else t.is((await o.listSteps(r.id)).length, 2);
});

// A filter holding a text no run can hold (NUL, which PostgreSQL cannot
// store) names no run: the query matches nothing, as an unknown id does,
// instead of a JobStoreError from the server refusing the text.
forBackends('queries and scope operations whose filter holds a NUL match nothing (no store error); nothing changes', async (t, make) => {
  for (const multiTenant of [false, true]) {
    const o = await make.manual({ multiTenant });
    o.registerHandler('q.ok', {}, ok);
    const T = multiTenant ? { tenantId: 't' } : {};
    const N = 'a\u0000b';
    const r = await o.start('q.ok', {}, { ...T, scope: { entityType: 'E', entityId: '1' } });
    const empty = { items: [], nextCursor: null };
    t.deepEqual(await o.listJobRuns({ ...T, poolId: N }), empty);
    t.deepEqual(await o.listJobRuns({ ...T, jobType: N }), empty);
    t.deepEqual(await o.listJobRuns({ ...T, scopeEntityType: N, scopeEntityId: '1' }), empty);
    t.deepEqual(await o.listJobRuns({ ...T, scopeEntityType: 'E', scopeEntityId: N }), empty);
    t.deepEqual(await o.listForScope(N, '1', T), []);
    t.deepEqual(await o.listForScope('E', '1', { ...T, jobType: N }), []);
    t.is(await o.findStep(r.id, N, T), null);
    t.is(await o.cancelForScope(N, '1', T), 0);
    t.is(await o.rescheduleForScope('E', N, new Date(Date.now() + 60_000), T), 0);
    if (multiTenant) {
      t.deepEqual(await o.listJobRuns({ tenantId: N }), empty);
      t.deepEqual(await o.countByPoolAndStatus(N), []);
      t.is(await o.countRuns(N), 0);
      t.deepEqual(await o.listRecentFailed(10, N), []);
    }
    const after = await o.findById(r.id, T);
    t.is(after?.status, 'pending', 'nothing canceled');
    t.deepEqual(after?.runAt, r.runAt, 'nothing rescheduled');
  }
});

// ─── tenant gate and isolation ──────────────────────────────────────────────

test('tenant gate: every query throws MissingTenantIdError {method} for an undefined tenant in multi-tenant mode', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('q.ok', {}, ok);
  const r = await o.start('q.ok', {}, { tenantId: 'A', scope: { entityType: 'E', entityId: '1' } });
  const calls: [string, () => Promise<unknown>][] = [
    ['findById', () => o.findById(r.id)],
    ['findById', () => o.findById(r.id, {})],
    ['findById', () => o.findById(r.id, { tenantId: undefined })],
    ['listSteps', () => o.listSteps(r.id)],
    ['findStep', () => o.findStep(r.id, 's')],
    ['recordStep', () => o.recordStep({ jobRunId: r.id, stepId: 's', status: 'completed' })],
    ['listForScope', () => o.listForScope('E', '1')],
    ['listForScope', () => o.listForScope('E', '1', { status: 'pending' })],
    ['cancelForScope', () => o.cancelForScope('E', '1')],
    ['cancelForScope', () => o.cancelForScope('E', '1', { reason: 'x' })],
    ['rescheduleForScope', () => o.rescheduleForScope('E', '1', new Date(0))],
    ['countByPoolAndStatus', () => o.countByPoolAndStatus()],
    ['countByPoolAndStatus', () => o.countByPoolAndStatus(undefined)],
    ['listRecentFailed', () => o.listRecentFailed()],
    ['listRecentFailed', () => o.listRecentFailed(10)],
    ['listJobRuns', () => o.listJobRuns()],
    ['listJobRuns', () => o.listJobRuns({ poolId: 'batch' })],
    ['getRunTree', () => o.getRunTree(r.id)],
    ['getRun', () => o.getRun(r.id)],
    ['getRun', () => o.getRun(r.id, undefined)],
    ['countRuns', () => o.countRuns()],
  ];
  for (const [method, call] of calls) await isMissingTenant(t, call(), method);
  // none of those changed anything
  const after = await row(o, r.id, 'A');
  t.is(after.status, 'pending');
  t.is(after.runAt.getTime(), r.runAt.getTime());
  t.deepEqual(await o.listSteps(r.id, { tenantId: 'A' }), []);
});

/** Three tenants (A, B, null) with the same scope, pools and shapes of runs. */
async function tenantWorld() {
  const o = manual({ multiTenant: true });
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  o.registerHandler(
    'q.steps',
    {},
    async (ctx: JobContext<unknown>) => {
      await ctx.step('s1', () => ({ tenant: (ctx.input as { t: string | null }).t }));
    },
  );
  const S = { entityType: 'Order', entityId: 'shared' };
  type World = { pending: JobRun; future: JobRun; failed: JobRun; stepped: JobRun; root: JobRun; child: JobRun };
  const w = new Map<string | null, World>();
  // Every run gets its own createdAt millisecond, so "newest first" is unambiguous.
  const start = async (type: string, input: unknown, opts: Parameters<JobOrchestrator['start']>[2]): Promise<JobRun> => {
    const r = await o.start(type, input, opts);
    o.advanceTime(1);
    return r;
  };
  for (const tenantId of ['A', 'B', null] as const) {
    const pending = await start('q.ok', {}, { tenantId, scope: S, pool: uniqPool() });
    const future = await start('q.ok', {}, { tenantId, scope: S, pool: uniqPool(), runAt: new Date(o.now().getTime() + 60_000) });
    const failed = await start('q.boom', {}, { tenantId, scope: S, pool: uniqPool() });
    await execRun(o, failed, tenantId);
    const stepped = await start('q.steps', { t: tenantId }, { tenantId, pool: uniqPool() });
    await execRun(o, stepped, tenantId);
    const root = await start('q.ok', {}, { tenantId, pool: uniqPool() });
    const child = await start('q.ok', {}, { parentRunId: root.id, pool: uniqPool() });
    w.set(tenantId, { pending, future, failed, stepped, root, child });
  }
  return { o, w: (k: string | null) => w.get(k)!, S };
}

test('tenant isolation: findById, listSteps, findStep and getRunTree see only the tenant\'s own runs (null = null-tenant rows)', async (t) => {
  const { o, w } = await tenantWorld();
  const tenants = ['A', 'B', null] as const;
  for (const me of tenants) {
    for (const them of tenants) {
      const theirs = w(them);
      const same = me === them;
      const label = `${String(me)} looking at ${String(them)}`;
      const found = await o.findById(theirs.pending.id, { tenantId: me });
      t.is(found?.id ?? null, same ? theirs.pending.id : null, `findById ${label}`);
      const steps = await o.listSteps(theirs.stepped.id, { tenantId: me });
      t.deepEqual(steps.map((s) => s.stepId), same ? ['s1'] : [], `listSteps ${label}`);
      if (same) t.deepEqual(steps[0]!.output, { tenant: them });
      const step = await o.findStep(theirs.stepped.id, 's1', { tenantId: me });
      t.is(step?.stepId ?? null, same ? 's1' : null, `findStep ${label}`);
      const tree = await o.getRunTree(theirs.root.id, { tenantId: me });
      if (same) {
        t.deepEqual(treeIds(tree!), {
          id: theirs.root.id,
          status: 'pending',
          children: [{ id: theirs.child.id, status: 'pending', children: [] }],
        });
        t.is(tree!.children[0]!.run.tenantId, them, 'the child inherited the tenant');
      } else {
        t.is(tree, null, `getRunTree ${label}`);
      }
    }
  }
});

test('tenant isolation: recordStep cannot write another tenant\'s run', async (t) => {
  const { o, w } = await tenantWorld();
  const a = w('A');
  const before = await o.listSteps(a.stepped.id, { tenantId: 'A' });
  for (const other of ['B', null] as const) {
    await t.throwsAsync(
      o.recordStep({ jobRunId: a.stepped.id, stepId: 's1', status: 'failed', output: { hacked: true } }, { tenantId: other }),
      { instanceOf: JobRunNotFoundError },
    );
    await t.throwsAsync(
      o.recordStep({ jobRunId: a.stepped.id, stepId: 'new', status: 'completed' }, { tenantId: other }),
      { instanceOf: JobRunNotFoundError },
    );
  }
  t.deepEqual(await o.listSteps(a.stepped.id, { tenantId: 'A' }), before);
  const mine = await o.recordStep({ jobRunId: a.stepped.id, stepId: 'new', status: 'completed' }, { tenantId: 'A' });
  t.is(mine.seq, 2);
  const n = await o.recordStep({ jobRunId: w(null).stepped.id, stepId: 'n', status: 'pending' }, { tenantId: null });
  t.is(n.jobRunId, w(null).stepped.id);
});

test('tenant isolation: listForScope lists only the tenant\'s runs of a scope shared by name', async (t) => {
  const { o, w } = await tenantWorld();
  for (const me of ['A', 'B', null] as const) {
    const mine = w(me);
    const got = await o.listForScope('Order', 'shared', { tenantId: me });
    t.deepEqual(ids(got), [mine.failed.id, mine.future.id, mine.pending.id], String(me));
    t.true(got.every((r) => r.tenantId === me));
    t.deepEqual(ids(await o.listForScope('Order', 'shared', { tenantId: me, status: 'failed' })), [mine.failed.id]);
  }
  t.deepEqual(await o.listForScope('Order', 'shared', { tenantId: 'C' }), []);
});

test('tenant isolation: cancelForScope cancels only the calling tenant\'s runs', async (t) => {
  const { o, w } = await tenantWorld();
  t.is(await o.cancelForScope('Order', 'shared', { tenantId: 'C' }), 0);
  t.is(await o.cancelForScope('Order', 'shared', { tenantId: 'B' }), 2);
  for (const r of [w('B').pending, w('B').future]) t.is((await row(o, r.id, 'B')).status, 'canceled');
  for (const me of ['A', null] as const) {
    t.is((await row(o, w(me).pending.id, me)).status, 'pending', `${me}'s run untouched`);
    t.is((await row(o, w(me).future.id, me)).status, 'pending');
  }
  t.is(await o.cancelForScope('Order', 'shared', { tenantId: null }), 2);
  t.is((await row(o, w(null).pending.id, null)).status, 'canceled');
  t.is((await row(o, w('A').pending.id, 'A')).status, 'pending');
  t.is(await o.cancelForScope('Order', 'shared', { tenantId: 'A' }), 2);
});

test('tenant isolation: rescheduleForScope moves only the calling tenant\'s pending runs', async (t) => {
  const { o, w } = await tenantWorld();
  const target = new Date(o.now().getTime() + 999_000);
  const snapshot = async (me: string | null) =>
    Promise.all([w(me).pending, w(me).future, w(me).failed].map(async (r) => (await row(o, r.id, me)).runAt.getTime()));
  const aBefore = await snapshot('A');
  const nBefore = await snapshot(null);
  t.is(await o.rescheduleForScope('Order', 'shared', target, { tenantId: 'C' }), 0);
  t.is(await o.rescheduleForScope('Order', 'shared', target, { tenantId: 'B' }), 2);
  const b = await snapshot('B');
  t.is(b[0], target.getTime());
  t.is(b[1], target.getTime());
  t.not(b[2], target.getTime(), 'failed run keeps its runAt');
  t.deepEqual(await snapshot('A'), aBefore);
  t.deepEqual(await snapshot(null), nBefore);
  t.is(await o.rescheduleForScope('Order', 'shared', target, { tenantId: null }), 2);
  t.deepEqual(await snapshot('A'), aBefore);
  t.is((await snapshot(null))[0], target.getTime());
});

test('tenant isolation: countByPoolAndStatus and listRecentFailed count and list only the tenant\'s runs', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  const failedOf = new Map<string | null, string[]>();
  const plan: [string | null, number, number][] = [
    ['A', 3, 2],
    ['B', 1, 4],
    [null, 2, 1],
  ];
  for (const [tenantId, pending, failed] of plan) {
    for (let i = 0; i < pending; i++) await o.start('q.ok', {}, { tenantId, pool: 'batch' });
    const f: string[] = [];
    for (let i = 0; i < failed; i++) {
      const r = await o.start('q.boom', {}, { tenantId, pool: uniqPool() });
      await execRun(o, r, tenantId);
      f.push(r.id);
      o.advanceTime(1);
    }
    failedOf.set(tenantId, f);
  }
  for (const [tenantId, pending, failed] of plan) {
    const counts = await o.countByPoolAndStatus(tenantId);
    const total = counts.reduce((s, c) => s + c.count, 0);
    t.is(total, pending + failed, String(tenantId));
    t.deepEqual(
      counts.find((c) => c.pool === 'batch'),
      { pool: 'batch', status: 'pending', count: pending },
    );
    t.is(counts.filter((c) => c.status === 'failed').reduce((s, c) => s + c.count, 0), failed);
    t.deepEqual(ids(await o.listRecentFailed(undefined, tenantId)), [...failedOf.get(tenantId)!].reverse());
    t.deepEqual(ids(await o.listRecentFailed(1, tenantId)), [failedOf.get(tenantId)!.at(-1)!]);
  }
  t.deepEqual(await o.countByPoolAndStatus('C'), []);
  t.deepEqual(await o.listRecentFailed(50, 'C'), []);
  // Transitions of one tenant do not move another tenant's counts.
  const aBefore = await o.countByPoolAndStatus('A');
  const nBefore = await o.countByPoolAndStatus(null);
  const c = await o.claimNext('batch');
  t.truthy(c);
  await o.tick(c!.id);
  const owner = c!.tenantId;
  t.is(owner, 'A', 'first batch run belongs to A');
  t.deepEqual(await o.countByPoolAndStatus(null), nBefore);
  t.notDeepEqual(await o.countByPoolAndStatus('A'), aBefore);
  t.deepEqual(
    (await o.countByPoolAndStatus('A')).filter((x) => x.pool === 'batch'),
    [
      { pool: 'batch', status: 'completed', count: 1 },
      { pool: 'batch', status: 'pending', count: 2 },
    ],
  );
});

test('tenant isolation: listJobRuns filters (pool, status, rootRunId, since, cursor) never return another tenant\'s runs', async (t) => {
  const { o, w } = await tenantWorld();
  const allOf = async (tenantId: string | null) => (await walkPages(o, { tenantId, limit: 2 })).items;
  for (const me of ['A', 'B', null] as const) {
    const mine = await allOf(me);
    t.is(mine.length, 6, `${String(me)} has 6 runs`);
    t.true(mine.every((r) => r.tenantId === me));
    t.is(firstOrderViolation(mine), -1);
    for (const them of ['A', 'B', null] as const) {
      if (them === me) continue;
      const theirs = w(them);
      t.deepEqual((await o.listJobRuns({ tenantId: me, rootRunId: theirs.root.id })).items, [], 'rootRunId of another tenant');
      t.deepEqual((await o.listJobRuns({ tenantId: me, poolId: theirs.pending.pool })).items, [], 'pool of another tenant');
    }
    t.deepEqual(ids((await o.listJobRuns({ tenantId: me, rootRunId: w(me).root.id })).items), [w(me).child.id, w(me).root.id]);
    t.deepEqual(ids((await o.listJobRuns({ tenantId: me, status: 'failed' })).items), [w(me).failed.id]);
    const since = w(me).pending.createdAt;
    t.true((await o.listJobRuns({ tenantId: me, since, limit: 500 })).items.every((r) => r.tenantId === me));
  }
  // A cursor obtained by A does not reveal B's rows when B uses it (it is only a position).
  const aPage = await o.listJobRuns({ tenantId: 'A', limit: 1 });
  const bRest = await walkPages(o, { tenantId: 'B', cursor: aPage.nextCursor!, limit: 3 });
  t.true(bRest.items.every((r) => r.tenantId === 'B'));
  t.deepEqual((await o.listJobRuns({ tenantId: 'C' })).items, []);
});

test('single-tenant mode: queries need no tenant and see every run', async (t) => {
  const o = manual();
  o.registerHandler('q.ok', {}, ok);
  o.registerHandler('q.boom', {}, boom);
  const a = await o.start('q.ok', {}, { scope: { entityType: 'E', entityId: '1' } });
  const b = await o.start('q.boom', {}, { scope: { entityType: 'E', entityId: '1' }, pool: uniqPool() });
  await execRun(o, b);
  t.is(a.tenantId, null);
  t.is((await o.findById(a.id))?.id, a.id);
  t.is((await o.listForScope('E', '1')).length, 2);
  t.is((await o.listJobRuns()).items.length, 2);
  t.deepEqual(ids(await o.listRecentFailed()), [b.id]);
  t.is((await o.countByPoolAndStatus()).reduce((s, c) => s + c.count, 0), 2);
  t.truthy(await o.getRunTree(a.id));
  t.is(await o.rescheduleForScope('E', '1', new Date(0)), 1);
  t.is(await o.cancelForScope('E', '1'), 1);
});

test('getRunTree of a chain 5,000 runs deep (each run the parent of the next)', async (t) => {
  const o = new JobOrchestrator();
  o.registerHandler('n', {}, async () => ({}));
  const root = await o.start('n', {});
  let parent = root;
  for (let i = 1; i < 5000; i++) parent = await o.start('n', {}, { parentRunId: parent.id });
  const tree = await o.getRunTree(root.id);
  let depth = 0;
  let last: RunTreeNode | undefined;
  for (let n: RunTreeNode | undefined = tree ?? undefined; n; n = n.children[0]) {
    depth++;
    last = n;
  }
  t.is(depth, 5000);
  t.is(last?.run.id, parent.id);
  t.deepEqual(last?.children, []);
});

// ─── the seed family's run-service shapes (shared/seed-family) ─────────────

/** `JobRunSummary` of `job-run-keyset-cursor.ts` (`toJobRunSummary`), computed from a whole row. */
const summaryOf = (r: JobRun): JobRunSummary => ({
  runId: r.id,
  rootRunId: r.rootRunId,
  parentRunId: r.parentRunId,
  triggerSource: r.triggerSource,
  triggerRef: r.triggerRef,
  jobType: r.jobType,
  pool: r.pool,
  status: r.status,
  scopeEntityType: r.scopeEntityType,
  scopeEntityId: r.scopeEntityId,
  tenantId: r.tenantId,
  attempts: r.attempts,
  errorMessage: r.error?.message ?? null,
  runAt: r.runAt,
  startedAt: r.startedAt,
  finishedAt: r.finishedAt,
  createdAt: r.createdAt,
});

const SUMMARY_KEYS = [
  'attempts', 'createdAt', 'errorMessage', 'finishedAt', 'jobType', 'parentRunId', 'pool', 'rootRunId', 'runAt', 'runId',
  'scopeEntityId', 'scopeEntityType', 'startedAt', 'status', 'tenantId', 'triggerRef', 'triggerSource',
];
const FAILURE_KEYS = [
  'attempts', 'createdAt', 'errorMessage', 'failedAt', 'jobType', 'pool', 'runId', 'scopeEntityId', 'scopeEntityType', 'tenantId',
];

forBackends('listJobRuns: a page is { items: JobRunSummary[], nextCursor } with exactly the family\'s fields', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('fam.ok', {}, ok);
  o.registerHandler('fam.boom', {}, boom);
  const scope = { entityType: 'account', entityId: 'a1' };
  const root = await o.start('fam.ok', { big: 'x'.repeat(1000) }, { tenantId: 'T', scope, triggerSource: 'event', triggerRef: 'evt-1', pool: 'fam' });
  o.advanceTime(1);
  const child = await o.start('fam.boom', {}, { tenantId: 'T', parentRunId: root.id, pool: 'fam', runAt: new Date(o.now().getTime() - 5) });
  o.advanceTime(1);
  const plain = await o.start('fam.ok', {}, { tenantId: 'T', pool: 'fam' });
  // child runs (and fails) first: its runAt is the earliest
  await execRun(o, child, 'T');
  await execRun(o, root, 'T');
  const page = await o.listJobRuns({ tenantId: 'T', limit: 2 });
  t.deepEqual(Object.keys(page).sort(), ['items', 'nextCursor']);
  t.is(typeof page.nextCursor, 'string');
  for (const item of page.items) t.deepEqual(Object.keys(item).sort(), SUMMARY_KEYS);
  const rest = await o.listJobRuns({ tenantId: 'T', cursor: page.nextCursor! });
  t.is(rest.nextCursor, null);
  const rows = await Promise.all([plain, child, root].map((r) => row(o, r.id, 'T')));
  t.deepEqual([...page.items, ...rest.items], rows.map(summaryOf), 'each summary is its row projected');
  const [, failedChild, doneRoot] = [...page.items, ...rest.items];
  t.is(failedChild!.errorMessage, 'boom');
  t.is(failedChild!.parentRunId, root.id);
  t.is(failedChild!.rootRunId, root.id);
  t.true(failedChild!.startedAt instanceof Date && failedChild!.finishedAt instanceof Date);
  t.is(doneRoot!.errorMessage, null);
  t.deepEqual([doneRoot!.scopeEntityType, doneRoot!.scopeEntityId, doneRoot!.triggerRef], ['account', 'a1', 'evt-1']);
  t.true(doneRoot!.runAt instanceof Date && doneRoot!.createdAt instanceof Date);
  t.false('input' in doneRoot! || 'output' in doneRoot! || 'id' in doneRoot!, 'no payload, no row id field');
});

forBackends('listRecentFailed: resolves JobRunFailure[] (the family\'s fields), failedAt = when the run finished', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('fam.boom', {}, boom);
  o.registerHandler('fam.ok', {}, ok);
  const scope = { entityType: 'account', entityId: 'a2' };
  const first = await o.start('fam.boom', {}, { tenantId: null, scope, pool: 'f1' });
  await execRun(o, first, null);
  o.advanceTime(7);
  const second = await o.start('fam.boom', {}, { tenantId: null, pool: 'f2' });
  await execRun(o, second, null);
  await execRun(o, await o.start('fam.ok', {}, { tenantId: null, pool: 'f3' }), null);
  const list = await o.listRecentFailed(10, null);
  t.deepEqual(ids(list), [second.id, first.id]);
  for (const f of list) t.deepEqual(Object.keys(f).sort(), FAILURE_KEYS);
  for (const f of list) {
    const r = await row(o, f.runId, null);
    t.is(r.status, 'failed');
    t.deepEqual(f, {
      runId: r.id,
      jobType: r.jobType,
      pool: r.pool,
      scopeEntityType: r.scopeEntityType,
      scopeEntityId: r.scopeEntityId,
      tenantId: r.tenantId,
      attempts: r.attempts,
      errorMessage: r.error!.message,
      failedAt: r.finishedAt!,
      createdAt: r.createdAt,
    });
  }
  t.deepEqual([list[1]!.scopeEntityType, list[1]!.scopeEntityId, list[1]!.errorMessage], ['account', 'a2', 'boom']);
  t.is(list[0]!.failedAt.getTime() - list[1]!.failedAt.getTime(), 7);
  t.deepEqual(await o.listRecentFailed(10, 'other'), [], "another tenant's failures are not listed");
});

forBackends('getRun(runId, tenantId?): the whole row behind the tenant gate, like findById', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('fam.ok', {}, ok);
  const a = await o.start('fam.ok', { n: 1 }, { tenantId: 'A' });
  const shared = await o.start('fam.ok', { n: 2 }, { tenantId: null });
  t.deepEqual(await o.getRun(a.id, 'A'), await o.findById(a.id, { tenantId: 'A' }));
  t.deepEqual((await o.getRun(a.id, 'A'))?.input, { n: 1 });
  t.is(await o.getRun(a.id, 'B'), null, "another tenant's run is null");
  t.is(await o.getRun(a.id, null), null, 'null is the null-tenant rows only');
  t.is((await o.getRun(shared.id, null))?.id, shared.id);
  t.is(await o.getRun(randomUUID(), 'A'), null, 'unknown id');
  t.is(await o.getRun('not-a-uuid', 'A'), null, 'malformed id');
  await isMissingTenant(t, o.getRun(a.id), 'getRun');
  await isInvalid(t, o.getRun(a.id, 5 as unknown as string), 'a tenant that is not a string or null');
  const single = await make.manual();
  single.registerHandler('fam.ok', {}, ok);
  const s = await single.start('fam.ok', {});
  t.is((await single.getRun(s.id))?.id, s.id, 'single-tenant mode needs no tenant');
});

forBackends('countRuns(tenantId?): every run of the tenant whatever its status, as countByPoolAndStatus counts them', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('fam.ok', {}, ok);
  o.registerHandler('fam.boom', {}, boom);
  t.is(await o.countRuns('A'), 0);
  const started: JobRun[] = [];
  for (let i = 0; i < 7; i++) started.push(await o.start(i % 3 === 0 ? 'fam.boom' : 'fam.ok', { i }, { tenantId: 'A', pool: `c${i % 2}` }));
  for (let i = 0; i < 3; i++) await o.start('fam.ok', { i }, { tenantId: 'B' });
  await o.start('fam.ok', {}, { tenantId: null });
  await execRun(o, started[0]!, 'A'); // failed
  await execRun(o, started[1]!, 'A'); // completed
  await o.cancel(started[2]!.id, { tenantId: 'A' });
  await claimRun(o, started[3]!); // running
  t.is(await o.countRuns('A'), 7);
  t.is(await o.countRuns('B'), 3);
  t.is(await o.countRuns(null), 1);
  t.is(await o.countRuns('nobody'), 0);
  for (const tenant of ['A', 'B', null]) {
    const total = (await o.countByPoolAndStatus(tenant)).reduce((n, c) => n + c.count, 0);
    t.is(await o.countRuns(tenant), total, String(tenant));
  }
  await isMissingTenant(t, o.countRuns(), 'countRuns');
  await isInvalid(t, o.countRuns(7 as unknown as string), 'a tenant that is not a string or null');
  const single = await make.manual();
  single.registerHandler('fam.ok', {}, ok);
  await single.start('fam.ok', {});
  await single.start('fam.ok', { n: 2 });
  t.is(await single.countRuns(), 2, 'single-tenant mode counts every run');
});

forBackends("listForScope: the family's orderBy ('created_at desc|asc', 'run_at desc|asc'); ties in created order", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('fam.ok', {}, ok);
  const scope = { entityType: 'order', entityId: 'o-1' };
  const base = o.now().getTime() + 60_000;
  const at = async (dt: number): Promise<string> => {
    const r = await o.start('fam.ok', {}, { scope, runAt: new Date(base + dt) });
    o.advanceTime(1);
    return r.id;
  };
  // created in this order; runAt +30, +10, +20, +10
  const [a, b, c, d] = [await at(30), await at(10), await at(20), await at(10)];
  const list = async (orderBy?: ListForScopeOptions['orderBy'], more: Omit<ListForScopeOptions, 'orderBy'> = {}) =>
    ids(await o.listForScope('order', 'o-1', { ...more, orderBy }));
  t.deepEqual(await list(), [d, c, b, a], 'default: newest first');
  t.deepEqual(await list('created_at desc'), [d, c, b, a]);
  t.deepEqual(await list('createdAt:desc'), [d, c, b, a]);
  t.deepEqual(await list('created_at asc'), [a, b, c, d]);
  t.deepEqual(await list('createdAt:asc'), [a, b, c, d]);
  t.deepEqual(await list('run_at asc'), [b, d, c, a], 'earliest runAt first, ties oldest first');
  t.deepEqual(await list('run_at desc'), [a, c, d, b], 'latest runAt first, ties newest first');
  t.deepEqual(await list('run_at asc', { offset: 1, limit: 2 }), [d, c], 'offset and limit apply after the order');
  await isInvalid(t, o.listForScope('order', 'o-1', { orderBy: 'runAt:asc' as ListForScopeOptions['orderBy'] }), 'unknown orderBy');
});
