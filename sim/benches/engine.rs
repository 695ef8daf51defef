//! The engine's own cost per simulated request: the shipped hot-key scenario (40,000
//! requests/s on one key) over machines that do nothing (every lease granted in full, no
//! coordination). What the real machines add comes on top; the target is at least
//! 1,000,000 simulated requests per wall-clock second on one core with them.
//!
//! Run: `cargo bench -p allot-sim --bench engine`.

use std::path::Path;
use std::time::Duration;

use allot_core::gateway::{LeaseGrant, LeaseRelease, LeaseSettle, LeaseWanted};
use allot_core::ids::{LeaseId, LimitId, RegionId};
use allot_core::limit::FailureMode;
use allot_core::sync::{CounterRef, SyncDown, SyncUp};
use allot_core::time::Timestamp;
use allot_sim::engine::{RunSpec, run};
use allot_sim::node::{
    CoordinatorNode, CoordinatorObservation, CoordinatorSetup, LeaseAnswer, NodeFactory, Policy,
    RegionNode, RegionObservation, RegionSetup,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// Machines that cost nothing, to isolate the engine (benchmark only).
struct Null;
struct NullRegion(u64);
struct NullCoordinator;

impl NodeFactory for Null {
    type Region = NullRegion;
    type Coordinator = NullCoordinator;
    fn region(&self, _: &RegionSetup<'_>, _: Timestamp) -> NullRegion {
        NullRegion(0)
    }
    fn restore_region(&self, _: &RegionSetup<'_>, _: &(), _: Timestamp) -> NullRegion {
        NullRegion(0)
    }
    fn coordinator(&self, _: &CoordinatorSetup<'_>, _: Timestamp) -> NullCoordinator {
        NullCoordinator
    }
    fn failure_mode(&self, _: &LimitId) -> FailureMode {
        FailureMode::Closed
    }
}

impl RegionNode for NullRegion {
    type Store = ();
    fn handle_lease_wanted(&mut self, _: Timestamp, want: &LeaseWanted) -> LeaseAnswer {
        self.0 += 1;
        LeaseAnswer::Granted(LeaseGrant {
            lease: LeaseId(self.0),
            units: want.units,
            ttl: Duration::from_secs(1),
            remaining_units: u64::MAX,
        })
    }
    fn handle_release(&mut self, _: Timestamp, _: &LeaseRelease) {}
    fn handle_settle(&mut self, _: Timestamp, _: &LeaseSettle) {}
    fn handle_sync_down(&mut self, _: Timestamp, _: SyncDown) {}
    fn poll_transmit(&mut self, _: Timestamp) -> Option<SyncUp> {
        None
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn handle_timeout(&mut self, _: Timestamp) {}
    fn persist(&mut self, _: &mut ()) {}
    fn observe(&self, _: &mut RegionObservation) {}
}

impl CoordinatorNode for NullCoordinator {
    type Command = ();
    fn handle_sync_up(&mut self, _: Timestamp, _: SyncUp) -> bool {
        true
    }
    fn poll_sync_down(
        &mut self,
        now: Timestamp,
        _: &RegionId,
        reply_to_seq: u64,
    ) -> Option<SyncDown> {
        Some(SyncDown {
            reply_to_seq,
            leader_term: 0,
            received_at: now,
            sent_at: now,
            config_version: 0,
            entries: Vec::new(),
            grants: Vec::new(),
            release_requests: Vec::new(),
            known_region: false,
            below_default_left: false,
            earlier_boot_clock_reach: None,
            config: None,
        })
    }
    fn poll_proposals(&mut self, _: Timestamp) -> Vec<()> {
        Vec::new()
    }
    fn handle_committed(&mut self, _: Timestamp, _: &()) {}
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn handle_timeout(&mut self, _: Timestamp) {}
    fn observe(&self, _: Timestamp, _: &mut CoordinatorObservation) {}
    fn table_allowance(&self, _: &CounterRef, _: &RegionId) -> Option<u64> {
        None
    }
}

fn hot_key(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/hot-key.yaml");
    let scenario = allot_sim::scenario::load(&path).expect("the shipped scenario parses");
    let spec = RunSpec {
        seed: 1,
        policy: Policy::Rebalancing,
    };
    let requests = run(&scenario, &Null, spec).expect("runs").stats.requests;
    let mut group = c.benchmark_group("engine");
    group.sample_size(10);
    group.throughput(Throughput::Elements(requests));
    group.bench_function("hot-key, one seed, null machines", |b| {
        b.iter(|| run(&scenario, &Null, spec).expect("runs"))
    });
    group.finish();
}

criterion_group!(benches, hot_key);
criterion_main!(benches);
