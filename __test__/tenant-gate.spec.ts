/**
 * Issue 21, point 1: the tenant gate of every call that acts on or reads
 * tenant data, on both backends — the table in README "Tenant gate".
 *
 * In multi-tenant mode each such call takes a tenant: left out it is a
 * `MissingTenantIdError` naming the call; another tenant's run is invisible
 * (null, [], 0, a silent no-op for cancel, `JobRunNotFoundError` for the
 * calls that must answer with a row). Either way nothing of the owner's is
 * changed. `claimNext`/`tick`/`fireDueSchedules` are the worker's hands and
 * serve every tenant (their partition is the pool).
 */
import { randomUUID } from 'node:crypto';
import { JobRunNotFoundError, MissingTenantIdError } from '../dist';
import type { JobOrchestrator, JobRun } from '../dist';
import { forBackends } from './backends';
import { rejects } from './helpers';

type Tenant = { tenantId?: string | null | undefined } | undefined;

/** Tenant A's world: a failed run with a step and a scope, a pending run, a child, a schedule. */
async function fixture(o: JobOrchestrator) {
  o.registerHandler('gate.fails', {}, async (ctx) => {
    await ctx.step('s1', async () => ({ v: 1 }));
    throw new Error('boom');
  });
  o.registerHandler('gate.plain', {}, async () => ({}));
  const failed = await o.start('gate.fails', {}, { tenantId: 'A', scope: { entityType: 'acct', entityId: '1' }, priority: 10 });
  const claimed = await o.claimNext('batch');
  if (claimed?.id !== failed.id) throw new Error('fixture: expected to claim the failing run');
  await o.tick(failed.id);
  const pending = await o.start('gate.plain', {}, { tenantId: 'A', scope: { entityType: 'acct', entityId: '1' }, runAt: new Date(o.now().getTime() + 60_000) });
  const child = await o.start('gate.plain', {}, { tenantId: 'A', parentRunId: pending.id, runAt: new Date(o.now().getTime() + 60_000) });
  await o.schedule('nightly', { jobType: 'gate.plain', everyMs: 60_000, tenantId: 'A' });
  return { failed, pending, child };
}

/** Everything of tenant A that any call could change. */
async function snapshotA(o: JobOrchestrator, ids: string[]): Promise<unknown> {
  const A = { tenantId: 'A' };
  const rows = await Promise.all(ids.map((id) => o.findById(id, A)));
  const steps = await Promise.all(ids.map((id) => o.listSteps(id, A)));
  const schedules = (await o.listSchedules(A)).map((s) => ({ ...s, updatedAt: s.updatedAt }));
  return JSON.parse(JSON.stringify({ rows, steps, schedules, counts: await o.countByPoolAndStatus('A') }));
}

forBackends('issue 21: replay takes the tenant gate of cancel; nothing changes when it refuses', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const { failed, pending, child } = await fixture(o);
  t.is((await o.findById(failed.id, { tenantId: 'A' }))?.status, 'failed');
  const ids = [failed.id, pending.id, child.id];
  const before = await snapshotA(o, ids);
  for (const [label, opts] of [
    ['no options', undefined],
    ['{}', {}],
    ['tenantId undefined', { tenantId: undefined }],
  ] as [string, Tenant][]) {
    const e = await rejects<MissingTenantIdError>(t, () => o.replay(failed.id, opts), MissingTenantIdError, 'MISSING_TENANT_ID', `replay, ${label}`);
    t.is(e.method, 'replay', label);
  }
  // The gate comes first, as for cancel: an unknown id without a tenant is refused for the tenant.
  await rejects(t, () => o.replay(randomUUID()), MissingTenantIdError, 'MISSING_TENANT_ID', 'unknown id, no tenant');
  for (const other of ['B', null, 'a', ''] as (string | null)[]) {
    const e = await rejects<JobRunNotFoundError>(
      t,
      () => o.replay(failed.id, { tenantId: other }),
      JobRunNotFoundError,
      'JOB_RUN_NOT_FOUND',
      `replay as ${JSON.stringify(other)}`,
    );
    t.is(e.runId, failed.id);
  }
  t.deepEqual(await snapshotA(o, ids), before, "tenant A's runs, steps and counts are unchanged");
  t.is(await o.claimNext('batch'), null, 'nothing became claimable');
  // Its own tenant replays it; the memoized step is kept (last_checkpoint).
  const replayed = await o.replay(failed.id, { tenantId: 'A' });
  t.is(replayed.status, 'pending');
  t.is(replayed.tenantId, 'A');
  t.deepEqual((await o.listSteps(failed.id, { tenantId: 'A' })).map((s) => s.stepId), ['s1']);
});

forBackends('issue 21: replay in single-tenant mode needs no tenant (the seed signature still works)', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('gate.fails', {}, async () => {
    throw new Error('boom');
  });
  const r = await o.start('gate.fails', {});
  await o.claimNext('batch');
  await o.tick(r.id);
  t.is((await o.replay(r.id)).status, 'pending');
});

