/**
 * Every format that crosses the napi boundary, TS side. Its Rust twin is
 * `src/wire.rs`; `__test__/wire.spec.ts` round-trips each one through the
 * addon. Internal: nothing here is exported from the package.
 *
 * - run rows arrive as tuples in `RUN_FIELDS` order (the addon's
 *   `runFields()` must say the same: checked at load, see `checkRunFields`);
 * - operation requests are JSON objects (a tenant is one field, `tenant`:
 *   left out for `undefined`, as `JSON.stringify` does);
 * - engine errors arrive as `JOBFORGE_ERROR:{code,message,fields}`;
 * - tickets, worker report lines and start lines are hand-written text on
 *   every run's path.
 */
import {
  JobCollisionError,
  JobInputInvalidError,
  JobKeyFunctionUnavailableError,
  JobNotReplayableError,
  JobResumeTokenError,
  JobRunNotFoundError,
  JobRunStateError,
  JobStepConflictError,
  JobStoreError,
  JobTemplateFieldMissingError,
  JobTypeNotFoundError,
  JobforgeError,
  MissingTenantIdError,
  ParentRunNotFoundError,
} from './errors';
import { toJsonText } from './json';
import type {
  JobDefinitionRow,
  JobRun,
  JobRunError,
  JobRunFailure,
  JobRunPage,
  JobRunEventPage,
  JobRunRow,
  JobRunStatus,
  JobRunSummary,
  JobSchedule,
  JobStep,
  JobWaitKind,
  RunTreeNode,
} from './rows';

// ── run rows ───────────────────────────────────────────────────────────

/** Field order of a run tuple (`RUN_FIELDS` in the core's model.rs). */
export const RUN_FIELDS = [
  'id', 'jobType', 'jobVersion', 'parentRunId', 'rootRunId', 'parentClosePolicy', 'scopeEntityType',
  'scopeEntityId', 'tenantId', 'tags', 'pool', 'priority', 'concurrencyKey', 'dedupeKey', 'status', 'input',
  'output', 'error', 'triggerSource', 'triggerRef', 'runAt', 'startedAt', 'finishedAt', 'claimedAt', 'attempts',
  'waitKind', 'waitDeadline', 'createdAt', 'updatedAt',
] as const;

/** Throws when the addon's tuple order is not `RUN_FIELDS` (a build of another version). */
export function checkRunFields(native: readonly string[]): void {
  if (native.length !== RUN_FIELDS.length || native.some((f, i) => f !== RUN_FIELDS[i])) {
    throw new Error(`jobforge: the native addon's run fields (${native.join(',')}) are not this build's; rebuild it`);
  }
}

/**
 * The engine's wire form of a run: a JSON array in `RUN_FIELDS` order.
 * Decoding an array into an object literal of fixed shape is about twice
 * as fast as parsing keyed JSON.
 */
export type RunTuple = [
  string, string, number, string | null, string, JobRunRow['parentClosePolicy'],
  string | null, string | null, string | null, Record<string, string>, string, number,
  string | null, string | null, JobRunStatus, Record<string, unknown>, Record<string, unknown> | null,
  JobRunError | null, JobRunRow['triggerSource'], string | null, number, number | null,
  number | null, number | null, number, JobWaitKind | null, number | null, number, number,
];

export function fromTuple(a: RunTuple): JobRun {
  return {
    id: a[0],
    jobType: a[1],
    jobVersion: a[2],
    parentRunId: a[3],
    rootRunId: a[4],
    parentClosePolicy: a[5],
    scopeEntityType: a[6],
    scopeEntityId: a[7],
    tenantId: a[8],
    tags: a[9],
    pool: a[10],
    priority: a[11],
    concurrencyKey: a[12],
    dedupeKey: a[13],
    status: a[14],
    input: a[15],
    output: a[16],
    error: a[17],
    triggerSource: a[18],
    triggerRef: a[19],
    runAt: new Date(a[20]),
    startedAt: a[21] === null ? null : new Date(a[21]),
    finishedAt: a[22] === null ? null : new Date(a[22]),
    claimedAt: a[23] === null ? null : new Date(a[23]),
    attempts: a[24],
    waitKind: a[25],
    resumeToken: null,
    waitDeadline: a[26] === null ? null : new Date(a[26]),
    createdAt: new Date(a[27]),
    updatedAt: new Date(a[28]),
  };
}

