//! The real Envoy with its rate limit quota filter (`envoy.filters.http.rate_limit_quota`,
//! bootstrap from `deploy/envoy/rlqs.yaml`) against the agent's RLQS service: Envoy reports
//! usage per bucket over one stream and enforces the agent's token bucket assignments with no
//! call per request.
//!
//! Checked through Envoy's HTTP port: requests under the quota pass and over it get 429; two
//! Envoys against one agent share one quota; an agent restart mid-run over-admits nothing
//! beyond the stated term; a reload that removes the rule lifts the limit (the agent abandons
//! the bucket); what `ALLOW_ALL` admits of a bucket new while the agent is down, and how little
//! of it Envoy reports.
//!
//! The term (docs/bound.md, "Gateway terms"): with `no_assignment_behavior: ALLOW_ALL`, each
//! Envoy admits a bucket's requests that arrive before the bucket's first assignment. Every
//! test here waits for that assignment after a bucket's first request, so the term is that
//! one request per Envoy and bucket, and it is charged to the first lease like any other.
//!
//! Slow tier: runs with `ALLOT_SLOW_TESTS=1`, like tests/envoy.rs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use allot_bench::agent::{AgentCommand, AgentProcess};
use allot_bench::envoy::{EnvoyFilter, EnvoyProcess, EnvoySetup, http_get};

#[path = "support/envoy.rs"]
mod envoy_support;
use envoy_support::envoy_or_skip;
mod support;

const DOMAIN: &str = "rlqs_test";
const HEADER: &str = "x-api-key";
const DESCRIPTOR_KEY: &str = "api_key";
const REPORTING_INTERVAL: Duration = Duration::from_secs(1);
/// Long enough for a bucket's first report to reach a debug-build agent on a loaded machine
/// and its assignment to come back.
const FIRST_ASSIGNMENT_WAIT: Duration = Duration::from_millis(1_500);
/// Pause between two requests of one client: a steady, modest rate.
const PACE: Duration = Duration::from_millis(20);

/// `quota` requests per api_key and day (a day: a run never straddles a window boundary in
/// practice).
fn limits_yaml(quota: u64) -> String {
    allot_bench::agent::day_limits_yaml(DOMAIN, DESCRIPTOR_KEY, quota)
}

/// The same domain with the api_key rule removed (another rule keeps the file valid).
fn limits_without_the_rule() -> String {
    format!(
        "domain: {DOMAIN}\n\
         descriptors:\n  \
           - key: other_key\n    \
             rate_limit:\n      \
               unit: day\n      \
               requests_per_unit: 1\n"
    )
}

fn setup(agent: SocketAddr) -> EnvoySetup {
    EnvoySetup {
        rls_addr: agent,
        domain: DOMAIN.to_owned(),
        descriptor_header: HEADER.to_owned(),
        descriptor_key: DESCRIPTOR_KEY.to_owned(),
        rls_timeout: Duration::from_secs(1),
    }
}

fn command() -> AgentCommand {
    AgentCommand {
        binary: PathBuf::from(env!("CARGO_BIN_EXE_allot")),
        extra_args: Vec::new(),
    }
}

fn start_agent(rt: &tokio::runtime::Runtime, quota: u64, dir: &Path) -> AgentProcess {
    rt.block_on(AgentProcess::start(
        &command(),
        &limits_yaml(quota),
        DOMAIN,
        dir,
    ))
    .unwrap()
}

/// The agent started again on the addresses it had (`addrs`: gRPC, HTTP), with its store.
fn restart_agent(
    rt: &tokio::runtime::Runtime,
    quota: u64,
    dir: &Path,
    addrs: (SocketAddr, SocketAddr),
) -> AgentProcess {
    rt.block_on(AgentProcess::start_at(
        &command(),
        &limits_yaml(quota),
        DOMAIN,
        dir,
        addrs,
    ))
    .unwrap()
}

fn start_envoy(binary: &Path, agent: SocketAddr, dir: &Path) -> EnvoyProcess {
    std::fs::create_dir_all(dir).unwrap();
    EnvoyProcess::start_with(
        binary,
        &setup(agent),
        EnvoyFilter::Rlqs {
            reporting_interval: REPORTING_INTERVAL,
        },
        dir,
    )
    .unwrap()
}

