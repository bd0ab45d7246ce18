/**
 * Injection tokens of the jobs domain. They are `Symbol.for` keys, so code
 * written against the seed's tokens (same registry keys) resolves jobforge.
 */
export const JOB_ORCHESTRATOR: symbol = Symbol.for('@pattern-stack/codegen.jobs.orchestrator');
export const JOB_RUN_SERVICE: symbol = Symbol.for('@pattern-stack/codegen.jobs.run-service');
export const JOB_STEP_SERVICE: symbol = Symbol.for('@pattern-stack/codegen.jobs.step-service');
export const JOBS_MULTI_TENANT: symbol = Symbol.for('@pattern-stack/codegen.jobs.multi-tenant');

/** The options object given to `JobsModule.forRoot` (or returned by `forRootAsync`'s factory). */
export const JOBS_MODULE_OPTIONS: symbol = Symbol.for('jobforge.nest.module-options');
