//! What the tests that run three `allot coordinator` processes and three agents under the
//! bench load generator share (`tests/leader_kill.rs`, `tests/cluster_restart.rs`): the
//! limits, the cluster of processes, the load, the watcher that reads every node and agent,
//! and the per-window judgement against the quota and the bound the leaders stated.

// Not every test crate that includes this module uses every helper.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use allot_bench::loadgen::{LoadConfig, run_load};
use allot_bench::workload::Workload;
use serde_json::Value;

use crate::support::{Process, free_port};

/// 12 s windows: a leader killed in a window's middle is replaced before the window ends, so
/// that the new leader states it (a window whose end no leader watched has no bound:
/// docs/bound.md). With an election timeout of 1-2 s, a new leader took 3.3-4.4 s on this
/// 2-core machine, loaded: 5 s and 8 s windows killed in their middle were left without a
/// bound, and 10 s windows left 0.6 s to spare.
pub const WINDOW_MS: u64 = 12_000;
pub const QUOTA_UNITS: u64 = 3_000;
/// A region's default share of either limit (20%): what it holds of a counter with no row.
pub const DEFAULT_SHARE_UNITS: u64 = 600;
/// Each region's default share is 20% of the quota, 40% left to the rebalancer. `k0` is the
/// strict limit, `k1` the eventual one: the load generator's callers alternate
/// between the two keys.
pub const LIMITS: &str = "\
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
pub const STRICT_KEY: &str = "k0";
pub const KEYS: [&str; 2] = ["k0", "k1"];
pub const REGIONS: [&str; 3] = ["a", "b", "c"];

/// Callers of the load generator in a region with demand, and in one without: a closed loop
/// each, so a hot region asks for several times its share.
const HOT_CALLERS: u32 = 4;
const COOL_CALLERS: u32 = 1;
/// Each run of the load generator: the demand follows the phase within this.
const LOAD_CHUNK: Duration = Duration::from_secs(1);
/// How often the watcher reads the nodes' status and the agents' counters.
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

pub fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    since.as_millis() as u64
}

pub fn window_end_ms(window: u64) -> u64 {
    (window + 1) * WINDOW_MS
}

/// Sleeps until `into_ms` into the next window; returns that window.
pub async fn at_next_window(into_ms: u64) -> u64 {
    let now = unix_ms();
    let window = now / WINDOW_MS + 1;
    let at = window * WINDOW_MS + into_ms;
    tokio::time::sleep(Duration::from_millis(at - now)).await;
    window
}

