//! Leases: units of one key granted to a gateway for a TTL, spent locally with no network hop.
//!
//! A lease is charged to the key's `granted` entry when it is granted, exactly once (retries
//! with the same request id replay the grant). Release and settle end it and refund the
//! unused part into `refunded` (or, for settle, charge what was used beyond the reservation);
//! expiry ends it with nothing refunded: units a gateway might have spent count as spent.
//! A lease never outlives its window, because its units belong to that window's counter.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use super::admit::{self, Ctx, Want};
use super::api::{
    Decision, LeaseGrant, LeaseOutcome, LeaseRequest, LeaseReturn, Reason, ReleaseOutcome,
    RenewOutcome, RequestFingerprint, ReservationDelta, ReturnedLease, SettleOutcome,
};
use super::config::{ENDED_LEASES_KEPT, MAX_LEASE_RETURNS};
use super::key::KeyState;
use super::limits::LimitParams;
use super::shared::{Dirty, IdBlocks};
use super::stats::{LimitStats, WindowStats};
use super::{RegionBudget, ctx_of, decision_of, unmetered_decision};
use crate::algo::gcra::Gcra;
use crate::error::{Error, Result};
use crate::ids::{KeyId, LeaseId, LimitId, RequestId};
use crate::time::{Timestamp, WindowIndex};

/// One outstanding lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub limit: LimitId,
    pub key: KeyId,
    pub window: WindowIndex,
    /// Units charged at grant time (less what late settles refunded while it was live).
    pub units: u64,
    pub expires_at: Timestamp,
    /// When it was granted and the rate its holder said it spends the key at: how much of it
    /// is probably still unspent, for the demand estimate. Not persisted (a restored lease
    /// counts as spent).
    pub spend: Option<LeaseSpend>,
    /// Settle overage charged against it so far (late settles of reservations paid from it):
    /// at most `max_settle_overage` times its units. Not persisted.
    pub overage_units: u64,
}

/// What a lease's holder told the agent about its pace when it asked for the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSpend {
    pub granted_at: Timestamp,
    pub rate_units_per_sec: u64,
    /// Units probably unspent at `granted_at`: the grant, plus what a topped-up lease still
    /// held then.
    pub unspent_at_grant: u64,
}

impl Lease {
    /// Units of the lease probably not spent yet at `now`: its units less what its holder's
    /// rate spends from the grant on (all of it spent when no rate was given).
    pub fn unspent_units(&self, now: Timestamp) -> u64 {
        let Some(s) = self.spend else {
            return 0;
        };
        let age = now.saturating_duration_since(s.granted_at);
        let spent = u128::from(s.rate_units_per_sec) * age.as_nanos() / 1_000_000_000;
        s.unspent_at_grant
            .min(self.units)
            .saturating_sub(u64::try_from(spent).unwrap_or(u64::MAX))
    }
}

impl Lease {
    fn target(&self) -> LeaseTarget {
        LeaseTarget {
            limit: self.limit.clone(),
            key: self.key.clone(),
            window: self.window,
        }
    }
}

/// The counter a lease charged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseTarget {
    pub limit: LimitId,
    pub key: KeyId,
    pub window: WindowIndex,
}

/// A lease that ended, remembered so that reservations paid from it can still be settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EndedLease {
    pub target: LeaseTarget,
    /// Units still charged for it: no late refund may give back more.
    pub refundable_units: u64,
    /// Settle overage late settles may still charge: `max_settle_overage` times the units it
    /// kept, less what was charged already.
    pub overage_left_units: u64,
}

/// Every outstanding lease of the region, with an expiry index.
///
/// The index is a min-heap cleaned lazily: ending or renewing a lease leaves its old entry
/// behind, skipped when it surfaces (it no longer matches the lease). Pushing is all a grant
/// pays; the heap is rebuilt whenever stale entries outnumber live ones, which bounds it to
/// twice the outstanding leases.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeaseTable {
    by_id: BTreeMap<LeaseId, Lease>,
    expiry: BinaryHeap<Reverse<(Timestamp, LeaseId)>>,
    /// Recently ended leases, at most [`ENDED_LEASES_KEPT`]; the oldest ids go first.
    ended: BTreeMap<LeaseId, EndedLease>,
    /// Next id to hand out; ids are never reused for the life of the region's state.
    pub next_id: u64,
    /// Made durable a block at a time.
    pub ids: IdBlocks,
}

