//! Gateway-side lease logic: spend leased units locally, ask the agent for more before they run
//! out, give back what is not used.
//!
//! A [`Gateway`] is a deterministic state machine like the rest of the core: time comes in as
//! `now` (the gateway's own clock), decisions come out of [`Gateway::try_spend`], and messages
//! for the agent come out of [`Gateway::poll_transmit`]; the agent's answers go back in through
//! `handle_lease_*`. The `client` crate and the simulator drive the same code.
//!
//! Per key it holds up to `max_leases_per_key` leases (id, units left, expiry). Spending a unit
//! touches only that key's slot (no allocation, no lookup by name when the caller keeps the
//! [`KeyHandle`]). A lease spent to its last unit is reported to the agent as ended (a release
//! of 0 units), so that it stops counting against the key's leases there. Leases are sized by the key's observed rate and shrink to one unit near the
//! limit ([`sizing`]). An expired lease is dropped unspent: the agent counts its units as spent,
//! so spending it would admit units twice. A denied key is denied locally until the agent's
//! `retry_after` (a negative cache), so a hot denied key does not flood the agent.
//!
//! A lease's expiry is counted on the gateway's clock from the moment it sent the request, for
//! the grant's TTL, less a margin: never from the agent's absolute expiry, so the two clocks
//! need not agree at all. The gateway's clock must not go back, and may run slow against the
//! agent's by at most [`GATEWAY_CLOCK_DRIFT_PPM`] (docs/bound.md, gateway terms).

mod sizing;
mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

pub use types::{
    Chunk, GatewayConfig, GatewayStats, KeyHandle, LeaseDenial, LeaseGrant, LeaseRelease,
    LeaseSettle, LeaseTicket, LeaseWanted, SettleDelta, Spend, SpendReceipt, ToAgent,
};

use crate::error::{Error, Result};
use crate::ids::{KeyId, LeaseId, LimitId};
use crate::time::{Timestamp, duration_nanos};
use sizing::{RateEstimate, SizeInputs, lease_size};

/// The fixed expiry margin is cut to at most `ttl / EXPIRY_MARGIN_TTL_DIVISOR`, so that a short
/// lease (one that ends with its window) keeps most of its life; it still covers a 5% drift.
pub const EXPIRY_MARGIN_TTL_DIVISOR: u32 = 20;

/// The expiry margin is at least this share of the TTL, in parts per million: the most a
/// gateway's clock may run slow against its agent's over a lease's life. NTP slews a clock by
/// at most 500 ppm, so two hosts slewing apart differ by 1,000; this doubles it. Without it a
/// long lease had the fixed margin alone (50 ms of a 60 s lease: 833 ppm).
pub const GATEWAY_CLOCK_DRIFT_PPM: u64 = 2_000;

const PPM: u128 = 1_000_000;

/// A chunk ([`Gateway::carve`]) takes at most this fraction of its lease's units left, so the
/// lease's units leave in steps and the refill trigger, which sees the chunks as spent, still
/// asks for the next lease before the last step is spent.
pub const CHUNK_LEASE_DIVISOR: u64 = 4;

/// One lease as the gateway holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HeldLease {
    id: LeaseId,
    units_left: u64,
    /// On the gateway's clock, already shortened by the expiry margin.
    expires_at: Timestamp,
}

/// The key's lease request, if one is wanted or on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    None,
    /// Waiting in the queue of [`Gateway::poll_transmit`]; the lease must cover `cost_units`.
    Queued {
        cost_units: u64,
    },
    /// Sent at `sent_at`; the answer must name `seq`.
    Sent {
        seq: u32,
        sent_at: Timestamp,
    },
}

