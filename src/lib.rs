//! napi-rs binding of jobforge: one native class over the core engine, JSON
//! text across the boundary (one string per row, no per-field napi calls),
//! and the threadsafe-function bridge that runs JS handlers. No
//! orchestration rule lives here.

use jobforge_core::engine::{
    json_value, AttemptTicket, EngineObserver, HandlerExecutor, StepBegin,
};
use jobforge_core::{
    AbortReason, AttemptOutcome, ClockKind, DefinitionSpec, Engine, EngineOptions, FailureInfo,
    JobError, MemoryStore, ParentClosePolicy, RetryPolicy, RunId, StartRequest, TenantArg,
    TriggerSource,
};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{
    ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue,
};
use napi_derive::napi;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use std::sync::Arc;

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

struct JsObserver {
    on_abort: AbortFn,
}

impl EngineObserver for JsObserver {
    fn run_aborted(&self, run_id: RunId, reason: AbortReason) {
        let msg = json!({ "runId": run_id.to_string(), "reason": reason.as_str() }).to_string();
        // NonBlocking on an unbounded queue: only `Closing` (environment
        // shutting down) can fail, and then there is no signal to fire.
        let _ = self
            .on_abort
            .call(msg, ThreadsafeFunctionCallMode::NonBlocking);
    }
}

struct JsExecutor {
    dispatch: Arc<DispatchFn>,
}

fn ticket_json(t: &AttemptTicket) -> String {
    format!(
        "{{\"run\":{},\"epoch\":{},\"timeoutMs\":{}}}",
        t.run.to_json(),
        t.epoch,
        t.timeout_ms.map_or("null".to_owned(), |ms| ms.to_string())
    )
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
}

/// The engine over the in-memory store. Rows cross as JSON text.
#[napi]
pub struct NativeEngine {
    engine: Arc<Engine<MemoryStore>>,
    executor: Arc<JsExecutor>,
}

