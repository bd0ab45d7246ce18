//! The PostgreSQL store: any number of processes share one database.
//!
//! The engine's rules run unchanged: [`PgStore::transaction`] opens a
//! database transaction on a pooled connection, hands the rule closure a
//! [`PgTx`] whose primitives are SQL, and commits on `Ok` (rolls back on
//! `Err` or on any database error met on the way). Callers run it on a
//! blocking thread, never on the JS thread or a runtime worker.
//!
//! Why the blocking `postgres` client (tokio-postgres underneath) and not
//! sqlx or deadpool: the rules are synchronous closures, so a transaction
//! runs start to end on one blocking thread; the blocking client answers
//! there without a hop to another thread per statement, prepared
//! statements are cached per connection, and LISTEN/NOTIFY comes with it.
//! sqlx's checked macros need a database (or offline data) at build time
//! and bring a second async stack for no gain here.
//!
//! Cross-process rules:
//! - reads inside a mutating transaction lock the row (`FOR UPDATE`), so
//!   a rule decides on the row it then writes;
//! - a concurrency lane and a dedupe key are serialised with a
//!   transaction-scoped advisory lock on their identity before they are
//!   read, so two processes starting the same key queue up (one run, one
//!   collision) and lane positions are handed out in commit order;
//! - claims take the best due rows with `FOR UPDATE SKIP LOCKED`; a lane
//!   member is claimable only when no earlier member is live and none is
//!   running; the resumer takes waiting runs past their deadline the same
//!   way, so two processes never resume one run;
//! - a claimed run's `claimed_at` is its lease: the worker renews it
//!   ([`PgStore::heartbeat`]) and [`PgStore::expired_leases`] finds runs
//!   whose worker died;
//! - the statements that sweep many rows and need none in particular (the
//!   lease renewal, the retention purge) skip rows another transaction
//!   holds (`SKIP LOCKED`): never waiting for a lock, they cannot close a
//!   deadlock cycle, and what one skips the next one takes.

use crate::error::{JobError, Result, StoreOutcome};
use crate::model::*;
use crate::store::{OrphanClaim, PageQuery, RunPage, Store, StoreTx, TenantRef, Transition};
use crate::template::KeyTemplate;
use bytes::{BufMut, BytesMut};
use elsa::FrozenMap;
use postgres::types::{FromSql, IsNull, ToSql, Type};
use postgres::{Client, NoTls, Row, Statement};
use serde_json::value::RawValue;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;
use uuid::Uuid;

/// Connection settings of the Postgres backend.
#[derive(Debug, Clone)]
pub struct PgConfig {
    pub url: String,
    /// Schema holding the tables (created by `migrate`). Default `public`.
    pub schema: String,
    /// Pool size. Default 10.
    pub max_connections: usize,
}

impl PgConfig {
    pub fn new(url: impl Into<String>) -> Self {
        PgConfig {
            url: url.into(),
            schema: "public".to_owned(),
            max_connections: 10,
        }
    }
}

/// Whether the error comes from the network (refused, reset, timed out):
/// the server could not be reached, so trying again later may work.
fn caused_by_io(e: &postgres::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Whether the error means the connection is gone, so nothing more can run
/// on it: the client saw it close, the network failed, or the server ended
/// the session (a FATAL: `pg_terminate_backend`, a shutdown, an idle
/// timeout). The client learns of a close only once its connection task
/// reads the end of the stream, which can come after the error reached
/// the caller (a backend ended mid-query): so the error itself is asked.
fn connection_lost(e: &postgres::Error) -> bool {
    e.is_closed()
        || caused_by_io(e)
        || e.as_db_error()
            .is_some_and(|d| matches!(d.severity(), "FATAL" | "PANIC"))
}

/// A statement's failure on a connection that died, before any COMMIT was
/// sent: the server rolls the transaction back, nothing changed, and the
/// call can run again at once on a fresh connection (`Engine::again`).
fn lost(e: postgres::Error) -> JobError {
    JobError::Store {
        message: db_err_text(&e),
        retryable: true,
        outcome: StoreOutcome::Lost,
    }
}

/// The driver's error and its cause (the outer message is terse: "db error").
fn db_err_text(e: &postgres::Error) -> String {
    let mut message = e.to_string();
    if let Some(cause) = std::error::Error::source(e) {
        message.push_str(": ");
        message.push_str(&cause.to_string());
    }
    message
}

fn db_err(e: postgres::Error) -> JobError {
    let retryable = e.code().is_some_and(|c| {
        let c = c.code();
        // serialization_failure, deadlock_detected; connection exceptions;
        // the server shutting down or ending the backend (admin_shutdown,
        // crash_shutdown, cannot_connect_now); read_only_sql_transaction (a
        // primary demoted in a failover: the write goes through once the
        // connection reaches the new primary).
        c == "40001" || c == "40P01" || c == "25006" || c.starts_with("08") || c.starts_with("57P0")
    }) || e.is_closed()
        || caused_by_io(&e);
    let conflict = e
        .code()
        .is_some_and(|c| matches!(c.code(), "40001" | "40P01"));
    let message = db_err_text(&e);
    JobError::Store {
        message,
        retryable,
        outcome: if conflict {
            StoreOutcome::Conflict
        } else {
            StoreOutcome::Unchanged
        },
    }
}

// ── wire types ─────────────────────────────────────────────────────────

/// Epoch milliseconds as `timestamptz` (binary: µs since 2000-01-01).
#[derive(Debug, Clone, Copy)]
struct Ms(Millis);

const PG_EPOCH_MS: i64 = 946_684_800_000;
/// PostgreSQL's timestamptz range (4713 BC .. 294276 AD) in epoch ms.
const PG_MIN_MS: i64 = -210_866_803_200_000;
const PG_MAX_MS: i64 = 9_224_318_016_000_000;

impl ToSql for Ms {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let ms = self.0.clamp(PG_MIN_MS, PG_MAX_MS - 1);
        out.put_i64((ms - PG_EPOCH_MS) * 1000);
        Ok(IsNull::No)
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP
    }
    postgres::types::to_sql_checked!();
}

impl<'a> FromSql<'a> for Ms {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let b: [u8; 8] = raw.try_into()?;
        let micros = i64::from_be_bytes(b);
        Ok(Ms(micros.div_euclid(1000) + PG_EPOCH_MS))
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ || *ty == Type::TIMESTAMP
    }
}

/// JSON text as `jsonb` without re-encoding it.
#[derive(Debug)]
struct Jsonb<'a>(&'a str);

impl ToSql for Jsonb<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        if *ty == Type::JSONB {
            out.put_u8(1);
        }
        out.put_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
    postgres::types::to_sql_checked!();
}

/// A `jsonb` value read back as JSON text.
struct JsonText(Box<RawValue>);

impl<'a> FromSql<'a> for JsonText {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let body = if *ty == Type::JSONB {
            raw.split_first().map(|(_, rest)| rest).unwrap_or(raw)
        } else {
            raw
        };
        let text = std::str::from_utf8(body)?.to_owned();
        Ok(JsonText(RawValue::from_string(text)?))
    }
    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }
}

fn error_json(e: &RunError) -> String {
    let text = serde_json::to_string(e).unwrap_or_else(|_| "null".to_owned());
    if jsonb_problem(&text).is_none() {
        return text;
    }
    // A NUL in a thrown error's message (or stack) cannot go into jsonb:
    // store U+FFFD in its place rather than fail to record the outcome.
    // The engine applies the same rule before an outcome is applied
    // (`Store::storable_text`), so its answers match; this is the backstop
    // for an error written any other way.
    let mut v = serde_json::to_value(e).unwrap_or(serde_json::Value::Null);
    replace_nul(&mut v);
    v.to_string()
}

fn replace_nul(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => nul_to_replacement(s),
        serde_json::Value::Array(a) => a.iter_mut().for_each(replace_nul),
        serde_json::Value::Object(o) => o.values_mut().for_each(replace_nul),
        _ => {}
    }
}

/// The store's rule for a NUL in a text it keeps lossily: U+FFFD in its
/// place (`Store::storable_text`, and what `error_json` writes).
fn nul_to_replacement(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\u{FFFD}");
    }
}

const NUL: &str = "a NUL character (PostgreSQL cannot store it)";
const TOO_LARGE: &str = "more than PostgreSQL's jsonb limit (256 MB)";
/// The largest JSON text written to a `jsonb` column: a value past it is
/// refused by the server, failing the whole transaction (a worker's batch
/// of outcomes with it, again and again).
const JSONB_MAX: usize = 268_435_455;
const LONE_SURROGATE: &str = "a lone surrogate (PostgreSQL cannot store it)";

/// Bytes a value may take in `jsonb` beyond its text, per element or pair:
/// an entry header and a number's binary form. A text of small numbers
/// grows about 6x (`[0,0,…]`: 2 bytes of text, 12 of jsonb per element),
/// a long string hardly at all; the estimate stays above both.
const JSONB_PER_VALUE: usize = 12;

/// Why PostgreSQL's `jsonb` refuses a JSON text, if it does: a `\u0000`
/// escape or an escaped surrogate without its pair (valid JSON text in a
/// Rust string holds neither unescaped), or a size past jsonb's limit,
/// estimated from the text's length and how many values it holds (the
/// binary form, not the text, is what is limited). One pass over the bytes.
pub fn jsonb_problem(json: &str) -> Option<&'static str> {
    if json.len() > JSONB_MAX {
        return Some(TOO_LARGE);
    }
    let mut in_string = false;
    let mut values = 0usize;
    let b = json.as_bytes();
    let hex = |at: usize| -> Option<u32> {
        let s = json.get(at..at + 4)?;
        u32::from_str_radix(s, 16).ok()
    };
    let mut high = false; // the previous escape was a high surrogate
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            if high {
                return Some(LONE_SURROGATE);
            }
            match b[i] {
                b'"' => in_string = !in_string,
                b',' | b':' | b'[' | b'{' if !in_string => values += 1,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b.get(i + 1) != Some(&b'u') {
            if high {
                return Some(LONE_SURROGATE);
            }
            i += 2; // an escaped character, e.g. \\ or \"
            continue;
        }
        let u = hex(i + 2)?;
        i += 6;
        match (high, u) {
            (true, 0xDC00..=0xDFFF) => high = false,
            (true, _) => return Some(LONE_SURROGATE),
            (false, 0) => return Some(NUL),
            (false, 0xD800..=0xDBFF) => high = true,
            (false, 0xDC00..=0xDFFF) => return Some(LONE_SURROGATE),
            _ => {}
        }
    }
    if high {
        return Some(LONE_SURROGATE);
    }
    let estimate = json
        .len()
        .saturating_add(values.saturating_mul(JSONB_PER_VALUE));
    (estimate > JSONB_MAX).then_some(TOO_LARGE)
}

fn parse_error(v: Option<JsonText>) -> Option<Box<RunError>> {
    v.and_then(|j| serde_json::from_str::<RunError>(j.0.get()).ok())
        .map(Box::new)
}

// ── connection pool ────────────────────────────────────────────────────

struct Conn {
    client: Client,
    /// Prepared statements by template (address of the `&'static str`)
    /// and tenant variant.
    stmts: HashMap<(usize, bool), Statement>,
    /// The server's incarnation when this connection was opened
    /// (`SQL_INCARNATION`): a transaction id is only known to name this
    /// connection's transaction while the server has not restarted since.
    incarnation: Arc<str>,
}

/// What changes when the server restarts or reinitialises after a crash:
/// its start time (a restart, a failover to another server) and the
/// checkpointer's (every server process is started again after a crash,
/// the postmaster's start time stays). A transaction id whose WAL was not
/// flushed before a crash is handed out again after it, so `txid_status`
/// of an id from before a restart may answer for another transaction.
const SQL_INCARNATION: &str = "SELECT pg_postmaster_start_time()::text || ' ' || \
    coalesce((SELECT min(backend_start)::text FROM pg_stat_activity \
    WHERE backend_type = 'checkpointer'), '')";

/// The server's incarnation, as `SQL_INCARNATION` says it.
fn incarnation(client: &mut Client) -> std::result::Result<String, postgres::Error> {
    let msgs = client.simple_query(SQL_INCARNATION)?;
    Ok(msgs
        .iter()
        .find_map(|m| match m {
            postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default())
}

struct Pool {
    config: postgres::Config,
    max: usize,
    state: Mutex<PoolState>,
    freed: Condvar,
    /// Connection attempts given up on whose thread still waits for the server.
    stuck: Arc<std::sync::atomic::AtomicUsize>,
}

/// How long a whole connection attempt may take: `connect_timeout` for
/// each address the driver may try (every host in turn, every address of
/// a name), as libpq counts it, so a dead first host still leaves the
/// driver time to fail over to the next.
fn attempt_budget(config: &postgres::Config, limit: Duration) -> Duration {
    use std::net::ToSocketAddrs;
    let addrs = if config.get_hostaddrs().is_empty() {
        config
            .get_hosts()
            .iter()
            .map(|h| match h {
                postgres::config::Host::Tcp(name) => (name.as_str(), 0u16)
                    .to_socket_addrs()
                    .map_or(1, |a| a.count().max(1)),
                #[cfg(unix)]
                postgres::config::Host::Unix(_) => 1,
            })
            .sum()
    } else {
        config.get_hostaddrs().len()
    };
    limit.saturating_mul(u32::try_from(addrs.max(1)).unwrap_or(u32::MAX))
}

/// Opens a connection within `connect_timeout` per address. The driver's
/// own timeout bounds only the TCP connect: a server that accepts and
/// never answers the startup (a proxy with no backend behind it, a stopped
/// server) held the call, and so a JS promise, forever. The attempt runs
/// on a thread of its own, which the driver gives no way to cancel: past
/// the deadline it is left to finish (a connection it still makes is
/// dropped) and counted in `stuck` until it does. While `max` attempts are
/// stuck, calls fail at once rather than start more threads; the count
/// comes down as those connections end (the server answers or closes).
/// A connection attempt's failure. A server that answered and ended the new
/// backend (`57P01`, `pg_terminate_backend` during its startup) is up: the
/// call ran nothing and may run again at once (`Engine::again`); a refused
/// or unanswered attempt is not tried again there (a server that is down
/// would make every call wait for 16 connect timeouts).
fn connect_err(e: postgres::Error) -> JobError {
    if e.code().is_some_and(|c| c.code() == "57P01") {
        lost(e)
    } else {
        db_err(e)
    }
}

fn connect_bounded(
    config: &postgres::Config,
    stuck: &Arc<std::sync::atomic::AtomicUsize>,
    max: usize,
) -> Result<Client> {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::RecvTimeoutError;
    let Some(limit) = config.get_connect_timeout().copied() else {
        return config.connect(NoTls).map_err(connect_err);
    };
    let budget = attempt_budget(config, limit);
    let unanswered = |n: usize| JobError::Store {
        message: format!(
            "the database server did not answer a connection attempt within {} ms \
             ({n} attempt(s) still unanswered)",
            budget.as_millis()
        ),
        retryable: true,
        outcome: StoreOutcome::Unchanged,
    };
    let lost = || JobError::Store {
        message: "a connection attempt ended without a result".to_owned(),
        retryable: true,
        outcome: StoreOutcome::Unchanged,
    };
    let waiting = stuck.load(Ordering::Acquire);
    if waiting >= max {
        return Err(unanswered(waiting));
    }
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Client>>(1);
    let cfg = config.clone();
    let given_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (given_up2, stuck2) = (given_up.clone(), stuck.clone());
    std::thread::Builder::new()
        .name("jobforge-pg-connect".to_owned())
        .spawn(move || {
            // The driver unwraps the building of its runtime (out of file
            // descriptors): that panic must become an error, not a lost
            // result counted as stuck for ever.
            let out =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cfg.connect(NoTls)))
                {
                    Ok(r) => r.map_err(connect_err),
                    Err(_) => Err(JobError::Store {
                        message: "the database driver failed to set up a connection \
                              (out of file descriptors?)"
                            .to_owned(),
                        retryable: true,
                        outcome: StoreOutcome::Unchanged,
                    }),
                };
            // Whoever flips the flag second settles: if the caller gave up
            // first, it counted this attempt as stuck, and it ends here.
            if given_up2.swap(true, Ordering::AcqRel) {
                stuck2.fetch_sub(1, Ordering::AcqRel);
            } else {
                let _ = tx.send(out);
            }
        })
        .map_err(|e| JobError::Store {
            message: format!("could not start a connection thread: {e}"),
            retryable: true,
            outcome: StoreOutcome::Unchanged,
        })?;
    match rx.recv_timeout(budget) {
        Ok(out) => out,
        Err(RecvTimeoutError::Disconnected) => Err(lost()),
        Err(RecvTimeoutError::Timeout) => {
            // Counted before the flag flips, so the thread's decrement can
            // never come first.
            let n = stuck.fetch_add(1, Ordering::AcqRel) + 1;
            if given_up.swap(true, Ordering::AcqRel) {
                // The attempt ended just now; its result is being sent.
                stuck.fetch_sub(1, Ordering::AcqRel);
                return rx.recv().unwrap_or_else(|_| Err(lost()));
            }
            Err(unanswered(n))
        }
    }
}

struct PoolState {
    idle: Vec<Conn>,
    open: usize,
}

struct Lease<'p> {
    pool: &'p Pool,
    conn: Option<Conn>,
}

impl Lease<'_> {
    /// Closes the connection rather than returning it to the pool: it died
    /// (`connection_lost`), though the client may not say so yet, and the
    /// next call must not be handed it.
    fn discard(&mut self) {
        if self.conn.take().is_none() {
            return;
        }
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        st.open -= 1;
        self.pool.freed.notify_one();
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let mut st = self.pool.state.lock().unwrap_or_else(|p| p.into_inner());
        if conn.client.is_closed() {
            st.open -= 1;
        } else {
            st.idle.push(conn);
        }
        self.pool.freed.notify_one();
    }
}

