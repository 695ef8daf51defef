//! A partition over a real network (slow tier, `ALLOT_SLOW_TESTS=1`; needs root and iproute2).
//!
//! The lab (`support/netns.rs`): subnet 10.77.0.0/24 on a bridge in its own namespace, the
//! coordinator cluster (three `allot coordinator` processes, raft ids 1-3) in namespaces
//! `allot-pn-n1`..`n3` at 10.77.0.1-3, and one `allot agent` process per region (`a`, `b`,
//! `c`) in its own namespace at 10.77.0.11-13, each on a veth whose other end is a port of the
//! bridge. The subnet is blackholed in the root namespace and no lab namespace has a route
//! beyond it, so nothing of the lab leaves the machine. These kernels have no netem: each
//! agent reaches each coordinator node through a relay of its own the test runs in the
//! bridge's namespace, which holds every chunk a fixed time per direction (round trips of 20,
//! 40 and 70 ms, the same to every node of a region). The nodes reach each other directly.
//! An agent is given its relays as `--coordinator ID=ADDR,...`: a follower names the leader's
//! raft id with its raft address, and the agent goes to its own relay for that id instead of
//! around it (D35); the test checks that every agent's leader is its relay to the leading
//! node. The test reaches the daemons' loopback admin and gRPC addresses through forwarders
//! that open their sockets inside the daemons' namespaces.
//!
//! Load: strict-limit acquires from the test to every agent, on a limit with the `floor`
//! partition policy and one with `closed`, demand moving from `a` to `b` and `c` to `c` alone.
//! `c`'s port on the bridge goes down for longer than `view_ttl`, then comes back up. Checks:
//! in every window, the units admitted across regions (every grant the test saw, by the window
//! its decision names) are at most the quota plus the bound the leader's `/v1/status`
//! reported for that window; while cut off, `c`'s metrics and `/v1/status` show it disconnected
//! with its view expired and each limit's partition policy in force; after the heal it
//! reconnects through its relay to the leader, its view is fresh and its allowance grows past
//! its default share again.

#[path = "support/netns.rs"]
mod netns;
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use netns::{Endpoint, Host, Lab, Relay};
use serde_json::Value;
use support::{Process, agent_args, decide, eventually, get_json, slow_tier};

/// Two strict limits over 4 s windows, each region's default share 20% of the quota (40%
/// left to the rebalancer): `floor` keeps the default share in windows without a grant,
/// `closed` denies in them (and the coordinator may reclaim a silent region's floor).
const LIMITS: &str = "\
domain: lab
descriptors:
  - key: floor
    rate_limit: {requests_per_unit: 6000}
    allot: {window: 4s, weights: {a: 0.2, b: 0.2, c: 0.2}}
  - key: closed
    rate_limit: {requests_per_unit: 6000}
    allot: {window: 4s, weights: {a: 0.2, b: 0.2, c: 0.2}, partition_policy: closed}
";
const QUOTA_UNITS: u64 = 6_000;
const DEFAULT_SHARE_UNITS: u64 = 1_200;
const WINDOW_MS: u64 = 4_000;
const KEYS: [&str; 2] = ["floor", "closed"];

/// Regions: name, host octet, the relay's delay each way (round trip twice that).
const REGIONS: [(&str, u8, u64); 3] = [("a", 11, 10), ("b", 12, 20), ("c", 13, 35)];
const CUT_REGION: &str = "c";
/// The coordinator nodes' raft ids; node `id` is at host octet `id`.
const NODE_IDS: [u64; 3] = [1, 2, 3];
const COORDINATOR_GRPC_PORT: u16 = 7070;
/// Region `i`'s relay to node `id` listens on the hub at this port plus `10 * i + id`.
const RELAY_BASE_PORT: u16 = 7100;

/// The agents' and coordinator's view TTL (the core's default, which the daemons use).
const VIEW_TTL: Duration = Duration::from_secs(2);
/// How long `c` stays cut off: five view TTLs, so that it spans windows it holds no grant for.
const CUT: Duration = Duration::from_secs(10);
/// Demand before the cut, all in `a`.
const BEFORE_CUT: Duration = Duration::from_secs(8);
/// Load kept on after `c`'s allowance has converged back.
const AFTER_CONVERGED: Duration = Duration::from_secs(2 * WINDOW_MS / 1000);

