//! The operations JS calls, one list for every store: each takes the
//! engine and its request (one JSON object, see `wire.rs`) and answers
//! JSON text. The in-memory engine runs them on the JS thread
//! (`callSync`), a networked one on a blocking thread (`call`); the list
//! and the functions are the same. Adding an operation: a function here,
//! its name in `operations!`, and its call in `ts/backend/backend.ts`.

use crate::wire::{self, invalid, reply, request, to_napi, Result};
use jobforge_core::engine::{json_value, StepBegin, WaitBegin, WaitRequest};
use jobforge_core::{
    Coordination, DefinitionSpec, Engine, JobDefinition, JobError, RetryPolicy, RunId,
    ScheduleSpec, StartRequest, Store, StoreAdmin, TenantArg,
};

/// A store the binding can host: its runs, its administration and how it
/// is shared (a new store implements these three traits in the core).
pub trait AnyStore: Store + StoreAdmin + Coordination {}
impl<S: Store + StoreAdmin + Coordination> AnyStore for S {}
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

macro_rules! operations {
    ($($name:ident),* $(,)?) => {
        /// Operation names in code order (`opNames()` hands them to JS, so
        /// the codes cannot drift apart).
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// Runs operation number `op` with its request, again while it
        /// fails on a lost connection having changed nothing
        /// (`Engine::again`): an operation is a function of its request.
        pub fn run<S: AnyStore>(e: &Engine<S>, op: u32, req: &str) -> Result<String> {
            wire::take_lost();
            e.again(|| run_once(e, op, req), |_| wire::take_lost())
        }

        fn run_once<S: AnyStore>(e: &Engine<S>, op: u32, req: &str) -> Result<String> {
            let mut code = 0u32;
            $(
                if op == code {
                    return $name(e, req);
                }
                code += 1;
            )*
            let _ = code;
            Err(invalid(format!("unknown operation {op}")))
        }
    };
}

operations!(
    migrate,
    stored_job_types,
    register,
    definition,
    start,
    start_preflight,
    start_many,
    cancel,
    replay,
    claim_next,
    begin_attempt,
    finish_attempt,
    attempt_live,
    release_attempt,
    expire_attempts,
    step_begin,
    step_complete,
    step_fail,
    find_by_id,
    get_run,
    count_runs,
    list_steps,
    find_step,
    record_step,
    list_for_scope,
    cancel_for_scope,
    reschedule_for_scope,
    count_by_pool_and_status,
    list_recent_failed,
    list_job_runs,
    get_run_tree,
    list_run_events,
    metrics,
    throughput,
    put_schedule,
    remove_schedule,
    list_schedules,
    fire_due_schedules,
    wait_begin,
    wait_delivered,
    signal,
    resume,
);

const NULL: &str = "null";

