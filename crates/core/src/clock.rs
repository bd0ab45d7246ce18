//! Engine time. All timestamps are epoch milliseconds (what a JS `Date`
//! holds). A manual clock lets tests move time instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::watch;

/// Largest instant a JS `Date` can represent (±8.64e15 ms). Times past it
/// (e.g. a huge exponential backoff) are clamped here instead of becoming
/// an invalid Date.
pub const MAX_TIME_MS: i64 = 8_640_000_000_000_000;

pub fn clamp_time(ms: i64) -> i64 {
    ms.clamp(-MAX_TIME_MS, MAX_TIME_MS)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    System,
    Manual,
}

/// Shared engine clock. `now()` never goes backwards, so created order and
/// timestamps agree even if the wall clock steps back.
pub struct Clock {
    kind: ClockKind,
    /// What `elapsed_now` counts from on the system clock.
    origin: std::time::Instant,
    last: AtomicI64,
    /// Wakes manual-clock sleepers whenever time is advanced.
    tx: watch::Sender<i64>,
}

fn wall_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Clock {
    pub fn new(kind: ClockKind) -> Self {
        let start = wall_now();
        let (tx, _rx) = watch::channel(start);
        Clock {
            kind,
            origin: std::time::Instant::now(),
            last: AtomicI64::new(start),
            tx,
        }
    }

    pub fn kind(&self) -> ClockKind {
        self.kind
    }

    /// A time handed out outside the engine (a JS-side start): the system
    /// clock never answers earlier than it from now on.
    pub fn observe(&self, ms: i64) {
        if self.kind == ClockKind::System {
            self.last.fetch_max(ms, Ordering::AcqRel);
        }
    }

    pub fn now(&self) -> i64 {
        match self.kind {
            ClockKind::Manual => self.last.load(Ordering::Acquire),
            ClockKind::System => {
                let wall = wall_now();
                let prev = self.last.fetch_max(wall, Ordering::AcqRel);
                prev.max(wall)
            }
        }
    }

    /// A reading for measuring elapsed time (a run's timeout): monotonic ms
    /// on the system clock, which a step of the wall clock (NTP, a resumed
    /// VM) does not move; engine time on the manual clock.
    pub fn elapsed_now(&self) -> i64 {
        match self.kind {
            ClockKind::Manual => self.now(),
            ClockKind::System => self.origin.elapsed().as_millis().min(i64::MAX as u128) as i64,
        }
    }

    /// Resolves once `elapsed_now` reaches `deadline`.
    pub async fn sleep_until_elapsed(&self, deadline: i64) {
        match self.kind {
            ClockKind::System => {
                let at = self.origin + std::time::Duration::from_millis(deadline.max(0) as u64);
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            }
            ClockKind::Manual => self.sleep_until(deadline).await,
        }
    }

    /// Moves a manual clock forward. Returns the new time, or `None` on a
    /// system clock.
    pub fn advance(&self, ms: i64) -> Option<i64> {
        if self.kind != ClockKind::Manual {
            return None;
        }
        let ms = ms.max(0);
        let mut now = self.last.load(Ordering::Acquire);
        loop {
            let next = clamp_time(now.saturating_add(ms));
            match self
                .last
                .compare_exchange(now, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.tx.send_replace(next);
                    return Some(next);
                }
                Err(actual) => now = actual,
            }
        }
    }

    /// Resolves once engine time reaches `deadline`: a timer on the system
    /// clock, a wait for `advance` on the manual one.
    pub async fn sleep_until(&self, deadline: i64) {
        match self.kind {
            ClockKind::System => {
                let now = self.now();
                if deadline > now {
                    let ms = (deadline - now) as u64;
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                }
            }
            ClockKind::Manual => {
                let mut rx = self.tx.subscribe();
                while self.now() < deadline {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
