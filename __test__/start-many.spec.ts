// `startMany`: many starts in one transaction, all or none, every rule in
// entry order exactly as that many sequential `start` calls would apply
// them (checked against sequential starts on a fresh store), and on
// PostgreSQL concurrent single starts grouped into one transaction, each
// still answered (or refused) on its own.
import test from 'ava';
import type { ExecutionContext } from 'ava';
import {
  JobCollisionError,
  JobInputInvalidError,
  JobOrchestrator,
  JobTypeNotFoundError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from '../dist';
import type { JobRun, StartEntry } from '../dist';
import { forBackends, PG_URL, postgresOnly, type Make } from './backends';

const RUN_AT = new Date('2030-01-01T00:00:00.000Z');

function register(o: JobOrchestrator) {
  o.registerHandler('plain', {}, async () => undefined);
  o.registerHandler('pooled', { pool: 'p2' }, async () => undefined);
  o.registerHandler('laned', { concurrency: { key: 'c:{{k}}', collisionMode: 'queue' } }, async () => undefined);
  o.registerHandler('replacing', { concurrency: { key: 'r:{{k}}', collisionMode: 'replace' } }, async () => undefined);
  o.registerHandler('rejecting', { concurrency: { key: 'x:{{k}}', collisionMode: 'reject' } }, async () => undefined);
  o.registerHandler('fnLaned', { concurrency: { key: (i: { k: number }) => `f${i.k}`, collisionMode: 'queue' } }, async () => undefined);
  o.registerHandler('throwing', { dedupe: { key: () => { throw new Error('no key'); }, windowMs: 1000 } }, async () => undefined);
  o.registerHandler('deduped', { dedupe: { key: 'd:{{k}}', windowMs: 60_000 } }, async () => undefined);
  o.registerHandler('scoped', { scope: { entity: 'order', from: (i: { k: number }) => `o${i.k}` } }, async () => undefined);
}

/** A mix of every shape a start can have; `t` the tenant options (multi-tenant), `parent` a run made before. */
function entries(parent: string, t: { tenantId?: string | null }, other: { tenantId?: string | null }): StartEntry[] {
  return [
    { type: 'plain', input: { n: 1 }, opts: { ...t } },
    { type: 'plain', opts: { ...t, priority: 5 } },
    { type: 'pooled', input: { n: 2 }, opts: { ...t, pool: 'other' } },
    { type: 'plain', input: { n: 3 }, opts: { ...t, runAt: RUN_AT } },
    { type: 'plain', input: { n: 4 }, opts: { ...t, scope: { entityType: 'order', entityId: 'o1' }, tags: { a: 'b' } } },
    { type: 'laned', input: { k: 1 }, opts: { ...t } },
    { type: 'plain', input: { n: 5 }, opts: { ...t, priority: -1 } },
    { type: 'laned', input: { k: 1 }, opts: { ...t, priority: 9 } },
    { type: 'deduped', input: { k: 1 }, opts: { ...t } }, // onto the run made before the batch
    { type: 'deduped', input: { k: 2 }, opts: { ...t } },
    { type: 'deduped', input: { k: 2 }, opts: { ...t } }, // onto entry 9
    { type: 'deduped', input: { k: 2 }, opts: { ...other } }, // another tenant: its own run
    { type: 'replacing', input: { k: 1 }, opts: { ...t } },
    { type: 'replacing', input: { k: 1 }, opts: { ...t } }, // cancels entry 12
    { type: 'fnLaned', input: { k: 3 }, opts: { ...t } },
    { type: 'scoped', input: { k: 4 }, opts: { ...t } },
    { type: 'plain', input: { n: 6 }, opts: { parentRunId: parent, parentClosePolicy: 'abandon' } },
    { type: 'laned', input: { k: 2 }, opts: { ...other } },
  ];
}

/** A store with a parent run and a dedupe target made before the entries. */
async function prepared(make: Make, multiTenant: boolean) {
  const o = await make.manual({ multiTenant });
  register(o);
  const t = multiTenant ? { tenantId: 'a' } : {};
  const parent = await o.start('plain', { parent: true }, t);
  const existing = await o.start('deduped', { k: 1 }, t);
  return { o, parent, existing, t };
}

/**
 * Rows with every id replaced by a label (`P`, `E`, `#<entry>`) and every
 * time but `RUN_AT` by its distance from `base` (each store's manual clock
 * started when it was made), so two stores' rows compare.
 */
function labelled(rows: (JobRun | null)[], labels: Map<string, string>, base: Date): unknown[] {
  const label = (id: string) => {
    if (!labels.has(id)) labels.set(id, `#${labels.size}`);
    return labels.get(id)!;
  };
  return rows.map((r) => {
    if (r === null) return null;
    const text = JSON.stringify(r)
      .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g, label)
      .replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/g, (d) => (d === RUN_AT.toISOString() ? d : `t+${Date.parse(d) - base.getTime()}`));
    return JSON.parse(text) as unknown;
  });
}

