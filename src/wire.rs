//! Every format that crosses the napi boundary, Rust side. Its TS twin is
//! `ts/wire.ts`; `__test__/wire.spec.ts` round-trips each one through the
//! addon. A run row is the core's compact tuple (`RunRow::to_compact_json`,
//! field order `RUN_FIELDS`, which JS reads back from `runFields()`).
//!
//! - operation requests: one JSON object per call (`ops.rs` names the
//!   struct of each); a tenant is one field, `tenant`, absent / null / text;
//! - errors: `JOBFORGE_ERROR:` + `{"code","message","fields"}`;
//! - tickets, worker report lines and start-batch lines: hand-written text,
//!   on every run's path (see each function);
//! - replies: run tuples, step / definition / schedule objects, pages of
//!   run summaries and lists of failures (the seed family's `JobRunPage` and
//!   `JobRunFailure`, keyed objects), trees, counts and notices as JSON.

use jobforge_core::engine::{
    AttemptTicket, JobRunQuery, PageCursor, RecordStep, ScopeOrder, ScopeQuery, Started,
};
use jobforge_core::worker::WorkerPool;
use jobforge_core::{
    AbortReason, AttemptOutcome, BufferedStart, FailureInfo, JobDefinition, JobError,
    ParentClosePolicy, PlainStart, RowOptions, RunId, RunRow, RunStatus, ScheduleRow,
    ScheduleTiming, StartRequest, StepStatus, TenantArg, TriggerSource,
};
use napi::{Error, Status};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::fmt::Write;

pub type Result<T> = napi::Result<T>;

// ── errors ─────────────────────────────────────────────────────────────

/// Prefix of every engine error message crossing into JS; the TS layer
/// parses the JSON after it into the matching error class. Async napi
/// functions cannot carry custom codes, so sync and async share this form.
pub const ERROR_PREFIX: &str = "JOBFORGE_ERROR:";

/// An engine error as JS reads it (`decodeNativeError` in `ts/wire.ts`).
pub fn error_text(e: &JobError) -> String {
    let fields = match e {
        // The incumbent crosses as every other run does: a tuple.
        JobError::JobCollision {
            job_type,
            concurrency_key,
            incumbent,
        } => {
            let row: Box<RawValue> =
                RawValue::from_string(incumbent.to_compact_json()).unwrap_or_else(|_| null_raw());
            json!({ "jobType": job_type, "concurrencyKey": concurrency_key, "incumbent": row })
        }
        JobError::JobTypeNotFound { job_type } => json!({ "jobType": job_type }),
        JobError::JobNotReplayable {
            run_id,
            current_status,
        } => json!({ "runId": run_id, "currentStatus": current_status }),
        JobError::JobTemplateFieldMissing { template, field } => {
            json!({ "template": template, "field": field })
        }
        JobError::MissingTenantId { method } => json!({ "method": method }),
        JobError::JobKeyFunctionUnavailable { job_type, kind } => {
            json!({ "jobType": job_type, "kind": kind })
        }
        JobError::JobRunNotFound { run_id } => json!({ "runId": run_id }),
        JobError::ParentRunNotFound { parent_run_id } => json!({ "parentRunId": parent_run_id }),
        JobError::JobInputInvalid { reason } => json!({ "reason": reason }),
        JobError::JobRunState { run_id, status, .. } => {
            json!({ "runId": run_id, "status": status })
        }
        JobError::JobStepConflict { run_id, step_id } => {
            json!({ "runId": run_id, "stepId": step_id })
        }
        JobError::JobResumeToken { reason } => json!({ "reason": reason }),
        JobError::Store {
            retryable, outcome, ..
        } => json!({ "retryable": retryable, "outcome": outcome.as_str() }),
    };
    let payload = json!({ "code": e.code(), "message": e.to_string(), "fields": fields });
    format!("{ERROR_PREFIX}{payload}")
}

/// The error of a `startMany` entry: `error_text` with the entry's
/// `index`, which JS puts in front of the message (`entries[3]: …`).
pub fn entry_error_text(e: &JobError, index: usize) -> String {
    let text = error_text(e);
    // `error_text` ends its payload with `}`: add the field before it.
    match text.strip_suffix('}') {
        Some(head) => format!("{head},\"index\":{index}}}"),
        None => text,
    }
}

/// `startMany`'s grouped answer: per start, its row (a tuple) or its
/// error (`{"error": error_text}`), in order.
pub fn group_text(answers: &[std::result::Result<RunRow, JobError>]) -> String {
    let mut out = String::from("[");
    for (i, a) in answers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match a {
            Ok(r) => out.push_str(&r.to_compact_json()),
            Err(e) => {
                out.push_str("{\"error\":");
                out.push_str(&Value::String(error_text(e)).to_string());
                out.push('}');
            }
        }
    }
    out.push(']');
    out
}

thread_local! {
    /// Whether the last error `to_napi` converted on this thread was a
    /// lost connection that changed nothing (`JobError::lost_connection`):
    /// the operation may run again (`ops::run`). An operation runs start
    /// to end on one thread.
    static LOST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub fn to_napi(e: JobError) -> Error {
    LOST.with(|l| l.set(e.runs_again()));
    Error::new(Status::GenericFailure, error_text(&e))
}

/// Whether the last error converted on this thread was a lost connection
/// that changed nothing; clears it.
pub fn take_lost() -> bool {
    LOST.with(|l| l.replace(false))
}

pub fn invalid(reason: impl Into<String>) -> Error {
    to_napi(JobError::JobInputInvalid {
        reason: reason.into(),
    })
}

fn null_raw() -> Box<RawValue> {
    serde_json::value::to_raw_value(&Value::Null).unwrap_or_default()
}

/// Parses one operation's request object (`what` names it in the error).
pub fn request<'a, T: Deserialize<'a>>(text: &'a str, what: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| invalid(format!("{what}: {e}")))
}

/// The JSON text of a reply value that cannot fail to serialise.
pub fn reply<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_owned())
}

// ── tenant ─────────────────────────────────────────────────────────────

