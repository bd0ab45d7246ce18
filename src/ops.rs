//! The binding's operations, written once over any store: the memory
//! class calls them synchronously on the JS thread, the Postgres class on
//! a blocking thread behind async napi methods.

use super::*;
use jobforge_core::Store;

pub fn register<S: Store>(engine: &Engine<S>, specs_json: String) -> Result<String> {
    // Element by element, so a bad meta names its job type.
    let raw: Vec<serde_json::Value> =
        serde_json::from_str(&specs_json).map_err(|e| invalid(format!("handler meta: {e}")))?;
    let specs = raw
        .into_iter()
        .map(|v| {
            let job_type = v
                .get("type")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_owned();
            serde_json::from_value::<DefinitionSpec>(v)
                .map_err(|e| invalid(format!("handler meta of '{job_type}': {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let defs = engine.register_all(specs).map_err(to_napi)?;
    let rows: Vec<&jobforge_core::JobDefinition> = defs.iter().map(|d| d.as_ref()).collect();
    serde_json::to_string(&rows).map_err(|e| invalid(e.to_string()))
}

pub fn definition<S: Store>(engine: &Engine<S>, job_type: String) -> Option<String> {
    engine
        .definition(&job_type)
        .and_then(|d| serde_json::to_string(d.as_ref()).ok())
}

pub fn start<S: Store>(
    engine: &Engine<S>,
    job_type: String,
    input_json: String,
    opts_json: Option<String>,
) -> Result<String> {
    let mut req = StartRequest {
        job_type,
        input: json_value(input_json).map_err(to_napi)?,
        ..StartRequest::default()
    };
    if let Some(o) = opts_json {
        apply_start_opts(&mut req, &o)?;
    }
    engine
        .start(req)
        .map(|r| r.to_compact_json())
        .map_err(to_napi)
}

pub fn start_preflight<S: Store>(
    engine: &Engine<S>,
    job_type: String,
    tenant_given: bool,
    tenant_id: Option<String>,
    has_parent: bool,
) -> Result<()> {
    engine
        .start_preflight(&job_type, &tenant_arg(tenant_given, tenant_id), has_parent)
        .map_err(to_napi)
}

pub fn cancel<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    cascade: bool,
    tenant_given: bool,
    tenant_id: Option<String>,
) -> Result<()> {
    engine
        .cancel(&run_id, cascade, &tenant_arg(tenant_given, tenant_id))
        .map_err(to_napi)
}

pub fn claim_next<S: Store>(engine: &Engine<S>, pool: String) -> Result<Option<String>> {
    engine
        .claim_next(&pool)
        .map(|r| r.map(|r| r.to_compact_json()))
        .map_err(to_napi)
}

pub fn begin_attempt<S: Store>(engine: &Engine<S>, run_id: String) -> Result<String> {
    let t = engine.begin_attempt(&run_id).map_err(to_napi)?;
    Ok(ticket_json(&t))
}

pub fn finish_attempt<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    epoch: u32,
    outcome_json: String,
) -> Result<bool> {
    let Ok(id) = run_id.parse::<RunId>() else {
        return Err(to_napi(JobError::JobRunNotFound { run_id }));
    };
    engine
        .finish_attempt(&id, epoch, parse_outcome(&outcome_json))
        .map(|r| r.is_some())
        .map_err(to_napi)
}

pub fn step_begin<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    epoch: u32,
    step_id: String,
) -> Result<String> {
    match engine
        .step_begin(&run_id, epoch, &step_id)
        .map_err(to_napi)?
    {
        StepBegin::Memoized(out) => Ok(format!(
            "{{\"memoized\":true,\"output\":{}}}",
            out.as_deref().map_or("null", RawValue::get)
        )),
        StepBegin::Started { attempt } => {
            Ok(format!("{{\"memoized\":false,\"attempt\":{attempt}}}"))
        }
    }
}

pub fn step_complete<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    epoch: u32,
    step_id: String,
    output_json: Option<String>,
) -> Result<()> {
    let output = output_json.map(json_value).transpose().map_err(to_napi)?;
    engine
        .step_complete(&run_id, epoch, &step_id, output)
        .map_err(to_napi)
}

pub fn step_fail<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    epoch: u32,
    step_id: String,
    failure_json: String,
    policy_json: Option<String>,
) -> Result<Option<f64>> {
    let info = parse_failure(&failure_json);
    let policy: Option<RetryPolicy> = policy_json
        .map(|p| serde_json::from_str(&p).map_err(|e| invalid(format!("step retry policy: {e}"))))
        .transpose()?;
    engine
        .step_fail(&run_id, epoch, &step_id, info, policy.as_ref())
        .map(|d| d.map(|ms| ms as f64))
        .map_err(to_napi)
}

