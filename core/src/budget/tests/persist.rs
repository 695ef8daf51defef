//! Persistence: drained records and snapshots bring a region back as it was.

use super::*;
use crate::budget::config::{ID_BLOCK, MAX_DIRTY_ITEMS};
use crate::budget::persist::{AllowanceRecord, PersistRecord};
use crate::ids::LeaseId;
use crate::sync::CounterEntry;

fn restart(records: Vec<PersistRecord>) -> RegionBudget {
    RegionBudget::restore(cfg(), vec![per_minute("api", 400)], records).expect("restore")
}

#[test]
fn a_restarted_region_sees_every_unit_it_admitted_and_its_leases() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let mut log = Vec::new();
    acquire(&mut b, at(0), "api", "k", 30);
    log.extend(b.drain_dirty());
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 50, 30))
            .expect("lease"),
    );
    log.extend(b.drain_dirty());
    let mut r = restart(log);
    assert_eq!(net(&r, "api", "k"), 80);
    assert!(
        !acquire(&mut r, at(1_000), "api", "k", 21).allowed,
        "80 + 21 > 100"
    );
    // The lease survives and refunds into the restored counters.
    r.release(at(1_000), g.lease, 50, None)
        .expect("release after restart");
    assert_eq!(net(&r, "api", "k"), 30);
    // A new lease never reuses the old id.
    let g2 = granted(
        r.lease(at(1_000), lease_req("api", "k", 1, 30))
            .expect("lease"),
    );
    assert!(g2.lease > g.lease);
}

/// Ids are made durable a block at a time, so most grants write no meta record; none of the
/// ids handed out before a restart may come back after it, even those of leases that ended
/// (a late release naming one must not end somebody else's lease).
#[test]
fn lease_ids_are_never_reused_across_restarts_though_meta_is_written_once_a_block() {
    let mut b = budget(vec![per_minute("api", 10_000)]);
    let mut log = Vec::new();
    let mut metas = 0;
    let mut last = LeaseId(0);
    for i in 0..(ID_BLOCK + 10) {
        let g = granted(b.lease(at(i), lease_req("api", "k", 1, 30)).expect("lease"));
        b.release(at(i), g.lease, 1, None).expect("release");
        let records = b.drain_dirty();
        metas += records
            .iter()
            .filter(|r| matches!(r, PersistRecord::Meta(_)))
            .count();
        log.extend(records);
        last = g.lease;
    }
    // One meta record for the first block, one when the grants reach the second.
    assert_eq!(metas, 2);
    let mut r = restart(log);
    let g = granted(
        r.lease(at(5_000), lease_req("api", "k", 1, 30))
            .expect("lease"),
    );
    assert!(g.lease > last, "{:?} after {last:?}", g.lease);
}

#[test]
fn a_retry_after_a_restart_is_still_recognised() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let id = Some(RequestId(42));
    let first = acquire_with(&mut b, at(0), "api", "k", 30, id);
    let mut r = restart(b.drain_dirty());
    assert_eq!(acquire_with(&mut r, at(100), "api", "k", 30, id), first);
    assert_eq!(net(&r, "api", "k"), 30);
}

/// The fingerprint is persisted with the outcome: after a restart the same id with another
/// cost is still refused (before fingerprints it was answered with the first outcome: the
/// `matches!` below failed on an `Ok`).
#[test]
fn a_request_ids_fingerprint_survives_a_restart() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let id = Some(RequestId(42));
    let first = acquire_with(&mut b, at(0), "api", "k", 30, id);
    let log = b.drain_dirty();
    assert!(
        log.iter()
            .any(|r| matches!(r, PersistRecord::Idempotency(i) if i.request == RequestId(42))),
        "the entry is written with its fingerprint"
    );
    let mut r = restart(log);
    let other = AcquireRequest {
        limit: lim("api"),
        key: key("k"),
        cost_units: 31,
        request_id: id,
    };
    assert!(matches!(
        r.acquire(at(100), other),
        Err(crate::error::Error::IdempotencyConflict { .. })
    ));
    assert_eq!(acquire_with(&mut r, at(100), "api", "k", 30, id), first);
    assert_eq!(net(&r, "api", "k"), 30);
}

/// An entry from a store written before fingerprints replays on the call kind alone, as it
/// did, and is written back as it was read.
#[test]
fn an_entry_without_a_fingerprint_replays_on_its_kind_alone() {
    use crate::budget::persist::UnfingerprintedIdempotencyRecord;
    let mut b = budget(vec![per_minute("api", 400)]);
    let first = acquire_with(&mut b, at(0), "api", "k", 30, Some(RequestId(42)));
    let log: Vec<PersistRecord> = b
        .drain_dirty()
        .into_iter()
        .map(|r| match r {
            PersistRecord::Idempotency(i) => {
                PersistRecord::IdempotencyUnfingerprinted(UnfingerprintedIdempotencyRecord {
                    request: i.request,
                    expires_at: i.expires_at,
                    outcome: i.outcome,
                })
            }
            other => other,
        })
        .collect();
    let mut r = restart(log.clone());
    let again = acquire_with(&mut r, at(100), "api", "k", 31, Some(RequestId(42)));
    assert_eq!(again, first);
    assert_eq!(net(&r, "api", "k"), 30);
    let old: Vec<&PersistRecord> = log
        .iter()
        .filter(|r| matches!(r, PersistRecord::IdempotencyUnfingerprinted(_)))
        .collect();
    let snapshot = r.snapshot();
    for rec in old {
        assert!(snapshot.contains(rec), "{rec:?} kept as read");
    }
}

