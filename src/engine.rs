//! `NativeEngine`: the one class JS holds, over any store. The operations
//! are `ops.rs`'s list, reached through `callSync` (a store answering in
//! nanoseconds, on the JS thread) or `call` (a networked store, on a
//! blocking thread); the few methods beside them are the per-run hot paths
//! (buffered starts, worker reports) and calls that never do I/O.

use crate::bridge::{self, JsBatch, JsFn, JsObserver, NoticeQueue};
use crate::ops::{self, AnyStore};
use crate::wire::{self, invalid, to_napi, Result};
use jobforge_core::engine::{run_timeouts, AttemptEnd, Retention};
use jobforge_core::feed::EventFeed;
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::worker::{Worker, WorkerTimings, MAX_PREFETCH};
use jobforge_core::{
    ClockKind, Coordination, Engine, EngineOptions, MemoryStore, RunId, StoreAdmin,
};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

#[napi(object)]
pub struct NativeOptions {
    /// `'memory'` (default) or `'postgres'`.
    pub store: Option<String>,
    /// Tenant gate on every call (CONTRACT.md "Tenant gate").
    pub multi_tenant: Option<bool>,
    /// `'system'` (default) or `'manual'` (moved only by `advanceTime`).
    pub clock: Option<String>,
    /// Keep completed runs this many ms after they finish (default: forever).
    pub retain_completed_ms: Option<f64>,
    /// Keep failed, timed-out and canceled runs this many ms (default: forever).
    pub retain_failed_ms: Option<f64>,
    /// Postgres: `postgres://user:password@host:port/database`.
    pub url: Option<String>,
    /// Postgres: schema holding jobforge's tables. Default `public`.
    pub schema: Option<String>,
    /// Postgres: connection pool size per process. Default 10.
    pub max_connections: Option<u32>,
    /// Postgres: a claimed run whose lease (`claimed_at`) is not renewed for
    /// this long goes back to `pending` (its worker died). Default 30000.
    pub lease_ms: Option<f64>,
    /// Postgres: polling fallback when no notification arrives. Default 1000.
    pub poll_ms: Option<f64>,
    /// Postgres: runs each worker pool claims ahead of its free slots
    /// (0: none). Default: each pool's pace (what it ended in the last
    /// 100 ms), from its concurrency up to `DEFAULT_PREFETCH`.
    pub prefetch: Option<f64>,
    /// Record every transition in the run timeline (`listRunEvents`).
    /// Default true.
    pub timeline: Option<bool>,
}

/// Native bytes V8 is told each held run costs (RSS per pending run
/// measured at 1M runs: ~340 B).
const RUN_BYTES: i64 = 340;
/// V8 hears of a change in the engine's size once it reaches this much, so
/// the hot paths rarely pay for the call.
const REPORT_STEP: i64 = 1 << 20;
/// The most one engine reports. The report only has to make a dropped
/// engine worth collecting; reporting all of a large live one makes V8 run
/// full collections that free nothing while it grows, and leaves its heap
/// sized larger (measured: +16 B RSS per run at 1M runs).
const REPORT_CAP: i64 = 32 << 20;

/// The engine over one store, with its worker.
struct Hosted<S: AnyStore> {
    engine: Arc<Engine<S>>,
    worker: Mutex<Option<Arc<Worker<S>>>>,
    /// Other processes' run events, while anyone here hears them.
    feed: EventFeed,
    timings: WorkerTimings,
    /// Bytes of native memory reported to V8 (`adjust_external_memory`):
    /// without it the collector sees a small JS object, feels no pressure
    /// to collect an unreachable orchestrator, and its runs stay in memory.
    reported: AtomicI64,
}

enum Inner {
    Memory(Hosted<MemoryStore>),
    Postgres(Hosted<PgStore>),
}

/// Runs `$body` with `$h` bound to the hosted engine, whatever its store.
macro_rules! hosted {
    ($self:expr, $h:ident => $body:expr) => {
        match &$self.inner {
            Inner::Memory($h) => $body,
            Inner::Postgres($h) => $body,
        }
    };
}

