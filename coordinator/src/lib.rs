//! allot-coordinator: the 3-5 node openraft cluster that relays counter state between regions.
//!
//! It is a thin driver over `allot_core::rebalance`: the replicated allowance table as the
//! raft state machine, the leader's rebalancer producing commands to commit, and the sync
//! stream service that agents connect to. Only this crate knows openraft.
//!
//! - [`state`]: what is replicated ([`ClusterCommand`]) and the state it builds
//!   ([`ClusterState`]).
//! - [`store`]: the raft log and state machine, persisted in sled.
//! - [`types`]: the openraft type configuration; [`codec`]: how records and raft messages are
//!   encoded.
//! - [`network`]: raft between nodes over gRPC (`allot.raft.v1`); [`node`] wires one node.
//! - [`sync_service`]: the agents' sync stream (`allot.sync.v1`) over a [`sync_service::SyncHandler`].
//! - [`places`]: calls or streams held per named peer, under a cap each.
//! - [`daemon`]: one node as `allot coordinator` runs it: raft and sync on one gRPC address,
//!   the leader's rebalancer committing through raft, the admin HTTP API.

pub mod codec;
pub mod daemon;
pub mod error;
pub mod network;
pub mod node;
pub mod places;
pub mod raft_config;
pub mod state;
pub mod store;
pub mod sync_service;
pub mod types;

pub use error::{Error, Result};
pub use state::{ClusterCommand, ClusterState, CommandOutcome, Refusal};
pub use types::{NodeId, TypeConfig};

/// A mutex's guard, poisoned or not: every holder in this crate changes whole values or
/// entries at a time under it, so a panic mid-hold leaves nothing half-written.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