/** The runs every pool hands out, in claim order, until none is claimable. */
async function claimOrder(o: JobOrchestrator): Promise<string[]> {
  const out: string[] = [];
  for (const pool of ['batch', 'other', 'p2']) {
    for (;;) {
      const r = await o.claimNext(pool);
      if (r === null) break;
      out.push(r.id);
    }
  }
  return out;
}

async function differential(t: ExecutionContext, make: Make, multiTenant: boolean) {
  const batch = await prepared(make, multiTenant);
  const seq = await prepared(make, multiTenant);
  const other = multiTenant ? { tenantId: 'b' } : {};
  const many = await batch.o.startMany(entries(batch.parent.id, batch.t, other));
  const one: JobRun[] = [];
  for (const e of entries(seq.parent.id, seq.t, other)) one.push(await seq.o.start(e.type, e.input, e.opts));
  t.is(many.length, one.length);
  const label = (s: typeof batch) => new Map([[s.parent.id, 'P'], [s.existing.id, 'E']]);
  const lb = label(batch);
  const ls = label(seq);
  // The answers, then every run as stored afterwards, then the claim order.
  t.deepEqual(labelled(many, lb, batch.parent.createdAt), labelled(one, ls, seq.parent.createdAt));
  const reread = async (s: typeof batch, rows: JobRun[]) =>
    Promise.all([s.parent, s.existing, ...rows].map((r) => s.o.findById(r.id, { tenantId: r.tenantId })));
  t.deepEqual(labelled(await reread(batch, many), lb, batch.parent.createdAt), labelled(await reread(seq, one), ls, seq.parent.createdAt));
  const order = async (s: typeof batch, labels: Map<string, string>) => (await claimOrder(s.o)).map((id) => labels.get(id));
  t.deepEqual(await order(batch, lb), await order(seq, ls));
  // What the mix is there for.
  t.is(many[8]!.id, batch.existing.id, 'deduped onto a run made before');
  t.is(many[10]!.id, many[9]!.id, 'deduped onto an earlier entry');
  if (multiTenant) t.not(many[11]!.id, many[9]!.id, "another tenant's key is its own");
  else t.is(many[11]!.id, many[9]!.id);
  t.is((await batch.o.findById(many[12]!.id, { tenantId: many[12]!.tenantId }))!.status, 'canceled');
  if (multiTenant) t.deepEqual([many[0]!.tenantId, many[11]!.tenantId, many[16]!.tenantId], ['a', 'b', 'a']);
}

forBackends('startMany equals the same starts made one after the other', async (t, make) => {
  await differential(t, make, false);
});

forBackends('startMany equals sequential starts under the tenant gate', async (t, make) => {
  await differential(t, make, true);
});

forBackends('startMany answers in entry order; [] for no entries', async (t, make) => {
  const o = await make.manual();
  register(o);
  t.deepEqual(await o.startMany([]), []);
  const runs = await o.startMany(Array.from({ length: 50 }, (_, i) => ({ type: i % 2 ? 'plain' : 'pooled', input: { i } })));
  t.deepEqual(runs.map((r) => (r.input as { i: number }).i), Array.from({ length: 50 }, (_, i) => i));
  for (const r of runs) t.deepEqual(await o.findById(r.id), r);
  t.is(await o.countRuns(), 50);
});

