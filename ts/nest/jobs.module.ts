/**
 * `JobsModule`: provides a jobforge orchestrator under the jobs-domain tokens,
 * upserts every `@JobHandler` class on init, runs the worker, drains it on
 * shutdown.
 */
import {
  Inject,
  Injectable,
  Logger,
  Module,
  type DynamicModule,
  type InjectionToken,
  type ModuleMetadata,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
  type OnModuleInit,
  type OptionalFactoryDependency,
  type Provider,
  type Type,
} from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { ContextIdFactory, ModuleRef, ModulesContainer } from '@nestjs/core';
import { JobInputInvalidError, JobOrchestrator } from '../index';
import type {
  JobContext,
  JobLogger,
  JobOrchestratorOptions,
  JobPoolDef,
  JobRun,
  ScheduleOptions,
  WorkerHandle,
  WorkerOptions,
} from '../index';
import { checkKeys } from '../validate';
import { checkDashboardOption, JobsDashboardMount, type JobsDashboardOptions } from './dashboard';
import { JobHandlerNotProviderError, JobPoolNotConfiguredError } from './errors';
import { HandlerRegistry, type JobHandlerClass } from './handler-registry';
import { NestJobOrchestrator, type HandlerResolver } from './nest-orchestrator';
import {
  JOB_ORCHESTRATOR,
  JOB_RUN_SERVICE,
  JOB_STEP_SERVICE,
  JOBS_MODULE_OPTIONS,
  JOBS_MULTI_TENANT,
  JOBS_ORCHESTRATOR_INSTANCE,
} from './tokens';

/** A pool: how many of its runs one worker executes at once, plus the seed's pool fields. */
export interface JobsPoolOptions {
  concurrency: number;
  queue?: string | undefined;
  reserved?: boolean | undefined;
  description?: string | undefined;
}

export interface JobsModuleOptions {
  /** Every start/cancel/query needs `tenantId` (null = cross-tenant). Default false. */
  multiTenant?: boolean | undefined;
  /** `'manual'`: time moves only with `advanceTime` (tests of time-dependent jobs). Default `'system'`. */
  clock?: JobOrchestratorOptions['clock'];
  /**
   * Pools the worker serves (and that handlers may name). When given, a
   * handler whose pool is not listed fails module init. Default: the core
   * worker's `batch` (5) and `interactive` (20).
   */
  pools?: Record<string, JobsPoolOptions> | undefined;
  /**
   * `false`: no worker in this process (runs are only enqueued, or driven by
   * `claimNext`/`tick`). `true` (default) or worker options: start it once
   * the application has bootstrapped; `app.close()` drains it.
   */
  worker?: boolean | WorkerOptions | undefined;
  /** Builds `ctx.logger`. Default: a Nest `Logger` named `JobRun:<runId>`. */
  loggerFactory?: ((run: JobRun) => JobLogger) | undefined;
  /** The orchestrator's own messages (a listener that threw, database trouble). Default: a Nest `Logger` named `Jobforge`. */
  logger?: JobLogger | undefined;
  /** How long terminal runs are kept (see the core's `retention`). Default: forever. */
  retention?: JobOrchestratorOptions['retention'] | undefined;
  /** The run timeline (see the core's `timeline`). Default true. */
  timeline?: JobOrchestratorOptions['timeline'];
  /** OpenTelemetry tracing when `@opentelemetry/api` is installed (see the core's `tracing`). Default true. */
  tracing?: JobOrchestratorOptions['tracing'];
  /**
   * The web dashboard, mounted in this application at `path` (Express
   * platform): `{ path: '/jobs', authorize: (req, action) => ... }`. See
   * `createDashboard` for `authorize`; without it the dashboard answers
   * loopback requests only, read-only.
   */
  dashboard?: JobsDashboardOptions | undefined;
  /**
   * `'memory'` (default) or `'postgres'`: runs live in PostgreSQL and any
   * number of processes (each importing this module) share them.
   */
  backend?: JobOrchestratorOptions['backend'] | undefined;
  /** Connection settings of the `'postgres'` backend (`url` required). */
  postgres?: JobOrchestratorOptions['postgres'] | undefined;
  /**
   * Which `@JobHandler` classes this app registers. `'registered'`
   * (default): every one loaded in the process; one that is not a
   * provider of the app fails module init. `'provided'`: only those that
   * are providers of this app; the others are left alone (several apps in
   * one process, modules imported conditionally).
   */
  handlers?: 'registered' | 'provided' | undefined;
  /**
   * Postgres: create or upgrade the schema on module init (idempotent,
   * safe from several processes). Default true; set false where
   * migrations are run separately (`npx jobforge migrate --url ...`).
   */
  migrate?: boolean | undefined;
  /**
   * Schedules (recurring starts) this app declares, by name: each is put
   * with `JobOrchestrator.schedule` on module init, after the handlers are
   * registered. Declaring one again with the same timing keeps its next
   * fire, so every boot (and every process) may declare them. Removing an
   * entry here does not delete the stored schedule: call `unschedule`.
   */
  schedules?: Record<string, ScheduleOptions> | undefined;
}

