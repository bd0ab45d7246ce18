/**
 * Durable waits (issue 22), the acceptance points `waits.spec.ts` left
 * untested: no park while a step runs, the tenant gate of `resume`,
 * `closePolicy: 'abandon'` and the options of `ctx.invoke`, replay from
 * scratch / last_checkpoint across a finished sleep, a timed-out child,
 * bad wait input, the manual clock with a worker, `cancelForScope` of a
 * waiting run, `sleepUntil`, waits across PostgreSQL processes, and the
 * priority and timeout of resumed runs. Store-independent points run on
 * both stores; deterministic ones on the manual clock.
 */
import {
  JobChildFailedError,
  JobInputInvalidError,
  JobResumeTokenError,
  JobRunStateError,
  JobOrchestrator,
} from '../dist';
import type { JobContext, JobRun } from '../dist';
import { forBackends, pair, PG_URL, postgresOnly } from './backends';
import { claimAll, deferred, get, hanging, realSleep, rejects, silentLogger, stepsById, waitFor } from './helpers';

/** Claims the run `id` (it must be the next of `pool`) and executes it once. */
async function tickRun(o: JobOrchestrator, id: string, pool = 'batch', tenantId?: string | null): Promise<JobRun> {
  const c = await o.claimNext(pool);
  if (c?.id !== id) throw new Error(`expected to claim ${id}, got ${c?.id ?? 'nothing'}`);
  await o.tick(id);
  return get(o, id, tenantId);
}

// ── 1. parking waits for running steps ──────────────────────────────────

forBackends('no park while a ctx.step runs: Promise.all of a slow step and a sleep records the step, then parks; the resumption does not run the step again', async (t, make) => {
  const o = await make.manual();
  const release = deferred();
  const stepEntered = deferred();
  let stepRuns = 0;
  let entered = 0;
  o.registerHandler('slow-and-sleep', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    const [s] = await Promise.all([
      ctx.step('s', async () => {
        stepRuns++;
        stepEntered.resolve();
        await release.promise;
        return 'slow done';
      }),
      ctx.sleep('z', 1_000),
    ]);
    return { s };
  });
  const run = await o.start('slow-and-sleep', {});
  const t0 = o.now().getTime();
  t.is((await o.claimNext('batch'))?.id, run.id);
  const tick = o.tick(run.id);
  await stepEntered.promise;
  // Time for a park decision (and its write) to happen, were it taken.
  await realSleep(50);
  const during = await get(o, run.id);
  t.is(during.status, 'running', 'not waiting while the step function runs');
  t.not(during.claimedAt, null, 'the run keeps its claim while its step runs');
  release.resolve();
  await tick;
  const parked = await get(o, run.id);
  t.is(parked.status, 'waiting', 'parked once the step ended');
  t.is(parked.waitKind, 'sleep');
  t.is(parked.waitDeadline?.getTime(), t0 + 1_000);
  const steps = await stepsById(o, run.id);
  t.is(steps.s?.kind, 'task');
  t.is(steps.s?.status, 'completed', 'the step was recorded before parking');
  t.is(steps.s?.output as unknown, 'slow done');
  o.advanceTime(1_000);
  const done = await tickRun(o, run.id);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { s: 'slow done' });
  t.is(stepRuns, 1, 'the step answered from the store on the resumption');
  t.is(entered, 2);
  t.is(done.attempts, 1);
});

// ── 2. resume's tenant gate in multi-tenant mode ────────────────────────

