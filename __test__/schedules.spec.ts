/**
 * Schedules (recurring starts): `schedule`, `unschedule`, `listSchedules`,
 * `fireDueSchedules`, and the worker firing them on time, on both
 * backends; bad schedules get typed errors and store nothing; with
 * PostgreSQL, workers of several orchestrators start each occurrence once.
 */
import test from 'ava';
import {
  JobInputInvalidError,
  JobKeyFunctionUnavailableError,
  JobOrchestrator,
  JobTemplateFieldMissingError,
  JobTypeNotFoundError,
  MissingTenantIdError,
} from '../dist';
import type { JobContext, JobRun, JobRunSummary } from '../dist';
import { manual, realSleep, waitFor } from './helpers';
import { forBackends } from './backends';

const MINUTE = 60_000;

forBackends('schedule: the worker starts a run at each fire time, with trigger, ref and runAt', async (t, make) => {
  const o = await make.manual();
  const seen: JobRun[] = [];
  o.registerHandler('report.build', { pool: 'batch' }, async (ctx: JobContext<{ kind: string }>) => {
    seen.push(ctx.run);
    return { kind: ctx.input.kind };
  });
  const t0 = o.now().getTime();
  const s = await o.schedule('nightly', { jobType: 'report.build', input: { kind: 'daily' }, everyMs: 1_000 });
  t.is(s.name, 'nightly');
  t.is(s.everyMs, 1_000);
  t.is(s.cron, null);
  t.deepEqual(s.input, { kind: 'daily' });
  t.is(s.nextRunAt?.getTime(), t0 + 1_000);
  t.is(s.lastRunAt, null);
  const w = o.startWorker({ shutdownTimeoutMs: 100 });
  t.teardown(() => w.stop());
  await realSleep(50);
  t.is(seen.length, 0, 'nothing before the first fire time');
  o.advanceTime(1_000);
  await waitFor(() => seen.length === 1, 'the first occurrence', 5_000);
  const run = seen[0]!;
  t.is(run.triggerSource, 'schedule');
  t.is(run.triggerRef, 'nightly');
  t.is(run.runAt.getTime(), t0 + 1_000);
  t.deepEqual(run.input, { kind: 'daily' });
  const done = await o.waitForRun(run.id, { timeoutMs: 5_000 });
  t.deepEqual(done.output, { kind: 'daily' });
  o.advanceTime(1_000);
  await waitFor(() => seen.length === 2, 'the second occurrence', 5_000);
  t.is(seen[1]!.runAt.getTime(), t0 + 2_000);
  const [after] = await o.listSchedules();
  t.is(after!.lastRunAt?.getTime(), t0 + 2_000);
  t.is(after!.lastRunId, seen[1]!.id);
  t.is(after!.nextRunAt?.getTime(), t0 + 3_000);
  t.is(after!.lastError, null);
});

forBackends('schedule: a cron expression fires on its minutes (UTC); fireDueSchedules works without a worker', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('digest', {}, async () => ({}));
  const t0 = o.now().getTime();
  const quarter = 15 * MINUTE;
  const next = (Math.floor(t0 / quarter) + 1) * quarter;
  const s = await o.schedule('digest-every-15', { jobType: 'digest', cron: '*/15 * * * *' });
  t.is(s.cron, '*/15 * * * *');
  t.is(s.nextRunAt?.getTime(), next);
  t.is(await o.fireDueSchedules(), 0);
  o.advanceTime(next - t0 - 1);
  t.is(await o.fireDueSchedules(), 0, 'one ms early');
  o.advanceTime(1);
  t.is(await o.fireDueSchedules(), 1);
  t.is(await o.fireDueSchedules(), 0, 'an occurrence starts one run');
  const { items } = await o.listJobRuns({ status: 'pending' });
  t.is(items.length, 1);
  t.is(items[0]!.runAt.getTime(), next);
  // A page shows no input: the run's row does.
  t.deepEqual((await o.getRun(items[0]!.runId))?.input, {});
  // Missed occurrences (no worker for an hour) collapse into one run.
  o.advanceTime(60 * MINUTE);
  t.is(await o.fireDueSchedules(), 1);
  const [after] = await o.listSchedules();
  t.is(after!.lastRunAt?.getTime(), next + quarter);
  t.is(after!.nextRunAt?.getTime(), next + 5 * quarter);
});

