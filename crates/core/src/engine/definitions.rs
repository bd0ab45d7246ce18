//! Registering job types: validated in full before any is stored.

use super::Engine;
use crate::clock::clamp_time;
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use crate::template::KeyTemplate;
use std::sync::Arc;

impl<S: Store> Engine<S> {
    /// Creates or replaces a job definition. O(1).
    pub fn register(&self, spec: DefinitionSpec) -> Result<Arc<JobDefinition>> {
        let mut defs = self.register_all(vec![spec])?;
        defs.pop()
            .ok_or_else(|| JobError::invalid("nothing to register"))
    }

    /// Registers several definitions: all are validated before any is
    /// stored, so one bad entry changes nothing. O(entries).
    pub fn register_all(&self, specs: Vec<DefinitionSpec>) -> Result<Vec<Arc<JobDefinition>>> {
        let validated = self.validate_definitions(specs)?;
        self.write(|tx| {
            Ok(validated
                .into_iter()
                .map(|mut def| {
                    if let Some(old) = tx.definition(&def.job_type) {
                        def.created_at = old.created_at;
                        // A later registration (another process) may have
                        // been written first.
                        def.updated_at = def.updated_at.max(old.updated_at);
                    }
                    tx.put_definition(def)
                })
                .collect())
        })
    }

    /// The definitions `register_all` would store, checked and built but not
    /// stored: a networked store's caller answers at once and writes them
    /// in the background. One bad spec fails them all.
    /// Every registration in this process passes here (`register_all`
    /// too): its types are the ones this process's worker serves.
    pub fn validate_definitions(&self, specs: Vec<DefinitionSpec>) -> Result<Vec<JobDefinition>> {
        let now = self.now();
        let defs = specs
            .into_iter()
            .map(|s| {
                let job_type = s.job_type.clone();
                let at = s.registered_at.map_or(now, |t| clamp_time(t).min(now));
                // Name the type: one call may register many.
                Self::validate_spec(s, at).map_err(|e| match e {
                    JobError::JobInputInvalid { reason } if !job_type.is_empty() => {
                        JobError::JobInputInvalid {
                            reason: format!("job type '{job_type}': {reason}"),
                        }
                    }
                    e => e,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Ok(mut served) = self.served.write() {
            for d in &defs {
                if !served.iter().any(|t| **t == *d.job_type) {
                    served.push(Box::from(&*d.job_type));
                }
            }
        }
        Ok(defs)
    }

    fn validate_spec(spec: DefinitionSpec, now: Millis) -> Result<JobDefinition> {
        if spec.job_type.is_empty() {
            return Err(JobError::invalid("job type must be a non-empty string"));
        }
        // Runs cross to JS one per line (start batches, worker tickets).
        if spec.job_type.contains('\n') {
            return Err(JobError::invalid("job type must not contain a line break"));
        }
        let pool = spec.pool.unwrap_or_else(|| "batch".to_owned());
        if pool.is_empty() {
            return Err(JobError::invalid("pool must be a non-empty string"));
        }
        if pool.contains('\n') {
            return Err(JobError::invalid("pool must not contain a line break"));
        }
        let retry = spec.retry.unwrap_or_default();
        if let Some(problem) = retry.problem() {
            return Err(JobError::invalid(problem));
        }
        if matches!(spec.timeout_ms, Some(t) if t <= 0) {
            return Err(JobError::invalid("timeoutMs must be a positive number"));
        }
        if matches!(spec.dedupe_window_ms, Some(w) if w < 0) {
            return Err(JobError::invalid("dedupe.windowMs must not be negative"));
        }
        let key = |k: Option<String>| -> Result<Option<KeySpec>> {
            match k.as_deref() {
                None => Ok(None),
                Some("<fn>") => Ok(Some(KeySpec::Function)),
                Some(t) => Ok(Some(KeySpec::Template(KeyTemplate::parse(t)?))),
            }
        };
        Ok(JobDefinition {
            job_type: Arc::from(spec.job_type.as_str()),
            version: 1,
            pool: Arc::from(pool.as_str()),
            scope_entity_type: spec.scope_entity_type,
            retry_policy: retry,
            timeout_ms: spec.timeout_ms,
            concurrency_key_template: key(spec.concurrency_key)?,
            collision_mode: spec.collision_mode.unwrap_or(CollisionMode::Queue),
            dedupe_key_template: key(spec.dedupe_key)?,
            dedupe_window_ms: spec.dedupe_window_ms,
            priority_default: spec.priority_default.unwrap_or(0),
            replay_from: spec.replay_from.unwrap_or(ReplayFrom::LastCheckpoint),
            created_at: now,
            updated_at: now,
        })
    }

    pub fn definition(&self, job_type: &str) -> Option<Arc<JobDefinition>> {
        self.read(|tx| Ok(tx.definition(job_type))).ok().flatten()
    }

    /// The checks of `start` that precede key evaluation (tenant gate, job
    /// type). The binding runs them when a JS key function throws, so the
    /// contract's error order holds.
    pub fn start_preflight(
        &self,
        job_type: &str,
        tenant: &TenantArg,
        has_parent: bool,
    ) -> Result<()> {
        if self.multi_tenant && *tenant == TenantArg::Missing && !has_parent {
            return Err(JobError::MissingTenantId {
                method: "start".to_owned(),
            });
        }
        if self.definition(job_type).is_none() {
            return Err(JobError::JobTypeNotFound {
                job_type: job_type.to_owned(),
            });
        }
        Ok(())
    }
}
