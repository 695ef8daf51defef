//! The sled-backed store: records in a sled tree, behind a write-ahead log ([`super::wal`])
//! because sled 0.34 buffers writes in user space until it flushes.
//!
//! `write` appends to the log; the tree is brought up to date at each checkpoint (and before
//! a `load`). Applying a record twice is harmless (each is the whole state of one item), so a
//! crash at any point is repaired by replaying the log files left over. For the same reason
//! only the last record of each item since the checkpoint before is applied: a hot key
//! written forty thousand times a second costs the tree one insert per checkpoint.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use allot_core::budget::PersistRecord;
use xxhash_rust::xxh3::Xxh3Builder;

use super::keyed::{self, Scan};
use super::wal::{SEGMENT_BYTES, Wal};
use super::{Durability, Store, WriteOwned, crash};
use crate::error::{Error, Result};

/// Items written to the log but not yet to the tree, kept (their last record each) to apply
/// at the next checkpoint. Past this many they are applied at once instead, so a checkpoint
/// that keeps failing cannot make them pile up.
pub const MAX_UNCHECKPOINTED_ITEMS: usize = 1 << 20;

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
    /// The last record of each item written since the last checkpoint, by store key; rotated
    /// out with the log file that holds them. Records of different items commute, so the
    /// map's order does not matter.
    unapplied: Unapplied,
}

/// Keyed by store key with xxh3: this map is on the request path, and its keys are the
/// agent's own (no attacker picks them to collide), so SipHash's protection buys nothing.
type Unapplied = HashMap<Vec<u8>, PersistRecord, Xxh3Builder>;

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore").finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (or creates) the store in `dir`: replays the log left by the last run into the
    /// tree, flushes the tree, and starts a fresh log.
    pub fn open(dir: &Path, durability: Durability) -> Result<SledStore> {
        SledStore::open_with(dir, durability, SEGMENT_BYTES)
    }

    /// [`SledStore::open`] with log segments of `segment_bytes` (tests roll segments over).
    pub(crate) fn open_with(
        dir: &Path,
        durability: Durability,
        segment_bytes: usize,
    ) -> Result<SledStore> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let db = sled::Config::new()
            .path(dir.join("sled"))
            // The agent flushes at its own checkpoints; the log covers the time between.
            .flush_every_ms(None)
            .open()?;
        let sync = durability == Durability::Sync;
        let wal = Wal::open_with(
            &dir.join("wal"),
            sync,
            segment_bytes,
            |batch| apply(&db, &batch),
            || db.flush().map(drop).map_err(Error::from),
        )?;
        Ok(SledStore {
            db,
            inner: Mutex::new(Inner {
                wal,
                unapplied: Unapplied::default(),
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
        self.write_owned(batch.to_vec()).map_err(|(e, _)| e)
    }

    fn write_owned(&self, batch: Vec<PersistRecord>) -> WriteOwned {
        let mut inner = self.inner();
        if let Err(e) = inner.wal.append(&batch) {
            return Err((e, batch));
        }
        // In the log now: whatever fails below is repaired by a replay, so the batch is not
        // handed back (writing it again would log it twice, harmlessly but for nothing).
        let applied = self.keep_unapplied(&mut inner, batch);
        applied.map_err(|e| (e, Vec::new()))
    }

    fn sync(&self) -> Result<()> {
        let file = self.inner().wal.file_handle();
        file.sync()
    }

    fn checkpoint(&self) -> Result<()> {
        let (rotated, unapplied, applying) = {
            let mut inner = self.inner();
            let rotated = inner.wal.rotate()?;
            let applying = self.applying();
            (rotated, std::mem::take(&mut inner.unapplied), applying)
        };
        crash::point("checkpoint.rotated");
        // On failure the rotated files stay: the next start replays them.
        apply_items(&self.db, unapplied)?;
        drop(applying);
        crash::point("checkpoint.applied");
        self.db.flush()?;
        crash::point("checkpoint.flushed");
        rotated.remove()
    }

    fn log_bytes(&self) -> u64 {
        self.inner().wal.bytes_since_rotation()
    }

    /// What the tree holds and what still waits for a checkpoint.
    fn load(&self) -> Result<Vec<PersistRecord>> {
        let mut inner = self.inner();
        self.apply_now(&mut inner, &[])?;
        keyed::load(&Tree(&self.db))
    }
}

impl SledStore {
    /// Keeps the last record of each item for the next checkpoint.
    fn keep_unapplied(&self, inner: &mut Inner, batch: Vec<PersistRecord>) -> Result<()> {
        for record in batch {
            match keyed::item_key(&record) {
                Some(key) => {
                    inner.unapplied.insert(key, record);
                }
                // A record acting on many items (a reset, a removed limit) is applied in log
                // order: everything before it first, then itself. Both are rare.
                None => self.apply_now(inner, std::slice::from_ref(&record))?,
            }
        }
        if inner.unapplied.len() > MAX_UNCHECKPOINTED_ITEMS {
            self.apply_now(inner, &[])?;
        }
        Ok(())
    }

    /// Applies every item waiting for a checkpoint, then `then`, to the tree.
    fn apply_now(&self, inner: &mut Inner, then: &[PersistRecord]) -> Result<()> {
        let _applying = self.applying();
        apply_items(&self.db, std::mem::take(&mut inner.unapplied))?;
        apply(&self.db, then)
    }
}

fn apply_items(db: &sled::Db, items: Unapplied) -> Result<()> {
    let records: Vec<PersistRecord> = items.into_values().collect();
    apply(db, &records)
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
