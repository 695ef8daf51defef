//! `allot coordinator` (one node of the coordinator cluster) and `allot status`, which prints
//! a node's `/v1/status`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::certs_cmd::{TlsArgs, digest_flag, tls_flags};
use allot_agent::logging;
use allot_coordinator::daemon::{Daemon, DaemonSettings, limits, parse_peers};
use allot_coordinator::raft_config::raft_config;
use allot_core::rebalance::CoordinatorConfig;
use clap::Args;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

/// Time to connect to a node's admin HTTP and read its answer, from `allot status`.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Largest status answer read (a status lists at most 1,000 limits' bounds).
const MAX_STATUS_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Args)]
pub struct CoordinatorArgs {
    /// This node's raft id; one of --peers.
    #[arg(long, env = "ALLOT_NODE_ID", default_value_t = 1)]
    id: u64,
    /// The initial members, ID=HOST:PORT,... (each node's --grpc as the others reach it).
    /// None: a single-node cluster at --grpc. Used only when the data directory is new.
    #[arg(long, env = "ALLOT_PEERS", conflicts_with = "join")]
    peers: Option<String>,
    /// Start empty and wait to be added with `allot cluster add-node` (never initialise a
    /// cluster of its own). Ignored once the data directory holds the cluster's log.
    #[arg(long, env = "ALLOT_JOIN")]
    join: bool,
    /// gRPC address: raft between nodes and the agents' sync stream.
    #[arg(long, env = "ALLOT_COORDINATOR_GRPC", default_value = "127.0.0.1:7070")]
    grpc: String,
    /// Admin HTTP address (/healthz, /v1/status, /metrics).
    #[arg(long, env = "ALLOT_COORDINATOR_HTTP", default_value = "127.0.0.1:7071")]
    http: String,
    /// Data directory (raft log, vote and snapshots).
    #[arg(
        long,
        env = "ALLOT_COORDINATOR_DATA",
        default_value = "./allot-coordinator-data"
    )]
    data: PathBuf,
    /// The cluster's name: nodes refuse raft messages from another cluster.
    #[arg(long, env = "ALLOT_CLUSTER", default_value = "allot")]
    cluster: String,
    /// Limits files (envoyproxy/ratelimit YAML), the ones the agents load: put at
    /// --limits-version when the cluster holds an older version (or none).
    #[arg(long = "limits", env = "ALLOT_LIMITS", value_delimiter = ',', num_args = 1..)]
    limits: Vec<PathBuf>,
    /// The version the limits are put at. Agents number their configuration by loads (the
    /// first is 1): the two must agree for grants to be taken.
    #[arg(long, env = "ALLOT_LIMITS_VERSION", default_value_t = 1)]
    limits_version: u64,
    /// Merge limits files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "ALLOT_MERGE_DOMAINS")]
    merge_domains: bool,
    /// Log JSON lines instead of text on stderr (level from ALLOT_LOG).
    #[arg(long, env = "ALLOT_LOG_JSON")]
    log_json: bool,
    #[command(flatten)]
    tls: TlsArgs,
    /// The SHA-256 (64 hex digits) of the token that changes through the admin HTTP
    /// (configuration, membership, regions) must carry: `printf %s TOKEN | sha256sum`. The
    /// CLI sends ALLOT_ADMIN_TOKEN. None: anyone who reaches the port may change them.
    #[arg(long, env = "ALLOT_ADMIN_TOKEN_SHA256", value_name = "HEX")]
    admin_token_sha256: Option<String>,
    /// The SHA-256 (64 hex digits) of the token the admin HTTP's reads (status, config,
    /// members, regions, metrics) must carry; the admin token opens them too. The CLI sends
    /// ALLOT_READ_TOKEN (or ALLOT_ADMIN_TOKEN); the dashboard takes it as `#token=TOKEN`.
    /// None: reads are open. The dashboard's page and /healthz stay open.
    #[arg(long, env = "ALLOT_READ_TOKEN_SHA256", value_name = "HEX")]
    read_token_sha256: Option<String>,
    /// Serve the admin HTTP over TLS with the --tls-* certificate (a client certificate
    /// optional). The CLI then names the node `https://HOST:PORT` and trusts ALLOT_TLS_CA.
    #[arg(long, env = "ALLOT_ADMIN_TLS")]
    admin_tls: bool,
}

