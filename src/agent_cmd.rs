//! `allot agent` (the regional daemon), and `allot acquire` / `allot rls`, which call a
//! running agent's Acquire and ShouldRateLimit from the shell for debugging.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use allot_agent::admin::parse_descriptor;
use allot_agent::callers::Callers;
use allot_agent::logging;
use allot_agent::settings::{DEFAULT_MAX_CLOCK_UNCERTAINTY, DEFAULT_MAX_IN_FLIGHT_CALLS, Settings};
use allot_agent::store::Durability;
use allot_agent::{Listeners, run};
use allot_core::ids::RegionId;
use allot_proto::envoy::common::RateLimitDescriptor;
use allot_proto::envoy::common::rate_limit_descriptor::Entry as RlsEntry;
use allot_proto::envoy::rls::RateLimitRequest;
use allot_proto::envoy::rls::rate_limit_response::{Code, rate_limit::Unit};
use allot_proto::envoy::rls::rate_limit_service_client::RateLimitServiceClient;
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tonic::transport::{Channel, Endpoint};

use crate::certs_cmd::{TlsArgs, digest_flag, tls_flags};

/// Time to connect to an agent, and to wait for its answer, from the debugging commands.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Args)]
pub struct AgentArgs {
    /// Limits files (envoyproxy/ratelimit YAML); none: the embedded default.
    #[arg(long = "config", env = "ALLOT_CONFIG", value_delimiter = ',', num_args = 1..)]
    config: Vec<PathBuf>,
    /// This region's name. With --coordinator it must be one the limits configuration names
    /// (in its limits' `allot.weights`).
    #[arg(long, env = "ALLOT_REGION", default_value = "local")]
    region: String,
    /// Coordinator addresses (host:port,...): the agent syncs with the cluster's leader
    /// through any of them. An entry ID=host:port is this agent's own address for node ID (a
    /// proxy, a NAT, a relay): a redirect to that node goes there rather than to the address
    /// the cluster advertises. None: single region, this agent owns every quota.
    #[arg(long = "coordinator", env = "ALLOT_COORDINATOR", value_delimiter = ',')]
    coordinators: Vec<String>,
    /// gRPC address (lease API and Envoy RLS).
    #[arg(long, env = "ALLOT_GRPC", default_value = "127.0.0.1:8081")]
    grpc: String,
    /// Admin HTTP address (/metrics, /healthz, /readyz, /v1/keys).
    #[arg(long, env = "ALLOT_HTTP", default_value = "127.0.0.1:8080")]
    http: String,
    /// Data directory (the store).
    #[arg(long, env = "ALLOT_DATA", default_value = "./allot-data")]
    data: PathBuf,
    /// sync: flushed to the device before each answer (survives a machine crash);
    /// buffered: written to the kernel before each answer (survives a process kill),
    /// flushed every --flush-interval-ms.
    #[arg(long, env = "ALLOT_DURABILITY", default_value = "buffered")]
    durability: Durability,
    /// Time between device flushes of the store's log, in milliseconds (buffered mode: what a
    /// machine crash can lose).
    #[arg(long, env = "ALLOT_FLUSH_INTERVAL_MS", default_value_t = 100)]
    flush_interval_ms: u64,
    /// Time between store checkpoints (log applied to the sled tree and dropped), in
    /// milliseconds.
    #[arg(long, env = "ALLOT_CHECKPOINT_INTERVAL_MS", default_value_t = 5000)]
    checkpoint_interval_ms: u64,
    /// Keys tracked per limit; idle ones are evicted to make room.
    #[arg(long, env = "ALLOT_MAX_KEYS_PER_LIMIT", default_value_t = 1_000_000)]
    max_keys_per_limit: usize,
    /// Share of a quota from which an allowed decision counts as near the limit.
    #[arg(long, env = "ALLOT_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    near_limit_ratio: f64,
    /// Merge limits files of one domain (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "ALLOT_MERGE_DOMAINS")]
    merge_domains: bool,
    /// Log format on stderr.
    #[arg(long, env = "ALLOT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Read windows on the coordinator's timebase and keep strict admissions clear of window
    /// edges by the measured clock uncertainty, up to this many milliseconds (docs/bound.md,
    /// skew). 0 turns it off: windows on the agent's own clock.
    #[arg(long, env = "ALLOT_MAX_CLOCK_UNCERTAINTY_MS", default_value_t = DEFAULT_MAX_CLOCK_UNCERTAINTY.as_millis() as u64)]
    max_clock_uncertainty_ms: u64,
    /// Seed of the Retry-After jitter (default: drawn from the clock at start).
    #[arg(long, env = "ALLOT_JITTER_SEED", hide = true)]
    jitter_seed: Option<u64>,
    /// The data directory is a restored backup or replaces a lost one: admit nothing more in
    /// windows that began before this start (docs/budget.md, "Restores").
    #[arg(long, env = "ALLOT_RESTORED")]
    restored: bool,
    #[command(flatten)]
    tls: TlsArgs,
    /// Serve the gateway-facing gRPC port over TLS with the --tls-* certificate; a client
    /// certificate of the CA is optional (a gateway may prove itself with a token instead).
    #[arg(long, env = "ALLOT_GATEWAY_TLS")]
    gateway_tls: bool,
    /// Serve the HTTP port (the HTTP/JSON lease API, metrics, status) over TLS with the
    /// --tls-* certificate, HTTP/1.1; bearer tokens then cross it encrypted.
    #[arg(long, env = "ALLOT_HTTP_TLS")]
    http_tls: bool,
    /// The SHA-256 (64 hex digits) of the token operators' reads (/metrics, /v1/status,
    /// /v1/keys) and key watches must carry as `Authorization: Bearer TOKEN`:
    /// `printf %s TOKEN | sha256sum`. None: whoever reaches the HTTP port may read them.
    /// /healthz and /readyz stay open.
    #[arg(long, env = "ALLOT_READ_TOKEN_SHA256", value_name = "HEX")]
    read_token_sha256: Option<String>,
    /// Who may call the lease API, RLS and RLQS, and for which domains (a JSON file,
    /// docs/security.md). Without one, every caller may spend every domain.
    #[arg(long, env = "ALLOT_CALLERS", value_name = "FILE")]
    callers: Option<PathBuf>,
    /// Most gateway calls (gRPC and HTTP together) running at once; past it a call is
    /// answered at once with RESOURCE_EXHAUSTED (HTTP: 503, Retry-After: 1) rather than queued.
    #[arg(long, env = "ALLOT_MAX_IN_FLIGHT_CALLS", default_value_t = DEFAULT_MAX_IN_FLIGHT_CALLS)]
    max_in_flight_calls: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

pub fn agent(args: AgentArgs) -> ExitCode {
    logging::init(matches!(args.log_format, LogFormat::Json));
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

async fn serve(args: AgentArgs) -> Result<(), String> {
    let mut settings = Settings::new(RegionId::new(args.region), args.data);
    settings.coordinators = args.coordinators;
    settings.config_files = args.config;
    settings.merge_domains = args.merge_domains;
    settings.durability = args.durability;
    settings.flush_interval = Duration::from_millis(args.flush_interval_ms);
    settings.checkpoint_interval = Duration::from_millis(args.checkpoint_interval_ms);
    settings.max_keys_per_limit = args.max_keys_per_limit;
    settings.near_limit_ratio = args.near_limit_ratio;
    settings.jitter_seed = args.jitter_seed;
    settings.restored = args.restored;
    settings.tls = tls_flags(&args.tls)?;
    settings.gateway_tls = args.gateway_tls;
    settings.http_tls = args.http_tls;
    settings.max_in_flight_calls = args.max_in_flight_calls;
    settings.read_token_sha256 =
        digest_flag("--read-token-sha256", args.read_token_sha256.as_deref())?;
    if let Some(path) = &args.callers {
        let callers = Callers::load(path).map_err(|e| e.to_string())?;
        settings.callers = Some(Arc::new(callers));
        settings.callers_file = Some(path.clone());
    }
    settings.max_clock_uncertainty = (args.max_clock_uncertainty_ms > 0)
        .then(|| Duration::from_millis(args.max_clock_uncertainty_ms));
    settings.validate().map_err(|e| e.to_string())?;
    let bind = |addr: String, what: &'static str| async move {
        TcpListener::bind(&addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} ({what}): {e}"))
    };
    let listeners = Listeners {
        grpc: bind(args.grpc, "gRPC").await?,
        http: bind(args.http, "HTTP").await?,
    };
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    run(listeners, settings, shutdown)
        .await
        .map_err(|e| e.to_string())
}

#[derive(Args)]
pub struct AcquireArgs {
    /// The agent's gRPC address (host:port or a URL).
    #[arg(long, env = "ALLOT_AGENT", default_value = "127.0.0.1:8081")]
    agent: String,
    #[arg(long)]
    domain: String,
    /// Entries in order: k=v[,k=v]
    #[arg(long)]
    descriptor: String,
    /// Units to charge (0 is read as 1).
    #[arg(long, default_value_t = 1)]
    cost: u64,
    /// A retry with the same key is charged once.
    #[arg(long, default_value = "")]
    idempotency_key: String,
}

/// Prints `{allowed, remaining, retry_after_ms, reset_ms, rule, reason}`; exits 0 whether
/// allowed or denied, 2 on a connection or input error.
pub fn acquire(args: AcquireArgs) -> ExitCode {
    client_command(async move {
        let entries = parse_descriptor(&args.descriptor)?;
        let mut client = LeaseServiceClient::new(channel(&args.agent).await?);
        let req = pb::AcquireRequest {
            target: Some(pb::Target {
                domain: args.domain,
                entries: entries
                    .into_iter()
                    .map(|(key, value)| pb::Entry { key, value })
                    .collect(),
            }),
            cost_units: args.cost,
            idempotency_key: args.idempotency_key,
        };
        let resp = client.acquire(req).await.map_err(status_text)?.into_inner();
        let d = resp.decision.unwrap_or_default();
        Ok(json!({
            "allowed": d.allowed,
            "remaining": d.remaining_units,
            "retry_after_ms": d.retry_after_ms,
            "reset_ms": d.reset_after_ms,
            "rule": d.rule,
            "reason": d.reason,
        }))
    })
}

#[derive(Args)]
pub struct RlsArgs {
    /// The agent's gRPC address (host:port or a URL).
    #[arg(long, env = "ALLOT_AGENT", default_value = "127.0.0.1:8081")]
    agent: String,
    #[arg(long)]
    domain: String,
    /// One descriptor, entries in order: k=v[,k=v]; repeat for several.
    #[arg(long = "descriptor", required = true)]
    descriptors: Vec<String>,
    /// hits_addend (0 is read as 1).
    #[arg(long, default_value_t = 1)]
    hits: u32,
}

/// Prints the ShouldRateLimit response as JSON; exits 0 whatever the code, 2 on error.
pub fn rls(args: RlsArgs) -> ExitCode {
    client_command(async move {
        let mut descriptors = Vec::new();
        for text in &args.descriptors {
            let entries = parse_descriptor(text)?;
            descriptors.push(RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| RlsEntry { key, value })
                    .collect(),
                ..RateLimitDescriptor::default()
            });
        }
        let mut client = RateLimitServiceClient::new(channel(&args.agent).await?);
        let req = RateLimitRequest {
            domain: args.domain,
            descriptors,
            hits_addend: args.hits,
        };
        let resp = client
            .should_rate_limit(req)
            .await
            .map_err(status_text)?
            .into_inner();
        let statuses: Vec<Value> = resp
            .statuses
            .iter()
            .map(|s| {
                json!({
                    "code": code_name(s.code),
                    "current_limit": s.current_limit.as_ref().map(|l| json!({
                        "name": l.name,
                        "requests_per_unit": l.requests_per_unit,
                        "unit": Unit::try_from(l.unit).unwrap_or(Unit::Unknown).as_str_name(),
                    })),
                    "limit_remaining": s.limit_remaining,
                    "duration_until_reset_ms": s.duration_until_reset.as_ref().map(|d| {
                        d.seconds.max(0) as u64 * 1000 + u64::from(d.nanos.max(0) as u32).div_ceil(1_000_000)
                    }),
                })
            })
            .collect();
        let headers: Vec<Value> = resp
            .response_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
        Ok(json!({
            "overall_code": code_name(resp.overall_code),
            "statuses": statuses,
            "response_headers_to_add": headers,
        }))
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}

/// Runs a client command: its JSON on stdout and exit 0, or its error on stderr and exit 2.
fn client_command(work: impl std::future::Future<Output = Result<Value, String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(2, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(work) {
        Ok(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Err(msg) => fail(2, &msg),
    }
}

async fn channel(addr: &str) -> Result<Channel, String> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    Endpoint::from_shared(url)
        .map_err(|e| format!("bad agent address '{addr}': {e}"))?
        .connect_timeout(CLIENT_TIMEOUT)
        .timeout(CLIENT_TIMEOUT)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to the agent at {addr}: {e}"))
}

fn status_text(s: tonic::Status) -> String {
    format!("agent answered {:?}: {}", s.code(), s.message())
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("allot: {msg}");
    ExitCode::from(code)
}
