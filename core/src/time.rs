//! Time as the core sees it: always passed in, never read.
//!
//! A [`Timestamp`] is nanoseconds since the Unix epoch *on the clock of whoever passed it in*.
//! Windows are aligned to the Unix epoch on each agent's own clock (see [`Window`]), so two
//! agents agree on a window index whenever their clocks agree, and the skew term of the bound
//! covers the rest; an agent with a timebase passes its corrected clock instead
//! ([`crate::budget::Timebase`]).

use std::ops::{Add, Sub};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Nanoseconds since the Unix epoch on the caller's clock.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    pub const fn from_unix_nanos(nanos: u64) -> Self {
        Timestamp(nanos)
    }

    pub const fn from_unix_millis(millis: u64) -> Self {
        Timestamp(millis.saturating_mul(1_000_000))
    }

    pub const fn as_unix_nanos(self) -> u64 {
        self.0
    }

    pub const fn as_unix_millis(self) -> u64 {
        self.0 / 1_000_000
    }

    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_nanos(d)))
    }

    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_nanos(d)))
    }

    /// Time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        self.saturating_add(d)
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, d: Duration) -> Timestamp {
        self.saturating_sub(d)
    }
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Index of a window: `floor(unix_time / window_len)`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct WindowIndex(pub u64);

impl WindowIndex {
    pub fn next(self) -> WindowIndex {
        WindowIndex(self.0 + 1)
    }
}

/// A window length, aligned to the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    len_nanos: u64,
}

impl Window {
    /// `len` must be at least one nanosecond; shorter windows are rejected by the config loader.
    pub fn new(len: Duration) -> Self {
        let len_nanos = duration_nanos(len);
        assert!(len_nanos > 0, "window length must be positive");
        Window { len_nanos }
    }

    pub fn len(self) -> Duration {
        Duration::from_nanos(self.len_nanos)
    }

    pub fn index(self, now: Timestamp) -> WindowIndex {
        WindowIndex(now.as_unix_nanos() / self.len_nanos)
    }

    pub fn start(self, index: WindowIndex) -> Timestamp {
        Timestamp::from_unix_nanos(index.0.saturating_mul(self.len_nanos))
    }

    pub fn end(self, index: WindowIndex) -> Timestamp {
        self.start(index.next())
    }

    /// Time left in the window that contains `now`.
    pub fn remaining(self, now: Timestamp) -> Duration {
        self.end(self.index(now)).saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_align_to_the_unix_epoch() {
        let w = Window::new(Duration::from_secs(60));
        let t = Timestamp::from_unix_millis(120_000 + 15_000);
        assert_eq!(w.index(t), WindowIndex(2));
        assert_eq!(
            w.start(WindowIndex(2)),
            Timestamp::from_unix_millis(120_000)
        );
        assert_eq!(w.remaining(t), Duration::from_secs(45));
        assert_eq!(w.index(w.end(WindowIndex(2))), WindowIndex(3));
    }

    #[test]
    fn timestamps_saturate_instead_of_wrapping() {
        assert_eq!(Timestamp::ZERO - Duration::from_secs(1), Timestamp::ZERO);
        assert_eq!(Timestamp::MAX + Duration::from_secs(1), Timestamp::MAX);
        let a = Timestamp::from_unix_millis(5);
        assert_eq!(Timestamp::ZERO.saturating_duration_since(a), Duration::ZERO);
    }
}
