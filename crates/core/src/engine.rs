//! The orchestration rules of CONTRACT.md, written once over [`StoreTx`].
//!
//! Every public operation runs in one store transaction. Rules check
//! everything that can fail before they change anything, so an error
//! leaves the store as it was.

use crate::clock::{clamp_time, Clock, ClockKind};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{PageQuery, Store, StoreTx};
use crate::template::{InputFields, KeyTemplate};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    pub multi_tenant: bool,
    pub clock: ClockKind,
    /// How long terminal runs are kept. Default: forever.
    pub retention: Retention,
}

/// How long terminal runs (and their steps) are kept before they are
/// deleted. `None` keeps them forever. Purging happens as part of later
/// transitions, amortised O(log n) per purged run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Completed runs, counted from `finishedAt`.
    pub completed_ms: Option<i64>,
    /// Failed, timed-out and canceled runs, counted from `finishedAt`.
    pub failed_ms: Option<i64>,
}

/// Told about transitions that the JS side must act on.
pub trait EngineObserver: Send + Sync {
    /// A run whose handler is executing was canceled or timed out: its
    /// `ctx.signal` must fire, if the attempt executing is `epoch` (`None`:
    /// whichever is; a cancel notified by an older process). A run claimed
    /// but not executing yet gets a notice too, which no later attempt of it
    /// may take for its own.
    fn run_aborted(&self, run_id: RunId, epoch: Option<u32>, reason: AbortReason);

    /// Runs that ended (completed, failed, timed out, canceled) or were put
    /// back for a retry, in transition order. Only sent while events are
    /// enabled (`Engine::set_events`).
    fn run_events(&self, _rows: Vec<RunRow>) {}
}

/// Runs a handler for one attempt. Implemented by the binding (a
/// threadsafe-function call into JS) and by tests.
pub trait HandlerExecutor: Send + Sync {
    fn execute(&self, ticket: &AttemptTicket) -> impl Future<Output = AttemptOutcome> + Send;
}

/// What `tick` hands the executor.
#[derive(Debug, Clone)]
pub struct AttemptTicket {
    pub run: RunRow,
    /// Claim epoch: step calls of this attempt must present it.
    pub epoch: u32,
    pub timeout_ms: Option<i64>,
}

/// Result of `ctx.step` begin.
#[derive(Debug, Clone)]
pub enum StepBegin {
    /// A completed row exists: return its output, do not call `fn`.
    Memoized(Option<Box<RawValue>>),
    /// The step was recorded `running`; this is its attempt number.
    Started { attempt: u32 },
}

/// Filters of `list_for_scope`.
#[derive(Debug, Clone)]
pub struct ScopeQuery {
    pub statuses: Option<Vec<RunStatus>>,
    pub job_type: Option<String>,
    pub limit: usize,
    pub offset: usize,
    /// Oldest first when true; newest first (default) otherwise.
    pub ascending: bool,
}

/// Keyset position `(createdAt, id)` of the last row of a page.
pub type PageCursor = (Millis, u128);

/// Filters of `list_job_runs`.
#[derive(Debug, Clone, Default)]
pub struct JobRunQuery {
    pub pool: Option<String>,
    pub root_run_id: Option<String>,
    /// Any of these statuses (`None`: every status; empty: no row).
    pub statuses: Option<Vec<RunStatus>>,
    pub since: Option<Millis>,
    /// Exclusive upper `(createdAt, id)` bound from the previous page.
    pub cursor: Option<(Millis, u128)>,
    pub limit: usize,
}

/// Input of `record_step` (the step service's upsert).
#[derive(Debug, Clone)]
pub struct RecordStep {
    pub job_run_id: String,
    pub step_id: String,
    pub seq: u32,
    pub status: StepStatus,
    pub input: Option<Box<RawValue>>,
    pub output: Option<Box<RawValue>>,
    pub error: Option<RunError>,
    pub attempts: Option<u32>,
    pub started_at: Option<Millis>,
    pub finished_at: Option<Millis>,
}

struct InFlight {
    epoch: u32,
    abort: Arc<Notify>,
}

pub struct Engine<S: Store> {
    store: S,
    clock: Arc<Clock>,
    multi_tenant: bool,
    retention: Retention,
    observer: RwLock<Option<Arc<dyn EngineObserver>>>,
    in_flight: Mutex<HashMap<RunId, InFlight>>,
    /// Wakes an idle worker scheduler when something may have become
    /// claimable or its next due time may have moved.
    activity: Arc<Notify>,
    /// Set by a worker while it waits with free slots: only then do
    /// transitions pay for a wake-up.
    worker_hungry: AtomicBool,
    /// The pools with a free slot while the worker waits (`None` = any):
    /// a start into a full pool does not wake it.
    hungry_pools: RwLock<Option<Vec<Arc<str>>>>,
    events_enabled: AtomicBool,
    /// Runs someone waits for (`waitForRun`): their transitions are sent
    /// even when events are off. Reference-counted per run.
    watched: Mutex<HashMap<RunId, usize>>,
    watched_any: AtomicBool,
    /// A schedule was created, changed or removed: whoever fires schedules
    /// re-reads the earliest next fire.
    schedules_changed: Arc<Notify>,
}

/// What `start` did.
#[derive(Debug)]
pub enum Started {
    /// The new run, or the dedupe hit (an existing run).
    Row(Box<RunRow>),
    /// A new run, when the caller did not ask for its row.
    Created {
        id: RunId,
        at: Millis,
        pool: Arc<str>,
    },
}

/// Side effects collected inside a transaction and delivered after it.
#[derive(Default)]
struct Effects {
    /// Attempts stopped: run, claim epoch, why.
    aborted: Vec<(RunId, Option<u32>, AbortReason)>,
    /// Rows after a terminal or retry transition (only with events on).
    transitions: Vec<RunRow>,
    /// Something may have become claimable for a waiting worker (a lane
    /// moved, a run was canceled or scheduled for a retry). A plain
    /// completion frees nothing a worker waits for: its own slot is
    /// refilled by whoever reports the outcome.
    wake: bool,
}

/// A claim: running from `now`, with a new epoch so outcomes of earlier
/// attempts can no longer apply; `executing` when the attempt opens at once.
/// An attempt outcome `finish_in` applied.
struct Finished {
    /// The updated row, when the caller asked for it (or it was copied anyway).
    row: Option<RunRow>,
    /// The run is in a concurrency lane (its end may free the next member).
    lane: bool,
    /// The run went back to pending for a retry.
    pending: bool,
}

impl Finished {
    fn of(row: RunRow) -> Self {
        Finished {
            lane: row.concurrency_key().is_some(),
            pending: row.status == RunStatus::Pending,
            row: Some(row),
        }
    }

    /// Whether the scheduler may have something new to claim.
    fn frees_lane_or_retries(&self) -> bool {
        self.lane || self.pending
    }
}

fn mark_claimed(r: &mut RunRow, now: Millis, executing: bool) {
    r.status = RunStatus::Running;
    r.claimed_at = now.into();
    r.started_at = now.into();
    r.updated_at = now;
    r.claim_epoch = r.claim_epoch.wrapping_add(1);
    r.executing = executing;
}

/// Shortest and longest interval of an `everyMs` schedule.
const MIN_EVERY_MS: i64 = 10;
const MAX_EVERY_MS: i64 = 10 * 366 * 24 * 60 * 60 * 1000;
/// Due schedules fired per transaction.
const SCHEDULE_BATCH: usize = 64;

fn parse_run_id(id: &str) -> Option<RunId> {
    Uuid::parse_str(id).ok()
}

fn raw(s: String) -> Result<Box<RawValue>> {
    RawValue::from_string(s).map_err(|e| JobError::invalid(format!("not JSON: {e}")))
}

impl<S: Store> Engine<S> {
    pub fn new(store: S, opts: EngineOptions) -> Self {
        if opts.retention != Retention::default() {
            let _ = store.transaction(|tx| {
                tx.set_retention_tracking(true);
                Ok(())
            });
        }
        Engine {
            store,
            clock: Arc::new(Clock::new(opts.clock)),
            multi_tenant: opts.multi_tenant,
            retention: opts.retention,
            observer: RwLock::new(None),
            in_flight: Mutex::new(HashMap::new()),
            activity: Arc::new(Notify::new()),
            worker_hungry: AtomicBool::new(false),
            hungry_pools: RwLock::new(None),
            events_enabled: AtomicBool::new(false),
            watched: Mutex::new(HashMap::new()),
            watched_any: AtomicBool::new(false),
            schedules_changed: Arc::new(Notify::new()),
        }
    }

    /// Adds or removes one watcher of a run's transitions.
    pub fn watch_run(&self, id: RunId, on: bool) {
        let mut w = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        if on {
            *w.entry(id).or_default() += 1;
        } else if let Some(n) = w.get_mut(&id) {
            *n -= 1;
            if *n == 0 {
                w.remove(&id);
            }
        }
        self.watched_any.store(!w.is_empty(), Ordering::SeqCst);
    }

    /// Whether a transition of `id` must be reported.
    fn wants_event(&self, id: &RunId) -> bool {
        if self.events_enabled.load(Ordering::Relaxed) {
            return true;
        }
        self.watched_any.load(Ordering::Relaxed)
            && self
                .watched
                .lock()
                .map(|w| w.contains_key(id))
                .unwrap_or(false)
    }

    /// The notification a worker scheduler waits on.
    pub fn activity(&self) -> Arc<Notify> {
        self.activity.clone()
    }

    /// A worker says whether it is waiting with free slots.
    pub fn set_worker_hungry(&self, hungry: bool) {
        if let Ok(mut p) = self.hungry_pools.write() {
            *p = None;
        }
        self.worker_hungry.store(hungry, Ordering::SeqCst);
    }

    /// A worker says which pools have a free slot while it waits (written
    /// before it looks for work, so a start racing it is seen either way).
    pub fn set_hungry_pools(&self, pools: Vec<Arc<str>>) {
        let any = !pools.is_empty();
        if let Ok(mut p) = self.hungry_pools.write() {
            *p = Some(pools);
        }
        self.worker_hungry.store(any, Ordering::SeqCst);
    }

