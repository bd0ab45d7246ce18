// The formats that cross the napi boundary (src/wire.rs ⇄ ts/wire.ts),
// each round-tripped through the addon: what one side writes, the other
// reads back unchanged. The run tuple's field order and the operation codes
// come from the addon itself; these tests pin that they agree with TS.
import test from 'ava';
import { JobCollisionError, JobInputInvalidError, JobOrchestrator, MissingTenantIdError } from '../dist';
import type { JobContext, JobRun } from '../dist';
import { forBackends } from './backends';
import { silentLogger } from './helpers';

// eslint-disable-next-line @typescript-eslint/no-require-imports
const binding = require('../index.js') as { opNames(): string[]; runFields(): string[] };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const wire = require('../dist/wire.js') as { RUN_FIELDS: readonly string[] };

test('the run tuple: TS reads the fields in the order the addon writes them', (t) => {
  t.deepEqual([...wire.RUN_FIELDS], binding.runFields());
});

test('operation codes: every operation TS calls exists in the addon, each name once', (t) => {
  const names = binding.opNames();
  t.is(new Set(names).size, names.length);
  for (const n of ['start', 'cancel', 'findById', 'listJobRuns', 'putSchedule', 'beginAttempt', 'finishAttempt']) {
    t.true(names.includes(n), n);
  }
});

/** Strange text for names and values: the separators of the hand-written formats, NUL escapes, astral plane. */
const ODD = 'a:b,c\n"d"\\e\u00e9\u{1F600}';
/** The same for names, which may not hold a line break (tickets cross one per line). */
const NAME = ODD.replace('\n', ' ');

forBackends('run rows: every field of a start with every option reads back as given', async (t, make) => {
  const o = await make({ multiTenant: true });
  o.registerHandler('wire.parent', {}, async () => undefined);
  o.registerHandler('wire.child', { pool: 'p2' }, async () => undefined);
  const parent = await o.start('wire.parent', {}, { tenantId: 'T' });
  const runAt = new Date(Date.now() + 3_600_000);
  const child = await o.start(
    'wire.child',
    { s: ODD, n: -1.5e-7, nested: { a: [1, null, true] } },
    {
      tenantId: 'T',
      scope: { entityType: 'order', entityId: ODD },
      pool: 'other',
      runAt,
      priority: -7,
      tags: { k: ODD },
      triggerSource: 'event',
      triggerRef: ODD,
      parentClosePolicy: 'abandon',
      parentRunId: parent.id,
    },
  );
  const back = (await o.findById(child.id, { tenantId: 'T' }))!;
  t.deepEqual(back, child);
  t.is(back.tenantId, 'T');
  t.deepEqual([back.scopeEntityType, back.scopeEntityId], ['order', ODD]);
  t.is(back.pool, 'other');
  t.is(back.runAt.getTime(), runAt.getTime());
  t.is(back.priority, -7);
  t.deepEqual(back.tags, { k: ODD });
  t.deepEqual([back.triggerSource, back.triggerRef], ['event', ODD]);
  t.is(back.parentClosePolicy, 'abandon');
  t.deepEqual([back.parentRunId, back.rootRunId], [parent.id, parent.id]);
  t.deepEqual(back.input, { s: ODD, n: -1.5e-7, nested: { a: [1, null, true] } });
});

forBackends('tenant: left out, null and an id are three different values', async (t, make) => {
  const o = await make({ multiTenant: true });
  o.registerHandler('wire.t', {}, async () => undefined);
  await t.throwsAsync(o.start('wire.t', {}), { instanceOf: MissingTenantIdError });
  const none = await o.start('wire.t', {}, { tenantId: null });
  const some = await o.start('wire.t', {}, { tenantId: 'x' });
  t.is(none.tenantId, null);
  t.is(some.tenantId, 'x');
  await t.throwsAsync(o.findById(none.id), { instanceOf: MissingTenantIdError });
  t.truthy(await o.findById(none.id, { tenantId: null }));
  t.is(await o.findById(none.id, { tenantId: 'x' }), null);
  t.truthy(await o.findById(some.id, { tenantId: 'x' }));
  t.is(await o.findById(some.id, { tenantId: null }), null);
});

