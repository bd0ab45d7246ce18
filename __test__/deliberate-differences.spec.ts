/**
 * CONTRACT.md "Deliberate differences from the seed": one or more tests per
 * item, each showing the FIXED behaviour (the seed's defect would fail it).
 * Every test runs on both backends (memory and PostgreSQL, see backends.ts).
 */
import { randomUUID } from 'node:crypto';
import {
  JobCollisionError,
  JobInputInvalidError,
  JobRunNotFoundError,
  JobStepTimeoutError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from '../dist';
import type { JobRun } from '../dist';
import {
  advanceUntil,
  claim,
  claimAll,
  get,
  hanging,
  runNext,
  statusOf,
  waitFor,
} from './helpers';
import { forBackends } from './backends';

const ok = async (): Promise<Record<string, never>> => ({});

// ─── 1. cascade walks the descendant subtree ───────────────────────────────

forBackends('DD1: cancelling a child cancels its own subtree but leaves its parent and siblings', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd1.node', {}, ok);
  const root = await o.start('dd1.node', { n: 'root' });
  const child = await o.start('dd1.node', { n: 'child' }, { parentRunId: root.id });
  const sibling = await o.start('dd1.node', { n: 'sibling' }, { parentRunId: root.id });
  const grand = await o.start('dd1.node', { n: 'grand' }, { parentRunId: child.id });
  const nephew = await o.start('dd1.node', { n: 'nephew' }, { parentRunId: sibling.id });
  await o.cancel(child.id);
  t.is(await statusOf(o, child.id), 'canceled');
  t.is(await statusOf(o, grand.id), 'canceled');
  t.is(await statusOf(o, root.id), 'pending', 'the parent (an ancestor) is left alone');
  t.is(await statusOf(o, sibling.id), 'pending', 'the sibling is left alone');
  t.is(await statusOf(o, nephew.id), 'pending');
  t.deepEqual(new Set(await claimAll(o)), new Set([root.id, sibling.id, nephew.id]));
});

forBackends('DD1: an abandoned child and its whole subtree survive the cascade', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd1.tree', {}, ok);
  const root = await o.start('dd1.tree', {});
  const abandoned = await o.start('dd1.tree', {}, { parentRunId: root.id, parentClosePolicy: 'abandon' });
  const abKid = await o.start('dd1.tree', {}, { parentRunId: abandoned.id, parentClosePolicy: 'terminate' });
  const abGrandKid = await o.start('dd1.tree', {}, { parentRunId: abKid.id, parentClosePolicy: 'cancel' });
  const term = await o.start('dd1.tree', {}, { parentRunId: root.id });
  await o.cancel(root.id);
  t.is(await statusOf(o, root.id), 'canceled');
  t.is(await statusOf(o, term.id), 'canceled');
  t.is(await statusOf(o, abandoned.id), 'pending');
  t.is(await statusOf(o, abKid.id), 'pending', "the abandoned child's children are not canceled");
  t.is(await statusOf(o, abGrandKid.id), 'pending');
});

// ─── 2. a failed run cascades to its children ──────────────────────────────

forBackends('DD2: a run that fails cancels its children and their descendants', async (t, make) => {
  const o = await make.manual();
  const spawned: string[] = [];
  o.registerHandler('dd2.parent', {}, async (ctx) => {
    const c = await ctx.spawnChild('dd2.child', {});
    const g = await o.start('dd2.child', {}, { parentRunId: c.id });
    spawned.push(c.id, g.id);
    throw new Error('parent fails');
  });
  o.registerHandler('dd2.child', {}, ok);
  const p = await o.start('dd2.parent', {});
  const done = await runNext(o);
  t.is(done.id, p.id);
  t.is(done.status, 'failed');
  for (const id of spawned) {
    const row = await get(o, id);
    t.is(row.status, 'canceled');
    t.true((row.finishedAt?.getTime() ?? Infinity) <= (done.finishedAt?.getTime() ?? -Infinity));
  }
  t.is(await o.claimNext('batch'), null);
});

