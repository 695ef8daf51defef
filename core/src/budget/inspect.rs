//! Read-only views of one key, for operators (the agent's key view): what the region holds
//! for it now, computed without changing anything.

use serde::Serialize;

use super::admit;
use super::key::KeyState;
use super::sliding;
use super::{Reason, RegionBudget, ctx_of};
use crate::error::{Error, Result};
use crate::ids::{KeyId, LeaseId, LimitId};
use crate::time::{Timestamp, WindowIndex};

/// One key of one limit, as the region sees it at `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyView {
    /// The window of `now` (always 0 for an unlimited limit).
    pub window: WindowIndex,
    pub window_start: Timestamp,
    pub window_end: Timestamp,
    /// Own counter entries for that window (zero when the key was last used earlier).
    pub granted_units: u64,
    pub refunded_units: u64,
    /// The part of `granted_units` admitted at the end of the window before, in its end band
    /// (docs/budget.md, edge band): counted in both windows, since the clock may already
    /// be in this one.
    pub carried_in_units: u64,
    /// The allowance `a_r` in force, and what decides it.
    pub allowance_units: u64,
    pub reason: Reason,
    /// The allowance comes from the coordinator (a grant, or what a release left), not from
    /// the default share.
    pub explicit_allowance: bool,
    /// A sliding-window rule: what the window before's weight lets the key have used of its
    /// allowance by now (D54; in eventual mode D83). `None` for a fixed window.
    pub weighted_allowance_units: Option<u64>,
    /// `a_r - n_r`, or under a sliding window the weighted allowance less `n_r`: what the
    /// next call could be granted, rate cap aside.
    pub remaining_units: u64,
    /// Outstanding leases of the window (their units are in `granted_units`).
    pub leases: Vec<LeaseView>,
    /// Concurrency slots held.
    pub slots_in_use: u32,
    /// The key is reported to the coordinator (demand beyond its allowance, or named by it).
    pub reported: bool,
    /// The region holds state for the key; `false` means it would start fresh.
    pub tracked: bool,
    /// The window just before `window`, as its counter ended, while the key remembers it
    /// (it rolled straight from it, and the soft state was not compacted): what the region
    /// admitted there, readable after the window ended (`allot demo` judges windows by it).
    pub previous_window: Option<PreviousWindow>,
    /// An operator watches the key ([`RegionBudget::watch_key`]).
    pub watched: bool,
    /// Watched: the windows it closed since (the last few), oldest first, as their counters
    /// ended.
    pub closed_windows: Vec<PreviousWindow>,
}

/// A window that ended, as one key's counter closed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PreviousWindow {
    pub window: WindowIndex,
    /// `granted - refunded` when the window ended (its leases ended with it, so this is final).
    pub net_units: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    pub lease: LeaseId,
    pub units: u64,
    pub expires_at: Timestamp,
}

impl RegionBudget {
    /// The window of `limit` that `at` falls in; `None` for an unknown limit.
    pub fn window_index_of(&self, limit: &LimitId, at: Timestamp) -> Option<WindowIndex> {
        self.limits.get(limit).map(|l| l.params.window_index(at))
    }

