//! Per-key state: one counter pair for the key's current window, and a boxed part for the
//! rarely used rest.
//!
//! A limit may track a million keys, nearly all of them cold: used a little, never escalated,
//! holding the default allowance. A cold key is 32 bytes ([`KeyState`]); leases, grants, the
//! remote view, escalation and rate-cap state live in [`HotState`], allocated only for keys
//! that need one and dropped again once they go quiet.

use std::collections::BTreeSet;

use crdts::VClock;

use super::config::MAX_FUTURE_WINDOWS;
use crate::algo::concurrency::SlotSet;
use crate::algo::gcra::GcraState;
use crate::ids::{Epoch, LeaseId, RegionId};
use crate::time::{Timestamp, WindowIndex};

/// The state of one key of one limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyState {
    /// The window `granted_units` and `refunded_units` count for.
    pub window: WindowIndex,
    /// Own G-counter entry: units charged in `window` (acquires, leases, settle overage).
    pub granted_units: u64,
    /// Own G-counter entry: units given back in `window` (lease releases, settles).
    pub refunded_units: u64,
    pub hot: Option<Box<HotState>>,
}

/// An explicit allowance (a grant, or what a release left) for one window, with its epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowAllowance {
    pub window: WindowIndex,
    pub allowance_units: u64,
    pub epoch: Epoch,
}

/// The other regions of an eventual limit, as admission must assume them (see
/// [`HotState::assumed_remote_units`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct OtherRegions {
    /// Each other region's default share `floor(w_j * L)`.
    pub default_units: Vec<(RegionId, u64)>,
    /// `L` minus every region's default share (own included): held by nobody by default.
    pub unassigned_units: u64,
}

/// What the start band of a window may still count against the window before it (docs/budget.md,
/// edge band): that window's use as it ended and the explicit allowance it had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PrevWindow {
    pub net_units: u64,
    pub explicit_units: Option<u64>,
    /// Units admitted in the current window's start band, each counted against the window
    /// before too.
    pub band_units: u64,
    /// Eventual sliding only (D83): this region's entry of that window may have reached the
    /// coordinator (the key was reported in it), so the other regions counted this one at
    /// its reported use, not at its default share.
    pub reported: bool,
    /// Eventual sliding only (D83): the other regions' use of that window as this region's
    /// view of the counter held it as the window ended (`assumed_remote_units`), and the
    /// send time of the SyncUp whose answer last carried the counter's entries. `None`: the
    /// region held no view of the counter.
    pub remote: Option<(u64, Timestamp)>,
}

/// What a key keeps of the window a roll ends, besides the start band's count of a hot key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Keep<'a> {
    /// A fixed window: nothing more.
    Band,
    /// A sliding window (D54): its use, for a cold key too.
    Use,
    /// A sliding window in eventual mode (D83): its use, and what the view held of the other
    /// regions' (counted as [`HotState::assumed_remote_units`] does with these regions).
    UseAndView(&'a OtherRegions),
}

/// Final counter values of a window that ended before the coordinator acknowledged them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClosingEntry {
    pub window: WindowIndex,
    pub granted_units: u64,
    pub refunded_units: u64,
}

impl ClosingEntry {
    pub fn net_units(&self) -> u64 {
        self.granted_units.saturating_sub(self.refunded_units)
    }
}

/// Which epochs [`HotState::apply_allowance`] takes for the current window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpochRule {
    /// A coordinator's answer: only a newer epoch.
    Newer,
    /// A store record replayed at a restart: an equal epoch too.
    SameToo,
}