export function parseRun(json: string): JobRun {
  return fromTuple(JSON.parse(json) as RunTuple);
}

export function parseOptRun(json: string): JobRun | null {
  return json === 'null' ? null : parseRun(json);
}

export function parseRuns(json: string): JobRun[] {
  return (JSON.parse(json) as RunTuple[]).map(fromTuple);
}

/** A grouped `startMany`'s answer (`group_text` in Rust): per start, its run or its error. */
export function parseGroup(json: string): ({ run: JobRun } | { error: unknown })[] {
  return (JSON.parse(json) as (RunTuple | { error: string })[]).map((a) =>
    Array.isArray(a) ? { run: fromTuple(a) } : { error: decodeNativeError(new Error(a.error)) },
  );
}

/** What the engine decided of a new run that its start does not say (`started_text` in Rust). */
export interface Decided {
  concurrencyKey: string | null;
  dedupeKey: string | null;
  rootRunId: string;
  tenantId: string | null;
  /** As the engine stores it (canonical, however the caller spelled it). */
  parentRunId: string | null;
}

/**
 * A new run's row: its type's template (the row the engine's `new_run`
 * builds for a start with no options, `run_template`) with the start's own
 * values, `o` as `startOptions` checked them, and what the engine decided.
 * The defaults of a row are the engine's; this only fills in what the
 * caller or the engine chose. Used for starts answered here (buffered) and
 * for a created run the engine answered the short way.
 */
export function newRun(
  t: JobRun,
  id: string,
  at: number,
  input: Record<string, unknown>,
  o: StartWire | null,
  scopeEntityType: string | null,
  tenantId: string | null,
  d: Decided | null,
): JobRun {
  if (o === null) {
    return {
      id, jobType: t.jobType, jobVersion: t.jobVersion, parentRunId: null, rootRunId: id,
      parentClosePolicy: t.parentClosePolicy, scopeEntityType: null, scopeEntityId: null,
      tenantId: d === null ? tenantId : d.tenantId, tags: {}, pool: t.pool, priority: t.priority,
      concurrencyKey: d === null ? null : d.concurrencyKey, dedupeKey: d === null ? null : d.dedupeKey,
      status: t.status, input, output: null, error: null, triggerSource: t.triggerSource, triggerRef: null,
      runAt: new Date(at), startedAt: null, finishedAt: null, claimedAt: null, attempts: 0,
      waitKind: null, resumeToken: null, waitDeadline: null, createdAt: new Date(at), updatedAt: new Date(at),
    };
  }
  const scope = o.scope;
  const fromMeta = o.scopeEntityIdFromMeta;
  return {
    id,
    jobType: t.jobType,
    jobVersion: t.jobVersion,
    parentRunId: d === null ? null : d.parentRunId,
    rootRunId: d === null ? id : d.rootRunId,
    parentClosePolicy: o.parentClosePolicy ?? t.parentClosePolicy,
    scopeEntityType: scope !== undefined ? scope.entityType : fromMeta !== undefined ? scopeEntityType : null,
    scopeEntityId: scope !== undefined ? scope.entityId : fromMeta ?? null,
    tenantId: d === null ? tenantId : d.tenantId,
    tags: o.tags === undefined ? {} : { ...o.tags },
    pool: o.pool ?? t.pool,
    priority: o.priority ?? t.priority,
    concurrencyKey: d === null ? null : d.concurrencyKey,
    dedupeKey: d === null ? null : d.dedupeKey,
    status: t.status,
    input,
    output: null,
    error: null,
    triggerSource: o.triggerSource ?? t.triggerSource,
    triggerRef: o.triggerRef ?? null,
    runAt: new Date(o.runAt ?? at),
    startedAt: null,
    finishedAt: null,
    claimedAt: null,
    attempts: 0,
    waitKind: null,
    resumeToken: null,
    waitDeadline: null,
    createdAt: new Date(at),
    updatedAt: new Date(at),
  };
}

