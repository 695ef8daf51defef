//! Whole-cluster restarts on real processes (slow tier, `ALLOT_SLOW_TESTS=1`): three `allot
//! coordinator` processes and three `allot agent` processes (regions `a`, `b`, `c`) on
//! loopback, under the bench load generator (`allot_bench::loadgen`, as a library) on a strict
//! and an eventual limit, demand moving between regions (`support/loaded.rs`, shared with
//! `tests/leader_kill.rs`).
//!
//! Every node is SIGKILLed together three times, each time after rebalancing rounds have
//! grown a region's allowance: 3 s into a window; just after a round committed on the leader
//! (its followers may not have applied it: the round comes near the window's end, where the
//! leader pre-issues the next window); and 3 s into a window again, with one
//! node restarted from a copy of its directory taken during the first outage (it comes back
//! behind the others). The agents serve their load through each outage on their partition
//! policies; the nodes are restarted once every agent's view has expired.
//!
//! What is checked exactly: every node's `/v1/status` reads its table under one lock with the
//! index it was applied at, so two reads at one index must show one table, before and after a
//! restart, on every node, the old copy included; after each restart every node reaches the
//! largest index any node showed before the kill (nothing committed is lost, also the round
//! the nasty kill followed), at the same configuration version. A table read after the restart
//! at a larger index may differ from the last one before the kill, but only by entries
//! committed after it: the reads between give no other way to tell, so the test reports how
//! many indices it saw on both sides. No read shows a counter's allowances (default share
//! where no row) summing above its quota. After each restart a leader commits a round with
//! table commands and every agent is connected again with a fresh view; and per window, from
//! the agents' counters and the grants the load saw, admitted at most the quota plus the bound
//! the leaders stated (strict: at most the quota), with no failed call. A window that ended
//! between a kill and the next leader has no bound (docs/bound.md): there only the strict
//! limit is judged.

mod support;

#[path = "support/loaded.rs"]
mod loaded;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use loaded::{
    Cluster, DEFAULT_SHARE_UNITS, LIMITS, Load, Phase, QUOTA_UNITS, REGIONS, STRICT_KEY, TableSeen,
    Watched, at_next_window, check, report, try_json, unix_ms, windows,
};
use support::{Process, eventually, slow_tier};

/// How far into a window every node is killed: the nodes are back and a leader elected well
/// before the window ends (the views expire about 2 s after the kill, then a leader takes
/// 3-4 s: an election after its followers' leases),
/// so that a leader states the window's bound while it runs (docs/bound.md, "Windows without a
/// leader").
const KILL_INTO_MS: u64 = 3_000;

/// How the nodes die.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// At `KILL_INTO_MS` into a window.
    MidWindow,
    /// As soon as the leader shows a round applied: its followers may not know it committed.
    AfterRound,
    /// Mid-window, and node `.0` restarts from the copy of its directory taken during the
    /// first outage.
    OldCopy(u64),
}

/// One outage's figures.
#[derive(Debug)]
struct Outage {
    kill: Kill,
    /// Unix ms of the kill and of the restart.
    killed_at_ms: u64,
    restarted_at_ms: u64,
    into_window_ms: u64,
    /// The largest applied index any node showed before the kill.
    index_before: u64,
    /// From the kill until every agent's view had expired.
    views_expired_after: Duration,
    /// From the kill to the restart.
    down_for: Duration,
    /// From the restart until a leader's rebalancer ran, and when (unix ms).
    leader_after: Duration,
    leader_at_ms: u64,
    /// From the restart until a round with table commands committed and every agent was
    /// connected with a fresh view.
    resumed_after: Duration,
}

/// The current window's rows of the strict counter on the leader, when one leads.
fn strict_rows_now(cluster: &Cluster) -> Option<BTreeMap<String, u64>> {
    let (id, s) = cluster.leader(None)?;
    let t = TableSeen::from_status(id, &s)?;
    let window = unix_ms() / loaded::WINDOW_MS;
    t.rows.get(&(STRICT_KEY.to_owned(), window)).cloned()
}