forBackends('multi-tenant: resume(token, payload) without tenantId resumes (the token names its run); a tenantId that is not the run\'s, null included, is JobResumeTokenError', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const tokens = new Map<string, string>();
  o.registerHandler('mt-token', {}, async (ctx: JobContext<unknown>) => ({
    got: await ctx.waitForToken('t', (tok) => void tokens.set(ctx.run.id, tok)),
  }));
  const a = await o.start('mt-token', {}, { tenantId: 'acme' });
  const b = await o.start('mt-token', {}, { tenantId: 'acme' });
  const n = await o.start('mt-token', {}, { tenantId: null });
  for (const id of await claimAll(o)) await o.tick(id);
  for (const [r, tenant] of [[a, 'acme'], [b, 'acme'], [n, null]] as const) {
    t.is((await get(o, r.id, tenant)).status, 'waiting');
  }

  // No tenantId: the token alone is the credential.
  t.deepEqual(await o.resume(tokens.get(a.id)!, { ok: 'a' }), { runId: a.id });
  t.is((await get(o, a.id, 'acme')).status, 'pending');
  const doneA = await tickRun(o, a.id, 'batch', 'acme');
  t.deepEqual(doneA.output, { got: { ok: 'a' } });

  // A tenantId given must be the run's: null means "a run without a tenant".
  await rejects(t, () => o.resume(tokens.get(b.id)!, 1, { tenantId: null }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'null for a tenant\'s run');
  await rejects(t, () => o.resume(tokens.get(b.id)!, 1, { tenantId: 'globex' }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'another tenant');
  await rejects(t, () => o.resume(tokens.get(n.id)!, 1, { tenantId: 'acme' }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'a tenant for a run without one');
  t.is((await get(o, b.id, 'acme')).status, 'waiting', 'refused resumes changed nothing');
  t.is((await get(o, n.id, null)).status, 'waiting');
  // The refused token is still good for its own tenant, and for no tenant given.
  t.deepEqual(await o.resume(tokens.get(b.id)!, 'b', { tenantId: 'acme' }), { runId: b.id });
  t.deepEqual(await o.resume(tokens.get(n.id)!, 'n', { tenantId: null }), { runId: n.id });
  t.is((await get(o, b.id, 'acme')).status, 'pending');
  t.is((await get(o, n.id, null)).status, 'pending');
});

// ── 3. invoke: closePolicy abandon; priority, runAt, tags ────────────────

forBackends("invoke: closePolicy 'abandon' children outlive a canceled parent (pending stays pending, running runs on); priority, runAt and tags reach the child row", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('kid.later', { pool: 'kids' }, async () => 'later');
  o.registerHandler('kid.now', { pool: 'kids' }, async () => 'now');
  o.registerHandler('kid.bound', { pool: 'kids' }, async () => 'bound');
  const later = new Date(o.now().getTime() + 60_000);
  o.registerHandler('boss', {}, async (ctx: JobContext<unknown>) =>
    Promise.all([
      ctx.invoke('later', 'kid.later', { k: 1 }, { closePolicy: 'abandon', priority: 7, runAt: later, tags: { team: 'ops', k: 'later' } }),
      ctx.invoke('now', 'kid.now', { k: 2 }, { closePolicy: 'abandon', priority: 5 }),
      ctx.invoke('bound', 'kid.bound', { k: 3 }),
    ]),
  );
  const p = await o.start('boss', {});
  t.is((await tickRun(o, p.id)).waitKind, 'child');
  const kids = Object.fromEntries((await o.getRunTree(p.id))!.children.map((c) => [c.run.jobType, c.run]));
  const kLater = kids['kid.later']!;
  const kNow = kids['kid.now']!;
  const kBound = kids['kid.bound']!;
  t.truthy(kLater && kNow && kBound, 'three children');
  t.is(kLater.parentClosePolicy, 'abandon');
  t.is(kLater.priority, 7);
  t.is(kLater.runAt.getTime(), later.getTime());
  t.deepEqual(kLater.tags, { team: 'ops', k: 'later' });
  t.is(kLater.status, 'pending');
  t.is(kNow.parentClosePolicy, 'abandon');
  t.is(kNow.priority, 5);
  t.is(kBound.parentClosePolicy, 'terminate', 'the default close policy');
  // kid.now (priority 5) is due and claimed first: it is running at the cancel.
  t.is((await o.claimNext('kids'))?.id, kNow.id);
  await o.cancel(p.id);
  t.is((await get(o, p.id)).status, 'canceled');
  t.is((await get(o, kBound.id)).status, 'canceled', 'the terminate child followed its parent');
  t.is((await get(o, kLater.id)).status, 'pending', 'the abandoned pending child is left alone');
  t.is((await get(o, kNow.id)).status, 'running', 'the abandoned running child is left alone');
  await o.tick(kNow.id);
  const nowDone = await get(o, kNow.id);
  t.is(nowDone.status, 'completed', 'and it still completes');
  t.is(nowDone.output as unknown, 'now');
  t.is(await o.claimNext('kids'), null, 'the later child is not due yet (its runAt holds)');
  o.advanceTime(60_000);
  const laterDone = await tickRun(o, kLater.id, 'kids');
  t.is(laterDone.status, 'completed');
  t.is((await get(o, p.id)).status, 'canceled', 'a child end does not revive a canceled parent');
});

// ── 4. replay across a finished sleep ───────────────────────────────────

forBackends("replay of a run that completed after a finished sleep: 'scratch' sleeps again, 'last_checkpoint' does not", async (t, make) => {
  const o = await make.manual();
  const entered = { scratch: 0, last_checkpoint: 0 };
  for (const from of ['scratch', 'last_checkpoint'] as const) {
    o.registerHandler(`nap.${from}`, { replayFrom: from }, async (ctx: JobContext<unknown>) => {
      entered[from]++;
      await ctx.sleep('nap', 1_000);
      const said = from === 'last_checkpoint' ? await ctx.waitForSignal('say') : null;
      return { from, n: entered[from], said };
    });
  }
  const s = await o.start('nap.scratch', {});
  const c = await o.start('nap.last_checkpoint', {});
  for (const r of [s, c]) {
    t.is((await tickRun(o, r.id)).status, 'waiting');
  }
  o.advanceTime(1_000);
  t.is((await tickRun(o, s.id)).status, 'completed');
  t.is((await tickRun(o, c.id)).waitKind, 'signal');
  t.deepEqual(await o.signal(c.id, 'say', 'hi'), { delivered: true });
  t.is((await tickRun(o, c.id)).status, 'completed');

  await o.replay(s.id);
  const t1 = o.now().getTime();
  const parked = await tickRun(o, s.id);
  t.is(parked.status, 'waiting', 'from scratch the finished sleep is gone: it sleeps again');
  t.is(parked.waitKind, 'sleep');
  t.is(parked.waitDeadline?.getTime(), t1 + 1_000, 'a new sleep, from the replay\'s execution');
  o.advanceTime(999);
  t.is((await get(o, s.id)).status, 'waiting');
  o.advanceTime(1);
  const sDone = await tickRun(o, s.id);
  t.is(sDone.status, 'completed');
  t.deepEqual(sDone.output, { from: 'scratch', n: 4, said: null });

  await o.replay(c.id);
  const cDone = await tickRun(o, c.id);
  t.is(cDone.status, 'completed', 'the kept sleep and signal wait answered at once: no park');
  t.deepEqual(cDone.output, { from: 'last_checkpoint', n: 4, said: 'hi' });
  const kept = await stepsById(o, c.id);
  t.is(kept.nap?.status, 'completed');
  t.is(kept.say?.status, 'completed');
});

// ── 5. a timed-out child ────────────────────────────────────────────────

forBackends("invoke: a child that times out makes the call throw JobChildFailedError { status: 'timed_out' }", async (t, make) => {
  const o = await make.manual();
  const h = hanging();
  o.registerHandler('stuck', { pool: 'kids', timeoutMs: 200 }, h.handler);
  let caught: unknown;
  o.registerHandler('waits-for-stuck', {}, async (ctx: JobContext<unknown>) => {
    try {
      return await ctx.invoke('k', 'stuck', {});
    } catch (e) {
      caught = e;
      return 'child timed out';
    }
  });
  const p = await o.start('waits-for-stuck', {});
  t.is((await tickRun(o, p.id)).waitKind, 'child');
  const kid = (await o.getRunTree(p.id))!.children[0]!.run;
  t.is((await o.claimNext('kids'))?.id, kid.id);
  const tick = o.tick(kid.id);
  await h.entered();
  o.advanceTime(200);
  await tick;
  const kidRow = await get(o, kid.id);
  t.is(kidRow.status, 'timed_out');
  t.is((await get(o, p.id)).status, 'pending', 'the child end resumed the parent');
  const done = await tickRun(o, p.id);
  t.is(done.status, 'completed');
  t.is(done.output as unknown, 'child timed out');
  t.true(caught instanceof JobChildFailedError, String(caught));
  const e = caught as JobChildFailedError;
  t.is(e.status, 'timed_out');
  t.is(e.childRunId, kid.id);
  t.is(e.code, 'JOB_CHILD_FAILED');
  t.deepEqual(e.error, kidRow.error, "the child's error");
  t.regex(e.error?.message ?? '', /time/i);
});

// ── 6. bad wait input ───────────────────────────────────────────────────

forBackends('bad wait input: a timeoutMs that is not a positive integer, or an unknown option key, is JobInputInvalidError with no step row; invoke with non-JSON input starts no child', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('kid', { pool: 'kids' }, async () => 'x');
  let delivered = 0;
  const deliver = (): void => {
    delivered++;
  };
  const calls: Array<[string, (ctx: JobContext<unknown>) => Promise<unknown>]> = [];
  for (const bad of [-1, 0, Number.NaN, 1.5, Infinity, '100' as unknown as number]) {
    const b = String(bad);
    calls.push([`signal timeoutMs ${b}`, (ctx) => ctx.waitForSignal(`sig ${b}`, { timeoutMs: bad })]);
    calls.push([`token timeoutMs ${b}`, (ctx) => ctx.waitForToken(`tok ${b}`, deliver, { timeoutMs: bad })]);
    calls.push([`invoke timeoutMs ${b}`, (ctx) => ctx.invoke(`inv ${b}`, 'kid', {}, { timeoutMs: bad })]);
  }
  calls.push(['signal unknown key', (ctx) => ctx.waitForSignal('sig key', { timeout: 5 } as never)]);
  calls.push(['token unknown key', (ctx) => ctx.waitForToken('tok key', deliver, { signal: 'x' } as never)]);
  calls.push(['invoke unknown key', (ctx) => ctx.invoke('inv key', 'kid', {}, { close: 'abandon' } as never)]);
  calls.push(['invoke fractional priority', (ctx) => ctx.invoke('inv prio', 'kid', {}, { priority: 1.5 })]);
  calls.push(['invoke invalid runAt', (ctx) => ctx.invoke('inv runAt', 'kid', {}, { runAt: new Date('nope') })]);
  calls.push(['invoke bad close policy', (ctx) => ctx.invoke('inv policy', 'kid', {}, { closePolicy: 'sometimes' as never })]);
  calls.push(['invoke bigint input', (ctx) => ctx.invoke('inv bigint', 'kid', { n: 10n })]);
  calls.push(['invoke function input', (ctx) => ctx.invoke('inv fn', 'kid', { f: () => 1 })]);
  calls.push(['invoke cyclic input', (ctx) => {
    const c: Record<string, unknown> = {};
    c.self = c;
    return ctx.invoke('inv cycle', 'kid', c);
  }]);
  const outcomes: Record<string, string> = {};
  o.registerHandler('bad-waits', {}, async (ctx: JobContext<unknown>) => {
    for (const [label, call] of calls) {
      try {
        await call(ctx);
        outcomes[label] = 'resolved';
      } catch (e) {
        outcomes[label] = `${(e as Error).name} ${String((e as { code?: unknown }).code)}`;
      }
    }
    return 'survived';
  });
  const r = await o.start('bad-waits', {});
  const done = await tickRun(o, r.id);
  t.is(done.status, 'completed');
  t.is(done.output as unknown, 'survived');
  t.deepEqual(outcomes, Object.fromEntries(calls.map(([label]) => [label, 'JobInputInvalidError JOB_INPUT_INVALID'])));
  t.deepEqual(await o.listSteps(r.id), [], 'no step row for any refused wait');
  t.is(delivered, 0, 'deliver was never called');
  t.is((await o.getRunTree(r.id))?.children.length, 0, 'no child run');
  t.is((await o.listJobRuns({ jobType: 'kid' })).items.length, 0, 'no run of the child type at all');
});