forBackends('DD2: the failure cascade follows the children\'s policies, not the failed run\'s own', async (t, make) => {
  // The seed only cascades when the failed run itself has policy
  // 'terminate'; a root started with 'abandon' must still take its
  // terminate-children down.
  const o = await make.manual();
  let kid = '';
  o.registerHandler('dd2.root', {}, async (ctx) => {
    kid = (await ctx.spawnChild('dd2.leaf', {})).id;
    throw new Error('root fails');
  });
  o.registerHandler('dd2.leaf', {}, ok);
  await o.start('dd2.root', {}, { parentClosePolicy: 'abandon' });
  await runNext(o);
  t.is(await statusOf(o, kid), 'canceled');
});

// ─── 3. a queue lane runs one at a time, in order ──────────────────────────

forBackends('DD3: when the incumbent ends, only the next waiter becomes claimable, in lane order', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd3.q', { concurrency: { key: 'acct:{{acct}}' } }, ok);
  const runs: JobRun[] = [];
  for (let i = 0; i < 4; i++) runs.push(await o.start('dd3.q', { acct: 1, i }));
  const order: string[] = [];
  for (let i = 0; i < 4; i++) {
    const claimable = await claimAll(o);
    t.is(claimable.length, 1, `exactly one lane run claimable at step ${i}`);
    order.push(claimable[0]!);
    o.advanceTime(10);
    await o.tick(claimable[0]!);
  }
  t.deepEqual(order, runs.map((r) => r.id));
});

forBackends("DD3: a waiter's own runAt is kept", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd3.runat', { concurrency: { key: 'K' } }, ok);
  const t0 = o.now().getTime();
  const a = await o.start('dd3.runat', {});
  const b = await o.start('dd3.runat', {});
  const c = await o.start('dd3.runat', {}, { runAt: new Date(t0 + 5000) });
  t.is(b.runAt.getTime(), t0, 'start returns the requested runAt, not a sentinel');
  t.is(c.runAt.getTime(), t0 + 5000);
  t.is((await get(o, b.id)).runAt.getTime(), t0);
  o.advanceTime(100);
  t.is((await runNext(o)).id, a.id);
  t.is((await get(o, b.id)).runAt.getTime(), t0, 'not overwritten when the incumbent ends');
  t.is((await runNext(o)).id, b.id);
  t.is((await get(o, c.id)).runAt.getTime(), t0 + 5000);
  t.is(await o.claimNext('batch'), null, 'c still waits for its own runAt');
  o.advanceTime(4900);
  t.is((await claim(o)).id, c.id);
});

// ─── 4. replace cancels the whole lane ─────────────────────────────────────

forBackends('DD4: replace cancels every run of the lane, not only the first one found', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('dd4.q', { concurrency: { key: 'acct:{{acct}}' } }, h.handler);
  o.registerHandler('dd4.rep', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'replace' } }, ok);
  const a = await o.start('dd4.q', { acct: 1 });
  const b = await o.start('dd4.q', { acct: 1 });
  const c = await o.start('dd4.q', { acct: 1 });
  const other = await o.start('dd4.q', { acct: 2 }, { runAt: new Date(o.now().getTime() + 1e6) });
  await claim(o);
  const tick = o.tick(a.id);
  const att = await h.entered();
  const r = await o.start('dd4.rep', { acct: 1 });
  for (const x of [a, b, c]) t.is(await statusOf(o, x.id), 'canceled');
  t.is(await statusOf(o, other.id), 'pending');
  await waitFor(() => att.signal.aborted, 'running incumbent aborted');
  await tick;
  t.deepEqual(await claimAll(o), [r.id], 'the replacing run is the only claimable one');
});

// ─── 5. children inherit the parent's tenant ───────────────────────────────

forBackends("DD5: in multi-tenant mode spawnChild works and the child inherits the parent's tenant", async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const kids: JobRun[] = [];
  o.registerHandler('dd5.parent', {}, async (ctx) => {
    kids.push(await ctx.spawnChild('dd5.child', { from: ctx.run.tenantId }));
    return {};
  });
  o.registerHandler('dd5.child', {}, ok);
  const p = await o.start('dd5.parent', {}, { tenantId: 'acme' });
  const pn = await o.start('dd5.parent', {}, { tenantId: null });
  await o.tick((await claim(o)).id);
  await o.tick((await claim(o)).id);
  t.is((await o.findById(p.id, { tenantId: 'acme' }))?.status, 'completed');
  t.is((await o.findById(pn.id, { tenantId: null }))?.status, 'completed');
  t.is(kids.length, 2);
  const [k1, k2] = kids as [JobRun, JobRun];
  t.is(k1.tenantId, 'acme');
  t.is(k1.parentRunId, p.id);
  t.is(k2.tenantId, null);
  t.is((await o.findById(k1.id, { tenantId: 'acme' }))?.id, k1.id);
  t.is(await o.findById(k1.id, { tenantId: 'other' }), null);
  // the inherited tenant is the one the cascade and cancel gate use
  await o.cancel(k1.id, { tenantId: 'other' });
  t.is((await o.findById(k1.id, { tenantId: 'acme' }))?.status, 'pending');
  await t.throwsAsync(o.cancel(k1.id), { instanceOf: MissingTenantIdError });
});

