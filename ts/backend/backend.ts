/**
 * The one interface every operation of the orchestrator goes through, and
 * its implementation over the native engine's operation list: the calls
 * are the same for every store, only how they reach the engine differs
 * (`memory.ts`: on the JS thread; `postgres.ts`: on a blocking thread).
 * A third store is one more file beside those two.
 */
import type { EngineClock } from '../clock';
import type { StepStore } from '../execution/context';
import type { JobDefinitionRow, JobRun, JobRunEventPage, JobRunFailure, JobRunPage, JobSchedule, JobStep, RunTreeNode } from '../rows';
import { OP, type NativeEngine, type OpName } from '../native';
import {
  decodeNativeError,
  decodeSchedule,
  parseDefinitions,
  parseEventPage,
  parseFailures,
  parseNotices,
  parseOptRun,
  parseOptStep,
  parsePage,
  parseRun,
  parseRuns,
  parseSteps,
  parseTree,
  parseWait,
  requestJson,
  startRequest,
  startWireJson,
  type Notices,
  type StartWire,
  type Ticket,
  type TicketReader,
  type WaitAnswer,
} from '../wire';

/** A tenant as a call gives it: left out (`undefined`), null, or an id. */
export type Tenant = string | null | undefined;

/** `,"tenant":…` for a request written by hand (left out for `undefined`). */
const tenantField = (t: Tenant): string => (t === undefined ? '' : `,"tenant":${JSON.stringify(t)}`);

/** A start, checked and with its JS-side keys evaluated (see `prepareStart`). */
export interface PreparedStart {
  type: string;
  inputText: string;
  /** What `JSON.parse(inputText)` gives, when it came for free. */
  inputCopy: Record<string, unknown> | null;
  /** Options for the engine (`StartOpts`); null when none were given and no JS key applies. */
  opts: StartWire | null;
  /** A JS key function threw: the engine's earlier checks go first, then this is rethrown. */
  thrown: { error: unknown } | null;
  tenant: Tenant;
  hasParent: boolean;
}

/** Where the engine's notices go: attempts to abort, run events to emit. */
export interface NoticeSink {
  /** Whether anyone listens (saves a native call otherwise). */
  wanted(): boolean;
  deliver(notices: Notices): void;
}

/** What a backend needs from the worker running on it. */
export interface WorkerLink {
  readonly running: boolean;
  /** Some attempt is executing (its report will carry buffered starts). */
  readonly busy: boolean;
  hasIdleSlot(pool?: string): boolean;
  /** Tickets a call claimed, from `reply[from]` on. */
  deliver(reply: string, from: number): void;
}

export interface Backend extends StepStore {
  readonly kind: 'memory' | 'postgres';
  /** Other processes may run this store's runs (a wait looks at the row now and then too). */
  readonly shared: boolean;
  readonly clock: EngineClock;
  readonly tickets: TicketReader;

  // ── time and notices (no I/O) ──
  advanceTime(ms: number): number | null;
  /** Returns whether the engine now listens for other processes' events too (a shared store). */
  setEvents(on: boolean): boolean;
  watchRun(runId: string, on: boolean): void;
  /** Delivers the engine's queued notices, if anyone listens (`always`: take them anyway). */
  drainNotices(always?: boolean): void;

  // ── schema and definitions ──
  /**
   * What must settle before a call that needs the definitions (a networked
   * store writes them in the background); null when nothing is pending.
   */
  ready(): Promise<void> | null;
  migrate(): Promise<void>;
  close(): Promise<void>;
  storedJobTypes(): Promise<string[]>;
  /** Checks and records definitions, all or none; throws at once on a bad one. */
  register(specs: Record<string, unknown>[]): JobDefinitionRow[];
  definition(type: string): Promise<JobDefinitionRow | null>;

  // ── runs ──
  start(p: PreparedStart): Promise<JobRun>;
  /** Every start of `entries` or none, in one transaction (`Engine::start_many`); a refused entry's error names its index. */
  startMany(entries: PreparedStart[]): Promise<JobRun[]>;
  cancel(runId: string, cascade: boolean, tenant: Tenant, note?: string): Promise<void>;
  replay(runId: string, tenant: Tenant): Promise<JobRun>;
  claimNext(pool: string): Promise<JobRun | null>;
  beginAttempt(runId: string): Promise<Ticket>;
  finishAttempt(runId: string, epoch: number, outcomeText: string): Promise<boolean>;
  releaseAttempt(runId: string, epoch: number): Promise<boolean>;