#[napi(custom_finalize)]
pub struct NativeEngine {
    inner: Inner,
    notices: NoticeQueue,
}

fn engine_options(o: &NativeOptions) -> Result<EngineOptions> {
    let clock = match o.clock.as_deref() {
        None | Some("system") => ClockKind::System,
        Some("manual") => ClockKind::Manual,
        Some(other) => {
            return Err(invalid(format!(
                "clock must be 'system' or 'manual', got '{other}'"
            )))
        }
    };
    Ok(EngineOptions {
        multi_tenant: o.multi_tenant.unwrap_or(false),
        clock,
        retention: Retention {
            completed_ms: retention_ms(o.retain_completed_ms, "retention.completedMs")?,
            failed_ms: retention_ms(o.retain_failed_ms, "retention.failedMs")?,
        },
    })
}

fn retention_ms(v: Option<f64>, name: &str) -> Result<Option<i64>> {
    match v {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some(ms as i64)),
        Some(ms) if ms == f64::INFINITY => Ok(None),
        Some(ms) => Err(invalid(format!(
            "{name} must be a non-negative number of ms, got {ms}"
        ))),
    }
}

fn positive_ms(v: Option<f64>, name: &str, default: i64) -> Result<i64> {
    match v {
        None => Ok(default),
        Some(ms) if ms.is_finite() && ms > 0.0 => Ok(ms as i64),
        Some(ms) => Err(invalid(format!(
            "{name} must be a positive number of ms, got {ms}"
        ))),
    }
}

/// Runs `f` on a blocking thread; a panic there becomes an error.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(invalid(format!("internal error in a database call: {e}"))),
    }
}

