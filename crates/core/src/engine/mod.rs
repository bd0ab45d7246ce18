//! The orchestration rules of CONTRACT.md, written once over [`StoreTx`].
//!
//! Every public operation runs in one store transaction. Rules check
//! everything that can fail before they change anything, so an error
//! leaves the store as it was.
//!
//! One `impl<S: Store> Engine<S>` per part of a run's life:
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the `Engine` and its options, side effects (`Effects`, `deliver`), transactions with retention (`write`, `read`, `purge`), the tenant gate |
//! | `definitions.rs` | registering job types |
//! | `start.rs` | starting runs: one, or a batch of plain ones |
//! | `attempts.rs` | claims, attempts and their outcomes |
//! | `timeouts.rs` | the attempts open in this process, and their timeouts |
//! | `steps.rs` | `ctx.step` and the step service's rows |
//! | `cancel.rs` | cancel, its cascade, scope-wide cancel and reschedule |
//! | `replay.rs` | replaying a terminal run |
//! | `queries.rs` | reads: rows, steps, scopes, counts, pages, trees |
//! | `schedules.rs` | recurring starts |
//! | `wakeups.rs` | waking a worker, events, watchers, the observer, time |
//! | `waits.rs` | durable waits: parking, signals, resume tokens, child results, deadlines |
//! | `metrics.rs` | counters and histograms of what this process did to runs, gauges of the store's live runs: the Prometheus text |
//! | `timeline.rs` | the run timeline: recording a transition's event (`note`), reading a run's events |

mod attempts;
mod cancel;
mod definitions;
mod metrics;
mod queries;
mod replay;
mod schedules;
mod start;
mod steps;
mod timeline;
mod timeouts;
mod waits;
mod wakeups;

pub use attempts::{AttemptEnd, AttemptTicket, MemoStep, Settled};
pub use queries::{JobRunQuery, PageCursor, ScopeOrder, ScopeQuery, PAGE_WALK_BUDGET};
pub use start::{BatchError, Started, START_MANY_MAX};
pub use steps::{RecordStep, StepBegin};
pub use timeouts::run_timeouts;
pub use waits::{resume_token_hash, WaitBegin, WaitRequest, MAX_INBOX};

use crate::clock::{Clock, ClockKind};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::random::RandomSource;
use crate::store::{Store, StoreTx};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Notify;
use uuid::Uuid;

/// How many times more `Engine::again` runs a call that lost its
/// connection (a pool's connections may all have died at once: the
/// default pool holds 10).
const LOST_RETRIES: usize = 16;

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

    /// Attempt timeouts fell due: whoever runs the handlers calls
    /// `Engine::expire_attempts` on its next turn (see `timeouts.rs`).
    fn timeouts_due(&self) {}

    /// Something went wrong outside any call, for the operator's log (the
    /// listener of other processes' run events lost its connection, and
    /// when it is back).
    fn trouble(&self, _message: String) {}
}

pub struct Engine<S: Store> {
    store: S,
    clock: Arc<Clock>,
    multi_tenant: bool,
    retention: Retention,
    observer: RwLock<Option<Arc<dyn EngineObserver>>>,
    /// Attempts opened in this process, with their timeouts.
    open: Mutex<timeouts::OpenAttempts>,
    /// An earlier timeout was added: the timer looks again.
    timeouts_changed: Arc<Notify>,
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
    /// Whether transitions are recorded in the run timeline (on unless
    /// turned off: `set_timeline`).
    timeline: AtomicBool,
    /// Counts of transitions, for `metrics_text`.
    metrics: metrics::Metrics,
    /// Runs someone waits for (`waitForRun`): their transitions are sent
    /// even when events are off. Reference-counted per run.
    watched: Mutex<HashMap<RunId, usize>>,
    watched_any: AtomicBool,
    /// A schedule was created, changed or removed: whoever fires schedules
    /// re-reads the earliest next fire.
    schedules_changed: Arc<Notify>,
    /// When the timer that fires schedules and resumes wait deadlines
    /// wakes next (`i64::MAX`: not before a change; `i64::MIN`: it is
    /// looking right now). A run parking with an earlier deadline wakes it;
    /// a later one costs the timer nothing (100k parks are not 100k wake-ups).
    timer_at: std::sync::atomic::AtomicI64,
    /// The job types registered in this process, each with its handler:
    /// in a store processes share, the only ones its worker claims.
    served: RwLock<Vec<Box<str>>>,
    /// Draws the jitter of retry delays; seeded from the clock, reseeded
    /// by tests (`seed_jitter`) so jittered delays are reproducible.
    random: RandomSource,
}

