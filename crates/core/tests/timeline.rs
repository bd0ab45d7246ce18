//! The run timeline, through the engine's Rust API, on both stores (the
//! PostgreSQL half needs a server, as `postgres.rs` says): what each
//! transition records, in order, with its attempt and data; keyset pages;
//! a cascade's cause; switching it off; events deleted with their run.

use jobforge_core::engine::Retention;
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::*;
use serde_json::value::RawValue;
use serde_json::Value;

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn opts(retention: Retention) -> EngineOptions {
    EngineOptions {
        multi_tenant: false,
        clock: ClockKind::Manual,
        retention,
    }
}

fn memory(retention: Retention) -> Engine<MemoryStore> {
    Engine::new(MemoryStore::new(), opts(retention))
}

fn pg(tag: &str, retention: Retention) -> Option<Engine<PgStore>> {
    let url = std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("jf_rs_tl_{tag}_{}", std::process::id());
    let mut cfg = PgConfig::new(url);
    cfg.schema = schema.clone();
    cfg.max_connections = 2;
    match postgres::Client::connect(&cfg.url, postgres::NoTls) {
        Ok(mut c) => c
            .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .unwrap(),
        Err(e) => {
            if std::env::var("JOBFORGE_REQUIRE_PG").is_ok_and(|v| v == "1") {
                panic!("JOBFORGE_REQUIRE_PG=1 but PostgreSQL is unreachable: {e}");
            }
            eprintln!("skipping postgres timeline test: no server ({e})");
            return None;
        }
    }
    let store = PgStore::new(cfg).unwrap();
    store.migrate().unwrap();
    Some(Engine::new(store, opts(retention)))
}

fn register<S: Store>(e: &Engine<S>, t: &str, attempts: u32) {
    e.register_all(vec![DefinitionSpec {
        job_type: t.to_owned(),
        retry: Some(RetryPolicy {
            attempts,
            base_ms: 1000,
            ..RetryPolicy::default()
        }),
        ..DefinitionSpec::default()
    }])
    .unwrap();
}

fn start<S: Store>(e: &Engine<S>, t: &str, parent: Option<RunId>) -> RunRow {
    e.start(StartRequest {
        job_type: t.to_owned(),
        input: raw("{}"),
        parent_run_id: parent.map(|p| p.to_string()),
        ..StartRequest::default()
    })
    .unwrap()
}

fn all_events<S: Store>(e: &Engine<S>, id: RunId) -> Vec<RunEvent> {
    e.list_run_events(&id.to_string(), &TenantArg::Missing, None, 1000)
        .unwrap()
        .0
}

fn summary(events: &[RunEvent]) -> Vec<(&'static str, u32)> {
    events
        .iter()
        .map(|e| (e.kind.as_str(), e.attempt))
        .collect()
}

/// The events' times never go back along the timeline.
fn assert_times_ordered(events: &[RunEvent]) {
    assert!(
        events.windows(2).all(|w| w[0].at <= w[1].at),
        "{:?}",
        events
            .iter()
            .map(|e| (e.kind.as_str(), e.at))
            .collect::<Vec<_>>()
    );
}

fn data(e: &RunEvent) -> Value {
    e.data
        .as_ref()
        .map_or(Value::Null, |d| serde_json::from_str(d.get()).unwrap())
}

fn failure(message: &str) -> AttemptOutcome {
    AttemptOutcome::Failed(FailureInfo {
        message: message.to_owned(),
        ..FailureInfo::default()
    })
}