impl Pool {
    fn get(&self) -> Result<Lease<'_>> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = st.idle.pop() {
                return Ok(Lease {
                    pool: self,
                    conn: Some(conn),
                });
            }
            if st.open < self.max {
                st.open += 1;
                drop(st);
                let opened =
                    connect_bounded(&self.config, &self.stuck, self.max).and_then(|mut client| {
                        match incarnation(&mut client) {
                            Ok(incarnation) => Ok((client, incarnation)),
                            // Ended as soon as it opened (a backend killed,
                            // a server going down): the call ran nothing and
                            // may run again on another (`Engine::again`).
                            Err(e) if connection_lost(&e) || client.is_closed() => Err(lost(e)),
                            Err(e) => Err(db_err(e)),
                        }
                    });
                return match opened {
                    Ok((client, incarnation)) => Ok(Lease {
                        pool: self,
                        conn: Some(Conn {
                            client,
                            stmts: HashMap::new(),
                            incarnation: incarnation.into(),
                        }),
                    }),
                    Err(e) => {
                        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                        st.open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let (next, timeout) = self
                .freed
                .wait_timeout(st, Duration::from_secs(30))
                .unwrap_or_else(|p| p.into_inner());
            st = next;
            if timeout.timed_out() && st.idle.is_empty() && st.open >= self.max {
                return Err(JobError::Store {
                    message: "no database connection free after 30 s".to_owned(),
                    retryable: true,
                    outcome: StoreOutcome::Unchanged,
                });
            }
        }
    }

    fn close_idle(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = st.idle.len();
        st.idle.clear();
        st.open -= n;
    }
}

// ── the store ──────────────────────────────────────────────────────────

pub struct PgStore {
    pool: Pool,
    config: PgConfig,
    /// `"schema"`, quoted for SQL.
    schema_sql: String,
    /// LISTEN/NOTIFY channel of this schema.
    channel: String,
    /// The channel as an SQL string literal.
    channel_literal: String,
    /// The channel of run-event transitions (see [`events_channel`]), as an
    /// identifier and as an SQL string literal.
    events_channel: String,
    events_channel_literal: String,
    /// Names this store in the transitions it announces, so its own
    /// listener can leave them out: this process reported them itself.
    origin: String,
    /// Definitions are process-local (each process registers its handlers)
    /// and mirrored to the `job` table; a miss reads the table.
    defs: RwLock<HashMap<Arc<str>, Arc<JobDefinition>>>,
    /// Transactions whose COMMIT outcome stayed unknown and that claimed
    /// runs (see `StoreTx::orphaned_claims`); `orphaned` says whether any is.
    orphans: Mutex<Vec<Orphan>>,
    orphaned: std::sync::atomic::AtomicBool,
}

/// The orphans a transaction took to release, given back to the store
/// unless it commits (`committed`).
struct OrphanGuard<'s> {
    store: &'s PgStore,
    taken: Vec<Orphan>,
}

impl OrphanGuard<'_> {
    fn committed(mut self) {
        self.taken.clear();
    }
}

impl Drop for OrphanGuard<'_> {
    fn drop(&mut self) {
        if !self.taken.is_empty() {
            self.store.keep_orphans(std::mem::take(&mut self.taken));
        }
    }
}

/// A transaction that claimed runs and whose COMMIT's answer was lost, its
/// outcome not read back in time: its id, the server's incarnation it ran
/// in, and its claims.
struct Orphan {
    xid: i64,
    was: Arc<str>,
    claims: Vec<OrphanClaim>,
    /// When it was kept: one still unresolved after `ORPHAN_MAX_AGE` is
    /// left to its lease (long swept by then).
    at: std::time::Instant,
}

const ORPHAN_MAX_AGE: Duration = Duration::from_secs(600);

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

const RUN_COLS: &str = "id, job_type, job_version, parent_run_id, root_run_id, parent_close_policy, \
     scope_entity_type, scope_entity_id, tenant_id, tags, pool, priority, concurrency_key, dedupe_key, \
     status, input, output, error, trigger_source, trigger_ref, run_at, started_at, finished_at, \
     claimed_at, attempts, created_at, updated_at, seq, lane_seq, claim_epoch, executing, \
     wait_kind, wait_deadline, awaited_by";

const STEP_COLS: &str = "id, job_run_id, step_id, seq, status, input, output, error, attempts, \
     started_at, finished_at, epoch, kind";

fn enum_or<T>(v: &str, parse: fn(&str) -> Option<T>, default: T) -> T {
    parse(v).unwrap_or(default)
}

/// A run's `awaited_by` as stored: `[["<run id>", "<step id>"], ...]`, or
/// null when empty (most runs), so a plain run writes no JSON.
fn awaited_json(list: &[(RunId, Box<str>)]) -> Option<String> {
    if list.is_empty() {
        return None;
    }
    serde_json::to_string(list).ok()
}

/// The stored `awaited_by` (see [`awaited_json`]); empty for null or for
/// JSON of another shape (edited by hand), as an unreadable error is none.
fn parse_awaited(v: Option<JsonText>) -> Vec<(RunId, Box<str>)> {
    v.and_then(|j| serde_json::from_str(j.0.get()).ok())
        .unwrap_or_default()
}

fn run_from_row(r: &Row) -> std::result::Result<RunRow, postgres::Error> {
    let tags: Option<JsonText> = r.try_get(9)?;
    let input: Option<JsonText> = r.try_get(15)?;
    let output: Option<JsonText> = r.try_get(16)?;
    let error: Option<JsonText> = r.try_get(17)?;
    let status: &str = r.try_get(14)?;
    let pcp: &str = r.try_get(5)?;
    let trig: &str = r.try_get(18)?;
    let opt_ms = |i: usize| -> std::result::Result<Option<Millis>, postgres::Error> {
        Ok(r.try_get::<_, Option<Ms>>(i)?.map(|m| m.0))
    };
    let boxed = |i: usize| -> std::result::Result<Option<Box<str>>, postgres::Error> {
        Ok(r.try_get::<_, Option<&str>>(i)?.map(Box::from))
    };
    let id: RunId = r.try_get(0)?;
    let root: RunId = r.try_get(4)?;
    let extras = RunExtras {
        parent_run_id: r.try_get(3)?,
        root_run_id: (root != id).then_some(root),
        scope_entity_type: boxed(6)?,
        scope_entity_id: boxed(7)?,
        tags: tags.map(|t| t.0).filter(|t| t.get() != "{}"),
        concurrency_key: boxed(12)?,
        dedupe_key: boxed(13)?,
        trigger_ref: boxed(19)?,
        lane_seq: None,
        awaited_by: parse_awaited(r.try_get(33)?),
    };
    let mut row = RunRow {
        id,
        job_type: Arc::from(r.try_get::<_, &str>(1)?),
        job_version: r.try_get(2)?,
        parent_close_policy: enum_or(pcp, ParentClosePolicy::parse, ParentClosePolicy::Terminate),
        tenant_id: r.try_get::<_, Option<&str>>(8)?.map(Arc::from),
        pool: Arc::from(r.try_get::<_, &str>(10)?),
        priority: r.try_get(11)?,
        status: enum_or(status, RunStatus::parse, RunStatus::Pending),
        input: input.map_or_else(crate::model::empty_object, |j| j.0),
        result: {
            let output = output.map(|j| j.0);
            let error = parse_error(error).map(|e| *e);
            (output.is_some() || error.is_some()).then(|| Box::new(RunResult { output, error }))
        },
        trigger_source: enum_or(trig, TriggerSource::parse, TriggerSource::Manual),
        run_at: r.try_get::<_, Ms>(20)?.0,
        started_at: opt_ms(21)?.into(),
        finished_at: opt_ms(22)?.into(),
        claimed_at: opt_ms(23)?.into(),
        attempts: r.try_get::<_, i32>(24)?.max(0) as u32,
        wait_kind: r.try_get::<_, Option<&str>>(31)?.and_then(WaitKind::parse),
        wait_deadline: opt_ms(32)?.into(),
        extras: extras.boxed(),
        created_at: r.try_get::<_, Ms>(25)?.0,
        updated_at: r.try_get::<_, Ms>(26)?.0,
        seq: r.try_get::<_, i64>(27)?.max(0) as u64,
        claim_epoch: r.try_get::<_, i32>(29)? as u32,
        executing: r.try_get(30)?,
    };
    row.set_lane_seq(r.try_get::<_, i64>(28)?.max(0) as u64);
    Ok(row)
}

fn step_from_row(r: &Row) -> std::result::Result<StepRow, postgres::Error> {
    let status: &str = r.try_get(4)?;
    let input: Option<JsonText> = r.try_get(5)?;
    let output: Option<JsonText> = r.try_get(6)?;
    let error: Option<JsonText> = r.try_get(7)?;
    Ok(StepRow {
        id: r.try_get(0)?,
        job_run_id: r.try_get(1)?,
        step_id: Box::from(r.try_get::<_, &str>(2)?),
        // A kind this version does not know (a database another system
        // wrote) runs as a task.
        kind: StepKind::parse(r.try_get::<_, &str>(12)?).unwrap_or(StepKind::Task),
        seq: r.try_get::<_, i32>(3)?.max(0) as u32,
        status: enum_or(status, StepStatus::parse, StepStatus::Pending),
        input: input.map(|j| j.0),
        output: output.map(|j| j.0),
        error: parse_error(error),
        attempts: r.try_get::<_, i32>(8)?.max(0) as u32,
        started_at: r.try_get::<_, Option<Ms>>(9)?.map(|m| m.0).into(),
        finished_at: r.try_get::<_, Option<Ms>>(10)?.map(|m| m.0).into(),
        epoch: r.try_get::<_, i32>(11)? as u32,
    })
}

fn definition_from_row(r: &Row) -> Option<JobDefinition> {
    let key = |i: usize| -> Option<KeySpec> {
        let t: Option<&str> = r.try_get(i).ok()?;
        match t {
            None => None,
            Some("<fn>") => Some(KeySpec::Function),
            Some(t) => KeyTemplate::parse(t).ok().map(KeySpec::Template),
        }
    };
    let retry: JsonText = r.try_get(4).ok()?;
    Some(JobDefinition {
        job_type: Arc::from(r.try_get::<_, &str>(0).ok()?),
        version: r.try_get(1).ok()?,
        pool: Arc::from(r.try_get::<_, &str>(2).ok()?),
        scope_entity_type: r.try_get(3).ok()?,
        retry_policy: serde_json::from_str(retry.0.get()).unwrap_or_default(),
        timeout_ms: r.try_get(5).ok()?,
        concurrency_key_template: key(6),
        collision_mode: CollisionMode::parse(r.try_get(7).ok()?).unwrap_or(CollisionMode::Queue),
        dedupe_key_template: key(8),
        dedupe_window_ms: r.try_get(9).ok()?,
        priority_default: r.try_get(10).ok()?,
        replay_from: ReplayFrom::parse(r.try_get(11).ok()?).unwrap_or(ReplayFrom::LastCheckpoint),
        created_at: r.try_get::<_, Ms>(12).ok()?.0,
        updated_at: r.try_get::<_, Ms>(13).ok()?.0,
    })
}

/// 64-bit advisory-lock key of a lane or dedupe identity.
fn lock_key(kind: u8, tenant: TenantRef<'_>, a: &str, b: &str) -> i64 {
    // FNV-1a: stable across processes and builds (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &x in bytes {
            h ^= u64::from(x);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    feed(&[kind]);
    match tenant {
        Some(t) => feed(t.as_bytes()),
        None => feed(&[0, 0]),
    }
    feed(a.as_bytes());
    feed(b.as_bytes());
    h as i64
}

