//! The attempts this process has open, and the one place a run's
//! `timeoutMs` is enforced: each open attempt with a timeout has a deadline
//! here, and when it passes `expire_attempts` applies a `TimedOut` outcome
//! (retry or `timed_out`, per the run's policy) and tells the observer, so
//! JS aborts the handler's `ctx.signal`. JS runs no timer of its own for it.
//!
//! An attempt's clock starts when its handler does: at `begin_attempt`
//! (`tick`), or when JS says so for a worker's ticket (`attempt_started`),
//! which may have waited for the JS thread; it stops when the handler
//! settles (`attempt_settled`), before its outcome is stored.
//!
//! When: [`run_timeouts`], a task the binding starts per engine, sleeps
//! until the first deadline on the engine's clock and then tells the
//! observer (`timeouts_due`); whoever runs the handlers calls
//! `expire_attempts` on its next turn. A JS handler whose result is already
//! in the microtask queue when its deadline passes is not timed out by a
//! thread that saw the clock pass while the JS thread was busy: expiry
//! happens between macrotasks, as a JS timer would fire, and a handler
//! that settled first has stopped its clock (`attempt_settled`). A manual
//! clock's mover (`advanceTime`) expires at once.

use super::{AttemptEnd, AttemptTicket, Engine};
use crate::error::Result;
use crate::model::{AttemptOutcome, Millis, RunId};
use crate::store::Store;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use tokio::sync::Notify;

/// An attempt opened in this process and not yet ended.
struct Open {
    epoch: u32,
    /// Its run's `timeoutMs`.
    timeout_ms: Option<i64>,
    /// When it times out: `timeout_ms` after its handler started.
    deadline: Option<Millis>,
}

/// Open attempts by run, and their deadlines in time order. O(log n) per
/// attempt opened or ended; the due ones are the first of `deadlines`.
#[derive(Default)]
pub(super) struct OpenAttempts {
    by_run: HashMap<RunId, Open>,
    deadlines: BTreeSet<(Millis, RunId)>,
}

impl OpenAttempts {
    fn remove(&mut self, id: &RunId) {
        if let Some(Some(at)) = self.by_run.remove(id).map(|o| o.deadline) {
            self.deadlines.remove(&(at, *id));
        }
    }

    /// Stops the clock of an open attempt whose handler has settled (its
    /// outcome is on its way).
    fn stop(&mut self, id: &RunId, epoch: u32) {
        if let Some(o) = self.by_run.get_mut(id).filter(|o| o.epoch == epoch) {
            if let Some(at) = o.deadline.take() {
                self.deadlines.remove(&(at, *id));
            }
            // Started once: not again.
            o.timeout_ms = None;
        }
    }

    /// Starts the clock of an open attempt (once); whether its deadline is
    /// now the first one.
    fn start(&mut self, id: &RunId, epoch: u32, now: Millis) -> bool {
        let Some(o) = self.by_run.get_mut(id) else {
            return false;
        };
        let (Some(ms), None, true) = (o.timeout_ms, o.deadline, o.epoch == epoch) else {
            return false;
        };
        let at = now.saturating_add(ms);
        o.deadline = Some(at);
        let first = self.deadlines.first().is_none_or(|f| at < f.0);
        self.deadlines.insert((at, *id));
        first
    }

    /// Forgets the attempt `epoch` of `id` (`None`: whichever is open).
    pub(super) fn end(&mut self, id: &RunId, epoch: Option<u32>) {
        if self
            .by_run
            .get(id)
            .is_some_and(|o| epoch.is_none_or(|e| o.epoch == e))
        {
            self.remove(id);
        }
    }
}

impl<S: Store> Engine<S> {
    /// Records attempts just opened (after their transaction committed).
    /// `started`: their handlers start now (`tick`); otherwise each
    /// attempt's clock starts when its handler does (`attempt_started`): a
    /// ticket may wait for the JS thread, and that wait is not the
    /// handler's time.
    pub(super) fn open_attempts(&self, tickets: &[AttemptTicket], started: bool) {
        let now = self.clock.elapsed_now();
        let mut earlier = false;
        if let Ok(mut open) = self.open.lock() {
            for t in tickets {
                let id = t.run.id;
                open.remove(&id);
                open.by_run.insert(
                    id,
                    Open {
                        epoch: t.epoch,
                        timeout_ms: t.timeout_ms,
                        deadline: None,
                    },
                );
                if started {
                    earlier |= open.start(&id, t.epoch, now);
                }
            }
        }
        if earlier {
            // The timer sleeps until the first deadline: it must look again.
            self.timeouts_changed.notify_one();
        }
    }

    /// The handler of attempt `epoch` of `id` started: its timeout counts
    /// from now. No I/O (the attempts open are this process's).
    pub fn attempt_started(&self, id: &RunId, epoch: u32) {
        let now = self.clock.elapsed_now();
        let earlier = self
            .open
            .lock()
            .map(|mut o| o.start(id, epoch, now))
            .unwrap_or(false);
        if earlier {
            self.timeouts_changed.notify_one();
        }
    }

