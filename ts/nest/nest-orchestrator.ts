/**
 * `NestJobOrchestrator`: the core `JobOrchestrator` whose class handlers are
 * instantiated by Nest. A class given to `registerHandler` / `upsertJobRows`
 * is registered with the engine as a small runner that resolves the instance
 * from the app's DI graph on every execution and calls its `run(ctx)`;
 * `getHandlerRegistration(type).handlerClass` still returns the class.
 */
import { JobOrchestrator } from '../index';
import type {
  AnyJobs,
  HandlerInput,
  HandlerRegistration,
  JobContext,
  JobHandler,
  JobHandlerMeta,
  JobMap,
  JobOrchestratorOptions,
  JobPoolDef,
  JobTypeName,
  JobUpsertEntry,
} from '../index';
import type { JobHandlerClass } from './handler-registry';

/**
 * Returns the instance that runs one execution of `type` (e.g. via
 * `ModuleRef`); `ctx` is that execution's context.
 */
export type HandlerResolver = (
  handlerClass: JobHandlerClass,
  type: string,
  ctx?: JobContext<unknown>,
) => Promise<{ run(ctx: JobContext<unknown>): unknown }>;

type Runner = (ctx: JobContext<unknown>) => Promise<unknown>;

function isHandlerClass(h: unknown): h is JobHandlerClass {
  return typeof h === 'function' && typeof (h as { prototype?: { run?: unknown } }).prototype?.run === 'function';
}

export class NestJobOrchestrator<Jobs extends JobMap = AnyJobs> extends JobOrchestrator<Jobs> {
  /** type → the class and the runner the engine holds for it. */
  private readonly diHandlers = new Map<string, { handlerClass: JobHandlerClass; runner: Runner }>();

  constructor(
    options: JobOrchestratorOptions,
    private readonly resolveHandler: HandlerResolver,
  ) {
    super(options);
  }

  private runnerFor(type: string, handler: unknown): { handler: unknown; cls?: JobHandlerClass; runner?: Runner } {
    if (!isHandlerClass(handler)) return { handler };
    const cls = handler;
    const runner: Runner = async (ctx) => (await this.resolveHandler(cls, type, ctx)).run(ctx);
    return { handler: runner, cls, runner };
  }

  override registerHandler<TInput = unknown, K extends JobTypeName<Jobs> = JobTypeName<Jobs>>(
    type: K,
    meta: JobHandlerMeta<HandlerInput<Jobs, K, TInput>>,
    handler: JobHandler<HandlerInput<Jobs, K, TInput>, Jobs>,
  ): void {
    const r = this.runnerFor(type, handler);
    super.registerHandler(type, meta, r.handler as JobHandler<HandlerInput<Jobs, K, TInput>, Jobs>);
    this.remember(type, r);
  }

  override async upsertJobRows(
    entries: JobUpsertEntry[],
    poolConfig?: ReadonlyMap<string, JobPoolDef>,
  ): Promise<{ orphaned: string[] }> {
    if (!Array.isArray(entries)) return super.upsertJobRows(entries, poolConfig);
    const wrapped = entries.map((e) => ({ entry: e, r: this.runnerFor(e?.type, e?.handlerClass) }));
    const result = await super.upsertJobRows(
      wrapped.map(({ entry, r }) => ({ ...entry, handlerClass: r.handler })),
      poolConfig,
    );
    for (const { entry, r } of wrapped) this.remember(entry.type, r);
    return result;
  }

  private remember(type: string, r: { cls?: JobHandlerClass; runner?: Runner }): void {
    if (r.cls && r.runner) this.diHandlers.set(type, { handlerClass: r.cls, runner: r.runner });
    else this.diHandlers.delete(type);
  }

  /** The registration of `type`, with the handler class (not the DI runner) as `handlerClass`. */
  override getHandlerRegistration(type: string): HandlerRegistration | undefined {
    const reg = super.getHandlerRegistration(type);
    const di = this.diHandlers.get(type);
    if (reg && di && reg.handlerClass === di.runner) return { ...reg, handlerClass: di.handlerClass };
    return reg;
  }
}
