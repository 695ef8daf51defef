//! One conformance suite, run against every store: what the budget machine writes comes back
//! exactly (the restored machine's snapshot equals the original's), tombstones delete, a reset
//! clears, a removed limit takes its keys, leases and slots with it, and none of it depends on
//! when the store was reopened. Then the sled store's own promises: its log is replayed after
//! a crash, a torn last write is dropped, and a batch written in `buffered` mode survives
//! SIGKILL (while sled alone, unflushed, does not).

use std::time::Duration;

use allot_core::budget::{
    AcquireRequest, BudgetConfig, LeaseOutcome, LeaseRequest, PersistRecord, RegionBudget,
    RestoreStart, SlotOutcome,
};
use allot_core::ids::{KeyId, LimitId, RegionId, RequestId};
use allot_core::limit::{ConcurrencyCap, LimitSpec};
use allot_core::time::Timestamp;

use super::{Durability, MemoryStore, SledStore, Store};

/// Opens the store under test on the same durable state each time.
trait Opener {
    fn open(&mut self) -> Box<dyn Store>;
}

struct Memory(MemoryStore);

impl Opener for Memory {
    fn open(&mut self) -> Box<dyn Store> {
        Box::new(self.0.reopen())
    }
}

struct Sled(tempfile::TempDir, Durability);

impl Opener for Sled {
    fn open(&mut self) -> Box<dyn Store> {
        Box::new(open_after_drop(self.0.path(), self.1))
    }
}

/// Opens a sled store in a directory a store (or a bare sled tree) of this process has just
/// dropped. Sled's background threads of the dropped one hold its file lock for a moment
/// longer (a restarted agent is a new process, whose lock the old one's exit released):
/// retry that one error briefly.
fn open_after_drop(dir: &std::path::Path, durability: Durability) -> SledStore {
    let mut tries = 0;
    loop {
        match SledStore::open(dir, durability) {
            Ok(store) => return store,
            Err(e) if tries < 200 && e.to_string().contains("could not acquire lock") => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("sled store opens: {e}"),
        }
    }
}

fn cfg() -> BudgetConfig {
    BudgetConfig::single_region(RegionId::from("r1"))
}

fn limits() -> Vec<LimitSpec> {
    let mut slots = LimitSpec::simple("api/slots", 1_000, Duration::from_secs(60));
    slots.concurrency = Some(ConcurrencyCap {
        max_slots: 2,
        slot_ttl: Duration::from_secs(10),
    });
    vec![
        LimitSpec::simple("api/tenant", 100, Duration::from_secs(60)),
        slots,
    ]
}

const T0: Timestamp = Timestamp::from_unix_millis(1_700_000_000_000);

fn at(ms: u64) -> Timestamp {
    T0 + Duration::from_millis(ms)
}

fn acquire(key: &str, cost: u64, id: Option<u128>) -> AcquireRequest {
    AcquireRequest {
        limit: LimitId::new("api/tenant"),
        key: KeyId::new(key),
        cost_units: cost,
        request_id: id.map(RequestId),
    }
}

fn lease(key: &str, units: u64, ttl_ms: u64) -> LeaseRequest {
    LeaseRequest {
        limit: LimitId::new("api/tenant"),
        key: KeyId::new(key),
        units_wanted: units,
        min_units: 1,
        denied_units: 0,
        rate_units_per_sec: None,
        ttl: Duration::from_millis(ttl_ms),
        request_id: None,
    }
}

