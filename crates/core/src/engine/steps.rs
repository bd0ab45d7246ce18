//! Steps: `ctx.step`'s begin, complete and fail, checked against the
//! attempt that calls them, and the step service's upsert.

use super::{parse_run_id, Engine};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use serde_json::json;
use serde_json::value::RawValue;
use uuid::Uuid;

/// Result of `ctx.step` begin.
#[derive(Debug, Clone)]
pub enum StepBegin {
    /// A completed row exists: return its output, do not call `fn`.
    Memoized(Option<Box<RawValue>>),
    /// The step was recorded `running`; this is its attempt number.
    Started { attempt: u32 },
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

/// Why a step call of an attempt that ended is refused.
const STEP_OVER: &str = "the attempt that called ctx.step is over";

impl<S: Store> Engine<S> {
    /// Only the run's current attempt may act for it (`ctx.step`, a wait);
    /// `detail` says what was refused.
    pub(super) fn check_attempt(
        tx: &S::Tx<'_>,
        run_id: &RunId,
        epoch: u32,
        raw_id: &str,
        detail: &str,
    ) -> Result<()> {
        let run = tx.run(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: raw_id.to_owned(),
        })?;
        if !run.executes(epoch) {
            return Err(JobError::JobRunState {
                run_id: raw_id.to_owned(),
                status: run.status.to_string(),
                detail: detail.to_owned(),
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
            Self::check_attempt(tx, &id, epoch, run_id, STEP_OVER)?;
            let existing = tx.step(&id, step_id).cloned();
            if let Some(s) = &existing {
                // A durable wait's id is not a task's.
                if s.kind != StepKind::Task {
                    return Err(JobError::JobStepConflict {
                        run_id: run_id.to_owned(),
                        step_id: step_id.to_owned(),
                    });
                }
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
                kind: StepKind::Task,
                seq,
                status: StepStatus::Running,
                input: None,
                output: existing.as_ref().and_then(|s| s.output.clone()),
                error: existing.as_ref().and_then(|s| s.error.clone()),
                attempts: attempt,
                started_at: now.into(),
                finished_at: existing.as_ref().map_or(OptMillis::NONE, |s| s.finished_at),
                epoch,
            });
            let run_attempt = super::attempts::run_attempt(tx, &id);
            self.note(tx, &id, EventKind::StepStarted, now, run_attempt, || {
                Some(json!({ "stepId": step_id, "stepAttempt": attempt }))
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
            Self::check_attempt(tx, &id, epoch, run_id, STEP_OVER)?;
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
            s.finished_at = now.into();
            let step_attempt = s.attempts;
            tx.put_step(s);
            let run_attempt = super::attempts::run_attempt(tx, &id);
            self.note(tx, &id, EventKind::StepCompleted, now, run_attempt, || {
                Some(json!({ "stepId": step_id, "stepAttempt": step_attempt }))
            });
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
        mut info: FailureInfo,
        policy: Option<&RetryPolicy>,
    ) -> Result<Option<i64>> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        // The caller checked the policy before the step ran; a policy that
        // reaches here unchecked must not turn into a wrong delay.
        if let Some(problem) = policy.and_then(RetryPolicy::problem) {
            return Err(JobError::invalid(format!("step '{step_id}': {problem}")));
        }
        // Its texts as the store keeps them, like a run's error.
        self.storable_error(&mut info.message, &mut info.stack);
        let now = self.now();
        self.write(|tx| {
            let Some(mut s) = tx.step(&id, step_id).cloned() else {
                return Ok(None);
            };
            if s.epoch != epoch {
                return Ok(None);
            }
            // A token wait a `resume` completed while its `deliver` threw:
            // the resume stands (its caller was told it did).
            if s.status == StepStatus::Completed {
                return Ok(None);
            }
            // A step of an attempt that is over records nothing, whether it
            // failed or returned (`step_complete` refuses the same way): its
            // run's timeline ended with the attempt, and a failure written
            // now would come after the run's end.
            if !tx.run(&id).is_some_and(|r| r.executes(epoch)) {
                return Ok(None);
            }
            let retry_in = policy.and_then(|p| {
                (p.allows(info.name.as_deref(), info.code.as_deref()) && s.attempts < p.attempts)
                    .then(|| self.retry_delay(p, s.attempts))
            });
            s.status = StepStatus::Failed;
            s.error = Some(Box::new(RunError {
                message: info.message,
                stack: info.stack,
                retryable: retry_in.is_some(),
                attempt: s.attempts,
            }));
            s.finished_at = now.into();
            let mut data = json!({
                "stepId": &*s.step_id,
                "stepAttempt": s.attempts,
                "error": s.error.as_ref().map(|e| e.message.as_str()),
            });
            if let Some(ms) = retry_in {
                data["retryInMs"] = ms.into();
            }
            tx.put_step(s);
            let run_attempt = super::attempts::run_attempt(tx, &id);
            self.note(tx, &id, EventKind::StepFailed, now, run_attempt, || {
                Some(data)
            });
            Ok(retry_in)
        })
    }

    /// Inserts or updates the row of `(jobRunId, stepId)`: given fields
    /// replace stored ones, absent fields keep theirs. O(1).
    pub fn record_step(&self, tenant: &TenantArg, mut rec: RecordStep) -> Result<StepRow> {
        let filter = self.gate("recordStep", tenant)?;
        // The row answered is the row stored: the error's texts as the
        // store keeps them, as for a step the engine ran.
        if let Some(e) = rec.error.as_mut() {
            self.storable_error(&mut e.message, &mut e.stack);
        }
        let not_found = || JobError::JobRunNotFound {
            run_id: rec.job_run_id.clone(),
        };
        let id = parse_run_id(&rec.job_run_id).ok_or_else(not_found)?;
        if rec.step_id.is_empty() {
            return Err(JobError::invalid("stepId must be a non-empty string"));
        }
        // What the store cannot hold is refused before anything changes
        // (PostgreSQL's jsonb and text refuse NUL), as `start` does.
        for (what, v) in [("input", &rec.input), ("output", &rec.output)] {
            if let Some(p) = v.as_deref().and_then(|j| self.store.json_problem(j.get())) {
                return Err(JobError::invalid(format!(
                    "recordStep {what} cannot be stored: it holds {p}"
                )));
            }
        }
        if let Some(p) = self.store.text_problem(&rec.step_id) {
            return Err(JobError::invalid(format!(
                "stepId cannot be stored: it holds {p}"
            )));
        }
        self.write(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| Self::visible(&filter, r))
                .ok_or_else(not_found)?;
            let epoch = run.claim_epoch;
            let prev = tx.step(&id, &rec.step_id).cloned();
            // A durable wait's row is the engine's: written over, an open
            // wait would never resolve (its run waiting forever), a token's
            // hash would be lost, a resolved one would answer other values.
            if prev.as_ref().is_some_and(|p| p.kind == StepKind::Wait) {
                return Err(JobError::JobStepConflict {
                    run_id: rec.job_run_id.clone(),
                    step_id: rec.step_id.clone(),
                });
            }
            let row = StepRow {
                id: prev.as_ref().map_or_else(Uuid::new_v4, |p| p.id),
                job_run_id: id,
                step_id: rec.step_id.as_str().into(),
                kind: prev.as_ref().map_or(StepKind::Task, |p| p.kind),
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
                started_at: rec
                    .started_at
                    .or(prev.as_ref().and_then(|p| p.started_at.get()))
                    .into(),
                finished_at: rec
                    .finished_at
                    .or(prev.as_ref().and_then(|p| p.finished_at.get()))
                    .into(),
                epoch,
            };
            tx.put_step(row.clone());
            Ok(row)
        })
    }
}
