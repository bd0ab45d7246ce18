/**
 * Runs one attempt's handler: builds its `ctx`, calls the registered
 * handler (class, function or object), and turns what it does into the
 * attempt's outcome, racing an abort (a cancel, the engine's timeout, a
 * shutdown). Every path that executes an attempt comes here: `tick` and
 * the worker. The run's `timeoutMs` is the engine's to enforce: it times
 * the run out and the abort arrives as a notice.
 */
import type { HandlerRegistration } from '../handler';
import type { JobContext } from '../handler';
import { isClass } from '../validate';
import { failedOutcome, NO_HANDLER, outcomeOf, PARKED, type Outcome, type Ticket } from '../wire';
import type { Attempt } from './attempt';
import { RunContext, type ContextHost } from './context';

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
    // Also the abort hook: called with no argument, the attempt has no outcome.
    const settle = (outcome?: Outcome | null): void => {
      if (settled) return;
      settled = true;
      attempt.onAbort = undefined;
      attempt.onPark = undefined;
      done(outcome ?? null);
    };
    attempt.onAbort = settle;
    // Blocked only on durable waits: the attempt ends as parked, and its
    // slot is free at once. The handler's pending continuation is left to
    // the collector (the open waits' promises never settle and hold nothing).
    attempt.onPark = () => {
      attempt.handlerEnded();
      settle(PARKED);
    };
    const reg = this.handlers.get(ticket.jobType);
    if (!reg) return settle(NO_HANDLER);
    let result: unknown;
    attempt.handlerRunning = true;
    try {
      result = this.invoke(reg, ticket, attempt);
    } catch (e) {
      attempt.handlerEnded();
      return settle(failedOutcome(e));
    }
    // Promise.resolve: a native promise as is; a thenable (even one whose
    // `then` throws) or a plain value the way `await` would take it.
    Promise.resolve(result).then(
      (value) => {
        attempt.handlerEnded();
        // Reading the output can throw too (a proxy's trap, a getter).
        let outcome: Outcome;
        try {
          outcome = outcomeOf(value);
        } catch (e) {
          outcome = failedOutcome(e);
        }
        settle(outcome);
      },
      (e) => {
        attempt.handlerEnded();
        settle(failedOutcome(e));
      },
    );
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
