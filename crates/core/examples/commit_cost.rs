//! What reading a write transaction's id before its COMMIT costs a start
//! (issue 24): per-start time of `Engine::start` on PostgreSQL, and in the
//! same run the time of the one round trip the read adds
//! (`SELECT txid_current_if_assigned()` inside an open transaction), in
//! alternating blocks. `JOBFORGE_PG_URL` (default postgres://postgres@127.0.0.1:5432/test).
//!
//!   cargo run --release -p jobforge-core --example commit_cost [-- <blocks> <per block>]
use jobforge_core::store::postgres::{PgConfig, PgStore};
use jobforge_core::*;
use serde_json::value::RawValue;
use std::time::Instant;

fn main() {
    let url = std::env::var("JOBFORGE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (blocks, per) = (
        args.first().copied().unwrap_or(10),
        args.get(1).copied().unwrap_or(500),
    );
    let schema = format!("jf_commit_cost_{}", std::process::id());
    let mut cfg = PgConfig::new(url.clone());
    cfg.schema = schema.clone();
    cfg.max_connections = 1;
    let store = PgStore::new(cfg).expect("config");
    store.migrate().expect("migrate");
    let e = Engine::new(
        store,
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    );
    e.register(DefinitionSpec {
        job_type: "a".to_owned(),
        ..DefinitionSpec::default()
    })
    .expect("register");
    let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
    c.batch_execute("BEGIN; SELECT txid_current()")
        .expect("begin");
    let (mut starts, mut reads) = (Vec::new(), Vec::new());
    for b in 0..blocks {
        let t0 = Instant::now();
        for i in 0..per {
            let input = RawValue::from_string(format!("{{\"b\":{b},\"i\":{i}}}")).expect("json");
            e.start(StartRequest {
                job_type: "a".to_owned(),
                input,
                ..StartRequest::default()
            })
            .expect("start");
        }
        starts.push(t0.elapsed().as_secs_f64() * 1e6 / per as f64);
        let t0 = Instant::now();
        for _ in 0..per {
            c.simple_query("SELECT txid_current_if_assigned()")
                .expect("xid");
        }
        reads.push(t0.elapsed().as_secs_f64() * 1e6 / per as f64);
    }
    let _ = c.batch_execute("ROLLBACK");
    let _ = c.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"));
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (s, r) = (median(&mut starts), median(&mut reads));
    println!(
        "{blocks} blocks of {per}: a start {s:.0} µs (median of blocks), the xid read {r:.0} µs: {:.1} % of a start",
        r / s * 100.0
    );
}