fn lease_id(outcome: LeaseOutcome) -> allot_core::ids::LeaseId {
    match outcome {
        LeaseOutcome::Granted(g) => g.lease,
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// Writes what the machine changed since the last call.
fn persist(budget: &mut RegionBudget, store: &dyn Store) {
    store.write(&budget.drain_dirty()).expect("write");
}

fn restored(store: &dyn Store) -> RegionBudget {
    RegionBudget::restore(cfg(), limits(), store.load().expect("load")).expect("restore")
}

/// Drives a machine through every kind of change, persisting after each call and reopening
/// the store now and then; the restored machine must equal the original.
fn restores_what_the_budget_wrote(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let mut store = o.open();
    b.acquire(at(0), acquire("t=a", 5, Some(1)))
        .expect("acquire");
    persist(&mut b, &*store);
    b.acquire(at(1), acquire("t=a", 5, Some(1))).expect("retry");
    b.acquire(at(2), acquire("t=b", 500, None)).expect("denied");
    persist(&mut b, &*store);
    let kept = lease_id(b.lease(at(3), lease("t=a", 10, 30_000)).expect("lease"));
    let released = lease_id(b.lease(at(4), lease("t=b", 7, 30_000)).expect("lease"));
    let expiring = lease_id(b.lease(at(5), lease("t=c", 3, 1_000)).expect("lease"));
    persist(&mut b, &*store);
    drop(store);
    store = o.open();
    b.renew(at(6), kept, Duration::from_secs(40), Some(RequestId(2)))
        .expect("renew");
    b.release(at(7), released, 4, None).expect("release");
    persist(&mut b, &*store);
    let settled = lease_id(b.lease(at(8), lease("t=a", 20, 30_000)).expect("lease"));
    b.settle(at(9), settled, 25, Some(RequestId(3)))
        .expect("settle");
    let slots = LimitId::new("api/slots");
    let slot = match b
        .acquire_slot(at(10), &slots, &KeyId::new("u=1"), None)
        .expect("slot")
    {
        SlotOutcome::Acquired { slot, .. } => slot,
        other => panic!("expected a slot, got {other:?}"),
    };
    b.acquire_slot(at(11), &slots, &KeyId::new("u=1"), None)
        .expect("slot");
    b.release_slot(at(12), slot).expect("release slot");
    persist(&mut b, &*store);
    // The short lease expires (spent), in the timeout sweep.
    b.handle_timeout(at(2_000));
    persist(&mut b, &*store);
    drop(store);
    let store = o.open();
    let back = restored(&*store);
    assert_eq!(back.snapshot(), b.snapshot());
    assert_eq!(back.lease_count(), 1, "only the renewed lease is left");
    let _ = expiring;
}

fn tombstones_and_removed_limits_leave_nothing_behind(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let store = o.open();
    lease_id(b.lease(at(0), lease("t=a", 10, 30_000)).expect("lease"));
    let slots = LimitId::new("api/slots");
    b.acquire_slot(at(1), &slots, &KeyId::new("u=1"), None)
        .expect("slot");
    persist(&mut b, &*store);
    // The reload drops `api/tenant`: its key and lease go, the slot limit stays.
    let only_slots: Vec<LimitSpec> = limits().into_iter().skip(1).collect();
    b.set_limits(at(2), only_slots.clone());
    persist(&mut b, &*store);
    let records = store.load().expect("load");
    let names_tenant = |r: &PersistRecord| match r {
        PersistRecord::Key(k) => k.limit.as_str() == "api/tenant",
        PersistRecord::Lease(l) => l.limit.as_str() == "api/tenant",
        _ => false,
    };
    assert!(!records.iter().any(names_tenant), "{records:#?}");
    assert!(
        records
            .iter()
            .any(|r| matches!(r, PersistRecord::Slot(s) if s.limit == slots)),
        "the other limit's slot stays: {records:#?}"
    );
    let back = RegionBudget::restore(cfg(), only_slots, records).expect("restore");
    assert_eq!(back.snapshot(), b.snapshot());
}

fn a_reset_clears_all_but_meta(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let store = o.open();
    b.acquire(at(0), acquire("t=a", 5, None)).expect("acquire");
    b.acquire(at(1), acquire("t=b", 5, None)).expect("acquire");
    persist(&mut b, &*store);
    let snapshot = b.snapshot();
    let meta = snapshot
        .iter()
        .find(|r| matches!(r, PersistRecord::Meta(_)))
        .cloned()
        .expect("meta");
    let key_a = snapshot
        .iter()
        .find(|r| matches!(r, PersistRecord::Key(k) if k.key.as_str() == "t=a"))
        .cloned()
        .expect("key a");
    store.write(std::slice::from_ref(&meta)).expect("write");
    store
        .write(&[PersistRecord::Reset, key_a.clone()])
        .expect("write");
    let mut records = store.load().expect("load");
    records.sort_by_key(|r| format!("{r:?}"));
    let mut expected = vec![meta, key_a];
    expected.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(records, expected);
}

fn checkpoints_and_reopening_keep_everything(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let store = o.open();
    b.acquire(at(0), acquire("t=a", 5, Some(9)))
        .expect("acquire");
    persist(&mut b, &*store);
    store.checkpoint().expect("checkpoint");
    b.acquire(at(1), acquire("t=a", 6, None)).expect("acquire");
    persist(&mut b, &*store);
    store.checkpoint().expect("checkpoint");
    b.acquire(at(2), acquire("t=b", 7, None)).expect("acquire");
    persist(&mut b, &*store);
    drop(store);
    let store = o.open();
    assert_eq!(restored(&*store).snapshot(), b.snapshot());
    // Reopening without writing anything changes nothing either.
    drop(store);
    let store = o.open();
    assert_eq!(restored(&*store).snapshot(), b.snapshot());
}

/// Between two checkpoints an item may be written many times, deleted, and written again
/// after a removed limit swept it; only the order of what reaches the store matters.
fn the_last_state_of_each_item_survives_a_checkpoint(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let store = o.open();
    for ms in 0..5 {
        b.acquire(at(ms), acquire("t=a", 1, None)).expect("acquire");
        persist(&mut b, &*store);
    }
    let ended = lease_id(b.lease(at(5), lease("t=b", 10, 30_000)).expect("lease"));
    persist(&mut b, &*store);
    b.release(at(6), ended, 10, None).expect("release");
    persist(&mut b, &*store);
    // The tenant limit goes (a sweep over its keys), comes back, and is used again: the key
    // written after the sweep must survive it, the one before must not come back.
    let only_slots: Vec<LimitSpec> = limits().into_iter().skip(1).collect();
    b.set_limits(at(7), only_slots);
    persist(&mut b, &*store);
    b.set_limits(at(8), limits());
    b.acquire(at(9), acquire("t=c", 2, None)).expect("acquire");
    persist(&mut b, &*store);
    store.checkpoint().expect("checkpoint");
    drop(store);
    let store = o.open();
    let back = restored(&*store);
    assert_eq!(back.snapshot(), b.snapshot());
    assert_eq!(back.lease_count(), 0, "the released lease stays ended");
}

/// A restored start's wait survives a restart (so the restart waits again), and the closing
/// written once it is answered replaces it: one store key for both.
fn a_restore_wait_survives_reopening_and_its_closing_replaces_it(o: &mut dyn Opener) {
    let coordinated = BudgetConfig {
        coordinated: true,
        ..cfg()
    };
    let mut b = RegionBudget::new(coordinated.clone(), limits()).expect("budget");
    b.start_restored(at(0), RestoreStart::EmptyStore);
    let store = o.open();
    persist(&mut b, &*store);
    store.checkpoint().expect("checkpoint");
    drop(store);
    let store = o.open();
    let back =
        RegionBudget::restore(coordinated, limits(), store.load().expect("load")).expect("restore");
    assert_eq!(back.snapshot(), b.snapshot());
    let waits = |records: &[PersistRecord]| {
        records
            .iter()
            .filter(|r| matches!(r, PersistRecord::RestoreAwaiting { .. }))
            .count()
    };
    assert_eq!(waits(&back.snapshot()), 1, "the restart still waits");
    let closing = PersistRecord::RestoredBefore { before: at(0) };
    store.write(std::slice::from_ref(&closing)).expect("write");
    store.checkpoint().expect("checkpoint");
    drop(store);
    let loaded = o.open().load().expect("load");
    assert_eq!(waits(&loaded), 0, "{loaded:?}");
    assert!(loaded.contains(&closing));
}

/// The configuration version the state was written under comes back with it, the latest
/// one only (one store key): a restart compares the version it starts under with it.
fn the_configuration_version_survives_reopening(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    b.set_config_version(3);
    b.acquire(at(0), acquire("t=a", 5, None)).expect("acquire");
    let store = o.open();
    persist(&mut b, &*store);
    store.checkpoint().expect("checkpoint");
    b.set_config_version(4);
    persist(&mut b, &*store);
    drop(store);
    let store = o.open();
    let loaded = store.load().expect("load");
    let versions: Vec<&PersistRecord> = loaded
        .iter()
        .filter(|r| matches!(r, PersistRecord::ConfigVersion { .. }))
        .collect();
    assert_eq!(versions, [&PersistRecord::ConfigVersion { version: 4 }]);
    let back = restored(&*store);
    assert_eq!(back.config_version(), 4);
    assert_eq!(back.snapshot(), b.snapshot());
}

/// The boot number of the start that wrote the state comes back with it (one store key),
/// so a restart whose clock went back still takes a larger one.
fn the_boot_survives_reopening(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    b.set_boot_clock(at(50_000));
    b.acquire(at(50_000), acquire("t=a", 5, None))
        .expect("acquire");
    let store = o.open();
    persist(&mut b, &*store);
    drop(store);
    let store = o.open();
    let boots: Vec<PersistRecord> = store
        .load()
        .expect("load")
        .into_iter()
        .filter(|r| matches!(r, PersistRecord::Boot { .. }))
        .collect();
    assert_eq!(
        boots,
        [PersistRecord::Boot {
            boot: at(50_000).as_unix_nanos()
        }]
    );
    let mut back = restored(&*store);
    back.set_boot_clock(at(0));
    let boot = back.snapshot().into_iter().find_map(|r| match r {
        PersistRecord::Boot { boot } => Some(boot),
        _ => None,
    });
    assert!(
        boot.is_some_and(|b| b > at(50_000).as_unix_nanos()),
        "{boot:?}"
    );
}

/// The time of the latest change comes back with the state (one store key, the latest
/// written): a restart on a clock stepped back reads on from it.
fn the_time_of_the_latest_change_survives_reopening(o: &mut dyn Opener) {
    let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
    let store = o.open();
    b.acquire(at(50_000), acquire("t=a", 5, None))
        .expect("acquire");
    persist(&mut b, &*store);
    b.acquire(at(52_000), acquire("t=b", 5, None))
        .expect("acquire");
    persist(&mut b, &*store);
    drop(store);
    let store = o.open();
    let times: Vec<PersistRecord> = store
        .load()
        .expect("load")
        .into_iter()
        .filter(|r| matches!(r, PersistRecord::TimeSeen { .. }))
        .collect();
    let latest = PersistRecord::TimeSeen { at: at(52_000) };
    assert_eq!(times.last(), Some(&latest), "{times:?}");
    assert_eq!(restored(&*store).time_floor(), at(52_000));
}

fn an_empty_store_loads_nothing(o: &mut dyn Opener) {
    assert!(o.open().load().expect("load").is_empty());
}

macro_rules! conformance {
    ($store:ident, $opener:expr) => {
        mod $store {
            use super::*;

            #[test]
            fn restores_what_the_budget_wrote() {
                super::restores_what_the_budget_wrote(&mut $opener);
            }

            #[test]
            fn tombstones_and_removed_limits_leave_nothing_behind() {
                super::tombstones_and_removed_limits_leave_nothing_behind(&mut $opener);
            }

            #[test]
            fn a_reset_clears_all_but_meta() {
                super::a_reset_clears_all_but_meta(&mut $opener);
            }

            #[test]
            fn checkpoints_and_reopening_keep_everything() {
                super::checkpoints_and_reopening_keep_everything(&mut $opener);
            }

            #[test]
            fn the_last_state_of_each_item_survives_a_checkpoint() {
                super::the_last_state_of_each_item_survives_a_checkpoint(&mut $opener);
            }

            #[test]
            fn a_restore_wait_survives_reopening_and_its_closing_replaces_it() {
                super::a_restore_wait_survives_reopening_and_its_closing_replaces_it(&mut $opener);
            }

            #[test]
            fn the_configuration_version_survives_reopening() {
                super::the_configuration_version_survives_reopening(&mut $opener);
            }

            #[test]
            fn the_boot_survives_reopening() {
                super::the_boot_survives_reopening(&mut $opener);
            }

            #[test]
            fn the_time_of_the_latest_change_survives_reopening() {
                super::the_time_of_the_latest_change_survives_reopening(&mut $opener);
            }

            #[test]
            fn an_empty_store_loads_nothing() {
                super::an_empty_store_loads_nothing(&mut $opener);
            }
        }
    };
}

fn temp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

conformance!(memory, Memory(MemoryStore::new()));
conformance!(sled_buffered, Sled(temp(), Durability::Buffered));
conformance!(sled_sync, Sled(temp(), Durability::Sync));

mod sled_log {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};

    use super::super::wal::Wal;
    use super::*;

    fn some_records() -> Vec<Vec<PersistRecord>> {
        let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
        // The limits' allocation records of the start: every batch below is then one size.
        b.drain_dirty();
        let mut batches = Vec::new();
        for (i, key) in ["t=a", "t=b", "t=c"].into_iter().enumerate() {
            b.acquire(at(i as u64), acquire(key, 3, None))
                .expect("acquire");
            batches.push(b.drain_dirty());
        }
        batches
    }

    fn write_at(path: &std::path::Path, offset: usize, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("log");
        file.write_all_at(bytes, offset as u64).expect("write");
    }

    /// A segment too small for what is appended rolls over to the next; every frame of every
    /// segment comes back, in order, at the next start.
    #[test]
    fn appends_past_a_segment_continue_in_the_next_and_replay_in_order() {
        let dir = temp();
        let batches = some_records();
        let one_frame = {
            let mut wal = Wal::open_with(
                &dir.path().join("probe"),
                false,
                1 << 20,
                |_| Ok(()),
                || Ok(()),
            )
            .expect("wal");
            wal.append(&batches[0]).expect("append");
            wal.end_offset()
        };
        let wal_dir = dir.path().join("wal");
        {
            // Room for one frame a segment: three appends, three segments.
            let mut wal =
                Wal::open_with(&wal_dir, false, one_frame, |_| Ok(()), || Ok(())).expect("wal");
            for batch in &batches {
                wal.append(batch).expect("append");
            }
            assert_eq!(wal.bytes_since_rotation(), 3 * one_frame as u64);
        }
        let mut replayed = Vec::new();
        Wal::open_with(
            &wal_dir,
            false,
            one_frame,
            |b| {
                replayed.push(b);
                Ok(())
            },
            || Ok(()),
        )
        .expect("reopened");
        assert_eq!(replayed, batches);
    }

    fn log_file(dir: &std::path::Path) -> std::path::PathBuf {
        let wal = dir.join("wal");
        let mut files: Vec<_> = std::fs::read_dir(&wal)
            .expect("wal dir")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        files.pop().expect("a log file")
    }

    /// A data directory from before postcard: log frames (written with `write(2)`, no
    /// preallocation) and tree values in JSON. Both still read, and what is written after is
    /// in the new format beside them.
    #[test]
    fn a_store_written_in_json_by_an_earlier_version_still_loads() {
        let dir = temp();
        let batches = some_records();
        {
            // The tree: the first batch, as the earlier version stored values.
            let db = sled::open(dir.path().join("sled")).expect("sled");
            for record in &batches[0] {
                let key = super::super::keyed::item_key(record).expect("one key");
                db.insert(key, serde_json::to_vec(record).expect("json"))
                    .expect("insert");
            }
            db.flush().expect("flush");
        }
        // The log: the second batch, as one JSON frame in a file of exactly its size.
        let payload = serde_json::to_vec(&batches[1]).expect("json");
        let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        frame.extend_from_slice(&payload);
        let wal = dir.path().join("wal");
        std::fs::create_dir_all(&wal).expect("wal dir");
        std::fs::write(wal.join(format!("{:020}.log", 1)), frame).expect("old log");
        // The tree was opened and dropped just above, in this process.
        let store = open_after_drop(dir.path(), Durability::Buffered);
        store.write(&batches[2]).expect("write");
        let mut b = RegionBudget::new(cfg(), limits()).expect("budget");
        for (i, key) in ["t=a", "t=b", "t=c"].into_iter().enumerate() {
            b.acquire(at(i as u64), acquire(key, 3, None))
                .expect("acquire");
        }
        let back =
            RegionBudget::restore(cfg(), limits(), store.load().expect("load")).expect("restore");
        assert_eq!(back.snapshot(), b.snapshot());
    }

    /// A log written by a process that died before any checkpoint: every complete batch is
    /// replayed, and the torn frame it was writing is dropped.
    #[test]
    fn the_log_is_replayed_and_a_torn_last_write_dropped() {
        let dir = temp();
        let batches = some_records();
        let end = {
            let mut wal =
                Wal::open(&dir.path().join("wal"), false, |_| Ok(()), || Ok(())).expect("wal");
            for batch in &batches[..2] {
                wal.append(batch).expect("append");
            }
            wal.end_offset()
        };
        // The first bytes of a third frame: a length and half a checksum.
        write_at(&log_file(dir.path()), end, &[40, 0, 0, 0, 1, 2]);
        let store = SledStore::open(dir.path(), Durability::Buffered).expect("open");
        let keys: Vec<String> = store
            .load()
            .expect("load")
            .into_iter()
            .filter_map(|r| match r {
                PersistRecord::Key(k) => Some(k.key.as_str().to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(keys, ["t=a", "t=b"]);
    }

    /// A start that stops after replaying a log whose last write was torn, before the replayed
    /// files are gone (it dies, or flushing the tree fails). Before the fix the start created
    /// its fresh segment first, so the torn frame was no longer in the last segment and every
    /// later start failed with "00000000000000000001.log: damaged log frame at byte 74" (the
    /// store would not open again); now the next start opens and keeps every complete batch.
    /// (`crash_sweep` kills a real start at each of its steps.)
    #[test]
    fn a_start_that_dies_before_removing_a_torn_log_leaves_a_store_that_opens() {
        let dir = temp();
        let batches = some_records();
        let end = {
            let mut wal =
                Wal::open(&dir.path().join("wal"), false, |_| Ok(()), || Ok(())).expect("wal");
            for batch in &batches[..2] {
                wal.append(batch).expect("append");
            }
            wal.end_offset()
        };
        write_at(&log_file(dir.path()), end, &[40, 0, 0, 0, 1, 2]);
        // The start replays, and fails before its replayed files are gone.
        let stopped = Wal::open(
            &dir.path().join("wal"),
            false,
            |_| Ok(()),
            || {
                Err(crate::error::Error::Corrupt(
                    "the tree's flush failed".into(),
                ))
            },
        );
        assert!(stopped.is_err());
        let store = SledStore::open(dir.path(), Durability::Buffered).expect("opens");
        let keys: Vec<String> = store
            .load()
            .expect("load")
            .into_iter()
            .filter_map(|r| match r {
                PersistRecord::Key(k) => Some(k.key.as_str().to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(keys, ["t=a", "t=b"]);
    }

    #[test]
    fn a_damaged_frame_before_the_end_of_the_log_is_an_error() {
        let dir = temp();
        let batches = some_records();
        let first_end = {
            let mut wal =
                Wal::open(&dir.path().join("wal"), false, |_| Ok(()), || Ok(())).expect("wal");
            wal.append(&batches[0]).expect("append");
            let end = wal.end_offset();
            wal.rotate().expect("rotate");
            wal.append(&batches[1]).expect("append");
            end
        };
        // The older segment's one frame loses a byte of its payload.
        let older = dir.path().join("wal").join(format!("{:020}.log", 1));
        let mut bytes = std::fs::read(&older).expect("read");
        bytes[first_end - 2] ^= 0xff;
        std::fs::write(&older, bytes).expect("damage");
        let err = SledStore::open(dir.path(), Durability::Buffered).expect_err("damaged");
        assert!(err.to_string().contains("damaged log frame"), "{err}");
    }

    const WRITTEN: &str = "child-wrote-its-records";

    /// Runs this test binary again as a child that writes and then waits to be killed.
    fn write_then_get_killed(role: &str, dir: &std::path::Path) {
        let exe = std::env::current_exe().expect("test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "store::tests::sled_log::killed_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ALLOT_TEST_KILLED_CHILD", role)
            .env("ALLOT_TEST_KILLED_DIR", dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("child starts");
        let stdout = child.stdout.take().expect("stdout");
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
            .any(|l| l.ends_with(WRITTEN));
        assert!(ready, "the child wrote its records");
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    /// The child side of [`write_then_get_killed`]; does nothing when run on its own.
    #[test]
    #[ignore = "run as a child process by the SIGKILL tests"]
    fn killed_child() {
        let (Ok(role), Ok(dir)) = (
            std::env::var("ALLOT_TEST_KILLED_CHILD"),
            std::env::var("ALLOT_TEST_KILLED_DIR"),
        ) else {
            return;
        };
        let dir = std::path::PathBuf::from(dir);
        let batch = some_records().remove(0);
        // Kept alive (not dropped: dropping would flush) until the parent kills the process.
        let _keep: Box<dyn std::any::Any> = match role.as_str() {
            "sled" => {
                let db = sled::Config::new()
                    .path(dir.join("raw"))
                    .flush_every_ms(None)
                    .open()
                    .expect("sled");
                db.insert(b"k", b"v".as_slice()).expect("insert");
                Box::new(db)
            }
            _ => {
                let store = SledStore::open(&dir, Durability::Buffered).expect("store");
                store.write(&batch).expect("write");
                Box::new(store)
            }
        };
        // libtest has already printed "test <name> ... " on this line.
        println!("{WRITTEN}");
        std::io::stdout().flush().expect("flush stdout");
        std::thread::sleep(Duration::from_secs(60));
    }

    /// Why the store has a log: sled 0.34 keeps an unflushed insert in its own buffers, so a
    /// SIGKILL loses it.
    #[test]
    fn sled_alone_loses_an_unflushed_insert_to_sigkill() {
        let dir = temp();
        write_then_get_killed("sled", dir.path());
        let db = sled::Config::new()
            .path(dir.path().join("raw"))
            .open()
            .expect("reopen");
        assert_eq!(db.get(b"k").expect("get"), None);
    }

    #[test]
    fn a_buffered_write_survives_sigkill() {
        let dir = temp();
        write_then_get_killed("store", dir.path());
        let store = SledStore::open(dir.path(), Durability::Buffered).expect("reopen");
        let expected = some_records().remove(0);
        let loaded = store.load().expect("load");
        for record in expected {
            assert!(loaded.contains(&record), "{record:?} lost: {loaded:#?}");
        }
    }
}

/// The crash-point sweep: a child process (this test binary again) runs the sled store's life
/// (start, admissions persisted before they are acknowledged, segment roll-overs, checkpoints)
/// and is killed at one step of it (`store::crash`); the next start must open the store, and
/// every admission the child acknowledged must still be counted.
///
/// Each case starts from the same data directory: one earlier life that was killed in the
/// middle of an append (its log ends in a torn frame), which the crashing start replays.
/// Before the start was reordered (replay, flush the tree, remove the replayed files, then
/// create the new segment), the first case, `open.replayed@1`, already left a store whose
/// every later start failed ("00000000000000000002.log: damaged log frame at byte 216": the
/// torn frame was no longer in the last segment); now every case opens.
mod crash_sweep {
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::super::crash::CRASH_POINT_ENV;
    use super::*;

    const DIR_ENV: &str = "ALLOT_TEST_CRASH_DIR";
    const LIFE_ENV: &str = "ALLOT_TEST_CRASH_LIFE";
    /// Small segments, so that a life rolls over to new ones between its checkpoints.
    const SEGMENT_BYTES: usize = 4 << 10;
    const KEYS: [&str; 3] = ["t=a", "t=b", "t=c"];
    const ROUNDS: u64 = 3;
    const ADMISSIONS_PER_ROUND: u64 = 60;
    /// The steps a life goes through; each is hit several times (every start replays and
    /// removes, every checkpoint rotates, applies, flushes and removes).
    const POINTS: [&str; 10] = [
        "open.replayed",
        "open.durable",
        "open.removed",
        "open.created",
        "remove.one",
        "segment.flushed",
        "segment.created",
        "checkpoint.rotated",
        "checkpoint.applied",
        "checkpoint.flushed",
    ];
    /// Which hits of each point are tried: the first ones and a later one.
    const HITS: [u32; 3] = [1, 2, 5];

    fn sweep_limits() -> Vec<LimitSpec> {
        vec![LimitSpec::simple(
            "api/tenant",
            1_000_000,
            Duration::from_secs(3_600),
        )]
    }

    /// One life: open, admit, persist, acknowledge (a line in `acks`, after the write
    /// returned), checkpoint after each round. Time moves on between lives.
    fn live(dir: &Path, life: u64) {
        let store = SledStore::open_with(dir, Durability::Buffered, SEGMENT_BYTES).expect("opens");
        let records = store.load().expect("load");
        let mut b = RegionBudget::restore(cfg(), sweep_limits(), records).expect("restore");
        let mut acks = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("acks"))
            .expect("acks");
        for round in 0..ROUNDS {
            for i in 0..ADMISSIONS_PER_ROUND {
                let key = KEYS[(i % 3) as usize];
                let now = at(life * 100_000 + round * 1_000 + i);
                let mut req = acquire(key, 1, None);
                req.limit = LimitId::new("api/tenant");
                let d = b.acquire(now, req).expect("acquire");
                assert!(d.allowed);
                store.write(&b.drain_dirty()).expect("write");
                let granted = counted(&b, key);
                // One write(2): a kill leaves whole lines.
                acks.write_all(format!("{key} {granted}\n").as_bytes())
                    .expect("ack");
            }
            store.checkpoint().expect("checkpoint");
        }
    }

    fn counted(b: &RegionBudget, key: &str) -> u64 {
        b.counter(&LimitId::new("api/tenant"), &KeyId::new(key))
            .map_or(0, |c| c.granted_units)
    }

    /// The child side: runs one life in the directory it is given; nothing on its own.
    #[test]
    #[ignore = "run as a child process by the crash-point sweep"]
    fn crash_child() {
        let (Ok(dir), Ok(life)) = (std::env::var(DIR_ENV), std::env::var(LIFE_ENV)) else {
            return;
        };
        live(Path::new(&dir), life.parse().expect("life"));
    }

    /// Runs one life in a child armed at `point`; returns whether the point was reached (the
    /// child died there) rather than the life ending on its own.
    fn run_child(dir: &Path, life: u64, point: &str) -> bool {
        let exe = std::env::current_exe().expect("test binary");
        let out = Command::new(exe)
            .args([
                "--exact",
                "store::tests::crash_sweep::crash_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_POINT_ENV, point)
            .env(DIR_ENV, dir)
            .env(LIFE_ENV, life.to_string())
            .output()
            .expect("child runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let name = point.split('@').next().unwrap_or(point);
        let crashed = stderr.contains(&format!("crash point {name} reached"));
        assert!(
            crashed || out.status.success(),
            "the child at {point} failed otherwise: {stderr}"
        );
        crashed
    }

    /// The largest count acknowledged per key.
    fn acknowledged(dir: &Path) -> Vec<(String, u64)> {
        let text = std::fs::read_to_string(dir.join("acks")).unwrap_or_default();
        let mut best = std::collections::BTreeMap::<String, u64>::new();
        for line in text.lines() {
            let (key, n) = line.split_once(' ').expect("an ack line");
            let n: u64 = n.parse().expect("a count");
            let e = best.entry(key.to_owned()).or_default();
            *e = (*e).max(n);
        }
        best.into_iter().collect()
    }

    /// The next start opens, and counts at least what was acknowledged.
    fn check_start(dir: &Path, case: &str) {
        let store = SledStore::open_with(dir, Durability::Buffered, SEGMENT_BYTES)
            .unwrap_or_else(|e| panic!("after a crash at {case}, the store does not open: {e}"));
        let records = store.load().expect("load");
        let b = RegionBudget::restore(cfg(), sweep_limits(), records).expect("restore");
        let acked = acknowledged(dir);
        assert!(!acked.is_empty(), "{case}: nothing was acknowledged");
        for (key, n) in acked {
            let have = counted(&b, &key);
            assert!(
                have >= n,
                "after a crash at {case}: {key} counts {have}, {n} were acknowledged"
            );
        }
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("dir");
        for entry in std::fs::read_dir(from).expect("read dir") {
            let entry = entry.expect("entry");
            let target: PathBuf = to.join(entry.file_name());
            if entry.file_type().expect("type").is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).expect("copy");
            }
        }
    }

    #[test]
    fn every_crash_point_leaves_a_store_that_opens_with_nothing_acknowledged_lost() {
        let root = temp();
        // The earlier life, killed half way through an append in its second round.
        let base = root.path().join("base");
        let torn = format!("append.torn@{}", ADMISSIONS_PER_ROUND + 7);
        assert!(run_child(&base, 0, &torn), "the first life tore a write");
        let mut reached = 0;
        for point in POINTS {
            for hit in HITS {
                let case = format!("{point}@{hit}");
                let dir = root.path().join(case.replace(['.', '@'], "-"));
                copy_dir(&base, &dir);
                let crashed = run_child(&dir, 1, &case);
                check_start(&dir, &case);
                // Every point is on the path of a life.
                assert!(crashed || hit > 1, "{point} was never reached");
                if !crashed {
                    break;
                }
                reached += 1;
            }
        }
        assert!(reached > POINTS.len(), "only {reached} crashes happened");
        // A torn write in the crashing life too, and a life that ends on its own.
        for (case, life) in [("append.torn@100", 1), ("none", 1)] {
            let dir = root.path().join(case.replace(['.', '@'], "-"));
            copy_dir(&base, &dir);
            run_child(&dir, life, case);
            check_start(&dir, case);
        }
    }
}
