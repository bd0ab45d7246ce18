//! Rough per-operation cost of the in-memory engine, without JS:
//! `cargo run --release -p jobforge-core --example start_cost`.
use jobforge_core::*;
use serde_json::value::RawValue;
use std::time::Instant;

/// A fresh engine with one job type `t` (pool `batch`).
fn engine() -> Engine<MemoryStore> {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::System,
            retention: Default::default(),
        },
    );
    e.register(DefinitionSpec {
        job_type: "t".into(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    e
}

/// 250 plain starts of type `t` created at `at`, inputs `{"i":…}`.
fn batch(at: i64) -> Vec<PlainStart<'static>> {
    (0..250)
        .map(|i| PlainStart {
            id: uuid::Uuid::new_v4(),
            at,
            job_type: "t",
            input: RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap(),
        })
        .collect()
}

fn main() {
    let e = engine();
    let n: u32 = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    println!(
        "RunRow: {} bytes (+ RunExtras {} bytes when a run has any)",
        std::mem::size_of::<RunRow>(),
        std::mem::size_of::<RunExtras>()
    );
    let t0 = Instant::now();
    for _ in 0..n {
        let req = StartRequest {
            job_type: "t".into(),
            input: RawValue::from_string("{\"i\":1}".into()).unwrap(),
            ..StartRequest::default()
        };
        let row = e.start(req).unwrap();
        std::hint::black_box(row.to_json());
    }
    println!("start+to_json: {:?}/op", t0.elapsed() / n);
    let t0 = Instant::now();
    for _ in 0..n {
        let req = StartRequest {
            job_type: "t".into(),
            input: RawValue::from_string("{\"i\":1}".into()).unwrap(),
            ..StartRequest::default()
        };
        std::hint::black_box(e.start(req).unwrap());
    }
    println!("start: {:?}/op", t0.elapsed() / n);
    let t0 = Instant::now();
    for _ in 0..n {
        let r = e.claim_next("batch").unwrap().unwrap();
        e.finish_attempt(&r.id, r.claim_epoch, AttemptOutcome::Completed(None))
            .unwrap();
    }
    println!("claim+finish: {:?}/op", t0.elapsed() / n);

    // `start_plain_batch` of 250-run batches into fresh engines of 1,000 runs
    // (the shape JS hands buffered starts over in).
    let rounds = 200u32;
    let mut total = std::time::Duration::ZERO;
    for _ in 0..rounds {
        let e = engine();
        let at = e.now();
        let batches: Vec<Vec<PlainStart>> = (0..4).map(|_| batch(at)).collect();
        let t0 = Instant::now();
        for b in batches {
            std::hint::black_box(e.start_plain_batch(b, false).unwrap());
        }
        total += t0.elapsed();
    }
    println!(
        "start_plain_batch into 1k: {:?}/run",
        total / (rounds * 1000)
    );

    // The same, with 1 MiB of other memory written between batches, as the
    // JS thread does (answering the next 256 starts) before each hand-over:
    // the engine's structures are no longer in cache.
    let mut other = vec![0u8; 1 << 20];
    let mut total = std::time::Duration::ZERO;
    for r in 0..rounds {
        let e = engine();
        let at = e.now();
        for _ in 0..4 {
            let b = batch(at);
            for (k, byte) in other.iter_mut().enumerate().step_by(64) {
                *byte = byte.wrapping_add((k as u32 ^ r) as u8);
            }
            let t0 = Instant::now();
            std::hint::black_box(e.start_plain_batch(b, false).unwrap());
            total += t0.elapsed();
        }
    }
    std::hint::black_box(&other);
    println!(
        "start_plain_batch into 1k, caches flushed between batches: {:?}/run",
        total / (rounds * 1000)
    );

    // Buffered starts with an option, which take the full rules of
    // `start_in`: the option shapes of the start bench, `{ priority }`,
    // `{ scope }` (100 scopes) and `{ runAt }` (1 s ahead).
    for (label, shape) in [
        ("priority", Shape::Priority),
        ("scope", Shape::Scope),
        ("runAt", Shape::RunAt),
    ] {
        let mut total = std::time::Duration::ZERO;
        for _ in 0..rounds {
            let e = engine();
            let at = e.now();
            let batches: Vec<Vec<BufferedStart>> =
                (0..4).map(|_| shaped_batch(at, shape)).collect();
            let t0 = Instant::now();
            for b in batches {
                std::hint::black_box(e.start_batch(b, false).unwrap());
            }
            total += t0.elapsed();
        }
        println!(
            "start_batch of {{ {label} }} starts into 1k: {:?}/run",
            total / (rounds * 1000)
        );
    }
}

#[derive(Clone, Copy)]
enum Shape {
    Priority,
    Scope,
    RunAt,
}

/// 250 buffered starts with one option (what JS hands over for a start
/// with options).
fn shaped_batch(at: i64, shape: Shape) -> Vec<BufferedStart<'static>> {
    (0..250)
        .map(|i| {
            let mut req = StartRequest {
                job_type: "t".into(),
                input: RawValue::from_string(format!("{{\"i\":{i}}}")).unwrap(),
                preset: Some((uuid::Uuid::new_v4(), at)),
                tenant: TenantArg::Missing,
                ..StartRequest::default()
            };
            match shape {
                Shape::Priority => req.priority = Some(i % 5),
                Shape::Scope => req.scope = Some(("order".into(), format!("o{}", i % 100))),
                Shape::RunAt => req.run_at = Some(at + 1_000),
            }
            BufferedStart::WithOptions(Box::new(req))
        })
        .collect()
}
