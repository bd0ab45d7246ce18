/**
 * Differential test: the same seeded-random operation sequences run against
 * jobforge and against the seed orchestrator (shared/baseline), and every
 * observable outcome is compared wherever CONTRACT.md does not deliberately
 * differ from the seed.
 *
 * Shapes that the contract deliberately changes are kept out of the
 * generated sequences (see "Deliberate differences from the seed"):
 *  - #1/#2 cascade: no run ever has children (no spawnChild), so cancel and
 *    failure cascades have nothing to walk in either implementation.
 *  - #3 queue lanes: a `queue` lane never holds more than one waiter, a
 *    waiter never has a future runAt, and a terminal keyed run is replayed
 *    only into an empty lane; runAt values are compared only for validity
 *    (the seed parks waiters at a sentinel date).
 *  - #4 replace: `replace` lanes never hold more than one run.
 *  - #5 spawnChild tenants: no children.
 *  - #6 timeouts / StepOptions: not used.
 *  - #7 claim ties: every run gets a distinct priority, so claim order never
 *    depends on the tie-break; dedupe replays never create two live runs
 *    with one key (no "newest" tie either).
 *  - #8 typed errors: the seed throws a plain `Error` where jobforge throws
 *    a typed one (unknown run, tick of a non-running run); those pairs are
 *    accepted, everything else must match by `name`.
 *  - #9 tenants: in multi-tenant sequences every key carries a per-tenant
 *    prefix, so no dedupe key or lane is ever shared by two tenants.
 * Timestamps are compared only for null-ness (the seed reads Date.now, the
 * engine its own clock).
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { randomUUID } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import { JobOrchestrator } from '../dist';
import type { JobRun, JobStep } from '../dist';

const BASELINE_DIR = path.resolve(__dirname, '../../shared/baseline/dist');
const baselinePresent = fs.existsSync(path.join(BASELINE_DIR, 'index.js'));

// ── seeded PRNG (mulberry32) ───────────────────────────────────────────

class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  next(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }
  weighted<T extends string>(ws: Record<T, number>): T {
    const entries = Object.entries(ws) as [T, number][];
    const total = entries.reduce((a, [, w]) => a + w, 0);
    let r = this.next() * total;
    for (const [k, w] of entries) {
      r -= w;
      if (r < 0) return k;
    }
    return entries[entries.length - 1]![0];
  }
}

// ── the baseline, typed just enough ───────────────────────────────────

type Raw = Record<string, unknown>;
interface BaselineCtx {
  input: Raw;
  run: Raw;
  step<T>(id: string, fn: () => Promise<T>): Promise<T>;
}
type HandlerClass = new () => { run(ctx: BaselineCtx): Promise<unknown> };
interface BaselineOrchestrator {
  registerHandler(type: string, meta: unknown, cls: HandlerClass): void;
  start(type: string, input: unknown, opts?: Raw): Promise<Raw>;
  claimNext(pool: string): Promise<Raw | null>;
  tick(id: string): Promise<void>;
  cancel(id: string, opts?: Raw): Promise<void>;
  replay(id: string): Promise<Raw>;
}
interface BaselineStore {
  runs: Map<string, Raw>;
  steps: Map<string, Raw[]>;
}
interface BaselineModule {
  MemoryJobStore: new () => BaselineStore;
  MemoryJobStepService: new (s: BaselineStore) => unknown;
  MemoryJobOrchestrator: new (s: BaselineStore, steps: unknown, multiTenant: boolean) => BaselineOrchestrator;
}

// ── job types: definitions and deterministic handlers ─────────────────

type Input = { k?: unknown; v: number; extra?: unknown };
type StepFn = <T>(id: string, fn: () => Promise<T>) => Promise<T>;

const HOUR = 3_600_000;
const TYPES = ['plain', 'retrying', 'steps', 'stepsScratch', 'lane', 'reject', 'replace', 'dedupe', 'fast', 'slow'] as const;
type TypeName = (typeof TYPES)[number];

/** Key prefix of the concurrency lane of a keyed type (null: no lane). */
const LANE_PREFIX: Partial<Record<TypeName, string>> = { lane: '', reject: 'r', replace: 'p' };

