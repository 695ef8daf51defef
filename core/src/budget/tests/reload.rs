//! Configuration reload: what a region keeps and drops, and the configuration version check.

use super::*;
use crate::budget::persist::PersistRecord;
use crate::limit::{Consistency, PartitionPolicy};

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

/// From version 1 to 3 with the allocation the same on both: the table may have dropped its
/// rows at version 2, which the region never saw, so the grant of 250 is held at the default
/// share (100), below its use: nothing more is admitted. From one version to the next it is
/// kept. Nothing used is forgotten.
#[test]
fn a_region_that_skips_a_version_holds_its_grants_at_the_default_share() {
    let mut b = granted_and_used(per_minute("api", 400));
    b.set_config_version(1);
    b.set_config_version(2);
    assert_eq!(
        allowance(&b, at(1_000), "api", "k"),
        250,
        "the next version"
    );
    b.set_config_version(4);
    assert_eq!(
        allowance(&b, at(1_000), "api", "k"),
        100,
        "the default share"
    );
    assert_eq!(net(&b, "api", "k"), 200);
    assert!(!acquire(&mut b, at(1_000), "api", "k", 1).allowed);
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

/// Restarts under `limits` from everything `b` wrote.
fn restart_under(
    b: &mut RegionBudget,
    log: &mut Vec<PersistRecord>,
    limits: Vec<LimitSpec>,
) -> RegionBudget {
    log.extend(b.drain_dirty());
    RegionBudget::restore(cfg(), limits, log.clone()).expect("restore")
}

#[test]
fn a_region_started_under_another_allocation_drops_its_stored_grants() {
    let mut log = Vec::new();
    let mut b = granted_and_used(per_minute("api", 400));
    // The reload came while the region was down: it starts under the new quota.
    let r = restart_under(&mut b, &mut log, vec![per_minute("api", 200)]);
    assert_eq!(net(&r, "api", "k"), 200, "admitted units stay counted");
    assert_eq!(allowance(&r, at(1_000), "api", "k"), 50, "the new default");
    // Under the same parameters the grant stays.
    let r =
        RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log.clone()).expect("restore");
    assert_eq!(allowance(&r, at(1_000), "api", "k"), 250);
}

/// Swarm seed 3187824: down across two reloads (version 2 changed the allocation, version 3
/// put version 1's back), a region restarts under version 3 with the parameters its grants
/// were made under. The table dropped its rows at both versions, so the grant is held at the
/// default share, as it is when a live region skips a version. Restarted under the version it
/// stored, or the next one, it keeps the grant.
#[test]
fn a_region_restarted_across_a_version_it_never_saw_holds_its_grants_at_the_default_share() {
    let mut log = Vec::new();
    let mut b = granted_and_used(per_minute("api", 400));
    b.set_config_version(1);
    let mut r = restart_under(&mut b, &mut log, vec![per_minute("api", 400)]);
    r.set_config_version(3);
    assert_eq!(
        allowance(&r, at(1_000), "api", "k"),
        100,
        "the default share"
    );
    assert_eq!(net(&r, "api", "k"), 200, "nothing used is forgotten");
    assert!(!acquire(&mut r, at(1_000), "api", "k", 1).allowed);
    for version in [1, 2] {
        let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log.clone())
            .expect("restore");
        r.set_config_version(version);
        assert_eq!(
            allowance(&r, at(1_000), "api", "k"),
            250,
            "version {version}"
        );
    }
}

/// The version stored is the one in force when the state was written, and a snapshot carries
/// it: a restart that skips after a compaction is told from one that does not.
#[test]
fn the_configuration_version_is_stored_with_the_state_and_in_snapshots() {
    let mut b = granted_and_used(per_minute("api", 400));
    b.set_config_version(1);
    b.set_config_version(2);
    let log = b.drain_dirty();
    assert!(log.contains(&PersistRecord::ConfigVersion { version: 2 }));
    assert!(
        !log.contains(&PersistRecord::ConfigVersion { version: 1 }),
        "one record, the latest"
    );
    assert!(b.drain_dirty().is_empty(), "written once");
    b.set_config_version(2);
    assert!(
        b.drain_dirty().is_empty(),
        "the same version writes nothing"
    );
    let snapshot = b.snapshot();
    assert!(snapshot.contains(&PersistRecord::ConfigVersion { version: 2 }));
    let mut r =
        RegionBudget::restore(cfg(), vec![per_minute("api", 400)], snapshot).expect("restore");
    assert_eq!(r.config_version(), 2);
    r.set_config_version(4);
    assert_eq!(allowance(&r, at(1_000), "api", "k"), 100);
}