#[derive(Clone, Debug)]
struct HeldKey {
    limit: LimitId,
    key: KeyId,
    /// Capacity `max_leases_per_key`, reserved when the key is added.
    leases: Vec<HeldLease>,
    ask: Ask,
    next_seq: u32,
    /// Cost of the request that last found no lease able to pay it.
    waiting_cost_units: u64,
    /// Units denied here from the agent's last denial, reported with the next request.
    denied_locally_units: u64,
    /// Ask for the next lease once held units fall below this.
    refill_below_units: u64,
    /// Below this, the key is refilled with any other key's request (`early_refill_percent`).
    early_below_units: u64,
    /// The key is in the gateway's `early` queue (at most once).
    early_listed: bool,
    /// The lease the request in flight asked to refill in place, if any. Emptied meanwhile,
    /// it is not reported ended until the answer: the agent may be adding to it.
    refill_of: Option<LeaseId>,
    /// `refill_of` was spent to its last unit while the refill was in flight, and its end is
    /// not reported yet.
    refill_of_emptied: bool,
    denied_until: Option<Timestamp>,
    unavailable_until: Option<Timestamp>,
    rate: RateEstimate,
    remaining_hint_units: Option<u64>,
    last_active_at: Timestamp,
}

impl HeldKey {
    /// Could ride with another key's request: nothing asked, room for a lease, below the
    /// early mark, not held back by a denial or an unreachable agent.
    fn wants_early(&self, now: Timestamp, max_leases: usize) -> bool {
        self.ask == Ask::None
            && self.leases.len() < max_leases
            && held_units(&self.leases) < self.early_below_units
            && self.denied_until.is_none_or(|t| now >= t)
            && self.unavailable_until.is_none_or(|t| now >= t)
    }

    /// Sets both refill marks from a grant of `units`.
    fn mark_refills(&mut self, config: &GatewayConfig, units: u64) {
        self.refill_below_units = units * u64::from(config.refill_threshold_percent) / 100;
        self.early_below_units = units * u64::from(config.early_refill_percent) / 100;
    }

    /// Queues a request for the next lease once the held units run low.
    fn prefetch_if_low(&mut self, max_leases: usize) {
        let low = self.ask == Ask::None
            && self.leases.len() < max_leases
            && held_units(&self.leases) < self.refill_below_units;
        if low {
            self.ask = Ask::Queued { cost_units: 1 };
        }
    }

    /// No held lease can pay `units`: make sure a lease that can is asked for.
    fn wait_for(&mut self, units: u64) {
        self.waiting_cost_units = units;
        self.ask = match self.ask {
            Ask::None => Ask::Queued { cost_units: units },
            Ask::Queued { cost_units } => Ask::Queued {
                cost_units: cost_units.max(units),
            },
            sent @ Ask::Sent { .. } => sent,
        };
    }
}

#[derive(Clone, Debug)]
struct Slot {
    generation: u32,
    state: Option<HeldKey>,
}

/// The gateway's leases for every key it serves. See the module documentation.
#[derive(Clone, Debug)]
pub struct Gateway {
    config: GatewayConfig,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    index: BTreeMap<LimitId, BTreeMap<KeyId, u32>>,
    /// Slots whose ask is `Queued`; each slot appears at most once (a queued key is never
    /// dropped), so the queue never holds more than `max_keys` entries.
    wants: VecDeque<u32>,
    /// Slots past their early mark, refilled with the next request that goes anyway. At most
    /// `max_keys` entries: a key is listed once, and entries left by forgotten keys are
    /// checked again (and dropped) when the queue is drained.
    early: VecDeque<u32>,
    outbox: VecDeque<ToAgent>,
    next_sweep_at: Option<Timestamp>,
    stats: GatewayStats,
}

impl Gateway {
    pub fn new(config: GatewayConfig) -> Result<Self> {
        config.validate()?;
        Ok(Gateway {
            wants: VecDeque::with_capacity(config.max_keys),
            early: VecDeque::new(),
            config,
            slots: Vec::new(),
            free_slots: Vec::new(),
            index: BTreeMap::new(),
            outbox: VecDeque::new(),
            next_sweep_at: None,
            stats: GatewayStats::default(),
        })
    }