  // ── queries ──
  findById(runId: string, tenant: Tenant): Promise<JobRun | null>;
  getRun(runId: string, tenant: Tenant): Promise<JobRun | null>;
  countRuns(tenant: Tenant): Promise<number>;
  listSteps(runId: string, tenant: Tenant): Promise<JobStep[]>;
  findStep(runId: string, stepId: string, tenant: Tenant): Promise<JobStep | null>;
  recordStep(record: Record<string, unknown>, tenant: Tenant): Promise<JobStep>;
  listForScope(entityType: string, entityId: string, query: Record<string, unknown>, tenant: Tenant): Promise<JobRun[]>;
  cancelForScope(entityType: string, entityId: string, cascade: boolean, tenant: Tenant, note?: string): Promise<number>;
  rescheduleForScope(entityType: string, entityId: string, runAt: number, tenant: Tenant): Promise<number>;
  countByPoolAndStatus(tenant: Tenant): Promise<{ pool: string; status: JobRun['status']; count: number }[]>;
  listRecentFailed(limit: number | undefined, tenant: Tenant): Promise<JobRunFailure[]>;
  listJobRuns(query: Record<string, unknown>, tenant: Tenant): Promise<JobRunPage>;
  getRunTree(rootRunId: string, tenant: Tenant): Promise<RunTreeNode | null>;
  listRunEvents(runId: string, page: { cursor?: string | undefined; limit?: number | undefined }, tenant: Tenant): Promise<JobRunEventPage>;
  /** The Prometheus text exposition (see `JobOrchestrator.metrics`). */
  metrics(): Promise<string>;
  /** Ends per minute and status, and the first minute of the window the engine read. */
  throughput(minutes: number | undefined, tenant: Tenant): Promise<{ since: number; rows: [number, string, number][] }>;

  // ── schedules ──
  putSchedule(request: Record<string, unknown>): Promise<JobSchedule>;
  removeSchedule(name: string, tenant: Tenant): Promise<boolean>;
  listSchedules(tenant: Tenant): Promise<JobSchedule[]>;
  fireDueSchedules(): Promise<number>;
  // durable waits (what `ctx` calls is in `StepStore`)
  signal(runId: string, name: string, payloadText: string | undefined, tenant: Tenant): Promise<boolean>;
  /** `runId`: the token must be that run's. */
  resume(token: string, payloadText: string | undefined, tenant: Tenant, runId?: string): Promise<string>;

  // ── worker ──
  startWorker(pools: { name: string; concurrency: number }[], onBatch: (text: string) => void, link: WorkerLink): void;
  /** Records ended attempts (`reportLine`s); answers `'0'|'1'` (notices pending) and the tickets it claimed. */
  workerReport(report: string): string;
  /** Claims into the worker's idle slots (after a start): tickets one per line. */
  workerFill(): string;
  workerStop(): number;
  workerInFlight(): number;
  /** Whether a ticket that crossed threads is still its run's current attempt (a store that cannot tell at once: true). */
  liveNow(runId: string, epoch: number): boolean;
  /** A worker attempt's handler starts: its run's timeout counts from now (no I/O). */
  attemptStarted(runId: string, epoch: number): void;
  /** An attempt's handler settled in time: the timeout stops before its outcome is stored (no I/O). */
  attemptSettled(runId: string, epoch: number): void;
}

/**
 * The engine's notice callback, for an engine built before its backend
 * exists (`ref.backend` is set right after). A threadsafe function is
 * invisible to the garbage collector: a callback holding the backend would
 * keep it, its engine and every run alive forever, so it holds a WeakRef,
 * and is made here: a closure made in a constructor shares a context that
 * may hold `this`.
 */
export function noticeCallback(ref: { backend?: WeakRef<NativeBackend> }): () => void {
  // Nudged: the queue is taken even when nobody wants it, so it cannot grow.
  return () => ref.backend?.deref()?.drainNotices(true);
}

/**
 * The operations of `Backend`, written once over the native engine's
 * operation list. A store provides `request`: how one operation reaches
 * the engine and comes back.
 */