/// Stale heap entries tolerated beyond the live ones before a rebuild.
const EXPIRY_HEAP_SLACK: usize = 1_024;

impl LeaseTable {
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn get(&self, id: LeaseId) -> Option<&Lease> {
        self.by_id.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&LeaseId, &Lease)> {
        self.by_id.iter()
    }

    pub fn peek_id(&self) -> LeaseId {
        LeaseId(self.next_id.max(1))
    }

    pub fn insert(&mut self, id: LeaseId, lease: Lease) {
        self.next_id = self.next_id.max(id.0.saturating_add(1));
        // A lease put again at the expiry it has (a store's records replayed at a restart)
        // has its heap entry already: a second one would survive every rebuild.
        let known = self
            .by_id
            .get(&id)
            .is_some_and(|l| l.expires_at == lease.expires_at);
        if !known {
            self.expiry.push(Reverse((lease.expires_at, id)));
        }
        self.by_id.insert(id, lease);
        self.compact();
    }

    pub fn remove(&mut self, id: LeaseId) -> Option<Lease> {
        self.by_id.remove(&id)
    }

    /// Give back `units` of a live lease (a late refund while the agent still holds it).
    pub fn shrink(&mut self, id: LeaseId, units: u64) {
        if let Some(l) = self.by_id.get_mut(&id) {
            l.units = l.units.saturating_sub(units);
        }
    }

    /// Count `units` of settle overage charged against live lease `id`.
    pub fn add_overage(&mut self, id: LeaseId, units: u64) {
        if let Some(l) = self.by_id.get_mut(&id) {
            l.overage_units = l.overage_units.saturating_add(units);
        }
    }

    pub fn remember_ended(&mut self, id: LeaseId, ended: EndedLease) {
        self.ended.insert(id, ended);
        while self.ended.len() > ENDED_LEASES_KEPT {
            self.ended.pop_first();
        }
    }

    pub fn ended_mut(&mut self, id: LeaseId) -> Option<&mut EndedLease> {
        self.ended.get_mut(&id)
    }

    /// Adds `grant`'s units to live lease `id` (same key and window) and moves its expiry to
    /// `grant`'s if later; answers the expiry it now has.
    pub fn top_up(&mut self, id: LeaseId, grant: Lease, now: Timestamp) -> Timestamp {
        let Some(l) = self.by_id.get_mut(&id) else {
            debug_assert!(false, "topping up {id:?}, which is not live");
            return grant.expires_at;
        };
        debug_assert!(l.window == grant.window && l.key == grant.key);
        let unspent = l.unspent_units(now);
        l.units += grant.units;
        l.spend = grant.spend.map(|s| LeaseSpend {
            unspent_at_grant: unspent + grant.units,
            ..s
        });
        let at = l.expires_at.max(grant.expires_at);
        if at != l.expires_at {
            self.set_expiry(id, at);
        }
        at
    }

    pub fn set_expiry(&mut self, id: LeaseId, at: Timestamp) {
        if let Some(lease) = self.by_id.get_mut(&id) {
            lease.expires_at = at;
            self.expiry.push(Reverse((at, id)));
            self.compact();
        }
    }

    /// The earliest expiry of a live lease (stale entries are dropped on the way).
    pub fn next_expiry(&mut self) -> Option<Timestamp> {
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if self.is_current(at, id) {
                return Some(at);
            }
            self.expiry.pop();
        }
        None
    }

    /// The earliest expiry, without cleaning (it may be a stale entry's, so a little early).
    pub fn next_expiry_hint(&self) -> Option<Timestamp> {
        self.expiry.peek().map(|Reverse((at, _))| *at)
    }

    /// Ids of leases whose time is up at `now`.
    pub fn due(&mut self, now: Timestamp) -> Vec<LeaseId> {
        let mut due = Vec::new();
        while let Some(Reverse((at, id))) = self.expiry.peek().copied() {
            if at > now {
                break;
            }
            self.expiry.pop();
            if self.is_current(at, id) {
                due.push(id);
            }
        }
        due
    }

    /// Drop every lease of a limit; returns their ids.
    pub fn remove_limit(&mut self, limit: &LimitId) -> Vec<LeaseId> {
        let ids: Vec<LeaseId> = self
            .by_id
            .iter()
            .filter(|(_, l)| &l.limit == limit)
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.remove(*id);
        }
        self.ended.retain(|_, e| &e.target.limit != limit);
        ids
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
        self.expiry.clear();
        self.ended.clear();
    }

    fn is_current(&self, at: Timestamp, id: LeaseId) -> bool {
        self.by_id.get(&id).is_some_and(|l| l.expires_at == at)
    }

    fn compact(&mut self) {
        if self.expiry.len() > 2 * self.by_id.len() + EXPIRY_HEAP_SLACK {
            let by_id = &self.by_id;
            self.expiry
                .retain(|Reverse((at, id))| by_id.get(id).is_some_and(|l| l.expires_at == *at));
        }
        debug_assert!(self.expiry.len() <= 2 * self.by_id.len() + EXPIRY_HEAP_SLACK + 1);
    }
}

