/**
 * Malformed input (CONTRACT.md "Errors": "No input, however malformed, may
 * crash the process or corrupt the store"): every bad call gets a typed
 * error (or is a documented no-op) and leaves the store as it was. "As it
 * was" is checked for real: known rows are compared field by field before
 * and after, lanes and dedupe keys the bad call would have touched are
 * probed afterwards, and the pool is drained to prove no run was created.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { randomUUID } from 'node:crypto';
import {
  JobClockError,
  JobCollisionError,
  JobforgeError,
  JobInputInvalidError,
  JobNotReplayableError,
  JobOrchestrator,
  JobRunNotFoundError,
  JobRunStateError,
  JobTemplateFieldMissingError,
  JobTypeNotFoundError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from '../dist';
import type { JobRun, JobStep, StartOptions } from '../dist';
import { rejects } from './helpers';

/** Asserts `f` throws some typed jobforge error (any class). */
async function rejectsTyped(t: ExecutionContext, f: () => unknown, label: string): Promise<void> {
  try {
    await f();
  } catch (e) {
    t.true(e instanceof JobforgeError, `${label}: expected a typed jobforge error, got ${String(e)}`);
    t.is(typeof (e as { code?: unknown }).code, 'string', `${label}: code`);
    return;
  }
  t.fail(`${label}: nothing was thrown`);
}

const noop = async () => ({ ok: true });

/** Pulls every claimable run of `pool` and returns their ids in claim order. */
async function drain(o: JobOrchestrator, pool = 'batch'): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < 1000; i++) {
    const r = await o.claimNext(pool);
    if (r === null) return ids;
    ids.push(r.id);
  }
  throw new Error('drain did not terminate');
}

/** Rows (and steps) of known runs, to compare before/after a bad call. */
async function snapshot(o: JobOrchestrator, ids: string[], tenantId?: string | null): Promise<unknown> {
  const opts = tenantId === undefined ? undefined : { tenantId };
  const out: { row: JobRun | null; steps: JobStep[] }[] = [];
  for (const id of ids) out.push({ row: await o.findById(id, opts), steps: await o.listSteps(id, opts) });
  return out;
}

/**
 * A single-tenant orchestrator with:
 *  - `plain` (no keys), `laned` (reject lane on `{{k}}`), `deduped`
 *    (dedupe on `{{k}}`, 1 h), `replaced` (replace lane on `{{k}}`),
 *  - one pending `plain` run `known` that every bad call must leave alone.
 */
async function fixture() {
  const o = new JobOrchestrator();
  o.registerHandler('plain', {}, noop);
  o.registerHandler('laned', { concurrency: { key: '{{k}}', collisionMode: 'reject' } }, noop);
  o.registerHandler('deduped', { dedupe: { key: '{{k}}', windowMs: 3_600_000 } }, noop);
  o.registerHandler('replaced', { concurrency: { key: 'r{{k}}', collisionMode: 'replace' } }, noop);
  const known = await o.start('plain', { n: 1 }, { priority: 100 });
  const ids = [known.id];
  const before = await snapshot(o, ids);
  const unchanged = async (t: ExecutionContext, label: string) => {
    t.deepEqual(await snapshot(o, ids), before, `${label}: a known run changed`);
  };
  /**
   * Proves that no bad call created a run, took lane `a`, or left a dedupe
   * entry for key `a`: the lane and the dedupe key are free, and the pool
   * holds exactly `known` plus the two probes.
   */
  const noRunCreated = async (t: ExecutionContext) => {
    const lane = await o.start('laned', { k: 'a' }, { priority: 50 });
    t.is(lane.status, 'pending');
    await rejects(t, () => o.start('laned', { k: 'a' }), JobCollisionError, 'JOB_COLLISION', 'probe: lane a works');
    const dd = await o.start('deduped', { k: 'a', probe: true }, { priority: 40 });
    t.deepEqual(dd.input, { k: 'a', probe: true }, 'dedupe key a was free (no earlier run returned)');
    t.is((await o.start('deduped', { k: 'a' })).id, dd.id, 'probe: dedupe works');
    t.deepEqual(await drain(o), [known.id, lane.id, dd.id], 'the pool holds only the runs started on purpose');
  };
  return { o, known, unchanged, noRunCreated };
}

// ── start: job type, template fields ──────────────────────────────────

test('start of an unknown type: JobTypeNotFoundError {jobType}, nothing created', async (t) => {
  const f = await fixture();
  for (const type of ['nope', '', 'Plain', 'laned ']) {
    const e = await rejects<JobTypeNotFoundError>(t, () => f.o.start(type, { k: 'a' }), JobTypeNotFoundError, 'JOB_TYPE_NOT_FOUND', `type '${type}'`);
    t.is(e.jobType, type);
    await f.unchanged(t, `type '${type}'`);
  }
  await f.noRunCreated(t);
});

