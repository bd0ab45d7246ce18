//! In-memory store: every primitive is answered from an index.
//!
//! | structure | serves | cost |
//! |---|---|---|
//! | `runs: Vec<RunRow>` + `ids: IdIndex` (slot per id hash) | lookup by id | O(1) |
//! | `run_groups: Vec<u32>` (by slot, beside `runs`) | a run's (tenant, pool) group | O(1) |
//! | per (tenant, pool) group: a `BTreeSet<(createdAt, id)>` and a count per status | queries, counts | O(log n) per transition |
//! | per pool `ready: BTreeSet<(−priority, runAt, seq)>` | claim | O(log n) |
//! | per pool `future: BTreeSet<(runAt, seq)>` | not-yet-due claimables | O(log n) per move, each run moves once |
//! | `lanes: HashMap<(tenant, key), BTreeMap<laneSeq, run>>` | lane head, reject/replace | O(log k) |
//! | `dedupe: HashMap<(tenant, type, key), Vec<run>>` (created order) | dedupe lookup | O(1) + skipped canceled/failed |
//! | `children: HashMap<run, Vec<run>>` | cascade | O(children) |
//! | `steps: HashMap<run, RunSteps>` | memoization | O(1) per step (a scan of ≤ 16, an index past that) |
//! | `waits: BTreeSet<(waitDeadline, seq, run)>` | resuming waiting runs at their deadline | O(log n) |
//! | `inbox: HashMap<run, VecDeque<signal>>` | signals no wait took yet | O(1) push, O(inbox) take (bounded) |
//!
//! Only claimable runs (pending and lane head or unkeyed) sit in a pool
//! index, so a lane of a million queued runs costs its pool one entry.

use super::{PageQuery, RunPage, Store, StoreTx, TenantRef};
use crate::error::Result;
use crate::model::{
    EventKind, JobDefinition, Millis, RunEvent, RunId, RunRow, RunStatus, ScheduleRow, StepRow,
    StepStatus,
};
use serde_json::value::RawValue;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// aHash: several times cheaper than SipHash for the short keys here (ids,
/// pool and lane names) while keeping per-process random keys, so
/// user-chosen keys cannot be crafted into collisions.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;
use std::sync::{Arc, Mutex, MutexGuard};

type Handle = u32;
type LaneKey = (Option<Arc<str>>, Box<str>);
/// Signals of one run no wait took yet: (name, payload), oldest first.
type Inbox = std::collections::VecDeque<(Box<str>, Box<RawValue>)>;
type DedupeKey = (Option<Arc<str>>, Arc<str>, Box<str>);
type ScopeKey = (Option<Arc<str>>, Box<str>, Box<str>);
/// The runs of each scope (see `QueryIndex::scope`), looked up by a
/// borrowed key: a start or purge of a scoped run allocates no key unless
/// its scope is new.
type ScopeMap = hashbrown::HashMap<ScopeKey, Vec<Handle>, ahash::RandomState>;

/// A `ScopeKey` borrowed. It hashes as the owned key does (the fields in
/// order, the tenant as an `Option` of its text).
#[derive(Hash)]
struct ScopeRef<'a>(Option<&'a str>, &'a str, &'a str);

impl hashbrown::Equivalent<ScopeKey> for ScopeRef<'_> {
    fn equivalent(&self, k: &ScopeKey) -> bool {
        self.0 == k.0.as_deref() && self.1 == &*k.1 && self.2 == &*k.2
    }
}

#[derive(Default)]
struct PoolIndex {
    /// Due claimables: highest priority, earliest runAt, earliest created.
    ready: BTreeSet<(Reverse<i32>, Millis, u64, Handle)>,
    /// Claimables whose runAt was in the future when they were indexed.
    future: BTreeSet<(Millis, u64, Handle)>,
    /// Time up to which `future` has been drained into `ready`.
    promoted_until: Millis,
}

/// A run's steps. Most runs have a handful, found by a scan of `rows`;
/// past `INDEXED_STEPS` an index by step id is built (a map per run would
/// cost more than the rows of a run with one step, e.g. one parked wait).
#[derive(Default)]
struct RunSteps {
    rows: Vec<StepRow>,
    by_id: Option<Box<HashMap<Box<str>, usize>>>,
}

const INDEXED_STEPS: usize = 16;

impl RunSteps {
    fn position(&self, step_id: &str) -> Option<usize> {
        match &self.by_id {
            Some(m) => m.get(step_id).copied(),
            None => self.rows.iter().position(|r| &*r.step_id == step_id),
        }
    }

    fn push(&mut self, row: StepRow) {
        let i = self.rows.len();
        if let Some(m) = &mut self.by_id {
            m.insert(row.step_id.clone(), i);
        }
        // Room for one: a first push would make room for four (608 B),
        // and most runs with steps have one (a parked wait, a single
        // `ctx.step`). Later pushes grow as usual (1, 4, 8, …).
        if self.rows.capacity() == 0 {
            self.rows.reserve_exact(1);
        }
        self.rows.push(row);
        if self.by_id.is_none() && self.rows.len() > INDEXED_STEPS {
            self.reindex();
        }
    }

    fn reindex(&mut self) {
        self.by_id = (self.rows.len() > INDEXED_STEPS).then(|| {
            Box::new(
                self.rows
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.step_id.clone(), i))
                    .collect(),
            )
        });
    }
}

#[derive(Default)]
pub struct MemoryState {
    definitions: HashMap<Arc<str>, Arc<JobDefinition>>,
    runs: Vec<RunRow>,
    /// Each run's group in `q.groups`, by slot beside `runs` (4 bytes a
    /// run): a transition finds its sets without hashing strings, and the
    /// row holds only what every store stores.
    run_groups: Vec<u32>,
    ids: IdIndex,
    /// Claim index per pool name, found through `claim_ids` (by name) or
    /// through a run's group (no string hashing on a transition).
    claim: Vec<PoolIndex>,
    claim_ids: HashMap<Arc<str>, u32>,
    lanes: HashMap<LaneKey, BTreeMap<u64, Handle>>,
    dedupe: HashMap<DedupeKey, Vec<Handle>>,
    children: HashMap<Handle, Vec<Handle>>,
    steps: HashMap<Handle, RunSteps>,
    /// Each run's timeline, oldest first, for the runs that have events
    /// (a run that was only created has none: its `created` event is the
    /// row), so a pending run costs nothing here.
    events: HashMap<Handle, Vec<StoredEvent>>,
    /// The last event number handed out.
    event_seq: u64,
    /// Waiting runs with a deadline, earliest first.
    waits: BTreeSet<(Millis, u64, Handle)>,
    /// Signals sent to a run that no wait took yet, oldest first.
    inbox: HashMap<Handle, Inbox>,
    seq: u64,
    q: QueryIndex,
    /// Slots of purged runs, reused by the next inserts.
    free: Vec<Handle>,
    /// Terminal runs in finishing order, for retention (only when on):
    /// `[0]` completed, `[1]` failed / timed out / canceled.
    finished: [std::collections::VecDeque<(Millis, Handle, u64)>; 2],
    track_finished: bool,
    /// Schedules by (tenant, name), and those that can fire by next fire
    /// time: a due check is a peek at the first entry.
    schedules: BTreeMap<(Tenant, String), ScheduleRow>,
    schedule_due: BTreeSet<(Millis, Tenant, String)>,
    /// How to undo what the current transaction changed, while one asked
    /// (`StoreTx::begin_undo`): this store has no rollback of its own.
    undo: Option<Vec<Undo>>,
    /// Ends (`Group::count_end`) made while an undo journal is kept or
    /// undone: counted only if the transaction keeps its changes, so a
    /// refused `start_many` (whose runs never existed) adds no end.
    deferred_ends: Option<Vec<(u32, Millis, RunStatus)>>,
}

/// One change a transaction made, as the undo journal keeps it: what a
/// start can change (`insert_run`, `update_run`, `put_step`: a `replace`
/// lane's cancel cascade and the waits it resolves).
enum Undo {
    /// A run this transaction inserted.
    Inserted(RunId),
    /// A run's row before an update.
    Row(Box<RunRow>),
    /// A step row before it was replaced (`None`: there was none).
    Step(RunId, Box<str>, Option<Box<StepRow>>),
    /// An event appended to a run's timeline (a `replace` start's cancels).
    Event(RunId),
}

