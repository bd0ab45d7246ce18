/**
 * The seed family's ports against jobforge's Nest binding, checked at
 * compile time by `npm run test:types` (`tsc -p tsconfig.test.json`: strict,
 * `exactOptionalPropertyTypes`). Nothing here runs.
 *
 * `shared/seed-family/` declares the interfaces a Nest app of that family
 * is written against (`job-orchestrator.protocol.ts`,
 * `job-run-service.protocol.ts`, `job-step-service.protocol.ts`,
 * `job-handler.base.ts`). They import drizzle-orm and @nestjs/common, so they
 * are not imported here: the `Family` namespace below writes them out
 * again, member for member, from those files (the row types are what
 * drizzle's `InferSelectModel` makes of `job-orchestration.schema.ts`).
 * Then:
 *
 * 1. a consumer class written against the family's three interfaces is
 *    handed what jobforge's `JOB_ORCHESTRATOR`, `JOB_RUN_SERVICE` and
 *    `JOB_STEP_SERVICE` provide (the types `jobforge/nest` declares for
 *    them), and also the orchestrator `app.get(JobOrchestrator)` returns;
 * 2. handlers written the family's way (`JobHandlerBase`, `JobContext`,
 *    `@JobHandler(type, meta)`) compile against `jobforge/nest`;
 * 3. `app.get(JobOrchestrator)` needs no type argument, and the
 *    `JOB_ORCHESTRATOR` type is the whole orchestrator.
 */
import type { INestApplicationContext } from '@nestjs/common';
import { Inject, Injectable } from '@nestjs/common';
import { JOB_ORCHESTRATOR, JOB_RUN_SERVICE, JOB_STEP_SERVICE, JobHandler, JobHandlerBase, JobOrchestrator, NestJobOrchestrator } from '../../dist/nest';
import type { IJobOrchestrator, IJobRunService, IJobStepService, JobContext } from '../../dist/nest';

// ─── the family's declarations, written out ─────────────────────────────────

// eslint-disable-next-line @typescript-eslint/no-namespace
namespace Family {
  /** `../events/event-bus.protocol`'s transaction: opaque here. */
  export interface DrizzleTransaction {
    readonly __drizzleTransaction: unique symbol;
  }

  export enum ParentClosePolicy {
    Terminate = 'terminate',
    Cancel = 'cancel',
    Abandon = 'abandon',
  }

  /** `JobRunError` of the schema (`error` jsonb). */
  type JobRunError = { message: string; stack?: string; retryable: boolean; attempt: number };

  /** `JobRunRow` = `InferSelectModel<typeof jobRuns>`. */
  export interface JobRun {
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
    status: 'pending' | 'running' | 'waiting' | 'completed' | 'failed' | 'timed_out' | 'canceled';
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
    // The family's `job_wait_kind` enum reserves only 'signal' for its Phase 3;
    // jobforge's durable waits add the kinds that phase names (README DF3).
    waitKind: 'signal' | 'sleep' | 'token' | 'child' | null;
    resumeToken: string | null;
    waitDeadline: Date | null;
    createdAt: Date;
    updatedAt: Date;
  }

  /** `JobStepRow` = `InferSelectModel<typeof jobSteps>`. */
  export interface JobStep {
    id: string;
    jobRunId: string;
    stepId: string;
    // The family's `job_step_kind` enum is ['task'] with `wait` named by its
    // Phase 3; jobforge's wait steps are kind 'wait' (README DF3).
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

  // job-handler.base.ts

  export interface RetryPolicy {
    attempts: number;
    backoff: 'fixed' | 'exponential';
    baseMs: number;
    nonRetryableErrors?: string[];
  }
  export type JobKeySelector<TInput> = string | ((input: TInput) => string);
  export interface ConcurrencyPolicy<TInput> {
    key: JobKeySelector<TInput>;
    collisionMode: 'queue' | 'reject' | 'replace';
  }
  export interface DedupePolicy<TInput> {
    key: JobKeySelector<TInput>;
    windowMs: number;
  }
  export interface ScopeRef<TInput, TScope extends string = string> {
    entity: TScope;
    from: (input: TInput) => string;
  }
  export interface JobHandlerMeta<TInput> {
    pool?: string;
    scope?: ScopeRef<TInput>;
    retry?: RetryPolicy;
    concurrency?: ConcurrencyPolicy<TInput>;
    dedupe?: DedupePolicy<TInput>;
    timeoutMs?: number;
    replayFrom?: 'scratch' | 'last_step' | 'last_checkpoint';
    /** Typed against the family's event registry, which is not here. */
    triggers?: readonly unknown[];
  }
  export interface StepOptions {
    retry?: RetryPolicy;
    timeoutMs?: number;
  }
  export interface SpawnChildOptions {
    closePolicy?: ParentClosePolicy;
    runAt?: Date;
    priority?: number;
    tags?: Record<string, string>;
  }

