//! The sliding window across regions (D54): a region admits its allowance scaled by
//! `1 - (1 - f) * P^ / L`, `P^` the quota less what it left unused of its allowance of the
//! window before (all of the quota where that use is not known).

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::budget::BudgetConfig;
use crate::limit::{Algorithm, Consistency, PartitionPolicy};
use crate::time::Window;

const MINUTE_MS: u64 = 60_000;

fn sliding(id: &str, units: u64) -> LimitSpec {
    LimitSpec {
        algorithm: Algorithm::SlidingWindow,
        ..per_minute(id, units)
    }
}

/// A region alone, counting since the start of [`at`]'s first window (a probe there), so
/// that from the second window on it holds every key's use of the window before.
fn alone(limits: Vec<LimitSpec>) -> RegionBudget {
    let mut b = RegionBudget::new(BudgetConfig::single_region(RegionId::from("eu")), limits)
        .expect("valid config");
    acquire(&mut b, at(0), "api", "probe", 0);
    b
}

/// Region `eu` of four (see [`budget`]), counting since [`at`]'s first window.
fn region(limits: Vec<LimitSpec>) -> RegionBudget {
    let mut b = budget(limits);
    acquire(&mut b, at(0), "api", "probe", 0);
    b
}

/// `ms` into the second window (the one before the window the tests judge).
fn before(ms: u64) -> Timestamp {
    at(MINUTE_MS + ms)
}

/// `ms` into the third window, the one the tests judge.
fn judged(ms: u64) -> Timestamp {
    at(2 * MINUTE_MS + ms)
}

#[test]
fn a_region_alone_decides_as_the_sliding_window_counter() {
    // Cloudflare's example, as in algo::sliding_window: 50 a minute, 42 in the minute before,
    // 15 s into this one the estimate is 42 * 45/60 = 31.5, so 18 fit and a 19th does not.
    let mut b = alone(vec![sliding("api", 50)]);
    assert!(acquire(&mut b, before(10_000), "api", "k", 42).allowed);
    let now = judged(15_000);
    let d = acquire(&mut b, now, "api", "k", 18);
    assert!(d.allowed);
    assert_eq!(d.remaining_units, 0);
    let d = acquire(&mut b, now, "api", "k", 1);
    assert!(!d.allowed);
    // The same first nanosecond as the counter's: 42 * (60 - e)/60 + 19 <= 50 at
    // e = 15.714285715 s.
    let retry = Duration::from_nanos(714_285_715);
    assert_eq!(d.retry_after, Some(retry));
    assert!(!acquire(&mut b, now + retry - Duration::from_nanos(1), "api", "k", 1).allowed);
    assert!(acquire(&mut b, now + retry, "api", "k", 1).allowed);
}

#[test]
fn a_fixed_window_rule_keeps_admitting_its_whole_share_at_the_window_start() {
    // Today's behaviour: 100 at the end of one window, 100 more at the start of the next.
    let mut b = alone(vec![per_minute("api", 100)]);
    assert!(acquire(&mut b, before(59_000), "api", "k", 100).allowed);
    assert!(acquire(&mut b, judged(0), "api", "k", 100).allowed);
    // The sliding one admits what the window before leaves: 100 * e / 60 s.
    let mut b = alone(vec![sliding("api", 100)]);
    assert!(acquire(&mut b, before(59_000), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, judged(0), "api", "k", 1).allowed);
    assert!(acquire(&mut b, judged(30_000), "api", "k", 50).allowed);
    assert!(!acquire(&mut b, judged(30_000), "api", "k", 1).allowed);
}

