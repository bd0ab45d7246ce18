/**
 * Run events (`on('run:completed', …)`) and `waitForRun`. The engine
 * reports transitions only while someone listens, or for the runs someone
 * waits for; they arrive as notices (see `NoticeSink`). On a shared store
 * (Postgres) the engine also listens for other processes' transitions
 * meanwhile (`crates/core/src/feed.rs`), and says so: the process is then
 * kept alive for the listeners, as by a listening socket, until the last
 * `off()` or `close()`.
 */
import { after } from './clock';
import { JobInputInvalidError, JobRunNotFoundError, JobWaitTimeoutError } from './errors';
import type { JobLogger } from './handler';
import type { JobRun } from './rows';

export type RunEventName = 'run:completed' | 'run:failed' | 'run:canceled' | 'run:timed_out' | 'run:retrying';
/** A listener may be async (`void` accepts that): a rejection is logged like a throw. */
export type RunEventListener = (run: JobRun) => void;

const RUN_EVENTS: ReadonlySet<string> = new Set(['run:completed', 'run:failed', 'run:canceled', 'run:timed_out', 'run:retrying']);
export const TERMINAL: ReadonlySet<string> = new Set(['completed', 'failed', 'timed_out', 'canceled']);

/** What events and waits need of the store. */
export interface EventSource {
  /** Other processes may run the store's runs: a wait also looks at the row now and then. */
  readonly shared: boolean;
  /** Returns whether the engine now listens for other processes' events too. */
  setEvents(on: boolean): boolean;
  watchRun(runId: string, on: boolean): void;
  findById(runId: string): Promise<JobRun | null>;
}

export class RunEvents {
  private readonly listeners = new Map<RunEventName, Set<RunEventListener>>();
  private readonly waiters = new Map<string, Set<(run: JobRun) => void>>();
  private eventsOn = false;
  /** Held while the engine listens to other processes for `on` listeners: keeps Node running. */
  private keepAlive: NodeJS.Timeout | null = null;

  constructor(
    private readonly logger: JobLogger,
    private readonly source: () => Pick<EventSource, 'setEvents' | 'watchRun' | 'shared'>,
  ) {}

  /** Whether a transition notice has anyone to reach. */
  get wanted(): boolean {
    return this.eventsOn || this.waiters.size > 0;
  }

  on(event: RunEventName, listener: RunEventListener): void {
    if (!RUN_EVENTS.has(event)) throw new JobInputInvalidError(`unknown event '${String(event)}'`);
    if (typeof listener !== 'function') throw new JobInputInvalidError('listener must be a function');
    let set = this.listeners.get(event);
    if (!set) this.listeners.set(event, (set = new Set()));
    set.add(listener);
    // Told on every `on`, not only the first: after `close()` a new
    // listener makes the engine listen again.
    this.eventsOn = true;
    this.hold(this.source().setEvents(true));
  }

  off(event: RunEventName, listener: RunEventListener): void {
    this.listeners.get(event)?.delete(listener);
    let any = false;
    for (const set of this.listeners.values()) any ||= set.size > 0;
    if (any !== this.eventsOn) {
      this.eventsOn = any;
      this.hold(this.source().setEvents(any));
    }
  }

  /** The orchestrator was closed: the engine stopped listening to other processes. */
  closed(): void {
    this.hold(false);
  }

  private hold(listening: boolean): void {
    if (listening && this.keepAlive === null) {
      // A timer is what keeps the event loop running, and it holds these
      // events (so the orchestrator and its engine) strongly: a listener
      // keeps the process alive until off() of the last one or close(), as
      // documented, even when nothing else references the orchestrator
      // (held weakly, it was collected, stopped listening and let the
      // process exit).
      this.keepAlive = setInterval(() => void this, 1 << 30);
    } else if (!listening && this.keepAlive !== null) {
      clearInterval(this.keepAlive);
      this.keepAlive = null;
    }
  }

  /** Logs what a listener threw; a value the logger cannot print (a throwing getter) is not printed. */
  private listenerThrew(event: RunEventName, e: unknown): void {
    try {
      this.logger.error(`jobforge: a '${event}' listener threw`, e);
    } catch {
      try {
        this.logger.error(`jobforge: a '${event}' listener threw a value that cannot be printed`);
      } catch {
        // A logger that throws must not crash the process.
      }
    }
  }

