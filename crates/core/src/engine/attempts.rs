//! Claims and attempts: claiming runs, opening an attempt, applying
//! outcomes (`settle` for a worker's batch, `finish_attempt` for one; both
//! through `finish_in`, the one place that decides what an outcome does)
//! and releasing an attempt.

use super::timeline::CancelCause;
use super::{parse_run_id, Effects, Engine};
use crate::clock::clamp_time;
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx, Transition};
use serde_json::json;
use std::sync::Arc;

/// An attempt as it is handed to whoever runs its handler.
#[derive(Debug, Clone)]
pub struct AttemptTicket {
    pub run: RunRow,
    /// Claim epoch: step calls of this attempt must present it.
    pub epoch: u32,
    pub timeout_ms: Option<i64>,
    /// The run's completed steps and waits, when the store had them at hand
    /// at the claim (`StoreTx::steps_at_hand`, `claim_memo`): a resumed handler's
    /// memoized calls answer from here instead of asking the engine again.
    /// Empty for a run with none, or a store that left them out.
    pub memo: Vec<MemoStep>,
}

/// A completed step or wait of a run, as its memoized call answers it.
#[derive(Debug, Clone)]
pub struct MemoStep {
    pub step_id: Box<str>,
    /// A durable wait (`kind = 'wait'`), not a `ctx.step`.
    pub wait: bool,
    pub output: Option<Box<serde_json::value::RawValue>>,
}

/// One finished attempt, as a worker reports it to [`Engine::settle`].
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub id: RunId,
    /// The attempt's claim epoch: an outcome of an earlier attempt is ignored.
    pub epoch: u32,
    /// `None`: the attempt ended without an outcome (canceled or released).
    pub outcome: Option<AttemptOutcome>,
    /// When its handler ended (a networked worker stores outcomes later);
    /// `None`: now.
    pub ended_at: Option<Millis>,
}

/// What [`Engine::settle`] did.
#[derive(Debug, Default)]
pub struct Settled {
    /// Outcomes applied (the others' attempts were over already).
    pub applied: usize,
    /// Attempts the claims opened.
    pub tickets: Vec<AttemptTicket>,
}

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

/// A claim: running from `now`, with a new epoch so outcomes of earlier
/// attempts can no longer apply; `executing` when the attempt opens at once.
fn mark_claimed(r: &mut RunRow, now: Millis, executing: bool) {
    r.status = RunStatus::Running;
    r.claimed_at = now.into();
    // A resumed run keeps the start of its attempt.
    if r.started_at.get().is_none() {
        r.started_at = now.into();
    }
    r.updated_at = now;
    r.claim_epoch = r.claim_epoch.wrapping_add(1);
    r.executing = executing;
}

/// The attempt a run is in (or would open next): its attempts so far + 1.
pub(super) fn run_attempt<T: StoreTx>(tx: &T, id: &RunId) -> u32 {
    tx.run(id).map_or(0, |r| r.attempts + 1)
}

impl<S: Store> Engine<S> {
    /// Claims the next due, claimable run of `pool`. O(log n).
    pub fn claim_next(&self, pool: &str) -> Result<Option<RunRow>> {
        if self.store.fires_schedules_in_claims() {
            // Without a worker, claims are what turns due schedules into runs.
            self.fire_due_schedules()?;
        }
        // And what resumes waits whose deadline passed (an indexed peek
        // when none did).
        self.resume_due_waits_then_next()?;
        self.write(|tx| {
            // Read under the store's lock: a write that went first (a
            // resume on the timer's thread) has an earlier time, so the
            // run's timeline stays in time order.
            let now = self.now();
            let Some(id) = tx.next_claimable(pool, now) else {
                return Ok(None);
            };
            let mut out = None;
            tx.update_run(&id, &mut |r| {
                mark_claimed(r, now, false);
                out = Some(r.clone());
            });
            if let Some(r) = &out {
                self.note(tx, &id, EventKind::Started, now, r.attempts + 1, || None);
            }
            Ok(out)
        })
    }

