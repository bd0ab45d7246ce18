/**
 * `JobOrchestrator`: the public JS API over the native engine. This layer
 * converts values (JSON checks, Dates, typed errors) and runs handlers when
 * the engine dispatches them; the rules (lanes, dedupe, retries, cascade,
 * memoization decisions) are all in the Rust core.
 */
import {
  JobClockError,
  JobInputInvalidError,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepTimeoutError,
  JobWaitTimeoutError,
  JobWorkerStateError,
} from './errors';
import { translateNativeError } from './native-errors';
import type {
  JobContext,
  JobHandler,
  JobHandlerMeta,
  JobLogger,
  SpawnChildOptions,
  StepOptions,
} from './handler';
import { consoleLogger } from './handler';
import { randomUUID } from 'node:crypto';
import { flatSnapshot, FlatSnapshot, toJsonText } from './json';
import { NativeEngine, PgEngine } from './native';
import type { AnyJobs, HandlerInput, JobTypeName, OptionalInputName } from './typed';
import type { JobDefinitionRow, JobRun, JobRunError, JobRunStatus, JobSchedule, JobStep } from './rows';
import { fromTuple, newRun, parseDefinition, parseRun, parseRuns, parseSchedule, parseStep } from './rows';
import type { RunDefaults, RunTuple } from './rows';

export interface JobOrchestratorOptions {
  /** Every start/cancel/query needs `tenantId` (null = cross-tenant work). */
  multiTenant?: boolean | undefined;
  /** `'manual'` time moves only with `advanceTime` (for tests). Default `'system'`. */
  clock?: 'system' | 'manual' | undefined;
  /** Builds `ctx.logger` for a run. Default: console, prefixed `JobRun:<id>`. */
  loggerFactory?: ((run: JobRun) => JobLogger) | undefined;
  /**
   * Where the orchestrator's own messages go: an event listener that
   * threw, a worker's database trouble, a stop that could not settle every
   * outcome. Default: `console`. (The Nest module passes a Nest `Logger`.)
   */
  logger?: JobLogger | undefined;
  /**
   * How long terminal runs (with their steps) are kept after `finishedAt`
   * before they are deleted. Default: forever. Keep it longer than any
   * dedupe window that should still see completed runs.
   */
  retention?: { completedMs?: number | undefined; failedMs?: number | undefined } | undefined;
  /**
   * Where runs live: `'memory'` (default; this process only) or
   * `'postgres'` (any number of processes on one database; needs
   * `postgres.url` and `await migrate()` once).
   */
  backend?: 'memory' | 'postgres' | undefined;
  postgres?: PostgresOptions | undefined;
}

export interface PostgresOptions {
  /** `postgres://user:password@host:port/database`. */
  url: string;
  /** Schema of jobforge's tables (created by `migrate()`). Default `public`. */
  schema?: string | undefined;
  /** Connection pool size of this process. Default 10. */
  maxConnections?: number | undefined;
  /**
   * A claimed run whose lease is not renewed for this long goes back to
   * `pending` (its worker died). The worker renews every leaseMs/3. Default 30000.
   */
  leaseMs?: number | undefined;
  /** Polling fallback of the worker when no notification arrives. Default 1000. */
  pollMs?: number | undefined;
}

export interface StartOptions {
  scope?: { entityType: string; entityId: string } | undefined;
  pool?: string | undefined;
  runAt?: Date | undefined;
  priority?: number | undefined;
  tags?: Record<string, string> | undefined;
  triggerSource?: 'manual' | 'schedule' | 'event' | 'parent' | undefined;
  triggerRef?: string | undefined;
  parentClosePolicy?: 'terminate' | 'cancel' | 'abandon' | undefined;
  parentRunId?: string | undefined;
  tenantId?: string | null | undefined;
}

export interface CancelOptions {
  cascade?: boolean | undefined;
  /** Accepted for parity with the seed (CONTRACT.md); not stored. */
  reason?: string | undefined;
  tenantId?: string | null | undefined;
}

export interface TenantOptions {
  tenantId?: string | null | undefined;
}

/**
 * A recurring start of `jobType` (see `JobOrchestrator.schedule`): exactly
 * one of `cron` and `everyMs`.
 */
export interface ScheduleOptions<K extends string = string, TInput = unknown> extends TenantOptions {
  /** The job type every occurrence starts (registered; its keys must be templates, not functions). */
  jobType: K;
  /** The input of every run (JSON; left out or null: `{}`). */
  input?: TInput | null | undefined;
  /**
   * A five-field cron expression (minute hour day-of-month month day-of-week):
   * `'*\/15 * * * *'`, `'0 9 * * MON-FRI'`, `'@daily'`; read in `timezone`.
   */
  cron?: string | undefined;
  /**
   * The IANA time zone the cron fields are wall-clock time in
   * (`'Europe/Berlin'`); default UTC. Across a DST change a skipped time
   * fires at the end of the gap, a repeated one once.
   */
  timezone?: string | undefined;
  /** Or a fixed interval in ms (10 ms to 10 years), counted from when this timing was set. */
  everyMs?: number | undefined;
}

/** `ScheduleOptions` checked against a job map: `input` as `start` takes it. */
export type TypedScheduleOptions<Jobs, K extends JobTypeName<Jobs>> = Omit<ScheduleOptions<K>, 'input'> &
  (K extends OptionalInputName<Jobs> ? { input?: Jobs[K] | null | undefined } : { input: Jobs[K] });

export interface WorkerPoolOptions {
  /** Attempts of this pool that may execute at once. */
  concurrency: number;
}

export interface WorkerOptions {
  /** Pools to serve. Default: `batch` (concurrency 5) and `interactive` (20). */
  pools?: Record<string, WorkerPoolOptions> | undefined;
  /** How long `stop()` lets in-flight handlers finish before aborting them. Default 10 000. */
  shutdownTimeoutMs?: number | undefined;
}

export interface WorkerHandle {
  /**
   * Stops claiming, lets in-flight handlers finish for up to
   * `shutdownTimeoutMs`, then aborts the rest and puts their runs back to
   * `pending` (nothing is lost). Resolves when no attempt is in flight.
   */
  stop(): Promise<void>;
  readonly running: boolean;
  /** Attempts executing right now. */
  readonly inFlight: number;
}

export type RunEventName = 'run:completed' | 'run:failed' | 'run:canceled' | 'run:timed_out' | 'run:retrying';
/** A listener may be async (`void` accepts that): a rejection is logged like a throw. */
export type RunEventListener = (run: JobRun) => void;

export interface WaitForRunOptions extends TenantOptions {
  /** Reject with JobWaitTimeoutError after this many ms (real time). */
  timeoutMs?: number | undefined;
}

const RUN_EVENTS: ReadonlySet<string> = new Set(['run:completed', 'run:failed', 'run:canceled', 'run:timed_out', 'run:retrying']);
const TERMINAL: ReadonlySet<string> = new Set(['completed', 'failed', 'timed_out', 'canceled']);

export interface ListForScopeOptions extends TenantOptions {
  status?: JobRunStatus | JobRunStatus[] | undefined;
  jobType?: string | undefined;
  limit?: number | undefined;
  offset?: number | undefined;
  orderBy?: 'createdAt:desc' | 'createdAt:asc' | undefined;
}

export interface ListJobRunsOptions extends TenantOptions {
  poolId?: string | undefined;
  rootRunId?: string | undefined;
  /** One status or a set of them (a run in any of them). */
  status?: JobRunStatus | JobRunStatus[] | undefined;
  /** Only runs created at or after this instant. */
  since?: Date | undefined;
  /** `nextCursor` of the previous page. */
  cursor?: string | undefined;
  limit?: number | undefined;
}

export interface PoolStatusCount {
  pool: string;
  status: JobRunStatus;
  count: number;
}

export interface RunTreeNode {
  run: JobRun;
  children: RunTreeNode[];
}

export interface RecordStepInput {
  jobRunId: string;
  stepId: string;
  kind?: 'task' | undefined;
  seq?: number | undefined;
  status: JobStep['status'];
  input?: unknown | undefined;
  output?: unknown | undefined;
  error?: JobRunError | undefined;
  attempts?: number | undefined;
  startedAt?: Date | undefined;
  finishedAt?: Date | undefined;
}

export interface JobUpsertEntry {
  type: string;
  meta: JobHandlerMeta<never>;
  handlerClass: unknown;
}

export interface JobPoolDef {
  queue: string;
  concurrency: number;
  reserved: boolean;
  description?: string | undefined;
}

export interface HandlerRegistration {
  type: string;
  meta: JobHandlerMeta<unknown>;
  handlerClass: JobHandler<unknown>;
}

/** An attempt's outcome as the engine reads it (JSON text), and its kind. */
interface Outcome {
  status: 'completed' | 'failed' | 'timed_out' | 'no_handler';
  text: string;
}

const failedOutcome = (err: unknown): Outcome => ({
  status: 'failed',
  text: JSON.stringify({ status: 'failed', error: describeFailure(err) }),
});
const NO_HANDLER: Outcome = { status: 'no_handler', text: '{"status":"no_handler"}' };
const COMPLETED_EMPTY: Outcome = { status: 'completed', text: '{"status":"completed","output":{}}' };

/** The outcome of a handler that returned (or resolved with) `value`. */
function outcomeOf(value: unknown): Outcome {
  if (value === undefined || value === null) return COMPLETED_EMPTY;
  const j = toJsonText(value, 'handler output');
  if (!j.ok) {
    return {
      status: 'failed',
      text: JSON.stringify({ status: 'failed', error: { message: j.reason, name: 'JobOutputInvalidError' } }),
    };
  }
  return { status: 'completed', text: `{"status":"completed","output":${j.text}}` };
}

/** A memory-worker attempt that ended, waiting for the next report. */
interface Reported {
  rt: WorkerRuntime;
  ticket: Ticket;
  attempt: Attempt;
  timedOut: boolean;
}

interface ManualTimer {
  deadline: number;
  resolve: () => void;
}

/** The decimal number in `s[from, to)`, read without a substring. */
function digits(s: string, from: number, to: number): number {
  let n = 0;
  for (let i = from; i < to; i++) {
    const d = s.charCodeAt(i) - 48;
    if (d < 0 || d > 9) throw new Error(`unreadable ticket: ${s.slice(0, 80)}`);
    n = n * 10 + d;
  }
  return n;
}

/** The type-and-pool part of the last ticket read, and its two strings. */
let lastHead = '';
let lastHeadType = '';
let lastHeadPool = '';

/**
 * One attempt handed to JS by the engine: `header \0 input \0 row`. The
 * header and input are parsed at once; the run row only when a handler
 * reads `ctx.run` (most never do, and it is the largest part).
 */
class Ticket {
  readonly id: string;
  readonly jobType: string;
  readonly pool: string;
  readonly epoch: number;
  readonly timeoutMs: number | null;
  readonly input: unknown;
  private readonly rowText: string;
  private row?: JobRun;

