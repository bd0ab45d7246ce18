//! The engine over PostgreSQL, for JS. Every call that touches the
//! database is an async napi method whose work runs on a blocking thread
//! (`spawn_blocking`), so the JS thread never waits on I/O. Results and
//! errors have the same JSON shapes as the in-memory class.

use super::*;
use jobforge_core::pg_worker::{sweep, PgWorker};
use jobforge_core::store::postgres::{PgConfig, PgStore};

#[napi(object)]
pub struct PgNativeOptions {
    /// `postgres://user:password@host:port/database`.
    pub url: String,
    /// Schema holding jobforge's tables. Default `public`.
    pub schema: Option<String>,
    /// Connection pool size per process. Default 10.
    pub max_connections: Option<u32>,
    /// Tenant gate on every call (CONTRACT.md "Tenant gate").
    pub multi_tenant: Option<bool>,
    /// `'system'` (default) or `'manual'`.
    pub clock: Option<String>,
    pub retain_completed_ms: Option<f64>,
    pub retain_failed_ms: Option<f64>,
    /// A claimed run whose lease (`claimed_at`) is not renewed for this
    /// long goes back to `pending` (its worker died). Default 30000.
    pub lease_ms: Option<f64>,
    /// Polling fallback when no notification arrives. Default 1000.
    pub poll_ms: Option<f64>,
}

/// Runs `f` on a blocking thread; a panic there becomes an error.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(invalid(format!("internal error in a database call: {e}"))),
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

#[napi]
pub struct PgEngine {
    engine: Arc<Engine<PgStore>>,
    pending: PendingAborts,
    worker: std::sync::Mutex<Option<Arc<PgWorker>>>,
    lease_ms: i64,
    poll_ms: i64,
}

macro_rules! on_db {
    ($self:ident, |$e:ident| $body:expr) => {{
        let $e = $self.engine.clone();
        blocking(move || $body).await
    }};
}