#[napi]
impl NativeEngine {
    /// Creates the engine; a networked store connects on first use.
    #[napi(
        constructor,
        ts_args_type = "options: NativeOptions, onNotice: (nothing: string) => void"
    )]
    pub fn new(options: NativeOptions, on_notice: JsFn) -> Result<Self> {
        let engine_opts = engine_options(&options)?;
        let notices = NoticeQueue::default();
        let timings = WorkerTimings {
            lease_ms: positive_ms(options.lease_ms, "postgres.leaseMs", 30_000)?,
            poll_ms: positive_ms(options.poll_ms, "postgres.pollMs", 1_000)?,
            prefetch: match options.prefetch {
                // Each pool its concurrency (`WorkerTimings::prefetch`).
                None => None,
                Some(n)
                    if n.is_finite()
                        && n >= 0.0
                        && n.fract() == 0.0
                        && n <= MAX_PREFETCH as f64 =>
                {
                    Some(n as usize)
                }
                Some(n) => {
                    return Err(invalid(format!(
                        "postgres.prefetch must be a whole number from 0 to {MAX_PREFETCH}, got {n}"
                    )))
                }
            },
        };
        let inner = match options.store.as_deref() {
            None | Some("memory") => Inner::Memory(Hosted::new(
                MemoryStore::new(),
                engine_opts,
                timings,
                on_notice,
                &notices,
            )),
            Some("postgres") => {
                let url = options
                    .url
                    .clone()
                    .ok_or_else(|| invalid("a postgres store needs a url"))?;
                let mut config = PgConfig::new(url);
                if let Some(s) = options.schema.clone() {
                    config.schema = s;
                }
                if let Some(n) = options.max_connections {
                    if n == 0 {
                        return Err(invalid("postgres.maxConnections must be at least 1"));
                    }
                    config.max_connections = n as usize;
                }
                let store = PgStore::new(config).map_err(to_napi)?;
                Inner::Postgres(Hosted::new(
                    store,
                    engine_opts,
                    timings,
                    on_notice,
                    &notices,
                ))
            }
            Some(other) => {
                return Err(invalid(format!(
                    "store must be 'memory' or 'postgres', got '{other}'"
                )))
            }
        };
        let timeline = options.timeline.unwrap_or(true);
        let engine = NativeEngine { inner, notices };
        hosted!(engine, h => h.engine.set_timeline(timeline));
        Ok(engine)
    }

    // ── operations ─────────────────────────────────────────────────────

    /// Runs operation `op` (its position in `opNames()`) on the JS thread:
    /// only for a store whose transactions run inline (no I/O).
    #[napi(catch_unwind)]
    pub fn call_sync(&self, env: Env, op: u32, request: String) -> Result<String> {
        hosted!(self, h => {
            if !h.engine.store().inline() {
                return Err(invalid(
                    "this store answers asynchronously: use call(), not callSync()",
                ));
            }
            let out = ops::run(&h.engine, op, &request);
            // Starts grow the store, retention shrinks it.
            h.report_size(&env);
            out
        })
    }

    /// Runs operation `op` on a blocking thread (the JS thread never waits
    /// on the store).
    #[napi]
    pub async fn call(&self, op: u32, request: String) -> Result<String> {
        hosted!(self, h => {
            let e = h.engine.clone();
            blocking(move || ops::run(&e, op, &request)).await
        })
    }

    /// Checks and builds definitions from specs without storing them (a
    /// networked store's are written later with `register`): the rows and
    /// their templates (as `register` answers), or the first error.
    #[napi(catch_unwind)]
    pub fn validate_definitions(&self, specs: String) -> Result<String> {
        let specs = ops::definition_specs(&specs)?;
        hosted!(self, h => {
            let defs = h.engine.validate_definitions(specs).map_err(to_napi)?;
            Ok(wire::registered_text(&h.engine, &defs.iter().collect::<Vec<_>>()))
        })
    }

    // ── no I/O ─────────────────────────────────────────────────────────

    /// Drains queued notices (`wire::notices_text`), or null when none.
    #[napi(catch_unwind)]
    pub fn take_notices(&self) -> Option<String> {
        bridge::take_notices(&self.notices)
    }

    /// Turns transition events for every run on or off. Returns whether
    /// they are on and the engine listens for other processes' as well (a
    /// shared store): JS then keeps the process alive, as a listener on a
    /// socket would, until they are turned off or the engine is closed.
    #[napi(catch_unwind)]
    pub fn set_events(&self, enabled: bool) -> bool {
        hosted!(self, h => {
            h.engine.set_events(enabled);
            h.feed.sync(&h.engine, enabled) && enabled
        })
    }

    /// Watches (or stops watching) one run's transitions, for `waitForRun`
    /// (other processes' too, on a shared store).
    #[napi(catch_unwind)]
    pub fn watch_run(&self, run_id: String, on: bool) {
        if let Ok(id) = run_id.parse::<RunId>() {
            hosted!(self, h => {
                h.engine.watch_run(id, on);
                h.feed.sync(&h.engine, on);
            });
        }
    }

    /// Engine time in epoch ms.
    #[napi(catch_unwind)]
    pub fn now(&self) -> f64 {
        hosted!(self, h => h.engine.now() as f64)
    }

    /// Moves a manual clock; returns the new time, or null on the system
    /// clock. A store whose transactions run inline applies the timeouts
    /// that fell due at once (their notices wait to be taken); otherwise
    /// the engine's timer does, woken by the move.
    #[napi(catch_unwind)]
    pub fn advance_time(&self, ms: f64) -> Result<Option<f64>> {
        hosted!(self, h => {
            let t = h.engine.advance_time(ms as i64);
            if t.is_some() && h.engine.store().inline() {
                h.engine.expire_attempts().map_err(to_napi)?;
            }
            Ok(t.map(|t| t as f64))
        })
    }

    /// The handler of a worker's attempt started: its run's timeout counts
    /// from now (the engine's timer enforces it). No I/O.
    #[napi(catch_unwind)]
    pub fn attempt_started(&self, run_id: String, epoch: u32) {
        if let Ok(id) = run_id.parse::<RunId>() {
            hosted!(self, h => h.engine.attempt_started(&id, epoch));
        }
    }

    /// The handler of an attempt with a timeout settled: the timer stops
    /// (its outcome follows). No I/O.
    #[napi(catch_unwind)]
    pub fn attempt_settled(&self, run_id: String, epoch: u32) {
        if let Ok(id) = run_id.parse::<RunId>() {
            hosted!(self, h => h.engine.attempt_settled(&id, epoch));
        }
    }

    /// `count` (at most 4096) fresh run ids (UUID v4), concatenated: JS
    /// hands them out to starts it answers itself.
    #[napi(catch_unwind)]
    pub fn new_run_ids(&self, count: u32) -> String {
        let n = count.min(4096) as usize;
        let mut out = String::with_capacity(n * 36);
        let mut buf = RunId::encode_buffer();
        for _ in 0..n {
            out.push_str(RunId::new_v4().hyphenated().encode_lower(&mut buf));
        }
        out
    }

    /// Lets idle connections go and stops listening for other processes'
    /// events; a networked store reopens on demand, and the next listener
    /// or wait listens again.
    #[napi(catch_unwind)]
    pub fn close(&self) {
        hosted!(self, h => {
            h.feed.close();
            h.engine.store().close();
        });
    }

    // ── hot paths of a store whose transactions run inline ─────────────

    /// Creates runs JS has already answered `start` for, one per line
    /// (`wire::parse_start_line`). `fed`: claim into the worker's free slots
    /// in the same call. Answers one line per ticket claimed, and
    /// `!<line index> <message>` for each run that could not be created.
    #[napi(catch_unwind)]
    pub fn start_batch(&self, env: Env, batch: String, fed: bool) -> Result<String> {
        hosted!(self, h => {
            let (problems, pools) = h.create_buffered(&batch, !fed)?;
            h.report_size(&env);
            let mut out = String::new();
            if fed {
                h.fill_into(&mut out, Some(&pools))?;
                // The worker's loop may hold the free slots' reservations
                // right now, so this claim can come up short; it was not
                // woken for these runs (`fed`), so wake it.
                let created = batch.lines().filter(|l| !l.is_empty()).count().saturating_sub(problems.len());
                let claimed = out.lines().filter(|l| !l.is_empty()).count();
                if claimed < created {
                    h.engine.wake_worker();
                }
            }
            wire::push_lines(&mut out, &problems);
            Ok(out)
        })
    }

    /// The row of a run a worker ticket handed out, for `ctx.run` (no
    /// tenant gate: the handler already holds the run). Null once purged,
    /// or when the store does not answer inline (its tickets carry the row).
    #[napi(catch_unwind)]
    pub fn claimed_run(&self, run_id: String) -> Option<String> {
        let id = run_id.parse::<RunId>().ok()?;
        hosted!(self, h => h
            .engine
            .store()
            .inline()
            .then(|| h.engine.run_row(&id).map(|r| r.to_compact_json()))
            .flatten())
    }

    // ── worker ─────────────────────────────────────────────────────────

    /// Starts the worker for `pools` (`[{"name","concurrency"}]`); claimed
    /// attempts reach `onBatch` as tickets, one per line.
    #[napi(
        catch_unwind,
        ts_args_type = "pools: string, onBatch: (tickets: string) => void"
    )]
    pub fn start_worker(&self, pools: String, on_batch: JsFn) -> Result<()> {
        let pools = wire::parse_pools(&pools)?;
        hosted!(self, h => h.start_worker(pools, on_batch))
    }

    /// Records the ends of worker attempts (`report`: one per line,
    /// `wire::parse_report_line`). A store whose transactions run inline
    /// applies them in this call, which claims into the slots they free;
    /// `starts` (as `startBatch`) are created first so the freed slots can
    /// claim them. Otherwise they are queued for the worker's next
    /// transaction. Answers `'0'|'1'` (notices pending), then one line per
    /// new ticket, `!<line> <message>` per refused start and `?<message>`
    /// when a report line was unreadable or the store failed.
    #[napi(catch_unwind)]
    pub fn worker_report(
        &self,
        env: Env,
        report: String,
        starts: Option<String>,
    ) -> Result<String> {
        let mut finished = Vec::new();
        let mut problems = Vec::new();
        for line in report.split('\n').filter(|l| !l.is_empty()) {
            match wire::parse_report_line(line) {
                Ok(item) => finished.push(item),
                Err(reason) => problems.push(format!("?unreadable worker report line: {reason}")),
            }
        }
        let mut out =
            hosted!(self, h => h.report(&env, finished, starts.as_deref(), &mut problems))?;
        out.insert(
            0,
            if bridge::has_notices(&self.notices) {
                '1'
            } else {
                '0'
            },
        );
        wire::push_lines(&mut out, &problems);
        Ok(out)
    }

    /// Claims into the worker's free slots from the JS thread (after a
    /// start): tickets one per line, or an empty string.
    #[napi(catch_unwind)]
    pub fn worker_fill(&self) -> Result<String> {
        let mut out = String::new();
        hosted!(self, h => h.fill_into(&mut out, None))?;
        Ok(out)
    }

    /// Stops claiming; in-flight attempts go on. Returns how many are in flight.
    #[napi(catch_unwind)]
    pub fn worker_stop(&self) -> u32 {
        hosted!(self, h => h.worker().map_or(0, |w| {
            w.stop();
            w.in_flight() as u32
        }))
    }

    /// Slots the worker holds plus ends not yet stored: a stop waits for
    /// this to reach 0.
    #[napi(catch_unwind)]
    pub fn worker_in_flight(&self) -> u32 {
        hosted!(self, h => h.worker().map_or(0, |w| w.unfinished() as u32))
    }
}

