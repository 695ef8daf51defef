//! allot-core: the deterministic state machines of allot.
//!
//! This crate does no IO. It never reads a clock (`Instant::now`, `SystemTime::now`), never
//! touches the network, a file or OS randomness, and knows neither tokio, tonic nor sled. Time
//! comes in as a [`time::Timestamp`] argument and randomness as a seeded generator, so the
//! daemons and the simulator drive exactly the same code, and any run replays from its inputs.
//!
//! Map:
//! - [`config`]: envoyproxy/ratelimit YAML (plus allot's `allot:` block) -> [`limit::LimitSpec`]s,
//!   and descriptor matching as Envoy's rate limit service does it.
//! - [`algo`]: the limiting algorithms (GCRA, fixed window, sliding window counter,
//!   concurrency slots).
//! - [`budget`]: the regional budget state machine an agent runs.
//! - [`rebalance`]: the coordinator's allowance table, rebalancer and bound calculator.
//! - [`sync`]: the messages between the two.
//! - [`gateway`]: the lease logic a gateway runs (the `client` crate drives it).
//! - [`headers`]: rate limit response headers (draft-11 and `X-RateLimit-*`), for the agent's
//!   RLS answers and the client's 429s alike.

pub mod algo;
pub mod budget;
pub mod config;
pub mod error;
pub mod gateway;
pub mod headers;
pub mod ids;
pub mod limit;
pub mod rebalance;
pub mod sync;
pub mod time;

pub use error::{Error, Result};