/** Calls `startMany` with a bad entry at `k` and checks that nothing was stored. */
async function refused(t: ExecutionContext, o: JobOrchestrator, list: unknown, k: number | null, cls: new (...a: never[]) => Error, tenant?: string | null) {
  const before = await o.countRuns(tenant);
  const e = await t.throwsAsync(o.startMany(list as StartEntry[]), { instanceOf: cls });
  if (k !== null) t.true(e!.message.startsWith(`entries[${k}]: `), e!.message);
  t.is(await o.countRuns(tenant), before, 'nothing stored');
}

forBackends('startMany stores nothing when entry k is bad, and names k', async (t, make) => {
  const o = await make.manual();
  register(o);
  const incumbent = await o.start('replacing', { k: 7 });
  const ok = (i: number): StartEntry => ({ type: 'plain', input: { i } });
  // Refused by the engine: an unknown type, a lane an earlier entry took, a bad parent.
  await refused(t, o, [ok(0), ok(1), ok(2), { type: 'nope', input: {} }], 3, JobTypeNotFoundError);
  await refused(t, o, [ok(0), { type: 'rejecting', input: { k: 1 } }, { type: 'rejecting', input: { k: 1 } }], 2, JobCollisionError);
  await refused(t, o, [{ type: 'replacing', input: { k: 7 } }, ok(1), { type: 'plain', opts: { parentRunId: '00000000-0000-4000-8000-000000000000' } }], 2, ParentRunNotFoundError);
  // The replace of entry 0 was undone with the rest.
  t.is((await o.findById(incumbent.id))!.status, 'pending');
  // Refused before the engine: bad options, a key function that throws.
  await refused(t, o, [ok(0), { type: 'plain', opts: { priority: 1.5 } }], 1, JobInputInvalidError);
  await refused(t, o, [ok(0), ok(1), { type: 'throwing', input: {} }], 2, JobInputInvalidError);
  await refused(t, o, [ok(0), { type: 'plain', input: { bad: 1n } }], 1, JobInputInvalidError);
  // Too many entries: the batch as a whole.
  await refused(t, o, Array.from({ length: 10_001 }, (_, i) => ok(i)), null, JobInputInvalidError);
  t.is(await o.countRuns(), 1);
  t.is((await o.claimNext('batch'))!.id, incumbent.id);
  t.is(await o.claimNext('batch'), null);
});

forBackends('startMany refuses what is not an array of entries', async (t, make) => {
  const o = await make.manual();
  register(o);
  for (const bad of [undefined, null, 'plain', 5, { type: 'plain' }]) await refused(t, o, bad, null, JobInputInvalidError);
  const ok = { type: 'plain', input: {} };
  for (const [entry, k] of [[null, 1], ['plain', 1], [[], 1], [{ type: 5 }, 1], [{ type: 'plain', optz: {} }, 1], [{ type: 'plain', opts: 'x' }, 1]] as const) {
    await refused(t, o, [ok, entry], k, JobInputInvalidError);
  }
  t.is(await o.countRuns(), 0);
});

forBackends('startMany honours the tenant gate per entry', async (t, make) => {
  const o = await make.manual({ multiTenant: true });
  register(o);
  await refused(t, o, [{ type: 'plain', opts: { tenantId: 'a' } }, { type: 'plain' }], 1, MissingTenantIdError, 'a');
  const [a, b, n] = await o.startMany([
    { type: 'laned', input: { k: 1 }, opts: { tenantId: 'a' } },
    { type: 'laned', input: { k: 1 }, opts: { tenantId: 'b' } },
    { type: 'plain', opts: { tenantId: null } },
  ]);
  t.deepEqual([a!.tenantId, b!.tenantId, n!.tenantId], ['a', 'b', null]);
  // Lanes are per tenant: both heads claimable.
  const claimed = [(await o.claimNext('batch'))!.id, (await o.claimNext('batch'))!.id, (await o.claimNext('batch'))!.id].sort();
  t.deepEqual(claimed, [a!.id, b!.id, n!.id].sort());
  t.is(await o.findById(a!.id, { tenantId: 'b' }), null);
});

