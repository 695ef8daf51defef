use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use allot_core::ids::RegionId;
use allot_core::limit::LimitSpec;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder,
};
use tempfile::TempDir;

use super::disk::{Disk, MetaKey};
use super::{LogStore, StateMachineStore, open};
use crate::state::{ClusterCommand, ClusterState, CommandOutcome};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// A fresh store in its own temporary directory (removed when the guard drops).
struct TempStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = TempDir::new().expect("temporary directory");
        let (log, sm) = open(dir.path()).expect("open a fresh store");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    if let Err(e) = Suite::test_all(TempStore) {
        panic!("openraft's storage suite failed: {e}");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("test runtime")
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entry(term: u64, index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload,
    }
}

fn membership() -> Membership<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("127.0.0.1:{}", 7000 + id))))
        .collect();
    let voters: BTreeSet<u64> = nodes.keys().copied().collect();
    Membership::new(vec![voters], nodes)
}

/// A membership entry, two regions, one limit: the log of a cluster that just started.
fn first_entries() -> Vec<Entry> {
    let cmd = |c| EntryPayload::Normal(c);
    vec![
        entry(1, 1, EntryPayload::Membership(membership())),
        entry(
            1,
            2,
            cmd(ClusterCommand::AddRegion {
                region: RegionId::new("eu"),
                weight_ppm: None,
            }),
        ),
        entry(
            1,
            3,
            cmd(ClusterCommand::AddRegion {
                region: RegionId::new("us"),
                weight_ppm: None,
            }),
        ),
        entry(
            1,
            4,
            cmd(ClusterCommand::PutLimits {
                version: 7,
                limits: vec![LimitSpec::simple("api", 900, Duration::from_secs(60))],
            }),
        ),
    ]
}

fn expected_state() -> ClusterState {
    let mut state = ClusterState::default();
    for e in first_entries() {
        if let EntryPayload::Normal(cmd) = e.payload {
            state.apply(cmd).expect("invariant holds");
        }
    }
    state
}

#[test]
fn a_restart_recovers_the_vote_the_log_and_the_applied_state() {
    let dir = TempDir::new().expect("temporary directory");
    let rt = runtime();
    let vote = Vote::new_committed(2, 1);
    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path()).expect("open");
        log.save_vote(&vote).await.expect("vote");
        log.blocking_append(first_entries()).await.expect("append");
        log.save_committed(Some(log_id(1, 4)))
            .await
            .expect("commit");
        // The first three entries are applied and snapshotted; the fourth only committed.
        let outcomes = sm.apply(first_entries().into_iter().take(3)).await;
        assert!(outcomes.is_ok());
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        let outcomes = sm.apply(first_entries().into_iter().skip(3)).await;
        let outcomes = outcomes.expect("apply");
        assert_eq!(outcomes.len(), 1);
        assert_eq!(outcomes[0].configured_version(), Some(7));
    });
    let rt = runtime();
    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path()).expect("reopen");
        assert_eq!(log.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            log.read_committed().await.expect("committed"),
            Some(log_id(1, 4))
        );
        let state = log.get_log_state().await.expect("log state");
        assert_eq!(state.last_log_id, Some(log_id(1, 4)));
        let entries = log.try_get_log_entries(1..5).await.expect("entries");
        assert_eq!(entries, first_entries());
        // The state machine restarts at its snapshot; openraft reapplies entry 4 from the log
        // (as it does at start from the committed id), which gives back the state before.
        let (applied, members) = sm.applied_state().await.expect("applied");
        assert_eq!(applied, Some(log_id(1, 3)));
        assert_eq!(members.membership(), &membership());
        sm.apply(entries.into_iter().skip(3))
            .await
            .expect("reapply");
        sm.reader().read(|a| assert_eq!(a.state, expected_state()));
    });
}

#[test]
fn a_snapshot_round_trips_to_another_node_and_survives_its_restart() {
    let leader_dir = TempDir::new().expect("temporary directory");
    let follower_dir = TempDir::new().expect("temporary directory");
    let rt = runtime();
    rt.block_on(async {
        let (_, mut leader) = open(leader_dir.path()).expect("open");
        leader.apply(first_entries()).await.expect("apply");
        let built = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        let (_, mut follower) = open(follower_dir.path()).expect("open");
        let mut receiving = follower.begin_receiving_snapshot().await.expect("begin");
        *receiving = *built.snapshot;
        follower
            .install_snapshot(&built.meta, receiving)
            .await
            .expect("install");
        follower
            .reader()
            .read(|a| assert_eq!(a.state, expected_state()));
        let current = follower.get_current_snapshot().await.expect("current");
        assert_eq!(current.map(|s| s.meta), Some(built.meta.clone()));
    });
    let (_, follower) = open(follower_dir.path()).expect("reopen");
    follower.reader().read(|a| {
        assert_eq!(a.state, expected_state());
        assert_eq!(a.last_applied, Some(log_id(1, 4)));
    });
}

