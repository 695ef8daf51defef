//! A small model of a region, faithful to the rules the region side implements, for driving the
//! coordinator in tests (the real budget machine gets an end-to-end test at integration):
//! - default allowance `floor(w_r * L)` with no state;
//! - a grant applies only if its epoch is newer than the counter's last (grants and release
//!   requests share that sequence); grants may be for a future window;
//! - a release request releases `min(units, a_r - n_r)` and is acked with the released units
//!   and the allowance after; a repeated id gets the same ack and releases nothing more;
//! - acks are resent until a SyncDown answers a SyncUp that carried them;
//! - admission only while `n_r + cost <= a_r`;
//! - closed policy: a counter without a grant admits nothing more once the region's view has
//!   expired (`view_ttl` after sending the last SyncUp that got an answer, on its own clock).

use std::collections::{BTreeMap, BTreeSet};

use std::time::Duration;

use crate::ids::{Epoch, LimitId, RegionId};
use crate::limit::{LimitSpec, PartitionPolicy, Quota};
use crate::sync::{
    ClockSample, CounterEntry, CounterRef, DemandReport, ReleaseAck, SyncDown, SyncUp,
};
use crate::time::Timestamp;

#[derive(Clone, Debug, Default)]
pub(crate) struct ModelCounter {
    pub granted_units: u64,
    pub refunded_units: u64,
    pub allowance_units: u64,
    pub epoch: Epoch,
}

impl ModelCounter {
    pub fn used_units(&self) -> u64 {
        self.granted_units - self.refunded_units
    }
}

#[derive(Clone, Debug)]
pub(crate) struct ModelRegion {
    pub id: RegionId,
    regions: Vec<RegionId>,
    limits: BTreeMap<LimitId, LimitSpec>,
    seq: u64,
    pub counters: BTreeMap<CounterRef, ModelCounter>,
    acks: BTreeMap<u64, ReleaseAck>,
    /// Ack ids not yet known to have arrived, with the last seq that carried them.
    unconfirmed_acks: BTreeMap<u64, Option<u64>>,
    pub demand: BTreeMap<CounterRef, u64>,
    /// Counters to report: escalated here or mentioned by the coordinator.
    reported: BTreeSet<CounterRef>,
    view_ttl: Duration,
    /// Send time of each SyncUp still in memory, and of the newest one answered.
    sent_at: BTreeMap<u64, Timestamp>,
    contact: Timestamp,
    /// The term of the latest answer: the one clock sample it measures is of that leader.
    /// Starts at 1, every test's first leader, so that its first SyncUp carries a sample.
    leader_term: u64,
}

impl ModelRegion {
    pub fn new(id: &str, regions: &[RegionId], limits: &[LimitSpec]) -> Self {
        ModelRegion {
            id: RegionId::from(id),
            regions: regions.to_vec(),
            limits: limits.iter().map(|l| (l.id.clone(), l.clone())).collect(),
            seq: 0,
            counters: BTreeMap::new(),
            acks: BTreeMap::new(),
            unconfirmed_acks: BTreeMap::new(),
            demand: BTreeMap::new(),
            reported: BTreeSet::new(),
            view_ttl: Duration::from_secs(2),
            sent_at: BTreeMap::new(),
            contact: Timestamp::ZERO,
            leader_term: 1,
        }
    }

    /// Starts with a fresh view at `now` (as after a first answer).
    pub fn with_contact(mut self, now: Timestamp) -> Self {
        self.contact = now;
        self
    }

    /// The allowance the region admits against at `now`: under the closed policy, a counter
    /// without a grant is shut (no more than its use) once the view has expired.
    pub fn effective_allowance(&self, counter: &CounterRef, now: Timestamp) -> u64 {
        let closed = self.limits[&counter.limit].partition_policy == PartitionPolicy::Closed;
        let expired = now.saturating_duration_since(self.contact) >= self.view_ttl;
        match self.counters.get(counter) {
            Some(c) if c.epoch == Epoch(0) && closed && expired => {
                c.allowance_units.min(c.used_units())
            }
            Some(c) => c.allowance_units,
            None if closed && expired => 0,
            None => self.default_units(counter),
        }
    }

    fn default_units(&self, counter: &CounterRef) -> u64 {
        let spec = &self.limits[&counter.limit];
        let Quota::Units { units, .. } = spec.quota else {
            return u64::MAX;
        };
        spec.weights
            .default_allowance(&self.id, &self.regions, units)
    }

