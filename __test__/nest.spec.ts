// The NestJS binding (`jobforge/nest`): JobsModule with DI-resolved
// `@JobHandler` classes, the worker it runs, step memoization, the
// multi-tenant flag, forRootAsync, and draining on app.close().
//
// The tests run through tsx (esbuild), which applies the root tsconfig only
// to ts/: here decorators are TC39 ones, so there are no parameter
// decorators and no `design:paramtypes`. Nest's class decorators work as
// they are; constructor dependencies are declared with `@InjectArgs(...)`,
// which records exactly what `@Inject(token)` on each parameter would.
//
// Every @JobHandler class of this file is in the process-wide registry, so
// every app below imports `HandlersModule`, which provides all of them.
import 'reflect-metadata';
import test from 'ava';
import type { ExecutionContext } from 'ava';
import { Inject, Injectable, Logger, Module, type LoggerService } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import {
  HandlerRegistry,
  JOB_ORCHESTRATOR,
  JOB_RUN_SERVICE,
  JOB_STEP_SERVICE,
  JOBS_MULTI_TENANT,
  JobHandler,
  JobHandlerBase,
  JobOrchestrator,
  JobPoolNotConfiguredError,
  JobforgeError,
  JobInputInvalidError,
  JobsModule,
  JobsWorker,
  MissingTenantIdError,
  NestJobOrchestrator,
} from '../dist/nest';
import type {
  IJobOrchestrator,
  IJobRunService,
  IJobStepService,
  JobContext,
  JobsModuleOptions,
  JobsOptionsFactory,
} from '../dist/nest';

import { postgresOnly } from './backends';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** `@Inject(tokens[i])` on constructor parameter i, as a class decorator. */
function InjectArgs(...tokens: (symbol | string | (abstract new (...a: never[]) => unknown))[]) {
  return (cls: object): void => tokens.forEach((token, i) => Inject(token as symbol)(cls, undefined, i));
}

// ── services and handlers ────────────────────────────────────────────

@Injectable()
class GreetingService {
  readonly calls: string[] = [];
  greet(name: string): string {
    this.calls.push(name);
    return `hello ${name}`;
  }
}

/** Counts how often each step body ran (per app: every app has its own instance). */
@Injectable()
class Counter {
  readonly counts = new Map<string, number>();
  inc(key: string): number {
    const n = (this.counts.get(key) ?? 0) + 1;
    this.counts.set(key, n);
    return n;
  }
}

/** Lets a test hold a handler until it says so. */
@Injectable()
class Gate {
  started!: Promise<string>;
  private markStarted!: (runId: string) => void;
  constructor() {
    this.started = new Promise((r) => (this.markStarted = r));
  }
  enter(runId: string): void {
    this.markStarted(runId);
  }
}

const seenLoggers: { runId: string; logger: unknown }[] = [];

@JobHandler('nest.greet', { pool: 'batch' })
@InjectArgs(GreetingService)
class GreetHandler extends JobHandlerBase<{ name: string }> {
  static instances = new Set<GreetHandler>();
  constructor(private readonly greeting: GreetingService) {
    super();
    GreetHandler.instances.add(this);
  }
  async run(ctx: JobContext<{ name: string }>) {
    seenLoggers.push({ runId: ctx.run.id, logger: ctx.logger });
    ctx.logger.log(`greeting ${ctx.input.name}`);
    const text = await ctx.step('greet', async () => this.greeting.greet(ctx.input.name));
    return { text, self: GreetHandler.instances.size };
  }
}

@JobHandler('nest.memo', { retry: { attempts: 2, backoff: 'fixed', baseMs: 0 } })
@InjectArgs(Counter)
class MemoHandler extends JobHandlerBase<Record<string, never>> {
  constructor(private readonly counter: Counter) {
    super();
  }
  async run(ctx: JobContext<Record<string, never>>) {
    const a = await ctx.step('a', async () => ({ n: this.counter.inc('a') }));
    const b = await ctx.step('b', async () => {
      const n = this.counter.inc('b');
      if (n === 1) throw new Error('b fails on its first call');
      return { n };
    });
    return { a: a.n, b: b.n };
  }
}

