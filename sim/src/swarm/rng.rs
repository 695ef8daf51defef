//! The swarm's one source of randomness: a ChaCha8 stream of the seed, with the few shapes of
//! draw the distributions need.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::derive_seed;

/// Keeps the swarm's draws apart from every stream a run of the same seed uses.
const SWARM_PURPOSE: u64 = 0x5357_4152_4d00_0001;

pub struct Dice {
    rng: ChaCha8Rng,
}

impl Dice {
    pub fn new(seed: u64) -> Self {
        Dice {
            rng: ChaCha8Rng::seed_from_u64(derive_seed(seed, SWARM_PURPOSE)),
        }
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p.clamp(0.0, 1.0))
    }

    /// Uniform in `[lo, hi]` (`lo` when `hi < lo`).
    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.rng.random_range(lo..=hi)
    }

    /// Uniform in `[lo, hi)`.
    pub fn real(&mut self, lo: f64, hi: f64) -> f64 {
        if hi <= lo {
            return lo;
        }
        self.rng.random_range(lo..hi)
    }

    /// Log-uniform in `[lo, hi]`: every order of magnitude as likely as the next.
    pub fn log(&mut self, lo: f64, hi: f64) -> f64 {
        self.real(lo.ln(), hi.ln()).exp()
    }

    /// One of `items`, by weight.
    pub fn weighted<T: Copy>(&mut self, items: &[(u32, T)]) -> T {
        let total: u64 = items.iter().map(|(w, _)| u64::from(*w)).sum();
        let mut at = self.int(0, total.saturating_sub(1));
        for (w, item) in items {
            if at < u64::from(*w) {
                return *item;
            }
            at -= u64::from(*w);
        }
        items[items.len() - 1].1
    }

    /// An index below `n` (`n` at least 1).
    pub fn index(&mut self, n: usize) -> usize {
        self.int(0, n.saturating_sub(1) as u64) as usize
    }
}
