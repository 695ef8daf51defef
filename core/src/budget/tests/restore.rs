//! Restores: a start that may have lost what an earlier copy of the state admitted.

use super::*;
use crate::budget::{PersistRecord, Reason, RestoreStart};

/// Region `eu` restored at 30 s into window 0 (60 s windows), 10 units already back in its
/// counter (what its old copy held).
fn restored(why: RestoreStart) -> RegionBudget {
    let mut b = budget(vec![per_minute("api", 400)]);
    assert!(acquire(&mut b, at(1_000), "api", "k", 10).allowed);
    let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], b.drain_dirty())
        .expect("restore");
    r.start_restored(at(30_000), why);
    r
}

/// `api`, `units` a minute, under the open policy at 100 a second (burst 100).
fn open_per_minute(units: u64) -> LimitSpec {
    LimitSpec {
        partition_policy: crate::limit::PartitionPolicy::Open {
            rate: crate::limit::RateCap {
                units: 100,
                per: Duration::from_secs(1),
                burst: 100,
            },
        },
        ..per_minute("api", units)
    }
}

fn answer_with(b: &mut RegionBudget, now: Timestamp, known_region: bool) -> SyncUp {
    let up = b.poll_transmit(now).expect("sync");
    let down = SyncDown {
        known_region,
        ..answer(&up, now)
    };
    b.handle_sync_down(now, down);
    up
}

#[test]
fn a_declared_restore_waits_for_the_first_answer_then_never_admits_in_earlier_windows() {
    let mut b = restored(RestoreStart::Declared);
    let d = acquire(&mut b, at(30_000), "api", "k", 1);
    assert!(!d.allowed, "nothing before the first answer");
    assert_eq!(d.reason, Reason::Restoring);
    let up = answer_with(&mut b, at(30_100), false);
    assert!(up.restored, "the boot's SyncUp says so");
    assert!(
        !acquire(&mut b, at(30_200), "api", "k", 1).allowed,
        "the window began before the start: its allowance may be spent"
    );
    assert_eq!(
        allowance(&b, at(30_200), "api", "k"),
        10,
        "held at what it uses"
    );
    assert!(!b.poll_transmit(at(31_000)).expect("sync").restored);
    // The next window is normal.
    assert!(acquire(&mut b, at(60_000), "api", "k", 1).allowed);
}

#[test]
fn an_empty_store_the_coordinator_did_not_know_is_a_first_start() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.start_restored(at(30_000), RestoreStart::EmptyStore);
    assert!(!acquire(&mut b, at(30_000), "api", "k", 1).allowed);
    answer_with(&mut b, at(30_100), false);
    assert!(acquire(&mut b, at(30_200), "api", "k", 1).allowed);
}

#[test]
fn an_empty_store_the_coordinator_knew_is_a_lost_one() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.start_restored(at(30_000), RestoreStart::EmptyStore);
    answer_with(&mut b, at(30_100), true);
    assert!(!acquire(&mut b, at(30_200), "api", "k", 1).allowed);
    assert!(acquire(&mut b, at(60_000), "api", "k", 1).allowed);
}

/// While it waits for its first answer, a restored start under the open policy admits at
/// its rate only in windows that began after its start: the lost copy may have taken the open
/// rate's budget of the window in progress too.
#[test]
fn the_open_policy_admits_nothing_in_a_window_before_the_start_while_awaiting() {
    let mut b = budget(vec![open_per_minute(400)]);
    b.start_restored(at(30_000), RestoreStart::Declared);
    assert!(b.is_view_expired(at(50_000)));
    assert!(!acquire(&mut b, at(50_000), "api", "k", 1).allowed);
    assert!(
        acquire(&mut b, at(60_000), "api", "k", 1).allowed,
        "a window after the start: the open policy's rate"
    );
}

