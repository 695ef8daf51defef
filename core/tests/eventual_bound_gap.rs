//! A gap the eventual-mode bound once had, reproduced with the real machines: a region whose
//! answers are lost while its SyncUps still arrive has an expired view and admits by the floor
//! policy, yet the leader hears it. The SyncUp now says the region's view has expired
//! (`SyncUp::view_expired`), and the leader counts such a region under `partition_floor` as
//! it counts a silent one (docs/bound.md, "partition_floor").

use std::time::Duration;

use allot_core::budget::{AcquireRequest, BudgetConfig, RegionBudget};
use allot_core::ids::{KeyId, LimitId, RegionId};
use allot_core::limit::{Consistency, LimitSpec, PartitionPolicy, RateCap};
use allot_core::rebalance::{AllowanceTable, Coordinator, CoordinatorConfig, TableCommand, bound};
use allot_core::time::{Timestamp, Window};

const QUOTA_UNITS: u64 = 30;
const TICK: Duration = Duration::from_millis(50);
/// Ticks per 10 s window.
const WINDOW_TICKS: u64 = 200;

struct Deployment {
    spec: LimitSpec,
    coordinator: Coordinator,
    regions: Vec<(RegionId, RegionBudget)>,
}

/// Three regions, an eventual limit of 30 per 10 s (default share 9 each) under the floor
/// policy with a rate cap of 5/s (burst 1); syncs every 50 ms, view TTL 200 ms.
fn deployment(start: Timestamp) -> Deployment {
    let ids: Vec<RegionId> = ["a", "b", "c"].into_iter().map(RegionId::from).collect();
    let spec = LimitSpec {
        consistency: Consistency::Eventual,
        partition_policy: PartitionPolicy::Floor,
        rate_cap: Some(RateCap {
            units: 5,
            per: Duration::from_secs(1),
            burst: 1,
        }),
        ..LimitSpec::simple("ev", QUOTA_UNITS, Duration::from_secs(10))
    };
    let mut table = AllowanceTable::new();
    table.apply(TableCommand::SetConfig {
        version: 1,
        limits: vec![spec.clone()],
        regions: ids.clone(),
    });
    let ccfg = CoordinatorConfig {
        sync_interval: TICK,
        view_ttl: Duration::from_millis(200),
        ..CoordinatorConfig::default()
    };
    let regions = ids
        .iter()
        .map(|r| {
            let cfg = BudgetConfig {
                sync_interval: TICK,
                view_ttl: Duration::from_millis(200),
                ..BudgetConfig::new(r.clone(), ids.clone())
            };
            let budget = RegionBudget::new(cfg, vec![spec.clone()]).expect("valid settings");
            (r.clone(), budget)
        })
        .collect();
    Deployment {
        coordinator: Coordinator::new(ccfg, table, start, 1),
        spec,
        regions,
    }
}

#[test]
fn a_region_on_its_floor_while_its_reports_arrive_stays_within_the_bound() {
    // Window 1 (after window 0 gave every region a clock sample, so the skew term is small):
    // b and c take 1 unit each; a, which then hears them at 1, fills the rest by its view:
    // 30 - 1 - 1 = 28. From 7 s b's and c's answers are lost (their SyncUps still arrive);
    // their views expire and the floor policy lets each take its default share, 9: 8 more
    // each, so 28 + 9 + 9 = 46 in the window. The leader hears both all along: without their
    // expired views in the SyncUp, the bound it reported was the eventual term
    // 3 * (ceil(5/s * 0.4 s) + 1) = 9 plus skew 3 * 1 = 3, and 30 + 12 = 42 < 46. With them,
    // partition_floor adds (9 - 1)+ for each of b and c: 42 + 16 = 58 >= 46.
    let start = Timestamp::from_unix_millis(1_700_000_000_000);
    let mut d = deployment(start);
    let (limit, key) = (LimitId::from("ev"), KeyId::from("k"));
    let window = Window::new(Duration::from_secs(10));
    let mut largest_bound_units = 0;
    for t in 0..2 * WINDOW_TICKS - 10 {
        let now = start + TICK * t as u32;
        let tick = t.checked_sub(WINDOW_TICKS);
        let answers_lost = tick.is_some_and(|k| k >= 140);
        for (i, (id, region)) in d.regions.iter_mut().enumerate() {
            region.handle_timeout(now);
            if let Some(up) = region.poll_transmit(now) {
                let seq = up.seq;
                d.coordinator
                    .handle_sync_up(now, up)
                    .expect("member region");
                for cmd in d.coordinator.poll_proposals(now) {
                    d.coordinator.handle_committed(now, &cmd);
                }
                let down = d
                    .coordinator
                    .poll_sync_down(now, id, seq)
                    .expect("answered");
                if !(answers_lost && i > 0) {
                    region.handle_sync_down(now, down);
                }
            }
            let asks = match (i, tick) {
                (0, Some(k)) => (10..130).contains(&k),
                (_, Some(k)) => k == 5 || answers_lost,
                _ => false,
            };
            if asks {
                let req = AcquireRequest {
                    limit: limit.clone(),
                    key: key.clone(),
                    cost_units: 1,
                    request_id: None,
                };
                region.acquire(now, req).expect("known limit");
            }
        }
        if tick.is_some() {
            let w = window.index(now);
            let inputs = d.coordinator.bound_inputs(now, &limit, w, Some(&key));
            let b = bound(&d.spec, w, &inputs);
            largest_bound_units = largest_bound_units.max(b.total_units);
        }
    }
    let used: u64 = d
        .regions
        .iter()
        .map(|(_, r)| r.counter(&limit, &key).map_or(0, |c| c.net_units()))
        .sum();
    assert!(
        used <= QUOTA_UNITS + largest_bound_units,
        "regions used {used} together in one window, above L = {QUOTA_UNITS} + bound {largest_bound_units}"
    );
}
