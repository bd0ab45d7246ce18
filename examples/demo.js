// jobforge demo: a short, realistic scenario on the in-memory store.
// Run with `npm run demo` (after `npm install`, which builds the addon).
//
// An order pipeline: each order is charged (a step that fails once and is
// retried in place), then fans out child runs for shipping and email.
// Along the way it shows a concurrency lane, a dedupe hit, a cancel cascade,
// a replay and a schedule fired by the worker, and prints what happened to
// every run. The second part shows durable waits on the worker: a trip
// booking that sleeps, fans out to child runs and joins them, waits for a
// manager's approval link (a resume token) and for a payment signal, and a
// quote whose signal arrives before it runs and whose second wait times out.
'use strict';
const { JobOrchestrator, JobCollisionError, JobWaitTimeoutError } = require('..');

const jobs = new JobOrchestrator({ loggerFactory: () => quietLogger });
const quietLogger = { log() {}, warn() {}, error() {}, debug() {} };
const names = new Map(); // run id → label for the report
const label = (run, name) => (names.set(run.id, name), run);

let chargeFailures = 0;
jobs.registerHandler(
  'order.process',
  {
    pool: 'batch',
    concurrency: { key: 'customer:{{customerId}}', collisionMode: 'queue' },
    dedupe: { key: 'order:{{orderId}}', windowMs: 60_000 },
    retry: { attempts: 2, backoff: 'fixed', baseMs: 10, nonRetryableErrors: ['FraudError'] },
  },
  async (ctx) => {
    const charge = await ctx.step(
      'charge-card',
      async () => {
        if (ctx.input.orderId === 'A-1' && chargeFailures++ === 0) {
          throw new Error('card processor timeout');
        }
        return { chargeId: `ch_${ctx.input.orderId}`, amount: ctx.input.amount };
      },
      { retry: { attempts: 3, backoff: 'fixed', baseMs: 5 } },
    );
    const ship = await ctx.spawnChild('order.ship', { orderId: ctx.input.orderId });
    const mail = await ctx.spawnChild('order.email', { orderId: ctx.input.orderId }, { closePolicy: 'abandon' });
    label(ship, `ship ${ctx.input.orderId}`);
    label(mail, `email ${ctx.input.orderId}`);
    if (ctx.input.orderId === 'B-7') {
      const e = new Error('fraud check rejected the order');
      e.name = 'FraudError'; // listed as non-retryable: fails at once
      throw e;
    }
    return { charged: charge.amount };
  },
);
jobs.registerHandler('order.ship', { retry: { attempts: 1, backoff: 'fixed', baseMs: 0 } }, async (ctx) => ({
  tracking: `TRK-${ctx.input.orderId}`,
}));
jobs.registerHandler('order.email', {}, async (ctx) => ({ sent: `receipt for ${ctx.input.orderId}` }));
jobs.registerHandler(
  'report.nightly',
  { concurrency: { key: 'report', collisionMode: 'reject' }, replayFrom: 'last_step' },
  async (ctx) => {
    const rows = await ctx.step('load', async () => ({ rows: 1234 }));
    if (!ctx.run.error && ctx.run.attempts === 0 && !globalThis.reportFixed) throw new Error('warehouse unavailable');
    return { exported: rows.rows };
  },
);

jobs.registerHandler('stock.sync', {}, async (ctx) => ({ synced: ctx.input.warehouse }));

// ── durable waits ──
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const approvalLinks = new Map(); // run id → the link deliver() "mailed"
let tripExecutions = 0;
// timeoutMs counts per execution: the time parked in waits does not count.
jobs.registerHandler('trip.plan', { pool: 'trips', timeoutMs: 2_000 }, async (ctx) => {
  tripExecutions++; // every resumption runs the handler again from the top
  await ctx.sleep('cool-off', 150);
  // Fan-out / fan-in: the three bookings run as child runs while this run waits.
  const bookings = await Promise.all(
    ['flight', 'hotel', 'car'].map((item) => ctx.invoke(`book-${item}`, 'trip.book', { item, city: ctx.input.city })),
  );
  const approval = await ctx.waitForToken('approval', (token) => {
    approvalLinks.set(ctx.run.id, `https://example.test/approve/${token}`);
  });
  const payment = await ctx.waitForSignal('payment', { timeoutMs: 5_000 });
  return { bookings: bookings.map((b) => b.ref), approvedBy: approval.by, paid: payment.amount };
});
jobs.registerHandler('trip.book', { pool: 'trips' }, async (ctx) => {
  // A supplier call: a step, so a re-run would not book twice.
  return ctx.step('reserve', async () => (await sleep(60), { ref: `${ctx.input.item}@${ctx.input.city}` }));
});
jobs.registerHandler('quote.send', { pool: 'quotes' }, async (ctx) => {
  const accepted = await ctx.waitForSignal('accept'); // sent before the run started: taken from its inbox
  try {
    await ctx.waitForSignal('counter-offer', { timeoutMs: 100 });
    return { accepted, counter: true };
  } catch (e) {
    if (!(e instanceof JobWaitTimeoutError)) throw e;
    return { accepted, counterOffer: `none within ${e.timeoutMs} ms` };
  }
});

