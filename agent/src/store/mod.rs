//! Durable storage of the budget machine's records: the [`Store`] trait, its sled-backed
//! implementation ([`SledStore`]) and an in-memory one for tests ([`MemoryStore`]).
//!
//! The budget machine hands the agent `PersistRecord`s (`drain_dirty`), each naming one store
//! key: the current state of one item (a key's counters, a lease, a slot, an ack, an
//! idempotency entry) or a tombstone. A store upserts and deletes them in order
//! ([`keyed`] holds that logic, shared by both stores) and gives back everything it holds at
//! start, in an order `RegionBudget::restore` accepts. Only this module knows sled.

mod codec;
mod crash;
mod keyed;
mod legacy;
mod memory;
mod sled_store;
mod wal;

#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets (`fuzz/`), which reach the log's replay from outside
/// the crate. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use std::collections::BTreeMap;
    use std::path::Path;

    use allot_core::budget::PersistRecord;

    use super::{keyed, wal};
    use crate::error::Result;

    /// A start over the log segments in `dir`, as [`super::SledStore::open`] makes it (replay
    /// every frame, apply each batch, remove the replayed files, start a fresh segment of
    /// `segment_bytes`), with the in-memory map [`super::MemoryStore`] keeps in place of the
    /// sled tree; then every record the map holds, as `Store::load` reads them back.
    pub fn replay_log(dir: &Path, segment_bytes: usize) -> Result<Vec<PersistRecord>> {
        let mut map = BTreeMap::new();
        let _wal = wal::Wal::open_with(
            dir,
            false,
            segment_bytes,
            |batch| keyed::apply(&mut map, &batch),
            || Ok(()),
        )?;
        keyed::load(&map)
    }
}

use std::fmt;
use std::str::FromStr;

pub use memory::MemoryStore;
pub use sled_store::SledStore;

use allot_core::budget::PersistRecord;

use crate::error::Result;

/// Where the budget's records live between restarts.
///
/// `write` is called by one writer at a time (the agent's group commit); `checkpoint` may run
/// beside it.
pub trait Store: Send + Sync + 'static {
    /// Applies `batch` in order. When it returns `Ok`, the records survive what the store's
    /// [`Durability`] promises; on `Err` nothing can be assumed about them.
    fn write(&self, batch: &[PersistRecord]) -> Result<()>;

    /// [`Store::write`] of a batch the caller gives up, so that a store keeping records can
    /// take them rather than copy them. On `Err` the batch comes back whole.
    fn write_owned(&self, batch: Vec<PersistRecord>) -> WriteOwned {
        match self.write(&batch) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, batch)),
        }
    }

    /// Makes everything written so far survive a machine crash too (in `buffered` mode,
    /// where `write` does not). Cheap: one device flush of what was appended.
    fn sync(&self) -> Result<()>;

    /// Moves everything written so far into the store's long-term form (the sled tree,
    /// flushed) and drops what it kept only until then (its write-ahead log).
    fn checkpoint(&self) -> Result<()>;

    /// Bytes written since the last checkpoint: what the next start would replay.
    fn log_bytes(&self) -> u64;

    /// Every record held, in an order `RegionBudget::restore` accepts.
    fn load(&self) -> Result<Vec<PersistRecord>>;
}

/// The outcome of [`Store::write_owned`]: on failure, the error and the batch.
pub type WriteOwned = std::result::Result<(), (crate::error::Error, Vec<PersistRecord>)>;

/// What a written batch survives before the next checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Each batch is written to the log and flushed to the device (`fdatasync`) before the
    /// answers that depend on it. Survives a process kill and a machine crash. Concurrent
    /// requests share one flush (group commit).
    Sync,
    /// Each batch is written to the log (handed to the kernel) before the answers that depend
    /// on it; the log is flushed to the device every flush interval. Survives a process kill
    /// (SIGKILL, a panic, the OOM killer); a machine crash loses at most the last flush
    /// interval.
    #[default]
    Buffered,
}

impl Durability {
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Buffered => "buffered",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "sync" => Ok(Durability::Sync),
            "buffered" => Ok(Durability::Buffered),
            other => Err(format!(
                "unknown durability '{other}' (expected sync or buffered)"
            )),
        }
    }
}
