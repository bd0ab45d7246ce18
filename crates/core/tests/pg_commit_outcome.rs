//! A COMMIT whose answer never arrives: the store reads back whether it
//! landed and answers as it did, or says the outcome is unknown when it
//! cannot find out in time. The connection is cut by a proxy of this test
//! between the store and the server, at the COMMIT: once after forwarding
//! it and reading the server's answer (the commit landed, the client never
//! hears of it), once without forwarding it (nothing landed). Needs a
//! server: `JOBFORGE_PG_URL`, as `postgres.rs` (skips without one unless
//! `JOBFORGE_REQUIRE_PG=1`).

use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::*;
use serde_json::value::RawValue;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn url() -> String {
    std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The simple-protocol message the store commits with.
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// Relay everything.
    Pass,
    /// At the next COMMIT: forward it, swallow the server's answer, cut.
    LoseAnswer,
    /// At the next COMMIT: cut without forwarding it.
    LoseCommit,
    /// Accept connections and close them at once (the server unreachable).
    Refuse,
}

struct Proxy {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    /// The mode after the cut.
    after: Arc<Mutex<Mode>>,
}

impl Proxy {
    fn start(server: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let after = Arc::new(Mutex::new(Mode::Pass));
        let (m, a) = (mode.clone(), after.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if *m.lock().unwrap() == Mode::Refuse {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect((server.0.as_str(), server.1)) else {
                    continue;
                };
                relay(client, server, m.clone(), a.clone());
            }
        });
        Proxy { port, mode, after }
    }

    fn arm(&self, at_commit: Mode, after: Mode) {
        *self.after.lock().unwrap() = after;
        *self.mode.lock().unwrap() = at_commit;
    }
}

