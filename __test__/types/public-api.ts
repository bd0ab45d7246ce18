/**
 * Compile-time checks of the public types, run by `npm run test:types`
 * (`tsc -p tsconfig.test.json`, which has `strict` and
 * `exactOptionalPropertyTypes` on). Nothing here is executed: a line that
 * should compile fails the step if it does not, and a `@ts-expect-error`
 * fails it when the line below compiles after all.
 */
import { JobHandlerBase, JobOrchestrator } from '../../dist';
import type { AnyJobs, JobContext, JobInputOf, JobRun, JobSchedule } from '../../dist';
import { JobHandler, JobsModule, NestJobOrchestrator, typedJobHandler } from '../../dist/nest';
import type { CancelOptions, IJobOrchestrator, IJobRunService, JobPoolDef, JobUpsertEntry, StartOptions } from '../../dist/nest';

/** An app's job map: job type → input type. */
interface AppJobs {
  'email.send': { to: string; subject: string };
  'report.build': { month: string };
  'cache.sweep': { olderThanDays?: number } | undefined;
  'cache.ping': undefined;
}

export async function typedStart(jobs: JobOrchestrator<AppJobs>): Promise<JobRun[]> {
  const runs = [
    await jobs.start('email.send', { to: 'a@b.c', subject: 'hi' }),
    await jobs.start('report.build', { month: '2026-11' }, { priority: 5, tenantId: undefined }),
    // An input type that admits undefined may be left out (stored as {}).
    await jobs.start('cache.sweep'),
    await jobs.start('cache.sweep', { olderThanDays: 3 }),
  ];
  // @ts-expect-error a job type the map does not name
  await jobs.start('email.sned', { to: 'a@b.c', subject: 'hi' });
  // @ts-expect-error an input field of the wrong type
  await jobs.start('report.build', { month: 11 });
  // @ts-expect-error a required input left out
  await jobs.start('email.send');
  // @ts-expect-error an input missing a required field
  await jobs.start('email.send', { to: 'a@b.c' });
  const dynamic: string = 'email.send';
  // @ts-expect-error a job type only known at run time needs the untyped orchestrator
  await jobs.start(dynamic, {});
  return runs;
}

/** `startMany`'s entries are checked against the map like `start`'s arguments. */
export async function typedStartMany(jobs: JobOrchestrator<AppJobs>, untyped: JobOrchestrator, nest: IJobOrchestrator<AppJobs>): Promise<JobRun[]> {
  const runs: JobRun[] = await jobs.startMany([
    { type: 'email.send', input: { to: 'a@b.c', subject: 'hi' } },
    { type: 'report.build', input: { month: '2026-11' }, opts: { priority: 5, runAt: new Date() } },
    { type: 'cache.sweep' },
    { type: 'cache.ping', input: undefined, opts: { tenantId: null } },
  ]);
  await untyped.startMany([{ type: 'anything', input: { any: 1 } }]);
  await nest.startMany([{ type: 'report.build', input: { month: '2026-12' } }]);
  // @ts-expect-error a job type the map does not name
  await jobs.startMany([{ type: 'email.sned', input: { to: 'a@b.c', subject: 'hi' } }]);
  // @ts-expect-error an input field of the wrong type
  await jobs.startMany([{ type: 'report.build', input: { month: 11 } }]);
  // @ts-expect-error a required input left out
  await jobs.startMany([{ type: 'email.send' }]);
  // @ts-expect-error an option that does not exist
  await jobs.startMany([{ type: 'cache.sweep', opts: { priorty: 1 } }]);
  // @ts-expect-error not an array
  await jobs.startMany({ type: 'cache.sweep' });
  return runs;
}

/** Schedules are checked against the map like `start`. */
export async function typedSchedules(jobs: JobOrchestrator<AppJobs>, untyped: JobOrchestrator): Promise<JobSchedule[]> {
  const out = [
    await jobs.schedule('monthly', { jobType: 'report.build', input: { month: '2026-12' }, cron: '0 0 1 * *' }),
    await jobs.schedule('sweep', { jobType: 'cache.sweep', everyMs: 60_000 }),
    await jobs.schedule('ping', { jobType: 'cache.ping', everyMs: 1_000, tenantId: null }),
    await untyped.schedule('anything', { jobType: 'whatever', input: { any: 1 }, everyMs: 1_000 }),
  ];
  // @ts-expect-error a job type the map does not name
  await jobs.schedule('x', { jobType: 'report.bild', input: { month: '2026-12' }, cron: '@daily' });
  // @ts-expect-error an input of the wrong type
  await jobs.schedule('x', { jobType: 'report.build', input: { month: 12 }, cron: '@daily' });
  // @ts-expect-error a required input left out
  await jobs.schedule('x', { jobType: 'email.send', cron: '@daily' });
  const next: Date | null = out[0]!.nextRunAt;
  void next;
  return out;
}

