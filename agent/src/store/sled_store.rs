//! The sled-backed store: records in a sled tree, behind a write-ahead log ([`super::wal`])
//! because sled 0.34 buffers writes in user space until it flushes.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use allot_core::budget::PersistRecord;

use super::keyed::{self, Scan};
use super::wal::Wal;
use super::{Durability, Store};
use crate::error::{Error, Result};

pub struct SledStore {
    db: sled::Db,
    /// Held across the log append and the tree update, so that a checkpoint (which rotates
    /// the log under it, then flushes the tree) never deletes a log file whose last batch is
    /// not yet in the tree it flushed.
    wal: Mutex<Wal>,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (or creates) the store in `dir`: replays the log left by the last run into the
    /// tree, flushes the tree, and starts a fresh log.
    pub fn open(dir: &Path, durability: Durability) -> Result<SledStore> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let db = sled::Config::new()
            .path(dir.join("sled"))
            // The agent flushes at its own checkpoints; the log covers the time between.
            .flush_every_ms(None)
            .open()?;
        let sync = durability == Durability::Sync;
        let (wal, replayed) = Wal::open(&dir.join("wal"), sync, |batch| apply(&db, &batch))?;
        db.flush()?;
        replayed.remove()?;
        Ok(SledStore {
            db,
            wal: Mutex::new(wal),
        })
    }

    fn wal(&self) -> MutexGuard<'_, Wal> {
        // The log is only appended to under the lock; a panic elsewhere leaves it whole.
        self.wal.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for SledStore {
    fn write(&self, batch: &[PersistRecord]) -> Result<()> {
        let mut wal = self.wal();
        wal.append(batch)?;
        apply(&self.db, batch)
    }

    fn checkpoint(&self) -> Result<()> {
        let rotated = self.wal().rotate()?;
        self.db.flush()?;
        rotated.remove()
    }

    fn load(&self) -> Result<Vec<PersistRecord>> {
        keyed::load(&Tree(&self.db))
    }
}

/// Applies a batch to the tree, record by record. No sled batch is needed for atomicity: until
/// the next checkpoint the log holds the whole batch, and a replay after a crash applies it
/// again over whatever part of it sled had kept.
fn apply(db: &sled::Db, batch: &[PersistRecord]) -> Result<()> {
    keyed::apply(&mut Tree(db), batch)
}

impl keyed::Kv for Tree<'_> {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<()> {
        self.0.insert(key, value)?;
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.0.remove(key)?;
        Ok(())
    }
}

/// The tree, as the keyed layer reads and writes it.
struct Tree<'a>(&'a sled::Db);

impl Scan for Tree<'_> {
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0
            .scan_prefix(prefix)
            .map(|kv| {
                let (k, v) = kv?;
                Ok((k.to_vec(), v.to_vec()))
            })
            .collect()
    }
}