/// Waits until rebalancing has grown some region's allowance of the strict counter of the
/// current window past its default share.
async fn grown(cluster: &Cluster) -> BTreeMap<String, u64> {
    eventually(
        "a region's allowance grows past its default share",
        || strict_rows_now(cluster),
        |rows| {
            rows.as_ref()
                .is_some_and(|r| r.values().any(|u| *u > DEFAULT_SHARE_UNITS))
        },
    )
    .await
    .expect("checked")
}

/// Kills the nodes as `kill` says: for `AfterRound`, the moment the leader's status shows an
/// index past the one it showed when asked first, with that status kept as a table read.
fn kill_nodes(cluster: &mut Cluster, kill: Kill, watched: &std::sync::Mutex<Watched>) -> Instant {
    if kill != Kill::AfterRound {
        return cluster.kill_all();
    }
    let (leader, first) = cluster.leader(None).expect("a leader");
    let http = cluster.running[&leader].http.clone();
    let index = |s: &serde_json::Value| s["last_applied_index"].as_u64().unwrap_or(0);
    let from = index(&first);
    let deadline = Instant::now() + support::PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "no round on the leader");
        let Some(s) = try_json(&http, "/v1/status") else {
            continue;
        };
        if index(&s) > from && s["state"] == "leader" {
            let at = cluster.kill_all();
            watched.lock().expect("watched").take_status(leader, &s);
            return at;
        }
    }
}

/// Copies node directories with `cp -a` (sled files, as the kill left them).
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let out = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .expect("cp runs");
    assert!(out.status.success(), "cp: {out:?}");
}

