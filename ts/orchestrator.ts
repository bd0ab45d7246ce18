/**
 * `JobOrchestrator`: the public JS API. A facade: it checks what callers
 * pass (`validate.ts`) and hands every operation to its store's `Backend`
 * (`backend/`); handlers run in `execution/`, the worker's JS side is
 * `worker.ts`, events and waits are `events.ts`. The rules (lanes, dedupe,
 * retries, cascade, memoization) are all in the Rust core.
 */
import { JobClockError, JobInputInvalidError, JobResumeTokenError, JobWorkerStateError, MissingTenantIdError } from './errors';
import { toJsonText } from './json';
import type { Backend, NoticeSink } from './backend/backend';
import { MemoryBackend } from './backend/memory';
import { checkPostgresOptions, PostgresBackend, type PostgresOptions } from './backend/postgres';
import { Attempts } from './execution/attempt';
import { Executor } from './execution/executor';
import { RunEvents, type RunEventListener, type RunEventName } from './events';
import type { HandlerRegistration, JobHandler, JobHandlerMeta, JobLogger } from './handler';
import { consoleLogger } from './handler';
import { registerPromMetrics, type PromRegistryLike } from './metrics';
import type {
  JobDefinitionRow,
  JobRun,
  JobRunError,
  JobRunFailure,
  JobRunEventPage,
  JobThroughputMinute,
  JobRunPage,
  JobRunStatus,
  JobSchedule,
  JobStep,
  RunTreeNode,
} from './rows';
import type { AnyJobs, HandlerInput, JobMap, JobTypeName, OptionalInputName } from './typed';
import {
  CALL_OPTION_KEYS,
  checkConstructorOptions,
  callTenant,
  checkCount,
  checkOptions,
  checkTenant,
  checkText,
  definitionSpec,
  prepareMany,
  prepareStart,
  recordStepRequest,
  requireDate,
  scheduleRequest,
  tenantOf,
  cancelNote,
  workerOptions,
  type StartOptionsInput,
} from './validate';
import { Tracing } from './tracing';
import { fromTuple } from './wire';
import { WorkerRuntime, type WorkerHandle } from './worker';

export type { HandlerRegistration } from './handler';
export type { PostgresOptions } from './backend/postgres';
export type { RunEventListener, RunEventName } from './events';
export type { RunTreeNode } from './rows';
export type { WorkerHandle } from './worker';

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
   * Record every transition of a run in its timeline (`listRunEvents`).
   * Default: true. Off, only each run's `created` event is shown (it is
   * the row itself) and the settle path writes nothing more.
   */
  timeline?: boolean | undefined;
  /**
   * OpenTelemetry tracing, when `@opentelemetry/api` is installed (an
   * optional peer dependency) and a tracer provider is registered: `start`
   * records the active span's context on the run (tags `traceparent`,
   * `tracestate`), each attempt is a span under it, each `ctx.step` a span
   * under the attempt (see `ts/tracing.ts`). Default: true. False: the
   * package is never loaded.
   */
  tracing?: boolean | undefined;
  /**
   * Where runs live: `'memory'` (default; this process only) or
   * `'postgres'` (any number of processes on one database; needs
   * `postgres.url` and `await migrate()` once).
   */
  backend?: 'memory' | 'postgres' | undefined;
  postgres?: PostgresOptions | undefined;
}

export type StartOptions = StartOptionsInput;

/**
 * One entry of `startMany`: a job type, its input (checked against the
 * job map as `start` checks it; left out where `start` may leave it out)
 * and `start`'s options.
 */
export type StartEntry<Jobs = AnyJobs> = {
  [K in JobTypeName<Jobs>]: K extends OptionalInputName<Jobs>
    ? { type: K; input?: Jobs[K] | null; opts?: StartOptions | undefined }
    : { type: K; input: Jobs[K]; opts?: StartOptions | undefined };
}[JobTypeName<Jobs>];

export interface ListRunEventsOptions {
  /** `nextCursor` of the previous page. */
  cursor?: string | undefined;
  limit?: number | undefined;
  tenantId?: string | null | undefined;
}

export interface CancelOptions {
  cascade?: boolean | undefined;
  /** Noted in the run's `canceled` timeline event as `note` (first 1,000 characters). */
  reason?: string | undefined;
  tenantId?: string | null | undefined;
}

