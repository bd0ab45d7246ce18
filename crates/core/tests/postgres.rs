//! The engine over the PostgreSQL store. Needs a server: `JOBFORGE_PG_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`). Without one the
//! tests print why and pass, unless `JOBFORGE_REQUIRE_PG=1` (CI) makes a
//! missing server a failure. Each test works in its own schema.

use jobforge_core::engine::{WaitBegin, WaitRequest};
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
    engine_clocked(cfg, ClockKind::System)
}

fn engine_clocked(cfg: &PgConfig, clock: ClockKind) -> Engine<PgStore> {
    let store = PgStore::new(cfg.clone()).unwrap();
    store.migrate().unwrap();
    Engine::new(
        store,
        EngineOptions {
            multi_tenant: false,
            clock,
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

/// A stopping worker's prefetched attempts go back in one transaction:
/// only current attempts are released (an older epoch or a finished run
/// is left alone), and the released runs keep their due times, so the
/// next claim takes them in the order they were first claimed, ahead of
/// the runs queued behind them.
#[test]
fn released_prefetched_attempts_keep_their_place_in_one_batch() {
    let Some((e, _)) = engine("release") else {
        return;
    };
    e.register(spec("p")).unwrap();
    let mut started = Vec::new();
    for i in 0..12 {
        started.push(e.start(req("p", &format!(r#"{{"i":{i}}}"#))).unwrap().id);
        // Distinct due times: the claim order is the start order.
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let pool: Arc<str> = Arc::from("batch");
    let Settled { tickets, .. } = e.settle(Vec::new(), &[(pool.clone(), 8)]).unwrap();
    let claimed: Vec<RunId> = tickets.iter().map(|t| t.run.id).collect();
    assert_eq!(claimed, started[..8]);
    // The first finished; the second is presented with a stale epoch.
    e.finish_attempt(
        &tickets[0].run.id,
        tickets[0].epoch,
        AttemptOutcome::Completed(None),
    )
    .unwrap();
    let mut back: Vec<(RunId, u32)> = tickets.iter().map(|t| (t.run.id, t.epoch)).collect();
    back[1].1 += 7;
    let released = e.release_attempts(&back).unwrap();
    assert_eq!(
        released, 6,
        "the finished run and the stale epoch are not released"
    );
    let status = |id: &RunId| {
        e.find_by_id(&id.to_string(), &TenantArg::Missing)
            .unwrap()
            .unwrap()
    };
    assert_eq!(status(&started[0]).status, RunStatus::Completed);
    assert_eq!(status(&started[1]).status, RunStatus::Running);
    for (t, id) in tickets.iter().zip(&started).skip(2) {
        let row = status(id);
        assert_eq!(row.status, RunStatus::Pending);
        assert_eq!(row.run_at, t.run.run_at, "its due time is kept");
        assert!(row.claimed_at.get().is_none() && !row.executing);
    }
    // The next claim: the released runs first, in their order, then the rest.
    let Settled { tickets: again, .. } = e.settle(Vec::new(), &[(pool, 10)]).unwrap();
    let order: Vec<RunId> = again.iter().map(|t| t.run.id).collect();
    assert_eq!(order, started[2..]);
    assert!(e.release_attempts(&[]).unwrap() == 0);
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
    // A step is written (its key was missing from the seed's table: every
    // ctx.step failed), twice (the upsert finds its row).
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, fresh.id);
    for _ in 0..2 {
        e.step_begin(&c.id.to_string(), c.claim_epoch, "s").unwrap();
        e.step_complete(&c.id.to_string(), c.claim_epoch, "s", Some(raw("1")))
            .unwrap();
    }
    assert_eq!(
        e.list_steps(&c.id.to_string(), &TenantArg::Missing)
            .unwrap()
            .len(),
        1
    );
    // Durations past 2^31 ms fit (the seed's columns were integer).
    e.register(DefinitionSpec {
        timeout_ms: Some(30 * 24 * 3_600_000),
        dedupe_key: Some("k".to_owned()),
        dedupe_window_ms: Some(40 * 24 * 3_600_000),
        ..spec("monthly")
    })
    .unwrap();
    let def = e.definition("monthly").unwrap();
    assert_eq!(def.timeout_ms, Some(30 * 24 * 3_600_000));
    e.start(req("monthly", "{}")).unwrap();
    // Migrating again changes nothing.
    e.store().migrate().unwrap();
}

/// A role that owns a schema a DBA created for it, without CREATE on the
/// database (the default for a new role), migrates it: CREATE SCHEMA was
/// sent even when the schema existed, and its privilege check came first.
#[test]
fn a_schema_owner_without_create_on_the_database_migrates_its_schema() {
    let Some((_, cfg)) = engine("owner") else {
        return;
    };
    let role = format!("jf_rs_owner_{}", std::process::id());
    let schema = format!("jf_rs_owned_{}", std::process::id());
    let mut admin = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let setup = format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; DROP ROLE IF EXISTS \"{role}\";
         CREATE ROLE \"{role}\" LOGIN; CREATE SCHEMA \"{schema}\" AUTHORIZATION \"{role}\";"
    );
    if let Err(e) = admin.batch_execute(&setup) {
        // Not a superuser here: nothing to show.
        eprintln!("skipping: cannot create a role ({e})");
        return;
    }
    let mut pg: postgres::Config = cfg.url.parse().unwrap();
    pg.user(&role);
    let mut owner_cfg = PgConfig::new(format!(
        "postgres://{role}@{}/{}",
        match pg.get_hosts().first() {
            Some(postgres::config::Host::Tcp(h)) =>
                format!("{h}:{}", pg.get_ports().first().copied().unwrap_or(5432)),
            _ => "127.0.0.1:5432".to_owned(),
        },
        pg.get_dbname().unwrap_or("postgres")
    ));
    owner_cfg.schema = schema.clone();
    owner_cfg.max_connections = 2;
    let outcome = PgStore::new(owner_cfg).unwrap().migrate();
    let _ = admin.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE; DROP ROLE IF EXISTS \"{role}\";"
    ));
    assert!(outcome.is_ok(), "{outcome:?}");
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

/// The reason a parked row gives names the column this version could not
/// read (a timezone edited by hand was blamed on "cron, every_ms or input").
#[test]
fn an_unreadable_schedule_row_names_the_column() {
    let Some((e, cfg)) = engine("schedcol") else {
        return;
    };
    e.register(spec("tick")).unwrap();
    for name in ["zone", "expr"] {
        e.put_schedule(every_spec(name, TenantArg::Missing, 1_000))
            .unwrap();
    }
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let table = format!("\"{}\".job_schedule", cfg.schema);
    for (name, set) in [
        ("zone", "cron = '0 * * * *', timezone = 'Mars/Base'"),
        ("expr", "cron = '0 0 L * *'"),
    ] {
        c.execute(
            &format!(
                "UPDATE {table} SET every_ms = NULL, {set}, \
                 next_fire_at = now() - interval '1 second' WHERE name = '{name}'"
            ),
            &[],
        )
        .unwrap();
    }
    assert_eq!(e.fire_due_schedules().unwrap(), 0);
    for (name, said) in [("zone", "(its timezone)"), ("expr", "(its cron)")] {
        let row = c
            .query_one(
                &format!("SELECT last_error FROM {table} WHERE name = '{name}'"),
                &[],
            )
            .unwrap();
        let why: String = row.get(0);
        assert!(why.contains(said), "{name}: {why}");
    }
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

/// Issue 21: the retry options live in the `retry_policy` jsonb column (no
/// schema change), are read back by another process as written, and that
/// process's retries follow them. A seed-shaped policy is stored unchanged.
#[test]
fn retry_options_are_stored_in_the_definition_row_and_applied_by_another_engine() {
    let Some((e, cfg)) = engine("retryopts") else {
        return;
    };
    let mut s = spec("capped");
    s.retry = Some(RetryPolicy {
        attempts: 5,
        backoff: Backoff::Exponential,
        base_ms: 1_000_000,
        max_delay_ms: Some(150),
        jitter: Jitter::Equal,
        ..RetryPolicy::default()
    });
    e.register(s).unwrap();
    let mut seed_shaped = spec("seedlike");
    seed_shaped.retry = Some(RetryPolicy {
        attempts: 2,
        backoff: Backoff::Linear,
        base_ms: 10,
        ..RetryPolicy::default()
    });
    e.register(seed_shaped).unwrap();
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let stored: Vec<String> = c
        .query(
            &format!(
                "SELECT retry_policy::text FROM \"{}\".job ORDER BY type",
                cfg.schema
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        stored,
        vec![
            r#"{"baseMs": 1000000, "jitter": "equal", "backoff": "exponential", "attempts": 5, "maxDelayMs": 150}"#,
            r#"{"baseMs": 10, "backoff": "linear", "attempts": 2}"#,
        ]
    );
    // Another engine (process) knows the types only from the table.
    let other = engine_on(&cfg);
    let def = other.definition("capped").unwrap();
    assert_eq!(def.retry_policy.max_delay_ms, Some(150));
    assert_eq!(def.retry_policy.jitter, Jitter::Equal);
    let run = other.start(req("capped", "{}")).unwrap();
    let claimed = other.claim_next("batch").unwrap().unwrap();
    assert_eq!(claimed.id, run.id);
    let before = other.now();
    let after = other
        .finish_attempt(
            &claimed.id,
            claimed.claim_epoch,
            AttemptOutcome::Failed(FailureInfo {
                message: "boom".into(),
                ..FailureInfo::default()
            }),
        )
        .unwrap()
        .unwrap();
    assert_eq!(after.status, RunStatus::Pending);
    let delay = after.run_at - before;
    // Equal jitter of the capped 150 ms: [75, 150] (+ the ms the call took).
    assert!((75..=150 + 1_000).contains(&delay), "delay {delay}");
    assert!(delay < 1_000_000, "maxDelayMs capped the exponential delay");
}

// ── durable waits ──────────────────────────────────────────────────────

/// A fresh schema and an engine on it with a manual clock: deadlines fall
/// when the test moves the clock, not when the machine is slow.
fn manual_engine(tag: &str) -> Option<(Engine<PgStore>, PgConfig)> {
    let (_, cfg) = engine(tag)?;
    Some((engine_clocked(&cfg, ClockKind::Manual), cfg))
}

/// A connection listening on the schema's wake-up channel.
fn wake_listener(cfg: &PgConfig) -> postgres::Client {
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    c.batch_execute(&format!("LISTEN \"jobforge_{}\"", cfg.schema))
        .unwrap();
    c
}

/// Whether a wake-up ("something may be claimable") arrived within 2 s.
fn heard_wake(c: &mut postgres::Client) -> bool {
    let mut notes = c.notifications();
    let mut it = notes.timeout_iter(std::time::Duration::from_secs(2));
    while let Some(n) = postgres::fallible_iterator::FallibleIterator::next(&mut it).unwrap() {
        if n.payload().is_empty() {
            return true;
        }
    }
    false
}

fn row_of(e: &Engine<PgStore>, id: &RunId) -> RunRow {
    e.find_by_id(&id.to_string(), &TenantArg::Missing)
        .unwrap()
        .expect("the run's row")
}

fn claim(e: &Engine<PgStore>, pool: &str) -> RunRow {
    e.claim_next(pool).unwrap().expect("a run to claim")
}

fn parked(e: &Engine<PgStore>, run: &RunRow) -> RunRow {
    e.finish_attempt(&run.id, run.claim_epoch, AttemptOutcome::Parked)
        .unwrap()
        .expect("the parked row")
}

fn wait(e: &Engine<PgStore>, run: &RunRow, step: &str, w: WaitRequest) -> WaitBegin {
    e.wait_begin(&run.id.to_string(), run.claim_epoch, step, w)
        .unwrap()
}

fn done_with(w: WaitBegin) -> Option<String> {
    match w {
        WaitBegin::Done(v) => v.map(|v| v.get().to_owned()),
        other => panic!("expected a resolved wait, got {other:?}"),
    }
}

fn signal_wait(name: &str, timeout_ms: Option<i64>) -> WaitRequest {
    WaitRequest::Signal {
        signal: name.to_owned(),
        timeout_ms,
    }
}

/// What the store writes for a waiting run (kind, deadline, the waits its
/// end resolves) and for a wait step (its kind) reads back as written, on
/// every path that writes a run: one changed row, many changed rows in one
/// statement, a new row.
#[test]
fn wait_fields_awaited_by_and_step_kinds_are_stored_and_read_back() {
    let Some((e, _)) = engine("waitrows") else {
        return;
    };
    e.register(spec("w")).unwrap();
    let a = e.start(req("w", "{}")).unwrap();
    let b = e.start(req("w", "{}")).unwrap();
    let parent = e.start(req("w", "{}")).unwrap();
    let at = e.now() + 60_000;

    // One changed row: the single-row update.
    e.store()
        .transaction(|tx| {
            tx.update_run(&a.id, &mut |r| {
                r.status = RunStatus::Waiting;
                r.wait_kind = Some(WaitKind::Sleep);
                r.wait_deadline = at.into();
            });
            Ok(())
        })
        .unwrap();
    let back = row_of(&e, &a.id);
    assert_eq!(back.status, RunStatus::Waiting);
    assert_eq!(back.wait_kind, Some(WaitKind::Sleep));
    assert_eq!(back.wait_deadline.get(), Some(at));
    assert!(back.awaited_by().is_empty());
    assert!(back.to_json().contains(&format!(
        r#""waitKind":"sleep","resumeToken":null,"waitDeadline":{at}"#
    )));

    // Two changed rows: the batched update.
    let step_id: Box<str> = "invoke \"é\" 1".into();
    e.store()
        .transaction(|tx| {
            for (id, kind) in [(a.id, WaitKind::Child), (b.id, WaitKind::Token)] {
                tx.update_run(&id, &mut |r| {
                    r.status = RunStatus::Waiting;
                    r.wait_kind = Some(kind);
                    r.wait_deadline = match kind {
                        WaitKind::Child => OptMillis::NONE,
                        _ => (at + 1).into(),
                    };
                    let extras = r.extras.get_or_insert_with(Default::default);
                    extras.awaited_by.push((parent.id, step_id.clone()));
                    extras.awaited_by.push((b.id, "second".into()));
                });
            }
            Ok(())
        })
        .unwrap();
    let (ra, rb) = (row_of(&e, &a.id), row_of(&e, &b.id));
    assert_eq!(
        (ra.wait_kind, ra.wait_deadline.get()),
        (Some(WaitKind::Child), None)
    );
    assert_eq!(
        (rb.wait_kind, rb.wait_deadline.get()),
        (Some(WaitKind::Token), Some(at + 1))
    );
    let expected = vec![(parent.id, step_id.clone()), (b.id, Box::from("second"))];
    assert_eq!(ra.awaited_by(), expected.as_slice());
    assert_eq!(rb.awaited_by(), expected.as_slice());

    // Cleared again (a resumption): the columns go back to null.
    e.store()
        .transaction(|tx| {
            tx.update_run(&a.id, &mut |r| {
                r.status = RunStatus::Pending;
                r.clear_wait();
                if let Some(x) = r.extras.as_mut() {
                    x.awaited_by.clear();
                }
            });
            Ok(())
        })
        .unwrap();
    let back = row_of(&e, &a.id);
    assert_eq!((back.wait_kind, back.wait_deadline.get()), (None, None));
    assert!(back.awaited_by().is_empty());
    assert!(back.extras.is_none(), "nothing left of the extras");

    // A new row with them set: the insert.
    let mut fresh = rb.clone();
    fresh.id = RunId::new_v4();
    fresh.wait_kind = Some(WaitKind::Signal);
    fresh.wait_deadline = (at + 2).into();
    e.store()
        .transaction(|tx| {
            fresh.seq = tx.next_seq();
            tx.insert_run(fresh.clone());
            Ok(())
        })
        .unwrap();
    let back = row_of(&e, &fresh.id);
    assert_eq!(back.status, RunStatus::Waiting);
    assert_eq!(
        (back.wait_kind, back.wait_deadline.get()),
        (Some(WaitKind::Signal), Some(at + 2))
    );
    assert_eq!(back.awaited_by(), expected.as_slice());

    // Steps: a task step, then the same id rewritten as a wait (the upsert
    // changes the kind too), and a wait step of its own.
    let spec = WaitSpec::Signal {
        signal: "go".to_owned(),
        deadline: Some(at),
        timeout_ms: Some(60_000),
    };
    let step = |step_id: &str, kind: &'static str, seq: u32| StepRow {
        id: RunId::new_v4(),
        job_run_id: parent.id,
        step_id: step_id.into(),
        kind: StepKind::parse(kind).expect("a step kind"),
        seq,
        status: StepStatus::Running,
        input: Some(spec.to_raw()),
        output: None,
        error: None,
        attempts: 1,
        started_at: at.into(),
        finished_at: OptMillis::NONE,
        epoch: 1,
    };
    e.store()
        .transaction(|tx| {
            tx.put_step(step("s1", "task", 1));
            Ok(())
        })
        .unwrap();
    let kinds = |e: &Engine<PgStore>| -> Vec<(String, &'static str)> {
        e.list_steps(&parent.id.to_string(), &TenantArg::Missing)
            .unwrap()
            .into_iter()
            .map(|s| (s.step_id.to_string(), s.kind.as_str()))
            .collect()
    };
    assert_eq!(kinds(&e), [("s1".to_owned(), "task")]);
    e.store()
        .transaction(|tx| {
            tx.put_step(step("s1", "wait", 1));
            tx.put_step(step("s2", "wait", 2));
            Ok(())
        })
        .unwrap();
    assert_eq!(
        kinds(&e),
        [("s1".to_owned(), "wait"), ("s2".to_owned(), "wait")]
    );
    let s2 = e
        .find_step(&TenantArg::Missing, &parent.id.to_string(), "s2")
        .unwrap()
        .unwrap();
    assert_eq!(WaitSpec::of_step(&s2), Some(spec));
}

/// The inbox: FIFO per name, counted per run, emptied on demand, a take
/// undone by a rollback, and gone with its run when retention purges it
/// (with the run's steps).
#[test]
fn the_inbox_is_fifo_per_name_and_goes_with_its_purged_run() {
    let Some((e, cfg)) = engine("inbox") else {
        return;
    };
    e.register(spec("w")).unwrap();
    let run = e.start(req("w", "{}")).unwrap();
    let mut done_req = req("w", "{}");
    done_req.pool = Some("done".to_owned());
    let other = e.start(done_req).unwrap();
    let push = |id: RunId, name: &str, payload: &str| {
        e.store()
            .transaction(|tx| {
                tx.push_signal(&id, name, raw(payload), e.now());
                Ok(())
            })
            .unwrap()
    };
    let len = |id: RunId| e.store().read(|tx| Ok(tx.inbox_len(&id))).unwrap();
    let take = |id: RunId, name: &str| {
        e.store()
            .transaction(|tx| Ok(tx.take_signal(&id, name).map(|p| p.get().to_owned())))
            .unwrap()
    };
    push(run.id, "a", r#"{"n":1}"#);
    push(run.id, "b", "2");
    push(run.id, "a", r#"{"n":3}"#);
    push(run.id, "a", "null");
    push(other.id, "a", "9");
    assert_eq!((len(run.id), len(other.id)), (4, 1));

    assert_eq!(take(run.id, "a").as_deref(), Some(r#"{"n": 1}"#));
    // A take in a transaction that rolls back leaves the signal in place.
    let r: Result<()> = e.store().transaction(|tx| {
        assert!(tx.take_signal(&run.id, "a").is_some());
        Err(JobError::JobInputInvalid {
            reason: "roll back".to_owned(),
        })
    });
    assert!(r.is_err());
    assert_eq!(take(run.id, "a").as_deref(), Some(r#"{"n": 3}"#));
    assert_eq!(take(run.id, "b").as_deref(), Some("2"));
    // A signal sent without a payload is JSON null, still a signal.
    assert_eq!(take(run.id, "a").as_deref(), Some("null"));
    assert_eq!(take(run.id, "a"), None);
    assert_eq!(take(run.id, "b"), None);
    assert_eq!(take(run.id, "nothing"), None);
    assert_eq!((len(run.id), len(other.id)), (0, 1));

    // Two takes in one transaction take two signals.
    push(run.id, "c", "1");
    push(run.id, "c", "2");
    let both = e
        .store()
        .transaction(|tx| {
            let first = tx.take_signal(&run.id, "c").map(|p| p.get().to_owned());
            let second = tx.take_signal(&run.id, "c").map(|p| p.get().to_owned());
            Ok((first, second, tx.inbox_len(&run.id)))
        })
        .unwrap();
    assert_eq!(both, (Some("1".to_owned()), Some("2".to_owned()), 0));

    push(run.id, "d", "1");
    push(run.id, "e", "2");
    e.store()
        .transaction(|tx| {
            tx.clear_signals(&run.id);
            Ok(())
        })
        .unwrap();
    assert_eq!((len(run.id), len(other.id)), (0, 1), "one run's inbox only");

    // Purged: the run's signals go with it, as its steps do; a live run's stay.
    push(run.id, "kept", "1");
    let c = claim(&e, "done");
    assert_eq!(c.id, other.id);
    e.store()
        .transaction(|tx| {
            tx.put_step(StepRow {
                id: RunId::new_v4(),
                job_run_id: other.id,
                step_id: "s".into(),
                kind: StepKind::Wait,
                seq: 1,
                status: StepStatus::Completed,
                input: None,
                output: None,
                error: None,
                attempts: 1,
                started_at: OptMillis::NONE,
                finished_at: OptMillis::NONE,
                epoch: c.claim_epoch,
            });
            Ok(())
        })
        .unwrap();
    e.finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    let purged = e
        .store()
        .transaction(|tx| Ok(tx.purge_finished(Some(e.now()), None)))
        .unwrap();
    assert_eq!(purged, 1);
    let mut sql = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let left = |sql: &mut postgres::Client, table: &str, col: &str| -> i64 {
        sql.query_one(
            &format!(
                "SELECT count(*) FROM \"{}\".{table} WHERE {col} = $1",
                cfg.schema
            ),
            &[&other.id],
        )
        .unwrap()
        .get(0)
    };
    assert_eq!(left(&mut sql, "job_run", "id"), 0);
    assert_eq!(left(&mut sql, "job_step", "job_run_id"), 0);
    assert_eq!(left(&mut sql, "job_signal", "run_id"), 0);
    assert_eq!(len(run.id), 1);
    assert_eq!(take(run.id, "kept").as_deref(), Some("1"));
}

/// The resumer's reads: waiting runs past their deadline, earliest first
/// (created order breaking ties), at most the limit, skipping rows another
/// transaction holds rather than waiting for them; the next deadline, with
/// what this transaction resumed already left out.
#[test]
fn due_waits_come_earliest_first_and_skip_runs_held_elsewhere() {
    let Some((e, cfg)) = engine("duewaits") else {
        return;
    };
    e.register(spec("w")).unwrap();
    let t = e.now() + 1_000;
    let runs: Vec<RunRow> = (0..6).map(|_| e.start(req("w", "{}")).unwrap()).collect();
    let (w1, w2, w3, w4, not_waiting, untimed) = (
        runs[0].id, runs[1].id, runs[2].id, runs[3].id, runs[4].id, runs[5].id,
    );
    e.store()
        .transaction(|tx| {
            for (id, status, deadline) in [
                (w1, RunStatus::Waiting, Some(t + 10)),
                (w2, RunStatus::Waiting, Some(t + 20)),
                (w3, RunStatus::Waiting, Some(t + 10)),
                (w4, RunStatus::Waiting, Some(t + 30)),
                // Only waiting runs resume, whatever their columns say.
                (not_waiting, RunStatus::Running, Some(t)),
                (untimed, RunStatus::Waiting, None),
            ] {
                tx.update_run(&id, &mut |r| {
                    r.status = status;
                    r.wait_kind = Some(WaitKind::Signal);
                    r.wait_deadline = deadline.into();
                });
            }
            Ok(())
        })
        .unwrap();
    let due = |now: Millis, limit: usize| {
        e.store()
            .transaction(|tx| Ok(tx.due_waits(now, limit)))
            .unwrap()
    };
    let next = || {
        e.store()
            .transaction(|tx| Ok(tx.next_wait_deadline()))
            .unwrap()
    };
    assert_eq!(next(), Some(t + 10));
    assert_eq!(due(t + 9, 10), Vec::<RunId>::new());
    assert_eq!(due(t + 10, 10), vec![w1, w3]);
    assert_eq!(due(t + 25, 10), vec![w1, w3, w2]);
    assert_eq!(due(t + 1_000, 2), vec![w1, w3]);

    let release = hold_row_locks(&cfg, vec![w1]);
    let started = std::time::Instant::now();
    assert_eq!(due(t + 1_000, 10), vec![w3, w2, w4]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "due_waits waited for a lock"
    );
    release.send(()).unwrap();
    // The holder commits on its own thread: wait until it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while due(t + 1_000, 10).len() < 4 {
        assert!(std::time::Instant::now() < deadline, "never released");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Resumed in this transaction: neither due nor next any more.
    let (resumed, next_after) = e
        .store()
        .transaction(|tx| {
            let ids = tx.due_waits(t + 20, 10);
            for id in &ids {
                tx.update_run(id, &mut |r| {
                    r.status = RunStatus::Pending;
                    r.clear_wait();
                });
            }
            Ok((ids, tx.next_wait_deadline()))
        })
        .unwrap();
    assert_eq!(resumed, vec![w1, w3, w2]);
    assert_eq!(next_after, Some(t + 30));
    assert_eq!(due(t + 1_000, 10), vec![w4]);
}

/// A database made by the version before durable waits (schema versions 1
/// and 2, as that version wrote them) is upgraded in place by `migrate`:
/// its checks then take the wait kinds and the wait steps it refused, its
/// rows still work, and migrating again changes nothing.
#[test]
fn a_database_of_schema_version_2_upgrades_in_place_to_durable_waits() {
    let Some((_, cfg)) = engine("v2") else {
        return;
    };
    let s = format!("\"{}\"", cfg.schema);
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let old = include_str!("fixtures/schema_v2.sql").replace("{S}", &s);
    c.batch_execute(&format!(
        "DROP SCHEMA {s} CASCADE; CREATE SCHEMA {s}; {old}
         INSERT INTO {s}.job_run (id, job_type, root_run_id, pool, status, run_at)
         VALUES ('22222222-2222-4222-8222-222222222222', 'w', '22222222-2222-4222-8222-222222222222',
           'batch', 'pending', now() - interval '1 minute');
         INSERT INTO {s}.job_step (id, job_run_id, step_id, seq, status, output, attempts)
         VALUES ('33333333-3333-4333-8333-333333333333', '22222222-2222-4222-8222-222222222222',
           'old', 1, 'completed', '1', 1);"
    ))
    .unwrap();
    // The old checks refuse what waits write.
    assert!(c
        .batch_execute(&format!("UPDATE {s}.job_run SET wait_kind = 'sleep'"))
        .is_err());
    assert!(c
        .batch_execute(&format!("UPDATE {s}.job_step SET kind = 'wait'"))
        .is_err());

    let e = engine_clocked(&cfg, ClockKind::Manual); // migrates
    let versions: Vec<i32> = c
        .query(
            &format!("SELECT version FROM {s}.jobforge_migration ORDER BY version"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5, 6]);
    let checks = |c: &mut postgres::Client| -> Vec<(String, u32, String)> {
        c.query(
            "SELECT conname::text, oid, pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE connamespace = $1::text::regnamespace \
             AND conname IN ('job_run_wait_kind_check', 'job_step_kind_check') ORDER BY conname",
            &[&s],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };
    let before = checks(&mut c);
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before[0].2.contains("'child'"), "{before:?}");
    assert!(before[1].2.contains("'wait'"), "{before:?}");
    // Again: the checks are left as they are (not dropped and re-added,
    // which would scan the table to validate them each time).
    e.store().migrate().unwrap();
    assert_eq!(checks(&mut c), before);

    // The old run parks on a sleep: wait_kind 'sleep', a step of kind 'wait'.
    e.register(spec("w")).unwrap();
    let run = claim(&e, "batch");
    assert_eq!(run.id.to_string(), "22222222-2222-4222-8222-222222222222");
    let until = e.now() + 5_000;
    assert!(matches!(
        wait(&e, &run, "nap", WaitRequest::Sleep { until }),
        WaitBegin::Open
    ));
    let p = parked(&e, &run);
    assert_eq!(p.status, RunStatus::Waiting);
    let stored = c
        .query_one(
            &format!("SELECT wait_kind, wait_deadline IS NOT NULL FROM {s}.job_run WHERE id = $1"),
            &[&run.id],
        )
        .unwrap();
    assert_eq!(stored.get::<_, Option<&str>>(0), Some("sleep"));
    assert!(stored.get::<_, bool>(1));
    let steps: Vec<(String, &'static str)> = e
        .list_steps(&run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .into_iter()
        .map(|s| (s.step_id.to_string(), s.kind.as_str()))
        .collect();
    assert_eq!(
        steps,
        [("old".to_owned(), "task"), ("nap".to_owned(), "wait")]
    );
    // The widened checks still refuse what no version writes.
    assert!(c
        .batch_execute(&format!("UPDATE {s}.job_run SET wait_kind = 'nap'"))
        .is_err());
    assert!(c
        .batch_execute(&format!("UPDATE {s}.job_step SET kind = 'nap'"))
        .is_err());
    // And it resumes at its deadline.
    // Moving the manual clock resumes what fell due (nothing left after).
    e.advance_time(5_000);
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, None));
    let again = claim(&e, "batch");
    assert_eq!(
        done_with(wait(&e, &again, "nap", WaitRequest::Sleep { until })),
        None
    );
}

/// `ctx.sleep` on PostgreSQL: the attempt parks, the run waits with its
/// deadline (two parked in one settle, the batched write), the resumer
/// turns it pending at the deadline and wakes the workers, and the sleep
/// answers when the handler runs again.
#[test]
fn a_sleep_parks_the_run_until_its_deadline_resumes_it() {
    let Some((e, cfg)) = manual_engine("sleep") else {
        return;
    };
    e.register(spec("w")).unwrap();
    e.start(req("w", r#"{"i":1}"#)).unwrap();
    e.start(req("w", r#"{"i":2}"#)).unwrap();
    let pool: Arc<str> = Arc::from("batch");
    let Settled { tickets, .. } = e.settle(Vec::new(), &[(pool, 2)]).unwrap();
    assert_eq!(tickets.len(), 2);
    let t0 = e.now();
    let until = |i: usize| t0 + 1_000 * (i as i64 + 1);
    for (i, t) in tickets.iter().enumerate() {
        let w = e
            .wait_begin(
                &t.run.id.to_string(),
                t.epoch,
                "nap",
                WaitRequest::Sleep { until: until(i) },
            )
            .unwrap();
        assert!(matches!(w, WaitBegin::Open), "{w:?}");
    }
    let ends = tickets
        .iter()
        .map(|t| AttemptEnd {
            id: t.run.id,
            epoch: t.epoch,
            outcome: Some(AttemptOutcome::Parked),
            ended_at: None,
        })
        .collect();
    assert_eq!(e.settle(ends, &[]).unwrap().applied, 2);
    for (i, t) in tickets.iter().enumerate() {
        let r = row_of(&e, &t.run.id);
        assert_eq!(r.status, RunStatus::Waiting);
        assert_eq!(r.wait_kind, Some(WaitKind::Sleep));
        assert_eq!(r.wait_deadline.get(), Some(until(i)));
        assert_eq!(r.attempts, 0, "parking is no attempt");
        assert_eq!(r.claimed_at.get(), None);
        assert!(!r.executing);
    }

    // Nothing due yet: the next deadline is the earliest.
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, Some(until(0))));
    e.advance_time(999);
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, Some(until(0))));
    assert!(e.claim_next("batch").unwrap().is_none());

    let mut listener = wake_listener(&cfg);
    // Moving the manual clock resumes what fell due, in that same call.
    e.advance_time(1);
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, Some(until(1))));
    assert!(heard_wake(&mut listener), "the resumed run woke no worker");
    let first = row_of(&e, &tickets[0].run.id);
    assert_eq!(first.status, RunStatus::Pending);
    assert_eq!((first.wait_kind, first.wait_deadline.get()), (None, None));
    assert_eq!(first.run_at, until(0));
    assert_eq!(row_of(&e, &tickets[1].run.id).status, RunStatus::Waiting);

    // Run again, the sleep answers at once; the attempt kept its start.
    let c = claim(&e, "batch");
    assert_eq!(c.id, tickets[0].run.id);
    assert_eq!(c.started_at, tickets[0].run.started_at);
    assert_eq!(
        done_with(wait(&e, &c, "nap", WaitRequest::Sleep { until: until(0) })),
        None
    );
    let step = e
        .find_step(&TenantArg::Missing, &c.id.to_string(), "nap")
        .unwrap()
        .unwrap();
    assert_eq!(
        (step.kind.as_str(), step.status),
        ("wait", StepStatus::Completed)
    );
    let end = e
        .finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap()
        .unwrap();
    assert_eq!((end.status, end.attempts), (RunStatus::Completed, 1));

    // A claim resumes due waits first (no worker timer needed).
    e.advance_time(1_000);
    let c2 = claim(&e, "batch");
    assert_eq!(c2.id, tickets[1].run.id);
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, None));
}

/// `ctx.waitForSignal` on PostgreSQL: signals no wait took wait in the
/// inbox and answer later waits oldest first; a signal for an open wait
/// resolves it and resumes the run; a wait's timeout resumes it too.
#[test]
fn signals_wait_in_the_inbox_or_resume_the_run_waiting_for_them() {
    let Some((e, cfg)) = manual_engine("signal") else {
        return;
    };
    e.register(spec("w")).unwrap();
    let run = e.start(req("w", "{}")).unwrap();
    let id = run.id.to_string();
    let c = claim(&e, "batch");
    let send = |name: &str, payload: Option<&str>| {
        e.signal(&id, name, payload.map(raw), &TenantArg::Missing)
            .unwrap()
    };
    assert!(!send("go", Some(r#"{"n":1}"#)), "no wait yet: to the inbox");
    assert!(!send("go", Some(r#"{"n":2}"#)));
    assert!(!send("other", None));
    assert_eq!(
        done_with(wait(&e, &c, "s1", signal_wait("go", None))).as_deref(),
        Some(r#"{"n": 1}"#)
    );
    assert_eq!(
        done_with(wait(&e, &c, "s2", signal_wait("go", None))).as_deref(),
        Some(r#"{"n": 2}"#)
    );
    assert!(matches!(
        wait(&e, &c, "s3", signal_wait("go", Some(5_000))),
        WaitBegin::Open
    ));
    let p = parked(&e, &c);
    assert_eq!(p.status, RunStatus::Waiting);
    assert_eq!(p.wait_kind, Some(WaitKind::Signal));
    assert_eq!(p.wait_deadline.get(), Some(e.now() + 5_000));
    let inbox = e.store().read(|tx| Ok(tx.inbox_len(&run.id))).unwrap();
    assert_eq!(inbox, 1, "the signal no wait took");

    let mut listener = wake_listener(&cfg);
    assert!(send("go", Some("3")), "taken by the open wait");
    assert!(heard_wake(&mut listener));
    let r = row_of(&e, &run.id);
    assert_eq!(r.status, RunStatus::Pending);
    assert_eq!((r.wait_kind, r.wait_deadline.get()), (None, None));

    let c = claim(&e, "batch");
    assert_eq!(
        done_with(wait(&e, &c, "s1", signal_wait("go", None))).as_deref(),
        Some(r#"{"n": 1}"#),
        "a resolved wait answers from its row"
    );
    assert_eq!(
        done_with(wait(&e, &c, "s3", signal_wait("go", Some(5_000)))).as_deref(),
        Some("3")
    );

    // A wait's timeout: the deadline resumes the run and the wait fails.
    assert!(matches!(
        wait(&e, &c, "s4", signal_wait("never", Some(100))),
        WaitBegin::Open
    ));
    assert_eq!(parked(&e, &c).wait_deadline.get(), Some(e.now() + 100));
    e.advance_time(100);
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, None));
    let c = claim(&e, "batch");
    match wait(&e, &c, "s4", signal_wait("never", Some(100))) {
        WaitBegin::Failed(err) => assert!(err.get().contains("JobWaitTimeoutError"), "{err}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    e.finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    assert!(matches!(
        e.signal(&id, "go", None, &TenantArg::Missing),
        Err(JobError::JobRunState { .. })
    ));
}

/// `ctx.waitForToken` on PostgreSQL: the token's hash is stored, never the
/// token; `resume` with it resolves the wait and resumes the run, once.
#[test]
fn a_token_wait_resumes_with_its_token_once() {
    let Some((e, cfg)) = manual_engine("token") else {
        return;
    };
    e.register(spec("w")).unwrap();
    let run = e.start(req("w", "{}")).unwrap();
    let c = claim(&e, "batch");
    let token = match wait(&e, &c, "approval", WaitRequest::Token { timeout_ms: None }) {
        WaitBegin::Token(t) => t,
        other => panic!("expected a token, got {other:?}"),
    };
    let step = e
        .find_step(&TenantArg::Missing, &run.id.to_string(), "approval")
        .unwrap()
        .unwrap();
    assert_eq!(step.status, StepStatus::Pending, "being delivered");
    let input = step.input.as_ref().unwrap().get().to_owned();
    assert!(!input.contains(&token), "{input}");
    assert!(
        input.contains(&jobforge_core::engine::resume_token_hash(&token)),
        "{input}"
    );
    assert!(matches!(
        e.wait_delivered(&run.id.to_string(), c.claim_epoch, "approval")
            .unwrap(),
        WaitBegin::Open
    ));
    let p = parked(&e, &c);
    assert_eq!(
        (p.status, p.wait_kind, p.wait_deadline.get()),
        (RunStatus::Waiting, Some(WaitKind::Token), None)
    );
    assert_eq!(e.resume_due_waits_then_next().unwrap(), (0, None));

    let forged = format!("jft_{}{}", run.id.simple(), "0".repeat(64));
    assert!(matches!(
        e.resume(&forged, None, &TenantArg::Missing),
        Err(JobError::JobResumeToken { .. })
    ));
    let mut listener = wake_listener(&cfg);
    let resumed = e
        .resume(&token, Some(raw(r#"{"ok":true}"#)), &TenantArg::Missing)
        .unwrap();
    assert_eq!(resumed, run.id);
    assert!(heard_wake(&mut listener));
    assert_eq!(row_of(&e, &run.id).status, RunStatus::Pending);
    assert!(matches!(
        e.resume(&token, None, &TenantArg::Missing),
        Err(JobError::JobResumeToken { .. })
    ));
    let c = claim(&e, "batch");
    assert_eq!(
        done_with(wait(
            &e,
            &c,
            "approval",
            WaitRequest::Token { timeout_ms: None }
        ))
        .as_deref(),
        Some(r#"{"ok": true}"#)
    );
}

/// `ctx.invoke` on PostgreSQL: the child records the wait its end resolves
/// (`awaited_by`); a second invoke answered by the same child (a dedupe
/// hit) adds its wait to the stored row; the child's completion resumes
/// both parents and their waits answer with its output.
#[test]
fn an_invoked_childs_completion_resumes_its_waiting_parents() {
    let Some((e, cfg)) = manual_engine("child") else {
        return;
    };
    e.register(spec("parent")).unwrap();
    e.register(DefinitionSpec {
        dedupe_key: Some("c:{{k}}".to_owned()),
        dedupe_window_ms: Some(60_000),
        ..spec("child")
    })
    .unwrap();
    let p1 = e.start(req("parent", "{}")).unwrap();
    let p2 = e.start(req("parent", "{}")).unwrap();
    let c1 = claim(&e, "batch");
    let c2 = claim(&e, "batch");
    assert_eq!((c1.id, c2.id), (p1.id, p2.id));
    let invoke = || WaitRequest::Child {
        start: Box::new(req("child", r#"{"k":1}"#)),
        timeout_ms: None,
    };
    assert!(matches!(wait(&e, &c1, "kid", invoke()), WaitBegin::Open));
    let step = e
        .find_step(&TenantArg::Missing, &p1.id.to_string(), "kid")
        .unwrap()
        .unwrap();
    let Some(WaitSpec::Child { child_run_id, .. }) = WaitSpec::of_step(&step) else {
        panic!("a child wait: {step:?}");
    };
    let child = row_of(&e, &child_run_id);
    assert_eq!(child.parent_run_id(), Some(p1.id));
    assert_eq!(child.awaited_by(), [(p1.id, Box::from("kid"))].as_slice());

    assert!(matches!(
        wait(&e, &c2, "same kid", invoke()),
        WaitBegin::Open
    ));
    assert_eq!(
        row_of(&e, &child_run_id).awaited_by(),
        [(p1.id, Box::from("kid")), (p2.id, Box::from("same kid"))].as_slice()
    );
    for c in [&c1, &c2] {
        let p = parked(&e, c);
        assert_eq!(
            (p.status, p.wait_kind, p.wait_deadline.get()),
            (RunStatus::Waiting, Some(WaitKind::Child), None)
        );
    }

    let kid = claim(&e, "batch");
    assert_eq!(kid.id, child_run_id);
    let mut listener = wake_listener(&cfg);
    e.finish_attempt(
        &kid.id,
        kid.claim_epoch,
        AttemptOutcome::Completed(Some(raw(r#"{"r":42}"#))),
    )
    .unwrap();
    assert!(heard_wake(&mut listener));
    for p in [&p1, &p2] {
        let r = row_of(&e, &p.id);
        assert_eq!(r.status, RunStatus::Pending);
        assert_eq!(r.wait_kind, None);
    }
    let c1 = claim(&e, "batch");
    let c2 = claim(&e, "batch");
    assert_eq!(
        done_with(wait(&e, &c1, "kid", invoke())).as_deref(),
        Some(r#"{"r": 42}"#)
    );
    assert_eq!(
        done_with(wait(&e, &c2, "same kid", invoke())).as_deref(),
        Some(r#"{"r": 42}"#)
    );
}

/// On PostgreSQL too, a deduplicated child's `awaited_by` keeps only the
/// waits still waiting for it: a canceled invoker and one whose wait
/// passed its deadline are dropped as the next invoker's entry is stored.
#[test]
fn a_deduplicated_childs_stored_waiters_keep_only_the_waits_still_open() {
    let Some((e, _)) = manual_engine("childprune") else {
        return;
    };
    e.register(spec("parent")).unwrap();
    e.register(DefinitionSpec {
        dedupe_key: Some("one".to_owned()),
        dedupe_window_ms: Some(3_600_000),
        ..spec("child")
    })
    .unwrap();
    let invoke = |timeout_ms: Option<i64>| WaitRequest::Child {
        start: Box::new(StartRequest {
            parent_close_policy: Some(ParentClosePolicy::Abandon),
            pool: Some("kids".to_owned()),
            ..req("child", "{}")
        }),
        timeout_ms,
    };
    let mut invokers = Vec::new();
    for (i, timeout) in [None, Some(1_000), None, None].into_iter().enumerate() {
        let pool = format!("p{i}");
        e.start(StartRequest {
            pool: Some(pool.clone()),
            ..req("parent", "{}")
        })
        .unwrap();
        let r = claim(&e, &pool);
        assert!(matches!(
            wait(&e, &r, "kid", invoke(timeout)),
            WaitBegin::Open
        ));
        invokers.push(r.id);
        if i == 0 {
            e.cancel(&r.id.to_string(), true, &TenantArg::Missing)
                .unwrap();
        } else {
            parked(&e, &r);
        }
        if i == 1 {
            e.advance_time(1_001);
        }
    }
    let step = e
        .find_step(&TenantArg::Missing, &invokers[3].to_string(), "kid")
        .unwrap()
        .expect("the last invoker's wait");
    let Some(WaitSpec::Child { child_run_id, .. }) = WaitSpec::of_step(&step) else {
        panic!("a child wait: {step:?}");
    };
    let child = row_of(&e, &child_run_id);
    assert!(!child.status.is_terminal());
    let waiters: Vec<RunId> = child.awaited_by().iter().map(|(w, _)| *w).collect();
    assert_eq!(waiters, vec![invokers[2], invokers[3]]);
}

/// An invoke answered by a live child (a dedupe hit) while that child's
/// completion commits in another transaction: the invoke must see the end
/// (and answer with it), not add its wait to a child that already ended,
/// which would leave its run waiting for ever. The completion is held
/// open on another connection, as a worker's settle in flight.
#[test]
fn an_invoke_hitting_a_child_that_completes_meanwhile_answers_with_its_end() {
    let Some((e, cfg)) = engine("invokerace") else {
        return;
    };
    e.register(spec("parent")).unwrap();
    e.register(DefinitionSpec {
        dedupe_key: Some("c:{{k}}".to_owned()),
        dedupe_window_ms: Some(60_000),
        ..spec("child")
    })
    .unwrap();
    let invoke = || WaitRequest::Child {
        start: Box::new(req("child", r#"{"k":1}"#)),
        timeout_ms: None,
    };
    let p1 = e.start(req("parent", "{}")).unwrap();
    let c1 = claim(&e, "batch");
    assert_eq!(c1.id, p1.id);
    assert!(matches!(wait(&e, &c1, "kid", invoke()), WaitBegin::Open));
    let kid = claim(&e, "batch");
    let p2 = e.start(req("parent", "{}")).unwrap();
    let c2 = claim(&e, "batch");
    assert_eq!(c2.id, p2.id);

    // Another engine (another process) invokes; made first, as its
    // migrate would queue behind the transaction held open below.
    let e2 = Arc::new(engine_on(&cfg));
    e2.register(spec("parent")).unwrap();
    e2.register(DefinitionSpec {
        dedupe_key: Some("c:{{k}}".to_owned()),
        dedupe_window_ms: Some(60_000),
        ..spec("child")
    })
    .unwrap();

    // The child's completion, in flight: row locked and changed, not committed.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (commit_tx, commit_rx) = std::sync::mpsc::channel::<()>();
    let (url, schema, kid_id) = (cfg.url.clone(), cfg.schema.clone(), kid.id);
    let completer = std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = client.transaction().unwrap();
        tx.execute(
            &format!(
                "UPDATE \"{schema}\".job_run SET status = 'completed', output = '{{\"r\":7}}', \
                 finished_at = now(), executing = false WHERE id = $1"
            ),
            &[&kid_id],
        )
        .unwrap();
        locked_tx.send(()).unwrap();
        let _ = commit_rx.recv_timeout(std::time::Duration::from_secs(10));
        tx.commit().unwrap();
    });
    locked_rx.recv().unwrap();
    let invoker = {
        let (id, epoch) = (c2.id.to_string(), c2.claim_epoch);
        std::thread::spawn(move || e2.wait_begin(&id, epoch, "kid", invoke()))
    };
    // Once the invoke waits for the child's row lock (it has read the
    // child as it was before the completion), the completion commits.
    let mut watch = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let waiting: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock'",
                &[&format!("jobforge:{}", cfg.schema)],
            )
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the invoke never reached the child's row"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    commit_tx.send(()).unwrap();
    completer.join().unwrap();
    let answer = invoker.join().unwrap().unwrap();
    assert_eq!(
        done_with(answer).as_deref(),
        Some(r#"{"r": 7}"#),
        "the invoke must answer with the end it waited behind"
    );
}

// ── redelivery ─────────────────────────────────────────────────────────

/// A run returned to `pending` without an outcome keeps its due time, so
/// it is claimed before the runs started after it: whether its attempt was
/// released (a shutdown) or its lease expired (its worker died; here
/// another process's sweeper returns it).
#[test]
fn a_released_or_swept_run_keeps_its_due_time_and_is_claimed_before_runs_started_after_it() {
    let Some((e, cfg)) = manual_engine("redeliver") else {
        return;
    };
    e.register(spec("t")).unwrap();
    let a = e.start(req("t", r#"{"n":0}"#)).unwrap();
    let c1 = claim(&e, "batch");
    assert_eq!(c1.id, a.id);
    e.advance_time(10);
    let b = e.start(req("t", r#"{"n":1}"#)).unwrap();
    e.advance_time(10);
    let c = e.start(req("t", r#"{"n":2}"#)).unwrap();
    e.advance_time(10);

    // Released (stop()): back in its place, ahead of b and c.
    assert!(e.release_attempt(&a.id, c1.claim_epoch).unwrap());
    let back = row_of(&e, &a.id);
    assert_eq!(back.status, RunStatus::Pending);
    assert_eq!(back.run_at, a.run_at, "release keeps the due time");
    let c2 = claim(&e, "batch");
    assert_eq!(c2.id, a.id, "the released run is claimed first");

    // Its worker dies; once its lease expires another process sweeps it.
    let other = engine_clocked(&cfg, ClockKind::Manual);
    e.advance_time(5_000);
    other.advance_time((e.now() - other.now()).max(0));
    assert_eq!(jobforge_core::worker::sweep(&other, 1_000).unwrap(), 1);
    let swept = row_of(&e, &a.id);
    assert_eq!(swept.status, RunStatus::Pending);
    assert_eq!(swept.run_at, a.run_at, "the sweep keeps the due time");
    assert_eq!(swept.attempts, 0, "a lost attempt is not counted");
    let order: Vec<RunId> = (0..3).map(|_| claim(&other, "batch").id).collect();
    assert_eq!(order, vec![a.id, b.id, c.id]);
}

// ── stored text ────────────────────────────────────────────────────────

/// PostgreSQL cannot hold NUL in an error's texts and keeps U+FFFD: the
/// rows the engine answers with (an applied outcome, a recorded step) are
/// the rows a read returns, not the in-memory copies with the raw text.
#[test]
fn an_error_holding_nul_is_answered_as_it_is_stored() {
    let Some((e, _)) = engine("nulerr") else {
        return;
    };
    e.register(spec("t")).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let c = claim(&e, "batch");
    let failed = e
        .finish_attempt(
            &run.id,
            c.claim_epoch,
            AttemptOutcome::Failed(FailureInfo {
                message: "a\0b".to_owned(),
                stack: Some("Error: a\0b\n    at x".to_owned()),
                name: Some("Error".to_owned()),
                code: None,
            }),
        )
        .unwrap()
        .expect("the failed row");
    let stored = row_of(&e, &run.id);
    let (answered, read) = (failed.error().unwrap(), stored.error().unwrap());
    assert_eq!(read.message, "a\u{FFFD}b");
    assert_eq!(answered.message, read.message, "the settle answer");
    assert_eq!(read.stack.as_deref(), Some("Error: a\u{FFFD}b\n    at x"));
    assert_eq!(answered.stack, read.stack);

    let recorded = e
        .record_step(
            &TenantArg::Missing,
            jobforge_core::engine::RecordStep {
                job_run_id: run.id.to_string(),
                step_id: "s".to_owned(),
                seq: 0,
                status: StepStatus::Failed,
                input: None,
                output: None,
                error: Some(RunError {
                    message: "x\0y".to_owned(),
                    stack: None,
                    retryable: false,
                    attempt: 1,
                }),
                attempts: Some(1),
                started_at: None,
                finished_at: None,
            },
        )
        .unwrap();
    let steps = e
        .list_steps(&run.id.to_string(), &TenantArg::Missing)
        .unwrap();
    let read = steps[0].error.as_deref().unwrap();
    assert_eq!(read.message, "x\u{FFFD}y");
    assert_eq!(recorded.error.as_deref().unwrap().message, read.message);
}

// ── reads on a fresh connection ────────────────────────────────────────

/// Runs `f` on a thread while this store's table is locked, so its first
/// statement waits on the server, and ends its backend while it waits
/// (as `pg_terminate_backend`, a failover or a restart would mid-query);
/// then lets the table go and answers what `f` returned.
fn cut_off_mid_query<T: Send + 'static>(
    cfg: &PgConfig,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let mut locker = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute(&format!(
        "LOCK TABLE \"{}\".job_run IN ACCESS EXCLUSIVE MODE",
        cfg.schema
    ))
    .unwrap();
    let call = std::thread::spawn(f);
    let mut admin = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let app = format!("jobforge:{}", cfg.schema);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let pid: i32 = loop {
        let rows = admin
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
                 AND wait_event_type = 'Lock'",
                &[&app],
            )
            .unwrap();
        if let Some(r) = rows.first() {
            break r.get(0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the call never waited"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .unwrap();
    // A call that tries again waits for the table on a new connection.
    std::thread::sleep(std::time::Duration::from_millis(50));
    lock.rollback().unwrap();
    call.join().unwrap()
}

/// A read cut off mid-query runs again on a fresh connection instead of
/// failing (before, it failed whenever the client had not yet seen the
/// close when the server's FATAL reached the caller). A write is never run
/// again: it fails, and its dead connection is not handed out again.
#[test]
fn a_read_cut_off_mid_query_runs_again_on_a_fresh_connection() {
    let Some((e, cfg)) = engine("midread") else {
        return;
    };
    e.register(spec("t")).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let e = Arc::new(e);
    for round in 0..5 {
        let (e2, id) = (e.clone(), run.id.to_string());
        let back = cut_off_mid_query(&cfg, move || e2.find_by_id(&id, &TenantArg::Missing));
        assert_eq!(
            back.map(|r| r.map(|r| r.status)).map_err(|e| e.to_string()),
            Ok(Some(RunStatus::Pending)),
            "round {round}: the read whose backend was ended mid-query"
        );
    }
    let (e2, id) = (e.clone(), run.id.to_string());
    let canceled = cut_off_mid_query(&cfg, move || e2.cancel(&id, true, &TenantArg::Missing));
    match canceled {
        Err(JobError::Store { retryable, .. }) => assert!(retryable),
        other => panic!("a write cut off mid-query fails, not runs again: {other:?}"),
    }
    assert_eq!(row_of(&e, &run.id).status, RunStatus::Pending);
}

/// A parent asking again for its invoked child (a resumption) only looks at
/// the child's row: it must not wait for the child's lock, which a child's
/// end holds while it resumes the parent — child → parent against parent →
/// child deadlocked fan-outs (`StoreTx::peek_run`).
#[test]
fn a_parent_rejoining_its_child_wait_takes_no_lock_on_the_child() {
    let Some((e, cfg)) = manual_engine("rejoin") else {
        return;
    };
    e.register(spec("parent")).unwrap();
    e.register(DefinitionSpec {
        pool: Some("kids".to_owned()),
        ..spec("child")
    })
    .unwrap();
    let p = e.start(req("parent", "{}")).unwrap();
    let c = claim(&e, "batch");
    let invoke = || WaitRequest::Child {
        start: Box::new(req("child", "{}")),
        timeout_ms: None,
    };
    assert!(matches!(wait(&e, &c, "kid", invoke()), WaitBegin::Open));
    let until = e.now() + 10;
    let nap = WaitRequest::Sleep { until };
    assert!(matches!(wait(&e, &c, "nap", nap), WaitBegin::Open));
    parked(&e, &c);
    e.advance_time(10);
    e.resume_due_waits_then_next().unwrap();
    let again = claim(&e, "batch");
    assert_eq!(again.id, p.id);
    let step = e
        .find_step(&TenantArg::Missing, &p.id.to_string(), "kid")
        .unwrap()
        .unwrap();
    let Some(WaitSpec::Child { child_run_id, .. }) = WaitSpec::of_step(&step) else {
        panic!("a child wait: {step:?}");
    };
    let release = hold_row_locks(&cfg, vec![child_run_id]);
    let t0 = std::time::Instant::now();
    assert!(matches!(wait(&e, &again, "kid", invoke()), WaitBegin::Open));
    let took = t0.elapsed();
    let _ = release.send(());
    assert!(
        took < std::time::Duration::from_secs(3),
        "the rejoin waited {took:?} for the child's lock"
    );
}

// ── start_many ─────────────────────────────────────────────────────────

/// A batch on PostgreSQL: rules in entry order (a lane run between plain
/// ones draws its `seq` under the lane lock, the plain ones from a block),
/// the rows written with one multi-row insert, claimed in entry order; an
/// entry refused rolls the batch back.
#[test]
fn start_many_on_postgres() {
    let Some((e, _)) = engine("many") else { return };
    e.register(spec("p")).unwrap();
    e.register(DefinitionSpec {
        concurrency_key: Some("k:{{k}}".to_owned()),
        collision_mode: Some(CollisionMode::Reject),
        ..spec("x")
    })
    .unwrap();
    e.register(DefinitionSpec {
        dedupe_key: Some("d:{{k}}".to_owned()),
        dedupe_window_ms: Some(60_000),
        ..spec("d")
    })
    .unwrap();
    let rows = e
        .start_many(vec![
            req("p", "{}"),
            req("d", r#"{"k":1}"#),
            req("x", r#"{"k":1}"#),
            req("p", "{}"),
            req("d", r#"{"k":1}"#),
            req("p", "{}"),
        ])
        .unwrap();
    assert_eq!(rows[4].id, rows[1].id, "deduped onto the batch's own run");
    let seqs: Vec<u64> = [0, 1, 2, 3, 5].iter().map(|&i| rows[i].seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs ascend: {seqs:?}"
    );
    for i in [0, 1, 2, 3, 5] {
        let back = e
            .find_by_id(&rows[i].id.to_string(), &TenantArg::Missing)
            .unwrap()
            .unwrap();
        assert_eq!(
            (back.seq, back.job_type.clone()),
            (rows[i].seq, rows[i].job_type.clone())
        );
    }
    let before = e.count_runs(&TenantArg::Missing).unwrap();
    assert_eq!(before, 5);
    // The lane an earlier entry took refuses a later one: nothing stored.
    let err = e
        .start_many(vec![
            req("p", "{}"),
            req("x", r#"{"k":2}"#),
            req("x", r#"{"k":2}"#),
        ])
        .unwrap_err();
    assert_eq!((err.index, err.error.code()), (Some(2), "JOB_COLLISION"));
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), before);
    let order: Vec<RunId> =
        std::iter::from_fn(|| e.claim_next("batch").unwrap().map(|r| r.id)).collect();
    assert_eq!(
        order,
        vec![rows[0].id, rows[1].id, rows[2].id, rows[3].id, rows[5].id]
    );
    // A big batch: one statement for its rows.
    let big: Vec<StartRequest> = (0..2_000)
        .map(|i| req("p", &format!("{{\"i\":{i}}}")))
        .collect();
    assert_eq!(e.start_many(big).unwrap().len(), 2_000);
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), before + 2_000);
    // A group: the refused start alone fails.
    let answers = e
        .start_group(vec![
            req("x", r#"{"k":1}"#),
            req("p", "{}"),
            req("x", r#"{"k":3}"#),
        ])
        .unwrap();
    assert_eq!(answers[0].as_ref().unwrap_err().code(), "JOB_COLLISION");
    assert!(answers[1].is_ok() && answers[2].is_ok());
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), before + 2_002);
}

/// A transaction the server rolls back to break a deadlock changed nothing
/// and is run again (`JobError::runs_again`, `Engine::again`, which every
/// operation of the binding goes through): a cancel cascade locks parent
/// then child while another transaction holds the child and then asks for
/// the parent (as a child's end resuming its parent does).
#[test]
fn a_call_the_server_rolled_back_to_break_a_deadlock_runs_again() {
    let Some((e, cfg)) = engine("deadlock") else {
        return;
    };
    e.register(spec("parent")).unwrap();
    e.register(spec("child")).unwrap();
    let parent = e.start(req("parent", "{}")).unwrap();
    let child = e
        .start(StartRequest {
            parent_run_id: Some(parent.id.to_string()),
            ..req("child", "{}")
        })
        .unwrap();
    let (url, schema) = (cfg.url.clone(), cfg.schema.clone());
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        let mut tx = c.transaction().unwrap();
        // The engine's session detects the cycle (1 s), so it is the one rolled back.
        tx.execute("SET LOCAL deadlock_timeout = '20s'", &[])
            .unwrap();
        let lock = format!("SELECT 1 FROM \"{schema}\".job_run WHERE id = $1 FOR UPDATE");
        tx.execute(&lock, &[&child.id]).unwrap();
        locked_tx.send(()).unwrap();
        // Let the cancel lock the parent and wait for the child.
        std::thread::sleep(std::time::Duration::from_millis(300));
        tx.execute(&lock, &[&parent.id]).unwrap();
        tx.commit().unwrap();
    });
    locked_rx.recv().unwrap();
    let id = parent.id.to_string();
    let mut tries = 0;
    let out = e.again(
        || {
            tries += 1;
            e.cancel(&id, true, &TenantArg::Missing)
        },
        JobError::runs_again,
    );
    other.join().unwrap();
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(tries, 2, "the first try was the deadlock's victim");
    assert_eq!(row_of(&e, &parent.id).status, RunStatus::Canceled);
    assert_eq!(row_of(&e, &child.id).status, RunStatus::Canceled);
}

/// Keeps what a worker dispatched (handlers that run until the test
/// reports them).
struct Dispatched(Arc<std::sync::Mutex<Vec<AttemptTicket>>>);

impl worker::BatchDispatcher for Dispatched {
    fn dispatch(&self, tickets: Vec<AttemptTicket>) -> bool {
        self.0.lock().unwrap().extend(tickets);
        true
    }
}

/// A prefetched run canceled where this process never hears of it (the
/// row changed in SQL: no notification) is not started: the heartbeat
/// finds its attempt is no longer running and drops it from the queue,
/// and the slot that frees next takes nothing.
#[test]
fn a_prefetched_run_canceled_unheard_is_dropped_by_the_heartbeat() {
    use std::time::{Duration, Instant};
    let Some((e, cfg)) = engine("lostq") else {
        return;
    };
    e.register(spec("q")).unwrap();
    let first = e.start(req("q", r#"{"i":0}"#)).unwrap().id;
    std::thread::sleep(Duration::from_millis(2)); // claimed first
    let queued = e.start(req("q", r#"{"i":1}"#)).unwrap().id;
    let e = Arc::new(e);
    let w = worker::Worker::with_timings(
        e.clone(),
        vec![worker::WorkerPool::new("batch", 1)],
        worker::WorkerTimings {
            lease_ms: 300, // a heartbeat every 100 ms
            poll_ms: 50,
            prefetch: None,
        },
    );
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The worker on a runtime of its own; this thread (the test's, as JS
    // would) reports and blocks on the database.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let looping = rt.spawn(w.clone().run(Dispatched(got.clone())));
    fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    until("one run executing, one prefetched", || {
        got.lock().unwrap().len() == 1 && w.pools()[0].prefetched() == 1
    });
    let executing: AttemptTicket = got.lock().unwrap()[0].clone();
    assert_eq!(executing.run.id, first);
    // Canceled behind this process's back: no NOTIFY reaches it.
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let n = c
        .execute(
            &format!(
                "UPDATE \"{}\".job_run SET status = 'canceled', finished_at = now() \
                 WHERE id = $1 AND status = 'running'",
                cfg.schema
            ),
            &[&queued],
        )
        .unwrap();
    assert_eq!(n, 1);
    until(
        "the heartbeat to drop the canceled run from the queue",
        || w.pools()[0].prefetched() == 0,
    );
    // The slot frees: nothing prefetched is left to start.
    let (handed, error) = w.report(vec![(
        executing.run.id,
        executing.epoch,
        Some(AttemptOutcome::Completed(None)),
        0,
    )]);
    assert!(error.is_none());
    assert!(handed.is_empty(), "the canceled run was handed out");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        got.lock().unwrap().iter().all(|t| t.run.id != queued),
        "the canceled run was started"
    );
    w.stop();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), looping).await })
        .unwrap()
        .unwrap();
    let row = e
        .find_by_id(&queued.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(row.status, RunStatus::Canceled);
}

/// The sweeper returns the expired leases it finds in one transaction
/// (their rows share the xmin of the transaction that wrote them), not
/// one transaction per run.
#[test]
fn the_sweeper_releases_expired_leases_in_one_transaction() {
    let Some((e, cfg)) = engine("sweep1") else {
        return;
    };
    e.register(spec("w")).unwrap();
    for i in 0..5 {
        e.start(req("w", &format!(r#"{{"i":{i}}}"#))).unwrap();
    }
    let Settled { tickets, .. } = e.settle(Vec::new(), &[(Arc::from("batch"), 5)]).unwrap();
    assert_eq!(tickets.len(), 5);
    let mut c = postgres::Client::connect(&cfg.url, postgres::NoTls).unwrap();
    let s = format!("\"{}\"", cfg.schema);
    // Their worker is gone: leases a minute old.
    c.batch_execute(&format!(
        "UPDATE {s}.job_run SET claimed_at = claimed_at - interval '1 minute'"
    ))
    .unwrap();
    assert_eq!(worker::sweep(&e, 30_000).unwrap(), 5);
    let row = c
        .query_one(
            &format!(
                "SELECT count(*)::int, count(DISTINCT xmin::text)::int FROM {s}.job_run \
                 WHERE status = 'pending'"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 5);
    assert_eq!(row.get::<_, i32>(1), 1, "one transaction released them all");
}