/** `register`'s answer (`registered_text` in Rust): the definitions and each one's template row. */
export function parseRegistration(json: string): { definitions: JobDefinitionRow[]; templates: JobRun[] } {
  const r = JSON.parse(json) as { definitions: Raw[]; templates: RunTuple[] };
  return { definitions: r.definitions.map(decodeDefinition), templates: r.templates.map(fromTuple) };
}

/**
 * `start`'s answer when asked for the short form (`started_text` in Rust):
 * a new run's id, time and `Decided`, read by position with slices, or a
 * whole row (a dedupe hit: a JSON tuple).
 */
export function parseStarted(text: string): { id: string; at: number; decided: Decided } | { row: JobRun } {
  if (text.charCodeAt(0) === 0x5b /* [ */) return { row: parseRun(text) };
  const id = text.slice(0, 36);
  const comma = text.indexOf(',', 36);
  const at = Number(text.slice(36, comma));
  const r = new ShortReader(text, comma + 1);
  const concurrencyKey = r.field();
  const dedupeKey = r.field();
  const rootRunId = r.same() ? id : (r.field() as string);
  const tenantId = r.field();
  const parentRunId = r.field();
  return { id, at, decided: { concurrencyKey, dedupeKey, rootRunId, tenantId, parentRunId } };
}

/** The fields of a short start answer: `-` (null) or `<length>:<text>`. */
class ShortReader {
  constructor(
    private readonly text: string,
    private at: number,
  ) {}

  field(): string | null {
    const t = this.text;
    if (t.charCodeAt(this.at) === 0x2d /* - */) {
      this.at++;
      return null;
    }
    const colon = t.indexOf(':', this.at);
    const end = colon + 1 + Number(t.slice(this.at, colon));
    const v = t.slice(colon + 1, end);
    this.at = end;
    return v;
  }

  /** `=`: the root is the run itself. */
  same(): boolean {
    if (this.text.charCodeAt(this.at) !== 0x3d /* = */) return false;
    this.at++;
    return true;
  }
}

/** `{run, children}` nested (root first), decoded without recursion: a chain of runs can be thousands deep. */
export function parseTree(json: string): RunTreeNode | null {
  if (json === 'null') return null;
  type RawNode = { run: RunTuple; children: RawNode[] };
  const raw = JSON.parse(json) as RawNode;
  const root: RunTreeNode = { run: fromTuple(raw.run), children: [] };
  const todo: [RawNode, RunTreeNode][] = [[raw, root]];
  for (let next = todo.pop(); next; next = todo.pop()) {
    const [from, to] = next;
    for (const c of from.children) {
      const node: RunTreeNode = { run: fromTuple(c.run), children: [] };
      to.children.push(node);
      todo.push([c, node]);
    }
  }
  return root;
}

/** `page_text` in Rust: `{items: [summary], nextCursor}`, a summary's times in epoch ms. */
/** `events_page_text`: a page of a run's timeline; times become Dates. */
export function parseEventPage(json: string): JobRunEventPage {
  const page = JSON.parse(json) as { items: Raw[]; nextCursor: string | null };
  for (const e of page.items) {
    e.at = new Date(e.at as number);
    const data = e.data as Raw | null;
    if (data !== null) {
      if (typeof data.deadline === 'number') data.deadline = new Date(data.deadline);
      if (typeof data.runAt === 'number') data.runAt = new Date(data.runAt);
    }
  }
  return page as unknown as JobRunEventPage;
}

export function parsePage(json: string): JobRunPage {
  const page = JSON.parse(json) as { items: Raw[]; nextCursor: string | null };
  return { items: page.items.map(decodeSummary), nextCursor: page.nextCursor };
}

