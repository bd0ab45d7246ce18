import { Module } from '@nestjs/common';
import { FulfilOrderHandler, NotifyCustomerHandler } from './handlers';
import { OrdersController } from './orders.controller';
import { InventoryService, MailerService, PaymentsService } from './services';

@Module({
  controllers: [OrdersController],
  // Handler classes are providers: JobsModule resolves them (and what they inject) per run.
  providers: [InventoryService, PaymentsService, MailerService, FulfilOrderHandler, NotifyCustomerHandler],
})
export class OrdersModule {}
