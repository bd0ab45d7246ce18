/**
 * Compile-time checks of the durable waits' types (issue 22): the five
 * `ctx` methods, `signal` / `resume` on the orchestrator and on the Nest
 * `IJobOrchestrator`, the wait fields of a run and the three error
 * classes. Run by `npm run test:types` (strict, `exactOptionalPropertyTypes`);
 * nothing here is executed.
 */
import { JobChildFailedError, JobHandlerBase, JobOrchestrator, JobResumeTokenError, JobWaitTimeoutError } from '../../dist';
import type { JobContext, JobRun, JobRunError, JobWaitKind, ResumeResult, SignalResult } from '../../dist';
import type { IJobOrchestrator } from '../../dist/nest';

interface AppJobs {
  'report.build': { month: string };
  'email.send': { to: string };
  'cache.sweep': { olderThanDays?: number } | undefined;
}

/** Exact type equality (not mere assignability). */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function same<A, B>(ok: Equal<A, B>): void {
  void ok;
}

export function ctxWaits(jobs: JobOrchestrator<AppJobs>): void {
  jobs.registerHandler('report.build', {}, async (ctx) => {
    same<ReturnType<typeof ctx.sleep>, Promise<void>>(true);
    same<ReturnType<typeof ctx.sleepUntil>, Promise<void>>(true);
    await ctx.sleep('nap', 1_000);
    await ctx.sleepUntil('at', new Date());
    // @ts-expect-error a sleep takes milliseconds, not a Date
    await ctx.sleep('nap', new Date());
    // @ts-expect-error sleepUntil takes a Date
    await ctx.sleepUntil('at', 1_000);
    // @ts-expect-error the step id comes first
    await ctx.sleep(1_000);

    // A signal's payload: unknown unless the caller names it.
    const anything = await ctx.waitForSignal('go');
    same<typeof anything, unknown>(true);
    const vote = await ctx.waitForSignal<{ n: number }>('vote', { signal: 'votes', timeoutMs: 1_000 });
    same<typeof vote, { n: number }>(true);
    await ctx.waitForSignal('go', { signal: undefined, timeoutMs: undefined });
    // @ts-expect-error an option the wait does not have
    await ctx.waitForSignal('go', { timeout: 1_000 });
    // @ts-expect-error a signal name is a string
    await ctx.waitForSignal('go', { signal: 1 });

    // A token: deliver gets the token (a string) and may be async.
    const answer = await ctx.waitForToken<{ ok: boolean }>('approve', async (token) => {
      same<typeof token, string>(true);
    }, { timeoutMs: 60_000 });
    same<typeof answer, { ok: boolean }>(true);
    await ctx.waitForToken('approve', (token) => token.length);
    // @ts-expect-error deliver is required
    await ctx.waitForToken('approve');
    // @ts-expect-error a token wait has no signal option
    await ctx.waitForToken('approve', () => undefined, { signal: 'x' });

    // invoke: the child's type and input are checked against the map, the output is named by the caller.
    const out = await ctx.invoke('child', 'email.send', { to: 'a@b.c' });
    same<typeof out, unknown>(true);
    const rows = await ctx.invoke<{ rows: number }>('rows', 'report.build', { month: '2026-11' }, {
      closePolicy: 'abandon',
      priority: 1,
      runAt: new Date(),
      tags: { k: 'v' },
      timeoutMs: 5_000,
    });
    same<typeof rows, { rows: number }>(true);
    await ctx.invoke('sweep', 'cache.sweep', undefined);
    // Fan-out / fan-in.
    const all = await Promise.all([ctx.invoke<number>('a', 'report.build', { month: 'a' }), ctx.invoke<string>('b', 'email.send', { to: 'b' })]);
    same<typeof all, [number, string]>(true);
    // @ts-expect-error a child input of the wrong type
    await ctx.invoke('bad', 'report.build', { month: 11 });
    // @ts-expect-error a job type the map does not name
    await ctx.invoke('bad', 'report.bild', { month: '2026-11' });
    // @ts-expect-error an option invoke does not have
    await ctx.invoke('bad', 'report.build', { month: '2026-11' }, { timeout: 1 });
    return { rows: rows.rows };
  });
}

