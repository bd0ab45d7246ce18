/**
 * PostgreSQL: every operation that touches the database runs on a
 * blocking thread of the addon (`call`), so the JS thread never waits on
 * I/O; any number of processes share the store. Definitions are checked at
 * once (so `registerHandler` throws synchronously, as in memory) and
 * written in the background; calls that need them wait for that first.
 */
import { EngineClock } from '../clock';
import { JobInputInvalidError, JobStoreError } from '../errors';
import type { JobDefinitionRow, JobRun } from '../rows';
import { NativeEngine, OP, type OpName } from '../native';
import { checkKeys, checkText } from '../validate';
import { decodeNativeError, parseGroup, parseRegistration, TicketReader } from '../wire';
import { NativeBackend, noticeCallback, type Backend, type NoticeSink, type PreparedStart, type WorkerLink } from './backend';

export interface PostgresOptions {
  /** `postgres://user:password@host:port/database`. */
  url: string;
  /** Schema of jobforge's tables (created by `migrate()`). Default `public`. */
  schema?: string | undefined;
  /** Connection pool size of this process. Default 10. */
  maxConnections?: number | undefined;
  /**
   * A claimed run whose lease is not renewed for this long goes back to
   * `pending` (its worker died). The worker renews every leaseMs/3. Default 30000.
   */
  leaseMs?: number | undefined;
  /** Polling fallback of the worker when no notification arrives. Default 1000. */
  pollMs?: number | undefined;
  /**
   * Runs each worker pool claims ahead of its free slots (leased and
   * heartbeated like any claim, handed to the next free slot without a
   * database round trip, returned to `pending` at once by `stop()`, and by
   * the lease sweeper if the process dies). A run that becomes due after
   * others were prefetched may start after up to `prefetch` of them per
   * process and pool, even at a higher priority; and a queue longer than
   * the pool's concurrency hoards a burst: the first process to claim takes
   * up to its slots plus its queue while other processes' slots stay idle.
   * Unset (the default), each pool's queue follows its pace: what it
   * ended in the last 100 ms, at least its concurrency, at most 200 (fast
   * handlers get long queues, slow ones share a burst). 0 turns it off; a
   * number fixes the queue at that length.
   */
  prefetch?: number | undefined;
  /**
   * Concurrent `start` calls share one transaction (one commit) instead of
   * one each: the starts made while the previous group is in flight, or
   * in the same turn of the event loop, go in together. Each promise still
   * resolves with its own row, or rejects with its own error. Default true.
   */
  groupStarts?: boolean | undefined;
}

const POSTGRES_OPTION_KEYS: ReadonlySet<string> = new Set(['url', 'schema', 'maxConnections', 'leaseMs', 'pollMs', 'prefetch', 'groupStarts']);

/** Checks the `postgres` options of an orchestrator. */
export function checkPostgresOptions(pgo: unknown): asserts pgo is PostgresOptions {
  const o = pgo as PostgresOptions | null | undefined;
  if (o === null || typeof o !== 'object' || typeof o.url !== 'string' || o.url.length === 0) {
    throw new JobInputInvalidError("backend 'postgres' needs postgres.url (a connection string)");
  }
  // A misspelt key (`maxConnection`, `ssl`) would be ignored without a word.
  checkKeys(o, POSTGRES_OPTION_KEYS, 'postgres options');
  if (o.schema !== undefined && (typeof o.schema !== 'string' || o.schema.length === 0)) {
    throw new JobInputInvalidError('postgres.schema must be a non-empty string');
  }
  if (o.schema !== undefined) checkSchemaName(o.schema);
  const positive = (v: unknown, name: string) => {
    if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)) {
      throw new JobInputInvalidError(`postgres.${name} must be a positive number, got ${String(v)}`);
    }
  };
  positive(o.maxConnections, 'maxConnections');
  positive(o.leaseMs, 'leaseMs');
  positive(o.pollMs, 'pollMs');
  if (o.prefetch !== undefined && !(typeof o.prefetch === 'number' && Number.isInteger(o.prefetch) && o.prefetch >= 0 && o.prefetch <= 1000)) {
    throw new JobInputInvalidError(`postgres.prefetch must be a whole number from 0 to 1000, got ${String(o.prefetch)}`);
  }
  if (o.groupStarts !== undefined && typeof o.groupStarts !== 'boolean') {
    throw new JobInputInvalidError(`postgres.groupStarts must be a boolean, got ${String(o.groupStarts)}`);
  }
}

