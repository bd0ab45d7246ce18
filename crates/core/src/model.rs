//! Rows and enums of the contract. Serialised with serde in the shape JS
//! sees (camelCase, timestamps as epoch milliseconds, `null` for absent);
//! the TS layer only turns the millisecond fields into `Date`s.

use crate::template::KeyTemplate;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::sync::Arc;
use uuid::Uuid;

pub type RunId = Uuid;
/// Epoch milliseconds.
pub type Millis = i64;

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name { $(#[serde(rename = $text)] $variant),+ }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            /// Parses the JS spelling; `None` for anything else.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

string_enum!(
    /// Lifecycle of a run. `Waiting`: parked on durable waits (sleep,
    /// signal, token, child), holding no worker slot.
    RunStatus {
        Pending = "pending",
        Running = "running",
        Waiting = "waiting",
        Completed = "completed",
        Failed = "failed",
        TimedOut = "timed_out",
        Canceled = "canceled",
    }
);

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::TimedOut | RunStatus::Canceled
        )
    }
}

string_enum!(
    /// What a waiting run (or one wait step) waits for.
    WaitKind { Sleep = "sleep", Signal = "signal", Token = "token", Child = "child" }
);
string_enum!(ParentClosePolicy { Terminate = "terminate", Cancel = "cancel", Abandon = "abandon" });
string_enum!(TriggerSource { Manual = "manual", Schedule = "schedule", Event = "event", Parent = "parent" });
string_enum!(CollisionMode { Queue = "queue", Reject = "reject", Replace = "replace" });
string_enum!(
    /// How the delay before a retry grows with the attempt number.
    Backoff { Fixed = "fixed", Linear = "linear", Exponential = "exponential" }
);
string_enum!(ReplayFrom { Scratch = "scratch", LastStep = "last_step", LastCheckpoint = "last_checkpoint" });
string_enum!(
    /// A step row's kind: a memoized `ctx.step` or a durable wait.
    StepKind { Task = "task", Wait = "wait" }
);
string_enum!(StepStatus { Pending = "pending", Running = "running", Completed = "completed", Failed = "failed", Skipped = "skipped" });
string_enum!(
    /// How much of a retry's delay is drawn at random, so runs that failed
    /// together do not all retry at the same instant.
    Jitter { None = "none", Full = "full", Equal = "equal" }
);

impl Default for Jitter {
    /// No jitter: the delays of the contract, exactly.
    fn default() -> Self {
        Jitter::None
    }
}

impl Jitter {
    fn is_none(&self) -> bool {
        *self == Jitter::None
    }
}

/// Run-level or step-level retry policy.
///
/// Unknown keys are refused (`deny_unknown_fields`): a misspelt option
/// (`maxDelayMS`) would otherwise be dropped and the policy silently not be
/// the one asked for. The two options the contract does not have are left
/// out of the serialised form while unset, so a definition row written for
/// a seed-shaped policy stays exactly that shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff: Backoff,
    pub base_ms: i64,
    /// Upper bound of the delay before any retry (applied before jitter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Jitter::is_none")]
    pub jitter: Jitter,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_retryable_errors: Option<Vec<String>>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 1,
            backoff: Backoff::Fixed,
            base_ms: 0,
            max_delay_ms: None,
            jitter: Jitter::None,
            non_retryable_errors: None,
        }
    }
}

/// JS `Number.MAX_SAFE_INTEGER`: the backoff cap of the contract.
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;

