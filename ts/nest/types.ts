/**
 * The jobs-domain interfaces the seed's Nest code is written against,
 * expressed over jobforge's types. One `JobOrchestrator` instance implements
 * all three services (JobsModule provides the three tokens with it).
 */
import type {
  AnyJobs,
  CancelOptions,
  JobOrchestrator,
  JobPoolDef,
  JobRun,
  JobTypeName,
  JobUpsertEntry,
  OptionalInputName,
  StartOptions,
  TenantOptions,
} from '../index';

/**
 * What the seed's `MemoryJobOrchestrator` implements (`job-orchestrator.protocol`).
 * `Jobs`: the app's job map, which types `start`
 * (`@Inject(JOB_ORCHESTRATOR) jobs: IJobOrchestrator<AppJobs>`).
 */
export interface IJobOrchestrator<Jobs extends object = AnyJobs> {
  start<K extends JobTypeName<Jobs>>(type: K, input: Jobs[K], opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  start<K extends OptionalInputName<Jobs>>(type: K, input?: Jobs[K] | null, opts?: StartOptions, tx?: unknown): Promise<JobRun>;
  cancel(runId: string, opts?: CancelOptions): Promise<void>;
  /** Multi-tenant: `tenantId` required, as for `cancel` (another tenant's run: `JobRunNotFoundError`). */
  replay(runId: string, opts?: TenantOptions): Promise<JobRun>;
  upsertJobRows(
    entries: JobUpsertEntry[],
    poolConfig: ReadonlyMap<string, JobPoolDef>,
  ): Promise<{ orphaned: string[] }>;
}

/** Run queries (CONTRACT.md "Queries (run service)"); tenant-gated in multi-tenant mode. */
export interface IJobRunService
  extends Pick<
    JobOrchestrator,
    | 'findById'
    | 'listSteps'
    | 'listForScope'
    | 'cancelForScope'
    | 'rescheduleForScope'
    | 'countByPoolAndStatus'
    | 'listRecentFailed'
    | 'listJobRuns'
    | 'getRunTree'
  > {}

/**
 * Step rows of a run. Unlike the seed's memory step service, `findStep`
 * returns the row whatever its status (the seed only returned completed rows).
 */
export interface IJobStepService extends Pick<JobOrchestrator, 'findStep' | 'recordStep' | 'listSteps'> {}
