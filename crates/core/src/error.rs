//! Engine errors. Every variant has a stable `code()` that the binding
//! forwards to JS, where the TS layer turns it into the matching error class.

use crate::model::RunRow;
use crate::template::TemplateError;
use thiserror::Error;

/// Result alias used across the engine.
pub type Result<T, E = JobError> = std::result::Result<T, E>;

#[derive(Debug, Error, Clone)]
pub enum JobError {
    #[error("unknown job type '{job_type}'")]
    JobTypeNotFound { job_type: String },

    #[error("'{job_type}' already has in-flight run {} for key '{concurrency_key}'", incumbent.id)]
    JobCollision {
        job_type: String,
        concurrency_key: String,
        incumbent: Box<RunRow>,
    },

    #[error("run {run_id} is '{current_status}', not terminal")]
    JobNotReplayable {
        run_id: String,
        current_status: String,
    },

    #[error("template '{template}' needs input field '{field}'")]
    JobTemplateFieldMissing { template: String, field: String },

    #[error("{method} needs tenantId when multi-tenancy is on")]
    MissingTenantId { method: String },

    #[error("job type '{job_type}' has a function {kind} key, which only the process that registered it can evaluate")]
    JobKeyFunctionUnavailable { job_type: String, kind: String },

    #[error("run {run_id} not found")]
    JobRunNotFound { run_id: String },

    #[error("parentRunId {parent_run_id} does not reference an existing run")]
    ParentRunNotFound { parent_run_id: String },

    #[error("invalid input: {reason}")]
    JobInputInvalid { reason: String },

    #[error("run {run_id} is '{status}': {detail}")]
    JobRunState {
        run_id: String,
        status: String,
        detail: String,
    },

    #[error("step '{step_id}' of run {run_id} is already running in this attempt")]
    JobStepConflict { run_id: String, step_id: String },

    #[error("resume token refused: {reason}")]
    JobResumeToken { reason: String },

    /// The database failed (connection lost, deadlock, ...). `outcome`
    /// says whether anything changed: `Unchanged` (the transaction was
    /// rolled back, or proven not committed), `Lost` (the same, on a
    /// connection that died: the call may run again at once on another),
    /// or `Unknown` (the connection died during the commit and whether it
    /// landed could not be read back in time; never `retryable`).
    /// `retryable` for deadlocks, serialisation failures and lost
    /// connections when nothing changed.
    #[error("database error: {message}{}", if *outcome == StoreOutcome::Unknown { " (whether the change was stored is unknown)" } else { "" })]
    Store {
        message: String,
        retryable: bool,
        outcome: StoreOutcome,
    },
}

/// What a failed store call changed (see [`JobError::Store`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Nothing: the transaction was rolled back.
    Unchanged,
    /// Nothing, and the connection is gone: the call can run again at once
    /// on a fresh one ([`crate::Engine::again`]).
    Lost,
    /// Nothing: the server rolled the transaction back to break a deadlock
    /// or a serialization conflict with another transaction. The call can
    /// run again at once: the other one has gone on (two invokes of a
    /// fan-out and its children's ends lock parent and child in opposite
    /// orders; a cancel cascade and a child's end too).
    Conflict,
    /// The commit was sent and its answer lost, and reading back whether
    /// it landed failed too: the change may or may not be stored.
    Unknown,
}

impl StoreOutcome {
    /// As JS reads it (`JobStoreError.outcome`).
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOutcome::Unchanged | StoreOutcome::Lost | StoreOutcome::Conflict => "none",
            StoreOutcome::Unknown => "unknown",
        }
    }
}

