import { Body, ConflictException, Controller, Get, HttpCode, Inject, NotFoundException, Param, Post } from '@nestjs/common';
import { JOB_ORCHESTRATOR, JOB_RUN_SERVICE, JobCollisionError } from 'jobforge/nest';
import type { IJobOrchestrator, IJobRunService, JobRun, JobStep } from 'jobforge/nest';
import type { FulfilOrderInput, OrderJobs } from './jobs';

const stepView = (s: JobStep) => ({
  stepId: s.stepId,
  seq: s.seq,
  status: s.status,
  attempts: s.attempts,
  output: s.output,
});

const runView = (r: JobRun) => ({
  id: r.id,
  jobType: r.jobType,
  status: r.status,
  // While the run is parked on a durable wait: what it waits for.
  waitKind: r.waitKind,
  attempts: r.attempts,
  parentRunId: r.parentRunId,
  scope: r.scopeEntityType ? `${r.scopeEntityType}:${r.scopeEntityId}` : null,
  output: r.output,
  error: r.error?.message ?? null,
});

@Controller()
export class OrdersController {
  constructor(
    @Inject(JOB_ORCHESTRATOR) private readonly jobs: IJobOrchestrator<OrderJobs>,
    @Inject(JOB_RUN_SERVICE) private readonly runs: IJobRunService,
  ) {}

  /** Enqueues the fulfilment job; the worker picks it up right away. */
  @Post('orders')
  @HttpCode(202)
  async placeOrder(@Body() body: FulfilOrderInput) {
    try {
      const run = await this.jobs.start('order.fulfil', body);
      return { runId: run.id, status: run.status };
    } catch (e) {
      // One fulfilment per order at a time (the handler's `reject` concurrency key).
      if (e instanceof JobCollisionError) throw new ConflictException(`order ${body.orderId} is already being fulfilled (run ${e.incumbent.id})`);
      throw e;
    }
  }

  /** A run, its steps, and its child runs with their steps. */
  @Get('jobs/:id')
  async status(@Param('id') id: string) {
    const run = await this.runs.findById(id);
    if (!run) throw new NotFoundException(`run ${id} not found`);
    // The tree's runs as a page lists them (summaries), oldest first; each child is then read whole.
    const { items } = await this.runs.listJobRuns({ rootRunId: run.rootRunId, limit: 100 });
    const childIds = items.filter((r) => r.parentRunId === run.id).reverse().map((r) => r.runId);
    const children = (await Promise.all(childIds.map((c) => this.runs.getRun(c)))).filter((c): c is JobRun => c !== null);
    return {
      run: runView(run),
      steps: (await this.runs.listSteps(run.id)).map(stepView),
      children: await Promise.all(
        children.map(async (c) => ({ run: runView(c), steps: (await this.runs.listSteps(c.id)).map(stepView) })),
      ),
    };
  }

  /** Every run of an order (the handler's `scope`). */
  @Get('orders/:orderId/jobs')
  async orderJobs(@Param('orderId') orderId: string) {
    return (await this.runs.listForScope('order', orderId)).map(runView);
  }
}
