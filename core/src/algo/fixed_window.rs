//! Fixed window counter: at most `limit_units` per window, windows aligned to the Unix epoch.
//!
//! The per-key state is the window index and the units used in it (16 bytes). A request of cost
//! `c` passes when `used + c <= limit`. The price of this simplicity is the boundary burst: a
//! client can spend the whole limit at the end of one window and again at the start of the
//! next, so up to `2 * limit` units pass within a few moments. Envoy's reference rate limit
//! service counts the same way.

use crate::algo::Decision;
use crate::time::{Timestamp, Window, WindowIndex};

/// The fixed parameters of one fixed-window limit; the per-key state is a [`FixedWindowState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedWindow {
    limit_units: u64,
    window: Window,
}

/// Per-key state: the window last charged and what it used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    window: WindowIndex,
    used_units: u64,
}

const _: () = assert!(std::mem::size_of::<FixedWindowState>() == 16);

impl FixedWindow {
    pub fn new(limit_units: u64, window: Window) -> Self {
        FixedWindow {
            limit_units,
            window,
        }
    }

    pub fn limit_units(&self) -> u64 {
        self.limit_units
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// Decide a request of `cost` units at `now`; charges the state only when allowed.
    /// Inlined across crates, as [`crate::algo::gcra::Gcra::check`].
    #[inline]
    pub fn check(&self, state: &mut FixedWindowState, now: Timestamp, cost: u64) -> Decision {
        let current = self.current(state, now);
        let left = self.limit_units.saturating_sub(current.used_units);
        let reset_after = self
            .window
            .end(current.window)
            .saturating_duration_since(now);
        if cost > left {
            // Nothing but the next window frees units, and there the whole limit is free.
            return Decision::Denied {
                retry_after: (cost <= self.limit_units).then_some(reset_after),
                reset_after,
            };
        }
        *state = FixedWindowState {
            window: current.window,
            used_units: current.used_units + cost,
        };
        Decision::Allowed {
            remaining: left - cost,
            reset_after,
        }
    }

    /// Units that would pass at `now`, without charging anything.
    pub fn remaining(&self, state: &FixedWindowState, now: Timestamp) -> u64 {
        self.limit_units
            .saturating_sub(self.current(state, now).used_units)
    }

    /// The state as of `now`: a later window starts from zero. A clock that stepped back into an
    /// earlier window keeps counting in the stored one, so it can never reopen a spent window.
    fn current(&self, state: &FixedWindowState, now: Timestamp) -> FixedWindowState {
        let index = self.window.index(now);
        if index > state.window {
            FixedWindowState {
                window: index,
                used_units: 0,
            }
        } else {
            *state
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::algo::decision::testing::check_retry_is_exact;

    const MINUTE: Duration = Duration::from_secs(60);

    fn per_minute(limit_units: u64) -> FixedWindow {
        FixedWindow::new(limit_units, Window::new(MINUTE))
    }

    /// The start of some minute in November 2023.
    fn minute_start() -> Timestamp {
        Window::new(MINUTE).start(WindowIndex(28_333_334))
    }

    #[test]
    fn a_window_admits_its_limit_then_waits_for_the_next() {
        let fw = per_minute(100);
        let mut s = FixedWindowState::default();
        let half_past = minute_start() + Duration::from_secs(30);
        assert_eq!(
            fw.check(&mut s, half_past, 60),
            Decision::Allowed {
                remaining: 40,
                reset_after: Duration::from_secs(30)
            }
        );
        assert_eq!(
            fw.check(&mut s, half_past, 40),
            Decision::Allowed {
                remaining: 0,
                reset_after: Duration::from_secs(30)
            }
        );
        assert_eq!(
            fw.check(&mut s, half_past, 1),
            Decision::Denied {
                retry_after: Some(Duration::from_secs(30)),
                reset_after: Duration::from_secs(30)
            }
        );
        let next_minute = minute_start() + MINUTE;
        let just_before = next_minute - Duration::from_nanos(1);
        assert!(!fw.check(&mut s, just_before, 1).is_allowed());
        assert_eq!(
            fw.check(&mut s, next_minute, 1),
            Decision::Allowed {
                remaining: 99,
                reset_after: MINUTE
            }
        );
    }

    #[test]
    fn the_boundary_lets_twice_the_limit_through_in_one_second() {
        let fw = per_minute(100);
        let mut s = FixedWindowState::default();
        let last_second = minute_start() + Duration::from_secs(59);
        let first_second = minute_start() + MINUTE;
        assert!(fw.check(&mut s, last_second, 100).is_allowed());
        assert!(fw.check(&mut s, first_second, 100).is_allowed());
    }

    #[test]
    fn a_cost_above_the_limit_never_passes_and_charges_nothing() {
        let fw = per_minute(100);
        let mut s = FixedWindowState::default();
        let now = minute_start() + Duration::from_secs(45);
        assert_eq!(
            fw.check(&mut s, now, 101),
            Decision::Denied {
                retry_after: None,
                reset_after: Duration::from_secs(15)
            }
        );
        assert_eq!(fw.remaining(&s, now), 100);
    }

    #[test]
    fn a_clock_step_back_does_not_reopen_a_spent_window() {
        let fw = per_minute(100);
        let mut s = FixedWindowState::default();
        assert!(fw.check(&mut s, minute_start() + MINUTE, 100).is_allowed());
        // One second before the spent minute began: the earlier minute is not fresh quota.
        // The next free unit is at the end of the spent minute, 61 s away.
        let earlier = minute_start() + Duration::from_secs(59);
        assert_eq!(fw.remaining(&s, earlier), 0);
        assert_eq!(
            fw.check(&mut s, earlier, 1),
            Decision::Denied {
                retry_after: Some(Duration::from_secs(61)),
                reset_after: Duration::from_secs(61)
            }
        );
    }

    fn arb_steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
        // (gap in thousandths of a window, cost)
        prop::collection::vec((0u64..=1_500, 0u64..=30), 1..80)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Against a plain per-window tally of what was admitted: a request passes exactly when
        /// it fits in its window, so no window ever holds more than the limit, and a denied
        /// request's retry-after is exact.
        #[test]
        fn decisions_follow_the_per_window_tally(
            limit in 0u64..=40,
            window_ms in 1u64..=10_000,
            start_ms in 1_600_000_000_000u64..1_900_000_000_000,
            steps in arb_steps(),
        ) {
            let window = Window::new(Duration::from_millis(window_ms));
            let fw = FixedWindow::new(limit, window);
            let mut state = FixedWindowState::default();
            let mut admitted: BTreeMap<WindowIndex, u64> = BTreeMap::new();
            let mut now = Timestamp::from_unix_millis(start_ms);
            for (gap_permille, cost) in steps {
                now = now + Duration::from_micros(window_ms * gap_permille);
                let used = admitted.get(&window.index(now)).copied().unwrap_or(0);
                prop_assert_eq!(fw.remaining(&state, now), limit - used);
                let before = state;
                match fw.check(&mut state, now, cost) {
                    Decision::Allowed { remaining, .. } => {
                        prop_assert!(used + cost <= limit);
                        prop_assert_eq!(remaining, limit - used - cost);
                        *admitted.entry(window.index(now)).or_default() += cost;
                    }
                    Decision::Denied { retry_after, .. } => {
                        prop_assert!(used + cost > limit);
                        prop_assert_eq!(state, before);
                        match retry_after {
                            Some(after) => check_retry_is_exact(now, after, |t| {
                                fw.check(&mut state.clone(), t, cost).is_allowed()
                            })?,
                            None => prop_assert!(cost > limit),
                        }
                    }
                }
            }
            prop_assert!(admitted.values().all(|&units| units <= limit));
        }
    }
}
