//! Durable waits on the in-memory store, through the engine's Rust API:
//! the wait index stays exact under every transition (checked after each
//! operation of a seeded random sequence), and what a token wait stores.

use jobforge_core::engine::{resume_token_hash, WaitBegin, WaitRequest};
use jobforge_core::*;
use serde_json::value::RawValue;

fn engine() -> Engine<MemoryStore> {
    Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::Manual,
            retention: Default::default(),
        },
    )
}

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn register(e: &Engine<MemoryStore>, t: &str, key: Option<&str>) {
    e.register_all(vec![DefinitionSpec {
        job_type: t.to_owned(),
        concurrency_key: key.map(str::to_owned),
        ..DefinitionSpec::default()
    }])
    .unwrap();
}

fn start(e: &Engine<MemoryStore>, t: &str, input: &str) -> RunRow {
    e.start(StartRequest {
        job_type: t.to_owned(),
        input: raw(input),
        ..StartRequest::default()
    })
    .unwrap()
}

/// A tiny deterministic generator (xorshift), so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn the_wait_index_follows_every_transition() {
    let e = engine();
    register(&e, "w", None);
    register(&e, "k", Some("{{lane}}"));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut runs: Vec<RunId> = Vec::new();
    let mut parked = 0;
    for _ in 0..3_000 {
        match rng.next(10) {
            0 | 1 => {
                let t = if rng.next(2) == 0 { "w" } else { "k" };
                let lane = rng.next(3);
                runs.push(start(&e, t, &format!("{{\"lane\":\"l{lane}\"}}")).id);
            }
            2 | 3 => {
                // Claim, open waits, park.
                if let Some(row) = e.claim_next("batch").unwrap() {
                    let id = row.id.to_string();
                    let epoch = row.claim_epoch;
                    let now = e.now();
                    let req = match rng.next(3) {
                        0 => WaitRequest::Sleep {
                            until: now + rng.next(500) as i64,
                        },
                        1 => WaitRequest::Signal {
                            signal: format!("s{}", rng.next(2)),
                            timeout_ms: (rng.next(2) == 0).then_some(1 + rng.next(400) as i64),
                        },
                        _ => WaitRequest::Token {
                            timeout_ms: Some(1 + rng.next(400) as i64),
                        },
                    };
                    let step = format!("w{}", rng.next(3));
                    if let Ok(WaitBegin::Token(_)) = e.wait_begin(&id, epoch, &step, req) {
                        e.wait_delivered(&id, epoch, &step).unwrap();
                    }
                    let outcome = if rng.next(5) == 0 {
                        AttemptOutcome::Completed(None)
                    } else {
                        AttemptOutcome::Parked
                    };
                    let after = e.finish_attempt(&row.id, epoch, outcome).unwrap();
                    if after.is_some_and(|r| r.status == RunStatus::Waiting) {
                        parked += 1;
                    }
                }
            }
            4 => {
                e.advance_time(rng.next(300) as i64);
            }
            5 => {
                e.resume_due_waits_then_next().unwrap();
            }
            6 if !runs.is_empty() => {
                let id = runs[rng.next(runs.len() as u64) as usize];
                let _ = e.signal(
                    &id.to_string(),
                    &format!("s{}", rng.next(2)),
                    None,
                    &TenantArg::Missing,
                );
            }
            7 if !runs.is_empty() => {
                let id = runs[rng.next(runs.len() as u64) as usize];
                e.cancel(&id.to_string(), true, &TenantArg::Missing)
                    .unwrap();
            }
            8 if !runs.is_empty() => {
                let id = runs[rng.next(runs.len() as u64) as usize];
                let _ = e.replay(&id.to_string(), &TenantArg::Missing);
            }
            9 if !runs.is_empty() => {
                // A parked execution that goes on: it waits again (and parks
                // anew) or ends the waiting run.
                let id = runs[rng.next(runs.len() as u64) as usize];
                let Some(r) = e.find_by_id(&id.to_string(), &TenantArg::Missing).unwrap() else {
                    continue;
                };
                if r.status == RunStatus::Waiting {
                    let outcome = match rng.next(3) {
                        0 => {
                            let until = e.now() + 1 + rng.next(500) as i64;
                            let step = format!("late{}", rng.next(3));
                            let _ = e.wait_begin(
                                &id.to_string(),
                                r.claim_epoch,
                                &step,
                                WaitRequest::Sleep { until },
                            );
                            AttemptOutcome::Parked
                        }
                        1 => AttemptOutcome::Completed(None),
                        _ => AttemptOutcome::Failed(FailureInfo {
                            message: "late".into(),
                            ..FailureInfo::default()
                        }),
                    };
                    e.finish_attempt(&id, r.claim_epoch, outcome).unwrap();
                }
            }
            _ => {}
        }
        e.store().verify_indexes().unwrap();
    }
    assert!(parked > 100, "the sequence parks runs ({parked})");
    // Every waiting run with a deadline in the past is resumed by one call.
    e.advance_time(1_000);
    e.resume_due_waits_then_next().unwrap();
    for id in &runs {
        let r = e
            .find_by_id(&id.to_string(), &TenantArg::Missing)
            .unwrap()
            .unwrap();
        if r.status == RunStatus::Waiting {
            assert!(r.wait_deadline.get().is_none_or(|d| d > e.now()));
        }
    }
}

