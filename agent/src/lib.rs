//! allot-agent: the regional daemon beside the gateways.
//!
//! A thin tokio driver over `allot_core::budget::RegionBudget` (mini-redis shape: the binary
//! parses flags, binds sockets and calls [`run`]). Only this crate knows sled.
//!
//! Map, one concern per file:
//! - [`run`]: wiring and graceful shutdown; [`settings`]: flags and bounds.
//! - [`state`]: the shared machine behind its mutex, and every call's path through it.
//! - [`commit`]: group commit, persistence before answers; [`store`]: the `Store` trait, sled
//!   behind a write-ahead log, the in-memory store, their conformance suite.
//! - [`service`]: the gRPC services (lease API, Envoy RLS) and rate limit headers;
//!   [`convert`]: protobuf <-> core, with input bounds. [`rlqs`]: Envoy's rate limit quota
//!   service (streamed usage reports, token bucket assignments backed by leases).
//! - [`admin`]: HTTP metrics, health, readiness, key view; [`metrics`]: names and handles.
//! - [`driver`]: timers, checkpoints, config reloads; [`sync_link`]: the coordinator seam;
//!   [`grpc_link`]: its real implementation, the sync stream to the coordinator's leader;
//!   [`coordinators`]: the `--coordinator` list and where a redirect goes.
//! - [`limits`]: the configuration in force; [`negative`]: the over-limit cache.
//! - [`clock`]: the one clock read; [`logging`]: tracing setup; [`error`]: the error type.

pub mod admin;
pub mod callers;
pub mod clock;
pub mod cluster_config;
pub mod commit;
pub mod convert;
pub mod coordinators;
pub mod driver;
pub mod error;
pub mod grpc_link;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod negative;
pub mod request;
pub mod rlqs;
pub mod run;
pub mod service;
pub mod settings;
pub mod state;
pub mod store;
pub mod sync_link;

pub use error::{Error, Result};
pub use run::{Listeners, run};
pub use settings::Settings;
