//! The sled-backed store: records in a sled tree, behind a write-ahead log ([`super::wal`])
//! because sled 0.34 buffers writes in user space until it flushes.

use std::collections::BTreeMap;
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

/// Applies a batch to the tree atomically: built in an overlay over the tree, then written as
/// one sled batch (a Reset followed by a snapshot must never be half there).
fn apply(db: &sled::Db, batch: &[PersistRecord]) -> Result<()> {
    let mut overlay = Overlay {
        tree: db,
        ops: BTreeMap::new(),
    };
    keyed::apply(&mut overlay, batch)?;
    let mut b = sled::Batch::default();
    for (key, value) in overlay.ops {
        match value {
            Some(v) => b.insert(key, v),
            None => b.remove(key),
        }
    }
    db.apply_batch(b)?;
    Ok(())
}

/// The tree as it will be once the pending operations are applied.
struct Overlay<'a> {
    tree: &'a sled::Db,
    ops: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl keyed::Kv for Overlay<'_> {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.ops.insert(key, Some(value));
    }

    fn delete(&mut self, key: &[u8]) {
        self.ops.insert(key.to_vec(), None);
    }
}

impl Scan for Overlay<'_> {
    fn scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> =
            Tree(self.tree).scan(prefix)?.into_iter().collect();
        let pending = self
            .ops
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix));
        for (key, value) in pending {
            match value {
                Some(v) => merged.insert(key.clone(), v.clone()),
                None => merged.remove(key),
            };
        }
        Ok(merged.into_iter().collect())
    }
}

/// The tree itself, read-only.
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