impl RegionBudget {
    /// Grant `min(units_wanted, available)` units for `min(ttl, lease_ttl_max)`, never past
    /// the end of the window; if that is fewer than `min_units` (at least 1), grant nothing.
    pub fn lease(&mut self, now: Timestamp, req: LeaseRequest) -> Result<LeaseOutcome> {
        self.saw_time(now);
        let request = req.request_id.map(|id| (id, req.fingerprint(None)));
        self.once(now, request, |b| b.lease_once(now, req))
    }

    /// Like [`Self::lease`], but the grant is added to `lease`, a live lease of the same key
    /// in the key's current window: a gateway holding one lease per key refills it instead of
    /// holding a new one each time (no new id, no lease to end, none counted against
    /// `max_leases_per_key`). Its expiry moves to what a new lease's would be, if later. A
    /// lease that has ended, or belongs to an earlier window, is not refilled: the grant is a
    /// new lease, with its own id. A lease of another key is `InvalidRequest`.
    pub fn top_up(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        req: LeaseRequest,
    ) -> Result<LeaseOutcome> {
        self.saw_time(now);
        let request = req.request_id.map(|id| (id, req.fingerprint(Some(lease))));
        self.once(now, request, |b| {
            let live = b.leases.get(lease).filter(|l| l.expires_at > now);
            if let Some(l) = live
                && (l.limit != req.limit || l.key != req.key)
            {
                return Err(Error::InvalidRequest(format!(
                    "lease {lease:?} is for {}/{}, not {}/{}",
                    l.limit, l.key, req.limit, req.key
                )));
            }
            let top_up = live.map(|l| (lease, l.window));
            b.lease_in(now, req, top_up)
        })
    }

    fn lease_once(&mut self, now: Timestamp, req: LeaseRequest) -> Result<LeaseOutcome> {
        self.lease_in(now, req, None)
    }

    fn lease_in(
        &mut self,
        now: Timestamp,
        req: LeaseRequest,
        top_up: Option<(LeaseId, WindowIndex)>,
    ) -> Result<LeaseOutcome> {
        if req.units_wanted == 0 || req.ttl.is_zero() {
            return Err(Error::InvalidRequest(
                "a lease needs at least one unit and a positive TTL".into(),
            ));
        }
        if req.min_units > req.units_wanted {
            return Err(Error::InvalidRequest(format!(
                "a lease of at most {} units cannot grant at least {}",
                req.units_wanted, req.min_units
            )));
        }
        let id = self.leases.peek_id();
        let terms = LeaseTerms {
            ctx: ctx_of(&self.cfg, &self.view, now),
            now,
            id,
            ttl: req.ttl.min(self.cfg.lease_ttl_max),
            max_leases: self.cfg.max_leases_per_key,
            top_up,
        };
        let lim = self
            .limits
            .get_mut(&req.limit)
            .ok_or_else(|| Error::UnknownLimit(req.limit.clone()))?;
        if let Some(d) = unmetered_decision(&lim.params, now) {
            return Ok(LeaseOutcome::Unmetered {
                units: req.units_wanted,
                reason: d.reason,
            });
        }
        let mut touched = Vec::new();
        let max_keys = self.cfg.max_keys_per_limit;
        let res = lim.with_key(now, &req.key, max_keys, &mut touched, |p, ks, stats| {
            lease_in_key(p, ks, stats, &terms, &req)
        });
        let unsaved = lim.stats.take_unsaved();
        self.mark_touched(&req.limit, touched);
        self.mark_stats(&req.limit, unsaved);
        let (mut outcome, lease, escalated) = res?;
        if let (Some(lease), LeaseOutcome::Granted(grant)) = (lease, &mut outcome) {
            if grant.lease == id {
                self.leases.insert(id, lease);
                if self.leases.ids.reserve(id.0) {
                    self.dirty.mark(Dirty::Meta);
                }
            } else {
                grant.expires_at = self.leases.top_up(grant.lease, lease, now);
            }
            self.dirty.mark(Dirty::Lease(grant.lease));
        }
        self.key_changed(&req.limit, &req.key, escalated);
        Ok(outcome)
    }

