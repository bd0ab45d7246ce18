/**
 * The `ctx` a handler receives, and what its calls do: `ctx.step`
 * (memoized through the engine, retried in place per its policy),
 * `ctx.spawnChild`, and the durable waits (`ctx.sleep`, `sleepUntil`,
 * `waitForSignal`, `waitForToken`, `invoke`), whose rules are the engine's
 * (`engine/waits.rs`): here a wait is only asked for, and an open one
 * becomes a promise that never settles, on which the attempt parks.
 */
import { JobChildFailedError, JobInputInvalidError, JobRunStateError, JobStepTimeoutError, JobWaitTimeoutError } from '../errors';
import type { InvokeOptions, JobContext, JobLogger, SpawnChildOptions, StepOptions, WaitForSignalOptions, WaitForTokenOptions } from '../handler';
import { toJsonText } from '../json';
import type { JobRun, JobRunError } from '../rows';
import type { EngineClock } from '../clock';
import type { PreparedStart } from '../backend/backend';
import { checkRetryPolicy, checkSpawnOptions, checkStepOptions, checkText, checkWaitOptions, dateMs, retryPolicyWire, type StartOptionsInput } from '../validate';
import { failureJson, startWireJson, type Ticket, type WaitAnswer } from '../wire';
import { ABORTED_STATUS, type Attempt } from './attempt';
import type { StepTrace, Tracing } from '../tracing';

/** What a step call needs from the engine (one backend's operations). */
export interface StepStore {
  /** A durable wait (`waitText`: the engine's `WaitWire` as JSON). */
  waitBegin(runId: string, epoch: number, stepId: string, waitText: string): Promise<WaitAnswer>;
  /** A token wait's `deliver` returned. */
  waitDelivered(runId: string, epoch: number, stepId: string): Promise<WaitAnswer>;
  stepBegin(runId: string, epoch: number, stepId: string): Promise<{ memoized: true; output: unknown } | { memoized: false; attempt: number }>;
  stepComplete(runId: string, epoch: number, stepId: string, outputText: string): Promise<void>;
  /** Records the failure; the backoff before a retry (ms), or null. */
  stepFail(runId: string, epoch: number, stepId: string, failure: string, policyText: string | null): Promise<number | null>;
  attemptLive(runId: string, epoch: number): Promise<boolean>;
  /** An attempt's outcome (`tick`'s path; also a parked execution's late one). */
  finishAttempt(runId: string, epoch: number, outcomeText: string): Promise<boolean>;
}

/** What a `ctx` calls back into (one per orchestrator). */
export interface ContextHost {
  readonly store: StepStore;
  readonly clock: EngineClock;
  /** OpenTelemetry, when `@opentelemetry/api` is installed and not turned off. */
  readonly tracing: Tracing | null;
  loggerFactory(run: JobRun): JobLogger;
  /** The orchestrator's own messages. */
  readonly logger: JobLogger;
  /** `start` of the orchestrator (the child's type and input were checked where `ctx.spawnChild` was called). */
  start(type: string, input: unknown, opts: StartOptionsInput): Promise<JobRun>;
  /** `prepareStart` with this orchestrator's handlers (JS-side keys of `ctx.invoke`'s child). */
  prepare(type: string, input: unknown, opts: StartOptionsInput): PreparedStart;
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
  private waits?: Waits;

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

  // The durable waits, bound once per ctx on first use (destructurable).
  private get w(): Waits {
    return (this.waits ??= new Waits(this.host, this.ticket, this.attempt));
  }

  get sleep(): JobContext<unknown>['sleep'] {
    return this.w.sleep;
  }

  get sleepUntil(): JobContext<unknown>['sleepUntil'] {
    return this.w.sleepUntil;
  }

  get waitForSignal(): JobContext<unknown>['waitForSignal'] {
    return this.w.waitForSignal;
  }

  get waitForToken(): JobContext<unknown>['waitForToken'] {
    return this.w.waitForToken;
  }

  get invoke(): JobContext<unknown>['invoke'] {
    return this.w.invoke;
  }

  get signal(): AbortSignal {
    return this.attempt.signal;
  }

  /** Built on first use: most handlers never log. */
  get logger(): JobLogger {
    return (this.cachedLogger ??= this.host.loggerFactory(this.ticket.run));
  }
}

/** The start options of a child of run `parentId` (`ctx.spawnChild`, `ctx.invoke`). */
function childStart(parentId: string, opts: SpawnChildOptions | undefined): StartOptionsInput {
  return {
    parentRunId: parentId,
    parentClosePolicy: opts?.closePolicy,
    runAt: opts?.runAt,
    priority: opts?.priority,
    tags: opts?.tags,
    triggerSource: 'parent',
    triggerRef: parentId,
  };
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
  attempt.checkNotReturned(id, 'ctx.spawnChild');
  if (!(await host.store.attemptLive(id, epoch))) {
    const status = attempt.aborted ? ABORTED_STATUS[attempt.abortReason ?? ''] ?? 'ended' : 'ended';
    throw new JobRunStateError(id, status, 'ctx.spawnChild after its attempt ended');
  }
  return host.start(type, input, childStart(id, opts));
}

