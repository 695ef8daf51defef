//! allot-proto: the wire types, and the only crate that knows prost.
//!
//! It will hold the `allot.lease.v1` lease API and the `allot.sync.v1` agent <-> coordinator
//! stream, compiled from `proto/*.proto` with protox (pure Rust, no protoc), plus the Envoy RLS
//! and RLQS types re-exported from envoy-types. Conversions between these types and the
//! `allot-core` types live in the daemons, one module per crate.
//!
//! Not yet written: the lease API and the sync stream arrive with the agent and coordinator.
