//! Reads: a run, its steps, a scope's runs, counts, recent failures,
//! pages and trees, each behind the tenant gate.

use super::{parse_run_id, Engine};
use crate::error::Result;
use crate::model::*;
use crate::store::{PageQuery, Store, StoreTx};
use std::sync::Arc;

/// The order of `list_for_scope`'s rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScopeOrder {
    /// Newest first (the default).
    #[default]
    CreatedDesc,
    CreatedAsc,
    /// Latest `runAt` first, ties newest first.
    RunAtDesc,
    /// Earliest `runAt` first, ties oldest first.
    RunAtAsc,
}

/// Filters of `list_for_scope`.
#[derive(Debug, Clone)]
pub struct ScopeQuery {
    pub statuses: Option<Vec<RunStatus>>,
    pub job_type: Option<String>,
    pub limit: usize,
    pub offset: usize,
    pub order: ScopeOrder,
}

/// Keyset position `(createdAt, id)` of the last row of a page.
pub type PageCursor = (Millis, u128);

/// The first minute of a throughput window, and its ends per minute and
/// terminal status (`Engine::ended_per_minute`).
pub type EndedWindow = (Millis, Vec<(Millis, RunStatus, u64)>);

/// Filters of `list_job_runs`.
#[derive(Debug, Clone, Default)]
pub struct JobRunQuery {
    pub pool: Option<String>,
    pub root_run_id: Option<String>,
    /// Any of these statuses (`None`: every status; empty: no row).
    pub statuses: Option<Vec<RunStatus>>,
    pub since: Option<Millis>,
    /// Only runs of this job type.
    pub job_type: Option<String>,
    /// Only runs of this scope `(entityType, entityId)`.
    pub scope: Option<(String, String)>,
    /// Exclusive upper `(createdAt, id)` bound from the previous page.
    pub cursor: Option<(Millis, u128)>,
    pub limit: usize,
}

/// Rows one `list_job_runs` page examines at most when its rows are
/// checked one by one (a job type, a scope with other filters): the page's
/// cost stays bounded however rare the matching rows are, and a page that
/// found fewer than its limit goes on where the walk stopped.
pub const PAGE_WALK_BUDGET: usize = 5_000;

impl<S: Store> Engine<S> {
    /// O(1).
    /// A run's row with no tenant gate, for the process that holds the run
    /// (a handler reading `ctx.run`).
    pub fn run_row(&self, id: &RunId) -> Option<RunRow> {
        self.read(|tx| Ok(tx.run(id).cloned())).ok().flatten()
    }

    /// O(1).
    pub fn find_by_id(&self, run_id: &str, tenant: &TenantArg) -> Result<Option<RunRow>> {
        self.visible_run("findById", run_id, tenant)
    }

    /// The run service's `getRun`: `find_by_id` under its own name, so a
    /// missing tenant's error names the method the caller called. O(1).
    pub fn get_run(&self, run_id: &str, tenant: &TenantArg) -> Result<Option<RunRow>> {
        self.visible_run("getRun", run_id, tenant)
    }

    /// A run behind the tenant gate of `method`: another tenant's run, an
    /// unknown or malformed id are all `None` (existence is not leaked).
    fn visible_run(
        &self,
        method: &str,
        run_id: &str,
        tenant: &TenantArg,
    ) -> Result<Option<RunRow>> {
        let filter = self.gate(method, tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(None);
        };
        self.read(|tx| Ok(tx.run(&id).filter(|r| Self::visible(&filter, r)).cloned()))
    }

    /// Steps of a run in seq order. O(k log k) for its k steps.
    pub fn list_steps(&self, run_id: &str, tenant: &TenantArg) -> Result<Vec<StepRow>> {
        let filter = self.gate("listSteps", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(Vec::new());
        };
        self.read(|tx| match tx.run(&id) {
            Some(r) if Self::visible(&filter, r) => Ok(tx.steps(&id)),
            _ => Ok(Vec::new()),
        })
    }

    /// One step row. O(1).
    pub fn find_step(
        &self,
        tenant: &TenantArg,
        run_id: &str,
        step_id: &str,
    ) -> Result<Option<StepRow>> {
        let filter = self.gate("findStep", tenant)?;
        let Some(id) = parse_run_id(run_id) else {
            return Ok(None);
        };
        if self.names_nothing([Some(step_id)]) {
            return Ok(None);
        }
        self.read(|tx| match tx.run(&id) {
            Some(r) if Self::visible(&filter, r) => Ok(tx.step(&id, step_id).cloned()),
            _ => Ok(None),
        })
    }

