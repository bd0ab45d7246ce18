/**
 * Issue 21, point 2: retry options that were silently dropped or refused
 * (`maxDelayMs`, `jitter`, `backoff: 'linear'`) take effect end to end, for
 * runs and for steps, on both backends; unknown keys anywhere in the meta,
 * the start options, the step and spawnChild options are refused, naming
 * the key, with nothing stored. Delays are read from the run's `runAt` on
 * the manual clock, so they are exact (jitter: bounds). The exact jittered
 * values (a seeded source) are tested in crates/core/tests/engine.rs.
 */
import test from 'ava';
import { JobInputInvalidError, JobOrchestrator, JobTypeNotFoundError } from '../dist';
import type { JobRun, RetryPolicy } from '../dist';
import { forBackends } from './backends';
import { advanceUntil, realSleep, rejects } from './helpers';

const boom = async (): Promise<never> => {
  throw new Error('boom');
};

/** Claims and ticks `id` once; the delay its failure scheduled (runAt - now). */
async function failOnce(o: JobOrchestrator, id: string, pool = 'batch'): Promise<number> {
  const c = await o.claimNext(pool);
  if (c?.id !== id) throw new Error(`expected to claim ${id}, got ${c?.id}`);
  await o.tick(id);
  const row = (await o.findById(id)) as JobRun;
  if (row.status !== 'pending') throw new Error(`expected a retry, got ${row.status}`);
  return row.runAt.getTime() - o.now().getTime();
}

forBackends('issue 21: maxDelayMs caps an exponential delay, linear grows by baseMs, as runAt shows', async (t, make) => {
  const o = await make.manual();
  // One pool per type: a run waiting for its retry does not stand in the next one's way.
  o.registerHandler('r.capped', { pool: 'r.capped', retry: { attempts: 5, backoff: 'exponential', baseMs: 100_000, maxDelayMs: 150 } }, boom);
  o.registerHandler('r.linear', { pool: 'r.linear', retry: { attempts: 4, backoff: 'linear', baseMs: 100 } }, boom);
  o.registerHandler('r.linear.capped', { pool: 'r.linear.capped', retry: { attempts: 4, backoff: 'linear', baseMs: 100, maxDelayMs: 250 } }, boom);
  const def = await o.getDefinition('r.capped');
  t.deepEqual(def?.retryPolicy, { attempts: 5, backoff: 'exponential', baseMs: 100_000, maxDelayMs: 150 }, 'stored in the definition row');
  for (const [type, want] of [
    ['r.capped', [150, 150, 150, 150]],
    ['r.linear', [100, 200, 300]],
    ['r.linear.capped', [100, 200, 250]],
  ] as [string, number[]][]) {
    const run = await o.start(type, {});
    const got: number[] = [];
    for (let i = 0; i < want.length; i++) {
      const d = await failOnce(o, run.id, type);
      got.push(d);
      o.advanceTime(d);
    }
    t.deepEqual(got, want, type);
  }
});

forBackends('issue 21: jitter full draws in [0, d], equal in [d/2, d], never above maxDelayMs; none is exact', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('j.full', { retry: { attempts: 2, backoff: 'fixed', baseMs: 10_000, jitter: 'full' } }, boom);
  o.registerHandler('j.equal', { retry: { attempts: 2, backoff: 'exponential', baseMs: 1_000_000, maxDelayMs: 10_000, jitter: 'equal' } }, boom);
  o.registerHandler('j.none', { retry: { attempts: 2, backoff: 'fixed', baseMs: 10_000, jitter: 'none' } }, boom);
  const delays: Record<string, number[]> = { 'j.full': [], 'j.equal': [], 'j.none': [] };
  for (let i = 0; i < 25; i++) {
    for (const type of Object.keys(delays)) {
      const run = await o.start(type, {});
      delays[type]!.push(await failOnce(o, run.id));
    }
  }
  const full = delays['j.full']!;
  const equal = delays['j.equal']!;
  t.true(full.every((d) => d >= 0 && d <= 10_000), `full in [0, 10000]: ${full}`);
  t.true(equal.every((d) => d >= 5_000 && d <= 10_000), `equal in [5000, 10000]: ${equal}`);
  t.deepEqual(delays['j.none'], Array(25).fill(10_000));
  // Drawn, not constant (25 equal draws of 10 001 values: never by chance).
  t.true(new Set(full).size > 1 && new Set(equal).size > 1, 'the delays are spread');
});

