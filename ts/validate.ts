/**
 * Checks of what callers pass (options, handler meta, dates, tenants),
 * each turned into what the engine reads. A check here names the option
 * in the error instead of letting the wire parser speak of JSON; the
 * engine checks again every value it stores.
 */
import type { PreparedStart } from './backend/backend';
import { JobInputInvalidError } from './errors';
import type { HandlerRegistration, JobHandler, JobHandlerMeta } from './handler';
import { flatSnapshot, toJsonText } from './json';
import { newStartWire, type StartWire } from './wire';

/** A real, valid Date (not a look-alike built on Date.prototype): its ms, or null. */
export function dateMs(d: unknown): number | null {
  if (!(d instanceof Date)) return null;
  try {
    const t: unknown = d.getTime(); // throws on a look-alike without a time value
    // What the engine takes: whole ms inside a Date's range (a subclass's
    // own getTime may answer anything).
    return typeof t === 'number' && Number.isInteger(t) && Math.abs(t) <= 8.64e15 ? t : null;
  } catch {
    return null;
  }
}

/** `dateMs`, or a `JobInputInvalidError` naming the option. */
export function requireDate(d: unknown, what: string): number {
  const t = dateMs(d);
  if (t === null) throw new JobInputInvalidError(`${what} must be a valid Date`);
  return t;
}

export function checkTenant(t: unknown): void {
  if (t !== undefined && t !== null && typeof t !== 'string') {
    throw new JobInputInvalidError(`tenantId must be a string or null, got ${typeof t}`);
  }
  // Crossing into Rust it would become U+FFFD, and gate the call as the
  // tenant of that other name (reading and canceling its runs): refused in
  // every call, as a start refuses it.
  if (typeof t === 'string') checkText(t, 'tenantId');
}

const LONE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * A string the engine stores as text: a lone surrogate (a string cut inside
 * a character) has no UTF-8 form, and the engine refuses it. Checked here so
 * that a start answered before the engine has it is one it accepts.
 */
export function checkText(v: string, what: string): string {
  if (LONE.test(v)) throw new JobInputInvalidError(`${what} must not hold a lone surrogate (a string cut inside a character)`);
  return v;
}

/** The `tenantId` of an options object (checked): undefined, null or an id. */
export function tenantOf(o: { tenantId?: unknown } | null | undefined): string | null | undefined {
  const t = o === undefined || o === null ? undefined : (o.tenantId as string | null | undefined);
  checkTenant(t);
  return t;
}

/**
 * The `reason` of a cancel (noted in the `canceled` events of the timeline):
 * undefined/null (none) or a string without a lone surrogate.
 */
export function cancelNote(o: { reason?: unknown }, call: string): string | undefined {
  const r = o.reason;
  if (r === undefined || r === null) return undefined;
  if (typeof r !== 'string') throw new JobInputInvalidError(`${call}: reason must be a string`);
  return checkText(r, `${call}: reason`);
}

/** JSON would turn NaN/Infinity into null (the default): reject them here. */
export function checkCount(name: string, v: unknown): void {
  if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v))) {
    throw new JobInputInvalidError(`${name} must be a finite number, got ${String(v)}`);
  }
}

/**
 * Refuses an own key of `o` that is not in `known`, naming it: a misspelt
 * option (`retyr`, `maxDelayMS`) would otherwise be dropped without a word
 * and the caller get a behaviour other than the one asked for.
 */
export function checkKeys(o: object, known: ReadonlySet<string>, what: string): void {
  for (const k in o) {
    if (!known.has(k) && own(o, k)) unknownKey(k, known, what);
  }
}

const own = (o: object, k: string): boolean => Object.prototype.hasOwnProperty.call(o, k);

function unknownKey(k: string, known: Iterable<string>, what: string): never {
  throw new JobInputInvalidError(`${what}: unknown key '${k}' (known: ${[...known].join(', ')})`);
}

/**
 * The keys each call's options object may hold. A misspelt key would
 * otherwise change what the call does without a word (`{ cascde: false }`
 * cascades, `{ tenantid: 'a' }` is "no tenant", `{ timeout: 5000 }` waits
 * for ever), so it is refused, naming the key.
 */
