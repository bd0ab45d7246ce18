/**
 * The worker's JS side: the attempts the engine's worker hands over (in
 * batches through its threadsafe function, or in the answer of a call),
 * executed here, their outcomes reported in batches, and a graceful stop.
 * The engine's worker decides what to claim and when; this holds the
 * slots' JS half and keeps Node alive while it runs.
 */
import { after } from './clock';
import type { Backend, WorkerLink } from './backend/backend';
import type { Attempt, Attempts } from './execution/attempt';
import type { Executor } from './execution/executor';
import type { JobLogger } from './handler';
import { reportLine, type Outcome, type Ticket } from './wire';

export interface WorkerHandle {
  /**
   * Stops claiming, lets in-flight handlers finish for up to
   * `shutdownTimeoutMs`, then aborts the rest and puts their runs back to
   * `pending` (nothing is lost). Handlers still running a moment after
   * that abort (they ignore `ctx.signal`) are abandoned.
   * Resolves when no attempt is in flight.
   */
  stop(): Promise<void>;
  readonly running: boolean;
  /**
   * Handlers running right now, including those whose run already timed
   * out or was canceled (they hold their slot until they settle); not
   * those abandoned after `abandonAfterMs`.
   */
  readonly inFlight: number;
}

/**
 * A finished attempt is reported this many microtask turns after it ends,
 * so the outcomes (and buffered starts) of async chains running side by
 * side share one native call. Each turn costs tens of nanoseconds; the
 * native call costs ~0.6 µs. Measured in bench/worker.js: 2 runs per call
 * at 1 turn, 4 at 3; 244k jobs/s at 1 turn, 283-290k at 3, less at 5.
 */
const REPORT_TURNS = 3;

/**
 * Reports and the tickets they claim run in microtasks: handlers that
 * settle without I/O (quick jobs, a backlog, a job that starts its
 * successor) would chain forever and starve timers, I/O and signal
 * handlers. After this long without a turn of the event loop, the next
 * report waits for one (setImmediate). A turn costs microseconds, so
 * throughput does not notice.
 */
const WORKER_SLICE_MS = 5;

/**
 * After stop()'s shutdown abort, how long (wall time, at most
 * `abandonAfterMs`) the aborted handlers get to settle before stop()
 * abandons them: one that honours its signal settles within a few ms.
 */
const SHUTDOWN_ABORT_GRACE_MS = 1000;

/** An attempt that ended, waiting for the next report. */
interface Ended {
  ticket: Ticket;
  attempt: Attempt;
}

/**
 * An aborted attempt (timed out, canceled, shut down) whose handler still
 * runs: it keeps its slot until the handler settles or is abandoned.
 */
interface Held {
  ticket: Ticket;
  attempt: Attempt;
  /** Cancels the `abandonAfterMs` timer. */
  cancel: () => void;
}

export class WorkerRuntime implements WorkerLink {
  running = true;
  /** True once stop() has drained (or released) every attempt. */
  stopped = false;
  /** Slots held on the JS side: attempts executing or not yet reported. */
  private active = 0;
  /** The same, per pool (a hint for feeding idle slots at once). */
  private readonly activeIn = new Map<string, number>();
  /** Attempts executing: handlers running, aborted ones too until they settle or are abandoned. */
  private executing = 0;
  /** Aborted attempts whose handlers still run, holding their slots. */
  private readonly held = new Set<Held>();
  private readonly releasedRuns = new Set<string>();
  private idle: (() => void)[] = [];
  private stopping: Promise<void> | null = null;
  /** A running worker keeps Node alive, like a server socket would. */
  private keepAlive: NodeJS.Timeout | null = setInterval(() => undefined, 0x7fffffff);
  /** Position of each pool in the list the engine's worker was given. */
  private readonly slotOf: Map<string, number>;
  private reportText = '';
  private reportItems: Ended[] = [];
  private reportArmed = false;
  /** Microtask turns left before the queued outcomes are reported. */
  private reportTurns = 0;
  /** When the reports began chaining without a turn of the event loop (performance.now()), or -1. */
  private sliceStart = -1;

