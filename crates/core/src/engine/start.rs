//! Starting runs: `start` (every option, every rule, in `start_in`),
//! `start_many` (many starts, all or none), `start_group` (starts that
//! arrived together, each on its own, one transaction) and `start_batch`
//! (starts JS answered itself, the hot path).

use super::timeline::CancelCause;
use super::{parse_run_id, Effects, Engine};
use crate::clock::clamp_time;
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use crate::template::InputFields;
use serde_json::value::RawValue;
use std::sync::Arc;
use uuid::Uuid;

/// What `start` did.
#[derive(Debug)]
pub enum Started {
    /// The new run, or the dedupe hit (an existing run).
    Row(Box<RunRow>),
    /// A new run, when the caller did not ask for its row: what the
    /// request and the definition do not say of it.
    Created {
        id: RunId,
        at: Millis,
        pool: Arc<str>,
        concurrency_key: Option<Box<str>>,
        dedupe_key: Option<Box<str>>,
        /// A child's parent and the tree's root (`None`: a root run).
        parent_run_id: Option<RunId>,
        root_run_id: Option<RunId>,
        tenant_id: Option<Arc<str>>,
    },
}

/// The most entries one `start_many` takes. The batch is one transaction,
/// which holds its rows, its lane and dedupe locks and (on a networked
/// store) one statement's worth of parameters until it commits; a caller
/// with more splits them into batches of its own (each all or nothing).
pub const START_MANY_MAX: usize = 10_000;

/// A `start_many` refused: by its entry at `index` (with the error a
/// `start` of that entry alone would have met), or as a whole (`None`:
/// too many entries, the store failed).
#[derive(Debug)]
pub struct BatchError {
    pub index: Option<usize>,
    pub error: JobError,
}

/// What a start's options set on a new run. `None`: the definition's
/// pool and priority, due at once, a manual trigger, `terminate`.
#[derive(Default)]
struct RunOptions {
    tenant: Option<Arc<str>>,
    extras: Option<Box<RunExtras>>,
    pool: Option<Arc<str>>,
    priority: Option<i32>,
    run_at: Option<Millis>,
    trigger_source: Option<TriggerSource>,
    parent_close_policy: Option<ParentClosePolicy>,
}

/// Refuses an invoke whose child would sit in lane `key` behind its
/// caller (or a caller above it), which waits for that child: neither
/// would ever run again.
fn guard_lane(req: &StartRequest, key: &str, what: &str) -> Result<()> {
    if req.lane_guard.iter().any(|g| g == key) {
        return Err(JobError::invalid(format!(
            "invoke: {what} '{key}', a lane its waiting caller (or one of its callers) holds: it would queue behind the run that waits for it"
        )));
    }
    Ok(())
}

/// The texts of a start's row options that a store may refuse (see
/// `Engine::storable_values`), whether they came as a request or a line.
struct RowTexts<'a> {
    scope: Option<&'a (String, String)>,
    /// `meta.scope.from(input)` (a request's only).
    scope_from_meta: Option<&'a str>,
    tenant: &'a TenantArg,
    trigger_ref: Option<&'a str>,
    pool: Option<&'a str>,
}

/// Tags as a row keeps them: `{}` is none.
fn kept_tags(tags: Option<Box<RawValue>>) -> Option<Box<RawValue>> {
    tags.filter(|t| t.get() != "{}")
}

/// What `start_batch` tells its caller, gathered run by run.
#[derive(Default)]
struct BatchOut {
    failed: Vec<(usize, JobError)>,
    /// Pools that got runs.
    pools: Vec<Arc<str>>,
    /// Pools that got runs due later (the scheduler must set its timer).
    wake_later: Vec<Arc<str>>,
}

impl BatchOut {
    fn created(&mut self, pool: &Arc<str>, later: bool) {
        if later && !self.wake_later.contains(pool) {
            self.wake_later.push(pool.clone());
        }
        if !self.pools.contains(pool) {
            self.pools.push(pool.clone());
        }
    }
}

