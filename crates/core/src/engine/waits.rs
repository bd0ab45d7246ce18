//! Durable waits: `ctx.sleep`, `ctx.waitForSignal`, `ctx.waitForToken` and
//! `ctx.invoke` (`wait_begin`, `wait_delivered`), what parks an attempt
//! (`park_in`, from the settle path), and what resumes a waiting run: a
//! signal, a resume token, a child's end, a deadline.
//!
//! A wait is a step row of kind `wait` whose `input` is its [`WaitSpec`];
//! its status says where it is: `pending` (a token being delivered),
//! `running` (open), `completed` (its value in `output`) or `failed` (what
//! the call throws in `output`, a timeout or a child's failure). A handler
//! blocked only on open waits parks: the run turns `waiting`, holds no slot,
//! and runs again from the top when one of them resolves; its completed
//! and failed waits answer from their rows. A handler that awaited other
//! work besides its waits goes on after parking: while the run waits, that
//! execution still acts for it (`RunRow::executes`) — its steps count, a
//! new wait parks it again (`Parked` once more: `park_in` recomputes kind
//! and deadline), its outcome ends it. A resumption ends that execution.
//!
//! Deadlines are resolved lazily: at its deadline a waiting run only turns
//! `pending` (one indexed update, however many runs fall due together); the
//! wait whose deadline passed resolves when the handler asks for it again
//! (a sleep completes, any other wait fails with a timeout, an invoked
//! child is canceled first). A signal, a token or a child's end that comes
//! after the deadline finds the wait expired and does not resolve it.

use super::timeline::CancelCause;
use super::{parse_run_id, Effects, Engine, MemoStep};
use crate::clock::clamp_time;
use crate::error::{JobError, Result};
use crate::model::*;
use crate::store::{Store, StoreTx};
use serde_json::json;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Signals a run's inbox holds at most: a sender that outpaces the run's
/// waits gets `JobInputInvalid` rather than growing the store without end.
pub const MAX_INBOX: usize = 1000;
const TOKEN_PREFIX: &str = "jft_";

/// What a wait asks for (`wait_begin`).
#[derive(Debug)]
pub enum WaitRequest {
    Sleep {
        until: Millis,
    },
    Signal {
        signal: String,
        timeout_ms: Option<i64>,
    },
    Token {
        timeout_ms: Option<i64>,
    },
    /// A child to start (its `parent_run_id` is the waiting run).
    Child {
        start: Box<StartRequest>,
        timeout_ms: Option<i64>,
    },
}

/// What a wait call answers.
#[derive(Debug, Clone)]
pub enum WaitBegin {
    /// Resolved: its value (`None`: null).
    Done(Option<Box<RawValue>>),
    /// Resolved with an error: what the call throws, as JSON
    /// (`{ name, message, ...fields }`).
    Failed(Box<RawValue>),
    /// Open: the handler parks on it.
    Open,
    /// A token wait: deliver this token, then call `wait_delivered`.
    Token(String),
}

fn raw_json(v: serde_json::Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(&v).unwrap_or_else(|_| empty_object())
}

/// The hex SHA-256 of a token: what the store keeps instead of it.
fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A new resume token for a wait of `run`: the run's id (so the token alone
/// finds its run) and 244 random bits: two v4 UUIDs, drawn by `uuid`'s
/// `fast-rng` from `rand`'s `ThreadRng`, a CSPRNG seeded by the OS.
fn new_token(run: &RunId) -> String {
    format!(
        "{TOKEN_PREFIX}{}{}{}",
        run.simple(),
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )
}

fn token_run(token: &str) -> Option<RunId> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    if rest.len() != 96 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Uuid::parse_str(&rest[..32]).ok()
}

fn bad_token(reason: &str) -> JobError {
    JobError::JobResumeToken {
        reason: reason.to_owned(),
    }
}

fn check_timeout(timeout_ms: Option<i64>, what: &str) -> Result<()> {
    match timeout_ms {
        Some(t) if !(1..=MAX_SAFE_INTEGER).contains(&t) => Err(JobError::invalid(format!(
            "{what}: timeoutMs must be a positive integer"
        ))),
        _ => Ok(()),
    }
}

fn deadline_after(now: Millis, timeout_ms: Option<i64>) -> Option<Millis> {
    timeout_ms.map(|t| clamp_time(now.saturating_add(t)))
}