/**
 * A schema name PostgreSQL keeps as given: at most 63 bytes (a longer one
 * is cut, so two names could share one schema's tables), no NUL, no
 * apostrophe (the name is written inside a text literal in the DDL), not
 * the migration block's quoting tag.
 */
function checkSchemaName(schema: string): void {
  checkText(schema, 'postgres.schema');
  if (Buffer.byteLength(schema, 'utf8') > 63) {
    throw new JobInputInvalidError(`postgres.schema must be at most 63 bytes (PostgreSQL cuts longer names), got ${Buffer.byteLength(schema, 'utf8')}`);
  }
  if (schema.includes('\0') || schema.includes("'") || schema.includes('$jobforge$')) {
    throw new JobInputInvalidError("postgres.schema must not hold a NUL, an apostrophe or the text $jobforge$");
  }
}

/** At most this many starts share one transaction; more wait for the next. */
const GROUP_MAX = 1000;

/** A start waiting for its group. */
interface GroupedStart {
  p: PreparedStart;
  resolve(run: JobRun): void;
  reject(e: unknown): void;
}

export class PostgresBackend extends NativeBackend implements Backend {
  readonly kind = 'postgres' as const;
  readonly shared = true;
  readonly clock: EngineClock;
  readonly tickets = new TicketReader();
  /** Background definition writes, in order; every call that needs definitions awaits them. */
  private registering: Promise<void> = Promise.resolve();
  private registerError: unknown = null;
  /** A definition write failed: the database may lack some of `specs`. */
  private defsUnsaved = false;
  /** The latest spec of every registered type (written again after `migrate()` or a failed write). */
  private readonly specs = new Map<string, Record<string, unknown>>();
  private readonly groupStarts: boolean;
  /** Starts waiting for the next group (see `PostgresOptions.groupStarts`). */
  private waiting: GroupedStart[] = [];
  private groupArmed = false;
  /** The group in flight (settles when its starts are answered), or null. */
  private groupInFlight: Promise<void> | null = null;

  constructor(
    o: {
      multiTenant: boolean;
      clock: 'system' | 'manual';
      retention?: { completedMs?: number | undefined; failedMs?: number | undefined } | undefined;
      timeline?: boolean | undefined;
    },
    pg: PostgresOptions,
    sink: NoticeSink,
  ) {
    const ref: { backend?: WeakRef<NativeBackend> } = {};
    let native: NativeEngine;
    try {
      native = new NativeEngine(
        {
          store: 'postgres',
          url: pg.url,
          schema: pg.schema,
          maxConnections: pg.maxConnections === undefined ? undefined : Math.floor(pg.maxConnections),
          multiTenant: o.multiTenant,
          clock: o.clock,
          retainCompletedMs: o.retention?.completedMs,
          retainFailedMs: o.retention?.failedMs,
          timeline: o.timeline,
          leaseMs: pg.leaseMs,
          pollMs: pg.pollMs,
          prefetch: pg.prefetch,
        },
        noticeCallback(ref),
      );
    } catch (e) {
      throw decodeNativeError(e);
    }
    super(native, sink);
    ref.backend = new WeakRef(this);
    this.clock = new EngineClock(o.clock, () => native.now());
    this.groupStarts = pg.groupStarts ?? true;
  }

  protected request<T>(op: OpName, req: string, decode: (text: string) => T): Promise<T> {
    return this.native.call(OP[op], req).then(decode, (e: unknown) => {
      throw decodeNativeError(e);
    });
  }

  /**
   * Waits for background definition writes. After one failed (the
   * database was down, or its tables not created yet), every definition is
   * written again first, so handlers registered during an outage are
   * stored once the database answers; a failure is thrown.
   */
  async ready(): Promise<void> {
    await this.registering;
    if (this.defsUnsaved && this.specs.size > 0) {
      this.defsUnsaved = false;
      this.registerError = null;
      this.persist(JSON.stringify([...this.specs.values()]));
      await this.registering;
    }
    if (this.registerError !== null) {
      const e = this.registerError;
      this.registerError = null;
      throw e;
    }
  }

