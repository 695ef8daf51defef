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

/// Nanoseconds on a clock that no step of the wall clock moves and that runs on while the
/// machine is suspended: Linux's `CLOCK_BOOTTIME` (the monotonic clock stops during a
/// suspend, and an agent on it would read behind by the pause). Elsewhere, the monotonic
/// clock since the first call.
#[cfg(target_os = "linux")]
pub fn since_boot_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a plain system call writing into the timespec this function owns.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    // CLOCK_BOOTTIME exists since Linux 2.6.39; it cannot fail with a valid pointer.
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

#[cfg(not(target_os = "linux"))]
pub fn since_boot_nanos() -> u64 {
    static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    duration_nanos(FIRST.get_or_init(std::time::Instant::now).elapsed())
}

/// Where an agent reads the time.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// The wall clock's reading at a start, run on by a clock no step of the wall clock moves
    /// ([`since_boot_nanos`]): steps of the wall clock since that start are not seen
    /// (`Clock::counted_from_now`).
    SinceStart { wall: Timestamp, boot_nanos: u64 },
    /// A time the owner sets (nanoseconds since the Unix epoch): for tests.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A manual clock reading `at`, and the handle that moves it.
    pub fn manual(at: Timestamp) -> (Clock, Arc<AtomicU64>) {
        let cell = Arc::new(AtomicU64::new(at.as_unix_nanos()));
        (Clock::Manual(cell.clone()), cell)
    }

    /// This clock from now on counted by a clock no wall-clock step moves, from its reading
    /// now or `floor` if that is later: the system clock becomes [`Clock::SinceStart`]; a
    /// manual one stays as its owner sets it.
    pub fn counted_from_now(&self, floor: Timestamp) -> Clock {
        match self {
            Clock::System | Clock::SinceStart { .. } => Clock::SinceStart {
                wall: self.now().max(floor),
                boot_nanos: since_boot_nanos(),
            },
            Clock::Manual(cell) => Clock::Manual(cell.clone()),
        }
    }

    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => now(),
            Clock::SinceStart { wall, boot_nanos } => Timestamp::from_unix_nanos(
                wall.as_unix_nanos()
                    .saturating_add(since_boot_nanos().saturating_sub(*boot_nanos)),
            ),
            Clock::Manual(cell) => Timestamp::from_unix_nanos(cell.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_clock_counted_from_now_starts_at_the_wall_clock_and_runs_on_the_monotonic_one() {
        let c = Clock::System.counted_from_now(Timestamp::ZERO);
        let first = c.now();
        let wall = now();
        assert!(
            wall.saturating_duration_since(first) < Duration::from_secs(1)
                && first.saturating_duration_since(wall) < Duration::from_secs(1),
            "{first:?} against the wall clock's {wall:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(c.now().saturating_duration_since(first) >= Duration::from_millis(20));
        // From a floor ahead of the wall clock, it reads on from the floor.
        let ahead = wall + Duration::from_secs(3_600);
        let floored = Clock::System.counted_from_now(ahead);
        assert!(floored.now() >= ahead);
        assert!(floored.now() < ahead + Duration::from_secs(60));
        // A manual clock stays its owner's.
        let (manual, cell) = Clock::manual(Timestamp::from_unix_nanos(5));
        let counted = manual.counted_from_now(Timestamp::ZERO);
        cell.store(7, Ordering::Relaxed);
        assert_eq!(counted.now(), Timestamp::from_unix_nanos(7));
    }
}
