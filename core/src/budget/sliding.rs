//! The sliding window across regions (docs/decisions.md, D54; docs/bound.md, sliding_window).
//!
//! The contract is the sliding window counter's estimate over the whole deployment:
//! `P * (1 - f) + C <= L`, `P` the units of the window before, `C` those of the current window
//! so far, `f` the elapsed fraction of the current window. No region knows `P`; each knows an
//! upper bound `P^`, and admits in the current window only up to its allowance scaled by the
//! share of the quota the window before leaves:
//!
//! ```text
//! n_r <= A_r * (1 - (1 - f') * P^ / L)
//! ```
//!
//! With `sum_r A_r <= L` (strict mode) the regions' sum is then at most `L - (1 - f) * P^`, so
//! the estimate stays within `L`. `P^` is the quota less what this region left unused of its
//! own allowance of the window before: the others held at most `L` less that allowance (the
//! table's sum), so they used at most that. `f'` is read at the earliest instant the region's
//! clock uncertainty allows (the edge band's `e`), so a clock ahead never reads a larger weight
//! than the true one.

use std::time::Duration;

use super::admit::Ctx;
use super::key::KeyState;
use super::limits::LimitParams;
use crate::limit::PartitionPolicy;
use crate::time::{Timestamp, WindowIndex, duration_nanos};

/// The weight of the window before for a key of a sliding limit at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Weight {
    /// `P^`: an upper bound on what every region admitted in the window before, at most `L`.
    pub previous_units: u64,
    /// `L`.
    pub quota_units: u64,
    /// `W`, in nanoseconds.
    pub window_nanos: u64,
    /// `W * (1 - f')`: how much of the window before the trailing window still covers.
    pub overlap_nanos: u64,
    /// When the current window starts, plus the edge band (`f'` counts from there).
    pub counted_from: Timestamp,
}

impl Weight {
    /// `floor(A * (1 - overlap * P^ / (W * L)))`: what an allowance of `allowance_units` lets
    /// the region have used by now.
    pub fn scale(&self, allowance_units: u64) -> u64 {
        let whole = u128::from(self.window_nanos) * u128::from(self.quota_units);
        if whole == 0 {
            return 0;
        }
        let faded = u128::from(self.overlap_nanos) * u128::from(self.previous_units);
        let scaled = u128::from(allowance_units) * whole.saturating_sub(faded) / whole;
        // At most `allowance_units`, so it fits.
        u64::try_from(scaled).unwrap_or(allowance_units)
    }

    /// The smallest allowance under which `used_units` are within [`Weight::scale`] now
    /// (`None`: no allowance is, the window before still weighs all of the quota). Since the
    /// weight only falls as the window goes on, that allowance keeps them within it to the
    /// window's end: a release never leaves a region above its scaled share.
    pub fn allowance_for(&self, used_units: u64) -> Option<u64> {
        if used_units == 0 {
            return Some(0);
        }
        let whole = u128::from(self.window_nanos) * u128::from(self.quota_units);
        let faded = u128::from(self.overlap_nanos) * u128::from(self.previous_units);
        let left = whole.checked_sub(faded).filter(|l| *l > 0)?;
        let units = (u128::from(used_units) * whole).div_ceil(left);
        u64::try_from(units).ok()
    }

    /// When `units` (use after the request) fit the scaled `allowance_units`, if nothing else
    /// changes: the overlap falls by a nanosecond each nanosecond. `None` when only a later
    /// window can (more than the allowance).
    pub fn retry_at(&self, allowance_units: u64, units: u64) -> Option<Timestamp> {
        if units > allowance_units {
            return None;
        }
        if self.previous_units == 0 || allowance_units == 0 {
            return Some(self.counted_from);
        }
        // floor(A * (WL - ov * P) / WL) >= units  <=>  ov <= (A - units) * WL / (A * P).
        let whole = u128::from(self.window_nanos) * u128::from(self.quota_units);
        let room = u128::from(allowance_units - units) * whole;
        let per_overlap = u128::from(allowance_units) * u128::from(self.previous_units);
        let overlap = (room / per_overlap).min(u128::from(self.window_nanos));
        let elapsed = u128::from(self.window_nanos) - overlap;
        let elapsed = Duration::from_nanos(u64::try_from(elapsed).unwrap_or(u64::MAX));
        Some(self.counted_from.saturating_add(elapsed))
    }
}

/// The weight for `ks` (rolled to its window) at `now`, `None` for a limit that does not count
/// by the sliding window.
pub(crate) fn weight(p: &LimitParams, ks: &KeyState, ctx: &Ctx, now: Timestamp) -> Option<Weight> {
    if !p.is_sliding() {
        return None;
    }
    let window_nanos = duration_nanos(p.window_len()).max(1);
    let band = ctx.edge_band.unwrap_or(Duration::ZERO);
    let counted_from = p.window_start(ks.window).saturating_add(band);
    let elapsed_nanos = duration_nanos(now.saturating_duration_since(counted_from));
    Some(Weight {
        previous_units: previous_units(p, ks, ctx),
        quota_units: p.quota_units(),
        window_nanos,
        overlap_nanos: window_nanos.saturating_sub(elapsed_nanos),
        counted_from,
    })
}

/// `P^ = L - (A_r(before) - n_r(before) - band)+`, at most `L`: the quota less what this
/// region left unused of its allowance of the window before. `L` where its use there is not
/// known (a restart, a reload to the sliding window), or where its allowance there may have
/// gone to others (a closed partition policy without a grant: its floor can be reclaimed).
fn previous_units(p: &LimitParams, ks: &KeyState, ctx: &Ctx) -> u64 {
    let quota = p.quota_units();
    let prev = ks.hot.as_deref().and_then(|h| h.prev);
    let (used, explicit) = match prev {
        Some(prev) => (
            prev.net_units.saturating_add(prev.band_units),
            prev.explicit_units,
        ),
        None if p.holds_previous_window(ks.window) => (0, None),
        None => return quota,
    };
    let Some(before) = ks.window.0.checked_sub(1).map(WindowIndex) else {
        return quota;
    };
    let held = held_before(p, ctx, before, explicit);
    quota.saturating_sub(held.saturating_sub(used)).min(quota)
}

/// What this region surely held of the window before, which no other region could use: its
/// explicit grant, else its default share, except where that may have been reclaimed or a
/// restored start shuts the window (nothing).
fn held_before(p: &LimitParams, ctx: &Ctx, before: WindowIndex, explicit: Option<u64>) -> u64 {
    if !ctx.coordinated {
        return p.quota_units();
    }
    if ctx.restore.shuts(p.window_start(before)) {
        return 0;
    }
    match (explicit, p.spec.partition_policy) {
        (Some(units), _) => units,
        (None, PartitionPolicy::Closed) => 0,
        (None, PartitionPolicy::Floor | PartitionPolicy::Open { .. }) => p.default_units,
    }
}
