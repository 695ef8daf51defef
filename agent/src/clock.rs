//! The clock, read in one place: the budget machine takes time as an argument, and its
//! windows are aligned to the Unix epoch, so the agent passes the system time. Tests pass a
//! manual clock instead, so that what depends on the time of day (a day window's reset, its
//! Retry-After) is checked at every time of day, not only at the time the test happens to run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use allot_core::time::{Timestamp, duration_nanos};

/// Now, in nanoseconds since the Unix epoch. A clock set before 1970 reads as the epoch.
pub fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_unix_nanos(duration_nanos(since))
}

/// Where an agent reads the time.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A time the owner sets (nanoseconds since the Unix epoch): for tests.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A manual clock reading `at`, and the handle that moves it.
    pub fn manual(at: Timestamp) -> (Clock, Arc<AtomicU64>) {
        let cell = Arc::new(AtomicU64::new(at.as_unix_nanos()));
        (Clock::Manual(cell.clone()), cell)
    }

    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => now(),
            Clock::Manual(cell) => Timestamp::from_unix_nanos(cell.load(Ordering::Relaxed)),
        }
    }
}