/** `variant` is drawn per registration (e.g. attempts 2 or 3). Fresh object per call. */
function metaFor(type: TypeName, variant: number): Raw {
  switch (type) {
    case 'plain':
      return {};
    case 'retrying':
      return {
        retry: { attempts: 2 + (variant % 2), backoff: 'fixed', baseMs: 0, nonRetryableErrors: ['FatalError'] },
      };
    case 'steps':
      return { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 }, replayFrom: 'last_checkpoint' };
    case 'stepsScratch':
      return { replayFrom: 'scratch' };
    case 'lane':
      return { concurrency: { key: '{{k}}', collisionMode: 'queue' }, retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } };
    case 'reject':
      return { concurrency: { key: 'r{{k}}', collisionMode: 'reject' } };
    case 'replace':
      return { concurrency: { key: 'p{{k}}', collisionMode: 'replace' } };
    case 'dedupe':
      return { dedupe: { key: '{{k}}', windowMs: HOUR } };
    case 'fast':
      return { pool: 'fast' };
    case 'slow':
      return { retry: { attempts: 3, backoff: 'exponential', baseMs: HOUR } };
  }
}

class FatalError extends Error {
  override readonly name = 'FatalError';
}

/** Outcome of one attempt: a pure function of type, input and attempt number. */
async function behave(type: TypeName, input: Input, attempt: number, step: StepFn): Promise<unknown> {
  const v = input.v;
  switch (type) {
    case 'plain':
    case 'reject':
    case 'replace':
      switch (v % 6) {
        case 0:
          throw new Error(`${type} failed v=${v}`);
        case 1:
          return undefined;
        case 2:
          // A non-Error throw becomes its string form.
          throw `${type} string failure v=${v}`;
        case 3:
          return { v, doubled: v * 2, nested: { arr: [v, 'x', true, null] } };
        case 4:
          return null;
        default:
          return { k: input.k ?? null };
      }
    case 'retrying':
      if (v % 7 === 0) throw new FatalError(`fatal v=${v}`);
      if (attempt < v % 4) throw new Error(`retrying attempt ${attempt} v=${v}`);
      return { v, attempt };
    case 'steps':
    case 'stepsScratch': {
      const a = await step('a', async () => ({ a: v + 1, at: attempt }));
      const b = await step('b', async () => {
        if ((v % 3 === 0 && attempt === 0) || v % 11 === 0) throw new Error(`b failed v=${v} at=${attempt}`);
        return { b: v * 2, at: attempt };
      });
      let c: unknown = null;
      if (v % 2 === 0) c = await step('c', async () => (v % 4 === 0 ? undefined : [v, attempt]));
      return { a, b, c };
    }
    case 'lane':
      if (v % 4 === 0 && attempt === 0) throw new Error(`lane first attempt fails v=${v}`);
      return { k: input.k ?? null, v, attempt };
    case 'dedupe':
      if (v % 3 === 0) throw new Error(`dedupe failed v=${v}`);
      return { v };
    case 'fast':
      return { fast: v };
    case 'slow':
      throw new Error(`slow attempt ${attempt}`);
  }
}

function handlerClass(type: TypeName): HandlerClass {
  return class {
    async run(ctx: BaselineCtx): Promise<unknown> {
      return behave(type, ctx.input as Input, Number(ctx.run.attempts), (id, fn) => ctx.step(id, fn));
    }
  };
}

// ── normalisation ───────────────────────────────────────────────────────

const json = (v: unknown): unknown => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));
const nullness = (d: unknown): string => (d === null ? 'null' : d instanceof Date && !Number.isNaN(d.getTime()) ? 'date' : `bad:${String(d)}`);

function normError(e: unknown): unknown {
  if (e === null || e === undefined) return null;
  const x = e as Raw;
  return {
    message: x.message,
    retryable: x.retryable,
    attempt: x.attempt,
    hasStack: typeof x.stack === 'string',
  };
}

interface NormRun {
  jobType: unknown;
  jobVersion: unknown;
  parentRunId: unknown;
  rootIsSelf: boolean;
  parentClosePolicy: unknown;
  scopeEntityType: unknown;
  scopeEntityId: unknown;
  tenantId: unknown;
  tags: unknown;
  pool: unknown;
  priority: number;
  concurrencyKey: string | null;
  dedupeKey: string | null;
  status: string;
  input: unknown;
  output: unknown;
  error: unknown;
  triggerSource: unknown;
  triggerRef: unknown;
  runAt: string;
  startedAt: string;
  finishedAt: string;
  claimedAt: string;
  createdAt: string;
  attempts: unknown;
  waitKind: unknown;
  resumeToken: unknown;
  waitDeadline: unknown;
}