test('a template field missing, null or undefined: JobTemplateFieldMissingError {template, field}, nothing created', async (t) => {
  const f = await fixture();
  const cases: [string, unknown, string][] = [
    ['laned', {}, '{{k}}'],
    ['laned', { k: null }, '{{k}}'],
    ['laned', { k: undefined }, '{{k}}'],
    ['laned', { K: 'a' }, '{{k}}'],
    ['laned', undefined, '{{k}}'],
    ['deduped', {}, '{{k}}'],
    ['deduped', { k: null, other: 'a' }, '{{k}}'],
    ['replaced', { j: 'a' }, 'r{{k}}'],
  ];
  for (const [type, input, template] of cases) {
    const label = `${type} ${JSON.stringify(input)}`;
    const e = await rejects<JobTemplateFieldMissingError>(
      t,
      () => f.o.start(type, input),
      JobTemplateFieldMissingError,
      'JOB_TEMPLATE_FIELD_MISSING',
      label,
    );
    t.is(e.template, template, label);
    t.is(e.field, 'k', label);
    await f.unchanged(t, label);
  }
  await f.noRunCreated(t);
});

// ── start: inputs that are not JSON ─────────────────────────────────────

test('inputs that are not JSON values: JobInputInvalidError {reason}, nothing created', async (t) => {
  const f = await fixture();
  const cyclic: Record<string, unknown> = { k: 'a' };
  cyclic.self = cyclic;
  const deepCycle: Record<string, unknown> = { k: 'a', list: [1, { x: null as unknown }] };
  ((deepCycle.list as unknown[])[1] as Record<string, unknown>).x = deepCycle;
  const cases: [string, unknown][] = [
    ['function', () => 1],
    ['symbol', Symbol('s')],
    ['BigInt', 10n],
    ['NaN', NaN],
    ['Infinity', Infinity],
    ['-Infinity', -Infinity],
    ['Map instance', new Map([['k', 'a']])],
    ['Set instance', new Set(['a'])],
    ['class instance', new (class Foo {
      k = 'a';
    })()],
    ['nested function', { k: 'a', a: { b: () => 1 } }],
    ['nested symbol', { k: 'a', s: Symbol('x') }],
    ['nested BigInt', { k: 'a', n: 1n }],
    ['nested NaN', { k: 'a', n: NaN }],
    ['nested Infinity in array', { k: 'a', xs: [1, Infinity] }],
    ['nested Map', { k: 'a', m: new Map() }],
    ['function in array', { k: 'a', xs: [() => 1] }],
    ['cyclic', cyclic],
    ['cyclic through an array', deepCycle],
  ];
  // `laned` and `deduped` take key `a` from these inputs: a leaked run
  // would hold lane `a` or dedupe key `a` (checked by noRunCreated).
  for (const type of ['plain', 'laned', 'deduped']) {
    for (const [label, input] of cases) {
      const e = await rejects<JobInputInvalidError>(
        t,
        () => f.o.start(type, input),
        JobInputInvalidError,
        'JOB_INPUT_INVALID',
        `${type}: ${label}`,
      );
      t.is(typeof e.reason, 'string');
      t.true(e.reason.length > 0, `${type}: ${label}: reason is empty`);
      await f.unchanged(t, `${type}: ${label}`);
    }
  }
  await f.noRunCreated(t);
});

test('an invalid input is rejected before an unknown parent and before a replace cancels its lane', async (t) => {
  const f = await fixture();
  const incumbent = await f.o.start('replaced', { k: 'a' }, { priority: 7 });
  const before = await snapshot(f.o, [incumbent.id]);
  await rejects(
    t,
    () => f.o.start('replaced', { k: 'a', fn: () => 1 }),
    JobInputInvalidError,
    'JOB_INPUT_INVALID',
    'replace with a bad input',
  );
  await rejects(
    t,
    () => f.o.start('replaced', { k: 'a' }, { parentRunId: randomUUID() }),
    ParentRunNotFoundError,
    'PARENT_RUN_NOT_FOUND',
    'replace with an unknown parent',
  );
  await rejects(
    t,
    () => f.o.start('replaced', { k: 'a' }, { runAt: new Date(NaN) }),
    JobInputInvalidError,
    'JOB_INPUT_INVALID',
    'replace with an invalid runAt',
  );
  t.deepEqual(await snapshot(f.o, [incumbent.id]), before, 'the replace lane incumbent was not canceled');
  t.deepEqual(await drain(f.o), [f.known.id, incumbent.id]);
});

// ── start: options ──────────────────────────────────────────────────────