forBackends('schedule: a cron in a time zone fires on its wall clock (default UTC)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('standup', {}, async () => ({}));
  const t0 = o.now().getTime();
  const utc = await o.schedule('utc', { jobType: 'standup', cron: '0 9 * * *' });
  t.is(utc.timezone, 'UTC');
  t.is(new Date(utc.nextRunAt!).getUTCHours(), 9);
  // Kathmandu is UTC+05:45 all year: 09:00 there is 03:15 UTC.
  const ktm = await o.schedule('ktm', { jobType: 'standup', cron: '0 9 * * *', timezone: 'Asia/Kathmandu' });
  t.is(ktm.timezone, 'Asia/Kathmandu');
  const next = ktm.nextRunAt!;
  t.is(next.getUTCHours() * 60 + next.getUTCMinutes(), 3 * 60 + 15);
  t.true(next.getTime() > t0 && next.getTime() <= t0 + 86_400_000);
  const listed = await o.listSchedules();
  t.deepEqual(
    listed.map((s) => [s.name, s.timezone, s.nextRunAt?.getTime()]),
    [
      ['ktm', 'Asia/Kathmandu', next.getTime()],
      ['utc', 'UTC', utc.nextRunAt!.getTime()],
    ],
  );
  const every = await o.schedule('every', { jobType: 'standup', everyMs: 60_000 });
  t.is(every.timezone, null);
  await t.throwsAsync(o.schedule('bad', { jobType: 'standup', cron: '0 9 * * *', timezone: 'Mars/Olympus_Mons' }), {
    instanceOf: JobInputInvalidError,
    message: /Mars\/Olympus_Mons/,
  });
  await t.throwsAsync(o.schedule('bad', { jobType: 'standup', everyMs: 1_000, timezone: 'UTC' }), { instanceOf: JobInputInvalidError });
  await t.throwsAsync(o.schedule('bad', { jobType: 'standup', cron: '0 9 * * *', timezone: 5 as unknown as string }), {
    instanceOf: JobInputInvalidError,
  });
  t.is((await o.listSchedules()).length, 3);
});

forBackends('schedule: re-declaring keeps the phase, unschedule stops it, listSchedules is by name', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('a', {}, async () => ({}));
  const t0 = o.now().getTime();
  await o.schedule('b-second', { jobType: 'a', everyMs: 10 * MINUTE });
  await o.schedule('a-first', { jobType: 'a', everyMs: MINUTE });
  o.advanceTime(30_000);
  // An app declaring its schedules at every boot does not push them back.
  const again = await o.schedule('a-first', { jobType: 'a', everyMs: MINUTE, input: { v: 2 } });
  t.is(again.nextRunAt?.getTime(), t0 + MINUTE);
  t.deepEqual(again.input, { v: 2 });
  t.deepEqual((await o.listSchedules()).map((s) => s.name), ['a-first', 'b-second']);
  t.true(await o.unschedule('b-second'));
  t.false(await o.unschedule('b-second'));
  t.false(await o.unschedule('never-was'));
  o.advanceTime(10 * MINUTE);
  t.is(await o.fireDueSchedules(), 1);
  const { items } = await o.listJobRuns({});
  const rows = await Promise.all(items.map((r) => o.getRun(r.runId)));
  t.deepEqual(rows.map((r) => [r?.triggerRef, r?.input]), [['a-first', { v: 2 }]]);
});

