/**
 * Row shapes of CONTRACT.md as JS sees them, and their conversion from the
 * engine's JSON (timestamps arrive as epoch milliseconds).
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
  stack?: string | undefined;
  retryable: boolean;
  attempt: number;
}

export interface RetryPolicy {
  attempts: number;
  backoff: 'fixed' | 'exponential';
  baseMs: number;
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
  waitKind: 'signal' | null;
  resumeToken: string | null;
  waitDeadline: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

export type JobRun = JobRunRow;

export interface JobStepRow {
  id: string;
  jobRunId: string;
  stepId: string;
  kind: 'task';
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

type Raw = Record<string, unknown>;

const date = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(v as number));

/** Engine JSON object (keyed form, e.g. a collision's incumbent) → JobRun. */
export function materializeRun(r: Raw): JobRun {
  r.runAt = new Date(r.runAt as number);
  r.createdAt = new Date(r.createdAt as number);
  r.updatedAt = new Date(r.updatedAt as number);
  r.startedAt = date(r.startedAt);
  r.finishedAt = date(r.finishedAt);
  r.claimedAt = date(r.claimedAt);
  r.waitDeadline = date(r.waitDeadline);
  return r as unknown as JobRun;
}

/**
 * The engine's wire form of a run: a JSON array in the contract's field
 * order (see `RUN_FIELDS` in the core). Decoding an array into an object
 * literal of fixed shape is about twice as fast as parsing keyed JSON.
 */
export type RunTuple = [
  string, string, number, string | null, string, JobRunRow['parentClosePolicy'],
  string | null, string | null, string | null, Record<string, string>, string, number,
  string | null, string | null, JobRunStatus, Record<string, unknown>, Record<string, unknown> | null,
  JobRunError | null, JobRunRow['triggerSource'], string | null, number, number | null,
  number | null, number | null, number, number, number,
];

export function fromTuple(a: RunTuple): JobRun {
  return {
    id: a[0],
    jobType: a[1],
    jobVersion: a[2],
    parentRunId: a[3],
    rootRunId: a[4],
    parentClosePolicy: a[5],
    scopeEntityType: a[6],
    scopeEntityId: a[7],
    tenantId: a[8],
    tags: a[9],
    pool: a[10],
    priority: a[11],
    concurrencyKey: a[12],
    dedupeKey: a[13],
    status: a[14],
    input: a[15],
    output: a[16],
    error: a[17],
    triggerSource: a[18],
    triggerRef: a[19],
    runAt: new Date(a[20]),
    startedAt: a[21] === null ? null : new Date(a[21]),
    finishedAt: a[22] === null ? null : new Date(a[22]),
    claimedAt: a[23] === null ? null : new Date(a[23]),
    attempts: a[24],
    waitKind: null,
    resumeToken: null,
    waitDeadline: null,
    createdAt: new Date(a[25]),
    updatedAt: new Date(a[26]),
  };
}

export function parseRun(json: string): JobRun {
  return fromTuple(JSON.parse(json) as RunTuple);
}

export function parseRuns(json: string): JobRun[] {
  return (JSON.parse(json) as RunTuple[]).map(fromTuple);
}

export function parseStep(r: Raw): JobStep {
  r.startedAt = date(r.startedAt);
  r.finishedAt = date(r.finishedAt);
  return r as unknown as JobStep;
}

export function parseDefinition(r: Raw): JobDefinitionRow {
  r.createdAt = new Date(r.createdAt as number);
  r.updatedAt = new Date(r.updatedAt as number);
  return r as unknown as JobDefinitionRow;
}

/** What the JS side keeps of a definition to build a new run's row. */
export interface RunDefaults {
  version: number;
  pool: string;
  priority: number;
}

/**
 * The row of a run `start` just created with no options and no keys: the
 * engine answered only its id and creation time, everything else follows
 * from the definition (the same values the engine stored).
 */
export function newRun(jobType: string, d: RunDefaults, id: string, at: number, input: Record<string, unknown>): JobRun {
  return {
    id,
    jobType,
    jobVersion: d.version,
    parentRunId: null,
    rootRunId: id,
    parentClosePolicy: 'terminate',
    scopeEntityType: null,
    scopeEntityId: null,
    tenantId: null,
    tags: {},
    pool: d.pool,
    priority: d.priority,
    concurrencyKey: null,
    dedupeKey: null,
    status: 'pending',
    input,
    output: null,
    error: null,
    triggerSource: 'manual',
    triggerRef: null,
    runAt: new Date(at),
    startedAt: null,
    finishedAt: null,
    claimedAt: null,
    attempts: 0,
    waitKind: null,
    resumeToken: null,
    waitDeadline: null,
    createdAt: new Date(at),
    updatedAt: new Date(at),
  };
}

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

/** Engine JSON of a schedule → JobSchedule. */
export function parseSchedule(r: Raw): JobSchedule {
  r.nextRunAt = date(r.nextRunAt);
  r.lastRunAt = date(r.lastRunAt);
  r.createdAt = new Date(r.createdAt as number);
  r.updatedAt = new Date(r.updatedAt as number);
  return r as unknown as JobSchedule;
}
