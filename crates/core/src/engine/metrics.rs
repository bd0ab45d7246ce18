//! Metrics in the Prometheus text exposition format (`metrics_text`):
//! counters of what this process did to runs (created, completed, failed,
//! timed out, canceled, retries) and histograms of queue wait (due →
//! claimed) and run duration (started → ended), by job type and pool; and
//! gauges of the store's live runs (pending, running, waiting) per pool.
//!
//! The counters are fed from the same transition points as the timeline
//! (`Engine::note` and the two places a run row is inserted), inside the
//! change's transaction; what a transaction observes is held aside and
//! counted when it commits (`Engine::write_only`), so a refused call (a
//! `startMany` whose later entry fails, after an earlier one replaced a
//! lane's run) counts nothing it undid. With PostgreSQL each process
//! counts its own work (Prometheus scrapes every process and sums); the
//! gauges are the database's.

use super::Engine;
use crate::error::Result;
use crate::model::{EventKind, Millis, RunRow, RunStatus};
use crate::store::{Store, StoreTx};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

/// Histogram bucket bounds, ms (the text shows seconds).
const BUCKETS_MS: [i64; 14] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 300_000,
];

#[derive(Default, Clone)]
struct Histogram {
    /// Observations at or under each bound (not cumulative; summed when shown).
    buckets: [u64; BUCKETS_MS.len()],
    count: u64,
    sum_ms: i64,
}

impl Histogram {
    fn observe(&mut self, ms: i64) {
        let ms = ms.max(0);
        if let Some(i) = BUCKETS_MS.iter().position(|b| ms <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
    }
}

#[derive(Default, Clone)]
struct Series {
    created: u64,
    completed: u64,
    failed: u64,
    timed_out: u64,
    canceled: u64,
    retries: u64,
    queue_wait: Histogram,
    duration: Histogram,
}

type Map<K, V> = HashMap<K, V, ahash::RandomState>;
/// Series by pool.
type ByPool = Map<Arc<str>, Series>;
/// A series' labels: job type, pool.
type Labels = (Arc<str>, Arc<str>);
/// A counter's name, help and value.
type Counter = (&'static str, &'static str, fn(&Series) -> u64);
/// A histogram's name, help and data.
type HistogramOf = (&'static str, &'static str, fn(&Series) -> &Histogram);

/// This process's counts, by job type, then pool (two lookups by borrowed
/// text: no allocation once a series exists).
#[derive(Default)]
pub(super) struct Metrics {
    series: Mutex<Map<Arc<str>, ByPool>>,
}

fn apply(s: &mut Series, o: Observation) {
    match o {
        Observation::Created => s.created += 1,
        Observation::QueueWait(ms) => s.queue_wait.observe(ms),
        Observation::Retry => s.retries += 1,
        Observation::Ended(status, ran) => {
            match status {
                RunStatus::Completed => s.completed += 1,
                RunStatus::Failed => s.failed += 1,
                RunStatus::TimedOut => s.timed_out += 1,
                RunStatus::Canceled => s.canceled += 1,
                _ => {}
            }
            if let Some(ms) = ran {
                s.duration.observe(ms);
            }
        }
    }
}

/// See `Metrics::begin_transaction`.
pub(super) struct HeldGuard<'a> {
    metrics: &'a Metrics,
    open: bool,
}

impl HeldGuard<'_> {
    pub(super) fn end(mut self, committed: bool) {
        self.open = false;
        self.metrics.end_transaction(committed);
    }
}

impl Drop for HeldGuard<'_> {
    fn drop(&mut self) {
        if self.open {
            self.metrics.end_transaction(false);
        }
    }
}

/// One thing a transaction observed, counted when it commits.
#[derive(Clone, Copy)]
enum Observation {
    Created,
    QueueWait(i64),
    Retry,
    /// A run ended in this status, after running this long (if it ran).
    Ended(RunStatus, Option<i64>),
}

/// The observations of the transaction running on this thread (a store
/// transaction runs on one thread), and how deeply writes are nested.
struct Held {
    depth: u32,
    list: Vec<(Arc<str>, Arc<str>, Observation)>,
}

thread_local! {
    static HELD: RefCell<Held> = const { RefCell::new(Held { depth: 0, list: Vec::new() }) };
}

