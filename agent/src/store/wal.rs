//! The write-ahead log of the sled store.
//!
//! sled 0.34 keeps inserts in its own user-space buffers until it flushes (every
//! `flush_every_ms`, or on `flush()`, which also syncs the file): a process killed in between
//! loses them. So every batch is first appended to this log, and only the log is on the
//! request path.
//!
//! The log is a series of segment files, each allocated whole when it is started
//! (`posix_fallocate`, so that a full disk is an error at rotation, never a fault while
//! writing) and mapped shared into memory. An append copies its frame into the mapping: the
//! pages are the kernel's page cache, so a batch survives the process being killed the moment
//! the copy is done, with no system call. In `sync` mode each append is also flushed to the
//! device (`msync`, which is `fdatasync` of the pages written); in `buffered` mode the agent
//! flushes the file every flush interval. A checkpoint flushes the current segment and starts
//! a new one, flushes sled, then deletes the older segments; at start the segments left are
//! replayed in order, sled is flushed, they are deleted, and only then is a new segment made.
//!
//! A frame is `len: u32 LE | crc32(payload): u32 LE | payload` (a batch of records, encoded
//! as [`super::codec`] says, never empty). A zero length ends a segment: the rest of it was
//! never written. A frame cut short or failing its checksum at the end of the last segment is
//! a write the process died in (its answer was never given) and is dropped; anywhere else it
//! is corruption. Logs written by earlier versions with `write(2)` (no preallocation) read the
//! same way.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use allot_core::budget::PersistRecord;
use memmap2::MmapMut;

use super::{codec, crash};
use crate::error::{Error, Result};

const FRAME_HEADER_BYTES: usize = 8;

/// Room reserved per record before encoding a batch (a key's record, the most common, takes
/// about this much), so that a frame is rarely grown while it is written.
const ENCODED_BYTES_GUESS: usize = 128;

/// Largest frame accepted when replaying: a length above it is damage, not a batch. Batches
/// are one drain of the budget machine, at most a full snapshot; this leaves ample room.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// Size of a log segment: several seconds of appends at tens of thousands of calls a second.
/// A batch larger than this gets a segment of its own size.
pub const SEGMENT_BYTES: usize = 16 << 20;

#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    number: u64,
    segment: Segment,
    /// Flush each append to the device (durability `sync`).
    sync_each_write: bool,
    /// Appended since the last rotation, in every segment since.
    bytes: u64,
    /// Segments filled since the last rotation: the next checkpoint removes them too.
    filled: Vec<PathBuf>,
    /// The size new segments are created with.
    segment_bytes: usize,
    /// Segments created so far, and how many of their names the directory has made durable:
    /// in `buffered` mode the directory is flushed with the next log flush, off the request
    /// path.
    created: u64,
    dir_synced: Arc<AtomicU64>,
}

/// One mapped segment file.
#[derive(Debug)]
struct Segment {
    map: MmapMut,
    /// Where the next frame goes.
    end: usize,
    file: Arc<File>,
    path: PathBuf,
}

/// The current segment file, to flush to the device without holding up appends.
#[derive(Debug)]
pub struct LogFile {
    file: Arc<File>,
    path: PathBuf,
    dir: PathBuf,
    created: u64,
    dir_synced: Arc<AtomicU64>,
}

impl LogFile {
    /// `fdatasync`: everything appended so far, through the mapping too, survives a machine
    /// crash; and so do the names of the segments created since the last flush.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(&self.path, e))?;
        if self.dir_synced.load(Ordering::Acquire) < self.created {
            sync_dir(&self.dir)?;
            self.dir_synced.fetch_max(self.created, Ordering::AcqRel);
        }
        Ok(())
    }
}

/// The log files a checkpoint may delete once sled is flushed.
#[derive(Debug)]
pub struct Rotated {
    files: Vec<PathBuf>,
}

impl Wal {
    /// Replays the files in `dir` (oldest first) through `apply`, calls `durable` (which makes
    /// what `apply` did survive a crash), removes the replayed files, and only then starts a
    /// fresh segment numbered after them. (The store opens with [`Wal::open_with`].)
    #[cfg(test)]
    pub fn open(
        dir: &Path,
        sync_each_write: bool,
        apply: impl FnMut(Vec<PersistRecord>) -> Result<()>,
        durable: impl FnOnce() -> Result<()>,
    ) -> Result<Wal> {
        Wal::open_with(dir, sync_each_write, SEGMENT_BYTES, apply, durable)
    }