    /// Wakes a hungry worker (stores a permit if it is between checks).
    pub fn wake_worker(&self) {
        if self.worker_hungry.load(Ordering::SeqCst) {
            self.activity.notify_one();
        }
    }

    /// Wakes a hungry worker if `pool` has a free slot: a start into a full
    /// pool costs no thread wake-up.
    fn wake_worker_for(&self, pool: &str) {
        if !self.worker_hungry.load(Ordering::SeqCst) {
            return;
        }
        let wanted = self
            .hungry_pools
            .read()
            .map(|p| {
                p.as_ref()
                    .is_none_or(|list| list.iter().any(|h| &**h == pool))
            })
            .unwrap_or(true);
        if wanted {
            self.activity.notify_one();
        }
    }

    /// Turns transition events on or off (off costs nothing per run).
    pub fn set_events(&self, enabled: bool) {
        self.events_enabled.store(enabled, Ordering::SeqCst);
    }

    pub fn set_observer(&self, observer: Arc<dyn EngineObserver>) {
        if let Ok(mut o) = self.observer.write() {
            *o = Some(observer);
        }
    }

    /// The store, for inspection (e.g. `MemoryStore::verify_indexes`).
    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn clock(&self) -> &Arc<Clock> {
        &self.clock
    }

    pub fn multi_tenant(&self) -> bool {
        self.multi_tenant
    }

