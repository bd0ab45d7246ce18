//! Canceling runs and the parent-close cascade; a scope's cancel and
//! reschedule.

use super::timeline::CancelCause;
use super::{parse_run_id, Effects, Engine};
use crate::clock::clamp_time;
use crate::error::Result;
use crate::model::*;
use crate::store::{Store, StoreTx, Transition};

impl<S: Store> Engine<S> {
    /// Cancels a run and (with cascade) its descendants. O(affected rows):
    /// the walk follows children lists and stops at `abandon` children.
    pub fn cancel(&self, run_id: &str, cascade: bool, tenant: &TenantArg) -> Result<()> {
        self.cancel_with_note(run_id, cascade, tenant, None)
    }

    /// `cancel`, its `canceled` events noting the caller's `reason`.
    pub fn cancel_with_note(
        &self,
        run_id: &str,
        cascade: bool,
        tenant: &TenantArg,
        note: Option<&str>,
    ) -> Result<()> {
        let filter = self.gate("cancel", tenant)?;
        let note = note.map(|n| self.cancel_note(n));
        let note = note.as_deref();
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
            self.cancel_tree(
                tx,
                id,
                (cascade, true),
                CancelCause::Requested(note),
                now,
                &mut fx,
            );
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
    pub(super) fn cancel_tree(
        &self,
        tx: &mut S::Tx<'_>,
        root: RunId,
        (cascade, include_root): (bool, bool),
        cause: CancelCause<'_>,
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
        // The runs this cascade cancels: a wait of one of them on another
        // is not resolved (its run does not resume; it is canceled next).
        let doomed: std::collections::HashSet<RunId> = order
            .iter()
            .filter(|id| include_root || **id != root)
            .copied()
            .collect();
        for id in order.into_iter().rev() {
            if id == root && !include_root {
                continue;
            }
            let Some(run) = tx.run(&id) else { continue };
            if run.status.is_terminal() {
                continue;
            }
            let announced = Transition {
                run: id,
                status: RunStatus::Canceled,
                epoch: run.claim_epoch,
                attempts: run.attempts,
            };
            if run.status == RunStatus::Running {
                fx.aborted
                    .push((id, Some(run.claim_epoch), AbortReason::Canceled));
            }
            fx.wake = true;
            let events = self.wants_event(&id);
            let mut awaited = None;
            tx.update_run(&id, &mut |r| {
                r.status = RunStatus::Canceled;
                r.finished_at = now.into();
                r.updated_at = now;
                r.executing = false;
                r.clear_wait();
                if events {
                    fx.transitions.push(r.clone());
                }
                if !r.awaited_by().is_empty() {
                    awaited = Some(r.clone());
                }
            });
            tx.announce(announced);
            let attempt = announced.attempts + 1;
            self.note_cancel(tx, &id, root, cause, now, attempt);
            // Invoke waits on it fail (their runs resume), unless the
            // waiting run is being canceled in this same cascade.
            if let Some(r) = awaited {
                self.resolve_waiters(tx, &r, now, fx, Some(&doomed));
            }
        }
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
        self.cancel_for_scope_with_note(tenant, entity_type, entity_id, cascade, None)
    }

    /// `cancel_for_scope`, its `canceled` events noting the caller's `reason`.
    pub fn cancel_for_scope_with_note(
        &self,
        tenant: &TenantArg,
        entity_type: &str,
        entity_id: &str,
        cascade: bool,
        note: Option<&str>,
    ) -> Result<u32> {
        let filter = self.gate("cancelForScope", tenant)?;
        let note = note.map(|n| self.cancel_note(n));
        let note = note.as_deref();
        let t = filter.flatten();
        if self.names_nothing([t.as_deref(), Some(entity_type), Some(entity_id)]) {
            return Ok(0);
        }
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
                    self.cancel_tree(
                        tx,
                        *id,
                        (cascade, true),
                        CancelCause::Scope(note),
                        now,
                        &mut fx,
                    );
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
        if self.names_nothing([t.as_deref(), Some(entity_type), Some(entity_id)]) {
            return Ok(0);
        }
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
                    let attempt = super::attempts::run_attempt(tx, &id);
                    self.note(tx, &id, EventKind::Rescheduled, now, attempt, || {
                        Some(serde_json::json!({ "runAt": run_at }))
                    });
                    n += 1;
                }
            }
            Ok(n)
        })?;
        self.wake_worker();
        Ok(n)
    }
}
