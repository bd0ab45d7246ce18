//! Heap bytes a run holds in the in-memory engine, pending against parked
//! in a sleep (a counting allocator, no JS): `cargo run --release -p
//! jobforge-core --example wait_bytes`.
use jobforge_core::engine::WaitRequest;
use jobforge_core::*;
use serde_json::value::RawValue;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

fn engine(timeline: bool) -> Engine<MemoryStore> {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::Manual,
            retention: Default::default(),
        },
    );
    e.set_timeline(timeline);
    e.register(DefinitionSpec {
        job_type: "s".into(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    e
}

/// Where each run of a measurement ends up.
#[derive(Clone, Copy)]
enum End {
    Pending,
    Parked,
    Completed,
}

fn main() {
    let n = 100_000usize;
    println!(
        "sizes: RunRow {} B, RunExtras {} B, StepRow {} B",
        std::mem::size_of::<RunRow>(),
        std::mem::size_of::<RunExtras>(),
        std::mem::size_of::<StepRow>()
    );
    // Step by step, without the timeline: what each transition adds.
    {
        let e = engine(false);
        let mut ids = Vec::with_capacity(n);
        let b0 = LIVE.load(Ordering::Relaxed);
        for _ in 0..n {
            ids.push(
                e.start(StartRequest {
                    job_type: "s".into(),
                    input: RawValue::from_string("{}".into()).unwrap(),
                    ..StartRequest::default()
                })
                .unwrap()
                .id,
            );
        }
        let b1 = LIVE.load(Ordering::Relaxed);
        let mut claims = Vec::with_capacity(n);
        for _ in 0..n {
            let c = e.claim_next("batch").unwrap().unwrap();
            claims.push((c.id, c.claim_epoch));
        }
        let b2 = LIVE.load(Ordering::Relaxed);
        let until = e.now() + 3_600_000;
        for (id, epoch) in &claims {
            e.wait_begin(&id.to_string(), *epoch, "s", WaitRequest::Sleep { until })
                .unwrap();
        }
        let b3 = LIVE.load(Ordering::Relaxed);
        for (id, epoch) in &claims {
            e.finish_attempt(id, *epoch, AttemptOutcome::Parked)
                .unwrap();
        }
        let b4 = LIVE.load(Ordering::Relaxed);
        let per = |a: isize, b: isize| (b - a) / n as isize;
        println!(
            "start {} B, claim +{} B, wait_begin +{} B, park +{} B (ids/claims vectors: {} B)",
            per(b0, b1) - 16,
            per(b1, b2) - 20,
            per(b2, b3),
            per(b3, b4),
            16 + 20
        );
    }
    for timeline in [false, true] {
        for end in [End::Pending, End::Parked, End::Completed] {
            let e = engine(timeline);
            let before = LIVE.load(Ordering::Relaxed);
            for _ in 0..n {
                let r = e
                    .start(StartRequest {
                        job_type: "s".into(),
                        input: RawValue::from_string("{}".into()).unwrap(),
                        ..StartRequest::default()
                    })
                    .unwrap();
                match end {
                    End::Pending => {}
                    End::Parked => {
                        let c = e.claim_next("batch").unwrap().unwrap();
                        let id = c.id.to_string();
                        let until = e.now() + 3_600_000;
                        e.wait_begin(&id, c.claim_epoch, "s", WaitRequest::Sleep { until })
                            .unwrap();
                        e.finish_attempt(&r.id, c.claim_epoch, AttemptOutcome::Parked)
                            .unwrap();
                    }
                    End::Completed => {
                        let c = e.claim_next("batch").unwrap().unwrap();
                        e.finish_attempt(&r.id, c.claim_epoch, AttemptOutcome::Completed(None))
                            .unwrap();
                    }
                }
            }
            let bytes = LIVE.load(Ordering::Relaxed) - before;
            let what = match end {
                End::Pending => "pending",
                End::Parked => "parked in a sleep",
                End::Completed => "completed",
            };
            println!(
                "timeline {timeline}, {what}: {} B a run",
                bytes / n as isize
            );
        }
    }
}