/** One summary of `page_text` (`RunSummaryOut` in Rust). */
function decodeSummary(r: Raw): JobRunSummary {
  r.runAt = new Date(r.runAt as number);
  r.startedAt = date(r.startedAt);
  r.finishedAt = date(r.finishedAt);
  r.createdAt = new Date(r.createdAt as number);
  return r as unknown as JobRunSummary;
}

/** `failures_text` in Rust: `[failure]`, times in epoch ms. */
export function parseFailures(json: string): JobRunFailure[] {
  return (JSON.parse(json) as Raw[]).map((r) => {
    r.failedAt = new Date(r.failedAt as number);
    r.createdAt = new Date(r.createdAt as number);
    return r as unknown as JobRunFailure;
  });
}

// ── other rows ─────────────────────────────────────────────────────────

type Raw = Record<string, unknown>;
const date = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(v as number));

export function decodeStep(r: Raw): JobStep {
  r.startedAt = date(r.startedAt);
  r.finishedAt = date(r.finishedAt);
  return r as unknown as JobStep;
}

export function parseSteps(json: string): JobStep[] {
  return (JSON.parse(json) as Raw[]).map(decodeStep);
}

export function parseOptStep(json: string): JobStep | null {
  return json === 'null' ? null : decodeStep(JSON.parse(json) as Raw);
}

export function decodeDefinition(r: Raw): JobDefinitionRow {
  r.createdAt = new Date(r.createdAt as number);
  r.updatedAt = new Date(r.updatedAt as number);
  return r as unknown as JobDefinitionRow;
}

export function parseDefinitions(json: string): JobDefinitionRow[] {
  return (JSON.parse(json) as Raw[]).map(decodeDefinition);
}

export function decodeSchedule(r: Raw): JobSchedule {
  r.nextRunAt = date(r.nextRunAt);
  r.lastRunAt = date(r.lastRunAt);
  r.createdAt = new Date(r.createdAt as number);
  r.updatedAt = new Date(r.updatedAt as number);
  return r as unknown as JobSchedule;
}

// ── requests ───────────────────────────────────────────────────────────

/**
 * A start's options as the engine reads them (`StartOpts` in Rust), after
 * `startOptions` checked them: every start's options have one shape (the
 * code reading them stays monomorphic), and their JSON is written field by
 * field (`startWireJson`, faster than `JSON.stringify` for these few).
 */
export interface StartWire {
  tenant: string | null | undefined;
  scope: { entityType: string; entityId: string } | undefined;
  scopeEntityIdFromMeta: string | undefined;
  pool: string | undefined;
  runAt: number | undefined;
  priority: number | undefined;
  tags: Record<string, string> | undefined;
  triggerSource: JobRun['triggerSource'] | undefined;
  triggerRef: string | undefined;
  parentClosePolicy: JobRun['parentClosePolicy'] | undefined;
  parentRunId: string | undefined;
  concurrencyKey: string | undefined;
  dedupeKey: string | undefined;
}

/**
 * Empty start options. An object literal, not a class: the literal's
 * hidden class is held by this code (its boilerplate), while those a
 * class's field initializers step through are held weakly and die in
 * every full GC that finds no instance alive, which deoptimized the whole
 * option path after each one (V8 `--trace-deopt`: "weak objects"; a
 * `{ priority }` start right after a full GC cost 2.5–2.9 µs against 1.6
 * µs with the hidden classes kept alive).
 */
export function newStartWire(): StartWire {
  return {
    tenant: undefined,
    scope: undefined,
    scopeEntityIdFromMeta: undefined,
    pool: undefined,
    runAt: undefined,
    priority: undefined,
    tags: undefined,
    triggerSource: undefined,
    triggerRef: undefined,
    parentClosePolicy: undefined,
    parentRunId: undefined,
    concurrencyKey: undefined,
    dedupeKey: undefined,
  };
}

