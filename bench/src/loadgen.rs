//! The load generator: N concurrent callers over loopback for a fixed, bounded time.
//!
//! Each caller sends one call at a time (a closed loop, as a gateway worker waiting on its
//! limiter). A run is a warm-up (connections up, caches and allocator warm; nothing recorded)
//! then the measured interval: calls that start and end inside it are counted and their
//! latency recorded, one histogram per caller, merged at the end. When the server's pid is
//! known, its CPU time is read at both ends of the measured interval.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_proto::envoy::common::RateLimitDescriptor;
use allot_proto::envoy::common::rate_limit_descriptor::Entry as RlsEntry;
use allot_proto::envoy::rls::RateLimitRequest;
use allot_proto::envoy::rls::rate_limit_response::Code as RlsCode;
use allot_proto::envoy::rls::rate_limit_service_client::RateLimitServiceClient;
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::cpu::process_cpu_time;
use crate::error::{Error, Result};
use crate::histogram::{LatencyHistogram, LatencySummary};
use crate::redis::{GcraParams, GcraScript};
use crate::workload::{BENCH_DESCRIPTOR_KEY, BENCH_DOMAIN, KeySet, KeyWalk, Workload};

/// Most concurrent callers in one run. Each caller keeps its own latency histogram (about
/// 220 KiB), so this also bounds the harness's memory.
pub const MAX_CALLERS: u32 = 1_024;
/// Most connections (HTTP/2 or Redis) in one run; callers share them round-robin.
pub const MAX_CONNECTIONS: u32 = 1_024;
/// Longest measured interval of one run.
pub const MAX_DURATION: Duration = Duration::from_secs(600);
/// Longest warm-up of one run.
pub const MAX_WARMUP: Duration = Duration::from_secs(60);
/// Largest lease a lease-path caller asks for.
pub const MAX_LEASE_UNITS: u64 = 1_000_000;
/// Lease size of the lease path unless told otherwise (the figure).
pub const DEFAULT_LEASE_UNITS: u64 = 100;
/// Lease length the lease path asks for: long enough that no lease expires before its units
/// are spent (they are spent at once), and explicit, so no server default is relied on.
pub const LEASE_TTL: Duration = Duration::from_secs(10);
/// A call not answered within this counts as a `timeout` error; it also bounds how long a run
/// can outlast its end.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections of a run unless told otherwise (fewer when there are fewer callers): what an
/// Envoy with two worker threads opens to its rate limit service, one HTTP/2 connection per
/// worker. On a 2-core loopback run the no-op server also peaks there (in one check with 16
/// callers, 28,700 calls/s against 22,400 with one connection per caller: fewer connections
/// carry more calls per read).
pub const DEFAULT_CONNECTIONS: u32 = 2;
/// Time allowed to open each connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed call, so a caller facing a dead server waits instead of spinning.
const ERROR_PAUSE: Duration = Duration::from_millis(1);
/// Most (key, window) rows one run records when it records per window: a 600 s run of 1 s
/// windows over 100 keys. Rows past it are counted, not kept.
pub const MAX_WINDOW_ROWS: usize = 60_000;

/// One run's settings.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub workload: Workload,
    /// The server: a gRPC server (`Acquire`, `Rls`, `Lease`) or Redis (`Redis`).
    pub addr: SocketAddr,
    pub callers: u32,
    /// Connections opened to the server; caller `c` uses connection `c mod connections`.
    pub connections: u32,
    /// Distinct keys the calls are spread over; 1 is the hot-key case.
    pub keys: u32,
    pub warmup: Duration,
    pub duration: Duration,
    /// Units each `Lease` call asks for.
    pub lease_units: u64,
    /// The server's pid, to read its CPU time; `None` measures no CPU.
    pub server_pid: Option<u32>,
    /// The Redis script's rate.
    pub gcra: GcraParams,
    /// Record the requests admitted per key and per window of this length (`Acquire` only),
    /// by the window the server's decision names: its `reset_after_ms`, on the server's
    /// clock. Every answered call counts, warm-up and the calls crossing the end included:
    /// the record is of what the server admitted, not of the measured interval.
    pub window: Option<Duration>,
}