export const CALL_OPTION_KEYS = {
  tenant: new Set(['tenantId']),
  resume: new Set(['tenantId', 'runId']),
  cancel: new Set(['cascade', 'reason', 'tenantId']),
  waitForRun: new Set(['timeoutMs', 'tenantId']),
  listForScope: new Set(['status', 'jobType', 'limit', 'offset', 'orderBy', 'tenantId']),
  listJobRuns: new Set(['poolId', 'rootRunId', 'status', 'since', 'jobType', 'scopeEntityType', 'scopeEntityId', 'cursor', 'limit', 'tenantId']),
  listRunEvents: new Set(['cursor', 'limit', 'tenantId']),
  throughput: new Set(['minutes', 'tenantId']),
  schedule: new Set(['jobType', 'input', 'cron', 'timezone', 'everyMs', 'tenantId']),
} as const satisfies Record<string, ReadonlySet<string>>;

/** The keys of the constructor's options, of `retention`, and of `startWorker`'s options and pools. */
export const CONSTRUCTOR_OPTION_KEYS: ReadonlySet<string> = new Set([
  'multiTenant',
  'clock',
  'loggerFactory',
  'logger',
  'retention',
  'timeline',
  'tracing',
  'backend',
  'postgres',
]);
const RETENTION_KEYS: ReadonlySet<string> = new Set(['completedMs', 'failedMs']);
const WORKER_OPTION_KEYS: ReadonlySet<string> = new Set(['pools', 'shutdownTimeoutMs', 'abandonAfterMs']);
const WORKER_POOL_KEYS: ReadonlySet<string> = new Set(['concurrency']);

/**
 * The constructor's options other than the backend's and the clock's
 * values: a misspelt key (`multitenant: true`) would otherwise turn the
 * tenant gate off without a word.
 */
export function checkConstructorOptions(o: Record<string, unknown>): void {
  checkKeys(o, CONSTRUCTOR_OPTION_KEYS, 'JobOrchestrator options');
  if (o.multiTenant !== undefined && typeof o.multiTenant !== 'boolean') {
    throw new JobInputInvalidError(`multiTenant must be a boolean, got ${String(o.multiTenant)}`);
  }
  if (o.loggerFactory !== undefined && typeof o.loggerFactory !== 'function') {
    throw new JobInputInvalidError('loggerFactory must be a function (run) => logger');
  }
  const r = o.retention;
  if (r !== undefined) {
    if (r === null || typeof r !== 'object') throw new JobInputInvalidError('retention must be an object { completedMs?, failedMs? }');
    checkKeys(r, RETENTION_KEYS, 'retention');
  }
}

/** Refuses an unknown key in a call's options (see `CALL_OPTION_KEYS`); a non-object is left to the checks of its values. */
export function checkOptions(o: unknown, known: ReadonlySet<string>, call: string): void {
  if (o !== null && typeof o === 'object') checkKeys(o, known, `${call} options`);
}

/** The tenant of a call whose options are only `{ tenantId }`, after `checkOptions`. */
export function callTenant(o: unknown, call: string): string | null | undefined {
  checkOptions(o, CALL_OPTION_KEYS.tenant, call);
  return tenantOf(o as { tenantId?: unknown } | null | undefined);
}

/** Options of a start as the caller may pass them. */
export interface StartOptionsInput {
  scope?: { entityType: string; entityId: string } | undefined;
  pool?: string | undefined;
  runAt?: Date | undefined;
  priority?: number | undefined;
  tags?: Record<string, string> | undefined;
  triggerSource?: 'manual' | 'schedule' | 'event' | 'parent' | undefined;
  triggerRef?: string | undefined;
  parentClosePolicy?: 'terminate' | 'cancel' | 'abandon' | undefined;
  parentRunId?: string | undefined;
  tenantId?: string | null | undefined;
}

const TRIGGER_SOURCES: ReadonlySet<unknown> = new Set(['manual', 'schedule', 'event', 'parent']);
const CLOSE_POLICIES: ReadonlySet<unknown> = new Set(['terminate', 'cancel', 'abandon']);
const I32_MIN = -2147483648;
const I32_MAX = 2147483647;

