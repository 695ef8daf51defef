//! `allot-bench envoy-load`: Envoy in front, wrk as the HTTP load, four gateways measured in one
//! run, alternating (docs/benchmarks.md, "Envoy quota streaming (RLQS)"):
//!
//! - `no-limit`: Envoy with no limit filter (the RLQS bootstrap without its filter);
//! - `rls-agent`: Envoy's RLS filter against the agent, one call per request;
//! - `rlqs-agent`: Envoy's quota filter against the agent, reports and assignments;
//! - `rlqs-noop`: the quota filter against the no-op RLQS server ([`crate::noop_rlqs`]), the
//!   protocol's ceiling.
//!
//! The agent runs with a quota per key no run reaches, so the agent refuses nothing for the
//! quota's sake; what is refused anyway (Envoy enforcing an assignment sized before it
//! reported its rate) is counted as non-2xx. Every measured run follows an unmeasured warm-up
//! of the same gateway (printed too), long enough for a quota filter bucket to be assigned
//! from a report of its load (Envoy 1.40 reports about every 5 s). Each run prints its requests per second, its non-2xx count and the CPU
//! time of the server behind the gateway per admitted request (`/proc/<pid>/stat`, [`crate::cpu`]);
//! the summary gives the ratios of the means and of the best runs. Then, on request, a
//! second agent with a quota the load does reach, behind a fresh RLQS Envoy: what Envoy admitted
//! against the quota and the term docs/bound.md states for it.
//!
//! A benchmark: it asserts nothing about the figures.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::agent::{AgentCommand, AgentProcess, day_limits_yaml};
use crate::cpu::process_cpu_time;
use crate::envoy::{EnvoyFilter, EnvoyProcess, EnvoySetup, http_get};
use crate::error::{Error, Result};
use crate::noop_rlqs::NoopRlqsAssignment;
use crate::run::start_noop;
use crate::workload::{BENCH_DESCRIPTOR_KEY, BENCH_DOMAIN};
use crate::wrk::{API_KEY_HEADER, WrkLoad, WrkReport, run_wrk, write_keys_script};

/// The throughput run's quota per key and day: no run sends this many, so the agent refuses
/// nothing for the quota's sake (as [`crate::agent::BENCH_QUOTA_UNITS`]).
pub const THROUGHPUT_QUOTA_UNITS: u64 = crate::agent::BENCH_QUOTA_UNITS;

/// How long Envoy's RLS filter waits for the agent before letting the request pass
/// (`failure_mode_deny: false`): far above any answer time of a run, so nothing passes unasked.
pub const RLS_TIMEOUT: Duration = Duration::from_secs(1);

/// The part of the names of Envoy's RLS filter counters.
const RLS_STATS: &str = ".ratelimit.";

/// The four gateways, in the order each round runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gateway {
    NoLimit,
    RlsAgent,
    RlqsAgent,
    RlqsNoop,
}

