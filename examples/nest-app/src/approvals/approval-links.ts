/**
 * Stand-in for mailing the approver a link. A real app emails it and keeps
 * nothing (the token is the credential; jobforge stores only its hash);
 * this example logs it so that you can curl it.
 */
import { Injectable, Logger } from '@nestjs/common';

@Injectable()
export class ApprovalLinks {
  private readonly logger = new Logger('Approvals');

  send(approver: string, runId: string, token: string): void {
    this.logger.log(`approval link for run ${runId} sent to ${approver}: POST /approvals/${token}`);
  }
}