/// Each acquire's cost, and the pause between a region's rounds of acquires (one per limit):
/// a hot region asks up to 2,000 units/s per limit, 8,000 per window, more than the quota
/// alone, so that every window with a hot region is pressed against it; a cool one 640.
const COST_UNITS: u64 = 40;
const HOT_PAUSE: Duration = Duration::from_millis(20);
const COOL_PAUSE: Duration = Duration::from_millis(250);
/// How often the test reads the cut region's keys while it is cut off.
const POLICY_EVERY: Duration = Duration::from_millis(500);
/// How often the test reads the leader's bound.
const STATUS_EVERY: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Every region cool.
    Warm,
    /// Demand in `a`.
    A,
    /// `c` cut off; demand in `b` and `c`.
    Cut,
    /// `c` healed; demand in `c`.
    Healed,
    Stop,
}

impl Phase {
    fn hot(self, region: &str) -> bool {
        match self {
            Phase::Warm | Phase::Stop => false,
            Phase::A => region == "a",
            Phase::Cut => region == "b" || region == "c",
            Phase::Healed => region == "c",
        }
    }
}

/// What the load saw: units granted per (key, window) and region, and decisions by
/// (region, phase, key, reason).
#[derive(Default)]
struct Ledger {
    granted: BTreeMap<(String, u64), BTreeMap<String, u64>>,
    reasons: BTreeMap<(String, Phase, String, String), u64>,
}

/// The largest bound the coordinator stated for a window, and any `unbounded` reason.
#[derive(Debug, Default)]
struct BoundSeen {
    total_units: u64,
    unbounded: Option<String>,
    samples: u32,
}

/// What the leader's status showed: bounds per (key, window), round trips per region, and
/// the nodes seen leading.
#[derive(Default)]
struct Watched {
    bounds: BTreeMap<(String, u64), BoundSeen>,
    round_trips_ms: BTreeMap<String, Vec<u64>>,
    leaders: Vec<u64>,
}

fn unix_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    since.as_millis() as u64
}

/// Coordinator node `id`'s host octet.
fn node_octet(id: u64) -> u8 {
    u8::try_from(id).expect("a small node id")
}

/// The window a decision was for: its end is a multiple of the window length, `reset_after_ms`
/// after the decision, which was taken between `sent_ms` and `answered_ms`.
fn window_of(sent_ms: u64, answered_ms: u64, reset_after_ms: u64) -> u64 {
    let end_ms = sent_ms.midpoint(answered_ms) + reset_after_ms;
    (end_ms + WINDOW_MS / 2) / WINDOW_MS - 1
}

/// A loopback forwarder in the test's namespace to `addr` in `ns`.
async fn forward(ns: &str, addr: &str) -> Relay {
    let target: SocketAddr = addr.parse().expect("a daemon's address");
    Relay::start(
        Endpoint {
            ns: None,
            addr: "127.0.0.1:0".parse().expect("address"),
        },
        Endpoint {
            ns: Some(ns.to_owned()),
            addr: target,
        },
        Duration::ZERO,
    )
    .await
    .expect("a forwarder")
}

/// A daemon started in `host`'s namespace, with its admin and gRPC addresses reached through
/// forwarders (kept alive beside it).
async fn start_in(host: &Host, cmd: Command, what: &str) -> (Process, [Relay; 2]) {
    let mut p = Process::start(cmd, what);
    let grpc = forward(&host.ns, &p.grpc).await;
    let http = forward(&host.ns, &p.http).await;
    p.grpc = grpc.addr.to_string();
    p.http = http.addr.to_string();
    (p, [grpc, http])
}