function normRun(r: Raw | JobRun): NormRun {
  const x = r as unknown as Raw;
  return {
    jobType: x.jobType,
    jobVersion: x.jobVersion,
    parentRunId: x.parentRunId,
    rootIsSelf: x.rootRunId === x.id,
    parentClosePolicy: x.parentClosePolicy,
    scopeEntityType: x.scopeEntityType,
    scopeEntityId: x.scopeEntityId,
    tenantId: x.tenantId,
    tags: json(x.tags),
    pool: x.pool,
    priority: x.priority as number,
    concurrencyKey: x.concurrencyKey as string | null,
    dedupeKey: x.dedupeKey as string | null,
    status: x.status as string,
    input: json(x.input),
    output: json(x.output),
    error: normError(x.error),
    triggerSource: x.triggerSource,
    triggerRef: x.triggerRef,
    runAt: nullness(x.runAt),
    startedAt: nullness(x.startedAt),
    finishedAt: nullness(x.finishedAt),
    claimedAt: nullness(x.claimedAt),
    createdAt: nullness(x.createdAt),
    attempts: x.attempts,
    waitKind: x.waitKind,
    resumeToken: x.resumeToken,
    waitDeadline: x.waitDeadline,
  };
}

type NormStep = ReturnType<typeof normStep>;

function normStep(s: Raw | JobStep) {
  const x = s as unknown as Raw;
  return {
    stepId: x.stepId,
    kind: x.kind,
    seq: x.seq,
    status: x.status,
    input: json(x.input),
    output: json(x.output),
    error: normError(x.error),
    attempts: x.attempts,
    startedAt: nullness(x.startedAt),
    finishedAt: nullness(x.finishedAt),
  };
}

/**
 * The one divergence the random batches tolerate (and report separately,
 * see the focused test "a step that runs again…" below): when a step runs
 * again after failing, the seed restarts its `attempts` at 1 (its step
 * service hides non-completed rows from `findStep`) and keeps the failed
 * try's `error` on the completed row; jobforge counts attempts up
 * (CONTRACT "ctx.step": "attempts + 1") and clears the error. Only rows of
 * steps jobforge saw more than once are masked, and only those fields.
 */
function maskRerunSteps(base: NormStep[], forge: NormStep[]): [NormStep[], NormStep[]] {
  const m = (x: NormStep): NormStep => ({ ...x, attempts: -1, error: x.status === 'completed' ? null : { ...(x.error as object), attempt: -1 } });
  const b2 = base.map((x, i) => ((forge[i]?.attempts as number) > 1 && forge[i]?.stepId === x.stepId ? m(x) : x));
  const f2 = forge.map((x) => ((x.attempts as number) > 1 ? m(x) : x));
  return [b2, f2];
}

const TERMINAL = new Set(['completed', 'failed', 'timed_out', 'canceled']);

/** The seed throws plain `Error`s where the contract asks for typed errors (deliberate difference #8). */
const TYPED_FOR_UNTYPED = new Set(['JobRunNotFoundError', 'JobRunStateError', 'ParentRunNotFoundError', 'JobInputInvalidError']);

function errorsMatch(baseName: string | null, forgeName: string | null): boolean {
  if (baseName === forgeName) return true;
  return baseName === 'Error' && forgeName !== null && TYPED_FOR_UNTYPED.has(forgeName);
}

// ── one side of the comparison ──────────────────────────────────────────

type Outcome = { value: unknown; error: string | null; collisionIncumbent?: number | null | undefined };

interface Side {
  register(type: TypeName, meta: Raw): void;
  start(type: string, input: unknown, opts: Raw | undefined): Promise<Raw | JobRun>;
  claimNext(pool: string): Promise<Raw | JobRun | null>;
  tick(id: string): Promise<void>;
  cancel(id: string, opts: Raw | undefined): Promise<void>;
  replay(id: string): Promise<Raw | JobRun>;
  row(id: string): Promise<Raw | JobRun | null>;
  steps(id: string): Promise<(Raw | JobStep)[]>;
  /** index ↔ id mapping of this side. */
  ids: string[];
  index: Map<string, number>;
}

