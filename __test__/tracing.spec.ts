/**
 * OpenTelemetry tracing (issue 25): `start` records the active span's
 * context on the run (W3C `traceparent` tag), each attempt is a span whose
 * parent is that context, `ctx.step` calls are its child spans; on both
 * stores, through `tick` and the worker; a caller's own `traceparent`
 * wins; `tracing: false` records nothing; without the package (or with
 * tracing off) nothing of it is loaded.
 *
 * One tracer provider per file (ava runs each file in its own process);
 * tests run concurrently, so each looks only at the spans of its own
 * trace.
 */
import test from 'ava';
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { context, trace, SpanStatusCode, type Span } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { JobInputInvalidError, JobOrchestrator } from '../dist';
import type { JobContext } from '../dist';
import { forBackends } from './backends';
import { manual, rejects, waitFor } from './helpers';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
trace.setGlobalTracerProvider(provider);
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracer = trace.getTracer('tracing.spec');

/** Runs `f` inside a new active span; ends it after. */
async function inSpan<T>(name: string, f: (span: Span) => Promise<T>): Promise<T> {
  return tracer.startActiveSpan(name, async (span) => {
    try {
      return await f(span);
    } finally {
      span.end();
    }
  });
}

const spansOf = (traceId: string): ReadableSpan[] => exporter.getFinishedSpans().filter((s) => s.spanContext().traceId === traceId);
const parentOf = (s: ReadableSpan): string | undefined => s.parentSpanContext?.spanId;
const traceparentOf = (span: Span): string => {
  const sc = span.spanContext();
  return `00-${sc.traceId}-${sc.spanId}-0${sc.traceFlags}`;
};

async function tick(o: JobOrchestrator, id: string): Promise<void> {
  const c = await o.claimNext('batch');
  if (c?.id !== id) throw new Error(`expected to claim ${id}, got ${c?.id ?? 'nothing'}`);
  await o.tick(id);
}

forBackends('tracing: start records the active context; the attempt is its child, each step the attempt’s', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tr.steps', {}, async (ctx: JobContext<unknown>) => {
    const a = await ctx.step('fetch', () => 1);
    const b = await ctx.step('save', () => a + 1);
    return { b };
  });
  const { run, outer } = await inSpan('http POST /orders', async (span) => ({ run: await o.start('tr.steps', {}), outer: span }));
  t.is(run.tags.traceparent, traceparentOf(outer), 'the run carries the caller’s span context');
  t.is((await o.getRun(run.id))?.tags.traceparent, traceparentOf(outer), 'stored with the run');
  await tick(o, run.id);
  const spans = spansOf(outer.spanContext().traceId);
  const attempt = spans.find((s) => s.name === 'run tr.steps');
  t.truthy(attempt, 'an attempt span in the caller’s trace');
  t.is(parentOf(attempt!), outer.spanContext().spanId);
  t.like(attempt!.attributes, {
    'jobforge.run.id': run.id,
    'jobforge.job_type': 'tr.steps',
    'jobforge.pool': 'batch',
    'jobforge.attempt': 1,
    'jobforge.outcome': 'completed',
  });
  t.is(attempt!.kind, 4 /* CONSUMER */);
  t.not(attempt!.status.code, SpanStatusCode.ERROR);
  const steps = spans.filter((s) => s.name.startsWith('step '));
  t.deepEqual(steps.map((s) => s.name).sort(), ['step fetch', 'step save']);
  for (const s of steps) {
    t.is(parentOf(s), attempt!.spanContext().spanId, `${s.name} is a child of its attempt`);
    t.is(s.attributes['jobforge.step.attempt'], 1);
  }
});