  /**
   * `readRow`: where the row comes from when the ticket carries none (the
   * memory worker leaves it out; `ctx.run` reads it on first use).
   */
  constructor(
    line: string,
    private readonly readRow?: (runId: string) => string | null,
  ) {
    // `<id><epoch>,<timeoutMs?>,<n>:<jobType><m>:<pool>\0<input>\0<row>`
    // (lengths in UTF-16 units); parsed by hand, it is on every run's path.
    this.id = line.slice(0, 36);
    const a = line.indexOf(',', 36);
    const b = line.indexOf(',', a + 1);
    if (a < 0 || b < 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
    this.epoch = digits(line, 36, a);
    this.timeoutMs = b === a + 1 ? null : digits(line, a + 1, b);
    // Type and pool repeat from ticket to ticket: reuse the strings of the
    // previous ticket when its `<n>:<type><m>:<pool>` matches (no new
    // strings to allocate and hash for the Map lookups keyed by them).
    let poolEnd: number;
    const head = lastHead;
    if (head.length > 0 && line.startsWith(head, b + 1) && line.charCodeAt(b + 1 + head.length) === 0) {
      this.jobType = lastHeadType;
      this.pool = lastHeadPool;
      poolEnd = b + 1 + head.length;
    } else {
      const c = line.indexOf(':', b + 1);
      const typeEnd = c + 1 + +line.slice(b + 1, c);
      this.jobType = line.slice(c + 1, typeEnd);
      const d = line.indexOf(':', typeEnd);
      poolEnd = d + 1 + +line.slice(typeEnd, d);
      this.pool = line.slice(d + 1, poolEnd);
      if (c < 0 || d < 0 || line.charCodeAt(poolEnd) !== 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
      lastHead = line.slice(b + 1, poolEnd);
      lastHeadType = this.jobType;
      lastHeadPool = this.pool;
    }
    const e = line.indexOf('\0', poolEnd + 1);
    if (e < 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
    this.input = JSON.parse(line.slice(poolEnd + 1, e));
    this.rowText = line.slice(e + 1);
  }

  get run(): JobRun {
    if (this.row) return this.row;
    if (this.rowText.length > 0 || !this.readRow) return (this.row = parseRun(this.rowText));
    const text = this.readRow(this.id);
    // Only a finished run purged by retention is gone while its handler runs.
    if (text === null) throw new JobRunNotFoundError(this.id);
    return (this.row = parseRun(text));
  }
}

/**
 * The `ctx` a handler receives. A class: its getters sit on the prototype,
 * where an object literal with getters defines them anew for every run
 * (measured: the largest single JS cost of a no-op run). `step` and
 * `spawnChild` are own bound functions, so destructuring `ctx` works.
 */
class RunContext implements JobContext<unknown> {
  readonly input: unknown;
  private cachedLogger?: JobLogger;
  private stepFn?: JobContext<unknown>['step'];
  private spawnFn?: JobContext<unknown>['spawnChild'];

  constructor(
    private readonly ticket: Ticket,
    private readonly attempt: Attempt,
    private readonly host: ContextHost,
  ) {
    this.input = ticket.input;
  }

  /**
   * `step` and `spawnChild` are functions bound to this run, made on first
   * read (most handlers use neither), so destructuring `ctx` works.
   */
  get step(): JobContext<unknown>['step'] {
    return (this.stepFn ??= <T>(stepId: string, fn: () => Promise<T> | T, opts?: StepOptions) =>
      this.host.step(this.ticket, this.attempt, stepId, fn, opts));
  }

  get spawnChild(): JobContext<unknown>['spawnChild'] {
    return (this.spawnFn ??= (type: string, input: unknown, opts?: SpawnChildOptions) =>
      this.host.spawnChild(this.ticket, this.attempt, type, input, opts));
  }

  get run(): JobRun {
    return this.ticket.run;
  }

  get signal(): AbortSignal {
    return this.attempt.signal;
  }

  /** Built on first use: most handlers never log. */
  get logger(): JobLogger {
    return (this.cachedLogger ??= this.host.loggerFactory(this.ticket.run));
  }
}

/** What a `ctx` calls back into (one per orchestrator). */
interface ContextHost {
  loggerFactory: (run: JobRun) => JobLogger;
  step<T>(ticket: Ticket, attempt: Attempt, stepId: string, fn: () => Promise<T> | T, opts?: StepOptions): Promise<T>;
  spawnChild(ticket: Ticket, attempt: Attempt, type: string, input: unknown, opts?: SpawnChildOptions): Promise<JobRun>;
}

/**
 * One executing attempt. The AbortController behind `ctx.signal` is built
 * only when a handler reads the signal (most never do, and constructing one
 * costs more than the rest of an attempt's bookkeeping).
 */
/**
 * A retry policy as the engine reads it (`RetryPolicy`), checked before
 * anything runs: a step's policy is used only once its function failed.
 */
function checkRetryPolicy(p: unknown, what: string): void {
  const bad = (why: string) => new JobInputInvalidError(`${what}: ${why}`);
  if (p === null || typeof p !== 'object' || Array.isArray(p)) throw bad('must be an object');
  const r = p as Record<string, unknown>;
  const { attempts, backoff, baseMs, nonRetryableErrors } = r;
  if (typeof attempts !== 'number' || !Number.isInteger(attempts) || attempts < 1 || attempts > 0xffffffff) {
    throw bad(`attempts must be an integer >= 1, got ${String(attempts)}`);
  }
  if (backoff !== 'fixed' && backoff !== 'exponential') throw bad(`backoff must be 'fixed' or 'exponential', got ${String(backoff)}`);
  if (typeof baseMs !== 'number' || !Number.isSafeInteger(baseMs) || baseMs < 0) {
    throw bad(`baseMs must be an integer >= 0, got ${String(baseMs)}`);
  }
  if (nonRetryableErrors !== undefined && nonRetryableErrors !== null && (!Array.isArray(nonRetryableErrors) || nonRetryableErrors.some((e) => typeof e !== 'string'))) {
    throw bad('nonRetryableErrors must be an array of strings');
  }
}

/** The run status an attempt's abort reason means. */
const ABORTED_STATUS: Record<string, string> = { canceled: 'canceled', timed_out: 'timed_out', shutdown: 'pending' };

class Attempt {
  private controller?: AbortController | undefined;
  private reason?: string | undefined;
  private waiters?: (() => void)[] | undefined;
  /** Set by `attempt()` to stop racing the handler. */
  onAbort?: (() => void) | undefined;
  /** The worker executing this attempt, and its claim epoch (worker attempts only). */
  worker?: WorkerRuntime | undefined;
  epoch = 0;

  get aborted(): boolean {
    return this.reason !== undefined;
  }

  get abortReason(): string | undefined {
    return this.reason;
  }

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.reason !== undefined) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }

  abort(reason: string): void {
    if (this.reason !== undefined) return;
    this.reason = reason;
    this.controller?.abort(reason);
    this.onAbort?.();
    for (const w of this.waiters ?? []) w();
    this.waiters = undefined;
  }

  whenAborted(): Promise<void> {
    if (this.reason !== undefined) return Promise.resolve();
    return new Promise((resolve) => (this.waiters ??= []).push(resolve));
  }
}

/** Bookkeeping of one started worker on the JS side. */
class WorkerRuntime {
  running = true;
  /** True once stop() has drained (or released) every attempt. */
  stopped = false;
  /** Slots held on the JS side: attempts executing or not yet reported. */
  private active = 0;
  /** The same, per pool (a hint for feeding idle slots at once). */
  private readonly activeIn = new Map<string, number>();
  /** Attempts executing (they sit in the orchestrator's in-flight map). */
  private executing = 0;
  private readonly releasedRuns = new Set<string>();
  private idle: (() => void)[] = [];
  private stopping: Promise<void> | null = null;
  /** A running worker keeps Node alive, like a server socket would. */
  private keepAlive: NodeJS.Timeout | null = setInterval(() => undefined, 0x7fffffff);

  /** Position of each pool in the list the engine's worker was given. */
  readonly slotOf: Map<string, number>;

  constructor(
    private readonly capacity: Map<string, number>,
    private readonly shutdownTimeoutMs: number,
    private readonly stopNative: () => number,
    private readonly release: (runId: string, epoch: number) => boolean | Promise<boolean>,
    private readonly slotsHeld: () => number,
    private readonly logger: JobLogger,
  ) {
    this.slotOf = new Map([...capacity.keys()].map((name, i) => [name, i]));
  }

  /** A runtime whose engine worker was never started: lets Node exit. */
  discard(): void {
    this.running = false;
    if (this.keepAlive) clearInterval(this.keepAlive);
    this.keepAlive = null;
  }

  /** Some attempt is executing (its report will carry buffered starts). */
  get busy(): boolean {
    return this.active > 0;
  }

  enter(pool: string): void {
    this.active++;
    this.activeIn.set(pool, (this.activeIn.get(pool) ?? 0) + 1);
  }

  /**
   * Fewer JS loops than slots in `pool` (or in any pool): a hint, batches
   * in transit are not counted.
   */
  hasIdleSlot(pool?: string): boolean {
    if (pool !== undefined) return (this.activeIn.get(pool) ?? 0) < (this.capacity.get(pool) ?? 0);
    for (const [name, cap] of this.capacity) if ((this.activeIn.get(name) ?? 0) < cap) return true;
    return false;
  }

  leave(pool: string): void {
    this.active--;
    this.activeIn.set(pool, (this.activeIn.get(pool) ?? 1) - 1);
    if (this.active === 0) for (const f of this.idle.splice(0)) f();
  }

  /** `attempt` of this worker begins (for stop() to find it). */
  track(attempt: Attempt, epoch: number): void {
    attempt.worker = this;
    attempt.epoch = epoch;
    this.executing++;
  }

  untrack(attempt: Attempt): void {
    if (attempt.worker === this) {
      attempt.worker = undefined;
      this.executing--;
    }
  }

  /** Whether stop() put the run back to pending (its outcome is dropped). */
  released(runId: string): boolean {
    return this.releasedRuns.size > 0 && this.releasedRuns.delete(runId);
  }

  private drained(): Promise<void> {
    return this.active === 0 ? Promise.resolve() : new Promise((r) => this.idle.push(r));
  }

  handle(inFlight: Map<string, Attempt>): WorkerHandle {
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const rt = this;
    return {
      stop: () => rt.stop(inFlight),
      get running() {
        return rt.running;
      },
      get inFlight() {
        return rt.executing;
      },
    };
  }

  stop(inFlight: Map<string, Attempt>): Promise<void> {
    this.stopping ??= (async () => {
      this.running = false;
      this.stopNative();
      let cancelTimer = () => undefined as void;
      const timedOut = await Promise.race([
        this.drained().then(() => false),
        new Promise<boolean>((r) => (cancelTimer = after(this.shutdownTimeoutMs, () => r(true)))),
      ]);
      cancelTimer();
      if (timedOut) {
        // Still running after the grace period: back to pending, then abort.
        const mine = [...inFlight].filter(([, a]) => a.worker === this);
        for (const [runId, a] of mine) {
          const epoch = a.epoch;
          let released = false;
          try {
            released = await this.release(runId, epoch);
          } catch (e) {
            this.logger.error('jobforge: releasing a run at shutdown failed (the lease sweeper will)', e);
          }
          if (released) this.releasedRuns.add(runId);
          a.abort('shutdown');
        }
        await this.drained();
      }
      // Batches claimed just before stop() may still be crossing to JS
      // (they are released on arrival), and on Postgres finished attempts'
      // outcomes are stored by the engine's loop after the handlers return.
      // Wait for both, but not forever: with the database unreachable the
      // loop keeps trying in the background, and a run whose outcome never
      // lands goes back to pending when its lease expires (at-least-once).
      const deadline = Date.now() + Math.max(this.shutdownTimeoutMs, 1000);
      while (this.slotsHeld() > 0) {
        if (Date.now() >= deadline) {
          this.logger.error(
            'jobforge: worker stopped before every finished attempt was settled (is the database reachable?); ' +
              'the outcomes are still being stored in the background, and a run whose outcome is never stored ' +
              'runs again once its lease expires',
          );
          break;
        }
        await new Promise((r) => setTimeout(r, 2));
        await this.drained();
      }
      if (this.keepAlive) clearInterval(this.keepAlive);
      this.keepAlive = null;
      this.stopped = true;
    })();
    return this.stopping;
  }
}

/** Calls both engines answer synchronously (no I/O). */
interface LocalEngine {
  now(): number;
  advanceTime(ms: number): number | null;
  takeNotices(): string | null;
  setEvents(enabled: boolean): void;
  watchRun(runId: string, on: boolean): void;
}

/** Awaits a Postgres engine call, turning its error into the typed one. */
async function db<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (e) {
    throw translateNativeError(e);
  }
}

