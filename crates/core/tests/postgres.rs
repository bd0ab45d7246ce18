//! The engine over the PostgreSQL store. Needs a server: `JOBFORGE_PG_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`). Without one the
//! tests print why and pass, unless `JOBFORGE_REQUIRE_PG=1` (CI) makes a
//! missing server a failure. Each test works in its own schema.

use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::*;
use serde_json::value::RawValue;
use std::sync::Arc;

fn url() -> String {
    std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh schema and an engine on it, or None (skip) without a server.
fn engine(tag: &str) -> Option<(Engine<PgStore>, PgConfig)> {
    let schema = format!("jf_rs_{tag}_{}", std::process::id());
    let mut cfg = PgConfig::new(url());
    cfg.schema = schema.clone();
    cfg.max_connections = 4;
    match postgres::Client::connect(&cfg.url, postgres::NoTls) {
        Ok(mut c) => {
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .unwrap();
        }
        Err(e) => {
            if std::env::var("JOBFORGE_REQUIRE_PG").is_ok_and(|v| v == "1") {
                panic!("JOBFORGE_REQUIRE_PG=1 but PostgreSQL is unreachable: {e}");
            }
            eprintln!("skipping postgres test: no server at JOBFORGE_PG_URL ({e})");
            return None;
        }
    }
    Some((engine_on(&cfg), cfg))
}

fn engine_on(cfg: &PgConfig) -> Engine<PgStore> {
    let store = PgStore::new(cfg.clone()).unwrap();
    store.migrate().unwrap();
    Engine::new(
        store,
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    )
}

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn req(t: &str, input: &str) -> StartRequest {
    StartRequest {
        job_type: t.to_owned(),
        input: raw(input),
        ..StartRequest::default()
    }
}

fn spec(t: &str) -> DefinitionSpec {
    DefinitionSpec {
        job_type: t.to_owned(),
        ..DefinitionSpec::default()
    }
}

#[test]
fn start_claim_complete_roundtrip() {
    let Some((e, _)) = engine("rt") else { return };
    // Migrating twice is harmless.
    e.store().migrate().unwrap();
    e.register(spec("a")).unwrap();
    let run = e.start(req("a", r#"{"x":1,"s":"é"}"#)).unwrap();
    let back = e
        .find_by_id(&run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(
        back.to_json(),
        run.to_json()
            .replace(r#"{"x":1,"s":"é"}"#, r#"{"s": "é", "x": 1}"#)
    );
    let claimed = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(claimed.id, run.id);
    assert_eq!(claimed.status, RunStatus::Running);
    assert!(e.claim_next("batch").unwrap().is_none());
    let done = e
        .finish_attempt(
            &run.id,
            claimed.claim_epoch,
            AttemptOutcome::Completed(Some(raw(r#"{"ok":true}"#))),
        )
        .unwrap()
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.attempts, 1);
    let back = e
        .find_by_id(&run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(back.status, RunStatus::Completed);
    assert_eq!(back.output().unwrap().get(), r#"{"ok": true}"#);
    assert_eq!(back.finished_at, done.finished_at);
}

#[test]
fn lanes_hold_across_engines() {
    let Some((a, cfg)) = engine("lane") else {
        return;
    };
    let b = engine_on(&cfg);
    let lane = DefinitionSpec {
        concurrency_key: Some("k:{{k}}".to_owned()),
        ..spec("l")
    };
    a.register(lane.clone()).unwrap();
    b.register(lane).unwrap();
    let r1 = a.start(req("l", r#"{"k":1}"#)).unwrap();
    let r2 = b.start(req("l", r#"{"k":1}"#)).unwrap();
    let c1 = b.claim_next("batch").unwrap().unwrap();
    assert_eq!(c1.id, r1.id, "the lane head first, whoever claims");
    assert!(
        a.claim_next("batch").unwrap().is_none(),
        "one running per lane"
    );
    b.finish_attempt(&c1.id, c1.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    let c2 = a.claim_next("batch").unwrap().unwrap();
    assert_eq!(c2.id, r2.id);
}

#[test]
fn dedupe_and_reject_are_race_free() {
    let Some((a, cfg)) = engine("race") else {
        return;
    };
    let defs = [
        DefinitionSpec {
            dedupe_key: Some("d:{{k}}".to_owned()),
            dedupe_window_ms: Some(60_000),
            ..spec("d")
        },
        DefinitionSpec {
            concurrency_key: Some("r:{{k}}".to_owned()),
            collision_mode: Some(CollisionMode::Reject),
            ..spec("r")
        },
    ];
    a.register_all(defs.to_vec()).unwrap();
    let engines: Vec<Arc<Engine<PgStore>>> = (0..4)
        .map(|_| {
            let e = engine_on(&cfg);
            e.register_all(defs.to_vec()).unwrap();
            Arc::new(e)
        })
        .collect();
    for round in 0..10 {
        let input = format!(r#"{{"k":{round}}}"#);
        let barrier = Arc::new(std::sync::Barrier::new(engines.len()));
        let handles: Vec<_> = engines
            .iter()
            .map(|e| {
                let (e, b, input) = (e.clone(), barrier.clone(), input.clone());
                std::thread::spawn(move || {
                    b.wait();
                    let d = e.start(req("d", &input)).unwrap().id;
                    let r = e.start(req("r", &input));
                    (d, r.map(|r| r.id).map_err(|e| e.code()))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let first = results[0].0;
        assert!(results.iter().all(|r| r.0 == first), "one dedupe run");
        let ok = results.iter().filter(|r| r.1.is_ok()).count();
        let rejected = results
            .iter()
            .filter(|r| r.1 == Err("JOB_COLLISION"))
            .count();
        assert_eq!((ok, rejected), (1, engines.len() - 1));
    }
}

#[test]
fn batch_settle_claims_and_finishes_in_one_transaction() {
    let Some((e, _)) = engine("settle") else {
        return;
    };
    e.register(spec("s")).unwrap();
    for i in 0..50 {
        e.start(req("s", &format!(r#"{{"i":{i}}}"#))).unwrap();
    }
    let pool: Arc<str> = Arc::from("batch");
    let Settled { tickets: first, .. } = e.settle(Vec::new(), &[(pool.clone(), 20)]).unwrap();
    assert_eq!(first.len(), 20);
    let ended = e.now();
    let finished: Vec<_> = first
        .iter()
        .map(|t| AttemptEnd {
            id: t.run.id,
            epoch: t.epoch,
            outcome: Some(AttemptOutcome::Completed(None)),
            ended_at: Some(ended),
        })
        .collect();
    // The outcomes reach the database later than the handlers ended.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let Settled {
        applied,
        tickets: next,
    } = e.settle(finished, &[(pool.clone(), 40)]).unwrap();
    assert_eq!(applied, 20);
    assert_eq!(next.len(), 30);
    let row = e
        .find_by_id(&first[0].run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(
        row.finished_at.get(),
        Some(ended),
        "finished when the handler ended"
    );
    assert_eq!(row.updated_at, ended);
    let counts = e.count_by_pool_and_status(&TenantArg::Missing).unwrap();
    let get = |s: RunStatus| counts.iter().find(|c| c.1 == s).map_or(0, |c| c.2);
    assert_eq!(get(RunStatus::Completed), 20);
    assert_eq!(get(RunStatus::Running), 30);
}

/// A database made by the TypeScript system (seed columns only, a run
/// already in it) is upgraded in place by `migrate` and its runs work.
#[test]
fn migrate_upgrades_a_seed_shaped_database() {
    let Some((_, cfg)) = engine("seed") else {
        return;
    };
    let s = format!("\"{}\"", cfg.schema);
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "DROP SCHEMA {s} CASCADE; CREATE SCHEMA {s};
         CREATE TABLE {s}.job (type text PRIMARY KEY, version integer NOT NULL DEFAULT 1,
           pool text NOT NULL DEFAULT 'batch', scope_entity_type text, retry_policy jsonb NOT NULL,
           timeout_ms integer, concurrency_key_template text, collision_mode text NOT NULL DEFAULT 'queue',
           dedupe_key_template text, dedupe_window_ms integer, priority_default integer NOT NULL DEFAULT 0,
           replay_from text NOT NULL DEFAULT 'last_checkpoint', created_at timestamptz NOT NULL DEFAULT now(),
           updated_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE {s}.job_run (id uuid PRIMARY KEY, job_type text NOT NULL, job_version integer NOT NULL,
           parent_run_id uuid, root_run_id uuid NOT NULL, parent_close_policy text NOT NULL,
           scope_entity_type text, scope_entity_id text, tenant_id text, tags jsonb NOT NULL DEFAULT '{{}}',
           pool text NOT NULL, priority integer NOT NULL DEFAULT 0, concurrency_key text, dedupe_key text,
           status text NOT NULL, input jsonb NOT NULL, output jsonb, error jsonb,
           trigger_source text NOT NULL, trigger_ref text, run_at timestamptz NOT NULL,
           started_at timestamptz, finished_at timestamptz, claimed_at timestamptz,
           attempts integer NOT NULL DEFAULT 0, wait_kind text, resume_token text,
           wait_deadline timestamptz, created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL);
         CREATE TABLE {s}.job_step (id uuid PRIMARY KEY, job_run_id uuid NOT NULL, step_id text NOT NULL,
           kind text NOT NULL, seq integer NOT NULL, status text NOT NULL, input jsonb, output jsonb,
           error jsonb, attempts integer NOT NULL DEFAULT 0, started_at timestamptz, finished_at timestamptz);
         INSERT INTO {s}.job (type, retry_policy) VALUES ('legacy', '{{\"attempts\":1,\"backoff\":\"fixed\",\"baseMs\":0}}');
         INSERT INTO {s}.job_run (id, job_type, job_version, root_run_id, parent_close_policy, pool, status,
           input, trigger_source, run_at, created_at, updated_at)
         VALUES ('11111111-1111-4111-8111-111111111111', 'legacy', 1, '11111111-1111-4111-8111-111111111111',
           'terminate', 'batch', 'pending', '{{\"from\":\"ts\"}}', 'manual', now() - interval '1 minute',
           now() - interval '1 minute', now() - interval '1 minute');"
    ))
    .unwrap();
    let e = engine_on(&cfg); // migrates
    e.store().migrate().unwrap();
    // The old definition is read from the table; its run is claimable.
    assert!(e.definition("legacy").is_some());
    let claimed = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(
        claimed.id.to_string(),
        "11111111-1111-4111-8111-111111111111"
    );
    assert_eq!(claimed.input.get(), r#"{"from": "ts"}"#);
    let done = e
        .finish_attempt(
            &claimed.id,
            claimed.claim_epoch,
            AttemptOutcome::Completed(None),
        )
        .unwrap()
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    // New runs after the old one still order after it.
    e.register(spec("legacy")).unwrap();
    let fresh = e.start(req("legacy", "{}")).unwrap();
    assert!(fresh.seq > claimed.seq);
}

/// What `jsonb` refuses, found before the database does (no server needed).
#[test]
fn jsonb_problem_finds_nul_and_lone_surrogates_only() {
    use jobforge_core::store::postgres::jsonb_problem;
    let ok = [
        r#"{"a":"plain"}"#,
        r#"{"a":"\u0001\u001f\u00e9\u20ac"}"#,
        r#"{"pair":"\ud83d\ude00","after":"x"}"#,
        r#"{"escaped backslash then u0000":"\\u0000"}"#,
        r#"{"quote":"\"\\\/\b\f\n\r\t"}"#,
        r#"["\ud800\udc00",1,true,null]"#,
    ];
    for text in ok {
        assert_eq!(jsonb_problem(text), None, "{text}");
    }
    let nul = [r#"{"a":"x\u0000y"}"#, r#"["\u0000"]"#, r#"{"\u0000":1}"#];
    for text in nul {
        assert!(
            jsonb_problem(text).is_some_and(|p| p.contains("NUL")),
            "{text}"
        );
    }
    let lone = [
        r#"{"a":"\ud800"}"#,
        r#"{"a":"\ud800x"}"#,
        r#"{"a":"\udc00"}"#,
        r#"{"a":"\ud800\ud800"}"#,
        r#"{"a":"\ud800\n"}"#,
        r#"["\ude00\ud83d"]"#,
    ];
    for text in lone {
        assert!(
            jsonb_problem(text).is_some_and(|p| p.contains("surrogate")),
            "{text}"
        );
    }
}

/// Holds `FOR UPDATE` locks on `ids` from another connection until told to
/// let go (or 10 s pass), as a concurrent cancel or settle does.
fn hold_row_locks(cfg: &PgConfig, ids: Vec<RunId>) -> std::sync::mpsc::Sender<()> {
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (url, schema) = (cfg.url.clone(), cfg.schema.clone());
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.execute(
            &format!("SELECT 1 FROM \"{schema}\".job_run WHERE id = ANY($1) FOR UPDATE"),
            &[&ids],
        )
        .unwrap();
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv_timeout(std::time::Duration::from_secs(10));
        tx.commit().unwrap();
    });
    locked_rx.recv().unwrap();
    release_tx
}

/// The lease renewal and the retention purge sweep many rows and need none
/// in particular: they must skip a row another transaction holds instead of
/// waiting for it. Waiting made them close deadlock cycles: the heartbeat
/// with its own process's settle (both lock the same finished runs, in
/// different orders), the purge with cancels and settles that lock terminal
/// rows before purging themselves.
#[test]
fn lease_renewal_and_purge_skip_rows_locked_elsewhere() {
    let Some((_, cfg)) = engine("skiplocked") else {
        return;
    };
    let store = PgStore::new(cfg.clone()).unwrap();
    let e = Engine::new(
        store,
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: jobforge_core::engine::Retention {
                completed_ms: Some(1),
                failed_ms: None,
            },
        },
    );
    e.register(spec("a")).unwrap();
    e.register(DefinitionSpec {
        dedupe_key: Some("d:{{k}}".to_owned()),
        dedupe_window_ms: Some(60_000),
        ..spec("d")
    })
    .unwrap();
    let running = e.start(req("a", "{}")).unwrap();
    let claimed = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(claimed.id, running.id);
    let done = e.start(req("d", r#"{"k":1}"#)).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, done.id);
    e.finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5)); // past its 1 ms retention
    let release = hold_row_locks(&cfg, vec![running.id, done.id]);
    let quick = std::time::Duration::from_secs(3);

    let t = std::time::Instant::now();
    let renewed = e
        .store()
        .heartbeat(&[(running.id, claimed.claim_epoch)], e.now())
        .unwrap();
    assert!(
        t.elapsed() < quick,
        "the heartbeat waited {:?}",
        t.elapsed()
    );
    assert_eq!(renewed, 0, "a locked row is left for the next beat");

    // A start purges first: the completed run is held, so it stays for now,
    // and the dedupe must not answer with it (it is past its retention).
    let t = std::time::Instant::now();
    let again = e.start(req("d", r#"{"k":1}"#)).unwrap();
    assert!(t.elapsed() < quick, "the purge waited {:?}", t.elapsed());
    assert_ne!(
        again.id, done.id,
        "dedupe answered with a run past its retention"
    );
    let id = done.id.to_string();
    assert!(e.find_by_id(&id, &TenantArg::Missing).unwrap().is_some());

    release.send(()).unwrap();
    // Released: the next beat renews, the next write purges.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while e
        .store()
        .heartbeat(&[(running.id, claimed.claim_epoch)], e.now())
        .unwrap()
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "never renewed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    e.start(req("a", "{}")).unwrap();
    assert!(e.find_by_id(&id, &TenantArg::Missing).unwrap().is_none());
}

/// A cancel that stops more running runs than a select list can hold
/// (1,664 entries) still sends every run's stop notification and the
/// wake-up: each goes in its own statement.
#[test]
fn a_cancel_stopping_thousands_of_running_runs_notifies_each_of_them() {
    let Some((e, cfg)) = engine("bigcancel") else {
        return;
    };
    e.register(spec("big")).unwrap();
    const N: usize = 1_700;
    for _ in 0..N {
        let mut r = req("big", "{}");
        r.scope = Some(("batch".to_owned(), "b1".to_owned()));
        e.start(r).unwrap();
    }
    for _ in 0..N {
        e.claim_next("batch")
            .unwrap()
            .expect("a pending run to claim");
    }
    let mut listener = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    listener
        .batch_execute(&format!("LISTEN \"jobforge_{}\"", cfg.schema))
        .unwrap();
    let canceled = e
        .cancel_for_scope(&TenantArg::Missing, "batch", "b1", true)
        .unwrap();
    assert_eq!(canceled as usize, N);
    let mut stops = std::collections::HashSet::new();
    let mut notes = listener.notifications();
    let mut it = notes.timeout_iter(std::time::Duration::from_secs(2));
    while let Some(n) = postgres::fallible_iterator::FallibleIterator::next(&mut it).unwrap() {
        if let Some(rest) = n.payload().strip_prefix("c:") {
            stops.insert(rest.to_owned());
        }
        if stops.len() == N {
            break;
        }
    }
    assert_eq!(stops.len(), N, "stop notifications received");
}

fn every_spec(name: &str, tenant: TenantArg, ms: i64) -> ScheduleSpec {
    ScheduleSpec {
        name: name.to_owned(),
        tenant,
        job_type: "tick".to_owned(),
        input: raw(r#"{"n":1}"#),
        cron: None,
        timezone: None,
        every_ms: Some(ms),
    }
}

#[test]
fn schedules_are_stored_per_tenant_and_read_back_as_written() {
    let Some((e, _)) = engine("sched") else {
        return;
    };
    e.register(spec("tick")).unwrap();
    let c = e
        .put_schedule(ScheduleSpec {
            cron: Some("0 9 * * MON-FRI".to_owned()),
            every_ms: None,
            ..every_spec("weekdays", TenantArg::Missing, 1)
        })
        .unwrap();
    let i = e
        .put_schedule(every_spec("often", TenantArg::Missing, 60_000))
        .unwrap();
    let listed = e.list_schedules(&TenantArg::Missing).unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["often", "weekdays"]);
    for (stored, put) in listed.iter().zip([&i, &c]) {
        assert_eq!(stored.timing, put.timing);
        assert_eq!(stored.next_fire_at, put.next_fire_at);
        assert_eq!(stored.anchor, put.anchor);
        assert_eq!(stored.created_at, put.created_at);
        assert_eq!(stored.input.get(), r#"{"n": 1}"#);
    }
    assert_eq!(e.next_schedule_fire().unwrap(), i.next_fire_at);
    // Re-declaring the same timing keeps the next fire (an app at boot).
    let again = e
        .put_schedule(every_spec("often", TenantArg::Missing, 60_000))
        .unwrap();
    assert_eq!(again.next_fire_at, i.next_fire_at);
    assert_eq!(e.list_schedules(&TenantArg::Missing).unwrap().len(), 2);
    // A refused one stores nothing.
    let bad = e.put_schedule(ScheduleSpec {
        job_type: "nope".to_owned(),
        ..every_spec("bad", TenantArg::Missing, 1_000)
    });
    assert_eq!(bad.unwrap_err().code(), "JOB_TYPE_NOT_FOUND");
    assert!(e.remove_schedule("often", &TenantArg::Missing).unwrap());
    assert!(!e.remove_schedule("often", &TenantArg::Missing).unwrap());
    let names: Vec<String> = e
        .list_schedules(&TenantArg::Missing)
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["weekdays"]);
}

#[test]
fn tenant_schedules_with_one_name_are_distinct_rows() {
    let Some((_, cfg)) = engine("schedt") else {
        return;
    };
    let store = PgStore::new(cfg.clone()).unwrap();
    let e = Engine::new(
        store,
        EngineOptions {
            multi_tenant: true,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    );
    e.register(spec("tick")).unwrap();
    for t in [
        TenantArg::Null,
        TenantArg::Id("a".into()),
        TenantArg::Id("b".into()),
    ] {
        e.put_schedule(every_spec("same", t, 60_000)).unwrap();
    }
    for t in [
        TenantArg::Null,
        TenantArg::Id("a".into()),
        TenantArg::Id("b".into()),
    ] {
        let rows = e.list_schedules(&t).unwrap();
        assert_eq!(rows.len(), 1);
        let want = match &t {
            TenantArg::Id(x) => Some(x.as_str()),
            _ => None,
        };
        assert_eq!(rows[0].tenant_id.as_deref(), want);
    }
    assert!(e
        .remove_schedule("same", &TenantArg::Id("a".into()))
        .unwrap());
    assert_eq!(e.list_schedules(&TenantArg::Null).unwrap().len(), 1);
    assert_eq!(
        e.list_schedules(&TenantArg::Id("b".into())).unwrap().len(),
        1
    );
}

#[test]
fn processes_firing_the_same_schedules_at_once_start_each_occurrence_once() {
    let Some((first, cfg)) = engine("schedrace") else {
        return;
    };
    first.register(spec("tick")).unwrap();
    for k in 0..3 {
        first
            .put_schedule(every_spec(&format!("s{k}"), TenantArg::Missing, 20))
            .unwrap();
    }
    // Two more "processes" on the same database; four threads each fire
    // whatever is due as fast as they can for a second.
    let engines: Vec<Arc<Engine<PgStore>>> = vec![
        Arc::new(first),
        Arc::new(engine_on(&cfg)),
        Arc::new(engine_on(&cfg)),
    ];
    let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let e = engines[i % engines.len()].clone();
            std::thread::spawn(move || {
                let mut created = 0;
                while std::time::Instant::now() < until {
                    created += e.fire_due_schedules().unwrap();
                }
                created
            })
        })
        .collect();
    let created: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let e = &engines[0];
    let (runs, _) = e
        .list_job_runs(
            &TenantArg::Missing,
            &jobforge_core::engine::JobRunQuery {
                limit: 500,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(runs.len(), created, "every run counted once");
    assert!(
        created >= 3 * 10,
        "about 50 occurrences each in a second, got {created}"
    );
    let mut occurrences = std::collections::HashSet::new();
    for r in &runs {
        assert_eq!(r.trigger_source, TriggerSource::Schedule);
        let key = (r.trigger_ref().unwrap().to_owned(), r.run_at);
        assert!(
            occurrences.insert(key.clone()),
            "occurrence {key:?} started twice"
        );
    }
    for s in e.list_schedules(&TenantArg::Missing).unwrap() {
        let last = runs
            .iter()
            .filter(|r| r.trigger_ref() == Some(s.name.as_str()))
            .map(|r| r.run_at)
            .max();
        assert_eq!(s.last_fired_at, last, "{}", s.name);
        assert!(s.next_fire_at > s.last_fired_at);
        assert_eq!(s.last_error, None);
    }
}

/// Another process fires a schedule (its transaction holds the row and
/// moves the next fire on) while this one declares the same schedule again,
/// as an app does at every boot: the declaration must see the fire, not
/// write the fired occurrence back (which started it again).
#[test]
fn redeclaring_a_schedule_while_another_process_fires_it_keeps_the_fire() {
    let Some((e, cfg)) = engine("schedput") else {
        return;
    };
    e.register(spec("tick")).unwrap();
    let hour = 3_600_000;
    let put = e
        .put_schedule(every_spec("hourly", TenantArg::Missing, hour))
        .unwrap();
    let due = put.next_fire_at.unwrap();
    let mut firing = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let mut tx = firing.transaction().unwrap();
    let table = format!("\"{}\".job_schedule", cfg.schema);
    tx.execute(
        &format!("SELECT 1 FROM {table} WHERE name = 'hourly' FOR UPDATE"),
        &[],
    )
    .unwrap();
    let e = Arc::new(e);
    let again = {
        let e = e.clone();
        std::thread::spawn(move || e.put_schedule(every_spec("hourly", TenantArg::Missing, hour)))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    tx.execute(
        &format!(
            "UPDATE {table} SET next_fire_at = next_fire_at + interval '1 hour', \
             last_fired_at = next_fire_at WHERE name = 'hourly'"
        ),
        &[],
    )
    .unwrap();
    tx.commit().unwrap();
    let again = again.join().unwrap().unwrap();
    assert_eq!(
        again.next_fire_at,
        Some(due + hour),
        "the declaration saw the fire"
    );
    assert_eq!(again.last_fired_at, Some(due));
    let stored = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(
        stored.next_fire_at,
        Some(due + hour),
        "the fired occurrence was written back"
    );
}

/// A row this version cannot read (edited by hand) stops firing and says
/// why, instead of being found due on every pass.
#[test]
fn an_unreadable_schedule_row_is_parked_with_its_reason() {
    let Some((e, cfg)) = engine("schedbad") else {
        return;
    };
    e.register(spec("tick")).unwrap();
    e.put_schedule(every_spec("fine", TenantArg::Missing, 3_600_000))
        .unwrap();
    e.put_schedule(every_spec("broken", TenantArg::Missing, 1_000))
        .unwrap();
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let table = format!("\"{}\".job_schedule", cfg.schema);
    c.execute(
        &format!(
            "UPDATE {table} SET every_ms = NULL, cron = '0 0 L * *', \
             next_fire_at = now() - interval '1 second' WHERE name = 'broken'"
        ),
        &[],
    )
    .unwrap();
    assert_eq!(e.fire_due_schedules().unwrap(), 0);
    let row = c
        .query_one(
            &format!("SELECT next_fire_at IS NULL, last_error FROM {table} WHERE name = 'broken'"),
            &[],
        )
        .unwrap();
    assert!(row.get::<_, bool>(0), "it no longer fires");
    assert!(row.get::<_, String>(1).contains("could not be read"));
    let next = e.next_schedule_fire().unwrap().unwrap();
    assert!(next > e.now() + 3_000_000, "only the readable one is due");
}

#[test]
fn a_schedule_time_zone_is_stored_and_read_back() {
    let Some((e, _)) = engine("schedtz") else {
        return;
    };
    e.register(spec("tick")).unwrap();
    let put = e
        .put_schedule(ScheduleSpec {
            cron: Some("0 9 * * MON-FRI".to_owned()),
            timezone: Some("Asia/Kathmandu".to_owned()),
            every_ms: None,
            ..every_spec("standup", TenantArg::Missing, 1)
        })
        .unwrap();
    let stored = &e.list_schedules(&TenantArg::Missing).unwrap()[0];
    assert_eq!(stored.timing, put.timing);
    assert_eq!(stored.next_fire_at, put.next_fire_at);
    // 09:00 at +05:45 is 03:15 UTC.
    assert_eq!(
        put.next_fire_at.unwrap() % 86_400_000,
        (3 * 60 + 15) * 60_000
    );
    // Declared again in the same zone: same timing, the next fire is kept.
    let again = e
        .put_schedule(ScheduleSpec {
            cron: Some("0 9 * * MON-FRI".to_owned()),
            timezone: Some("Asia/Kathmandu".to_owned()),
            every_ms: None,
            ..every_spec("standup", TenantArg::Missing, 1)
        })
        .unwrap();
    assert_eq!(again.anchor, put.anchor);
}

/// Run events an observer was told of, in order.
#[derive(Default)]
struct HeardEvents(std::sync::Mutex<Vec<RunRow>>);

impl engine::EngineObserver for HeardEvents {
    fn run_aborted(&self, _run_id: RunId, _epoch: Option<u32>, _reason: AbortReason) {}

    fn run_events(&self, rows: Vec<RunRow>) {
        self.0.lock().unwrap().extend(rows);
    }
}

#[test]
fn another_engine_hears_every_transition_of_a_cascade_and_its_own_store_hears_none() {
    let Some((a, cfg)) = engine("feed") else {
        return;
    };
    let a = Arc::new(a);
    let b = Arc::new(engine_on(&cfg));
    let (heard_a, heard_b) = (
        Arc::new(HeardEvents::default()),
        Arc::new(HeardEvents::default()),
    );
    a.set_observer(heard_a.clone());
    b.set_observer(heard_b.clone());
    a.register(spec("big")).unwrap();
    // More transitions than one notification holds (~150 each), in one
    // transaction: A's cancel of the scope.
    const N: usize = 700;
    for _ in 0..N {
        let mut r = req("big", "{}");
        r.scope = Some(("batch".to_owned(), "b1".to_owned()));
        a.start(r).unwrap();
    }
    for _ in 0..N / 2 {
        a.claim_next("batch")
            .unwrap()
            .expect("a pending run to claim");
    }
    // Both listen; A's events are its own (it reports them itself), so
    // its feed must leave its store's announcements out.
    let (feed_a, feed_b) = (feed::EventFeed::new(), feed::EventFeed::new());
    a.set_events(true);
    b.set_events(true);
    assert!(feed_a.sync(&a, true) && feed_b.sync(&b, true));
    // The LISTENs are in place once a probe transition reaches B (a new
    // probe each time: one made before B listened is not replayed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while heard_b.0.lock().unwrap().is_empty() {
        let probe = a.start(req("big", "{}")).unwrap();
        a.cancel(&probe.id.to_string(), false, &TenantArg::Missing)
            .unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "B's feed never heard the probe"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    heard_b.0.lock().unwrap().clear();
    heard_a.0.lock().unwrap().clear();

    let canceled = a
        .cancel_for_scope(&TenantArg::Missing, "batch", "b1", true)
        .unwrap();
    assert_eq!(canceled as usize, N);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while heard_b.0.lock().unwrap().len() < N && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b_rows = heard_b.0.lock().unwrap().clone();
    assert_eq!(b_rows.len(), N, "B hears each canceled run once");
    assert!(b_rows.iter().all(|r| r.status == RunStatus::Canceled));
    let distinct: std::collections::HashSet<RunId> = b_rows.iter().map(|r| r.id).collect();
    assert_eq!(distinct.len(), N);
    // A: its own N events (from its transaction), not N more echoes.
    assert_eq!(heard_a.0.lock().unwrap().len(), N);

    // A transition the row no longer shows (the run moved on) is skipped.
    let moved = a.start(req("big", "{}")).unwrap();
    let stale = store::Transition {
        run: moved.id,
        status: RunStatus::Completed,
        epoch: 0,
        attempts: 1,
    };
    assert_eq!(b.report_transitions_elsewhere(&[stale]).unwrap(), 0);
    assert_eq!(
        b.report_transitions_elsewhere(&[store::Transition::of(&moved)])
            .unwrap(),
        1
    );
    feed_a.close();
    feed_b.close();
}