export interface TenantOptions {
  tenantId?: string | null | undefined;
}

export interface ResumeOptions extends TenantOptions {
  /** The token must be this run's (another run's token is `JobResumeTokenError`, nothing changed). */
  runId?: string | undefined;
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
  /**
   * A handler still running this long (engine time) after its run timed out
   * or was canceled, ignoring `ctx.signal`, is abandoned: its slot is freed
   * and a warning logged. Until then it holds its slot. Default 30 000.
   */
  abandonAfterMs?: number | undefined;
}

export interface WaitForRunOptions extends TenantOptions {
  /** Reject with JobWaitTimeoutError after this many ms (real time). */
  timeoutMs?: number | undefined;
}

export interface ListForScopeOptions extends TenantOptions {
  status?: JobRunStatus | JobRunStatus[] | undefined;
  jobType?: string | undefined;
  limit?: number | undefined;
  offset?: number | undefined;
  /**
   * Default newest first. jobforge's `'createdAt:desc' | 'createdAt:asc'`,
   * or the seed family's spelling, which also orders by `runAt` (ties in
   * created order, in the same direction).
   */
  orderBy?: 'createdAt:desc' | 'createdAt:asc' | 'created_at desc' | 'created_at asc' | 'run_at desc' | 'run_at asc' | undefined;
}

export interface ListJobRunsOptions extends TenantOptions {
  poolId?: string | undefined;
  rootRunId?: string | undefined;
  /** One status or a set of them (a run in any of them). */
  status?: JobRunStatus | JobRunStatus[] | undefined;
  /** Only runs created at or after this instant. */
  since?: Date | undefined;
  /** Only runs of this job type (checked per row: see `listJobRuns`). */
  jobType?: string | undefined;
  /** Only runs of this scope: `scopeEntityType` and `scopeEntityId` together (as `listForScope` names it). */
  scopeEntityType?: string | undefined;
  scopeEntityId?: string | undefined;
  /** `nextCursor` of the previous page. */
  cursor?: string | undefined;
  limit?: number | undefined;
}

export interface PoolStatusCount {
  pool: string;
  status: JobRunStatus;
  count: number;
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

/** `signal`'s answer. */
export interface SignalResult {
  /** True: a waiting `ctx.waitForSignal` took it; false: it waits in the run's inbox. */
  delivered: boolean;
}

/** `resume`'s answer. */
export interface ResumeResult {
  /** The run whose wait the token resumed. */
  runId: string;
}

/** A signal's or resume's payload as JSON text (`undefined`: none). */
function payloadText(payload: unknown, what: string): string | undefined {
  if (payload === undefined) return undefined;
  const j = toJsonText(payload, what);
  if (!j.ok) throw new JobInputInvalidError(j.reason);
  return j.text;
}

/** A call's synchronous throw as its promise's rejection. */
function settled<T>(f: () => Promise<T>): Promise<T> {
  try {
    return f();
  } catch (e) {
    return Promise.reject(e);
  }
}

/**
 * `Jobs`: the app's job map (job type → input type), which types
 * `registerHandler`, `start` and `ctx.spawnChild`; default `AnyJobs`
 * (any type, inputs unknown). See `AnyJobs`.
 */
export class JobOrchestrator<Jobs extends JobMap = AnyJobs> {
  /** Where every operation goes (the store's backend). */
  private readonly store: Backend;
  private readonly handlers = new Map<string, HandlerRegistration>();
  private readonly attempts = new Attempts();
  private readonly events: RunEvents;
  private readonly executor: Executor;
  private readonly tracing: Tracing | null;
  /** The orchestrator's own messages (see `JobOrchestratorOptions.logger`). */
  private readonly logger: JobLogger;
  private worker: WorkerRuntime | null = null;
  readonly multiTenant: boolean;
  readonly clock: 'system' | 'manual';
  readonly backend: 'memory' | 'postgres';

