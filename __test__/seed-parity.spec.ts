/**
 * The seed's parity scenarios (what its unit suite checked of the memory
 * backend), written the seed's way — JobHandlerBase subclasses registered
 * through upsertJobRows, ParentClosePolicy — and run against jobforge.
 * Where the contract deliberately differs from the seed the contract's
 * behaviour is asserted (see deliberate-differences.spec.ts).
 */
import test from 'ava';
import { JobCollisionError, JobHandlerBase, MissingTenantIdError, ParentClosePolicy } from '../dist';
import type { JobContext, JobOrchestrator, JobRun } from '../dist';
import { claim, claimAll, get, manual, runNext, statusOf, stepsById, waitFor } from './helpers';

class NoopHandler extends JobHandlerBase {
  async run(): Promise<unknown> {
    return { ok: true };
  }
}

class EchoHandler extends JobHandlerBase<Record<string, unknown>> {
  async run(ctx: JobContext<Record<string, unknown>>): Promise<unknown> {
    return { echo: ctx.input };
  }
}

async function withTypes(o: JobOrchestrator, entries: { type: string; meta?: object; handlerClass?: unknown }[]): Promise<void> {
  const res = await o.upsertJobRows(
    entries.map((e) => ({ type: e.type, meta: (e.meta ?? {}) as never, handlerClass: e.handlerClass ?? NoopHandler })),
  );
  if (res.orphaned.length !== 0) throw new Error('memory mode reports no orphans');
}

// ─── claim ─────────────────────────────────────────────────────────────────

test('parity: claimNext orders by priority DESC, then runAt ASC', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.claim' }]);
  const now = o.now().getTime();
  const lowOld = await o.start('p.claim', { n: 1 }, { priority: 1, runAt: new Date(now - 2000) });
  const highNew = await o.start('p.claim', { n: 2 }, { priority: 10, runAt: new Date(now) });
  const lowNewer = await o.start('p.claim', { n: 3 }, { priority: 1, runAt: new Date(now - 1000) });
  const highOld = await o.start('p.claim', { n: 4 }, { priority: 10, runAt: new Date(now - 500) });
  t.deepEqual(await claimAll(o), [highOld.id, highNew.id, lowOld.id, lowNewer.id]);
});

test('parity: a run scheduled in the future is not claimable until due', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.future' }]);
  const due = await o.start('p.future', {}, { runAt: new Date(o.now().getTime() + 60_000) });
  const now = await o.start('p.future', {});
  t.deepEqual(await claimAll(o), [now.id]);
  o.advanceTime(59_999);
  t.is(await o.claimNext('batch'), null);
  o.advanceTime(1);
  t.deepEqual(await claimAll(o), [due.id]);
});

test('parity: claimNext only sees its own pool', async (t) => {
  const o = manual();
  await withTypes(o, [
    { type: 'p.critical', meta: { pool: 'critical' } },
    { type: 'p.batch' },
  ]);
  const c = await o.start('p.critical', {});
  const b = await o.start('p.batch', {});
  const moved = await o.start('p.batch', {}, { pool: 'critical' });
  t.deepEqual(await claimAll(o, 'batch'), [b.id]);
  t.deepEqual(await claimAll(o, 'critical'), [c.id, moved.id]);
  t.is(await o.claimNext('other'), null);
});

// ─── collisions ────────────────────────────────────────────────────────────