/// The rarely used parts of a key. Everything here is for `KeyState::window` unless it says
/// otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HotState {
    /// Explicit allowance for the current window, and the last epoch applied to it (grants
    /// and release requests share one epoch sequence per counter).
    pub allowance: Option<u64>,
    pub epoch: Epoch,
    /// Pre-issued allowances for later windows, oldest first, at most [`MAX_FUTURE_WINDOWS`].
    pub future: Vec<WindowAllowance>,
    /// Outstanding leases of the current window (at most `max_leases_per_key`).
    pub leases: Vec<LeaseId>,
    /// Concurrency slots held (not per window).
    pub slots: SlotSet,
    /// Rate-cap GCRA state, only for rate-capped limits.
    pub rate: Option<GcraState>,
    /// GCRA state of the open partition policy's cap.
    pub open_rate: Option<GcraState>,
    /// Units refused this window: part of the demand estimate.
    pub denied_units: u64,
    /// The agent refused a request or lease for this key in this window. A gateway refuses
    /// by itself only after the agent refused it, so units a gateway reports as refused
    /// locally belong to this window only if this is set; otherwise they were refused in an
    /// earlier window (a denial that held until that window's end) and are no demand here.
    pub refused_this_window: bool,
    /// Units above the allowance that policy let in this window (settle overage, fail-open,
    /// shadow): invariant 1 allows exactly these.
    pub excess_units: u64,
    /// The part of `excess_units` the open partition policy let in: at most what its rate
    /// admits over the time the region has been open in this window (docs/bound.md).
    pub fail_open_units: u64,
    /// Demand exceeded the allowance, or a request was refused: report to the coordinator.
    pub escalated: bool,
    /// The coordinator named this counter (entries, grant, release): report it too.
    pub mentioned: bool,
    /// An answer carried this counter's entries, and an answer carries a counter whole (every
    /// entry the coordinator holds for it): eventual mode may trust the remote view. Only
    /// entries set it, never the confirmation of a SyncUp, whose answer may have left the
    /// counter out for lack of room.
    pub known_to_coordinator: bool,
    /// Send time (agent clock) of the SyncUp whose answer last carried this counter's
    /// entries: the view of this counter is as old as that, whatever the region's contact.
    pub entries_at: Option<Timestamp>,
    /// Other regions' G-counter entries, merged by max.
    pub remote_granted: VClock<RegionId>,
    pub remote_refunded: VClock<RegionId>,
    /// Regions whose entry the view holds, zero entries included (a `VClock` does not keep
    /// zeros, and "reported zero" must not read as "never reported").
    pub remote_seen: BTreeSet<RegionId>,
    /// The coordinator (its current leader) confirmed receiving an entry of this window from
    /// this region, zero included: until then the entry is sent even at zero, so the other
    /// regions count this one as heard (at its use) rather than at its default share.
    pub entry_confirmed: bool,
    /// Own entries as far as the coordinator has confirmed receiving them.
    pub acked_granted_units: u64,
    pub acked_refunded_units: u64,
    pub closing: Option<ClosingEntry>,
    /// Units admitted in this window's end band, each counted against the next window too: a
    /// roll to exactly the next window starts its counter at these (docs/budget.md, edge
    /// band). Persisted with the key.
    pub carry_units: u64,
    /// The window just before this one, while this one's start band may count against it:
    /// soft state (lost in a compaction or restart, and the start band refuses again).
    pub prev: Option<PrevWindow>,
    /// The units this window's counter started at (the window before's carry): counted
    /// against it, but requested in the window before, so no demand here.
    pub carried_in_units: u64,
}

impl KeyState {
    pub fn new(window: WindowIndex) -> Self {
        KeyState {
            window,
            ..KeyState::default()
        }
    }

    /// Net use `n_r = granted - refunded`, outstanding leases included.
    pub fn net_units(&self) -> u64 {
        debug_assert!(self.refunded_units <= self.granted_units);
        self.granted_units.saturating_sub(self.refunded_units)
    }

    pub fn hot_mut(&mut self) -> &mut HotState {
        self.hot.get_or_insert_with(Box::default)
    }

    pub fn is_reported(&self) -> bool {
        self.hot.as_ref().is_some_and(|h| h.is_reported())
    }

    /// The explicit allowance in force for `window` (the key's own window or a later one).
    pub fn explicit_allowance(&self, window: WindowIndex) -> Option<u64> {
        let hot = self.hot.as_ref()?;
        if window == self.window {
            return hot.allowance;
        }
        hot.future
            .iter()
            .find(|f| f.window == window)
            .map(|f| f.allowance_units)
    }

    /// Move to `window` if it is later: counters restart at zero, a pre-issued allowance for
    /// it takes effect, and unacknowledged final values of a reported counter are kept aside
    /// for the next SyncUp. Time never moves a key back. Returns true if it moved.
    ///
    /// `keep`: under a sliding window, which weighs the window just ended by its use
    /// (docs/decisions.md, D54), a cold key that used it gets a boxed part to remember that
    /// use in ([`HotState::prev`]), as a hot key always does.
    pub fn roll(&mut self, window: WindowIndex, keep: Keep<'_>) -> bool {
        self.roll_closing(window, keep).is_some()
    }