  constructor(
    private readonly backend: Backend,
    private readonly executor: Executor,
    private readonly attempts: Attempts,
    private readonly logger: JobLogger,
    private readonly capacity: Map<string, number>,
    private readonly shutdownTimeoutMs: number,
    private readonly abandonAfterMs: number,
  ) {
    this.slotOf = new Map([...capacity.keys()].map((name, i) => [name, i]));
  }

  /** Starts the engine's worker for these pools; on failure the runtime lets Node exit. */
  start(pools: { name: string; concurrency: number }[]): WorkerHandle {
    try {
      this.backend.startWorker(pools, (text) => this.onBatch(text), this);
    } catch (e) {
      this.discard();
      throw e;
    }
    return this.handle();
  }

  /** A runtime whose engine worker was never started: lets Node exit. */
  private discard(): void {
    this.running = false;
    if (this.keepAlive) clearInterval(this.keepAlive);
    this.keepAlive = null;
  }

  get busy(): boolean {
    return this.active > 0;
  }

  /** Fewer JS loops than slots in `pool` (or in any pool): a hint, batches in transit are not counted. */
  hasIdleSlot(pool?: string): boolean {
    if (pool !== undefined) return (this.activeIn.get(pool) ?? 0) < (this.capacity.get(pool) ?? 0);
    for (const [name, cap] of this.capacity) if ((this.activeIn.get(name) ?? 0) < cap) return true;
    return false;
  }

  private enter(pool: string): void {
    this.active++;
    this.activeIn.set(pool, (this.activeIn.get(pool) ?? 0) + 1);
  }

  private leave(pool: string): void {
    this.active--;
    this.activeIn.set(pool, (this.activeIn.get(pool) ?? 1) - 1);
    if (this.active === 0) for (const f of this.idle.splice(0)) f();
  }

  private drained(): Promise<void> {
    return this.active === 0 ? Promise.resolve() : new Promise((r) => this.idle.push(r));
  }

  /** A batch from the engine's worker thread: tickets one per line, or a `!` notice. */
  private onBatch(text: string): void {
    if (text.startsWith('!')) {
      // A notice from the engine's worker loop (database trouble, rate-limited there).
      this.logger.error(`jobforge: ${text.slice(1)}`);
      return;
    }
    // The scheduler's tickets crossed threads: a run may have been canceled meanwhile.
    this.take(text, 0, true);
  }

  /**
   * Lines of a call's answer from `from` on: tickets the call claimed into
   * idle slots, `!<line> <message>` for a buffered start the engine
   * refused (its checks ran in JS first, so this means a bug, reported
   * rather than lost silently) and `?<message>` for an outcome it could
   * not record.
   */
  deliver(reply: string, from: number): void {
    this.take(reply, from, false);
  }

  private take(text: string, from: number, crossedThreads: boolean): void {
    for (const line of text.slice(from).split('\n')) {
      if (line.length === 0) continue;
      const c = line.charCodeAt(0);
      if (c === 33) {
        this.logger.error(`jobforge: a buffered start was not created: ${line.slice(1)}`);
        continue;
      }
      if (c === 63) {
        this.logger.error(`jobforge: recording a worker outcome failed: ${line.slice(1)}`);
        continue;
      }
      let ticket: Ticket;
      try {
        ticket = this.backend.tickets.read(line);
      } catch (e) {
        this.logger.error('jobforge: unreadable worker ticket', e);
        continue;
      }
      if (this.running) this.execute(ticket, crossedThreads);
      else this.release(ticket); // claimed just before stop(): back to pending, slot freed
    }
  }

  /**
   * Executes one ticket. Its outcome is queued and reported together with
   * the others that end in the same turn of the microtask queue. A cancel,
   * the engine's timeout or a stop ends the attempt at once (the engine
   * has applied it; whatever the handler does later is ignored), but the
   * slot stays taken while the handler runs (see `hold`).
   */
  private execute(ticket: Ticket, checkLive: boolean): void {
    const { id, epoch } = ticket;
    this.enter(ticket.pool);
    const attempt = this.attempts.begin(id, epoch);
    attempt.worker = this;
    this.executing++;
    if (checkLive && !this.backend.liveNow(id, epoch)) return this.ended(ticket, attempt, null);
    // The run's timeout counts from here (the engine's timer enforces it).
    if (ticket.timeoutMs !== null) this.backend.attemptStarted(id, epoch);
    this.executor.run(ticket, attempt, (outcome) => this.ended(ticket, attempt, outcome));
  }

