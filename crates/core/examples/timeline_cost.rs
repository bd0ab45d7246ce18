//! What the run timeline costs the engine alone (no JS, no napi), memory
//! store: claim + complete of N runs with the timeline on and off, rounds
//! alternating, best of each side:
//! `cargo run --release -p jobforge-core --example timeline_cost`.
use jobforge_core::*;
use serde_json::value::RawValue;
use std::time::Instant;

fn round(n: usize, timeline: bool) -> f64 {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    );
    e.set_timeline(timeline);
    e.register(DefinitionSpec {
        job_type: "t".into(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    for i in 0..n {
        e.start(StartRequest {
            job_type: "t".into(),
            input: RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap(),
            ..StartRequest::default()
        })
        .unwrap();
    }
    let t0 = Instant::now();
    for _ in 0..n {
        let Some(run) = e.claim_next("batch").unwrap() else {
            break;
        };
        e.finish_attempt(&run.id, run.claim_epoch, AttemptOutcome::Completed(None))
            .unwrap();
    }
    t0.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let (mut on, mut off) = (f64::MAX, f64::MAX);
    for r in 0..6 {
        for t in if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let ns = round(n, t);
            if t {
                on = on.min(ns);
            } else {
                off = off.min(ns);
            }
        }
    }
    println!(
        "claim_next + finish_attempt, {n} runs, best of 6: timeline on {on:.0} ns/run, off {off:.0} ns/run: the timeline costs {:.0} ns/run ({:.1} % of the throughput)",
        on - off,
        (1.0 - off / on) * 100.0
    );
}
