//! Partition policies: what a region does once its contact with the coordinator expires.

use std::time::Duration;

use super::*;
use crate::budget::Reason;
use crate::limit::{Consistency, PartitionPolicy, RateCap};

fn with_policy(policy: PartitionPolicy) -> RegionBudget {
    let mut spec = per_minute_settling("api", 400, 100);
    spec.partition_policy = policy;
    budget(vec![spec])
}

#[test]
fn floor_keeps_the_default_share_while_partitioned() {
    let mut b = with_policy(PartitionPolicy::Floor);
    round_trip(&mut b, at(0));
    assert!(b.is_view_expired(at(10_000)));
    assert!(acquire(&mut b, at(10_000), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(10_000), "api", "k", 1).allowed);
}

#[test]
fn a_partitioned_region_keeps_what_it_was_granted_whatever_the_policy() {
    let mut b = with_policy(PartitionPolicy::Closed);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "k", minute_window(0), 250, 1)];
    b.handle_sync_down(at(0), down);
    // Ten seconds of silence: the view expired long ago, the grant still holds.
    assert!(b.is_view_expired(at(10_000)));
    assert!(acquire(&mut b, at(10_000), "api", "k", 250).allowed);
    assert!(!acquire(&mut b, at(10_000), "api", "k", 1).allowed);
}

#[test]
fn closed_denies_once_contact_expires_until_it_resumes() {
    let mut b = with_policy(PartitionPolicy::Closed);
    round_trip(&mut b, at(0));
    assert!(acquire(&mut b, at(1_000), "api", "k", 30).allowed);
    // Contact at 0, view_ttl 2 s: from 2 s + 1 ns nothing more is admitted (a_r = n_r = 30).
    let d = acquire(&mut b, at(2_001), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::PartitionClosed);
    assert_eq!(allowance(&b, at(2_001), "api", "k"), 30);
    assert_eq!(allowance(&b, at(2_001), "api", "new"), 0);
    round_trip(&mut b, at(5_000));
    assert!(
        acquire(&mut b, at(5_000), "api", "k", 70).allowed,
        "back to the floor"
    );
}

#[test]
fn a_closed_region_never_enforces_more_than_its_share_after_settle_overage() {
    // Default share 100 (L = 400 over four regions). A lease of 100 settled at 130 takes use
    // to 130 (30 of it recorded overage). Once closed, the region admits nothing more, and the
    // allowance it enforces (and reports) stays at its share: the coordinator's table holds
    // 100 for it, not 130.
    let mut b = with_policy(PartitionPolicy::Closed);
    round_trip(&mut b, at(0));
    let g = granted(
        b.lease(at(1_000), lease_req("api", "k", 100, 30))
            .expect("lease"),
    );
    assert_eq!(g.units, 100);
    let s = b.settle(at(1_000), g.lease, 130, None).expect("settle");
    assert_eq!(s.overage_units, 30);
    assert_eq!(net(&b, "api", "k"), 130);
    assert!(b.is_view_expired(at(2_001)));
    assert_eq!(allowance(&b, at(2_001), "api", "k"), 100);
    assert!(!acquire(&mut b, at(2_001), "api", "k", 1).allowed);
}

#[test]
fn a_closed_eventual_region_past_its_share_keeps_its_use_as_allowance() {
    // Eventual, L = 400, default share 100. Every other region reported zero, so the view
    // admits 150 here. Once the view expires, closed means nothing more: the allowance is the
    // use, 150, not the share (no ceiling in view mode, and no excess was admitted).
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    spec.partition_policy = PartitionPolicy::Closed;
    let mut b = budget(vec![spec]);
    assert!(
        !acquire(&mut b, at(0), "api", "k", 101).allowed,
        "escalates"
    );
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.entries = ["us", "ap", "sa"]
        .into_iter()
        .map(|r| crate::sync::CounterEntry {
            counter: counter("api", "k", minute_window(0)),
            region: RegionId::from(r),
            granted_units: 0,
            refunded_units: 0,
        })
        .collect();
    b.handle_sync_down(at(0), down);
    assert!(acquire(&mut b, at(1_000), "api", "k", 150).allowed);
    assert_eq!(allowance(&b, at(2_001), "api", "k"), 150);
    assert!(!acquire(&mut b, at(2_001), "api", "k", 1).allowed);
}

