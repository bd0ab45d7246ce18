//! Schedules (recurring starts) on the in-memory store, with a manual clock.

use jobforge_core::engine::JobRunQuery;
use jobforge_core::*;
use serde_json::value::RawValue;

fn engine(multi_tenant: bool) -> Engine<MemoryStore> {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant,
            clock: ClockKind::Manual,
            retention: Default::default(),
        },
    );
    e.register(DefinitionSpec {
        job_type: "report".to_owned(),
        pool: Some("cron".to_owned()),
        ..DefinitionSpec::default()
    })
    .unwrap();
    e
}

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn every(name: &str, ms: i64) -> ScheduleSpec {
    ScheduleSpec {
        name: name.to_owned(),
        tenant: TenantArg::Missing,
        job_type: "report".to_owned(),
        input: raw(r#"{"kind":"daily"}"#),
        cron: None,
        timezone: None,
        every_ms: Some(ms),
    }
}

fn cron(name: &str, expr: &str) -> ScheduleSpec {
    ScheduleSpec {
        cron: Some(expr.to_owned()),
        every_ms: None,
        ..every(name, 1)
    }
}

/// Runs started by schedules, oldest first.
fn scheduled_runs(e: &Engine<MemoryStore>, tenant: TenantArg) -> Vec<RunRow> {
    let q = JobRunQuery {
        limit: 500,
        ..JobRunQuery::default()
    };
    let (mut rows, _) = e.list_job_runs(&tenant, &q).unwrap();
    rows.retain(|r| r.trigger_source == TriggerSource::Schedule);
    rows.reverse();
    rows
}

fn all_runs(e: &Engine<MemoryStore>) -> Vec<RunRow> {
    scheduled_runs(e, TenantArg::Missing)
}

#[test]
fn an_interval_schedule_starts_one_run_per_fire_time_with_its_trigger_and_run_at() {
    let e = engine(false);
    let t0 = e.now();
    let s = e.put_schedule(every("nightly", 1_000)).unwrap();
    assert_eq!(s.next_fire_at, Some(t0 + 1_000));
    assert_eq!(e.fire_due_schedules().unwrap(), 0);
    e.advance_time(999);
    assert_eq!(e.fire_due_schedules().unwrap(), 0, "not due yet");
    e.advance_time(1);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    assert_eq!(
        e.fire_due_schedules().unwrap(),
        0,
        "an occurrence fires once"
    );
    let runs = all_runs(&e);
    assert_eq!(runs.len(), 1);
    let r = &runs[0];
    assert_eq!(&*r.job_type, "report");
    assert_eq!(&*r.pool, "cron");
    assert_eq!(r.input.get(), r#"{"kind":"daily"}"#);
    assert_eq!(r.trigger_ref(), Some("nightly"));
    assert_eq!(r.run_at, t0 + 1_000);
    assert_eq!(r.status, RunStatus::Pending);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(s.last_fired_at, Some(t0 + 1_000));
    assert_eq!(s.last_run_id, Some(r.id));
    assert_eq!(s.next_fire_at, Some(t0 + 2_000));
    assert_eq!(s.last_error, None);
}

#[test]
fn missed_fire_times_collapse_into_one_run_and_the_phase_is_kept() {
    let e = engine(false);
    let t0 = e.now();
    e.put_schedule(every("s", 1_000)).unwrap();
    e.advance_time(10_500);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let runs = all_runs(&e);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        runs[0].run_at,
        t0 + 1_000,
        "the first fire time that was due"
    );
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(
        s.next_fire_at,
        Some(t0 + 11_000),
        "the next multiple of the interval"
    );
}

#[test]
fn claim_next_fires_due_schedules_without_a_worker() {
    let e = engine(false);
    e.put_schedule(every("s", 60_000)).unwrap();
    assert!(e.claim_next("cron").unwrap().is_none());
    e.advance_time(60_000);
    let run = e.claim_next("cron").unwrap().expect("the scheduled run");
    assert_eq!(run.trigger_source, TriggerSource::Schedule);
    e.store().verify_indexes().unwrap();
}

#[test]
fn redeclaring_the_same_timing_keeps_the_next_fire_and_a_new_timing_resets_it() {
    let e = engine(false);
    let t0 = e.now();
    e.put_schedule(every("s", 1_000)).unwrap();
    e.advance_time(700);
    // The same timing (an app declaring its schedules at boot) keeps the phase.
    let s = e.put_schedule(every("s", 1_000)).unwrap();
    assert_eq!(s.next_fire_at, Some(t0 + 1_000));
    assert_eq!(s.created_at, t0);
    // A different input with the same timing also keeps it, and is used.
    let mut changed = every("s", 1_000);
    changed.input = raw(r#"{"kind":"weekly"}"#);
    let s = e.put_schedule(changed).unwrap();
    assert_eq!(s.next_fire_at, Some(t0 + 1_000));
    e.advance_time(300);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    assert_eq!(all_runs(&e)[0].input.get(), r#"{"kind":"weekly"}"#);
    // A new timing starts from now; what the schedule last did is kept.
    let s = e.put_schedule(every("s", 5_000)).unwrap();
    assert_eq!(s.next_fire_at, Some(t0 + 1_000 + 5_000));
    assert_eq!(s.created_at, t0);
    assert_eq!(s.last_fired_at, Some(t0 + 1_000));
    e.advance_time(4_999);
    assert_eq!(e.fire_due_schedules().unwrap(), 0);
    e.advance_time(1);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    assert_eq!(e.list_schedules(&TenantArg::Missing).unwrap().len(), 1);
}

#[test]
fn a_cron_schedule_fires_on_its_minutes_in_utc() {
    let e = engine(false);
    let t0 = e.now();
    let s = e.put_schedule(cron("q", "*/15 * * * *")).unwrap();
    let quarter = 15 * 60_000;
    let next = (t0 / quarter + 1) * quarter;
    assert_eq!(s.next_fire_at, Some(next));
    e.advance_time(next - t0);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(s.next_fire_at, Some(next + quarter));
    assert_eq!(all_runs(&e)[0].run_at, next);
}

#[test]
fn bad_schedules_are_refused_with_typed_errors_and_store_nothing() {
    let e = engine(false);
    e.register(DefinitionSpec {
        job_type: "fnkey".to_owned(),
        dedupe_key: Some("<fn>".to_owned()),
        dedupe_window_ms: Some(1_000),
        ..DefinitionSpec::default()
    })
    .unwrap();
    let code = |s: ScheduleSpec| e.put_schedule(s).unwrap_err().code();
    assert_eq!(code(cron("c", "61 * * * *")), "JOB_INPUT_INVALID");
    assert_eq!(code(cron("c", "* * *")), "JOB_INPUT_INVALID");
    assert_eq!(code(every("c", 0)), "JOB_INPUT_INVALID");
    assert_eq!(code(every("c", -5)), "JOB_INPUT_INVALID");
    assert_eq!(code(every("c", i64::MAX)), "JOB_INPUT_INVALID");
    let both = ScheduleSpec {
        cron: Some("* * * * *".to_owned()),
        ..every("c", 1_000)
    };
    assert_eq!(code(both), "JOB_INPUT_INVALID");
    let neither = ScheduleSpec {
        every_ms: None,
        ..every("c", 1_000)
    };
    assert_eq!(code(neither), "JOB_INPUT_INVALID");
    assert_eq!(code(every("", 1_000)), "JOB_INPUT_INVALID");
    assert_eq!(code(every(" padded", 1_000)), "JOB_INPUT_INVALID");
    assert_eq!(code(every(&"n".repeat(201), 1_000)), "JOB_INPUT_INVALID");
    let unknown = ScheduleSpec {
        job_type: "nope".to_owned(),
        ..every("c", 1_000)
    };
    assert_eq!(code(unknown), "JOB_TYPE_NOT_FOUND");
    let function_key = ScheduleSpec {
        job_type: "fnkey".to_owned(),
        ..every("c", 1_000)
    };
    assert_eq!(code(function_key), "JOB_KEY_FUNCTION_UNAVAILABLE");
    // A scope taken from the input by a JS function cannot be evaluated either.
    e.register(DefinitionSpec {
        job_type: "scoped".to_owned(),
        scope_entity_type: Some("customer".to_owned()),
        ..DefinitionSpec::default()
    })
    .unwrap();
    let scoped = ScheduleSpec {
        job_type: "scoped".to_owned(),
        ..every("c", 1_000)
    };
    let err = e.put_schedule(scoped).unwrap_err();
    assert_eq!(err.code(), "JOB_KEY_FUNCTION_UNAVAILABLE");
    assert!(err.to_string().contains("scope"), "{err}");
    let never = e
        .put_schedule(cron("c", "0 0 30 2 *"))
        .unwrap_err()
        .to_string();
    assert!(never.contains("never fires"), "{never}");
    let msg = e
        .put_schedule(cron("c", "*/0 * * * *"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("minute"), "the message names the field: {msg}");
    assert!(e.list_schedules(&TenantArg::Missing).unwrap().is_empty());
    assert_eq!(e.next_schedule_fire().unwrap(), None);
}

#[test]
fn a_key_the_input_cannot_fill_is_refused_when_the_schedule_is_put() {
    let e = engine(false);
    e.register(DefinitionSpec {
        job_type: "keyed".to_owned(),
        concurrency_key: Some("k:{{account}}".to_owned()),
        ..DefinitionSpec::default()
    })
    .unwrap();
    let err = e
        .put_schedule(ScheduleSpec {
            job_type: "keyed".to_owned(),
            input: raw("{}"),
            ..every("missing-field", 1_000)
        })
        .unwrap_err();
    assert_eq!(err.code(), "JOB_TEMPLATE_FIELD_MISSING");
    assert!(e.list_schedules(&TenantArg::Missing).unwrap().is_empty());
    e.put_schedule(ScheduleSpec {
        job_type: "keyed".to_owned(),
        input: raw(r#"{"account":"a1"}"#),
        ..every("filled", 1_000)
    })
    .unwrap();
}

#[test]
fn a_fire_the_rules_refuse_is_recorded_and_the_schedule_moves_on() {
    let e = engine(false);
    e.register(DefinitionSpec {
        job_type: "single".to_owned(),
        concurrency_key: Some("the-one".to_owned()),
        collision_mode: Some(CollisionMode::Reject),
        ..DefinitionSpec::default()
    })
    .unwrap();
    // The lane is held: the occurrence collides.
    let holder = e
        .start(StartRequest {
            job_type: "single".to_owned(),
            input: raw("{}"),
            ..StartRequest::default()
        })
        .unwrap();
    e.put_schedule(ScheduleSpec {
        job_type: "single".to_owned(),
        ..every("collides", 1_000)
    })
    .unwrap();
    e.advance_time(1_000);
    assert_eq!(e.fire_due_schedules().unwrap(), 0);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    let err = s.last_error.as_deref().expect("the refusal is recorded");
    assert!(err.contains(&holder.id.to_string()), "{err}");
    assert_eq!(s.last_run_id, None);
    assert_eq!(s.last_fired_at, Some(s.anchor + 1_000));
    assert_eq!(s.next_fire_at, Some(s.anchor + 2_000));
    assert!(all_runs(&e).is_empty());
    // The lane frees: the next occurrence starts and clears the error.
    e.cancel(&holder.id.to_string(), true, &TenantArg::Missing)
        .unwrap();
    e.advance_time(1_000);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(s.last_error, None);
    assert!(s.last_run_id.is_some());
}

#[test]
fn an_interval_past_the_largest_date_is_refused_and_names_are_counted_in_characters() {
    let e = engine(false);
    e.advance_time(8_640_000_000_000_000 - e.now() - 500);
    let err = e
        .put_schedule(every("late", 1_000))
        .unwrap_err()
        .to_string();
    assert!(err.contains("largest date"), "{err}");
    let e = engine(false);
    e.put_schedule(every(&"é".repeat(200), 1_000)).unwrap();
    assert_eq!(
        e.put_schedule(every(&"é".repeat(201), 1_000))
            .unwrap_err()
            .code(),
        "JOB_INPUT_INVALID"
    );
}

#[test]
fn a_dedupe_window_makes_an_occurrence_answer_with_the_existing_run() {
    let e = engine(false);
    e.register(DefinitionSpec {
        job_type: "once".to_owned(),
        dedupe_key: Some("once".to_owned()),
        dedupe_window_ms: Some(10_000),
        ..DefinitionSpec::default()
    })
    .unwrap();
    e.put_schedule(ScheduleSpec {
        job_type: "once".to_owned(),
        ..every("d", 1_000)
    })
    .unwrap();
    e.advance_time(1_000);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let first = e.list_schedules(&TenantArg::Missing).unwrap()[0].last_run_id;
    e.advance_time(1_000);
    assert_eq!(
        e.fire_due_schedules().unwrap(),
        0,
        "the dedupe hit creates nothing"
    );
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(s.last_run_id, first);
    assert_eq!(s.last_error, None);
    assert_eq!(all_runs(&e).len(), 1);
}

#[test]
fn removed_schedules_fire_no_more() {
    let e = engine(false);
    e.put_schedule(every("a", 1_000)).unwrap();
    e.put_schedule(every("b", 1_000)).unwrap();
    assert!(e.remove_schedule("a", &TenantArg::Missing).unwrap());
    assert!(!e.remove_schedule("a", &TenantArg::Missing).unwrap());
    e.advance_time(1_000);
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    assert_eq!(all_runs(&e)[0].trigger_ref(), Some("b"));
    let names: Vec<String> = e
        .list_schedules(&TenantArg::Missing)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["b"]);
}

#[test]
fn tenants_have_their_own_schedules_and_runs() {
    let e = engine(true);
    let of = |t: &str| TenantArg::Id(t.to_owned());
    let missing = e.put_schedule(every("s", 1_000)).unwrap_err();
    assert_eq!(missing.code(), "MISSING_TENANT_ID");
    assert_eq!(
        e.list_schedules(&TenantArg::Missing).unwrap_err().code(),
        "MISSING_TENANT_ID"
    );
    for t in ["acme", "globex"] {
        e.put_schedule(ScheduleSpec {
            tenant: of(t),
            ..every("s", 1_000)
        })
        .unwrap();
    }
    assert_eq!(e.list_schedules(&of("acme")).unwrap().len(), 1);
    assert!(e.list_schedules(&of("initech")).unwrap().is_empty());
    assert!(e.list_schedules(&TenantArg::Null).unwrap().is_empty());
    assert!(!e.remove_schedule("s", &of("initech")).unwrap());
    e.advance_time(1_000);
    assert_eq!(e.fire_due_schedules().unwrap(), 2);
    for t in ["acme", "globex"] {
        let runs = scheduled_runs(&e, of(t));
        assert_eq!(runs.len(), 1, "{t}");
        assert_eq!(runs[0].tenant_id.as_deref(), Some(t));
    }
    assert!(e.remove_schedule("s", &of("acme")).unwrap());
    assert_eq!(e.list_schedules(&of("globex")).unwrap().len(), 1);
}

/// Sends each dispatched batch to the test.
struct Channel(std::sync::mpsc::Sender<Vec<engine::AttemptTicket>>);

impl worker::BatchDispatcher for Channel {
    fn dispatch(&self, tickets: Vec<engine::AttemptTicket>) -> bool {
        self.0.send(tickets).is_ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_fires_a_schedule_on_time_even_with_every_slot_busy() {
    use std::sync::Arc;
    use std::time::Duration;
    let e = Arc::new(engine(false));
    // One slot, taken by a run that never finishes during the test.
    e.start(StartRequest {
        job_type: "report".to_owned(),
        input: raw("{}"),
        ..StartRequest::default()
    })
    .unwrap();
    let w = worker::Worker::new(e.clone(), vec![worker::WorkerPool::new("cron", 1)]);
    let (tx, rx) = std::sync::mpsc::channel();
    let loop_task = tokio::spawn(w.clone().run(Channel(tx)));
    let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].run.trigger_source, TriggerSource::Manual);

    // Created while the worker sleeps: it re-arms its timer for the schedule.
    let t0 = e.now();
    e.put_schedule(every("tick", 1_000)).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    e.advance_time(1_000);
    let mut fired = false;
    for _ in 0..200 {
        if !all_runs(&e).is_empty() {
            fired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        fired,
        "the worker fired the due schedule with its only slot busy"
    );
    let runs = all_runs(&e);
    assert_eq!(runs[0].run_at, t0 + 1_000);
    assert_eq!(runs[0].status, RunStatus::Pending, "no slot: it waits");

    // Its slot frees: the scheduled run is claimed through the report.
    let (next, err) = w.report(vec![(
        first[0].run.id,
        first[0].epoch,
        Some(AttemptOutcome::Completed(None)),
        0,
    )]);
    assert!(err.is_none());
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].run.trigger_ref(), Some("tick"));
    w.stop();
    tokio::time::timeout(Duration::from_secs(5), loop_task)
        .await
        .unwrap()
        .unwrap();
}

#[test]
fn a_cron_in_a_time_zone_follows_its_wall_clock_across_daylight_saving() {
    let e = engine(false);
    // 2030-03-30T12:00Z: Berlin springs forward on the 31st (02:00 → 03:00)
    // and falls back on 2030-10-27 (03:00 → 02:00).
    e.advance_time(1_901_102_400_000 - e.now());
    let berlin = |name: &str| ScheduleSpec {
        timezone: Some("Europe/Berlin".to_owned()),
        ..cron(name, "30 2 * * *")
    };
    let s = e.put_schedule(berlin("nightly")).unwrap();
    // 02:30 does not exist on the 31st: it fires at the end of the gap, 03:00 CEST.
    assert_eq!(s.next_fire_at, Some(1_901_149_200_000));
    e.advance_time(1_901_149_200_000 - e.now());
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(
        s.next_fire_at,
        Some(1_901_233_800_000),
        "02:30 CEST the next day"
    );
    // In October 02:30 happens twice: it fires once, at the first.
    e.advance_time(1_919_246_400_000 - e.now());
    assert_eq!(
        e.fire_due_schedules().unwrap(),
        1,
        "the missed days collapse"
    );
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(s.next_fire_at, Some(1_919_291_400_000));
    e.advance_time(1_919_291_400_000 - e.now());
    assert_eq!(e.fire_due_schedules().unwrap(), 1);
    let s = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(
        s.next_fire_at,
        Some(1_919_381_400_000),
        "not again at 02:30 CET"
    );
    // The same expression in another zone is another timing: it starts over.
    let moved = e
        .put_schedule(ScheduleSpec {
            timezone: Some("America/New_York".to_owned()),
            ..cron("nightly", "30 2 * * *")
        })
        .unwrap();
    assert_ne!(moved.next_fire_at, s.next_fire_at);
    // A zone that does not exist, or one given to an interval, is refused.
    let bad = ScheduleSpec {
        timezone: Some("Mars/Olympus_Mons".to_owned()),
        ..cron("x", "* * * * *")
    };
    let err = e.put_schedule(bad).unwrap_err();
    assert_eq!(err.code(), "JOB_INPUT_INVALID");
    assert!(err.to_string().contains("Mars/Olympus_Mons"), "{err}");
    let interval = ScheduleSpec {
        timezone: Some("UTC".to_owned()),
        ..every("y", 1_000)
    };
    assert_eq!(
        e.put_schedule(interval).unwrap_err().code(),
        "JOB_INPUT_INVALID"
    );
}