/** The start options a caller may give (`StartOptionsInput`'s keys). */
const START_KEYS: ReadonlySet<string> = new Set([
  'scope', 'pool', 'runAt', 'priority', 'tags', 'triggerSource', 'triggerRef', 'parentClosePolicy', 'parentRunId', 'tenantId',
]);

/** A string start option: absent (undefined or null), or checked text. */
function optionText(k: string, v: unknown): string | undefined {
  if (v === null) return undefined;
  if (typeof v !== 'string') throw new JobInputInvalidError(`${k} must be a string, got ${typeof v}`);
  return checkText(v, k);
}

/**
 * Start options checked and converted for the engine (`StartOpts` in Rust:
 * Dates as ms, `tenant`). Every value is checked here as the engine checks
 * it, in the engine's words: an in-memory start may be answered before the
 * engine has it, and must then be one it accepts. One pass over the keys
 * the caller gave (a start usually names one or two of the ten), so an
 * option costs only its own check; an unknown key (a typo such as
 * `priorty`) is refused, not silently ignored.
 */
export function startOptions(opts: StartOptionsInput | undefined): StartWire {
  const out = newStartWire();
  if (opts === undefined) return out;
  if (opts === null || typeof opts !== 'object') throw new JobInputInvalidError('start options must be an object');
  const o = plainOptions(opts as Record<string, unknown>);
  for (const k in o) {
    const v = o[k];
    if (v === undefined) {
      // Given as undefined is not given, but a misspelt key is still refused.
      if (!START_KEYS.has(k) && own(o, k)) unknownKey(k, START_KEYS, 'start options');
      continue;
    }
    switch (k) {
      case 'priority':
        out.priority = checkPriority(v);
        break;
      case 'runAt':
        out.runAt = requireDate(v, 'runAt');
        break;
      case 'tenantId':
        checkTenant(v);
        out.tenant = v === null ? null : checkText(v as string, 'tenantId');
        break;
      case 'scope':
        out.scope = checkScope(v);
        break;
      case 'pool': {
        const pool = optionText(k, v);
        if (pool === '') throw new JobInputInvalidError('pool must be a non-empty string');
        if (pool !== undefined && pool.includes('\n')) throw new JobInputInvalidError('pool must not contain a line break');
        out.pool = pool;
        break;
      }
      case 'triggerRef':
        out.triggerRef = optionText(k, v);
        break;
      case 'parentRunId':
        out.parentRunId = optionText(k, v);
        break;
      case 'triggerSource': {
        const t = optionText(k, v);
        if (t !== undefined && !TRIGGER_SOURCES.has(t)) {
          throw new JobInputInvalidError(`triggerSource must be manual, schedule, event or parent, got '${t}'`);
        }
        out.triggerSource = t as StartWire['triggerSource'];
        break;
      }
      case 'parentClosePolicy': {
        const c = optionText(k, v);
        if (c !== undefined && !CLOSE_POLICIES.has(c)) {
          throw new JobInputInvalidError(`parentClosePolicy must be terminate, cancel or abandon, got '${c}'`);
        }
        out.parentClosePolicy = c as StartWire['parentClosePolicy'];
        break;
      }
      case 'tags':
        if (v !== null) out.tags = checkTags(v);
        break;
      default:
        // An inherited key is not the caller's option (as JSON would not write it).
        if (own(o, k)) unknownKey(k, START_KEYS, 'start options');
    }
  }
  return out;
}

/**
 * The options as a plain object, so one pass over its keys sees every
 * option: an object literal is that already; any other object (a class
 * instance, options with getters or non-enumerable properties) has its
 * known options read as properties, as before that pass, and its own
 * enumerable keys checked for unknown ones.
 */
function plainOptions(o: Record<string, unknown>): Record<string, unknown> {
  const proto: unknown = Object.getPrototypeOf(o);
  if (proto === Object.prototype || proto === null) return o;
  checkKeys(o, START_KEYS, 'start options');
  const plain: Record<string, unknown> = {};
  for (const k of START_KEYS) {
    const v = o[k];
    if (v !== undefined) plain[k] = v;
  }
  return plain;
}

