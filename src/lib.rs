//! napi-rs binding of jobforge: one native class over the core engine, JSON
//! text across the boundary (one string per row, no per-field napi calls),
//! and the threadsafe-function bridge that runs JS handlers. No
//! orchestration rule lives here.

use jobforge_core::engine::Retention;
use jobforge_core::engine::{
    json_value, AttemptEnd, AttemptTicket, EngineObserver, HandlerExecutor, StepBegin,
};
use jobforge_core::worker::{BatchDispatcher, Worker, WorkerPool};
use jobforge_core::{
    AbortReason, AttemptOutcome, ClockKind, DefinitionSpec, Engine, EngineOptions, FailureInfo,
    JobError, MemoryStore, ParentClosePolicy, PlainStart, RetryPolicy, RunId, ScheduleRow,
    ScheduleSpec, ScheduleTiming, StartRequest, TenantArg, TriggerSource,
};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{
    ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue,
};
use napi_derive::napi;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use std::sync::Arc;

mod ops;
mod pg;

/// Prefix of every engine error message crossing into JS; the TS layer
/// parses the JSON after it into the matching error class. Async napi
/// functions cannot carry custom codes, so sync and async share this form.
const ERROR_PREFIX: &str = "JOBFORGE_ERROR:";

fn to_napi(e: JobError) -> Error {
    let payload = json!({
        "code": e.code(),
        "message": e.to_string(),
        "fields": e.fields_json(),
    });
    Error::new(Status::GenericFailure, format!("{ERROR_PREFIX}{payload}"))
}

fn invalid(reason: impl Into<String>) -> Error {
    to_napi(JobError::JobInputInvalid {
        reason: reason.into(),
    })
}

fn tenant_arg(given: bool, id: Option<String>) -> TenantArg {
    match (given, id) {
        (false, _) => TenantArg::Missing,
        (true, None) => TenantArg::Null,
        (true, Some(t)) => TenantArg::Id(t),
    }
}

/// Dispatch: JS receives one JSON string (run row, epoch, timeout) and
/// resolves with the outcome as a JSON string. Weak, so an idle engine
/// never keeps Node alive; not error-first (`CalleeHandled = false`).
type DispatchFn = ThreadsafeFunction<String, Promise<String>, String, Status, false, true>;
/// Abort notification: `{"runId", "reason"}` as JSON; fire and forget.
type AbortFn = ThreadsafeFunction<String, UnknownReturnValue, String, Status, false, true>;

/// What the engine tells JS: aborts to fire and (when enabled) transition
/// events. Queued here, drained by `take_notices`.
#[derive(Default)]
struct Notices {
    aborts: Vec<(RunId, Option<u32>, AbortReason)>,
    events: Vec<String>,
}

type PendingAborts = Arc<std::sync::Mutex<Notices>>;

/// Aborts are queued here and drained by JS: synchronously right after the
/// native call that caused them (a weak threadsafe function alone could be
/// dropped when the event loop has nothing else to do), and through the
/// threadsafe function for aborts decided on the engine's own threads.
struct JsObserver {
    on_abort: AbortFn,
    pending: PendingAborts,
    /// Notices raised on the JS thread are drained right after the call
    /// that raised them; only the engine's own threads need the nudge.
    js_thread: std::thread::ThreadId,
}