pub fn coordinator(args: CoordinatorArgs) -> ExitCode {
    logging::init(args.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(1, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => fail(1, &msg),
    }
}

fn settings(args: &CoordinatorArgs) -> Result<DaemonSettings, String> {
    let peers = parse_peers(args.peers.as_deref().unwrap_or(""))?;
    let limits = if args.limits.is_empty() {
        None
    } else {
        let files = limits::read(&args.limits, args.limits_version, args.merge_domains)
            .map_err(|p| p.join("\n"))?;
        Some(limits::StartLimits::Files(files))
    };
    Ok(DaemonSettings {
        id: args.id,
        peers,
        join: args.join,
        data_dir: args.data.clone(),
        raft: raft_config(&args.cluster).map_err(|e| e.to_string())?,
        rebalance: CoordinatorConfig::default(),
        limits,
        tls: tls_flags(&args.tls)?,
        admin_token_sha256: digest_flag(
            "--admin-token-sha256",
            args.admin_token_sha256.as_deref(),
        )?,
        read_token_sha256: digest_flag("--read-token-sha256", args.read_token_sha256.as_deref())?,
        admin_tls: args.admin_tls,
    })
}

async fn serve(args: CoordinatorArgs) -> Result<(), String> {
    let settings = settings(&args)?;
    let bind = |addr: String, what: &'static str| async move {
        TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} ({what}): {e}"))
    };
    let grpc = bind(args.grpc, "gRPC").await?;
    let http = bind(args.http, "HTTP").await?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let daemon = Daemon::start(settings, grpc, http)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "ready grpc={} http={}",
        daemon.grpc_addr(),
        daemon.http_addr()
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    daemon.shutdown().await.map_err(|e| e.to_string())
}

#[derive(Args)]
pub struct StatusArgs {
    /// A coordinator node's admin HTTP address (its --http).
    #[arg(long, env = "ALLOT_COORDINATOR_HTTP", default_value = "127.0.0.1:7071")]
    coordinator: String,
    /// Print the node's JSON as it is.
    #[arg(long)]
    json: bool,
}

/// Prints a node's status; exits 2 when the node cannot be read.
pub fn status(args: StatusArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(2, &format!("cannot start the runtime: {e}")),
    };
    let read = runtime.block_on(async {
        tokio::time::timeout(STATUS_TIMEOUT, get_json(&args.coordinator, "/v1/status")).await
    });
    let status = match read {
        Ok(Ok(v)) => v,
        Ok(Err(msg)) => return fail(2, &msg),
        Err(_) => {
            return fail(
                2,
                &format!("{}: no answer in {STATUS_TIMEOUT:?}", args.coordinator),
            );
        }
    };
    if args.json {
        println!("{status}");
    } else {
        print!("{}", summary(&status));
    }
    ExitCode::SUCCESS
}

/// GET over HTTP/1.1 on a fresh connection; the body parsed as JSON.
async fn get_json(addr: &str, path: &str) -> Result<Value, String> {
    let (mut s, host) = crate::admin_http::connect(addr).await?;
    let auth = crate::config_cmd::authorization("GET")?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{auth}\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut resp = Vec::new();
    s.take(MAX_STATUS_BYTES)
        .read_to_end(&mut resp)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let resp = String::from_utf8_lossy(&resp);
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        let line = head.lines().next().unwrap_or("");
        return Err(format!("{addr}{path}: {line}"));
    }
    serde_json::from_str(body).map_err(|e| format!("{addr}{path}: not JSON: {e}"))
}

/// A node's clock against the leader's, as the leader last probed it.
fn node_clock_line(n: &Value) -> String {
    let ms = |v: &Value| {
        v.as_f64()
            .map_or("?".to_owned(), |x| format!("{:.1}", x / 1e6))
    };
    format!(
        "\n  node {} clock {} ms from cluster time (round trip {} ms)",
        n["node"],
        ms(&n["sample"]["offset_nanos"]),
        ms(&n["sample"]["round_trip_nanos"]),
    )
}