/// `tenant` of a request: absent (JS `undefined`), null or an id, as the
/// tenant gate tells them apart. Use with `#[serde(default, deserialize_with = "tenant")]`.
pub fn tenant<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<TenantArg, D::Error> {
    Ok(match Option::<String>::deserialize(d)? {
        None => TenantArg::Null,
        Some(t) => TenantArg::Id(t),
    })
}

// ── run rows ───────────────────────────────────────────────────────────

pub fn row_text(r: &RunRow) -> String {
    r.to_compact_json()
}

pub fn opt_row_text(r: Option<RunRow>) -> String {
    r.map_or_else(|| "null".to_owned(), |r| r.to_compact_json())
}

pub fn rows_text(rows: &[RunRow]) -> String {
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

/// `{run, children: [...]}` nested, from a tree's rows (root first).
pub fn tree_text(rows: &[RunRow]) -> String {
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

/// `[{pool, status, count}]`.
pub fn counts_text(counts: &[(std::sync::Arc<str>, RunStatus, u64)]) -> String {
    let items: Vec<Value> = counts
        .iter()
        .map(|(pool, status, count)| json!({ "pool": &**pool, "status": status.as_str(), "count": count }))
        .collect();
    Value::Array(items).to_string()
}

/// A schedule as JS reads it (times in epoch ms; the TS layer makes `Date`s).
pub fn schedule_text(s: &ScheduleRow) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        name: &'a str,
        tenant_id: Option<&'a str>,
        job_type: &'a str,
        input: &'a RawValue,
        cron: Option<&'a str>,
        timezone: Option<&'static str>,
        every_ms: Option<i64>,
        next_run_at: Option<i64>,
        last_run_at: Option<i64>,
        last_run_id: Option<String>,
        last_error: Option<&'a str>,
        created_at: i64,
        updated_at: i64,
    }
    let (cron, timezone, every_ms) = match &s.timing {
        ScheduleTiming::Cron(c, tz) => (Some(c.expr()), Some(tz.name()), None),
        ScheduleTiming::Every(ms) => (None, None, Some(*ms)),
    };
    reply(&Out {
        name: &s.name,
        tenant_id: s.tenant_id.as_deref(),
        job_type: &s.job_type,
        input: &s.input,
        cron,
        timezone,
        every_ms,
        next_run_at: s.next_fire_at,
        last_run_at: s.last_fired_at,
        last_run_id: s.last_run_id.map(|id| id.to_string()),
        last_error: s.last_error.as_deref(),
        created_at: s.created_at,
        updated_at: s.updated_at,
    })
}

// ── keyset cursor ──────────────────────────────────────────────────────

pub fn encode_cursor((created_at, id): PageCursor) -> String {
    format!("c1{:016x}{:032x}", created_at as u64, id)
}

pub fn decode_cursor(c: &str) -> Result<PageCursor> {
    cursor_parts(c).ok_or_else(|| {
        invalid("cursor is malformed (pass nextCursor from a previous page unchanged)")
    })
}

/// The cursor of a timeline page: the last event's number.
pub fn encode_event_cursor(after: u64) -> String {
    format!("e1{after:016x}")
}

pub fn decode_event_cursor(c: &str) -> Result<u64> {
    event_cursor_parts(c).ok_or_else(|| {
        invalid("cursor is malformed (pass nextCursor from a previous page unchanged)")
    })
}

/// `decode_event_cursor` without the napi error (a test binary cannot drop
/// one: its `Drop` calls into Node).
fn event_cursor_parts(c: &str) -> Option<u64> {
    c.strip_prefix("e1")
        .filter(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
}

/// `{items, nextCursor}`: a page of a run's timeline. `at` in epoch ms
/// (JS makes it a `Date`); `data` as the engine wrote it.
pub fn events_page_text(events: &[jobforge_core::RunEvent], next: Option<u64>) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct EventOut<'a> {
        seq: u64,
        run_id: String,
        #[serde(rename = "type")]
        kind: &'static str,
        at: i64,
        attempt: u32,
        data: Option<&'a RawValue>,
    }
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        items: Vec<EventOut<'a>>,
        next_cursor: Option<String>,
    }
    reply(&Out {
        items: events
            .iter()
            .map(|e| EventOut {
                seq: e.id,
                run_id: e.run.to_string(),
                kind: e.kind.as_str(),
                at: e.at,
                attempt: e.attempt,
                data: e.data.as_deref(),
            })
            .collect(),
        next_cursor: next.map(encode_event_cursor),
    })
}

fn cursor_parts(c: &str) -> Option<PageCursor> {
    let hex = c
        .strip_prefix("c1")
        .filter(|h| h.len() == 48 && h.bytes().all(|b| b.is_ascii_hexdigit()))?;
    let t = u64::from_str_radix(&hex[..16], 16).ok()? as i64;
    let id = u128::from_str_radix(&hex[16..], 16).ok()?;
    Some((t, id))
}

// ── start ──────────────────────────────────────────────────────────────

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScopeWire {
    entity_type: String,
    entity_id: String,
}

/// Start options as the TS layer sends them (already shape-checked there;
/// checked again here so that every value the engine stores is).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartOpts {
    #[serde(default, deserialize_with = "tenant")]
    tenant: TenantArg,
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

/// `runAt` and other instants: an integral ms count inside a JS `Date`'s range.
pub fn date_ms(t: f64, what: &str) -> Result<i64> {
    date_ms_checked(t, what).map_err(to_napi)
}

fn date_ms_checked(t: f64, what: &str) -> std::result::Result<i64, JobError> {
    if t.is_finite() && t.fract() == 0.0 && t.abs() <= 8.64e15 {
        Ok(t as i64)
    } else {
        Err(bad(format!("{what} must be a valid Date")))
    }
}

/// An input error as the engine words it (no napi: start lines are read
/// in unit tests too, outside Node).
fn bad(reason: impl Into<String>) -> JobError {
    JobError::JobInputInvalid {
        reason: reason.into(),
    }
}

