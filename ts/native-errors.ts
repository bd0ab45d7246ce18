/**
 * Native failures back to typed errors. Internal: the addon encodes an
 * error's code and fields in the message (async napi functions cannot
 * carry custom error codes), and this rebuilds the class. Kept apart from
 * `errors.ts` so that module holds only the public error classes.
 */
import {
  JobCollisionError,
  JobInputInvalidError,
  JobKeyFunctionUnavailableError,
  JobNotReplayableError,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepConflictError,
  JobStoreError,
  JobTemplateFieldMissingError,
  JobTypeNotFoundError,
  JobforgeError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from './errors';
import { materializeRun } from './rows';

const PREFIX = 'JOBFORGE_ERROR:';

type Fields = Record<string, unknown>;

const builders: Record<string, (f: Fields, message: string) => JobforgeError> = {
  JOB_TYPE_NOT_FOUND: (f) => new JobTypeNotFoundError(String(f.jobType)),
  JOB_COLLISION: (f) =>
    new JobCollisionError(
      String(f.jobType),
      String(f.concurrencyKey),
      materializeRun(f.incumbent as Record<string, unknown>),
    ),
  JOB_NOT_REPLAYABLE: (f) => new JobNotReplayableError(String(f.runId), String(f.currentStatus)),
  JOB_TEMPLATE_FIELD_MISSING: (f) =>
    new JobTemplateFieldMissingError(String(f.template), String(f.field)),
  MISSING_TENANT_ID: (f) => new MissingTenantIdError(String(f.method)),
  JOB_KEY_FUNCTION_UNAVAILABLE: (f) =>
    new JobKeyFunctionUnavailableError(String(f.jobType), String(f.kind)),
  JOB_RUN_NOT_FOUND: (f) => new JobRunNotFoundError(String(f.runId)),
  PARENT_RUN_NOT_FOUND: (f) => new ParentRunNotFoundError(String(f.parentRunId)),
  JOB_INPUT_INVALID: (f) => new JobInputInvalidError(String(f.reason)),
  JOB_RUN_STATE: (f, m) => {
    const e = new JobRunStateError(String(f.runId), String(f.status));
    e.message = m;
    return e;
  },
  JOB_STEP_CONFLICT: (f) => new JobStepConflictError(String(f.runId), String(f.stepId)),
  JOB_STORE_ERROR: (f, m) => new JobStoreError(m, f.retryable === true),
};

/** Rebuilds the typed error of a native failure; other errors pass through. */
export function translateNativeError(err: unknown): unknown {
  if (!(err instanceof Error) || !err.message.startsWith(PREFIX)) return err;
  try {
    const payload = JSON.parse(err.message.slice(PREFIX.length)) as {
      code: string;
      message: string;
      fields: Fields;
    };
    const build = builders[payload.code];
    if (build) return build(payload.fields, payload.message);
    return new Error(payload.message);
  } catch {
    return err;
  }
}
