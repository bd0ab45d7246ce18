// Where the worker sits in a Nest app's lifecycle. Nest runs global
// modules' (JobsModule's) onApplicationBootstrap first and their
// onModuleDestroy last; the worker must instead start after every module
// has bootstrapped and be drained before any module is destroyed, or an
// in-flight run calls a service its module already closed.
//
// A file of its own: the @JobHandler registry is process-wide, and ava
// runs each file in its own process. Decorators here are TC39 ones (tsx),
// so constructor dependencies are declared with `InjectArgs` as in
// nest.spec.ts.
import 'reflect-metadata';
import test from 'ava';
import { Global, Inject, Injectable, Module, Scope, type OnApplicationBootstrap, type OnModuleDestroy } from '@nestjs/common';
import { REQUEST } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import { JOB_ORCHESTRATOR, JobHandler, JobHandlerBase, JobOrchestrator, JobsModule, JobsWorker } from '../dist/nest';
import type { JobContext } from '../dist/nest';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function InjectArgs(...tokens: (symbol | string | (abstract new (...a: never[]) => unknown))[]) {
  return (cls: object): void => tokens.forEach((token, i) => Inject(token as symbol)(cls, undefined, i));
}

/** What happened, in order, across the app. */
const events: string[] = [];

/** A database client its module disconnects on shutdown. */
@Injectable()
class Db implements OnModuleDestroy {
  open = true;
  onModuleDestroy(): void {
    events.push('db closed');
    this.open = false;
  }
  query(q: string): string {
    if (!this.open) throw new Error('Db is disconnected');
    return q;
  }
}

/** Ready only once its (slow) application bootstrap has finished. */
@Injectable()
class Cache implements OnApplicationBootstrap {
  ready = false;
  async onApplicationBootstrap(): Promise<void> {
    await sleep(150);
    this.ready = true;
    events.push('cache ready');
  }
}

@JobHandler('life.slow', { retry: { attempts: 1, backoff: 'fixed', baseMs: 1 } })
@InjectArgs(Db, Cache)
class SlowQuery extends JobHandlerBase<{ ms: number }> {
  constructor(
    private readonly db: Db,
    private readonly cache: Cache,
  ) {
    super();
  }
  async run(ctx: JobContext<{ ms: number }>) {
    events.push(`run started (cache ready: ${this.cache.ready})`);
    await sleep(ctx.input.ms);
    const row = this.db.query('select 1');
    events.push('run finished');
    return { row, cacheReady: this.cache.ready };
  }
}

@Module({ providers: [Db], exports: [Db] })
class DbModule {}

@Global()
@Module({ providers: [Db], exports: [Db] })
class GlobalDbModule {}

@Module({ providers: [Cache], exports: [Cache] })
class CacheModule {}

/** Enqueues a run from onModuleInit, before anything has bootstrapped. */
@Injectable()
@InjectArgs(JOB_ORCHESTRATOR)
class EarlyStarter {
  static runId: string | null = null;
  constructor(private readonly jobs: JobOrchestrator) {}
  async onModuleInit(): Promise<void> {
    EarlyStarter.runId = (await this.jobs.start('life.slow', { ms: 300 })).id;
  }
}

function featureModule(db: typeof DbModule | typeof GlobalDbModule, early: boolean) {
  @Module({
    imports: [db === DbModule ? DbModule : [], CacheModule].flat(),
    providers: [SlowQuery, ...(early ? [EarlyStarter] : [])],
  })
  class FeatureModule {}
  return FeatureModule;
}

// Each layout puts JobsModule somewhere else in the module graph; in every
// one the in-flight run must finish before the database module closes.
const layouts = [
  { name: 'global JobsModule imported first', jobsFirst: true, global: true, db: DbModule },
  { name: 'global JobsModule imported last', jobsFirst: false, global: true, db: DbModule },
  { name: 'non-global JobsModule', jobsFirst: true, global: false, db: DbModule },
  { name: 'global JobsModule before a @Global() database module', jobsFirst: true, global: true, db: GlobalDbModule },
] as const;

