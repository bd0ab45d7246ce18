/**
 * Durable waits (issue 22): `ctx.sleep`, `sleepUntil`, `waitForSignal`,
 * `waitForToken`, `invoke`; `signal` and `resume`; parking, resumption,
 * deadlines, cancel, lanes, replay, and the typed errors of bad input. On
 * both stores; deterministic tests use the manual clock with `claimNext` +
 * `tick`, the worker tests the system clock.
 */
import test from 'ava';
import {
  JobChildFailedError,
  JobInputInvalidError,
  JobResumeTokenError,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepConflictError,
  JobWaitTimeoutError,
  MissingTenantIdError,
} from '../dist';
import { JobOrchestrator } from '../dist';
import type { JobContext, JobRun } from '../dist';
import { silentLogger } from './helpers';
import { forBackends, pair, PG_URL, postgresOnly } from './backends';
import { get, rejects, stepsById, waitFor } from './helpers';

/** Claims the run `id` (it must be the next of `pool`) and executes it once. */
async function tickRun(o: JobOrchestrator, id: string, pool = 'batch', tenantId?: string): Promise<JobRun> {
  const c = await o.claimNext(pool);
  if (c?.id !== id) throw new Error(`expected to claim ${id}, got ${c?.id ?? 'nothing'}`);
  await o.tick(id);
  return get(o, id, tenantId);
}

forBackends('sleep: the run parks waiting (no attempt used), resumes at its deadline and completes; the step is a wait', async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  o.registerHandler('nap', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    const before = await ctx.step('before', () => 'b');
    await ctx.sleep('nap', 5_000);
    return { before, after: true };
  });
  const run = await o.start('nap', {});
  const t0 = o.now().getTime();
  const parked = await tickRun(o, run.id);
  t.is(parked.status, 'waiting');
  t.is(parked.waitKind, 'sleep');
  t.is(parked.waitDeadline?.getTime(), t0 + 5_000);
  t.is(parked.attempts, 0, 'parking is not the end of an attempt');
  t.is(parked.claimedAt, null, 'a waiting run holds no claim');
  t.is(await o.claimNext('batch'), null, 'nothing to claim while it sleeps');
  o.advanceTime(4_999);
  t.is((await get(o, run.id)).status, 'waiting');
  o.advanceTime(1);
  const resumed = await get(o, run.id);
  t.is(resumed.status, 'pending', 'the deadline makes it pending, due now');
  t.is(resumed.waitKind, null);
  t.is(resumed.waitDeadline, null);
  const done = await tickRun(o, run.id);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { before: 'b', after: true });
  t.is(done.attempts, 1);
  t.is(entered, 2, 'ran again from the top once');
  const steps = await stepsById(o, run.id);
  t.is(steps.before?.kind, 'task');
  t.is(steps.nap?.kind, 'wait');
  t.is(steps.nap?.status, 'completed');
});

forBackends('a resumed execution answers its completed steps and waits as stored; on memory from its ticket, without asking the engine', async (t, make) => {
  const o = await make.manual();
  const ODD = 'a:b,c\n"d"\\e\u00e9\u{1F600}';
  const seen: unknown[][] = [];
  o.registerHandler('memo', {}, async (ctx: JobContext<unknown>) => {
    const s = await ctx.step(`s ${ODD}`, () => ({ v: ODD, n: [1, 2] }));
    const none = await ctx.step('none', () => undefined);
    const sig = await ctx.waitForSignal<unknown>(`w ${ODD}`, { signal: 'go' });
    await ctx.sleep('nap', 1_000);
    // The same completed wait asked twice: equal answers, never one shared value.
    const again = await ctx.waitForSignal<unknown>(`w ${ODD}`, { signal: 'go' });
    seen.push([s, none, sig, again, sig === again && sig !== null]);
    return { ok: true };
  });
  const run = await o.start('memo', {});
  t.is((await tickRun(o, run.id)).status, 'waiting');
  t.deepEqual(await o.signal(run.id, 'go', { p: ODD }), { delivered: true });
  t.is((await tickRun(o, run.id)).status, 'waiting', 'parked again on the sleep');
  o.advanceTime(1_000);
  // Count what the last execution asks the engine for.
  const store = (o as unknown as { store: Record<string, (...a: unknown[]) => unknown> }).store;
  const asked: string[] = [];
  for (const m of ['stepBegin', 'waitBegin']) {
    const real = store[m]!.bind(store);
    store[m] = (...a: unknown[]) => {
      asked.push(`${m} ${String(a[2])}`);
      return real(...a);
    };
  }
  const done = await tickRun(o, run.id);
  t.is(done.status, 'completed');
  t.deepEqual(seen.at(-1), [{ v: ODD, n: [1, 2] }, null, { p: ODD }, { p: ODD }, false]);
  if (o.backend === 'memory') {
    // Only the second ask of the signal wait (a memo entry answers once).
    t.deepEqual(asked, [`waitBegin w ${ODD}`]);
  } else {
    // PostgreSQL's claim reads no steps: each memoized call asks.
    t.is(asked.length, 5);
  }
});

forBackends('sleep: zero, and sleepUntil a past instant, do not park; bad durations are JobInputInvalidError with nothing stored', async (t, make) => {
  const o = await make.manual();
  const errors: string[] = [];
  o.registerHandler('quick', {}, async (ctx: JobContext<unknown>) => {
    await ctx.sleep('zero', 0);
    await ctx.sleepUntil('past', new Date(o.now().getTime() - 1));
    for (const bad of [-1, Number.NaN, 1.5, Infinity, 1e300, '10' as unknown as number]) {
      try {
        await ctx.sleep(`bad-${String(bad)}`, bad);
      } catch (e) {
        errors.push((e as Error).name);
      }
    }
    try {
      await ctx.sleepUntil('bad-date', new Date('nope'));
    } catch (e) {
      errors.push((e as Error).name);
    }
    try {
      await ctx.sleep('', 1);
    } catch (e) {
      errors.push((e as Error).name);
    }
    return 'ok';
  });
  const run = await o.start('quick', {});
  const done = await tickRun(o, run.id);
  t.is(done.status, 'completed');
  t.deepEqual(errors, Array(8).fill('JobInputInvalidError'));
  t.deepEqual(Object.keys(await stepsById(o, run.id)).sort(), ['past', 'zero'], 'no step row for a refused wait');
});