    pub fn counter(&mut self, counter: &CounterRef) -> &mut ModelCounter {
        let default = self.default_units(counter);
        self.counters
            .entry(counter.clone())
            .or_insert_with(|| ModelCounter {
                allowance_units: default,
                ..ModelCounter::default()
            })
    }

    pub fn allowance(&self, counter: &CounterRef) -> u64 {
        self.counters
            .get(counter)
            .map_or_else(|| self.default_units(counter), |c| c.allowance_units)
    }

    /// Admit up to `units` (as many as the allowance leaves); returns what was admitted.
    pub fn admit(&mut self, counter: &CounterRef, units: u64, now: Timestamp) -> u64 {
        let allowance = self.effective_allowance(counter, now);
        let c = self.counter(counter);
        let admitted = units.min(allowance.saturating_sub(c.used_units()));
        c.granted_units += admitted;
        admitted
    }

    pub fn refund(&mut self, counter: &CounterRef, units: u64) {
        let c = self.counter(counter);
        c.refunded_units += units.min(c.used_units());
    }

    /// Escalate `counter` with a demand rate (units per second).
    pub fn set_demand(&mut self, counter: &CounterRef, units_per_sec: u64) {
        self.counter(counter);
        self.demand.insert(counter.clone(), units_per_sec);
        self.reported.insert(counter.clone());
    }

    pub fn poll_transmit(&mut self, now: Timestamp) -> SyncUp {
        self.seq += 1;
        let seq = self.seq;
        self.sent_at.insert(seq, now);
        let entries = self
            .reported
            .iter()
            .filter_map(|c| self.counters.get(c).map(|s| (c, s)))
            .map(|(c, s)| CounterEntry {
                counter: c.clone(),
                region: self.id.clone(),
                granted_units: s.granted_units,
                refunded_units: s.refunded_units,
            })
            .collect();
        let demand = self
            .demand
            .iter()
            .map(|(c, d)| DemandReport {
                counter: c.clone(),
                demand_micro_units_per_sec: d.saturating_mul(1_000_000),
                allowance_units: self.allowance(c),
            })
            .collect();
        for carried in self.unconfirmed_acks.values_mut() {
            *carried = Some(seq);
        }
        let release_acks = self
            .unconfirmed_acks
            .keys()
            .map(|id| self.acks[id].clone())
            .collect();
        SyncUp {
            region: self.id.clone(),
            boot: 1,
            restored: false,
            seq,
            sent_at: now,
            config_version: 1,
            entries,
            demand,
            release_acks,
            // One clock for everyone in these tests, and no delay to measure.
            clock: Some(ClockSample {
                offset_nanos: 0,
                round_trip_nanos: 0,
            }),
            clock_leader_term: self.leader_term,
            stats: Vec::new(),
            // The model region of these tests is strict-mode: its view plays no part.
            view_expired: false,
            clock_guard: None,
        }
    }

    pub fn handle_sync_down(&mut self, msg: &SyncDown) {
        if let Some(t0) = self.sent_at.get(&msg.reply_to_seq) {
            self.contact = self.contact.max(*t0);
            self.leader_term = msg.leader_term;
        }
        self.unconfirmed_acks
            .retain(|_, carried| carried.is_none_or(|s| s > msg.reply_to_seq));
        for e in &msg.entries {
            self.reported.insert(e.counter.clone());
        }
        for g in &msg.grants {
            self.reported.insert(g.counter.clone());
            let c = self.counter(&g.counter);
            if g.epoch > c.epoch {
                c.allowance_units = g.allowance_units;
                c.epoch = g.epoch;
            }
        }
        for r in &msg.release_requests {
            self.reported.insert(r.counter.clone());
            if !self.acks.contains_key(&r.id) {
                let c = self.counter(&r.counter);
                let released = r
                    .units
                    .min(c.allowance_units.saturating_sub(c.used_units()));
                c.allowance_units -= released;
                c.epoch = c.epoch.max(r.epoch);
                let ack = ReleaseAck {
                    id: r.id,
                    counter: r.counter.clone(),
                    released_units: released,
                    allowance_after_units: c.allowance_units,
                };
                self.acks.insert(r.id, ack);
            }
            self.unconfirmed_acks.insert(r.id, None);
        }
    }
}