impl JsObserver {
    fn nudge(&self) {
        if std::thread::current().id() != self.js_thread {
            // NonBlocking on an unbounded queue: only `Closing` (Node
            // shutting down) can fail, and then there is nobody to tell.
            let _ = self
                .on_abort
                .call(String::new(), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

impl EngineObserver for JsObserver {
    fn run_aborted(&self, run_id: RunId, epoch: Option<u32>, reason: AbortReason) {
        if let Ok(mut p) = self.pending.lock() {
            p.aborts.push((run_id, epoch, reason));
        }
        self.nudge();
    }

    fn run_events(&self, rows: Vec<jobforge_core::RunRow>) {
        if let Ok(mut p) = self.pending.lock() {
            p.events.extend(rows.iter().map(|r| r.to_compact_json()));
        }
        self.nudge();
    }
}

/// Worker batches: tickets, one per line; fire and forget (JS reports the
/// outcomes with synchronous `worker_report` calls). Weak: a running worker
/// keeps Node alive from the JS side, an idle engine never does.
type BatchFn = ThreadsafeFunction<String, UnknownReturnValue, String, Status, false, true>;

struct JsBatch {
    pub(crate) on_batch: BatchFn,
    /// Postgres tickets carry the row (JS cannot read it back synchronously);
    /// in memory JS reads it on demand (`claimed_run`), unless retention is
    /// on: a canceled or timed-out run may then be deleted while its
    /// handler still runs, and `ctx.run` / `ctx.logger` must still work.
    pub(crate) with_row: bool,
}

impl BatchDispatcher for JsBatch {
    fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool {
        // One ticket per line (compact JSON never contains a raw newline).
        let json = tickets
            .iter()
            .map(|t| ticket_text(t, self.with_row))
            .collect::<Vec<_>>()
            .join("\n");
        // Unbounded queue: QueueFull cannot happen; Closing means Node is
        // going away and the caller releases the runs.
        self.on_batch
            .call(json, ThreadsafeFunctionCallMode::NonBlocking)
            == Status::Ok
    }

    /// A notice reaches JS as a batch line starting with `!` (a ticket
    /// starts with its header, never with `!`).
    fn notice(&self, message: String) {
        let line = format!("!{}", message.replace('\n', " "));
        let _ = self
            .on_batch
            .call(line, ThreadsafeFunctionCallMode::NonBlocking);
    }
}

struct JsExecutor {
    dispatch: Arc<DispatchFn>,
}

/// An attempt ticket for JS: `header \0 input \0 row` (see `ticket_text`
/// for the header; input and row are JSON, in which serde_json escapes NUL,
/// so the separators are unambiguous).
/// JS parses the small header and the input at once and the full run row
/// only if the handler reads `ctx.run`.
/// Appends `lines` to `out`, one per line.
fn push_lines(out: &mut String, lines: &[String]) {
    for l in lines {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(l);
    }
}

/// The run id every report and batch line starts with, and the rest.
fn split_run_id(line: &str) -> std::result::Result<(RunId, &str), String> {
    let id_text = line.get(..36).ok_or("too short")?;
    let id = id_text
        .parse::<RunId>()
        .map_err(|_| format!("bad run id '{id_text}'"))?;
    Ok((id, &line[36..]))
}

/// One line of `worker_report`, see there.
fn parse_report_line(
    line: &str,
) -> std::result::Result<(RunId, u32, Option<AttemptOutcome>, usize), String> {
    let (id, rest) = split_run_id(line)?;
    let a = rest.find(',').ok_or("no ',' after the epoch")?;
    let epoch: u32 = rest[..a].parse().map_err(|_| "bad epoch")?;
    let rest = &rest[a + 1..];
    let b = rest.find(',').ok_or("no ',' after the pool index")?;
    // Negative or huge: no slot of this worker (frees none).
    let slot = rest[..b].parse::<usize>().unwrap_or(usize::MAX);
    let outcome = match &rest[b + 1..] {
        "" => None,
        // Completed with no output: the common case, one character.
        "." => Some(AttemptOutcome::Completed(None)),
        text => Some(parse_outcome(text)),
    };
    Ok((id, epoch, outcome, slot))
}

/// One line of `start_batch`, see there.
fn parse_batch_line(line: &str) -> std::result::Result<PlainStart<'_>, String> {
    let (id, rest) = split_run_id(line)?;
    let comma = rest.find(',').ok_or("no ',' after the time")?;
    let at: i64 = rest[..comma]
        .parse()
        .map_err(|_| format!("bad time '{}'", &rest[..comma]))?;
    let rest = &rest[comma + 1..];
    let colon = rest.find(':').ok_or("no ':' after the type length")?;
    let len: usize = rest[..colon].parse().map_err(|_| "bad type length")?;
    let rest = &rest[colon + 1..];
    let (job_type, input) = (rest.get(..len).ok_or("type cut short")?, &rest[len..]);
    let input = RawValue::from_string(input.to_owned()).map_err(|e| format!("input: {e}"))?;
    Ok(PlainStart {
        id,
        at,
        job_type,
        input,
    })
}

fn ticket_json(t: &AttemptTicket) -> String {
    ticket_text(t, true)
}

/// `ticket_json`, with the row left empty unless `with_row`: serialising a
/// row costs more than the rest of a worker's per-run native work, and most
/// handlers never read `ctx.run` (JS fetches it with `claimed_run` if so).
fn ticket_text(t: &AttemptTicket, with_row: bool) -> String {
    let row = if with_row {
        t.run.to_compact_json()
    } else {
        String::new()
    };
    let mut out = String::with_capacity(96 + t.run.input.get().len() + row.len());
    write_ticket(&mut out, t);
    out.push_str(&row);
    out
}

/// Appends a ticket without its row (see `ticket_text`) to `out`.
fn write_ticket(out: &mut String, t: &AttemptTicket) {
    use std::fmt::Write;
    // Written by hand and read by hand in JS (no JSON for the header): this
    // is on every run's path. `<id><epoch>,<timeoutMs or nothing>,` then
    // the job type and the pool, each as `<UTF-16 length>:<text>`, so any
    // character may appear in them.
    let mut id = RunId::encode_buffer();
    out.push_str(t.run.id.hyphenated().encode_lower(&mut id));
    let _ = write!(out, "{},", t.epoch);
    if let Some(ms) = t.timeout_ms {
        let _ = write!(out, "{ms}");
    }
    let (job_type, pool) = (&*t.run.job_type, &*t.run.pool);
    let _ = write!(
        out,
        ",{}:{job_type}{}:{pool}\0{}\0",
        utf16_len(job_type),
        utf16_len(pool),
        t.run.input.get()
    );
}

/// Length in UTF-16 units (what JS string lengths count).
fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.encode_utf16().count()
    }
}

#[derive(serde::Deserialize)]
struct OutcomeError {
    message: Option<String>,
    stack: Option<String>,
    name: Option<String>,
    code: Option<String>,
}

/// The outcome JSON the TS dispatcher resolves with. `output` stays raw
/// text so the handler's key order is kept.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutcomeWire {
    status: String,
    output: Option<Box<RawValue>>,
    error: Option<OutcomeError>,
    timeout_ms: Option<i64>,
}

fn parse_outcome(text: &str) -> AttemptOutcome {
    // What a handler that returns nothing reports (most do): no parse.
    if text == r#"{"status":"completed","output":{}}"# {
        return AttemptOutcome::Completed(None);
    }
    let wire: OutcomeWire = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return AttemptOutcome::Failed(FailureInfo {
                message: format!("handler outcome was not understood: {e}"),
                ..FailureInfo::default()
            })
        }
    };
    match wire.status.as_str() {
        "completed" => AttemptOutcome::Completed(wire.output.filter(|o| o.get() != "null")),
        "no_handler" => AttemptOutcome::NoHandler,
        "timed_out" => AttemptOutcome::TimedOut {
            timeout_ms: wire.timeout_ms.unwrap_or(0),
        },
        _ => {
            let e = wire.error;
            AttemptOutcome::Failed(FailureInfo {
                message: e
                    .as_ref()
                    .and_then(|e| e.message.clone())
                    .unwrap_or_else(|| "handler failed".to_owned()),
                stack: e.as_ref().and_then(|e| e.stack.clone()),
                name: e.as_ref().and_then(|e| e.name.clone()),
                code: e.as_ref().and_then(|e| e.code.clone()),
            })
        }
    }
}