/** The options' JSON, as `StartOpts` reads it (and `quick_start_opts` in Rust, in this key order). */
export function startWireJson(w: StartWire): string {
  // Each field after the first is preceded by a comma (`c`): trimming a
  // leading one off the built string would flatten and copy it.
  const q = JSON.stringify;
  let s = '{';
  let c = '';
  if (w.tenant !== undefined) { s += `"tenant":${w.tenant === null ? 'null' : q(w.tenant)}`; c = ','; }
  if (w.scope !== undefined) { s += `${c}"scope":{"entityType":${q(w.scope.entityType)},"entityId":${q(w.scope.entityId)}}`; c = ','; }
  if (w.scopeEntityIdFromMeta !== undefined) { s += `${c}"scopeEntityIdFromMeta":${q(w.scopeEntityIdFromMeta)}`; c = ','; }
  if (w.pool !== undefined) { s += `${c}"pool":${q(w.pool)}`; c = ','; }
  if (w.runAt !== undefined) { s += `${c}"runAt":${w.runAt}`; c = ','; }
  if (w.priority !== undefined) { s += `${c}"priority":${w.priority}`; c = ','; }
  if (w.tags !== undefined) { s += `${c}"tags":${q(w.tags)}`; c = ','; }
  if (w.triggerSource !== undefined) { s += `${c}"triggerSource":"${w.triggerSource}"`; c = ','; }
  if (w.triggerRef !== undefined) { s += `${c}"triggerRef":${q(w.triggerRef)}`; c = ','; }
  if (w.parentClosePolicy !== undefined) { s += `${c}"parentClosePolicy":"${w.parentClosePolicy}"`; c = ','; }
  if (w.parentRunId !== undefined) { s += `${c}"parentRunId":${q(w.parentRunId)}`; c = ','; }
  if (w.concurrencyKey !== undefined) { s += `${c}"concurrencyKey":${q(w.concurrencyKey)}`; c = ','; }
  if (w.dedupeKey !== undefined) s += `${c}"dedupeKey":${q(w.dedupeKey)}`;
  return s + '}';
}

/** A lone surrogate's escape in `JSON.stringify`'s output (it writes well-formed pairs raw), not an escaped backslash's. */
const LONE_ESCAPE = /(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}/g;

/**
 * The JSON of a request whose strings are ids and names (not stored
 * values): a lone surrogate becomes U+FFFD, as napi turns a JS string
 * argument into UTF-8. (The engine's JSON reader refuses it.)
 */
export function requestJson(v: unknown): string {
  const t = JSON.stringify(v);
  return t.includes('\\ud') ? t.replace(LONE_ESCAPE, '$1\\ufffd') : t;
}

/**
 * A `start` request around input JSON already written (not written again).
 * `short`: the caller holds the type's template and takes a new run's
 * short answer (`parseStarted`).
 */
export function startRequest(type: string, inputText: string, optsText: string | null, short = false): string {
  const opts = optsText === null ? '' : `,"opts":${optsText}`;
  return `{"type":${JSON.stringify(type)},"input":${inputText}${opts}${short ? ',"short":true' : ''}}`;
}

// ── errors ─────────────────────────────────────────────────────────────

const ERROR_PREFIX = 'JOBFORGE_ERROR:';

type Fields = Record<string, unknown>;