/// One region's load: a round of acquires (one per limit), then a pause, until `Phase::Stop`.
async fn drive(
    agent: &Process,
    region: &str,
    phase: tokio::sync::watch::Receiver<Phase>,
    ledger: Arc<Mutex<Ledger>>,
) {
    let mut client = agent.lease_client().await;
    loop {
        let now = *phase.borrow();
        if now == Phase::Stop {
            return;
        }
        for key in KEYS {
            let sent_ms = unix_ms();
            let d = decide(&mut client, "lab", key, "", COST_UNITS).await;
            let window = window_of(sent_ms, unix_ms(), d.reset_after_ms);
            let mut l = ledger.lock().expect("ledger");
            if d.allowed {
                *l.granted
                    .entry((key.to_owned(), window))
                    .or_default()
                    .entry(region.to_owned())
                    .or_default() += COST_UNITS;
            }
            let reason = format!(
                "{}:{}",
                if d.allowed { "allowed" } else { "denied" },
                d.reason
            );
            *l.reasons
                .entry((region.to_owned(), now, key.to_owned(), reason))
                .or_default() += 1;
        }
        let pause = if now.hot(region) {
            HOT_PAUSE
        } else {
            COOL_PAUSE
        };
        tokio::time::sleep(pause).await;
    }
}

/// Reads the nodes' status every `STATUS_EVERY` until `stop` (and once after it), and from the one leading the
/// bound per window of each limit and each region's round trip.
fn watch_coordinator(
    http: Vec<(u64, String)>,
    stop: Arc<AtomicBool>,
    watched: Arc<Mutex<Watched>>,
) {
    loop {
        // Read once more after `stop`: the load has ended by then, so its last grants' window
        // (begun after the sample before, perhaps) has its bound read too.
        let stopping = stop.load(Ordering::Relaxed);
        let Some((id, status)) = leader_status(&http) else {
            if stopping {
                return;
            }
            std::thread::sleep(STATUS_EVERY);
            continue;
        };
        let mut w = watched.lock().expect("watched");
        if w.leaders.last() != Some(&id) {
            w.leaders.push(id);
        }
        for l in status["limits"].as_array().into_iter().flatten() {
            let bound = &l["bound"];
            let (Some(key), Some(window)) = (
                l["limit"].as_str().and_then(|id| id.strip_prefix("lab/")),
                bound["window"].as_u64(),
            ) else {
                continue;
            };
            let seen = w.bounds.entry((key.to_owned(), window)).or_default();
            seen.samples += 1;
            seen.total_units = seen
                .total_units
                .max(bound["total_units"].as_u64().unwrap_or(0));
            if let Some(reason) = bound["unbounded"].as_str() {
                seen.unbounded = Some(reason.to_owned());
            }
        }
        for r in status["regions"].as_array().into_iter().flatten() {
            if let (Some(region), Some(rtt)) = (r["region"].as_str(), r["round_trip_ms"].as_u64()) {
                w.round_trips_ms
                    .entry(region.to_owned())
                    .or_default()
                    .push(rtt);
            }
        }
        drop(w);
        if stopping {
            return;
        }
        std::thread::sleep(STATUS_EVERY);
    }
}

/// The node that says it leads, with its status.
fn leader_status(http: &[(u64, String)]) -> Option<(u64, Value)> {
    http.iter().find_map(|(id, addr)| {
        let status = get_json(addr, "/v1/status");
        (status["state"] == "leader").then_some((*id, status))
    })
}

fn sync_of(agent: &Process) -> Value {
    agent.json("/v1/status")["sync"].clone()
}

fn allowance(agent: &Process, key: &str) -> u64 {
    agent.json(&format!("/v1/keys?domain=lab&descriptor={key}"))["allowance_units"]
        .as_u64()
        .unwrap_or(0)
}

