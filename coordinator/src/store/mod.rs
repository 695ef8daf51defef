//! Raft storage of one coordinator node: openraft 0.9's storage-v2 pair over one sled
//! database in the node's data directory.
//!
//! - [`LogStore`] (`RaftLogStorage`, `RaftLogReader`): the log, the vote, the committed and
//!   purged log ids. Entries, votes, truncations and purges are flushed before openraft is told
//!   they are durable.
//! - [`StateMachineStore`] (`RaftStateMachine`) and its [`SnapshotBuilder`]: the
//!   [`crate::state::ClusterState`] in memory, persisted as snapshots; a restart loads the last
//!   snapshot and openraft reapplies the committed log after it.
//!
//! Records are postcard behind a format byte ([`crate::codec`]). A record that does not decode is a
//! [`crate::Error::Corrupt`], handed to openraft as a `StorageError` (which stops the node),
//! never a panic. Only [`disk`] knows sled.

mod disk;
mod log;
mod state_machine;

#[cfg(test)]
mod tests;

use std::path::Path;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

pub use log::LogStore;
pub use state_machine::{Applied, SnapshotBuilder, StateMachineStore, StateReader};

use crate::error::{Error, Result};
use crate::types::{NodeId, StorageError};

/// Opens (or creates) the node's raft storage in `dir`.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore)> {
    let disk = disk::Disk::open(dir)?;
    let state_machine = StateMachineStore::open(disk.clone())?;
    Ok((LogStore::new(disk), state_machine))
}

/// Turns the crate's error into openraft's, naming what was being read or written.
fn storage_error(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
) -> impl FnOnce(Error) -> StorageError {
    move |e| StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}
