//! The storage boundary. Rules live in [`crate::engine`] and talk to a
//! store only through [`StoreTx`], a set of indexed primitives run inside
//! one atomic [`Store::transaction`]. The in-memory store implements them
//! with maps and ordered sets; a Postgres store implements the same calls
//! with SQL inside a database transaction (committing on `Ok`, rolling
//! back on `Err`), and an embedded durable store likewise. Rules validate
//! before they mutate, so a store without rollback (memory) stays
//! unchanged on every error path too.
//!
//! The trait is synchronous by design: the memory store answers in
//! nanoseconds under a mutex, and a networked store runs the same rule
//! closure on a blocking thread (`spawn_blocking`) behind the engine's
//! async entry points, so the rules are written once.

pub mod memory;
pub mod postgres;

use crate::error::Result;
use crate::model::{
    JobDefinition, Millis, RunEvent, RunId, RunRow, RunStatus, ScheduleRow, StepRow,
};
use serde_json::value::RawValue;
use std::sync::Arc;

/// A transition run events report (a run ended, or went back to `pending`
/// for a retry), as a shared store tells other processes of it: enough to
/// find the run and to tell this transition from a later one of the same
/// run (the next attempt of a retry, a replay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub run: RunId,
    /// The status the run took.
    pub status: RunStatus,
    /// The run's claim epoch after the transition.
    pub epoch: u32,
    /// The run's attempts after the transition.
    pub attempts: u32,
}

impl Transition {
    /// The transition a row shows (its current state).
    pub fn of(row: &RunRow) -> Self {
        Transition {
            run: row.id,
            status: row.status,
            epoch: row.claim_epoch,
            attempts: row.attempts,
        }
    }

    /// Whether `row` still shows this transition, or the run has moved on
    /// (claimed again, replayed) since it was made.
    pub fn shown_by(&self, row: &RunRow) -> bool {
        Transition::of(row) == *self
    }
}

pub trait Store: Send + Sync + 'static {
    type Tx<'a>: StoreTx
    where
        Self: 'a;

    /// Runs `f` atomically with respect to every other transaction.
    fn transaction<R>(&self, f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R>) -> Result<R>;

    /// A transaction that only reads: a networked store skips row locks
    /// and may run `f` again on another connection (so `Fn`, not `FnOnce`).
    fn read<R>(&self, f: impl Fn(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
        self.transaction(f)
    }

    /// Whether expired runs can be purged at the start of every call, reads
    /// included, at no real cost (the in-memory store: a peek at the oldest
    /// finished run when none is due). A networked store purges in writes
    /// only: a purge there is a statement of its own.
    fn purges_in_every_call(&self) -> bool {
        false
    }

    /// Why this store cannot hold a JSON text, if it cannot (PostgreSQL's
    /// `jsonb` refuses `\u0000` and lone surrogates). Memory holds any.
    fn json_problem(&self, _json: &str) -> Option<&'static str> {
        None
    }

    /// Why this store cannot hold a string, if it cannot (PostgreSQL's
    /// `text` refuses NUL).
    fn text_problem(&self, _text: &str) -> Option<&'static str> {
        None
    }

    /// Rewrites `text` into what this store keeps of it, for the texts it
    /// stores lossily rather than refuses (a handler's error message and
    /// stack, whatever the handler threw). The engine applies it before an
    /// outcome is applied, so the row it answers with (the settle answer,
    /// run events, `waitForRun`) is the row a later read returns.
    /// PostgreSQL's `text`/`jsonb` cannot hold NUL: U+FFFD in its place.
    /// Memory keeps any text.
    fn storable_text(&self, _text: &mut String) {}

    /// Waiting runs one transaction resumes when many fall due together
    /// (`Engine::resume_due_waits_then_next`). The in-memory store holds
    /// the caller's thread, the JS thread included, for a batch: a few
    /// thousand. A networked store resumes a batch in one statement; see
    /// its override for why its batches are larger.
    fn resume_batch(&self) -> usize {
        5_000
    }

    /// Whether processes with different handlers share this store: a
    /// worker then claims only the job types registered in its process.
    fn shared_by_processes(&self) -> bool {
        false
    }

    /// Whether a claim can fire due schedules first at no real cost (the
    /// in-memory store: a peek at the earliest next fire). A networked
    /// store fires them from the worker's own loop instead.
    fn fires_schedules_in_claims(&self) -> bool {
        false
    }

    /// Claims of this process whose transaction's outcome stayed unknown
    /// (its COMMIT's answer was lost and could not be read back in time)
    /// wait to be resolved: a transaction after the next write that
    /// succeeds asks `StoreTx::orphaned_claims`. A cheap check, made after
    /// every write.
    fn has_orphans(&self) -> bool {
        false
    }
}

