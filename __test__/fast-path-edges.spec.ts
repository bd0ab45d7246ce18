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

test('multi-tenant: a lone surrogate in tenantId is refused at start; queries treat it as U+FFFD, as napi did', async (t) => {
  const o = new JobOrchestrator({ multiTenant: true, logger: silentLogger });
  o.registerHandler('t', {}, async () => undefined);
  await t.throwsAsync(o.start('t', {}, { tenantId: LONE }), { instanceOf: JobInputInvalidError, message: /tenantId/ });
  t.is(await o.findById('x\ud800', { tenantId: LONE }), null);
  t.deepEqual(await o.listSteps('\udc00', { tenantId: null }), []);
  await o.cancel(`run\ud800`, { tenantId: 'a' });
  t.deepEqual(await o.countByPoolAndStatus(LONE), []);
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