    /// [`Wal::open`] with segments of `segment_bytes`.
    ///
    /// The order is what makes a start that dies at any point safe to start again: until
    /// `durable` returns, every replayed file is still there; the files are removed oldest
    /// first (what is left is always a tail of the log, whose last file is still the last);
    /// and the new segment is created only once none of them is left, so a torn write at the
    /// end of the old log can never end up before a later segment (which would make it
    /// damage, and the store unopenable).
    pub fn open_with(
        dir: &Path,
        sync_each_write: bool,
        segment_bytes: usize,
        mut apply: impl FnMut(Vec<PersistRecord>) -> Result<()>,
        durable: impl FnOnce() -> Result<()>,
    ) -> Result<Wal> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let files = log_files(dir)?;
        let last = files.len().checked_sub(1);
        for (i, (_, path)) in files.iter().enumerate() {
            for batch in read_frames(path, Some(i) == last)? {
                apply(batch)?;
            }
        }
        crash::point("open.replayed");
        durable()?;
        crash::point("open.durable");
        let number = files.last().map_or(1, |(n, _)| n + 1);
        if !files.is_empty() {
            Rotated {
                files: files.into_iter().map(|(_, p)| p).collect(),
            }
            .remove()?;
            // The removals reach the device before the new segment's name can.
            sync_dir(dir)?;
        }
        crash::point("open.removed");
        let segment = Segment::create(dir, number, segment_bytes)?;
        crash::point("open.created");
        sync_dir(dir)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            number,
            segment,
            sync_each_write,
            bytes: 0,
            filled: Vec::new(),
            segment_bytes,
            created: 1,
            dir_synced: Arc::new(AtomicU64::new(1)),
        })
    }

    /// Appends one batch: a copy into the mapping (and a flush of its pages in sync mode).
    pub fn append(&mut self, batch: &[PersistRecord]) -> Result<()> {
        let frame = encode_frame(batch)?;
        if self.segment.room() < frame.len() {
            self.next_segment(frame.len())?;
        }
        let at = self.segment.end;
        crash::point_then("append.torn", || {
            let half = frame.len() / 2;
            self.segment.map[at..at + half].copy_from_slice(&frame[..half]);
        });
        self.segment.map[at..at + frame.len()].copy_from_slice(&frame);
        self.segment.end += frame.len();
        self.bytes += frame.len() as u64;
        if self.sync_each_write {
            self.segment
                .map
                .flush_range(at, frame.len())
                .map_err(|e| Error::io(&self.segment.path, e))?;
        }
        Ok(())
    }

    /// Starts the next segment; every segment written since the last rotation is returned for
    /// deletion after the checkpoint, which makes their contents durable in the tree. The
    /// current one is flushed first, as [`Wal::next_segment`] does and for the same reason:
    /// otherwise a machine crash could keep the new segment's appends (flushed by the next
    /// log flush) and lose the old one's tail, a damaged frame before the last segment. Cheap:
    /// what is dirty is what was appended since the last log flush.
    pub fn rotate(&mut self) -> Result<Rotated> {
        self.next_segment(0)?;
        self.bytes = 0;
        Ok(Rotated {
            files: std::mem::take(&mut self.filled),
        })
    }

    pub fn file_handle(&self) -> LogFile {
        LogFile {
            file: self.segment.file.clone(),
            path: self.segment.path.clone(),
            dir: self.dir.clone(),
            created: self.created,
            dir_synced: self.dir_synced.clone(),
        }
    }

    /// Bytes appended since the last rotation: what a start would replay.
    pub fn bytes_since_rotation(&self) -> u64 {
        self.bytes
    }

    /// Where the next frame goes in the current segment (tests damage the log there).
    #[cfg(test)]
    pub fn end_offset(&self) -> usize {
        self.segment.end
    }

    /// Moves on from a full segment to one with room for at least `frame_bytes`. The full
    /// one is flushed to the device first, so that no later segment can survive a machine
    /// crash that an earlier one does not (a damaged frame before the last segment stops a
    /// start). Rare: once per [`SEGMENT_BYTES`] appended.
    fn next_segment(&mut self, frame_bytes: usize) -> Result<()> {
        self.segment
            .map
            .flush()
            .map_err(|e| Error::io(&self.segment.path, e))?;
        crash::point("segment.flushed");
        self.start_segment(frame_bytes)
    }

    fn start_segment(&mut self, frame_bytes: usize) -> Result<()> {
        let size = self.segment_bytes.max(frame_bytes);
        let next = Segment::create(&self.dir, self.number + 1, size)?;
        crash::point("segment.created");
        self.created += 1;
        if self.sync_each_write {
            // Appends are flushed before their answers, and so must the file's name be.
            sync_dir(&self.dir)?;
            self.dir_synced.fetch_max(self.created, Ordering::AcqRel);
        }
        let full = std::mem::replace(&mut self.segment, next);
        self.filled.push(full.path);
        self.number += 1;
        Ok(())
    }
}

