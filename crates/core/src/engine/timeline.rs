//! The run timeline: every transition of a run is an event, recorded in the
//! transaction of the change (`note`, called by the rule that makes it) and
//! read back a page at a time (`list_run_events`).
//!
//! What each kind carries in `data`:
//!
//! | kind | where | data |
//! |---|---|---|
//! | `created` | the run row itself (not stored: a run that was only created costs nothing) | `trigger`, `triggerRef`, `parentRunId` |
//! | `started` | a claim (`attempts.rs`) | — (`attempt`: the attempt it opens) |
//! | `step_started` / `step_completed` / `step_failed` | `steps.rs` | `stepId`, `stepAttempt`; a failure its `error` and `retryInMs` |
//! | `retry_scheduled` | the settle path | `delayMs`, `error` |
//! | `waiting` / `resumed` | `waits.rs` | `wait` and `deadline` / `by` (`signal`, `token`, `child`, `deadline`, `resolved`) |
//! | `released` | a claim given back (stop, lost lease, orphan) | — |
//! | `rescheduled` | a scope's reschedule | `runAt` |
//! | `canceled` | `cancel.rs` | `reason`; `byRunId` when another run's cancel or failure did it |
//! | `timed_out` / `failed` / `completed` | the settle path | `error` / — |
//! | `replayed` | `replay.rs` | `from` |
//!
//! Cost: a hash lookup and a push per event in memory; one multi-row
//! insert per transaction on PostgreSQL. `set_timeline(false)` turns it off.

use super::{parse_run_id, Engine};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use serde_json::value::RawValue;
use serde_json::Value;
use std::sync::atomic::Ordering;

/// The most events one page holds.
const EVENTS_PAGE_MAX: usize = 1000;

/// Why a run was canceled, as its `canceled` event says.
#[derive(Debug, Clone, Copy)]
pub(super) enum CancelCause<'a> {
    /// `cancel(runId)`, with the `reason` its caller gave.
    Requested(Option<&'a str>),
    /// `cancelForScope`, with the `reason` its caller gave.
    Scope(Option<&'a str>),
    /// A `replace` start into its lane (the new run's id).
    Replaced(RunId),
    /// Its parent failed (the cascade of a failure).
    ParentFailed,
    /// The wait on it timed out (the waiting run's id).
    WaitTimedOut(RunId),
}

/// The most of a caller's cancel `reason` the timeline keeps (characters).
const CANCEL_NOTE_MAX: usize = 1000;

impl CancelCause<'_> {
    /// `data` of the `canceled` event of `run`, canceled in the cascade
    /// from `root`: the cause, the run whose cancel or failure did it, and
    /// the caller's own `reason` (as `note`, see `Engine::cancel_note`).
    fn data(self, run: RunId, root: RunId) -> Value {
        let note = match self {
            CancelCause::Requested(n) | CancelCause::Scope(n) => n,
            _ => None,
        };
        let (reason, by) = match self {
            CancelCause::Requested(_) => ("requested", None),
            CancelCause::Scope(_) => ("scope", None),
            CancelCause::Replaced(by) => ("replaced", Some(by)),
            CancelCause::ParentFailed => ("parent failed", None),
            CancelCause::WaitTimedOut(by) => ("wait timed out", Some(by)),
        };
        // A descendant was canceled by its ancestor's cancel.
        let by = if run == root { by } else { Some(root) };
        let mut data = serde_json::Map::new();
        data.insert("reason".into(), reason.into());
        if let Some(by) = by {
            data.insert("byRunId".into(), by.to_string().into());
        }
        if let Some(n) = note {
            data.insert("note".into(), n.into());
        }
        Value::Object(data)
    }
}

impl<S: Store> Engine<S> {
    /// A caller's cancel `reason` as its `canceled` events keep it: its
    /// first `CANCEL_NOTE_MAX` characters (code points), in a form the
    /// store holds (PostgreSQL's jsonb has no NUL: U+FFFD, as for error
    /// texts; refused, it failed the cancel).
    pub(super) fn cancel_note(&self, reason: &str) -> String {
        let mut note: String = reason.chars().take(CANCEL_NOTE_MAX).collect();
        self.store.storable_text(&mut note);
        note
    }

