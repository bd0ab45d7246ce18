//! The worker: claims runs per pool up to each pool's concurrency, hands
//! them to a [`BatchDispatcher`] (the binding's threadsafe function into
//! JS), and stores what became of them. One worker for every store; what a
//! store is like comes from its [`Coordination`]:
//!
//! - **where transactions run.** A store that answers in nanoseconds (in
//!   memory) settles on the caller's thread: a report of finished attempts
//!   claims their pools' next runs in the same call ([`Worker::report`]),
//!   so a backlog drains without a thread hand-off. A networked store's
//!   outcomes queue up (a push, no I/O on the JS thread) and the loop
//!   settles them with its claims in one transaction on a blocking thread,
//!   up to a few transactions at once, so commits are shared by many runs.
//! - **who else uses the store.** When other processes share it, the
//!   worker leases what it claims (a heartbeat renews the leases, a sweeper
//!   returns runs whose lease expired), listens for their changes, and
//!   polls as a fallback; delivery is at-least-once. A store no one shares
//!   needs none of that: its loop never polls.
//!
//! The loop waits, without polling a store no one shares, on the engine's
//! activity (a start, a freed lane, a cancel, a replay), on outcomes
//! queued, on another process's change, and on a timer set to the earliest
//! due run of a pool with a free slot. Slots are reserved with a
//! compare-and-swap before claiming, so the paths that claim never exceed
//! a pool's concurrency together. Schedules fire from a task of their own,
//! on time even while every slot is busy.

use crate::engine::{AttemptEnd, AttemptTicket, Engine};
use crate::error::{JobError, Result};
use crate::model::{AbortReason, AttemptOutcome, Millis, RunId};
use crate::store::{Coordination, Store};
use std::collections::HashSet;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    /// Prefetched attempts: claimed (leased, heartbeated) ahead of a free
    /// slot, in claim order (priority desc, due time, creation).
    queue: Mutex<VecDeque<AttemptTicket>>,
    /// Runs queued plus runs being claimed for the queue: at most the
    /// worker's `prefetch`.
    ahead: AtomicUsize,
    /// Attempts of this pool ended so far (reported): its pace.
    ended: AtomicUsize,
    /// The default prefetch bound, from the pace (see `Worker::queue_bound`).
    pace: Mutex<Pace>,
}

/// A pool's pace over the last `PACE_WINDOW`: what its default prefetch
/// queue holds.
struct Pace {
    since: std::time::Instant,
    ended_then: usize,
    /// Attempts it ended in the last full window (0: none measured yet).
    per_window: usize,
}

/// The window a pool's pace is measured over, and the time its default
/// prefetch queue covers: a few claim transactions' worth. A queue holding
/// more than a pool starts in this long only hoards.
const PACE_WINDOW: Duration = Duration::from_millis(100);

/// The most a default prefetch queue holds (`WorkerTimings::prefetch`
/// unset), however fast its pool goes.
pub const DEFAULT_PREFETCH: usize = 200;

/// Reserves up to `want` of `limit` on `counter`; how many were reserved.
fn reserve_on(counter: &AtomicUsize, limit: usize, want: usize) -> usize {
    let mut cur = counter.load(Ordering::SeqCst);
    loop {
        let take = limit.saturating_sub(cur).min(want);
        if take == 0 {
            return 0;
        }
        match counter.compare_exchange(cur, cur + take, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return take,
            Err(actual) => cur = actual,
        }
    }
}

/// Where a prefetched attempt goes in its pool's queue: the order of the
/// claim statement (priority desc, due time, creation), so a run claimed
/// later but better placed is handed out first.
fn claim_order(t: &AttemptTicket) -> (std::cmp::Reverse<i32>, Millis, u64) {
    (std::cmp::Reverse(t.run.priority), t.run.run_at, t.run.seq)
}

impl WorkerPool {
    pub fn new(name: &str, concurrency: usize) -> Self {
        WorkerPool {
            name: Arc::from(name),
            concurrency,
            in_flight: AtomicUsize::new(0),
            queue: Mutex::new(VecDeque::new()),
            ahead: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
            pace: Mutex::new(Pace {
                since: std::time::Instant::now(),
                ended_then: 0,
                per_window: 0,
            }),
        }
    }

    /// Attempts prefetched and not yet handed out.
    pub fn prefetched(&self) -> usize {
        self.queue.lock().map(|q| q.len()).unwrap_or(0)
    }

    fn enqueue_prefetched(&self, tickets: impl IntoIterator<Item = AttemptTicket>) {
        if let Ok(mut q) = self.queue.lock() {
            for t in tickets {
                let key = claim_order(&t);
                let at = q.partition_point(|x| claim_order(x) <= key);
                q.insert(at, t);
            }
        }
    }

    fn pop_prefetched(&self) -> Option<AttemptTicket> {
        self.queue.lock().ok()?.pop_front()
    }

    /// Drops the prefetched attempts in `lost` from the queue; how many.
    fn remove_prefetched(&self, lost: &HashSet<(RunId, u32)>) -> usize {
        let Ok(mut q) = self.queue.lock() else {
            return 0;
        };
        let before = q.len();
        q.retain(|t| !lost.contains(&(t.run.id, t.epoch)));
        let n = before - q.len();
        drop(q);
        self.ahead.fetch_sub(n, Ordering::SeqCst);
        n
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    fn has_free_slot(&self) -> bool {
        self.in_flight() < self.concurrency
    }

    /// Reserves up to `want` free slots; returns how many were reserved.
    pub fn reserve(&self, want: usize) -> usize {
        reserve_on(&self.in_flight, self.concurrency, want)
    }

    /// Gives back `n` slots. Saturates: a count below zero would make
    /// `reserve` refuse every slot for good (and `stop()` wait forever);
    /// releasing more than is held is a bug of the caller's accounting.
    pub fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let before = self
            .in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                Some(c.saturating_sub(n))
            })
            .unwrap_or_else(|c| c);
        debug_assert!(
            before >= n,
            "pool {}: released {n} of {before} slots",
            self.name
        );
    }

    /// Takes `n` slots back whatever the concurrency: slots that were never
    /// really free (an end whose settle failed holds its slot until it is
    /// stored, even if a prefetched attempt was handed the slot meanwhile;
    /// the pool then claims nothing until the count is below concurrency).
    fn retake(&self, n: usize) {
        self.in_flight.fetch_add(n, Ordering::SeqCst);
    }
}

/// Transactions a stopping worker tries to return its prefetched runs in
/// (100 ms, then 200 ms between): well within the 1 s a stop waits at least.
const RETURN_TRIES: u32 = 3;

/// The most `WorkerTimings::prefetch` may be: one claim statement takes
/// at most 1,000 runs.
pub const MAX_PREFETCH: usize = 1000;

/// Timings of a worker on a store other processes share.
#[derive(Debug, Clone, Copy)]
pub struct WorkerTimings {
    /// A claimed run whose lease is not renewed for this long goes back to
    /// `pending` (its worker died). Renewed every third of it.
    pub lease_ms: i64,
    /// The longest the loop waits without looking (a change notification
    /// may be lost).
    pub poll_ms: i64,
    /// Runs each pool claims ahead of its free slots (a networked store;
    /// `Some(0)`: none; `None`, the Postgres default: what the pool ended
    /// in the last 100 ms, from its concurrency up to `DEFAULT_PREFETCH`). They are leased and heartbeated like any claim,
    /// handed to the next free slot without a round trip, returned to
    /// `pending` at once by `stop()` and by the sweeper if the process
    /// dies. The price: a run that becomes due after others were
    /// prefetched may start after up to that many of them per process and
    /// pool, even if its priority is higher (they were claimed before it
    /// was due); and a queue longer than the pool's slots hoards: the
    /// first process to claim a burst takes up to that many runs while
    /// the other processes' slots stay idle.
    pub prefetch: Option<usize>,
}