/// What of `StartOpts` needs a lookup or a key of the definition: a
/// start with any of these goes through the full `start` rules.
#[derive(Default)]
struct LookupOpts {
    scope_entity_id_from_meta: Option<String>,
    parent_run_id: Option<String>,
    concurrency_key: Option<String>,
    dedupe_key: Option<String>,
}

impl LookupOpts {
    fn apply_to(self, req: &mut StartRequest) {
        req.scope_entity_id_from_meta = self.scope_entity_id_from_meta;
        req.parent_run_id = self.parent_run_id;
        req.concurrency_key = self.concurrency_key;
        req.dedupe_key = self.dedupe_key;
    }

    fn is_empty(&self) -> bool {
        self.scope_entity_id_from_meta.is_none()
            && self.parent_run_id.is_none()
            && self.concurrency_key.is_none()
            && self.dedupe_key.is_none()
    }
}

impl StartOpts {
    /// Moves the options into `req`, checking each value.
    pub fn apply(self, req: &mut StartRequest) -> std::result::Result<(), JobError> {
        let (row, look) = self.checked()?;
        row.apply_to(req);
        look.apply_to(req);
        Ok(())
    }

    /// Checks each value: the options that set fields of the row, and
    /// those that need a lookup.
    fn checked(self) -> std::result::Result<(RowOptions, LookupOpts), JobError> {
        let o = self;
        if matches!(&o.pool, Some(p) if p.is_empty()) {
            return Err(bad("pool must be a non-empty string"));
        }
        if matches!(&o.pool, Some(p) if p.contains('\n')) {
            return Err(bad("pool must not contain a line break"));
        }
        let run_at = o.run_at.map(|t| date_ms_checked(t, "runAt")).transpose()?;
        let priority = match o.priority {
            None => None,
            Some(p) if p.fract() == 0.0 && p >= i32::MIN as f64 && p <= i32::MAX as f64 => {
                Some(p as i32)
            }
            Some(p) => {
                return Err(bad(format!(
                    "priority must be an integer between -2147483648 and 2147483647, got {p}"
                )))
            }
        };
        let tags = match o.tags.filter(|t| t.get() != "null") {
            None => None,
            Some(tags) => {
                let parsed: std::result::Result<std::collections::HashMap<String, String>, _> =
                    serde_json::from_str(tags.get());
                if parsed.is_err() {
                    return Err(bad("tags must be an object of string values"));
                }
                Some(tags)
            }
        };
        let trigger_source = match o.trigger_source {
            None => None,
            Some(s) => Some(TriggerSource::parse(&s).ok_or_else(|| {
                bad(format!(
                    "triggerSource must be manual, schedule, event or parent, got '{s}'"
                ))
            })?),
        };
        let parent_close_policy = match o.parent_close_policy {
            None => None,
            Some(s) => Some(ParentClosePolicy::parse(&s).ok_or_else(|| {
                bad(format!(
                    "parentClosePolicy must be terminate, cancel or abandon, got '{s}'"
                ))
            })?),
        };
        Ok((
            RowOptions {
                tenant: o.tenant,
                scope: o.scope.map(|s| (s.entity_type, s.entity_id)),
                pool: o.pool,
                run_at,
                priority,
                tags,
                trigger_source,
                trigger_ref: o.trigger_ref,
                parent_close_policy,
            },
            LookupOpts {
                scope_entity_id_from_meta: o.scope_entity_id_from_meta,
                parent_run_id: o.parent_run_id,
                concurrency_key: o.concurrency_key,
                dedupe_key: o.dedupe_key,
            },
        ))
    }
}

/// The run id every ticket, report and batch line starts with, and the rest.
fn split_run_id(line: &str) -> std::result::Result<(RunId, &str), String> {
    let id_text = line.get(..36).ok_or("too short")?;
    let id = id_text
        .parse::<RunId>()
        .map_err(|_| format!("bad run id '{id_text}'"))?;
    Ok((id, &line[36..]))
}

/// One line of a start batch: a start JS already answered (see
/// `Engine::start_batch`), `<id><createdAt ms>,<type byte length>:<type><input JSON>`,
/// then, for a start with options, `\x01<options JSON>` (`StartOpts`).
/// JSON text holds no raw control character, so neither a line break nor
/// `\x01` can occur inside it. Written by `startLine` in TS.
pub fn parse_start_line(line: &str) -> std::result::Result<BufferedStart<'_>, String> {
    let (id, rest) = split_run_id(line)?;
    let comma = rest.find(',').ok_or("no ',' after the time")?;
    let at: i64 = rest[..comma]
        .parse()
        .map_err(|_| format!("bad time '{}'", &rest[..comma]))?;
    let rest = &rest[comma + 1..];
    let colon = rest.find(':').ok_or("no ':' after the type length")?;
    let len: usize = rest[..colon].parse().map_err(|_| "bad type length")?;
    let rest = &rest[colon + 1..];
    let (job_type, rest) = (rest.get(..len).ok_or("type cut short")?, &rest[len..]);
    let (input, opts) = match rest.split_once('\x01') {
        Some((input, opts)) => (input, Some(opts)),
        None => (rest, None),
    };
    let input = RawValue::from_string(input.to_owned()).map_err(|e| format!("input: {e}"))?;
    let Some(opts) = opts else {
        return Ok(BufferedStart::Plain(PlainStart {
            id,
            at,
            job_type,
            input,
        }));
    };
    let opts: StartOpts = match quick_start_opts(opts) {
        Some(o) => o,
        None => serde_json::from_str(opts).map_err(|e| format!("options: {e}"))?,
    };
    let (row, look) = opts.checked().map_err(|e| format!("options: {e}"))?;
    let run = PlainStart {
        id,
        at,
        job_type,
        input,
    };
    if look.is_empty() {
        return Ok(BufferedStart::RowOptions(run, Box::new(row)));
    }
    let mut req = StartRequest {
        job_type: job_type.to_owned(),
        input: run.input,
        preset: Some((id, at)),
        ..StartRequest::default()
    };
    row.apply_to(&mut req);
    look.apply_to(&mut req);
    Ok(BufferedStart::WithOptions(Box::new(req)))
}

