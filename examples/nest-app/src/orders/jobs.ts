/**
 * The app's job map: job type → input. The orchestrator injected as
 * `IJobOrchestrator<OrderJobs>` checks every `start` against it, and
 * `@OrderJobHandler` checks each handler's type, key functions and `run`.
 */
import { typedJobHandler } from 'jobforge/nest';

export interface FulfilOrderInput {
  orderId: string;
  sku: string;
  qty: number;
  email: string;
  /** Simulated payment-gateway latency (shows draining on shutdown). */
  paymentLatencyMs?: number;
}

export interface OrderJobs {
  'order.fulfil': FulfilOrderInput;
  'order.notify': { email: string; text: string };
}

export const OrderJobHandler = typedJobHandler<OrderJobs>();
