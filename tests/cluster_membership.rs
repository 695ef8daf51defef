//! The coordinator cluster's membership changed with admin calls (`allot cluster add-node`,
//! `remove-node`), with real processes on loopback.
//!
//! - Every `cargo test`: a single `allot coordinator` and one started with `--join`: the
//!   refusals (the last voter, an unknown id, an id already a voter, bad input) change nothing,
//!   `add-node` makes the joining node a voter holding the table, the follower it became
//!   answers a change with `421` naming the leader, and `remove-node` takes it out again.
//! - Slow tier (`ALLOT_SLOW_TESTS=1`): three nodes and two agents on a strict limit; a fourth
//!   node is added, an original follower removed, then the leader itself. After each change
//!   the cluster commits a configuration put, `allot status` shows the new members, the new
//!   node holds the table, and the agents (which list only the three original nodes, two of
//!   them removed but still running) follow the leader and take its answers.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Instant;

use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use serde_json::Value;
use tonic::transport::Channel;

use support::{clear_of_the_day_boundary, eventually, slow_tier};

/// A day window; `strict` leaves 40% of its quota unassigned for the rebalancer.
const LIMITS: &str = "\
domain: shop
descriptors:
  - key: strict
    rate_limit: {unit: day, requests_per_unit: 100000}
    allot: {weights: {a: 0.3, b: 0.3}}
";

fn scratch(test: &str) -> PathBuf {
    support::scratch("cluster_membership", test, Some(LIMITS))
}

/// A child process printing `ready grpc=ADDR http=ADDR` first; killed when dropped.
struct Process {
    child: Child,
    grpc: String,
    http: String,
}

impl Process {
    fn start(cmd: Command) -> Process {
        let (child, grpc, http, _log) = support::spawn_ready(cmd, "process").logged("process");
        Process { child, grpc, http }
    }

    /// A coordinator node: `--peers` to start a cluster (empty: a single-node one), or none
    /// with `--join`.
    fn coordinator(dir: &Path, id: u64, grpc: &str, http: &str, peers: Option<&str>) -> Process {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.arg("coordinator")
            .args(["--id", &id.to_string(), "--grpc", grpc, "--http", http])
            .arg("--data")
            .arg(dir.join(format!("node-{id}")))
            .arg("--limits")
            .arg(dir.join("limits.yaml"));
        match peers {
            Some("") => &mut cmd,
            Some(p) => cmd.args(["--peers", p]),
            None => cmd.arg("--join"),
        };
        Process::start(cmd)
    }