impl RetryPolicy {
    /// What is wrong with the policy's numbers, if anything (serde has
    /// already refused unknown keys and unknown `backoff`/`jitter` words).
    pub fn problem(&self) -> Option<&'static str> {
        if self.attempts == 0 {
            return Some("retry.attempts must be at least 1");
        }
        if !(0..=MAX_SAFE_INTEGER).contains(&self.base_ms) {
            return Some("retry.baseMs must be an integer between 0 and 2^53 - 1");
        }
        if self
            .max_delay_ms
            .is_some_and(|m| !(0..=MAX_SAFE_INTEGER).contains(&m))
        {
            return Some("retry.maxDelayMs must be an integer between 0 and 2^53 - 1");
        }
        None
    }

    /// The delay before the retry that follows attempt number `attempts`
    /// (1-based) before jitter, its upper bound: fixed → `baseMs`; linear →
    /// `baseMs * attempts`; exponential → `baseMs * 2^(attempts-1)`; then
    /// capped at `maxDelayMs` and at `Number.MAX_SAFE_INTEGER`.
    pub fn backoff_ms(&self, attempts: u32) -> i64 {
        let base = self.base_ms.max(0);
        let grown = match self.backoff {
            Backoff::Fixed => base,
            Backoff::Linear => base
                .checked_mul(i64::from(attempts.max(1)))
                .unwrap_or(MAX_SAFE_INTEGER),
            Backoff::Exponential => {
                let exp = attempts.saturating_sub(1);
                // No base, no delay, however many attempts (2^exp × 0).
                if base == 0 {
                    0
                } else if exp >= 53 {
                    MAX_SAFE_INTEGER
                } else {
                    base.checked_mul(1i64 << exp).unwrap_or(MAX_SAFE_INTEGER)
                }
            }
        };
        let capped = grown.min(MAX_SAFE_INTEGER);
        match self.max_delay_ms {
            Some(max) => capped.min(max.max(0)),
            None => capped,
        }
    }

    /// The delay actually waited before that retry: `backoff_ms` with the
    /// policy's jitter, where `draw(n)` is a uniform integer in `[0, n]`
    /// (the engine's random source). With `d = backoff_ms(attempts)`:
    /// none → `d`; full → uniform in `[0, d]`; equal → `ceil(d/2)` plus
    /// uniform in `[0, floor(d/2)]`, so in `[d/2, d]`. Never above `d`, so
    /// `maxDelayMs` bounds it too.
    pub fn delay_ms(&self, attempts: u32, draw: impl FnOnce(u64) -> u64) -> i64 {
        let d = self.backoff_ms(attempts);
        // `d` is in [0, 2^53): the conversions below cannot lose anything.
        let du = d.max(0) as u64;
        match self.jitter {
            Jitter::None => d,
            Jitter::Full => draw(du).min(du) as i64,
            Jitter::Equal => {
                let half = du / 2;
                ((du - half) + draw(half).min(half)) as i64
            }
        }
    }

    /// Whether an error with this `name`/`code` may be retried at all.
    pub fn allows(&self, name: Option<&str>, code: Option<&str>) -> bool {
        let Some(list) = &self.non_retryable_errors else {
            return true;
        };
        !list
            .iter()
            .any(|n| Some(n.as_str()) == name || Some(n.as_str()) == code)
    }
}

/// How a key of a definition is produced.
#[derive(Debug, Clone)]
pub enum KeySpec {
    Template(KeyTemplate),
    /// A JS function: only the registering process can evaluate it, and it
    /// passes the evaluated key with `start`.
    Function,
}

impl KeySpec {
    pub fn stored(&self) -> &str {
        match self {
            KeySpec::Template(t) => t.source(),
            KeySpec::Function => "<fn>",
        }
    }
}

/// The job definition row (one per job type).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobDefinition {
    #[serde(rename = "type")]
    pub job_type: Arc<str>,
    pub version: i32,
    pub pool: Arc<str>,
    pub scope_entity_type: Option<String>,
    pub retry_policy: RetryPolicy,
    pub timeout_ms: Option<i64>,
    #[serde(serialize_with = "ser_key_spec")]
    pub concurrency_key_template: Option<KeySpec>,
    pub collision_mode: CollisionMode,
    #[serde(serialize_with = "ser_key_spec")]
    pub dedupe_key_template: Option<KeySpec>,
    pub dedupe_window_ms: Option<i64>,
    pub priority_default: i32,
    pub replay_from: ReplayFrom,
    pub created_at: Millis,
    pub updated_at: Millis,
}

fn ser_key_spec<S: serde::Serializer>(k: &Option<KeySpec>, s: S) -> Result<S::Ok, S::Error> {
    match k {
        Some(k) => s.serialize_str(k.stored()),
        None => s.serialize_none(),
    }
}

/// What `registerHandler` / `upsertJobRows` says about a job type.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DefinitionSpec {
    #[serde(rename = "type")]
    pub job_type: String,
    pub pool: Option<String>,
    pub scope_entity_type: Option<String>,
    pub retry: Option<RetryPolicy>,
    pub timeout_ms: Option<i64>,
    /// A `{{field}}` template, or `"<fn>"` for a JS key function.
    pub concurrency_key: Option<String>,
    pub collision_mode: Option<CollisionMode>,
    pub dedupe_key: Option<String>,
    pub dedupe_window_ms: Option<i64>,
    pub replay_from: Option<ReplayFrom>,
    pub priority_default: Option<i32>,
    /// When the caller registered it (the definition's `createdAt` /
    /// `updatedAt`), if the write happens later (Postgres writes in the
    /// background); `None` = now.
    pub registered_at: Option<Millis>,
}