    pub fn config(&self) -> &GatewayConfig {
        &self.config
    }

    pub fn stats(&self) -> GatewayStats {
        self.stats
    }

    /// Number of keys tracked now.
    pub fn key_count(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// The handle of `(limit, key)`, adding the key if it is new. Keep the handle: spending by
    /// handle needs no lookup.
    pub fn key(&mut self, now: Timestamp, limit: &LimitId, key: &KeyId) -> Result<KeyHandle> {
        if let Some(&slot) = self.index.get(limit).and_then(|keys| keys.get(key)) {
            return Ok(self.handle_of(slot));
        }
        let slot = self.allocate_slot(limit, key)?;
        let state = HeldKey {
            limit: limit.clone(),
            key: key.clone(),
            leases: Vec::with_capacity(self.config.max_leases_per_key),
            ask: Ask::None,
            next_seq: 0,
            waiting_cost_units: 0,
            denied_locally_units: 0,
            refill_below_units: 0,
            early_below_units: 0,
            early_listed: false,
            refill_of: None,
            refill_of_emptied: false,
            denied_until: None,
            unavailable_until: None,
            rate: RateEstimate::new(now),
            remaining_hint_units: None,
            last_active_at: now,
        };
        self.slots[slot as usize].state = Some(state);
        self.index
            .entry(limit.clone())
            .or_default()
            .insert(key.clone(), slot);
        if self.next_sweep_at.is_none() {
            self.next_sweep_at = Some(now + self.config.sweep_interval);
        }
        Ok(self.handle_of(slot))
    }

    /// Decides one request of `units` (at least 1) for the key: the hot path. Allocates
    /// nothing but, rarely, room in the outbox for the end of a lease it spent to the last
    /// unit.
    pub fn try_spend(&mut self, now: Timestamp, handle: KeyHandle, units: u64) -> Spend {
        match self.carve(now, handle, units, units) {
            Ok(chunk) => Spend::Spent(chunk.receipt),
            Err(outcome) => outcome,
        }
    }

    /// Like [`Gateway::try_spend`], but takes from one lease a chunk of
    /// `max(units, min(max_units, units_left / CHUNK_LEASE_DIVISOR))` units, for a driver to
    /// spend `units` of it now and the rest without the gateway until the chunk's
    /// `expires_at`. The whole chunk counts as spent here (the rate sample records it, the
    /// refill trigger sees it gone); what is left of it comes back with [`Gateway::settle`]
    /// at the units really spent. `Err` is the outcome for the request when no lease could
    /// pay (never [`Spend::Spent`]).
    pub fn carve(
        &mut self,
        now: Timestamp,
        handle: KeyHandle,
        units: u64,
        max_units: u64,
    ) -> Result<Chunk, Spend> {
        debug_assert!(units > 0, "a request costs at least one unit");
        let max_leases = self.config.max_leases_per_key;
        let Some(state) = slot_state_mut(&mut self.slots, handle) else {
            return Err(Spend::UnknownKey);
        };
        state.last_active_at = now;
        state.rate.record(units);
        if let Some(until) = state.denied_until {
            if now < until {
                state.denied_locally_units = state.denied_locally_units.saturating_add(units);
                return Err(Spend::Denied {
                    retry_after: until.saturating_duration_since(now),
                });
            }
            state.denied_until = None;
        }
        self.stats.expired_units += drop_expired(&mut state.leases, now);
        let ask_before = state.ask;
        let mut emptied = None;
        let outcome = match take_chunk(&mut state.leases, units, max_units) {
            Some(taken) => {
                // The request itself was recorded above; the rest of the chunk is demand too.
                state.rate.record(taken.units - units);
                state.prefetch_if_low(max_leases);
                let list_early = !state.early_listed
                    && state.wants_early(now, max_leases)
                    && self.early.len() < self.config.max_keys;
                if list_early {
                    state.early_listed = true;
                    self.early.push_back(handle.slot);
                }
                emptied = taken.emptied.then_some(taken.lease);
                Ok(Chunk {
                    receipt: SpendReceipt {
                        handle,
                        lease: taken.lease,
                        units: taken.units,
                    },
                    expires_at: taken.expires_at,
                })
            }
            None if state.unavailable_until.is_some_and(|until| now < until) => {
                Err(Spend::Unavailable)
            }
            None => {
                state.wait_for(units);
                Err(Spend::Wait)
            }
        };
        // A key enters the queue only when its ask goes from None to Queued, so it is queued
        // at most once (the queue's bound) with no search of the queue.
        if ask_before == Ask::None && matches!(state.ask, Ask::Queued { .. }) {
            self.wants.push_back(handle.slot);
        }
        let refilling = matches!(state.ask, Ask::Sent { .. }) && state.refill_of == emptied;
        if refilling {
            state.refill_of_emptied = true;
        }
        if let Some(lease) = emptied.filter(|_| !refilling) {
            // The agent counts a lease against the key's lease cap until it hears it ended:
            // left to expire, spent leases would starve a hot key of new ones. One being
            // refilled is reported when the refill is answered (`end_refill`).
            self.send(ToAgent::Release(LeaseRelease { lease, units: 0 }));
        }
        outcome
    }

    /// Whether [`Gateway::try_spend`] at `now` would spend `units` for the key from a held
    /// lease: not denied locally, and one live lease holds them all. Changes nothing, so a
    /// caller deciding several keys as one (all spent or none) checks each before spending any.
    pub fn can_spend(&self, now: Timestamp, handle: KeyHandle, units: u64) -> bool {
        let Some(state) = slot_state(&self.slots, handle) else {
            return false;
        };
        if state.denied_until.is_some_and(|until| now < until) {
            return false;
        }
        state
            .leases
            .iter()
            .any(|l| now < l.expires_at && l.units_left >= units)
    }

    /// Settles a reservation at its actual size. While the lease that paid for it is held the
    /// difference is settled locally; otherwise it goes to the agent.
    pub fn settle(&mut self, now: Timestamp, receipt: SpendReceipt, actual_units: u64) {
        let held = slot_state_mut(&mut self.slots, receipt.handle).and_then(|state| {
            state
                .leases
                .iter_mut()
                .find(|l| l.id == receipt.lease && now < l.expires_at)
        });
        let unpaid = match held {
            Some(lease) if actual_units <= receipt.units => {
                lease.units_left += receipt.units - actual_units;
                None
            }
            Some(lease) => {
                let over = actual_units - receipt.units;
                let taken = over.min(lease.units_left);
                lease.units_left -= taken;
                (over > taken).then(|| SettleDelta::Overage {
                    units: over - taken,
                })
            }
            None if actual_units < receipt.units => Some(SettleDelta::Refund {
                units: receipt.units - actual_units,
            }),
            None if actual_units > receipt.units => Some(SettleDelta::Overage {
                units: actual_units - receipt.units,
            }),
            None => None,
        };
        if let Some(delta) = unpaid {
            self.send(ToAgent::Settle(LeaseSettle {
                lease: receipt.lease,
                delta,
            }));
        }
    }

    /// The next message for the agent: releases and settles first (units flow back before
    /// more are asked for), then lease requests, sized now from the latest rate.
    pub fn poll_transmit(&mut self, now: Timestamp) -> Option<ToAgent> {
        if let Some(msg) = self.outbox.pop_front() {
            return Some(msg);
        }
        if !self.wants.is_empty() {
            self.refill_early(now);
        }
        while let Some(slot) = self.wants.pop_front() {
            let entry = &mut self.slots[slot as usize];
            let generation = entry.generation;
            let Some(state) = entry.state.as_mut() else {
                continue;
            };
            let Ask::Queued { cost_units } = state.ask else {
                continue;
            };
            state.rate.sample(now);
            let units = lease_size(
                &self.config,
                SizeInputs {
                    rate_units_per_sec: state.rate.units_per_sec(),
                    remaining_hint_units: state.remaining_hint_units,
                    cost_units,
                },
            );
            let seq = state.next_seq;
            state.next_seq = state.next_seq.wrapping_add(1);
            state.ask = Ask::Sent { seq, sent_at: now };
            let refill = if self.config.refill_in_place {
                refill_target(&state.leases, now + self.config.lease_request_timeout)
            } else {
                None
            };
            state.refill_of = refill;
            state.refill_of_emptied = false;
            return Some(ToAgent::LeaseWanted(LeaseWanted {
                ticket: LeaseTicket {
                    handle: KeyHandle { slot, generation },
                    seq,
                },
                limit: state.limit.clone(),
                key: state.key.clone(),
                units,
                min_units: cost_units,
                denied_units: std::mem::take(&mut state.denied_locally_units),
                rate_units_per_sec: state.rate.units_per_sec(),
                refill,
            }));
        }
        None
    }

    /// A request goes to the agent anyway: every key listed past its early mark that still
    /// wants a lease is asked for with it ([`Gateway::poll_transmit`] calls this itself when
    /// it has a request to send). A driver serving several gateways calls it on the others
    /// when one of them has a request, then polls them, so the round's requests share one
    /// exchange.
    pub fn refill_early(&mut self, now: Timestamp) {
        let max_leases = self.config.max_leases_per_key;
        while let Some(slot) = self.early.pop_front() {
            let Some(state) = self.slots[slot as usize].state.as_mut() else {
                continue;
            };
            state.early_listed = false;
            if state.wants_early(now, max_leases) {
                state.ask = Ask::Queued { cost_units: 1 };
                self.wants.push_back(slot);
                self.stats.early_refills += 1;
            }
        }
    }

    /// The agent granted a lease. A grant nobody waits for any more is released at once, so
    /// its units are never stranded.
    pub fn handle_lease_granted(&mut self, now: Timestamp, ticket: LeaseTicket, grant: LeaseGrant) {
        if let Some(lease) = self.end_refill(ticket, Some(grant.lease)) {
            self.send(ToAgent::Release(LeaseRelease { lease, units: 0 }));
        }
        let config = &self.config;
        let Some((state, sent_at)) = waiting_state(&mut self.slots, ticket) else {
            self.stats.late_grants += 1;
            // A late refill of a lease still held only adds to it: releasing it would end the
            // lease being spent.
            let held = slot_state_mut(&mut self.slots, ticket.handle)
                .and_then(|s| s.leases.iter_mut().find(|l| l.id == grant.lease));
            match held {
                Some(l) => l.units_left = l.units_left.saturating_add(grant.units),
                None => self.release(grant.lease, grant.units),
            }
            return;
        };
        state.ask = Ask::None;
        state.denied_until = None;
        state.unavailable_until = None;
        state.remaining_hint_units = Some(grant.remaining_units);
        if grant.units == 0 {
            return;
        }
        let expires_at = (sent_at + grant.ttl).saturating_sub(expiry_margin(config, grant.ttl));
        if let Some(l) = state.leases.iter_mut().find(|l| l.id == grant.lease) {
            // A refill in place: the agent added the units to this lease and moved its expiry
            // to the later of the two, measured here from when the refill was asked.
            l.units_left = l.units_left.saturating_add(grant.units);
            l.expires_at = l.expires_at.max(expires_at);
            state.mark_refills(config, grant.units);
            state.waiting_cost_units = 0;
            return;
        }
        let mut released = Vec::new();
        if expires_at > now {
            // Leftovers too small for the request that waited would only expire unused.
            let too_small = state.waiting_cost_units;
            state.leases.retain(|l| {
                let keep = l.units_left >= too_small;
                if !keep {
                    released.push((l.id, l.units_left));
                }
                keep
            });
        }
        if expires_at <= now || state.leases.len() >= config.max_leases_per_key {
            released.push((grant.lease, grant.units));
        } else {
            state.leases.push(HeldLease {
                id: grant.lease,
                units_left: grant.units,
                expires_at,
            });
            state.mark_refills(config, grant.units);
            state.waiting_cost_units = 0;
        }
        for (lease, units) in released {
            self.release(lease, units);
        }
    }

    /// The agent granted nothing: deny the key locally until `retry_after` has passed, and ask
    /// small next time (the key is at its limit).
    pub fn handle_lease_denied(
        &mut self,
        now: Timestamp,
        ticket: LeaseTicket,
        denial: LeaseDenial,
    ) {
        if let Some(lease) = self.end_refill(ticket, None) {
            self.send(ToAgent::Release(LeaseRelease { lease, units: 0 }));
        }
        if let Some((state, _)) = waiting_state(&mut self.slots, ticket) {
            state.ask = Ask::None;
            state.denied_until = Some(now + denial.retry_after);
            state.remaining_hint_units = Some(0);
        }
    }

    /// The agent could not be reached for this request.
    pub fn handle_agent_unavailable(&mut self, now: Timestamp, ticket: LeaseTicket) {
        if let Some(lease) = self.end_refill(ticket, None) {
            self.send(ToAgent::Release(LeaseRelease { lease, units: 0 }));
        }
        let backoff = self.config.unavailable_backoff;
        if let Some((state, _)) = waiting_state(&mut self.slots, ticket) {
            state.ask = Ask::None;
            state.unavailable_until = Some(now + backoff);
        }
    }

    /// When [`Gateway::handle_timeout`] next has work: the next sweep, while any key is held.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.next_sweep_at
    }