fn cut(a: &TcpStream, b: &TcpStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

fn relay(client: TcpStream, server: TcpStream, mode: Arc<Mutex<Mode>>, after: Arc<Mutex<Mode>>) {
    let swallow = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let sw = swallow.clone();
    // Server to client: after a forwarded COMMIT, its answer is read and
    // dropped, and the connection cut.
    std::thread::spawn(move || {
        let (mut from, mut to) = (s2, c2);
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if sw.load(Ordering::SeqCst) {
                cut(&from, &to);
                return;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        cut(&from, &to);
    });
    std::thread::spawn(move || {
        let (mut from, mut to) = (client, server);
        let mut buf = [0u8; 65536];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let chunk = &buf[..n];
            let commit = chunk.windows(COMMIT.len()).any(|w| w == COMMIT);
            let now = *mode.lock().unwrap();
            if commit && now != Mode::Pass {
                *mode.lock().unwrap() = *after.lock().unwrap();
                if now == Mode::LoseCommit {
                    cut(&from, &to);
                    return;
                }
                swallow.store(true, Ordering::SeqCst);
            }
            if to.write_all(chunk).is_err() {
                break;
            }
        }
        cut(&from, &to);
    });
}

/// An engine on a fresh schema reached through a proxy, or None (skip).
fn setup(
    tag: &str,
    connect_timeout_s: u32,
) -> Option<(Engine<PgStore>, Proxy, postgres::Client, String)> {
    setup_on(&url(), tag, connect_timeout_s, ClockKind::System)
}

/// `setup` on the server at `url`.
fn setup_on(
    url: &str,
    tag: &str,
    connect_timeout_s: u32,
    clock: ClockKind,
) -> Option<(Engine<PgStore>, Proxy, postgres::Client, String)> {
    let schema = format!("jf_rs_co_{tag}_{}", std::process::id());
    let mut direct = match postgres::Client::connect(url, postgres::NoTls) {
        Ok(c) => c,
        Err(e) => {
            if std::env::var("JOBFORGE_REQUIRE_PG").is_ok_and(|v| v == "1") {
                panic!("JOBFORGE_REQUIRE_PG=1 but PostgreSQL is unreachable: {e}");
            }
            eprintln!("skipping postgres test: no server at JOBFORGE_PG_URL ({e})");
            return None;
        }
    };
    direct
        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .unwrap();
    let cfg: postgres::Config = url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        postgres::config::Host::Tcp(h) => h.clone(),
        #[allow(unreachable_patterns)]
        _ => panic!("these tests need a TCP server address"),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start((host, port));
    let user = cfg.get_user().unwrap_or("postgres");
    let db = cfg.get_dbname().unwrap_or("test");
    let mut pc = PgConfig::new(format!(
        "postgres://{user}@127.0.0.1:{}/{db}?connect_timeout={connect_timeout_s}",
        proxy.port
    ));
    pc.schema = schema.clone();
    pc.max_connections = 2;
    let store = PgStore::new(pc).unwrap();
    store.migrate().unwrap();
    let e = Engine::new(
        store,
        EngineOptions {
            multi_tenant: false,
            clock,
            retention: Default::default(),
        },
    );
    e.register(DefinitionSpec {
        job_type: "a".to_owned(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    Some((e, proxy, direct, schema))
}

fn start_req(input: &str) -> StartRequest {
    StartRequest {
        job_type: "a".to_owned(),
        input: RawValue::from_string(input.to_owned()).unwrap(),
        ..StartRequest::default()
    }
}

fn stored(direct: &mut postgres::Client, schema: &str, input: &str) -> i64 {
    direct
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".job_run WHERE input = $1::text::jsonb"),
            &[&input],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_commit_whose_answer_was_lost_answers_with_what_it_stored() {
    let Some((e, proxy, mut direct, schema)) = setup("answer", 10) else {
        return;
    };
    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let row = e
        .start(start_req(r#"{"n":1}"#))
        .expect("the commit landed: the start succeeds");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert_eq!(stored(&mut direct, &schema, r#"{"n":1}"#), 1);
    let found = e
        .find_by_id(&row.id.to_string(), &TenantArg::Missing)
        .unwrap();
    assert_eq!(found.map(|r| r.id), Some(row.id));

    // A claim whose answer was lost: the worker gets the run it holds.
    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let tickets = e
        .claim_attempts(&row.pool, 5)
        .expect("the claim landed: its tickets come back");
    assert_eq!(
        tickets.iter().map(|t| t.run.id).collect::<Vec<_>>(),
        vec![row.id]
    );
    let now = e
        .find_by_id(&row.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(now.status, RunStatus::Running);
    assert_eq!(now.claim_epoch, tickets[0].epoch);
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

#[test]
fn a_commit_that_never_reached_the_server_changed_nothing_and_runs_again() {
    let Some((e, proxy, mut direct, schema)) = setup("lost", 10) else {
        return;
    };
    proxy.arm(Mode::LoseCommit, Mode::Pass);
    let err = e
        .start(start_req(r#"{"n":2}"#))
        .expect_err("nothing committed");
    match &err {
        JobError::Store {
            retryable, outcome, ..
        } => {
            assert!(*retryable);
            assert_eq!(*outcome, StoreOutcome::Lost, "{err}");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(
        stored(&mut direct, &schema, r#"{"n":2}"#),
        0,
        "a rejected start is not stored"
    );

    // Run again (as the binding runs every operation): one run.
    proxy.arm(Mode::LoseCommit, Mode::Pass);
    let row = e
        .again(|| e.start(start_req(r#"{"n":3}"#)), JobError::runs_again)
        .expect("the second try commits");
    assert_eq!(stored(&mut direct, &schema, r#"{"n":3}"#), 1);
    assert_eq!(row.status, RunStatus::Pending);
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

#[test]
fn a_commit_that_cannot_be_read_back_in_time_is_an_unknown_outcome_not_a_rollback() {
    let Some((e, proxy, mut direct, schema)) = setup("unknown", 1) else {
        return;
    };
    proxy.arm(Mode::LoseAnswer, Mode::Refuse);
    let t0 = Instant::now();
    let err = e.start(start_req(r#"{"n":4}"#)).expect_err("cannot tell");
    let took = t0.elapsed();
    match &err {
        JobError::Store {
            retryable, outcome, ..
        } => {
            assert!(!*retryable, "an unknown outcome is not retryable");
            assert_eq!(*outcome, StoreOutcome::Unknown, "{err}");
            assert_eq!(err.fields_json()["outcome"], "unknown");
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "the read-back is tried for the connect timeout (1 s), took {took:?}"
    );
    // It had landed: "unknown" was the honest answer.
    assert_eq!(stored(&mut direct, &schema, r#"{"n":4}"#), 1);
    *proxy.mode.lock().unwrap() = Mode::Pass;
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

#[test]
fn cancel_replay_and_record_step_whose_answers_were_lost_answer_with_what_they_stored() {
    let Some((e, proxy, mut direct, schema)) = setup("ops", 10) else {
        return;
    };
    let run = e.start(start_req(r#"{"n":5}"#)).unwrap();
    let id = run.id.to_string();
    let status = |direct: &mut postgres::Client| -> String {
        direct
            .query_one(
                &format!("SELECT status FROM \"{schema}\".job_run WHERE id = $1"),
                &[&run.id],
            )
            .unwrap()
            .get(0)
    };

    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    e.cancel(&id, true, &TenantArg::Missing)
        .expect("the cancel landed");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert_eq!(status(&mut direct), "canceled");

    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let replayed = e
        .replay(&id, &TenantArg::Missing)
        .expect("the replay landed");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert_eq!(replayed.status, RunStatus::Pending);
    assert_eq!(status(&mut direct), "pending");

    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let step = e
        .record_step(
            &TenantArg::Missing,
            jobforge_core::engine::RecordStep {
                job_run_id: id.clone(),
                step_id: "s".to_owned(),
                seq: 0,
                status: StepStatus::Completed,
                input: None,
                output: Some(RawValue::from_string("7".to_owned()).unwrap()),
                error: None,
                attempts: Some(1),
                started_at: None,
                finished_at: None,
            },
        )
        .expect("the step landed");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert_eq!(step.status, StepStatus::Completed);
    let n: i64 = direct
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".job_step WHERE job_run_id = $1"),
            &[&run.id],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

/// The runs and epochs a claim took.
#[test]
fn start_many_and_signal_whose_answers_were_lost_answer_with_what_they_stored_once() {
    let Some((e, proxy, mut direct, schema)) = setup("many", 10) else {
        return;
    };
    let count = |direct: &mut postgres::Client, sql: &str| -> i64 {
        direct
            .query_one(&sql.replace("{S}", &format!("\"{schema}\"")), &[])
            .unwrap()
            .get(0)
    };

    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let runs = e
        .start_many(vec![start_req(r#"{"m":1}"#), start_req(r#"{"m":2}"#)])
        .expect("the batch landed");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert_eq!(runs.len(), 2);
    assert_eq!(
        count(
            &mut direct,
            "SELECT count(*) FROM {S}.job_run WHERE input ? 'm'"
        ),
        2,
        "stored once, with the ids it answered"
    );
    for r in &runs {
        assert!(e.run_row(&r.id).is_some());
    }

    let id = runs[0].id.to_string();
    proxy.arm(Mode::LoseAnswer, Mode::Pass);
    let delivered = e
        .signal(
            &id,
            "go",
            Some(RawValue::from_string("1".to_owned()).unwrap()),
            &TenantArg::Missing,
        )
        .expect("the signal landed");
    assert_eq!(*proxy.mode.lock().unwrap(), Mode::Pass, "the cut happened");
    assert!(!delivered, "no wait took it: kept in the inbox");
    assert_eq!(
        count(&mut direct, "SELECT count(*) FROM {S}.job_signal"),
        1,
        "kept once, not sent again"
    );
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

fn claims(tickets: &[AttemptTicket]) -> Vec<(RunId, u32)> {
    tickets.iter().map(|t| (t.run.id, t.epoch)).collect()
}

/// The store error of an unknown outcome.
fn assert_unknown(err: &JobError) {
    match err {
        JobError::Store { outcome, .. } => assert_eq!(*outcome, StoreOutcome::Unknown, "{err}"),
        other => panic!("expected a store error, got {other:?}"),
    }
}

#[test]
fn a_claim_whose_outcome_stayed_unknown_is_released_after_the_next_write_not_left_to_its_lease() {
    let Some((e, proxy, mut direct, schema)) = setup("orphan", 1) else {
        return;
    };
    let row = e.start(start_req(r#"{"n":7}"#)).unwrap();
    let stored_claim = |direct: &mut postgres::Client| -> (String, i32) {
        let r = direct
            .query_one(
                &format!("SELECT status, claim_epoch FROM \"{schema}\".job_run WHERE id = $1"),
                &[&row.id],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };

    // The claim lands; its answer is lost and the server stays out of
    // reach past the connect timeout: nobody holds the run it claimed.
    proxy.arm(Mode::LoseAnswer, Mode::Refuse);
    let err = e
        .claim_attempts(&row.pool, 5)
        .expect_err("the outcome cannot be told");
    assert_unknown(&err);
    assert_eq!(stored_claim(&mut direct), ("running".to_owned(), 1));

    // The server answers again: after the first write that succeeds, the
    // orphan is released (its lease of 30 s has not run out), and the next
    // claim takes it again, in its place, under a new epoch.
    *proxy.mode.lock().unwrap() = Mode::Pass;
    let other = e.start(start_req(r#"{"n":8}"#)).unwrap();
    assert_eq!(stored_claim(&mut direct), ("pending".to_owned(), 1));
    assert!(!e.store().has_orphans(), "resolved");
    let tickets = e.claim_attempts(&row.pool, 1).expect("claims again");
    assert_eq!(
        claims(&tickets),
        vec![(row.id, 2)],
        "the orphaned claim was released and claimed again"
    );
    assert_eq!(stored_claim(&mut direct), ("running".to_owned(), 2));

    // A claim whose COMMIT never reached the server: the read-back is as
    // unknown, but the server rolled it back, so nothing is released
    // later (the run claimed above stays held by its epoch 2).
    proxy.arm(Mode::LoseCommit, Mode::Refuse);
    let err = e
        .claim_attempts(&row.pool, 5)
        .expect_err("the outcome cannot be told");
    assert_unknown(&err);
    *proxy.mode.lock().unwrap() = Mode::Pass;
    let tickets = e.claim_attempts(&row.pool, 5).expect("claims");
    assert_eq!(
        claims(&tickets),
        vec![(other.id, 1)],
        "the rolled-back claim left the run pending; the held one is untouched"
    );
    assert_eq!(stored_claim(&mut direct), ("running".to_owned(), 2));
    assert!(!e.store().has_orphans(), "resolved");
    direct
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .unwrap();
}

// ── across a server restart ────────────────────────────────────────────

/// A PostgreSQL cluster of this test's own, which it may crash: Debian's
/// `pg_createcluster` as root, on a port of its own, dropped when this
/// drops. `None`, with the reason printed, where that cannot be done (CI
/// runs as root with postgresql-common: there it runs).
struct CrashableCluster {
    version: String,
    name: String,
    port: u16,
}

impl CrashableCluster {
    /// `slot`: a number of its own per test (tests run in parallel: the
    /// cluster's name and port must differ).
    fn create(slot: u16) -> Option<CrashableCluster> {
        let skip = |why: &str| {
            eprintln!("skipping the server-restart test: it {why}");
            None
        };
        let uid = std::process::Command::new("id").arg("-u").output();
        if !uid.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0") {
            return skip("needs root (pg_createcluster / pg_ctlcluster)");
        }
        let Ok(dirs) = std::fs::read_dir("/usr/lib/postgresql") else {
            return skip("needs a PostgreSQL server under /usr/lib/postgresql");
        };
        let Some(version) = dirs
            .flatten()
            .filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok())
            .max()
        else {
            return skip("needs a PostgreSQL server under /usr/lib/postgresql");
        };
        let c = CrashableCluster {
            version: version.to_string(),
            name: format!("jf_rs_restart_{}_{slot}", std::process::id()),
            port: 40000 + (std::process::id() % 10000) as u16 * 2 + slot,
        };
        let port = c.port.to_string();
        let created = std::process::Command::new("pg_createcluster")
            .args([
                &c.version,
                &c.name,
                "-p",
                &port,
                "--start",
                "--",
                "--auth=trust",
            ])
            .output();
        match created {
            Ok(o) if o.status.success() => Some(c),
            Ok(o) => panic!(
                "pg_createcluster failed: {}{}",
                String::from_utf8_lossy(&o.stderr),
                String::from_utf8_lossy(&o.stdout)
            ),
            Err(_) => skip("needs Debian's postgresql-common (pg_createcluster)"),
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Crashes the server (`stop -m immediate`: no checkpoint, recovery at
    /// the next start) and starts it again; returns once it accepts
    /// connections.
    fn crash_and_restart(&self) {
        for args in [&["stop", "-m", "immediate"][..], &["start"][..]] {
            let o = std::process::Command::new("pg_ctlcluster")
                .args([&self.version, &self.name])
                .args(args)
                .output()
                .expect("pg_ctlcluster");
            assert!(
                o.status.success(),
                "pg_ctlcluster {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

impl Drop for CrashableCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pg_dropcluster")
            .args([&self.version, &self.name, "--stop"])
            .output();
    }
}

/// A claim of `pool`'s runs whose COMMIT meets `at_commit`, the server then
/// out of reach past the connect timeout: its outcome is unknown.
fn lose_claim(e: &Engine<PgStore>, proxy: &Proxy, at_commit: Mode, pool: &str) {
    proxy.arm(at_commit, Mode::Refuse);
    let err = e
        .claim_attempts(pool, 5)
        .expect_err("the outcome cannot be told");
    assert_unknown(&err);
}

#[test]
fn a_claim_whose_outcome_stayed_unknown_across_a_server_crash_is_released_by_its_rows_not_left_to_its_lease(
) {
    let Some(cluster) = CrashableCluster::create(0) else {
        return;
    };
    let Some((e, proxy, direct, schema)) =
        setup_on(&cluster.url(), "restart", 1, ClockKind::System)
    else {
        return;
    };
    drop(direct);
    let connect = || postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    let stored_claim = |id: &RunId| -> (String, i32) {
        let r = connect()
            .query_one(
                &format!("SELECT status, claim_epoch FROM \"{schema}\".job_run WHERE id = $1"),
                &[id],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    let row = e.start(start_req(r#"{"n":1}"#)).unwrap();

    // The claim lands, its answer is lost, the server stays out of reach
    // past the connect timeout; then it crashes and comes back (its
    // transaction ids may now name other transactions).
    lose_claim(&e, &proxy, Mode::LoseAnswer, &row.pool);
    assert_eq!(stored_claim(&row.id), ("running".to_owned(), 1));
    cluster.crash_and_restart();
    assert_eq!(
        stored_claim(&row.id),
        ("running".to_owned(), 1),
        "the claim's commit survived the crash"
    );
    *proxy.mode.lock().unwrap() = Mode::Pass;

    // The first write that succeeds after it: the row is still as the
    // claim left it, so it is released (its 30 s lease is far off) and
    // claimed again, in its place, under a new epoch.
    let other = e.start(start_req(r#"{"n":2}"#)).unwrap();
    assert_eq!(stored_claim(&row.id), ("pending".to_owned(), 1));
    assert!(!e.store().has_orphans(), "resolved");
    let tickets = e.claim_attempts(&row.pool, 1).expect("claims again");
    assert_eq!(claims(&tickets), vec![(row.id, 2)]);

    // A claim whose COMMIT never reached the server, then a crash: the
    // rows it would have claimed read otherwise, so nothing is released —
    // not the held run, not the run another claim took since.
    lose_claim(&e, &proxy, Mode::LoseCommit, &row.pool);
    cluster.crash_and_restart();
    *proxy.mode.lock().unwrap() = Mode::Pass;
    let tickets = e.claim_attempts(&row.pool, 5).expect("claims");
    assert_eq!(
        claims(&tickets),
        vec![(other.id, 1)],
        "the rolled-back claim left the run pending; the held one is untouched"
    );
    assert!(!e.store().has_orphans(), "resolved");
    assert_eq!(stored_claim(&row.id), ("running".to_owned(), 2));
    assert_eq!(stored_claim(&other.id), ("running".to_owned(), 1));
}

/// A manual clock stands still: a claim after the restart may carry the
/// claim time of the orphan's, so a claim not known to have landed is left
/// to its lease there (released only by the sweeper, never by its row).
#[test]
fn under_a_manual_clock_a_claim_unknown_across_a_server_crash_is_left_to_its_lease() {
    let Some(cluster) = CrashableCluster::create(1) else {
        return;
    };
    let Some((e, proxy, direct, schema)) =
        setup_on(&cluster.url(), "restart_manual", 1, ClockKind::Manual)
    else {
        return;
    };
    drop(direct);
    let row = e.start(start_req(r#"{"n":1}"#)).unwrap();
    lose_claim(&e, &proxy, Mode::LoseAnswer, &row.pool);
    cluster.crash_and_restart();
    *proxy.mode.lock().unwrap() = Mode::Pass;
    e.start(start_req(r#"{"n":2}"#)).unwrap();
    let status: String = postgres::Client::connect(&cluster.url(), postgres::NoTls)
        .unwrap()
        .query_one(
            &format!("SELECT status FROM \"{schema}\".job_run WHERE id = $1"),
            &[&row.id],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        status, "running",
        "not released by its row under a manual clock"
    );
    assert!(
        !e.store().has_orphans(),
        "looked at once, then left to the lease"
    );
}
