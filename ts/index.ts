/**
 * jobforge: a durable job orchestrator whose engine is Rust.
 *
 * ```ts
 * const { JobOrchestrator } = require('jobforge');
 * const jobs = new JobOrchestrator();
 * jobs.registerHandler('email.send', { retry: { attempts: 3, backoff: 'exponential', baseMs: 100 } },
 *   async (ctx) => ctx.step('send', () => mailer.send(ctx.input)));
 * const run = await jobs.start('email.send', { to: 'a@b.c' });
 * ```
 */
export { JobOrchestrator } from './orchestrator';
export type { AnyJobs, HandlerInput, JobInputOf, JobMap, JobTypeName, OptionalInputName, StoredInput } from './typed';
export type {
  CancelOptions,
  HandlerRegistration,
  JobOrchestratorOptions,
  JobPoolDef,
  JobUpsertEntry,
  ListForScopeOptions,
  PostgresOptions,
  ListJobRunsOptions,
  ListRunEventsOptions,
  PoolStatusCount,
  RecordStepInput,
  RunEventListener,
  RunEventName,
  RunTreeNode,
  ScheduleOptions,
  SignalResult,
  ResumeOptions,
  ResumeResult,
  StartEntry,
  StartOptions,
  TenantOptions,
  TypedScheduleOptions,
  WaitForRunOptions,
  WorkerHandle,
  WorkerOptions,
  WorkerPoolOptions,
} from './orchestrator';
export { JobHandlerBase, ParentClosePolicy, consoleLogger } from './handler';
export type {
  JobContext,
  JobHandler,
  JobHandlerMeta,
  JobLogger,
  KeySource,
  RetryPolicy,
  InvokeOptions,
  SpawnChildOptions,
  StepOptions,
  WaitForSignalOptions,
  WaitForTokenOptions,
} from './handler';
export type {
  JobDefinitionRow,
  JobRun,
  JobRunError,
  JobRunFailure,
  JobRunEvent,
  JobRunEventPage,
  JobRunEventType,
  JobThroughputMinute,
  JobRunPage,
  JobRunRow,
  JobRunStatus,
  JobRunSummary,
  JobSchedule,
  JobStep,
  JobStepRow,
  JobWaitKind,
} from './rows';
export * from './errors';
export { createDashboard, isLocalRequest } from './dashboard';
export type { DashboardAction, DashboardAuthorize, DashboardHandler, DashboardOptions } from './dashboard';
