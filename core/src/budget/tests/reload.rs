//! Configuration reload: what a region keeps and drops, and the configuration version check.

use super::*;
use crate::limit::Consistency;

/// A region holding a grant of 250 for window `w` (epoch 2), 200 of it used.
fn granted_and_used(spec: LimitSpec) -> RegionBudget {
    let mut b = budget(vec![spec]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "k", w, 250, 2)];
    b.handle_sync_down(at(10), down);
    assert!(acquire(&mut b, at(20), "api", "k", 200).allowed);
    b
}

fn grant_at(b: &mut RegionBudget, now: Timestamp, g: AllowanceGrant) {
    let up = b.poll_transmit(now).expect("sync");
    let mut down = answer(&up, now);
    down.grants = vec![g];
    b.handle_sync_down(now, down);
}

#[test]
fn a_quota_cut_drops_the_grant_keeps_the_counter_and_takes_the_next_grant() {
    let mut b = granted_and_used(per_minute("api", 400));
    b.set_limits(at(1_000), vec![per_minute("api", 200)]);
    assert_eq!(net(&b, "api", "k"), 200, "admitted units stay counted");
    assert_eq!(allowance(&b, at(1_000), "api", "k"), 50, "the new default");
    assert!(!acquire(&mut b, at(1_000), "api", "k", 1).allowed);
    let w = minute_window(0);
    grant_at(&mut b, at(2_000), grant("api", "k", w, 210, 2));
    assert_eq!(
        allowance(&b, at(2_000), "api", "k"),
        50,
        "an epoch already seen"
    );
    grant_at(&mut b, at(3_000), grant("api", "k", w, 210, 3));
    assert_eq!(
        allowance(&b, at(3_000), "api", "k"),
        210,
        "a later epoch applies"
    );
}

#[test]
fn strict_eventual_strict_leaves_no_grant_of_the_first_strict_spell() {
    let mut b = granted_and_used(per_minute("api", 400));
    let eventual = LimitSpec {
        consistency: Consistency::Eventual,
        ..per_minute("api", 400)
    };
    b.set_limits(at(1_000), vec![eventual]);
    b.set_limits(at(2_000), vec![per_minute("api", 400)]);
    assert_eq!(
        allowance(&b, at(2_000), "api", "k"),
        100,
        "the default again"
    );
    assert!(!acquire(&mut b, at(2_000), "api", "k", 1).allowed);
}

#[test]
fn a_reload_that_leaves_the_allocation_alone_keeps_the_grant() {
    let mut b = granted_and_used(per_minute("api", 400));
    let same = LimitSpec {
        detailed_metric: true,
        ..per_minute("api", 400)
    };
    b.set_limits(at(1_000), vec![same]);
    assert_eq!(allowance(&b, at(1_000), "api", "k"), 250);
}

#[test]
fn grants_and_release_requests_of_another_version_are_neither_applied_nor_acked() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.set_config_version(2);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.config_version = 1;
    down.grants = vec![grant("api", "k", w, 250, 2)];
    down.release_requests = vec![release_req(7, "api", "j", w, 50, 1)];
    b.handle_sync_down(at(10), down);
    assert_eq!(allowance(&b, at(10), "api", "k"), 100);
    assert_eq!(allowance(&b, at(10), "api", "j"), 100);
    let up = b.poll_transmit(at(300)).expect("sync");
    assert!(
        up.release_acks.is_empty(),
        "no ack for a release not applied"
    );
    let mut down = answer(&up, at(300));
    down.config_version = 2;
    down.grants = vec![grant("api", "k", w, 250, 2)];
    b.handle_sync_down(at(310), down);
    assert_eq!(
        allowance(&b, at(310), "api", "k"),
        250,
        "same version: applied"
    );
}
