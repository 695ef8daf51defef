//! The deployment every end-to-end run uses: three regions, three keys, short windows and
//! small quotas, so that runs cross several windows and reach their limits.

use std::collections::BTreeMap;
use std::time::Duration;

use allot_core::budget::BudgetConfig;
use allot_core::ids::RegionId;
use allot_core::limit::{Consistency, LimitSpec, PartitionPolicy, Quota, RateCap, RegionWeights};
use allot_core::rebalance::CoordinatorConfig;
use allot_core::time::{Timestamp, Window};

pub const REGIONS: [&str; 3] = ["a", "b", "c"];
pub const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// `L` of every limit: a handful of calls reach it.
pub const QUOTA_UNITS: u64 = 30;
pub const WINDOW_LEN: Duration = Duration::from_secs(10);
pub const SYNC_INTERVAL: Duration = Duration::from_millis(200);
pub const VIEW_TTL: Duration = Duration::from_secs(1);
pub const LEASE_TTL_MAX: Duration = Duration::from_secs(4);
pub const MAX_LEASES_PER_KEY: usize = 4;
/// Longer than any run, so that every retry of a request id is answered from the cache.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(3600);
/// Larger than the number of calls in any run: no entry is forgotten early.
pub const IDEMPOTENCY_CAPACITY: usize = 100_000;
/// Runs start a second into a window: 1,700,000,000,000 ms is a multiple of the window.
pub const START: Timestamp = Timestamp::from_unix_millis(1_700_000_001_000);

pub fn region_ids() -> Vec<RegionId> {
    REGIONS.iter().map(|r| RegionId::from(*r)).collect()
}

pub fn window() -> Window {
    Window::new(WINDOW_LEN)
}

fn limit(id: &str, consistency: Consistency, policy: PartitionPolicy) -> LimitSpec {
    LimitSpec {
        quota: Quota::Units {
            units: QUOTA_UNITS,
            window: window(),
        },
        consistency,
        partition_policy: policy,
        // The runs settle reservations at up to twice their size (`world`).
        max_settle_overage_ppm: 1_000_000,
        ..LimitSpec::simple(id, QUOTA_UNITS, WINDOW_LEN)
    }
}

/// A strict limit under the floor policy with the given default shares (ppm per region), and
/// a strict limit under the closed policy with equal shares.
pub fn strict_limits(weights_ppm: [u32; 3]) -> Vec<LimitSpec> {
    let ppm: BTreeMap<RegionId, u32> = region_ids().into_iter().zip(weights_ppm).collect();
    let floor = LimitSpec {
        weights: RegionWeights::new(ppm).expect("weights drawn to sum to at most one"),
        ..limit("strict-floor", Consistency::Strict, PartitionPolicy::Floor)
    };
    let closed = limit(
        "strict-closed",
        Consistency::Strict,
        PartitionPolicy::Closed,
    );
    vec![floor, closed]
}

/// An eventual limit with equal shares. Its rate cap makes the bound's eventual term small
/// next to `L`, so that the bound check has teeth.
pub fn eventual_limit(policy: PartitionPolicy, rate_cap: RateCap) -> LimitSpec {
    LimitSpec {
        rate_cap: Some(rate_cap),
        ..limit("eventual", Consistency::Eventual, policy)
    }
}

pub fn budget_config(region: usize) -> BudgetConfig {
    BudgetConfig {
        sync_interval: SYNC_INTERVAL,
        view_ttl: VIEW_TTL,
        lease_ttl_max: LEASE_TTL_MAX,
        max_leases_per_key: MAX_LEASES_PER_KEY,
        idempotency_ttl: IDEMPOTENCY_TTL,
        idempotency_capacity: IDEMPOTENCY_CAPACITY,
        ..BudgetConfig::new(RegionId::from(REGIONS[region]), region_ids())
    }
}

pub fn coordinator_config() -> CoordinatorConfig {
    CoordinatorConfig {
        sync_interval: SYNC_INTERVAL,
        view_ttl: VIEW_TTL,
        drift_margin: Duration::from_millis(200),
        rebalance_hysteresis_units: 1,
        pre_issue_lead: Duration::from_secs(2),
        max_tracked_counters: 4096,
        proposal_timeout: Duration::from_secs(1),
        ..CoordinatorConfig::default()
    }
}