impl<S: Store> Engine<S> {
    /// A durable wait of the attempt `epoch` of `run_id`: its stored
    /// answer when it resolved already (in this attempt or, for a completed
    /// wait, an earlier one), otherwise the wait recorded open. O(1) plus
    /// O(steps of the run) for a new wait's seq; a child adds its start.
    pub fn wait_begin(
        &self,
        run_id: &str,
        epoch: u32,
        step_id: &str,
        req: WaitRequest,
    ) -> Result<WaitBegin> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        if step_id.is_empty() {
            return Err(JobError::invalid("step id must be a non-empty string"));
        }
        if let Some(p) = self.store.text_problem(step_id) {
            return Err(JobError::invalid(format!(
                "step id cannot be stored: it holds {p}"
            )));
        }
        match &req {
            WaitRequest::Sleep { .. } => {}
            WaitRequest::Signal { signal, timeout_ms } => {
                self.check_signal_name(signal)?;
                check_timeout(*timeout_ms, &format!("wait '{step_id}'"))?;
            }
            WaitRequest::Token { timeout_ms } | WaitRequest::Child { timeout_ms, .. } => {
                check_timeout(*timeout_ms, &format!("wait '{step_id}'"))?;
            }
        }
        let now = self.now();
        let mut fx = Effects::default();
        let mut child_pool = None;
        let answer = self.write(|tx| {
            let answer = self.wait_begin_in(
                tx,
                (id, run_id, epoch),
                step_id,
                req,
                now,
                &mut fx,
                &mut child_pool,
            )?;
            // A late execution (its run waiting, see `arm_late_deadline`):
            // a wait it opened is due at its deadline; one it resolved, or
            // read resolved, at once. Only then is the wait's row read back.
            if tx.run(&id).is_some_and(|r| r.status == RunStatus::Waiting) {
                let at = match &answer {
                    WaitBegin::Open | WaitBegin::Token(_) => tx
                        .step(&id, step_id)
                        .and_then(WaitSpec::of_step)
                        .and_then(|w| w.deadline()),
                    _ => Some(now),
                };
                self.arm_late_deadline(tx, &id, at, &mut fx);
            }
            Ok(answer)
        })?;
        self.deliver(fx);
        if let Some(pool) = child_pool {
            self.wake_worker_for(&pool);
        }
        Ok(answer)
    }

    /// `wait_begin`'s transaction: the wait's row and its answer.
    #[allow(clippy::too_many_arguments)]
    fn wait_begin_in(
        &self,
        tx: &mut S::Tx<'_>,
        (id, run_id, epoch): (RunId, &str, u32),
        step_id: &str,
        req: WaitRequest,
        now: Millis,
        fx: &mut Effects,
        child_pool: &mut Option<std::sync::Arc<str>>,
    ) -> Result<WaitBegin> {
        Self::check_attempt(
            tx,
            &id,
            epoch,
            run_id,
            "the attempt that called the wait is over",
        )?;
        let attempt = tx.run(&id).map_or(1, |r| r.attempts + 1);
        // A resolved wait answers without a copy of its row (the
        // common case on a resumption: every wait before the open one).
        if let Some(s) = tx.step(&id, step_id) {
            if s.kind == StepKind::Wait && s.status == StepStatus::Completed {
                return Ok(WaitBegin::Done(s.output.clone()));
            }
        }
        let existing = tx.step(&id, step_id).cloned();
        if let Some(s) = &existing {
            if s.kind != StepKind::Wait {
                return Err(JobError::JobStepConflict {
                    run_id: run_id.to_owned(),
                    step_id: step_id.to_owned(),
                });
            }
            match s.status {
                // A completed wait is never waited again (a replay that
                // keeps steps keeps it too).
                StepStatus::Completed => return Ok(WaitBegin::Done(s.output.clone())),
                // A timeout or a child's failure answers the whole
                // attempt it happened in; a retry waits again.
                StepStatus::Failed if s.attempts == attempt => {
                    if let Some(o) = &s.output {
                        return Ok(WaitBegin::Failed(o.clone()));
                    }
                }
                StepStatus::Pending | StepStatus::Running if s.epoch == epoch => {
                    return Err(JobError::JobStepConflict {
                        run_id: run_id.to_owned(),
                        step_id: step_id.to_owned(),
                    });
                }
                _ => {}
            }
            // Open since an earlier execution of this attempt: asked
            // again after a resumption.
            if s.is_open_wait() {
                if let Some(spec) = WaitSpec::of_step(s) {
                    let mut s = s.clone();
                    s.attempts = attempt;
                    return self.rejoin_wait(tx, s, spec, epoch, now, fx);
                }
            }
        }
        let seq = match &existing {
            Some(s) => s.seq,
            None => tx.max_step_seq(&id) + 1,
        };
        let step = |status: StepStatus, spec: &WaitSpec, output: Option<Box<RawValue>>| StepRow {
            id: existing.as_ref().map_or_else(Uuid::new_v4, |s| s.id),
            job_run_id: id,
            step_id: step_id.into(),
            kind: StepKind::Wait,
            seq,
            status,
            input: Some(spec.to_raw()),
            output,
            error: None,
            attempts: attempt,
            started_at: now.into(),
            finished_at: (status == StepStatus::Completed).then_some(now).into(),
            epoch,
        };
        match req {
            WaitRequest::Sleep { until } => {
                let spec = WaitSpec::Sleep {
                    until: clamp_time(until),
                };
                if until <= now {
                    tx.put_step(step(StepStatus::Completed, &spec, None));
                    return Ok(WaitBegin::Done(None));
                }
                tx.put_step(step(StepStatus::Running, &spec, None));
                Ok(WaitBegin::Open)
            }
            WaitRequest::Signal { signal, timeout_ms } => {
                let taken = tx.take_signal(&id, &signal);
                let spec = WaitSpec::Signal {
                    signal,
                    deadline: deadline_after(now, timeout_ms),
                    timeout_ms,
                };
                match taken {
                    Some(payload) => {
                        let payload = Some(payload).filter(|p| p.get() != "null");
                        tx.put_step(step(StepStatus::Completed, &spec, payload.clone()));
                        Ok(WaitBegin::Done(payload))
                    }
                    None => {
                        tx.put_step(step(StepStatus::Running, &spec, None));
                        Ok(WaitBegin::Open)
                    }
                }
            }
            WaitRequest::Token { timeout_ms } => {
                let token = new_token(&id);
                let spec = WaitSpec::Token {
                    token_hash: token_hash(&token),
                    deadline: deadline_after(now, timeout_ms),
                    timeout_ms,
                };
                tx.put_step(step(StepStatus::Pending, &spec, None));
                Ok(WaitBegin::Token(token))
            }
            WaitRequest::Child { start, timeout_ms } => {
                let mut start = *start;
                start.parent_run_id = Some(id.to_string());
                start.awaited_by = Some((id, step_id.to_owned()));
                // The lanes of the caller and of the live runs above it
                // (they may be waiting on it in turn). O(depth).
                let mut up = Some(id);
                while let Some(r) = up
                    .and_then(|u| tx.run(&u))
                    .filter(|r| !r.status.is_terminal())
                {
                    if let Some(k) = r.concurrency_key() {
                        start.lane_guard.push(k.to_owned());
                    }
                    up = r.parent_run_id();
                }
                let mut child = match self.start_in(tx, start, now, true, fx)? {
                    super::Started::Row(r) => *r,
                    super::Started::Created { .. } => {
                        return Err(JobError::invalid("invoke: the child row is missing"))
                    }
                };
                if child.id == id {
                    // A dedupe hit on the caller itself: it would wait for itself.
                    return Err(JobError::invalid(format!(
                        "invoke '{step_id}': the child's dedupe key names the invoking run itself"
                    )));
                }
                *child_pool = Some(child.pool.clone());
                if !child.status.is_terminal()
                    && !child
                        .awaited_by()
                        .iter()
                        .any(|(r, s)| *r == id && **s == *step_id)
                {
                    // The entries no wait honours any more (their run
                    // ended, their wait resolved or is past its
                    // deadline) go as this one comes: a long-lived
                    // child many runs invoke through its dedupe key
                    // would otherwise keep every past invoker, and
                    // `waits_on` walk them all. Staleness is final
                    // (a waiter read here is locked until commit), so
                    // an entry another transaction added meanwhile is
                    // never among them.
                    let stale: std::collections::HashSet<(RunId, Box<str>)> = child
                        .awaited_by()
                        .iter()
                        .filter(|(w, s)| open_child_wait(tx, w, s, child.id, now).is_none())
                        .cloned()
                        .collect();
                    // A live dedupe hit: its end must resolve this wait
                    // too. Decided on the row `update_run` holds, not on
                    // the dedupe read: a networked store reads that one
                    // unlocked, and re-reads it locked here, so an end
                    // committed meanwhile (whose waiters did not include
                    // this one) is seen and answered below instead of
                    // leaving the wait open on a run that ended.
                    let (child_id, entry) = (child.id, (id, Box::<str>::from(step_id)));
                    tx.update_run(&child_id, &mut |r| {
                        if !r.status.is_terminal() {
                            let list =
                                &mut r.extras.get_or_insert_with(Default::default).awaited_by;
                            if !stale.is_empty() {
                                list.retain(|e| !stale.contains(e));
                            }
                            list.push(entry.clone());
                        }
                        child = r.clone();
                    });
                }
                let spec = WaitSpec::Child {
                    child_run_id: child.id,
                    deadline: deadline_after(now, timeout_ms),
                    timeout_ms,
                };
                if child.status.is_terminal() {
                    // A dedupe hit that ended already answers at once.
                    let (status, output) = child_result(&child, step_id, &id);
                    finish_wait(
                        tx,
                        step(StepStatus::Running, &spec, None),
                        status,
                        output.clone(),
                        now,
                    );
                    return Ok(answer_of(status, output));
                }
                tx.put_step(step(StepStatus::Running, &spec, None));
                Ok(WaitBegin::Open)
            }
        }
    }

    /// A token was delivered (`deliver(token)` returned): the wait is open,
    /// unless a `resume` came first. O(1).
    pub fn wait_delivered(&self, run_id: &str, epoch: u32, step_id: &str) -> Result<WaitBegin> {
        let id = parse_run_id(run_id).ok_or_else(|| JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        })?;
        self.write(|tx| {
            Self::check_attempt(
                tx,
                &id,
                epoch,
                run_id,
                "the attempt that called the wait is over",
            )?;
            let Some(mut s) = tx
                .step(&id, step_id)
                .cloned()
                .filter(|s| s.kind == StepKind::Wait)
            else {
                return Err(JobError::JobRunState {
                    run_id: run_id.to_owned(),
                    status: "running".to_owned(),
                    detail: format!("wait '{step_id}' was never started"),
                });
            };
            match s.status {
                StepStatus::Completed => Ok(WaitBegin::Done(s.output.clone())),
                StepStatus::Failed => Ok(WaitBegin::Failed(
                    s.output.clone().unwrap_or_else(empty_object),
                )),
                StepStatus::Pending => {
                    s.status = StepStatus::Running;
                    tx.put_step(s);
                    Ok(WaitBegin::Open)
                }
                _ => Ok(WaitBegin::Open),
            }
        })
    }

    /// A signal's or resume's payload as stored: JSON null is no payload;
    /// what the store cannot hold is refused before anything changes.
    fn storable_payload(
        &self,
        payload: Option<Box<RawValue>>,
        what: &str,
    ) -> Result<Option<Box<RawValue>>> {
        let payload = payload.filter(|p| p.get() != "null");
        if let Some(p) = payload
            .as_deref()
            .and_then(|p| self.store.json_problem(p.get()))
        {
            return Err(JobError::invalid(format!(
                "{what} payload cannot be stored: it holds {p}"
            )));
        }
        Ok(payload)
    }

    fn check_signal_name(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(JobError::invalid(
                "a signal name must be a non-empty string",
            ));
        }
        if let Some(p) = self.store.text_problem(name) {
            return Err(JobError::invalid(format!(
                "signal name cannot be stored: it holds {p}"
            )));
        }
        Ok(())
    }

    /// An open wait the handler asks for again after a resumption: resolved
    /// now if its deadline passed (or what it waits for came in a way that
    /// did not resolve it), otherwise open again under this execution.
    fn rejoin_wait(
        &self,
        tx: &mut S::Tx<'_>,
        mut s: StepRow,
        spec: WaitSpec,
        epoch: u32,
        now: Millis,
        fx: &mut Effects,
    ) -> Result<WaitBegin> {
        if wait_over(&spec, now) {
            return Ok(self.expire_wait(tx, s, &spec, now, fx));
        }
        s.epoch = epoch;
        match &spec {
            WaitSpec::Signal { signal, .. } => {
                if let Some(payload) = tx.take_signal(&s.job_run_id, signal) {
                    let payload = Some(payload).filter(|p| p.get() != "null");
                    complete(tx, s, payload.clone(), now);
                    return Ok(WaitBegin::Done(payload));
                }
            }
            WaitSpec::Token { timeout_ms, .. } if s.status == StepStatus::Pending => {
                // Its delivery never finished (the process died in it):
                // deliver a new token, as a step that never finished runs again.
                let token = new_token(&s.job_run_id);
                s.input = Some(
                    WaitSpec::Token {
                        token_hash: token_hash(&token),
                        deadline: spec.deadline(),
                        timeout_ms: *timeout_ms,
                    }
                    .to_raw(),
                );
                tx.put_step(s);
                return Ok(WaitBegin::Token(token));
            }
            WaitSpec::Child { child_run_id, .. } => {
                // Looked at unlocked: the child's end, if it commits
                // meanwhile, waits for this run's lock and then resolves
                // the wait (see `StoreTx::peek_run`).
                if let Some(child) = tx.peek_run(child_run_id).filter(|c| c.status.is_terminal()) {
                    let (status, output) = child_result(child, &s.step_id, &s.job_run_id);
                    finish_wait(tx, s, status, output.clone(), now);
                    return Ok(answer_of(status, output));
                }
            }
            _ => {}
        }
        tx.put_step(s);
        Ok(WaitBegin::Open)
    }

    /// A wait call of an execution that parked already and went on (its
    /// run `waiting`: `RunRow::executes`, the README's late execution)
    /// changed what the run waits for: it opened a wait (`at`: that wait's
    /// deadline), resolved one, or read one resolved since it parked (`at`:
    /// now: it goes on, and only it knows). The run's `wait_deadline`,
    /// all the resumer reads, becomes the earlier of the two, in the
    /// transaction that records the wait. Before, only that execution's
    /// next outcome (a new `Parked`, or its result) moved the run on, and a
    /// process that dies, or stops and exits, before storing it left the
    /// run waiting past that wait's end — for good when the waits of its
    /// last park have no deadline. That outcome still decides when it comes
    /// first (`park_in` recomputes kind and deadline; a result ends the
    /// run); otherwise the resumer resumes the run and the next execution
    /// decides, as after any resolution. A running run is left alone: its
    /// `wait_deadline` is `wake_run`'s marker there. O(1).
    fn arm_late_deadline(
        &self,
        tx: &mut S::Tx<'_>,
        id: &RunId,
        at: Option<Millis>,
        fx: &mut Effects,
    ) {
        let Some(d) = at else { return };
        let earlier = tx.run(id).is_some_and(|r| {
            r.status == RunStatus::Waiting && r.wait_deadline.get().is_none_or(|w| d < w)
        });
        if !earlier {
            return;
        }
        tx.update_run(id, &mut |r| r.wait_deadline = d.into());
        // The timer that resumes deadlines hears of it after the commit,
        // as of a park.
        fx.parked_until = Some(fx.parked_until.map_or(d, |e| e.min(d)));
    }

    /// Resolves a wait whose deadline passed: a sleep completes; any other
    /// wait fails with `JobWaitTimeoutError` (an invoked child still live is
    /// canceled first, with its cascade).
    fn expire_wait(
        &self,
        tx: &mut S::Tx<'_>,
        s: StepRow,
        spec: &WaitSpec,
        now: Millis,
        fx: &mut Effects,
    ) -> WaitBegin {
        if let WaitSpec::Sleep { .. } = spec {
            complete(tx, s, None, now);
            return WaitBegin::Done(None);
        }
        let timeout_ms = spec.timeout_ms().unwrap_or(0);
        let message = format!(
            "wait '{}' of run {} timed out after {timeout_ms}ms",
            s.step_id, s.job_run_id
        );
        let detail = raw_json(json!({
            "name": "JobWaitTimeoutError",
            "message": message,
            "runId": s.job_run_id.to_string(),
            "stepId": &*s.step_id,
            "timeoutMs": timeout_ms,
        }));
        drop(message);
        let s_run = s.job_run_id;
        finish_wait(tx, s, StepStatus::Failed, Some(detail.clone()), now);
        // The step no longer waits: the child's cancel below cannot resolve it.
        // Only the caller's own child: a dedupe hit another run started (and
        // others may wait on) is not the caller's to cancel.
        if let WaitSpec::Child { child_run_id, .. } = spec {
            let caller = s_run;
            let own = tx
                .run(child_run_id)
                .is_some_and(|c| !c.status.is_terminal() && c.parent_run_id() == Some(caller));
            if own {
                let cause = CancelCause::WaitTimedOut(caller);
                self.cancel_tree(tx, *child_run_id, (true, true), cause, now, fx);
            }
        }
        WaitBegin::Failed(detail)
    }

    /// The settle path's `Parked` outcome: the attempt `epoch` is blocked on
    /// its open waits. The run turns `waiting` (kind of its first open
    /// wait, deadline the earliest of theirs), or `pending` at once if none
    /// is open any more or a deadline passed already. Not an attempt: its
    /// count stays. Returns the row, whether it is pending, and the deadline
    /// it waits for (the caller tells the timer after the commit). O(steps).
    pub(super) fn park_in(
        &self,
        tx: &mut S::Tx<'_>,
        run_id: &RunId,
        epoch: u32,
        now: Millis,
    ) -> (Option<RunRow>, bool, Option<Millis>) {
        let open = tx.open_waits(run_id, epoch);
        // A wait resolved while the attempt ran (see `wake_run`). A waiting
        // run parking again (its handler went on) holds its real deadline
        // there: a resolution while it waited made it pending.
        let woken = tx
            .run(run_id)
            .is_some_and(|r| r.status == RunStatus::Running && r.wait_deadline.get().is_some());
        let deadline = open.iter().filter_map(WaitSpec::deadline).min();
        let resume = woken || open.is_empty() || deadline.is_some_and(|d| d <= now);
        let kind = open.first().map(WaitSpec::kind);
        let mut out = None;
        tx.update_run(run_id, &mut |r| {
            if resume {
                r.status = RunStatus::Pending;
                r.run_at = now;
                r.clear_wait();
            } else {
                r.status = RunStatus::Waiting;
                r.wait_kind = kind;
                r.wait_deadline = deadline.into();
            }
            r.claimed_at = OptMillis::NONE;
            r.updated_at = now;
            r.executing = false;
            out = Some(r.clone());
        });
        let attempt = super::attempts::run_attempt(tx, run_id);
        if resume {
            let by = if woken || open.is_empty() {
                "resolved"
            } else {
                "deadline"
            };
            self.note(tx, run_id, EventKind::Resumed, now, attempt, || {
                Some(json!({ "by": by }))
            });
        } else {
            self.note(tx, run_id, EventKind::Waiting, now, attempt, || {
                let mut d = serde_json::Map::new();
                if let Some(k) = kind {
                    d.insert("wait".into(), k.as_str().into());
                }
                if let Some(at) = deadline {
                    d.insert("deadline".into(), at.into());
                }
                Some(serde_json::Value::Object(d))
            });
        }
        (out, resume, deadline.filter(|_| !resume))
    }

    /// A wait of `id` resolved: a waiting run turns pending, due now. A
    /// running one may be about to park on its other waits without having
    /// seen this one resolve (its answer was "open"): its `wait_deadline`
    /// is set to now, which `park_in` reads as "a wait resolved while the
    /// attempt ran: resume at once" (a running run has no deadline
    /// otherwise; the deadline index holds waiting runs only).
    /// `by` names what resolved it (`signal`, `token`, `child`), and
    /// `step` which wait, for the timeline.
    fn wake_run(
        &self,
        tx: &mut S::Tx<'_>,
        (id, by, step): (&RunId, &str, &str),
        now: Millis,
        fx: &mut Effects,
    ) {
        match tx.run(id).map(|r| r.status) {
            Some(RunStatus::Waiting) => {
                // Not before the run's last change: a child's end stored
                // after its handler ended (a networked worker) resolves the
                // wait at that end, which may come before this run parked.
                let at = tx.run(id).map_or(now, |r| now.max(r.updated_at));
                tx.update_run(id, &mut |r| r.resume_now(at));
                fx.wake = true;
                let attempt = super::attempts::run_attempt(tx, id);
                self.note(tx, id, EventKind::Resumed, at, attempt, || {
                    Some(json!({ "by": by, "stepId": step }))
                });
            }
            Some(RunStatus::Running) => tx.update_run(id, &mut |r| r.wait_deadline = now.into()),
            _ => {}
        }
    }

    /// Sends a signal to a run: it resolves the run's oldest open wait for
    /// `name` (resuming the run if it waits) and answers `true`, or it goes
    /// to the run's inbox for a later wait (FIFO per name, at most
    /// [`MAX_INBOX`]) and answers `false`. O(steps of the run).
    pub fn signal(
        &self,
        run_id: &str,
        name: &str,
        payload: Option<Box<RawValue>>,
        tenant: &TenantArg,
    ) -> Result<bool> {
        let filter = self.gate("signal", tenant)?;
        let not_found = || JobError::JobRunNotFound {
            run_id: run_id.to_owned(),
        };
        let id = parse_run_id(run_id).ok_or_else(not_found)?;
        self.check_signal_name(name)?;
        let payload = self.storable_payload(payload, "signal")?;
        let now = self.now();
        let mut fx = Effects::default();
        let delivered = self.write(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| Self::visible(&filter, r))
                .ok_or_else(not_found)?;
            if run.status.is_terminal() {
                return Err(JobError::JobRunState {
                    run_id: run_id.to_owned(),
                    status: run.status.to_string(),
                    detail: "a run that ended takes no signal".to_owned(),
                });
            }
            let waiting = tx.steps(&id).into_iter().find(|s| {
                s.is_open_wait()
                    && matches!(WaitSpec::of_step(s), Some(WaitSpec::Signal { signal, deadline, .. })
                        if signal == name && deadline.is_none_or(|d| d > now))
            });
            match waiting {
                Some(s) => {
                    let step = s.step_id.clone();
                    complete(tx, s, payload.clone(), now);
                    self.wake_run(tx, (&id, "signal", &step), now, &mut fx);
                    Ok(true)
                }
                None => {
                    if tx.inbox_len(&id) >= MAX_INBOX {
                        return Err(JobError::invalid(format!(
                            "run {run_id} holds {MAX_INBOX} signals no wait took: its inbox is full"
                        )));
                    }
                    let stored = payload.clone().unwrap_or_else(|| raw_json(serde_json::Value::Null));
                    tx.push_signal(&id, name, stored, now);
                    Ok(false)
                }
            }
        })?;
        let wake = fx.wake;
        self.deliver(fx);
        if wake {
            self.wake_worker();
        }
        Ok(delivered)
    }

    /// Resumes the token wait `token` made with `payload`; answers its run.
    /// A malformed, unknown, used or expired token, or one of another
    /// tenant's run (when `tenant` is given), is `JobResumeToken`, with
    /// nothing changed. O(steps of the run).
    pub fn resume(
        &self,
        token: &str,
        payload: Option<Box<RawValue>>,
        tenant: &TenantArg,
    ) -> Result<RunId> {
        self.resume_run(token, payload, tenant, None)
    }

    /// `resume`, and when `run` is given the token must be that run's (a
    /// caller that authorized one run, as the dashboard's run page does,
    /// resumes no other): another run's token, or a `run` that is no run id,
    /// is `JobResumeToken`, with nothing changed.
    pub fn resume_run(
        &self,
        token: &str,
        payload: Option<Box<RawValue>>,
        tenant: &TenantArg,
        run: Option<&str>,
    ) -> Result<RunId> {
        let id = token_run(token).ok_or_else(|| bad_token("not a resume token"))?;
        if run.is_some_and(|r| r.parse::<RunId>().ok() != Some(id)) {
            return Err(bad_token("the token is another run's"));
        }
        let hash = token_hash(token);
        let payload = self.storable_payload(payload, "resume")?;
        let now = self.now();
        let mut fx = Effects::default();
        self.write(|tx| {
            let run = tx
                .run(&id)
                .filter(|r| match tenant {
                    // Single-tenant: a tenant argument means nothing, as elsewhere.
                    _ if !self.multi_tenant => true,
                    TenantArg::Missing => true,
                    TenantArg::Null => r.tenant_id.is_none(),
                    TenantArg::Id(t) => r.tenant_id.as_deref() == Some(t.as_str()),
                })
                .ok_or_else(|| bad_token("unknown token"))?;
            let ended = run.status.is_terminal();
            let step = tx
                .steps(&id)
                .into_iter()
                .find(|s| {
                    matches!(WaitSpec::of_step(s), Some(WaitSpec::Token { token_hash, .. }) if token_hash == hash)
                })
                .ok_or_else(|| bad_token("unknown token"))?;
            if !step.is_open_wait() {
                return Err(bad_token("the token was used already or its wait ended"));
            }
            if ended {
                return Err(bad_token("the token's run has ended"));
            }
            if WaitSpec::of_step(&step)
                .and_then(|w| w.deadline())
                .is_some_and(|d| d <= now)
            {
                return Err(bad_token("the token expired"));
            }
            let step_id = step.step_id.clone();
            complete(tx, step, payload.clone(), now);
            self.wake_run(tx, (&id, "token", &step_id), now, &mut fx);
            Ok(())
        })?;
        let wake = fx.wake;
        self.deliver(fx);
        if wake {
            self.wake_worker();
        }
        Ok(id)
    }

    /// A run ended: the invoke waits on it resolve (with its output, or
    /// failing with `JobChildFailedError`), and their runs resume; except
    /// the waits of runs in `spared` (a cancel's cascade, which ends them
    /// next). O(waiters) — nothing for a run nobody waits on.
    pub(super) fn resolve_waiters(
        &self,
        tx: &mut S::Tx<'_>,
        child: &RunRow,
        now: Millis,
        fx: &mut Effects,
        spared: Option<&std::collections::HashSet<RunId>>,
    ) {
        for (parent, step_id) in child.awaited_by() {
            if spared.is_some_and(|d| d.contains(parent)) {
                continue;
            }
            let Some(s) = open_child_wait(tx, parent, step_id, child.id, now).cloned() else {
                continue;
            };
            let (status, output) = child_result(child, step_id, parent);
            finish_wait(tx, s, status, output, now);
            self.wake_run(tx, (parent, "child", step_id), now, fx);
        }
    }

    /// Resumes every waiting run whose deadline passed (they turn pending,
    /// due now), and answers how many and when the next deadline falls.
    /// O(log n) per run, in batches of `Store::resume_batch` per transaction.
    pub fn resume_due_waits_then_next(&self) -> Result<(usize, Option<Millis>)> {
        let now = self.now();
        let batch = self.store.resume_batch().max(1);
        let mut resumed = 0;
        let next = loop {
            let (n, more, next) = self.write(|tx| {
                let due = tx.resume_due(now, batch);
                for (id, attempts) in &due {
                    self.note(tx, id, EventKind::Resumed, now, attempts + 1, || {
                        Some(json!({ "by": "deadline" }))
                    });
                }
                let n = due.len();
                let more = n == batch;
                let next = if more { None } else { tx.next_wait_deadline() };
                Ok((n, more, next))
            })?;
            resumed += n;
            if !more {
                break next;
            }
        };
        if resumed > 0 {
            self.wake_worker();
        }
        Ok((resumed, next))
    }
}