/// An event as a run's timeline keeps it (its run is the key): 40 bytes.
struct StoredEvent {
    id: u64,
    at: Millis,
    kind: EventKind,
    attempt: u32,
    data: Option<Box<RawValue>>,
}

/// `(createdAt, id)`: the keyset order of `listJobRuns` (newest first).
/// The id as two u64 halves orders like the number and compares as two
/// integers, with 8-byte alignment, so a key is 32 bytes instead of 48 (a
/// `u128` forces 16-byte alignment).
type CreatedKey = (Millis, IdKey, Handle);
type IdKey = (u64, u64);
type Tenant = Option<Arc<str>>;

fn id_key(id: u128) -> IdKey {
    ((id >> 64) as u64, id as u64)
}

/// Position of a status in a group's per-status arrays.
fn si(s: RunStatus) -> usize {
    match s {
        RunStatus::Pending => 0,
        RunStatus::Running => 1,
        RunStatus::Waiting => 2,
        RunStatus::Completed => 3,
        RunStatus::Failed => 4,
        RunStatus::TimedOut => 5,
        RunStatus::Canceled => 6,
    }
}

/// The runs of one (tenant, pool): what the queries and counts read. A run
/// names its group in `MemoryState::run_groups`, so a status change moves
/// it between two sets of one group without hashing a string.
struct Group {
    tenant: Tenant,
    pool: Arc<str>,
    /// The pool's claim index in `MemoryState::claim`.
    claim: u32,
    by_status: [BTreeSet<CreatedKey>; 7],
    counts: [u64; 7],
    /// Runs that ended, per minute of their `finishedAt`, the last
    /// `ENDED_MINUTES` minutes (oldest first): `(minute, [completed, failed,
    /// timed out, canceled])`. A transition into a terminal status adds one.
    ended: std::collections::VecDeque<(i64, [u32; 4])>,
}

/// How many minutes of `Group::ended` are kept (`StoreTx::ended_per_minute`).
pub const ENDED_MINUTES: i64 = 60;

/// The terminal statuses, in the order of `Group::ended`'s counts.
const ENDED_STATUSES: [RunStatus; 4] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::TimedOut,
    RunStatus::Canceled,
];

impl Group {
    /// Counts one run that ended at `at` with `status` into its minute
    /// (kept in order; an end older than the minutes kept is dropped), and
    /// lets minutes too old go. O(log minutes kept).
    fn count_end(&mut self, at: Millis, status: RunStatus) {
        let Some(slot) = ENDED_STATUSES.iter().position(|s| *s == status) else {
            return;
        };
        let minute = at.div_euclid(60_000);
        let oldest_kept =
            self.ended.back().map_or(minute, |(m, _)| (*m).max(minute)) - ENDED_MINUTES;
        if minute <= oldest_kept {
            return;
        }
        let i = self.ended.partition_point(|(m, _)| *m < minute);
        match self.ended.get_mut(i) {
            Some((m, n)) if *m == minute => n[slot] += 1,
            _ => {
                let mut n = [0; 4];
                n[slot] = 1;
                self.ended.insert(i, (minute, n));
            }
        }
        while self.ended.front().is_some_and(|(m, _)| *m <= oldest_kept) {
            self.ended.pop_front();
        }
    }
}

impl Group {
    fn holds(&self, r: &RunRow) -> bool {
        (Arc::ptr_eq(&self.pool, &r.pool) || *self.pool == *r.pool)
            && self.tenant.as_deref() == r.tenant_id.as_deref()
    }
}

const ALL_STATUSES: [RunStatus; 7] = [
    RunStatus::Pending,
    RunStatus::Running,
    RunStatus::Waiting,
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::TimedOut,
    RunStatus::Canceled,
];

/// Run id -> slot. Keeps only the 4-byte slot per run and compares the id
/// against `runs[slot].id`: a `HashMap<Uuid, u32>` would hold a second
/// copy of every 16-byte id (about 44 bytes per run at 1M runs, against
/// about 10 here).
#[derive(Default)]
struct IdIndex {
    table: hashbrown::HashTable<Handle>,
    hasher: ahash::RandomState,
}

impl IdIndex {
    fn get(&self, runs: &[RunRow], id: &RunId) -> Option<Handle> {
        self.table
            .find(self.hasher.hash_one(id), |&h| runs[h as usize].id == *id)
            .copied()
    }

    /// `id` must not be present (ids are fresh UUIDs).
    fn insert(&mut self, runs: &[RunRow], id: RunId, h: Handle) {
        let hasher = &self.hasher;
        self.table.insert_unique(hasher.hash_one(id), h, |&x| {
            hasher.hash_one(runs[x as usize].id)
        });
    }

    fn remove(&mut self, runs: &[RunRow], id: &RunId) {
        let hash = self.hasher.hash_one(id);
        if let Ok(entry) = self.table.find_entry(hash, |&h| runs[h as usize].id == *id) {
            entry.remove();
        }
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

/// Indexes behind the run-service queries. Every set is ordered by
/// `(createdAt, id)` so a page is a range walk: O(log n + k).
#[derive(Default)]
struct QueryIndex {
    /// One set per (tenant, pool, status), in groups: a page filtered by
    /// pool, status or both merges at most one set per status or per pool,
    /// so every filter combination is O(log n + k) with a small constant
    /// factor. Groups are never removed (there is one per pool and tenant
    /// that ever had a run).
    groups: Vec<Group>,
    /// The group `group_for` answered last: runs come in streams of one
    /// pool, whose `Arc` is the definition's, so a pointer compare usually
    /// saves the hash.
    last_group: u32,
    group_ids: hashbrown::HashTable<u32>,
    group_hasher: ahash::RandomState,
    /// Groups of each tenant: the sets a status filter merges.
    pools_of: HashMap<Tenant, Vec<u32>>,
    /// Failed runs by `(finishedAt, id)`, for `listRecentFailed`.
    failed: HashMap<Tenant, BTreeSet<CreatedKey>>,
    /// Runs of a scope by `createdAt` (ties in insertion order).
    scope: ScopeMap,
    /// Every descendant of a root, in created order (the root excluded).
    tree: HashMap<Handle, Vec<Handle>>,
}

impl QueryIndex {
    fn find_group(&self, tenant: Option<&str>, pool: &str) -> Option<u32> {
        let groups = &self.groups;
        self.group_ids
            .find(self.group_hasher.hash_one((tenant, pool)), |&g| {
                let x = &groups[g as usize];
                x.tenant.as_deref() == tenant && *x.pool == *pool
            })
            .copied()
    }
}

fn created_key(r: &RunRow, h: Handle) -> CreatedKey {
    (r.created_at, id_key(r.id.as_u128()), h)
}

/// The keys of `set` below `upper`, newest first, down to `since` (the
/// cursor's own row, `before`, left out).
fn newest_keys(
    set: &BTreeSet<CreatedKey>,
    upper: std::ops::Bound<CreatedKey>,
    before: Option<CreatedKey>,
    since: Millis,
) -> impl Iterator<Item = CreatedKey> + '_ {
    set.range((std::ops::Bound::Unbounded, upper))
        .rev()
        .copied()
        .filter(move |k| before.is_none_or(|b| (k.0, k.1) != (b.0, b.1)))
        .take_while(move |k| k.0 >= since)
}

/// A page's walk over rows newest first, each checked on its own: it stops
/// at `limit` matches, or after `budget` rows examined with rows left (then
/// the page says where it stopped, see `RunPage::walked_to`).
struct BudgetedWalk {
    limit: usize,
    budget: usize,
    examined: usize,
    last: Option<CreatedKey>,
    found: Vec<Handle>,
    stopped: bool,
}

impl BudgetedWalk {
    fn new(limit: usize, budget: usize) -> Self {
        BudgetedWalk {
            limit,
            budget,
            examined: 0,
            last: None,
            found: Vec::new(),
            stopped: false,
        }
    }

    /// The next row in the walk's order and whether it matches; false once
    /// the walk is over (this row was not examined).
    fn step(&mut self, k: CreatedKey, hit: bool) -> bool {
        if self.found.len() >= self.limit {
            return false;
        }
        if self.examined >= self.budget {
            self.stopped = true;
            return false;
        }
        self.examined += 1;
        self.last = Some(k);
        if hit {
            self.found.push(k.2);
        }
        true
    }