    /// Runs of a scope, filtered and paged. O(r) for the scope's r runs.
    pub fn list_for_scope(
        &self,
        tenant: &TenantArg,
        entity_type: &str,
        entity_id: &str,
        q: &ScopeQuery,
    ) -> Result<Vec<RunRow>> {
        let filter = self.gate("listForScope", tenant)?;
        let t = filter.flatten();
        if self.names_nothing([
            t.as_deref(),
            Some(entity_type),
            Some(entity_id),
            q.job_type.as_deref(),
        ]) {
            return Ok(Vec::new());
        }
        self.read(|tx| {
            // The scope's runs in created order (oldest first).
            let mut ids = tx.scope_runs(t.as_deref(), entity_type, entity_id);
            if matches!(q.order, ScopeOrder::CreatedDesc | ScopeOrder::RunAtDesc) {
                ids.reverse();
            }
            let mut rows: Vec<&RunRow> = ids
                .iter()
                .filter_map(|id| tx.run(id))
                .filter(|r| q.statuses.as_ref().is_none_or(|s| s.contains(&r.status)))
                .filter(|r| q.job_type.as_deref().is_none_or(|j| &*r.job_type == j))
                .collect();
            // A stable sort keeps the created order among equal `runAt`s,
            // which the reverse above made match the direction. O(r log r)
            // over rows already read: no index orders a scope by `runAt`.
            match q.order {
                ScopeOrder::RunAtAsc => rows.sort_by_key(|r| r.run_at),
                ScopeOrder::RunAtDesc => rows.sort_by_key(|r| std::cmp::Reverse(r.run_at)),
                ScopeOrder::CreatedAsc | ScopeOrder::CreatedDesc => {}
            }
            Ok(rows
                .into_iter()
                .skip(q.offset)
                .take(q.limit)
                .cloned()
                .collect())
        })
    }

    /// Live counts per pool and status. O(groups): maintained on every
    /// transition, never counted from rows.
    pub fn count_by_pool_and_status(
        &self,
        tenant: &TenantArg,
    ) -> Result<Vec<(Arc<str>, RunStatus, u64)>> {
        let filter = self.gate("countByPoolAndStatus", tenant)?;
        let t = filter.flatten();
        if self.names_nothing([t.as_deref()]) {
            return Ok(Vec::new());
        }
        self.read(|tx| Ok(tx.status_counts(t.as_deref())))
    }

    /// Runs of a tenant that ended in the last `minutes` minutes (1 to 60,
    /// the minute now included), per minute and terminal status, oldest
    /// first (see `StoreTx::ended_per_minute`), with the window's first
    /// minute: the caller lays out the minutes of the window the engine
    /// read, not of a clock read later (a minute boundary may fall
    /// between). O(pools × minutes) in memory; O(runs ended since) on
    /// PostgreSQL.
    pub fn ended_per_minute(&self, tenant: &TenantArg, minutes: u32) -> Result<EndedWindow> {
        let filter = self.gate("throughput", tenant)?;
        let t = filter.flatten();
        let minutes = i64::from(minutes.clamp(1, 60));
        let since = (self.now().div_euclid(60_000) - (minutes - 1)) * 60_000;
        if self.names_nothing([t.as_deref()]) {
            return Ok((since, Vec::new()));
        }
        self.read(|tx| Ok((since, tx.ended_per_minute(t.as_deref(), since))))
    }

    /// How many runs a tenant has, whatever their status: the sum of the
    /// counts per pool and status, so it costs what
    /// `count_by_pool_and_status` costs and never reads a run. In memory
    /// those counts are kept on every transition: O(groups). PostgreSQL keeps
    /// no counter (a counter row would serialise every transition of every
    /// process on one hot row); its `GROUP BY pool, status` reads only the
    /// tenant's entries of `job_run_pool_status_idx (tenant_id, pool,
    /// status)`, which holds every column it needs (an index-only scan as
    /// far as the visibility map allows): O(the tenant's runs) in the index,
    /// never a scan of the table.
    pub fn count_runs(&self, tenant: &TenantArg) -> Result<u64> {
        let filter = self.gate("countRuns", tenant)?;
        let t = filter.flatten();
        if self.names_nothing([t.as_deref()]) {
            return Ok(0);
        }
        self.read(|tx| Ok(tx.status_counts(t.as_deref()).iter().map(|c| c.2).sum()))
    }