/// Serialised error of a failed attempt or step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunError {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    pub retryable: bool,
    pub attempt: u32,
}

/// An optional instant in 8 bytes (`Option<i64>` takes 16): `i64::MIN`,
/// far outside any time the engine stores, stands for "none".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptMillis(i64);

impl OptMillis {
    pub const NONE: OptMillis = OptMillis(i64::MIN);

    pub fn get(self) -> Option<Millis> {
        (self.0 != i64::MIN).then_some(self.0)
    }
}

impl From<Option<Millis>> for OptMillis {
    fn from(v: Option<Millis>) -> Self {
        OptMillis(v.map_or(i64::MIN, |ms| ms.max(i64::MIN + 1)))
    }
}

impl From<Millis> for OptMillis {
    fn from(ms: Millis) -> Self {
        Some(ms).into()
    }
}

impl Serialize for OptMillis {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

/// What an attempt left on a run: its output, or its error.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    pub output: Option<Box<RawValue>>,
    pub error: Option<RunError>,
}

/// The fields most runs leave empty, boxed together: a plain run pays one
/// pointer for all of them (the in-memory store holds every live run, so
/// the row's size is most of the memory per run).
#[derive(Debug, Clone, Default)]
pub struct RunExtras {
    pub parent_run_id: Option<RunId>,
    /// The tree's root when it is not the run itself (children only).
    pub root_run_id: Option<RunId>,
    pub scope_entity_type: Option<Box<str>>,
    pub scope_entity_id: Option<Box<str>>,
    /// `None` = `{}`.
    pub tags: Option<Box<RawValue>>,
    pub concurrency_key: Option<Box<str>>,
    pub dedupe_key: Option<Box<str>>,
    pub trigger_ref: Option<Box<str>>,
    /// Position in the concurrency lane when a replay moved the run to the
    /// lane's tail (`None`: its `seq`). Only lane members (runs with a key,
    /// which have extras anyway) have a lane position that matters.
    pub lane_seq: Option<u64>,
    /// The wait steps (`ctx.invoke`: run, step id) this run's end
    /// resolves: its parent's, or another run's whose invoke was answered
    /// by this run as a dedupe hit. Empty for a run nobody waits on.
    pub awaited_by: Vec<(RunId, Box<str>)>,
}

impl RunExtras {
    fn is_empty(&self) -> bool {
        self.parent_run_id.is_none()
            && self.root_run_id.is_none()
            && self.scope_entity_type.is_none()
            && self.scope_entity_id.is_none()
            && self.tags.is_none()
            && self.concurrency_key.is_none()
            && self.dedupe_key.is_none()
            && self.trigger_ref.is_none()
            && self.lane_seq.is_none()
            && self.awaited_by.is_empty()
    }

    /// `None` when every field is empty (no allocation for a plain run).
    pub fn boxed(self) -> Option<Box<RunExtras>> {
        (!self.is_empty()).then(|| Box::new(self))
    }
}

/// One run. The JS row (field order of the contract) is produced by its
/// `Serialize` impl; the rare fields live in [`RunExtras`].
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: RunId,
    pub job_type: Arc<str>,
    pub job_version: i32,
    pub parent_close_policy: ParentClosePolicy,
    pub tenant_id: Option<Arc<str>>,
    pub pool: Arc<str>,
    pub priority: i32,
    pub status: RunStatus,
    pub input: Box<RawValue>,
    /// Output and error (`None` while a run has neither, as pending runs do).
    pub result: Option<Box<RunResult>>,
    pub trigger_source: TriggerSource,
    pub run_at: Millis,
    pub started_at: OptMillis,
    pub finished_at: OptMillis,
    pub claimed_at: OptMillis,
    pub attempts: u32,
    /// What a `waiting` run waits for (the first of its open waits).
    pub wait_kind: Option<WaitKind>,
    /// When a `waiting` run resumes at the latest (the earliest deadline of
    /// its open waits); none while it waits only for a signal, a token or a
    /// child without a timeout.
    pub wait_deadline: OptMillis,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Parent, root, scope, tags, keys, trigger ref (`None` = all empty).
    pub extras: Option<Box<RunExtras>>,
    /// Created order; breaks claim ties. Not part of the JS row.
    pub seq: u64,
    /// Incremented on every claim so a late outcome of an earlier attempt
    /// cannot be applied to a later one. Not part of the JS row.
    pub claim_epoch: u32,
    /// True while a `tick` is executing the current claim.
    pub executing: bool,
}