@JobHandler('nest.parent')
class ParentHandler extends JobHandlerBase<{ label: string }> {
  async run(ctx: JobContext<{ label: string }>) {
    const child = await ctx.spawnChild('nest.child', { label: ctx.input.label });
    return { childId: child.id, tenant: ctx.run.tenantId };
  }
}

@JobHandler('nest.child')
@InjectArgs(Counter)
class ChildHandler extends JobHandlerBase<{ label: string }> {
  constructor(private readonly counter: Counter) {
    super();
  }
  async run(ctx: JobContext<{ label: string }>) {
    return { label: ctx.input.label, tenant: ctx.run.tenantId, n: this.counter.inc('child') };
  }
}

@JobHandler('nest.report', { pool: 'reports' })
class ReportHandler extends JobHandlerBase<{ id: number }> {
  async run(ctx: JobContext<{ id: number }>) {
    return { pool: ctx.run.pool, id: ctx.input.id };
  }
}

@JobHandler('nest.slow')
@InjectArgs(Gate, Counter)
class SlowHandler extends JobHandlerBase<{ ms: number }> {
  constructor(
    private readonly gate: Gate,
    private readonly counter: Counter,
  ) {
    super();
  }
  async run(ctx: JobContext<{ ms: number }>) {
    return ctx.step('work', async () => {
      this.gate.enter(ctx.run.id);
      await sleep(ctx.input.ms);
      return { finished: this.counter.inc('slow') };
    });
  }
}

const HANDLERS = [GreetHandler, MemoHandler, ParentHandler, ChildHandler, ReportHandler, SlowHandler];

@Module({ providers: [GreetingService, Counter, Gate, ...HANDLERS] })
class HandlersModule {}

/** Pools for apps that declare them: every pool a handler of this file uses. */
const ALL_POOLS = { batch: { concurrency: 4 }, reports: { concurrency: 1 } };

// ── helpers ──────────────────────────────────────────────────────────

/** Records what Nest loggers print, with their context. */
class CaptureLogger implements LoggerService {
  readonly lines: { level: string; message: unknown; context?: string | undefined }[] = [];
  private push(level: string, message: unknown, rest: unknown[]) {
    const ctx = rest.length > 0 ? rest[rest.length - 1] : undefined;
    this.lines.push({ level, message, context: typeof ctx === 'string' ? ctx : undefined });
  }
  log(message: unknown, ...rest: unknown[]) {
    this.push('log', message, rest);
  }
  warn(message: unknown, ...rest: unknown[]) {
    this.push('warn', message, rest);
  }
  error(message: unknown, ...rest: unknown[]) {
    this.push('error', message, rest);
  }
  debug(message: unknown, ...rest: unknown[]) {
    this.push('debug', message, rest);
  }
}

async function boot(
  t: ExecutionContext,
  jobs: ReturnType<typeof JobsModule.forRoot>,
  logger: LoggerService | false = false,
  extraImports: unknown[] = [],
): Promise<TestingModule> {
  const mod = await Test.createTestingModule({ imports: [jobs, HandlersModule, ...(extraImports as never[])] })
    .setLogger(logger === false ? new CaptureLogger() : logger)
    .compile();
  await mod.init();
  t.teardown(() => mod.close());
  return mod;
}

const orch = (m: TestingModule) => m.get<JobOrchestrator>(JOB_ORCHESTRATOR);

// ── tests ────────────────────────────────────────────────────────────