function checkPriority(p: unknown): number {
  if (!Number.isInteger(p)) throw new JobInputInvalidError(`priority must be an integer, got ${String(p)}`);
  const n = p as number;
  if (n < I32_MIN || n > I32_MAX) {
    throw new JobInputInvalidError(`priority must be an integer between ${I32_MIN} and ${I32_MAX}, got ${n}`);
  }
  return n === 0 ? 0 : n; // -0 is 0, as the engine stores it
}

function checkScope(v: unknown): { entityType: string; entityId: string } | undefined {
  if (v === null) return undefined;
  const scope = v as { entityType?: unknown; entityId?: unknown };
  if (typeof scope !== 'object' || typeof scope.entityType !== 'string' || typeof scope.entityId !== 'string') {
    throw new JobInputInvalidError('scope must be { entityType: string, entityId: string }');
  }
  return { entityType: checkText(scope.entityType, 'scope.entityType'), entityId: checkText(scope.entityId, 'scope.entityId') };
}

function checkTags(v: unknown): Record<string, string> {
  const j = toJsonText(v, 'tags');
  if (!j.ok) throw new JobInputInvalidError(j.reason);
  const tags = JSON.parse(j.text) as unknown;
  if (typeof tags !== 'object' || tags === null || Array.isArray(tags) || Object.values(tags).some((x) => typeof x !== 'string')) {
    throw new JobInputInvalidError('tags must be an object of string values');
  }
  for (const [k, x] of Object.entries(tags as Record<string, string>)) {
    checkText(k, 'a tag name');
    checkText(x, `tag '${k}'`);
  }
  return tags as Record<string, string>;
}

const RETRY_KEYS: ReadonlySet<string> = new Set(['attempts', 'backoff', 'baseMs', 'maxDelayMs', 'jitter', 'nonRetryableErrors']);
const BACKOFFS: ReadonlySet<unknown> = new Set(['fixed', 'linear', 'exponential']);
const JITTERS: ReadonlySet<unknown> = new Set(['none', 'full', 'equal']);

/**
 * A retry policy as the engine reads it (`RetryPolicy`), checked before
 * anything runs: a step's policy is used only once its function failed.
 * The engine refuses the same policies (unknown keys and words, bad
 * numbers); this names the option in the caller's terms.
 */
export function checkRetryPolicy(p: unknown, what: string): void {
  const bad = (why: string) => new JobInputInvalidError(`${what}: ${why}`);
  if (p === null || typeof p !== 'object' || Array.isArray(p)) throw bad('must be an object');
  checkKeys(p, RETRY_KEYS, what);
  const r = p as Record<string, unknown>;
  const { attempts, backoff, baseMs, maxDelayMs, jitter, nonRetryableErrors } = r;
  if (typeof attempts !== 'number' || !Number.isInteger(attempts) || attempts < 1 || attempts > 0xffffffff) {
    throw bad(`attempts must be an integer >= 1, got ${String(attempts)}`);
  }
  if (!BACKOFFS.has(backoff)) throw bad(`backoff must be 'fixed', 'linear' or 'exponential', got ${String(backoff)}`);
  if (typeof baseMs !== 'number' || !Number.isSafeInteger(baseMs) || baseMs < 0) {
    throw bad(`baseMs must be an integer >= 0, got ${String(baseMs)}`);
  }
  // null is "not given", as everywhere in the meta.
  if (maxDelayMs !== undefined && maxDelayMs !== null && (typeof maxDelayMs !== 'number' || !Number.isSafeInteger(maxDelayMs) || maxDelayMs < 0)) {
    throw bad(`maxDelayMs must be an integer >= 0, got ${String(maxDelayMs)}`);
  }
  if (jitter !== undefined && jitter !== null && !JITTERS.has(jitter)) {
    throw bad(`jitter must be 'none', 'full' or 'equal', got ${String(jitter)}`);
  }
  if (nonRetryableErrors !== undefined && nonRetryableErrors !== null && (!Array.isArray(nonRetryableErrors) || nonRetryableErrors.some((e) => typeof e !== 'string'))) {
    throw bad('nonRetryableErrors must be an array of strings');
  }
}

/** A retry policy as sent to the engine: the keys it reads, nulls (not given) left out. */
export function retryPolicyWire(p: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k of RETRY_KEYS) if (p[k] !== undefined && p[k] !== null) out[k] = p[k];
  return out;
}