for (const keyKind of ['template', 'function'] as const) {
  const key = keyKind === 'template' ? 'user:{{userId}}' : (i: { userId: string }) => `user:${i.userId}`;

  test(`parity: queue collision (${keyKind} key) — the second run waits until the incumbent completes`, async (t) => {
    const o = manual();
    await withTypes(o, [{ type: 'p.queue', meta: { concurrency: { key, collisionMode: 'queue' } } }]);
    const first = await o.start('p.queue', { userId: 'u1' });
    const second = await o.start('p.queue', { userId: 'u1' });
    t.is(first.concurrencyKey, 'user:u1');
    t.is(second.concurrencyKey, 'user:u1');
    t.is(second.status, 'pending');
    t.is((await runNext(o)).id, first.id);
    t.is((await runNext(o)).id, second.id);
    t.is(await statusOf(o, second.id), 'completed');
  });

  test(`parity: reject collision (${keyKind} key) — JobCollisionError while the incumbent is in flight`, async (t) => {
    const o = manual();
    await withTypes(o, [{ type: 'p.reject', meta: { concurrency: { key, collisionMode: 'reject' } } }]);
    const first = await o.start('p.reject', { userId: 'u1' });
    const err = await t.throwsAsync(o.start('p.reject', { userId: 'u1' }), { instanceOf: JobCollisionError });
    t.is(err.incumbent.id, first.id);
    t.is(err.concurrencyKey, 'user:u1');
    t.is(err.jobType, 'p.reject');
    await runNext(o);
    const again = await o.start('p.reject', { userId: 'u1' });
    t.not(again.id, first.id, 'a completed incumbent no longer collides');
  });

  test(`parity: replace collision (${keyKind} key) — the incumbent is canceled, the newcomer runs`, async (t) => {
    const o = manual();
    await withTypes(o, [{ type: 'p.replace', meta: { concurrency: { key, collisionMode: 'replace' } }, handlerClass: EchoHandler }]);
    const first = await o.start('p.replace', { userId: 'u1', v: 1 });
    const second = await o.start('p.replace', { userId: 'u1', v: 2 });
    t.is(await statusOf(o, first.id), 'canceled');
    const ran = await runNext(o);
    t.is(ran.id, second.id);
    t.deepEqual(ran.output, { echo: { userId: 'u1', v: 2 } });
    t.is(await o.claimNext('batch'), null);
  });
}

// ─── dedupe ────────────────────────────────────────────────────────────────

test('parity: dedupe inside the window collapses onto the existing run', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.dedupe', meta: { dedupe: { key: 'invoice:{{invoiceId}}', windowMs: 5 * 60_000 } } }]);
  const first = await o.start('p.dedupe', { invoiceId: 'i1' });
  o.advanceTime(4 * 60_000);
  const second = await o.start('p.dedupe', { invoiceId: 'i1' });
  t.is(second.id, first.id);
  t.is(first.dedupeKey, 'invoice:i1');
  t.deepEqual(await claimAll(o), [first.id]);
});

test('parity: dedupe outside the window creates a new run', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.dedupe2', meta: { dedupe: { key: 'invoice:{{invoiceId}}', windowMs: 1000 } } }]);
  const first = await o.start('p.dedupe2', { invoiceId: 'i1' });
  o.advanceTime(1500);
  const second = await o.start('p.dedupe2', { invoiceId: 'i1' });
  t.not(second.id, first.id);
  t.is(second.dedupeKey, first.dedupeKey);
  t.deepEqual(await claimAll(o), [first.id, second.id]);
});

// ─── steps ─────────────────────────────────────────────────────────────────

test('parity: step memoization across ticks — a completed step is not re-executed after a retry', async (t) => {
  const o = manual();
  const calls = { charge: 0, notify: 0 };
  class ChargeHandler extends JobHandlerBase<{ amount: number }> {
    async run(ctx: JobContext<{ amount: number }>): Promise<unknown> {
      const receipt = await ctx.step('charge', async () => {
        calls.charge++;
        return { receipt: `r-${ctx.input.amount}-${calls.charge}` };
      });
      await ctx.step('notify', async () => {
        calls.notify++;
        if (calls.notify === 1) throw new Error('mailer down');
        return { sent: true };
      });
      return receipt;
    }
  }
  await withTypes(o, [{ type: 'p.memo', meta: { retry: { attempts: 3, backoff: 'fixed', baseMs: 0 } }, handlerClass: ChargeHandler }]);
  const run = await o.start('p.memo', { amount: 42 });
  await runNext(o);
  t.is(await statusOf(o, run.id), 'pending');
  const done = await runNext(o);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { receipt: 'r-42-1' });
  t.deepEqual(calls, { charge: 1, notify: 2 });
  const steps = await stepsById(o, run.id);
  t.is(steps.charge?.attempts, 1);
  t.is(steps.notify?.attempts, 2);
  t.is(steps.notify?.status, 'completed');
});

// ─── replay ────────────────────────────────────────────────────────────────

