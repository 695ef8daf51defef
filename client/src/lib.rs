//! allot-client: what a Rust service or gateway embeds to enforce allot's limits with no
//! network hop on the request path.
//!
//! A thin async driver around `allot_core::gateway::Gateway` (the state machine the simulator
//! drives): [`Client::spend`] decides from units leased from the region's agent; a background
//! task refills leases ahead of need over the agent's lease API, hands back spent leases with
//! the next request, follows each key's failure mode while the agent is unreachable, and
//! reconnects with capped backoff and jitter. With the `tower` feature, [`AllotLayer`] puts
//! the client in front of any HTTP `tower::Service` (axum, hyper, tonic). See docs/client.md.

mod axes;
mod backoff;
mod chunk;
mod client;
mod config;
mod driver;
mod error;
#[cfg(feature = "tower")]
mod layer;
mod response;
mod target;

pub use allot_core::gateway::GatewayConfig;
pub use allot_core::limit::FailureMode;
pub use axes::{Axes, MAX_AXES, Reservations};
pub use client::{Client, ClientStats, Decision, Key, Reservation, SlotGuard};
pub use config::{ClientConfig, MAX_SHARDS};
pub use error::{Error, Result};
#[cfg(feature = "tower")]
pub use layer::{
    AllotLayer, AllotService, Descriptor, MAX_CACHED_KEYS, MAX_DESCRIPTOR_ENTRIES, ResponseFuture,
    one_unit,
};
pub use response::{Policy, TOO_MANY_REQUESTS, too_many_requests};
pub use target::Target;