    /// [`KeyState::roll`], returning the window it moved from as its counter ended.
    pub fn roll_closing(&mut self, window: WindowIndex, keep: Keep<'_>) -> Option<ClosingEntry> {
        if window <= self.window {
            return None;
        }
        let closing = ClosingEntry {
            window: self.window,
            granted_units: self.granted_units,
            refunded_units: self.refunded_units,
        };
        let next = window == self.window.next();
        self.window = window;
        self.granted_units = 0;
        self.refunded_units = 0;
        let keep_previous = !matches!(keep, Keep::Band);
        if keep_previous && next && closing.granted_units > closing.refunded_units {
            self.hot_mut();
        }
        if let Some(hot) = self.hot.as_mut() {
            self.granted_units = hot.roll(window, closing, next, keep);
        }
        Some(closing)
    }

    /// Idle: no use in its window, nothing outstanding, nothing the coordinator waits for.
    /// Dropping an idle key loses nothing (a new one starts exactly the same).
    pub fn is_idle(&self, now: Timestamp) -> bool {
        self.granted_units == 0
            && self.refunded_units == 0
            && self.hot.as_ref().is_none_or(|h| h.is_idle(now))
    }

    /// The key remembers a window before it that was used or granted, which its start band
    /// may count against (docs/budget.md, edge band), and a sliding window weighs (in
    /// eventual mode, one it was reported in too: D83). A sweep
    /// keeps such a key, and its boxed part, until the next roll: a key busy every window
    /// stays boxed, one quiet for a window goes at the next. A full limit may still evict it
    /// under a fixed window (losing it only refuses the start band), never under a sliding
    /// one (a key the limit does not hold counts as unused in the window before).
    pub fn keeps_start_band(&self) -> bool {
        self.hot.as_ref().is_some_and(|h| h.keeps_start_band())
    }

    /// Free the boxed part once nothing in it matters any more. Returns true if it did.
    pub fn compact(&mut self, now: Timestamp) -> bool {
        let idle = self
            .hot
            .as_ref()
            .is_some_and(|h| h.is_idle(now) && !h.keeps_start_band());
        if idle {
            self.hot = None;
        }
        idle
    }
}

impl HotState {
    pub fn is_reported(&self) -> bool {
        self.escalated || self.mentioned
    }

    /// Move to `window` (`next`: the one right after the ended one). Returns the units the new
    /// window starts with: what the ended window's end band carried into it.
    fn roll(
        &mut self,
        window: WindowIndex,
        ended: ClosingEntry,
        next: bool,
        keep: Keep<'_>,
    ) -> u64 {
        let carried = if next { self.carry_units } else { 0 };
        self.carry_units = 0;
        self.carried_in_units = carried;
        let (reported, remote) = match keep {
            Keep::UseAndView(others) => (
                self.is_reported(),
                self.entries_at
                    .filter(|_| self.known_to_coordinator)
                    .map(|at| (self.assumed_remote_units(others), at)),
            ),
            Keep::Band | Keep::Use => (false, None),
        };
        self.prev = next.then_some(PrevWindow {
            net_units: ended.granted_units.saturating_sub(ended.refunded_units),
            explicit_units: self.allowance,
            band_units: 0,
            reported,
            remote,
        });
        let unacked = ended.granted_units != self.acked_granted_units
            || ended.refunded_units != self.acked_refunded_units;
        // A closing entry for an even older window is superseded: that window is long over.
        self.closing = (self.is_reported() && unacked).then_some(ended);
        let pre_issued = self.future.iter().find(|f| f.window == window).copied();
        self.future.retain(|f| f.window > window);
        self.allowance = pre_issued.map(|f| f.allowance_units);
        self.epoch = pre_issued.map(|f| f.epoch).unwrap_or_default();
        // Leases of the ended window expired with it; the lease table drops them on its own.
        self.leases.clear();
        self.denied_units = 0;
        self.refused_this_window = false;
        self.excess_units = 0;
        self.fail_open_units = 0;
        self.escalated = false;
        // A pre-issued grant means the coordinator follows this counter.
        self.mentioned = pre_issued.is_some();
        self.known_to_coordinator = false;
        self.entries_at = None;
        self.remote_granted = VClock::new();
        self.remote_refunded = VClock::new();
        self.remote_seen.clear();
        self.entry_confirmed = false;
        self.acked_granted_units = 0;
        self.acked_refunded_units = 0;
        carried
    }

    fn keeps_start_band(&self) -> bool {
        self.prev
            .is_some_and(|p| p.net_units > 0 || p.explicit_units.is_some() || p.reported)
    }