impl PgStore {
    /// Connects lazily: the first transaction opens the first connection.
    pub fn new(config: PgConfig) -> Result<Self> {
        let mut pg: postgres::Config = config.url.parse().map_err(|e: postgres::Error| {
            JobError::invalid(format!(
                "postgres.url is not a valid connection string: {e}"
            ))
        })?;
        if config.schema.is_empty() {
            return Err(JobError::invalid(
                "postgres.schema must be a non-empty string",
            ));
        }
        // Names the connections in `pg_stat_activity` (which store, which
        // schema) unless the URL already names them.
        if pg.get_application_name().is_none() {
            pg.application_name(&format!("jobforge:{}", config.schema));
        }
        // A server that vanished without closing the connection (a crashed
        // host, a NAT or load balancer dropping an idle flow) would leave a
        // call waiting on the OS defaults: two hours before the first
        // keepalive probe, many minutes of retransmissions, minutes to give
        // up connecting. Unless the URL sets them: probe after 30 s idle,
        // every 10 s, drop after 3 unanswered; fail a send unacknowledged
        // for 30 s; give a connection attempt 10 s.
        if pg.get_keepalives() && pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
            pg.keepalives_idle(Duration::from_secs(30));
        }
        if pg.get_keepalives_interval().is_none() {
            pg.keepalives_interval(Duration::from_secs(10));
        }
        if pg.get_keepalives_retries().is_none() {
            pg.keepalives_retries(3);
        }
        if pg.get_tcp_user_timeout().is_none() {
            pg.tcp_user_timeout(Duration::from_secs(30));
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(10));
        }
        let schema_sql = quote_ident(&config.schema);
        let channel = wake_channel(&config.schema);
        let events_channel = events_channel(&config.schema);
        let origin = Uuid::new_v4().simple().to_string()[..ORIGIN_LEN].to_owned();
        Ok(PgStore {
            pool: Pool {
                config: pg,
                max: config.max_connections.max(1),
                state: Mutex::new(PoolState {
                    idle: Vec::new(),
                    open: 0,
                }),
                freed: Condvar::new(),
                stuck: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            },
            config,
            schema_sql,
            channel_literal: format!("'{}'", channel.replace('\'', "''")),
            channel,
            events_channel_literal: format!("'{}'", events_channel.replace('\'', "''")),
            events_channel,
            origin,
            defs: RwLock::new(HashMap::new()),
            orphans: Mutex::new(Vec::new()),
            orphaned: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn config(&self) -> &PgConfig {
        &self.config
    }

    /// Closes idle connections (the pool reopens on demand).
    pub fn close(&self) {
        self.pool.close_idle();
    }

    /// Creates or upgrades the schema. Idempotent and safe to run from
    /// several processes at once (serialised by an advisory lock).
    pub fn migrate(&self) -> Result<()> {
        let mut lease = self.pool.get()?;
        let Some(conn) = lease.conn.as_mut() else {
            return Err(JobError::invalid("connection pool is closed"));
        };
        // The schema text names the schema inside a `$jobforge$`-quoted
        // block: a name holding that tag would end the block early.
        if self.config.schema.contains("$jobforge$") {
            return Err(JobError::invalid(
                "postgres.schema cannot contain the text $jobforge$",
            ));
        }
        let ddl = include_str!("schema.sql").replace("{S}", &self.schema_sql);
        // CREATE SCHEMA needs CREATE on the database even when the schema
        // exists (the privilege is checked first): a role that owns a
        // schema a DBA made for it could not migrate. Created only if
        // missing (IF NOT EXISTS still settles a race with another process).
        let exists = conn
            .client
            .query_opt(
                "SELECT 1 FROM pg_namespace WHERE nspname = $1",
                &[&self.config.schema],
            )
            .map_err(db_err)?
            .is_some();
        let create = if exists {
            String::new()
        } else {
            format!("CREATE SCHEMA IF NOT EXISTS {};", self.schema_sql)
        };
        let sql = format!(
            "BEGIN; SELECT pg_advisory_xact_lock({}); {create} {} COMMIT;",
            lock_key(b'm', None, &self.config.schema, ""),
            ddl
        );
        let r = conn.client.batch_execute(&sql).map_err(db_err);
        if r.is_err() {
            let _ = conn.client.batch_execute("ROLLBACK");
        }
        r
    }

    /// Job types stored in the `job` table.
    pub fn stored_job_types(&self) -> Result<Vec<String>> {
        self.read(|tx| {
            let rows = tx.query(SQL_JOB_TYPES, &[], None);
            Ok(rows
                .iter()
                .filter_map(|r| r.try_get::<_, String>(0).ok())
                .collect())
        })
    }

    /// Renews the lease (`claimed_at`) of running runs this process holds.
    pub fn heartbeat(&self, runs: &[(RunId, u32)], now: Millis) -> Result<u64> {
        if runs.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = runs.iter().map(|r| r.0).collect();
        let epochs: Vec<i32> = runs.iter().map(|r| r.1 as i32).collect();
        self.transaction(|tx| {
            let rows = tx.query(SQL_HEARTBEAT, &[&ids, &epochs, &Ms(now)], None);
            Ok(rows.len() as u64)
        })
    }

    /// Of `runs`, the attempts that are no longer running (see
    /// `Coordination::lost_leases`): one primary-key lookup each.
    pub fn lost_leases(&self, runs: &[(RunId, u32)]) -> Result<Vec<(RunId, u32)>> {
        if runs.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = runs.iter().map(|r| r.0).collect();
        let epochs: Vec<i32> = runs.iter().map(|r| r.1 as i32).collect();
        self.read(|tx| {
            let rows = tx.query(SQL_LOST_LEASES, &[&ids, &epochs], None);
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some((
                        r.try_get::<_, Uuid>(0).ok()?,
                        r.try_get::<_, i32>(1).ok()? as u32,
                    ))
                })
                .collect())
        })
    }

    /// Running runs whose lease is older than `lease_ms` (their worker is
    /// gone): `(id, epoch)`, at most `limit`.
    pub fn expired_leases(
        &self,
        now: Millis,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<(RunId, u32)>> {
        self.read(|tx| {
            let rows = tx.query(
                SQL_EXPIRED,
                &[&Ms(now.saturating_sub(lease_ms)), &limit],
                None,
            );
            Ok(rows
                .iter()
                .filter_map(|r| {
                    Some((
                        r.try_get::<_, Uuid>(0).ok()?,
                        r.try_get::<_, i32>(1).ok()? as u32,
                    ))
                })
                .collect())
        })
    }

    /// Blocks the calling thread listening for start notifications until
    /// `keep_going` returns false; calls `on_notify` for each.
    ///
    /// `on_notify` gets `None` for "something may be claimable" and the run
    /// id when a running run was canceled (so the process executing it can
    /// fire its `ctx.signal`).
    pub fn listen(
        &self,
        keep_going: &dyn Fn() -> bool,
        on_listening: &dyn Fn(),
        on_notify: &dyn Fn(Option<(RunId, Option<u32>)>),
    ) -> Result<()> {
        let mut client = connect_bounded(&self.pool.config, &self.pool.stuck, self.pool.max)?;
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(&self.channel)))
            .map_err(db_err)?;
        on_listening();
        while keep_going() {
            let mut n = client.notifications();
            let mut it = n.timeout_iter(Duration::from_millis(200));
            loop {
                match fallible_next(&mut it) {
                    Ok(Some(payload)) => {
                        on_notify(payload.strip_prefix("c:").and_then(parse_stopped))
                    }
                    Ok(None) => break,
                    Err(e) => return Err(db_err(e)),
                }
            }
        }
        Ok(())
    }

    /// Blocks the calling thread listening for other processes' run-event
    /// transitions until `keep_going` returns false (see
    /// `Coordination::listen_transitions`). Its connection is its own, outside
    /// the pool, and closes when this returns.
    pub fn listen_transitions(
        &self,
        keep_going: &dyn Fn() -> bool,
        on_listening: &dyn Fn(),
        on_transitions: &dyn Fn(Vec<Transition>),
    ) -> Result<()> {
        let mut client = connect_bounded(&self.pool.config, &self.pool.stuck, self.pool.max)?;
        client
            .batch_execute(&format!("LISTEN {}", quote_ident(&self.events_channel)))
            .map_err(db_err)?;
        on_listening();
        while keep_going() {
            let mut told = Vec::new();
            let mut n = client.notifications();
            let first = fallible_next(&mut n.timeout_iter(Duration::from_millis(200)));
            match first.map_err(db_err)? {
                Some(payload) => self.read_announcement(&payload, &mut told),
                None => continue,
            }
            // What else has arrived goes in the same batch (one read), up
            // to a bound: under a steady stream the loop must still come
            // back to `keep_going` (a close) and deliver what it has.
            let mut more = n.iter();
            let mut payloads = 1;
            while payloads < MAX_ANNOUNCEMENTS_PER_READ {
                let Some(payload) = fallible_next(&mut more).map_err(db_err)? else {
                    break;
                };
                self.read_announcement(&payload, &mut told);
                payloads += 1;
            }
            // Closed meanwhile: no read on a pool the orchestrator closed.
            if !told.is_empty() && keep_going() {
                on_transitions(told);
            }
        }
        Ok(())
    }

    /// Adds the transitions of one announcement (`<origin> <entry>...`, see
    /// [`announcement_payloads`]) to `told`, unless this store sent it.
    /// Entries that do not parse are skipped.
    fn read_announcement(&self, payload: &str, told: &mut Vec<Transition>) {
        let mut words = payload.split(' ');
        if words.next().is_none_or(|origin| origin == self.origin) {
            return;
        }
        told.extend(words.filter_map(parse_transition));
    }

    /// The notifications a committed transaction sends (`None`: none).
    /// They go out after the commit, in a transaction of their own that
    /// does not wait for its WAL flush. A commit that notifies holds a
    /// cluster-wide lock until its flush, so starts that notified in their
    /// own transaction queued one fsync at a time (20 concurrent starts:
    /// +18–68 % jobs/s and 20–30 % shorter 20k-run enqueues this way,
    /// measured alternating in `bench/pg.js`). The runs are committed
    /// before anyone is woken. A notification that is lost (a crash in
    /// between, a full queue) leaves other workers to their next poll, and
    /// a handler canceled elsewhere to run to its end, whose outcome is
    /// then ignored, as when a listener is reconnecting.
    ///
    /// One statement per notification (a select list holds at most 1,664
    /// entries, fewer than the runs a cascade can stop); the statements of
    /// one query string share one implicit transaction, and so the
    /// setting. Run-event transitions go on the events channel, many to a
    /// notification: one more statement per ~150 transitions, in the same
    /// round trip.
    fn notifications_sql(
        &self,
        notify: bool,
        stopped: &[(RunId, u32)],
        announced: &[Transition],
    ) -> Option<String> {
        if !notify && stopped.is_empty() && announced.is_empty() {
            return None;
        }
        let mut sql = String::from("SELECT set_config('synchronous_commit', 'off', true);");
        if notify {
            sql.push_str(&format!("SELECT pg_notify({}, '');", self.channel_literal));
        }
        for (id, epoch) in stopped {
            sql.push_str(&format!(
                "SELECT pg_notify({}, 'c:{id}:{epoch}');",
                self.channel_literal
            ));
        }
        // Payloads hold hex digits, hyphens, colons, letters and spaces
        // only: no quote to escape.
        for payload in announcement_payloads(&self.origin, announced) {
            sql.push_str(&format!(
                "SELECT pg_notify({}, '{payload}');",
                self.events_channel_literal
            ));
        }
        Some(sql)
    }

    /// Orphans to resolve in a later transaction (`orphaned_claims`).
    fn keep_orphans(&self, orphans: Vec<Orphan>) {
        if let Ok(mut list) = self.orphans.lock() {
            list.extend(orphans);
            self.orphaned
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Whether transaction `xid`, whose COMMIT was sent on a connection
    /// that then died (`cause`), committed: asked of the server
    /// (`txid_status`) on a fresh connection, for at most the connection
    /// timeout (`connect_timeout` per address, as a connection attempt).
    /// A backend ends a COMMIT it began before it acts on a termination,
    /// so the answer is `committed` or `aborted` once that backend is gone
    /// (`in progress` until then). Across a restart (`was`: the server's
    /// incarnation when the transaction's connection opened) the id may
    /// have been handed out again: had this transaction committed, its
    /// commit record would hold the id (not handed out again, so
    /// `committed`); `aborted` or `in progress` then say it did not, and
    /// `committed` proves nothing (`Unknown`). Answers the connection it
    /// asked on (for the notifications a commit owes), or `Unknown` when
    /// no answer came in time.
    fn commit_outcome(
        &self,
        xid: i64,
        was: &str,
        cause: &postgres::Error,
    ) -> Result<(bool, Client)> {
        let limit = self
            .pool
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(10));
        let deadline = std::time::Instant::now() + attempt_budget(&self.pool.config, limit);
        let mut why = String::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(self.unknown(cause, limit, &why));
            }
            // This attempt may take only what is left of the budget.
            let mut config = self.pool.config.clone();
            config.connect_timeout(left.max(Duration::from_millis(1)));
            match connect_bounded(&config, &self.pool.stuck, self.pool.max) {
                Ok(mut client) => {
                    let asked = incarnation(&mut client).and_then(|now| {
                        let row = client.query_one("SELECT txid_status($1)", &[&xid])?;
                        Ok((now, row.try_get::<_, Option<String>>(0)?))
                    });
                    match asked {
                        Ok((now, status)) => {
                            let restarted = now != was;
                            match status.as_deref() {
                                Some("aborted") => return Ok((false, client)),
                                Some("in progress") if restarted => return Ok((false, client)),
                                Some("committed") if !restarted => return Ok((true, client)),
                                // Asking again cannot tell.
                                Some("committed") => {
                                    return Err(self.unknown(
                                        cause,
                                        limit,
                                        "the server restarted since, and its id may name \
                                         another transaction",
                                    ))
                                }
                                s => why = format!("its status was {s:?}"),
                            }
                        }
                        Err(e) => why = db_err_text(&e),
                    }
                }
                Err(e) => why = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(5).min(left));
        }
    }

    /// A COMMIT whose outcome could not be read back.
    fn unknown(&self, cause: &postgres::Error, limit: Duration, why: &str) -> JobError {
        JobError::Store {
            message: format!(
                "the connection died during COMMIT ({}), and whether it committed \
                 could not be read back within {} ms: {why}",
                db_err_text(cause),
                limit.as_millis()
            ),
            retryable: false,
            outcome: StoreOutcome::Unknown,
        }
    }

    /// One transaction (`lock`) or one autocommit read on a pooled
    /// connection. `dead`: set when the call failed because the connection
    /// is gone (`connection_lost`: the server ended it — restart, failover,
    /// `pg_terminate_backend`, an idle timeout — while it sat in the pool or
    /// mid-query, or the network failed); the pool only learns that by
    /// using it, and the connection is then closed, not pooled again.
    fn run_tx<R>(
        &self,
        lock: bool,
        dead: &mut bool,
        f: impl FnOnce(&mut PgTx<'_>) -> Result<R>,
    ) -> Result<R> {
        let mut lease = self.pool.get()?;
        // A read runs its statements in autocommit (read committed either
        // way): no BEGIN/COMMIT round trips. A BEGIN that fails on a dead
        // connection ran nothing, so it is tried again on another one;
        // every connection of the pool may have died at once.
        let mut tries = 0;
        while let (true, Some(conn)) = (lock, lease.conn.as_mut()) {
            match conn.client.batch_execute("BEGIN") {
                Ok(()) => break,
                // The error may be the server's FATAL (a db error) rather
                // than "connection closed": ask the client.
                Err(_) if conn.client.is_closed() && tries <= self.pool.max => {
                    tries += 1;
                    drop(lease); // a closed connection leaves the pool
                    lease = self.pool.get()?;
                }
                Err(e) if connection_lost(&e) => {
                    lease.discard();
                    return Err(lost(e));
                }
                Err(e) => return Err(db_err(e)),
            }
        }
        let Some(conn) = lease.conn.as_mut() else {
            return Err(JobError::invalid("connection pool is closed"));
        };
        let mut tx = PgTx {
            store: self,
            conn: RefCell::new(conn),
            lock,
            runs: FrozenMap::new(),
            locked: RefCell::new(HashSet::new()),
            steps: FrozenMap::new(),
            dirty: RefCell::new(Vec::new()),
            claim_queue: VecDeque::new(),
            claim_hint: 1,
            claim_types: None,
            notify: false,
            stopped_running: Vec::new(),
            announced: Vec::new(),
            failure: RefCell::new(None),
            unwritten: RefCell::new(Vec::new()),
            seqs: VecDeque::new(),
            inserts_hint: 0,
            seq_after_lock: std::cell::Cell::new(false),
            claimed: Vec::new(),
            taken_orphans: Vec::new(),
            events: Vec::new(),
        };
        let out = f(&mut tx);
        tx.flush();
        if out.is_ok() {
            tx.write_events();
        }
        let claimed = std::mem::take(&mut tx.claimed);
        let taken = OrphanGuard {
            store: self,
            taken: std::mem::take(&mut tx.taken_orphans),
        };
        let notify = tx.notify;
        let stopped = std::mem::take(&mut tx.stopped_running);
        let announced = std::mem::take(&mut tx.announced);
        let failure = tx.failure.take();
        let PgTx { conn, .. } = tx;
        let conn = conn.into_inner();
        // A statement met a connection that is gone: it leaves the pool
        // now. A read (changes nothing) may then run again on another.
        let failure = match failure {
            Some(e) if connection_lost(&e) || conn.client.is_closed() => {
                *dead = true;
                lease.discard();
                // No COMMIT was sent: the server rolls the transaction back.
                return Err(lost(e));
            }
            other => other,
        };
        if !lock {
            return match failure {
                Some(e) => Err(db_err(e)),
                None => out,
            };
        }
        match (out, failure) {
            (Ok(v), None) => {
                // The transaction's id, read before the COMMIT is sent:
                // should the connection die before the COMMIT's answer
                // arrives, the outcome is asked of the server by this id
                // (`commit_outcome`). None: it wrote and locked nothing,
                // so committing it or not is the same.
                let xid = match conn.client.simple_query(SQL_XID) {
                    Ok(msgs) => msgs.iter().find_map(|m| match m {
                        postgres::SimpleQueryMessage::Row(r) => {
                            r.get(0).and_then(|x| x.parse::<i64>().ok())
                        }
                        _ => None,
                    }),
                    Err(e) if connection_lost(&e) || conn.client.is_closed() => {
                        *dead = true;
                        lease.discard();
                        return Err(lost(e));
                    }
                    Err(e) => {
                        let _ = conn.client.batch_execute("ROLLBACK");
                        return Err(db_err(e));
                    }
                };
                let notices = self.notifications_sql(notify, &stopped, &announced);
                let was = conn.incarnation.clone();
                match conn.client.batch_execute("COMMIT") {
                    Ok(()) => {}
                    Err(e) if connection_lost(&e) || conn.client.is_closed() => {
                        *dead = true;
                        lease.discard();
                        let Some(xid) = xid else {
                            return Err(lost(e));
                        };
                        let (committed, mut client) = match self.commit_outcome(xid, &was, &e) {
                            Ok(answer) => answer,
                            Err(unknown) => {
                                // Its claims, if it landed, are nobody's:
                                // a later transaction finds out and
                                // releases them (`orphaned_claims`).
                                if !claimed.is_empty() {
                                    self.keep_orphans(vec![Orphan {
                                        xid,
                                        was: was.clone(),
                                        claims: claimed,
                                        at: std::time::Instant::now(),
                                    }]);
                                }
                                return Err(unknown);
                            }
                        };
                        if !committed {
                            return Err(lost(e));
                        }
                        taken.committed();
                        // It landed: the answer is the one it would have had,
                        // and so are the notifications it owes.
                        if let Some(sql) = notices {
                            let _ = client.batch_execute(&sql);
                        }
                        return Ok(v);
                    }
                    // The server refused the commit (a deferred check, a
                    // serialisation failure): it rolled back.
                    Err(e) => return Err(db_err(e)),
                }
                taken.committed();
                if let Some(sql) = notices {
                    let _ = conn.client.batch_execute(&sql);
                }
                Ok(v)
            }
            (Err(e), None) => {
                // A rule that refused, or a store call that failed and
                // answered its error itself (a batched insert, a seq round
                // trip). On a connection that died meanwhile no COMMIT was
                // sent: the server rolls back, and a store failure is then
                // a lost connection that changed nothing (it runs again,
                // `Engine::again`), not a plain rollback.
                let gone = conn.client.is_closed()
                    || match conn.client.batch_execute("ROLLBACK") {
                        Ok(()) => false,
                        Err(re) if connection_lost(&re) || conn.client.is_closed() => true,
                        Err(re) => return Err(db_err(re)),
                    };
                if gone {
                    *dead = true;
                    lease.discard();
                    if let JobError::Store { message, .. } = e {
                        return Err(JobError::Store {
                            message,
                            retryable: true,
                            outcome: StoreOutcome::Lost,
                        });
                    }
                }
                Err(e)
            }
            (_, Some(e)) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                Err(db_err(e))
            }
        }
    }
}

/// Shared by every process on the database: leases, renewals and
/// `LISTEN`/`NOTIFY` (see the methods they call).
impl super::Coordination for PgStore {
    fn shared(&self) -> bool {
        true
    }

    fn inline(&self) -> bool {
        false
    }

    fn connections(&self) -> usize {
        self.config.max_connections
    }

    fn renew_leases(&self, runs: &[(RunId, u32)], now: Millis) -> Result<u64> {
        self.heartbeat(runs, now)
    }

    fn expired_leases(&self, now: Millis, lease_ms: i64, limit: i64) -> Result<Vec<(RunId, u32)>> {
        PgStore::expired_leases(self, now, lease_ms, limit)
    }

    fn lost_leases(&self, runs: &[(RunId, u32)]) -> Result<Vec<(RunId, u32)>> {
        PgStore::lost_leases(self, runs)
    }

    fn listen(
        &self,
        keep_going: &dyn Fn() -> bool,
        on_listening: &dyn Fn(),
        on_change: &dyn Fn(Option<(RunId, Option<u32>)>),
    ) -> Result<()> {
        PgStore::listen(self, keep_going, on_listening, on_change)
    }

    fn listen_transitions(
        &self,
        keep_going: &dyn Fn() -> bool,
        on_listening: &dyn Fn(),
        on_transitions: &dyn Fn(Vec<Transition>),
    ) -> Result<()> {
        PgStore::listen_transitions(self, keep_going, on_listening, on_transitions)
    }
}

impl super::StoreAdmin for PgStore {
    fn migrate(&self) -> Result<()> {
        PgStore::migrate(self)
    }

    fn stored_job_types(&self) -> Result<Vec<String>> {
        PgStore::stored_job_types(self)
    }

    fn close(&self) {
        PgStore::close(self)
    }
}

impl Store for PgStore {
    type Tx<'a> = PgTx<'a>;

    /// Each commit's notification sets every worker claiming while the
    /// next batch is still being written, and the two compete for the
    /// database: 10,000 due together in batches of 5,000 had the first
    /// half resumed 150 ms after the deadline, the second at 560 ms.
    fn resume_batch(&self) -> usize {
        50_000
    }

    fn shared_by_processes(&self) -> bool {
        true
    }