impl LoadConfig {
    /// A run with the harness's defaults: [`DEFAULT_CONNECTIONS`], one key, a one-second
    /// warm-up, five measured seconds, leases of [`DEFAULT_LEASE_UNITS`].
    pub fn new(workload: Workload, addr: SocketAddr, callers: u32) -> Self {
        LoadConfig {
            workload,
            addr,
            callers,
            connections: callers.clamp(1, DEFAULT_CONNECTIONS),
            keys: 1,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            lease_units: DEFAULT_LEASE_UNITS,
            server_pid: None,
            gcra: GcraParams::NEVER_DENIES,
            window: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Invalid(what));
        if !(1..=MAX_CALLERS).contains(&self.callers) {
            return bad(format!("callers must be 1..={MAX_CALLERS}"));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.connections) || self.connections > self.callers {
            return bad(format!(
                "connections must be 1..={MAX_CONNECTIONS} and at most the callers"
            ));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return bad(format!(
                "duration must be above 0 and at most {MAX_DURATION:?}"
            ));
        }
        if self.warmup > MAX_WARMUP {
            return bad(format!("warm-up must be at most {MAX_WARMUP:?}"));
        }
        if !(1..=MAX_LEASE_UNITS).contains(&self.lease_units) {
            return bad(format!("lease units must be 1..={MAX_LEASE_UNITS}"));
        }
        if self.gcra.emission_interval_us == 0 || self.gcra.burst_units == 0 {
            return bad("the GCRA rate needs an emission interval and a burst".to_owned());
        }
        if let Some(w) = self.window {
            if self.workload != Workload::Acquire {
                return bad("admitted per window is recorded for acquire calls only".to_owned());
            }
            if w < Duration::from_millis(1) {
                return bad("the window must be at least 1 ms".to_owned());
            }
        }
        Ok(())
    }
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    pub workload: Workload,
    pub addr: String,
    pub callers: u32,
    pub connections: u32,
    pub keys: u32,
    /// Units per `Lease` call (lease workload only).
    pub lease_units: Option<u64>,
    pub duration_secs: f64,
    /// Answered calls (decisions); errors are counted apart.
    pub calls: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Requests admitted: one per allowed per-request call; a lease's units on the lease path.
    pub admitted: u64,
    pub error_count: u64,
    /// Errors by kind (`grpc_<code>`, `redis_<kind>`, `timeout`).
    pub errors: BTreeMap<String, u64>,
    pub calls_per_sec: f64,
    pub admitted_per_sec: f64,
    /// Latency of answered calls.
    pub latency: LatencySummary,
    pub server_cpu: Option<ServerCpu>,
    /// Requests admitted per key and window, when asked for (`LoadConfig::window`), in order.
    pub admitted_by_window: Vec<WindowAdmitted>,
    /// Rows past [`MAX_WINDOW_ROWS`], not recorded.
    pub window_rows_left_out: u64,
}

/// Requests the server admitted for one key in one window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WindowAdmitted {
    pub key: String,
    /// The window's index: its start is `window * length` since the Unix epoch.
    pub window: u64,
    pub admitted: u64,
}

/// The server's CPU time over the measured interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServerCpu {
    pub pid: u32,
    pub cpu_secs: f64,
    /// CPU per decision, in microseconds; `None` when no call was answered.
    pub cpu_us_per_call: Option<f64>,
    /// Admitted requests per server CPU-second; `None` when no CPU time was charged (a run
    /// shorter than a clock tick).
    pub admitted_per_cpu_sec: Option<f64>,
}

/// One caller's counts.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    allowed: u64,
    denied: u64,
    admitted: u64,
    errors: BTreeMap<String, u64>,
    latency: LatencyHistogram,
    by_window: ByWindow,
}

/// Admitted requests per (key, window), at most [`MAX_WINDOW_ROWS`] rows.
#[derive(Debug, Default)]
struct ByWindow {
    rows: BTreeMap<(String, u64), u64>,
    left_out: u64,
}

impl ByWindow {
    fn add(&mut self, key: &str, window: u64, admitted: u64) {
        if let Some(n) = self.rows.get_mut(&(key.to_owned(), window)) {
            *n += admitted;
        } else if self.rows.len() < MAX_WINDOW_ROWS {
            self.rows.insert((key.to_owned(), window), admitted);
        } else {
            self.left_out += 1;
        }
    }

    fn merge(&mut self, other: ByWindow) {
        for ((key, window), n) in other.rows {
            self.add(&key, window, n);
        }
        self.left_out += other.left_out;
    }
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.calls += other.calls;
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.admitted += other.admitted;
        for (kind, n) in other.errors {
            *self.errors.entry(kind).or_insert(0) += n;
        }
        self.latency.merge(&other.latency);
        self.by_window.merge(other.by_window);
    }
}