impl<S: Store> Drop for Engine<S> {
    /// Lets the timeout timer see the engine is gone (it holds no strong
    /// reference while it waits).
    fn drop(&mut self) {
        self.timeouts_changed.notify_one();
    }
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
    /// The earliest deadline of the runs parked: the timer that resumes
    /// deadlines is told after the commit (told before it, it could look
    /// and not yet see the parked row, and sleep past the deadline).
    parked_until: Option<Millis>,
}

/// The most of an error's message, or of its stack, a run keeps.
pub const MAX_ERROR_TEXT: usize = 1 << 20;

/// `text` cut at [`MAX_ERROR_TEXT`] bytes (on a character boundary), saying
/// how much was cut.
fn cut_error_text(text: &mut String) {
    if text.len() <= MAX_ERROR_TEXT {
        return;
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = text.len() - end;
    text.truncate(end);
    text.push_str(&format!(" … [{cut} more bytes cut]"));
}

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
            open: Mutex::new(timeouts::OpenAttempts::default()),
            timeouts_changed: Arc::new(Notify::new()),
            activity: Arc::new(Notify::new()),
            worker_hungry: AtomicBool::new(false),
            hungry_pools: RwLock::new(None),
            served: RwLock::new(Vec::new()),
            events_enabled: AtomicBool::new(false),
            timeline: AtomicBool::new(true),
            metrics: metrics::Metrics::default(),
            watched: Mutex::new(HashMap::new()),
            watched_any: AtomicBool::new(false),
            schedules_changed: Arc::new(Notify::new()),
            timer_at: std::sync::atomic::AtomicI64::new(i64::MIN),
            random: RandomSource::from_clock(),
        }
    }

    /// Restarts the jitter source from `seed`: the retry delays drawn from
    /// then on are the same on every run (tests).
    pub fn seed_jitter(&self, seed: u64) {
        self.random.reseed(seed);
    }

    /// The delay before the retry that follows attempt `attempts` under
    /// `policy`, jitter drawn from the engine's source. The one place a
    /// retry delay is computed, for runs and for steps.
    fn retry_delay(&self, policy: &RetryPolicy, attempts: u32) -> i64 {
        policy.delay_ms(attempts, |max| self.random.up_to(max))
    }

    /// An error's message and stack as the store keeps them
    /// (`Store::storable_text`): the one place a thrown error's texts are
    /// made storable, for runs (`storable_outcome`) and steps, before they
    /// are applied, so every answer carries the text a read returns. Its
    /// name and code are not stored (they only pick the retry policy,
    /// which must see what the handler threw) and are left as they are.
    /// Also cut at [`MAX_ERROR_TEXT`] bytes each (both stores): an error's
    /// texts are a diagnosis, and a message of hundreds of megabytes would
    /// not fit a PostgreSQL row (its run would never end).
    fn storable_error(&self, message: &mut String, stack: &mut Option<String>) {
        cut_error_text(message);
        self.store.storable_text(message);
        if let Some(s) = stack.as_mut() {
            cut_error_text(s);
            self.store.storable_text(s);
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
        if let Some(d) = fx.parked_until {
            // The timer looks again if it would otherwise wake after this
            // deadline (`timer_at` is `i64::MAX` while it looks).
            if d < self.timer_at.load(std::sync::atomic::Ordering::SeqCst) {
                self.schedules_changed.notify_one();
            }
        }
        if fx.aborted.is_empty() && fx.transitions.is_empty() {
            return;
        }
        let observer = self.observer.read().ok().and_then(|o| o.clone());
        if !fx.transitions.is_empty() {
            if let Some(o) = &observer {
                o.run_events(fx.transitions);
            }
        }
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        for (id, epoch, reason) in fx.aborted {
            // The attempt is over.
            open.end(&id, epoch);
            if let Some(o) = &observer {
                o.run_aborted(id, epoch, reason);
            }
        }
    }

    /// Runs a whole call (`f`: one or more transactions) again while it
    /// fails on a lost connection with nothing changed (`lost` says so of
    /// its error: `JobError::runs_again` for the engine's own;
    /// `StoreOutcome::Lost`: no COMMIT was sent, or the server answered
    /// that it did not commit), so a backend ended under a call (a
    /// failover, `pg_terminate_backend`, an idle timeout) costs a retry on
    /// a fresh connection rather than an error; likewise a transaction the
    /// server rolled back to break a deadlock (`StoreOutcome::Conflict`). Every pooled connection
    /// may have died at once, and each try puts one dead connection out:
    /// at most `LOST_RETRIES` tries more. A call whose outcome is unknown
    /// is never run again. `f` must change nothing outside the store
    /// before its transaction commits, as every engine call does.
    pub fn again<R, E>(
        &self,
        mut f: impl FnMut() -> std::result::Result<R, E>,
        lost: impl Fn(&E) -> bool,
    ) -> std::result::Result<R, E> {
        let mut tries = 0;
        loop {
            match f() {
                Err(e) if tries < LOST_RETRIES && lost(&e) => tries += 1,
                out => return out,
            }
        }
    }

    /// A mutating store transaction (`write_only`); after one that
    /// succeeds, orphaned claims are released (see `Store::has_orphans`).
    fn write<R>(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R>) -> Result<R> {
        let out = self.write_only(f);
        if out.is_ok() && self.store.has_orphans() {
            // Claims whose transaction's outcome was unknown: once a write
            // succeeds again, those that landed are released (rather than
            // left to their lease), in a transaction of their own: it locks
            // only those rows, and no call's outcome depends on it. A
            // failure leaves them for the next write.
            let now = self.now();
            let _ = self.store.transaction(|tx| {
                let orphans = tx.orphaned_claims();
                Ok(self.release_orphans_in(tx, &orphans, now))
            });
        }
        out
    }

    /// A store transaction that first purges the runs past their retention
    /// where that costs nothing (see `Store::purges_in_every_call`): no
    /// call then sees, returns or changes a run that is due to be deleted.
    /// What the transaction observes for the metrics is counted only if
    /// it commits.
    fn write_only<R>(&self, f: impl FnOnce(&mut S::Tx<'_>) -> Result<R>) -> Result<R> {
        let held = self.metrics.begin_transaction();
        let out = if self.purges() && self.store.purges_in_every_call() {
            let now = self.now();
            self.store.transaction(|tx| {
                self.purge(tx, now);
                f(tx)
            })
        } else {
            self.store.transaction(f)
        };
        held.end(out.is_ok());
        out
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

    /// Whether one of a query's texts is one the store cannot hold (a NUL
    /// on PostgreSQL): then no row has it, and the query matches nothing
    /// (as an unknown id does) instead of sending the server a text it
    /// refuses with an error.
    fn names_nothing<'a>(&self, texts: impl IntoIterator<Item = Option<&'a str>>) -> bool {
        texts
            .into_iter()
            .flatten()
            .any(|t| self.store.text_problem(t).is_some())
    }

    fn visible(filter: &Option<Option<String>>, row: &RunRow) -> bool {
        match filter {
            None => true,
            Some(t) => t.as_deref() == row.tenant_id.as_deref(),
        }
    }
}

/// Parses a JSON text into a stored value.
pub fn json_value(text: String) -> Result<Box<RawValue>> {
    raw(text)
}