  // job-orchestrator.protocol.ts

  export interface StartOptions {
    scope?: { entityType: string; entityId: string };
    pool?: string;
    runAt?: Date;
    priority?: number;
    tags?: Record<string, string>;
    triggerSource?: 'manual' | 'schedule' | 'event' | 'parent';
    triggerRef?: string;
    parentClosePolicy?: ParentClosePolicy;
    parentRunId?: string;
    tenantId?: string | null;
  }
  export interface CancelOptions {
    cascade?: boolean;
    reason?: string;
    tenantId?: string | null;
  }
  export interface JobUpsertEntry {
    type: string;
    meta: JobHandlerMeta<unknown>;
    handlerClass: new (...args: unknown[]) => unknown;
  }
  export interface JobPoolDef {
    queue: string;
    concurrency: number;
    reserved: boolean;
    description?: string;
  }
  export interface IJobOrchestrator {
    start(type: string, input: unknown, opts?: StartOptions, tx?: DrizzleTransaction): Promise<JobRun>;
    cancel(runId: string, opts?: CancelOptions): Promise<void>;
    replay(runId: string): Promise<JobRun>;
    upsertJobRows(entries: JobUpsertEntry[], poolConfig: ReadonlyMap<string, JobPoolDef>): Promise<{ orphaned: string[] }>;
  }

  // job-run-service.protocol.ts

  export interface ListForScopeOptions {
    status?: JobRun['status'] | JobRun['status'][];
    jobType?: string;
    limit?: number;
    offset?: number;
    orderBy?: 'created_at desc' | 'created_at asc' | 'run_at desc' | 'run_at asc';
    tenantId?: string | null;
  }
  export interface CancelForScopeOptions {
    tenantId?: string | null;
  }
  export interface RescheduleForScopeOptions {
    tenantId?: string | null;
  }
  export interface PoolStatusCount {
    pool: string;
    status: JobRun['status'];
    count: number;
  }
  export interface ListJobRunsQuery {
    poolId?: string;
    rootRunId?: string;
    status?: JobRun['status'];
    since?: Date;
    cursor?: string;
    limit?: number;
    tenantId?: string | null;
  }
  export interface JobRunSummary {
    runId: string;
    rootRunId: string;
    parentRunId: string | null;
    triggerSource: 'manual' | 'schedule' | 'event' | 'parent';
    triggerRef: string | null;
    jobType: string;
    pool: string;
    status: JobRun['status'];
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
  export interface JobRunPage {
    items: JobRunSummary[];
    nextCursor: string | null;
  }
  export interface JobRunFailure {
    runId: string;
    jobType: string;
    pool: string;
    scopeEntityType: string | null;
    scopeEntityId: string | null;
    tenantId: string | null;
    attempts: number;
    errorMessage: string | null;
    failedAt: Date;
    createdAt: Date;
  }
  export interface IJobRunService {
    listForScope(entityType: string, entityId: string, opts?: ListForScopeOptions): Promise<JobRun[]>;
    cancelForScope(entityType: string, entityId: string, opts?: CancelForScopeOptions): Promise<void>;
    rescheduleForScope(entityType: string, entityId: string, newRunAt: Date, opts?: RescheduleForScopeOptions): Promise<void>;
    countByPoolAndStatus(tenantId?: string | null): Promise<PoolStatusCount[]>;
    listRecentFailed(limit: number, tenantId?: string | null): Promise<JobRunFailure[]>;
    listJobRuns(query?: ListJobRunsQuery): Promise<JobRunPage>;
  }

  // job-step-service.protocol.ts

