//! Retry-After for a refusal: rounded up to whole seconds, then stretched by a bounded jitter so
//! that clients refused together do not return together.

use std::time::Duration;

use rand::RngExt;

use super::Agent;

/// Retry-After is stretched by up to this share of itself (at least one second), so that
/// clients refused together do not come back together.
pub const RETRY_AFTER_JITTER_PERCENT: u64 = 10;

/// The most jitter Retry-After ever gets, in seconds: a minute spreads a refused crowd well
/// enough, and a long window (a day) then still promises its reset to within a minute,
/// instead of up to 2.4 hours after it.
pub const RETRY_AFTER_JITTER_MAX_SECS: u64 = 60;

impl Agent {
    /// The Retry-After for a refusal: whole seconds, rounded up, plus a jitter of up to a
    /// tenth of that (at least 1 s, at most [`RETRY_AFTER_JITTER_MAX_SECS`]).
    pub fn retry_after_secs(&self, retry_after: Duration) -> u64 {
        let base = ceil_secs(retry_after).max(1);
        let spread = (base * RETRY_AFTER_JITTER_PERCENT)
            .div_ceil(100)
            .clamp(1, RETRY_AFTER_JITTER_MAX_SECS);
        let jitter = self
            .jitter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .random_range(0..=spread);
        base + jitter
    }
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}