impl<S: Store> Engine<S> {
    /// What the worker's timer does: fires due schedules and resumes due
    /// waits; answers when the next schedule fires and when the next wait
    /// deadline falls (apart: a schedule still due is another process's,
    /// a deadline already due is work to do at once).
    pub fn fire_timers_then_next(&self) -> Result<(Option<Millis>, Option<Millis>)> {
        use std::sync::atomic::Ordering::SeqCst;
        // Looking: every park meanwhile wakes the timer again (a park's
        // row may commit after this look read the deadlines).
        self.timer_at.store(i64::MAX, SeqCst);
        let (_, fire) = self.fire_due_schedules_then_next()?;
        let (_, deadline) = self.resume_due_waits_then_next()?;
        Ok((fire, deadline))
    }

    /// The timer says when it wakes next (after `fire_timers_then_next`):
    /// parks with a later deadline need not wake it.
    pub fn timer_sleeps_until(&self, at: Option<Millis>) {
        self.timer_at
            .store(at.unwrap_or(i64::MAX), std::sync::atomic::Ordering::SeqCst);
    }
}

/// Resolves a wait as `status` with `output` (a failed wait's output is
/// what the call throws; its message is the step's error).
fn finish_wait<T: StoreTx>(
    tx: &mut T,
    mut s: StepRow,
    status: StepStatus,
    output: Option<Box<RawValue>>,
    now: Millis,
) {
    s.error = (status == StepStatus::Failed).then(|| {
        let message = output
            .as_deref()
            .and_then(|o| serde_json::from_str::<serde_json::Value>(o.get()).ok())
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_default();
        Box::new(RunError {
            message,
            stack: None,
            retryable: false,
            attempt: s.attempts,
        })
    });
    s.status = status;
    s.output = output;
    s.finished_at = now.into();
    tx.put_step(s);
}

