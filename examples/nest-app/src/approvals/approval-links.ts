/**
 * Stand-in for mailing the approver a link. A real app sends it and keeps
 * nothing: the token is the credential, and jobforge stores only its hash.
 * Here the link is kept in memory and logged, so you can curl it.
 */
import { Injectable, Logger } from '@nestjs/common';

@Injectable()
export class ApprovalLinks {
  private readonly logger = new Logger('Approvals');
  /** approver → links sent to them, newest last. */
  readonly sent = new Map<string, string[]>();

  send(approver: string, runId: string, token: string): void {
    const link = `/approvals/${token}`;
    this.sent.set(approver, [...(this.sent.get(approver) ?? []), link]);
    this.logger.log(`approval link for run ${runId} sent to ${approver}: POST ${link}`);
  }
}