// The same module on PostgreSQL: forRoot({ backend: 'postgres' }) migrates
// on init, runs DI-resolved handlers through the Postgres worker, and
// app.close() drains the worker and closes the pool (needs a database).
postgresOnly('JobsModule.forRoot({ backend: "postgres" }) migrates, runs DI handlers, closes on app.close()', async (t, make) => {
  const { postgres } = make.options();
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ backend: 'postgres', postgres, pools: ALL_POOLS }), HandlersModule],
  })
    .setLogger(new CaptureLogger())
    .compile();
  const app = mod.createNestApplication();
  await app.init();
  const jobs = app.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  t.is(jobs.backend, 'postgres');
  const run = await jobs.start('nest.greet', { name: 'pg' });
  const done = await jobs.waitForRun(run.id, { timeoutMs: 10_000 });
  t.is(done.status, 'completed');
  t.is(done.output?.text, 'hello pg');
  t.deepEqual(
    (await jobs.listSteps(run.id)).map((s) => [s.stepId, s.status, s.output]),
    [['greet', 'completed', 'hello pg']],
  );
  // The definitions were stored in the database by module init.
  t.is((await jobs.getDefinition('nest.report'))?.pool, 'reports');
  await app.close();
  t.false(app.get(JobsWorker).running);
});

