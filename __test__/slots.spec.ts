// A pool's concurrency bounds the handlers actually running: a run may turn
// timed_out or canceled at once, but its slot stays taken until its handler's
// promise settles, or until `abandonAfterMs` has passed (then the slot is
// freed and the worker says so, once). Both backends; the manual clock moves
// the timeouts, real time only proves that something did not happen.
import test from 'ava';
import { JobInputInvalidError } from '../dist';
import type { JobContext, JobLogger, JobOrchestrator, JobRun, WorkerOptions } from '../dist';
import { PG_URL, forBackends, postgresOnly } from './backends';
import { realSleep, silentLogger, system, waitFor } from './helpers';

/** Long enough on a loaded 2-core machine for a freed slot to take the next run. */
const SETTLE_MS = 150;

/**
 * A handler that ignores `ctx.signal` and runs until the test releases it;
 * counts the handlers running at once.
 */
function stubborn(): {
  handler: (ctx: JobContext<unknown>) => Promise<unknown>;
  entered: { runId: string; signal: AbortSignal; release: () => void }[];
  running: () => number;
  most: () => number;
} {
  let running = 0;
  let most = 0;
  const entered: { runId: string; signal: AbortSignal; release: () => void }[] = [];
  const handler = (ctx: JobContext<unknown>): Promise<unknown> => {
    running++;
    most = Math.max(most, running);
    let done = false;
    return new Promise((resolve) => {
      entered.push({
        runId: ctx.run.id,
        signal: ctx.signal,
        release: () => {
          if (done) return;
          done = true;
          running--;
          resolve({ late: true });
        },
      });
    });
  };
  return { handler, entered, running: () => running, most: () => most };
}

async function status(o: JobOrchestrator, id: string): Promise<string> {
  const r: JobRun | null = await o.findById(id);
  return r?.status ?? 'missing';
}

/** A logger that records what the orchestrator says. */
function recording(): { logger: JobLogger; lines: string[] } {
  const lines: string[] = [];
  const say = (...a: unknown[]) => lines.push(a.map(String).join(' '));
  return { logger: { log: say, warn: say, error: say, debug: () => undefined }, lines };
}

const abandoned = (lines: string[], runId: string) => lines.filter((l) => l.includes(runId) && /abandon/i.test(l));

forBackends('timeoutMs 30, concurrency 1: handlers that ignore their signal run one at a time, not six at once', async (t, make) => {
  const o = await make.manual();
  const h = stubborn();
  o.registerHandler('stubborn', { timeoutMs: 30 }, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 100 });
  t.teardown(() => w.stop());
  const runs: JobRun[] = [];
  for (let i = 0; i < 6; i++) runs.push(await o.start('stubborn', { i }));
  await waitFor(() => h.entered.length === 1, 'the first handler to start', 5000);

  // Time out whatever runs, six times over: each time the run turns
  // timed_out at once, and its handler, ignoring the signal, goes on.
  for (let i = 0; i < 6; i++) {
    o.advanceTime(30);
    const running = h.entered.map((e) => e.runId);
    await waitFor(
      async () => (await Promise.all(running.map((id) => status(o, id)))).every((s) => s === 'timed_out'),
      'the running runs to time out',
      5000,
    );
    await realSleep(SETTLE_MS);
  }
  t.is(h.most(), 1, `${h.most()} handlers of a pool of concurrency 1 ran at once`);
  t.is(h.entered.length, 1, 'the timed-out handler still holds the only slot');
  t.true(h.entered[0]!.signal.aborted, 'its signal fired');
  t.is(await status(o, runs[0]!.id), 'timed_out', 'the run turned timed_out at once');
  // Not started (h.entered above); a PostgreSQL worker may hold it claimed in its prefetch queue.
  t.true(['pending', 'running'].includes(await status(o, runs[1]!.id)));
  t.is(w.inFlight, 1, 'inFlight counts the handler still running after its timeout');

  // Each handler that settles frees the slot for the next run, which times
  // out in its turn; a late result changes nothing.
  for (let i = 1; i < 6; i++) {
    h.entered[i - 1]!.release();
    await waitFor(() => h.entered.length === i + 1, `handler ${i + 1} to start once the slot is free`, 5000);
    t.is(await status(o, runs[i - 1]!.id), 'timed_out', 'a late result is ignored');
    o.advanceTime(30);
    await waitFor(async () => (await status(o, runs[i]!.id)) === 'timed_out', `run ${i + 1} to time out`, 5000);
    await realSleep(SETTLE_MS);
    t.is(h.entered.length, i + 1, `run ${i + 1}'s handler holds the slot after its timeout`);
  }
  t.is(h.most(), 1);
  h.entered[5]!.release();
  await waitFor(() => w.inFlight === 0, 'the last handler to settle', 5000);
  t.is(h.running(), 0);
});

