//! Property-based tests of the engine core.
//!
//! A generator produces random operation sequences (register, start, claim,
//! batch claim, begin, complete/fail/time out, release, cancel, replay,
//! scope cancel/reschedule, steps, advance time) over a deliberately small
//! key space, so that lanes, dedupe hits, collisions and cascades happen
//! often. After every operation a model-free checker compares the rows
//! before and after it:
//!
//! 1. `MemoryStore::verify_indexes()` agrees, and so do the query services
//!    (counts, recent failed, scope lists, run trees, paged listings) with a
//!    recomputation from the rows.
//! 2. Only legal status transitions happen, and only to the runs the
//!    operation is allowed to touch.
//! 3. Per lane `(tenant, concurrencyKey)`: at most one run is running and a
//!    claimed lane run is the earliest non-terminal member by start (or
//!    replay-rejoin) order, tracked in a shadow independent of the engine.
//! 4. Terminal rows change only through replay.
//! 5. Cascades cancel exactly the non-terminal descendants reachable through
//!    non-`abandon` edges (computed from the rows' parent links).
//! 6. `claim_next` returns the highest priority, then earliest runAt, then
//!    earliest created claimable due run, or nothing when there is none.
//! 7. With retention on, a run disappears only when it is terminal and its
//!    retention has elapsed since `finishedAt`.

use jobforge_core::engine::{JobRunQuery, Retention, ScopeOrder, ScopeQuery, StepBegin};
use jobforge_core::*;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use uuid::Uuid;

type Check = Result<(), String>;
type LaneKey = (Option<Arc<str>>, Box<str>);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

const TYPES: [&str; 3] = ["t0", "t1", "t2"];
const POOLS: [&str; 2] = ["a", "b"];
const SCOPE_TYPE: &str = "acct";
const SCOPE_IDS: [&str; 2] = ["1", "2"];

fn raw(s: &str) -> Box<RawValue> {
    RawValue::from_string(s.to_owned()).unwrap()
}

// ── generated data ─────────────────────────────────────────────────────

#[derive(Debug, Clone)]
struct DefCfg {
    pool: &'static str,
    /// Concurrency key template and collision mode.
    lane: Option<(&'static str, CollisionMode)>,
    /// Dedupe on `{{k}}` with this window (`None` = no window).
    dedupe: Option<Option<i64>>,
    retry: Option<RetryPolicy>,
    priority_default: Option<i32>,
    replay_from: ReplayFrom,
    scope_entity: bool,
    timeout_ms: Option<i64>,
}

impl DefCfg {
    fn spec(&self, ty: &str) -> DefinitionSpec {
        DefinitionSpec {
            job_type: ty.to_owned(),
            pool: Some(self.pool.to_owned()),
            scope_entity_type: self.scope_entity.then(|| SCOPE_TYPE.to_owned()),
            retry: self.retry.clone(),
            timeout_ms: self.timeout_ms,
            concurrency_key: self.lane.map(|(t, _)| t.to_owned()),
            collision_mode: self.lane.map(|(_, m)| m),
            dedupe_key: self.dedupe.map(|_| "{{k}}".to_owned()),
            dedupe_window_ms: self.dedupe.flatten(),
            replay_from: Some(self.replay_from),
            priority_default: self.priority_default,
            registered_at: None,
        }
    }

    fn policy(&self) -> RetryPolicy {
        self.retry.clone().unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TenantPick {
    Missing,
    Null,
    A,
    B,
}

impl TenantPick {
    fn arg(self) -> TenantArg {
        match self {
            TenantPick::Missing => TenantArg::Missing,
            TenantPick::Null => TenantArg::Null,
            TenantPick::A => TenantArg::Id("A".into()),
            TenantPick::B => TenantArg::Id("B".into()),
        }
    }
}

#[derive(Debug, Clone)]
struct StartOp {
    ty: usize,
    /// Value of input field `k`; `None` = the field is missing.
    key: Option<&'static str>,
    tenant: TenantPick,
    /// Parent: which run, its close policy, which runs to prefer.
    parent: Option<(Index, ParentClosePolicy, Prefer)>,
    /// With a parent, pass no tenant (inherit the parent's).
    inherit: bool,
    bad_parent: bool,
    pool: Option<&'static str>,
    priority: Option<i32>,
    run_at: Option<i64>,
    scope: Option<&'static str>,
    meta_scope: Option<&'static str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Complete,
    CompleteWithOutput,
    Fail,
    Fatal,
    TimedOut,
    NoHandler,
}

#[derive(Debug, Clone, Copy)]
enum StepAction {
    Begin,
    Complete,
    Fail,
    /// Begin, then complete.
    Run,
}

/// The pool a claim asks: a named one, or the pool of some pending run.
#[derive(Debug, Clone, Copy)]
enum PoolPick {
    Named(&'static str),
    OfPending(Index),
}

/// Which run an operation targets, when such a run exists; otherwise any.
#[derive(Debug, Clone, Copy)]
enum Prefer {
    Running,
    Terminal,
    /// A run with a live child.
    Parent,
    /// A running run with a live child.
    RunningParent,
    Any,
}

#[derive(Debug, Clone)]
enum Op {
    Register {
        ty: usize,
        cfg: DefCfg,
    },
    Start(Box<StartOp>),
    /// With `catch_up`, time first moves to the earliest runAt of the
    /// pool's pending runs (when that is in the future).
    Claim {
        pool: PoolPick,
        catch_up: bool,
    },
    ClaimBatch {
        pool: PoolPick,
        max: usize,
        catch_up: bool,
    },
    Begin {
        pick: Index,
        prefer: Prefer,
    },
    Finish {
        pick: Index,
        prefer: Prefer,
        outcome: Outcome,
        stale: bool,
    },
    Release {
        pick: Index,
        prefer: Prefer,
        stale: bool,
    },
    Cancel {
        pick: Index,
        prefer: Prefer,
        cascade: bool,
        /// `None`: the run's own tenant.
        tenant: Option<TenantPick>,
    },
    Replay {
        pick: Index,
        prefer: Prefer,
    },
    CancelScope {
        id: &'static str,
        tenant: TenantPick,
        cascade: bool,
    },
    RescheduleScope {
        id: &'static str,
        tenant: TenantPick,
        offset: i64,
    },
    Step {
        pick: Index,
        prefer: Prefer,
        step: u8,
        action: StepAction,
    },
    Advance {
        ms: i64,
    },
}

/// Operation weights of one kind of generated case.
#[derive(Debug, Clone, Copy)]
struct Profile {
    /// Out of 10: how often a definition has a concurrency key.
    lane: u32,
    /// Probability that a start names a parent.
    parent: f64,
    start: u32,
    claim: u32,
    finish: u32,
    cancel: u32,
    replay: u32,
    step: u32,
    /// Weight of a plain failure among attempt outcomes (completion: 6).
    fail: u32,
    /// Out of 4: how often a finish targets a running run with live children.
    finish_parent: u32,
}

const BALANCED: Profile = Profile {
    lane: 6,
    parent: 0.45,
    start: 12,
    claim: 14,
    finish: 12,
    cancel: 4,
    replay: 3,
    step: 4,
    fail: 4,
    finish_parent: 1,
};
/// Deep trees, cancels and failures: cascades.
const TREES: Profile = Profile {
    lane: 3,
    parent: 0.8,
    start: 12,
    claim: 12,
    finish: 12,
    cancel: 8,
    replay: 2,
    step: 1,
    fail: 10,
    finish_parent: 3,
};
/// Shared lanes, claims and completions: lane order.
const LANES: Profile = Profile {
    lane: 9,
    parent: 0.15,
    start: 12,
    claim: 16,
    finish: 14,
    cancel: 2,
    replay: 3,
    step: 1,
    fail: 3,
    finish_parent: 1,
};

fn def_cfg(p: Profile) -> impl Strategy<Value = DefCfg> {
    let lane = prop_oneof![
        10 - p.lane => Just(None),
        p.lane => (
            select(vec!["{{k}}", "{{k}}", "L{{k}}"]),
            select(vec![
                CollisionMode::Queue,
                CollisionMode::Queue,
                CollisionMode::Queue,
                CollisionMode::Reject,
                CollisionMode::Replace,
            ]),
        )
            .prop_map(Some),
    ];
    let dedupe = prop_oneof![
        2 => Just(None),
        1 => select(vec![None, Some(0i64), Some(10), Some(50)]).prop_map(Some),
    ];
    let retry = prop_oneof![
        1 => Just(None),
        2 => (
            1u32..=3,
            select(vec![Backoff::Fixed, Backoff::Exponential]),
            0i64..=20,
            any::<bool>(),
        )
            .prop_map(|(attempts, backoff, base_ms, fatal)| {
                // Linear backoff and maxDelayMs are derived from the drawn
                // values rather than drawn: another draw would shift the
                // deterministic stream `generator_reaches_interesting_states`
                // counts on. About a third of fixed policies become linear,
                // and a quarter of all get a cap.
                let backoff = if backoff == Backoff::Fixed && base_ms % 3 == 0 {
                    Backoff::Linear
                } else {
                    backoff
                };
                Some(RetryPolicy {
                    attempts,
                    backoff,
                    base_ms,
                    max_delay_ms: (base_ms % 4 == 1).then_some(base_ms + 3),
                    non_retryable_errors: fatal.then(|| vec!["Fatal".to_owned()]),
                    ..RetryPolicy::default()
                })
            }),
    ];
    (
        select(POOLS.to_vec()),
        lane,
        dedupe,
        retry,
        prop::option::of(-1i32..=1),
        select(vec![
            ReplayFrom::Scratch,
            ReplayFrom::LastStep,
            ReplayFrom::LastCheckpoint,
        ]),
        any::<bool>(),
        prop::option::weighted(0.2, Just(30i64)),
    )
        .prop_map(
            |(
                pool,
                lane,
                dedupe,
                retry,
                priority_default,
                replay_from,
                scope_entity,
                timeout_ms,
            )| {
                DefCfg {
                    pool,
                    lane,
                    dedupe,
                    retry,
                    priority_default,
                    replay_from,
                    scope_entity,
                    timeout_ms,
                }
            },
        )
}

fn tenant_pick() -> impl Strategy<Value = TenantPick> {
    prop_oneof![
        1 => Just(TenantPick::Missing),
        2 => Just(TenantPick::Null),
        3 => Just(TenantPick::A),
        3 => Just(TenantPick::B),
    ]
}

fn policy() -> impl Strategy<Value = ParentClosePolicy> {
    select(vec![
        ParentClosePolicy::Terminate,
        ParentClosePolicy::Cancel,
        ParentClosePolicy::Abandon,
    ])
}

fn start_op(p: Profile) -> impl Strategy<Value = StartOp> {
    (
        (
            0usize..TYPES.len(),
            prop_oneof![8 => select(vec!["x", "x", "y"]).prop_map(Some), 1 => Just(None)],
            tenant_pick(),
            prop::option::weighted(
                p.parent,
                (
                    any::<Index>(),
                    policy(),
                    select(vec![Prefer::Running, Prefer::Parent, Prefer::Any]),
                ),
            ),
            prop::bool::weighted(0.7),
            prop::bool::weighted(0.03),
        ),
        (
            prop::option::weighted(0.25, select(POOLS.to_vec())),
            prop::option::weighted(0.5, -1i32..=1),
            prop::option::weighted(0.3, -5i64..20),
            prop::option::weighted(0.4, select(SCOPE_IDS.to_vec())),
            prop::option::weighted(0.5, select(SCOPE_IDS.to_vec())),
        ),
    )
        .prop_map(
            |(
                (ty, key, tenant, parent, inherit, bad_parent),
                (pool, priority, run_at, scope, meta_scope),
            )| {
                StartOp {
                    ty,
                    key,
                    tenant,
                    parent,
                    inherit,
                    bad_parent,
                    pool,
                    priority,
                    run_at,
                    scope,
                    meta_scope,
                }
            },
        )
}

fn prefer(main: Prefer) -> impl Strategy<Value = Prefer> {
    prop_oneof![5 => Just(main), 1 => Just(Prefer::Any)]
}

fn outcome(fail: u32) -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Complete),
        2 => Just(Outcome::CompleteWithOutput),
        fail => Just(Outcome::Fail),
        1 => Just(Outcome::Fatal),
        1 => Just(Outcome::TimedOut),
        1 => Just(Outcome::NoHandler),
    ]
}

fn op(p: Profile) -> impl Strategy<Value = Op> {
    let pool = || {
        prop_oneof![
            4 => select(POOLS.to_vec()).prop_map(PoolPick::Named),
            1 => Just(PoolPick::Named("c")),
            6 => any::<Index>().prop_map(PoolPick::OfPending),
        ]
    };
    prop_oneof![
        1 => (0usize..TYPES.len(), def_cfg(p)).prop_map(|(ty, cfg)| Op::Register { ty, cfg }),
        p.start => start_op(p).prop_map(|s| Op::Start(Box::new(s))),
        p.claim => (pool(), prop::bool::weighted(0.3))
            .prop_map(|(pool, catch_up)| Op::Claim { pool, catch_up }),
        2 => (pool(), 1usize..=3, prop::bool::weighted(0.3))
            .prop_map(|(pool, max, catch_up)| Op::ClaimBatch { pool, max, catch_up }),
        1 => (any::<Index>(), prefer(Prefer::Running))
            .prop_map(|(pick, prefer)| Op::Begin { pick, prefer }),
        p.finish => (
            any::<Index>(),
            prop_oneof![
                4 - p.finish_parent => prefer(Prefer::Running),
                p.finish_parent => Just(Prefer::RunningParent),
            ],
            outcome(p.fail),
            prop::bool::weighted(0.05),
        )
            .prop_map(|(pick, prefer, outcome, stale)| Op::Finish { pick, prefer, outcome, stale }),
        1 => (any::<Index>(), prefer(Prefer::Running), prop::bool::weighted(0.1))
            .prop_map(|(pick, prefer, stale)| Op::Release { pick, prefer, stale }),
        p.cancel => (
            any::<Index>(),
            select(vec![Prefer::Any, Prefer::Parent]),
            prop::bool::weighted(0.8),
            prop::option::weighted(0.3, tenant_pick()),
        )
            .prop_map(|(pick, prefer, cascade, tenant)| Op::Cancel { pick, prefer, cascade, tenant }),
        p.replay => (any::<Index>(), prefer(Prefer::Terminal))
            .prop_map(|(pick, prefer)| Op::Replay { pick, prefer }),
        1 => (select(SCOPE_IDS.to_vec()), tenant_pick(), prop::bool::weighted(0.8))
            .prop_map(|(id, tenant, cascade)| Op::CancelScope { id, tenant, cascade }),
        1 => (select(SCOPE_IDS.to_vec()), tenant_pick(), -5i64..30)
            .prop_map(|(id, tenant, offset)| Op::RescheduleScope { id, tenant, offset }),
        p.step => (
            any::<Index>(),
            prefer(Prefer::Running),
            0u8..2,
            select(vec![
                StepAction::Begin,
                StepAction::Complete,
                StepAction::Fail,
                StepAction::Run,
                StepAction::Run,
            ]),
        )
            .prop_map(|(pick, prefer, step, action)| Op::Step { pick, prefer, step, action }),
        4 => prop_oneof![Just(0i64), 1i64..=5, 5i64..=40]
            .prop_map(|ms| Op::Advance { ms }),
    ]
}

// ── expectations ───────────────────────────────────────────────────────

/// What an operation may do to one existing run.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Claim,
    Retry { run_at: Millis },
    End { status: RunStatus, output: String },
    Cancel,
    Replay,
    Release,
    Reschedule { run_at: Millis },
}