#[test]
fn the_weight_scales_a_regions_share_by_what_the_window_before_leaves() {
    // eu of four, L = 400: default share 100. It used 60 of its 100 in the window before, so
    // the others may have used at most 300 there: P^ = 400 - (100 - 60) = 360, and this
    // window lets it have used 100 * (1 - (1 - f) * 360/400) by fraction f.
    let mut b = region(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, before(30_000), "api", "k", 60).allowed);
    // f = 0: 100 * (1 - 0.9) = 10.
    let d = acquire(&mut b, judged(0), "api", "k", 10);
    assert!(d.allowed);
    assert_eq!(d.remaining_units, 0);
    let d = acquire(&mut b, judged(0), "api", "k", 1);
    assert!(!d.allowed);
    // 11 fit once 100 * (60 - e)/60 * 0.9 <= 89, at e = 0.666666667 s; not at the window's end.
    assert_eq!(d.retry_after, Some(Duration::from_nanos(666_666_667)));
    // f = 0.5: 100 * (1 - 0.45) = 55.
    assert!(acquire(&mut b, judged(30_000), "api", "k", 45).allowed);
    assert!(!acquire(&mut b, judged(30_000), "api", "k", 1).allowed);
    // f = 0.75: 100 * (1 - 0.225) = 77.5, so 77.
    assert!(acquire(&mut b, judged(45_000), "api", "k", 22).allowed);
    assert!(!acquire(&mut b, judged(45_000), "api", "k", 1).allowed);
    // A millisecond before the end, 100 * (1 - 0.001/60 * 0.9) = 99.9985: all but one unit.
    assert!(acquire(&mut b, judged(59_999), "api", "k", 22).allowed);
    assert!(!acquire(&mut b, judged(59_999), "api", "k", 1).allowed);
}

#[test]
fn use_of_the_window_before_that_the_region_does_not_hold_counts_as_the_whole_quota() {
    // The first window after a start: nothing says what this region admitted before it, so
    // P^ = L and the share comes back with the window's fraction alone (25 at f = 0.25).
    let mut b = budget(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, at(15_000), "api", "k", 25).allowed);
    assert!(!acquire(&mut b, at(15_000), "api", "k", 1).allowed);
    // From the next window on, a key the region does not hold used none of the window
    // before here: P^ = 400 - 100 = 300 (the others' shares), 25 at f = 0.
    let d = acquire(&mut b, before(0), "api", "new", 25);
    assert!(d.allowed);
    assert!(!acquire(&mut b, before(0), "api", "new", 1).allowed);
    // After a restart, a key it restored into its current window forgot the window before,
    // and one it does not hold may have used it before the crash: the whole quota again.
    let mut restarted =
        RegionBudget::restore(cfg(), vec![sliding("api", 400)], b.snapshot()).expect("restore");
    let d = acquire(&mut restarted, before(1_000), "api", "new", 1);
    assert!(!d.allowed, "{d:?}");
    // 100 * 1/60 at a second in: one unit, not two.
    assert!(!acquire(&mut restarted, before(1_000), "api", "other", 2).allowed);
    assert!(acquire(&mut restarted, before(30_000), "api", "other", 50).allowed);
    assert!(!acquire(&mut restarted, before(30_000), "api", "other", 1).allowed);
    // A key restored into the window before its current one rolls with its count: known.
    let mut b = region(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, before(0), "api", "k", 25).allowed);
    let mut restarted =
        RegionBudget::restore(cfg(), vec![sliding("api", 400)], b.snapshot()).expect("restore");
    // P^ = 400 - (100 - 25) = 325: at f = 0, 100 * (1 - 325/400) = 18.75, where a key that
    // forgot the window before would have nothing.
    assert!(acquire(&mut restarted, judged(0), "api", "k", 18).allowed);
    assert!(!acquire(&mut restarted, judged(0), "api", "k", 1).allowed);
}

