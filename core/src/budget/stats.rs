//! Per-limit, per-window measurements for the over-admission bound and for metrics.
//!
//! The bound's measured terms come from here: settle overage, fail-open units, the time a
//! limit spent open and the peak grant rate, sent to the coordinator in every SyncUp until it
//! confirms them. Denials and shadow would-denies are for operators.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::config::STATS_WINDOWS_KEPT;
use crate::sync::BoundFigures;
use crate::time::{Timestamp, WindowIndex, duration_nanos};

/// What one limit did in one window, in this region.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowStats {
    /// Units settled above their reservation (charged even beyond the allowance).
    pub settle_overage_units: u64,
    /// Units settles claimed above their cap (`max_settle_overage`): not charged. Reported
    /// with the bound figures (a window with any is unbounded; the coordinator keeps the
    /// largest reported) and persisted (`PersistRecord::StatsUncharged`), so a restart before
    /// the next SyncUp still reports it. The region-wide total is in [`RegionStats`].
    #[serde(default)]
    pub settle_clamped_units: u64,
    /// Units gateways reported admitted that no lease could be charged with
    /// ([`crate::sync::BoundFigures::uncharged_units`]). Persisted, as above.
    #[serde(default)]
    pub uncharged_units: u64,
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
    /// Most units granted (acquires and leases, every key) in one second of the window, the
    /// second in progress included.
    pub peak_grant_units_per_sec: u64,
    /// The second in progress (index of `GRANT_RATE_BUCKET` since the epoch) and the units
    /// granted in it so far.
    #[serde(skip)]
    pub(crate) grant_bucket: (u64, u64),
    /// The bound figures the coordinator has confirmed receiving.
    #[serde(skip)]
    pub(crate) acked: BoundFigures,
    /// A summed bound figure changed since it was last written to the store.
    #[serde(skip)]
    pub(crate) unsaved: bool,
    /// A record of this window is in the store (so dropping the window leaves a tombstone).
    #[serde(skip)]
    pub(crate) saved: bool,
}

/// Grant rates are measured over buckets this long (or the window, if shorter).
pub const GRANT_RATE_BUCKET: Duration = Duration::from_secs(1);

impl WindowStats {
    /// The figures the coordinator needs for the bound.
    pub fn bound_figures(&self) -> BoundFigures {
        BoundFigures {
            time_open: self.time_open,
            fail_open_units: self.fail_open_units,
            settle_overage_units: self.settle_overage_units,
            peak_grant_units_per_sec: self.peak_grant_units_per_sec,
            settle_clamped_units: self.settle_clamped_units,
            uncharged_units: self.uncharged_units,
        }
    }

    /// The summed figures are persisted: the coordinator merges reports by max, so a region
    /// restarting from zero would hide what it measured before the crash.
    pub(crate) fn add_settle_overage(&mut self, units: u64) {
        self.settle_overage_units = self.settle_overage_units.saturating_add(units);
        self.unsaved = true;
    }

    pub(crate) fn add_settle_clamped(&mut self, units: u64) {
        self.settle_clamped_units = self.settle_clamped_units.saturating_add(units);
        self.unsaved = true;
    }

    pub(crate) fn add_uncharged(&mut self, units: u64) {
        self.uncharged_units = self.uncharged_units.saturating_add(units);
        self.unsaved = true;
    }

    pub(crate) fn add_fail_open(&mut self, units: u64) {
        self.fail_open_units = self.fail_open_units.saturating_add(units);
        self.unsaved = true;
    }

    pub(crate) fn add_time_open(&mut self, time: Duration) {
        self.time_open = self.time_open.saturating_add(time);
        self.unsaved = true;
    }

    /// `units` granted at `now`, for the peak grant rate. `bucket` is the rate's bucket (at
    /// most a second, the window if shorter); the rate is scaled to units per second.
    pub(crate) fn record_grant(&mut self, now: Timestamp, bucket: Duration, units: u64) {
        let bucket_nanos = duration_nanos(bucket).max(1);
        let index = now.as_unix_nanos() / bucket_nanos;
        let (current, so_far) = self.grant_bucket;
        let in_bucket = if current == index {
            so_far.saturating_add(units)
        } else {
            units
        };
        self.grant_bucket = (index, in_bucket);
        let per_sec = u128::from(in_bucket) * 1_000_000_000 / u128::from(bucket_nanos);
        let per_sec = u64::try_from(per_sec).unwrap_or(u64::MAX);
        self.peak_grant_units_per_sec = self.peak_grant_units_per_sec.max(per_sec);
    }

    /// Figures changed since the coordinator last confirmed them (never an all-zero report).
    pub(crate) fn unconfirmed_figures(&self) -> Option<BoundFigures> {
        let figures = self.bound_figures();
        (figures != self.acked && !figures.is_zero()).then_some(figures)
    }
}

/// The last [`STATS_WINDOWS_KEPT`] windows of one limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitStats {
    windows: BTreeMap<WindowIndex, WindowStats>,
    /// Windows dropped while a record of theirs was in the store: tombstones to write.
    dropped_saved: Vec<WindowIndex>,
}

impl LimitStats {
    pub fn window(&self, window: WindowIndex) -> Option<&WindowStats> {
        self.windows.get(&window)
    }

    /// Oldest first.
    pub fn windows(&self) -> impl Iterator<Item = (WindowIndex, &WindowStats)> {
        self.windows.iter().map(|(w, s)| (*w, s))
    }

    /// Windows whose summed figures must be written to the store (or erased from it), each
    /// at most once; clears the marks.
    pub(crate) fn take_unsaved(&mut self) -> Vec<WindowIndex> {
        let mut out = std::mem::take(&mut self.dropped_saved);
        for (w, s) in self.windows.iter_mut().filter(|(_, s)| s.unsaved) {
            s.unsaved = false;
            s.saved = true;
            out.push(*w);
        }
        out
    }

    /// Restore the summed figures of one window from the store (merged by max).
    pub(crate) fn restore(&mut self, window: WindowIndex, figures: BoundFigures) {
        if let Some(s) = self.window_mut(window) {
            s.time_open = s.time_open.max(figures.time_open);
            s.fail_open_units = s.fail_open_units.max(figures.fail_open_units);
            s.settle_overage_units = s.settle_overage_units.max(figures.settle_overage_units);
            s.settle_clamped_units = s.settle_clamped_units.max(figures.settle_clamped_units);
            s.uncharged_units = s.uncharged_units.max(figures.uncharged_units);
            s.saved = true;
        }
    }

    /// Forget a window the store no longer holds.
    pub(crate) fn forget(&mut self, window: WindowIndex) {
        self.windows.remove(&window);
    }

    /// The stats of `window` if they are still kept (never created).
    pub(crate) fn window_mut_if_kept(&mut self, window: WindowIndex) -> Option<&mut WindowStats> {
        self.windows.get_mut(&window)
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
                if let Some((w, old)) = self.windows.pop_first()
                    && old.saved
                {
                    self.dropped_saved.push(w);
                }
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
    /// Grants and release requests skipped: unknown limit, no room for the key, or sent under
    /// another configuration version than the region's.
    pub sync_items_skipped: u64,
    /// Times the dirty tracker overflowed and the next drain became a full snapshot.
    pub dirty_overflows: u64,
    /// Units settles claimed above their limit's `max_settle_overage`, clamped (not charged):
    /// use a spender let through beyond the cap the bound assumes.
    #[serde(default)]
    pub settle_clamped_units: u64,
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