impl Gateway {
    pub const ALL: [Gateway; 4] = [
        Gateway::NoLimit,
        Gateway::RlsAgent,
        Gateway::RlqsAgent,
        Gateway::RlqsNoop,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Gateway::NoLimit => "no-limit",
            Gateway::RlsAgent => "rls-agent",
            Gateway::RlqsAgent => "rlqs-agent",
            Gateway::RlqsNoop => "rlqs-noop",
        }
    }

    /// The server behind the gateway, whose CPU is measured: none without a filter.
    fn server(self) -> Option<Server> {
        match self {
            Gateway::NoLimit => None,
            Gateway::RlsAgent | Gateway::RlqsAgent => Some(Server::Agent),
            Gateway::RlqsNoop => Some(Server::Noop),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Agent,
    Noop,
}

/// Everything `envoy-load` needs.
#[derive(Clone, Debug)]
pub struct EnvoyLoadConfig {
    pub envoy_binary: PathBuf,
    pub wrk_binary: PathBuf,
    pub agent: AgentCommand,
    /// The binary with the `noop-server` subcommand (this harness's own).
    pub noop_binary: PathBuf,
    pub noop_rlqs_assignment: NoopRlqsAssignment,
    /// wrk's threads and connections, and the measured time of each run.
    pub wrk_threads: u32,
    pub wrk_connections: u32,
    pub duration: Duration,
    /// Distinct API keys per run: 1, or more through the wrk keys script.
    pub keys: u32,
    pub rounds: u32,
    /// wrk's unmeasured run against the gateway before each measured run.
    pub warmup: Duration,
    /// Envoy's worker threads (`--concurrency`), the same for the four.
    pub envoy_workers: u32,
    /// The quota filter's `reporting_interval`.
    pub reporting_interval: Duration,
    pub quota_run: Option<QuotaRun>,
}

/// The run against a quota the load reaches.
#[derive(Clone, Copy, Debug)]
pub struct QuotaRun {
    /// The quota per key and day.
    pub units_per_key: u64,
    pub duration: Duration,
}

/// One wrk run against one gateway.
#[derive(Clone, Copy, Debug)]
pub struct Measurement {
    pub round: u32,
    pub gateway: Gateway,
    pub wrk: WrkReport,
    /// The run's wall time, from wrk's start to its end.
    pub wall: Duration,
    /// The agent's CPU time over the run (idle but for its timers when the gateway is not
    /// one of its own).
    pub agent_cpu: Duration,
    /// The no-op server's CPU time over the run.
    pub noop_cpu: Duration,
    /// Envoy's own CPU time over the run.
    pub envoy_cpu: Duration,
}

impl Measurement {
    /// The CPU time of the server behind the gateway, none without a filter.
    pub fn server_cpu(&self) -> Option<Duration> {
        self.gateway.server().map(|server| match server {
            Server::Agent => self.agent_cpu,
            Server::Noop => self.noop_cpu,
        })
    }
}

/// One gateway over all rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatewaySummary {
    pub gateway: Gateway,
    pub mean_rps: f64,
    pub best_rps: f64,
    pub requests: u64,
    pub non_2xx: u64,
    pub socket_errors: u64,
    /// Server CPU over all rounds divided by the requests admitted in them, in microseconds.
    pub server_cpu_us_per_admitted: Option<f64>,
    /// Envoy's CPU over all rounds divided by the requests answered, in microseconds.
    pub envoy_cpu_us_per_request: f64,
    /// The agent's CPU over these runs per second of wall time, in milliseconds: for the
    /// gateways not in front of it, its cost at rest.
    pub agent_cpu_ms_per_sec: f64,
}

/// The per-gateway summary of `measurements`, in [`Gateway::ALL`]'s order (gateways with no
/// measurement left out).
pub fn summarize(measurements: &[Measurement]) -> Vec<GatewaySummary> {
    Gateway::ALL
        .iter()
        .filter_map(|&gateway| {
            let runs: Vec<&Measurement> = measurements
                .iter()
                .filter(|m| m.gateway == gateway)
                .collect();
            if runs.is_empty() {
                return None;
            }
            let rps: Vec<f64> = runs.iter().map(|m| m.wrk.requests_per_sec).collect();
            let requests: u64 = runs.iter().map(|m| m.wrk.requests).sum();
            let admitted: u64 = runs.iter().map(|m| m.wrk.admitted()).sum();
            let server_cpu: Option<Duration> = runs.iter().map(|m| m.server_cpu()).sum();
            let envoy_cpu: Duration = runs.iter().map(|m| m.envoy_cpu).sum();
            let agent_cpu: Duration = runs.iter().map(|m| m.agent_cpu).sum();
            let wall_secs: f64 = runs.iter().map(|m| m.wall.as_secs_f64()).sum();
            Some(GatewaySummary {
                gateway,
                mean_rps: rps.iter().sum::<f64>() / rps.len() as f64,
                best_rps: rps.iter().copied().fold(0.0, f64::max),
                requests,
                non_2xx: runs.iter().map(|m| m.wrk.non_2xx).sum(),
                socket_errors: runs.iter().map(|m| m.wrk.socket_errors).sum(),
                server_cpu_us_per_admitted: server_cpu.and_then(|c| per_us(c, admitted)),
                envoy_cpu_us_per_request: per_us(envoy_cpu, requests).unwrap_or(0.0),
                agent_cpu_ms_per_sec: if wall_secs > 0.0 {
                    agent_cpu.as_secs_f64() * 1e3 / wall_secs
                } else {
                    0.0
                },
            })
        })
        .collect()
}

fn per_us(cpu: Duration, n: u64) -> Option<f64> {
    (n > 0).then(|| cpu.as_secs_f64() * 1e6 / n as f64)
}