impl<S: AnyStore> Hosted<S> {
    fn new(
        store: S,
        opts: EngineOptions,
        timings: WorkerTimings,
        on_notice: JsFn,
        notices: &NoticeQueue,
    ) -> Self {
        let engine = Arc::new(Engine::new(store, opts));
        // The engine's timer for attempt timeouts (it ends with the engine).
        napi::bindgen_prelude::spawn(run_timeouts(Arc::downgrade(&engine)));
        engine.set_observer(Arc::new(JsObserver {
            on_notice,
            queue: notices.clone(),
            js_thread: std::thread::current().id(),
        }));
        Hosted {
            engine,
            worker: Mutex::new(None),
            feed: EventFeed::new(),
            timings,
            reported: AtomicI64::new(0),
        }
    }

    fn worker(&self) -> Option<Arc<Worker<S>>> {
        self.worker.lock().ok().and_then(|w| w.clone())
    }

    fn start_worker(
        &self,
        pools: Vec<jobforge_core::worker::WorkerPool>,
        on_batch: JsFn,
    ) -> Result<()> {
        let mut guard = self
            .worker
            .lock()
            .map_err(|_| invalid("worker state poisoned"))?;
        if guard.as_ref().is_some_and(|w| !w.is_stopping()) {
            return Err(invalid("a worker is already running on this orchestrator"));
        }
        let worker = Worker::with_timings(self.engine.clone(), pools, self.timings);
        *guard = Some(worker.clone());
        // An inline store's tickets leave the row out (JS reads it on demand
        // with `claimedRun`) unless retention may delete the run while its
        // handler still runs; other tickets carry it.
        let with_row = !self.engine.store().inline() || self.engine.purges();
        napi::bindgen_prelude::spawn(worker.run(JsBatch { on_batch, with_row }));
        Ok(())
    }