impl RunRow {
    pub fn output(&self) -> Option<&RawValue> {
        self.result.as_ref().and_then(|x| x.output.as_deref())
    }
    pub fn error(&self) -> Option<&RunError> {
        self.result.as_ref().and_then(|x| x.error.as_ref())
    }
    /// Sets output and error together (`None, None` frees the box).
    pub fn set_result(&mut self, output: Option<Box<RawValue>>, error: Option<RunError>) {
        self.result =
            (output.is_some() || error.is_some()).then(|| Box::new(RunResult { output, error }));
    }
    /// Replaces the error, keeping the output.
    pub fn set_error(&mut self, error: Option<RunError>) {
        let output = self.result.take().and_then(|r| r.output);
        self.set_result(output, error);
    }
    pub fn parent_run_id(&self) -> Option<RunId> {
        self.extras.as_ref().and_then(|x| x.parent_run_id)
    }
    /// The root of the run's tree (the run itself for a root run).
    pub fn root_run_id(&self) -> RunId {
        self.extras
            .as_ref()
            .and_then(|x| x.root_run_id)
            .unwrap_or(self.id)
    }
    pub fn scope_entity_type(&self) -> Option<&str> {
        self.extras
            .as_ref()
            .and_then(|x| x.scope_entity_type.as_deref())
    }
    pub fn scope_entity_id(&self) -> Option<&str> {
        self.extras
            .as_ref()
            .and_then(|x| x.scope_entity_id.as_deref())
    }
    pub fn tags(&self) -> Option<&RawValue> {
        self.extras.as_ref().and_then(|x| x.tags.as_deref())
    }
    /// Position in the concurrency lane: `seq`, unless a replay moved the
    /// run to the lane's tail. Not part of the JS row.
    pub fn lane_seq(&self) -> u64 {
        self.extras
            .as_ref()
            .and_then(|e| e.lane_seq)
            .unwrap_or(self.seq)
    }

    /// Moves the run in its lane (a replay). A run without a concurrency
    /// key is in no lane: its position stays `seq`.
    pub fn set_lane_seq(&mut self, lane_seq: u64) {
        let seq = self.seq;
        if let Some(e) = self.extras.as_mut() {
            if e.concurrency_key.is_some() {
                e.lane_seq = (lane_seq != seq).then_some(lane_seq);
            }
        }
    }

    pub fn concurrency_key(&self) -> Option<&str> {
        self.extras
            .as_ref()
            .and_then(|x| x.concurrency_key.as_deref())
    }
    pub fn dedupe_key(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|x| x.dedupe_key.as_deref())
    }
    pub fn trigger_ref(&self) -> Option<&str> {
        self.extras.as_ref().and_then(|x| x.trigger_ref.as_deref())
    }
    /// The wait steps this run's end resolves (see `RunExtras::awaited_by`).
    pub fn awaited_by(&self) -> &[(RunId, Box<str>)] {
        self.extras.as_ref().map_or(&[], |x| &x.awaited_by)
    }
    /// A waiting run's wait resolved: pending, due `now`. The one place a
    /// resumption changes a row (a networked store's set-based resume,
    /// `StoreTx::resume_due`, writes the same fields).
    pub fn resume_now(&mut self, now: Millis) {
        self.status = RunStatus::Pending;
        self.run_at = now;
        self.clear_wait();
        self.updated_at = now;
    }

    /// Whether the execution of claim `epoch` may still act for the run
    /// (steps, waits, children, its outcome): it is running it, or it
    /// parked and its handler goes on — it awaited other work besides its
    /// waits — while nothing has resumed the run yet. Once a wait resumed
    /// it, the next claim (a new epoch) decides. The one test of "is this
    /// attempt still current".
    pub fn executes(&self, epoch: u32) -> bool {
        self.claim_epoch == epoch && matches!(self.status, RunStatus::Running | RunStatus::Waiting)
    }

    /// Forgets what the run waited for (it resumed, or ended).
    pub fn clear_wait(&mut self) {
        self.wait_kind = None;
        self.wait_deadline = OptMillis::NONE;
    }
}