    fn agent(dir: &Path, region: &str, coordinators: &str) -> Process {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args(["agent", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .arg("--data")
            .arg(dir.join(format!("data-{region}")))
            .arg("--config")
            .arg(dir.join("limits.yaml"))
            .args(["--region", region, "--coordinator", coordinators]);
        Process::start(cmd)
    }

    fn json(&self, path: &str) -> Value {
        let (status, body) = http(&self.http, "GET", path, "");
        assert_eq!(status, 200, "{path}: {body}");
        body
    }

    fn status(&self) -> Value {
        self.json("/v1/status")
    }

    fn voters(&self) -> Vec<u64> {
        let nodes = self.json("/v1/cluster/nodes");
        nodes["voters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["id"].as_u64())
            .collect()
    }

    /// The agent's sync link answers from `leader` (a gRPC address).
    fn follows(&self, leader: &str) -> bool {
        let s = self.status()["sync"].clone();
        s["connected"] == true && s["leader"] == leader
    }

    async fn acquire(&self, cost: u64) -> bool {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .expect("url")
            .connect()
            .await
            .expect("connects to the agent");
        LeaseServiceClient::new(channel)
            .acquire(pb::AcquireRequest {
                target: Some(pb::Target {
                    domain: "shop".to_owned(),
                    entries: vec![pb::Entry {
                        key: "strict".to_owned(),
                        value: String::new(),
                    }],
                }),
                cost_units: cost,
                idempotency_key: String::new(),
            })
            .await
            .expect("the agent answers")
            .into_inner()
            .decision
            .is_some_and(|d| d.allowed)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request: the status code and the body as JSON (`null` if it is not).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Runs `allot ARGS...`.
fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .output()
        .expect("allot runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The refusals change nothing; a joining node is added, answers as a follower, and is
/// removed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_are_checked_and_a_joining_node_is_added_and_removed() {
    let dir = scratch("errors");
    let any = "127.0.0.1:0";
    let one = Process::coordinator(&dir, 1, any, any, Some(""));
    let two = Process::coordinator(&dir, 2, any, any, None);
    eventually(
        "node 1 leads",
        || one.status()["state"].clone(),
        |s| s == "leader",
    )
    .await;

    // The joining node holds no membership and knows no leader.
    let joining = two.json("/v1/cluster/nodes");
    assert_eq!(joining["role"], "not_member", "{joining}");
    assert_eq!(joining["voters"], Value::Array(vec![]), "{joining}");
    assert!(joining["leader"].is_null(), "{joining}");

    // Refused, nothing changes: the last voter, an unknown id, a voter added again.
    let out = allot(&[
        "cluster",
        "remove-node",
        "--coordinator",
        &one.http,
        "--id",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("last voter"), "{out:?}");
    let out = allot(&[
        "cluster",
        "remove-node",
        "--coordinator",
        &one.http,
        "--id",
        "7",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        text(&out.stderr).contains("node 7 is not a member"),
        "{out:?}"
    );
    let out = allot(&[
        "cluster",
        "add-node",
        "--coordinator",
        &one.http,
        "--id",
        "1",
        "--grpc",
        &two.grpc,
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).contains("already a voter"), "{out:?}");
    // Bad input straight to the admin call.
    let bad = [
        ("POST", "/v1/cluster/nodes", "garbage"),
        ("POST", "/v1/cluster/nodes", r#"{"id": 2}"#),
        (
            "POST",
            "/v1/cluster/nodes",
            r#"{"id": 2, "address": "nowhere"}"#,
        ),
        (
            "POST",
            "/v1/cluster/nodes",
            r#"{"id": 2, "address": "h:1", "x": 1}"#,
        ),
        ("DELETE", "/v1/cluster/nodes/two", ""),
    ];
    for (method, path, body) in bad {
        let (status, answer) = http(&one.http, method, path, body);
        assert_eq!(status, 400, "{method} {path} {body}: {answer}");
        assert!(answer["error"].is_string(), "{answer}");
    }
    assert_eq!(one.voters(), vec![1]);
    assert_eq!(two.json("/v1/cluster/nodes")["role"], "not_member");

    // Added through the CLI; the joining node, tried first, sends it on.
    let both = format!("{},{}", two.http, one.http);
    let out = allot(&[
        "cluster",
        "add-node",
        "--coordinator",
        &both,
        "--id",
        "2",
        "--grpc",
        &two.grpc,
    ]);
    assert!(out.status.success(), "{out:?}");
    let printed = text(&out.stdout);
    assert!(printed.contains(&format!("2={}", two.grpc)), "{printed}");
    assert_eq!(one.voters(), vec![1, 2]);
    // The new node holds the configuration and knows the leader.
    let status = eventually(
        "node 2 applies the cluster's entries",
        || two.status(),
        |s| s["config_version"] == 1 && s["role"] == "voter" && s["leader"] == 1,
    )
    .await;
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(2),
        "{status}"
    );

    // The follower answers a change with 421 and the leader's address; nothing changes.
    for (method, path, body) in [
        ("DELETE", "/v1/cluster/nodes/1".to_owned(), String::new()),
        (
            "POST",
            "/v1/cluster/nodes".to_owned(),
            format!(r#"{{"id": 3, "address": "{}"}}"#, "127.0.0.1:9"),
        ),
    ] {
        let (status, answer) = http(&two.http, method, &path, &body);
        assert_eq!(status, 421, "{answer}");
        assert_eq!(answer["leader"], 1, "{answer}");
        assert_eq!(answer["leader_address"], one.grpc.as_str(), "{answer}");
    }
    assert_eq!(one.voters(), vec![1, 2]);

    // Removed: the cluster is node 1 again; node 2 no longer votes.
    let out = allot(&[
        "cluster",
        "remove-node",
        "--coordinator",
        &both,
        "--id",
        "2",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(one.voters(), vec![1]);
    // Committed on node 1 when the command returns; node 2 applies it a moment later.
    eventually(
        "node 2 applies its removal",
        || two.status(),
        |s| s["role"] != "voter",
    )
    .await;
    let members = allot(&["cluster", "members", "--coordinator", &one.http]);
    assert!(members.status.success(), "{members:?}");
    let printed = text(&members.stdout);
    assert!(
        printed.contains(&format!("voters: 1={}\n", one.grpc)),
        "{printed}"
    );
}

/// `allot status` on `node`, as text and as JSON.
fn allot_status(node: &Process) -> (String, Value) {
    let out = allot(&["status", "--coordinator", &node.http]);
    assert!(out.status.success(), "{out:?}");
    let json = allot(&["status", "--coordinator", &node.http, "--json"]);
    assert!(json.status.success(), "{json:?}");
    (
        text(&out.stdout),
        serde_json::from_slice(&json.stdout).expect("JSON"),
    )
}

/// The member ids a status lists.
fn member_ids(status: &Value) -> Vec<u64> {
    status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_u64())
        .collect()
}

/// The leader's id among `nodes`, by its own status.
fn leader_of(nodes: &[(u64, &Process)]) -> Option<u64> {
    nodes
        .iter()
        .find(|(_, p)| p.status()["state"] == "leader")
        .map(|(id, _)| *id)
}

fn node<'a>(nodes: &[(u64, &'a Process)], id: u64) -> &'a Process {
    nodes
        .iter()
        .find(|(i, _)| *i == id)
        .map(|(_, p)| *p)
        .expect("a node of the list")
}

/// `allot config put` of the limits at the next version, on every node's admin address.
/// Puts the limits with the quota raised by `version` (a put of the files in force commits
/// nothing, D32), expecting it to commit as `version`.
fn config_put(dir: &Path, http: &str, version: u64) -> String {
    let limits = dir.join("limits.yaml");
    let quota = format!("requests_per_unit: {}", 100_000 + version);
    std::fs::write(&limits, LIMITS.replace("requests_per_unit: 100000", &quota))
        .expect("write limits");
    let out = allot(&[
        "config",
        "put",
        limits.to_str().expect("UTF-8 path"),
        "--coordinator",
        http,
    ]);
    assert!(out.status.success(), "{out:?}");
    text(&out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_added_a_follower_and_the_leader_removed_and_the_cluster_goes_on() {
    if !slow_tier() {
        return;
    }
    clear_of_the_day_boundary().await;
    let dir = scratch("changes");
    let port = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("127.0.0.1:{}", l.local_addr().expect("address").port())
    };
    let addrs: Vec<(String, String)> = (0..3).map(|_| (port(), port())).collect();
    let peers: Vec<String> = (1..=3)
        .map(|id| format!("{id}={}", addrs[id - 1].0))
        .collect();
    let peers = peers.join(",");
    let originals: Vec<Process> = (1..=3)
        .map(|id| {
            let (grpc, http) = &addrs[id as usize - 1];
            Process::coordinator(&dir, id, grpc, http, Some(&peers))
        })
        .collect();
    let agent_list: Vec<&str> = originals.iter().map(|p| p.grpc.as_str()).collect();
    let a = Process::agent(&dir, "a", &agent_list.join(","));
    let b = Process::agent(&dir, "b", &agent_list.join(","));

    let all: Vec<(u64, &Process)> = (1..=3)
        .map(|id| (id, &originals[id as usize - 1]))
        .collect();
    let first = eventually("a leader", || leader_of(&all), Option::is_some)
        .await
        .expect("checked");
    let first_node = node(&all, first);
    for agent in [&a, &b] {
        eventually("synced", || agent.follows(&first_node.grpc), |f| *f).await;
    }
    // Both regions admit on their default shares.
    assert!(a.acquire(1_000).await);
    assert!(b.acquire(1_000).await);

    // 1. A fourth node, started empty with --join, added by an admin call.
    let four = Process::coordinator(&dir, 4, "127.0.0.1:0", "127.0.0.1:0", None);
    let admin_list: Vec<&str> = originals.iter().map(|p| p.http.as_str()).collect();
    let admin_list = format!("{},{}", admin_list.join(","), four.http);
    let out = allot(&[
        "cluster",
        "add-node",
        "--coordinator",
        &admin_list,
        "--id",
        "4",
        "--grpc",
        &four.grpc,
    ]);
    assert!(out.status.success(), "{out:?}");
    let (printed, status) = allot_status(first_node);
    assert_eq!(member_ids(&status), vec![1, 2, 3, 4], "{status}");
    assert!(printed.contains(&format!("4={}", four.grpc)), "{printed}");
    // The new node holds the table: the regions and the version committed before it joined.
    let regions = |s: &Value| -> Vec<String> {
        s["regions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["region"].as_str().map(str::to_owned))
            .collect()
    };
    // The call returns once the leader committed the change; node 4 applies it a heartbeat
    // later.
    let held = eventually(
        "node 4 applies its own promotion",
        || four.status(),
        |s| s["role"] == "voter",
    )
    .await;
    assert_eq!(held["config_version"], 1, "{held}");
    assert_eq!(regions(&held), vec!["a", "b"], "{held}");
    let put = config_put(&dir, &admin_list, 2);
    assert!(put.contains("version 2 committed"), "{put}");
    eventually(
        "node 4 applies version 2",
        || four.status()["config_version"].clone(),
        |v| v == 2,
    )
    .await;

    // 2. An original follower removed; it stays running and the agents still list it.
    let follower = (1..=3).find(|id| *id != first).expect("a follower");
    let follower_node = &originals[follower as usize - 1];
    let out = allot(&[
        "cluster",
        "remove-node",
        "--coordinator",
        &admin_list,
        "--id",
        &follower.to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let (_, status) = allot_status(first_node);
    let mut expected: Vec<u64> = vec![1, 2, 3, 4];
    expected.retain(|id| *id != follower);
    assert_eq!(member_ids(&status), expected, "{status}");
    let removed = follower_node.status();
    assert_ne!(removed["role"], "voter", "{removed}");
    let put = config_put(&dir, &admin_list, 3);
    assert!(put.contains("version 3 committed"), "{put}");
    eventually(
        "node 4 applies version 3",
        || four.status()["config_version"].clone(),
        |v| v == 3,
    )
    .await;
    // A follower answers a change with 421 naming the leader.
    let third = (1..=3)
        .find(|id| *id != first && *id != follower)
        .expect("the third");
    let (code, answer) = http(
        &originals[third as usize - 1].http,
        "DELETE",
        &format!("/v1/cluster/nodes/{first}"),
        "",
    );
    assert_eq!(code, 421, "{answer}");
    assert_eq!(
        answer["leader_address"],
        first_node.grpc.as_str(),
        "{answer}"
    );
    // ... and, once the leader's clock probes reached it, the leader's admin address, which
    // `config put` given the follower alone follows.
    let third_http = originals[third as usize - 1].http.clone();
    eventually(
        "the follower names the leader's admin address",
        || {
            let delete = format!("/v1/cluster/nodes/{first}");
            http(&third_http, "DELETE", &delete, "").1["leader_admin_http"].clone()
        },
        |v| v == first_node.http.as_str(),
    )
    .await;
    let put = config_put(&dir, &third_http, 4);
    assert!(
        put.contains(&format!(
            "version 4 committed ({} rules) by {}",
            1, first_node.http
        )),
        "{put}"
    );

    // 3. The leader removes itself: the remaining voters (the third original and node 4)
    // elect a leader, which commits; the agents, listing two removed nodes, follow it.
    let out = allot(&[
        "cluster",
        "remove-node",
        "--coordinator",
        &admin_list,
        "--id",
        &first.to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let remaining: Vec<(u64, &Process)> = vec![(third, &originals[third as usize - 1]), (4, &four)];
    let removed_at = Instant::now();
    let second = eventually(
        "a leader among the remaining voters",
        || leader_of(&remaining),
        Option::is_some,
    )
    .await
    .expect("checked");
    let second_node = node(&remaining, second);
    eprintln!(
        "the leader removed itself: node {second} leads after {:?}",
        removed_at.elapsed()
    );
    let (printed, status) = allot_status(second_node);
    let mut expected = vec![third, 4];
    expected.sort_unstable();
    assert_eq!(member_ids(&status), expected, "{status}");
    assert!(
        printed.contains(&format!("leader {second} at")),
        "{printed}"
    );
    let old = first_node.status();
    assert_ne!(old["state"], "leader", "{old}");
    assert_eq!(old["role"], "not_member", "{old}");
    let put = config_put(&dir, &admin_list, 5);
    assert!(put.contains("version 5 committed"), "{put}");
    for agent in [&a, &b] {
        eventually(
            "the agent follows the new leader",
            || agent.follows(&second_node.grpc),
            |f| *f,
        )
        .await;
    }

    // The agents' views are fresh from the new leader's answers, and they admit.
    for agent in [&a, &b] {
        eventually(
            "the agent's view is fresh",
            || agent.status()["sync"].clone(),
            |s| s["view_expired"] == false && s["last_answer_age_secs"].as_f64() < Some(1.0),
        )
        .await;
        assert!(agent.acquire(1_000).await);
    }
    // Node 4 holds what the new leader committed.
    eventually(
        "node 4 applies version 5",
        || four.status()["config_version"].clone(),
        |v| v == 5,
    )
    .await;
}