// An earlier entry's `replace` cancels a run in the batch's transaction:
// a later entry must see it canceled. On PostgreSQL the dedupe and lane
// reads went to the table before the cancel was written, so the second
// start answered with the canceled run (nothing created), and a `reject`
// named the canceled run as its incumbent. Each as a batch and as starts
// made in one turn of the event loop (which PostgreSQL groups).
forBackends('startMany and grouped starts: a run an earlier start replaced is no dedupe hit and no incumbent', async (t, make) => {
  const o = await make.manual();
  const done = async () => undefined;
  o.registerHandler('sm.E', { dedupe: { key: 'x', windowMs: 10_000 }, concurrency: { key: 'L', collisionMode: 'queue' } }, done);
  o.registerHandler('sm.D', { concurrency: { key: 'L', collisionMode: 'replace' } }, done);
  o.registerHandler('sm.A', { concurrency: { key: 'L', collisionMode: 'reject' } }, done);
  for (const grouped of [false, true]) {
    const e1 = await o.start('sm.E', { n: 1 });
    const pair = grouped
      ? await Promise.all([o.start('sm.D', { n: 2 }), o.start('sm.E', { n: 3 })])
      : await o.startMany([
          { type: 'sm.D', input: { n: 2 } },
          { type: 'sm.E', input: { n: 3 } },
        ]);
    t.is((await o.findById(e1.id))?.status, 'canceled', 'replaced');
    t.not(pair[1].id, e1.id, 'the canceled run is no dedupe hit');
    t.deepEqual([pair[1].input, pair[1].status], [{ n: 3 }, 'pending']);
    t.is((await o.findById(pair[1].id))?.status, 'pending', 'created');
    const refused = await (grouped
      ? Promise.all([o.start('sm.D', { n: 4 }), o.start('sm.A', { n: 5 }).catch((e: unknown) => e)]).then((r) => r[1])
      : o.startMany([
          { type: 'sm.D', input: { n: 4 } },
          { type: 'sm.A', input: { n: 5 } },
        ]).catch((e: unknown) => e));
    t.true(refused instanceof JobCollisionError, String(refused));
    const incumbent = (refused as JobCollisionError).incumbent as JobRun | undefined;
    t.is(incumbent?.status, 'pending', 'the incumbent is a live run of the lane');
    t.not(incumbent?.id, pair[0].id, 'not the run the batch\'s replace canceled');
    // The next round starts with an empty lane.
    for (const r of (await o.listJobRuns({ limit: 500 })).items) if (r.status === 'pending') await o.cancel(r.runId);
  }
});

forBackends('startMany: a batch joins a lane in entry order behind a running run', async (t, make) => {
  const o = await make.manual();
  register(o);
  const head = await o.start('laned', { k: 1 });
  t.is((await o.claimNext('batch'))!.id, head.id);
  const runs = await o.startMany([0, 1, 2].map((i) => ({ type: 'laned', input: { k: 1, i }, opts: { priority: i } })));
  t.is(await o.claimNext('batch'), null, 'the lane is busy');
  await o.cancel(head.id);
  const order: string[] = [];
  for (let r = await o.claimNext('batch'); r !== null; r = await o.claimNext('batch')) {
    order.push(r.id);
    await o.cancel(r.id);
  }
  t.deepEqual(order, runs.map((r) => r.id));
});

// PostgreSQL only: grouping concurrent starts into one transaction is the
// networked store's (memory answers starts on the JS thread, one by one).
type PgClient = { connect(): Promise<void>; query(q: string, v?: unknown[]): Promise<{ rows: { x: string }[] }>; end(): Promise<void> };
// eslint-disable-next-line @typescript-eslint/no-require-imports
const pgClient = (): PgClient => new (require('pg') as { Client: new (o: object) => PgClient }).Client({ connectionString: PG_URL });