/** A class handler gets the same methods through `JobContext<Input, Jobs>`. */
export class Approve extends JobHandlerBase<AppJobs['email.send'], { ok: boolean }, AppJobs> {
  async run(ctx: JobContext<AppJobs['email.send'], AppJobs>): Promise<{ ok: boolean }> {
    const { ok } = await ctx.waitForToken<{ ok: boolean }>('decision', (token) => void token);
    await ctx.invoke('report', 'report.build', { month: ctx.input.to });
    return { ok };
  }
}

/** The untyped ctx: any job type, any input. */
export async function untypedCtx(ctx: JobContext): Promise<void> {
  await ctx.invoke('x', 'whatever', { any: [1] });
}

export async function orchestratorCalls(jobs: JobOrchestrator<AppJobs>, multi: JobOrchestrator): Promise<void> {
  const s = await jobs.signal('run-id', 'go');
  same<typeof s, SignalResult>(true);
  same<SignalResult, { delivered: boolean }>(true);
  await jobs.signal('run-id', 'vote', { n: 1 }, { tenantId: 'acme' });
  await multi.signal('run-id', 'vote', undefined, { tenantId: null });
  await jobs.signal('run-id', 'vote', 1, { tenantId: undefined });
  // @ts-expect-error the signal name is required
  await jobs.signal('run-id');
  // @ts-expect-error signal takes only a tenantId option
  await jobs.signal('run-id', 'go', 1, { cascade: true });

  const r = await jobs.resume('jft_…', { ok: true });
  same<typeof r, ResumeResult>(true);
  same<ResumeResult, { runId: string }>(true);
  await jobs.resume('jft_…');
  await jobs.resume('jft_…', null, { tenantId: 'acme' });
  await jobs.resume('jft_…', 1, { tenantId: 'acme', runId: 'x' });
  // @ts-expect-error resume takes only tenantId and runId options
  await jobs.resume('jft_…', 1, { run: 'x' });
  // @ts-expect-error runId is a string
  await jobs.resume('jft_…', 1, { runId: 7 });
}

/** A run's wait fields. */
export function runFields(run: JobRun): void {
  same<JobRun['waitKind'], JobWaitKind | null>(true);
  same<JobWaitKind, 'sleep' | 'signal' | 'token' | 'child'>(true);
  same<JobRun['waitDeadline'], Date | null>(true);
  const waiting: JobRun['status'] = 'waiting';
  void [run, waiting];
}

/** The three error classes and their fields. */
export function errors(e: unknown): string | null {
  if (e instanceof JobWaitTimeoutError) {
    same<typeof e.runId, string>(true);
    same<typeof e.stepId, string | null>(true);
    same<typeof e.timeoutMs, number>(true);
    return e.stepId;
  }
  if (e instanceof JobChildFailedError) {
    same<typeof e.childRunId, string>(true);
    same<typeof e.status, 'failed' | 'timed_out' | 'canceled'>(true);
    same<typeof e.error, JobRunError | null>(true);
    return e.childRunId;
  }
  if (e instanceof JobResumeTokenError) {
    same<typeof e.reason, string>(true);
    return e.reason;
  }
  return null;
}

/** The Nest token's type is the whole orchestrator: `signal` and `resume` included. */
export async function nestOrchestrator(typed: IJobOrchestrator<AppJobs>, plain: IJobOrchestrator): Promise<void> {
  same<IJobOrchestrator<AppJobs>['signal'], JobOrchestrator<AppJobs>['signal']>(true);
  same<IJobOrchestrator['resume'], JobOrchestrator['resume']>(true);
  const { delivered } = await typed.signal('run-id', 'go', { n: 1 }, { tenantId: 'acme' });
  const { runId } = await plain.resume('jft_…', { approved: true });
  same<typeof delivered, boolean>(true);
  same<typeof runId, string>(true);
}

/** A test double of just the waits' part of the Nest interface. */
export class FakeSignals implements Pick<IJobOrchestrator<AppJobs>, 'signal' | 'resume'> {
  readonly sent: { runId: string; signal: string; payload: unknown }[] = [];
  async signal(runId: string, signal: string, payload?: unknown, opts?: { tenantId?: string | null | undefined }): Promise<SignalResult> {
    void opts;
    this.sent.push({ runId, signal, payload });
    return { delivered: false };
  }
  async resume(token: string, payload?: unknown, opts?: { tenantId?: string | null | undefined }): Promise<ResumeResult> {
    void [payload, opts];
    return { runId: token };
  }
}