/// The summary as text: a line per gateway, then the ratios the issue names.
pub fn render_summary(summary: &[GatewaySummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<11} {:>11} {:>11} {:>9} {:>8} {:>7} {:>17} {:>16} {:>14}",
        "gateway",
        "mean req/s",
        "best req/s",
        "requests",
        "non-2xx",
        "sockerr",
        "server CPU us/adm",
        "Envoy CPU us/req",
        "agent CPU ms/s"
    );
    for s in summary {
        let _ = writeln!(
            out,
            "{:<11} {:>11.0} {:>11.0} {:>9} {:>8} {:>7} {:>17} {:>16.1} {:>14.1}",
            s.gateway.name(),
            s.mean_rps,
            s.best_rps,
            s.requests,
            s.non_2xx,
            s.socket_errors,
            s.server_cpu_us_per_admitted
                .map_or("-".to_owned(), |c| format!("{c:.2}")),
            s.envoy_cpu_us_per_request,
            s.agent_cpu_ms_per_sec
        );
    }
    let find = |g: Gateway| summary.iter().find(|s| s.gateway == g);
    for (num, den) in [
        (Gateway::RlqsAgent, Gateway::RlqsNoop),
        (Gateway::RlqsAgent, Gateway::RlsAgent),
        (Gateway::RlsAgent, Gateway::NoLimit),
        (Gateway::RlqsAgent, Gateway::NoLimit),
    ] {
        if let (Some(a), Some(b)) = (find(num), find(den)) {
            let _ = writeln!(
                out,
                "{} / {}: means {:.3}, best runs {:.3}",
                num.name(),
                den.name(),
                a.mean_rps / b.mean_rps,
                a.best_rps / b.best_rps
            );
        }
    }
    if let (Some(rlqs), Some(rls)) = (find(Gateway::RlqsAgent), find(Gateway::RlsAgent))
        && let (Some(q), Some(r)) = (
            rlqs.server_cpu_us_per_admitted,
            rls.server_cpu_us_per_admitted,
        )
    {
        let _ = writeln!(
            out,
            "agent CPU per admitted request: rlqs-agent {q:.3} us, rls-agent {r:.3} us, \
             rlqs / rls {:.4}",
            q / r
        );
    }
    out
}

/// The limits file of a run: one rule in [`BENCH_DOMAIN`], a counter per value of
/// [`BENCH_DESCRIPTOR_KEY`], `units_per_key` a day.
pub fn limits_yaml(units_per_key: u64) -> String {
    day_limits_yaml(BENCH_DOMAIN, BENCH_DESCRIPTOR_KEY, units_per_key)
}

fn envoy_setup(server: SocketAddr) -> EnvoySetup {
    EnvoySetup {
        rls_addr: server,
        domain: BENCH_DOMAIN.to_owned(),
        descriptor_header: API_KEY_HEADER.to_owned(),
        descriptor_key: BENCH_DESCRIPTOR_KEY.to_owned(),
        rls_timeout: RLS_TIMEOUT,
    }
}

fn subdir(parent: &Path, name: &str) -> Result<PathBuf> {
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    Ok(dir)
}