/// A new pending run of `def` created at `now`: the one place a run row
/// is built, so every start path stores the same row.
fn new_run(
    def: &JobDefinition,
    id: RunId,
    seq: u64,
    now: Millis,
    input: Box<RawValue>,
    o: RunOptions,
) -> RunRow {
    RunRow {
        id,
        job_type: def.job_type.clone(),
        job_version: def.version,
        parent_close_policy: o
            .parent_close_policy
            .unwrap_or(ParentClosePolicy::Terminate),
        tenant_id: o.tenant,
        pool: o.pool.unwrap_or_else(|| def.pool.clone()),
        priority: o.priority.unwrap_or(def.priority_default),
        status: RunStatus::Pending,
        input,
        result: None,
        trigger_source: o.trigger_source.unwrap_or(TriggerSource::Manual),
        run_at: clamp_time(o.run_at.unwrap_or(now)),
        started_at: OptMillis::NONE,
        finished_at: OptMillis::NONE,
        claimed_at: OptMillis::NONE,
        attempts: 0,
        wait_kind: None,
        wait_deadline: OptMillis::NONE,
        extras: o.extras,
        created_at: now,
        updated_at: now,
        seq,
        claim_epoch: 0,
        executing: false,
    }
}

impl<S: Store> Engine<S> {
    /// The row a start of `def` with no options builds, with a nil id, time
    /// 0 and input `{}`: what a caller that answers starts itself copies
    /// and fills in (the defaults of a new row are decided here only).
    pub fn run_template(&self, def: &JobDefinition) -> RunRow {
        new_run(
            def,
            RunId::nil(),
            0,
            0,
            empty_object(),
            RunOptions::default(),
        )
    }

    /// Starts a run (or returns the dedupe hit). O(log n): keyed lookups for
    /// the definition, dedupe list and lane, one insert into each index;
    /// `replace` adds O(runs canceled + their descendants).
    pub fn start(&self, req: StartRequest) -> Result<RunRow> {
        match self.start_with(req, true, true)? {
            Started::Row(row) => Ok(*row),
            // want_row = true never answers without the row.
            Started::Created { id, .. } => self
                .find_by_id(&id.to_string(), &TenantArg::Missing)?
                .ok_or(JobError::JobRunNotFound {
                    run_id: id.to_string(),
                }),
        }
    }

    /// `start` for a caller that can build the new row itself (it knows
    /// the definition and the request): a created run is answered with its
    /// id and creation time only, which saves copying and serialising the
    /// row. A dedupe hit still comes back as the existing row.
    ///
    /// `wake`: false when the caller claims into the worker's free slots
    /// itself right after (saves waking the scheduler's thread).
    pub fn start_with(&self, req: StartRequest, want_row: bool, wake: bool) -> Result<Started> {
        let now = self.now();
        let mut fx = Effects::default();
        let started = self.write(|tx| {
            // Purge first: dedupe must not answer with a run this very
            // transaction deletes.
            self.purge(tx, now);
            self.start_in(tx, req, now, want_row, &mut fx)
        })?;
        self.deliver(fx);
        match &started {
            _ if !wake => {}
            Started::Row(r) => self.wake_worker_for(&r.pool),
            Started::Created { pool, .. } => self.wake_worker_for(pool),
        }
        Ok(started)
    }