function call<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw translateNativeError(e);
  }
}

/** Lone surrogates (a JS string may hold them; the engine's text cannot) become U+FFFD. */
const wellFormed = (s: string): string => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');

function describeFailure(err: unknown): { message: string; stack?: string; name?: string; code?: string } {
  let message: string;
  try {
    message = wellFormed(err instanceof Error ? err.message : String(err));
  } catch {
    message = 'handler threw a value that cannot be turned into a string';
  }
  const out: { message: string; stack?: string; name?: string; code?: string } = { message };
  if (err !== null && typeof err === 'object') {
    const e = err as { stack?: unknown; name?: unknown; code?: unknown };
    try {
      if (typeof e.stack === 'string') out.stack = wellFormed(e.stack);
      if (typeof e.name === 'string') out.name = wellFormed(e.name);
      if (typeof e.code === 'string') out.code = wellFormed(e.code);
    } catch {
      /* hostile getters: keep what we have */
    }
  }
  return out;
}

/** Node's timers hold at most 2^31-1 ms and fire after 1 ms beyond that. */
const MAX_TIMER_MS = 0x7fffffff;

/**
 * Calls `fn` after `ms` of wall time, however long (chained timers past
 * Node's timer limit; never for Infinity). Returns a cancel function.
 */
function after(ms: number, fn: () => void): () => void {
  let timer: NodeJS.Timeout | undefined;
  let canceled = false;
  const arm = (left: number) => {
    if (canceled || left === Infinity) return;
    if (left > MAX_TIMER_MS) timer = setTimeout(() => arm(left - MAX_TIMER_MS), MAX_TIMER_MS);
    else timer = setTimeout(fn, Math.max(0, left));
  };
  arm(ms);
  return () => {
    canceled = true;
    clearTimeout(timer);
  };
}

/** Start options checked and converted for the engine (Dates to ms). */
function startOptions(opts: StartOptions | undefined): Record<string, unknown> {
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) {
    throw new JobInputInvalidError('start options must be an object');
  }
  const o: Record<string, unknown> = { ...(opts ?? {}) };
  // Named here, so the message is about the option, not the wire format.
  checkTenant(o.tenantId);
  for (const k of ['pool', 'triggerRef', 'parentRunId', 'triggerSource', 'parentClosePolicy'] as const) {
    const v = o[k];
    if (v !== undefined && v !== null && typeof v !== 'string') {
      throw new JobInputInvalidError(`${k} must be a string, got ${typeof v}`);
    }
  }
  const scope = o.scope as { entityType?: unknown; entityId?: unknown } | null | undefined;
  if (scope !== undefined && scope !== null && (typeof scope !== 'object' || typeof scope.entityType !== 'string' || typeof scope.entityId !== 'string')) {
    throw new JobInputInvalidError('scope must be { entityType: string, entityId: string }');
  }
  if (opts?.runAt !== undefined) {
    const t = dateMs(opts.runAt);
    if (t === null) throw new JobInputInvalidError('runAt must be a valid Date');
    o.runAt = t;
  }
  if (opts?.priority !== undefined && !Number.isInteger(opts.priority)) {
    throw new JobInputInvalidError(`priority must be an integer, got ${String(opts.priority)}`);
  }
  if (opts?.tags !== undefined) {
    const j = toJsonText(opts.tags, 'tags');
    if (!j.ok) throw new JobInputInvalidError(j.reason);
  }
  return o;
}

/** JSON would turn NaN/Infinity into null (the default): reject them here. */
function checkCount(name: string, v: unknown): void {
  if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v))) {
    throw new JobInputInvalidError(`${name} must be a finite number, got ${String(v)}`);
  }
}

/** Whether a tenant was given; a tenantId that is neither a string nor null is an error. */
function tenantGiven(o: TenantOptions | undefined): boolean {
  const t = o === undefined || o === null ? undefined : o.tenantId;
  checkTenant(t);
  return t !== undefined;
}

function checkTenant(t: unknown): void {
  if (t !== undefined && t !== null && typeof t !== 'string') {
    throw new JobInputInvalidError(`tenantId must be a string or null, got ${typeof t}`);
  }
}

/** A real, valid Date (not a look-alike built on Date.prototype). */
function dateMs(d: unknown): number | null {
  if (!(d instanceof Date)) return null;
  try {
    const t: unknown = d.getTime(); // throws on a look-alike without a time value
    return typeof t === 'number' && Number.isFinite(t) ? t : null;
  } catch {
    return null;
  }
}