    /// The key's state at `now`, as the next call would find it (a key of an earlier window
    /// shows as rolled over).
    pub fn key_view(&self, now: Timestamp, limit: &LimitId, key: &KeyId) -> Result<KeyView> {
        let lim = self
            .limits
            .get(limit)
            .ok_or_else(|| Error::UnknownLimit(limit.clone()))?;
        let p = &lim.params;
        let tracked = lim.keys.get(key.as_str());
        let now_window = p.window_index(now);
        let mut ks = tracked
            .cloned()
            .unwrap_or_else(|| KeyState::new(now_window));
        // The counter as last written: the window before's final count, if time has moved
        // on since and nothing rolled the key yet.
        let unrolled = PreviousWindow {
            window: ks.window,
            net_units: ks.net_units(),
        };
        ks.roll(now_window, p.keep());
        let ctx = ctx_of(&self.cfg, &self.view, now);
        let allowance = admit::allowance(p, &ks, ks.window, &ctx);
        let weighted = sliding::weight(p, &ks, &ctx, now).map(|w| w.weigh(&allowance));
        let hot = ks.hot.as_deref();
        let leases = hot
            .map(|h| {
                h.leases
                    .iter()
                    .filter_map(|id| {
                        self.leases.get(*id).map(|l| LeaseView {
                            lease: *id,
                            units: l.units,
                            expires_at: l.expires_at,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let reason = if !p.spec.enabled {
            Reason::Disabled
        } else if p.quota.is_none() {
            Reason::Unlimited
        } else {
            allowance.reason
        };
        Ok(KeyView {
            window: ks.window,
            window_start: p.window_start(ks.window),
            window_end: p.window_end(ks.window),
            granted_units: ks.granted_units,
            refunded_units: ks.refunded_units,
            carried_in_units: hot.map_or(0, |h| h.carried_in_units),
            allowance_units: allowance.units,
            reason,
            explicit_allowance: ks.explicit_allowance(ks.window).is_some(),
            weighted_allowance_units: weighted,
            remaining_units: weighted
                .unwrap_or(allowance.units)
                .saturating_sub(ks.net_units()),
            leases,
            slots_in_use: hot.map_or(0, |h| h.slots.in_use()),
            reported: ks.is_reported(),
            tracked: tracked.is_some(),
            previous_window: previous_window(&ks, unrolled),
            watched: lim.watched.is_watched(key.as_str()),
            closed_windows: lim.watched.closed_windows(key.as_str()),
        })
    }

    /// Remember the final counts of `key`'s next windows as they close (soft state, a few
    /// keys per limit: the one watched longest ago makes room). Watching a watched key again
    /// keeps it longer.
    pub fn watch_key(&mut self, limit: &LimitId, key: &KeyId) -> Result<()> {
        let lim = self
            .limits
            .get_mut(limit)
            .ok_or_else(|| Error::UnknownLimit(limit.clone()))?;
        lim.watched.watch(key.as_str());
        Ok(())
    }
}

/// The window just before the key's, as its counter ended: kept by the key's boxed part
/// since its roll, or still unrolled in the key (a key not used since the window ended).
fn previous_window(ks: &KeyState, unrolled: PreviousWindow) -> Option<PreviousWindow> {
    let window = WindowIndex(ks.window.0.checked_sub(1)?);
    if let Some(p) = ks.hot.as_ref().and_then(|h| h.prev) {
        let net_units = p.net_units;
        return Some(PreviousWindow { window, net_units });
    }
    (unrolled.window == window).then_some(unrolled)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::budget::{AcquireRequest, BudgetConfig, LeaseOutcome, LeaseRequest};
    use crate::ids::RegionId;
    use crate::limit::LimitSpec;

    #[test]
    fn the_view_shows_counters_leases_and_what_is_left() {
        let spec = LimitSpec::simple("d/k", 100, Duration::from_secs(60));
        let cfg = BudgetConfig::single_region(RegionId::from("r"));
        let mut b = RegionBudget::new(cfg, [spec]).expect("budget");
        let (limit, key) = (LimitId::new("d/k"), KeyId::new("k=1"));
        // 30 s into a 60 s window.
        let now = Timestamp::from_unix_millis(1_800_000_030_000);
        let acquire = AcquireRequest {
            limit: limit.clone(),
            key: key.clone(),
            cost_units: 10,
            request_id: None,
        };
        b.acquire(now, acquire).expect("acquire");
        let lease = LeaseRequest {
            limit: limit.clone(),
            key: key.clone(),
            units_wanted: 25,
            min_units: 1,
            denied_units: 0,
            rate_units_per_sec: None,
            ttl: Duration::from_secs(5),
            request_id: None,
        };
        let LeaseOutcome::Granted(grant) = b.lease(now, lease).expect("lease") else {
            panic!("granted")
        };
        let view = b.key_view(now, &limit, &key).expect("view");
        // 10 acquired + 25 leased = 35 of 100: 65 left; the window is [.. 00 s, .. 60 s).
        assert_eq!(view.granted_units, 35);
        assert_eq!(view.remaining_units, 65);
        assert_eq!(view.allowance_units, 100);
        assert_eq!(view.reason, Reason::Allowance);
        assert_eq!(
            view.window_start,
            Timestamp::from_unix_millis(1_800_000_000_000)
        );
        assert_eq!(
            view.leases,
            vec![LeaseView {
                lease: grant.lease,
                units: 25,
                expires_at: now + Duration::from_secs(5),
            }]
        );
        assert!(view.tracked);
        // A minute later the key reads as rolled over, and nothing was changed by looking.
        let later = b
            .key_view(now + Duration::from_secs(60), &limit, &key)
            .expect("view");
        assert_eq!((later.granted_units, later.remaining_units), (0, 100));
        // The window that ended still reads: 35 granted, nothing refunded.
        assert_eq!(
            later.previous_window,
            Some(PreviousWindow {
                window: view.window,
                net_units: 35,
            })
        );
        assert_eq!(view.previous_window, None, "no window before the first use");
        assert!(
            !b.key_view(now, &limit, &KeyId::new("k=2"))
                .expect("view")
                .tracked
        );
        assert_eq!(
            b.drain_dirty().len(),
            5,
            "the limit's allocation (from the start), meta, key, lease and the calls' time: from the calls only"
        );
        // A key used by single acquires only, read a window later: its count as it ended.
        let other = KeyId::new("k=3");
        let one = AcquireRequest {
            limit: limit.clone(),
            key: other.clone(),
            cost_units: 7,
            request_id: None,
        };
        b.acquire(now, one).expect("acquire");
        let later = b
            .key_view(now + Duration::from_secs(60), &limit, &other)
            .expect("view");
        assert_eq!(
            later.previous_window,
            Some(PreviousWindow {
                window: view.window,
                net_units: 7,
            })
        );
        assert_eq!(
            b.key_view(now + Duration::from_secs(120), &limit, &other)
                .expect("view")
                .previous_window,
            None,
            "the window before that one had no use"
        );
    }

    /// A key with no boxed part forgets its window before when it rolls, so a key used in
    /// every window never shows `previous_window`; a watched one keeps the closed counts,
    /// whatever rolls it (a call, the sweep) and however far time jumps.
    #[test]
    fn a_watched_key_keeps_the_counts_of_windows_it_rolled_past() {
        let spec = LimitSpec::simple("d/k", 100, Duration::from_secs(60));
        let cfg = BudgetConfig::single_region(RegionId::from("r"));
        let mut b = RegionBudget::new(cfg, [spec]).expect("budget");
        let (limit, key) = (LimitId::new("d/k"), KeyId::new("k=1"));
        let start = Timestamp::from_unix_millis(1_800_000_000_000);
        let minute = Duration::from_secs(60);
        let acquire = |b: &mut RegionBudget, at: Timestamp, cost_units: u64| {
            let req = AcquireRequest {
                limit: limit.clone(),
                key: key.clone(),
                cost_units,
                request_id: None,
            };
            b.acquire(at, req).expect("acquire");
        };
        acquire(&mut b, start, 3);
        acquire(&mut b, start + minute, 4);
        let unwatched = b.key_view(start + minute, &limit, &key).expect("view");
        assert_eq!(unwatched.previous_window, None, "rolled, and forgotten");
        assert!(!unwatched.watched && unwatched.closed_windows.is_empty());

        b.watch_key(&limit, &key).expect("watch");
        acquire(&mut b, start + minute * 2, 5);
        // Rolled by the sweep, not a call, which then drops the key as idle: the watch
        // outlives it. Three quiet windows later a call starts the key again.
        b.handle_timeout(start + minute * 3);
        acquire(&mut b, start + minute * 7, 6);
        let view = b.key_view(start + minute * 7, &limit, &key).expect("view");
        let w0 = view.window.0 - 7;
        let closed: Vec<_> = view
            .closed_windows
            .iter()
            .map(|c| (c.window.0 - w0, c.net_units))
            .collect();
        assert!(view.watched);
        assert_eq!(closed, vec![(1, 4), (2, 5)]);
        assert!(
            b.watch_key(&LimitId::new("nope"), &key).is_err(),
            "an unknown limit"
        );
    }
}