    /// Extend a live lease to `now + min(ttl, lease_ttl_max)`, never past its window's end
    /// and never shorter than it already was.
    pub fn renew(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        ttl: Duration,
        request_id: Option<RequestId>,
    ) -> Result<RenewOutcome> {
        self.saw_time(now);
        let request = request_id.map(|id| {
            let fp = RequestFingerprint::of("renew").u64(lease.0).duration(ttl);
            (id, fp.finish())
        });
        self.once(now, request, |b| b.renew_once(now, lease, ttl))
    }

    fn renew_once(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        ttl: Duration,
    ) -> Result<RenewOutcome> {
        let l = self.live_lease(now, lease)?;
        let ctx = super::ctx_of(&self.cfg, &self.view, now);
        let window_end = self.limits.get(&l.limit).map_or(l.expires_at, |lim| {
            admit::guarded_window_end(&lim.params, &ctx, l.window)
        });
        let wanted = (now + ttl.min(self.cfg.lease_ttl_max)).min(window_end);
        let expires_at = wanted.max(l.expires_at);
        self.leases.set_expiry(lease, expires_at);
        self.dirty.mark(Dirty::Lease(lease));
        Ok(RenewOutcome { lease, expires_at })
    }

    /// End a lease and refund its `unused_units`.
    pub fn release(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        unused_units: u64,
        request_id: Option<RequestId>,
    ) -> Result<ReleaseOutcome> {
        self.saw_time(now);
        let request = request_id.map(|id| {
            let fp = RequestFingerprint::of("release")
                .u64(lease.0)
                .u64(unused_units);
            (id, fp.finish())
        });
        self.once(now, request, |b| b.release_once(now, lease, unused_units))
    }

    fn release_once(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        unused_units: u64,
    ) -> Result<ReleaseOutcome> {
        let l = self.live_lease(now, lease)?;
        if unused_units > l.units {
            return Err(Error::InvalidRequest(format!(
                "lease {lease:?} holds {} units, cannot give back {unused_units}",
                l.units
            )));
        }
        self.end_lease(now, lease, Settlement::Refund(unused_units));
        Ok(ReleaseOutcome {
            refunded_units: unused_units,
        })
    }

    /// The limit of lease `id`, live or recently ended (for what the caller reports about it).
    pub fn lease_limit(&self, id: LeaseId) -> Option<&LimitId> {
        self.leases
            .get(id)
            .map(|l| &l.limit)
            .or_else(|| self.leases.ended.get(&id).map(|e| &e.target.limit))
    }

