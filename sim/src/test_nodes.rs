//! Test-only machines behind the node traits, to exercise the engine, the checker and the
//! report before the real budget machine and coordinator are wired in. They are deliberately
//! trivial (each region grants from its fixed share `w_r * L`, the coordinator relays counter
//! entries) and are not a model of the product.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::gateway::{
    LeaseDenial, LeaseGrant, LeaseRelease, LeaseSettle, LeaseWanted, SettleDelta,
};
use allot_core::ids::{LeaseId, LimitId, RegionId};
use allot_core::limit::FailureMode;
use allot_core::sync::{CounterEntry, CounterRef, SyncDown, SyncUp};
use allot_core::time::Timestamp;

use crate::node::{
    AllowanceView, Bound, BoundTerm, CoordinatorNode, CoordinatorObservation, CoordinatorSetup,
    LeaseAnswer, NodeFactory, RegionNode, RegionObservation, RegionSetup,
};
use crate::scenario::{LimitInfo, Scenario};

/// Deliberate faults, to show that the checks catch them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Grant every lease in full, ignoring the allowance.
    pub overgrant: bool,
    /// Restart from nothing instead of the persisted counters.
    pub forget_on_restart: bool,
}

#[derive(Clone, Debug, Default)]
pub struct TestFactory {
    pub bugs: Bugs,
    /// Reported as the bound of every limit, in units (`None`: a bound of 0, as a coordinator
    /// that claims exactness would state).
    pub bound_units: Option<u64>,
    pub failure_mode: FailureMode,
}

pub struct TestRegion {
    region: RegionId,
    limits: Vec<LimitInfo>,
    share_ppm: u64,
    lease_ttl: Duration,
    sync_interval: Duration,
    counters: BTreeMap<CounterRef, (u64, u64)>,
    leases: BTreeMap<LeaseId, CounterRef>,
    next_lease: u64,
    seq: u64,
    next_sync_at: Timestamp,
    bugs: Bugs,
}

pub struct TestCoordinator {
    entries: BTreeMap<(RegionId, CounterRef), CounterEntry>,
    received: u64,
    /// Commands committed, replayed ones included.
    pub committed: u64,
    /// Proposals polled and not yet committed: the driver must not answer while any is.
    uncommitted: u64,
    bound_units: Option<u64>,
    limits: Vec<LimitInfo>,
}

impl NodeFactory for TestFactory {
    type Region = TestRegion;
    type Coordinator = TestCoordinator;

    fn region(&self, setup: &RegionSetup<'_>, now: Timestamp) -> TestRegion {
        let s = setup.scenario;
        TestRegion {
            region: setup.region.clone(),
            limits: s.limits.limits.clone(),
            share_ppm: u64::from(s.regions[setup.region_index].weight_ppm),
            lease_ttl: s.lease.ttl,
            sync_interval: s.sync_interval,
            counters: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_lease: 0,
            seq: 0,
            next_sync_at: now + s.sync_interval,
            bugs: self.bugs,
        }
    }

    fn restore_region(
        &self,
        setup: &RegionSetup<'_>,
        store: &BTreeMap<CounterRef, (u64, u64)>,
        now: Timestamp,
    ) -> TestRegion {
        let mut r = self.region(setup, now);
        if !self.bugs.forget_on_restart {
            r.counters = store.clone();
        }
        r
    }

    fn coordinator(&self, setup: &CoordinatorSetup<'_>, _now: Timestamp) -> TestCoordinator {
        TestCoordinator {
            entries: BTreeMap::new(),
            received: 0,
            committed: 0,
            uncommitted: 0,
            bound_units: self.bound_units,
            limits: setup.scenario.limits.limits.clone(),
        }
    }

    fn failure_mode(&self, _limit: &LimitId) -> FailureMode {
        self.failure_mode
    }
}

impl TestRegion {
    fn counter(&self, now: Timestamp, want: &LeaseWanted) -> Option<(CounterRef, u64)> {
        let limit = self.limits.iter().find(|l| l.id == want.limit)?;
        let counter = CounterRef {
            limit: want.limit.clone(),
            key: want.key.clone(),
            window: limit.window.index(now),
        };
        Some((counter, limit.quota_units * self.share_ppm / 1_000_000))
    }
}

impl RegionNode for TestRegion {
    type Store = BTreeMap<CounterRef, (u64, u64)>;

    fn handle_lease_wanted(&mut self, now: Timestamp, want: &LeaseWanted) -> LeaseAnswer {
        let Some((counter, allowance)) = self.counter(now, want) else {
            return LeaseAnswer::Denied(LeaseDenial {
                retry_after: Duration::from_secs(1),
            });
        };
        let (granted, refunded) = self.counters.get(&counter).copied().unwrap_or_default();
        let available = allowance.saturating_sub(granted - refunded);
        let units = if self.bugs.overgrant {
            want.units
        } else {
            want.units.min(available)
        };
        if units == 0 || units < want.min_units {
            let window = self
                .limits
                .iter()
                .find(|l| l.id == want.limit)
                .map(|l| l.window);
            let retry_after = window.map_or(Duration::from_secs(1), |w| w.remaining(now));
            return LeaseAnswer::Denied(LeaseDenial { retry_after });
        }
        self.counters.entry(counter.clone()).or_default().0 += units;
        self.next_lease += 1;
        let lease = LeaseId(self.next_lease);
        self.leases.insert(lease, counter);
        LeaseAnswer::Granted(LeaseGrant {
            lease,
            units,
            ttl: self.lease_ttl,
            remaining_units: available.saturating_sub(units),
        })
    }

