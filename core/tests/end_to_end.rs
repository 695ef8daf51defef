//! End-to-end property tests of the real core machines: three `RegionBudget`s and one
//! `Coordinator` (with its `AllowanceTable` committed as the driver contract says), under
//! random interleavings of gateway calls (acquires, leases, renews, releases, settles, and
//! retries of them with the same request id), time passing across windows, sync rounds over a
//! network that loses, duplicates, delays and reorders messages and can cut a region off in
//! either direction, agent restarts from their stores, slow commits and lost leadership.
//! All clocks are equal, so per window index the sums are exact.
//!
//! The invariants checked after every step are listed in `support/checks.rs`.

mod support;

use std::time::Duration;

use allot_core::limit::{PartitionPolicy, RateCap};
use proptest::prelude::*;

use support::network::LinkFaults;
use support::setup::{eventual_limit, strict_limits};
use support::world::{Op, Step, World};

/// A key, mostly the hot one, so that counters reach their limits.
fn key() -> impl Strategy<Value = usize> {
    prop_oneof![6 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)]
}

/// A gateway operation: acquires and leases mostly, on any limit.
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<usize>(), key(), 1..8u64).prop_map(
            |(limit, key, cost_units)| Op::Acquire { limit, key, cost_units }
        ),
        6 => (any::<usize>(), key(), 1..12u64, 100..6_000u64).prop_map(
            |(limit, key, units_wanted, ttl_ms)| Op::Lease { limit, key, units_wanted, ttl_ms }
        ),
        1 => (any::<usize>(), 100..6_000u64).prop_map(|(pick, ttl_ms)| Op::Renew { pick, ttl_ms }),
        3 => (any::<usize>(), 0..=100u64).prop_map(|(pick, unused_pct)| Op::Release { pick, unused_pct }),
        3 => (any::<usize>(), 0..=200u64).prop_map(|(pick, actual_pct)| Op::Settle { pick, actual_pct }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let region = 0..3usize;
    prop_oneof![
        19 => (region.clone(), op(), any::<bool>()).prop_map(
            |(region, op, with_id)| Step::Gateway { region, op, with_id }
        ),
        2 => any::<usize>().prop_map(|pick| Step::Retry { pick }),
        5 => (0..300u64).prop_map(|ms| Step::Advance { ms }),
        1 => (1_000..3_000u64).prop_map(|ms| Step::Advance { ms }),
        1 => (region.clone(), any::<bool>(), any::<bool>(), 200..4_000u64).prop_map(
            |(region, up, down, ms)| Step::Cut { region, up, down, ms }
        ),
        1 => region.prop_map(|region| Step::Restart { region }),
        1 => Just(Step::Propose),
        1 => Just(Step::Commit),
        1 => any::<bool>().prop_map(|commit_waiting| Step::NewLeader { commit_waiting }),
    ]
}

/// Default shares of the floor limit: any split, some of it possibly unassigned.
fn weights() -> impl Strategy<Value = [u32; 3]> {
    (0..=500_000u32, 0..=500_000u32).prop_map(|(a, b)| [a, b, (1_000_000 - a - b) / 2])
}

/// Any delays, including ones across windows: strict mode assumes nothing about the network.
fn any_faults() -> impl Strategy<Value = LinkFaults> {
    (0..30u32, 0..20u32, 0..50u64, 0..1_000u64, 0..5u32).prop_map(
        |(loss_pct, duplicate_pct, min_delay_ms, spread_ms, long_delay_pct)| LinkFaults {
            loss_pct,
            duplicate_pct,
            min_delay_ms,
            max_delay_ms: min_delay_ms + spread_ms,
            long_delay_pct,
            long_delay_max_ms: 15_000,
        },
    )
}

/// Delays within `[d, 2d]`: the eventual term's assumption (docs/bound.md) holds.
fn bounded_faults() -> impl Strategy<Value = LinkFaults> {
    (0..30u32, 0..20u32, 0..100u64)
        .prop_map(|(loss, dup, delay)| LinkFaults::bounded(loss, dup, delay))
}

fn policy() -> impl Strategy<Value = PartitionPolicy> {
    prop_oneof![Just(PartitionPolicy::Floor), Just(PartitionPolicy::Closed)]
}

/// 4 units per second, burst 4. Once round trips are measured (under 0.4 s here) the eventual
/// term's lag is at most 2 * 1 s + 0.4 s = 2.4 s, over which a region admits at most
/// ceil(4 * 2.4) + 4 = 14 units unseen: the bound is 3 * 14 = 42 plus partition terms above
/// L = 30, while the regions could admit 3 * (4 * 10 + 4) = 132 in a 10 s window.
const EVENTUAL_RATE_CAP: RateCap = RateCap {
    units: 4,
    per: Duration::from_secs(1),
    burst: 4,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn strict_limits_hold_over_any_network(
        steps in prop::collection::vec(step(), 100..300),
        weights in weights(),
        faults in any_faults(),
        seed in any::<u64>(),
    ) {
        let mut world = World::new(strict_limits(weights), faults, seed)?;
        for step in steps {
            world.run(step)?;
        }
    }

    #[test]
    fn eventual_and_strict_limits_hold_with_bounded_delays(
        steps in prop::collection::vec(step(), 100..300),
        weights in weights(),
        eventual_policy in policy(),
        faults in bounded_faults(),
        seed in any::<u64>(),
    ) {
        let mut limits = strict_limits(weights);
        limits.push(eventual_limit(eventual_policy, EVENTUAL_RATE_CAP));
        let mut world = World::new(limits, faults, seed)?;
        for step in steps {
            world.run(step)?;
        }
    }
}