forBackends('waitForSignal: a signal sent before the wait is kept (delivered false) and taken at once; FIFO per name; one sent to a waiting run resumes it', async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  o.registerHandler('approve', {}, async (ctx: JobContext<unknown>) => {
    entered++;
    const first = await ctx.waitForSignal<{ n: number }>('first', { signal: 'vote' });
    const second = await ctx.waitForSignal<{ n: number }>('second', { signal: 'vote' });
    const go = await ctx.waitForSignal('go');
    return { first, second, go };
  });
  const run = await o.start('approve', {});
  t.deepEqual(await o.signal(run.id, 'vote', { n: 1 }), { delivered: false }, 'a pending run: into the inbox');
  t.deepEqual(await o.signal(run.id, 'vote', { n: 2 }), { delivered: false });
  const parked = await tickRun(o, run.id);
  t.is(parked.status, 'waiting', 'both votes were taken, it waits for go');
  t.is(parked.waitKind, 'signal');
  t.is(parked.waitDeadline, null, 'no timeout, no deadline');
  t.is(entered, 1, 'the inbox answered without parking');
  t.deepEqual(await o.signal(run.id, 'go'), { delivered: true });
  t.is((await get(o, run.id)).status, 'pending');
  const done = await tickRun(o, run.id);
  t.deepEqual(done.output, { first: { n: 1 }, second: { n: 2 }, go: null }, 'FIFO per name; no payload is null');
  await rejects(t, () => o.signal(run.id, 'go'), JobRunStateError, 'JOB_RUN_STATE', 'a run that ended takes no signal');
});

forBackends('signal: unknown run, bad names and non-JSON payloads are typed errors; the inbox is bounded', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('inbox', {}, async (ctx: JobContext<unknown>) => ctx.waitForSignal('never'));
  const run = await o.start('inbox', {});
  await rejects(t, () => o.signal('00000000-0000-4000-8000-000000000000', 'x'), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'unknown run');
  await rejects(t, () => o.signal('not-a-uuid', 'x'), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'malformed id');
  await rejects(t, () => o.signal(run.id, ''), JobInputInvalidError, 'JOB_INPUT_INVALID', 'empty name');
  await rejects(t, () => o.signal(run.id, 'x', { f: () => 1 }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'a function payload');
  await rejects(t, () => o.signal(run.id, 'x', 10n), JobInputInvalidError, 'JOB_INPUT_INVALID', 'a bigint payload');
  await rejects(t, () => o.signal(run.id, 'x', undefined, { tenantId: 't', bogus: 1 } as never), JobInputInvalidError, 'JOB_INPUT_INVALID', 'unknown option');
  for (let i = 0; i < 1000; i++) await o.signal(run.id, 'flood', i);
  await rejects(t, () => o.signal(run.id, 'flood', 1000), JobInputInvalidError, 'JOB_INPUT_INVALID', 'the 1,001st signal');
  const parked = await tickRun(o, run.id);
  t.is(parked.status, 'waiting');
  t.is((await get(o, run.id)).status, 'waiting', 'refused signals changed nothing');
});

forBackends('a wait timeout resumes the run at its deadline and throws JobWaitTimeoutError (catchable; uncaught, a run failure under the retry policy)', async (t, make) => {
  const o = await make.manual();
  let caught: unknown;
  o.registerHandler('patient', {}, async (ctx: JobContext<unknown>) => {
    try {
      await ctx.waitForSignal('answer', { timeoutMs: 1_000 });
      return 'answered';
    } catch (e) {
      caught = e;
      return 'gave up';
    }
  });
  o.registerHandler('strict', { retry: { attempts: 2, backoff: 'fixed', baseMs: 10 } }, async (ctx: JobContext<unknown>) => {
    await ctx.waitForSignal('answer', { timeoutMs: 1_000 });
  });
  const a = await o.start('patient', {});
  const t0 = o.now().getTime();
  const parked = await tickRun(o, a.id, 'batch');
  t.is(parked.waitDeadline?.getTime(), t0 + 1_000);
  o.advanceTime(1_000);
  // A signal after the deadline is not delivered to the expired wait.
  t.deepEqual(await o.signal(a.id, 'answer', 1), { delivered: false });
  const done = await tickRun(o, a.id);
  t.is(done.output as unknown, 'gave up');
  t.true(caught instanceof JobWaitTimeoutError);
  const e = caught as JobWaitTimeoutError;
  t.is(e.runId, a.id);
  t.is(e.stepId, 'answer');
  t.is(e.timeoutMs, 1_000);

  const b = await o.start('strict', {});
  await tickRun(o, b.id);
  o.advanceTime(1_000);
  const failed = await tickRun(o, b.id);
  t.is(failed.status, 'pending', 'an uncaught timeout is an attempt failure: retried');
  t.is(failed.attempts, 1);
  t.is(failed.error?.message, `wait 'answer' of run ${b.id} timed out after 1000ms`);
  o.advanceTime(10);
  const again = await tickRun(o, b.id);
  t.is(again.status, 'waiting', 'the retry waits again (a timeout answers only its own attempt)');
});

