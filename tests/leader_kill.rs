//! Leader kills on real processes (slow tier, `ALLOT_SLOW_TESTS=1`): three `allot coordinator`
//! processes and three `allot agent` processes (regions `a`, `b`, `c`) on loopback.
//!
//! - Under load: the bench load generator (`allot_bench::loadgen`, as a library) drives every
//!   agent with `Acquire` calls on a strict and an eventual limit, demand moving from `a` to
//!   `b` to `c`. The leader is SIGKILLed in the middle of a window, restarted, and the next
//!   leader is SIGKILLed just after one of its rebalancing rounds. Checks: every window stated
//!   a bound (by a leader that watched its end), admitted at most the quota plus that bound
//!   (strict: at most the quota), and each new leader committed a rebalancing round within
//!   3 s of its election.
//! - The same on clocks that differ: nodes 2 and 3 run under libfaketime, their wall clocks
//!   24 s ahead of and 12 s behind the machine's (windows are 12 s), and each handover moves
//!   the lead between clocks windows apart. Every leader must read the first leader's clock
//!   (cluster time, D47) and measure the other nodes' clocks as set; the checks are those
//!   above, on cluster time.
//! - A configuration put during a leader change: `allot config put` whose answer is lost to a
//!   SIGKILL of the leader (after the commit, and as the request arrives) lands exactly once
//!   (one version each, every agent on it) or fails with a clear error and a retry lands.

mod support;

#[path = "support/loaded.rs"]
mod loaded;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use allot_core::rebalance::CLOCK_FRAME_INTERVAL;
use loaded::{
    Cluster, LIMITS, Load, Phase, REGIONS, WINDOW_MS, at_next_window, check, report, try_json,
    unix_ms, windows,
};
use serde_json::Value;
use support::{PATIENCE, Process, eventually, slow_tier};

/// What the issue promises: a new leader's rebalancer commits a round within this of its
/// election.
const RESUME_WITHIN: Duration = Duration::from_secs(3);

/// The two tests run one at a time: each runs six daemons on 2 cores, and the windows are sized
/// to the elections of a machine running one of them.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One kill's figures.
#[derive(Debug)]
struct Handover {
    killed: u64,
    /// Time into its window the kill came.
    into_window_ms: u64,
    elected_after: Duration,
    /// From the election to the new leader's first committed round with table commands.
    resumed_after_election: Duration,
    new_leader: u64,
}

/// Waits for a leader other than `killed`, then for its first committed rebalancing round.
async fn handover(cluster: &Cluster, killed: u64, killed_at: Instant, into_ms: u64) -> Handover {
    let (new_leader, _) = eventually(
        "a new leader",
        || cluster.leader(Some(killed)),
        Option::is_some,
    )
    .await
    .expect("checked");
    let elected = Instant::now();
    let node = &cluster.running[&new_leader];
    eventually(
        "the new leader commits a rebalancing round",
        || node.metric("allot_coordinator_round_commands_total"),
        |n| *n > 0.0,
    )
    .await;
    Handover {
        killed,
        into_window_ms: into_ms,
        elected_after: elected - killed_at,
        resumed_after_election: elected.elapsed(),
        new_leader,
    }
}

/// The three nodes (`cluster` as started) and an agent per region, every agent synced with
/// the first leader, which is returned.
async fn with_agents(cluster: &Cluster, dir: &Path) -> (BTreeMap<&'static str, Process>, u64) {
    let agents: BTreeMap<&str, Process> = REGIONS
        .iter()
        .map(|r| (*r, Process::agent(dir, r, Some(&cluster.grpc_list()))))
        .collect();
    let (first, _) = eventually("a leader", || cluster.leader(None), Option::is_some)
        .await
        .expect("checked");
    for agent in agents.values() {
        agent.synced().await;
    }
    (agents, first)
}