for (const replayFrom of ['scratch', 'last_step', 'last_checkpoint'] as const) {
  test(`parity: replay with replayFrom '${replayFrom}' resets the row and clears the right steps`, async (t) => {
    const o = manual();
    let failing = true;
    const calls = { load: 0, save: 0 };
    class TwoSteps extends JobHandlerBase {
      async run(ctx: JobContext<unknown>): Promise<unknown> {
        await ctx.step('load', async () => ({ n: ++calls.load }));
        await ctx.step('save', async () => {
          calls.save++;
          if (failing) throw new Error('save failed');
          return { saved: true };
        });
        return { done: true };
      }
    }
    await withTypes(o, [{ type: 'p.replay', meta: { replayFrom }, handlerClass: TwoSteps }]);
    const run = await o.start('p.replay', {});
    const failed = await runNext(o);
    t.is(failed.status, 'failed');
    t.not(failed.error, null);
    const replayed = await o.replay(run.id);
    t.is(replayed.id, run.id);
    t.is(replayed.status, 'pending');
    t.is(replayed.attempts, 0);
    t.is(replayed.error, null);
    t.is(replayed.finishedAt, null);
    const kept = (await o.listSteps(run.id)).map((s) => s.stepId);
    t.deepEqual(kept, replayFrom === 'scratch' ? [] : ['load']);
    failing = false;
    const done = await runNext(o);
    t.is(done.status, 'completed');
    t.is(calls.load, replayFrom === 'scratch' ? 2 : 1);
    t.is(calls.save, 2);
  });
}

// ─── cascade ───────────────────────────────────────────────────────────────

test('parity: cancel cascades by parent-close policy — terminate and cancel children go, abandon stays', async (t) => {
  const o = manual();
  const kids: Record<string, JobRun> = {};
  let signal: AbortSignal | undefined;
  class Spawner extends JobHandlerBase {
    async run(ctx: JobContext<unknown>): Promise<unknown> {
      kids.terminate = await ctx.spawnChild('p.child', {}, { closePolicy: ParentClosePolicy.Terminate });
      kids.cancel = await ctx.spawnChild('p.child', {}, { closePolicy: ParentClosePolicy.Cancel });
      kids.abandon = await ctx.spawnChild('p.child', {}, { closePolicy: ParentClosePolicy.Abandon });
      signal = ctx.signal;
      return new Promise(() => undefined); // stays running until canceled
    }
  }
  await withTypes(o, [
    { type: 'p.parent', handlerClass: Spawner },
    { type: 'p.child' },
  ]);
  const parent = await o.start('p.parent', {});
  await claim(o);
  const tick = o.tick(parent.id);
  await waitFor(() => signal !== undefined, 'children spawned');
  await o.cancel(parent.id);
  await waitFor(() => signal?.aborted === true, 'parent signal'); // the abort is delivered asynchronously
  await tick;
  t.is(await statusOf(o, parent.id), 'canceled');
  t.is(await statusOf(o, kids.terminate!.id), 'canceled');
  t.is(await statusOf(o, kids.cancel!.id), 'canceled');
  t.is(await statusOf(o, kids.abandon!.id), 'pending');
  const parentRow = await get(o, parent.id);
  for (const k of [kids.terminate!, kids.cancel!]) {
    t.true(((await get(o, k.id)).finishedAt?.getTime() ?? Infinity) <= (parentRow.finishedAt?.getTime() ?? -Infinity));
  }
});

test('parity: three-level tree — cancelling the root walks every terminate/cancel level', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.node' }]);
  const root = await o.start('p.node', { l: 0 });
  const a = await o.start('p.node', { l: 1 }, { parentRunId: root.id, parentClosePolicy: ParentClosePolicy.Terminate });
  const b = await o.start('p.node', { l: 1 }, { parentRunId: root.id, parentClosePolicy: ParentClosePolicy.Cancel });
  const c = await o.start('p.node', { l: 1 }, { parentRunId: root.id, parentClosePolicy: ParentClosePolicy.Abandon });
  const a1 = await o.start('p.node', { l: 2 }, { parentRunId: a.id, parentClosePolicy: ParentClosePolicy.Cancel });
  const b1 = await o.start('p.node', { l: 2 }, { parentRunId: b.id, parentClosePolicy: ParentClosePolicy.Terminate });
  const b2 = await o.start('p.node', { l: 2 }, { parentRunId: b.id, parentClosePolicy: ParentClosePolicy.Abandon });
  const c1 = await o.start('p.node', { l: 2 }, { parentRunId: c.id, parentClosePolicy: ParentClosePolicy.Terminate });
  for (const r of [a, b, c, a1, b1, b2, c1]) t.is(r.rootRunId, root.id);
  await o.cancel(root.id);
  const status = async (r: JobRun): Promise<string> => statusOf(o, r.id);
  t.deepEqual(
    {
      root: await status(root), a: await status(a), b: await status(b), c: await status(c),
      a1: await status(a1), b1: await status(b1), b2: await status(b2), c1: await status(c1),
    },
    {
      root: 'canceled', a: 'canceled', b: 'canceled', c: 'pending',
      a1: 'canceled', b1: 'canceled', b2: 'pending', c1: 'pending',
    },
  );
  const finished = async (r: JobRun): Promise<number> => (await get(o, r.id)).finishedAt?.getTime() ?? NaN;
  t.true((await finished(a1)) <= (await finished(a)));
  t.true((await finished(b1)) <= (await finished(b)));
  t.true((await finished(a)) <= (await finished(root)));
});

