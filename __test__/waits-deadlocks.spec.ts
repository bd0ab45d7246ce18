/**
 * Durable waits: calls that would leave runs waiting forever are refused
 * (an audit of 2026-12-07 found each of these on both stores).
 *
 * - `ctx.invoke` whose dedupe key names a run that waits for the caller
 *   (A invokes B, B invokes A's key: each would wait for the other);
 * - `ctx.invoke` whose dedupe key names a run queued in a lane the caller
 *   holds (the lane check of a new child, skipped for a dedupe hit);
 * - `recordStep` over a wait's row (an open wait would never resolve, a
 *   token's hash would be lost);
 * - step ids and signal names cut inside a character (two of them named
 *   one step, or one wait).
 */
import { JobInputInvalidError, JobStepConflictError } from '../dist';
import type { JobContext, JobOrchestrator } from '../dist';
import { forBackends } from './backends';
import { get, rejects, stepsById } from './helpers';

/** Claims and executes every claimable run of `pool`, over and over, until none is left (at most `max`). */
async function drain(o: JobOrchestrator, pool = 'batch', max = 50): Promise<number> {
  let n = 0;
  for (let r; n < max && (r = await o.claimNext(pool)); n++) await o.tick(r.id);
  return n;
}

/** What a handler caught: the error's name and message. */
function caught(e: unknown): { name: string; message: string } {
  return { name: (e as Error).name, message: String((e as Error).message) };
}

forBackends('an invoke whose dedupe key names a run that waits for the caller is refused; both runs end', async (t, make) => {
  const o = await make.manual();
  const next: Record<string, string> = { A: 'B', B: 'A' }; // a cycle in the user's data
  o.registerHandler('node', { dedupe: { key: 'node:{{id}}', windowMs: 3_600_000 } }, async (ctx: JobContext<{ id: string }>) => {
    try {
      return { id: ctx.input.id, sub: await ctx.invoke('sub', 'node', { id: next[ctx.input.id] }) };
    } catch (e) {
      return { id: ctx.input.id, refused: caught(e) };
    }
  });
  const a = await o.start('node', { id: 'A' });
  await drain(o);
  const done = await get(o, a.id);
  t.is(done.status, 'completed', 'A is not left waiting');
  const out = done.output as { sub: { id: string; refused: { name: string; message: string } } };
  t.is(out.sub.id, 'B', "A resumed with its child B's output");
  t.is(out.sub.refused.name, 'JobInputInvalidError');
  t.regex(out.sub.refused.message, new RegExp(`names run ${a.id}, which waits for the invoking run`));
  const tree = await o.getRunTree(a.id);
  t.is(tree?.children.length, 1, 'B is the only run started');
  const b = tree!.children[0]!.run;
  t.is((await get(o, b.id)).status, 'completed');
  t.deepEqual(Object.keys(await stepsById(o, b.id)), [], "B's refused invoke stored no wait");
});

forBackends('an invoke whose dedupe key names a run queued in a lane the caller holds is refused; both runs end', async (t, make) => {
  const o = await make.manual();
  o.registerHandler(
    'sync',
    { concurrency: { key: 'acct:{{acct}}', collisionMode: 'queue' }, dedupe: { key: 'sync:{{acct}}:{{part}}', windowMs: 3_600_000 } },
    async (ctx: JobContext<{ acct: number; part: string }>) => {
      if (ctx.input.part !== 'all') return { part: ctx.input.part };
      try {
        return { all: await ctx.invoke('part-b', 'sync', { acct: ctx.input.acct, part: 'b' }) };
      } catch (e) {
        return { refused: caught(e) };
      }
    },
  );
  const p = await o.start('sync', { acct: 1, part: 'all' });
  // Part b was started already: it is queued in the lane behind P.
  const b = await o.start('sync', { acct: 1, part: 'b' });
  await drain(o);
  const pDone = await get(o, p.id);
  t.is(pDone.status, 'completed', 'P is not left waiting');
  const refused = (pDone.output as { refused: { name: string; message: string } }).refused;
  t.is(refused.name, 'JobInputInvalidError');
  t.regex(refused.message, /the run its dedupe key names is queued in 'acct:1', a lane its waiting caller/);
  t.deepEqual(Object.keys(await stepsById(o, p.id)), [], 'no wait was stored');
  t.is((await get(o, b.id)).status, 'completed', 'part b ran once P let go of the lane');
});