/// `StartOpts` as `StartWire.json()` writes them (no whitespace, each key
/// once, `scope` as `{"entityType":…,"entityId":…}`, `tags` a flat object
/// of strings), read by hand: serde's derived reader cost 100–200 ns a
/// line, more than the rest of a buffered start's parse. `None` for any
/// other text, which serde then reads (and words the error of); what this
/// accepts it reads as serde does (`quick_start_opts_reads_as_serde`).
/// The values are checked by `StartOpts::apply` either way.
fn quick_start_opts(text: &str) -> Option<StartOpts> {
    let b = text.as_bytes();
    let mut o = StartOpts::default();
    if b.first() != Some(&b'{') {
        return None;
    }
    if text == "{}" {
        return Some(o);
    }
    // Every option starts unset: one already set was given twice, which
    // serde refuses, so it reads this text.
    let mut i = 1;
    loop {
        let (key, next) = json_str(text, i)?;
        if b.get(next) != Some(&b':') {
            return None;
        }
        i = next + 1;
        i = match &*key {
            "tenant" => {
                if o.tenant != TenantArg::Missing {
                    return None;
                }
                if text[i..].starts_with("null") {
                    o.tenant = TenantArg::Null;
                    i + 4
                } else {
                    let (t, n) = json_str(text, i)?;
                    o.tenant = TenantArg::Id(t.into_owned());
                    n
                }
            }
            "scope" => {
                let rest = text[i..].strip_prefix("{\"entityType\":")?;
                let (entity_type, n) = json_str(text, text.len() - rest.len())?;
                let rest = text[n..].strip_prefix(",\"entityId\":")?;
                let (entity_id, n) = json_str(text, text.len() - rest.len())?;
                if b.get(n) != Some(&b'}') || o.scope.is_some() {
                    return None;
                }
                o.scope = Some(ScopeWire {
                    entity_type: entity_type.into_owned(),
                    entity_id: entity_id.into_owned(),
                });
                n + 1
            }
            "runAt" | "priority" => {
                let slot = if &*key == "runAt" {
                    &mut o.run_at
                } else {
                    &mut o.priority
                };
                let (v, n) = json_number(text, i)?;
                if slot.replace(v).is_some() {
                    return None;
                }
                n
            }
            "tags" => {
                // `{"k":"v",…}`: its text is kept, `apply` checks it.
                if b.get(i) != Some(&b'{') || o.tags.is_some() {
                    return None;
                }
                let mut j = i + 1;
                if b.get(j) != Some(&b'}') {
                    loop {
                        let (_, n) = json_str(text, j)?;
                        if b.get(n) != Some(&b':') {
                            return None;
                        }
                        let (_, n) = json_str(text, n + 1)?;
                        match b.get(n) {
                            Some(b',') => j = n + 1,
                            Some(b'}') => {
                                j = n;
                                break;
                            }
                            _ => return None,
                        }
                    }
                }
                o.tags = Some(RawValue::from_string(text[i..=j].to_owned()).ok()?);
                j + 1
            }
            _ => {
                let slot = match &*key {
                    "scopeEntityIdFromMeta" => &mut o.scope_entity_id_from_meta,
                    "pool" => &mut o.pool,
                    "triggerSource" => &mut o.trigger_source,
                    "triggerRef" => &mut o.trigger_ref,
                    "parentClosePolicy" => &mut o.parent_close_policy,
                    "parentRunId" => &mut o.parent_run_id,
                    "concurrencyKey" => &mut o.concurrency_key,
                    "dedupeKey" => &mut o.dedupe_key,
                    _ => return None,
                };
                let (v, n) = json_str(text, i)?;
                if slot.replace(v.into_owned()).is_some() {
                    return None;
                }
                n
            }
        };
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') if i + 1 == b.len() => return Some(o),
            _ => return None,
        }
    }
}

/// The JSON string starting at byte `at` (its opening quote) and the byte
/// after its closing one; escapes are decoded by serde. `None` for what
/// JSON does not allow (a raw control character) or a string cut short.
fn json_str(text: &str, at: usize) -> Option<(std::borrow::Cow<'_, str>, usize)> {
    let b = text.as_bytes();
    if b.get(at) != Some(&b'"') {
        return None;
    }
    let mut j = at + 1;
    let mut escaped = false;
    loop {
        match *b.get(j)? {
            b'"' => break,
            b'\\' => {
                escaped = true;
                j += 2;
            }
            c if c < 0x20 => return None,
            _ => j += 1,
        }
    }
    let token = text.get(at..=j)?;
    let s = if escaped {
        std::borrow::Cow::Owned(serde_json::from_str::<String>(token).ok()?)
    } else {
        std::borrow::Cow::Borrowed(&token[1..token.len() - 1])
    };
    Some((s, j + 1))
}

/// The JSON number starting at byte `at` and the byte after it; `None`
/// unless it follows JSON's grammar (`-`? int frac? exp?).
fn json_number(text: &str, at: usize) -> Option<(f64, usize)> {
    let b = text.as_bytes();
    let mut j = at;
    let digits = |j: &mut usize| {
        let from = *j;
        while b.get(*j).is_some_and(u8::is_ascii_digit) {
            *j += 1;
        }
        *j - from
    };
    if b.get(j) == Some(&b'-') {
        j += 1;
    }
    let int_from = j;
    let n = digits(&mut j);
    if n == 0 || (n > 1 && b[int_from] == b'0') {
        return None;
    }
    if b.get(j) == Some(&b'.') {
        j += 1;
        if digits(&mut j) == 0 {
            return None;
        }
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if digits(&mut j) == 0 {
            return None;
        }
    }
    Some((text[at..j].parse().ok()?, j))
}