export abstract class NativeBackend implements Partial<Backend> {
  abstract readonly kind: 'memory' | 'postgres';
  abstract readonly clock: EngineClock;
  abstract readonly tickets: TicketReader;
  protected worker: WorkerLink | null = null;

  constructor(
    protected readonly native: NativeEngine,
    protected readonly sink: NoticeSink,
  ) {}

  /** Runs `op` with its request; `decode` turns the answer into the result. */
  protected abstract request<T>(op: OpName, req: string, decode: (text: string) => T): Promise<T>;

  /** A call that may have canceled running runs or emitted events: their notices go out with its answer. */
  protected mutate<T>(op: OpName, req: string, decode: (text: string) => T): Promise<T> {
    return this.request(op, req, (text) => {
      this.drainNotices();
      return decode(text);
    });
  }

  /**
   * Delivers the engine's queued notices, if anyone listens (after a call:
   * saves a native call otherwise). `always`: the engine nudged, take them
   * whether or not anyone listens, so the queue cannot grow in a process
   * that only cancels runs others execute.
   */
  drainNotices(always = false): void {
    const wanted = this.sink.wanted();
    if (!wanted && !always) return;
    const json = this.native.takeNotices();
    if (json === null) return;
    const notices = parseNotices(json);
    if (wanted) this.sink.deliver(notices);
    // The engine's timer found timeouts due: applied once the microtasks
    // queued now have run, as a JS timer would fire (these notices may be
    // taken inside any call's microtask). A handler whose result is
    // already on its way settles first and stops its clock. One expiry
    // at a time: against a failing store the timer asks less and less
    // often, and calls must not pile up.
    if (notices.expire && !this.expiring) {
      this.expiring = true;
      setImmediate(this.expireDue);
    }
  }

  private expiring = false;

  private readonly expireDue = (): void => {
    void this.mutate('expireAttempts', '{}', () => undefined)
      .catch(() => undefined)
      .finally(() => {
        this.expiring = false;
      });
  };

  protected callNative(op: OpName, req: string): string {
    try {
      return this.native.callSync(OP[op], req);
    } catch (e) {
      throw decodeNativeError(e);
    }
  }

  advanceTime(ms: number): number | null {
    let t: number | null;
    try {
      t = this.native.advanceTime(ms);
    } catch (e) {
      throw decodeNativeError(e);
    }
    // Timeouts that fell due were applied: their aborts go out now.
    this.drainNotices();
    return t;
  }

  setEvents(on: boolean): boolean {
    return this.native.setEvents(on);
  }

  watchRun(runId: string, on: boolean): void {
    this.native.watchRun(runId, on);
  }

  attemptStarted(runId: string, epoch: number): void {
    this.native.attemptStarted(runId, epoch);
  }

  attemptSettled(runId: string, epoch: number): void {
    this.native.attemptSettled(runId, epoch);
  }

  migrate(): Promise<void> {
    return this.request('migrate', '{}', () => undefined);
  }

  storedJobTypes(): Promise<string[]> {
    return this.request('storedJobTypes', '{}', (t) => JSON.parse(t) as string[]);
  }

  definition(type: string): Promise<JobDefinitionRow | null> {
    return this.request('definition', requestJson({ type }), (t) => (t === 'null' ? null : parseDefinitions(`[${t}]`)[0]!));
  }

  /** The engine's `start`: the row of the new run or of the dedupe hit. */
  protected startInEngine(p: PreparedStart): Promise<JobRun> {
    const opts = p.opts === null ? null : startWireJson(p.opts);
    return this.mutate('start', startRequest(p.type, p.inputText, opts), parseRun);
  }

  /** The `startMany` request of prepared starts (`grouped`: each on its own, see `Engine::start_group`). */
  protected startManyRequest(entries: PreparedStart[], grouped: boolean): string {
    let text = '{"entries":[';
    for (let i = 0; i < entries.length; i++) {
      const p = entries[i]!;
      if (i > 0) text += ',';
      text += startRequest(p.type, p.inputText, p.opts === null ? null : startWireJson(p.opts));
    }
    return text + (grouped ? '],"grouped":true}' : ']}');
  }

  startMany(entries: PreparedStart[]): Promise<JobRun[]> {
    return this.mutate('startMany', this.startManyRequest(entries, false), parseRuns);
  }

