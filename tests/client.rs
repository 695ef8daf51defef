//! The gateway library (`allot-client`) against a real `allot agent` on loopback: what it
//! admits is what the agent granted, it asks the agent rarely, it outlives the agent on held
//! units and then follows the failure mode, it reconnects, and it gives units back on shutdown.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_client::{Client, ClientConfig, Decision, FailureMode, Target};

use support::Process;

/// Longest any test waits for something that should happen promptly (the agent starting, the
/// client reconnecting): a bound on a hang, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(20);

/// Starts the agent on `grpc` (a fixed address, so a restart is found at the same place).
fn start_agent(dir: &Path, grpc: &str) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(["agent", "--grpc", grpc, "--http", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(dir.join("limits.yaml"));
    Process::start(cmd, "agent")
}

fn scratch(test: &str, limits: &str) -> PathBuf {
    support::scratch("client", test, Some(limits))
}

/// A loopback address nothing listens on now (the agent binds it next).
fn free_address() -> String {
    format!("127.0.0.1:{}", support::free_port())
}

fn config(agent: &Process, lease_units: u64) -> ClientConfig {
    let mut config = ClientConfig::new(format!("http://{}", agent.grpc));
    config.gateway.initial_lease_units = lease_units;
    config.gateway.max_lease_units = lease_units;
    config
}

fn metric_of(name: &str, rule: &str) -> String {
    format!("{name}{{rule=\"{rule}\"}}")
}

const QUOTA_100: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100}
";

/// Spends one unit at a time until the agent has said no `DENIALS_TO_STOP` times.
async fn spend_until_denied(client: Arc<Client>, key: Arc<allot_client::Key>) -> u64 {
    const DENIALS_TO_STOP: u32 = 20;
    let mut admitted = 0;
    let mut denials = 0;
    while denials < DENIALS_TO_STOP {
        match client.spend(&key, 1).await {
            Decision::Allowed => admitted += 1,
            Decision::Denied { .. } => denials += 1,
            other => panic!("the agent is up, yet {other:?}"),
        }
    }
    admitted
}

/// Two tasks spend one key of quota 100 until the agent refuses. Before the spend path waited
/// by time rather than by wake-ups, a spender that lost three races for the one-unit leases
/// near the limit fell to the (open) failure mode while the agent was answering, and the
/// client admitted 102 with 100 granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_admit_exactly_what_the_agent_granted() {
    let dir = scratch("exact", QUOTA_100);
    let agent = start_agent(&dir, &free_address());
    let client = Arc::new(Client::start(config(&agent, 30)).expect("client"));
    let key = Arc::new(
        client
            .key(&Target::new("api").entry("user", "u1"))
            .expect("key"),
    );
    let tasks: Vec<_> = (0..2)
        .map(|_| tokio::spawn(spend_until_denied(client.clone(), key.clone())))
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("task");
    }
    let client = Arc::into_inner(client).expect("the tasks are done");
    let client_stats = client.stats();
    client.shutdown().await;
    let granted = agent.metric(&metric_of("allot_lease_granted_units_total", "api/user"));
    let returned = agent.metric(&metric_of("allot_lease_returned_units_total", "api/user"));
    let stats = client_stats;
    println!("admitted {admitted}, granted {granted}, returned {returned}, {stats:?}");
    // Each admitted unit was granted, and every granted unit not admitted was given back:
    // leases shrink to one unit near the limit, so the whole quota is spent.
    assert_eq!(
        admitted as f64,
        granted - returned,
        "granted {granted}, returned {returned}"
    );
    assert_eq!(admitted, 100);
    assert_eq!((stats.failed_open, stats.failed_closed), (0, 0));
}