/// A new run as `start` answers it when JS holds its type's template
/// (`short`): what the engine decided and the request does not say (the
/// parent as stored, whatever the spelling it was given in; JS fills the
/// rest in from the template, `newRun` in TS), as positional text, not JSON:
/// `<id><createdAt ms>,` then concurrencyKey, dedupeKey, rootRunId,
/// tenantId, parentRunId, each `-` (null) or `<UTF-16 length>:<text>`,
/// rootRunId `=` when it is the run itself. JS reads it with slices: a
/// `JSON.parse` would intern every fresh id into V8's string table, the
/// dearest part of reading this answer. A dedupe hit is the whole row (a
/// JSON tuple, so it starts with `[`). Read by `parseStarted` in TS.
pub fn started_text(started: &Started) -> String {
    match started {
        Started::Row(r) => r.to_compact_json(),
        Started::Created {
            id,
            at,
            concurrency_key,
            dedupe_key,
            parent_run_id,
            root_run_id,
            tenant_id,
            ..
        } => {
            let mut out = String::with_capacity(96);
            let _ = write!(out, "{id}{at},");
            push_short_field(&mut out, concurrency_key.as_deref());
            push_short_field(&mut out, dedupe_key.as_deref());
            // A run id is 36 ASCII characters: written in place, no copy.
            match root_run_id {
                Some(root) if root != id => {
                    let _ = write!(out, "36:{root}");
                }
                _ => out.push('='),
            }
            push_short_field(&mut out, tenant_id.as_deref());
            match parent_run_id {
                Some(parent) => {
                    let _ = write!(out, "36:{parent}");
                }
                None => out.push('-'),
            }
            out
        }
    }
}

/// One field of `started_text`: `-`, or its length in UTF-16 units (what
/// a JS slice counts), `:` and the text.
fn push_short_field(out: &mut String, v: Option<&str>) {
    match v {
        None => out.push('-'),
        Some(s) => {
            let _ = write!(out, "{}:", s.encode_utf16().count());
            out.push_str(s);
        }
    }
}

/// Definitions and the template row of each (`Engine::run_template`):
/// `{"definitions":[…],"templates":[tuple…]}`.
pub fn registered_text<S: jobforge_core::Store>(
    engine: &jobforge_core::Engine<S>,
    defs: &[&JobDefinition],
) -> String {
    let templates: Vec<String> = defs
        .iter()
        .map(|d| engine.run_template(d).to_compact_json())
        .collect();
    format!(
        "{{\"definitions\":{},\"templates\":[{}]}}",
        reply(&defs),
        templates.join(",")
    )
}

// ── attempts ───────────────────────────────────────────────────────────

/// An attempt ticket for JS: `header \0 input \0 memo \0 row`. The header is
/// `<id><epoch>,<timeoutMs or nothing>,` (the engine enforces the timeout;
/// JS keeps a `tick` alive for it) then the job type and the pool,
/// each as `<UTF-16 length>:<text>`, so any character may appear in them.
/// Input, memo (`write_memo`) and row are JSON, in which serde_json escapes
/// NUL, so the separators are unambiguous. The row is left empty unless `with_row`:
/// serialising it costs more than the rest of a worker's per-run native
/// work, and most handlers never read `ctx.run` (JS fetches it with
/// `claimedRun` if so). Read by `TicketReader` in `ts/wire.ts`.
pub fn ticket_text(t: &AttemptTicket, with_row: bool) -> String {
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

/// Appends a ticket without its row to `out`. Written by hand and read by
/// hand in JS (no JSON for the header): this is on every run's path.
pub fn write_ticket(out: &mut String, t: &AttemptTicket) {
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
    write_memo(out, &t.memo);
    out.push('\0');
}

/// The ticket's memo: nothing when the run has no completed step (most
/// runs), else `[[<step id>,<1: a wait, 0: a step>,<output>],…]` (JSON).
fn write_memo(out: &mut String, memo: &[jobforge_core::MemoStep]) {
    for (i, m) in memo.iter().enumerate() {
        out.push(if i == 0 { '[' } else { ',' });
        out.push('[');
        // A string always serialises.
        out.push_str(&serde_json::to_string(&*m.step_id).unwrap_or_default());
        out.push_str(if m.wait { ",1," } else { ",0," });
        out.push_str(m.output.as_deref().map_or("null", RawValue::get));
        out.push(']');
    }
    if !memo.is_empty() {
        out.push(']');
    }
}

/// Length in UTF-16 units (what JS string lengths count).
fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.encode_utf16().count()
    }
}

#[derive(Deserialize)]
struct OutcomeError {
    message: Option<String>,
    stack: Option<String>,
    name: Option<String>,
    code: Option<String>,
}

/// The outcome JSON a handler's attempt ends with (`outcomeOf` and
/// `failedOutcome` in TS): completed, failed or no handler. (A timeout is
/// never JS's to report: the engine's timer decides it.) `output` stays
/// raw text so the handler's key order is kept.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutcomeWire {
    status: String,
    output: Option<Box<RawValue>>,
    error: Option<OutcomeError>,
}

/// What a handler that returns nothing reports (most do).
pub const COMPLETED_EMPTY: &str = r#"{"status":"completed","output":{}}"#;

/// What a handler blocked only on durable waits reports.
pub const PARKED: &str = r#"{"status":"parked"}"#;