/// Runs the four gateways, `rounds` times each, alternating; then the quota run. Progress
/// lines go to stderr as each run ends; the returned text is the summary.
///
/// wrk and Envoy's start are blocking calls: nothing else runs on this runtime meanwhile (the
/// servers are other processes).
pub async fn run_envoy_load(config: &EnvoyLoadConfig) -> Result<String> {
    let work = tempfile::tempdir().map_err(|e| Error::io("creating a work directory", e))?;
    let work = work.path();
    let mut out = String::new();

    let agent = AgentProcess::start(
        &config.agent,
        &limits_yaml(THROUGHPUT_QUOTA_UNITS),
        BENCH_DOMAIN,
        &subdir(work, "agent")?,
    )
    .await?;
    let assignment = match config.noop_rlqs_assignment {
        NoopRlqsAssignment::TokenBucket => "token-bucket",
        NoopRlqsAssignment::AllowAll => "allow-all",
    };
    let (noop, noop_addr) = start_noop(
        &config.noop_binary,
        &["--rlqs-assignment", assignment],
        &subdir(work, "noop")?,
    )
    .await?;
    let rlqs = EnvoyFilter::Rlqs {
        reporting_interval: config.reporting_interval,
    };
    let start_envoy = |gateway: Gateway, server: SocketAddr, filter: EnvoyFilter| {
        EnvoyProcess::start_with_workers(
            &config.envoy_binary,
            &envoy_setup(server),
            filter,
            config.envoy_workers,
            &subdir(work, gateway.name())?,
        )
    };
    let envoys = [
        start_envoy(Gateway::NoLimit, agent.grpc_addr(), EnvoyFilter::NoLimit)?,
        start_envoy(Gateway::RlsAgent, agent.grpc_addr(), EnvoyFilter::Rls)?,
        start_envoy(Gateway::RlqsAgent, agent.grpc_addr(), rlqs)?,
        start_envoy(Gateway::RlqsNoop, noop_addr, rlqs)?,
    ];
    let script = (config.keys > 1)
        .then(|| write_keys_script(work))
        .transpose()?;
    let load = WrkLoad {
        threads: config.wrk_threads,
        connections: config.wrk_connections,
        duration: config.duration,
        keys: config.keys,
        script,
    };
    let _ = writeln!(
        out,
        "wrk -t{} -c{} -d{:?}, {} key(s), {} rounds, Envoy --concurrency {}, reporting_interval \
         {:?}, no-op RLQS assigns {assignment}",
        config.wrk_threads,
        config.wrk_connections,
        config.duration,
        config.keys,
        config.rounds,
        config.envoy_workers,
        config.reporting_interval,
    );
    let _ = writeln!(
        out,
        "throughput run: quota {THROUGHPUT_QUOTA_UNITS} per key and day, which no run reaches: \
         the agent refuses nothing for the quota's sake"
    );
    eprint!("{out}");

    let warmup = WrkLoad {
        duration: config.warmup,
        ..load.clone()
    };
    let mut measurements = Vec::new();
    for round in 1..=config.rounds {
        for (&gateway, envoy) in Gateway::ALL.iter().zip(&envoys) {
            if !config.warmup.is_zero() {
                let r = run_wrk(&config.wrk_binary, &warmup, envoy.listen_addr())?;
                eprintln!(
                    "round {round} {:<10} warm-up {:>10.0} req/s  non-2xx {}",
                    gateway.name(),
                    r.requests_per_sec,
                    r.non_2xx
                );
            }
            let pids = [agent.pid(), noop.pid(), envoy.pid()];
            let m = measure(config, &load, (round, gateway), envoy, pids)?;
            eprintln!("{}", progress_line(&m));
            measurements.push(m);
        }
    }
    let _ = writeln!(out, "{}", render_summary(&summarize(&measurements)));
    let _ = writeln!(out, "{}", rls_stats(&envoys[1]));

    // The throughput run's processes end before the quota run starts its own.
    drop(envoys);
    drop(noop);
    drop(agent);
    if let Some(quota) = config.quota_run {
        let text = quota_run(config, quota, &load, work).await?;
        out.push_str(&text);
    }
    Ok(out)
}

/// One measured run of `gateway` through `envoy`, with the CPU the agent, the no-op server
/// and that Envoy (`pids`, in that order) spent during it.
fn measure(
    config: &EnvoyLoadConfig,
    load: &WrkLoad,
    (round, gateway): (u32, Gateway),
    envoy: &EnvoyProcess,
    pids: [u32; 3],
) -> Result<Measurement> {
    let before = cpu_times(pids)?;
    let started = Instant::now();
    let wrk = run_wrk(&config.wrk_binary, load, envoy.listen_addr())?;
    let wall = started.elapsed();
    let after = cpu_times(pids)?;
    let spent = |i: usize| after[i].saturating_sub(before[i]);
    Ok(Measurement {
        round,
        gateway,
        wrk,
        wall,
        agent_cpu: spent(0),
        noop_cpu: spent(1),
        envoy_cpu: spent(2),
    })
}

/// The CPU time so far of each process of `pids`.
fn cpu_times<const N: usize>(pids: [u32; N]) -> Result<[Duration; N]> {
    let mut times = [Duration::ZERO; N];
    for (time, pid) in times.iter_mut().zip(pids) {
        *time = process_cpu_time(pid)?;
    }
    Ok(times)
}

fn progress_line(m: &Measurement) -> String {
    let cpu = m
        .server_cpu()
        .and_then(|c| per_us(c, m.wrk.admitted()))
        .map_or(String::new(), |us| {
            format!("  server CPU {us:.2} us/admitted")
        });
    format!(
        "round {} {:<10} {:>10.0} req/s  non-2xx {}  socket errors {}{cpu}  Envoy CPU {:.1} us/req",
        m.round,
        m.gateway.name(),
        m.wrk.requests_per_sec,
        m.wrk.non_2xx,
        m.wrk.socket_errors,
        per_us(m.envoy_cpu, m.wrk.requests).unwrap_or(0.0)
    )
}