forBackends('schedule: bad schedules are refused with typed errors and store nothing', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('a', {}, async () => ({}));
  o.registerHandler('fnkey', { dedupe: { key: (i: { id: string }) => i.id, windowMs: 1_000 } }, async () => ({}));
  o.registerHandler('scoped', { scope: { entity: 'customer', from: (i: { c: string }) => i.c } }, async () => ({}));
  const cyclic: Record<string, unknown> = {};
  cyclic.self = cyclic;
  const bad: [string, unknown, unknown, (new (...a: never[]) => Error)?][] = [
    ['cron field out of range', 'x', { jobType: 'a', cron: '61 * * * *' }],
    ['cron with four fields', 'x', { jobType: 'a', cron: '* * * *' }],
    ['cron that never fires', 'x', { jobType: 'a', cron: '0 0 31 4 *' }],
    ['cron not a string', 'x', { jobType: 'a', cron: 5 }],
    ['both cron and everyMs', 'x', { jobType: 'a', cron: '* * * * *', everyMs: 1_000 }],
    ['neither', 'x', { jobType: 'a' }],
    ['everyMs zero', 'x', { jobType: 'a', everyMs: 0 }],
    ['everyMs fractional', 'x', { jobType: 'a', everyMs: 1.5 }],
    ['everyMs NaN', 'x', { jobType: 'a', everyMs: NaN }],
    ['everyMs a string', 'x', { jobType: 'a', everyMs: '1000' }],
    ['empty name', '', { jobType: 'a', everyMs: 1_000 }],
    ['name with a lone surrogate', 'a\ud800', { jobType: 'a', everyMs: 1_000 }],
    ['name not a string', 42, { jobType: 'a', everyMs: 1_000 }],
    ['options not an object', 'x', null],
    ['jobType missing', 'x', { everyMs: 1_000 }],
    ['input a BigInt', 'x', { jobType: 'a', everyMs: 1_000, input: { n: 1n } }],
    ['input cyclic', 'x', { jobType: 'a', everyMs: 1_000, input: cyclic }],
    ['tenantId a number', 'x', { jobType: 'a', everyMs: 1_000, tenantId: 7 }],
    ['unknown job type', 'x', { jobType: 'nope', everyMs: 1_000 }, JobTypeNotFoundError],
    ['function key', 'x', { jobType: 'fnkey', everyMs: 1_000 }, JobKeyFunctionUnavailableError],
    ['meta.scope (from() is JS)', 'x', { jobType: 'scoped', everyMs: 1_000, input: { c: 'c1' } }, JobKeyFunctionUnavailableError],
  ];
  const schedule = o.schedule.bind(o) as (name: unknown, opts: unknown) => Promise<unknown>;
  for (const [what, name, opts, cls] of bad) {
    const err = await t.throwsAsync(schedule(name, opts), { instanceOf: cls ?? JobInputInvalidError }, what);
    t.truthy(err?.message, what);
  }
  const range = await t.throwsAsync(o.schedule('x', { jobType: 'a', cron: '0 25 * * *' }));
  t.regex(range!.message, /hour/, 'the message names the field');
  t.deepEqual(await o.listSchedules(), []);
  t.is(await o.fireDueSchedules(), 0);
});

test('schedule: multi-tenant schedules need a tenant and stay with it', async (t) => {
  const o = manual({ multiTenant: true });
  o.registerHandler('a', {}, async () => ({}));
  await t.throwsAsync(o.schedule('s', { jobType: 'a', everyMs: 1_000 }), { instanceOf: MissingTenantIdError });
  await t.throwsAsync(o.listSchedules(), { instanceOf: MissingTenantIdError });
  await t.throwsAsync(o.unschedule('s'), { instanceOf: MissingTenantIdError });
  await o.schedule('s', { jobType: 'a', everyMs: 1_000, tenantId: 'acme' });
  await o.schedule('s', { jobType: 'a', everyMs: 1_000, tenantId: 'globex' });
  t.deepEqual((await o.listSchedules({ tenantId: 'acme' })).map((s) => s.tenantId), ['acme']);
  t.deepEqual(await o.listSchedules({ tenantId: 'initech' }), []);
  t.false(await o.unschedule('s', { tenantId: 'initech' }));
  o.advanceTime(1_000);
  t.is(await o.fireDueSchedules(), 2);
  for (const tenantId of ['acme', 'globex']) {
    const { items } = await o.listJobRuns({ tenantId });
    t.is(items.length, 1, tenantId);
    t.is(items[0]!.tenantId, tenantId);
  }
});

