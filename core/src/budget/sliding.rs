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
//!
//! Eventual mode (D83) has no table whose sum bounds the others. A region admitting by its
//! view holds `L - U` (`U` the others' assumed use of the current window) and takes the
//! weight off it: `n_r + U <= L - (1 - f') * P^`, with `P^` its view of every region's use of
//! the window before (its own count plus the others' as its view held them as that window
//! ended). What the view missed there is the window before's own eventual terms, which the
//! bound counts again (`previous_window`). A region admitting by its default share scales it
//! as in strict mode; there `P^` credits it with the part of its default share it left unused
//! only if it never reported the key in the window before (the others then counted it at that
//! share).

use std::time::Duration;

use super::admit::{Allowance, Ctx};
use super::key::{KeyState, PrevWindow};
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
    /// What `a` lets the region have used by now: a share scaled ([`Weight::scale`]), an
    /// eventual view's room less the weight ([`Weight::deduct`]).
    pub fn weigh(&self, a: &Allowance) -> u64 {
        if a.from_view {
            self.deduct(a.units)
        } else {
            self.scale(a.units)
        }
    }

    /// `ceil(overlap * P^ / W)`: the units of the window before the estimate still counts.
    fn weighed_previous_units(&self) -> u64 {
        let w = u128::from(self.window_nanos.max(1));
        let weighed =
            (u128::from(self.overlap_nanos) * u128::from(self.previous_units)).div_ceil(w);
        u64::try_from(weighed).unwrap_or(u64::MAX)
    }

    /// `A - ceil(overlap * P^ / W)`: an eventual view's room `A = L - U`, less what the window
    /// before still weighs in the estimate (D83).
    pub fn deduct(&self, allowance_units: u64) -> u64 {
        allowance_units.saturating_sub(self.weighed_previous_units())
    }

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

    /// When `units` (use after the request) fit `a` as [`Weight::weigh`] weighs it, if
    /// nothing else changes: the overlap falls by a nanosecond each nanosecond. `None` when
    /// only a later window can (more than the allowance).
    pub fn retry_at(&self, a: &Allowance, units: u64) -> Option<Timestamp> {
        if a.from_view {
            self.deducted_retry_at(a.units, units)
        } else {
            self.scaled_retry_at(a.units, units)
        }
    }

    /// [`Weight::retry_at`] of a view's room: `ceil(ov * P^ / W) <= A - units` holds once
    /// `ov <= (A - units) * W / P^`.
    fn deducted_retry_at(&self, allowance_units: u64, units: u64) -> Option<Timestamp> {
        if units > allowance_units {
            return None;
        }
        if self.previous_units == 0 {
            return Some(self.counted_from);
        }
        let room = u128::from(allowance_units - units) * u128::from(self.window_nanos);
        let overlap = (room / u128::from(self.previous_units)).min(u128::from(self.window_nanos));
        Some(self.after_overlap(overlap))
    }

    /// The instant the overlap falls to `overlap_nanos`.
    fn after_overlap(&self, overlap_nanos: u128) -> Timestamp {
        let elapsed = u128::from(self.window_nanos) - overlap_nanos;
        let elapsed = Duration::from_nanos(u64::try_from(elapsed).unwrap_or(u64::MAX));
        self.counted_from.saturating_add(elapsed)
    }

    /// [`Weight::retry_at`] of a scaled share.
    fn scaled_retry_at(&self, allowance_units: u64, units: u64) -> Option<Timestamp> {
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
        Some(self.after_overlap(overlap))
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
    if p.is_eventual() && ctx.coordinated {
        return eventual_previous_units(p, ks.window, prev, ctx);
    }
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

/// Eventual mode's `P^` (D83), at most `L`:
/// - reported in the window before, with a view of the counter fresh as that window ended
///   (its entries came with the answer to a SyncUp sent at most `view_ttl` before the end):
///   its own use there plus the others' as the view held them. What they admitted since that
///   SyncUp is the window before's own eventual terms;
/// - never reported there, by a region that counted the whole of it: the others counted it
///   at its default share (unheard), so they held at most `L - d_r`, and `P^` is that plus
///   its own use;
/// - otherwise (a view too old, a start or reload in the window before, a restore that shuts
///   it): `L`.
fn eventual_previous_units(
    p: &LimitParams,
    window: WindowIndex,
    prev: Option<PrevWindow>,
    ctx: &Ctx,
) -> u64 {
    let quota = p.quota_units();
    let Some(before) = window.0.checked_sub(1).map(WindowIndex) else {
        return quota;
    };
    if ctx.restore.shuts(p.window_start(before)) {
        return quota;
    }
    let fresh_from = p.window_end(before).saturating_sub(ctx.view_ttl);
    let counted_whole = p.holds_previous_window(before);
    let units = match prev {
        Some(prev) if prev.reported => match prev.remote {
            Some((remote_units, at)) if at >= fresh_from => {
                prev.net_units.saturating_add(remote_units)
            }
            _ => quota,
        },
        Some(prev) if counted_whole => unheard_previous_units(p, prev.net_units),
        None if counted_whole => unheard_previous_units(p, 0),
        _ => quota,
    };
    units.min(quota)
}

/// `L - d_r + n_r`: the others counted this region at its default share `d_r`.
fn unheard_previous_units(p: &LimitParams, used_units: u64) -> u64 {
    let quota = p.quota_units();
    quota
        .saturating_sub(p.default_units)
        .saturating_add(used_units)
}