#[test]
fn open_admits_beyond_the_allowance_at_its_rate_and_records_it() {
    // Open at 10 per second, burst 10.
    let mut b = with_policy(PartitionPolicy::Open {
        rate: RateCap {
            units: 10,
            per: Duration::from_secs(1),
            burst: 10,
        },
    });
    round_trip(&mut b, at(0));
    // While contact is fresh the default share is the limit.
    assert!(acquire(&mut b, at(1_000), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(1_000), "api", "k", 1).allowed);
    // Expired from 2 s: ten more at once (the burst), the eleventh waits 100 ms.
    for _ in 0..10 {
        let d = acquire(&mut b, at(3_000), "api", "k", 1);
        assert!(d.allowed);
        assert_eq!(d.reason, Reason::PartitionOpen);
    }
    let d = acquire(&mut b, at(3_000), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::PartitionOpen);
    assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
    // Open from 2 s to 5 s when the timer runs: 3 s open, 10 fail-open units.
    b.handle_timeout(at(5_000));
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.fail_open_units, 10);
    assert_eq!(w.time_open, Duration::from_secs(3));
    assert_eq!(net(&b, "api", "k"), 110);
}

#[test]
fn time_open_is_split_at_window_boundaries() {
    let mut b = with_policy(PartitionPolicy::Open {
        rate: RateCap {
            units: 1,
            per: Duration::from_secs(1),
            burst: 1,
        },
    });
    round_trip(&mut b, at(50_000));
    // Expired from 52 s; contact resumes at 70 s: 8 s in the first window, 10 s in the next.
    b.handle_timeout(at(55_000));
    round_trip(&mut b, at(70_000));
    let s = b.stats(&lim("api")).expect("stats");
    let open = |ms| s.window(minute_window(ms)).map(|w| w.time_open);
    assert_eq!(open(0), Some(Duration::from_secs(8)));
    assert_eq!(open(60_000), Some(Duration::from_secs(10)));
}

#[test]
fn eventual_mode_falls_back_to_its_policy_once_the_view_expires() {
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    spec.partition_policy = PartitionPolicy::Closed;
    let mut b = budget(vec![spec]);
    round_trip(&mut b, at(0));
    assert!(acquire(&mut b, at(1_000), "api", "k", 10).allowed);
    let d = acquire(&mut b, at(3_000), "api", "k", 1);
    assert!(
        !d.allowed,
        "closed: not even the default share once expired"
    );
    assert_eq!(d.reason, Reason::PartitionClosed);
}

#[test]
fn the_poll_timeout_wakes_the_region_when_its_view_expires() {
    let mut spec = per_minute("api", 400);
    spec.partition_policy = PartitionPolicy::Closed;
    let mut c = cfg();
    c.sync_interval = Duration::from_secs(10);
    let mut b = RegionBudget::new(c, vec![spec]).expect("valid");
    round_trip(&mut b, at(0));
    b.handle_timeout(at(100));
    // The next sync is at 10 s, but the view expires at 2 s + 1 ns: that comes first.
    assert_eq!(b.poll_timeout(), Some(at(2_000) + Duration::from_nanos(1)));
    b.handle_timeout(at(2_000) + Duration::from_nanos(1));
    assert_eq!(
        b.poll_timeout(),
        Some(at(10_000)),
        "an expiry already handled is not asked for again"
    );
}

#[test]
fn open_spans_share_one_budget_per_window_however_often_the_view_recovers() {
    // Open at 10 per second, burst 10; view TTL 2 s. Each span used to start with a refilled
    // GCRA burst. The window's fail-open units now stay within ceil(10/s * time open) + 10.
    let mut b = with_policy(PartitionPolicy::Open {
        rate: RateCap {
            units: 10,
            per: Duration::from_secs(1),
            burst: 10,
        },
    });
    round_trip(&mut b, at(0));
    assert!(acquire(&mut b, at(1_000), "api", "k", 100).allowed);
    // Open from 2 s; at 2.1 s the budget is ceil(10 * 0.1) + 10 = 11: the burst of 10 fits.
    assert!(acquire(&mut b, at(2_100), "api", "k", 10).allowed);
    // Contact at 2.2 s, expired again from 4.2 s. At 4.3 s the GCRA has refilled, but the
    // window has been open 0.3 s: 3 + 10 = 13 units in all, so 3 more.
    round_trip(&mut b, at(2_200));
    for _ in 0..3 {
        assert!(acquire(&mut b, at(4_300), "api", "k", 1).allowed);
    }
    let d = acquire(&mut b, at(4_300), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::PartitionOpen);
    assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
    // A lease takes what the budget grew by since: 0.5 s more open, 5 units.
    let g = granted(
        b.lease(at(4_800), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    assert_eq!(g.units, 5);
    b.handle_timeout(at(4_800));
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.time_open, Duration::from_millis(800));
    assert_eq!(
        w.fail_open_units, 18,
        "ceil(10/s * 0.8 s) + 10, the bound's term"
    );
}