impl Metrics {
    /// Holds this thread's observations until the guard's `end` (nested:
    /// the outermost decides); a guard dropped without it (a panic) drops
    /// them.
    pub(super) fn begin_transaction(&self) -> HeldGuard<'_> {
        HELD.with(|h| h.borrow_mut().depth += 1);
        HeldGuard {
            metrics: self,
            open: true,
        }
    }

    /// Counts the held observations if the transaction committed, drops
    /// them if not.
    fn end_transaction(&self, committed: bool) {
        let list = HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.depth = h.depth.saturating_sub(1);
            if h.depth > 0 {
                return Vec::new();
            }
            std::mem::take(&mut h.list)
        });
        if !committed || list.is_empty() {
            return;
        }
        let mut m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        for (job_type, pool, o) in list {
            let s = match m.get_mut(&*job_type).and_then(|p| p.get_mut(&*pool)) {
                Some(s) => s,
                None => m.entry(job_type).or_default().entry(pool).or_default(),
            };
            apply(s, o);
        }
    }

    fn observe(&self, r: &RunRow, o: Observation) {
        let held = HELD.with(|h| {
            let mut h = h.borrow_mut();
            if h.depth == 0 {
                return false;
            }
            h.list.push((r.job_type.clone(), r.pool.clone(), o));
            true
        });
        if held {
            return;
        }
        let mut m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.get_mut(&*r.job_type).and_then(|p| p.get_mut(&*r.pool)) {
            return apply(s, o);
        }
        let pools = m.entry(r.job_type.clone()).or_default();
        apply(pools.entry(r.pool.clone()).or_default(), o);
    }

    /// A run row was inserted (started).
    pub(super) fn created(&self, r: &RunRow) {
        self.observe(r, Observation::Created);
    }

    /// `kind` happened to `r` (its row after the change) at `at`.
    pub(super) fn transition(&self, kind: EventKind, r: &RunRow, at: Millis) {
        let o = match kind {
            EventKind::Started => Observation::QueueWait(at - r.run_at),
            EventKind::RetryScheduled => Observation::Retry,
            EventKind::Completed
            | EventKind::Failed
            | EventKind::TimedOut
            | EventKind::Canceled => {
                Observation::Ended(r.status, r.started_at.get().map(|s| at - s))
            }
            _ => return,
        };
        self.observe(r, o);
    }

    /// The text exposition of the counters and of `live` (pool, status,
    /// count: the store's live runs).
    pub(super) fn text(&self, live: &[(Arc<str>, RunStatus, u64)]) -> String {
        let mut series: Vec<(Labels, Series)> = {
            let m = self.series.lock().unwrap_or_else(|p| p.into_inner());
            m.iter()
                .flat_map(|(t, pools)| {
                    pools
                        .iter()
                        .map(|(p, s)| ((t.clone(), p.clone()), s.clone()))
                })
                .collect()
        };
        series.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = String::with_capacity(1024 + series.len() * 2048);
        let labels = |(t, p): &Labels| format!("job_type=\"{}\",pool=\"{}\"", escape(t), escape(p));
        let counters: [Counter; 6] = [
            (
                "jobforge_runs_created_total",
                "Runs started (created), by job type and pool.",
                |s| s.created,
            ),
            (
                "jobforge_runs_completed_total",
                "Runs that completed.",
                |s| s.completed,
            ),
            (
                "jobforge_runs_failed_total",
                "Runs that failed (no retry left).",
                |s| s.failed,
            ),
            (
                "jobforge_runs_timed_out_total",
                "Runs that timed out.",
                |s| s.timed_out,
            ),
            (
                "jobforge_runs_canceled_total",
                "Runs canceled (directly or by a cascade).",
                |s| s.canceled,
            ),
            (
                "jobforge_run_retries_total",
                "Retries scheduled after a failed attempt.",
                |s| s.retries,
            ),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (k, s) in &series {
                let _ = writeln!(out, "{name}{{{}}} {}", labels(k), get(s));
            }
        }
        let histograms: [HistogramOf; 2] = [
            (
                "jobforge_queue_wait_seconds",
                "From when a run was due (runAt) to its claim.",
                |s| &s.queue_wait,
            ),
            (
                "jobforge_run_duration_seconds",
                "From the start of a run's last attempt to its end.",
                |s| &s.duration,
            ),
        ];
        for (name, help, get) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (k, s) in &series {
                let h = get(s);
                let l = labels(k);
                let mut cumulative = 0;
                for (i, b) in BUCKETS_MS.iter().enumerate() {
                    cumulative += h.buckets[i];
                    let _ = writeln!(
                        out,
                        "{name}_bucket{{{l},le=\"{}\"}} {cumulative}",
                        seconds(*b)
                    );
                }
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "{name}_sum{{{l}}} {}", seconds(h.sum_ms));
                let _ = writeln!(out, "{name}_count{{{l}}} {}", h.count);
            }
        }
        let name = "jobforge_runs";
        let _ = writeln!(
            out,
            "# HELP {name} Live runs in the store, by pool and status.\n# TYPE {name} gauge"
        );
        for (pool, status, n) in live {
            let _ = writeln!(
                out,
                "{name}{{pool=\"{}\",status=\"{}\"}} {n}",
                escape(pool),
                status.as_str()
            );
        }
        out
    }
}

impl<S: Store> Engine<S> {
    /// The Prometheus text exposition: this process's counters and
    /// histograms, and the store's live runs per pool and status. Not
    /// tenant-gated: an operator's view of the whole orchestrator (like a
    /// worker), with no run's data in it beyond job type and pool names.
    pub fn metrics_text(&self) -> Result<String> {
        let live = self.read(|tx| Ok(tx.live_counts()))?;
        Ok(self.metrics.text(&live))
    }
}

/// Milliseconds as a decimal number of seconds.
fn seconds(ms: i64) -> String {
    let s = format!("{}.{:03}", ms / 1000, (ms % 1000).abs());
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A label value as the text format needs it: backslash, double quote and
/// line feed escaped.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_seconds_are_plain_decimals() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(seconds(5), "0.005");
        assert_eq!(seconds(1000), "1");
        assert_eq!(seconds(2500), "2.5");
        assert_eq!(seconds(0), "0");
    }
}
