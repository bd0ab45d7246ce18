//! The worker: claims runs per pool up to each pool's concurrency and hands
//! them to a [`BatchDispatcher`] (the binding's threadsafe function into JS).
//!
//! Two paths fill slots:
//! - the **scheduler** task waits, without polling, on the engine's activity
//!   notification (a start, a finished lane head, a cancel, a replay) and on
//!   a timer set to the earliest due time of a pool with a free slot; when
//!   woken it claims a batch per pool and dispatches it in one call;
//! - **finished attempts** claim their pools' next runs in the call that
//!   records their outcomes ([`Worker::report`], one call for all attempts
//!   that ended in the same turn of JS's microtask queue), so a backlog
//!   drains without any thread hand-off.
//!
//! Slots are reserved with a compare-and-swap before claiming, so the two
//! paths never exceed a pool's concurrency together.

use crate::engine::{AttemptEnd, AttemptTicket, Engine};
use crate::error::Result;
use crate::model::{AttemptOutcome, Millis, RunId};
use crate::store::Store;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Delivers claimed attempts to whoever runs the handlers.
pub trait BatchDispatcher: Send + Sync + 'static {
    /// Returns false when the receiver is gone (the runs are then released).
    fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool;

    /// Something the operator should hear about (the worker cannot reach its
    /// store, or can again). Rate-limited by the caller.
    fn notice(&self, _message: String) {}
}

pub struct WorkerPool {
    pub name: Arc<str>,
    pub concurrency: usize,
    in_flight: AtomicUsize,
}

