//! The agent's settings (from flags and `ALLOT_*` variables) and its fixed bounds on input.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_core::budget::BudgetConfig;
use allot_core::ids::RegionId;
use allot_proto::tls::{Peer, Tls};

use crate::callers::Callers;

use crate::clock::Clock;
use crate::coordinators::Coordinators;
use crate::error::{Error, Result};
use crate::store::Durability;

/// Largest gRPC message the agent decodes; a larger one is refused before it is read whole.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// Most HTTP/2 streams one gateway connection may hold open at once: its calls in flight,
/// its RLQS streams, and the refused calls whose bodies are still being drained (D68). A
/// gateway past it opens another connection or waits, as HTTP/2 clients do.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Default most gateway calls running at once before the agent sheds (`--max-in-flight-calls`).
pub const DEFAULT_MAX_IN_FLIGHT_CALLS: usize = 4_096;
/// Descriptors in one ShouldRateLimit request.
pub const MAX_DESCRIPTORS_PER_REQUEST: usize = 64;
/// `U`, the maximum clock uncertainty of the corrected timebase (D22, docs/bound.md, skew): a
/// strict window then counts no skew term once the agent's guard covers it.
pub const DEFAULT_MAX_CLOCK_UNCERTAINTY: Duration = Duration::from_millis(250);
/// Entries in one descriptor (or lease API target).
pub const MAX_ENTRIES_PER_DESCRIPTOR: usize = 32;
/// Bytes in one entry key or value.
pub const MAX_ENTRY_BYTES: usize = 1024;
/// Bytes in a domain name.
pub const MAX_DOMAIN_BYTES: usize = 256;
/// Bytes in an idempotency key.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 512;
/// Keys remembered as over their limit (the negative cache); past it, no new entry is added
/// until expired ones are dropped.
pub const NEGATIVE_CACHE_CAPACITY: usize = 65_536;
/// A store log this long is checkpointed at the next flush, whatever the checkpoint interval:
/// it bounds the disk the log takes and the time a start spends replaying it.
pub const MAX_LOG_BYTES: u64 = 64 << 20;
/// Records waiting for the store (a failing store makes them pile up); past it they are
/// dropped and the next write is a full snapshot instead.
pub const MAX_PENDING_RECORDS: usize = 262_144;
/// Longest the timer task sleeps, whatever the machine asks: a bound on how late a missed
/// wake-up can make a sweep.
pub const MAX_TIMER_SLEEP: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct Settings {
    /// This region's name.
    pub region: RegionId,
    /// Coordinator addresses: `host:port`, or `ID=host:port` for an address of this agent's
    /// own for node `ID` (a proxy, a NAT, a relay), which redirects to that node then take
    /// ([`crate::coordinators`]). None: single region, this agent owns every quota. Some: the
    /// agent syncs with the cluster's leader through one of them, as one of the regions the
    /// limits configuration names.
    pub coordinators: Vec<String>,
    /// Limits files; none means the embedded default.
    pub config_files: Vec<PathBuf>,
    /// Merge limits files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    pub merge_domains: bool,
    /// The store's directory.
    pub data_dir: PathBuf,
    pub durability: Durability,
    /// Time between two device flushes of the store's log: in `buffered` mode, what a
    /// machine crash can lose.
    pub flush_interval: Duration,
    /// Time between two checkpoints (the log's records applied to the sled tree, the tree
    /// flushed, the log dropped). A longer one applies fewer records (only the last of each
    /// item counts) and leaves a longer log to replay at start; a log past
    /// [`MAX_LOG_BYTES`] is checkpointed at the next flush whatever the time.
    pub checkpoint_interval: Duration,
    /// Time between two looks at the limits files' modification times.
    pub config_poll_interval: Duration,
    /// Share of a limit used from which an allowed decision counts as near the limit.
    pub near_limit_ratio: f64,
    /// Most gateway calls running at once, gRPC and HTTP together; past it a call is shed
    /// (`service::shed`).
    pub max_in_flight_calls: usize,
    /// Keys tracked per limit (idle ones are evicted to make room; beyond, a new key gets a
    /// degraded decision).
    pub max_keys_per_limit: usize,
    /// Longest wait for in-flight calls at shutdown.
    pub shutdown_grace: Duration,
    /// Seed of the Retry-After jitter; `None` draws one from the clock at start.
    pub jitter_seed: Option<u64>,
    /// Where the agent reads the time: the system clock, or a manual one in tests.
    pub clock: Clock,
    /// The data directory is an old copy (a restored backup) or was lost: the operator says
    /// so, and the agent admits nothing more in windows that began before its start
    /// (docs/budget.md, "Restores"). An empty data directory is treated as maybe restored
    /// whatever this says.
    pub restored: bool,
    /// Read windows on the coordinator's timebase (the clock corrected by the offset measured
    /// at every sync) and keep strict admissions this far at most from window edges
    /// (docs/bound.md, skew): [`DEFAULT_MAX_CLOCK_UNCERTAINTY`] by default. `None`: windows
    /// on the agent's own clock. An agent without coordinators has no timebase either way.
    pub max_clock_uncertainty: Option<Duration>,
    /// Mutual TLS on the link to the coordinators (D58): the certificate must name this
    /// region. `None`: plaintext.
    pub tls: Option<Tls>,
    /// Who may call the gateway-facing APIs and for which domains (D59); `None`: anyone.
    pub callers: Option<Arc<Callers>>,
    /// Where `callers` was read from, read again when it changes.
    pub callers_file: Option<PathBuf>,
    /// Serve the gateway-facing gRPC port over TLS with `tls`'s certificate (a client
    /// certificate optional: callers may prove themselves with a token instead).
    pub gateway_tls: bool,
    /// Serve the HTTP port (the HTTP/JSON lease API, metrics, status) over TLS with `tls`'s
    /// certificate, HTTP/1.1.
    pub http_tls: bool,
    /// The SHA-256 of the token the operators' reads (`/metrics`, `/v1/status`, `/v1/keys`)
    /// and key watches must carry as `Authorization: Bearer` (D63); `None`: they are open.
    /// `/healthz` and `/readyz` stay open for load balancers.
    pub read_token_sha256: Option<[u8; 32]>,
}

