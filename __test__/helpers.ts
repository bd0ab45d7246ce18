/**
 * Shared helpers of the jobforge test suite: they drive the orchestrator
 * and wait for things to happen; `rejects` is the one shared assertion.
 */
import type { ExecutionContext } from 'ava';
import { JobOrchestrator, JobforgeError } from '../dist';
import type { JobContext, JobLogger, JobOrchestratorOptions, JobRun, JobStep } from '../dist';

/** RFC 4122 version-4 UUID. */
export const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** Every field of a JobRun row (CONTRACT.md "Rows"). */
export const RUN_FIELDS = [
  'id',
  'jobType',
  'jobVersion',
  'parentRunId',
  'rootRunId',
  'parentClosePolicy',
  'scopeEntityType',
  'scopeEntityId',
  'tenantId',
  'tags',
  'pool',
  'priority',
  'concurrencyKey',
  'dedupeKey',
  'status',
  'input',
  'output',
  'error',
  'triggerSource',
  'triggerRef',
  'runAt',
  'startedAt',
  'finishedAt',
  'claimedAt',
  'attempts',
  'waitKind',
  'resumeToken',
  'waitDeadline',
  'createdAt',
  'updatedAt',
] as const;

/** Timestamp fields of a JobRun row. */
export const RUN_DATE_FIELDS = [
  'runAt',
  'startedAt',
  'finishedAt',
  'claimedAt',
  'waitDeadline',
  'createdAt',
  'updatedAt',
] as const;

/** Every field of a JobStep row. */
export const STEP_FIELDS = [
  'id',
  'jobRunId',
  'stepId',
  'kind',
  'seq',
  'status',
  'input',
  'output',
  'error',
  'attempts',
  'startedAt',
  'finishedAt',
] as const;

/** Every field of a JobDefinition row. */
export const DEFINITION_FIELDS = [
  'type',
  'version',
  'pool',
  'scopeEntityType',
  'retryPolicy',
  'timeoutMs',
  'concurrencyKeyTemplate',
  'collisionMode',
  'dedupeKeyTemplate',
  'dedupeWindowMs',
  'priorityDefault',
  'replayFrom',
  'createdAt',
  'updatedAt',
] as const;

export const silentLogger: JobLogger = {
  log: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  debug: () => undefined,
};

/** An orchestrator on the manual clock (time moves only with advanceTime). */
export function manual(opts: Omit<JobOrchestratorOptions, 'clock'> = {}): JobOrchestrator {
  return new JobOrchestrator({ loggerFactory: () => silentLogger, ...opts, clock: 'manual' });
}

/** An orchestrator on the system clock. */
export function system(opts: Omit<JobOrchestratorOptions, 'clock'> = {}): JobOrchestrator {
  return new JobOrchestrator({ loggerFactory: () => silentLogger, ...opts, clock: 'system' });
}

/** Resolves on the next turn of the event loop. */
export const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));

/** Real-time sleep (only for short waits that prove something did NOT happen). */
export const realSleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A promise with its resolve function exposed. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

/** Polls `cond` (real time) until it holds; throws after `limitMs`. */
export async function waitFor(cond: () => boolean | Promise<boolean>, what: string, limitMs = 2000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await realSleep(1);
  }
}

/**
 * Moves the manual clock in `stepMs` increments until `cond` holds (for
 * engine-time sleeps whose start instant the test cannot observe).
 */
export async function advanceUntil(
  o: JobOrchestrator,
  cond: () => boolean,
  stepMs: number,
  maxSteps = 10_000,
): Promise<void> {
  for (let i = 0; i < maxSteps; i++) {
    await realSleep(1);
    if (cond()) return;
    o.advanceTime(stepMs);
  }
  throw new Error('advanceUntil: condition never held');
}

/** findById that must find the run. */
export async function get(o: JobOrchestrator, id: string, tenantId?: string | null): Promise<JobRun> {
  const r = tenantId === undefined ? await o.findById(id) : await o.findById(id, { tenantId });
  if (r === null) throw new Error(`run ${id} not found`);
  return r;
}

