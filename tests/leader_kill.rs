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
//! - A configuration put during a leader change: `allot config put` whose answer is lost to a
//!   SIGKILL of the leader (after the commit, and as the request arrives) lands exactly once
//!   (one version each, every agent on it) or fails with a clear error and a retry lands.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use allot_bench::loadgen::{LoadConfig, run_load};
use allot_bench::workload::Workload;
use serde_json::Value;
use support::{PATIENCE, Process, eventually, free_port, slow_tier};

/// 12 s windows: a leader killed in a window's middle is replaced before the window ends, so
/// that the new leader states it (a window whose end no leader watched has no bound:
/// docs/bound.md). With an election timeout of 1-2 s, a new leader took 3.3-4.4 s on this
/// 2-core machine, loaded: 5 s and 8 s windows killed in their middle were left without a
/// bound, and 10 s windows left 0.6 s to spare.
const WINDOW_MS: u64 = 12_000;
const QUOTA_UNITS: u64 = 3_000;
/// Each region's default share is 20% of the quota, 40% left to the rebalancer. `k0` is the
/// strict limit, `k1` the eventual one: the load generator's callers alternate
/// between the two keys.
const LIMITS: &str = "\
domain: bench
descriptors:
  - key: key
    value: k0
    rate_limit: {requests_per_unit: 3000}
    allot: {window: 12s, weights: {a: 0.2, b: 0.2, c: 0.2}}
  - key: key
    value: k1
    rate_limit: {requests_per_unit: 3000}
    allot: {window: 12s, consistency: eventual, weights: {a: 0.2, b: 0.2, c: 0.2}}
";
const STRICT_KEY: &str = "k0";
const KEYS: [&str; 2] = ["k0", "k1"];
const REGIONS: [&str; 3] = ["a", "b", "c"];

/// Callers of the load generator in a region with demand, and in one without: a closed loop
/// each, so a hot region asks for several times its share.
const HOT_CALLERS: u32 = 4;
const COOL_CALLERS: u32 = 1;
/// Each run of the load generator: the demand follows the phase within this.
const LOAD_CHUNK: Duration = Duration::from_secs(1);
/// How often the watcher reads the nodes' status and the agents' counters.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// What the issue promises: a new leader's rebalancer commits a round within this of its
/// election.
const RESUME_WITHIN: Duration = Duration::from_secs(3);

/// The two tests run one at a time: each runs six daemons on 2 cores, and the windows are sized
/// to the elections of a machine running one of them.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    since.as_millis() as u64
}

fn window_end_ms(window: u64) -> u64 {
    (window + 1) * WINDOW_MS
}

/// `GET path` on `addr`, or `None` when the process is not there or does not answer 200.
fn try_json(addr: &str, path: &str) -> Option<Value> {
    let sock: SocketAddr = addr.parse().ok()?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    if !resp.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(resp.split_once("\r\n\r\n")?.1).ok()
}

/// One `allot coordinator` process of the three, by its fixed addresses.
#[derive(Clone)]
struct Node {
    id: u64,
    grpc: String,
    http: String,
}

struct Cluster {
    dir: std::path::PathBuf,
    nodes: Vec<Node>,
    peers: String,
    running: BTreeMap<u64, Process>,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let nodes: Vec<Node> = (1..=3)
            .map(|id| Node {
                id,
                grpc: format!("127.0.0.1:{}", free_port()),
                http: format!("127.0.0.1:{}", free_port()),
            })
            .collect();
        let peers: Vec<String> = nodes
            .iter()
            .map(|n| format!("{}={}", n.id, n.grpc))
            .collect();
        let mut c = Cluster {
            dir: dir.to_owned(),
            nodes,
            peers: peers.join(","),
            running: BTreeMap::new(),
        };
        for id in 1..=3 {
            c.restart(id);
        }
        c
    }

    /// Starts node `id` from its directory (a first start, or after a kill).
    fn restart(&mut self, id: u64) {
        let node = &self.nodes[id as usize - 1];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.arg("coordinator")
            .args(["--id", &id.to_string(), "--peers", &self.peers])
            .args(["--grpc", &node.grpc, "--http", &node.http])
            .arg("--data")
            .arg(self.dir.join(format!("node-{id}")))
            .arg("--limits")
            .arg(self.dir.join("limits.yaml"));
        self.running.insert(id, Process::start(cmd, "coordinator"));
    }

    /// SIGKILL (the process's drop kills it and reaps it).
    fn kill(&mut self, id: u64) -> Instant {
        drop(self.running.remove(&id).expect("a running node"));
        Instant::now()
    }

    fn grpc_list(&self) -> String {
        let all: Vec<&str> = self.nodes.iter().map(|n| n.grpc.as_str()).collect();
        all.join(",")
    }

    /// A running node that says it leads, other than `not`, with its status.
    fn leader(&self, not: Option<u64>) -> Option<(u64, Value)> {
        self.running
            .iter()
            .filter(|(id, _)| Some(**id) != not)
            .find_map(|(id, p)| {
                let s = try_json(&p.http, "/v1/status")?;
                (s["state"] == "leader").then_some((*id, s))
            })
    }
}