test('start lines: a start answered in JS is the row the engine stores, whatever the type name', async (t) => {
  const o = new JobOrchestrator({ logger: silentLogger });
  const seen: string[] = [];
  o.registerHandler(NAME, {}, async () => undefined);
  const rows: JobRun[] = [];
  for (let i = 0; i < 3; i++) rows.push(await o.start(NAME, { i, s: ODD }));
  for (const r of rows) {
    const back = await o.findById(r.id);
    t.deepEqual(back, r);
    seen.push(back!.jobType);
  }
  t.deepEqual(seen, [NAME, NAME, NAME]);
});

forBackends('tickets: a worker hands the handler the input and row the engine holds, whatever the names', async (t, make) => {
  const o = await make();
  const got: { input: unknown; run: JobRun }[] = [];
  o.registerHandler(NAME, { pool: NAME }, async (ctx: JobContext<unknown>) => {
    got.push({ input: ctx.input, run: ctx.run });
    return { b: 1, a: ODD };
  });
  const run = await o.start(NAME, { s: ODD, deep: [{ x: [ODD] }] });
  const w = o.startWorker({ pools: { [NAME]: { concurrency: 2 } } });
  const done = await o.waitForRun(run.id, { timeoutMs: 10_000 });
  await w.stop();
  t.is(got.length, 1);
  t.deepEqual(got[0]!.input, { s: ODD, deep: [{ x: [ODD] }] });
  t.is(got[0]!.run.id, run.id);
  t.is(got[0]!.run.jobType, NAME);
  t.is(got[0]!.run.status, 'running');
  // Report lines carry the output's text as written: the handler's key
  // order (PostgreSQL's jsonb then orders keys its own way).
  if (o.backend === 'memory') t.deepEqual(Object.keys(done.output!), ['b', 'a']);
  t.deepEqual(done.output, { b: 1, a: ODD });
});

forBackends('report lines: failures keep message, name and code; a no-output completion reads {}', async (t, make) => {
  const o = await make();
  o.registerHandler('wire.fail', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, nonRetryableErrors: ['E_CODE'] } }, async () => {
    throw Object.assign(new RangeError(ODD), { code: 'E_CODE' });
  });
  o.registerHandler('wire.empty', {}, async () => undefined);
  const f = await o.start('wire.fail', {});
  const e = await o.start('wire.empty', {});
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  const [fr, er] = await Promise.all([o.waitForRun(f.id, { timeoutMs: 10_000 }), o.waitForRun(e.id, { timeoutMs: 10_000 })]);
  await w.stop();
  t.is(fr.status, 'failed');
  t.is(fr.error?.message, ODD);
  // Not retried: the code matched nonRetryableErrors, so the code crossed.
  t.is(fr.attempts, 1);
  t.regex(fr.error?.stack ?? '', /RangeError/);
  t.is(er.status, 'completed');
  t.deepEqual(er.output, {});
});

forBackends('errors: a collision crosses with its fields and the incumbent as a full row', async (t, make) => {
  const o = await make();
  o.registerHandler('wire.lane', { concurrency: { key: 'k:{{k}}', collisionMode: 'reject' } }, async () => undefined);
  const first = await o.start('wire.lane', { k: ODD });
  const err = await t.throwsAsync(o.start('wire.lane', { k: ODD }), { instanceOf: JobCollisionError });
  t.is(err?.jobType, 'wire.lane');
  t.is(err?.concurrencyKey, `k:${ODD}`);
  t.deepEqual(err?.incumbent, await o.findById(first.id));
  t.true(err?.incumbent.createdAt instanceof Date);
});

