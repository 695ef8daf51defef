//! Reconnection delays: capped exponential backoff with full jitter (a uniform draw between
//! zero and the capped exponential), so that gateways cut off together do not reconnect
//! together.

use std::time::Duration;

/// Exponent past which the delay is at its cap anyway (2^16 times any sane base).
const MAX_DOUBLINGS: u32 = 16;

#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
    rng: u64,
}

impl Backoff {
    pub(crate) fn new(base: Duration, cap: Duration, seed: u64) -> Self {
        Backoff {
            base,
            cap,
            failures: 0,
            // xorshift must not start at zero.
            rng: seed | 1,
        }
    }

    /// The wait before the next attempt, after one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let doublings = self.failures.min(MAX_DOUBLINGS);
        self.failures = self.failures.saturating_add(1);
        let ceiling = self.base.saturating_mul(1 << doublings).min(self.cap);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(self.next_random() % nanos.saturating_add(1))
    }

    /// A success: the next failure starts from the base again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// xorshift64: jitter needs spread, not secrecy.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_under_the_capped_exponential_and_reset_after_success() {
        let base = Duration::from_millis(10);
        let cap = Duration::from_millis(300);
        let mut b = Backoff::new(base, cap, 42);
        for failure in 0..40u32 {
            let ceiling = base
                .saturating_mul(1 << failure.min(MAX_DOUBLINGS))
                .min(cap);
            assert!(b.next_delay() <= ceiling, "failure {failure}");
        }
        b.reset();
        assert!(b.next_delay() <= base);
    }

    #[test]
    fn delays_are_spread_not_all_at_the_cap() {
        let cap = Duration::from_millis(100);
        let mut b = Backoff::new(Duration::from_millis(100), cap, 7);
        let delays: Vec<Duration> = (0..200).map(|_| b.next_delay()).collect();
        let below_half = delays.iter().filter(|d| **d < cap / 2).count();
        // Full jitter is uniform on [0, cap]: about half fall below cap / 2.
        assert!((60..=140).contains(&below_half), "{below_half} of 200");
    }
}
