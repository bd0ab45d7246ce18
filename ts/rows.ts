/**
 * Row shapes of CONTRACT.md as JS sees them (their decoding from the
 * engine's wire form is in `wire.ts`).
 */

export type JobRunStatus =
  | 'pending'
  | 'running'
  | 'waiting'
  | 'completed'
  | 'failed'
  | 'timed_out'
  | 'canceled';

export interface JobRunError {
  message: string;
  /** Absent when the thrown value had none (never present as `undefined`: rows are decoded from JSON). */
  stack?: string;
  retryable: boolean;
  attempt: number;
}

export interface RetryPolicy {
  /** Attempts in all (the first one included); at least 1. */
  attempts: number;
  /**
   * How the delay before retry n (after attempt n failed) grows: `fixed` →
   * `baseMs`; `linear` → `baseMs × n`; `exponential` → `baseMs × 2^(n-1)`.
   */
  backoff: 'fixed' | 'linear' | 'exponential';
  baseMs: number;
  /** Upper bound of that delay (applied before jitter). Default: none (2^53 - 1 ms). */
  maxDelayMs?: number | undefined;
  /**
   * Randomises the delay d: `none` (default) waits d; `full` a uniform
   * draw in [0, d]; `equal` one in [d/2, d].
   */
  jitter?: 'none' | 'full' | 'equal' | undefined;
  /** Errors that are not retried, matched against the thrown error's `name` or `code`. */
  nonRetryableErrors?: string[] | undefined;
}

export interface JobDefinitionRow {
  type: string;
  version: number;
  pool: string;
  scopeEntityType: string | null;
  retryPolicy: RetryPolicy;
  timeoutMs: number | null;
  /** `'<fn>'` when the key is a function. */
  concurrencyKeyTemplate: string | null;
  collisionMode: 'queue' | 'reject' | 'replace';
  /** `'<fn>'` when the key is a function. */
  dedupeKeyTemplate: string | null;
  dedupeWindowMs: number | null;
  priorityDefault: number;
  replayFrom: 'scratch' | 'last_step' | 'last_checkpoint';
  createdAt: Date;
  updatedAt: Date;
}

