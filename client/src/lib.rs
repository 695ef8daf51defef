//! allot-client: what a Rust service or gateway embeds to enforce allot's limits with no
//! network hop on the request path.
//!
//! A thin async driver around `allot_core::gateway::Gateway` (the state machine the simulator
//! drives): [`Client::spend`] decides from units leased from the region's agent; a background
//! task refills leases ahead of need over the agent's lease API, hands back spent leases with
//! the next request, follows each key's failure mode while the agent is unreachable, and
//! reconnects with capped backoff and jitter. See docs/client.md.

mod backoff;
mod client;
mod config;
mod driver;
mod error;
mod response;
mod target;

pub use allot_core::gateway::GatewayConfig;
pub use allot_core::limit::FailureMode;
pub use client::{Client, ClientStats, Decision, Key, Reservation, SlotGuard};
pub use config::{ClientConfig, MAX_SHARDS};
pub use error::{Error, Result};
pub use response::{Policy, TOO_MANY_REQUESTS, too_many_requests};
pub use target::Target;