    fn json_problem(&self, json: &str) -> Option<&'static str> {
        jsonb_problem(json)
    }

    fn text_problem(&self, text: &str) -> Option<&'static str> {
        text.contains('\0').then_some(NUL)
    }

    fn storable_text(&self, text: &mut String) {
        nul_to_replacement(text)
    }

    fn transaction<R>(&self, f: impl FnOnce(&mut PgTx<'_>) -> Result<R>) -> Result<R> {
        self.run_tx(true, &mut false, f)
    }

    fn has_orphans(&self) -> bool {
        self.orphaned.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Read-only: rows are not locked, so readers never hold up claims. A
    /// read changes nothing, so one whose connection died (found dead in
    /// the pool, or cut off mid-query) runs again on another, a fresh one
    /// once the dead are out of the pool (at most once per pooled
    /// connection: every one may have died at once). A write never runs
    /// again here: its outcome may be unknown.
    fn read<R>(&self, f: impl Fn(&mut PgTx<'_>) -> Result<R>) -> Result<R> {
        let mut tries = 0;
        loop {
            let mut dead = false;
            let out = self.run_tx(false, &mut dead, &f);
            if out.is_err() && dead && tries < self.pool.max {
                tries += 1;
                continue;
            }
            return out;
        }
    }
}

/// A cancel notification's `<run id>[:<claim epoch>]` (processes of an
/// earlier version send no epoch).
fn parse_stopped(text: &str) -> Option<(RunId, Option<u32>)> {
    match text.split_once(':') {
        Some((id, epoch)) => Some((id.parse().ok()?, Some(epoch.parse().ok()?))),
        None => Some((text.parse().ok()?, None)),
    }
}

/// The next notification's payload, if one arrives before the timeout
/// (or, for a non-blocking iterator, if one has arrived).
fn fallible_next<I>(it: &mut I) -> std::result::Result<Option<String>, postgres::Error>
where
    I: postgres::fallible_iterator::FallibleIterator<
        Item = postgres::Notification,
        Error = postgres::Error,
    >,
{
    Ok(it.next()?.map(|n| n.payload().to_owned()))
}

// ── run-event announcements ────────────────────────────────────────────
//
// Why a channel of their own rather than the wake-up channel with a prefix:
// a worker's listener takes any payload it does not know for "something may
// be claimable" (older versions on the same schema too), so every finished
// run would wake every idle worker of every process into a claim query; and
// a process that only listens for events would be sent every start's
// wake-up. On their own channel, a connection that does not LISTEN to it is
// sent nothing (the server skips the entry).

/// Characters of the store's origin tag (hex).
const ORIGIN_LEN: usize = 16;

/// Bytes of transitions per notification: PostgreSQL refuses payloads of
/// 8000 bytes or more; an entry is about 45.
const ANNOUNCEMENT_BYTES: usize = 7000;
/// Announcements (each up to ~150 transitions) read back in one batch at
/// most, before the events feed looks at whether it should go on.
const MAX_ANNOUNCEMENTS_PER_READ: usize = 64;

/// The schema's wake-up channel, `jobforge_<schema>`. A channel name holds
/// at most 63 bytes: `LISTEN` cuts a longer one while `pg_notify` refuses
/// it, so a schema of 55 bytes or more would have had workers that no
/// start ever woke (they fell back to polling). Such a schema is named by
/// its hash, as for the events channel.
fn wake_channel(schema: &str) -> String {
    let name = format!("jobforge_{schema}");
    if name.len() <= 63 {
        name
    } else {
        format!("jobforge_#{:016x}", lock_key(b'w', None, schema, "") as u64)
    }
}

/// The schema's run-event channel, `jobforge:events:<schema>`: no schema
/// makes it equal another schema's wake-up channel (`jobforge_<schema>`).
/// A channel name holds at most 63 bytes (longer ones are cut by `LISTEN`
/// and refused by `pg_notify`): a schema too long for that is named by its
/// hash.
fn events_channel(schema: &str) -> String {
    let name = format!("jobforge:events:{schema}");
    if name.len() <= 63 {
        name
    } else {
        format!(
            "jobforge:events:#{:016x}",
            lock_key(b'e', None, schema, "") as u64
        )
    }
}

/// A transition's status as one letter.
fn status_code(status: RunStatus) -> Option<char> {
    Some(match status {
        RunStatus::Completed => 'c',
        RunStatus::Failed => 'f',
        RunStatus::TimedOut => 't',
        RunStatus::Canceled => 'x',
        RunStatus::Pending => 'r',
        RunStatus::Running | RunStatus::Waiting => return None,
    })
}

fn status_of_code(code: &str) -> Option<RunStatus> {
    Some(match code {
        "c" => RunStatus::Completed,
        "f" => RunStatus::Failed,
        "t" => RunStatus::TimedOut,
        "x" => RunStatus::Canceled,
        "r" => RunStatus::Pending,
        _ => return None,
    })
}

/// The payloads announcing `transitions`: `<origin> <id>:<status>:<epoch>:<attempts> ...`,
/// as many to a payload as fit in [`ANNOUNCEMENT_BYTES`].
fn announcement_payloads(origin: &str, transitions: &[Transition]) -> Vec<String> {
    let mut out = Vec::new();
    let mut payload = String::new();
    for t in transitions {
        let Some(code) = status_code(t.status) else {
            continue;
        };
        let entry = format!("{}:{code}:{}:{}", t.run, t.epoch, t.attempts);
        if !payload.is_empty() && payload.len() + 1 + entry.len() > ANNOUNCEMENT_BYTES {
            out.push(std::mem::take(&mut payload));
        }
        if payload.is_empty() {
            payload.push_str(origin);
        }
        payload.push(' ');
        payload.push_str(&entry);
    }
    if !payload.is_empty() {
        out.push(payload);
    }
    out
}

/// One `<id>:<status>:<epoch>:<attempts>` entry of an announcement.
fn parse_transition(entry: &str) -> Option<Transition> {
    let mut parts = entry.split(':');
    let t = Transition {
        run: parts.next()?.parse().ok()?,
        status: status_of_code(parts.next()?)?,
        epoch: parts.next()?.parse().ok()?,
        attempts: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(t)
}

// ── SQL ────────────────────────────────────────────────────────────────
// `{S}` = schema, `{R}` = run columns, `{P}` = step columns,
// `{T}` = tenant predicate on `$1` (two prepared variants: null / value);
// `{TO}` = `tenant_id, ` in the null variant's `ORDER BY`, nothing in the
// other (see `SQL_PAGE_TYPE`).

const SQL_RUN: &str = "SELECT {R} FROM {S}.job_run WHERE id = $1";
const SQL_RUN_LOCK: &str = "SELECT {R} FROM {S}.job_run WHERE id = $1 FOR UPDATE";
const SQL_RUNS: &str = "SELECT {R} FROM {S}.job_run WHERE id = ANY($1)";
const SQL_RUNS_LOCK: &str = "SELECT {R} FROM {S}.job_run WHERE id = ANY($1) ORDER BY id FOR UPDATE";
/// Writes many changed rows in one statement.
const SQL_UPDATE_RUNS: &str = "UPDATE {S}.job_run r SET status=u.status, output=u.output, error=u.error, \
    run_at=u.run_at, started_at=u.started_at, finished_at=u.finished_at, claimed_at=u.claimed_at, \
    attempts=u.attempts, updated_at=u.updated_at, lane_seq=u.lane_seq, claim_epoch=u.claim_epoch, \
    executing=u.executing, priority=u.priority, pool=u.pool, wait_kind=u.wait_kind, \
    wait_deadline=u.wait_deadline, awaited_by=u.awaited_by \
    FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::jsonb[], $5::timestamptz[], $6::timestamptz[], \
    $7::timestamptz[], $8::timestamptz[], $9::int4[], $10::timestamptz[], $11::int8[], $12::int4[], \
    $13::bool[], $14::int4[], $15::text[], $16::text[], $17::timestamptz[], $18::jsonb[]) \
    AS u(id, status, output, error, run_at, started_at, finished_at, claimed_at, attempts, updated_at, \
    lane_seq, claim_epoch, executing, priority, pool, wait_kind, wait_deadline, awaited_by) \
    WHERE r.id = u.id";
const SQL_INSERT_RUN: &str = "INSERT INTO {S}.job_run ({R}) VALUES \
    ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,$21,$22,$23,$24,$25,$26,$27,$28,$29,$30,$31,\
    $32,$33,$34)";
const SQL_UPDATE_RUN: &str = "UPDATE {S}.job_run SET status=$2, output=$3, error=$4, run_at=$5, \
    started_at=$6, finished_at=$7, claimed_at=$8, attempts=$9, updated_at=$10, lane_seq=$11, \
    claim_epoch=$12, executing=$13, priority=$14, pool=$15, wait_kind=$16, wait_deadline=$17, \
    awaited_by=$18 WHERE id = $1";
const SQL_NEXTVAL: &str = "SELECT nextval('{S}.job_run_seq')";
/// `n` values of the sequence in one round trip (the `seq`s of a batch).
const SQL_NEXTVALS: &str = "SELECT nextval('{S}.job_run_seq') FROM generate_series(1, $1::int4)";
/// Many new runs in one statement: one array per column, row `i` of the
/// insert made of element `i` of each.
const SQL_INSERT_RUNS: &str = "INSERT INTO {S}.job_run ({R}) SELECT * FROM unnest($1::uuid[], \
    $2::text[], $3::int4[], $4::uuid[], $5::uuid[], $6::text[], $7::text[], $8::text[], $9::text[], \
    $10::jsonb[], $11::text[], $12::int4[], $13::text[], $14::text[], $15::text[], $16::jsonb[], \
    $17::jsonb[], $18::jsonb[], $19::text[], $20::text[], $21::timestamptz[], $22::timestamptz[], \
    $23::timestamptz[], $24::timestamptz[], $25::int4[], $26::timestamptz[], $27::timestamptz[], \
    $28::int8[], $29::int8[], $30::int4[], $31::bool[], $32::text[], $33::timestamptz[], $34::jsonb[])";
const SQL_LOCK: &str = "SELECT pg_advisory_xact_lock($1)";
const SQL_DEDUPE: &str = "SELECT {R} FROM {S}.job_run WHERE {T} AND job_type = $2 AND dedupe_key = $3 \
    AND created_at > $4 AND status NOT IN ('canceled','failed') ORDER BY created_at DESC, seq DESC LIMIT 1";
const SQL_LANE: &str = "SELECT id FROM {S}.job_run WHERE {T} AND concurrency_key = $2 \
    AND status IN ('pending','running','waiting') ORDER BY lane_seq";
/// Claimable = pending, due, and unkeyed or the head of an idle lane.
const SQL_CLAIMABLE: &str = "SELECT {R} FROM {S}.job_run r WHERE pool = $1 AND status = 'pending' \
    AND run_at <= $2 AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.job_run l \
    WHERE l.concurrency_key = r.concurrency_key AND l.tenant_id IS NOT DISTINCT FROM r.tenant_id \
    AND l.status IN ('pending','running','waiting') AND l.id <> r.id \
    AND (l.lane_seq < r.lane_seq OR l.status = 'running'))) \
    ORDER BY priority DESC, run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED";
const SQL_NEXT_DUE: &str = "SELECT min(run_at) FROM (SELECT run_at FROM {S}.job_run r WHERE pool = $1 \
    AND status = 'pending' AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.job_run l \
    WHERE l.concurrency_key = r.concurrency_key AND l.tenant_id IS NOT DISTINCT FROM r.tenant_id \
    AND l.status IN ('pending','running','waiting') AND l.id <> r.id \
    AND (l.lane_seq < r.lane_seq OR l.status = 'running'))) ORDER BY priority DESC, run_at LIMIT 64) d";
/// `SQL_CLAIMABLE` of the job types `$4` only (a worker: `claim_only`).
/// The claim index is walked past the pending runs of other types.
const SQL_CLAIMABLE_OF: &str = "SELECT {R} FROM {S}.job_run r WHERE pool = $1 AND status = 'pending' \
    AND run_at <= $2 AND job_type = ANY($4) AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.job_run l \
    WHERE l.concurrency_key = r.concurrency_key AND l.tenant_id IS NOT DISTINCT FROM r.tenant_id \
    AND l.status IN ('pending','running','waiting') AND l.id <> r.id \
    AND (l.lane_seq < r.lane_seq OR l.status = 'running'))) \
    ORDER BY priority DESC, run_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED";
/// `SQL_NEXT_DUE` of the job types `$2` only.
const SQL_NEXT_DUE_OF: &str = "SELECT min(run_at) FROM (SELECT run_at FROM {S}.job_run r WHERE pool = $1 \
    AND status = 'pending' AND job_type = ANY($2) AND (concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM {S}.job_run l \
    WHERE l.concurrency_key = r.concurrency_key AND l.tenant_id IS NOT DISTINCT FROM r.tenant_id \
    AND l.status IN ('pending','running','waiting') AND l.id <> r.id \
    AND (l.lane_seq < r.lane_seq OR l.status = 'running'))) ORDER BY priority DESC, run_at LIMIT 64) d";
const SQL_CHILDREN: &str = "SELECT id FROM {S}.job_run WHERE parent_run_id = $1 ORDER BY seq";
const SQL_STEP: &str = "SELECT {P} FROM {S}.job_step WHERE job_run_id = $1 AND step_id = $2";
const SQL_STEPS: &str = "SELECT {P} FROM {S}.job_step WHERE job_run_id = $1 ORDER BY seq";
const SQL_MAX_STEP: &str = "SELECT coalesce(max(seq), 0) FROM {S}.job_step WHERE job_run_id = $1";
const SQL_PUT_STEP: &str = "INSERT INTO {S}.job_step ({P}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13) \
    ON CONFLICT (job_run_id, step_id) DO UPDATE SET id=EXCLUDED.id, seq=EXCLUDED.seq, status=EXCLUDED.status, \
    input=EXCLUDED.input, output=EXCLUDED.output, error=EXCLUDED.error, attempts=EXCLUDED.attempts, \
    started_at=EXCLUDED.started_at, finished_at=EXCLUDED.finished_at, epoch=EXCLUDED.epoch, kind=EXCLUDED.kind";
const SQL_DELETE_STEPS: &str = "DELETE FROM {S}.job_step WHERE job_run_id = $1";
const SQL_DELETE_OPEN_STEPS: &str =
    "DELETE FROM {S}.job_step WHERE job_run_id = $1 AND status <> 'completed'";
/// (Casts: a database made by another system may use `integer` columns.)
const SQL_SCHEDULE: &str = "SELECT name, tenant_id, job_type, input, cron, every_ms, anchor, next_fire_at, \
    last_fired_at, last_run_id, last_error, created_at, updated_at, timezone FROM {S}.job_schedule WHERE {T} AND name = $2";
const SQL_SCHEDULE_LOCK: &str = "SELECT name, tenant_id, job_type, input, cron, every_ms, anchor, next_fire_at, \
    last_fired_at, last_run_id, last_error, created_at, updated_at, timezone FROM {S}.job_schedule WHERE {T} AND name = $2 \
    FOR UPDATE";
const SQL_PARK_SCHEDULE: &str =
    "UPDATE {S}.job_schedule SET next_fire_at = NULL, last_error = $3 WHERE {T} AND name = $2";
const SQL_SCHEDULES: &str = "SELECT name, tenant_id, job_type, input, cron, every_ms, anchor, next_fire_at, \
    last_fired_at, last_run_id, last_error, created_at, updated_at, timezone FROM {S}.job_schedule WHERE {T} ORDER BY name";
const SQL_DUE_SCHEDULES: &str =
    "SELECT name, tenant_id, job_type, input, cron, every_ms, anchor, next_fire_at, \
    last_fired_at, last_run_id, last_error, created_at, updated_at, timezone FROM {S}.job_schedule \
    WHERE next_fire_at <= $1 ORDER BY next_fire_at LIMIT $2 FOR UPDATE SKIP LOCKED";
const SQL_NEXT_SCHEDULE: &str = "SELECT min(next_fire_at) FROM {S}.job_schedule";
const SQL_PUT_SCHEDULE: &str = "INSERT INTO {S}.job_schedule (name, tenant_id, job_type, input, cron, every_ms, \
    anchor, next_fire_at, last_fired_at, last_run_id, last_error, created_at, updated_at, timezone) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
    ON CONFLICT ((tenant_id IS NULL), coalesce(tenant_id, ''), name) DO UPDATE SET \
    job_type = EXCLUDED.job_type, input = EXCLUDED.input, cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, \
    timezone = EXCLUDED.timezone, \
    anchor = EXCLUDED.anchor, next_fire_at = EXCLUDED.next_fire_at, last_fired_at = EXCLUDED.last_fired_at, \
    last_run_id = EXCLUDED.last_run_id, last_error = EXCLUDED.last_error, updated_at = EXCLUDED.updated_at";
const SQL_DELETE_SCHEDULE: &str =
    "DELETE FROM {S}.job_schedule WHERE {T} AND name = $2 RETURNING name";

/// Rows of `(key, status, count)` (the count queries), rows that do not
/// read as such left out.
fn status_counts_of<K>(rows: &[Row], key: impl Fn(&Row) -> Option<K>) -> Vec<(K, RunStatus, u64)> {
    rows.iter()
        .filter_map(|r| {
            let status = RunStatus::parse(r.try_get(1).ok()?)?;
            let n: i64 = r.try_get(2).ok()?;
            Some((key(r)?, status, n.max(0) as u64))
        })
        .collect()
}

fn schedule_from_row(r: &Row) -> Option<ScheduleRow> {
    read_schedule(r).ok()
}

/// A schedule's row, or why this version cannot read it, naming the
/// column (the reason an unreadable row is parked with).
fn read_schedule(r: &Row) -> std::result::Result<ScheduleRow, &'static str> {
    const TIMING: &str =
        "this schedule's row could not be read (cron or every_ms); it no longer fires";
    const CRON: &str = "this schedule's row could not be read (its cron); it no longer fires";
    const ZONE: &str = "this schedule's row could not be read (its timezone); it no longer fires";
    const ONE: &str = "this schedule's row could not be read (it needs exactly one of cron and every_ms); it no longer fires";
    const REST: &str =
        "this schedule's row could not be read (its input or times); it no longer fires";
    let timing = match (
        r.try_get::<_, Option<&str>>(4).map_err(|_| TIMING)?,
        r.try_get::<_, Option<i64>>(5).map_err(|_| TIMING)?,
    ) {
        (Some(c), None) => ScheduleTiming::Cron(
            c.parse().map_err(|_| CRON)?,
            match r.try_get::<_, Option<&str>>(13).map_err(|_| ZONE)? {
                Some(tz) => crate::cron::parse_time_zone(tz).map_err(|_| ZONE)?,
                None => crate::cron::Tz::UTC,
            },
        ),
        (None, Some(ms)) => ScheduleTiming::Every(ms),
        _ => return Err(ONE),
    };
    let rest = || -> Option<ScheduleRow> {
        Some(ScheduleRow {
            name: r.try_get(0).ok()?,
            tenant_id: r.try_get::<_, Option<&str>>(1).ok()?.map(Arc::from),
            job_type: r.try_get(2).ok()?,
            input: r.try_get::<_, JsonText>(3).ok()?.0,
            timing,
            anchor: r.try_get::<_, Ms>(6).ok()?.0,
            next_fire_at: r.try_get::<_, Option<Ms>>(7).ok()?.map(|m| m.0),
            last_fired_at: r.try_get::<_, Option<Ms>>(8).ok()?.map(|m| m.0),
            last_run_id: r.try_get(9).ok()?,
            last_error: r.try_get(10).ok()?,
            created_at: r.try_get::<_, Ms>(11).ok()?.0,
            updated_at: r.try_get::<_, Ms>(12).ok()?.0,
        })
    };
    rest().ok_or(REST)
}

/// The running transaction's id, `NULL` when it has none (it wrote and
/// locked nothing). Not `txid_current()`, which would give one to a
/// transaction that needs none (and so a WAL flush at its commit).
const SQL_XID: &str = "SELECT txid_current_if_assigned()";
/// `txid_status` of an earlier transaction of this process. An id at or past
/// the snapshot's xmax (latest completed + 1) is still running — or, after a
/// crash that lost WAL the incarnation check did not see, never reached —
/// which `txid_status` could refuse with an error: 'in progress' (asked again).
const SQL_TXID_STATUS: &str = "SELECT CASE WHEN $1 < txid_snapshot_xmax(txid_current_snapshot()) \
    THEN txid_status($1) ELSE 'in progress' END";

const SQL_DEF: &str = "SELECT type, version::int4, pool, scope_entity_type, retry_policy, timeout_ms::int8, \
    concurrency_key_template, collision_mode, dedupe_key_template, dedupe_window_ms::int8, priority_default::int4, \
    replay_from, created_at, updated_at FROM {S}.job WHERE type = $1";
const SQL_PUT_DEF: &str = "INSERT INTO {S}.job (type, version, pool, scope_entity_type, retry_policy, \
    timeout_ms, concurrency_key_template, collision_mode, dedupe_key_template, dedupe_window_ms, \
    priority_default, replay_from, created_at, updated_at) VALUES ($1,$2,$3,$4,$5,$6::int8,$7,$8,$9,$10::int8,$11,$12,$13,$14) \
    ON CONFLICT (type) DO UPDATE SET version=EXCLUDED.version, pool=EXCLUDED.pool, \
    scope_entity_type=EXCLUDED.scope_entity_type, retry_policy=EXCLUDED.retry_policy, \
    timeout_ms=EXCLUDED.timeout_ms, concurrency_key_template=EXCLUDED.concurrency_key_template, \
    collision_mode=EXCLUDED.collision_mode, dedupe_key_template=EXCLUDED.dedupe_key_template, \
    dedupe_window_ms=EXCLUDED.dedupe_window_ms, priority_default=EXCLUDED.priority_default, \
    replay_from=EXCLUDED.replay_from, updated_at=EXCLUDED.updated_at";
const SQL_JOB_TYPES: &str = "SELECT type FROM {S}.job ORDER BY type";
/// Deletes up to 1,000 runs past their retention, with their steps and
/// their inboxes (a delete of each in the one statement, by index), and
/// answers how many runs went. Skips rows another transaction holds (see
/// the module docs): a purge that waited deadlocked with transactions that
/// lock terminal rows before their own purge (a cancel's tree walk, a
/// settle of a run canceled meanwhile).
const SQL_PURGE: &str =
    "WITH gone AS (DELETE FROM {S}.job_run WHERE id IN (SELECT id FROM {S}.job_run \
    WHERE finished_at IS NOT NULL AND ((status = 'completed' AND finished_at <= $1) \
    OR (status <> 'completed' AND finished_at <= $2)) LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING id), \
    steps AS (DELETE FROM {S}.job_step WHERE job_run_id IN (SELECT id FROM gone)), \
    signals AS (DELETE FROM {S}.job_signal WHERE run_id IN (SELECT id FROM gone)), \
    events AS (DELETE FROM {S}.job_event WHERE run_id IN (SELECT id FROM gone)) \
    SELECT count(*) FROM gone";
const SQL_SCOPE: &str = "SELECT {R} FROM {S}.job_run WHERE {T} AND scope_entity_type = $2 \
    AND scope_entity_id = $3 ORDER BY seq";
const SQL_COUNTS: &str =
    "SELECT pool, status, count(*) FROM {S}.job_run WHERE {T} GROUP BY pool, status";
/// Each status through its own partial indexes (claims, leases; waits with
/// and without a deadline), so finished runs are never read.
const SQL_LIVE_COUNTS: &str = "SELECT pool, 'pending', count(*) FROM {S}.job_run WHERE status = 'pending' \
    GROUP BY pool UNION ALL SELECT pool, 'running', count(*) FROM {S}.job_run WHERE status = 'running' \
    GROUP BY pool UNION ALL SELECT pool, 'waiting', count(*) FROM (SELECT pool FROM {S}.job_run \
    WHERE status = 'waiting' AND wait_deadline IS NOT NULL UNION ALL SELECT pool FROM {S}.job_run \
    WHERE status = 'waiting' AND wait_deadline IS NULL) w GROUP BY pool ORDER BY 1, 2";
/// The finished index's range, the tenant checked on each row.
const SQL_ENDED: &str =
    "SELECT (floor(extract(epoch FROM finished_at) / 60) * 60000)::int8, status, count(*) \
    FROM {S}.job_run WHERE finished_at >= $2 AND {T} \
    AND status IN ('completed', 'failed', 'timed_out', 'canceled') GROUP BY 1, 2 ORDER BY 1, 2";
/// `job_run_failed_idx` in its order. `tenant_id` leads the `ORDER BY`
/// (one value under `{T}`): a `tenant_id IS NULL` condition is no equality
/// to the planner, which would otherwise sort every failed run of the null
/// tenant instead of reading the index's first entries.
const SQL_FAILED: &str = "SELECT {R} FROM {S}.job_run WHERE {T} AND status = 'failed' \
    ORDER BY tenant_id, finished_at DESC, id DESC LIMIT $2";
/// A page on `job_run_created_idx`, in its order (`tenant_id` leads, as in
/// `SQL_FAILED`). The cursor is always bound (no cursor: past every row),
/// so it is an index condition in a generic plan too, and a deep page
/// starts where it starts instead of filtering the rows before it.
const SQL_PAGE: &str = "SELECT {R} FROM {S}.job_run WHERE {T} AND ($2::text IS NULL OR pool = $2) \
    AND ($3::text[] IS NULL OR status = ANY($3)) AND created_at >= $4 \
    AND (created_at, id) < ($5, $6::uuid) \
    ORDER BY tenant_id, created_at DESC, id DESC LIMIT $7";
/// `SQL_PAGE` with the job type (and pool and status) checked per row,
/// over at most $8 rows of the index (the walk, `PageQuery::budget`): each
/// row says how far into the walk it is and whether the index holds a row
/// after it, and the last row of a walk that used its budget comes out
/// whatever it is (it is where the next page starts). The plan is an index
/// scan under the window and the limits: it reads at most $8 + 1 index
/// rows, and only until the page is full. Pool and status are checked in
/// `hit`, not in the scan's `WHERE`: there, a rare pool or status would
/// make the walk read every row of the tenant between two of its own,
/// however small the budget. The outer `ORDER BY` names only the keys the
/// walk's order does not hold constant (`{TO}`: `tenant_id` leads under
/// `tenant_id IS NULL`, which is no equality to the planner, and not under
/// `tenant_id = $1`): with a constant key in it the planner sorts the
/// whole walk (its budget's rows read every page) instead of reading the
/// index only until the page is full.
const SQL_PAGE_TYPE: &str =
    "SELECT {R}, walked, more, hit FROM (SELECT {R}, (job_type = $9 AND ($2::text IS NULL OR pool = $2) \
    AND ($3::text[] IS NULL OR status = ANY($3))) AS hit, \
    row_number() OVER w AS walked, lead(id) OVER w IS NOT NULL AS more FROM {S}.job_run \
    WHERE {T} AND created_at >= $4 AND (created_at, id) < ($5, $6::uuid) \
    WINDOW w AS (ORDER BY tenant_id, created_at DESC, id DESC) \
    ORDER BY tenant_id, created_at DESC, id DESC LIMIT $8) walk \
    WHERE hit OR (walked = $8 AND more) ORDER BY {TO}created_at DESC, id DESC LIMIT $7";
/// A page of a scope's runs: the walk of `SQL_PAGE_TYPE` over the tenant's
/// runs of the scope in `job_run_scope_page_idx` (its order), pool, status
/// and job type checked per row, at most $11 + 1 index rows read: another
/// tenant's runs of the scope, or a big scope, cost a page nothing.
const SQL_PAGE_SCOPE: &str = "SELECT {R}, walked, more, hit FROM (SELECT {R}, \
    (($2::text IS NULL OR pool = $2) AND ($3::text[] IS NULL OR status = ANY($3)) \
    AND ($10::text IS NULL OR job_type = $10)) AS hit, \
    row_number() OVER w AS walked, lead(id) OVER w IS NOT NULL AS more FROM {S}.job_run \
    WHERE {T} AND scope_entity_type = $8 AND scope_entity_id = $9 \
    AND created_at >= $4 AND (created_at, id) < ($5, $6::uuid) \
    WINDOW w AS (ORDER BY tenant_id, scope_entity_type, scope_entity_id, created_at DESC, id DESC) \
    ORDER BY tenant_id, scope_entity_type, scope_entity_id, created_at DESC, id DESC LIMIT $11) walk \
    WHERE hit OR (walked = $11 AND more) ORDER BY {TO}created_at DESC, id DESC LIMIT $7";
const SQL_PAGE_ROOT: &str = "SELECT {R} FROM {S}.job_run WHERE {T} AND root_run_id = $8 \
    AND ($2::text IS NULL OR pool = $2) AND ($3::text[] IS NULL OR status = ANY($3)) AND created_at >= $4 \
    AND (created_at, id) < ($5, $6::uuid) AND ($9::text IS NULL OR job_type = $9) \
    AND ($10::text IS NULL OR (scope_entity_type = $10 AND scope_entity_id = $11)) \
    ORDER BY created_at DESC, id DESC LIMIT $7";
const SQL_TREE: &str = "SELECT {R} FROM {S}.job_run WHERE root_run_id = $1 ORDER BY seq";
/// The lease is `claimed_at`; the row changed, so `updated_at` moves too.
/// Never waits for a row lock: a row another transaction holds (this
/// process's own settle of that run, a cancel, a sweep) is skipped and
/// renewed by the next beat. Waiting there deadlocked with a settle that
/// locks the same rows in id order (the heartbeat's unnest order is a
/// HashMap's), and a renewal is not worth blocking for.
const SQL_HEARTBEAT: &str =
    "UPDATE {S}.job_run r SET claimed_at = $3, updated_at = GREATEST(r.updated_at, $3) \
    FROM (SELECT j.id FROM {S}.job_run j JOIN unnest($1::uuid[], $2::int4[]) AS h(id, epoch) \
    ON j.id = h.id AND j.claim_epoch = h.epoch WHERE j.status = 'running' ORDER BY j.id \
    FOR UPDATE OF j SKIP LOCKED) AS l WHERE r.id = l.id RETURNING r.id";
/// The resumer: waiting runs past their deadline, earliest first, locked,
/// skipping those another transaction holds (another process resuming
/// them, a signal delivered to them right now). `job_run_wait_deadline_idx`.
const SQL_DUE_WAITS: &str = "SELECT {R} FROM {S}.job_run WHERE status = 'waiting' \
    AND wait_deadline IS NOT NULL AND wait_deadline <= $1 ORDER BY wait_deadline, seq LIMIT $2 \
    FOR UPDATE SKIP LOCKED";
/// The first entry of `job_run_wait_deadline_idx`.
/// `StoreTx::resume_due` in one statement: the fields `RunRow::resume_now`
/// sets, on the due runs no other transaction holds.
const SQL_RESUME_DUE: &str = "WITH due AS (SELECT id FROM {S}.job_run WHERE status = 'waiting' \
    AND wait_deadline IS NOT NULL AND wait_deadline <= $1 ORDER BY wait_deadline, seq LIMIT $2 \
    FOR UPDATE SKIP LOCKED) UPDATE {S}.job_run r SET status = 'pending', run_at = $1, \
    wait_kind = NULL, wait_deadline = NULL, updated_at = $1 FROM due WHERE r.id = due.id RETURNING r.id, r.attempts";
const SQL_INSERT_EVENTS: &str = "INSERT INTO {S}.job_event (run_id, at, kind, attempt, data) \
    SELECT run_id, at, kind, attempt, data FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], \
    $4::int4[], $5::jsonb[]) WITH ORDINALITY AS e(run_id, at, kind, attempt, data, n) ORDER BY n";
/// A page of a run's timeline: the primary key `(run_id, id)` serves it.
const SQL_RUN_EVENTS: &str = "SELECT id, at, kind, attempt, data FROM {S}.job_event \
    WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3";
const SQL_NEXT_WAIT: &str = "SELECT min(wait_deadline) FROM {S}.job_run \
    WHERE status = 'waiting' AND wait_deadline IS NOT NULL";
const SQL_PUSH_SIGNAL: &str =
    "INSERT INTO {S}.job_signal (run_id, name, payload, created_at) VALUES ($1, $2, $3, $4)";
/// The oldest signal of a name, out of the inbox in one statement. The
/// inner `FOR UPDATE` makes a transaction that finds it taken meanwhile
/// go on to the next one rather than answer none (the engine locks the
/// run first anyway, so takes of one run queue up before this).
const SQL_TAKE_SIGNAL: &str = "DELETE FROM {S}.job_signal WHERE run_id = $1 AND name = $2 \
    AND id = (SELECT id FROM {S}.job_signal WHERE run_id = $1 AND name = $2 ORDER BY id LIMIT 1 \
    FOR UPDATE) RETURNING payload";
const SQL_INBOX_LEN: &str = "SELECT count(*) FROM {S}.job_signal WHERE run_id = $1";
const SQL_CLEAR_SIGNALS: &str = "DELETE FROM {S}.job_signal WHERE run_id = $1";
/// Held attempts that are not running attempts any more (the heartbeat's
/// reconciliation): no lock, so a row another transaction holds is read as
/// last committed. `job_run_pkey`.
const SQL_LOST_LEASES: &str = "SELECT h.id, h.epoch FROM unnest($1::uuid[], $2::int4[]) \
    AS h(id, epoch) LEFT JOIN {S}.job_run j ON j.id = h.id \
    WHERE j.id IS NULL OR j.status <> 'running' OR j.claim_epoch <> h.epoch";
const SQL_EXPIRED: &str = "SELECT id, claim_epoch FROM {S}.job_run WHERE status = 'running' \
    AND claimed_at < $1 ORDER BY claimed_at LIMIT $2";

// ── the transaction ────────────────────────────────────────────────────

pub struct PgTx<'a> {
    store: &'a PgStore,
    conn: RefCell<&'a mut Conn>,
    /// Mutating transaction: reads lock their rows.
    lock: bool,
    /// Rows read or written in this transaction (stable addresses, so
    /// reads can hand out references while more rows are loaded).
    runs: FrozenMap<RunId, Box<RunRow>>,
    /// Cached rows read with `FOR UPDATE`.
    locked: RefCell<HashSet<RunId>>,
    steps: FrozenMap<(RunId, String), Box<Option<StepRow>>>,
    /// Rows changed in the cache and not yet written.
    dirty: RefCell<Vec<RunId>>,
    /// Locked claim candidates not yet handed out.
    claim_queue: VecDeque<RunId>,
    claim_hint: usize,
    /// `claim_only`: the job types this transaction's claims may take.
    claim_types: Option<Vec<String>>,
    /// Something became claimable: notify listeners on commit.
    notify: bool,
    /// Running runs this transaction canceled: the process executing them
    /// is told on commit (it fires their `ctx.signal`).
    /// Running attempts this transaction canceled: run, claim epoch.
    stopped_running: Vec<(RunId, u32)>,
    /// Run-event transitions to announce on commit.
    announced: Vec<Transition>,
    failure: RefCell<Option<postgres::Error>>,
    /// Runs inserted in the cache and not yet written: written together,
    /// in one statement, before the next statement that could see them
    /// (every statement but a `seq` draw or an advisory lock) and at
    /// commit, so a batch of starts costs one insert, not one per run.
    unwritten: RefCell<Vec<RunId>>,
    /// `seq`s drawn ahead for the inserts this transaction expects
    /// (`expect_inserts`), ascending.
    seqs: VecDeque<u64>,
    /// Inserts still expected.
    inserts_hint: usize,
    /// A lane lock was taken since the last `seq` draw: the next `seq`
    /// (of a run joining that lane) is drawn fresh, under the lock, so lane
    /// positions follow commit order across processes; the ones drawn
    /// ahead before it are dropped, so `seq`s stay ascending in the
    /// transaction.
    seq_after_lock: std::cell::Cell<bool>,
    /// Runs this transaction claimed (pending → running), kept as orphans
    /// should its outcome stay unknown.
    claimed: Vec<OrphanClaim>,
    /// Orphans this transaction resolved as committed and releases: given
    /// back to the store unless it commits.
    taken_orphans: Vec<Orphan>,
    /// Timeline events recorded and not yet written: written in one
    /// statement at commit (`write_events`).
    events: Vec<RunEvent>,
}

impl PgTx<'_> {
    fn sql(&self, tpl: &'static str, tenant_null: Option<bool>) -> String {
        let (t, order) = match tenant_null {
            Some(true) => ("(tenant_id IS NULL AND $1::text IS NULL)", "tenant_id, "),
            _ => ("tenant_id = $1", ""),
        };
        tpl.replace("{S}", &self.store.schema_sql)
            .replace("{R}", RUN_COLS)
            .replace("{P}", STEP_COLS)
            .replace("{T}", t)
            .replace("{TO}", order)
    }

    fn statement(&self, tpl: &'static str, tenant_null: Option<bool>) -> Option<Statement> {
        let key = (tpl.as_ptr() as usize, tenant_null == Some(true));
        let mut conn = self.conn.borrow_mut();
        if let Some(s) = conn.stmts.get(&key) {
            return Some(s.clone());
        }
        let sql = self.sql(tpl, tenant_null);
        match conn.client.prepare(&sql) {
            Ok(s) => {
                conn.stmts.insert(key, s.clone());
                Some(s)
            }
            Err(e) => {
                self.fail(e);
                None
            }
        }
    }

    fn fail(&self, e: postgres::Error) {
        let mut f = self.failure.borrow_mut();
        if f.is_none() {
            *f = Some(e);
        }
    }

    fn failed(&self) -> bool {
        self.failure.borrow().is_some()
    }

    /// Runs a query; on error records it (the transaction then rolls back)
    /// and returns no rows.
    fn query(
        &self,
        tpl: &'static str,
        params: &[&(dyn ToSql + Sync)],
        tenant_null: Option<bool>,
    ) -> Vec<Row> {
        if self.failed() {
            return Vec::new();
        }
        if !std::ptr::eq(tpl, SQL_NEXTVAL) && !std::ptr::eq(tpl, SQL_NEXTVALS) {
            self.write_inserts();
        }
        let Some(stmt) = self.statement(tpl, tenant_null) else {
            return Vec::new();
        };
        let r = self.conn.borrow_mut().client.query(&stmt, params);
        match r {
            Ok(rows) => rows,
            Err(e) => {
                self.fail(e);
                Vec::new()
            }
        }
    }

    fn exec(&self, tpl: &'static str, params: &[&(dyn ToSql + Sync)]) {
        if self.failed() {
            return;
        }
        if !std::ptr::eq(tpl, SQL_LOCK) {
            self.write_inserts();
        }
        self.exec_now(tpl, params);
    }

    /// `exec` without writing the unwritten inserts first.
    fn exec_now(&self, tpl: &'static str, params: &[&(dyn ToSql + Sync)]) {
        if self.failed() {
            return;
        }
        let Some(stmt) = self.statement(tpl, None) else {
            return;
        };
        let r = self.conn.borrow_mut().client.execute(&stmt, params);
        if let Err(e) = r {
            self.fail(e);
        }
    }

    /// Caches rows read by a query (keeping rows already cached, which may
    /// hold unwritten changes) and returns their ids in query order.
    fn absorb(&self, rows: &[Row], locked: bool) -> Vec<RunId> {
        let mut ids = Vec::with_capacity(rows.len());
        for r in rows {
            match run_from_row(r) {
                Ok(row) => {
                    let id = row.id;
                    if self.runs.get(&id).is_none() {
                        self.runs.insert(id, Box::new(row));
                        if locked {
                            self.locked.borrow_mut().insert(id);
                        }
                    }
                    ids.push(id);
                }
                Err(e) => self.fail(e),
            }
        }
        ids
    }

    fn load(&self, id: &RunId) -> Option<&RunRow> {
        if let Some(r) = self.runs.get(id) {
            return Some(r);
        }
        let tpl = if self.lock { SQL_RUN_LOCK } else { SQL_RUN };
        let rows = self.query(tpl, &[id], None);
        self.absorb(&rows, self.lock);
        self.runs.get(id)
    }

    /// Makes sure a cached row is locked before it is written.
    fn ensure_locked(&mut self, id: &RunId) {
        if !self.lock || self.locked.borrow().contains(id) {
            return;
        }
        self.flush();
        let rows = self.query(SQL_RUN_LOCK, &[id], None);
        if let Some(Ok(fresh)) = rows.first().map(run_from_row) {
            self.runs.as_mut().insert(*id, Box::new(fresh));
        }
        self.locked.borrow_mut().insert(*id);
    }

    /// Writes the runs inserted in the cache and not yet written, one
    /// statement for all of them (see `unwritten`). Each is written as the
    /// cache holds it now: a change made since its insert (a `replace`
    /// start later in the batch canceling it) goes in with it.
    fn write_inserts(&self) {
        let ids = std::mem::take(&mut *self.unwritten.borrow_mut());
        let rows: Vec<&RunRow> = ids.iter().filter_map(|id| self.runs.get(id)).collect();
        match rows.as_slice() {
            [] => {}
            [row] => self.insert_one(row),
            rows => self.insert_many(rows),
        }
    }

    /// Writes the events recorded so far, in one statement, numbered in
    /// the order they were recorded (`WITH ORDINALITY`): a run's events are
    /// written under its row lock, so numbers ascend in a run's order.
    fn write_events(&mut self) {
        if self.events.is_empty() {
            return;
        }
        let events = std::mem::take(&mut self.events);
        let run: Vec<Uuid> = events.iter().map(|e| e.run).collect();
        let at: Vec<Ms> = events.iter().map(|e| Ms(e.at)).collect();
        let kind: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
        let attempt: Vec<i32> = events
            .iter()
            .map(|e| e.attempt.min(i32::MAX as u32) as i32)
            .collect();
        let data: Vec<Option<Jsonb<'_>>> = events
            .iter()
            .map(|e| e.data.as_deref().map(|d| Jsonb(d.get())))
            .collect();
        self.exec(SQL_INSERT_EVENTS, &[&run, &at, &kind, &attempt, &data]);
    }

    fn insert_one(&self, row: &RunRow) {
        let tags = row.tags().map_or("{}", |t| t.get());
        let error = row.error().map(error_json);
        let attempts = row.attempts as i32;
        let seq = row.seq as i64;
        let lane_seq = row.lane_seq() as i64;
        let epoch = row.claim_epoch as i32;
        let jt: &str = &row.job_type;
        let pool: &str = &row.pool;
        let awaited = awaited_json(row.awaited_by());
        self.exec_now(
            SQL_INSERT_RUN,
            &[
                &row.id,
                &jt,
                &row.job_version,
                &row.parent_run_id(),
                &row.root_run_id(),
                &row.parent_close_policy.as_str(),
                &row.scope_entity_type(),
                &row.scope_entity_id(),
                &row.tenant_id.as_deref(),
                &Jsonb(tags),
                &pool,
                &row.priority,
                &row.concurrency_key(),
                &row.dedupe_key(),
                &row.status.as_str(),
                &Jsonb(row.input.get()),
                &row.output().map(|o| Jsonb(o.get())),
                &error.as_deref().map(Jsonb),
                &row.trigger_source.as_str(),
                &row.trigger_ref(),
                &Ms(row.run_at),
                &row.started_at.get().map(Ms),
                &row.finished_at.get().map(Ms),
                &row.claimed_at.get().map(Ms),
                &attempts,
                &Ms(row.created_at),
                &Ms(row.updated_at),
                &seq,
                &lane_seq,
                &epoch,
                &row.executing,
                &row.wait_kind.map(WaitKind::as_str),
                &row.wait_deadline.get().map(Ms),
                &awaited.as_deref().map(Jsonb),
            ],
        );
    }

    fn insert_many(&self, rows: &[&RunRow]) {
        fn col<'r, T>(rows: &[&'r RunRow], f: impl Fn(&'r RunRow) -> T) -> Vec<T> {
            rows.iter().map(|r| f(r)).collect()
        }
        let error_text = col(rows, |r| r.error().map(error_json));
        let awaited_text = col(rows, |r| awaited_json(r.awaited_by()));
        self.exec_now(
            SQL_INSERT_RUNS,
            &[
                &col(rows, |r| r.id),
                &col(rows, |r| &*r.job_type),
                &col(rows, |r| r.job_version),
                &col(rows, |r| r.parent_run_id()),
                &col(rows, |r| r.root_run_id()),
                &col(rows, |r| r.parent_close_policy.as_str()),
                &col(rows, |r| r.scope_entity_type()),
                &col(rows, |r| r.scope_entity_id()),
                &col(rows, |r| r.tenant_id.as_deref()),
                &col(rows, |r| Jsonb(r.tags().map_or("{}", |t| t.get()))),
                &col(rows, |r| &*r.pool),
                &col(rows, |r| r.priority),
                &col(rows, |r| r.concurrency_key()),
                &col(rows, |r| r.dedupe_key()),
                &col(rows, |r| r.status.as_str()),
                &col(rows, |r| Jsonb(r.input.get())),
                &col(rows, |r| r.output().map(|o| Jsonb(o.get()))),
                &error_text
                    .iter()
                    .map(|e| e.as_deref().map(Jsonb))
                    .collect::<Vec<_>>(),
                &col(rows, |r| r.trigger_source.as_str()),
                &col(rows, |r| r.trigger_ref()),
                &col(rows, |r| Ms(r.run_at)),
                &col(rows, |r| r.started_at.get().map(Ms)),
                &col(rows, |r| r.finished_at.get().map(Ms)),
                &col(rows, |r| r.claimed_at.get().map(Ms)),
                &col(rows, |r| r.attempts as i32),
                &col(rows, |r| Ms(r.created_at)),
                &col(rows, |r| Ms(r.updated_at)),
                &col(rows, |r| r.seq as i64),
                &col(rows, |r| r.lane_seq() as i64),
                &col(rows, |r| r.claim_epoch as i32),
                &col(rows, |r| r.executing),
                &col(rows, |r| r.wait_kind.map(WaitKind::as_str)),
                &col(rows, |r| r.wait_deadline.get().map(Ms)),
                &awaited_text
                    .iter()
                    .map(|a| a.as_deref().map(Jsonb))
                    .collect::<Vec<_>>(),
            ],
        );
    }

    /// Writes changed rows (before any query that could see them, and at
    /// commit), after the unwritten inserts (a changed row may be one).
    fn flush(&self) {
        self.write_inserts();
        if self.dirty.borrow().is_empty() {
            return;
        }
        let dirty = std::mem::take(&mut *self.dirty.borrow_mut());
        if dirty.len() > 1 {
            self.flush_many(&dirty);
            return;
        }
        for id in dirty {
            let Some(r) = self.runs.get(&id) else {
                continue;
            };
            let error = r.error().map(error_json);
            let status = r.status.as_str();
            let attempts = r.attempts as i32;
            let lane_seq = r.lane_seq() as i64;
            let epoch = r.claim_epoch as i32;
            let pool: &str = &r.pool;
            let awaited = awaited_json(r.awaited_by());
            self.exec(
                SQL_UPDATE_RUN,
                &[
                    &r.id,
                    &status,
                    &r.output().map(|o| Jsonb(o.get())),
                    &error.as_deref().map(Jsonb),
                    &Ms(r.run_at),
                    &r.started_at.get().map(Ms),
                    &r.finished_at.get().map(Ms),
                    &r.claimed_at.get().map(Ms),
                    &attempts,
                    &Ms(r.updated_at),
                    &lane_seq,
                    &epoch,
                    &r.executing,
                    &r.priority,
                    &pool,
                    &r.wait_kind.map(WaitKind::as_str),
                    &r.wait_deadline.get().map(Ms),
                    &awaited.as_deref().map(Jsonb),
                ],
            );
        }
    }

    fn flush_many(&self, dirty: &[RunId]) {
        let rows: Vec<&RunRow> = dirty.iter().filter_map(|id| self.runs.get(id)).collect();
        let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
        let status: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
        let output: Vec<Option<Jsonb<'_>>> = rows
            .iter()
            .map(|r| r.output().map(|o| Jsonb(o.get())))
            .collect();
        let error_text: Vec<Option<String>> =
            rows.iter().map(|r| r.error().map(error_json)).collect();
        let error: Vec<Option<Jsonb<'_>>> =
            error_text.iter().map(|e| e.as_deref().map(Jsonb)).collect();
        let run_at: Vec<Ms> = rows.iter().map(|r| Ms(r.run_at)).collect();
        let started: Vec<Option<Ms>> = rows.iter().map(|r| r.started_at.get().map(Ms)).collect();
        let finished: Vec<Option<Ms>> = rows.iter().map(|r| r.finished_at.get().map(Ms)).collect();
        let claimed: Vec<Option<Ms>> = rows.iter().map(|r| r.claimed_at.get().map(Ms)).collect();
        let attempts: Vec<i32> = rows.iter().map(|r| r.attempts as i32).collect();
        let updated: Vec<Ms> = rows.iter().map(|r| Ms(r.updated_at)).collect();
        let lane_seq: Vec<i64> = rows.iter().map(|r| r.lane_seq() as i64).collect();
        let epoch: Vec<i32> = rows.iter().map(|r| r.claim_epoch as i32).collect();
        let executing: Vec<bool> = rows.iter().map(|r| r.executing).collect();
        let priority: Vec<i32> = rows.iter().map(|r| r.priority).collect();
        let pool: Vec<&str> = rows.iter().map(|r| &*r.pool).collect();
        let wait_kind: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.wait_kind.map(WaitKind::as_str))
            .collect();
        let wait_deadline: Vec<Option<Ms>> =
            rows.iter().map(|r| r.wait_deadline.get().map(Ms)).collect();
        let awaited_text: Vec<Option<String>> =
            rows.iter().map(|r| awaited_json(r.awaited_by())).collect();
        let awaited: Vec<Option<Jsonb<'_>>> = awaited_text
            .iter()
            .map(|a| a.as_deref().map(Jsonb))
            .collect();
        self.exec(
            SQL_UPDATE_RUNS,
            &[
                &ids,
                &status,
                &output,
                &error,
                &run_at,
                &started,
                &finished,
                &claimed,
                &attempts,
                &updated,
                &lane_seq,
                &epoch,
                &executing,
                &priority,
                &pool,
                &wait_kind,
                &wait_deadline,
                &awaited,
            ],
        );
    }

    fn lock_identity(&mut self, kind: u8, tenant: TenantRef<'_>, a: &str, b: &str) {
        let k = lock_key(kind, tenant, a, b);
        self.exec(SQL_LOCK, &[&k]);
    }

    fn tenant_null(tenant: TenantRef<'_>) -> Option<bool> {
        Some(tenant.is_none())
    }
}

