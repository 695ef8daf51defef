//! allot-proto: the wire types, and the only crate that knows prost.
//!
//! - [`lease::v1`]: the lease API gateways call (`allot.lease.v1.LeaseService`).
//! - [`raft::v1`]: raft between coordinator nodes (`allot.raft.v1.RaftService`), carrying
//!   openraft's messages as opaque payloads.
//! - [`sync::v1`]: the agent <-> coordinator stream (`allot.sync.v1.Sync`), and
//!   [`sync_convert`], its one protobuf <-> `allot_core::sync` conversion, shared by both ends.
//! - [`tls`]: mutual TLS between the daemons, and the peer identity a certificate carries.
//! - [`envoy`]: Envoy's rate limit service v3 (RLS) and rate limit quota service v3 (RLQS)
//!   types, re-exported from envoy-types.
//!
//! The `.proto` sources live in `proto/allot/`, compiled at build time with protox (pure Rust,
//! no protoc). The lease API's conversions live in the agent (`agent/src/convert.rs`): only the
//! agent speaks it. The sync stream's live here, because two daemons speak it.

pub mod error;
pub mod ports;
pub mod sync_convert;
pub mod tls;

pub use error::WireError;

pub mod lease {
    pub mod v1 {
        tonic::include_proto!("allot.lease.v1");

        /// Most items one `LeaseBatch` call may carry (lease.proto): the agent refuses more,
        /// the client sends no more.
        pub const MAX_LEASES_PER_BATCH: usize = 64;
    }
}

pub mod raft {
    pub mod v1 {
        tonic::include_proto!("allot.raft.v1");
    }
}

pub mod sync {
    pub mod v1 {
        tonic::include_proto!("allot.sync.v1");
    }
}

/// Envoy's global rate limit service v3 and its rate limit quota service v3.
pub mod envoy {
    pub use envoy_types::pb::envoy::config::core::v3 as core;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3 as common;
    /// The rate limit quota service (RLQS): usage reports up, bucket assignments down.
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3 as rlqs;
    pub use envoy_types::pb::envoy::service::ratelimit::v3 as rls;
    /// `RateLimitStrategy` and `TokenBucket`, the assignments RLQS sends.
    pub use envoy_types::pb::envoy::r#type::v3 as types;
    /// Protobuf well-known types as envoy-types compiles them (`Duration`, `UInt64Value`,
    /// `UInt32Value`).
    pub use envoy_types::pb::google::protobuf as wkt;
}