/// The wait `step_id` of `waiter` (an `awaited_by` entry of
/// `child`), if it still waits for `child`'s end at `now`: the waiter live, the
/// step an open invoke of `child`, its deadline not passed. The one test
/// of an entry: `resolve_waiters` answers only these, `waits_on` follows
/// only these, and the others are dropped when an entry is added.
fn open_child_wait<'t, T: StoreTx>(
    tx: &'t T,
    waiter: &RunId,
    step_id: &str,
    child: RunId,
    now: Millis,
) -> Option<&'t StepRow> {
    tx.run(waiter).filter(|w| !w.status.is_terminal())?;
    tx.step(waiter, step_id).filter(|s| {
        s.is_open_wait()
            && matches!(WaitSpec::of_step(s), Some(WaitSpec::Child { child_run_id, deadline, .. })
                if child_run_id == child && deadline.is_none_or(|d| d > now))
    })
}

/// Whether `run` waits, through open invokes, for `target` at `now`:
/// `target`'s end resolves a wait of `run`, or of a run whose end resolves
/// one of `run`'s, and so on. Walks the runs waiting for `target`
/// (`awaited_by`), each edge counted only while it holds as
/// `resolve_waiters` would honour it: the waiter live, its wait step open
/// on that run, its deadline not passed. O(runs that ever waited on it,
/// however indirectly); asked only of a dedupe hit.
pub(super) fn waits_on<T: StoreTx>(tx: &T, run: RunId, target: RunId, now: Millis) -> bool {
    let mut seen = std::collections::HashSet::from([target]);
    let mut next = vec![target];
    while let Some(awaited) = next.pop() {
        let Some(r) = tx.run(&awaited) else { continue };
        for (waiter, step_id) in r.awaited_by() {
            if open_child_wait(tx, waiter, step_id, awaited, now).is_none() || !seen.insert(*waiter)
            {
                continue;
            }
            if *waiter == run {
                return true;
            }
            next.push(*waiter);
        }
    }
    false
}

