//! Concurrency slots through the budget machine.

use std::time::Duration;

use super::*;
use crate::budget::SlotOutcome;
use crate::limit::ConcurrencyCap;

/// A budget whose region (one of four, equal weights) holds `max_slots` slots per key: a
/// quarter of the limit's cap.
fn capped(max_slots: u32, shadow: bool) -> RegionBudget {
    let mut spec = per_minute("api", 400);
    spec.concurrency = Some(ConcurrencyCap {
        max_slots: 4 * max_slots,
        slot_ttl: Duration::from_secs(10),
    });
    spec.shadow_mode = shadow;
    budget(vec![spec])
}

fn slot(out: SlotOutcome) -> crate::algo::concurrency::SlotId {
    match out {
        SlotOutcome::Acquired { slot, .. } => slot,
        other => panic!("expected a slot, got {other:?}"),
    }
}

#[test]
fn slots_are_capped_and_come_back_on_release() {
    let mut b = capped(2, false);
    let (l, k) = (lim("api"), key("k"));
    let a = slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
    slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
    assert_eq!(
        b.acquire_slot(at(1_000), &l, &k, None).expect("slot"),
        SlotOutcome::Denied {
            retry_after: Some(Duration::from_secs(9)),
            in_use: 2,
            max_slots: 2
        }
    );
    assert!(b.release_slot(at(1_000), a).expect("release"));
    assert!(!b.release_slot(at(1_000), a).expect("release"), "only once");
    slot(b.acquire_slot(at(1_000), &l, &k, None).expect("slot"));
}

#[test]
fn a_crashed_holders_slot_returns_after_its_ttl() {
    let mut b = capped(1, false);
    let (l, k) = (lim("api"), key("k"));
    let a = slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
    assert_eq!(b.poll_timeout().map(|t| t <= at(10_000)), Some(true));
    b.handle_timeout(at(10_000));
    assert!(!b.release_slot(at(10_000), a).expect("release"), "expired");
    slot(b.acquire_slot(at(10_000), &l, &k, None).expect("slot"));
}

#[test]
fn a_retried_slot_acquire_takes_one_slot() {
    let mut b = capped(2, false);
    let (l, k) = (lim("api"), key("k"));
    let id = Some(RequestId(5));
    let first = b.acquire_slot(at(0), &l, &k, id).expect("slot");
    assert_eq!(b.acquire_slot(at(1), &l, &k, id).expect("slot"), first);
    slot(b.acquire_slot(at(2), &l, &k, None).expect("slot"));
    assert!(matches!(
        b.acquire_slot(at(3), &l, &k, None).expect("slot"),
        SlotOutcome::Denied { in_use: 2, .. }
    ));
}

#[test]
fn shadow_mode_lets_a_full_key_through_without_holding_a_slot() {
    let mut b = capped(1, true);
    let (l, k) = (lim("api"), key("k"));
    slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
    match b.acquire_slot(at(0), &l, &k, None).expect("slot") {
        SlotOutcome::Acquired {
            slot,
            shadow_denied,
            ..
        } => {
            assert!(shadow_denied);
            assert!(!b.release_slot(at(0), slot).expect("release"), "never held");
        }
        other => panic!("expected a shadow slot, got {other:?}"),
    }
}

#[test]
fn limits_without_a_concurrency_cap_are_unmetered() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert_eq!(
        b.acquire_slot(at(0), &lim("api"), &key("k"), None)
            .expect("slot"),
        SlotOutcome::Unmetered
    );
}

#[test]
fn each_region_holds_its_weighted_part_of_the_slots_and_at_least_one() {
    // Four equal regions: 10 slots split as floor(10 / 4) = 2 each (8 worldwide, never above
    // 10); 2 slots would round to 0, so each region keeps 1 (4 worldwide: one per region).
    for (max_slots, part) in [(10, 2), (2, 1)] {
        let mut spec = per_minute("api", 400);
        spec.concurrency = Some(ConcurrencyCap {
            max_slots,
            slot_ttl: Duration::from_secs(10),
        });
        let mut b = budget(vec![spec.clone()]);
        let (l, k) = (lim("api"), key("k"));
        for _ in 0..part {
            slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
        }
        match b.acquire_slot(at(0), &l, &k, None).expect("slot") {
            SlotOutcome::Denied { max_slots, .. } => assert_eq!(max_slots, part),
            other => panic!("expected a denial after {part} slots, got {other:?}"),
        }
        // A region alone holds the whole cap.
        let alone = BudgetConfig::new(RegionId::from("eu"), vec![RegionId::from("eu")]);
        let mut b = RegionBudget::new(alone, vec![spec]).expect("valid config");
        for _ in 0..max_slots {
            slot(b.acquire_slot(at(0), &l, &k, None).expect("slot"));
        }
        assert!(matches!(
            b.acquire_slot(at(0), &l, &k, None).expect("slot"),
            SlotOutcome::Denied { .. }
        ));
    }
}
