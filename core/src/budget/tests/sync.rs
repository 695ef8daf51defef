//! The coordinator contract: escalation, SyncUp contents and resending, grants, release
//! requests, clock samples, time anchoring, eventual mode's view.

use super::*;
use crate::budget::Reason;
use crate::limit::{Consistency, RegionWeights};
use crate::sync::{CounterEntry, MAX_ITEMS_PER_MESSAGE};

#[test]
fn syncs_go_out_every_interval_starting_at_once() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert_eq!(
        b.poll_timeout(),
        Some(Timestamp::ZERO),
        "the first sync is due now"
    );
    let first = b.poll_transmit(at(0)).expect("first sync");
    assert_eq!((first.seq, first.sent_at), (0, at(0)));
    assert_eq!(b.poll_transmit(at(249)), None);
    let second = b.poll_transmit(at(250)).expect("250 ms later");
    assert_eq!(second.seq, 1);
}

#[test]
fn quiet_keys_cost_the_coordinator_nothing() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // 20 units in the first 30 s: the projection 20 + 20/30 s * 30 s = 40 stays under 100.
    acquire(&mut b, at(30_000), "api", "k", 20);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    assert!(up.entries.is_empty() && up.demand.is_empty(), "{up:?}");
}

#[test]
fn a_key_escalates_when_its_projection_exceeds_the_allowance() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // 60 units in the first 30 s: 60 + (60 / 30 s) * 30 s left = 120 > 100.
    acquire(&mut b, at(30_000), "api", "k", 60);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    let w = minute_window(0);
    assert_eq!(
        up.entries,
        vec![CounterEntry {
            counter: counter("api", "k", w),
            region: RegionId::from("eu"),
            granted_units: 60,
            refunded_units: 0,
        }]
    );
    assert_eq!(up.demand.len(), 1);
    assert_eq!(
        up.demand[0].demand_micro_units_per_sec, 2_000_000,
        "60 units / 30 s"
    );
    assert_eq!(up.demand[0].allowance_units, 100);
}

#[test]
fn a_refusal_escalates_and_refused_units_count_as_demand() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(30_000), "api", "k", 30);
    assert!(!acquire(&mut b, at(30_000), "api", "k", 90).allowed);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    // Requested 30 + 90 = 120 units in 30 s: 4 units/s.
    assert_eq!(up.demand.len(), 1);
    assert_eq!(up.demand[0].demand_micro_units_per_sec, 4_000_000);
    assert_eq!(up.entries[0].granted_units, 30);
}

#[test]
fn a_closed_region_reports_the_allowance_it_holds_with_contact_not_its_partition_zero() {
    // Default share 100 (L = 400 over four regions). A refused request of 101 escalates the
    // key with nothing used. Once the view expires the closed policy admits nothing (a_r = 0),
    // but the next answer ends that and the region is back on its default share, so its demand
    // report says 100: a report of 0 would tell the coordinator the region holds at most a
    // zero row it may never have received.
    let mut spec = per_minute("api", 400);
    spec.partition_policy = crate::limit::PartitionPolicy::Closed;
    let mut b = budget(vec![spec]);
    round_trip(&mut b, at(0));
    assert!(!acquire(&mut b, at(1_000), "api", "k", 101).allowed);
    assert_eq!(
        allowance(&b, at(2_001), "api", "k"),
        0,
        "closed while expired"
    );
    let up = b.poll_transmit(at(2_001)).expect("sync");
    assert_eq!(up.demand.len(), 1);
    assert_eq!(up.demand[0].allowance_units, 100);
}

#[test]
fn the_demand_estimate_never_divides_by_less_than_a_tenth_of_the_window() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // 101 units refused 1 s into a 60 s window: divided by 6 s, not 1 s: 16.83 units/s.
    acquire(&mut b, at(1_000), "api", "k", 101);
    let up = b.poll_transmit(at(1_000)).expect("sync");
    assert_eq!(up.demand[0].demand_micro_units_per_sec, 16_833_333);
}

#[test]
fn entries_are_resent_until_an_answer_confirms_them() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "k", 101); // refused: escalated, nothing used
    acquire(&mut b, at(0), "api", "k", 50);
    let up0 = b.poll_transmit(at(0)).expect("sync");
    assert_eq!(up0.entries.len(), 1);
    // No answer yet: the next sync carries the entry again.
    let up1 = b.poll_transmit(at(250)).expect("sync");
    assert_eq!(up1.entries, up0.entries);
    // The answer to the first confirms granted = 50; nothing changed since, so nothing to send.
    b.handle_sync_down(at(300), answer(&up0, at(300)));
    let up2 = b.poll_transmit(at(500)).expect("sync");
    assert!(up2.entries.is_empty());
    assert_eq!(up2.demand.len(), 1, "demand keeps flowing while escalated");
    // A change is sent again, with the new absolute values.
    acquire(&mut b, at(600), "api", "k", 10);
    let up3 = b.poll_transmit(at(750)).expect("sync");
    assert_eq!(up3.entries[0].granted_units, 60);
}