    fn page(self, runs: &[RunRow]) -> RunPage {
        let walked_to = if self.stopped {
            self.last
                .map(|(at, _, h)| (at, runs[h as usize].id.as_u128()))
        } else {
            None
        };
        RunPage {
            ids: self.found.iter().map(|h| runs[*h as usize].id).collect(),
            walked_to,
        }
    }
}

/// The fields whose change requires re-indexing.
#[derive(PartialEq, Eq, Clone)]
struct IndexView {
    status: RunStatus,
    finished_at: Option<Millis>,
    group: u32,
    priority: i32,
    run_at: Millis,
    lane_seq: u64,
    /// The deadline of a waiting run (its entry in `waits`).
    wait: Option<Millis>,
}

impl IndexView {
    /// `group`: the run's current group (`MemoryState::group_of_run`).
    fn of(r: &RunRow, group: u32) -> Self {
        IndexView {
            status: r.status,
            finished_at: r.finished_at.get(),
            group,
            priority: r.priority,
            run_at: r.run_at,
            lane_seq: r.lane_seq(),
            wait: if r.status == RunStatus::Waiting {
                r.wait_deadline.get()
            } else {
                None
            },
        }
    }
}

fn lane_key(r: &RunRow) -> Option<LaneKey> {
    r.concurrency_key()
        .map(|k| (r.tenant_id.clone(), Box::from(k)))
}

impl MemoryState {
    /// Removes a terminal run and its steps from the store and every index;
    /// its slot is reused. O(log n + k) for the short lists it sits in.
    fn purge(&mut self, h: Handle) {
        let g = self.group_of_run(h);
        let r = &self.runs[h as usize];
        let (id, key, t, status) = (r.id, created_key(r, h), r.tenant_id.clone(), r.status);
        let parent = r.parent_run_id();
        let root = r.root_run_id();
        let dedupe = r
            .dedupe_key()
            .map(|k| (t.clone(), r.job_type.clone(), Box::<str>::from(k)));
        let finished_at = r.finished_at.get().unwrap_or(0);
        self.ids.remove(&self.runs, &id);
        fn drop_from<K: std::hash::Hash + Eq>(m: &mut HashMap<K, Vec<Handle>>, k: &K, h: Handle) {
            if let Some(list) = m.get_mut(k) {
                list.retain(|x| *x != h);
                if list.is_empty() {
                    m.remove(k);
                }
            }
        }
        if let Some(p) = parent.and_then(|p| self.ids.get(&self.runs, &p)) {
            drop_from(&mut self.children, &p, h);
        }
        self.children.remove(&h);
        if let Some(k) = dedupe {
            drop_from(&mut self.dedupe, &k, h);
        }
        let q = &mut self.q;
        let grp = &mut q.groups[g as usize];
        grp.by_status[si(status)].remove(&key);
        grp.counts[si(status)] = grp.counts[si(status)].saturating_sub(1);
        if status == RunStatus::Failed {
            if let Some(set) = q.failed.get_mut(&t) {
                set.remove(&(finished_at, key.1, h));
            }
        }
        let r = &self.runs[h as usize];
        if let (Some(a), Some(b)) = (r.scope_entity_type(), r.scope_entity_id()) {
            let k = ScopeRef(t.as_deref(), a, b);
            if let Some(list) = q.scope.get_mut(&k) {
                list.retain(|x| *x != h);
                if list.is_empty() {
                    q.scope.remove(&k);
                }
            }
        }
        if root == id {
            q.tree.remove(&h);
        } else if let Some(rh) = self.ids.get(&self.runs, &root) {
            drop_from(&mut self.q.tree, &rh, h);
        }
        self.steps.remove(&h);
        self.events.remove(&h);
        self.inbox.remove(&h);
        self.free.push(h);
    }

    fn handle(&self, id: &RunId) -> Option<Handle> {
        self.ids.get(&self.runs, id)
    }

    /// The group of (tenant, pool), created on first use. O(1).
    fn group_for(&mut self, tenant: &Tenant, pool: &Arc<str>) -> u32 {
        let last = self.q.last_group;
        if let Some(x) = self.q.groups.get(last as usize) {
            if Arc::ptr_eq(&x.pool, pool) && x.tenant.as_deref() == tenant.as_deref() {
                return last;
            }
        }
        if let Some(g) = self.q.find_group(tenant.as_deref(), pool) {
            self.q.last_group = g;
            return g;
        }
        let claim = match self.claim_ids.get(pool) {
            Some(c) => *c,
            None => {
                let c = self.claim.len() as u32;
                self.claim.push(PoolIndex::default());
                self.claim_ids.insert(pool.clone(), c);
                c
            }
        };
        let q = &mut self.q;
        let g = q.groups.len() as u32;
        q.groups.push(Group {
            tenant: tenant.clone(),
            pool: pool.clone(),
            claim,
            by_status: Default::default(),
            counts: [0; 7],
            ended: Default::default(),
        });
        let (groups, hasher) = (&q.groups, &q.group_hasher);
        q.group_ids
            .insert_unique(hasher.hash_one((tenant.as_deref(), &**pool)), g, |&x| {
                let x = &groups[x as usize];
                hasher.hash_one((x.tenant.as_deref(), &*x.pool))
            });
        q.pools_of.entry(tenant.clone()).or_default().push(g);
        q.last_group = g;
        g
    }

    /// The run's group, checked against its tenant and pool (a rule may
    /// have changed them): O(1), a string hash only after such a change.
    fn group_of_run(&mut self, h: Handle) -> u32 {
        let r = &self.runs[h as usize];
        let g = self.run_groups[h as usize];
        if self.q.groups.get(g as usize).is_some_and(|x| x.holds(r)) {
            return g;
        }
        let (t, p) = (r.tenant_id.clone(), r.pool.clone());
        let g = self.group_for(&t, &p);
        self.run_groups[h as usize] = g;
        g
    }

    fn is_lane_head(&self, h: Handle) -> bool {
        let r = &self.runs[h as usize];
        match lane_key(r) {
            None => true,
            Some(k) => self
                .lanes
                .get(&k)
                .and_then(|l| l.first_key_value())
                .is_some_and(|(_, head)| *head == h),
        }
    }

    fn claim_index_insert(&mut self, h: Handle) {
        let r = &self.runs[h as usize];
        let c = self.q.groups[self.run_groups[h as usize] as usize].claim;
        let pool = &mut self.claim[c as usize];
        // Due already (every transition stamps updated_at with the
        // transaction's time): straight to ready, so a backlog started
        // before any claim is not moved one by one by the first claim.
        if r.run_at <= pool.promoted_until.max(r.updated_at) {
            pool.ready.insert((Reverse(r.priority), r.run_at, r.seq, h));
        } else {
            pool.future.insert((r.run_at, r.seq, h));
        }
    }

    fn claim_index_remove(&mut self, h: Handle, v: &IndexView) {
        let seq = self.runs[h as usize].seq;
        let c = self.q.groups[v.group as usize].claim;
        let pool = &mut self.claim[c as usize];
        if !pool.ready.remove(&(Reverse(v.priority), v.run_at, seq, h)) {
            pool.future.remove(&(v.run_at, seq, h));
        }
    }

    /// Indexes `h` for claiming if it is pending and claimable.
    fn maybe_index_claimable(&mut self, h: Handle) {
        if self.runs[h as usize].status == RunStatus::Pending && self.is_lane_head(h) {
            self.claim_index_insert(h);
        }
    }

    fn lane_head(&self, k: &LaneKey) -> Option<Handle> {
        self.lanes
            .get(k)
            .and_then(|l| l.first_key_value())
            .map(|(_, h)| *h)
    }