  override async migrate(): Promise<void> {
    await this.registering;
    await super.migrate();
    // Handlers registered before the tables existed could not be stored:
    // store them now.
    this.registerError = null;
    this.defsUnsaved = this.specs.size > 0;
    await this.ready();
  }

  async close(): Promise<void> {
    await this.registering.catch(() => undefined);
    // Starts made before close() still go in (their promises settle).
    while (this.groupInFlight !== null || this.waiting.length > 0) {
      if (this.groupInFlight === null) this.sendGroup();
      await this.groupInFlight;
    }
    this.native.close();
  }

  register(specs: Record<string, unknown>[]): JobDefinitionRow[] {
    const text = JSON.stringify(specs);
    let defs: JobDefinitionRow[];
    try {
      defs = parseRegistration(this.native.validateDefinitions(text)).definitions;
    } catch (e) {
      throw decodeNativeError(e);
    }
    for (const spec of specs) this.specs.set(spec.type as string, spec);
    this.persist(text);
    return defs;
  }

  /** Writes definitions to the database in the background (see `ready`). */
  private persist(specsText: string): void {
    this.registering = this.registering.then(() =>
      this.request('register', specsText, () => undefined).then(
        () => undefined,
        (e: unknown) => {
          this.registerError = e;
          this.defsUnsaved = true;
        },
      ),
    );
  }

  start(p: PreparedStart): Promise<JobRun> {
    if (p.thrown !== null) return this.preflight(p, p.thrown);
    if (!this.groupStarts) return this.startInEngine(p);
    return new Promise<JobRun>((resolve, reject) => {
      this.waiting.push({ p, resolve, reject });
      this.armGroup();
    });
  }

  /**
   * Sends the waiting starts on the next turn of the event loop (so the
   * starts of this turn go together), unless a group is in flight: its
   * end sends the next. One group in flight at a time: two groups of one
   * process could take the same lane and dedupe locks in opposite orders.
   */
  private armGroup(): void {
    if (this.groupArmed || this.groupInFlight !== null || this.waiting.length === 0) return;
    this.groupArmed = true;
    setImmediate(this.sendGroup);
  }

  private readonly sendGroup = (): void => {
    this.groupArmed = false;
    if (this.groupInFlight !== null) return; // its end sends the next
    const group = this.waiting.length <= GROUP_MAX ? this.waiting : this.waiting.slice(0, GROUP_MAX);
    this.waiting = group === this.waiting ? [] : this.waiting.slice(GROUP_MAX);
    if (group.length === 0) return;
    this.groupInFlight = this.runGroup(group).finally(() => {
      this.groupInFlight = null;
      this.armGroup();
    });
  };

  /**
   * One transaction for the group, each start answered on its own
   * (`Engine::start_group`); a lone start is a plain `start`. A deadlock
   * with another process's transaction rolled the whole group back before
   * its commit (nothing of it stored): its starts are tried again one by
   * one, which cannot deadlock with each other.
   */
  private runGroup(group: GroupedStart[]): Promise<void> {
    if (group.length === 1) {
      const g = group[0]!;
      return this.startInEngine(g.p).then(g.resolve, g.reject);
    }
    const req = this.startManyRequest(
      group.map((g) => g.p),
      true,
    );
    return this.mutate('startMany', req, parseGroup).then(
      (answers) => {
        group.forEach((g, i) => {
          const a = answers[i];
          if (a === undefined) g.reject(new JobStoreError('the start group answered no row for this start', false));
          else if ('run' in a) g.resolve(a.run);
          else g.reject(a.error);
        });
      },
      (e: unknown) => {
        if (e instanceof JobStoreError && e.message.includes('deadlock detected')) {
          return Promise.all(group.map((g) => this.startInEngine(g.p).then(g.resolve, g.reject))).then(() => undefined);
        }
        for (const g of group) g.reject(e);
        return undefined;
      },
    );
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

  /** Queues the outcomes for the worker's next transaction (no I/O here). */
  workerReport(report: string): string {
    try {
      return this.native.workerReport(report, null);
    } catch (e) {
      throw decodeNativeError(e);
    }
  }

  workerFill(): string {
    return '';
  }

  /** Tickets come straight from a committed claim; an outcome for a run canceled since is ignored by the engine. */
  liveNow(): boolean {
    return true;
  }
}