#[test]
fn a_token_wait_stores_only_the_hash_and_the_token_names_its_run() {
    let e = engine();
    register(&e, "t", None);
    let run = start(&e, "t", "{}");
    let row = e.claim_next("batch").unwrap().unwrap();
    let id = row.id.to_string();
    let WaitBegin::Token(token) = e
        .wait_begin(
            &id,
            row.claim_epoch,
            "approve",
            WaitRequest::Token { timeout_ms: None },
        )
        .unwrap()
    else {
        panic!("a token wait answers a token")
    };
    assert!(token.starts_with("jft_"));
    assert_eq!(&token[4..36], run.id.simple().to_string());
    let steps = e.list_steps(&id, &TenantArg::Missing).unwrap();
    let stored = serde_json::to_string(&steps).unwrap();
    assert!(!stored.contains(&token[36..]), "the secret is not stored");
    assert!(stored.contains(&resume_token_hash(&token)), "its hash is");
    // Resumed while it is still being delivered: delivery then answers it.
    assert_eq!(
        e.resume(&token, Some(raw("{\"ok\":1}")), &TenantArg::Missing)
            .unwrap(),
        run.id
    );
    match e.wait_delivered(&id, row.claim_epoch, "approve").unwrap() {
        WaitBegin::Done(Some(v)) => assert_eq!(v.get(), "{\"ok\":1}"),
        other => panic!("expected the payload, got {other:?}"),
    }
    assert!(matches!(
        e.resume(&token, None, &TenantArg::Missing),
        Err(JobError::JobResumeToken { .. })
    ));
}

#[test]
fn a_run_whose_waits_resolved_before_it_parked_goes_straight_back_to_pending() {
    let e = engine();
    register(&e, "s", None);
    let run = start(&e, "s", "{}");
    let row = e.claim_next("batch").unwrap().unwrap();
    let id = row.id.to_string();
    let open = e
        .wait_begin(
            &id,
            row.claim_epoch,
            "go",
            WaitRequest::Signal {
                signal: "go".into(),
                timeout_ms: None,
            },
        )
        .unwrap();
    assert!(matches!(open, WaitBegin::Open));
    // The signal lands while the attempt is still running.
    assert!(e.signal(&id, "go", None, &TenantArg::Missing).unwrap());
    let parked = e
        .finish_attempt(&run.id, row.claim_epoch, AttemptOutcome::Parked)
        .unwrap()
        .unwrap();
    assert_eq!(parked.status, RunStatus::Pending);
    assert_eq!(parked.attempts, 0);
    e.store().verify_indexes().unwrap();
}

