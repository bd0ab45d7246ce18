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
 * inputs are `unknown`, as before. Types only: nothing here exists at run
 * time, and the engine checks nothing more because of it.
 */

/** The default job map: any job type, any input. */
export type AnyJobs = Record<string, unknown>;

/** Whether `Jobs` names its job types (an app's map) or is `AnyJobs`. */
type IsUntyped<Jobs> = string extends keyof Jobs ? true : false;

/** The job type names of a map (`string` for `AnyJobs`). */
export type JobTypeName<Jobs> = keyof Jobs & string;

/** The input of job type `K` in `Jobs` (`unknown` for `AnyJobs`). */
export type JobInputOf<Jobs, K extends string> = IsUntyped<Jobs> extends true ? unknown : K extends keyof Jobs ? Jobs[K] : never;

/**
 * The input a handler registered for `K` receives: the map's input type;
 * with `AnyJobs`, `TInput` (inferred from the handler or the meta, or
 * given explicitly, as in `registerHandler<{ n: number }>(...)`).
 */
export type HandlerInput<Jobs, K extends string, TInput> = IsUntyped<Jobs> extends true ? TInput : JobInputOf<Jobs, K>;

/**
 * The arguments after the job type of `start` and `spawnChild`: the input
 * may be left out only where the job's input type admits `undefined`
 * (an omitted input is stored as `{}`).
 */
export type InputArgs<Input, Opts> = undefined extends Input
  ? [input?: Input | null, opts?: Opts]
  : [input: Input, opts?: Opts];