    /// Status-keyed query indexes and counts follow a status change.
    fn reindex_status(&mut self, h: Handle, before: &IndexView, after: &IndexView) {
        if self.track_finished && after.status.is_terminal() && !before.status.is_terminal() {
            let r = &self.runs[h as usize];
            let class = usize::from(after.status != RunStatus::Completed);
            self.finished[class].push_back((after.finished_at.unwrap_or(r.updated_at), h, r.seq));
        }
        let r = &self.runs[h as usize];
        let key = created_key(r, h);
        let t = r.tenant_id.clone();
        let q = &mut self.q;
        if before.status != after.status || before.group != after.group {
            let (b, a) = (si(before.status), si(after.status));
            let old = &mut q.groups[before.group as usize];
            old.by_status[b].remove(&key);
            old.counts[b] = old.counts[b].saturating_sub(1);
            let new = &mut q.groups[after.group as usize];
            new.by_status[a].insert(key);
            new.counts[a] += 1;
            if after.status.is_terminal() && !before.status.is_terminal() {
                let at = after.finished_at.unwrap_or(r.updated_at);
                match self.deferred_ends.as_mut() {
                    Some(ends) => ends.push((after.group, at, after.status)),
                    None => new.count_end(at, after.status),
                }
            }
        }
        if before.status == RunStatus::Failed {
            if let Some(set) = q.failed.get_mut(&t) {
                set.remove(&(before.finished_at.unwrap_or(0), key.1, h));
            }
        }
        if after.status == RunStatus::Failed {
            q.failed
                .entry(t)
                .or_default()
                .insert((after.finished_at.unwrap_or(0), key.1, h));
        }
    }

    fn reindex(&mut self, h: Handle, before: IndexView) {
        let g = self.group_of_run(h);
        let after = IndexView::of(&self.runs[h as usize], g);
        if before == after {
            return;
        }
        if before.status != after.status
            || before.finished_at != after.finished_at
            || before.group != after.group
        {
            self.reindex_status(h, &before, &after);
        }
        if before.wait != after.wait {
            let seq = self.runs[h as usize].seq;
            if let Some(at) = before.wait {
                self.waits.remove(&(at, seq, h));
            }
            if let Some(at) = after.wait {
                self.waits.insert((at, seq, h));
            }
        }
        let lane = lane_key(&self.runs[h as usize]);
        let old_head = lane.as_ref().and_then(|k| self.lane_head(k));
        // Drop any stale claim entry (cheap no-op when it had none).
        if before.status == RunStatus::Pending {
            self.claim_index_remove(h, &before);
        }
        // Lane membership: non-terminal runs with a key, at lane_seq.
        if let Some(k) = &lane {
            let was_member = !before.status.is_terminal();
            let is_member = !after.status.is_terminal();
            if was_member && (!is_member || before.lane_seq != after.lane_seq) {
                if let Some(l) = self.lanes.get_mut(k) {
                    l.remove(&before.lane_seq);
                }
            }
            if is_member && (!was_member || before.lane_seq != after.lane_seq) {
                self.lanes
                    .entry(k.clone())
                    .or_default()
                    .insert(after.lane_seq, h);
            }
            if self.lanes.get(k).is_some_and(|l| l.is_empty()) {
                self.lanes.remove(k);
            }
        }
        self.maybe_index_claimable(h);
        // A new lane head becomes claimable.
        if let Some(k) = &lane {
            let new_head = self.lane_head(k);
            if new_head != old_head {
                if let Some(nh) = new_head {
                    if nh != h {
                        self.maybe_index_claimable(nh);
                    }
                }
                if let Some(oh) = old_head {
                    if oh != h && Some(oh) != new_head {
                        let g = self.group_of_run(oh);
                        let v = IndexView::of(&self.runs[oh as usize], g);
                        if v.status == RunStatus::Pending {
                            self.claim_index_remove(oh, &v);
                        }
                    }
                }
            }
        }
    }
}

/// The in-memory store: one mutex around indexed state.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<MemoryState>,
    /// Runs held, as of the last transaction: read without the lock.
    live: std::sync::atomic::AtomicUsize,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs held (every status): what the binding reports to V8 as the
    /// engine's native memory, so the JS collector knows an unreachable
    /// orchestrator is worth collecting. O(1).
    pub fn live_runs(&self) -> usize {
        self.live.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Recomputes every index from the rows and compares: the check the
    /// property tests run after each operation. A full scan, so never on a
    /// serving path. Returns the first disagreement found.
    pub fn verify_indexes(&self) -> std::result::Result<(), String> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.verify()
    }
}

impl MemoryState {
    fn verify(&self) -> std::result::Result<(), String> {
        let free: std::collections::HashSet<Handle> = self.free.iter().copied().collect();
        // Live slots only, in created order (slots are reused after a purge).
        let mut order: Vec<usize> = (0..self.runs.len())
            .filter(|h| !free.contains(&(*h as Handle)))
            .collect();
        order.sort_by_key(|h| self.runs[*h].seq);
        let runs: Vec<(usize, &RunRow)> = order.iter().map(|h| (*h, &self.runs[*h])).collect();
        if self.ids.len() != runs.len() {
            return Err(format!(
                "ids has {} entries for {} runs",
                self.ids.len(),
                runs.len()
            ));
        }
        // Lanes: exactly the non-terminal keyed runs, ordered by lane_seq.
        let mut lanes: HashMap<LaneKey, BTreeMap<u64, Handle>> = HashMap::default();
        for &(h, r) in runs.iter() {
            if self.ids.get(&self.runs, &r.id) != Some(h as Handle) {
                return Err(format!("ids does not map {} to its slot", r.id));
            }
            if let Some(k) = lane_key(r) {
                if !r.status.is_terminal() {
                    lanes
                        .entry(k)
                        .or_default()
                        .insert(r.lane_seq(), h as Handle);
                }
            }
        }
        if lanes != self.lanes {
            return Err("lanes differ from the non-terminal keyed runs".into());
        }
        // Claim index: exactly the pending lane heads / unkeyed pending runs.
        let mut claimable: BTreeSet<Handle> = BTreeSet::new();
        for &(h, r) in runs.iter() {
            if r.status == RunStatus::Pending && self.is_lane_head(h as Handle) {
                claimable.insert(h as Handle);
            }
        }
        let mut indexed: BTreeSet<Handle> = BTreeSet::new();
        for (name, c) in &self.claim_ids {
            let pool = &self.claim[*c as usize];
            for &(Reverse(p), at, seq, h) in &pool.ready {
                let r = &self.runs[h as usize];
                if (r.priority, r.run_at, r.seq, &*r.pool) != (p, at, seq, &**name) {
                    return Err(format!("stale ready entry for {}", r.id));
                }
                if !indexed.insert(h) {
                    return Err(format!("{} indexed twice", r.id));
                }
            }
            for &(at, seq, h) in &pool.future {
                let r = &self.runs[h as usize];
                if (r.run_at, r.seq, &*r.pool) != (at, seq, &**name) {
                    return Err(format!("stale future entry for {}", r.id));
                }
                if !indexed.insert(h) {
                    return Err(format!("{} indexed twice", r.id));
                }
            }
        }
        if claimable != indexed {
            return Err(format!(
                "claim index holds {:?}, claimable runs are {:?}",
                indexed
                    .iter()
                    .map(|h| self.runs[*h as usize].id)
                    .collect::<Vec<_>>(),
                claimable
                    .iter()
                    .map(|h| self.runs[*h as usize].id)
                    .collect::<Vec<_>>()
            ));
        }
        // Counts and status/pool/tenant sets: every live run in the set of
        // its group and status, every group's sets and counts exactly those.
        type Sets = HashMap<(Tenant, Arc<str>), [BTreeSet<CreatedKey>; 7]>;
        let mut sets: Sets = HashMap::default();
        let mut failed: HashMap<Tenant, BTreeSet<CreatedKey>> = HashMap::default();
        for &(h, r) in runs.iter() {
            let t = r.tenant_id.clone();
            let k = created_key(r, h as Handle);
            let g = self.q.find_group(t.as_deref(), &r.pool);
            if g != Some(self.run_groups[h]) {
                return Err(format!(
                    "run {} names group {} of {:?}",
                    r.id, self.run_groups[h], g
                ));
            }
            sets.entry((t.clone(), r.pool.clone())).or_default()[si(r.status)].insert(k);
            if r.status == RunStatus::Failed {
                failed.entry(t).or_default().insert((
                    r.finished_at.get().unwrap_or(0),
                    k.1,
                    h as Handle,
                ));
            }
        }
        for (i, grp) in self.q.groups.iter().enumerate() {
            if self.q.find_group(grp.tenant.as_deref(), &grp.pool) != Some(i as u32) {
                return Err(format!(
                    "group {i} ('{}') is not found by its name",
                    grp.pool
                ));
            }
            if !self
                .q
                .pools_of
                .get(&grp.tenant)
                .is_some_and(|p| p.contains(&(i as u32)))
            {
                return Err(format!(
                    "pool '{}' missing from its tenant's group list",
                    grp.pool
                ));
            }
            let want = sets
                .remove(&(grp.tenant.clone(), grp.pool.clone()))
                .unwrap_or_default();
            for st in ALL_STATUSES {
                if grp.by_status[si(st)] != want[si(st)] {
                    return Err(format!(
                        "pool/status index differs from the rows ({}, {st:?})",
                        grp.pool
                    ));
                }
                if grp.counts[si(st)] != want[si(st)].len() as u64 {
                    return Err("status counts differ from the rows".into());
                }
            }
        }
        if !sets.is_empty() {
            return Err("runs of a pool without a group".into());
        }
        let failed_ok = failed.iter().all(|(k, v)| self.q.failed.get(k) == Some(v))
            && self.q.failed.values().filter(|s| !s.is_empty()).count() == failed.len();
        if !failed_ok {
            return Err("failed index differs from the rows".into());
        }
        // Dedupe lists: every keyed run once, in created order.
        let mut dedupe: HashMap<DedupeKey, Vec<Handle>> = HashMap::default();
        for &(h, r) in runs.iter() {
            if let Some(k) = r.dedupe_key() {
                dedupe
                    .entry((r.tenant_id.clone(), r.job_type.clone(), Box::from(k)))
                    .or_default()
                    .push(h as Handle);
            }
        }
        if dedupe != self.dedupe {
            return Err("dedupe lists differ from the rows".into());
        }
        // Scope lists: every scoped run once, by `createdAt`.
        let mut scopes: HashMap<ScopeKey, Vec<Handle>> = HashMap::default();
        for &(h, r) in runs.iter() {
            if let (Some(et), Some(eid)) = (r.scope_entity_type(), r.scope_entity_id()) {
                scopes
                    .entry((r.tenant_id.clone(), Box::from(et), Box::from(eid)))
                    .or_default()
                    .push(h as Handle);
            }
        }
        for (k, list) in &self.q.scope {
            if list
                .windows(2)
                .any(|w| self.runs[w[0] as usize].created_at > self.runs[w[1] as usize].created_at)
            {
                return Err(format!("scope list {k:?} is out of createdAt order"));
            }
            let mut got = list.clone();
            got.sort_unstable();
            let mut want = scopes.remove(k).unwrap_or_default();
            want.sort_unstable();
            if got != want {
                return Err(format!("scope list {k:?} differs from the rows"));
            }
        }
        if scopes.values().any(|v| !v.is_empty()) {
            return Err("scoped runs missing from the scope lists".into());
        }
        // Children lists mirror parentRunId.
        let mut children: HashMap<Handle, Vec<Handle>> = HashMap::default();
        for &(h, r) in runs.iter() {
            if let Some(p) = r.parent_run_id().and_then(|p| self.ids.get(&self.runs, &p)) {
                children.entry(p).or_default().push(h as Handle);
            }
        }
        if children != self.children {
            return Err("children lists differ from parentRunId".into());
        }
        // Waits: exactly the waiting runs with a deadline.
        let waits: BTreeSet<(Millis, u64, Handle)> = runs
            .iter()
            .filter(|(_, r)| r.status == RunStatus::Waiting)
            .filter_map(|&(h, r)| r.wait_deadline.get().map(|at| (at, r.seq, h as Handle)))
            .collect();
        if waits != self.waits {
            return Err("wait index differs from the waiting runs".into());
        }
        Ok(())
    }
}

