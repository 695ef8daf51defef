//! The edge band a timebase asks for (docs/budget.md, edge band; D22).

use std::time::Duration;

use super::*;
use crate::budget::{ClockCorrection, ClockGuard, PersistRecord, Reason, RestoreStart, Timebase};
use crate::limit::{Consistency, PartitionPolicy};

const BAND: Duration = Duration::from_millis(30);

fn guarded(b: &mut RegionBudget, band: Duration) {
    let guard = ClockGuard {
        since: at(0),
        max_uncertainty: Duration::from_millis(250),
    };
    b.set_clock_guard(Some(band), Some(guard));
}

#[test]
fn a_key_with_no_state_of_the_window_before_is_refused_in_its_start_band() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    let d = acquire(&mut b, at(10), "api", "k", 1);
    assert!(!d.allowed, "within 30 ms after the window's start");
    assert_eq!(d.reason, Reason::Allowance);
    assert_eq!(d.retry_after, Some(Duration::from_millis(20)));
    assert!(acquire(&mut b, at(30), "api", "k", 1).allowed);
    assert_eq!(net(&b, "api", "k"), 1, "refusals charge nothing");
}

/// Units admitted within `e` of a window's end may be in the next window on the coordinator's
/// clock: they count against both, and the next window's counter starts at them. Refusing them
/// instead cost every busy key `2e` of each window (flash-crowd's utilization median 0.981
/// against the static split's 1.000).
#[test]
fn the_end_band_counts_its_units_against_the_next_window_too() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    // The default share is 100 a window.
    assert!(acquire(&mut b, at(59_975), "api", "k", 70).allowed);
    let d = acquire(&mut b, at(59_980), "api", "k", 31);
    assert!(!d.allowed, "the next window has 30 left");
    assert_eq!(d.retry_after, Some(Duration::from_millis(50)));
    assert!(acquire(&mut b, at(59_980), "api", "k", 30).allowed);
    assert!(!acquire(&mut b, at(60_100), "api", "k", 1).allowed);
    assert_eq!(
        net(&b, "api", "k"),
        100,
        "the next window starts at the carried units"
    );
}

#[test]
fn the_start_band_counts_its_units_against_the_window_before() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    granted(
        b.lease(at(30_000), lease_req("api", "k", 95, 10))
            .expect("lease"),
    );
    let d = acquire(&mut b, at(60_010), "api", "k", 6);
    assert!(!d.allowed, "the window before has 5 left");
    assert!(acquire(&mut b, at(60_010), "api", "k", 5).allowed);
    let d = acquire(&mut b, at(60_020), "api", "k", 1);
    assert!(!d.allowed, "and nothing now");
    assert_eq!(d.retry_after, Some(Duration::from_millis(10)));
    assert!(acquire(&mut b, at(60_030), "api", "k", 1).allowed);
    assert_eq!(net(&b, "api", "k"), 6);
}

#[test]
fn a_lease_granted_in_the_end_band_lasts_to_the_windows_end_and_is_never_refilled_there() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    let g = granted(
        b.lease(at(59_960), lease_req("api", "k", 10, 30))
            .expect("lease"),
    );
    assert_eq!(g.expires_at, at(59_970), "before the band: its guarded end");
    let g = granted(
        b.lease(at(59_975), lease_req("api", "k", 10, 30))
            .expect("lease"),
    );
    assert_eq!(g.expires_at, at(60_000), "in the band: the window's end");
    // The refill of a lease in the band is a lease of its own: the live one may hold units the
    // next window does not count.
    let t = granted(
        b.top_up(at(59_965), g.lease, lease_req("api", "k", 5, 30))
            .expect("refill"),
    );
    assert_eq!(
        t.lease, g.lease,
        "before the band a refill tops the lease up"
    );
    let t = granted(
        b.top_up(at(59_985), g.lease, lease_req("api", "k", 5, 30))
            .expect("refill"),
    );
    assert_ne!(t.lease, g.lease);
    assert_eq!(t.expires_at, at(60_000));
}