    /// Turns the timeline on (the default) or off for the transitions that
    /// follow; what was recorded stays readable.
    pub fn set_timeline(&self, on: bool) {
        self.timeline.store(on, Ordering::Relaxed);
    }

    pub fn timeline(&self) -> bool {
        self.timeline.load(Ordering::Relaxed)
    }

    /// Records that `kind` happened to `run` at `at`, in `tx` (the one way
    /// a rule writes the timeline). `data` is built only when the timeline
    /// is on.
    pub(super) fn note(
        &self,
        tx: &mut S::Tx<'_>,
        run: &RunId,
        kind: EventKind,
        at: Millis,
        attempt: u32,
        data: impl FnOnce() -> Option<Value>,
    ) {
        // The counters and histograms of `metrics.rs` (the row is in the
        // transaction's hands already: no read of the store).
        if matches!(
            kind,
            EventKind::Started
                | EventKind::RetryScheduled
                | EventKind::Completed
                | EventKind::Failed
                | EventKind::TimedOut
                | EventKind::Canceled
        ) {
            if let Some(r) = tx.run(run) {
                self.metrics.transition(kind, r, at);
            }
        }
        if !self.timeline() {
            return;
        }
        let data = data().and_then(|v| RawValue::from_string(v.to_string()).ok());
        tx.record_event(RunEvent {
            id: 0,
            run: *run,
            at,
            kind,
            attempt,
            data,
        });
    }

    /// `cause`'s `canceled` event for `run` (in the cascade from `root`).
    pub(super) fn note_cancel(
        &self,
        tx: &mut S::Tx<'_>,
        run: &RunId,
        root: RunId,
        cause: CancelCause<'_>,
        at: Millis,
        attempt: u32,
    ) {
        self.note(tx, run, EventKind::Canceled, at, attempt, || {
            Some(cause.data(*run, root))
        });
    }

    /// One page of a run's timeline, oldest first: its `created` event (on
    /// the first page), then the stored events after `after` (an event's
    /// `id`, from the previous page). Answers the events and the cursor of
    /// the next page (`None` on the last). Tenant-gated: a run of another
    /// tenant is not found. O(log e + limit).
    pub fn list_run_events(
        &self,
        run_id: &str,
        tenant: &TenantArg,
        after: Option<u64>,
        limit: usize,
    ) -> Result<(Vec<RunEvent>, Option<u64>)> {
        let filter = self.gate("listRunEvents", tenant)?;
        let not_found = || JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        };
        let id = parse_run_id(run_id).ok_or_else(not_found)?;
        let limit = limit.clamp(1, EVENTS_PAGE_MAX);
        self.read(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| Self::visible(&filter, r))
                .ok_or_else(not_found)?;
            let mut page = Vec::with_capacity(limit.min(64));
            if after.is_none() {
                page.push(created_event(run));
            }
            // One more than the page holds says whether another follows.
            let want = limit + 1 - page.len();
            page.extend(tx.run_events(&id, after.unwrap_or(0), want));
            let next = if page.len() > limit {
                page.truncate(limit);
                page.last().map(|e| e.id)
            } else {
                None
            };
            Ok((page, next))
        })
    }
}

/// A run's `created` event: its row's creation and trigger.
fn created_event(r: &RunRow) -> RunEvent {
    let mut data = serde_json::Map::new();
    data.insert("trigger".into(), r.trigger_source.as_str().into());
    if let Some(t) = r.trigger_ref() {
        data.insert("triggerRef".into(), t.into());
    }
    if let Some(p) = r.parent_run_id() {
        data.insert("parentRunId".into(), p.to_string().into());
    }
    RunEvent {
        id: 0,
        run: r.id,
        at: r.created_at,
        kind: EventKind::Created,
        attempt: 0,
        data: RawValue::from_string(Value::Object(data).to_string()).ok(),
    }
}