impl Serialize for RunRow {
    /// The JS row: contract field names and order, `null` for absent.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self;
        let mut m = s.serialize_map(Some(RUN_FIELDS.len() + 3))?;
        m.serialize_entry("id", &r.id)?;
        m.serialize_entry("jobType", &*r.job_type)?;
        m.serialize_entry("jobVersion", &r.job_version)?;
        m.serialize_entry("parentRunId", &r.parent_run_id())?;
        m.serialize_entry("rootRunId", &r.root_run_id())?;
        m.serialize_entry("parentClosePolicy", &r.parent_close_policy)?;
        m.serialize_entry("scopeEntityType", &r.scope_entity_type())?;
        m.serialize_entry("scopeEntityId", &r.scope_entity_id())?;
        m.serialize_entry("tenantId", &r.tenant_id)?;
        m.serialize_entry("tags", &TagsRef(r.tags()))?;
        m.serialize_entry("pool", &*r.pool)?;
        m.serialize_entry("priority", &r.priority)?;
        m.serialize_entry("concurrencyKey", &r.concurrency_key())?;
        m.serialize_entry("dedupeKey", &r.dedupe_key())?;
        m.serialize_entry("status", &r.status)?;
        m.serialize_entry("input", &r.input)?;
        m.serialize_entry("output", &r.output())?;
        m.serialize_entry("error", &r.error())?;
        m.serialize_entry("triggerSource", &r.trigger_source)?;
        m.serialize_entry("triggerRef", &r.trigger_ref())?;
        m.serialize_entry("runAt", &r.run_at)?;
        m.serialize_entry("startedAt", &r.started_at)?;
        m.serialize_entry("finishedAt", &r.finished_at)?;
        m.serialize_entry("claimedAt", &r.claimed_at)?;
        m.serialize_entry("attempts", &r.attempts)?;
        m.serialize_entry("waitKind", &r.wait_kind)?;
        // The token is never stored, and its hash is not the row's business.
        m.serialize_entry("resumeToken", &())?;
        m.serialize_entry("waitDeadline", &r.wait_deadline)?;
        m.serialize_entry("createdAt", &r.created_at)?;
        m.serialize_entry("updatedAt", &r.updated_at)?;
        m.end()
    }
}

struct TagsRef<'a>(Option<&'a RawValue>);

impl Serialize for TagsRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(t) => t.serialize(s),
            None => s.serialize_map(Some(0))?.end(),
        }
    }
}

impl RunRow {
    /// The row as a JSON object with the contract's field names.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| "null".to_owned())
    }

    /// The row as a JSON array in [`RUN_FIELDS`] order: the wire form for
    /// JS, which parses about half the bytes and builds the object with a
    /// fixed shape. `resumeToken` is always null and is not sent.
    pub fn to_compact_json(&self) -> String {
        serde_json::to_string(&CompactRow(self)).unwrap_or_else(|_| "null".to_owned())
    }
}

/// Field order of [`RunRow::to_compact_json`].
pub const RUN_FIELDS: [&str; 29] = [
    "id",
    "jobType",
    "jobVersion",
    "parentRunId",
    "rootRunId",
    "parentClosePolicy",
    "scopeEntityType",
    "scopeEntityId",
    "tenantId",
    "tags",
    "pool",
    "priority",
    "concurrencyKey",
    "dedupeKey",
    "status",
    "input",
    "output",
    "error",
    "triggerSource",
    "triggerRef",
    "runAt",
    "startedAt",
    "finishedAt",
    "claimedAt",
    "attempts",
    "waitKind",
    "waitDeadline",
    "createdAt",
    "updatedAt",
];

struct CompactRow<'a>(&'a RunRow);

impl Serialize for CompactRow<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let r = self.0;
        let mut q = s.serialize_seq(Some(RUN_FIELDS.len()))?;
        q.serialize_element(&r.id)?;
        q.serialize_element(&*r.job_type)?;
        q.serialize_element(&r.job_version)?;
        q.serialize_element(&r.parent_run_id())?;
        q.serialize_element(&r.root_run_id())?;
        q.serialize_element(&r.parent_close_policy)?;
        q.serialize_element(&r.scope_entity_type())?;
        q.serialize_element(&r.scope_entity_id())?;
        q.serialize_element(&r.tenant_id)?;
        q.serialize_element(&TagsRef(r.tags()))?;
        q.serialize_element(&*r.pool)?;
        q.serialize_element(&r.priority)?;
        q.serialize_element(&r.concurrency_key())?;
        q.serialize_element(&r.dedupe_key())?;
        q.serialize_element(&r.status)?;
        q.serialize_element(&r.input)?;
        q.serialize_element(&r.output())?;
        q.serialize_element(&r.error())?;
        q.serialize_element(&r.trigger_source)?;
        q.serialize_element(&r.trigger_ref())?;
        q.serialize_element(&r.run_at)?;
        q.serialize_element(&r.started_at)?;
        q.serialize_element(&r.finished_at)?;
        q.serialize_element(&r.claimed_at)?;
        q.serialize_element(&r.attempts)?;
        q.serialize_element(&r.wait_kind)?;
        q.serialize_element(&r.wait_deadline)?;
        q.serialize_element(&r.created_at)?;
        q.serialize_element(&r.updated_at)?;
        q.end()
    }
}

