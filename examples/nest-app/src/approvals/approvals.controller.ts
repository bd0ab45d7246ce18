import { BadRequestException, Body, Controller, HttpCode, Inject, NotFoundException, Param, Post } from '@nestjs/common';
import { JOB_ORCHESTRATOR, JobResumeTokenError } from 'jobforge/nest';
import type { IJobOrchestrator } from 'jobforge/nest';
import type { ApprovalJobs, Decision, ExpenseInput } from './jobs';

@Controller()
export class ApprovalsController {
  constructor(@Inject(JOB_ORCHESTRATOR) private readonly jobs: IJobOrchestrator<ApprovalJobs>) {}

  /** Starts the approval: the run sends the approver a link and waits for it. */
  @Post('expenses')
  @HttpCode(202)
  async submit(@Body() body: ExpenseInput) {
    const run = await this.jobs.start('expense.approve', body);
    return { runId: run.id, status: run.status };
  }

  /** The approver's link: resumes the waiting run with the decision. */
  @Post('approvals/:token')
  async decide(@Param('token') token: string, @Body() body: Partial<Decision>) {
    if (typeof body?.approved !== 'boolean') throw new BadRequestException('approved must be true or false');
    const decision: Decision = body.note === undefined ? { approved: body.approved } : { approved: body.approved, note: String(body.note) };
    try {
      return await this.jobs.resume(token, decision);
    } catch (e) {
      // Malformed, unknown, used or expired: one answer for all, so a guesser learns nothing.
      if (e instanceof JobResumeTokenError) throw new NotFoundException('this approval link is not valid (any more)');
      throw e;
    }
  }
}