test('schedule: a key its input cannot fill is refused at once; a start refused at fire time is recorded and the schedule moves on', async (t) => {
  const o = manual();
  o.registerHandler('keyed', { concurrency: { key: 'acct:{{account}}', collisionMode: 'queue' } }, async () => ({}));
  await t.throwsAsync(o.schedule('no-account', { jobType: 'keyed', everyMs: 1_000 }), { instanceOf: JobTemplateFieldMissingError });
  t.deepEqual(await o.listSchedules(), []);
  o.registerHandler('single', { concurrency: { key: 'the-one', collisionMode: 'reject' } }, async () => ({}));
  const holder = await o.start('single', {});
  const t0 = o.now().getTime();
  await o.schedule('collides', { jobType: 'single', everyMs: 1_000 });
  o.advanceTime(1_000);
  t.is(await o.fireDueSchedules(), 0);
  const [s] = await o.listSchedules();
  t.true(s!.lastError?.includes(holder.id), s!.lastError ?? 'no lastError');
  t.is(s!.lastRunAt?.getTime(), t0 + 1_000);
  t.is(s!.nextRunAt?.getTime(), t0 + 2_000);
  // The lane frees: the next occurrence starts and clears the error.
  await o.cancel(holder.id);
  o.advanceTime(1_000);
  t.is(await o.fireDueSchedules(), 1);
  const [fixed] = await o.listSchedules();
  t.is(fixed!.lastError, null);
  t.truthy(fixed!.lastRunId);
});

test('schedule: claimNext turns a due schedule into its run (memory, no worker)', async (t) => {
  const o = manual();
  o.registerHandler('a', { pool: 'p' }, async () => ({}));
  await o.schedule('s', { jobType: 'a', everyMs: 5_000 });
  t.is(await o.claimNext('p'), null);
  o.advanceTime(5_000);
  const run = await o.claimNext('p');
  t.is(run?.triggerRef, 's');
});

test('schedule: an orchestrator with a schedule and a worker still lets the process go on close', async (t) => {
  const o = new JobOrchestrator({ loggerFactory: () => ({ log() {}, warn() {}, error() {}, debug() {} }) });
  o.registerHandler('a', {}, async () => ({}));
  await o.schedule('s', { jobType: 'a', everyMs: 20 });
  const w = o.startWorker();
  const ran: string[] = [];
  o.on('run:completed', (r) => {
    ran.push(r.id);
  });
  await waitFor(() => ran.length >= 3, 'three occurrences in real time', 5_000);
  await w.stop();
  await o.close();
  const { items } = await o.listJobRuns({ limit: 500 }).catch(() => ({ items: [] as JobRunSummary[] }));
  const times = items.map((r) => r.runAt.getTime());
  t.is(new Set(times).size, times.length, 'no occurrence started twice');
  t.true(ran.length >= 3);
});

// ── found by an audit of 2026-12-07 ─────────────────────────────────────

