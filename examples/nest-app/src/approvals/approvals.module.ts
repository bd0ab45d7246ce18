import { Module } from '@nestjs/common';
import { ApprovalLinks } from './approval-links';
import { ApproveExpenseHandler } from './approval.handler';
import { ApprovalsController } from './approvals.controller';

@Module({
  controllers: [ApprovalsController],
  providers: [ApprovalLinks, ApproveExpenseHandler],
})
export class ApprovalsModule {}