#[test]
fn a_grant_a_live_reload_dropped_stays_dropped_after_a_restart() {
    let mut log = Vec::new();
    let mut b = granted_and_used(per_minute("api", 400));
    log.extend(b.drain_dirty());
    let closed = LimitSpec {
        partition_policy: crate::limit::PartitionPolicy::Closed,
        ..per_minute("api", 400)
    };
    b.set_limits(at(1_000), vec![closed.clone()]);
    assert_eq!(allowance(&b, at(1_000), "api", "k"), 100);
    let r = restart_under(&mut b, &mut log, vec![closed]);
    assert_eq!(
        allowance(&r, at(1_000), "api", "k"),
        100,
        "the record written at the reload holds no grant, though an earlier one did"
    );
}

#[test]
fn a_region_started_with_another_window_length_forgets_the_limits_keys() {
    let mut log = Vec::new();
    let mut b = granted_and_used(per_minute("api", 400));
    let per_hour = LimitSpec::simple("api", 400, std::time::Duration::from_secs(3_600));
    let r = restart_under(&mut b, &mut log, vec![per_hour]);
    assert_eq!(r.key_count(&lim("api")), 0);
}

#[test]
fn a_store_without_allocation_records_keeps_its_grants_and_writes_them() {
    let mut b = granted_and_used(per_minute("api", 400));
    let old: Vec<PersistRecord> = b
        .drain_dirty()
        .into_iter()
        .filter(|r| !matches!(r, PersistRecord::Allocation(_)))
        .collect();
    let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], old).expect("restore");
    assert_eq!(
        allowance(&r, at(1_000), "api", "k"),
        250,
        "as before they were kept"
    );
    assert!(
        r.drain_dirty()
            .iter()
            .any(|rec| matches!(rec, PersistRecord::Allocation(a) if a.limit == lim("api"))),
        "the parameters in force are written at the start"
    );
}

#[test]
fn the_stored_allocation_changes_exactly_when_allocation_changed_says() {
    use crate::budget::persist::AllocationRecord;
    use crate::rebalance::table::allocation_changed;
    let base = per_minute("api", 400);
    let variants = [
        LimitSpec {
            detailed_metric: true,
            ..base.clone()
        },
        LimitSpec {
            shadow_mode: true,
            ..base.clone()
        },
        LimitSpec {
            enabled: false,
            ..base.clone()
        },
        LimitSpec {
            consistency: Consistency::Eventual,
            ..base.clone()
        },
        LimitSpec {
            partition_policy: crate::limit::PartitionPolicy::Closed,
            ..base.clone()
        },
        per_minute("api", 401),
        LimitSpec::simple("api", 400, std::time::Duration::from_secs(1)),
    ];
    for v in &variants {
        assert_eq!(
            AllocationRecord::of(&base) != AllocationRecord::of(v),
            allocation_changed(&base, v),
            "{v:?}"
        );
    }
}

/// A region under `spec` at configuration version 1, answered at that version at 10 ms.
fn in_contact_at_version_1(spec: LimitSpec) -> RegionBudget {
    let mut b = budget(vec![spec]);
    b.set_config_version(1);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.config_version = 1;
    b.handle_sync_down(at(10), down);
    b
}