impl Default for WorkerTimings {
    fn default() -> Self {
        WorkerTimings {
            lease_ms: 30_000,
            poll_ms: 1_000,
            prefetch: Some(0),
        }
    }
}

/// A pool's share of one claim: `slots` free slots reserved for the runs
/// claimed first, `ahead` places of its prefetch queue for the rest.
#[derive(Debug, Clone, Copy)]
struct ClaimPlan {
    pool: usize,
    slots: usize,
    ahead: usize,
}

/// `Done::slot` of an attempt whose slot went straight to a prefetched
/// attempt: storing its end frees no slot.
const SLOT_HANDED_ON: usize = usize::MAX;

/// An attempt's end waiting for the loop's next transaction.
struct Done {
    end: AttemptEnd,
    /// Index of its pool in `Worker::pools` (out of range: no slot of ours).
    slot: usize,
}

type NoticeSink = Arc<dyn Fn(String) + Send + Sync>;

pub struct Worker<S: Store + Coordination> {
    engine: Arc<Engine<S>>,
    pools: Vec<WorkerPool>,
    timings: WorkerTimings,
    /// Whether the store settles on the caller's thread (`Coordination::inline`).
    inline: bool,
    /// Whether other processes share the store (`Coordination::shared`).
    shared: bool,
    /// Runs claimed ahead of free slots per pool (`WorkerTimings::prefetch`;
    /// `Some(0)` for a store that settles inline, whose claims cost no
    /// round trip). See `queue_bound`.
    prefetch: Option<usize>,
    /// Ends queued by `report` for the loop (networked stores).
    done: Mutex<Vec<Done>>,
    /// Ends queued and not yet stored (queued, in a settle, or waiting to
    /// be tried again after a failed one).
    unsaved: AtomicUsize,
    /// Attempts this process holds, whose leases the heartbeat renews
    /// (shared stores).
    held: Mutex<HashMap<RunId, u32>>,
    /// Internal wake-ups: an outcome queued, a settle finished.
    wake: Arc<Notify>,
    /// Something may have become claimable: another process's change.
    external: Arc<Notify>,
    /// The last claim found fewer runs than slots: claim again only after
    /// a wake-up, a due time or the poll interval.
    starved: AtomicBool,
    settling: AtomicUsize,
    max_settles: usize,
    stopping: AtomicBool,
    stop: Notify,
    /// Store trouble as the operator hears of it (see `record_error`).
    trouble: Mutex<Trouble>,
    /// The same for the schedule task, which fails and recovers on its own
    /// (a schema not yet migrated for schedules, say): its successes must
    /// not end the loop's trouble, nor the reverse.
    schedule_trouble: Mutex<Trouble>,
    /// Where notices go: the dispatcher `run` was given.
    notices: Mutex<Option<NoticeSink>>,
    /// Settles failed in a row: the next one waits longer (see `backoff`).
    settle_failures: AtomicU32,
    /// When the last heartbeat that succeeded began (engine clock; shared
    /// stores): a prefetched attempt claimed before it and not renewed
    /// since may have lost its lease (see `lease_may_have_lapsed`).
    renewed_at: AtomicI64,
    /// Prefetched attempts dropped because their lease may have lapsed
    /// (`pop_live`), to be given back by the loop: `(id, epoch, claimed
    /// at)`. Left to the sweeper, such a run stayed `running` for a third
    /// of a lease, and for good if the worker stopped meanwhile.
    lapsed: Mutex<Vec<(RunId, u32, Option<Millis>)>>,
}

/// Settles that failed on a lost connection (having changed nothing) and
/// are tried again with no pause, in a row, before the backoff applies.
const LOST_AT_ONCE: u32 = 3;

/// How long to wait after `failures` failed attempts in a row: doubling
/// from `first` up to `cap`, minus up to a fifth at random, so a fleet of
/// workers does not reconnect in step to a database that just came back.
pub(crate) fn backoff(first: Duration, cap: Duration, failures: u32) -> Duration {
    let full = first.saturating_mul(1u32 << failures.min(16)).min(cap);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    full - full / 5 * (nanos % 1000) / 1000
}

/// What a store call of the worker did, for its outage log. A database
/// can answer reads and refuse writes (made read-only, a standby after a
/// failover, a full disk), so a read that succeeds says nothing of the
/// writes that fail; a write transaction reads too, so its success says
/// reads work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    /// Only reads: the sweeper's look for expired leases, the listener.
    Read,
    /// A transaction that writes: settles and claims, the heartbeat, the
    /// sweeper's releases, firing schedules.
    Write,
}

/// Failing store calls, reported when they start, every `TROUBLE_REPEAT`
/// while they go on, and when the kinds of call that failed succeed again.
#[derive(Default)]
struct Trouble {
    since: Option<std::time::Instant>,
    reported: Option<std::time::Instant>,
    /// Kinds of call that failed and have not succeeded since.
    reads_failing: bool,
    writes_failing: bool,
}

const TROUBLE_REPEAT: Duration = Duration::from_secs(30);

/// Records a failure of a `kind` call in `t`; the notice to give, if one
/// is due (the first failure, then one every `TROUBLE_REPEAT`), from
/// `say(seconds failing)`.
fn trouble_began(
    t: &Mutex<Trouble>,
    kind: CallKind,
    say: impl FnOnce(u64) -> String,
) -> Option<String> {
    let now = std::time::Instant::now();
    let mut t = t.lock().ok()?;
    match kind {
        CallKind::Read => t.reads_failing = true,
        CallKind::Write => t.writes_failing = true,
    }
    let since = *t.since.get_or_insert(now);
    let due = t
        .reported
        .is_none_or(|r| now.duration_since(r) >= TROUBLE_REPEAT);
    due.then(|| {
        t.reported = Some(now);
        say(now.duration_since(since).as_secs())
    })
}

/// A `kind` call succeeded: ends the trouble of `t` once no kind of call
/// that failed is still failing (a read's success while writes fail ends
/// nothing: the log said "succeed again" and then "failing" at once).
/// How long it lasted (ms), if it ended.
fn trouble_ended(t: &Mutex<Trouble>, kind: CallKind) -> Option<u128> {
    let mut t = t.lock().ok()?;
    match kind {
        CallKind::Read => t.reads_failing = false,
        CallKind::Write => {
            t.reads_failing = false;
            t.writes_failing = false;
        }
    }
    if t.reads_failing || t.writes_failing {
        return None;
    }
    let since = t.since.take()?;
    t.reported = None;
    Some(since.elapsed().as_millis())
}

/// A store error saying the schedule table does not exist (a schema not
/// migrated since schedules were added).
fn is_missing_schedule_table(e: &JobError) -> bool {
    let m = e.to_string();
    m.contains("job_schedule") && m.contains("does not exist")
}

impl<S: Store + Coordination> Worker<S> {
    /// A worker with the default timings (which matter only for a shared store).
    pub fn new(engine: Arc<Engine<S>>, pools: Vec<WorkerPool>) -> Arc<Self> {
        Self::with_timings(engine, pools, WorkerTimings::default())
    }