const builders: Record<string, (f: Fields, message: string) => JobforgeError> = {
  JOB_TYPE_NOT_FOUND: (f) => new JobTypeNotFoundError(String(f.jobType)),
  JOB_COLLISION: (f) => new JobCollisionError(String(f.jobType), String(f.concurrencyKey), fromTuple(f.incumbent as RunTuple)),
  JOB_NOT_REPLAYABLE: (f) => new JobNotReplayableError(String(f.runId), String(f.currentStatus)),
  JOB_TEMPLATE_FIELD_MISSING: (f) => new JobTemplateFieldMissingError(String(f.template), String(f.field)),
  MISSING_TENANT_ID: (f) => new MissingTenantIdError(String(f.method)),
  JOB_KEY_FUNCTION_UNAVAILABLE: (f) => new JobKeyFunctionUnavailableError(String(f.jobType), String(f.kind)),
  JOB_RUN_NOT_FOUND: (f) => new JobRunNotFoundError(String(f.runId)),
  PARENT_RUN_NOT_FOUND: (f) => new ParentRunNotFoundError(String(f.parentRunId)),
  JOB_INPUT_INVALID: (f) => new JobInputInvalidError(String(f.reason)),
  JOB_RUN_STATE: (f, m) => {
    const e = new JobRunStateError(String(f.runId), String(f.status));
    e.message = m;
    return e;
  },
  JOB_STEP_CONFLICT: (f) => new JobStepConflictError(String(f.runId), String(f.stepId)),
  JOB_RESUME_TOKEN: (f) => new JobResumeTokenError(String(f.reason)),
  JOB_STORE_ERROR: (f, m) =>
    new JobStoreError(m, f.retryable === true, f.outcome === 'unknown' ? 'unknown' : 'none'),
};

/** Rebuilds the typed error of a native failure; other errors pass through. */
export function decodeNativeError(err: unknown): unknown {
  if (!(err instanceof Error) || !err.message.startsWith(ERROR_PREFIX)) return err;
  try {
    const payload = JSON.parse(err.message.slice(ERROR_PREFIX.length)) as { code: string; message: string; fields: Fields; index?: number };
    const build = builders[payload.code];
    const e = build ? build(payload.fields, payload.message) : new Error(payload.message);
    // A `startMany` entry's error names the entry (`entry_error_text`).
    if (typeof payload.index === 'number') e.message = `entries[${payload.index}]: ${e.message}`;
    return e;
  } catch {
    return err;
  }
}

// ── durable waits ──────────────────────────────────────────────────────

/** A wait's answer (`wait_text` in Rust). */
export type WaitAnswer =
  | { state: 'done'; value: unknown }
  | { state: 'failed'; error: { name?: string; message?: string; [field: string]: unknown } }
  | { state: 'open' }
  | { state: 'token'; token: string };

export const parseWait = (json: string): WaitAnswer => JSON.parse(json) as WaitAnswer;

// ── notices ────────────────────────────────────────────────────────────

export interface Notices {
  aborts: { runId: string; epoch?: number; reason: string }[];
  events: RunTuple[];
  /** Attempt timeouts are due: apply them (`expireAttempts`) on this turn. */
  expire: boolean;
  /** For the orchestrator's logger: trouble outside any call (the listener of other processes' events). */
  troubles: string[];
}

export function parseNotices(json: string): Notices {
  return JSON.parse(json) as Notices;
}

// ── attempts ───────────────────────────────────────────────────────────

/** An attempt's outcome as the engine reads it (JSON text), and its kind. */
export interface Outcome {
  status: 'completed' | 'failed' | 'no_handler' | 'parked';
  text: string;
}

/** Lone surrogates (a JS string may hold them; the engine's text cannot) become U+FFFD. */
const wellFormed = (s: string): string => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');

export interface Failure {
  message: string;
  stack?: string;
  name?: string;
  code?: string;
}

/** A thrown value as the engine stores it (`FailureWire` in Rust). */
export function describeFailure(err: unknown): Failure {
  let message: string;
  try {
    message = wellFormed(cutErrorText(err instanceof Error ? err.message : String(err)));
  } catch {
    message = 'handler threw a value that cannot be turned into a string';
  }
  const out: Failure = { message };
  if (err !== null && typeof err === 'object') {
    const e = err as { stack?: unknown; name?: unknown; code?: unknown };
    try {
      if (typeof e.stack === 'string') out.stack = wellFormed(cutErrorText(e.stack));
      if (typeof e.name === 'string') out.name = wellFormed(e.name);
      if (typeof e.code === 'string') out.code = wellFormed(e.code);
    } catch {
      /* hostile getters: keep what we have */
    }
  }
  return out;
}