    /// Ends the leases a caller hands back with its next lease request, as [`Self::release`]
    /// would, and answers each lease it ended, with its limit and the units refunded. All or
    /// nothing: a return giving back more than
    /// its lease holds, or more than [`MAX_LEASE_RETURNS`] returns, change nothing and are
    /// `InvalidRequest`. A return naming a lease that has already ended (expired, released,
    /// or returned by an earlier try of the same call) is skipped: nothing is left to refund.
    pub fn release_returned(
        &mut self,
        now: Timestamp,
        returns: &[LeaseReturn],
    ) -> Result<Vec<ReturnedLease>> {
        self.saw_time(now);
        if returns.len() > MAX_LEASE_RETURNS {
            return Err(Error::InvalidRequest(format!(
                "at most {MAX_LEASE_RETURNS} leases can be returned in one call, found {}",
                returns.len()
            )));
        }
        for r in returns {
            if let Some(l) = self.leases.get(r.lease)
                && r.unused_units > l.units
            {
                return Err(Error::InvalidRequest(format!(
                    "lease {:?} holds {} units, cannot give back {}",
                    r.lease, l.units, r.unused_units
                )));
            }
        }
        let mut ended = Vec::new();
        for r in returns {
            let limit = self.leases.get(r.lease).map(|l| l.limit.clone());
            match self.release_once(now, r.lease, r.unused_units) {
                Ok(out) => ended.extend(limit.map(|limit| ReturnedLease {
                    limit,
                    refunded_units: out.refunded_units,
                })),
                Err(Error::UnknownLease(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ended)
    }

    /// End a lease at its true cost: refund `reserved - actual`, or charge `actual - reserved`
    /// even beyond the allowance (recorded as settle overage for the bound), but no more than
    /// the limit's `max_settle_overage` times the reservation: the rest is clamped, counted
    /// (`settle_clamped_units`) and answered in `clamped_units`.
    pub fn settle(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        actual_units: u64,
        request_id: Option<RequestId>,
    ) -> Result<SettleOutcome> {
        self.saw_time(now);
        let request = request_id.map(|id| {
            let fp = RequestFingerprint::of("settle")
                .u64(lease.0)
                .u64(actual_units);
            (id, fp.finish())
        });
        self.once(now, request, |b| b.settle_once(now, lease, actual_units))
    }

    fn settle_once(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        actual_units: u64,
    ) -> Result<SettleOutcome> {
        let live = self.live_lease(now, lease)?;
        let reserved = live.units;
        let over = actual_units.saturating_sub(reserved);
        let cap = self
            .max_overage_units(&live.limit, reserved)
            .saturating_sub(live.overage_units);
        let (charged, clamped) = self.clamp_overage(&live.target(), over, cap);
        let out = SettleOutcome {
            refunded_units: reserved.saturating_sub(actual_units),
            overage_units: charged,
            clamped_units: clamped,
        };
        let settlement = if over > 0 {
            Settlement::Overage(charged)
        } else {
            Settlement::Refund(out.refunded_units)
        };
        self.end_lease(now, lease, settlement);
        Ok(out)
    }

    /// A gateway reported `units` admitted that no lease of `limit` can be charged with (its
    /// leases ended or expired first, or the key had nothing left to lease): counted in the
    /// statistics of the window of `now`, which the coordinator then states unbounded. An
    /// unknown limit (removed by a reload) counts nowhere.
    pub fn record_uncharged(&mut self, now: Timestamp, limit: &LimitId, units: u64) {
        self.saw_time(now);
        if units == 0 {
            return;
        }
        let Some(lim) = self.limits.get_mut(limit) else {
            return;
        };
        let window = lim.params.window_index(now);
        if let Some(w) = lim.stats.window_mut(window) {
            w.add_uncharged(units);
        }
    }

    /// Most a settle may charge above a reservation of `reserved_units` of `limit`.
    fn max_overage_units(&self, limit: &LimitId, reserved_units: u64) -> u64 {
        self.limits.get(limit).map_or(0, |l| {
            l.params.spec.max_settle_overage_units(reserved_units)
        })
    }

    /// Split a settle's `over_units` into what its cap lets it charge and what is clamped;
    /// the clamped part is counted in the lease window's statistics and the region's.
    fn clamp_overage(
        &mut self,
        target: &LeaseTarget,
        over_units: u64,
        cap_units: u64,
    ) -> (u64, u64) {
        let charged = over_units.min(cap_units);
        let clamped = over_units - charged;
        if clamped > 0 {
            self.stats.settle_clamped_units =
                self.stats.settle_clamped_units.saturating_add(clamped);
            let window = self
                .limits
                .get_mut(&target.limit)
                .and_then(|l| l.stats.window_mut(target.window));
            if let Some(w) = window {
                w.add_settle_clamped(clamped);
            }
        }
        (charged, clamped)
    }

    /// The lease, if it is still live at `now`; a lease past its time is expired on the spot.
    fn live_lease(&mut self, now: Timestamp, id: LeaseId) -> Result<Lease> {
        match self.leases.get(id) {
            Some(l) if l.expires_at > now => Ok(l.clone()),
            Some(_) => {
                self.end_lease(now, id, Settlement::Expired);
                Err(Error::UnknownLease(id))
            }
            None => Err(Error::UnknownLease(id)),
        }
    }

    /// A reservation paid from `lease` settled at a size other than reserved, after the
    /// gateway stopped holding the lease (it released it, or let it expire). A refund gives
    /// the units back and an overage charges them (even past the allowance, recorded as settle
    /// overage), on the lease's counter while its window lasts. The overages charged against
    /// one lease add up to at most `max_settle_overage` times its units (the reservations paid
    /// from it); the rest is clamped, counted and answered in `clamped_units`. Once the window is over a
    /// refund changes nothing (the units stay spent in it) and an overage is still recorded in
    /// that window's statistics for the bound (the units were used in it), but charges no
    /// counter. Ended leases are remembered for a while (`ENDED_LEASES_KEPT`, not across a
    /// restart); a settle for one forgotten is `UnknownLease`.
    pub fn settle_reservation(
        &mut self,
        now: Timestamp,
        lease: LeaseId,
        delta: ReservationDelta,
        request_id: Option<RequestId>,
    ) -> Result<SettleOutcome> {
        self.saw_time(now);
        let request = request_id.map(|id| {
            let (how, units) = match delta {
                ReservationDelta::Refund { units } => ("refund", units),
                ReservationDelta::Overage { units } => ("overage", units),
            };
            let fp = RequestFingerprint::of("settle_reservation").u64(lease.0);
            (id, fp.str(how).u64(units).finish())
        });
        self.once(now, request, |b| {
            b.settle_reservation_once(now, lease, delta)
        })
    }

    fn settle_reservation_once(
        &mut self,
        now: Timestamp,
        id: LeaseId,
        delta: ReservationDelta,
    ) -> Result<SettleOutcome> {
        // A lease past its time is ended here, so it is found among the ended ones below.
        if let Ok(live) = self.live_lease(now, id) {
            return self.settle_live(now, id, &live, delta);
        }
        let ended = self.leases.ended_mut(id).ok_or(Error::UnknownLease(id))?;
        let target = ended.target.clone();
        let mut clamped = 0;
        let how = match delta {
            ReservationDelta::Refund { units } if units > ended.refundable_units => {
                return Err(Error::InvalidRequest(format!(
                    "lease {id:?} has {} units left to refund, not {units}",
                    ended.refundable_units
                )));
            }
            ReservationDelta::Refund { units } => {
                ended.refundable_units -= units;
                Settlement::Refund(units)
            }
            ReservationDelta::Overage { units } => {
                let cap = ended.overage_left_units;
                let charged = units.min(cap);
                ended.overage_left_units -= charged;
                let (charged, over_cap) = self.clamp_overage(&target, units, charged);
                clamped = over_cap;
                Settlement::Overage(charged)
            }
        };
        let on_counter = self.settle_on_key(now, &target, how, None);
        Ok(settle_outcome(how, on_counter, clamped))
    }

    /// A late settle for a lease the agent still holds (the gateway let it go a little early):
    /// a refund shrinks the lease, so that nothing is refunded twice.
    fn settle_live(
        &mut self,
        now: Timestamp,
        id: LeaseId,
        live: &Lease,
        delta: ReservationDelta,
    ) -> Result<SettleOutcome> {
        let mut clamped = 0;
        let how = match delta {
            ReservationDelta::Refund { units } if units > live.units => {
                return Err(Error::InvalidRequest(format!(
                    "lease {id:?} holds {} units, cannot give back {units}",
                    live.units
                )));
            }
            ReservationDelta::Refund { units } => {
                self.leases.shrink(id, units);
                self.dirty.mark(Dirty::Lease(id));
                Settlement::Refund(units)
            }
            ReservationDelta::Overage { units } => {
                let cap = self
                    .max_overage_units(&live.limit, live.units)
                    .saturating_sub(live.overage_units);
                let (charged, over_cap) = self.clamp_overage(&live.target(), units, cap);
                self.leases.add_overage(id, charged);
                clamped = over_cap;
                Settlement::Overage(charged)
            }
        };
        let on_counter = self.settle_on_key(now, &live.target(), how, None);
        Ok(settle_outcome(how, on_counter, clamped))
    }

    /// Remove a lease and apply its settlement to its key.
    pub(crate) fn end_lease(&mut self, now: Timestamp, id: LeaseId, how: Settlement) {
        let Some(lease) = self.leases.remove(id) else {
            return;
        };
        self.dirty.mark(Dirty::Lease(id));
        let (refundable_units, charged) = match how {
            Settlement::Expired => (lease.units, 0),
            Settlement::Refund(units) => (lease.units.saturating_sub(units), 0),
            Settlement::Overage(units) => (0, units),
        };
        // Reservations settled later were paid from the units it kept.
        let kept = match how {
            Settlement::Refund(units) => lease.units.saturating_sub(units),
            _ => lease.units,
        };
        let overage_left_units = self
            .max_overage_units(&lease.limit, kept)
            .saturating_sub(lease.overage_units.saturating_add(charged));
        let target = lease.target();
        self.leases.remember_ended(
            id,
            EndedLease {
                target: target.clone(),
                refundable_units,
                overage_left_units,
            },
        );
        self.settle_on_key(now, &target, how, Some(id));
    }

    /// Apply a settlement to the counter a lease charged, if the key is still in the lease's
    /// window (and drop `ending` from the key's leases). An overage is recorded in the
    /// window's statistics even when the window is over. Returns whether the counter moved.
    fn settle_on_key(
        &mut self,
        now: Timestamp,
        target: &LeaseTarget,
        how: Settlement,
        ending: Option<LeaseId>,
    ) -> bool {
        let Some(lim) = self.limits.get_mut(&target.limit) else {
            return false;
        };
        let mut window_stats = lim.stats.window_mut(target.window);
        let ks = lim
            .keys
            .get_mut(target.key.as_str())
            .filter(|ks| ks.window == target.window);
        let applied = match ks {
            // The key moved on: the window is over and the lease's units stay spent.
            None => {
                if let (Settlement::Overage(units), Some(s)) = (how, window_stats.as_deref_mut()) {
                    s.add_settle_overage(units);
                }
                false
            }
            Some(ks) => {
                if let (Some(hot), Some(id)) = (ks.hot.as_mut(), ending) {
                    hot.leases.retain(|l| *l != id);
                }
                apply_settlement(ks, lim.params.rate, window_stats, now, how);
                true
            }
        };
        for w in lim.stats.take_unsaved() {
            self.dirty.mark(Dirty::Stats(target.limit.clone(), w));
        }
        if applied {
            let key = target.key.clone();
            self.dirty.mark(Dirty::Key(target.limit.clone(), key));
        }
        applied
    }
}

/// A refund or an overage on a key in the lease's window.
fn apply_settlement(
    ks: &mut KeyState,
    rate: Option<Gcra>,
    stats: Option<&mut WindowStats>,
    now: Timestamp,
    how: Settlement,
) {
    match how {
        Settlement::Expired => {}
        Settlement::Refund(units) => {
            debug_assert!(units <= ks.net_units());
            ks.refunded_units = ks.refunded_units.saturating_add(units);
            let state = ks.hot.as_mut().and_then(|h| h.rate.as_mut());
            if let (Some(g), Some(s)) = (rate, state) {
                g.refund(s, now, units);
            }
        }
        Settlement::Overage(units) => {
            ks.granted_units = ks.granted_units.saturating_add(units);
            ks.hot_mut().excess_units += units;
            if let Some(s) = stats {
                s.add_settle_overage(units);
            }
        }
    }
    debug_assert!(ks.refunded_units <= ks.granted_units);
}

/// What a late settle did: the refund, if it reached the counter, or the overage charged
/// (to the counter, or to the ended window's statistics) and what its cap clamped.
fn settle_outcome(how: Settlement, on_counter: bool, clamped_units: u64) -> SettleOutcome {
    let (refunded_units, overage_units) = match how {
        Settlement::Refund(units) if on_counter => (units, 0),
        Settlement::Overage(units) => (0, units),
        Settlement::Refund(_) | Settlement::Expired => (0, 0),
    };
    SettleOutcome {
        refunded_units,
        overage_units,
        clamped_units,
    }
}

/// What a lease grant needs besides the key: the call's context and the new lease's terms.
struct LeaseTerms {
    ctx: Ctx,
    now: Timestamp,
    id: LeaseId,
    ttl: Duration,
    max_leases: usize,
    /// A live lease of the key to add the grant to, if it belongs to the key's current window
    /// (otherwise the grant is a new lease, `id`).
    top_up: Option<(LeaseId, WindowIndex)>,
}

/// Decide a lease on one key: the outcome, the lease to record if granted, and whether the key
/// escalated.
fn lease_in_key(
    p: &LimitParams,
    ks: &mut KeyState,
    stats: &mut LimitStats,
    t: &LeaseTerms,
    req: &LeaseRequest,
) -> (LeaseOutcome, Option<Lease>, bool) {
    let now = t.now;
    // In the end band a refill is a new lease: the live one may hold units granted before the
    // band, which the next window does not count, and must keep its guarded expiry.
    let end_band = matches!(
        admit::edge_band(p, &t.ctx, ks.window, now),
        Some((admit::BandSide::End, _))
    );
    let top_up = t
        .top_up
        .filter(|(_, w)| *w == ks.window && !end_band)
        .map(|(id, _)| id);
    if top_up.is_none()
        && ks
            .hot
            .as_ref()
            .is_some_and(|h| h.leases.len() >= t.max_leases)
    {
        ks.hot_mut().refused_this_window = true;
        if let Some(s) = stats.window_mut(ks.window) {
            s.denials += 1;
            s.denied_units += req.units_wanted;
        }
        let d = Decision {
            allowed: false,
            remaining_units: 0,
            retry_after: None,
            reset_after: p.window_end(ks.window).saturating_duration_since(now),
            limit_units: p.quota_units(),
            shadow_denied: false,
            reason: Reason::TooManyLeases,
        };
        return (LeaseOutcome::Denied(d), None, false);
    }
    // Units the gateway refused while an agent refusal of an earlier window held are that
    // window's demand, not this one's: counted here they would read, early in the window,
    // as a rate several times the real one and pull quota away from regions that need it.
    let refused_here = ks.hot.as_ref().is_some_and(|h| h.refused_this_window);
    if req.denied_units > 0 && refused_here {
        ks.hot_mut().denied_units += req.denied_units;
        if let Some(s) = stats.window_mut(ks.window) {
            s.denied_units += req.denied_units;
        }
    }
    let want = Want::UpTo {
        units: spendable_units(p, ks.window, now, req),
        min_units: req.min_units,
    };
    let adm = admit::admit(p, ks, stats, &t.ctx, now, want);
    if !adm.allowed {
        let d = decision_of(p, ks, &adm, now);
        return (LeaseOutcome::Denied(d), None, adm.escalated);
    }
    // A lease granted in the end band, every unit of which the next window counts too, may
    // last to the window's own end; any other, to the end less the band.
    let window_end = if end_band {
        p.window_end(ks.window)
    } else {
        admit::guarded_window_end(p, &t.ctx, ks.window)
    };
    let expires_at = (now + t.ttl).min(window_end);
    if top_up.is_none() {
        let leases = &mut ks.hot_mut().leases;
        leases.push(t.id);
        debug_assert!(leases.len() <= t.max_leases);
    }
    let grant = LeaseGrant {
        lease: top_up.unwrap_or(t.id),
        units: adm.units,
        expires_at,
        window: ks.window,
        remaining_units: adm.allowance.units.saturating_sub(ks.net_units()),
        shadow_denied: adm.shadow_denied,
        reason: adm.reason,
    };
    let lease = Lease {
        limit: req.limit.clone(),
        key: req.key.clone(),
        window: ks.window,
        units: adm.units,
        expires_at,
        spend: req.rate_units_per_sec.map(|rate_units_per_sec| LeaseSpend {
            granted_at: now,
            rate_units_per_sec,
            unspent_at_grant: adm.units,
        }),
        overage_units: 0,
    };
    (LeaseOutcome::Granted(grant), Some(lease), adm.escalated)
}

/// The units a lease may usefully hold: what was wanted, cut to what the caller's rate spends
/// before the window (and so the lease) ends, rounded up, but never below `min_units`.
fn spendable_units(
    p: &LimitParams,
    window: WindowIndex,
    now: Timestamp,
    req: &LeaseRequest,
) -> u64 {
    let Some(rate) = req.rate_units_per_sec else {
        return req.units_wanted;
    };
    let left = p.window_end(window).saturating_duration_since(now);
    let by_rate = (u128::from(rate) * left.as_nanos()).div_ceil(1_000_000_000);
    let by_rate = u64::try_from(by_rate).unwrap_or(u64::MAX);
    req.units_wanted.min(by_rate).max(req.min_units.max(1))
}

/// How a lease ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settlement {
    /// Its time ran out: nothing comes back.
    Expired,
    /// Unused units come back.
    Refund(u64),
    /// It used more than reserved: charge the difference.
    Overage(u64),
}