export interface JobsModuleRegistration {
  /** Register the module as global (its tokens injectable everywhere). Default true. */
  global?: boolean | undefined;
  /** Same as `global` (the name Nest's own ConfigModule uses); wins when both are given. */
  isGlobal?: boolean | undefined;
}

const MODULE_OPTION_KEYS: ReadonlySet<string> = new Set([
  'multiTenant',
  'clock',
  'pools',
  'worker',
  'loggerFactory',
  'logger',
  'retention',
  'timeline',
  'tracing',
  'dashboard',
  'backend',
  'postgres',
  'handlers',
  'migrate',
  'schedules',
]);
const REGISTRATION_KEYS: ReadonlySet<string> = new Set([...MODULE_OPTION_KEYS, 'global', 'isGlobal']);
const POOL_KEYS: ReadonlySet<string> = new Set(['concurrency', 'queue', 'reserved', 'description']);

/**
 * The module's own options, checked as the core checks its own (the
 * orchestrator's are checked again when it is built): an unknown key (a
 * misspelt `multitenant`, `pool` for `pools`) or a value of the wrong
 * kind is a JobInputInvalidError at import (forRoot) or at module init
 * (forRootAsync), never ignored.
 */
function checkModuleOptions(o: unknown, registration: boolean): void {
  // (`registration`: `global`/`isGlobal` allowed; forRoot's options object carries them.)
  if (o === null || typeof o !== 'object' || Array.isArray(o)) {
    throw new JobInputInvalidError('JobsModule options must be an object');
  }
  const opts = o as Record<string, unknown>;
  checkKeys(opts, registration ? REGISTRATION_KEYS : MODULE_OPTION_KEYS, 'JobsModule options');
  for (const k of ['multiTenant', 'migrate', 'global', 'isGlobal'] as const) {
    if (opts[k] !== undefined && typeof opts[k] !== 'boolean') {
      throw new JobInputInvalidError(`JobsModule option ${k} must be a boolean, got ${String(opts[k])}`);
    }
  }
  const w = opts.worker;
  if (w !== undefined && typeof w !== 'boolean' && (w === null || typeof w !== 'object' || Array.isArray(w))) {
    throw new JobInputInvalidError(`JobsModule option worker must be a boolean or worker options, got ${String(w)}`);
  }
  const pools = opts.pools;
  if (pools !== undefined) {
    if (pools === null || typeof pools !== 'object' || Array.isArray(pools)) {
      throw new JobInputInvalidError('JobsModule option pools must be an object of pools by name');
    }
    for (const [name, p] of Object.entries(pools)) {
      if (p === null || typeof p !== 'object') throw new JobInputInvalidError(`JobsModule pool '${name}' must be an object { concurrency, ... }`);
      checkKeys(p, POOL_KEYS, `JobsModule pool '${name}'`);
    }
  }
  const s = opts.schedules;
  if (s !== undefined && (s === null || typeof s !== 'object' || Array.isArray(s))) {
    throw new JobInputInvalidError('JobsModule option schedules must be an object of schedules by name');
  }
}