impl HandlerExecutor for JsExecutor {
    async fn execute(&self, ticket: &AttemptTicket) -> AttemptOutcome {
        let payload = ticket_json(ticket);
        let failed = |message: String| {
            AttemptOutcome::Failed(FailureInfo {
                message,
                ..FailureInfo::default()
            })
        };
        // `call_async_catch`: a synchronous throw in JS becomes an Err here
        // instead of an uncaughtException.
        let promise = match self.dispatch.call_async_catch(payload).await {
            Ok(p) => p,
            Err(e) => return failed(format!("handler dispatch failed: {}", e.reason)),
        };
        match promise.await {
            Ok(text) => parse_outcome(&text),
            Err(e) => failed(e.reason.clone()),
        }
    }
}

#[napi(object)]
pub struct NativeOptions {
    /// Tenant gate on every call (CONTRACT.md "Tenant gate").
    pub multi_tenant: Option<bool>,
    /// `'system'` (default) or `'manual'` (moved only by `advanceTime`).
    pub clock: Option<String>,
    /// Keep completed runs this many ms after they finish (default: forever).
    pub retain_completed_ms: Option<f64>,
    /// Keep failed, timed-out and canceled runs this many ms (default: forever).
    pub retain_failed_ms: Option<f64>,
}

/// Engine options from the JS options shared by both classes.
fn engine_options(
    multi_tenant: Option<bool>,
    clock: Option<&str>,
    retain_completed_ms: Option<f64>,
    retain_failed_ms: Option<f64>,
) -> Result<EngineOptions> {
    let clock = match clock {
        None | Some("system") => ClockKind::System,
        Some("manual") => ClockKind::Manual,
        Some(other) => {
            return Err(invalid(format!(
                "clock must be 'system' or 'manual', got '{other}'"
            )))
        }
    };
    Ok(EngineOptions {
        multi_tenant: multi_tenant.unwrap_or(false),
        clock,
        retention: Retention {
            completed_ms: retention_ms(retain_completed_ms, "retention.completedMs")?,
            failed_ms: retention_ms(retain_failed_ms, "retention.failedMs")?,
        },
    })
}

fn retention_ms(v: Option<f64>, name: &str) -> Result<Option<i64>> {
    match v {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some(ms as i64)),
        Some(ms) if ms == f64::INFINITY => Ok(None),
        Some(ms) => Err(invalid(format!(
            "{name} must be a non-negative number of ms, got {ms}"
        ))),
    }
}

/// Native bytes V8 is told each held run costs (RSS per pending run
/// measured at 1M runs: ~340 B).
const RUN_BYTES: i64 = 340;
/// V8 hears of a change in the engine's size once it reaches this much, so
/// the hot paths rarely pay for the call.
const REPORT_STEP: i64 = 1 << 20;
/// The most one engine reports. The report only has to make a dropped
/// engine worth collecting; reporting all of a large live one makes V8 run
/// full collections that free nothing while it grows, and leaves its heap
/// sized larger (measured: +16 B RSS per run at 1M runs).
const REPORT_CAP: i64 = 32 << 20;

/// The engine over the in-memory store. Rows cross as JSON text.
#[napi(custom_finalize)]
pub struct NativeEngine {
    engine: Arc<Engine<MemoryStore>>,
    /// Bytes of native memory reported to V8 (`adjust_external_memory`):
    /// without it the collector sees a small JS object, feels no pressure
    /// to collect an unreachable orchestrator, and its runs stay in memory.
    reported: std::sync::atomic::AtomicI64,
    pending_aborts: PendingAborts,
    worker: std::sync::Mutex<Option<Arc<Worker<MemoryStore>>>>,
    executor: Arc<JsExecutor>,
}