/// One memoized step of a run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRow {
    pub id: Uuid,
    pub job_run_id: RunId,
    pub step_id: Box<str>,
    pub kind: StepKind,
    pub seq: u32,
    pub status: StepStatus,
    pub input: Option<Box<RawValue>>,
    pub output: Option<Box<RawValue>>,
    pub error: Option<Box<RunError>>,
    pub attempts: u32,
    // An enum and 8-byte instants: a parked run's wait row is most of what
    // it holds beyond a pending run (152 → 120 bytes a row).
    pub started_at: OptMillis,
    pub finished_at: OptMillis,
    /// Claim epoch of the attempt that last started the step.
    #[serde(skip)]
    pub epoch: u32,
}

string_enum!(
    /// What happened to a run: one entry of its timeline (`RunEvent`).
    EventKind {
        Created = "created",
        Started = "started",
        StepStarted = "step_started",
        StepCompleted = "step_completed",
        StepFailed = "step_failed",
        RetryScheduled = "retry_scheduled",
        Waiting = "waiting",
        Resumed = "resumed",
        Released = "released",
        Rescheduled = "rescheduled",
        Canceled = "canceled",
        TimedOut = "timed_out",
        Completed = "completed",
        Failed = "failed",
        Replayed = "replayed",
    }
);

/// One transition of a run, as its timeline keeps it. Written by the
/// engine in the transaction of the change (`engine/timeline.rs`); the
/// store numbers it (`id`, increasing in the order a run's events
/// happened) and deletes it with its run.
#[derive(Debug, Clone)]
pub struct RunEvent {
    /// The store's number; 0 for `created`, which is the run row itself
    /// (its `createdAt` and trigger), not a stored entry.
    pub id: u64,
    pub run: RunId,
    pub at: Millis,
    pub kind: EventKind,
    /// The attempt it belongs to (1 for the first; the run's attempts so
    /// far for events between attempts).
    pub attempt: u32,
    /// What is particular to the kind (a step id, a delay, a reason), as a
    /// JSON object; `None` when there is nothing.
    pub data: Option<Box<RawValue>>,
}

/// What a wait step waits for: stored as the step row's `input`, so a
/// replay of the handler (or another process) finds it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "wait",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum WaitSpec {
    /// Until an instant.
    Sleep { until: Millis },
    /// The next signal of this name sent to the run.
    Signal {
        signal: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Millis>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<i64>,
    },
    /// A `resume` with the token whose SHA-256 this is (hex); the token
    /// itself is never stored.
    Token {
        token_hash: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Millis>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<i64>,
    },
    /// The end of a child run (`ctx.invoke`).
    Child {
        child_run_id: RunId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<Millis>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<i64>,
    },
}

impl WaitSpec {
    pub fn kind(&self) -> WaitKind {
        match self {
            WaitSpec::Sleep { .. } => WaitKind::Sleep,
            WaitSpec::Signal { .. } => WaitKind::Signal,
            WaitSpec::Token { .. } => WaitKind::Token,
            WaitSpec::Child { .. } => WaitKind::Child,
        }
    }

    /// When the wait resolves on its own: a sleep's end, a timeout.
    pub fn deadline(&self) -> Option<Millis> {
        match self {
            WaitSpec::Sleep { until } => Some(*until),
            WaitSpec::Signal { deadline, .. }
            | WaitSpec::Token { deadline, .. }
            | WaitSpec::Child { deadline, .. } => *deadline,
        }
    }

    pub fn timeout_ms(&self) -> Option<i64> {
        match self {
            WaitSpec::Sleep { .. } => None,
            WaitSpec::Signal { timeout_ms, .. }
            | WaitSpec::Token { timeout_ms, .. }
            | WaitSpec::Child { timeout_ms, .. } => *timeout_ms,
        }
    }