/// A run that fails once (a step inside), is retried and completes.
fn a_retried_run_tells_its_life_in_order<S: Store>(e: &Engine<S>) {
    register(e, "t", 2);
    let run = start(e, "t", None);
    let id = run.id;
    let claim = e.claim_next("batch").unwrap().unwrap();
    e.step_begin(&id.to_string(), claim.claim_epoch, "fetch")
        .unwrap();
    e.step_complete(&id.to_string(), claim.claim_epoch, "fetch", Some(raw("1")))
        .unwrap();
    e.finish_attempt(&id, claim.claim_epoch, failure("boom"))
        .unwrap();
    e.clock().advance(1000);
    let claim = e.claim_next("batch").unwrap().unwrap();
    e.finish_attempt(&id, claim.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();

    let events = all_events(e, id);
    assert_eq!(
        summary(&events),
        vec![
            ("created", 0),
            ("started", 1),
            ("step_started", 1),
            ("step_completed", 1),
            ("retry_scheduled", 1),
            ("started", 2),
            ("completed", 2),
        ]
    );
    assert_eq!(data(&events[0])["trigger"], "manual");
    assert_eq!(events[0].at, run.created_at);
    assert_eq!(data(&events[2])["stepId"], "fetch");
    assert_eq!(data(&events[4])["delayMs"], 1000);
    assert_eq!(data(&events[4])["error"], "boom");
    assert!(events.windows(2).all(|w| w[0].at <= w[1].at));
    assert!(events.windows(2).all(|w| w[0].id < w[1].id));

    // Keyset pages of 3 read the same events, and the last has no cursor.
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = e
            .list_run_events(&id.to_string(), &TenantArg::Missing, cursor, 3)
            .unwrap();
        assert!(page.len() <= 3);
        paged.extend(page);
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(summary(&paged), summary(&events));

    // Replayed: the old events stay, a new life follows.
    e.replay(&id.to_string(), &TenantArg::Missing).unwrap();
    let events = all_events(e, id);
    let last = events.last().unwrap();
    assert_eq!((last.kind, last.attempt), (EventKind::Replayed, 1));
    assert_eq!(data(last)["was"], "completed");

    // An unknown run is not found, as `getRun`'s callers expect.
    let err = e
        .list_run_events(&RunId::new_v4().to_string(), &TenantArg::Missing, None, 10)
        .unwrap_err();
    assert!(matches!(err, JobError::JobRunNotFound { .. }), "{err:?}");
}

/// A failed parent cancels its child: the child's event names the parent.
fn a_cascade_names_its_cause<S: Store>(e: &Engine<S>) {
    register(e, "p", 1);
    register(e, "c", 1);
    let parent = start(e, "p", None);
    let claim = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(claim.id, parent.id);
    let child = start(e, "c", Some(parent.id));
    e.finish_attempt(&parent.id, claim.claim_epoch, failure("parent broke"))
        .unwrap();
    let p = all_events(e, parent.id);
    assert_eq!(
        summary(&p),
        vec![("created", 0), ("started", 1), ("failed", 1)]
    );
    assert_eq!(data(&p[2])["error"], "parent broke");
    let c = all_events(e, child.id);
    assert_eq!(summary(&c), vec![("created", 0), ("canceled", 1)]);
    assert_eq!(data(&c[0])["parentRunId"], parent.id.to_string());
    assert_eq!(data(&c[1])["reason"], "parent failed");
    assert_eq!(data(&c[1])["byRunId"], parent.id.to_string());

    // A requested cancel says so; with the timeline off nothing is added.
    let other = start(e, "c", None);
    e.set_timeline(false);
    let quiet = start(e, "c", None);
    e.cancel(&quiet.id.to_string(), true, &TenantArg::Missing)
        .unwrap();
    e.set_timeline(true);
    e.cancel(&other.id.to_string(), true, &TenantArg::Missing)
        .unwrap();
    let o = all_events(e, other.id);
    assert_eq!(data(&o[1])["reason"], "requested");
    assert_eq!(summary(&all_events(e, quiet.id)), vec![("created", 0)]);
}

/// Retention deletes a run's events with it.
fn events_go_with_their_run<S: Store>(e: &Engine<S>) -> RunId {
    register(e, "t", 1);
    let run = start(e, "t", None);
    let claim = e.claim_next("batch").unwrap().unwrap();
    e.finish_attempt(&run.id, claim.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    assert_eq!(all_events(e, run.id).len(), 3);
    e.clock().advance(60_000);
    // Any write purges what is past retention.
    start(e, "t", None);
    assert!(e
        .list_run_events(&run.id.to_string(), &TenantArg::Missing, None, 10)
        .is_err());
    run.id
}

/// Runs that ended per minute: two in one minute, one failed two minutes
/// later; the window names only the minutes asked for.
fn ends_are_counted_per_minute<S: Store>(e: &Engine<S>) {
    register(e, "m", 1);
    // Start at a minute boundary, so the runs end in known minutes.
    let now = e.now();
    e.clock().advance(60_000 - now.rem_euclid(60_000));
    let minute0 = e.now();
    for _ in 0..2 {
        let run = start(e, "m", None);
        let c = e.claim_next("batch").unwrap().unwrap();
        assert_eq!(c.id, run.id);
        e.finish_attempt(&run.id, c.claim_epoch, AttemptOutcome::Completed(None))
            .unwrap();
    }
    // A start_many refused after it replaced a lane's run changed nothing:
    // no end is counted for the run it put back.
    e.register_all(vec![DefinitionSpec {
        job_type: "lane".to_owned(),
        pool: Some("lanes".to_owned()),
        concurrency_key: Some("k".to_owned()),
        collision_mode: Some(CollisionMode::Replace),
        ..DefinitionSpec::default()
    }])
    .unwrap();
    let incumbent = start(e, "lane", None);
    let req = |t: &str| StartRequest {
        job_type: t.to_owned(),
        input: raw("{}"),
        ..StartRequest::default()
    };
    assert!(e
        .start_many(vec![req("lane"), req("no such type")])
        .is_err());
    let still = e
        .find_by_id(&incumbent.id.to_string(), &TenantArg::Missing)
        .unwrap();
    assert_eq!(still.map(|r| r.status), Some(RunStatus::Pending));
    e.clock().advance(120_000);
    let run = start(e, "m", None);
    let c = e.claim_next("batch").unwrap().unwrap();
    e.finish_attempt(&run.id, c.claim_epoch, failure("late"))
        .unwrap();
    let (since, got) = e.ended_per_minute(&TenantArg::Missing, 60).unwrap();
    // The window the engine read: 60 minutes ending with the current one.
    assert_eq!(since, minute0 + 120_000 - 59 * 60_000);
    assert_eq!(
        got,
        vec![
            (minute0, RunStatus::Completed, 2),
            (minute0 + 120_000, RunStatus::Failed, 1),
        ]
    );
    // The last minute only.
    assert_eq!(
        e.ended_per_minute(&TenantArg::Missing, 1).unwrap(),
        (
            minute0 + 120_000,
            vec![(minute0 + 120_000, RunStatus::Failed, 1)]
        )
    );
}

const KEEP_A_SECOND: Retention = Retention {
    completed_ms: Some(1000),
    failed_ms: Some(1000),
};

/// A parent's failure stored after its handler ended (a networked worker
/// reports later): the child it cancels went on meanwhile (began a step),
/// and its `canceled` event and `finishedAt` come after that, not at the
/// parent's handler end (the child's timeline went back in time).
fn a_cascade_stored_late_keeps_the_childs_times_ordered<S: Store>(e: &Engine<S>) {
    register(e, "p", 1);
    register(e, "c", 1);
    let parent = start(e, "p", None);
    let p = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(p.id, parent.id);
    let child = start(e, "c", Some(parent.id));
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, child.id);
    let handler_ended = e.now();
    e.clock().advance(300);
    e.step_begin(&child.id.to_string(), c.claim_epoch, "late")
        .unwrap();
    e.clock().advance(50);
    e.settle(
        vec![AttemptEnd {
            id: parent.id,
            epoch: p.claim_epoch,
            outcome: Some(failure("parent failed")),
            ended_at: Some(handler_ended),
        }],
        &[],
    )
    .unwrap();
    let parent_row = e
        .find_by_id(&parent.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(
        parent_row.finished_at.get(),
        Some(handler_ended),
        "the parent ended with its handler"
    );
    let events = all_events(e, child.id);
    assert_eq!(
        summary(&events),
        vec![
            ("created", 0),
            ("started", 1),
            ("step_started", 1),
            ("canceled", 1)
        ]
    );
    assert_times_ordered(&events);
    let row = e
        .find_by_id(&child.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(row.status, RunStatus::Canceled);
    assert!(row.finished_at.get() >= Some(events[2].at));
}

/// A child's end stored after its handler ended, while its parent parked
/// on it in between: the parent's `resumed` comes after its `waiting`.
fn a_childs_late_stored_end_resumes_its_parent_after_it_parked<S: Store>(e: &Engine<S>) {
    use jobforge_core::engine::{WaitBegin, WaitRequest};
    register(e, "inv", 1);
    register(e, "kid", 1);
    let parent = start(e, "inv", None);
    let p = e.claim_next("batch").unwrap().unwrap();
    let begin = e
        .wait_begin(
            &parent.id.to_string(),
            p.claim_epoch,
            "k",
            WaitRequest::Child {
                start: Box::new(StartRequest {
                    job_type: "kid".to_owned(),
                    input: raw("{}"),
                    ..StartRequest::default()
                }),
                timeout_ms: None,
            },
        )
        .unwrap();
    assert!(matches!(begin, WaitBegin::Open), "{begin:?}");
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.job_type.as_ref() as &str, "kid");
    let kid_ended = e.now();
    e.clock().advance(300);
    e.finish_attempt(&parent.id, p.claim_epoch, AttemptOutcome::Parked)
        .unwrap();
    e.clock().advance(50);
    e.settle(
        vec![AttemptEnd {
            id: c.id,
            epoch: c.claim_epoch,
            outcome: Some(AttemptOutcome::Completed(Some(raw("1")))),
            ended_at: Some(kid_ended),
        }],
        &[],
    )
    .unwrap();
    let events = all_events(e, parent.id);
    assert_eq!(
        summary(&events),
        vec![
            ("created", 0),
            ("started", 1),
            ("waiting", 1),
            ("resumed", 1)
        ]
    );
    assert_times_ordered(&events);
}

/// A step still running when its attempt ended (a sibling failed the run,
/// or it was canceled) records nothing when it then fails, as when it
/// returns: its failure used to land after the run's end, in its row and
/// timeline.
fn a_step_failing_after_its_attempt_ended_records_nothing<S: Store>(e: &Engine<S>) {
    register(e, "late", 1);
    for cancel in [false, true] {
        let run = start(e, "late", None);
        let c = e.claim_next("batch").unwrap().unwrap();
        assert_eq!(c.id, run.id);
        let id = run.id.to_string();
        e.step_begin(&id, c.claim_epoch, "slow").unwrap();
        if cancel {
            e.cancel(&id, true, &TenantArg::Missing).unwrap();
        } else {
            e.finish_attempt(&run.id, c.claim_epoch, failure("sibling failed"))
                .unwrap();
        }
        let before = all_events(e, run.id);
        e.clock().advance(100);
        let retry = e
            .step_fail(
                &id,
                c.claim_epoch,
                "slow",
                FailureInfo {
                    message: "late".into(),
                    ..FailureInfo::default()
                },
                None,
            )
            .unwrap();
        assert_eq!(retry, None);
        assert_eq!(
            summary(&all_events(e, run.id)),
            summary(&before),
            "cancel: {cancel}"
        );
        let step = e
            .find_step(&TenantArg::Missing, &id, "slow")
            .unwrap()
            .unwrap();
        assert_eq!(
            step.status,
            StepStatus::Running,
            "as a late success leaves it"
        );
        assert!(step.error.is_none());
    }
}

#[test]
fn memory_timeline() {
    a_retried_run_tells_its_life_in_order(&memory(Retention::default()));
    a_cascade_names_its_cause(&memory(Retention::default()));
    a_cascade_stored_late_keeps_the_childs_times_ordered(&memory(Retention::default()));
    a_childs_late_stored_end_resumes_its_parent_after_it_parked(&memory(Retention::default()));
    a_step_failing_after_its_attempt_ended_records_nothing(&memory(Retention::default()));
    ends_are_counted_per_minute(&memory(Retention::default()));
    let e = memory(KEEP_A_SECOND);
    events_go_with_their_run(&e);
    e.store().verify_indexes().unwrap();
}

#[test]
fn postgres_timeline() {
    let Some(e) = pg("life", Retention::default()) else {
        return;
    };
    a_retried_run_tells_its_life_in_order(&e);
    let Some(e) = pg("cascade", Retention::default()) else {
        return;
    };
    a_cascade_names_its_cause(&e);
    let Some(e) = pg("late", Retention::default()) else {
        return;
    };
    a_cascade_stored_late_keeps_the_childs_times_ordered(&e);
    let Some(e) = pg("lateresume", Retention::default()) else {
        return;
    };
    a_childs_late_stored_end_resumes_its_parent_after_it_parked(&e);
    let Some(e) = pg("latestep", Retention::default()) else {
        return;
    };
    a_step_failing_after_its_attempt_ended_records_nothing(&e);
    let Some(e) = pg("minutes", Retention::default()) else {
        return;
    };
    ends_are_counted_per_minute(&e);
    let Some(e) = pg("purge", KEEP_A_SECOND) else {
        return;
    };
    let gone = events_go_with_their_run(&e);
    // Gone from the table, not only hidden behind the missing run.
    let url = std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let schema = format!("jf_rs_tl_purge_{}", std::process::id());
    let n: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".job_event WHERE run_id = $1"),
            &[&gone],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
    let all: i64 = c
        .query_one(&format!("SELECT count(*) FROM \"{schema}\".job_event"), &[])
        .unwrap()
        .get(0);
    assert_eq!(all, 0, "the only other run has no stored event yet");
}
