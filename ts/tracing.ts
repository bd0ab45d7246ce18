/**
 * OpenTelemetry tracing through `@opentelemetry/api` (an optional peer
 * dependency, loaded only here and only when present):
 *
 * - `start` (and `startMany`, `ctx.spawnChild`, `ctx.invoke`) records the
 *   active span's context on the run as the W3C tags `traceparent` (and
 *   `tracestate` when it has one), unless the caller put a `traceparent`
 *   tag there itself (a context carried in from a message, say). Tags are
 *   stored with the run on every backend, so the context crosses
 *   processes with it.
 * - Each attempt is a span (`run <jobType>`, kind CONSUMER) whose parent
 *   is that context, with the run id, type, pool, attempt, tenant and
 *   outcome as attributes; the handler runs inside it, so what it traces
 *   (a database call, an HTTP request, a child's start) nests under it.
 * - Each `ctx.step` call is a child span of its attempt (`step <id>`):
 *   its tries' failures are recorded as exceptions; a memoized step is a
 *   span marked `jobforge.step.memoized`.
 *
 * While no tracer provider is registered (the API alone is installed, or
 * an SDK is set up later) nothing is recorded and an attempt costs one
 * check: whether the global provider is still the API's no-op one.
 * The API's types are not imported: the few members used are declared
 * here, so the package's types never depend on an optional peer.
 */
import type { Ticket } from './wire';

/** What is used of a span context (`@opentelemetry/api`'s `SpanContext`). */
interface SpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  isRemote?: boolean;
  traceState?: { serialize(): string } | undefined;
}

interface Span {
  spanContext(): SpanContext;
  setAttribute(key: string, value: string | number | boolean): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  recordException(exception: unknown): unknown;
  end(): void;
}

interface Context {
  readonly _brand?: never;
}

interface Tracer {
  startSpan(name: string, options: { kind?: number; attributes?: Record<string, string | number | boolean> }, context: Context): Span;
}

interface TracerProvider {
  getTracer(name: string, version?: string): Tracer;
}

interface OtelApi {
  ROOT_CONTEXT: Context;
  SpanKind: { CONSUMER: number; INTERNAL: number };
  SpanStatusCode: { ERROR: number };
  ProxyTracerProvider: new () => TracerProvider & { getDelegate(): TracerProvider };
  createTraceState(raw: string): SpanContext['traceState'];
  isSpanContextValid(sc: SpanContext): boolean;
  context: { active(): Context; with<T>(ctx: Context, fn: () => T): T };
  trace: {
    getTracerProvider(): TracerProvider;
    getSpan(ctx: Context): Span | undefined;
    setSpan(ctx: Context, span: Span): Context;
    setSpanContext(ctx: Context, sc: SpanContext): Context;
  };
}

const TRACER_NAME = 'jobforge';

/** `version-traceid-parentid-flags`; a later version may append fields. */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** A W3C `traceparent` of a span context. */
export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/**
 * The span context a `traceparent` (and `tracestate`) tag carries, or null
 * when it is not one: version `ff` is invalid, version `00` has exactly
 * four fields, all-zero ids are invalid (W3C Trace Context, level 1).
 */
export function parseTraceparent(text: string, state: string | undefined, api: Pick<OtelApi, 'createTraceState'> | null): SpanContext | null {
  const m = TRACEPARENT.exec(text);
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return null;
  const traceId = m[2]!;
  const spanId = m[3]!;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return null;
  const sc: SpanContext = { traceId, spanId, traceFlags: parseInt(m[4]!, 16), isRemote: true };
  if (state !== undefined && state.length > 0 && api !== null) {
    try {
      sc.traceState = api.createTraceState(state);
    } catch {
      // A malformed tracestate is dropped, as a propagator drops it.
    }
  }
  return sc;
}

/** Loads `@opentelemetry/api` if it is installed (once per process). */
let loaded: OtelApi | null | undefined;
function loadApi(): OtelApi | null {
  if (loaded === undefined) {
    try {
      loaded = require('@opentelemetry/api') as OtelApi;
    } catch {
      loaded = null;
    }
  }
  return loaded;
}

export class Tracing {
  /** The API's no-op provider: the global one's delegate until an SDK registers. */
  private readonly noop: TracerProvider;
  private tracer: Tracer | null = null;
  private tracerOf: TracerProvider | null = null;

  private constructor(private readonly api: OtelApi) {
    this.noop = new api.ProxyTracerProvider().getDelegate();
  }

  /** Tracing for an orchestrator: null when turned off or the API is not installed. */
  static create(enabled: boolean | undefined): Tracing | null {
    if (enabled === false) return null;
    const api = loadApi();
    return api === null ? null : new Tracing(api);
  }

  /**
   * The tracer of the registered provider, or null while none is (nothing
   * to record) or the provider throws (a broken SDK must not fail a start
   * or an attempt).
   */
  private live(): Tracer | null {
    try {
      const p = this.api.trace.getTracerProvider();
      const d = p instanceof this.api.ProxyTracerProvider ? p.getDelegate() : p;
      if (d === this.noop) return null;
      if (this.tracerOf !== d || this.tracer === null) {
        this.tracer = d.getTracer(TRACER_NAME);
        this.tracerOf = d;
      }
      return this.tracer;
    } catch {
      return null;
    }
  }