#[test]
fn entries_in_successive_syncs_never_decrease() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "k", 101);
    let mut last = 0;
    for i in 0..20u64 {
        let now = at(i * 250);
        if i % 3 == 0 {
            let g = granted(b.lease(now, lease_req("api", "k", 5, 1)).expect("lease"));
            b.release(now, g.lease, 2, None).expect("release");
        }
        let up = b.poll_transmit(now).expect("sync");
        for e in up.entries {
            assert!(e.granted_units >= last);
            last = e.granted_units;
        }
    }
}

#[test]
fn a_long_list_of_reported_keys_is_spread_over_syncs_without_starving_any() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let n = MAX_ITEMS_PER_MESSAGE + 904;
    for i in 0..n {
        let k = format!("k{i:05}");
        acquire(&mut b, at(0), "api", &k, 100);
        acquire(&mut b, at(0), "api", &k, 1); // refused: escalates
    }
    let up0 = b.poll_transmit(at(0)).expect("sync");
    assert_eq!(up0.entries.len(), MAX_ITEMS_PER_MESSAGE);
    let up1 = b.poll_transmit(at(250)).expect("sync");
    let mut seen: std::collections::BTreeSet<String> = up0
        .entries
        .iter()
        .chain(&up1.entries)
        .map(|e| e.counter.key.to_string())
        .collect();
    assert_eq!(seen.len(), n, "every key made it within two syncs");
    // The second sync started where the first stopped.
    assert_eq!(
        up1.entries[0].counter.key.as_str(),
        format!("k{:05}", MAX_ITEMS_PER_MESSAGE)
    );
    seen.clear();
}

/// Configured to a few items a message, a region spreads its keys over SyncUps from where the
/// last one stopped, and every key is reported within the rounds that take.
#[test]
fn a_lowered_message_cap_spreads_the_keys_over_syncs_and_reaches_every_one() {
    let capped = BudgetConfig {
        message_items: 4,
        ..cfg()
    };
    let mut b = RegionBudget::new(capped, vec![per_minute("api", 400)]).expect("budget");
    let n = 10;
    for i in 0..n {
        let k = format!("k{i:02}");
        acquire(&mut b, at(0), "api", &k, 100);
        acquire(&mut b, at(0), "api", &k, 1); // refused: escalates
    }
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..3 {
        let up = b.poll_transmit(at(250 * round)).expect("sync");
        assert!(up.entries.len() <= 4 && up.demand.len() <= 4, "{up:?}");
        seen.extend(up.entries.iter().map(|e| e.counter.key.to_string()));
    }
    assert_eq!(seen.len(), n, "every key within three syncs of four");
    let too_few = BudgetConfig {
        message_items: 3,
        ..cfg()
    };
    let Err(err) = RegionBudget::new(too_few, vec![per_minute("api", 400)]) else {
        panic!("three items a message accepted");
    };
    assert!(
        err.to_string()
            .contains("message_items must be from 4 to 4096, not 3"),
        "{err}"
    );
}

/// An answer that leaves rows below the default for later ones (more than one answer
/// carries): every strict key holds at what it used, floor policy or not, and a grant held
/// from before no higher; the demand report still states the allowance with contact. The
/// next answer that leaves none lifts the hold.
#[test]
fn rows_below_the_default_left_for_later_answers_hold_strict_keys_at_their_use() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    assert!(acquire(&mut b, at(0), "api", "used", 30).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "big", w, 250, 2)];
    b.handle_sync_down(at(5), down);
    assert!(
        acquire(&mut b, at(6), "api", "big", 150).allowed,
        "past the default"
    );
    let up = b.poll_transmit(at(250)).expect("sync");
    let mut down = answer(&up, at(250));
    down.grants = vec![grant("api", "granted", w, 250, 2)];
    down.below_default_left = true;
    b.handle_sync_down(at(260), down);
    let now = at(270);
    assert_eq!(allowance(&b, now, "api", "used"), 30, "what it used");
    assert_eq!(
        allowance(&b, now, "api", "big"),
        150,
        "what it used, past its default, within its grant"
    );
    assert_eq!(allowance(&b, now, "api", "new"), 0);
    assert_eq!(allowance(&b, now, "api", "granted"), 0, "used none of it");
    for key in ["used", "big", "new"] {
        assert!(!acquire(&mut b, now, "api", key, 1).allowed, "{key}");
    }
    let up = b.poll_transmit(at(500)).expect("sync");
    assert!(!up.demand.is_empty(), "the refusals escalated");
    assert!(
        up.demand.iter().all(|d| d.allowance_units >= 100),
        "reported with contact, not the hold: {:?}",
        up.demand
    );
    let down = answer(&up, at(500));
    b.handle_sync_down(at(510), down);
    let now = at(520);
    assert_eq!(allowance(&b, now, "api", "used"), 100, "the default");
    assert_eq!(allowance(&b, now, "api", "big"), 250);
    assert_eq!(allowance(&b, now, "api", "granted"), 250);
    assert!(acquire(&mut b, now, "api", "new", 1).allowed);
}

