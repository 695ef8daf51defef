//! The sled-backed store: records in a sled tree, behind a write-ahead log ([`super::wal`])
//! because sled 0.34 buffers writes in user space until it flushes.
//!
//! `write` appends to the log; the tree is brought up to date at each checkpoint (and before
//! a `load`). Applying a record twice is harmless (each is the whole state of one item), so a
//! crash at any point is repaired by replaying the log files left over.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use allot_core::budget::PersistRecord;

use super::keyed::{self, Scan};
use super::wal::Wal;
use super::{Durability, Store};
use crate::error::{Error, Result};

/// Records written to the log but not yet to the tree, kept to apply at the next checkpoint.
/// Past this many they are applied at once instead, so a checkpoint that keeps failing
/// cannot make them pile up.
pub const MAX_UNCHECKPOINTED_RECORDS: usize = 1 << 20;

/// The request path pays for the log append only: records reach the sled tree at the next
/// checkpoint, which applies them in order, flushes the tree, and only then deletes the log
/// files that held them.
pub struct SledStore {
    db: sled::Db,
    inner: Mutex<Inner>,
    /// Held while records are applied to the tree, taken while `inner` is held: batches
    /// reach the tree in log order even when a checkpoint is still applying older ones.
    applying: Mutex<()>,
}

struct Inner {
    wal: Wal,
    /// In log order; rotated out with the log file that holds them.
    unapplied: Vec<PersistRecord>,
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
            inner: Mutex::new(Inner {
                wal,
                unapplied: Vec::new(),
            }),
            applying: Mutex::new(()),
        })
    }

    fn applying(&self) -> MutexGuard<'_, ()> {
        // Guards no data of its own: only the order of applications.
        self.applying.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Appends and takes happen whole under the lock; a panic elsewhere leaves it whole.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for SledStore {
    fn write(&self, batch: &[PersistRecord]) -> Result<()> {
        let mut inner = self.inner();
        inner.wal.append(batch)?;
        if inner.unapplied.len() + batch.len() > MAX_UNCHECKPOINTED_RECORDS {
            let _applying = self.applying();
            let earlier = std::mem::take(&mut inner.unapplied);
            apply(&self.db, &earlier)?;
            return apply(&self.db, batch);
        }
        inner.unapplied.extend_from_slice(batch);
        Ok(())
    }

    fn checkpoint(&self) -> Result<()> {
        let (rotated, unapplied, applying) = {
            let mut inner = self.inner();
            let rotated = inner.wal.rotate()?;
            let applying = self.applying();
            (rotated, std::mem::take(&mut inner.unapplied), applying)
        };
        // On failure the rotated files stay: the next start replays them.
        apply(&self.db, &unapplied)?;
        drop(applying);
        self.db.flush()?;
        rotated.remove()
    }

    /// What the tree holds and what still waits for a checkpoint, in order.
    fn load(&self) -> Result<Vec<PersistRecord>> {
        let mut inner = self.inner();
        let _applying = self.applying();
        let unapplied = std::mem::take(&mut inner.unapplied);
        apply(&self.db, &unapplied)?;
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