forBackends('tracing: a failed attempt is an error span; its retry is a second attempt span under the same parent', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('tr.retry', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, () => {
    if (++calls === 1) throw new Error('first try broke');
    return { ok: true };
  });
  const { run, outer } = await inSpan('enqueue', async (span) => ({ run: await o.start('tr.retry', {}), outer: span }));
  await tick(o, run.id);
  o.advanceTime(1000);
  await tick(o, run.id);
  const attempts = spansOf(outer.spanContext().traceId)
    .filter((s) => s.name === 'run tr.retry')
    .sort((a, b) => Number(a.attributes['jobforge.attempt']) - Number(b.attributes['jobforge.attempt']));
  t.is(attempts.length, 2);
  t.deepEqual(
    attempts.map((s) => [s.attributes['jobforge.attempt'], s.attributes['jobforge.outcome'], parentOf(s)]),
    [
      [1, 'failed', outer.spanContext().spanId],
      [2, 'completed', outer.spanContext().spanId],
    ],
  );
  t.is(attempts[0]!.status.code, SpanStatusCode.ERROR);
  t.is(attempts[0]!.status.message, 'first try broke');
  t.true(attempts[0]!.events.some((e) => e.name === 'exception' && e.attributes?.['exception.message'] === 'first try broke'));
});

test('tracing: a step retried in place records each failed try on its span; a memoized step is marked', async (t) => {
  const o = manual();
  let tries = 0;
  let executions = 0;
  o.registerHandler('tr.memo', {}, async (ctx: JobContext<unknown>) => {
    executions++;
    await ctx.step('flaky', () => {
      if (++tries < 3) throw new Error(`try ${tries}`);
      return 'ok';
    }, { retry: { attempts: 3, backoff: 'fixed', baseMs: 1 } });
    await ctx.sleep('nap', 1000);
    return {};
  });
  const { run, outer } = await inSpan('enqueue', async (span) => ({ run: await o.start('tr.memo', {}), outer: span }));
  const c = await o.claimNext('batch');
  t.is(c?.id, run.id);
  const ticking = o.tick(run.id);
  for (let i = 0; i < 2; i++) {
    await new Promise((r) => setTimeout(r, 20));
    o.advanceTime(1);
  }
  await ticking;
  t.is((await o.getRun(run.id))?.status, 'waiting');
  o.advanceTime(1000);
  await waitFor(async () => (await o.getRun(run.id))?.status === 'pending', 'the sleep to end');
  await tick(o, run.id);
  t.is(executions, 2);
  const spans = spansOf(outer.spanContext().traceId);
  const attempts = spans.filter((s) => s.name === 'run tr.memo');
  t.deepEqual(attempts.map((s) => s.attributes['jobforge.outcome']).sort(), ['completed', 'parked']);
  const flaky = spans.filter((s) => s.name === 'step flaky');
  t.is(flaky.length, 2);
  const ran = flaky.find((s) => s.attributes['jobforge.step.memoized'] === undefined)!;
  const memo = flaky.find((s) => s.attributes['jobforge.step.memoized'] === true);
  t.truthy(memo, 'the second execution’s step call is a memoized span');
  t.is(ran.attributes['jobforge.step.attempt'], 3);
  t.deepEqual(
    ran.events.filter((e) => e.name === 'exception').map((e) => e.attributes?.['exception.message']),
    ['try 1', 'try 2'],
  );
  t.not(ran.status.code, SpanStatusCode.ERROR, 'the step succeeded in the end');
});

test('tracing: a caller’s own traceparent tag wins (a context carried in from a message)', async (t) => {
  const o = manual();
  o.registerHandler('tr.remote', {}, () => ({}));
  const carried = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  const run = await inSpan('local', () => o.start('tr.remote', {}, { tags: { traceparent: carried, team: 'a' } }));
  t.deepEqual(run.tags, { traceparent: carried, team: 'a' });
  await tick(o, run.id);
  const attempt = spansOf('0af7651916cd43dd8448eb211c80319c').find((s) => s.name === 'run tr.remote');
  t.is(attempt?.parentSpanContext?.spanId, 'b7ad6b7169203331');
  // Outside any span, with a traceparent that is not one: the attempt is a root of its own trace.
  const bad = await o.start('tr.remote', {}, { tags: { traceparent: 'not-a-traceparent' } });
  await tick(o, bad.id);
  const root = exporter.getFinishedSpans().find((s) => s.attributes['jobforge.run.id'] === bad.id);
  t.truthy(root);
  t.is(root!.parentSpanContext, undefined);
});