  private ended(ticket: Ticket, attempt: Attempt, outcome: Outcome | null): void {
    // Aborted while its handler runs on: the pool's concurrency bounds
    // handlers running, so the slot is given up only when it settles.
    if (outcome === null && attempt.handlerRunning) return this.hold(ticket, attempt);
    this.report(ticket, attempt, outcome);
  }

  /**
   * Keeps the slot of an aborted attempt until its handler settles; after
   * `abandonAfterMs` of engine time (from the abort, as the run's timeout
   * is counted) frees it anyway and says so, once. A shutdown abort is
   * stop()'s to abandon.
   */
  private hold(ticket: Ticket, attempt: Attempt): void {
    const held: Held = { ticket, attempt, cancel: () => undefined };
    this.held.add(held);
    attempt.onHandlerEnd = () => this.unhold(held);
    if (attempt.abortReason === 'shutdown') return;
    const sleep = this.backend.clock.sleep(this.abandonAfterMs);
    held.cancel = sleep.cancel;
    void sleep.promise.then(() => this.abandon(held));
  }

  /** The handler of a held attempt settled: its slot is freed (no outcome: the engine has applied the abort). */
  private unhold(held: Held): void {
    if (!this.held.delete(held)) return;
    held.cancel();
    try {
      this.report(held.ticket, held.attempt, null);
    } catch (e) {
      this.logger.error('jobforge: freeing the slot of an aborted attempt failed', e);
    }
  }

  /** Frees a held attempt's slot while its handler still runs (`atStop`: by stop(), unlogged); a later settle is ignored. */
  private abandon(held: Held, atStop = false): void {
    if (!this.held.delete(held)) return;
    held.cancel();
    const { ticket, attempt } = held;
    attempt.onHandlerEnd = undefined;
    try {
      if (!atStop) {
        const what = attempt.abortReason === 'canceled' ? 'was canceled' : 'timed out';
        this.logger.warn(
          `jobforge: the handler of run ${ticket.id} (${ticket.jobType}) still runs ${this.abandonAfterMs} ms after its run ${what} ` +
            `(it ignores ctx.signal): abandoned, its slot in pool '${ticket.pool}' is freed; whatever it does from now on is ignored`,
        );
      }
    } catch {
      // A logger that throws must not keep the slot taken (nor crash the process).
    }
    try {
      this.report(ticket, attempt, null);
    } catch (e) {
      this.logger.error('jobforge: freeing the slot of an abandoned attempt failed', e);
    }
  }

  /** Queues the end of an attempt whose handler is done (or abandoned) for the next report, which frees its slot. */
  private report(ticket: Ticket, attempt: Attempt, outcome: Outcome | null): void {
    // Settled in time: the report below may wait a few turns, the timeout must not.
    if (outcome !== null && ticket.timeoutMs !== null) this.backend.attemptSettled(ticket.id, ticket.epoch);
    if (attempt.worker === this) {
      attempt.worker = undefined;
      this.executing--;
    }
    // Put back to pending by stop(): its outcome is dropped.
    if (this.releasedRuns.size > 0 && this.releasedRuns.delete(ticket.id)) outcome = null;
    this.reportText += reportLine(ticket.id, ticket.epoch, this.slotOf.get(ticket.pool) ?? -1, outcome);
    this.reportItems.push({ ticket, attempt });
    if (!this.reportArmed) {
      this.reportArmed = true;
      this.reportTurns = REPORT_TURNS;
      queueMicrotask(this.reportTurn);
    }
  }

  private readonly reportTurn = (): void => {
    if (--this.reportTurns > 0) queueMicrotask(this.reportTurn);
    else if (this.sliceSpent()) setImmediate(this.flushReports);
    else this.flushReports();
  };

  private readonly endSlice = (): void => {
    this.sliceStart = -1;
  };

  /** Whether the reports have held the JS thread for a slice: time to let the event loop turn. */
  private sliceSpent(): boolean {
    const now = performance.now();
    if (this.sliceStart < 0) {
      // Runs once the current macrotask and its microtasks are over.
      this.sliceStart = now;
      setImmediate(this.endSlice);
      return false;
    }
    return now - this.sliceStart >= WORKER_SLICE_MS;
  }