forBackends('issue 21: a step retry follows linear backoff and maxDelayMs in engine time', async (t, make) => {
  const o = await make.manual();
  const calls: number[] = [];
  const policy: RetryPolicy = { attempts: 4, backoff: 'linear', baseMs: 1_000, maxDelayMs: 1_500 };
  o.registerHandler('s.linear', {}, async (ctx) =>
    ctx.step(
      'flaky',
      async () => {
        calls.push(o.now().getTime());
        if (calls.length < 4) throw new Error('flaky');
        return 'ok';
      },
      { retry: policy },
    ),
  );
  const run = await o.start('s.linear', {});
  await o.claimNext('batch');
  const tick = o.tick(run.id);
  await advanceUntil(o, () => calls.length >= 4, 10);
  await tick;
  const gaps = calls.slice(1).map((c, i) => c - calls[i]!);
  // 1000, then 2000 and 3000 capped to 1500. The clock moves in 10 ms steps
  // (each after 1 ms of real time) while the test looks, so a gap may end a
  // few steps late (a database round trip of 15 ms: 150 ms), never early;
  // uncapped would be 2000 and 3000.
  const want = [1_000, 1_500, 1_500];
  t.is(gaps.length, 3);
  t.true(gaps.every((g, i) => g >= want[i]! && g < want[i]! + 400), `gaps ${gaps} ≈ ${want}`);
  t.is((await o.findById(run.id))?.status, 'completed');
});

forBackends('issue 21: unknown keys in start, step and spawnChild options are refused naming the key; nothing created', async (t, make) => {
  const o = await make.manual();
  const errors: unknown[] = [];
  let ran = 0;
  o.registerHandler('u.plain', {}, async () => ({}));
  o.registerHandler('u.step', {}, async (ctx) => {
    try {
      await ctx.step('s', async () => ++ran, { retyr: { attempts: 2 } } as never);
    } catch (e) {
      errors.push(e);
    }
    try {
      await ctx.step('s2', async () => ++ran, { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, jitter: 'sometimes' } as never });
    } catch (e) {
      errors.push(e);
    }
    try {
      await ctx.spawnChild('u.plain', {}, { closePolicy: 'abandon', priorty: 3 } as never);
    } catch (e) {
      errors.push(e);
    }
    return {};
  });
  for (const [label, opts, key] of [
    ['misspelt priority', { priorty: 3 }, 'priorty'],
    ['misspelt tenant', { tenant: 'A' }, 'tenant'],
    ['a known one and an unknown one', { pool: 'batch', retry: { attempts: 2 } }, 'retry'],
  ] as [string, object, string][]) {
    const e = await rejects<JobInputInvalidError>(t, () => o.start('u.plain', {}, opts as never), JobInputInvalidError, 'JOB_INPUT_INVALID', label);
    t.true(e.reason.includes(`'${key}'`), `${label}: names the key: ${e.reason}`);
  }
  t.is(await o.claimNext('batch'), null, 'no run was created by a refused start');
  const run = await o.start('u.step', {});
  await o.claimNext('batch');
  await o.tick(run.id);
  t.is(ran, 0, 'no step function ran');
  t.is(errors.length, 3);
  for (const [i, key] of ['retyr', 'sometimes', 'priorty'].entries()) {
    t.true(errors[i] instanceof JobInputInvalidError, `error ${i}`);
    t.true((errors[i] as JobInputInvalidError).reason.includes(key), `error ${i} names ${key}: ${(errors[i] as Error).message}`);
  }
  t.deepEqual(await o.listSteps(run.id), [], 'no step row was written');
  t.is(await o.claimNext('batch'), null, 'no child was created');
});

test('issue 21: a misspelt meta key is refused at registration (it was silently dropped), the old definition kept', async (t) => {
  const o = new JobOrchestrator({ clock: 'manual' });
  o.registerHandler('m', { retry: { attempts: 2, backoff: 'fixed', baseMs: 5 } }, boom);
  const before = await o.getDefinition('m');
  for (const [meta, key] of [
    [{ retyr: { attempts: 3, backoff: 'fixed', baseMs: 0 } }, 'retyr'],
    [{ retry: { attempts: 3, backoff: 'fixed', baseMs: 0, maxDelayMS: 5 } }, 'maxDelayMS'],
    [{ timeout: 5 }, 'timeout'],
    [{ concurrency: { key: '{{a}}', mode: 'reject' } }, 'mode'],
    [{ dedupe: { key: '{{a}}', windowMs: 5, ttl: 1 } }, 'ttl'],
  ] as [object, string][]) {
    const e = await rejects<JobInputInvalidError>(t, () => o.registerHandler('m', meta as never, boom), JobInputInvalidError, 'JOB_INPUT_INVALID', key);
    t.true(e.reason.includes(`'${key}'`) && e.reason.includes("'m'"), e.reason);
    t.deepEqual(await o.getDefinition('m'), before, `${key}: the definition is unchanged`);
  }
  // The seed's codegen-only `triggers` is still accepted (and ignored).
  o.registerHandler('seedlike', { triggers: [{ event: 'x' }] } as never, boom);
  t.not(await o.getDefinition('seedlike'), null);
  await rejects(t, () => o.start('never-registered', {}), JobTypeNotFoundError, 'JOB_TYPE_NOT_FOUND', 'sanity');
  await realSleep(0);
});