  /** Rejects with the error of a JS key function, after the engine's earlier checks (tenant gate, job type). */
  protected preflight(p: PreparedStart, thrown: { error: unknown }): Promise<never> {
    const req = requestJson({ type: p.type, tenant: p.tenant, hasParent: p.hasParent });
    return this.request('startPreflight', req, () => {
      throw thrown.error;
    });
  }

  cancel(runId: string, cascade: boolean, tenant: Tenant, note?: string): Promise<void> {
    return this.mutate('cancel', requestJson({ runId, cascade, tenant, note }), () => undefined);
  }

  replay(runId: string, tenant: Tenant): Promise<JobRun> {
    return this.mutate('replay', requestJson({ runId, tenant }), parseRun);
  }

  claimNext(pool: string): Promise<JobRun | null> {
    return this.request('claimNext', requestJson({ pool }), parseOptRun);
  }

  beginAttempt(runId: string): Promise<Ticket> {
    return this.request('beginAttempt', requestJson({ runId }), (t) => this.tickets.read(t));
  }

  finishAttempt(runId: string, epoch: number, outcomeText: string): Promise<boolean> {
    const req = `{"runId":${requestJson(runId)},"epoch":${epoch},"outcome":${outcomeText}}`;
    return this.mutate('finishAttempt', req, (t) => t === 'true');
  }

  releaseAttempt(runId: string, epoch: number): Promise<boolean> {
    return this.request('releaseAttempt', requestJson({ runId, epoch }), (t) => t === 'true');
  }

  attemptLive(runId: string, epoch: number): Promise<boolean> {
    return this.request('attemptLive', requestJson({ runId, epoch }), (t) => t === 'true');
  }

  stepBegin(runId: string, epoch: number, stepId: string): Promise<{ memoized: true; output: unknown } | { memoized: false; attempt: number }> {
    // By hand: a ticket's run id is the engine's canonical UUID (nothing to escape).
    return this.request('stepBegin', `{"runId":"${runId}","epoch":${epoch},"stepId":${requestJson(stepId)}}`, (t) => JSON.parse(t) as { memoized: false; attempt: number });
  }

  stepComplete(runId: string, epoch: number, stepId: string, outputText: string): Promise<void> {
    const req = `{"runId":${requestJson(runId)},"epoch":${epoch},"stepId":${requestJson(stepId)},"output":${outputText}}`;
    return this.request('stepComplete', req, () => undefined);
  }

  stepFail(runId: string, epoch: number, stepId: string, failure: string, policyText: string | null): Promise<number | null> {
    const policy = policyText === null ? '' : `,"policy":${policyText}`;
    const req = `{"runId":${requestJson(runId)},"epoch":${epoch},"stepId":${requestJson(stepId)},"failure":${failure}${policy}}`;
    return this.request('stepFail', req, (t) => (t === 'null' ? null : Number(t)));
  }

  waitBegin(runId: string, epoch: number, stepId: string, waitText: string): Promise<WaitAnswer> {
    const req = `{"runId":"${runId}","epoch":${epoch},"stepId":${requestJson(stepId)},"wait":${waitText}}`;
    // Only a child's start may cancel (a `replace` lane) or emit events:
    // the other waits need not look for notices.
    return waitText.startsWith('{"kind":"child"') ? this.mutate('waitBegin', req, parseWait) : this.request('waitBegin', req, parseWait);
  }

  waitDelivered(runId: string, epoch: number, stepId: string): Promise<WaitAnswer> {
    return this.request('waitDelivered', requestJson({ runId, epoch, stepId }), parseWait);
  }

  signal(runId: string, name: string, payloadText: string | undefined, tenant: Tenant): Promise<boolean> {
    const payload = payloadText === undefined ? '' : `,"payload":${payloadText}`;
    const req = `{"runId":${requestJson(runId)},"signal":${requestJson(name)}${payload}${tenantField(tenant)}}`;
    return this.mutate('signal', req, (t) => t === 'true');
  }

  resume(token: string, payloadText: string | undefined, tenant: Tenant, runId?: string): Promise<string> {
    const payload = payloadText === undefined ? '' : `,"payload":${payloadText}`;
    const run = runId === undefined ? '' : `,"runId":${requestJson(runId)}`;
    const req = `{"token":${requestJson(token)}${payload}${tenantField(tenant)}${run}}`;
    return this.mutate('resume', req, (t) => JSON.parse(t) as string);
  }

