//! A connection attempt that fails inside the database driver. Its own
//! test binary (so its own process): it runs the process out of file
//! descriptors for a moment, which would disturb tests beside it.

mod common;

use common::silent_server;
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::JobError;
use std::time::{Duration, Instant};

/// A connection attempt that dies inside the driver (it unwraps the
/// building of its runtime, which fails when the process is out of file
/// descriptors) is an error of that call, not an attempt counted as
/// unanswered for ever: with `max_connections = 1`, such a count would fail
/// every later call at once.
#[test]
fn an_attempt_that_fails_inside_the_driver_is_not_left_counted() {
    let port = silent_server();
    let mut cfg = PgConfig::new(format!(
        "postgres://x@127.0.0.1:{port}/db?connect_timeout=1"
    ));
    cfg.max_connections = 1;
    let store = PgStore::new(cfg).expect("config");
    // Out of file descriptors for the length of one call.
    let mut files = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        files.push(f);
    }
    let during = store.migrate();
    drop(files);
    match during {
        Err(JobError::Store { retryable, .. }) => assert!(retryable),
        other => panic!("expected a store error, got {other:?}"),
    }
    // A real attempt again: it waits out its timeout at the silent server.
    let t0 = Instant::now();
    let err = store.migrate().expect_err("the server is still silent");
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "the next call failed after {took:?} without trying ({err:?})"
    );
}