// ── 7. the manual clock with a worker ───────────────────────────────────

forBackends('manual clock with a worker: a sleeping run resumes on advanceTime and completes, not before', async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  o.registerHandler('worker-nap', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    await ctx.sleep('z', 60_000);
    return { after: await ctx.step('after', () => 'woke') };
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  try {
    const r = await o.start('worker-nap', {});
    const t0 = o.now().getTime();
    await waitFor(async () => (await get(o, r.id)).status === 'waiting', 'parked', 5_000);
    t.is((await get(o, r.id)).waitDeadline?.getTime(), t0 + 60_000);
    o.advanceTime(59_999);
    await realSleep(100);
    t.is((await get(o, r.id)).status, 'waiting', 'not resumed before its deadline');
    t.is(entered, 1);
    o.advanceTime(1);
    const done = await o.waitForRun(r.id, { timeoutMs: 5_000 });
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { after: 'woke' });
    t.is(entered, 2);
    t.is(done.attempts, 1);
  } finally {
    await w.stop();
  }
});

// ── 8. cancelForScope of a waiting run ──────────────────────────────────

forBackends('cancelForScope ends a waiting run canceled: its wait is gone (no deadline, no signal, nothing to claim)', async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  o.registerHandler('scoped-wait', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    return ctx.waitForSignal('go', { timeoutMs: 10_000 });
  });
  const r = await o.start('scoped-wait', {}, { scope: { entityType: 'order', entityId: 'o-1' } });
  const other = await o.start('scoped-wait', {}, { scope: { entityType: 'order', entityId: 'o-2' } });
  for (const id of await claimAll(o)) await o.tick(id);
  t.is((await get(o, r.id)).status, 'waiting');
  t.is(await o.cancelForScope('order', 'o-1'), 1, 'the waiting run counts as live');
  const row = await get(o, r.id);
  t.is(row.status, 'canceled');
  t.is(row.waitKind, null);
  t.is(row.waitDeadline, null);
  t.not(row.finishedAt, null);
  await rejects(t, () => o.signal(r.id, 'go', 1), JobRunStateError, 'JOB_RUN_STATE', 'a canceled run takes no signal');
  o.advanceTime(10_000);
  t.is((await get(o, r.id)).status, 'canceled', 'the old deadline does not resume it');
  // The other scope's run was not touched: its deadline resumes it.
  t.is((await get(o, other.id)).status, 'pending');
  t.is((await o.claimNext('batch'))?.id, other.id, 'only the other scope\'s run is claimable');
  t.is(entered, 2, 'the canceled run never ran again');
});

