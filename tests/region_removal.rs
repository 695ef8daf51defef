//! Removing a region and adding it back (`allot cluster remove-region|add-region|regions`),
//! with real processes on loopback.
//!
//! - Every `cargo test`: one `allot coordinator`: the refusals (an unknown region, a region
//!   removed twice, one added back that is not removed) change nothing, and `regions` and
//!   `status` show the removal.
//! - Slow tier (`ALLOT_SLOW_TESTS=1`): three `allot coordinator` processes and three agents
//!   (`a`, `b`, `c`) under steady load on a strict, closed-policy limit of 1,000 units per
//!   10 s window (default shares 300 each, 100 unassigned). `b` is removed mid-window through a
//!   follower's address: its agent's syncs are refused, and `a` and `c` grow into its share only
//!   from the first window that starts after its view has certainly expired; then `b` is added
//!   back and is heard again. From the agents' own counters, no window admits more than the
//!   quota; from the leader's committed table, no window's allowances sum above it.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use support::{PATIENCE, Process, eventually, free_port, get_json, slow_tier};

const WINDOW_MS: u64 = 10_000;
const QUOTA_UNITS: u64 = 1_000;
const DEFAULT_UNITS: u64 = 300;
/// What `a` and `c` may hold together while `b` keeps its share.
const OTHERS_WITHOUT_B_SHARE_UNITS: u64 = QUOTA_UNITS - DEFAULT_UNITS;
/// `view_ttl` (2 s) plus the drift margin (0.5 s), the coordinator's defaults: past this after
/// it was last heard (plus its clock uncertainty, milliseconds here) a removed region's view has
/// certainly expired on its side.
const EXPIRY_MS: u64 = 2_500;

const LIMITS: &str = "\
domain: shop
descriptors:
  - key: k
    rate_limit: {requests_per_unit: 1000}
    allot: {window: 10s, partition_policy: closed, weights: {a: 0.3, b: 0.3, c: 0.3}}
";

const REGIONS: [&str; 3] = ["a", "b", "c"];

fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    u64::try_from(since.as_millis()).expect("ms fit")
}