/// The status for a person: the cluster, the regions, the bounds.
fn summary(s: &Value) -> String {
    let mut out = format!(
        "node {} ({}), term {}, leader {} at {}\nmembers:",
        s["node"],
        s["state"].as_str().unwrap_or("?"),
        s["term"],
        s["leader"],
        s["leader_address"].as_str().unwrap_or("unknown"),
    );
    for m in s["members"].as_array().into_iter().flatten() {
        out += &format!(" {}={}", m["id"], m["address"].as_str().unwrap_or("?"));
        if m["role"] == "learner" {
            out += " (learner)";
        }
    }
    if let Some(offset) = s["cluster_clock_offset_nanos"].as_f64() {
        // D47: the leader reads cluster time, the first leader's clock carried over.
        out += &format!(
            "\n  cluster time {:.1} ms from this node's clock",
            offset / 1e6
        );
        if let Some(via) = s["cluster_clock_via"].as_u64() {
            // D50: not in the last clock frame, it read cluster time through node `via`.
            out += &format!(" (read through node {via}'s clock)");
        }
    }
    for n in s["node_clocks"].as_array().into_iter().flatten() {
        out += &node_clock_line(n);
    }
    match s["role"].as_str() {
        Some("learner") => out += "\nthis node is a learner (no vote)",
        Some("not_member") => out += "\nthis node is not a member (joining, or removed)",
        _ => {}
    }
    out += &format!(
        "\nconfiguration version {}\nregions:\n",
        s["config_version"]
    );
    for r in s["regions"].as_array().into_iter().flatten() {
        out += &region_line(r);
    }
    out += "escalated counters:\n";
    for c in s["counters"].as_array().into_iter().flatten() {
        out += &counter_line(c);
    }
    match s["limits"].as_array() {
        None => out += "bounds: ask the leader\n",
        Some(limits) => {
            out += "bounds (current window):\n";
            for l in limits {
                out += &bound_line(&l["bound"]);
            }
        }
    }
    out
}

fn region_line(r: &Value) -> String {
    let name = r["region"].as_str().unwrap_or("?");
    if r["removed"] == true {
        return format!("  {name}: removed (allot cluster add-region {name} adds it back)\n");
    }
    if r["sync_lag_ms"].is_null() {
        return format!("  {name}: not heard by this node\n");
    }
    format!(
        "  {name}: heard {} ms ago, clock offset {} ns, round trip {} ms, view expired {}, config version {}\n",
        r["sync_lag_ms"],
        r["clock_offset_nanos"],
        r["round_trip_ms"],
        r["view_expired"],
        r["config_version"],
    )
}

fn counter_line(c: &Value) -> String {
    let counter = &c["counter"];
    let rows: Vec<String> = c["regions"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(region, row)| match row["used_units"].as_u64() {
            Some(used) => format!("{region}={} (used {used})", row["allowance_units"]),
            None => format!("{region}={}", row["allowance_units"]),
        })
        .collect();
    format!(
        "  {} {} window {}: {}\n",
        counter["limit"].as_str().unwrap_or("?"),
        counter["key"].as_str().unwrap_or("?"),
        counter["window"],
        rows.join(", ")
    )
}

fn bound_line(b: &Value) -> String {
    let limit = b["limit"].as_str().unwrap_or("?");
    if let Some(why) = b["unbounded"].as_str() {
        return format!("  {limit}: unbounded ({why})\n");
    }
    let terms: Vec<String> = b["terms"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{}={}", t["name"].as_str().unwrap_or("?"), t["units"]))
        .collect();
    format!(
        "  {limit}: {} units ({})\n",
        b["total_units"],
        terms.join(", ")
    )
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("allot: {msg}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leader's cluster time and its probes of the other nodes read as milliseconds; a
    /// follower has neither.
    #[test]
    fn the_summary_shows_cluster_time_and_each_probed_node_clock() {
        let leader: Value = serde_json::from_str(
            r#"{"node":1,"state":"leader","term":3,"leader":1,"leader_address":"a:1",
                "members":[{"id":1,"address":"a:1"},{"id":2,"address":"b:2"}],
                "cluster_clock_offset_nanos":24000000000,
                "node_clocks":[{"node":2,"sample":{"offset_nanos":-1500000,
                "round_trip_nanos":400000},"taken_at":0}],"regions":[],"counters":[],
                "limits":[]}"#,
        )
        .expect("json");
        let out = summary(&leader);
        assert!(
            out.contains("cluster time 24000.0 ms from this node's clock"),
            "{out}"
        );
        assert!(
            out.contains("node 2 clock -1.5 ms from cluster time (round trip 0.4 ms)"),
            "{out}"
        );
        assert!(!out.contains("read through"), "{out}");
        // A leader that was not in the last clock frame names the node it read it through.
        let mut bridged = leader.clone();
        bridged["cluster_clock_via"] = Value::from(2);
        let out = summary(&bridged);
        assert!(
            out.contains("from this node's clock (read through node 2's clock)"),
            "{out}"
        );
        let follower: Value = serde_json::from_str(
            r#"{"node":2,"members":[],"node_clocks":null,"regions":[],"counters":[]}"#,
        )
        .expect("json");
        assert!(!summary(&follower).contains("clock"));
    }
}