#[test]
fn an_explicit_grant_of_the_window_before_is_what_the_region_held_there() {
    let mut b = region(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, before(1_000), "api", "k", 1).allowed);
    let up = b.poll_transmit(before(1_000)).expect("a sync is due");
    let mut down = answer(&up, before(1_000));
    down.grants = vec![grant("api", "k", minute_window(MINUTE_MS), 300, 1)];
    b.handle_sync_down(before(1_000), down);
    assert!(acquire(&mut b, before(59_000), "api", "k", 199).allowed);
    // Held 300, used 200: P^ = 400 - 100 = 300, and the default 100 of this window at f = 0
    // allows 100 * (1 - 300/400) = 25.
    assert!(acquire(&mut b, judged(0), "api", "k", 25).allowed);
    assert!(!acquire(&mut b, judged(0), "api", "k", 1).allowed);
}

#[test]
fn under_the_closed_policy_the_window_before_weighs_the_whole_quota() {
    // Its floor may have been reclaimed for the others while it was silent: it cannot count
    // what it left unused as unused by everyone.
    let spec = LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..sliding("api", 400)
    };
    let mut b = budget(vec![spec]);
    round_trip(&mut b, at(0));
    acquire(&mut b, at(0), "api", "probe", 0);
    // Even the window after the region's first holds only the window's fraction: 50 by
    // half-way, of which it takes 10.
    round_trip(&mut b, before(30_000));
    assert!(acquire(&mut b, before(30_000), "api", "k", 10).allowed);
    round_trip(&mut b, judged(0));
    assert!(!acquire(&mut b, judged(0), "api", "k", 1).allowed);
    round_trip(&mut b, judged(15_000));
    assert!(acquire(&mut b, judged(15_000), "api", "k", 25).allowed);
    assert!(!acquire(&mut b, judged(15_000), "api", "k", 1).allowed);
}

#[test]
fn a_release_leaves_the_region_enough_allowance_for_its_use_under_the_weight() {
    let mut b = region(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, before(30_000), "api", "k", 60).allowed);
    // P^ = 360 as above; 10 used at the window's start, where the weight is 0.1.
    assert!(acquire(&mut b, judged(0), "api", "k", 10).allowed);
    let up = b.poll_transmit(judged(0)).expect("a sync is due");
    let mut down = answer(&up, judged(0));
    let w = minute_window(2 * MINUTE_MS);
    down.release_requests = vec![release_req(1, "api", "k", w, 90, 1)];
    b.handle_sync_down(judged(0), down);
    // A fixed window would release 90 and keep 10; 10 units need all of 100 at a weight of
    // 0.1, so nothing is released.
    assert_eq!(allowance(&b, judged(0), "api", "k"), 100);
    // Half-way the weight is 0.55: 10 units need ceil(10 / 0.55) = 19.
    let now = judged(30_000);
    let up = b.poll_transmit(now).expect("a sync is due");
    let mut down = answer(&up, now);
    down.release_requests = vec![release_req(2, "api", "k", w, 90, 2)];
    b.handle_sync_down(now, down);
    assert_eq!(allowance(&b, now, "api", "k"), 19);
    assert!(acquire(&mut b, now, "api", "k", 0).allowed);
    assert!(!acquire(&mut b, now, "api", "k", 1).allowed);
}

#[test]
fn a_full_sliding_limit_keeps_a_key_whose_use_the_next_window_weighs() {
    let one_key = |spec: LimitSpec| {
        let cfg = BudgetConfig {
            max_keys_per_limit: 1,
            ..cfg()
        };
        let mut b = RegionBudget::new(cfg, vec![spec]).expect("valid config");
        acquire(&mut b, at(0), "api", "a", 0);
        assert!(acquire(&mut b, before(59_000), "api", "a", 1).allowed);
        b.acquire(
            judged(0),
            AcquireRequest {
                limit: lim("api"),
                key: key("b"),
                cost_units: 1,
                request_id: None,
            },
        )
    };
    // A fixed window evicts `a`, idle in its new window, for `b`.
    assert!(one_key(per_minute("api", 400)).is_ok());
    // Evicted, `a` would count as unused in the window before if it came back: kept.
    assert!(matches!(
        one_key(sliding("api", 400)),
        Err(crate::error::Error::TooManyKeys { .. })
    ));
}

