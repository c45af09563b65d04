//! A small seeded random number generator (SplitMix64).
//!
//! The harness keeps its own generator rather than a library's so that a seed
//! replays the same fault schedule and workload choices on every build,
//! whatever version of a random crate the workspace moves to.

use std::time::Duration;

/// A seeded, deterministic generator. Not for cryptography.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator that replays the same values for the same `seed`.
    pub fn new(seed: u64) -> Self {
        SimRng { state: seed }
    }

    /// A child generator for one part of a run (e.g. one client), so parts
    /// draw independently of each other's progress.
    pub fn fork(&mut self, salt: u64) -> SimRng {
        SimRng::new(self.next_u64() ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n`; `n` must be positive (0 is answered with 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for a test schedule.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// An index in `0..len` (`len` must be positive; 0 is answered with 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// A duration between `lo` and `hi` inclusive, at millisecond resolution.
    pub fn duration(&mut self, lo: Duration, hi: Duration) -> Duration {
        let lo_ms = lo.as_millis() as u64;
        let hi_ms = (hi.as_millis() as u64).max(lo_ms);
        Duration::from_millis(lo_ms + self.below(hi_ms - lo_ms + 1))
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_values() {
        let a: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..20).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SimRng::new(7);
            (0..20).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        let mut c = SimRng::new(8);
        assert_ne!(a[0], c.next_u64());
    }

    #[test]
    fn values_stay_in_range() {
        let mut r = SimRng::new(1);
        for n in 1..50u64 {
            for _ in 0..50 {
                assert!(r.below(n) < n);
            }
        }
        let d = r.duration(Duration::from_millis(10), Duration::from_millis(20));
        assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(20));
    }
}
