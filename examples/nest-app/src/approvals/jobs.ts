/** The approval flow's job map (checked like `OrderJobs`, see ../orders/jobs.ts). */
import { typedJobHandler } from 'jobforge/nest';

export interface ExpenseInput {
  expenseId: string;
  amountCents: number;
  approver: string;
}

/** What the approver POSTs to `/approvals/:token`: the payload the waiting run resumes with. */
export interface Decision {
  approved: boolean;
  note?: string;
}

export interface ApprovalJobs {
  'expense.approve': ExpenseInput;
}

export const ApprovalJobHandler = typedJobHandler<ApprovalJobs>();