function baselineSide(mod: BaselineModule, multiTenant: boolean): Side {
  const store = new mod.MemoryJobStore();
  const o = new mod.MemoryJobOrchestrator(store, new mod.MemoryJobStepService(store), multiTenant);
  return {
    register: (type, meta) => o.registerHandler(type, meta, handlerClass(type)),
    start: (type, input, opts) => o.start(type, input, opts),
    claimNext: (pool) => o.claimNext(pool),
    tick: (id) => o.tick(id),
    cancel: (id, opts) => o.cancel(id, opts),
    replay: (id) => o.replay(id),
    row: async (id) => store.runs.get(id) ?? null,
    steps: async (id) => [...(store.steps.get(id) ?? [])].sort((a, b) => Number(a.seq) - Number(b.seq)),
    ids: [],
    index: new Map(),
  };
}

function forgeSide(multiTenant: boolean): Side {
  const o = new JobOrchestrator({ multiTenant, clock: 'system' });
  // Tenant-gated queries need the run's tenant; the comparison reads rows
  // as an operator would, with the row's own tenant.
  const tenantOf = new Map<string, string | null>();
  const gate = (id: string) => (multiTenant ? { tenantId: tenantOf.get(id) ?? null } : undefined);
  return {
    register: (type, meta) => o.registerHandler(type, meta as never, handlerClass(type) as never),
    start: async (type, input, opts) => {
      const r = await o.start(type, input, opts as never);
      tenantOf.set(r.id, r.tenantId);
      return r;
    },
    claimNext: (pool) => o.claimNext(pool),
    tick: (id) => o.tick(id),
    cancel: (id, opts) => o.cancel(id, opts as never),
    // replay is tenant-gated (issue 21; the seed's takes no tenant): the
    // operator replays with the run's own tenant, as it reads rows.
    replay: (id) => o.replay(id, gate(id)),
    row: (id) => o.findById(id, gate(id)),
    steps: (id) => o.listSteps(id, gate(id)),
    ids: [],
    index: new Map(),
  };
}

async function attempt<T>(f: () => Promise<T>): Promise<{ value: T | null; error: unknown }> {
  try {
    return { value: await f(), error: null };
  } catch (e) {
    return { value: null, error: e };
  }
}

const errName = (e: unknown): string | null =>
  e === null ? null : e instanceof Error ? e.name : `non-Error:${String(e)}`;

/** Maps a returned row to its index (a new id gets the next index). */
function indexOf(side: Side, row: Raw | JobRun | null): number | null {
  if (row === null) return null;
  const id = (row as { id: string }).id;
  let i = side.index.get(id);
  if (i === undefined) {
    i = side.ids.length;
    side.ids.push(id);
    side.index.set(id, i);
  }
  return i;
}

// ── operations ──────────────────────────────────────────────────────────

type Op =
  | { kind: 'register'; type: TypeName; variant: number }
  | { kind: 'start'; type: string; input: Input | undefined; opts: Raw | undefined }
  | { kind: 'claim'; pool: string }
  | { kind: 'tick'; target: number | 'unknown' }
  | { kind: 'cancel'; target: number | 'unknown'; opts: Raw | undefined }
  | { kind: 'replay'; target: number | 'unknown' };

interface SeqState {
  rng: Rng;
  multiTenant: boolean;
  rows: NormRun[];
  priorities: number[];
}

const TENANTS = ['ta', 'tb', null] as const;
const tenantPrefix = (t: string | null | undefined) => (t === undefined ? 'u' : t === null ? 'n' : t.slice(1));

function laneSize(rows: NormRun[], key: string): number {
  return rows.filter((r) => r.concurrencyKey === key && !TERMINAL.has(r.status)).length;
}