    /// Starts every run of `reqs` in entry order, in one transaction, or
    /// none: each entry is a `start` with every rule (`start_in`), so a
    /// later entry dedupes onto an earlier one, joins (or is refused by,
    /// or replaces) the lane an earlier one took, exactly as `reqs.len()`
    /// sequential starts would, all created at one instant. An entry
    /// refused undoes the batch (`StoreTx::begin_undo` where the store
    /// cannot roll back) and is answered with its index; its side effects
    /// (a `replace` lane's aborts) never go out. At most
    /// [`START_MANY_MAX`] entries. O(log n) per entry, as `start`.
    pub fn start_many(
        &self,
        reqs: Vec<StartRequest>,
    ) -> std::result::Result<Vec<RunRow>, BatchError> {
        let n = reqs.len();
        if n > START_MANY_MAX {
            return Err(BatchError {
                index: None,
                error: JobError::invalid(format!(
                    "startMany takes at most {START_MANY_MAX} entries, got {n}"
                )),
            });
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let now = self.now();
        let mut fx = Effects::default();
        let mut refused = None;
        let rows = self.write(|tx| {
            self.purge(tx, now);
            tx.expect_inserts(n);
            tx.begin_undo();
            let mut rows = Vec::with_capacity(n);
            for (i, req) in reqs.into_iter().enumerate() {
                match self.start_in(tx, req, now, true, &mut fx) {
                    Ok(Started::Row(row)) => rows.push(*row),
                    // `want_row` is true: a start answers its row.
                    Ok(Started::Created { .. }) => {
                        tx.end_undo(true);
                        return Err(JobError::invalid("start answered no row"));
                    }
                    Err(e) => {
                        tx.end_undo(true);
                        refused = Some(i);
                        return Err(e);
                    }
                }
            }
            tx.end_undo(false);
            Ok(rows)
        });
        let rows = rows.map_err(|error| BatchError {
            index: refused,
            error,
        })?;
        self.deliver(fx);
        self.wake_pools_of(rows.iter());
        Ok(rows)
    }

    /// Starts that arrived together (concurrent `start` calls a networked
    /// store groups so they share one commit), in one transaction, each on
    /// its own: every entry is a `start` with every rule, in entry order,
    /// and one refused (a `reject` lane, a bad parent, a missing tenant)
    /// is answered with its error and leaves the others be. That needs no
    /// savepoint: `start_in` checks everything before it changes anything,
    /// so a refused start changed nothing. A store failure fails the
    /// group (nothing of it is stored), as it would each start. O(log n)
    /// per entry.
    pub fn start_group(&self, reqs: Vec<StartRequest>) -> Result<Vec<Result<RunRow>>> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.now();
        let mut fx = Effects::default();
        let n = reqs.len();
        let answers = self.write(|tx| {
            self.purge(tx, now);
            tx.expect_inserts(n);
            let mut answers = Vec::with_capacity(n);
            for req in reqs {
                answers.push(match self.start_in(tx, req, now, true, &mut fx) {
                    Ok(Started::Row(row)) => Ok(*row),
                    Ok(Started::Created { .. }) => Err(JobError::invalid("start answered no row")),
                    // A store failure is the group's, not this start's: the
                    // transaction is gone, so the call fails whole (and runs
                    // again if that changed nothing, `Engine::again`). A
                    // rule's refusal changed nothing and leaves the others be.
                    Err(e @ JobError::Store { .. }) => return Err(e),
                    Err(e) => Err(e),
                });
            }
            Ok(answers)
        })?;
        self.deliver(fx);
        self.wake_pools_of(answers.iter().flatten());
        Ok(answers)
    }