#[test]
fn grants_apply_in_epoch_order_only() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![
        grant("api", "k", w, 250, 2),
        grant("api", "k", w, 999, 2), // same epoch: stale
        grant("api", "k", w, 998, 1), // older epoch, arrived later: stale
    ];
    b.handle_sync_down(at(10), down);
    assert_eq!(allowance(&b, at(10), "api", "k"), 250);
    assert!(acquire(&mut b, at(10), "api", "k", 250).allowed);
    assert!(!acquire(&mut b, at(10), "api", "k", 1).allowed);
    let mut other = grant("api", "j", w, 999, 5);
    other.region = RegionId::from("us");
    let up = b.poll_transmit(at(250)).expect("sync");
    let mut down = answer(&up, at(250));
    down.grants = vec![other];
    b.handle_sync_down(at(260), down);
    assert_eq!(
        allowance(&b, at(260), "api", "j"),
        100,
        "another region's grant"
    );
}

#[test]
fn a_grant_for_the_next_window_waits_for_it() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(50_000)).expect("sync");
    let mut down = answer(&up, at(50_000));
    down.grants = vec![grant("api", "k", minute_window(60_000), 40, 1)];
    b.handle_sync_down(at(50_000), down);
    assert_eq!(
        allowance(&b, at(50_000), "api", "k"),
        100,
        "still the default now"
    );
    assert_eq!(allowance(&b, at(60_000), "api", "k"), 40);
    assert!(acquire(&mut b, at(60_000), "api", "k", 40).allowed);
    assert!(!acquire(&mut b, at(60_000), "api", "k", 1).allowed);
}

#[test]
fn a_release_lowers_the_allowance_never_below_net_use_and_is_acked_until_confirmed() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "k", w, 250, 1)];
    b.handle_sync_down(at(0), down);
    acquire(&mut b, at(100), "api", "k", 200);
    // Asked for 100 back with 250 - 200 = 50 unused: releases 50, keeps 200.
    let up = b.poll_transmit(at(250)).expect("sync");
    let mut down = answer(&up, at(250));
    down.release_requests = vec![release_req(77, "api", "k", w, 100, 2)];
    b.handle_sync_down(at(260), down.clone());
    assert_eq!(allowance(&b, at(260), "api", "k"), 200);
    assert!(!acquire(&mut b, at(260), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(500)).expect("sync");
    assert_eq!(up.release_acks.len(), 1);
    let ack = up.release_acks[0].clone();
    assert_eq!(
        (ack.id, ack.released_units, ack.allowance_after_units),
        (77, 50, 200)
    );
    // The same request again: same ack, nothing more released.
    b.handle_sync_down(at(510), down);
    assert_eq!(allowance(&b, at(510), "api", "k"), 200);
    let up2 = b.poll_transmit(at(750)).expect("sync");
    assert_eq!(up2.release_acks, vec![ack]);
    // Once an answer to a SyncUp that carried the ack arrives, it stops being sent.
    b.handle_sync_down(at(800), answer(&up2, at(800)));
    let up3 = b.poll_transmit(at(1_000)).expect("sync");
    assert!(up3.release_acks.is_empty());
}

#[test]
fn a_release_with_a_stale_epoch_releases_nothing_but_is_answered() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "k", w, 250, 5)];
    down.release_requests = vec![release_req(1, "api", "k", w, 100, 4)];
    b.handle_sync_down(at(0), down);
    assert_eq!(allowance(&b, at(0), "api", "k"), 250);
    let up = b.poll_transmit(at(250)).expect("sync");
    assert_eq!(up.release_acks[0].released_units, 0);
    assert_eq!(up.release_acks[0].allowance_after_units, 250);
}

