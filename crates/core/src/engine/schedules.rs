//! Schedules: declared per (tenant, name), fired by whoever fires them (a
//! worker's loop, or a memory claim) through the same rules as `start`.

use super::{Effects, Engine, Started};
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use crate::template::InputFields;
use std::sync::Arc;

/// Shortest and longest interval of an `everyMs` schedule.
const MIN_EVERY_MS: i64 = 10;

const MAX_EVERY_MS: i64 = 10 * 366 * 24 * 60 * 60 * 1000;

/// Due schedules fired per transaction.
const SCHEDULE_BATCH: usize = 64;

impl<S: Store> Engine<S> {
    /// The tenant a schedule call acts for (`method` names it in the error).
    fn schedule_tenant(&self, tenant: &TenantArg, method: &str) -> Result<Option<String>> {
        if !self.multi_tenant {
            return Ok(None);
        }
        match tenant {
            TenantArg::Missing => Err(JobError::MissingTenantId {
                method: method.to_owned(),
            }),
            TenantArg::Null => Ok(None),
            TenantArg::Id(t) => Ok(Some(t.clone())),
        }
    }

    /// Creates or replaces the schedule `(tenant, name)`. The job type must
    /// be registered and must not need JS to evaluate a key (a schedule
    /// fires in the engine, without the registering process). Replacing a
    /// schedule with the same timing keeps its next fire, so re-declaring
    /// schedules at every boot does not push an interval back. O(log s).
    pub fn put_schedule(&self, spec: ScheduleSpec) -> Result<ScheduleRow> {
        let tenant = self.schedule_tenant(&spec.tenant, "schedule")?;
        let name = spec.name.trim();
        if name.is_empty() || name.chars().count() > 200 || name != spec.name {
            return Err(JobError::invalid(
                "schedule name must be 1 to 200 characters, without leading or trailing spaces",
            ));
        }
        let timing = match (&spec.cron, spec.every_ms) {
            (Some(c), None) => ScheduleTiming::Cron(
                c.parse::<crate::cron::CronSchedule>()
                    .map_err(|e| JobError::invalid(e.to_string()))?,
                match &spec.timezone {
                    Some(tz) => crate::cron::parse_time_zone(tz)
                        .map_err(|e| JobError::invalid(e.to_string()))?,
                    None => crate::cron::Tz::UTC,
                },
            ),
            (None, Some(_)) if spec.timezone.is_some() => {
                return Err(JobError::invalid(
                    "timezone applies to a cron schedule; an everyMs interval has none",
                ))
            }
            (None, Some(ms)) if (MIN_EVERY_MS..=MAX_EVERY_MS).contains(&ms) => {
                ScheduleTiming::Every(ms)
            }
            (None, Some(ms)) => {
                return Err(JobError::invalid(format!(
                    "everyMs must be an integer from {MIN_EVERY_MS} to {MAX_EVERY_MS}, not {ms}"
                )))
            }
            _ => {
                return Err(JobError::invalid(
                    "a schedule needs exactly one of cron and everyMs",
                ))
            }
        };
        for (what, value) in [
            ("schedule name", Some(name)),
            ("jobType", Some(spec.job_type.as_str())),
            ("tenantId", tenant.as_deref()),
        ] {
            if let Some(p) = value.and_then(|v| self.store.text_problem(v)) {
                return Err(JobError::invalid(format!(
                    "{what} cannot be stored: it holds {p}"
                )));
            }
        }
        if let Some(p) = self.store.json_problem(spec.input.get()) {
            return Err(JobError::invalid(format!(
                "input cannot be stored: it holds {p}"
            )));
        }
        let now = self.now();
        let Some(first) = timing.next_after(now, now) else {
            return Err(JobError::invalid(match &spec.cron {
                Some(c) => format!("cron expression \"{c}\" never fires"),
                None => "everyMs: the next fire time is past the largest date".to_owned(),
            }));
        };
        let row = self.store.transaction(|tx| {
            let def = tx
                .definition(&spec.job_type)
                .ok_or_else(|| JobError::JobTypeNotFound {
                    job_type: spec.job_type.clone(),
                })?;
            for (key, kind) in [
                (&def.concurrency_key_template, "concurrency"),
                (&def.dedupe_key_template, "dedupe"),
            ] {
                if matches!(key, Some(KeySpec::Function)) {
                    return Err(JobError::JobKeyFunctionUnavailable {
                        job_type: spec.job_type.clone(),
                        kind: kind.to_owned(),
                    });
                }
            }
            // A scope taken from the input by `meta.scope.from` needs JS too.
            if def.scope_entity_type.is_some() {
                return Err(JobError::JobKeyFunctionUnavailable {
                    job_type: spec.job_type.clone(),
                    kind: "scope".to_owned(),
                });
            }
            // The input never changes: a key it cannot fill would fail every
            // fire, so say so now.
            let templates = [&def.concurrency_key_template, &def.dedupe_key_template];
            if templates
                .iter()
                .any(|k| matches!(k, Some(KeySpec::Template(_))))
            {
                let fields = InputFields::parse(&spec.input);
                for key in templates {
                    if let Some(KeySpec::Template(t)) = key {
                        t.evaluate(&fields)?;
                    }
                }
            }
            let old = tx.schedule(tenant.as_deref(), name);
            let (anchor, next, created_at, last) = match old {
                Some(o) if o.timing.same_times(&timing) => (
                    o.anchor,
                    o.next_fire_at,
                    o.created_at,
                    (o.last_fired_at, o.last_run_id, o.last_error),
                ),
                Some(o) => (
                    now,
                    Some(first),
                    o.created_at,
                    (o.last_fired_at, o.last_run_id, o.last_error),
                ),
                None => (now, Some(first), now, (None, None, None)),
            };
            let row = ScheduleRow {
                name: name.to_owned(),
                tenant_id: tenant.as_deref().map(Arc::from),
                job_type: spec.job_type.clone(),
                input: spec.input.clone(),
                timing: timing.clone(),
                anchor,
                next_fire_at: next,
                last_fired_at: last.0,
                last_run_id: last.1,
                last_error: last.2,
                created_at,
                updated_at: now,
            };
            tx.put_schedule(row.clone());
            Ok(row)
        })?;
        self.schedules_changed.notify_one();
        Ok(row)
    }