const STEP_KEYS: ReadonlySet<string> = new Set(['retry', 'timeoutMs']);
const SPAWN_KEYS: ReadonlySet<string> = new Set(['closePolicy', 'runAt', 'priority', 'tags']);

/** `ctx.step`'s options: an object of known keys (its values are checked where they are used). */
export function checkStepOptions(opts: unknown, stepId: string): void {
  if (opts === undefined || opts === null) return;
  if (typeof opts !== 'object' || Array.isArray(opts)) throw new JobInputInvalidError(`step '${stepId}' options must be an object`);
  checkKeys(opts, STEP_KEYS, `step '${stepId}' options`);
}

/** `ctx.spawnChild`'s options: an object of known keys (the values are checked as start options). */
export function checkSpawnOptions(opts: unknown): void {
  if (opts === undefined || opts === null) return;
  if (typeof opts !== 'object' || Array.isArray(opts)) throw new JobInputInvalidError('spawnChild options must be an object');
  checkKeys(opts, SPAWN_KEYS, 'spawnChild options');
}

const WAIT_KEYS: Readonly<Record<'signal' | 'token' | 'invoke', ReadonlySet<string>>> = {
  signal: new Set(['signal', 'timeoutMs']),
  token: new Set(['timeoutMs']),
  invoke: new Set(['closePolicy', 'priority', 'runAt', 'tags', 'timeoutMs']),
};

/** A durable wait's options: an object of known keys (values are checked where they are used). */
export function checkWaitOptions(opts: unknown, kind: 'signal' | 'token' | 'invoke', stepId: string): void {
  if (opts === undefined || opts === null) return;
  if (typeof opts !== 'object' || Array.isArray(opts)) throw new JobInputInvalidError(`wait '${stepId}' options must be an object`);
  checkKeys(opts, WAIT_KEYS[kind], `wait '${stepId}' options`);
}

/** A handler: a class with `run(ctx)`, a function, or an object with `run(ctx)`. */
export function checkHandler(type: string, handler: unknown): void {
  const ok =
    typeof handler === 'function' ||
    (handler !== null && typeof handler === 'object' && typeof (handler as { run?: unknown }).run === 'function');
  if (!ok) {
    throw new JobInputInvalidError(`handler of '${type}' must be a class with run(ctx), a function, or an object with run(ctx)`);
  }
}

export function isClass(h: unknown): h is new () => { run(ctx: unknown): unknown } {
  return typeof h === 'function' && typeof (h as { prototype?: { run?: unknown } }).prototype?.run === 'function';
}

/**
 * The keys of a handler's meta. `triggers` is the seed's bridge-trigger
 * list, read by its code generator and never by an orchestrator: accepted
 * (and ignored) so meta written for the seed registers unchanged.
 */
const META_KEYS: ReadonlySet<string> = new Set(['pool', 'scope', 'retry', 'concurrency', 'dedupe', 'timeoutMs', 'replayFrom', 'triggers']);
const CONCURRENCY_KEYS: ReadonlySet<string> = new Set(['key', 'collisionMode']);
const DEDUPE_KEYS: ReadonlySet<string> = new Set(['key', 'windowMs']);
const SCOPE_KEYS: ReadonlySet<string> = new Set(['entity', 'from']);

