//! Claims and attempts: claiming runs, opening an attempt, applying its
//! outcome (`finish_in`, the one place that decides what an outcome
//! does), releasing it, and `tick`, which runs one through an executor.

use super::{parse_run_id, Effects, Engine, InFlight};
use crate::clock::clamp_time;
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Notify;

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
    r.started_at = now.into();
    r.updated_at = now;
    r.claim_epoch = r.claim_epoch.wrapping_add(1);
    r.executing = executing;
}

impl<S: Store> Engine<S> {
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

    /// Whether `epoch` is still the running attempt of the run. O(1).
    pub fn attempt_current(&self, run_id: &RunId, epoch: u32) -> bool {
        self.read(|tx| {
            Ok(tx
                .run(run_id)
                .is_some_and(|r| r.status == RunStatus::Running && r.claim_epoch == epoch))
        })
        .unwrap_or(false)
    }

    /// When the next claimable run of `pool` falls due: `Some(now)` if one
    /// is due already, `None` if none is waiting. O(log n).
    pub fn next_due(&self, pool: &str) -> Option<Millis> {
        let now = self.now();
        self.read(|tx| Ok(tx.next_due(pool, now))).ok().flatten()
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
}
