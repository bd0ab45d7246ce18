/**
 * `@JobHandler(type, meta)` and the process-wide `HandlerRegistry` it fills.
 * The decorator runs when the class is defined; `JobsModule` later upserts
 * every registered handler and resolves each class from the app's DI graph.
 */
import 'reflect-metadata';
import { Injectable, Logger } from '@nestjs/common';
import { JobforgeError, type HandlerInput, type JobContext, type JobHandlerMeta, type JobMap, type JobTypeName } from '../index';

/** A handler class: constructed by Nest (so its `@Inject` dependencies work), with `run(ctx)`. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type JobHandlerClass<TInput = any> = new (...args: any[]) => { run(ctx: JobContext<TInput>): unknown };

export interface JobHandlerDefinition {
  type: string;
  meta: JobHandlerMeta<unknown>;
  handlerClass: JobHandlerClass;
}

/** Nest's marker of an `@Injectable()` class (`@nestjs/common/constants`). */
const INJECTABLE_WATERMARK = '__injectable__';

/** Reflect-metadata key holding `{ type, meta }` on a decorated class. */
export const JOB_HANDLER_METADATA = 'jobforge:job-handler';

/** Two different classes declared the same job type (thrown when `NODE_ENV=production`). */
export class DuplicateJobHandlerError extends JobforgeError {
  override readonly name = 'DuplicateJobHandlerError';
  readonly code = 'JOB_HANDLER_DUPLICATE';
  constructor(
    readonly jobType: string,
    readonly existing: string,
    readonly duplicate: string,
  ) {
    super(
      `job type '${jobType}' is declared by both ${existing} and ${duplicate}; ` +
        'give one of the @JobHandler classes another type',
    );
  }
}

const definitions = new Map<string, JobHandlerDefinition>();
const logger = new Logger('HandlerRegistry');

/**
 * Every `@JobHandler` class of the process, by job type. Injectable (JobsModule
 * provides it) and usable statically.
 *
 * A second class declaring a type already taken: throws in production
 * (`NODE_ENV=production`), is silent in tests (`NODE_ENV=test`) and warns
 * otherwise; outside production the later class replaces the earlier one.
 */
export class HandlerRegistry {
  static register(type: string, meta: JobHandlerMeta<unknown>, handlerClass: JobHandlerClass): void {
    const existing = definitions.get(type);
    if (existing && existing.handlerClass !== handlerClass) {
      const env = process.env.NODE_ENV;
      const err = new DuplicateJobHandlerError(type, existing.handlerClass.name, handlerClass.name);
      if (env === 'production') throw err;
      if (env !== 'test') logger.warn(`${err.message} (${handlerClass.name} replaces ${existing.handlerClass.name})`);
    }
    definitions.set(type, { type, meta, handlerClass });
  }

  static get(type: string): JobHandlerDefinition | undefined {
    return definitions.get(type);
  }

  static getAll(): JobHandlerDefinition[] {
    return [...definitions.values()];
  }

  get(type: string): JobHandlerDefinition | undefined {
    return HandlerRegistry.get(type);
  }

  getAll(): JobHandlerDefinition[] {
    return HandlerRegistry.getAll();
  }
}

/**
 * Declares a job handler class: `@JobHandler('email.send', { retry: {...} })`.
 * The class becomes `@Injectable()`; list it in a module's `providers` so
 * JobsModule can resolve it (with its constructor dependencies) per run.
 * The class must have `run(ctx)` taking this job's input (see also
 * `typedJobHandler`, which checks the type against the app's job map).
 */
export function JobHandler<TInput = unknown>(
  type: string,
  meta: JobHandlerMeta<TInput> = {},
): <C extends JobHandlerClass<TInput>>(target: C) => void {
  if (typeof type !== 'string' || type.length === 0) {
    throw new TypeError('@JobHandler(type, meta) needs a non-empty job type string');
  }
  if (meta === null || typeof meta !== 'object') {
    throw new TypeError(`@JobHandler('${type}', meta): meta must be an object`);
  }
  return (target) => {
    const cls = target as unknown as JobHandlerClass;
    if (typeof (cls.prototype as { run?: unknown } | undefined)?.run !== 'function') {
      throw new TypeError(`@JobHandler('${type}'): class ${cls.name} needs a run(ctx) method`);
    }
    // Keep an explicit @Injectable({ scope }) written below @JobHandler.
    if (!Reflect.hasOwnMetadata(INJECTABLE_WATERMARK, target)) Injectable()(target);
    Reflect.defineMetadata(JOB_HANDLER_METADATA, { type, meta }, target);
    HandlerRegistry.register(type, meta as JobHandlerMeta<unknown>, cls);
  };
}

/**
 * `@JobHandler` bound to the app's job map: the job type must be one of
 * the map's, and the meta's key functions and the class's `run(ctx)` are
 * checked against that type's input. Made once per app:
 *
 * ```ts
 * export const AppJobHandler = typedJobHandler<AppJobs>();
 * @AppJobHandler('email.send', { dedupe: { key: (i) => i.to, windowMs: 60_000 } })
 * export class SendEmail extends JobHandlerBase<AppJobs['email.send'], void, AppJobs> { ... }
 * ```
 */
export function typedJobHandler<Jobs extends JobMap>(): <K extends JobTypeName<Jobs>>(
  type: K,
  meta?: JobHandlerMeta<HandlerInput<Jobs, K, unknown>>,
) => <C extends JobHandlerClass<HandlerInput<Jobs, K, unknown>>>(target: C) => void {
  return (type, meta) => JobHandler(type, meta);
}

/** `{ type, meta }` of a `@JobHandler` class, or undefined. */
export function getJobHandlerMetadata(
  cls: unknown,
): { type: string; meta: JobHandlerMeta<unknown> } | undefined {
  return typeof cls === 'function' ? Reflect.getMetadata(JOB_HANDLER_METADATA, cls) : undefined;
}
