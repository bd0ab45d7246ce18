//! The worker over the PostgreSQL store.
//!
//! Unlike the in-memory worker, every claim and outcome is a database
//! round trip, so the loop works in batches: finished attempts queue up in
//! [`PgWorker::done`] (a plain push from the JS thread, no I/O there) and
//! one transaction ([`Engine::settle`]) applies all of them and claims into
//! every free slot. Under load a batch is as large as what finished during
//! the previous transaction, so commits are shared by many runs.
//!
//! It wakes on: an outcome queued, a local start (engine activity), a
//! `NOTIFY` from another process (listener thread), the earliest due time
//! of a pool, and a poll interval as the fallback. A heartbeat renews the
//! lease of held runs; a sweeper returns runs whose lease expired (their
//! worker died) to `pending`. Delivery is at-least-once.

use crate::engine::{AttemptEnd, Engine};
use crate::model::{AbortReason, AttemptOutcome, Millis, RunId};
use crate::store::postgres::PgStore;
use crate::worker::{BatchDispatcher, WorkerPool};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// An attempt's outcome waiting to be stored.
struct Done {
    id: RunId,
    epoch: u32,
    outcome: Option<AttemptOutcome>,
    pool: Arc<str>,
    /// When the handler ended: the run's `finishedAt`, however late the
    /// outcome reaches the database.
    at: Millis,
}
type NoticeSink = Arc<dyn Fn(String) + Send + Sync>;

pub struct PgWorker {
    engine: Arc<Engine<PgStore>>,
    pools: Vec<WorkerPool>,
    done: Mutex<Vec<Done>>,
    /// Outcomes queued by `done` and not yet stored (queued, in a settle,
    /// or waiting to be tried again after a failed one).
    unsaved: AtomicUsize,
    /// Attempts this process holds (their leases are renewed).
    held: Mutex<HashMap<RunId, u32>>,
    /// Internal wake-ups: an outcome queued, a settle finished.
    wake: Arc<Notify>,
    /// Something may have become claimable: a NOTIFY from any process.
    external: Arc<Notify>,
    /// The last claim found fewer runs than slots: claim again only after
    /// a wake-up from outside, a due time or the poll interval.
    starved: AtomicBool,
    settling: AtomicUsize,
    max_settles: usize,
    stopping: AtomicBool,
    lease_ms: i64,
    poll_ms: i64,
    /// Last error of the loop, for diagnostics.
    last_error: Mutex<Option<String>>,
    /// Database trouble as the operator hears of it (see `record_error`).
    trouble: Mutex<Trouble>,
    /// The same for the schedule loop, which fails and recovers on its
    /// own (a schema not yet migrated for schedules, say): its successes
    /// must not end the claim loop's trouble, nor the reverse.
    schedule_trouble: Mutex<Trouble>,
    /// Where notices go: the dispatcher `run` was given.
    notices: Mutex<Option<NoticeSink>>,
    /// Settles failed in a row: the next one waits longer (see `backoff`).
    settle_failures: AtomicU32,
}

/// How long to wait after `failures` failed attempts in a row: doubling
/// from `first` up to `cap`, minus up to a fifth at random, so a fleet of
/// workers does not reconnect in step to a database that just came back.
fn backoff(first: Duration, cap: Duration, failures: u32) -> Duration {
    let full = first.saturating_mul(1u32 << failures.min(16)).min(cap);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    full - full / 5 * (nanos % 1000) / 1000
}

/// Failing database calls, reported when they start, every
/// `TROUBLE_REPEAT` while they go on, and when a call succeeds again.
#[derive(Default)]
struct Trouble {
    since: Option<std::time::Instant>,
    reported: Option<std::time::Instant>,
}

const TROUBLE_REPEAT: Duration = Duration::from_secs(30);

/// Records a failure in `t`; the notice to give, if one is due (the first
/// failure, then one every `TROUBLE_REPEAT`), from `say(seconds failing)`.
fn trouble_began(t: &Mutex<Trouble>, say: impl FnOnce(u64) -> String) -> Option<String> {
    let now = std::time::Instant::now();
    let mut t = t.lock().ok()?;
    let since = *t.since.get_or_insert(now);
    let due = t
        .reported
        .is_none_or(|r| now.duration_since(r) >= TROUBLE_REPEAT);
    due.then(|| {
        t.reported = Some(now);
        say(now.duration_since(since).as_secs())
    })
}