/** A provider that builds the module's options (`forRootAsync({ useClass | useExisting })`). */
export interface JobsOptionsFactory {
  createJobsOptions(): JobsModuleOptions | Promise<JobsModuleOptions>;
}

/** Exactly one of `useFactory`, `useClass`, `useExisting`, as in Nest's own async modules. */
export interface JobsModuleAsyncOptions extends JobsModuleRegistration {
  imports?: ModuleMetadata['imports'] | undefined;
  /** Injected into `useFactory`. */
  inject?: (InjectionToken | OptionalFactoryDependency)[] | undefined;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  useFactory?: ((...args: any[]) => JobsModuleOptions | Promise<JobsModuleOptions>) | undefined;
  /** A class JobsModule provides (with its injected dependencies) and asks for the options. */
  useClass?: Type<JobsOptionsFactory> | undefined;
  /** A provider already available (from `imports` or global) that builds the options. */
  useExisting?: InjectionToken | undefined;
}

/** A Nest `Logger` named after the run: `JobRun:<id>`. */
export function nestRunLogger(run: JobRun): JobLogger {
  return new Logger(`JobRun:${run.id}`);
}

const isScopeError = (e: unknown) => (e as { constructor?: { name?: string } })?.constructor?.name === 'InvalidClassScopeException';

/**
 * Resolves handler classes through `ModuleRef` (`strict: false`: from any
 * module of the app). Default-scoped providers are singletons and come from
 * `get`; request/transient-scoped ones get a fresh instance per execution,
 * in a DI context of its own whose `REQUEST` is the execution's
 * `JobContext` (so a request-scoped service can `@Inject(REQUEST)` the run,
 * its tenant and its logger).
 */
export function moduleRefResolver(moduleRef: ModuleRef): HandlerResolver & {
  check(cls: JobHandlerClass, type: string): void;
} {
  const scoped = new Set<JobHandlerClass>();
  const SCOPED = Symbol('scoped');
  /** The singleton instance, or SCOPED; throws JobHandlerNotProviderError. */
  const lookup = (cls: JobHandlerClass, type: string): { run(ctx: never): unknown } | typeof SCOPED => {
    if (scoped.has(cls)) return SCOPED;
    let instance: { run(ctx: never): unknown } | undefined;
    try {
      instance = moduleRef.get(cls, { strict: false });
    } catch (e) {
      if (isScopeError(e)) {
        scoped.add(cls);
        return SCOPED;
      }
      throw new JobHandlerNotProviderError(type, cls.name, (e as Error)?.message);
    }
    if (instance === undefined || instance === null) throw new JobHandlerNotProviderError(type, cls.name);
    return instance;
  };
  const resolve = (async (cls: JobHandlerClass, type: string, ctx?: JobContext<unknown>) => {
    const instance = lookup(cls, type);
    if (instance !== SCOPED) return instance;
    const contextId = ContextIdFactory.create();
    if (ctx !== undefined) moduleRef.registerRequestByContextId(ctx, contextId);
    return moduleRef.resolve(cls, contextId, { strict: false });
  }) as HandlerResolver & { check(cls: JobHandlerClass, type: string): void };
  resolve.check = (cls, type) => void lookup(cls, type);
  return resolve;
}

/**
 * How one registration's lifecycle module reaches its worker, per app: the
 * same registration (one `forRoot` result in an `AppModule`) may be built
 * into several apps in one process (tests, a CLI beside a server), each
 * with its own worker, keyed by the app's module container.
 */
interface WorkerLink {
  /** Distinct per registration, so module ids hashed from metadata differ too. */
  readonly id: string;
  readonly workers: WeakMap<ModulesContainer, JobsWorker>;
}
const WORKER_LINK = Symbol('jobforge.nest.worker-link');

/**
 * Owns the worker of the module's orchestrator: upserts the registered
 * handlers on init (JobsModule is global, so that is before any other
 * module's `onModuleInit` may start runs); `JobsWorkerLifecycle` starts it
 * once the application has bootstrapped (unless `worker: false`) and
 * drains it on `app.close()` before any other module is destroyed; the
 * orchestrator is closed with this module, last.
 */