function genStart(s: SeqState): Op | null {
  const { rng } = s;
  const type: string = rng.chance(0.03) ? 'unknownType' : rng.pick(TYPES);
  let tenant: string | null | undefined;
  if (s.multiTenant) tenant = rng.chance(0.06) ? undefined : rng.pick(TENANTS);
  const kRaw = rng.int(3);
  let k: unknown = s.multiTenant ? `${tenantPrefix(tenant)}${kRaw}` : rng.chance(0.15) ? kRaw : `k${kRaw}`;
  if (rng.chance(0.05)) k = rng.chance(0.5) ? undefined : null;
  const input: Input = { v: rng.int(30) };
  if (k !== undefined) input.k = k;
  if (rng.chance(0.2)) input.extra = [1, 'a', null, { b: 2.5, s: `x${rng.int(5)}` }];

  const prefix = LANE_PREFIX[type as TypeName];
  const keyed = prefix !== undefined && k !== undefined && k !== null;
  const lane = keyed ? laneSize(s.rows, `${prefix}${String(k)}`) : 0;
  // #3: at most one waiter in a queue lane; #4: replace lanes hold one run.
  if (keyed && lane >= 2) return null;

  const opts: Raw = {};
  if (s.multiTenant) {
    if (tenant !== undefined) opts.tenantId = tenant;
  }
  // #7: a distinct priority per run (0 is the definition default).
  const zeroTaken = s.rows.some((r) => r.priority === 0);
  if (zeroTaken || rng.chance(0.8)) opts.priority = s.priorities.pop();
  const roll = rng.next();
  if (roll < 0.12) opts.runAt = new Date(Date.now() - 5_000);
  // A future runAt only where no lane waiter could get it (#3).
  else if (roll < 0.2 && (!keyed || lane === 0)) opts.runAt = new Date(Date.now() + HOUR);
  if (rng.chance(0.15)) opts.tags = { src: `s${rng.int(3)}`, team: 'ops' };
  if (rng.chance(0.1)) opts.triggerSource = rng.pick(['schedule', 'event'] as const);
  if (rng.chance(0.1)) opts.triggerRef = `ref-${rng.int(9)}`;
  if (rng.chance(0.1)) opts.scope = { entityType: 'account', entityId: `acct-${rng.int(4)}` };
  if (type === 'plain' && rng.chance(0.15)) opts.pool = 'fast';
  if (rng.chance(0.1)) opts.parentClosePolicy = rng.pick(['cancel', 'abandon'] as const);
  const noOpts = Object.keys(opts).length === 0 && rng.chance(0.5);
  return { kind: 'start', type, input: rng.chance(0.02) ? undefined : input, opts: noOpts ? undefined : opts };
}

function genOp(s: SeqState): Op {
  const { rng, rows } = s;
  for (;;) {
    const kind = rng.weighted({ start: 38, claim: 22, tick: 22, cancel: 7, replay: 8, register: 3 });
    switch (kind) {
      case 'register': {
        const type = rng.pick(TYPES);
        return { kind, type, variant: rng.int(2) };
      }
      case 'start': {
        const op = genStart(s);
        if (op) return op;
        break;
      }
      case 'claim':
        return { kind, pool: rng.chance(0.8) ? 'batch' : rng.chance(0.9) ? 'fast' : 'nowhere' };
      case 'tick': {
        const running = rows.map((r, i) => [r, i] as const).filter(([r]) => r.status === 'running');
        if (running.length > 0 && rng.chance(0.9)) return { kind, target: rng.pick(running)[1] };
        if (rows.length > 0 && rng.chance(0.8)) return { kind, target: rng.int(rows.length) };
        return { kind, target: 'unknown' };
      }
      case 'cancel': {
        if (rows.length === 0 || rng.chance(0.05)) return { kind, target: 'unknown', opts: s.multiTenant ? { tenantId: 'ta' } : undefined };
        const target = rng.int(rows.length);
        let opts: Raw | undefined;
        if (s.multiTenant) {
          const own = rows[target]!.tenantId as string | null;
          const r = rng.next();
          opts = r < 0.7 ? { tenantId: own } : r < 0.9 ? { tenantId: rng.pick(TENANTS) } : {};
        }
        if (rng.chance(0.2)) opts = { ...(opts ?? {}), cascade: false, reason: 'test' };
        return { kind, target, opts };
      }
      case 'replay': {
        if (rows.length === 0 || rng.chance(0.05)) return { kind, target: 'unknown' };
        const target = rng.int(rows.length);
        const r = rows[target]!;
        if (TERMINAL.has(r.status)) {
          // #3: a keyed run is replayed only into an empty lane.
          if (r.concurrencyKey !== null && laneSize(rows, r.concurrencyKey) > 0) break;
          // #7: never two live dedupe runs with one key (no "newest" tie).
          if (
            r.dedupeKey !== null &&
            rows.some(
              (o, i) => i !== target && o.jobType === r.jobType && o.dedupeKey === r.dedupeKey && o.status !== 'canceled' && o.status !== 'failed',
            )
          ) {
            break;
          }
        }
        return { kind, target };
      }
    }
  }
}

function describe(op: Op): string {
  return JSON.stringify(op, (_k, v: unknown) => (v instanceof Date ? `Date(${v.getTime() > Date.now() ? '+1h' : '-5s'})` : v));
}