#[test]
fn a_release_of_the_default_share_makes_it_explicit() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "k", 30);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.release_requests = vec![release_req(1, "api", "k", minute_window(0), 50, 1)];
    b.handle_sync_down(at(0), down);
    // 100 - min(50, 100 - 30) = 50; and it holds even when contact is lost.
    assert_eq!(allowance(&b, at(0), "api", "k"), 50);
    assert_eq!(allowance(&b, at(30_000), "api", "k"), 50);
}

#[test]
fn an_answer_takes_a_clock_sample_and_the_next_sync_carries_it() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(0)).expect("sync");
    assert_eq!(up.clock, None);
    // Coordinator 100 ms ahead, 20 ms each way: t1 = 120, t2 = 130 on its clock, t3 = 50.
    let mut down = answer(&up, at(0));
    down.received_at = at(120);
    down.sent_at = at(130);
    b.handle_sync_down(at(50), down);
    let s = b.clock_sample().expect("sample");
    assert_eq!(
        (s.offset_nanos, s.round_trip_nanos),
        (100_000_000, 40_000_000)
    );
    assert_eq!(b.poll_transmit(at(250)).expect("sync").clock, Some(s));
}

#[test]
fn answers_are_aged_from_the_send_time_of_what_they_answer() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(0)).expect("sync");
    // The answer takes 1.5 s to arrive; contact dates from 0, not from 1.5 s.
    b.handle_sync_down(at(1_500), answer(&up, at(1_000)));
    assert_eq!(b.last_contact(), Some(at(0)));
    assert!(!b.is_view_expired(at(2_000)));
    assert!(
        b.is_view_expired(at(2_001)),
        "view_ttl is 2 s from the send time"
    );
}

#[test]
fn an_answer_to_an_unknown_sync_merges_counters_but_refreshes_nothing() {
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    let mut b = budget(vec![spec]);
    acquire(&mut b, at(0), "api", "k", 10);
    let mut down = answer(&b.poll_transmit(at(0)).expect("sync"), at(0));
    down.reply_to_seq = 99;
    down.entries = vec![CounterEntry {
        counter: counter("api", "k", minute_window(0)),
        region: RegionId::from("eu"),
        granted_units: 40,
        refunded_units: 5,
    }];
    b.handle_sync_down(at(10), down);
    assert_eq!(b.last_contact(), None);
    assert!(b.is_view_expired(at(10)));
    let c = b.counter(&lim("api"), &key("k")).expect("counter");
    assert_eq!(
        (c.granted_units, c.refunded_units),
        (40, 5),
        "own entries merge by max"
    );
}