/// The answer to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Allowed, admitting this many requests; until the window resets, when the server says.
    Allowed {
        admitted: u64,
        reset_after_ms: Option<u64>,
    },
    Denied,
}

/// A connection, as the workload uses it, with the call's fixed parameters. Clones share the
/// connection.
#[derive(Clone)]
enum Client {
    Acquire(LeaseServiceClient<Channel>),
    Lease {
        client: LeaseServiceClient<Channel>,
        units: u64,
        /// The caller's lease, spent: refilled by its next request (`top_up_lease_id`), as a
        /// gateway holding one lease per key does.
        spent: Option<u64>,
    },
    Rls(RateLimitServiceClient<Channel>),
    Redis {
        con: MultiplexedConnection,
        script: GcraScript,
        params: GcraParams,
    },
}

/// A failed call, by kind: `grpc_<code>`, `redis_<kind>` or `timeout`. Kinds come from closed
/// sets (status codes, the redis crate's error kinds), so a tally of them stays small.
type ErrorKind = String;

impl Client {
    async fn connect(config: &LoadConfig) -> Result<Self> {
        if config.workload == Workload::Redis {
            let mut con = crate::redis::connect(config.addr).await?;
            let script = GcraScript::new();
            script.load(&mut con).await?;
            let params = config.gcra;
            return Ok(Client::Redis {
                con,
                script,
                params,
            });
        }
        let channel = Endpoint::from_shared(format!("http://{}", config.addr))?
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await?;
        Ok(match config.workload {
            Workload::Rls => Client::Rls(RateLimitServiceClient::new(channel)),
            Workload::Lease => Client::Lease {
                client: LeaseServiceClient::new(channel),
                units: config.lease_units,
                spent: None,
            },
            _ => Client::Acquire(LeaseServiceClient::new(channel)),
        })
    }

    async fn call(&mut self, key: &str) -> Result<Outcome, ErrorKind> {
        match self {
            Client::Acquire(client) => acquire(client, key).await,
            Client::Lease {
                client,
                units,
                spent,
            } => lease(client, key, *units, spent).await,
            Client::Rls(client) => should_rate_limit(client, key).await,
            Client::Redis {
                con,
                script,
                params,
            } => redis_gcra(con, script, *params, key).await,
        }
    }
}

fn allowed_one(allowed: bool) -> Outcome {
    match allowed {
        true => Outcome::Allowed {
            admitted: 1,
            reset_after_ms: None,
        },
        false => Outcome::Denied,
    }
}

async fn acquire(
    client: &mut LeaseServiceClient<Channel>,
    key: &str,
) -> Result<Outcome, ErrorKind> {
    let req = pb::AcquireRequest {
        target: Some(target(key)),
        cost_units: 1,
        idempotency_key: String::new(),
    };
    let resp = client.acquire(req).await.map_err(grpc_error)?.into_inner();
    Ok(match resp.decision {
        Some(d) if d.allowed => Outcome::Allowed {
            admitted: 1,
            reset_after_ms: Some(d.reset_after_ms),
        },
        _ => Outcome::Denied,
    })
}

async fn lease(
    client: &mut LeaseServiceClient<Channel>,
    key: &str,
    units: u64,
    spent: &mut Option<u64>,
) -> Result<Outcome, ErrorKind> {
    let req = pb::LeaseRequest {
        target: Some(target(key)),
        units_wanted: units,
        min_units: 1,
        ttl_ms: u64::try_from(LEASE_TTL.as_millis()).unwrap_or(u64::MAX),
        idempotency_key: String::new(),
        returns: Vec::new(),
        // The caller holds one lease and refills it once spent, as a gateway does.
        top_up_lease_id: spent.unwrap_or(0),
    };
    let resp = client.lease(req).await.map_err(grpc_error)?.into_inner();
    // The caller spends the lease locally, one request per unit: a decrement of its own
    // counter, no call. Every unit granted is a request admitted.
    Ok(match resp.lease {
        Some(lease) if lease.units > 0 => {
            // Id 0: an unmetered grant, nothing to refill.
            *spent = (lease.lease_id != 0).then_some(lease.lease_id);
            Outcome::Allowed {
                admitted: lease.units,
                reset_after_ms: None,
            }
        }
        _ => Outcome::Denied,
    })
}

