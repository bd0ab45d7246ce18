/**
 * One executing attempt, and the attempts this process is executing (by
 * run id), which the engine's abort notices reach.
 */

import { JobRunStateError, JobStepConflictError } from '../errors';
import type { AttemptTrace } from '../tracing';

/** The run status an attempt's abort reason means. */
export const ABORTED_STATUS: Record<string, string> = { canceled: 'canceled', timed_out: 'timed_out', shutdown: 'pending' };

/**
 * One executing attempt. The AbortController behind `ctx.signal` is built
 * only when a handler reads the signal (most never do, and constructing one
 * costs more than the rest of an attempt's bookkeeping).
 */
export class Attempt {
  private controller?: AbortController | undefined;
  private reason?: string | undefined;
  private waiters?: (() => void)[] | undefined;
  /** Set while the handler races its abort: ends the race. */
  onAbort?: (() => void) | undefined;
  /** The attempt's span, while a tracer records (see `Tracing.attempt`). */
  trace: AttemptTrace | null = null;
  /** The worker executing this attempt (worker attempts only; see `WorkerRuntime.execute`). */
  worker?: object | undefined;
  /**
   * The handler was called and has not returned or settled yet: after an
   * abort it may still be running (one that ignores `ctx.signal`).
   */
  handlerRunning = false;
  /** Set by a worker holding the slot of an aborted attempt: called once the handler settles. */
  onHandlerEnd?: (() => void) | undefined;

  // Durable waits (see `considerPark`).
  /** Waits answered open: the handler awaits them and they resolve only in a later execution. */
  openWaits = 0;
  /** Wait calls the engine has not answered yet. */
  waitCalls = 0;
  /** `ctx.step` calls (and token deliveries) under way. */
  stepsRunning = 0;
  /**
   * The step and wait ids of this execution's calls not yet answered (a
   * wait answered open stays): a second call with one of them is a
   * conflict, decided here in call order. The engine would see the two
   * calls in whatever order they reach it (on PostgreSQL, on two
   * connections: the second could begin and complete first, and the
   * first answer with its output).
   */
  readonly idsInFlight = new Set<string>();

  /** Takes `stepId` for a call of this execution, or throws `JobStepConflictError`. */
  claimId(runId: string, stepId: string): void {
    if (this.idsInFlight.has(stepId)) throw new JobStepConflictError(runId, stepId);
    this.idsInFlight.add(stepId);
  }
  /**
   * The attempt parked. Its handler's continuation is left to the collector
   * when it awaited only waits; one that awaited other work too goes on,
   * and what it does still counts while the run waits (see `onLateEnd`).
   */
  parked = false;
  /** A wait opened after the attempt parked (its handler went on): it parks again on it. */
  private reopened = false;
  /**
   * The handler returned or threw (the status its outcome gives the run,
   * `'failed'` for a failure even if a retry follows): a `ctx` call from
   * code it left behind (a timer's callback) is refused here, before its
   * outcome reaches the store — asked first, the engine would still see
   * the attempt running (a wait would open on a run about to end).
   */
  returned: 'completed' | 'failed' | null = null;
  /** Set by the executor: settles the attempt as parked (the first park, and each later one). */
  onPark?: (() => void) | undefined;
  private parkCheck = false;

  constructor(
    readonly epoch: number,
    private readonly parker: Parker,
  ) {}

  get aborted(): boolean {
    return this.reason !== undefined;
  }

  get abortReason(): string | undefined {
    return this.reason;
  }

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      if (this.reason !== undefined) this.controller.abort(this.reason);
    }
    return this.controller.signal;
  }

  abort(reason: string): void {
    if (this.reason !== undefined) return;
    this.reason = reason;
    this.controller?.abort(reason);
    this.onAbort?.();
    for (const w of this.waiters ?? []) w();
    this.waiters = undefined;
  }

  /**
   * Parks the attempt once its handler is blocked only on open waits: no
   * step running, no wait call unanswered. Looked at after every microtask
   * queued now has run (see `Parker`), so waits started together — a
   * fan-out's `Promise.all` — are all recorded before it parks.
   */
  considerPark(): void {
    if (this.parkCheck || this.openWaits === 0 || (this.parked && !this.reopened)) return;
    this.parkCheck = true;
    this.parker.add(this);
  }

  /** Refuses a `ctx` call made after the handler returned (see `returned`). */
  checkNotReturned(runId: string, what: string): void {
    if (this.returned === null) return;
    // An aborted attempt's run ended as the abort says, whatever the handler returned.
    const status = this.reason !== undefined ? (ABORTED_STATUS[this.reason] ?? 'ended') : this.returned;
    throw new JobRunStateError(runId, status, `${what} after its handler returned`);
  }

  /** A wait answered open: the handler awaits it. */
  waitOpened(): void {
    this.openWaits++;
    if (this.parked) this.reopened = true;
    this.considerPark();
  }

  /** `Parker`'s look: parks the attempt if it is still blocked only on waits. */
  parkIfBlocked(): void {
    this.parkCheck = false;
    if ((this.parked && !this.reopened) || this.openWaits === 0 || this.waitCalls > 0 || this.stepsRunning > 0) return;
    if (this.aborted) {
      // Canceled (or timed out) while blocked only on waits: the handler
      // will never settle, so a worker holding its slot until it does
      // would hold it for nothing.
      this.handlerEnded();
      return;
    }
    this.parked = true;
    this.reopened = false;
    this.onPark?.();
  }

  /** The handler returned or its promise settled. */
  handlerEnded(): void {
    this.handlerRunning = false;
    const f = this.onHandlerEnd;
    this.onHandlerEnd = undefined;
    f?.();
  }

  whenAborted(): Promise<void> {
    if (this.reason !== undefined) return Promise.resolve();
    return new Promise((resolve) => (this.waiters ??= []).push(resolve));
  }
}

