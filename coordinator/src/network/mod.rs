//! Raft between coordinator nodes over gRPC (`allot.raft.v1.RaftService`).
//!
//! openraft's requests and answers travel as opaque payloads ([`crate::codec`]): [`client`]
//! is openraft's `RaftNetwork` towards one peer, [`service`] hands what arrives to the local
//! `Raft`. Every message names the sender's cluster; a node refuses another cluster's.

pub mod client;
pub mod clock;
pub mod leader_admin;
pub mod service;

pub use client::{GrpcNetwork, PeerClient};
pub use leader_admin::{LeaderAdmin, ProbeFrom};
pub use service::RaftGrpcService;