forBackends("cancelForScope of a run waiting on invoked children cascades to them, except a closePolicy 'abandon' one", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('scoped-kid', { pool: 'kids' }, async () => 'x');
  o.registerHandler('scoped-parent', {}, async (ctx: JobContext<unknown>) =>
    Promise.all([ctx.invoke('bound', 'scoped-kid', { k: 'bound' }), ctx.invoke('free', 'scoped-kid', { k: 'free' }, { closePolicy: 'abandon' })]),
  );
  const p = await o.start('scoped-parent', {}, { scope: { entityType: 'trip', entityId: 't-1' } });
  t.is((await tickRun(o, p.id)).waitKind, 'child');
  const kids = (await o.getRunTree(p.id))!.children.map((c) => c.run);
  const bound = kids.find((k) => (k.input as { k: string }).k === 'bound')!;
  const free = kids.find((k) => (k.input as { k: string }).k === 'free')!;
  t.truthy(bound && free);
  t.true((await o.cancelForScope('trip', 't-1')) >= 1);
  t.is((await get(o, p.id)).status, 'canceled');
  t.is((await get(o, bound.id)).status, 'canceled', 'the cascade reached the invoked child');
  t.is((await get(o, free.id)).status, 'pending', 'the abandoned child is left alone');
});

// ── 1b. deliver counts as a running step ──────────────────────────────