// ─── retry ─────────────────────────────────────────────────────────────────

test('parity: run-level retry — attempts count up, error.retryable true while retrying, false at the end', async (t) => {
  const o = manual();
  let calls = 0;
  class AlwaysFails extends JobHandlerBase {
    async run(): Promise<unknown> {
      calls++;
      throw new Error(`attempt ${calls} failed`);
    }
  }
  await withTypes(o, [{ type: 'p.retry', meta: { retry: { attempts: 3, backoff: 'exponential', baseMs: 10 } }, handlerClass: AlwaysFails }]);
  const run = await o.start('p.retry', {});
  const seen: { status: string; attempts: number; retryable: boolean | undefined; attempt: number | undefined; delay: number }[] = [];
  for (let i = 0; i < 3; i++) {
    await runNext(o);
    const row = await get(o, run.id);
    const delay = row.status === 'pending' ? row.runAt.getTime() - o.now().getTime() : 0;
    seen.push({ status: row.status, attempts: row.attempts, retryable: row.error?.retryable, attempt: row.error?.attempt, delay });
    o.advanceTime(delay);
  }
  t.deepEqual(seen, [
    { status: 'pending', attempts: 1, retryable: true, attempt: 1, delay: 10 },
    { status: 'pending', attempts: 2, retryable: true, attempt: 2, delay: 20 },
    { status: 'failed', attempts: 3, retryable: false, attempt: 3, delay: 0 },
  ]);
  t.is((await get(o, run.id)).error?.message, 'attempt 3 failed');
  t.is(calls, 3);
});

// ─── multi-tenant gate ─────────────────────────────────────────────────────

test('parity: multi-tenant gate on start and cancel', async (t) => {
  const o = manual({ multiTenant: true });
  await withTypes(o, [{ type: 'p.mt' }]);
  const se = await t.throwsAsync(o.start('p.mt', {}), { instanceOf: MissingTenantIdError });
  t.is(se.method, 'start');
  const a = await o.start('p.mt', {}, { tenantId: 'tenant-a' });
  const shared = await o.start('p.mt', {}, { tenantId: null });
  t.is(a.tenantId, 'tenant-a');
  t.is(shared.tenantId, null);
  const ce = await t.throwsAsync(o.cancel(a.id), { instanceOf: MissingTenantIdError });
  t.is(ce.method, 'cancel');
  await o.cancel(a.id, { tenantId: 'tenant-b' });
  t.is((await get(o, a.id, 'tenant-a')).status, 'pending', 'cross-tenant cancel is a silent no-op');
  await o.cancel(a.id, { tenantId: 'tenant-a' });
  t.is((await get(o, a.id, 'tenant-a')).status, 'canceled');
  await o.cancel(shared.id, { tenantId: null });
  t.is((await get(o, shared.id, null)).status, 'canceled');
});

test('parity: single-tenant mode ignores tenant ids on start and cancel', async (t) => {
  const o = manual();
  await withTypes(o, [{ type: 'p.st' }]);
  const r = await o.start('p.st', {}, { tenantId: 'whatever' });
  t.is(r.tenantId, null);
  await o.cancel(r.id, { tenantId: 'someone-else' });
  t.is(await statusOf(o, r.id), 'canceled');
});