impl JobError {
    /// Stable machine-readable code (the JS `err.code`).
    pub fn code(&self) -> &'static str {
        match self {
            JobError::JobTypeNotFound { .. } => "JOB_TYPE_NOT_FOUND",
            JobError::JobCollision { .. } => "JOB_COLLISION",
            JobError::JobNotReplayable { .. } => "JOB_NOT_REPLAYABLE",
            JobError::JobTemplateFieldMissing { .. } => "JOB_TEMPLATE_FIELD_MISSING",
            JobError::MissingTenantId { .. } => "MISSING_TENANT_ID",
            JobError::JobKeyFunctionUnavailable { .. } => "JOB_KEY_FUNCTION_UNAVAILABLE",
            JobError::JobRunNotFound { .. } => "JOB_RUN_NOT_FOUND",
            JobError::ParentRunNotFound { .. } => "PARENT_RUN_NOT_FOUND",
            JobError::JobInputInvalid { .. } => "JOB_INPUT_INVALID",
            JobError::JobRunState { .. } => "JOB_RUN_STATE",
            JobError::JobStepConflict { .. } => "JOB_STEP_CONFLICT",
            JobError::JobResumeToken { .. } => "JOB_RESUME_TOKEN",
            JobError::Store { .. } => "JOB_STORE_ERROR",
        }
    }

    /// The error's fields as JSON (camelCase), for the binding to hand to JS.
    pub fn fields_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            JobError::JobTypeNotFound { job_type } => json!({ "jobType": job_type }),
            JobError::JobCollision {
                job_type,
                concurrency_key,
                incumbent,
            } => json!({
                "jobType": job_type,
                "concurrencyKey": concurrency_key,
                "incumbent": serde_json::to_value(incumbent.as_ref()).unwrap_or(serde_json::Value::Null),
            }),
            JobError::JobNotReplayable {
                run_id,
                current_status,
            } => json!({ "runId": run_id, "currentStatus": current_status }),
            JobError::JobTemplateFieldMissing { template, field } => {
                json!({ "template": template, "field": field })
            }
            JobError::MissingTenantId { method } => json!({ "method": method }),
            JobError::JobKeyFunctionUnavailable { job_type, kind } => {
                json!({ "jobType": job_type, "kind": kind })
            }
            JobError::JobRunNotFound { run_id } => json!({ "runId": run_id }),
            JobError::ParentRunNotFound { parent_run_id } => {
                json!({ "parentRunId": parent_run_id })
            }
            JobError::JobInputInvalid { reason } => json!({ "reason": reason }),
            JobError::JobRunState { run_id, status, .. } => {
                json!({ "runId": run_id, "status": status })
            }
            JobError::JobStepConflict { run_id, step_id } => {
                json!({ "runId": run_id, "stepId": step_id })
            }
            JobError::JobResumeToken { reason } => json!({ "reason": reason }),
            JobError::Store {
                retryable, outcome, ..
            } => json!({ "retryable": retryable, "outcome": outcome.as_str() }),
        }
    }

    /// A store failure that changed nothing and may pass if the call runs
    /// again at once (`Engine::again`): a lost connection, a deadlock or a
    /// serialization conflict.
    pub fn runs_again(&self) -> bool {
        matches!(
            self,
            JobError::Store {
                outcome: StoreOutcome::Lost | StoreOutcome::Conflict,
                ..
            }
        )
    }

    /// A store failure that changed nothing.
    pub fn store(message: impl Into<String>, retryable: bool) -> Self {
        JobError::Store {
            message: message.into(),
            retryable,
            outcome: StoreOutcome::Unchanged,
        }
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Self {
        JobError::JobInputInvalid {
            reason: reason.into(),
        }
    }
}

impl From<TemplateError> for JobError {
    fn from(e: TemplateError) -> Self {
        match e {
            TemplateError::MissingField { template, field } => {
                JobError::JobTemplateFieldMissing { template, field }
            }
            // Bad input, in the template's own words.
            e @ (TemplateError::Malformed { .. } | TemplateError::BadFieldJson { .. }) => {
                JobError::invalid(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{InputFields, KeyTemplate};
    use serde_json::value::RawValue;

    /// Template errors reach JS with the codes and messages they had when
    /// the template module returned `JobError` itself.
    #[test]
    fn template_errors_keep_their_codes_and_messages() {
        let said = |e: TemplateError| {
            let e = JobError::from(e);
            (e.code(), e.to_string())
        };
        let parse = |s: &str| said(KeyTemplate::parse(s).unwrap_err());
        assert_eq!(
            parse("x{{a"),
            (
                "JOB_INPUT_INVALID",
                "invalid input: key template 'x{{a' has an unclosed '{{'".to_owned()
            )
        );
        assert_eq!(
            parse("k:{{a.b}}"),
            (
                "JOB_INPUT_INVALID",
                "invalid input: key template 'k:{{a.b}}' has placeholder '{{a.b}}': a placeholder names one input field (letters, digits, _)".to_owned()
            )
        );
        let eval = |t: &str, input: &str| {
            let input = RawValue::from_string(input.to_owned()).unwrap();
            let t = KeyTemplate::parse(t).unwrap();
            said(t.evaluate(&InputFields::parse(&input)).unwrap_err())
        };
        assert_eq!(
            eval("k:{{a}}", "{}"),
            (
                "JOB_TEMPLATE_FIELD_MISSING",
                "template 'k:{{a}}' needs input field 'a'".to_owned()
            )
        );
        assert_eq!(
            eval("{{n}}", r#"{"n": 1e400}"#),
            (
                "JOB_INPUT_INVALID",
                "invalid input: input field 'n': number out of range at line 1 column 5".to_owned()
            )
        );
    }
}
