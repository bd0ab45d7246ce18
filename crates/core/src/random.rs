//! The engine's random source, used for retry jitter only.
//!
//! Jitter must spread the retries of many runs that failed together, not
//! resist an adversary, so a small, fast, seedable generator is enough:
//! SplitMix64 (a Weyl sequence through a 64-bit finaliser), whose whole
//! state is one counter. Keeping that counter in an atomic makes a draw
//! lock-free from any thread (the worker settles attempts on blocking
//! threads), and a seed makes a test's jittered delays reproducible.

use std::sync::atomic::{AtomicU64, Ordering};

/// The Weyl increment of SplitMix64 (2^64 / φ, odd).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A seedable source of uniform random integers, shared by every
/// transaction of one engine.
#[derive(Debug)]
pub struct RandomSource {
    state: AtomicU64,
}

impl RandomSource {
    /// A source whose sequence is fixed by `seed` (tests).
    pub fn seeded(seed: u64) -> Self {
        RandomSource {
            state: AtomicU64::new(seed),
        }
    }

    /// A source seeded from the wall clock and the source's own address,
    /// so two engines started in the same nanosecond still differ.
    pub fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let probe = 0u8;
        let addr = &probe as *const u8 as u64;
        RandomSource::seeded(mix(nanos ^ addr.rotate_left(32)))
    }

    /// Restarts the sequence from `seed` (a test replacing the clock's seed).
    pub fn reseed(&self, seed: u64) {
        self.state.store(seed, Ordering::Relaxed);
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        // Each draw owns one step of the counter, whichever thread takes it.
        let s = self
            .state
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        mix(s)
    }

    /// A uniform integer in `[0, max]` (both ends included). The widening
    /// multiply maps 64 random bits onto the range with a bias below
    /// `(max + 1) / 2^64`, nothing for delays of at most 2^53 ms.
    pub fn up_to(&self, max: u64) -> u64 {
        if max == u64::MAX {
            return self.next_u64();
        }
        ((u128::from(self.next_u64()) * u128::from(max + 1)) >> 64) as u64
    }
}

/// The SplitMix64 finaliser: every input bit affects every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_sequence() {
        let a = RandomSource::seeded(42);
        let b = RandomSource::seeded(42);
        let xs: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        b.reseed(42);
        assert_eq!(b.next_u64(), xs[0], "reseeding restarts the sequence");
        assert_ne!(RandomSource::seeded(43).next_u64(), xs[0]);
    }

    #[test]
    fn up_to_stays_in_range_and_reaches_both_ends() {
        let r = RandomSource::seeded(7);
        for max in [0u64, 1, 2, 10, 1_000, 9_007_199_254_740_991] {
            for _ in 0..2_000 {
                assert!(r.up_to(max) <= max, "max {max}");
            }
        }
        let draws: Vec<u64> = (0..2_000).map(|_| r.up_to(3)).collect();
        for v in 0..=3 {
            assert!(draws.contains(&v), "{v} is drawn from [0, 3]");
        }
        assert_eq!(r.up_to(0), 0);
    }
}