/// Swarm seed 3158568: on a timebase with no correction known (an empty store), a restored
/// start's own clock may be any distance behind the one its lost copy read windows on (20 s
/// there, with 7 s windows), so a window it takes for one after its start may be one the
/// copy used: while it waits, the open policy admits nothing. With a correction read back
/// from its store it admits in windows after its start, as without a timebase.
#[test]
fn on_a_timebase_with_no_correction_known_a_waiting_restore_admits_nothing_open() {
    let on_timebase = BudgetConfig {
        max_edge_band: Some(Duration::from_millis(250)),
        ..cfg()
    };
    let mut b = RegionBudget::new(on_timebase.clone(), vec![open_per_minute(400)]).expect("budget");
    b.start_restored(at(30_000), RestoreStart::EmptyStore);
    assert!(b.is_view_expired(at(70_000)));
    assert!(!acquire(&mut b, at(70_000), "api", "k", 1).allowed);
    let mut b = RegionBudget::new(on_timebase, vec![open_per_minute(400)]).expect("budget");
    b.set_clock_correction(crate::budget::ClockCorrection {
        correction_nanos: 0,
        slowed_from: None,
    });
    b.start_restored(at(30_000), RestoreStart::Declared);
    assert!(!acquire(&mut b, at(50_000), "api", "k", 1).allowed);
    assert!(acquire(&mut b, at(70_000), "api", "k", 1).allowed);
}

#[test]
fn the_open_policy_does_not_reopen_a_closed_window() {
    let mut b = budget(vec![open_per_minute(400)]);
    b.start_restored(at(30_000), RestoreStart::Declared);
    answer_with(&mut b, at(30_100), false);
    // Long after contact: the view has expired, and the open policy would admit.
    assert!(b.is_view_expired(at(50_000)));
    assert!(!acquire(&mut b, at(50_000), "api", "k", 1).allowed);
}

/// A window that began before the start keeps all the region holds there (the lost copy may
/// have spent it: released, it would be granted to another region); a later window releases
/// as usual, from what the region holds.
#[test]
fn a_restored_region_releases_nothing_of_a_window_that_began_before_its_start() {
    let mut b = restored(RestoreStart::Declared);
    let release = |b: &mut RegionBudget, now: u64, id: u64| {
        let up = b.poll_transmit(at(now)).expect("sync");
        let mut down = answer(&up, at(now));
        down.release_requests = vec![release_req(id, "api", "k", minute_window(now), 60, 1)];
        b.handle_sync_down(at(now), down);
        let up = b.poll_transmit(at(now + 300)).expect("sync");
        let ack = up.release_acks.first().expect("an ack");
        (ack.released_units, ack.allowance_after_units)
    };
    assert_eq!(release(&mut b, 30_000, 7), (0, 100));
    assert_eq!(
        allowance(&b, at(30_300), "api", "k"),
        10,
        "still held at its use"
    );
    assert!(acquire(&mut b, at(60_000), "api", "k", 1).allowed);
    assert_eq!(
        release(&mut b, 60_000, 8),
        (60, 40),
        "a later window is normal"
    );
}

#[test]
fn the_windows_a_restore_closed_stay_closed_after_a_crash() {
    let mut b = restored(RestoreStart::Declared);
    answer_with(&mut b, at(30_100), false);
    let mut log = b.snapshot();
    log.extend(b.drain_dirty());
    let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log).expect("restore");
    assert!(!acquire(&mut r, at(40_000), "api", "k", 1).allowed);
    assert!(acquire(&mut r, at(60_000), "api", "k", 1).allowed);
}