test('tracing: a child started in a handler is traced under its parent’s attempt (spawnChild and startMany)', async (t) => {
  const o = manual();
  o.registerHandler('tr.kid', {}, () => ({}));
  const kidIds: string[] = [];
  o.registerHandler('tr.parent', {}, async (ctx: JobContext<unknown>) => {
    kidIds.push((await ctx.spawnChild('tr.kid', {})).id);
    const [batched] = await ctx.step('fan-out', () => o.startMany([{ type: 'tr.kid', input: {} }]));
    kidIds.push(batched!.id);
    return {};
  });
  const { run, outer } = await inSpan('enqueue', async (span) => ({ run: await o.start('tr.parent', {}), outer: span }));
  await tick(o, run.id);
  const spans = spansOf(outer.spanContext().traceId);
  const attempt = spans.find((s) => s.name === 'run tr.parent')!;
  const fanOut = spans.find((s) => s.name === 'step fan-out')!;
  t.is(kidIds.length, 2);
  const kidRows = await Promise.all(kidIds.map((id) => o.getRun(id)));
  const parents = kidRows.map((r) => r!.tags.traceparent!.split('-')[2]).sort();
  t.deepEqual(parents, [attempt.spanContext().spanId, fanOut.spanContext().spanId].sort());
});

forBackends('tracing: the worker’s attempts are spans under the run’s context too', async (t, make) => {
  const o = await make.system();
  o.registerHandler('tr.worker', {}, async (ctx: JobContext<unknown>) => {
    await ctx.step('one', () => 1);
    return {};
  });
  const { runs, outer } = await inSpan('enqueue', async (span) => ({
    runs: await Promise.all([0, 1, 2].map(() => o.start('tr.worker', {}))),
    outer: span,
  }));
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  try {
    for (const r of runs) await o.waitForRun(r.id, { timeoutMs: 10_000 });
  } finally {
    await w.stop();
  }
  const spans = spansOf(outer.spanContext().traceId);
  const attempts = spans.filter((s) => s.name === 'run tr.worker');
  t.deepEqual(attempts.map((s) => s.attributes['jobforge.run.id']).sort(), runs.map((r) => r.id).sort());
  t.true(attempts.every((s) => parentOf(s) === outer.spanContext().spanId && s.attributes['jobforge.outcome'] === 'completed'));
  const steps = spans.filter((s) => s.name === 'step one');
  t.is(steps.length, 3);
  t.true(steps.every((s) => attempts.some((a) => a.spanContext().spanId === parentOf(s))));
});

test('tracing: a canceled attempt ends its span as canceled; a hostile thrown value does not break the attempt', async (t) => {
  const o = manual();
  o.registerHandler('tr.cancel', {}, (ctx: JobContext<unknown>) => new Promise((_, reject) => ctx.signal.addEventListener('abort', () => reject(new Error('aborted')))));
  const hostile = new Proxy(
    {},
    {
      get() {
        throw new Error('trap');
      },
      getPrototypeOf() {
        throw new Error('trap');
      },
    },
  );
  o.registerHandler('tr.hostile', {}, () => {
    throw hostile;
  });
  const { a, b, outer } = await inSpan('enqueue', async (span) => ({
    a: await o.start('tr.cancel', {}),
    b: await o.start('tr.hostile', {}),
    outer: span,
  }));
  const c = await o.claimNext('batch');
  t.is(c?.id, a.id);
  const ticking = o.tick(a.id);
  await new Promise((r) => setTimeout(r, 10));
  await o.cancel(a.id);
  await ticking;
  await tick(o, b.id);
  t.is((await o.getRun(b.id))?.status, 'failed');
  const spans = spansOf(outer.spanContext().traceId);
  t.is(spans.find((s) => s.name === 'run tr.cancel')?.attributes['jobforge.outcome'], 'canceled');
  const h = spans.find((s) => s.name === 'run tr.hostile');
  t.is(h?.attributes['jobforge.outcome'], 'failed');
  t.is(h?.status.code, SpanStatusCode.ERROR);
});