#[napi]
impl NativeEngine {
    #[napi(
        constructor,
        ts_args_type = "options: NativeOptions, dispatch: (payload: string) => Promise<string>, onAbort: (message: string) => void"
    )]
    pub fn new(options: NativeOptions, dispatch: DispatchFn, on_abort: AbortFn) -> Result<Self> {
        let clock = match options.clock.as_deref() {
            None | Some("system") => ClockKind::System,
            Some("manual") => ClockKind::Manual,
            Some(other) => {
                return Err(invalid(format!(
                    "clock must be 'system' or 'manual', got '{other}'"
                )))
            }
        };
        let engine = Arc::new(Engine::new(
            MemoryStore::new(),
            EngineOptions {
                multi_tenant: options.multi_tenant.unwrap_or(false),
                clock,
            },
        ));
        engine.set_observer(Arc::new(JsObserver { on_abort }));
        Ok(NativeEngine {
            engine,
            executor: Arc::new(JsExecutor {
                dispatch: Arc::new(dispatch),
            }),
        })
    }

    /// Registers definitions from a JSON array of specs, all or none;
    /// returns the definition rows as a JSON array.
    #[napi]
    pub fn register(&self, specs_json: String) -> Result<String> {
        let specs: Vec<DefinitionSpec> =
            serde_json::from_str(&specs_json).map_err(|e| invalid(format!("handler meta: {e}")))?;
        let defs = self.engine.register_all(specs).map_err(to_napi)?;
        let rows: Vec<&jobforge_core::JobDefinition> = defs.iter().map(|d| d.as_ref()).collect();
        serde_json::to_string(&rows).map_err(|e| invalid(e.to_string()))
    }

    #[napi]
    pub fn definition(&self, job_type: String) -> Option<String> {
        self.engine
            .definition(&job_type)
            .and_then(|d| serde_json::to_string(d.as_ref()).ok())
    }

    /// `start`: `input_json` is the validated input; `opts_json` the start
    /// options (with any function-evaluated keys). Returns the row JSON.
    #[napi]
    pub fn start(
        &self,
        job_type: String,
        input_json: String,
        opts_json: Option<String>,
    ) -> Result<String> {
        let mut req = StartRequest {
            job_type,
            input: json_value(input_json).map_err(to_napi)?,
            ..StartRequest::default()
        };
        if let Some(o) = opts_json {
            apply_start_opts(&mut req, &o)?;
        }
        self.engine.start(req).map(|r| r.to_json()).map_err(to_napi)
    }

    /// Checks the tenant gate and job type only (see `Engine::start_preflight`).
    #[napi]
    pub fn start_preflight(
        &self,
        job_type: String,
        tenant_given: bool,
        tenant_id: Option<String>,
        has_parent: bool,
    ) -> Result<()> {
        self.engine
            .start_preflight(&job_type, &tenant_arg(tenant_given, tenant_id), has_parent)
            .map_err(to_napi)
    }

    #[napi]
    pub fn cancel(
        &self,
        run_id: String,
        cascade: bool,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<()> {
        self.engine
            .cancel(&run_id, cascade, &tenant_arg(tenant_given, tenant_id))
            .map_err(to_napi)
    }

    #[napi]
    pub fn claim_next(&self, pool: String) -> Result<Option<String>> {
        self.engine
            .claim_next(&pool)
            .map(|r| r.map(|r| r.to_json()))
            .map_err(to_napi)
    }

    /// Starts the attempt of a claimed run: `{"run","epoch","timeoutMs"}`.
    /// With `finish_attempt` this is the synchronous path `tick` uses from
    /// JS: the handler runs on the JS thread with no thread hop.
    #[napi]
    pub fn begin_attempt(&self, run_id: String) -> Result<String> {
        let t = self.engine.begin_attempt(&run_id).map_err(to_napi)?;
        Ok(ticket_json(&t))
    }

    /// Applies an attempt's outcome JSON (`completed` / `failed` /
    /// `timed_out` / `no_handler`). Returns whether it was applied (false
    /// when the run was canceled or replayed meanwhile).
    #[napi]
    pub fn finish_attempt(&self, run_id: String, epoch: u32, outcome_json: String) -> Result<bool> {
        let Ok(id) = run_id.parse::<RunId>() else {
            return Err(to_napi(JobError::JobRunNotFound { run_id }));
        };
        self.engine
            .finish_attempt(&id, epoch, parse_outcome(&outcome_json))
            .map(|r| r.is_some())
            .map_err(to_napi)
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
    #[napi]
    pub fn step_begin(&self, run_id: String, epoch: u32, step_id: String) -> Result<String> {
        match self
            .engine
            .step_begin(&run_id, epoch, &step_id)
            .map_err(to_napi)?
        {
            StepBegin::Memoized(out) => Ok(format!(
                "{{\"memoized\":true,\"output\":{}}}",
                out.as_deref().map_or("null", RawValue::get)
            )),
            StepBegin::Started { attempt } => {
                Ok(format!("{{\"memoized\":false,\"attempt\":{attempt}}}"))
            }
        }
    }

    #[napi]
    pub fn step_complete(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        output_json: Option<String>,
    ) -> Result<()> {
        let output = output_json.map(json_value).transpose().map_err(to_napi)?;
        self.engine
            .step_complete(&run_id, epoch, &step_id, output)
            .map_err(to_napi)
    }

    /// Records a step failure; returns the backoff before a retry, if any.
    #[napi]
    pub fn step_fail(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        failure_json: String,
        policy_json: Option<String>,
    ) -> Result<Option<f64>> {
        let info = parse_failure(&failure_json);
        let policy: Option<RetryPolicy> = policy_json
            .map(|p| {
                serde_json::from_str(&p).map_err(|e| invalid(format!("step retry policy: {e}")))
            })
            .transpose()?;
        self.engine
            .step_fail(&run_id, epoch, &step_id, info, policy.as_ref())
            .map(|d| d.map(|ms| ms as f64))
            .map_err(to_napi)
    }

    #[napi]
    pub fn replay(&self, run_id: String) -> Result<String> {
        self.engine
            .replay(&run_id)
            .map(|r| r.to_json())
            .map_err(to_napi)
    }

    #[napi]
    pub fn find_by_id(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<Option<String>> {
        self.engine
            .find_by_id(&run_id, &tenant_arg(tenant_given, tenant_id))
            .map(|r| r.map(|r| r.to_json()))
            .map_err(to_napi)
    }

    /// Steps of a run as a JSON array, in seq order.
    #[napi]
    pub fn list_steps(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        let steps = self
            .engine
            .list_steps(&run_id, &tenant_arg(tenant_given, tenant_id))
            .map_err(to_napi)?;
        serde_json::to_string(&steps).map_err(|e| invalid(e.to_string()))
    }

    /// Engine time in epoch ms.
    #[napi]
    pub fn now(&self) -> f64 {
        self.engine.now() as f64
    }

    /// Moves a manual clock; returns the new time, or null on the system clock.
    #[napi]
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

    #[napi]
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