#[test]
fn a_lowered_allowance_and_its_ack_survive_a_restart() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let w = minute_window(0);
    let up = b.poll_transmit(at(0)).expect("sync");
    let mut down = answer(&up, at(0));
    down.release_requests = vec![release_req(9, "api", "k", w, 60, 1)];
    b.handle_sync_down(at(0), down);
    let mut r = restart(b.drain_dirty());
    // 100 - 60 = 40, not the default 100 again.
    assert_eq!(allowance(&r, at(10), "api", "k"), 40);
    let up = r.poll_transmit(at(10)).expect("sync");
    assert_eq!(up.release_acks.len(), 1, "the ack still goes out");
    assert_eq!(up.release_acks[0].released_units, 60);
    assert!(up.seq > 0, "sequence numbers continue after a restart");
}

#[test]
fn own_entries_resent_by_the_coordinator_are_merged_by_max_after_a_restart() {
    // The store lost the latest write: it knows 30 units, the region had admitted 80.
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "k", 30);
    let stale = b.drain_dirty();
    let mut r = restart(stale);
    let up = r.poll_transmit(at(100)).expect("sync");
    let mut down = answer(&up, at(100));
    down.entries = vec![CounterEntry {
        counter: counter("api", "k", minute_window(0)),
        region: RegionId::from("eu"),
        granted_units: 80,
        refunded_units: 0,
    }];
    r.handle_sync_down(at(100), down);
    assert_eq!(net(&r, "api", "k"), 80);
    assert!(!acquire(&mut r, at(200), "api", "k", 21).allowed);
}

#[test]
fn a_snapshot_restores_the_same_state_as_the_whole_history() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let mut log = Vec::new();
    for i in 0..20u64 {
        let k = format!("k{}", i % 7);
        acquire(&mut b, at(i * 100), "api", &k, i % 5);
        let out = b.lease(at(i * 100), lease_req("api", &k, 3, 1));
        if let (Ok(crate::budget::LeaseOutcome::Granted(g)), 0) = (out, i % 2) {
            b.release(at(i * 100), g.lease, 1, None).expect("release");
        }
        b.handle_timeout(at(i * 100));
        log.extend(b.drain_dirty());
    }
    let from_log = restart(log).snapshot();
    let from_snapshot = restart(b.snapshot()).snapshot();
    assert_eq!(from_log, b.snapshot());
    assert_eq!(from_snapshot, b.snapshot());
}

#[test]
fn when_nobody_drains_the_tracker_stays_bounded_and_falls_back_to_a_snapshot() {
    let mut b = budget(vec![per_minute("api", 400)]);
    let keys = MAX_DIRTY_ITEMS + 10;
    for i in 0..keys {
        acquire(&mut b, at(0), "api", &format!("k{i}"), 1);
    }
    assert_eq!(b.region_stats().dirty_overflows, 1);
    let records = b.drain_dirty();
    assert_eq!(records.first(), Some(&PersistRecord::Reset));
    let r = restart(records);
    assert_eq!(r.key_count(&lim("api")), keys);
    assert!(b.drain_dirty().is_empty(), "back to tracking item by item");
}

#[test]
fn keys_rolled_by_a_sweep_are_persisted_as_rolled() {
    // Regression: a sweep moved a key with a pre-issued grant into the new window without
    // writing it, so the store still held the old window's counters.
    let mut b = budget(vec![per_minute("api", 400)]);
    let mut log = Vec::new();
    acquire(&mut b, at(50_000), "api", "k", 30);
    let up = b.poll_transmit(at(50_000)).expect("sync");
    let mut down = answer(&up, at(50_000));
    down.grants = vec![grant("api", "k", minute_window(60_000), 40, 1)];
    b.handle_sync_down(at(50_000), down);
    log.extend(b.drain_dirty());
    b.handle_timeout(at(60_000));
    log.extend(b.drain_dirty());
    assert_eq!(restart(log).snapshot(), b.snapshot());
}