  export interface RecordStepInput {
    jobRunId: string;
    stepId: string;
    kind: 'task';
    seq: number;
    input?: unknown;
    output?: unknown;
    error?: { message: string; stack?: string; retryable: boolean; attempt: number };
    status: 'pending' | 'running' | 'completed' | 'failed' | 'skipped';
    startedAt?: Date;
    finishedAt?: Date;
    attempts?: number;
  }
  export interface IJobStepService {
    recordStep(input: RecordStepInput): Promise<JobStep>;
    findStep(runId: string, stepId: string): Promise<JobStep | null>;
  }
}

// ─── 1. a consumer written against the family's ports ───────────────────────

interface OnboardingInput {
  accountId: string;
}

/** A use case as the family writes one: it knows only the three ports. */
@Injectable()
export class AccountJobs {
  constructor(
    @Inject(JOB_ORCHESTRATOR) private readonly jobs: Family.IJobOrchestrator,
    @Inject(JOB_RUN_SERVICE) private readonly runs: Family.IJobRunService,
    @Inject(JOB_STEP_SERVICE) private readonly steps: Family.IJobStepService,
  ) {}

  async onboard(accountId: string, tx?: Family.DrizzleTransaction): Promise<Family.JobRun> {
    const opts: Family.StartOptions = {
      scope: { entityType: 'account', entityId: accountId },
      parentClosePolicy: Family.ParentClosePolicy.Cancel,
      triggerSource: 'event',
      tenantId: null,
    };
    const run = await this.jobs.start('onboarding', { accountId } satisfies OnboardingInput, opts, tx);
    const again: Family.JobRun = await this.jobs.replay(run.id);
    await this.jobs.cancel(again.id, { cascade: true, reason: 'closed', tenantId: null });
    const handlerClass = class {} as new (...args: unknown[]) => unknown;
    const pools: ReadonlyMap<string, Family.JobPoolDef> = new Map([['batch', { queue: 'batch', concurrency: 5, reserved: false }]]);
    const { orphaned } = await this.jobs.upsertJobRows([{ type: 'onboarding', meta: { pool: 'batch' }, handlerClass }], pools);
    void orphaned;
    return run;
  }

