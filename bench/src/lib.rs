//! allot-bench: the end-to-end benchmark harness for the daemons, and the pieces of the real
//! Envoy test.
//!
//! A gRPC load generator ([`loadgen`]) drives N concurrent callers over loopback for a bounded
//! time against any server address: the lease API's `Acquire` or `Lease`, Envoy's RLS
//! `ShouldRateLimit`, or a GCRA Lua script in Redis through `EVALSHA`. It reports throughput,
//! latency quantiles, errors and the server's CPU time per decision, read from
//! `/proc/<pid>/stat` before and after the measured interval ([`cpu`]).
//!
//! The servers it compares, started by [`run`] in one invocation: a no-op tonic server of the
//! same RPCs ([`noop`], the transport's ceiling), the agent as a subprocess started from a
//! binary path ([`agent`]; this crate never links it), and `redis-server` ([`redis`]).
//! [`envoy`] templates an Envoy bootstrap and runs the real proxy for the gateway test.
//! [`envoy_load`] puts Envoy in front and loads it over HTTP with wrk ([`wrk`]): no limit
//! filter, RLS against the agent, and the rate limit quota filter (RLQS) against the agent and
//! against the no-op RLQS server ([`noop_rlqs`]), in one run.
//!
//! This is a harness, not a daemon: it does IO, reads clocks and starts processes. Micro-benchmarks
//! of the core live in `core/benches` (criterion).

pub mod agent;
pub mod cpu;
pub mod envoy;
pub mod envoy_load;
pub mod error;
pub mod histogram;
pub mod loadgen;
pub mod noop;
pub mod noop_rlqs;
pub mod process;
pub mod redis;
pub mod run;
pub mod workload;
pub mod wrk;

pub use error::{Error, Result};