#[napi]
impl PgEngine {
    /// Creates the engine; connections open on first use.
    #[napi(
        constructor,
        ts_args_type = "options: PgNativeOptions, onAbort: () => void"
    )]
    pub fn new(options: PgNativeOptions, on_abort: AbortFn) -> Result<Self> {
        let engine_opts = engine_options(
            options.multi_tenant,
            options.clock.as_deref(),
            options.retain_completed_ms,
            options.retain_failed_ms,
        )?;
        let mut config = PgConfig::new(options.url);
        if let Some(s) = options.schema {
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
        let pending = PendingAborts::default();
        engine.set_observer(Arc::new(JsObserver {
            on_abort,
            pending: pending.clone(),
            js_thread: std::thread::current().id(),
        }));
        Ok(PgEngine {
            engine,
            pending,
            worker: std::sync::Mutex::new(None),
            lease_ms: positive_ms(options.lease_ms, "postgres.leaseMs", 30_000)?,
            poll_ms: positive_ms(options.poll_ms, "postgres.pollMs", 1_000)?,
        })
    }

    /// Creates or upgrades the schema (idempotent, safe concurrently).
    #[napi]
    pub async fn migrate(&self) -> Result<()> {
        on_db!(self, |e| e.store().migrate().map_err(to_napi))
    }

    /// Job types stored in the `job` table (for `upsertJobRows`' orphans).
    #[napi]
    pub async fn stored_job_types(&self) -> Result<Vec<String>> {
        on_db!(self, |e| e.store().stored_job_types().map_err(to_napi))
    }

    /// Closes idle connections; the pool reopens on demand.
    #[napi]
    pub fn close(&self) {
        self.engine.store().close();
    }

    #[napi]
    pub async fn register(&self, specs_json: String) -> Result<String> {
        on_db!(self, |e| ops::register(&e, specs_json))
    }

    #[napi]
    pub async fn definition(&self, job_type: String) -> Result<Option<String>> {
        on_db!(self, |e| Ok(ops::definition(&e, job_type)))
    }

    #[napi]
    pub async fn start(
        &self,
        job_type: String,
        input_json: String,
        opts_json: Option<String>,
    ) -> Result<String> {
        on_db!(self, |e| ops::start(&e, job_type, input_json, opts_json))
    }

    #[napi]
    pub async fn start_preflight(
        &self,
        job_type: String,
        tenant_given: bool,
        tenant_id: Option<String>,
        has_parent: bool,
    ) -> Result<()> {
        on_db!(self, |e| ops::start_preflight(
            &e,
            job_type,
            tenant_given,
            tenant_id,
            has_parent
        ))
    }

    #[napi]
    pub async fn cancel(
        &self,
        run_id: String,
        cascade: bool,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<()> {
        on_db!(self, |e| ops::cancel(
            &e,
            run_id,
            cascade,
            tenant_given,
            tenant_id
        ))
    }

    #[napi]
    pub async fn claim_next(&self, pool: String) -> Result<Option<String>> {
        on_db!(self, |e| ops::claim_next(&e, pool))
    }

    #[napi]
    pub async fn begin_attempt(&self, run_id: String) -> Result<String> {
        on_db!(self, |e| ops::begin_attempt(&e, run_id))
    }

    #[napi]
    pub async fn finish_attempt(
        &self,
        run_id: String,
        epoch: u32,
        outcome_json: String,
    ) -> Result<bool> {
        on_db!(self, |e| ops::finish_attempt(
            &e,
            run_id,
            epoch,
            outcome_json
        ))
    }

    #[napi]
    pub async fn step_begin(&self, run_id: String, epoch: u32, step_id: String) -> Result<String> {
        on_db!(self, |e| ops::step_begin(&e, run_id, epoch, step_id))
    }

    #[napi]
    pub async fn step_complete(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        output_json: Option<String>,
    ) -> Result<()> {
        on_db!(self, |e| ops::step_complete(
            &e,
            run_id,
            epoch,
            step_id,
            output_json
        ))
    }

    #[napi]
    pub async fn step_fail(
        &self,
        run_id: String,
        epoch: u32,
        step_id: String,
        failure_json: String,
        policy_json: Option<String>,
    ) -> Result<Option<f64>> {
        on_db!(self, |e| ops::step_fail(
            &e,
            run_id,
            epoch,
            step_id,
            failure_json,
            policy_json
        ))
    }

    #[napi]
    pub async fn replay(&self, run_id: String) -> Result<String> {
        on_db!(self, |e| ops::replay(&e, run_id))
    }

    #[napi]
    pub async fn find_by_id(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<Option<String>> {
        on_db!(self, |e| ops::find_by_id(
            &e,
            run_id,
            tenant_given,
            tenant_id
        ))
    }

    #[napi]
    pub async fn list_steps(
        &self,
        run_id: String,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        on_db!(self, |e| ops::list_steps(
            &e,
            run_id,
            tenant_given,
            tenant_id
        ))
    }

    #[napi]
    pub async fn list_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        query_json: String,
    ) -> Result<String> {
        on_db!(self, |e| ops::list_for_scope(
            &e,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            query_json
        ))
    }

    #[napi]
    pub async fn cancel_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        cascade: bool,
    ) -> Result<u32> {
        on_db!(self, |e| ops::cancel_for_scope(
            &e,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            cascade
        ))
    }

    #[napi]
    pub async fn reschedule_for_scope(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        entity_type: String,
        entity_id: String,
        run_at: f64,
    ) -> Result<u32> {
        on_db!(self, |e| ops::reschedule_for_scope(
            &e,
            tenant_given,
            tenant_id,
            entity_type,
            entity_id,
            run_at
        ))
    }

    #[napi]
    pub async fn count_by_pool_and_status(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        on_db!(self, |e| ops::count_by_pool_and_status(
            &e,
            tenant_given,
            tenant_id
        ))
    }

    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub async fn put_schedule(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        name: String,
        job_type: String,
        input_json: String,
        cron: Option<String>,
        timezone: Option<String>,
        every_ms: Option<f64>,
    ) -> Result<String> {
        on_db!(self, |e| ops::put_schedule(
            &e,
            tenant_given,
            tenant_id,
            name,
            job_type,
            input_json,
            cron,
            timezone,
            every_ms
        ))
    }

    #[napi]
    pub async fn remove_schedule(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        name: String,
    ) -> Result<bool> {
        on_db!(self, |e| ops::remove_schedule(
            &e,
            tenant_given,
            tenant_id,
            name
        ))
    }

    #[napi]
    pub async fn list_schedules(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
    ) -> Result<String> {
        on_db!(self, |e| ops::list_schedules(&e, tenant_given, tenant_id))
    }

    #[napi]
    pub async fn fire_due_schedules(&self) -> Result<u32> {
        on_db!(self, |e| ops::fire_due_schedules(&e))
    }

    #[napi]
    pub async fn list_recent_failed(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        limit: Option<f64>,
    ) -> Result<String> {
        on_db!(self, |e| ops::list_recent_failed(
            &e,
            tenant_given,
            tenant_id,
            limit
        ))
    }

    #[napi]
    pub async fn list_job_runs(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        query_json: String,
    ) -> Result<String> {
        on_db!(self, |e| ops::list_job_runs(
            &e,
            tenant_given,
            tenant_id,
            query_json
        ))
    }

    #[napi]
    pub async fn get_run_tree(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        root_run_id: String,
    ) -> Result<Option<String>> {
        on_db!(self, |e| ops::get_run_tree(
            &e,
            tenant_given,
            tenant_id,
            root_run_id
        ))
    }

    #[napi]
    pub async fn find_step(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        run_id: String,
        step_id: String,
    ) -> Result<Option<String>> {
        on_db!(self, |e| ops::find_step(
            &e,
            tenant_given,
            tenant_id,
            run_id,
            step_id
        ))
    }

    #[napi]
    pub async fn record_step(
        &self,
        tenant_given: bool,
        tenant_id: Option<String>,
        record_json: String,
    ) -> Result<String> {
        on_db!(self, |e| ops::record_step(
            &e,
            tenant_given,
            tenant_id,
            record_json
        ))
    }

    /// Puts an interrupted attempt's run back to pending.
    #[napi]
    pub async fn release_attempt(&self, run_id: String, epoch: u32) -> Result<bool> {
        let Ok(id) = run_id.parse::<RunId>() else {
            return Ok(false);
        };
        on_db!(self, |e| e.release_attempt(&id, epoch).map_err(to_napi))
    }

    /// Whether an attempt is still the run's current one.
    #[napi]
    pub async fn attempt_live(&self, run_id: String, epoch: u32) -> Result<bool> {
        let Ok(id) = run_id.parse::<RunId>() else {
            return Ok(false);
        };
        on_db!(self, |e| Ok(e.attempt_current(&id, epoch)))
    }

    /// Returns runs whose lease expired to pending now (the worker also
    /// does this on its own every lease/1.5). Returns how many.
    #[napi]
    pub async fn sweep_expired(&self) -> Result<u32> {
        let lease = self.lease_ms;
        on_db!(self, |e| sweep(&e, lease)
            .map(|n| n as u32)
            .map_err(to_napi))
    }

    // ── no I/O: called synchronously ───────────────────────────────────

    #[napi(catch_unwind)]
    pub fn take_notices(&self) -> Option<String> {
        take_notices(&self.pending)
    }

    #[napi(catch_unwind)]
    pub fn set_events(&self, enabled: bool) {
        self.engine.set_events(enabled);
    }

    #[napi(catch_unwind)]
    pub fn watch_run(&self, run_id: String, on: bool) {
        if let Ok(id) = run_id.parse::<RunId>() {
            self.engine.watch_run(id, on);
        }
    }

    #[napi(catch_unwind)]
    pub fn now(&self) -> f64 {
        self.engine.now() as f64
    }

    #[napi(catch_unwind)]
    pub fn advance_time(&self, ms: f64) -> Option<f64> {
        self.engine.advance_time(ms as i64).map(|t| t as f64)
    }

    #[napi(catch_unwind)]
    pub fn clock_kind(&self) -> String {
        match self.engine.clock().kind() {
            ClockKind::System => "system".to_owned(),
            ClockKind::Manual => "manual".to_owned(),
        }
    }

    // ── worker ─────────────────────────────────────────────────────────

    /// Starts the worker loop for `pools_json` (`[{"name","concurrency"}]`);
    /// claimed batches reach `on_batch` as tickets, one per line.
    #[napi(
        catch_unwind,
        ts_args_type = "poolsJson: string, onBatch: (tickets: string) => void"
    )]
    pub fn start_worker(&self, pools_json: String, on_batch: BatchFn) -> Result<()> {
        let pools = parse_pools(&pools_json)?;
        let mut guard = self
            .worker
            .lock()
            .map_err(|_| invalid("worker state poisoned"))?;
        if guard.as_ref().is_some_and(|w| !w.is_stopping()) {
            return Err(invalid("a worker is already running on this orchestrator"));
        }
        let worker = PgWorker::new(self.engine.clone(), pools, self.lease_ms, self.poll_ms);
        *guard = Some(worker.clone());
        napi::bindgen_prelude::spawn(worker.run(JsBatch {
            on_batch,
            with_row: true,
        }));
        Ok(())
    }

    /// Queues a worker attempt's outcome (null = it ended without one).
    /// No I/O: the worker loop applies it with the next batch.
    #[napi(catch_unwind)]
    pub fn worker_done(
        &self,
        run_id: String,
        epoch: u32,
        outcome_json: Option<String>,
        pool: String,
    ) -> Result<()> {
        let Ok(id) = run_id.parse::<RunId>() else {
            return Err(to_napi(JobError::JobRunNotFound { run_id }));
        };
        let outcome = outcome_json.as_deref().map(parse_outcome);
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        match worker {
            Some(w) => {
                w.done(id, epoch, outcome, &pool);
                Ok(())
            }
            None => Err(invalid("no worker is running")),
        }
    }

    /// Stops claiming; returns how many attempts are still in flight.
    #[napi(catch_unwind)]
    pub fn worker_stop(&self) -> u32 {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        worker.map_or(0, |w| {
            w.stop();
            w.in_flight() as u32
        })
    }

    /// Slots the worker holds plus attempt outcomes not yet stored: a
    /// stop waits for this to reach 0 (outcomes are stored by the loop,
    /// which keeps trying while the database is unreachable).
    #[napi(catch_unwind)]
    pub fn worker_in_flight(&self) -> u32 {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        worker.map_or(0, |w| w.unfinished() as u32)
    }

    /// The worker loop's last database error, if any (diagnostics).
    #[napi(catch_unwind)]
    pub fn worker_last_error(&self) -> Option<String> {
        let worker = self.worker.lock().ok().and_then(|w| w.clone());
        worker.and_then(|w| w.last_error())
    }
}