/** A wait call must name its step like `ctx.step` does. */
function checkStepId(stepId: unknown): asserts stepId is string {
  if (typeof stepId !== 'string' || stepId.length === 0) {
    throw new JobInputInvalidError('step id must be a non-empty string');
  }
  // Stored as text: two ids cut inside a character would name one step.
  checkText(stepId, 'step id');
}

/** What a failed wait throws (the engine wrote its name and fields). */
function waitError(e: { name?: string; message?: string; [field: string]: unknown }): Error {
  if (e.name === 'JobWaitTimeoutError') return new JobWaitTimeoutError(String(e.runId), Number(e.timeoutMs), String(e.stepId));
  if (e.name === 'JobChildFailedError') {
    const status = e.status as 'failed' | 'timed_out' | 'canceled';
    return new JobChildFailedError(String(e.childRunId), status, (e.error ?? null) as JobRunError | null, e.message);
  }
  const err = new Error(e.message ?? 'wait failed');
  if (typeof e.name === 'string') err.name = e.name;
  return err;
}

/** A promise that never settles and holds nothing: what a handler awaits on an open wait. */
const PARKED_FOREVER = (): Promise<never> => new Promise<never>(() => undefined);

/** The durable waits of one attempt's `ctx`. */
class Waits {
  constructor(
    private readonly host: ContextHost,
    private readonly ticket: Ticket,
    private readonly attempt: Attempt,
  ) {}

  readonly sleep = (stepId: string, ms: number): Promise<void> =>
    this.ask(stepId, () => {
      if (typeof ms !== 'number' || !Number.isSafeInteger(ms) || ms < 0) {
        throw new JobInputInvalidError(`sleep '${stepId}': ms must be a non-negative integer, got ${String(ms)}`);
      }
      // The clock is read only when the engine is asked (not for a memoized sleep).
      return () => `{"kind":"sleep","until":${this.host.clock.now() + ms}}`;
    }).then(() => undefined);

  readonly sleepUntil = (stepId: string, date: Date): Promise<void> =>
    this.ask(stepId, () => {
      const at = dateMs(date);
      if (at === null) throw new JobInputInvalidError(`sleepUntil '${stepId}': needs a valid Date`);
      return () => `{"kind":"sleep","until":${at}}`;
    }).then(() => undefined);

  readonly waitForSignal = <T = unknown>(stepId: string, opts?: WaitForSignalOptions): Promise<T> =>
    this.ask(stepId, () => {
      checkWaitOptions(opts, 'signal', stepId);
      const signal = opts?.signal ?? stepId;
      if (typeof signal !== 'string' || signal.length === 0) {
        throw new JobInputInvalidError(`waitForSignal '${stepId}': signal must be a non-empty string`);
      }
      checkText(signal, `waitForSignal '${stepId}': signal`);
      const text = `{"kind":"signal","signal":${JSON.stringify(signal)}${timeoutField(opts?.timeoutMs)}}`;
      return () => text;
    }) as Promise<T>;

  readonly waitForToken = <T = unknown>(stepId: string, deliver: (token: string) => unknown, opts?: WaitForTokenOptions): Promise<T> =>
    this.ask(
      stepId,
      () => {
        if (typeof deliver !== 'function') throw new JobInputInvalidError(`waitForToken '${stepId}' needs a deliver function`);
        checkWaitOptions(opts, 'token', stepId);
        const text = `{"kind":"token"${timeoutField(opts?.timeoutMs)}}`;
        return () => text;
      },
      deliver,
    ) as Promise<T>;

  readonly invoke = <O = unknown>(stepId: string, type: string, input?: unknown, opts?: InvokeOptions): Promise<O> =>
    this.ask(stepId, () => {
      checkWaitOptions(opts, 'invoke', stepId);
      const { id } = this.ticket;
      const p = this.host.prepare(type, input, childStart(id, opts));
      if (p.thrown !== null) throw p.thrown.error;
      const o = p.opts === null ? '' : `,"opts":${startWireJson(p.opts)}`;
      const text = `{"kind":"child","type":${JSON.stringify(p.type)},"input":${p.inputText}${o}${timeoutField(opts?.timeoutMs)}}`;
      return () => text;
    }) as Promise<O>;

