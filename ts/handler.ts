/** Handler-facing types: metadata, context, base class. */
import type { JobRun, RetryPolicy } from './rows';
import type { AnyJobs, JobMap, JobTypeName, OptionalInputName } from './typed';

export type { RetryPolicy };

export enum ParentClosePolicy {
  Terminate = 'terminate',
  Cancel = 'cancel',
  Abandon = 'abandon',
}

/** A key: a `{{field}}` template or a function of the input. */
export type KeySource<TInput> = string | ((input: TInput) => string);

export interface JobHandlerMeta<TInput = unknown> {
  /** Pool whose workers claim the runs. Default `'batch'`. */
  pool?: string | undefined;
  /** Scope stamped on runs started without `opts.scope`. */
  scope?: { entity: string; from: (input: TInput) => string } | undefined;
  /** Run-level retry. Default: one attempt. */
  retry?: RetryPolicy | undefined;
  /** One lane per key: runs of a lane execute one at a time. */
  concurrency?: { key: KeySource<TInput>; collisionMode?: 'queue' | 'reject' | 'replace' | undefined } | undefined;
  /** Starts with the same key inside the window return the existing run. */
  dedupe?: { key: KeySource<TInput>; windowMs: number } | undefined;
  /** Per-attempt time limit. */
  timeoutMs?: number | undefined;
  /** What `replay` keeps. Default `'last_checkpoint'`. */
  replayFrom?: 'scratch' | 'last_step' | 'last_checkpoint' | undefined;
  /** The seed family's bridge triggers (read by its code generator): accepted and ignored. */
  triggers?: readonly unknown[] | undefined;
}

export interface StepOptions {
  /** Retry the step in place with this policy's backoff before failing. */
  retry?: RetryPolicy | undefined;
  /** Fail the step with `JobStepTimeoutError` after this many ms. */
  timeoutMs?: number | undefined;
}

export interface SpawnChildOptions {
  closePolicy?: ParentClosePolicy | 'terminate' | 'cancel' | 'abandon' | undefined;
  runAt?: Date | undefined;
  priority?: number | undefined;
  tags?: Record<string, string> | undefined;
}

export interface WaitForSignalOptions {
  /** The signal's name (default: the step id). */
  signal?: string | undefined;
  /** Deadline: the run resumes then and the call throws `JobWaitTimeoutError`. */
  timeoutMs?: number | undefined;
}

export interface WaitForTokenOptions {
  /** Deadline: the run resumes then, the call throws `JobWaitTimeoutError`, and the token is refused from then on. */
  timeoutMs?: number | undefined;
}

export interface InvokeOptions extends SpawnChildOptions {
  /** Deadline: the child is canceled, the run resumes, and the call throws `JobWaitTimeoutError`. */
  timeoutMs?: number | undefined;
}

export interface JobLogger {
  log(message: unknown, ...rest: unknown[]): void;
  warn(message: unknown, ...rest: unknown[]): void;
  error(message: unknown, ...rest: unknown[]): void;
  debug(message: unknown, ...rest: unknown[]): void;
}

/**
 * What a handler receives. `Jobs`: the app's job map (see `AnyJobs`), which
 * types `spawnChild`.
 */