forBackends('waitForToken: deliver gets a single-use token once; resume(token, payload) resumes; the token is stored nowhere', async (t, make) => {
  const o = await make.manual();
  const delivered: string[] = [];
  o.registerHandler('approval', {}, async (ctx: JobContext<unknown>) => {
    const answer = await ctx.waitForToken<{ ok: boolean }>('approve', (token) => {
      delivered.push(token);
    });
    return { answer };
  });
  const run = await o.start('approval', {});
  const parked = await tickRun(o, run.id);
  t.is(parked.status, 'waiting');
  t.is(parked.waitKind, 'token');
  t.is(parked.resumeToken, null);
  t.is(delivered.length, 1);
  const token = delivered[0]!;
  t.regex(token, /^jft_[0-9a-f]{96}$/, 'the run id and 244 random bits');
  const stored = JSON.stringify([await get(o, run.id), await o.listSteps(run.id)]);
  t.false(stored.includes(token.slice(4 + 32)), 'the secret part of the token is in no row');
  await rejects(t, () => o.resume(token.slice(0, -1) + (token.endsWith('0') ? '1' : '0')), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'a tampered token');
  await rejects(t, () => o.resume('nope'), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'malformed');
  await rejects(t, () => o.resume(token, { f: () => 1 }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'non-JSON payload');
  t.is((await get(o, run.id)).status, 'waiting', 'refused resumes changed nothing');
  t.deepEqual(await o.resume(token, { ok: true }), { runId: run.id });
  await rejects(t, () => o.resume(token, { ok: false }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'a used token');
  const done = await tickRun(o, run.id);
  t.deepEqual(done.output, { answer: { ok: true } });
  t.is(delivered.length, 1, 'deliver is memoized: not called again on resumption');
});

forBackends('waitForToken: a deliver that throws fails the wait and is rethrown; an expired token is refused', async (t, make) => {
  const o = await make.manual();
  let tokens: string[] = [];
  o.registerHandler('mail.fails', {}, async (ctx: JobContext<unknown>) => {
    await ctx.waitForToken('t', () => {
      throw new Error('smtp down');
    });
  });
  o.registerHandler('expires', {}, async (ctx: JobContext<unknown>) => {
    try {
      await ctx.waitForToken('t', (tok) => void tokens.push(tok), { timeoutMs: 100 });
    } catch (e) {
      return (e as Error).name;
    }
  });
  const a = await o.start('mail.fails', {});
  const failed = await tickRun(o, a.id);
  t.is(failed.status, 'failed');
  t.is(failed.error?.message, 'smtp down');
  t.is((await stepsById(o, a.id)).t?.status, 'failed');
  const b = await o.start('expires', {});
  await tickRun(o, b.id);
  o.advanceTime(100);
  await rejects(t, () => o.resume(tokens[0]!, 1), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'expired');
  const done = await tickRun(o, b.id);
  t.is(done.output as unknown, 'JobWaitTimeoutError');
  tokens = [];
});

forBackends('invoke: resolves with the child output; a failed child throws JobChildFailedError { childRunId, status, error }', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('double', {}, async (ctx: JobContext<{ x: number }>) => ({ y: ctx.input.x * 2 }));
  o.registerHandler('broken', {}, async () => {
    throw new Error('child broke');
  });
  let caught: unknown;
  o.registerHandler('parent', {}, async (ctx: JobContext<unknown>) => {
    const a = await ctx.invoke<{ y: number }>('a', 'double', { x: 21 });
    try {
      await ctx.invoke('b', 'broken', {});
    } catch (e) {
      caught = e;
    }
    return a;
  });
  const p = await o.start('parent', {});
  const parked = await tickRun(o, p.id);
  t.is(parked.status, 'waiting');
  t.is(parked.waitKind, 'child');
  const tree = await o.getRunTree(p.id);
  const child = tree?.children[0]?.run;
  t.is(child?.jobType, 'double');
  t.is(child?.parentRunId, p.id);
  t.is(child?.triggerSource, 'parent');
  await tickRun(o, child!.id);
  t.is((await get(o, p.id)).status, 'pending', 'the child end resumed the parent');
  await tickRun(o, p.id);
  const b = (await o.getRunTree(p.id))?.children.find((c) => c.run.jobType === 'broken')?.run;
  await tickRun(o, b!.id);
  const done = await tickRun(o, p.id);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { y: 42 });
  t.true(caught instanceof JobChildFailedError);
  const e = caught as JobChildFailedError;
  t.is(e.childRunId, b!.id);
  t.is(e.status, 'failed');
  t.is(e.error?.message, 'child broke');
});

forBackends('invoke fan-out/fan-in: Promise.all of 5 invokes parks on all of them; the parent completes once every child did', async (t, make) => {
  const o = await make.system();
  o.registerHandler('sq', {}, async (ctx: JobContext<{ n: number }>) => ctx.input.n * ctx.input.n);
  o.registerHandler('fan', {}, async (ctx: JobContext<unknown>) => {
    const items = [1, 2, 3, 4, 5];
    const out = await Promise.all(items.map((n, i) => ctx.invoke<number>(`item-${i}`, 'sq', { n })));
    return { sum: out.reduce((a, b) => a + b, 0) };
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    const p = await o.start('fan', {});
    const done = await o.waitForRun(p.id, { timeoutMs: 10_000 });
    t.is(done.status, 'completed', JSON.stringify(done.error));
    t.deepEqual(done.output, { sum: 55 });
    const tree = await o.getRunTree(p.id);
    t.is(tree?.children.length, 5, 'each child started once');
    t.true(tree!.children.every((c) => c.run.status === 'completed'));
  } finally {
    await w.stop();
  }
});

forBackends('invoke deadline: the child is canceled first, then the call throws JobWaitTimeoutError', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('slow', { pool: 'kids' }, async () => 'late');
  o.registerHandler('boss', {}, async (ctx: JobContext<unknown>) => {
    try {
      return await ctx.invoke('kid', 'slow', {}, { timeoutMs: 500 });
    } catch (e) {
      return (e as Error).name;
    }
  });
  const p = await o.start('boss', {});
  await tickRun(o, p.id);
  o.advanceTime(500);
  const done = await tickRun(o, p.id);
  t.is(done.output as unknown, 'JobWaitTimeoutError');
  const kid = (await o.getRunTree(p.id))?.children[0]?.run;
  t.is(kid?.status, 'canceled');
});