function isClass(h: unknown): h is new () => { run(ctx: JobContext<unknown>): unknown } {
  return (
    typeof h === 'function' &&
    typeof (h as { prototype?: { run?: unknown } }).prototype?.run === 'function'
  );
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** Buffered starts handed to the engine in one call at most this many at a time. */
const START_BATCH_MAX = 256;

/** The outcome the engine gets for a handler nobody can run (the scratch engine, or an orchestrator already collected). */
const GONE_OUTCOME = '{"status":"no_handler"}';

/**
 * Callbacks of the Postgres backend's scratch engine, which never runs
 * handlers. Module-level: a closure made in the constructor would hold the
 * orchestrator (see `engineCallbacks`).
 */
const SCRATCH_CALLBACKS = {
  dispatch: async (): Promise<string> => GONE_OUTCOME,
  onNotice: (): void => undefined,
};

/**
 * A finished attempt is reported this many microtask turns after it ends,
 * so the outcomes (and buffered starts) of async chains running side by
 * side share one native call. Each turn costs tens of nanoseconds; the
 * native call costs ~0.6 µs. Measured in bench/worker.js: 2 runs per call
 * at 1 turn, 4 at 3; 244k jobs/s at 1 turn, 283-290k at 3, less at 5.
 */
const REPORT_TURNS = 3;

/**
 * The memory worker reports outcomes and runs the tickets the report
 * claims in microtasks: handlers that settle without I/O (quick jobs, a
 * backlog, a job that starts its successor) would chain forever and starve
 * timers, I/O and signal handlers. After this long without a turn of the
 * event loop, the next report waits for one (setImmediate). A turn costs
 * microseconds, so throughput does not notice.
 */
const WORKER_SLICE_MS = 5;

/**
 * `Jobs`: the app's job map (job type → input type), which types
 * `registerHandler`, `start` and `ctx.spawnChild`; default `AnyJobs`
 * (any type, inputs unknown). See `AnyJobs`.
 */
export class JobOrchestrator<Jobs extends object = AnyJobs> {
  /**
   * The in-memory engine (with the Postgres backend, a scratch engine that
   * only validates definitions). Read it through `native`, which first
   * hands over buffered starts, unless the call cannot observe them.
   */
  private readonly engine!: NativeEngine;
  /**
   * Memory: plain starts (see `plainTypes`) answered in JS and not yet
   * handed to the engine, one `start_batch` line each. Every engine call
   * through `native` hands them over first, so no operation can observe
   * the difference; otherwise they go with the next worker report, when
   * `START_BATCH_MAX` are waiting, or on the next turn of the event loop.
   */
  private startBuf = '';
  private startCount = 0;
  private startFlushArmed = false;
  private idBlock = '';
  private idAt = 0;
  /** Last creation time handed out (system clock): never goes backwards. */
  private lastStartAt = 0;
  /** The Postgres engine (null with the memory backend). */
  private readonly pg: PgEngine | null = null;
  private readonly local: LocalEngine;
  /**
   * Postgres: definitions are validated at once by a scratch in-memory
   * engine (so registerHandler throws synchronously, like in memory mode)
   * and written to the database in the background; every call awaits it.
   */
  private registering: Promise<void> = Promise.resolve();
  private registerError: unknown = null;
  /** A definition write failed: the database may lack some of `pgSpecs`. */
  private defsUnsaved = false;
  /** Postgres: the latest spec of every registered type (re-sent after `migrate()`). */
  private readonly pgSpecs = new Map<string, unknown>();
  private readonly handlers = new Map<string, HandlerRegistration>();
  /**
   * Memory: types whose runs, started with no options, have a row fully
   * determined by the definition (no keys): `start` builds that row here.
   */
  private readonly plainTypes = new Map<string, RunDefaults & { wire: string }>();
  /** AbortControllers of executing attempts, by run id. */
  private readonly inFlight = new Map<string, Attempt>();
  /** Pending engine-time sleeps of a manual clock, fired by `advanceTime`. */
  private readonly manualTimers = new Set<ManualTimer>();
  private readonly loggerFactory: (run: JobRun) => JobLogger;
  /** The orchestrator's own messages (see `JobOrchestratorOptions.logger`). */
  private readonly logger: JobLogger;
  private readonly listeners = new Map<RunEventName, Set<RunEventListener>>();
  private readonly waiters = new Map<string, Set<(run: JobRun) => void>>();
  private eventsOn = false;
  private worker: WorkerRuntime | null = null;
  readonly multiTenant: boolean;
  readonly clock: 'system' | 'manual';
  readonly backend: 'memory' | 'postgres';

  constructor(options: JobOrchestratorOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new JobInputInvalidError('options must be an object');
    }
    const clock = options.clock ?? 'system';
    if (clock !== 'system' && clock !== 'manual') {
      throw new JobInputInvalidError(`clock must be 'system' or 'manual', got '${String(clock)}'`);
    }
    this.multiTenant = options.multiTenant === true;
    this.clock = clock;
    this.loggerFactory = options.loggerFactory ?? ((run) => consoleLogger(`JobRun:${run.id}`));
    const logger = options.logger;
    if (logger !== undefined && (logger === null || typeof logger.error !== 'function' || typeof logger.warn !== 'function')) {
      throw new JobInputInvalidError('logger must have error() and warn() methods');
    }
    this.logger = logger ?? console;
    const backend = options.backend ?? 'memory';
    if (backend !== 'memory' && backend !== 'postgres') {
      throw new JobInputInvalidError(`backend must be 'memory' or 'postgres', got '${String(backend)}'`);
    }
    this.backend = backend;
    if (backend === 'postgres') {
      const pgo = options.postgres;
      if (pgo === null || typeof pgo !== 'object' || typeof pgo.url !== 'string' || pgo.url.length === 0) {
        throw new JobInputInvalidError("backend 'postgres' needs postgres.url (a connection string)");
      }
      if (pgo.schema !== undefined && (typeof pgo.schema !== 'string' || pgo.schema.length === 0)) {
        throw new JobInputInvalidError('postgres.schema must be a non-empty string');
      }
      const positive = (v: unknown, name: string) => {
        if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)) {
          throw new JobInputInvalidError(`postgres.${name} must be a positive number, got ${String(v)}`);
        }
      };
      positive(pgo.maxConnections, 'maxConnections');
      positive(pgo.leaseMs, 'leaseMs');
      positive(pgo.pollMs, 'pollMs');
      const cb = JobOrchestrator.engineCallbacks(new WeakRef(this));
      this.pg = call(
        () =>
          new PgEngine(
            {
              url: pgo.url,
              schema: pgo.schema,
              maxConnections: pgo.maxConnections === undefined ? undefined : Math.floor(pgo.maxConnections),
              multiTenant: this.multiTenant,
              clock,
              retainCompletedMs: options.retention?.completedMs,
              retainFailedMs: options.retention?.failedMs,
              leaseMs: pgo.leaseMs,
              pollMs: pgo.pollMs,
            },
            cb.onNotice,
          ),
      );
      this.local = this.pg;
      // Validates definitions synchronously; never holds runs.
      this.engine = new NativeEngine(
        { multiTenant: this.multiTenant, clock },
        SCRATCH_CALLBACKS.dispatch,
        SCRATCH_CALLBACKS.onNotice,
      );
      return;
    }
    const cb = JobOrchestrator.engineCallbacks(new WeakRef(this));
    this.engine = call(
      () =>
        new NativeEngine(
          {
            multiTenant: this.multiTenant,
            clock,
            retainCompletedMs: options.retention?.completedMs,
            retainFailedMs: options.retention?.failedMs,
          },
          cb.dispatch,
          cb.onNotice,
        ),
    );
    this.local = this.engine;
  }

  /**
   * The callbacks an engine holds. It holds them through threadsafe
   * functions, which the garbage collector cannot see through, so a
   * callback that kept the orchestrator alive would keep it, its engine
   * and every run in it, forever. These reach it through a WeakRef, and are
   * made in a static method: a closure made in the constructor shares the
   * constructor's context, which holds `this` as soon as any arrow function
   * there uses it.
   */
  private static engineCallbacks(ref: WeakRef<JobOrchestrator>): {
    dispatch: (payload: string) => Promise<string>;
    onNotice: () => void;
  } {
    return {
      dispatch: (payload) => ref.deref()?.dispatch(payload) ?? Promise.resolve(GONE_OUTCOME),
      onNotice: () => ref.deref()?.flushAborts(),
    };
  }

  /** The engine, after handing it the buffered starts. */
  private get native(): NativeEngine {
    if (this.startCount > 0) this.flushStarts();
    return this.engine;
  }

  /** Hands the buffered starts to the engine (claiming into idle worker slots). */
  private flushStarts(): void {
    const text = this.takeStarts();
    if (text === null) return;
    const rt = this.worker;
    const fed = rt !== null && rt.running && rt.hasIdleSlot();
    let ans: string;
    try {
      ans = this.engine.startBatch(text, fed);
    } catch (e) {
      this.logger.error('jobforge: handing buffered starts to the engine failed', translateNativeError(e));
      return;
    }
    if (ans.length > 0) this.onReplyLines(ans, 0);
  }

  /** The buffered start lines, now owned by the caller (null when none). */
  private takeStarts(): string | null {
    if (this.startCount === 0) return null;
    const text = this.startBuf;
    this.startBuf = '';
    this.startCount = 0;
    return text;
  }

  private readonly flushLater = (): void => {
    this.startFlushArmed = false;
    this.flushStarts();
  };

  /**
   * Extra lines of a batch or worker reply, from `from`: tickets the call
   * claimed into idle worker slots, and `!<line> <message>` for a buffered
   * start the engine refused (its checks ran in JS first, so this means a
   * bug, reported rather than lost silently).
   */
  private onReplyLines(text: string, from: number): void {
    for (const line of text.slice(from).split('\n')) {
      if (line.length === 0) continue;
      if (line.charCodeAt(0) === 33) {
        this.logger.error(`jobforge: a buffered start was not created: ${line.slice(1)}`);
        continue;
      }
      if (line.charCodeAt(0) === 63) {
        this.logger.error(`jobforge: recording a worker outcome failed: ${line.slice(1)}`);
        continue;
      }
      let ticket: Ticket;
      try {
        ticket = new Ticket(line, this.readClaimedRow);
      } catch (e) {
        this.logger.error('jobforge: unreadable worker ticket', e);
        continue;
      }
      const rt = this.worker;
      if (rt && rt.running) this.runTicket(rt, ticket, false);
      else this.releaseTicket(ticket);
    }
  }

  private readonly readClaimedRow = (runId: string): string | null => this.engine.claimedRun(runId);

  /**
   * Postgres: creates or upgrades the schema (tables job, job_run,
   * job_step and their indexes). Idempotent; safe from several processes
   * at once. Memory: a no-op.
   */
  async migrate(): Promise<void> {
    if (!this.pg) return;
    const pg = this.pg;
    await this.registering;
    await db(pg.migrate());
    // Handlers registered before the tables existed could not be stored:
    // store them now.
    this.registerError = null;
    this.defsUnsaved = this.pgSpecs.size > 0;
    await this.ready();
  }

  /** Writes definitions to the database in the background (see `ready`). */
  private persistDefinitions(pg: PgEngine, specsText: string): void {
    this.registering = this.registering.then(() =>
      db(pg.register(specsText)).then(
        () => undefined,
        (e) => {
          this.registerError = e;
          this.defsUnsaved = true;
        },
      ),
    );
  }

  /**
   * Postgres: closes idle database connections (stop the worker first).
   * The orchestrator reconnects if used again. Memory: a no-op.
   */
  async close(): Promise<void> {
    if (!this.pg) return;
    await this.registering.catch(() => undefined);
    this.pg.close();
  }

  /**
   * Waits for background definition writes (Postgres). After one failed
   * (the database was down, or its tables not created yet), every
   * definition is written again first, so handlers registered during an
   * outage are stored once the database answers; a failure is thrown.
   */
  private async ready(): Promise<void> {
    await this.registering;
    if (this.defsUnsaved && this.pg && this.pgSpecs.size > 0) {
      this.defsUnsaved = false;
      this.registerError = null;
      this.persistDefinitions(this.pg, JSON.stringify([...this.pgSpecs.values()]));
      await this.registering;
    }
    if (this.registerError !== null) {
      const e = this.registerError;
      this.registerError = null;
      throw e;
    }
  }

  // ── registration ───────────────────────────────────────────────────

  /**
   * Creates or replaces the definition of `type` and remembers its handler.
   * With a job map, `ctx.input` is the map's input of `type`; without one,
   * `TInput` is inferred from the handler or the meta, or given explicitly.
   */
  registerHandler<TInput = unknown, K extends JobTypeName<Jobs> = JobTypeName<Jobs>>(
    type: K,
    meta: JobHandlerMeta<HandlerInput<Jobs, K, TInput>>,
    handler: JobHandler<HandlerInput<Jobs, K, TInput>, Jobs>,
  ): void {
    this.registerAll([{ type, meta: meta as JobHandlerMeta<unknown>, handler: handler as JobHandler<unknown> }]);
  }

  /** Registers every entry (all or none). Memory mode: `orphaned` is always empty. */
  async upsertJobRows(
    entries: JobUpsertEntry[],
    poolConfig?: ReadonlyMap<string, JobPoolDef>,
  ): Promise<{ orphaned: string[] }> {
    void poolConfig; // pool validation belongs to the module that owns pools
    if (!Array.isArray(entries)) throw new JobInputInvalidError('entries must be an array');
    this.registerAll(
      entries.map((e) => ({
        type: e?.type,
        meta: e?.meta as JobHandlerMeta<unknown>,
        handler: e?.handlerClass as JobHandler<unknown>,
      })),
    );
    if (!this.pg) return { orphaned: [] };
    await this.ready();
    const named = new Set(entries.map((e) => e.type));
    const stored = await db(this.pg.storedJobTypes());
    return { orphaned: stored.filter((t) => !named.has(t)) };
  }

  private registerAll(entries: { type: string; meta: JobHandlerMeta<unknown>; handler: JobHandler<unknown> }[]): void {
    // Postgres writes definitions in the background: they carry this time.
    const registeredAt = this.local.now();
    const specs = entries.map(({ type, meta, handler }) => {
      if (typeof type !== 'string' || type.length === 0) {
        throw new JobInputInvalidError('job type must be a non-empty string');
      }
      const m = meta ?? {};
      if (typeof m !== 'object') throw new JobInputInvalidError(`meta of '${type}' must be an object`);
      const okHandler =
        typeof handler === 'function' ||
        (handler !== null && typeof handler === 'object' && typeof (handler as { run?: unknown }).run === 'function');
      if (!okHandler) {
        throw new JobInputInvalidError(
          `handler of '${type}' must be a class with run(ctx), a function, or an object with run(ctx)`,
        );
      }
      const key = (k: unknown, what: string): string | undefined => {
        if (k === undefined || k === null) return undefined;
        if (typeof k === 'function') return '<fn>';
        if (typeof k === 'string') return k;
        throw new JobInputInvalidError(`${what} key of '${type}' must be a template string or a function`);
      };
      // JSON would turn NaN/Infinity into null, silently switching a feature
      // off; the engine stores whole milliseconds and counts.
      const finite = (v: unknown, what: string, min: number) => {
        if (v !== undefined && v !== null && (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min)) {
          throw new JobInputInvalidError(`${what} of '${type}' must be an integer >= ${min}, got ${String(v)}`);
        }
      };
      finite(m.timeoutMs, 'timeoutMs', 1);
      finite(m.dedupe?.windowMs, 'dedupe.windowMs', 0);
      finite(m.retry?.attempts, 'retry.attempts', 1);
      finite(m.retry?.baseMs, 'retry.baseMs', 0);
      // null is "not given" throughout the meta, as in the seed (`meta.pool ?? 'batch'`).
      if (m.retry !== undefined && m.retry !== null) checkRetryPolicy(m.retry, `retry of '${type}'`);
      const strings: [unknown, string][] = [
        [m.pool, 'pool'],
        [m.replayFrom, 'replayFrom'],
        [m.concurrency?.collisionMode, 'concurrency.collisionMode'],
      ];
      for (const [v, what] of strings) {
        if (v !== undefined && v !== null && typeof v !== 'string') {
          throw new JobInputInvalidError(`${what} of '${type}' must be a string, got ${typeof v}`);
        }
      }
      if (m.scope !== undefined && (typeof m.scope?.entity !== 'string' || typeof m.scope?.from !== 'function')) {
        throw new JobInputInvalidError(`scope of '${type}' needs entity (string) and from (function)`);
      }
      return {
        type,
        pool: m.pool,
        scopeEntityType: m.scope?.entity,
        retry: m.retry,
        timeoutMs: m.timeoutMs,
        concurrencyKey: key(m.concurrency?.key, 'concurrency'),
        collisionMode: m.concurrency?.collisionMode,
        dedupeKey: key(m.dedupe?.key, 'dedupe'),
        dedupeWindowMs: m.dedupe?.windowMs,
        replayFrom: m.replayFrom,
        registeredAt,
      };
    });
    const specsText = JSON.stringify(specs);
    const defs = JSON.parse(call(() => this.native.register(specsText))) as JobDefinitionRow[];
    for (const d of defs) {
      if (d.concurrencyKeyTemplate === null && d.dedupeKeyTemplate === null && !this.multiTenant) {
        this.plainTypes.set(d.type, {
          version: d.version,
          pool: d.pool,
          priority: d.priorityDefault,
          wire: `${Buffer.byteLength(d.type)}:${d.type}`,
        });
      } else this.plainTypes.delete(d.type);
    }
    if (this.pg) {
      for (const spec of specs) this.pgSpecs.set(spec.type, spec);
      this.persistDefinitions(this.pg, specsText);
    }
    for (const { type, meta, handler } of entries) {
      this.handlers.set(type, { type, meta: meta ?? {}, handlerClass: handler });
    }
  }

  getHandlerRegistration(type: string): HandlerRegistration | undefined {
    return this.handlers.get(type);
  }

  async getDefinition(type: string): Promise<JobDefinitionRow | null> {
    let json: string | null;
    if (this.pg) {
      await this.ready();
      json = await db(this.pg.definition(String(type)));
    } else json = this.native.definition(String(type));
    return json === null ? null : parseDefinition(JSON.parse(json));
  }

  // ── start ──────────────────────────────────────────────────────────

  /** Starts a run (contract "start"). `tx` is accepted for signature parity and ignored. */
  start<K extends JobTypeName<Jobs>>(type: K, input: Jobs[K], opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  /** A run of a job type whose input may be left out (stored as `{}`). */
  start<K extends OptionalInputName<Jobs>>(type: K, input?: Jobs[K] | null, opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  async start(type: string, input?: unknown, opts?: StartOptions, tx?: unknown): Promise<JobRun> {
    void tx;
    if (this.pg) return this.startPg(this.pg, type, input, opts);
    return this.startNow(type, input, opts);
  }

  /** Postgres `start`: the same checks, then one async engine call. */
  private async startPg(pg: PgEngine, type: string, input: unknown, opts: StartOptions | undefined): Promise<JobRun> {
    await this.ready();
    const req = this.prepareStart(type, input, opts);
    if ('thrown' in req) {
      await db(pg.startPreflight(type, tenantGiven(opts), opts?.tenantId ?? null, typeof opts?.parentRunId === 'string'));
      throw req.thrown;
    }
    const json = await db(pg.start(type, req.inputText, req.optsText));
    this.afterMutation();
    return parseRun(json);
  }

  /**
   * The JS side of `start`: input and option checks and the keys only JS
   * can evaluate. `thrown`: a key function threw (the engine's earlier
   * checks still take precedence over it).
   */
  private prepareStart(
    type: string,
    input: unknown,
    opts: StartOptions | undefined,
  ): { inputText: string; optsText: string | null } | { thrown: unknown } {
    if (typeof type !== 'string') throw new JobInputInvalidError('job type must be a string');
    const payload = input === undefined || input === null ? {} : input;
    const j = (() => {
      try {
        return toJsonText(payload, 'input');
      } catch (e) {
        throw new JobInputInvalidError(`input: ${(e as Error)?.message ?? e}`);
      }
    })();
    if (!j.ok) throw new JobInputInvalidError(j.reason);
    const reg = this.handlers.get(type);
    const needsJs =
      reg !== undefined &&
      (typeof reg.meta.concurrency?.key === 'function' ||
        typeof reg.meta.dedupe?.key === 'function' ||
        (reg.meta.scope !== undefined && opts?.scope === undefined));
    if (opts === undefined && !needsJs) return { inputText: j.text, optsText: null };
    const o = startOptions(opts);
    if (needsJs && reg) {
      try {
        const m = reg.meta;
        if (typeof m.concurrency?.key === 'function') o.concurrencyKey = String(m.concurrency.key(payload));
        if (typeof m.dedupe?.key === 'function') o.dedupeKey = String(m.dedupe.key(payload));
        if (m.scope !== undefined && opts?.scope === undefined) o.scopeEntityIdFromMeta = String(m.scope.from(payload));
      } catch (e) {
        return { thrown: e };
      }
    }
    return { inputText: j.text, optsText: JSON.stringify(o) };
  }

  /**
   * A plain start (no options, no keys, single tenant): nothing the engine
   * checks can fail once the type is registered and the input is JSON, and
   * the row follows from the definition. So the id and time are chosen
   * here and the run is handed to the engine with others in one call.
   */
  private startBuffered(type: string, plain: RunDefaults & { wire: string }, inputText: string, input: Record<string, unknown>): JobRun {
    const id = this.nextRunId();
    let at: number;
    if (this.clock === 'manual') at = this.engine.now();
    else {
      at = Date.now();
      if (at < this.lastStartAt) at = this.lastStartAt;
      else this.lastStartAt = at;
    }
    this.startBuf += `${id}${at},${plain.wire}${inputText}\n`;
    this.startCount++;
    const rt = this.worker;
    if (this.startCount >= START_BATCH_MAX || (rt !== null && rt.running && !rt.busy && rt.hasIdleSlot(plain.pool))) {
      // An idle worker takes the run at once. A busy one gets it with the
      // next report of a finishing attempt (or on the next turn of the
      // event loop): one native call for both.
      this.flushStarts();
    } else if (!this.startFlushArmed) {
      this.startFlushArmed = true;
      setImmediate(this.flushLater);
    }
    return newRun(type, plain, id, at, input);
  }

  /**
   * A fresh run id (UUID v4) for a buffered start, from a block the engine
   * generates 256 at a time: slicing the block costs less than
   * `randomUUID()` per start.
   */
  private nextRunId(): string {
    if (this.idAt >= this.idBlock.length) {
      try {
        this.idBlock = this.engine.newRunIds(256);
      } catch {
        return randomUUID();
      }
      this.idAt = 0;
    }
    const id = this.idBlock.slice(this.idAt, this.idAt + 36);
    this.idAt += 36;
    return id;
  }

  private startNow(type: string, input: unknown, opts: StartOptions | undefined): JobRun {
    if (typeof type !== 'string') throw new JobInputInvalidError('job type must be a string');
    const payload = input === undefined || input === null ? {} : input;
    let inputText: string;
    let flat: FlatSnapshot | null = null;
    try {
      flat = flatSnapshot(payload);
      if (flat !== null) inputText = flat.text;
      else {
        const j = toJsonText(payload, 'input');
        if (!j.ok) throw new JobInputInvalidError(j.reason);
        inputText = j.text;
      }
    } catch (e) {
      throw e instanceof JobInputInvalidError ? e : new JobInputInvalidError(`input: ${(e as Error)?.message ?? e}`);
    }
    const reg = this.handlers.get(type);
    const needsJs =
      reg !== undefined &&
      (typeof reg.meta.concurrency?.key === 'function' ||
        typeof reg.meta.dedupe?.key === 'function' ||
        (reg.meta.scope !== undefined && opts?.scope === undefined));
    if (opts === undefined && !needsJs) {
      const plain = this.plainTypes.get(type);
      if (plain !== undefined) {
        // The row's input is a copy: a flat object's shallow copy is one.
        const copy = flat !== null ? flat.copy : (JSON.parse(inputText) as Record<string, unknown>);
        return this.startBuffered(type, plain, inputText, copy);
      }
      const json = call(() => this.native.start(type, inputText, null));
      // Only a 'replace' collision can cancel (and so abort or report) runs.
      if (reg?.meta.concurrency?.collisionMode === 'replace') this.afterMutation();
      this.feedWorker();
      return parseRun(json);
    }
    const o = startOptions(opts);
    if (needsJs && reg) {
      // JS-side keys (function keys, meta.scope.from) run before the native
      // call; if one throws, the engine's earlier checks (tenant gate, job
      // type) still take precedence, then the caller's exception propagates.
      try {
        const m = reg.meta;
        if (typeof m.concurrency?.key === 'function') o.concurrencyKey = String(m.concurrency.key(payload));
        if (typeof m.dedupe?.key === 'function') o.dedupeKey = String(m.dedupe.key(payload));
        if (m.scope !== undefined && opts?.scope === undefined) o.scopeEntityIdFromMeta = String(m.scope.from(payload));
      } catch (e) {
        call(() =>
          this.native.startPreflight(type, tenantGiven(opts), opts?.tenantId ?? null, typeof opts?.parentRunId === 'string'),
        );
        throw e;
      }
    }
    const json = call(() => this.native.start(type, inputText, JSON.stringify(o)));
    if (reg?.meta.concurrency?.collisionMode === 'replace') this.afterMutation();
    this.feedWorker();
    return parseRun(json);
  }

  // ── cancel / replay / claim / tick ─────────────────────────────────

  /** Cancels a run and (default) its descendants; unknown or terminal runs are a no-op. */
  async cancel(runId: string, opts: CancelOptions = {}): Promise<void> {
    const o = opts ?? {};
    const args = [String(runId), o.cascade !== false, tenantGiven(o), o.tenantId ?? null] as const;
    if (this.pg) {
      await this.ready();
      await db(this.pg.cancel(...args));
    } else call(() => this.native.cancel(...args));
    this.afterMutation();
  }

  /** Resets a terminal run to pending (contract "replay"). */
  async replay(runId: string): Promise<JobRun> {
    if (this.pg) {
      await this.ready();
      return parseRun(await db(this.pg.replay(String(runId))));
    }
    return parseRun(call(() => this.native.replay(String(runId))));
  }

  /** Claims the next due, claimable run of `pool`, or null. */
  async claimNext(pool: string): Promise<JobRun | null> {
    if (typeof pool !== 'string') throw new JobInputInvalidError('pool must be a string');
    const json = this.pg ? await db(this.pg.claimNext(pool)) : call(() => this.native.claimNext(pool));
    return json === null ? null : parseRun(json);
  }

  /**
   * Executes one claimed (`running`) run: the engine opens the attempt, the
   * handler runs here on the JS thread (racing its timeout and a cancel),
   * and the engine applies the outcome (completion, retry, failure,
   * cascade). Two synchronous native calls per run, no thread hop.
   */
  async tick(runId: string): Promise<void> {
    if (typeof runId !== 'string') throw new JobInputInvalidError('runId must be a string');
    const pg = this.pg;
    if (pg) await this.ready();
    const ticket = new Ticket(pg ? await db(pg.beginAttempt(runId)) : call(() => this.native.beginAttempt(runId)));
    const outcome = await this.attempt(ticket, new Attempt());
    if (outcome === null) return; // canceled meanwhile: nothing to apply
    const applied = pg
      ? await db(pg.finishAttempt(ticket.id, ticket.epoch, outcome.text))
      : call(() => this.native.finishAttempt(ticket.id, ticket.epoch, outcome.text));
    this.afterMutation();
    if (applied && outcome.status === 'timed_out') this.inFlight.get(ticket.id)?.abort('timed_out');
    this.inFlight.delete(ticket.id);
  }

  // ── queries ────────────────────────────────────────────────────────

  async findById(runId: string, opts?: TenantOptions): Promise<JobRun | null> {
    const args = [String(runId), tenantGiven(opts), opts?.tenantId ?? null] as const;
    const json = this.pg ? await db(this.pg.findById(...args)) : call(() => this.native.findById(...args));
    return json === null ? null : parseRun(json);
  }

  async listSteps(runId: string, opts?: TenantOptions): Promise<JobStep[]> {
    const args = [String(runId), tenantGiven(opts), opts?.tenantId ?? null] as const;
    const json = this.pg ? await db(this.pg.listSteps(...args)) : call(() => this.native.listSteps(...args));
    return (JSON.parse(json) as Record<string, unknown>[]).map(parseStep);
  }

  /** A step row of a run, or null. */
  async findStep(runId: string, stepId: string, opts?: TenantOptions): Promise<JobStep | null> {
    const args = [tenantGiven(opts), opts?.tenantId ?? null, String(runId), String(stepId)] as const;
    const json = this.pg ? await db(this.pg.findStep(...args)) : call(() => this.native.findStep(...args));
    return json === null ? null : parseStep(JSON.parse(json));
  }

  /** Inserts or updates the step row of `(jobRunId, stepId)` (the step service's upsert). */
  async recordStep(input: RecordStepInput, opts?: TenantOptions): Promise<JobStep> {
    if (input === null || typeof input !== 'object') throw new JobInputInvalidError('recordStep needs an object');
    const wire: Record<string, unknown> = { ...input };
    for (const k of ['startedAt', 'finishedAt'] as const) {
      const d = input[k];
      if (d !== undefined && d !== null) {
        const t = dateMs(d);
        if (t === null) throw new JobInputInvalidError(`${k} must be a valid Date`);
        wire[k] = t;
      }
    }
    for (const k of ['input', 'output'] as const) {
      if (input[k] !== undefined) {
        const j = toJsonText(input[k], k);
        if (!j.ok) throw new JobInputInvalidError(j.reason);
      }
    }
    const args = [tenantGiven(opts), opts?.tenantId ?? null, JSON.stringify(wire)] as const;
    const json = this.pg ? await db(this.pg.recordStep(...args)) : call(() => this.native.recordStep(...args));
    return parseStep(JSON.parse(json));
  }

  // ── run service ────────────────────────────────────────────────────

  /** Runs of a scope, newest first unless `orderBy: 'createdAt:asc'`; limit default 50, max 500. */
  async listForScope(entityType: string, entityId: string, opts: ListForScopeOptions = {}): Promise<JobRun[]> {
    const o = opts ?? {};
    checkCount('limit', o.limit);
    checkCount('offset', o.offset);
    const q = { status: o.status, jobType: o.jobType, limit: o.limit, offset: o.offset, orderBy: o.orderBy };
    const args = [tenantGiven(o), o.tenantId ?? null, String(entityType), String(entityId), JSON.stringify(q)] as const;
    const json = this.pg ? await db(this.pg.listForScope(...args)) : call(() => this.native.listForScope(...args));
    return parseRuns(json);
  }

  /** Cancels (with cascade) every live run of a scope; resolves with how many were canceled. */
  async cancelForScope(entityType: string, entityId: string, opts: CancelOptions = {}): Promise<number> {
    const o = opts ?? {};
    const args = [tenantGiven(o), o.tenantId ?? null, String(entityType), String(entityId), o.cascade !== false] as const;
    const n = this.pg ? await db(this.pg.cancelForScope(...args)) : call(() => this.native.cancelForScope(...args));
    this.afterMutation();
    return n;
  }

  /** Moves the `runAt` of a scope's pending runs (others untouched); resolves with how many moved. */
  async rescheduleForScope(entityType: string, entityId: string, newRunAt: Date, opts: TenantOptions = {}): Promise<number> {
    const newRunAtMs = dateMs(newRunAt);
    if (newRunAtMs === null) throw new JobInputInvalidError('newRunAt must be a valid Date');
    const o = opts ?? {};
    const args = [tenantGiven(o), o.tenantId ?? null, String(entityType), String(entityId), newRunAtMs] as const;
    if (this.pg) return db(this.pg.rescheduleForScope(...args));
    return call(() => this.native.rescheduleForScope(...args));
  }

  /** Run counts per pool and status, terminal statuses included (maintained incrementally). */
  async countByPoolAndStatus(tenantId?: string | null): Promise<PoolStatusCount[]> {
    checkTenant(tenantId);
    const given = tenantId !== undefined;
    const json = this.pg
      ? await db(this.pg.countByPoolAndStatus(given, tenantId ?? null))
      : call(() => this.native.countByPoolAndStatus(given, tenantId ?? null));
    return JSON.parse(json) as PoolStatusCount[];
  }

  /** Failed runs, most recently finished first; limit default 50, max 500. */
  async listRecentFailed(limit?: number, tenantId?: string | null): Promise<JobRun[]> {
    if (limit !== undefined && typeof limit !== 'number') throw new JobInputInvalidError('limit must be a number');
    checkTenant(tenantId);
    const given = tenantId !== undefined;
    const args = [given, tenantId ?? null, limit ?? null] as const;
    return parseRuns(
      this.pg ? await db(this.pg.listRecentFailed(...args)) : call(() => this.native.listRecentFailed(...args)),
    );
  }

  /**
   * One page of runs, newest first by `(createdAt, id)`. Pass `nextCursor`
   * back as `cursor` for the next page; it is null on the last page.
   * `limit` default 50, max 500.
   */
  async listJobRuns(opts: ListJobRunsOptions = {}): Promise<{ rows: JobRun[]; nextCursor: string | null }> {
    const o = opts ?? {};
    checkCount('limit', o.limit);
    let since: number | undefined;
    if (o.since !== undefined) {
      const t = dateMs(o.since);
      if (t === null) throw new JobInputInvalidError('since must be a valid Date');
      since = t;
    }
    const q = { poolId: o.poolId, rootRunId: o.rootRunId, status: o.status, since, cursor: o.cursor, limit: o.limit };
    const args = [tenantGiven(o), o.tenantId ?? null, JSON.stringify(q)] as const;
    const text = this.pg ? await db(this.pg.listJobRuns(...args)) : call(() => this.native.listJobRuns(...args));
    const page = JSON.parse(text) as {
      rows: RunTuple[];
      nextCursor: string | null;
    };
    return { rows: page.rows.map(fromTuple), nextCursor: page.nextCursor };
  }

  // ── schedules ──────────────────────────────────────────────────────

  /**
   * Creates or replaces the schedule `name` (per tenant): from then on the
   * engine starts a run of `jobType` with `input` at every fire time, as
   * `start` would (the type's pool, dedupe and lanes apply), with
   * `triggerSource: 'schedule'`, `triggerRef: name` and `runAt` = the fire
   * time. Runs are started by a running worker (`startWorker`), or by
   * `claimNext` (memory) and `fireDueSchedules`. Fire times missed while
   * nothing fired collapse into one run. With PostgreSQL, any number of
   * processes may run workers: each occurrence starts one run.
   *
   * Replacing a schedule with the same timing keeps its next fire, so
   * declaring schedules at every boot is safe. Rejects with
   * `JobInputInvalidError` (bad name, cron expression, time zone or
   * interval, input not JSON), `JobTypeNotFoundError`,
   * `JobKeyFunctionUnavailableError` (a function key or `meta.scope` needs
   * the registering process), `JobTemplateFieldMissingError` (a template
   * key the input cannot fill) or `MissingTenantIdError`; nothing is
   * stored then.
   */
  schedule<K extends JobTypeName<Jobs>>(name: string, opts: TypedScheduleOptions<Jobs, K>): Promise<JobSchedule>;
  async schedule(name: string, opts: ScheduleOptions): Promise<JobSchedule> {
    await this.ready();
    if (typeof name !== 'string') throw new JobInputInvalidError('schedule name must be a string');
    // Crossing into Rust, a lone surrogate becomes U+FFFD: two names would be one.
    if (LONE_SURROGATE.test(name)) throw new JobInputInvalidError('schedule name must not hold a lone surrogate');
    if (typeof opts !== 'object' || opts === null) throw new JobInputInvalidError('schedule options must be an object');
    const { jobType, cron, everyMs, timezone } = opts;
    if (typeof jobType !== 'string') throw new JobInputInvalidError('schedule jobType must be a string');
    if (cron !== undefined && typeof cron !== 'string') throw new JobInputInvalidError('cron must be a string');
    if (timezone !== undefined && typeof timezone !== 'string') throw new JobInputInvalidError('timezone must be a string');
    if (everyMs !== undefined && typeof everyMs !== 'number') throw new JobInputInvalidError('everyMs must be a number');
    const payload = opts.input === undefined || opts.input === null ? {} : opts.input;
    const j = toJsonText(payload, 'input');
    if (!j.ok) throw new JobInputInvalidError(j.reason);
    const args = [tenantGiven(opts), opts.tenantId ?? null, name, jobType, j.text, cron ?? null, timezone ?? null, everyMs ?? null] as const;
    const json = this.pg ? await db(this.pg.putSchedule(...args)) : call(() => this.native.putSchedule(...args));
    return parseSchedule(JSON.parse(json) as Record<string, unknown>);
  }

  /** Removes a schedule; resolves with whether there was one. Runs it started are not touched. */
  async unschedule(name: string, opts?: TenantOptions): Promise<boolean> {
    await this.ready();
    if (typeof name !== 'string') throw new JobInputInvalidError('schedule name must be a string');
    const args = [tenantGiven(opts), opts?.tenantId ?? null, name] as const;
    return this.pg ? db(this.pg.removeSchedule(...args)) : call(() => this.native.removeSchedule(...args));
  }

  /** The schedules of a tenant (single-tenant mode: all), by name. */
  async listSchedules(opts?: TenantOptions): Promise<JobSchedule[]> {
    await this.ready();
    const args = [tenantGiven(opts), opts?.tenantId ?? null] as const;
    const json = this.pg ? await db(this.pg.listSchedules(...args)) : call(() => this.native.listSchedules(...args));
    return (JSON.parse(json) as Record<string, unknown>[]).map(parseSchedule);
  }

  /**
   * Starts the runs of every schedule that is due now; resolves with how
   * many were created. A running worker does this by itself; this is for
   * processes without one (or tests with `clock: 'manual'`).
   */
  async fireDueSchedules(): Promise<number> {
    await this.ready();
    const n = this.pg ? await db(this.pg.fireDueSchedules()) : call(() => this.native.fireDueSchedules());
    if (n > 0) this.afterMutation();
    return n;
  }

  /** The tree of runs under a root (parent → children, each with its status), or null. */
  async getRunTree(rootRunId: string, opts?: TenantOptions): Promise<RunTreeNode | null> {
    const args = [tenantGiven(opts), opts?.tenantId ?? null, String(rootRunId)] as const;
    const json = this.pg ? await db(this.pg.getRunTree(...args)) : call(() => this.native.getRunTree(...args));
    if (json === null) return null;
    // Without recursion: a chain of runs each spawning the next can be
    // thousands deep.
    type RawNode = { run: RunTuple; children: RawNode[] };
    const raw = JSON.parse(json) as RawNode;
    const root: RunTreeNode = { run: fromTuple(raw.run), children: [] };
    const todo: [RawNode, RunTreeNode][] = [[raw, root]];
    for (let next = todo.pop(); next; next = todo.pop()) {
      const [from, to] = next;
      for (const c of from.children) {
        const node: RunTreeNode = { run: fromTuple(c.run), children: [] };
        to.children.push(node);
        todo.push([c, node]);
      }
    }
    return root;
  }

  // ── time ───────────────────────────────────────────────────────────

  /** Current engine time. */
  now(): Date {
    return new Date(this.local.now());
  }

  /** Moves the manual clock forward by `ms`; throws on the system clock. */
  advanceTime(ms: number): Date {
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      throw new JobInputInvalidError(`advanceTime needs a non-negative number of ms, got ${String(ms)}`);
    }
    // Buffered starts were made at the time before this move.
    if (!this.pg) this.flushStarts();
    const t = this.local.advanceTime(ms);
    if (t === null) throw new JobClockError("advanceTime needs an orchestrator created with clock: 'manual'");
    for (const timer of [...this.manualTimers].sort((x, y) => x.deadline - y.deadline)) {
      if (timer.deadline <= t) {
        this.manualTimers.delete(timer);
        timer.resolve();
      }
    }
    return new Date(t);
  }

  /**
   * Engine-time sleep: a timer on the system clock; on the manual clock a
   * timer that `advanceTime` fires. Cancelable, so a finished race leaves
   * nothing behind that could keep the process alive.
   */
  private sleep(ms: number): { promise: Promise<void>; cancel: () => void } {
    if (this.clock === 'manual') {
      const deadline = this.local.now() + ms;
      let entry!: ManualTimer;
      const promise = new Promise<void>((resolve) => {
        entry = { deadline, resolve };
      });
      if (deadline <= this.local.now()) entry.resolve();
      else this.manualTimers.add(entry);
      return { promise, cancel: () => this.manualTimers.delete(entry) };
    }
    let cancel = () => undefined as void;
    const promise = new Promise<void>((resolve) => {
      cancel = after(ms, resolve);
    });
    return { promise, cancel: () => cancel() };
  }

  // ── handler execution (called by the engine) ───────────────────────

  /** Fires `ctx.signal` of every attempt the engine aborted and emits queued run events. */
  private flushAborts(): void {
    const json = this.local.takeNotices();
    if (json === null) return;
    const notices = JSON.parse(json) as { aborts: { runId: string; epoch?: number; reason: string }[]; events: RunTuple[] };
    for (const { runId, epoch, reason } of notices.aborts) {
      // A notice is for one attempt: one queued while the run was claimed
      // but not executing must not stop a later attempt (after a replay).
      const attempt = this.inFlight.get(runId);
      if (attempt !== undefined && (epoch === undefined || attempt.epoch === epoch)) attempt.abort(reason);
    }
    for (const raw of notices.events) this.emit(fromTuple(raw));
  }

  // ── events ─────────────────────────────────────────────────────────

  /** Listens for run transitions: `run:completed | run:failed | run:canceled | run:timed_out | run:retrying`. */
  on(event: RunEventName, listener: RunEventListener): this {
    if (!RUN_EVENTS.has(event)) throw new JobInputInvalidError(`unknown event '${String(event)}'`);
    if (typeof listener !== 'function') throw new JobInputInvalidError('listener must be a function');
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener);
    this.syncEvents();
    return this;
  }

  off(event: RunEventName, listener: RunEventListener): this {
    this.listeners.get(event)?.delete(listener);
    this.syncEvents();
    return this;
  }

  /** Resolves with the run's row once it is terminal (at once if it already is). */
  async waitForRun(runId: string, opts: WaitForRunOptions = {}): Promise<JobRun> {
    const o = opts ?? {};
    if (o.timeoutMs !== undefined && !(typeof o.timeoutMs === 'number' && o.timeoutMs >= 0)) {
      throw new JobInputInvalidError('timeoutMs must be a non-negative number');
    }
    // The timeout counts from the call, lookups included (a database that
    // stopped answering must not make the wait unbounded).
    let cancelTimer = () => undefined as void;
    const timeout =
      o.timeoutMs === undefined
        ? null
        : new Promise<never>((_, reject) => {
            cancelTimer = after(o.timeoutMs!, () => reject(new JobWaitTimeoutError(String(runId), o.timeoutMs!)));
          });
    const bounded = <T>(p: Promise<T>): Promise<T> => (timeout === null ? p : Promise.race([p, timeout]));
    let stopPolling = () => undefined as void;
    let unregister = () => undefined as void;
    try {
      // Waiters are keyed by the canonical id (ids parse as UUIDs in any spelling).
      const found = await bounded(this.findById(runId, o));
      if (!found) throw new JobRunNotFoundError(String(runId));
      if (TERMINAL.has(found.status)) return found;
      const id = found.id;
      let resolveFn!: (run: JobRun) => void;
      const done = new Promise<JobRun>((resolve) => (resolveFn = resolve));
      // Listen before looking, so a transition in between is not missed.
      let set = this.waiters.get(id);
      if (!set) this.waiters.set(id, (set = new Set()));
      set.add(resolveFn);
      // Only this run's transitions are reported for the wait.
      this.local.watchRun(id, true);
      unregister = () => {
        const s = this.waiters.get(id);
        s?.delete(resolveFn);
        if (s && s.size === 0) this.waiters.delete(id);
        this.local.watchRun(id, false);
      };
      const row = await bounded(this.findById(id, o));
      if (!row) throw new JobRunNotFoundError(id);
      if (TERMINAL.has(row.status)) return row;
      // Postgres: another process may run it; look now and then as well.
      if (this.pg) stopPolling = this.pollUntilTerminal(id, o, resolveFn);
      return await bounded(done);
    } finally {
      cancelTimer();
      stopPolling();
      unregister();
    }
  }

  /** Polls a run's row until it is terminal (Postgres `waitForRun`). */
  private pollUntilTerminal(runId: string, o: TenantOptions, resolve: (run: JobRun) => void): () => void {
    let stopped = false;
    let cancel = () => undefined as void;
    const look = async () => {
      if (stopped) return;
      try {
        const row = await this.findById(runId, o);
        if (row && TERMINAL.has(row.status)) return resolve(row);
      } catch {
        /* a failed look is retried */
      }
      if (!stopped) cancel = after(100, () => void look());
    };
    cancel = after(100, () => void look());
    return () => {
      stopped = true;
      cancel();
    };
  }

  private syncEvents(): void {
    let any = false;
    for (const set of this.listeners.values()) any ||= set.size > 0;
    if (any !== this.eventsOn) {
      this.eventsOn = any;
      this.local.setEvents(any);
    }
  }

  private emit(run: JobRun): void {
    const event = (run.status === 'pending' ? 'run:retrying' : `run:${run.status}`) as RunEventName;
    for (const listener of this.listeners.get(event) ?? []) {
      try {
        const r: unknown = listener(run);
        // An async listener's rejection would otherwise be unhandled (and
        // end the process): logged like a throw.
        if ((typeof r === 'object' && r !== null) || typeof r === 'function') {
          Promise.resolve(r).then(undefined, (e: unknown) => this.logger.error(`jobforge: a '${event}' listener threw`, e));
        }
      } catch (e) {
        // A throwing listener must not break the engine or other listeners.
        this.logger.error(`jobforge: a '${event}' listener threw`, e);
      }
    }
    if (TERMINAL.has(run.status)) {
      const set = this.waiters.get(run.id);
      if (set) for (const resolve of [...set]) resolve(run);
    }
  }

  // ── worker ─────────────────────────────────────────────────────────

  /**
   * Starts executing runs by itself: the Rust scheduler claims runs per pool
   * up to its concurrency (woken by starts and by timers for future runs,
   * never polling) and hands them to the handlers; a finishing attempt
   * claims its pool's next run in the same native call.
   */
  startWorker(opts: WorkerOptions = {}): WorkerHandle {
    if (this.worker?.running) throw new JobWorkerStateError('a worker is already running on this orchestrator');
    if (this.worker && !this.worker.stopped) {
      // Its in-flight attempts still report to the engine's worker slots.
      throw new JobWorkerStateError('the previous worker is still stopping: await its stop() first');
    }
    const o = opts ?? {};
    const poolsIn = o.pools ?? { batch: { concurrency: 5 }, interactive: { concurrency: 20 } };
    if (poolsIn === null || typeof poolsIn !== 'object') throw new JobInputInvalidError('pools must be an object');
    const pools = Object.entries(poolsIn).map(([name, p]) => {
      const c = p?.concurrency;
      if (!Number.isInteger(c) || (c as number) < 1 || (c as number) > 100_000) {
        throw new JobInputInvalidError(`pool '${name}' needs an integer concurrency between 1 and 100000`);
      }
      return { name, concurrency: c as number };
    });
    if (pools.length === 0) throw new JobInputInvalidError('a worker needs at least one pool');
    const shutdownTimeoutMs = o.shutdownTimeoutMs ?? 10_000;
    if (typeof shutdownTimeoutMs !== 'number' || !(shutdownTimeoutMs >= 0)) {
      throw new JobInputInvalidError('shutdownTimeoutMs must be a non-negative number');
    }
    const capacity = new Map(pools.map((p) => [p.name, p.concurrency]));
    const pg = this.pg;
    const runtime = pg
      ? new WorkerRuntime(
          capacity,
          shutdownTimeoutMs,
          () => pg.workerStop(),
          (id, epoch) => db(pg.releaseAttempt(id, epoch)),
          () => pg.workerInFlight(),
          this.logger,
        )
      : new WorkerRuntime(
          capacity,
          shutdownTimeoutMs,
          () => this.native.workerStop(),
          (id, epoch) => this.native.releaseAttempt(id, epoch),
          () => this.native.workerInFlight(),
          this.logger,
        );
    const onBatch = (json: string) => this.onWorkerBatch(runtime, json);
    try {
      call(() => (pg ? pg.startWorker(JSON.stringify(pools), onBatch) : this.native.startWorker(JSON.stringify(pools), onBatch)));
    } catch (e) {
      // Refused by the engine: the runtime never ran, so it must not keep Node alive.
      runtime.discard();
      throw e;
    }
    this.worker = runtime;
    return runtime.handle(this.inFlight);
  }

  /**
   * After a start: if the worker has idle slots, claim into them here on
   * the JS thread instead of waiting for the scheduler's thread hand-off.
   */
  private feedWorker(pool?: string): void {
    const rt = this.worker;
    if (!rt || !rt.running || !rt.hasIdleSlot(pool)) return;
    const lines = this.native.workerFill();
    if (lines.length === 0) return;
    this.onReplyLines(lines, 0);
  }

  /** A ticket that arrived after stop(): its run goes back to pending, its slot is freed. */
  private releaseTicket(ticket: Ticket): void {
    const pg = this.pg;
    if (pg) {
      const { id, epoch, pool } = ticket;
      void db(pg.releaseAttempt(id, epoch))
        .catch(() => false)
        .finally(() => pg.workerDone(id, epoch, null, pool));
      return;
    }
    this.engine.releaseAttempt(ticket.id, ticket.epoch);
    // No outcome: frees the slot (a stopping worker claims nothing into it).
    const slot = this.worker?.slotOf.get(ticket.pool) ?? -1;
    this.engine.workerReport(`${ticket.id}${ticket.epoch},${slot},\n`, null);
  }

  private onWorkerBatch(runtime: WorkerRuntime, lines: string): void {
    if (lines.startsWith('!')) {
      // A notice from the engine's worker loop (database trouble, rate-limited there).
      this.logger.error(`jobforge: ${lines.slice(1)}`);
      return;
    }
    for (const line of lines.split('\n')) {
      let ticket: Ticket;
      try {
        ticket = new Ticket(line, this.pg ? undefined : this.readClaimedRow);
      } catch (e) {
        this.logger.error('jobforge: unreadable worker ticket', e);
        continue;
      }
      if (!runtime.running) {
        // Claimed just before stop(): back to pending, slot freed.
        this.releaseTicket(ticket);
        continue;
      }
      if (this.pg) void this.pgAttempt(runtime, this.pg, ticket);
      else this.runTicket(runtime, ticket, true);
    }
  }

  /** Memory worker: attempts that ended since the last report, sent in one native call. */
  private reportText = '';
  private reportItems: Reported[] = [];
  private reportArmed = false;

  /**
   * Memory worker: executes one ticket. Its outcome is queued and reported
   * together with the others that end in the same turn of the microtask
   * queue (one native call records them and claims into the freed slots).
   * A cancel, a timeout or a stop ends the attempt at once; whatever the
   * handler does later is ignored.
   */
  private runTicket(rt: WorkerRuntime, ticket: Ticket, checkLive: boolean): void {
    const { id, epoch } = ticket;
    rt.enter(ticket.pool);
    const attempt = new Attempt();
    rt.track(attempt, epoch);
    // Registered first, so a cancel from now on reaches this attempt.
    this.inFlight.set(id, attempt);
    // A ticket from the scheduler crossed threads: the run may have been
    // canceled while it was queued. Tickets from a report or a start were
    // claimed in the synchronous call that handed them over.
    if (checkLive && !this.native.attemptLive(id, epoch)) return this.queueReport(rt, ticket, attempt, null);
    this.runHandler(ticket, attempt, (outcome) => this.queueReport(rt, ticket, attempt, outcome));
  }

  /**
   * Runs the handler of `ticket`, racing its `timeoutMs` and a cancel (the
   * attempt's abort); `done` gets the outcome exactly once, null when the
   * attempt was aborted first. Whatever the handler does later is ignored.
   */
  private runHandler(ticket: Ticket, attempt: Attempt, done: (outcome: Outcome | null) => void): void {
    let settled = false;
    let timer: { cancel(): void } | null = null;
    // Also the abort hook: called with no argument, the attempt has no outcome.
    const settle = (outcome?: Outcome | null): void => {
      if (settled) return;
      settled = true;
      attempt.onAbort = undefined;
      if (timer !== null) timer.cancel();
      done(outcome ?? null);
    };
    attempt.onAbort = settle;
    const { timeoutMs } = ticket;
    if (timeoutMs !== null) {
      const t = this.sleep(timeoutMs);
      timer = t;
      void t.promise.then(() => settle({ status: 'timed_out', text: `{"status":"timed_out","timeoutMs":${timeoutMs}}` }));
    }
    const reg = this.handlers.get(ticket.jobType);
    if (!reg) return settle(NO_HANDLER);
    let result: unknown;
    try {
      result = this.invokeHandler(reg, ticket, attempt);
    } catch (e) {
      return settle(failedOutcome(e));
    }
    // Promise.resolve: a native promise as is; a thenable (even one whose
    // `then` throws) or a plain value the way `await` would take it.
    Promise.resolve(result).then(
      (value) => {
        // Reading the output can throw too (a proxy's trap, a getter).
        let outcome: Outcome;
        try {
          outcome = outcomeOf(value);
        } catch (e) {
          outcome = failedOutcome(e);
        }
        settle(outcome);
      },
      (e) => settle(failedOutcome(e)),
    );
  }

  /** Calls the registered handler (class, function or object) with a new `ctx`. */
  private invokeHandler(reg: HandlerRegistration, ticket: Ticket, attempt: Attempt): unknown {
    const ctx = this.makeContext(ticket, attempt);
    const h = reg.handlerClass;
    if (isClass(h)) return new h().run(ctx);
    if (typeof h === 'function') return (h as (c: JobContext<unknown>) => unknown)(ctx);
    return (h as { run(c: JobContext<unknown>): unknown }).run(ctx);
  }

  private queueReport(rt: WorkerRuntime, ticket: Ticket, attempt: Attempt, outcome: Outcome | null): void {
    const { id, epoch } = ticket;
    rt.untrack(attempt);
    if (rt.released(id)) outcome = null; // put back to pending by stop()
    const slot = rt.slotOf.get(ticket.pool) ?? -1;
    // '.' = completed with no output, by far the most common outcome.
    const text = outcome === null ? '' : outcome === COMPLETED_EMPTY ? '.' : outcome.text;
    this.reportText += `${id}${epoch},${slot},${text}\n`;
    this.reportItems.push({ rt, ticket, attempt, timedOut: outcome !== null && outcome.status === 'timed_out' });
    if (!this.reportArmed) {
      this.reportArmed = true;
      this.reportTurns = REPORT_TURNS;
      queueMicrotask(this.reportTurn);
    }
  }

  /** Microtask turns left before the queued outcomes are reported. */
  private reportTurns = 0;

  private readonly reportTurn = (): void => {
    if (--this.reportTurns > 0) queueMicrotask(this.reportTurn);
    else if (this.sliceSpent()) setImmediate(this.flushReports);
    else this.flushReports();
  };

  /** When the worker's reports began chaining without a turn of the event loop (performance.now()), or -1. */
  private sliceStart = -1;

  private readonly endSlice = (): void => {
    this.sliceStart = -1;
  };

  /** Whether the reports have held the JS thread for a slice: time to let the event loop turn. */
  private sliceSpent(): boolean {
    const now = performance.now();
    if (this.sliceStart < 0) {
      // Runs once the current macrotask and its microtasks are over.
      this.sliceStart = now;
      setImmediate(this.endSlice);
      return false;
    }
    return now - this.sliceStart >= WORKER_SLICE_MS;
  }

  private readonly flushReports = (): void => {
    this.reportArmed = false;
    const text = this.reportText;
    const items = this.reportItems;
    this.reportText = '';
    this.reportItems = [];
    if (items.length === 0) return;
    try {
      // Buffered starts ride along: created before the freed slots claim.
      const starts = this.takeStarts();
      let reply = '0';
      try {
        reply = this.engine.workerReport(text, starts);
      } catch (e) {
        this.logger.error('jobforge: recording worker outcomes failed', translateNativeError(e));
      }
      for (const it of items) {
        // After the outcome is recorded, so the handler sees its signal
        // fire only once the run is timed out.
        if (it.timedOut) it.attempt.abort('timed_out');
        const id = it.ticket.id;
        if (this.inFlight.get(id) === it.attempt) this.inFlight.delete(id);
        it.rt.leave(it.ticket.pool);
      }
      // '1' = aborts or events are queued (saves a native call otherwise).
      if (reply.charCodeAt(0) === 49) this.flushAborts();
      if (reply.length > 1) this.onReplyLines(reply, 1);
    } catch (e) {
      this.logger.error('jobforge: worker report failed', e);
    }
  };

  /**
   * Postgres worker: runs one ticket and queues its outcome for the worker
   * loop's next batch transaction (whose claims arrive as a new batch).
   */
  private async pgAttempt(runtime: WorkerRuntime, pg: PgEngine, ticket: Ticket): Promise<void> {
    const { id, epoch, pool } = ticket;
    runtime.enter(pool);
    try {
      const attempt = new Attempt();
      runtime.track(attempt, epoch);
      let outcome: Outcome | null;
      try {
        outcome = await this.attempt(ticket, attempt);
      } catch (e) {
        outcome = failedOutcome(e);
      }
      runtime.untrack(attempt);
      if (runtime.released(id)) outcome = null; // put back to pending by stop()
      try {
        pg.workerDone(id, epoch, outcome === null ? null : outcome.text, pool);
      } catch (e) {
        this.logger.error('jobforge: recording a worker outcome failed', translateNativeError(e));
      }
      if (outcome?.status === 'timed_out') this.inFlight.get(id)?.abort('timed_out');
      this.inFlight.delete(id);
    } finally {
      runtime.leave(pool);
    }
  }

  /** After a native call that may have canceled running runs or emitted events. */
  private afterMutation(): void {
    if (this.inFlight.size > 0 || this.eventsOn || this.waiters.size > 0) this.flushAborts();
  }

  /**
   * Dispatch target of the threadsafe-function bridge: the engine's async
   * runtime calls this (via `call_async_catch`) with the attempt ticket and
   * applies the resolved outcome itself, timeout and cancel included.
   */
  private async dispatch(line: string): Promise<string> {
    let outcome: Outcome;
    let runId = '';
    try {
      const ticket = new Ticket(line);
      runId = ticket.id;
      const attempt = new Attempt();
      attempt.epoch = ticket.epoch;
      this.inFlight.set(runId, attempt);
      outcome = await this.execute(ticket, attempt);
    } catch (e) {
      outcome = failedOutcome(e);
    } finally {
      if (runId) this.inFlight.delete(runId);
    }
    return outcome.text;
  }

  /**
   * `tick` and the Postgres worker: runs the handler racing the attempt's
   * timeout and a cancel; null = canceled. (Postgres tickets come straight
   * from a committed claim; an outcome for a run canceled since is ignored
   * by the engine.)
   */
  private attempt(ticket: Ticket, attempt: Attempt): Promise<Outcome | null> {
    // Registered first, so a cancel from now on reaches this attempt.
    attempt.epoch = ticket.epoch;
    this.inFlight.set(ticket.id, attempt);
    return new Promise((resolve) => this.runHandler(ticket, attempt, resolve));
  }

  /** The bridge's execution (the engine enforces the timeout there): the handler's outcome. */
  private async execute(ticket: Ticket, attempt: Attempt): Promise<Outcome> {
    const reg = this.handlers.get(ticket.jobType);
    if (!reg) return NO_HANDLER;
    let value: unknown;
    try {
      value = await this.invokeHandler(reg, ticket, attempt);
    } catch (e) {
      return failedOutcome(e);
    }
    return outcomeOf(value);
  }

  private makeContext(ticket: Ticket, attempt: Attempt): JobContext<unknown> {
    return new RunContext(ticket, attempt, this.contextHost);
  }

  private readonly contextHost: ContextHost = {
    loggerFactory: (run) => this.loggerFactory(run),
    step: (ticket, attempt, stepId, fn, opts) => this.runStep(ticket.id, ticket.epoch, attempt, stepId, fn, opts),
    spawnChild: async (ticket, attempt, type, input, opts) => {
      // As ctx.step: only the run's current attempt may act for it (a child
      // of a parent already canceled or timed out would escape the cascade).
      const { id, epoch } = ticket;
      const live = this.pg ? await db(this.pg.attemptLive(id, epoch)) : this.native.attemptLive(id, epoch);
      if (!live) {
        const status = attempt.aborted ? ABORTED_STATUS[attempt.abortReason ?? ''] ?? 'ended' : 'ended';
        throw new JobRunStateError(id, status, 'ctx.spawnChild after its attempt ended');
      }
      // The untyped signature: the child's type and input were checked
      // against the job map where ctx.spawnChild was called.
      return (this as JobOrchestrator).start(type, input, {
        parentRunId: id,
        parentClosePolicy: opts?.closePolicy,
        runAt: opts?.runAt,
        priority: opts?.priority,
        tags: opts?.tags,
        triggerSource: 'parent',
        triggerRef: id,
      });
    },
  };

  private async runStep<T>(
    runId: string,
    epoch: number,
    attempt: Attempt,
    stepId: string,
    fn: () => Promise<T> | T,
    opts: StepOptions | undefined,
  ): Promise<T> {
    if (typeof stepId !== 'string' || stepId.length === 0) {
      throw new JobInputInvalidError('step id must be a non-empty string');
    }
    if (typeof fn !== 'function') throw new JobInputInvalidError(`step '${stepId}' needs a function`);
    const timeoutMs = opts?.timeoutMs;
    if (timeoutMs !== undefined && (typeof timeoutMs !== 'number' || !(timeoutMs > 0))) {
      throw new JobInputInvalidError(`step '${stepId}' timeoutMs must be a positive number`);
    }
    const retry = opts?.retry ?? undefined;
    if (retry !== undefined) checkRetryPolicy(retry, `step '${stepId}' retry`);
    const policyText = retry === undefined ? null : JSON.stringify(retry);
    for (;;) {
      const pg = this.pg;
      const begin = JSON.parse(
        pg ? await db(pg.stepBegin(runId, epoch, stepId)) : call(() => this.native.stepBegin(runId, epoch, stepId)),
      ) as
        | { memoized: true; output: T }
        | { memoized: false; attempt: number };
      if (begin.memoized) return begin.output;
      let value: T;
      try {
        value = await this.withTimeout(Promise.resolve().then(fn), stepId, timeoutMs);
      } catch (err) {
        const failure = JSON.stringify(describeFailure(err));
        const failedAt = this.local.now();
        const delay = pg
          ? await db(pg.stepFail(runId, epoch, stepId, failure, policyText))
          : call(() => this.native.stepFail(runId, epoch, stepId, failure, policyText));
        if (delay === null || attempt.aborted) throw err;
        // Back off in engine time, counted from the failure (not from the
        // end of the database round trip that recorded it); a cancel or
        // timeout ends the wait early.
        const pause = this.sleep(Math.max(0, failedAt + delay - this.local.now()));
        await Promise.race([pause.promise, attempt.whenAborted()]);
        pause.cancel();
        if (attempt.aborted) throw err;
        continue;
      }
      const j = toJsonText(value ?? null, `step '${stepId}' output`);
      if (!j.ok) {
        // The function did its work; running it again would repeat that
        // work and meet the same output. The step fails without a retry.
        const err = new JobInputInvalidError(`${j.reason} (a step's output must be JSON; the step is not retried)`);
        const failure = JSON.stringify(describeFailure(err));
        if (pg) await db(pg.stepFail(runId, epoch, stepId, failure, null));
        else call(() => this.native.stepFail(runId, epoch, stepId, failure, null));
        throw err;
      }
      if (pg) await db(pg.stepComplete(runId, epoch, stepId, j.text));
      else call(() => this.native.stepComplete(runId, epoch, stepId, j.text));
      // The output as stored, as a replay's memoized step answers it: the
      // same value on every attempt (a Date as its ISO string). A step that
      // returns nothing stays undefined here, as in the seed (stored: null).
      return value === undefined ? value : (JSON.parse(j.text) as T);
    }
  }

  private async withTimeout<T>(p: Promise<T>, stepId: string, timeoutMs: number | undefined): Promise<T> {
    if (timeoutMs === undefined) return p;
    const t = this.sleep(timeoutMs);
    try {
      return await Promise.race([
        p,
        t.promise.then(() => {
          throw new JobStepTimeoutError(stepId, timeoutMs);
        }),
      ]);
    } finally {
      t.cancel();
    }
  }
}