// Serial: Nest's logger override is process-wide.
test.serial('a @JobHandler class with an injected service runs through the worker', async (t) => {
  const logger = new CaptureLogger();
  const app = await boot(t, JobsModule.forRoot({ worker: { pools: { batch: { concurrency: 2 } } } }), logger);
  const jobs = orch(app);
  t.true(jobs instanceof NestJobOrchestrator);
  t.true(app.get(JobsWorker).running);

  const run = await jobs.start('nest.greet', { name: 'ada' });
  const done = await jobs.waitForRun(run.id, { timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.is(done.output?.text, 'hello ada');
  // The service the handler used is the app's provider instance.
  t.deepEqual(app.get(GreetingService).calls, ['ada']);
  // The handler instance is the app's singleton provider.
  t.true(GreetHandler.instances.has(app.get(GreetHandler)));
  const steps = await jobs.listSteps(run.id);
  t.deepEqual(
    steps.map((s) => [s.stepId, s.status, s.output]),
    [['greet', 'completed', 'hello ada']],
  );

  // ctx.logger is a Nest Logger named after the run, going through the app's logger.
  const seen = seenLoggers.find((s) => s.runId === run.id);
  t.true(seen?.logger instanceof Logger);
  t.true(
    logger.lines.some((l) => l.message === 'greeting ada' && l.context === `JobRun:${run.id}`),
    JSON.stringify(logger.lines),
  );

  // The registration still exposes the class, not the DI runner.
  t.is(jobs.getHandlerRegistration('nest.greet')?.handlerClass, GreetHandler);
  t.is(app.get(HandlerRegistry).get('nest.greet')?.handlerClass, GreetHandler);
  t.deepEqual(
    app
      .get(HandlerRegistry)
      .getAll()
      .map((d) => d.type)
      .sort(),
    ['nest.child', 'nest.greet', 'nest.memo', 'nest.parent', 'nest.report', 'nest.slow'],
  );
  // Definitions were upserted from the decorator's meta.
  t.is((await jobs.getDefinition('nest.memo'))?.retryPolicy.attempts, 2);
  t.is((await jobs.getDefinition('nest.report'))?.pool, 'reports');
});

test('the seed tokens resolve one orchestrator that serves the run and step services', async (t) => {
  const app = await boot(t, JobsModule.forRoot({ worker: false }));
  const o = app.get<IJobOrchestrator>(JOB_ORCHESTRATOR);
  t.is(app.get<IJobRunService>(JOB_RUN_SERVICE), o as never);
  t.is(app.get<IJobStepService>(JOB_STEP_SERVICE), o as never);
  t.is(app.get(JobOrchestrator), o as never);
  // Same registry keys as the seed's tokens.
  t.is(JOB_ORCHESTRATOR, Symbol.for('@pattern-stack/codegen.jobs.orchestrator'));
  t.is(JOB_RUN_SERVICE, Symbol.for('@pattern-stack/codegen.jobs.run-service'));
  t.is(JOB_STEP_SERVICE, Symbol.for('@pattern-stack/codegen.jobs.step-service'));
  t.is(JOBS_MULTI_TENANT, Symbol.for('@pattern-stack/codegen.jobs.multi-tenant'));
  t.is(app.get(JOBS_MULTI_TENANT), false);

  const runs = app.get<IJobRunService>(JOB_RUN_SERVICE);
  const stepsSvc = app.get<IJobStepService>(JOB_STEP_SERVICE);
  const run = await o.start('nest.greet', { name: 'x' }, { scope: { entityType: 'user', entityId: 'u1' } });
  t.is((await runs.findById(run.id))?.status, 'pending');
  t.deepEqual((await runs.listForScope('user', 'u1')).map((r) => r.id), [run.id]);
  await stepsSvc.recordStep({ jobRunId: run.id, stepId: 'manual', status: 'completed', output: { ok: 1 } });
  t.deepEqual((await stepsSvc.findStep(run.id, 'manual'))?.output, { ok: 1 });
  // worker: false → nothing executes it.
  await sleep(50);
  t.is((await runs.findById(run.id))?.status, 'pending');
  t.false(app.get(JobsWorker).running);
});

test('a completed step is memoized across two ticks (retry after a failing step)', async (t) => {
  const app = await boot(t, JobsModule.forRoot({ worker: false }));
  const jobs = orch(app);
  const counter = app.get(Counter);
  const run = await jobs.start('nest.memo', {});

  t.is((await jobs.claimNext('batch'))?.id, run.id);
  await jobs.tick(run.id);
  const afterFirst = await jobs.findById(run.id);
  t.is(afterFirst?.status, 'pending'); // retrying
  t.is(afterFirst?.attempts, 1);
  t.deepEqual(
    (await jobs.listSteps(run.id)).map((s) => [s.stepId, s.status]),
    [
      ['a', 'completed'],
      ['b', 'failed'],
    ],
  );

  t.is((await jobs.claimNext('batch'))?.id, run.id);
  await jobs.tick(run.id);
  const done = await jobs.findById(run.id);
  t.is(done?.status, 'completed');
  t.deepEqual(done?.output, { a: 1, b: 2 });
  t.is(counter.counts.get('a'), 1, 'step a ran once: the second tick used its stored output');
  t.is(counter.counts.get('b'), 2);
  const steps = await jobs.listSteps(run.id);
  t.deepEqual(
    steps.map((s) => [s.stepId, s.status, s.attempts]),
    [
      ['a', 'completed', 1],
      ['b', 'completed', 2],
    ],
  );
});

test('multiTenant: true reaches the token, the gate, the worker and child runs', async (t) => {
  const app = await boot(t, JobsModule.forRoot({ multiTenant: true, worker: { pools: { batch: { concurrency: 2 } } } }));
  const jobs = orch(app);
  t.true(app.get(JOBS_MULTI_TENANT));
  t.true(jobs.multiTenant);

  await t.throwsAsync(() => jobs.start('nest.parent', { label: 'x' }), { instanceOf: MissingTenantIdError });

  const run = await jobs.start('nest.parent', { label: 'p' }, { tenantId: 'acme' });
  t.is(run.tenantId, 'acme');
  const done = await jobs.waitForRun(run.id, { tenantId: 'acme', timeoutMs: 5000 });
  t.is(done.status, 'completed');
  const childId = done.output?.childId as string;
  const child = await jobs.waitForRun(childId, { tenantId: 'acme', timeoutMs: 5000 });
  t.is(child.status, 'completed');
  t.is(child.tenantId, 'acme');
  t.deepEqual(child.output, { label: 'p', tenant: 'acme', n: 1 });
  // Another tenant sees nothing.
  t.is(await jobs.findById(run.id, { tenantId: 'globex' }), null);
  await t.throwsAsync(() => jobs.findById(run.id), { instanceOf: MissingTenantIdError });
});

const APP_CONFIG = Symbol('APP_CONFIG');
interface AppConfig {
  tenancy: 'single' | 'multi';
  reportConcurrency: number;
}

test('forRootAsync builds the options from an injected config provider', async (t) => {
  const config: AppConfig = { tenancy: 'multi', reportConcurrency: 1 };
  @Module({ providers: [{ provide: APP_CONFIG, useValue: config }], exports: [APP_CONFIG] })
  class ConfigModule {}

  const factoryArgs: unknown[] = [];
  const app = await boot(
    t,
    JobsModule.forRootAsync({
      imports: [ConfigModule],
      inject: [APP_CONFIG],
      useFactory: async (cfg: AppConfig): Promise<JobsModuleOptions> => {
        factoryArgs.push(cfg);
        await sleep(1);
        return {
          multiTenant: cfg.tenancy === 'multi',
          pools: { ...ALL_POOLS, reports: { concurrency: cfg.reportConcurrency } },
        };
      },
    }),
  );
  t.deepEqual(factoryArgs, [config]);
  const jobs = orch(app);
  t.true(app.get(JOBS_MULTI_TENANT));
  t.true(jobs.multiTenant);
  // The 'reports' pool exists only because the config declared it.
  const run = await jobs.start('nest.report', { id: 7 }, { tenantId: null });
  const done = await jobs.waitForRun(run.id, { tenantId: null, timeoutMs: 5000 });
  t.is(done.status, 'completed');
  t.deepEqual(done.output, { pool: 'reports', id: 7 });
});

test('forRootAsync takes the options from a class (useClass) or an existing provider (useExisting)', async (t) => {
  const config: AppConfig = { tenancy: 'multi', reportConcurrency: 1 };
  @Module({ providers: [{ provide: APP_CONFIG, useValue: config }], exports: [APP_CONFIG] })
  class ConfigModule {}

  // useClass: JobsModule provides the class, with its own injected dependencies.
  @Injectable()
  @InjectArgs(APP_CONFIG)
  class JobsConfig implements JobsOptionsFactory {
    static made = 0;
    constructor(private readonly cfg: AppConfig) {
      JobsConfig.made++;
    }
    createJobsOptions(): JobsModuleOptions {
      return { multiTenant: this.cfg.tenancy === 'multi', pools: ALL_POOLS, worker: false };
    }
  }
  const a = await boot(t, JobsModule.forRootAsync({ imports: [ConfigModule], useClass: JobsConfig }));
  t.is(JobsConfig.made, 1);
  t.true(orch(a).multiTenant);
  t.false(a.get(JobsWorker).running);

  // useExisting: a provider some imported module already has.
  @Module({ imports: [ConfigModule], providers: [JobsConfig], exports: [JobsConfig] })
  class SettingsModule {}
  const b = await boot(t, JobsModule.forRootAsync({ imports: [SettingsModule], useExisting: JobsConfig, isGlobal: true }));
  t.is(JobsConfig.made, 2, 'the existing instance is used, not a new one');
  t.true(orch(b).multiTenant);

  // Exactly one source.
  t.throws(() => JobsModule.forRootAsync({} as never), { instanceOf: TypeError, message: /exactly one of/ });
  t.throws(() => JobsModule.forRootAsync({ useClass: JobsConfig, useFactory: () => ({}) }), { message: /exactly one of/ });
});

// The module's options are checked like the core's: a misspelt key or a
// value of the wrong kind used to boot silently (`multitenant: true` left
// the tenant gate off, `pool` for `pools` was ignored).
test('forRoot and forRootAsync refuse unknown option keys and mistyped values with JobInputInvalidError', async (t) => {
  const bad: [string, unknown][] = [
    ['misspelt multiTenant', { multitenant: true }],
    ['multiTenant not a boolean', { multiTenant: 'yes' }],
    ['pool for pools', { pool: { batch: { concurrency: 1 } } }],
    ['a pool with an unknown key', { pools: { batch: { concurrency: 1, concurency: 2 } } }],
    ['worker not a boolean or object', { worker: 'yes' }],
    ['migrate not a boolean', { migrate: 'no' }],
    ['null', null],
  ];
  for (const [what, options] of bad) {
    t.throws(() => JobsModule.forRoot(options as never), { instanceOf: JobInputInvalidError }, what);
  }
  for (const [what, options] of [
    ['misspelt multiTenant', { multitenant: true }],
    ['retention with an unknown key', { retention: { completed: 1000 } }],
    ['worker options with an unknown key', { worker: { pool: { batch: { concurrency: 1 } } } }],
    ['loggerFactory not a function', { loggerFactory: 5 }],
  ] as [string, unknown][]) {
    const mod = await Test.createTestingModule({
      imports: [JobsModule.forRootAsync({ useFactory: () => options as JobsModuleOptions }), HandlersModule],
    })
      .setLogger(new CaptureLogger())
      .compile()
      .then((m) => m.init())
      .then(
        () => null,
        (e: unknown) => e,
      );
    t.true(mod instanceof JobInputInvalidError, `${what}: ${String(mod)}`);
  }
});

// A unit test of an app service replaces the public token with a double;
// the module's own worker and dashboard keep the orchestrator it built
// (they used to inject the public token: bootstrap failed on the double).
test('overriding JOB_ORCHESTRATOR with a test double leaves the module its own orchestrator', async (t) => {
  const calls: string[] = [];
  const double = {
    start: async (type: string) => {
      calls.push(type);
      return { id: 'fake' };
    },
  };
  const mod = await Test.createTestingModule({ imports: [JobsModule.forRoot({}), HandlersModule] })
    .overrideProvider(JOB_ORCHESTRATOR)
    .useValue(double)
    .setLogger(new CaptureLogger())
    .compile();
  await mod.init();
  t.teardown(() => mod.close());
  t.is(mod.get(JOB_ORCHESTRATOR), double);
  await mod.get<typeof double>(JOB_ORCHESTRATOR).start('nest.report');
  t.deepEqual(calls, ['nest.report']);
  t.true(mod.get(JobsWorker).running, "the module's worker runs on its own orchestrator");
});

test('declared pools must cover every handler pool', async (t) => {
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ pools: { batch: { concurrency: 1 } } }), HandlersModule],
  })
    .setLogger(new CaptureLogger())
    .compile();
  const err = await t.throwsAsync(() => mod.init(), { instanceOf: JobPoolNotConfiguredError });
  t.true(err instanceof JobforgeError);
  t.is(err?.pool, 'reports');
  t.is(err?.jobType, 'nest.report');
  await mod.close().catch(() => undefined);
});