/// Envoy's counters of its RLS filter's calls (`ok`, `over_limit`, `error`,
/// `failure_mode_allowed`: requests let pass because the call to the agent failed or timed
/// out, not decided by the agent).
fn rls_stats(envoy: &EnvoyProcess) -> String {
    match http_get(
        envoy.admin_addr(),
        &format!("/stats?filter={RLS_STATS}"),
        &[],
    ) {
        Ok(r) => {
            let body = String::from_utf8_lossy(&r.body);
            let lines: Vec<&str> = body
                .lines()
                .map(str::trim)
                .filter(|l| l.contains(RLS_STATS))
                .collect();
            format!("rls-agent Envoy's RLS counters: {}", lines.join(", "))
        }
        Err(e) => format!("rls-agent Envoy's stats unreadable: {e}"),
    }
}

/// A fresh agent whose quota the load reaches, behind a fresh RLQS Envoy, loaded once: what
/// Envoy admitted against the quota, and the agent's RLQS overage counters.
async fn quota_run(
    config: &EnvoyLoadConfig,
    quota: QuotaRun,
    load: &WrkLoad,
    work: &Path,
) -> Result<String> {
    let agent = AgentProcess::start(
        &config.agent,
        &limits_yaml(quota.units_per_key),
        BENCH_DOMAIN,
        &subdir(work, "quota-agent")?,
    )
    .await?;
    let envoy = EnvoyProcess::start_with_workers(
        &config.envoy_binary,
        &envoy_setup(agent.grpc_addr()),
        EnvoyFilter::Rlqs {
            reporting_interval: config.reporting_interval,
        },
        config.envoy_workers,
        &subdir(work, "quota-envoy")?,
    )?;
    let quota_load = WrkLoad {
        duration: quota.duration,
        ..load.clone()
    };
    let r = run_wrk(&config.wrk_binary, &quota_load, envoy.listen_addr())?;
    let total_quota = quota.units_per_key * u64::from(config.keys);
    let metrics = http_get(agent.http_addr(), "/metrics", &[])
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .unwrap_or_default();
    let metric = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or("0")
            .to_owned()
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "quota run: rlqs-agent, quota {} per key and day, {} key(s): {} in all; wrk -d{:?}",
        quota.units_per_key, config.keys, total_quota, quota.duration
    );
    let _ = writeln!(
        out,
        "  {} requests, {} admitted (2xx), {} refused (non-2xx), {} socket errors, {:.0} req/s",
        r.requests,
        r.admitted(),
        r.non_2xx,
        r.socket_errors,
        r.requests_per_sec
    );
    let over = r.admitted().saturating_sub(total_quota);
    let _ = writeln!(
        out,
        "  admitted - quota: {} ({})",
        r.admitted() as i128 - total_quota as i128,
        if over == 0 {
            "within the quota".to_owned()
        } else {
            format!("{over} over")
        }
    );
    let _ = writeln!(
        out,
        "  term (docs/bound.md, \"Envoy's quota streaming (RLQS)\", rlqs.yaml's behaviours): what \
         Envoy admits under ALLOW_ALL before each bucket's first assignment, charged to the \
         bucket's first lease (so inside the quota while the key has units left for it); \
         expiry is DENY_ALL"
    );
    let _ = writeln!(
        out,
        "  agent: net units charged over the keys (granted - refunded, /v1/keys) {}; \
         allot_rlqs_overage_units_total {}, allot_rlqs_uncharged_units_total {}, \
         allot_rlqs_assignments_total{{action=\"deny_all\"}} {}",
        net_units(agent.http_addr(), config.keys)
            .map_or_else(|e| format!("unreadable ({e})"), |n| n.to_string()),
        metric("allot_rlqs_overage_units_total"),
        metric("allot_rlqs_uncharged_units_total"),
        metric("allot_rlqs_assignments_total{action=\"deny_all\"}"),
    );
    Ok(out)
}