    /// The wait a step row holds, if it is a wait step.
    pub fn of_step(step: &StepRow) -> Option<WaitSpec> {
        if step.kind != StepKind::Wait {
            return None;
        }
        serde_json::from_str(step.input.as_deref()?.get()).ok()
    }

    pub fn to_raw(&self) -> Box<RawValue> {
        serde_json::value::to_raw_value(self).unwrap_or_else(|_| empty_object())
    }
}

impl StepRow {
    /// A wait step not resolved yet: open (`running`), or a token being
    /// delivered (`pending`).
    pub fn is_open_wait(&self) -> bool {
        self.kind == StepKind::Wait
            && matches!(self.status, StepStatus::Pending | StepStatus::Running)
    }
}

/// Tenant argument of a call: JS `undefined`, `null` or a string.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TenantArg {
    #[default]
    Missing,
    Null,
    Id(String),
}

impl TenantArg {
    pub fn from_option(v: Option<Option<String>>) -> Self {
        match v {
            None => TenantArg::Missing,
            Some(None) => TenantArg::Null,
            Some(Some(s)) => TenantArg::Id(s),
        }
    }
}

/// A key value computed by the caller (a JS key function's result).
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub job_type: String,
    /// Validated JSON text of the input (`{}` when absent).
    pub input: Box<RawValue>,
    pub tenant: TenantArg,
    /// Explicit `opts.scope`.
    pub scope: Option<(String, String)>,
    /// `meta.scope.from(input)`, evaluated by the registering process; used
    /// with the definition's scope entity when `scope` is absent.
    pub scope_entity_id_from_meta: Option<String>,
    pub pool: Option<String>,
    pub run_at: Option<Millis>,
    pub priority: Option<i32>,
    pub tags: Option<Box<RawValue>>,
    pub trigger_source: Option<TriggerSource>,
    pub trigger_ref: Option<String>,
    pub parent_close_policy: Option<ParentClosePolicy>,
    pub parent_run_id: Option<String>,
    pub concurrency_key: Option<String>,
    pub dedupe_key: Option<String>,
    /// The wait (`ctx.invoke`: run, step id) the new run's end resolves.
    pub awaited_by: Option<(RunId, String)>,
    /// Concurrency keys the new run may not take: the lanes its invoking
    /// run and that run's live ancestors hold (a child queued behind a run
    /// that waits for it would never run).
    pub lane_guard: Vec<String>,
    /// Id and creation time chosen by the caller (a JS start buffered and
    /// flushed in a batch, see `Engine::start_plain_batch`); `None` = the engine's.
    pub preset: Option<(RunId, Millis)>,
}

/// A start with no options and a caller-chosen id and time: what JS
/// buffers for `Engine::start_batch`.
#[derive(Debug)]
pub struct PlainStart<'a> {
    pub id: RunId,
    pub at: Millis,
    pub job_type: &'a str,
    /// Validated JSON text of the input.
    pub input: Box<RawValue>,
}

/// Options that only set fields of the new run: nothing to look up
/// (no parent, no key, no scope left to the definition's key function).
/// Checked already (`StartOpts::checked` in the binding).
#[derive(Debug, Clone, Default)]
pub struct RowOptions {
    pub tenant: TenantArg,
    pub scope: Option<(String, String)>,
    pub pool: Option<String>,
    pub run_at: Option<Millis>,
    pub priority: Option<i32>,
    pub tags: Option<Box<RawValue>>,
    pub trigger_source: Option<TriggerSource>,
    pub trigger_ref: Option<String>,
    pub parent_close_policy: Option<ParentClosePolicy>,
}

impl RowOptions {
    /// Moves the options into a request (the full `start` rules then apply).
    pub fn apply_to(self, req: &mut StartRequest) {
        req.tenant = self.tenant;
        req.scope = self.scope;
        req.pool = self.pool;
        req.run_at = self.run_at;
        req.priority = self.priority;
        req.tags = self.tags;
        req.trigger_source = self.trigger_source;
        req.trigger_ref = self.trigger_ref;
        req.parent_close_policy = self.parent_close_policy;
    }
}