/// Swarm seeds 3145780 and 3144582: a restored start that goes down again before its first
/// answer (the coordinator out, or the region removed) comes back from the restored copy, not
/// from its own latest state: it waits again, and closes the windows that began before the
/// first restored start, whatever its store says now. Before, the wait was not stored and
/// the restart took the restored copy for its own state: it admitted again what the lost
/// copy had admitted (714 against L = 615).
#[test]
fn a_restore_that_goes_down_before_its_first_answer_waits_again_after_the_restart() {
    for why in [RestoreStart::Declared, RestoreStart::EmptyStore] {
        // The store as the agent writes it: the old copy's records, then the restored boot's.
        let mut old = budget(vec![per_minute("api", 400)]);
        assert!(acquire(&mut old, at(1_000), "api", "k", 10).allowed);
        let mut log = old.drain_dirty();
        let mut b = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log.clone())
            .expect("restore");
        b.start_restored(at(30_000), why);
        assert!(!acquire(&mut b, at(30_000), "api", "k", 1).allowed);
        log.extend(b.drain_dirty());
        let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log.clone())
            .expect("restore");
        let floor = crate::budget::restore::id_floor(at(30_000));
        let meta = r.snapshot().into_iter().find_map(|p| match p {
            PersistRecord::Meta(m) => Some(m),
            _ => None,
        });
        assert!(
            meta.is_some_and(|m| m.next_lease_id >= floor && m.next_slot_id >= floor),
            "{why:?}: ids stay above the restored start's floor"
        );
        let d = acquire(&mut r, at(40_000), "api", "k", 1);
        assert!(!d.allowed, "{why:?}: still waiting for a first answer");
        assert_eq!(d.reason, Reason::Restoring);
        let up = answer_with(&mut r, at(40_100), true);
        assert!(up.restored, "{why:?}: the new boot says it is restored");
        assert!(
            !acquire(&mut r, at(40_200), "api", "k", 1).allowed,
            "{why:?}: the window of the first restored start stays closed"
        );
        // Answered, the wait is replaced in the store: a crash now restarts closed, not waiting.
        log.extend(r.drain_dirty());
        assert!(
            acquire(&mut r, at(60_000), "api", "k", 1).allowed,
            "{why:?}"
        );
        let mut again =
            RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log).expect("restore");
        assert!(!acquire(&mut again, at(50_000), "api", "k", 1).allowed);
        assert!(acquire(&mut again, at(60_000), "api", "k", 1).allowed);
        assert!(!again.poll_transmit(at(60_100)).expect("sync").restored);
    }
}

/// An empty store the coordinator did not know is a first start: once answered, its store
/// holds no wait and closes nothing, so a crash restarts as any crash does.
#[test]
fn a_first_start_answered_leaves_no_wait_in_its_store() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.start_restored(at(30_000), RestoreStart::EmptyStore);
    let mut log = b.drain_dirty();
    assert!(
        log.contains(&PersistRecord::RestoreAwaiting {
            started_at: at(30_000),
            declared: false
        }),
        "{log:?}"
    );
    answer_with(&mut b, at(30_100), false);
    assert!(acquire(&mut b, at(30_200), "api", "k", 1).allowed);
    log.extend(b.drain_dirty());
    let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], log).expect("restore");
    assert!(acquire(&mut r, at(40_000), "api", "k", 1).allowed);
    assert!(!r.poll_transmit(at(40_100)).expect("sync").restored);
    assert!(
        !r.snapshot().iter().any(|p| matches!(
            p,
            PersistRecord::RestoreAwaiting { .. } | PersistRecord::RestoredBefore { .. }
        )),
        "nothing closed, nothing awaited"
    );
}

#[test]
fn key_views_say_a_restore_awaits_its_answer_until_it_comes() {
    let mut b = restored(RestoreStart::Declared);
    let awaiting = |b: &RegionBudget| b.key_accounts(at(30_200))[0].restore_awaiting;
    assert!(awaiting(&b));
    assert_eq!(
        b.key_accounts(at(30_200))[0].allowance_units,
        10,
        "its own count"
    );
    answer_with(&mut b, at(30_100), false);
    assert!(!awaiting(&b));
}

/// An answer to the lost copy's SyncUp reaches the restored start before its own first
/// answer, with a release request for the next window (the coordinator lowered its row of 80
/// to 20 in it). Taken from the restored copy's default share (100) it would leave 40, above
/// the row; not applied while awaiting, it is taken from the row the first answer resends.
#[test]
fn a_restore_awaiting_its_answer_releases_nothing_from_its_old_copy() {
    let mut b = restored(RestoreStart::Declared);
    let next = minute_window(60_000);
    let up = b.poll_transmit(at(30_000)).expect("sync");
    let stale = SyncDown {
        reply_to_seq: up.seq + 1_000,
        release_requests: vec![release_req(7, "api", "k", next, 60, 3)],
        ..answer(&up, at(30_000))
    };
    b.handle_sync_down(at(30_000), stale);
    let up = b.poll_transmit(at(30_300)).expect("sync");
    assert!(up.release_acks.is_empty(), "not applied, not acked");
    let first = SyncDown {
        grants: vec![grant("api", "k", next, 80, 2)],
        release_requests: vec![release_req(7, "api", "k", next, 60, 3)],
        ..answer(&up, at(30_300))
    };
    b.handle_sync_down(at(30_300), first);
    let up = b.poll_transmit(at(30_600)).expect("sync");
    let ack = up.release_acks.first().expect("an ack");
    assert_eq!((ack.released_units, ack.allowance_after_units), (60, 20));
    assert_eq!(allowance(&b, at(60_000), "api", "k"), 20);
}