test('tracing: tracing: false records nothing and adds no tag; a bad value is a typed error', async (t) => {
  const o = manual({ tracing: false });
  o.registerHandler('tr.off', {}, async (ctx: JobContext<unknown>) => {
    await ctx.step('s', () => 1);
    return {};
  });
  const { run, outer } = await inSpan('enqueue', async (span) => ({ run: await o.start('tr.off', {}), outer: span }));
  t.deepEqual(run.tags, {});
  await tick(o, run.id);
  t.deepEqual(spansOf(outer.spanContext().traceId).map((s) => s.name), ['enqueue']);
  t.throws(() => new JobOrchestrator({ tracing: 'yes' as unknown as boolean }), { instanceOf: JobInputInvalidError, message: /tracing must be a boolean/ });
  // A start with bad tags is still refused by start's checks, span or not.
  await rejects(t, () => inSpan('bad', () => o.start('tr.off', {}, { tags: 'x' as unknown as Record<string, string> })), JobInputInvalidError, 'JOB_INPUT_INVALID', 'string tags, off');
  const on = manual();
  on.registerHandler('tr.off', {}, () => ({}));
  await rejects(t, () => inSpan('bad', () => on.start('tr.off', {}, { tags: [] as unknown as Record<string, string> })), JobInputInvalidError, 'JOB_INPUT_INVALID', 'array tags, on');
  await rejects(t, () => inSpan('bad', () => on.start('tr.off', {}, 'opts' as never)), JobInputInvalidError, 'JOB_INPUT_INVALID', 'string options, on');
  await rejects(t, () => inSpan('bad', () => on.startMany([{ type: 'tr.off', input: {}, opts: { tags: { n: 1 } as never } }])), JobInputInvalidError, 'JOB_INPUT_INVALID', 'a number tag in startMany, on');
  t.is((await on.countRuns()), 0, 'nothing stored');
});

test('tracing: without the package, or with tracing off, nothing of it is loaded and runs work', (t) => {
  const dist = path.join(__dirname, '..', 'dist');
  // A child process where `@opentelemetry/api` cannot be resolved (as on a machine without it).
  const script = `
    const Module = require('module');
    const resolve = Module._resolveFilename;
    if (process.argv[1] === 'hidden') {
      Module._resolveFilename = function (req, ...rest) {
        if (req.startsWith('@opentelemetry/')) { const e = new Error('Cannot find module ' + req); e.code = 'MODULE_NOT_FOUND'; throw e; }
        return resolve.call(this, req, ...rest);
      };
    }
    const { JobOrchestrator } = require(${JSON.stringify(dist)});
    const o = new JobOrchestrator({ clock: 'manual', tracing: process.argv[1] === 'off' ? false : undefined });
    o.registerHandler('x', {}, async (ctx) => { await ctx.step('s', () => 1); return { ok: true }; });
    (async () => {
      const r = await o.start('x', {});
      await o.claimNext('batch');
      await o.tick(r.id);
      const done = await o.getRun(r.id);
      const loaded = Object.keys(require.cache).some((k) => k.includes('@opentelemetry'));
      console.log(JSON.stringify({ status: done.status, tags: done.tags, loaded }));
    })().catch((e) => { console.error(e); process.exit(1); });`;
  for (const mode of ['hidden', 'off']) {
    const r = spawnSync(process.execPath, ['-e', script, mode], { encoding: 'utf8' });
    t.is(r.status, 0, r.stderr);
    t.deepEqual(JSON.parse(r.stdout.trim()), { status: 'completed', tags: {}, loaded: false }, mode);
  }
  // Installed and on: it is loaded (so the check above can fail).
  const r = spawnSync(process.execPath, ['-e', script, 'on'], { encoding: 'utf8' });
  t.is(r.status, 0, r.stderr);
  t.deepEqual(JSON.parse(r.stdout.trim()), { status: 'completed', tags: {}, loaded: true }, 'on, but no provider registered: nothing stamped');
});

