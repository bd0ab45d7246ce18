import { Module } from '@nestjs/common';
import { JobsModule } from 'jobforge/nest';
import { ApprovalsModule } from './approvals/approvals.module';
import { OrdersModule } from './orders/orders.module';

@Module({
  imports: [
    JobsModule.forRoot({
      pools: { interactive: { concurrency: 10 }, batch: { concurrency: 5 } },
      worker: { shutdownTimeoutMs: 15_000 },
    }),
    OrdersModule,
    ApprovalsModule,
  ],
})
export class AppModule {}
