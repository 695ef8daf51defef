//! The state machine side: openraft's `RaftStateMachine` and `RaftSnapshotBuilder` over the
//! in-memory [`ClusterState`] and the snapshot record of [`Disk`].
//!
//! The state lives in memory and reaches the disk as snapshots (openraft's "persistent
//! snapshot" choice): `apply` writes nothing, a snapshot is the whole state with the last
//! applied log id and membership in one record, flushed before it is reported built or
//! installed. After a restart the state is the last snapshot's, and openraft reapplies the
//! committed entries after it from the log (the log keeps them: it is purged only up to a
//! snapshot). Serialising the whole table on every apply would cost each round the size of
//! the table instead of the size of the round.

use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};

use super::disk::{Disk, StoredSnapshot};
use super::storage_error;
use crate::codec::{
    FORMAT_V1, FORMAT_V2, FORMAT_V3, FORMAT_V4, FORMAT_V5, FORMAT_V6, decode_body, encode_as,
    split_format, unknown_format,
};
use crate::error::Error;
use crate::state::{
    ClusterState, ClusterStateV1, ClusterStateV2, ClusterStateV3, ClusterStateV4, ClusterStateV5,
    CommandOutcome,
};
use crate::types::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

/// What has been applied: the state and the raft position it stands at.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub state: ClusterState,
}

/// A read handle to the applied state, for the driver (answers, status) beside raft.
#[derive(Clone, Debug)]
pub struct StateReader {
    applied: Arc<RwLock<Applied>>,
}

impl StateReader {
    /// Reads the applied state under a short lock (do not block inside `f`).
    pub fn read<R>(&self, f: impl FnOnce(&Applied) -> R) -> R {
        f(&read_lock(&self.applied))
    }
}

/// The state machine of one node.
#[derive(Debug)]
pub struct StateMachineStore {
    disk: Disk,
    applied: Arc<RwLock<Applied>>,
    /// Tells snapshots built from the same log id apart (ids name a transfer, not a state).
    snapshots_built: u64,
}

impl StateMachineStore {
    /// The state of the last stored snapshot, or the empty state.
    pub(super) fn open(disk: Disk) -> Result<StateMachineStore, Error> {
        let applied = match disk.snapshot()? {
            Some(snap) => Applied {
                last_applied: snap.meta.last_log_id,
                membership: snap.meta.last_membership.clone(),
                state: decode_state(&snap.data)?,
            },
            None => Applied::default(),
        };
        Ok(StateMachineStore {
            disk,
            applied: Arc::new(RwLock::new(applied)),
            snapshots_built: 0,
        })
    }

    pub fn reader(&self) -> StateReader {
        StateReader {
            applied: Arc::clone(&self.applied),
        }
    }
}

/// Decodes a snapshot's state and checks the table's invariant before anything uses it.
fn decode_state(data: &[u8]) -> Result<ClusterState, Error> {
    const WHAT: &str = "snapshot state";
    let state: ClusterState = match split_format(WHAT, data)? {
        (FORMAT_V6, body) => decode_body(WHAT, body)?,
        (FORMAT_V5, body) => decode_body::<ClusterStateV5>(WHAT, body)?.into(),
        (FORMAT_V4, body) => decode_body::<ClusterStateV4>(WHAT, body)?.into(),
        (FORMAT_V3, body) => decode_body::<ClusterStateV3>(WHAT, body)?.into(),
        (FORMAT_V2, body) => decode_body::<ClusterStateV2>(WHAT, body)?.into(),
        (FORMAT_V1, body) => decode_body::<ClusterStateV1>(WHAT, body)?.into(),
        (format, _) => return Err(unknown_format(WHAT, format)),
    };
    // `check_invariants` asserts the row count (a bug in the table, where it is kept); in a
    // decoded record a wrong count is damage, so it is checked first and reported as such.
    let rows: usize = state.table().counters().map(|(_, rows)| rows.len()).sum();
    if rows != state.table().row_count() {
        return Err(Error::corrupt(
            "snapshot state",
            format!("{rows} rows, counted as {}", state.table().row_count()),
        ));
    }
    state
        .table()
        .check_invariants()
        .map_err(|reason| Error::Invariant { reason })?;
    Ok(state)
}

/// The state as a snapshot carries it (format 6).
pub(crate) fn encode_state(state: &ClusterState) -> Result<Vec<u8>, Error> {
    encode_as(FORMAT_V6, "snapshot state", state)
}

fn read_lock(lock: &RwLock<Applied>) -> RwLockReadGuard<'_, Applied> {
    // Writers replace whole fields or fail before touching them (a failed apply stops the
    // node), so a poisoned lock still guards consistent data.
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock(lock: &RwLock<Applied>) -> RwLockWriteGuard<'_, Applied> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

/// A copy of the applied state taken when openraft asks for a snapshot, encoded and stored
/// by [`RaftSnapshotBuilder::build_snapshot`] while the state machine goes on applying.
pub struct SnapshotBuilder {
    disk: Disk,
    applied: Applied,
    snapshot_id: String,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let write = storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write);
        let data = encode_state(&self.applied.state).map_err(write)?;
        let meta = SnapshotMeta {
            last_log_id: self.applied.last_applied,
            last_membership: self.applied.membership.clone(),
            snapshot_id: self.snapshot_id.clone(),
        };
        let stored = StoredSnapshot { meta, data };
        let signature = Some(stored.meta.signature());
        let write = || storage_error(ErrorSubject::Snapshot(signature.clone()), ErrorVerb::Write);
        self.disk.replace_snapshot(&stored).map_err(write())?;
        self.disk.flush().await.map_err(write())?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = read_lock(&self.applied);
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = write_lock(&self.applied);
        let mut outcomes = Vec::new();
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => CommandOutcome::Raft,
                EntryPayload::Normal(cmd) => applied.state.apply(cmd).map_err(storage_error(
                    ErrorSubject::Apply(entry.log_id),
                    ErrorVerb::Write,
                ))?,
                EntryPayload::Membership(m) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), m);
                    CommandOutcome::Raft
                }
            };
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshots_built += 1;
        let applied = read_lock(&self.applied).clone();
        let snapshot_id = match applied.last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, self.snapshots_built),
            None => format!("--{}", self.snapshots_built),
        };
        SnapshotBuilder {
            disk: self.disk.clone(),
            applied,
            snapshot_id,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let signature = Some(meta.signature());
        let read = storage_error(ErrorSubject::Snapshot(signature.clone()), ErrorVerb::Read);
        let data = snapshot.into_inner();
        let state = decode_state(&data).map_err(read)?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        let write = || storage_error(ErrorSubject::Snapshot(signature.clone()), ErrorVerb::Write);
        self.disk.replace_snapshot(&stored).map_err(write())?;
        self.disk.flush().await.map_err(write())?;
        *write_lock(&self.applied) = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let stored = self
            .disk
            .snapshot()
            .map_err(storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Read))?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