test("clock: 'manual' gives the app an orchestrator whose time moves only with advanceTime", async (t) => {
  const app = await boot(t, JobsModule.forRoot({ clock: 'manual', worker: false }));
  const jobs = orch(app);
  t.is(jobs.clock, 'manual');
  const t0 = jobs.now().getTime();
  await sleep(30);
  t.is(jobs.now().getTime(), t0, 'the manual clock did not move by itself');
  // A run due in an hour is claimable only once the app's clock is there.
  const run = await jobs.start('nest.greet', { name: 'later' }, { runAt: new Date(t0 + 3_600_000) });
  t.is(await jobs.claimNext('batch'), null);
  jobs.advanceTime(3_600_000);
  t.is((await jobs.claimNext('batch'))?.id, run.id);
  // The default stays the system clock.
  const sys = orch(await boot(t, JobsModule.forRoot({ worker: false })));
  t.is(sys.clock, 'system');
});

test('schedules declared in forRoot are put on module init and fire through the DI-resolved handler', async (t) => {
  const app = await boot(
    t,
    JobsModule.forRoot({
      clock: 'manual',
      worker: false,
      schedules: { 'greet-hourly': { jobType: 'nest.greet', input: { name: 'cron' }, cron: '0 * * * *' } },
    }),
  );
  const jobs = orch(app);
  const [s] = await jobs.listSchedules();
  t.is(s?.name, 'greet-hourly');
  t.is(s?.cron, '0 * * * *');
  const t0 = jobs.now().getTime();
  const hour = 3_600_000;
  t.is(s?.nextRunAt?.getTime(), (Math.floor(t0 / hour) + 1) * hour);
  jobs.advanceTime(hour);
  const run = await jobs.claimNext('batch');
  t.is(run?.triggerRef, 'greet-hourly');
  await jobs.tick(run!.id);
  t.is((await jobs.findById(run!.id))?.status, 'completed');
  t.deepEqual(app.get(GreetingService).calls, ['cron']);
});