test('malformed start options: JobInputInvalidError, nothing created', async (t) => {
  const f = await fixture();
  const cases: [string, unknown][] = [
    ['runAt invalid Date', { runAt: new Date(NaN) }],
    ['runAt string', { runAt: '2024-01-01T00:00:00Z' }],
    ['runAt number', { runAt: 1_700_000_000_000 }],
    ['runAt object', { runAt: { time: 1 } }],
    ['priority 1.5', { priority: 1.5 }],
    ['priority NaN', { priority: NaN }],
    ['priority Infinity', { priority: Infinity }],
    ['priority string', { priority: '3' }],
    ['priority beyond i32', { priority: 2 ** 31 }],
    ['tags string', { tags: 'team=ops' }],
    ['tags number value', { tags: { a: 1 } }],
    ['tags array', { tags: ['a'] }],
    ['tags nested object', { tags: { a: { b: 'c' } } }],
    ['tags boolean value', { tags: { a: true } }],
    ['tags Map', { tags: new Map([['a', 'b']]) }],
    ['tags function value', { tags: { a: () => 'b' } }],
    ['triggerSource unknown', { triggerSource: 'cron' }],
    ['triggerSource number', { triggerSource: 42 }],
    ['triggerSource empty', { triggerSource: '' }],
    ['parentClosePolicy unknown', { parentClosePolicy: 'kill' }],
    ['parentClosePolicy number', { parentClosePolicy: 1 }],
    ['tenantId number', { tenantId: 5 }],
    ['pool number', { pool: 5 }],
    ['triggerRef object', { triggerRef: { id: 1 } }],
    ['parentRunId number', { parentRunId: 7 }],
    ['scope string', { scope: 'order:1' }],
    ['scope without entityId', { scope: { entityType: 'order' } }],
    ['scope with a number entityId', { scope: { entityType: 'order', entityId: 1 } }],
    ['options not an object', 'fast'],
  ];
  for (const type of ['plain', 'laned', 'deduped']) {
    for (const [label, opts] of cases) {
      const e = await rejects<JobInputInvalidError>(
        t,
        () => f.o.start(type, { k: 'a' }, opts as StartOptions),
        JobInputInvalidError,
        'JOB_INPUT_INVALID',
        `${type}: ${label}`,
      );
      t.true(typeof e.reason === 'string' && e.reason.length > 0, `${type}: ${label}: reason`);
      // The reason names the option, not the JSON the options travel as.
      t.notRegex(e.reason, /invalid type|line \d+ column/, `${type}: ${label}: ${e.reason}`);
      await f.unchanged(t, `${type}: ${label}`);
    }
  }
  await f.noRunCreated(t);
});

test('an unknown parentRunId: ParentRunNotFoundError {parentRunId}, nothing created', async (t) => {
  const f = await fixture();
  for (const parentRunId of [randomUUID(), 'not-a-uuid', '', randomUUID().toUpperCase()]) {
    for (const type of ['plain', 'laned', 'deduped']) {
      const label = `${type} parent '${parentRunId}'`;
      const e = await rejects<ParentRunNotFoundError>(
        t,
        () => f.o.start(type, { k: 'a' }, { parentRunId }),
        ParentRunNotFoundError,
        'PARENT_RUN_NOT_FOUND',
        label,
      );
      t.is(e.parentRunId, parentRunId, label);
      await f.unchanged(t, label);
    }
  }
  await f.noRunCreated(t);
});

// ── run ids: tick, replay, findById, listSteps, cancel ─────────────────