/// A transaction on the memory store is the held lock.
pub struct MemoryTx<'a>(MutexGuard<'a, MemoryState>);

/// One process's store: nothing to lease, renew or listen for.
impl super::Coordination for MemoryStore {}

/// No schema, nothing held beyond this process's definitions.
impl super::StoreAdmin for MemoryStore {
    fn resident_runs(&self) -> Option<usize> {
        Some(self.live_runs())
    }
}

impl Store for MemoryStore {
    type Tx<'a> = MemoryTx<'a>;

    fn purges_in_every_call(&self) -> bool {
        true
    }

    fn fires_schedules_in_claims(&self) -> bool {
        true
    }

    fn transaction<R>(&self, f: impl FnOnce(&mut MemoryTx<'_>) -> Result<R>) -> Result<R> {
        // A panic inside a rule must not wedge the engine: recover the guard.
        let guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut tx = MemoryTx(guard);
        let out = f(&mut tx);
        let live = tx.0.runs.len() - tx.0.free.len();
        self.live.store(live, std::sync::atomic::Ordering::Relaxed);
        out
    }
}

impl StoreTx for MemoryTx<'_> {
    fn definition(&self, job_type: &str) -> Option<Arc<JobDefinition>> {
        self.0.definitions.get(job_type).cloned()
    }

    fn put_definition(&mut self, def: JobDefinition) -> Arc<JobDefinition> {
        let def = Arc::new(def);
        self.0.definitions.insert(def.job_type.clone(), def.clone());
        def
    }

    fn run(&self, id: &RunId) -> Option<&RunRow> {
        self.0.handle(id).map(|h| &self.0.runs[h as usize])
    }

    fn insert_run(&mut self, row: RunRow) {
        let s = &mut *self.0;
        if let Some(u) = s.undo.as_mut() {
            u.push(Undo::Inserted(row.id));
        }
        let reused = s.free.pop();
        let h = reused.unwrap_or(s.runs.len() as Handle);
        let id = row.id;
        if let Some(parent) = row.parent_run_id().and_then(|p| s.ids.get(&s.runs, &p)) {
            s.children.entry(parent).or_default().push(h);
        }
        if let Some(key) = row.dedupe_key() {
            s.dedupe
                .entry((row.tenant_id.clone(), row.job_type.clone(), Box::from(key)))
                .or_default()
                .push(h);
        }
        let lane = lane_key(&row);
        let lane_seq = row.lane_seq();
        let pending = row.status == RunStatus::Pending;
        // Query indexes.
        let key = created_key(&row, h);
        let t = row.tenant_id.clone();
        let g = s.group_for(&t, &row.pool);
        let grp = &mut s.q.groups[g as usize];
        grp.by_status[si(row.status)].insert(key);
        grp.counts[si(row.status)] += 1;
        if let (Some(et), Some(eid)) = (row.scope_entity_type(), row.scope_entity_id()) {
            let list = match s.q.scope.entry_ref(&ScopeRef(t.as_deref(), et, eid)) {
                hashbrown::hash_map::EntryRef::Occupied(e) => e.into_mut(),
                hashbrown::hash_map::EntryRef::Vacant(e) => {
                    e.insert_with_key((t.clone(), Box::from(et), Box::from(eid)), Vec::new())
                }
            };
            // Kept in `createdAt` order (a page finds its place by binary
            // search): a run comes last unless a JS-side start's time fell
            // behind the engine's (a wall clock that stepped back).
            let runs = &s.runs;
            let created = |x: &Handle| runs[*x as usize].created_at;
            if list.last().is_none_or(|x| created(x) <= row.created_at) {
                list.push(h);
            } else {
                let at = list.partition_point(|x| created(x) <= row.created_at);
                list.insert(at, h);
            }
        }
        if row.parent_run_id().is_some() {
            if let Some(root) = s.ids.get(&s.runs, &row.root_run_id()) {
                s.q.tree.entry(root).or_default().push(h);
            }
        }
        match reused {
            Some(slot) => {
                s.runs[slot as usize] = row;
                s.run_groups[slot as usize] = g;
            }
            None => {
                s.runs.push(row);
                s.run_groups.push(g);
            }
        }
        // Only now: the index compares ids through `runs[slot]`.
        s.ids.insert(&s.runs, id, h);
        if let Some(k) = lane {
            s.lanes.entry(k).or_default().insert(lane_seq, h);
        }
        if pending {
            s.maybe_index_claimable(h);
        }
    }