#[test]
fn a_release_for_the_next_window_keeps_what_the_end_band_carried_into_it() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    assert!(acquire(&mut b, at(59_975), "api", "k", 60).allowed);
    let up = b.poll_transmit(at(59_976)).expect("a sync is due");
    let mut down = answer(&up, at(59_976));
    down.release_requests = vec![release_req(1, "api", "k", minute_window(60_000), 100, 1)];
    b.handle_sync_down(at(59_977), down);
    let up = b.poll_transmit(at(60_230)).expect("a sync is due");
    let ack = up.release_acks.first().expect("an ack");
    assert_eq!(ack.released_units, 40);
    assert_eq!(ack.allowance_after_units, 60);
}

#[test]
fn what_the_end_band_carried_survives_a_restart() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    assert!(acquire(&mut b, at(59_975), "api", "k", 70).allowed);
    let records = b.drain_dirty();
    for records in [records, b.snapshot()] {
        let mut r =
            RegionBudget::restore(cfg(), vec![per_minute("api", 400)], records).expect("restore");
        guarded(&mut r, BAND);
        assert!(!acquire(&mut r, at(60_100), "api", "k", 31).allowed);
        assert!(acquire(&mut r, at(60_100), "api", "k", 30).allowed);
    }
}

/// A lost copy's end band may have counted units against the window after its last, which a
/// start from an older store does not know of: that window closes too.
#[test]
fn a_restored_start_within_the_widest_band_of_a_windows_end_closes_the_next_window() {
    let cfg = BudgetConfig {
        max_edge_band: Some(Duration::from_millis(250)),
        ..cfg()
    };
    let mut b = RegionBudget::new(cfg, vec![per_minute("api", 400)]).expect("budget");
    b.start_restored(at(59_800), RestoreStart::Declared);
    let up = b.poll_transmit(at(59_800)).expect("sync");
    b.handle_sync_down(at(59_810), answer(&up, at(59_810)));
    assert!(!acquire(&mut b, at(60_500), "api", "k", 1).allowed);
    assert!(acquire(&mut b, at(120_500), "api", "k", 1).allowed);
}

#[test]
fn a_lease_ends_the_band_before_its_windows_end_and_so_does_a_renewal() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    let g = granted(
        b.lease(at(59_000), lease_req("api", "k", 10, 30))
            .expect("lease"),
    );
    assert_eq!(g.expires_at, at(59_970));
    let r = b
        .renew(at(59_500), g.lease, Duration::from_secs(30), None)
        .expect("renew");
    assert_eq!(r.expires_at, at(59_970));
}

#[test]
fn past_its_maximum_uncertainty_a_guarded_region_admits_nothing_strict() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, Duration::MAX);
    let d = acquire(&mut b, at(30_000), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Some(cfg().sync_interval));
}

/// A region with nothing left to admit is refused in the band for the allowance's own reason.
/// The agent's negative cache keeps a refusal with nothing remaining until the window's end,
/// so a band refusal labelled `allowance` hid a closed partition for the whole window: over a
/// real network (tests/partition_netns.rs) a cut-off region's closed limit answered 380 of 380
/// refusals `allowance` and none `partition_closed`, while its `/v1/keys` said
/// `partition_closed`.
#[test]
fn in_the_band_a_region_with_nothing_left_is_refused_for_its_own_reason() {
    let mut spec = per_minute("api", 400);
    spec.partition_policy = PartitionPolicy::Closed;
    let mut b = budget(vec![spec]);
    round_trip(&mut b, at(0));
    guarded(&mut b, BAND);
    // Contact at 0 and view_ttl 2 s: expired in the next window, whose band this is.
    let d = acquire(&mut b, at(60_010), "api", "k", 1);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::PartitionClosed);
}

#[test]
fn eventual_limits_and_a_region_without_a_timebase_keep_no_band() {
    let eventual = LimitSpec {
        consistency: Consistency::Eventual,
        ..per_minute("ev", 400)
    };
    let mut b = budget(vec![per_minute("api", 400), eventual]);
    assert!(
        acquire(&mut b, at(10), "api", "k", 1).allowed,
        "no timebase"
    );
    guarded(&mut b, BAND);
    assert!(acquire(&mut b, at(10), "ev", "k", 1).allowed);
}

