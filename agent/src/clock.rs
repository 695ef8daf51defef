//! The wall clock, read in one place: the budget machine takes time as an argument, and its
//! windows are aligned to the Unix epoch, so the agent passes the system time.

use std::time::{SystemTime, UNIX_EPOCH};

use allot_core::time::{Timestamp, duration_nanos};

/// Now, in nanoseconds since the Unix epoch. A clock set before 1970 reads as the epoch.
pub fn now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_unix_nanos(duration_nanos(since))
}
