/** Errors raised by the Nest binding itself (the core's error classes are re-exported by index.ts). */
import { JobforgeError } from '../index';

/** A `@JobHandler` class (or a class given to `registerHandler`) that the app's DI graph does not provide. */
export class JobHandlerNotProviderError extends JobforgeError {
  override readonly name = 'JobHandlerNotProviderError';
  readonly code = 'JOB_HANDLER_NOT_PROVIDER';
  constructor(
    readonly jobType: string,
    readonly handlerClass: string,
    readonly detail?: string,
  ) {
    super(
      `job handler class ${handlerClass} (job type '${jobType}') is not a provider of this Nest application, ` +
        `so JobsModule cannot resolve it and its constructor dependencies. ` +
        `Fix: add ${handlerClass} to the \`providers\` of a module the application imports, ` +
        `e.g. @Module({ providers: [${handlerClass}] }).` +
        (detail ? ` (${detail})` : ''),
    );
  }
}

/** A handler declares a pool that `JobsModule.forRoot({ pools })` does not list. */
export class JobPoolNotConfiguredError extends JobforgeError {
  override readonly name = 'JobPoolNotConfiguredError';
  readonly code = 'JOB_POOL_NOT_CONFIGURED';
  constructor(
    readonly jobType: string,
    readonly pool: string,
    readonly configured: string[],
  ) {
    super(
      `job type '${jobType}' uses pool '${pool}', which JobsModule's \`pools\` option does not declare ` +
        `(declared: ${configured.map((p) => `'${p}'`).join(', ') || 'none'}); add it to \`pools\` or change the handler's pool`,
    );
  }
}