test('unknown or invalid run ids: tick/replay throw JobRunNotFoundError, findById null, listSteps [], cancel is a no-op', async (t) => {
  const f = await fixture();
  for (const id of ['nope', '', randomUUID(), '00000000-0000-0000-0000-000000000000', `${f.known.id}x`, ' ' + f.known.id]) {
    const label = `id '${id}'`;
    const e1 = await rejects<JobRunNotFoundError>(t, () => f.o.tick(id), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', `tick ${label}`);
    t.is(e1.runId, id);
    const e2 = await rejects<JobRunNotFoundError>(t, () => f.o.replay(id), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', `replay ${label}`);
    t.is(e2.runId, id);
    t.is(await f.o.findById(id), null, `findById ${label}`);
    t.deepEqual(await f.o.listSteps(id), [], `listSteps ${label}`);
    t.is(await f.o.cancel(id), undefined, `cancel ${label}`);
    t.is(await f.o.cancel(id, { cascade: false, reason: 'x' }), undefined, `cancel ${label} without cascade`);
    await f.unchanged(t, label);
  }
  // Ids that are not strings at all: typed errors or null/no-op, never a crash.
  for (const id of [42, null, undefined, {}, Symbol.iterator] as unknown as string[]) {
    const label = `id ${String(id)}`;
    await rejectsTyped(t, () => f.o.tick(id), `tick ${label}`);
    await rejectsTyped(t, () => f.o.replay(id), `replay ${label}`);
    await f.unchanged(t, label);
  }
  await f.noRunCreated(t);
});

test('tick of a run that is not running and replay of a non-terminal run: typed errors, run unchanged', async (t) => {
  const f = await fixture();
  // pending
  const e1 = await rejects<JobRunStateError>(t, () => f.o.tick(f.known.id), JobRunStateError, 'JOB_RUN_STATE', 'tick pending');
  t.is(e1.runId, f.known.id);
  t.is(e1.status, 'pending');
  const e2 = await rejects<JobNotReplayableError>(t, () => f.o.replay(f.known.id), JobNotReplayableError, 'JOB_NOT_REPLAYABLE', 'replay pending');
  t.is(e2.runId, f.known.id);
  t.is(e2.currentStatus, 'pending');
  await f.unchanged(t, 'pending');

  // running (claimed, not yet ticked): replay refused, row unchanged
  const claimed = await f.o.claimNext('batch');
  t.is(claimed?.id, f.known.id);
  const running = await snapshot(f.o, [f.known.id]);
  const e3 = await rejects<JobNotReplayableError>(t, () => f.o.replay(f.known.id), JobNotReplayableError, 'JOB_NOT_REPLAYABLE', 'replay running');
  t.is(e3.currentStatus, 'running');
  t.deepEqual(await snapshot(f.o, [f.known.id]), running);

  // completed: tick refused, row unchanged
  await f.o.tick(f.known.id);
  const done = await snapshot(f.o, [f.known.id]);
  t.is((await f.o.findById(f.known.id))?.status, 'completed');
  const e4 = await rejects<JobRunStateError>(t, () => f.o.tick(f.known.id), JobRunStateError, 'JOB_RUN_STATE', 'tick completed');
  t.is(e4.status, 'completed');
  t.deepEqual(await snapshot(f.o, [f.known.id]), done);

  // canceled: tick refused
  const other = await f.o.start('plain', {}, { priority: 1 });
  await f.o.cancel(other.id);
  const canceled = await snapshot(f.o, [other.id]);
  const e5 = await rejects<JobRunStateError>(t, () => f.o.tick(other.id), JobRunStateError, 'JOB_RUN_STATE', 'tick canceled');
  t.is(e5.status, 'canceled');
  t.deepEqual(await snapshot(f.o, [other.id]), canceled);
  t.deepEqual(await drain(f.o), []);
});

test('claimNext with a pool that is not a string: typed error, nothing claimed', async (t) => {
  const f = await fixture();
  for (const pool of [42, null, undefined, {}] as unknown as string[]) {
    await rejectsTyped(t, () => f.o.claimNext(pool), `pool ${String(pool)}`);
    await f.unchanged(t, `pool ${String(pool)}`);
  }
  t.is(await f.o.claimNext(''), null);
  t.is(await f.o.claimNext('no-such-pool'), null);
  await f.unchanged(t, 'unknown pools');
  await f.noRunCreated(t);
});

// ── multi-tenant gate ───────────────────────────────────────────────────

async function tenantFixture() {
  const o = new JobOrchestrator({ multiTenant: true });
  o.registerHandler('plain', {}, noop);
  o.registerHandler('laned', { concurrency: { key: '{{k}}', collisionMode: 'reject' } }, noop);
  o.registerHandler('deduped', { dedupe: { key: '{{k}}', windowMs: 3_600_000 } }, noop);
  o.registerHandler('stepped', {}, async (ctx) => ({ s: await ctx.step('one', async () => ({ x: 1 })) }));
  const a = await o.start('laned', { k: 'a' }, { tenantId: 'A', priority: 10 });
  return { o, a };
}

test('multi-tenant: a missing tenantId is MissingTenantIdError {method} for start/cancel/findById/listSteps, store unchanged', async (t) => {
  const { o, a } = await tenantFixture();
  const before = await snapshot(o, [a.id], 'A');
  const startCases: [string, () => Promise<unknown>][] = [
    ['no options', () => o.start('plain', {})],
    ['empty options', () => o.start('plain', {}, {})],
    ['tenantId undefined', () => o.start('plain', {}, { tenantId: undefined, priority: 3 })],
    ['keyed type', () => o.start('laned', { k: 'b' }, { priority: 3 })],
    ['unknown type (the gate comes first)', () => o.start('nope', {})],
    ['bad template field (the gate comes first)', () => o.start('laned', {})],
  ];
  for (const [label, f] of startCases) {
    const e = await rejects<MissingTenantIdError>(t, f, MissingTenantIdError, 'MISSING_TENANT_ID', `start: ${label}`);
    t.is(e.method, 'start', label);
  }
  const queryCases: [string, string, () => Promise<unknown>][] = [
    ['cancel', 'cancel', () => o.cancel(a.id)],
    ['cancel', 'cancel {}', () => o.cancel(a.id, {})],
    ['cancel', 'cancel of an unknown run', () => o.cancel(randomUUID())],
    ['findById', 'findById', () => o.findById(a.id)],
    ['findById', 'findById {}', () => o.findById(a.id, {})],
    ['listSteps', 'listSteps', () => o.listSteps(a.id)],
    ['listSteps', 'listSteps {tenantId: undefined}', () => o.listSteps(a.id, { tenantId: undefined })],
  ];
  for (const [method, label, f] of queryCases) {
    const e = await rejects<MissingTenantIdError>(t, f, MissingTenantIdError, 'MISSING_TENANT_ID', label);
    t.is(e.method, method, label);
  }
  t.deepEqual(await snapshot(o, [a.id], 'A'), before, 'the run of tenant A is unchanged');
  // Nothing was created: the pool holds only A's run.
  t.deepEqual(await drain(o), [a.id]);
});

test("multi-tenant: another tenant's run is invisible and cancel of it is a silent no-op", async (t) => {
  const { o, a } = await tenantFixture();
  const s = await o.start('stepped', {}, { tenantId: 'A', priority: 20 });
  t.is((await o.claimNext('batch'))?.id, s.id);
  await o.tick(s.id);
  t.is((await o.listSteps(s.id, { tenantId: 'A' })).length, 1, 'tenant A sees its step');
  const before = await snapshot(o, [a.id, s.id], 'A');
  for (const other of ['B', null, 'a', ''] as (string | null)[]) {
    const label = `tenant ${JSON.stringify(other)}`;
    t.is(await o.findById(a.id, { tenantId: other }), null, `findById as ${label}`);
    t.is(await o.findById(s.id, { tenantId: other }), null, `findById as ${label}`);
    t.deepEqual(await o.listSteps(s.id, { tenantId: other }), [], `listSteps as ${label}`);
    t.is(await o.cancel(a.id, { tenantId: other }), undefined, `cancel as ${label}`);
    t.is(await o.cancel(a.id, { tenantId: other, cascade: false }), undefined, `cancel without cascade as ${label}`);
    // A parent of another tenant does not exist for this tenant.
    const e = await rejects<ParentRunNotFoundError>(
      t,
      () => o.start('plain', {}, { tenantId: other, parentRunId: a.id }),
      ParentRunNotFoundError,
      'PARENT_RUN_NOT_FOUND',
      `parent of tenant A used by ${label}`,
    );
    t.is(e.parentRunId, a.id);
  }
  t.deepEqual(await snapshot(o, [a.id, s.id], 'A'), before, 'the runs of tenant A are unchanged');
  t.is((await o.findById(a.id, { tenantId: 'A' }))?.status, 'pending');

  // Lanes and dedupe keys are per tenant: B neither collides with A's lane
  // nor receives A's dedupe hit.
  const b = await o.start('laned', { k: 'a' }, { tenantId: 'B', priority: 5 });
  t.not(b.id, a.id);
  t.is(b.tenantId, 'B');
  const collision = await rejects<JobCollisionError>(
    t,
    () => o.start('laned', { k: 'a' }, { tenantId: 'A' }),
    JobCollisionError,
    'JOB_COLLISION',
    'A collides with its own lane',
  );
  t.is(collision.incumbent.id, a.id);
  const da = await o.start('deduped', { k: 'd', who: 'A' }, { tenantId: 'A', priority: 4 });
  const db = await o.start('deduped', { k: 'd', who: 'B' }, { tenantId: 'B', priority: 3 });
  t.not(db.id, da.id);
  t.deepEqual(db.input, { k: 'd', who: 'B' });
  t.is((await o.start('deduped', { k: 'd' }, { tenantId: 'A' })).id, da.id, 'dedupe still works within A');
  t.deepEqual(await drain(o), [a.id, b.id, da.id, db.id]);
});

// ── registerHandler: malformed meta ─────────────────────────────────────

const BAD_META: [string, unknown][] = [
  ['retry.attempts 0', { retry: { attempts: 0, backoff: 'fixed', baseMs: 0 } }],
  ['retry.attempts -1', { retry: { attempts: -1, backoff: 'fixed', baseMs: 0 } }],
  ['retry.attempts 1.5', { retry: { attempts: 1.5, backoff: 'fixed', baseMs: 0 } }],
  ['retry.attempts NaN', { retry: { attempts: NaN, backoff: 'fixed', baseMs: 0 } }],
  ['retry.attempts string', { retry: { attempts: '2', backoff: 'fixed', baseMs: 0 } }],
  ['retry.baseMs negative', { retry: { attempts: 2, backoff: 'fixed', baseMs: -1 } }],
  ['retry.baseMs string', { retry: { attempts: 2, backoff: 'fixed', baseMs: '10' } }],
  ['retry.baseMs 1.5', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1.5 } }],
  ['retry.baseMs 1e300', { retry: { attempts: 2, backoff: 'fixed', baseMs: 1e300 } }],
  ['timeoutMs 2.5', { timeoutMs: 2.5 }],
  ['dedupe windowMs 1e300', { dedupe: { key: '{{a}}', windowMs: 1e300 } }],
  ['retry.backoff unknown', { retry: { attempts: 2, backoff: 'quadratic', baseMs: 0 } }],
  ['retry.maxDelayMs negative', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMs: -1 } }],
  ['retry.maxDelayMs 1.5', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMs: 1.5 } }],
  ['retry.maxDelayMs string', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMs: '150' } }],
  ['retry.maxDelayMs Infinity', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMs: Infinity } }],
  ['retry.jitter unknown', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, jitter: 'sometimes' } }],
  ['retry.jitter true', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, jitter: true } }],
  ['retry unknown key', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, maxDelayMS: 10 } }],
  ['meta unknown key', { retyr: { attempts: 3, backoff: 'fixed', baseMs: 0 } }],
  ['concurrency unknown key', { concurrency: { key: '{{a}}', colisionMode: 'reject' } }],
  ['dedupe unknown key', { dedupe: { key: '{{a}}', windowMs: 10, window: 10 } }],
  ['scope unknown key', { scope: { entity: 'account', from: () => 'x', kind: 'y' } }],
  ['retry.backoff missing', { retry: { attempts: 2, baseMs: 0 } }],
  ['retry.nonRetryableErrors not a list', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, nonRetryableErrors: 'Fatal' } }],
  ['retry not an object', { retry: 'twice' }],
  ['concurrency key {{a.b}}', { concurrency: { key: '{{a.b}}' } }],
  ['concurrency key {{}}', { concurrency: { key: '{{}}' } }],
  ['concurrency key unclosed', { concurrency: { key: 'x{{a' } }],
  ['concurrency key {{a-b}}', { concurrency: { key: '{{a-b}}' } }],
  ['concurrency key a number', { concurrency: { key: 5 } }],
  ['collisionMode unknown', { concurrency: { key: '{{a}}', collisionMode: 'drop' } }],
  ['dedupe key {{a.b}}', { dedupe: { key: '{{a.b}}', windowMs: 1000 } }],
  ['dedupe windowMs string', { dedupe: { key: '{{a}}', windowMs: 'soon' } }],
  ['dedupe windowMs negative', { dedupe: { key: '{{a}}', windowMs: -1 } }],
  ['pool a number', { pool: 42 }],
  ['pool empty', { pool: '' }],
  ['timeoutMs string', { timeoutMs: '5s' }],
  ['timeoutMs negative', { timeoutMs: -5 }],
  ['timeoutMs zero', { timeoutMs: 0 }],
  ['replayFrom unknown', { replayFrom: 'checkpoint' }],
  ['scope without from', { scope: { entity: 'account' } }],
  ['scope entity a number', { scope: { entity: 1, from: () => 'x' } }],
  ['meta a string', 'meta'],
];

