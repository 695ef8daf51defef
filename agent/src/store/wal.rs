//! The write-ahead log of the sled store.
//!
//! sled 0.34 keeps inserts in its own user-space buffers until it flushes (every
//! `flush_every_ms`, or on `flush()`, which also syncs the file): a process killed in between
//! loses them. So every batch is first appended to this log with one `write(2)`, which hands it
//! to the kernel (it survives SIGKILL), and in `sync` mode flushed with `fdatasync`. A
//! checkpoint starts a new log file, flushes sled, then deletes the older files; at start the
//! files left are replayed in order.
//!
//! A frame is `len: u32 LE | crc32(payload): u32 LE | payload` (a JSON array of records). A
//! frame cut short or failing its checksum at the end of the last file is a write the process
//! died in (its answer was never given) and is dropped; anywhere else it is corruption.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use allot_core::budget::PersistRecord;

use crate::error::{Error, Result};

const FRAME_HEADER_BYTES: usize = 8;

/// Largest frame accepted when replaying: a length above it is damage, not a batch. Batches
/// are one drain of the budget machine, at most a full snapshot; this leaves ample room.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    file: File,
    number: u64,
    /// `fdatasync` after every append (durability `sync`).
    sync_each_write: bool,
}

/// The log files a checkpoint may delete once sled is flushed.
#[derive(Debug)]
pub struct Rotated {
    files: Vec<PathBuf>,
}

impl Wal {
    /// Replays the files in `dir` (oldest first) through `apply`, then starts a fresh file
    /// numbered after them. The replayed files stay until the caller's first checkpoint.
    pub fn open(
        dir: &Path,
        sync_each_write: bool,
        mut apply: impl FnMut(Vec<PersistRecord>) -> Result<()>,
    ) -> Result<(Wal, Rotated)> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let files = log_files(dir)?;
        let last = files.len().checked_sub(1);
        for (i, (_, path)) in files.iter().enumerate() {
            for batch in read_frames(path, Some(i) == last)? {
                apply(batch)?;
            }
        }
        let number = files.last().map_or(1, |(n, _)| n + 1);
        let wal = Wal {
            dir: dir.to_path_buf(),
            file: create(&file_path(dir, number))?,
            number,
            sync_each_write,
        };
        let rotated = Rotated {
            files: files.into_iter().map(|(_, p)| p).collect(),
        };
        Ok((wal, rotated))
    }

    /// Appends one batch with a single `write(2)` (and `fdatasync` in sync mode).
    pub fn append(&mut self, batch: &[PersistRecord]) -> Result<()> {
        let payload = serde_json::to_vec(batch)
            .map_err(|e| Error::Corrupt(format!("cannot encode batch: {e}")))?;
        let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        frame.extend_from_slice(&payload);
        let path = file_path(&self.dir, self.number);
        self.file
            .write_all(&frame)
            .map_err(|e| Error::io(&path, e))?;
        if self.sync_each_write {
            self.file.sync_data().map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// Starts the next file; the current one is returned for deletion after the checkpoint.
    pub fn rotate(&mut self) -> Result<Rotated> {
        let next = self.number + 1;
        let file = create(&file_path(&self.dir, next))?;
        let old = file_path(&self.dir, self.number);
        self.file = file;
        self.number = next;
        Ok(Rotated { files: vec![old] })
    }
}

impl Rotated {
    /// Deletes the files; called once what they held is durable elsewhere.
    pub fn remove(self) -> Result<()> {
        for path in self.files {
            fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }
}

fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}

fn file_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:020}.log"))
}

/// The log files in `dir`, oldest first.
fn log_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(n) = number {
            files.push((n, path));
        }
    }
    files.sort();
    Ok(files)
}

/// The batches of one file. A bad frame at the end of the last file is a torn write and ends
/// the log; a bad frame anywhere else is an error.
fn read_frames(path: &Path, is_last: bool) -> Result<Vec<Vec<PersistRecord>>> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io(path, e))?;
    let mut batches = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        match frame_at(&bytes[at..]) {
            Some((payload, len)) => {
                let batch = serde_json::from_slice(payload).map_err(|e| {
                    Error::Corrupt(format!("{}: undecodable batch: {e}", path.display()))
                })?;
                batches.push(batch);
                at += len;
            }
            // Appends are sequential: nothing can follow the write the process died in.
            None if is_last => {
                tracing::warn!(
                    file = %path.display(),
                    offset = at,
                    "dropping a torn write at the end of the log (its answer was never sent)"
                );
                break;
            }
            None => {
                return Err(Error::Corrupt(format!(
                    "{}: damaged log frame at byte {at}",
                    path.display()
                )));
            }
        }
    }
    Ok(batches)
}

/// The payload and total length of a valid frame at the start of `bytes`.
fn frame_at(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let header = bytes.get(..FRAME_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
    if len > MAX_FRAME_BYTES {
        return None;
    }
    let payload = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len)?;
    (crc32fast::hash(payload) == crc).then_some((payload, FRAME_HEADER_BYTES + len))
}