@Injectable()
export class JobsWorker implements OnModuleInit, OnModuleDestroy {
  private readonly logger = new Logger('JobsWorker');
  private handle: WorkerHandle | null = null;
  private readonly resolver: ReturnType<typeof moduleRefResolver>;

  constructor(
    @Inject(JOBS_ORCHESTRATOR_INSTANCE) private readonly orchestrator: JobOrchestrator,
    @Inject(JOBS_MODULE_OPTIONS) private readonly options: JobsModuleOptions,
    @Inject(ModuleRef) moduleRef: ModuleRef,
    @Inject(HandlerRegistry) private readonly registry: HandlerRegistry,
    @Inject(WORKER_LINK) link: WorkerLink,
    @Inject(ModulesContainer) private readonly modules: ModulesContainer,
  ) {
    this.resolver = moduleRefResolver(moduleRef);
    link.workers.set(modules, this);
  }

  /** Upserts every `@JobHandler` class; fails if one is not a provider or names an undeclared pool. */
  async onModuleInit(): Promise<void> {
    const which = this.options.handlers ?? 'registered';
    if (which !== 'registered' && which !== 'provided') {
      throw new JobInputInvalidError(`JobsModule option handlers must be 'registered' or 'provided', got ${String(which)}`);
    }
    const defs = which === 'provided' ? this.providedHandlers() : this.registry.getAll();
    const pools = this.options.pools;
    const served = new Set(Object.keys(this.workerOptions()?.pools ?? pools ?? { batch: 1, interactive: 1 }));
    for (const d of defs) {
      this.resolver.check(d.handlerClass, d.type);
      const pool = d.meta.pool ?? 'batch';
      if (pools && !(pool in pools)) throw new JobPoolNotConfiguredError(d.type, pool, Object.keys(pools));
      if (this.workerOptions() && !served.has(pool)) {
        this.logger.warn(`job type '${d.type}' uses pool '${pool}', which this process's worker does not serve`);
      }
    }
    const poolConfig = new Map<string, JobPoolDef>(
      Object.entries(pools ?? {}).map(([name, p]) => [
        name,
        { queue: p.queue ?? name, concurrency: p.concurrency, reserved: p.reserved ?? false, description: p.description },
      ]),
    );
    if (this.options.backend === 'postgres' && this.options.migrate !== false) await this.orchestrator.migrate();
    await this.orchestrator.upsertJobRows(
      defs.map((d) => ({ type: d.type, meta: d.meta, handlerClass: d.handlerClass })),
      poolConfig,
    );
    for (const [name, schedule] of Object.entries(this.options.schedules ?? {})) {
      await this.orchestrator.schedule(name, schedule);
    }
  }

  /** The registered handlers whose class is a provider of some module of this app. */
  private providedHandlers(): ReturnType<HandlerRegistry['getAll']> {
    const classes = new Set<unknown>();
    for (const m of this.modules.values()) {
      for (const wrapper of m.providers.values()) classes.add(wrapper.metatype);
    }
    return this.registry.getAll().filter((d) => classes.has(d.handlerClass));
  }

  /** Starts the configured worker unless `worker: false` or already running. */
  startConfigured(): void {
    if (this.workerOptions() && !this.handle?.running) this.start();
  }

  /** Closes the orchestrator (the worker was drained first; a no-op then). */
  async onModuleDestroy(): Promise<void> {
    await this.stop();
    await this.orchestrator.close();
  }

  /** Starts the worker (also when the module was configured with `worker: false`). */
  start(opts?: WorkerOptions): WorkerHandle {
    const o = opts ?? this.workerOptions() ?? this.workerOptionsFrom(true)!;
    this.handle = this.orchestrator.startWorker(o);
    return this.handle;
  }

  /** Stops claiming and waits for in-flight runs; a no-op without a running worker. */
  async stop(): Promise<void> {
    const h = this.handle;
    if (!h) return;
    const inFlight = h.inFlight;
    if (inFlight > 0) this.logger.log(`draining ${inFlight} in-flight run(s)`);
    await h.stop();
  }

  get running(): boolean {
    return this.handle?.running ?? false;
  }