forBackends('cancel ends a waiting run and its invoked children; a canceled child resumes the parent blocked on it', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('kid', { pool: 'kids' }, async () => 'x');
  let caught: unknown;
  o.registerHandler('dad', {}, async (ctx: JobContext<unknown>) => {
    try {
      await ctx.invoke('k', 'kid', {});
    } catch (e) {
      caught = e;
      return 'child gone';
    }
  });
  o.registerHandler('sleeper', {}, async (ctx: JobContext<unknown>) => {
    await ctx.invoke('k', 'kid', {});
  });
  const d = await o.start('dad', {});
  await tickRun(o, d.id);
  const kid = (await o.getRunTree(d.id))!.children[0]!.run;
  await o.cancel(kid.id);
  t.is((await get(o, d.id)).status, 'pending', 'the canceled child resumed its parent');
  const done = await tickRun(o, d.id);
  t.is(done.output as unknown, 'child gone');
  t.true(caught instanceof JobChildFailedError);
  t.is((caught as JobChildFailedError).status, 'canceled');

  const s = await o.start('sleeper', {});
  await tickRun(o, s.id);
  const kid2 = (await o.getRunTree(s.id))!.children[0]!.run;
  await o.cancel(s.id);
  const row = await get(o, s.id);
  t.is(row.status, 'canceled');
  t.is(row.waitKind, null);
  t.is((await get(o, kid2.id)).status, 'canceled', 'the cascade reached the invoked child');
  await rejects(t, () => o.signal(s.id, 'x'), JobRunStateError, 'JOB_RUN_STATE', 'a canceled run takes no signal');
});

forBackends('a waiting run keeps its concurrency lane and its dedupe key', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('laned', { concurrency: { key: '{{account}}' }, dedupe: { key: '{{account}}-{{n}}', windowMs: 60_000 } }, async (ctx: JobContext<unknown>) => {
    await ctx.waitForSignal('go');
  });
  const first = await o.start('laned', { account: 'a', n: 1 });
  const second = await o.start('laned', { account: 'a', n: 2 });
  await tickRun(o, first.id);
  t.is((await get(o, first.id)).status, 'waiting');
  t.is(await o.claimNext('batch'), null, 'the lane is held by the waiting run');
  const again = await o.start('laned', { account: 'a', n: 1 });
  t.is(again.id, first.id, 'its dedupe key still answers');
  await o.signal(first.id, 'go');
  await tickRun(o, first.id);
  t.is((await get(o, first.id)).status, 'completed');
  const next = await o.claimNext('batch');
  t.is(next?.id, second.id, 'the lane moves on once it ends');
});

forBackends('time spent waiting does not count toward the run timeoutMs; a resumption is not an attempt', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('timed', { timeoutMs: 100, retry: { attempts: 1, backoff: 'fixed', baseMs: 0 } }, async (ctx: JobContext<unknown>) => {
    await ctx.sleep('a', 1_000);
    await ctx.sleep('b', 1_000);
    return 'done';
  });
  const r = await o.start('timed', {});
  await tickRun(o, r.id);
  o.advanceTime(1_000);
  await tickRun(o, r.id);
  o.advanceTime(1_000);
  const done = await tickRun(o, r.id);
  t.is(done.status, 'completed');
  t.is(done.attempts, 1);
});

forBackends('a duplicate step id among concurrent waits is JobStepConflictError; a wait after the attempt ended is JobRunStateError', async (t, make) => {
  const o = await make.manual();
  let conflict: unknown;
  let late: Promise<unknown> | undefined;
  o.registerHandler('dup', {}, async (ctx: JobContext<unknown>) => {
    // On PostgreSQL the two calls go out on different connections and
    // either may be recorded first: the other one is the conflict.
    const calls = [ctx.waitForSignal('same'), ctx.waitForSignal('same')];
    conflict = await Promise.race(calls.map((p) => p.then(() => 'resolved', (e: unknown) => e)));
    await Promise.all(calls.map((p) => p.catch(() => undefined)));
  });
  o.registerHandler('leaky', {}, async (ctx: JobContext<unknown>) => {
    setTimeout(() => {
      late = ctx.sleep('after', 10).catch((e: unknown) => e);
    }, 1);
    return 'returned';
  });
  const a = await o.start('dup', {});
  await tickRun(o, a.id);
  t.true(conflict instanceof JobStepConflictError);
  t.is((await get(o, a.id)).status, 'waiting');
  const b = await o.start('leaky', {});
  await tickRun(o, b.id);
  await waitFor(() => late !== undefined, 'the late wait');
  t.true((await late) instanceof JobRunStateError);
});

forBackends('replay: last_step keeps a finished sleep (not slept again); scratch clears the inbox', async (t, make) => {
  const o = await make.manual();
  let entered = 0;
  o.registerHandler('again', { replayFrom: 'last_step' }, async (ctx: JobContext<unknown>) => {
    entered++;
    await ctx.sleep('nap', 1_000);
    return entered;
  });
  o.registerHandler('fresh', { replayFrom: 'scratch' }, async (ctx: JobContext<unknown>) => {
    return ctx.waitForSignal('s');
  });
  const r = await o.start('again', {});
  await tickRun(o, r.id);
  o.advanceTime(1_000);
  await tickRun(o, r.id);
  await o.replay(r.id);
  const replayed = await tickRun(o, r.id);
  t.is(replayed.status, 'completed', 'the kept sleep answered at once');
  t.is(replayed.output as unknown, 3);

  const f = await o.start('fresh', {});
  await o.signal(f.id, 's', 'one');
  await o.signal(f.id, 's', 'two');
  t.is((await tickRun(o, f.id)).output as unknown, 'one');
  await o.replay(f.id);
  const parked = await tickRun(o, f.id);
  t.is(parked.status, 'waiting', 'from scratch the inbox was emptied: "two" is gone');
});

