//! The coordinator daemon with real agents, on loopback.
//!
//! - In process (slow tier, `ALLOT_SLOW_TESTS=1`): three coordinator nodes with the real
//!   daemon and two `allot agent` processes for regions `a` and `b` on a strict limit. Demand
//!   in `a` grows its allowance above its default, and every node's committed table holds what
//!   the agent was granted; then the leader's node stops, both agents follow the new leader,
//!   and demand moving to `b` is rebalanced there.
//! - As processes (slow tier): three `allot coordinator` processes and two agents through a
//!   SIGKILL of the leader and a SIGKILL and restart of every node.
//! - As processes (every `cargo test`): `allot coordinator` with its default addresses and
//!   data directory beside an `allot agent --coordinator`: `/v1/status` and `allot status`
//!   show the region heard.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use allot_coordinator::daemon::{Daemon, DaemonSettings, limits};
use allot_coordinator::raft_config::raft_config;
use allot_core::ids::RegionId;
use allot_core::rebalance::CoordinatorConfig;
use serde_json::Value;

use support::{PATIENCE, Process, clear_of_the_day_boundary, eventually, free_port, slow_tier};

/// Day windows; `strict` leaves 40% of its quota unassigned for the rebalancer.
const LIMITS: &str = "\
domain: shop
descriptors:
  - key: shared
    rate_limit: {unit: day, requests_per_unit: 100}
    allot: {consistency: eventual, weights: {a: 0.5, b: 0.5}}
  - key: strict
    rate_limit: {unit: day, requests_per_unit: 100000}
    allot: {weights: {a: 0.3, b: 0.3}}
";

/// The strict limit's quota, and its default share per region (30% of it).
const STRICT_QUOTA_UNITS: u64 = 100_000;
const STRICT_DEFAULT_UNITS: u64 = 30_000;

fn scratch(test: &str) -> PathBuf {
    support::scratch("coordinator", test, Some(LIMITS))
}

/// The agent's view of `shop`'s `key` counter.
fn key_of(agent: &Process, key: &str) -> Value {
    agent.json(&format!("/v1/keys?domain=shop&descriptor={key}"))
}

/// Whether `agent` admits `cost` units of `shop`'s `key`.
async fn acquire(agent: &Process, key: &str, cost: u64) -> bool {
    agent.acquire("shop", key, "", cost).await
}

async fn start_node(
    dir: &Path,
    id: u64,
    grpc: tokio::net::TcpListener,
    peers: &BTreeMap<u64, String>,
) -> Daemon {
    let files = limits::read(&[dir.join("limits.yaml")], 1, false).expect("limits load");
    let settings = DaemonSettings {
        id,
        peers: peers.clone(),
        join: false,
        data_dir: dir.join(format!("node-{id}")),
        raft: raft_config("allot-test").expect("raft settings"),
        rebalance: CoordinatorConfig::default(),
        limits: Some(limits::StartLimits::Files(files)),
        tls: None,
        admin_token_sha256: None,
        read_token_sha256: None,
        admin_tls: false,
    };
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    Daemon::start(settings, grpc, http).await.expect("starts")
}

fn leader_of(nodes: &BTreeMap<u64, Daemon>) -> Option<u64> {
    nodes
        .values()
        .find_map(|d| d.raft().metrics().borrow().current_leader)
        .filter(|l| nodes.contains_key(l))
}

/// `region`'s committed allowance of the strict counter on `node`.
fn committed_strict(node: &Daemon, region: &str) -> Option<u64> {
    node.state().read(|a| {
        let table = a.state.table();
        let (counter, _) = table
            .counters()
            .find(|(c, _)| c.limit.as_str() == "shop/strict")?;
        Some(table.allowance(counter, &RegionId::from(region)))
    })
}