fn run_id(text: &str) -> Result<RunId> {
    text.parse::<RunId>().map_err(|_| {
        to_napi(JobError::JobRunNotFound {
            run_id: text.to_owned(),
        })
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RunReq {
    run_id: String,
    #[serde(default, deserialize_with = "wire::tenant")]
    tenant: TenantArg,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AttemptReq {
    run_id: String,
    epoch: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TenantReq {
    #[serde(default, deserialize_with = "wire::tenant")]
    tenant: TenantArg,
}

// ── store ──────────────────────────────────────────────────────────────

fn migrate<S: AnyStore>(e: &Engine<S>, _req: &str) -> Result<String> {
    e.store().migrate().map_err(to_napi)?;
    Ok(NULL.to_owned())
}

fn stored_job_types<S: AnyStore>(e: &Engine<S>, _req: &str) -> Result<String> {
    Ok(reply(&e.store().stored_job_types().map_err(to_napi)?))
}

// ── definitions ────────────────────────────────────────────────────────

/// Definition specs, element by element, so a bad meta names its job type.
pub fn definition_specs(text: &str) -> Result<Vec<DefinitionSpec>> {
    let raw: Vec<Value> = request(text, "handler meta")?;
    raw.into_iter()
        .map(|v| {
            let job_type = v
                .get("type")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_owned();
            serde_json::from_value::<DefinitionSpec>(v)
                .map_err(|e| invalid(format!("handler meta of '{job_type}': {e}")))
        })
        .collect()
}

/// `[spec…]` → the definitions and their templates
/// (`wire::registered_text`), all or none.
fn register<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let defs = e.register_all(definition_specs(req)?).map_err(to_napi)?;
    let rows: Vec<&JobDefinition> = defs.iter().map(|d| d.as_ref()).collect();
    Ok(wire::registered_text(e, &rows))
}

fn definition<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        r#type: String,
    }
    let r: Req = request(req, "definition")?;
    Ok(e.definition(&r.r#type)
        .map_or_else(|| NULL.to_owned(), |d| reply(d.as_ref())))
}

// ── start ──────────────────────────────────────────────────────────────

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartReq<'a> {
    r#type: String,
    #[serde(borrow)]
    input: &'a RawValue,
    opts: Option<wire::StartOpts>,
    /// The caller holds the type's template: answer a new run the short
    /// way (`wire::started_text`).
    #[serde(default)]
    short: bool,
}

/// `{type, input, opts?, short?}` → the new run (or the dedupe hit) as a
/// tuple, or a new run's short answer.
fn start<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: StartReq = request(req, "start")?;
    let mut sr = StartRequest {
        job_type: r.r#type,
        input: r.input.to_owned(),
        ..StartRequest::default()
    };
    if let Some(o) = r.opts {
        o.apply(&mut sr).map_err(to_napi)?;
    }
    if r.short {
        return e
            .start_with(sr, false, true)
            .map(|s| wire::started_text(&s))
            .map_err(to_napi);
    }
    e.start(sr).map(|r| wire::row_text(&r)).map_err(to_napi)
}

/// `{entries: [{type, input, opts?}…], grouped?}` → the runs, in entry
/// order, all or none (`Engine::start_many`): a refused entry is its error
/// with its `index` (`wire::entry_error_text`). `grouped`: starts that
/// arrived together, each on its own (`Engine::start_group`): an answer
/// per entry, its row or its error (`wire::group_text`).
fn start_many<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req<'a> {
        #[serde(borrow)]
        entries: Vec<&'a RawValue>,
        #[serde(default)]
        grouped: bool,
    }
    let r: Req = request(req, "startMany")?;
    let entry_err = |error: JobError, index: usize| {
        napi::Error::new(
            napi::Status::GenericFailure,
            wire::entry_error_text(&error, index),
        )
    };
    let read = |entry: &RawValue| -> std::result::Result<StartRequest, JobError> {
        let entry: StartReq =
            serde_json::from_str(entry.get()).map_err(|err| JobError::JobInputInvalid {
                reason: format!("{err}"),
            })?;
        let mut sr = StartRequest {
            job_type: entry.r#type,
            input: entry.input.to_owned(),
            ..StartRequest::default()
        };
        if let Some(o) = entry.opts {
            o.apply(&mut sr)?;
        }
        Ok(sr)
    };
    if r.grouped {
        // An entry that cannot be read is that start's error alone.
        type Answer = std::result::Result<jobforge_core::RunRow, JobError>;
        let mut answers: Vec<Option<Answer>> = Vec::with_capacity(r.entries.len());
        let mut reqs = Vec::with_capacity(r.entries.len());
        let mut slots = Vec::with_capacity(r.entries.len());
        for entry in &r.entries {
            match read(entry) {
                Ok(sr) => {
                    slots.push(answers.len());
                    answers.push(None);
                    reqs.push(sr);
                }
                Err(err) => answers.push(Some(Err(err))),
            }
        }
        let started = e.start_group(reqs).map_err(to_napi)?;
        for (slot, answer) in slots.into_iter().zip(started) {
            answers[slot] = Some(answer);
        }
        let answers: Vec<Answer> = answers
            .into_iter()
            .map(|a| {
                a.unwrap_or_else(|| {
                    Err(JobError::JobInputInvalid {
                        reason: "the group answered no start".to_owned(),
                    })
                })
            })
            .collect();
        return Ok(wire::group_text(&answers));
    }
    let mut reqs = Vec::with_capacity(r.entries.len());
    for (i, entry) in r.entries.iter().enumerate() {
        reqs.push(read(entry).map_err(|err| entry_err(err, i))?);
    }
    match e.start_many(reqs) {
        Ok(rows) => Ok(wire::rows_text(&rows)),
        Err(b) => Err(match b.index {
            Some(i) => entry_err(b.error, i),
            None => to_napi(b.error),
        }),
    }
}