/**
 * An error's message or stack past this many characters is cut before it
 * crosses: JSON of hundreds of megabytes cannot even be built (V8's string
 * limit), and the engine keeps 1 MiB of each (`MAX_ERROR_TEXT`).
 */
const ERROR_TEXT_CROSSES = 4 << 20;
const cutErrorText = (s: string): string => (s.length > ERROR_TEXT_CROSSES ? s.slice(0, ERROR_TEXT_CROSSES) : s);

/** `describeFailure` as JSON; never throws (a failure must always be reportable). */
export function failureJson(err: unknown): string {
  try {
    return JSON.stringify(describeFailure(err));
  } catch {
    return '{"message":"handler threw a value that cannot be described"}';
  }
}

export const failedOutcome = (err: unknown): Outcome => ({
  status: 'failed',
  text: `{"status":"failed","error":${failureJson(err)}}`,
});
export const NO_HANDLER: Outcome = { status: 'no_handler', text: '{"status":"no_handler"}' };
/** `PARKED` in Rust: the handler is blocked only on durable waits; the run waits. */
export const PARKED: Outcome = { status: 'parked', text: '{"status":"parked"}' };
/** `COMPLETED_EMPTY` in Rust: what most handlers end with. */
export const COMPLETED_EMPTY: Outcome = { status: 'completed', text: '{"status":"completed","output":{}}' };

/** The outcome of a handler that returned (or resolved with) `value`. */
export function outcomeOf(value: unknown): Outcome {
  if (value === undefined || value === null) return COMPLETED_EMPTY;
  const j = toJsonText(value, 'handler output');
  if (!j.ok) {
    return {
      status: 'failed',
      text: JSON.stringify({ status: 'failed', error: { message: j.reason, name: 'JobOutputInvalidError' } }),
    };
  }
  return { status: 'completed', text: `{"status":"completed","output":${j.text}}` };
}

/**
 * One attempt of a worker report (`parse_report_line`): `<id><epoch>,<pool
 * index>,<outcome>`; an empty outcome = ended without one, `.` = completed
 * with no output (by far the most common).
 */
export function reportLine(id: string, epoch: number, slot: number, outcome: Outcome | null): string {
  const text = outcome === null ? '' : outcome === COMPLETED_EMPTY ? '.' : outcome.text;
  return `${id}${epoch},${slot},${text}\n`;
}

/**
 * One start JS answered itself (`parse_start_line`): `<id><at>,<type byte
 * length>:<type><input>`, then `\x01<options>` when it has options (JSON
 * text holds no raw control character).
 */
export function startLine(id: string, at: number, typeWire: string, inputText: string, optsText: string | null): string {
  return optsText === null ? `${id}${at},${typeWire}${inputText}\n` : `${id}${at},${typeWire}${inputText}\x01${optsText}\n`;
}

/** The `<type byte length>:<type>` part of `startLine` for a job type. */
export const startLineType = (type: string): string => `${Buffer.byteLength(type)}:${type}`;

/** The decimal number in `s[from, to)`, read without a substring. */
function digits(s: string, from: number, to: number): number {
  let n = 0;
  for (let i = from; i < to; i++) {
    const d = s.charCodeAt(i) - 48;
    if (d < 0 || d > 9) throw new Error(`unreadable ticket: ${s.slice(0, 80)}`);
    n = n * 10 + d;
  }
  return n;
}

/**
 * One attempt handed to JS by the engine: `header \0 input \0 memo \0 row`
 * (see `ticket_text` in Rust). The header and input are parsed at once; the
 * memo when a `ctx` call first looks in it; the run row only when a handler
 * reads `ctx.run` (most never do, and it is the largest part).
 */
export class Ticket {
  constructor(
    readonly id: string,
    readonly epoch: number,
    readonly timeoutMs: number | null,
    readonly jobType: string,
    readonly pool: string,
    readonly input: unknown,
    private readonly rowText: string,
    /** Where the row comes from when the ticket carries none. */
    private readonly readRow: ((runId: string) => string | null) | undefined,
    /** The run's completed steps and waits at the claim (`write_memo`), or ''. */
    private memoText = '',
  ) {}

