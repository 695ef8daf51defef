//! allot-proto: the wire types, and the only crate that knows prost.
//!
//! - [`lease::v1`]: the lease API gateways call (`allot.lease.v1.LeaseService`).
//! - [`raft::v1`]: raft between coordinator nodes (`allot.raft.v1.RaftService`), carrying
//!   openraft's messages as opaque payloads.
//! - [`envoy`]: Envoy's rate limit service v3 (RLS) types, re-exported from envoy-types.
//!
//! The `.proto` sources live in `proto/allot/`, compiled at build time with protox (pure Rust,
//! no protoc). Conversions between these types and `allot-core` types live in the daemons, one
//! module per crate. Still to come: the `allot.sync.v1` agent <-> coordinator stream.

pub mod lease {
    pub mod v1 {
        tonic::include_proto!("allot.lease.v1");
    }
}

pub mod raft {
    pub mod v1 {
        tonic::include_proto!("allot.raft.v1");
    }
}

/// Envoy's global rate limit service v3.
pub mod envoy {
    pub use envoy_types::pb::envoy::config::core::v3 as core;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as common;
    pub use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
    /// Protobuf well-known types as envoy-types compiles them (`Duration`, `UInt64Value`).
    pub use envoy_types::pb::google::protobuf as wkt;
}