/// The units the agent charged to the run's keys: `net_units` of each key's `/v1/keys`, summed.
fn net_units(agent_http: SocketAddr, keys: u32) -> Result<u64> {
    let mut sum = 0;
    for i in 1..=keys {
        let path =
            format!("/v1/keys?domain={BENCH_DOMAIN}&descriptor={BENCH_DESCRIPTOR_KEY}=key-{i}");
        let r = http_get(agent_http, &path, &[])?;
        let key: serde_json::Value = serde_json::from_slice(&r.body)?;
        sum += key["net_units"]
            .as_u64()
            .ok_or_else(|| Error::Failed(format!("{path}: no net_units in {key}")))?;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(round: u32, gateway: Gateway, rps: f64, requests: u64, non_2xx: u64) -> Measurement {
        Measurement {
            round,
            gateway,
            wrk: WrkReport {
                requests,
                non_2xx,
                socket_errors: 0,
                requests_per_sec: rps,
            },
            wall: Duration::from_secs(5),
            agent_cpu: Duration::from_millis(match gateway {
                Gateway::NoLimit => 10,
                _ => 100,
            }),
            noop_cpu: Duration::from_millis(50),
            envoy_cpu: Duration::from_millis(500),
        }
    }

    #[test]
    fn summaries_take_means_best_runs_and_cpu_per_admitted_request() {
        let runs = [
            m(1, Gateway::RlsAgent, 10_000.0, 50_000, 0),
            m(2, Gateway::RlsAgent, 12_000.0, 60_000, 0),
            m(1, Gateway::RlqsAgent, 20_000.0, 100_000, 10_000),
            m(2, Gateway::RlqsAgent, 22_000.0, 110_000, 0),
            m(1, Gateway::NoLimit, 30_000.0, 150_000, 0),
            m(1, Gateway::RlqsNoop, 21_000.0, 100_000, 0),
        ];
        let s = summarize(&runs);
        let names: Vec<&str> = s.iter().map(|s| s.gateway.name()).collect();
        assert_eq!(names, ["no-limit", "rls-agent", "rlqs-agent", "rlqs-noop"]);
        // The no-op server's CPU, not the agent's: 50 ms over 100,000.
        assert!((s[3].server_cpu_us_per_admitted.unwrap() - 0.5).abs() < 1e-9);
        let rls = s[1];
        assert_eq!((rls.mean_rps, rls.best_rps), (11_000.0, 12_000.0));
        // 0.2 s of agent CPU over 110,000 admitted.
        let cpu = rls.server_cpu_us_per_admitted.unwrap();
        assert!((cpu - 200_000.0 / 110_000.0).abs() < 1e-9, "{cpu}");
        // The refused requests are not admitted: 0.2 s over 200,000.
        let rlqs = s[2];
        assert_eq!(rlqs.non_2xx, 10_000);
        assert!((rlqs.server_cpu_us_per_admitted.unwrap() - 1.0).abs() < 1e-9);
        assert!((rlqs.envoy_cpu_us_per_request - 1e6 / 210_000.0).abs() < 1e-9);
        assert_eq!(s[0].server_cpu_us_per_admitted, None);
        // At rest: 10 ms of agent CPU in 5 s.
        assert!((s[0].agent_cpu_ms_per_sec - 2.0).abs() < 1e-9);
        let text = render_summary(&s);
        assert!(text.contains("rlqs-agent / rls-agent: means 1.909, best runs 1.833"));
        assert!(text.contains("rlqs / rls 0.5500"), "{text}");
        assert!(text.contains("rlqs-agent / rlqs-noop: means 1.000, best runs 1.048"));
        let without_noop = render_summary(&s[..3]);
        assert!(
            !without_noop.contains("rlqs-noop"),
            "no ratio without its runs"
        );
    }

    #[test]
    fn the_limits_file_counts_the_key_envoy_puts_in_the_bucket() {
        use allot_core::config::{LimitsConfig, LoadOptions, SourceFile};
        use allot_core::limit::Quota;
        let yaml = limits_yaml(20_000);
        let config =
            LimitsConfig::load(&[SourceFile::new("l.yaml", &yaml)], &LoadOptions::default())
                .unwrap();
        let rules: Vec<_> = config.rules().collect();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].domain, BENCH_DOMAIN);
        assert_eq!(rules[0].descriptor_path(), BENCH_DESCRIPTOR_KEY);
        assert!(matches!(
            rules[0].spec.quota,
            Quota::Units { units: 20_000, .. }
        ));
        let setup = envoy_setup(SocketAddr::from(([127, 0, 0, 1], 1)));
        assert_eq!(setup.descriptor_key, BENCH_DESCRIPTOR_KEY);
        assert_eq!(setup.domain, BENCH_DOMAIN);
    }
}
