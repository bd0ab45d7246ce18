//! # jobforge-core
//!
//! The jobforge engine: runs, concurrency lanes, dedupe, retries, steps,
//! parent-close cascade and the store boundary. It has no napi dependency;
//! the `jobforge` crate binds it to Node.js.
//!
//! ## Cost of each operation (in-memory store, n = runs held)
//!
//! | operation | cost | why |
//! |---|---|---|
//! | `register` | O(1) | hash insert |
//! | `start` (unkeyed) | O(log n) | one insert into the pool's ordered set |
//! | `start` with dedupe key | O(log n) + skipped | keyed list in created order, walked from the newest; stops at the window edge |
//! | `start` with concurrency key | O(log n + k) | lane lookup; `reject` reads the head; `replace` cancels its k runs |
//! | `claim_next` | O(log n) amortised | first entry of the pool's ready set; each run moves from `future` to `ready` once |
//! | `finish_attempt` | O(log n) + cascade | re-index one run; the next lane head is indexed in O(log n) |
//! | `cancel` | O(affected rows · log n) | walks children lists only, skipping `abandon` subtrees |
//! | `replay` | O(log n + s) | s = the run's steps |
//! | `step_begin` / `step_complete` / `step_fail` | O(1) | per-run step map |
//! | `find_by_id` | O(1) | hash lookup |
//! | `list_steps` | O(s log s) | the run's own steps |
//! | `put_schedule` / `remove_schedule` | O(log k) | k = schedules; ordered map + due set |
//! | `fire_due_schedules` | O(log k), + O(log k + log n) per run started | a peek at the earliest next fire |
//!
//! No operation scans all runs.
//!
//! With retention on, the in-memory store first deletes the runs past their
//! retention at the start of every call: O(1) when none is due (a look at
//! the oldest finished run), O(log n) per run deleted, each run once.

// Modules depend one way, from the leaves up: `clock`, `cron` and
// `template` use no other; `model` uses those; `error` uses `model` and
// converts `template`'s errors; `store` uses `model` and `error`;
// `engine` the store; `worker` the engine; `feed` the engine and the
// worker's reconnect backoff. `random` (retry jitter) uses nothing.
pub mod clock;
pub mod cron;
pub mod engine;
pub mod error;
pub mod feed;
pub mod model;
pub mod random;
pub mod store;
pub mod template;
pub mod worker;

pub use clock::{Clock, ClockKind};
pub use engine::{
    AttemptEnd, AttemptTicket, Engine, EngineObserver, EngineOptions, MemoStep, Settled, StepBegin,
};
pub use error::{JobError, Result, StoreOutcome};
pub use model::*;
pub use store::memory::MemoryStore;
pub use store::{Coordination, Store, StoreAdmin, StoreTx};