pub fn parse_outcome(text: &str) -> AttemptOutcome {
    if text == COMPLETED_EMPTY {
        return AttemptOutcome::Completed(None);
    }
    if text == PARKED {
        return AttemptOutcome::Parked;
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

/// A thrown value as `describeFailure` in TS reports it.
#[derive(Deserialize, Default)]
pub struct FailureWire {
    message: Option<String>,
    stack: Option<String>,
    name: Option<String>,
    code: Option<String>,
}

impl From<FailureWire> for FailureInfo {
    fn from(f: FailureWire) -> Self {
        FailureInfo {
            message: f.message.unwrap_or_else(|| "step failed".to_owned()),
            stack: f.stack,
            name: f.name,
            code: f.code,
        }
    }
}

/// One attempt of a worker report: `<id><epoch>,<pool index>,<outcome>`,
/// where the pool index is the pool's position in `startWorker`'s list, an
/// empty outcome means the attempt ended without one (canceled or
/// released) and `.` a completion with no output; outcome JSON never holds
/// a raw newline. Written by `reportLine` in TS.
pub fn parse_report_line(
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
        "." => Some(AttemptOutcome::Completed(None)),
        text => Some(parse_outcome(text)),
    };
    Ok((id, epoch, outcome, slot))
}

/// Worker pools from `[{"name","concurrency"}]`.
pub fn parse_pools(text: &str) -> Result<Vec<WorkerPool>> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PoolWire {
        name: String,
        concurrency: usize,
    }
    let pools: Vec<PoolWire> = request(text, "worker pools")?;
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

/// Appends `lines` to `out`, one per line.
pub fn push_lines(out: &mut String, lines: &[String]) {
    for l in lines {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(l);
    }
}

/// `{"aborts":[{"runId","epoch"?,"reason"}],"events":[row…],"expire":bool,"troubles":[message…]}`.
pub fn notices_text(
    aborts: &[(RunId, Option<u32>, AbortReason)],
    events: &[String],
    expire: bool,
    troubles: &[String],
) -> String {
    let aborts: Vec<Value> = aborts
        .iter()
        .map(|(id, epoch, r)| match epoch {
            Some(e) => json!({ "runId": id.to_string(), "epoch": e, "reason": r.as_str() }),
            None => json!({ "runId": id.to_string(), "reason": r.as_str() }),
        })
        .collect();
    format!(
        "{{\"aborts\":{},\"events\":[{}],\"expire\":{expire},\"troubles\":{}}}",
        Value::Array(aborts),
        events.join(","),
        json!(troubles)
    )
}

// ── queries ────────────────────────────────────────────────────────────

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// `limit`: absent → 50, above 500 → 500; anything but a positive integer
/// is an error.
pub fn page_limit(limit: Option<f64>) -> Result<usize> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(l) if l.is_finite() && l.fract() == 0.0 && l >= 1.0 => Ok((l as usize).min(MAX_PAGE)),
        Some(l) => Err(invalid(format!(
            "limit must be a positive integer, got {l}"
        ))),
    }
}

fn status_of(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s).ok_or_else(|| invalid(format!("unknown run status '{s}'")))
}

/// A query's `status`: one status, an array of them, or absent (every status).
fn statuses_of(v: &Value) -> Result<Option<Vec<RunStatus>>> {
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

fn limit_of(v: &Value) -> Result<usize> {
    match v.get("limit") {
        None | Some(Value::Null) => page_limit(None),
        Some(l) => page_limit(Some(
            l.as_f64()
                .ok_or_else(|| invalid("limit must be a positive integer"))?,
        )),
    }
}

/// `{status?, jobType?, limit?, offset?, orderBy?}` of `listForScope`.
pub fn scope_query(v: &Value) -> Result<ScopeQuery> {
    let statuses = statuses_of(v)?;
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
    // jobforge's spelling and the seed family's (`ListForScopeOptions`).
    let order = match v.get("orderBy").and_then(Value::as_str) {
        None if v.get("orderBy").is_none_or(Value::is_null) => ScopeOrder::CreatedDesc,
        Some("createdAt:desc" | "created_at desc") => ScopeOrder::CreatedDesc,
        Some("createdAt:asc" | "created_at asc") => ScopeOrder::CreatedAsc,
        Some("run_at desc") => ScopeOrder::RunAtDesc,
        Some("run_at asc") => ScopeOrder::RunAtAsc,
        _ => {
            return Err(invalid(
                "orderBy must be 'createdAt:desc', 'createdAt:asc', 'created_at desc', 'created_at asc', 'run_at desc' or 'run_at asc'",
            ))
        }
    };
    Ok(ScopeQuery {
        statuses,
        job_type,
        limit: limit_of(v)?,
        offset,
        order,
    })
}

/// `{poolId?, rootRunId?, status?, since?, jobType?, scopeEntityType?,
/// scopeEntityId?, cursor?, limit?}` of `listJobRuns` (a scope is both of
/// its keys or neither).
pub fn job_run_query(v: &Value) -> Result<JobRunQuery> {
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
    let scope = match (s("scopeEntityType")?, s("scopeEntityId")?) {
        (Some(et), Some(eid)) => Some((et, eid)),
        (None, None) => None,
        _ => {
            return Err(invalid(
                "scopeEntityType and scopeEntityId name a scope together: give both or neither",
            ))
        }
    };
    Ok(JobRunQuery {
        pool: s("poolId")?,
        root_run_id: s("rootRunId")?,
        statuses: statuses_of(v)?,
        since,
        job_type: s("jobType")?,
        scope,
        cursor: s("cursor")?.map(|c| decode_cursor(&c)).transpose()?,
        limit: limit_of(v)?,
    })
}

/// A run as the run service's lists show it (the seed family's
/// `JobRunSummary`): the columns a runs viewer renders, without input,
/// output or tags, so a page never carries a run's payload across. Times in
/// epoch ms (`decodeSummary` in `ts/wire.ts` makes the `Date`s).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct RunSummaryOut<'a> {
    run_id: RunId,
    root_run_id: RunId,
    parent_run_id: Option<RunId>,
    trigger_source: TriggerSource,
    trigger_ref: Option<&'a str>,
    job_type: &'a str,
    pool: &'a str,
    status: RunStatus,
    scope_entity_type: Option<&'a str>,
    scope_entity_id: Option<&'a str>,
    tenant_id: Option<&'a str>,
    attempts: u32,
    error_message: Option<&'a str>,
    run_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    created_at: i64,
}

impl<'a> RunSummaryOut<'a> {
    fn of(r: &'a RunRow) -> Self {
        RunSummaryOut {
            run_id: r.id,
            root_run_id: r.root_run_id(),
            parent_run_id: r.parent_run_id(),
            trigger_source: r.trigger_source,
            trigger_ref: r.trigger_ref(),
            job_type: &r.job_type,
            pool: &r.pool,
            status: r.status,
            scope_entity_type: r.scope_entity_type(),
            scope_entity_id: r.scope_entity_id(),
            tenant_id: r.tenant_id.as_deref(),
            attempts: r.attempts,
            error_message: r.error().map(|e| e.message.as_str()),
            run_at: r.run_at,
            started_at: r.started_at.get(),
            finished_at: r.finished_at.get(),
            created_at: r.created_at,
        }
    }
}