  /**
   * One wait: answers its stored value (from the ticket's memo when the
   * wait completed before this execution, else from the engine), throws its
   * stored error, or parks on it. `wire` checks the call's arguments, the
   * same whether or not the wait is memoized, and gives what writes the
   * request. `deliver` (a token wait) runs once, as a step does: its throw
   * fails the wait and is rethrown.
   */
  private async ask(stepId: string, wire: () => () => string, deliver?: (token: string) => unknown): Promise<unknown> {
    checkStepId(stepId);
    const request = wire();
    const { id: runId, epoch } = this.ticket;
    const a = this.attempt;
    a.checkNotReturned(runId, `wait '${stepId}'`);
    // An execution that went on after its attempt parked asks the engine
    // even for a wait answered already: the engine learns that it goes on
    // (a run waiting on nothing else would otherwise never resume if this
    // process died before the execution's outcome was stored).
    const memo = a.parked ? undefined : this.ticket.takeMemo(stepId, true);
    if (memo !== undefined) return memo.value;
    a.claimId(runId, stepId);
    // Held while the wait is open: it parks the run under this id.
    let open = false;
    try {
      return await this.askEngine(runId, epoch, stepId, request, deliver, () => (open = true));
    } finally {
      if (!open) a.idsInFlight.delete(stepId);
    }
  }

  /** `ask` past its memo: the engine's answer (`opened` is told when the wait stays open). */
  private async askEngine(
    runId: string,
    epoch: number,
    stepId: string,
    request: () => string,
    deliver: ((token: string) => unknown) | undefined,
    opened: () => void,
  ): Promise<unknown> {
    const { store } = this.host;
    const a = this.attempt;
    let answer: WaitAnswer;
    a.waitCalls++;
    try {
      answer = await store.waitBegin(runId, epoch, stepId, request());
    } finally {
      // Whatever the answer (a throw too): other open waits may now park.
      a.waitCalls--;
      a.considerPark();
    }
    if (answer.state === 'token') {
      if (deliver === undefined) throw new JobInputInvalidError(`wait '${stepId}' is a token wait`);
      a.stepsRunning++;
      try {
        await deliver(answer.token);
      } catch (err) {
        await store.stepFail(runId, epoch, stepId, failureJson(err), null);
        throw err;
      } finally {
        a.stepsRunning--;
        a.considerPark();
      }
      a.waitCalls++;
      try {
        answer = await store.waitDelivered(runId, epoch, stepId);
      } finally {
        a.waitCalls--;
        a.considerPark();
      }
    }
    switch (answer.state) {
      case 'done':
        return answer.value;
      case 'failed':
        throw waitError(answer.error);
      default:
        opened();
        a.waitOpened();
        return PARKED_FOREVER();
    }
  }
}

const timeoutField = (t: unknown): string => {
  if (t === undefined || t === null) return '';
  if (typeof t !== 'number' || !Number.isSafeInteger(t) || t <= 0) {
    throw new JobInputInvalidError(`timeoutMs must be a positive integer, got ${String(t)}`);
  }
  return `,"timeoutMs":${t}`;
};

async function runStep<T>(
  host: ContextHost,
  ticket: Ticket,
  attempt: Attempt,
  stepId: string,
  fn: () => Promise<T> | T,
  opts: StepOptions | undefined,
): Promise<T> {
  const runId = ticket.id;
  checkStepId(stepId);
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
  attempt.checkNotReturned(runId, `ctx.step '${stepId}'`);
  attempt.claimId(runId, stepId);
  // A running step keeps the attempt from parking on its waits.
  attempt.stepsRunning++;
  try {
    const trace = attempt.trace;
    if (trace === null) return await stepLoop(store, clock, ticket, attempt, stepId, fn, timeoutMs, policyText, null);
    return await trace.step(stepId, (st) => stepLoop(store, clock, ticket, attempt, stepId, fn, timeoutMs, policyText, st));
  } finally {
    attempt.idsInFlight.delete(stepId);
    attempt.stepsRunning--;
    attempt.considerPark();
  }
}

async function stepLoop<T>(
  store: StepStore,
  clock: EngineClock,
  ticket: Ticket,
  attempt: Attempt,
  stepId: string,
  fn: () => Promise<T> | T,
  timeoutMs: number | undefined,
  policyText: string | null,
  trace: StepTrace | null,
): Promise<T> {
  const { id: runId, epoch } = ticket;
  // Completed before this execution: the ticket holds its output, as the
  // engine would answer it.
  const memo = ticket.takeMemo(stepId, false);
  if (memo !== undefined) {
    trace?.memoized();
    return memo.value as T;
  }
  for (;;) {
    const begin = await store.stepBegin(runId, epoch, stepId);
    if (begin.memoized) {
      trace?.memoized();
      return begin.output as T;
    }
    trace?.tryBegan(begin.attempt);
    let value: T;
    try {
      value = await withTimeout(clock, Promise.resolve().then(fn), stepId, timeoutMs);
    } catch (err) {
      trace?.tryFailed(err);
      const failure = failureJson(err);
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
      await store.stepFail(runId, epoch, stepId, failureJson(err), null);
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
