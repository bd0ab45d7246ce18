/**
 * The run timeline (issue 25): `listRunEvents` on both stores — every
 * transition of a run in order with its attempt and data (claims, steps,
 * retries, waits, cancels with their cause, outcomes, replays), keyset
 * pages, the tenant gate, typed errors of bad input, the worker's path,
 * and `timeline: false`.
 */
import test from 'ava';
import { JobInputInvalidError, JobOrchestrator, JobRunNotFoundError, MissingTenantIdError } from '../dist';
import type { JobContext, JobRunEvent } from '../dist';
import { forBackends } from './backends';
import { rejects, waitFor } from './helpers';

async function all(o: JobOrchestrator, runId: string, tenantId?: string | null): Promise<JobRunEvent[]> {
  const out: JobRunEvent[] = [];
  let cursor: string | undefined;
  for (;;) {
    const page = await o.listRunEvents(runId, { cursor, limit: 500, ...(tenantId === undefined ? {} : { tenantId }) });
    out.push(...page.items);
    if (page.nextCursor === null) return out;
    cursor = page.nextCursor;
  }
}

const kinds = (events: JobRunEvent[]): string[] => events.map((e) => `${e.type}@${e.attempt}`);

async function tick(o: JobOrchestrator, id: string): Promise<void> {
  const c = await o.claimNext('batch');
  if (c?.id !== id) throw new Error(`expected to claim ${id}, got ${c?.id ?? 'nothing'}`);
  await o.tick(id);
}

forBackends('timeline: a retried run with a step tells its life in order, with attempts and data', async (t, make) => {
  const o = await make.manual();
  let calls = 0;
  o.registerHandler('tl.retry', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, async (ctx: JobContext<unknown>) => {
    await ctx.step('fetch', () => 42);
    if (++calls === 1) throw new Error('first <b>try</b> broke');
    return { ok: true };
  });
  const run = await o.start('tl.retry', {});
  await tick(o, run.id);
  o.advanceTime(1000);
  await tick(o, run.id);
  const events = await all(o, run.id);
  t.deepEqual(kinds(events), [
    'created@0',
    'started@1',
    'step_started@1',
    'step_completed@1',
    'retry_scheduled@1',
    'started@2',
    'completed@2',
  ]);
  t.true(events.every((e) => e.runId === run.id && e.at instanceof Date));
  t.is(events[0]!.at.getTime(), run.createdAt.getTime());
  t.deepEqual(events[0]!.data, { trigger: 'manual' });
  t.deepEqual(events[2]!.data, { stepId: 'fetch', stepAttempt: 1 });
  t.deepEqual(events[4]!.data, { delayMs: 1000, error: 'first <b>try</b> broke' });
  t.true(events.every((e, i) => i === 0 || e.seq > events[i - 1]!.seq), 'seq increases');
  t.true(events.every((e, i) => i === 0 || e.at >= events[i - 1]!.at), 'times are ordered');

  // Pages of 2 hold the same events; the last page has no cursor.
  const paged: JobRunEvent[] = [];
  let cursor: string | undefined;
  let pages = 0;
  do {
    const page = await o.listRunEvents(run.id, { cursor, limit: 2 });
    t.true(page.items.length <= 2);
    paged.push(...page.items);
    cursor = page.nextCursor ?? undefined;
    pages++;
  } while (cursor !== undefined);
  t.is(pages, 4);
  t.deepEqual(kinds(paged), kinds(events));

  // A replay adds to the timeline; what happened before stays.
  await o.replay(run.id);
  const after = await all(o, run.id);
  t.deepEqual(kinds(after).slice(0, 7), kinds(events));
  t.deepEqual(after[7]!.type, 'replayed');
  t.deepEqual(after[7]!.data, { from: 'last_checkpoint', was: 'completed' });
});