forBackends('issue 21: every tenant-scoped call takes the gate (the README table), and refusals change nothing', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const { failed, pending, child } = await fixture(o);
  const ids = [failed.id, pending.id, child.id];
  const before = await snapshotA(o, ids);
  const at = new Date(o.now().getTime() + 3_600_000);
  // [call, method named by the error, as tenant B, what B gets]
  const cases: [string, string, (opts: Tenant) => Promise<unknown>, unknown][] = [
    ['cancel', 'cancel', (x) => o.cancel(pending.id, x), undefined],
    ['replay', 'replay', (x) => o.replay(failed.id, x), JobRunNotFoundError],
    ['findById', 'findById', (x) => o.findById(failed.id, x), null],
    ['listSteps', 'listSteps', (x) => o.listSteps(failed.id, x), []],
    ['findStep', 'findStep', (x) => o.findStep(failed.id, 's1', x), null],
    ['recordStep', 'recordStep', (x) => o.recordStep({ jobRunId: failed.id, stepId: 'forged', status: 'completed' }, x), JobRunNotFoundError],
    ['getRunTree', 'getRunTree', (x) => o.getRunTree(pending.id, x), null],
    ['waitForRun', 'waitForRun', (x) => o.waitForRun(failed.id, { ...x, timeoutMs: 1_000 }), JobRunNotFoundError],
    ['listForScope', 'listForScope', (x) => o.listForScope('acct', '1', x), []],
    ['cancelForScope', 'cancelForScope', (x) => o.cancelForScope('acct', '1', x), 0],
    ['rescheduleForScope', 'rescheduleForScope', (x) => o.rescheduleForScope('acct', '1', at, x), 0],
    ['countByPoolAndStatus', 'countByPoolAndStatus', (x) => o.countByPoolAndStatus(x?.tenantId), []],
    ['listRecentFailed', 'listRecentFailed', (x) => o.listRecentFailed(10, x?.tenantId), []],
    ['listJobRuns', 'listJobRuns', (x) => o.listJobRuns({ ...x }).then((p) => p.items), []],
    ['getRun', 'getRun', (x) => o.getRun(failed.id, x?.tenantId), null],
    ['countRuns', 'countRuns', (x) => o.countRuns(x?.tenantId), 0],
    ['listSchedules', 'listSchedules', (x) => o.listSchedules(x), []],
    // B's schedule namespace is B's own: removing 'nightly' there removes nothing of A's.
    ['unschedule', 'unschedule', (x) => o.unschedule('nightly', x), false],
  ];
  for (const [label, method, call, asOther] of cases) {
    const e = await rejects<MissingTenantIdError>(t, () => call(undefined), MissingTenantIdError, 'MISSING_TENANT_ID', `${label} without tenant`);
    t.is(e.method, method, `${label}: the error names the call`);
    for (const other of ['B', null] as (string | null)[]) {
      const what = `${label} as ${JSON.stringify(other)}`;
      if (asOther === JobRunNotFoundError) {
        await rejects(t, () => call({ tenantId: other }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', what);
      } else {
        t.deepEqual(await call({ tenantId: other }), asOther, what);
      }
    }
  }
  // schedule: without a tenant refused; under B it is B's schedule, A's is untouched.
  const e = await rejects<MissingTenantIdError>(
    t,
    () => o.schedule('nightly', { jobType: 'gate.plain', everyMs: 1_000 }),
    MissingTenantIdError,
    'MISSING_TENANT_ID',
    'schedule without tenant',
  );
  t.is(e.method, 'schedule');
  t.deepEqual(await snapshotA(o, ids), before, "no refused or other-tenant call changed tenant A's runs, steps, schedules or counts");
  t.is((await o.findById(pending.id, { tenantId: 'A' }))?.status, 'pending');
  // The owner still can.
  t.is((await o.getRunTree(pending.id, { tenantId: 'A' }))?.children.length, 1);
  t.is(await o.cancelForScope('acct', '1', { tenantId: 'A' }), 1);
});

forBackends('issue 21: claimNext and tick are the worker side and serve every tenant (their partition is the pool)', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  const seen: (string | null)[] = [];
  o.registerHandler('gate.plain', {}, async (ctx) => {
    seen.push(ctx.run.tenantId);
    return {};
  });
  const runs: JobRun[] = [];
  for (const tenantId of ['A', 'B', null]) runs.push(await o.start('gate.plain', {}, { tenantId }));
  for (;;) {
    const r = await o.claimNext('batch');
    if (r === null) break;
    await o.tick(r.id);
  }
  t.deepEqual(seen, ['A', 'B', null]);
  for (const r of runs) t.is((await o.findById(r.id, { tenantId: r.tenantId }))?.status, 'completed');
});