/// `p * (W - e) + (c + k) * W <= limit * W` from a tally of admitted units per window, with
/// `p` taken as `previous` when given (the whole quota for a window before the start).
fn fits(
    window: Window,
    admitted: &BTreeMap<u64, u64>,
    limit: u64,
    now: Timestamp,
    cost: u64,
    previous: Option<u64>,
) -> bool {
    let index = window.index(now).0;
    let count = |i: u64| u128::from(admitted.get(&i).copied().unwrap_or(0));
    let w = window.len().as_nanos();
    let e = now
        .saturating_duration_since(window.start(WindowIndex(index)))
        .as_nanos();
    let p = previous.map_or_else(|| count(index - 1), u128::from);
    p * (w - e) + (count(index) + u128::from(cost)) * w <= u128::from(limit) * w
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A region alone: the estimate over the trailing window never exceeds the quota, and
    /// from the second window on (whose window before the region watched) a request passes
    /// exactly when the sliding window counter passes it; in the first it passes only if it
    /// would with the window before full. Either consistency: alone, both hold the quota.
    #[test]
    fn a_region_alone_never_lets_the_estimate_exceed_the_quota(
        limit in 0u64..=40,
        window_ms in 1u64..=10_000,
        eventual in any::<bool>(),
        steps in prop::collection::vec((0u64..=1_500, 0u64..=30, 0u64..1_000), 1..80),
    ) {
        let window = Window::new(Duration::from_millis(window_ms));
        let consistency = if eventual { Consistency::Eventual } else { Consistency::Strict };
        let spec = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            consistency,
            ..LimitSpec::simple("api", limit, window.len())
        };
        let mut b = alone(vec![spec]);
        let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
        let mut now = at(0);
        // The region counts from the window of its first call, `alone`'s probe at `at(0)`.
        let first = window.index(now).0;
        for (gap_permille, cost, jitter_ns) in steps {
            now = now + Duration::from_micros(window_ms * gap_permille)
                + Duration::from_nanos(jitter_ns);
            let index = window.index(now).0;
            let before = (index == first).then_some(limit);
            let expected = fits(window, &admitted, limit, now, cost, before);
            let d = acquire(&mut b, now, "api", "k", cost);
            prop_assert_eq!(d.allowed, expected, "at window {} + {:?}", index - first,
                now.saturating_duration_since(window.start(WindowIndex(index))));
            if d.allowed {
                *admitted.entry(index).or_default() += cost;
                prop_assert!(fits(window, &admitted, limit, now, 0, None));
            }
        }
    }
}

#[test]
fn the_key_view_counts_what_is_left_from_the_weighted_allowance() {
    // As in `the_weight_scales_a_regions_share_by_what_the_window_before_leaves`: at f = 0.5
    // the region may have used 55 of its 100. The operator's view and the next decision agree.
    let mut b = region(vec![sliding("api", 400)]);
    assert!(acquire(&mut b, before(30_000), "api", "k", 60).allowed);
    let now = judged(30_000);
    assert!(acquire(&mut b, now, "api", "k", 5).allowed);
    let v = b
        .key_view(now, &lim("api"), &key("k"))
        .expect("known limit");
    assert_eq!(v.allowance_units, 100);
    assert_eq!(v.weighted_allowance_units, Some(55));
    assert_eq!(v.remaining_units, 50);
    let d = acquire(&mut b, now, "api", "k", 50);
    assert!(d.allowed);
    assert_eq!(d.remaining_units, 0);
    // A fixed window has no weight.
    let b = region(vec![per_minute("api", 400)]);
    let v = b
        .key_view(now, &lim("api"), &key("k"))
        .expect("known limit");
    assert_eq!((v.weighted_allowance_units, v.remaining_units), (None, 100));
}