#[test]
fn an_older_snapshot_never_replaces_a_newer_one() {
    let dir = TempDir::new().expect("temporary directory");
    let rt = runtime();
    rt.block_on(async {
        let (_, mut sm) = open(dir.path()).expect("open");
        sm.apply(first_entries().into_iter().take(2))
            .await
            .expect("apply");
        let mut older = sm.get_snapshot_builder().await;
        sm.apply(first_entries().into_iter().skip(2))
            .await
            .expect("apply");
        let newer = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        older.build_snapshot().await.expect("older snapshot");
        let current = sm.get_current_snapshot().await.expect("current");
        assert_eq!(current.map(|s| s.meta), Some(newer.meta));
    });
}

#[test]
fn corrupt_records_are_errors_not_panics() {
    let dir = TempDir::new().expect("temporary directory");
    let rt = runtime();
    rt.block_on(async {
        let (mut log, mut sm) = open(dir.path()).expect("open");
        log.blocking_append(first_entries()).await.expect("append");
        sm.apply(first_entries()).await.expect("apply");
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
    });
    {
        let disk = Disk::open(dir.path()).expect("open");
        let log = disk.raw_tree("log");
        // A record of an unknown format, one cut short, and one under the wrong index.
        log.insert(2u64.to_be_bytes(), vec![0x7f, 1, 2])
            .expect("insert");
        let whole = log.get(3u64.to_be_bytes()).expect("get").expect("entry 3");
        log.insert(3u64.to_be_bytes(), &whole[..whole.len() / 2])
            .expect("insert");
        log.insert(5u64.to_be_bytes(), whole).expect("insert");
        disk.raw_tree("meta")
            .insert("vote", vec![0x01])
            .expect("insert");
        disk.raw_tree("snapshot")
            .insert("current", vec![0x01, 0xff])
            .expect("insert");
        disk.raw_flush();
    }
    let err = open(dir.path()).expect_err("a corrupt snapshot does not open");
    assert!(err.to_string().contains("corrupt snapshot"), "{err}");
    let disk = Disk::open(dir.path()).expect("open");
    let mut log = LogStore::new(disk.clone());
    rt.block_on(async {
        for index in [2, 3, 5] {
            let err = log.try_get_log_entries(index..=index).await;
            assert!(err.is_err(), "entry {index} read as {err:?}");
        }
        assert!(log.try_get_log_entries(1..2).await.is_ok());
        assert!(
            log.get_log_state().await.is_err(),
            "last entry is misplaced"
        );
        assert!(log.read_vote().await.is_err());
    });
    assert!(disk.get_meta::<Vote>(MetaKey::Vote).is_err());
}

#[test]
fn a_snapshot_with_a_damaged_table_is_refused_not_installed() {
    let dir = TempDir::new().expect("temporary directory");
    let mut state = expected_state();
    let release = allot_core::rebalance::TableCommand::RequestRelease {
        counter: allot_core::sync::CounterRef {
            limit: allot_core::ids::LimitId::new("api"),
            key: allot_core::ids::KeyId::new("k"),
            window: allot_core::time::WindowIndex(1),
        },
        region: RegionId::new("us"),
        expected_epoch: allot_core::ids::Epoch(0),
        units: 10,
    };
    let outcome = state.apply(ClusterCommand::Round(vec![release]));
    assert!(matches!(outcome, Ok(CommandOutcome::Round(_))));
    assert_eq!(state.table().row_count(), 1);
    let mut data = super::state_machine::encode_state(&state).expect("encode");
    // The table comes first, after the format byte; its row count is the field before the
    // last two (the removed regions and the recorded versions, none here: one byte each):
    // one varint byte here.
    let table_len = postcard::to_stdvec(state.table()).expect("encode").len();
    assert_eq!(data[table_len], 0);
    assert_eq!(data[table_len - 1], 0);
    assert_eq!(data[table_len - 2], 1);
    data[table_len - 2] = 5;
    let meta = crate::types::SnapshotMeta {
        last_log_id: Some(log_id(1, 9)),
        last_membership: Default::default(),
        snapshot_id: "damaged".to_string(),
    };
    runtime().block_on(async {
        let (_, mut sm) = open(dir.path()).expect("open");
        let installed = sm
            .install_snapshot(&meta, Box::new(std::io::Cursor::new(data)))
            .await;
        let err = installed.expect_err("a damaged snapshot is refused");
        assert!(err.to_string().contains("1 rows, counted as 5"), "{err}");
        assert_eq!(sm.applied_state().await.expect("applied").0, None);
        assert!(sm.get_current_snapshot().await.expect("read").is_none());
    });
}

/// The table as written before it kept removed regions: with none removed, its layout less
/// the last field (an empty map, one byte).
fn table_before_removals(state: &ClusterState) -> Vec<u8> {
    assert!(state.table().removed().is_empty());
    let mut table = table_before_records(state);
    assert_eq!(table.pop(), Some(0));
    table
}

/// The table of `state`, which records no region's version, in the layout before records
/// (postcard writes an empty map as one 0 byte, the last field last).
fn table_before_records(state: &ClusterState) -> Vec<u8> {
    let mut table = postcard::to_stdvec(state.table()).expect("encode");
    assert_eq!(table.pop(), Some(0));
    table
}

