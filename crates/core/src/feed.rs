//! Run events from other processes: while anyone in this process hears
//! transitions (a run-event listener, a `waitForRun`), a thread of its own
//! listens to the shared store's announcements
//! ([`Coordination::listen_transitions`]) and reports them through the
//! engine ([`Engine::report_transitions_elsewhere`]), which reads each row
//! back and delivers it like a transition of this process.
//!
//! The thread runs only while it is wanted and not closed: with nobody
//! listening there is no LISTEN connection and no thread (the announcing
//! side pays one `pg_notify` per batch of transitions whoever listens).
//! It ends by itself within ~200 ms of not being wanted any more (the
//! listener asks that often), and with it its connection. A store no one
//! shares has no other process: the feed never starts.

use crate::engine::Engine;
use crate::store::{Coordination, Store, Transition};
use crate::worker::backoff;
use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether the feed's thread runs, and whether the orchestrator closed it.
#[derive(Default)]
struct FeedState {
    /// `close()` was called and no listener or wait arrived since.
    closed: bool,
    /// The thread is running (it clears this itself, under the lock, when
    /// it finds it is no longer wanted, so a change racing its exit either
    /// keeps it or starts a new one).
    running: bool,
}

/// The listener of other processes' run events for one engine.
#[derive(Default)]
pub struct EventFeed {
    state: Arc<Mutex<FeedState>>,
}

/// Longest sleep between two looks at whether the feed is still wanted
/// while it waits to reconnect.
const LOOK_EVERY: Duration = Duration::from_millis(100);

impl EventFeed {
    pub fn new() -> Self {
        Self::default()
    }

    /// Called after what the engine wants to hear changed
    /// (`Engine::set_events`, `Engine::watch_run`): starts the thread if it
    /// is now wanted, and `listen` (a new listener or wait) reopens a feed
    /// `close` ended. Returns whether the feed listens now.
    pub fn sync<S: Store + Coordination>(&self, engine: &Arc<Engine<S>>, listen: bool) -> bool {
        if !engine.store().shared() {
            return false;
        }
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        if listen {
            state.closed = false;
        }
        if state.closed || !engine.events_wanted() {
            return false;
        }
        if state.running {
            return true;
        }
        state.running = self.spawn(engine.clone());
        state.running
    }

    /// Stops listening (the orchestrator was closed or dropped); a later
    /// `sync` with `listen` starts again.
    pub fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
        }
    }

    /// The thread: listens while wanted, reconnecting after an error
    /// (waits doubling from 0.5 s to 5 s while it keeps failing; what is
    /// committed meanwhile is not told). Returns whether it started.
    fn spawn<S: Store + Coordination>(&self, engine: Arc<Engine<S>>) -> bool {
        let state = self.state.clone();
        std::thread::Builder::new()
            .name("jobforge-events".to_owned())
            .spawn(move || {
                let wanted =
                    || engine.events_wanted() && state.lock().map(|s| !s.closed).unwrap_or(false);
                let mut failures = 0;
                // Whether trouble was reported and not yet its end: one
                // message when it starts, one when events arrive again.
                let troubled = Cell::new(false);
                let trouble = |what: String| {
                    if !troubled.replace(true) {
                        engine.report_trouble(format!(
                            "jobforge: run events of other processes are not received ({what}); \
                             retrying, and transitions committed meanwhile are not heard"
                        ));
                    }
                };
                let untroubled = || {
                    if troubled.replace(false) {
                        engine.report_trouble(
                            "jobforge: run events of other processes are received again".to_owned(),
                        );
                    }
                };
                loop {
                    {
                        // Decided under the lock `sync` takes: a listener
                        // added right now either sees this thread running or
                        // starts the next one.
                        let Ok(mut s) = state.lock() else { return };
                        if s.closed || !engine.events_wanted() {
                            s.running = false;
                            return;
                        }
                    }
                    let report = |told: Vec<Transition>| {
                        // A failed read loses these events (best effort,
                        // like a notification missed while reconnecting).
                        match engine.report_transitions_elsewhere(&told) {
                            Ok(_) => untroubled(),
                            Err(e) => trouble(format!("reading their rows failed: {e}")),
                        }
                    };
                    let began = Instant::now();
                    let listened = engine
                        .store()
                        .listen_transitions(&wanted, &untroubled, &report);
                    if let Err(e) = listened {
                        trouble(format!("listening failed: {e}"));
                        if began.elapsed() > Duration::from_secs(10) {
                            failures = 0;
                        }
                        let wait =
                            backoff(Duration::from_millis(500), Duration::from_secs(5), failures);
                        failures += 1;
                        let until = Instant::now() + wait;
                        while wanted() && Instant::now() < until {
                            std::thread::sleep(LOOK_EVERY.min(until - Instant::now()));
                        }
                    }
                }
            })
            .is_ok()
    }
}