/** Status of a run. */
export async function statusOf(o: JobOrchestrator, id: string, tenantId?: string | null): Promise<string> {
  return (await get(o, id, tenantId)).status;
}

/** claimNext that must claim something. */
export async function claim(o: JobOrchestrator, pool = 'batch'): Promise<JobRun> {
  const r = await o.claimNext(pool);
  if (r === null) throw new Error(`nothing claimable in pool '${pool}'`);
  return r;
}

/** Claims the next run of `pool`, executes it and returns its fresh row. */
export async function runNext(o: JobOrchestrator, pool = 'batch'): Promise<JobRun> {
  const c = await claim(o, pool);
  await o.tick(c.id);
  return get(o, c.id);
}

/** Claims everything claimable in `pool` right now (without executing), in claim order. */
export async function claimAll(o: JobOrchestrator, pool = 'batch'): Promise<string[]> {
  const ids: string[] = [];
  for (;;) {
    const r = await o.claimNext(pool);
    if (r === null) return ids;
    ids.push(r.id);
  }
}

/** Steps of a run keyed by step id. */
export async function stepsById(o: JobOrchestrator, runId: string): Promise<Record<string, JobStep>> {
  const out: Record<string, JobStep> = {};
  for (const s of await o.listSteps(runId)) out[s.stepId] = s;
  return out;
}

/** An Error with a `code` field. */
export function codedError(message: string, code: string, name?: string): Error {
  const e = new Error(message) as Error & { code: string };
  e.code = code;
  if (name !== undefined) e.name = name;
  return e;
}

/** One execution of a {@link hanging} handler. */
export interface HangingAttempt {
  runId: string;
  input: unknown;
  signal: AbortSignal;
  /** Settles the handler's promise with `value` (it never settles otherwise). */
  release: (value?: unknown) => void;
}

/**
 * A handler that never settles on its own; each execution is recorded in
 * `attempts` so a test can wait for it, watch its signal or release it.
 */
export function hanging(): {
  handler: (ctx: JobContext<unknown>) => Promise<unknown>;
  attempts: HangingAttempt[];
  /** Waits until the handler has been entered `n` times. */
  entered: (n?: number) => Promise<HangingAttempt>;
} {
  const attempts: HangingAttempt[] = [];
  const handler = (ctx: JobContext<unknown>): Promise<unknown> =>
    new Promise((resolve) => {
      attempts.push({ runId: ctx.run.id, input: ctx.input, signal: ctx.signal, release: resolve });
    });
  const entered = async (n = 1): Promise<HangingAttempt> => {
    await waitFor(() => attempts.length >= n, `handler entered ${n} time(s)`);
    return attempts[n - 1]!;
  };
  return { handler, attempts, entered };
}

export type ErrorClass = abstract new (...args: never[]) => Error;

/** Awaits `f`, asserts it throws an instance of `cls` with `code`, returns the error. */
export async function rejects<E extends Error>(
  t: ExecutionContext,
  f: () => unknown,
  cls: ErrorClass,
  code: string,
  label: string,
): Promise<E> {
  let thrown: unknown;
  let threw = false;
  try {
    await f();
  } catch (e) {
    threw = true;
    thrown = e;
  }
  if (!threw) {
    t.fail(`${label}: expected ${cls.name}, nothing was thrown`);
    return undefined as unknown as E;
  }
  t.true(thrown instanceof cls, `${label}: expected ${cls.name}, got ${String((thrown as Error)?.name)}: ${String((thrown as Error)?.message)}`);
  t.true(thrown instanceof JobforgeError, `${label}: not a JobforgeError`);
  t.is((thrown as { code?: unknown }).code, code, `${label}: code`);
  t.is((thrown as Error).name, cls.name, `${label}: name`);
  return thrown as E;
}