#[test]
fn a_parked_execution_that_goes_on_still_acts_for_its_run_until_a_wait_resumes_it() {
    let e = engine();
    register(&e, "s", None);
    let sleep = |until| WaitRequest::Sleep { until };
    let run = start(&e, "s", "{}");
    let row = e.claim_next("batch").unwrap().unwrap();
    let (id, epoch) = (row.id.to_string(), row.claim_epoch);
    let far = e.now() + 3_600_000;
    assert!(matches!(
        e.wait_begin(&id, epoch, "long", sleep(far)).unwrap(),
        WaitBegin::Open
    ));
    let parked = e
        .finish_attempt(&run.id, epoch, AttemptOutcome::Parked)
        .unwrap()
        .unwrap();
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(parked.wait_deadline.get(), Some(far));
    // The handler awaited other work too and goes on: its steps count...
    assert!(matches!(
        e.step_begin(&id, epoch, "save").unwrap(),
        StepBegin::Started { .. }
    ));
    e.step_complete(&id, epoch, "save", Some(raw("1"))).unwrap();
    // ...a new wait parks the run anew, on the earliest deadline (the
    // deadline a waiting run holds is not read as "woken").
    let soon = e.now() + 1_000;
    assert!(matches!(
        e.wait_begin(&id, epoch, "go", sleep(soon)).unwrap(),
        WaitBegin::Open
    ));
    let again = e
        .finish_attempt(&run.id, epoch, AttemptOutcome::Parked)
        .unwrap()
        .unwrap();
    assert_eq!(again.status, RunStatus::Waiting);
    assert_eq!(again.wait_deadline.get(), Some(soon));
    assert_eq!(again.attempts, 0);
    e.store().verify_indexes().unwrap();
    // ...and its result ends the run.
    let done = e
        .finish_attempt(
            &run.id,
            epoch,
            AttemptOutcome::Completed(Some(raw("\"late\""))),
        )
        .unwrap()
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.attempts, 1);
    assert_eq!(done.wait_deadline.get(), None);
    e.store().verify_indexes().unwrap();

    // Once a wait resumed the run, the parked execution is over: the next
    // claim decides.
    let run = start(&e, "s", "{}");
    let row = e.claim_next("batch").unwrap().unwrap();
    let (id, epoch) = (row.id.to_string(), row.claim_epoch);
    let signal = WaitRequest::Signal {
        signal: "go".into(),
        timeout_ms: None,
    };
    assert!(matches!(
        e.wait_begin(&id, epoch, "go", signal).unwrap(),
        WaitBegin::Open
    ));
    e.finish_attempt(&run.id, epoch, AttemptOutcome::Parked)
        .unwrap()
        .unwrap();
    assert!(e.signal(&id, "go", None, &TenantArg::Missing).unwrap());
    assert!(e
        .finish_attempt(&run.id, epoch, AttemptOutcome::Completed(None))
        .unwrap()
        .is_none());
    assert!(matches!(
        e.step_begin(&id, epoch, "x"),
        Err(JobError::JobRunState { .. })
    ));
    assert!(!e.attempt_current(&run.id, epoch));
    assert_eq!(
        e.find_by_id(&id, &TenantArg::Missing)
            .unwrap()
            .unwrap()
            .status,
        RunStatus::Pending
    );
}