  findById(runId: string, tenant: Tenant): Promise<JobRun | null> {
    return this.request('findById', requestJson({ runId, tenant }), parseOptRun);
  }

  getRun(runId: string, tenant: Tenant): Promise<JobRun | null> {
    return this.request('getRun', requestJson({ runId, tenant }), parseOptRun);
  }

  countRuns(tenant: Tenant): Promise<number> {
    return this.request('countRuns', requestJson({ tenant }), Number);
  }

  listSteps(runId: string, tenant: Tenant): Promise<JobStep[]> {
    return this.request('listSteps', requestJson({ runId, tenant }), parseSteps);
  }

  findStep(runId: string, stepId: string, tenant: Tenant): Promise<JobStep | null> {
    return this.request('findStep', requestJson({ runId, stepId, tenant }), parseOptStep);
  }

  recordStep(record: Record<string, unknown>, tenant: Tenant): Promise<JobStep> {
    return this.request('recordStep', JSON.stringify({ record, tenant }), (t) => parseOptStep(t)!);
  }

  listForScope(entityType: string, entityId: string, query: Record<string, unknown>, tenant: Tenant): Promise<JobRun[]> {
    return this.request('listForScope', requestJson({ entityType, entityId, query, tenant }), parseRuns);
  }

  cancelForScope(entityType: string, entityId: string, cascade: boolean, tenant: Tenant, note?: string): Promise<number> {
    return this.mutate('cancelForScope', requestJson({ entityType, entityId, cascade, tenant, note }), Number);
  }

  rescheduleForScope(entityType: string, entityId: string, runAt: number, tenant: Tenant): Promise<number> {
    return this.request('rescheduleForScope', requestJson({ entityType, entityId, runAt, tenant }), Number);
  }

  countByPoolAndStatus(tenant: Tenant): Promise<{ pool: string; status: JobRun['status']; count: number }[]> {
    return this.request('countByPoolAndStatus', requestJson({ tenant }), (t) => JSON.parse(t) as { pool: string; status: JobRun['status']; count: number }[]);
  }

  listRecentFailed(limit: number | undefined, tenant: Tenant): Promise<JobRunFailure[]> {
    return this.request('listRecentFailed', requestJson({ limit, tenant }), parseFailures);
  }

  listJobRuns(query: Record<string, unknown>, tenant: Tenant): Promise<JobRunPage> {
    return this.request('listJobRuns', requestJson({ query, tenant }), parsePage);
  }

  getRunTree(rootRunId: string, tenant: Tenant): Promise<RunTreeNode | null> {
    return this.request('getRunTree', requestJson({ runId: rootRunId, tenant }), parseTree);
  }

  listRunEvents(runId: string, page: { cursor?: string | undefined; limit?: number | undefined }, tenant: Tenant): Promise<JobRunEventPage> {
    return this.request('listRunEvents', requestJson({ runId, cursor: page.cursor, limit: page.limit, tenant }), parseEventPage);
  }

  metrics(): Promise<string> {
    return this.request('metrics', '{}', (t) => t);
  }

  throughput(minutes: number | undefined, tenant: Tenant): Promise<{ since: number; rows: [number, string, number][] }> {
    return this.request('throughput', requestJson({ minutes, tenant }), (t) => JSON.parse(t) as { since: number; rows: [number, string, number][] });
  }

  putSchedule(request: Record<string, unknown>): Promise<JobSchedule> {
    return this.request('putSchedule', JSON.stringify(request), (t) => decodeSchedule(JSON.parse(t) as Record<string, unknown>));
  }

  removeSchedule(name: string, tenant: Tenant): Promise<boolean> {
    return this.request('removeSchedule', requestJson({ name, tenant }), (t) => t === 'true');
  }

  listSchedules(tenant: Tenant): Promise<JobSchedule[]> {
    return this.request('listSchedules', requestJson({ tenant }), (t) => (JSON.parse(t) as Record<string, unknown>[]).map(decodeSchedule));
  }

  fireDueSchedules(): Promise<number> {
    return this.mutate('fireDueSchedules', '{}', Number);
  }

  workerStop(): number {
    return this.native.workerStop();
  }

  workerInFlight(): number {
    return this.native.workerInFlight();
  }
}
