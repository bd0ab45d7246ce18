/**
 * The `ctx` a handler receives, and what its calls do: `ctx.step`
 * (memoized through the engine, retried in place per its policy) and
 * `ctx.spawnChild`.
 */
import { JobInputInvalidError, JobRunStateError, JobStepTimeoutError } from '../errors';
import type { JobContext, JobLogger, SpawnChildOptions, StepOptions } from '../handler';
import { toJsonText } from '../json';
import type { JobRun } from '../rows';
import type { EngineClock } from '../clock';
import { checkRetryPolicy, checkSpawnOptions, checkStepOptions, retryPolicyWire, type StartOptionsInput } from '../validate';
import { describeFailure, type Ticket } from '../wire';
import { ABORTED_STATUS, type Attempt } from './attempt';

/** What a step call needs from the engine (one backend's operations). */
export interface StepStore {
  stepBegin(runId: string, epoch: number, stepId: string): Promise<{ memoized: true; output: unknown } | { memoized: false; attempt: number }>;
  stepComplete(runId: string, epoch: number, stepId: string, outputText: string): Promise<void>;
  /** Records the failure; the backoff before a retry (ms), or null. */
  stepFail(runId: string, epoch: number, stepId: string, failure: string, policyText: string | null): Promise<number | null>;
  attemptLive(runId: string, epoch: number): Promise<boolean>;
}

/** What a `ctx` calls back into (one per orchestrator). */
export interface ContextHost {
  readonly store: StepStore;
  readonly clock: EngineClock;
  loggerFactory(run: JobRun): JobLogger;
  /** `start` of the orchestrator (the child's type and input were checked where `ctx.spawnChild` was called). */
  start(type: string, input: unknown, opts: StartOptionsInput): Promise<JobRun>;
}

/**
 * A class: its getters sit on the prototype, where an object literal with
 * getters defines them anew for every run (measured: the largest single JS
 * cost of a no-op run). `step` and `spawnChild` are own bound functions,
 * made on first read (most handlers use neither), so destructuring `ctx`
 * works.
 */
export class RunContext implements JobContext<unknown> {
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

  get step(): JobContext<unknown>['step'] {
    return (this.stepFn ??= <T>(stepId: string, fn: () => Promise<T> | T, opts?: StepOptions) =>
      runStep(this.host, this.ticket, this.attempt, stepId, fn, opts));
  }

  get spawnChild(): JobContext<unknown>['spawnChild'] {
    return (this.spawnFn ??= (type: string, input: unknown, opts?: SpawnChildOptions) =>
      spawnChild(this.host, this.ticket, this.attempt, type, input, opts));
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

async function spawnChild(
  host: ContextHost,
  ticket: Ticket,
  attempt: Attempt,
  type: string,
  input: unknown,
  opts: SpawnChildOptions | undefined,
): Promise<JobRun> {
  // Checked before the engine is asked anything: a misspelt option must
  // not be dropped.
  checkSpawnOptions(opts);
  // As ctx.step: only the run's current attempt may act for it (a child of
  // a parent already canceled or timed out would escape the cascade).
  const { id, epoch } = ticket;
  if (!(await host.store.attemptLive(id, epoch))) {
    const status = attempt.aborted ? ABORTED_STATUS[attempt.abortReason ?? ''] ?? 'ended' : 'ended';
    throw new JobRunStateError(id, status, 'ctx.spawnChild after its attempt ended');
  }
  return host.start(type, input, {
    parentRunId: id,
    parentClosePolicy: opts?.closePolicy,
    runAt: opts?.runAt,
    priority: opts?.priority,
    tags: opts?.tags,
    triggerSource: 'parent',
    triggerRef: id,
  });
}

async function runStep<T>(
  host: ContextHost,
  ticket: Ticket,
  attempt: Attempt,
  stepId: string,
  fn: () => Promise<T> | T,
  opts: StepOptions | undefined,
): Promise<T> {
  const { id: runId, epoch } = ticket;
  if (typeof stepId !== 'string' || stepId.length === 0) {
    throw new JobInputInvalidError('step id must be a non-empty string');
  }
  if (typeof fn !== 'function') throw new JobInputInvalidError(`step '${stepId}' needs a function`);
  checkStepOptions(opts, stepId);
  const timeoutMs = opts?.timeoutMs;
  if (timeoutMs !== undefined && (typeof timeoutMs !== 'number' || !(timeoutMs > 0))) {
    throw new JobInputInvalidError(`step '${stepId}' timeoutMs must be a positive number`);
  }
  const retry = opts?.retry ?? undefined;
  if (retry !== undefined) checkRetryPolicy(retry, `step '${stepId}' retry`);
  const policyText = retry === undefined ? null : JSON.stringify(retryPolicyWire(retry as unknown as Record<string, unknown>));
  const { store, clock } = host;
  for (;;) {
    const begin = await store.stepBegin(runId, epoch, stepId);
    if (begin.memoized) return begin.output as T;
    let value: T;
    try {
      value = await withTimeout(clock, Promise.resolve().then(fn), stepId, timeoutMs);
    } catch (err) {
      const failure = JSON.stringify(describeFailure(err));
      const failedAt = clock.now();
      const delay = await store.stepFail(runId, epoch, stepId, failure, policyText);
      if (delay === null || attempt.aborted) throw err;
      // Back off in engine time, counted from the failure (not from the
      // end of the database round trip that recorded it); a cancel or
      // timeout ends the wait early.
      const pause = clock.sleep(Math.max(0, failedAt + delay - clock.now()));
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
      await store.stepFail(runId, epoch, stepId, JSON.stringify(describeFailure(err)), null);
      throw err;
    }
    await store.stepComplete(runId, epoch, stepId, j.text);
    // The output as stored, as a replay's memoized step answers it: the
    // same value on every attempt (a Date as its ISO string). A step that
    // returns nothing stays undefined here, as in the seed (stored: null).
    return value === undefined ? value : (JSON.parse(j.text) as T);
  }
}

async function withTimeout<T>(clock: EngineClock, p: Promise<T>, stepId: string, timeoutMs: number | undefined): Promise<T> {
  if (timeoutMs === undefined) return p;
  const t = clock.sleep(timeoutMs);
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
