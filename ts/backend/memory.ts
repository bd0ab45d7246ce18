/**
 * The in-memory store: every operation runs on the JS thread in
 * nanoseconds (`callSync`), so an operation's effects (a cancel's aborts,
 * run events) happen before its promise is even returned. Two hot paths
 * avoid a native call per run: starts whose row follows from the
 * definition are answered here and handed to the engine in batches, and
 * worker reports claim into the slots they free.
 */
import { randomUUID } from 'node:crypto';
import { EngineClock } from '../clock';
import type { JobDefinitionRow, JobRun } from '../rows';
import { NativeEngine, type OpName } from '../native';
import {
  decodeNativeError,
  newRun,
  parseRegistration,
  parseStarted,
  startLine,
  startLineType,
  startRequest,
  startWireJson,
  TicketReader,
} from '../wire';
import { NativeBackend, noticeCallback, type Backend, type NoticeSink, type PreparedStart, type WorkerLink } from './backend';

export interface MemoryOptions {
  multiTenant: boolean;
  clock: 'system' | 'manual';
  retention?: { completedMs?: number | undefined; failedMs?: number | undefined } | undefined;
  timeline?: boolean | undefined;
  logger: { error(message: unknown, ...rest: unknown[]): void };
}

/** A registered type, as a start of it needs it. */
interface TypeInfo {
  /** The row the engine builds for a start with no options (`run_template`). */
  template: JobRun;
  /** The entity of `meta.scope` (its id comes with the start). */
  scopeEntityType: string | null;
  /** No concurrency or dedupe key. */
  keyless: boolean;
  /** The type as `startLine` writes it. */
  wire: string;
}

/** Buffered starts handed to the engine in one call at most this many at a time. */
const START_BATCH_MAX = 256;

export class MemoryBackend extends NativeBackend implements Backend {
  readonly kind = 'memory' as const;
  readonly shared = false;
  readonly clock: EngineClock;
  readonly tickets: TicketReader;
  /**
   * Starts answered here and not yet handed to the engine, one start line
   * each. Every operation hands them over first, so none can observe the
   * difference; otherwise they go with the next worker report, when
   * `START_BATCH_MAX` are waiting, or on the next turn of the event loop.
   */
  private startBuf = '';
  private startCount = 0;
  private startFlushArmed = false;
  private idBlock = '';
  private idAt = 0;
  /** Last creation time handed out (system clock): never goes backwards. */
  private lastStartAt = 0;
  /** What a start of each registered type needs to answer without the engine. */
  private readonly types = new Map<string, TypeInfo>();
  private readonly multiTenant: boolean;
  private readonly logger: MemoryOptions['logger'];

  constructor(o: MemoryOptions, sink: NoticeSink) {
    const ref: { backend?: WeakRef<NativeBackend> } = {};
    let native: NativeEngine;
    try {
      native = new NativeEngine(
        {
          store: 'memory',
          multiTenant: o.multiTenant,
          clock: o.clock,
          retainCompletedMs: o.retention?.completedMs,
          retainFailedMs: o.retention?.failedMs,
          timeline: o.timeline,
        },
        noticeCallback(ref),
      );
    } catch (e) {
      // The engine refuses bad options (a negative retention) with a coded error.
      throw decodeNativeError(e);
    }
    super(native, sink);
    ref.backend = new WeakRef(this);
    this.multiTenant = o.multiTenant;
    this.logger = o.logger;
    this.clock = new EngineClock(o.clock, () => native.now());
    this.tickets = new TicketReader((runId) => native.claimedRun(runId));
  }

  protected request<T>(op: OpName, req: string, decode: (text: string) => T): Promise<T> {
    try {
      if (this.startCount > 0) this.flushStarts();
      return Promise.resolve(decode(this.callNative(op, req)));
    } catch (e) {
      return Promise.reject(e);
    }
  }

