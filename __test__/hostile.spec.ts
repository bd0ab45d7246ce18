/**
 * Hostile input and misbehaving handlers. Every case must end in a typed
 * error or a documented clamp/normalisation, must leave the store as it
 * was (checked with a follow-up findById / countByPoolAndStatus /
 * claimNext), and must leave the process alive (a healthy run still
 * completes afterwards; AVA fails the file on any uncaught exception or
 * unhandled rejection).
 *
 * Cases that bad-input.spec.ts already asserts identically (plain cyclic
 * inputs, functions/symbols/BigInt/NaN/Map inputs, `runAt` invalid Date /
 * string / number, integer priority beyond i32, `dedupe.windowMs: -1`,
 * unknown ids for tick/replay/findById/listSteps/cancel, the tenant gate)
 * are not repeated; each row of the table below still has its own test here,
 * with the variants bad-input.spec.ts does not cover.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { randomUUID } from 'node:crypto';
import {
  JobInputInvalidError,
  JobOrchestrator,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepConflictError,
  JobTemplateFieldMissingError,
  ParentRunNotFoundError,
} from '../dist';
import type { JobContext, JobRun, PoolStatusCount, WorkerHandle, WorkerOptions } from '../dist';
import { forBackends } from './backends';
import { deferred, manual, realSleep, rejects, system, waitFor } from './helpers';

const noop = async () => ({ ok: true });
const silentish = { log() {}, error() {}, warn() {}, debug() {} };

function nestObj(levels: number): unknown {
  let v: unknown = { leaf: true };
  for (let i = 1; i < levels; i++) v = { c: v };
  return v;
}

function nestArr(levels: number): unknown {
  let v: unknown = ['leaf'];
  for (let i = 1; i < levels; i++) v = [v];
  return v;
}

/** Depth of nested objects/arrays (a scalar is 0, `{}` is 1). */
function depthOf(v: unknown): number {
  let d = 0;
  let cur = v;
  while (cur !== null && typeof cur === 'object') {
    d++;
    const o = cur as Record<string, unknown> | unknown[];
    cur = Array.isArray(o) ? o[0] : (o.c ?? o.d);
  }
  return d;
}

const countsMap = (rows: PoolStatusCount[]): Record<string, number> =>
  Object.fromEntries(rows.filter((c) => c.count > 0).map((c) => [`${c.pool}/${c.status}`, c.count]));

/**
 * A manual-clock orchestrator (rows do not drift with time) with types
 * `plain`, `laned` (reject lane `{{k}}`), `deduped` (`{{k}}`, 1 h) and one
 * pending `plain` run `known` that no bad call may touch.
 */
async function fixture(opts: { multiTenant?: boolean } = {}) {
  const o = manual({ multiTenant: opts.multiTenant });
  const tenant = opts.multiTenant ? { tenantId: 'A' } : {};
  o.registerHandler('plain', {}, noop);
  o.registerHandler('laned', { concurrency: { key: '{{k}}', collisionMode: 'reject' } }, noop);
  o.registerHandler('deduped', { dedupe: { key: '{{k}}', windowMs: 3_600_000 } }, noop);
  const known = await o.start('plain', { n: 1 }, { priority: 100, ...tenant });
  const row0 = await o.findById(known.id, tenant);
  const counts0 = await o.countByPoolAndStatus(opts.multiTenant ? 'A' : undefined);
  /** The known row and the per-pool counts are exactly as before. */
  const unchanged = async (t: ExecutionContext, label: string) => {
    t.deepEqual(await o.findById(known.id, tenant), row0, `${label}: the known run changed`);
    t.deepEqual(await o.countByPoolAndStatus(opts.multiTenant ? 'A' : undefined), counts0, `${label}: run counts changed`);
  };
  /** Nothing else was created: the pool yields `known` and then nothing. */
  const onlyKnownClaimable = async (t: ExecutionContext) => {
    t.is((await o.claimNext('batch'))?.id, known.id);
    t.is(await o.claimNext('batch'), null, 'a bad call left a claimable run behind');
  };
  return { o, known, tenant, unchanged, onlyKnownClaimable };
}

/** Starts a worker stopped at the end of the test. */
function startW(t: ExecutionContext, o: JobOrchestrator, opts: WorkerOptions = {}): WorkerHandle {
  const w = o.startWorker({ shutdownTimeoutMs: 100, ...opts });
  t.teardown(() => w.stop());
  return w;
}

/** After the misbehaving cases: the same worker still completes a healthy run. */
async function stillHealthy(t: ExecutionContext, o: JobOrchestrator) {
  if (!o.getHandlerRegistration('healthy')) o.registerHandler('healthy', {}, async (ctx) => ({ echo: ctx.input }));
  const r = await o.start('healthy', { n: 42 });
  const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
  t.is(done.status, 'completed', 'a healthy run after the misbehaving ones');
  t.deepEqual(done.output, { echo: { n: 42 } });
}

// ═══ hostile input ═══════════════════════════════════════════════════════

// ── cyclic input ──────────────────────────────────────────────────────────

test('cyclic input in tags, in a Date.toJSON result, in spawnChild and in recordStep: JobInputInvalidError, nothing created', async (t) => {
  const f = await fixture();
  const cyc: Record<string, unknown> = { k: 'a' };
  cyc.self = cyc;
  const d = new Date(0);
  (d as unknown as { toJSON: () => unknown }).toJSON = () => cyc;
  const cases: [string, () => Promise<unknown>][] = [
    ['cyclic tags', () => f.o.start('laned', { k: 'a' }, { tags: cyc as unknown as Record<string, string> })],
    ['cycle behind Date.toJSON', () => f.o.start('deduped', { k: 'a', d })],
    ['cycle behind an array of arrays', () => {
      const arr: unknown[] = [[[]]];
      ((arr[0] as unknown[])[0] as unknown[]).push(arr);
      return f.o.start('plain', { k: 'a', arr });
    }],
    ['recordStep input', () => f.o.recordStep({ jobRunId: f.known.id, stepId: 's', status: 'completed', input: cyc })],
    ['recordStep output', () => f.o.recordStep({ jobRunId: f.known.id, stepId: 's', status: 'completed', output: cyc })],
  ];
  for (const [label, call] of cases) {
    const e = await rejects<JobInputInvalidError>(t, call, JobInputInvalidError, 'JOB_INPUT_INVALID', label);
    t.true(e.reason.length > 0, `${label}: reason`);
    await f.unchanged(t, label);
  }
  t.deepEqual(await f.o.listSteps(f.known.id), [], 'no step was recorded');
  await f.onlyKnownClaimable(t);
});

test('a shared (acyclic) reference is not a cycle: accepted and stored twice', async (t) => {
  const o = manual();
  o.registerHandler('plain', {}, noop);
  const shared = { v: [1, 2, 3] };
  const r = await o.start('plain', { a: shared, b: shared, list: [shared, shared] });
  t.deepEqual((await o.findById(r.id))!.input, { a: shared, b: shared, list: [shared, shared] });
});

