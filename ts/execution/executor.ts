/**
 * Runs one attempt's handler: builds its `ctx`, calls the registered
 * handler (class, function or object), and turns what it does into the
 * attempt's outcome, racing an abort (a cancel, the engine's timeout, a
 * shutdown). Every path that executes an attempt comes here: `tick` and
 * the worker. The run's `timeoutMs` is the engine's to enforce: it times
 * the run out and the abort arrives as a notice.
 */
import { JobStoreError } from '../errors';
import type { HandlerRegistration } from '../handler';
import type { JobContext } from '../handler';
import { isClass } from '../validate';
import { failedOutcome, NO_HANDLER, outcomeOf, PARKED, type Outcome, type Ticket } from '../wire';
import type { Attempt } from './attempt';
import { RunContext, type ContextHost } from './context';

/** Tries of a late outcome's report (pauses of 50 ms doubling: about 25 s in all). */
const LATE_END_TRIES = 9;

export class Executor {
  constructor(
    private readonly handlers: ReadonlyMap<string, HandlerRegistration>,
    private readonly host: ContextHost,
  ) {}

  /**
   * Runs the handler of `ticket`; `done` gets the outcome exactly once,
   * null when the attempt was aborted first. Whatever the handler does
   * later is ignored, but whether it still runs is not:
   * `attempt.handlerRunning` says so, and `attempt.handlerEnded()` is
   * called when it returns or settles (a worker's slot is held till then).
   */
  run(ticket: Ticket, attempt: Attempt, done: (outcome: Outcome | null) => void): void {
    let settled = false;
    const trace = this.host.tracing === null ? null : this.host.tracing.attempt(ticket);
    attempt.trace = trace;
    // Also the abort hook: called with no argument, the attempt has no outcome.
    const settle = (outcome?: Outcome | null): void => {
      if (settled) return;
      settled = true;
      attempt.onAbort = undefined;
      trace?.end(outcome ? outcome.status : (attempt.abortReason ?? 'aborted'));
      if (outcome !== PARKED) attempt.onPark = undefined;
      done(outcome ?? null);
    };
    attempt.onAbort = settle;
    // Blocked only on durable waits: the attempt ends as parked, and its
    // slot is free at once. The handler's pending continuation is left to
    // the collector (the open waits' promises never settle and hold
    // nothing) — unless it awaited other work too: then it goes on, and
    // when it waits again the run parks anew on its new waits.
    attempt.onPark = () => {
      attempt.handlerEnded();
      if (settled) this.lateEnd(ticket, PARKED);
      else settle(PARKED);
    };
    // The handler returned or threw. After a park its outcome still
    // settles the run, which the engine applies while the run waits (a
    // wait that resumed it meanwhile leaves the decision to the next
    // execution).
    const end = (outcome: Outcome): void => {
      attempt.returned = outcome.status === 'completed' ? 'completed' : 'failed';
      attempt.handlerEnded();
      attempt.onPark = undefined;
      if (settled && attempt.parked) this.lateEnd(ticket, outcome);
      else settle(outcome);
    };
    // Aborted before it began (a cancel between the engine's ticket and
    // this attempt's registration): the handler is not called.
    if (attempt.aborted) return settle();
    const reg = this.handlers.get(ticket.jobType);
    if (!reg) return settle(NO_HANDLER);
    let result: unknown;
    attempt.handlerRunning = true;
    try {
      result = trace === null ? this.invoke(reg, ticket, attempt) : trace.within(() => this.invoke(reg, ticket, attempt));
    } catch (e) {
      trace?.failed(e);
      return end(failedOutcome(e));
    }
    // Our own promise resolved with the result, the way `await` takes it: a
    // thenable's `then` (even a tampered native promise's, or one whose
    // `constructor` getter throws, which `Promise.resolve` would read) is
    // called in a job, and its throw is a rejection, never an exception here.
    new Promise<unknown>((resolve) => resolve(result)).then(
      (value) => {
        // Reading the output can throw too (a proxy's trap, a getter).
        let outcome: Outcome;
        try {
          outcome = outcomeOf(value);
        } catch (e) {
          outcome = failedOutcome(e);
        }
        end(outcome);
      },
      (e) => {
        trace?.failed(e);
        end(failedOutcome(e));
      },
    );
  }

  /**
   * What a parked execution did after its attempt ended: reported on its
   * own (its slot is long free). A store error that may pass (a lost
   * connection, a deadlock) is tried again with a growing pause: dropped,
   * the run would wait on a wait its handler no longer awaits.
   */
  private lateEnd(ticket: Ticket, outcome: Outcome, tries = 0): void {
    this.host.store.finishAttempt(ticket.id, ticket.epoch, outcome.text).catch((e: unknown) => {
      // An unknown outcome is reported again too: an outcome that landed is then ignored (its epoch).
      if (e instanceof JobStoreError && (e.retryable || e.outcome === 'unknown') && tries < LATE_END_TRIES) {
        setTimeout(() => this.lateEnd(ticket, outcome, tries + 1), 50 * 2 ** tries).unref();
        return;
      }
      try {
        this.host.logger.error(`jobforge: the late outcome of run ${ticket.id} (${ticket.jobType}) after it parked was not stored`, e);
      } catch {
        // A logger that throws must not crash the process.
      }
    });
  }

  /** `run` as a promise. */
  outcome(ticket: Ticket, attempt: Attempt): Promise<Outcome | null> {
    return new Promise((resolve) => this.run(ticket, attempt, resolve));
  }

  /** Calls the registered handler with a new `ctx`. */
  private invoke(reg: HandlerRegistration, ticket: Ticket, attempt: Attempt): unknown {
    const ctx = new RunContext(ticket, attempt, this.host);
    const h = reg.handlerClass;
    if (isClass(h)) return new h().run(ctx);
    if (typeof h === 'function') return (h as (c: JobContext<unknown>) => unknown)(ctx);
    return (h as { run(c: JobContext<unknown>): unknown }).run(ctx);
  }
}