forBackends('no park while a token deliver runs: a slow deliver next to a sleep keeps the run running; it parks once deliver returned', async (t, make) => {
  const o = await make.manual();
  const release = deferred();
  const inDeliver = deferred();
  let token = '';
  let delivers = 0;
  o.registerHandler('slow-deliver', {}, async (ctx: JobContext<unknown>) => {
    const [answer] = await Promise.all([
      ctx.waitForToken<string>('t', async (tok) => {
        delivers++;
        inDeliver.resolve();
        await release.promise;
        token = tok;
      }),
      ctx.sleep('z', 1_000),
    ]);
    return { answer };
  });
  const r = await o.start('slow-deliver', {});
  t.is((await o.claimNext('batch'))?.id, r.id);
  const tick = o.tick(r.id);
  await inDeliver.promise;
  await realSleep(50);
  t.is((await get(o, r.id)).status, 'running', 'not waiting while deliver runs');
  release.resolve();
  await tick;
  const parked = await get(o, r.id);
  t.is(parked.status, 'waiting');
  // The first open wait as recorded: on PostgreSQL the token's and the
  // sleep's calls go out in that order on two connections and are recorded
  // as they commit (under load the sleep's came first in a CI run).
  if (make.backend === 'memory') t.is(parked.waitKind, 'token', 'the first open wait');
  else t.true(parked.waitKind === 'token' || parked.waitKind === 'sleep', String(parked.waitKind));
  t.deepEqual(await o.resume(token, 'ok'), { runId: r.id });
  // The sleep is still open: the resumed execution parks on it.
  t.is((await tickRun(o, r.id)).waitKind, 'sleep');
  o.advanceTime(1_000);
  const done = await tickRun(o, r.id);
  t.deepEqual(done.output, { answer: 'ok' });
  t.is(delivers, 1);
});