/**
 * Parks attempts blocked only on waits, many in one pass: one
 * `setImmediate` for every attempt that asked meanwhile, so the parked
 * attempts end in one synchronous stretch and a worker reports them in one
 * call (one pass per attempt cost a report and a refill per parked run).
 */
export class Parker {
  private queued: Attempt[] = [];
  private scheduled = false;

  add(a: Attempt): void {
    this.queued.push(a);
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.look);
    }
  }

  private readonly look = (): void => {
    this.scheduled = false;
    const q = this.queued;
    this.queued = [];
    for (const a of q) a.parkIfBlocked();
  };
}

/** The attempts executing in this process, by run id. */
export class Attempts {
  private readonly byRun = new Map<string, Attempt>();
  private readonly parker = new Parker();
  /**
   * Runs whose `tick` awaits the engine's ticket (see `beginTicked`): how
   * many ticks, and the aborts that came for the run meanwhile.
   */
  private readonly ticking = new Map<string, { ticks: number; aborts: { epoch: number | undefined; reason: string }[] }>();

  get size(): number {
    return this.byRun.size;
  }

  /** Whether aborts matter here: an attempt executes, or a `tick` awaits its ticket. */
  get listening(): boolean {
    return this.byRun.size > 0 || this.ticking.size > 0;
  }

  /** Registered before the handler runs, so a cancel from then on reaches it. */
  begin(runId: string, epoch: number): Attempt {
    const a = new Attempt(epoch, this.parker);
    this.byRun.set(runId, a);
    return a;
  }

  /**
   * `tick`'s attempt: `fetch` asks the engine for the ticket (the run
   * turns executing there), then the attempt is registered. A cancel or
   * the engine's timeout can come in between (a cancel called right after
   * `tick`, an `advanceTime` of the manual clock, another process on
   * PostgreSQL): its notice found no attempt, and the handler would have
   * run on, never aborted. Notices of that moment are kept and applied.
   */
  async beginTicked<T extends { id: string; epoch: number }>(runId: string, fetch: () => Promise<T>): Promise<{ ticket: T; attempt: Attempt }> {
    // Notices name runs as the engine writes ids (lowercase); another
    // spelling of an id the engine reads is not matched (its window stays).
    const key = runId.toLowerCase();
    let entry = this.ticking.get(key);
    if (entry === undefined) this.ticking.set(key, (entry = { ticks: 0, aborts: [] }));
    entry.ticks++;
    try {
      const ticket = await fetch();
      const attempt = this.begin(ticket.id, ticket.epoch);
      for (const n of entry.aborts) {
        if (n.epoch === undefined || n.epoch === ticket.epoch) attempt.abort(n.reason);
      }
      return { ticket, attempt };
    } finally {
      if (--entry.ticks === 0) this.ticking.delete(key);
    }
  }

  get(runId: string): Attempt | undefined {
    return this.byRun.get(runId);
  }

  /** Forgets `attempt` if it is still the run's current one. */
  end(runId: string, attempt: Attempt): void {
    if (this.byRun.get(runId) === attempt) this.byRun.delete(runId);
  }

  entries(): IterableIterator<[string, Attempt]> {
    return this.byRun.entries();
  }

  /**
   * Fires an abort the engine decided. A notice is for one attempt: one
   * queued while the run was claimed but not executing must not stop a
   * later attempt (after a replay); no epoch = whichever is executing.
   */
  abort(runId: string, epoch: number | undefined, reason: string): void {
    const a = this.byRun.get(runId);
    if (a !== undefined && (epoch === undefined || a.epoch === epoch)) a.abort(reason);
    else this.ticking.get(runId)?.aborts.push({ epoch, reason });
  }
}
