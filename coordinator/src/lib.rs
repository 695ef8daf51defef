//! allot-coordinator: the 3-5 node openraft cluster that relays counter state between regions.
//!
//! It will be a thin driver over `allot_core::rebalance`: the replicated allowance table as the
//! raft state machine, the leader's rebalancer producing commands to commit, and the sync
//! stream service that agents connect to. Only this crate knows openraft.
//!
//! Not yet written: see the coordinator issue.

pub mod sync_service;