    /// Sweeps every key: drops expired leases, abandons unanswered requests, releases the
    /// units of idle keys and forgets idle keys that hold nothing.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        if self.next_sweep_at.is_none_or(|at| now < at) {
            return;
        }
        for slot in 0..self.slots.len() {
            self.sweep_slot(now, slot);
        }
        self.next_sweep_at = (self.key_count() > 0).then(|| now + self.config.sweep_interval);
    }

    /// Gives back every unused unit (graceful shutdown). Keys stay known.
    pub fn release_all(&mut self, now: Timestamp) {
        let mut released = Vec::new();
        for state in self.slots.iter_mut().filter_map(|s| s.state.as_mut()) {
            self.stats.expired_units += drop_expired(&mut state.leases, now);
            released.extend(state.leases.drain(..).map(|l| (l.id, l.units_left)));
        }
        for (lease, units) in released {
            self.release(lease, units);
        }
    }

    /// Whether the handle still names a tracked key (idle keys are forgotten).
    pub fn contains(&self, handle: KeyHandle) -> bool {
        slot_state(&self.slots, handle).is_some()
    }

    /// Units held for the key in unexpired leases (0 for an unknown handle).
    pub fn held_units(&self, now: Timestamp, handle: KeyHandle) -> u64 {
        let Some(state) = slot_state(&self.slots, handle) else {
            return 0;
        };
        state
            .leases
            .iter()
            .filter(|l| now < l.expires_at)
            .map(|l| l.units_left)
            .sum()
    }

    fn handle_of(&self, slot: u32) -> KeyHandle {
        KeyHandle {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    fn allocate_slot(&mut self, limit: &LimitId, key: &KeyId) -> Result<u32> {
        if let Some(slot) = self.free_slots.pop() {
            return Ok(slot);
        }
        if self.slots.len() >= self.config.max_keys {
            return Err(Error::TooManyKeys {
                limit: limit.clone(),
                key: key.clone(),
                max_keys: self.config.max_keys,
            });
        }
        self.slots.push(Slot {
            generation: 0,
            state: None,
        });
        // validate() checked that max_keys fits in u32, and slots.len() < max_keys here.
        Ok((self.slots.len() - 1) as u32)
    }

    fn sweep_slot(&mut self, now: Timestamp, slot: usize) {
        let request_timeout = self.config.lease_request_timeout;
        let idle_release_after = self.config.idle_release_after;
        let Some(state) = self.slots[slot].state.as_mut() else {
            return;
        };
        self.stats.expired_units += drop_expired(&mut state.leases, now);
        let mut abandoned_refill = None;
        if let Ask::Sent { sent_at, .. } = state.ask
            && now.saturating_duration_since(sent_at) >= request_timeout
        {
            state.ask = Ask::None;
            abandoned_refill = emptied_refill(state, None);
        }
        state.denied_until = state.denied_until.filter(|&t| now < t);
        state.unavailable_until = state.unavailable_until.filter(|&t| now < t);
        if let Some(lease) = abandoned_refill {
            self.send(ToAgent::Release(LeaseRelease { lease, units: 0 }));
        }
        let Some(state) = self.slots[slot].state.as_mut() else {
            return;
        };
        let idle = now.saturating_duration_since(state.last_active_at) >= idle_release_after;
        if !idle {
            return;
        }
        let released: Vec<(LeaseId, u64)> = state
            .leases
            .drain(..)
            .map(|l| (l.id, l.units_left))
            .collect();
        let forgettable = state.ask == Ask::None
            && state.denied_until.is_none()
            && state.unavailable_until.is_none();
        if forgettable {
            self.forget_slot(slot);
        }
        for (lease, units) in released {
            self.release(lease, units);
        }
    }

    /// The answer to `ticket` came (naming `granted`, for a grant) or never will: the lease
    /// its refill named, if emptied meanwhile and not the one granted, is reported ended now.
    fn end_refill(&mut self, ticket: LeaseTicket, granted: Option<LeaseId>) -> Option<LeaseId> {
        let state = waiting_state(&mut self.slots, ticket)?.0;
        emptied_refill(state, granted)
    }

    fn forget_slot(&mut self, slot: usize) {
        let Some(state) = self.slots[slot].state.take() else {
            return;
        };
        if let Some(keys) = self.index.get_mut(&state.limit) {
            keys.remove(&state.key);
            if keys.is_empty() {
                self.index.remove(&state.limit);
            }
        }
        self.slots[slot].generation = self.slots[slot].generation.wrapping_add(1);
        // Slot indices come from allocate_slot, which keeps them below max_keys (u32).
        self.free_slots.push(slot as u32);
    }

    fn release(&mut self, lease: LeaseId, units: u64) {
        if units > 0 {
            self.send(ToAgent::Release(LeaseRelease { lease, units }));
        }
    }

    fn send(&mut self, msg: ToAgent) {
        if self.outbox.len() >= self.config.max_queued_messages {
            self.stats.dropped_messages += 1;
            if let ToAgent::Settle(LeaseSettle {
                delta: SettleDelta::Overage { units },
                ..
            }) = msg
            {
                self.stats.overage_dropped_units += units;
            }
            return;
        }
        self.outbox.push_back(msg);
    }
}

/// How much sooner than its TTL (counted from the request's send time, on the gateway's clock)
/// the gateway lets a lease expire: the configured margin, at most a twentieth of the TTL, and
/// at least the drift a gateway's clock may show over it (`GATEWAY_CLOCK_DRIFT_PPM`).
fn expiry_margin(config: &GatewayConfig, ttl: Duration) -> Duration {
    let fixed = config.expiry_margin.min(ttl / EXPIRY_MARGIN_TTL_DIVISOR);
    let drift_nanos = u128::from(duration_nanos(ttl)) * u128::from(GATEWAY_CLOCK_DRIFT_PPM) / PPM;
    // ttl fits in u64 nanoseconds and the product is below it, so the conversion never fails.
    let drift = Duration::from_nanos(u64::try_from(drift_nanos).unwrap_or(u64::MAX));
    fixed.max(drift)
}

/// The key's state and the time its request was sent, if it still waits for `ticket`.
/// Clears the key's refill in flight; the lease it named if that was emptied meanwhile and
/// the answer did not add to it (`granted`): its end is reported now. (A lease dropped as
/// expired is not reported: the agent counts it spent at its own expiry.)
fn emptied_refill(state: &mut HeldKey, granted: Option<LeaseId>) -> Option<LeaseId> {
    let lease = state.refill_of.take()?;
    let emptied = std::mem::take(&mut state.refill_of_emptied);
    (emptied && granted != Some(lease)).then_some(lease)
}

/// The lease a refill should be added to: of those still live when the answer may come
/// (`answer_by`: later, the request is abandoned), the one that lasts longest. A lease that
/// expires here before the answer would take the refill with it: its unspent units are
/// dropped here, counted spent by the agent, and the refill could only be given back.
fn refill_target(leases: &[HeldLease], answer_by: Timestamp) -> Option<LeaseId> {
    leases
        .iter()
        .filter(|l| l.expires_at > answer_by)
        .max_by_key(|l| l.expires_at)
        .map(|l| l.id)
}

fn waiting_state(slots: &mut [Slot], ticket: LeaseTicket) -> Option<(&mut HeldKey, Timestamp)> {
    let state = slot_state_mut(slots, ticket.handle)?;
    match state.ask {
        Ask::Sent { seq, sent_at } if seq == ticket.seq => Some((state, sent_at)),
        _ => None,
    }
}

fn slot_state(slots: &[Slot], handle: KeyHandle) -> Option<&HeldKey> {
    let slot = slots.get(handle.slot as usize)?;
    if slot.generation != handle.generation {
        return None;
    }
    slot.state.as_ref()
}

fn slot_state_mut(slots: &mut [Slot], handle: KeyHandle) -> Option<&mut HeldKey> {
    let slot = slots.get_mut(handle.slot as usize)?;
    if slot.generation != handle.generation {
        return None;
    }
    slot.state.as_mut()
}

/// Removes expired leases; returns the units they still held (spent, as far as the agent is
/// concerned).
fn drop_expired(leases: &mut Vec<HeldLease>, now: Timestamp) -> u64 {
    let mut expired_units = 0;
    leases.retain(|l| {
        let live = now < l.expires_at;
        if !live {
            expired_units += l.units_left;
        }
        live
    });
    expired_units
}

/// What [`take_chunk`] took from one lease.
struct Taken {
    lease: LeaseId,
    units: u64,
    expires_at: Timestamp,
    /// The lease is spent to its last unit (and dropped).
    emptied: bool,
}

/// Takes a chunk of at least `units` (see [`Gateway::carve`]) from the live lease that expires
/// first among those that can pay `units`; a lease emptied by it is dropped (and reported as
/// emptied). A lease is emptied only by a chunk of exactly `units`, the request's own cost.
fn take_chunk(leases: &mut Vec<HeldLease>, units: u64, max_units: u64) -> Option<Taken> {
    let index = leases
        .iter()
        .enumerate()
        .filter(|(_, l)| l.units_left >= units)
        .min_by_key(|(_, l)| l.expires_at)
        .map(|(i, _)| i)?;
    let lease = &mut leases[index];
    let chunk_units = units.max(max_units.min(lease.units_left / CHUNK_LEASE_DIVISOR));
    assert!(
        chunk_units <= lease.units_left,
        "a lease never pays more than it holds"
    );
    lease.units_left -= chunk_units;
    let taken = Taken {
        lease: lease.id,
        units: chunk_units,
        expires_at: lease.expires_at,
        emptied: lease.units_left == 0,
    };
    if taken.emptied {
        leases.swap_remove(index);
    }
    Some(taken)
}

fn held_units(leases: &[HeldLease]) -> u64 {
    leases.iter().map(|l| l.units_left).sum()
}