/// Escalates counter `k` of an eventual limit of L = 400 (four regions, default share 100
/// each) by using the whole default share, then answers with `entries` from other regions.
fn eventual_region_with_view(entries: &[(&str, u64, u64)]) -> RegionBudget {
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    let mut b = budget(vec![spec]);
    assert!(acquire(&mut b, at(0), "api", "k", 100).allowed);
    // Past the default share, and the coordinator has not answered for this counter yet.
    assert!(!acquire(&mut b, at(0), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    assert_eq!(up.entries.len(), 1, "past its default share: escalated");
    let mut down = answer(&up, at(0));
    down.entries = entries
        .iter()
        .map(|(r, g, f)| CounterEntry {
            counter: counter("api", "k", minute_window(0)),
            region: RegionId::from(*r),
            granted_units: *g,
            refunded_units: *f,
        })
        .collect();
    b.handle_sync_down(at(10), down);
    b
}

#[test]
fn eventual_mode_admits_past_the_default_share_once_every_region_is_heard() {
    // us 50, ap max(30, 25) - 10 = 20, sa reported zero: others 70, so 400 - 70 = 330.
    let mut b =
        eventual_region_with_view(&[("us", 50, 0), ("ap", 30, 10), ("ap", 25, 0), ("sa", 0, 0)]);
    // 100 + 230 = 330.
    let d = acquire(&mut b, at(10), "api", "k", 230);
    assert!(d.allowed);
    assert_eq!(d.reason, Reason::GlobalView);
    assert!(!acquire(&mut b, at(10), "api", "k", 1).allowed);
    // Once the view expires only the default share counts: still nothing more.
    assert_eq!(allowance(&b, at(5_000), "api", "k"), 100);
}

#[test]
fn eventual_mode_counts_an_unheard_region_at_its_default_share() {
    // sa has not reported: it may be admitting on its default share (100) without a view.
    // Others: 50 + 20 + 100 = 170, so 400 - 170 = 230 in all for this region.
    let mut b = eventual_region_with_view(&[("us", 50, 0), ("ap", 30, 10)]);
    assert_eq!(allowance(&b, at(10), "api", "k"), 230);
    assert!(acquire(&mut b, at(10), "api", "k", 130).allowed);
    assert!(!acquire(&mut b, at(10), "api", "k", 1).allowed);
}

#[test]
fn eventual_mode_counts_the_unassigned_remainder_while_a_region_is_unheard() {
    // Weights 0.2 each: defaults 80, and 400 - 4 * 80 = 80 held by nobody. With sa unheard it
    // counts at 80 and so does the remainder: 400 - (50 + 20 + 80 + 80) = 170.
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    let ppm = regions().into_iter().map(|r| (r, 200_000)).collect();
    spec.weights = RegionWeights::new(ppm).expect("weights sum to 0.8");
    let mut b = budget(vec![spec]);
    assert!(acquire(&mut b, at(0), "api", "k", 80).allowed);
    assert!(!acquire(&mut b, at(0), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.entries = [("us", 50), ("ap", 20)]
        .into_iter()
        .map(|(r, g)| CounterEntry {
            counter: counter("api", "k", minute_window(0)),
            region: RegionId::from(r),
            granted_units: g,
            refunded_units: 0,
        })
        .collect();
    b.handle_sync_down(at(10), down);
    assert_eq!(allowance(&b, at(10), "api", "k"), 170);
}

#[test]
fn in_eventual_view_mode_the_default_share_is_no_floor() {
    // The others took 50 + 150 + 150 = 350 while this region held 100: it may not go on to
    // spend its default share, because they counted it at its reported use.
    let mut b = eventual_region_with_view(&[("us", 50, 0), ("ap", 150, 0), ("sa", 150, 0)]);
    assert_eq!(allowance(&b, at(10), "api", "k"), 50);
    assert!(!acquire(&mut b, at(10), "api", "k", 1).allowed);
}

#[test]
fn strict_limits_keep_no_view_of_keys_they_do_not_have() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.entries = vec![CounterEntry {
        counter: counter("api", "x", minute_window(0)),
        region: RegionId::from("us"),
        granted_units: 10,
        refunded_units: 0,
    }];
    b.handle_sync_down(at(0), down);
    assert_eq!(b.key_count(&lim("api")), 0);
}

#[test]
fn the_final_values_of_a_reported_window_go_out_after_it_ends() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(59_000), "api", "k", 101); // escalates
    acquire(&mut b, at(59_000), "api", "k", 70);
    // The window ends before any sync carried the 70.
    acquire(&mut b, at(60_000), "api", "k", 5);
    let up = b.poll_transmit(at(60_000)).expect("sync");
    let old: Vec<_> = up
        .entries
        .iter()
        .filter(|e| e.counter.window == minute_window(0))
        .map(|e| e.granted_units)
        .collect();
    assert_eq!(old, vec![70]);
    b.handle_sync_down(at(60_000), answer(&up, at(60_000)));
    let up = b.poll_transmit(at(60_250)).expect("sync");
    assert!(
        up.entries.is_empty(),
        "confirmed, and the new window's key is quiet"
    );
}

#[test]
fn epochs_start_above_zero_for_every_counter() {
    // Regression: a release (or pre-issued grant) with epoch 0 on a counter the region held
    // no state for used to apply, while the same on a known counter did not.
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.release_requests = vec![release_req(1, "api", "fresh", minute_window(0), 30, 0)];
    down.grants = vec![grant("api", "next", minute_window(60_000), 5, 0)];
    b.handle_sync_down(at(0), down);
    assert_eq!(allowance(&b, at(0), "api", "fresh"), 100);
    assert_eq!(allowance(&b, at(60_000), "api", "next"), 100);
    let up = b.poll_transmit(at(250)).expect("sync");
    assert_eq!(up.release_acks[0].released_units, 0);
}

#[test]
fn a_counter_the_coordinator_names_is_reported_from_then_on() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // A quiet key: 5 units in 30 s never escalates (5 + 5 = 10 <= 100).
    acquire(&mut b, at(30_000), "api", "k", 5);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    assert!(up.entries.is_empty());
    // The coordinator grants it an allowance: others are interested in it now.
    let mut down = answer(&up, at(30_000));
    down.grants = vec![grant("api", "k", minute_window(0), 120, 1)];
    b.handle_sync_down(at(30_000), down);
    let up = b.poll_transmit(at(30_250)).expect("sync");
    assert_eq!(up.entries.len(), 1);
    assert_eq!(up.entries[0].granted_units, 5);
    // Named, not escalated, 30 s into the window (past the 6 s warm-up): its demand goes too,
    // so the coordinator sees it is low: 5 units in 30.25 s, 0.165 units/s.
    assert_eq!(up.demand.len(), 1);
    assert_eq!(
        (
            up.demand[0].demand_micro_units_per_sec,
            up.demand[0].allowance_units
        ),
        (165_289, 120)
    );
}

