//! What goes out of the engine besides answers: waking a waiting worker,
//! transition events and watchers, the observer, and moving a manual
//! clock.

use super::{Effects, Engine, EngineObserver};
use crate::error::Result;
use crate::model::*;
use crate::store::{Store, StoreTx, Transition};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::Notify;

impl<S: Store> Engine<S> {
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
    pub(super) fn wake_worker_for(&self, pool: &str) {
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
    pub(super) fn wants_event(&self, id: &RunId) -> bool {
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

    /// Whether anyone in this process hears transitions: a listener of run
    /// events or a `waitForRun` (so a shared store's other processes are
    /// worth listening to).
    pub fn events_wanted(&self) -> bool {
        self.events_enabled.load(Ordering::SeqCst) || self.watched_any.load(Ordering::SeqCst)
    }

    /// Reports transitions other processes committed (their store told of
    /// them, see `Coordination::listen_transitions`) as run events, for
    /// the runs someone here wants to hear of. Each row is read back in
    /// one read; a run that has moved on since (claimed again, replayed,
    /// purged) is skipped rather than reported in a state its event does
    /// not name: its later transition is told in its turn. Returns how
    /// many were reported.
    pub fn report_transitions_elsewhere(&self, told: &[Transition]) -> Result<usize> {
        let wanted: Vec<&Transition> = told.iter().filter(|t| self.wants_event(&t.run)).collect();
        if wanted.is_empty() {
            return Ok(0);
        }
        let ids: Vec<RunId> = wanted.iter().map(|t| t.run).collect();
        let rows = self.read(|tx| {
            tx.prefetch(&ids);
            Ok(wanted
                .iter()
                .filter_map(|t| tx.run(&t.run).filter(|r| t.shown_by(r)).cloned())
                .collect::<Vec<RunRow>>())
        })?;
        let n = rows.len();
        self.deliver(Effects {
            aborted: Vec::new(),
            transitions: rows,
            ..Effects::default()
        });
        Ok(n)
    }

    /// Tells the observer of trouble outside any call (see
    /// `EngineObserver::trouble`).
    pub fn report_trouble(&self, message: String) {
        let observer = self.observer.read().ok().and_then(|o| o.clone());
        if let Some(o) = observer {
            o.trouble(message);
        }
    }

    pub fn set_observer(&self, observer: Arc<dyn EngineObserver>) {
        if let Ok(mut o) = self.observer.write() {
            *o = Some(observer);
        }
    }

    /// Reports that a run executing in this process was stopped by another
    /// process (its attempt's outcome will be ignored): the observer fires
    /// the handler's signal. A no-op for runs this process is not running.
    pub fn abort_local(&self, id: RunId, epoch: Option<u32>, reason: AbortReason) {
        self.deliver(Effects {
            aborted: vec![(id, epoch, reason)],
            ..Effects::default()
        });
    }

    /// The notification schedule firing waits on, besides its timer.
    pub fn schedules_changed(&self) -> Arc<Notify> {
        self.schedules_changed.clone()
    }

    /// Moves a manual clock. `None` on the system clock.
    pub fn advance_time(&self, ms: i64) -> Option<Millis> {
        let moved = self.clock.advance(ms);
        if moved.is_some() {
            // Sleeps and wait deadlines now past resume at once, worker or
            // not (a manual clock is a test's: a networked store's
            // transaction on the caller's thread is the price of that).
            let _ = self.resume_due_waits_then_next();
        }
        if moved.is_some() {
            // Runs (and retries) may be due now: a worker that waits on a
            // poll interval rather than on this clock (Postgres) looks again.
            self.activity.notify_one();
            self.schedules_changed.notify_one();
        }
        moved
    }
}