/// The status of one request with `api_key`.
fn status(envoy: &EnvoyProcess, api_key: &str) -> u16 {
    let r = http_get(envoy.listen_addr(), "/", &[(HEADER, api_key)])
        .unwrap_or_else(|e| panic!("request through Envoy failed: {e}\n{}", envoy.log_tail()));
    assert!(
        r.status == 200 || r.status == 429,
        "{r:?}\n{}",
        envoy.log_tail()
    );
    r.status
}

/// One request, then a pause while the bucket's first assignment comes back.
fn open_bucket(envoy: &EnvoyProcess, api_key: &str) -> u64 {
    let admitted = u64::from(status(envoy, api_key) == 200);
    std::thread::sleep(FIRST_ASSIGNMENT_WAIT);
    admitted
}

/// Requests with `api_key` through each Envoy in turn, `PACE` apart, for `run`: the admitted
/// count per Envoy.
fn traffic(envoys: &[&EnvoyProcess], api_key: &str, run: Duration) -> Vec<u64> {
    let mut admitted = vec![0; envoys.len()];
    let started = Instant::now();
    while started.elapsed() < run {
        for (i, e) in envoys.iter().enumerate() {
            admitted[i] += u64::from(status(e, api_key) == 200);
        }
        std::thread::sleep(PACE);
    }
    admitted
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn rlqs_admits_the_quota_then_refuses_with_429() {
    let test = "rlqs_admits_the_quota_then_refuses_with_429";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let agent = start_agent(&rt, QUOTA, dir.path());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));

    let mut admitted = open_bucket(&envoy, "k1");
    let mut first_refusal = None;
    for n in 0..QUOTA + 3 {
        if status(&envoy, "k1") == 200 {
            admitted += 1;
        } else if first_refusal.is_none() {
            first_refusal = Some(n);
        }
    }
    assert_eq!(
        admitted,
        QUOTA,
        "exactly the quota passes\n{}",
        agent.log_tail()
    );
    // Through several reports and assignments (the lease behind the last one is gone, the
    // agent answers deny-all): nothing more passes.
    let later = traffic(&[&envoy], "k1", 3 * REPORTING_INTERVAL);
    assert_eq!(later, vec![0], "after the quota, only 429s");
    // Another key has its own counter.
    assert_eq!(open_bucket(&envoy, "k2"), 1);
    assert_eq!(status(&envoy, "k2"), 200);
}

/// A bucket Envoy has just opened under a large quota is served at its rate through its
/// first reporting interval: before a stream has seen Envoy's interval the agent assumes
/// Envoy 1.40's 5 s (a first assignment that outlives the next report), and paces the first
/// assignment on what the region holds for the key (the first report carries one request).
#[test]
fn rlqs_a_new_busy_bucket_is_served_through_its_first_reporting_interval() {
    let test = "rlqs_a_new_busy_bucket_is_served_through_its_first_reporting_interval";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    // About 1,000 a second over what is left of any day: far above the demand here.
    const QUOTA: u64 = 100_000_000;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let agent = start_agent(&rt, QUOTA, dir.path());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));

    let opened = open_bucket(&envoy, "busy");
    let run = Duration::from_secs(8);
    let started = Instant::now();
    let (mut sent, mut admitted) = (0u64, 0u64);
    while started.elapsed() < run {
        sent += 1;
        admitted += u64::from(status(&envoy, "busy") == 200);
        std::thread::sleep(PACE);
    }
    eprintln!("{test}: opened {opened}, then {admitted} of {sent} admitted");
    assert_eq!(opened, 1);
    // Envoy's own token bucket may refuse a request or two at a refill's edge.
    assert!(
        admitted * 100 >= sent * 98,
        "a new bucket far under its quota is served: {admitted} of {sent} admitted\n{}",
        agent.log_tail()
    );
}