/// What the memoized calls of a claimed run's next execution (its
/// attempt `attempt`) answer, for the ticket: every completed step and
/// wait, which `step_begin` and `wait_begin` answer with its output
/// whatever the attempt (a completed step never changes until a replay,
/// which starts a new attempt); and every sleep whose time has come, which
/// is completed here as `rejoin_wait` would complete it when the rerun asks
/// again. O(steps of the run); nothing for a store that has no steps at
/// hand (`StoreTx::steps_at_hand`).
pub(super) fn claim_memo<T: StoreTx>(
    tx: &mut T,
    run: &RunId,
    attempt: u32,
    now: Millis,
) -> Vec<MemoStep> {
    let mut memo = Vec::new();
    let mut slept = Vec::new();
    tx.steps_at_hand(run, &mut |s| {
        if s.status == StepStatus::Completed {
            memo.push(MemoStep {
                step_id: s.step_id.clone(),
                wait: s.kind == StepKind::Wait,
                output: s.output.clone(),
            });
        } else if s.is_open_wait()
            && matches!(WaitSpec::of_step(s), Some(spec @ WaitSpec::Sleep { .. }) if wait_over(&spec, now))
        {
            slept.push(s.clone());
        }
    });
    for mut s in slept {
        memo.push(MemoStep {
            step_id: s.step_id.clone(),
            wait: true,
            output: None,
        });
        s.attempts = attempt;
        complete(tx, s, None, now);
    }
    memo
}