    fn handle_release(&mut self, _now: Timestamp, release: &LeaseRelease) {
        if let Some(counter) = self.leases.remove(&release.lease) {
            self.counters.entry(counter).or_default().1 += release.units;
        }
    }

    fn handle_settle(&mut self, _now: Timestamp, settle: &LeaseSettle) {
        let Some(counter) = self.leases.get(&settle.lease) else {
            return;
        };
        let c = self.counters.entry(counter.clone()).or_default();
        match settle.delta {
            SettleDelta::Refund { units } => c.1 += units,
            SettleDelta::Overage { units } => c.0 += units,
        }
    }

    fn handle_sync_down(&mut self, _now: Timestamp, _msg: SyncDown) {}

    fn poll_transmit(&mut self, now: Timestamp) -> Option<SyncUp> {
        if now < self.next_sync_at {
            return None;
        }
        self.next_sync_at = now + self.sync_interval;
        self.seq += 1;
        Some(SyncUp {
            entries: self.entries(),
            ..SyncUp::new(self.region.clone(), 1, self.seq, now, 1)
        })
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(self.next_sync_at)
    }

    fn handle_timeout(&mut self, _now: Timestamp) {}

    fn persist(&mut self, store: &mut Self::Store) {
        store.clone_from(&self.counters);
    }

    fn observe(&self, out: &mut RegionObservation) {
        out.entries = self.entries();
        out.allowances = self
            .counters
            .iter()
            .filter_map(|(c, (g, r))| {
                let limit = self.limits.iter().find(|l| l.id == c.limit)?;
                Some(AllowanceView {
                    counter: c.clone(),
                    net_units: g - r,
                    limit_units: if self.bugs.overgrant {
                        u64::MAX
                    } else {
                        limit.quota_units * self.share_ppm / 1_000_000
                    },
                    strict_allowance_units: None,
                })
            })
            .collect();
    }
}

impl TestRegion {
    fn entries(&self) -> Vec<CounterEntry> {
        self.counters
            .iter()
            .map(|(c, (g, r))| CounterEntry {
                counter: c.clone(),
                region: self.region.clone(),
                granted_units: *g,
                refunded_units: *r,
            })
            .collect()
    }
}

impl CoordinatorNode for TestCoordinator {
    type Command = u64;

    fn handle_sync_up(&mut self, _now: Timestamp, msg: SyncUp) -> bool {
        self.received += 1;
        for e in msg.entries {
            self.entries
                .insert((e.region.clone(), e.counter.clone()), e);
        }
        true
    }

    fn poll_sync_down(
        &mut self,
        now: Timestamp,
        region: &RegionId,
        reply_to_seq: u64,
    ) -> Option<SyncDown> {
        assert_eq!(
            self.uncommitted, 0,
            "the driver answered while proposals were uncommitted"
        );
        Some(SyncDown {
            reply_to_seq,
            leader_term: 0,
            received_at: now,
            sent_at: now,
            config_version: 1,
            entries: self
                .entries
                .iter()
                .filter(|((r, _), _)| r != region)
                .map(|(_, e)| e.clone())
                .collect(),
            grants: Vec::new(),
            release_requests: Vec::new(),
            known_region: false,
            below_default_left: false,
            earlier_boot_clock_reach: None,
            config: None,
        })
    }

    fn poll_proposals(&mut self, _now: Timestamp) -> Vec<u64> {
        // One command per ten messages received, to exercise the replicated log.
        if self.received > 0 && self.received.is_multiple_of(10) {
            self.received += 1;
            self.uncommitted += 1;
            return vec![self.received];
        }
        Vec::new()
    }

    fn handle_committed(&mut self, _now: Timestamp, _cmd: &u64) {
        self.committed += 1;
        // Replayed commands after a leader loss were never proposed by this leader.
        self.uncommitted = self.uncommitted.saturating_sub(1);
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }

    fn handle_timeout(&mut self, _now: Timestamp) {}

    fn observe(&self, now: Timestamp, out: &mut CoordinatorObservation) {
        let units = self.bound_units.unwrap_or(0);
        out.bounds = self
            .limits
            .iter()
            .map(|l| {
                let bound = Bound {
                    terms: vec![BoundTerm {
                        name: "test".to_string(),
                        units,
                        measured_units: None,
                    }],
                    total_units: units,
                    unbounded: false,
                    unwatched: false,
                };
                (l.id.clone(), l.window.index(now), bound)
            })
            .collect();
    }

    fn table_allowance(&self, _counter: &CounterRef, _region: &RegionId) -> Option<u64> {
        None
    }
}

/// A scenario for engine tests, from YAML text.
pub fn scenario(yaml: &str) -> Scenario {
    crate::scenario::parse("test.yaml", yaml).unwrap_or_else(|e| panic!("{e}"))
}
