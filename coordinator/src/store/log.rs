//! The raft log and vote: openraft's `RaftLogStorage` over [`Disk`].
//!
//! Writes are serialised by openraft (one call at a time on `&mut self`); readers for the
//! replication streams are clones that only read. Appended entries are readable as soon as
//! `append` stores them and reported durable (`LogFlushed`) only after sled's flush.

use std::fmt::Debug;
use std::ops::RangeBounds;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};

use super::disk::{Disk, MetaKey};
use super::storage_error;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

/// The log store of one node, and (cloned) its log readers.
#[derive(Clone, Debug)]
pub struct LogStore {
    disk: Disk,
}

impl LogStore {
    pub(super) fn new(disk: Disk) -> LogStore {
        LogStore { disk }
    }

    async fn flush(&self, subject: ErrorSubject<u64>) -> Result<(), StorageError> {
        self.disk
            .flush()
            .await
            .map_err(storage_error(subject, ErrorVerb::Write))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.disk
            .entries(range)
            .map_err(storage_error(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let read = storage_error(ErrorSubject::Logs, ErrorVerb::Read);
        let last_purged_log_id: Option<LogId> =
            self.disk.get_meta(MetaKey::Purged).map_err(read)?;
        let last = self
            .disk
            .last_entry()
            .map_err(storage_error(ErrorSubject::Logs, ErrorVerb::Read))?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.map(|e| e.log_id).or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.disk
            .put_meta(MetaKey::Vote, vote)
            .map_err(storage_error(ErrorSubject::Vote, ErrorVerb::Write))?;
        // A vote must be on disk before the node answers with it.
        self.flush(ErrorSubject::Vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.disk
            .get_meta(MetaKey::Vote)
            .map_err(storage_error(ErrorSubject::Vote, ErrorVerb::Read))
    }

    /// Not flushed: a committed id lost in a crash only makes the restart reapply less of the
    /// log at once; the leader commits it again.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.disk
            .put_meta(MetaKey::Committed, &committed)
            .map_err(storage_error(ErrorSubject::Store, ErrorVerb::Write))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let stored: Option<Option<LogId>> = self
            .disk
            .get_meta(MetaKey::Committed)
            .map_err(storage_error(ErrorSubject::Store, ErrorVerb::Read))?;
        Ok(stored.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.disk
            .append(entries)
            .map_err(storage_error(ErrorSubject::Logs, ErrorVerb::Write))?;
        // Durable only once flushed: the callback is what lets the leader count this node.
        match self.disk.flush().await {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.disk
            .remove_entries(log_id.index..)
            .map_err(storage_error(ErrorSubject::Logs, ErrorVerb::Delete))?;
        self.flush(ErrorSubject::Logs).await
    }

    /// Records the purge point first: a crash before the entries are gone leaves entries below
    /// it, which nothing reads, never a hole above it.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.disk
            .put_meta(MetaKey::Purged, &log_id)
            .map_err(storage_error(ErrorSubject::Store, ErrorVerb::Write))?;
        self.flush(ErrorSubject::Store).await?;
        self.disk
            .remove_entries(..=log_id.index)
            .map_err(storage_error(ErrorSubject::Logs, ErrorVerb::Delete))?;
        self.flush(ErrorSubject::Logs).await
    }
}