/// A gateway still holds leases the lost copy granted after the copy was taken, past the id
/// block that copy recorded. Granted again here, a release of the lost lease would end a new
/// one and refund into a window it never charged.
#[test]
fn a_restore_hands_out_no_lease_id_its_lost_copy_granted() {
    let big = || vec![per_minute("api", 1_000_000)];
    let mut b = budget(big());
    let grant_one = |b: &mut RegionBudget, now: u64| {
        granted(
            b.lease(at(now), lease_req("api", "k", 1, 30))
                .expect("lease"),
        )
        .lease
    };
    grant_one(&mut b, 1_000);
    let old_copy = b.drain_dirty();
    // Past the block the old copy's meta record covers.
    let lost: Vec<_> = (0..1_100)
        .map(|_| {
            let id = grant_one(&mut b, 2_000);
            b.release(at(2_000), id, 0, None).expect("release");
            id
        })
        .collect();
    let held = grant_one(&mut b, 2_000);
    let mut r = RegionBudget::restore(cfg(), big(), old_copy).expect("restore");
    r.start_restored(at(30_000), RestoreStart::Declared);
    answer_with(&mut r, at(30_100), false);
    let fresh = grant_one(&mut r, 60_000);
    assert!(
        !lost.contains(&fresh) && fresh != held,
        "{fresh:?} was the lost copy's"
    );
    assert!(
        r.release(at(60_100), held, 1, None).is_err(),
        "the lost lease is unknown here"
    );
    r.release(at(60_200), fresh, 1, None)
        .expect("the new lease is still live");
}

/// The lost copy ran on a corrected clock 4 s ahead of the region's own (it was behind); the
/// restored start reads its own clock until its first sample. Dated at the first SyncUp on
/// the clock then read, the restored boot (2 s) came out below the lost copy's (5 s), and the
/// coordinator dropped its messages as old. Dated at the start on the own clock, boots grow.
#[test]
fn a_restored_start_on_a_clock_behind_still_gets_a_larger_boot() {
    let boot_of = |own_clock_ms: u64, read_ms: u64| {
        let mut b = budget(vec![per_minute("api", 400)]);
        b.set_boot_clock(at(own_clock_ms));
        b.poll_transmit(at(read_ms)).expect("sync").boot
    };
    let lost_copy = boot_of(1_000, 5_000);
    let restored = boot_of(2_000, 2_000);
    assert_eq!(
        lost_copy,
        at(1_000).as_unix_nanos(),
        "the own clock's reading"
    );
    assert!(restored > lost_copy);
}