test('registerHandler with malformed meta: JobInputInvalidError, no definition created', async (t) => {
  const o = new JobOrchestrator();
  for (const [label, meta] of BAD_META) {
    const type = `bad.${label}`;
    const e = await rejects<JobInputInvalidError>(
      t,
      () => o.registerHandler(type, meta as never, noop),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      label,
    );
    t.true(e.reason.includes(`'${type}'`), `${label}: the reason names the job type: ${e.reason}`);
    t.notRegex(e.reason, /invalid type|line \d+ column/, `${label}: the reason speaks of the meta: ${e.reason}`);
    t.is(await o.getDefinition(type), null, `${label}: a definition was created`);
    t.is(o.getHandlerRegistration(type), undefined, `${label}: a handler was remembered`);
    await rejects(t, () => o.start(type, { a: 'x' }), JobTypeNotFoundError, 'JOB_TYPE_NOT_FOUND', `${label}: start`);
  }
  for (const handler of [undefined, null, 5, 'run', {}, { run: 1 }]) {
    await rejects(
      t,
      () => o.registerHandler('bad.handler', {}, handler as never),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      `handler ${String(handler)}`,
    );
  }
  for (const type of ['', 5, null] as unknown as string[]) {
    await rejects(t, () => o.registerHandler(type, {}, noop), JobInputInvalidError, 'JOB_INPUT_INVALID', `type ${String(type)}`);
  }
  t.is(await o.getDefinition('bad.handler'), null);
  t.is(await o.claimNext('batch'), null);
});