// ─── 6. timeoutMs and StepOptions are enforced ─────────────────────────────

forBackends('DD6: meta.timeoutMs ends a never-resolving attempt as timed_out', async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('dd6.run', { timeoutMs: 300 }, h.handler);
  const r = await o.start('dd6.run', {});
  await claim(o);
  const tick = o.tick(r.id);
  const att = await h.entered();
  o.advanceTime(300);
  await tick;
  t.is(await statusOf(o, r.id), 'timed_out');
  await waitFor(() => att.signal.aborted, 'signal after timeout');
});

forBackends('DD6: StepOptions.retry retries a failing step and StepOptions.timeoutMs fails a stuck one', async (t, make) => {
  const o = await make.manual();
  let flakyCalls = 0;
  let stuckError: unknown;
  let finished = false;
  o.registerHandler('dd6.steps', {}, async (ctx) => {
    const v = await ctx.step(
      'flaky',
      () => {
        flakyCalls++;
        if (flakyCalls < 2) throw new Error('once');
        return flakyCalls;
      },
      { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } },
    );
    try {
      await ctx.step('stuck', () => new Promise<never>(() => undefined), { timeoutMs: 200 });
    } catch (e) {
      stuckError = e;
    }
    return { v };
  });
  const r = await o.start('dd6.steps', {});
  await claim(o);
  const tick = o.tick(r.id).then(() => {
    finished = true;
  });
  await advanceUntil(o, () => finished, 50);
  await tick;
  t.is(flakyCalls, 2);
  t.true(stuckError instanceof JobStepTimeoutError);
  const row = await get(o, r.id);
  t.is(row.status, 'completed');
  t.deepEqual(row.output, { v: 2 });
  const steps = await o.listSteps(r.id);
  t.deepEqual(steps.map((s) => [s.stepId, s.status, s.attempts]), [
    ['flaky', 'completed', 2],
    ['stuck', 'failed', 1],
  ]);
});

// ─── 7. claim order is fully defined ───────────────────────────────────────

forBackends('DD7: equal priority and runAt are claimed in created order', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd7.tie', {}, ok);
  const at = new Date(o.now().getTime() - 1000);
  const ids: string[] = [];
  for (let i = 0; i < 25; i++) ids.push((await o.start('dd7.tie', { i }, { runAt: at, priority: 3 })).id);
  // interleave a few that must not disturb the tie order
  const high = await o.start('dd7.tie', {}, { priority: 4, runAt: at });
  const later = await o.start('dd7.tie', {}, { priority: 3 });
  t.deepEqual(await claimAll(o), [high.id, ...ids, later.id]);
});

forBackends('DD7: created order (not re-queue order) breaks ties for retried and replayed runs', async (t, make) => {
  const o = await make.manual();
  let failOnce = true;
  o.registerHandler<{ n: string }>('dd7.requeue', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async (ctx) => {
    if (ctx.input.n === 'a' && failOnce) {
      failOnce = false;
      throw new Error('retry a');
    }
    return {};
  });
  const a = await o.start('dd7.requeue', { n: 'a' });
  const b = await o.start('dd7.requeue', { n: 'b' });
  const c = await o.start('dd7.requeue', { n: 'c' });
  t.is((await runNext(o)).id, a.id); // fails, back to pending with runAt = now
  const aRow = await get(o, a.id);
  t.is(aRow.status, 'pending');
  t.is(aRow.runAt.getTime(), b.runAt.getTime(), 'a tie on priority and runAt');
  t.deepEqual(await claimAll(o), [a.id, b.id, c.id]);
  for (const id of [a.id, b.id, c.id]) await o.tick(id);
  // replay c, then a: both get runAt = now, equal to a fresh run d
  await o.replay(c.id);
  await o.replay(a.id);
  const d = await o.start('dd7.requeue', { n: 'd' });
  t.deepEqual(await claimAll(o), [a.id, c.id, d.id]);
});

