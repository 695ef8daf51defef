//! The client's settings: the agent to talk to, the gateway state machine's bounds, and how the
//! driver behaves when the agent is slow or gone.

use std::collections::HashMap;
use std::time::Duration;

use allot_core::gateway::GatewayConfig;
use allot_core::limit::FailureMode;
use tonic::transport::ClientTlsConfig;

use crate::error::{Error, Result};

/// Most shards; each is a gateway behind its own mutex.
pub const MAX_SHARDS: usize = 1_024;

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The region's agent, as a gRPC URI (`http://127.0.0.1:7000`).
    pub agent: String,
    /// Bounds and tuning of each shard's gateway. `max_keys` is per shard.
    pub gateway: GatewayConfig,
    /// Number of independent gateways keys are spread over by hash (a power of two, at most
    /// [`MAX_SHARDS`]): two keys contend only when they share a shard.
    pub shards: usize,
    /// What a key does while the agent cannot be reached and its leases are spent: `Open`
    /// admits, `Closed` refuses. Per domain in `failure_modes`, else this.
    pub failure_mode: FailureMode,
    /// Failure modes of particular domains (the agent's rules are not known to the client).
    pub failure_modes: HashMap<String, FailureMode>,
    /// Lease TTL asked for (the agent caps it at its maximum and the window's end).
    pub lease_ttl: Duration,
    /// Each RPC to the agent gives up after this long (the key then reads as unavailable).
    pub rpc_timeout: Duration,
    /// First reconnection delay ceiling; doubled per failure up to `reconnect_cap`, with full
    /// jitter.
    pub reconnect_base: Duration,
    pub reconnect_cap: Duration,
    /// Most RPCs in flight to the agent at once; the driver waits for one to finish beyond it.
    pub max_in_flight_rpcs: usize,
    /// Most lease hand-backs waiting to be sent, and as many slot releases. Beyond it the
    /// oldest hand-back is dropped (the agent counts its units spent until the lease expires:
    /// units stranded, never admitted twice), or the slot is left to its TTL; both counted.
    pub max_pending_returns: usize,
    /// How long [`crate::Client::shutdown`] tries to give unused units back.
    pub shutdown_timeout: Duration,
    /// Most units a key's fast budget takes from a lease at once (docs/decisions.md, D44):
    /// spenders take them with no lock until they run out or the lease expires. A chunk is
    /// also at most a quarter of its lease. 0 turns the fast budget off: every decision
    /// locks the key's shard.
    pub max_chunk_units: u64,
    /// TLS to an agent run with `--gateway-tls` (the address then starts `https://`): the
    /// agent's CA, and this gateway's certificate when it proves itself with one
    /// (`allot_proto::tls::TlsFiles::load()?.client()` builds both from files).
    pub tls: Option<ClientTlsConfig>,
    /// Sent as `authorization: Bearer TOKEN` on every call, for an agent whose callers file
    /// names this gateway by a token (docs/security.md).
    pub bearer_token: Option<String>,
}

impl ClientConfig {
    pub fn new(agent: impl Into<String>) -> Self {
        ClientConfig {
            agent: agent.into(),
            gateway: GatewayConfig::default(),
            shards: 16,
            failure_mode: FailureMode::Open,
            failure_modes: HashMap::new(),
            lease_ttl: Duration::from_secs(10),
            rpc_timeout: Duration::from_secs(1),
            reconnect_base: Duration::from_millis(50),
            reconnect_cap: Duration::from_secs(5),
            max_in_flight_rpcs: 64,
            max_pending_returns: 4_096,
            shutdown_timeout: Duration::from_secs(2),
            max_chunk_units: 1_000,
            tls: None,
            bearer_token: None,
        }
    }

    pub(crate) fn failure_mode_of(&self, domain: &str) -> FailureMode {
        self.failure_modes
            .get(domain)
            .copied()
            .unwrap_or(self.failure_mode)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        self.gateway.validate()?;
        let problem = if !self.shards.is_power_of_two() || self.shards > MAX_SHARDS {
            "shards must be a power of two, at most MAX_SHARDS"
        } else if self.max_in_flight_rpcs == 0 {
            "max_in_flight_rpcs must be at least 1"
        } else if self.rpc_timeout.is_zero() || self.reconnect_cap < self.reconnect_base {
            "rpc_timeout must be positive and reconnect_cap at least reconnect_base"
        } else if self
            .bearer_token
            .as_deref()
            .is_some_and(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            "bearer_token must be printable ASCII with no spaces"
        } else {
            return Ok(());
        };
        Err(Error::Config(problem.to_owned()))
    }
}