test('registerHandler with malformed meta over an existing type keeps the old definition and handler', async (t) => {
  const o = new JobOrchestrator();
  const meta = { retry: { attempts: 2, backoff: 'fixed' as const, baseMs: 0 }, concurrency: { key: '{{k}}' } };
  o.registerHandler('job', meta, async () => ({ by: 'original' }));
  const def = await o.getDefinition('job');
  t.truthy(def);
  for (const [label, bad] of BAD_META) {
    await rejects(
      t,
      () => o.registerHandler('job', bad as never, async () => ({ by: 'replacement' })),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      label,
    );
    t.deepEqual(await o.getDefinition('job'), def, `${label}: definition changed`);
  }
  // The original handler still runs, with the original retry policy and lane.
  const run = await o.start('job', { k: 'x' });
  t.is(run.concurrencyKey, 'x');
  t.is((await o.claimNext('batch'))?.id, run.id);
  await o.tick(run.id);
  const done = await o.findById(run.id);
  t.is(done?.status, 'completed');
  t.deepEqual(done?.output, { by: 'original' });
});

test('upsertJobRows with one malformed entry registers none of them', async (t) => {
  const o = new JobOrchestrator();
  await t.throwsAsync(
    () =>
      o.upsertJobRows([
        { type: 'good', meta: {}, handlerClass: noop },
        { type: 'bad', meta: { retry: { attempts: 0, backoff: 'fixed', baseMs: 0 } } as never, handlerClass: noop },
      ]),
    { instanceOf: JobInputInvalidError },
  );
  t.is(await o.getDefinition('good'), null);
  t.is(await o.getDefinition('bad'), null);
  await rejects(t, () => o.start('good', {}), JobTypeNotFoundError, 'JOB_TYPE_NOT_FOUND', 'start good');
});

// ── clock ───────────────────────────────────────────────────────────────

