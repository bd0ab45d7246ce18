/**
 * The job handlers: Nest providers whose constructor dependencies are
 * injected. Each `ctx.step` is memoized: a retry or a replay of the run
 * returns a completed step's stored output instead of running it again.
 *
 * The example runs under tsx (esbuild), which does not emit
 * `design:paramtypes`, so constructor parameters carry explicit `@Inject`.
 */
import { Inject } from '@nestjs/common';
import { JobHandlerBase, type JobContext } from 'jobforge/nest';
import { OrderJobHandler, type OrderJobs } from './jobs';
import { InventoryService, MailerService, PaymentsService } from './services';

type Fulfil = OrderJobs['order.fulfil'];
type Notify = OrderJobs['order.notify'];

@OrderJobHandler('order.fulfil', {
  pool: 'interactive',
  scope: { entity: 'order', from: (input) => input.orderId },
  retry: { attempts: 3, backoff: 'exponential', baseMs: 200 },
  concurrency: { key: 'order:{{orderId}}', collisionMode: 'reject' },
})
export class FulfilOrderHandler extends JobHandlerBase<Fulfil, unknown, OrderJobs> {
  constructor(
    @Inject(InventoryService) private readonly inventory: InventoryService,
    @Inject(PaymentsService) private readonly payments: PaymentsService,
  ) {
    super();
  }

  async run(ctx: JobContext<Fulfil, OrderJobs>) {
    const { orderId, sku, qty, email, paymentLatencyMs } = ctx.input;
    const reservation = await ctx.step('reserve-stock', async () => this.inventory.reserve(sku, qty));
    const charge = await ctx.step('charge-payment', () =>
      this.payments.charge(orderId, qty * 1_250, paymentLatencyMs ?? 0),
    );
    ctx.logger.log(`order ${orderId} charged (${charge.chargeId})`);
    const notify = await ctx.spawnChild(
      'order.notify',
      { email, text: `Order ${orderId} is on its way` },
      { closePolicy: 'abandon' },
    );
    return { reservationId: reservation.reservationId, chargeId: charge.chargeId, notifyRunId: notify.id };
  }
}

@OrderJobHandler('order.notify', {
  pool: 'batch',
  retry: { attempts: 5, backoff: 'exponential', baseMs: 500 },
})
export class NotifyCustomerHandler extends JobHandlerBase<Notify, unknown, OrderJobs> {
  constructor(@Inject(MailerService) private readonly mailer: MailerService) {
    super();
  }

  async run(ctx: JobContext<Notify, OrderJobs>) {
    const sent = await ctx.step('send-email', async () => this.mailer.send(ctx.input.email, ctx.input.text));
    return { messageId: sent.messageId };
  }
}