  private row?: JobRun;
  private memo?: Map<string, [number, unknown]>;

  /**
   * The stored output of the completed step (`wait`: durable wait) named
   * `stepId`, as the engine would answer its memoized call — taken once:
   * a second call of the same id in this execution asks the engine, so no
   * two calls share one parsed value. Undefined when the ticket does not
   * have it (the engine then answers, and decides any conflict).
   */
  takeMemo(stepId: string, wait: boolean): { value: unknown } | undefined {
    if (this.memoText.length === 0 && this.memo === undefined) return undefined;
    if (this.memo === undefined) {
      this.memo = new Map();
      for (const [id, kind, value] of JSON.parse(this.memoText) as [string, number, unknown][]) this.memo.set(id, [kind, value]);
      this.memoText = '';
    }
    const m = this.memo.get(stepId);
    if (m === undefined || (m[0] === 1) !== wait) return undefined;
    this.memo.delete(stepId);
    return { value: m[1] };
  }

  get run(): JobRun {
    if (this.row) return this.row;
    if (this.rowText.length > 0 || !this.readRow) return (this.row = parseRun(this.rowText));
    const text = this.readRow(this.id);
    // Only a finished run purged by retention is gone while its handler runs.
    if (text === null) throw new JobRunNotFoundError(this.id);
    return (this.row = parseRun(text));
  }
}

/**
 * Reads tickets. One per engine: it remembers the type-and-pool part of
 * the last ticket, which repeats from ticket to ticket, and reuses its
 * strings (no new strings to allocate and hash for the Map lookups keyed
 * by them).
 */
export class TicketReader {
  private lastHead = '';
  private lastType = '';
  private lastPool = '';

  /** `readRow`: how `ctx.run` reads a row the ticket left out (the in-memory worker's). */
  constructor(private readonly readRow?: (runId: string) => string | null) {}

  read(line: string): Ticket {
    // `<id><epoch>,<timeoutMs?>,<n>:<jobType><m>:<pool>\0<input>\0<memo>\0<row>`
    // (lengths in UTF-16 units); parsed by hand, it is on every run's path.
    const id = line.slice(0, 36);
    const a = line.indexOf(',', 36);
    const b = line.indexOf(',', a + 1);
    if (a < 0 || b < 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
    const epoch = digits(line, 36, a);
    const timeoutMs = b === a + 1 ? null : digits(line, a + 1, b);
    let jobType: string;
    let pool: string;
    let poolEnd: number;
    const head = this.lastHead;
    if (head.length > 0 && line.startsWith(head, b + 1) && line.charCodeAt(b + 1 + head.length) === 0) {
      jobType = this.lastType;
      pool = this.lastPool;
      poolEnd = b + 1 + head.length;
    } else {
      const c = line.indexOf(':', b + 1);
      const typeEnd = c + 1 + +line.slice(b + 1, c);
      jobType = line.slice(c + 1, typeEnd);
      const d = line.indexOf(':', typeEnd);
      poolEnd = d + 1 + +line.slice(typeEnd, d);
      pool = line.slice(d + 1, poolEnd);
      if (c < 0 || d < 0 || line.charCodeAt(poolEnd) !== 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
      this.lastHead = line.slice(b + 1, poolEnd);
      this.lastType = jobType;
      this.lastPool = pool;
    }
    const e = line.indexOf('\0', poolEnd + 1);
    const f = e < 0 ? -1 : line.indexOf('\0', e + 1);
    if (f < 0) throw new Error(`unreadable ticket: ${line.slice(0, 80)}`);
    const input: unknown = JSON.parse(line.slice(poolEnd + 1, e));
    return new Ticket(id, epoch, timeoutMs, jobType, pool, input, line.slice(f + 1), this.readRow, line.slice(e + 1, f));
  }
}