test('a bad schedule in forRoot fails module init with its typed error', async (t) => {
  const mod = await Test.createTestingModule({
    imports: [JobsModule.forRoot({ worker: false, schedules: { bad: { jobType: 'nest.greet', cron: '99 * * * *' } } }), HandlersModule],
  }).compile();
  const err = await t.throwsAsync(mod.init());
  t.is(err?.name, 'JobInputInvalidError');
  t.regex(err!.message, /minute/);
  await mod.close().catch(() => undefined);
});

test('registerHandler with a class on the Nest orchestrator also resolves it through DI', async (t) => {
  const app = await boot(t, JobsModule.forRoot({ worker: false }));
  const jobs = orch(app);
  jobs.registerHandler('nest.manual', {}, GreetHandler);
  t.is(jobs.getHandlerRegistration('nest.manual')?.handlerClass, GreetHandler);
  const run = await jobs.start('nest.manual', { name: 'manual' });
  await jobs.claimNext('batch');
  await jobs.tick(run.id);
  t.is((await jobs.findById(run.id))?.status, 'completed');
  t.deepEqual(app.get(GreetingService).calls, ['manual']);
  // A plain function handler is kept as it is.
  const fn = async () => ({ fn: true });
  jobs.registerHandler('nest.fn', {}, fn);
  t.is(jobs.getHandlerRegistration('nest.fn')?.handlerClass, fn);
});