    pub fn with_timings(
        engine: Arc<Engine<S>>,
        pools: Vec<WorkerPool>,
        timings: WorkerTimings,
    ) -> Arc<Self> {
        let store = engine.store();
        let (inline, shared) = (store.inline(), store.shared());
        // Half the store's connections at most: the rest serve starts,
        // queries and the heartbeat.
        let max_settles = if inline {
            1
        } else {
            (store.connections() / 2).clamp(1, 4)
        };
        Arc::new(Worker {
            engine,
            pools,
            timings: WorkerTimings {
                lease_ms: timings.lease_ms.max(100),
                poll_ms: timings.poll_ms.max(10),
                prefetch: timings.prefetch,
            },
            inline,
            shared,
            prefetch: if inline {
                Some(0)
            } else {
                timings.prefetch.map(|n| n.min(MAX_PREFETCH))
            },
            done: Mutex::new(Vec::new()),
            unsaved: AtomicUsize::new(0),
            held: Mutex::new(HashMap::new()),
            wake: Arc::new(Notify::new()),
            external: Arc::new(Notify::new()),
            starved: AtomicBool::new(false),
            settling: AtomicUsize::new(0),
            max_settles,
            stopping: AtomicBool::new(false),
            stop: Notify::new(),
            trouble: Mutex::new(Trouble::default()),
            schedule_trouble: Mutex::new(Trouble::default()),
            notices: Mutex::new(None),
            settle_failures: AtomicU32::new(0),
            renewed_at: AtomicI64::new(i64::MIN),
            lapsed: Mutex::new(Vec::new()),
        })
    }

    pub fn pools(&self) -> &[WorkerPool] {
        &self.pools
    }

    /// Slots held.
    pub fn in_flight(&self) -> usize {
        self.pools.iter().map(|p| p.in_flight()).sum()
    }

    /// Slots held plus ends not yet stored: what a shutdown waits for.
    /// (An end just queued may be counted twice, which only matters for
    /// "is anything left".)
    pub fn unfinished(&self) -> usize {
        self.in_flight() + self.unsaved.load(Ordering::SeqCst) + self.ahead()
    }

    /// Runs prefetched or being claimed for the prefetch queues: a stopping
    /// worker returns them to `pending` before its loop ends.
    fn ahead(&self) -> usize {
        self.pools
            .iter()
            .map(|p| p.ahead.load(Ordering::SeqCst))
            .sum()
    }

    /// Hands prefetched attempts to the free slots of their pools, best
    /// first (no I/O). An attempt ended here meanwhile (canceled, timed
    /// out) is dropped: its run is over, its lease no longer renewed.
    fn hand_out_prefetched(&self) -> Vec<AttemptTicket> {
        let mut out = Vec::new();
        if !self.prefetching() || self.is_stopping() {
            return out;
        }
        for (i, p) in self.pools.iter().enumerate() {
            while p.prefetched() > 0 && p.reserve(1) == 1 {
                match self.pop_live(i) {
                    Some(t) => out.push(t),
                    None => {
                        p.release(1);
                        break;
                    }
                }
            }
        }
        out
    }

    /// The next prefetched attempt of pool `i` still open here and still
    /// leased. One whose lease may have lapsed is dropped: another process
    /// may have swept it and run it already; if not, a sweep returns it to
    /// `pending` (a lease lapses only with its process's heartbeats failing).
    fn pop_live(&self, i: usize) -> Option<AttemptTicket> {
        let p = self.pools.get(i)?;
        while let Some(t) = p.pop_prefetched() {
            p.ahead.fetch_sub(1, Ordering::SeqCst);
            let open = self.engine.attempt_open(&t.run.id, t.epoch);
            if open && !self.lease_may_have_lapsed(&t) {
                return Some(t);
            }
            self.engine.end_in_flight(&t.run.id, t.epoch);
            self.forget_lease(&t.run.id, t.epoch);
            if open {
                // Given back by the loop's next pass (no I/O here): a
                // release under its epoch is a no-op if another process
                // swept it meanwhile.
                if let Ok(mut l) = self.lapsed.lock() {
                    l.push((t.run.id, t.epoch, t.run.claimed_at.get()));
                }
                self.wake.notify_one();
            }
        }
        None
    }

    /// Gives back the prefetched attempts `pop_live` dropped as possibly
    /// lapsed (see `lapsed`), in one transaction; on failure the sweeper
    /// returns them once their lease has lapsed.
    async fn return_lapsed(&self) {
        let list = match self.lapsed.lock() {
            Ok(mut l) if !l.is_empty() => std::mem::take(&mut *l),
            _ => return,
        };
        match self.on_store(move |e| e.release_claims(&list)).await {
            Some(Ok(_)) => self.record_success(CallKind::Write),
            Some(Err(e)) => self.record_error(CallKind::Write, e),
            None => self.record_error(CallKind::Write, "a store transaction did not finish"),
        }
    }

    /// Whether the lease of prefetched `t` may be older than `lease_ms`:
    /// neither its claim nor a heartbeat that succeeded renewed it since.
    fn lease_may_have_lapsed(&self, t: &AttemptTicket) -> bool {
        if !self.shared {
            return false;
        }
        let renewed = t
            .run
            .claimed_at
            .get()
            .unwrap_or(i64::MIN)
            .max(self.renewed_at.load(Ordering::SeqCst));
        self.engine.now().saturating_sub(renewed) >= self.timings.lease_ms
    }

    /// Attempts this process held that are no longer its own (ended,
    /// canceled or swept elsewhere; the heartbeat found them): dropped
    /// from the prefetch queues before they start, no longer open here, no
    /// longer renewed. A handler already running one runs on (its outcome
    /// is ignored by its epoch), as after a missed cancel.
    fn drop_lost(&self, lost: &[(RunId, u32)]) {
        if lost.is_empty() {
            return;
        }
        let set: HashSet<(RunId, u32)> = lost.iter().copied().collect();
        for p in &self.pools {
            p.remove_prefetched(&set);
        }
        for (id, epoch) in lost {
            self.engine.end_in_flight(id, *epoch);
            self.forget_lease(id, *epoch);
        }
    }

    /// Stops renewing the lease of attempt `epoch` of `id`.
    fn forget_lease(&self, id: &RunId, epoch: u32) {
        if let Ok(mut h) = self.held.lock() {
            if h.get(id) == Some(&epoch) {
                h.remove(id);
            }
        }
    }