/// The first answer of a restored start finds its clock 45 s behind the coordinator's: the
/// lost copy, corrected by samples this copy never stored, may already have been in the next
/// minute and spent there. A release of that minute in the same answer releases nothing,
/// where on the uncorrected clock the minute had not begun (swarm seed 3132762: the row went
/// to another region while the lost copy had admitted from it). Measured on time or ahead,
/// or without a timebase (every copy on its own clock), the release is taken as usual.
#[test]
fn a_restored_start_measured_behind_releases_nothing_of_a_window_its_lost_copy_reached() {
    let with_timebase = BudgetConfig {
        max_edge_band: Some(Duration::from_millis(250)),
        ..cfg()
    };
    let released = |cfg: BudgetConfig, coordinator_ms: u64| {
        let mut b = budget(vec![per_minute("api", 400)]);
        assert!(acquire(&mut b, at(1_000), "api", "k", 10).allowed);
        let mut r = RegionBudget::restore(cfg, vec![per_minute("api", 400)], b.drain_dirty())
            .expect("restore");
        r.start_restored(at(30_000), RestoreStart::Declared);
        let up = r.poll_transmit(at(30_000)).expect("sync");
        let mut down = answer(&up, at(coordinator_ms));
        down.release_requests = vec![release_req(7, "api", "k", minute_window(60_000), 60, 1)];
        r.handle_sync_down(at(30_000), down);
        let up = r.poll_transmit(at(30_300)).expect("sync");
        up.release_acks.first().expect("an ack").released_units
    };
    assert_eq!(
        released(with_timebase.clone(), 75_000),
        0,
        "the next minute began before the start on the coordinator's clock"
    );
    assert_eq!(released(with_timebase.clone(), 30_000), 60, "on time");
    assert_eq!(
        released(with_timebase, 1_000),
        60,
        "ahead: no earlier window"
    );
    assert_eq!(released(cfg(), 75_000), 60, "no timebase: its own clock");
}

/// Swarm seed 3384823: without a timebase, the restored start (30 s) reads behind the clock
/// its lost copy ran on, which the leader's answer says may read up to 75 s now: the copy may
/// have been in the next minute, spent there, and not synced it. That minute stays closed (no
/// admission, no release of it); the one after is normal. A reach behind the start, or none,
/// closes what the start closes.
#[test]
fn a_restored_start_closes_every_window_its_earlier_boot_clock_may_have_reached() {
    let first_answer = |reach_ms: Option<u64>| {
        let mut r = restored(RestoreStart::Declared);
        let up = r.poll_transmit(at(30_000)).expect("sync");
        let mut down = answer(&up, at(30_000));
        down.earlier_boot_clock_reach = reach_ms.map(at);
        down.release_requests = vec![release_req(7, "api", "k", minute_window(60_000), 60, 1)];
        r.handle_sync_down(at(30_000), down);
        r
    };
    let mut r = first_answer(Some(75_000));
    let up = r.poll_transmit(at(30_300)).expect("sync");
    assert_eq!(
        up.release_acks.first().expect("an ack").released_units,
        0,
        "the next minute may hold the lost copy's use"
    );
    let d = acquire(&mut r, at(61_000), "api", "k", 1);
    assert!(!d.allowed, "the lost copy's clock may have been there");
    assert!(acquire(&mut r, at(120_000), "api", "k", 1).allowed);

    for reach in [None, Some(20_000)] {
        let mut r = first_answer(reach);
        let up = r.poll_transmit(at(30_300)).expect("sync");
        assert_eq!(up.release_acks[0].released_units, 60, "{reach:?}");
        assert!(
            acquire(&mut r, at(61_000), "api", "k", 1).allowed,
            "{reach:?}"
        );
    }
}

/// Two restores from one copy, on a clock that reads before the copy's boot: both boots come
/// from the copy's boot plus one, and only the salt makes them differ (a leader took the
/// second for the first, swarm seed 3384823's variants).
#[test]
fn two_restores_from_one_copy_on_a_clock_behind_take_different_boots() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.set_boot_clock(at(50_000));
    assert!(acquire(&mut b, at(50_000), "api", "k", 1).allowed);
    let copy = b.drain_dirty();
    let boot_of = |salt: u64| {
        let mut r = RegionBudget::restore(cfg(), vec![per_minute("api", 400)], copy.clone())
            .expect("restore");
        r.set_boot_clock(at(1_000));
        r.start_restored(at(50_000), RestoreStart::Declared);
        r.salt_restored_boot(salt);
        r.poll_transmit(at(50_000)).expect("sync").boot
    };
    let unsalted = at(50_000).as_unix_nanos() + 1;
    assert_eq!(
        boot_of(0),
        unsalted,
        "the copy's boot plus one: what both took before"
    );
    assert_ne!(boot_of(12_345), boot_of(67_890));
    assert!(boot_of(u64::MAX) < unsalted + crate::budget::BOOT_SALT_NANOS);
}