/// Swarm seed 954: a closed region, on an older version while the table moved on, ignores the
/// zero the table holds for it in a window the others were grown into; switching versions, it
/// must not take its default there before an answer at its new version brings the zero.
#[test]
fn a_closed_region_that_switches_versions_holds_closed_until_an_answer_at_the_new_one() {
    let closed = LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..per_minute("api", 400)
    };
    let mut b = in_contact_at_version_1(closed);
    let w = minute_window(0);
    assert_eq!(
        allowance(&b, at(10), "api", "k"),
        100,
        "in contact: its default"
    );
    let zero_at_2 = |up: &SyncUp, now| {
        let mut down = answer(up, now);
        down.config_version = 2;
        down.grants = vec![grant("api", "k", w, 0, 3)];
        down
    };
    let up = b.poll_transmit(at(300)).expect("sync");
    b.handle_sync_down(at(310), zero_at_2(&up, at(300)));
    assert_eq!(
        allowance(&b, at(310), "api", "k"),
        100,
        "another version's zero is not applied"
    );
    b.set_config_version(2);
    assert_eq!(
        allowance(&b, at(400), "api", "k"),
        0,
        "closed until an answer at the new version"
    );
    assert!(!acquire(&mut b, at(400), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(600)).expect("sync");
    b.handle_sync_down(at(610), zero_at_2(&up, at(600)));
    assert_eq!(allowance(&b, at(610), "api", "k"), 0, "the zero, applied");
    assert_eq!(
        allowance(&b, at(610), "api", "j"),
        100,
        "no row: the default"
    );
}

/// The floor policy keeps its default through a version switch: the table never takes a
/// floor region's default share while it is silent, so no zero can be waiting for it.
#[test]
fn a_floor_region_that_switches_versions_keeps_its_default() {
    let mut b = in_contact_at_version_1(per_minute("api", 400));
    b.set_config_version(2);
    assert_eq!(allowance(&b, at(20), "api", "k"), 100);
    assert!(acquire(&mut b, at(20), "api", "k", 1).allowed);
}

/// Swarm seed 3001260: a closed region holding closed until an answer at its new version
/// reports what it will hold once that answer comes, not the hold itself. Reported, the hold
/// (at most any row) would confirm a zero the region never got, the coordinator would stop
/// sending it, and the next answer at the version would lift the hold to the default.
#[test]
fn the_hold_of_an_unheard_version_is_not_reported_as_the_allowance() {
    let closed = |units| LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..per_minute("api", units)
    };
    let mut b = in_contact_at_version_1(closed(400));
    let w = minute_window(0);
    acquire(&mut b, at(30_000), "api", "k", 5);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    let mut down = answer(&up, at(30_000));
    down.config_version = 1;
    down.grants = vec![grant("api", "k", w, 120, 1)];
    b.handle_sync_down(at(30_010), down);
    // A new quota: the grant is dropped, and the region holds closed until version 2 answers.
    b.set_limits(at(30_100), vec![closed(300)]);
    b.set_config_version(2);
    assert_eq!(
        allowance(&b, at(30_100), "api", "k"),
        0,
        "closed until an answer at version 2"
    );
    assert!(!acquire(&mut b, at(30_100), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(30_300)).expect("sync");
    let reported: Vec<_> = up
        .demand
        .iter()
        .map(|d| (d.counter.clone(), d.allowance_units))
        .collect();
    assert_eq!(
        reported,
        vec![(counter("api", "k", w), 75)],
        "the default share it falls back to, which no zero row takes as confirmed"
    );
    let mut down = answer(&up, at(30_300));
    down.config_version = 2;
    b.handle_sync_down(at(30_310), down);
    assert_eq!(allowance(&b, at(30_310), "api", "k"), 75);
}

/// Swarm seed 3161221: under the closed policy a region that skips a version holds each key
/// at its use within its grant (held at the default) until an answer at the new version: the
/// table may have reclaimed its floor at the version it skipped (removed, or silent) and kept
/// its rows only as low as they were there. A removed region kept a grant of 2,961 through a
/// version that dropped it, where the table gave it 0. The answer brings the rows (a zero, at
/// an epoch above the old ones).
#[test]
fn a_closed_region_that_skips_a_version_holds_at_its_use_until_an_answer() {
    let closed = LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..per_minute("api", 400)
    };
    let mut b = budget(vec![closed]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.grants = vec![grant("api", "k", w, 250, 2)];
    b.handle_sync_down(at(10), down);
    assert!(acquire(&mut b, at(20), "api", "k", 50).allowed);
    b.set_config_version(1);
    b.set_config_version(2);
    assert_eq!(
        allowance(&b, at(1_000), "api", "k"),
        250,
        "the next version"
    );
    b.set_config_version(4);
    assert!(b.is_view_expired(at(5_000)));
    assert_eq!(
        allowance(&b, at(5_000), "api", "k"),
        50,
        "closed, it holds what it used, not its grant held at the default (100)"
    );
    assert!(!acquire(&mut b, at(5_000), "api", "k", 1).allowed);
    assert_eq!(net(&b, "api", "k"), 50, "nothing used is forgotten");
    let up = b.poll_transmit(at(6_000)).expect("sync");
    let mut down = answer(&up, at(6_000));
    down.config_version = 4;
    down.grants = vec![grant("api", "k", w, 0, 5)];
    b.handle_sync_down(at(6_010), down);
    assert_eq!(allowance(&b, at(6_010), "api", "k"), 0, "the zero, applied");
}