forBackends('queries and counts show waiting runs', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('q', {}, async (ctx: JobContext<unknown>) => ctx.sleep('s', 10_000));
  const r = await o.start('q', {});
  await tickRun(o, r.id);
  const counts = await o.countByPoolAndStatus();
  t.deepEqual(counts.filter((c) => c.status === 'waiting'), [{ pool: 'batch', status: 'waiting', count: 1 }]);
  const page = await o.listJobRuns({ status: 'waiting' });
  t.deepEqual(page.items.map((i) => i.runId), [r.id]);
});

forBackends('tenant gate: signal needs the run tenant; resume refuses another tenant', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  let token = '';
  o.registerHandler('tw', {}, async (ctx: JobContext<unknown>) => {
    await ctx.waitForToken('t', (tok) => {
      token = tok;
    });
    await ctx.waitForSignal('s');
  });
  const r = await o.start('tw', {}, { tenantId: 'acme' });
  await tickRun(o, r.id, 'batch', 'acme');
  await rejects(t, () => o.resume(token, 1, { tenantId: 'other' }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'another tenant');
  t.is((await get(o, r.id, 'acme')).status, 'waiting');
  t.deepEqual(await o.resume(token, 1, { tenantId: 'acme' }), { runId: r.id });
  await tickRun(o, r.id, 'batch', 'acme');
  await rejects(t, () => o.signal(r.id, 's', 1, { tenantId: 'other' }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'another tenant');
  await rejects(t, () => o.signal(r.id, 's', 1), MissingTenantIdError, 'MISSING_TENANT_ID', 'no tenant');
  t.deepEqual(await o.signal(r.id, 's', 1, { tenantId: 'acme' }), { delivered: true });
});

forBackends('resume with { runId }: the token must be that run\'s; another run\'s, or a bad runId, changes nothing', async (t, make) => {
  const o = await make.manual();
  const tokens = new Map<string, string>();
  o.registerHandler('tw', {}, async (ctx: JobContext<unknown>) => ({
    got: await ctx.waitForToken('t', (tok) => void tokens.set(ctx.run.id, tok)),
  }));
  const a = await o.start('tw', {});
  const b = await o.start('tw', {});
  await tickRun(o, a.id, 'batch');
  await tickRun(o, b.id, 'batch');
  await rejects(t, () => o.resume(tokens.get(b.id)!, 1, { runId: a.id }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'another run\'s token');
  await rejects(t, () => o.resume(tokens.get(a.id)!, 1, { runId: 'not-a-run' }), JobResumeTokenError, 'JOB_RESUME_TOKEN', 'no run\'s id');
  await rejects(t, () => o.resume(tokens.get(a.id)!, 1, { runId: 7 as unknown as string }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'runId not a string');
  await rejects(t, () => o.resume(tokens.get(a.id)!, 1, { run: a.id } as never), JobInputInvalidError, 'JOB_INPUT_INVALID', 'an unknown option');
  t.is((await get(o, a.id)).status, 'waiting');
  t.is((await get(o, b.id)).status, 'waiting', 'nothing refused changed a run');
  t.deepEqual(await o.resume(tokens.get(a.id)!, 1, { runId: a.id }), { runId: a.id });
  t.is((await get(o, a.id)).status, 'pending');
});

forBackends('the worker resumes sleeps on time and frees the slot while a run waits', async (t, make) => {
  const o = await make.system();
  const order: string[] = [];
  o.registerHandler('sleepy', {}, async (ctx: JobContext<unknown>) => {
    order.push('sleepy-start');
    // Long enough that a loaded machine's poll below still sees it waiting.
    await ctx.sleep('s', 1_000);
    order.push('sleepy-end');
  });
  o.registerHandler('quick', {}, async () => {
    order.push('quick');
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  try {
    const a = await o.start('sleepy', {});
    await waitFor(async () => (await get(o, a.id)).status === 'waiting', 'parked', 5_000);
    const b = await o.start('quick', {});
    await o.waitForRun(b.id, { timeoutMs: 5_000 });
    const done = await o.waitForRun(a.id, { timeoutMs: 5_000 });
    t.is(done.status, 'completed');
    t.deepEqual(order, ['sleepy-start', 'quick', 'sleepy-start', 'sleepy-end']);
    t.true(done.finishedAt!.getTime() - done.createdAt.getTime() >= 1_000);
  } finally {
    await w.stop();
  }
});

test('the wait ids a handler uses are checked: a ctx.step id that is a wait is JobStepConflictError', async (t) => {
  const { JobOrchestrator } = await import('../dist');
  const o = new JobOrchestrator({ clock: 'manual' });
  let err: unknown;
  o.registerHandler('mix', {}, async (ctx: JobContext<unknown>) => {
    await ctx.sleep('x', 0);
    try {
      await ctx.step('x', () => 1);
    } catch (e) {
      err = e;
    }
  });
  const r = await o.start('mix', {});
  await tickRun(o, r.id);
  t.true(err instanceof JobStepConflictError);
});

test('parked runs keep nothing of their handlers alive: 2,000 continuations holding 16 KB each are all collected', (t) => {
  const { spawnSync } = require('node:child_process') as typeof import('node:child_process');
  const path = require('node:path') as typeof import('node:path');
  const r = spawnSync(process.execPath, ['--expose-gc', path.join(__dirname, 'fixtures', 'park-gc.js'), '2000'], { encoding: 'utf8', timeout: 60_000 });
  t.is(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { waiting: number; alive: number; heapPerRunBytes: number };
  t.is(out.waiting, 2000, 'every run parked');
  t.is(out.alive, 0, 'no handler continuation survived a collection');
  t.true(out.heapPerRunBytes < 4096, `JS heap per parked run: ${out.heapPerRunBytes} B`);
});

postgresOnly('waits survive a restart of every process: a run parked by one orchestrator is resumed by a signal from a second and run by a third', async (t, make) => {
  const full = make.options({ loggerFactory: () => silentLogger, logger: silentLogger });
  const made: JobOrchestrator[] = [];
  t.teardown(async () => {
    for (const x of made) await x.close();
  });
  const orchestrator = (): JobOrchestrator => {
    const o = new JobOrchestrator(full);
    made.push(o);
    o.registerHandler('durable', {}, async (ctx: JobContext<unknown>) => {
      await ctx.sleep('nap', 200);
      const said = await ctx.waitForSignal<string>('say');
      return { said };
    });
    return o;
  };
  const a = orchestrator();
  await a.migrate();
  const wa = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  const run = await a.start('durable', {});
  await waitFor(async () => (await get(a, run.id)).waitKind === 'sleep', 'parked in its sleep', 5_000);
  await wa.stop();
  await a.close();
  // Nobody runs a worker while the sleep falls due; a second process signals.
  const b = orchestrator();
  t.deepEqual(await b.signal(run.id, 'say', 'hello'), { delivered: false }, 'into the inbox: the run is still in its sleep');
  await b.close();
  // A third process's worker resumes the due sleep and takes the signal.
  const c = orchestrator();
  const wc = c.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    const done = await c.waitForRun(run.id, { timeoutMs: 10_000 });
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { said: 'hello' });
    t.is(done.attempts, 1);
  } finally {
    await wc.stop();
  }
});

postgresOnly('short sleeps resume at their deadline, not at the poll: the timer hears of a park after its commit', async (t, make) => {
  // A poll far slower than the bound below: only the worker's own timer,
  // told of each park, can meet it. Told before the park committed, it
  // looked, did not see the parked row yet and slept until the poll.
  const o = await make.system({ postgres: { url: PG_URL, pollMs: 5_000 } });
  // When each sleep was first seen over, across the executions.
  const over: number[] = [];
  o.registerHandler('naps', {}, async (ctx: JobContext<unknown>) => {
    for (let k = 0; k < 8; k++) {
      await ctx.sleep(`nap-${k}`, 50);
      if (over.length === k) over.push(Date.now());
    }
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  try {
    const t0 = Date.now();
    const run = await o.start('naps', {});
    const done = await o.waitForRun(run.id, { timeoutMs: 60_000 });
    t.is(done.status, 'completed');
    t.is(over.length, 8);
    const gaps = over.map((at, k) => at - (k === 0 ? t0 : over[k - 1]!));
    t.true(gaps.every((g) => g < 2_000), `each 50 ms sleep resumed after: ${gaps.join(', ')} ms (the poll interval is 5 s)`);
  } finally {
    await w.stop();
  }
});

/**
 * Loses the first late outcome of `kind` the orchestrator would store (as
 * when the process of an execution that went on after parking dies before
 * storing it); answers how many were lost.
 */
function loseLateOutcome(o: JobOrchestrator, kind: 'parked' | 'completed'): () => number {
  const store = (o as unknown as { store: { finishAttempt(id: string, epoch: number, text: string): Promise<boolean> } }).store;
  const finish = store.finishAttempt.bind(store);
  let lost = 0;
  store.finishAttempt = (id, epoch, text) => {
    if (lost === 0 && text.includes(`"${kind}"`)) {
      lost++;
      return new Promise(() => undefined);
    }
    return finish(id, epoch, text);
  };
  return () => lost;
}

for (const kind of ['parked', 'completed'] as const) {
  forBackends(`an execution that went on after parking and whose ${kind} outcome is lost does not leave its run waiting: a wait it opened or resolved resumes the run`, async (t, make) => {
    const o = await make.system({ ...(make.backend === 'postgres' ? { postgres: { url: PG_URL, pollMs: 200 } } : {}) });
    o.registerHandler('late.race', {}, async (ctx: JobContext<unknown>) => {
      // The signal never comes and has no timeout: the first park leaves
      // the run without a deadline. The timer's branch goes on after it
      // parked and opens (first execution) or resolves (a later one, the
      // nap being over) a sleep.
      const winner = await Promise.race([
        ctx.waitForSignal('go').then(() => 'signal'),
        new Promise((r) => setTimeout(r, 150)).then(() => ctx.sleep('nap', 300)).then(() => 'nap'),
      ]);
      return { winner };
    });
    const lost = loseLateOutcome(o, kind);
    const w = o.startWorker({ pools: { batch: { concurrency: 2 } } });
    try {
      const run = await o.start('late.race', {});
      // It waited for good: its sleep ended, but only the lost outcome
      // would have told the run.
      const done = await o.waitForRun(run.id, { timeoutMs: 15_000 });
      t.is(lost(), 1);
      t.is(done.status, 'completed');
      t.deepEqual(done.output, { winner: 'nap' });
    } finally {
      await w.stop();
    }
  });
}

postgresOnly('a signal from another process wakes a waiting run at once (NOTIFY, not the poll)', async (t, make) => {
  // A poll far slower than the bound below: only a notification can meet it.
  const [a, b] = await pair(t, make, { logger: silentLogger, postgres: { url: PG_URL, pollMs: 5_000 } });
  a.registerHandler('ping', {}, async (ctx: JobContext<unknown>) => ctx.waitForSignal('go'));
  const w = a.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    const run = await a.start('ping', {});
    await waitFor(async () => (await get(a, run.id)).status === 'waiting', 'parked', 5_000);
    const t0 = Date.now();
    t.deepEqual(await b.signal(run.id, 'go', 1), { delivered: true });
    await a.waitForRun(run.id, { timeoutMs: 5_000 });
    t.true(Date.now() - t0 < 1_500, `resumed in ${Date.now() - t0} ms (the poll interval is 5 s)`);
  } finally {
    await w.stop();
  }
});

forBackends('a wait that resolves while its attempt still runs resumes the run at once when it parks on its other waits (Promise.race)', async (t, make) => {
  const o = await make.manual();
  let sent: Promise<unknown> | undefined;
  o.registerHandler('race', {}, async (ctx: JobContext<unknown>) => {
    const winner = Promise.race([
      ctx.waitForSignal<string>('approve').then((v) => `approve:${v}`),
      ctx.waitForSignal<string>('reject').then((v) => `reject:${v}`),
    ]);
    // The signal is sent while both waits open, before the attempt parks
    // (first execution only: a rerun awaiting it after its wait resolved
    // would be other async work, which parking does not see).
    if (!sent) {
      sent = o.signal(ctx.run.id, 'approve', 'yes');
      await sent;
    }
    return winner;
  });
  const r = await o.start('race', {});
  await tickRun(o, r.id);
  // On PostgreSQL the attempt may park while the signal is still in flight
  // (parking does not wait for work that is not a ctx call): the run is
  // then waiting until the signal commits. Read it once the signal answered.
  await sent;
  const after = await get(o, r.id);
  // Memory answers both waits before the signal (calls are synchronous):
  // the run must not park on the loser. On PostgreSQL the signal may also
  // come first and be taken from the inbox: the run then completes at once.
  if (make.backend === 'memory') t.is(after.status, 'pending', 'not parked on the loser');
  t.not(after.status, 'waiting', 'never left waiting on the loser');
  const done = after.status === 'completed' ? after : await tickRun(o, r.id);
  t.is(done.output as unknown, 'approve:yes');
});

forBackends('invoke refuses a child in a lane its waiting caller holds, and a dedupe hit on the caller itself; nothing is started', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('charge', { pool: 'kids', concurrency: { key: 'customer:{{customerId}}' } }, async () => 'charged');
  o.registerHandler('order', { concurrency: { key: 'customer:{{customerId}}' } }, async (ctx: JobContext<{ customerId: string }>) => {
    try {
      await ctx.invoke('charge', 'charge', { customerId: ctx.input.customerId });
    } catch (e) {
      return (e as Error).name;
    }
  });
  o.registerHandler('self', { dedupe: { key: '{{k}}', windowMs: 60_000 } }, async (ctx: JobContext<{ k: string }>) => {
    try {
      await ctx.invoke('me', 'self', { k: ctx.input.k });
    } catch (e) {
      return (e as Error).name;
    }
  });
  const r = await o.start('order', { customerId: 'c1' });
  t.is((await tickRun(o, r.id)).output as unknown, 'JobInputInvalidError');
  t.is((await o.getRunTree(r.id))?.children.length, 0, 'no child was started');
  const s = await o.start('self', { k: 'x' });
  t.is((await tickRun(o, s.id)).output as unknown, 'JobInputInvalidError');
});

forBackends("an invoke deadline cancels only the caller's own child, not a dedupe hit another run started", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('shared', { pool: 'kids', dedupe: { key: 'shared', windowMs: 600_000 } }, async () => 'done');
  o.registerHandler('waiter', {}, async (ctx: JobContext<unknown>) => {
    try {
      return await ctx.invoke('s', 'shared', {}, { timeoutMs: 100 });
    } catch (e) {
      return (e as Error).name;
    }
  });
  const shared = await o.start('shared', {});
  const w = await o.start('waiter', {});
  await tickRun(o, w.id);
  o.advanceTime(100);
  t.is((await tickRun(o, w.id)).output as unknown, 'JobWaitTimeoutError');
  t.is((await get(o, shared.id)).status, 'pending', 'the shared run lives on');
});

forBackends('a resume that lands while deliver throws stands: the retry answers with its payload', async (t, make) => {
  const o = await make.manual();
  let delivered = 0;
  o.registerHandler('flaky', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } }, async (ctx: JobContext<unknown>) => {
    return ctx.waitForToken('t', async (token) => {
      delivered++;
      await o.resume(token, 'ok');
      throw new Error('mailer crashed after sending');
    });
  });
  const r = await o.start('flaky', {});
  const failed = await tickRun(o, r.id);
  t.is(failed.status, 'pending', 'the attempt failed (deliver threw), retried');
  const done = await tickRun(o, r.id);
  t.is(done.output as unknown, 'ok');
  t.is(delivered, 1, 'the resumed wait was not delivered again');
});

forBackends('a run canceled while blocked only on waits frees its worker slot at once', async (t, make) => {
  const o = await make.system();
  o.registerHandler('self-cancel', {}, async (ctx: JobContext<unknown>) => {
    const w = ctx.waitForSignal('never');
    await o.cancel(ctx.run.id);
    await w;
  });
  o.registerHandler('next', {}, async () => 'ran');
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, abandonAfterMs: 60_000 });
  try {
    const a = await o.start('self-cancel', {});
    await waitFor(async () => (await get(o, a.id)).status === 'canceled', 'canceled', 5_000);
    const b = await o.start('next', {});
    const done = await o.waitForRun(b.id, { timeoutMs: 3_000 });
    t.is(done.output as unknown, 'ran', 'the slot was free long before abandonAfterMs');
  } finally {
    await w.stop();
  }
});