pub fn replay<S: Store>(engine: &Engine<S>, run_id: String) -> Result<String> {
    engine
        .replay(&run_id)
        .map(|r| r.to_compact_json())
        .map_err(to_napi)
}

pub fn find_by_id<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    tenant_given: bool,
    tenant_id: Option<String>,
) -> Result<Option<String>> {
    engine
        .find_by_id(&run_id, &tenant_arg(tenant_given, tenant_id))
        .map(|r| r.map(|r| r.to_compact_json()))
        .map_err(to_napi)
}

pub fn list_steps<S: Store>(
    engine: &Engine<S>,
    run_id: String,
    tenant_given: bool,
    tenant_id: Option<String>,
) -> Result<String> {
    let steps = engine
        .list_steps(&run_id, &tenant_arg(tenant_given, tenant_id))
        .map_err(to_napi)?;
    serde_json::to_string(&steps).map_err(|e| invalid(e.to_string()))
}

pub fn list_for_scope<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    entity_type: String,
    entity_id: String,
    query_json: String,
) -> Result<String> {
    let q = parse_scope_query(&query_json)?;
    let rows = engine
        .list_for_scope(
            &tenant_arg(tenant_given, tenant_id),
            &entity_type,
            &entity_id,
            &q,
        )
        .map_err(to_napi)?;
    Ok(rows_json(&rows))
}

pub fn cancel_for_scope<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    entity_type: String,
    entity_id: String,
    cascade: bool,
) -> Result<u32> {
    engine
        .cancel_for_scope(
            &tenant_arg(tenant_given, tenant_id),
            &entity_type,
            &entity_id,
            cascade,
        )
        .map_err(to_napi)
}

pub fn reschedule_for_scope<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    entity_type: String,
    entity_id: String,
    run_at: f64,
) -> Result<u32> {
    if !run_at.is_finite() || run_at.fract() != 0.0 || run_at.abs() > 8.64e15 {
        return Err(invalid("newRunAt must be a valid Date"));
    }
    engine
        .reschedule_for_scope(
            &tenant_arg(tenant_given, tenant_id),
            &entity_type,
            &entity_id,
            run_at as i64,
        )
        .map_err(to_napi)
}

pub fn count_by_pool_and_status<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
) -> Result<String> {
    let counts = engine
        .count_by_pool_and_status(&tenant_arg(tenant_given, tenant_id))
        .map_err(to_napi)?;
    let items: Vec<String> = counts
        .iter()
        .map(|(pool, status, count)| {
            format!(
                "{{\"pool\":{},\"status\":\"{}\",\"count\":{count}}}",
                Value::String(pool.to_string()),
                status.as_str()
            )
        })
        .collect();
    Ok(format!("[{}]", items.join(",")))
}

pub fn list_recent_failed<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    limit: Option<f64>,
) -> Result<String> {
    let limit = page_limit(limit)?;
    let rows = engine
        .list_recent_failed(&tenant_arg(tenant_given, tenant_id), limit)
        .map_err(to_napi)?;
    Ok(rows_json(&rows))
}

pub fn list_job_runs<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    query_json: String,
) -> Result<String> {
    let q = parse_job_run_query(&query_json)?;
    let (rows, next) = engine
        .list_job_runs(&tenant_arg(tenant_given, tenant_id), &q)
        .map_err(to_napi)?;
    let cursor = next.map_or("null".to_owned(), |(t, id)| {
        format!("\"{}\"", encode_cursor(t, id))
    });
    Ok(format!(
        "{{\"rows\":{},\"nextCursor\":{cursor}}}",
        rows_json(&rows)
    ))
}