/// A closed region whose grant below the default is confirmed (a release of its idle share).
/// Returns it in contact at version 1 holding 60 of its default 100, 10 used.
fn holding_a_confirmed_row_below_the_default() -> RegionBudget {
    let closed = LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..per_minute("api", 400)
    };
    let mut b = in_contact_at_version_1(closed);
    let w = minute_window(0);
    assert!(acquire(&mut b, at(20), "api", "k", 10).allowed);
    let up = b.poll_transmit(at(300)).expect("sync");
    let mut down = answer(&up, at(300));
    down.config_version = 1;
    down.grants = vec![grant("api", "k", w, 60, 3)];
    b.handle_sync_down(at(310), down);
    assert_eq!(allowance(&b, at(310), "api", "k"), 60);
    b
}

/// Swarm seed 3234414: a closed region holding a row below its default that the coordinator
/// saw confirmed skips a version. The row is not sent again (sent and confirmed), so the
/// region keeps its grant through the skip: held at its use until an answer at the new
/// version, then the grant again, not its default (which would be above the table's row).
#[test]
fn a_closed_region_that_skips_a_version_keeps_a_confirmed_row_below_its_default() {
    let mut b = holding_a_confirmed_row_below_the_default();
    b.set_config_version(3);
    assert_eq!(
        allowance(&b, at(400), "api", "k"),
        10,
        "held at its use until an answer at version 3"
    );
    assert!(!acquire(&mut b, at(400), "api", "k", 1).allowed);
    let up = b.poll_transmit(at(600)).expect("sync");
    let reported: Vec<_> = up.demand.iter().map(|d| d.allowance_units).collect();
    assert!(
        reported.iter().all(|&u| u == 60),
        "the grant it falls back to, not the hold, is reported: {reported:?}"
    );
    let mut down = answer(&up, at(600));
    down.config_version = 3;
    b.handle_sync_down(at(610), down);
    assert_eq!(
        allowance(&b, at(610), "api", "k"),
        60,
        "the grant, which the table's row still is"
    );
    assert!(acquire(&mut b, at(620), "api", "k", 50).allowed);
    assert!(!acquire(&mut b, at(630), "api", "k", 1).allowed);
}

/// A restart after a skip and before the answer at the new version skips again: the store
/// holds the version before the skip until that answer, then the new one.
#[test]
fn a_restart_before_the_answer_to_a_skip_holds_again() {
    let closed = LimitSpec {
        partition_policy: PartitionPolicy::Closed,
        ..per_minute("api", 400)
    };
    let mut log = Vec::new();
    let mut b = holding_a_confirmed_row_below_the_default();
    b.set_config_version(3);
    let mut r = restart_under(&mut b, &mut log, vec![closed.clone()]);
    assert_eq!(
        r.config_version(),
        1,
        "the version the stored grants were made under"
    );
    r.set_config_version(3);
    assert_eq!(allowance(&r, at(400), "api", "k"), 10, "held again");
    let snapshot = b.snapshot();
    assert!(snapshot.contains(&PersistRecord::ConfigVersion { version: 1 }));
    let up = b.poll_transmit(at(600)).expect("sync");
    let mut down = answer(&up, at(600));
    down.config_version = 3;
    b.handle_sync_down(at(610), down);
    let mut r = restart_under(&mut b, &mut log, vec![closed]);
    assert_eq!(
        r.config_version(),
        3,
        "answered: the stored grants are version 3's"
    );
    r.set_config_version(3);
    assert_eq!(allowance(&r, at(700), "api", "k"), 60);
}