#[test]
fn discarded_changes_are_not_drained_later_and_tracking_goes_on() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "a", 1);
    b.discard_dirty();
    assert!(b.drain_dirty().is_empty(), "a's change was discarded");
    // Tracking goes on after a discard: b's change alone is drained, and restores b.
    acquire(&mut b, at(0), "api", "b", 2);
    let r = restart(b.drain_dirty());
    assert_eq!((net(&r, "api", "a"), net(&r, "api", "b")), (0, 2));
    // An overflowed tracker is discarded whole too: no snapshot is owed afterwards.
    for i in 0..MAX_DIRTY_ITEMS + 10 {
        acquire(&mut b, at(0), "api", &format!("k{i}"), 1);
    }
    b.discard_dirty();
    assert!(b.drain_dirty().is_empty());
}

#[test]
fn a_restarted_region_keeps_the_excess_it_recorded() {
    // Default share 100: a lease of 100 settled at 130 takes use 30 past the allowance, all of
    // it recorded excess. A restart must find use and excess as they were (invariant 1), both
    // from the drained records and from a snapshot.
    let spec = per_minute_settling("api", 400, 100);
    let mut b = budget(vec![spec.clone()]);
    let g = granted(
        b.lease(at(0), lease_req("api", "k", 100, 30))
            .expect("lease"),
    );
    b.settle(at(10), g.lease, 130, None).expect("settle");
    let log = b.drain_dirty();
    let excess = |r: &RegionBudget| {
        let v = r.key_accounts(at(20));
        (v[0].granted_units - v[0].refunded_units, v[0].excess_units)
    };
    assert_eq!(excess(&b), (130, 30));
    let restored = RegionBudget::restore(cfg(), vec![spec.clone()], log).expect("restore");
    assert_eq!(excess(&restored), (130, 30));
    let from_snapshot = RegionBudget::restore(cfg(), vec![spec], b.snapshot()).expect("restore");
    assert_eq!(excess(&from_snapshot), (130, 30));
}

/// A store's log holds a lease's record once per change written, many at the same expiry (a
/// lease shrunk or charged again): replayed at a restart, each put pushed one more entry for
/// the same expiry into the index, past its bound (swarm seed 801127, a debug assertion).
#[test]
fn a_lease_record_replayed_many_times_keeps_one_index_entry() {
    let mut b = budget(vec![per_minute("api", 400)]);
    granted(
        b.lease(at(1_000), lease_req("api", "k", 5, 30))
            .expect("lease"),
    );
    let records = b.drain_dirty();
    let lease = records
        .iter()
        .find(|r| matches!(r, PersistRecord::Lease(_)))
        .expect("a lease record")
        .clone();
    let mut log = records;
    log.extend(std::iter::repeat_n(lease, 3_000));
    let r = restart(log);
    assert_eq!(r.leases.len(), 1);
}

/// Found by the log's fuzz target (fuzz/corpus/wal_replay): a stored key record whose
/// allowances name windows before its own (never written, but a store is read as it is) made
/// the restore keep them as pre-issued grants of later windows, past their bound (a debug
/// assertion). They are stale: the restore drops them and keeps the record's own window.
#[test]
fn a_key_record_with_allowances_of_earlier_windows_restores_without_them() {
    let mut b = budget(vec![per_minute("api", 400)]);
    acquire(&mut b, at(0), "api", "k", 30);
    let mut records = b.drain_dirty();
    let rec = records
        .iter_mut()
        .find_map(|r| match r {
            PersistRecord::Key(k) => Some(k),
            _ => None,
        })
        .expect("a key record");
    let window = rec.window;
    for back in 1..=4 {
        rec.allowances.push(AllowanceRecord {
            window: WindowIndex(window.0 - back),
            allowance_units: 7,
            epoch: Epoch(back),
        });
    }
    let r = restart(records);
    assert_eq!(net(&r, "api", "k"), 30);
    for record in r.snapshot() {
        if let PersistRecord::Key(k) = record {
            assert!(
                k.allowances.iter().all(|a| a.window >= k.window),
                "{:?}",
                k.allowances
            );
        }
    }
}

/// A start whose clock went back across the restart (an NTP step while it was down) still
/// takes a boot larger than the one before: the coordinator drops a SyncUp whose boot is not,
/// as an old message of the start before, so every SyncUp of that start was lost.
#[test]
fn a_boot_grows_across_a_restart_whatever_the_clock_reads() {
    let mut b = budget(vec![per_minute("api", 400)]);
    b.set_boot_clock(at(100_000));
    let first = b.poll_transmit(at(100_000)).expect("a SyncUp").boot;
    let mut r = restart(b.drain_dirty());
    // Down for 1 s, the clock stepped back 30 s meanwhile.
    r.set_boot_clock(at(100_000 + 1_000 - 30_000));
    let second = r.poll_transmit(at(71_000)).expect("a SyncUp").boot;
    assert!(second > first, "boot {second} after {first}");
    // A start whose clock reads on takes its clock's time, as before.
    let mut again = restart(r.drain_dirty());
    again.set_boot_clock(at(160_000));
    let third = again.poll_transmit(at(160_000)).expect("a SyncUp").boot;
    assert_eq!(third, at(160_000).as_unix_nanos());
}