  constructor(options: JobOrchestratorOptions = {}) {
    if (options === null || typeof options !== 'object') {
      throw new JobInputInvalidError('options must be an object');
    }
    checkConstructorOptions(options as Record<string, unknown>);
    const clock = options.clock ?? 'system';
    if (clock !== 'system' && clock !== 'manual') {
      throw new JobInputInvalidError(`clock must be 'system' or 'manual', got '${String(clock)}'`);
    }
    this.multiTenant = options.multiTenant === true;
    this.clock = clock;
    const loggerFactory = options.loggerFactory ?? ((run: JobRun) => consoleLogger(`JobRun:${run.id}`));
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
    this.events = new RunEvents(this.logger, () => this.store);
    const attempts = this.attempts;
    const events = this.events;
    const sink: NoticeSink = {
      wanted: () => attempts.listening || events.wanted,
      deliver: (n) => {
        for (const { runId, epoch, reason } of n.aborts) attempts.abort(runId, epoch, reason);
        for (const raw of n.events) events.emit(fromTuple(raw));
        for (const message of n.troubles) this.logger.error(message);
      },
    };
    if (options.timeline !== undefined && typeof options.timeline !== 'boolean') {
      throw new JobInputInvalidError(`timeline must be a boolean, got ${String(options.timeline)}`);
    }
    if (options.tracing !== undefined && typeof options.tracing !== 'boolean') {
      throw new JobInputInvalidError(`tracing must be a boolean, got ${String(options.tracing)}`);
    }
    const tracing = (this.tracing = Tracing.create(options.tracing));
    const core = { multiTenant: this.multiTenant, clock, retention: options.retention, timeline: options.timeline };
    if (backend !== 'postgres' && options.postgres !== undefined) {
      // Runs would quietly live in this process's memory, not in the database.
      throw new JobInputInvalidError("postgres options are given but backend is not 'postgres': add backend: 'postgres'");
    }
    if (backend === 'postgres') {
      checkPostgresOptions(options.postgres);
      this.store = new PostgresBackend(core, options.postgres, sink);
    } else {
      this.store = new MemoryBackend({ ...core, logger: this.logger }, sink);
    }
    const store = this.store;
    this.executor = new Executor(this.handlers, {
      store,
      clock: store.clock,
      tracing,
      loggerFactory,
      logger: this.logger,
      // The untyped signature: the child's type and input were checked
      // against the job map where ctx.spawnChild was called.
      start: (type, input, opts) => (this as JobOrchestrator).start(type, input, opts),
      prepare: (type, input, opts) => prepareStart(type, input, opts, this.handlers.get(type), tracing === null ? null : tracing.activeTags()),
    });
  }

  /** Runs `f` once the store's definitions are written (a networked store writes them in the background). */
  private whenReady<T>(f: () => Promise<T>): Promise<T> {
    const wait = this.store.ready();
    return wait === null ? settled(f) : wait.then(f);
  }

  /**
   * Postgres: creates or upgrades the schema (tables job, job_run,
   * job_step and their indexes). Idempotent; safe from several processes
   * at once. Memory: a no-op.
   */
  async migrate(): Promise<void> {
    await this.store.migrate();
  }

  /**
   * Postgres: closes idle database connections (stop the worker first)
   * and stops listening for other processes' run events (so a process
   * kept alive by `on()` listeners may exit). The orchestrator reconnects
   * if used again; a later `on()` or `waitForRun` listens again. Memory: a
   * no-op.
   */
  async close(): Promise<void> {
    await this.store.close();
    this.events.closed();
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
    if (!this.store.shared) return { orphaned: [] };
    await this.store.ready();
    const named = new Set(entries.map((e) => e.type));
    const stored = await this.store.storedJobTypes();
    return { orphaned: stored.filter((t) => !named.has(t)) };
  }

  private registerAll(entries: { type: string; meta: JobHandlerMeta<unknown>; handler: JobHandler<unknown> }[]): void {
    // A networked store writes definitions in the background: they carry this time.
    const registeredAt = this.store.clock.now();
    const specs = entries.map(({ type, meta, handler }) => definitionSpec(type, meta, handler, registeredAt));
    this.store.register(specs);
    for (const { type, meta, handler } of entries) {
      this.handlers.set(type, { type, meta: meta ?? {}, handlerClass: handler });
    }
  }

  getHandlerRegistration(type: string): HandlerRegistration | undefined {
    return this.handlers.get(type);
  }

  getDefinition(type: string): Promise<JobDefinitionRow | null> {
    return this.whenReady(() => this.store.definition(String(type)));
  }

  // ── start ──────────────────────────────────────────────────────────