forBackends('cancel of a running run that ignores its signal: the slot stays taken until the handler settles', async (t, make) => {
  const o = await make.system();
  const h = stubborn();
  o.registerHandler('stubborn', {}, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 100 });
  t.teardown(() => w.stop());
  const first = await o.start('stubborn', {});
  const second = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the first handler to start', 5000);
  await o.cancel(first.id);
  t.true(h.entered[0]!.signal.aborted);
  t.is(await status(o, first.id), 'canceled', 'canceled at once');
  await realSleep(SETTLE_MS);
  t.is(h.entered.length, 1, 'the next run waits for the canceled handler to settle');
  // Not started; a PostgreSQL worker may hold it claimed in its prefetch queue.
  t.true(['pending', 'running'].includes(await status(o, second.id)));
  t.is(w.inFlight, 1);
  h.entered[0]!.release();
  await waitFor(() => h.entered.length === 2, 'the next run to start', 5000);
  t.is(h.most(), 1);
  t.is(await status(o, first.id), 'canceled', 'the late result is ignored');
  h.entered[1]!.release();
  t.is((await o.waitForRun(second.id, { timeoutMs: 5000 })).status, 'completed');
});

forBackends('abandonAfterMs: a handler still running that long after its timeout is abandoned, said once; its late settle frees nothing', async (t, make) => {
  const { logger, lines } = recording();
  const o = await make.manual({ logger, loggerFactory: () => silentLogger });
  const h = stubborn();
  o.registerHandler('stubborn', { timeoutMs: 30 }, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 100, abandonAfterMs: 1000 });
  t.teardown(() => w.stop());
  const first = await o.start('stubborn', {});
  const second = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the first handler to start', 5000);
  o.advanceTime(30);
  await waitFor(
    async () => h.entered[0]!.signal.aborted && (await status(o, first.id)) === 'timed_out',
    'the first run to time out',
    5000,
  );
  o.advanceTime(999);
  await realSleep(SETTLE_MS);
  t.is(h.entered.length, 1, 'held until abandonAfterMs has passed');
  t.is(w.inFlight, 1);
  t.deepEqual(abandoned(lines, first.id), [], 'nothing said before abandonAfterMs');

  o.advanceTime(1);
  await waitFor(() => h.entered.length === 2, 'the abandoned slot to take the next run', 5000);
  t.is(abandoned(lines, first.id).length, 1, 'said once');
  t.regex(abandoned(lines, first.id)[0]!, /slot/i, 'the log says the slot is freed');
  t.is(w.inFlight, 1, 'the abandoned handler is not counted, the new one is');

  // The abandoned handler settling late frees nothing (the slot is the new run's).
  h.entered[0]!.release();
  await realSleep(SETTLE_MS);
  t.is(await status(o, first.id), 'timed_out');
  t.is(await status(o, second.id), 'running');
  const third = await o.start('stubborn', {});
  await realSleep(SETTLE_MS);
  t.is(h.entered.length, 2, 'the late settle did not free a second slot');
  // Not started; a PostgreSQL worker may hold it claimed in its prefetch queue.
  t.true(['pending', 'running'].includes(await status(o, third.id)));
  t.is(abandoned(lines, first.id).length, 1, 'still said once');

  h.entered[1]!.release();
  await waitFor(() => h.entered.length === 3, 'the third run to start', 5000);
  t.is(h.most(), 2, 'only the abandoned handler ran beside another');
  h.entered[2]!.release();
  t.is((await o.waitForRun(third.id, { timeoutMs: 5000 })).status, 'completed');
  t.is(w.inFlight, 0);
});

forBackends('abandonAfterMs counts from a cancel too', async (t, make) => {
  const { logger, lines } = recording();
  const o = await make.manual({ logger, loggerFactory: () => silentLogger });
  const h = stubborn();
  o.registerHandler('stubborn', {}, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 100, abandonAfterMs: 500 });
  t.teardown(() => w.stop());
  const first = await o.start('stubborn', {});
  const second = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the first handler to start', 5000);
  await o.cancel(first.id);
  await waitFor(() => h.entered[0]!.signal.aborted, 'the signal', 5000);
  o.advanceTime(499);
  await realSleep(SETTLE_MS);
  t.is(h.entered.length, 1);
  o.advanceTime(1);
  await waitFor(() => h.entered.length === 2, 'the abandoned slot to take the next run', 5000);
  t.is(abandoned(lines, first.id).length, 1);
  t.regex(abandoned(lines, first.id)[0]!, /canceled/);
  h.entered[0]!.release();
  h.entered[1]!.release();
  t.is((await o.waitForRun(second.id, { timeoutMs: 5000 })).status, 'completed');
});