/** A promise the test settles from outside: the handler's "other async work" (an HTTP call, a timer). */
function external<T>(): { promise: Promise<T>; resolve: (v: T) => void; reject: (e: unknown) => void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

forBackends('a handler that parked while it also awaited other async work still settles the run: its late steps are recorded and its result completes the waiting run', async (t, make) => {
  const o = await make.manual();
  const work = external<string>();
  let calls = 0;
  o.registerHandler('race-work', {}, async (ctx: JobContext<unknown>) => {
    calls++;
    // Parking sees only the wait: the handler is also awaiting `work`.
    const first = await Promise.race([ctx.waitForSignal<string>('approve').then((v) => `signal:${v}`), work.promise.then((v) => `work:${v}`)]);
    const saved = await ctx.step('save', () => `saved ${first}`);
    return { first, saved };
  });
  const r = await o.start('race-work', {});
  const parked = await tickRun(o, r.id);
  t.is(parked.status, 'waiting');
  t.is(parked.waitKind, 'signal');
  work.resolve('x');
  await waitFor(async () => (await get(o, r.id)).status === 'completed', 'the late result completes the run');
  const done = await get(o, r.id);
  t.deepEqual(done.output, { first: 'work:x', saved: 'saved work:x' });
  t.is(done.attempts, 1);
  t.is(done.waitKind, null);
  t.is(done.waitDeadline, null);
  t.is(calls, 1, 'not run again: the execution that parked finished it');
  const steps = await stepsById(o, r.id);
  t.is(steps.save?.status, 'completed');
  t.is(steps.save?.output as unknown, 'saved work:x');
  t.is((await o.signal(r.id, 'approve', 'late').catch((e: Error) => e.name)) as unknown, 'JobRunStateError', 'an ended run takes no signal');
});

forBackends('a parked handler that goes on and waits again parks the run on its new wait (its deadline); a late failure is an ordinary run failure', async (t, make) => {
  const o = await make.manual();
  const work = external<string>();
  let calls = 0;
  o.registerHandler('race-rewait', {}, async (ctx: JobContext<unknown>) => {
    calls++;
    await Promise.race([ctx.sleep('long', 3_600_000), work.promise]);
    const go = await ctx.waitForSignal<string>('go', { timeoutMs: 1_000 });
    return { go };
  });
  const r = await o.start('race-rewait', {});
  t.is((await tickRun(o, r.id)).waitKind, 'sleep');
  const t0 = o.now().getTime();
  work.resolve('done');
  // The run waits on both open waits (the engine cannot see that the sleep
  // lost the race): the earliest deadline is the new wait's.
  await waitFor(async () => (await get(o, r.id)).waitDeadline?.getTime() === t0 + 1_000, 'parked again on the new wait');
  t.is((await get(o, r.id)).status, 'waiting');
  t.true((await o.signal(r.id, 'go', 'now')).delivered);
  t.is((await get(o, r.id)).status, 'pending');
  const done = await tickRun(o, r.id);
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { go: 'now' });
  t.is(calls, 2);

  const failing = external<string>();
  o.registerHandler('race-fail', { retry: { attempts: 1, backoff: 'fixed', baseMs: 0 } }, async (ctx: JobContext<unknown>) => {
    await Promise.race([ctx.sleep('long', 3_600_000), failing.promise]);
    return 'unreachable';
  });
  const f = await o.start('race-fail', {});
  t.is((await tickRun(o, f.id)).status, 'waiting');
  failing.reject(new Error('upstream broke'));
  await waitFor(async () => (await get(o, f.id)).status === 'failed', 'the late failure fails the run');
  const failed = await get(o, f.id);
  t.is(failed.error?.message, 'upstream broke');
  t.is(failed.attempts, 1);
  t.is(failed.waitKind, null);
});