    /// The handler of attempt `epoch` of `id` settled within its time: its
    /// outcome is on its way (a worker reports outcomes in batches, a
    /// networked store stores them later), so the timer must not time it
    /// out meanwhile. No I/O.
    pub fn attempt_settled(&self, id: &RunId, epoch: u32) {
        if let Ok(mut o) = self.open.lock() {
            o.stop(id, epoch);
        }
    }

    /// Whether the attempt `epoch` of `id` is still open here: not ended,
    /// canceled, timed out or released since it was claimed. A worker asks
    /// before it hands out a prefetched attempt. O(1).
    pub fn attempt_open(&self, id: &RunId, epoch: u32) -> bool {
        self.open
            .lock()
            .map(|o| o.by_run.get(id).is_some_and(|a| a.epoch == epoch))
            .unwrap_or(false)
    }

    /// The attempt ended (its outcome applied, or it was released; or the
    /// worker found it is no longer its own).
    pub fn end_in_flight(&self, id: &RunId, epoch: u32) {
        if let Ok(mut open) = self.open.lock() {
            open.end(id, Some(epoch));
        }
    }

    /// When the first open attempt times out.
    pub fn next_timeout(&self) -> Option<Millis> {
        self.open
            .lock()
            .ok()
            .and_then(|o| o.deadlines.first().map(|d| d.0))
    }

    /// Applies a `TimedOut` outcome to every open attempt whose deadline
    /// has passed, in one transaction; returns how many runs it changed.
    /// An attempt that ended meanwhile is left alone (its epoch moved on).
    /// O(k log n) for k attempts due.
    pub fn expire_attempts(&self) -> Result<usize> {
        let now = self.clock.elapsed_now();
        let due: Vec<AttemptEnd> = {
            let Ok(open) = self.open.lock() else {
                return Ok(0);
            };
            open.deadlines
                .iter()
                .take_while(|(at, _)| *at <= now)
                .filter_map(|(_, id)| {
                    let o = open.by_run.get(id)?;
                    let timeout_ms = o.timeout_ms?;
                    Some(AttemptEnd {
                        id: *id,
                        epoch: o.epoch,
                        outcome: Some(AttemptOutcome::TimedOut { timeout_ms }),
                        ended_at: None,
                    })
                })
                .collect()
        };
        if due.is_empty() {
            return Ok(0);
        }
        let applied = self.settle(due, &[]).map(|s| s.applied)?;
        // The first deadline moved: the timer looks again. (Not after a
        // failure: the timer then asks again after its backoff.)
        self.timeouts_changed.notify_one();
        Ok(applied)
    }

    /// What the timer waits on besides the first deadline.
    pub fn timeouts_changed(&self) -> Arc<Notify> {
        self.timeouts_changed.clone()
    }
}

impl<S: Store> Engine<S> {
    /// Tells the observer that attempt timeouts are due.
    fn timeouts_due(&self) {
        let observer = self.observer.read().ok().and_then(|o| o.clone());
        if let Some(o) = observer {
            o.timeouts_due();
        }
    }
}

/// How long the timer waits for the expiry it asked for before asking
/// again (the JS thread may be busy for a while), doubling while the same
/// deadline stays due (the store is failing) up to `ASK_AT_MOST`.
const ASK_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);
const ASK_AT_MOST: std::time::Duration = std::time::Duration::from_secs(5);

/// The engine's timer for attempt timeouts, until the engine is dropped:
/// sleeps until the first deadline (elapsed time: a step of the wall clock
/// does not move it; a manual clock's `advanceTime` does) or until an
/// earlier one is added, then asks for the expiry (see the module docs).
/// Holds the engine only while it looks, so a dropped orchestrator's
/// engine goes.
pub async fn run_timeouts<S: Store>(engine: Weak<Engine<S>>) {
    let Some((changed, clock)) = engine
        .upgrade()
        .map(|e| (e.timeouts_changed(), e.clock().clone()))
    else {
        return;
    };
    // The deadline last asked for and how long to wait before asking again.
    let mut asked: Option<(Millis, std::time::Duration)> = None;
    loop {
        let next = match engine.upgrade() {
            Some(e) => {
                let next = e.next_timeout();
                if let Some(t) = next.filter(|t| *t <= clock.elapsed_now()) {
                    let wait = match asked {
                        Some((a, w)) if a == t => (w * 2).min(ASK_AT_MOST),
                        _ => ASK_AGAIN,
                    };
                    asked = Some((t, wait));
                    e.timeouts_due();
                    drop(e);
                    // Asked: look again once it may have been done.
                    tokio::select! {
                        _ = changed.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                asked = None;
                next
            }
            None => return,
        };
        let timer = async {
            match next {
                Some(at) => clock.sleep_until_elapsed(at).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = changed.notified() => {}
            _ = timer => {}
        }
    }
}