    fn is_idle(&self, now: Timestamp) -> bool {
        let pacing = |s: &Option<GcraState>| s.is_some_and(|s| s.tat() > now);
        self.allowance.is_none()
            && self.future.is_empty()
            && self.leases.is_empty()
            && self.slots.is_empty()
            // Invariant 1 and the fail-open budget count these until the window ends.
            && self.excess_units == 0
            && !self.is_reported()
            && self.closing.is_none()
            // The next window's counter starts at these: dropped, it would admit them again.
            && self.carry_units == 0
            && !pacing(&self.rate)
            && !pacing(&self.open_rate)
    }

    /// Applies an explicit allowance for the current window `key_window` or a later one: the
    /// one place a grant, or what a release left, takes effect. Returns false when it is not
    /// taken (stale, or too far ahead).
    ///
    /// For the current window a coordinator's grant counts only with a newer epoch: a
    /// duplicate or reordered answer changes nothing. A replay from the store
    /// ([`EpochRule::SameToo`]) is taken at an equal epoch too: each record holds the key's
    /// allowance as it was when written, the restore clears the allowance before each record
    /// but keeps the epoch, so the record that wrote the epoch in force must still bring its
    /// allowance back. Later windows' lists are cleared the same way and never hold epoch 0,
    /// so one rule serves both there.
    pub fn apply_allowance(
        &mut self,
        key_window: WindowIndex,
        a: WindowAllowance,
        rule: EpochRule,
    ) -> bool {
        if a.window != key_window {
            return self.set_future(key_window, a);
        }
        let taken = match rule {
            EpochRule::Newer => a.epoch > self.epoch,
            EpochRule::SameToo => a.epoch >= self.epoch,
        };
        if taken {
            self.allowance = Some(a.allowance_units);
            self.epoch = a.epoch;
        }
        taken
    }

    /// Keep a pre-issued allowance for a later window. Returns false when it is stale (its
    /// epoch is not newer, or its window is not after `key_window`) or too far ahead.
    pub fn set_future(&mut self, key_window: WindowIndex, grant: WindowAllowance) -> bool {
        // Only the windows after the key's count: an earlier one's allowance can never be
        // spent, and keeping it would let `future` grow past its bound.
        if grant.window <= key_window
            || grant.window.0 > key_window.0.saturating_add(MAX_FUTURE_WINDOWS)
        {
            return false;
        }
        match self.future.iter_mut().find(|f| f.window == grant.window) {
            Some(f) if grant.epoch > f.epoch => *f = grant,
            Some(_) => return false,
            // Like the current window's, a later window's last epoch starts at 0.
            None if grant.epoch == Epoch::default() => return false,
            None => {
                self.future.push(grant);
                self.future.sort_by_key(|f| f.window);
            }
        }
        debug_assert!(self.future.len() as u64 <= MAX_FUTURE_WINDOWS);
        true
    }

    /// The epoch last applied to `window` (current or later).
    pub fn epoch_for(&self, key_window: WindowIndex, window: WindowIndex) -> Epoch {
        if window == key_window {
            return self.epoch;
        }
        self.future
            .iter()
            .find(|f| f.window == window)
            .map(|f| f.epoch)
            .unwrap_or_default()
    }

