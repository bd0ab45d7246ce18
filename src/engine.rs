//! `NativeEngine`: the one class JS holds, over any store. The operations
//! are `ops.rs`'s list, reached through `callSync` (a store answering in
//! nanoseconds, on the JS thread) or `call` (a networked store, on a
//! blocking thread); the few methods beside them are the per-run hot paths
//! (buffered starts, worker reports) and calls that never do I/O.

use crate::bridge::{self, JsBatch, JsFn, JsObserver, NoticeQueue};
use crate::ops;
use crate::wire::{self, invalid, to_napi, Result};
use jobforge_core::engine::{AttemptEnd, Retention};
use jobforge_core::pg_worker::PgWorker;
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::worker::Worker;
use jobforge_core::{ClockKind, Engine, EngineOptions, MemoryStore, RunId, Store};
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

struct MemoryEngine {
    engine: Arc<Engine<MemoryStore>>,
    worker: Mutex<Option<Arc<Worker<MemoryStore>>>>,
    /// Bytes of native memory reported to V8 (`adjust_external_memory`):
    /// without it the collector sees a small JS object, feels no pressure
    /// to collect an unreachable orchestrator, and its runs stay in memory.
    reported: AtomicI64,
}

struct PgEngine {
    engine: Arc<Engine<PgStore>>,
    worker: Mutex<Option<Arc<PgWorker>>>,
    lease_ms: i64,
    poll_ms: i64,
}

enum Inner {
    Memory(MemoryEngine),
    Postgres(PgEngine),
}

