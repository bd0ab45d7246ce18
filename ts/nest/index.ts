/**
 * `jobforge/nest`: the NestJS binding. Swapping the seed's memory backend for
 * jobforge is one import:
 *
 * ```ts
 * import { JobsModule, JobHandler, JobHandlerBase, JOB_ORCHESTRATOR } from 'jobforge/nest';
 *
 * @JobHandler('email.send', { retry: { attempts: 3, backoff: 'exponential', baseMs: 200 } })
 * export class SendEmail extends JobHandlerBase<{ to: string }> {
 *   constructor(@Inject(Mailer) private readonly mailer: Mailer) { super(); }
 *   async run(ctx: JobContext<{ to: string }>) {
 *     return ctx.step('send', () => this.mailer.send(ctx.input.to));
 *   }
 * }
 *
 * @Module({ imports: [JobsModule.forRoot({ multiTenant: false })], providers: [Mailer, SendEmail] })
 * export class AppModule {}
 * ```
 *
 * Needs `@nestjs/common`, `@nestjs/core`, `reflect-metadata` and `rxjs`
 * (peer dependencies); the core `jobforge` entry point does not.
 */
import 'reflect-metadata';

export {
  JOB_ORCHESTRATOR,
  JOB_RUN_SERVICE,
  JOB_STEP_SERVICE,
  JOBS_MULTI_TENANT,
  JOBS_MODULE_OPTIONS,
} from './tokens';
export type { IJobOrchestrator, IJobRunService, IJobStepService } from './types';
export {
  DuplicateJobHandlerError,
  HandlerRegistry,
  JOB_HANDLER_METADATA,
  JobHandler,
  getJobHandlerMetadata,
  typedJobHandler,
} from './handler-registry';
export type { JobHandlerClass, JobHandlerDefinition } from './handler-registry';
export { JobHandlerNotProviderError, JobPoolNotConfiguredError } from './errors';
export { NestJobOrchestrator } from './nest-orchestrator';
export type { HandlerResolver } from './nest-orchestrator';
export { JobsModule, JobsWorker, moduleRefResolver, nestRunLogger } from './jobs.module';
export type { JobsDashboardOptions } from './dashboard';
export type {
  JobsModuleAsyncOptions,
  JobsModuleOptions,
  JobsModuleRegistration,
  JobsOptionsFactory,
  JobsPoolOptions,
} from './jobs.module';

// The core API a Nest app needs, so one import path is enough.
export { JobHandlerBase, JobOrchestrator, ParentClosePolicy, consoleLogger } from '../index';
export type {
  AnyJobs,
  CancelOptions,
  HandlerInput,
  JobInputOf,
  JobMap,
  JobOrchestratorOptions,
  JobTypeName,
  OptionalInputName,
  StoredInput,
  KeySource,
  PostgresOptions,
  RunEventListener,
  RunEventName,
  WaitForRunOptions,
  WorkerPoolOptions,
  HandlerRegistration,
  JobContext,
  JobDefinitionRow,
  JobHandlerMeta,
  JobLogger,
  JobPoolDef,
  JobRun,
  JobRunError,
  JobRunFailure,
  JobRunPage,
  JobRunRow,
  JobRunStatus,
  JobRunSummary,
  JobStep,
  JobStepRow,
  JobUpsertEntry,
  ListForScopeOptions,
  ListJobRunsOptions,
  PoolStatusCount,
  RecordStepInput,
  RetryPolicy,
  RunTreeNode,
  SpawnChildOptions,
  StartEntry,
  StartOptions,
  StepOptions,
  TenantOptions,
  WorkerHandle,
  WorkerOptions,
} from '../index';
export * from '../errors';
