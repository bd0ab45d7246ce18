/**
 * Error classes of CONTRACT.md. Each has a stable `name` and `code` plus
 * its fields, so both `instanceof` and `err.code` work. Errors raised in
 * the native engine cross as `JOBFORGE_ERROR:{json}` and are rebuilt by
 * `native-errors.ts`.
 */
import type { JobRun, JobRunError } from './rows';

export abstract class JobforgeError extends Error {
  abstract readonly code: string;
}

export class JobTypeNotFoundError extends JobforgeError {
  override readonly name = 'JobTypeNotFoundError';
  readonly code = 'JOB_TYPE_NOT_FOUND';
  constructor(readonly jobType: string) {
    super(`unknown job type '${jobType}'`);
  }
}

export class JobCollisionError extends JobforgeError {
  override readonly name = 'JobCollisionError';
  readonly code = 'JOB_COLLISION';
  constructor(
    readonly jobType: string,
    readonly concurrencyKey: string,
    readonly incumbent: JobRun,
  ) {
    super(`'${jobType}' already has in-flight run ${incumbent.id} for key '${concurrencyKey}'`);
  }
}

export class JobNotReplayableError extends JobforgeError {
  override readonly name = 'JobNotReplayableError';
  readonly code = 'JOB_NOT_REPLAYABLE';
  constructor(
    readonly runId: string,
    readonly currentStatus: string,
  ) {
    super(`run ${runId} is '${currentStatus}', not terminal`);
  }
}

export class JobTemplateFieldMissingError extends JobforgeError {
  override readonly name = 'JobTemplateFieldMissingError';
  readonly code = 'JOB_TEMPLATE_FIELD_MISSING';
  constructor(
    readonly template: string,
    readonly field: string,
  ) {
    super(`template '${template}' needs input field '${field}'`);
  }
}

export class MissingTenantIdError extends JobforgeError {
  override readonly name = 'MissingTenantIdError';
  readonly code = 'MISSING_TENANT_ID';
  constructor(readonly method: string) {
    super(`${method} needs tenantId when multi-tenancy is on`);
  }
}

export class JobKeyFunctionUnavailableError extends JobforgeError {
  override readonly name = 'JobKeyFunctionUnavailableError';
  readonly code = 'JOB_KEY_FUNCTION_UNAVAILABLE';
  constructor(
    readonly jobType: string,
    readonly kind: string,
  ) {
    super(
      `job type '${jobType}' has a function ${kind} key, which only the process that registered it can evaluate`,
    );
  }
}

export class JobRunNotFoundError extends JobforgeError {
  override readonly name = 'JobRunNotFoundError';
  readonly code = 'JOB_RUN_NOT_FOUND';
  constructor(readonly runId: string) {
    super(`run ${runId} not found`);
  }
}

export class ParentRunNotFoundError extends JobforgeError {
  override readonly name = 'ParentRunNotFoundError';
  readonly code = 'PARENT_RUN_NOT_FOUND';
  constructor(readonly parentRunId: string) {
    super(`parentRunId ${parentRunId} does not reference an existing run`);
  }
}

export class JobInputInvalidError extends JobforgeError {
  override readonly name = 'JobInputInvalidError';
  readonly code = 'JOB_INPUT_INVALID';
  constructor(readonly reason: string) {
    super(`invalid input: ${reason}`);
  }
}

export class JobRunStateError extends JobforgeError {
  override readonly name = 'JobRunStateError';
  readonly code = 'JOB_RUN_STATE';
  constructor(
    readonly runId: string,
    readonly status: string,
    detail?: string,
  ) {
    super(`run ${runId} is '${status}'${detail ? `: ${detail}` : ''}`);
  }
}