/** Claims and executes runs until nothing is due for `idleMs`. */
async function drain(pools = ['batch'], idleMs = 40) {
  let idleSince = Date.now();
  while (Date.now() - idleSince < idleMs) {
    let ran = false;
    for (const pool of pools) {
      const run = await jobs.claimNext(pool);
      if (run) {
        ran = true;
        await jobs.tick(run.id);
      }
    }
    if (ran) idleSince = Date.now();
    else await new Promise((r) => setTimeout(r, 2));
  }
}

async function main() {
  console.log('jobforge demo (in-memory store)\n');

  // 1. Two orders for one customer share a lane: they run one at a time.
  const a1 = label(await jobs.start('order.process', { orderId: 'A-1', customerId: 'c1', amount: 40 }), 'order A-1');
  const a2 = label(await jobs.start('order.process', { orderId: 'A-2', customerId: 'c1', amount: 15 }), 'order A-2');
  console.log(`lane customer:c1 holds ${a1.id.slice(0, 8)} then ${a2.id.slice(0, 8)}`);

  // 2. A duplicate submission of A-1 inside the dedupe window returns the same run.
  const dup = await jobs.start('order.process', { orderId: 'A-1', customerId: 'c1', amount: 40 });
  console.log(`dedupe: second start of A-1 returned ${dup.id === a1.id ? 'the same run' : 'a NEW run (unexpected)'}`);

  // 3. An order whose handler fails after spawning children: the failure
  //    cascades to the 'terminate' child, the 'abandon' child is left alone.
  const b7 = label(await jobs.start('order.process', { orderId: 'B-7', customerId: 'c2', amount: 99 }), 'order B-7');

  // 4. A report that fails once, then is replayed with its first step memoized.
  const report = label(await jobs.start('report.nightly', {}), 'nightly report');
  try {
    await jobs.start('report.nightly', {});
  } catch (e) {
    if (e instanceof JobCollisionError) console.log(`reject lane: second report refused (${e.code}), incumbent ${e.incumbent.id.slice(0, 8)}`);
  }

  await drain();

  // 5. A scheduled order in the future, canceled with its whole subtree.
  const later = label(
    await jobs.start('order.process', { orderId: 'C-3', customerId: 'c3', amount: 5 }, { runAt: new Date(Date.now() + 60_000) }),
    'order C-3 (scheduled)',
  );
  const kid = label(await jobs.start('order.ship', { orderId: 'C-3' }, { parentRunId: later.id }), 'ship C-3 (child)');
  await jobs.cancel(later.id, { reason: 'customer changed their mind' });
  console.log(`cancel cascade: C-3 ${(await jobs.findById(later.id)).status}, its child ${(await jobs.findById(kid.id)).status}`);

  globalThis.reportFixed = true;
  const replayed = await jobs.replay(report.id);
  console.log(`replay: nightly report back to ${replayed.status}, kept steps: ${(await jobs.listSteps(report.id)).map((s) => s.stepId).join(', ')}`);
  await drain();

  // 6. A schedule: every 100 ms the engine starts a stock sync, and the
  //    worker (a Rust scheduler calling this process's handlers) runs it.
  await jobs.schedule('stock.sync', { jobType: 'stock.sync', input: { warehouse: 'north' }, everyMs: 100 });
  const worker = jobs.startWorker();
  await new Promise((r) => setTimeout(r, 350));
  await jobs.unschedule('stock.sync');
  await worker.stop();
  const synced = (await jobs.listJobRuns({ limit: 500 })).items.filter((r) => r.triggerRef === 'stock.sync').reverse();
  synced.forEach((r, i) => names.set(r.runId, `stock.sync #${i + 1}`));
  const gaps = synced.slice(1).map((r, i) => r.runAt.getTime() - synced[i].runAt.getTime());
  console.log(`schedule: stock.sync fired ${synced.length} times by the worker, ${gaps.join(' / ')} ms apart`);

  console.log('\nwhat happened to each run:');
  for (const [id, name] of names) {
    const run = await jobs.findById(id);
    const steps = await jobs.listSteps(id);
    const detail =
      run.status === 'completed'
        ? `output ${JSON.stringify(run.output)}`
        : run.error
          ? `error "${run.error.message}"`
          : '';
    const stepInfo = steps.length ? ` steps [${steps.map((s) => `${s.stepId}:${s.status}x${s.attempts}`).join(' ')}]` : '';
    console.log(`  ${name.padEnd(22)} ${run.status.padEnd(9)} attempts=${run.attempts} ${detail}${stepInfo}`);
  }

  await durableWaits();
}