test('advanceTime on the system clock: JobClockError; the clock keeps following the wall clock', async (t) => {
  const o = new JobOrchestrator();
  for (const ms of [0, 1000, 3_600_000]) {
    const e = await rejects<JobClockError>(t, () => o.advanceTime(ms), JobClockError, 'JOB_CLOCK', `advanceTime(${ms})`);
    t.true(e.message.length > 0);
  }
  t.true(Math.abs(o.now().getTime() - Date.now()) < 1000, 'system clock moved');
  // A run one hour ahead is still not due.
  o.registerHandler('plain', {}, noop);
  await o.start('plain', {}, { runAt: new Date(Date.now() + 3_600_000) });
  t.is(await o.claimNext('batch'), null);
});

test('advanceTime with a negative or non-finite amount: JobInputInvalidError, manual clock unchanged', async (t) => {
  const o = new JobOrchestrator({ clock: 'manual' });
  o.registerHandler('plain', {}, noop);
  const t0 = o.now().getTime();
  const due = await o.start('plain', {}, { runAt: new Date(t0 + 1000) });
  for (const ms of [-1, -1000, -0.5, NaN, Infinity, -Infinity, '5', null, undefined] as unknown as number[]) {
    await rejects(t, () => o.advanceTime(ms), JobInputInvalidError, 'JOB_INPUT_INVALID', `advanceTime(${String(ms)})`);
    t.is(o.now().getTime(), t0, `advanceTime(${String(ms)}) moved the clock`);
  }
  t.is(await o.claimNext('batch'), null, 'the run scheduled 1s ahead is still not due');
  o.advanceTime(999);
  t.is(await o.claimNext('batch'), null);
  o.advanceTime(1);
  t.is(o.now().getTime(), t0 + 1000);
  t.is((await o.claimNext('batch'))?.id, due.id);
});

test('constructor options that are malformed: JobInputInvalidError', (t) => {
  for (const opts of [{ clock: 'wall' }, { clock: 5 }, 'manual', 5]) {
    t.throws(() => new JobOrchestrator(opts as never), { instanceOf: JobInputInvalidError }, JSON.stringify(opts));
  }
  // A misspelt key or a mistyped value: refused, not ignored (`multitenant`
  // would leave the tenant gate off without a word).
  for (const opts of [{ multitenant: true }, { multiTenant: 'yes' }, { loggerFactory: 5 }, { retention: { completed: 1 } }, { retention: 5 }]) {
    t.throws(() => new JobOrchestrator(opts as never), { instanceOf: JobInputInvalidError }, JSON.stringify(opts));
  }
  const o = new JobOrchestrator();
  for (const w of [{ pool: { batch: { concurrency: 1 } } }, { pools: { batch: { concurrency: 1, concurency: 2 } } }, 'yes']) {
    t.throws(() => o.startWorker(w as never), { instanceOf: JobInputInvalidError }, JSON.stringify(w));
  }
  // Refused by the engine itself: the same typed error, not its coded text.
  for (const retention of [{ completedMs: -5 }, { failedMs: -1 }]) {
    t.throws(() => new JobOrchestrator({ retention }), { instanceOf: JobInputInvalidError, message: /retention/ }, JSON.stringify(retention));
  }
});

// Runs cross between the engine and JS one per line: a line break in a job
// type or pool name lost the run (plain start) or left it running forever
// (an unreadable worker ticket). Refused where the name is given.
test('a line break in a job type or pool name is refused where it is given; nothing is created', async (t) => {
  const o = new JobOrchestrator();
  const noopH = async () => ({});
  t.throws(() => o.registerHandler('order\nsync', {}, noopH), { instanceOf: JobInputInvalidError, message: /line break/ });
  t.throws(() => o.registerHandler('order.sync', { pool: 'p\nq' }, noopH), { instanceOf: JobInputInvalidError, message: /line break/ });
  t.is(await o.getDefinition('order\nsync'), null);
  t.is(await o.getDefinition('order.sync'), null);
  o.registerHandler('ok', {}, noopH);
  t.throws(() => o.startWorker({ pools: { 'p\nq': { concurrency: 1 } } }), { instanceOf: JobInputInvalidError, message: /line break/ });
  await t.throwsAsync(o.start('ok', {}, { pool: 'p\nq' }), { instanceOf: JobInputInvalidError, message: /line break/ });
  t.deepEqual(await o.countByPoolAndStatus(), []);
  // Other unusual characters are fine.
  o.registerHandler('tab\tcomma,colon:emoji🚀', { pool: 'p\tq' }, noopH);
  const run = await o.start('tab\tcomma,colon:emoji🚀', {});
  t.is((await o.findById(run.id))?.pool, 'p\tq');
});