export interface JobRunRow {
  id: string;
  jobType: string;
  jobVersion: number;
  parentRunId: string | null;
  rootRunId: string;
  parentClosePolicy: 'terminate' | 'cancel' | 'abandon';
  scopeEntityType: string | null;
  scopeEntityId: string | null;
  tenantId: string | null;
  tags: Record<string, string>;
  pool: string;
  priority: number;
  concurrencyKey: string | null;
  dedupeKey: string | null;
  status: JobRunStatus;
  input: Record<string, unknown>;
  output: Record<string, unknown> | null;
  error: JobRunError | null;
  triggerSource: 'manual' | 'schedule' | 'event' | 'parent';
  triggerRef: string | null;
  runAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  claimedAt: Date | null;
  /** Finished attempts: 0 while the first one runs (a run error's `attempt` counts from 1). */
  attempts: number;
  /** What a `waiting` run waits for (its first open wait); null otherwise. */
  waitKind: JobWaitKind | null;
  /** Always null: a resume token is never stored, only its hash. */
  resumeToken: string | null;
  /** When a `waiting` run resumes at the latest (a sleep's end, a wait's timeout); null when it waits without one. */
  waitDeadline: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

export type JobRun = JobRunRow;

/** What a durable wait waits for. */
export type JobWaitKind = 'sleep' | 'signal' | 'token' | 'child';

export interface JobStepRow {
  id: string;
  jobRunId: string;
  stepId: string;
  /** `'wait'`: a durable wait (`ctx.sleep`, `waitForSignal`, `waitForToken`, `invoke`). */
  kind: 'task' | 'wait';
  seq: number;
  status: 'pending' | 'running' | 'completed' | 'failed' | 'skipped';
  input: Record<string, unknown> | null;
  output: Record<string, unknown> | null;
  error: JobRunError | null;
  attempts: number;
  startedAt: Date | null;
  finishedAt: Date | null;
}

export type JobStep = JobStepRow;

/**
 * A schedule: a recurring `start` of one job type with one input, fired by
 * the engine (the worker's loop, or a `claimNext`/`fireDueSchedules` call).
 * Its runs have `triggerSource: 'schedule'`, `triggerRef` = the schedule's
 * name and `runAt` = the fire time that was due.
 */
export interface JobSchedule {
  name: string;
  /** The tenant its runs belong to (null: the null tenant / single-tenant mode). */
  tenantId: string | null;
  jobType: string;
  input: unknown;
  /** Five-field cron expression; null for an interval schedule. */
  cron: string | null;
  /** The IANA time zone `cron` is read in (`'UTC'` unless one was given); null for an interval schedule. */
  timezone: string | null;
  /** Interval in ms; null for a cron schedule. */
  everyMs: number | null;
  /** When it fires next; null once a cron expression can never fire again. */
  nextRunAt: Date | null;
  /** The last fire time that was due and fired, and the run it started (or found, by dedupe). */
  lastRunAt: Date | null;
  lastRunId: string | null;
  /** Why the last fire started no run (unknown job type, a missing template field, a `reject` collision…); null when it did. */
  lastError: string | null;
  createdAt: Date;
  updatedAt: Date;
}

/**
 * A run as `listJobRuns` lists it (the seed family's `JobRunSummary`): the
 * columns a runs viewer renders, without input, output or tags.
 * `errorMessage` is the run's `error.message`.
 */
export interface JobRunSummary {
  runId: string;
  rootRunId: string;
  parentRunId: string | null;
  triggerSource: JobRunRow['triggerSource'];
  triggerRef: string | null;
  jobType: string;
  pool: string;
  status: JobRunStatus;
  scopeEntityType: string | null;
  scopeEntityId: string | null;
  tenantId: string | null;
  attempts: number;
  errorMessage: string | null;
  runAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  createdAt: Date;
}

/** One page of `listJobRuns`: pass `nextCursor` back as `cursor`; null on the last page. */
export interface JobRunPage {
  items: JobRunSummary[];
  nextCursor: string | null;
}

/** What happened to a run: the kinds of its timeline's events. */
export type JobRunEventType =
  | 'created'
  | 'started'
  | 'step_started'
  | 'step_completed'
  | 'step_failed'
  | 'retry_scheduled'
  | 'waiting'
  | 'resumed'
  | 'released'
  | 'rescheduled'
  | 'canceled'
  | 'timed_out'
  | 'completed'
  | 'failed'
  | 'replayed';

/**
 * One transition of a run (`listRunEvents`), recorded in the transaction of
 * the change. `data` by type: `created` — `trigger`, `triggerRef?`,
 * `parentRunId?`; `step_*` — `stepId`, `stepAttempt` (a failure: `error`,
 * `retryInMs?`); `retry_scheduled` — `delayMs`, `error`; `waiting` —
 * `wait` (sleep, signal, token, child), `deadline?` (a Date); `resumed` —
 * `by` (signal, token, child, deadline, resolved), `stepId?`; `canceled` —
 * `reason` (requested, scope, replaced, parent failed, wait timed out),
 * `byRunId?` (the run whose cancel, failure or replacing start did it);
 * `failed` / `timed_out` — `error`; `rescheduled` — `runAt` (a Date);
 * `replayed` — `from`, `was` (the status before).
 */
export interface JobRunEvent {
  /** Order within the run (0: `created`); increasing, not contiguous. */
  seq: number;
  runId: string;
  type: JobRunEventType;
  at: Date;
  /** The attempt it belongs to (1 = the first; 0 for `created`). */
  attempt: number;
  data: Record<string, unknown> | null;
}

/** Runs that ended in one minute (`throughput`). */
export interface JobThroughputMinute {
  /** The minute's start. */
  at: Date;
  completed: number;
  failed: number;
  timedOut: number;
  canceled: number;
}

/** A page of a run's timeline, oldest first. */
export interface JobRunEventPage {
  items: JobRunEvent[];
  /** Pass back as `cursor` for the next page; null on the last. */
  nextCursor: string | null;
}

/** A failed run as `listRecentFailed` lists it (the seed family's `JobRunFailure`). */
export interface JobRunFailure {
  runId: string;
  jobType: string;
  pool: string;
  scopeEntityType: string | null;
  scopeEntityId: string | null;
  tenantId: string | null;
  attempts: number;
  errorMessage: string | null;
  /** When the run finished failing. */
  failedAt: Date;
  createdAt: Date;
}

/** A run and its descendants (`getRunTree`). */
export interface RunTreeNode {
  run: JobRun;
  children: RunTreeNode[];
}