#[test]
fn syncups_carry_the_guard_and_the_round_trip_feeds_the_timebase() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let mut tb = Timebase::new(Duration::from_millis(250));
    let up = b.poll_transmit(at(1_000)).expect("a sync is due");
    assert_eq!(up.clock_guard, None);
    // The coordinator's clock is 2 s ahead; 10 ms each way.
    let mut down = answer(&up, at(3_010));
    down.sent_at = at(3_010);
    b.handle_sync_down(at(1_020), down);
    let (sent_at, sample) = b.clock_round_trip().expect("a round trip");
    assert_eq!(sent_at, at(1_000));
    assert!(tb.on_sample(at(1_020), sent_at, sample));
    assert_eq!(tb.read(at(1_020)), at(3_020));
    let band = tb.band(at(1_020));
    b.set_clock_guard(band, tb.guard());
    let up = b.poll_transmit(at(3_300)).expect("a sync is due");
    assert_eq!(up.clock_guard.map(|g| g.since), Some(at(3_020)));
}

#[test]
fn the_correction_is_kept_with_the_durable_state() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert_eq!(b.clock_correction(), None);
    let c = ClockCorrection {
        correction_nanos: -1_500_000_000,
        slowed_from: Some((at(2_000), at(3_500))),
    };
    b.set_clock_correction(c);
    let records = b.drain_dirty();
    assert!(records.contains(&PersistRecord::ClockCorrection(c)));
    let r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], records).expect("restore");
    assert_eq!(r.clock_correction(), Some(c));
    let r =
        RegionBudget::restore(cfg(), vec![per_minute("api", 400)], b.snapshot()).expect("restore");
    assert_eq!(r.clock_correction(), Some(c), "in a snapshot too");
    b.set_clock_correction(c);
    assert!(b.drain_dirty().is_empty(), "unchanged: nothing to write");
}

#[test]
fn a_restarted_timebase_reads_on_as_the_one_it_stored_did() {
    let mut tb = Timebase::new(Duration::from_millis(250));
    tb.read(at(10_000));
    // 2 s ahead: the clock runs slow from 10,040.
    let sample = crate::sync::ClockSample {
        offset_nanos: -2_000_000_000,
        round_trip_nanos: 40_000_000,
    };
    assert!(tb.on_sample(at(10_040), at(10_000), sample));
    let before = tb.read(at(12_040));
    let mut again = Timebase::restarted(
        Duration::from_millis(250),
        Some(tb.correction()),
        Timestamp::ZERO,
        at(12_040),
    );
    assert_eq!(again.read(at(12_040)), before, "not back to the estimate");
    assert_eq!(
        again.read(at(14_100)),
        at(12_100),
        "and on the estimate after it"
    );
    // Its round trips are not taken while it runs slow, as before the restart.
    let mut slow = Timebase::restarted(
        Duration::from_millis(250),
        Some(tb.correction()),
        Timestamp::ZERO,
        at(12_100),
    );
    assert!(!slow.on_sample(at(12_100), at(11_000), sample));
}

/// What the store holds was done by the latest time a batch carried: a restart reads on from
/// it, whatever the clock reads (swarm seed 3367850: a region down while its clock stepped
/// 9 s back came back into a window whose counter it had dropped, and counted it from zero).
#[test]
fn the_time_of_the_latest_change_is_kept_with_the_state() {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert_eq!(b.time_floor(), Timestamp::ZERO);
    assert!(acquire(&mut b, at(61_000), "api", "k", 1).allowed);
    let mut records = b.drain_dirty();
    assert!(records.contains(&PersistRecord::TimeSeen { at: at(61_000) }));
    // A call that changes nothing writes nothing, its time included.
    b.handle_timeout(at(62_000));
    assert!(b.drain_dirty().is_empty());
    assert!(acquire(&mut b, at(63_000), "api", "k", 1).allowed);
    records.extend(b.drain_dirty());
    let r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], records).expect("restore");
    assert_eq!(r.time_floor(), at(63_000));
    let r =
        RegionBudget::restore(cfg(), vec![per_minute("api", 400)], b.snapshot()).expect("restore");
    assert_eq!(r.time_floor(), at(63_000), "in a snapshot too");
}