fn strict_allowance(agent: &Process) -> u64 {
    key_of(agent, "strict")["allowance_units"]
        .as_u64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_rebalance_two_regions_and_the_agents_follow_a_new_leader() {
    if !slow_tier() {
        return;
    }
    clear_of_the_day_boundary().await;
    let dir = scratch("three_nodes");
    let mut listeners = BTreeMap::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        peers.insert(id, l.local_addr().expect("address").to_string());
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        nodes.insert(id, start_node(&dir, id, l, &peers).await);
    }
    let all: Vec<&str> = peers.values().map(String::as_str).collect();
    let a = Process::agent(&dir, "a", Some(&all.join(",")));
    let b = Process::agent(&dir, "b", Some(&all.join(",")));
    let first = eventually("a leader", || leader_of(&nodes), Option::is_some)
        .await
        .expect("checked");
    for agent in [&a, &b] {
        eventually(
            "the agent syncs with the leader",
            || agent.json("/v1/status")["sync"].clone(),
            |s| s["connected"] == true && s["leader"] == peers[&first].as_str(),
        )
        .await;
    }

    // Demand in a: its allowance grows above its default, and what a holds is what every
    // node committed (the answer carrying the grow came after its commit).
    assert!(acquire(&a, "strict", STRICT_DEFAULT_UNITS).await);
    acquire(&a, "strict", 10_000).await;
    let grown = eventually(
        "a's strict allowance grows",
        || strict_allowance(&a),
        |u| *u > STRICT_DEFAULT_UNITS,
    )
    .await;
    for node in nodes.values() {
        eventually(
            "the grow committed on every node",
            || committed_strict(node, "a"),
            |u| *u >= Some(grown),
        )
        .await;
    }

    // The leader's node stops: both agents follow the new leader.
    nodes
        .remove(&first)
        .expect("leader")
        .shutdown()
        .await
        .expect("stops");
    let second = eventually(
        "a new leader",
        || leader_of(&nodes),
        |l| l.is_some_and(|l| l != first),
    )
    .await
    .expect("checked");
    for agent in [&a, &b] {
        eventually(
            "the agent follows the new leader",
            || agent.json("/v1/status")["sync"].clone(),
            |s| s["connected"] == true && s["leader"] == peers[&second].as_str(),
        )
        .await;
    }

    // Demand moves to b: using more than the quota less a's grown allowance needs a to
    // release part of it and b to grow: both committed by the new leader. (How far a grew
    // depends on the time of day, its demand being its use over the day so far: 57,043 left
    // 12,957 unassigned, so a fixed 5,000 above b's default needed no release.)
    let unassigned_after_a = STRICT_QUOTA_UNITS - grown;
    let target = (unassigned_after_a / 1_000 + 1) * 1_000;
    let target = target.max(STRICT_DEFAULT_UNITS + 5_000);
    // Late in the day a grows by a few hundred units only (its forecast is its rate over the
    // rest of the day: 295 at 23:45), and one chunk past the unassigned units would need all
    // of a's growth back down to its use. Then b's target stays a chunk below what a's use
    // (its default, admitted above) leaves, and no release is needed.
    let target = target.min(STRICT_QUOTA_UNITS - STRICT_DEFAULT_UNITS - 1_000);
    let mut granted = 0;
    let deadline = Instant::now() + PATIENCE;
    while granted < target {
        if acquire(&b, "strict", 1_000).await {
            granted += 1_000;
        } else {
            assert!(
                Instant::now() < deadline,
                "b never grew: granted {granted}, a {}, b {}",
                strict_allowance(&a),
                strict_allowance(&b)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let b_grown = strict_allowance(&b);
    assert!(b_grown >= target, "{b_grown}");
    let a_now = committed_strict(&nodes[&second], "a").expect("a's row");
    if target > STRICT_QUOTA_UNITS - grown {
        assert!(a_now < grown, "a released: {grown} -> {a_now}");
    }
    let committed = committed_strict(&nodes[&second], "b").expect("b's row");
    assert!(
        committed >= b_grown,
        "committed {committed}, b holds {b_grown}"
    );
    for (_, node) in nodes {
        node.shutdown().await.expect("stops");
    }
}

/// `allot coordinator` needs nothing but the limits the agents load: its addresses
/// (127.0.0.1:7070 and :7071) and data directory (`./allot-coordinator-data`) are defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_coordinator_process_hears_an_agent_and_allot_status_shows_it() {
    clear_of_the_day_boundary().await;
    let dir = scratch("defaults");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.current_dir(&dir)
        .args(["coordinator", "--limits", "limits.yaml"]);
    let coordinator = Process::start(cmd, "coordinator");
    assert_eq!(coordinator.grpc, "127.0.0.1:7070");
    assert_eq!(coordinator.http, "127.0.0.1:7071");
    let a = Process::agent(&dir, "a", Some(&coordinator.grpc));
    let status = eventually(
        "the coordinator hears a",
        || coordinator.json("/v1/status"),
        |s| s["regions"][0]["sync_lag_ms"].is_u64(),
    )
    .await;
    assert_eq!(status["state"], "leader", "{status}");
    assert_eq!(status["regions"][0]["region"], "a", "{status}");
    assert!(dir.join("allot-coordinator-data").is_dir());
    assert_eq!(a.json("/v1/status")["sync"]["connected"], true);

    let status_cmd = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args(["status", "--coordinator", &coordinator.http]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("allot status runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let printed: Value = serde_json::from_str(&status_cmd(true)).expect("JSON");
    assert_eq!(printed["regions"][0]["region"], "a", "{printed}");
    let text = status_cmd(false);
    assert!(text.contains("a: heard"), "{text}");
    assert!(text.contains("shop/strict:"), "{text}");
    assert!(text.contains("escalated counters:"), "{text}");
}

/// One `allot coordinator` process of a three-node cluster, by its fixed addresses.
struct NodeArgs {
    id: u64,
    grpc: String,
    http: String,
}

fn start_coordinator(dir: &Path, node: &NodeArgs, peers: &str) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.arg("coordinator")
        .args(["--id", &node.id.to_string(), "--peers", peers])
        .args(["--grpc", &node.grpc, "--http", &node.http])
        .arg("--data")
        .arg(dir.join(format!("node-{}", node.id)))
        .arg("--limits")
        .arg(dir.join("limits.yaml"));
    Process::start(cmd, "coordinator")
}

/// The leader's id and status, as a running node reports it.
fn leader_status(nodes: &BTreeMap<u64, Process>) -> Option<(u64, Value)> {
    nodes.iter().find_map(|(id, p)| {
        let s = p.json("/v1/status");
        (s["state"] == "leader").then_some((*id, s))
    })
}

/// The strict counter's committed rows, from a leader's status: (a, b).
fn strict_rows(status: &Value) -> Option<(u64, u64)> {
    let c = status["counters"]
        .as_array()?
        .iter()
        .find(|c| c["counter"]["limit"] == "shop/strict")?;
    let row = |r: &str| c["regions"][r]["allowance_units"].as_u64();
    Some((row("a")?, row("b").unwrap_or(STRICT_DEFAULT_UNITS)))
}

/// Real processes, real kills: three `allot coordinator` processes and two agents. SIGKILL
/// the leader: the agents follow the new one and demand moving to the other region is
/// rebalanced; then SIGKILL every node and start them again from their directories: the
/// committed rows come back (no counter above its quota) and the agents resume.
///
/// Before the rebalancer committed a start entry of its own, this failed on the restart: the
/// node that led before the kills came back leading in its old term (openraft restores a
/// committed vote for itself) with no blank entry, and its rebalancer was built from the
/// state one committed entry short: b's row 4,071 where b held 37,000 (and had used 35,000).
/// Its next round diverged from the replicated outcome and was rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_coordinator_processes_hand_over_and_restart_from_disk() {
    if !slow_tier() {
        return;
    }
    clear_of_the_day_boundary().await;
    let dir = scratch("processes");
    let args: Vec<NodeArgs> = (1..=3)
        .map(|id| NodeArgs {
            id,
            grpc: format!("127.0.0.1:{}", free_port()),
            http: format!("127.0.0.1:{}", free_port()),
        })
        .collect();
    let peers: Vec<String> = args
        .iter()
        .map(|n| format!("{}={}", n.id, n.grpc))
        .collect();
    let peers = peers.join(",");
    let grpc_of = |id: u64| args[id as usize - 1].grpc.clone();
    let start_all = || -> BTreeMap<u64, Process> {
        args.iter()
            .map(|n| (n.id, start_coordinator(&dir, n, &peers)))
            .collect()
    };
    let mut nodes = start_all();
    let all: Vec<String> = args.iter().map(|n| n.grpc.clone()).collect();
    let a = Process::agent(&dir, "a", Some(&all.join(",")));
    let b = Process::agent(&dir, "b", Some(&all.join(",")));
    let follows = |agent: &Process, leader: &str| {
        let s = agent.json("/v1/status")["sync"].clone();
        s["connected"] == true && s["leader"] == leader
    };

    let (first, _) = eventually("a leader", || leader_status(&nodes), Option::is_some)
        .await
        .expect("checked");
    for agent in [&a, &b] {
        eventually("synced", || follows(agent, &grpc_of(first)), |f| *f).await;
    }
    assert!(acquire(&a, "strict", STRICT_DEFAULT_UNITS).await);
    acquire(&a, "strict", 10_000).await;
    eventually(
        "a grows",
        || strict_allowance(&a),
        |u| *u > STRICT_DEFAULT_UNITS,
    )
    .await;

    // SIGKILL the leader.
    drop(nodes.remove(&first));
    let killed = Instant::now();
    let (second, _) = eventually(
        "a new leader",
        || leader_status(&nodes),
        |l| l.as_ref().is_some_and(|(id, _)| *id != first),
    )
    .await
    .expect("checked");
    let elected = killed.elapsed();
    for agent in [&a, &b] {
        eventually("follows", || follows(agent, &grpc_of(second)), |f| *f).await;
    }
    let mut granted = 0;
    while granted < STRICT_DEFAULT_UNITS + 5_000 {
        if acquire(&b, "strict", 1_000).await {
            granted += 1_000;
        } else {
            assert!(killed.elapsed() < PATIENCE, "b never grew");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "leader killed: new leader after {elected:?}, b grown past its default after {:?}",
        killed.elapsed()
    );

    let (_, before) = leader_status(&nodes).expect("a leader");
    eprintln!(
        "before the restart: rows {:?}, applied {}, b holds {}",
        strict_rows(&before),
        before["last_applied_index"],
        strict_allowance(&b)
    );

    // SIGKILL every node, then start all three from their directories.
    drop(nodes);
    let mut nodes = start_all();
    let (_, status) = eventually(
        "a leader after the restart",
        || leader_status(&nodes),
        |l| {
            // The rebalancer's part (`limits`) is there once it is built from the whole log.
            l.as_ref().is_some_and(|(_, s)| s["limits"].is_array())
        },
    )
    .await
    .expect("checked");
    assert_eq!(status["config_version"], 1, "{status}");
    let (a_rows, b_rows) = strict_rows(&status).expect("checked");
    assert!(
        b_rows > STRICT_DEFAULT_UNITS,
        "b's grow came back: {status}"
    );
    assert!(a_rows + b_rows <= 100_000, "{status}");
    let (third, _) = leader_status(&nodes).expect("a leader");
    for agent in [&a, &b] {
        eventually("resumes", || follows(agent, &grpc_of(third)), |f| *f).await;
        // Its view is fresh again (it was expired while no leader answered), and it admits
        // on its allowance.
        let deadline = Instant::now() + PATIENCE;
        while !acquire(agent, "strict", 1).await {
            assert!(Instant::now() < deadline, "{}", agent.json("/v1/status"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    nodes.clear();
}
