//! Sliding window counter: the previous window's count, weighted by how much of it the trailing
//! window still overlaps, plus the current window's count.
//!
//! With window length `W`, `e` the time elapsed in the current window, `p` and `c` the units
//! counted in the previous and the current window, the estimate of the trailing window is
//! `p * (W - e) / W + c`, and a request of cost `k` passes when `estimate + k <= limit`. It
//! assumes the previous window's units were spread evenly, which is the approximation; in
//! exchange the state is two counters and a window index (24 bytes).
//!
//! All decisions are made on the inequality multiplied through by `W`
//! (`p * (W - e) + (c + k) * W <= limit * W`, time in nanoseconds), in integers, 128-bit where a
//! product of units and nanoseconds needs it. So they are exact: no rounding admits a unit at the
//! boundary, and the retry-after is the first nanosecond at which the inequality holds, solved
//! in closed form.

use std::time::Duration;

use crate::algo::Decision;
use crate::time::{Timestamp, Window, WindowIndex, duration_nanos};

/// The fixed parameters of one sliding-window limit; the per-key state is a
/// [`SlidingWindowState`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    limit_units: u64,
    window: Window,
    /// `W`, cached: every decision uses it.
    window_nanos: u64,
}

/// Per-key state: the window last charged, its count and its predecessor's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    window: WindowIndex,
    previous_units: u64,
    current_units: u64,
}

const _: () = assert!(std::mem::size_of::<SlidingWindowState>() == 24);

