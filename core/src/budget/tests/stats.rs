//! What the region measures for the bound, and how it reaches the coordinator: reported until
//! confirmed, persisted across a restart, late settles included.

use std::time::Duration;

use super::*;
use crate::budget::ReservationDelta;
use crate::budget::persist::PersistRecord;
use crate::error::Error;
use crate::limit::{PartitionPolicy, RateCap};
use crate::sync::{BoundFigures, LimitWindowStats};

fn figures_in(up: &SyncUp, window: WindowIndex) -> Option<BoundFigures> {
    up.stats
        .iter()
        .find(|s| s.limit == lim("api") && s.window == window)
        .map(|s| s.figures)
}

#[test]
fn the_peak_grant_rate_is_the_busiest_second_of_the_window() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    // Second 0: 10 + 20 units on two keys; second 1: 5; second 2: 25 (not yet over).
    acquire(&mut b, at(100), "api", "a", 10);
    acquire(&mut b, at(900), "api", "b", 20);
    acquire(&mut b, at(1_500), "api", "a", 5);
    acquire(&mut b, at(2_000), "api", "b", 25);
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.peak_grant_units_per_sec, 30);
    // A refused request grants nothing: key a's default share is 100, 15 used, 86 refused.
    assert!(!acquire(&mut b, at(2_100), "api", "a", 86).allowed);
    acquire(&mut b, at(2_200), "api", "a", 8);
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.peak_grant_units_per_sec, 33, "25 + 8 in second 2");
}

/// Admissions a gateway reported that no lease could be charged with reach the coordinator
/// in the window of their report, which it then states unbounded; an unknown limit counts
/// nowhere, and nothing is charged to the key.
#[test]
fn uncharged_admissions_are_reported_in_the_window_of_their_report() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    b.record_uncharged(at(61_000), &lim("api"), 3);
    b.record_uncharged(at(62_000), &lim("api"), 4);
    b.record_uncharged(at(62_000), &lim("gone"), 5);
    b.record_uncharged(at(62_000), &lim("api"), 0);
    let up = b.poll_transmit(at(62_250)).expect("sync");
    let figures =
        figures_in(&up, minute_window(61_000)).expect("the figures of the window of 61 s");
    assert_eq!(figures.uncharged_units, 7);
    assert_eq!(figures_in(&up, minute_window(0)), None);
    let view = b
        .key_view(at(62_250), &lim("api"), &KeyId::from("k"))
        .expect("view");
    assert_eq!(view.granted_units, 0, "charged to no key");
}

#[test]
fn figures_are_reported_until_an_answer_confirms_them() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let w = minute_window(0);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    b.settle(at(100), g.lease, 70, None).expect("settle");
    let expect = BoundFigures {
        settle_overage_units: 20,
        peak_grant_units_per_sec: 50,
        ..BoundFigures::default()
    };
    // Lost: the next SyncUp carries the same figures again.
    let lost = b.poll_transmit(at(250)).expect("sync");
    assert_eq!(figures_in(&lost, w), Some(expect));
    let up = b.poll_transmit(at(500)).expect("sync");
    assert_eq!(figures_in(&up, w), Some(expect));
    b.handle_sync_down(at(520), answer(&up, at(510)));
    let quiet = b.poll_transmit(at(750)).expect("sync");
    assert_eq!(
        figures_in(&quiet, w),
        None,
        "confirmed, unchanged: not sent"
    );
    // One more unit at 0.8 s: second 0 has granted 51 (the 20 settled above the lease are
    // overage, not a grant). A late answer to the lost SyncUp confirms only what it carried.
    acquire(&mut b, at(800), "api", "k", 1);
    b.handle_sync_down(at(900), answer(&lost, at(890)));
    let up = b.poll_transmit(at(1_000)).expect("sync");
    let expect = BoundFigures {
        peak_grant_units_per_sec: 51,
        ..expect
    };
    assert_eq!(figures_in(&up, w), Some(expect));
}