/// Which region has demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Hot(&'static str),
    Stop,
}

/// What the load generator recorded: requests admitted per (region, key, window), by the
/// window each decision named, and failed calls.
#[derive(Default)]
struct Ledger {
    admitted: BTreeMap<(String, String, u64), u64>,
    errors: BTreeMap<String, u64>,
}

/// One region's load: runs of the load generator of `LOAD_CHUNK` each, with the callers its
/// demand asks for, until `Phase::Stop`.
async fn drive(
    addr: SocketAddr,
    region: &'static str,
    phase: tokio::sync::watch::Receiver<Phase>,
    ledger: Arc<Mutex<Ledger>>,
) {
    loop {
        let callers = match *phase.borrow() {
            Phase::Stop => return,
            Phase::Hot(r) if r == region => HOT_CALLERS,
            Phase::Hot(_) => COOL_CALLERS,
        };
        let mut config = LoadConfig::new(Workload::Acquire, addr, callers);
        config.keys = KEYS.len() as u32;
        config.warmup = Duration::ZERO;
        config.duration = LOAD_CHUNK;
        config.window = Some(Duration::from_millis(WINDOW_MS));
        let report = run_load(&config).await.expect("the load generator runs");
        let mut l = ledger.lock().expect("ledger");
        for row in report.admitted_by_window {
            *l.admitted
                .entry((region.to_owned(), row.key, row.window))
                .or_default() += row.admitted;
        }
        assert_eq!(report.window_rows_left_out, 0);
        for (kind, n) in report.errors {
            *l.errors.entry(kind).or_default() += n;
        }
    }
}

/// One leader's statement of a window's bound: the largest total it stated, and any reason
/// it gave for stating none.
#[derive(Clone, Debug, Default)]
struct Stated {
    total_units: u64,
    unbounded: Option<String>,
}

/// What the watcher read: bounds per (key, window) by the leader (node, term) that stated
/// them, when each leader was last seen leading, and the agents' own counters per (region,
/// key, window): the largest `granted_units` their `/v1/keys` showed.
#[derive(Default)]
struct Watched {
    bounds: BTreeMap<(String, u64), BTreeMap<(u64, u64), Stated>>,
    leading_until_ms: BTreeMap<(u64, u64), u64>,
    agent_granted: BTreeMap<(String, String, u64), u64>,
}

impl Watched {
    /// The bound stated for `window` by the leaders that were still leading at its end (a
    /// leader killed inside the window did not watch its end, and what it stated does not
    /// cover it: docs/bound.md, "Windows without a leader"). `Err` says why there is none.
    fn bound(&self, key: &str, window: u64) -> Result<u64, String> {
        let Some(by_leader) = self.bounds.get(&(key.to_owned(), window)) else {
            return Err("no leader stated a bound for it".to_owned());
        };
        let watched_end: Vec<&Stated> = by_leader
            .iter()
            .filter(|(leader, _)| self.leading_until_ms[leader] >= window_end_ms(window))
            .map(|(_, s)| s)
            .collect();
        if watched_end.is_empty() {
            return Err(format!(
                "only leaders killed before its end stated it: {by_leader:?}"
            ));
        }
        if let Some(why) = watched_end.iter().find_map(|s| s.unbounded.clone()) {
            return Err(format!("stated unbounded: {why}"));
        }
        Ok(watched_end.iter().map(|s| s.total_units).max().unwrap_or(0))
    }
}