/** What the engine is told about a job type (`DefinitionSpec` in Rust), from its meta. */
export function definitionSpec(type: unknown, meta: unknown, handler: unknown, registeredAt: number): Record<string, unknown> & { type: string } {
  if (typeof type !== 'string' || type.length === 0) {
    throw new JobInputInvalidError('job type must be a non-empty string');
  }
  checkText(type, 'job type');
  const m = (meta ?? {}) as JobHandlerMeta<unknown>;
  if (typeof m !== 'object' || Array.isArray(m)) throw new JobInputInvalidError(`meta of '${type}' must be an object`);
  checkKeys(m, META_KEYS, `meta of '${type}'`);
  for (const [v, known, what] of [
    [m.concurrency, CONCURRENCY_KEYS, 'concurrency'],
    [m.dedupe, DEDUPE_KEYS, 'dedupe'],
    [m.scope, SCOPE_KEYS, 'scope'],
  ] as const) {
    if (v !== undefined && v !== null) {
      if (typeof v !== 'object' || Array.isArray(v)) throw new JobInputInvalidError(`${what} of '${type}' must be an object`);
      checkKeys(v, known, `${what} of '${type}'`);
    }
  }
  checkHandler(type, handler as JobHandler<unknown>);
  const key = (k: unknown, what: string): string | undefined => {
    if (k === undefined || k === null) return undefined;
    if (typeof k === 'function') return '<fn>';
    if (typeof k === 'string') return k;
    throw new JobInputInvalidError(`${what} key of '${type}' must be a template string or a function`);
  };
  // JSON would turn NaN/Infinity into null, silently switching a feature
  // off; the engine stores whole milliseconds and counts.
  const whole = (v: unknown, what: string, min: number) => {
    if (v !== undefined && v !== null && (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min)) {
      throw new JobInputInvalidError(`${what} of '${type}' must be an integer >= ${min}, got ${String(v)}`);
    }
  };
  whole(m.timeoutMs, 'timeoutMs', 1);
  whole(m.dedupe?.windowMs, 'dedupe.windowMs', 0);
  whole(m.retry?.attempts, 'retry.attempts', 1);
  whole(m.retry?.baseMs, 'retry.baseMs', 0);
  whole(m.retry?.maxDelayMs, 'retry.maxDelayMs', 0);
  // null is "not given" throughout the meta, as in the seed (`meta.pool ?? 'batch'`).
  if (m.retry !== undefined && m.retry !== null) checkRetryPolicy(m.retry, `retry of '${type}'`);
  const strings: [unknown, string][] = [
    [m.pool, 'pool'],
    [m.replayFrom, 'replayFrom'],
    [m.concurrency?.collisionMode, 'concurrency.collisionMode'],
  ];
  for (const [v, what] of strings) {
    if (v !== undefined && v !== null && typeof v !== 'string') {
      throw new JobInputInvalidError(`${what} of '${type}' must be a string, got ${typeof v}`);
    }
  }
  if (m.scope !== undefined && (typeof m.scope?.entity !== 'string' || typeof m.scope?.from !== 'function')) {
    throw new JobInputInvalidError(`scope of '${type}' needs entity (string) and from (function)`);
  }
  return {
    type,
    pool: m.pool,
    scopeEntityType: m.scope?.entity,
    retry: m.retry === undefined || m.retry === null ? m.retry : retryPolicyWire(m.retry as unknown as Record<string, unknown>),
    timeoutMs: m.timeoutMs,
    concurrencyKey: key(m.concurrency?.key, 'concurrency'),
    collisionMode: m.concurrency?.collisionMode,
    dedupeKey: key(m.dedupe?.key, 'dedupe'),
    dedupeWindowMs: m.dedupe?.windowMs,
    replayFrom: m.replayFrom,
    registeredAt,
  };
}

/** A worker's pools (`[{name, concurrency}]`, as the engine reads them), its drain time and how long it holds an aborted handler's slot. */
export function workerOptions(opts: unknown): {
  pools: { name: string; concurrency: number }[];
  shutdownTimeoutMs: number;
  abandonAfterMs: number;
} {
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw new JobInputInvalidError('worker options must be an object');
  const o = (opts ?? {}) as { pools?: unknown; shutdownTimeoutMs?: unknown; abandonAfterMs?: unknown };
  checkKeys(o, WORKER_OPTION_KEYS, 'startWorker options');
  const poolsIn = o.pools ?? { batch: { concurrency: 5 }, interactive: { concurrency: 20 } };
  if (poolsIn === null || typeof poolsIn !== 'object') throw new JobInputInvalidError('pools must be an object');
  const pools = Object.entries(poolsIn as Record<string, { concurrency?: unknown } | null>).map(([name, p]) => {
    if (p !== null && typeof p === 'object') checkKeys(p, WORKER_POOL_KEYS, `pool '${name}'`);
    const c = p?.concurrency;
    if (!Number.isInteger(c) || (c as number) < 1 || (c as number) > 100_000) {
      throw new JobInputInvalidError(`pool '${name}' needs an integer concurrency between 1 and 100000`);
    }
    return { name, concurrency: c as number };
  });
  if (pools.length === 0) throw new JobInputInvalidError('a worker needs at least one pool');
  const shutdownTimeoutMs = o.shutdownTimeoutMs ?? 10_000;
  if (typeof shutdownTimeoutMs !== 'number' || !(shutdownTimeoutMs >= 0)) {
    throw new JobInputInvalidError('shutdownTimeoutMs must be a non-negative number');
  }
  const abandonAfterMs = o.abandonAfterMs ?? 30_000;
  if (typeof abandonAfterMs !== 'number' || !(abandonAfterMs >= 0)) {
    throw new JobInputInvalidError('abandonAfterMs must be a non-negative number');
  }
  return { pools, shutdownTimeoutMs, abandonAfterMs };
}