  ready(): null {
    return null;
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  override advanceTime(ms: number): number | null {
    // Buffered starts were made at the time before this move.
    this.flushStarts();
    return super.advanceTime(ms);
  }

  register(specs: Record<string, unknown>[]): JobDefinitionRow[] {
    if (this.startCount > 0) this.flushStarts();
    const { definitions, templates } = parseRegistration(this.callNative('register', JSON.stringify(specs)));
    definitions.forEach((d, i) => {
      this.types.set(d.type, {
        template: templates[i]!,
        scopeEntityType: d.scopeEntityType,
        // No key: nothing the engine decides depends on other runs.
        keyless: d.concurrencyKeyTemplate === null && d.dedupeKeyTemplate === null,
        wire: startLineType(d.type),
      });
    });
    return definitions;
  }

  /**
   * Answered here, before the engine has the run, when nothing the engine
   * checks can refuse it: the type is registered and has no key (no dedupe
   * hit, no lane to join or collide with), there is no parent to look up,
   * and a multi-tenant start names its tenant; its input and options were
   * checked as the engine checks them (`prepareStart`). Any other start
   * goes to the engine at once, which answers a new run the short way.
   * Both rows come from the engine's template of the type (`newRun`).
   */
  start(p: PreparedStart): Promise<JobRun> {
    if (p.thrown !== null) return this.preflight(p, p.thrown);
    const info = this.types.get(p.type);
    try {
      if (info !== undefined && info.keyless && !p.hasParent && (!this.multiTenant || p.tenant !== undefined)) {
        return Promise.resolve(this.startBuffered(p, info));
      }
    } catch (e) {
      return Promise.reject(e);
    }
    const run = info === undefined ? this.startInEngine(p) : this.startShort(p, info);
    this.feedWorker();
    return run;
  }

  /** All or none, in the engine (buffered starts go first, as before any operation); idle worker slots claim at once. */
  override startMany(entries: PreparedStart[]): Promise<JobRun[]> {
    const runs = super.startMany(entries);
    this.feedWorker();
    return runs;
  }

  /** The engine's `start`, answered the short way (it holds the type's template). */
  private startShort(p: PreparedStart, info: TypeInfo): Promise<JobRun> {
    const optsText = p.opts === null ? null : startWireJson(p.opts);
    const req = startRequest(p.type, p.inputText, optsText, true);
    return this.mutate('start', req, (text) => {
      const answer = parseStarted(text);
      if ('row' in answer) return answer.row; // a dedupe hit: the existing run
      return newRun(info.template, answer.id, answer.at, this.inputOf(p), p.opts, info.scopeEntityType, null, answer.decided);
    });
  }

  /** The row's input: a copy of the caller's (a flat object's shallow copy is one). */
  private inputOf(p: PreparedStart): Record<string, unknown> {
    return p.inputCopy ?? (JSON.parse(p.inputText) as Record<string, unknown>);
  }

  /** A start answered here (see `start`): its id and time are chosen here, the engine gets it with others in one call. */
  private startBuffered(p: PreparedStart, info: TypeInfo): JobRun {
    const id = this.nextRunId();
    let at: number;
    if (this.clock.kind === 'manual') at = this.native.now();
    else {
      at = Date.now();
      if (at < this.lastStartAt) at = this.lastStartAt;
      else this.lastStartAt = at;
    }
    const pool = p.opts?.pool ?? info.template.pool;
    this.startBuf += startLine(id, at, info.wire, p.inputText, p.opts === null ? null : startWireJson(p.opts));
    this.startCount++;
    const w = this.worker;
    if (this.startCount >= START_BATCH_MAX || (w !== null && w.running && !w.busy && w.hasIdleSlot(pool))) {
      // An idle worker takes the run at once. A busy one gets it with the
      // next report of a finishing attempt (or on the next turn of the
      // event loop): one native call for both.
      this.flushStarts();
    } else if (!this.startFlushArmed) {
      this.startFlushArmed = true;
      setImmediate(this.flushLater);
    }
    const tenant = this.multiTenant ? (p.opts?.tenant ?? null) : null;
    return newRun(info.template, id, at, this.inputOf(p), p.opts, info.scopeEntityType, tenant, null);
  }

  /**
   * A fresh run id (UUID v4) for a buffered start, from a block the engine
   * generates 256 at a time: slicing the block costs less than
   * `randomUUID()` per start.
   */
  private nextRunId(): string {
    if (this.idAt >= this.idBlock.length) {
      try {
        this.idBlock = this.native.newRunIds(256);
      } catch {
        return randomUUID();
      }
      this.idAt = 0;
    }
    const id = this.idBlock.slice(this.idAt, this.idAt + 36);
    this.idAt += 36;
    return id;
  }

  private readonly flushLater = (): void => {
    this.startFlushArmed = false;
    this.flushStarts();
  };

  /** The buffered start lines, now owned by the caller (null when none). */
  private takeStarts(): string | null {
    if (this.startCount === 0) return null;
    const text = this.startBuf;
    this.startBuf = '';
    this.startCount = 0;
    return text;
  }

  /** Hands the buffered starts to the engine (claiming into idle worker slots). */
  private flushStarts(): void {
    const text = this.takeStarts();
    if (text === null) return;
    const w = this.worker;
    const fed = w !== null && w.running && w.hasIdleSlot();
    let reply: string;
    try {
      reply = this.native.startBatch(text, fed);
    } catch (e) {
      this.logger.error('jobforge: handing buffered starts to the engine failed', decodeNativeError(e));
      return;
    }
    if (reply.length > 0) {
      if (w !== null) w.deliver(reply, 0);
      else this.logger.error(`jobforge: buffered starts: ${reply}`);
    }
  }

  /** After a start: claim into the worker's idle slots here, instead of waiting for the scheduler's thread. */
  private feedWorker(): void {
    const w = this.worker;
    if (w === null || !w.running || !w.hasIdleSlot()) return;
    const lines = this.native.workerFill();
    if (lines.length > 0) w.deliver(lines, 0);
  }

  // ── worker ──

  startWorker(pools: { name: string; concurrency: number }[], onBatch: (text: string) => void, link: WorkerLink): void {
    try {
      this.native.startWorker(JSON.stringify(pools), onBatch);
    } catch (e) {
      throw decodeNativeError(e);
    }
    this.worker = link;
  }

  workerReport(report: string): string {
    // Buffered starts ride along: created before the freed slots claim.
    try {
      return this.native.workerReport(report, this.takeStarts());
    } catch (e) {
      throw decodeNativeError(e);
    }
  }

  workerFill(): string {
    return this.native.workerFill();
  }

  liveNow(runId: string, epoch: number): boolean {
    return this.callNative('attemptLive', JSON.stringify({ runId, epoch })) === 'true';
  }
}