#[test]
fn rlqs_two_envoys_share_one_quota() {
    let test = "rlqs_two_envoys_share_one_quota";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 60;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let agent = start_agent(&rt, QUOTA, dir.path());
    let a = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy-a"));
    let b = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy-b"));

    let opened = open_bucket(&a, "shared") + open_bucket(&b, "shared");
    // Envoy 1.40 reports every 5 s (whatever `reporting_interval` says): three reports
    // each, for the assignments to follow the demand.
    let per_envoy = traffic(&[&a, &b], "shared", Duration::from_secs(16));
    let total = opened + per_envoy.iter().sum::<u64>();
    eprintln!("{test}: opened {opened}, then {per_envoy:?}: {total} admitted of {QUOTA}");
    // The term: the one request per Envoy before its first assignment, and it is charged.
    let term = 2;
    assert!(
        total <= QUOTA + term,
        "{total} admitted, quota {QUOTA} + term {term}\n{}",
        agent.log_tail()
    );
    assert!(
        total >= QUOTA / 2,
        "most of the quota is used over 16 s of demand: {total} of {QUOTA}"
    );
    assert!(
        per_envoy.iter().all(|&n| n > 0),
        "both Envoys got a share: {per_envoy:?}"
    );
}

#[test]
fn rlqs_agent_restart_reconnects_and_over_admits_nothing() {
    let test = "rlqs_agent_restart_reconnects_and_over_admits_nothing";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 120;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut agent = start_agent(&rt, QUOTA, dir.path());
    let addrs = (agent.grpc_addr(), agent.http_addr());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));

    let opened = open_bucket(&envoy, "k1");
    let before = traffic(&[&envoy], "k1", Duration::from_secs(2))[0];
    assert!(agent.stop(), "the agent exits on SIGTERM");
    // Envoy keeps the assignment in force until its TTL, then denies (the expired
    // assignment behaviour): the agent's leases cover all of it.
    let during = traffic(&[&envoy], "k1", Duration::from_secs(3))[0];
    let agent = restart_agent(&rt, QUOTA, dir.path(), addrs);
    let after = traffic(&[&envoy], "k1", Duration::from_secs(8))[0];
    let total = opened + before + during + after;
    eprintln!(
        "{test}: opened {opened}, before {before}, agent down {during}, after {after}: \
         {total} of {QUOTA}"
    );
    assert!(after > 0, "the stream reconnected and traffic passes again");
    // The term: the first request, charged; leases the stopped agent had granted stay
    // charged whole after its restart (counted again at worst, never missed).
    assert!(
        total <= QUOTA + 1,
        "{total} admitted, quota {QUOTA} + 1\n{}",
        agent.log_tail()
    );
}

#[test]
fn rlqs_reload_that_removes_the_rule_lifts_the_limit() {
    let test = "rlqs_reload_that_removes_the_rule_lifts_the_limit";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 3;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let agent = start_agent(&rt, QUOTA, dir.path());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));

    open_bucket(&envoy, "k1");
    let spent = traffic(&[&envoy], "k1", 2 * REPORTING_INTERVAL)[0];
    assert_eq!(spent, QUOTA - 1, "the rest of the quota, then 429s");
    assert_eq!(status(&envoy, "k1"), 429);

    std::fs::write(dir.path().join("limits.yaml"), limits_without_the_rule()).unwrap();
    signal(agent.pid(), "-HUP");
    // The agent abandons the bucket (Envoy forgets it); its next request opens a new bucket,
    // which no rule matches: allowed, uncounted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while status(&envoy, "k1") == 429 {
        assert!(
            Instant::now() < deadline,
            "still limited 10 s after the reload\n{}",
            agent.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(FIRST_ASSIGNMENT_WAIT);
    let after = traffic(&[&envoy], "k1", 2 * REPORTING_INTERVAL)[0];
    assert!(after > 2 * QUOTA, "no limit any more: {after} passed");
}

/// The agent's `/v1/keys` for `api_key`: (granted, refunded) units.
fn key_units(agent: &AgentProcess, api_key: &str) -> (u64, u64) {
    let path = format!("/v1/keys?domain={DOMAIN}&descriptor={DESCRIPTOR_KEY}={api_key}");
    let r = http_get(agent.http_addr(), &path, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let units = |f: &str| v[f].as_u64().unwrap_or_else(|| panic!("{f} in {v}"));
    (units("granted_units"), units("refunded_units"))
}

/// Idle buckets the agent abandoned.
const IDLE_DROPS: &str = "allot_rlqs_buckets_dropped_total{reason=\"idle\"}";

/// One series of the agent's metrics, its name and labels as `/metrics` writes them (0
/// before its first increment).
fn metric(agent: &AgentProcess, series: &str) -> f64 {
    let r = http_get(agent.http_addr(), "/metrics", &[]).unwrap();
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0.0)
}

