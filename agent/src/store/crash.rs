//! Crash points: named places in the store's start, rotation and checkpoint where the
//! crash-point sweep (`store::tests::crash_sweep`) kills the process, to check that every one
//! of them leaves a store that opens with nothing acknowledged lost.
//!
//! Only test builds have them: elsewhere [`point`] and [`point_then`] are empty and inlined
//! away, so the release path carries no check at all. In a test build a point fires when the
//! environment variable [`CRASH_POINT_ENV`] names it (`name`, or `name@n` for its n-th hit,
//! counted from 1) and aborts the process (no unwinding, no destructors: nothing is flushed
//! that a killed process would not have flushed).

/// The environment variable that arms a crash point (test builds only).
#[cfg(test)]
pub const CRASH_POINT_ENV: &str = "ALLOT_TEST_CRASH_POINT";

/// Dies here if this point is armed.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}

/// Runs `before_dying` and dies here if this point is armed (a test tears a write with it).
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn point_then(_name: &'static str, _before_dying: impl FnOnce()) {}

#[cfg(test)]
pub(crate) fn point(name: &'static str) {
    point_then(name, || {});
}

#[cfg(test)]
pub(crate) fn point_then(name: &'static str, before_dying: impl FnOnce()) {
    if armed::hit(name) {
        before_dying();
        // Read by the sweep to tell the point it meant from a crash of another kind.
        eprintln!("crash point {name} reached");
        std::process::abort();
    }
}

#[cfg(test)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// The armed point and the hit it fires at.
    fn target() -> Option<&'static (String, u32)> {
        static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
        TARGET
            .get_or_init(|| {
                let spec = std::env::var(super::CRASH_POINT_ENV).ok()?;
                match spec.split_once('@') {
                    Some((name, n)) => Some((name.to_owned(), n.parse().ok()?)),
                    None => Some((spec, 1)),
                }
            })
            .as_ref()
    }

    pub(super) fn hit(name: &str) -> bool {
        static HITS: AtomicU32 = AtomicU32::new(0);
        match target() {
            Some((armed, n)) if armed == name => HITS.fetch_add(1, Ordering::Relaxed) + 1 == *n,
            _ => false,
        }
    }
}
