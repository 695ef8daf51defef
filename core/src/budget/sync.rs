//! The coordinator-facing half: producing SyncUps and applying SyncDowns.
//!
//! Only reported counters travel: those that escalated (demand above the allowance, a
//! refusal, an eventual counter past its default share) and those the coordinator named.
//! A key never escalated costs the coordinator nothing.
//!
//! Acknowledgement is exact: each SyncUp in flight remembers what it carried, and an answer
//! to it confirms exactly that (counter values received, release acks received, counters now
//! known to the coordinator). Counter entries are absolute G-counter values, so resending
//! them until confirmed is harmless.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;

use crdts::{CmRDT, Dot};

use super::admit::{self, Ctx};
use super::config::{MAX_INFLIGHT_SYNCS, MAX_PENDING_ACKS, RECENT_RELEASES_KEPT, SYNC_SCAN_KEYS};
use super::key::{EpochRule, KeyState, WindowAllowance};
use super::limits::LimitState;
use super::shared::{Dirty, DirtySet, KeyRef};
use super::view::RoundTrip;
use super::{RegionBudget, ctx_of};
use crate::ids::{Epoch, LimitId, RegionId};
use crate::sync::{
    AllowanceGrant, BoundFigures, CounterEntry, CounterRef, DemandReport, LimitWindowStats,
    MAX_ITEMS_PER_MESSAGE, ReleaseAck, ReleaseRequest, SyncDown, SyncUp,
};
use crate::time::{Timestamp, WindowIndex};

/// A counter a SyncUp carried, and the values it carried if it carried an entry.
#[derive(Clone, Debug)]
struct Carried {
    key: KeyRef,
    window: WindowIndex,
    values: Option<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct Inflight {
    seq: u64,
    sent_at: Timestamp,
    carried: Vec<Carried>,
    acks: Vec<u64>,
    stats: Vec<LimitWindowStats>,
}

/// A release ack, and whether the coordinator has yet to confirm receiving it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AckEntry {
    pub ack: ReleaseAck,
    pub pending: bool,
}

/// Release acks: pending until confirmed, then remembered a while for replayed requests.
#[derive(Clone, Debug, Default)]
pub(crate) struct AckBook {
    by_id: BTreeMap<u64, AckEntry>,
    pending: VecDeque<u64>,
    done: VecDeque<u64>,
}