    /// Removes a schedule; whether there was one (runs it started stay).
    pub fn remove_schedule(&self, name: &str, tenant: &TenantArg) -> Result<bool> {
        let tenant = self.schedule_tenant(tenant, "unschedule")?;
        if [Some(name), tenant.as_deref()]
            .into_iter()
            .flatten()
            .any(|t| self.store.text_problem(t).is_some())
        {
            // Nothing the store refuses to hold can name a schedule it holds.
            return Ok(false);
        }
        let removed = self
            .store
            .transaction(|tx| Ok(tx.delete_schedule(tenant.as_deref(), name)))?;
        if removed {
            self.schedules_changed.notify_one();
        }
        Ok(removed)
    }

    /// The schedules of a tenant (single-tenant: all), by name.
    pub fn list_schedules(&self, tenant: &TenantArg) -> Result<Vec<ScheduleRow>> {
        let tenant = self.schedule_tenant(tenant, "listSchedules")?;
        if tenant
            .as_deref()
            .is_some_and(|t| self.store.text_problem(t).is_some())
        {
            return Ok(Vec::new());
        }
        self.store.read(|tx| Ok(tx.schedules(tenant.as_deref())))
    }

    /// When the next schedule fires (the worker's timer).
    pub fn next_schedule_fire(&self) -> Result<Option<Millis>> {
        self.store.transaction(|tx| Ok(tx.next_schedule_fire()))
    }

    /// Starts a run for every schedule that is due, then moves each to its
    /// next fire after now: occurrences missed while nothing fired (no
    /// worker running) collapse into one run. Each run gets trigger source
    /// `schedule`, trigger ref the schedule's name and `runAt` the fire
    /// time that was due; the schedule's dedupe and lane rules are the job
    /// type's. A start the rules refuse (unknown type, a missing template
    /// field, `reject` collision) is recorded as the schedule's
    /// `last_error` and the schedule moves on. O(log s) when none is due,
    /// O(log s + log n) per run. Returns how many runs were created.
    pub fn fire_due_schedules(&self) -> Result<usize> {
        self.fire_due_schedules_then_next().map(|(n, _)| n)
    }

    /// `fire_due_schedules`, answering also when the next schedule fires
    /// (read in the same transaction: one round trip when nothing is due).
    pub fn fire_due_schedules_then_next(&self) -> Result<(usize, Option<Millis>)> {
        let now = self.now();
        let mut fx = Effects::default();
        let mut pools: Vec<Arc<str>> = Vec::new();
        let mut created = 0;
        let next = loop {
            let (n, more, next) = self.write(|tx| {
                let due = tx.due_schedules(now, SCHEDULE_BATCH);
                let more = due.len() == SCHEDULE_BATCH;
                let mut n = 0;
                for mut s in due {
                    let Some(fire_at) = s.next_fire_at else {
                        continue;
                    };
                    let req = StartRequest {
                        job_type: s.job_type.clone(),
                        input: s.input.clone(),
                        tenant: match &s.tenant_id {
                            Some(t) => TenantArg::Id(t.to_string()),
                            None => TenantArg::Null,
                        },
                        run_at: Some(fire_at),
                        trigger_source: Some(TriggerSource::Schedule),
                        trigger_ref: Some(s.name.clone()),
                        ..StartRequest::default()
                    };
                    match self.start_in(tx, req, now, false, &mut fx) {
                        Ok(Started::Created { id, pool, .. }) => {
                            n += 1;
                            pools.push(pool);
                            s.last_run_id = Some(id);
                            s.last_error = None;
                        }
                        // A dedupe hit: the occurrence is the run that exists.
                        Ok(Started::Row(r)) => {
                            s.last_run_id = Some(r.id);
                            s.last_error = None;
                        }
                        // The database failed: roll the whole batch back.
                        Err(e @ JobError::Store { .. }) => return Err(e),
                        // Nothing started: no run of this fire to show.
                        Err(e) => {
                            s.last_error = Some(e.to_string());
                            s.last_run_id = None;
                        }
                    }
                    s.last_fired_at = Some(fire_at);
                    s.next_fire_at = s.timing.next_after(now.max(fire_at), s.anchor);
                    s.updated_at = now;
                    tx.put_schedule(s);
                }
                let next = if more { None } else { tx.next_schedule_fire() };
                Ok((n, more, next))
            })?;
            created += n;
            if !more {
                break next;
            }
        };
        self.deliver(fx);
        pools.sort();
        pools.dedup();
        for pool in &pools {
            self.wake_worker_for(pool);
        }
        Ok((created, next))
    }
}