#[test]
fn a_followed_counter_reports_no_demand_before_its_window_warms_up() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    // A grant for the next window: the counter is followed from that window on.
    down.grants = vec![grant("api", "k", minute_window(60_000), 120, 1)];
    b.handle_sync_down(at(0), down);
    acquire(&mut b, at(61_000), "api", "k", 5);
    // 1 s into a 60 s window, under the warm-up of 60 / 10 = 6 s: a few units at the start
    // would read as a rate, so the coordinator keeps the forecast it carried over.
    let up = b.poll_transmit(at(61_000)).expect("sync");
    assert_eq!(up.entries.len(), 1);
    assert!(up.demand.is_empty());
    // From 6 s on it does: 5 units over 6 s, 0 units/s in whole units.
    let up = b.poll_transmit(at(66_000)).expect("sync");
    assert_eq!(up.demand.len(), 1);
}

#[test]
fn release_requests_beyond_the_pending_ack_bound_wait_for_a_resend() {
    use crate::budget::config::MAX_PENDING_ACKS;
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    let total = MAX_PENDING_ACKS as u64 + 1;
    let mut id = 0;
    while id < total {
        let up = b.poll_transmit(at(id)).expect("sync");
        let mut down = answer(&up, at(id));
        // Answer with an empty SyncUp's seq only, so no ack is confirmed meanwhile.
        down.reply_to_seq = u64::MAX;
        let batch = (total - id).min(MAX_ITEMS_PER_MESSAGE as u64);
        down.release_requests = (id..id + batch)
            .map(|i| release_req(i + 1, "api", &format!("k{i}"), w, 10, 1))
            .collect();
        b.handle_sync_down(at(id), down);
        id += batch;
    }
    assert_eq!(b.region_stats().release_requests_deferred, 1);
    // The deferred one released nothing.
    let last = format!("k{}", total - 1);
    assert_eq!(allowance(&b, at(0), "api", &last), 100);
    assert_eq!(allowance(&b, at(0), "api", "k0"), 90);
}

#[test]
fn demand_counts_what_gateways_denied_by_themselves() {
    // Default share 100. At 10 s 100 units are admitted and 1 more refused: the gateway then
    // refuses by itself. At 30 s it asks for 10 units (refused too) and says it denied 199
    // more while the agent's denial held: 100 + 1 + 199 + 10 = 310 requested in 30 s is
    // 10.33/s.
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(acquire(&mut b, at(10_000), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(10_000), "api", "k", 1).allowed);
    let req = LeaseRequest {
        denied_units: 199,
        ..lease_req("api", "k", 10, 10)
    };
    assert!(matches!(
        b.lease(at(30_000), req).expect("lease"),
        LeaseOutcome::Denied(_)
    ));
    let up = b.poll_transmit(at(30_000)).expect("sync");
    assert_eq!(up.demand.len(), 1);
    assert_eq!(up.demand[0].demand_micro_units_per_sec, 10_333_333);
}

#[test]
fn units_a_gateway_denied_in_an_earlier_window_are_not_demand_in_this_one() {
    // Regression: a gateway refused by the agent near the end of a window refuses by itself
    // until the window's end, and reports those units with its first request of the next
    // window. Counted there, they read as demand the new window never had.
    // Default share 100. Window 0: 100 admitted at 50 s, 1 refused. At 60.5 s (window 1,
    // nothing refused in it yet) the gateway asks for 10 units and says it denied 150.
    // Window 1's demand: the 10 units over the warm-up floor of 6 s (a tenth of the
    // window) = 1.67/s, not 160 / 6 s = 26.7/s.
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(acquire(&mut b, at(50_000), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(50_000), "api", "k", 1).allowed);
    b.poll_transmit(at(50_000)).expect("sync");
    let req = LeaseRequest {
        denied_units: 150,
        ..lease_req("api", "k", 10, 10)
    };
    assert_eq!(granted(b.lease(at(60_500), req).expect("lease")).units, 10);
    let up = b.poll_transmit(at(60_500)).expect("sync");
    let w1 = minute_window(60_500);
    let d = up
        .demand
        .iter()
        .find(|d| d.counter == counter("api", "k", w1))
        .expect("window 1 escalated: 10 + 10/6 s * 59.5 s > 100");
    assert_eq!(d.demand_micro_units_per_sec, 1_666_666, "10 units / 6 s");
}