/// Runs `$body` with `$e` bound to the engine, whatever its store.
macro_rules! with_engine {
    ($self:expr, $e:ident => $body:expr) => {
        match &$self.inner {
            Inner::Memory(m) => {
                let $e = &m.engine;
                $body
            }
            Inner::Postgres(p) => {
                let $e = &p.engine;
                $body
            }
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

fn observe<S: Store>(engine: &Engine<S>, on_notice: JsFn, notices: &NoticeQueue) {
    engine.set_observer(Arc::new(JsObserver {
        on_notice,
        queue: notices.clone(),
        js_thread: std::thread::current().id(),
    }));
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
        let inner = match options.store.as_deref() {
            None | Some("memory") => {
                let engine = Arc::new(Engine::new(MemoryStore::new(), engine_opts));
                observe(&engine, on_notice, &notices);
                Inner::Memory(MemoryEngine {
                    engine,
                    worker: Mutex::new(None),
                    reported: AtomicI64::new(0),
                })
            }
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
                let engine = Arc::new(Engine::new(store, engine_opts));
                observe(&engine, on_notice, &notices);
                Inner::Postgres(PgEngine {
                    engine,
                    worker: Mutex::new(None),
                    lease_ms: positive_ms(options.lease_ms, "postgres.leaseMs", 30_000)?,
                    poll_ms: positive_ms(options.poll_ms, "postgres.pollMs", 1_000)?,
                })
            }
            Some(other) => {
                return Err(invalid(format!(
                    "store must be 'memory' or 'postgres', got '{other}'"
                )))
            }
        };
        Ok(NativeEngine { inner, notices })
    }

    // ── operations ─────────────────────────────────────────────────────

    /// Runs operation `op` (its position in `opNames()`) on the JS thread:
    /// only for a store that does no I/O.
    #[napi(catch_unwind)]
    pub fn call_sync(&self, env: Env, op: u32, request: String) -> Result<String> {
        match &self.inner {
            Inner::Memory(m) => {
                let out = ops::run(&m.engine, op, &request);
                // Starts grow the store, retention shrinks it.
                m.report_size(&env);
                out
            }
            Inner::Postgres(_) => Err(invalid(
                "this store answers asynchronously: use call(), not callSync()",
            )),
        }
    }

    /// Runs operation `op` on a blocking thread (the JS thread never waits
    /// on the store).
    #[napi]
    pub async fn call(&self, op: u32, request: String) -> Result<String> {
        match &self.inner {
            Inner::Memory(m) => {
                let e = m.engine.clone();
                blocking(move || ops::run(&e, op, &request)).await
            }
            Inner::Postgres(p) => {
                let e = p.engine.clone();
                blocking(move || ops::run(&e, op, &request)).await
            }
        }
    }

    /// Checks and builds definitions from specs without storing them (a
    /// networked store's are written later with `register`): the rows, or
    /// the first error.
    #[napi(catch_unwind)]
    pub fn validate_definitions(&self, specs: String) -> Result<String> {
        let specs = ops::definition_specs(&specs)?;
        with_engine!(self, e => e
            .validate_definitions(specs)
            .map(|defs| wire::reply(&defs))
            .map_err(to_napi))
    }

    // ── no I/O ─────────────────────────────────────────────────────────

    /// Drains queued notices (`wire::notices_text`), or null when none.
    #[napi(catch_unwind)]
    pub fn take_notices(&self) -> Option<String> {
        bridge::take_notices(&self.notices)
    }

    /// Turns transition events for every run on or off.
    #[napi(catch_unwind)]
    pub fn set_events(&self, enabled: bool) {
        with_engine!(self, e => e.set_events(enabled));
    }

    /// Watches (or stops watching) one run's transitions, for `waitForRun`.
    #[napi(catch_unwind)]
    pub fn watch_run(&self, run_id: String, on: bool) {
        if let Ok(id) = run_id.parse::<RunId>() {
            with_engine!(self, e => e.watch_run(id, on));
        }
    }

    /// Engine time in epoch ms.
    #[napi(catch_unwind)]
    pub fn now(&self) -> f64 {
        with_engine!(self, e => e.now() as f64)
    }

    /// Moves a manual clock; returns the new time, or null on the system clock.
    #[napi(catch_unwind)]
    pub fn advance_time(&self, ms: f64) -> Option<f64> {
        with_engine!(self, e => e.advance_time(ms as i64).map(|t| t as f64))
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

    /// Lets idle connections go; a networked store reopens on demand.
    #[napi(catch_unwind)]
    pub fn close(&self) {
        if let Inner::Postgres(p) = &self.inner {
            p.engine.store().close();
        }
    }

    // ── hot paths of an in-memory store ────────────────────────────────

    /// Creates runs JS has already answered `start` for, one per line
    /// (`wire::parse_start_line`). `fed`: claim into the worker's free slots
    /// in the same call. Answers one line per ticket claimed, and
    /// `!<line index> <message>` for each run that could not be created.
    #[napi(catch_unwind)]
    pub fn start_batch(&self, env: Env, batch: String, fed: bool) -> Result<String> {
        let m = self.memory("startBatch")?;
        let (problems, pools) = m.create_buffered(&batch, !fed)?;
        m.report_size(&env);
        let mut out = String::new();
        if fed {
            m.fill_into(&mut out, Some(&pools))?;
        }
        wire::push_lines(&mut out, &problems);
        Ok(out)
    }

    /// The row of a run a worker ticket handed out, for `ctx.run` (no
    /// tenant gate: the handler already holds the run). Null once purged.
    #[napi(catch_unwind)]
    pub fn claimed_run(&self, run_id: String) -> Option<String> {
        let id = run_id.parse::<RunId>().ok()?;
        match &self.inner {
            Inner::Memory(m) => m.engine.run_row(&id).map(|r| r.to_compact_json()),
            Inner::Postgres(_) => None,
        }
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
        let running = || invalid("a worker is already running on this orchestrator");
        match &self.inner {
            Inner::Memory(m) => {
                let mut guard = m
                    .worker
                    .lock()
                    .map_err(|_| invalid("worker state poisoned"))?;
                if guard.as_ref().is_some_and(|w| !w.is_stopping()) {
                    return Err(running());
                }
                let worker = Worker::new(m.engine.clone(), pools);
                *guard = Some(worker.clone());
                napi::bindgen_prelude::spawn(worker.run(JsBatch {
                    on_batch,
                    with_row: m.engine.purges(),
                }));
            }
            Inner::Postgres(p) => {
                let mut guard = p
                    .worker
                    .lock()
                    .map_err(|_| invalid("worker state poisoned"))?;
                if guard.as_ref().is_some_and(|w| !w.is_stopping()) {
                    return Err(running());
                }
                let worker = PgWorker::new(p.engine.clone(), pools, p.lease_ms, p.poll_ms);
                *guard = Some(worker.clone());
                napi::bindgen_prelude::spawn(worker.run(JsBatch {
                    on_batch,
                    with_row: true,
                }));
            }
        }
        Ok(())
    }

    /// Records the outcomes of worker attempts (`report`: one per line,
    /// `wire::parse_report_line`). In memory the outcomes are applied in
    /// this call, which claims into the slots they free; `starts` (as
    /// `startBatch`) are created first so the freed slots can claim them.
    /// A networked store queues them for the worker's next transaction.
    /// Answers `'0'|'1'` (notices pending), then one line per new ticket,
    /// `!<line> <message>` per refused start and `?<message>` per outcome
    /// that could not be recorded.
    #[napi(catch_unwind)]
    pub fn worker_report(
        &self,
        env: Env,
        report: String,
        starts: Option<String>,
    ) -> Result<String> {
        let mut finished = Vec::new();
        let mut unread = Vec::new();
        for line in report.split('\n').filter(|l| !l.is_empty()) {
            match wire::parse_report_line(line) {
                Ok(item) => finished.push(item),
                Err(reason) => unread.push(format!("?unreadable worker report line: {reason}")),
            }
        }
        let mut out = String::new();
        match &self.inner {
            Inner::Memory(m) => {
                let (problems, pools) = match &starts {
                    Some(batch) => m.create_buffered(batch, false)?,
                    None => (Vec::new(), Vec::new()),
                };
                m.report_size(&env);
                let worker = m.worker.lock().ok().and_then(|w| w.clone());
                let (tickets, error) = match worker {
                    Some(w) => w.report(finished),
                    None => {
                        // No worker (stopped and gone): apply the outcomes only.
                        let ends = finished
                            .into_iter()
                            .map(|(id, epoch, outcome, _)| AttemptEnd {
                                id,
                                epoch,
                                outcome,
                                ended_at: None,
                            })
                            .collect();
                        match m.engine.settle(ends, &[]) {
                            Ok(s) => (s.tickets, None),
                            Err(e) => (Vec::new(), Some(e)),
                        }
                    }
                };
                out.push(if bridge::has_notices(&self.notices) {
                    '1'
                } else {
                    '0'
                });
                for t in &tickets {
                    out.push('\n');
                    wire::write_ticket(&mut out, t);
                }
                if !pools.is_empty() {
                    // Slots of other pools may be idle: claim into them too.
                    m.fill_into(&mut out, Some(&pools))?;
                }
                wire::push_lines(&mut out, &problems);
                if let Some(e) = error {
                    unread.push(format!("?{e}"));
                }
            }
            Inner::Postgres(p) => {
                if starts.is_some() {
                    return Err(invalid("a networked store takes no buffered starts"));
                }
                let worker = p.worker.lock().ok().and_then(|w| w.clone());
                let Some(w) = worker else {
                    return Err(invalid("no worker is running"));
                };
                for (id, epoch, outcome, slot) in finished {
                    let pool = w.pools().get(slot).map(|p| p.name.clone());
                    w.done(id, epoch, outcome, pool.as_deref().unwrap_or(""));
                }
                out.push(if bridge::has_notices(&self.notices) {
                    '1'
                } else {
                    '0'
                });
            }
        }
        wire::push_lines(&mut out, &unread);
        Ok(out)
    }

    /// Claims into the worker's free slots from the JS thread (after a
    /// start): tickets one per line, or an empty string.
    #[napi(catch_unwind)]
    pub fn worker_fill(&self) -> Result<String> {
        let Inner::Memory(m) = &self.inner else {
            return Ok(String::new());
        };
        let mut out = String::new();
        m.fill_into(&mut out, None)?;
        Ok(out)
    }

    /// Stops claiming; in-flight attempts go on. Returns how many are in flight.
    #[napi(catch_unwind)]
    pub fn worker_stop(&self) -> u32 {
        match &self.inner {
            Inner::Memory(m) => m.worker.lock().ok().and_then(|w| w.clone()).map_or(0, |w| {
                w.stop();
                w.pools().iter().map(|p| p.in_flight() as u32).sum()
            }),
            Inner::Postgres(p) => p.worker.lock().ok().and_then(|w| w.clone()).map_or(0, |w| {
                w.stop();
                w.in_flight() as u32
            }),
        }
    }

    /// Slots the worker holds, plus (networked store) outcomes not yet
    /// stored: a stop waits for this to reach 0.
    #[napi(catch_unwind)]
    pub fn worker_in_flight(&self) -> u32 {
        match &self.inner {
            Inner::Memory(m) => m
                .worker
                .lock()
                .ok()
                .and_then(|w| w.clone())
                .map_or(0, |w| w.pools().iter().map(|p| p.in_flight() as u32).sum()),
            Inner::Postgres(p) => p
                .worker
                .lock()
                .ok()
                .and_then(|w| w.clone())
                .map_or(0, |w| w.unfinished() as u32),
        }
    }
}

impl NativeEngine {
    fn memory(&self, what: &str) -> Result<&MemoryEngine> {
        match &self.inner {
            Inner::Memory(m) => Ok(m),
            Inner::Postgres(_) => Err(invalid(format!("{what} is for an in-memory store"))),
        }
    }
}

impl MemoryEngine {
    /// Tells V8 how much native memory the engine's runs hold, once the
    /// figure has moved by `REPORT_STEP` since it was last told.
    fn report_size(&self, env: &Env) {
        let bytes = (self.engine.store().live_runs() as i64 * RUN_BYTES).min(REPORT_CAP);
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
        let (failed, pools) = self.engine.start_plain_batch(reqs, wake).map_err(to_napi)?;
        for (k, e) in failed {
            problems.push(format!("!{} {e}", index.get(k).copied().unwrap_or(k)));
        }
        Ok((problems, pools))
    }

    /// Claims into the worker's free slots (of `only`'s pools, if given);
    /// appends one ticket per line.
    fn fill_into(&self, out: &mut String, only: Option<&[Arc<str>]>) -> Result<()> {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        if let Some(w) = worker {
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
    fn finalize(self, env: Env) -> Result<()> {
        if let Inner::Memory(m) = &self.inner {
            let told = m.reported.load(Ordering::Relaxed);
            if told != 0 {
                env.adjust_external_memory(-told)?;
            }
        }
        Ok(())
    }
}