  /**
   * The tags that carry the active span's context (`traceparent`, and
   * `tracestate` when it has one), or null when nothing records or no
   * valid span is active.
   */
  activeTags(): Record<string, string> | null {
    if (this.live() === null) return null;
    try {
      const span = this.api.trace.getSpan(this.api.context.active());
      if (span === undefined) return null;
      const sc = span.spanContext();
      if (!this.api.isSpanContextValid(sc)) return null;
      const tags: Record<string, string> = { traceparent: formatTraceparent(sc) };
      const state = sc.traceState?.serialize();
      if (state) tags.tracestate = state;
      return tags;
    } catch {
      return null;
    }
  }

  /** The span of one attempt of `ticket`'s run, or null while nothing records. */
  attempt(ticket: Ticket): AttemptTrace | null {
    const tracer = this.live();
    if (tracer === null) return null;
    const api = this.api;
    let parent = api.ROOT_CONTEXT;
    const attrs: Record<string, string | number | boolean> = {
      'jobforge.run.id': ticket.id,
      'jobforge.job_type': ticket.jobType,
      'jobforge.pool': ticket.pool,
    };
    try {
      const run = ticket.run;
      attrs['jobforge.attempt'] = run.attempts + 1;
      if (run.tenantId !== null) attrs['jobforge.tenant_id'] = run.tenantId;
      const tp = run.tags.traceparent;
      const sc = tp === undefined ? null : parseTraceparent(tp, run.tags.tracestate, api);
      if (sc !== null) parent = api.trace.setSpanContext(parent, sc);
    } catch {
      // A run purged while it starts: its span has no parent and fewer attributes.
    }
    try {
      const span = tracer.startSpan(`run ${ticket.jobType}`, { kind: api.SpanKind.CONSUMER, attributes: attrs }, parent);
      return new AttemptTrace(api, tracer, span, api.trace.setSpan(parent, span));
    } catch {
      // A tracer that throws records nothing; the attempt runs as without one.
      return null;
    }
  }
}

/** An attempt's span: the context its handler runs in, and its steps' parent. */
export class AttemptTrace {
  private ended = false;
  private failure: string | undefined;

  constructor(
    private readonly api: OtelApi,
    private readonly tracer: Tracer,
    private readonly span: Span,
    private readonly ctx: Context,
  ) {}

  /** Runs `f` with this attempt's span active. */
  within<T>(f: () => T): T {
    return this.api.context.with(this.ctx, f);
  }

  /** The handler threw or rejected with `err` (the outcome follows). */
  failed(err: unknown): void {
    if (this.ended) return;
    this.failure = messageOf(err);
    guard(() => this.span.recordException(errorLike(err)));
  }

  /**
   * Ends the span with the attempt's outcome: completed, failed, parked
   * (the run waits), no_handler, or the abort that ended it first
   * (canceled, timed_out, shutdown). A failure is the span's error status.
   */
  end(outcome: string): void {
    if (this.ended) return;
    this.ended = true;
    guard(() => {
      this.span.setAttribute('jobforge.outcome', outcome);
      if (outcome === 'failed') this.span.setStatus({ code: this.api.SpanStatusCode.ERROR, message: this.failure ?? 'failed' });
      else if (outcome === 'no_handler') this.span.setStatus({ code: this.api.SpanStatusCode.ERROR, message: 'no handler registered in this process' });
      this.span.end();
    });
  }

  /**
   * Runs one `ctx.step` call in a child span: the active span when it is
   * one of this attempt's trace (a step inside a step), else the attempt's.
   */
  async step<T>(stepId: string, body: (trace: StepTrace | null) => Promise<T>): Promise<T> {
    const api = this.api;
    let span: Span;
    let ctx: Context;
    try {
      const active = api.context.active();
      const cur = api.trace.getSpan(active);
      const parent = cur !== undefined && cur.spanContext().traceId === this.span.spanContext().traceId ? active : this.ctx;
      span = this.tracer.startSpan(`step ${stepId}`, { kind: api.SpanKind.INTERNAL, attributes: { 'jobforge.step.id': stepId } }, parent);
      ctx = api.trace.setSpan(parent, span);
    } catch {
      return body(null);
    }
    try {
      return await api.context.with(ctx, () => body(new StepTrace(span)));
    } catch (err) {
      guard(() => span.setStatus({ code: api.SpanStatusCode.ERROR, message: messageOf(err) }));
      throw err;
    } finally {
      guard(() => span.end());
    }
  }
}

/** What a step's loop tells its span. */
export class StepTrace {
  constructor(private readonly span: Span) {}

  memoized(): void {
    guard(() => this.span.setAttribute('jobforge.step.memoized', true));
  }

  /** A try began (`attempt` counts from 1 over every execution of the step). */
  tryBegan(attempt: number): void {
    guard(() => this.span.setAttribute('jobforge.step.attempt', attempt));
  }

  tryFailed(err: unknown): void {
    guard(() => this.span.recordException(errorLike(err)));
  }
}

/**
 * Runs a tracing call: a span that throws (an error whose getters throw,
 * given to `recordException`) must not change what the attempt does.
 */
function guard(f: () => unknown): void {
  try {
    f();
  } catch {
    // Tracing is best effort.
  }
}

function messageOf(err: unknown): string {
  try {
    return err instanceof Error ? err.message : String(err);
  } catch {
    return 'unknown error';
  }
}

/** What `recordException` takes: an Error as is, anything else as its message. */
function errorLike(err: unknown): unknown {
  return err instanceof Error ? err : messageOf(err);
}
