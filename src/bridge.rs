//! The threadsafe-function bridge: how the engine reaches JS. Two weak
//! threadsafe functions per engine (so an idle engine never keeps Node
//! alive), both fire-and-forget, never blocking the JS thread:
//! - `onNotice`: aborts to fire, run events and "timeouts are due" are
//!   queued in [`Notices`]; JS drains them with `takeNotices` right after
//!   the native call that raised them, and this function nudges it for
//!   notices raised on the engine's own threads;
//! - `onBatch`: a worker's claimed attempts, as tickets one per line
//!   (`wire::ticket_text`), or a `!` line with a notice for the operator.
//!   JS runs the handlers and reports the outcomes with `workerReport`.

use crate::wire;
use jobforge_core::engine::{AttemptTicket, EngineObserver};
use jobforge_core::worker::BatchDispatcher;
use jobforge_core::{AbortReason, RunId, RunRow};
use napi::threadsafe_function::{
    ThreadsafeFunction, ThreadsafeFunctionCallMode, UnknownReturnValue,
};
use napi::Status;
use std::sync::{Arc, Mutex};

/// `(payload) => void`, not error-first (`CalleeHandled = false`), weak.
pub type JsFn = ThreadsafeFunction<String, UnknownReturnValue, String, Status, false, true>;

/// What the engine tells JS: aborts to fire and (when enabled) transition
/// events, queued until JS takes them.
#[derive(Default)]
pub struct Notices {
    aborts: Vec<(RunId, Option<u32>, AbortReason)>,
    events: Vec<String>,
    /// Attempt timeouts are due: JS calls `expireAttempts` on its turn.
    expire: bool,
    /// Messages for the orchestrator's logger (`EngineObserver::trouble`).
    troubles: Vec<String>,
}

pub type NoticeQueue = Arc<Mutex<Notices>>;

/// Drains queued notices as `wire::notices_text`; `None` when there are none.
pub fn take_notices(q: &NoticeQueue) -> Option<String> {
    let taken = std::mem::take(&mut *q.lock().ok()?);
    if taken.aborts.is_empty()
        && taken.events.is_empty()
        && !taken.expire
        && taken.troubles.is_empty()
    {
        return None;
    }
    Some(wire::notices_text(
        &taken.aborts,
        &taken.events,
        taken.expire,
        &taken.troubles,
    ))
}

/// Whether notices wait to be taken (saves JS a call when there are none).
pub fn has_notices(q: &NoticeQueue) -> bool {
    q.lock()
        .map(|p| !p.aborts.is_empty() || !p.events.is_empty() || p.expire || !p.troubles.is_empty())
        .unwrap_or(false)
}

/// The engine's observer: queues notices, and nudges JS for those raised
/// off the JS thread (a weak threadsafe function alone could be dropped
/// when the event loop has nothing else to do, so JS also drains after
/// each call).
pub struct JsObserver {
    pub on_notice: JsFn,
    pub queue: NoticeQueue,
    /// Notices raised on the JS thread are drained right after the call
    /// that raised them; only the engine's own threads need the nudge.
    pub js_thread: std::thread::ThreadId,
}

/// Notices raised on the JS thread are taken right after the call that
/// raised them, but only when JS listens; past this many waiting, JS is
/// nudged anyway, so a queue nobody wants stays small.
const NUDGE_ANYWAY: usize = 1024;

impl JsObserver {
    fn nudge(&self) {
        let waiting = self
            .queue
            .lock()
            .map(|q| q.aborts.len() + q.events.len())
            .unwrap_or(0);
        if std::thread::current().id() != self.js_thread || waiting.is_multiple_of(NUDGE_ANYWAY) {
            // NonBlocking on an unbounded queue: only `Closing` (Node
            // shutting down) can fail, and then there is nobody to tell.
            let _ = self
                .on_notice
                .call(String::new(), ThreadsafeFunctionCallMode::NonBlocking);
        }
    }
}

impl EngineObserver for JsObserver {
    fn run_aborted(&self, run_id: RunId, epoch: Option<u32>, reason: AbortReason) {
        if let Ok(mut p) = self.queue.lock() {
            p.aborts.push((run_id, epoch, reason));
        }
        self.nudge();
    }

    fn run_events(&self, rows: Vec<RunRow>) {
        if let Ok(mut p) = self.queue.lock() {
            p.events.extend(rows.iter().map(|r| r.to_compact_json()));
        }
        self.nudge();
    }

    fn timeouts_due(&self) {
        if let Ok(mut p) = self.queue.lock() {
            p.expire = true;
        }
        self.nudge();
    }

    fn trouble(&self, message: String) {
        if let Ok(mut p) = self.queue.lock() {
            p.troubles.push(message);
        }
        self.nudge();
    }
}

/// A worker's way to JS.
pub struct JsBatch {
    pub on_batch: JsFn,
    /// Whether tickets carry the run row. Postgres tickets do (JS cannot
    /// read it back synchronously); in memory JS reads it on demand
    /// (`claimedRun`), unless retention is on: a canceled or timed-out run
    /// may then be deleted while its handler still runs, and `ctx.run` /
    /// `ctx.logger` must still work.
    pub with_row: bool,
}

impl BatchDispatcher for JsBatch {
    fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool {
        let text = tickets
            .iter()
            .map(|t| wire::ticket_text(t, self.with_row))
            .collect::<Vec<_>>()
            .join("\n");
        // Unbounded queue: QueueFull cannot happen; Closing means Node is
        // going away and the caller releases the runs.
        self.on_batch
            .call(text, ThreadsafeFunctionCallMode::NonBlocking)
            == Status::Ok
    }

    /// A notice reaches JS as a batch starting with `!` (a ticket starts
    /// with its run id, never with `!`).
    fn notice(&self, message: String) {
        let line = format!("!{}", message.replace('\n', " "));
        let _ = self
            .on_batch
            .call(line, ThreadsafeFunctionCallMode::NonBlocking);
    }
}