/// Whether the lab can be built here; prints why not. In CI (`.ci/run` installs iproute2 and
/// runs as root) a missing `ip` is a failure.
fn lab_or_skip() -> bool {
    if !slow_tier() {
        return false;
    }
    let Some(why) = netns::unavailable() else {
        return true;
    };
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false");
    assert!(!(ci && why.contains("iproute2")), "{why}");
    eprintln!("skipped: {why}");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_cut_off_past_its_view_ttl_keeps_every_window_within_its_bound_and_converges_back()
{
    if !lab_or_skip() {
        return;
    }
    let dir = support::scratch("partition_netns", "cut_and_heal", Some(LIMITS));
    // Declared first, so dropped last: the daemons are killed before their namespaces go.
    let mut lab = Lab::new("allot-pn", [10, 77, 0]).expect("the lab");
    let node_hosts: Vec<Host> = NODE_IDS
        .iter()
        .map(|id| {
            lab.add_host(&format!("n{id}"), node_octet(*id))
                .expect("host")
        })
        .collect();
    let hosts: Vec<Host> = REGIONS
        .iter()
        .map(|(name, octet, _)| lab.add_host(name, *octet).expect("host"))
        .collect();

    // Nothing of the lab is reachable from the root namespace, and no lab namespace routes
    // beyond the subnet.
    let node_grpc = |id: u64| SocketAddr::from((lab.addr(node_octet(id)), COORDINATOR_GRPC_PORT));
    let route = netns::ip(&["route", "show", "exact", "10.77.0.0/24"]).expect("ip route");
    assert!(route.starts_with("blackhole"), "{route}");
    for host in hosts.iter().chain(&node_hosts) {
        let default = netns::ip(&["-n", &host.ns, "route", "show", "default"]).expect("ip");
        assert!(default.trim().is_empty(), "{}: {default}", host.ns);
    }

    let peers: Vec<String> = NODE_IDS
        .iter()
        .map(|id| format!("{id}={}", node_grpc(*id)))
        .collect();
    let mut nodes = Vec::new();
    for (id, host) in NODE_IDS.iter().zip(&node_hosts) {
        let mut cmd = netns::command(&host.ns, env!("CARGO_BIN_EXE_allot"));
        cmd.arg("coordinator")
            .args(["--id", &id.to_string(), "--peers", &peers.join(",")])
            .args([
                "--grpc",
                &node_grpc(*id).to_string(),
                "--http",
                "127.0.0.1:0",
            ])
            .arg("--data")
            .arg(dir.join(format!("node-{id}")))
            .arg("--limits")
            .arg(dir.join("limits.yaml"));
        nodes.push(start_in(host, cmd, "coordinator").await);
    }
    for id in NODE_IDS {
        assert!(
            std::net::TcpStream::connect_timeout(&node_grpc(id), Duration::from_secs(1)).is_err(),
            "the lab is reachable from the root namespace"
        );
    }
    let nodes_http: Vec<(u64, String)> = NODE_IDS
        .iter()
        .zip(&nodes)
        .map(|(id, (p, _))| (*id, p.http.clone()))
        .collect();
    let (leader, _) = eventually(
        "a coordinator node leads",
        || leader_status(&nodes_http),
        Option::is_some,
    )
    .await
    .expect("checked");

    let mut relays = Vec::new();
    let mut agents = BTreeMap::new();
    let mut forwarders = Vec::new();
    // Per region, its relay's address to each node.
    let mut relay_to: BTreeMap<&str, BTreeMap<u64, SocketAddr>> = BTreeMap::new();
    // Each agent's list names the leader last, so that it asks a follower first and is
    // redirected.
    let mut asked = NODE_IDS;
    asked.sort_by_key(|id| *id == leader);
    for (i, ((region, _, one_way_ms), host)) in REGIONS.iter().zip(&hosts).enumerate() {
        let mut entries = Vec::new();
        for id in asked {
            let port = RELAY_BASE_PORT + 10 * i as u16 + id as u16;
            let relay_addr = SocketAddr::from((lab.addr(netns::HUB_OCTET), port));
            relays.push(
                Relay::start(
                    Endpoint {
                        ns: Some(lab.hub().to_owned()),
                        addr: relay_addr,
                    },
                    Endpoint {
                        ns: Some(lab.hub().to_owned()),
                        addr: node_grpc(id),
                    },
                    Duration::from_millis(*one_way_ms),
                )
                .await
                .expect("a relay"),
            );
            entries.push(format!("{id}={relay_addr}"));
            relay_to.entry(region).or_default().insert(id, relay_addr);
        }
        let mut cmd = netns::command(&host.ns, env!("CARGO_BIN_EXE_allot"));
        agent_args(&mut cmd, &dir, region, Some(&entries.join(",")));
        let (agent, fwd) = start_in(host, cmd, "agent").await;
        forwarders.push(fwd);
        agents.insert(*region, agent);
    }
    // Each agent syncs with the leader through its own relay to it: a follower's redirect
    // named the leader's raft address, which it did not take.
    let through_relay = |region: &str, s: &Value| {
        let leader = leader_status(&nodes_http).map(|(id, _)| id);
        let relay = leader
            .and_then(|id| relay_to[region].get(&id))
            .map(ToString::to_string);
        relay.is_some() && s["leader"].as_str() == relay.as_deref()
    };
    for (region, agent) in &agents {
        eventually(
            "the agent syncs with the leader through its relay",
            || sync_of(agent),
            |s| {
                s["connected"] == true
                    && s["partition_state"] == "connected"
                    && through_relay(region, s)
            },
        )
        .await;
    }

    // The load, and the coordinator's bounds, from here to the end.
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let watched = Arc::new(Mutex::new(Watched::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (http, stop, watched) = (nodes_http.clone(), stop.clone(), watched.clone());
        std::thread::spawn(move || watch_coordinator(http, stop, watched))
    };
    let (phase_tx, phase_rx) = tokio::sync::watch::channel(Phase::Warm);
    let agents = Arc::new(agents);
    let mut load = tokio::task::JoinSet::new();
    for (region, _, _) in REGIONS {
        let (agents, rx, ledger) = (agents.clone(), phase_rx.clone(), ledger.clone());
        load.spawn(async move { drive(&agents[region], region, rx, ledger).await });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    phase_tx.send_replace(Phase::A);
    tokio::time::sleep(BEFORE_CUT).await;

    // Cut c off.
    let c = &agents[CUT_REGION];
    let c_host = &hosts[REGIONS.iter().position(|r| r.0 == CUT_REGION).expect("c")];
    phase_tx.send_replace(Phase::Cut);
    lab.set_link(c_host, false).expect("cut");
    let cut_at = Instant::now();
    let expired = |agent: &Process| {
        (
            agent.metric("allot_partition_policy_state{state=\"expired\"}"),
            agent.metric("allot_sync_connected"),
        )
    };
    eventually(
        "the cut region's metrics show its view expired",
        || expired(c),
        |(e, _)| *e == 1.0,
    )
    .await;
    let expired_after = cut_at.elapsed();
    eventually(
        "the cut region's metrics show its link down",
        || expired(c),
        |(e, connected)| *e == 1.0 && *connected == 0.0,
    )
    .await;
    let disconnected_after = cut_at.elapsed();
    let status = c.json("/v1/status");
    let policies: BTreeMap<String, (String, bool)> = status["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|l| {
            (
                l["rule"].as_str().unwrap_or("").to_owned(),
                (
                    l["partition_policy"].as_str().unwrap_or("").to_owned(),
                    l["view_expired"] == true,
                ),
            )
        })
        .collect();
    assert_eq!(
        policies["lab/floor"],
        ("floor".to_owned(), true),
        "{status}"
    );
    assert_eq!(
        policies["lab/closed"],
        ("closed".to_owned(), true),
        "{status}"
    );
    assert!(expired_after < CUT, "expired after {expired_after:?}");
    // What each limit's policy makes of the windows c holds no grant for: `floor` its default
    // share, `closed` nothing more than it has used (in the window its view expired in, that
    // window's use; in later ones, nothing).
    let mut policy_samples = BTreeMap::new();
    while cut_at.elapsed() < CUT {
        for key in KEYS {
            let k = c.json(&format!("/v1/keys?domain=lab&descriptor={key}"));
            if k["explicit_allowance"] == true {
                continue;
            }
            let used = k["net_units"].as_u64().unwrap_or(0);
            let (want_units, want_reason) = match key {
                "floor" => (DEFAULT_SHARE_UNITS, "allowance"),
                _ => (used.min(DEFAULT_SHARE_UNITS), "partition_closed"),
            };
            assert_eq!(k["allowance_units"], want_units, "{key}: {k}");
            assert_eq!(k["reason"], want_reason, "{key}: {k}");
            *policy_samples.entry(key).or_insert(0) += 1;
        }
        tokio::time::sleep(POLICY_EVERY).await;
    }
    for key in KEYS {
        assert!(
            policy_samples.contains_key(key),
            "{key}: c held a grant all through the cut"
        );
    }
    // Still cut off at the end of the cut, the others still connected.
    assert_eq!(expired(c), (1.0, 0.0), "{}", c.json("/v1/status"));
    for (region, agent) in agents.iter().filter(|(r, _)| **r != CUT_REGION) {
        assert_eq!(sync_of(agent)["partition_state"], "connected", "{region}");
    }

    // Heal; demand moves to c.
    lab.set_link(c_host, true).expect("heal");
    let healed_at = Instant::now();
    phase_tx.send_replace(Phase::Healed);
    eventually(
        "the healed region reconnects to the leader through its relay with a fresh view",
        || sync_of(c),
        |s| {
            s["connected"] == true
                && s["partition_state"] == "connected"
                && through_relay(CUT_REGION, s)
        },
    )
    .await;
    let fresh_after = healed_at.elapsed();
    for key in KEYS {
        eventually(
            "the healed region's allowance grows past its default share again",
            || allowance(c, key),
            |u| *u > DEFAULT_SHARE_UNITS,
        )
        .await;
    }
    let converged_after = healed_at.elapsed();
    tokio::time::sleep(AFTER_CONVERGED).await;
    phase_tx.send_replace(Phase::Stop);
    while let Some(done) = load.join_next().await {
        done.expect("a region's load");
    }
    stop.store(true, Ordering::Relaxed);
    watcher.join().expect("the status watcher");

    let watched = watched.lock().expect("watched");
    let ledger = ledger.lock().expect("ledger");
    let times = Times {
        expired_after,
        disconnected_after,
        fresh_after,
        converged_after,
    };
    eprintln!(
        "leader at the start: node {leader}; nodes seen leading: {:?}",
        watched.leaders
    );
    report(&watched, &ledger, &times);
    check_windows(&watched, &ledger);
    // The closed policy was in force in c while cut off: it denied for that reason. (Before
    // refusals in the clock's edge band gave the allowance's own reason, the first refusal of
    // each window, in the band, was remembered as `allowance` to the window's end: 0 of 380.)
    let closed_denials: u64 = ledger
        .reasons
        .iter()
        .filter(|((r, p, k, reason), _)| {
            r == CUT_REGION
                && *p == Phase::Cut
                && k == "closed"
                && reason == "denied:partition_closed"
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        closed_denials > 0,
        "c never denied by its closed policy while cut off"
    );
}

/// Every window with grants: admitted across regions <= quota + the bound stated for it.
fn check_windows(watched: &Watched, ledger: &Ledger) {
    let mut failures = Vec::new();
    for ((key, window), by_region) in &ledger.granted {
        let admitted: u64 = by_region.values().sum();
        let Some(bound) = watched.bounds.get(&(key.clone(), *window)) else {
            failures.push(format!("{key} window {window}: no bound was read for it"));
            continue;
        };
        if let Some(reason) = &bound.unbounded {
            failures.push(format!("{key} window {window}: unbounded ({reason})"));
        } else if admitted > QUOTA_UNITS + bound.total_units {
            failures.push(format!(
                "{key} window {window}: admitted {admitted} {by_region:?} > quota {QUOTA_UNITS} + bound {}",
                bound.total_units
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The figures the docs quote: round trips, admitted per window against quota and bound,
/// decisions by reason, and the times after the cut and the heal.
fn report(watched: &Watched, ledger: &Ledger, times: &Times) {
    for (region, rtts) in &watched.round_trips_ms {
        let mut sorted = rtts.clone();
        sorted.sort_unstable();
        let median = sorted.get(sorted.len() / 2);
        eprintln!(
            "{region}: round trip median {median:?} ms, {:?}..{:?} over {} samples",
            sorted.first(),
            sorted.last(),
            sorted.len()
        );
    }
    for ((key, window), by_region) in &ledger.granted {
        let admitted: u64 = by_region.values().sum();
        let bound = watched.bounds.get(&(key.clone(), *window));
        eprintln!(
            "{key} window {window}: admitted {admitted} {by_region:?}, quota {QUOTA_UNITS}, bound {:?}",
            bound
        );
    }
    for ((region, phase, key, reason), n) in &ledger.reasons {
        eprintln!("{region} {phase:?} {key} {reason}: {n}");
    }
    eprintln!(
        "cut: view expired after {:?} (view_ttl {VIEW_TTL:?}), link reported down after {:?}; \
         healed: view fresh after {:?}, allowance past the default share after {:?}",
        times.expired_after, times.disconnected_after, times.fresh_after, times.converged_after
    );
}

/// Measured from the cut, and from the heal.
struct Times {
    expired_after: Duration,
    disconnected_after: Duration,
    fresh_after: Duration,
    converged_after: Duration,
}