#[napi]
impl NativeEngine {
    #[napi(
        constructor,
        ts_args_type = "options: NativeOptions, dispatch: (payload: string) => Promise<string>, onAbort: () => void"
    )]
    pub fn new(options: NativeOptions, dispatch: DispatchFn, on_abort: AbortFn) -> Result<Self> {
        let engine = Arc::new(Engine::new(
            MemoryStore::new(),
            engine_options(
                options.multi_tenant,
                options.clock.as_deref(),
                options.retain_completed_ms,
                options.retain_failed_ms,
            )?,
        ));
        let pending_aborts = PendingAborts::default();
        engine.set_observer(Arc::new(JsObserver {
            on_abort,
            pending: pending_aborts.clone(),
            js_thread: std::thread::current().id(),
        }));
        Ok(NativeEngine {
            engine,
            reported: std::sync::atomic::AtomicI64::new(0),
            pending_aborts,
            worker: std::sync::Mutex::new(None),
            executor: Arc::new(JsExecutor {
                dispatch: Arc::new(dispatch),
            }),
        })
    }

    /// Registers definitions from a JSON array of specs, all or none;
    /// returns the definition rows as a JSON array.
    #[napi(catch_unwind)]
    pub fn register(&self, specs_json: String) -> Result<String> {
        ops::register(&self.engine, specs_json)
    }

    #[napi(catch_unwind)]
    pub fn definition(&self, job_type: String) -> Option<String> {
        ops::definition(&self.engine, job_type)
    }

    /// `start`: `input_json` is the validated input; `opts_json` the start
    /// options (with any function-evaluated keys). Returns the row JSON.
    #[napi(catch_unwind)]
    pub fn start(
        &self,
        env: Env,
        job_type: String,
        input_json: String,
        opts_json: Option<String>,
    ) -> Result<String> {
        let row = ops::start(&self.engine, job_type, input_json, opts_json);
        self.report_size(&env);
        row
    }

    /// Checks the tenant gate and job type only (see `Engine::start_preflight`).
    #[napi(catch_unwind)]
    pub fn start_preflight(
        &self,
        job_type: String,
        tenant_given: bool,
        tenant_id: Option<String>,
        has_parent: bool,
    ) -> Result<()> {
        ops::start_preflight(&self.engine, job_type, tenant_given, tenant_id, has_parent)
    }

    #[napi(catch_unwind)]
    pub fn cancel(
        &self,
        run_id: String,
        cascade: bool,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<()> {
        ops::cancel(&self.engine, run_id, cascade, tenant_given, tenant_id)
    }

    #[napi(catch_unwind)]
    pub fn claim_next(&self, pool: String) -> Result<Option<String>> {
        ops::claim_next(&self.engine, pool)
    }

    /// Starts the attempt of a claimed run: `{"run","epoch","timeoutMs"}`.
    /// With `finish_attempt` this is the synchronous path `tick` uses from
    /// JS: the handler runs on the JS thread with no thread hop.
    #[napi(catch_unwind)]
    pub fn begin_attempt(&self, run_id: String) -> Result<String> {
        ops::begin_attempt(&self.engine, run_id)
    }

    /// Applies an attempt's outcome JSON (`completed` / `failed` /
    /// `timed_out` / `no_handler`). Returns whether it was applied (false
    /// when the run was canceled or replayed meanwhile).
    #[napi(catch_unwind)]
    pub fn finish_attempt(
        &self,
        env: Env,
        run_id: String,
        epoch: u32,
        outcome_json: String,
    ) -> Result<bool> {
        // Retention may purge finished runs here.
        let done = ops::finish_attempt(&self.engine, run_id, epoch, outcome_json);
        self.report_size(&env);
        done
    }

    /// Executes one claimed run with the handler called through the
    /// threadsafe dispatch function, from the engine's async runtime (the
    /// path a Rust-driven scheduler uses).
    #[napi]
    pub async fn tick(&self, run_id: String) -> Result<()> {
        let engine = self.engine.clone();
        let executor = self.executor.clone();
        engine
            .tick(&run_id, executor.as_ref())
            .await
            .map_err(to_napi)
    }

    /// `ctx.step` begin: `{"memoized":true,"output":…}` or `{"attempt":n}`.
    #[napi(catch_unwind)]
    pub fn step_begin(&self, run_id: String, epoch: u32, step_id: String) -> Result<String> {
        ops::step_begin(&self.engine, run_id, epoch, step_id)
    }

    #[napi(catch_unwind)]
    pub fn step_complete(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        output_json: Option<String>,
    ) -> Result<()> {
        ops::step_complete(&self.engine, run_id, epoch, step_id, output_json)
    }

    /// Records a step failure; returns the backoff before a retry, if any.
    #[napi(catch_unwind)]
    pub fn step_fail(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        failure_json: String,
        policy_json: Option<String>,
    ) -> Result<Option<f64>> {
        ops::step_fail(
            &self.engine,
            run_id,
            epoch,
            step_id,
            failure_json,
            policy_json,
        )
    }

    #[napi(catch_unwind)]
    pub fn replay(&self, run_id: String) -> Result<String> {
        ops::replay(&self.engine, run_id)
    }

    #[napi(catch_unwind)]
    pub fn find_by_id(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<Option<String>> {
        ops::find_by_id(&self.engine, run_id, tenant_given, tenant_id)
    }

    /// Steps of a run as a JSON array, in seq order.
    #[napi(catch_unwind)]
    pub fn list_steps(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        ops::list_steps(&self.engine, run_id, tenant_given, tenant_id)
    }

    // ── run service ────────────────────────────────────────────────────

    /// Runs of a scope as a JSON array. `query_json`: `{status?, jobType?,
    /// limit?, offset?, orderBy?}`.
    #[napi(catch_unwind)]
    pub fn list_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        query_json: String,
    ) -> Result<String> {
        ops::list_for_scope(
            &self.engine,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            query_json,
        )
    }

    #[napi(catch_unwind)]
    pub fn cancel_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        cascade: bool,
    ) -> Result<u32> {
        ops::cancel_for_scope(
            &self.engine,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            cascade,
        )
    }

    #[napi(catch_unwind)]
    pub fn reschedule_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        run_at: f64,
    ) -> Result<u32> {
        ops::reschedule_for_scope(
            &self.engine,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            run_at,
        )
    }

    /// `[{pool, status, count}]`, sorted by pool then status.
    #[napi(catch_unwind)]
    pub fn count_by_pool_and_status(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        ops::count_by_pool_and_status(&self.engine, tenant_given, tenant_id)
    }

    /// The schedule as stored (JSON; times in epoch ms).
    #[napi(catch_unwind)]
    #[allow(clippy::too_many_arguments)]
    pub fn put_schedule(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        name: String,
        job_type: String,
        input_json: String,
        cron: Option<String>,
        timezone: Option<String>,
        every_ms: Option<f64>,
    ) -> Result<String> {
        ops::put_schedule(
            &self.engine,
            tenant_given,
            tenant_id,
            name,
            job_type,
            input_json,
            cron,
            timezone,
            every_ms,
        )
    }

    #[napi(catch_unwind)]
    pub fn remove_schedule(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        name: String,
    ) -> Result<bool> {
        ops::remove_schedule(&self.engine, tenant_given, tenant_id, name)
    }

    #[napi(catch_unwind)]
    pub fn list_schedules(&self, tenant_given: bool, tenant_id: Option<String>) -> Result<String> {
        ops::list_schedules(&self.engine, tenant_given, tenant_id)
    }

    /// Runs started for due schedules.
    #[napi(catch_unwind)]
    pub fn fire_due_schedules(&self) -> Result<u32> {
        ops::fire_due_schedules(&self.engine)
    }

    #[napi(catch_unwind)]
    pub fn list_recent_failed(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        limit: Option<f64>,
    ) -> Result<String> {
        ops::list_recent_failed(&self.engine, tenant_given, tenant_id, limit)
    }

    /// `{"rows": [...], "nextCursor": string | null}`.
    #[napi(catch_unwind)]
    pub fn list_job_runs(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        query_json: String,
    ) -> Result<String> {
        ops::list_job_runs(&self.engine, tenant_given, tenant_id, query_json)
    }

    /// `{run, children: [...]}` nested, or null.
    #[napi(catch_unwind)]
    pub fn get_run_tree(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        root_run_id: String,
    ) -> Result<Option<String>> {
        ops::get_run_tree(&self.engine, tenant_given, tenant_id, root_run_id)
    }

    #[napi(catch_unwind)]
    pub fn find_step(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        run_id: String,
        step_id: String,
    ) -> Result<Option<String>> {
        ops::find_step(&self.engine, tenant_given, tenant_id, run_id, step_id)
    }

    #[napi(catch_unwind)]
    pub fn record_step(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        record_json: String,
    ) -> Result<String> {
        ops::record_step(&self.engine, tenant_given, tenant_id, record_json)
    }

    /// Drains queued notices: `{"aborts":[{"runId","epoch"?,"reason"}],"events":[row…]}`,
    /// or null when there are none.
    #[napi(catch_unwind)]
    pub fn take_notices(&self) -> Option<String> {
        take_notices(&self.pending_aborts)
    }

    /// Turns transition events for every run on or off.
    #[napi(catch_unwind)]
    pub fn set_events(&self, enabled: bool) {
        self.engine.set_events(enabled);
    }

    /// Watches (or stops watching) one run's transitions, for `waitForRun`.
    #[napi(catch_unwind)]
    pub fn watch_run(&self, run_id: String, on: bool) {
        if let Ok(id) = run_id.parse::<RunId>() {
            self.engine.watch_run(id, on);
        }
    }

    // ── worker ─────────────────────────────────────────────────────────

    /// Starts the scheduler for `pools_json` (`[{"name","concurrency"}]`);
    /// claimed batches reach `on_batch` as a JSON array of tickets.
    #[napi(
        catch_unwind,
        ts_args_type = "poolsJson: string, onBatch: (tickets: string) => void"
    )]
    pub fn start_worker(&self, pools_json: String, on_batch: BatchFn) -> Result<()> {
        let pools = parse_pools(&pools_json)?;
        let mut guard = self
            .worker
            .lock()
            .map_err(|_| invalid("worker state poisoned"))?;
        if guard.as_ref().is_some_and(|w| !w.is_stopping()) {
            return Err(invalid("a worker is already running on this orchestrator"));
        }
        let worker = Worker::new(self.engine.clone(), pools);
        *guard = Some(worker.clone());
        napi::bindgen_prelude::spawn(worker.run(JsBatch {
            on_batch,
            with_row: self.engine.purges(),
        }));
        Ok(())
    }

    /// Records the outcomes of several worker attempts in one call and
    /// claims into the slots they free (see `Worker::report`). `report`:
    /// one attempt per line, `<id><epoch>,<pool index>,<outcome JSON>`,
    /// where the pool index is the pool's position in `start_worker`'s list,
    /// an empty outcome means the attempt ended without one (canceled or
    /// released) and `.` a completion with no output; outcome JSON never
    /// holds a raw newline. `starts`: as
    /// `start_batch`, created first so the freed slots can claim them.
    /// Answers `'0'|'1'` (notices pending), then one line per new ticket,
    /// `!<line> <message>` per refused start and `?<message>` per outcome
    /// that could not be recorded.
    #[napi(catch_unwind)]
    pub fn worker_report(
        &self,
        env: Env,
        report: String,
        starts: Option<String>,
    ) -> Result<String> {
        let (problems, pools) = match &starts {
            Some(batch) => self.create_buffered(batch, false)?,
            None => (Vec::new(), Vec::new()),
        };
        self.report_size(&env);
        let mut finished = Vec::new();
        let mut unread = Vec::new();
        for line in report.split('\n') {
            if line.is_empty() {
                continue;
            }
            match parse_report_line(line) {
                Ok(item) => finished.push(item),
                Err(reason) => unread.push(format!("?unreadable worker report line: {reason}")),
            }
        }
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        let (tickets, error) = match worker {
            Some(w) => w.report(finished),
            None => {
                // No worker (stopped and gone): apply the outcomes only.
                let items = finished
                    .into_iter()
                    .map(|(id, epoch, outcome, _)| AttemptEnd {
                        id,
                        epoch,
                        outcome,
                        ended_at: None,
                    })
                    .collect();
                match self.engine.settle(items, &[]) {
                    Ok(settled) => (settled.tickets, None),
                    Err(e) => (Vec::new(), Some(e)),
                }
            }
        };
        let pending = self
            .pending_aborts
            .lock()
            .map(|p| !p.aborts.is_empty() || !p.events.is_empty())
            .unwrap_or(false);
        let mut out = String::with_capacity(1 + tickets.len() * 160);
        out.push(if pending { '1' } else { '0' });
        for t in &tickets {
            out.push('\n');
            write_ticket(&mut out, t);
        }
        if !pools.is_empty() {
            // Slots of other pools may be idle: claim into them too.
            self.fill_into(&mut out, Some(&pools))?;
        }
        push_lines(&mut out, &problems);
        push_lines(&mut out, &unread);
        if let Some(e) = error {
            push_lines(&mut out, &[format!("?{e}")]);
        }
        Ok(out)
    }

    /// Tells V8 how much native memory the engine's runs hold, once the
    /// figure has moved by `REPORT_STEP` since it was last told.
    fn report_size(&self, env: &Env) {
        use std::sync::atomic::Ordering::Relaxed;
        let bytes = (self.engine.store().live_runs() as i64 * RUN_BYTES).min(REPORT_CAP);
        let told = self.reported.load(Relaxed);
        if (bytes - told).abs() >= REPORT_STEP && env.adjust_external_memory(bytes - told).is_ok() {
            self.reported.store(bytes, Relaxed);
        }
    }

    /// Creates the runs of a `start_batch` text; answers one
    /// `!<line> <message>` per run that could not be created.
    fn create_buffered(&self, batch: &str, wake: bool) -> Result<(Vec<String>, Vec<Arc<str>>)> {
        let mut reqs = Vec::new();
        let mut problems = Vec::new();
        let mut index = Vec::new();
        for (i, line) in batch.split('\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            match parse_batch_line(line) {
                Ok(req) => {
                    index.push(i);
                    reqs.push(req);
                }
                Err(reason) => problems.push(format!("!{i} invalid batch line: {reason}")),
            }
        }
        let (failed, pools) = self.engine.start_plain_batch(reqs, wake).map_err(to_napi)?;
        for (k, e) in failed {
            problems.push(format!("!{} {e}", index.get(k).copied().unwrap_or(k)));
        }
        Ok((problems, pools))
    }

    /// Claims into the worker's free slots (of `only`'s pools, if given);
    /// appends one ticket per line.
    fn fill_into(&self, out: &mut String, only: Option<&[Arc<str>]>) -> Result<()> {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        if let Some(w) = worker {
            for t in w.fill_only(only).map_err(to_napi)? {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&ticket_text(&t, self.engine.purges()));
            }
        }
        Ok(())
    }

    /// Claims into the worker's free slots from the JS thread (after a
    /// start): tickets one per line, or an empty string.
    #[napi(catch_unwind)]
    pub fn worker_fill(&self) -> Result<String> {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        let Some(w) = worker else {
            return Ok(String::new());
        };
        let tickets = w.fill().map_err(to_napi)?;
        Ok(tickets
            .iter()
            .map(|t| ticket_text(t, self.engine.purges()))
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// `count` (at most 4096) fresh run ids (UUID v4), concatenated: JS
    /// hands them out to buffered starts.
    #[napi(catch_unwind)]
    pub fn new_run_ids(&self, count: u32) -> String {
        let n = count.min(4096) as usize;
        let mut out = String::with_capacity(n * 36);
        let mut buf = RunId::encode_buffer();
        for _ in 0..n {
            out.push_str(RunId::new_v4().hyphenated().encode_lower(&mut buf));
        }
        out
    }

    /// The row of a run a worker ticket handed out, for `ctx.run` (no
    /// tenant gate: the handler already holds the run). `None` once purged.
    #[napi(catch_unwind)]
    pub fn claimed_run(&self, run_id: String) -> Option<String> {
        let id = run_id.parse::<RunId>().ok()?;
        self.engine.run_row(&id).map(|r| r.to_compact_json())
    }

    /// Creates runs JS has already answered `start` for (see
    /// `Engine::start_plain_batch`). `batch`: one run per line,
    /// `<id><createdAt ms>,<type byte length>:<type><input JSON>` (input
    /// JSON text never holds a raw newline). `fed`: claim into the worker's
    /// free slots in the same call. Answers one line per ticket claimed, and
    /// `!<line index> <message>` for each run that could not be created.
    #[napi(catch_unwind)]
    pub fn start_batch(&self, env: Env, batch: String, fed: bool) -> Result<String> {
        let (problems, pools) = self.create_buffered(&batch, !fed)?;
        self.report_size(&env);
        let mut out = String::new();
        if fed {
            self.fill_into(&mut out, Some(&pools))?;
        }
        push_lines(&mut out, &problems);
        Ok(out)
    }

    /// Stops claiming; in-flight attempts go on. Returns how many are in flight.
    #[napi(catch_unwind)]
    pub fn worker_stop(&self) -> u32 {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        worker.map_or(0, |w| {
            w.stop();
            w.pools().iter().map(|p| p.in_flight() as u32).sum()
        })
    }

    /// Attempts the worker holds right now.
    #[napi(catch_unwind)]
    pub fn worker_in_flight(&self) -> u32 {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        worker.map_or(0, |w| w.pools().iter().map(|p| p.in_flight() as u32).sum())
    }

    /// Whether an attempt is still the run's current one (not canceled,
    /// timed out or released since it was claimed).
    #[napi(catch_unwind)]
    pub fn attempt_live(&self, run_id: String, epoch: u32) -> bool {
        run_id
            .parse::<RunId>()
            .is_ok_and(|id| self.engine.attempt_current(&id, epoch))
    }

    /// Puts an interrupted attempt's run back to pending (shutdown).
    #[napi(catch_unwind)]
    pub fn release_attempt(&self, run_id: String, epoch: u32) -> Result<bool> {
        let Ok(id) = run_id.parse::<RunId>() else {
            return Ok(false);
        };
        self.engine.release_attempt(&id, epoch).map_err(to_napi)
    }

    /// Engine time in epoch ms.
    #[napi(catch_unwind)]
    pub fn now(&self) -> f64 {
        self.engine.now() as f64
    }

    /// Moves a manual clock; returns the new time, or null on the system clock.
    #[napi(catch_unwind)]
    pub fn advance_time(&self, ms: f64) -> Option<f64> {
        self.engine.advance_time(ms as i64).map(|t| t as f64)
    }

    /// Resolves after `ms` of engine time (a manual clock waits for
    /// `advanceTime`).
    #[napi]
    pub async fn sleep(&self, ms: f64) -> Result<()> {
        let clock = self.engine.clock().clone();
        let deadline = clock.now().saturating_add(ms.max(0.0) as i64);
        clock.sleep_until(deadline).await;
        Ok(())
    }

    #[napi(catch_unwind)]
    pub fn clock_kind(&self) -> String {
        match self.engine.clock().kind() {
            ClockKind::System => "system".to_owned(),
            ClockKind::Manual => "manual".to_owned(),
        }
    }
}

fn parse_failure(text: &str) -> FailureInfo {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    FailureInfo {
        message: s("message").unwrap_or_else(|| "step failed".to_owned()),
        stack: s("stack"),
        name: s("name"),
        code: s("code"),
    }
}

/// `undefined` vs `null` for an optional JSON field.
fn tristate<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<String>>, D::Error> {
    use serde::Deserialize;
    Ok(Some(Option::<String>::deserialize(d)?))
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScopeWire {
    entity_type: String,
    entity_id: String,
}

/// Start options as the TS layer sends them (already shape-checked there;
/// checked again here so a direct caller gets typed errors too). Unknown
/// fields (e.g. `reason`) are ignored like JS would.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartOptsWire {
    #[serde(default, deserialize_with = "tristate")]
    tenant_id: Option<Option<String>>,
    scope: Option<ScopeWire>,
    scope_entity_id_from_meta: Option<String>,
    pool: Option<String>,
    run_at: Option<f64>,
    priority: Option<f64>,
    tags: Option<Box<RawValue>>,
    trigger_source: Option<String>,
    trigger_ref: Option<String>,
    parent_close_policy: Option<String>,
    parent_run_id: Option<String>,
    concurrency_key: Option<String>,
    dedupe_key: Option<String>,
}

fn apply_start_opts(req: &mut StartRequest, text: &str) -> Result<()> {
    let o: StartOptsWire =
        serde_json::from_str(text).map_err(|e| invalid(format!("start options: {e}")))?;
    req.tenant = TenantArg::from_option(o.tenant_id);
    req.scope = o.scope.map(|s| (s.entity_type, s.entity_id));
    req.scope_entity_id_from_meta = o.scope_entity_id_from_meta;
    if matches!(&o.pool, Some(p) if p.is_empty()) {
        return Err(invalid("pool must be a non-empty string"));
    }
    if matches!(&o.pool, Some(p) if p.contains('\n')) {
        return Err(invalid("pool must not contain a line break"));
    }
    req.pool = o.pool;
    req.run_at = match o.run_at {
        None => None,
        Some(t) if t.is_finite() && t.fract() == 0.0 && t.abs() <= 8.64e15 => Some(t as i64),
        Some(_) => return Err(invalid("runAt must be a valid Date")),
    };
    req.priority = match o.priority {
        None => None,
        Some(p) if p.fract() == 0.0 && p >= i32::MIN as f64 && p <= i32::MAX as f64 => {
            Some(p as i32)
        }
        Some(p) => {
            return Err(invalid(format!(
                "priority must be an integer between -2147483648 and 2147483647, got {p}"
            )))
        }
    };
    if let Some(tags) = o.tags.filter(|t| t.get() != "null") {
        let parsed: std::result::Result<std::collections::HashMap<String, String>, _> =
            serde_json::from_str(tags.get());
        if parsed.is_err() {
            return Err(invalid("tags must be an object of string values"));
        }
        req.tags = Some(tags);
    }
    req.trigger_source = match o.trigger_source {
        None => None,
        Some(s) => Some(TriggerSource::parse(&s).ok_or_else(|| {
            invalid(format!(
                "triggerSource must be manual, schedule, event or parent, got '{s}'"
            ))
        })?),
    };
    req.trigger_ref = o.trigger_ref;
    req.parent_close_policy = match o.parent_close_policy {
        None => None,
        Some(s) => Some(ParentClosePolicy::parse(&s).ok_or_else(|| {
            invalid(format!(
                "parentClosePolicy must be terminate, cancel or abandon, got '{s}'"
            ))
        })?),
    };
    req.parent_run_id = o.parent_run_id;
    req.concurrency_key = o.concurrency_key;
    req.dedupe_key = o.dedupe_key;
    Ok(())
}

// ── run-service helpers ────────────────────────────────────────────────

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// `limit`: absent → 50, above 500 → 500; anything but a positive integer
/// is an error.
fn page_limit(limit: Option<f64>) -> Result<usize> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(l) if l.is_finite() && l.fract() == 0.0 && l >= 1.0 => Ok((l as usize).min(MAX_PAGE)),
        Some(l) => Err(invalid(format!(
            "limit must be a positive integer, got {l}"
        ))),
    }
}