/// What `deploy/envoy/rlqs.yaml`'s `no_assignment_behavior: ALLOW_ALL` does while the agent is
/// down, as Envoy 1.40 behaves (docs/rlqs.md, "What Envoy admits on its own"): a bucket first
/// seen then is admitted from its first request, and Envoy drops the usage of each report that
/// falls due while it cannot reach the agent; only what it collected since the last of them
/// reaches the agent once it is back. That much is charged beyond the key's lease (a quota of
/// 5) as `allot_rlqs_uncharged_units_total`, which makes the window unbounded (D51); the rest
/// the agent never hears of.
#[test]
fn rlqs_a_bucket_new_while_the_agent_is_down_is_admitted_and_mostly_never_reported() {
    let test = "rlqs_a_bucket_new_while_the_agent_is_down_is_admitted_and_mostly_never_reported";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut agent = start_agent(&rt, QUOTA, dir.path());
    let addrs = (agent.grpc_addr(), agent.http_addr());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));
    open_bucket(&envoy, "k1");
    assert!(agent.stop(), "the agent exits on SIGTERM");

    // Longer than Envoy's reporting interval: reports fall due while the agent is down.
    let down = traffic(&[&envoy], "k2", Duration::from_secs(12))[0];
    let agent = restart_agent(&rt, QUOTA, dir.path(), addrs);
    // Envoy 1.40 reports every 5 s: wait for the reports after its stream is back to bring
    // both buckets to the agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(&agent, "allot_rlqs_bucket_reports_total") < 4.0 {
        assert!(
            Instant::now() < deadline,
            "no reports of both buckets in 30 s\n{}",
            agent.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(7));
    let uncharged = metric(&agent, "allot_rlqs_uncharged_units_total");
    let fallback = metric(&agent, "allot_rlqs_fallback_units_total");
    let reported = uncharged + fallback + QUOTA as f64;
    eprintln!(
        "{test}: {down} admitted while down; about {reported} reported after (uncharged \
         {uncharged}, fallback {fallback}, the lease {QUOTA})"
    );
    assert!(
        down > 100,
        "a new bucket is admitted from its first request"
    );
    assert!(
        uncharged > 0.0,
        "the last interval's usage reaches the agent"
    );
    assert!(
        reported < down as f64,
        "Envoy reported all it admitted while the agent was down: {reported} of {down}; the \
         documentation says it drops the reports that fall due meanwhile\n{}",
        agent.log_tail()
    );
}

#[test]
fn rlqs_an_idle_bucket_is_abandoned_and_its_unused_units_go_back() {
    let test = "rlqs_an_idle_bucket_is_abandoned_and_its_unused_units_go_back";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let agent = start_agent(&rt, QUOTA, dir.path());
    let envoy = start_envoy(&envoy_bin, agent.grpc_addr(), &dir.path().join("envoy"));

    let admitted = open_bucket(&envoy, "k1") + traffic(&[&envoy], "k1", REPORTING_INTERVAL)[0];
    let (granted, refunded) = key_units(&agent, "k1");
    assert!(
        granted > admitted,
        "a lease ahead of use: {granted} for {admitted}"
    );
    assert_eq!(refunded, 0);
    // Envoy reports every bucket at every interval (every 5 s in Envoy 1.40): after three
    // reports with no request the agent abandons the bucket and ends its lease.
    let deadline = Instant::now() + Duration::from_secs(40);
    while metric(&agent, IDLE_DROPS) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no idle bucket abandoned in 40 s\n{}",
            agent.log_tail()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (granted_after, refunded_after) = key_units(&agent, "k1");
    let net = granted_after - refunded_after;
    eprintln!(
        "{test}: {admitted} admitted, lease of {granted}; after the abandon {granted_after} \
         granted, {refunded_after} refunded"
    );
    assert!(refunded_after > 0, "unused units went back to the region");
    assert!(
        net >= admitted,
        "what Envoy admitted stays counted: {net} < {admitted}"
    );
    // The next request opens a new bucket, assigned again.
    open_bucket(&envoy, "k1");
    assert_eq!(status(&envoy, "k1"), 200);
}

/// Two regions, each an agent with its own Envoy, synced through a coordinator: the limit is
/// strict with default shares of a quarter each, half left to the rebalancer.
fn coordinated_limits_yaml(quota: u64) -> String {
    format!(
        "{}    allot: {{weights: {{a: 0.25, b: 0.25}}}}\n",
        limits_yaml(quota)
    )
}