/** Generic code over the map calls `start` with the map's own types. */
export async function genericCallers(jobs: JobOrchestrator<AppJobs>): Promise<void> {
  async function enqueue<K extends keyof AppJobs>(type: K, input: AppJobs[K]): Promise<JobRun> {
    return jobs.start(type, input, { tags: { source: 'api' } });
  }
  await enqueue('report.build', { month: '2026-11' });
  // @ts-expect-error still checked at the helper's call site
  await enqueue('report.build', { month: 11 });
  class Outbox<J extends object> {
    constructor(private readonly j: JobOrchestrator<J>) {}
    add<K extends keyof J & string>(type: K, input: J[K]): Promise<JobRun> {
      return this.j.start(type, input);
    }
  }
  await new Outbox(jobs).add('email.send', { to: 'a@b.c', subject: 's' });
}

/** A map with an index signature: declared types are checked, the others are not. */
export async function mixedMap(jobs: JobOrchestrator<{ [dynamic: string]: unknown; 'email.send': { to: string } }>): Promise<void> {
  // @ts-expect-error a declared job type keeps its input type
  await jobs.start('email.send', { to: 1 });
  await jobs.start('anything.else', [1, 2]);
  jobs.registerHandler('email.send', {}, async (ctx) => ctx.input.to.toUpperCase());
  jobs.registerHandler<{ n: number }>('anything.else', {}, async (ctx) => ctx.input.n);
}

export function typedHandlers(jobs: JobOrchestrator<AppJobs>): void {
  jobs.registerHandler(
    'email.send',
    // The meta's key functions see the map's input type too.
    { dedupe: { key: (input) => input.to.toLowerCase(), windowMs: 60_000 } },
    async (ctx) => {
      const to: string = ctx.input.to;
      // @ts-expect-error not a field of this job's input
      void ctx.input.cc;
      await ctx.spawnChild('report.build', { month: '2026-11' }, { priority: 1 });
      // @ts-expect-error a child's input is checked against the map as well
      await ctx.spawnChild('report.build', { month: 11 });
      // @ts-expect-error a child of a job type the map does not name
      await ctx.spawnChild('nope', {});
      await ctx.spawnChild('cache.sweep');
      return { to };
    },
  );
  // A left-out input reaches the handler as {}: its type says so.
  jobs.registerHandler('cache.sweep', {}, async (ctx) => {
    const days: number | undefined = ctx.input.olderThanDays;
    return { days };
  });
  jobs.registerHandler('cache.ping', {}, async (ctx) => {
    const empty: Record<string, never> = ctx.input;
    return empty;
  });
  // @ts-expect-error a handler written for another input
  jobs.registerHandler('report.build', {}, async (ctx: JobContext<{ year: number }>) => ctx.input.year);
  // @ts-expect-error registering a job type the map does not name
  jobs.registerHandler('email.sned', {}, async () => null);

  class BuildReport extends JobHandlerBase<AppJobs['report.build'], { rows: number }, AppJobs> {
    async run(ctx: JobContext<AppJobs['report.build'], AppJobs>): Promise<{ rows: number }> {
      await ctx.spawnChild('email.send', { to: 'ops@b.c', subject: ctx.input.month });
      return { rows: 0 };
    }
  }
  jobs.registerHandler('report.build', { pool: 'batch' }, BuildReport);
}

/** Without a map, any string is a job type and inputs are unknown, as before. */
export async function untyped(jobs: JobOrchestrator, type: string): Promise<void> {
  jobs.registerHandler<{ n: number }>('x.fn', {}, async (ctx) => ctx.input.n + 1);
  jobs.registerHandler('x.key', { concurrency: { key: (i: { acct: string }) => i.acct } }, async (ctx) => ctx.input.acct);
  await jobs.start(type, { anything: [1, 2] });
  await jobs.start(type);
  await jobs.start(type, null, { runAt: new Date() }, { tx: 'ignored' });
  const any: JobOrchestrator<AnyJobs> = jobs;
  void any;
  const input: JobInputOf<AnyJobs, 'whatever'> = Symbol('unknown accepts anything');
  void input;
}

/** The Nest binding: the seed's interface, typed by the same map. */
export async function nest(typed: IJobOrchestrator<AppJobs>, plain: IJobOrchestrator): Promise<void> {
  await typed.start('report.build', { month: '2026-11' });
  // @ts-expect-error checked against the map
  await typed.start('report.build', { month: 11 });
  await plain.start('anything', { at: 1 });
  const core: IJobOrchestrator<AppJobs> = new JobOrchestrator<AppJobs>();
  const untypedCore: IJobOrchestrator = new JobOrchestrator();
  const nestTyped: JobOrchestrator<AppJobs> = null as unknown as NestJobOrchestrator<AppJobs>;
  // Code written for the untyped orchestrator takes a typed one, and back.
  const health = (j: JobOrchestrator, s: IJobRunService, i: IJobOrchestrator) => [j, s, i];
  const typedCore = new JobOrchestrator<AppJobs>();
  health(typedCore, typedCore, typedCore);
  const retyped: JobOrchestrator<AppJobs> = new JobOrchestrator();
  void [core, untypedCore, nestTyped, retyped];
}