/** A schedule's name and options as the engine reads them (`putSchedule`). */
export function scheduleRequest(name: unknown, opts: unknown): Record<string, unknown> {
  if (typeof name !== 'string') throw new JobInputInvalidError('schedule name must be a string');
  // Crossing into Rust, a lone surrogate becomes U+FFFD: two names would be one.
  if (LONE.test(name)) throw new JobInputInvalidError('schedule name must not hold a lone surrogate');
  if (typeof opts !== 'object' || opts === null) throw new JobInputInvalidError('schedule options must be an object');
  checkKeys(opts, CALL_OPTION_KEYS.schedule, 'schedule options');
  const o = opts as { jobType?: unknown; cron?: unknown; everyMs?: unknown; timezone?: unknown; input?: unknown; tenantId?: unknown };
  const { jobType, cron, everyMs, timezone } = o;
  if (typeof jobType !== 'string') throw new JobInputInvalidError('schedule jobType must be a string');
  checkText(jobType, 'job type');
  if (cron !== undefined && typeof cron !== 'string') throw new JobInputInvalidError('cron must be a string');
  if (timezone !== undefined && typeof timezone !== 'string') throw new JobInputInvalidError('timezone must be a string');
  if (everyMs !== undefined && typeof everyMs !== 'number') throw new JobInputInvalidError('everyMs must be a number');
  // JSON would write NaN and Infinity as null: beside a cron they would vanish.
  checkCount('everyMs', everyMs);
  const payload = o.input === undefined || o.input === null ? {} : o.input;
  const j = toJsonText(payload, 'input');
  if (!j.ok) throw new JobInputInvalidError(j.reason);
  const tenant = tenantOf(o);
  // A schedule belongs to its tenant: two tenant ids cut inside a character would be one.
  if (typeof tenant === 'string') checkText(tenant, 'tenantId');
  return { name, jobType, input: JSON.parse(j.text) as unknown, cron, timezone, everyMs, tenant };
}

/** A `recordStep` input as the engine reads it (Dates as ms). */
export function recordStepRequest(input: unknown): Record<string, unknown> {
  if (input === null || typeof input !== 'object') throw new JobInputInvalidError('recordStep needs an object');
  const src = input as Record<string, unknown>;
  // A step id is stored: two ids cut inside a character would be one.
  if (typeof src.stepId === 'string') checkText(src.stepId, 'stepId');
  const wire: Record<string, unknown> = { ...src };
  for (const k of ['startedAt', 'finishedAt'] as const) {
    const d = src[k];
    if (d !== undefined && d !== null) wire[k] = requireDate(d, k);
  }
  for (const k of ['input', 'output'] as const) {
    if (src[k] !== undefined) {
      const j = toJsonText(src[k], k);
      if (!j.ok) throw new JobInputInvalidError(j.reason);
    }
  }
  return wire;
}

/**
 * The JS side of `start`, written once for every store: the input as
 * JSON, the options checked, and the keys only JS can evaluate (function
 * keys, `meta.scope.from`). A key function that throws is kept in
 * `thrown`: the engine's earlier checks (tenant gate, job type) still come
 * first.
 */
/**
 * A start checked and ready for the engine. `trace`: the tags carrying the
 * caller's active span (`Tracing.activeTags`), added to the checked tags
 * unless they hold a trace context of their own (the caller's wins).
 */
