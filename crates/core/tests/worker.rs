//! The worker: its slot accounting when JS reports finished attempts in
//! batches, and its outage log.

use jobforge_core::engine::AttemptTicket;
use jobforge_core::worker::{Worker, WorkerPool};
use jobforge_core::*;
use serde_json::value::RawValue;
use std::sync::Arc;

fn setup() -> (
    Arc<Engine<MemoryStore>>,
    Arc<Worker<MemoryStore>>,
    Vec<RunId>,
) {
    let e = Arc::new(Engine::new(
        MemoryStore::new(),
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
    let ids = (0..5)
        .map(|i| {
            e.start(StartRequest {
                job_type: "t".into(),
                input: RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap(),
                ..StartRequest::default()
            })
            .unwrap()
            .id
        })
        .collect();
    let w = Worker::new(
        e.clone(),
        vec![WorkerPool::new("a", 2), WorkerPool::new("b", 1)],
    );
    (e, w, ids)
}

fn done() -> Option<AttemptOutcome> {
    Some(AttemptOutcome::Completed(None))
}

/// Every ticket completed, reported from pool 0.
fn completed(tickets: &[AttemptTicket]) -> Vec<(RunId, u32, Option<AttemptOutcome>, usize)> {
    tickets
        .iter()
        .map(|t| (t.run.id, t.epoch, done(), 0))
        .collect()
}

#[test]
fn a_report_refills_the_slots_it_frees_and_no_more() {
    let (e, w, ids) = setup();
    let first = w.fill().unwrap();
    let claimed: Vec<RunId> = first.iter().map(|t| t.run.id).collect();
    assert_eq!(claimed, ids[..2]);
    assert_eq!(w.pools()[0].in_flight(), 2);

    // Two finished in pool 0: both slots go to the next two runs.
    let (next, err) = w.report(completed(&first));
    assert!(err.is_none());
    assert_eq!(next.iter().map(|t| t.run.id).collect::<Vec<_>>(), ids[2..4]);
    assert_eq!(w.pools()[0].in_flight(), 2);
    for id in &ids[..2] {
        assert_eq!(e.run_row(id).unwrap().status, RunStatus::Completed);
    }

    // One frees its slot; one names no pool of this worker (frees none).
    let (next2, _) = w.report(vec![
        (next[0].run.id, next[0].epoch, done(), 0),
        (next[1].run.id, next[1].epoch, done(), 99),
    ]);
    assert_eq!(
        next2.iter().map(|t| t.run.id).collect::<Vec<_>>(),
        ids[4..5]
    );
    assert_eq!(w.pools()[0].in_flight(), 2);

    // An attempt that ended without an outcome (canceled): its slot is
    // freed, nothing is left to claim, the run is not touched.
    e.cancel(&ids[4].to_string(), true, &TenantArg::Missing)
        .unwrap();
    let (none, _) = w.report(vec![(ids[4], next2[0].epoch, None, 0)]);
    assert!(none.is_empty());
    assert_eq!(w.pools()[0].in_flight(), 1);
    assert_eq!(e.run_row(&ids[4]).unwrap().status, RunStatus::Canceled);
    e.store().verify_indexes().unwrap();
}

#[test]
fn a_stopping_worker_records_outcomes_but_claims_nothing() {
    let (e, w, ids) = setup();
    let first = w.fill().unwrap();
    w.stop();
    let (next, err) = w.report(completed(&first));
    assert!(err.is_none());
    assert!(next.is_empty());
    assert_eq!(w.pools()[0].in_flight(), 0);
    assert_eq!(e.run_row(&ids[0]).unwrap().status, RunStatus::Completed);
    assert_eq!(e.run_row(&ids[2]).unwrap().status, RunStatus::Pending);
}

#[test]
fn a_stale_outcome_is_ignored_and_still_frees_its_slot() {
    let (e, w, ids) = setup();
    let first = w.fill().unwrap();
    // Epoch of an earlier attempt: not applied, the run stays running.
    let (next, _) = w.report(vec![(first[0].run.id, first[0].epoch + 7, done(), 0)]);
    assert_eq!(e.run_row(&ids[0]).unwrap().status, RunStatus::Running);
    assert_eq!(next.len(), 1);
    assert_eq!(w.pools()[0].in_flight(), 2);
}

// ── the outage log ─────────────────────────────────────────────────────

use jobforge_core::worker::{BatchDispatcher, WorkerTimings};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A shared store whose writes fail while `read_only` is set and whose
/// reads always answer: a database made read-only (or a standby after a
/// failover), as the worker on PostgreSQL meets it.
struct ReadOnlyAtTimes {
    inner: MemoryStore,
    read_only: AtomicBool,
}

impl Store for ReadOnlyAtTimes {
    type Tx<'a> = <MemoryStore as Store>::Tx<'a>;

    fn transaction<R>(&self, f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
        if self.read_only.load(Ordering::SeqCst) {
            return Err(JobError::store(
                "cannot execute UPDATE in a read-only transaction",
                false,
            ));
        }
        self.inner.transaction(f)
    }

    fn read<R>(&self, f: impl Fn(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
        self.inner.read(f)
    }
}

/// Shared (so the worker sweeps: a read that succeeds) and networked (so
/// the loop settles and claims on blocking threads: writes that fail).
impl Coordination for ReadOnlyAtTimes {
    fn shared(&self) -> bool {
        true
    }

    fn inline(&self) -> bool {
        false
    }

    fn connections(&self) -> usize {
        4
    }

    fn listen(
        &self,
        keep_going: &dyn Fn() -> bool,
        _on_listening: &dyn Fn(),
        _on_change: &dyn Fn(Option<(RunId, Option<u32>)>),
    ) -> Result<()> {
        // Nothing to hear; blocks like a listener until told to stop.
        while keep_going() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// Keeps the worker's notices.
struct Notices(Arc<Mutex<Vec<String>>>);

impl BatchDispatcher for Notices {
    fn dispatch(&self, _tickets: Vec<AttemptTicket>) -> bool {
        true
    }

    fn notice(&self, message: String) {
        self.0.lock().unwrap().push(message);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outage_log_says_succeed_again_only_once_the_failing_writes_succeed() {
    let e = Arc::new(Engine::new(
        ReadOnlyAtTimes {
            inner: MemoryStore::new(),
            read_only: AtomicBool::new(false),
        },
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    ));
    // The shortest lease: the sweeper (a read, as nothing expired) looks
    // every 100 ms while the claims (writes) keep failing.
    let w = Worker::with_timings(
        e.clone(),
        vec![WorkerPool::new("a", 2)],
        WorkerTimings {
            lease_ms: 100,
            poll_ms: 10,
            ..WorkerTimings::default()
        },
    );
    let heard: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let said = || -> Vec<String> {
        heard
            .lock()
            .unwrap()
            .iter()
            .filter(|m| m.contains("database calls"))
            .map(|m| {
                if m.contains("succeed again") {
                    "succeed again".to_owned()
                } else if m.contains("are failing") {
                    "failing".to_owned()
                } else {
                    m.clone()
                }
            })
            .collect()
    };
    e.store().read_only.store(true, Ordering::SeqCst);
    let looping = tokio::spawn(w.clone().run(Notices(heard.clone())));
    // About ten sweeps succeed while the claims fail, backing off.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(
        said(),
        vec!["failing"],
        "reads that succeed while writes fail end no outage"
    );
    e.store().read_only.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while said().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        said(),
        vec!["failing", "succeed again"],
        "once the writes succeed, the outage ends"
    );
    w.stop();
    tokio::time::timeout(Duration::from_secs(5), looping)
        .await
        .unwrap()
        .unwrap();
}

// ── the listener's start ───────────────────────────────────────────────

/// A shared store whose listener begins to listen only once `may_listen`
/// is set: the connection a worker's listener opens at startup (or after
/// losing one) takes a while, and what is committed meanwhile tells no one.
struct LateListener {
    inner: MemoryStore,
    may_listen: AtomicBool,
}

impl Store for LateListener {
    type Tx<'a> = <MemoryStore as Store>::Tx<'a>;

    fn transaction<R>(&self, f: impl FnOnce(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
        self.inner.transaction(f)
    }

    fn read<R>(&self, f: impl Fn(&mut Self::Tx<'_>) -> Result<R>) -> Result<R> {
        self.inner.read(f)
    }
}

impl Coordination for LateListener {
    fn shared(&self) -> bool {
        true
    }

    fn inline(&self) -> bool {
        false
    }

    fn connections(&self) -> usize {
        4
    }

    fn listen(
        &self,
        keep_going: &dyn Fn() -> bool,
        on_listening: &dyn Fn(),
        _on_change: &dyn Fn(Option<(RunId, Option<u32>)>),
    ) -> Result<()> {
        while keep_going() && !self.may_listen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        on_listening();
        while keep_going() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }
}

/// Keeps what the worker dispatched.
#[derive(Clone, Default)]
struct Dispatched(Arc<Mutex<Vec<AttemptTicket>>>);

impl BatchDispatcher for Dispatched {
    fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool {
        self.0.lock().unwrap().extend(tickets);
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_before_the_listener_listens_is_claimed_once_it_does() {
    let e = Arc::new(Engine::new(
        LateListener {
            inner: MemoryStore::new(),
            may_listen: AtomicBool::new(false),
        },
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    ));
    e.register(DefinitionSpec {
        job_type: "t".into(),
        pool: Some("a".into()),
        ..DefinitionSpec::default()
    })
    .unwrap();
    // A poll interval longer than the test: only a wake-up claims.
    let w = Worker::with_timings(
        e.clone(),
        vec![WorkerPool::new("a", 2)],
        WorkerTimings {
            poll_ms: 60_000,
            ..WorkerTimings::default()
        },
    );
    let dispatched = Dispatched::default();
    let looping = tokio::spawn(w.clone().run(dispatched.clone()));
    // The first claim finds nothing; the loop sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A start in another process, committed before this one listens: no
    // local wake-up (the worker is not told it is hungry here).
    e.set_worker_hungry(false);
    e.start(StartRequest {
        job_type: "t".into(),
        input: RawValue::from_string("{}".into()).unwrap(),
        ..StartRequest::default()
    })
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        dispatched.0.lock().unwrap().is_empty(),
        "nothing has told the worker of the run yet"
    );
    e.store().may_listen.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    while dispatched.0.lock().unwrap().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        dispatched.0.lock().unwrap().len(),
        1,
        "once listening, the worker looks for what it missed"
    );
    let t = dispatched.0.lock().unwrap()[0].clone();
    w.report(vec![(
        t.run.id,
        t.epoch,
        Some(AttemptOutcome::Completed(None)),
        0,
    )]);
    w.stop();
    tokio::time::timeout(Duration::from_secs(5), looping)
        .await
        .unwrap()
        .unwrap();
}
