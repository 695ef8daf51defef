//! The openraft type configuration of the cluster: what a log entry carries and what applying
//! it answers.

use std::io::Cursor;

use crate::state::{ClusterCommand, CommandOutcome};

/// A coordinator node's raft id (`--id N`).
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The cluster's raft types: entries carry [`ClusterCommand`]s, applying one answers a
    /// [`CommandOutcome`]; nodes are known by their address (`BasicNode`), and a snapshot is
    /// the encoded [`crate::state::ClusterState`] in memory.
    pub TypeConfig:
        D = ClusterCommand,
        R = CommandOutcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