/** Runs `op` on one side. */
async function apply(side: Side, op: Op): Promise<Outcome> {
  const id = (target: number | 'unknown') => (target === 'unknown' ? randomUUID() : side.ids[target]!);
  switch (op.kind) {
    case 'register': {
      side.register(op.type, metaFor(op.type, op.variant));
      return { value: null, error: null };
    }
    case 'start': {
      // Each side gets its own copy: the seed keeps a reference to the input.
      const input = op.input === undefined ? undefined : (json(op.input) as Input);
      const opts = op.opts === undefined ? undefined : { ...op.opts };
      const r = await attempt(() => side.start(op.type, input, opts));
      let collisionIncumbent: number | null | undefined;
      if (r.error !== null && errName(r.error) === 'JobCollisionError') {
        const inc = (r.error as { incumbent?: { id?: string } }).incumbent;
        collisionIncumbent = inc?.id === undefined ? null : (side.index.get(inc.id) ?? null);
      }
      return {
        value: r.value === null ? null : { index: indexOf(side, r.value), row: normRun(r.value) },
        error: errName(r.error),
        collisionIncumbent,
      };
    }
    case 'claim': {
      const r = await attempt(() => side.claimNext(op.pool));
      return { value: r.value === null ? null : { index: indexOf(side, r.value), row: normRun(r.value) }, error: errName(r.error) };
    }
    case 'tick': {
      const r = await attempt(() => side.tick(id(op.target)));
      return { value: null, error: errName(r.error) };
    }
    case 'cancel': {
      const r = await attempt(() => side.cancel(id(op.target), op.opts === undefined ? undefined : { ...op.opts }));
      return { value: null, error: errName(r.error) };
    }
    case 'replay': {
      const r = await attempt(() => side.replay(id(op.target)));
      return { value: r.value === null ? null : { index: indexOf(side, r.value), row: normRun(r.value) }, error: errName(r.error) };
    }
  }
}

async function snapshot(side: Side): Promise<{ runs: NormRun[]; steps: NormStep[][] }> {
  const runs: NormRun[] = [];
  const steps: NormStep[][] = [];
  for (const id of side.ids) {
    const row = await side.row(id);
    runs.push(row === null ? (null as unknown as NormRun) : normRun(row));
    steps.push((await side.steps(id)).map(normStep));
  }
  return { runs, steps };
}

interface Divergence {
  seed: number;
  opIndex: number;
  what: string;
  baseline: unknown;
  jobforge: unknown;
  trace: string[];
}

interface SequenceResult {
  /** First divergence outside the deliberate differences (the sequence stops there). */
  divergence: Divergence | null;
  /** First op whose only difference is re-run step bookkeeping (see maskRerunSteps). */
  stepBookkeeping: Divergence | null;
}

/** Runs one seeded sequence and compares both sides after every op. */
async function runSequence(mod: BaselineModule, seed: number, multiTenant: boolean, opsPerSeq: number): Promise<SequenceResult> {
  const rng = new Rng(seed);
  const base = baselineSide(mod, multiTenant);
  const forge = forgeSide(multiTenant);
  const priorities: number[] = [];
  for (let p = -300; p <= 300; p++) if (p !== 0) priorities.push(p);
  for (let i = priorities.length - 1; i > 0; i--) {
    const j = rng.int(i + 1);
    [priorities[i], priorities[j]] = [priorities[j]!, priorities[i]!];
  }
  const s: SeqState = { rng, multiTenant, rows: [], priorities };
  const trace: string[] = [];
  const diverge = (opIndex: number, what: string, b: unknown, f: unknown): Divergence => ({
    seed,
    opIndex,
    what,
    baseline: b,
    jobforge: f,
    trace,
  });

  let stepBookkeeping: Divergence | null = null;
  const stop = (d: Divergence): SequenceResult => ({ divergence: d, stepBookkeeping });
  const initial: Op[] = TYPES.filter(() => rng.chance(0.75)).map((type) => ({ kind: 'register', type, variant: rng.int(2) }));
  for (let n = 0; n < initial.length + opsPerSeq; n++) {
    const op = n < initial.length ? initial[n]! : genOp(s);
    trace.push(`#${n} ${describe(op)}`);
    const b = await apply(base, op);
    const f = await apply(forge, op);
    if (!errorsMatch(b.error, f.error)) return stop(diverge(n, 'thrown error name', b.error, f.error));
    if (b.collisionIncumbent !== f.collisionIncumbent) {
      return stop(diverge(n, 'JobCollisionError.incumbent', b.collisionIncumbent, f.collisionIncumbent));
    }
    if (!isDeepStrictEqual(b.value, f.value)) return stop(diverge(n, 'returned value', b.value, f.value));
    if (base.ids.length !== forge.ids.length) return stop(diverge(n, 'number of runs', base.ids.length, forge.ids.length));
    const bs = await snapshot(base);
    const fs2 = await snapshot(forge);
    for (let i = 0; i < bs.runs.length; i++) {
      if (!isDeepStrictEqual(bs.runs[i], fs2.runs[i])) return stop(diverge(n, `row of run #${i}`, bs.runs[i], fs2.runs[i]));
      const bSteps = bs.steps[i]!;
      const fSteps = fs2.steps[i]!;
      if (isDeepStrictEqual(bSteps, fSteps)) continue;
      if (!isDeepStrictEqual(...maskRerunSteps(bSteps, fSteps))) return stop(diverge(n, `steps of run #${i}`, bSteps, fSteps));
      stepBookkeeping ??= diverge(n, `re-run step bookkeeping of run #${i}`, bSteps, fSteps);
    }
    s.rows = fs2.runs;
  }
  return { divergence: null, stepBookkeeping };
}