  emit(run: JobRun): void {
    const event = (run.status === 'pending' ? 'run:retrying' : `run:${run.status}`) as RunEventName;
    for (const listener of this.listeners.get(event) ?? []) {
      try {
        const r: unknown = listener(run);
        // An async listener's rejection would otherwise be unhandled (and
        // end the process): logged like a throw.
        if ((typeof r === 'object' && r !== null) || typeof r === 'function') {
          // Our own promise: a thenable's `then` (or a tampered promise's) is called in a job, its throw a rejection.
          new Promise((resolve) => resolve(r)).then(undefined, (e: unknown) => this.listenerThrew(event, e));
        }
      } catch (e) {
        // A throwing listener must not break the engine or other listeners.
        this.listenerThrew(event, e);
      }
    }
    if (TERMINAL.has(run.status)) {
      const set = this.waiters.get(run.id);
      if (set) for (const resolve of [...set]) resolve(run);
    }
  }

  /** Resolves with the run's row once it is terminal (at once if it already is). */
  async waitForRun(runId: string, timeoutMs: number | undefined, find: (runId: string) => Promise<JobRun | null>): Promise<JobRun> {
    if (timeoutMs !== undefined && !(typeof timeoutMs === 'number' && timeoutMs >= 0)) {
      throw new JobInputInvalidError('timeoutMs must be a non-negative number');
    }
    // The timeout counts from the call, lookups included (a database that
    // stopped answering must not make the wait unbounded).
    let cancelTimer = () => undefined as void;
    const timeout =
      timeoutMs === undefined
        ? null
        : new Promise<never>((_, reject) => {
            cancelTimer = after(timeoutMs, () => reject(new JobWaitTimeoutError(String(runId), timeoutMs)));
          });
    const bounded = <T>(p: Promise<T>): Promise<T> => (timeout === null ? p : Promise.race([p, timeout]));
    let stopPolling = () => undefined as void;
    let unregister = () => undefined as void;
    try {
      // Waiters are keyed by the canonical id (ids parse as UUIDs in any spelling).
      const found = await bounded(find(runId));
      if (!found) throw new JobRunNotFoundError(String(runId));
      if (TERMINAL.has(found.status)) return found;
      const id = found.id;
      let resolveFn!: (run: JobRun) => void;
      const done = new Promise<JobRun>((resolve) => (resolveFn = resolve));
      // Listen before looking, so a transition in between is not missed.
      let set = this.waiters.get(id);
      if (!set) this.waiters.set(id, (set = new Set()));
      set.add(resolveFn);
      // Only this run's transitions are reported for the wait.
      const source = this.source();
      source.watchRun(id, true);
      unregister = () => {
        const s = this.waiters.get(id);
        s?.delete(resolveFn);
        if (s && s.size === 0) this.waiters.delete(id);
        source.watchRun(id, false);
      };
      const row = await bounded(find(id));
      if (!row) throw new JobRunNotFoundError(id);
      if (TERMINAL.has(row.status)) return row;
      // Another process may run it: its transition is notified (the engine
      // listens while the wait is pending), and the row is looked at now
      // and then as the fallback (a notification missed while the listener
      // connects or reconnects).
      if (source.shared) stopPolling = pollUntilTerminal(() => find(id), resolveFn);
      return await bounded(done);
    } finally {
      cancelTimer();
      stopPolling();
      unregister();
    }
  }
}

/** Looks at a run's row until it is terminal: after 100 ms, then less and less often, at least every second. */
function pollUntilTerminal(find: () => Promise<JobRun | null>, resolve: (run: JobRun) => void): () => void {
  let stopped = false;
  let cancel = () => undefined as void;
  let wait = 100;
  const look = async () => {
    if (stopped) return;
    try {
      const row = await find();
      if (row && TERMINAL.has(row.status)) return resolve(row);
    } catch {
      /* a failed look is retried */
    }
    wait = Math.min(wait * 2, 1000);
    if (!stopped) cancel = after(wait, () => void look());
  };
  cancel = after(wait, () => void look());
  return () => {
    stopped = true;
    cancel();
  };
}