fn rows_json(rows: &[jobforge_core::RunRow]) -> String {
    let mut out = String::from("[");
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&r.to_compact_json());
    }
    out.push(']');
    out
}

fn tree_json(rows: &[jobforge_core::RunRow]) -> String {
    use std::collections::HashMap;
    let mut children: HashMap<RunId, Vec<usize>> = HashMap::new();
    for (i, r) in rows.iter().enumerate().skip(1) {
        if let Some(p) = r.parent_run_id() {
            children.entry(p).or_default().push(i);
        }
    }
    // Iterative: a deep chain of children must not exhaust the stack.
    enum Step {
        Open(usize),
        Close,
        Comma,
    }
    let mut out = String::new();
    let mut stack = vec![Step::Open(0)];
    while let Some(step) = stack.pop() {
        match step {
            Step::Comma => out.push(','),
            Step::Close => out.push_str("]}"),
            Step::Open(i) => {
                out.push_str("{\"run\":");
                out.push_str(&rows[i].to_compact_json());
                out.push_str(",\"children\":[");
                stack.push(Step::Close);
                if let Some(kids) = children.get(&rows[i].id) {
                    for (n, k) in kids.iter().enumerate().rev() {
                        stack.push(Step::Open(*k));
                        if n > 0 {
                            stack.push(Step::Comma);
                        }
                    }
                }
            }
        }
    }
    out
}