pub fn get_run_tree<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    root_run_id: String,
) -> Result<Option<String>> {
    let Some(rows) = engine
        .run_tree(&tenant_arg(tenant_given, tenant_id), &root_run_id)
        .map_err(to_napi)?
    else {
        return Ok(None);
    };
    Ok(Some(tree_json(&rows)))
}

pub fn find_step<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    run_id: String,
    step_id: String,
) -> Result<Option<String>> {
    let step = engine
        .find_step(&tenant_arg(tenant_given, tenant_id), &run_id, &step_id)
        .map_err(to_napi)?;
    Ok(step.and_then(|s| serde_json::to_string(&s).ok()))
}

pub fn record_step<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    record_json: String,
) -> Result<String> {
    let rec = parse_record_step(&record_json)?;
    let row = engine
        .record_step(&tenant_arg(tenant_given, tenant_id), rec)
        .map_err(to_napi)?;
    serde_json::to_string(&row).map_err(|e| invalid(e.to_string()))
}

// ── schedules ──────────────────────────────────────────────────────────

#[allow(clippy::too_many_arguments)]
pub fn put_schedule<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    name: String,
    job_type: String,
    input_json: String,
    cron: Option<String>,
    timezone: Option<String>,
    every_ms: Option<f64>,
) -> Result<String> {
    let every_ms = match every_ms {
        None => None,
        Some(ms) if ms.is_finite() && ms.fract() == 0.0 && ms.abs() < 9.0e15 => Some(ms as i64),
        Some(ms) => return Err(invalid(format!("everyMs must be an integer, not {ms}"))),
    };
    let spec = ScheduleSpec {
        name,
        tenant: tenant_arg(tenant_given, tenant_id),
        job_type,
        input: json_value(input_json).map_err(to_napi)?,
        cron,
        timezone,
        every_ms,
    };
    let row = engine.put_schedule(spec).map_err(to_napi)?;
    Ok(schedule_json(&row))
}

pub fn remove_schedule<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
    name: String,
) -> Result<bool> {
    engine
        .remove_schedule(&name, &tenant_arg(tenant_given, tenant_id))
        .map_err(to_napi)
}

pub fn list_schedules<S: Store>(
    engine: &Engine<S>,
    tenant_given: bool,
    tenant_id: Option<String>,
) -> Result<String> {
    let rows = engine
        .list_schedules(&tenant_arg(tenant_given, tenant_id))
        .map_err(to_napi)?;
    let items: Vec<String> = rows.iter().map(schedule_json).collect();
    Ok(format!("[{}]", items.join(",")))
}

pub fn fire_due_schedules<S: Store>(engine: &Engine<S>) -> Result<u32> {
    engine
        .fire_due_schedules()
        .map(|n| n.min(u32::MAX as usize) as u32)
        .map_err(to_napi)
}

/// A schedule as JS reads it (times in epoch ms; the TS layer makes `Date`s).
fn schedule_json(s: &ScheduleRow) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        name: &'a str,
        tenant_id: Option<&'a str>,
        job_type: &'a str,
        input: &'a RawValue,
        cron: Option<&'a str>,
        timezone: Option<&'static str>,
        every_ms: Option<i64>,
        next_run_at: Option<i64>,
        last_run_at: Option<i64>,
        last_run_id: Option<String>,
        last_error: Option<&'a str>,
        created_at: i64,
        updated_at: i64,
    }
    let (cron, timezone, every_ms) = match &s.timing {
        ScheduleTiming::Cron(c, tz) => (Some(c.expr()), Some(tz.name()), None),
        ScheduleTiming::Every(ms) => (None, None, Some(*ms)),
    };
    let out = Out {
        name: &s.name,
        tenant_id: s.tenant_id.as_deref(),
        job_type: &s.job_type,
        input: &s.input,
        cron,
        timezone,
        every_ms,
        next_run_at: s.next_fire_at,
        last_run_at: s.last_fired_at,
        last_run_id: s.last_run_id.map(|id| id.to_string()),
        last_error: s.last_error.as_deref(),
        created_at: s.created_at,
        updated_at: s.updated_at,
    };
    serde_json::to_string(&out).unwrap_or_else(|_| "null".to_owned())
}