#[test]
fn a_restart_on_a_clock_stepped_back_reads_on_from_the_stored_time() {
    let u = Duration::from_millis(250);
    let stored = ClockCorrection {
        correction_nanos: 1_000_000_000,
        slowed_from: None,
    };
    // The store was written at 61 s on the corrected clock; the local clock reads 50 s.
    let mut tb = Timebase::restarted(u, Some(stored), at(61_000), at(50_000));
    assert_eq!(tb.read(at(50_000)), at(61_000), "not back to 51 s");
    assert_eq!(
        tb.read(at(52_000)),
        at(63_000),
        "and on at the clock's rate"
    );
    assert_eq!(tb.correction().correction_nanos, 11_000_000_000);
    // A clock ahead of the floor reads on the stored correction alone.
    let mut ahead = Timebase::restarted(u, Some(stored), at(61_000), at(70_000));
    assert_eq!(ahead.read(at(70_000)), at(71_000));
    // A slowed run restored behind the floor holds at the floor until it passes it.
    let slowed = ClockCorrection {
        correction_nanos: -4_000_000_000,
        slowed_from: Some((at(40_000), at(44_000))),
    };
    let mut slow = Timebase::restarted(u, Some(slowed), at(61_000), at(50_000));
    assert_eq!(slow.read(at(50_000)), at(61_000));
    assert!(slow.read(at(50_500)) >= at(61_000), "never back");
    assert!(slow.read(at(60_000)) > at(61_000), "and on");
}

#[test]
fn a_restored_start_dated_on_the_raw_clock_moves_to_the_corrected_one() {
    let mut b = budget(vec![per_minute("api", 400)]);
    // Dated on a raw clock 31 s behind the corrected one the lost copy ran on.
    b.start_restored(at(30_000), RestoreStart::Declared);
    let up = b.poll_transmit(at(30_100)).expect("sync");
    b.handle_sync_down(at(30_100), answer(&up, at(30_100)));
    b.drain_dirty();
    // The first sample dates the start at 61 s: window 1 (60 s to 120 s) began before it.
    b.restore_started_no_earlier_than(at(61_000));
    assert!(
        b.drain_dirty()
            .contains(&PersistRecord::RestoredBefore { before: at(61_000) })
    );
    assert!(!acquire(&mut b, at(61_500), "api", "k", 1).allowed);
    b.drain_dirty();
    b.restore_started_no_earlier_than(at(1_000));
    assert!(b.drain_dirty().is_empty(), "never earlier");
    assert!(acquire(&mut b, at(120_000), "api", "k", 1).allowed);
}

/// Carried units start the next window's counter but were requested in the window before: read
/// as the next window's demand (over its short elapsed time, early on) they pulled allowance
/// toward every region with a carry (clock-skew's utilization median 0.987 to 0.957).
#[test]
fn carried_units_are_the_next_windows_use_but_not_its_demand() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    assert!(!acquire(&mut b, at(30_000), "api", "k", 200).allowed);
    assert!(acquire(&mut b, at(59_975), "api", "k", 60).allowed);
    b.poll_transmit(at(59_976)).expect("sync");
    assert!(acquire(&mut b, at(90_000), "api", "k", 30).allowed);
    let up = b.poll_transmit(at(90_000)).expect("sync");
    let w = minute_window(60_000);
    let entry = up.entries.iter().find(|e| e.counter.window == w);
    assert_eq!(
        entry.map(|e| e.granted_units),
        Some(90),
        "use: carried and new"
    );
    let demand = up.demand.iter().find(|d| d.counter.window == w);
    assert_eq!(
        demand.map(|d| d.demand_micro_units_per_sec),
        Some(1_000_000),
        "30 units in 30 s"
    );
}