/// `{"items": [summary...], "nextCursor": string | null}` (the seed
/// family's `JobRunPage`).
pub fn page_text(rows: &[RunRow], next: Option<PageCursor>) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        items: Vec<RunSummaryOut<'a>>,
        next_cursor: Option<String>,
    }
    reply(&Out {
        items: rows.iter().map(RunSummaryOut::of).collect(),
        next_cursor: next.map(encode_cursor),
    })
}

/// `[failure...]`: failed runs as the seed family's `JobRunFailure` (a
/// dashboard's columns). `failedAt` is when the run finished; a failed row
/// without `finishedAt` (written by hand) shows its last change instead,
/// so the field is never null.
pub fn failures_text(rows: &[RunRow]) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        run_id: RunId,
        job_type: &'a str,
        pool: &'a str,
        scope_entity_type: Option<&'a str>,
        scope_entity_id: Option<&'a str>,
        tenant_id: Option<&'a str>,
        attempts: u32,
        error_message: Option<&'a str>,
        failed_at: i64,
        created_at: i64,
    }
    let items: Vec<Out> = rows
        .iter()
        .map(|r| Out {
            run_id: r.id,
            job_type: &r.job_type,
            pool: &r.pool,
            scope_entity_type: r.scope_entity_type(),
            scope_entity_id: r.scope_entity_id(),
            tenant_id: r.tenant_id.as_deref(),
            attempts: r.attempts,
            error_message: r.error().map(|e| e.message.as_str()),
            failed_at: r.finished_at.get().unwrap_or(r.updated_at),
            created_at: r.created_at,
        })
        .collect();
    reply(&items)
}