impl StoreTx for PgTx<'_> {
    fn definition(&self, job_type: &str) -> Option<Arc<JobDefinition>> {
        if let Some(d) = self
            .store
            .defs
            .read()
            .ok()
            .and_then(|m| m.get(job_type).cloned())
        {
            return Some(d);
        }
        let rows = self.query(SQL_DEF, &[&job_type], None);
        let def = Arc::new(definition_from_row(rows.first()?)?);
        if let Ok(mut m) = self.store.defs.write() {
            m.insert(def.job_type.clone(), def.clone());
        }
        Some(def)
    }

    fn put_definition(&mut self, def: JobDefinition) -> Arc<JobDefinition> {
        let retry = serde_json::to_string(&def.retry_policy).unwrap_or_else(|_| "{}".to_owned());
        let jt: &str = &def.job_type;
        let pool: &str = &def.pool;
        let ck = def.concurrency_key_template.as_ref().map(|k| k.stored());
        let dk = def.dedupe_key_template.as_ref().map(|k| k.stored());
        self.exec(
            SQL_PUT_DEF,
            &[
                &jt,
                &def.version,
                &pool,
                &def.scope_entity_type,
                &Jsonb(&retry),
                &def.timeout_ms,
                &ck,
                &def.collision_mode.as_str(),
                &dk,
                &def.dedupe_window_ms,
                &def.priority_default,
                &def.replay_from.as_str(),
                &Ms(def.created_at),
                &Ms(def.updated_at),
            ],
        );
        let def = Arc::new(def);
        if let Ok(mut m) = self.store.defs.write() {
            m.insert(def.job_type.clone(), def.clone());
        }
        def
    }

    fn run(&self, id: &RunId) -> Option<&RunRow> {
        self.load(id)
    }

    fn orphaned_claims(&mut self) -> Vec<OrphanClaim> {
        use std::sync::atomic::Ordering;
        if !self.lock || !self.store.orphaned.load(Ordering::SeqCst) {
            return Vec::new();
        }
        let pending = match self.store.orphans.lock() {
            Ok(mut list) => {
                self.store.orphaned.store(false, Ordering::SeqCst);
                std::mem::take(&mut *list)
            }
            Err(_) => return Vec::new(),
        };
        let here = self.conn.borrow().incarnation.clone();
        let (mut out, mut keep) = (Vec::new(), Vec::new());
        for o in pending {
            if o.at.elapsed() > ORPHAN_MAX_AGE {
                continue;
            }
            if o.was != here {
                // Across a restart the id may name another transaction (an
                // id whose WAL was lost is handed out again), so its status
                // proves nothing: the rows decide. `release_orphans_in`
                // releases only a row still exactly as the claim left it
                // (running under its epoch, its claim time to the
                // millisecond, not made executing since); a claim that did
                // not land left no such row, unless another process claimed
                // the same run under the same epoch in the same millisecond
                // (then it runs twice, as after a lost lease).
                out.extend(o.claims.iter().copied());
                self.taken_orphans.push(o);
                continue;
            }
            let rows = self.query(SQL_TXID_STATUS, &[&o.xid], None);
            let status = rows
                .first()
                .and_then(|r| r.try_get::<_, Option<String>>(0).ok())
                .flatten();
            match status.as_deref() {
                Some("committed") => {
                    out.extend(o.claims.iter().map(|c| OrphanClaim { landed: true, ..*c }));
                    self.taken_orphans.push(o);
                }
                // Its backend is still ending it, or the question failed
                // (the connection, most likely): asked again later.
                Some("in progress") => keep.push(o),
                None if self.failed() => keep.push(o),
                // Aborted: it claimed nothing. An id too old to tell, or
                // one the server has not reached (it lost WAL): the lease
                // decides.
                _ => {}
            }
        }
        if !keep.is_empty() {
            self.store.keep_orphans(keep);
        }
        out
    }

    fn peek_run(&self, id: &RunId) -> Option<&RunRow> {
        if let Some(r) = self.runs.get(id) {
            return Some(r);
        }
        let rows = self.query(SQL_RUN, &[id], None);
        self.absorb(&rows, false);
        self.runs.get(id)
    }

    fn insert_run(&mut self, row: RunRow) {
        if row.status == RunStatus::Pending {
            self.notify = true;
        }
        let id = row.id;
        self.runs.as_mut().insert(id, Box::new(row));
        self.locked.borrow_mut().insert(id);
        // Written with the next statement that could see it, or at commit.
        self.unwritten.borrow_mut().push(id);
    }

    fn update_run(&mut self, id: &RunId, f: &mut dyn FnMut(&mut RunRow)) {
        if self.load(id).is_none() {
            return;
        }
        self.ensure_locked(id);
        let Some(row) = self.runs.as_mut().get_mut(id) else {
            return;
        };
        let before_status = row.status;
        let before_lane = row.lane_seq();
        f(row);
        let lane_moved = row.lane_seq() != before_lane;
        let key = row.concurrency_key().map(str::to_owned);
        let tenant = row.tenant_id.clone();
        if before_status == RunStatus::Running && row.status == RunStatus::Canceled {
            self.stopped_running.push((*id, row.claim_epoch));
        }
        if before_status == RunStatus::Pending && row.status == RunStatus::Running {
            self.claimed.push(OrphanClaim {
                run: *id,
                epoch: row.claim_epoch,
                claimed_at: row.claimed_at.get(),
                executing: row.executing,
                landed: false,
            });
        }
        let wakes = (row.status == RunStatus::Pending && before_status != RunStatus::Pending)
            || (row.concurrency_key().is_some()
                && row.status.is_terminal()
                && !before_status.is_terminal());
        if wakes {
            self.notify = true;
        }
        {
            let mut dirty = self.dirty.borrow_mut();
            if !dirty.contains(id) {
                dirty.push(*id);
            }
        }
        // A run rejoining its lane gets its position under the lane lock,
        // so positions are handed out in commit order across processes.
        if lane_moved {
            if let Some(k) = key {
                self.lock_identity(b'l', tenant.as_deref(), &k, "");
                let rows = self.query(SQL_NEXTVAL, &[], None);
                let seq = rows.first().and_then(|r| r.try_get::<_, i64>(0).ok());
                if let (Some(seq), Some(row)) = (seq, self.runs.as_mut().get_mut(id)) {
                    row.set_lane_seq(seq.max(0) as u64);
                }
            }
        }
    }

    fn announce(&mut self, transition: Transition) {
        self.announced.push(transition);
    }

    fn expect_inserts(&mut self, n: usize) {
        self.inserts_hint = n;
    }

    fn next_seq(&mut self) -> u64 {
        self.inserts_hint = self.inserts_hint.saturating_sub(1);
        if self.seq_after_lock.replace(false) {
            self.seqs.clear();
        } else if let Some(seq) = self.seqs.pop_front() {
            return seq;
        } else if self.inserts_hint > 0 {
            // This one and the ones expected after it, in one round trip.
            let n = (self.inserts_hint + 1).min(i32::MAX as usize) as i32;
            let rows = self.query(SQL_NEXTVALS, &[&n], None);
            let mut seqs: Vec<u64> = rows
                .iter()
                .filter_map(|r| r.try_get::<_, i64>(0).ok())
                .map(|v| v.max(0) as u64)
                .collect();
            seqs.sort_unstable();
            self.seqs = seqs.into();
            if let Some(seq) = self.seqs.pop_front() {
                return seq;
            }
            return 0;
        }
        let rows = self.query(SQL_NEXTVAL, &[], None);
        rows.first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .unwrap_or(0)
            .max(0) as u64
    }

    fn find_dedupe(
        &self,
        tenant: TenantRef<'_>,
        job_type: &str,
        dedupe_key: &str,
        created_after: Millis,
    ) -> Option<&RunRow> {
        if self.lock {
            let k = lock_key(b'd', tenant, job_type, dedupe_key);
            self.exec(SQL_LOCK, &[&k]);
        }
        // The changes of this transaction first: a run an earlier start of
        // a group canceled (a `replace`) is no dedupe hit, though the
        // table still says it is live until they are written.
        self.flush();
        let rows = self.query(
            SQL_DEDUPE,
            &[&tenant, &job_type, &dedupe_key, &Ms(created_after)],
            Self::tenant_null(tenant),
        );
        let id = *self.absorb(&rows, false).first()?;
        self.runs.get(&id)
    }

    fn lane(&self, tenant: TenantRef<'_>, key: &str) -> Vec<RunId> {
        if self.lock {
            let k = lock_key(b'l', tenant, key, "");
            self.exec(SQL_LOCK, &[&k]);
            self.seq_after_lock.set(true);
        }
        // As in `find_dedupe`: a run canceled earlier in this transaction
        // has left the lane (it is no incumbent).
        self.flush();
        let rows = self.query(SQL_LANE, &[&tenant, &key], Self::tenant_null(tenant));
        rows.iter()
            .filter_map(|r| r.try_get::<_, Uuid>(0).ok())
            .collect()
    }

    fn prefetch(&mut self, ids: &[RunId]) {
        let missing: Vec<Uuid> = ids
            .iter()
            .filter(|id| self.runs.get(id).is_none())
            .copied()
            .collect();
        if missing.len() < 2 {
            return;
        }
        self.flush();
        let tpl = if self.lock { SQL_RUNS_LOCK } else { SQL_RUNS };
        let rows = self.query(tpl, &[&missing], None);
        self.absorb(&rows, self.lock);
    }

    fn expect_claims(&mut self, n: usize) {
        self.claim_hint = n.clamp(1, 1000);
    }

    fn claim_only(&mut self, types: &[Box<str>]) {
        self.claim_types = Some(types.iter().map(|t| t.to_string()).collect());
    }

    fn next_claimable(&mut self, pool: &str, now: Millis) -> Option<RunId> {
        loop {
            if let Some(id) = self.claim_queue.pop_front() {
                // Still claimable? (a rule may have changed it meanwhile)
                if self
                    .runs
                    .get(&id)
                    .is_some_and(|r| r.status == RunStatus::Pending && &*r.pool == pool)
                {
                    return Some(id);
                }
                continue;
            }
            if self.claim_hint == 0 {
                return None;
            }
            self.flush();
            let limit = self.claim_hint as i64;
            // One fetch per transaction: the rows stay locked until commit.
            self.claim_hint = 0;
            let rows = match &self.claim_types {
                None => self.query(SQL_CLAIMABLE, &[&pool, &Ms(now), &limit], None),
                Some(types) => {
                    self.query(SQL_CLAIMABLE_OF, &[&pool, &Ms(now), &limit, types], None)
                }
            };
            let ids = self.absorb(&rows, true);
            if ids.is_empty() {
                return None;
            }
            self.claim_queue.extend(ids);
        }
    }

    fn next_due(&mut self, pool: &str, _now: Millis) -> Option<Millis> {
        self.flush();
        let rows = match &self.claim_types {
            None => self.query(SQL_NEXT_DUE, &[&pool], None),
            Some(types) => self.query(SQL_NEXT_DUE_OF, &[&pool, types], None),
        };
        rows.first()
            .and_then(|r| r.try_get::<_, Option<Ms>>(0).ok().flatten())
            .map(|m| m.0)
    }

    fn children(&self, id: &RunId) -> Vec<RunId> {
        let rows = self.query(SQL_CHILDREN, &[id], None);
        rows.iter()
            .filter_map(|r| r.try_get::<_, Uuid>(0).ok())
            .collect()
    }

    fn step(&self, run: &RunId, step_id: &str) -> Option<&StepRow> {
        let key = (*run, step_id.to_owned());
        if let Some(s) = self.steps.get(&key) {
            return s.as_ref();
        }
        let rows = self.query(SQL_STEP, &[run, &step_id], None);
        let row = match rows.first().map(step_from_row) {
            Some(Ok(s)) => Some(s),
            Some(Err(e)) => {
                self.fail(e);
                None
            }
            None => None,
        };
        self.steps.insert(key, Box::new(row)).as_ref()
    }

    fn put_step(&mut self, row: StepRow) {
        let error = row.error.as_deref().map(error_json);
        let step_id: &str = &row.step_id;
        let seq = row.seq as i32;
        let attempts = row.attempts as i32;
        let epoch = row.epoch as i32;
        self.exec(
            SQL_PUT_STEP,
            &[
                &row.id,
                &row.job_run_id,
                &step_id,
                &seq,
                &row.status.as_str(),
                &row.input.as_deref().map(|o| Jsonb(o.get())),
                &row.output.as_deref().map(|o| Jsonb(o.get())),
                &error.as_deref().map(Jsonb),
                &attempts,
                &row.started_at.get().map(Ms),
                &row.finished_at.get().map(Ms),
                &epoch,
                &row.kind.as_str(),
            ],
        );
        let key = (row.job_run_id, row.step_id.to_string());
        self.steps.as_mut().insert(key, Box::new(Some(row)));
    }

    fn steps(&self, run: &RunId) -> Vec<StepRow> {
        let rows = self.query(SQL_STEPS, &[run], None);
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            match step_from_row(r) {
                Ok(s) => out.push(s),
                Err(e) => self.fail(e),
            }
        }
        out
    }

    fn max_step_seq(&self, run: &RunId) -> u32 {
        let rows = self.query(SQL_MAX_STEP, &[run], None);
        rows.first()
            .and_then(|r| r.try_get::<_, i32>(0).ok())
            .unwrap_or(0)
            .max(0) as u32
    }

    fn delete_steps(&mut self, run: &RunId, keep_completed: bool) {
        let tpl = if keep_completed {
            SQL_DELETE_OPEN_STEPS
        } else {
            SQL_DELETE_STEPS
        };
        self.exec(tpl, &[run]);
        self.steps.as_mut().retain(|(r, _), _| r != run);
    }

    fn due_waits(&mut self, now: Millis, limit: usize) -> Vec<RunId> {
        // The query must see runs this transaction parked or resumed.
        self.flush();
        let limit = limit as i64;
        let rows = self.query(SQL_DUE_WAITS, &[&Ms(now), &limit], None);
        // Locked until commit: the resumer changes them without another read.
        self.absorb(&rows, true)
    }

    /// One statement however many fall due together (resuming row by row
    /// was measured at ~4 s for 10k runs due at once).
    fn resume_due(&mut self, now: Millis, limit: usize) -> Vec<(RunId, u32)> {
        self.flush();
        let rows = self.query(SQL_RESUME_DUE, &[&Ms(now), &(limit as i64)], None);
        let due: Vec<(RunId, u32)> = rows
            .iter()
            .filter_map(|r| {
                let id = r.try_get::<_, Uuid>(0).ok()?;
                let attempts = r.try_get::<_, i32>(1).ok()?;
                Some((id, attempts.max(0) as u32))
            })
            .collect();
        // A copy of one of them cached earlier in this transaction is stale.
        for (id, _) in &due {
            self.runs.as_mut().remove(id);
        }
        if !due.is_empty() {
            self.notify = true;
        }
        due
    }

    fn next_wait_deadline(&mut self) -> Option<Millis> {
        // Runs resumed in this transaction no longer count.
        self.flush();
        let rows = self.query(SQL_NEXT_WAIT, &[], None);
        rows.first()
            .and_then(|r| r.try_get::<_, Option<Ms>>(0).ok().flatten())
            .map(|m| m.0)
    }

    // The inbox is no run row: its statements run at once, nothing is
    // cached, so they need no flush.
    fn push_signal(&mut self, run: &RunId, name: &str, payload: Box<RawValue>, at: Millis) {
        self.exec(
            SQL_PUSH_SIGNAL,
            &[run, &name, &Jsonb(payload.get()), &Ms(at)],
        );
    }

    fn take_signal(&mut self, run: &RunId, name: &str) -> Option<Box<RawValue>> {
        let rows = self.query(SQL_TAKE_SIGNAL, &[run, &name], None);
        match rows.first()?.try_get::<_, JsonText>(0) {
            Ok(p) => Some(p.0),
            Err(e) => {
                // Taken but unreadable: the transaction must not commit
                // the take.
                self.fail(e);
                None
            }
        }
    }

    fn inbox_len(&self, run: &RunId) -> usize {
        let rows = self.query(SQL_INBOX_LEN, &[run], None);
        rows.first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .unwrap_or(0)
            .max(0) as usize
    }

    fn clear_signals(&mut self, run: &RunId) {
        self.exec(SQL_CLEAR_SIGNALS, &[run]);
    }

    fn record_event(&mut self, event: RunEvent) {
        self.events.push(event);
    }

    fn run_events(&self, run: &RunId, after: u64, limit: usize) -> Vec<RunEvent> {
        let mut after = after.min(i64::MAX as u64) as i64;
        let mut out = Vec::with_capacity(limit.min(512));
        // A kind this version does not know (written by a newer one) is
        // left out of the page, not misnamed; the page is then filled from
        // the rows after it, so a short page still means the last one.
        while out.len() < limit {
            let want = (limit - out.len()).min(i64::MAX as usize) as i64;
            let rows = self.query(SQL_RUN_EVENTS, &[run, &after, &want], None);
            let read_all = (rows.len() as i64) < want;
            for r in &rows {
                let read = || -> std::result::Result<(i64, Option<RunEvent>), postgres::Error> {
                    let id = r.try_get::<_, i64>(0)?;
                    let Some(kind) = EventKind::parse(r.try_get(2)?) else {
                        return Ok((id, None));
                    };
                    Ok((
                        id,
                        Some(RunEvent {
                            id: id.max(0) as u64,
                            run: *run,
                            at: r.try_get::<_, Ms>(1)?.0,
                            kind,
                            attempt: r.try_get::<_, i32>(3)?.max(0) as u32,
                            data: r.try_get::<_, Option<JsonText>>(4)?.map(|j| j.0),
                        }),
                    ))
                };
                match read() {
                    Ok((id, e)) => {
                        after = after.max(id);
                        out.extend(e);
                    }
                    Err(e) => {
                        self.fail(e);
                        return out;
                    }
                }
            }
            if read_all || rows.is_empty() {
                break;
            }
        }
        out
    }

    fn set_retention_tracking(&mut self, _on: bool) {}

    fn purge_finished(
        &mut self,
        completed_before: Option<Millis>,
        other_before: Option<Millis>,
    ) -> usize {
        if completed_before.is_none() && other_before.is_none() {
            return 0;
        }
        self.flush();
        // A run purged here may have events recorded in this transaction.
        self.write_events();
        let c = Ms(completed_before.unwrap_or(PG_MIN_MS));
        let o = Ms(other_before.unwrap_or(PG_MIN_MS));
        let rows = self.query(SQL_PURGE, &[&c, &o], None);
        rows.first()
            .and_then(|r| r.try_get::<_, i64>(0).ok())
            .unwrap_or(0)
            .max(0) as usize
    }

    fn scope_runs(&self, tenant: TenantRef<'_>, entity_type: &str, entity_id: &str) -> Vec<RunId> {
        let rows = self.query(
            SQL_SCOPE,
            &[&tenant, &entity_type, &entity_id],
            Self::tenant_null(tenant),
        );
        self.absorb(&rows, false)
    }

    fn status_counts(&self, tenant: TenantRef<'_>) -> Vec<(Arc<str>, RunStatus, u64)> {
        let rows = self.query(SQL_COUNTS, &[&tenant], Self::tenant_null(tenant));
        let mut out: Vec<(Arc<str>, RunStatus, u64)> =
            status_counts_of(&rows, |r| r.try_get::<_, &str>(0).ok().map(Arc::from));
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.as_str().cmp(b.1.as_str())));
        out
    }

    fn ended_per_minute(
        &self,
        tenant: TenantRef<'_>,
        since: Millis,
    ) -> Vec<(Millis, RunStatus, u64)> {
        let rows = self.query(SQL_ENDED, &[&tenant, &Ms(since)], Self::tenant_null(tenant));
        status_counts_of(&rows, |r| r.try_get::<_, i64>(0).ok())
    }

    fn live_counts(&self) -> Vec<(Arc<str>, RunStatus, u64)> {
        let rows = self.query(SQL_LIVE_COUNTS, &[], None);
        status_counts_of(&rows, |r| r.try_get::<_, &str>(0).ok().map(Arc::from))
    }

    fn recent_failed(&self, tenant: TenantRef<'_>, limit: usize) -> Vec<RunId> {
        let limit = limit as i64;
        let rows = self.query(SQL_FAILED, &[&tenant, &limit], Self::tenant_null(tenant));
        self.absorb(&rows, false)
    }

    fn page_runs(&self, q: &PageQuery<'_>) -> RunPage {
        let status: Option<Vec<&str>> =
            q.statuses.map(|ss| ss.iter().map(|s| s.as_str()).collect());
        // No cursor: a key past every row (see `SQL_PAGE`).
        let (before_at, before_id) = q.before.unwrap_or((PG_MAX_MS, u128::MAX));
        let (before_at, before_id) = (Ms(before_at), Uuid::from_u128(before_id));
        let limit = q.limit.min(i64::MAX as usize) as i64;
        let since = Ms(q.since);
        let tn = Self::tenant_null(q.tenant);
        let page: &[&(dyn ToSql + Sync)] = &[
            &q.tenant, &q.pool, &status, &since, &before_at, &before_id, &limit,
        ];
        let (scope_type, scope_id) = q.scope.unzip();
        let ids = |rows: &[Row]| RunPage {
            ids: self.absorb(rows, false),
            walked_to: None,
        };
        if let Some(root) = q.root {
            let extra: &[&(dyn ToSql + Sync)] = &[root, &q.job_type, &scope_type, &scope_id];
            return ids(&self.query(SQL_PAGE_ROOT, &[page, extra].concat(), tn));
        }
        let budget = q.budget.min(i64::MAX as usize) as i64;
        let rows = if q.scope.is_some() {
            let extra: &[&(dyn ToSql + Sync)] = &[&scope_type, &scope_id, &q.job_type, &budget];
            self.query(SQL_PAGE_SCOPE, &[page, extra].concat(), tn)
        } else {
            let Some(job_type) = q.job_type else {
                return ids(&self.query(SQL_PAGE, page, tn));
            };
            let extra: &[&(dyn ToSql + Sync)] = &[&budget, &job_type];
            self.query(SQL_PAGE_TYPE, &[page, extra].concat(), tn)
        };
        // Each row's place in the walk follows its run columns.
        let at = RUN_COLS.split(',').count();
        let mut out = RunPage::default();
        for r in &rows {
            let read = || -> std::result::Result<(i64, bool, bool), postgres::Error> {
                Ok((r.try_get(at)?, r.try_get(at + 1)?, r.try_get(at + 2)?))
            };
            match read() {
                Ok((walked, more, hit)) => {
                    let id = self.absorb(std::slice::from_ref(r), false);
                    if walked == budget && more {
                        out.walked_to = id
                            .first()
                            .and_then(|i| self.runs.get(i))
                            .map(|row| (row.created_at, row.id.as_u128()));
                    }
                    if hit {
                        out.ids.extend(id);
                    }
                }
                Err(e) => self.fail(e),
            }
        }
        out
    }

    fn tree_runs(&self, root: &RunId) -> Vec<RunId> {
        let Some(r) = self.load(root) else {
            return Vec::new();
        };
        if r.root_run_id() != *root {
            // A subtree: walk children breadth-first.
            let mut out = vec![*root];
            let mut i = 0;
            while i < out.len() {
                let kids = self.children(&out[i]);
                for k in &kids {
                    self.load(k);
                }
                out.extend(kids);
                i += 1;
            }
            return out;
        }
        // A whole tree: one query, then breadth-first order in memory.
        let rows = self.query(SQL_TREE, &[root], None);
        let ids = self.absorb(&rows, false);
        let mut kids: HashMap<RunId, Vec<RunId>> = HashMap::new();
        for id in &ids {
            if let Some(p) = self.runs.get(id).and_then(|r| r.parent_run_id()) {
                kids.entry(p).or_default().push(*id);
            }
        }
        let mut out = vec![*root];
        let mut i = 0;
        while i < out.len() {
            if let Some(k) = kids.get(&out[i]) {
                out.extend(k.iter().copied());
            }
            i += 1;
        }
        out
    }

    fn schedule(&self, tenant: TenantRef<'_>, name: &str) -> Option<ScheduleRow> {
        let sql = if self.lock {
            // A writer queues on the schedule's key (two puts of a new
            // schedule) and reads the row locked, so it sees what a firing
            // transaction wrote instead of writing a stale next fire back.
            self.exec(SQL_LOCK, &[&lock_key(b's', tenant, name, "")]);
            SQL_SCHEDULE_LOCK
        } else {
            SQL_SCHEDULE
        };
        let rows = self.query(sql, &[&tenant, &name], Self::tenant_null(tenant));
        rows.first().and_then(schedule_from_row)
    }

    fn put_schedule(&mut self, row: ScheduleRow) {
        let (cron, every, tz) = match &row.timing {
            ScheduleTiming::Cron(c, tz) => (Some(c.expr().to_owned()), None, Some(tz.name())),
            ScheduleTiming::Every(ms) => (None, Some(*ms), None),
        };
        let tenant = row.tenant_id.as_deref();
        self.exec(
            SQL_PUT_SCHEDULE,
            &[
                &row.name,
                &tenant,
                &row.job_type,
                &Jsonb(row.input.get()),
                &cron,
                &every,
                &Ms(row.anchor),
                &row.next_fire_at.map(Ms),
                &row.last_fired_at.map(Ms),
                &row.last_run_id,
                &row.last_error,
                &Ms(row.created_at),
                &Ms(row.updated_at),
                &tz,
            ],
        );
    }

    fn delete_schedule(&mut self, tenant: TenantRef<'_>, name: &str) -> bool {
        !self
            .query(
                SQL_DELETE_SCHEDULE,
                &[&tenant, &name],
                Self::tenant_null(tenant),
            )
            .is_empty()
    }

    fn schedules(&self, tenant: TenantRef<'_>) -> Vec<ScheduleRow> {
        let rows = self.query(SQL_SCHEDULES, &[&tenant], Self::tenant_null(tenant));
        rows.iter().filter_map(schedule_from_row).collect()
    }

    fn due_schedules(&mut self, now: Millis, limit: usize) -> Vec<ScheduleRow> {
        let limit = limit as i64;
        let rows = self.query(SQL_DUE_SCHEDULES, &[&Ms(now), &limit], None);
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            match read_schedule(r) {
                Ok(s) => out.push(s),
                Err(why) => {
                    // A row this version cannot read (edited by hand, say):
                    // stop it firing, and say why, rather than find it due
                    // on every pass.
                    let name: Option<&str> = r.try_get(0).ok();
                    let tenant: Option<&str> = r.try_get(1).ok().flatten();
                    if let Some(name) = name {
                        self.query(
                            SQL_PARK_SCHEDULE,
                            &[&tenant, &name, &why],
                            Self::tenant_null(tenant),
                        );
                    }
                }
            }
        }
        out
    }

    fn next_schedule_fire(&mut self) -> Option<Millis> {
        let rows = self.query(SQL_NEXT_SCHEDULE, &[], None);
        rows.first()
            .and_then(|r| r.try_get::<_, Option<Ms>>(0).ok().flatten())
            .map(|m| m.0)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        announcement_payloads, attempt_budget, events_channel, parse_transition, wake_channel,
        Transition,
    };
    use crate::model::{RunId, RunStatus};
    use std::time::Duration;

    /// A value past jsonb's limit is refused before it is written: the
    /// server's refusal failed the whole transaction (a worker's batch of
    /// outcomes), and the run never ended.
    #[test]
    fn a_json_text_past_the_jsonb_limit_is_a_problem_before_the_server_sees_it() {
        let mut at_limit = String::with_capacity(super::JSONB_MAX + 1);
        at_limit.push('"');
        at_limit.extend(std::iter::repeat_n('a', super::JSONB_MAX - 2));
        at_limit.push('"');
        assert_eq!(super::jsonb_problem(&at_limit), None);
        at_limit.insert(1, 'a');
        assert_eq!(super::jsonb_problem(&at_limit), Some(super::TOO_LARGE));
        // Small numbers grow ~6x in jsonb: 24M of them (48 MB of text,
        // ~290 MB of jsonb) are past the limit; 10M (~120 MB) are not.
        for (n, past) in [(24_000_000usize, true), (10_000_000, false)] {
            let mut nums = String::with_capacity(2 * n + 2);
            nums.push('[');
            for k in 0..n {
                if k > 0 {
                    nums.push(',');
                }
                nums.push('0');
            }
            nums.push(']');
            assert_eq!(super::jsonb_problem(&nums).is_some(), past, "{n} numbers");
        }
    }

    #[test]
    fn announcements_fit_a_notification_and_read_back_as_sent() {
        let statuses = [
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::TimedOut,
            RunStatus::Canceled,
            RunStatus::Pending,
        ];
        let sent: Vec<Transition> = (0..1000u32)
            .map(|i| Transition {
                run: RunId::new_v4(),
                status: statuses[i as usize % statuses.len()],
                epoch: u32::MAX - i,
                attempts: i,
            })
            .collect();
        let payloads = announcement_payloads("0123456789abcdef", &sent);
        assert!(payloads.len() > 1, "a thousand take several notifications");
        let mut back = Vec::new();
        for p in &payloads {
            // PostgreSQL refuses a payload of 8000 bytes or more.
            assert!(p.len() < 8000, "payload of {} bytes", p.len());
            let mut words = p.split(' ');
            assert_eq!(words.next(), Some("0123456789abcdef"));
            back.extend(words.map(|w| parse_transition(w).expect("an entry")));
        }
        assert_eq!(back, sent);
        // A running run is no event: not announced.
        let running = Transition {
            status: RunStatus::Running,
            ..sent[0]
        };
        assert!(announcement_payloads("0123456789abcdef", &[running]).is_empty());
        for bad in [
            "",
            "x:c:1:1",
            "00000000-0000-4000-8000-000000000000:q:1:1",
            "00000000-0000-4000-8000-000000000000:c:1:1:9",
        ] {
            assert_eq!(parse_transition(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_wake_up_channel_fits_a_name_however_long_the_schema() {
        assert_eq!(wake_channel("jobs"), "jobforge_jobs");
        let at_limit = "s".repeat(54);
        assert_eq!(wake_channel(&at_limit), format!("jobforge_{at_limit}"));
        for len in [55, 63, 80] {
            let named = wake_channel(&"s".repeat(len));
            assert!(named.len() <= 63, "{named}");
            assert_ne!(named, wake_channel(&"t".repeat(len)));
            assert_ne!(named, events_channel(&"s".repeat(len)));
        }
    }

    #[test]
    fn the_events_channel_is_no_wake_up_channel_and_fits_a_name() {
        assert_eq!(events_channel("jobs"), "jobforge:events:jobs");
        // No schema's wake-up channel (`jobforge_<schema>`) starts this way.
        assert!(!events_channel("x").starts_with("jobforge_"));
        let long = "s".repeat(80);
        let named = events_channel(&long);
        assert!(named.len() <= 63, "{named}");
        assert_ne!(named, events_channel(&"t".repeat(80)));
    }

    /// The test server (`JOBFORGE_PG_URL`) and a client of it; `None` (the
    /// test skips, saying why) when none answers, unless
    /// `JOBFORGE_REQUIRE_PG=1` (CI) makes that a failure.
    fn test_server() -> Option<(String, postgres::Client)> {
        let url = std::env::var("JOBFORGE_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        match postgres::Client::connect(&url, postgres::NoTls) {
            Ok(c) => Some((url, c)),
            Err(e) => {
                if std::env::var("JOBFORGE_REQUIRE_PG").is_ok_and(|v| v == "1") {
                    panic!("JOBFORGE_REQUIRE_PG=1 but PostgreSQL is unreachable: {e}");
                }
                eprintln!("skipping postgres test: no server at JOBFORGE_PG_URL ({e})");
                None
            }
        }
    }

    /// A write refused because the server is read-only (a primary demoted
    /// during a failover, `read_only_sql_transaction`) is retryable: the
    /// same call succeeds once the connection reaches the new primary. It
    /// was not, so a worker gave up settling its runs at once.
    #[test]
    fn a_write_refused_by_a_read_only_server_is_retryable() {
        use super::*;
        let Some((_, mut c)) = test_server() else {
            return;
        };
        c.batch_execute("SET default_transaction_read_only = on")
            .expect("set");
        let e = c
            .batch_execute("CREATE TEMP TABLE jf_read_only_probe (x int)")
            .expect_err("a read-only session refuses a write");
        assert_eq!(e.code().map(|c| c.code()), Some("25006"));
        match db_err(e) {
            JobError::Store {
                retryable, outcome, ..
            } => {
                assert!(retryable);
                assert_eq!(outcome, StoreOutcome::Unchanged);
            }
            other => panic!("not a store error: {other:?}"),
        }
    }

    /// Every statement of the durable waits, and of the worker's batched
    /// claim and settle, is index-backed: planned with
    /// sequential scans off (so a small table does not hide a missing
    /// index), none scans a table whole. Needs a server, as
    /// `tests/postgres.rs` does (and skips the same way without one).
    #[test]
    fn the_wait_and_batch_statements_are_index_backed() {
        use super::*;
        let Some((url, mut c)) = test_server() else {
            return;
        };
        let schema = format!("jf_rs_explain_{}", std::process::id());
        let s = quote_ident(&schema);
        c.batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
            .expect("drop");
        let mut cfg = PgConfig::new(url);
        cfg.schema = schema;
        PgStore::new(cfg)
            .expect("store")
            .migrate()
            .expect("migrate");
        c.batch_execute("SET enable_seqscan = off").expect("set");
        let (run, now, limit) = (Uuid::new_v4(), Ms(0), 10i64);
        let types = vec!["a".to_owned()];
        let cases: [(&str, &[&(dyn ToSql + Sync)], &str); 13] = [
            (SQL_DUE_WAITS, &[&now, &limit], "job_run_wait_deadline_idx"),
            (SQL_RESUME_DUE, &[&now, &limit], "job_run_wait_deadline_idx"),
            (SQL_NEXT_WAIT, &[], "job_run_wait_deadline_idx"),
            (SQL_TAKE_SIGNAL, &[&run, &"go"], "job_signal_pkey"),
            (SQL_INBOX_LEN, &[&run], "job_signal_pkey"),
            (SQL_CLEAR_SIGNALS, &[&run], "job_signal_pkey"),
            (SQL_PURGE, &[&now, &now], "job_signal_pkey"),
            (SQL_PUSH_SIGNAL, &[&run, &"go", &Jsonb("1"), &now], "Insert"),
            // The timeline's pages and the metrics' live gauges.
            (SQL_RUN_EVENTS, &[&run, &0i64, &limit], "job_event_pkey"),
            (SQL_LIVE_COUNTS, &[], "job_run_waiting_idx"),
            (SQL_LIVE_COUNTS, &[], "job_run_claim_idx"),
            // A worker's claims, limited to its process's job types.
            (
                SQL_CLAIMABLE_OF,
                &[&"batch", &now, &limit, &types],
                "job_run_claim_idx",
            ),
            (SQL_NEXT_DUE_OF, &[&"batch", &types], "job_run_claim_idx"),
        ];
        // Each statement's plan: no sequential scan, and the index it needs.
        let mut explain = |tpl: &str, params: &[&(dyn ToSql + Sync)], index: &str| {
            let sql = tpl.replace("{S}", &s).replace("{R}", RUN_COLS);
            let plan = c
                .query(&format!("EXPLAIN {sql}"), params)
                .expect("explain")
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n");
            assert!(!plan.contains("Seq Scan"), "{sql}\n{plan}");
            assert!(plan.contains(index), "{sql}\n{plan}");
        };
        for (tpl, params, index) in cases {
            explain(tpl, params, index);
        }
        // The worker's batch: one claim statement for many runs, one read
        // and one write for many settled (or returned) runs, the heartbeat.
        let ids: Vec<Uuid> = vec![run, Uuid::new_v4()];
        let epochs: Vec<i32> = vec![1, 1];
        let texts: Vec<Option<&str>> = vec![None, None];
        let jsons: Vec<Option<Jsonb<'_>>> = vec![None, None];
        let times: Vec<Option<Ms>> = vec![None, None];
        let (status, stamps) = (vec!["completed"; 2], vec![Ms(0), Ms(0)]);
        let (ints, bigs, flags) = (vec![1i32; 2], vec![1i64; 2], vec![false; 2]);
        let pools = vec!["batch"; 2];
        let batch: [(&str, &[&(dyn ToSql + Sync)], &str); 4] = [
            (
                SQL_CLAIMABLE,
                &[&"batch", &now, &limit],
                "job_run_claim_idx",
            ),
            (SQL_RUNS_LOCK, &[&ids], "job_run_pkey"),
            (
                SQL_UPDATE_RUNS,
                &[
                    &ids, &status, &jsons, &jsons, &stamps, &times, &times, &times, &ints, &stamps,
                    &bigs, &ints, &flags, &ints, &pools, &texts, &times, &jsons,
                ],
                "job_run_pkey",
            ),
            (SQL_HEARTBEAT, &[&ids, &epochs, &now], "job_run_pkey"),
        ];
        for (tpl, params, index) in batch {
            explain(tpl, params, index);
        }
        c.batch_execute(&format!("DROP SCHEMA {s} CASCADE"))
            .expect("drop");
    }

    #[test]
    fn a_connection_attempt_gets_the_timeout_once_per_address_it_may_try() {
        let budget = |url: &str| {
            let config: postgres::Config = url.parse().expect("url");
            attempt_budget(&config, Duration::from_secs(3))
        };
        assert_eq!(
            budget("postgres://u@127.0.0.1:5432/db"),
            Duration::from_secs(3)
        );
        assert_eq!(
            budget("host=127.0.0.1,127.0.0.2,::1 port=1,2,3 user=u"),
            Duration::from_secs(9)
        );
        assert_eq!(
            budget("host=db.invalid hostaddr=10.0.0.1,10.0.0.2 user=u"),
            Duration::from_secs(6)
        );
        // A name that does not resolve still counts once.
        assert_eq!(
            budget("host=no-such-host.invalid user=u"),
            Duration::from_secs(3)
        );
    }
}