/// A store error saying the schedule table does not exist (a schema not
/// migrated since schedules were added).
fn is_missing_schedule_table(e: &crate::error::JobError) -> bool {
    let m = e.to_string();
    m.contains("job_schedule") && m.contains("does not exist")
}

/// Ends a trouble of `t`: how long it lasted (ms), if there was one.
fn trouble_ended(t: &Mutex<Trouble>) -> Option<u128> {
    let mut t = t.lock().ok()?;
    let since = t.since.take()?;
    t.reported = None;
    Some(since.elapsed().as_millis())
}

impl PgWorker {
    pub fn new(
        engine: Arc<Engine<PgStore>>,
        pools: Vec<WorkerPool>,
        lease_ms: i64,
        poll_ms: i64,
    ) -> Arc<Self> {
        let engine_connections = engine.store().config().max_connections;
        Arc::new(PgWorker {
            engine,
            pools,
            done: Mutex::new(Vec::new()),
            unsaved: AtomicUsize::new(0),
            held: Mutex::new(HashMap::new()),
            wake: Arc::new(Notify::new()),
            external: Arc::new(Notify::new()),
            starved: AtomicBool::new(false),
            settling: AtomicUsize::new(0),
            max_settles: (engine_connections / 2).clamp(1, 4),
            stopping: AtomicBool::new(false),
            lease_ms: lease_ms.max(100),
            poll_ms: poll_ms.max(10),
            last_error: Mutex::new(None),
            trouble: Mutex::new(Trouble::default()),
            schedule_trouble: Mutex::new(Trouble::default()),
            notices: Mutex::new(None),
            settle_failures: AtomicU32::new(0),
        })
    }

    pub fn pools(&self) -> &[WorkerPool] {
        &self.pools
    }

    pub fn in_flight(&self) -> usize {
        self.pools.iter().map(|p| p.in_flight()).sum()
    }

