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
fn strict_admissions_keep_clear_of_both_edges_of_their_window() {
    let mut b = budget(vec![per_minute("api", 400)]);
    guarded(&mut b, BAND);
    let d = acquire(&mut b, at(10), "api", "k", 1);
    assert!(!d.allowed, "within 30 ms after the window's start");
    assert_eq!(d.reason, Reason::Allowance);
    assert_eq!(d.retry_after, Some(Duration::from_millis(20)));
    assert!(acquire(&mut b, at(30), "api", "k", 1).allowed);
    let d = acquire(&mut b, at(59_970), "api", "k", 1);
    assert!(!d.allowed, "within 30 ms before the window's end");
    assert_eq!(
        d.retry_after,
        Some(Duration::from_millis(60)),
        "until 30 ms into the next window"
    );
    assert!(acquire(&mut b, at(59_969), "api", "k", 1).allowed);
    assert_eq!(net(&b, "api", "k"), 2, "refusals charge nothing");
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
    let mut again = Timebase::restarted(Duration::from_millis(250), Some(tb.correction()));
    assert_eq!(again.read(at(12_040)), before, "not back to the estimate");
    assert_eq!(
        again.read(at(14_100)),
        at(12_100),
        "and on the estimate after it"
    );
    // Its round trips are not taken while it runs slow, as before the restart.
    let mut slow = Timebase::restarted(Duration::from_millis(250), Some(tb.correction()));
    assert!(!slow.on_sample(at(12_100), at(11_000), sample));
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