/// The checks of `start` before its keys (see `Engine::start_preflight`).
fn start_preflight<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req {
        r#type: String,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
        has_parent: bool,
    }
    let r: Req = request(req, "startPreflight")?;
    e.start_preflight(&r.r#type, &r.tenant, r.has_parent)
        .map_err(to_napi)?;
    Ok(NULL.to_owned())
}

// ── cancel and replay ──────────────────────────────────────────────────

fn cancel<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req {
        run_id: String,
        cascade: bool,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
        /// The caller's `reason`, noted in the timeline.
        #[serde(default)]
        note: Option<String>,
    }
    let r: Req = request(req, "cancel")?;
    e.cancel_with_note(&r.run_id, r.cascade, &r.tenant, r.note.as_deref())
        .map_err(to_napi)?;
    Ok(NULL.to_owned())
}

fn replay<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "replay")?;
    e.replay(&r.run_id, &r.tenant)
        .map(|r| wire::row_text(&r))
        .map_err(to_napi)
}

// ── claims and attempts ────────────────────────────────────────────────

fn claim_next<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        pool: String,
    }
    let r: Req = request(req, "claimNext")?;
    e.claim_next(&r.pool)
        .map(wire::opt_row_text)
        .map_err(to_napi)
}

/// Opens the attempt of a claimed run: its ticket, with the row.
fn begin_attempt<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "beginAttempt")?;
    let t = e.begin_attempt(&r.run_id).map_err(to_napi)?;
    Ok(wire::ticket_text(&t, true))
}

/// Applies an attempt's outcome; whether it was applied (false when the
/// run was canceled or replayed meanwhile).
fn finish_attempt<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req<'a> {
        run_id: String,
        epoch: u32,
        #[serde(borrow)]
        outcome: &'a RawValue,
    }
    let r: Req = request(req, "finishAttempt")?;
    let id = run_id(&r.run_id)?;
    let applied = e
        .finish_attempt(&id, r.epoch, wire::parse_outcome(r.outcome.get()))
        .map_err(to_napi)?;
    Ok(applied.is_some().to_string())
}

/// Whether an attempt is still the run's current one.
fn attempt_live<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: AttemptReq = request(req, "attemptLive")?;
    let live = r
        .run_id
        .parse::<RunId>()
        .is_ok_and(|id| e.attempt_current(&id, r.epoch));
    Ok(live.to_string())
}

/// Puts an interrupted attempt's run back to pending (a shutdown).
fn release_attempt<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: AttemptReq = request(req, "releaseAttempt")?;
    let Ok(id) = r.run_id.parse::<RunId>() else {
        return Ok("false".to_owned());
    };
    Ok(e.release_attempt(&id, r.epoch)
        .map_err(to_napi)?
        .to_string())
}

/// Applies the attempt timeouts that are due (the engine's timer asked
/// for it, see `engine/timeouts.rs`); how many runs it changed.
fn expire_attempts<S: AnyStore>(e: &Engine<S>, _req: &str) -> Result<String> {
    Ok(e.expire_attempts().map_err(to_napi)?.to_string())
}

// ── steps ──────────────────────────────────────────────────────────────

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StepReq<'a> {
    run_id: String,
    epoch: u32,
    step_id: String,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(default)]
    failure: Option<wire::FailureWire>,
    #[serde(default)]
    policy: Option<RetryPolicy>,
}

/// `{"memoized":true,"output":…}` or `{"memoized":false,"attempt":n}`.
fn step_begin<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: StepReq = request(req, "stepBegin")?;
    match e
        .step_begin(&r.run_id, r.epoch, &r.step_id)
        .map_err(to_napi)?
    {
        StepBegin::Memoized(out) => Ok(format!(
            "{{\"memoized\":true,\"output\":{}}}",
            out.as_deref().map_or(NULL, RawValue::get)
        )),
        StepBegin::Started { attempt } => {
            Ok(format!("{{\"memoized\":false,\"attempt\":{attempt}}}"))
        }
    }
}