impl SlidingWindow {
    pub fn new(limit_units: u64, window: Window) -> Self {
        SlidingWindow {
            limit_units,
            window,
            window_nanos: duration_nanos(window.len()),
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
    pub fn check(&self, state: &mut SlidingWindowState, now: Timestamp, cost: u64) -> Decision {
        let counts = self.current(state, now);
        let left = self.left_units(&counts, now);
        if cost > left {
            return Decision::Denied {
                retry_after: (cost <= self.limit_units)
                    .then(|| self.retry_after(&counts, now, cost)),
                reset_after: self.reset_after(&counts, now),
            };
        }
        *state = SlidingWindowState {
            current_units: counts.current_units + cost,
            ..counts
        };
        debug_assert_eq!(self.left_units(state, now), left - cost);
        Decision::Allowed {
            remaining: left - cost,
            reset_after: self.reset_after(state, now),
        }
    }

    /// Units that would pass at `now`, without charging anything.
    pub fn remaining(&self, state: &SlidingWindowState, now: Timestamp) -> u64 {
        self.left_units(&self.current(state, now), now)
    }

    /// The counts as of `now`: one window later the current count becomes the previous one, two
    /// or more windows later both are zero. A clock that stepped back into an earlier window
    /// keeps the stored windows, so it can never reopen spent quota.
    fn current(&self, state: &SlidingWindowState, now: Timestamp) -> SlidingWindowState {
        let index = self.window.index(now);
        match index.0.saturating_sub(state.window.0) {
            0 => *state,
            1 => SlidingWindowState {
                window: index,
                previous_units: state.current_units,
                current_units: 0,
            },
            _ => SlidingWindowState {
                window: index,
                ..SlidingWindowState::default()
            },
        }
    }

    /// How much of the previous window the trailing window still covers, in nanoseconds
    /// (`W - e`); all of it when `now` lies before the counted window (a clock step back).
    fn overlap_nanos(&self, counts: &SlidingWindowState, now: Timestamp) -> u128 {
        let start = self.window.start(counts.window);
        let elapsed_nanos = duration_nanos(now.saturating_duration_since(start));
        debug_assert!(elapsed_nanos < self.window_nanos);
        u128::from(self.window_nanos - elapsed_nanos)
    }

    /// `floor((limit * W - p * (W - e) - c * W) / W)`, the largest cost that passes now, which
    /// is `limit - c - ceil(p * (W - e) / W)` as `limit - c` is whole.
    fn left_units(&self, counts: &SlidingWindowState, now: Timestamp) -> u64 {
        self.limit_units
            .saturating_sub(counts.current_units)
            .saturating_sub(self.fading_units(counts, now))
    }

    /// `ceil(p * (W - e) / W)`: the previous window's units still inside the trailing window,
    /// rounded up so that rounding never admits a unit. At most `p`.
    fn fading_units(&self, counts: &SlidingWindowState, now: Timestamp) -> u64 {
        let weighted = u128::from(counts.previous_units) * self.overlap_nanos(counts, now);
        let units = weighted.div_ceil(u128::from(self.window_nanos));
        u64::try_from(units).unwrap_or(u64::MAX)
    }

    /// The first instant at which a request of `cost <= limit`, denied at `now`, passes if
    /// nothing else is admitted. Only the previous count's weight falls with time, so within
    /// the current window the answer solves `p * overlap <= (limit - c - k) * W` for the largest
    /// overlap; failing that, in the next window `c` becomes the previous count and the answer
    /// solves `c * overlap <= (limit - k) * W`, which holds at the latest when that window ends.
    fn retry_after(&self, counts: &SlidingWindowState, now: Timestamp, cost: u64) -> Duration {
        debug_assert!(cost <= self.limit_units);
        let w = u128::from(self.window_nanos);
        let (limit, cost) = (u128::from(self.limit_units), u128::from(cost));
        let (previous, current) = (
            u128::from(counts.previous_units),
            u128::from(counts.current_units),
        );
        let room_now = limit.checked_sub(current + cost);
        let overlap_this_window = room_now.and_then(|room| (room * w).checked_div(previous));
        let (window, max_overlap) = match overlap_this_window {
            Some(overlap) if overlap > 0 => {
                debug_assert!(overlap < self.overlap_nanos(counts, now));
                (counts.window, overlap)
            }
            _ => {
                let overlap = ((limit - cost) * w)
                    .checked_div(current)
                    .map_or(w, |o| o.min(w));
                (counts.window.next(), overlap)
            }
        };
        // The trailing window overlaps `max_overlap` of the previous one this far into `window`.
        let into_window = Duration::from_nanos(u64::try_from(w - max_overlap).unwrap_or(u64::MAX));
        (self.window.start(window) + into_window).saturating_duration_since(now)
    }

    /// Time until every counted unit has slid out of the trailing window.
    fn reset_after(&self, counts: &SlidingWindowState, now: Timestamp) -> Duration {
        let clear_at = if counts.current_units > 0 {
            self.window.end(counts.window.next())
        } else if counts.previous_units > 0 {
            self.window.end(counts.window)
        } else {
            return Duration::ZERO;
        };
        clear_at.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::algo::decision::testing::check_retry_is_exact;

    const MINUTE: Duration = Duration::from_secs(60);
    const TEN_SECONDS: Duration = Duration::from_secs(10);

    /// The start of some minute in November 2023 (also a ten-second boundary).
    fn start() -> Timestamp {
        Window::new(MINUTE).start(WindowIndex(28_333_334))
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn worked_example_50_per_minute_42_then_18() {
        let sw = SlidingWindow::new(50, Window::new(MINUTE));
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, start() + secs(10), 42).is_allowed());
        // 15 s into the next minute the estimate is 42 * 45/60 = 31.5, so 18 more fit
        // (49.5 <= 50) and leave half a unit, which is no whole request.
        let now = start() + MINUTE + secs(15);
        assert_eq!(sw.remaining(&s, now), 18);
        assert_eq!(
            sw.check(&mut s, now, 18),
            Decision::Allowed {
                remaining: 0,
                // The 18 slide out of the trailing minute at the end of the next minute.
                reset_after: secs(105)
            }
        );
        // One more: 49.5 + 1 = 50.5 > 50. It fits once 42 * (60 - e)/60 + 18 + 1 <= 50, that
        // is 60 - e <= 31 * 60/42 = 44.285714285714... s, so e >= 15.714285714285... s: the
        // first whole nanosecond is 15.714285715 s, 714,285,715 ns after now.
        let retry = Duration::from_nanos(714_285_715);
        assert_eq!(
            sw.check(&mut s, now, 1),
            Decision::Denied {
                retry_after: Some(retry),
                reset_after: secs(105)
            }
        );
        let one_ns = Duration::from_nanos(1);
        assert!(!sw.check(&mut s, now + retry - one_ns, 1).is_allowed());
        assert!(sw.check(&mut s, now + retry, 1).is_allowed());
    }

    #[test]
    fn counts_roll_over_one_window_then_clear_after_two() {
        let sw = SlidingWindow::new(50, Window::new(MINUTE));
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, start() + secs(5), 40).is_allowed());
        // Half-way through the next minute: 40 * 30/60 = 20 counted, 30 left.
        assert_eq!(sw.remaining(&s, start() + MINUTE + secs(30)), 30);
        // Two minutes on, nothing of the 40 overlaps the trailing minute.
        assert_eq!(sw.remaining(&s, start() + 2 * MINUTE), 50);
        assert_eq!(sw.remaining(&s, start() + 7 * MINUTE + secs(1)), 50);
        assert!(
            sw.check(&mut s, start() + 7 * MINUTE + secs(1), 50)
                .is_allowed()
        );
    }