forBackends('timeline: a sleep and a signal show as waiting and resumed, with what resumed the run', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tl.wait', {}, async (ctx: JobContext<unknown>) => {
    await ctx.sleep('nap', 5000);
    const go = await ctx.waitForSignal<string>('go');
    return { go };
  });
  const run = await o.start('tl.wait', {});
  const t0 = o.now().getTime();
  await tick(o, run.id);
  o.advanceTime(5000);
  await tick(o, run.id);
  t.deepEqual(await o.signal(run.id, 'go', 'now'), { delivered: true });
  await tick(o, run.id);
  t.is((await o.getRun(run.id))?.status, 'completed');
  const events = await all(o, run.id);
  t.deepEqual(kinds(events), [
    'created@0',
    'started@1',
    'waiting@1',
    'resumed@1',
    'started@1',
    'waiting@1',
    'resumed@1',
    'started@1',
    'completed@1',
  ]);
  t.is((events[2]!.data as { wait: string }).wait, 'sleep');
  t.is(((events[2]!.data as { deadline: Date }).deadline).getTime(), t0 + 5000);
  t.deepEqual(events[3]!.data, { by: 'deadline' });
  t.deepEqual(events[5]!.data, { wait: 'signal' });
  t.deepEqual(events[6]!.data, { by: 'signal', stepId: 'go' });
});

forBackends('timeline: a cancel names its cause, and a cascade the run that did it', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tl.p', {}, async () => ({}));
  const parent = await o.start('tl.p', {});
  const child = await o.start('tl.p', {}, { parentRunId: parent.id });
  await o.cancel(parent.id);
  const p = await all(o, parent.id);
  const c = await all(o, child.id);
  t.deepEqual(kinds(p), ['created@0', 'canceled@1']);
  t.deepEqual(p[1]!.data, { reason: 'requested' });
  t.deepEqual(c[0]!.data, { trigger: 'manual', parentRunId: parent.id });
  t.deepEqual(c[1]!.data, { reason: 'requested', byRunId: parent.id });

  // A `replace` start cancels the lane's run and names itself.
  o.registerHandler<{ k: string }>('tl.lane', { concurrency: { key: 'k:{{k}}', collisionMode: 'replace' } }, async () => ({}));
  const first = await o.start('tl.lane', { k: 'a' });
  const second = await o.start('tl.lane', { k: 'a' });
  t.deepEqual((await all(o, first.id))[1]!.data, { reason: 'replaced', byRunId: second.id });
});

forBackends("timeline: a cancel's reason is noted in its canceled events (cut at 1,000 characters); a reason that is not a string is refused, nothing canceled", async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tl.r', {}, async () => ({}));
  const parent = await o.start('tl.r', {});
  const child = await o.start('tl.r', {}, { parentRunId: parent.id });
  const bad = await rejects(t, () => o.cancel(parent.id, { reason: 42 as unknown as string }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'a number as reason');
  t.regex(bad.message, /cancel: reason must be a string/);
  t.is((await o.getRun(parent.id))?.status, 'pending', 'nothing canceled');
  await o.cancel(parent.id, { reason: 'customer asked' });
  t.deepEqual((await all(o, parent.id))[1]!.data, { reason: 'requested', note: 'customer asked' });
  t.deepEqual((await all(o, child.id))[1]!.data, { reason: 'requested', byRunId: parent.id, note: 'customer asked' });

  const scoped = await o.start('tl.r', {}, { scope: { entityType: 'order', entityId: 'o1' } });
  t.is(await o.cancelForScope('order', 'o1', { reason: 'x'.repeat(1_500) }), 1);
  t.deepEqual((await all(o, scoped.id))[1]!.data, { reason: 'scope', note: 'x'.repeat(1_000) });

  // A NUL in it: PostgreSQL's jsonb cannot hold one (the cancel failed there).
  const nul = await o.start('tl.r', {});
  await o.cancel(nul.id, { reason: 'a\u0000b' });
  t.is((await o.getRun(nul.id))?.status, 'canceled');
  const note = ((await all(o, nul.id))[1]!.data as { note: string }).note;
  t.is(note, make.backend === 'postgres' ? 'a\ufffdb' : 'a\u0000b');
});

