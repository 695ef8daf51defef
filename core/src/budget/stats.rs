//! Per-limit, per-window measurements for the over-admission bound and for metrics.
//!
//! The bound's measured terms come from here: settle overage, fail-open units and the time a
//! limit spent open. Denials and shadow would-denies are for operators.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::STATS_WINDOWS_KEPT;
use crate::time::WindowIndex;

/// What one limit did in one window, in this region.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Units settled above their reservation (charged even beyond the allowance).
    pub settle_overage_units: u64,
    /// Units admitted beyond the allowance by the open partition policy.
    pub fail_open_units: u64,
    /// Time the open partition policy was in force (contact with the coordinator expired).
    pub time_open: Duration,
    /// Requests and leases refused.
    pub denials: u64,
    /// Units of the refused requests (a refused lease counts the units it wanted).
    pub denied_units: u64,
    /// Shadow mode: requests the limit would have refused (they were let through).
    pub shadow_denials: u64,
    /// Shadow mode: units let through beyond the allowance.
    pub shadow_excess_units: u64,
}

/// The last [`STATS_WINDOWS_KEPT`] windows of one limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitStats {
    windows: BTreeMap<WindowIndex, WindowStats>,
}

impl LimitStats {
    pub fn window(&self, window: WindowIndex) -> Option<&WindowStats> {
        self.windows.get(&window)
    }

    /// Oldest first.
    pub fn windows(&self) -> impl Iterator<Item = (WindowIndex, &WindowStats)> {
        self.windows.iter().map(|(w, s)| (*w, s))
    }

    /// The stats of `window`, created if needed; `None` for a window older than all kept.
    pub(crate) fn window_mut(&mut self, window: WindowIndex) -> Option<&mut WindowStats> {
        if !self.windows.contains_key(&window) {
            let full = self.windows.len() >= STATS_WINDOWS_KEPT;
            if full && self.windows.keys().next().is_some_and(|w| window < *w) {
                return None;
            }
            self.windows.insert(window, WindowStats::default());
            while self.windows.len() > STATS_WINDOWS_KEPT {
                self.windows.pop_first();
            }
        }
        self.windows.get_mut(&window)
    }
}

/// Region-wide counters of things that went wrong in a bounded way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionStats {
    /// Idempotency entries forgotten before their TTL because the cache was full.
    pub idempotency_evicted_early: u64,
    /// Release requests not applied because too many acks were pending (resent later).
    pub release_requests_deferred: u64,
    /// Grants and release requests skipped: unknown limit, or no room for the key.
    pub sync_items_skipped: u64,
    /// Times the dirty tracker overflowed and the next drain became a full snapshot.
    pub dirty_overflows: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latest_windows_are_kept() {
        let mut s = LimitStats::default();
        for w in 0..10 {
            if let Some(x) = s.window_mut(WindowIndex(w)) {
                x.denials += 1;
            }
        }
        let kept: Vec<u64> = s.windows().map(|(w, _)| w.0).collect();
        assert_eq!(kept, vec![6, 7, 8, 9]);
        assert!(
            s.window_mut(WindowIndex(2)).is_none(),
            "a window older than all kept is not resurrected"
        );
    }
}