    fn update_run(&mut self, id: &RunId, f: &mut dyn FnMut(&mut RunRow)) {
        let s = &mut *self.0;
        let Some(h) = s.handle(id) else { return };
        if let Some(u) = s.undo.as_mut() {
            u.push(Undo::Row(Box::new(s.runs[h as usize].clone())));
        }
        let g = s.group_of_run(h);
        let before = IndexView::of(&s.runs[h as usize], g);
        f(&mut s.runs[h as usize]);
        s.reindex(h, before);
    }

    fn begin_undo(&mut self) {
        self.0.undo = Some(Vec::new());
        self.0.deferred_ends = Some(Vec::new());
    }

    /// Undoes the journal newest first: rows back as they were (re-indexed
    /// as any update is), steps back, and the runs inserted removed from
    /// every index (made terminal first, so they leave their lanes and the
    /// claim index, then purged). O(changes x log n).
    fn end_undo(&mut self, undo: bool) {
        let Some(journal) = self.0.undo.take() else {
            return;
        };
        if !undo {
            for (g, at, status) in self.0.deferred_ends.take().unwrap_or_default() {
                if let Some(grp) = self.0.q.groups.get_mut(g as usize) {
                    grp.count_end(at, status);
                }
            }
            return;
        }
        let s = &mut *self.0;
        for change in journal.into_iter().rev() {
            match change {
                Undo::Row(row) => {
                    let Some(h) = s.handle(&row.id) else { continue };
                    let g = s.group_of_run(h);
                    let before = IndexView::of(&s.runs[h as usize], g);
                    s.runs[h as usize] = *row;
                    s.reindex(h, before);
                }
                Undo::Step(run, step_id, prev) => {
                    let Some(h) = s.handle(&run) else { continue };
                    let Some(steps) = s.steps.get_mut(&h) else {
                        continue;
                    };
                    match (steps.position(&step_id), prev) {
                        (Some(i), Some(prev)) => steps.rows[i] = *prev,
                        (Some(_), None) => {
                            steps.rows.retain(|r| r.step_id != step_id);
                            steps.reindex();
                            if steps.rows.is_empty() {
                                s.steps.remove(&h);
                            }
                        }
                        (None, _) => {}
                    }
                }
                Undo::Event(run) => {
                    let Some(h) = s.handle(&run) else { continue };
                    if let Some(list) = s.events.get_mut(&h) {
                        list.pop();
                        if list.is_empty() {
                            s.events.remove(&h);
                        }
                    }
                }
                Undo::Inserted(id) => {
                    let Some(h) = s.handle(&id) else { continue };
                    let g = s.group_of_run(h);
                    let before = IndexView::of(&s.runs[h as usize], g);
                    let r = &mut s.runs[h as usize];
                    r.status = RunStatus::Canceled;
                    r.finished_at = r.created_at.into();
                    s.reindex(h, before);
                    s.purge(h);
                }
            }
        }
        // What the undo itself ended (the runs it removed) never happened.
        s.deferred_ends = None;
    }

    fn next_seq(&mut self) -> u64 {
        self.0.seq += 1;
        self.0.seq
    }

    fn find_dedupe(
        &self,
        tenant: TenantRef<'_>,
        job_type: &str,
        dedupe_key: &str,
        created_after: Millis,
    ) -> Option<&RunRow> {
        let s = &*self.0;
        let key: DedupeKey = (
            tenant.map(Arc::from),
            Arc::from(job_type),
            Box::from(dedupe_key),
        );
        let list = s.dedupe.get(&key)?;
        // Created order = createdAt order, so the walk stops at the window.
        for &h in list.iter().rev() {
            let r = &s.runs[h as usize];
            if r.created_at <= created_after {
                return None;
            }
            if !matches!(r.status, RunStatus::Canceled | RunStatus::Failed) {
                return Some(r);
            }
        }
        None
    }

    fn lane(&self, tenant: TenantRef<'_>, key: &str) -> Vec<RunId> {
        let s = &*self.0;
        let k: LaneKey = (tenant.map(Arc::from), Box::from(key));
        s.lanes
            .get(&k)
            .map(|l| l.values().map(|h| s.runs[*h as usize].id).collect())
            .unwrap_or_default()
    }

    /// O(log k): the lane's first entry, not the whole lane.
    fn lane_head(&self, tenant: TenantRef<'_>, key: &str) -> Option<RunId> {
        let s = &*self.0;
        let k: LaneKey = (tenant.map(Arc::from), Box::from(key));
        s.lane_head(&k).map(|h| s.runs[h as usize].id)
    }

    fn next_claimable(&mut self, pool: &str, now: Millis) -> Option<RunId> {
        let s = &mut *self.0;
        let c = *s.claim_ids.get(pool)?;
        let idx = &mut s.claim[c as usize];
        if now > idx.promoted_until {
            idx.promoted_until = now;
        }
        while let Some(&(run_at, seq, h)) = idx.future.first() {
            if run_at > now {
                break;
            }
            idx.future.pop_first();
            let prio = s.runs[h as usize].priority;
            idx.ready.insert((Reverse(prio), run_at, seq, h));
        }
        idx.ready.first().map(|&(_, _, _, h)| s.runs[h as usize].id)
    }

    fn next_due(&mut self, pool: &str, now: Millis) -> Option<Millis> {
        let s = &*self.0;
        let idx = &s.claim[*s.claim_ids.get(pool)? as usize];
        if !idx.ready.is_empty() {
            return Some(now);
        }
        idx.future.first().map(|&(run_at, _, _)| run_at.max(now))
    }

    fn children(&self, id: &RunId) -> Vec<RunId> {
        let s = &*self.0;
        s.handle(id)
            .and_then(|h| s.children.get(&h))
            .map(|c| c.iter().map(|h| s.runs[*h as usize].id).collect())
            .unwrap_or_default()
    }

    fn step(&self, run: &RunId, step_id: &str) -> Option<&StepRow> {
        let s = &*self.0;
        let steps = s.steps.get(&s.handle(run)?)?;
        steps.position(step_id).map(|i| &steps.rows[i])
    }

    fn put_step(&mut self, row: StepRow) {
        let s = &mut *self.0;
        let Some(h) = s.handle(&row.job_run_id) else {
            return;
        };
        let steps = s.steps.entry(h).or_default();
        if let Some(u) = s.undo.as_mut() {
            let prev = steps
                .position(&row.step_id)
                .map(|i| Box::new(steps.rows[i].clone()));
            u.push(Undo::Step(row.job_run_id, row.step_id.clone(), prev));
        }
        match steps.position(&row.step_id) {
            Some(i) => steps.rows[i] = row,
            None => steps.push(row),
        }
    }

    fn steps(&self, run: &RunId) -> Vec<StepRow> {
        let s = &*self.0;
        let mut rows: Vec<StepRow> = s
            .handle(run)
            .and_then(|h| s.steps.get(&h))
            .map(|st| st.rows.clone())
            .unwrap_or_default();
        rows.sort_by_key(|r| r.seq);
        rows
    }

    fn steps_at_hand(&self, run: &RunId, f: &mut dyn FnMut(&StepRow)) {
        let s = &*self.0;
        let Some(steps) = s.handle(run).and_then(|h| s.steps.get(&h)) else {
            return;
        };
        steps.rows.iter().for_each(f);
    }

    fn max_step_seq(&self, run: &RunId) -> u32 {
        let s = &*self.0;
        s.handle(run)
            .and_then(|h| s.steps.get(&h))
            .and_then(|st| st.rows.iter().map(|r| r.seq).max())
            .unwrap_or(0)
    }

    fn delete_steps(&mut self, run: &RunId, keep_completed: bool) {
        let s = &mut *self.0;
        let Some(h) = s.handle(run) else { return };
        if !keep_completed {
            s.steps.remove(&h);
            return;
        }
        if let Some(st) = s.steps.get_mut(&h) {
            st.rows.retain(|r| r.status == StepStatus::Completed);
            st.reindex();
            if st.rows.is_empty() {
                s.steps.remove(&h);
            }
        }
    }