/// Every node killed, the agents left on their partition policies until every view expired,
/// then every node restarted from its directory (`OldCopy`: one from its old copy); returns
/// once a leader committed a round with table commands and every agent is connected with a
/// fresh view. Meanwhile it reads every node's status as often as it can, so that the table
/// each restarted node starts with is seen.
async fn outage(
    cluster: &mut Cluster,
    agents: &BTreeMap<&'static str, Process>,
    load: &Load,
    kill: Kill,
) -> Outage {
    let killed = kill_nodes(cluster, kill, &load.watched);
    let killed_at_ms = unix_ms();
    let into_window_ms = killed_at_ms % loaded::WINDOW_MS;
    for agent in agents.values() {
        eventually(
            "the agent's view expires (its partition policy applies)",
            || agent.json("/v1/status")["sync"]["view_expired"].clone(),
            |e| *e == true,
        )
        .await;
    }
    let views_expired_after = killed.elapsed();
    match kill {
        Kill::MidWindow => {
            for id in 1..=3 {
                let dir = cluster.data_dir(id);
                copy_dir(&dir, &dir.with_extension("old"));
            }
        }
        Kill::OldCopy(id) => {
            let dir = cluster.data_dir(id);
            std::fs::remove_dir_all(&dir).expect("remove");
            copy_dir(&dir.with_extension("old"), &dir);
        }
        Kill::AfterRound => {}
    }
    let down_for = killed.elapsed();
    let restarted = Instant::now();
    let restarted_at_ms = unix_ms();
    for id in 1..=3 {
        cluster.restart(id);
    }
    let index_before = {
        let w = load.watched.lock().expect("watched");
        let before = w.tables.iter().filter(|t| t.at_ms <= killed_at_ms);
        before.map(|t| t.applied_index).max().unwrap_or(0)
    };

    // Every node's status as fast as it answers, until a leader's rebalancer runs.
    let deadline = Instant::now() + support::PATIENCE;
    let leader = loop {
        assert!(Instant::now() < deadline, "no leader after the restart");
        let mut leader = None;
        for (id, p) in &cluster.running {
            let Some(s) = try_json(&p.http, "/v1/status") else {
                continue;
            };
            load.watched.lock().expect("watched").take_status(*id, &s);
            if s["state"] == "leader" && s["limits"].is_array() {
                leader = Some(*id);
            }
        }
        if let Some(id) = leader {
            break id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let leader_after = restarted.elapsed();
    let leader_at_ms = unix_ms();
    let node = &cluster.running[&leader];
    eventually(
        "the leader commits a rebalancing round after the restart",
        || node.metric("allot_coordinator_round_commands_total"),
        |n| *n > 0.0,
    )
    .await;
    for agent in agents.values() {
        eventually(
            "the agent is connected again with a fresh view",
            || agent.json("/v1/status")["sync"].clone(),
            |s| s["connected"] == true && s["view_expired"] == false,
        )
        .await;
    }
    Outage {
        kill,
        killed_at_ms,
        restarted_at_ms,
        into_window_ms,
        index_before,
        views_expired_after,
        down_for,
        leader_after,
        leader_at_ms,
        resumed_after: restarted.elapsed(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_killed_together_comes_back_with_its_table_and_the_agents_resume() {
    if !slow_tier() {
        return;
    }
    let started = Instant::now();
    let dir = support::scratch("cluster_restart", "under_load", Some(LIMITS));
    let mut cluster = Cluster::start(&dir);
    let agents: BTreeMap<&'static str, Process> = REGIONS
        .iter()
        .map(|r| (*r, Process::agent(&dir, r, Some(&cluster.grpc_list()))))
        .collect();
    eventually("a leader", || cluster.leader(None), Option::is_some).await;
    for agent in agents.values() {
        agent.synced().await;
    }
    let load = Load::start(&cluster, &agents, "a");
    let mut outages = Vec::new();
    // Demand moves to b a window before the kill.
    load.phase.send_replace(Phase::Hot("b"));
    at_next_window(KILL_INTO_MS).await;
    let rows = grown(&cluster).await;
    eprintln!("before the mid-window kill: strict rows {rows:?}");
    outages.push(outage(&mut cluster, &agents, &load, Kill::MidWindow).await);
    // Demand moves to c as the kill is due. The next round comes near the window's end, when
    // the leader pre-issues the next window's allowances (the quota is all allotted, and the
    // rebalancer moves it at window starts): the outage spans the window's end, which no
    // leader then bounds, so that window's eventual limit is left unjudged.
    at_next_window(KILL_INTO_MS).await;
    let rows = grown(&cluster).await;
    eprintln!("before the kill after a round: strict rows {rows:?}");
    load.phase.send_replace(Phase::Hot("c"));
    outages.push(outage(&mut cluster, &agents, &load, Kill::AfterRound).await);
    // The node that leads now restarts from its copy of the first outage.
    load.phase.send_replace(Phase::Hot("a"));
    at_next_window(KILL_INTO_MS).await;
    grown(&cluster).await;
    let (leader, _) = cluster.leader(None).expect("a leader");
    outages.push(outage(&mut cluster, &agents, &load, Kill::OldCopy(leader)).await);

    // A window more of load, then everything stops.
    tokio::time::sleep(Duration::from_millis(loaded::WINDOW_MS)).await;
    // Every node, the old copy's included, catches up with the others.
    let (_, status) = cluster.leader(None).expect("a leader");
    let index = status["last_applied_index"].as_u64().expect("an index");
    for (id, p) in &cluster.running {
        eventually(
            "the node applies what the leader applied",
            || try_json(&p.http, "/v1/status").and_then(|s| s["last_applied_index"].as_u64()),
            |i| i.is_some_and(|i| i >= index),
        )
        .await;
        eprintln!("node {id} caught up to index {index}");
    }
    let (watched, ledger) = load.stop().await;

    let watched = watched.lock().expect("watched");
    let ledger = ledger.lock().expect("ledger");
    let rows = windows(&watched, &ledger);
    report(&rows);
    let seen_across = report_outages(&watched, &outages);
    eprintln!(
        "{} table reads; took {:?}",
        watched.tables.len(),
        started.elapsed()
    );
    assert!(
        ledger.errors.is_empty(),
        "failed calls: {:?}",
        ledger.errors
    );
    check_tables(&watched.tables, &outages);
    // Windows that ended between a kill and the next leader.
    let leaderless_ends: std::collections::BTreeSet<u64> = rows
        .iter()
        .map(|r| r.window)
        .filter(|w| {
            let end = loaded::window_end_ms(*w);
            outages
                .iter()
                .any(|o| o.killed_at_ms <= end && end <= o.leader_at_ms)
        })
        .collect();
    eprintln!("windows that ended with no leader (eventual left unjudged): {leaderless_ends:?}");
    check(&rows, &leaderless_ends);
    assert!(
        seen_across > 0,
        "no index was read both before and after a restart"
    );
}

/// The table reads: no counter above its quota, one table per applied index, and after each
/// restart every node at least at the largest index seen before its kill, at the same
/// configuration version.
fn check_tables(tables: &[TableSeen], outages: &[Outage]) {
    let mut failures = Vec::new();
    let mut by_index: BTreeMap<u64, &TableSeen> = BTreeMap::new();
    for t in tables {
        for (counter, sum) in t.sums() {
            if sum > QUOTA_UNITS {
                failures.push(format!(
                    "node {} at index {}: {counter:?} sums to {sum} > {QUOTA_UNITS}: {:?}",
                    t.node, t.applied_index, t.rows
                ));
            }
        }
        let first = by_index.entry(t.applied_index).or_insert(t);
        let same = (first.config_version, &first.rows, &first.members)
            == (t.config_version, &t.rows, &t.members);
        if !same {
            failures.push(format!(
                "index {}: node {} read {:?} (version {}), node {} read {:?} (version {})",
                t.applied_index,
                first.node,
                first.rows,
                first.config_version,
                t.node,
                t.rows,
                t.config_version
            ));
        }
    }
    for (i, o) in outages.iter().enumerate() {
        let until = outages.get(i + 1).map_or(u64::MAX, |n| n.killed_at_ms);
        let version_before = tables
            .iter()
            .filter(|t| t.at_ms <= o.killed_at_ms)
            .map(|t| t.config_version)
            .max();
        for id in 1..=3 {
            let after: Vec<&TableSeen> = tables
                .iter()
                .filter(|t| t.node == id && t.at_ms > o.restarted_at_ms && t.at_ms < until)
                .collect();
            let reached = after.iter().map(|t| t.applied_index).max();
            if reached.is_none_or(|r| r < o.index_before) {
                failures.push(format!(
                    "{:?}: node {id} reached index {reached:?} after the restart, below {} \
                     before the kill",
                    o.kill, o.index_before
                ));
            }
            if let Some(t) = after
                .iter()
                .find(|t| Some(t.config_version) != version_before)
            {
                failures.push(format!(
                    "{:?}: node {id} at version {} after the restart, {version_before:?} before",
                    o.kill, t.config_version
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each outage's figures, and how many applied indices were read both before its kill and
/// after its restart (where the check compares the two tables row for row); returns the
/// total.
fn report_outages(watched: &Watched, outages: &[Outage]) -> usize {
    let mut total = 0;
    for o in outages {
        let before: std::collections::BTreeSet<u64> = watched
            .tables
            .iter()
            .filter(|t| t.at_ms <= o.killed_at_ms)
            .map(|t| t.applied_index)
            .collect();
        let after = watched
            .tables
            .iter()
            .filter(|t| t.at_ms > o.restarted_at_ms)
            .map(|t| t.applied_index);
        let both: std::collections::BTreeSet<u64> = after.filter(|i| before.contains(i)).collect();
        let last_seen_again = both.contains(&o.index_before);
        total += both.len();
        eprintln!(
            "{:?}: killed {} ms into its window at index {}; every view expired after {:?}, \
             restarted after {:?}; a leader {:?} after the restart, the agents resumed after \
             {:?}; {} indices read on both sides (the last before the kill: {last_seen_again})",
            o.kill,
            o.into_window_ms,
            o.index_before,
            o.views_expired_after,
            o.down_for,
            o.leader_after,
            o.resumed_after,
            both.len()
        );
    }
    total
}
