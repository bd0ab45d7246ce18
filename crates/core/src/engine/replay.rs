//! Replaying a terminal run: back to pending, steps kept per the type's
//! `replayFrom`.

use super::{parse_run_id, Engine};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};

impl<S: Store> Engine<S> {
    /// Resets a terminal run to pending. O(log n + steps of the run).
    ///
    /// A mutation, so it takes the tenant gate of `cancel`: in multi-tenant
    /// mode a missing tenant is `MissingTenantId`, and another tenant's run
    /// is `JobRunNotFound` (as an unknown one: its existence is not told),
    /// with nothing changed. Unlike cancel it cannot be a silent no-op: its
    /// answer is the replayed row.
    pub fn replay(&self, run_id: &str, tenant: &TenantArg) -> Result<RunRow> {
        let filter = self.gate("replay", tenant)?;
        let not_found = || JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        };
        let id = parse_run_id(run_id).ok_or_else(not_found)?;
        let now = self.now();
        let row = self.write(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| Self::visible(&filter, r))
                .ok_or_else(not_found)?;
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
            let was = run.status;
            tx.delete_steps(&id, def.replay_from != ReplayFrom::Scratch);
            // From scratch, signals sent for the old run's waits go too.
            if def.replay_from == ReplayFrom::Scratch {
                tx.clear_signals(&id);
            }
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
                r.clear_wait();
                r.executing = false;
                out = Some(r.clone());
            });
            self.note(tx, &id, EventKind::Replayed, now, 1, || {
                Some(serde_json::json!({ "from": def.replay_from.as_str(), "was": was.as_str() }))
            });
            out.ok_or_else(not_found)
        })?;
        self.wake_worker();
        Ok(row)
    }
}