    /// Most recently finished failed runs. O(log n + k).
    pub fn list_recent_failed(&self, tenant: &TenantArg, limit: usize) -> Result<Vec<RunRow>> {
        let filter = self.gate("listRecentFailed", tenant)?;
        let t = filter.flatten();
        if self.names_nothing([t.as_deref()]) {
            return Ok(Vec::new());
        }
        self.read(|tx| {
            Ok(tx
                .recent_failed(t.as_deref(), limit)
                .iter()
                .filter_map(|id| tx.run(id).cloned())
                .collect())
        })
    }

    /// One page of runs, newest first by `(createdAt, id)`, and the cursor
    /// of the next page (`None` on the last).
    ///
    /// The page walks the narrowest index the filters name: the run tree
    /// (`rootRunId`: O(tree)), else the tenant's runs of the scope (memory:
    /// a binary search of the scope's list, O(log r + walked), each
    /// millisecond's runs sorted by id as the walk reaches them;
    /// PostgreSQL: `job_run_scope_page_idx`, O(log n + walked)), else the
    /// tenant's (pool, status) sets (memory; PostgreSQL: its runs by
    /// `job_run_created_idx`), O(log n + walked). A filter the walked index
    /// does not hold — the job type (an index of it would cost every start,
    /// and a per-run entry the memory store's footprint), and beside a scope
    /// the pool and status — is checked per row, and such a walk examines
    /// at most [`PAGE_WALK_BUDGET`] rows: when the
    /// budget runs out before the page is full, the page holds what it
    /// found (possibly nothing) and its cursor is the last row examined, so
    /// every call is O(log n + budget) and paging on finds every match
    /// exactly once. A short page with a cursor is therefore not the last.
    pub fn list_job_runs(
        &self,
        tenant: &TenantArg,
        q: &JobRunQuery,
    ) -> Result<(Vec<RunRow>, Option<PageCursor>)> {
        let filter = self.gate("listJobRuns", tenant)?;
        let t = filter.flatten();
        let root = match &q.root_run_id {
            Some(r) => match parse_run_id(r) {
                Some(id) => Some(id),
                None => return Ok((Vec::new(), None)),
            },
            None => None,
        };
        let (scope_type, scope_id) = q.scope.as_ref().map_or((None, None), |(et, eid)| {
            (Some(et.as_str()), Some(eid.as_str()))
        });
        if self.names_nothing([
            t.as_deref(),
            q.pool.as_deref(),
            q.job_type.as_deref(),
            scope_type,
            scope_id,
        ]) {
            return Ok((Vec::new(), None));
        }
        // A status named twice would page its index twice.
        let statuses = q.statuses.as_ref().map(|s| {
            let mut s = s.clone();
            s.sort_unstable_by_key(|st| st.as_str());
            s.dedup();
            s
        });
        self.read(|tx| {
            // One extra row tells whether another page exists.
            let page = tx.page_runs(&PageQuery {
                tenant: t.as_deref(),
                pool: q.pool.as_deref(),
                statuses: statuses.as_deref(),
                root: root.as_ref(),
                job_type: q.job_type.as_deref(),
                scope: q
                    .scope
                    .as_ref()
                    .map(|(et, eid)| (et.as_str(), eid.as_str())),
                since: q.since.unwrap_or(i64::MIN),
                before: q.cursor,
                limit: q.limit + 1,
                budget: PAGE_WALK_BUDGET.max(q.limit + 1),
            });
            let mut rows: Vec<RunRow> = page
                .ids
                .iter()
                .filter_map(|id| tx.run(id).cloned())
                .collect();
            let next = if rows.len() > q.limit {
                rows.truncate(q.limit);
                rows.last().map(|r| (r.created_at, r.id.as_u128()))
            } else {
                page.walked_to
            };
            Ok((rows, next))
        })
    }

    /// A run and its whole subtree (the run first, then breadth-first), or
    /// `None` when the run is unknown or another tenant's. O(subtree).
    pub fn run_tree(&self, tenant: &TenantArg, root_run_id: &str) -> Result<Option<Vec<RunRow>>> {
        let filter = self.gate("getRunTree", tenant)?;
        let Some(id) = parse_run_id(root_run_id) else {
            return Ok(None);
        };
        self.read(|tx| {
            match tx.run(&id) {
                Some(r) if Self::visible(&filter, r) => {}
                _ => return Ok(None),
            }
            Ok(Some(
                tx.tree_runs(&id)
                    .iter()
                    .filter_map(|i| tx.run(i).cloned())
                    .collect(),
            ))
        })
    }
}
