// Every shape of `start` answers the row the engine stores. In memory most
// starts are answered before the engine has them (buffered) and the rest
// answered the short way (the engine says only what it decided); both rows
// are built from the engine's template of the type, so a default decided
// by the engine and a value chosen by the caller must both come out as the
// engine stores them. Checked against findById after the hand-over.
import test from 'ava';
import { JobInputInvalidError, JobOrchestrator } from '../dist';
import type { JobRun, StartOptions } from '../dist';
import { forBackends } from './backends';
import { silentLogger } from './helpers';

type Shape = [string, string, Record<string, unknown> | undefined, StartOptions | undefined];

function register(o: JobOrchestrator) {
  o.registerHandler('plain', {}, async () => undefined);
  o.registerHandler('pooled', { pool: 'p2', retry: { attempts: 3, backoff: 'fixed', baseMs: 1 } }, async () => undefined);
  o.registerHandler('laned', { concurrency: { key: 'c:{{k}}', collisionMode: 'queue' } }, async () => undefined);
  o.registerHandler('fnLaned', { concurrency: { key: (i: { k: number }) => `f${i.k}`, collisionMode: 'queue' } }, async () => undefined);
  o.registerHandler('deduped', { dedupe: { key: 'd:{{k}}', windowMs: 60_000 } }, async () => undefined);
  o.registerHandler('scoped', { scope: { entity: 'order', from: (i: { k: number }) => `o${i.k}` } }, async () => undefined);
}

function shapes(parentId: string, tenant: string | null | undefined): Shape[] {
  const t = tenant === undefined ? {} : { tenantId: tenant };
  return [
    ['plain', 'plain', { n: 1 }, tenant === undefined ? undefined : t],
    ['no input', 'plain', undefined, tenant === undefined ? undefined : t],
    ['priority', 'plain', { n: 2 }, { ...t, priority: -3 }],
    ['scope', 'plain', { n: 3 }, { ...t, scope: { entityType: 'order', entityId: 'o1' } }],
    ['runAt', 'plain', { n: 4 }, { ...t, runAt: new Date(Date.now() + 60_000) }],
    ['runAt in the past', 'plain', { n: 5 }, { ...t, runAt: new Date(Date.now() - 60_000) }],
    ['pool', 'pooled', { n: 6 }, { ...t, pool: 'other' }],
    ['tags and trigger', 'plain', { n: 7 }, { ...t, tags: { a: 'b' }, triggerSource: 'event', triggerRef: 'ev-1' }],
    ['close policy', 'plain', { n: 8 }, { ...t, parentClosePolicy: 'abandon' }],
    ['every option', 'pooled', { n: 9, nested: { x: [1, 2] } }, {
      ...t, priority: 7, scope: { entityType: 'e', entityId: 'i' }, runAt: new Date(Date.now() + 1000), pool: 'q',
      tags: { x: 'y' }, triggerSource: 'schedule', triggerRef: 'r', parentClosePolicy: 'cancel',
    }],
    ['meta scope', 'scoped', { k: 4 }, tenant === undefined ? undefined : t],
    ['child', 'plain', { n: 10 }, { ...t, parentRunId: parentId }],
    ['child without tenant', 'plain', { n: 11 }, { parentRunId: parentId }],
    ['concurrency key', 'laned', { k: 1 }, tenant === undefined ? undefined : t],
    ['concurrency key, same lane', 'laned', { k: 1 }, tenant === undefined ? undefined : t],
    ['function key', 'fnLaned', { k: 2 }, { ...t, priority: 1 }],
    ['dedupe key', 'deduped', { k: 1 }, tenant === undefined ? undefined : t],
    ['dedupe hit', 'deduped', { k: 1 }, tenant === undefined ? undefined : t],
  ];
}

async function checkShapes(t: import('ava').ExecutionContext, o: JobOrchestrator, tenant: string | null | undefined) {
  const parent = await o.start('plain', { parent: true }, tenant === undefined ? undefined : { tenantId: tenant });
  const answered: [string, JobRun][] = [];
  for (const [name, type, input, opts] of shapes(parent.id, tenant)) {
    answered.push([name, await o.start(type, input, opts)]);
  }
  for (const [name, row] of answered) {
    const stored = await o.findById(row.id, tenant === undefined ? undefined : { tenantId: row.tenantId });
    t.deepEqual(row, stored, name);
  }
  const lane = answered.filter(([n]) => n.startsWith('concurrency key')).map(([, r]) => r);
  t.is(lane[0]!.concurrencyKey, 'c:1');
  t.is(answered.find(([n]) => n === 'function key')![1].concurrencyKey, 'f2');
  const [hit, first] = [answered.find(([n]) => n === 'dedupe hit')![1], answered.find(([n]) => n === 'dedupe key')![1]];
  t.is(hit.id, first.id, 'the dedupe hit answers the existing run');
  const child = answered.find(([n]) => n === 'child without tenant')![1];
  t.is(child.rootRunId, parent.id);
  t.is(child.tenantId, parent.tenantId, 'a child without a tenant gets its parent’s');
}

forBackends('every start shape answers the row the engine stores (single tenant)', async (t, make) => {
  const o = await make({ logger: silentLogger });
  register(o);
  await checkShapes(t, o, undefined);
});

forBackends('every start shape answers the row the engine stores (multi-tenant)', async (t, make) => {
  for (const tenant of ['acme', null]) {
    const o = await make({ logger: silentLogger, multiTenant: true });
    register(o);
    await checkShapes(t, o, tenant);
  }
});

test('a start answered before the engine has it is run by an idle worker at once, or at its runAt', async (t) => {
  const o = new JobOrchestrator({ logger: silentLogger, loggerFactory: () => silentLogger });
  const started: Record<string, number> = {};
  o.registerHandler('x', {}, async (ctx) => {
    started[(ctx.input as { name: string }).name] = Date.now();
  });
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } } });
  t.teardown(() => w.stop());
  await new Promise((r) => setTimeout(r, 20));
  const t0 = Date.now();
  const now = await o.start('x', { name: 'now' }, { priority: 1 });
  const later = await o.start('x', { name: 'later' }, { runAt: new Date(t0 + 80) });
  await o.waitForRun(now.id, { timeoutMs: 2000 });
  await o.waitForRun(later.id, { timeoutMs: 2000 });
  t.true(started.now! - t0 < 40, `ran ${started.now! - t0} ms after its start`);
  t.true(started.later! >= t0 + 80, 'not before its runAt');
  t.true(started.later! - (t0 + 80) < 60, `ran ${started.later! - (t0 + 80)} ms after its runAt`);
});

forBackends('an unknown start option (a typo) is a JobInputInvalidError naming it, and nothing is stored', async (t, make) => {
  const o = await make({ logger: silentLogger });
  register(o);
  for (const [type, opts] of [
    ['plain', { priorty: 3 }],
    ['plain', { priority: 1, runat: new Date() }],
    ['laned', { tenant: 'acme' }],
  ] as [string, Record<string, unknown>][]) {
    const key = Object.keys(opts).find((k) => k !== 'priority')!;
    const err = await t.throwsAsync(o.start(type, { k: 1 }, opts as StartOptions), { instanceOf: JobInputInvalidError });
    t.regex(err!.message, new RegExp(`'${key}'`), `names '${key}'`);
  }
  // An option given as undefined is an option not given.
  const run = await o.start('plain', { n: 1 }, { priority: undefined, runAt: undefined });
  t.is(run.priority, 0);
  const page = await o.countByPoolAndStatus();
  t.is(page.reduce((s, c) => s + c.count, 0), 1, 'only the valid start was stored');
});