/// How a store's runs are shared with other processes, and what that means
/// for a worker (see `worker.rs`). The in-memory store belongs to one
/// process: the defaults. A networked store is shared: a worker leases what
/// it claims, renews its leases, returns runs whose lease expired (their
/// worker died) and hears of other processes' changes.
pub trait Coordination {
    /// Other processes may claim and change this store's runs.
    fn shared(&self) -> bool {
        false
    }

    /// Transactions are cheap enough to run on the caller's thread (the JS
    /// thread included); otherwise they run on blocking threads.
    fn inline(&self) -> bool {
        true
    }

    /// Connections the store may hold (bounds transactions in flight).
    fn connections(&self) -> usize {
        1
    }

    /// Renews the leases of running attempts this process holds. Returns
    /// how many were renewed.
    fn renew_leases(&self, _runs: &[(RunId, u32)], _now: Millis) -> Result<u64> {
        Ok(0)
    }

    /// Of `runs` (attempts this process holds), those that are no longer
    /// running attempts of ours: the run ended, was canceled, or was swept
    /// and claimed again elsewhere (a lease lost in an outage, a cancel
    /// whose notification was missed). A plain read, no locks: it answers
    /// for the rows a heartbeat skipped as locked too. O(k log n).
    fn lost_leases(&self, _runs: &[(RunId, u32)]) -> Result<Vec<(RunId, u32)>> {
        Ok(Vec::new())
    }

    /// Running attempts whose lease is older than `lease_ms`: `(id, epoch)`,
    /// at most `limit`.
    fn expired_leases(
        &self,
        _now: Millis,
        _lease_ms: i64,
        _limit: i64,
    ) -> Result<Vec<(RunId, u32)>> {
        Ok(Vec::new())
    }

    /// Blocks the calling thread, telling `on_change` of other processes'
    /// changes until `keep_going` returns false: `None` for "something may
    /// be claimable", a run and its claim epoch when a running run was
    /// canceled (so the process executing it can fire its signal).
    /// `on_listening` is called each time it begins to listen (at first and
    /// after a reconnect): a change committed before then was not told. A
    /// store no one shares has nothing to tell and returns at once.
    fn listen(
        &self,
        _keep_going: &dyn Fn() -> bool,
        _on_listening: &dyn Fn(),
        _on_change: &dyn Fn(Option<(RunId, Option<u32>)>),
    ) -> Result<()> {
        Ok(())
    }

    /// Blocks the calling thread, telling `on_transitions` of the run-event
    /// transitions other processes commit ([`StoreTx::announce`]), a batch
    /// at a time, until `keep_going` returns false (asked at least every
    /// 200 ms). `on_listening` is called once the store listens. This process's own announcements are left out: it reported
    /// them itself. Nothing is replayed: transitions committed while no one
    /// listened (before the call, or while it reconnects after an error)
    /// are not told. A store no one shares has nothing to tell and returns
    /// at once.
    fn listen_transitions(
        &self,
        _keep_going: &dyn Fn() -> bool,
        _on_listening: &dyn Fn(),
        _on_transitions: &dyn Fn(Vec<Transition>),
    ) -> Result<()> {
        Ok(())
    }
}

/// What an operator does to a store beside its runs.
pub trait StoreAdmin {
    /// Creates or upgrades the schema (idempotent).
    fn migrate(&self) -> Result<()> {
        Ok(())
    }

    /// Job types the store has definitions of, this process's or not.
    fn stored_job_types(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Lets idle connections go (they reopen on demand).
    fn close(&self) {}

    /// Runs the store holds in this process's memory (`None`: it holds
    /// them elsewhere), so the binding can tell V8 what an engine weighs.
    fn resident_runs(&self) -> Option<usize> {
        None
    }
}

/// Tenant + key identity used by lanes and dedupe. In single-tenant mode
/// the tenant is always `None`.
pub type TenantRef<'a> = Option<&'a str>;

/// Filters of a keyset page over runs, newest first by `(createdAt, id)`.
///
/// The page walks one index: the run tree's (`root`), else the scope's
/// (`scope`), else the sets of the tenant's (pool, status) groups. A filter
/// that index does not decide is checked per row; where such a check can
/// skip rows without end (the job type, anything on a scope's list), the
/// walk examines at most `budget` rows and says where it stopped
/// ([`RunPage::walked_to`]), so a page costs O(log n + budget) however rare
/// the matching rows are.
#[derive(Debug, Clone)]
pub struct PageQuery<'a> {
    /// Only rows of this tenant (`None` = the null tenant, which in
    /// single-tenant mode is every row).
    pub tenant: TenantRef<'a>,
    pub pool: Option<&'a str>,
    /// Any of these statuses, each named once (`None`: every status).
    pub statuses: Option<&'a [crate::model::RunStatus]>,
    pub root: Option<&'a RunId>,
    /// Only rows of this job type (checked per row: no index holds it).
    pub job_type: Option<&'a str>,
    /// Only rows of this scope `(entityType, entityId)`.
    pub scope: Option<(&'a str, &'a str)>,
    /// Only rows created at or after this instant.
    pub since: Millis,
    /// Only rows strictly before this `(createdAt, id)` key.
    pub before: Option<(Millis, u128)>,
    pub limit: usize,
    /// At most this many rows examined by a walk whose rows are checked
    /// one by one (see above).
    pub budget: usize,
}