    /// `worker_report` for this store: the tickets claimed, one per line.
    fn report(
        &self,
        env: &Env,
        finished: Vec<(RunId, u32, Option<jobforge_core::AttemptOutcome>, usize)>,
        starts: Option<&str>,
        problems: &mut Vec<String>,
    ) -> Result<String> {
        let mut out = String::new();
        let pools = match starts {
            Some(batch) => {
                let (refused, pools) = self.create_buffered(batch, false)?;
                problems.splice(0..0, refused);
                pools
            }
            None => Vec::new(),
        };
        self.report_size(env);
        let (tickets, error) = match self.worker() {
            Some(w) => w.report(finished),
            None => {
                // No worker (stopped and gone): apply the ends only.
                let ends = finished
                    .into_iter()
                    .map(|(id, epoch, outcome, _)| AttemptEnd {
                        id,
                        epoch,
                        outcome,
                        ended_at: None,
                    })
                    .collect();
                match self.on_js_thread(|e| e.settle(ends, &[]))? {
                    Ok(s) => (s.tickets, None),
                    Err(e) => (Vec::new(), Some(e)),
                }
            }
        };
        // A networked store's tickets here are prefetched attempts handed
        // to freed slots: they carry the row, as its dispatched ones do.
        let with_row = !self.engine.store().inline();
        for t in &tickets {
            out.push('\n');
            if with_row {
                out.push_str(&wire::ticket_text(t, true));
            } else {
                wire::write_ticket(&mut out, t);
            }
        }
        if !pools.is_empty() {
            // Slots of other pools may be idle: claim into them too.
            self.fill_into(&mut out, Some(&pools))?;
        }
        if let Some(e) = error {
            problems.push(format!("?{e}"));
        }
        Ok(out)
    }