/** Two concurrent `ctx.step` calls with one step id in one attempt. */
export class JobStepConflictError extends JobforgeError {
  override readonly name = 'JobStepConflictError';
  readonly code = 'JOB_STEP_CONFLICT';
  constructor(
    readonly runId: string,
    readonly stepId: string,
  ) {
    super(`step '${stepId}' of run ${runId} is already running in this attempt`);
  }
}

/** Thrown inside a handler when a step exceeds `StepOptions.timeoutMs`. */
export class JobStepTimeoutError extends JobforgeError {
  override readonly name = 'JobStepTimeoutError';
  readonly code = 'JOB_STEP_TIMEOUT';
  constructor(
    readonly stepId: string,
    readonly timeoutMs: number,
  ) {
    super(`step '${stepId}' timed out after ${timeoutMs}ms`);
  }
}

/**
 * A wait ran out of time: `waitForRun` gave up before the run ended
 * (`stepId` null), or a durable wait (`ctx.waitForSignal`,
 * `ctx.waitForToken`, `ctx.invoke`) reached its `timeoutMs` inside the
 * run's handler (catchable there; uncaught, an ordinary run failure).
 */
export class JobWaitTimeoutError extends JobforgeError {
  override readonly name = 'JobWaitTimeoutError';
  readonly code = 'JOB_WAIT_TIMEOUT';
  readonly stepId: string | null;
  constructor(
    readonly runId: string,
    readonly timeoutMs: number,
    stepId?: string,
  ) {
    super(stepId === undefined ? `run ${runId} did not finish within ${timeoutMs}ms` : `wait '${stepId}' of run ${runId} timed out after ${timeoutMs}ms`);
    this.stepId = stepId ?? null;
  }
}

/** `ctx.invoke`'s child ended `failed`, `timed_out` or `canceled`. */
export class JobChildFailedError extends JobforgeError {
  override readonly name = 'JobChildFailedError';
  readonly code = 'JOB_CHILD_FAILED';
  constructor(
    readonly childRunId: string,
    readonly status: 'failed' | 'timed_out' | 'canceled',
    readonly error: JobRunError | null,
    message?: string,
  ) {
    super(message ?? `child run ${childRunId} ended '${status}'`);
  }
}

/** `resume` with a token that is malformed, unknown, used, expired, or of a run that ended. */
export class JobResumeTokenError extends JobforgeError {
  override readonly name = 'JobResumeTokenError';
  readonly code = 'JOB_RESUME_TOKEN';
  constructor(readonly reason: string) {
    super(`resume token refused: ${reason}`);
  }
}

/** `startWorker` while a worker runs, or another worker-state misuse. */
export class JobWorkerStateError extends JobforgeError {
  override readonly name = 'JobWorkerStateError';
  readonly code = 'JOB_WORKER_STATE';
  constructor(message: string) {
    super(message);
  }
}

/** `advanceTime` on an orchestrator whose clock is not `'manual'`. */
export class JobClockError extends JobforgeError {
  override readonly name = 'JobClockError';
  readonly code = 'JOB_CLOCK';
  constructor(message: string) {
    super(message);
  }
}

/**
 * The database failed (connection lost, deadlock, ...). `outcome` says what
 * the call changed:
 * - `'none'`: nothing — the transaction was rolled back, or its commit was
 *   lost with the connection and the server answered, read back on a fresh
 *   connection, that it did not commit. `retryable` when trying again may
 *   succeed (deadlock, serialization failure, lost or refused connection).
 * - `'unknown'`: the connection died while the commit was under way and
 *   whether it landed could not be read back within the connection timeout
 *   (`connect_timeout`, 10 s by default): the change may be stored. Never
 *   `retryable`: read the state back (`findById`, a dedupe key) before
 *   trying again.
 */
export class JobStoreError extends JobforgeError {
  override readonly name = 'JobStoreError';
  readonly code = 'JOB_STORE_ERROR';
  constructor(
    message: string,
    readonly retryable: boolean,
    readonly outcome: 'none' | 'unknown' = 'none',
  ) {
    super(message);
  }
}