fn start_coordinator(dir: &Path, id: u64, grpc: &str, http: &str, peers: &str) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.arg("coordinator")
        .args(["--id", &id.to_string(), "--peers", peers])
        .args(["--grpc", grpc, "--http", http])
        .arg("--data")
        .arg(dir.join(format!("node-{id}")))
        .arg("--limits")
        .arg(dir.join("limits.yaml"));
    Process::start(cmd, "coordinator")
}

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .output()
        .expect("allot runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn region_entry(regions: &Value, name: &str) -> Value {
    regions["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["region"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn region_changes_refuse_bad_input_and_regions_and_status_show_a_removal() {
    let dir = support::scratch("region_removal", "refusals", Some(LIMITS));
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let _node = start_coordinator(&dir, 1, &grpc, &http, &format!("1={grpc}"));
    // The limits given at start are put through raft once the node leads.
    let deadline = Instant::now() + PATIENCE;
    let regions = loop {
        let regions = get_json(&http, "/v1/regions");
        if regions["config_version"] != 0 || Instant::now() > deadline {
            break regions;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let names: Vec<&str> = regions["regions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["region"].as_str())
        .collect();
    assert_eq!(names, REGIONS, "{regions}");
    // The rebalancer may still be starting: the first change is retried until it leads.
    let deadline = Instant::now() + PATIENCE;
    let removed = loop {
        let out = cli(&["cluster", "remove-region", "b", "--coordinator", &http]);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(removed.status.success(), "{}", text(&removed));
    assert!(
        text(&removed).contains("region b removed"),
        "{}",
        text(&removed)
    );

    let refusals = [
        (vec!["remove-region", "zz"], "not known to the table"),
        (vec!["remove-region", "b"], "already removed"),
        (vec!["add-region", "a"], "not removed"),
    ];
    for (args, why) in refusals {
        let mut full = vec!["cluster"];
        full.extend(args.iter().copied());
        full.extend(["--coordinator", &http]);
        let out = cli(&full);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(why), "{args:?}: {}", text(&out));
    }
    let regions = get_json(&http, "/v1/regions");
    assert_eq!(region_entry(&regions, "b")["removed"], true, "{regions}");
    assert_eq!(region_entry(&regions, "a")["removed"], false, "{regions}");
    let listed = cli(&["cluster", "regions", "--coordinator", &http]);
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(text(&listed).contains("b: removed"), "{}", text(&listed));
    assert!(text(&listed).contains("a: active"), "{}", text(&listed));
    let status = cli(&["status", "--coordinator", &http]);
    assert!(status.status.success(), "{}", text(&status));
    assert!(text(&status).contains("b: removed"), "{}", text(&status));

    let back = cli(&["cluster", "add-region", "b", "--coordinator", &http]);
    assert!(back.status.success(), "{}", text(&back));
    let regions = get_json(&http, "/v1/regions");
    assert_eq!(region_entry(&regions, "b")["removed"], false, "{regions}");
}

/// What the sampler saw, per window index.
#[derive(Default, Debug)]
struct Seen {
    /// Per region, the largest net use its agent reported for the window.
    used: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Per region, the largest allowance its agent enforced in the window.
    allowance: BTreeMap<u64, BTreeMap<String, u64>>,
    /// The largest allowance `a` and `c` enforced together (read in the same round).
    others: BTreeMap<u64, u64>,
    /// The largest sum of the leader's committed allowances for the window's counter.
    table_sum: BTreeMap<u64, u64>,
    /// The smallest allowance the leader's table gave `b` for the window.
    b_table_min: BTreeMap<u64, u64>,
}

fn raise(map: &mut BTreeMap<u64, BTreeMap<String, u64>>, window: u64, region: &str, v: u64) {
    let slot = map
        .entry(window)
        .or_default()
        .entry(region.to_owned())
        .or_default();
    *slot = (*slot).max(v);
}

/// The leader's committed allowances of `k` per window: its rows, and for a region without a
/// row its default (zero from the window its floor is reclaimed from).
fn table_sums(status: &Value, regions: &Value) -> BTreeMap<u64, BTreeMap<&'static str, u64>> {
    let reclaimed_from = |r: &str| region_entry(regions, r)["reclaimed"]["shop/k"].as_u64();
    let mut sums = BTreeMap::new();
    for c in status["counters"].as_array().into_iter().flatten() {
        let Some(window) = c["counter"]["window"].as_u64() else {
            continue;
        };
        let rows = REGIONS
            .iter()
            .map(|r| {
                let units = match c["regions"][*r]["allowance_units"].as_u64() {
                    Some(units) => units,
                    None if reclaimed_from(r).is_some_and(|from| window >= from) => 0,
                    None => DEFAULT_UNITS,
                };
                (*r, units)
            })
            .collect();
        sums.insert(window, rows);
    }
    sums
}

/// Samples the agents' counters and the leader's table every 100 ms until `stop`.
fn sample(
    agents: Vec<(String, String)>,
    leader_http: String,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let mut round: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (region, http) in &agents {
            let k = get_json(http, "/v1/keys?domain=shop&descriptor=k");
            let (Some(w), Some(net), Some(allowance)) = (
                k["window"].as_u64(),
                k["net_units"].as_u64(),
                k["allowance_units"].as_u64(),
            ) else {
                continue;
            };
            let mut s = seen.lock().expect("sampler");
            raise(&mut s.used, w, region, net);
            raise(&mut s.allowance, w, region, allowance);
            round.insert(region, (w, allowance));
        }
        if let (Some((wa, a)), Some((wc, c))) = (round.get("a"), round.get("c"))
            && wa == wc
        {
            let mut s = seen.lock().expect("sampler");
            let slot = s.others.entry(*wa).or_default();
            *slot = (*slot).max(a + c);
        }
        let status = get_json(&leader_http, "/v1/status");
        let regions = get_json(&leader_http, "/v1/regions");
        let mut s = seen.lock().expect("sampler");
        for (w, rows) in table_sums(&status, &regions) {
            let b = s.b_table_min.entry(w).or_insert(u64::MAX);
            *b = (*b).min(rows["b"]);
            let sum = rows.values().sum();
            let slot = s.table_sum.entry(w).or_default();
            *slot = (*slot).max(sum);
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asks `agent` for 10 units every `every` until `stop`.
async fn load(agent: String, every: Duration, stop: Arc<AtomicBool>) {
    let channel = tonic::transport::Channel::from_shared(format!("http://{agent}"))
        .expect("url")
        .connect()
        .await
        .expect("connects to the agent");
    let mut client = allot_proto::lease::v1::lease_service_client::LeaseServiceClient::new(channel);
    while !stop.load(Ordering::Relaxed) {
        support::decide(&mut client, "shop", "k", "", 10).await;
        tokio::time::sleep(every).await;
    }
}

/// Sleeps until `offset_ms` into a window at least half a second from now.
async fn into_window_at(offset_ms: u64) {
    let now = now_ms();
    let mut target = now - now % WINDOW_MS + offset_ms;
    if target < now + 500 {
        target += WINDOW_MS;
    }
    tokio::time::sleep(Duration::from_millis(target - now)).await;
}

fn window_of(ms: u64) -> u64 {
    ms / WINDOW_MS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_region_s_share_moves_only_from_a_window_after_its_view_expired() {
    if !slow_tier() {
        return;
    }
    let dir = support::scratch("region_removal", "three_nodes", Some(LIMITS));
    let nodes: Vec<(u64, String, String)> = (1..=3)
        .map(|id| {
            let grpc = format!("127.0.0.1:{}", free_port());
            let http = format!("127.0.0.1:{}", free_port());
            (id, grpc, http)
        })
        .collect();
    let peers: Vec<String> = nodes.iter().map(|(id, g, _)| format!("{id}={g}")).collect();
    let peers = peers.join(",");
    let processes: BTreeMap<u64, Process> = nodes
        .iter()
        .map(|(id, grpc, http)| (*id, start_coordinator(&dir, *id, grpc, http, &peers)))
        .collect();
    let grpcs: Vec<&str> = nodes.iter().map(|(_, g, _)| g.as_str()).collect();
    let agents: BTreeMap<&str, Process> = REGIONS
        .iter()
        .map(|r| (*r, Process::agent(&dir, r, Some(&grpcs.join(",")))))
        .collect();
    let leader = eventually(
        "a leader with its rebalancer",
        || {
            processes.iter().find_map(|(id, p)| {
                let s = p.json("/v1/status");
                (s["state"] == "leader" && s["limits"].is_array()).then_some(*id)
            })
        },
        Option::is_some,
    )
    .await
    .expect("checked");
    let leader_http = processes[&leader].http.clone();
    for agent in agents.values() {
        agent.synced().await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let sampler = {
        let agents = agents
            .iter()
            .map(|(r, p)| (r.to_string(), p.http.clone()))
            .collect();
        let (leader_http, seen, stop) = (leader_http.clone(), Arc::clone(&seen), Arc::clone(&stop));
        std::thread::spawn(move || sample(agents, leader_http, seen, stop))
    };
    // a and c ask for twice the quota (200 units/s) and have spent their shares 2 s into a
    // window; b asks for 50 units/s, so that it still holds half its share when it is
    // removed 3 s into one: what it holds then must not move to the others in that window.
    let loads: Vec<_> = agents
        .iter()
        .map(|(r, p)| {
            let every = Duration::from_millis(if *r == "b" { 200 } else { 50 });
            tokio::spawn(load(p.grpc.clone(), every, Arc::clone(&stop)))
        })
        .collect();

    // A whole window of load first, then the removal 3 s into the next, through every node's
    // admin address with a follower's first (it answers 421 naming the leader).
    tokio::time::sleep(Duration::from_millis(WINDOW_MS)).await;
    into_window_at(3_000).await;
    let mut https: Vec<&str> = nodes
        .iter()
        .filter(|(id, _, _)| *id != leader)
        .map(|(_, _, h)| h.as_str())
        .collect();
    https.push(&processes[&leader].http);
    let https = https.join(",");
    let removed_at_ms = now_ms();
    let out = cli(&["cluster", "remove-region", "b", "--coordinator", &https]);
    assert!(out.status.success(), "{}", text(&out));
    let removal_window = window_of(removed_at_ms);
    let b = &agents["b"];
    let refused = eventually(
        "b's syncs are refused",
        || b.json("/v1/status")["sync"].clone(),
        |s| {
            s["connected"] == false
                && s["last_error"]
                    .as_str()
                    .is_some_and(|e| e.contains("was removed"))
        },
    )
    .await;
    eprintln!("b's link: {}", refused["last_error"]);
    assert!(
        processes[&leader].metric("allot_coordinator_removed_region_sync_ups_total") > 0.0,
        "the leader counts b's refused syncs"
    );

    // The first window that starts after b's view has certainly expired: a and c may hold
    // b's share from there on, and not before.
    let earliest = window_of(removed_at_ms + EXPIRY_MS) + 1;
    let reclaim = eventually(
        "b's floor is reclaimed",
        || region_entry(&get_json(&leader_http, "/v1/regions"), "b")["reclaimed"]["shop/k"].clone(),
        Value::is_u64,
    )
    .await;
    eprintln!("removed at {removed_at_ms} ms (window {removal_window}), reclaimed from {reclaim}");
    let from = reclaim.as_u64().expect("checked");
    assert!(
        from >= earliest,
        "reclaimed from window {from}, b may admit until {}",
        earliest - 1
    );

    // Two windows past the reclaim, then b is added back 3 s into a window.
    let until = (from + 2) * WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(until.saturating_sub(now_ms()))).await;
    into_window_at(3_000).await;
    let added_at = Instant::now();
    let added_at_ms = now_ms();
    let out = cli(&["cluster", "add-region", "b", "--coordinator", &https]);
    assert!(out.status.success(), "{}", text(&out));
    eventually(
        "b is heard again",
        || b.json("/v1/status")["sync"]["connected"].clone(),
        |c| *c == true,
    )
    .await;
    let heard_after = added_at.elapsed();
    let regions = get_json(&leader_http, "/v1/regions");
    assert_eq!(region_entry(&regions, "b")["removed"], false, "{regions}");
    // Two more windows, for b to take its share again.
    let until = (window_of(added_at_ms) + 3) * WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(until.saturating_sub(now_ms()))).await;
    stop.store(true, Ordering::Relaxed);
    for l in loads {
        l.await.expect("load task");
    }
    sampler.join().expect("sampler");

    let seen = seen.lock().expect("sampler");
    let first = window_of(removed_at_ms) - 1;
    let last = window_of(now_ms()) - 1;
    let mut first_grown = None;
    let mut first_taken = None;
    eprintln!(
        "per window: the largest sums seen (the table's, read on the leader; a's and c's allowances, read together) and each agent's largest"
    );
    for w in first..=last {
        let used = seen.used.get(&w).cloned().unwrap_or_default();
        let allowance = seen.allowance.get(&w).cloned().unwrap_or_default();
        let used_sum: u64 = used.values().sum();
        let others = seen.others.get(&w).copied().unwrap_or(0);
        let table = seen.table_sum.get(&w).copied();
        let b_table = seen.b_table_min.get(&w).copied();
        eprintln!(
            "window {w}{}: table sum {table:?} (b at least {b_table:?}), admitted {used:?} = {used_sum}, allowances {allowance:?}, a + c = {others}",
            match w {
                _ if w == removal_window => " (removal)",
                _ if w == window_of(added_at_ms) => " (add-back)",
                _ => "",
            }
        );
        assert!(used_sum <= QUOTA_UNITS, "window {w} admitted {used_sum}");
        assert!(
            table.is_none_or(|t| t <= QUOTA_UNITS),
            "window {w}: table sum {table:?}"
        );
        // b's share leaves it in the table (it always holds what it used, so only a reclaim
        // takes it to 0), then a and c hold it. Before the removal, how the quota is shared
        // is the rebalancer's ordinary business.
        if w >= removal_window && b_table == Some(0) && first_taken.is_none() {
            first_taken = Some(w);
        }
        let taken = first_taken.is_some_and(|t| w >= t);
        if taken && others > OTHERS_WITHOUT_B_SHARE_UNITS && first_grown.is_none() {
            first_grown = Some(w);
        }
    }
    eprintln!(
        "a and c first hold b's share in window {first_grown:?}; b heard {heard_after:?} after add-region"
    );
    let first_taken = first_taken.expect("b's share leaves it in the table");
    assert!(
        first_taken >= earliest,
        "b's share taken in {first_taken}, b may admit until {}",
        earliest - 1
    );
    assert_eq!(first_taken, from, "taken by the reclaim");
    assert_eq!(
        first_grown,
        Some(from),
        "a and c grow into b's share as soon as it is free"
    );
    // Back: b admits in the windows after its add-back.
    let back_window = window_of(added_at_ms) + 1;
    let b_back = seen
        .used
        .get(&back_window)
        .and_then(|u| u.get("b"))
        .copied()
        .unwrap_or(0);
    assert!(
        b_back > 0,
        "b admits again in window {back_window}: {seen:?}"
    );
}