  /** Starts a run (contract "start"). `tx` is accepted for signature parity and ignored. */
  start<K extends JobTypeName<Jobs>>(type: K, input: Jobs[K], opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  /** A run of a job type whose input may be left out (stored as `{}`). */
  start<K extends OptionalInputName<Jobs>>(type: K, input?: Jobs[K] | null, opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  start(type: string, input?: unknown, opts?: StartOptions, tx?: unknown): Promise<JobRun> {
    void tx;
    // Before any wait: the active span is the caller's only until it awaits.
    const trace = this.tracing === null ? null : this.tracing.activeTags();
    const wait = this.store.ready();
    if (wait !== null) return wait.then(() => this.store.start(prepareStart(type, input, opts, this.handlers.get(type), trace)));
    // The hot path: no closure, no extra promise.
    try {
      return this.store.start(prepareStart(type, input, opts, this.handlers.get(type), trace));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Starts many runs in one transaction, all or none; resolves with the
   * runs in entry order. Each entry is what `start` takes (`{ type, input?,
   * opts? }`) and every rule applies in entry order, as that many `start`
   * calls one after the other would apply them: a later entry dedupes onto
   * an earlier one (or onto an existing run), joins the lane an earlier one
   * took (or is refused by it, or replaces it), each under its own tenant.
   * Every entry is checked before anything is stored: a bad one rejects
   * the call with the error its `start` would meet (a key function that
   * throws: `JobInputInvalidError` with the thrown error as `cause`), its
   * message starting `entries[<index>]: `, and nothing is stored. At most
   * 10,000 entries (`JobInputInvalidError` beyond); `[]` resolves with
   * `[]`. On PostgreSQL the new rows go in with one multi-row insert.
   */
  startMany(entries: StartEntry<Jobs>[]): Promise<JobRun[]> {
    const trace = this.tracing === null ? null : this.tracing.activeTags();
    const run = (): Promise<JobRun[]> => {
      const prepared = prepareMany(entries, (type) => this.handlers.get(type), trace);
      return prepared.length === 0 ? Promise.resolve([]) : this.store.startMany(prepared);
    };
    const wait = this.store.ready();
    if (wait !== null) return wait.then(run);
    try {
      return run();
    } catch (e) {
      return Promise.reject(e);
    }
  }

  // ── durable waits ──────────────────────────────────────────────────

  /**
   * Sends a signal to a run. `delivered: true`: it resolved the run's
   * oldest open `ctx.waitForSignal` of that name (a waiting run resumes);
   * `false`: it was kept in the run's inbox (FIFO per name, at most 1,000
   * signals) for a later wait. A run that ended is `JobRunStateError`; an
   * unknown run, or another tenant's, `JobRunNotFoundError`. The payload
   * must be JSON (left out: the wait resolves with null).
   */
  signal(runId: string, signal: string, payload?: unknown, opts?: TenantOptions): Promise<SignalResult> {
    return settled(() => {
      const tenant = callTenant(opts, 'signal');
      if (typeof signal !== 'string' || signal.length === 0) throw new JobInputInvalidError('signal must be a non-empty string');
      // A wait's signal name is checked so too: a name cut inside a character would reach another wait.
      checkText(signal, 'signal');
      const text = payloadText(payload, 'signal payload');
      return this.whenReady(() => this.store.signal(String(runId), signal, text, tenant)).then((delivered) => ({ delivered }));
    });
  }

  /**
   * Resumes the `ctx.waitForToken` that made `token`, which resolves with
   * `payload`. The token alone names its run; `tenantId`, when given, must
   * be the run's, and `runId`, when given, the token's run (a caller that
   * authorized one run resumes no other). A malformed, unknown, used or
   * expired token (or one of a run that ended, or of another run than
   * `runId`) is `JobResumeTokenError`, with nothing changed.
   */
  resume(token: string, payload?: unknown, opts?: ResumeOptions): Promise<ResumeResult> {
    return settled(() => {
      checkOptions(opts, CALL_OPTION_KEYS.resume, 'resume');
      const tenant = tenantOf(opts);
      const runId = opts?.runId;
      if (runId !== undefined && typeof runId !== 'string') throw new JobInputInvalidError('resume options: runId must be a string');
      if (typeof token !== 'string') throw new JobResumeTokenError('the token must be a string');
      const text = payloadText(payload, 'resume payload');
      return this.whenReady(() => this.store.resume(token, text, tenant, runId)).then((id) => ({ runId: id }));
    });
  }

  // ── cancel / replay / claim / tick ─────────────────────────────────

  /** Cancels a run and (default) its descendants; unknown or terminal runs are a no-op. */
  cancel(runId: string, opts: CancelOptions = {}): Promise<void> {
    return this.whenReady(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.cancel, 'cancel');
      const tenant = tenantOf(o);
      return this.store.cancel(String(runId), o.cascade !== false, tenant, cancelNote(o, 'cancel'));
    });
  }

  /**
   * Resets a terminal run to pending (contract "replay"). Multi-tenant: the
   * gate of `cancel` — `tenantId` is required (null: a null-tenant run), and
   * another tenant's run is `JobRunNotFoundError`, with nothing changed.
   */
  replay(runId: string, opts?: TenantOptions): Promise<JobRun> {
    return settled(() => {
      const tenant = callTenant(opts, 'replay');
      return this.whenReady(() => this.store.replay(String(runId), tenant));
    });
  }

  /** Claims the next due, claimable run of `pool`, or null. */
  claimNext(pool: string): Promise<JobRun | null> {
    return settled(() => {
      if (typeof pool !== 'string') throw new JobInputInvalidError('pool must be a string');
      return this.store.claimNext(pool);
    });
  }

  /**
   * Executes one claimed (`running`) run: the engine opens the attempt, the
   * handler runs here on the JS thread, and the engine applies the outcome
   * (completion, retry, failure, cascade). A cancel or the run's timeout
   * (the engine's timer) ends it at once.
   */
  tick(runId: string): Promise<void> {
    return this.whenReady(async () => {
      if (typeof runId !== 'string') throw new JobInputInvalidError('runId must be a string');
      const { ticket, attempt } = await this.attempts.beginTicked(runId, () => this.store.beginAttempt(runId));
      // The engine's timer will end a run with a timeout, and its notice
      // must find the process alive (a worker keeps it alive by itself).
      const keepAlive = ticket.timeoutMs === null ? null : setInterval(() => undefined, 0x7fffffff);
      try {
        const outcome = await this.executor.outcome(ticket, attempt);
        // Canceled or timed out meanwhile: the engine has applied that.
        if (outcome === null) return;
        // Settled in time: storing the outcome may take a round trip, the timeout must not.
        if (ticket.timeoutMs !== null) this.store.attemptSettled(ticket.id, ticket.epoch);
        await this.store.finishAttempt(ticket.id, ticket.epoch, outcome.text);
      } finally {
        if (keepAlive !== null) clearInterval(keepAlive);
        this.attempts.end(ticket.id, attempt);
      }
    });
  }

  // ── queries ────────────────────────────────────────────────────────

  findById(runId: string, opts?: TenantOptions): Promise<JobRun | null> {
    return settled(() => this.store.findById(String(runId), callTenant(opts, 'findById')));
  }

  /**
   * The run service's `findById`, tenant as a second argument (as
   * `countByPoolAndStatus` takes it): the row, or null for an unknown id or
   * another tenant's run. Multi-tenant mode: `undefined` is a
   * `MissingTenantIdError`, `null` the cross-tenant runs.
   */
  getRun(runId: string, tenantId?: string | null): Promise<JobRun | null> {
    return settled(() => {
      checkTenant(tenantId);
      return this.store.getRun(String(runId), tenantId);
    });
  }

  /**
   * How many runs the store holds for a tenant (single-tenant mode: all),
   * whatever their status. Read from the counts per pool and status the
   * engine keeps (see `countByPoolAndStatus`): it never scans runs.
   */
  countRuns(tenantId?: string | null): Promise<number> {
    return settled(() => {
      checkTenant(tenantId);
      return this.store.countRuns(tenantId);
    });
  }

  listSteps(runId: string, opts?: TenantOptions): Promise<JobStep[]> {
    return settled(() => this.store.listSteps(String(runId), callTenant(opts, 'listSteps')));
  }

  /** A step row of a run, or null. */
  findStep(runId: string, stepId: string, opts?: TenantOptions): Promise<JobStep | null> {
    return settled(() => this.store.findStep(String(runId), String(stepId), callTenant(opts, 'findStep')));
  }

  /** Inserts or updates the step row of `(jobRunId, stepId)` (the step service's upsert). */
  recordStep(input: RecordStepInput, opts?: TenantOptions): Promise<JobStep> {
    return settled(() => this.store.recordStep(recordStepRequest(input), callTenant(opts, 'recordStep')));
  }

  // ── run service ────────────────────────────────────────────────────

  /** Runs of a scope, newest first unless `orderBy: 'createdAt:asc'`; limit default 50, max 500. */
  listForScope(entityType: string, entityId: string, opts: ListForScopeOptions = {}): Promise<JobRun[]> {
    return settled(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.listForScope, 'listForScope');
      checkCount('limit', o.limit);
      checkCount('offset', o.offset);
      const q = { status: o.status, jobType: o.jobType, limit: o.limit, offset: o.offset, orderBy: o.orderBy };
      return this.store.listForScope(String(entityType), String(entityId), q, tenantOf(o));
    });
  }