test('null meta fields mean "not given", as in the seed (pool, retry, replayFrom, collisionMode, nonRetryableErrors, timeoutMs)', async (t) => {
  const o = new JobOrchestrator();
  const metas: [string, unknown][] = [
    ['pool', { pool: null }],
    ['retry', { retry: null }],
    ['replayFrom', { replayFrom: null }],
    ['collisionMode', { concurrency: { key: '{{a}}', collisionMode: null } }],
    ['nonRetryableErrors', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0, nonRetryableErrors: null } }],
    ['timeoutMs', { timeoutMs: null }],
  ];
  for (const [what, meta] of metas) {
    o.registerHandler(`null.${what}`, meta as never, noop);
    const def = await o.getDefinition(`null.${what}`);
    t.truthy(def, what);
    t.is(def!.pool, 'batch', what);
    t.is(def!.replayFrom, 'last_checkpoint', what);
    const run = await o.start(`null.${what}`, { a: 'x' });
    t.is(run.status, 'pending', what);
  }
  t.is((await o.getDefinition('null.collisionMode'))!.collisionMode, 'queue');
  t.is((await o.getDefinition('null.retry'))!.retryPolicy.attempts, 1);
});

test('a misspelt key in any call\'s options is a JobInputInvalidError naming it, and the call changes nothing', async (t) => {
  const o = new JobOrchestrator({ multiTenant: true, loggerFactory: () => ({ log() {}, warn() {}, error() {}, debug() {} }) });
  o.registerHandler('k', {}, async () => ({}));
  const parent = await o.start('k', {}, { tenantId: 'a' });
  await o.start('k', {}, { tenantId: 'a', parentRunId: parent.id });
  const before = await o.listJobRuns({ tenantId: 'a' });
  const bad = (o as unknown) as Record<string, (...a: unknown[]) => Promise<unknown>>;
  const cases: [string, () => Promise<unknown>, string][] = [
    ['cancel', () => bad.cancel!(parent.id, { tenantId: 'a', cascde: false }), 'cascde'],
    ['cancelForScope', () => bad.cancelForScope!('e', 'i', { tenantId: 'a', casade: false }), 'casade'],
    ['replay', () => bad.replay!(parent.id, { tenantid: 'a' }), 'tenantid'],
    ['findById', () => bad.findById!(parent.id, { tenant: 'a' }), 'tenant'],
    ['getRunTree', () => bad.getRunTree!(parent.id, { tenantID: 'a' }), 'tenantID'],
    ['listSteps', () => bad.listSteps!(parent.id, { tenant: 'a' }), 'tenant'],
    ['waitForRun', () => bad.waitForRun!(parent.id, { tenantId: 'a', timeout: 10 }), 'timeout'],
    ['listForScope', () => bad.listForScope!('e', 'i', { tenantId: 'a', order: 'asc' }), 'order'],
    ['listJobRuns', () => bad.listJobRuns!({ tenantId: 'a', pool: 'batch' }), 'pool'],
    ['rescheduleForScope', () => bad.rescheduleForScope!('e', 'i', new Date(), { tenant: 'a' }), 'tenant'],
    ['schedule', () => bad.schedule!('nightly', { jobType: 'k', everyMs: 1000, tenantId: 'a', every: 5 }), 'every'],
    ['unschedule', () => bad.unschedule!('nightly', { tenant: 'a' }), 'tenant'],
    ['listSchedules', () => bad.listSchedules!({ tenant: 'a' }), 'tenant'],
  ];
  for (const [call, f, key] of cases) {
    const e = await rejects<JobInputInvalidError>(t, f, JobInputInvalidError, 'JOB_INPUT_INVALID', call);
    t.regex(e.message, new RegExp(`unknown key '${key}'`), `${call} names '${key}'`);
  }
  t.deepEqual(await o.listJobRuns({ tenantId: 'a' }), before, 'nothing was canceled, replayed or moved');
  t.deepEqual(await o.listSchedules({ tenantId: 'a' }), [], 'no schedule was stored');
  // The same calls with their own keys work.
  t.is((await o.findById(parent.id, { tenantId: 'a' }))?.id, parent.id);
  await o.cancel(parent.id, { tenantId: 'a', cascade: false, reason: 'r' });
  t.is((await o.waitForRun(parent.id, { tenantId: 'a', timeoutMs: 1000 })).status, 'canceled');
});

test('start options given as a class instance are read as properties (getters included); its unknown own keys are refused', async (t) => {
  const o = new JobOrchestrator({ multiTenant: true, clock: 'manual', loggerFactory: () => ({ log() {}, warn() {}, error() {}, debug() {} }) });
  o.registerHandler('k', {}, async () => ({}));
  const later = new Date(o.now().getTime() + 60_000);
  class Opts {
    get runAt() {
      return later;
    }
    get tenantId() {
      return 'a';
    }
    priority = 4;
  }
  const run = await o.start('k', {}, new Opts() as never);
  t.is(run.runAt.getTime(), later.getTime());
  t.is(run.tenantId, 'a');
  t.is(run.priority, 4);
  t.deepEqual(await o.findById(run.id, { tenantId: 'a' }), run);
  class Typo extends Opts {
    priorty = 1;
  }
  const e = await rejects<JobInputInvalidError>(t, () => o.start('k', {}, new Typo() as never), JobInputInvalidError, 'JOB_INPUT_INVALID', 'typo');
  t.regex(e.message, /unknown key 'priorty'/);
});
