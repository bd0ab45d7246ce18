// Edges of the start paths found by a review of the restructuring: a start
// answered in JS must be one the engine accepts (else the caller holds a
// row for a run that never exists), and the rows answered the short way
// must say what the engine stored.
import test from 'ava';
import { JobInputInvalidError, JobOrchestrator } from '../dist';
import type { StartOptions } from '../dist';
import { forBackends } from './backends';
import { silentLogger } from './helpers';

const LONE = 'a\ud83d'; // an emoji cut in half

forBackends('a lone surrogate in any start option is refused with its name, and nothing is stored', async (t, make) => {
  const errors: unknown[] = [];
  const o = await make({ logger: { ...silentLogger, error: (...a: unknown[]) => errors.push(a) } });
  o.registerHandler('t', {}, async () => undefined);
  o.registerHandler('scoped', { scope: { entity: 'order', from: () => LONE } }, async () => undefined);
  const cases: [string, string, StartOptions | undefined, RegExp][] = [
    ['triggerRef', 't', { triggerRef: LONE }, /triggerRef/],
    ['pool', 't', { pool: LONE }, /pool/],
    ['scope', 't', { scope: { entityType: 'order', entityId: LONE } }, /scope\.entityId/],
    ['tag value', 't', { tags: { k: LONE } }, /tag 'k'/],
    ['tag name', 't', { tags: { [LONE]: 'v' } }, /tag name/],
    ['meta scope', 'scoped', undefined, /scope entity id/],
  ];
  for (const [name, type, opts, message] of cases) {
    const err = await t.throwsAsync(o.start(type, {}, opts), { instanceOf: JobInputInvalidError }, name);
    t.regex(err!.message, message, name);
  }
  t.deepEqual((await o.listJobRuns({})).items, [], 'no run was stored');
  t.deepEqual(errors, [], 'nothing was refused behind the caller’s back');
});

forBackends('a job type cut inside a character is refused by name at registration, start, startMany and schedule; nothing is stored', async (t, make) => {
  const o = await make.manual();
  o.registerHandler('a\ufffd', {}, async () => undefined); // what napi would have made of it
  const said = /job type must not hold a lone surrogate/;
  t.throws(() => o.registerHandler(LONE, {}, async () => undefined), { instanceOf: JobInputInvalidError, message: said });
  await t.throwsAsync(o.start('a\ud800', {}), { instanceOf: JobInputInvalidError, message: said });
  await t.throwsAsync(o.start('a\ud800', {}, { priority: 1 }), { instanceOf: JobInputInvalidError, message: said });
  await t.throwsAsync(o.startMany([{ type: 'a\ud800' }]), { instanceOf: JobInputInvalidError, message: /^entries\[0\]: .*job type must not hold a lone surrogate/ });
  await t.throwsAsync(o.schedule('s', { jobType: 'a\ud800', everyMs: 1_000 }), { instanceOf: JobInputInvalidError, message: said });
  t.deepEqual((await o.listJobRuns({})).items, [], 'no run was stored');
  t.deepEqual(await o.listSchedules(), [], 'no schedule was stored');
});

// A lone surrogate has no UTF-8 form: crossing into Rust it became U+FFFD,
// so a call gated to 'A\ud800' (a tenant no run can have: its starts are
// refused) read and canceled the runs of tenant 'A\ufffd'. Every call now
// refuses it, as a start does, and changes nothing.
forBackends('multi-tenant: a lone surrogate in tenantId is refused by every call; the U+FFFD tenant is not reached', async (t, make) => {
  const o = await make({ multiTenant: true, logger: silentLogger });
  o.registerHandler('t', {}, async () => undefined);
  const other = { tenantId: 'A\ufffd' };
  const run = await o.start('t', {}, { ...other, scope: { entityType: 'E', entityId: '1' } });
  const T = { tenantId: 'A\ud800' };
  const calls: [string, () => Promise<unknown>][] = [
    ['start', () => o.start('t', {}, T)],
    ['startMany', () => o.startMany([{ type: 't', opts: T }])],
    ['findById', () => o.findById(run.id, T)],
    ['getRun', () => o.getRun(run.id, T.tenantId)],
    ['getRunTree', () => o.getRunTree(run.id, T)],
    ['listJobRuns', () => o.listJobRuns(T)],
    ['listForScope', () => o.listForScope('E', '1', T)],
    ['countRuns', () => o.countRuns(T.tenantId)],
    ['countByPoolAndStatus', () => o.countByPoolAndStatus(T.tenantId)],
    ['listRecentFailed', () => o.listRecentFailed(10, T.tenantId)],
    ['listSteps', () => o.listSteps(run.id, T)],
    ['findStep', () => o.findStep(run.id, 's', T)],
    ['listRunEvents', () => o.listRunEvents(run.id, T)],
    ['throughput', () => o.throughput(T)],
    ['cancel', () => o.cancel(run.id, T)],
    ['cancelForScope', () => o.cancelForScope('E', '1', T)],
    ['rescheduleForScope', () => o.rescheduleForScope('E', '1', new Date(Date.now() + 60_000), T)],
    ['replay', () => o.replay(run.id, T)],
    ['signal', () => o.signal(run.id, 'go', null, T)],
    ['resume', () => o.resume('jft_x', null, T)],
    ['recordStep', () => o.recordStep({ jobRunId: run.id, stepId: 's', status: 'completed' }, T)],
    ['waitForRun', () => o.waitForRun(run.id, { ...T, timeoutMs: 100 })],
    ['schedule', () => o.schedule('s', { jobType: 't', everyMs: 60_000, ...T })],
    ['unschedule', () => o.unschedule('s', T)],
    ['listSchedules', () => o.listSchedules(T)],
  ];
  for (const [name, call] of calls) {
    await t.throwsAsync(call(), { instanceOf: JobInputInvalidError, message: /tenantId/ }, name);
  }
  const after = await o.findById(run.id, other);
  t.deepEqual([after?.status, after?.runAt], ['pending', run.runAt], 'the U+FFFD tenant\'s run is untouched');
  t.is(await o.countRuns(other.tenantId), 1);
});

test('a Date whose class answers a time the engine cannot take is refused, not answered and lost', async (t) => {
  class Shifty extends Date {
    override getTime(): number {
      return 1.5;
    }
  }
  const o = new JobOrchestrator({ logger: silentLogger });
  o.registerHandler('t', {}, async () => undefined);
  await t.throwsAsync(o.start('t', {}, { runAt: new Shifty() }), { instanceOf: JobInputInvalidError, message: /runAt/ });
  t.deepEqual((await o.listJobRuns({})).items, []);
});

forBackends('a child answered the short way names its parent as stored, however the caller spelled the id', async (t, make) => {
  const o = await make({ logger: silentLogger });
  o.registerHandler('t', {}, async () => undefined);
  const parent = await o.start('t', {});
  const hex = parent.id.replace(/-/g, '');
  for (const spelling of [parent.id.toUpperCase(), hex, `{${parent.id}}`, `urn:uuid:${parent.id}`]) {
    const child = await o.start('t', {}, { parentRunId: spelling });
    t.is(child.parentRunId, parent.id, spelling);
    t.deepEqual(child, await o.findById(child.id), spelling);
  }
});