/// RLQS traffic in two regions draws on one quota through the coordinator: demand in one
/// region moves allowance to it (its agent leases past its default share to its Envoy), and
/// with demand in both, the two Envoys together admit at most the quota plus the term (each
/// Envoy's first request, before its bucket's first assignment). How the quota is shared once both have
/// demand is printed, not checked: a's leases, renewed at every report from its demand, can
/// hold the whole quota, and b's Envoy then gets almost nothing (docs/rlqs.md, "Not done yet").
#[test]
fn rlqs_two_regions_share_one_quota_through_the_coordinator() {
    let test = "rlqs_two_regions_share_one_quota_through_the_coordinator";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    const QUOTA: u64 = 200;
    const DEFAULT_SHARE: u64 = QUOTA / 4;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(support::clear_of_the_day_boundary());
    let dir = support::scratch("rlqs", "two_regions", Some(&coordinated_limits_yaml(QUOTA)));
    let (grpc, http) = (support::free_port(), support::free_port());
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.arg("coordinator")
        .args(["--id", "1"])
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--data")
        .arg(dir.join("node-1"))
        .arg("--limits")
        .arg(dir.join("limits.yaml"));
    let coordinator = support::Process::start(cmd, "coordinator");
    let agents: Vec<support::Process> = ["a", "b"]
        .iter()
        .map(|r| support::Process::agent(&dir, r, Some(&coordinator.grpc)))
        .collect();
    for a in &agents {
        rt.block_on(a.synced());
    }
    let envoys: Vec<EnvoyProcess> = agents
        .iter()
        .zip(["envoy-a", "envoy-b"])
        .map(|(a, name)| start_envoy(&envoy_bin, a.grpc.parse().unwrap(), &dir.join(name)))
        .collect();
    let (a, b) = (&envoys[0], &envoys[1]);

    // Demand in `a` only until the coordinator has grown a's allowance past its default
    // share from b's unused one (three of Envoy's 5 s reports on a quiet machine; a loaded
    // one paces a's first assignments slower, so the time is bounded, not fixed). Then
    // demand in both.
    let row = |status: &serde_json::Value, field: &str| {
        status["counters"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["counter"]["key"] == "api_key=shared"))
            .and_then(|c| c["regions"]["a"][field].as_u64())
            .unwrap_or(0)
    };
    let opened_a = open_bucket(a, "shared");
    let started = Instant::now();
    let mut alone = 0;
    let (allowance_a, used_a) = loop {
        alone += traffic(&[a], "shared", Duration::from_secs(4))[0];
        let status = support::get_json(&coordinator.http, "/v1/status");
        let (allowance, used) = (row(&status, "allowance_units"), row(&status, "used_units"));
        let moved = allowance > DEFAULT_SHARE && used > DEFAULT_SHARE;
        if moved || started.elapsed() > 4 * support::PATIENCE {
            break (allowance, used);
        }
    };
    let alone_for = started.elapsed();
    let opened_b = open_bucket(b, "shared");
    let both = traffic(&[a, b], "shared", Duration::from_secs(16));
    let admitted_a = opened_a + alone + both[0];
    let admitted_b = opened_b + both[1];
    let total = admitted_a + admitted_b;
    let status = support::get_json(&coordinator.http, "/v1/status");
    eprintln!(
        "{test}: a alone {opened_a} + {alone} in {alone_for:?}, then a {} and b {opened_b} + \
         {}: {total} of {QUOTA}; the table: {}",
        both[0], both[1], status["counters"]
    );
    // The allowance moved to a, and a's agent leased past its default share to its Envoy.
    // How much of that Envoy admits in the run is RLQS's pacing, not the coordinator's: its
    // first assignment lapses before its second report, and a short lease is a trickle
    // (docs/rlqs.md, "Not done yet"); a's Envoy admitted 46 to 49 of its 128 to 129 leased
    // units in the runs that showed it, so that count is printed, not checked.
    assert!(
        allowance_a > DEFAULT_SHARE && used_a > DEFAULT_SHARE,
        "a's allowance {allowance_a}, its use {used_a} after {alone_for:?}: not past its \
         default share {DEFAULT_SHARE}, so no allowance moved to it"
    );
    let term = 2;
    assert!(
        total <= QUOTA + term,
        "{total} admitted across the regions, quota {QUOTA} + term {term}"
    );
}