export interface JobContext<TInput = unknown, Jobs extends JobMap = AnyJobs> {
  readonly input: TInput;
  readonly run: JobRun;
  /**
   * Memoized unit of work: a completed step returns its stored output. The
   * result is the output as stored (JSON: a `Date` becomes its ISO string),
   * on the first attempt as on a replay; a step that returns nothing
   * resolves with undefined, and with null once memoized.
   * A failing `fn` is retried per `retry`; an output that is not JSON fails
   * the step without a retry (`fn` already did its work).
   */
  step<T>(stepId: string, fn: () => Promise<T> | T, opts?: StepOptions): Promise<T>;
  /** Starts a child run (fire-and-forget; `closePolicy` decides cascade). */
  spawnChild<K extends JobTypeName<Jobs>>(type: K, input: Jobs[K], opts?: SpawnChildOptions): Promise<JobRun>;
  /** A child of a job type whose input may be left out (stored as `{}`). */
  spawnChild<K extends OptionalInputName<Jobs>>(type: K, input?: Jobs[K] | null, opts?: SpawnChildOptions): Promise<JobRun>;
  /**
   * Durable waits. Each takes a step id first and is memoized like
   * `ctx.step`. While the handler is blocked only on waits (no `ctx.step`
   * running), the run parks: it turns `waiting`, holds no worker slot, and
   * when a wait resolves runs again from the top, its finished steps and
   * waits answering from the store.
   */
  sleep(stepId: string, ms: number): Promise<void>;
  sleepUntil(stepId: string, date: Date): Promise<void>;
  /** The payload of the next signal named `opts.signal` (default: the step id) sent with `orchestrator.signal`. */
  waitForSignal<T = unknown>(stepId: string, opts?: WaitForSignalOptions): Promise<T>;
  /**
   * Makes a single-use resume token, calls `deliver(token)` once (a throw
   * fails the wait and is rethrown), and resolves with the payload of
   * `orchestrator.resume(token, payload)`.
   */
  waitForToken<T = unknown>(stepId: string, deliver: (token: string) => unknown, opts?: WaitForTokenOptions): Promise<T>;
  /**
   * Starts a child (as `spawnChild`) and resolves with its output; a child
   * that ends failed, timed out or canceled throws `JobChildFailedError`.
   */
  invoke<O = unknown, K extends JobTypeName<Jobs> = JobTypeName<Jobs>>(stepId: string, type: K, input: Jobs[K], opts?: InvokeOptions): Promise<O>;
  /** A child of a job type whose input may be left out (stored as `{}`). */
  invoke<O = unknown, K extends OptionalInputName<Jobs> = OptionalInputName<Jobs>>(stepId: string, type: K, input?: Jobs[K] | null, opts?: InvokeOptions): Promise<O>;
  readonly logger: JobLogger;
  /**
   * Aborts when the run is canceled, its attempt times out, or a worker's
   * stop() gives up on it; `signal.reason` is `'canceled'`, `'timed_out'`
   * or `'shutdown'`.
   */
  readonly signal: AbortSignal;
}

export abstract class JobHandlerBase<TInput = unknown, TOutput = unknown, Jobs extends JobMap = AnyJobs> {
  abstract run(ctx: JobContext<TInput, Jobs>): Promise<TOutput>;
}

/**
 * A handler: a class constructed per execution, a function, or an object
 * with `run`. The core constructs a class with no arguments; the type
 * admits constructor parameters because the Nest binding, which is handed
 * this same class type, builds handler classes through DI.
 */
export type JobHandler<TInput = unknown, Jobs extends JobMap = AnyJobs> =
  | (new (...args: never[]) => { run(ctx: JobContext<TInput, Jobs>): unknown })
  | ((ctx: JobContext<TInput, Jobs>) => unknown)
  | { run(ctx: JobContext<TInput, Jobs>): unknown };

/**
 * Console-backed logger named after the run (the Nest binding swaps in
 * Nest's Logger). Values go to `console` as they are, so an `Error` shows
 * its stack and a BigInt or a cyclic object is printed, not thrown on.
 */
export function consoleLogger(context: string): JobLogger {
  const tag = `[${context}]`;
  return {
    log: (m, ...r) => console.log(tag, m, ...r),
    warn: (m, ...r) => console.warn(tag, m, ...r),
    error: (m, ...r) => console.error(tag, m, ...r),
    debug: (m, ...r) => console.debug(tag, m, ...r),
  };
}

/** A job type's handler as registered (`getHandlerRegistration`). */
export interface HandlerRegistration {
  type: string;
  meta: JobHandlerMeta<unknown>;
  handlerClass: JobHandler<unknown>;
}
