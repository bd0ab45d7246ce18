/** Stand-ins for the app's real collaborators (a stock DB, a payment gateway, a mailer). */
import { Injectable } from '@nestjs/common';

@Injectable()
export class InventoryService {
  private readonly stock = new Map<string, number>([
    ['sku-book', 10],
    ['sku-lamp', 2],
  ]);

  reserve(sku: string, qty: number): { reservationId: string; left: number } {
    const have = this.stock.get(sku) ?? 0;
    if (qty > have) throw new Error(`only ${have} of ${sku} left`);
    this.stock.set(sku, have - qty);
    return { reservationId: `res-${sku}-${Date.now()}`, left: have - qty };
  }
}

@Injectable()
export class PaymentsService {
  async charge(orderId: string, amountCents: number, latencyMs = 0): Promise<{ chargeId: string }> {
    if (latencyMs > 0) await new Promise((r) => setTimeout(r, latencyMs));
    return { chargeId: `ch-${orderId}-${amountCents}` };
  }
}

@Injectable()
export class MailerService {
  readonly outbox: { to: string; text: string }[] = [];

  send(to: string, text: string): { messageId: string } {
    this.outbox.push({ to, text });
    return { messageId: `msg-${this.outbox.length}` };
  }
}