#[test]
fn time_open_is_accounted_up_to_the_syncup_that_reports_it() {
    let mut spec = per_minute_settling("api", 400, 100);
    spec.partition_policy = PartitionPolicy::Open {
        rate: RateCap {
            units: 10,
            per: Duration::from_secs(1),
            burst: 10,
        },
    };
    let mut b = budget(vec![spec]);
    round_trip(&mut b, at(0));
    // Contact at 0 and view_ttl 2 s: open from 2 s. SyncUps at 250 ms, 500 ms, ... go
    // unanswered; the one sent at 5 s reports 3 s open.
    let mut up = None;
    let mut t = 250;
    while t <= 5_000 {
        b.handle_timeout(at(t));
        if let Some(u) = b.poll_transmit(at(t)) {
            up = Some(u);
        }
        t += 250;
    }
    let up = up.expect("a sync at 5 s");
    assert_eq!(up.sent_at, at(5_000));
    let f = figures_in(&up, minute_window(0)).expect("figures");
    assert_eq!(f.time_open, Duration::from_secs(3));
}

#[test]
fn summed_figures_survive_a_restart_and_the_peak_starts_again() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let mut log = Vec::new();
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    b.settle(at(100), g.lease, 80, None).expect("settle");
    log.extend(b.drain_dirty());
    assert!(
        log.iter()
            .any(|r| matches!(r, PersistRecord::Stats(s) if s.settle_overage_units == 30)),
        "the overage is written before the answer"
    );
    let mut r = RegionBudget::restore(cfg(), vec![per_minute_settling("api", 400, 100)], log)
        .expect("restore");
    let w = r
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("restored stats");
    assert_eq!(w.settle_overage_units, 30);
    assert_eq!(w.peak_grant_units_per_sec, 0);
    // Reported again after the restart (the coordinator merges by max).
    let up = r.poll_transmit(at(1_000)).expect("sync");
    assert_eq!(
        figures_in(&up, minute_window(0)).map(|f| f.settle_overage_units),
        Some(30)
    );
}

/// Units used and charged nowhere make the coordinator state their window unbounded: a
/// region that restarts before its next SyncUp must still report them, or that window would
/// read as bounded. From the drained log and from a snapshot alike.
#[test]
fn clamped_settles_and_uncharged_admissions_survive_a_restart() {
    let spec = || vec![per_minute_settling("api", 400, 10)];
    let mut b = budget(spec());
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    // A cap of 10% of 50: 5 charged above the lease, 15 clamped.
    b.settle(at(100), g.lease, 70, None).expect("settle");
    b.record_uncharged(at(200), &lim("api"), 4);
    let log = b.drain_dirty();
    assert!(
        log.iter().any(|r| matches!(
            r,
            PersistRecord::StatsUncharged {
                settle_clamped_units: 15,
                uncharged_units: 4,
                ..
            }
        )),
        "written before the answers: {log:?}"
    );
    for restored in [
        RegionBudget::restore(cfg(), spec(), log).expect("restore"),
        RegionBudget::restore(cfg(), spec(), b.snapshot()).expect("restore"),
    ] {
        let mut r = restored;
        let up = r.poll_transmit(at(1_000)).expect("sync");
        let f = figures_in(&up, minute_window(0)).expect("figures");
        assert_eq!(
            (
                f.settle_overage_units,
                f.settle_clamped_units,
                f.uncharged_units
            ),
            (5, 15, 4)
        );
    }
}

#[test]
fn windows_dropped_from_the_stats_are_erased_from_the_store() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let mut log = Vec::new();
    for minute in 0..6u64 {
        let t = minute * 60_000;
        let g = granted(
            b.lease(at(t), lease_req("api", "k", 10, 30))
                .expect("lease"),
        );
        b.settle(at(t + 1), g.lease, 11, None).expect("settle");
        log.extend(b.drain_dirty());
    }
    let r = RegionBudget::restore(cfg(), vec![per_minute_settling("api", 400, 100)], log)
        .expect("restore");
    assert_eq!(r.snapshot(), b.snapshot());
    let kept: Vec<WindowIndex> = r
        .stats(&lim("api"))
        .expect("stats")
        .windows()
        .map(|(w, _)| w)
        .collect();
    assert_eq!(
        kept,
        (2..6)
            .map(|m| minute_window(m * 60_000))
            .collect::<Vec<_>>()
    );
}