/// Reads every node's `/v1/status` and every agent's counters each `WATCH_EVERY` until `stop`.
fn watch(
    nodes: Vec<(u64, String)>,
    agents: Vec<(&'static str, String)>,
    stop: Arc<AtomicBool>,
    watched: Arc<Mutex<Watched>>,
) {
    while !stop.load(Ordering::Relaxed) {
        for (id, http) in &nodes {
            let Some(s) = try_json(http, "/v1/status") else {
                continue;
            };
            let (Some(term), true) = (s["term"].as_u64(), s["state"] == "leader") else {
                continue;
            };
            let now_ms = unix_ms();
            let mut w = watched.lock().expect("watched");
            w.leading_until_ms.insert((*id, term), now_ms);
            for l in s["limits"].as_array().into_iter().flatten() {
                let bound = &l["bound"];
                let (Some(key), Some(window)) = (
                    l["limit"]
                        .as_str()
                        .and_then(|id| id.strip_prefix("bench/key=")),
                    bound["window"].as_u64(),
                ) else {
                    continue;
                };
                let stated = w
                    .bounds
                    .entry((key.to_owned(), window))
                    .or_default()
                    .entry((*id, term))
                    .or_default();
                stated.total_units = stated
                    .total_units
                    .max(bound["total_units"].as_u64().unwrap_or(0));
                if let Some(why) = bound["unbounded"].as_str() {
                    stated.unbounded = Some(why.to_owned());
                }
            }
        }
        for (region, http) in &agents {
            for key in KEYS {
                let path = format!("/v1/keys?domain=bench&descriptor=key={key}");
                let Some(k) = try_json(http, &path) else {
                    continue;
                };
                let (Some(window), Some(granted)) =
                    (k["window"].as_u64(), k["granted_units"].as_u64())
                else {
                    continue;
                };
                let mut w = watched.lock().expect("watched");
                let seen = w
                    .agent_granted
                    .entry((region.to_string(), key.to_owned(), window))
                    .or_default();
                *seen = (*seen).max(granted);
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

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

/// Sleeps until `into_ms` into the next window; returns that window.
async fn at_next_window(into_ms: u64) -> u64 {
    let now = unix_ms();
    let window = now / WINDOW_MS + 1;
    let at = window * WINDOW_MS + into_ms;
    tokio::time::sleep(Duration::from_millis(at - now)).await;
    window
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_keeps_every_window_within_its_bound_and_rebalancing_resumes() {
    if !slow_tier() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = support::scratch("leader_kill", "under_load", Some(LIMITS));
    let mut cluster = Cluster::start(&dir);
    let agents: BTreeMap<&str, Process> = REGIONS
        .iter()
        .map(|r| (*r, Process::agent(&dir, r, Some(&cluster.grpc_list()))))
        .collect();
    let (first, _) = eventually("a leader", || cluster.leader(None), Option::is_some)
        .await
        .expect("checked");
    for agent in agents.values() {
        agent.synced().await;
    }

    // The watcher and the load, from here to the end.
    let watched = Arc::new(Mutex::new(Watched::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let nodes = cluster
            .nodes
            .iter()
            .map(|n| (n.id, n.http.clone()))
            .collect();
        let agents = agents.iter().map(|(r, p)| (*r, p.http.clone())).collect();
        let (stop, watched) = (stop.clone(), watched.clone());
        std::thread::spawn(move || watch(nodes, agents, stop, watched))
    };
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(Phase::Hot("a"));
    let mut load = tokio::task::JoinSet::new();
    for (region, agent) in &agents {
        let addr: SocketAddr = agent.grpc.parse().expect("the agent's address");
        load.spawn(drive(addr, region, phase_rx.clone(), ledger.clone()));
    }
    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;

    // Demand moves to b; the leader is killed in the middle of the next window.
    phase_tx.send_replace(Phase::Hot("b"));
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
    phase_tx.send_replace(Phase::Hot("c"));
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
    phase_tx.send_replace(Phase::Stop);
    while let Some(done) = load.join_next().await {
        done.expect("a region's load");
    }
    let last = unix_ms() / WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(window_end_ms(last) - unix_ms() + 500)).await;
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("the watcher");

    let watched = watched.lock().expect("watched");
    let ledger = ledger.lock().expect("ledger");
    let rows = windows(&watched, &ledger);
    report(&rows, &[&one, &two]);
    assert!(
        ledger.errors.is_empty(),
        "failed calls: {:?}",
        ledger.errors
    );
    check(&rows);
    for h in [&one, &two] {
        assert!(
            h.resumed_after_election <= RESUME_WITHIN,
            "rebalancing resumed {:?} after the election of node {} (promised: {RESUME_WITHIN:?})",
            h.resumed_after_election,
            h.new_leader
        );
    }
}

/// One window of one limit, as the check and the table read it.
struct Row {
    key: String,
    window: u64,
    /// Per region: (what the load generator saw admitted, the largest count the agent showed).
    by_region: BTreeMap<String, (u64, u64)>,
    bound: Result<u64, String>,
}

impl Row {
    /// The units admitted across regions: per region the larger of the two records (the
    /// agent's is sampled every `WATCH_EVERY` and may miss a window's last calls; the load
    /// generator's counts every allowed answer, by the window the agent's decision named).
    fn admitted(&self) -> u64 {
        self.by_region.values().map(|(l, a)| (*l).max(*a)).sum()
    }
}

fn windows(watched: &Watched, ledger: &Ledger) -> Vec<Row> {
    let mut rows: BTreeMap<(String, u64), Row> = BTreeMap::new();
    let load = ledger.admitted.iter().map(|(at, n)| (at, *n, 0));
    let agents = watched.agent_granted.iter().map(|(at, n)| (at, 0, *n));
    for ((region, key, window), seen, counted) in load.chain(agents) {
        if seen + counted == 0 {
            continue;
        }
        let row = rows
            .entry((key.clone(), *window))
            .or_insert_with(|| Row {
                key: key.clone(),
                window: *window,
                by_region: BTreeMap::new(),
                bound: watched.bound(key, *window),
            })
            .by_region
            .entry(region.clone())
            .or_default();
        row.0 += seen;
        row.1 += counted;
    }
    rows.into_values().collect()
}

/// Every window with admissions: a bound stated by a leader that watched its end, admitted
/// at most the quota plus it (strict: at most the quota, on the regions' window indices),
/// and the agents' counters no higher than what the load generator saw admitted.
fn check(rows: &[Row]) {
    let mut failures = Vec::new();
    for r in rows {
        let admitted = r.admitted();
        let name = format!("{} window {}", r.key, r.window);
        for (region, (seen, counted)) in &r.by_region {
            if counted > seen {
                failures.push(format!(
                    "{name}: {region}'s agent counted {counted}, the load saw {seen} admitted"
                ));
            }
        }
        match &r.bound {
            Err(why) => failures.push(format!("{name}: {why}")),
            Ok(bound) if admitted > QUOTA_UNITS + bound => failures.push(format!(
                "{name}: admitted {admitted} > quota {QUOTA_UNITS} + bound {bound}"
            )),
            Ok(_) => {}
        }
        if r.key == STRICT_KEY && admitted > QUOTA_UNITS {
            failures.push(format!(
                "{name} (strict): admitted {admitted} > quota {QUOTA_UNITS}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The per-window table the docs quote, and the handovers.
fn report(rows: &[Row], handovers: &[&Handover]) {
    eprintln!("| limit | window | admitted | a / b / c (load; agent) | quota | bound |");
    eprintln!("|---|---|---|---|---|---|");
    for r in rows {
        let regions: Vec<String> = REGIONS
            .iter()
            .map(|g| {
                let (l, a) = r.by_region.get(*g).copied().unwrap_or_default();
                format!("{l}; {a}")
            })
            .collect();
        let mode = if r.key == STRICT_KEY {
            "strict"
        } else {
            "eventual"
        };
        let bound = match &r.bound {
            Ok(b) => b.to_string(),
            Err(why) => format!("none ({why})"),
        };
        eprintln!(
            "| {mode} | {} | {} | {} | {QUOTA_UNITS} | {bound} |",
            r.window,
            r.admitted(),
            regions.join(" / ")
        );
    }
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