/** The distinct transaction ids (`xmin`) that wrote these runs. */
async function writers(schema: string, ids: string[]): Promise<string[]> {
  const c = pgClient();
  await c.connect();
  try {
    const { rows } = await c.query(`SELECT DISTINCT xmin::text AS x FROM "${schema}".job_run WHERE id = ANY($1::uuid[])`, [ids]);
    return rows.map((r) => r.x);
  } finally {
    await c.end();
  }
}

let schemas = 0;
/** An orchestrator on a schema this test names (to read its rows with a client), dropped after it closed. */
async function onSchema(t: ExecutionContext, make: Make, groupStarts: boolean): Promise<{ o: JobOrchestrator; schema: string }> {
  const schema = `jf_sm_${process.pid}_${++schemas}`;
  // Registered first: runs after the orchestrator's own teardown closed it.
  t.teardown(async () => {
    const c = pgClient();
    await c.connect();
    await c.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await c.end();
  });
  const o = await make.system({ postgres: { url: PG_URL, schema, groupStarts } });
  register(o);
  return { o, schema };
}

async function concurrentStarts(o: JobOrchestrator) {
  return Promise.allSettled([
    o.start('plain', { n: 1 }),
    o.start('rejecting', { k: 1 }),
    o.start('deduped', { k: 5 }),
    o.start('plain', {}, { parentRunId: '00000000-0000-4000-8000-000000000000' }),
    o.start('deduped', { k: 5 }),
    o.start('nope', {}),
    o.start('laned', { k: 1 }, { priority: 3 }),
  ]);
}

// PostgreSQL only: grouping concurrent starts into one transaction is the
// networked store's (memory answers starts on the JS thread, one by one).
postgresOnly('concurrent starts share one transaction; a refused one fails alone', async (t, make) => {
  const { o, schema } = await onSchema(t, make, true);
  const holder = await o.start('rejecting', { k: 1 });
  const settled = await concurrentStarts(o);
  const kinds = settled.map((s) => (s.status === 'fulfilled' ? 'ok' : (s.reason as Error).name));
  t.deepEqual(kinds, ['ok', 'JobCollisionError', 'ok', 'ParentRunNotFoundError', 'ok', 'JobTypeNotFoundError', 'ok']);
  const rows = settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  t.is(rows[2]!.id, rows[1]!.id, 'the later start dedupes onto the earlier one of its group');
  for (const r of rows) t.deepEqual(await o.findById(r.id), r);
  const ids = [...new Set(rows.map((r) => r.id))];
  t.is((await writers(schema, ids)).length, 1, 'one transaction for the group');
  t.not((await writers(schema, [holder.id]))[0], (await writers(schema, ids))[0]);
});

postgresOnly('grouped starts answer the rows single starts answer (groupStarts: false)', async (t, make) => {
  const grouped = await onSchema(t, make, true);
  const single = await onSchema(t, make, false);
  const answers = async (x: { o: JobOrchestrator }) => {
    await x.o.start('rejecting', { k: 1 });
    const settled = await concurrentStarts(x.o);
    return settled.map((s) => (s.status === 'fulfilled' ? s.value : (s.reason as Error).name));
  };
  const g = await answers(grouped);
  const s = await answers(single);
  const strip = (v: JobRun | string) => (typeof v === 'string' ? v : { ...v, id: null, rootRunId: null, createdAt: null, updatedAt: null, runAt: null });
  t.deepEqual(g.map(strip), s.map(strip));
  const ids = (v: (JobRun | string)[]) => [...new Set(v.flatMap((r) => (typeof r === 'string' ? [] : [r.id])))];
  t.true((await writers(single.schema, ids(s))).length > 1, 'without grouping, one transaction per start');
});

postgresOnly('close() lets the starts made before it go in', async (t, make) => {
  const { o, schema } = await onSchema(t, make, true);
  const started = [o.start('plain', { n: 1 }), o.start('plain', { n: 2 })];
  await o.close();
  const runs = await Promise.all(started);
  t.is((await writers(schema, runs.map((r) => r.id))).length, 1);
});