async fn should_rate_limit(
    client: &mut RateLimitServiceClient<Channel>,
    key: &str,
) -> Result<Outcome, ErrorKind> {
    let req = RateLimitRequest {
        domain: BENCH_DOMAIN.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![RlsEntry {
                key: BENCH_DESCRIPTOR_KEY.to_owned(),
                value: key.to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    };
    let resp = client
        .should_rate_limit(req)
        .await
        .map_err(grpc_error)?
        .into_inner();
    Ok(allowed_one(resp.overall_code == i32::from(RlsCode::Ok)))
}

async fn redis_gcra(
    con: &mut MultiplexedConnection,
    script: &GcraScript,
    params: GcraParams,
    key: &str,
) -> Result<Outcome, ErrorKind> {
    let reply = script
        .check(con, key, params, 1, None)
        .await
        .map_err(|e| match e {
            Error::Redis(e) => format!("redis_{:?}", e.kind()),
            _ => "redis_other".to_owned(),
        })?;
    Ok(allowed_one(reply.allowed))
}

fn target(key: &str) -> pb::Target {
    pb::Target {
        domain: BENCH_DOMAIN.to_owned(),
        entries: vec![pb::Entry {
            key: BENCH_DESCRIPTOR_KEY.to_owned(),
            value: key.to_owned(),
        }],
    }
}

fn grpc_error(status: tonic::Status) -> ErrorKind {
    format!("grpc_{:?}", status.code())
}

/// When a caller's calls count.
#[derive(Clone, Copy, Debug)]
struct Interval {
    start: Instant,
    end: Instant,
}

/// Runs `config` and reports what it measured.
pub async fn run_load(config: &LoadConfig) -> Result<LoadReport> {
    config.validate()?;
    let keys = KeySet::new(config.keys)?;
    let mut clients = Vec::with_capacity(config.connections as usize);
    for _ in 0..config.connections {
        clients.push(Client::connect(config).await?);
    }
    let start = Instant::now() + config.warmup;
    let interval = Interval {
        start,
        end: start + config.duration,
    };
    let cpu = config
        .server_pid
        .map(|pid| tokio::spawn(cpu_over(pid, interval)));
    let mut callers = JoinSet::new();
    for c in 0..config.callers {
        let client = clients[c as usize % clients.len()].clone();
        let walk = keys.walk(c, config.callers);
        callers.spawn(caller(client, walk, interval, config.window));
    }
    let mut total = Tally::default();
    while let Some(tally) = callers.join_next().await {
        total.merge(tally.map_err(|e| Error::Failed(format!("a caller failed: {e}")))?);
    }
    let cpu = match cpu {
        Some(task) => Some(
            task.await
                .map_err(|e| Error::Failed(format!("the CPU probe failed: {e}")))??,
        ),
        None => None,
    };
    let cpu = config.server_pid.zip(cpu);
    Ok(report(config, total, cpu))
}

async fn caller(
    mut client: Client,
    mut walk: KeyWalk,
    interval: Interval,
    window: Option<Duration>,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let began = Instant::now();
        if began >= interval.end {
            break;
        }
        let sent_ms = unix_ms();
        let key = walk.next_key();
        let result = match tokio::time::timeout(CALL_TIMEOUT, client.call(key)).await {
            Ok(r) => r,
            Err(_) => Err("timeout".to_owned()),
        };
        let ended = Instant::now();
        if let (
            Some(length),
            Ok(Outcome::Allowed {
                admitted,
                reset_after_ms: Some(reset),
            }),
        ) = (window, &result)
        {
            let index = window_of(sent_ms.midpoint(unix_ms()), *reset, length);
            tally.by_window.add(key, index, *admitted);
        }
        let counted = began >= interval.start && ended <= interval.end;
        match result {
            Ok(outcome) if counted => {
                tally.calls += 1;
                tally.latency.record(ended - began);
                match outcome {
                    Outcome::Allowed { admitted, .. } => {
                        tally.allowed += 1;
                        tally.admitted += admitted;
                    }
                    Outcome::Denied => tally.denied += 1,
                }
            }
            Ok(_) => {}
            // A failed call counts even when it ended past the interval: a call that timed
            // out there may still have been admitted, and a caller of the ledger must see it.
            Err(kind) => {
                if began >= interval.start {
                    *tally.errors.entry(kind).or_insert(0) += 1;
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    tally
}

fn unix_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// The index of the window a decision taken at `decided_ms` was for, when it said the window
/// resets `reset_after_ms` later: the window ending at the multiple of `length` nearest to
/// that time (so a decision's transit, under half a window, does not move it).
fn window_of(decided_ms: u64, reset_after_ms: u64, length: Duration) -> u64 {
    let length_ms = u64::try_from(length.as_millis()).unwrap_or(u64::MAX).max(1);
    let end_ms = decided_ms.saturating_add(reset_after_ms);
    (end_ms.saturating_add(length_ms / 2) / length_ms).saturating_sub(1)
}

/// The server's CPU time between the interval's ends.
async fn cpu_over(pid: u32, interval: Interval) -> Result<Duration> {
    tokio::time::sleep_until(interval.start).await;
    let before = process_cpu_time(pid)?;
    tokio::time::sleep_until(interval.end).await;
    let after = process_cpu_time(pid)?;
    Ok(after.saturating_sub(before))
}

fn report(config: &LoadConfig, tally: Tally, cpu: Option<(u32, Duration)>) -> LoadReport {
    let secs = config.duration.as_secs_f64();
    let error_count = tally.errors.values().sum();
    LoadReport {
        workload: config.workload,
        addr: config.addr.to_string(),
        callers: config.callers,
        connections: config.connections,
        keys: config.keys,
        lease_units: (config.workload == Workload::Lease).then_some(config.lease_units),
        duration_secs: secs,
        calls: tally.calls,
        allowed: tally.allowed,
        denied: tally.denied,
        admitted: tally.admitted,
        error_count,
        errors: tally.errors,
        calls_per_sec: tally.calls as f64 / secs,
        admitted_per_sec: tally.admitted as f64 / secs,
        latency: tally.latency.summary(),
        server_cpu: cpu.map(|(pid, spent)| server_cpu(pid, spent, tally.calls, tally.admitted)),
        admitted_by_window: tally
            .by_window
            .rows
            .into_iter()
            .map(|((key, window), admitted)| WindowAdmitted {
                key,
                window,
                admitted,
            })
            .collect(),
        window_rows_left_out: tally.by_window.left_out,
    }
}

fn server_cpu(pid: u32, spent: Duration, calls: u64, admitted: u64) -> ServerCpu {
    let cpu_secs = spent.as_secs_f64();
    ServerCpu {
        pid,
        cpu_secs,
        cpu_us_per_call: (calls > 0).then(|| cpu_secs * 1e6 / calls as f64),
        admitted_per_cpu_sec: (cpu_secs > 0.0).then(|| admitted as f64 / cpu_secs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoadConfig {
        let mut c = LoadConfig::new(Workload::Acquire, SocketAddr::from(([127, 0, 0, 1], 1)), 4);
        c.connections = 4;
        c
    }

    #[test]
    fn default_connections_never_exceed_the_callers() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(LoadConfig::new(Workload::Rls, addr, 1).connections, 1);
        assert_eq!(
            LoadConfig::new(Workload::Rls, addr, 16).connections,
            DEFAULT_CONNECTIONS
        );
        assert!(LoadConfig::new(Workload::Rls, addr, 1).validate().is_ok());
    }

    #[test]
    fn settings_out_of_bounds_are_refused() {
        assert!(config().validate().is_ok());
        let mut c = config();
        c.callers = 0;
        assert!(c.validate().is_err());
        let mut c = config();
        c.connections = 5;
        assert!(c.validate().is_err(), "more connections than callers");
        let mut c = config();
        c.duration = MAX_DURATION + Duration::from_secs(1);
        assert!(c.validate().is_err());
        let mut c = config();
        c.duration = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = config();
        c.lease_units = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn cpu_per_decision_and_admitted_per_cpu_second() {
        // 50,000 calls on 0.8 s of server CPU: 16 µs per call; 50,000 admitted / 0.8 s =
        // 62,500 per CPU-second. The lease path: 500 calls of 100 units on 0.01 s: 5,000,000.
        let per_request = server_cpu(7, Duration::from_millis(800), 50_000, 50_000);
        assert!((per_request.cpu_us_per_call.unwrap() - 16.0).abs() < 1e-9);
        assert!((per_request.admitted_per_cpu_sec.unwrap() - 62_500.0).abs() < 1e-6);
        let lease = server_cpu(7, Duration::from_millis(10), 500, 50_000);
        assert!((lease.admitted_per_cpu_sec.unwrap() - 5_000_000.0).abs() < 1e-3);
        // Nothing charged (shorter than a tick) or nothing answered: no ratio, not infinity.
        let idle = server_cpu(7, Duration::ZERO, 0, 0);
        assert_eq!(idle.cpu_us_per_call, None);
        assert_eq!(idle.admitted_per_cpu_sec, None);
    }

    #[test]
    fn report_counts_rates_over_the_measured_interval_only() {
        // 2 s measured, 3,000 answered (2,500 allowed, 500 denied) and 4 errors: 1,500 calls/s,
        // 1,250 admitted/s.
        let mut c = config();
        c.duration = Duration::from_secs(2);
        c.warmup = Duration::from_secs(30);
        let mut t = Tally {
            calls: 3_000,
            allowed: 2_500,
            denied: 500,
            admitted: 2_500,
            ..Tally::default()
        };
        t.errors.insert("grpc_Unavailable".to_owned(), 4);
        let r = report(&c, t, None);
        assert_eq!(r.error_count, 4);
        assert!((r.calls_per_sec - 1_500.0).abs() < 1e-9);
        assert!((r.admitted_per_sec - 1_250.0).abs() < 1e-9);
        assert!(r.server_cpu.is_none());
        assert_eq!(r.lease_units, None);
    }

    #[test]
    fn a_decision_counts_in_the_window_its_reset_names() {
        let w = Duration::from_secs(3);
        // Window 600,000 runs 1,800,000,000..1,800,003,000 ms. A decision 1 s in resets after
        // 2 s; 40 ms of transit either way leaves it in the same window.
        assert_eq!(window_of(1_800_001_000, 2_000, w), 600_000);
        assert_eq!(window_of(1_800_001_040, 2_000, w), 600_000);
        assert_eq!(window_of(1_800_000_960, 2_000, w), 600_000);
        // The window's last millisecond and the next one's first.
        assert_eq!(window_of(1_800_002_999, 1, w), 600_000);
        assert_eq!(window_of(1_800_003_000, 3_000, w), 600_001);
    }

    #[test]
    fn per_window_rows_are_bounded_and_merge_by_sum() {
        let mut a = ByWindow::default();
        a.add("k0", 7, 1);
        a.add("k0", 7, 1);
        a.add("k1", 7, 1);
        let mut b = ByWindow::default();
        b.add("k0", 7, 3);
        b.add("k0", 8, 1);
        a.merge(b);
        let rows: Vec<_> = a
            .rows
            .iter()
            .map(|((k, w), n)| (k.as_str(), *w, *n))
            .collect();
        assert_eq!(rows, [("k0", 7, 5), ("k0", 8, 1), ("k1", 7, 1)]);
        let mut full = ByWindow::default();
        for w in 0..MAX_WINDOW_ROWS as u64 {
            full.add("k", w, 1);
        }
        full.add("k", 0, 1);
        full.add("k", u64::MAX, 1);
        assert_eq!(full.rows.len(), MAX_WINDOW_ROWS);
        assert_eq!((full.rows[&("k".to_owned(), 0)], full.left_out), (2, 1));
    }

    #[test]
    fn a_per_window_record_is_for_acquire_calls_only() {
        let mut c = config();
        c.window = Some(Duration::from_secs(3));
        assert!(c.validate().is_ok());
        c.workload = Workload::Rls;
        assert!(c.validate().is_err());
        let mut c = config();
        c.window = Some(Duration::ZERO);
        assert!(c.validate().is_err());
    }

    #[test]
    fn tallies_merge_by_sum() {
        let mut a = Tally {
            calls: 2,
            allowed: 1,
            denied: 1,
            admitted: 1,
            ..Tally::default()
        };
        a.errors.insert("timeout".to_owned(), 1);
        let mut b = Tally {
            calls: 3,
            allowed: 3,
            admitted: 300,
            ..Tally::default()
        };
        b.errors.insert("timeout".to_owned(), 2);
        b.errors.insert("grpc_Internal".to_owned(), 1);
        a.merge(b);
        assert_eq!((a.calls, a.allowed, a.denied, a.admitted), (5, 4, 1, 301));
        assert_eq!(a.errors["timeout"], 3);
        assert_eq!(a.errors["grpc_Internal"], 1);
    }
}