#[test]
fn units_a_gateway_holds_but_has_not_spent_are_not_demand_yet() {
    // Default share 1,000. At 30 s a gateway spending 20/s takes a lease of 600 (all it can
    // spend in the 30 s left; projected 600 + 600 * 30 / 30 = 1,200 > 1,000: escalated). At
    // 40 s it has spent about 20 * 10 = 200 of it: demand is 200 / 40 s = 5/s, not
    // 600 / 40 s = 15/s.
    let mut b = budget(vec![per_minute("api", 4_000)]);
    let req = LeaseRequest {
        rate_units_per_sec: Some(20),
        ..lease_req("api", "k", 600, 30)
    };
    assert_eq!(granted(b.lease(at(30_000), req).expect("lease")).units, 600);
    b.poll_transmit(at(30_000)).expect("sync");
    let up = b.poll_transmit(at(40_000)).expect("sync");
    assert_eq!(up.demand[0].demand_micro_units_per_sec, 5_000_000);
}

fn entry_of(region: &str, k: &str, granted_units: u64) -> CounterEntry {
    CounterEntry {
        counter: counter("api", k, minute_window(0)),
        region: RegionId::from(region),
        granted_units,
        refunded_units: 0,
    }
}

fn eventual_budget() -> RegionBudget {
    let mut spec = per_minute("api", 400);
    spec.consistency = Consistency::Eventual;
    budget(vec![spec])
}

#[test]
fn a_region_that_learns_of_a_counter_reports_a_zero_entry_once() {
    // eu never admits on `k`; another region's entry names it. eu tells the coordinator it
    // used 0, so the others count it as heard at 0, not at its default share (D6).
    let mut b = eventual_budget();
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.entries = vec![entry_of("us", "k", 150)];
    b.handle_sync_down(at(10), down);
    let up = b.poll_transmit(at(250)).expect("sync");
    assert_eq!(up.entries, vec![entry_of("eu", "k", 0)]);
    b.handle_sync_down(at(260), answer(&up, at(260)));
    let up = b.poll_transmit(at(500)).expect("sync");
    assert!(up.entries.is_empty(), "confirmed: {up:?}");
}

#[test]
fn a_new_leader_gets_every_confirmed_entry_again() {
    let mut b = eventual_budget();
    assert!(acquire(&mut b, at(0), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(0), "api", "k", 1).allowed); // escalates
    let up = b.poll_transmit(at(0)).expect("sync");
    b.handle_sync_down(at(10), answer(&up, at(10)));
    let up = b.poll_transmit(at(250)).expect("sync");
    assert!(up.entries.is_empty(), "confirmed by leader 1");
    // Leader 2 starts with no counters: its first answer makes the entry unconfirmed again.
    let mut down = answer(&up, at(260));
    down.leader_term = 2;
    b.handle_sync_down(at(260), down);
    let up = b.poll_transmit(at(500)).expect("sync");
    assert_eq!(up.entries, vec![entry_of("eu", "k", 100)]);
    // A late answer of leader 1 confirms nothing: that leader is gone.
    let late = answer(&up, at(510));
    b.handle_sync_down(at(510), late);
    let up = b.poll_transmit(at(750)).expect("sync");
    assert_eq!(up.entries, vec![entry_of("eu", "k", 100)]);
    let mut down = answer(&up, at(760));
    down.leader_term = 2;
    b.handle_sync_down(at(760), down);
    assert!(b.poll_transmit(at(1_000)).expect("sync").entries.is_empty());
}