impl Segment {
    /// Creates segment `number` of `size` bytes, allocated on the device and zeroed (a zero
    /// length ends the log), and maps it. Its name is made durable by the caller.
    fn create(dir: &Path, number: u64, size: usize) -> Result<Segment> {
        let path = file_path(dir, number);
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        allocate(&file, size).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the file is this process's own (created here with `create_new`, in the
        // agent's data directory), is never truncated while mapped, and is only read through
        // this mapping. Another process modifying it would be a misuse of the data directory
        // the agent cannot guard against with or without a mapping.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| Error::io(&path, e))?;
        Ok(Segment {
            map,
            end: 0,
            file: Arc::new(file),
            path,
        })
    }

    fn room(&self) -> usize {
        self.map.len() - self.end
    }
}

/// `fdatasync` on a file alone does not keep a new file's directory entry through a machine
/// crash; this does.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Reserves `size` bytes on the device, so that writing through the mapping can never hit a
/// full disk (which would be a SIGBUS, not an error).
fn allocate(file: &File, size: usize) -> std::io::Result<()> {
    let len = libc::off_t::try_from(size)
        .map_err(|_| std::io::Error::other(format!("segment of {size} bytes is too large")))?;
    // SAFETY: a plain system call on an open descriptor this function borrows.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        errno => Err(std::io::Error::from_raw_os_error(errno)),
    }
}

/// `len | crc32 | payload`, built in one buffer.
fn encode_frame(batch: &[PersistRecord]) -> Result<Vec<u8>> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + ENCODED_BYTES_GUESS * batch.len());
    frame.resize(FRAME_HEADER_BYTES, 0);
    let mut frame = codec::encode_batch_into(frame, batch)?;
    let payload_len = frame.len() - FRAME_HEADER_BYTES;
    if payload_len > MAX_FRAME_BYTES {
        return Err(Error::Corrupt(format!(
            "a batch of {payload_len} bytes is past the log's frame limit"
        )));
    }
    let crc = crc32fast::hash(&frame[FRAME_HEADER_BYTES..]);
    frame[..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    frame[4..FRAME_HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

impl Rotated {
    /// Deletes the files; called once what they held is durable elsewhere.
    /// Oldest first: a crash part way leaves a tail of the log, which replays to the same
    /// state (every record is the whole state of its item).
    pub fn remove(self) -> Result<()> {
        for path in self.files {
            fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            crash::point("remove.one");
        }
        Ok(())
    }
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
            Frame::End => break,
            Frame::Valid { payload, len } => {
                let batch = codec::decode_batch(payload)
                    .map_err(|e| Error::Corrupt(format!("{}: {e}", path.display())))?;
                batches.push(batch);
                at += len;
            }
            // Appends are sequential: nothing can follow the write the process died in.
            Frame::Bad if is_last => {
                tracing::warn!(
                    file = %path.display(),
                    offset = at,
                    "dropping a torn write at the end of the log (its answer was never sent)"
                );
                break;
            }
            Frame::Bad => {
                return Err(Error::Corrupt(format!(
                    "{}: damaged log frame at byte {at}",
                    path.display()
                )));
            }
        }
    }
    Ok(batches)
}

enum Frame<'a> {
    Valid {
        payload: &'a [u8],
        len: usize,
    },
    /// A zero length: the segment's unwritten rest.
    End,
    Bad,
}

/// The frame at the start of `bytes`.
fn frame_at(bytes: &[u8]) -> Frame<'_> {
    let Some(header) = bytes.get(..FRAME_HEADER_BYTES) else {
        return Frame::Bad;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 {
        return Frame::End;
    }
    if len > MAX_FRAME_BYTES {
        return Frame::Bad;
    }
    match bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) {
        Some(payload) if crc32fast::hash(payload) == crc => Frame::Valid {
            payload,
            len: FRAME_HEADER_BYTES + len,
        },
        _ => Frame::Bad,
    }
}