/// `GET path` on `addr`, or `None` when the process is not there or does not answer 200.
pub fn try_json(addr: &str, path: &str) -> Option<Value> {
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
pub struct Node {
    pub id: u64,
    pub grpc: String,
    pub http: String,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub nodes: Vec<Node>,
    peers: String,
    pub running: BTreeMap<u64, Process>,
    /// Per node, whole seconds its wall clock is set off the machine's (libfaketime); the
    /// monotonic clock, which raft's timers read, is left alone.
    clock_offsets_secs: BTreeMap<u64, i64>,
}

/// Debian's libfaketime (package `faketime`): preloaded, it sets a process's wall clock off
/// the machine's, so nodes on one machine can run on clocks that really differ.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Cluster {
    pub fn start(dir: &Path) -> Cluster {
        Cluster::start_with_clocks(dir, BTreeMap::new())
    }

    /// Three nodes, those in `clock_offsets_secs` on wall clocks that far off the machine's
    /// (positive: ahead), across restarts too.
    pub fn start_with_clocks(dir: &Path, clock_offsets_secs: BTreeMap<u64, i64>) -> Cluster {
        assert!(
            clock_offsets_secs.is_empty() || Path::new(LIBFAKETIME).exists(),
            "{LIBFAKETIME} is missing: apt-get install faketime"
        );
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
            clock_offsets_secs,
        };
        for id in 1..=3 {
            c.restart(id);
        }
        c
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    /// Starts node `id` from its directory (a first start, or after a kill).
    pub fn restart(&mut self, id: u64) {
        let node = &self.nodes[id as usize - 1];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.arg("coordinator")
            .args(["--id", &id.to_string(), "--peers", &self.peers])
            .args(["--grpc", &node.grpc, "--http", &node.http])
            .arg("--data")
            .arg(self.data_dir(id))
            .arg("--limits")
            .arg(self.dir.join("limits.yaml"));
        if let Some(secs) = self.clock_offsets_secs.get(&id) {
            cmd.env("LD_PRELOAD", LIBFAKETIME)
                .env("FAKETIME", format!("{secs:+}"))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        self.running.insert(id, Process::start(cmd, "coordinator"));
    }

    /// SIGKILL (the process's drop kills it and reaps it).
    pub fn kill(&mut self, id: u64) -> Instant {
        drop(self.running.remove(&id).expect("a running node"));
        Instant::now()
    }

    /// SIGKILL to every running node before any is reaped, so that they die together.
    pub fn kill_all(&mut self) -> Instant {
        for p in self.running.values() {
            let pid = i32::try_from(p.child.id()).expect("a pid");
            // SAFETY: kill(2) on a child this test started and has not reaped yet (its
            // `Process` reaps it when dropped, below).
            assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        }
        let at = Instant::now();
        self.running.clear();
        at
    }

    pub fn grpc_list(&self) -> String {
        let all: Vec<&str> = self.nodes.iter().map(|n| n.grpc.as_str()).collect();
        all.join(",")
    }

    /// A running node that says it leads, other than `not`, with its status.
    pub fn leader(&self, not: Option<u64>) -> Option<(u64, Value)> {
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
pub enum Phase {
    Hot(&'static str),
    Stop,
}

/// What the load generator recorded: requests admitted per (region, key, window), by the
/// window each decision named, and failed calls.
#[derive(Default)]
pub struct Ledger {
    pub admitted: BTreeMap<(String, String, u64), u64>,
    pub errors: BTreeMap<String, u64>,
}

/// One region's load: runs of the load generator of `LOAD_CHUNK` each, with the callers its
/// demand asks for, until `Phase::Stop`.
pub async fn drive(
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

/// The load in every region (demand where `phase` says) and the watcher, from start to stop.
pub struct Load {
    pub phase: tokio::sync::watch::Sender<Phase>,
    pub ledger: Arc<Mutex<Ledger>>,
    pub watched: Arc<Mutex<Watched>>,
    drivers: tokio::task::JoinSet<()>,
    stop: Arc<AtomicBool>,
    watcher: std::thread::JoinHandle<()>,
}

impl Load {
    /// Starts the watcher over every node of `cluster` and every agent, and the load with
    /// demand in `hot`.
    pub fn start(
        cluster: &Cluster,
        agents: &BTreeMap<&'static str, Process>,
        hot: &'static str,
    ) -> Load {
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
        let (phase, phase_rx) = tokio::sync::watch::channel(Phase::Hot(hot));
        let mut drivers = tokio::task::JoinSet::new();
        for (region, agent) in agents {
            let addr: SocketAddr = agent.grpc.parse().expect("the agent's address");
            drivers.spawn(drive(addr, region, phase_rx.clone(), ledger.clone()));
        }
        Load {
            phase,
            ledger,
            watched,
            drivers,
            stop,
            watcher,
        }
    }

    /// Stops the load, then watches on to the end of the last window with load.
    pub async fn stop(mut self) -> (Arc<Mutex<Watched>>, Arc<Mutex<Ledger>>) {
        self.phase.send_replace(Phase::Stop);
        while let Some(done) = self.drivers.join_next().await {
            done.expect("a region's load");
        }
        let ahead = self.watched.lock().expect("watched").cluster_ahead_ms;
        let cluster_now = unix_ms().saturating_add_signed(ahead);
        let last = cluster_now / WINDOW_MS;
        let left = window_end_ms(last) - cluster_now;
        tokio::time::sleep(Duration::from_millis(left + 500)).await;
        self.stop.store(true, Ordering::Relaxed);
        self.watcher.join().expect("the watcher");
        (self.watched, self.ledger)
    }
}

/// One leader's statement of a window's bound: the largest total it stated, and any reason
/// it gave for stating none.
#[derive(Clone, Debug, Default)]
pub struct Stated {
    pub total_units: u64,
    pub unbounded: Option<String>,
}

/// One node's committed table as its `/v1/status` showed it: the rows of every escalated
/// counter, read at `applied_index` (under the same lock, so one index shows one table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSeen {
    pub node: u64,
    pub at_ms: u64,
    pub applied_index: u64,
    pub config_version: u64,
    /// (key, window) -> region -> allowance (one counter per limit here: the limits have no
    /// per-value keys); a member with no row holds its default share.
    pub rows: BTreeMap<(String, u64), BTreeMap<String, u64>>,
    pub members: Vec<String>,
}

impl TableSeen {
    pub fn from_status(node: u64, status: &Value) -> Option<TableSeen> {
        let mut rows = BTreeMap::new();
        for c in status["counters"].as_array()? {
            let limit = c["counter"]["limit"].as_str()?;
            let key = limit.strip_prefix("bench/key=").unwrap_or(limit).to_owned();
            let window = c["counter"]["window"].as_u64()?;
            let regions = c["regions"].as_object()?;
            let by_region = regions
                .iter()
                .map(|(r, row)| Some((r.clone(), row["allowance_units"].as_u64()?)))
                .collect::<Option<BTreeMap<_, _>>>()?;
            rows.insert((key, window), by_region);
        }
        let members = status["regions"]
            .as_array()?
            .iter()
            .filter_map(|r| r["region"].as_str().map(str::to_owned))
            .collect();
        Some(TableSeen {
            node,
            at_ms: unix_ms(),
            applied_index: status["last_applied_index"].as_u64()?,
            config_version: status["config_version"].as_u64()?,
            rows,
            members,
        })
    }

    /// Per counter, the allowances summed over the members (default share where no row).
    pub fn sums(&self) -> BTreeMap<(String, u64), u64> {
        self.rows
            .iter()
            .map(|(counter, rows)| {
                let defaults = self.members.iter().filter(|m| !rows.contains_key(*m));
                let sum =
                    rows.values().sum::<u64>() + defaults.count() as u64 * DEFAULT_SHARE_UNITS;
                (counter.clone(), sum)
            })
            .collect()
    }
}

/// What the watcher read: bounds per (key, window) by the leader (node, term) that stated
/// them, when each leader was last seen leading, the agents' own counters per (region, key,
/// window): the largest `granted_units` their `/v1/keys` showed, and every node's table.
#[derive(Default)]
pub struct Watched {
    pub bounds: BTreeMap<(String, u64), BTreeMap<(u64, u64), Stated>>,
    pub leading_until_ms: BTreeMap<(u64, u64), u64>,
    pub agent_granted: BTreeMap<(String, String, u64), u64>,
    /// Per (region, key, window): the units the agent's end band carried in from the window
    /// before (counted in both, docs/budget.md), fixed at the window's start.
    pub agent_carried_in: BTreeMap<(String, String, u64), u64>,
    pub tables: Vec<TableSeen>,
    /// How far cluster time, on which the agents and leaders count windows (D47), reads ahead
    /// of this machine's clock, on which the test and the load generator do: 0 unless nodes
    /// run on clocks set apart. A whole number of windows, so that a window is the same span
    /// on both, under another index.
    pub cluster_ahead_ms: i64,
}

impl Watched {
    /// A window's end (its index on cluster time) on this machine's clock.
    fn end_on_machine_ms(&self, window: u64) -> u64 {
        let end = i128::from(window_end_ms(window)) - i128::from(self.cluster_ahead_ms);
        u64::try_from(end).expect("a window after the epoch")
    }

    /// The cluster's index of a window the load generator indexed on this machine's clock.
    fn cluster_window(&self, machine_window: u64) -> u64 {
        let ahead = self.cluster_ahead_ms / i64::try_from(WINDOW_MS).expect("small");
        machine_window.saturating_add_signed(ahead)
    }
}

impl Watched {
    /// The bound stated for `window` by the leaders that were still leading at its end (a
    /// leader killed inside the window did not watch its end, and what it stated does not
    /// cover it: docs/bound.md, "Windows without a leader"). `Err` says why there is none.
    pub fn bound(&self, key: &str, window: u64) -> Result<u64, String> {
        let Some(by_leader) = self.bounds.get(&(key.to_owned(), window)) else {
            return Err("no leader stated a bound for it".to_owned());
        };
        let watched_end: Vec<&Stated> = by_leader
            .iter()
            .filter(|(leader, _)| self.leading_until_ms[leader] >= self.end_on_machine_ms(window))
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

    /// Takes one node's status: its table, and if it leads, the bounds it states.
    pub fn take_status(&mut self, id: u64, s: &Value) {
        if let Some(t) = TableSeen::from_status(id, s) {
            self.tables.push(t);
        }
        let (Some(term), true) = (s["term"].as_u64(), s["state"] == "leader") else {
            return;
        };
        self.leading_until_ms.insert((id, term), unix_ms());
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
            let stated = self
                .bounds
                .entry((key.to_owned(), window))
                .or_default()
                .entry((id, term))
                .or_default();
            stated.total_units = stated
                .total_units
                .max(bound["total_units"].as_u64().unwrap_or(0));
            if let Some(why) = bound["unbounded"].as_str() {
                stated.unbounded = Some(why.to_owned());
            }
        }
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
            if let Some(s) = try_json(http, "/v1/status") {
                watched.lock().expect("watched").take_status(*id, &s);
            }
        }
        for (region, http) in &agents {
            for key in KEYS {
                let path = format!("/v1/keys?domain=bench&descriptor=key={key}");
                let Some(k) = try_json(http, &path) else {
                    continue;
                };
                let (Some(window), Some(granted), Some(carried)) = (
                    k["window"].as_u64(),
                    k["granted_units"].as_u64(),
                    k["carried_in_units"].as_u64(),
                ) else {
                    continue;
                };
                let at = (region.to_string(), key.to_owned(), window);
                let mut w = watched.lock().expect("watched");
                let seen = w.agent_granted.entry(at.clone()).or_default();
                *seen = (*seen).max(granted);
                let carried_in = w.agent_carried_in.entry(at).or_default();
                *carried_in = (*carried_in).max(carried);
            }
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

/// One window of one limit, as the check and the table read it.
pub struct Row {
    pub key: String,
    pub window: u64,
    /// Per region: (what the load generator saw admitted, the largest count the agent showed
    /// less the units its end band carried in from the window before).
    pub by_region: BTreeMap<String, (u64, u64)>,
    pub bound: Result<u64, String>,
}

impl Row {
    /// The units admitted across regions: per region the larger of the two records (the
    /// agent's is sampled every `WATCH_EVERY` and may miss a window's last calls; the load
    /// generator's counts every allowed answer, by the window the agent's decision named).
    pub fn admitted(&self) -> u64 {
        self.by_region.values().map(|(l, a)| (*l).max(*a)).sum()
    }
}

pub fn windows(watched: &Watched, ledger: &Ledger) -> Vec<Row> {
    let mut rows: BTreeMap<(String, u64), Row> = BTreeMap::new();
    let load = ledger
        .admitted
        .iter()
        .map(|((region, key, window), n)| ((region, key, watched.cluster_window(*window)), *n, 0));
    // What the agent admitted in the window: its count less what its end band carried in
    // (admitted, and seen by the load, in the window before).
    let agents = watched.agent_granted.iter().map(|(at, n)| {
        let carried_in = watched.agent_carried_in.get(at).copied().unwrap_or(0);
        ((&at.0, &at.1, at.2), 0, n.saturating_sub(carried_in))
    });
    for ((region, key, window), seen, counted) in load.chain(agents) {
        if seen + counted == 0 {
            continue;
        }
        let row = rows
            .entry((key.clone(), window))
            .or_insert_with(|| Row {
                key: key.clone(),
                window,
                by_region: BTreeMap::new(),
                bound: watched.bound(key, window),
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
/// and the agents' counters no higher than what the load generator saw admitted. A window in
/// `leaderless_ends` ended while no node ran: it has no bound (docs/bound.md, "Windows
/// without a leader"), and only the strict limit's quota is checked there.
pub fn check(rows: &[Row], leaderless_ends: &std::collections::BTreeSet<u64>) {
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
            Err(_) if leaderless_ends.contains(&r.window) => {}
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

/// The per-window table the docs quote.
pub fn report(rows: &[Row]) {
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
}