impl Settings {
    /// Defaults for everything but the region and the data directory.
    pub fn new(region: RegionId, data_dir: PathBuf) -> Self {
        Settings {
            region,
            coordinators: Vec::new(),
            config_files: Vec::new(),
            merge_domains: false,
            data_dir,
            durability: Durability::default(),
            flush_interval: Duration::from_millis(100),
            checkpoint_interval: Duration::from_secs(5),
            config_poll_interval: Duration::from_secs(1),
            near_limit_ratio: 0.8,
            max_keys_per_limit: 1_000_000,
            shutdown_grace: Duration::from_secs(10),
            jitter_seed: None,
            clock: Clock::System,
            restored: false,
            max_clock_uncertainty: Some(DEFAULT_MAX_CLOCK_UNCERTAINTY),
            tls: None,
            callers: None,
            callers_file: None,
            gateway_tls: false,
            http_tls: false,
            read_token_sha256: None,
            max_in_flight_calls: DEFAULT_MAX_IN_FLIGHT_CALLS,
        }
    }

    /// Every problem at once.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.region.as_str().is_empty() {
            problems.push("the region name is empty".to_owned());
        }
        if let Err(mut p) = Coordinators::parse(&self.coordinators) {
            problems.append(&mut p);
        }
        if !(self.near_limit_ratio > 0.0 && self.near_limit_ratio <= 1.0) {
            problems.push(format!(
                "near-limit ratio {} is not in (0, 1]",
                self.near_limit_ratio
            ));
        }
        if self.flush_interval.is_zero()
            || self.checkpoint_interval.is_zero()
            || self.config_poll_interval.is_zero()
        {
            problems
                .push("flush, checkpoint and config poll intervals must be positive".to_owned());
        }
        if self.max_keys_per_limit == 0 {
            problems.push("max keys per limit must be at least 1".to_owned());
        }
        if let Some(tls) = &self.tls {
            let me = Peer::Region(self.region.as_str().to_owned());
            if *tls.me() != me {
                problems.push(format!(
                    "the TLS certificate names {}, but this agent is {me}",
                    tls.me()
                ));
            }
            if self.coordinators.is_empty() && !self.gateway_tls && !self.http_tls {
                problems.push(
                    "TLS certificates are for the link to the coordinators (--coordinator) or \
                     the agent's own ports (--gateway-tls, --http-tls): name one"
                        .to_owned(),
                );
            }
        }
        if self.max_in_flight_calls == 0 {
            problems.push("--max-in-flight-calls must be at least 1".to_owned());
        }
        if self.gateway_tls && self.tls.is_none() {
            problems.push("--gateway-tls needs --tls-cert, --tls-key and --tls-ca".to_owned());
        }
        if self.http_tls && self.tls.is_none() {
            problems.push("--http-tls needs --tls-cert, --tls-key and --tls-ca".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Settings(problems.join("; ")))
        }
    }

    /// Whether the agent syncs with a coordinator cluster.
    pub fn is_coordinated(&self) -> bool {
        !self.coordinators.is_empty()
    }

    /// The budget machine's configuration. Without coordinators: one region owning every
    /// quota. With them: this region among `regions`, the deployment's regions as the limits
    /// configuration names them ([`crate::limits::Limits::regions`]), which must include
    /// this one: a region the configuration does not name has no share of any quota, so it
    /// is refused at start rather than left to deny everything.
    pub fn budget_config(&self, regions: &BTreeSet<RegionId>) -> Result<BudgetConfig> {
        let base = if self.is_coordinated() {
            if !regions.contains(&self.region) {
                return Err(Error::Settings(unnamed_region(&self.region, regions)));
            }
            BudgetConfig::new(self.region.clone(), regions.iter().cloned().collect())
        } else {
            BudgetConfig::single_region(self.region.clone())
        };
        Ok(BudgetConfig {
            max_keys_per_limit: self.max_keys_per_limit,
            max_edge_band: self.max_clock_uncertainty,
            ..base
        })
    }
}