/**
 * A test double of the seed's part of the interface, written with the
 * natural signature (`IJobOrchestrator` is the whole orchestrator: a double
 * picks what it stands for).
 */
export class FakeJobs implements Pick<IJobOrchestrator<AppJobs>, 'start' | 'cancel' | 'replay' | 'upsertJobRows'> {
  async start<K extends keyof AppJobs>(type: K, input?: AppJobs[K] | null, opts?: StartOptions): Promise<JobRun> {
    void [type, input, opts];
    throw new Error('not in a type test');
  }
  async cancel(runId: string, opts?: CancelOptions): Promise<void> {
    void [runId, opts];
  }
  async replay(runId: string): Promise<JobRun> {
    throw new Error(runId);
  }
  async upsertJobRows(entries: JobUpsertEntry[], poolConfig: ReadonlyMap<string, JobPoolDef>): Promise<{ orphaned: string[] }> {
    void [entries, poolConfig];
    return { orphaned: [] };
  }
}

/** `@JobHandler` checks the class has `run`; `typedJobHandler<AppJobs>()` also checks the type and input. */
export function decorators(): void {
  const AppJobHandler = typedJobHandler<AppJobs>();
  class SendEmail extends JobHandlerBase<AppJobs['email.send'], void, AppJobs> {
    async run(ctx: JobContext<AppJobs['email.send'], AppJobs>): Promise<void> {
      void ctx.input.subject;
    }
  }
  AppJobHandler('email.send', { dedupe: { key: (i) => i.to, windowMs: 60_000 } })(SendEmail);
  // @ts-expect-error a job type the map does not name
  AppJobHandler('email.sned', {});
  // @ts-expect-error the class's run takes another job's input
  AppJobHandler('report.build', {})(SendEmail);
  // @ts-expect-error a key function over a field the input lacks
  AppJobHandler('report.build', { concurrency: { key: (i) => i.to } });
  // @ts-expect-error a class without run(ctx)
  JobHandler('x.norun')(class NoRun {});
  JobHandler<{ n: number }>('x.plain')(
    class Plain {
      async run(ctx: JobContext<{ n: number }>) {
        return ctx.input.n;
      }
    },
  );
}

/**
 * Under `exactOptionalPropertyTypes`, an option may be given as
 * `undefined` (a value read from config that may be absent).
 */
export async function explicitUndefined(jobs: JobOrchestrator, maybe: { date?: Date; n?: number; s?: string }): Promise<void> {
  const o = new JobOrchestrator({
    multiTenant: undefined,
    clock: undefined,
    loggerFactory: undefined,
    logger: undefined,
    retention: { completedMs: maybe.n, failedMs: undefined },
    backend: undefined,
    postgres: undefined,
  });
  void o;
  new JobOrchestrator({ backend: 'postgres', postgres: { url: 'postgres://x', schema: maybe.s, maxConnections: maybe.n, leaseMs: undefined, pollMs: undefined } });
  jobs.registerHandler(
    't',
    {
      pool: maybe.s,
      retry: { attempts: 2, backoff: 'fixed', baseMs: 0, nonRetryableErrors: undefined },
      concurrency: { key: '{{k}}', collisionMode: undefined },
      timeoutMs: maybe.n,
      replayFrom: undefined,
      scope: undefined,
      dedupe: undefined,
    },
    async (ctx) => ctx.step('s', () => 1, { retry: undefined, timeoutMs: maybe.n }),
  );
  await jobs.start('t', {}, {
    scope: undefined,
    pool: maybe.s,
    runAt: maybe.date,
    priority: maybe.n,
    tags: undefined,
    triggerSource: undefined,
    triggerRef: maybe.s,
    parentClosePolicy: undefined,
    parentRunId: maybe.s,
    tenantId: undefined,
  });
  await jobs.cancel('id', { cascade: undefined, reason: maybe.s, tenantId: undefined });
  await jobs.findById('id', { tenantId: undefined });
  await jobs.listForScope('e', 'id', { status: undefined, jobType: maybe.s, limit: maybe.n, offset: undefined, orderBy: undefined });
  await jobs.listJobRuns({ poolId: maybe.s, rootRunId: undefined, status: undefined, since: maybe.date, cursor: maybe.s, limit: maybe.n });
  await jobs.waitForRun('id', { timeoutMs: maybe.n, tenantId: undefined });
  await jobs.recordStep({ jobRunId: 'r', stepId: 's', status: 'completed', kind: undefined, seq: maybe.n, output: undefined, startedAt: maybe.date });
  jobs.startWorker({ pools: undefined, shutdownTimeoutMs: maybe.n });
  JobsModule.forRoot({
    multiTenant: undefined,
    clock: 'manual',
    pools: { batch: { concurrency: 1, queue: maybe.s, reserved: undefined, description: maybe.s } },
    worker: undefined,
    loggerFactory: undefined,
    logger: undefined,
    retention: undefined,
    backend: undefined,
    postgres: undefined,
    handlers: undefined,
    migrate: undefined,
    global: undefined,
  });
}