forBackends("recordStep over a wait's row is JobStepConflictError and changes nothing; the wait still resolves", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('w', {}, async (ctx: JobContext<unknown>) => ({ got: await ctx.waitForSignal('approval') }));
  let token = '';
  o.registerHandler('tk', {}, async (ctx: JobContext<unknown>) => ({
    got: await ctx.waitForToken('tk', (k) => {
      token = k;
    }),
  }));
  const run = await o.start('w', {});
  const tokenRun = await o.start('tk', {});
  await drain(o);
  t.is((await get(o, run.id)).status, 'waiting');
  const before = await stepsById(o, run.id);
  const tokenBefore = await stepsById(o, tokenRun.id);
  await rejects(
    t,
    () => o.recordStep({ jobRunId: run.id, stepId: 'approval', status: 'completed', output: { ok: true } }),
    JobStepConflictError,
    'JOB_STEP_CONFLICT',
    'completing an open signal wait',
  );
  await rejects(
    t,
    () => o.recordStep({ jobRunId: tokenRun.id, stepId: 'tk', status: 'running', input: { note: 'x' } }),
    JobStepConflictError,
    'JOB_STEP_CONFLICT',
    "rewriting a token wait's input",
  );
  t.deepEqual(await stepsById(o, run.id), before, 'the wait row is as it was');
  t.deepEqual(await stepsById(o, tokenRun.id), tokenBefore, 'the token wait row is as it was');
  t.deepEqual(await o.signal(run.id, 'approval', 'yes'), { delivered: true });
  t.deepEqual(await o.resume(token, 'ok'), { runId: tokenRun.id });
  await drain(o);
  t.deepEqual((await get(o, run.id)).output, { got: 'yes' });
  t.deepEqual((await get(o, tokenRun.id)).output, { got: 'ok' });
  // A resolved wait is not rewritten either (a replay keeping it would answer another value).
  await rejects(
    t,
    () => o.recordStep({ jobRunId: run.id, stepId: 'approval', status: 'completed', output: { v: 'other' } }),
    JobStepConflictError,
    'JOB_STEP_CONFLICT',
    'rewriting a resolved wait',
  );
  t.is((await stepsById(o, run.id)).approval?.output as unknown, 'yes');
});

forBackends('step ids and signal names cut inside a character are JobInputInvalidError (two of them would name one step or one wait)', async (t, make) => {
  const o = await make.manual();
  const seen: Record<string, { name: string; message: string }> = {};
  o.registerHandler('ids', {}, async (ctx: JobContext<unknown>) => {
    const calls: [string, () => Promise<unknown>][] = [
      ['step', () => ctx.step('st\udc00', async () => 1)],
      ['sleep', () => ctx.sleep('z\ud800', 10)],
      ['signal name', () => ctx.waitForSignal('w', { signal: 'x\ud800' })],
      ['default signal name', () => ctx.waitForSignal('x\udbff')],
    ];
    for (const [what, call] of calls) {
      try {
        await call();
      } catch (e) {
        seen[what] = caught(e);
      }
    }
    return 'done';
  });
  const run = await o.start('ids', {});
  await drain(o);
  t.is((await get(o, run.id)).status, 'completed');
  for (const what of ['step', 'sleep', 'signal name', 'default signal name']) {
    t.is(seen[what]?.name, 'JobInputInvalidError', what);
    t.regex(seen[what]!.message, /must not hold a lone surrogate/, what);
  }
  t.deepEqual(Object.keys(await stepsById(o, run.id)), [], 'nothing stored');
  await rejects(t, () => o.signal(run.id, 'x\ud800'), JobInputInvalidError, 'JOB_INPUT_INVALID', 'signal()');
  await rejects(
    t,
    () => o.recordStep({ jobRunId: run.id, stepId: 'r\udc01', status: 'completed' }),
    JobInputInvalidError,
    'JOB_INPUT_INVALID',
    'recordStep()',
  );
  t.deepEqual(Object.keys(await stepsById(o, run.id)), [], 'still nothing stored');
});