#[test]
fn a_region_recovers_its_own_entries_from_an_answer_by_max() {
    // A start from an older copy of the state: the coordinator holds more than the store.
    let mut b = eventual_budget();
    assert!(acquire(&mut b, at(0), "api", "k", 30).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.entries = vec![entry_of("eu", "k", 80), entry_of("us", "k", 0)];
    b.handle_sync_down(at(10), down);
    assert_eq!(net(&b, "api", "k"), 80);
    // An older copy at the coordinator never lowers what the region counts.
    let up = b.poll_transmit(at(250)).expect("sync");
    let mut down = answer(&up, at(260));
    down.entries = vec![entry_of("eu", "k", 20)];
    b.handle_sync_down(at(260), down);
    assert_eq!(net(&b, "api", "k"), 80);
}

#[test]
fn a_confirmed_sync_whose_answer_left_the_counter_out_does_not_make_the_view_trusted() {
    // The answer confirms the SyncUp that carried `k` but had no room for `k`'s entries
    // (the coordinator answers a counter whole or not at all): `us` may have spent 300 and
    // eu must not take it as "never reported" (its default share, 100).
    let mut b = eventual_budget();
    assert!(acquire(&mut b, at(0), "api", "k", 100).allowed);
    assert!(!acquire(&mut b, at(0), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    b.handle_sync_down(at(10), answer(&up, at(10)));
    assert_eq!(
        allowance(&b, at(10), "api", "k"),
        100,
        "the default share only"
    );
    // The next answer carries the counter: us spent 300, so nothing is left for eu.
    let up = b.poll_transmit(at(250)).expect("sync");
    let mut down = answer(&up, at(260));
    down.entries = vec![
        entry_of("eu", "k", 100),
        entry_of("us", "k", 300),
        entry_of("ap", "k", 0),
        entry_of("sa", "k", 0),
    ];
    b.handle_sync_down(at(260), down);
    assert_eq!(allowance(&b, at(260), "api", "k"), 100);
    assert!(!acquire(&mut b, at(260), "api", "k", 1).allowed);
}

#[test]
fn a_counter_whose_entries_answers_leave_out_past_the_view_ttl_holds_at_its_use() {
    // More counters than one answer holds: answers keep coming (the view is fresh) but leave
    // `k` out. Its view dates from its last entries: past `view_ttl` (2 s) it is too old to
    // use, so eu admits no more on `k` until its entries come again.
    let mut b = eventual_region_with_view(&[("us", 50, 0), ("ap", 0, 0), ("sa", 0, 0)]);
    assert_eq!(allowance(&b, at(10), "api", "k"), 350);
    for t in [250, 500, 750, 1_000, 1_250, 1_500, 1_750, 2_000, 2_250] {
        let up = b.poll_transmit(at(t)).expect("sync");
        b.handle_sync_down(at(t + 10), answer(&up, at(t + 10)));
    }
    assert_eq!(allowance(&b, at(2_260), "api", "k"), 100, "held at its use");
    assert!(!acquire(&mut b, at(2_260), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(2_500)).expect("sync");
    let mut down = answer(&up, at(2_510));
    down.entries = vec![
        entry_of("us", "k", 60),
        entry_of("ap", "k", 0),
        entry_of("sa", "k", 0),
    ];
    b.handle_sync_down(at(2_510), down);
    assert_eq!(allowance(&b, at(2_510), "api", "k"), 340);
}

#[test]
fn a_slow_key_of_a_day_window_still_reports_its_demand() {
    // Regression: demand travelled in whole units per second, so a key of a day window asked
    // for under one unit a second reported 0 and never grew, however far past its allowance it
    // was asked (a real three-region cluster stopped rebalancing after 11:06 UTC each day).
    // 100,000 a day over four regions: 25,000 each. At 22:00 UTC (`T0_MS`) the region has
    // admitted its 25,000 and been refused 10,000: 35,000 units in 79,200 s = 0.4419/s.
    let day = LimitSpec::simple("api", 100_000, Duration::from_secs(86_400));
    let mut b = budget(vec![day]);
    assert!(acquire(&mut b, at(0), "api", "k", 25_000).allowed);
    assert!(!acquire(&mut b, at(0), "api", "k", 10_000).allowed);
    let up = b.poll_transmit(at(0)).expect("sync");
    assert_eq!(up.demand.len(), 1, "refused: escalated");
    assert_eq!(up.demand[0].demand_micro_units_per_sec, 441_919);
    assert_eq!(up.demand[0].allowance_units, 25_000);
}

/// The clock sample a SyncUp carries names the term of the answer it was measured with: a
/// new leader's clock is another node's, and it must know which clock the sample describes.
#[test]
fn a_clock_sample_names_the_leader_whose_answer_measured_it() {
    let mut b = eventual_budget();
    let up = b.poll_transmit(at(0)).expect("sync");
    assert_eq!((up.clock, up.clock_leader_term), (None, 0));
    b.handle_sync_down(at(10), answer(&up, at(10)));
    let up = b.poll_transmit(at(250)).expect("sync");
    assert!(up.clock.is_some());
    assert_eq!(up.clock_leader_term, 1);
    let mut down = answer(&up, at(260));
    down.leader_term = 2;
    b.handle_sync_down(at(260), down);
    let up = b.poll_transmit(at(500)).expect("sync");
    assert_eq!(up.clock_leader_term, 2);
    // A late answer of leader 1 measured leader 1's clock: the sample says so.
    b.handle_sync_down(at(510), answer(&up, at(510)));
    let up = b.poll_transmit(at(750)).expect("sync");
    assert_eq!(up.clock_leader_term, 1);
}