// ── 9. sleepUntil ───────────────────────────────────────────────────────

forBackends('sleepUntil(futureDate) parks with waitDeadline at that date and resumes then', async (t, make) => {
  const o = await make.manual();
  const until = new Date(o.now().getTime() + 7_503);
  let entered = 0;
  o.registerHandler('until', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    await ctx.sleepUntil('alarm', until);
    return 'rang';
  });
  const r = await o.start('until', {});
  const parked = await tickRun(o, r.id);
  t.is(parked.status, 'waiting');
  t.is(parked.waitKind, 'sleep');
  t.is(parked.waitDeadline?.getTime(), until.getTime());
  o.advanceTime(7_502);
  t.is((await get(o, r.id)).status, 'waiting');
  t.is(await o.claimNext('batch'), null);
  o.advanceTime(1);
  t.is((await get(o, r.id)).status, 'pending');
  const done = await tickRun(o, r.id);
  t.is(done.status, 'completed');
  t.is(done.output as unknown, 'rang');
  t.is(entered, 2);
  t.is((await stepsById(o, r.id)).alarm?.kind, 'wait');
});

// ── 10. PostgreSQL: waits across orchestrators on one database ──────────

// Several orchestrators sharing one schema: only a database store has that.
postgresOnly('a resume() from another orchestrator wakes the waiting run at once (NOTIFY, not the poll)', async (t, make) => {
  // A poll far slower than the bound below: only a notification can meet it.
  const [a, b] = await pair(t, make, { logger: silentLogger, postgres: { url: PG_URL, pollMs: 5_000 } });
  let token = '';
  a.registerHandler('approve', {}, async (ctx: JobContext<unknown>) => ({
    got: await ctx.waitForToken('ok', (tok) => {
      token = tok;
    }),
  }));
  const w = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    const run = await a.start('approve', {});
    await waitFor(async () => (await get(a, run.id)).status === 'waiting', 'parked', 5_000);
    const t0 = Date.now();
    t.deepEqual(await b.resume(token, 'yes'), { runId: run.id });
    const done = await a.waitForRun(run.id, { timeoutMs: 5_000 });
    const took = Date.now() - t0;
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { got: 'yes' });
    t.true(took < 1_500, `resumed in ${took} ms (the poll interval is 5 s)`);
  } finally {
    await w.stop();
  }
});