impl WorkerPool {
    pub fn new(name: &str, concurrency: usize) -> Self {
        WorkerPool {
            name: Arc::from(name),
            concurrency,
            in_flight: AtomicUsize::new(0),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Reserves up to `want` free slots; returns how many were reserved.
    pub fn reserve(&self, want: usize) -> usize {
        let mut cur = self.in_flight.load(Ordering::SeqCst);
        loop {
            let free = self.concurrency.saturating_sub(cur);
            let take = free.min(want);
            if take == 0 {
                return 0;
            }
            match self.in_flight.compare_exchange(
                cur,
                cur + take,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return take,
                Err(actual) => cur = actual,
            }
        }
    }

    pub fn release(&self, n: usize) {
        if n > 0 {
            self.in_flight.fetch_sub(n, Ordering::SeqCst);
        }
    }
}

pub struct Worker<S: Store> {
    engine: Arc<Engine<S>>,
    pools: Vec<WorkerPool>,
    stopping: AtomicBool,
    stop: Notify,
}

impl<S: Store> Worker<S> {
    pub fn new(engine: Arc<Engine<S>>, pools: Vec<WorkerPool>) -> Arc<Self> {
        Arc::new(Worker {
            engine,
            pools,
            stopping: AtomicBool::new(false),
            stop: Notify::new(),
        })
    }

    pub fn pools(&self) -> &[WorkerPool] {
        &self.pools
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Stops claiming (both paths). In-flight attempts go on.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.engine.set_worker_hungry(false);
        self.stop.notify_one();
    }

    fn pool(&self, name: &str) -> Option<&WorkerPool> {
        self.pools.iter().find(|p| &*p.name == name)
    }

    /// Claims into every free slot; returns the tickets. The scheduler
    /// calls it when woken; JS calls it right after a `start` while the
    /// worker has idle slots, which saves the thread hand-off.
    pub fn fill(&self) -> Result<Vec<AttemptTicket>> {
        self.fill_only(None)
    }

    /// `fill` for the named pools only (`None`: every pool): after runs
    /// were created in those, the others have nothing new to claim.
    pub fn fill_only(&self, only: Option<&[Arc<str>]>) -> Result<Vec<AttemptTicket>> {
        if self.is_stopping() {
            return Ok(Vec::new());
        }
        let mut batch = Vec::new();
        for pool in &self.pools {
            if only.is_some_and(|names| !names.contains(&pool.name)) {
                continue;
            }
            let reserved = pool.reserve(usize::MAX);
            if reserved == 0 {
                continue;
            }
            let tickets = match self.engine.claim_attempts(&pool.name, reserved) {
                Ok(t) => t,
                Err(e) => {
                    pool.release(reserved);
                    return Err(e);
                }
            };
            pool.release(reserved - tickets.len());
            batch.extend(tickets);
        }
        Ok(batch)
    }

    /// Earliest due time among pools that have a free slot.
    fn next_wake(&self) -> Option<Millis> {
        self.pools
            .iter()
            .filter(|p| p.in_flight() < p.concurrency)
            .filter_map(|p| self.engine.next_due(&p.name))
            .min()
    }

    fn has_free_slot(&self) -> bool {
        self.pools.iter().any(|p| p.in_flight() < p.concurrency)
    }

    /// The scheduler loop. Returns when stopped or when the dispatcher is gone.
    pub async fn run<D: BatchDispatcher>(self: Arc<Self>, dispatcher: D) {
        let activity = self.engine.activity();
        let schedules = self.engine.schedules_changed();
        let clock = self.engine.clock().clone();
        while !self.is_stopping() {
            // Due schedules become runs first, so this pass can claim them;
            // the next fire comes with it (a change after this wakes us).
            let fire_at = self
                .engine
                .fire_due_schedules_then_next()
                .ok()
                .and_then(|(_, next)| next);
            // Announce hunger before looking, so a start racing this check
            // leaves a wake-up permit instead of being missed.
            self.engine.set_hungry_pools(
                self.pools
                    .iter()
                    .filter(|p| p.in_flight() < p.concurrency)
                    .map(|p| p.name.clone())
                    .collect(),
            );
            let batch = self.fill().unwrap_or_default();
            if !batch.is_empty() {
                let dispatched: Vec<(Arc<str>, RunId, u32)> = batch
                    .iter()
                    .map(|t| (t.run.pool.clone(), t.run.id, t.epoch))
                    .collect();
                if !dispatcher.dispatch(batch) {
                    for (pool, id, epoch) in dispatched {
                        let _ = self.engine.release_attempt(&id, epoch);
                        if let Some(p) = self.pool(&pool) {
                            p.release(1);
                        }
                    }
                    break;
                }
                continue;
            }
            let due_at = if self.has_free_slot() {
                self.next_wake()
            } else {
                None
            };
            // A schedule fires on time even while every slot is busy.
            let wake_at = match (due_at, fire_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let timer = async {
                match wake_at {
                    Some(t) => clock.sleep_until(t).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = activity.notified() => {}
                _ = schedules.notified() => {}
                _ = timer => {}
                _ = self.stop.notified() => break,
            }
        }
        self.engine.set_worker_hungry(false);
    }

    /// Records the outcomes of several attempts (`None` = the attempt ended
    /// without one) and, unless stopping, claims into the slots they free,
    /// all in one transaction ([`Engine::settle`]). `slot` is the
    /// index of the attempt's pool in [`Worker::pools`]; an index out of
    /// range frees no slot. Returns the new tickets, and the store's error
    /// if the transaction failed (then nothing was applied or claimed).
    pub fn report(
        &self,
        finished: Vec<(RunId, u32, Option<AttemptOutcome>, usize)>,
    ) -> (Vec<AttemptTicket>, Option<crate::error::JobError>) {
        let stopping = self.is_stopping();
        let mut freed = vec![0usize; self.pools.len()];
        let mut items = Vec::with_capacity(finished.len());
        for (id, epoch, outcome, slot) in finished {
            if let Some(n) = freed.get_mut(slot) {
                *n += 1;
            }
            items.push(AttemptEnd {
                id,
                epoch,
                outcome,
                ended_at: None,
            });
        }
        // Freed slots go straight to the next due runs of their pools.
        let claims: Vec<(Arc<str>, usize)> = if stopping {
            Vec::new()
        } else {
            self.pools
                .iter()
                .zip(&freed)
                .filter(|(_, n)| **n > 0)
                .map(|(p, n)| (p.name.clone(), *n))
                .collect()
        };
        let (tickets, error) = match self.engine.settle(items, &claims) {
            Ok(settled) => (settled.tickets, None),
            // Nothing was claimed: every freed slot is idle.
            Err(e) => (Vec::new(), Some(e)),
        };
        let mut refilled = vec![0usize; self.pools.len()];
        for t in &tickets {
            if let Some(i) = self.pools.iter().position(|p| p.name == t.run.pool) {
                refilled[i] += 1;
            }
        }
        for (i, p) in self.pools.iter().enumerate() {
            let idle = freed[i].saturating_sub(refilled[i]);
            if idle == 0 {
                continue;
            }
            p.release(idle);
            if !stopping {
                // The slot is free: a start wakes the scheduler from now on,
                // and if a run of this pool falls due later, the scheduler
                // re-arms its timer for it (no wake-up when there is none).
                self.engine.set_worker_hungry(true);
                if self.engine.next_due(&p.name).is_some() {
                    self.engine.wake_worker();
                }
            }
        }
        (tickets, error)
    }
}
