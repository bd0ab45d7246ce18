/**
 * Waiting in JS: wall-time timers of any length, and engine-time sleeps
 * (a step's timeout and retry backoff) that follow a manual clock.
 */

/** Node's timers hold at most 2^31-1 ms and fire after 1 ms beyond that. */
const MAX_TIMER_MS = 0x7fffffff;

/**
 * Calls `fn` after `ms` of wall time, however long (chained timers past
 * Node's timer limit; never for Infinity). Returns a cancel function.
 */
export function after(ms: number, fn: () => void): () => void {
  let timer: NodeJS.Timeout | undefined;
  let canceled = false;
  const arm = (left: number) => {
    if (canceled || left === Infinity) return;
    if (left > MAX_TIMER_MS) timer = setTimeout(() => arm(left - MAX_TIMER_MS), MAX_TIMER_MS);
    else timer = setTimeout(fn, Math.max(0, left));
  };
  arm(ms);
  return () => {
    canceled = true;
    clearTimeout(timer);
  };
}

interface ManualTimer {
  deadline: number;
  resolve: () => void;
}

export interface Sleep {
  promise: Promise<void>;
  cancel(): void;
}

/**
 * Engine time as JS waits on it: the system clock's timers, or a manual
 * clock's, which `advanced` fires. `now` reads the engine's clock.
 */
export class EngineClock {
  /** Pending sleeps of a manual clock, fired by `advanced`. */
  private readonly manualTimers = new Set<ManualTimer>();

  constructor(
    readonly kind: 'system' | 'manual',
    readonly now: () => number,
  ) {}

  /** A sleep of `ms` engine time, cancelable so a finished race leaves nothing that keeps the process alive. */
  sleep(ms: number): Sleep {
    if (this.kind === 'manual') {
      const deadline = this.now() + ms;
      let entry!: ManualTimer;
      const promise = new Promise<void>((resolve) => {
        entry = { deadline, resolve };
      });
      if (deadline <= this.now()) entry.resolve();
      else this.manualTimers.add(entry);
      return { promise, cancel: () => this.manualTimers.delete(entry) };
    }
    let cancel = () => undefined as void;
    const promise = new Promise<void>((resolve) => {
      cancel = after(ms, resolve);
    });
    return { promise, cancel: () => cancel() };
  }

  /** The manual clock moved to `t`: wake the sleeps due by then, earliest first. */
  advanced(t: number): void {
    for (const timer of [...this.manualTimers].sort((x, y) => x.deadline - y.deadline)) {
      if (timer.deadline <= t) {
        this.manualTimers.delete(timer);
        timer.resolve();
      }
    }
  }
}