// What is not a deadlock is not refused (a review of the refusals above).

forBackends('an invoke whose dedupe hit ended is answered at once, though the hit still has a wait step open (it ended racing it)', async (t, make) => {
  const o = await make.manual();
  let seen: unknown = null;
  o.registerHandler('p', { dedupe: { key: 'p:{{id}}', windowMs: 3_600_000 } }, async (ctx: JobContext<{ id: number }>) => {
    // The sleep wins the race: P completes with its invoke's wait still open.
    const r = await Promise.race([ctx.invoke('c', 'c', { k: 1 }), ctx.sleep('s', 10).then(() => 'slept')]);
    return { r };
  });
  o.registerHandler('c', { dedupe: { key: 'c:{{k}}', windowMs: 3_600_000 } }, async (ctx: JobContext<{ k: number }>) => {
    await ctx.waitForSignal('go');
    try {
      return { back: await ctx.invoke('back', 'p', { id: 1 }) };
    } catch (e) {
      seen = caught(e);
      return 'refused';
    }
  });
  const c0 = await o.start('c', { k: 1 });
  const p = await o.start('p', { id: 1 });
  await drain(o);
  o.advanceTime(1_000);
  await drain(o);
  t.is((await get(o, p.id)).status, 'completed');
  t.is((await stepsById(o, p.id)).c?.status, 'running', 'its invoke wait was left open');
  await o.signal(c0.id, 'go');
  await drain(o);
  t.is(seen, null, 'not refused');
  t.deepEqual((await get(o, c0.id)).output, { back: { r: 'slept' } }, "answered with the ended run's output");
});

forBackends("an invoke whose dedupe hit holds the lane (its head) and does not wait for the caller waits for it; a self hit says so", async (t, make) => {
  const o = await make.manual();
  let seen: unknown = null;
  o.registerHandler(
    'sync',
    { concurrency: { key: 'acct:{{acct}}', collisionMode: 'queue' }, dedupe: { key: 'sync:{{acct}}', windowMs: 3_600_000 } },
    async (ctx: JobContext<{ acct: number; self?: boolean }>) => {
      if (ctx.input.self === true) {
        try {
          return await ctx.invoke('me', 'sync', { acct: ctx.input.acct });
        } catch (e) {
          return { refused: caught(e) };
        }
      }
      await ctx.spawnChild('report', { acct: ctx.input.acct }); // fire and forget
      await ctx.waitForSignal('done'); // live, holding the lane, not waiting for the child
      return 'P done';
    },
  );
  o.registerHandler('report', {}, async (ctx: JobContext<{ acct: number }>) => {
    try {
      return { synced: await ctx.invoke('sync', 'sync', { acct: ctx.input.acct }) };
    } catch (e) {
      seen = caught(e);
      return 'refused';
    }
  });
  const p = await o.start('sync', { acct: 1 });
  await drain(o);
  t.is(seen, null, 'the child waits for the lane head, not refused');
  await o.signal(p.id, 'done');
  await drain(o);
  const [report] = (await o.getRunTree(p.id))!.children;
  t.deepEqual((await get(o, report!.run.id)).output, { synced: 'P done' });
  // A run invoking its own dedupe key holds its lane too: the self-hit message, not the lane's.
  const self = await o.start('sync', { acct: 2, self: true });
  await drain(o);
  const out = (await get(o, self.id)).output as { refused: { name: string; message: string } };
  t.is(out.refused.name, 'JobInputInvalidError');
  t.regex(out.refused.message, /names the invoking run itself/);
});