fn step_complete<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: StepReq = request(req, "stepComplete")?;
    let output = r.output.map(|o| o.to_owned());
    e.step_complete(&r.run_id, r.epoch, &r.step_id, output)
        .map_err(to_napi)?;
    Ok(NULL.to_owned())
}

/// Records a step failure; the backoff before a retry (ms), or null.
fn step_fail<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: StepReq = request(req, "stepFail")?;
    let info = r.failure.unwrap_or_default().into();
    let delay = e
        .step_fail(&r.run_id, r.epoch, &r.step_id, info, r.policy.as_ref())
        .map_err(to_napi)?;
    Ok(delay.map_or_else(|| NULL.to_owned(), |ms| ms.to_string()))
}

// ── durable waits ──────────────────────────────────────────────────────

/// What a wait asks for, as JS sends it: `kind` and its fields (a flat
/// object: a tagged enum could not borrow the child's raw input).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitWire<'a> {
    kind: String,
    until: Option<i64>,
    signal: Option<String>,
    timeout_ms: Option<i64>,
    r#type: Option<String>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
    opts: Option<wire::StartOpts>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WaitReq<'a> {
    run_id: String,
    epoch: u32,
    step_id: String,
    #[serde(borrow)]
    wait: Option<WaitWire<'a>>,
}

/// `{"state":"done","value":…}`, `{"state":"failed","error":{…}}`,
/// `{"state":"open"}` or `{"state":"token","token":"…"}`.
fn wait_text(w: WaitBegin) -> String {
    match w {
        WaitBegin::Done(v) => format!(
            "{{\"state\":\"done\",\"value\":{}}}",
            v.as_deref().map_or(NULL, RawValue::get)
        ),
        WaitBegin::Failed(e) => format!("{{\"state\":\"failed\",\"error\":{}}}", e.get()),
        WaitBegin::Open => r#"{"state":"open"}"#.to_owned(),
        WaitBegin::Token(t) => format!("{{\"state\":\"token\",\"token\":\"{t}\"}}"),
    }
}

fn wait_begin<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: WaitReq = request(req, "waitBegin")?;
    let Some(w) = r.wait else {
        return Err(invalid("waitBegin needs a wait"));
    };
    let timeout_ms = w.timeout_ms;
    let wait = match w.kind.as_str() {
        "sleep" => WaitRequest::Sleep {
            until: w.until.ok_or_else(|| invalid("a sleep needs until"))?,
        },
        "signal" => WaitRequest::Signal {
            signal: w
                .signal
                .ok_or_else(|| invalid("a signal wait needs signal"))?,
            timeout_ms,
        },
        "token" => WaitRequest::Token { timeout_ms },
        "child" => {
            let mut sr = StartRequest {
                job_type: w.r#type.ok_or_else(|| invalid("an invoke needs type"))?,
                input: w
                    .input
                    .map_or_else(jobforge_core::model::empty_object, |i| i.to_owned()),
                ..StartRequest::default()
            };
            if let Some(o) = w.opts {
                o.apply(&mut sr).map_err(to_napi)?;
            }
            WaitRequest::Child {
                start: Box::new(sr),
                timeout_ms,
            }
        }
        other => return Err(invalid(format!("unknown wait kind '{other}'"))),
    };
    e.wait_begin(&r.run_id, r.epoch, &r.step_id, wait)
        .map(wait_text)
        .map_err(to_napi)
}

fn wait_delivered<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: WaitReq = request(req, "waitDelivered")?;
    e.wait_delivered(&r.run_id, r.epoch, &r.step_id)
        .map(wait_text)
        .map_err(to_napi)
}

/// `true`: a wait took it; `false`: kept in the run's inbox.
fn signal<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req<'a> {
        run_id: String,
        signal: String,
        #[serde(borrow, default)]
        payload: Option<&'a RawValue>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "signal")?;
    e.signal(
        &r.run_id,
        &r.signal,
        r.payload.map(|p| p.to_owned()),
        &r.tenant,
    )
    .map(|d| d.to_string())
    .map_err(to_napi)
}