/// A run released after a resumption (a stopping worker gives back its
/// prefetched claim, the sweeper an expired lease) keeps `started_at`, the
/// start of its first execution; a run released from its first claim
/// never started: `started_at` is cleared.
#[test]
fn a_released_resumed_run_keeps_the_start_of_its_first_execution() {
    let e = engine();
    register(&e, "s", None);
    let run = start(&e, "s", "{}");
    let row = e.claim_next("batch").unwrap().unwrap();
    let first_start = row.started_at.get();
    assert!(first_start.is_some());
    let soon = e.now() + 1_000;
    assert!(matches!(
        e.wait_begin(
            &row.id.to_string(),
            row.claim_epoch,
            "nap",
            WaitRequest::Sleep { until: soon }
        )
        .unwrap(),
        WaitBegin::Open
    ));
    e.finish_attempt(&run.id, row.claim_epoch, AttemptOutcome::Parked)
        .unwrap();
    e.advance_time(1_000);
    // The claim resumes the wait and claims the run again.
    let again = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(again.id, run.id);
    assert_eq!(again.started_at.get(), first_start);
    assert!(again.claimed_at.get() > first_start);
    assert!(e.release_attempt(&run.id, again.claim_epoch).unwrap());
    let back = e
        .find_by_id(&run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(back.status, RunStatus::Pending);
    assert_eq!(back.started_at.get(), first_start, "startedAt kept");
    assert!(back.claimed_at.get().is_none());

    // A first claim given back: the run never started.
    let fresh = start(&e, "s", r#"{"n":2}"#);
    e.advance_time(1);
    let claimed = e.claim_next("batch").unwrap().unwrap();
    let claimed = if claimed.id == fresh.id {
        claimed
    } else {
        // The resumed run was due first.
        e.claim_next("batch").unwrap().unwrap()
    };
    assert_eq!(claimed.id, fresh.id);
    assert!(e
        .release_claims(&[(fresh.id, claimed.claim_epoch, claimed.claimed_at.get())])
        .is_ok_and(|n| n == 1));
    let back = e
        .find_by_id(&fresh.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(back.started_at.get(), None, "never started");
}

#[test]
fn a_claim_hands_out_the_runs_completed_steps_and_completes_its_sleeps_that_are_over() {
    let e = engine();
    register(&e, "s", None);
    let run = start(&e, "s", "{}");
    let first = e.claim_attempts("batch", 1).unwrap().remove(0);
    assert!(first.memo.is_empty(), "a fresh run has nothing memoized");
    let (id, epoch) = (run.id.to_string(), first.epoch);
    e.step_begin(&id, epoch, "a").unwrap();
    e.step_complete(&id, epoch, "a", Some(raw(r#"{"x":1}"#)))
        .unwrap();
    let now = e.now();
    let nap = |until| WaitRequest::Sleep { until };
    assert!(matches!(
        e.wait_begin(&id, epoch, "nap", nap(now + 100)).unwrap(),
        WaitBegin::Open
    ));
    assert!(matches!(
        e.wait_begin(&id, epoch, "long", nap(now + 1_000)).unwrap(),
        WaitBegin::Open
    ));
    let parked = e
        .finish_attempt(&run.id, epoch, AttemptOutcome::Parked)
        .unwrap()
        .unwrap();
    assert_eq!(parked.status, RunStatus::Waiting);
    // Resumed at the first deadline: "nap" is over, "long" is not.
    e.advance_time(100);
    let second = e.claim_attempts("batch", 1).unwrap().remove(0);
    let memo: Vec<(&str, bool, Option<&str>)> = second
        .memo
        .iter()
        .map(|m| (&*m.step_id, m.wait, m.output.as_deref().map(RawValue::get)))
        .collect();
    assert_eq!(
        memo,
        vec![("a", false, Some(r#"{"x":1}"#)), ("nap", true, None)]
    );
    // The sleep that is over is stored completed by the claim, as the
    // rerun's call would have; the other is still open, for the rerun to ask.
    let steps = e.list_steps(&id, &TenantArg::Missing).unwrap();
    let status = |s: &str| steps.iter().find(|r| &*r.step_id == s).map(|r| r.status);
    assert_eq!(status("nap"), Some(StepStatus::Completed));
    assert_eq!(status("long"), Some(StepStatus::Running));
    assert!(matches!(
        e.wait_begin(&id, second.epoch, "nap", nap(now + 100))
            .unwrap(),
        WaitBegin::Done(None)
    ));
    e.store().verify_indexes().unwrap();
}

/// A long-lived child that runs invoke through its dedupe key keeps, in
/// `awaited_by`, only the waits that still wait for it: an invoker that
/// ended, or whose wait passed its deadline, is dropped when the next
/// invoker's entry is added (the list, and the deadlock walk over it on
/// every later hit, no longer grow with every past invoker).
#[test]
fn a_deduplicated_childs_waiters_keep_only_the_waits_still_open() {
    let e = engine();
    register(&e, "p", None);
    e.register_all(vec![DefinitionSpec {
        job_type: "c".to_owned(),
        dedupe_key: Some("one".to_owned()),
        dedupe_window_ms: Some(3_600_000),
        ..DefinitionSpec::default()
    }])
    .unwrap();
    let invoke = |timeout_ms: Option<i64>| WaitRequest::Child {
        start: Box::new(StartRequest {
            job_type: "c".to_owned(),
            input: raw("{}"),
            // The child outlives its first invoker (which is canceled).
            parent_close_policy: Some(ParentClosePolicy::Abandon),
            // Out of the invokers' pool: each invoker's claim takes it.
            pool: Some("kids".to_owned()),
            ..StartRequest::default()
        }),
        timeout_ms,
    };
    // Four invokers of the same child, one at a time: the first is
    // canceled, the second's wait passes its deadline, the third waits on.
    let mut invokers = Vec::new();
    for (i, timeout) in [None, Some(1_000), None, None].into_iter().enumerate() {
        // A pool each: the resumed second invoker is not claimed again.
        let pool = format!("p{i}");
        e.start(StartRequest {
            job_type: "p".to_owned(),
            input: raw("{}"),
            pool: Some(pool.clone()),
            ..StartRequest::default()
        })
        .unwrap();
        let r = e.claim_next(&pool).unwrap().expect("the invoker's claim");
        let begin = e
            .wait_begin(&r.id.to_string(), r.claim_epoch, "kid", invoke(timeout))
            .unwrap();
        assert!(matches!(begin, WaitBegin::Open), "{begin:?}");
        invokers.push(r.id);
        match i {
            0 => e
                .cancel(&r.id.to_string(), true, &TenantArg::Missing)
                .unwrap(),
            1 => {
                e.finish_attempt(&r.id, r.claim_epoch, AttemptOutcome::Parked)
                    .unwrap();
                e.advance_time(1_001);
            }
            _ => {
                e.finish_attempt(&r.id, r.claim_epoch, AttemptOutcome::Parked)
                    .unwrap();
            }
        }
    }
    let step = e
        .find_step(&TenantArg::Missing, &invokers[3].to_string(), "kid")
        .unwrap()
        .expect("the last invoker's wait");
    let Some(WaitSpec::Child { child_run_id, .. }) = WaitSpec::of_step(&step) else {
        panic!("a child wait: {step:?}");
    };
    let child = e
        .find_by_id(&child_run_id.to_string(), &TenantArg::Missing)
        .unwrap()
        .expect("the child");
    assert!(!child.status.is_terminal());
    let waiters: Vec<RunId> = child.awaited_by().iter().map(|(w, _)| *w).collect();
    assert_eq!(waiters, vec![invokers[2], invokers[3]]);
    e.store().verify_indexes().unwrap();
}