forBackends('stop() with a handler that ignores its signal: back to pending, abandoned a moment after the abort', async (t, make) => {
  const o = await make.system();
  const h = stubborn();
  o.registerHandler('stubborn', {}, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 100 });
  const r = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the handler to start', 5000);
  const t0 = Date.now();
  await w.stop();
  const took = Date.now() - t0;
  // shutdownTimeoutMs, then a second at most for the aborted handler to settle.
  t.true(took >= 90 && took < 100 + 1000 + 2000, `stop() took ${took} ms`);
  t.true(h.entered[0]!.signal.aborted, 'aborted at shutdown');
  t.is(h.running(), 1, 'the handler still runs');
  t.is(w.inFlight, 0, 'abandoned: not counted');
  t.is(await status(o, r.id), 'pending', 'its run is back to pending');
  h.entered[0]!.release();
  await realSleep(SETTLE_MS);
  t.is(await status(o, r.id), 'pending', 'its late result is ignored');
});

forBackends('stop() waits for a timed-out handler still running, within shutdownTimeoutMs', async (t, make) => {
  const o = await make.manual();
  const h = stubborn();
  o.registerHandler('stubborn', { timeoutMs: 30 }, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 1 } }, shutdownTimeoutMs: 5000 });
  const r = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the handler to start', 5000);
  o.advanceTime(30);
  await waitFor(async () => (await status(o, r.id)) === 'timed_out', 'the run to time out', 5000);
  let stopped = false;
  const stopping = w.stop().then(() => (stopped = true));
  await realSleep(SETTLE_MS);
  t.false(stopped, 'stop() drains the handler that still runs');
  t.is(w.inFlight, 1);
  h.entered[0]!.release();
  await stopping;
  t.is(w.inFlight, 0);
  t.is(await status(o, r.id), 'timed_out');
});

test('bad abandonAfterMs → JobInputInvalidError, and no worker is left running', async (t) => {
  const o = system();
  o.registerHandler('x', {}, async () => ({}));
  for (const abandonAfterMs of [-1, Number.NaN, '100', true, {}]) {
    t.throws(
      () => o.startWorker({ abandonAfterMs } as unknown as WorkerOptions),
      { instanceOf: JobInputInvalidError, message: /abandonAfterMs/ },
      String(abandonAfterMs),
    );
  }
  // Zero (abandon at once) and Infinity (never) are accepted.
  for (const abandonAfterMs of [0, Number.POSITIVE_INFINITY]) {
    const w = o.startWorker({ abandonAfterMs });
    await w.stop();
  }
  const r = await o.start('x', {});
  await realSleep(50);
  t.is(await status(o, r.id), 'pending', 'the rejected calls started nothing');
});

// A new attempt of a run (here a replay) claimed into this worker's other slot
// while the canceled attempt's handler still runs: that handler settling must
// not stop the renewal of the new attempt's lease (the sweeper would put it
// back to pending and run it twice).
postgresOnly("a canceled handler settling late keeps the lease of its run's next attempt here", async (t, make) => {
  const o = await make.system({ postgres: { url: PG_URL, leaseMs: 1000 } });
  const h = stubborn();
  o.registerHandler('stubborn', {}, h.handler);
  const w = o.startWorker({ pools: { batch: { concurrency: 2 } }, shutdownTimeoutMs: 100 });
  t.teardown(async () => {
    for (const e of h.entered) e.release();
    await w.stop();
  });
  const r = await o.start('stubborn', {});
  await waitFor(() => h.entered.length === 1, 'the handler to start', 5000);
  await o.cancel(r.id);
  await o.replay(r.id);
  await waitFor(() => h.entered.length === 2, 'the replay to start beside the canceled handler', 5000);
  t.is(h.most(), 2);
  h.entered[0]!.release();
  // Several lease periods: an unrenewed lease would have been swept.
  await realSleep(3500);
  t.is(h.entered.length, 2, 'the new attempt was not swept and run again');
  t.is(await status(o, r.id), 'running');
  h.entered[1]!.release();
  t.is((await o.waitForRun(r.id, { timeoutMs: 5000 })).status, 'completed');
});