impl AckBook {
    pub fn get(&self, id: u64) -> Option<&AckEntry> {
        self.by_id.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &AckEntry> {
        self.by_id.values()
    }

    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Answer a repeated request again with its original ack (unless too many are pending:
    /// the coordinator will ask again). False for an unknown id.
    fn requeue(&mut self, id: u64) -> bool {
        let full = self.pending.len() >= MAX_PENDING_ACKS;
        let Some(entry) = self.by_id.get_mut(&id) else {
            return false;
        };
        if !entry.pending && !full {
            entry.pending = true;
            self.done.retain(|d| *d != id);
            self.pending.push_back(id);
        }
        true
    }

    /// Add an ack (new, or read back from persisted state). Returns ids forgotten to make room.
    pub fn insert(&mut self, entry: AckEntry) -> Vec<u64> {
        let id = entry.ack.id;
        if self.by_id.contains_key(&id) {
            self.pending.retain(|p| *p != id);
            self.done.retain(|d| *d != id);
        }
        if entry.pending {
            self.pending.push_back(id);
        } else {
            self.done.push_back(id);
        }
        self.by_id.insert(id, entry);
        self.forget_old()
    }

    /// The coordinator received these acks. Returns the ids whose state changed, and those
    /// forgotten to make room (both must be persisted).
    fn confirm(&mut self, ids: &[u64]) -> Vec<u64> {
        let mut changed = Vec::new();
        for id in ids {
            if let Some(e) = self.by_id.get_mut(id).filter(|e| e.pending) {
                e.pending = false;
                self.done.push_back(*id);
                changed.push(*id);
            }
        }
        if !changed.is_empty() {
            let by_id = &self.by_id;
            self.pending
                .retain(|p| by_id.get(p).is_some_and(|e| e.pending));
        }
        changed.extend(self.forget_old());
        changed
    }

    fn forget_old(&mut self) -> Vec<u64> {
        let mut gone = Vec::new();
        while self.done.len() > RECENT_RELEASES_KEPT {
            if let Some(id) = self.done.pop_front() {
                self.by_id.remove(&id);
                gone.push(id);
            }
        }
        gone
    }

    /// Drop an ack entirely (its record was forgotten).
    pub fn remove(&mut self, id: u64) {
        if self.by_id.remove(&id).is_some() {
            self.pending.retain(|p| *p != id);
            self.done.retain(|d| *d != id);
        }
    }

    fn pending_acks(&self) -> impl Iterator<Item = &ReleaseAck> {
        self.pending
            .iter()
            .filter_map(|id| self.by_id.get(id))
            .map(|e| &e.ack)
    }

    pub fn clear(&mut self) {
        *self = AckBook::default();
    }
}

/// The sync side of the region's state.
#[derive(Clone, Debug, Default)]
pub(crate) struct SyncState {
    /// The next SyncUp's sequence number (persisted, so answers are never confused across
    /// a restart).
    pub next_seq: u64,
    /// This start's boot number ([`SyncUp::boot`]): the time, in nanoseconds, of the start
    /// on the region's own clock ([`RegionBudget::set_boot_clock`]), or failing that of the
    /// first SyncUp since the machine was built, and above `stored_boot` either way; 0 until
    /// then. Time, so that a start from an old copy of the state still gets a larger one.
    pub boot: u64,
    /// The boot of the start that wrote the state this one restored
    /// (`PersistRecord::Boot`), 0 if none: a clock stepped back across the restart must not
    /// give a smaller one.
    pub stored_boot: u64,
    /// The largest leader term an answer carried (soft: a restart resends everything anyway).
    leader_term: Option<u64>,
    next_sync_at: Option<Timestamp>,
    inflight: VecDeque<Inflight>,
    /// Keys whose counters travel in SyncUps; cleaned lazily when they stop being reported.
    reported: BTreeSet<KeyRef>,
    /// The last key a SyncUp got to, so the next one starts after it.
    cursor: Option<KeyRef>,
    /// The last limit whose stats a SyncUp carried, so the next one starts after it.
    stats_cursor: Option<LimitId>,
    pub acks: AckBook,
}

impl SyncState {
    pub fn report(&mut self, key: KeyRef) {
        self.reported.insert(key);
    }

    pub fn next_sync_at(&self) -> Option<Timestamp> {
        self.next_sync_at
    }

    fn take_inflight(&mut self, seq: u64) -> Option<Inflight> {
        let i = self.inflight.iter().position(|f| f.seq == seq)?;
        self.inflight.remove(i)
    }

    /// Up to [`SYNC_SCAN_KEYS`] reported keys after the cursor, wrapping around.
    fn candidates(&self) -> Vec<KeyRef> {
        let Some(c) = &self.cursor else {
            return self.reported.iter().take(SYNC_SCAN_KEYS).cloned().collect();
        };
        let after = self.reported.range((Bound::Excluded(c), Bound::Unbounded));
        let before = self.reported.range(..=c);
        after.chain(before).take(SYNC_SCAN_KEYS).cloned().collect()
    }
}

impl RegionBudget {
    /// The next SyncUp, when one is due (every `sync_interval`; the first at once). It carries
    /// the entries of reported counters not yet confirmed, demand of escalated ones, pending
    /// release acks and the last clock sample, each list at most `cfg.message_items`;
    /// the rest goes next time, starting where this one stopped.
    ///
    /// The driver must write `drain_dirty()` to disk before sending it: release acks promise
    /// the allowance was lowered durably.
    pub fn poll_transmit(&mut self, now: Timestamp) -> Option<SyncUp> {
        self.saw_time(now);
        if !self.cfg.coordinated || self.sync.next_sync_at.is_some_and(|at| now < at) {
            return None;
        }
        // Time open up to this instant goes into this SyncUp's stats.
        self.account_open_time(now);
        self.sync.next_sync_at = Some(now + self.cfg.sync_interval);
        let seq = self.sync.next_seq;
        self.sync.next_seq += 1;
        self.dirty.mark(Dirty::Meta);
        if self.sync.boot == 0 {
            self.set_boot_clock(now);
        }
        let mut up = SyncUp {
            region: self.cfg.region.clone(),
            boot: self.sync.boot,
            restored: self.view.restore.is_awaiting(),
            seq,
            sent_at: now,
            config_version: self.config_version,
            entries: Vec::new(),
            demand: Vec::new(),
            release_acks: Vec::new(),
            clock: self.view.clock(),
            clock_leader_term: self.view.clock_term(),
            stats: self.collect_stats(),
            view_expired: self.view.expired_since_reported(now),
            clock_guard: self.view.guard(),
        };
        let carried = self.collect_reported(now, &mut up);
        up.release_acks = self
            .sync
            .acks
            .pending_acks()
            .take(self.cfg.message_items)
            .cloned()
            .collect();
        debug_assert!(up.entries.len() <= self.cfg.message_items);
        debug_assert!(up.demand.len() <= self.cfg.message_items);
        debug_assert!(up.stats.len() <= self.cfg.message_items);
        debug_assert!(self.sync.acks.pending_len() <= MAX_PENDING_ACKS);
        if self.sync.inflight.len() >= MAX_INFLIGHT_SYNCS {
            self.sync.inflight.pop_front();
        }
        self.sync.inflight.push_back(Inflight {
            seq,
            sent_at: now,
            carried,
            acks: up.release_acks.iter().map(|a| a.id).collect(),
            stats: up.stats.clone(),
        });
        Some(up)
    }

    /// Bound figures not yet confirmed, limit by limit from the stats cursor (wrapping), at
    /// most `cfg.message_items`.
    fn collect_stats(&mut self) -> Vec<LimitWindowStats> {
        let order: Vec<&LimitId> = match &self.sync.stats_cursor {
            Some(c) => self
                .limits
                .range::<LimitId, _>((Bound::Excluded(c), Bound::Unbounded))
                .chain(self.limits.range::<LimitId, _>(..=c))
                .map(|(id, _)| id)
                .collect(),
            None => self.limits.keys().collect(),
        };
        let mut out = Vec::new();
        let mut last = None;
        for id in order {
            let stats = &self.limits[id].stats;
            let pending: Vec<LimitWindowStats> = stats
                .windows()
                .filter_map(|(window, w)| {
                    w.unconfirmed_figures().map(|figures| LimitWindowStats {
                        limit: id.clone(),
                        window,
                        figures,
                    })
                })
                .collect();
            if out.len() + pending.len() > self.cfg.message_items {
                break;
            }
            if !pending.is_empty() {
                last = Some(id.clone());
            }
            out.extend(pending);
        }
        if last.is_some() {
            self.sync.stats_cursor = last;
        }
        out
    }

    /// Walk reported keys from the cursor, filling `up.entries` and `up.demand`.
    fn collect_reported(&mut self, now: Timestamp, up: &mut SyncUp) -> Vec<Carried> {
        let ctx = ctx_of(&self.cfg, &self.view, now);
        let mut carried = Vec::new();
        let mut stale = Vec::new();
        for kr in self.sync.candidates() {
            let Some(ks) = rolled_key(&mut self.limits, &mut self.dirty, &kr, now) else {
                stale.push(kr);
                continue;
            };
            let closing = ks.hot.as_ref().and_then(|h| h.closing);
            let cap = self.cfg.message_items;
            let room = cap - 1 - usize::from(closing.is_some());
            if up.entries.len() > room || up.demand.len() >= cap {
                break;
            }
            if let Some(c) = closing {
                let values = (c.granted_units, c.refunded_units);
                up.entries
                    .push(entry(&self.cfg.region, &kr, c.window, values));
                carried.push(Carried {
                    key: kr.clone(),
                    window: c.window,
                    values: Some(values),
                });
            }
            if ks.is_reported() {
                let lim = &self.limits[&kr.limit];
                let ks = &lim.keys[kr.key.as_str()];
                let unspent = ks.hot.as_ref().map_or(0, |h| {
                    h.leases
                        .iter()
                        .filter_map(|id| self.leases.get(*id))
                        .map(|l| l.unspent_units(now))
                        .fold(0u64, u64::saturating_add)
                });
                let report = Report {
                    ctx: &ctx,
                    now,
                    unspent_units: unspent,
                };
                report_key(&self.cfg.region, lim, ks, &kr, &report, up, &mut carried);
            } else if closing.is_none() {
                stale.push(kr.clone());
            }
            self.sync.cursor = Some(kr);
        }
        for kr in stale {
            self.sync.reported.remove(&kr);
        }
        carried
    }

    /// A restored start's first answer measures its clock against the coordinator's. The
    /// lost copy may have read its windows on a clock corrected by about that much (from
    /// samples this copy never stored), so a window that begins before the start on that
    /// clock may hold what it admitted: the start moves later by the offset's upper bound
    /// (`offset + rtt / 2`), before this answer's release requests are weighed. The timebase
    /// moves it the same way once it takes the sample (`restore_started_no_earlier_than`),
    /// but only after the answer: a release taken in between let another region spend what
    /// the lost copy had (swarm seed 3132762). A region with no timebase (`max_edge_band`
    /// `None`) reads its windows on its own clock in every copy: nothing moves, or a region
    /// minutes behind would shut minutes of windows it never reached.
    fn restore_start_by_answer_offset(&mut self) {
        if self.cfg.max_edge_band.is_none() {
            return;
        }
        let (Some(sample), Some(start)) = (self.view.clock(), self.view.restore.awaiting_since())
        else {
            return;
        };
        let half_rtt = i64::try_from(sample.round_trip_nanos / 2).unwrap_or(i64::MAX);
        let ahead = sample.offset_nanos.saturating_add(half_rtt);
        if let Ok(ahead) = u64::try_from(ahead) {
            let moved = start.saturating_add(std::time::Duration::from_nanos(ahead));
            self.view.restore.start_no_earlier_than(moved);
        }
    }

    /// Merge an answer from the coordinator: confirm what the answered SyncUp carried, take
    /// the clock sample, merge counter entries (by max), apply grants and release requests
    /// (by epoch). An answer to an unknown or forgotten SyncUp is still merged, but refreshes
    /// nothing: its send time, from which it would be aged, is unknown.
    ///
    /// An answer from a new leader (a larger term) first makes everything the previous one
    /// confirmed unconfirmed again, since a new leader starts without it; an answer from an
    /// earlier leader confirms nothing (that leader is gone, and what it received with it).
    pub fn handle_sync_down(&mut self, now: Timestamp, msg: SyncDown) {
        self.saw_time(now);
        self.account_open_time(now);
        self.coordinator_config_version = Some(msg.config_version);
        let known_term = self.sync.leader_term;
        if known_term.is_some_and(|t| msg.leader_term > t) {
            self.forget_confirmations();
        }
        let current_leader = known_term.is_none_or(|t| msg.leader_term >= t);
        if current_leader {
            self.sync.leader_term = Some(msg.leader_term);
        }
        let answered = self.sync.take_inflight(msg.reply_to_seq);
        let sent_at = answered.as_ref().map(|f| f.sent_at);
        let first_answer = answered.is_some() && self.view.restore.is_awaiting();
        if let Some(f) = answered {
            self.view.on_answer(
                RoundTrip {
                    sent_at: f.sent_at,
                    received_at: msg.received_at,
                    answered_at: msg.sent_at,
                    returned_at: now,
                },
                msg.leader_term,
            );
            if current_leader {
                self.confirm(&f);
            }
        }
        for e in msg.entries.into_iter().take(MAX_ITEMS_PER_MESSAGE) {
            self.merge_entry(now, e, sent_at);
        }
        // A restored start's first answer (every grant resent, its own entries merged) lifts
        // its wait; every SyncUp in flight was sent by this boot. Grants are applied below,
        // in this same call, before anything is admitted again.
        if first_answer {
            self.restore_start_by_answer_offset();
            // The leader's reach of the clock the region's earlier boots ran on: the lost copy
            // may have admitted in any window begun before it, on a clock that may read ahead
            // of this start's (a wall clock stepped back between the two boots, unseen by the
            // copy, which counted from its own start: D73). With a timebase the reach is of
            // the corrected clock, which the first sample also puts this start on.
            if let Some(reach) = msg.earlier_boot_clock_reach {
                self.restore_started_no_earlier_than(reach);
            }
            self.view.restore = self.view.restore.on_first_answer(msg.known_region);
            // Replaces the wait in the store, with the closing or with nothing closed.
            self.dirty.mark(Dirty::Restore);
        }
        // Grants and release requests were computed under the coordinator's configuration:
        // under another one they mean nothing here. A request not applied is not acked, so
        // the coordinator asks again once both sides agree.
        if msg.config_version != self.config_version {
            self.stats.sync_items_skipped += (msg.grants.len() + msg.release_requests.len()) as u64;
            return;
        }
        let mut below_default_unapplied = false;
        for g in msg.grants.into_iter().take(MAX_ITEMS_PER_MESSAGE) {
            below_default_unapplied |= !self.apply_grant(now, g);
        }
        // The rows below the default lead every answer until confirmed, so this one brought
        // them, or says which are left for the next: an answer to any SyncUp will do, as long
        // as it speaks this version. One it brought that found no room for its key is as good
        // as left out: every strict key holds until one applies, or the row is gone (swarm
        // seed 3273189: a zero for a key the region had no room for; the key was made after
        // an eviction and admitted at its default).
        self.view.version_unheard = false;
        if self.view.version_skipped_from.take().is_some() {
            // The stored grants are now this version's.
            self.dirty.mark(Dirty::ConfigVersion);
        }
        self.view.below_default_left = msg.below_default_left || below_default_unapplied;
        // A restored start awaiting its boot's first answer holds an old copy of its
        // allowances: a release taken from one (an answer to the lost copy's SyncUp) leaves it
        // above the row the coordinator lowers. Not applied, not acked: the first answer
        // resends the row, then the request.
        if self.view.restore.is_awaiting() {
            self.stats.sync_items_skipped += msg.release_requests.len() as u64;
            return;
        }
        for r in msg.release_requests.into_iter().take(MAX_ITEMS_PER_MESSAGE) {
            self.apply_release(now, r);
        }
    }

    /// A new leader holds none of the entries, demand or statistics the previous one confirmed:
    /// send them all again (reported counters of live windows, and the kept windows' stats;
    /// demand of followed counters goes with every SyncUp anyway). Bounded by the reported
    /// keys and the kept stats windows, and spread over SyncUps by their cursors.
    fn forget_confirmations(&mut self) {
        for kr in &self.sync.reported {
            let hot = self
                .limits
                .get_mut(&kr.limit)
                .and_then(|l| l.keys.get_mut(kr.key.as_str()))
                .and_then(|ks| ks.hot.as_mut());
            if let Some(hot) = hot {
                hot.entry_confirmed = false;
                hot.acked_granted_units = 0;
                hot.acked_refunded_units = 0;
            }
        }
        for lim in self.limits.values_mut() {
            let windows: Vec<WindowIndex> = lim.stats.windows().map(|(w, _)| w).collect();
            for window in windows {
                if let Some(w) = lim.stats.window_mut_if_kept(window) {
                    w.acked = BoundFigures::default();
                }
            }
        }
    }

    /// The coordinator received what `f` carried. A counter it now holds is not yet "known"
    /// here (see `HotState::known_to_coordinator`): that takes its entries in an answer.
    fn confirm(&mut self, f: &Inflight) {
        for c in &f.carried {
            let Some(ks) = self
                .limits
                .get_mut(&c.key.limit)
                .and_then(|l| l.keys.get_mut(c.key.key.as_str()))
            else {
                continue;
            };
            let window = ks.window;
            let Some(hot) = ks.hot.as_mut() else { continue };
            if c.window == window
                && let Some((g, r)) = c.values
            {
                hot.entry_confirmed = true;
                hot.acked_granted_units = hot.acked_granted_units.max(g);
                hot.acked_refunded_units = hot.acked_refunded_units.max(r);
            }
            if let (Some(cl), Some((g, r))) = (hot.closing, c.values)
                && cl.window == c.window
                && g >= cl.granted_units
                && r >= cl.refunded_units
            {
                hot.closing = None;
            }
        }
        for id in self.sync.acks.confirm(&f.acks) {
            self.dirty.mark(Dirty::Ack(id));
        }
        for st in &f.stats {
            let w = self
                .limits
                .get_mut(&st.limit)
                .and_then(|l| l.stats.window_mut_if_kept(st.window));
            if let Some(w) = w {
                w.acked = w.acked.max(st.figures);
            }
        }
    }

    /// A counter entry from the coordinator: another region's goes into the remote view, this
    /// region's own (the coordinator's copy, more than the region's after a start from an old
    /// copy of its state) is merged into its counters by max. `sent_at` is the send time of
    /// the SyncUp the answer answers, if known: the counter's view is as old as that.
    fn merge_entry(&mut self, now: Timestamp, e: CounterEntry, sent_at: Option<Timestamp>) {
        let own = e.region == self.cfg.region;
        let Some(lim) = self.limits.get_mut(&e.counter.limit) else {
            return;
        };
        if lim.params.is_unmetered() || e.counter.window != lim.params.window_index(now) {
            return;
        }
        let known = lim.keys.contains_key(e.counter.key.as_str());
        if !own && !known && !lim.params.is_eventual() {
            // Strict admission never reads other regions' counts; nothing to keep.
            return;
        }
        let mut touched = Vec::new();
        let max_keys = self.cfg.max_keys_per_limit;
        let done = lim.with_key(now, &e.counter.key, max_keys, &mut touched, |_, ks, _| {
            if ks.window != e.counter.window {
                return;
            }
            if own {
                ks.granted_units = ks.granted_units.max(e.granted_units);
                ks.refunded_units = ks.refunded_units.max(e.refunded_units);
            }
            let hot = ks.hot_mut();
            if !own {
                hot.remote_granted
                    .apply(Dot::new(e.region.clone(), e.granted_units));
                hot.remote_refunded
                    .apply(Dot::new(e.region.clone(), e.refunded_units));
                hot.remote_seen.insert(e.region.clone());
            }
            hot.mentioned = true;
            hot.known_to_coordinator = true;
            hot.entries_at = hot.entries_at.max(sent_at);
        });
        self.after_sync_item(done.is_ok(), &e.counter, touched);
    }

    /// An allowance grant: absolute, applied only if its epoch is newer; for the current
    /// window or kept aside for a later one. Eventual limits take no grants.
    ///
    /// Returns false when a grant below the default share could not be applied for want of
    /// room for its key (`max_keys_per_limit`): the key may be made later, when another is
    /// evicted, and would start at its default above the row.
    fn apply_grant(&mut self, now: Timestamp, g: AllowanceGrant) -> bool {
        if g.region != self.cfg.region {
            return true;
        }
        let Some(lim) = self.limits.get_mut(&g.counter.limit) else {
            self.stats.sync_items_skipped += 1;
            return true;
        };
        if lim.params.is_unmetered() || lim.params.is_eventual() {
            return true;
        }
        if g.counter.window < lim.params.window_index(now) {
            return true;
        }
        let below_default = g.allowance_units < lim.params.default_units;
        let mut touched = Vec::new();
        let max_keys = self.cfg.max_keys_per_limit;
        let done = lim.with_key(now, &g.counter.key, max_keys, &mut touched, |_, ks, _| {
            let window = ks.window;
            let hot = ks.hot_mut();
            if g.counter.window == window {
                hot.mentioned = true;
            }
            let a = WindowAllowance {
                window: g.counter.window,
                allowance_units: g.allowance_units,
                epoch: g.epoch,
            };
            hot.apply_allowance(window, a, EpochRule::Newer);
        });
        let applied = done.is_ok();
        self.after_sync_item(applied, &g.counter, touched);
        applied || !below_default
    }

    /// A release request: lower the allowance by `min(units, a_r - n_r)` (never below net
    /// use), remember the epoch, and queue the ack. A repeated id is answered with the same
    /// ack and releases nothing more.
    fn apply_release(&mut self, now: Timestamp, r: ReleaseRequest) {
        if self.sync.acks.requeue(r.id) {
            self.dirty.mark(Dirty::Ack(r.id));
            return;
        }
        if self.sync.acks.pending_len() >= MAX_PENDING_ACKS {
            self.stats.release_requests_deferred += 1;
            return;
        }
        let ack = |released_units, allowance_after_units| ReleaseAck {
            id: r.id,
            counter: r.counter.clone(),
            released_units,
            allowance_after_units,
        };
        let mut fresh = ctx_of(&self.cfg, &self.view, now);
        fresh.view_expired = false;
        // Release from what the region holds: a restored start's gate only stops admission.
        fresh.restore = Default::default();
        let answer = match self.limits.get_mut(&r.counter.limit) {
            None => Some(ack(0, 0)),
            Some(lim) if lim.params.is_unmetered() || lim.params.is_eventual() => {
                Some(ack(0, lim.params.default_units))
            }
            // The window is over: nothing more can be admitted in it, nothing to release.
            Some(lim) if r.counter.window < lim.params.window_index(now) => Some(ack(0, 0)),
            Some(lim) => {
                // A window that began before a restored start keeps all it holds: the lost
                // copy may have spent it, and a release would grow another region into it.
                let start = lim.params.window_start(r.counter.window);
                let keep = self.view.restore.keeps_held(start);
                let mut touched = Vec::new();
                let max_keys = self.cfg.max_keys_per_limit;
                let out = lim.with_key(now, &r.counter.key, max_keys, &mut touched, |p, ks, _| {
                    let (released, after) = if keep {
                        (0, admit::allowance(p, ks, r.counter.window, &fresh).units)
                    } else {
                        release_in_key(p, ks, &r, &fresh, now)
                    };
                    ack(released, after)
                });
                let done = out.is_ok();
                self.after_sync_item(done, &r.counter, touched);
                out.ok()
            }
        };
        if let Some(a) = answer {
            let forgotten = self.sync.acks.insert(AckEntry {
                ack: a,
                pending: true,
            });
            self.dirty.mark(Dirty::Ack(r.id));
            for id in forgotten {
                self.dirty.mark(Dirty::Ack(id));
            }
        }
    }

    /// Persist and report a counter the coordinator named; count it if it could not be kept.
    fn after_sync_item(&mut self, done: bool, counter: &CounterRef, touched: Vec<Box<str>>) {
        self.mark_touched(&counter.limit, touched);
        if !done {
            self.stats.sync_items_skipped += 1;
            return;
        }
        self.key_changed(&counter.limit, &counter.key, false);
        self.sync.report(KeyRef {
            limit: counter.limit.clone(),
            key: counter.key.clone(),
        });
    }
}

/// Apply a release request to a key; returns `(released, allowance after)`.
fn release_in_key(
    p: &super::limits::LimitParams,
    ks: &mut KeyState,
    r: &ReleaseRequest,
    fresh: &Ctx,
    now: Timestamp,
) -> (u64, u64) {
    let window = ks.window;
    let target = r.counter.window;
    let current = target == window;
    let base = admit::allowance(p, ks, target, fresh).units;
    let epoch = ks
        .hot
        .as_ref()
        .map_or(Epoch::default(), |h| h.epoch_for(window, target));
    if r.epoch <= epoch {
        // Superseded by a newer grant or release: nothing changes.
        return (0, base);
    }
    // A later window's use so far is what the current window's end band carried into it.
    let n = match ks.hot.as_deref() {
        _ if current => ks.net_units(),
        Some(h) if target == window.next() => h.carry_units,
        _ => 0,
    };
    let released = r
        .units
        .min(base.saturating_sub(kept_for(p, ks, fresh, now, current, n)));
    let after = base - released;
    let hot = ks.hot_mut();
    if current {
        hot.allowance = Some(after);
        hot.epoch = r.epoch;
        hot.mentioned = true;
    } else {
        let kept = hot.set_future(
            window,
            WindowAllowance {
                window: target,
                allowance_units: after,
                epoch: r.epoch,
            },
        );
        if !kept {
            // Too far ahead to hold: release nothing, which is always safe.
            return (0, base);
        }
    }
    debug_assert!(after >= n || released == 0);
    (released, after)
}

/// The least allowance a release leaves a key whose window use is `n`: `n` itself, except
/// under a sliding window, where the region may hold only the weighted share of its allowance
/// (D54): it keeps what leaves `n` within that share, and in a later window that its end band
/// already carried units into, whose weight is not known yet, all it holds.
fn kept_for(
    p: &super::limits::LimitParams,
    ks: &KeyState,
    fresh: &Ctx,
    now: Timestamp,
    current: bool,
    n: u64,
) -> u64 {
    if !p.is_sliding() || n == 0 {
        return n;
    }
    if !current {
        return u64::MAX;
    }
    super::sliding::weight(p, ks, fresh, now)
        .and_then(|w| w.allowance_for(n))
        .unwrap_or(u64::MAX)
}

/// The key, rolled to the window of `now`, if it still exists; marked dirty if it rolled.
fn rolled_key<'a>(
    limits: &'a mut BTreeMap<LimitId, LimitState>,
    dirty: &mut DirtySet,
    kr: &KeyRef,
    now: Timestamp,
) -> Option<&'a mut KeyState> {
    let lim = limits.get_mut(&kr.limit)?;
    let window = lim.params.window_index(now);
    lim.params.counting_from(window);
    let ks = lim.keys.get_mut(kr.key.as_str())?;
    let closed = ks.roll_closing(window, lim.params.keep());
    lim.watched.closed(kr.key.as_str(), closed);
    if closed.is_some() {
        dirty.mark(Dirty::Key(kr.limit.clone(), kr.key.clone()));
    }
    Some(ks)
}