    /// Wakes the worker for the pools of `rows` (each once: a set, as a
    /// batch may name thousands of pools).
    fn wake_pools_of<'r>(&self, rows: impl Iterator<Item = &'r RunRow>) {
        let pools: std::collections::HashSet<&str> = rows.map(|r| &*r.pool).collect();
        for pool in pools {
            self.wake_worker_for(pool);
        }
    }

    /// `start_batch` of starts with no options.
    #[allow(clippy::type_complexity)]
    pub fn start_plain_batch<'a>(
        &self,
        runs: impl IntoIterator<Item = PlainStart<'a>>,
        wake: bool,
    ) -> Result<(Vec<(usize, JobError)>, Vec<Arc<str>>)> {
        self.start_batch(runs.into_iter().map(BufferedStart::Plain), wake)
    }

    /// Creates runs JS has already answered `start` for, each with its
    /// preset id and time, in one store transaction and one purge. A start
    /// of a *plain* type (no dedupe or concurrency key, no scope entity
    /// left to the definition) whose options only set fields of its row
    /// (`BufferedStart::Plain` and `RowOptions`; a multi-tenant one naming
    /// its tenant) has nothing to look up: its row is built from its
    /// definition and options at once. Any other goes through the full
    /// `start_in` rules. `wake`: wake the scheduler for the pools that got
    /// runs (not needed when the caller claims into the worker's free slots
    /// itself right after). Answers the failures (by position) and the
    /// pools that got runs. O(log n) per run.
    #[allow(clippy::type_complexity)]
    pub fn start_batch<'a>(
        &self,
        runs: impl IntoIterator<Item = BufferedStart<'a>>,
        wake: bool,
    ) -> Result<(Vec<(usize, JobError)>, Vec<Arc<str>>)> {
        let mut fx = Effects::default();
        let mut out = BatchOut::default();
        let mut latest = Millis::MIN;
        self.write(|tx| {
            // Consecutive starts are usually of one type: look it up once.
            let mut last: Option<Arc<JobDefinition>> = None;
            for (i, run) in runs.into_iter().enumerate() {
                let (run, opts) = match run {
                    BufferedStart::Plain(run) => (run, None),
                    BufferedStart::RowOptions(run, opts) => (run, Some(opts)),
                    BufferedStart::WithOptions(req) => {
                        let Some((_, at)) = req.preset else {
                            out.failed.push((
                                i,
                                JobError::invalid("a buffered start needs its id and time"),
                            ));
                            continue;
                        };
                        let at = clamp_time(at);
                        latest = latest.max(at);
                        self.start_buffered_in(tx, *req, at, i, &mut out, &mut fx);
                        continue;
                    }
                };
                let at = clamp_time(run.at);
                latest = latest.max(at);
                let def = match &last {
                    Some(d) if *d.job_type == *run.job_type => Some(d.clone()),
                    _ => tx.definition(run.job_type),
                };
                let o = opts.as_deref();
                let plain = def.as_ref().filter(|d| {
                    d.dedupe_key_template.is_none()
                        && d.concurrency_key_template.is_none()
                        && (d.scope_entity_type.is_none() || o.is_some_and(|o| o.scope.is_some()))
                        && (!self.multi_tenant || o.is_some_and(|o| o.tenant != TenantArg::Missing))
                });
                let Some(def) = plain else {
                    let mut req = StartRequest {
                        job_type: run.job_type.to_owned(),
                        input: run.input,
                        preset: Some((run.id, run.at)),
                        ..StartRequest::default()
                    };
                    if let Some(o) = opts {
                        o.apply_to(&mut req);
                    }
                    self.start_buffered_in(tx, req, at, i, &mut out, &mut fx);
                    continue;
                };
                // The checks of `start_in`, in its order: what the store can
                // hold, then the id.
                if let Err(e) = self.storable_buffered(&run.input, o) {
                    out.failed.push((i, e));
                    continue;
                }
                if tx.run(&run.id).is_some() {
                    out.failed.push((
                        i,
                        JobError::JobInputInvalid {
                            reason: format!("run id {} is already taken", run.id),
                        },
                    ));
                    continue;
                }
                let options = opts.map_or_else(RunOptions::default, |o| self.row_options(*o));
                let seq = tx.next_seq();
                let row = new_run(def, run.id, seq, at, run.input, options);
                out.created(&row.pool, row.run_at > at);
                self.metrics.created(&row);
                tx.insert_run(row);
                last = Some(def.clone());
            }
            if latest != Millis::MIN {
                self.purge(tx, latest);
            }
            Ok(())
        })?;
        if latest != Millis::MIN {
            self.clock.observe(latest);
        }
        self.deliver(fx);
        for pool in if wake { &out.pools } else { &out.wake_later } {
            self.wake_worker_for(pool);
        }
        Ok((out.failed, out.pools))
    }

    /// A buffered start through the full `start` rules (`start_in`).
    fn start_buffered_in(
        &self,
        tx: &mut S::Tx<'_>,
        req: StartRequest,
        at: Millis,
        i: usize,
        out: &mut BatchOut,
        fx: &mut Effects,
    ) {
        // A run due later: the caller's claim right after finds nothing,
        // the scheduler must set its timer.
        let later = req.run_at.is_some_and(|t| t > at);
        match self.start_in(tx, req, at, false, fx) {
            Ok(Started::Created { pool, .. }) => out.created(&pool, later),
            Ok(Started::Row(_)) => {}
            Err(e) => out.failed.push((i, e)),
        }
    }

    /// What options that only set fields of a row set on it: the same
    /// fields as `start_in`'s step 7 from the same options.
    fn row_options(&self, o: RowOptions) -> RunOptions {
        let tenant = match (self.multi_tenant, o.tenant) {
            (true, TenantArg::Id(t)) => Some(Arc::from(t)),
            _ => None,
        };
        let (scope_entity_type, scope_entity_id) = match o.scope {
            Some((t, e)) => (Some(t.into_boxed_str()), Some(e.into_boxed_str())),
            None => (None, None),
        };
        let extras = RunExtras {
            scope_entity_type,
            scope_entity_id,
            tags: kept_tags(o.tags),
            trigger_ref: o.trigger_ref.map(String::into_boxed_str),
            ..RunExtras::default()
        };
        RunOptions {
            tenant,
            extras: extras.boxed(),
            pool: o.pool.map(|p| Arc::from(p.as_str())),
            priority: o.priority,
            run_at: o.run_at,
            trigger_source: o.trigger_source,
            parent_close_policy: o.parent_close_policy,
        }
    }

    pub(super) fn start_in(
        &self,
        tx: &mut S::Tx<'_>,
        req: StartRequest,
        now: Millis,
        want_row: bool,
        fx: &mut Effects,
    ) -> Result<Started> {
        // 1. Tenant gate (a child with no tenant inherits its parent's).
        let explicit_tenant: Option<Option<String>> = if !self.multi_tenant {
            Some(None)
        } else {
            match &req.tenant {
                TenantArg::Missing if req.parent_run_id.is_none() => {
                    return Err(JobError::MissingTenantId {
                        method: "start".to_owned(),
                    })
                }
                TenantArg::Missing => None,
                TenantArg::Null => Some(None),
                TenantArg::Id(t) => Some(Some(t.clone())),
            }
        };
        // 2. Job type.
        let def = tx
            .definition(&req.job_type)
            .ok_or_else(|| JobError::JobTypeNotFound {
                job_type: req.job_type.clone(),
            })?;
        self.storable(&req)?;
        // Lineage is checked in step 5, but the tenant of a child depends on
        // its parent, so look the parent up now.
        let parent: Option<(RunId, RunId, Option<Arc<str>>)> = req
            .parent_run_id
            .as_deref()
            .and_then(parse_run_id)
            .and_then(|p| tx.run(&p))
            .map(|p| (p.id, p.root_run_id(), p.tenant_id.clone()));
        let tenant: Option<Arc<str>> = match (&explicit_tenant, &parent) {
            (Some(t), _) => t.as_deref().map(Arc::from),
            (None, Some((_, _, pt))) => pt.clone(),
            (None, None) => None,
        };
        let parent_visible = match (&parent, self.multi_tenant) {
            (Some((_, _, pt)), true) => pt.as_deref() == tenant.as_deref(),
            (Some(_), false) => true,
            (None, _) => false,
        };

        let needs_fields = matches!(def.dedupe_key_template, Some(KeySpec::Template(_)))
            || matches!(def.concurrency_key_template, Some(KeySpec::Template(_)));
        let input_fields = needs_fields.then(|| InputFields::parse(&req.input));
        let eval = |spec: &Option<KeySpec>,
                    given: &Option<String>,
                    kind: &str|
         -> Result<Option<String>> {
            match spec {
                None => Ok(None),
                Some(KeySpec::Template(t)) => match &input_fields {
                    Some(fields) => t.evaluate(fields).map(Some).map_err(JobError::from),
                    None => Ok(None),
                },
                Some(KeySpec::Function) => {
                    given
                        .clone()
                        .map(Some)
                        .ok_or_else(|| JobError::JobKeyFunctionUnavailable {
                            job_type: req.job_type.clone(),
                            kind: kind.to_owned(),
                        })
                }
            }
        };

        // 3. Dedupe.
        let dedupe_key = eval(&def.dedupe_key_template, &req.dedupe_key, "dedupe")?;
        if let (Some(key), Some(window)) = (&dedupe_key, def.dedupe_window_ms) {
            if window > 0 {
                let hit = tx
                    .find_dedupe(
                        tenant.as_deref(),
                        &req.job_type,
                        key,
                        now.saturating_sub(window),
                    )
                    // A run past its retention is as good as deleted: the
                    // purge skips a row another transaction holds locked,
                    // and must not leave it to answer a dedupe.
                    .filter(|hit| !self.past_retention(hit, now));
                if let Some(hit) = hit {
                    // An invoke's live dedupe hit must not leave it and its
                    // caller waiting for each other: a hit that waits for
                    // the caller (its parent, say), or one queued behind it
                    // in a lane it holds (as a new child there would be).
                    if let (Some((caller, step_id)), false) =
                        (&req.awaited_by, hit.status.is_terminal())
                    {
                        if hit.id != *caller && super::waits::waits_on(tx, hit.id, *caller, now) {
                            return Err(JobError::invalid(format!(
                                "invoke '{step_id}': the child's dedupe key names run {}, which waits for the invoking run: each would wait for the other",
                                hit.id
                            )));
                        }
                        if let Some(k) = hit.concurrency_key() {
                            if tx.lane_head(tenant.as_deref(), k) != Some(hit.id) {
                                guard_lane(&req, k, "the run its dedupe key names is queued in")?;
                            }
                        }
                    }
                    return Ok(Started::Row(Box::new(hit.clone())));
                }
            }
        }

        // 4. Concurrency lane.
        let concurrency_key = eval(
            &def.concurrency_key_template,
            &req.concurrency_key,
            "concurrency",
        )?;
        if let Some(k) = &concurrency_key {
            guard_lane(&req, k, "the child's concurrency key is")?;
        }
        // Only `replace` needs the whole lane; `queue` joins it and
        // `reject` asks only who holds it (O(log n) either way, not O(lane)).
        let (lane, head): (Vec<RunId>, Option<RunId>) = match &concurrency_key {
            Some(k) if def.collision_mode == CollisionMode::Replace => {
                (tx.lane(tenant.as_deref(), k), None)
            }
            Some(k) => (Vec::new(), tx.lane_head(tenant.as_deref(), k)),
            None => (Vec::new(), None),
        };
        if def.collision_mode == CollisionMode::Reject {
            if let (Some(k), Some(head)) = (&concurrency_key, head) {
                let incumbent = tx
                    .run(&head)
                    .cloned()
                    .ok_or_else(|| JobError::JobRunNotFound {
                        run_id: head.to_string(),
                    })?;
                return Err(JobError::JobCollision {
                    job_type: req.job_type.clone(),
                    concurrency_key: k.clone(),
                    incumbent: Box::new(incumbent),
                });
            }
        }

        // 5. Lineage.
        if let Some(p) = &req.parent_run_id {
            if !parent_visible {
                return Err(JobError::ParentRunNotFound {
                    parent_run_id: p.clone(),
                });
            }
        }

        // 6. The new run's id (a preset one must be free).
        let id = match req.preset {
            Some((id, _)) if tx.run(&id).is_some() => {
                return Err(JobError::JobInputInvalid {
                    reason: format!("run id {id} is already taken"),
                })
            }
            Some((id, _)) => id,
            None => Uuid::new_v4(),
        };

        // Everything is checked: from here on, change the store.
        if def.collision_mode == CollisionMode::Replace {
            for incumbent in &lane {
                let cause = CancelCause::Replaced(id);
                self.cancel_tree(tx, *incumbent, (true, true), cause, now, fx);
            }
        }

        // 7. Create.
        let root_run_id = parent.as_ref().map_or(id, |(_, root, _)| *root);
        let (scope_entity_type, scope_entity_id) = match (&req.scope, &def.scope_entity_type) {
            (Some((t, e)), _) => (Some(t.as_str().into()), Some(e.as_str().into())),
            (None, Some(t)) => match &req.scope_entity_id_from_meta {
                Some(e) => (Some(t.as_str().into()), Some(e.as_str().into())),
                None => (None, None),
            },
            (None, None) => (None, None),
        };
        let seq = tx.next_seq();
        let extras = RunExtras {
            parent_run_id: parent.as_ref().map(|(p, _, _)| *p),
            root_run_id: (root_run_id != id).then_some(root_run_id),
            scope_entity_type,
            scope_entity_id,
            tags: kept_tags(req.tags),
            concurrency_key: concurrency_key.map(String::into_boxed_str),
            dedupe_key: dedupe_key.map(String::into_boxed_str),
            trigger_ref: req.trigger_ref.map(String::into_boxed_str),
            lane_seq: None,
            awaited_by: req
                .awaited_by
                .map(|(run, step)| vec![(run, step.into_boxed_str())])
                .unwrap_or_default(),
        };
        let row = new_run(
            &def,
            id,
            seq,
            now,
            req.input,
            RunOptions {
                tenant,
                extras: extras.boxed(),
                pool: req.pool.map(|p| Arc::from(p.as_str())),
                priority: req.priority,
                run_at: req.run_at,
                trigger_source: req.trigger_source,
                parent_close_policy: req.parent_close_policy,
            },
        );
        let out = if want_row {
            Started::Row(Box::new(row.clone()))
        } else {
            Started::Created {
                id,
                at: now,
                pool: row.pool.clone(),
                concurrency_key: row.concurrency_key().map(Box::from),
                dedupe_key: row.dedupe_key().map(Box::from),
                parent_run_id: row.parent_run_id(),
                root_run_id: (root_run_id != id).then_some(root_run_id),
                tenant_id: row.tenant_id.clone(),
            }
        };
        self.metrics.created(&row);
        tx.insert_run(row);
        Ok(out)
    }

    /// Refuses a start whose values the store cannot hold (before anything
    /// changes, e.g. a `replace` lane's incumbent).
    fn storable(&self, req: &StartRequest) -> Result<()> {
        let row = RowTexts {
            scope: req.scope.as_ref(),
            scope_from_meta: req.scope_entity_id_from_meta.as_deref(),
            tenant: &req.tenant,
            trigger_ref: req.trigger_ref.as_deref(),
            pool: req.pool.as_deref(),
        };
        self.storable_values(
            &[("input", Some(&*req.input)), ("tags", req.tags.as_deref())],
            row,
            &[
                ("concurrency key", req.concurrency_key.as_deref()),
                ("dedupe key", req.dedupe_key.as_deref()),
            ],
        )
    }

    /// `storable` of a buffered start built at once: its input and the
    /// options that set fields of its row.
    fn storable_buffered(&self, input: &RawValue, o: Option<&RowOptions>) -> Result<()> {
        let none = TenantArg::Missing;
        let row = RowTexts {
            scope: o.and_then(|o| o.scope.as_ref()),
            scope_from_meta: None,
            tenant: o.map_or(&none, |o| &o.tenant),
            trigger_ref: o.and_then(|o| o.trigger_ref.as_deref()),
            pool: o.and_then(|o| o.pool.as_deref()),
        };
        let tags = o.and_then(|o| o.tags.as_deref());
        self.storable_values(&[("input", Some(input)), ("tags", tags)], row, &[])
    }

    /// Refuses the first JSON value, then the first text, the store cannot
    /// hold: the row options' texts (`row`), then `more`.
    fn storable_values(
        &self,
        json: &[(&str, Option<&RawValue>)],
        row: RowTexts<'_>,
        more: &[(&str, Option<&str>)],
    ) -> Result<()> {
        let tenant = match row.tenant {
            TenantArg::Id(t) => Some(t.as_str()),
            _ => None,
        };
        let text = [
            ("scope.entityType", row.scope.map(|s| s.0.as_str())),
            ("scope.entityId", row.scope.map(|s| s.1.as_str())),
            ("scope entity id", row.scope_from_meta),
            ("tenantId", tenant),
            ("triggerRef", row.trigger_ref),
            ("pool", row.pool),
        ];
        for (what, value) in json {
            if let Some(p) = value.and_then(|v| self.store.json_problem(v.get())) {
                return Err(JobError::JobInputInvalid {
                    reason: format!("{what} cannot be stored: it holds {p}"),
                });
            }
        }
        for (what, value) in text.iter().chain(more) {
            if let Some(p) = value.and_then(|v| self.store.text_problem(v)) {
                return Err(JobError::JobInputInvalid {
                    reason: format!("{what} cannot be stored: it holds {p}"),
                });
            }
        }
        Ok(())
    }
}
