/**
 * Injection tokens of the jobs domain. They are `Symbol.for` keys, so code
 * written against the seed's tokens (same registry keys) resolves jobforge.
 */
export const JOB_ORCHESTRATOR: symbol = Symbol.for('@pattern-stack/codegen.jobs.orchestrator');
export const JOB_RUN_SERVICE: symbol = Symbol.for('@pattern-stack/codegen.jobs.run-service');
export const JOB_STEP_SERVICE: symbol = Symbol.for('@pattern-stack/codegen.jobs.step-service');
export const JOBS_MULTI_TENANT: symbol = Symbol.for('@pattern-stack/codegen.jobs.multi-tenant');

/**
 * Internal: the orchestrator the module built, which its own worker and
 * dashboard use. `JOB_ORCHESTRATOR` names it too, so a test may override
 * that public token with a double (`overrideProvider(JOB_ORCHESTRATOR)`)
 * without taking the module's own providers down with it.
 */
export const JOBS_ORCHESTRATOR_INSTANCE: symbol = Symbol('jobforge.nest.orchestrator-instance');

/** The options object given to `JobsModule.forRoot` (or returned by `forRootAsync`'s factory). */
export const JOBS_MODULE_OPTIONS: symbol = Symbol.for('jobforge.nest.module-options');