/// A wait's deadline has come (a sleep's is its `until`): it resolves
/// (`expire_wait`) whenever it is next looked at.
fn wait_over(spec: &WaitSpec, now: Millis) -> bool {
    spec.deadline().is_some_and(|d| d <= now)
}

/// Completes a wait with `value`.
fn complete<T: StoreTx>(tx: &mut T, mut s: StepRow, value: Option<Box<RawValue>>, now: Millis) {
    s.status = StepStatus::Completed;
    s.output = value;
    s.error = None;
    s.finished_at = now.into();
    tx.put_step(s);
}

/// The answer of a wait resolved as `status` with `output`.
fn answer_of(status: StepStatus, output: Option<Box<RawValue>>) -> WaitBegin {
    match status {
        StepStatus::Completed => WaitBegin::Done(output),
        _ => WaitBegin::Failed(output.unwrap_or_else(empty_object)),
    }
}

/// What an invoke wait on an ended `child` answers: its output, or the
/// `JobChildFailedError` the call throws.
fn child_result(
    child: &RunRow,
    step_id: &str,
    parent: &RunId,
) -> (StepStatus, Option<Box<RawValue>>) {
    if child.status == RunStatus::Completed {
        return (StepStatus::Completed, child.output().map(|o| o.to_owned()));
    }
    let error = child
        .error()
        .and_then(|e| serde_json::to_value(e).ok())
        .unwrap_or(serde_json::Value::Null);
    let detail = json!({
        "name": "JobChildFailedError",
        "message": format!(
            "child run {} of wait '{step_id}' (run {parent}) ended '{}'",
            child.id, child.status
        ),
        "childRunId": child.id.to_string(),
        "status": child.status.as_str(),
        "error": error,
    });
    (StepStatus::Failed, Some(raw_json(detail)))
}

/// The token's hash, for tests of what the store keeps.
pub fn resume_token_hash(token: &str) -> String {
    token_hash(token)
}
