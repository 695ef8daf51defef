//! The agent, started as a subprocess from a binary path (this crate never links it):
//! `<bin> agent --config <limits> --grpc <addr> --http <addr> --data <dir>`, the interface of
//! the agent issue, with a limits file written for the run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;

use crate::error::{Error, Result};
use crate::process::{ChildProcess, free_loopback_port};
use crate::workload::{BENCH_DESCRIPTOR_KEY, BENCH_DOMAIN};

/// How long a started agent gets to answer its first `Acquire`.
pub const AGENT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between readiness probes.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The benchmark's quota per key and day: more than any run sends, so the agent never denies
/// and every call takes the full admission path. Below `u32::MAX`, since Envoy's RLS reports a
/// limit's quota as a uint32.
pub const BENCH_QUOTA_UNITS: u64 = 4_000_000_000;

/// The limits file the benchmark starts the agent with: one rule, one counter per value of
/// [`BENCH_DESCRIPTOR_KEY`] in [`BENCH_DOMAIN`], with [`BENCH_QUOTA_UNITS`] per day.
pub fn bench_limits_yaml() -> String {
    let rule = day_limits_yaml(BENCH_DOMAIN, BENCH_DESCRIPTOR_KEY, BENCH_QUOTA_UNITS);
    format!("# Written by allot-bench: a quota no run reaches, so nothing is denied.\n{rule}")
}

/// A limits file of one rule: `units_per_key` a day for each value of `descriptor_key` in
/// `domain` (a day, so that a run never straddles a window's end in practice).
pub fn day_limits_yaml(domain: &str, descriptor_key: &str, units_per_key: u64) -> String {
    format!(
        "domain: {domain}\n\
         descriptors:\n  \
           - key: {descriptor_key}\n    \
             rate_limit:\n      \
               unit: day\n      \
               requests_per_unit: {units_per_key}\n"
    )
}

/// How to start the agent.
#[derive(Clone, Debug)]
pub struct AgentCommand {
    /// The `allot` binary (e.g. `target/release/allot`).
    pub binary: PathBuf,
    /// Arguments appended after the harness's own (e.g. `--region bench`).
    pub extra_args: Vec<String>,
}

/// A running agent: its gRPC and HTTP addresses, stopped when dropped.
pub struct AgentProcess {
    process: ChildProcess,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
}

impl AgentProcess {
    /// Writes `limits_yaml` into `work_dir`, starts the agent on free loopback ports with its
    /// data in `work_dir/data`, and waits until an `Acquire` in `probe_domain` is answered.
    pub async fn start(
        command: &AgentCommand,
        limits_yaml: &str,
        probe_domain: &str,
        work_dir: &Path,
    ) -> Result<Self> {
        let grpc_addr = SocketAddr::from(([127, 0, 0, 1], free_loopback_port()?));
        let http_addr = SocketAddr::from(([127, 0, 0, 1], free_loopback_port()?));
        Self::start_at(
            command,
            limits_yaml,
            probe_domain,
            work_dir,
            (grpc_addr, http_addr),
        )
        .await
    }

    /// As [`AgentProcess::start`], on the given (gRPC, HTTP) addresses: a restart of an
    /// agent that ran in `work_dir` takes up its data and its addresses again.
    pub async fn start_at(
        command: &AgentCommand,
        limits_yaml: &str,
        probe_domain: &str,
        work_dir: &Path,
        (grpc_addr, http_addr): (SocketAddr, SocketAddr),
    ) -> Result<Self> {
        let limits = work_dir.join("limits.yaml");
        std::fs::write(&limits, limits_yaml)
            .map_err(|e| Error::io(format!("writing {}", limits.display()), e))?;
        let mut cmd = Command::new(&command.binary);
        cmd.arg("agent")
            .arg("--config")
            .arg(&limits)
            .arg("--grpc")
            .arg(grpc_addr.to_string())
            .arg("--http")
            .arg(http_addr.to_string())
            .arg("--data")
            .arg(work_dir.join("data"))
            .args(&command.extra_args);
        let process = ChildProcess::spawn("agent", cmd, work_dir)?;
        let mut agent = AgentProcess {
            process,
            grpc_addr,
            http_addr,
        };
        agent.wait_ready(probe_domain).await?;
        Ok(agent)
    }

    async fn wait_ready(&mut self, probe_domain: &str) -> Result<()> {
        let started = Instant::now();
        let mut last_error = String::from("no attempt");
        while started.elapsed() < AGENT_START_TIMEOUT {
            if self.process.exit_status().is_some() {
                break;
            }
            match probe(self.grpc_addr, probe_domain).await {
                Ok(()) => return Ok(()),
                Err(e) => last_error = e,
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
        Err(self.process.not_ready(started.elapsed(), &last_error))
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Stops the agent with SIGTERM (its graceful shutdown); returns whether it exited before
    /// being killed.
    pub fn stop(&mut self) -> bool {
        self.process.stop()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}

/// Ready means the lease API at `addr` answers. The probe is an `Acquire` on a descriptor no rule
/// matches, in `domain`, so it takes nothing from the keys a run measures. Any answer but
/// `Unavailable` counts: a server that refuses the probe's shape is up, and a run's own calls
/// report what it answers them.
pub(crate) async fn probe(addr: SocketAddr, domain: &str) -> Result<(), String> {
    let mut client = LeaseServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    let req = pb::AcquireRequest {
        target: Some(pb::Target {
            domain: domain.to_owned(),
            entries: vec![pb::Entry {
                key: "allot_bench_probe".to_owned(),
                value: "probe".to_owned(),
            }],
        }),
        cost_units: 1,
        idempotency_key: String::new(),
    };
    match client.acquire(req).await {
        Err(s) if s.code() == tonic::Code::Unavailable => {
            Err(format!("Acquire answered Unavailable: {}", s.message()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_core::config::{LimitsConfig, LoadOptions, SourceFile};
    use allot_core::limit::Quota;
    use allot_core::time::Window;

    #[test]
    fn the_bench_limits_file_is_valid_and_has_one_rule_in_the_bench_domain() {
        let yaml = bench_limits_yaml();
        let config = LimitsConfig::load(
            &[SourceFile::new("bench.yaml", &yaml)],
            &LoadOptions::default(),
        )
        .unwrap();
        let rules: Vec<_> = config.rules().collect();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].domain, BENCH_DOMAIN);
        assert_eq!(rules[0].descriptor_path(), BENCH_DESCRIPTOR_KEY);
        match rules[0].spec.quota {
            Quota::Units { units, window } => {
                assert_eq!(units, BENCH_QUOTA_UNITS);
                assert_eq!(window, Window::new(Duration::from_secs(86_400)));
            }
            Quota::Unlimited => panic!("the bench rule must count"),
        }
    }
}
