//! The node's data directory: one sled database, one tree per kind of record. The only file
//! of the crate that knows sled.
//!
//! - `log`: raft log entries, keyed by index (big-endian, so sled's order is the log's).
//! - `meta`: the vote, the last committed and the last purged log id.
//! - `snapshot`: the last snapshot (its meta and the encoded state), one record.
//!
//! sled 0.34 keeps writes in memory until a flush, so every write that raft must find after a
//! crash is followed by [`Disk::flush`] before it is reported durable.

use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{decode, encode};
use crate::error::{Error, Result};
use crate::types::{Entry, SnapshotMeta};

const LOG_TREE: &str = "log";
const META_TREE: &str = "meta";
const SNAPSHOT_TREE: &str = "snapshot";
const SNAPSHOT_KEY: &[u8] = b"current";

/// The records of the `meta` tree.
#[derive(Clone, Copy, Debug)]
pub enum MetaKey {
    Vote,
    Committed,
    Purged,
}

impl MetaKey {
    fn key(self) -> &'static [u8] {
        match self {
            MetaKey::Vote => b"vote",
            MetaKey::Committed => b"committed",
            MetaKey::Purged => b"purged",
        }
    }

    fn what(self) -> &'static str {
        match self {
            MetaKey::Vote => "vote",
            MetaKey::Committed => "committed log id",
            MetaKey::Purged => "purged log id",
        }
    }
}

/// A stored snapshot: its meta and the encoded state, written as one record so that the two
/// never disagree.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StoredSnapshot {
    pub meta: SnapshotMeta,
    pub data: Vec<u8>,
}

/// Handles to the trees; cheap to clone (sled's handles are shared).
#[derive(Clone)]
pub struct Disk {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    snapshot: sled::Tree,
    /// Held while a snapshot is compared and replaced, so a snapshot built from an older state
    /// never overwrites one installed meanwhile.
    snapshot_lock: Arc<Mutex<()>>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").finish_non_exhaustive()
    }
}

/// Longest `open` waits for the file lock of a database closed a moment ago in this process:
/// sled's background threads hold it briefly after the last handle drops. A node restarted as
/// a new process never waits (the old one's exit released the lock); a node restarted in the
/// same process (an embedded cluster, the tests) would otherwise fail at random.
const LOCK_WAIT: Duration = Duration::from_secs(2);

fn open_db(path: &Path) -> Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // Raft says when a write must be durable; sled's timer would only add flushes.
        let opened = sled::Config::new().path(path).flush_every_ms(None).open();
        match opened {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return Ok(other?),
        }
    }
}

impl Disk {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Disk> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let db = open_db(&dir.join("raft"))?;
        Ok(Disk {
            log: db.open_tree(LOG_TREE)?,
            meta: db.open_tree(META_TREE)?,
            snapshot: db.open_tree(SNAPSHOT_TREE)?,
            db,
            snapshot_lock: Arc::new(Mutex::new(())),
        })
    }

    /// Makes every write so far durable (all trees share sled's one log).
    pub async fn flush(&self) -> Result<()> {
        self.db.flush_async().await?;
        Ok(())
    }

    pub fn get_meta<T: DeserializeOwned>(&self, key: MetaKey) -> Result<Option<T>> {
        match self.meta.get(key.key())? {
            Some(bytes) => decode(key.what(), &bytes).map(Some),
            None => Ok(None),
        }
    }

    pub fn put_meta<T: Serialize>(&self, key: MetaKey, value: &T) -> Result<()> {
        self.meta.insert(key.key(), encode(key.what(), value)?)?;
        Ok(())
    }

    /// Writes `entries` in one sled batch (all or none of them reach the tree).
    pub fn append(&self, entries: impl IntoIterator<Item = Entry>) -> Result<()> {
        let mut batch = sled::Batch::default();
        for entry in entries {
            let bytes = encode("log entry", &entry)?;
            batch.insert(&index_key(entry.log_id.index), bytes);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    /// The entries whose index is in `range`, in order (missing ones are skipped).
    pub fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>> {
        let Some(keys) = key_range(range) else {
            return Ok(Vec::new());
        };
        self.log
            .range(keys)
            .map(|kv| {
                let (key, value) = kv?;
                decode_entry(&key, &value)
            })
            .collect()
    }

    /// The entry with the largest index, if any.
    pub fn last_entry(&self) -> Result<Option<Entry>> {
        match self.log.last()? {
            Some((key, value)) => decode_entry(&key, &value).map(Some),
            None => Ok(None),
        }
    }

    /// Removes the entries whose index is in `range`.
    pub fn remove_entries(&self, range: impl RangeBounds<u64>) -> Result<()> {
        let Some(keys) = key_range(range) else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        for key in self.log.range(keys).keys() {
            batch.remove(key?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    pub fn snapshot(&self) -> Result<Option<StoredSnapshot>> {
        match self.snapshot.get(SNAPSHOT_KEY)? {
            Some(bytes) => decode("snapshot", &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Stores `snap` unless the stored one already covers a later log id; says whether it did.
    /// Not flushed: the caller flushes before reporting it durable.
    pub fn replace_snapshot(&self, snap: &StoredSnapshot) -> Result<bool> {
        let _guard = self.snapshot_lock();
        let newer_stored = self
            .snapshot()?
            .is_some_and(|s| s.meta.last_log_id > snap.meta.last_log_id);
        if newer_stored {
            return Ok(false);
        }
        self.snapshot
            .insert(SNAPSHOT_KEY, encode("snapshot", snap)?)?;
        Ok(true)
    }

    /// A tree as sled holds it, for tests that damage records.
    #[cfg(test)]
    pub fn raw_tree(&self, name: &str) -> sled::Tree {
        self.db.open_tree(name).expect("open tree")
    }

    #[cfg(test)]
    pub fn raw_flush(&self) {
        self.db.flush().expect("flush");
    }

    fn snapshot_lock(&self) -> MutexGuard<'_, ()> {
        // Guards no data of its own: only the order of replacements.
        self.snapshot_lock.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// `range` as a half-open range of keys, or `None` when it is empty.
type KeyRange = (Bound<[u8; 8]>, Bound<[u8; 8]>);

fn key_range(range: impl RangeBounds<u64>) -> Option<KeyRange> {
    let start = match range.start_bound() {
        Bound::Included(i) => *i,
        Bound::Excluded(i) => i.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(i) => match i.checked_add(1) {
            Some(e) => Bound::Excluded(index_key(e)),
            None => Bound::Unbounded,
        },
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    };
    if let Bound::Excluded(e) = end
        && index_key(start) >= e
    {
        return None;
    }
    Some((Bound::Included(index_key(start)), end))
}

/// Decodes a log entry and checks it is stored under its own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry> {
    let entry: Entry = decode("log entry", value)?;
    let stored_at = <[u8; 8]>::try_from(key)
        .map(u64::from_be_bytes)
        .map_err(|_| Error::corrupt("log entry", "key is not an 8-byte index"))?;
    if stored_at != entry.log_id.index {
        return Err(Error::corrupt(
            "log entry",
            format!("stored at {stored_at} but holds {}", entry.log_id.index),
        ));
    }
    Ok(entry)
}