    /// `f` on the JS thread, if this store's transactions may run there.
    fn on_js_thread<T>(&self, f: impl FnOnce(&Engine<S>) -> T) -> Result<T> {
        if self.engine.store().inline() {
            Ok(f(&self.engine))
        } else {
            Err(invalid(
                "this store's transactions do not run on the JS thread",
            ))
        }
    }

    /// Tells V8 how much native memory the engine's runs hold, once the
    /// figure has moved by `REPORT_STEP` since it was last told.
    fn report_size(&self, env: &Env) {
        let Some(live) = self.engine.store().resident_runs() else {
            return;
        };
        let bytes = (live as i64 * RUN_BYTES).min(REPORT_CAP);
        let told = self.reported.load(Ordering::Relaxed);
        if (bytes - told).abs() >= REPORT_STEP && env.adjust_external_memory(bytes - told).is_ok() {
            self.reported.store(bytes, Ordering::Relaxed);
        }
    }

    /// Creates the runs of a start batch; answers one `!<line> <message>`
    /// per run that could not be created, and the pools that got runs.
    fn create_buffered(&self, batch: &str, wake: bool) -> Result<(Vec<String>, Vec<Arc<str>>)> {
        let mut reqs = Vec::new();
        let mut problems = Vec::new();
        let mut index = Vec::new();
        for (i, line) in batch.split('\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            match wire::parse_start_line(line) {
                Ok(req) => {
                    index.push(i);
                    reqs.push(req);
                }
                Err(reason) => problems.push(format!("!{i} invalid batch line: {reason}")),
            }
        }
        let (failed, pools) = self
            .on_js_thread(|e| e.start_batch(reqs, wake))?
            .map_err(to_napi)?;
        for (k, e) in failed {
            problems.push(format!("!{} {e}", index.get(k).copied().unwrap_or(k)));
        }
        Ok((problems, pools))
    }

    /// Claims into the worker's free slots (of `only`'s pools, if given);
    /// appends one ticket per line. Nothing for a store whose transactions
    /// do not run inline (its worker's loop claims).
    fn fill_into(&self, out: &mut String, only: Option<&[Arc<str>]>) -> Result<()> {
        if let Some(w) = self.worker() {
            for t in w.fill_only(only).map_err(to_napi)? {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&wire::ticket_text(&t, self.engine.purges()));
            }
        }
        Ok(())
    }
}

impl ObjectFinalize for NativeEngine {
    /// Takes back what `report_size` told V8: the runs go with the engine.
    /// Also ends the event feed's thread, which holds the engine while it
    /// listens (an orchestrator dropped without `close()`).
    fn finalize(self, env: Env) -> Result<()> {
        hosted!(self, h => h.feed.close());
        let told = hosted!(self, h => h.reported.load(Ordering::Relaxed));
        if told != 0 {
            env.adjust_external_memory(-told)?;
        }
        Ok(())
    }
}