const SEQS_PER_TEST = 25;
const OPS_PER_SEQ = 40;

async function runBatch(t: ExecutionContext, firstSeed: number, multiTenant: boolean): Promise<void> {
  const mod = require(BASELINE_DIR) as BaselineModule;
  const divergences: Divergence[] = [];
  let bookkeeping = 0;
  for (let i = 0; i < SEQS_PER_TEST; i++) {
    const r = await runSequence(mod, firstSeed + i, multiTenant, OPS_PER_SEQ);
    if (r.divergence) divergences.push(r.divergence);
    if (r.stepBookkeeping) bookkeeping++;
  }
  t.log(
    `${SEQS_PER_TEST} sequences × ${OPS_PER_SEQ} ops (seeds ${firstSeed}..${firstSeed + SEQS_PER_TEST - 1}): ` +
      `${divergences.length} diverged, ${bookkeeping} differ only in re-run step bookkeeping (asserted by the focused step test)`,
  );
  // The first divergence in full (with the ops that led to it); the
  // others by seed, so every diverging sequence can be replayed.
  const first = divergences[0];
  if (first) {
    t.deepEqual(
      first.jobforge,
      first.baseline,
      `seed ${first.seed}, op #${first.opIndex}: ${first.what} differs (actual = jobforge, expected = baseline)\n` +
        `all diverging sequences: ${divergences.map((d) => `seed ${d.seed} op #${d.opIndex} (${d.what})`).join('; ')}\n` +
        first.trace.slice(Math.max(0, first.trace.length - 25)).join('\n'),
    );
  }
  t.is(divergences.length, 0, 'sequences whose observable outcome differs from the seed');
}