    /// Whether retention deletes finished runs (so a run may be gone while
    /// a late handler of it still runs).
    pub fn purges(&self) -> bool {
        self.retention.completed_ms.is_some() || self.retention.failed_ms.is_some()
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    fn deliver(&self, fx: Effects) {
        if fx.aborted.is_empty() && fx.transitions.is_empty() {
            return;
        }
        let observer = self.observer.read().ok().and_then(|o| o.clone());
        if !fx.transitions.is_empty() {
            if let Some(o) = &observer {
                o.run_events(fx.transitions);
            }
        }
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        for (id, epoch, reason) in fx.aborted {
            // The attempt is over: wake a waiting `tick` and forget it.
            if in_flight
                .get(&id)
                .is_some_and(|f| epoch.is_none_or(|e| f.epoch == e))
            {
                if let Some(f) = in_flight.remove(&id) {
                    f.abort.notify_one();
                }
            }
            if let Some(o) = &observer {
                o.run_aborted(id, epoch, reason);
            }
        }
    }

    /// Reports that a run executing in this process was stopped by another
    /// process (its attempt's outcome will be ignored): the observer fires
    /// the handler's signal. A no-op for runs this process is not running.
    pub fn abort_local(&self, id: RunId, epoch: Option<u32>, reason: AbortReason) {
        self.deliver(Effects {
            aborted: vec![(id, epoch, reason)],
            transitions: Vec::new(),
            wake: false,
        });
    }

    /// Refuses a start whose values the store cannot hold (before anything
    /// changes, e.g. a `replace` lane's incumbent).
    fn storable(&self, req: &StartRequest) -> Result<()> {
        let json = [("input", Some(&*req.input)), ("tags", req.tags.as_deref())];
        for (what, value) in json {
            if let Some(p) = value.and_then(|v| self.store.json_problem(v.get())) {
                return Err(JobError::JobInputInvalid {
                    reason: format!("{what} cannot be stored: it holds {p}"),
                });
            }
        }
        let scope = req.scope.as_ref();
        let tenant = match &req.tenant {
            TenantArg::Id(t) => Some(t.as_str()),
            _ => None,
        };
        let text = [
            ("scope.entityType", scope.map(|s| s.0.as_str())),
            ("scope.entityId", scope.map(|s| s.1.as_str())),
            ("scope entity id", req.scope_entity_id_from_meta.as_deref()),
            ("tenantId", tenant),
            ("triggerRef", req.trigger_ref.as_deref()),
            ("pool", req.pool.as_deref()),
            ("concurrency key", req.concurrency_key.as_deref()),
            ("dedupe key", req.dedupe_key.as_deref()),
        ];
        for (what, value) in text {
            if let Some(p) = value.and_then(|v| self.store.text_problem(v)) {
                return Err(JobError::JobInputInvalid {
                    reason: format!("{what} cannot be stored: it holds {p}"),
                });
            }
        }
        Ok(())
    }

    /// An output the store cannot hold fails the attempt instead (the run
    /// must not stay `running` because its result cannot be written).
    fn storable_outcome(&self, outcome: AttemptOutcome) -> AttemptOutcome {
        let AttemptOutcome::Completed(Some(output)) = &outcome else {
            return outcome;
        };
        match self.store.json_problem(output.get()) {
            None => outcome,
            Some(p) => AttemptOutcome::Failed(FailureInfo {
                message: format!("handler output cannot be stored: it holds {p}"),
                stack: None,
                name: Some("JobOutputInvalidError".to_owned()),
                code: None,
            }),
        }
    }

    /// A store transaction that first purges the runs past their retention
    /// where that costs nothing (see `Store::purges_in_every_call`): no
    /// call then sees, returns or changes a run that is due to be deleted.
    fn write<R>(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R>) -> Result<R> {
        if self.purges() && self.store.purges_in_every_call() {
            let now = self.now();
            self.store.transaction(|tx| {
                self.purge(tx, now);
                f(tx)
            })
        } else {
            self.store.transaction(f)
        }
    }

    /// A read-only store call, after the same purge as `write`.
    fn read<R>(&self, f: impl Fn(&mut S::Tx<'_>) -> Result<R>) -> Result<R> {
        if self.purges() && self.store.purges_in_every_call() {
            let now = self.now();
            self.store.read(|tx| {
                self.purge(tx, now);
                f(tx)
            })
        } else {
            self.store.read(f)
        }
    }

    /// Deletes terminal runs past their retention (no-op when unset).
    fn purge(&self, tx: &mut S::Tx<'_>, now: Millis) {
        let r = self.retention;
        if r.completed_ms.is_some() || r.failed_ms.is_some() {
            tx.purge_finished(
                r.completed_ms.map(|ms| now.saturating_sub(ms)),
                r.failed_ms.map(|ms| now.saturating_sub(ms)),
            );
        }
    }

    /// Whether `purge` at `now` deletes `r` (the same test as
    /// `StoreTx::purge_finished`'s).
    fn past_retention(&self, r: &RunRow, now: Millis) -> bool {
        let Some(finished) = r.finished_at.get() else {
            return false;
        };
        let keep = if r.status == RunStatus::Completed {
            self.retention.completed_ms
        } else {
            self.retention.failed_ms
        };
        keep.is_some_and(|ms| finished <= now.saturating_sub(ms))
    }

    /// Tenant gate of queries and cancel: `None` = no filtering (single
    /// tenant), `Some(t)` = only rows whose tenant is `t`.
    fn gate(&self, method: &str, tenant: &TenantArg) -> Result<Option<Option<String>>> {
        if !self.multi_tenant {
            return Ok(None);
        }
        match tenant {
            TenantArg::Missing => Err(JobError::MissingTenantId {
                method: method.to_owned(),
            }),
            TenantArg::Null => Ok(Some(None)),
            TenantArg::Id(t) => Ok(Some(Some(t.clone()))),
        }
    }

    fn visible(filter: &Option<Option<String>>, row: &RunRow) -> bool {
        match filter {
            None => true,
            Some(t) => t.as_deref() == row.tenant_id.as_deref(),
        }
    }

    // ── definitions ────────────────────────────────────────────────────

    /// Creates or replaces a job definition. O(1).
    pub fn register(&self, spec: DefinitionSpec) -> Result<Arc<JobDefinition>> {
        let mut defs = self.register_all(vec![spec])?;
        defs.pop()
            .ok_or_else(|| JobError::invalid("nothing to register"))
    }

    /// Registers several definitions: all are validated before any is
    /// stored, so one bad entry changes nothing. O(entries).
    pub fn register_all(&self, specs: Vec<DefinitionSpec>) -> Result<Vec<Arc<JobDefinition>>> {
        let validated = self.validate_definitions(specs)?;
        self.write(|tx| {
            Ok(validated
                .into_iter()
                .map(|mut def| {
                    if let Some(old) = tx.definition(&def.job_type) {
                        def.created_at = old.created_at;
                        // A later registration (another process) may have
                        // been written first.
                        def.updated_at = def.updated_at.max(old.updated_at);
                    }
                    tx.put_definition(def)
                })
                .collect())
        })
    }

    /// The definitions `register_all` would store, checked and built but not
    /// stored: a networked store's caller answers at once and writes them
    /// in the background. One bad spec fails them all.
    pub fn validate_definitions(&self, specs: Vec<DefinitionSpec>) -> Result<Vec<JobDefinition>> {
        let now = self.now();
        specs
            .into_iter()
            .map(|s| {
                let job_type = s.job_type.clone();
                let at = s.registered_at.map_or(now, |t| clamp_time(t).min(now));
                // Name the type: one call may register many.
                Self::validate_spec(s, at).map_err(|e| match e {
                    JobError::JobInputInvalid { reason } if !job_type.is_empty() => {
                        JobError::JobInputInvalid {
                            reason: format!("job type '{job_type}': {reason}"),
                        }
                    }
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()
    }

    fn validate_spec(spec: DefinitionSpec, now: Millis) -> Result<JobDefinition> {
        if spec.job_type.is_empty() {
            return Err(JobError::invalid("job type must be a non-empty string"));
        }
        // Runs cross to JS one per line (start batches, worker tickets).
        if spec.job_type.contains('\n') {
            return Err(JobError::invalid("job type must not contain a line break"));
        }
        let pool = spec.pool.unwrap_or_else(|| "batch".to_owned());
        if pool.is_empty() {
            return Err(JobError::invalid("pool must be a non-empty string"));
        }
        if pool.contains('\n') {
            return Err(JobError::invalid("pool must not contain a line break"));
        }
        let retry = spec.retry.unwrap_or_default();
        if retry.attempts == 0 {
            return Err(JobError::invalid("retry.attempts must be at least 1"));
        }
        if retry.base_ms < 0 {
            return Err(JobError::invalid("retry.baseMs must not be negative"));
        }
        if matches!(spec.timeout_ms, Some(t) if t <= 0) {
            return Err(JobError::invalid("timeoutMs must be a positive number"));
        }
        if matches!(spec.dedupe_window_ms, Some(w) if w < 0) {
            return Err(JobError::invalid("dedupe.windowMs must not be negative"));
        }
        let key = |k: Option<String>| -> Result<Option<KeySpec>> {
            match k.as_deref() {
                None => Ok(None),
                Some("<fn>") => Ok(Some(KeySpec::Function)),
                Some(t) => Ok(Some(KeySpec::Template(KeyTemplate::parse(t)?))),
            }
        };
        Ok(JobDefinition {
            job_type: Arc::from(spec.job_type.as_str()),
            version: 1,
            pool: Arc::from(pool.as_str()),
            scope_entity_type: spec.scope_entity_type,
            retry_policy: retry,
            timeout_ms: spec.timeout_ms,
            concurrency_key_template: key(spec.concurrency_key)?,
            collision_mode: spec.collision_mode.unwrap_or(CollisionMode::Queue),
            dedupe_key_template: key(spec.dedupe_key)?,
            dedupe_window_ms: spec.dedupe_window_ms,
            priority_default: spec.priority_default.unwrap_or(0),
            replay_from: spec.replay_from.unwrap_or(ReplayFrom::LastCheckpoint),
            created_at: now,
            updated_at: now,
        })
    }

    pub fn definition(&self, job_type: &str) -> Option<Arc<JobDefinition>> {
        self.read(|tx| Ok(tx.definition(job_type))).ok().flatten()
    }

    /// The checks of `start` that precede key evaluation (tenant gate, job
    /// type). The binding runs them when a JS key function throws, so the
    /// contract's error order holds.
    pub fn start_preflight(
        &self,
        job_type: &str,
        tenant: &TenantArg,
        has_parent: bool,
    ) -> Result<()> {
        if self.multi_tenant && *tenant == TenantArg::Missing && !has_parent {
            return Err(JobError::MissingTenantId {
                method: "start".to_owned(),
            });
        }
        if self.definition(job_type).is_none() {
            return Err(JobError::JobTypeNotFound {
                job_type: job_type.to_owned(),
            });
        }
        Ok(())
    }

    // ── start ──────────────────────────────────────────────────────────

    /// Starts a run (or returns the dedupe hit). O(log n): keyed lookups for
    /// the definition, dedupe list and lane, one insert into each index;
    /// `replace` adds O(runs canceled + their descendants).
    pub fn start(&self, req: StartRequest) -> Result<RunRow> {
        match self.start_with(req, true, true)? {
            Started::Row(row) => Ok(*row),
            // want_row = true never answers without the row.
            Started::Created { id, .. } => self
                .find_by_id(&id.to_string(), &TenantArg::Missing)?
                .ok_or(JobError::JobRunNotFound {
                    run_id: id.to_string(),
                }),
        }
    }

    /// `start` for a caller that can build the new row itself (it knows
    /// the definition and the request): a created run is answered with its
    /// id and creation time only, which saves copying and serialising the
    /// row. A dedupe hit still comes back as the existing row.
    ///
    /// `wake`: false when the caller claims into the worker's free slots
    /// itself right after (saves waking the scheduler's thread).
    pub fn start_with(&self, req: StartRequest, want_row: bool, wake: bool) -> Result<Started> {
        let now = self.now();
        let mut fx = Effects::default();
        let started = self.write(|tx| {
            // Purge first: dedupe must not answer with a run this very
            // transaction deletes.
            self.purge(tx, now);
            self.start_in(tx, req, now, want_row, &mut fx)
        })?;
        self.deliver(fx);
        match &started {
            _ if !wake => {}
            Started::Row(r) => self.wake_worker_for(&r.pool),
            Started::Created { pool, .. } => self.wake_worker_for(pool),
        }
        Ok(started)
    }

    /// Creates runs JS has already answered `start` for: starts with no
    /// options, each with its preset id and time, in one store transaction
    /// and one purge. A run of a *plain* type (no dedupe or concurrency
    /// key, no scope entity, single tenant: nothing to look up or evaluate)
    /// is built straight from its definition, the row `start` would build;
    /// any other type goes through the full `start_in` rules. `wake`: wake
    /// the scheduler for the pools that got runs (not needed when the
    /// caller claims into the worker's free slots itself right after).
    /// Answers the failures (by position) and the pools that got runs.
    /// O(log n) per run.
    #[allow(clippy::type_complexity)]
    pub fn start_plain_batch<'a>(
        &self,
        runs: impl IntoIterator<Item = PlainStart<'a>>,
        wake: bool,
    ) -> Result<(Vec<(usize, JobError)>, Vec<Arc<str>>)> {
        let mut fx = Effects::default();
        let mut failed = Vec::new();
        let mut pools: Vec<Arc<str>> = Vec::new();
        let mut latest = Millis::MIN;
        self.write(|tx| {
            // Consecutive starts are usually of one type: look it up once.
            let mut last: Option<Arc<JobDefinition>> = None;
            for (i, run) in runs.into_iter().enumerate() {
                let at = clamp_time(run.at);
                latest = latest.max(at);
                let def = match &last {
                    Some(d) if *d.job_type == *run.job_type => Some(d.clone()),
                    _ => tx.definition(run.job_type),
                };
                let plain = def.as_ref().filter(|d| {
                    !self.multi_tenant
                        && d.dedupe_key_template.is_none()
                        && d.concurrency_key_template.is_none()
                        && d.scope_entity_type.is_none()
                });
                let Some(def) = plain else {
                    let req = StartRequest {
                        job_type: run.job_type.to_owned(),
                        input: run.input,
                        preset: Some((run.id, run.at)),
                        ..StartRequest::default()
                    };
                    match self.start_in(tx, req, at, false, &mut fx) {
                        Ok(Started::Created { pool, .. }) => {
                            if !pools.contains(&pool) {
                                pools.push(pool);
                            }
                        }
                        Ok(Started::Row(_)) => {}
                        Err(e) => failed.push((i, e)),
                    }
                    continue;
                };
                if tx.run(&run.id).is_some() {
                    failed.push((
                        i,
                        JobError::JobInputInvalid {
                            reason: format!("run id {} is already taken", run.id),
                        },
                    ));
                    continue;
                }
                if !pools.contains(&def.pool) {
                    pools.push(def.pool.clone());
                }
                let seq = tx.next_seq();
                tx.insert_run(RunRow {
                    id: run.id,
                    job_type: def.job_type.clone(),
                    job_version: def.version,
                    parent_close_policy: ParentClosePolicy::Terminate,
                    tenant_id: None,
                    pool: def.pool.clone(),
                    priority: def.priority_default,
                    status: RunStatus::Pending,
                    input: run.input,
                    result: None,
                    trigger_source: TriggerSource::Manual,
                    run_at: at,
                    started_at: OptMillis::NONE,
                    finished_at: OptMillis::NONE,
                    claimed_at: OptMillis::NONE,
                    attempts: 0,
                    extras: None,
                    created_at: at,
                    updated_at: at,
                    seq,
                    claim_epoch: 0,
                    executing: false,
                    index_group: 0,
                });
                last = Some(def.clone());
            }
            if latest != Millis::MIN {
                self.purge(tx, latest);
            }
            Ok(())
        })?;
        if latest != Millis::MIN {
            self.clock.observe(latest);
        }
        self.deliver(fx);
        if wake {
            for pool in &pools {
                self.wake_worker_for(pool);
            }
        }
        Ok((failed, pools))
    }

    fn start_in(
        &self,
        tx: &mut S::Tx<'_>,
        req: StartRequest,
        now: Millis,
        want_row: bool,
        fx: &mut Effects,
    ) -> Result<Started> {
        // 1. Tenant gate (a child with no tenant inherits its parent's).
        let explicit_tenant: Option<Option<String>> = if !self.multi_tenant {
            Some(None)
        } else {
            match &req.tenant {
                TenantArg::Missing if req.parent_run_id.is_none() => {
                    return Err(JobError::MissingTenantId {
                        method: "start".to_owned(),
                    })
                }
                TenantArg::Missing => None,
                TenantArg::Null => Some(None),
                TenantArg::Id(t) => Some(Some(t.clone())),
            }
        };
        // 2. Job type.
        let def = tx
            .definition(&req.job_type)
            .ok_or_else(|| JobError::JobTypeNotFound {
                job_type: req.job_type.clone(),
            })?;
        self.storable(&req)?;
        // Lineage is checked in step 5, but the tenant of a child depends on
        // its parent, so look the parent up now.
        let parent: Option<(RunId, RunId, Option<Arc<str>>)> = req
            .parent_run_id
            .as_deref()
            .and_then(parse_run_id)
            .and_then(|p| tx.run(&p))
            .map(|p| (p.id, p.root_run_id(), p.tenant_id.clone()));
        let tenant: Option<Arc<str>> = match (&explicit_tenant, &parent) {
            (Some(t), _) => t.as_deref().map(Arc::from),
            (None, Some((_, _, pt))) => pt.clone(),
            (None, None) => None,
        };
        let parent_visible = match (&parent, self.multi_tenant) {
            (Some((_, _, pt)), true) => pt.as_deref() == tenant.as_deref(),
            (Some(_), false) => true,
            (None, _) => false,
        };

        let needs_fields = matches!(def.dedupe_key_template, Some(KeySpec::Template(_)))
            || matches!(def.concurrency_key_template, Some(KeySpec::Template(_)));
        let input_fields = needs_fields.then(|| InputFields::parse(&req.input));
        let eval = |spec: &Option<KeySpec>,
                    given: &Option<String>,
                    kind: &str|
         -> Result<Option<String>> {
            match spec {
                None => Ok(None),
                Some(KeySpec::Template(t)) => match &input_fields {
                    Some(fields) => t.evaluate(fields).map(Some),
                    None => Ok(None),
                },
                Some(KeySpec::Function) => {
                    given
                        .clone()
                        .map(Some)
                        .ok_or_else(|| JobError::JobKeyFunctionUnavailable {
                            job_type: req.job_type.clone(),
                            kind: kind.to_owned(),
                        })
                }
            }
        };

        // 3. Dedupe.
        let dedupe_key = eval(&def.dedupe_key_template, &req.dedupe_key, "dedupe")?;
        if let (Some(key), Some(window)) = (&dedupe_key, def.dedupe_window_ms) {
            if window > 0 {
                let hit = tx
                    .find_dedupe(
                        tenant.as_deref(),
                        &req.job_type,
                        key,
                        now.saturating_sub(window),
                    )
                    // A run past its retention is as good as deleted: the
                    // purge skips a row another transaction holds locked,
                    // and must not leave it to answer a dedupe.
                    .filter(|hit| !self.past_retention(hit, now));
                if let Some(hit) = hit {
                    return Ok(Started::Row(Box::new(hit.clone())));
                }
            }
        }

        // 4. Concurrency lane.
        let concurrency_key = eval(
            &def.concurrency_key_template,
            &req.concurrency_key,
            "concurrency",
        )?;
        let lane: Vec<RunId> = match &concurrency_key {
            Some(k) => tx.lane(tenant.as_deref(), k),
            None => Vec::new(),
        };
        if def.collision_mode == CollisionMode::Reject {
            if let (Some(k), Some(head)) = (&concurrency_key, lane.first()) {
                let incumbent = tx
                    .run(head)
                    .cloned()
                    .ok_or_else(|| JobError::JobRunNotFound {
                        run_id: head.to_string(),
                    })?;
                return Err(JobError::JobCollision {
                    job_type: req.job_type.clone(),
                    concurrency_key: k.clone(),
                    incumbent: Box::new(incumbent),
                });
            }
        }

        // 5. Lineage.
        if let Some(p) = &req.parent_run_id {
            if !parent_visible {
                return Err(JobError::ParentRunNotFound {
                    parent_run_id: p.clone(),
                });
            }
        }

        // Everything is checked: from here on, change the store.
        if def.collision_mode == CollisionMode::Replace {
            for incumbent in &lane {
                self.cancel_tree(tx, *incumbent, true, true, now, fx);
            }
        }

        // 6. Create.
        let id = match req.preset {
            Some((id, _)) if tx.run(&id).is_some() => {
                return Err(JobError::JobInputInvalid {
                    reason: format!("run id {id} is already taken"),
                })
            }
            Some((id, _)) => id,
            None => Uuid::new_v4(),
        };
        let root_run_id = parent.as_ref().map_or(id, |(_, root, _)| *root);
        let (scope_entity_type, scope_entity_id) = match (&req.scope, &def.scope_entity_type) {
            (Some((t, e)), _) => (Some(t.as_str().into()), Some(e.as_str().into())),
            (None, Some(t)) => match &req.scope_entity_id_from_meta {
                Some(e) => (Some(t.as_str().into()), Some(e.as_str().into())),
                None => (None, None),
            },
            (None, None) => (None, None),
        };
        let seq = tx.next_seq();
        let extras = RunExtras {
            parent_run_id: parent.as_ref().map(|(p, _, _)| *p),
            root_run_id: (root_run_id != id).then_some(root_run_id),
            scope_entity_type,
            scope_entity_id,
            tags: req.tags.filter(|t| t.get() != "{}"),
            concurrency_key: concurrency_key.map(String::into_boxed_str),
            dedupe_key: dedupe_key.map(String::into_boxed_str),
            trigger_ref: req.trigger_ref.map(String::into_boxed_str),
            lane_seq: None,
        };
        let row = RunRow {
            id,
            job_type: def.job_type.clone(),
            job_version: def.version,
            parent_close_policy: req
                .parent_close_policy
                .unwrap_or(ParentClosePolicy::Terminate),
            tenant_id: tenant,
            pool: match req.pool {
                Some(p) => Arc::from(p.as_str()),
                None => def.pool.clone(),
            },
            priority: req.priority.unwrap_or(def.priority_default),
            status: RunStatus::Pending,
            input: req.input,
            result: None,
            trigger_source: req.trigger_source.unwrap_or(TriggerSource::Manual),
            run_at: clamp_time(req.run_at.unwrap_or(now)),
            started_at: OptMillis::NONE,
            finished_at: OptMillis::NONE,
            claimed_at: OptMillis::NONE,
            attempts: 0,
            extras: extras.boxed(),
            created_at: now,
            updated_at: now,
            seq,
            claim_epoch: 0,
            executing: false,
            index_group: 0,
        };
        let out = if want_row {
            Started::Row(Box::new(row.clone()))
        } else {
            Started::Created {
                id,
                at: now,
                pool: row.pool.clone(),
            }
        };
        tx.insert_run(row);
        Ok(out)
    }

    // ── cancel and cascade ─────────────────────────────────────────────

    /// Cancels a run and (with cascade) its descendants. O(affected rows):
    /// the walk follows children lists and stops at `abandon` children.
    pub fn cancel(&self, run_id: &str, cascade: bool, tenant: &TenantArg) -> Result<()> {
        let filter = self.gate("cancel", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(());
        };
        let now = self.now();
        let mut fx = Effects::default();
        self.write(|tx| {
            let Some(run) = tx.run(&id) else {
                return Ok(());
            };
            if !Self::visible(&filter, run) || run.status.is_terminal() {
                return Ok(());
            }
            self.cancel_tree(tx, id, cascade, true, now, &mut fx);
            self.purge(tx, now);
            Ok(())
        })?;
        self.deliver(fx);
        self.wake_worker();
        Ok(())
    }

    /// Cancels `root` (when `include_root`) and, with `cascade`, every
    /// descendant reachable through `terminate`/`cancel` children. Children
    /// are canceled before their parents.
    fn cancel_tree(
        &self,
        tx: &mut S::Tx<'_>,
        root: RunId,
        cascade: bool,
        include_root: bool,
        now: Millis,
        fx: &mut Effects,
    ) {
        // Pre-order list (parents before children), canceled in reverse.
        let mut order = Vec::new();
        if cascade {
            let mut stack = vec![root];
            while let Some(id) = stack.pop() {
                order.push(id);
                for child in tx.children(&id) {
                    let follow = tx
                        .run(&child)
                        .is_some_and(|c| c.parent_close_policy != ParentClosePolicy::Abandon);
                    if follow {
                        stack.push(child);
                    }
                }
            }
        } else {
            order.push(root);
        }
        for id in order.into_iter().rev() {
            if id == root && !include_root {
                continue;
            }
            let Some(run) = tx.run(&id) else { continue };
            if run.status.is_terminal() {
                continue;
            }
            if run.status == RunStatus::Running {
                fx.aborted
                    .push((id, Some(run.claim_epoch), AbortReason::Canceled));
            }
            fx.wake = true;
            let events = self.wants_event(&id);
            tx.update_run(&id, &mut |r| {
                r.status = RunStatus::Canceled;
                r.finished_at = now.into();
                r.updated_at = now;
                r.executing = false;
                if events {
                    fx.transitions.push(r.clone());
                }
            });
        }
    }

    // ── claim ──────────────────────────────────────────────────────────

    /// Claims the next due, claimable run of `pool`. O(log n).
    pub fn claim_next(&self, pool: &str) -> Result<Option<RunRow>> {
        if self.store.fires_schedules_in_claims() {
            // Without a worker, claims are what turns due schedules into runs.
            self.fire_due_schedules()?;
        }
        let now = self.now();
        self.write(|tx| {
            let Some(id) = tx.next_claimable(pool, now) else {
                return Ok(None);
            };
            let mut out = None;
            tx.update_run(&id, &mut |r| {
                mark_claimed(r, now, false);
                out = Some(r.clone());
            });
            Ok(out)
        })
    }

    // ── attempts ───────────────────────────────────────────────────────

    /// Marks a claimed run as executing and hands out its attempt ticket.
    pub fn begin_attempt(&self, run_id: &str) -> Result<AttemptTicket> {
        let not_found = || JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        };
        let id = parse_run_id(run_id).ok_or_else(not_found)?;
        let ticket = self.write(|tx| {
            let run = tx.run(&id).ok_or_else(not_found)?;
            if run.status != RunStatus::Running {
                return Err(JobError::JobRunState {
                    run_id: run_id.to_owned(),
                    status: run.status.to_string(),
                    detail: "tick needs a 'running' run (claim it first)".to_owned(),
                });
            }
            if run.executing {
                return Err(JobError::JobRunState {
                    run_id: run_id.to_owned(),
                    status: run.status.to_string(),
                    detail: "its current attempt is already executing".to_owned(),
                });
            }
            let timeout_ms = tx.definition(&run.job_type).and_then(|d| d.timeout_ms);
            let mut ticket = None;
            tx.update_run(&id, &mut |r| {
                r.executing = true;
                ticket = Some(AttemptTicket {
                    run: r.clone(),
                    epoch: r.claim_epoch,
                    timeout_ms,
                });
            });
            ticket.ok_or_else(not_found)
        })?;
        if let Ok(mut m) = self.in_flight.lock() {
            m.insert(
                id,
                InFlight {
                    epoch: ticket.epoch,
                    abort: Arc::new(Notify::new()),
                },
            );
        }
        Ok(ticket)
    }

    fn end_in_flight(&self, id: &RunId, epoch: u32) {
        if let Ok(mut m) = self.in_flight.lock() {
            if m.get(id).is_some_and(|f| f.epoch == epoch) {
                m.remove(id);
            }
        }
    }

    /// Applies an attempt's outcome: completion, retry or final failure
    /// (with its cascade). Ignored when the run is no longer running this
    /// attempt (canceled, timed out, replayed). Returns the updated row, if
    /// applied. O(log n) + O(cascade).
    pub fn finish_attempt(
        &self,
        run_id: &RunId,
        epoch: u32,
        outcome: AttemptOutcome,
    ) -> Result<Option<RunRow>> {
        let now = self.now();
        let mut fx = Effects::default();
        let result = self.write(|tx| {
            let out = self.finish_in(tx, (run_id, epoch), outcome, now, true, &mut fx);
            self.purge(tx, now);
            out
        });
        // A failed transaction changed nothing: the attempt is still live.
        if let Ok(done) = &result {
            self.end_in_flight(run_id, epoch);
            let wake = fx.wake || done.as_ref().is_some_and(Finished::frees_lane_or_retries);
            self.deliver(fx);
            if wake {
                self.wake_worker();
            }
        }
        result.map(|done| done.and_then(|d| d.row))
    }

    /// A worker's report of several attempts, in one store transaction:
    /// applies each outcome (`None` = the attempt ended without one:
    /// canceled or released), then claims up to `want` due runs per pool
    /// (the slots the reported attempts free). One lock, one clock read and
    /// one purge for the batch instead of one per run. O(k log n) +
    /// O(cascades). An outcome that cannot be applied is skipped (its error
    /// is returned after the others are applied).
    pub fn finish_batch(
        &self,
        finished: Vec<(RunId, u32, Option<AttemptOutcome>)>,
        claims: &[(Arc<str>, usize)],
    ) -> (Vec<AttemptTicket>, Option<JobError>) {
        let now = self.now();
        let mut fx = Effects::default();
        let mut wake = false;
        let mut first_error = None;
        let mut ended = Vec::with_capacity(finished.len());
        let tickets = self.write(|tx| {
            for (id, epoch, outcome) in finished {
                let Some(o) = outcome else { continue };
                match self.finish_in(tx, (&id, epoch), o, now, false, &mut fx) {
                    Ok(done) => {
                        wake |= done.is_some_and(|d| d.frees_lane_or_retries());
                        ended.push((id, epoch));
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            self.purge(tx, now);
            let mut out = Vec::new();
            for (pool, want) in claims {
                if *want > 0 {
                    Self::claim_into(tx, pool, *want, now, &mut out);
                }
            }
            Ok(out)
        });
        for (id, epoch) in &ended {
            self.end_in_flight(id, *epoch);
        }
        let wake = fx.wake || wake;
        self.deliver(fx);
        if wake {
            self.wake_worker();
        }
        match tickets {
            Ok(t) => (t, first_error),
            Err(e) => (Vec::new(), first_error.or(Some(e))),
        }
    }

    fn finish_in(
        &self,
        tx: &mut S::Tx<'_>,
        (run_id, epoch): (&RunId, u32),
        outcome: AttemptOutcome,
        now: Millis,
        want_row: bool,
        fx: &mut Effects,
    ) -> Result<Option<Finished>> {
        let outcome = self.storable_outcome(outcome);
        {
            let Some(run) = tx.run(run_id) else {
                return Ok(None);
            };
            if run.status != RunStatus::Running || run.claim_epoch != epoch {
                return Ok(None);
            }
            let attempts = run.attempts + 1;
            let (info, final_status) = match outcome {
                AttemptOutcome::Completed(output) => {
                    // The row is copied out only for a caller or an event
                    // that wants it (not on a worker's path).
                    let copy = want_row || self.wants_event(run_id);
                    let mut out = None;
                    let mut lane = false;
                    let mut output = Some(output.unwrap_or_else(empty_object));
                    tx.update_run(run_id, &mut |r| {
                        r.status = RunStatus::Completed;
                        // The error of an earlier attempt stays on the row.
                        let earlier = r.error().cloned();
                        r.set_result(output.take(), earlier);
                        r.finished_at = now.into();
                        r.updated_at = now;
                        r.attempts = attempts;
                        r.executing = false;
                        lane = r.concurrency_key().is_some();
                        if copy {
                            out = Some(r.clone());
                        }
                    });
                    if self.wants_event(run_id) {
                        fx.transitions.extend(out.clone());
                    }
                    return Ok(Some(Finished {
                        row: out,
                        lane,
                        pending: false,
                    }));
                }
                AttemptOutcome::Failed(info) => (info, RunStatus::Failed),
                AttemptOutcome::TimedOut { timeout_ms } => (
                    FailureInfo {
                        message: format!("run timed out after {timeout_ms}ms"),
                        stack: None,
                        name: Some("JobTimeoutError".to_owned()),
                        code: Some("JOB_TIMEOUT".to_owned()),
                    },
                    RunStatus::TimedOut,
                ),
                AttemptOutcome::NoHandler => (
                    FailureInfo {
                        message: format!("No handler registered for jobType='{}'", run.job_type),
                        ..FailureInfo::default()
                    },
                    RunStatus::Failed,
                ),
            };
            // Only a failure needs the retry policy (a completion is the hot path).
            let policy = tx
                .definition(&run.job_type)
                .map(|d| d.retry_policy.clone())
                .unwrap_or_default();
            let no_handler = info.name.is_none()
                && info.code.is_none()
                && info.message.starts_with("No handler registered");
            let retry = !no_handler
                && policy.allows(info.name.as_deref(), info.code.as_deref())
                && attempts < policy.attempts;
            let error = Box::new(RunError {
                message: info.message,
                stack: info.stack,
                retryable: retry,
                attempt: attempts,
            });
            let mut error = Some(error);
            let mut out = None;
            if retry {
                let run_at = clamp_time(now.saturating_add(policy.backoff_ms(attempts)));
                tx.update_run(run_id, &mut |r| {
                    r.status = RunStatus::Pending;
                    r.attempts = attempts;
                    r.run_at = run_at;
                    r.started_at = OptMillis::NONE;
                    r.claimed_at = OptMillis::NONE;
                    r.updated_at = now;
                    r.set_error(error.take().map(|e| *e));
                    r.executing = false;
                    out = Some(r.clone());
                });
            } else {
                tx.update_run(run_id, &mut |r| {
                    r.status = final_status;
                    r.attempts = attempts;
                    r.finished_at = now.into();
                    r.updated_at = now;
                    r.set_error(error.take().map(|e| *e));
                    r.executing = false;
                    out = Some(r.clone());
                });
                if self.wants_event(run_id) {
                    fx.transitions.extend(out.clone());
                }
                // A failed run takes its descendants down (not itself again).
                self.cancel_tree(tx, *run_id, true, false, now, fx);
                return Ok(out.map(Finished::of));
            }
            if self.wants_event(run_id) {
                fx.transitions.extend(out.clone());
            }
            Ok(out.map(Finished::of))
        }
    }

    /// Claims up to `max` due runs of `pool` and opens their attempts in
    /// one transaction (the worker's batch claim). O(k log n).
    pub fn claim_attempts(&self, pool: &str, max: usize) -> Result<Vec<AttemptTicket>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let now = self.now();
        self.write(|tx| {
            let mut out = Vec::new();
            Self::claim_into(tx, pool, max, now, &mut out);
            Ok(out)
        })
    }

    /// Claims up to `max` due runs of `pool` with their attempts opened,
    /// appending the tickets to `out`. O(k log n).
    fn claim_into(
        tx: &mut S::Tx<'_>,
        pool: &str,
        max: usize,
        now: Millis,
        out: &mut Vec<AttemptTicket>,
    ) {
        tx.expect_claims(max);
        for _ in 0..max {
            let Some(id) = tx.next_claimable(pool, now) else {
                break;
            };
            let mut ticket = None;
            tx.update_run(&id, &mut |r| {
                mark_claimed(r, now, true);
                ticket = Some(AttemptTicket {
                    run: r.clone(),
                    epoch: r.claim_epoch,
                    timeout_ms: None,
                });
            });
            if let Some(mut t) = ticket {
                t.timeout_ms = tx.definition(&t.run.job_type).and_then(|d| d.timeout_ms);
                out.push(t);
            }
        }
    }

    /// One step of a worker on a networked store: applies the outcomes of
    /// finished attempts (`None` = ended without one) and claims up to
    /// `want` runs per pool, all in one transaction (one commit for the
    /// batch). Returns how many outcomes were applied and the new tickets.
    /// On error nothing changed and the caller may retry the same batch.
    pub fn settle(
        &self,
        finished: &[(RunId, u32, Option<AttemptOutcome>, Millis)],
        claims: &[(Arc<str>, usize)],
    ) -> Result<(usize, Vec<AttemptTicket>)> {
        let now = self.now();
        let mut fx = Effects::default();
        let result = self.write(|tx| {
            let ids: Vec<RunId> = finished.iter().map(|f| f.0).collect();
            tx.prefetch(&ids);
            let mut applied = 0;
            for (id, epoch, outcome, at) in finished {
                if let Some(o) = outcome {
                    // The run ended when its handler did, not when the
                    // outcome was stored (later under load or an outage);
                    // but not before its row last changed (a lease renewal
                    // after the handler ended), so its times stay ordered.
                    let since = tx.run(id).map_or(*at, |r| r.updated_at);
                    let ended = (*at).max(since).min(now);
                    if self
                        .finish_in(tx, (id, *epoch), o.clone(), ended, false, &mut fx)?
                        .is_some()
                    {
                        applied += 1;
                    }
                }
            }
            let mut tickets = Vec::new();
            for (pool, want) in claims {
                if *want > 0 {
                    Self::claim_into(tx, pool, *want, now, &mut tickets);
                }
            }
            self.purge(tx, now);
            Ok((applied, tickets))
        });
        if result.is_ok() {
            for (id, epoch, _, _) in finished {
                self.end_in_flight(id, *epoch);
            }
            self.deliver(fx);
        }
        result
    }

    /// When the next claimable run of `pool` falls due: `Some(now)` if one
    /// is due already, `None` if none is waiting. O(log n).
    pub fn next_due(&self, pool: &str) -> Option<Millis> {
        let now = self.now();
        self.read(|tx| Ok(tx.next_due(pool, now))).ok().flatten()
    }

    /// Whether `epoch` is still the running attempt of the run. O(1).
    pub fn attempt_current(&self, run_id: &RunId, epoch: u32) -> bool {
        self.read(|tx| {
            Ok(tx
                .run(run_id)
                .is_some_and(|r| r.status == RunStatus::Running && r.claim_epoch == epoch))
        })
        .unwrap_or(false)
    }

    /// Puts a run whose attempt was interrupted by a shutdown back to
    /// `pending` (attempts unchanged, due now, still its lane's head).
    /// Returns whether it was released. O(log n).
    pub fn release_attempt(&self, run_id: &RunId, epoch: u32) -> Result<bool> {
        let now = self.now();
        let released = self.write(|tx| {
            let Some(run) = tx.run(run_id) else {
                return Ok(false);
            };
            if run.status != RunStatus::Running || run.claim_epoch != epoch {
                return Ok(false);
            }
            tx.update_run(run_id, &mut |r| {
                r.status = RunStatus::Pending;
                r.claimed_at = OptMillis::NONE;
                r.started_at = OptMillis::NONE;
                r.run_at = now;
                r.updated_at = now;
                r.executing = false;
            });
            Ok(true)
        })?;
        self.end_in_flight(run_id, epoch);
        Ok(released)
    }

    /// Executes one claimed run: begin the attempt, run the handler through
    /// `executor` racing the run's timeout and a cancel, then apply the
    /// outcome. Returns when the outcome is applied or the run was canceled.
    pub async fn tick<X: HandlerExecutor>(&self, run_id: &str, executor: &X) -> Result<()> {
        let ticket = self.begin_attempt(run_id)?;
        let id = ticket.run.id;
        let epoch = ticket.epoch;
        let abort = self
            .in_flight
            .lock()
            .ok()
            .and_then(|m| m.get(&id).map(|f| f.abort.clone()))
            .unwrap_or_else(|| Arc::new(Notify::new()));
        let deadline = ticket.timeout_ms.map(|t| self.now().saturating_add(t));
        let timeout = async {
            match deadline {
                Some(d) => self.clock.sleep_until(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        let outcome = tokio::select! {
            o = executor.execute(&ticket) => Some(o),
            _ = timeout => Some(AttemptOutcome::TimedOut { timeout_ms: ticket.timeout_ms.unwrap_or(0) }),
            _ = abort.notified() => None,
        };
        match outcome {
            Some(o) => {
                let timed_out = matches!(o, AttemptOutcome::TimedOut { .. });
                let applied = self.finish_attempt(&id, epoch, o)?;
                if timed_out && applied.is_some() {
                    self.deliver(Effects {
                        aborted: vec![(id, Some(epoch), AbortReason::TimedOut)],
                        ..Effects::default()
                    });
                }
            }
            None => self.end_in_flight(&id, epoch),
        }
        Ok(())
    }

    // ── steps ──────────────────────────────────────────────────────────

    fn check_attempt(tx: &S::Tx<'_>, run_id: &RunId, epoch: u32, raw_id: &str) -> Result<()> {
        let run = tx.run(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: raw_id.to_owned(),
        })?;
        if run.status != RunStatus::Running || run.claim_epoch != epoch {
            return Err(JobError::JobRunState {
                run_id: raw_id.to_owned(),
                status: run.status.to_string(),
                detail: "the attempt that called ctx.step is over".to_owned(),
            });
        }
        Ok(())
    }

    /// `ctx.step` entry: memoized output, or the step recorded `running`.
    /// O(1) (plus O(steps of the run) for a new step's seq).
    pub fn step_begin(&self, run_id: &str, epoch: u32, step_id: &str) -> Result<StepBegin> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        if let Some(p) = self.store.text_problem(step_id) {
            return Err(JobError::JobInputInvalid {
                reason: format!("step id cannot be stored: it holds {p}"),
            });
        }
        let now = self.now();
        self.write(|tx| {
            Self::check_attempt(tx, &id, epoch, run_id)?;
            let existing = tx.step(&id, step_id).cloned();
            if let Some(s) = &existing {
                if s.status == StepStatus::Completed {
                    return Ok(StepBegin::Memoized(s.output.clone()));
                }
                if s.status == StepStatus::Running && s.epoch == epoch {
                    return Err(JobError::JobStepConflict {
                        run_id: run_id.to_owned(),
                        step_id: step_id.to_owned(),
                    });
                }
            }
            let seq = match &existing {
                Some(s) => s.seq,
                None => tx.max_step_seq(&id) + 1,
            };
            let attempt = existing.as_ref().map_or(0, |s| s.attempts) + 1;
            tx.put_step(StepRow {
                id: existing.as_ref().map_or_else(Uuid::new_v4, |s| s.id),
                job_run_id: id,
                step_id: step_id.into(),
                kind: "task",
                seq,
                status: StepStatus::Running,
                input: None,
                output: existing.as_ref().and_then(|s| s.output.clone()),
                error: existing.as_ref().and_then(|s| s.error.clone()),
                attempts: attempt,
                started_at: Some(now),
                finished_at: existing.as_ref().and_then(|s| s.finished_at),
                epoch,
            });
            Ok(StepBegin::Started { attempt })
        })
    }

    /// Records a step's output. O(1).
    pub fn step_complete(
        &self,
        run_id: &str,
        epoch: u32,
        step_id: &str,
        output: Option<Box<RawValue>>,
    ) -> Result<()> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        if let Some(p) = output
            .as_deref()
            .and_then(|o| self.store.json_problem(o.get()))
        {
            // The step must not stay `running`: it failed, with the reason.
            let reason = format!("step '{step_id}' output cannot be stored: it holds {p}");
            let info = FailureInfo {
                message: reason.clone(),
                name: Some("JobOutputInvalidError".to_owned()),
                ..FailureInfo::default()
            };
            self.step_fail(run_id, epoch, step_id, info, None)?;
            return Err(JobError::JobInputInvalid { reason });
        }
        let now = self.now();
        self.write(|tx| {
            Self::check_attempt(tx, &id, epoch, run_id)?;
            let Some(mut s) = tx.step(&id, step_id).cloned() else {
                return Err(JobError::JobRunState {
                    run_id: run_id.to_owned(),
                    status: "running".to_owned(),
                    detail: format!("step '{step_id}' was never started"),
                });
            };
            s.status = StepStatus::Completed;
            s.output = output;
            s.error = None;
            s.finished_at = Some(now);
            tx.put_step(s);
            Ok(())
        })
    }

    /// Records a step failure. With a step retry policy that allows another
    /// try, returns the backoff before it. O(1).
    pub fn step_fail(
        &self,
        run_id: &str,
        epoch: u32,
        step_id: &str,
        info: FailureInfo,
        policy: Option<&RetryPolicy>,
    ) -> Result<Option<i64>> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        let now = self.now();
        self.write(|tx| {
            // A step of an attempt that is over still gets its failure
            // recorded if the row is this attempt's.
            let Some(mut s) = tx.step(&id, step_id).cloned() else {
                return Ok(None);
            };
            if s.epoch != epoch {
                return Ok(None);
            }
            let still_running = tx
                .run(&id)
                .is_some_and(|r| r.status == RunStatus::Running && r.claim_epoch == epoch);
            let retry_in = policy.and_then(|p| {
                (still_running
                    && p.allows(info.name.as_deref(), info.code.as_deref())
                    && s.attempts < p.attempts)
                    .then(|| p.backoff_ms(s.attempts))
            });
            s.status = StepStatus::Failed;
            s.error = Some(Box::new(RunError {
                message: info.message,
                stack: info.stack,
                retryable: retry_in.is_some(),
                attempt: s.attempts,
            }));
            s.finished_at = Some(now);
            tx.put_step(s);
            Ok(retry_in)
        })
    }

    // ── replay ─────────────────────────────────────────────────────────

    /// Resets a terminal run to pending. O(log n + steps of the run).
    pub fn replay(&self, run_id: &str) -> Result<RunRow> {
        let not_found = || JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        };
        let id = parse_run_id(run_id).ok_or_else(not_found)?;
        let now = self.now();
        let row = self.write(|tx| {
            let run = tx.run(&id).ok_or_else(not_found)?;
            if !run.status.is_terminal() {
                return Err(JobError::JobNotReplayable {
                    run_id: run_id.to_owned(),
                    current_status: run.status.to_string(),
                });
            }
            let def = tx
                .definition(&run.job_type)
                .ok_or_else(|| JobError::JobTypeNotFound {
                    job_type: run.job_type.to_string(),
                })?;
            tx.delete_steps(&id, def.replay_from != ReplayFrom::Scratch);
            // Rejoin the lane at its tail.
            let lane_seq = tx.next_seq();
            let mut out = None;
            tx.update_run(&id, &mut |r| {
                r.status = RunStatus::Pending;
                r.attempts = 0;
                r.run_at = now;
                r.started_at = OptMillis::NONE;
                r.finished_at = OptMillis::NONE;
                r.claimed_at = OptMillis::NONE;
                r.set_result(None, None);
                r.updated_at = now;
                r.set_lane_seq(lane_seq);
                r.executing = false;
                out = Some(r.clone());
            });
            out.ok_or_else(not_found)
        })?;
        self.wake_worker();
        Ok(row)
    }

    // ── queries ────────────────────────────────────────────────────────

    /// O(1).
    /// A run's row with no tenant gate, for the process that holds the run
    /// (a handler reading `ctx.run`).
    pub fn run_row(&self, id: &RunId) -> Option<RunRow> {
        self.read(|tx| Ok(tx.run(id).cloned())).ok().flatten()
    }

    pub fn find_by_id(&self, run_id: &str, tenant: &TenantArg) -> Result<Option<RunRow>> {
        let filter = self.gate("findById", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(None);
        };
        self.read(|tx| Ok(tx.run(&id).filter(|r| Self::visible(&filter, r)).cloned()))
    }

    /// Steps of a run in seq order. O(k log k) for its k steps.
    pub fn list_steps(&self, run_id: &str, tenant: &TenantArg) -> Result<Vec<StepRow>> {
        let filter = self.gate("listSteps", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(Vec::new());
        };
        self.read(|tx| match tx.run(&id) {
            Some(r) if Self::visible(&filter, r) => Ok(tx.steps(&id)),
            _ => Ok(Vec::new()),
        })
    }

    /// Runs of a scope, filtered and paged. O(r) for the scope's r runs.
    pub fn list_for_scope(
        &self,
        tenant: &TenantArg,
        entity_type: &str,
        entity_id: &str,
        q: &ScopeQuery,
    ) -> Result<Vec<RunRow>> {
        let filter = self.gate("listForScope", tenant)?;
        let t = filter.flatten();
        self.read(|tx| {
            let mut ids = tx.scope_runs(t.as_deref(), entity_type, entity_id);
            if !q.ascending {
                ids.reverse();
            }
            Ok(ids
                .iter()
                .filter_map(|id| tx.run(id))
                .filter(|r| q.statuses.as_ref().is_none_or(|s| s.contains(&r.status)))
                .filter(|r| q.job_type.as_deref().is_none_or(|j| &*r.job_type == j))
                .skip(q.offset)
                .take(q.limit)
                .cloned()
                .collect())
        })
    }

    /// Cancels every live run of a scope (with cascade unless told
    /// otherwise); returns how many of the scope's runs went from live to
    /// canceled, whether directly or through another scope run's cascade.
    /// O(r + cascade).
    pub fn cancel_for_scope(
        &self,
        tenant: &TenantArg,
        entity_type: &str,
        entity_id: &str,
        cascade: bool,
    ) -> Result<u32> {
        let filter = self.gate("cancelForScope", tenant)?;
        let t = filter.flatten();
        let now = self.now();
        let mut fx = Effects::default();
        let n = self.write(|tx| {
            let live: Vec<RunId> = tx
                .scope_runs(t.as_deref(), entity_type, entity_id)
                .into_iter()
                .filter(|id| tx.run(id).is_some_and(|r| !r.status.is_terminal()))
                .collect();
            for id in &live {
                if tx.run(id).is_some_and(|r| !r.status.is_terminal()) {
                    self.cancel_tree(tx, *id, cascade, true, now, &mut fx);
                }
            }
            Ok(live
                .iter()
                .filter(|id| tx.run(id).is_some_and(|r| r.status == RunStatus::Canceled))
                .count() as u32)
        })?;
        self.deliver(fx);
        self.wake_worker();
        Ok(n)
    }

    /// Moves the `runAt` of a scope's pending runs; returns how many moved.
    /// O(r log n).
    pub fn reschedule_for_scope(
        &self,
        tenant: &TenantArg,
        entity_type: &str,
        entity_id: &str,
        run_at: Millis,
    ) -> Result<u32> {
        let filter = self.gate("rescheduleForScope", tenant)?;
        let t = filter.flatten();
        let now = self.now();
        let run_at = clamp_time(run_at);
        let n = self.write(|tx| {
            let mut n = 0;
            for id in tx.scope_runs(t.as_deref(), entity_type, entity_id) {
                if tx.run(&id).is_some_and(|r| r.status == RunStatus::Pending) {
                    tx.update_run(&id, &mut |r| {
                        r.run_at = run_at;
                        r.updated_at = now;
                    });
                    n += 1;
                }
            }
            Ok(n)
        })?;
        self.wake_worker();
        Ok(n)
    }

    /// Live counts per pool and status. O(groups): maintained on every
    /// transition, never counted from rows.
    pub fn count_by_pool_and_status(
        &self,
        tenant: &TenantArg,
    ) -> Result<Vec<(Arc<str>, RunStatus, u64)>> {
        let filter = self.gate("countByPoolAndStatus", tenant)?;
        let t = filter.flatten();
        self.read(|tx| Ok(tx.status_counts(t.as_deref())))
    }

    /// Most recently finished failed runs. O(log n + k).
    pub fn list_recent_failed(&self, tenant: &TenantArg, limit: usize) -> Result<Vec<RunRow>> {
        let filter = self.gate("listRecentFailed", tenant)?;
        let t = filter.flatten();
        self.read(|tx| {
            Ok(tx
                .recent_failed(t.as_deref(), limit)
                .iter()
                .filter_map(|id| tx.run(id).cloned())
                .collect())
        })
    }

    /// One page of runs, newest first by `(createdAt, id)`, and the cursor
    /// of the next page (`None` on the last). O(log n + k) on the narrowest
    /// index; other filters are checked per row.
    pub fn list_job_runs(
        &self,
        tenant: &TenantArg,
        q: &JobRunQuery,
    ) -> Result<(Vec<RunRow>, Option<PageCursor>)> {
        let filter = self.gate("listJobRuns", tenant)?;
        let t = filter.flatten();
        let root = match &q.root_run_id {
            Some(r) => match parse_run_id(r) {
                Some(id) => Some(id),
                None => return Ok((Vec::new(), None)),
            },
            None => None,
        };
        // A status named twice would page its index twice.
        let statuses = q.statuses.as_ref().map(|s| {
            let mut s = s.clone();
            s.sort_unstable_by_key(|st| st.as_str());
            s.dedup();
            s
        });
        self.read(|tx| {
            // One extra row tells whether another page exists.
            let ids = tx.page_runs(&PageQuery {
                tenant: t.as_deref(),
                pool: q.pool.as_deref(),
                statuses: statuses.as_deref(),
                root: root.as_ref(),
                since: q.since.unwrap_or(i64::MIN),
                before: q.cursor,
                limit: q.limit + 1,
            });
            let mut rows: Vec<RunRow> = ids.iter().filter_map(|id| tx.run(id).cloned()).collect();
            let next = if rows.len() > q.limit {
                rows.truncate(q.limit);
                rows.last().map(|r| (r.created_at, r.id.as_u128()))
            } else {
                None
            };
            Ok((rows, next))
        })
    }

    /// A run and its whole subtree (the run first, then breadth-first), or
    /// `None` when the run is unknown or another tenant's. O(subtree).
    pub fn run_tree(&self, tenant: &TenantArg, root_run_id: &str) -> Result<Option<Vec<RunRow>>> {
        let filter = self.gate("getRunTree", tenant)?;
        let Some(id) = parse_run_id(root_run_id) else {
            return Ok(None);
        };
        self.read(|tx| {
            match tx.run(&id) {
                Some(r) if Self::visible(&filter, r) => {}
                _ => return Ok(None),
            }
            Ok(Some(
                tx.tree_runs(&id)
                    .iter()
                    .filter_map(|i| tx.run(i).cloned())
                    .collect(),
            ))
        })
    }

    /// One step row. O(1).
    pub fn find_step(
        &self,
        tenant: &TenantArg,
        run_id: &str,
        step_id: &str,
    ) -> Result<Option<StepRow>> {
        let filter = self.gate("findStep", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(None);
        };
        self.read(|tx| match tx.run(&id) {
            Some(r) if Self::visible(&filter, r) => Ok(tx.step(&id, step_id).cloned()),
            _ => Ok(None),
        })
    }

    /// Inserts or updates the row of `(jobRunId, stepId)`: given fields
    /// replace stored ones, absent fields keep theirs. O(1).
    pub fn record_step(&self, tenant: &TenantArg, rec: RecordStep) -> Result<StepRow> {
        let filter = self.gate("recordStep", tenant)?;
        let not_found = || JobError::JobRunNotFound {
            run_id: rec.job_run_id.clone(),
        };
        let id = parse_run_id(&rec.job_run_id).ok_or_else(not_found)?;
        if rec.step_id.is_empty() {
            return Err(JobError::invalid("stepId must be a non-empty string"));
        }
        self.write(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| Self::visible(&filter, r))
                .ok_or_else(not_found)?;
            let epoch = run.claim_epoch;
            let prev = tx.step(&id, &rec.step_id).cloned();
            let row = StepRow {
                id: prev.as_ref().map_or_else(Uuid::new_v4, |p| p.id),
                job_run_id: id,
                step_id: rec.step_id.as_str().into(),
                kind: "task",
                seq: match (&prev, rec.seq) {
                    (Some(p), _) => p.seq,
                    (None, 0) => tx.max_step_seq(&id) + 1,
                    (None, n) => n,
                },
                status: rec.status,
                input: rec
                    .input
                    .clone()
                    .or_else(|| prev.as_ref().and_then(|p| p.input.clone())),
                output: rec
                    .output
                    .clone()
                    .or_else(|| prev.as_ref().and_then(|p| p.output.clone())),
                error: rec
                    .error
                    .clone()
                    .map(Box::new)
                    .or_else(|| prev.as_ref().and_then(|p| p.error.clone())),
                attempts: rec
                    .attempts
                    .or(prev.as_ref().map(|p| p.attempts))
                    .unwrap_or(0),
                started_at: rec.started_at.or(prev.as_ref().and_then(|p| p.started_at)),
                finished_at: rec
                    .finished_at
                    .or(prev.as_ref().and_then(|p| p.finished_at)),
                epoch,
            };
            tx.put_step(row.clone());
            Ok(row)
        })
    }

    // ── schedules ──────────────────────────────────────────────────────

    /// The notification schedule firing waits on, besides its timer.
    pub fn schedules_changed(&self) -> Arc<Notify> {
        self.schedules_changed.clone()
    }

    /// The tenant a schedule call acts for (`method` names it in the error).
    fn schedule_tenant(&self, tenant: &TenantArg, method: &str) -> Result<Option<String>> {
        if !self.multi_tenant {
            return Ok(None);
        }
        match tenant {
            TenantArg::Missing => Err(JobError::MissingTenantId {
                method: method.to_owned(),
            }),
            TenantArg::Null => Ok(None),
            TenantArg::Id(t) => Ok(Some(t.clone())),
        }
    }

    /// Creates or replaces the schedule `(tenant, name)`. The job type must
    /// be registered and must not need JS to evaluate a key (a schedule
    /// fires in the engine, without the registering process). Replacing a
    /// schedule with the same timing keeps its next fire, so re-declaring
    /// schedules at every boot does not push an interval back. O(log s).
    pub fn put_schedule(&self, spec: ScheduleSpec) -> Result<ScheduleRow> {
        let tenant = self.schedule_tenant(&spec.tenant, "schedule")?;
        let name = spec.name.trim();
        if name.is_empty() || name.chars().count() > 200 || name != spec.name {
            return Err(JobError::invalid(
                "schedule name must be 1 to 200 characters, without leading or trailing spaces",
            ));
        }
        let timing = match (&spec.cron, spec.every_ms) {
            (Some(c), None) => ScheduleTiming::Cron(
                c.parse::<crate::cron::CronSchedule>()
                    .map_err(|e| JobError::invalid(e.to_string()))?,
                match &spec.timezone {
                    Some(tz) => crate::cron::parse_time_zone(tz)
                        .map_err(|e| JobError::invalid(e.to_string()))?,
                    None => crate::cron::Tz::UTC,
                },
            ),
            (None, Some(_)) if spec.timezone.is_some() => {
                return Err(JobError::invalid(
                    "timezone applies to a cron schedule; an everyMs interval has none",
                ))
            }
            (None, Some(ms)) if (MIN_EVERY_MS..=MAX_EVERY_MS).contains(&ms) => {
                ScheduleTiming::Every(ms)
            }
            (None, Some(ms)) => {
                return Err(JobError::invalid(format!(
                    "everyMs must be an integer from {MIN_EVERY_MS} to {MAX_EVERY_MS}, not {ms}"
                )))
            }
            _ => {
                return Err(JobError::invalid(
                    "a schedule needs exactly one of cron and everyMs",
                ))
            }
        };
        for (what, value) in [
            ("schedule name", Some(name)),
            ("jobType", Some(spec.job_type.as_str())),
            ("tenantId", tenant.as_deref()),
        ] {
            if let Some(p) = value.and_then(|v| self.store.text_problem(v)) {
                return Err(JobError::invalid(format!(
                    "{what} cannot be stored: it holds {p}"
                )));
            }
        }
        if let Some(p) = self.store.json_problem(spec.input.get()) {
            return Err(JobError::invalid(format!(
                "input cannot be stored: it holds {p}"
            )));
        }
        let now = self.now();
        let Some(first) = timing.next_after(now, now) else {
            return Err(JobError::invalid(match &spec.cron {
                Some(c) => format!("cron expression \"{c}\" never fires"),
                None => "everyMs: the next fire time is past the largest date".to_owned(),
            }));
        };
        let row = self.store.transaction(|tx| {
            let def = tx
                .definition(&spec.job_type)
                .ok_or_else(|| JobError::JobTypeNotFound {
                    job_type: spec.job_type.clone(),
                })?;
            for (key, kind) in [
                (&def.concurrency_key_template, "concurrency"),
                (&def.dedupe_key_template, "dedupe"),
            ] {
                if matches!(key, Some(KeySpec::Function)) {
                    return Err(JobError::JobKeyFunctionUnavailable {
                        job_type: spec.job_type.clone(),
                        kind: kind.to_owned(),
                    });
                }
            }
            // A scope taken from the input by `meta.scope.from` needs JS too.
            if def.scope_entity_type.is_some() {
                return Err(JobError::JobKeyFunctionUnavailable {
                    job_type: spec.job_type.clone(),
                    kind: "scope".to_owned(),
                });
            }
            // The input never changes: a key it cannot fill would fail every
            // fire, so say so now.
            let templates = [&def.concurrency_key_template, &def.dedupe_key_template];
            if templates
                .iter()
                .any(|k| matches!(k, Some(KeySpec::Template(_))))
            {
                let fields = InputFields::parse(&spec.input);
                for key in templates {
                    if let Some(KeySpec::Template(t)) = key {
                        t.evaluate(&fields)?;
                    }
                }
            }
            let old = tx.schedule(tenant.as_deref(), name);
            let (anchor, next, created_at, last) = match old {
                Some(o) if o.timing == timing => (
                    o.anchor,
                    o.next_fire_at,
                    o.created_at,
                    (o.last_fired_at, o.last_run_id, o.last_error),
                ),
                Some(o) => (
                    now,
                    Some(first),
                    o.created_at,
                    (o.last_fired_at, o.last_run_id, o.last_error),
                ),
                None => (now, Some(first), now, (None, None, None)),
            };
            let row = ScheduleRow {
                name: name.to_owned(),
                tenant_id: tenant.as_deref().map(Arc::from),
                job_type: spec.job_type.clone(),
                input: spec.input.clone(),
                timing: timing.clone(),
                anchor,
                next_fire_at: next,
                last_fired_at: last.0,
                last_run_id: last.1,
                last_error: last.2,
                created_at,
                updated_at: now,
            };
            tx.put_schedule(row.clone());
            Ok(row)
        })?;
        self.schedules_changed.notify_one();
        Ok(row)
    }

    /// Removes a schedule; whether there was one (runs it started stay).
    pub fn remove_schedule(&self, name: &str, tenant: &TenantArg) -> Result<bool> {
        let tenant = self.schedule_tenant(tenant, "unschedule")?;
        if [Some(name), tenant.as_deref()]
            .into_iter()
            .flatten()
            .any(|t| self.store.text_problem(t).is_some())
        {
            // Nothing the store refuses to hold can name a schedule it holds.
            return Ok(false);
        }
        let removed = self
            .store
            .transaction(|tx| Ok(tx.delete_schedule(tenant.as_deref(), name)))?;
        if removed {
            self.schedules_changed.notify_one();
        }
        Ok(removed)
    }

    /// The schedules of a tenant (single-tenant: all), by name.
    pub fn list_schedules(&self, tenant: &TenantArg) -> Result<Vec<ScheduleRow>> {
        let tenant = self.schedule_tenant(tenant, "listSchedules")?;
        if tenant
            .as_deref()
            .is_some_and(|t| self.store.text_problem(t).is_some())
        {
            return Ok(Vec::new());
        }
        self.store.read(|tx| Ok(tx.schedules(tenant.as_deref())))
    }

    /// When the next schedule fires (the worker's timer).
    pub fn next_schedule_fire(&self) -> Result<Option<Millis>> {
        self.store.transaction(|tx| Ok(tx.next_schedule_fire()))
    }

    /// Starts a run for every schedule that is due, then moves each to its
    /// next fire after now: occurrences missed while nothing fired (no
    /// worker running) collapse into one run. Each run gets trigger source
    /// `schedule`, trigger ref the schedule's name and `runAt` the fire
    /// time that was due; the schedule's dedupe and lane rules are the job
    /// type's. A start the rules refuse (unknown type, a missing template
    /// field, `reject` collision) is recorded as the schedule's
    /// `last_error` and the schedule moves on. O(log s) when none is due,
    /// O(log s + log n) per run. Returns how many runs were created.
    pub fn fire_due_schedules(&self) -> Result<usize> {
        self.fire_due_schedules_then_next().map(|(n, _)| n)
    }

    /// `fire_due_schedules`, answering also when the next schedule fires
    /// (read in the same transaction: one round trip when nothing is due).
    pub fn fire_due_schedules_then_next(&self) -> Result<(usize, Option<Millis>)> {
        let now = self.now();
        let mut fx = Effects::default();
        let mut pools: Vec<Arc<str>> = Vec::new();
        let mut created = 0;
        let next = loop {
            let (n, more, next) = self.write(|tx| {
                let due = tx.due_schedules(now, SCHEDULE_BATCH);
                let more = due.len() == SCHEDULE_BATCH;
                let mut n = 0;
                for mut s in due {
                    let Some(fire_at) = s.next_fire_at else {
                        continue;
                    };
                    let req = StartRequest {
                        job_type: s.job_type.clone(),
                        input: s.input.clone(),
                        tenant: match &s.tenant_id {
                            Some(t) => TenantArg::Id(t.to_string()),
                            None => TenantArg::Null,
                        },
                        run_at: Some(fire_at),
                        trigger_source: Some(TriggerSource::Schedule),
                        trigger_ref: Some(s.name.clone()),
                        ..StartRequest::default()
                    };
                    match self.start_in(tx, req, now, false, &mut fx) {
                        Ok(Started::Created { id, pool, .. }) => {
                            n += 1;
                            pools.push(pool);
                            s.last_run_id = Some(id);
                            s.last_error = None;
                        }
                        // A dedupe hit: the occurrence is the run that exists.
                        Ok(Started::Row(r)) => {
                            s.last_run_id = Some(r.id);
                            s.last_error = None;
                        }
                        // The database failed: roll the whole batch back.
                        Err(e @ JobError::Store { .. }) => return Err(e),
                        Err(e) => s.last_error = Some(e.to_string()),
                    }
                    s.last_fired_at = Some(fire_at);
                    s.next_fire_at = s.timing.next_after(now.max(fire_at), s.anchor);
                    s.updated_at = now;
                    tx.put_schedule(s);
                }
                let next = if more { None } else { tx.next_schedule_fire() };
                Ok((n, more, next))
            })?;
            created += n;
            if !more {
                break next;
            }
        };
        self.deliver(fx);
        pools.sort();
        pools.dedup();
        for pool in &pools {
            self.wake_worker_for(pool);
        }
        Ok((created, next))
    }

    /// Moves a manual clock. `None` on the system clock.
    pub fn advance_time(&self, ms: i64) -> Option<Millis> {
        let moved = self.clock.advance(ms);
        if moved.is_some() {
            // Runs (and retries) may be due now: a worker that waits on a
            // poll interval rather than on this clock (Postgres) looks again.
            self.activity.notify_one();
            self.schedules_changed.notify_one();
        }
        moved
    }
}

/// Parses a JSON text into a stored value.
pub fn json_value(text: String) -> Result<Box<RawValue>> {
    raw(text)
}