/// Stops the load and judges every window (`check`), no failed call, and each handover's
/// resumption.
async fn judge(load: Load, handovers: &[Handover]) {
    let (watched, ledger) = load.stop().await;
    let watched = watched.lock().expect("watched");
    let ledger = ledger.lock().expect("ledger");
    let rows = windows(&watched, &ledger);
    report(&rows);
    report_handovers(handovers);
    assert!(
        ledger.errors.is_empty(),
        "failed calls: {:?}",
        ledger.errors
    );
    check(&rows, &Default::default());
    for h in handovers {
        assert!(
            h.resumed_after_election <= RESUME_WITHIN,
            "rebalancing resumed {:?} after the election of node {} (promised: {RESUME_WITHIN:?})",
            h.resumed_after_election,
            h.new_leader
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_keeps_every_window_within_its_bound_and_rebalancing_resumes() {
    if !slow_tier() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = support::scratch("leader_kill", "under_load", Some(LIMITS));
    let mut cluster = Cluster::start(&dir);
    let (agents, first) = with_agents(&cluster, &dir).await;

    // The watcher and the load, from here to the end.
    let load = Load::start(&cluster, &agents, "a");
    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;

    // Demand moves to b; the leader is killed in the middle of the next window.
    load.phase.send_replace(Phase::Hot("b"));
    at_next_window(WINDOW_MS / 2).await;
    let into_ms = unix_ms() % WINDOW_MS;
    let killed_at = cluster.kill(first);
    let one = handover(&cluster, first, killed_at, into_ms).await;
    eprintln!("{one:?}");

    // The killed node comes back from its directory and follows.
    cluster.restart(first);
    let second = one.new_leader;
    let back = &cluster.running[&first];
    eventually(
        "the restarted node follows the new leader",
        || try_json(&back.http, "/v1/status"),
        |s| s.as_ref().is_some_and(|s| s["leader"] == second),
    )
    .await;

    // Demand moves to c; the new leader is killed just after one of its rounds, early in a
    // window (so that the next leader is elected inside it).
    load.phase.send_replace(Phase::Hot("c"));
    at_next_window(200).await;
    let node = &cluster.running[&second];
    let rounds = node.metric("allot_coordinator_rounds_total");
    let deadline = Instant::now() + PATIENCE;
    while node.metric("allot_coordinator_rounds_total") <= rounds {
        assert!(Instant::now() < deadline, "no round");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let into_ms = unix_ms() % WINDOW_MS;
    let killed_at = cluster.kill(second);
    let two = handover(&cluster, second, killed_at, into_ms).await;
    eprintln!("{two:?}");

    // A window more of load under the third leader, then everything stops; the watcher reads
    // on to the end of the last window with load.
    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;
    judge(load, &[one, two]).await;
}

/// Nodes 2 and 3's wall clocks, off the machine's (the agents', node 1's) by windows either
/// way: every handover in the test below involves clocks that differ by more than a window.
/// Whole windows, so that the test can translate the cluster's window indices to the
/// machine's (`Watched::cluster_ahead_ms`); the product does not care.
const NODE_CLOCK_OFFSETS_SECS: [(u64, i64); 2] = [(2, 24), (3, -12)];

/// How far a leader's probe of a node's clock, or its reading of cluster time, may be from
/// what the test set: loopback round trips are well under this, but a 2-core machine running
/// six daemons is slow to answer.
const CLOCK_TOLERANCE: Duration = Duration::from_millis(500);

/// The offset the test set for `node`'s wall clock, in milliseconds.
fn set_offset_ms(node: u64) -> i64 {
    let secs = NODE_CLOCK_OFFSETS_SECS
        .iter()
        .find(|(n, _)| *n == node)
        .map_or(0, |(_, s)| *s);
    secs * 1_000
}

fn tolerance_ms() -> i64 {
    i64::try_from(CLOCK_TOLERANCE.as_millis()).expect("small")
}

/// Waits until `leader` has probed every other running node, then checks that it leads on
/// cluster time (`ahead_ms` ahead of the machine's clock: its own wall clock plus its offset)
/// and that each node's measured clock is its set offset against that.
async fn leader_keeps_cluster_time(cluster: &Cluster, leader: u64, ahead_ms: i64) {
    let http = cluster.running[&leader].http.clone();
    let others: Vec<u64> = cluster
        .running
        .keys()
        .copied()
        .filter(|n| *n != leader)
        .collect();
    let measured = |status: &Value| -> BTreeMap<u64, i64> {
        let clocks = status["node_clocks"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        clocks
            .iter()
            .filter_map(|c| {
                let nanos = c["sample"]["offset_nanos"].as_i64()?;
                Some((c["node"].as_u64()?, nanos / 1_000_000))
            })
            .collect()
    };
    let status = eventually(
        "the leader's samples of every other node's clock",
        || try_json(&http, "/v1/status"),
        |s| {
            s.as_ref()
                .is_some_and(|s| others.iter().all(|n| measured(s).contains_key(n)))
        },
    )
    .await
    .expect("checked");
    // Cluster time outlives this leader only once a frame of its own holds every node.
    let running: Vec<u64> = cluster.running.keys().copied().collect();
    eventually(
        "a clock frame of the leader's holding every running node",
        || try_json(&http, "/v1/status"),
        |s| {
            s.as_ref().is_some_and(|s| {
                let frame = &s["clock_frame"];
                let nodes: Vec<u64> = frame["nodes"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                frame["recorded_by"].as_u64() == Some(leader)
                    && running.iter().all(|n| nodes.contains(n))
            })
        },
    )
    .await
    .expect("checked");
    let offset_ms = status["cluster_clock_offset_nanos"]
        .as_i64()
        .expect("the leader's cluster clock offset")
        / 1_000_000;
    let metric_s =
        cluster.running[&leader].metric("allot_coordinator_cluster_clock_offset_seconds");
    assert!(
        (metric_s * 1e3 - offset_ms as f64).abs() <= 1.0,
        "leader {leader}'s cluster clock gauge {metric_s} s, its status {offset_ms} ms"
    );
    let reads_ms = set_offset_ms(leader) + offset_ms;
    assert!(
        (reads_ms - ahead_ms).abs() <= tolerance_ms(),
        "leader {leader} reads cluster time {reads_ms} ms ahead of the machine's clock; the \
         cluster's is {ahead_ms} ms"
    );
    for (node, offset) in measured(&status) {
        let set = set_offset_ms(node) - ahead_ms;
        assert!(
            (offset - set).abs() <= tolerance_ms(),
            "leader {leader} measured node {node}'s clock {offset} ms off cluster time; the \
             test set {set} ms"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_on_clocks_windows_apart_keep_one_cluster_time_and_every_window_within_its_bound() {
    if !slow_tier() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = support::scratch("leader_kill", "skewed_clocks", Some(LIMITS));
    let mut cluster = Cluster::start_with_clocks(&dir, NODE_CLOCK_OFFSETS_SECS.into());
    let (agents, first) = with_agents(&cluster, &dir).await;
    // Cluster time is the first leader's clock, for good.
    let ahead_ms = set_offset_ms(first);
    leader_keeps_cluster_time(&cluster, first, ahead_ms).await;
    agents_reach_cluster_time(ahead_ms).await;

    let load = Load::start(&cluster, &agents, "a");
    load.watched.lock().expect("watched").cluster_ahead_ms = ahead_ms;
    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;

    // Two handovers, demand moving each time, the kills in the middle of a window: consecutive
    // leaders differ, and only node 1 runs on the machine's clock, so each handover moves
    // the lead between clocks at least a window apart.
    let mut handovers = Vec::new();
    let mut leader = first;
    for hot in ["b", "c"] {
        load.phase.send_replace(Phase::Hot(hot));
        at_next_window(WINDOW_MS / 2).await;
        let into_ms = unix_ms() % WINDOW_MS;
        let killed_at = cluster.kill(leader);
        let h = handover(&cluster, leader, killed_at, into_ms).await;
        eprintln!("{h:?}");
        cluster.restart(leader);
        leader = h.new_leader;
        leader_keeps_cluster_time(&cluster, leader, ahead_ms).await;
        handovers.push(h);
    }

    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;
    judge(load, &handovers).await;
}

/// The agents run on the machine's clock. When cluster time is behind it (the first leader
/// is node 3, 12 s behind: a whole window), their first sample is a backward correction,
/// which the timebase slews at `1 / SLEW_DIVISOR` of the clock's speed rather than stand the
/// clock still (D22): until then they read windows ahead of cluster time, and count a
/// window's units in the next one. Judging starts once every agent has caught up (this test
/// failed whenever node 3 led first, the load's first window judged mid-slew).
async fn agents_reach_cluster_time(ahead_ms: i64) {
    let Ok(behind_ms) = u64::try_from(-ahead_ms) else {
        return;
    };
    let divisor = u64::from(allot_core::budget::timebase::SLEW_DIVISOR);
    let slew_ms = behind_ms * divisor / divisor.saturating_sub(1).max(1);
    // A sync interval or two for the first sample to be taken.
    tokio::time::sleep(Duration::from_millis(slew_ms + 2_000)).await;
}

/// Attempts at making a node absent from the last clock frame win the next election.
const ABSENT_LEADER_ATTEMPTS: u32 = 4;

/// Sends `signal` to a node's process (SIGSTOP / SIGCONT: a node paused, then resumed).
fn signal_node(cluster: &Cluster, id: u64, signal: libc::c_int) {
    let pid = i32::try_from(cluster.running[&id].child.id()).expect("a pid");
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// The index a node's status says it has in its log.
fn last_log_index(cluster: &Cluster, id: u64) -> Option<u64> {
    try_json(&cluster.running[&id].http, "/v1/status")?["last_log_index"].as_u64()
}

/// One attempt: `absent` (a follower) goes down, and the leader too, so that the next leader
/// is elected, and records its first clock frame, without ever having probed `absent` (a
/// leader's frames carry the last probe of every node it has sampled, however old). `absent`
/// then comes back and catches up, and that leader is killed while the third node is paused:
/// `absent`, standing for election again and again, is most likely the one elected. Returns
/// the new leader and its status; every node runs again at the end.
async fn elect_a_node_absent_from_the_frame(cluster: &mut Cluster, absent: u64) -> (u64, Value) {
    let (first, _) = cluster.leader(None).expect("a leader");
    cluster.kill(absent);
    cluster.kill(first);
    cluster.restart(first);
    let (recorder, _) = eventually(
        "a leader without it",
        || cluster.leader(None),
        Option::is_some,
    )
    .await
    .expect("checked");
    tokio::time::sleep(CLOCK_FRAME_INTERVAL + Duration::from_secs(1)).await;
    cluster.restart(absent);
    eventually(
        "the restarted node catches up with the log",
        || {
            (
                last_log_index(cluster, absent),
                last_log_index(cluster, recorder),
            )
        },
        |(a, l)| a.is_some() && a >= l,
    )
    .await;
    let paused = (1..=3)
        .find(|n| *n != recorder && *n != absent)
        .expect("a third node");
    signal_node(cluster, paused, libc::SIGSTOP);
    cluster.kill(recorder);
    // Past the lease and a few election timeouts: the restarted node stands again and again,
    // its term climbing past the paused node's.
    tokio::time::sleep(Duration::from_secs(7)).await;
    signal_node(cluster, paused, libc::SIGCONT);
    let elected = eventually("a new leader", || cluster.leader(None), Option::is_some)
        .await
        .expect("checked");
    cluster.restart(recorder);
    elected
}

/// Written to break D47: a node that was not in the last clock frame (down through the whole
/// term of the leader that recorded it) wins the next election. Before D50 it led on its own wall clock, windows off
/// cluster time; now it reads cluster time through its probe of a node in the frame
/// (`/v1/status` `cluster_clock_via`), and keeps it. Nodes 2 and 3 run on clocks windows away
/// from node 1's. The election is steered, not forced: the attempt is repeated until the
/// absent node leads and says it read cluster time through another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_absent_from_the_last_clock_frame_keeps_cluster_time() {
    if !slow_tier() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = support::scratch("leader_kill", "absent_from_frame", Some(LIMITS));
    let mut cluster = Cluster::start_with_clocks(&dir, NODE_CLOCK_OFFSETS_SECS.into());
    let (first, _) = eventually("a leader", || cluster.leader(None), Option::is_some)
        .await
        .expect("checked");
    let ahead_ms = set_offset_ms(first);
    leader_keeps_cluster_time(&cluster, first, ahead_ms).await;
    let mut bridged = Vec::new();
    for attempt in 1..=ABSENT_LEADER_ATTEMPTS {
        // Between two reads the cluster may be electing (a node just restarted): wait for one.
        let (leader, _) = eventually("a leader", || cluster.leader(None), Option::is_some)
            .await
            .expect("checked");
        // A follower whose clock is not cluster time (one of the two is not the first
        // leader's node): leading on its own clock would show.
        let absent = (1..=3)
            .find(|n| *n != leader && set_offset_ms(*n) != ahead_ms)
            .expect("a follower off cluster time");
        let (elected, status) = elect_a_node_absent_from_the_frame(&mut cluster, absent).await;
        let via = status["cluster_clock_via"].as_u64();
        eprintln!(
            "attempt {attempt}: node {absent} absent from the frame, node {elected} elected, via {via:?}"
        );
        leader_keeps_cluster_time(&cluster, elected, ahead_ms).await;
        if elected == absent && via.is_some() {
            bridged.push((absent, via));
            break;
        }
    }
    assert!(
        !bridged.is_empty(),
        "in {ABSENT_LEADER_ATTEMPTS} attempts no node absent from the last clock frame led"
    );
}

/// The handovers' figures, after the per-window table.
fn report_handovers(handovers: &[Handover]) {
    for h in handovers {
        eprintln!(
            "node {} killed {} ms into its window: node {} elected after {:?}, its first round \
             committed {:?} after its election",
            h.killed, h.into_window_ms, h.new_leader, h.elected_after, h.resumed_after_election
        );
    }
}

/// When the relay in front of the leader's admin HTTP kills the leader.
#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// As the put's request reaches the leader: it may or may not commit.
    Request,
    /// As the leader's answer comes back: the put committed, and its answer is lost.
    Answer,
}

/// One HTTP request from `from`: its head and the body its `Content-Length` names.
fn read_request(from: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return buf;
            }
        }
        let n = from.read(&mut chunk).expect("the request");
        assert!(n > 0, "the client closed before its request was whole");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A relay to `target` for one connection: it forwards the request and SIGKILLs `pid` when
/// `at` says, then drops both connections (the client never hears an answer) and stops
/// listening.
fn kill_relay(target: String, pid: u32, at: KillAt) -> (String, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let relay = std::thread::spawn(move || {
        let (mut client, _) = listener.accept().expect("the put's connection");
        let request = read_request(&mut client);
        let mut up = TcpStream::connect(&target).expect("the leader's admin HTTP");
        up.write_all(&request).expect("forward");
        if let KillAt::Answer = at {
            let mut first = [0u8; 1];
            up.set_read_timeout(Some(PATIENCE)).expect("timeout");
            assert_eq!(up.read(&mut first).expect("the leader answers"), 1);
        }
        let pid = i32::try_from(pid).expect("a pid");
        // SAFETY: kill(2) on the child this test started and has not reaped yet (the
        // test's `Process` reaps it after this thread has ended).
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    });
    (addr, relay)
}

/// Region `a` holding 20% of a strict day limit of `quota` (each put changes the quota).
fn put_limits(quota: u64) -> String {
    format!(
        "domain: bench\ndescriptors:\n  - key: key\n    rate_limit: {{unit: day, requests_per_unit: {quota}}}\n    allot: {{weights: {{a: 0.2, b: 0.2, c: 0.2}}}}\n"
    )
}

fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .output()
        .expect("allot runs")
}

/// The version a successful `allot config put` printed.
fn put_version(out: &Output) -> Option<u64> {
    let text = String::from_utf8_lossy(&out.stdout);
    text.strip_prefix("version ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_put_during_a_leader_kill_lands_exactly_once_on_every_agent() {
    if !slow_tier() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    support::clear_of_the_day_boundary().await;
    let dir = support::scratch("leader_kill", "config_put", None);
    std::fs::write(dir.join("limits.yaml"), put_limits(1_000)).expect("limits");
    let mut cluster = Cluster::start(&dir);
    let agents: Vec<Process> = REGIONS
        .iter()
        .map(|r| Process::agent(&dir, r, Some(&cluster.grpc_list())))
        .collect();
    let mut version = 1;
    for (round, at) in [KillAt::Answer, KillAt::Request].into_iter().enumerate() {
        let (leader, _) = eventually("a leader", || cluster.leader(None), Option::is_some)
            .await
            .expect("checked");
        for agent in &agents {
            eventually(
                "the agent syncs at the version in force",
                || agent.json("/v1/status"),
                |s| s["sync"]["connected"] == true && s["config_version"] == version,
            )
            .await;
        }
        let quota = 900 - 100 * round as u64;
        let file = dir.join(format!("put-{round}.yaml"));
        std::fs::write(&file, put_limits(quota)).expect("limits");
        let file = file.display().to_string();
        let node = &cluster.nodes[leader as usize - 1];
        let (relay, relay_done) =
            kill_relay(node.http.clone(), cluster.running[&leader].child.id(), at);
        // The leader (through the relay) first, then the others.
        let mut nodes = vec![relay];
        nodes.extend(
            cluster
                .nodes
                .iter()
                .filter(|n| n.id != leader)
                .map(|n| n.http.clone()),
        );
        let nodes = nodes.join(",");
        let put = {
            let (file, nodes) = (file.clone(), nodes.clone());
            tokio::task::spawn_blocking(move || {
                allot(&["config", "put", &file, "--coordinator", &nodes])
            })
        };
        relay_done.join().expect("the relay");
        cluster.kill(leader);
        let out = put.await.expect("the put");
        eprintln!("round {round} ({at:?}): {out:?}");
        let landed = if out.status.success() {
            put_version(&out)
        } else {
            // A clear error, then a retry lands.
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("config put: no node took it"), "{out:?}");
            eventually("a new leader", || cluster.leader(None), Option::is_some).await;
            let retry = allot(&["config", "put", &file, "--coordinator", &nodes]);
            eprintln!("round {round}: retry {retry:?}");
            assert!(retry.status.success(), "{retry:?}");
            put_version(&retry)
        };
        // Exactly once: the next version, no other.
        version += 1;
        assert_eq!(landed, Some(version), "{out:?}");
        let (_, status) = eventually("a leader", || cluster.leader(None), Option::is_some)
            .await
            .expect("checked");
        let leader_http = &cluster.nodes[status["node"].as_u64().expect("id") as usize - 1].http;
        let config = try_json(leader_http, "/v1/config").expect("the configuration");
        assert_eq!(config["version"], version, "{config}");
        let text = config["files"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.contains(&format!("requests_per_unit: {quota}")),
            "{config}"
        );
        for agent in &agents {
            eventually(
                "the agent takes the version put",
                || agent.json("/v1/status")["config_version"].clone(),
                |v| *v == version,
            )
            .await;
            let key = agent.json("/v1/keys?domain=bench&descriptor=key=k0");
            assert_eq!(key["quota_units"], quota, "{key}");
        }
        // The killed node comes back from its directory at the same version.
        cluster.restart(leader);
        let back = &cluster.running[&leader];
        eventually(
            "the restarted node holds the version put",
            || try_json(&back.http, "/v1/status").map(|s| s["config_version"].clone()),
            |v| *v == Some(Value::from(version)),
        )
        .await;
    }
}