test.serial('app.close() drains an in-flight run and stops the worker', async (t) => {
  const mod = await Test.createTestingModule({ imports: [JobsModule.forRoot({ pools: ALL_POOLS }), HandlersModule] })
    .setLogger(new CaptureLogger())
    .compile();
  const app = mod.createNestApplication({ logger: false });
  await app.init();
  const jobs = app.get<JobOrchestrator>(JOB_ORCHESTRATOR);
  const worker = app.get(JobsWorker);

  const run = await jobs.start('nest.slow', { ms: 400 });
  t.is(await app.get(Gate).started, run.id);
  t.is(worker.inFlight, 1);
  t.is((await jobs.findById(run.id))?.status, 'running');

  const t0 = Date.now();
  await app.close();
  const closeMs = Date.now() - t0;

  t.false(worker.running);
  t.is(worker.inFlight, 0);
  const after = await jobs.findById(run.id);
  t.is(after?.status, 'completed', 'the in-flight run finished before close() resolved');
  t.deepEqual(after?.output, { finished: 1 });
  t.is((await jobs.findStep(run.id, 'work'))?.status, 'completed');
  t.true(closeMs >= 200, `close waited for the handler (${closeMs} ms)`);

  // Nothing claims after close: a new run stays pending.
  const later = await jobs.start('nest.slow', { ms: 1 });
  await sleep(100);
  t.is((await jobs.findById(later.id))?.status, 'pending');
});