export function prepareStart(
  type: unknown,
  input: unknown,
  opts: StartOptionsInput | undefined,
  reg: HandlerRegistration | undefined,
  trace: Record<string, string> | null = null,
): PreparedStart {
  if (typeof type !== 'string') throw new JobInputInvalidError('job type must be a string');
  // A registered type holds none (see `definitionSpec`).
  if (reg === undefined) checkText(type, 'job type');
  const payload = input === undefined || input === null ? {} : input;
  let inputText: string;
  let inputCopy: Record<string, unknown> | null = null;
  try {
    const flat = flatSnapshot(payload);
    if (flat !== null) {
      inputText = flat.text;
      inputCopy = flat.copy;
    } else {
      const j = toJsonText(payload, 'input');
      if (!j.ok) throw new JobInputInvalidError(j.reason);
      inputText = j.text;
    }
  } catch (e) {
    throw e instanceof JobInputInvalidError ? e : new JobInputInvalidError(`input: ${(e as Error)?.message ?? e}`);
  }
  const m = reg?.meta;
  const fromScope = m?.scope !== undefined && opts?.scope === undefined;
  const needsJs = m !== undefined && (typeof m.concurrency?.key === 'function' || typeof m.dedupe?.key === 'function' || fromScope);
  if (opts === undefined && !needsJs && trace === null) {
    return { type, inputText, inputCopy, opts: null, thrown: null, tenant: undefined, hasParent: false };
  }
  const o = startOptions(opts);
  if (trace !== null && !(o.tags !== undefined && (own(o.tags, 'traceparent') || own(o.tags, 'tracestate')))) {
    o.tags = o.tags === undefined ? trace : { ...o.tags, ...trace };
  }
  let thrown: { error: unknown } | null = null;
  if (needsJs && m !== undefined) {
    try {
      if (typeof m.concurrency?.key === 'function') o.concurrencyKey = checkText(String(m.concurrency.key(payload)), 'the concurrency key');
      if (typeof m.dedupe?.key === 'function') o.dedupeKey = checkText(String(m.dedupe.key(payload)), 'the dedupe key');
      if (fromScope && m.scope !== undefined) o.scopeEntityIdFromMeta = checkText(String(m.scope.from(payload)), 'the scope entity id');
    } catch (e) {
      thrown = { error: e };
    }
  }
  return { type, inputText, inputCopy, opts: o, thrown, tenant: o.tenant, hasParent: o.parentRunId !== undefined };
}

const ENTRY_KEYS: ReadonlySet<string> = new Set(['type', 'input', 'opts']);

/** `entries[i]: …` in front of an error's message (what `startMany` refuses names its entry). */
export function atEntry(e: unknown, i: number): unknown {
  if (e instanceof Error) e.message = `entries[${i}]: ${e.message}`;
  return e;
}

/**
 * `startMany`'s entries, each checked as `start` checks its arguments
 * (`prepareStart`), all before anything is stored: a bad one is thrown
 * with its index. A key function that throws makes its entry bad
 * (`JobInputInvalidError`, the thrown error as its `cause`): a batch
 * stores all of its entries or none.
 */
export function prepareMany(
  entries: unknown,
  registration: (type: string) => HandlerRegistration | undefined,
  trace: Record<string, string> | null = null,
): PreparedStart[] {
  if (!Array.isArray(entries)) throw new JobInputInvalidError('startMany takes an array of { type, input?, opts? }');
  const out: PreparedStart[] = new Array<PreparedStart>(entries.length);
  for (let i = 0; i < entries.length; i++) {
    const e: unknown = entries[i];
    try {
      if (e === null || typeof e !== 'object' || Array.isArray(e)) throw new JobInputInvalidError('an entry must be an object { type, input?, opts? }');
      checkKeys(e, ENTRY_KEYS, 'a startMany entry');
      const { type, input, opts } = e as { type?: unknown; input?: unknown; opts?: StartOptionsInput };
      const p = prepareStart(type, input, opts, typeof type === 'string' ? registration(type) : undefined, trace);
      if (p.thrown !== null) {
        const thrown = p.thrown.error;
        const said = thrown instanceof Error ? thrown.message : String(thrown);
        const err = new JobInputInvalidError(`a key function threw: ${said}`);
        (err as { cause?: unknown }).cause = thrown;
        throw err;
      }
      out[i] = p;
    } catch (err) {
      throw atEntry(err, i);
    }
  }
  return out;
}