/// The step service's upsert, as `recordStep` sends it.
pub fn record_step(v: &RawValue) -> Result<RecordStep> {
    #[derive(Deserialize)]
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
    let w: Wire = request(v.get(), "recordStep")?;
    let status = StepStatus::parse(&w.status)
        .ok_or_else(|| invalid(format!("unknown step status '{}'", w.status)))?;
    let not_null = |r: Option<Box<RawValue>>| r.filter(|x| x.get() != "null");
    Ok(RecordStep {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_anything_else() {
        for c in [(0i64, 0u128), (1_700_000_000_000, u128::MAX), (-5, 42)] {
            assert_eq!(cursor_parts(&encode_cursor(c)), Some(c));
        }
        for bad in ["", "c1", "c2000", "c1zz", &format!("c1{}", "0".repeat(47))] {
            assert!(cursor_parts(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn event_cursor_round_trips_and_refuses_anything_else() {
        for n in [0u64, 1, 42, u64::MAX] {
            assert_eq!(event_cursor_parts(&encode_event_cursor(n)), Some(n));
        }
        for bad in [
            "",
            "e1",
            "e2000000000000000",
            "e1zzzzzzzzzzzzzzzz",
            "c1",
            "e10000",
        ] {
            assert!(event_cursor_parts(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn report_lines_read_back_what_ts_writes() {
        let id = RunId::new_v4();
        let (got, epoch, outcome, slot) = parse_report_line(&format!("{id}7,2,.")).unwrap();
        assert_eq!((got, epoch, slot), (id, 7, 2));
        assert!(matches!(outcome, Some(AttemptOutcome::Completed(None))));
        let (_, _, outcome, slot) = parse_report_line(&format!("{id}1,-1,")).unwrap();
        assert!(outcome.is_none());
        assert_eq!(slot, usize::MAX);
        let text = format!(
            "{id}3,0,{}",
            r#"{"status":"failed","error":{"message":"m","name":"N","code":"C"}}"#
        );
        let Some(AttemptOutcome::Failed(f)) = parse_report_line(&text).unwrap().2 else {
            panic!("expected a failure");
        };
        assert_eq!(
            (f.message.as_str(), f.name.as_deref(), f.code.as_deref()),
            ("m", Some("N"), Some("C"))
        );
        assert!(parse_report_line("short").is_err());
        assert!(parse_report_line(&format!("{id}x,0,")).is_err());
    }

    /// What the hand reader of start options accepts it reads as serde
    /// does (the request they make, checked by the same `apply`), it
    /// accepts every shape `StartWire.json()` writes, and anything else
    /// is left to serde.
    #[test]
    fn quick_start_opts_reads_as_serde() {
        let read = |o: StartOpts| {
            let mut req = StartRequest::default();
            match o.apply(&mut req) {
                Ok(()) => format!("{req:?}"),
                Err(e) => format!("error: {e}"),
            }
        };
        let written = [
            "{}",
            r#"{"priority":3}"#,
            r#"{"priority":-2147483648}"#,
            r#"{"priority":1.5}"#,
            r#"{"priority":1e3}"#,
            r#"{"runAt":1765000000000}"#,
            r#"{"tenant":null}"#,
            r#"{"tenant":"t\"1\\ \u00e9 é"}"#,
            r#"{"scope":{"entityType":"order","entityId":"o42"},"pool":"p"}"#,
            r#"{"tenant":"a","scope":{"entityType":"o","entityId":"\n"},"scopeEntityIdFromMeta":"m","pool":"p","runAt":0,"priority":0,"tags":{"k":"v","traceparent":"00-x"},"triggerSource":"event","triggerRef":"r","parentClosePolicy":"abandon","parentRunId":"x","concurrencyKey":"c","dedupeKey":"d"}"#,
            r#"{"tags":{}}"#,
            r#"{"triggerSource":"nope"}"#,
            r#"{"pool":""}"#,
        ];
        for text in written {
            let quick =
                quick_start_opts(text).unwrap_or_else(|| panic!("not read by hand: {text}"));
            let serde: StartOpts = serde_json::from_str(text).unwrap();
            assert_eq!(read(quick), read(serde), "{text}");
        }
        let left_to_serde = [
            "",
            "{",
            r#"{"priority":3,"priority":4}"#,
            r#"{"priority":3,}"#,
            r#"{"priority":03}"#,
            r#"{"priority":-}"#,
            r#"{"priority":1.}"#,
            r#"{"priority":"3"}"#,
            r#"{ "priority":3}"#,
            r#"{"priority":3} "#,
            r#"{"pool":null}"#,
            r#"{"pool":"a"}x"#,
            r#"{"scope":{"entityId":"o","entityType":"t"}}"#,
            r#"{"scope":{"entityType":"t","entityId":"o","x":1}}"#,
            r#"{"tags":{"k":1}}"#,
            r#"{"tags":{"k":"v",}}"#,
            r#"{"unknown":1}"#,
            "{\"pool\":\"a\u{1}\"}",
            r#"{"pool":"\ud800"}"#,
            r#"{"pool":"a"#,
        ];
        for text in left_to_serde {
            assert!(quick_start_opts(text).is_none(), "read by hand: {text}");
        }
    }

    #[test]
    fn start_lines_carry_any_type_name_and_their_options() {
        let id = RunId::new_v4();
        let line = format!("{id}1234,{}:{}{}", "a:b,c".len(), "a:b,c", r#"{"k":"v"}"#);
        let BufferedStart::Plain(s) = parse_start_line(&line).unwrap() else {
            panic!("expected a plain start");
        };
        assert_eq!(
            (s.id, s.at, s.job_type, s.input.get()),
            (id, 1234, "a:b,c", r#"{"k":"v"}"#)
        );
        let line = format!(
            "{id}99,1:t{}\x01{}",
            r#"[1,"\u0001"]"#, r#"{"priority":3,"tenant":null}"#
        );
        // Options that only set fields of the row: nothing to look up.
        let BufferedStart::RowOptions(s, o) = parse_start_line(&line).unwrap() else {
            panic!("expected row options");
        };
        assert_eq!(
            (Some((s.id, s.at)), s.job_type, s.input.get()),
            (Some((id, 99)), "t", r#"[1,"\u0001"]"#)
        );
        assert_eq!((o.priority, o.tenant.clone()), (Some(3), TenantArg::Null));
        // Options that need a lookup (a parent, a key): the full rules.
        let line = format!(
            "{id}99,1:t{}\x01{}",
            r#"[1,"\u0001"]"#, r#"{"priority":3,"tenant":null,"dedupeKey":"d"}"#
        );
        let BufferedStart::WithOptions(r) = parse_start_line(&line).unwrap() else {
            panic!("expected options");
        };
        assert_eq!(
            (r.preset, r.job_type.as_str(), r.input.get()),
            (Some((id, 99)), "t", r#"[1,"\u0001"]"#)
        );
        assert_eq!(
            (r.priority, r.tenant.clone(), r.dedupe_key.as_deref()),
            (Some(3), TenantArg::Null, Some("d"))
        );
        assert!(parse_start_line(&format!("{id}12,9:ab{{}}")).is_err());
        assert!(parse_start_line(&format!("{id}12,1:t{{}}\x01{{\"priority\":1.5}}")).is_err());
    }

    #[test]
    fn outcomes_of_every_kind() {
        assert!(matches!(
            parse_outcome(COMPLETED_EMPTY),
            AttemptOutcome::Completed(None)
        ));
        let AttemptOutcome::Completed(Some(o)) =
            parse_outcome(r#"{"status":"completed","output":{"b":1,"a":2}}"#)
        else {
            panic!("expected an output");
        };
        assert_eq!(o.get(), r#"{"b":1,"a":2}"#, "key order kept");
        // Only the engine times a run out.
        assert!(matches!(
            parse_outcome(r#"{"status":"timed_out","timeoutMs":5}"#),
            AttemptOutcome::Failed(_)
        ));
        assert!(matches!(
            parse_outcome(r#"{"status":"no_handler"}"#),
            AttemptOutcome::NoHandler
        ));
        assert!(matches!(
            parse_outcome("garbage"),
            AttemptOutcome::Failed(_)
        ));
    }
}

/// What a buffered start line costs the binding without Node (the parse
/// and `Engine::start_batch`, 1,024 lines into fresh engines), by shape:
/// `cargo test --release --lib start_line_cost -- --ignored --nocapture`.
#[cfg(test)]
mod start_line_cost {
    use super::*;
    use jobforge_core::*;

    fn engine() -> Engine<MemoryStore> {
        let e = Engine::new(
            MemoryStore::new(),
            EngineOptions {
                multi_tenant: false,
                clock: ClockKind::System,
                retention: Default::default(),
            },
        );
        e.register(DefinitionSpec {
            job_type: "plain".into(),
            ..DefinitionSpec::default()
        })
        .unwrap();
        e
    }

    #[test]
    #[ignore = "a measurement, not a check"]
    fn start_line_cost() {
        for (name, opts) in [
            ("plain", None),
            ("priority", Some("{\"priority\":3}")),
            ("runAt", Some("{\"runAt\":1899999999999}")),
            (
                "scope",
                Some("{\"scope\":{\"entityType\":\"order\",\"entityId\":\"o42\"}}"),
            ),
        ] {
            let mut total = std::time::Duration::ZERO;
            let rounds = 300;
            for _ in 0..rounds {
                let e = engine();
                let batches: Vec<String> = (0..4)
                    .map(|_| {
                        let mut s = String::new();
                        for i in 0..256 {
                            s.push_str(&format!(
                                "{}1765000000000,5:plain{{\"n\":{i}}}",
                                RunId::new_v4()
                            ));
                            if let Some(o) = opts {
                                s.push('\x01');
                                s.push_str(o);
                            }
                            s.push('\n');
                        }
                        s
                    })
                    .collect();
                let t0 = std::time::Instant::now();
                for b in &batches {
                    let reqs: Vec<_> = b
                        .split('\n')
                        .filter(|l| !l.is_empty())
                        .map(|l| parse_start_line(l).unwrap())
                        .collect();
                    let (failed, _) = e.start_batch(reqs, false).unwrap();
                    assert!(failed.is_empty());
                }
                total += t0.elapsed();
            }
            println!("{name}: {:?}/run", total / (rounds * 1024));
        }
    }
}
