// `tick()`: the engine opens the attempt, the handler runs on the JS thread
// through the same execution path the workers use, and the engine applies
// the outcome. (These tests once drove a second, engine-driven path that
// no worker used; it is gone, and they hold for the one path.)
import test from 'ava';
import { JobOrchestrator, JobRunStateError } from '../dist';
import type { JobContext } from '../dist';
import { forBackends } from './backends';

const nativeOf = (o: JobOrchestrator) => o;

async function runViaBridge(o: JobOrchestrator, type: string) {
  const run = await o.start(type, {});
  const claimed = await o.claimNext('batch');
  if (!claimed || claimed.id !== run.id) throw new Error('expected to claim the run just started');
  await nativeOf(o).tick(run.id);
  return (await o.findById(run.id))!;
}

test('a handler that throws synchronously fails the attempt, the process lives', async (t) => {
  const o = new JobOrchestrator();
  o.registerHandler('sync-throw', {}, (() => {
    throw new TypeError('sync boom');
  }) as () => never);
  const row = await runViaBridge(o, 'sync-throw');
  t.is(row.status, 'failed');
  t.is(row.error?.message, 'sync boom');
  t.is(row.error?.attempt, 1);
});

test('rejections with non-Errors become their string form', async (t) => {
  const o = new JobOrchestrator();
  o.registerHandler('reject-string', {}, async () => Promise.reject('plain string'));
  o.registerHandler('reject-undefined', {}, async () => Promise.reject(undefined));
  o.registerHandler('reject-object', {}, async () => Promise.reject({ code: 'E_X' }));
  t.is((await runViaBridge(o, 'reject-string')).error?.message, 'plain string');
  t.is((await runViaBridge(o, 'reject-undefined')).error?.message, 'undefined');
  t.is((await runViaBridge(o, 'reject-object')).error?.message, '[object Object]');
});

test('non-JSON output (BigInt, function, cycle) fails the attempt', async (t) => {
  const o = new JobOrchestrator();
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  o.registerHandler('bigint', {}, async () => ({ n: 10n }));
  o.registerHandler('fn', {}, async () => ({ f: () => 1 }));
  o.registerHandler('cycle', {}, async () => cyclic);
  for (const type of ['bigint', 'fn', 'cycle']) {
    const row = await runViaBridge(o, type);
    t.is(row.status, 'failed', type);
    t.regex(row.error!.message, /handler output/, type);
  }
});

test('the engine times out a never-resolving handler on the manual clock and fires its signal', async (t) => {
  const o = new JobOrchestrator({ clock: 'manual' });
  let aborted: unknown;
  o.registerHandler('hang', { timeoutMs: 1_000 }, (ctx) => {
    ctx.signal.addEventListener('abort', () => (aborted = ctx.signal.reason));
    return new Promise(() => undefined);
  });
  const run = await o.start('hang', {});
  await o.claimNext('batch');
  const ticking = nativeOf(o).tick(run.id);
  await new Promise((r) => setTimeout(r, 20));
  o.advanceTime(999);
  await new Promise((r) => setTimeout(r, 20));
  t.is((await o.findById(run.id))!.status, 'running');
  o.advanceTime(1);
  await ticking;
  await new Promise((r) => setImmediate(r));
  const row = (await o.findById(run.id))!;
  t.is(row.status, 'timed_out');
  t.is(aborted, 'timed_out');
});

test('cancel ends a bridged tick at once and the late result is ignored', async (t) => {
  const o = new JobOrchestrator();
  let release!: (v: unknown) => void;
  o.registerHandler('slow', {}, () => new Promise((r) => (release = r)));
  const run = await o.start('slow', {});
  await o.claimNext('batch');
  const ticking = nativeOf(o).tick(run.id);
  await new Promise((r) => setTimeout(r, 20));
  await o.cancel(run.id);
  await ticking;
  release({ late: true });
  await new Promise((r) => setTimeout(r, 20));
  const row = (await o.findById(run.id))!;
  t.is(row.status, 'canceled');
  t.is(row.output, null);
});

test('a second tick of an executing run is a typed error', async (t) => {
  const o = new JobOrchestrator();
  let release!: (v: unknown) => void;
  o.registerHandler('slow', {}, () => new Promise((r) => (release = r)));
  const run = await o.start('slow', {});
  await o.claimNext('batch');
  const first = o.tick(run.id);
  await t.throwsAsync(nativeOf(o).tick(run.id).catch((e: Error) => {
    throw Object.assign(new Error(e.message), { isNative: true });
  }), { message: /already executing/ });
  await t.throwsAsync(o.tick(run.id), { instanceOf: JobRunStateError });
  release({ ok: 1 });
  await first;
  t.is((await o.findById(run.id))!.status, 'completed');
});

// ── an abort between the engine's ticket and the attempt's registration ──

/** A handler that settles only when its signal aborts (counting its calls). */
function abortOnly(): { handler: (ctx: JobContext<unknown>) => Promise<string>; calls: () => number } {
  let calls = 0;
  return {
    handler: (ctx) => {
      calls++;
      return new Promise((resolve) => ctx.signal.addEventListener('abort', () => resolve('aborted')));
    },
    calls: () => calls,
  };
}

/** `p`, or 'pending' if it has not settled within `ms` of real time. */
function within<T>(p: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([p, new Promise<'pending'>((r) => setTimeout(() => r('pending'), ms).unref())]);
}

forBackends('a cancel called right after tick (its ticket not back yet) ends the attempt: tick resolves, the handler is not called', async (t, make) => {
  const o = await make.system();
  const h = abortOnly();
  o.registerHandler('h', {}, h.handler);
  const run = await o.start('h', {});
  t.is((await o.claimNext('batch'))?.id, run.id);
  const tick = o.tick(run.id);
  await o.cancel(run.id);
  // On PostgreSQL the cancel may also commit before the ticket is handed
  // out (tick: JobRunStateError), or after the handler began (aborted).
  const settled = tick.then(
    () => 'resolved',
    (e: unknown) => (e instanceof JobRunStateError && make.backend === 'postgres' ? 'refused' : Promise.reject(e)),
  );
  t.not(await within(settled, 3_000), 'pending', 'tick is not left hanging');
  if (make.backend === 'memory') t.is(h.calls(), 0, 'the handler is not called');
  else t.true(h.calls() <= 1);
  t.is((await o.findById(run.id))?.status, 'canceled');
});

test('manual clock: advanceTime past the timeout right after tick times the run out, and tick resolves', async (t) => {
  const o = new JobOrchestrator({ clock: 'manual' });
  const h = abortOnly();
  o.registerHandler('h', { timeoutMs: 1_000 }, h.handler);
  const run = await o.start('h', {});
  t.is((await o.claimNext('batch'))?.id, run.id);
  const tick = o.tick(run.id);
  o.advanceTime(1_000);
  t.is(await within(tick.then(() => 'resolved'), 3_000), 'resolved', 'tick is not left hanging');
  t.is(h.calls(), 0);
  t.is((await o.findById(run.id))?.status, 'timed_out');
});