/// Installs a snapshot of `data` and returns the state that comes back after a reopen.
fn install_and_reopen(data: Vec<u8>) -> ClusterState {
    let dir = TempDir::new().expect("temporary directory");
    let meta = crate::types::SnapshotMeta {
        last_log_id: Some(log_id(1, 9)),
        last_membership: Default::default(),
        snapshot_id: "old-format".to_string(),
    };
    runtime().block_on(async {
        let (_, mut sm) = open(dir.path()).expect("open");
        sm.install_snapshot(&meta, Box::new(std::io::Cursor::new(data)))
            .await
            .expect("an old format snapshot installs");
        let (last, _) = sm.applied_state().await.expect("applied");
        assert_eq!(last, Some(log_id(1, 9)));
    });
    let (_, sm) = open(dir.path()).expect("reopen");
    sm.reader().read(|a| a.state.clone())
}

/// Snapshots written before the state kept its configuration's files (format 1) still
/// install: the state comes back whole, with no files.
#[test]
fn a_format_1_snapshot_state_still_installs() {
    let state = expected_state();
    let rest = (state.limits(), state.regions(), state.clocks());
    let mut data = vec![crate::codec::FORMAT_V1];
    data.extend(table_before_removals(&state));
    data.extend(postcard::to_stdvec(&rest).expect("encode"));
    let installed = install_and_reopen(data);
    assert_eq!(installed, state);
    assert_eq!(installed.config_files(), None);
}

/// Snapshots written before the table kept removed regions (format 2) still install, with
/// none removed.
#[test]
fn a_format_2_snapshot_state_still_installs() {
    let state = expected_state();
    let files = allot_core::sync::ConfigFiles {
        version: 7,
        merge_domains: false,
        files: Vec::new(),
    };
    let rest = (
        state.limits(),
        state.regions(),
        state.clocks(),
        Some(&files),
    );
    let mut data = vec![crate::codec::FORMAT_V2];
    data.extend(table_before_removals(&state));
    data.extend(postcard::to_stdvec(&rest).expect("encode"));
    let installed = install_and_reopen(data);
    assert_eq!(installed.table(), state.table());
    assert_eq!(installed.regions(), state.regions());
    assert_eq!(installed.config_files().map(|f| f.files.len()), Some(0));
}

/// Snapshots written before the clock samples named their clock (format 3) still install,
/// with no clock source: a new leader then carries no recorded sample over.
#[test]
fn a_format_3_snapshot_state_still_installs() {
    let state = expected_state();
    let files: Option<allot_core::sync::ConfigFiles> = None;
    let layout = (state.limits(), state.regions(), state.clocks(), files);
    let mut data = vec![crate::codec::FORMAT_V3];
    data.extend(table_before_records(&state));
    data.extend(postcard::to_stdvec(&layout).expect("encode"));
    let installed = install_and_reopen(data);
    assert_eq!(installed.table(), state.table());
    assert_eq!(installed.regions(), state.regions());
    assert_eq!(installed.clock_source(), None);
}

/// Snapshots written before the table recorded the regions' versions (format 4) still
/// install, with none recorded: a leader then treats a region it has not heard as on an
/// unknown version once the table is past version 1 (docs/bound.md, reload).
#[test]
fn a_format_4_snapshot_state_still_installs() {
    let state = expected_state();
    let files: Option<allot_core::sync::ConfigFiles> = None;
    let layout = (
        state.limits(),
        state.regions(),
        state.clocks(),
        files,
        state.clock_source(),
    );
    let mut data = vec![crate::codec::FORMAT_V4];
    data.extend(table_before_records(&state));
    data.extend(postcard::to_stdvec(&layout).expect("encode"));
    let installed = install_and_reopen(data);
    assert_eq!(installed, state);
}

/// Snapshots written before the state kept the regions' boots (format 5) still install, with
/// none kept: the next leader then knows a region's boots from its messages alone, as before.
#[test]
fn a_format_5_snapshot_state_still_installs() {
    let state = expected_state();
    let files: Option<allot_core::sync::ConfigFiles> = None;
    let layout = (
        state.table(),
        state.limits(),
        state.regions(),
        state.clocks(),
        files,
        state.clock_source(),
    );
    let mut data = vec![crate::codec::FORMAT_V5];
    data.extend(postcard::to_stdvec(&layout).expect("encode"));
    let installed = install_and_reopen(data);
    assert_eq!(installed, state);
}

/// The regions' boots survive a snapshot and a reopen.
#[test]
fn recorded_boots_survive_a_snapshot() {
    let mut state = expected_state();
    let boots = allot_core::rebalance::RegionBoots {
        region: RegionId::new("eu"),
        boot: 17,
        retired: vec![40, 30],
        restored: true,
    };
    let cmd = ClusterCommand::RecordBoots {
        leader_term: 3,
        boots: vec![boots.clone()],
    };
    state.apply(cmd).expect("invariant holds");
    let data = crate::store::state_machine::encode_state(&state).expect("encode");
    let installed = install_and_reopen(data);
    assert_eq!(installed, state);
    let kept = installed.boots().get(&RegionId::new("eu")).expect("kept");
    assert_eq!((kept.leader_term, &kept.boots), (3, &boots));
}