#[derive(Debug, Default)]
struct Expect {
    /// A run was created (appended to the harness's id list).
    created: bool,
    changes: HashMap<RunId, Change>,
    /// Runs whose steps the operation may change.
    steps_touched: HashSet<RunId>,
}

impl Expect {
    fn add(&mut self, id: RunId, c: Change) -> Check {
        if let Some(prev) = self.changes.insert(id, c.clone()) {
            ensure!(
                prev == c,
                "test bug: two expectations for {id}: {prev:?} / {c:?}"
            );
        }
        Ok(())
    }
}

// ── harness ────────────────────────────────────────────────────────────

struct Harness {
    e: Engine<MemoryStore>,
    mt: bool,
    defs: Vec<DefCfg>,
    /// Known runs in created order.
    ids: Vec<RunId>,
    pos: HashMap<RunId, usize>,
    tenant: HashMap<RunId, Option<Arc<str>>>,
    /// Shadow lane order: assigned on start and on replay.
    lane_order: HashMap<RunId, u64>,
    next_order: u64,
    /// Last seen steps of runs that ever had steps (JSON + epoch).
    steps: HashMap<RunId, Vec<(String, u32)>>,
    op_no: usize,
    /// How often each interesting situation occurred (generator coverage).
    stats: BTreeMap<&'static str, u64>,
    retention: Retention,
    /// Runs deleted by retention.
    purged: HashSet<RunId>,
}

/// The model's own delay (small numbers, no jitter: overflow cannot occur).
fn backoff(p: &RetryPolicy, attempts: u32) -> i64 {
    let d = match p.backoff {
        Backoff::Fixed => p.base_ms,
        Backoff::Linear => p.base_ms * i64::from(attempts),
        Backoff::Exponential => p.base_ms * (1i64 << (attempts - 1)),
    };
    p.max_delay_ms.map_or(d, |m| d.min(m))
}

fn step_key(s: &StepRow) -> (String, u32) {
    (serde_json::to_string(s).unwrap(), s.epoch)
}

fn code<T>(r: &Result<T>) -> Option<&'static str> {
    r.as_ref().err().map(JobError::code)
}

impl Harness {
    fn new(mt: bool, defs: Vec<DefCfg>, retention: Retention) -> Self {
        let e = Engine::new(
            MemoryStore::new(),
            EngineOptions {
                multi_tenant: mt,
                clock: ClockKind::Manual,
                retention,
            },
        );
        for (i, d) in defs.iter().enumerate() {
            e.register(d.spec(TYPES[i])).unwrap();
        }
        Harness {
            e,
            mt,
            defs,
            ids: Vec::new(),
            pos: HashMap::new(),
            tenant: HashMap::new(),
            lane_order: HashMap::new(),
            next_order: 0,
            steps: HashMap::new(),
            op_no: 0,
            stats: BTreeMap::new(),
            retention,
            purged: HashSet::new(),
        }
    }