    /// Eventual mode: the use this region must assume of the others. A region whose entry the
    /// view holds counts at its last heard net use; one not heard of may still be admitting
    /// on its default share without a view, so it counts at that share, and while any is
    /// unheard the unassigned remainder counts as taken too (an unheard region might hold it).
    pub fn assumed_remote_units(&self, others: &OtherRegions) -> u64 {
        let mut total = 0u64;
        let mut all_heard = true;
        for (region, default_units) in &others.default_units {
            let units = if self.remote_seen.contains(region) {
                let granted = self.remote_granted.get(region);
                granted.saturating_sub(self.remote_refunded.get(region))
            } else {
                all_heard = false;
                *default_units
            };
            total = total.saturating_add(units);
        }
        if !all_heard {
            total = total.saturating_add(others.unassigned_units);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cold_key_is_32_bytes() {
        // The idle-key memory target (128 bytes with map entry and key text) depends on it.
        assert_eq!(std::mem::size_of::<KeyState>(), 32);
    }

    #[test]
    fn rolling_restarts_counters_and_applies_the_pre_issued_grant() {
        let mut k = KeyState::new(WindowIndex(5));
        k.granted_units = 40;
        k.refunded_units = 10;
        let hot = k.hot_mut();
        hot.escalated = true;
        assert!(hot.set_future(
            WindowIndex(5),
            WindowAllowance {
                window: WindowIndex(6),
                allowance_units: 70,
                epoch: Epoch(3),
            }
        ));
        k.roll(WindowIndex(6), Keep::Band);
        assert_eq!((k.window, k.net_units()), (WindowIndex(6), 0));
        assert_eq!(k.explicit_allowance(WindowIndex(6)), Some(70));
        let hot = k.hot.as_ref().expect("hot state survives the roll");
        assert_eq!(hot.epoch, Epoch(3));
        assert!(!hot.escalated, "escalation is per window");
        assert!(
            hot.mentioned,
            "a pre-issued grant keeps the counter reported"
        );
        // The ended window's values were never acknowledged: kept for the next SyncUp.
        assert_eq!(
            hot.closing,
            Some(ClosingEntry {
                window: WindowIndex(5),
                granted_units: 40,
                refunded_units: 10
            })
        );
    }

    #[test]
    fn a_key_never_rolls_back() {
        let mut k = KeyState::new(WindowIndex(5));
        k.granted_units = 3;
        k.roll(WindowIndex(4), Keep::Band);
        assert_eq!((k.window, k.granted_units), (WindowIndex(5), 3));
    }

    #[test]
    fn an_answer_at_the_epoch_in_force_changes_nothing_but_a_replayed_record_restores_it() {
        let grant = |units, e| WindowAllowance {
            window: WindowIndex(5),
            allowance_units: units,
            epoch: Epoch(e),
        };
        let mut live = HotState::default();
        assert!(live.apply_allowance(WindowIndex(5), grant(70, 3), EpochRule::Newer));
        assert!(
            !live.apply_allowance(WindowIndex(5), grant(90, 3), EpochRule::Newer),
            "a duplicate answer at the same epoch"
        );
        assert!(!live.apply_allowance(WindowIndex(5), grant(90, 2), EpochRule::Newer));
        assert_eq!((live.allowance, live.epoch), (Some(70), Epoch(3)));
        // A restore clears the allowance before each record and keeps the epoch: the record
        // that wrote epoch 3 brings its allowance back, where an answer's rule would drop it.
        let mut replayed = live.clone();
        replayed.allowance = None;
        assert!(
            !replayed
                .clone()
                .apply_allowance(WindowIndex(5), grant(70, 3), EpochRule::Newer)
        );
        assert!(replayed.apply_allowance(WindowIndex(5), grant(70, 3), EpochRule::SameToo));
        assert_eq!((replayed.allowance, replayed.epoch), (Some(70), Epoch(3)));
        assert!(!replayed.apply_allowance(WindowIndex(5), grant(10, 2), EpochRule::SameToo));
        // Later windows keep one rule: a newer epoch.
        assert!(live.apply_allowance(WindowIndex(5), grant_at(6, 40, 1), EpochRule::SameToo));
        assert!(!live.apply_allowance(WindowIndex(5), grant_at(6, 50, 1), EpochRule::SameToo));
        assert_eq!(live.future, vec![grant_at(6, 40, 1)]);
    }

    fn grant_at(window: u64, units: u64, epoch: u64) -> WindowAllowance {
        WindowAllowance {
            window: WindowIndex(window),
            allowance_units: units,
            epoch: Epoch(epoch),
        }
    }

    #[test]
    fn grants_too_far_ahead_or_stale_are_refused() {
        let mut h = HotState::default();
        let at = |w, e| WindowAllowance {
            window: WindowIndex(w),
            allowance_units: 1,
            epoch: Epoch(e),
        };
        assert!(!h.set_future(WindowIndex(10), at(13, 1)), "3 windows ahead");
        assert!(h.set_future(WindowIndex(10), at(12, 2)));
        assert!(
            !h.set_future(WindowIndex(10), at(12, 2)),
            "same epoch again"
        );
        assert!(h.set_future(WindowIndex(10), at(11, 1)));
        assert_eq!(h.future.len(), 2);
        assert_eq!(h.future[0].window, WindowIndex(11), "kept in window order");
    }

    /// Found by the log's fuzz target: a stored key record naming allowances for windows
    /// before its own put them among the later windows' grants, past their bound.
    #[test]
    fn grants_for_the_key_window_or_earlier_are_not_kept_as_later_ones() {
        let mut h = HotState::default();
        let at = |w, e| WindowAllowance {
            window: WindowIndex(w),
            allowance_units: 1,
            epoch: Epoch(e),
        };
        for w in [10, 9, 8, 7, 3, 0] {
            assert!(!h.set_future(WindowIndex(10), at(w, 5)), "window {w}");
        }
        assert!(h.future.is_empty());
        assert!(h.set_future(WindowIndex(10), at(11, 1)));
        assert_eq!(h.future.len(), 1);
    }
}
