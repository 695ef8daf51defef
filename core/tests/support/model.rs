//! What the regions must hold, computed from the gateway calls and their first outcomes only:
//! net use per counter, settle overage per counter, every lease ever granted and whether it is
//! still live, and the first outcome of every request id.
//!
//! It never reads the machines' state, so comparing the two checks the machines.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::budget::Outcome;
use allot_core::ids::{LeaseId, RequestId};
use allot_core::time::{Timestamp, WindowIndex};

use super::setup::REGIONS;

/// One counter of one region: (region, limit, key, window), by index.
pub type CounterAt = (usize, usize, usize, WindowIndex);

#[derive(Clone, Debug)]
pub struct ModelLease {
    pub limit: usize,
    pub key: usize,
    pub window: WindowIndex,
    pub units: u64,
    pub expires_at: Timestamp,
    /// Released or settled.
    pub ended: bool,
}

impl ModelLease {
    pub fn is_live(&self, now: Timestamp) -> bool {
        !self.ended && now < self.expires_at
    }
}

pub struct Model {
    /// Acquires admitted plus each distinct lease's units, plus settle overage, minus refunds.
    net_units: BTreeMap<CounterAt, u64>,
    /// Settle overage: the only excess over the allowance these runs allow.
    overage_units: BTreeMap<CounterAt, u64>,
    /// Per region, every lease granted (never forgotten, so that late calls name dead ones).
    pub leases: Vec<BTreeMap<LeaseId, ModelLease>>,
    /// Per region, the first successful outcome of each request id.
    first_outcomes: Vec<BTreeMap<RequestId, Outcome>>,
}

impl Model {
    pub fn new() -> Self {
        Model {
            net_units: BTreeMap::new(),
            overage_units: BTreeMap::new(),
            leases: vec![BTreeMap::new(); REGIONS.len()],
            first_outcomes: vec![BTreeMap::new(); REGIONS.len()],
        }
    }

    pub fn net_units(&self, at: CounterAt) -> u64 {
        self.net_units.get(&at).copied().unwrap_or(0)
    }

    pub fn overage_units(&self, at: CounterAt) -> u64 {
        self.overage_units.get(&at).copied().unwrap_or(0)
    }

    pub fn charge(&mut self, at: CounterAt, units: u64) {
        *self.net_units.entry(at).or_default() += units;
    }

    /// Returns false when the refund is more than the counter holds (a model error).
    pub fn refund(&mut self, at: CounterAt, units: u64) -> bool {
        let net = self.net_units.entry(at).or_default();
        match net.checked_sub(units) {
            Some(left) => {
                *net = left;
                true
            }
            None => false,
        }
    }

    pub fn charge_overage(&mut self, at: CounterAt, units: u64) {
        self.charge(at, units);
        *self.overage_units.entry(at).or_default() += units;
    }

    pub fn first_outcome(&self, region: usize, id: RequestId) -> Option<&Outcome> {
        self.first_outcomes[region].get(&id)
    }

    pub fn remember(&mut self, region: usize, id: RequestId, outcome: Outcome) {
        self.first_outcomes[region].insert(id, outcome);
    }

    /// A lease of `region` for a lease call: mostly a live one, and now and then any lease
    /// ever granted (so that calls on ended or expired leases are tried too).
    pub fn pick_lease(
        &self,
        region: usize,
        now: Timestamp,
        pick: usize,
    ) -> Option<(LeaseId, &ModelLease)> {
        let leases = &self.leases[region];
        let live: Vec<(&LeaseId, &ModelLease)> =
            leases.iter().filter(|(_, l)| l.is_live(now)).collect();
        let chosen = if live.is_empty() || pick.is_multiple_of(5) {
            leases.iter().nth(pick.checked_rem(leases.len())?)
        } else {
            live.get(pick % live.len()).copied()
        };
        chosen.map(|(id, l)| (*id, l))
    }
}

/// Expiry of a lease granted or renewed at `now` for `ttl`: capped by the longest TTL and the
/// end of its window.
pub fn lease_expiry(
    now: Timestamp,
    ttl: Duration,
    ttl_max: Duration,
    window_end: Timestamp,
) -> Timestamp {
    (now + ttl.min(ttl_max)).min(window_end)
}