fn encode_cursor(created_at: i64, id: u128) -> String {
    format!("c1{:016x}{:032x}", created_at as u64, id)
}

fn decode_cursor(c: &str) -> Result<(i64, u128)> {
    let bad = || invalid("cursor is malformed (pass nextCursor from a previous page unchanged)");
    let hex = c
        .strip_prefix("c1")
        .filter(|h| h.len() == 48 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(bad)?;
    let t = u64::from_str_radix(&hex[..16], 16).map_err(|_| bad())? as i64;
    let id = u128::from_str_radix(&hex[16..], 16).map_err(|_| bad())?;
    Ok((t, id))
}

fn status_of(s: &str) -> Result<jobforge_core::RunStatus> {
    jobforge_core::RunStatus::parse(s).ok_or_else(|| invalid(format!("unknown run status '{s}'")))
}

/// A query's `status`: one status, an array of them, or absent (every status).
fn statuses_of(v: &Value) -> Result<Option<Vec<jobforge_core::RunStatus>>> {
    match v.get("status") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(vec![status_of(s)?])),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| invalid("status must be a string or an array of strings"))
                    .and_then(status_of)
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => Err(invalid("status must be a string or an array of strings")),
    }
}

fn parse_scope_query(text: &str) -> Result<jobforge_core::engine::ScopeQuery> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid(format!("query: {e}")))?;
    let statuses = statuses_of(&v)?;
    let job_type = match v.get("jobType") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid("jobType must be a string")),
    };
    let offset = match v.get("offset").and_then(Value::as_f64) {
        None if v.get("offset").is_none_or(Value::is_null) => 0,
        Some(o) if o.fract() == 0.0 && o >= 0.0 => o as usize,
        _ => return Err(invalid("offset must be a non-negative integer")),
    };
    let limit = match v.get("limit") {
        None | Some(Value::Null) => page_limit(None)?,
        Some(l) => page_limit(Some(
            l.as_f64()
                .ok_or_else(|| invalid("limit must be a positive integer"))?,
        ))?,
    };
    let ascending = match v.get("orderBy").and_then(Value::as_str) {
        None if v.get("orderBy").is_none_or(Value::is_null) => false,
        Some("createdAt:desc") => false,
        Some("createdAt:asc") => true,
        _ => {
            return Err(invalid(
                "orderBy must be 'createdAt:desc' or 'createdAt:asc'",
            ))
        }
    };
    Ok(jobforge_core::engine::ScopeQuery {
        statuses,
        job_type,
        limit,
        offset,
        ascending,
    })
}