// ─── 8. typed errors ───────────────────────────────────────────────────────

forBackends('DD8: a missing parent, an unknown run and an invalid input get typed errors', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('dd8.job', {}, ok);
  const parentId = randomUUID();
  const pe = await t.throwsAsync(o.start('dd8.job', {}, { parentRunId: parentId }), { instanceOf: ParentRunNotFoundError });
  t.is(pe.code, 'PARENT_RUN_NOT_FOUND');
  t.is(pe.parentRunId, parentId);
  const runId = randomUUID();
  const re = await t.throwsAsync(o.replay(runId), { instanceOf: JobRunNotFoundError });
  t.is(re.code, 'JOB_RUN_NOT_FOUND');
  t.is(re.runId, runId);
  const cyclic: Record<string, unknown> = {};
  cyclic.me = cyclic;
  const ie = await t.throwsAsync(o.start('dd8.job', cyclic), { instanceOf: JobInputInvalidError });
  t.is(ie.code, 'JOB_INPUT_INVALID');
  await t.throwsAsync(o.start('dd8.job', { f: () => 0 }), { instanceOf: JobInputInvalidError });
  t.is(await o.claimNext('batch'), null);
});

// ─── 9. tenants are isolated in dedupe and lanes ───────────────────────────

forBackends("DD9: tenant B's start with tenant A's dedupe key creates B's own run and never returns A's", async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('dd9.dedupe', { dedupe: { key: 'order:{{order}}', windowMs: 60_000 } }, ok);
  const a = await o.start('dd9.dedupe', { order: 1, secret: 'A-only' }, { tenantId: 'A' });
  const b = await o.start('dd9.dedupe', { order: 1, secret: 'B' }, { tenantId: 'B' });
  t.not(b.id, a.id);
  t.is(b.tenantId, 'B');
  t.deepEqual(b.input, { order: 1, secret: 'B' });
  t.is((await o.start('dd9.dedupe', { order: 1 }, { tenantId: 'A' })).id, a.id, 'dedupe still works within A');
  t.is((await o.start('dd9.dedupe', { order: 1 }, { tenantId: 'B' })).id, b.id, 'and within B');
  const n = await o.start('dd9.dedupe', { order: 1 }, { tenantId: null });
  t.not(n.id, a.id);
  t.not(n.id, b.id);
});

forBackends("DD9: a reject collision never hands tenant B tenant A's incumbent; lanes are per tenant", async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('dd9.rej', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'reject' } }, ok);
  o.registerHandler('dd9.q', { concurrency: { key: 'acct:{{acct}}' } }, ok);
  o.registerHandler('dd9.rep', { concurrency: { key: 'acct:{{acct}}', collisionMode: 'replace' } }, ok);
  const a = await o.start('dd9.rej', { acct: 7 }, { tenantId: 'A' });
  const b = await o.start('dd9.rej', { acct: 7 }, { tenantId: 'B' });
  t.is(b.tenantId, 'B');
  t.is(b.concurrencyKey, a.concurrencyKey);
  const e = await t.throwsAsync(o.start('dd9.rej', { acct: 7 }, { tenantId: 'B' }), { instanceOf: JobCollisionError });
  t.is(e.incumbent.id, b.id, "B's own incumbent");
  t.is(e.incumbent.tenantId, 'B');
  // queue lanes: B's waiter queues behind B's run only
  const bq = await o.start('dd9.q', { acct: 7 }, { tenantId: 'B' });
  const cq = await o.start('dd9.q', { acct: 7 }, { tenantId: 'C' });
  const claimed = new Set(await claimAll(o));
  t.true(claimed.has(a.id));
  t.true(claimed.has(b.id));
  t.true(claimed.has(cq.id), "C's lane is empty, so its run is claimable at once");
  t.false(claimed.has(bq.id), "B's waiter is behind B's run");
  // replace in tenant C cancels only C's lane
  await o.start('dd9.rep', { acct: 7 }, { tenantId: 'C' });
  t.is((await get(o, cq.id, 'C')).status, 'canceled');
  t.is((await get(o, a.id, 'A')).status, 'running');
  t.is((await get(o, b.id, 'B')).status, 'running');
});

