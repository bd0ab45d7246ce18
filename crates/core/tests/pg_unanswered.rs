//! A server that accepts connections and never answers (a proxy with no
//! backend, a stopped server): calls fail within the connect timeout
//! instead of waiting forever. Needs no database: the "server" is a
//! listener of this test.

mod common;

use common::silent_server;
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::JobError;
use std::time::{Duration, Instant};

#[test]
fn a_server_that_never_answers_fails_calls_within_the_connect_timeout() {
    let port = silent_server();
    let mut cfg = PgConfig::new(format!(
        "postgres://x@127.0.0.1:{port}/db?connect_timeout=1"
    ));
    cfg.max_connections = 2;
    let store = PgStore::new(cfg).expect("config");
    for attempt in 0..4 {
        let t0 = Instant::now();
        let err = store
            .migrate()
            .expect_err("migrate against a silent server");
        let took = t0.elapsed();
        match &err {
            JobError::Store {
                message, retryable, ..
            } => {
                assert!(*retryable, "a server that does not answer may answer later");
                assert!(message.contains("did not answer"), "message: {message}");
            }
            other => panic!("expected a store error, got {other:?}"),
        }
        // The first two attempts wait out the timeout; once `max_connections`
        // attempts are unanswered, the next fail without another wait.
        if attempt < 2 {
            assert!(
                took >= Duration::from_millis(900),
                "attempt {attempt} gave up after {took:?}"
            );
            assert!(
                took < Duration::from_secs(5),
                "attempt {attempt} took {took:?}"
            );
        } else {
            assert!(
                took < Duration::from_millis(200),
                "attempt {attempt} waited {took:?}"
            );
        }
    }
}