    #[test]
    fn variable_cost_waits_for_enough_of_the_previous_window_to_fade() {
        let sw = SlidingWindow::new(10, Window::new(TEN_SECONDS));
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, start(), 10).is_allowed());
        // 5 s into the next window, 10 * 5/10 = 5 counted: cost 6 would make 11. It fits once
        // 10 * (10 - e)/10 + 6 <= 10, at e = 6 s: one second later.
        let now = start() + TEN_SECONDS + secs(5);
        let denied = sw.check(&mut s, now, 6);
        assert_eq!(
            denied,
            Decision::Denied {
                retry_after: Some(secs(1)),
                // The previous window's 10 slide out when this window ends.
                reset_after: secs(5)
            }
        );
        assert_eq!(
            sw.check(&mut s, now, 5),
            Decision::Allowed {
                remaining: 0,
                reset_after: secs(15)
            }
        );
        assert_eq!(
            sw.check(&mut s, now, 11),
            Decision::Denied {
                retry_after: None,
                reset_after: secs(15)
            }
        );
    }

    #[test]
    fn a_full_current_window_retries_into_the_next() {
        let sw = SlidingWindow::new(10, Window::new(TEN_SECONDS));
        let mut s = SlidingWindowState::default();
        let now = start() + secs(2);
        assert!(sw.check(&mut s, now, 10).is_allowed());
        // This window is full. In the next, the 10 count as previous: cost 4 fits once
        // 10 * (10 - e)/10 + 4 <= 10, at e = 4 s, which is 8 + 4 = 12 s from now.
        assert_eq!(
            sw.check(&mut s, now, 4),
            Decision::Denied {
                retry_after: Some(secs(12)),
                reset_after: secs(18)
            }
        );
        // A cost of the whole limit must wait until none of the 10 overlaps: the end of the
        // next window, 18 s from now.
        assert_eq!(
            sw.check(&mut s, now, 10),
            Decision::Denied {
                retry_after: Some(secs(18)),
                reset_after: secs(18)
            }
        );
    }

    #[test]
    fn spending_the_limit_at_a_boundary_leaves_the_next_window_to_refill_linearly() {
        let sw = SlidingWindow::new(10, Window::new(TEN_SECONDS));
        let mut s = SlidingWindowState::default();
        let boundary = start() + TEN_SECONDS;
        assert!(
            sw.check(&mut s, boundary - Duration::from_millis(1), 10)
                .is_allowed()
        );
        // Unlike a fixed window, the new window opens with the estimate still at 10: a unit
        // comes back each second as the previous window fades (10 * e/10 at e seconds).
        assert_eq!(sw.remaining(&s, boundary), 0);
        assert_eq!(sw.remaining(&s, boundary + secs(1)), 1);
        assert_eq!(sw.remaining(&s, boundary + secs(4)), 4);
    }

    #[test]
    fn the_estimate_is_not_a_trailing_window_bound() {
        let sw = SlidingWindow::new(10, Window::new(TEN_SECONDS));
        let mut s = SlidingWindowState::default();
        // 10 at the very end of one window, then 9.9 s into the next the estimate is
        // 10 * 0.1/10 = 0.1, so 9 more pass: 19 units within 9.901 s, because the estimate
        // takes the first 10 as spread over their window when they were all at its end.
        let first = start() + TEN_SECONDS - Duration::from_millis(1);
        assert!(sw.check(&mut s, first, 10).is_allowed());
        let second = start() + TEN_SECONDS + Duration::from_millis(9_900);
        assert!(sw.check(&mut s, second, 9).is_allowed());
        assert_eq!(sw.remaining(&s, second), 0);
        assert_eq!(
            second.saturating_duration_since(first),
            Duration::from_millis(9_901)
        );
    }

    #[test]
    fn a_clock_step_back_does_not_reopen_spent_quota() {
        let sw = SlidingWindow::new(10, Window::new(TEN_SECONDS));
        let mut s = SlidingWindowState::default();
        assert!(sw.check(&mut s, start() + TEN_SECONDS, 10).is_allowed());
        assert_eq!(sw.remaining(&s, start() + secs(9)), 0);
        assert!(!sw.check(&mut s, start() + secs(9), 1).is_allowed());
    }

    #[test]
    fn state_is_three_words() {
        assert_eq!(std::mem::size_of::<SlidingWindowState>(), 24);
    }

    /// `p * (W - e) + (c + k) * W <= limit * W`, from a tally of what was admitted per window.
    fn tally_admits(
        window: Window,
        admitted: &BTreeMap<WindowIndex, u64>,
        limit: u64,
        now: Timestamp,
        cost: u64,
    ) -> bool {
        let index = window.index(now);
        let count = |i: u64| u128::from(admitted.get(&WindowIndex(i)).copied().unwrap_or(0));
        let w = window.len().as_nanos();
        let e = now
            .saturating_duration_since(window.start(index))
            .as_nanos();
        let previous = if index.0 == 0 { 0 } else { count(index.0 - 1) };
        previous * (w - e) + (count(index.0) + u128::from(cost)) * w <= u128::from(limit) * w
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Against a tally of admitted units per window: a request passes exactly when the
        /// estimate plus its cost stays within the limit, so after every admission the estimate
        /// is at most the limit and no single window holds more than the limit; a denial charges
        /// nothing and its retry-after is exact.
        #[test]
        fn decisions_follow_the_estimate_of_the_tally(
            limit in 0u64..=40,
            window_ms in 1u64..=10_000,
            start_ms in 1_600_000_000_000u64..1_900_000_000_000,
            steps in prop::collection::vec((0u64..=1_500, 0u64..=30, 0u64..1_000), 1..80),
        ) {
            let window = Window::new(Duration::from_millis(window_ms));
            let sw = SlidingWindow::new(limit, window);
            let mut state = SlidingWindowState::default();
            let mut admitted: BTreeMap<WindowIndex, u64> = BTreeMap::new();
            let mut now = Timestamp::from_unix_millis(start_ms);
            for (gap_permille, cost, jitter_ns) in steps {
                now = now + Duration::from_micros(window_ms * gap_permille)
                    + Duration::from_nanos(jitter_ns);
                let fits = tally_admits(window, &admitted, limit, now, cost);
                let before = state;
                match sw.check(&mut state, now, cost) {
                    Decision::Allowed { remaining, .. } => {
                        prop_assert!(fits);
                        *admitted.entry(window.index(now)).or_default() += cost;
                        prop_assert!(tally_admits(window, &admitted, limit, now, 0));
                        prop_assert!(tally_admits(window, &admitted, limit, now, remaining));
                        prop_assert!(!tally_admits(window, &admitted, limit, now, remaining + 1));
                    }
                    Decision::Denied { retry_after, .. } => {
                        prop_assert!(!fits);
                        prop_assert_eq!(state, before);
                        match retry_after {
                            Some(after) => check_retry_is_exact(now, after, |t| {
                                sw.check(&mut state.clone(), t, cost).is_allowed()
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