  get inFlight(): number {
    return this.handle?.inFlight ?? 0;
  }

  private workerOptions(): WorkerOptions | null {
    return this.workerOptionsFrom(this.options.worker ?? true);
  }

  private workerOptionsFrom(w: boolean | WorkerOptions): WorkerOptions | null {
    if (w === false) return null;
    const given = w === true ? {} : w;
    const pools =
      given.pools ??
      (this.options.pools
        ? Object.fromEntries(Object.entries(this.options.pools).map(([k, p]) => [k, { concurrency: p.concurrency }]))
        : undefined);
    return { ...given, pools };
  }
}

/** Apps (by their module container) already warned of several registrations. */
const warnedApps = new WeakSet<object>();

/**
 * The worker's place in the app's lifecycle. Nest runs `onApplicationBootstrap`
 * by module distance (global modules such as JobsModule first) and
 * `onModuleDestroy` in reverse (global modules last). A worker started
 * first would run handlers before their modules finished bootstrapping; one
 * drained last would let in-flight runs call services already torn down
 * (a database module closed by its `onModuleDestroy`). So this module, which
 * only starts and drains the worker, is placed after every module for
 * bootstrap and before every module for destroy. Nest has no option for
 * that: its module's distance is set below the root module's (1) while the
 * app is being built, before Nest orders its hooks. If a Nest version
 * lacks the field, hooks stay in Nest's order (the drain then still runs
 * before global modules).
 */
@Injectable()
class JobsWorkerLifecycle implements OnApplicationBootstrap, OnModuleDestroy {
  constructor(
    @Inject(WORKER_LINK) private readonly link: WorkerLink,
    @Inject(ModulesContainer) private readonly modules: ModulesContainer,
  ) {
    let registrations = 0;
    for (const m of modules.values()) {
      const mod = m as unknown as { metatype?: unknown; distance?: unknown };
      if (mod.metatype === JobsModule) registrations++;
      if (mod.metatype === JobsWorkerModule && typeof mod.distance === 'number') mod.distance = -1;
    }
    if (registrations > 1 && !warnedApps.has(modules)) {
      warnedApps.add(modules);
      new Logger('JobsModule').warn(
        `JobsModule is registered ${registrations} times in this app: each registration has its own orchestrator ` +
          'and worker, and a module sees the one it imports (or the global one). Register it once ' +
          '(forRoot/forRootAsync in the root module; it is global by default).',
      );
    }
  }

  onApplicationBootstrap(): void {
    this.link.workers.get(this.modules)?.startConfigured();
  }

  /** Drains the worker: in-flight runs finish (or go back to pending after `shutdownTimeoutMs`). */
  async onModuleDestroy(): Promise<void> {
    await this.link.workers.get(this.modules)?.stop();
  }
}

/** Internal: holds `JobsWorkerLifecycle` (see there); imported by each JobsModule registration. */
@Module({})
export class JobsWorkerModule {
  static link(link: WorkerLink): DynamicModule {
    return { module: JobsWorkerModule, providers: [{ provide: WORKER_LINK, useValue: link }, JobsWorkerLifecycle] };
  }
}

function orchestratorFactory(options: JobsModuleOptions, moduleRef: ModuleRef): NestJobOrchestrator {
  // forRootAsync's options are first seen here (forRoot's were checked at import).
  checkModuleOptions(options, true);
  return new NestJobOrchestrator(
    {
      multiTenant: options.multiTenant === true,
      clock: options.clock,
      loggerFactory: options.loggerFactory ?? nestRunLogger,
      logger: options.logger ?? new Logger('Jobforge'),
      retention: options.retention,
      timeline: options.timeline,
      tracing: options.tracing,
      backend: options.backend,
      postgres: options.postgres,
    },
    moduleRefResolver(moduleRef),
  );
}

const EXPORTS = [
  JOB_ORCHESTRATOR,
  JOB_RUN_SERVICE,
  JOB_STEP_SERVICE,
  JOBS_MULTI_TENANT,
  JobOrchestrator,
  HandlerRegistry,
  JobsWorker,
];