test('a handler spawning a child with a cyclic input gets JobInputInvalidError, no child is created, the parent completes', async (t) => {
  const o = system();
  const cyc: Record<string, unknown> = {};
  cyc.self = cyc;
  let caught: unknown;
  o.registerHandler('child', {}, noop);
  o.registerHandler('parent', {}, async (ctx) => {
    try {
      await ctx.spawnChild('child', cyc);
    } catch (e) {
      caught = e;
    }
    return { spawned: false };
  });
  startW(t, o);
  const p = await o.start('parent', {});
  const done = await o.waitForRun(p.id, { timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.true(caught instanceof JobInputInvalidError, `spawnChild rejected with ${String(caught)}`);
  const tree = await o.getRunTree(p.id);
  t.deepEqual(tree?.children, [], 'no child run exists');
  t.deepEqual(countsMap(await o.countByPoolAndStatus()), { 'batch/completed': 1 });
});

// ── deep nesting ──────────────────────────────────────────────────────────

test('deep nesting: 1,000 levels are accepted and round-trip (findById, ctx.input, output); 1,001+ is JobInputInvalidError', async (t) => {
  const o = system();
  let seen: unknown;
  o.registerHandler('echo', {}, async (ctx) => {
    seen = ctx.input;
    return ctx.input;
  });
  for (const [label, make] of [
    ['objects', nestObj],
    ['arrays', nestArr],
  ] as const) {
    const ok = make(1000);
    t.is(depthOf(ok), 1000);
    const r = await o.start('echo', ok);
    t.deepEqual((await o.findById(r.id))!.input, ok, `${label}: 1,000 levels round-trip through findById`);
    for (const levels of [1001, 1002, 5000, 100_000]) {
      const e = await rejects<JobInputInvalidError>(
        t,
        () => o.start('echo', make(levels)),
        JobInputInvalidError,
        'JOB_INPUT_INVALID',
        `${label}: ${levels} levels`,
      );
      t.regex(e.reason, /1000 levels/);
    }
    // Mixed: an object holding a 1,000-deep array is 1,001 deep.
    await rejects(t, () => o.start('echo', { a: nestArr(1000) }), JobInputInvalidError, 'JOB_INPUT_INVALID', `${label}: 1 + 1,000`);
    t.truthy(await o.start('echo', { a: nestArr(999) }), `${label}: 1 + 999 is accepted`);
  }
  const before = countsMap(await o.countByPoolAndStatus());
  t.deepEqual(before, { 'batch/pending': 4 }, 'only the accepted inputs created runs');
  // Through the worker: the handler sees the 1,000-deep input and may return it.
  const w = startW(t, o, { pools: { batch: { concurrency: 1 } } });
  const deep = nestObj(1000);
  const r = await o.start('echo', deep);
  const done = await o.waitForRun(r.id, { timeoutMs: 10_000 });
  t.is(done.status, 'completed');
  t.deepEqual(seen, deep);
  t.deepEqual(done.output, deep, 'a 1,000-deep output is accepted');
  await w.stop();
});

test('deep nesting: a handler output nesting 1,001 levels fails the run (typed reason), the process lives', async (t) => {
  const o = system();
  o.registerHandler('deep-out', {}, async () => nestObj(1001));
  o.registerHandler('very-deep-out', {}, async () => nestArr(200_000));
  startW(t, o);
  for (const type of ['deep-out', 'very-deep-out']) {
    const r = await o.start(type, {});
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'failed', type);
    t.is(done.output, null, type);
    t.regex(done.error!.message, /handler output nests deeper than 1000 levels/, type);
  }
  await stillHealthy(t, o);
});

// Discrepancy (see report): the depth check treats a Date as a leaf, but
// JSON.stringify calls its toJSON, which can return anything. The input is
// stored 1,002 levels deep although README says deeper than 1,000 is a
// JobInputInvalidError.
test('deep nesting: a Date whose toJSON returns a 1,001-level value is JobInputInvalidError too', async (t) => {
  const f = await fixture();
  const d = new Date(0);
  (d as unknown as { toJSON: () => unknown }).toJSON = () => nestObj(1001);
  await rejects(t, () => f.o.start('plain', { d }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'deep toJSON');
  await f.unchanged(t, 'deep toJSON');
  await f.onlyKnownClaimable(t);
});

// An array's own toJSON (or an object's non-enumerable one) was not
// walked: JSON wrote what it returned unchecked, a 3,000-level value past
// the 1,000-level limit, as an input, a handler output and a step output.
test('deep nesting: an array with its own toJSON, or an object with a hidden one, is refused wherever a value is checked', async (t) => {
  const f = await fixture();
  const sneakyArray = Object.assign([], { toJSON: () => nestObj(3000) });
  const hidden = Object.defineProperty({ a: 1 }, 'toJSON', { value: () => nestObj(3000), enumerable: false });
  await rejects(t, () => f.o.start('plain', { x: sneakyArray }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'array toJSON');
  await rejects(t, () => f.o.start('plain', { x: hidden }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'hidden toJSON');
  // A flat object (strings and numbers only) with a hidden one: its fast path checks it too.
  const flatHidden = Object.defineProperty({ a: 1 }, 'toJSON', { value: () => ({ big: NaN }), enumerable: false });
  await rejects(t, () => f.o.start('plain', { x: 1 }, { tags: flatHidden as never }), JobInputInvalidError, 'JOB_INPUT_INVALID', 'flat hidden toJSON (tags)');
  await f.unchanged(t, 'toJSON');
  const o = manual();
  let stepError: unknown = null;
  o.registerHandler('out', {}, async (ctx: JobContext<unknown>) => {
    await ctx.step('s', () => sneakyArray).catch((e: unknown) => (stepError = e));
    return ctx.input && (ctx.input as { flat?: boolean }).flat ? flatHidden : sneakyArray;
  });
  const r = await o.start('out', {});
  await o.claimNext('batch');
  await o.tick(r.id);
  t.true(stepError instanceof JobInputInvalidError, String(stepError));
  const done = await o.findById(r.id);
  t.is(done?.status, 'failed');
  t.regex(done?.error?.message ?? '', /own toJSON/);
  const flat = await o.start('out', { flat: true });
  await o.claimNext('batch');
  await o.tick(flat.id);
  const flatDone = await o.findById(flat.id);
  t.is(flatDone?.status, 'failed', 'a flat output with a hidden toJSON');
  t.regex(flatDone?.error?.message ?? '', /own toJSON/);
});

// ── huge input ────────────────────────────────────────────────────────────

test.serial('huge input: a 50 MB string inside an object is accepted and round-trips exactly, within a few seconds', async (t) => {
  t.timeout(120_000);
  const o = system();
  let sameInHandler: boolean | undefined;
  const unit = 'ab"\\\n\u00e9\u4e2d\u0000\ud83d\ude00xyz'; // quote, backslash, newline, non-ASCII, NUL, astral
  const MB50 = 50 * 1024 * 1024;
  const s = unit.repeat(Math.ceil(MB50 / unit.length)).slice(0, MB50);
  t.is(s.length, MB50);
  o.registerHandler('huge', {}, async (ctx) => {
    sameInHandler = (ctx.input as { s: string }).s === s;
    return { len: (ctx.input as { s: string }).s.length };
  });
  let t0 = Date.now();
  const r = await o.start('huge', { s, tail: 1 });
  const startMs = Date.now() - t0;
  t0 = Date.now();
  const back = await o.findById(r.id);
  const findMs = Date.now() - t0;
  t.true((back!.input as { s: string }).s === s, 'the 50 MB string round-trips exactly');
  t.is((back!.input as { tail: number }).tail, 1);
  t0 = Date.now();
  startW(t, o);
  const done = await o.waitForRun(r.id, { timeoutMs: 60_000 });
  const workerMs = Date.now() - t0;
  t.log(`50 MB input: start ${startMs} ms, findById ${findMs} ms, worker round trip ${workerMs} ms`);
  t.is(done.status, 'completed');
  t.true(sameInHandler, 'the handler saw the exact string');
  t.deepEqual(done.output, { len: MB50 });
  // "A few seconds": alone on this 2-core machine about 1.4 s / 0.6 s / 1.8 s;
  // up to 3.6 s / 1.5 s / 6.2 s with another test file running beside it.
  t.true(startMs < 6000, `start took ${startMs} ms`);
  t.true(findMs < 6000, `findById took ${findMs} ms`);
  t.true(workerMs < 12_000, `worker round trip took ${workerMs} ms`);
  t.deepEqual(countsMap(await o.countByPoolAndStatus()), { 'batch/completed': 1 }, 'exactly one run');
});

// ── non-JSON inputs ───────────────────────────────────────────────────────

test('non-JSON inputs beyond the basic table (getters, proxies, toJSON, boxed values, Error, RegExp, typed arrays): JobInputInvalidError, nothing created', async (t) => {
  const f = await fixture();
  const throwingGetter = { k: 'a' };
  Object.defineProperty(throwingGetter, 'x', {
    enumerable: true,
    get() {
      throw new Error('getter boom');
    },
  });
  // A nested getter that is JSON on the first read and a BigInt on the
  // second (the check and the serialisation read it separately). A flat
  // object's getters are read once ("flat inputs" below).
  let reads = 0;
  const flipping = { k: 'a', inner: {} };
  Object.defineProperty(flipping.inner, 'x', { enumerable: true, get: () => (reads++ === 0 ? 'ok' : 10n) });
  // A getter that returns a fresh object each time: infinitely deep.
  const bottomless: Record<string, unknown> = { k: 'a' };
  const mk = (): Record<string, unknown> => {
    const o: Record<string, unknown> = {};
    Object.defineProperty(o, 'next', { enumerable: true, get: mk });
    return o;
  };
  Object.defineProperty(bottomless, 'next', { enumerable: true, get: mk });
  const bigDate = new Date(0);
  (bigDate as unknown as { toJSON: () => unknown }).toJSON = () => 10n;
  const cases: [string, unknown][] = [
    ['throwing getter', throwingGetter],
    ['nested getter JSON then BigInt', flipping],
    ['getter returning fresh objects forever', bottomless],
    ['proxy with throwing ownKeys', new Proxy({ k: 'a' }, { ownKeys: () => { throw new Error('ownKeys boom'); } })],
    ['proxy with throwing get', new Proxy({ k: 'a' }, { get: () => { throw new Error('get boom'); } })],
    ['own toJSON function', { k: 'a', toJSON: () => ({ k: 'b' }) }],
    ['Date whose toJSON returns a BigInt', { k: 'a', d: bigDate }],
    ['boxed string', { k: 'a', s: new String('x') }],
    ['boxed number', { k: 'a', n: new Number(1) }],
    ['Uint8Array', { k: 'a', b: new Uint8Array(4) }],
    ['ArrayBuffer', { k: 'a', b: new ArrayBuffer(4) }],
    ['Error instance', { k: 'a', e: new Error('x') }],
    ['RegExp', { k: 'a', r: /x/g }],
    ['Promise', { k: 'a', p: Promise.resolve(1) }],
    ['WeakMap', { k: 'a', w: new WeakMap() }],
    ['top-level function with own k', Object.assign(() => 1, { k: 'a' })],
  ];
  for (const type of ['plain', 'laned', 'deduped']) {
    for (const [label, input] of cases) {
      reads = 0;
      const e = await rejects<JobInputInvalidError>(
        t,
        () => f.o.start(type, input),
        JobInputInvalidError,
        'JOB_INPUT_INVALID',
        `${type}: ${label}`,
      );
      t.true(e.reason.length > 0);
      await f.unchanged(t, `${type}: ${label}`);
    }
  }
  // No lane `a` and no dedupe entry `a` was left behind.
  const lane = await f.o.start('laned', { k: 'a' });
  const dd = await f.o.start('deduped', { k: 'a', fresh: true });
  t.deepEqual(dd.input, { k: 'a', fresh: true });
  t.is((await f.o.claimNext('batch'))?.id, f.known.id);
  t.is((await f.o.claimNext('batch'))?.id, lane.id);
  t.is((await f.o.claimNext('batch'))?.id, dd.id);
  t.is(await f.o.claimNext('batch'), null);
});

test('JSON-representable oddities are normalised as JSON does and round-trip through the worker (NUL, lone surrogates, -0, holes, symbol keys)', async (t) => {
  const o = system();
  const seen: unknown[] = [];
  o.registerHandler('echo', {}, async (ctx) => {
    seen.push(ctx.input);
    return ctx.input;
  });
  startW(t, o);
  const cases: [string, unknown, unknown][] = [
    // The worker's ticket uses NUL as a separator: NUL inside JSON must not break it.
    ['NUL in keys and values', { 'a\0b': 'c\0d', '\0': ['\0\0'] }, { 'a\0b': 'c\0d', '\0': ['\0\0'] }],
    ['lone surrogates', { s: '\ud800', t: 'x\udc00y', ['\udbff']: 1 }, { s: '\ud800', t: 'x\udc00y', ['\udbff']: 1 }],
    ['-0 becomes 0', { z: -0, list: [-0] }, { z: 0, list: [0] }],
    // eslint-disable-next-line no-sparse-arrays
    ['holes and undefined in arrays become null', { a: [1, , 3, undefined] }, { a: [1, null, 3, null] }],
    ['undefined properties are dropped', { a: 1, b: undefined }, { a: 1 }],
    ['symbol keys are dropped', { a: 1, [Symbol('s')]: 2 }, { a: 1 }],
    ['extreme numbers', { big: 1e308, tiny: 5e-324, unsafe: 2 ** 60 }, { big: 1e308, tiny: 5e-324, unsafe: 2 ** 60 }],
    ['null-prototype object', Object.assign(Object.create(null), { a: 1 }), { a: 1 }],
    ['a valid Date becomes its ISO string', { d: new Date(0) }, { d: '1970-01-01T00:00:00.000Z' }],
    ['a scalar input is kept', 'just a string', 'just a string'],
  ];
  for (const [label, input, expected] of cases) {
    seen.length = 0;
    const r = await o.start('echo', input);
    t.deepEqual(r.input, expected, `${label}: start row`);
    t.deepEqual((await o.findById(r.id))!.input, expected, `${label}: findById`);
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'completed', label);
    t.deepEqual(seen, [expected], `${label}: ctx.input`);
    t.deepEqual(done.output, expected, `${label}: output`);
  }
  t.deepEqual(countsMap(await o.countByPoolAndStatus()), { 'batch/completed': cases.length });
});

test('flat inputs: the row, the stored run and the engine see exactly what JSON keeps (escapes, surrogates, integer keys, getters read once, inherited keys dropped)', async (t) => {
  const o = manual();
  o.registerHandler('flat', {}, noop);
  // Plain starts of flat objects take a one-pass path in JS; every case
  // must match what JSON.stringify / JSON.parse make of the input.
  let reads = 0;
  const withGetter = { a: 1 } as Record<string, unknown>;
  Object.defineProperty(withGetter, 'g', { enumerable: true, get: () => ++reads });
  const hidden = { a: 1 };
  Object.defineProperty(hidden, 'h', { enumerable: false, value: 2 });
  const chars = ['"', '\\', '\n', '\t', '\u0001', '\u001f', '\u007f', '\u2028', 'é', '€', '😀', '\ud800', '\udfff', 'x\udc00y', '\ud83d'];
  const cases: [string, Record<string, unknown>][] = [
    ['empty', {}],
    ['every scalar kind', { s: 'text', n: 42, f: -1.5e-7, big: 1e21, t: true, fa: false, z: null }],
    ['integer-like keys come first, ascending', { b: 1, 10: 'ten', 2: 'two', a: 'a', '-1': 'neg', '01': 'lead' }],
    ['characters JSON escapes, in values', Object.fromEntries(chars.map((c, i) => [`k${i}`, `a${c}b`]))],
    ['characters JSON escapes, in keys', Object.fromEntries(chars.map((c, i) => [`${c}${i}`, i]))],
    ['a getter', withGetter],
    ['a non-enumerable property', hidden],
  ];
  for (const [label, input] of cases) {
    const expected = JSON.parse(JSON.stringify(input)) as unknown;
    reads = 0; // JSON.stringify just read the getter
    const r = await o.start('flat', input);
    t.deepEqual(r.input, expected, `${label}: start row`);
    t.not(r.input, input, `${label}: the row holds a copy`);
    t.deepEqual((await o.findById(r.id))!.input, expected, `${label}: stored`);
    if (label === 'a getter') t.is(reads, 1, 'the getter is read once per start');
  }
  // An enumerable property on Object.prototype is inherited by every
  // object: JSON ignores it, and so must the row.
  Object.defineProperty(Object.prototype, 'polluted', { value: 'yes', enumerable: true, configurable: true });
  let r: JobRun;
  try {
    r = await o.start('flat', { a: 1 });
  } finally {
    delete (Object.prototype as Record<string, unknown>).polluted;
  }
  t.false(Object.prototype.hasOwnProperty.call(r.input, 'polluted'), 'an inherited key is not copied into the row');
  t.deepEqual({ ...(r.input as object) }, { a: 1 });
  t.deepEqual({ ...((await o.findById(r.id))!.input as object) }, { a: 1 });
  // A mutation of the input after start changes neither row.
  const mutable: Record<string, unknown> = { a: 1 };
  const m = await o.start('flat', mutable);
  mutable.a = 2;
  mutable.b = 3;
  t.deepEqual(m.input, { a: 1 });
  t.deepEqual((await o.findById(m.id))!.input, { a: 1 });
});

// ── invalid dates ─────────────────────────────────────────────────────────

test('runAt: the extreme valid Dates and Date subclasses are accepted and claim in order; a Date with an own getTime returning NaN or null runAt is rejected', async (t) => {
  const f = await fixture();
  const bad: [string, unknown][] = [
    ['getTime → NaN', Object.assign(new Date(0), { getTime: () => NaN })],
    ['null', null],
    ['Date beyond the range', new Date(8.64e15 + 1)],
  ];
  for (const [label, runAt] of bad) {
    await rejects(t, () => f.o.start('laned', { k: 'a' }, { runAt: runAt as Date }), JobInputInvalidError, 'JOB_INPUT_INVALID', label);
    await f.unchanged(t, label);
  }
  class MyDate extends Date {}
  const min = await f.o.start('plain', { n: 'min' }, { runAt: new Date(-8.64e15), priority: 100 });
  const sub = await f.o.start('plain', { n: 'sub' }, { runAt: new MyDate(0), priority: 100 });
  const max = await f.o.start('plain', { n: 'max' }, { runAt: new Date(8.64e15), priority: 100 });
  t.is(min.runAt.getTime(), -8.64e15);
  t.is(sub.runAt.getTime(), 0);
  t.is(max.runAt.getTime(), 8.64e15);
  // Priority ties: earliest runAt first; the max-date run is not due.
  t.is((await f.o.claimNext('batch'))?.id, min.id);
  t.is((await f.o.claimNext('batch'))?.id, sub.id);
  t.is((await f.o.claimNext('batch'))?.id, f.known.id);
  t.is(await f.o.claimNext('batch'), null);
  t.is((await f.o.findById(max.id))?.status, 'pending');
});

// Discrepancy (see report): an object that passes `instanceof Date` but is
// not a real Date makes `getTime()` throw a plain TypeError ("this is not a
// Date object.") from start, rescheduleForScope, listJobRuns and recordStep.
test('runAt/newRunAt/since/startedAt that is a fake Date (Object.create(Date.prototype)): JobInputInvalidError', async (t) => {
  const f = await fixture();
  const fake = Object.create(Date.prototype) as Date;
  const calls: [string, () => Promise<unknown>][] = [
    ['start runAt', () => f.o.start('plain', {}, { runAt: fake })],
    ['rescheduleForScope', () => f.o.rescheduleForScope('acct', '1', fake)],
    ['listJobRuns since', () => f.o.listJobRuns({ since: fake })],
    ['recordStep startedAt', () => f.o.recordStep({ jobRunId: f.known.id, stepId: 's', status: 'completed', startedAt: fake })],
  ];
  for (const [label, call] of calls) {
    await rejects(t, call, JobInputInvalidError, 'JOB_INPUT_INVALID', label);
    await f.unchanged(t, label);
  }
  await f.onlyKnownClaimable(t);
});

// ── priorities ────────────────────────────────────────────────────────────

test('priority: negative integers are valid and order below 0; NaN/-Infinity/below i32/fractions are JobInputInvalidError; -0 is 0', async (t) => {
  const f = await fixture();
  for (const [label, p] of [
    ['NaN', NaN],
    ['-Infinity', -Infinity],
    ['-0.5', -0.5],
    ['below i32', -(2 ** 31) - 1],
    ['-1e300', -1e300],
  ] as const) {
    for (const type of ['plain', 'laned', 'deduped']) {
      await rejects(t, () => f.o.start(type, { k: 'a' }, { priority: p }), JobInputInvalidError, 'JOB_INPUT_INVALID', `${type} priority ${label}`);
      await f.unchanged(t, `${type} priority ${label}`);
    }
  }
  const mk = (p: number) => f.o.start('plain', { p }, { priority: p });
  const zero = await mk(0);
  const minus1 = await mk(-1);
  const min = await mk(-(2 ** 31));
  const minus100 = await mk(-100);
  const negZero = await mk(-0);
  const five = await mk(5);
  t.is(minus1.priority, -1);
  t.is(min.priority, -(2 ** 31));
  t.true(Object.is(negZero.priority, 0), '-0 is stored as 0');
  const order: string[] = [];
  for (let r; (r = await f.o.claimNext('batch')); ) order.push(r.id);
  t.deepEqual(order, [f.known.id, five.id, zero.id, negZero.id, minus1.id, minus100.id, min.id]);
});

// ── dedupe windows at registration ───────────────────────────────────────

test('dedupe windowMs negative, fractional, out of range or not a number at registration: JobInputInvalidError, the old definition stays', async (t) => {
  const o = manual();
  o.registerHandler('dd', { dedupe: { key: '{{k}}', windowMs: 60_000 } }, noop);
  const def = await o.getDefinition('dd');
  for (const [label, w] of [
    ['-0.5', -0.5],
    ['-1e12', -1e12],
    ['1.5', 1.5],
    ['2^63', 2 ** 63],
    ['string', '100'],
    ['object', { ms: 1 }],
    ['array', [100]],
    ['boolean', true],
  ] as const) {
    await rejects(
      t,
      () => o.registerHandler('dd', { dedupe: { key: '{{k}}', windowMs: w as number } }, noop),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      `windowMs ${label}`,
    );
    t.deepEqual(await o.getDefinition('dd'), def, `windowMs ${label}: definition changed`);
    await rejects(
      t,
      () => o.registerHandler(`fresh ${label}`, { dedupe: { key: '{{k}}', windowMs: w as number } }, noop),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      `fresh type, windowMs ${label}`,
    );
    t.is(await o.getDefinition(`fresh ${label}`), null);
  }
  // Dedupe still works with the original window.
  const a = await o.start('dd', { k: 'x' });
  t.is((await o.start('dd', { k: 'x' })).id, a.id);
  t.is((await o.claimNext('batch'))?.id, a.id);
  t.is(await o.claimNext('batch'), null);
});

// Discrepancy (see report): NaN and -Infinity serialise to JSON null, which
// the engine reads as "no window": the registration succeeds and dedupe is
// silently off (dedupeWindowMs null) instead of a typed error.
test('dedupe windowMs NaN or -Infinity at registration: JobInputInvalidError, no definition', async (t) => {
  const o = manual();
  for (const [label, w] of [
    ['NaN', NaN],
    ['-Infinity', -Infinity],
  ] as const) {
    const type = `dd ${label}`;
    await rejects(
      t,
      () => o.registerHandler(type, { dedupe: { key: '{{k}}', windowMs: w } }, noop),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      `windowMs ${label}`,
    );
    t.is(await o.getDefinition(type), null, `windowMs ${label}: a definition was created`);
  }
});

// Discrepancy (see report): Infinity is stored as dedupeWindowMs null, so a
// definition that asks for an unbounded window does not dedupe at all.
test('dedupe windowMs Infinity: either a typed error or a window that dedupes', async (t) => {
  const o = manual();
  try {
    o.registerHandler('dd', { dedupe: { key: '{{k}}', windowMs: Infinity } }, noop);
  } catch (e) {
    t.true(e instanceof JobInputInvalidError);
    return;
  }
  const a = await o.start('dd', { k: 'x' });
  o.advanceTime(365 * 24 * 3_600_000);
  t.is((await o.start('dd', { k: 'x' })).id, a.id, 'a second start inside an infinite window must return the first run');
});

// Discrepancy (see report): same JSON-null path for timeoutMs: NaN is
// accepted and stored as "no timeout".
test('timeoutMs NaN at registration: JobInputInvalidError, no definition', async (t) => {
  const o = manual();
  await rejects(t, () => o.registerHandler('t', { timeoutMs: NaN }, noop), JobInputInvalidError, 'JOB_INPUT_INVALID', 'timeoutMs NaN');
  t.is(await o.getDefinition('t'), null);
});

// ── template injection ────────────────────────────────────────────────────

test('template injection: {{__proto__}}, {{constructor}} and other inherited names count only as own fields', async (t) => {
  const f = await fixture();
  const names = ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf', 'prototype'];
  for (const name of names) {
    f.o.registerHandler(`cc.${name}`, { concurrency: { key: `x{{${name}}}y`, collisionMode: 'reject' } }, noop);
    f.o.registerHandler(`dd.${name}`, { dedupe: { key: `{{${name}}}`, windowMs: 60_000 } }, noop);
  }
  // Inputs lacking the own field: JobTemplateFieldMissingError, nothing created.
  const lacking: [string, () => unknown][] = [
    ['{}', () => ({})],
    ['{a: 1}', () => ({ a: 1 })],
    ['null-prototype {}', () => Object.create(null)],
    ['object with a polluted-looking own key', () => ({ ['__proto__x']: 'no' })],
  ];
  for (const name of names) {
    for (const [label, input] of lacking) {
      for (const [type, template] of [
        [`cc.${name}`, `x{{${name}}}y`],
        [`dd.${name}`, `{{${name}}}`],
      ]) {
        const e = await rejects<JobTemplateFieldMissingError>(
          t,
          () => f.o.start(type!, input()),
          JobTemplateFieldMissingError,
          'JOB_TEMPLATE_FIELD_MISSING',
          `${type} ${label}`,
        );
        t.is(e.template, template);
        t.is(e.field, name);
        await f.unchanged(t, `${type} ${label}`);
      }
    }
  }
  // Own keys (as JSON.parse creates them) render like any field.
  const protoInput = JSON.parse('{"__proto__":"x"}') as Record<string, unknown>;
  t.true(Object.prototype.hasOwnProperty.call(protoInput, '__proto__'));
  const p = await f.o.start('cc.__proto__', protoInput);
  t.is(p.concurrencyKey, 'xxy');
  t.true(Object.prototype.hasOwnProperty.call(p.input, '__proto__'), 'the own __proto__ key is kept in the row');
  t.is((p.input as Record<string, unknown>)['__proto__'], 'x');
  const stored = (await f.o.findById(p.id))!;
  t.is(Object.getOwnPropertyDescriptor(stored.input, '__proto__')?.value, 'x');
  const pd = await f.o.start('dd.__proto__', JSON.parse('{"__proto__":"x"}'));
  t.is(pd.dedupeKey, 'x');
  t.is((await f.o.start('dd.__proto__', JSON.parse('{"__proto__":"x"}'))).id, pd.id, 'dedupe on the own __proto__ key');
  const c = await f.o.start('cc.constructor', { constructor: 'c' });
  t.is(c.concurrencyKey, 'xcy');
  // A value that looks like a template is used verbatim, never expanded again.
  const lit = await f.o.start('cc.toString', { toString: '{{__proto__}}}{{' });
  t.is(lit.concurrencyKey, 'x{{__proto__}}}{{y');
  // Nothing got polluted.
  t.is(({} as Record<string, unknown>).x, undefined);
  t.is(Object.getPrototypeOf({}), Object.prototype);
  t.is(typeof ({} as { toString: unknown }).toString, 'function');
  t.deepEqual(countsMap(await f.o.countByPoolAndStatus()), { 'batch/pending': 5 }, 'known + the four started on purpose');
});

// ── unknown ids ───────────────────────────────────────────────────────────

test('unknown and hostile run ids in the other run-service calls: null / [] / 0 / JobRunNotFoundError, nothing changed', async (t) => {
  const f = await fixture();
  const ids = [randomUUID(), 'nope', '', '__proto__', 'constructor', 'a\0b', 'x'.repeat(1_000_000), `${f.known.id}\0`, ` ${f.known.id}`];
  for (const id of ids) {
    const label = `id ${JSON.stringify(id.slice(0, 40))}${id.length > 40 ? '…' : ''}`;
    t.is(await f.o.getRunTree(id), null, `getRunTree ${label}`);
    t.is(await f.o.findStep(id, 's'), null, `findStep ${label}`);
    t.deepEqual((await f.o.listJobRuns({ rootRunId: id })).items, [], `listJobRuns rootRunId ${label}`);
    const e = await rejects<JobRunNotFoundError>(
      t,
      () => f.o.recordStep({ jobRunId: id, stepId: 's', status: 'completed', output: { x: 1 } }),
      JobRunNotFoundError,
      'JOB_RUN_NOT_FOUND',
      `recordStep ${label}`,
    );
    t.is(e.runId, id);
    await rejects(t, () => f.o.waitForRun(id, { timeoutMs: 10 }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', `waitForRun ${label}`);
    await rejects(t, () => f.o.start('plain', {}, { parentRunId: id }), ParentRunNotFoundError, 'PARENT_RUN_NOT_FOUND', `parent ${label}`);
    t.is(await f.o.cancelForScope('run', id), 0);
    await f.unchanged(t, label);
  }
  for (const cursor of ['garbage', '', '{}', 'eyJ4IjoxfQ==', '\0']) {
    await rejects(t, () => f.o.listJobRuns({ cursor }), JobInputInvalidError, 'JOB_INPUT_INVALID', `cursor ${JSON.stringify(cursor)}`);
  }
  t.deepEqual(await f.o.listSteps(f.known.id), [], 'no step was written to the known run');
  await f.onlyKnownClaimable(t);
});

// Discrepancy (see report): run ids are parsed as UUIDs, so other spellings
// of a run's id (upper case, braces, no hyphens, urn:uuid:) find the run in
// findById/cancel. waitForRun keys its waiter by the string it was given and
// events carry the canonical id, so waiting on such a spelling of a live run
// never resolves (JobWaitTimeoutError although the run completed).
test('waitForRun with another spelling of a live run id resolves when the run ends (or the spelling is unknown)', async (t) => {
  const o = system();
  const gate = deferred();
  o.registerHandler('gated', {}, async () => {
    await gate.promise;
    return { done: true };
  });
  startW(t, o);
  const r = await o.start('gated', {});
  for (const spelling of [r.id.toUpperCase(), `{${r.id}}`, r.id.replace(/-/g, ''), `urn:uuid:${r.id}`]) {
    const found = await o.findById(spelling);
    const wait = o.waitForRun(spelling, { timeoutMs: 2000 });
    if (found === null) {
      await rejects(t, () => wait, JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', spelling);
      continue;
    }
    t.is(found.id, r.id);
    gate.resolve();
    const done = await wait;
    t.is(done.status, 'completed', spelling);
  }
});

// ── wrong tenants ─────────────────────────────────────────────────────────

test('wrong tenants: waitForRun, findStep, getRunTree, cursors and cancel of a running run under another tenant see or change nothing', async (t) => {
  const o = system({ multiTenant: true });
  const gate = deferred();
  let signal: AbortSignal | undefined;
  o.registerHandler('gated', {}, async (ctx) => {
    signal = ctx.signal;
    const out = await ctx.step('s', async () => ({ step: 1 }));
    await gate.promise;
    return out;
  });
  o.registerHandler('plain', {}, noop);
  const a = await o.start('gated', {}, { tenantId: 'A' });
  const a2 = await o.start('plain', {}, { tenantId: 'A', runAt: new Date(Date.now() + 3_600_000) });
  startW(t, o);
  await waitFor(async () => (await o.findStep(a.id, 's', { tenantId: 'A' }))?.status === 'completed', 'A is running past its step');
  const countsA = await o.countByPoolAndStatus('A');
  for (const other of ['B', null, '', 'a', '__proto__', 'A\0']) {
    const label = `tenant ${JSON.stringify(other)}`;
    await rejects(t, () => o.waitForRun(a.id, { tenantId: other, timeoutMs: 10 }), JobRunNotFoundError, 'JOB_RUN_NOT_FOUND', `waitForRun as ${label}`);
    t.is(await o.findStep(a.id, 's', { tenantId: other }), null, `findStep as ${label}`);
    t.is(await o.getRunTree(a.id, { tenantId: other }), null, `getRunTree as ${label}`);
    t.deepEqual((await o.listJobRuns({ tenantId: other })).items, [], `listJobRuns as ${label}`);
    await o.cancel(a.id, { tenantId: other });
    await o.cancel(a2.id, { tenantId: other });
    t.is(await o.cancelForScope('run', a.id, { tenantId: other }), 0);
    t.false(signal!.aborted, `cancel as ${label} aborted A's running attempt`);
  }
  // A's cursor, replayed by B, still shows B nothing.
  const pageA = await o.listJobRuns({ tenantId: 'A', limit: 1 });
  t.is(pageA.items.length, 1);
  t.truthy(pageA.nextCursor);
  t.deepEqual((await o.listJobRuns({ tenantId: 'B', cursor: pageA.nextCursor! })).items, []);
  t.deepEqual(await o.countByPoolAndStatus('A'), countsA, "A's counts changed");
  t.is((await o.findById(a2.id, { tenantId: 'A' }))?.status, 'pending');
  gate.resolve();
  const done = await o.waitForRun(a.id, { tenantId: 'A', timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { step: 1 });
  t.deepEqual(await o.countByPoolAndStatus('B'), []);
});

test('wrong tenants: a tenantId that is not a string in start is JobInputInvalidError, nothing created', async (t) => {
  const f = await fixture({ multiTenant: true });
  for (const tenantId of [5, {}, [], true, ['A']]) {
    await rejects(
      t,
      () => f.o.start('plain', {}, { tenantId: tenantId as unknown as string }),
      JobInputInvalidError,
      'JOB_INPUT_INVALID',
      `start tenantId ${JSON.stringify(tenantId)}`,
    );
    await f.unchanged(t, `start tenantId ${JSON.stringify(tenantId)}`);
  }
  t.deepEqual(await f.o.countByPoolAndStatus(null), []);
  await f.onlyKnownClaimable(t);
});

// Discrepancy (see report): queries and cancel pass a non-string tenantId
// straight to napi, which throws an untyped Error ("Failed to convert
// JavaScript value `Number 5 ` into rust type `String`").
test('wrong tenants: a tenantId that is not a string in queries and cancel is a typed error', async (t) => {
  const f = await fixture({ multiTenant: true });
  for (const tenantId of [5, {}]) {
    const tid = tenantId as unknown as string;
    const calls: [string, () => Promise<unknown>][] = [
      ['findById', () => f.o.findById(f.known.id, { tenantId: tid })],
      ['listSteps', () => f.o.listSteps(f.known.id, { tenantId: tid })],
      ['cancel', () => f.o.cancel(f.known.id, { tenantId: tid })],
      ['countByPoolAndStatus', () => f.o.countByPoolAndStatus(tid)],
      ['listJobRuns', () => f.o.listJobRuns({ tenantId: tid })],
      ['listForScope', () => f.o.listForScope('a', 'b', { tenantId: tid })],
    ];
    for (const [label, call] of calls) {
      await rejects(t, call, JobInputInvalidError, 'JOB_INPUT_INVALID', `${label} tenantId ${JSON.stringify(tenantId)}`);
      await f.unchanged(t, label);
    }
  }
});

// ═══ misbehaving handlers (through the worker) ══════════════════════════

test('a synchronous throw (Error, string, null, a throwing getter on the error) fails the run with a defined error; the worker goes on', async (t) => {
  const o = system();
  const hostileError = new Error('hostile');
  Object.defineProperty(hostileError, 'name', {
    get() {
      throw new Error('name getter');
    },
  });
  const cases: [string, () => unknown, string][] = [
    ['Error', () => { throw new RangeError('sync range'); }, 'sync range'],
    ['string', () => { throw 'sync string'; }, 'sync string'],
    ['null', () => { throw null; }, 'null'],
    ['Error with a throwing name getter', () => { throw hostileError; }, 'hostile'],
  ];
  for (const [label, h] of cases) o.registerHandler(`sync ${label}`, {}, h as () => never);
  startW(t, o);
  for (const [label, , message] of cases) {
    const r = await o.start(`sync ${label}`, {});
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'failed', label);
    t.is(done.error?.message, message, label);
    t.is(done.error?.attempt, 1, label);
    t.is(done.attempts, 1, label);
    t.is(done.output, null, label);
  }
  await stillHealthy(t, o);
});

// A handler's result goes through our own promise: a tampered native
// promise (a `constructor` getter that throws, or an own `then` that
// throws) crashed the worker through `Promise.resolve(result).then`, and on
// tick rejected untyped with the run left running.
test('a handler returning a tampered native promise fails its run; the worker, tick and the process go on', async (t) => {
  const o = system();
  // A handler answering a native promise with `key` redefined to throw `message`.
  const tampered = (key: string, message: string, how: 'get' | 'value') => (() => {
    const thrower = () => {
      throw new Error(message);
    };
    return Object.defineProperty(Promise.resolve(1), key, { [how]: thrower });
  }) as never;
  o.registerHandler('evil.ctor', {}, tampered('constructor', 'constructor getter', 'get'));
  o.registerHandler('evil.then', {}, tampered('then', 'own then', 'value'));
  startW(t, o);
  for (const [type, message] of [['evil.ctor', 'constructor getter'], ['evil.then', 'own then']]) {
    const r = await o.start(type!, {});
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.deepEqual([done.status, done.error?.message], ['failed', message], type);
  }
  await stillHealthy(t, o);
  const m = manual();
  m.registerHandler('evil.then', {}, o.getHandlerRegistration('evil.then')!.handlerClass as never);
  const r = await m.start('evil.then', {});
  await m.claimNext('batch');
  await m.tick(r.id);
  t.is((await m.findById(r.id))?.status, 'failed', 'tick settles it too');
});

// An error's message and stack are cut (1 MiB each, kept by the engine;
// 4 Mi characters cross): a message of hundreds of MB made JSON.stringify
// throw RangeError out of the executor (an unhandled rejection, the
// process gone) and would not fit a PostgreSQL row.
test('a thrown error with a huge message fails the run with the message cut, saying how much; the process lives', async (t) => {
  const o = system();
  const big = 'e'.repeat(6_000_000);
  o.registerHandler('huge.async', {}, async () => {
    throw new Error(big);
  });
  o.registerHandler('huge.sync', {}, (() => {
    throw new Error(big);
  }) as never);
  startW(t, o);
  for (const type of ['huge.async', 'huge.sync']) {
    const r = await o.start(type, {});
    const done = await o.waitForRun(r.id, { timeoutMs: 10_000 });
    t.is(done.status, 'failed', type);
    const message = done.error?.message ?? '';
    t.true(message.startsWith('eeee'), type);
    t.regex(message, /… \[\d+ more bytes cut\]$/, type);
    t.true(message.length < (1 << 20) + 64, `${type}: ${message.length}`);
  }
  await stillHealthy(t, o);
});

// A listener's throw is logged; a value whose printing throws (a throwing
// Symbol.toStringTag getter) made the logger throw, and the process died.
test('a run listener that throws or rejects with a value that cannot be printed is logged without it; the process lives', async (t) => {
  const logged: string[] = [];
  const o = new JobOrchestrator({
    clock: 'manual',
    logger: {
      error: (m: unknown, ...rest: unknown[]) => {
        for (const x of rest) String(x); // what a console would do: print it
        logged.push(String(m));
      },
      warn: () => undefined,
      log: () => undefined,
      debug: () => undefined,
    },
  });
  const unprintable = {
    get [Symbol.toStringTag]() {
      throw new Error('no tag');
    },
  };
  o.on('run:completed', () => {
    throw unprintable;
  });
  o.on('run:completed', async () => {
    throw unprintable;
  });
  o.registerHandler('l', {}, async () => 1);
  const r = await o.start('l', {});
  await o.claimNext('batch');
  await o.tick(r.id);
  await waitFor(() => logged.length >= 2, 'both listeners logged');
  t.deepEqual(logged, [
    "jobforge: a 'run:completed' listener threw a value that cannot be printed",
    "jobforge: a 'run:completed' listener threw a value that cannot be printed",
  ]);
  t.is((await o.findById(r.id))?.status, 'completed');
});

// A step output read while checked (a getter, a proxy's trap) that throws:
// ctx.step rejected with that raw error and the step row stayed running.
test('a step output whose reading throws fails the step (typed, not retried); the run goes on', async (t) => {
  const o = manual();
  let caught: unknown = null;
  o.registerHandler('getter', {}, async (ctx: JobContext<unknown>) => {
    try {
      await ctx.step('g', () => ({
        get x() {
          throw new Error('getter');
        },
      }));
    } catch (e) {
      caught = e;
    }
    return 'done';
  });
  const r = await o.start('getter', {});
  await o.claimNext('batch');
  await o.tick(r.id);
  t.true(caught instanceof JobInputInvalidError, String(caught));
  t.regex(String((caught as Error).message), /step 'g' output cannot be read/);
  t.is((await o.findStep(r.id, 'g'))?.status, 'failed');
  t.is((await o.findById(r.id))?.status, 'completed');
});

test('rejection with non-Errors (string, undefined, null, object, number, symbol, unprintable, proxy) fails the run with its string form', async (t) => {
  const o = system();
  const unprintable = {
    toString() {
      throw new Error('no string for you');
    },
  };
  const proxy = new Proxy({}, {
    get() {
      throw new Error('trap');
    },
    getPrototypeOf() {
      throw new Error('trap');
    },
  });
  const cases: [string, unknown, string | RegExp][] = [
    ['string', 'plain string', 'plain string'],
    ['undefined', undefined, 'undefined'],
    ['null', null, 'null'],
    ['object', { code: 'E_X', name: 'Custom' }, '[object Object]'],
    ['number', 42, '42'],
    ['symbol', Symbol('sym'), 'Symbol(sym)'],
    ['unprintable object', unprintable, /cannot be turned into a string/],
    ['proxy with throwing traps', proxy, /cannot be turned into a string/],
  ];
  for (const [label, value] of cases) o.registerHandler(`rej ${label}`, {}, () => Promise.reject(value));
  // A thenable whose then throws.
  o.registerHandler('thenable throws', {}, () => ({ then: () => { throw new Error('then boom'); } }));
  startW(t, o);
  for (const [label, , message] of cases) {
    const done = await o.waitForRun((await o.start(`rej ${label}`, {})).id, { timeoutMs: 5000 });
    t.is(done.status, 'failed', label);
    if (typeof message === 'string') t.is(done.error?.message, message, label);
    else t.regex(done.error!.message, message, label);
    t.is(done.output, null, label);
  }
  const th = await o.waitForRun((await o.start('thenable throws', {})).id, { timeoutMs: 5000 });
  t.is(th.status, 'failed');
  t.is(th.error?.message, 'then boom');
  await stillHealthy(t, o);
});

test('a never-resolving promise and a never-settling thenable time out (timeoutMs), the signal fires, a late result is ignored', async (t) => {
  const o = system();
  const signals: AbortSignal[] = [];
  const releases: ((v: unknown) => void)[] = [];
  o.registerHandler('never', { timeoutMs: 80 }, (ctx) => {
    signals.push(ctx.signal);
    return new Promise((resolve) => releases.push(resolve));
  });
  o.registerHandler('never thenable', { timeoutMs: 80 }, (ctx) => {
    signals.push(ctx.signal);
    return { then: () => undefined };
  });
  startW(t, o);
  const runs = [await o.start('never', {}), await o.start('never thenable', {})];
  for (const r of runs) {
    const t0 = Date.now();
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'timed_out');
    t.regex(done.error!.message, /timed out/);
    t.is(done.attempts, 1);
    t.true(Date.now() - t0 < 3000);
  }
  t.is(signals.length, 2);
  t.true(signals.every((s) => s.aborted), 'every timed-out attempt aborted its signal');
  for (const release of releases) release({ late: true });
  await realSleep(30);
  for (const r of runs) {
    const row = (await o.findById(r.id))!;
    t.is(row.status, 'timed_out', 'the late result changed nothing');
    t.is(row.output, null);
  }
  await stillHealthy(t, o);
});

test('output that is not JSON (BigInt, function, cycle, symbol, NaN, Map, throwing proxy) fails the run, output stays null', async (t) => {
  const o = system();
  const cyc: Record<string, unknown> = {};
  cyc.self = cyc;
  const proxy = new Proxy({}, {
    ownKeys() {
      throw new Error('ownKeys trap');
    },
  });
  const cases: [string, () => unknown, RegExp][] = [
    ['BigInt', () => 10n, /handler output is a BigInt/],
    ['BigInt field', () => ({ n: 10n }), /handler output\.n is a BigInt/],
    ['function', () => () => 1, /handler output is a function/],
    ['function field', () => ({ f: () => 1 }), /handler output\.f is a function/],
    ['cycle', () => cyc, /handler output\.self is a cyclic reference/],
    ['symbol', () => Symbol('s'), /handler output is a symbol/],
    ['NaN', () => NaN, /handler output is NaN/],
    ['Map', () => new Map([[1, 2]]), /handler output is a Map instance/],
    ['proxy with a throwing ownKeys', () => proxy, /ownKeys trap/],
  ];
  for (const [label, make] of cases) o.registerHandler(`out ${label}`, {}, async () => make());
  startW(t, o, { pools: { batch: { concurrency: 4 } } });
  const runs = await Promise.all(cases.map(([label]) => o.start(`out ${label}`, {})));
  for (const [i, [label, , message]] of cases.entries()) {
    const done = await o.waitForRun(runs[i]!.id, { timeoutMs: 5000 });
    t.is(done.status, 'failed', label);
    t.regex(done.error!.message, message, label);
    t.is(done.output, null, label);
  }
  t.deepEqual(countsMap(await o.countByPoolAndStatus()), { 'batch/failed': cases.length });
  await stillHealthy(t, o);
});

test('ctx.step after the attempt ended (canceled, timed out, completed): JobRunStateError {runId, status}, fn not called, nothing recorded', async (t) => {
  const o = system();
  const gate = deferred();
  const kept = new Map<string, JobContext<unknown>>();
  const lateErrors = new Map<string, unknown>();
  let fnCalls = 0;
  const late = async (ctx: JobContext<unknown>, id: string) => {
    try {
      await ctx.step('late', () => {
        fnCalls++;
        return { late: true };
      });
      lateErrors.set(id, 'no error');
    } catch (e) {
      lateErrors.set(id, e);
    }
  };
  o.registerHandler('cancel-me', {}, async (ctx) => {
    kept.set('canceled', ctx);
    await gate.promise; // released after the cancel
    await late(ctx, 'canceled');
    return { ignored: true };
  });
  o.registerHandler('time-me-out', { timeoutMs: 60 }, async (ctx) => {
    kept.set('timed_out', ctx);
    await new Promise((r) => ctx.signal.addEventListener('abort', r));
    await late(ctx, 'timed_out');
    return { ignored: true };
  });
  o.registerHandler('finish-me', {}, async (ctx) => {
    kept.set('completed', ctx);
    return { done: true };
  });
  startW(t, o);
  const c = await o.start('cancel-me', {});
  const to = await o.start('time-me-out', {});
  const fin = await o.start('finish-me', {});
  await waitFor(() => kept.has('canceled'), 'cancel-me running');
  await o.cancel(c.id);
  gate.resolve();
  await o.waitForRun(to.id, { timeoutMs: 5000 });
  await o.waitForRun(fin.id, { timeoutMs: 5000 });
  await waitFor(() => lateErrors.size === 2, 'late steps attempted');
  await late(kept.get('completed')!, 'completed'); // after the run completed
  // A second late call on the canceled ctx, from outside the handler.
  let outside: unknown;
  try {
    await kept.get('canceled')!.step('late-2', () => ++fnCalls);
  } catch (e) {
    outside = e;
  }
  for (const [status, run] of [
    ['canceled', c],
    ['timed_out', to],
    ['completed', fin],
  ] as const) {
    const e = lateErrors.get(status);
    t.true(e instanceof JobRunStateError, `${status}: ctx.step rejected with ${String(e)}`);
    t.is((e as JobRunStateError).code, 'JOB_RUN_STATE');
    t.is((e as JobRunStateError).runId, run.id);
    t.is((e as JobRunStateError).status, status);
    t.deepEqual(await o.listSteps(run.id), [], `${status}: a step was recorded`);
    t.is(await o.findStep(run.id, 'late'), null);
    const row = (await o.findById(run.id))!;
    t.is(row.status, status);
  }
  t.true(outside instanceof JobRunStateError);
  t.is(fnCalls, 0, 'no late step fn ran');
  t.is((await o.findById(c.id))!.output, null, "the canceled handler's result was ignored");
  await stillHealthy(t, o);
});

// Decided in call order on every store: on PostgreSQL the two calls took
// two connections, and the second (quick) one could begin and complete
// before the first began, which then answered the second's output with its
// own function never run (16 of 40 in an audit's repro).
forBackends('two concurrent calls with one step id: the first runs, the second is JobStepConflictError, in call order on every store', async (t, make) => {
  const o = await make.manual({ logger: silentish });
  o.registerHandler('dup', {}, async (ctx: JobContext<unknown>) => {
    const r = await Promise.allSettled([
      ctx.step('a', () => new Promise((res) => setTimeout(() => res('first'), 30))),
      ctx.step('a', () => 'second'),
      ctx.sleep('a', 1),
    ]);
    return r.map((x) => (x.status === 'fulfilled' ? x.value ?? null : (x.reason as Error).name));
  });
  for (let i = 0; i < 8; i++) {
    const run = await o.start('dup', {});
    await o.claimNext('batch');
    await o.tick(run.id);
    t.deepEqual((await o.findById(run.id))?.output, ['first', 'JobStepConflictError', 'JobStepConflictError'], `round ${i}`);
  }
});

test('two concurrent ctx.step calls with one id in one attempt: one runs, the other rejects JobStepConflictError {runId, stepId}', async (t) => {
  const o = system();
  const calls: string[] = [];
  let settled: PromiseSettledResult<unknown>[] = [];
  let third: unknown;
  let otherIds: unknown[] = [];
  o.registerHandler('conflict', {}, async (ctx) => {
    settled = await Promise.allSettled([
      ctx.step('s', async () => {
        calls.push('first');
        await realSleep(20);
        return { first: true };
      }),
      ctx.step('s', async () => {
        calls.push('second');
        return { second: true };
      }),
    ]);
    // Once the first one completed, the id is memoized for the rest of the attempt.
    third = await ctx.step('s', () => {
      calls.push('third');
      return { third: true };
    });
    // Distinct ids may run concurrently.
    otherIds = await Promise.all([ctx.step('x', async () => 'x'), ctx.step('y', async () => 'y')]);
    return { handled: true };
  });
  startW(t, o);
  const r = await o.start('conflict', {});
  const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { handled: true });
  t.deepEqual(calls, ['first'], 'only the first fn ran');
  t.is(settled[0]?.status, 'fulfilled');
  t.deepEqual((settled[0] as PromiseFulfilledResult<unknown>).value, { first: true });
  t.is(settled[1]?.status, 'rejected');
  const e = (settled[1] as PromiseRejectedResult).reason as JobStepConflictError;
  t.true(e instanceof JobStepConflictError, `got ${String(e)}`);
  t.is(e.code, 'JOB_STEP_CONFLICT');
  t.is(e.runId, r.id);
  t.is(e.stepId, 's');
  t.deepEqual(third, { first: true });
  t.deepEqual(otherIds, ['x', 'y']);
  const steps = await o.listSteps(r.id);
  t.deepEqual(
    steps.map((s) => [s.stepId, s.status, s.attempts, s.output]),
    [
      ['s', 'completed', 1, { first: true }],
      ['x', 'completed', 1, 'x'],
      ['y', 'completed', 1, 'y'],
    ],
  );
  await stillHealthy(t, o);
});

test('a handler that cancels its own run: the run ends canceled, its result (or error) is ignored, the lane moves on, the process lives', async (t) => {
  const o = system();
  const observed: Record<string, { aborted: boolean; stepError: unknown }> = {};
  o.registerHandler('self-cancel', { concurrency: { key: '{{k}}' } }, async (ctx) => {
    const mode = (ctx.input as { mode: string }).mode;
    if (mode === 'next') return { next: true };
    await o.cancel(ctx.run.id);
    let stepError: unknown;
    try {
      await ctx.step('after-cancel', () => 1);
    } catch (e) {
      stepError = e;
    }
    observed[mode] = { aborted: ctx.signal.aborted, stepError };
    if (mode === 'throw') throw new Error('thrown after self-cancel');
    return { mine: true };
  });
  startW(t, o, { pools: { batch: { concurrency: 4 } } });
  const ret = await o.start('self-cancel', { k: 'L', mode: 'return' });
  const thr = await o.start('self-cancel', { k: 'L', mode: 'throw' });
  const next = await o.start('self-cancel', { k: 'L', mode: 'next' });
  for (const r of [ret, thr]) {
    const done = await o.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'canceled');
    t.is(done.output, null, 'result ignored');
    t.is(done.error, null, 'error ignored');
  }
  const n = await o.waitForRun(next.id, { timeoutMs: 5000 });
  t.is(n.status, 'completed', 'the lane moved on');
  t.deepEqual(n.output, { next: true });
  await waitFor(() => Object.keys(observed).length === 2, 'both self-cancelling handlers finished');
  for (const mode of ['return', 'throw']) {
    t.true(observed[mode]!.aborted, `${mode}: the signal fired on the self-cancel`);
    t.true(observed[mode]!.stepError instanceof JobRunStateError, `${mode}: ctx.step after the self-cancel`);
  }
  await realSleep(20);
  t.deepEqual(await o.listSteps(ret.id), []);
  t.deepEqual(countsMap(await o.countByPoolAndStatus()), { 'batch/canceled': 2, 'batch/completed': 1 });
  await stillHealthy(t, o);
});