/// The resumed run's id, as a JSON string.
fn resume<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req<'a> {
        token: String,
        #[serde(borrow, default)]
        payload: Option<&'a RawValue>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
        #[serde(default)]
        run_id: Option<String>,
    }
    let r: Req = request(req, "resume")?;
    e.resume_run(
        &r.token,
        r.payload.map(|p| p.to_owned()),
        &r.tenant,
        r.run_id.as_deref(),
    )
    .map(|id| format!("\"{id}\""))
    .map_err(to_napi)
}

// ── queries ────────────────────────────────────────────────────────────

fn find_by_id<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "findById")?;
    e.find_by_id(&r.run_id, &r.tenant)
        .map(wire::opt_row_text)
        .map_err(to_napi)
}

fn get_run<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "getRun")?;
    e.get_run(&r.run_id, &r.tenant)
        .map(wire::opt_row_text)
        .map_err(to_napi)
}

fn count_runs<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: TenantReq = request(req, "countRuns")?;
    Ok(e.count_runs(&r.tenant).map_err(to_napi)?.to_string())
}

fn list_steps<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "listSteps")?;
    Ok(reply(&e.list_steps(&r.run_id, &r.tenant).map_err(to_napi)?))
}

fn find_step<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req {
        run_id: String,
        step_id: String,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "findStep")?;
    let step = e
        .find_step(&r.tenant, &r.run_id, &r.step_id)
        .map_err(to_napi)?;
    Ok(step.map_or_else(|| NULL.to_owned(), |s| reply(&s)))
}

fn record_step<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        record: Box<RawValue>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "recordStep")?;
    let rec = wire::record_step(&r.record)?;
    Ok(reply(&e.record_step(&r.tenant, rec).map_err(to_napi)?))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScopeReq {
    entity_type: String,
    entity_id: String,
    #[serde(default, deserialize_with = "wire::tenant")]
    tenant: TenantArg,
    #[serde(default)]
    query: Option<Value>,
    #[serde(default)]
    cascade: Option<bool>,
    #[serde(default)]
    run_at: Option<f64>,
    /// `cancelForScope`'s `reason`, noted in the timeline.
    #[serde(default)]
    note: Option<String>,
}

fn list_for_scope<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: ScopeReq = request(req, "listForScope")?;
    let q = wire::scope_query(r.query.as_ref().unwrap_or(&Value::Null))?;
    let rows = e
        .list_for_scope(&r.tenant, &r.entity_type, &r.entity_id, &q)
        .map_err(to_napi)?;
    Ok(wire::rows_text(&rows))
}

fn cancel_for_scope<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: ScopeReq = request(req, "cancelForScope")?;
    let n = e
        .cancel_for_scope_with_note(
            &r.tenant,
            &r.entity_type,
            &r.entity_id,
            r.cascade.unwrap_or(true),
            r.note.as_deref(),
        )
        .map_err(to_napi)?;
    Ok(n.to_string())
}

fn reschedule_for_scope<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: ScopeReq = request(req, "rescheduleForScope")?;
    let run_at = wire::date_ms(r.run_at.unwrap_or(f64::NAN), "newRunAt")?;
    let n = e
        .reschedule_for_scope(&r.tenant, &r.entity_type, &r.entity_id, run_at)
        .map_err(to_napi)?;
    Ok(n.to_string())
}

fn count_by_pool_and_status<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: TenantReq = request(req, "countByPoolAndStatus")?;
    let counts = e.count_by_pool_and_status(&r.tenant).map_err(to_napi)?;
    Ok(wire::counts_text(&counts))
}

fn list_recent_failed<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        limit: Option<f64>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "listRecentFailed")?;
    let rows = e
        .list_recent_failed(&r.tenant, wire::page_limit(r.limit)?)
        .map_err(to_napi)?;
    Ok(wire::failures_text(&rows))
}

fn list_job_runs<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        query: Value,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "listJobRuns")?;
    let q = wire::job_run_query(&r.query)?;
    let (rows, next) = e.list_job_runs(&r.tenant, &q).map_err(to_napi)?;
    Ok(wire::page_text(&rows, next))
}