/**
 * One registration of JobsModule: its providers around `optionsProvider`
 * (plus `extra`), and the lifecycle module that starts and drains its worker.
 */
function registration(
  reg: JobsModuleRegistration,
  optionsProvider: Provider,
  imports: NonNullable<ModuleMetadata['imports']> = [],
  extra: Provider[] = [],
): DynamicModule {
  // A random id, not a module-level counter: no state outlives a registration.
  const link: WorkerLink = { id: randomUUID(), workers: new WeakMap() };
  return {
    module: JobsModule,
    global: reg.isGlobal ?? reg.global ?? true,
    imports: [...imports, JobsWorkerModule.link(link)],
    providers: [...extra, ...providers(optionsProvider, link)],
    exports: EXPORTS,
  };
}

function providers(optionsProvider: Provider, link: WorkerLink): Provider[] {
  return [
    optionsProvider,
    { provide: WORKER_LINK, useValue: link },
    { provide: JOBS_ORCHESTRATOR_INSTANCE, useFactory: orchestratorFactory, inject: [JOBS_MODULE_OPTIONS, ModuleRef] },
    { provide: JOB_ORCHESTRATOR, useExisting: JOBS_ORCHESTRATOR_INSTANCE },
    { provide: JOB_RUN_SERVICE, useExisting: JOB_ORCHESTRATOR },
    { provide: JOB_STEP_SERVICE, useExisting: JOB_ORCHESTRATOR },
    { provide: JobOrchestrator, useExisting: JOB_ORCHESTRATOR },
    {
      provide: JOBS_MULTI_TENANT,
      useFactory: (o: JobsModuleOptions) => o.multiTenant === true,
      inject: [JOBS_MODULE_OPTIONS],
    },
    { provide: HandlerRegistry, useValue: new HandlerRegistry() },
    JobsWorker,
    JobsDashboardMount,
  ];
}

@Module({})
export class JobsModule {
  /** `JobsModule.forRoot({ multiTenant?, pools?, worker?, backend?, postgres?, global? })`. */
  static forRoot(options: JobsModuleOptions & JobsModuleRegistration = {}): DynamicModule {
    // Checked here too (module init checks it again, for forRootAsync): a bad option fails at import.
    checkModuleOptions(options, true);
    if (options.dashboard !== undefined) checkDashboardOption(options.dashboard);
    return registration(options, { provide: JOBS_MODULE_OPTIONS, useValue: options });
  }

  /**
   * `JobsModule.forRootAsync({ imports?, global?, useFactory + inject? | useClass | useExisting })`:
   * the options come from a factory function, from a class JobsModule
   * provides, or from an existing provider (the last two implement
   * `JobsOptionsFactory`).
   */
  static forRootAsync(options: JobsModuleAsyncOptions): DynamicModule {
    const given = [options?.useFactory, options?.useClass, options?.useExisting].filter((x) => x !== undefined);
    if (given.length !== 1) {
      throw new TypeError('JobsModule.forRootAsync needs exactly one of useFactory, useClass or useExisting');
    }
    if (options.useFactory !== undefined && typeof options.useFactory !== 'function') {
      throw new TypeError('JobsModule.forRootAsync: useFactory must be a function');
    }
    if (options.useClass !== undefined && typeof options.useClass !== 'function') {
      throw new TypeError('JobsModule.forRootAsync: useClass must be a class');
    }
    const fromFactory = async (f: JobsOptionsFactory) => {
      if (typeof f?.createJobsOptions !== 'function') {
        throw new TypeError('JobsModule.forRootAsync: the options provider has no createJobsOptions() method');
      }
      return (await f.createJobsOptions()) ?? {};
    };
    const useFactory = options.useFactory;
    const optionsProvider: Provider = useFactory
      ? {
          provide: JOBS_MODULE_OPTIONS,
          useFactory: async (...args: unknown[]) => (await useFactory(...args)) ?? {},
          inject: options.inject ?? [],
        }
      : { provide: JOBS_MODULE_OPTIONS, useFactory: fromFactory, inject: [options.useClass ?? options.useExisting!] };
    return registration(options, optionsProvider, options.imports, options.useClass ? [options.useClass] : []);
  }
}
