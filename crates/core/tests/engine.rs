//! Engine rules through the public Rust API (no JS involved).

use jobforge_core::engine::StepBegin;
use jobforge_core::*;
use serde_json::value::RawValue;

fn engine(multi_tenant: bool) -> Engine<MemoryStore> {
    Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant,
            clock: ClockKind::Manual,
            retention: Default::default(),
        },
    )
}

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

fn spec(t: &str) -> DefinitionSpec {
    DefinitionSpec {
        job_type: t.to_owned(),
        ..DefinitionSpec::default()
    }
}

fn req(t: &str, input: &str) -> StartRequest {
    StartRequest {
        job_type: t.to_owned(),
        input: raw(input),
        ..StartRequest::default()
    }
}

fn claim_id(e: &Engine<MemoryStore>, pool: &str) -> Option<RunId> {
    let id = e.claim_next(pool).unwrap().map(|r| r.id);
    e.store().verify_indexes().unwrap();
    id
}

fn status(e: &Engine<MemoryStore>, id: &RunId) -> RunStatus {
    e.store().verify_indexes().unwrap();
    e.find_by_id(&id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap()
        .status
}

fn complete(e: &Engine<MemoryStore>, row: &RunRow) {
    e.finish_attempt(&row.id, row.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
}

fn fail(e: &Engine<MemoryStore>, row: &RunRow, name: Option<&str>) -> Option<RunRow> {
    e.finish_attempt(
        &row.id,
        row.claim_epoch,
        AttemptOutcome::Failed(FailureInfo {
            message: "boom".into(),
            name: name.map(str::to_owned),
            ..FailureInfo::default()
        }),
    )
    .unwrap()
}

#[test]
fn claim_order_is_priority_then_run_at_then_created() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let now = e.now();
    let mut r = req("t", "{}");
    r.run_at = Some(now - 10);
    let early = e.start(r).unwrap();
    let a = e.start(req("t", "{}")).unwrap();
    let b = e.start(req("t", "{}")).unwrap();
    let mut hi = req("t", "{}");
    hi.priority = Some(5);
    let high = e.start(hi).unwrap();
    let order: Vec<RunId> = std::iter::from_fn(|| claim_id(&e, "batch")).collect();
    assert_eq!(order, vec![high.id, early.id, a.id, b.id]);
}

#[test]
fn future_runs_wait_for_the_clock_and_pools_are_isolated() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let mut later = req("t", "{}");
    later.run_at = Some(e.now() + 1_000);
    let l = e.start(later).unwrap();
    let mut other = req("t", "{}");
    other.pool = Some("interactive".into());
    let o = e.start(other).unwrap();
    assert_eq!(claim_id(&e, "batch"), None);
    e.advance_time(999);
    assert_eq!(claim_id(&e, "batch"), None);
    e.advance_time(1);
    assert_eq!(claim_id(&e, "batch"), Some(l.id));
    assert_eq!(claim_id(&e, "interactive"), Some(o.id));
}