    /// A scan of the run's rows in place (no copy of every step).
    fn open_waits(&self, run: &RunId, epoch: u32) -> Vec<crate::model::WaitSpec> {
        let s = &*self.0;
        let Some(steps) = s.handle(run).and_then(|h| s.steps.get(&h)) else {
            return Vec::new();
        };
        let mut open: Vec<(u32, crate::model::WaitSpec)> = steps
            .rows
            .iter()
            .filter(|r| r.epoch == epoch && r.is_open_wait())
            .filter_map(|r| crate::model::WaitSpec::of_step(r).map(|w| (r.seq, w)))
            .collect();
        open.sort_by_key(|(seq, _)| *seq);
        open.into_iter().map(|(_, w)| w).collect()
    }

    fn due_waits(&mut self, now: Millis, limit: usize) -> Vec<RunId> {
        let s = &*self.0;
        s.waits
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .take(limit)
            .map(|&(_, _, h)| s.runs[h as usize].id)
            .collect()
    }

    fn next_wait_deadline(&mut self) -> Option<Millis> {
        self.0.waits.first().map(|&(at, _, _)| at)
    }

    fn push_signal(&mut self, run: &RunId, name: &str, payload: Box<RawValue>, _at: Millis) {
        let s = &mut *self.0;
        if let Some(h) = s.handle(run) {
            s.inbox
                .entry(h)
                .or_default()
                .push_back((Box::from(name), payload));
        }
    }

    fn take_signal(&mut self, run: &RunId, name: &str) -> Option<Box<RawValue>> {
        let s = &mut *self.0;
        let h = s.handle(run)?;
        let inbox = s.inbox.get_mut(&h)?;
        let i = inbox.iter().position(|(n, _)| &**n == name)?;
        let (_, payload) = inbox.remove(i)?;
        if inbox.is_empty() {
            s.inbox.remove(&h);
        }
        Some(payload)
    }

    fn inbox_len(&self, run: &RunId) -> usize {
        let s = &*self.0;
        s.handle(run)
            .and_then(|h| s.inbox.get(&h))
            .map_or(0, |i| i.len())
    }

    fn clear_signals(&mut self, run: &RunId) {
        let s = &mut *self.0;
        if let Some(h) = s.handle(run) {
            s.inbox.remove(&h);
        }
    }

    fn record_event(&mut self, event: RunEvent) {
        let s = &mut *self.0;
        let Some(h) = s.handle(&event.run) else {
            return;
        };
        s.event_seq += 1;
        if let Some(u) = s.undo.as_mut() {
            u.push(Undo::Event(event.run));
        }
        // Room for two at first: most runs have exactly two (`started`
        // and their end, or `started` and `waiting`); four cost every
        // finished run 80 bytes it never used.
        s.events
            .entry(h)
            .or_insert_with(|| Vec::with_capacity(2))
            .push(StoredEvent {
                id: s.event_seq,
                at: event.at,
                kind: event.kind,
                attempt: event.attempt,
                data: event.data,
            });
    }

    fn run_events(&self, run: &RunId, after: u64, limit: usize) -> Vec<RunEvent> {
        let s = &*self.0;
        let Some(list) = s.handle(run).and_then(|h| s.events.get(&h)) else {
            return Vec::new();
        };
        // Numbers ascend along the list: the page starts after `after`.
        let from = list.partition_point(|e| e.id <= after);
        list[from..]
            .iter()
            .take(limit)
            .map(|e| RunEvent {
                id: e.id,
                run: *run,
                at: e.at,
                kind: e.kind,
                attempt: e.attempt,
                data: e.data.clone(),
            })
            .collect()
    }

    fn set_retention_tracking(&mut self, on: bool) {
        self.0.track_finished = on;
    }

    fn purge_finished(
        &mut self,
        completed_before: Option<Millis>,
        other_before: Option<Millis>,
    ) -> usize {
        let s = &mut *self.0;
        if !s.track_finished {
            return 0;
        }
        let mut purged = 0;
        for (class, before) in [(0, completed_before), (1, other_before)] {
            let Some(before) = before else { continue };
            while let Some(&(at, h, seq)) = s.finished[class].front() {
                if at > before {
                    break;
                }
                s.finished[class].pop_front();
                // Skip entries made stale by a replay (or a reused slot).
                let r = &s.runs[h as usize];
                // Same run, still terminal, same finish, and still of this
                // class (a canceled run replayed and completed at the same
                // instant must not be purged under the failed retention).
                let live = r.seq == seq
                    && s.ids.get(&s.runs, &r.id) == Some(h)
                    && r.status.is_terminal()
                    && usize::from(r.status != RunStatus::Completed) == class
                    && r.finished_at.get().unwrap_or(r.updated_at) == at;
                if live {
                    s.purge(h);
                    purged += 1;
                }
            }
        }
        purged
    }

    fn scope_runs(&self, tenant: TenantRef<'_>, entity_type: &str, entity_id: &str) -> Vec<RunId> {
        let s = &*self.0;
        s.q.scope
            .get(&ScopeRef(tenant, entity_type, entity_id))
            .map(|v| v.iter().map(|h| s.runs[*h as usize].id).collect())
            .unwrap_or_default()
    }

    fn status_counts(&self, tenant: TenantRef<'_>) -> Vec<(Arc<str>, RunStatus, u64)> {
        let q = &self.0.q;
        let mut out: Vec<(Arc<str>, RunStatus, u64)> = q
            .pools_of
            .get(&tenant.map(Arc::from))
            .into_iter()
            .flatten()
            .flat_map(|g| {
                let grp = &q.groups[*g as usize];
                ALL_STATUSES
                    .iter()
                    .filter(|st| grp.counts[si(**st)] > 0)
                    .map(|st| (grp.pool.clone(), *st, grp.counts[si(*st)]))
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.as_str().cmp(b.1.as_str())));
        out
    }

    fn ended_per_minute(
        &self,
        tenant: TenantRef<'_>,
        since: Millis,
    ) -> Vec<(Millis, RunStatus, u64)> {
        let q = &self.0.q;
        let from = since.div_euclid(60_000);
        let mut sum: BTreeMap<i64, [u64; 4]> = BTreeMap::new();
        for g in q.pools_of.get(&tenant.map(Arc::from)).into_iter().flatten() {
            for (m, n) in q.groups[*g as usize]
                .ended
                .iter()
                .filter(|(m, _)| *m >= from)
            {
                let e = sum.entry(*m).or_default();
                for (i, c) in n.iter().enumerate() {
                    e[i] += u64::from(*c);
                }
            }
        }
        sum.into_iter()
            .flat_map(|(m, n)| {
                ENDED_STATUSES
                    .iter()
                    .zip(n)
                    .filter(|(_, c)| *c > 0)
                    .map(move |(s, c)| (m * 60_000, *s, c))
            })
            .collect()
    }