forBackends('the late result of a parked execution is ignored once a wait resumed the run: the next execution decides', async (t, make) => {
  const o = await make.manual();
  const works = [external<string>(), external<string>()];
  let calls = 0;
  o.registerHandler('race-late', {}, async (ctx: JobContext<unknown>) => {
    const work = works[calls++]!;
    return Promise.race([ctx.waitForSignal<string>('approve').then((v) => `signal:${v}`), work.promise.then((v) => `work:${v}`)]);
  });
  const r = await o.start('race-late', {});
  t.is((await tickRun(o, r.id)).status, 'waiting');
  t.true((await o.signal(r.id, 'approve', 'yes')).delivered);
  // Resumed but not claimed yet: the parked execution's late result must
  // not end a run the next execution will run.
  works[0]!.resolve('x');
  await new Promise((res) => setTimeout(res, 30));
  t.is((await get(o, r.id)).status, 'pending');
  const done = await tickRun(o, r.id);
  t.is(done.output as unknown, 'signal:yes');
});

forBackends('with a worker: a handler racing a wait against a timer completes when the timer wins, and its slot is free meanwhile', async (t, make) => {
  const o = await make.system();
  o.registerHandler('race-timer', {}, async (ctx: JobContext<unknown>) => {
    const r = await Promise.race([
      ctx.waitForSignal<string>('cancel-order').then(() => 'signal'),
      new Promise<string>((res) => setTimeout(() => res('timer'), 150)),
    ]);
    return { r, saved: await ctx.step('after', () => 'saved') };
  });
  o.registerHandler('quick', {}, async () => 'quick');
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  try {
    const a = await o.start('race-timer', {});
    await waitFor(async () => (await get(o, a.id)).status === 'waiting', 'parked', 5_000);
    const b = await o.start('quick', {});
    t.is((await o.waitForRun(b.id, { timeoutMs: 5_000 })).status, 'completed', 'the parked run holds no slot');
    const done = await o.waitForRun(a.id, { timeoutMs: 5_000 });
    t.is(done.status, 'completed');
    t.deepEqual(done.output, { r: 'timer', saved: 'saved' });
  } finally {
    await w.stop();
  }
});

forBackends('a ctx call left behind by a handler that returned is refused with the run status: canceled after a cancel, not the value returned', async (t, make) => {
  const o = await make.system();
  let late: Promise<unknown> | undefined;
  const entered = external<void>();
  o.registerHandler('left-behind', {}, async (ctx: JobContext<unknown>) => {
    entered.resolve();
    await new Promise((r) => ctx.signal.addEventListener('abort', r));
    setTimeout(() => {
      late = ctx.step('late', () => 'ran').catch((e: unknown) => e);
    }, 20);
    return 'returned anyway';
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } } });
  try {
    const r = await o.start('left-behind', {});
    await entered.promise;
    await o.cancel(r.id);
    await waitFor(() => late !== undefined, 'the late step', 5_000);
    const e = await late;
    t.true(e instanceof JobRunStateError);
    t.is((e as JobRunStateError).status, 'canceled');
    t.is((await get(o, r.id)).status, 'canceled');
    t.deepEqual(await o.listSteps(r.id), []);
  } finally {
    await w.stop();
  }
});
