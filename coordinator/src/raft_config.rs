//! The openraft settings every node runs with: timing for a cluster inside one region's data
//! centre or across regions, and the snapshot policy that bounds the log.

use openraft::{Config, SnapshotPolicy};

use crate::error::{Error, Result};

/// Entries applied since the last snapshot before a new one is built. One entry per sync
/// round (250 ms) makes this about four minutes of rounds, which is also the most a restart
/// reapplies.
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 1_024;

/// Entries kept in the log below the last snapshot, so that a follower a little behind
/// catches up from the log instead of a whole snapshot.
pub const LOG_KEPT_BELOW_SNAPSHOT: u64 = 256;

/// Most entries one AppendEntries carries. A round entry holds at most
/// `MAX_COMMANDS_PER_ROUND` table commands (about 100 bytes each), so a message stays within
/// [`MAX_RAFT_MESSAGE_BYTES`].
pub const MAX_ENTRIES_PER_APPEND: u64 = 64;

/// Size of the pieces a snapshot is sent in.
pub const SNAPSHOT_CHUNK_BYTES: u64 = 4 << 20;

/// Most bytes one raft message may have on the wire: a full AppendEntries or snapshot chunk,
/// with room to spare.
pub const MAX_RAFT_MESSAGE_BYTES: usize = 16 << 20;

/// The leader's heartbeat; elections wait several of these.
pub const HEARTBEAT_INTERVAL_MS: u64 = 250;
/// A follower that hears no leader for a random time in this range stands for election: four
/// missed heartbeats at least, so a round trip of 80 ms between regions and a slow beat do not
/// start one. A follower that knew a committed leader also waits openraft's leader lease
/// (`election_timeout_max`) first, so a lost leader is replaced in 3 to 4 s (docs/coordinator.md).
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 1_000;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 2_000;

/// The settings of a node of `cluster_name` (nodes of another cluster refuse its messages).
pub fn raft_config(cluster_name: &str) -> Result<Config> {
    let config = Config {
        cluster_name: cluster_name.to_string(),
        heartbeat_interval: HEARTBEAT_INTERVAL_MS,
        election_timeout_min: ELECTION_TIMEOUT_MIN_MS,
        election_timeout_max: ELECTION_TIMEOUT_MAX_MS,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES),
        max_in_snapshot_log_to_keep: LOG_KEPT_BELOW_SNAPSHOT,
        max_payload_entries: MAX_ENTRIES_PER_APPEND,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        ..Config::default()
    };
    config.validate().map_err(|e| Error::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_are_valid_and_bound_the_log() {
        let config = raft_config("allot").expect("valid");
        assert_eq!(
            config.snapshot_policy,
            SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY_ENTRIES)
        );
        assert!(config.election_timeout_min >= 4 * config.heartbeat_interval);
        assert!(SNAPSHOT_CHUNK_BYTES < MAX_RAFT_MESSAGE_BYTES as u64);
    }
}