/// What [`StoreTx::page_runs`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPage {
    /// The matching rows, newest first, at most `limit`.
    pub ids: Vec<RunId>,
    /// Set when the walk examined its `budget` of rows before it found
    /// `limit` and rows are left: the `(createdAt, id)` of the last row it
    /// examined, where the next page goes on.
    pub walked_to: Option<(Millis, u128)>,
}

/// A run an orphaned claim took (see `StoreTx::orphaned_claims`), as that
/// claim left it: released only while the row still is so.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrphanClaim {
    pub run: RunId,
    pub epoch: u32,
    pub claimed_at: Option<Millis>,
    pub executing: bool,
    /// Whether the store knows the claim landed (its transaction
    /// committed); otherwise only the row can tell (see
    /// `Engine::release_orphans_in`).
    pub landed: bool,
}

pub trait StoreTx {
    // ── definitions ────────────────────────────────────────────────────
    fn definition(&self, job_type: &str) -> Option<Arc<JobDefinition>>;
    fn put_definition(&mut self, def: JobDefinition) -> Arc<JobDefinition>;

    // ── runs ───────────────────────────────────────────────────────────
    fn run(&self, id: &RunId) -> Option<&RunRow>;
    /// `run` without taking the row's lock (a store that locks rows read in
    /// a mutating transaction): for a rule that only looks at another run
    /// while it holds its own — a waiting parent reading its child's end —
    /// so it locks nothing in the order parent → child that a child's end
    /// takes the other way round (child → the parent it resumes), which
    /// deadlocked fan-outs. A row read so is locked before it is written.
    fn peek_run(&self, id: &RunId) -> Option<&RunRow> {
        self.run(id)
    }
    /// The claims of earlier transactions of this process whose outcome
    /// was unknown and has now proved committed (see `Store::has_orphans`):
    /// nobody executes them, and the caller releases them in this
    /// transaction (those still as the claim left them). A claim whose
    /// outcome cannot be told yet is asked again by a later transaction;
    /// one that did not commit is forgotten. Handed out again by a later
    /// transaction if this one does not commit.
    fn orphaned_claims(&mut self) -> Vec<OrphanClaim> {
        Vec::new()
    }
    /// Inserts a new run and indexes it (pool queue, lane, dedupe, lineage).
    fn insert_run(&mut self, row: RunRow);
    /// Changes a run in place; the store re-indexes whatever changed
    /// (status, lane membership, claimability, due time).
    fn update_run(&mut self, id: &RunId, f: &mut dyn FnMut(&mut RunRow));
    /// Created order counter (monotonic).
    fn next_seq(&mut self) -> u64;

    /// Says this transaction is about to insert up to `n` runs, so a
    /// networked store can draw their `seq`s in one round trip and write
    /// the rows in one statement.
    fn expect_inserts(&mut self, _n: usize) {}

    /// From here on, remember how to undo this transaction's changes: a
    /// rule that must change all or nothing across many runs (`start_many`)
    /// finds a later run refused after earlier ones changed the store. A
    /// store whose transaction rolls back on `Err` need not (the default).
    fn begin_undo(&mut self) {}

    /// Stops remembering; `undo`: first puts back every change made since
    /// `begin_undo`.
    fn end_undo(&mut self, _undo: bool) {}

    /// Tells other processes' run-event listeners of `transition` once this
    /// transaction commits (nothing if it rolls back). A store no one
    /// shares has no one to tell: the default does nothing.
    fn announce(&mut self, _transition: Transition) {}

    /// Newest run of `job_type` with `dedupe_key` for this tenant, created
    /// strictly after `created_after`, whose status is not canceled/failed.
    fn find_dedupe(
        &self,
        tenant: TenantRef<'_>,
        job_type: &str,
        dedupe_key: &str,
        created_after: Millis,
    ) -> Option<&RunRow>;