    fn live_counts(&self) -> Vec<(Arc<str>, RunStatus, u64)> {
        let mut sum: BTreeMap<(Arc<str>, &'static str), (RunStatus, u64)> = BTreeMap::new();
        for g in &self.0.q.groups {
            for st in [RunStatus::Pending, RunStatus::Running, RunStatus::Waiting] {
                let n = g.counts[si(st)];
                if n > 0 {
                    sum.entry((g.pool.clone(), st.as_str()))
                        .or_insert((st, 0))
                        .1 += n;
                }
            }
        }
        sum.into_iter()
            .map(|((p, _), (st, n))| (p, st, n))
            .collect()
    }

    fn recent_failed(&self, tenant: TenantRef<'_>, limit: usize) -> Vec<RunId> {
        let s = &*self.0;
        s.q.failed
            .get(&tenant.map(Arc::from))
            .map(|set| {
                set.iter()
                    .rev()
                    .take(limit)
                    .map(|(_, _, h)| s.runs[*h as usize].id)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn page_runs(&self, q: &PageQuery<'_>) -> RunPage {
        let s = &*self.0;
        let tenant: Tenant = q.tenant.map(Arc::from);
        // The filters checked per row (those the walked index did not
        // decide are the only ones that can fail).
        let matches = |h: Handle| {
            let r = &s.runs[h as usize];
            q.pool.is_none_or(|p| &*r.pool == p)
                && q.statuses.is_none_or(|ss| ss.contains(&r.status))
                && r.tenant_id.as_deref() == q.tenant
                && q.job_type.is_none_or(|j| &*r.job_type == j)
                && q.scope.is_none_or(|(et, eid)| {
                    r.scope_entity_type() == Some(et) && r.scope_entity_id() == Some(eid)
                })
        };
        let before = q.before.map(|(t, id)| (t, id_key(id), Handle::MAX));
        let in_range =
            |k: &CreatedKey| before.is_none_or(|b| (k.0, k.1) < (b.0, b.1)) && k.0 >= q.since;
        if let Some(root) = q.root {
            // A tree is small: gather, order, filter.
            let Some(rh) = s.ids.get(&s.runs, root) else {
                return RunPage::default();
            };
            // Only a root has a tree; a child's id is nobody's rootRunId.
            if s.runs[rh as usize].root_run_id() != *root {
                return RunPage::default();
            }
            let mut keys: Vec<CreatedKey> = std::iter::once(rh)
                .chain(s.q.tree.get(&rh).into_iter().flatten().copied())
                .map(|h| created_key(&s.runs[h as usize], h))
                .filter(|k| in_range(k) && matches(k.2))
                .collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            let ids = keys
                .into_iter()
                .take(q.limit)
                .map(|k| s.runs[k.2 as usize].id)
                .collect();
            return RunPage {
                ids,
                walked_to: None,
            };
        }
        let mut walk = BudgetedWalk::new(q.limit, q.budget);
        if let Some((et, eid)) = q.scope {
            // The scope's list, by `createdAt`: the page's place is a binary
            // search; the runs of one millisecond are ordered by id there.
            let Some(list) = s.q.scope.get(&ScopeRef(tenant.as_deref(), et, eid)) else {
                return RunPage::default();
            };
            let created = |h: &Handle| s.runs[*h as usize].created_at;
            let mut end = match q.before {
                Some((t, _)) => list.partition_point(|h| created(h) <= t),
                None => list.len(),
            };
            while let Some(last) = end.checked_sub(1) {
                let at = created(&list[last]);
                if at < q.since {
                    break;
                }
                let start = list[..end].partition_point(|h| created(h) < at);
                let mut block: Vec<CreatedKey> = list[start..end]
                    .iter()
                    .map(|h| created_key(&s.runs[*h as usize], *h))
                    .filter(|k| in_range(k))
                    .collect();
                block.sort_unstable_by(|a, b| b.cmp(a));
                if !block.into_iter().all(|k| walk.step(k, matches(k.2))) {
                    break;
                }
                end = start;
            }
            return walk.page(&s.runs);
        }
        // The sets whose union is exactly the filtered rows: per group (the
        // pool's, or every pool of the tenant: a separate per-tenant set
        // would cost ~40 bytes per run for this alone), the set of each
        // status asked for, or all of them.
        let groups: Vec<u32> = match q.pool {
            Some(p) => s.q.find_group(q.tenant, p).into_iter().collect(),
            None => {
                s.q.pools_of
                    .get(&tenant)
                    .into_iter()
                    .flatten()
                    .copied()
                    .collect()
            }
        };
        let mut sets: Vec<&BTreeSet<CreatedKey>> = Vec::new();
        for g in groups {
            let by = &s.q.groups[g as usize].by_status;
            match q.statuses {
                None => sets.extend(by.iter()),
                Some(ss) => sets.extend(ss.iter().map(|st| &by[si(*st)])),
            }
        }
        let upper = match before {
            Some(b) => std::ops::Bound::Excluded(b),
            None => std::ops::Bound::Unbounded,
        };
        let newest = |set| newest_keys(set, upper, before, q.since);
        if q.job_type.is_some() {
            // Every row of these sets is a candidate: walk them as one,
            // newest first (a merge), checking the type per row.
            let mut heads: Vec<_> = sets.iter().map(|set| newest(set)).collect();
            let mut heap: std::collections::BinaryHeap<(CreatedKey, usize)> = heads
                .iter_mut()
                .enumerate()
                .filter_map(|(i, it)| it.next().map(|k| (k, i)))
                .collect();
            while let Some((k, i)) = heap.pop() {
                if !walk.step(k, matches(k.2)) {
                    break;
                }
                if let Some(next) = heads[i].next() {
                    heap.push((next, i));
                }
            }
            return walk.page(&s.runs);
        }
        // Every row of these sets matches: up to `limit` newest keys from
        // each set, then the newest overall.
        let mut keys: Vec<CreatedKey> = sets
            .into_iter()
            .flat_map(|set| newest(set).take(q.limit))
            .collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        keys.truncate(q.limit);
        RunPage {
            ids: keys.into_iter().map(|k| s.runs[k.2 as usize].id).collect(),
            walked_to: None,
        }
    }

    fn tree_runs(&self, root: &RunId) -> Vec<RunId> {
        let s = &*self.0;
        let Some(rh) = s.ids.get(&s.runs, root) else {
            return Vec::new();
        };
        // Breadth-first over children lists: the subtree of any run.
        let mut out = vec![rh];
        let mut i = 0;
        while i < out.len() {
            if let Some(kids) = s.children.get(&out[i]) {
                out.extend_from_slice(kids);
            }
            i += 1;
        }
        out.into_iter().map(|h| s.runs[h as usize].id).collect()
    }

    fn schedule(&self, tenant: TenantRef<'_>, name: &str) -> Option<ScheduleRow> {
        self.0
            .schedules
            .get(&(tenant.map(Arc::from), name.to_owned()))
            .cloned()
    }

    fn put_schedule(&mut self, row: ScheduleRow) {
        let s = &mut *self.0;
        let key = (row.tenant_id.clone(), row.name.clone());
        if let Some(old) = s.schedules.get(&key) {
            if let Some(t) = old.next_fire_at {
                s.schedule_due.remove(&(t, key.0.clone(), key.1.clone()));
            }
        }
        if let Some(t) = row.next_fire_at {
            s.schedule_due.insert((t, key.0.clone(), key.1.clone()));
        }
        s.schedules.insert(key, row);
    }

    fn delete_schedule(&mut self, tenant: TenantRef<'_>, name: &str) -> bool {
        let s = &mut *self.0;
        let key = (tenant.map(Arc::from), name.to_owned());
        match s.schedules.remove(&key) {
            Some(old) => {
                if let Some(t) = old.next_fire_at {
                    s.schedule_due.remove(&(t, key.0, key.1));
                }
                true
            }
            None => false,
        }
    }

    fn schedules(&self, tenant: TenantRef<'_>) -> Vec<ScheduleRow> {
        // O(log s + the tenant's schedules): one range of the ordered map.
        let t: Tenant = tenant.map(Arc::from);
        self.0
            .schedules
            .range((t.clone(), String::new())..)
            .take_while(|((rt, _), _)| *rt == t)
            .map(|(_, row)| row.clone())
            .collect()
    }

    fn due_schedules(&mut self, now: Millis, limit: usize) -> Vec<ScheduleRow> {
        let s = &*self.0;
        s.schedule_due
            .iter()
            .take_while(|(t, _, _)| *t <= now)
            .take(limit)
            .filter_map(|(_, tenant, name)| s.schedules.get(&(tenant.clone(), name.clone())))
            .cloned()
            .collect()
    }

    fn next_schedule_fire(&mut self) -> Option<Millis> {
        self.0.schedule_due.first().map(|(t, _, _)| *t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scope's runs are found by a borrowed key only if it hashes and
    /// compares as the owned key it stands for.
    #[test]
    fn a_borrowed_scope_key_finds_its_owned_key() {
        let hasher = ahash::RandomState::new();
        for tenant in [None, Some("t1"), Some("")] {
            let owned: ScopeKey = (tenant.map(Arc::from), Box::from("order"), Box::from("o42"));
            let borrowed = ScopeRef(tenant, "order", "o42");
            assert_eq!(hasher.hash_one(&owned), hasher.hash_one(&borrowed));
            let mut map = ScopeMap::default();
            map.insert(owned, vec![7]);
            assert_eq!(map.get(&borrowed), Some(&vec![7]));
            // Another tenant, type or id is another scope.
            assert_eq!(map.get(&ScopeRef(Some("t2"), "order", "o42")), None);
            assert_eq!(map.get(&ScopeRef(tenant, "order", "o4")), None);
            assert_eq!(map.get(&ScopeRef(tenant, "orde", "ro42")), None);
        }
    }
}