fn unnamed_region(region: &RegionId, regions: &BTreeSet<RegionId>) -> String {
    if regions.is_empty() {
        return format!(
            "region '{region}': with --coordinator, the limits configuration must name the \
             deployment's regions (in the `allot.weights` of its limits), and it names none"
        );
    }
    let named: Vec<&str> = regions.iter().map(RegionId::as_str).collect();
    format!(
        "region '{region}' is not named in the limits configuration (its limits' \
         `allot.weights` name {}); set --region to one of them, or add it to the weights",
        named.join(", ")
    )
}

/// `host:port` with a non-empty host and a port number.
pub fn check_address(addr: &str) -> std::result::Result<(), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| "expected host:port".to_owned())?;
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err("expected host:port".to_owned());
    }
    port.parse::<u16>()
        .map_err(|_| format!("'{port}' is not a port number"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_addresses_need_a_host_and_a_port() {
        assert!(check_address("coord-1.internal:7000").is_ok());
        assert!(check_address("[::1]:7000").is_ok());
        assert!(check_address("coord-1").is_err());
        assert!(check_address(":7000").is_err());
        assert!(check_address("coord:http").is_err());
    }

    #[test]
    fn every_bad_setting_is_reported() {
        let mut s = Settings::new(RegionId::from("eu"), PathBuf::from("d"));
        s.coordinators = vec!["nope".into()];
        s.near_limit_ratio = 1.5;
        let msg = s.validate().expect_err("invalid").to_string();
        assert!(msg.contains("coordinator 'nope'"), "{msg}");
        assert!(msg.contains("near-limit ratio 1.5"), "{msg}");
    }

    #[test]
    fn a_coordinated_region_must_be_named_by_the_configuration() {
        let mut s = Settings::new(RegionId::from("eu"), PathBuf::from("d"));
        let named: BTreeSet<RegionId> = ["eu", "us"].into_iter().map(RegionId::from).collect();
        let alone = s.budget_config(&BTreeSet::new()).expect("single region");
        assert!(!alone.coordinated);
        s.coordinators = vec!["coord:7000".into()];
        let cfg = s.budget_config(&named).expect("named");
        assert!(cfg.coordinated);
        assert_eq!(cfg.regions, [RegionId::from("eu"), RegionId::from("us")]);
        s.region = RegionId::from("ap");
        let msg = s.budget_config(&named).expect_err("unnamed").to_string();
        assert!(msg.contains("region 'ap' is not named"), "{msg}");
        assert!(msg.contains("name eu, us"), "{msg}");
        let msg = s
            .budget_config(&BTreeSet::new())
            .expect_err("none")
            .to_string();
        assert!(msg.contains("names none"), "{msg}");
    }
}