    /// Slots held plus outcomes not yet stored: what a shutdown waits for.
    /// (An outcome just queued may be counted twice, which only matters
    /// for "is anything left".)
    pub fn unfinished(&self) -> usize {
        self.in_flight() + self.unsaved.load(Ordering::SeqCst)
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    /// Stops claiming; outcomes of in-flight attempts are still applied.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Queues an attempt's outcome (`None` = it ended without one, e.g.
    /// canceled or released by the caller). No I/O: called on the JS thread.
    pub fn done(&self, id: RunId, epoch: u32, outcome: Option<AttemptOutcome>, pool: &str) {
        let pool = self
            .pools
            .iter()
            .find(|p| &*p.name == pool)
            .map_or_else(|| Arc::from(pool), |p| p.name.clone());
        let at = self.engine.now();
        if let Ok(mut d) = self.done.lock() {
            d.push(Done {
                id,
                epoch,
                outcome,
                pool,
                at,
            });
            self.unsaved.fetch_add(1, Ordering::SeqCst);
        }
        self.wake.notify_one();
    }

    fn record_error(&self, e: impl ToString) {
        let message = e.to_string();
        if let Ok(mut l) = self.last_error.lock() {
            *l = Some(message.clone());
        }
        let notice = trouble_began(&self.trouble, |secs| {
            if secs == 0 {
                format!("the worker's database calls are failing (it keeps trying): {message}")
            } else {
                format!("the worker's database calls have been failing for {secs} s (it keeps trying): {message}")
            }
        });
        if let Some(n) = notice {
            self.notify(n);
        }
    }

    /// A database call of the loop succeeded: ends a reported trouble.
    fn record_success(&self) {
        if let Some(ms) = trouble_ended(&self.trouble) {
            self.notify(format!(
                "the worker's database calls succeed again (after {ms} ms of failures)"
            ));
        }
    }

    fn notify(&self, message: String) {
        let sink = self.notices.lock().ok().and_then(|n| n.clone());
        if let Some(sink) = sink {
            sink(message);
        }
    }

    fn slot_freed(&self, pool: &str, id: &RunId) {
        if let Some(p) = self.pools.iter().find(|p| &*p.name == pool) {
            p.release(1);
        }
        if let Ok(mut h) = self.held.lock() {
            h.remove(id);
        }
    }

    /// The loop. Returns once stopped and every held attempt has ended.
    ///
    /// Settles run as tasks, up to `max_settles` at once, so
    /// one commit's latency overlaps the next batch (and the server's group
    /// commit can share a flush between them).
    pub async fn run<D: BatchDispatcher>(self: Arc<Self>, dispatcher: D) {
        let dispatcher = Arc::new(dispatcher);
        if let Ok(mut n) = self.notices.lock() {
            let d = dispatcher.clone();
            *n = Some(Arc::new(move |m| d.notice(m)));
        }
        let listening = Arc::new(AtomicBool::new(true));
        self.spawn_listener(listening.clone());
        let maintenance = tokio::spawn(self.clone().maintain());
        let schedules = tokio::spawn(self.clone().fire_schedules());
        let activity = self.engine.activity();
        loop {
            let stopping = self.is_stopping();
            let active = self.settling.load(Ordering::SeqCst);
            if stopping && active == 0 && self.done_is_empty() && self.in_flight() == 0 {
                break;
            }
            let room = active < self.max_settles;
            let batch: Vec<Done> = if room {
                self.done
                    .lock()
                    .map(|mut d| std::mem::take(&mut *d))
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            // Slots freed by this batch are claimable in the same transaction.
            for d in &batch {
                self.slot_freed(&d.pool, &d.id);
            }
            let starved = self.starved.load(Ordering::SeqCst);
            let claims: Vec<(Arc<str>, usize)> = if stopping || starved || !room {
                Vec::new()
            } else {
                self.pools
                    .iter()
                    .map(|p| (p.name.clone(), p.reserve(usize::MAX)))
                    .filter(|c| c.1 > 0)
                    .collect()
            };
            if batch.is_empty() && claims.is_empty() {
                // Nothing to do until an outcome, a start (here or in another
                // process), a due time, or the poll interval.
                let wait = if starved && !stopping {
                    self.idle_wait().await
                } else {
                    Duration::from_millis(self.poll_ms as u64)
                };
                self.engine.set_worker_hungry(starved);
                let external = tokio::select! {
                    _ = self.wake.notified() => false,
                    _ = self.external.notified() => true,
                    _ = activity.notified() => true,
                    _ = tokio::time::sleep(wait) => true,
                };
                self.engine.set_worker_hungry(false);
                if external {
                    self.starved.store(false, Ordering::SeqCst);
                }
                continue;
            }
            self.settling.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(self.clone().settle(dispatcher.clone(), batch, claims));
        }
        listening.store(false, Ordering::SeqCst);
        maintenance.abort();
        schedules.abort();
        self.engine.set_worker_hungry(false);
        // The sink holds the dispatcher (the JS callback): let it go with the
        // loop, or a stopped worker would keep its orchestrator alive.
        if let Ok(mut n) = self.notices.lock() {
            *n = None;
        }
    }

    /// One batch transaction: outcomes in, claims out, tickets to JS.
    async fn settle<D: BatchDispatcher>(
        self: Arc<Self>,
        dispatcher: Arc<D>,
        batch: Vec<Done>,
        claims: Vec<(Arc<str>, usize)>,
    ) {
        let engine = self.engine.clone();
        // A copy: after a failed transaction the batch is tried again.
        let settle_batch: Vec<AttemptEnd> = batch
            .iter()
            .map(|d| AttemptEnd {
                id: d.id,
                epoch: d.epoch,
                outcome: d.outcome.clone(),
                ended_at: Some(d.at),
            })
            .collect();
        let claims_for_tx = claims.clone();
        let result =
            tokio::task::spawn_blocking(move || engine.settle(settle_batch, &claims_for_tx)).await;
        let tickets = match result {
            Ok(Ok(settled)) => {
                self.unsaved.fetch_sub(batch.len(), Ordering::SeqCst);
                self.settle_failures.store(0, Ordering::SeqCst);
                self.record_success();
                Some(settled.tickets)
            }
            Ok(Err(e)) => {
                self.record_error(&e);
                None
            }
            Err(e) => {
                self.record_error(&e);
                None
            }
        };
        let Some(tickets) = tickets else {
            // Nothing changed: give the reservations back and try the
            // outcomes again shortly (their runs stay running and leased).
            for (pool, n) in &claims {
                if let Some(p) = self.pools.iter().find(|p| &p.name == pool) {
                    p.release(*n);
                }
            }
            self.requeue(batch);
            // Try again soon, then less and less often while it keeps failing
            // (an unreachable database is not hammered with connections).
            let failures = self.settle_failures.fetch_add(1, Ordering::SeqCst);
            let wait = backoff(Duration::from_millis(100), Duration::from_secs(2), failures);
            tokio::time::sleep(wait).await;
            self.settling.fetch_sub(1, Ordering::SeqCst);
            self.wake.notify_one();
            return;
        };
        // Return the reserved slots that found no run; a pool that found
        // fewer than it wanted has nothing more due.
        for (pool, n) in &claims {
            let got = tickets.iter().filter(|t| &t.run.pool == pool).count();
            if got < *n {
                self.starved.store(true, Ordering::SeqCst);
            }
            if let Some(p) = self.pools.iter().find(|p| &p.name == pool) {
                p.release(n.saturating_sub(got));
            }
        }
        if !tickets.is_empty() {
            if let Ok(mut h) = self.held.lock() {
                for t in &tickets {
                    h.insert(t.run.id, t.epoch);
                }
            }
            let dispatched: Vec<(RunId, u32, Arc<str>)> = tickets
                .iter()
                .map(|t| (t.run.id, t.epoch, t.run.pool.clone()))
                .collect();
            if !dispatcher.dispatch(tickets) {
                // JS is gone: hand the runs back.
                self.stop();
                for (id, epoch, pool) in dispatched {
                    let engine = self.engine.clone();
                    let _ = tokio::task::spawn_blocking(move || engine.release_attempt(&id, epoch))
                        .await;
                    self.slot_freed(&pool, &id);
                }
            }
        }
        self.settling.fetch_sub(1, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn done_is_empty(&self) -> bool {
        self.done.lock().map(|d| d.is_empty()).unwrap_or(true)
    }

    fn requeue(&self, batch: Vec<Done>) {
        for d in &batch {
            if let Some(p) = self.pools.iter().find(|p| p.name == d.pool) {
                // The slot is still taken until the outcome lands.
                p.reserve(1);
            }
            if let Ok(mut h) = self.held.lock() {
                h.insert(d.id, d.epoch);
            }
        }
        if let Ok(mut d) = self.done.lock() {
            d.extend(batch);
        }
    }

    async fn idle_wait(&self) -> Duration {
        let poll = Duration::from_millis(self.poll_ms as u64);
        let engine = self.engine.clone();
        let pools: Vec<Arc<str>> = self
            .pools
            .iter()
            .filter(|p| p.in_flight() < p.concurrency)
            .map(|p| p.name.clone())
            .collect();
        let due = tokio::task::spawn_blocking(move || {
            pools.iter().filter_map(|p| engine.next_due(p)).min()
        })
        .await
        .ok()
        .flatten();
        let now = self.engine.now();
        match due {
            // Due but not claimable by us (held by another process): retry soon.
            Some(t) if t <= now => poll.min(Duration::from_millis(50)),
            Some(t) => poll.min(Duration::from_millis((t - now) as u64)),
            None => poll,
        }
    }

    /// Starts the runs of due schedules, until aborted: at each next fire
    /// (as stored), when a schedule changes here, and at least every poll
    /// interval (a schedule created by another process). Any number of
    /// processes may do this: a due schedule is locked by the transaction
    /// that fires it and skipped by the others, so each occurrence starts
    /// one run.
    async fn fire_schedules(self: Arc<Self>) {
        let changed = self.engine.schedules_changed();
        let poll = Duration::from_millis(self.poll_ms as u64);
        let mut failures: u32 = 0;
        let mut missing_table_told = false;
        loop {
            if self.is_stopping() {
                return;
            }
            let engine = self.engine.clone();
            let r = tokio::task::spawn_blocking(move || {
                engine.fire_due_schedules_then_next().map(|(_, next)| next)
            })
            .await;
            let wait = match r {
                Ok(Ok(next)) => {
                    failures = 0;
                    if let Some(ms) = trouble_ended(&self.schedule_trouble) {
                        self.notify(format!(
                            "the worker fires schedules again (after {ms} ms of failures)"
                        ));
                    }
                    let now = self.engine.now();
                    match next {
                        // Still due after firing: another process holds it
                        // (firing it right now). Look again soon, not at once.
                        Some(t) if t <= now => poll.min(Duration::from_millis(50)),
                        Some(t) => poll.min(Duration::from_millis((t - now) as u64)),
                        None => poll,
                    }
                }
                Ok(Err(e)) if is_missing_schedule_table(&e) => {
                    // A database migrated before schedules existed: nothing
                    // to fire until `migrate()` adds the table. Say so once,
                    // then keep looking, backing off, without repeating it.
                    let first = trouble_began(&self.schedule_trouble, |_| String::new());
                    if first.is_some() && !missing_table_told {
                        missing_table_told = true;
                        self.notify(
                            "the worker fires no schedules: this database has no job_schedule table yet (run migrate())"
                                .to_owned(),
                        );
                    }
                    failures += 1;
                    backoff(
                        Duration::from_millis(500),
                        Duration::from_secs(10),
                        failures - 1,
                    )
                }
                Ok(Err(e)) => {
                    let notice = trouble_began(&self.schedule_trouble, |secs| {
                        if secs == 0 {
                            format!("the worker cannot fire schedules (it keeps trying): {e}")
                        } else {
                            format!("the worker has not fired schedules for {secs} s (it keeps trying): {e}")
                        }
                    });
                    if let Some(n) = notice {
                        self.notify(n);
                    }
                    // Less and less often while it keeps failing (an
                    // unreachable database is not hammered).
                    failures += 1;
                    backoff(
                        Duration::from_millis(500),
                        Duration::from_secs(10),
                        failures - 1,
                    )
                }
                Err(_) => poll,
            };
            tokio::select! {
                _ = changed.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Heartbeat and sweeper, until aborted.
    async fn maintain(self: Arc<Self>) {
        let every = Duration::from_millis((self.lease_ms / 3).max(50) as u64);
        let mut ticks: u64 = 0;
        loop {
            // Sweep first (a restarted process recovers what it lost).
            if ticks.is_multiple_of(2) {
                let engine = self.engine.clone();
                let lease = self.lease_ms;
                let r = tokio::task::spawn_blocking(move || sweep(&engine, lease)).await;
                match r {
                    Ok(Err(e)) => self.record_error(&e),
                    Ok(Ok(_)) => self.record_success(),
                    Err(_) => {}
                }
            }
            tokio::time::sleep(every).await;
            ticks += 1;
            let held: Vec<(RunId, u32)> = self
                .held
                .lock()
                .map(|h| h.iter().map(|(k, v)| (*k, *v)).collect())
                .unwrap_or_default();
            if !held.is_empty() {
                let engine = self.engine.clone();
                let r = tokio::task::spawn_blocking(move || {
                    let now: Millis = engine.now();
                    engine.store().heartbeat(&held, now)
                })
                .await;
                if let Ok(Err(e)) = r {
                    self.record_error(&e);
                }
            }
        }
    }

    fn spawn_listener(&self, listening: Arc<AtomicBool>) {
        let engine = self.engine.clone();
        let wake = self.external.clone();
        let spawned = std::thread::Builder::new()
            .name("jobforge-listen".to_owned())
            .spawn(move || {
                let mut failures = 0;
                while listening.load(Ordering::SeqCst) {
                    let keep = || listening.load(Ordering::SeqCst);
                    let notify = |stopped: Option<(RunId, Option<u32>)>| match stopped {
                        // A run this process may be executing was canceled
                        // elsewhere: fire its signal here.
                        Some((id, epoch)) => engine.abort_local(id, epoch, AbortReason::Canceled),
                        None => wake.notify_one(),
                    };
                    let began = std::time::Instant::now();
                    if engine.store().listen(&keep, &notify).is_err() {
                        // Lost the connection (or could not open one): polling
                        // covers the gap. Reconnect at once-ish after a long
                        // session, less and less often while it keeps failing.
                        if began.elapsed() > Duration::from_secs(10) {
                            failures = 0;
                        }
                        let wait =
                            backoff(Duration::from_millis(500), Duration::from_secs(5), failures);
                        failures += 1;
                        std::thread::sleep(wait);
                    }
                }
            });
        if let Err(e) = spawned {
            self.record_error(e);
        }
    }
}

/// Returns runs whose lease expired to `pending`. Returns how many.
pub fn sweep(engine: &Engine<PgStore>, lease_ms: i64) -> crate::error::Result<usize> {
    let now = engine.now();
    let expired = engine.store().expired_leases(now, lease_ms, 500)?;
    let mut n = 0;
    for (id, epoch) in expired {
        if engine.release_attempt(&id, epoch)? {
            n += 1;
        }
    }
    if n > 0 {
        engine.wake_worker();
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_jitters_down_at_most_a_fifth() {
        let first = Duration::from_millis(100);
        let cap = Duration::from_secs(2);
        for (failures, full) in [
            (0, 100),
            (1, 200),
            (2, 400),
            (4, 1600),
            (5, 2000),
            (40, 2000),
        ] {
            let full = Duration::from_millis(full);
            let got = backoff(first, cap, failures);
            assert!(
                got <= full && got >= full - full / 5,
                "{failures} failures: {got:?} for {full:?}"
            );
        }
    }
}