    /// Non-terminal runs of a concurrency lane, in lane order.
    fn lane(&self, tenant: TenantRef<'_>, key: &str) -> Vec<RunId>;

    /// The first of `lane` (what a start into the lane needs: a `queue`
    /// start only joins it, a `reject` start only asks who holds it). A
    /// networked store serialises starts on the lane until commit either way.
    fn lane_head(&self, tenant: TenantRef<'_>, key: &str) -> Option<RunId> {
        self.lane(tenant, key).first().copied()
    }

    /// The next claimable run of `pool` due at `now`: highest priority,
    /// then earliest `runAt`, then earliest created. Claimable means pending
    /// and either unkeyed or the head of its lane.
    fn next_claimable(&mut self, pool: &str, now: Millis) -> Option<RunId>;

    /// Limits this transaction's `next_claimable` and `next_due` to runs of
    /// these job types: a worker's claims, in a store that processes with
    /// other handlers share (a process never takes a run it has no handler
    /// for, which another process may have). A store only one process
    /// uses claims every type (its definitions all have their handlers).
    fn claim_only(&mut self, _types: &[Box<str>]) {}

    /// Says how many `next_claimable` calls this transaction will make,
    /// so a networked store can fetch that many candidates at once.
    fn expect_claims(&mut self, _n: usize) {}

    /// Says which runs this transaction is about to read and change, so a
    /// networked store can load (and lock) them in one round trip.
    fn prefetch(&mut self, _ids: &[RunId]) {}

    /// When the next claimable run of `pool` is due (`now` if one is due).
    fn next_due(&mut self, pool: &str, now: Millis) -> Option<Millis>;

    /// Direct children of a run, in created order.
    fn children(&self, id: &RunId) -> Vec<RunId>;

    // ── steps ──────────────────────────────────────────────────────────
    fn step(&self, run: &RunId, step_id: &str) -> Option<&StepRow>;
    /// Inserts or replaces the row for `(jobRunId, stepId)`.
    fn put_step(&mut self, row: StepRow);
    /// Rows of a run in `seq` order.
    fn steps(&self, run: &RunId) -> Vec<StepRow>;
    /// Calls `f` with each step of a run, when the store holds them at hand
    /// (no round trip): a claim puts the completed ones in the attempt's
    /// ticket. A store that would have to read them calls nothing, and the
    /// handler's memoized calls ask one by one, as they would anyway.
    fn steps_at_hand(&self, _run: &RunId, _f: &mut dyn FnMut(&StepRow)) {}
    fn max_step_seq(&self, run: &RunId) -> u32;
    /// Deletes a run's steps: all of them, or only the non-completed ones.
    fn delete_steps(&mut self, run: &RunId, keep_completed: bool);

    // ── durable waits ──────────────────────────────────────────────────
    /// The open waits (steps of kind `wait`, pending or running) the
    /// attempt `epoch` of a run recorded, in `seq` order: what a parking
    /// attempt is blocked on.
    fn open_waits(&self, run: &RunId, epoch: u32) -> Vec<crate::model::WaitSpec> {
        self.steps(run)
            .iter()
            .filter(|s| s.epoch == epoch && s.is_open_wait())
            .filter_map(crate::model::WaitSpec::of_step)
            .collect()
    }
    /// Waiting runs whose `wait_deadline` is at or before `now`, earliest
    /// first, at most `limit`. A networked store locks them and skips those
    /// another transaction holds, so two processes never resume one run.
    fn due_waits(&mut self, now: Millis, limit: usize) -> Vec<RunId>;
    /// Resumes up to `limit` waiting runs whose deadline is at or before
    /// `now`, earliest first (`RunRow::resume_now`: pending, due `now`);
    /// returns them with their attempts so far. A networked store does it
    /// in one statement.
    fn resume_due(&mut self, now: Millis, limit: usize) -> Vec<(RunId, u32)> {
        let due = self.due_waits(now, limit);
        let mut out = Vec::with_capacity(due.len());
        for id in due {
            let mut attempts = 0;
            self.update_run(&id, &mut |r| {
                r.resume_now(now);
                attempts = r.attempts;
            });
            out.push((id, attempts));
        }
        out
    }
    /// The earliest `wait_deadline` of any waiting run.
    fn next_wait_deadline(&mut self) -> Option<Millis>;
    /// Appends a signal to a run's inbox (signals no wait took yet).
    fn push_signal(&mut self, run: &RunId, name: &str, payload: Box<RawValue>, at: Millis);
    /// Takes the oldest signal named `name` out of a run's inbox.
    fn take_signal(&mut self, run: &RunId, name: &str) -> Option<Box<RawValue>>;
    /// How many signals a run's inbox holds.
    fn inbox_len(&self, run: &RunId) -> usize;
    /// Empties a run's inbox (a replay from scratch; a purge does it too).
    fn clear_signals(&mut self, run: &RunId);

    // ── timeline ───────────────────────────────────────────────────────
    /// Appends `event` to its run's timeline, numbered by the store (its
    /// `id`: greater than every earlier event of the run). Kept with this
    /// transaction (undone with it), deleted with the run (`purge_finished`).
    /// O(1) amortised; a networked store writes a transaction's events in
    /// one statement at commit.
    fn record_event(&mut self, event: RunEvent);
    /// A run's stored events with an `id` above `after`, oldest first, at
    /// most `limit`. O(log e + limit) over the run's own events.
    fn run_events(&self, run: &RunId, after: u64, limit: usize) -> Vec<RunEvent>;

    // ── retention ──────────────────────────────────────────────────────
    /// Starts (or stops) remembering terminal runs in finishing order.
    fn set_retention_tracking(&mut self, on: bool);
    /// Deletes runs (with their steps) that finished at or before the given
    /// instants: completed ones / failed, timed-out and canceled ones.
    /// Amortised O(log n) per purged run. Returns how many were purged.
    fn purge_finished(
        &mut self,
        completed_before: Option<Millis>,
        other_before: Option<Millis>,
    ) -> usize;

    // ── queries ────────────────────────────────────────────────────────
    /// Runs of a scope for one tenant, in created order.
    fn scope_runs(&self, tenant: TenantRef<'_>, entity_type: &str, entity_id: &str) -> Vec<RunId>;
    /// Live counts per `(pool, status)` for one tenant, maintained on every
    /// transition.
    fn status_counts(&self, tenant: TenantRef<'_>)
        -> Vec<(Arc<str>, crate::model::RunStatus, u64)>;
    /// Live runs (pending, running, waiting) per `(pool, status)`, every
    /// tenant's together, by pool (the metrics' gauges). O(groups) in
    /// memory; O(live runs) on PostgreSQL (the partial indexes of the
    /// live statuses: claims, leases, `job_run_waiting_idx`), never a scan
    /// of finished runs.
    fn live_counts(&self) -> Vec<(Arc<str>, crate::model::RunStatus, u64)>;
    /// Runs of a tenant that ended at or after `since`, per minute of their
    /// end (`(minute start, status, count)`, oldest first; terminal
    /// statuses only). Memory counts each transition into a terminal status
    /// (the last hour is kept, O(pools × minutes)); PostgreSQL counts the
    /// rows whose `finished_at` falls there (the finished index's range:
    /// O(runs ended since), so a replayed or purged run no longer counts).
    fn ended_per_minute(
        &self,
        tenant: TenantRef<'_>,
        since: Millis,
    ) -> Vec<(Millis, crate::model::RunStatus, u64)>;
    /// Failed runs of a tenant, most recently finished first.
    fn recent_failed(&self, tenant: TenantRef<'_>, limit: usize) -> Vec<RunId>;
    /// One keyset page (see [`PageQuery`]).
    fn page_runs(&self, q: &PageQuery<'_>) -> RunPage;
    /// A run and all its descendants, breadth-first (the run first).
    fn tree_runs(&self, root: &RunId) -> Vec<RunId>;

    // ── schedules ──────────────────────────────────────────────────────
    /// The schedule `(tenant, name)`; a mutating transaction locks it.
    fn schedule(&self, tenant: TenantRef<'_>, name: &str) -> Option<ScheduleRow>;
    /// Inserts or replaces the schedule `(row.tenant_id, row.name)`.
    fn put_schedule(&mut self, row: ScheduleRow);
    /// Deletes a schedule; whether there was one.
    fn delete_schedule(&mut self, tenant: TenantRef<'_>, name: &str) -> bool;
    /// The schedules of one tenant (`None` = the null tenant), by name.
    fn schedules(&self, tenant: TenantRef<'_>) -> Vec<ScheduleRow>;
    /// Up to `limit` schedules due at `now`, earliest first. A networked
    /// store locks them and skips those another transaction holds, so two
    /// processes never fire the same occurrence.
    fn due_schedules(&mut self, now: Millis, limit: usize) -> Vec<ScheduleRow>;
    /// The earliest next fire of any schedule.
    fn next_schedule_fire(&mut self) -> Option<Millis>;
}
