/**
 * Typed job types: an app may declare, once, which job types exist and
 * what input each takes, and give that map to the orchestrator:
 *
 * ```ts
 * interface AppJobs {
 *   'email.send': { to: string; subject: string };
 *   'report.build': { month: string };
 * }
 * const jobs = new JobOrchestrator<AppJobs>();
 * jobs.registerHandler('email.send', {}, async (ctx) => mailer.send(ctx.input.to)); // ctx.input: AppJobs['email.send']
 * await jobs.start('report.build', { month: '2026-11' });  // checked against AppJobs
 * ```
 *
 * Without a map (`AnyJobs`, the default) every string is a job type and
 * inputs are not checked, as before. Types only: nothing here exists at
 * run time, and the engine checks nothing more because of it.
 */

/**
 * The default job map: any job type, any input. `any` rather than a
 * record type so that an orchestrator typed by an app's map can still be
 * handed to code written for the untyped one, and back.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyJobs = any;

/**
 * What a job map is (job type → input): the constraint of every `Jobs`
 * parameter. Where TypeScript cannot see an orchestrator's map it falls
 * back to this constraint — Nest's `app.get(JobOrchestrator)` infers
 * `JobOrchestrator<JobMap>` — so its inputs are `any`: that orchestrator is
 * the untyped one (any job type, any input), as with `AnyJobs`. (With
 * `object` it was a map of no job type, whose `start` took nothing.)
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type JobMap = Record<string, any>;

/** The job type names of a map (`string` for `AnyJobs`). */
export type JobTypeName<Jobs> = keyof Jobs & string;

/** The input `start` takes for job type `K` of `Jobs`. */
export type JobInputOf<Jobs, K extends string> = K extends keyof Jobs ? Jobs[K] : never;

/** The job types whose input may be left out (their input type admits `undefined`). */
export type OptionalInputName<Jobs> = { [K in keyof Jobs]-?: undefined extends Jobs[K] ? K : never }[keyof Jobs] & string;

/**
 * What a handler receives for an input of type `T`: a left-out (or null)
 * input is stored as `{}`, so `undefined`/`null` never reach it.
 */
export type StoredInput<T> = [T] extends [undefined | null | void] ? Record<string, never> : Exclude<T, undefined | null | void>;

/**
 * The input a handler registered for `K` receives: the map's input type
 * (as stored); where the map does not say (`AnyJobs`, or an index
 * signature's `unknown`), `TInput`, inferred from the handler or the
 * meta, or given explicitly, as in `registerHandler<{ n: number }>(...)`.
 */
export type HandlerInput<Jobs, K extends keyof Jobs, TInput> = unknown extends Jobs[K] ? TInput : StoredInput<Jobs[K]>;