test('tracing: options given as a class instance (getters) keep every field under an active span; a caller’s own tracestate keeps both tags out', async (t) => {
  const o = manual();
  o.registerHandler('tr.opts', {}, () => ({}));
  class Opts {
    get pool(): string {
      return 'other';
    }
    get priority(): number {
      return 5;
    }
    get tags(): Record<string, string> {
      return { team: 'a' };
    }
  }
  const { run, outer } = await inSpan('with class options', async (span) => ({ run: await o.start('tr.opts', {}, new Opts()), outer: span }));
  t.is(run.pool, 'other', 'a getter is read, not dropped by the trace tags');
  t.is(run.priority, 5);
  t.deepEqual(run.tags, { team: 'a', traceparent: traceparentOf(outer) });
  const inherited = await inSpan('inherited options', () => o.start('tr.opts', {}, Object.create({ priority: 3 }) as { priority: number }));
  const untraced = await o.start('tr.opts', {}, Object.create({ priority: 3 }) as { priority: number });
  t.is(inherited.priority, untraced.priority, 'options built on a prototype read the same with a span active');
  t.is(inherited.priority, 3);
  const [many] = await inSpan('startMany', () => o.startMany([{ type: 'tr.opts', input: {}, opts: new Opts() }]));
  t.is(many!.pool, 'other');
  t.is(many!.tags.team, 'a');
  t.truthy(many!.tags.traceparent);
  // The caller carried a tracestate of its own: neither tag is added (a pair from two contexts would be wrong).
  const own = await inSpan('own state', () => o.start('tr.opts', {}, { tags: { tracestate: 'vendor=1' } }));
  t.deepEqual(own.tags, { tracestate: 'vendor=1' });
});

test('tracing: a tracer provider that throws breaks nothing: starts resolve, the worker completes the runs, tick too', (t) => {
  const dist = path.join(__dirname, '..', 'dist');
  const script = `
    const { trace } = require('@opentelemetry/api');
    trace.setGlobalTracerProvider({ getTracer() { throw new Error('broken SDK'); } });
    const { JobOrchestrator } = require(${JSON.stringify(dist)});
    process.on('uncaughtException', (e) => { console.error('uncaught', e); process.exit(3); });
    process.on('unhandledRejection', (e) => { console.error('unhandled', e); process.exit(4); });
    (async () => {
      const o = new JobOrchestrator({ clock: 'manual' });
      o.registerHandler('x', {}, async (ctx) => { await ctx.step('s', () => 1); return { ok: true }; });
      const ticked = await o.start('x', {});
      await o.claimNext('batch');
      await o.tick(ticked.id);
      const w = new JobOrchestrator({});
      w.registerHandler('x', {}, async (ctx) => { await ctx.step('s', () => 1); return { ok: true }; });
      const worker = w.startWorker({ pools: { batch: { concurrency: 2 } } });
      const runs = await Promise.all([1, 2, 3].map(() => w.start('x', {})));
      const done = await Promise.all(runs.map((r) => w.waitForRun(r.id, { timeoutMs: 5000 })));
      await worker.stop();
      console.log(JSON.stringify([(await o.getRun(ticked.id)).status, ...done.map((r) => r.status)]));
    })().catch((e) => { console.error(e); process.exit(1); });`;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 });
  t.is(r.status, 0, r.stderr);
  t.deepEqual(JSON.parse(r.stdout.trim()), ['completed', 'completed', 'completed', 'completed']);
});