  async dashboard(accountId: string): Promise<string[]> {
    const forScope: Family.JobRun[] = await this.runs.listForScope('account', accountId, {
      status: ['pending', 'running'],
      orderBy: 'run_at asc',
      limit: 20,
      offset: 0,
      tenantId: null,
    });
    await this.runs.cancelForScope('account', accountId, { tenantId: null });
    await this.runs.rescheduleForScope('account', accountId, new Date(), {});
    const counts: Family.PoolStatusCount[] = await this.runs.countByPoolAndStatus(null);
    const failed: Family.JobRunFailure[] = await this.runs.listRecentFailed(10, null);
    const page: Family.JobRunPage = await this.runs.listJobRuns({ poolId: 'batch', status: 'failed', since: new Date(0), limit: 50 });
    const next: Family.JobRunPage = await this.runs.listJobRuns(page.nextCursor === null ? {} : { cursor: page.nextCursor });
    const first: Family.JobRunSummary | undefined = next.items[0];
    const step: Family.JobStep | null = await this.steps.findStep(forScope[0]!.id, 'pull');
    const recorded: Family.JobStep = await this.steps.recordStep({
      jobRunId: forScope[0]!.id,
      stepId: 'pull',
      kind: 'task',
      seq: 1,
      status: 'failed',
      error: { message: 'x', retryable: true, attempt: 1 },
      startedAt: new Date(),
    });
    return [
      String(counts[0]?.count),
      failed[0]?.failedAt.toISOString() ?? '',
      failed[0]?.errorMessage ?? '',
      first?.runId ?? '',
      first?.triggerSource ?? '',
      String(step?.seq),
      recorded.status,
    ];
  }
}

/** What JobsModule provides under the three tokens, handed to the family's consumer. */
export function handedTheTokens(
  orchestrator: IJobOrchestrator,
  runs: IJobRunService,
  steps: IJobStepService,
): AccountJobs {
  return new AccountJobs(orchestrator, runs, steps);
}

/** The orchestrator itself (one object behind all three tokens) stands for each port. */
export function handedTheOrchestrator(app: INestApplicationContext): AccountJobs {
  const jobs = app.get(JobOrchestrator);
  return new AccountJobs(jobs, jobs, jobs);
}

/** jobforge's own results keep their extras: the counts of the scoped bulk operations. */
export async function countsStay(runs: IJobRunService): Promise<number> {
  const canceled: number = await runs.cancelForScope('account', 'a1', { tenantId: null });
  const moved: number = await runs.rescheduleForScope('account', 'a1', new Date());
  const total: number = await runs.countRuns(null);
  const row = await runs.getRun('id', null);
  return canceled + moved + total + (row === null ? 0 : row.attempts);
}

// ─── 2. handlers written the family's way ──────────────────────────────────

const onboardingMeta: Family.JobHandlerMeta<OnboardingInput> = {
  pool: 'batch',
  scope: { entity: 'account', from: (input) => input.accountId },
  retry: { attempts: 3, backoff: 'exponential', baseMs: 1_000, nonRetryableErrors: ['ValidationError'] },
  concurrency: { key: (input) => `account:${input.accountId}`, collisionMode: 'queue' },
  dedupe: { key: (input) => `onboarding:${input.accountId}`, windowMs: 24 * 60 * 60 * 1000 },
  timeoutMs: 60_000,
  replayFrom: 'last_checkpoint',
};

/** The family's own example (ADR-022), against `jobforge/nest`. */
@JobHandler<OnboardingInput>('onboarding', onboardingMeta)
@Injectable()
export class OnboardingHandler extends JobHandlerBase<OnboardingInput, { emailCount: number }> {
  async run(ctx: JobContext<OnboardingInput>): Promise<{ emailCount: number }> {
    const stepOpts: Family.StepOptions = { retry: { attempts: 2, backoff: 'fixed', baseMs: 10 }, timeoutMs: 5_000 };
    const emails = await ctx.step('pull-emails', async () => [`${ctx.input.accountId}@example.com`], stepOpts);
    const childOpts: Family.SpawnChildOptions = { closePolicy: Family.ParentClosePolicy.Abandon, runAt: new Date(), priority: 1, tags: { a: 'b' } };
    const child = await ctx.spawnChild('enrich', { accountId: ctx.input.accountId }, childOpts);
    const run: Family.JobRun = ctx.run;
    ctx.logger.log(`run ${run.id} spawned ${child.id}`);
    ctx.logger.warn('warn');
    ctx.logger.error('error');
    ctx.logger.debug('debug');
    return { emailCount: emails.length };
  }
}

/** Meta written inline with the family's `triggers` list (accepted, ignored at run time). */
@JobHandler<{ orderId: string }>('notify', { pool: 'batch', triggers: [] })
@Injectable()
export class NotifyHandler extends JobHandlerBase<{ orderId: string }, void> {
  async run(): Promise<void> {}
}

/** A string key template and no meta fields beyond the pool, as the family also writes them. */
@JobHandler<{ orderId: string }>('enrich', { pool: 'batch', concurrency: { key: 'order:{{orderId}}', collisionMode: 'reject' } })
export class EnrichHandler extends JobHandlerBase<{ orderId: string }> {
  async run(ctx: JobContext<{ orderId: string }>): Promise<unknown> {
    return ctx.step('noop', async () => ctx.input.orderId);
  }
}

// ─── 3. Nest typing: no type argument, one token for everything ─────────────

interface AppJobs {
  'invoice.send': { invoiceId: string };
}

export async function nestTyping(app: INestApplicationContext): Promise<void> {
  // Without a type argument: the untyped orchestrator (any job type, any input).
  const jobs = app.get(JobOrchestrator);
  await jobs.start('x', { any: 1 });
  await jobs.start('x');
  const nest = app.get(NestJobOrchestrator);
  await nest.start('y', {});
  // Typed by the app's map where the app says so.
  const typed: JobOrchestrator<AppJobs> = app.get(JobOrchestrator);
  await typed.start('invoice.send', { invoiceId: 'i1' });
  // @ts-expect-error still checked against the map
  await typed.start('invoice.sned', { invoiceId: 'i1' });

  // The JOB_ORCHESTRATOR type is the whole orchestrator...
  const all: IJobOrchestrator = app.get<IJobOrchestrator>(JOB_ORCHESTRATOR);
  const done = await all.waitForRun('id', { timeoutMs: 1_000 });
  const page = await all.listJobRuns({ status: ['pending', 'running'] });
  const failures = await all.listRecentFailed(5);
  const count: number = await all.countRuns();
  all.on('run:failed', (run) => void run.error?.message);
  await all.schedule('nightly', { jobType: 'x', cron: '@daily' });
  const worker = all.startWorker({ pools: { batch: { concurrency: 1 } } });
  await worker.stop();
  void [done, page.items, failures, count];
  // ...the orchestrator (and a typed one) is one, and it is still the family's narrower port.
  const fromClass: IJobOrchestrator = jobs;
  const typedPort: IJobOrchestrator<AppJobs> = typed;
  const narrow: Family.IJobOrchestrator = all;
  void [fromClass, typedPort, narrow];
}