#[test]
fn queue_lane_runs_one_at_a_time_in_start_order() {
    let e = engine(false);
    let mut s = spec("t");
    s.concurrency_key = Some("acct:{{a}}".into());
    e.register(s).unwrap();
    let runs: Vec<RunRow> = (0..5)
        .map(|_| e.start(req("t", r#"{"a":1}"#)).unwrap())
        .collect();
    let other = e.start(req("t", r#"{"a":2}"#)).unwrap();
    for expected in &runs {
        let c = e.claim_next("batch").unwrap().unwrap();
        // The other lane's run is independent of this one.
        let c = if c.id == other.id {
            complete(&e, &c);
            e.claim_next("batch").unwrap().unwrap()
        } else {
            c
        };
        assert_eq!(c.id, expected.id);
        // Nothing else of the lane is claimable while it runs.
        let extra = e.claim_next("batch").unwrap();
        assert!(extra.is_none() || extra.as_ref().unwrap().id == other.id);
        if let Some(x) = extra {
            complete(&e, &x);
        }
        complete(&e, &c);
    }
}

#[test]
fn reject_and_replace_collisions() {
    let e = engine(false);
    let mut s = spec("r");
    s.concurrency_key = Some("{{k}}".into());
    s.collision_mode = Some(CollisionMode::Reject);
    e.register(s).unwrap();
    let first = e.start(req("r", r#"{"k":"x"}"#)).unwrap();
    match e.start(req("r", r#"{"k":"x"}"#)) {
        Err(JobError::JobCollision { incumbent, .. }) => assert_eq!(incumbent.id, first.id),
        other => panic!("expected collision, got {other:?}"),
    }

    let mut s = spec("p");
    s.concurrency_key = Some("{{k}}".into());
    s.collision_mode = Some(CollisionMode::Replace);
    e.register(s).unwrap();
    let a = e.start(req("p", r#"{"k":"y"}"#)).unwrap();
    let mut q = spec("q");
    q.concurrency_key = Some("{{k}}".into());
    e.register(q).unwrap();
    let b = e.start(req("q", r#"{"k":"y"}"#)).unwrap();
    let c = e.start(req("p", r#"{"k":"y"}"#)).unwrap();
    assert_eq!(status(&e, &a.id), RunStatus::Canceled);
    assert_eq!(status(&e, &b.id), RunStatus::Canceled);
    assert_eq!(claim_id(&e, "batch"), Some(first.id));
    assert_eq!(claim_id(&e, "batch"), Some(c.id));
}

#[test]
fn dedupe_returns_newest_live_run_inside_window_per_tenant() {
    let e = engine(true);
    let mut s = spec("d");
    s.dedupe_key = Some("{{id}}".into());
    s.dedupe_window_ms = Some(1_000);
    e.register(s).unwrap();
    let mut a = req("d", r#"{"id":1}"#);
    a.tenant = TenantArg::Id("A".into());
    let first = e.start(a.clone()).unwrap();
    assert_eq!(e.start(a.clone()).unwrap().id, first.id);
    let mut b = a.clone();
    b.tenant = TenantArg::Id("B".into());
    assert_ne!(
        e.start(b).unwrap().id,
        first.id,
        "tenant B must not see A's run"
    );
    e.advance_time(1_000);
    assert_ne!(e.start(a).unwrap().id, first.id, "window is strict");
}

#[test]
fn retries_back_off_and_respect_non_retryable_errors() {
    let e = engine(false);
    let mut s = spec("t");
    s.retry = Some(RetryPolicy {
        attempts: 3,
        backoff: Backoff::Exponential,
        base_ms: 100,
        non_retryable_errors: Some(vec!["Fatal".into()]),
        ..RetryPolicy::default()
    });
    e.register(s).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    let after = fail(&e, &c, None).unwrap();
    assert_eq!(after.status, RunStatus::Pending);
    assert_eq!(after.run_at, e.now() + 100);
    assert!(after.error().as_ref().unwrap().retryable);
    e.advance_time(99);
    assert_eq!(claim_id(&e, "batch"), None);
    e.advance_time(1);
    let c = e.claim_next("batch").unwrap().unwrap();
    let after = fail(&e, &c, None).unwrap();
    assert_eq!(after.run_at, e.now() + 200);
    e.advance_time(200);
    let c = e.claim_next("batch").unwrap().unwrap();
    let after = fail(&e, &c, None).unwrap();
    assert_eq!(after.status, RunStatus::Failed);
    assert_eq!(after.attempts, 3);
    assert!(!after.error().unwrap().retryable);

    let run2 = e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, run2.id);
    assert_eq!(
        fail(&e, &c, Some("Fatal")).unwrap().status,
        RunStatus::Failed
    );
    let _ = run;
}

#[test]
fn cascade_walks_descendants_only_and_stops_at_abandon() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let root = e.start(req("t", "{}")).unwrap();
    let child = |parent: &RunRow, policy| {
        let mut r = req("t", "{}");
        r.parent_run_id = Some(parent.id.to_string());
        r.parent_close_policy = Some(policy);
        e.start(r).unwrap()
    };
    let mid = child(&root, ParentClosePolicy::Terminate);
    let sibling = child(&root, ParentClosePolicy::Cancel);
    let leaf = child(&mid, ParentClosePolicy::Cancel);
    let abandoned = child(&mid, ParentClosePolicy::Abandon);
    let under_abandoned = child(&abandoned, ParentClosePolicy::Terminate);
    assert_eq!(leaf.root_run_id(), root.id);

    e.cancel(&mid.id.to_string(), true, &TenantArg::Missing)
        .unwrap();
    assert_eq!(status(&e, &mid.id), RunStatus::Canceled);
    assert_eq!(status(&e, &leaf.id), RunStatus::Canceled);
    assert_eq!(
        status(&e, &root.id),
        RunStatus::Pending,
        "ancestor untouched"
    );
    assert_eq!(
        status(&e, &sibling.id),
        RunStatus::Pending,
        "sibling untouched"
    );
    assert_eq!(status(&e, &abandoned.id), RunStatus::Pending);
    assert_eq!(status(&e, &under_abandoned.id), RunStatus::Pending);
}

#[test]
fn a_failed_run_cancels_its_children() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let parent = e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, parent.id);
    let mut r = req("t", "{}");
    r.parent_run_id = Some(parent.id.to_string());
    let kid = e.start(r).unwrap();
    fail(&e, &c, None);
    assert_eq!(status(&e, &parent.id), RunStatus::Failed);
    assert_eq!(status(&e, &kid.id), RunStatus::Canceled);
}

#[test]
fn steps_memoize_and_replay_clears_per_mode() {
    let e = engine(false);
    let mut s = spec("t");
    s.replay_from = Some(ReplayFrom::LastStep);
    e.register(s).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let id = run.id.to_string();
    let c = e.claim_next("batch").unwrap().unwrap();
    assert!(matches!(
        e.step_begin(&id, c.claim_epoch, "a").unwrap(),
        StepBegin::Started { attempt: 1 }
    ));
    assert!(matches!(
        e.step_begin(&id, c.claim_epoch, "a"),
        Err(JobError::JobStepConflict { .. })
    ));
    e.step_complete(&id, c.claim_epoch, "a", Some(raw(r#"{"v":1}"#)))
        .unwrap();
    assert!(matches!(
        e.step_begin(&id, c.claim_epoch, "b").unwrap(),
        StepBegin::Started { .. }
    ));
    fail(&e, &c, None);
    // A step call from the finished attempt is refused.
    assert!(matches!(
        e.step_begin(&id, c.claim_epoch, "c"),
        Err(JobError::JobRunState { .. })
    ));
    let replayed = e.replay(&id, &TenantArg::Missing).unwrap();
    assert_eq!(replayed.status, RunStatus::Pending);
    assert_eq!(replayed.attempts, 0);
    let steps = e.list_steps(&id, &TenantArg::Missing).unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].step_id.as_ref(), "a");
    let c = e.claim_next("batch").unwrap().unwrap();
    match e.step_begin(&id, c.claim_epoch, "a").unwrap() {
        StepBegin::Memoized(Some(out)) => assert_eq!(out.get(), r#"{"v":1}"#),
        other => panic!("expected memoized, got {other:?}"),
    }
    assert!(matches!(
        e.replay(&id, &TenantArg::Missing),
        Err(JobError::JobNotReplayable { .. })
    ));
}

#[test]
fn late_outcome_of_a_canceled_attempt_is_ignored() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    e.cancel(&c.id.to_string(), true, &TenantArg::Missing)
        .unwrap();
    assert!(e
        .finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap()
        .is_none());
    assert_eq!(status(&e, &c.id), RunStatus::Canceled);
}

#[test]
fn errors_leave_nothing_behind() {
    let e = engine(true);
    let mut s = spec("t");
    s.concurrency_key = Some("{{k}}".into());
    e.register(s).unwrap();
    assert!(matches!(
        e.start(req("t", "{}")),
        Err(JobError::MissingTenantId { .. })
    ));
    let mut r = req("t", "{}");
    r.tenant = TenantArg::Null;
    assert!(matches!(
        e.start(r.clone()),
        Err(JobError::JobTemplateFieldMissing { .. })
    ));
    r.input = raw(r#"{"k":1}"#);
    r.parent_run_id = Some("6f1c1a2e-0000-4000-8000-000000000000".into());
    assert!(matches!(
        e.start(r),
        Err(JobError::ParentRunNotFound { .. })
    ));
    assert_eq!(claim_id(&e, "batch"), None);
    assert!(e
        .register(DefinitionSpec {
            job_type: "bad".into(),
            concurrency_key: Some("{{a.b}}".into()),
            ..DefinitionSpec::default()
        })
        .is_err());
    assert!(e.definition("bad").is_none());
}

#[test]
fn attempts_apply_outcomes_and_time_out_on_the_engine_clock() {
    let e = engine(false);
    let mut s = spec("t");
    s.timeout_ms = Some(50);
    e.register(s).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    let id = c.id.to_string();
    let ticket = e.begin_attempt(&id).unwrap();
    assert_eq!(ticket.timeout_ms, Some(50));
    assert_eq!(e.next_timeout(), Some(e.now() + 50));
    e.advance_time(49);
    assert_eq!(e.expire_attempts().unwrap(), 0, "not due yet");
    e.advance_time(1);
    assert_eq!(e.expire_attempts().unwrap(), 1);
    let row = e.find_by_id(&id, &TenantArg::Missing).unwrap().unwrap();
    assert_eq!(row.status, RunStatus::TimedOut);
    assert_eq!(row.id, run.id);
    assert_eq!(
        e.next_timeout(),
        None,
        "the ended attempt has no deadline left"
    );
    // The handler's late outcome is ignored.
    let late = e
        .finish_attempt(&row.id, ticket.epoch, AttemptOutcome::Completed(None))
        .unwrap();
    assert!(late.is_none());

    let run = e.start(req("t", "{}")).unwrap();
    e.claim_next("batch").unwrap();
    let ticket = e.begin_attempt(&run.id.to_string()).unwrap();
    e.finish_attempt(
        &run.id,
        ticket.epoch,
        AttemptOutcome::Completed(Some(raw(r#"{"a":1}"#))),
    )
    .unwrap();
    let row = e
        .find_by_id(&run.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .unwrap();
    assert_eq!(row.status, RunStatus::Completed);
    assert_eq!(row.output().unwrap().get(), r#"{"a":1}"#);
    assert_eq!(
        e.next_timeout(),
        None,
        "a completed attempt's deadline is gone"
    );
    assert!(matches!(
        e.begin_attempt(&run.id.to_string()),
        Err(JobError::JobRunState { .. })
    ));
}

/// A manual-clock engine that deletes completed runs `ms` after they
/// finish, with type `t` deduped on `{{k}}` (a long window).
fn retaining_completed(ms: i64) -> Engine<MemoryStore> {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::Manual,
            retention: jobforge_core::engine::Retention {
                completed_ms: Some(ms),
                failed_ms: None,
            },
        },
    );
    let mut s = spec("t");
    s.dedupe_key = Some("{{k}}".into());
    s.dedupe_window_ms = Some(1_000_000);
    e.register(s).unwrap();
    e
}

#[test]
fn retention_purges_finished_runs_and_reuses_their_slots() {
    let e = retaining_completed(100);
    let parent = e.start(req("t", r#"{"k":"p"}"#)).unwrap();
    let mut child = req("t", r#"{"k":"c"}"#);
    child.parent_run_id = Some(parent.id.to_string());
    let child = e.start(child).unwrap();
    let failing = e.start(req("t", r#"{"k":"f"}"#)).unwrap();
    let replayed = e.start(req("t", r#"{"k":"r"}"#)).unwrap();
    for _ in 0..4 {
        let c = e.claim_next("batch").unwrap().unwrap();
        if c.id == failing.id {
            fail(&e, &c, None);
        } else {
            complete(&e, &c);
        }
    }
    e.store().verify_indexes().unwrap();
    assert_eq!(e.store().live_runs(), 4);
    e.advance_time(50);
    e.replay(&replayed.id.to_string(), &TenantArg::Missing)
        .unwrap();
    e.advance_time(50);
    // Purging happens with the next transition.
    let fresh = e.start(req("t", r#"{"k":"x"}"#)).unwrap();
    e.store().verify_indexes().unwrap();
    let find = |id: &RunId| e.find_by_id(&id.to_string(), &TenantArg::Missing).unwrap();
    assert!(find(&parent.id).is_none(), "completed run purged");
    assert!(find(&child.id).is_none(), "completed child purged");
    assert!(
        find(&failing.id).is_some(),
        "failed runs kept (no failed retention)"
    );
    assert!(find(&replayed.id).is_some(), "a replayed run is live again");
    assert!(find(&fresh.id).is_some());
    // Held runs (what the binding reports to V8): failing, replayed, fresh.
    assert_eq!(e.store().live_runs(), 3);
    // A purged run no longer dedupes; the new run takes a reused slot.
    let again = e.start(req("t", r#"{"k":"p"}"#)).unwrap();
    assert_ne!(again.id, parent.id);
    assert_eq!(e.store().live_runs(), 4);
    e.store().verify_indexes().unwrap();
    assert!(e
        .list_steps(&parent.id.to_string(), &TenantArg::Missing)
        .unwrap()
        .is_empty());
    // Everything still claims in order after slot reuse.
    let order: Vec<RunId> = std::iter::from_fn(|| claim_id(&e, "batch")).collect();
    assert_eq!(order, vec![replayed.id, fresh.id, again.id]);
}

#[test]
fn retention_holds_for_reads_and_dedupe_without_another_write() {
    let e = retaining_completed(100);
    let first = e.start(req("t", r#"{"k":"a"}"#)).unwrap();
    complete(&e, &e.claim_next("batch").unwrap().unwrap());
    let find = |id: &RunId| e.find_by_id(&id.to_string(), &TenantArg::Missing).unwrap();
    let completed = || {
        e.count_by_pool_and_status(&TenantArg::Missing)
            .unwrap()
            .iter()
            .filter(|c| c.1 == RunStatus::Completed)
            .map(|c| c.2)
            .sum::<u64>()
    };
    e.advance_time(99);
    // Within its retention the run answers reads and dedupe.
    assert!(find(&first.id).is_some());
    assert_eq!(completed(), 1);
    assert_eq!(e.start(req("t", r#"{"k":"a"}"#)).unwrap().id, first.id);
    e.advance_time(1);
    // Due for deletion: gone for every read, though nothing wrote since.
    assert!(find(&first.id).is_none());
    assert_eq!(completed(), 0);
    e.store().verify_indexes().unwrap();
    // Dedupe does not answer with a run its own call deletes.
    let second = e.start(req("t", r#"{"k":"a"}"#)).unwrap();
    assert_ne!(second.id, first.id);
    assert!(find(&second.id).is_some());
}

#[test]
fn start_batch_creates_runs_with_their_preset_ids_and_reports_the_rest() {
    let e = engine(false);
    e.register(spec("a")).unwrap();
    let at = e.now();
    let taken = e.start(req("a", "{}")).unwrap().id;
    let fresh: Vec<RunId> = (0..3).map(|_| RunId::new_v4()).collect();
    let preset = |t: &'static str, id: RunId| PlainStart {
        id,
        at: at + 5,
        job_type: t,
        input: raw(r#"{"k":1}"#),
    };
    let (failed, pools) = e
        .start_plain_batch(
            vec![
                preset("a", fresh[0]),
                preset("nope", fresh[1]),
                preset("a", taken),
                preset("a", fresh[2]),
            ],
            false,
        )
        .unwrap();
    // The unknown type and the id already in use are reported by position;
    // the others are created, in order, with the caller's id and time.
    let positions: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
    assert_eq!(positions, vec![1, 2]);
    assert!(matches!(failed[0].1, JobError::JobTypeNotFound { .. }));
    assert!(matches!(failed[1].1, JobError::JobInputInvalid { .. }));
    assert_eq!(pools.len(), 1);
    for id in [fresh[0], fresh[2]] {
        let row = e.run_row(&id).expect("created");
        assert_eq!(row.created_at, at + 5);
        assert_eq!(row.status, RunStatus::Pending);
        assert_eq!(row.input.get(), r#"{"k":1}"#);
    }
    assert!(e.run_row(&fresh[1]).is_none());
    e.store().verify_indexes().unwrap();
    // Created order follows the batch: the earlier start first, then 0, 2.
    e.advance_time(10);
    assert_eq!(claim_id(&e, "batch"), Some(taken));
    assert_eq!(claim_id(&e, "batch"), Some(fresh[0]));
    assert_eq!(claim_id(&e, "batch"), Some(fresh[2]));
    assert_eq!(claim_id(&e, "batch"), None);
}

#[test]
fn plain_batch_builds_the_row_start_builds_and_keeps_the_rules_for_other_types() {
    let e = engine(false);
    let mut a = spec("a");
    a.pool = Some("p".into());
    a.priority_default = Some(3);
    e.register(a).unwrap();
    let mut keyed = spec("keyed");
    keyed.dedupe_key = Some("{{k}}".into());
    keyed.dedupe_window_ms = Some(60_000);
    e.register(keyed).unwrap();
    let at = e.now();
    let by_start = e.start(req("a", r#"{"k":1}"#)).unwrap();
    let first_keyed = e.start(req("keyed", r#"{"k":1}"#)).unwrap();
    let ids: Vec<RunId> = (0..4).map(|_| RunId::new_v4()).collect();
    let plain = |id: RunId, t: &'static str| PlainStart {
        id,
        at,
        job_type: t,
        input: raw(r#"{"k":1}"#),
    };
    let (failed, pools) = e
        .start_plain_batch(
            vec![
                plain(ids[0], "a"),
                plain(ids[1], "keyed"),
                plain(ids[2], "nope"),
                plain(by_start.id, "a"),
                plain(ids[3], "a"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        failed.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert!(matches!(failed[0].1, JobError::JobTypeNotFound { .. }));
    assert!(matches!(failed[1].1, JobError::JobInputInvalid { .. }));
    assert_eq!(pools.iter().map(|p| &**p).collect::<Vec<_>>(), vec!["p"]);
    // The plain run's row is the one `start` built, id aside.
    let row = e.run_row(&ids[0]).expect("created");
    let same = by_start
        .to_compact_json()
        .replace(&by_start.id.to_string(), "ID");
    assert_eq!(
        row.to_compact_json().replace(&ids[0].to_string(), "ID"),
        same
    );
    // The keyed type went through the rules: deduplicated onto the first run.
    assert!(e.run_row(&ids[1]).is_none());
    assert_eq!(status(&e, &first_keyed.id), RunStatus::Pending);
    e.store().verify_indexes().unwrap();
    // Priority and created order hold across both paths.
    assert_eq!(claim_id(&e, "p"), Some(by_start.id));
    assert_eq!(claim_id(&e, "p"), Some(ids[0]));
    assert_eq!(claim_id(&e, "p"), Some(ids[3]));
}

#[test]
fn row_options_batch_builds_the_row_start_builds_and_keeps_the_rules_for_other_types() {
    for multi_tenant in [false, true] {
        let e = engine(multi_tenant);
        let mut a = spec("a");
        a.pool = Some("p".into());
        e.register(a).unwrap();
        let mut scoped = spec("scoped");
        scoped.scope_entity_type = Some("order".into());
        e.register(scoped).unwrap();
        let mut keyed = spec("keyed");
        keyed.dedupe_key = Some("{{k}}".into());
        keyed.dedupe_window_ms = Some(60_000);
        e.register(keyed).unwrap();
        let at = e.now();
        let tenant = || TenantArg::Id("t1".into());
        // Every option that only sets a field of the row, alone and together.
        let shapes: Vec<RowOptions> = vec![
            RowOptions {
                priority: Some(7),
                tenant: tenant(),
                ..RowOptions::default()
            },
            RowOptions {
                run_at: Some(at + 60_000),
                tenant: tenant(),
                ..RowOptions::default()
            },
            RowOptions {
                scope: Some(("order".into(), "o1".into())),
                pool: Some("other".into()),
                tags: Some(raw(r#"{"x":"y"}"#)),
                trigger_source: Some(TriggerSource::Event),
                trigger_ref: Some("ref".into()),
                parent_close_policy: Some(ParentClosePolicy::Abandon),
                tenant: tenant(),
                ..RowOptions::default()
            },
            RowOptions {
                tags: Some(raw("{}")),
                tenant: TenantArg::Null,
                ..RowOptions::default()
            },
        ];
        for (t, o) in [("a", &shapes[..]), ("scoped", &shapes[2..3])]
            .into_iter()
            .flat_map(|(t, os)| os.iter().map(move |o| (t, o)))
        {
            let mut r = req(t, r#"{"k":1}"#);
            r.preset = Some((RunId::new_v4(), at));
            o.clone().apply_to(&mut r);
            let by_start = e.start(r).unwrap();
            let id = RunId::new_v4();
            let run = PlainStart {
                id,
                at,
                job_type: t,
                input: raw(r#"{"k":1}"#),
            };
            let (failed, _) = e
                .start_batch(
                    vec![BufferedStart::RowOptions(run, Box::new(o.clone()))],
                    false,
                )
                .unwrap();
            assert!(failed.is_empty(), "{failed:?}");
            let row = e.run_row(&id).expect("created");
            assert_eq!(
                row.to_compact_json().replace(&id.to_string(), "ID"),
                by_start
                    .to_compact_json()
                    .replace(&by_start.id.to_string(), "ID"),
                "{t} {o:?}"
            );
        }
        // Other types and starts go through the rules: a keyed type is
        // deduplicated, a type whose scope its definition names (none
        // given) is built as `start` builds it, and a multi-tenant start
        // that names no tenant is refused.
        let first_keyed = e
            .start({
                let mut r = req("keyed", r#"{"k":1}"#);
                r.tenant = tenant();
                r
            })
            .unwrap();
        let ids: Vec<RunId> = (0..3).map(|_| RunId::new_v4()).collect();
        let with = |id: RunId, t: &'static str, tenant: TenantArg| {
            let run = PlainStart {
                id,
                at,
                job_type: t,
                input: raw(r#"{"k":1}"#),
            };
            let o = RowOptions {
                priority: Some(1),
                tenant,
                ..RowOptions::default()
            };
            BufferedStart::RowOptions(run, Box::new(o))
        };
        let (failed, _) = e
            .start_batch(
                vec![
                    with(ids[0], "keyed", tenant()),
                    with(ids[1], "scoped", tenant()),
                    with(ids[2], "a", TenantArg::Missing),
                ],
                false,
            )
            .unwrap();
        assert!(e.run_row(&ids[0]).is_none());
        let keyed_row = e.run_row(&first_keyed.id).expect("kept");
        assert_eq!(keyed_row.status, RunStatus::Pending);
        assert_eq!(e.run_row(&ids[1]).expect("created").priority, 1);
        if multi_tenant {
            assert_eq!(failed.len(), 1);
            assert_eq!(failed[0].0, 2);
            assert!(matches!(failed[0].1, JobError::MissingTenantId { .. }));
            assert!(e.run_row(&ids[2]).is_none());
        } else {
            assert!(failed.is_empty());
            assert!(e.run_row(&ids[2]).is_some());
        }
        e.store().verify_indexes().unwrap();
    }
}

// ── issue 21: replay's tenant gate ─────────────────────────────────────

/// A failed run of tenant A, replayable.
fn failed_run_of_a(e: &Engine<MemoryStore>) -> RunRow {
    e.register(spec("t")).unwrap();
    let mut r = req("t", "{}");
    r.tenant = TenantArg::Id("A".into());
    e.start(r).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    fail(e, &c, None).unwrap()
}

#[test]
fn replay_takes_the_tenant_gate_of_cancel() {
    let e = engine(true);
    let run = failed_run_of_a(&e);
    let id = run.id.to_string();
    assert_eq!(run.status, RunStatus::Failed);
    let row = |e: &Engine<MemoryStore>| e.run_row(&run.id).unwrap().to_json();
    let before = row(&e);
    // No tenant: refused before anything is looked at, even for an unknown id.
    for target in [
        id.as_str(),
        "not-a-uuid",
        "6f1c1a2e-0000-4000-8000-000000000000",
    ] {
        match e.replay(target, &TenantArg::Missing) {
            Err(JobError::MissingTenantId { method }) => assert_eq!(method, "replay"),
            other => panic!("replay without tenant: {other:?}"),
        }
    }
    // Another tenant (and the null tenant) cannot tell the run exists.
    for other in [
        TenantArg::Id("B".into()),
        TenantArg::Null,
        TenantArg::Id("a".into()),
    ] {
        match e.replay(&id, &other) {
            Err(JobError::JobRunNotFound { run_id }) => assert_eq!(run_id, id),
            res => panic!("replay as {other:?}: {:?}", res.map(|r| r.status)),
        }
    }
    assert_eq!(row(&e), before, "the refused replays changed nothing");
    assert_eq!(claim_id(&e, "batch"), None, "nothing became claimable");
    // Its own tenant replays it.
    let replayed = e.replay(&id, &TenantArg::Id("A".into())).unwrap();
    assert_eq!(replayed.status, RunStatus::Pending);
    assert_eq!(replayed.tenant_id.as_deref(), Some("A"));
}

#[test]
fn replay_in_single_tenant_mode_needs_no_tenant() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    e.start(req("t", "{}")).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    fail(&e, &c, None).unwrap();
    let r = e.replay(&c.id.to_string(), &TenantArg::Missing).unwrap();
    assert_eq!(r.status, RunStatus::Pending);
}

// ── issue 21: retry options ────────────────────────────────────────────

fn policy(backoff: Backoff, base_ms: i64) -> RetryPolicy {
    RetryPolicy {
        attempts: 10,
        backoff,
        base_ms,
        ..RetryPolicy::default()
    }
}

#[test]
fn backoff_linear_and_max_delay() {
    let lin = policy(Backoff::Linear, 100);
    assert_eq!(
        (1..=4).map(|a| lin.backoff_ms(a)).collect::<Vec<_>>(),
        vec![100, 200, 300, 400],
        "linear: baseMs × the attempt that failed"
    );
    let mut exp = policy(Backoff::Exponential, 100);
    assert_eq!(
        (1..=4).map(|a| exp.backoff_ms(a)).collect::<Vec<_>>(),
        vec![100, 200, 400, 800]
    );
    exp.max_delay_ms = Some(250);
    assert_eq!(
        (1..=4).map(|a| exp.backoff_ms(a)).collect::<Vec<_>>(),
        vec![100, 200, 250, 250],
        "maxDelayMs caps the delay"
    );
    exp.max_delay_ms = Some(0);
    assert_eq!(exp.backoff_ms(3), 0);
    // Huge numbers saturate at 2^53 - 1, then the cap applies.
    let mut big = policy(Backoff::Linear, MAX_SAFE_INTEGER);
    assert_eq!(big.backoff_ms(u32::MAX), MAX_SAFE_INTEGER);
    big.max_delay_ms = Some(150);
    assert_eq!(big.backoff_ms(u32::MAX), 150);
    let mut huge = policy(Backoff::Exponential, 1_000);
    assert_eq!(huge.backoff_ms(200), MAX_SAFE_INTEGER);
    huge.max_delay_ms = Some(60_000);
    assert_eq!(huge.backoff_ms(200), 60_000);
    // No jitter: the delay is the backoff, whatever the source says.
    assert_eq!(huge.delay_ms(200, |_| 7), 60_000);
    // A zero base waits nothing however many attempts failed (2^exp × 0
    // must not saturate to 2^53 ms, a run parked for good).
    let zero = policy(Backoff::Exponential, 0);
    for a in [1, 53, 54, 60, 200, u32::MAX] {
        assert_eq!(zero.backoff_ms(a), 0, "exponential, baseMs 0, attempt {a}");
    }
}

#[test]
fn jittered_delays_stay_in_their_bounds_with_a_seeded_source() {
    let source = jobforge_core::random::RandomSource::seeded(2024);
    let draw = |n| source.up_to(n);
    for (backoff, base, cap) in [
        (Backoff::Fixed, 1_000, None),
        (Backoff::Exponential, 100, Some(150)),
        (Backoff::Exponential, 100, None),
        (Backoff::Linear, 7, Some(1_000_000)),
        (Backoff::Fixed, 1, None),
        (Backoff::Fixed, 0, None),
    ] {
        let mut p = policy(backoff, base);
        p.max_delay_ms = cap;
        for attempt in 1..=6 {
            let d = p.backoff_ms(attempt);
            if let Some(c) = cap {
                assert!(d <= c);
            }
            p.jitter = Jitter::Full;
            let full: Vec<i64> = (0..500).map(|_| p.delay_ms(attempt, draw)).collect();
            assert!(
                full.iter().all(|&x| (0..=d).contains(&x)),
                "full ⊂ [0, {d}]: {full:?}"
            );
            p.jitter = Jitter::Equal;
            let equal: Vec<i64> = (0..500).map(|_| p.delay_ms(attempt, draw)).collect();
            assert!(
                equal.iter().all(|&x| 2 * x >= d && x <= d),
                "equal ⊂ [{d}/2, {d}]: {equal:?}"
            );
            if d >= 100 {
                // Spread, not a constant: many distinct values, both halves reached.
                let distinct: std::collections::HashSet<_> = full.iter().collect();
                assert!(distinct.len() > 50, "full jitter of {d} spreads");
                assert!(full.iter().any(|&x| x < d / 2) && full.iter().any(|&x| x > d / 2));
                assert!(
                    equal.iter().any(|&x| x < d * 3 / 4) && equal.iter().any(|&x| x > d * 3 / 4)
                );
            }
            p.jitter = Jitter::None;
        }
    }
    // The extremes of the source map onto the ends of the range.
    let mut p = policy(Backoff::Fixed, 1_000);
    p.jitter = Jitter::Full;
    assert_eq!(p.delay_ms(1, |_| 0), 0);
    assert_eq!(p.delay_ms(1, |n| n), 1_000);
    p.jitter = Jitter::Equal;
    assert_eq!(p.delay_ms(1, |_| 0), 500);
    assert_eq!(p.delay_ms(1, |n| n), 1_000);
    p.base_ms = 1_001;
    assert_eq!(
        p.delay_ms(1, |_| 0),
        501,
        "equal: at least half, rounded up"
    );
}

#[test]
fn a_run_retry_uses_the_engines_seeded_jitter() {
    // Two engines with one seed draw the same delays; each within bounds.
    let delays = |seed: u64| -> Vec<i64> {
        let e = engine(false);
        e.seed_jitter(seed);
        let mut s = spec("t");
        s.retry = Some(RetryPolicy {
            attempts: 6,
            backoff: Backoff::Exponential,
            base_ms: 1_000,
            max_delay_ms: Some(3_000),
            jitter: Jitter::Full,
            ..RetryPolicy::default()
        });
        e.register(s).unwrap();
        e.start(req("t", "{}")).unwrap();
        let mut out = Vec::new();
        for attempt in 1..=5u32 {
            let now = e.now();
            let c = e.claim_next("batch").unwrap().unwrap();
            let after = fail(&e, &c, None).unwrap();
            assert_eq!(after.status, RunStatus::Pending);
            let d = after.run_at - now;
            let ceiling = (1_000i64 << (attempt - 1)).min(3_000);
            assert!(
                (0..=ceiling).contains(&d),
                "attempt {attempt}: {d} in [0, {ceiling}]"
            );
            out.push(d);
            e.advance_time(d);
        }
        out
    };
    let a = delays(9);
    assert_eq!(a, delays(9), "a seed makes the delays reproducible");
    assert_ne!(a, delays(10));
}

#[test]
fn a_step_retry_uses_the_policy_and_the_jitter() {
    let e = engine(false);
    e.seed_jitter(1);
    e.register(spec("t")).unwrap();
    let run = e.start(req("t", "{}")).unwrap();
    let id = run.id.to_string();
    let c = e.claim_next("batch").unwrap().unwrap();
    let mut p = policy(Backoff::Linear, 400);
    p.max_delay_ms = Some(1_000);
    p.jitter = Jitter::Equal;
    let info = || FailureInfo {
        message: "boom".into(),
        ..FailureInfo::default()
    };
    for attempt in 1..=4 {
        e.step_begin(&id, c.claim_epoch, "s").unwrap();
        let d = e
            .step_fail(&id, c.claim_epoch, "s", info(), Some(&p))
            .unwrap()
            .expect("retried");
        let ceiling = (400 * attempt).min(1_000);
        assert!(
            2 * d >= ceiling && d <= ceiling,
            "attempt {attempt}: {d} in [{ceiling}/2, {ceiling}]"
        );
    }
    // A policy with a bad number is refused, and the step row kept as it was.
    let before = e.list_steps(&id, &TenantArg::Missing).unwrap();
    p.max_delay_ms = Some(-1);
    e.step_begin(&id, c.claim_epoch, "s").unwrap();
    let running = e.list_steps(&id, &TenantArg::Missing).unwrap();
    assert!(matches!(
        e.step_fail(&id, c.claim_epoch, "s", info(), Some(&p)),
        Err(JobError::JobInputInvalid { .. })
    ));
    assert_eq!(
        serde_json::to_string(&e.list_steps(&id, &TenantArg::Missing).unwrap()).unwrap(),
        serde_json::to_string(&running).unwrap()
    );
    assert_ne!(before.len(), 0);
}

#[test]
fn retry_policies_refuse_unknown_keys_and_words_and_bad_numbers() {
    let parse = |s: &str| serde_json::from_str::<RetryPolicy>(s);
    let ok =
        parse(r#"{"attempts":3,"backoff":"linear","baseMs":10,"maxDelayMs":150,"jitter":"full"}"#)
            .unwrap();
    assert_eq!(ok.backoff, Backoff::Linear);
    assert_eq!(ok.max_delay_ms, Some(150));
    assert_eq!(ok.jitter, Jitter::Full);
    // Seed-shaped policies parse as before, and serialise unchanged.
    let seed = r#"{"attempts":2,"backoff":"fixed","baseMs":5}"#;
    assert_eq!(serde_json::to_string(&parse(seed).unwrap()).unwrap(), seed);
    for (bad, names) in [
        (
            r#"{"attempts":3,"backoff":"fixed","baseMs":1,"retyr":1}"#,
            "retyr",
        ),
        (
            r#"{"attempts":3,"backoff":"fixed","baseMs":1,"maxDelayMS":1}"#,
            "maxDelayMS",
        ),
        (
            r#"{"attempts":3,"backoff":"fixed","baseMs":1,"jitter":"sometimes"}"#,
            "sometimes",
        ),
        (
            r#"{"attempts":3,"backoff":"quadratic","baseMs":1}"#,
            "quadratic",
        ),
    ] {
        let e = parse(bad).expect_err(bad).to_string();
        assert!(e.contains(names), "{e}");
    }
    let e = engine(false);
    for (max, base) in [(Some(-1), 0), (None, -1), (Some(MAX_SAFE_INTEGER + 1), 0)] {
        let mut s = spec("t");
        s.retry = Some(RetryPolicy {
            attempts: 2,
            backoff: Backoff::Fixed,
            base_ms: base,
            max_delay_ms: max,
            ..RetryPolicy::default()
        });
        assert!(matches!(
            e.register(s),
            Err(JobError::JobInputInvalid { .. })
        ));
    }
    assert!(e.definition("t").is_none(), "nothing was stored");
}

#[test]
fn get_run_and_count_runs_take_the_tenant_gate() {
    let e = engine(true);
    e.register(spec("t")).unwrap();
    let start = |tenant: TenantArg| {
        e.start(StartRequest {
            tenant,
            ..req("t", "{}")
        })
        .unwrap()
    };
    let a = start(TenantArg::Id("A".into()));
    start(TenantArg::Id("A".into()));
    let shared = start(TenantArg::Null);
    let a_id = a.id.to_string();
    // A missing tenant names the method called.
    for err in [
        e.get_run(&a_id, &TenantArg::Missing).unwrap_err(),
        e.count_runs(&TenantArg::Missing).unwrap_err(),
    ] {
        assert_eq!(err.code(), "MISSING_TENANT_ID");
    }
    match e.get_run(&a_id, &TenantArg::Missing) {
        Err(JobError::MissingTenantId { method }) => assert_eq!(method, "getRun"),
        other => panic!("{other:?}"),
    }
    match e.count_runs(&TenantArg::Missing) {
        Err(JobError::MissingTenantId { method }) => assert_eq!(method, "countRuns"),
        other => panic!("{other:?}"),
    }
    // Another tenant's run is invisible and not counted.
    let a_arg = TenantArg::Id("A".into());
    assert_eq!(e.get_run(&a_id, &a_arg).unwrap().map(|r| r.id), Some(a.id));
    assert!(e
        .get_run(&a_id, &TenantArg::Id("B".into()))
        .unwrap()
        .is_none());
    assert!(e.get_run(&a_id, &TenantArg::Null).unwrap().is_none());
    assert!(e.get_run("not-a-uuid", &a_arg).unwrap().is_none());
    assert_eq!(
        e.get_run(&shared.id.to_string(), &TenantArg::Null)
            .unwrap()
            .map(|r| r.id),
        Some(shared.id)
    );
    assert_eq!(e.count_runs(&a_arg).unwrap(), 2);
    assert_eq!(e.count_runs(&TenantArg::Null).unwrap(), 1);
    assert_eq!(e.count_runs(&TenantArg::Id("B".into())).unwrap(), 0);
    // Every status counts, terminal ones included.
    let claimed = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(claimed.id, a.id, "claimed in created order");
    complete(&e, &claimed);
    let done = e.get_run(&a_id, &a_arg).unwrap().map(|r| r.status);
    assert_eq!(done, Some(RunStatus::Completed));
    assert_eq!(e.count_runs(&a_arg).unwrap(), 2);
}

#[test]
fn a_scope_lists_by_run_at_in_either_direction_ties_in_created_order() {
    use jobforge_core::engine::{ScopeOrder, ScopeQuery};
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let at = |run_at: i64| {
        e.start(StartRequest {
            scope: Some(("order".into(), "o1".into())),
            run_at: Some(run_at),
            ..req("t", "{}")
        })
        .unwrap()
        .id
    };
    // Created in this order; runAt 30, 10, 20, 10.
    let (a, b, c, d) = (at(30), at(10), at(20), at(10));
    let list = |order: ScopeOrder| -> Vec<RunId> {
        let q = ScopeQuery {
            statuses: None,
            job_type: None,
            limit: 50,
            offset: 0,
            order,
        };
        e.list_for_scope(&TenantArg::Missing, "order", "o1", &q)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(list(ScopeOrder::CreatedAsc), vec![a, b, c, d]);
    assert_eq!(list(ScopeOrder::CreatedDesc), vec![d, c, b, a]);
    assert_eq!(list(ScopeOrder::RunAtAsc), vec![b, d, c, a]);
    assert_eq!(list(ScopeOrder::RunAtDesc), vec![a, c, d, b]);
}

#[test]
fn a_released_run_keeps_its_due_time_and_is_claimed_before_runs_started_after_it() {
    let e = engine(false);
    e.register(spec("t")).unwrap();
    let a = e.start(req("t", r#"{"n":0}"#)).unwrap();
    let claimed = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(claimed.id, a.id);
    // While `a` runs, more runs queue up behind it.
    e.advance_time(10);
    let b = e.start(req("t", r#"{"n":1}"#)).unwrap();
    e.advance_time(10);
    let c = e.start(req("t", r#"{"n":2}"#)).unwrap();
    e.advance_time(10);
    // Its attempt ends without an outcome (a shutdown, a dead worker).
    assert!(e.release_attempt(&a.id, claimed.claim_epoch).unwrap());
    let back = e.run_row(&a.id).unwrap();
    assert_eq!(back.status, RunStatus::Pending);
    assert_eq!(back.run_at, a.run_at, "its due time is kept");
    assert_eq!(back.updated_at, e.now());
    e.store().verify_indexes().unwrap();
    // It goes back to its place: before the runs started after it.
    assert_eq!(claim_id(&e, "batch"), Some(a.id));
    assert_eq!(claim_id(&e, "batch"), Some(b.id));
    assert_eq!(claim_id(&e, "batch"), Some(c.id));
}

// ── start_many ─────────────────────────────────────────────────────────

fn lane_spec(t: &str, mode: CollisionMode) -> DefinitionSpec {
    let mut s = spec(t);
    s.concurrency_key = Some("k:{{k}}".into());
    s.collision_mode = Some(mode);
    s
}

/// A batch applies every rule in entry order, as sequential starts would:
/// a later entry dedupes onto an earlier one, lanes queue in entry order.
#[test]
fn start_many_applies_the_rules_in_entry_order() {
    let e = engine(false);
    e.register(spec("p")).unwrap();
    e.register(lane_spec("q", CollisionMode::Queue)).unwrap();
    let mut d = spec("d");
    d.dedupe_key = Some("d:{{k}}".into());
    d.dedupe_window_ms = Some(60_000);
    e.register(d).unwrap();
    let rows = e
        .start_many(vec![
            req("q", r#"{"k":1}"#),
            req("d", r#"{"k":1}"#),
            req("p", "{}"),
            req("d", r#"{"k":1}"#),
            req("q", r#"{"k":1}"#),
        ])
        .unwrap();
    assert_eq!(rows.len(), 5);
    assert_eq!(
        rows[3].id, rows[1].id,
        "the later entry dedupes onto the earlier"
    );
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), 4);
    e.store().verify_indexes().unwrap();
    // Lane order is entry order: the second lane run waits for the first.
    let order: Vec<RunId> = std::iter::from_fn(|| claim_id(&e, "batch")).collect();
    assert_eq!(order, vec![rows[0].id, rows[1].id, rows[2].id]);
    assert!(e.start_many(Vec::new()).unwrap().is_empty());
}

/// An entry refused stores nothing of the batch and names its index, and
/// what earlier entries did to existing runs (a `replace` lane's cancel)
/// is undone: the memory store has no rollback of its own.
#[test]
fn start_many_refused_at_index_k_leaves_the_store_as_it_was() {
    let e = engine(false);
    e.register(spec("p")).unwrap();
    e.register(lane_spec("r", CollisionMode::Replace)).unwrap();
    e.register(lane_spec("x", CollisionMode::Reject)).unwrap();
    let incumbent = e.start(req("r", r#"{"k":1}"#)).unwrap();
    let before = e.count_runs(&TenantArg::Missing).unwrap();
    // Refused by the lane an earlier entry of the batch took.
    let err = e
        .start_many(vec![
            req("p", "{}"),
            req("r", r#"{"k":1}"#),
            req("x", r#"{"k":2}"#),
            req("x", r#"{"k":2}"#),
        ])
        .unwrap_err();
    assert_eq!(err.index, Some(3));
    assert_eq!(err.error.code(), "JOB_COLLISION");
    // An unknown type after a replace.
    let err = e
        .start_many(vec![req("r", r#"{"k":1}"#), req("nope", "{}")])
        .unwrap_err();
    assert_eq!(
        (err.index, err.error.code()),
        (Some(1), "JOB_TYPE_NOT_FOUND")
    );
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), before);
    e.store().verify_indexes().unwrap();
    assert_eq!(status(&e, &incumbent.id), RunStatus::Pending);
    // Nothing else is claimable: the undone runs left every index.
    assert_eq!(claim_id(&e, "batch"), Some(incumbent.id));
    assert_eq!(claim_id(&e, "batch"), None);
    let too_many: Vec<StartRequest> = (0..=engine::START_MANY_MAX)
        .map(|_| req("p", "{}"))
        .collect();
    let err = e.start_many(too_many).unwrap_err();
    assert_eq!((err.index, err.error.code()), (None, "JOB_INPUT_INVALID"));
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), before);
}

/// A group's starts are each on their own: one refused leaves the others.
#[test]
fn start_group_answers_each_start_alone() {
    let e = engine(false);
    e.register(spec("p")).unwrap();
    e.register(lane_spec("x", CollisionMode::Reject)).unwrap();
    let answers = e
        .start_group(vec![
            req("x", r#"{"k":1}"#),
            req("x", r#"{"k":1}"#),
            req("p", "{}"),
            req("nope", "{}"),
        ])
        .unwrap();
    assert!(answers[0].is_ok() && answers[2].is_ok());
    assert_eq!(answers[1].as_ref().unwrap_err().code(), "JOB_COLLISION");
    assert_eq!(
        answers[3].as_ref().unwrap_err().code(),
        "JOB_TYPE_NOT_FOUND"
    );
    assert_eq!(e.count_runs(&TenantArg::Missing).unwrap(), 2);
    e.store().verify_indexes().unwrap();
}