fn overage(units: u64) -> ReservationDelta {
    ReservationDelta::Overage { units }
}

fn refund(units: u64) -> ReservationDelta {
    ReservationDelta::Refund { units }
}

#[test]
fn a_late_settle_within_the_window_moves_the_counter() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    // The gateway spent 40 of 50 (one reservation of 40), gave 10 back, then the reservation
    // settled at 25: 15 come back. Another reservation of the same lease used 12 more.
    b.release(at(1_000), g.lease, 10, None).expect("release");
    let out = b
        .settle_reservation(at(2_000), g.lease, refund(15), None)
        .expect("late refund");
    assert_eq!(out.refunded_units, 15);
    assert_eq!(net(&b, "api", "k"), 25);
    let out = b
        .settle_reservation(at(2_000), g.lease, overage(12), None)
        .expect("late overage");
    assert_eq!(out.overage_units, 12);
    assert_eq!(net(&b, "api", "k"), 37);
    let w = b
        .stats(&lim("api"))
        .and_then(|s| s.window(minute_window(0)))
        .cloned()
        .expect("stats");
    assert_eq!(w.settle_overage_units, 12);
    // 50 - 10 - 15 = 25 units of the lease are still charged: no more can come back.
    assert!(matches!(
        b.settle_reservation(at(2_000), g.lease, refund(26), None),
        Err(Error::InvalidRequest(_))
    ));
}

#[test]
fn a_late_settle_after_the_window_changes_no_counter_but_an_overage_counts_for_the_bound() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let g = granted(
        b.lease(at(59_000), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    b.handle_timeout(at(60_000));
    assert_eq!(b.lease_count(), 0, "the lease ended with its window");
    acquire(&mut b, at(61_000), "api", "k", 5);
    let out = b
        .settle_reservation(at(62_000), g.lease, refund(20), None)
        .expect("late refund");
    assert_eq!(
        out.refunded_units, 0,
        "the window is over: the units stay spent"
    );
    b.settle_reservation(at(62_000), g.lease, overage(7), None)
        .expect("late overage");
    assert_eq!(
        net(&b, "api", "k"),
        5,
        "the new window's counter is untouched"
    );
    let stats = b.stats(&lim("api")).expect("stats");
    let old = stats.window(minute_window(0)).expect("old window kept");
    assert_eq!(old.settle_overage_units, 7);
    let up = b.poll_transmit(at(62_000)).expect("sync");
    assert!(up.stats.contains(&LimitWindowStats {
        limit: lim("api"),
        window: minute_window(0),
        figures: BoundFigures {
            settle_overage_units: 7,
            peak_grant_units_per_sec: 50,
            ..BoundFigures::default()
        },
    }));
}

#[test]
fn a_late_settle_for_a_lease_the_agent_still_holds_shrinks_it() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    b.settle_reservation(at(1_000), g.lease, refund(30), None)
        .expect("late refund");
    assert_eq!(net(&b, "api", "k"), 20);
    // The lease now holds 20: giving back more than that is refused.
    assert!(matches!(
        b.release(at(1_000), g.lease, 21, None),
        Err(Error::InvalidRequest(_))
    ));
    b.release(at(1_000), g.lease, 20, None).expect("release");
    assert_eq!(net(&b, "api", "k"), 0);
}

#[test]
fn a_late_settle_for_an_unknown_lease_is_refused() {
    let mut b = budget(vec![per_minute_settling("api", 400, 100)]);
    assert!(matches!(
        b.settle_reservation(at(0), crate::ids::LeaseId(77), overage(1), None),
        Err(Error::UnknownLease(_))
    ));
}