// The cascade cancels the child first: its end must not resolve (and so
// resume) the invoke wait of the parent it is about to cancel too.
forBackends('timeline: canceling a run parked on ctx.invoke cancels it without resuming it first', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tl.kid', {}, async () => 1);
  o.registerHandler('tl.inv', {}, async (ctx: JobContext<unknown>) => ctx.invoke('i', 'tl.kid', {}));
  const parent = await o.start('tl.inv', {});
  await tick(o, parent.id);
  t.is((await o.getRun(parent.id))?.status, 'waiting');
  await o.cancel(parent.id);
  t.deepEqual(kinds(await all(o, parent.id)), ['created@0', 'started@1', 'waiting@1', 'canceled@1']);
  const wait = (await o.listSteps(parent.id)).find((s) => s.stepId === 'i');
  t.not(wait?.status, 'failed', 'the wait is not failed with the child\'s cancel');
  t.is(wait?.error ?? null, null);
  t.is((await o.getRunTree(parent.id))?.children[0]?.run.status, 'canceled');
  t.is((await o.getRun(parent.id))?.status, 'canceled');
});

forBackends('timeline: the worker path records claims and outcomes', async (t, make) => {
  const o = await make.system();
  o.registerHandler('tl.work', {}, async (ctx: JobContext<unknown>) => {
    if ((ctx.input as { fail?: boolean }).fail) throw new Error('nope');
    return {};
  });
  const ok = await o.start('tl.work', {});
  const bad = await o.start('tl.work', { fail: true });
  const w = o.startWorker({ shutdownTimeoutMs: 100 });
  t.teardown(() => w.stop());
  await waitFor(async () => (await o.getRun(bad.id))?.status === 'failed' && (await o.getRun(ok.id))?.status === 'completed', 'both ended', 5000);
  t.deepEqual(kinds(await all(o, ok.id)), ['created@0', 'started@1', 'completed@1']);
  const b = await all(o, bad.id);
  t.deepEqual(kinds(b), ['created@0', 'started@1', 'failed@1']);
  t.deepEqual(b[2]!.data, { error: 'nope' });
});

forBackends('timeline: off, a run shows only its created event', async (t, make) => {
  const o = await make.manual({ timeline: false });
  o.registerHandler('tl.off', {}, async () => ({}));
  const run = await o.start('tl.off', {});
  await tick(o, run.id);
  t.is((await o.getRun(run.id))?.status, 'completed');
  t.deepEqual(kinds(await all(o, run.id)), ['created@0']);
});