/// Sixteen keys of quota 100, each spent by its own task until the agent refuses: keys that
/// run low together are refilled by one `LeaseBatch` call, and each key still admits exactly
/// its quota (grants, denials and the one-unit leases near the limit carried item by item).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_refilled_in_one_call_each_admit_exactly_their_quota() {
    const KEYS: usize = 16;
    let dir = scratch("batch", QUOTA_100);
    let agent = start_agent(&dir, &free_address());
    let client = Arc::new(Client::start(config(&agent, 10)).expect("client"));
    let tasks: Vec<_> = (0..KEYS)
        .map(|i| {
            let target = Target::new("api").entry("user", format!("u{i}"));
            let key = Arc::new(client.key(&target).expect("key"));
            tokio::spawn(spend_until_denied(client.clone(), key))
        })
        .collect();
    let mut admitted = Vec::new();
    for t in tasks {
        admitted.push(t.await.expect("task"));
    }
    let stats = client.stats();
    let grants = agent.metric(&metric_of("allot_lease_grants_total", "api/user"));
    println!("admitted {admitted:?}, agent grants {grants}, {stats:?}");
    assert_eq!(admitted, vec![100; KEYS]);
    assert_eq!((stats.failed_open, stats.failed_closed), (0, 0));
    assert!(
        stats.lease_requests > stats.lease_rpcs,
        "{} requests in {} calls: no refill shared a call",
        stats.lease_requests,
        stats.lease_rpcs
    );
}