    /// A stopping worker's prefetched attempts, back to `pending` in one
    /// transaction (`release_claims` keeps their due time, so they keep
    /// their place among the due runs): another process can claim them at
    /// once. Tried up to `RETURN_TRIES` times, a short pause between (a
    /// connection lost once should not cost the other processes a lease's
    /// wait); if every try fails their leases lapse and the sweeper returns
    /// them. Either way they are no longer open here nor renewed.
    async fn return_prefetched(&self) {
        let mut back = Vec::new();
        for p in &self.pools {
            let mut n = 0;
            while let Some(t) = p.pop_prefetched() {
                back.push((t.run.id, t.epoch, t.run.claimed_at.get()));
                n += 1;
            }
            p.ahead.fetch_sub(n, Ordering::SeqCst);
        }
        if back.is_empty() {
            return;
        }
        for tried in 1..=RETURN_TRIES {
            let list = back.clone();
            match self.on_store(move |e| e.release_claims(&list)).await {
                Some(Ok(_)) => {
                    self.record_success(CallKind::Write);
                    break;
                }
                Some(Err(e)) => self.record_error(CallKind::Write, e),
                None => self.record_error(CallKind::Write, "a store transaction did not finish"),
            }
            if tried < RETURN_TRIES {
                tokio::time::sleep(Duration::from_millis(100 * u64::from(tried))).await;
            }
        }
        for (id, epoch, _) in &back {
            self.engine.end_in_flight(id, *epoch);
            self.forget_lease(id, *epoch);
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Stops claiming (every path). In-flight attempts go on, and their
    /// outcomes are still stored.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.engine.set_worker_hungry(false);
        self.stop.notify_one();
        self.wake.notify_one();
    }

    fn free_pools(&self) -> Vec<Arc<str>> {
        self.pools
            .iter()
            .filter(|p| p.has_free_slot())
            .map(|p| p.name.clone())
            .collect()
    }

    /// Claims into every free slot on the caller's thread (a store that
    /// settles inline); the tickets. JS calls it right after a `start`
    /// while the worker has idle slots, which saves the thread hand-off.
    pub fn fill(&self) -> Result<Vec<AttemptTicket>> {
        self.fill_only(None)
    }

    /// `fill` for the named pools only (`None`: every pool): after runs
    /// were created in those, the others have nothing new to claim.
    pub fn fill_only(&self, only: Option<&[Arc<str>]>) -> Result<Vec<AttemptTicket>> {
        if self.is_stopping() || !self.inline {
            return Ok(Vec::new());
        }
        let claims: Vec<(Arc<str>, usize)> = self
            .pools
            .iter()
            .filter(|p| only.is_none_or(|names| names.contains(&p.name)))
            .map(|p| (p.name.clone(), p.reserve(usize::MAX)))
            .filter(|c| c.1 > 0)
            .collect();
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let tickets = match self.engine.settle(Vec::new(), &claims) {
            Ok(s) => s.tickets,
            Err(e) => {
                self.release_unfilled(&claims, &[]);
                return Err(e);
            }
        };
        self.release_unfilled(&claims, &tickets);
        Ok(tickets)
    }

    /// Gives back the reserved slots that found no run; whether a pool
    /// found fewer than it wanted (nothing more is due there).
    fn release_unfilled(&self, claims: &[(Arc<str>, usize)], tickets: &[AttemptTicket]) -> bool {
        let mut short = false;
        for (pool, n) in claims {
            let got = tickets.iter().filter(|t| &t.run.pool == pool).count();
            short |= got < *n;
            if let Some(p) = self.pools.iter().find(|p| &p.name == pool) {
                p.release(n.saturating_sub(got));
            }
        }
        short
    }

    /// Records the ends of attempts (`outcome: None` = ended without one:
    /// canceled or released). `slot` is the index of the attempt's pool in
    /// [`Worker::pools`]; an index out of range frees no slot.
    ///
    /// A store that settles inline applies them now and, unless stopping,
    /// claims into the slots they free, all in one transaction; the new
    /// tickets, and the store's error if the transaction failed (then
    /// nothing was applied or claimed). A networked store queues them for
    /// the loop's next transaction (no I/O here) and answers the
    /// prefetched attempts it hands the freed slots to.
    pub fn report(
        &self,
        finished: Vec<(RunId, u32, Option<AttemptOutcome>, usize)>,
    ) -> (Vec<AttemptTicket>, Option<JobError>) {
        if !self.inline {
            let at = self.engine.now();
            let n = finished.len();
            let mut handed = Vec::new();
            if let Ok(mut d) = self.done.lock() {
                let stopping = self.is_stopping();
                for (id, epoch, outcome, slot) in finished {
                    if let Some(p) = self.pools.get(slot) {
                        p.ended.fetch_add(1, Ordering::SeqCst);
                    }
                    // The slot goes straight to the pool's next prefetched
                    // attempt: the handler after this one waits for no
                    // round trip.
                    let next = if self.prefetching() && !stopping {
                        self.pop_live(slot)
                    } else {
                        None
                    };
                    let slot = match next {
                        Some(t) => {
                            handed.push(t);
                            SLOT_HANDED_ON
                        }
                        None => slot,
                    };
                    d.push(Done {
                        // The run ended when its handler did, however late
                        // the outcome reaches the store.
                        end: AttemptEnd {
                            id,
                            epoch,
                            outcome,
                            ended_at: Some(at),
                        },
                        slot,
                    });
                }
                self.unsaved.fetch_add(n, Ordering::SeqCst);
            }
            self.wake.notify_one();
            return (handed, None);
        }
        let stopping = self.is_stopping();
        let mut freed = vec![0usize; self.pools.len()];
        let mut ends = Vec::with_capacity(finished.len());
        for (id, epoch, outcome, slot) in finished {
            if let Some(n) = freed.get_mut(slot) {
                *n += 1;
            }
            ends.push(AttemptEnd {
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
        let (tickets, error) = match self.engine.settle(ends, &claims) {
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
                // The slot is free: a start wakes the loop from now on, and
                // if a run of this pool falls due later, the loop re-arms
                // its timer for it (no wake-up when there is none).
                self.engine.set_worker_hungry(true);
                if self.engine.next_due(&p.name).is_some() {
                    self.engine.wake_worker();
                }
            }
        }
        (tickets, error)
    }

    fn record_error(&self, kind: CallKind, e: impl ToString) {
        let message = e.to_string();
        let notice = trouble_began(&self.trouble, kind, |secs| {
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

    /// A `kind` store call of the loop succeeded: ends a reported trouble
    /// once the kinds of call that failed succeed (see `trouble_ended`).
    fn record_success(&self, kind: CallKind) {
        if let Some(ms) = trouble_ended(&self.trouble, kind) {
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

    /// The attempt `epoch` of `id` ended: its slot is free and its lease
    /// no longer renewed. A newer attempt of the same run held here (a
    /// retry claimed while a timed-out handler still ran) keeps its lease.
    fn slot_freed(&self, slot: usize, id: &RunId, epoch: u32) {
        if let Some(p) = self.pools.get(slot) {
            p.release(1);
        }
        if self.shared {
            if let Ok(mut h) = self.held.lock() {
                if h.get(id) == Some(&epoch) {
                    h.remove(id);
                }
            }
        }
    }

    /// Runs `f` with the engine where the store's transactions run: here
    /// (inline) or on a blocking thread.
    async fn on_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine<S>) -> T + Send + 'static,
    ) -> Option<T> {
        if self.inline {
            return Some(f(&self.engine));
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || f(&engine)).await.ok()
    }

    /// The loop. Returns once stopped and, for a networked store, once
    /// every held attempt's end is stored.
    pub async fn run<D: BatchDispatcher>(self: Arc<Self>, dispatcher: D) {
        let dispatcher = Arc::new(dispatcher);
        if let Ok(mut n) = self.notices.lock() {
            let d = dispatcher.clone();
            *n = Some(Arc::new(move |m| d.notice(m)));
        }
        let listening = Arc::new(AtomicBool::new(true));
        let mut tasks = vec![tokio::spawn(self.clone().fire_schedules())];
        if self.shared {
            self.spawn_listener(listening.clone());
            // Recover before taking new work: the runs of a process that
            // died are returned first (with their own due times), so the
            // first claim takes them in their place in the queue, not the
            // runs queued behind them. One round trip at start.
            self.sweep_once().await;
            tasks.push(tokio::spawn(self.clone().maintain()));
        }
        let activity = self.engine.activity();
        loop {
            let stopping = self.is_stopping();
            if stopping && self.prefetching() {
                self.return_prefetched().await;
            }
            self.return_lapsed().await;
            let active = self.settling.load(Ordering::SeqCst);
            // An inline store's ends are stored by `report` itself.
            if stopping
                && (self.inline
                    || (active == 0
                        && self.done_is_empty()
                        && self.in_flight() == 0
                        && self.ahead() == 0))
            {
                // A settle that ended since this pass began may have
                // dropped a lapsed prefetched run: given back before the end.
                self.return_lapsed().await;
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
            let handed = self.free_and_hand_out(&batch);
            if !handed.is_empty() {
                self.dispatch_or_release(&*dispatcher, handed).await;
            }
            let starved = self.starved.load(Ordering::SeqCst);
            if !stopping {
                // Announce hunger before claiming, so a start racing this
                // claim leaves a wake-up permit instead of being missed.
                self.engine.set_hungry_pools(self.free_pools());
            }
            let claims: Vec<ClaimPlan> = if stopping || starved || !room {
                Vec::new()
            } else {
                self.plan_claims()
            };
            if batch.is_empty() && claims.is_empty() {
                // Nothing to do until an end, a start (here or in another
                // process), a due time, or the poll interval.
                // Only a claim that came up short makes looking for the next
                // due time worth a query (with every slot busy, or a settle
                // backing off after a failure, there is nothing to look for).
                let wait = if starved && !stopping {
                    self.idle_wait().await
                } else if self.shared {
                    Some(Duration::from_millis(self.timings.poll_ms as u64))
                } else {
                    None
                };
                let timer = async {
                    match wait {
                        Some(w) => tokio::time::sleep(w).await,
                        None => std::future::pending::<()>().await,
                    }
                };
                let outside = tokio::select! {
                    _ = self.wake.notified() => false,
                    _ = self.external.notified() => true,
                    _ = activity.notified() => true,
                    _ = timer => true,
                    _ = self.stop.notified() => false,
                };
                if outside {
                    self.starved.store(false, Ordering::SeqCst);
                }
                continue;
            }
            self.settling.fetch_add(1, Ordering::SeqCst);
            if self.inline {
                self.clone().settle(dispatcher.clone(), batch, claims).await;
            } else {
                tokio::spawn(self.clone().settle(dispatcher.clone(), batch, claims));
            }
        }
        listening.store(false, Ordering::SeqCst);
        for t in tasks {
            t.abort();
        }
        self.engine.set_worker_hungry(false);
        // The sink holds the dispatcher (the JS callback): let it go with the
        // loop, or a stopped worker would keep its orchestrator alive.
        if let Ok(mut n) = self.notices.lock() {
            *n = None;
        }
    }

    /// The start of a pass of the loop: the slots of `batch` (ends about to
    /// be settled) are freed, claimable in the same transaction, and free
    /// slots take prefetched runs first (they were claimed first). If the
    /// settle fails, `requeue` takes the batch's slots back.
    fn free_and_hand_out(&self, batch: &[Done]) -> Vec<AttemptTicket> {
        for d in batch {
            self.slot_freed(d.slot, &d.end.id, d.end.epoch);
        }
        self.hand_out_prefetched()
    }

    /// What each pool claims: its free slots, plus (prefetch on) the
    /// room left in its prefetch queue, which holds at most the pool's
    /// concurrency (see `queue_bound`). At most `MAX_PREFETCH` in all: the
    /// store fetches no more in one claim, and asking for more would make
    /// every claim come up short (`starved`).
    fn plan_claims(&self) -> Vec<ClaimPlan> {
        self.pools
            .iter()
            .enumerate()
            .map(|(pool, p)| {
                let slots = p.reserve(MAX_PREFETCH);
                let ahead = reserve_on(&p.ahead, self.queue_bound(p), MAX_PREFETCH - slots);
                ClaimPlan { pool, slots, ahead }
            })
            .filter(|c| c.slots + c.ahead > 0)
            .collect()
    }

    /// Whether pools claim ahead of their free slots.
    fn prefetching(&self) -> bool {
        self.prefetch != Some(0)
    }

    /// How many runs pool `p` may hold prefetched: `prefetch` as
    /// configured; by default what the pool ended in the last
    /// `PACE_WINDOW`, at least its concurrency, at most `DEFAULT_PREFETCH`.
    /// A fast pool (short handlers) needs a long queue for each transaction
    /// to claim for many runs; a slow one gains nothing from one, which
    /// only hoards: the first process to claim a burst would take up to
    /// the whole queue while the other processes' slots stay idle.
    fn queue_bound(&self, p: &WorkerPool) -> usize {
        if let Some(n) = self.prefetch {
            return n.min(MAX_PREFETCH);
        }
        let per_window = match p.pace.lock() {
            Ok(mut pace) => {
                let ended = p.ended.load(Ordering::SeqCst);
                let elapsed = pace.since.elapsed();
                if elapsed >= PACE_WINDOW {
                    let n = ended.saturating_sub(pace.ended_then);
                    // Scaled to one window (a pass may come late).
                    let scaled = n as u128 * PACE_WINDOW.as_micros() / elapsed.as_micros().max(1);
                    pace.per_window = usize::try_from(scaled).unwrap_or(usize::MAX);
                    pace.since = std::time::Instant::now();
                    pace.ended_then = ended;
                }
                pace.per_window
            }
            Err(_) => 0,
        };
        per_window
            .clamp(p.concurrency.min(DEFAULT_PREFETCH), DEFAULT_PREFETCH)
            .min(MAX_PREFETCH)
    }

    /// Gives back what a failed claim reserved.
    fn release_plan(&self, plan: &[ClaimPlan]) {
        for c in plan {
            if let Some(p) = self.pools.get(c.pool) {
                p.release(c.slots);
                p.ahead.fetch_sub(c.ahead, Ordering::SeqCst);
            }
        }
    }

    /// Splits a claim's tickets: the best of each pool (of these and its
    /// prefetch queue) into the slots it reserved, the rest into the
    /// queue; gives back the rest of
    /// the reservation. The tickets to dispatch, and whether a pool found
    /// fewer runs than it asked for (nothing more is due there).
    fn place_claimed(
        &self,
        plan: &[ClaimPlan],
        tickets: Vec<AttemptTicket>,
    ) -> (Vec<AttemptTicket>, bool) {
        let mut by_pool: Vec<Vec<AttemptTicket>> = plan.iter().map(|_| Vec::new()).collect();
        for t in tickets {
            match plan
                .iter()
                .position(|c| self.pools.get(c.pool).is_some_and(|p| p.name == t.run.pool))
            {
                Some(i) => by_pool[i].push(t),
                None => by_pool[0].push(t),
            }
        }
        let mut dispatch = Vec::new();
        let mut short = false;
        for (c, got) in plan.iter().zip(by_pool) {
            let Some(p) = self.pools.get(c.pool) else {
                continue;
            };
            short |= got.len() < c.slots + c.ahead;
            let slots = got.len().min(c.slots);
            let queued = got.len() - slots;
            p.release(c.slots - slots);
            p.ahead
                .fetch_sub(c.ahead.saturating_sub(queued), Ordering::SeqCst);
            // The slots take the best of this claim and the queue: another
            // claim of this worker, begun earlier, may have queued better
            // runs while this one ran (it skipped them, locked), and they
            // would otherwise start after these.
            p.ahead.fetch_add(slots, Ordering::SeqCst);
            p.enqueue_prefetched(got);
            for _ in 0..slots {
                match self.pop_live(c.pool) {
                    Some(t) => dispatch.push(t),
                    None => p.release(1),
                }
            }
        }
        (dispatch, short)
    }

    /// Hands tickets to JS; if JS is gone, stops and puts their runs back.
    async fn dispatch_or_release<D: BatchDispatcher>(
        &self,
        dispatcher: &D,
        tickets: Vec<AttemptTicket>,
    ) {
        let dispatched: Vec<(RunId, u32, Arc<str>)> = tickets
            .iter()
            .map(|t| (t.run.id, t.epoch, t.run.pool.clone()))
            .collect();
        if !dispatcher.dispatch(tickets) {
            // JS is gone: hand the runs back.
            self.stop();
            for (id, epoch, pool) in dispatched {
                let _ = self.on_store(move |e| e.release_attempt(&id, epoch)).await;
                if let Some(slot) = self.pools.iter().position(|p| p.name == pool) {
                    self.slot_freed(slot, &id, epoch);
                }
            }
        }
    }

    /// One transaction: ends in, claims out, tickets to JS.
    async fn settle<D: BatchDispatcher>(
        self: Arc<Self>,
        dispatcher: Arc<D>,
        batch: Vec<Done>,
        plan: Vec<ClaimPlan>,
    ) {
        // A copy: after a failed transaction the batch is tried again.
        let ends: Vec<AttemptEnd> = batch.iter().map(|d| d.end.clone()).collect();
        let claims_for_tx: Vec<(Arc<str>, usize)> = plan
            .iter()
            .filter_map(|c| Some((self.pools.get(c.pool)?.name.clone(), c.slots + c.ahead)))
            .collect();
        let result = self.on_store(move |e| e.settle(ends, &claims_for_tx)).await;
        let tickets = match result {
            Some(Ok(settled)) => {
                self.unsaved.fetch_sub(batch.len(), Ordering::SeqCst);
                self.settle_failures.store(0, Ordering::SeqCst);
                self.record_success(CallKind::Write);
                settled.tickets
            }
            failed => {
                let lost = matches!(&failed, Some(Err(e)) if e.runs_again());
                match failed {
                    Some(Err(e)) => self.record_error(CallKind::Write, e),
                    _ => self.record_error(CallKind::Write, "a store transaction did not finish"),
                }
                // Nothing changed (a commit whose answer was lost is read
                // back by the store: `Ok` if it landed): give the
                // reservations back and try the ends again shortly (their
                // runs stay running and leased). A transaction whose
                // outcome is unknown is tried again the same way: an end
                // already applied is ignored (its claim epoch moved on).
                self.release_plan(&plan);
                self.requeue(batch);
                // Try again soon, then less and less often while it keeps
                // failing (an unreachable database is not hammered); a
                // connection the server ended is replaced at once, so the
                // first tries after one go straight to a fresh connection.
                let failures = self.settle_failures.fetch_add(1, Ordering::SeqCst);
                let wait = if lost && failures < LOST_AT_ONCE {
                    Duration::ZERO
                } else {
                    backoff(Duration::from_millis(100), Duration::from_secs(2), failures)
                };
                tokio::time::sleep(wait).await;
                self.settling.fetch_sub(1, Ordering::SeqCst);
                self.wake.notify_one();
                return;
            }
        };
        if self.shared && !tickets.is_empty() {
            // Prefetched ones too: their leases are renewed until they end.
            if let Ok(mut h) = self.held.lock() {
                for t in &tickets {
                    h.insert(t.run.id, t.epoch);
                }
            }
        }
        let (mut tickets, short) = self.place_claimed(&plan, tickets);
        if short {
            self.starved.store(true, Ordering::SeqCst);
        }
        // Slots freed while this transaction ran take what it queued.
        tickets.extend(self.hand_out_prefetched());
        if !tickets.is_empty() {
            self.dispatch_or_release(&*dispatcher, tickets).await;
        }
        self.settling.fetch_sub(1, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn done_is_empty(&self) -> bool {
        self.done.lock().map(|d| d.is_empty()).unwrap_or(true)
    }

    fn requeue(&self, batch: Vec<Done>) {
        for d in &batch {
            if let Some(p) = self.pools.get(d.slot) {
                // The slot is still taken until the end is stored, though
                // the pass that freed it may have handed it to a
                // prefetched attempt: `reserve` would then find the pool
                // full and take nothing, and the next pass's `slot_freed`
                // would free it again (the count drifting below the
                // handlers running, then wrapping).
                p.retake(1);
            }
            if self.shared {
                if let Ok(mut h) = self.held.lock() {
                    // Not over a newer attempt of the run held meanwhile.
                    h.entry(d.end.id).or_insert(d.end.epoch);
                }
            }
        }
        if let Ok(mut d) = self.done.lock() {
            d.extend(batch);
        }
    }

    /// How long to wait with nothing to do: until the earliest due run of a
    /// pool with a free slot (`None`: none is waiting); a shared store at
    /// most the poll interval.
    async fn idle_wait(&self) -> Option<Duration> {
        let poll = Duration::from_millis(self.timings.poll_ms as u64);
        let pools = self.free_pools();
        let due = self
            .on_store(move |e| pools.iter().filter_map(|p| e.next_due(p)).min())
            .await
            .flatten();
        let now = self.engine.now();
        let until_due = match due {
            // Due but not claimable by us (held by another process, or
            // claimed meanwhile): look again soon.
            Some(t) if t <= now => Some(Duration::from_millis(50)),
            Some(t) => Some(Duration::from_millis((t - now) as u64)),
            None => None,
        };
        if self.shared {
            Some(until_due.map_or(poll, |d| d.min(poll)))
        } else {
            until_due
        }
    }

    /// Starts the runs of due schedules, until aborted: at each next fire
    /// (as stored), when a schedule changes here, and (a shared store) at
    /// least every poll interval, for a schedule changed elsewhere. Any
    /// number of processes may do this: a due schedule is locked by the
    /// transaction that fires it and skipped by the others, so each
    /// occurrence starts one run.
    async fn fire_schedules(self: Arc<Self>) {
        let changed = self.engine.schedules_changed();
        let poll = Duration::from_millis(self.timings.poll_ms as u64);
        let mut failures: u32 = 0;
        let mut missing_table_told = false;
        loop {
            if self.is_stopping() {
                return;
            }
            let r = self.on_store(|e| e.fire_timers_then_next()).await;
            let looked = matches!(r, Some(Ok(_)));
            let wait = match r {
                Some(Ok((fire, deadline))) => {
                    failures = 0;
                    if let Some(ms) = trouble_ended(&self.schedule_trouble, CallKind::Write) {
                        self.notify(format!(
                            "the worker fires schedules again (after {ms} ms of failures)"
                        ));
                    }
                    let now = self.engine.now();
                    let until = |t: Option<Millis>, still_due: Duration| match t {
                        Some(t) if t <= now => Some(still_due),
                        Some(t) => Some(Duration::from_millis((t - now) as u64)),
                        None => None,
                    };
                    // A schedule still due after firing: another process
                    // holds it (firing it right now); look again soon, not
                    // at once. A deadline due already fell due while the
                    // timer worked (runs due every millisecond): resume it
                    // now, unless another process holds it (shared store).
                    let again = if self.shared { 10 } else { 0 };
                    let until = match (
                        until(fire, Duration::from_millis(50)),
                        until(deadline, Duration::from_millis(again)),
                    ) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    if self.shared {
                        Some(until.map_or(poll, |d| d.min(poll)))
                    } else {
                        until
                    }
                }
                Some(Err(e)) if is_missing_schedule_table(&e) => {
                    // A database migrated before schedules existed: nothing
                    // to fire until `migrate()` adds the table. Say so once,
                    // then keep looking, backing off, without repeating it.
                    let first =
                        trouble_began(&self.schedule_trouble, CallKind::Write, |_| String::new());
                    if first.is_some() && !missing_table_told {
                        missing_table_told = true;
                        self.notify(
                            "the worker fires no schedules: this database has no job_schedule table yet (run migrate())"
                                .to_owned(),
                        );
                    }
                    failures += 1;
                    Some(backoff(
                        Duration::from_millis(500),
                        Duration::from_secs(10),
                        failures - 1,
                    ))
                }
                Some(Err(e)) => {
                    let notice = trouble_began(&self.schedule_trouble, CallKind::Write, |secs| {
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
                    Some(backoff(
                        Duration::from_millis(500),
                        Duration::from_secs(10),
                        failures - 1,
                    ))
                }
                None => Some(poll),
            };
            // Parks with a deadline after the wake-up need not wake it.
            let wake_at = match (looked, wait) {
                (true, Some(w)) => Some(
                    self.engine
                        .now()
                        .saturating_add(i64::try_from(w.as_millis()).unwrap_or(i64::MAX)),
                ),
                (true, None) => None,
                (false, _) => Some(i64::MIN),
            };
            self.engine.timer_sleeps_until(wake_at);
            // A manual clock's `advanceTime` notifies `changed`.
            let timer = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = changed.notified() => {}
                _ = timer => {}
            }
        }
    }

    /// Returns the runs of expired leases to `pending` (see `sweep`).
    async fn sweep_once(&self) {
        let lease = self.timings.lease_ms;
        match self.on_store(move |e| sweep_in(e, lease)).await {
            Some(Err((kind, e))) => self.record_error(kind, &e),
            Some(Ok(swept)) => self.record_success(swept.kind),
            None => {}
        }
    }

    /// Heartbeat and sweeper (a shared store), until aborted. The first
    /// sweep is `run`'s, before the first claim.
    async fn maintain(self: Arc<Self>) {
        let every = Duration::from_millis((self.timings.lease_ms / 3).max(50) as u64);
        let mut ticks: u64 = 1;
        loop {
            if ticks.is_multiple_of(2) {
                self.sweep_once().await;
            }
            tokio::time::sleep(every).await;
            ticks += 1;
            let held: Vec<(RunId, u32)> = self
                .held
                .lock()
                .map(|h| h.iter().map(|(k, v)| (*k, *v)).collect())
                .unwrap_or_default();
            if !held.is_empty() {
                let began = self.engine.now();
                let beat = held.clone();
                let r = self
                    .on_store(move |e| e.store().renew_leases(&beat, e.now()))
                    .await;
                match r {
                    Some(Err(e)) => self.record_error(CallKind::Write, &e),
                    Some(Ok(renewed)) => {
                        self.record_success(CallKind::Write);
                        self.renewed_at.fetch_max(began, Ordering::SeqCst);
                        // Some not renewed: ended, canceled or swept
                        // elsewhere (a missed notification, an outage
                        // longer than the lease), or only locked right now
                        // (SKIP LOCKED): a plain read tells which.
                        if (renewed as usize) < held.len() {
                            match self.on_store(move |e| e.store().lost_leases(&held)).await {
                                Some(Ok(lost)) => self.drop_lost(&lost),
                                Some(Err(e)) => self.record_error(CallKind::Read, &e),
                                None => {}
                            }
                        }
                    }
                    None => {}
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
                    // Starts committed before LISTEN took effect told no
                    // one (the loop's first claim may have run before
                    // them: at startup, or during a reconnect): one look
                    // once listening covers them, and notifications the
                    // rest. Without it a burst started right after
                    // `startWorker` waited for the poll interval here.
                    let listening_now = || wake.notify_one();
                    let began = std::time::Instant::now();
                    if engine
                        .store()
                        .listen(&keep, &listening_now, &notify)
                        .is_err()
                    {
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
            // No store call failed, but events from other processes are
            // missed: reported until a call succeeds.
            self.record_error(CallKind::Read, e);
        }
    }
}

/// Returns runs whose lease expired (their worker is gone) to `pending`.
/// Returns how many.
pub fn sweep<S: Store + Coordination>(engine: &Engine<S>, lease_ms: i64) -> Result<usize> {
    sweep_in(engine, lease_ms)
        .map(|s| s.released)
        .map_err(|(_, e)| e)
}

/// What a sweep did.
struct Swept {
    released: usize,
    /// The kind of the calls it made: only the read when no lease expired.
    kind: CallKind,
}

/// `sweep`, telling which kind of call it made or which one failed: the
/// look for expired leases reads, the releases write.
fn sweep_in<S: Store + Coordination>(
    engine: &Engine<S>,
    lease_ms: i64,
) -> std::result::Result<Swept, (CallKind, JobError)> {
    let now = engine.now();
    let expired = engine
        .store()
        .expired_leases(now, lease_ms, 500)
        .map_err(|e| (CallKind::Read, e))?;
    let kind = if expired.is_empty() {
        CallKind::Read
    } else {
        CallKind::Write
    };
    // One transaction for all of them (at most 500): rows read in one
    // statement, written in one.
    let n = engine
        .release_attempts(&expired)
        .map_err(|e| (CallKind::Write, e))?;
    if n > 0 {
        engine.wake_worker();
    }
    Ok(Swept { released: n, kind })
}

#[cfg(test)]
mod tests {
    use super::{backoff, trouble_began, trouble_ended, CallKind, Trouble};
    use super::{BatchDispatcher, Done, Worker, WorkerPool, WorkerTimings};
    use crate::{
        AttemptEnd, AttemptOutcome, AttemptTicket, ClockKind, Coordination, DefinitionSpec, Engine,
        EngineOptions, JobError, MemoryStore, Result, StartRequest, Store,
    };
    use serde_json::value::RawValue;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A networked store (settles on blocking threads, prefetches) whose
    /// transactions fail while `failing` is set.
    struct Flaky {
        inner: MemoryStore,
        failing: AtomicBool,
        /// Whether it says other processes share it (leases matter).
        shared: bool,
    }

    /// An engine over `Flaky` with type `t` in pool `a` and `runs` pending runs of it.
    fn flaky_engine(shared: bool, runs: usize) -> Arc<Engine<Flaky>> {
        let e = Arc::new(Engine::new(
            Flaky {
                inner: MemoryStore::new(),
                failing: AtomicBool::new(false),
                shared,
            },
            EngineOptions {
                multi_tenant: false,
                clock: ClockKind::Manual,
                retention: Default::default(),
            },
        ));
        e.register(DefinitionSpec {
            job_type: "t".into(),
            pool: Some("a".into()),
            ..DefinitionSpec::default()
        })
        .unwrap();
        for i in 0..runs {
            e.start(StartRequest {
                job_type: "t".into(),
                input: RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap(),
                ..StartRequest::default()
            })
            .unwrap();
        }
        e
    }

    impl Store for Flaky {
        type Tx<'a> = <MemoryStore as Store>::Tx<'a>;

        fn transaction<R>(&self, f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
            if self.failing.load(Ordering::SeqCst) {
                return Err(JobError::Store {
                    message: "connection refused".to_owned(),
                    retryable: true,
                    outcome: crate::error::StoreOutcome::Unchanged,
                });
            }
            self.inner.transaction(f)
        }

        fn read<R>(&self, f: impl Fn(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
            self.inner.read(f)
        }
    }

    impl Coordination for Flaky {
        fn shared(&self) -> bool {
            self.shared
        }

        fn inline(&self) -> bool {
            false
        }

        fn connections(&self) -> usize {
            4
        }
    }

    /// Keeps what the worker dispatched: the handlers it started.
    #[derive(Clone, Default)]
    struct Started(Arc<Mutex<Vec<AttemptTicket>>>);

    impl BatchDispatcher for Started {
        fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool {
            self.0.lock().unwrap().extend(tickets);
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_settle_after_a_hand_out_keeps_the_slots_of_its_ends() {
        let e = flaky_engine(false, 10);
        let w = Worker::with_timings(
            e.clone(),
            vec![WorkerPool::new("a", 2)],
            WorkerTimings {
                prefetch: None,
                ..WorkerTimings::default()
            },
        );
        let started = Started::default();
        let concurrency = 2;
        // The first claim: two runs into the slots, two queued (by default
        // a queue holds as many as the pool's concurrency).
        let plan = w.plan_claims();
        w.clone()
            .settle(Arc::new(started.clone()), Vec::new(), plan)
            .await;
        assert_eq!(started.0.lock().unwrap().len(), 2);
        assert_eq!(w.pools()[0].prefetched(), 2);
        // The first handler ends, its report finding the queue empty (a
        // claim that queued runs was still in its transaction): its end
        // keeps its slot until a pass of the loop settles it.
        let first = started.0.lock().unwrap()[0].clone();
        w.done.lock().unwrap().push(Done {
            end: AttemptEnd {
                id: first.run.id,
                epoch: first.epoch,
                outcome: Some(AttemptOutcome::Completed(None)),
                ended_at: Some(e.now()),
            },
            slot: 0,
        });
        w.unsaved.fetch_add(1, Ordering::SeqCst);
        let mut ended = 1;
        e.store().failing.store(true, Ordering::SeqCst);
        // Passes of the loop whose settles fail: each frees the end's slot,
        // hands it to a prefetched run, and takes it back on the failure.
        for pass in 0..3 {
            let batch: Vec<Done> = std::mem::take(&mut *w.done.lock().unwrap());
            let handed = w.free_and_hand_out(&batch);
            started.0.lock().unwrap().extend(handed);
            let plan = w.plan_claims();
            w.clone()
                .settle(Arc::new(started.clone()), batch, plan)
                .await;
            let running = started.0.lock().unwrap().len() - ended;
            assert!(
                running <= concurrency,
                "pass {pass}: {running} handlers for a concurrency of {concurrency}"
            );
            assert_eq!(
                w.in_flight(),
                running + 1,
                "pass {pass}: the handlers' slots and the unsaved end's"
            );
        }
        // The store is back: the end is stored, and the slots held are the
        // handlers'.
        e.store().failing.store(false, Ordering::SeqCst);
        let batch: Vec<Done> = std::mem::take(&mut *w.done.lock().unwrap());
        let handed = w.free_and_hand_out(&batch);
        started.0.lock().unwrap().extend(handed);
        let plan = w.plan_claims();
        w.clone()
            .settle(Arc::new(started.clone()), batch, plan)
            .await;
        let running = started.0.lock().unwrap().len() - ended;
        assert_eq!(running, concurrency);
        assert_eq!(w.in_flight(), running);
        // Every handler ends: no slot is left held, and none was given back
        // twice (the count would wrap and the pool never claim again).
        let all: Vec<AttemptTicket> = started.0.lock().unwrap()[ended..].to_vec();
        ended += all.len();
        let finished = all
            .iter()
            .map(|t| (t.run.id, t.epoch, Some(AttemptOutcome::Completed(None)), 0))
            .collect();
        let (handed, error) = w.report(finished);
        assert!(error.is_none());
        assert_eq!(handed.len(), concurrency, "the slots go to queued runs");
        started.0.lock().unwrap().extend(handed);
        assert_eq!(w.in_flight(), started.0.lock().unwrap().len() - ended);
        assert!(w.in_flight() <= concurrency);
    }

    /// Two claims of one worker overlap: the earlier (for the queue) locks
    /// the better run, the later (for a freed slot) skips it and lands
    /// second. The slot takes the better run from the queue; it took its
    /// own claim's, so a lower priority started first.
    #[test]
    fn a_freed_slot_takes_the_better_of_its_claim_and_the_queue() {
        let e = flaky_engine(true, 0);
        for priority in [7, 6] {
            e.start(StartRequest {
                job_type: "t".into(),
                input: RawValue::from_string("{}".into()).unwrap(),
                priority: Some(priority),
                ..StartRequest::default()
            })
            .unwrap();
        }
        let w = Worker::with_timings(
            e.clone(),
            vec![WorkerPool::new("a", 1)],
            WorkerTimings {
                prefetch: Some(1),
                ..WorkerTimings::default()
            },
        );
        let mut claimed = e.settle(Vec::new(), &[("a".into(), 2)]).unwrap().tickets;
        let six = claimed.pop().unwrap();
        let seven = claimed.pop().unwrap();
        assert_eq!((seven.run.priority, six.run.priority), (7, 6));
        let p = &w.pools()[0];
        // The earlier claim landed: 7 queued.
        p.ahead.fetch_add(1, Ordering::SeqCst);
        p.enqueue_prefetched([seven]);
        // The later one, for the free slot, lands with 6.
        let plan = [super::ClaimPlan {
            pool: 0,
            slots: p.reserve(1),
            ahead: 0,
        }];
        let (dispatch, short) = w.place_claimed(&plan, vec![six]);
        assert!(!short);
        let started: Vec<i32> = dispatch.iter().map(|t| t.run.priority).collect();
        assert_eq!(started, [7]);
        assert_eq!(p.prefetched(), 1);
        assert_eq!(p.ahead.load(Ordering::SeqCst), 1, "one queued");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_prefetched_run_whose_lease_may_have_lapsed_is_dropped_not_started() {
        let e = flaky_engine(true, 4);
        let w = Worker::with_timings(
            e.clone(),
            vec![WorkerPool::new("a", 1)],
            WorkerTimings {
                lease_ms: 1_000,
                prefetch: Some(2),
                ..WorkerTimings::default()
            },
        );
        let started = Started::default();
        let plan = w.plan_claims();
        w.clone()
            .settle(Arc::new(started.clone()), Vec::new(), plan)
            .await;
        assert_eq!(started.0.lock().unwrap().len(), 1);
        assert_eq!(w.pools()[0].prefetched(), 2);
        let first = started.0.lock().unwrap()[0].clone();
        let end =
            |t: &AttemptTicket| vec![(t.run.id, t.epoch, Some(AttemptOutcome::Completed(None)), 0)];
        // Within the lease: the freed slot takes the next queued run.
        e.advance_time(999);
        let (handed, _) = w.report(end(&first));
        assert_eq!(handed.len(), 1, "a fresh lease is handed out");
        // No heartbeat succeeded since the claim, a lease ago: another
        // process may have swept the last queued run and run it.
        e.advance_time(1);
        let (handed, _) = w.report(end(&handed[0]));
        assert!(handed.is_empty(), "a lapsed lease was handed out");
        assert_eq!(w.pools()[0].prefetched(), 0);
        assert_eq!(w.ahead(), 0);
        // A heartbeat that succeeded renews what is queued.
        w.renewed_at.store(e.now(), Ordering::SeqCst);
        assert!(!w.lease_may_have_lapsed(&first));
    }

    #[test]
    fn a_default_prefetch_queue_follows_its_pools_pace() {
        let e = flaky_engine(false, 0);
        let timings = |prefetch| WorkerTimings {
            prefetch,
            ..WorkerTimings::default()
        };
        let w = Worker::with_timings(e.clone(), vec![WorkerPool::new("a", 4)], timings(None));
        let p = &w.pools()[0];
        // Nothing measured yet (an idle pool meeting a burst): its slots' worth.
        assert_eq!(w.queue_bound(p), 4);
        let window_ago = |p: &WorkerPool| {
            p.pace.lock().unwrap().since = std::time::Instant::now() - super::PACE_WINDOW;
        };
        // Slow handlers: 3 ended in a window.
        p.ended.fetch_add(3, Ordering::SeqCst);
        window_ago(p);
        assert_eq!(w.queue_bound(p), 4, "at least the pool's concurrency");
        // Fast ones: 120 in a window, then more than the cap.
        p.ended.fetch_add(120, Ordering::SeqCst);
        window_ago(p);
        let fast = w.queue_bound(p);
        assert!((110..=120).contains(&fast), "{fast}");
        p.ended.fetch_add(5_000, Ordering::SeqCst);
        window_ago(p);
        assert_eq!(w.queue_bound(p), super::DEFAULT_PREFETCH);
        // A set prefetch is what it says.
        let fixed = Worker::with_timings(e, vec![WorkerPool::new("a", 4)], timings(Some(30)));
        assert_eq!(fixed.queue_bound(&fixed.pools()[0]), 30);
    }

    #[test]
    fn an_outage_ends_once_the_kinds_of_call_that_failed_succeed() {
        let t = Mutex::new(Trouble::default());
        let say = |_| "failing".to_owned();
        // Writes fail (a read-only database); reads go on succeeding.
        assert!(trouble_began(&t, CallKind::Write, say).is_some());
        assert_eq!(trouble_ended(&t, CallKind::Read), None);
        assert!(
            trouble_began(&t, CallKind::Write, say).is_none(),
            "told once"
        );
        assert!(trouble_ended(&t, CallKind::Write).is_some());
        assert_eq!(trouble_ended(&t, CallKind::Write), None, "over");
        // Everything fails (the server is gone): a write's success says
        // reads work too.
        assert!(trouble_began(&t, CallKind::Read, say).is_some());
        assert!(trouble_began(&t, CallKind::Write, say).is_none());
        assert!(trouble_ended(&t, CallKind::Write).is_some());
        // Only reads failed: a read's success ends it.
        assert!(trouble_began(&t, CallKind::Read, say).is_some());
        assert!(trouble_ended(&t, CallKind::Read).is_some());
    }

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