fn parse_job_run_query(text: &str) -> Result<jobforge_core::engine::JobRunQuery> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid(format!("query: {e}")))?;
    let s = |k: &str| -> Result<Option<String>> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(x)) => Ok(Some(x.clone())),
            Some(_) => Err(invalid(format!("{k} must be a string"))),
        }
    };
    let since = match v.get("since") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_f64()
                .filter(|f| f.is_finite() && f.fract() == 0.0)
                .ok_or_else(|| invalid("since must be a valid Date"))? as i64,
        ),
    };
    let limit = match v.get("limit") {
        None | Some(Value::Null) => page_limit(None)?,
        Some(l) => page_limit(Some(
            l.as_f64()
                .ok_or_else(|| invalid("limit must be a positive integer"))?,
        ))?,
    };
    Ok(jobforge_core::engine::JobRunQuery {
        pool: s("poolId")?,
        root_run_id: s("rootRunId")?,
        statuses: statuses_of(&v)?,
        since,
        cursor: s("cursor")?.map(|c| decode_cursor(&c)).transpose()?,
        limit,
    })
}

fn parse_record_step(text: &str) -> Result<jobforge_core::engine::RecordStep> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Wire {
        job_run_id: String,
        step_id: String,
        seq: Option<u32>,
        status: String,
        input: Option<Box<RawValue>>,
        output: Option<Box<RawValue>>,
        error: Option<jobforge_core::RunError>,
        attempts: Option<u32>,
        started_at: Option<i64>,
        finished_at: Option<i64>,
    }
    let w: Wire = serde_json::from_str(text).map_err(|e| invalid(format!("recordStep: {e}")))?;
    let status = jobforge_core::StepStatus::parse(&w.status)
        .ok_or_else(|| invalid(format!("unknown step status '{}'", w.status)))?;
    let not_null = |r: Option<Box<RawValue>>| r.filter(|x| x.get() != "null");
    Ok(jobforge_core::engine::RecordStep {
        job_run_id: w.job_run_id,
        step_id: w.step_id,
        seq: w.seq.unwrap_or(0),
        status,
        input: not_null(w.input),
        output: not_null(w.output),
        error: w.error,
        attempts: w.attempts,
        started_at: w.started_at,
        finished_at: w.finished_at,
    })
}

