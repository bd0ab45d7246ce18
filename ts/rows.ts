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
  stack?: string;
  retryable: boolean;
  attempt: number;
}

export interface RetryPolicy {
  attempts: number;
  backoff: 'fixed' | 'exponential';
  baseMs: number;
  nonRetryableErrors?: string[];
}

export interface JobDefinitionRow {
  type: string;
  version: number;
  pool: string;
  scopeEntityType: string | null;
  retryPolicy: RetryPolicy;
  timeoutMs: number | null;
  concurrencyKeyTemplate: string | null;
  collisionMode: 'queue' | 'reject' | 'replace';
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

/** Engine JSON object → JobRun (epoch-ms fields become Dates). */
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

export function parseRun(json: string): JobRun {
  return materializeRun(JSON.parse(json) as Raw);
}

export function parseRuns(json: string): JobRun[] {
  return (JSON.parse(json) as Raw[]).map(materializeRun);
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