  /** Cancels (with cascade) every live run of a scope; resolves with how many were canceled. */
  cancelForScope(entityType: string, entityId: string, opts?: CancelOptions): Promise<number>;
  /**
   * The seed family's `IJobRunService.cancelForScope` resolves with nothing;
   * this signature (never chosen by a call: the one above is) lets the
   * orchestrator stand for that interface. The count is still there.
   */
  cancelForScope(entityType: string, entityId: string, opts?: CancelOptions): Promise<void>;
  cancelForScope(entityType: string, entityId: string, opts: CancelOptions = {}): Promise<number | void> {
    return settled(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.cancel, 'cancelForScope');
      const tenant = tenantOf(o);
      return this.store.cancelForScope(String(entityType), String(entityId), o.cascade !== false, tenant, cancelNote(o, 'cancelForScope'));
    });
  }

  /** Moves the `runAt` of a scope's pending runs (others untouched); resolves with how many moved. */
  rescheduleForScope(entityType: string, entityId: string, newRunAt: Date, opts?: TenantOptions): Promise<number>;
  /** For the seed family's `IJobRunService`, as `cancelForScope`'s second signature. */
  rescheduleForScope(entityType: string, entityId: string, newRunAt: Date, opts?: TenantOptions): Promise<void>;
  rescheduleForScope(entityType: string, entityId: string, newRunAt: Date, opts: TenantOptions = {}): Promise<number | void> {
    return settled(() => {
      checkOptions(opts, CALL_OPTION_KEYS.tenant, 'rescheduleForScope');
      const runAt = requireDate(newRunAt, 'newRunAt');
      return this.store.rescheduleForScope(String(entityType), String(entityId), runAt, tenantOf(opts ?? {}));
    });
  }

  /** Run counts per pool and status, terminal statuses included (maintained incrementally). */
  countByPoolAndStatus(tenantId?: string | null): Promise<PoolStatusCount[]> {
    return settled(() => {
      checkTenant(tenantId);
      return this.store.countByPoolAndStatus(tenantId);
    });
  }

  /**
   * Failed runs, most recently finished first (`failedAt` desc, ties by id
   * desc), as the seed family's `JobRunFailure`; limit default 50, max 500.
   */
  listRecentFailed(limit?: number, tenantId?: string | null): Promise<JobRunFailure[]> {
    return settled(() => {
      if (limit !== undefined && typeof limit !== 'number') throw new JobInputInvalidError('limit must be a number');
      // JSON would carry NaN and Infinity as null, the default.
      if (limit !== undefined && !Number.isFinite(limit)) throw new JobInputInvalidError(`limit must be a positive integer, got ${limit}`);
      checkTenant(tenantId);
      return this.store.listRecentFailed(limit, tenantId);
    });
  }

  /**
   * One page of runs, newest first by `(createdAt, id)`, each as the seed
   * family's `JobRunSummary` (no input, output or tags: `getRun` reads a
   * whole row). Pass `nextCursor` back as `cursor` for the next page; it is
   * null on the last page. `limit` default 50, max 500.
   *
   * Each page reads one index: the run tree (`rootRunId`), else the
   * scope's runs (`scopeEntityType` + `scopeEntityId`), else the runs by
   * pool and status. A filter that index does not hold — `jobType` always
   * (no index of job types: it would cost every start) — is checked row by
   * row, and such a page examines at most 5,000 rows: when they run out
   * before the page is full, it holds the matches found (possibly none)
   * and a `nextCursor` at the last row examined. So every call costs
   * O(log n + 5,000) however rare the matches are, and paging on finds
   * each match exactly once; a short page, even an empty one, is the last
   * only when its `nextCursor` is null. (On PostgreSQL a scope's page
   * reads the scope's r runs whole, O(r log k): no index orders a scope
   * by `createdAt`.)
   */
  listJobRuns(opts: ListJobRunsOptions = {}): Promise<JobRunPage> {
    return settled(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.listJobRuns, 'listJobRuns');
      checkCount('limit', o.limit);
      const since = o.since === undefined ? undefined : requireDate(o.since, 'since');
      const q = {
        poolId: o.poolId,
        rootRunId: o.rootRunId,
        status: o.status,
        since,
        jobType: o.jobType,
        scopeEntityType: o.scopeEntityType,
        scopeEntityId: o.scopeEntityId,
        cursor: o.cursor,
        limit: o.limit,
      };
      return this.store.listJobRuns(q, tenantOf(o));
    });
  }

  /**
   * One page of a run's timeline, oldest first: its `created` event, then
   * every transition recorded since (claims, steps, retries, waits,
   * cancels with their cause, the outcome, replays; see `JobRunEvent`).
   * Pass `nextCursor` back as `cursor` for the next page; it is null on
   * the last. `limit` default 50, max 500. An unknown run, or another
   * tenant's, is `JobRunNotFoundError`.
   */
  listRunEvents(runId: string, opts: ListRunEventsOptions = {}): Promise<JobRunEventPage> {
    return settled(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.listRunEvents, 'listRunEvents');
      checkCount('limit', o.limit);
      if (o.cursor !== undefined && typeof o.cursor !== 'string') {
        throw new JobInputInvalidError(`cursor must be a string (a nextCursor), got ${typeof o.cursor}`);
      }
      return this.store.listRunEvents(String(runId), { cursor: o.cursor, limit: o.limit }, tenantOf(o));
    });
  }

  /**
   * Metrics in the Prometheus text exposition format (serve it as
   * `text/plain; version=0.0.4` at `/metrics`): counters of runs created,
   * completed, failed, timed out and canceled and of retries, histograms of
   * queue wait (`runAt` → claim) and run duration (start → end), by job
   * type and pool, as this process did them; gauges of the store's live
   * runs (pending, running, waiting) per pool. Not tenant-gated: it names
   * job types and pools only.
   */
  metrics(): Promise<string> {
    return settled(() => this.store.metrics());
  }

  /**
   * Registers the series of `metrics()` in a `prom-client` registry (an
   * optional peer dependency; default: its global `register`), read at each
   * scrape, so an app already serving its registry shows them. Answers a
   * function that removes them. Without prom-client installed and no
   * registry given: `JobInputInvalidError`.
   */
  registerMetrics(registry?: PromRegistryLike): () => void {
    let target = registry;
    if (target === undefined) {
      try {
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        target = (require('prom-client') as { register: PromRegistryLike }).register;
      } catch {
        throw new JobInputInvalidError('registerMetrics: prom-client is not installed (npm install prom-client), or pass a registry');
      }
    }
    return registerPromMetrics(this, target);
  }

  /**
   * Runs that ended in each of the last `minutes` minutes (default and
   * at most 60; the current minute is the last), by terminal status,
   * oldest first, every minute present (zeros included). Memory counts each
   * run's end as it happened; PostgreSQL counts the runs whose `finishedAt`
   * falls in the minute (a replayed or purged run no longer does).
   */
  throughput(opts: { minutes?: number | undefined; tenantId?: string | null | undefined } = {}): Promise<JobThroughputMinute[]> {
    return settled(async () => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.throughput, 'throughput');
      checkCount('minutes', o.minutes);
      const minutes = o.minutes ?? 60;
      // The window the engine read (a clock read here could be a minute later).
      const { since: first, rows } = await this.store.throughput(o.minutes, tenantOf(o));
      const last = first + (Math.min(Math.max(Math.floor(minutes), 1), 60) - 1) * 60_000;
      const out: JobThroughputMinute[] = [];
      for (let at = first; at <= last; at += 60_000) out.push({ at: new Date(at), completed: 0, failed: 0, timedOut: 0, canceled: 0 });
      const field = { completed: 'completed', failed: 'failed', timed_out: 'timedOut', canceled: 'canceled' } as const;
      for (const [at, status, n] of rows) {
        const m = out[(at - first) / 60_000];
        const k = field[status as keyof typeof field];
        if (m && k) m[k] += n;
      }
      return out;
    });
  }

  /** The tree of runs under a root (parent → children, each with its status), or null. */
  getRunTree(rootRunId: string, opts?: TenantOptions): Promise<RunTreeNode | null> {
    return settled(() => this.store.getRunTree(String(rootRunId), callTenant(opts, 'getRunTree')));
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
  schedule(name: string, opts: ScheduleOptions): Promise<JobSchedule> {
    return this.whenReady(() => this.store.putSchedule(scheduleRequest(name, opts)));
  }

  /** Removes a schedule; resolves with whether there was one. Runs it started are not touched. */
  unschedule(name: string, opts?: TenantOptions): Promise<boolean> {
    return this.whenReady(() => {
      if (typeof name !== 'string') throw new JobInputInvalidError('schedule name must be a string');
      // As `schedule` refuses them: napi would make them another name or
      // tenant, and remove that schedule.
      checkText(name, 'schedule name');
      const tenant = callTenant(opts, 'unschedule');
      if (typeof tenant === 'string') checkText(tenant, 'tenantId');
      return this.store.removeSchedule(name, tenant);
    });
  }

  /** The schedules of a tenant (single-tenant mode: all), by name. */
  listSchedules(opts?: TenantOptions): Promise<JobSchedule[]> {
    return this.whenReady(() => this.store.listSchedules(callTenant(opts, 'listSchedules')));
  }

  /**
   * Starts the runs of every schedule that is due now; resolves with how
   * many were created. A running worker does this by itself; this is for
   * processes without one (or tests with `clock: 'manual'`).
   */
  fireDueSchedules(): Promise<number> {
    return this.whenReady(() => this.store.fireDueSchedules());
  }

  // ── time ───────────────────────────────────────────────────────────

  /** Current engine time. */
  now(): Date {
    return new Date(this.store.clock.now());
  }

  /** Moves the manual clock forward by `ms`; throws on the system clock. */
  advanceTime(ms: number): Date {
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      throw new JobInputInvalidError(`advanceTime needs a non-negative number of ms, got ${String(ms)}`);
    }
    const t = this.store.advanceTime(ms);
    if (t === null) throw new JobClockError("advanceTime needs an orchestrator created with clock: 'manual'");
    this.store.clock.advanced(t);
    return new Date(t);
  }

  // ── events ─────────────────────────────────────────────────────────

  /** Listens for run transitions: `run:completed | run:failed | run:canceled | run:timed_out | run:retrying`. */
  on(event: RunEventName, listener: RunEventListener): this {
    this.events.on(event, listener);
    return this;
  }

  off(event: RunEventName, listener: RunEventListener): this {
    this.events.off(event, listener);
    return this;
  }

  /** Resolves with the run's row once it is terminal (at once if it already is). */
  waitForRun(runId: string, opts: WaitForRunOptions = {}): Promise<JobRun> {
    return settled(() => {
      const o = opts ?? {};
      checkOptions(o, CALL_OPTION_KEYS.waitForRun, 'waitForRun');
      const gate = { tenantId: o.tenantId };
      // The engine's findById gate decides; its refusal names the call made.
      const find = (id: string) =>
        this.findById(id, gate).catch((e: unknown) => {
          throw e instanceof MissingTenantIdError ? new MissingTenantIdError('waitForRun') : e;
        });
      return this.events.waitForRun(runId, o.timeoutMs, find);
    });
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
    const { pools, shutdownTimeoutMs, abandonAfterMs } = workerOptions(opts);
    const capacity = new Map(pools.map((p) => [p.name, p.concurrency]));
    const runtime = new WorkerRuntime(
      this.store,
      this.executor,
      this.attempts,
      this.logger,
      capacity,
      shutdownTimeoutMs,
      abandonAfterMs,
    );
    const handle = runtime.start(pools);
    this.worker = runtime;
    return handle;
  }
}