/**
 * Part two: durable waits on the worker (system clock). The `trips` pool
 * has one slot: the bookings can run only because their waiting parent
 * gives its slot up while it is parked.
 */
async function durableWaits() {
  console.log('\ndurable waits (worker, pool "trips" with one slot):');
  const worker = jobs.startWorker({ pools: { trips: { concurrency: 1 }, quotes: { concurrency: 1 } } });
  const t0 = Date.now();
  const at = () => `+${String(Date.now() - t0).padStart(4)} ms`;

  const quote = await jobs.start('quote.send', { tripFor: 'ada' }, { runAt: new Date(Date.now() + 50) });
  const early = await jobs.signal(quote.id, 'accept', { price: 420 });
  console.log(`${at()}  quote: signal 'accept' sent before it ran → delivered=${early.delivered} (kept in its inbox)`);

  const trip = await jobs.start('trip.plan', { city: 'Lisbon' });
  let last = '';
  for (;;) {
    const run = await jobs.findById(trip.id);
    const state = run.status === 'waiting' ? `waiting (waitKind=${run.waitKind})` : run.status;
    if (state !== last) {
      const resumed = last.startsWith('waiting') && run.status === 'pending' ? ' (a wait resolved: due now, runs again from the top)' : '';
      last = state;
      const deadline = run.waitDeadline ? `, resumes by +${run.waitDeadline.getTime() - t0} ms` : '';
      const kids = run.waitKind === 'child' ? `, children: ${(await jobs.getRunTree(trip.id)).children.map((c) => c.run.status).join(' ')}` : '';
      console.log(`${at()}  trip:  ${state} attempts=${run.attempts}${deadline}${kids}${resumed}`);
    }
    if (run.status === 'waiting' && run.waitKind === 'token' && approvalLinks.has(trip.id)) {
      const link = approvalLinks.get(trip.id);
      approvalLinks.delete(trip.id);
      const token = link.slice(link.lastIndexOf('/') + 1);
      const { runId } = await jobs.resume(token, { by: 'manager' });
      console.log(`${at()}  the manager opened ${link.slice(0, 42)}… → resume() resumed ${runId === trip.id ? 'the trip' : runId}`);
    }
    if (run.status === 'waiting' && run.waitKind === 'signal') {
      const { delivered } = await jobs.signal(trip.id, 'payment', { amount: 1290 });
      console.log(`${at()}  the bank sent signal 'payment' → delivered=${delivered}`);
    }
    if (['completed', 'failed', 'timed_out', 'canceled'].includes(run.status)) break;
    await sleep(2);
  }
  const done = await jobs.findById(trip.id);
  console.log(`        trip:  output ${JSON.stringify(done.output)}; handler ran ${tripExecutions} times in one attempt`);
  console.log(`        trip steps: ${(await jobs.listSteps(trip.id)).map((s) => `${s.stepId}(${s.kind}):${s.status}`).join(' ')}`);
  const q = await jobs.waitForRun(quote.id, { timeoutMs: 2_000 });
  console.log(`        quote: ${q.status} output ${JSON.stringify(q.output)}`);
  await worker.stop();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