fn get_run_tree<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: RunReq = request(req, "getRunTree")?;
    let rows = e.run_tree(&r.tenant, &r.run_id).map_err(to_napi)?;
    Ok(rows.map_or_else(|| NULL.to_owned(), |rows| wire::tree_text(&rows)))
}

fn list_run_events<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Req {
        run_id: String,
        cursor: Option<String>,
        limit: Option<f64>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "listRunEvents")?;
    let after = r
        .cursor
        .as_deref()
        .map(wire::decode_event_cursor)
        .transpose()?;
    let limit = wire::page_limit(r.limit)?;
    let (events, next) = e
        .list_run_events(&r.run_id, &r.tenant, after, limit)
        .map_err(to_napi)?;
    Ok(wire::events_page_text(&events, next))
}

/// `{"since": first minute ms, "rows": [[minute ms, status, count], ...]}`:
/// runs that ended per minute of the window starting at `since`.
fn throughput<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Req {
        minutes: Option<f64>,
        #[serde(default, deserialize_with = "wire::tenant")]
        tenant: TenantArg,
    }
    let r: Req = request(req, "throughput")?;
    let minutes = match r.minutes {
        None => 60,
        Some(m) if m.is_finite() && m.fract() == 0.0 && (1.0..=60.0).contains(&m) => m as u32,
        Some(m) => {
            return Err(invalid(format!(
                "minutes must be a whole number from 1 to 60, got {m}"
            )))
        }
    };
    #[derive(Serialize)]
    struct Reply<'a> {
        since: i64,
        rows: Vec<(i64, &'a str, u64)>,
    }
    let (since, rows) = e.ended_per_minute(&r.tenant, minutes).map_err(to_napi)?;
    let rows = rows.iter().map(|(m, s, n)| (*m, s.as_str(), *n)).collect();
    Ok(reply(&Reply { since, rows }))
}

/// The Prometheus text itself (not JSON).
fn metrics<S: AnyStore>(e: &Engine<S>, _req: &str) -> Result<String> {
    e.metrics_text().map_err(to_napi)
}

// ── schedules ──────────────────────────────────────────────────────────

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScheduleReq<'a> {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "wire::tenant")]
    tenant: TenantArg,
    #[serde(default)]
    job_type: String,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    cron: Option<String>,
    timezone: Option<String>,
    every_ms: Option<f64>,
}

/// The schedule as stored (times in epoch ms).
fn put_schedule<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: ScheduleReq = request(req, "schedule")?;
    let every_ms = match r.every_ms {
        None => None,
        Some(ms) if ms.is_finite() && ms.fract() == 0.0 && ms.abs() < 9.0e15 => Some(ms as i64),
        Some(ms) => return Err(invalid(format!("everyMs must be an integer, not {ms}"))),
    };
    let input = match r.input {
        Some(i) => i.to_owned(),
        None => json_value("{}".to_owned()).map_err(to_napi)?,
    };
    let spec = ScheduleSpec {
        name: r.name,
        tenant: r.tenant,
        job_type: r.job_type,
        input,
        cron: r.cron,
        timezone: r.timezone,
        every_ms,
    };
    Ok(wire::schedule_text(&e.put_schedule(spec).map_err(to_napi)?))
}

fn remove_schedule<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: ScheduleReq = request(req, "unschedule")?;
    Ok(e.remove_schedule(&r.name, &r.tenant)
        .map_err(to_napi)?
        .to_string())
}

fn list_schedules<S: AnyStore>(e: &Engine<S>, req: &str) -> Result<String> {
    let r: TenantReq = request(req, "listSchedules")?;
    let rows = e.list_schedules(&r.tenant).map_err(to_napi)?;
    let items: Vec<String> = rows.iter().map(wire::schedule_text).collect();
    Ok(format!("[{}]", items.join(",")))
}

/// Runs started for due schedules.
fn fire_due_schedules<S: AnyStore>(e: &Engine<S>, _req: &str) -> Result<String> {
    Ok(e.fire_due_schedules().map_err(to_napi)?.to_string())
}