const QUOTA_LARGE: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_100_ask_the_agent_at_most_once_per_50_requests() {
    const REQUESTS_PER_TASK: u64 = 2_500;
    let dir = scratch("rpcs", QUOTA_LARGE);
    let agent = start_agent(&dir, &free_address());
    let client = Arc::new(Client::start(config(&agent, 100)).expect("client"));
    let key = Arc::new(
        client
            .key(&Target::new("api").entry("user", "hot"))
            .expect("key"),
    );
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move {
                for _ in 0..REQUESTS_PER_TASK {
                    assert_eq!(client.spend(&key, 1).await, Decision::Allowed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let admitted = 2 * REQUESTS_PER_TASK;
    let stats = client.stats();
    let agent_grants = agent.metric(&metric_of("allot_lease_grants_total", "api/user"));
    let client_rpcs = stats.lease_rpcs + stats.release_rpcs;
    println!("admitted {admitted}, agent grants {agent_grants}, client RPCs {client_rpcs}");
    assert!(
        agent_grants * 50.0 <= admitted as f64,
        "{agent_grants} grants"
    );
    assert!(client_rpcs * 50 <= admitted, "{client_rpcs} RPCs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_agent_held_units_spend_then_the_failure_mode_decides_until_it_returns() {
    let dir = scratch("outage", QUOTA_LARGE);
    let grpc = free_address();
    let agent = start_agent(&dir, &grpc);
    let mut config = config(&agent, 100);
    config.failure_mode = FailureMode::Closed;
    config.reconnect_cap = Duration::from_millis(200);
    let client = Client::start(config).expect("client");
    let key = client
        .key(&Target::new("api").entry("user", "u"))
        .expect("key");
    for _ in 0..10 {
        assert_eq!(client.spend(&key, 1).await, Decision::Allowed);
    }
    let held = client.held_units(&key);
    assert!(held > 0, "a lease is held");
    drop(agent);

    // Every held unit still spends, with no agent.
    for i in 0..held {
        assert_eq!(
            client.spend(&key, 1).await,
            Decision::Allowed,
            "unit {i} of {held}"
        );
    }
    // Then the failure mode (closed) refuses, and says so.
    assert_eq!(
        client.spend(&key, 1).await,
        Decision::Unavailable { allowed: false }
    );
    assert!(client.stats().failed_closed >= 1);

    // The agent comes back at the same address: the client reconnects and admits again.
    let _agent = start_agent(&dir, &grpc);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if client.spend(&key, 1).await == Decision::Allowed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reconnection: {:?}",
            client.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(client.connected());
    assert!(client.stats().reconnects >= 1);
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_unused_units_back() {
    let dir = scratch("shutdown", QUOTA_LARGE);
    let agent = start_agent(&dir, &free_address());
    let client = Client::start(config(&agent, 100)).expect("client");
    let key = client
        .key(&Target::new("api").entry("user", "u"))
        .expect("key");
    for _ in 0..10 {
        assert_eq!(client.spend(&key, 1).await, Decision::Allowed);
    }
    let held = client.held_units(&key);
    assert!(held > 0);
    client.shutdown().await;
    let returned = agent.metric(&metric_of("allot_lease_returned_units_total", "api/user"));
    assert_eq!(returned, held as f64);
}

const ONE_SLOT: &str = "\
domain: jobs
descriptors:
  - key: worker
    rate_limit: {unit: day, requests_per_unit: 1000}
    allot:
      concurrency: {max_slots: 1, slot_ttl: 30s}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_slot_guard_gives_the_slot_back() {
    let dir = scratch("slots", ONE_SLOT);
    let agent = start_agent(&dir, &free_address());
    let client = Client::start(config(&agent, 10)).expect("client");
    let target = Target::new("jobs").entry("worker", "w1");
    // The driver connects in the background: wait for it, so the first answer is the agent's.
    let deadline = Instant::now() + PATIENCE;
    while !client.connected() {
        assert!(Instant::now() < deadline, "no connection");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = client.acquire_slot(&target).await.expect("the one slot");
    assert!(
        matches!(
            client.acquire_slot(&target).await,
            Err(Decision::Denied { .. })
        ),
        "a second slot while the first is held"
    );
    drop(held);
    let deadline = Instant::now() + PATIENCE;
    let again = loop {
        if let Ok(guard) = client.acquire_slot(&target).await {
            break guard;
        }
        assert!(Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    drop(again);
    client.shutdown().await;
}

const REQUESTS_AND_TOKENS: &str = "\
domain: llm
descriptors:
  - key: requests
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 1000}
";

/// Two axes as one call against the real agent: 1 request and 30 tokens a call, with tokens
/// the scarcer. Every call spent both axes or neither: after shutdown hands back what is held,
/// what the agent counts as used on each axis (granted less returned) is exactly the calls
/// admitted, once for requests and 30 times for tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_axes_spend_both_or_neither_against_the_agent() {
    const TOKENS_PER_CALL: u64 = 30;
    let dir = scratch("axes", REQUESTS_AND_TOKENS);
    let agent = start_agent(&dir, &free_address());
    let client = Client::start(config(&agent, 100)).expect("client");
    let requests = client
        .key(&Target::new("llm").entry("requests", ""))
        .expect("key");
    let tokens = client
        .key(&Target::new("llm").entry("tokens", ""))
        .expect("key");
    let axes = allot_client::Axes::new()
        .axis(&requests, 1)
        .and_then(|a| a.axis(&tokens, TOKENS_PER_CALL))
        .expect("axes");
    let (mut admitted, mut denials) = (0u64, 0);
    let started = Instant::now();
    while denials < 20 {
        assert!(started.elapsed() < PATIENCE, "no end to the calls");
        match client.spend_all(&axes).await {
            Decision::Allowed => admitted += 1,
            Decision::Denied { .. } => denials += 1,
            other => panic!("the agent is up, yet {other:?}"),
        }
    }
    client.shutdown().await;
    let used = |rule: &str| {
        agent.metric(&metric_of("allot_lease_granted_units_total", rule))
            - agent.metric(&metric_of("allot_lease_returned_units_total", rule))
    };
    println!("admitted {admitted}");
    assert!(
        admitted <= 1_000 / TOKENS_PER_CALL,
        "tokens allow 33 calls: {admitted}"
    );
    assert!(
        admitted >= 20,
        "the calls stop only near the tokens' quota: {admitted}"
    );
    assert_eq!(used("llm/requests"), admitted as f64, "requests used");
    assert_eq!(
        used("llm/tokens"),
        (admitted * TOKENS_PER_CALL) as f64,
        "tokens used"
    );
}