forBackends('schedule: declared again with the same times written otherwise, it keeps its due fire (the missed occurrence starts one run)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('t', {}, async () => 1);
  const pairs: [string, string][] = [
    ['0 9 * * MON-FRI', '0 9 * * mon-fri'],
    ['0 9 * * MON-FRI', '0  9 * * 1-5'],
    ['0 0 * * *', '@daily'],
  ];
  for (const [i, [first, again]] of pairs.entries()) {
    const name = `x${i}`;
    const s = await o.schedule(name, { jobType: 't', cron: first });
    // The fire time passes with nothing running (the app was down)…
    o.advanceTime(s.nextRunAt!.getTime() - o.now().getTime() + MINUTE);
    // … and it declares its schedules again as it boots.
    const s2 = await o.schedule(name, { jobType: 't', cron: again });
    t.is(s2.nextRunAt?.getTime(), s.nextRunAt!.getTime(), `${first} → ${again}: the due fire is kept`);
    t.is(await o.fireDueSchedules(), 1, `${first} → ${again}: the missed occurrence starts one run`);
    t.true(await o.unschedule(name));
  }
  // Other times are another timing: it starts from now.
  const s = await o.schedule('y', { jobType: 't', cron: '0 9 * * 1-5' });
  o.advanceTime(s.nextRunAt!.getTime() - o.now().getTime() + MINUTE);
  const moved = await o.schedule('y', { jobType: 't', cron: '0 9 * * 1-6' });
  t.true(moved.nextRunAt!.getTime() > o.now().getTime());
});

test('schedule: after a fire refused at fire time, lastRunId is null (no run of that fire), not the earlier fire’s run', async (t) => {
  const o = manual();
  o.registerHandler('single', { concurrency: { key: 'the-one', collisionMode: 'reject' } }, async () => ({}));
  await o.schedule('s', { jobType: 'single', everyMs: 1_000 });
  o.advanceTime(1_000);
  t.is(await o.fireDueSchedules(), 1);
  const [first] = await o.listSchedules();
  t.truthy(first!.lastRunId, 'the first fire started a run (it holds the lane)');
  o.advanceTime(1_000);
  t.is(await o.fireDueSchedules(), 0);
  const [s] = await o.listSchedules();
  t.true(s!.lastError?.includes(first!.lastRunId!), s!.lastError ?? 'no lastError');
  t.is(s!.lastRunId, null);
});

test('schedule: everyMs NaN or Infinity is refused by name, beside a cron too (JSON would have dropped it); nothing is stored', async (t) => {
  const o = manual();
  o.registerHandler('t', {}, async () => 1);
  for (const everyMs of [NaN, Infinity, -Infinity]) {
    for (const cron of [undefined, '*/5 * * * *']) {
      await t.throwsAsync(o.schedule('s', { jobType: 't', cron, everyMs }), { instanceOf: JobInputInvalidError, message: /everyMs must be a finite number/ }, `${everyMs} ${cron}`);
    }
  }
  t.deepEqual(await o.listSchedules(), []);
});

test('schedule: a name or tenantId cut inside a character is refused by unschedule and schedule (napi would make it another schedule’s)', async (t) => {
  const o = new JobOrchestrator({ clock: 'manual', multiTenant: true });
  o.registerHandler('t', {}, async () => 1);
  await o.schedule('nightly\ufffd', { jobType: 't', everyMs: 1_000, tenantId: 'acme' });
  await t.throwsAsync(o.unschedule('nightly\ud800', { tenantId: 'acme' }), { instanceOf: JobInputInvalidError, message: /schedule name must not hold a lone surrogate/ });
  await t.throwsAsync(o.schedule('x', { jobType: 't', everyMs: 1_000, tenantId: 'acme\ud800' }), { instanceOf: JobInputInvalidError, message: /tenantId must not hold a lone surrogate/ });
  await o.schedule('n', { jobType: 't', everyMs: 1_000, tenantId: 'acme\ufffd' });
  await t.throwsAsync(o.unschedule('n', { tenantId: 'acme\ud800' }), { instanceOf: JobInputInvalidError, message: /tenantId must not hold a lone surrogate/ });
  t.deepEqual((await o.listSchedules({ tenantId: 'acme\ufffd' })).map((s) => s.name), ['n'], "the other tenant's schedule is kept");
  t.deepEqual((await o.listSchedules({ tenantId: 'acme' })).map((s) => s.name), ['nightly\ufffd'], 'the other schedule is kept');
});