  private readonly flushReports = (): void => {
    this.reportArmed = false;
    const text = this.reportText;
    const items = this.reportItems;
    this.reportText = '';
    this.reportItems = [];
    if (items.length === 0) return;
    try {
      let reply = '0';
      try {
        reply = this.backend.workerReport(text);
      } catch (e) {
        this.logger.error('jobforge: recording worker outcomes failed', e);
      }
      for (const it of items) {
        this.attempts.end(it.ticket.id, it.attempt);
        this.leave(it.ticket.pool);
      }
      // '1' = aborts or events are queued (saves a native call otherwise).
      if (reply.charCodeAt(0) === 49) this.backend.drainNotices();
      if (reply.length > 1) this.deliver(reply, 1);
    } catch (e) {
      this.logger.error('jobforge: worker report failed', e);
    }
  };

  /** A ticket that arrived after stop(): its run goes back to pending, its slot is freed. */
  private release(ticket: Ticket): void {
    const { id, epoch, pool } = ticket;
    const slot = this.slotOf.get(pool) ?? -1;
    void this.backend
      .releaseAttempt(id, epoch)
      .catch(() => false)
      .finally(() => {
        // No outcome: frees the slot (a stopping worker claims nothing into it).
        try {
          this.backend.workerReport(reportLine(id, epoch, slot, null));
        } catch (e) {
          this.logger.error('jobforge: freeing a worker slot failed', e);
        }
      });
  }

  private handle(): WorkerHandle {
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const rt = this;
    return {
      stop: () => rt.stop(),
      get running() {
        return rt.running;
      },
      get inFlight() {
        return rt.executing;
      },
    };
  }

  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.running = false;
      this.backend.workerStop();
      let cancelTimer = () => undefined as void;
      const timedOut = await Promise.race([
        this.drained().then(() => false),
        new Promise<boolean>((r) => (cancelTimer = after(this.shutdownTimeoutMs, () => r(true)))),
      ]);
      cancelTimer();
      if (timedOut) {
        // Still running after the grace period: back to pending, then abort
        // (those already aborted hold their slots: their runs are over).
        const mine = [...this.attempts.entries()].filter(([, a]) => a.worker === this && !a.aborted);
        for (const [runId, a] of mine) {
          let released = false;
          try {
            released = await this.backend.releaseAttempt(runId, a.epoch);
          } catch (e) {
            this.logger.error('jobforge: releasing a run at shutdown failed (the lease sweeper will)', e);
          }
          if (released) this.releasedRuns.add(runId);
          a.abort('shutdown');
        }
        // A handler that honours its signal settles at once; one that does
        // not is abandoned, or stop() would outlast shutdownTimeoutMs by
        // however long it runs.
        if (this.held.size > 0) {
          let cancelGrace = () => undefined as void;
          await Promise.race([
            this.drained(),
            new Promise<void>((r) => (cancelGrace = after(Math.min(SHUTDOWN_ABORT_GRACE_MS, this.abandonAfterMs), r))),
          ]);
          cancelGrace();
        }
        // Quietly: a process shutting down while handlers wait on
        // something slow is ordinary, and their runs are back to pending.
        for (const h of [...this.held]) this.abandon(h, true);
        await this.drained();
      }
      // Batches claimed just before stop() may still be crossing to JS
      // (they are released on arrival), and with a networked store finished
      // attempts' outcomes are stored by the engine's loop after the
      // handlers return. Wait for both, but not forever: with the database
      // unreachable the loop keeps trying in the background, and a run
      // whose outcome never lands goes back to pending when its lease
      // expires (at-least-once).
      const deadline = Date.now() + Math.max(this.shutdownTimeoutMs, 1000);
      while (this.backend.workerInFlight() > 0) {
        if (Date.now() >= deadline) {
          this.logger.error(
            'jobforge: worker stopped before every finished attempt was settled (is the database reachable?); ' +
              'the outcomes are still being stored in the background, and a run whose outcome is never stored ' +
              'runs again once its lease expires',
          );
          break;
        }
        await new Promise((r) => setTimeout(r, 2));
        await this.drained();
      }
      if (this.keepAlive) clearInterval(this.keepAlive);
      this.keepAlive = null;
      this.stopped = true;
    })();
    return this.stopping;
  }
}