forBackends('summaries and failures: strings of any kind cross intact, times as Dates, absent values as null', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  // Job types and pools hold anything but a line break.
  const name = ODD.replace('\n', ' ');
  o.registerHandler(`wire.${name}`, {}, async () => {
    throw new Error(`bad ${ODD}`);
  });
  const run = await o.start(`wire.${name}`, {}, { tenantId: ODD, pool: `p${name}`, scope: { entityType: ODD, entityId: ODD }, triggerRef: ODD });
  const [pending] = (await o.listJobRuns({ tenantId: ODD })).items;
  t.deepEqual(
    [pending!.runId, pending!.jobType, pending!.pool, pending!.tenantId, pending!.scopeEntityType, pending!.triggerRef],
    [run.id, `wire.${name}`, `p${name}`, ODD, ODD, ODD],
  );
  t.deepEqual([pending!.startedAt, pending!.finishedAt, pending!.errorMessage, pending!.parentRunId], [null, null, null, null]);
  t.true(pending!.runAt instanceof Date && pending!.createdAt instanceof Date);
  t.is(pending!.createdAt.getTime(), run.createdAt.getTime());
  const claimed = await o.claimNext(`p${name}`);
  await o.tick(claimed!.id);
  const [failure] = await o.listRecentFailed(1, ODD);
  t.is(failure!.errorMessage, `bad ${ODD}`);
  t.true(failure!.failedAt instanceof Date && failure!.createdAt instanceof Date);
  t.is(failure!.failedAt.getTime(), (await o.getRun(run.id, ODD))!.finishedAt!.getTime());
});

forBackends('cursors: nextCursor read back pages on; a changed one is refused', async (t, make) => {
  const o = await make();
  o.registerHandler('wire.page', {}, async () => undefined);
  for (let i = 0; i < 5; i++) await o.start('wire.page', { i });
  const first = await o.listJobRuns({ limit: 2 });
  t.is(typeof first.nextCursor, 'string');
  const second = await o.listJobRuns({ limit: 2, cursor: first.nextCursor! });
  t.is(second.items.length, 2);
  t.false(second.items.some((r) => first.items.some((f) => f.runId === r.runId)));
  await t.throwsAsync(o.listJobRuns({ cursor: `${first.nextCursor!}0` }), { instanceOf: JobInputInvalidError });
});

forBackends('notices: an event carries the whole row of its transition', async (t, make) => {
  const o = await make();
  o.registerHandler('wire.ev', {}, async () => ({ v: ODD }));
  const events: JobRun[] = [];
  o.on('run:completed', (r) => events.push(r));
  const run = await o.start('wire.ev', {});
  const claimed = await o.claimNext('batch');
  t.is(claimed?.id, run.id);
  await o.tick(run.id);
  await o.waitForRun(run.id, { timeoutMs: 10_000 });
  for (let i = 0; i < 50 && events.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
  t.is(events.length, 1);
  t.deepEqual(events[0], await o.findById(run.id));
});

test('the short start answer carries any key, tenant and lineage as the engine stored them (positional text, read by slices)', async (t) => {
  const o = new JobOrchestrator({ multiTenant: true, logger: silentLogger, loggerFactory: () => silentLogger });
  o.registerHandler('laned', { concurrency: { key: (i: { k: string }) => i.k, collisionMode: 'queue' } }, async () => undefined);
  o.registerHandler('deduped', { dedupe: { key: (i: { k: string }) => `${i.k}|d`, windowMs: 60_000 } }, async () => undefined);
  // Text that looks like the format's own marks, lengths that differ in UTF-8 and UTF-16.
  const odd = ['', '-', '=', ':', '3:abc', '-:-', '😀x', 'é', 'a\u001fb', 'line\nbreak', 'x'.repeat(300)];
  const rows: JobRun[] = [];
  for (const tenant of ['-', ':', '😀', null]) {
    const parent = await o.start('laned', { k: `parent-${tenant}` }, { tenantId: tenant });
    for (const k of odd) {
      rows.push(await o.start('laned', { k }, { tenantId: tenant }));
      rows.push(await o.start('deduped', { k }, { tenantId: tenant, parentRunId: parent.id }));
    }
    rows.push(await o.start('deduped', { k: odd[1]! }, { tenantId: tenant, parentRunId: parent.id })); // a dedupe hit: the whole row
    const child = rows[rows.length - 2]!;
    t.is(child.parentRunId, parent.id);
    t.is(child.rootRunId, parent.rootRunId);
  }
  for (const r of rows) t.deepEqual(await o.findById(r.id, { tenantId: r.tenantId }), r);
  t.deepEqual(
    rows.filter((r) => r.jobType === 'laned').slice(0, odd.length).map((r) => r.concurrencyKey),
    odd,
  );
});
