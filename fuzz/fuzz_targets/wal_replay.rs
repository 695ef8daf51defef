//! The write-ahead log's replay: segment files written from the input into an empty folder,
//! then the store's start over them (`store::fuzzing::replay_log`: every frame read, each
//! batch decoded and applied, the records read back), then the budget machine restored from
//! what it read, as the agent's start does. Any input must end in an error or a restore,
//! never a panic.
//!
//! Input: the first byte holds flags, the rest the segments, separated by `SEGMENT` (at most
//! `MAX_SEGMENTS`). With flag bit 0 a segment is written as it stands (frame headers and all);
//! without it, it is a list of payloads separated by `FRAME`, each written as a frame with its
//! true length and checksum (as `Wal::append` writes them), so that mutations reach the
//! records' decoding past the checksum; bit 1 then damages the last frame's checksum (a torn
//! write at the end of the log, or damage before a later segment).

#![no_main]

use allot_agent::store::fuzzing::replay_log;
use allot_core::budget::{BudgetConfig, RegionBudget};
use allot_core::config::LimitsConfig;
use allot_core::ids::RegionId;
use libfuzzer_sys::fuzz_target;

const SEGMENT: &[u8] = b"\xf0SEGMENT";
const FRAME: &[u8] = b"\xf0FRAME";

/// Most segment files one input is split into.
const MAX_SEGMENTS: usize = 4;

/// The fresh segment a start creates after the replay: small, so that each run is cheap.
const NEW_SEGMENT_BYTES: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let raw = flags & 1 == 1;
    let damage_last = flags & 2 == 2;
    let segments: Vec<&[u8]> = split(rest, SEGMENT).take(MAX_SEGMENTS).collect();
    let count = segments.len();
    // Memory-backed where the machine has it: a start syncs the folder.
    let dir = match std::fs::metadata("/dev/shm") {
        Ok(m) if m.is_dir() => tempfile::tempdir_in("/dev/shm"),
        _ => tempfile::tempdir(),
    }
    .expect("a temporary folder");
    let log = dir.path().join("wal");
    std::fs::create_dir(&log).expect("the log folder");
    for (i, segment) in segments.into_iter().enumerate() {
        let bytes = if raw {
            segment.to_vec()
        } else {
            framed(segment, damage_last && i + 1 == count)
        };
        // Segment names as the log gives them: the number, zero-padded to 20 digits.
        let path = log.join(format!("{:020}.log", i + 1));
        std::fs::write(path, bytes).expect("a segment file");
    }
    let Ok(records) = replay_log(&log, NEW_SEGMENT_BYTES) else {
        return;
    };
    let specs = LimitsConfig::embedded_default()
        .expect("the embedded default loads")
        .rules()
        .map(|r| r.spec.clone())
        .collect::<Vec<_>>();
    let _ = RegionBudget::restore(
        BudgetConfig::single_region(RegionId::from("r1")),
        specs,
        records,
    );
});

/// `len: u32 LE | crc32(payload): u32 LE | payload` for each payload, then a zero length
/// (the unwritten rest of a segment).
fn framed(segment: &[u8], damage_last: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(segment.len() + 64);
    let mut last_crc_at = None;
    for payload in split(segment, FRAME).filter(|p| !p.is_empty()) {
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        last_crc_at = Some(out.len());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
    }
    if let (true, Some(at)) = (damage_last, last_crc_at) {
        out[at] ^= 0xff;
    }
    out.extend_from_slice(&[0; 8]);
    out
}

/// The parts of `bytes` between occurrences of `separator`.
fn split<'a>(bytes: &'a [u8], separator: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let current = rest?;
        match current
            .windows(separator.len())
            .position(|w| w == separator)
        {
            Some(at) => {
                rest = Some(&current[at + separator.len()..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}