/// A start JS answered before the engine had it (see `Engine::start_batch`):
/// one with no options; one whose options only set fields of its row; or
/// one with any options (its `preset` set).
#[derive(Debug)]
pub enum BufferedStart<'a> {
    Plain(PlainStart<'a>),
    RowOptions(PlainStart<'a>, Box<RowOptions>),
    WithOptions(Box<StartRequest>),
}

/// What became of a handler invocation.
#[derive(Debug, Clone)]
pub enum AttemptOutcome {
    /// Resolved; JSON text of the output (`None` → `{}`).
    Completed(Option<Box<RawValue>>),
    /// Threw or rejected.
    Failed(FailureInfo),
    /// The attempt's `timeoutMs` elapsed.
    TimedOut { timeout_ms: i64 },
    /// No handler is registered in this process for the run's type.
    NoHandler,
    /// The handler is blocked only on durable waits: the run parks
    /// (`waiting`) until one of them resolves. Not an attempt's end.
    Parked,
}

#[derive(Debug, Clone, Default)]
pub struct FailureInfo {
    pub message: String,
    pub stack: Option<String>,
    pub name: Option<String>,
    pub code: Option<String>,
}

/// Why a running handler's signal fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    Canceled,
    TimedOut,
}

impl AbortReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AbortReason::Canceled => "canceled",
            AbortReason::TimedOut => "timed_out",
        }
    }
}

pub fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).unwrap_or_else(|_| unreachable_raw())
}

fn unreachable_raw() -> Box<RawValue> {
    // "{}" and "null" are valid JSON; this path exists only to avoid unwrap.
    serde_json::value::to_raw_value(&serde_json::Value::Null).unwrap_or_default()
}

// ── schedules ──────────────────────────────────────────────────────────

/// When a schedule fires: a cron expression read as wall-clock time in a
/// time zone (UTC by default), or a fixed interval counted from the
/// schedule's anchor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleTiming {
    Cron(crate::cron::CronSchedule, crate::cron::Tz),
    Every(Millis),
}

impl ScheduleTiming {
    /// Whether both fire at the same times: a cron expression written
    /// otherwise (`mon-fri`, `1-5`, `@daily`) is the same timing.
    pub fn same_times(&self, other: &ScheduleTiming) -> bool {
        match (self, other) {
            (ScheduleTiming::Cron(a, tz_a), ScheduleTiming::Cron(b, tz_b)) => {
                tz_a == tz_b && a.same_times(b)
            }
            (ScheduleTiming::Every(a), ScheduleTiming::Every(b)) => a == b,
            _ => false,
        }
    }

    /// The first fire time strictly after `after`; `anchor` is the phase of
    /// an interval (it fires at anchor + k × interval). None: never again.
    pub fn next_after(&self, after: Millis, anchor: Millis) -> Option<Millis> {
        // Past the largest JS Date there is no fire time a row could show.
        let t = match self {
            ScheduleTiming::Cron(c, tz) => c.next_after_in(after, *tz),
            ScheduleTiming::Every(every) => {
                let every = (*every).max(1);
                // O(1): the number of whole intervals since the anchor.
                let k = if after < anchor {
                    0
                } else {
                    (after - anchor) / every + 1
                };
                anchor.checked_add(k.checked_mul(every)?)
            }
        }?;
        (t <= crate::clock::MAX_TIME_MS).then_some(t)
    }
}

/// A recurring start: each time it fires, a run of `job_type` with `input`
/// is started (trigger source `schedule`, trigger ref the schedule's name,
/// `runAt` the fire time). Identified by (tenant, name).
#[derive(Debug, Clone)]
pub struct ScheduleRow {
    pub name: String,
    pub tenant_id: Option<Arc<str>>,
    pub job_type: String,
    pub input: Box<RawValue>,
    pub timing: ScheduleTiming,
    /// Phase of an interval; the creation time of the timing.
    pub anchor: Millis,
    /// When it fires next; None once it can never fire again.
    pub next_fire_at: Option<Millis>,
    /// When it last fired (the fire time that was due), and what came of it.
    pub last_fired_at: Option<Millis>,
    pub last_run_id: Option<RunId>,
    pub last_error: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// What `Engine::put_schedule` is asked for.
#[derive(Debug)]
pub struct ScheduleSpec {
    pub name: String,
    pub tenant: TenantArg,
    pub job_type: String,
    /// Validated JSON text of the input (`{}` when absent).
    pub input: Box<RawValue>,
    pub cron: Option<String>,
    /// IANA name the cron fields are read in (`None`: UTC).
    pub timezone: Option<String>,
    pub every_ms: Option<i64>,
}