    /// Claims up to `max` due runs of `pool` and opens their attempts in
    /// one transaction (the worker's batch claim). O(k log n).
    pub fn claim_attempts(&self, pool: &str, max: usize) -> Result<Vec<AttemptTicket>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let tickets = self.write(|tx| {
            // Under the lock, as in `claim_next`.
            let now = self.now();
            let mut out = Vec::new();
            self.claim_into(tx, pool, max, now, &mut out);
            Ok(out)
        })?;
        self.open_attempts(&tickets, false);
        Ok(tickets)
    }

    /// Claims up to `max` due runs of `pool` with their attempts opened,
    /// appending the tickets to `out`. O(k log n).
    fn claim_into(
        &self,
        tx: &mut S::Tx<'_>,
        pool: &str,
        max: usize,
        now: Millis,
        out: &mut Vec<AttemptTicket>,
    ) {
        self.claim_only_served(tx);
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
                    memo: Vec::new(),
                });
            });
            if let Some(mut t) = ticket {
                t.timeout_ms = tx.definition(&t.run.job_type).and_then(|d| d.timeout_ms);
                t.memo = super::waits::claim_memo(tx, &id, t.run.attempts + 1, now);
                self.note(tx, &id, EventKind::Started, now, t.run.attempts + 1, || {
                    None
                });
                out.push(t);
            }
        }
    }

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
                    memo: Vec::new(),
                });
            });
            let mut ticket = ticket.ok_or_else(not_found)?;
            ticket.memo = super::waits::claim_memo(tx, &id, ticket.run.attempts + 1, self.now());
            Ok(ticket)
        })?;
        self.open_attempts(std::slice::from_ref(&ticket), true);
        Ok(ticket)
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
        let mut end = AttemptEnd {
            id: *run_id,
            epoch,
            outcome: Some(outcome),
            ended_at: None,
        };
        self.settle_in(std::slice::from_mut(&mut end), &[], true)
            .map(|(_, row)| row)
    }

    /// A worker's report of finished attempts, in one store transaction:
    /// applies each outcome in order (`None` = the attempt ended without
    /// one: canceled or released), then claims up to `want` due runs per
    /// pool (the slots the reported attempts free). One lock or commit, one
    /// clock read and one purge for the batch instead of one per run.
    /// O(k log n) + O(cascades). On error nothing changed (the outcomes'
    /// attempts are still live) and the caller may settle the same batch
    /// again.
    pub fn settle(
        &self,
        mut finished: Vec<AttemptEnd>,
        claims: &[(Arc<str>, usize)],
    ) -> Result<Settled> {
        self.settle_in(&mut finished, claims, false)
            .map(|(settled, _)| settled)
    }

    /// `settle`, taking each outcome out of `finished` (the transaction runs
    /// once); with `want_row`, also answers the row of the last outcome
    /// applied.
    fn settle_in(
        &self,
        finished: &mut [AttemptEnd],
        claims: &[(Arc<str>, usize)],
        want_row: bool,
    ) -> Result<(Settled, Option<RunRow>)> {
        let mut fx = Effects::default();
        let mut wake = false;
        let mut row = None;
        let settled = self.write(|tx| {
            // Under the lock, as in `claim_next`.
            let now = self.now();
            // One run is read by its own lookup: nothing to load at once.
            if finished.len() > 1 {
                let ids: Vec<RunId> = finished.iter().map(|f| f.id).collect();
                tx.prefetch(&ids);
            }
            let mut applied = 0;
            for end in finished.iter_mut() {
                let Some(outcome) = end.outcome.take() else {
                    continue;
                };
                let ended = match end.ended_at {
                    // The run ended when its handler did, not when the
                    // outcome was stored (later under load or an outage);
                    // but not before its row last changed (a lease renewal
                    // after the handler ended), so its times stay ordered.
                    Some(at) => {
                        let since = tx.run(&end.id).map_or(at, |r| r.updated_at);
                        at.max(since).min(now)
                    }
                    None => now,
                };
                let done =
                    self.finish_in(tx, (&end.id, end.epoch), outcome, ended, want_row, &mut fx)?;
                if let Some(done) = done {
                    applied += 1;
                    wake |= done.frees_lane_or_retries();
                    if want_row {
                        row = done.row;
                    }
                }
            }
            let mut tickets = Vec::new();
            for (pool, want) in claims {
                if *want > 0 {
                    self.claim_into(tx, pool, *want, now, &mut tickets);
                }
            }
            self.purge(tx, now);
            Ok(Settled { applied, tickets })
        })?;
        // A failed transaction changed nothing: the attempts are still live.
        for end in finished.iter() {
            self.end_in_flight(&end.id, end.epoch);
        }
        self.open_attempts(&settled.tickets, false);
        let wake = fx.wake || wake;
        self.deliver(fx);
        if wake {
            self.wake_worker();
        }
        Ok((settled, row))
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
        // A run that times out has its handler's signal fired.
        let timed_out = matches!(outcome, AttemptOutcome::TimedOut { .. });
        {
            let Some(run) = tx.run(run_id) else {
                return Ok(None);
            };
            // A parked execution's outcome counts while the run still
            // waits (see `RunRow::executes`): a late result or failure ends
            // it, a late `Parked` (it waited again) parks it anew.
            if !run.executes(epoch) {
                return Ok(None);
            }
            if let AttemptOutcome::Parked = outcome {
                let (row, pending, deadline) = self.park_in(tx, run_id, epoch, now);
                if pending {
                    fx.wake = true;
                }
                if let Some(d) = deadline {
                    fx.parked_until = Some(fx.parked_until.map_or(d, |e| e.min(d)));
                }
                return Ok(Some(Finished {
                    row: if want_row { row } else { None },
                    // A waiting run keeps its lane.
                    lane: false,
                    pending,
                }));
            }
            let attempts = run.attempts + 1;
            let (info, final_status) = match outcome {
                AttemptOutcome::Completed(output) => {
                    // The row is copied out only for a caller or an event
                    // that wants it (not on a worker's path).
                    let copy = want_row || self.wants_event(run_id);
                    let mut out = None;
                    let mut lane = false;
                    let mut awaited = None;
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
                        // A wake-up marker of a wait resolved meanwhile (`wake_run`).
                        r.clear_wait();
                        lane = r.concurrency_key().is_some();
                        if copy {
                            out = Some(r.clone());
                        } else if !r.awaited_by().is_empty() {
                            awaited = Some(r.clone());
                        }
                    });
                    self.note(tx, run_id, EventKind::Completed, now, attempts, || None);
                    // Invoke waits on this run resolve with its output.
                    if let Some(r) = out.as_ref().or(awaited.as_ref()) {
                        if !r.awaited_by().is_empty() {
                            self.resolve_waiters(tx, r, now, fx, None);
                        }
                    }
                    // Other processes' listeners hear of it whoever listens
                    // here (this process cannot know who listens there).
                    tx.announce(Transition {
                        run: *run_id,
                        status: RunStatus::Completed,
                        epoch,
                        attempts,
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
                // Handled above.
                AttemptOutcome::Parked => return Ok(None),
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
            let message = error.message.clone();
            let mut error = Some(error);
            let mut out = None;
            if timed_out {
                fx.aborted
                    .push((*run_id, Some(epoch), AbortReason::TimedOut));
            }
            if retry {
                let delay = self.retry_delay(&policy, attempts);
                let run_at = clamp_time(now.saturating_add(delay));
                tx.update_run(run_id, &mut |r| {
                    r.status = RunStatus::Pending;
                    r.attempts = attempts;
                    r.run_at = run_at;
                    r.started_at = OptMillis::NONE;
                    r.claimed_at = OptMillis::NONE;
                    r.updated_at = now;
                    r.set_error(error.take().map(|e| *e));
                    r.executing = false;
                    r.clear_wait();
                    out = Some(r.clone());
                });
                self.note(tx, run_id, EventKind::RetryScheduled, now, attempts, || {
                    Some(json!({ "delayMs": delay, "error": message }))
                });
            } else {
                tx.update_run(run_id, &mut |r| {
                    r.status = final_status;
                    r.attempts = attempts;
                    r.finished_at = now.into();
                    r.updated_at = now;
                    r.set_error(error.take().map(|e| *e));
                    r.executing = false;
                    r.clear_wait();
                    out = Some(r.clone());
                });
                let kind = if final_status == RunStatus::TimedOut {
                    EventKind::TimedOut
                } else {
                    EventKind::Failed
                };
                self.note(tx, run_id, kind, now, attempts, || {
                    Some(json!({ "error": message }))
                });
                tx.announce(Transition {
                    run: *run_id,
                    status: final_status,
                    epoch,
                    attempts,
                });
                if self.wants_event(run_id) {
                    fx.transitions.extend(out.clone());
                }
                if let Some(r) = out.as_ref().filter(|r| !r.awaited_by().is_empty()) {
                    self.resolve_waiters(tx, r, now, fx, None);
                }
                // A failed run takes its descendants down (not itself again),
                // as this is stored: `now` may be when its handler ended,
                // and a child may have gone on meanwhile (begun a step), so
                // its cancel must not come before that in its timeline.
                self.cancel_tree(
                    tx,
                    *run_id,
                    (true, false),
                    CancelCause::ParentFailed,
                    self.now().max(now),
                    fx,
                );
                return Ok(out.map(Finished::of));
            }
            // Put back for a retry (`run:retrying`).
            tx.announce(Transition {
                run: *run_id,
                status: RunStatus::Pending,
                epoch,
                attempts,
            });
            if self.wants_event(run_id) {
                fx.transitions.extend(out.clone());
            }
            Ok(out.map(Finished::of))
        }
    }

    /// Puts a run whose attempt ended without an outcome back to `pending`
    /// (attempts unchanged, still its lane's head): the one path for a
    /// shutdown (`stop()`), a dispatch JS never received, and the lease
    /// sweeper (its worker died). Returns whether it was released. O(log n).
    ///
    /// `run_at` is left as it was: it is the run's due time (its first due
    /// time, its retry time or its resume time), and a claimed run was due
    /// when it was claimed, so it is due again at once and keeps its place
    /// among the due runs of its priority. Setting it to now (as this did)
    /// sent a redelivered run behind every run queued while it ran: a
    /// killed worker's runs waited for the whole backlog.
    pub fn release_attempt(&self, run_id: &RunId, epoch: u32) -> Result<bool> {
        self.release_attempts(&[(*run_id, epoch)]).map(|n| n == 1)
    }

    /// `release_attempt` for many attempts in one transaction (the sweeper's
    /// expired leases): their rows are read in one statement and written in
    /// one. Returns how many were released. O(k log n). A run whose
    /// `started_at` predates its `claimed_at` (a resumed run: it started
    /// before this claim) keeps it: `startedAt` stays the start of its
    /// first execution.
    pub fn release_attempts(&self, attempts: &[(RunId, u32)]) -> Result<usize> {
        let claims: Vec<(RunId, u32, Option<Millis>)> =
            attempts.iter().map(|(id, e)| (*id, *e, None)).collect();
        self.release_claims(&claims)
    }

    /// `release_attempts` for attempts whose claim time is known (a worker's
    /// tickets: `(id, epoch, claimed at)`; `None`: the row's `claimed_at`,
    /// which heartbeats move on): `started_at` is kept if it predates the
    /// claim, cleared if the claim set it (a prefetched run given back
    /// unstarted never started).
    pub fn release_claims(&self, attempts: &[(RunId, u32, Option<Millis>)]) -> Result<usize> {
        if attempts.is_empty() {
            return Ok(0);
        }
        let now = self.now();
        let released = self.write(|tx| Ok(self.release_in(tx, attempts, now)))?;
        for (run_id, epoch, _) in attempts {
            self.end_in_flight(run_id, *epoch);
        }
        Ok(released)
    }

    /// Releases orphaned claims (`StoreTx::orphaned_claims`) whose rows are
    /// still as the claim left them: running under its epoch, its claim
    /// time (nobody renews an orphan's lease; another process's claim of
    /// the same run after this one did not land has the same epoch, not the
    /// same time) and not made executing since (`beginAttempt` of a
    /// `claimNext` claim by someone who found it). O(k).
    pub(super) fn release_orphans_in(
        &self,
        tx: &mut S::Tx<'_>,
        orphans: &[crate::store::OrphanClaim],
        now: Millis,
    ) -> usize {
        let ids: Vec<RunId> = orphans.iter().map(|o| o.run).collect();
        if ids.len() > 1 {
            tx.prefetch(&ids);
        }
        let mine: Vec<(RunId, u32, Option<Millis>)> = orphans
            .iter()
            .filter(|o| {
                // A claim not known to have landed is told apart from a
                // later claim of the run by its claim time alone, which a
                // manual clock (standing still) does not separate.
                (o.landed || self.clock.kind() != crate::ClockKind::Manual)
                    && !self.attempt_open(&o.run, o.epoch)
                    && tx.run(&o.run).is_some_and(|r| {
                        r.status == RunStatus::Running
                            && r.claim_epoch == o.epoch
                            && r.claimed_at.get() == o.claimed_at
                            && r.executing == o.executing
                    })
            })
            .map(|o| (o.run, o.epoch, o.claimed_at))
            .collect();
        self.release_in(tx, &mine, now)
    }

    /// `release_claims` inside a transaction: each attempt still current
    /// (running, same claim epoch) turns pending again, keeping its place.
    /// Answers how many did. O(k).
    pub(super) fn release_in(
        &self,
        tx: &mut S::Tx<'_>,
        attempts: &[(RunId, u32, Option<Millis>)],
        now: Millis,
    ) -> usize {
        if attempts.len() > 1 {
            let ids: Vec<RunId> = attempts.iter().map(|a| a.0).collect();
            tx.prefetch(&ids);
        }
        let mut n = 0;
        for (run_id, epoch, claimed) in attempts {
            let Some(run) = tx.run(run_id) else {
                continue;
            };
            if run.status != RunStatus::Running || run.claim_epoch != *epoch {
                continue;
            }
            let attempt = run.attempts + 1;
            let claimed = claimed.or(run.claimed_at.get());
            let started_before =
                matches!((run.started_at.get(), claimed), (Some(s), Some(c)) if s < c);
            tx.update_run(run_id, &mut |r| {
                r.status = RunStatus::Pending;
                r.claimed_at = OptMillis::NONE;
                if !started_before {
                    r.started_at = OptMillis::NONE;
                }
                r.updated_at = now;
                r.executing = false;
                r.clear_wait();
            });
            self.note(tx, run_id, EventKind::Released, now, attempt, || None);
            n += 1;
        }
        n
    }

    /// Whether `epoch` is still the running attempt of the run. O(1).
    pub fn attempt_current(&self, run_id: &RunId, epoch: u32) -> bool {
        self.read(|tx| Ok(tx.run(run_id).is_some_and(|r| r.executes(epoch))))
            .unwrap_or(false)
    }

    /// When the next claimable run of `pool` falls due: `Some(now)` if one
    /// is due already, `None` if none is waiting. O(log n).
    pub fn next_due(&self, pool: &str) -> Option<Millis> {
        let now = self.now();
        self.read(|tx| {
            self.claim_only_served(tx);
            Ok(tx.next_due(pool, now))
        })
        .ok()
        .flatten()
    }

    /// A worker's claims, in a store processes share, take only the job
    /// types registered here: a run of another type is left for a process
    /// that has its handler (it used to be failed here, "No handler
    /// registered", during a rolling deploy or beside an API process
    /// with fewer handlers). `claim_next` is not limited: its caller asked.
    fn claim_only_served(&self, tx: &mut S::Tx<'_>) {
        if self.store.shared_by_processes() {
            if let Ok(served) = self.served.read() {
                tx.claim_only(&served);
            }
        }
    }

    /// The outcome as the store will keep it, before it is applied: an
    /// output the store cannot hold fails the attempt instead (the run must
    /// not stay `running` because its result cannot be written), and a
    /// failure's texts are what the store keeps of them (`storable_error`),
    /// so the row answered and announced is the row stored.
    fn storable_outcome(&self, outcome: AttemptOutcome) -> AttemptOutcome {
        match outcome {
            AttemptOutcome::Failed(mut info) => {
                self.storable_error(&mut info.message, &mut info.stack);
                AttemptOutcome::Failed(info)
            }
            AttemptOutcome::Completed(Some(output)) => {
                match self.store.json_problem(output.get()) {
                    None => AttemptOutcome::Completed(Some(output)),
                    Some(p) => AttemptOutcome::Failed(FailureInfo {
                        message: format!("handler output cannot be stored: it holds {p}"),
                        stack: None,
                        name: Some("JobOutputInvalidError".to_owned()),
                        code: None,
                    }),
                }
            }
            other => other,
        }
    }
}
