/**
 * Waits for a manager's decision without holding a worker slot: the run
 * parks `waiting` (waitKind 'token') until `POST /approvals/:token` resumes
 * it, then runs again from the top, its finished steps and the delivered
 * token answering from the store (the link is sent once).
 */
import { Inject } from '@nestjs/common';
import { JobHandlerBase, JobWaitTimeoutError, type JobContext } from 'jobforge/nest';
import { ApprovalLinks } from './approval-links';
import { ApprovalJobHandler, type ApprovalJobs, type Decision, type ExpenseInput } from './jobs';

const TWO_DAYS_MS = 2 * 24 * 3_600_000;

@ApprovalJobHandler('expense.approve', {
  pool: 'interactive',
  scope: { entity: 'expense', from: (input) => input.expenseId },
})
export class ApproveExpenseHandler extends JobHandlerBase<ExpenseInput, unknown, ApprovalJobs> {
  constructor(@Inject(ApprovalLinks) private readonly links: ApprovalLinks) {
    super();
  }

  async run(ctx: JobContext<ExpenseInput, ApprovalJobs>) {
    const { expenseId, amountCents, approver } = ctx.input;
    let decision: Decision;
    try {
      decision = await ctx.waitForToken<Decision>('manager-approval', (token) => this.links.send(approver, ctx.run.id, token), {
        timeoutMs: TWO_DAYS_MS,
      });
    } catch (e) {
      // Nobody decided in time: the link no longer works; the expense is declined.
      if (e instanceof JobWaitTimeoutError) return { expenseId, approved: false, reason: 'no decision within two days' };
      throw e;
    }
    const booked = await ctx.step('book', async () => ({ entry: decision.approved ? `paid-${expenseId}-${amountCents}` : null }));
    return { expenseId, approved: decision.approved, note: decision.note ?? null, entry: booked.entry };
  }
}