forBackends('timeline: tenant-gated; bad input is a typed error', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  o.registerHandler('tl.gate', {}, async () => ({}));
  const run = await o.start('tl.gate', {}, { tenantId: 'a' });
  t.is((await all(o, run.id, 'a')).length, 1);
  await rejects(t, () => o.listRunEvents(run.id), MissingTenantIdError, 'MISSING_TENANT_ID', 'no tenant');
  await rejects(t, () => o.listRunEvents(run.id, { tenantId: 'b' }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'other tenant');
  await rejects(t, () => o.listRunEvents(run.id, { tenantId: null }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'null tenant');
  await rejects(t, () => o.listRunEvents('not-a-uuid', { tenantId: 'a' }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', 'not an id');
  const bad: [string, () => Promise<unknown>][] = [
    ['malformed cursor', () => o.listRunEvents(run.id, { tenantId: 'a', cursor: 'c1zz' })],
    ['cursor not a string', () => o.listRunEvents(run.id, { tenantId: 'a', cursor: 5 as unknown as string })],
    ['limit 0', () => o.listRunEvents(run.id, { tenantId: 'a', limit: 0 })],
    ['limit NaN', () => o.listRunEvents(run.id, { tenantId: 'a', limit: Number.NaN })],
    ['limit 1.5', () => o.listRunEvents(run.id, { tenantId: 'a', limit: 1.5 })],
    ['unknown option', () => o.listRunEvents(run.id, { tenantId: 'a', after: 1 } as never)],
  ];
  for (const [what, call] of bad) await rejects(t, call, JobInputInvalidError, 'JOB_INPUT_INVALID', what);
});

test('timeline: the option must be a boolean', (t) => {
  // A typed error at construction, before any store is opened.
  const err = t.throws(() => new JobOrchestrator({ timeline: 'yes' as unknown as boolean }));
  t.true(err instanceof JobInputInvalidError);
});

/** The value of one sample line of a Prometheus text, or undefined. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

forBackends('metrics: counters, histograms and live gauges in the Prometheus text format, label values escaped', async (t, make) => {
  const o = await make.manual();
  const type = 'mx "odd"\\type';
  let calls = 0;
  o.registerHandler(type, { retry: { attempts: 2, backoff: 'fixed', baseMs: 1000 } }, async () => {
    if (++calls === 1) throw new Error('once');
    return {};
  });
  o.registerHandler('mx.fail', {}, async () => {
    throw new Error('always');
  });
  const a = await o.start(type, {});
  const f = await o.start('mx.fail', {});
  await o.start('mx.fail', {}, { runAt: new Date(o.now().getTime() + 60_000) });
  o.advanceTime(2000); // both due runs wait 2 s in the queue
  await tick(o, a.id);
  await tick(o, f.id);
  o.advanceTime(1000);
  await tick(o, a.id);
  const text = await o.metrics();
  const l = 'job_type="mx \\"odd\\"\\\\type",pool="batch"';
  t.is(sample(text, `jobforge_runs_created_total{${l}}`), 1);
  t.is(sample(text, `jobforge_runs_completed_total{${l}}`), 1);
  t.is(sample(text, `jobforge_run_retries_total{${l}}`), 1);
  t.is(sample(text, 'jobforge_runs_created_total{job_type="mx.fail",pool="batch"}'), 2);
  t.is(sample(text, 'jobforge_runs_failed_total{job_type="mx.fail",pool="batch"}'), 1);
  t.is(sample(text, `jobforge_queue_wait_seconds_count{${l}}`), 2, 'two claims');
  t.is(sample(text, `jobforge_queue_wait_seconds_sum{${l}}`), 2, '2 s the first time, 0 s the retry');
  t.is(sample(text, `jobforge_queue_wait_seconds_bucket{${l},le="1"}`), 1);
  t.is(sample(text, `jobforge_queue_wait_seconds_bucket{${l},le="2.5"}`), 2);
  t.is(sample(text, `jobforge_queue_wait_seconds_bucket{${l},le="+Inf"}`), 2);
  t.is(sample(text, `jobforge_run_duration_seconds_count{${l}}`), 1);
  t.is(sample(text, 'jobforge_runs{pool="batch",status="pending"}'), 1, 'the run due in a minute');
  t.is(sample(text, 'jobforge_runs{pool="batch",status="running"}'), undefined);
  t.true(text.includes('# TYPE jobforge_queue_wait_seconds histogram'));
  t.true(text.includes('# TYPE jobforge_runs gauge'));
  // Every line is a comment or `name{labels} number`.
  for (const line of text.trimEnd().split('\n')) {
    t.regex(line, /^(# (HELP|TYPE) .+|[a-z_]+\{.*\} -?[0-9.]+(e[+-]?[0-9]+)?)$/, line);
  }
});

forBackends('throughput: runs that ended per minute, every minute of the window present', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tp.ok', {}, async () => ({}));
  o.registerHandler('tp.bad', {}, async () => {
    throw new Error('no');
  });
  o.advanceTime(60_000 - (o.now().getTime() % 60_000)); // a minute boundary
  const m0 = o.now().getTime();
  for (const type of ['tp.ok', 'tp.ok', 'tp.bad']) {
    const r = await o.start(type, {});
    await tick(o, r.id);
  }
  o.advanceTime(60_000);
  const c = await o.start('tp.ok', {});
  await o.cancel(c.id);
  const minutes = await o.throughput({ minutes: 3 });
  t.deepEqual(
    minutes.map((m) => [m.at.getTime() - m0, m.completed, m.failed, m.timedOut, m.canceled]),
    [
      [-60_000, 0, 0, 0, 0],
      [0, 2, 1, 0, 0],
      [60_000, 0, 0, 0, 1],
    ],
  );
  t.is((await o.throughput()).length, 60);
  for (const bad of [0, 61, 1.5, Number.NaN]) {
    await rejects(t, () => o.throughput({ minutes: bad }), JobInputInvalidError, 'JOB_INPUT_INVALID', `minutes ${bad}`);
  }
});

// A refused call changes nothing, the counters included: the batch's first
// entry replaced the lane's run (a create and a cancel) before its second
// was refused, and both used to stay counted.
forBackends('metrics: a refused startMany counts nothing it undid', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('tl.m.lane', { concurrency: { key: 'k:{{k}}', collisionMode: 'replace' } }, async () => 1);
  const first = await o.start('tl.m.lane', { k: 'a' });
  const counter = (text: string, name: string): string | undefined =>
    text.split('\n').find((l) => l.startsWith(`${name}{job_type="tl.m.lane"`));
  const before = await o.metrics();
  await t.throwsAsync(
    o.startMany([
      { type: 'tl.m.lane', input: { k: 'a' } },
      { type: 'tl.m.nope', input: {} },
    ]),
    { code: 'JOB_TYPE_NOT_FOUND' },
  );
  t.is((await o.getRun(first.id))?.status, 'pending', 'the replace was undone');
  const after = await o.metrics();
  t.is(counter(after, 'jobforge_runs_created_total'), counter(before, 'jobforge_runs_created_total'));
  t.regex(counter(after, 'jobforge_runs_created_total') ?? '', / 1$/);
  t.is(counter(after, 'jobforge_runs_canceled_total'), counter(before, 'jobforge_runs_canceled_total'));
  // What commits is counted as before.
  await o.startMany([{ type: 'tl.m.lane', input: { k: 'a' } }]);
  t.regex(counter(await o.metrics(), 'jobforge_runs_created_total') ?? '', / 2$/);
  t.regex(counter(await o.metrics(), 'jobforge_runs_canceled_total') ?? '', / 1$/);
});

test('metrics: registerMetrics puts the same series in a prom-client registry, read at each scrape', async (t) => {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const prom = require('prom-client') as typeof import('prom-client');
  const registry = new prom.Registry();
  const o = new JobOrchestrator({ clock: 'manual' });
  o.registerHandler('prom "t"', {}, async () => ({}));
  const remove = o.registerMetrics(registry);
  const r = await o.start('prom "t"', {});
  await tick(o, r.id);
  const text = await registry.metrics();
  t.true(text.includes('# TYPE jobforge_runs_completed_total counter'));
  t.true(text.includes('jobforge_runs_completed_total{job_type="prom \\"t\\"",pool="batch"} 1'), text);
  t.true(text.includes('jobforge_queue_wait_seconds_bucket{job_type="prom \\"t\\"",pool="batch",le="+Inf"} 1'));
  t.true(text.includes('# TYPE jobforge_run_duration_seconds histogram'));
  const json = await registry.getMetricsAsJSON();
  t.is(json.find((m) => m.name === 'jobforge_runs_created_total')?.values[0]?.value, 1);
  t.throws(() => o.registerMetrics(registry), { message: /already been registered/ }, 'twice is refused by prom-client');
  // All or none: a registry that already holds one of the names keeps nothing of ours.
  const other = new prom.Registry();
  new prom.Gauge({ name: 'jobforge_runs', help: 'the app\'s own', registers: [other] });
  t.throws(() => o.registerMetrics(other), { message: /already been registered/ });
  t.false((await other.metrics()).includes('jobforge_runs_created_total'));
  // OpenMetrics: counters keep one `_total`.
  const om = new prom.Registry();
  om.setContentType(prom.Registry.OPENMETRICS_CONTENT_TYPE as never);
  const removeOm = o.registerMetrics(om);
  const omText = await om.metrics();
  t.true(omText.includes('jobforge_runs_completed_total{job_type="prom \\"t\\"",pool="batch"} 1'), omText);
  t.false(omText.includes('_total_total'));
  removeOm();
  // A failed read answers no samples; the app's own metrics still scrape.
  const broken = { metrics: () => Promise.reject(new Error('database away')) } as unknown as JobOrchestrator;
  const app = new prom.Registry();
  new prom.Gauge({ name: 'app_up', help: 'up', registers: [app] }).set(1);
  JobOrchestrator.prototype.registerMetrics.call(broken, app);
  t.true((await app.metrics()).includes('app_up 1'));
  remove();
  t.false((await registry.metrics()).includes('jobforge_'));
  t.throws(() => o.registerMetrics({} as never), { instanceOf: JobInputInvalidError });
});