forBackends("DD9: a start never sees another tenant's run as its parent", async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('dd9.node', {}, ok);
  const a = await o.start('dd9.node', {}, { tenantId: 'A' });
  await t.throwsAsync(o.start('dd9.node', {}, { tenantId: 'B', parentRunId: a.id }), { instanceOf: ParentRunNotFoundError });
  const child = await o.start('dd9.node', {}, { tenantId: 'A', parentRunId: a.id });
  t.is(child.rootRunId, a.id);
});

// ─── the seed family's run service (README "Deliberate differences") ──────
//
// `shared/seed-family/job-run-keyset-cursor.ts` forgives bad paging input:
// `decodeKeysetCursor` returns null for a malformed cursor and the backend
// starts again from the first page; `clampLimit` turns a limit below 1 into
// 1, floors a fractional one, replaces a non-number with 50 and caps at
// 200. jobforge refuses each with a JobInputInvalidError, so a caller's bug
// (a truncated cursor, a limit of 0) is seen instead of silently answered
// with another page, and it changes nothing.

/** Asserts `p` rejects with JobInputInvalidError (code JOB_INPUT_INVALID). */
async function invalid(t: import('ava').ExecutionContext, p: Promise<unknown>, what: string): Promise<void> {
  const e = await t.throwsAsync(p, { instanceOf: JobInputInvalidError }, what);
  t.is(e?.code, 'JOB_INPUT_INVALID', what);
}

forBackends('DF1: a malformed listJobRuns cursor is JobInputInvalidError, not a restart from the first page (the family restarts)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('df1.ok', {}, ok);
  for (let i = 0; i < 5; i++) {
    await o.start('df1.ok', { i });
    o.advanceTime(1);
  }
  const first = await o.listJobRuns({ limit: 2 });
  const cursor = first.nextCursor!;
  // The family's own cursor format (base64url of [createdAt ISO, id]) is not jobforge's either.
  const familyCursor = Buffer.from(JSON.stringify([first.items[1]!.createdAt.toISOString(), first.items[1]!.runId]), 'utf8').toString('base64url');
  for (const bad of ['', 'garbage', cursor.slice(0, -1), `${cursor}0`, familyCursor]) {
    await invalid(t, o.listJobRuns({ cursor: bad, limit: 2 }), `cursor ${JSON.stringify(bad)}`);
  }
  t.is(await o.countRuns(), 5, 'nothing changed');
  const second = await o.listJobRuns({ cursor, limit: 2 });
  t.deepEqual(
    second.items.map((r) => r.runId).filter((id) => first.items.some((f) => f.runId === id)),
    [],
    'the real cursor still pages on',
  );
});

forBackends('DF2: a non-positive, fractional or non-number limit is JobInputInvalidError, not clamped (the family clamps to 1..200)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('df2.boom', {}, async () => {
    throw new Error('boom');
  });
  for (let i = 0; i < 3; i++) {
    await o.start('df2.boom', { i });
    await runNext(o);
  }
  for (const limit of [0, -1, 1.5, Number.NaN, '5' as unknown as number]) {
    await invalid(t, o.listJobRuns({ limit }), `listJobRuns limit ${String(limit)}`);
    await invalid(t, o.listRecentFailed(limit), `listRecentFailed limit ${String(limit)}`);
    await invalid(t, o.listForScope('E', '1', { limit }), `listForScope limit ${String(limit)}`);
  }
  t.is(await o.countRuns(), 3, 'nothing changed');
  t.is((await o.listRecentFailed(3)).length, 3);
  t.is((await o.listJobRuns({ limit: 1 })).items.length, 1);
});

forBackends('DF2: pages hold up to 500 (the family caps at 200); more is clamped to 500', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('df2.ok', {}, ok);
  for (let i = 0; i < 501; i++) await o.start('df2.ok', { i });
  t.is((await o.listJobRuns({ limit: 250 })).items.length, 250);
  const max = await o.listJobRuns({ limit: 10_000 });
  t.is(max.items.length, 500);
  t.is(typeof max.nextCursor, 'string');
});