for (const layout of layouts) {
  test.serial(`app.close() drains the worker before any module is destroyed: ${layout.name}`, async (t) => {
    events.length = 0;
    const jobs = JobsModule.forRoot({ global: layout.global, pools: { batch: { concurrency: 2 } } });
    const feature = featureModule(layout.db, false);
    const rest = layout.db === GlobalDbModule ? [GlobalDbModule, feature] : [layout.db, feature];
    const mod = await Test.createTestingModule({ imports: layout.jobsFirst ? [jobs, ...rest] : [...rest, jobs] })
      .setLogger(false as never)
      .compile();
    const app = mod.createNestApplication({ logger: false });
    await app.init();
    const orchestrator = app.get<JobOrchestrator>(JOB_ORCHESTRATOR);
    const run = await orchestrator.start('life.slow', { ms: 300 });
    for (let i = 0; i < 100 && !events.some((e) => e.startsWith('run started')); i++) await sleep(10);
    t.true(app.get(JobsWorker).inFlight === 1, 'the run is in flight when close() starts');
    await app.close();
    const done = await orchestrator.findById(run.id);
    t.is(done?.status, 'completed', `${done?.error?.message ?? ''} (events: ${events.join(', ')})`);
    t.deepEqual(events.slice(-2), ['run finished', 'db closed']);
  });
}

test.serial('the worker starts after every module has bootstrapped (a run enqueued in onModuleInit waits)', async (t) => {
  events.length = 0;
  EarlyStarter.runId = null;
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ pools: { batch: { concurrency: 2 } } }), featureModule(DbModule, true)],
  })
    .setLogger(false as never)
    .compile();
  const app = mod.createNestApplication({ logger: false });
  await app.init();
  const orchestrator = app.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  t.truthy(EarlyStarter.runId);
  const done = await orchestrator.waitForRun(EarlyStarter.runId!, { timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { row: 'select 1', cacheReady: true });
  t.is(events[0], 'cache ready', events.join(', '));
  await app.close();
});

test.serial('a bootstrap that fails in another module leaves the worker stopped', async (t) => {
  @Injectable()
  class Broken implements OnApplicationBootstrap {
    onApplicationBootstrap(): void {
      throw new Error('broken bootstrap');
    }
  }
  @Module({ providers: [Broken] })
  class BrokenModule {}
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ pools: { batch: { concurrency: 2 } } }), featureModule(DbModule, false), BrokenModule],
  })
    .setLogger(false as never)
    .compile();
  const app = mod.createNestApplication({ logger: false });
  await t.throwsAsync(app.init(), { message: 'broken bootstrap' });
  t.false(app.get(JobsWorker).running, 'no worker was started, so nothing keeps the process alive');
  await app.close();
});

test.serial('registering JobsModule twice in one app warns once (two orchestrators, two workers)', async (t) => {
  const warnings: string[] = [];
  const capture = {
    log() {},
    error() {},
    debug() {},
    verbose() {},
    warn(message: unknown, context?: string) {
      if (context === 'JobsModule') warnings.push(String(message));
    },
  };
  @Module({ imports: [JobsModule.forRoot({ worker: false })] })
  class FeatureWithItsOwn {}
  // (Every app provides this file's handler: the @JobHandler registry is process-wide.)
  const handlers = featureModule(DbModule, false);
  const twice = await Test.createTestingModule({ imports: [JobsModule.forRoot({ worker: false }), FeatureWithItsOwn, handlers] })
    .setLogger(capture)
    .compile();
  await twice.init();
  await twice.close();
  t.is(warnings.length, 1, warnings.join('\n'));
  t.regex(warnings[0], /registered 2 times/);

  warnings.length = 0;
  const once = await Test.createTestingModule({ imports: [JobsModule.forRoot({ worker: false }), handlers] })
    .setLogger(capture)
    .compile();
  await once.init();
  await once.close();
  t.deepEqual(warnings, []);
});

test.serial("handlers: 'provided' registers only this app's @JobHandler providers (several apps in one process)", async (t) => {
  // This app does not provide SlowQuery (another app of the process would).
  const strict = await Test.createTestingModule({ imports: [JobsModule.forRoot({ worker: false })] })
    .setLogger(false as never)
    .compile();
  await t.throwsAsync(strict.init(), { name: 'JobHandlerNotProviderError' });
  await strict.close().catch(() => undefined); // Nest's close() rethrows the failed init

  const provided = await Test.createTestingModule({ imports: [JobsModule.forRoot({ worker: false, handlers: 'provided' })] })
    .setLogger(false as never)
    .compile();
  await provided.init();
  const jobs = provided.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  await t.throwsAsync(jobs.start('life.slow', { ms: 1 }), { name: 'JobTypeNotFoundError' });
  await provided.close();

  // With the class provided, 'provided' registers it.
  const withIt = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ worker: false, handlers: 'provided' }), featureModule(DbModule, false)],
  })
    .setLogger(false as never)
    .compile();
  await withIt.init();
  t.is((await withIt.get<JobOrchestrator>(JOB_ORCHESTRATOR).start('life.slow', { ms: 1 })).status, 'pending');
  await withIt.close();

  const bad = await Test.createTestingModule({ imports: [JobsModule.forRoot({ handlers: 'all' as never })] })
    .setLogger(false as never)
    .compile();
  await t.throwsAsync(bad.init(), { name: 'JobInputInvalidError', message: /handlers must be/ });
  await bad.close().catch(() => undefined);
});