if (!baselinePresent) {
  console.log(`baseline absent at ${BASELINE_DIR}: differential tests skipped`);
  test.skip(`differential vs baseline (baseline absent at ${BASELINE_DIR})`, (t) => t.pass());
} else {
  const batches: { first: number; multiTenant: boolean }[] = [];
  for (let b = 0; b < 5; b++) batches.push({ first: 1000 + b * SEQS_PER_TEST, multiTenant: false });
  for (let b = 0; b < 3; b++) batches.push({ first: 5000 + b * SEQS_PER_TEST, multiTenant: true });
  for (const { first, multiTenant } of batches) {
    test(`differential vs baseline: ${multiTenant ? 'multi-tenant' : 'single-tenant'} seeds ${first}..${first + SEQS_PER_TEST - 1}`, async (t) => {
      await runBatch(t, first, multiTenant);
    });
  }

  test('differential vs baseline: a step that runs again after failing counts its attempts (CONTRACT "ctx.step": attempts + 1)', async (t) => {
    // Focused, deterministic form of the only divergence the random batches
    // found outside the deliberate differences. CONTRACT.md says a step that
    // runs is recorded with "attempts + 1"; the seed's step store hides
    // failed rows from findStep, so it restarts at 1 on every re-run and
    // keeps the failed try's error on the completed row. jobforge follows
    // the contract text (the page wins over the seed): attempts count every
    // execution and a completed step carries no error. Everything else about
    // these rows must match the seed exactly.
    const mod = require(BASELINE_DIR) as BaselineModule;
    const sides = [baselineSide(mod, false), forgeSide(false)] as const;
    const results: { steps: NormStep[][]; runs: NormRun[] }[] = [];
    for (const side of sides) {
      side.register('steps', metaFor('steps', 0));
      // v=3: step b fails on attempt 0, succeeds on the retry.
      // v=11: step b fails on every attempt; the run is then replayed once.
      const ok = await side.start('steps', { k: 'a', v: 3 }, { priority: 2 });
      const bad = await side.start('steps', { k: 'b', v: 11 }, { priority: 1 });
      const claimAndTick = async (expected: string) => {
        const c = await side.claimNext('batch');
        t.is(c?.id, expected);
        await side.tick(expected);
      };
      await claimAndTick(ok.id as string); // attempt 1 of ok: b fails → retry
      await claimAndTick(ok.id as string); // attempt 2 of ok: completed
      await claimAndTick(bad.id as string); // attempt 1 of bad → retry
      await claimAndTick(bad.id as string); // attempt 2 of bad → failed
      const steps: NormStep[][] = [];
      steps.push((await side.steps(bad.id as string)).map(normStep));
      await side.replay(bad.id as string); // last_checkpoint: the failed step b is deleted
      await claimAndTick(bad.id as string); // after replay, attempt 1 → retry
      steps.push((await side.steps(bad.id as string)).map(normStep));
      steps.unshift((await side.steps(ok.id as string)).map(normStep));
      const runs = [normRun((await side.row(ok.id as string))!), normRun((await side.row(bad.id as string))!)];
      results.push({ runs, steps });
    }
    const [base, forge] = results as [(typeof results)[0], (typeof results)[0]];
    t.deepEqual(forge.runs, base.runs, 'run rows (actual = jobforge, expected = baseline)');
    // The documented divergence, asserted positively on jobforge's side.
    const reran = forge.steps.flat().filter((x) => x.stepId === 'b');
    t.true(reran.some((x) => (x.attempts as number) >= 2), 'a re-run step counts up its attempts');
    for (const x of forge.steps.flat()) {
      if (x.status === 'completed') t.is(x.error, null, `completed step ${String(x.stepId)} carries no error`);
      else if (x.status === 'failed') t.is((x.error as { attempt: number }).attempt, x.attempts as number, 'error.attempt = attempts');
    }
    const masked = forge.steps.map((rows, i) => maskRerunSteps(base.steps[i]!, rows));
    t.deepEqual(
      masked.map(([, f]) => f),
      masked.map(([b]) => b),
      'steps of [run whose step b failed once; run whose step b always fails, after 2 attempts; ' +
        'the same run replayed and ticked once] ' +
        '(actual = jobforge, expected = baseline)',
    );
  });

  test('differential harness: the generated sequences exercise every operation and outcome', async (t) => {
    // Guards against a generator that silently stops covering the shapes
    // the comparison is about (e.g. every start rejected by a guard). Runs
    // the generator of the batches above (jobforge side only).
    const seen = new Set<string>();
    for (const multiTenant of [false, true]) {
      for (let seed = 0; seed < 40; seed++) {
        const rng = new Rng(seed);
        const forge = forgeSide(multiTenant);
        const s: SeqState = { rng, multiTenant, rows: [], priorities: Array.from({ length: 600 }, (_, i) => i + 1) };
        for (const type of TYPES) forge.register(type, metaFor(type, 0));
        for (let n = 0; n < OPS_PER_SEQ; n++) {
          const op = genOp(s);
          const r = await apply(forge, op);
          seen.add(`${op.kind}:${r.error ?? 'ok'}`);
          s.rows = (await snapshot(forge)).runs;
          for (const row of s.rows) {
            seen.add(`status:${row.status}`);
            if (row.concurrencyKey !== null && row.status === 'pending' && row.runAt === 'date') seen.add(`lane:${laneSize(s.rows, row.concurrencyKey)}`);
          }
        }
      }
    }
    for (const k of [
      'start:ok',
      'start:JobTypeNotFoundError',
      'start:JobTemplateFieldMissingError',
      'start:JobCollisionError',
      'start:MissingTenantIdError',
      'claim:ok',
      'tick:ok',
      'tick:JobRunStateError',
      'tick:JobRunNotFoundError',
      'cancel:ok',
      'cancel:MissingTenantIdError',
      'replay:ok',
      'replay:JobNotReplayableError',
      'replay:JobRunNotFoundError',
      'status:completed',
      'status:failed',
      'status:canceled',
      'status:pending',
      'status:running',
      'lane:2',
    ]) {
      t.true(seen.has(k), `generated sequences never produced ${k}`);
    }
  });
}