// Several orchestrators sharing one schema: only a database store has that.
postgresOnly('a token wait survives closing its orchestrator: a new one on the database resumes it and its worker finishes the run', async (t, make) => {
  const full = make.options({ loggerFactory: () => silentLogger, logger: silentLogger });
  const made: JobOrchestrator[] = [];
  t.teardown(async () => {
    for (const x of made) await x.close();
  });
  const delivered: string[] = [];
  let entered = 0;
  const orchestrator = (): JobOrchestrator => {
    const o = new JobOrchestrator(full);
    made.push(o);
    o.registerHandler('durable-token', {}, async (ctx: JobContext<unknown>) => {
      entered++;
      const before = await ctx.step('before', () => 'b');
      const answer = await ctx.waitForToken<{ ok: boolean }>('approve', (tok) => void delivered.push(tok));
      return { before, answer };
    });
    return o;
  };
  const a = orchestrator();
  await a.migrate();
  const wa = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  const run = await a.start('durable-token', {});
  await waitFor(async () => (await get(a, run.id)).waitKind === 'token', 'parked on its token', 5_000);
  await wa.stop();
  await a.close();
  t.is(delivered.length, 1);

  const c = orchestrator();
  const wc = c.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    t.is((await get(c, run.id)).status, 'waiting', 'still waiting after its orchestrator closed');
    t.deepEqual(await c.resume(delivered[0]!, { ok: true }), { runId: run.id });
    const done = await c.waitForRun(run.id, { timeoutMs: 10_000 });
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { before: 'b', answer: { ok: true } });
    t.is(done.attempts, 1);
    t.is(entered, 2);
    t.is(delivered.length, 1, 'deliver was not called again');
    await rejects(t, () => c.resume(delivered[0]!, { ok: false }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'the used token');
  } finally {
    await wc.stop();
  }
});

// ── 11. resumed runs: priority and timeout ──────────────────────────────

forBackends('resumed runs are claimed by priority: resumed at one instant, the higher priority goes first (not the older run)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('prio-sleep', {}, async (ctx: JobContext<unknown>) => ctx.sleep('z', 1_000));
  o.registerHandler('prio-signal', {}, async (ctx: JobContext<unknown>) => ctx.waitForSignal('go'));
  // The low-priority runs are older: creation order alone would put them first.
  const lowS = await o.start('prio-sleep', {}, { priority: 1 });
  const highS = await o.start('prio-sleep', {}, { priority: 9 });
  const lowG = await o.start('prio-signal', {}, { priority: -3 });
  const highG = await o.start('prio-signal', {}, { priority: 4 });
  for (const id of await claimAll(o)) await o.tick(id);
  for (const r of [lowS, highS, lowG, highG]) t.is((await get(o, r.id)).status, 'waiting');

  o.advanceTime(1_000); // both sleeps fall due at this instant
  const lowSRow = await get(o, lowS.id);
  const highSRow = await get(o, highS.id);
  t.is(lowSRow.runAt.getTime(), highSRow.runAt.getTime(), 'resumed due at the same instant');
  t.is(highSRow.priority, 9, 'its priority kept');
  t.deepEqual(await claimAll(o), [highS.id, lowS.id]);

  // Signals at one instant, the low-priority run's first.
  await o.signal(lowG.id, 'go');
  await o.signal(highG.id, 'go');
  t.deepEqual(await claimAll(o), [highG.id, lowG.id]);
});

forBackends("a resumed run whose handler then hangs still times out per its timeoutMs (each execution gets the full timeout)", async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  const secondEntered = deferred();
  let signal: AbortSignal | undefined;
  o.registerHandler('hang-after-nap', { timeoutMs: 500 }, async (ctx: JobContext<unknown>) => {
    entered++;
    await ctx.sleep('z', 10_000);
    signal = ctx.signal;
    secondEntered.resolve();
    return new Promise(() => undefined);
  });
  const r = await o.start('hang-after-nap', {});
  t.is((await tickRun(o, r.id)).status, 'waiting');
  o.advanceTime(10_000);
  t.is((await o.claimNext('batch'))?.id, r.id);
  const tick = o.tick(r.id);
  await secondEntered.promise;
  o.advanceTime(499);
  await realSleep(30);
  t.is((await get(o, r.id)).status, 'running', 'not before its timeoutMs from this execution\'s start');
  o.advanceTime(1);
  await tick;
  const row = await get(o, r.id);
  t.is(row.status, 'timed_out');
  t.is(row.attempts, 1);
  t.is(row.waitKind, null);
  t.is(entered, 2);
  t.regex(row.error?.message ?? '', /time/i);
  await waitFor(() => signal?.aborted === true, "the hung execution's ctx.signal");
});