impl ObjectFinalize for NativeEngine {
    /// Takes back what `report_size` told V8: the runs go with the engine.
    fn finalize(self, env: Env) -> Result<()> {
        let told = self.reported.load(std::sync::atomic::Ordering::Relaxed);
        if told != 0 {
            env.adjust_external_memory(-told)?;
        }
        Ok(())
    }
}

/// Drains queued notices (see `NativeEngine::take_notices`).
fn take_notices(pending: &PendingAborts) -> Option<String> {
    let taken = std::mem::take(&mut *pending.lock().ok()?);
    if taken.aborts.is_empty() && taken.events.is_empty() {
        return None;
    }
    let aborts: Vec<Value> = taken
        .aborts
        .iter()
        .map(|(id, epoch, r)| match epoch {
            Some(e) => json!({ "runId": id.to_string(), "epoch": e, "reason": r.as_str() }),
            None => json!({ "runId": id.to_string(), "reason": r.as_str() }),
        })
        .collect();
    Some(format!(
        "{{\"aborts\":{},\"events\":[{}]}}",
        Value::Array(aborts),
        taken.events.join(",")
    ))
}

/// Worker pools from `[{"name","concurrency"}]`.
fn parse_pools(text: &str) -> Result<Vec<WorkerPool>> {
    #[derive(serde::Deserialize)]
    struct PoolWire {
        name: String,
        concurrency: usize,
    }
    let pools: Vec<PoolWire> =
        serde_json::from_str(text).map_err(|e| invalid(format!("worker pools: {e}")))?;
    // Tickets cross to JS one per line.
    if let Some(p) = pools.iter().find(|p| p.name.contains('\n')) {
        return Err(invalid(format!(
            "pool name {:?} must not contain a line break",
            p.name
        )));
    }
    Ok(pools
        .iter()
        .map(|p| WorkerPool::new(&p.name, p.concurrency))
        .collect())
}
