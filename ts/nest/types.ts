/**
 * The jobs-domain interfaces the seed family's Nest code is written against
 * (`shared/seed-family`: `IJobOrchestrator`, `IJobRunService`,
 * `IJobStepService`), expressed over jobforge's types. One
 * `JobOrchestrator` instance implements all three (JobsModule provides the
 * three tokens with it), and each is assignable to the family's interface
 * of the same name (`__test__/types/seed-family.ts` checks it).
 */
import type { AnyJobs, JobMap, JobOrchestrator } from '../index';

/**
 * What `JOB_ORCHESTRATOR` provides: the whole orchestrator, i.e. the seed
 * family's `IJobOrchestrator` (`start`, `cancel`, `replay`,
 * `upsertJobRows`) and everything else jobforge has (`waitForRun`, the run
 * and step queries, events, schedules, workers), so one token is enough.
 * The public members of `JobOrchestrator` (a test double may implement it,
 * or `Pick` the part it needs). `Jobs`: the app's job map, which types
 * `start` (`@Inject(JOB_ORCHESTRATOR) jobs: IJobOrchestrator<AppJobs>`).
 */
export type IJobOrchestrator<Jobs extends JobMap = AnyJobs> = {
  [K in keyof JobOrchestrator<Jobs>]: JobOrchestrator<Jobs>[K];
};

/**
 * What `JOB_RUN_SERVICE` provides: the seed family's `IJobRunService`
 * (`listForScope`, `cancelForScope`, `rescheduleForScope`,
 * `countByPoolAndStatus`, `listRecentFailed`, `listJobRuns`) and jobforge's
 * further reads (`findById`, `getRun`, `countRuns`, `listSteps`,
 * `getRunTree`); tenant-gated in multi-tenant mode.
 */
export interface IJobRunService
  extends Pick<
    JobOrchestrator,
    | 'listForScope'
    | 'cancelForScope'
    | 'rescheduleForScope'
    | 'countByPoolAndStatus'
    | 'listRecentFailed'
    | 'listJobRuns'
    | 'findById'
    | 'getRun'
    | 'countRuns'
    | 'listSteps'
    | 'getRunTree'
  > {}

/**
 * What `JOB_STEP_SERVICE` provides: step rows of a run. Unlike the seed's
 * memory step service, `findStep` returns the row whatever its status (the
 * seed only returned completed rows).
 */
export interface IJobStepService extends Pick<JobOrchestrator, 'findStep' | 'recordStep' | 'listSteps'> {}