    fn note(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn targ(&self, t: Option<&str>) -> TenantArg {
        match (self.mt, t) {
            (false, _) => TenantArg::Missing,
            (true, None) => TenantArg::Null,
            (true, Some(t)) => TenantArg::Id(t.to_owned()),
        }
    }

    /// Every tenant argument whose rows together are all rows.
    fn tenant_args(&self) -> Vec<(TenantArg, Option<Arc<str>>)> {
        if self.mt {
            vec![
                (TenantArg::Null, None),
                (TenantArg::Id("A".into()), Some(Arc::from("A"))),
                (TenantArg::Id("B".into()), Some(Arc::from("B"))),
            ]
        } else {
            vec![(TenantArg::Missing, None)]
        }
    }

    fn def_of(&self, job_type: &str) -> &DefCfg {
        let i = TYPES.iter().position(|t| *t == job_type).unwrap();
        &self.defs[i]
    }

    /// Every known run, `None` where it no longer exists.
    fn fetch(&self) -> std::result::Result<Vec<Option<RunRow>>, String> {
        self.ids
            .iter()
            .map(|id| {
                let t = self.tenant[id].clone();
                self.e
                    .find_by_id(&id.to_string(), &self.targ(t.as_deref()))
                    .map_err(|e| format!("find_by_id({id}): {e}"))
            })
            .collect()
    }

    fn rows(&self) -> std::result::Result<Vec<RunRow>, String> {
        self.fetch()?
            .into_iter()
            .zip(&self.ids)
            .map(|(r, id)| r.ok_or_else(|| format!("run {id} vanished")))
            .collect()
    }

    fn retention_of(&self, status: RunStatus) -> Option<i64> {
        if status == RunStatus::Completed {
            self.retention.completed_ms
        } else {
            self.retention.failed_ms
        }
    }

    /// Runs that vanished during an operation (at `now`) or the reads after
    /// it (at `read_at`, later if the operation moved the clock: reads purge
    /// too): each must have been terminal (before it or through it) with its
    /// retention elapsed at `read_at`. They are then forgotten, and `before`
    /// and `exp` forget them too.
    fn take_purged(
        &mut self,
        before: &mut Vec<RunRow>,
        after: Vec<Option<RunRow>>,
        exp: &mut Expect,
        now: Millis,
        read_at: Millis,
    ) -> std::result::Result<Vec<RunRow>, String> {
        let mut gone = HashSet::new();
        for (i, a) in after.iter().enumerate() {
            if a.is_some() {
                continue;
            }
            let id = self.ids[i];
            ensure!(i < before.len(), "run {id} vanished as it was created");
            let b = &before[i];
            // (status, finishedAt) the run had when it was deleted.
            let ended = match exp.changes.get(&id) {
                None if b.status.is_terminal() => Some((b.status, b.finished_at.get())),
                Some(Change::End { status, .. }) => Some((*status, Some(now))),
                Some(Change::Cancel) => Some((RunStatus::Canceled, Some(now))),
                _ => None,
            };
            let ok = ended.is_some_and(|(status, finished)| {
                self.retention_of(status)
                    .zip(finished)
                    .is_some_and(|(ms, at)| at <= read_at - ms)
            });
            ensure!(
                ok,
                "run {id} was deleted but is not a terminal run past its retention \
                 ({:?}, {:?}): {}",
                self.retention,
                exp.changes.get(&id),
                b.to_json()
            );
            if before.iter().any(|c| c.parent_run_id() == Some(id)) {
                self.note("purged a parent");
            }
            self.note("purged a run");
            gone.insert(id);
        }
        if gone.is_empty() {
            return Ok(after.into_iter().flatten().collect());
        }
        before.retain(|r| !gone.contains(&r.id));
        self.ids.retain(|id| !gone.contains(id));
        self.pos = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i))
            .collect();
        for id in &gone {
            self.tenant.remove(id);
            self.lane_order.remove(id);
            self.steps.remove(id);
            exp.changes.remove(id);
            exp.steps_touched.remove(id);
        }
        self.purged.extend(gone);
        Ok(after.into_iter().flatten().collect())
    }

    fn steps_of(&self, id: &RunId) -> Vec<StepRow> {
        let t = self.tenant[id].clone();
        self.e
            .list_steps(&id.to_string(), &self.targ(t.as_deref()))
            .unwrap()
    }

    fn pick(&self, rows: &[RunRow], pick: &Index, prefer: Prefer) -> Option<usize> {
        if rows.is_empty() {
            return None;
        }
        let want: Vec<usize> = match prefer {
            Prefer::Running => (0..rows.len())
                .filter(|i| rows[*i].status == RunStatus::Running)
                .collect(),
            Prefer::Terminal => (0..rows.len())
                .filter(|i| rows[*i].status.is_terminal())
                .collect(),
            Prefer::Parent | Prefer::RunningParent => {
                let live_parents: HashSet<RunId> = rows
                    .iter()
                    .filter(|r| !r.status.is_terminal())
                    .filter_map(|r| r.parent_run_id())
                    .collect();
                (0..rows.len())
                    .filter(|i| live_parents.contains(&rows[*i].id))
                    .filter(|i| {
                        matches!(prefer, Prefer::Parent) || rows[*i].status == RunStatus::Running
                    })
                    .collect()
            }
            Prefer::Any => Vec::new(),
        };
        if want.is_empty() {
            Some(pick.index(rows.len()))
        } else {
            Some(want[pick.index(want.len())])
        }
    }

    fn pool(&self, rows: &[RunRow], pick: &PoolPick) -> String {
        match pick {
            PoolPick::Named(p) => (*p).to_owned(),
            PoolPick::OfPending(ix) => {
                let pending: Vec<&RunRow> = rows
                    .iter()
                    .filter(|r| r.status == RunStatus::Pending)
                    .collect();
                if pending.is_empty() {
                    POOLS[0].to_owned()
                } else {
                    pending[ix.index(pending.len())].pool.to_string()
                }
            }
        }
    }

    fn lane_key(r: &RunRow) -> Option<LaneKey> {
        r.concurrency_key()
            .map(|k| (r.tenant_id.clone(), Box::from(k)))
    }

    /// Non-terminal members of every lane, in shadow order.
    fn lanes(&self, rows: &[RunRow]) -> HashMap<LaneKey, Vec<usize>> {
        let mut lanes: HashMap<LaneKey, Vec<usize>> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            if let Some(k) = Self::lane_key(r) {
                if !r.status.is_terminal() {
                    lanes.entry(k).or_default().push(i);
                }
            }
        }
        for members in lanes.values_mut() {
            members.sort_by_key(|i| self.lane_order[&rows[*i].id]);
        }
        lanes
    }

    /// Claimable due runs of `pool`, best first, computed from the rows.
    fn expected_claims(&self, rows: &[RunRow], pool: &str, now: Millis) -> Vec<RunId> {
        let lanes = self.lanes(rows);
        let mut c: Vec<usize> = (0..rows.len())
            .filter(|&i| {
                let r = &rows[i];
                &*r.pool == pool
                    && r.status == RunStatus::Pending
                    && r.run_at <= now
                    && Self::lane_key(r).is_none_or(|k| lanes[&k][0] == i)
            })
            .collect();
        c.sort_by_key(|&i| (std::cmp::Reverse(rows[i].priority), rows[i].run_at, i));
        c.into_iter().map(|i| rows[i].id).collect()
    }

    /// Runs that canceling `x` cancels: `x` itself (if `include_root`) and,
    /// with `cascade`, every non-terminal descendant reachable through
    /// non-`abandon` edges. Nothing when `x` is terminal and included.
    fn cancel_set(rows: &[RunRow], x: usize, include_root: bool, cascade: bool) -> Vec<RunId> {
        if include_root && rows[x].status.is_terminal() {
            return Vec::new();
        }
        let mut kids: HashMap<RunId, Vec<usize>> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            if let Some(p) = r.parent_run_id() {
                kids.entry(p).or_default().push(i);
            }
        }
        let mut out = Vec::new();
        let mut stack = vec![x];
        while let Some(i) = stack.pop() {
            let r = &rows[i];
            if (i != x || include_root) && !r.status.is_terminal() {
                out.push(r.id);
            }
            if cascade {
                for &c in kids.get(&r.id).into_iter().flatten() {
                    if rows[c].parent_close_policy != ParentClosePolicy::Abandon {
                        stack.push(c);
                    }
                }
            }
        }
        out
    }

    /// Non-terminal `abandon` children under the cancel walk from `x`: the
    /// runs a cascade must leave alone.
    fn abandoned_under(rows: &[RunRow], x: usize) -> usize {
        let reach: HashSet<RunId> = Self::cancel_set(rows, x, false, true)
            .into_iter()
            .chain([rows[x].id])
            .collect();
        rows.iter()
            .filter(|r| {
                r.parent_close_policy == ParentClosePolicy::Abandon
                    && !r.status.is_terminal()
                    && r.parent_run_id().is_some_and(|p| reach.contains(&p))
            })
            .count()
    }

    fn expect_cancels(exp: &mut Expect, ids: Vec<RunId>) -> Check {
        for id in ids {
            exp.add(id, Change::Cancel)?;
        }
        Ok(())
    }

    // ── one operation ──────────────────────────────────────────────────

    fn apply(&mut self, op: &Op) -> Check {
        self.op_no += 1;
        if let Op::Claim {
            pool,
            catch_up: true,
        }
        | Op::ClaimBatch {
            pool,
            catch_up: true,
            ..
        } = op
        {
            let rows = self.rows()?;
            let pool = self.pool(&rows, pool);
            let now = self.e.now();
            let due = rows
                .iter()
                .filter(|r| *r.pool == *pool && r.status == RunStatus::Pending)
                .map(|r| r.run_at)
                .min();
            if let Some(t) = due.filter(|t| *t > now) {
                self.e.advance_time(t - now);
                // Reads purge too: runs whose retention ran out meanwhile go.
                let mut rows = rows;
                let fetched = self.fetch()?;
                self.take_purged(&mut rows, fetched, &mut Expect::default(), now, t)?;
            }
        }
        let before = self.rows()?;
        let now = self.e.now();
        let mut exp = Expect::default();
        match op {
            Op::Register { ty, cfg } => {
                self.e
                    .register(cfg.spec(TYPES[*ty]))
                    .map_err(|e| format!("register: {e}"))?;
                self.defs[*ty] = cfg.clone();
            }
            Op::Start(s) => self.op_start(s, &before, now, &mut exp)?,
            Op::Claim { pool, .. } => {
                let pool = &self.pool(&before, pool);
                let expected = self.expected_claims(&before, pool, now);
                let got = self
                    .e
                    .claim_next(pool)
                    .map_err(|e| format!("claim_next: {e}"))?;
                let got_id = got.as_ref().map(|r| r.id);
                if expected.len() > 1 {
                    self.note("claim chose among several");
                }
                if got.is_none()
                    && before
                        .iter()
                        .any(|r| *r.pool == **pool && r.status == RunStatus::Pending)
                {
                    self.note("claim found nothing though runs are pending");
                }
                ensure!(
                    got_id == expected.first().copied(),
                    "claim_next({pool}) returned {got_id:?}, expected {:?} (candidates {expected:?})",
                    expected.first()
                );
                if let Some(r) = got {
                    self.check_claim(&before, &r)?;
                    exp.add(r.id, Change::Claim)?;
                }
            }
            Op::ClaimBatch { pool, max, .. } => {
                let pool = &self.pool(&before, pool);
                let expected = self.expected_claims(&before, pool, now);
                let tickets = self
                    .e
                    .claim_attempts(pool, *max)
                    .map_err(|e| format!("claim_attempts: {e}"))?;
                let got: Vec<RunId> = tickets.iter().map(|t| t.run.id).collect();
                let want: Vec<RunId> = expected.iter().take(*max).copied().collect();
                ensure!(
                    got == want,
                    "claim_attempts({pool}, {max}) returned {got:?}, expected {want:?}"
                );
                for t in &tickets {
                    ensure!(t.epoch == t.run.claim_epoch, "ticket epoch differs");
                    ensure!(
                        t.timeout_ms == self.def_of(&t.run.job_type).timeout_ms,
                        "ticket timeout differs from the definition"
                    );
                    self.check_claim(&before, &t.run)?;
                    exp.add(t.run.id, Change::Claim)?;
                }
            }
            Op::Begin { pick, prefer } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    let r = &before[i];
                    let res = self.e.begin_attempt(&r.id.to_string());
                    if r.status == RunStatus::Running {
                        // Already executing (batch claim, earlier begin) is refused.
                        if let Ok(t) = &res {
                            ensure!(t.epoch == r.claim_epoch, "begin_attempt epoch");
                        } else {
                            ensure!(
                                code(&res) == Some("JOB_RUN_STATE"),
                                "begin_attempt: {:?}",
                                res.err()
                            );
                        }
                    } else {
                        ensure!(
                            code(&res) == Some("JOB_RUN_STATE"),
                            "begin_attempt on a {} run: {:?}",
                            r.status,
                            res.map(|t| t.run.id)
                        );
                    }
                }
            }
            Op::Finish {
                pick,
                prefer,
                outcome,
                stale,
            } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    self.op_finish(&before, i, *outcome, *stale, now, &mut exp)?;
                }
            }
            Op::Release {
                pick,
                prefer,
                stale,
            } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    let r = &before[i];
                    let epoch = if *stale {
                        r.claim_epoch.wrapping_sub(1)
                    } else {
                        r.claim_epoch
                    };
                    let released = self
                        .e
                        .release_attempt(&r.id, epoch)
                        .map_err(|e| format!("release_attempt: {e}"))?;
                    let should = r.status == RunStatus::Running && !*stale;
                    ensure!(
                        released == should,
                        "release_attempt returned {released}, expected {should}"
                    );
                    if should {
                        exp.add(r.id, Change::Release)?;
                    }
                }
            }
            Op::Cancel {
                pick,
                prefer,
                cascade,
                tenant,
            } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    let r = &before[i];
                    // `None`: the run's own tenant.
                    let tenant = tenant.unwrap_or(match r.tenant_id.as_deref() {
                        None => TenantPick::Null,
                        Some("A") => TenantPick::A,
                        Some(_) => TenantPick::B,
                    });
                    let res = self.e.cancel(&r.id.to_string(), *cascade, &tenant.arg());
                    if self.mt && tenant == TenantPick::Missing {
                        ensure!(
                            code(&res) == Some("MISSING_TENANT_ID"),
                            "cancel without tenant: {res:?}"
                        );
                    } else {
                        res.map_err(|e| format!("cancel: {e}"))?;
                        let visible = !self.mt || tenant.arg() == self.targ(r.tenant_id.as_deref());
                        if visible {
                            let set = Self::cancel_set(&before, i, true, *cascade);
                            if set.len() > 1 {
                                self.note("cancel cascaded");
                            }
                            if *cascade && !set.is_empty() && Self::abandoned_under(&before, i) > 0
                            {
                                self.note("cancel left an abandon subtree alone");
                            }
                            if before[i].parent_run_id().is_some() && !set.is_empty() {
                                self.note("canceled a child run");
                            }
                            Self::expect_cancels(&mut exp, set)?;
                        } else {
                            self.note("cancel of another tenant's run");
                        }
                    }
                }
            }
            Op::Replay { pick, prefer } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    self.op_replay(&before, i, now, &mut exp)?;
                }
            }
            Op::CancelScope {
                id,
                tenant,
                cascade,
            } => {
                let res = self
                    .e
                    .cancel_for_scope(&tenant.arg(), SCOPE_TYPE, id, *cascade);
                if self.mt && *tenant == TenantPick::Missing {
                    ensure!(
                        code(&res) == Some("MISSING_TENANT_ID"),
                        "cancel_for_scope without tenant: {res:?}"
                    );
                } else {
                    let n = res.map_err(|e| format!("cancel_for_scope: {e}"))?;
                    let scope: Vec<usize> = (0..before.len())
                        .filter(|&i| self.in_scope(&before[i], tenant, id))
                        .collect();
                    let mut all = HashSet::new();
                    for &i in &scope {
                        if !before[i].status.is_terminal() {
                            all.extend(Self::cancel_set(&before, i, true, *cascade));
                        }
                    }
                    let counted = scope
                        .iter()
                        .filter(|&&i| all.contains(&before[i].id))
                        .count() as u32;
                    if n > 0 {
                        self.note("cancel_for_scope canceled runs");
                    }
                    ensure!(
                        n == counted,
                        "cancel_for_scope returned {n}, {counted} scope runs were canceled"
                    );
                    Self::expect_cancels(&mut exp, all.into_iter().collect())?;
                }
            }
            Op::RescheduleScope { id, tenant, offset } => {
                let run_at = now + offset;
                let res = self
                    .e
                    .reschedule_for_scope(&tenant.arg(), SCOPE_TYPE, id, run_at);
                if self.mt && *tenant == TenantPick::Missing {
                    ensure!(
                        code(&res) == Some("MISSING_TENANT_ID"),
                        "reschedule_for_scope without tenant: {res:?}"
                    );
                } else {
                    let n = res.map_err(|e| format!("reschedule_for_scope: {e}"))?;
                    let moved: Vec<RunId> = before
                        .iter()
                        .filter(|r| self.in_scope(r, tenant, id) && r.status == RunStatus::Pending)
                        .map(|r| r.id)
                        .collect();
                    ensure!(
                        n as usize == moved.len(),
                        "reschedule_for_scope returned {n}, expected {}",
                        moved.len()
                    );
                    if !moved.is_empty() {
                        self.note("reschedule_for_scope moved runs");
                    }
                    for m in moved {
                        exp.add(m, Change::Reschedule { run_at })?;
                    }
                }
            }
            Op::Step {
                pick,
                prefer,
                step,
                action,
            } => {
                if let Some(i) = self.pick(&before, pick, *prefer) {
                    self.op_step(&before[i], *step, *action)?;
                    exp.steps_touched.insert(before[i].id);
                }
            }
            Op::Advance { ms } => {
                let t = self.e.advance_time(*ms);
                ensure!(t == Some(now + ms), "advance_time returned {t:?}");
            }
        }
        let mut before = before;
        let fetched = self.fetch()?;
        let read_at = self.e.now();
        let after = self.take_purged(&mut before, fetched, &mut exp, now, read_at)?;
        self.check_transitions(&before, &after, &exp, now)?;
        self.check_steps(&exp)?;
        self.check_state(&after)
    }

    fn in_scope(&self, r: &RunRow, tenant: &TenantPick, id: &str) -> bool {
        let tenant_ok = !self.mt || tenant.arg() == self.targ(r.tenant_id.as_deref());
        tenant_ok && r.scope_entity_type() == Some(SCOPE_TYPE) && r.scope_entity_id() == Some(id)
    }

    /// A claimed run was its lane's head (shadow order) with no running
    /// member, and was pending and due.
    fn check_claim(&mut self, before: &[RunRow], claimed: &RunRow) -> Check {
        let b = &before[self.pos[&claimed.id]];
        ensure!(
            b.status == RunStatus::Pending && b.run_at <= self.e.now(),
            "claimed a run that was {} with runAt {} (now {})",
            b.status,
            b.run_at,
            self.e.now()
        );
        if let Some(k) = Self::lane_key(b) {
            let lanes = self.lanes(before);
            let members = &lanes[&k];
            if members.len() > 1 {
                self.note("claimed a lane head with waiters");
            }
            if b.lane_seq() != b.seq {
                self.note("claimed a replayed lane run");
            }
            ensure!(
                members[0] == self.pos[&b.id],
                "claimed lane run {} is not its lane's earliest member ({:?})",
                b.id,
                members.iter().map(|i| before[*i].id).collect::<Vec<_>>()
            );
            ensure!(
                members
                    .iter()
                    .all(|i| before[*i].status != RunStatus::Running),
                "claimed lane run {} while its lane has a running run",
                b.id
            );
        }
        Ok(())
    }

    fn op_start(&mut self, s: &StartOp, before: &[RunRow], now: Millis, exp: &mut Expect) -> Check {
        let def = self.defs[s.ty].clone();
        let ty = TYPES[s.ty];
        let parent = s
            .parent
            .as_ref()
            .and_then(|(ix, pol, pref)| Some((self.pick(before, ix, *pref)?, *pol)));
        let tpick = if parent.is_some() && s.inherit {
            TenantPick::Missing
        } else {
            s.tenant
        };
        let parent_row = if s.bad_parent {
            None
        } else {
            parent.map(|(i, _)| &before[i])
        };
        let parent_id = if s.bad_parent {
            Some(Uuid::new_v4().to_string())
        } else {
            parent_row.map(|p| p.id.to_string())
        };
        let input = match s.key {
            Some(k) => format!(r#"{{"k":"{k}"}}"#),
            None => "{}".to_owned(),
        };
        let req = StartRequest {
            job_type: ty.to_owned(),
            input: raw(&input),
            tenant: tpick.arg(),
            scope: s.scope.map(|e| (SCOPE_TYPE.to_owned(), e.to_owned())),
            scope_entity_id_from_meta: s.meta_scope.map(str::to_owned),
            pool: s.pool.map(str::to_owned),
            run_at: s.run_at.map(|o| now + o),
            priority: s.priority,
            parent_close_policy: parent.map(|(_, p)| p),
            parent_run_id: parent_id.clone(),
            ..StartRequest::default()
        };
        let res = self.e.start(req);

        // What the contract says should happen, computed from the rows.
        if let Err(e) = &res {
            *self.stats.entry(e.code()).or_default() += 1;
        }
        let expect_err = |code_: &str, res: &Result<RunRow>| -> Check {
            ensure!(
                code(res) == Some(code_),
                "start: expected {code_}, got {:?}",
                res.as_ref().map(|r| r.id)
            );
            Ok(())
        };
        if self.mt && tpick == TenantPick::Missing && parent_id.is_none() {
            return expect_err("MISSING_TENANT_ID", &res);
        }
        let tenant: Option<Arc<str>> = match (self.mt, tpick) {
            (false, _) => None,
            (true, TenantPick::Missing) => parent_row.and_then(|p| p.tenant_id.clone()),
            (true, TenantPick::Null) => None,
            (true, TenantPick::A) => Some(Arc::from("A")),
            (true, TenantPick::B) => Some(Arc::from("B")),
        };
        let parent_visible = parent_row.is_some_and(|p| !self.mt || p.tenant_id == tenant);
        let dkey = match (def.dedupe, s.key) {
            (None, _) => None,
            (Some(_), None) => return expect_err("JOB_TEMPLATE_FIELD_MISSING", &res),
            (Some(_), Some(k)) => Some(k),
        };
        if let (Some(k), Some(Some(w))) = (dkey, def.dedupe) {
            if w > 0 {
                let hit = before.iter().rev().find(|r| {
                    &*r.job_type == ty
                        && r.dedupe_key() == Some(k)
                        && r.tenant_id == tenant
                        && r.created_at > now - w
                        && !matches!(r.status, RunStatus::Canceled | RunStatus::Failed)
                });
                if let Some(hit) = hit {
                    let got = res.map_err(|e| format!("start: expected dedupe hit, got {e}"))?;
                    ensure!(
                        got.id == hit.id && got.to_json() == hit.to_json(),
                        "start: dedupe returned {}, expected the newest live run {}",
                        got.id,
                        hit.id
                    );
                    self.note("dedupe hit");
                    return Ok(());
                }
            }
        }
        let ckey = match (def.lane, s.key) {
            (None, _) => None,
            (Some(_), None) => return expect_err("JOB_TEMPLATE_FIELD_MISSING", &res),
            (Some((tpl, mode)), Some(k)) => Some((tpl.replace("{{k}}", k), mode)),
        };
        let lane: Vec<usize> = match &ckey {
            Some((k, _)) => self
                .lanes(before)
                .remove(&(tenant.clone(), Box::from(k.as_str())))
                .unwrap_or_default(),
            None => Vec::new(),
        };
        if let Some((k, CollisionMode::Reject)) = &ckey {
            if let Some(&head) = lane.first() {
                return match res {
                    Err(JobError::JobCollision {
                        incumbent,
                        concurrency_key,
                        ..
                    }) => {
                        ensure!(
                            incumbent.id == before[head].id
                                && incumbent.to_json() == before[head].to_json()
                                && concurrency_key == *k,
                            "collision reports {} on '{concurrency_key}', expected lane head {}",
                            incumbent.id,
                            before[head].id
                        );
                        Ok(())
                    }
                    other => Err(format!(
                        "start: expected JobCollision, got {:?}",
                        other.map(|r| r.id)
                    )),
                };
            }
        }
        if parent_id.is_some() && !parent_visible {
            return expect_err("PARENT_RUN_NOT_FOUND", &res);
        }
        if let Some((_, CollisionMode::Replace)) = &ckey {
            let mut all = HashSet::new();
            for &m in &lane {
                all.extend(Self::cancel_set(before, m, true, true));
            }
            if all.len() > 1 {
                self.note("replace canceled several runs");
            }
            Self::expect_cancels(exp, all.into_iter().collect())?;
        }
        let row = res.map_err(|e| format!("start: expected a new run, got {e}"))?;
        ensure!(
            !self.pos.contains_key(&row.id),
            "start reused id {}",
            row.id
        );
        let scope = match (s.scope, def.scope_entity, s.meta_scope) {
            (Some(e), _, _) => Some(e),
            (None, true, Some(e)) => Some(e),
            _ => None,
        };
        let checks = [
            ("status", row.status == RunStatus::Pending),
            ("jobType", &*row.job_type == ty),
            ("tenant", row.tenant_id == tenant),
            (
                "parentRunId",
                row.parent_run_id() == parent_row.map(|p| p.id),
            ),
            (
                "rootRunId",
                row.root_run_id() == parent_row.map_or(row.id, |p| p.root_run_id()),
            ),
            (
                "parentClosePolicy",
                row.parent_close_policy == parent.map_or(ParentClosePolicy::Terminate, |(_, p)| p),
            ),
            ("pool", &*row.pool == s.pool.unwrap_or(def.pool)),
            (
                "priority",
                row.priority == s.priority.or(def.priority_default).unwrap_or(0),
            ),
            ("runAt", row.run_at == s.run_at.map_or(now, |o| now + o)),
            ("createdAt", row.created_at == now),
            ("attempts", row.attempts == 0),
            (
                "concurrencyKey",
                row.concurrency_key() == ckey.as_ref().map(|(k, _)| k.as_str()),
            ),
            ("dedupeKey", row.dedupe_key() == dkey),
            (
                "scope",
                row.scope_entity_type() == scope.map(|_| SCOPE_TYPE)
                    && row.scope_entity_id() == scope,
            ),
            (
                "nulls",
                row.started_at.get().is_none()
                    && row.finished_at.get().is_none()
                    && row.claimed_at.get().is_none()
                    && row.output().is_none()
                    && row.error().is_none(),
            ),
            ("input", row.input.get() == input),
        ];
        for (field, ok) in checks {
            ensure!(ok, "start: new run has a wrong {field}: {}", row.to_json());
        }
        self.pos.insert(row.id, self.ids.len());
        self.ids.push(row.id);
        self.tenant.insert(row.id, row.tenant_id.clone());
        self.next_order += 1;
        self.lane_order.insert(row.id, self.next_order);
        exp.created = true;
        if lane.len() > 1 {
            self.note("queued behind two or more runs");
        }
        if self.mt && parent_row.is_some() && tpick == TenantPick::Missing {
            self.note("child inherited its parent's tenant");
        }
        Ok(())
    }

    fn op_finish(
        &mut self,
        before: &[RunRow],
        i: usize,
        outcome: Outcome,
        stale: bool,
        now: Millis,
        exp: &mut Expect,
    ) -> Check {
        let r = &before[i];
        let epoch = if stale {
            r.claim_epoch.wrapping_sub(1)
        } else {
            r.claim_epoch
        };
        let out_text = format!(r#"{{"op":{}}}"#, self.op_no);
        let (attempt_outcome, name) = match outcome {
            Outcome::Complete => (AttemptOutcome::Completed(None), None),
            Outcome::CompleteWithOutput => (AttemptOutcome::Completed(Some(raw(&out_text))), None),
            Outcome::Fail | Outcome::Fatal => {
                let name = (outcome == Outcome::Fatal).then(|| "Fatal".to_owned());
                (
                    AttemptOutcome::Failed(FailureInfo {
                        message: "boom".into(),
                        name: name.clone(),
                        ..FailureInfo::default()
                    }),
                    name,
                )
            }
            Outcome::TimedOut => (
                AttemptOutcome::TimedOut { timeout_ms: 30 },
                Some("JobTimeoutError".to_owned()),
            ),
            Outcome::NoHandler => (AttemptOutcome::NoHandler, None),
        };
        let res = self
            .e
            .finish_attempt(&r.id, epoch, attempt_outcome)
            .map_err(|e| format!("finish_attempt: {e}"))?;
        if stale || r.status != RunStatus::Running {
            ensure!(
                res.is_none(),
                "finish_attempt on a {} run (stale {stale}) was applied",
                r.status
            );
            return Ok(());
        }
        let got = res.ok_or("finish_attempt on a running run was not applied")?;
        let attempts = r.attempts + 1;
        let policy = self.def_of(&r.job_type).policy();
        let change = match outcome {
            Outcome::Complete => Change::End {
                status: RunStatus::Completed,
                output: "{}".to_owned(),
            },
            Outcome::CompleteWithOutput => Change::End {
                status: RunStatus::Completed,
                output: out_text,
            },
            _ => {
                let code_ = (outcome == Outcome::TimedOut).then_some("JOB_TIMEOUT");
                let allowed = outcome != Outcome::NoHandler
                    && policy.non_retryable_errors.as_ref().is_none_or(|l| {
                        !l.iter().any(|n| {
                            Some(n.as_str()) == name.as_deref() || Some(n.as_str()) == code_
                        })
                    });
                if allowed && attempts < policy.attempts {
                    self.note("retry");
                    Change::Retry {
                        run_at: now + backoff(&policy, attempts),
                    }
                } else {
                    let status = if outcome == Outcome::TimedOut {
                        RunStatus::TimedOut
                    } else {
                        RunStatus::Failed
                    };
                    let set = Self::cancel_set(before, i, false, true);
                    if !set.is_empty() {
                        self.note("failure cascaded");
                    }
                    Self::expect_cancels(exp, set)?;
                    Change::End {
                        status,
                        output: String::new(),
                    }
                }
            }
        };
        ensure!(
            got.id == r.id,
            "finish_attempt returned another run {}",
            got.id
        );
        exp.add(r.id, change)?;
        Ok(())
    }

    fn op_replay(&mut self, before: &[RunRow], i: usize, _now: Millis, exp: &mut Expect) -> Check {
        let r = &before[i];
        let steps_before = self.steps_of(&r.id);
        // The run's own tenant: the gate itself is tested in engine.rs.
        let res = self
            .e
            .replay(&r.id.to_string(), &self.targ(r.tenant_id.as_deref()));
        if !r.status.is_terminal() {
            ensure!(
                code(&res) == Some("JOB_NOT_REPLAYABLE"),
                "replay of a {} run: {:?}",
                r.status,
                res.map(|x| x.id)
            );
            return Ok(());
        }
        let got = res.map_err(|e| format!("replay: {e}"))?;
        ensure!(got.id == r.id, "replay returned another run");
        let keep_completed = self.def_of(&r.job_type).replay_from != ReplayFrom::Scratch;
        let expected: Vec<(String, u32)> = steps_before
            .iter()
            .filter(|s| keep_completed && s.status == StepStatus::Completed)
            .map(step_key)
            .collect();
        let now_steps: Vec<(String, u32)> = self.steps_of(&r.id).iter().map(step_key).collect();
        ensure!(
            now_steps == expected,
            "replay ({:?}) left steps {now_steps:?}, expected {expected:?}",
            self.def_of(&r.job_type).replay_from
        );
        exp.steps_touched.insert(r.id);
        if r.concurrency_key().is_some() {
            self.note("replayed a lane run");
        }
        if !expected.is_empty() {
            self.note("replay kept memoized steps");
        }
        self.next_order += 1;
        self.lane_order.insert(r.id, self.next_order);
        exp.add(r.id, Change::Replay)
    }

    fn op_step(&mut self, r: &RunRow, step: u8, action: StepAction) -> Check {
        let id = r.id.to_string();
        let step_id = format!("s{step}");
        let epoch = r.claim_epoch;
        let prev = self
            .steps_of(&r.id)
            .into_iter()
            .find(|s| *s.step_id == *step_id);
        let running = r.status == RunStatus::Running;
        match action {
            StepAction::Run => {
                // ctx.step: begin, and complete unless memoized.
                self.op_step(r, step, StepAction::Begin)?;
                let started = self
                    .steps_of(&r.id)
                    .iter()
                    .any(|s| *s.step_id == *step_id && s.status == StepStatus::Running);
                if running && started {
                    self.op_step(r, step, StepAction::Complete)?;
                }
                return Ok(());
            }
            StepAction::Begin => {
                let res = self.e.step_begin(&id, epoch, &step_id);
                if !running {
                    ensure!(
                        code(&res) == Some("JOB_RUN_STATE"),
                        "step_begin on a {} run: {res:?}",
                        r.status
                    );
                    return Ok(());
                }
                match (&prev, res) {
                    (Some(p), Ok(StepBegin::Memoized(out)))
                        if p.status == StepStatus::Completed =>
                    {
                        self.note("step memoized");
                        ensure!(
                            out.as_ref().map(|o| o.get()) == p.output.as_ref().map(|o| o.get()),
                            "memoized output differs"
                        );
                    }
                    (Some(p), Err(JobError::JobStepConflict { .. }))
                        if p.status == StepStatus::Running && p.epoch == epoch => {}
                    (p, Ok(StepBegin::Started { attempt }))
                        if p.as_ref().is_none_or(|p| {
                            p.status != StepStatus::Completed
                                && !(p.status == StepStatus::Running && p.epoch == epoch)
                        }) =>
                    {
                        let want = p.as_ref().map_or(0, |p| p.attempts) + 1;
                        ensure!(attempt == want, "step attempt {attempt}, expected {want}");
                    }
                    (p, res) => {
                        return Err(format!(
                            "step_begin: previous {:?}, got {res:?}",
                            p.as_ref().map(|p| (p.status, p.epoch))
                        ))
                    }
                }
            }
            StepAction::Complete => {
                let out = format!(r#"{{"step":{}}}"#, self.op_no);
                let res = self.e.step_complete(&id, epoch, &step_id, Some(raw(&out)));
                if !running || prev.is_none() {
                    ensure!(
                        code(&res) == Some("JOB_RUN_STATE"),
                        "step_complete (run {}, step {:?}): {res:?}",
                        r.status,
                        prev.map(|p| p.status)
                    );
                } else {
                    res.map_err(|e| format!("step_complete: {e}"))?;
                }
            }
            StepAction::Fail => {
                let res = self
                    .e
                    .step_fail(
                        &id,
                        epoch,
                        &step_id,
                        FailureInfo {
                            message: "step boom".into(),
                            ..FailureInfo::default()
                        },
                        None,
                    )
                    .map_err(|e| format!("step_fail: {e}"))?;
                ensure!(res.is_none(), "step_fail without policy asked for a retry");
            }
        }
        let now_steps = self.steps_of(&r.id);
        let seqs: HashSet<u32> = now_steps.iter().map(|s| s.seq).collect();
        ensure!(
            seqs.len() == now_steps.len(),
            "two steps of run {} share a seq",
            r.id
        );
        Ok(())
    }

    // ── checks ─────────────────────────────────────────────────────────

    fn check_transitions(
        &self,
        before: &[RunRow],
        after: &[RunRow],
        exp: &Expect,
        now: Millis,
    ) -> Check {
        ensure!(
            after.len() == before.len() + usize::from(exp.created),
            "run count {} -> {} (created {})",
            before.len(),
            after.len(),
            exp.created
        );
        for id in exp.changes.keys() {
            ensure!(self.pos[id] < before.len(), "test bug: change on a new run");
        }
        for (b, a) in before.iter().zip(after) {
            let immutable = b.id == a.id
                && b.job_type == a.job_type
                && b.job_version == a.job_version
                && b.parent_run_id() == a.parent_run_id()
                && b.root_run_id() == a.root_run_id()
                && b.parent_close_policy == a.parent_close_policy
                && b.scope_entity_type() == a.scope_entity_type()
                && b.scope_entity_id() == a.scope_entity_id()
                && b.tenant_id == a.tenant_id
                && b.tags().as_ref().map(|t| t.get()) == a.tags().as_ref().map(|t| t.get())
                && b.pool == a.pool
                && b.priority == a.priority
                && b.concurrency_key() == a.concurrency_key()
                && b.dedupe_key() == a.dedupe_key()
                && b.input.get() == a.input.get()
                && b.trigger_source == a.trigger_source
                && b.created_at == a.created_at
                && b.seq == a.seq;
            ensure!(
                immutable,
                "an immutable field of {} changed:\n{}\n{}",
                b.id,
                b.to_json(),
                a.to_json()
            );
            let change = exp.changes.get(&b.id);
            // Legal transitions, whatever the operation.
            use RunStatus::*;
            let legal = b.status == a.status
                || matches!(
                    (b.status, a.status),
                    (Pending, Running)
                        | (Running, Pending)
                        | (Running, Completed | Failed | TimedOut | Canceled)
                        | (Pending, Canceled)
                )
                || (b.status.is_terminal()
                    && a.status == Pending
                    && change == Some(&Change::Replay));
            ensure!(
                legal,
                "illegal transition {} -> {} of {} ({change:?})",
                b.status,
                a.status,
                b.id
            );
            // Terminal rows change only through replay.
            if b.status.is_terminal() && change != Some(&Change::Replay) {
                ensure!(
                    a.to_json() == b.to_json() && a.lane_seq() == b.lane_seq(),
                    "terminal run {} changed without replay:\n{}\n{}",
                    b.id,
                    b.to_json(),
                    a.to_json()
                );
            }
            let Some(change) = change else {
                ensure!(
                    a.to_json() == b.to_json()
                        && a.lane_seq() == b.lane_seq()
                        && a.claim_epoch == b.claim_epoch,
                    "run {} changed but the operation may not touch it:\n{}\n{}",
                    b.id,
                    b.to_json(),
                    a.to_json()
                );
                continue;
            };
            let same_lane = a.lane_seq() == b.lane_seq();
            let err = |e: &Option<&RunError>| e.map(|e| (e.retryable, e.attempt));
            let ok = match change {
                Change::Claim => {
                    b.status == Pending
                        && a.status == Running
                        && a.claimed_at == now.into()
                        && a.started_at == now.into()
                        && a.finished_at.get().is_none()
                        && a.claim_epoch == b.claim_epoch.wrapping_add(1)
                        && a.attempts == b.attempts
                        && a.run_at == b.run_at
                        && same_lane
                }
                Change::Retry { run_at } => {
                    b.status == Running
                        && a.status == Pending
                        && a.attempts == b.attempts + 1
                        && a.run_at == *run_at
                        && a.claimed_at.get().is_none()
                        && a.started_at.get().is_none()
                        && a.finished_at.get().is_none()
                        && err(&a.error()) == Some((true, a.attempts))
                        && a.claim_epoch == b.claim_epoch
                        && same_lane
                }
                Change::End { status, output } => {
                    b.status == Running
                        && a.status == *status
                        && a.attempts == b.attempts + 1
                        && a.finished_at == now.into()
                        && a.claim_epoch == b.claim_epoch
                        && same_lane
                        && if *status == Completed {
                            a.output().as_ref().map(|o| o.get()) == Some(output.as_str())
                        } else {
                            err(&a.error()) == Some((false, a.attempts)) && a.output().is_none()
                        }
                }
                Change::Cancel => {
                    !b.status.is_terminal()
                        && a.status == Canceled
                        && a.finished_at == now.into()
                        && a.attempts == b.attempts
                        && a.run_at == b.run_at
                        && a.claim_epoch == b.claim_epoch
                        && same_lane
                }
                Change::Replay => {
                    b.status.is_terminal()
                        && a.status == Pending
                        && a.attempts == 0
                        && a.run_at == now
                        && a.started_at.get().is_none()
                        && a.finished_at.get().is_none()
                        && a.claimed_at.get().is_none()
                        && a.error().is_none()
                        && a.output().is_none()
                        // Only a lane member has a lane position to move.
                        && (a.concurrency_key().is_none() || a.lane_seq() > b.lane_seq())
                }
                Change::Release => {
                    b.status == Running
                        && a.status == Pending
                        && a.attempts == b.attempts
                        // Its due time is kept: it goes back to its place.
                        && a.run_at == b.run_at
                        && a.claimed_at.get().is_none()
                        && a.started_at.get().is_none()
                        && a.claim_epoch == b.claim_epoch
                        && same_lane
                }
                Change::Reschedule { run_at } => {
                    b.status == Pending
                        && a.status == Pending
                        && a.run_at == *run_at
                        && a.attempts == b.attempts
                        && same_lane
                }
            };
            ensure!(
                ok,
                "run {} did not undergo {change:?}:\n{}\n{}",
                b.id,
                b.to_json(),
                a.to_json()
            );
        }
        if exp.created {
            let a = after.last().ok_or("no created row")?;
            ensure!(
                a.status == RunStatus::Pending,
                "created run not pending after the operation: {}",
                a.to_json()
            );
        }
        Ok(())
    }

    /// Steps change only on the runs the operation may touch.
    fn check_steps(&mut self, exp: &Expect) -> Check {
        for id in &exp.steps_touched {
            self.steps.entry(*id).or_default();
        }
        let ids: Vec<RunId> = self.steps.keys().copied().collect();
        for id in ids {
            let now_steps: Vec<(String, u32)> = self.steps_of(&id).iter().map(step_key).collect();
            if !exp.steps_touched.contains(&id) {
                ensure!(
                    self.steps[&id] == now_steps,
                    "steps of {id} changed but the operation may not touch them"
                );
            }
            self.steps.insert(id, now_steps);
        }
        Ok(())
    }

    fn check_state(&self, rows: &[RunRow]) -> Check {
        self.e
            .store()
            .verify_indexes()
            .map_err(|e| format!("verify_indexes: {e}"))?;
        let now = self.e.now();
        // Row shapes and lineage.
        for (i, r) in rows.iter().enumerate() {
            let shape = match r.status {
                RunStatus::Pending => {
                    r.claimed_at.get().is_none()
                        && r.started_at.get().is_none()
                        && r.finished_at.get().is_none()
                        && r.output().is_none()
                }
                RunStatus::Running => {
                    r.claimed_at.get().is_some()
                        && r.claimed_at == r.started_at
                        && r.finished_at.get().is_none()
                        && r.output().is_none()
                }
                RunStatus::Waiting => false,
                RunStatus::Completed => r.finished_at.get().is_some() && r.output().is_some(),
                RunStatus::Failed | RunStatus::TimedOut => {
                    r.finished_at.get().is_some()
                        && r.error().as_ref().is_some_and(|e| !e.retryable)
                        && r.output().is_none()
                }
                RunStatus::Canceled => r.finished_at.get().is_some() && r.output().is_none(),
            };
            ensure!(shape, "row shape of a {} run: {}", r.status, r.to_json());
            ensure!(
                r.created_at <= now && r.updated_at <= now,
                "timestamps in the future: {}",
                r.to_json()
            );
            match r.parent_run_id() {
                None => ensure!(
                    r.root_run_id() == r.id,
                    "root run {} has another root",
                    r.id
                ),
                Some(p) if self.purged.contains(&p) => {}
                Some(p) => {
                    let pi = self.pos[&p];
                    ensure!(pi < i, "parent created after child");
                    ensure!(
                        r.root_run_id() == rows[pi].root_run_id(),
                        "child {} has root {}, parent's is {}",
                        r.id,
                        r.root_run_id(),
                        rows[pi].root_run_id()
                    );
                    ensure!(
                        !self.mt || r.tenant_id == rows[pi].tenant_id,
                        "child {} has another tenant than its parent",
                        r.id
                    );
                }
            }
            if !self.mt {
                ensure!(r.tenant_id.is_none(), "tenant stored in single-tenant mode");
            }
        }
        // Lanes: at most one running run, and it is the head; engine lane
        // order equals the shadow order.
        for (k, members) in self.lanes(rows) {
            let running: Vec<usize> = members
                .iter()
                .copied()
                .filter(|i| rows[*i].status == RunStatus::Running)
                .collect();
            ensure!(
                running.len() <= 1,
                "lane {k:?} has {} running runs",
                running.len()
            );
            if let Some(&r) = running.first() {
                ensure!(
                    r == members[0],
                    "running run of lane {k:?} is not its earliest member"
                );
            }
            let mut by_engine = members.clone();
            by_engine.sort_by_key(|i| rows[*i].lane_seq());
            ensure!(
                by_engine == members,
                "engine lane order of {k:?} differs from start/replay order"
            );
        }
        self.check_queries(rows)
    }

    /// Query services agree with a recomputation from the rows.
    fn check_queries(&self, rows: &[RunRow]) -> Check {
        let mut total = 0u64;
        for (arg, t) in self.tenant_args() {
            let mine: Vec<&RunRow> = rows.iter().filter(|r| r.tenant_id == t).collect();
            // Counts.
            let mut want: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
            for r in &mine {
                *want
                    .entry((r.pool.to_string(), r.status.as_str()))
                    .or_default() += 1;
            }
            let got: BTreeMap<(String, &'static str), u64> = self
                .e
                .count_by_pool_and_status(&arg)
                .map_err(|e| format!("count_by_pool_and_status: {e}"))?
                .into_iter()
                .map(|(p, s, c)| ((p.to_string(), s.as_str()), c))
                .collect();
            ensure!(
                got == want,
                "counts for {t:?}: got {got:?}, rows say {want:?}"
            );
            total += got.values().sum::<u64>();
            // Recent failed: most recently finished first.
            let mut failed: Vec<&RunRow> = mine
                .iter()
                .copied()
                .filter(|r| r.status == RunStatus::Failed)
                .collect();
            failed.sort_by_key(|r| std::cmp::Reverse((r.finished_at.get(), r.id.as_u128())));
            let want: Vec<RunId> = failed.iter().map(|r| r.id).collect();
            let got: Vec<RunId> = self
                .e
                .list_recent_failed(&arg, 1000)
                .map_err(|e| format!("list_recent_failed: {e}"))?
                .iter()
                .map(|r| r.id)
                .collect();
            ensure!(got == want, "recent failed for {t:?}: {got:?} vs {want:?}");
            // Scope lists in created order.
            for sid in SCOPE_IDS {
                let want: Vec<RunId> = mine
                    .iter()
                    .filter(|r| {
                        r.scope_entity_type() == Some(SCOPE_TYPE)
                            && r.scope_entity_id() == Some(sid)
                    })
                    .map(|r| r.id)
                    .collect();
                let got: Vec<RunId> = self
                    .e
                    .list_for_scope(
                        &arg,
                        SCOPE_TYPE,
                        sid,
                        &ScopeQuery {
                            statuses: None,
                            job_type: None,
                            limit: 1000,
                            offset: 0,
                            order: ScopeOrder::CreatedAsc,
                        },
                    )
                    .map_err(|e| format!("list_for_scope: {e}"))?
                    .iter()
                    .map(|r| r.id)
                    .collect();
                ensure!(
                    got == want,
                    "scope {sid} for {t:?}: {got:?} vs rows {want:?}"
                );
            }
            // Paged listing, newest first, through the cursor.
            let newest = |filter: &dyn Fn(&RunRow) -> bool| -> Vec<RunId> {
                let mut v: Vec<&RunRow> = mine.iter().copied().filter(|r| filter(r)).collect();
                v.sort_by_key(|r| std::cmp::Reverse((r.created_at, r.id.as_u128())));
                v.iter().map(|r| r.id).collect()
            };
            let page_all = |q: JobRunQuery| -> std::result::Result<Vec<RunId>, String> {
                let mut out = Vec::new();
                let mut q = q;
                for _ in 0..1000 {
                    let (rows, next) = self
                        .e
                        .list_job_runs(&arg, &q)
                        .map_err(|e| format!("list_job_runs: {e}"))?;
                    ensure!(rows.len() <= q.limit, "page longer than its limit");
                    out.extend(rows.iter().map(|r| r.id));
                    match next {
                        Some(c) => {
                            // Only a walk that used its budget (a job-type
                            // filter, or a scope page's filters) may come
                            // back empty with a cursor.
                            ensure!(
                                !rows.is_empty() || q.job_type.is_some() || q.scope.is_some(),
                                "empty page with a next cursor"
                            );
                            q.cursor = Some(c);
                        }
                        None => return Ok(out),
                    }
                }
                Err("paging does not end".to_owned())
            };
            let got = page_all(JobRunQuery {
                limit: 7,
                ..JobRunQuery::default()
            })?;
            ensure!(got == newest(&|_| true), "paged listing for {t:?} differs");
            for pool in POOLS {
                let got = page_all(JobRunQuery {
                    pool: Some(pool.to_owned()),
                    limit: 1000,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&|r| &*r.pool == pool),
                    "listing of pool {pool} for {t:?} differs"
                );
            }
            for status in [RunStatus::Pending, RunStatus::Running, RunStatus::Canceled] {
                let got = page_all(JobRunQuery {
                    statuses: Some(vec![status]),
                    limit: 1000,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&|r| r.status == status),
                    "listing of {status} runs for {t:?} differs"
                );
            }
            // A set of statuses (one named twice), with and without a pool,
            // in pages smaller than the result.
            let live = [RunStatus::Pending, RunStatus::Running, RunStatus::Pending];
            let got = page_all(JobRunQuery {
                statuses: Some(live.to_vec()),
                limit: 3,
                ..JobRunQuery::default()
            })?;
            ensure!(
                got == newest(&|r| matches!(r.status, RunStatus::Pending | RunStatus::Running)),
                "listing of pending and running runs for {t:?} differs"
            );
            for pool in POOLS {
                let got = page_all(JobRunQuery {
                    pool: Some(pool.to_owned()),
                    statuses: Some(vec![RunStatus::Canceled, RunStatus::Running]),
                    limit: 2,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&|r| &*r.pool == pool
                        && matches!(r.status, RunStatus::Canceled | RunStatus::Running)),
                    "listing of canceled and running runs of pool {pool} for {t:?} differs"
                );
            }
            let got = page_all(JobRunQuery {
                statuses: Some(Vec::new()),
                limit: 5,
                ..JobRunQuery::default()
            })?;
            ensure!(got.is_empty(), "an empty status set listed rows for {t:?}");
            // A job type (checked per row) and a scope (its index), alone,
            // together and with a status, in small pages.
            for ty in TYPES {
                let got = page_all(JobRunQuery {
                    job_type: Some(ty.to_owned()),
                    limit: 3,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&|r| &*r.job_type == ty),
                    "listing of type {ty} for {t:?} differs"
                );
            }
            for sid in SCOPE_IDS {
                let in_scope = |r: &RunRow| {
                    r.scope_entity_type() == Some(SCOPE_TYPE) && r.scope_entity_id() == Some(sid)
                };
                let scope = Some((SCOPE_TYPE.to_owned(), sid.to_owned()));
                let got = page_all(JobRunQuery {
                    scope: scope.clone(),
                    limit: 2,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&in_scope),
                    "listing of scope {sid} for {t:?} differs"
                );
                let got = page_all(JobRunQuery {
                    scope,
                    job_type: Some(TYPES[0].to_owned()),
                    statuses: Some(vec![RunStatus::Pending, RunStatus::Canceled]),
                    limit: 2,
                    ..JobRunQuery::default()
                })?;
                ensure!(
                    got == newest(&|r| in_scope(r)
                        && &*r.job_type == TYPES[0]
                        && matches!(r.status, RunStatus::Pending | RunStatus::Canceled)),
                    "listing of scope {sid}, type and statuses for {t:?} differs"
                );
            }
            // Trees: by rootRunId through the listing, subtree via run_tree.
            for r in &mine {
                if r.parent_run_id().is_none() {
                    let got = page_all(JobRunQuery {
                        root_run_id: Some(r.id.to_string()),
                        limit: 1000,
                        ..JobRunQuery::default()
                    })?;
                    ensure!(
                        got == newest(&|x| x.root_run_id() == r.id),
                        "tree listing of root {} differs",
                        r.id
                    );
                }
            }
        }
        ensure!(
            total == rows.len() as u64,
            "counts add up to {total}, {} runs exist",
            rows.len()
        );
        // run_tree of every run is its subtree through parent links.
        let mut kids: HashMap<RunId, Vec<RunId>> = HashMap::new();
        for r in rows {
            if let Some(p) = r.parent_run_id() {
                kids.entry(p).or_default().push(r.id);
            }
        }
        for r in rows {
            let mut want = HashSet::new();
            let mut stack = vec![r.id];
            while let Some(x) = stack.pop() {
                want.insert(x);
                stack.extend(kids.get(&x).into_iter().flatten().copied());
            }
            let tree = self
                .e
                .run_tree(&self.targ(r.tenant_id.as_deref()), &r.id.to_string())
                .map_err(|e| format!("run_tree: {e}"))?
                .ok_or("run_tree of an existing run is None")?;
            ensure!(
                tree.first().map(|x| x.id) == Some(r.id),
                "run_tree root first"
            );
            let got: HashSet<RunId> = tree.iter().map(|x| x.id).collect();
            ensure!(
                got.len() == tree.len() && got == want,
                "run_tree of {} differs from its subtree",
                r.id
            );
        }
        Ok(())
    }
}

type Stats = BTreeMap<&'static str, u64>;

fn retention() -> impl Strategy<Value = Retention> {
    let ms = || select(vec![None, Some(0i64), Some(15)]);
    (ms(), ms()).prop_map(|(completed_ms, failed_ms)| Retention {
        completed_ms,
        failed_ms,
    })
}

/// Definitions and operations of one case under a profile.
fn case_with(p: Profile) -> impl Strategy<Value = (Vec<DefCfg>, Vec<Op>)> {
    (
        prop::collection::vec(def_cfg(p), TYPES.len()),
        prop::collection::vec(op(p), 1..=60),
    )
}

/// A case under any of the profiles.
fn case() -> impl Strategy<Value = (Vec<DefCfg>, Vec<Op>)> {
    prop_oneof![case_with(BALANCED), case_with(TREES), case_with(LANES)]
}

/// Runs one case; returns the situations it reached and the first broken
/// invariant, if any.
fn run_case_stats(mt: bool, retention: Retention, defs: Vec<DefCfg>, ops: &[Op]) -> (Stats, Check) {
    let mut h = Harness::new(mt, defs, retention);
    let mut result = h.check_state(&[]);
    for (i, op) in ops.iter().enumerate() {
        if result.is_err() {
            break;
        }
        result = h
            .apply(op)
            .map_err(|e| format!("after op #{i} {op:?}:\n{e}"));
    }
    (h.stats, result)
}

fn run_case(mt: bool, retention: Retention, defs: Vec<DefCfg>, ops: &[Op]) -> Check {
    run_case_stats(mt, retention, defs, ops).1
}

/// 256 cases per property; `PROPTEST_CASES` overrides for a deeper run.
fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_sequences_keep_invariants_single_tenant((defs, ops) in case()) {
        run_case(false, Retention::default(), defs, &ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn random_sequences_keep_invariants_multi_tenant((defs, ops) in case()) {
        run_case(true, Retention::default(), defs, &ops).map_err(TestCaseError::fail)?;
    }

    /// Deep trees, cancels and failures: every cascade cancels exactly the
    /// live descendants reachable through non-`abandon` edges.
    #[test]
    fn cascade_heavy_sequences_keep_invariants(mt in any::<bool>(), (defs, ops) in case_with(TREES)) {
        run_case(mt, Retention::default(), defs, &ops).map_err(TestCaseError::fail)?;
    }

    /// Terminal runs deleted by retention (slots reused): indexes, lanes,
    /// cascades and queries stay right, and nothing live is ever deleted.
    #[test]
    fn retention_sequences_keep_invariants(
        mt in any::<bool>(),
        retention in retention(),
        (defs, ops) in case(),
    ) {
        run_case(mt, retention, defs, &ops).map_err(TestCaseError::fail)?;
    }

    /// Shared lanes, claims and completions: one running run per lane, in
    /// start/rejoin order.
    #[test]
    fn lane_heavy_sequences_keep_invariants(mt in any::<bool>(), (defs, ops) in case_with(LANES)) {
        run_case(mt, Retention::default(), defs, &ops).map_err(TestCaseError::fail)?;
    }
}

/// The generator reaches the situations the properties are about: without
/// this, a generator change could quietly stop producing lanes, cascades or
/// dedupe hits and the properties would pass vacuously.
#[test]
fn generator_reaches_interesting_states() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (any::<bool>(), case());
    let mut total = Stats::new();
    for _ in 0..300 {
        let (mt, (defs, ops)) = strategy.new_tree(&mut runner).unwrap().current();
        // Broken invariants are the properties' business; this test only
        // counts what the generator reaches.
        let (stats, _) = run_case_stats(mt, Retention::default(), defs, &ops);
        for (k, v) in stats {
            *total.entry(k).or_default() += v;
        }
    }
    let strategy = (any::<bool>(), retention(), case());
    for _ in 0..50 {
        let (mt, retention, (defs, ops)) = strategy.new_tree(&mut runner).unwrap().current();
        let (stats, _) = run_case_stats(mt, retention, defs, &ops);
        for (k, v) in stats {
            *total.entry(k).or_default() += v;
        }
    }
    if std::env::var_os("JOBFORGE_PROPERTY_STATS").is_some() {
        eprintln!("{total:#?}");
    }
    for what in [
        "claim chose among several",
        "claim found nothing though runs are pending",
        "claimed a lane head with waiters",
        "claimed a replayed lane run",
        "cancel cascaded",
        "cancel left an abandon subtree alone",
        "canceled a child run",
        "cancel of another tenant's run",
        "cancel_for_scope canceled runs",
        "reschedule_for_scope moved runs",
        "dedupe hit",
        "replace canceled several runs",
        "queued behind two or more runs",
        "child inherited its parent's tenant",
        "retry",
        "failure cascaded",
        "replayed a lane run",
        "replay kept memoized steps",
        "step memoized",
        "purged a run",
        "purged a parent",
        "JOB_COLLISION",
        "JOB_TEMPLATE_FIELD_MISSING",
        "MISSING_TENANT_ID",
        "PARENT_RUN_NOT_FOUND",
    ] {
        assert!(
            total.get(what).copied().unwrap_or(0) > 0,
            "the generator never produced: {what} ({total:#?})"
        );
    }
}

// ── shrunk cases of failures found by the properties ─────────────────

/// Shrunk from `retention_sequences_keep_invariants`: a run purged by
/// retention leaves an empty per-tenant / per-pool set behind in the query
/// index, which `verify_indexes` (rightly or not) reports as a difference
/// from the rows. Either the purge must drop emptied sets or the check must
/// ignore empty ones; the two disagree today.
#[test]
fn retention_purge_leaves_indexes_matching_the_rows() {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::Manual,
            retention: Retention {
                completed_ms: Some(0),
                failed_ms: None,
            },
        },
    );
    e.register(DefinitionSpec {
        job_type: "t".into(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    e.start(StartRequest {
        job_type: "t".into(),
        input: raw("{}"),
        ..StartRequest::default()
    })
    .unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    e.finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    assert!(
        e.find_by_id(&c.id.to_string(), &TenantArg::Missing)
            .unwrap()
            .is_none(),
        "completed run with 0 ms retention is purged"
    );
    e.store().verify_indexes().unwrap();
}

/// Shrunk from `retention_sequences_keep_invariants` (found once the empty
/// set mismatch above is patched out locally): a run canceled at instant T
/// leaves a "failed/canceled" retention entry `(T, slot, seq)`. Replayed and
/// completed at the same instant T, the run matches that stale entry again
/// (same seq, terminal, same finishedAt), so it is purged under the
/// *canceled* retention although completed runs are kept forever.
#[test]
fn retention_never_deletes_a_run_under_another_status_class() {
    let e = Engine::new(
        MemoryStore::new(),
        EngineOptions {
            multi_tenant: false,
            clock: ClockKind::Manual,
            retention: Retention {
                completed_ms: None,
                failed_ms: Some(15),
            },
        },
    );
    e.register(DefinitionSpec {
        job_type: "t".into(),
        ..DefinitionSpec::default()
    })
    .unwrap();
    let start = || {
        e.start(StartRequest {
            job_type: "t".into(),
            input: raw("{}"),
            ..StartRequest::default()
        })
        .unwrap()
    };
    let run = start();
    let id = run.id.to_string();
    e.cancel(&id, true, &TenantArg::Missing).unwrap();
    e.replay(&id, &TenantArg::Missing).unwrap();
    let c = e.claim_next("batch").unwrap().unwrap();
    assert_eq!(c.id, run.id);
    e.finish_attempt(&c.id, c.claim_epoch, AttemptOutcome::Completed(None))
        .unwrap();
    e.advance_time(15);
    start(); // any transition runs the purge
    let row = e.find_by_id(&id, &TenantArg::Missing).unwrap();
    assert!(
        row.is_some_and(|r| r.status == RunStatus::Completed),
        "a completed run was deleted although completed runs are kept forever"
    );
}