// One AppModule (one forRoot result) built into two apps in one process:
// each app has its own worker. The link from the lifecycle module to the
// worker lived in the shared registration, so closing one app stopped the
// other's worker, and initialising one started the other's.
test.serial('two apps built from one module each start and drain their own worker', async (t) => {
  @JobHandler('life.two')
  class Two extends JobHandlerBase<unknown> {
    async run(): Promise<string> {
      return 'ok';
    }
  }
  @Module({ imports: [JobsModule.forRoot({ handlers: 'provided' })], providers: [Two] })
  class AppModule {}
  const build = () => Test.createTestingModule({ imports: [AppModule] }).setLogger(false as never).compile();
  const app1 = await build();
  const app2 = await build();
  await app1.init();
  t.true(app1.get(JobsWorker).running, "app1's init started app1's worker");
  t.false(app2.get(JobsWorker).running, "and not app2's");
  await app2.init();
  t.true(app2.get(JobsWorker).running);
  await app1.close();
  t.false(app1.get(JobsWorker).running);
  t.true(app2.get(JobsWorker).running, "closing app1 left app2's worker running");
  const jobs = app2.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  const run = await jobs.start('life.two', {});
  t.is((await jobs.waitForRun(run.id, { timeoutMs: 5_000 })).status, 'completed');
  await app2.close();
  t.false(app2.get(JobsWorker).running);
});

test.serial('a request-scoped handler and the request-scoped services it uses get the run’s JobContext as REQUEST', async (t) => {
  @Injectable({ scope: Scope.REQUEST })
  @InjectArgs(REQUEST)
  class RunInfo {
    constructor(readonly ctx: JobContext<{ n: number }>) {}
  }
  @Injectable({ scope: Scope.REQUEST })
  @InjectArgs(RunInfo)
  class PerRun {
    static instances = 0;
    constructor(private readonly info: RunInfo) {
      PerRun.instances++;
    }
    async run(ctx: JobContext<{ n: number }>) {
      return { sameRun: this.info.ctx.run.id === ctx.run.id, n: this.info.ctx.input.n };
    }
  }
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ handlers: 'provided', pools: { batch: { concurrency: 2 } } })],
    providers: [RunInfo, PerRun],
  })
    .setLogger(false as never)
    .compile();
  const app = mod.createNestApplication({ logger: false });
  await app.init();
  t.teardown(() => app.close());
  const jobs = app.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  jobs.registerHandler('life.per-run', {}, PerRun);
  const runs = await Promise.all([1, 2].map((n) => jobs.start('life.per-run', { n })));
  for (const [i, r] of runs.entries()) {
    const done = await jobs.waitForRun(r.id, { timeoutMs: 5000 });
    t.is(done.status, 'completed', done.error?.message);
    t.deepEqual(done.output, { sameRun: true, n: i + 1 });
  }
  t.is(PerRun.instances, 2, 'one instance per execution');
});

test.serial("the orchestrator's own messages reach the app's Nest logger (context 'Jobforge')", async (t) => {
  const errors: { message: string; context?: string | undefined }[] = [];
  const capture = {
    log() {},
    warn() {},
    debug() {},
    verbose() {},
    error(message: unknown, ...rest: unknown[]) {
      const context = rest.length > 0 ? rest[rest.length - 1] : undefined;
      errors.push({ message: String(message), context: typeof context === 'string' ? context : undefined });
    },
  };
  const mod = await Test.createTestingModule({ imports: [JobsModule.forRoot({ handlers: 'provided', worker: false })] })
    .setLogger(capture)
    .compile();
  await mod.init();
  t.teardown(() => mod.close());
  const jobs = mod.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  jobs.registerHandler('life.ok', {}, async () => ({}));
  jobs.on('run:completed', () => {
    throw new Error('listener bug');
  });
  const run = await jobs.start('life.ok', {});
  await jobs.claimNext('batch');
  await jobs.tick(run.id);
  for (let i = 0; i < 100 && errors.length === 0; i++) await sleep(10);
  t.true(
    errors.some((e) => e.context === 'Jobforge' && /listener threw/.test(e.message)),
    JSON.stringify(errors),
  );
});
