/**
 * Run events (`on('run:completed', …)`) and `waitForRun`. The engine
 * reports transitions only while someone listens, or for the runs someone
 * waits for; they arrive as notices (see `NoticeSink`).
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
  setEvents(on: boolean): void;
  watchRun(runId: string, on: boolean): void;
  findById(runId: string): Promise<JobRun | null>;
}

export class RunEvents {
  private readonly listeners = new Map<RunEventName, Set<RunEventListener>>();
  private readonly waiters = new Map<string, Set<(run: JobRun) => void>>();
  private eventsOn = false;

  constructor(
    private readonly logger: JobLogger,
    private readonly source: () => { setEvents(on: boolean): void; watchRun(runId: string, on: boolean): void; readonly shared: boolean },
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
    this.sync();
  }

  off(event: RunEventName, listener: RunEventListener): void {
    this.listeners.get(event)?.delete(listener);
    this.sync();
  }

  private sync(): void {
    let any = false;
    for (const set of this.listeners.values()) any ||= set.size > 0;
    if (any !== this.eventsOn) {
      this.eventsOn = any;
      this.source().setEvents(any);
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
          Promise.resolve(r).then(undefined, (e: unknown) => this.logger.error(`jobforge: a '${event}' listener threw`, e));
        }
      } catch (e) {
        // A throwing listener must not break the engine or other listeners.
        this.logger.error(`jobforge: a '${event}' listener threw`, e);
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
      // Another process may run it: look now and then as well.
      if (source.shared) stopPolling = pollUntilTerminal(() => find(id), resolveFn);
      return await bounded(done);
    } finally {
      cancelTimer();
      stopPolling();
      unregister();
    }
  }
}

/** Looks at a run's row every 100 ms until it is terminal. */
function pollUntilTerminal(find: () => Promise<JobRun | null>, resolve: (run: JobRun) => void): () => void {
  let stopped = false;
  let cancel = () => undefined as void;
  const look = async () => {
    if (stopped) return;
    try {
      const row = await find();
      if (row && TERMINAL.has(row.status)) return resolve(row);
    } catch {
      /* a failed look is retried */
    }
    if (!stopped) cancel = after(100, () => void look());
  };
  cancel = after(100, () => void look());
  return () => {
    stopped = true;
    cancel();
  };
}