/// What reporting a key needs besides the key: the region's context, the time, and the
/// units of its outstanding leases probably not spent yet.
struct Report<'a> {
    ctx: &'a Ctx,
    now: Timestamp,
    unspent_units: u64,
}

/// Add a reported key's current entry (if not yet confirmed) and demand (if due).
fn report_key(
    region: &RegionId,
    lim: &LimitState,
    ks: &KeyState,
    kr: &KeyRef,
    r: &Report<'_>,
    up: &mut SyncUp,
    carried: &mut Vec<Carried>,
) {
    let (ctx, now) = (r.ctx, r.now);
    let Some(hot) = ks.hot.as_ref() else { return };
    let values = (ks.granted_units, ks.refunded_units);
    // Zero included: a counter this region learnt of from the coordinator, where it has not
    // admitted, gets a zero entry, so the others count it as heard at 0, not at its default.
    let unconfirmed =
        !hot.entry_confirmed || values != (hot.acked_granted_units, hot.acked_refunded_units);
    if unconfirmed {
        up.entries.push(entry(region, kr, ks.window, values));
    }
    // An escalated counter reports its demand at once; any other counter the coordinator
    // follows reports it once the window's estimate has warmed up, so that the coordinator
    // sees demand fall as well as rise (and drops the forecast it carried over).
    let p = &lim.params;
    let demand_due = hot.escalated
        || (hot.is_reported() && admit::demand_warmed_up(p, ks, now, ctx.sync_interval));
    if demand_due {
        // The allowance held with contact: the coordinator takes a report at or below its row
        // as proof the region holds no more, and an expired view's closed-policy allowance
        // ends with the next answer, when the region falls back to what it holds. So does
        // the hold of a version not yet heard: reported, it would confirm a row below the
        // default that the region never got (a grant sent before it switched is ignored),
        // and the coordinator would stop sending it just as the region came to rely on the
        // next answer to bring it (swarm seed 3001260). The hold while rows below the default
        // are left for later answers is the same kind.
        let held = Ctx {
            view_expired: false,
            version_unheard: false,
            version_skipped: false,
            below_default_left: false,
            restore: Default::default(),
            ..*ctx
        };
        up.demand.push(DemandReport {
            counter: counter_ref(kr, ks.window),
            demand_micro_units_per_sec: admit::demand_micro_units_per_sec(
                p,
                ks,
                now,
                ctx.sync_interval,
                r.unspent_units,
            ),
            allowance_units: admit::allowance(p, ks, ks.window, &held).units,
        });
    }
    if unconfirmed || demand_due {
        carried.push(Carried {
            key: kr.clone(),
            window: ks.window,
            values: unconfirmed.then_some(values),
        });
    }
}

fn counter_ref(kr: &KeyRef, window: WindowIndex) -> CounterRef {
    CounterRef {
        limit: kr.limit.clone(),
        key: kr.key.clone(),
        window,
    }
}

fn entry(region: &RegionId, kr: &KeyRef, window: WindowIndex, values: (u64, u64)) -> CounterEntry {
    CounterEntry {
        counter: counter_ref(kr, window),
        region: region.clone(),
        granted_units: values.0,
        refunded_units: values.1,
    }
}
