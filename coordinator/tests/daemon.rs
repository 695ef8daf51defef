//! The daemon in one process on loopback ports: the leader's rebalancer answers an agent's
//! SyncUp only from committed state, a follower names the leader, and after the leader's node
//! stops a new leader's rebalancer (a larger term) takes over.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use allot_coordinator::daemon::leader::probe_bridge;
use allot_coordinator::daemon::limits::StartLimits;
use allot_coordinator::daemon::{Daemon, DaemonSettings};
use allot_coordinator::{ClusterState, NodeId};
use allot_core::ids::{KeyId, LimitId, RegionId};
use allot_core::limit::{LimitSpec, RegionWeights};
use allot_core::rebalance::CoordinatorConfig;
use allot_core::sync::{ClockSample, CounterEntry, CounterRef, DemandReport, SyncDown, SyncUp};
use allot_core::time::{Timestamp, Window};
use allot_proto::sync::v1 as pb;
use allot_proto::sync::v1::sync_client::SyncClient;
use allot_proto::sync_convert::{sync_down_from_wire, sync_up_to_wire};
use allot_proto::tls::Dialer;
use openraft::{Config, ServerState, SnapshotPolicy};
use tempfile::TempDir;
use tokio::net::TcpListener;

const HOUR: Duration = Duration::from_secs(3600);
/// Longest a test waits for an election or a commit on a loaded 2-core machine: a bound on a
/// hang, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(20);
const LIMIT: &str = "api/t";

/// Fast raft timers, so elections take about a second; heartbeats every 100 ms leave a node
/// on a loaded 2-core machine eight beats of slack before it calls an election.
fn raft_config() -> Config {
    Config {
        cluster_name: "allot-daemon-test".to_string(),
        heartbeat_interval: 100,
        election_timeout_min: 800,
        election_timeout_max: 1_600,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(100),
        ..Config::default()
    }
    .validate()
    .expect("valid raft config")
}

/// 1000 an hour, 30% each for `a` and `b`: 400 free for a grow.
fn limits() -> Vec<LimitSpec> {
    let mut spec = LimitSpec::simple(LIMIT, 1000, HOUR);
    let ppm: BTreeMap<RegionId, u32> = [("a", 300_000), ("b", 300_000)]
        .into_iter()
        .map(|(r, w)| (RegionId::from(r), w))
        .collect();
    spec.weights = RegionWeights::new(ppm).expect("weights");
    vec![spec]
}

async fn start(
    id: NodeId,
    dir: &Path,
    grpc: TcpListener,
    peers: BTreeMap<NodeId, String>,
) -> Daemon {
    start_with(id, dir, grpc, peers, CoordinatorConfig::default()).await
}

async fn start_with(
    id: NodeId,
    dir: &Path,
    grpc: TcpListener,
    peers: BTreeMap<NodeId, String>,
    rebalance: CoordinatorConfig,
) -> Daemon {
    let settings = DaemonSettings {
        id,
        peers,
        join: false,
        data_dir: dir.join(format!("node-{id}")),
        raft: raft_config(),
        rebalance,
        limits: Some(StartLimits::Specs {
            version: 1,
            limits: limits(),
        }),
        tls: None,
        admin_token_sha256: None,
        read_token_sha256: None,
        admin_tls: false,
    };
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    Daemon::start(settings, grpc, http)
        .await
        .expect("daemon starts")
}

fn now() -> Timestamp {
    allot_coordinator::sync_service::system_now()
}

fn counter(at: Timestamp) -> CounterRef {
    CounterRef {
        limit: LimitId::from(LIMIT),
        key: KeyId::from("t=1"),
        window: Window::new(HOUR).index(at),
    }
}

/// `region` has used all of its 300 and wants more.
fn up(region: &str, seq: u64) -> SyncUp {
    let at = now();
    SyncUp {
        region: RegionId::from(region),
        boot: 1,
        seq,
        sent_at: at,
        config_version: 1,
        entries: vec![CounterEntry {
            counter: counter(at),
            region: RegionId::from(region),
            granted_units: 300,
            refunded_units: 0,
        }],
        demand: vec![DemandReport {
            counter: counter(at),
            demand_micro_units_per_sec: 10_000_000,
            allowance_units: 300,
        }],
        release_acks: Vec::new(),
        clock: None,
        clock_leader_term: 0,
        stats: Vec::new(),
        view_expired: false,
        restored: false,
        clock_guard: None,
    }
}

/// Sends one SyncUp on a new stream; the first answer, or the status that ended the stream.
async fn send(addr: SocketAddr, up: SyncUp) -> Result<pb::sync_answer::Answer, tonic::Status> {
    let mut client = SyncClient::connect(format!("http://{addr}"))
        .await
        .expect("connects");
    let mut answers = client
        .stream(tokio_stream::iter([sync_up_to_wire(up)]))
        .await?
        .into_inner();
    match answers.message().await? {
        Some(a) => Ok(a.answer.expect("an answer")),
        None => Err(tonic::Status::unknown("the stream ended without an answer")),
    }
}

/// Sends SyncUps until one is answered with a SyncDown (the rebalancer may be starting).
async fn sync_down(addr: SocketAddr, region: &str) -> SyncDown {
    let deadline = Instant::now() + PATIENCE;
    let mut seq = 1;
    loop {
        let answer = send(addr, up(region, seq)).await;
        if let Ok(pb::sync_answer::Answer::SyncDown(down)) = answer {
            return sync_down_from_wire(down).expect("converts");
        }
        assert!(Instant::now() < deadline, "never answered: {answer:?}");
        seq += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: never held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The leader some live node names, if it is one of them.
fn leader_of(nodes: &BTreeMap<NodeId, Daemon>) -> Option<NodeId> {
    nodes
        .values()
        .find_map(|d| d.raft().metrics().borrow().current_leader)
        .filter(|l| nodes.contains_key(l))
}

/// Waits until every live node names one leader and that node holds the role itself.
async fn agreed_leader(nodes: &BTreeMap<NodeId, Daemon>) -> NodeId {
    let agreed = || {
        let named: BTreeSet<Option<NodeId>> = nodes
            .values()
            .map(|d| d.raft().metrics().borrow().current_leader)
            .collect();
        let [Some(l)] = named.into_iter().collect::<Vec<_>>()[..] else {
            return None;
        };
        let leads = nodes.get(&l)?.raft().metrics().borrow().state == ServerState::Leader;
        leads.then_some(l)
    };
    wait_for("an agreed leader", || agreed().is_some()).await;
    agreed().expect("checked")
}

/// Stops `leader`'s node and waits for the others to agree on a new one, which it returns.
async fn stop_and_elect(nodes: &mut BTreeMap<NodeId, Daemon>, leader: NodeId) -> NodeId {
    nodes
        .remove(&leader)
        .expect("the leader")
        .shutdown()
        .await
        .expect("stops");
    let next = agreed_leader(nodes).await;
    assert_ne!(next, leader);
    next
}

fn state(d: &Daemon) -> ClusterState {
    d.state().read(|a| a.state.clone())
}

/// Three nodes on loopback, each knowing the others, by id; with their raft and sync
/// addresses.
async fn start_three(dir: &Path) -> (BTreeMap<NodeId, Daemon>, BTreeMap<NodeId, String>) {
    start_three_with(dir, CoordinatorConfig::default()).await
}

async fn start_three_with(
    dir: &Path,
    rebalance: CoordinatorConfig,
) -> (BTreeMap<NodeId, Daemon>, BTreeMap<NodeId, String>) {
    let mut listeners = BTreeMap::new();
    let mut peers = BTreeMap::new();
    for id in 1..=3 {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        peers.insert(id, l.local_addr().expect("address").to_string());
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for (id, l) in listeners {
        let node = start_with(id, dir, l, peers.clone(), rebalance.clone()).await;
        nodes.insert(id, node);
    }
    (nodes, peers)
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    http_get_with_head(addr, path).1
}

/// A leader absent from the last clock frame probes the nodes in it (D50): a real probe over
/// the raft service. One machine, one clock: the sample is within its round trip of 0. A node
/// that does not answer is passed over, and a node of another cluster gives no bridge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_probe_samples_a_node_that_answers_and_skips_the_others() {
    let dir = TempDir::new().expect("temporary directory");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = grpc.local_addr().expect("address").to_string();
    let _d = start(1, dir.path(), grpc, BTreeMap::new()).await;
    let cluster = raft_config().cluster_name.clone();
    let silent = "127.0.0.1:1".to_owned();
    let candidates = vec![(9, silent.clone()), (1, addr.clone())];
    let bridge = probe_bridge(&cluster, candidates, &Dialer::plaintext())
        .await
        .expect("node 1 answers");
    assert_eq!(bridge.via, 1);
    let error_nanos = i64::try_from(bridge.sample.round_trip_nanos / 2).expect("small") + 1_000_000;
    assert!(
        bridge.sample.offset_nanos.abs() <= error_nanos,
        "one clock: {:?}",
        bridge.sample
    );
    assert_eq!(
        probe_bridge(&cluster, vec![(9, silent)], &Dialer::plaintext()).await,
        None
    );
    assert_eq!(
        probe_bridge("another", vec![(1, addr)], &Dialer::plaintext()).await,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_grants_only_what_it_committed_and_reports_the_region() {
    let dir = TempDir::new().expect("temporary directory");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = grpc.local_addr().expect("address");
    let d = start(1, dir.path(), grpc, BTreeMap::new()).await;
    // The limits are put (at version 1) once the node leads; the regions they name join.
    wait_for("limits put", || state(&d).table().config_version() == 1).await;
    assert_eq!(state(&d).regions().len(), 2);

    let down = sync_down(addr, "a").await;
    let grant = down.grants.first().expect("a grow in the answer");
    assert!(grant.allowance_units > 300, "{grant:?}");
    // Read at once: the answer was built after the grow committed and applied here.
    let table = state(&d).table().clone();
    assert_eq!(
        table.allowance(&grant.counter, &grant.region),
        grant.allowance_units
    );
    // The raft term above, the rebalancer's start entry below.
    assert_eq!(
        down.leader_term >> 32,
        d.raft().metrics().borrow().current_term
    );

    // A region the configuration does not name: the stream ends with a clear status.
    let refused = send(addr, up("mars", 1)).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("unknown region mars"),
        "{refused:?}"
    );
    assert_eq!(state(&d).table(), &table);

    let status: serde_json::Value =
        serde_json::from_str(&http_get(d.http_addr(), "/v1/status")).expect("JSON");
    assert_eq!(status["state"], "leader", "{status}");
    let a = &status["regions"][0];
    assert_eq!(a["region"], "a", "{status}");
    assert!(a["sync_lag_ms"].as_u64().is_some(), "{status}");
    assert!(status["regions"][1]["sync_lag_ms"].is_null(), "{status}");
    let bound = &status["limits"][0]["bound"];
    assert_eq!(bound["limit"], LIMIT, "{status}");
    assert!(
        bound["terms"].as_array().is_some_and(|t| !t.is_empty()),
        "{status}"
    );
    // An agent on another configuration version is answered, and counted.
    let mut other = up("a", 100);
    other.config_version = 2;
    assert!(matches!(
        send(addr, other).await,
        Ok(pb::sync_answer::Answer::SyncDown(_))
    ));
    let metrics = http_get(d.http_addr(), "/metrics");
    assert!(
        metrics.contains("allot_coordinator_rounds_total"),
        "{metrics}"
    );
    let counted = metrics
        .lines()
        .find(|l| l.starts_with("allot_coordinator_other_version_sync_ups_total "))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(counted >= Some(1.0), "{metrics}");
    d.shutdown().await.expect("stops");
}

/// A region's first sample is recorded in a frame at once, not at the next interval: a leader
/// lost before then would take the only sample of the region's boot along, and a restore of
/// that boot would get no reach (D74). The interval here is an hour, so only the first
/// sample's own frame can hold it; a region already framed records nothing per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_first_clock_sample_is_framed_at_once_and_later_ones_wait_for_the_interval() {
    let dir = TempDir::new().expect("temporary directory");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = grpc.local_addr().expect("address");
    let rebalance = CoordinatorConfig {
        clock_frame_interval: HOUR,
        ..CoordinatorConfig::default()
    };
    let d = start_with(1, dir.path(), grpc, BTreeMap::new(), rebalance).await;
    wait_for("limits put", || state(&d).table().config_version() == 1).await;
    // With no frame to replace, the leader records one at once: it holds no region yet.
    wait_for("the leader's first frame", || {
        state(&d).clock_source().is_some()
    })
    .await;
    let a = RegionId::from("a");
    assert!(!state(&d).clocks().contains_key(&a));
    let term = sync_down(addr, "a").await.leader_term;

    let sampled = |seq: u64, offset_nanos: i64| {
        let mut up = up("a", seq);
        up.clock = Some(ClockSample {
            offset_nanos,
            round_trip_nanos: 10_000_000,
        });
        up.clock_leader_term = term;
        up
    };
    assert!(matches!(
        send(addr, sampled(100, 2_000_000_000)).await,
        Ok(pb::sync_answer::Answer::SyncDown(_))
    ));
    let offset_framed = |d: &Daemon| state(d).clocks().get(&a).map(|c| c.sample.offset_nanos);
    wait_for("a's first sample in a frame", || {
        offset_framed(&d) == Some(2_000_000_000)
    })
    .await;

    // A later sample of a region already framed waits for the next interval.
    assert!(matches!(
        send(addr, sampled(101, 3_000_000_000)).await,
        Ok(pb::sync_answer::Answer::SyncDown(_))
    ));
    let _ = sync_down(addr, "a").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(offset_framed(&d), Some(2_000_000_000));
    d.shutdown().await.expect("stops");
}

/// A region restored from a copy, heard by a leader that records its next frame and is lost
/// before its answer reaches the region (the answer dropped here): the frame carries the
/// sample of the region's boot before, so the next leader's answer to the restored boot still
/// says how far the lost copy's clock may read (D74). The frame recorded after the restart
/// held nothing of the region before, and replaced the one that did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_recorded_before_a_restored_boots_answer_keeps_its_boot_befores_clock() {
    let dir = TempDir::new().expect("temporary directory");
    let rebalance = CoordinatorConfig {
        clock_frame_interval: Duration::from_millis(300),
        ..CoordinatorConfig::default()
    };
    let (mut nodes, _) = start_three_with(dir.path(), rebalance).await;
    let first = agreed_leader(&nodes).await;
    wait_for("limits put", || {
        state(&nodes[&first]).table().config_version() == 1
    })
    .await;
    let term = sync_down(nodes[&first].grpc_addr(), "a").await.leader_term;
    let mut sampled = up("a", 50);
    sampled.clock = Some(ClockSample {
        offset_nanos: 2_000_000_000,
        round_trip_nanos: 10_000_000,
    });
    sampled.clock_leader_term = term;
    assert!(matches!(
        send(nodes[&first].grpc_addr(), sampled).await,
        Ok(pb::sync_answer::Answer::SyncDown(_))
    ));
    let mut restored = up("a", 1);
    restored.boot = 2;
    restored.restored = true;
    // Answered, but the answer is dropped: the restored boot never learns the reach.
    let Ok(pb::sync_answer::Answer::SyncDown(answer)) =
        send(nodes[&first].grpc_addr(), restored.clone()).await
    else {
        panic!("the leader answers");
    };
    let answer = sync_down_from_wire(answer).expect("converts");
    assert!(answer.earlier_boot_clock_reach.is_some());
    let heard_restored = Instant::now();
    // A frame the leader records after it heard the restored boot (every 300 ms here).
    let follower = *nodes.keys().find(|id| **id != first).expect("three");
    wait_for("a frame recorded after the restore was heard", || {
        heard_restored.elapsed() > Duration::from_millis(1_000)
            && state(&nodes[&follower])
                .clocks()
                .get(&RegionId::from("a"))
                .is_some_and(|c| c.sample.offset_nanos == 2_000_000_000)
    })
    .await;

    let second = stop_and_elect(&mut nodes, first).await;
    let Ok(pb::sync_answer::Answer::SyncDown(down)) =
        send(nodes[&second].grpc_addr(), restored).await
    else {
        panic!("the new leader answers");
    };
    let down = sync_down_from_wire(down).expect("converts");
    let reach = down
        .earlier_boot_clock_reach
        .expect("a reach from the frame");
    // 2 s behind the answer's time, less half the round trip and the drift since.
    let behind = down.sent_at.as_unix_nanos() - reach.as_unix_nanos();
    assert!(
        (1_000_000_000..=2_000_000_000).contains(&behind),
        "{reach:?} against {:?}",
        down.sent_at
    );
    for (_, d) in nodes {
        d.shutdown().await.expect("stops");
    }
}

/// A region restored from a copy numbered below the boot it superseded (boot 15 after 20),
/// then a leader change, then a late message of the dead boot 20 at the new leader: the new
/// leader, which starts from the boots the first one committed before answering (D78), takes
/// it for an old message. Without them it took boot 20 for a restart, and the live boot's
/// messages for old ones from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_a_late_message_of_a_boot_a_restore_superseded_for_an_old_one() {
    let dir = TempDir::new().expect("temporary directory");
    let (mut nodes, _) = start_three(dir.path()).await;
    let first = agreed_leader(&nodes).await;
    wait_for("limits put", || {
        state(&nodes[&first]).table().config_version() == 1
    })
    .await;
    let at_boot = |boot: u64, seq: u64, restored: bool| {
        let mut up = up("a", seq);
        up.boot = boot;
        up.restored = restored;
        up
    };
    let answered = |answer: Result<pb::sync_answer::Answer, tonic::Status>| {
        assert!(
            matches!(answer, Ok(pb::sync_answer::Answer::SyncDown(_))),
            "{answer:?}"
        );
    };
    answered(send(nodes[&first].grpc_addr(), at_boot(20, 1, false)).await);
    answered(send(nodes[&first].grpc_addr(), at_boot(15, 1, true)).await);
    answered(send(nodes[&first].grpc_addr(), at_boot(15, 2, false)).await);
    let boots_of_a = |d: &Daemon| {
        let kept = state(d).boots().get(&RegionId::from("a")).cloned();
        kept.map(|k| (k.boots.boot, k.boots.retired, k.boots.restored))
    };
    // Committed before each answer: on the leader at once.
    assert_eq!(boots_of_a(&nodes[&first]), Some((15, vec![20], false)));

    let second = stop_and_elect(&mut nodes, first).await;
    answered(send(nodes[&second].grpc_addr(), at_boot(15, 3, false)).await);
    let late = send(nodes[&second].grpc_addr(), at_boot(20, 9, false)).await;
    answered(send(nodes[&second].grpc_addr(), at_boot(15, 4, false)).await);
    assert_eq!(
        boots_of_a(&nodes[&second]),
        Some((15, vec![20], false)),
        "the late message of boot 20 ({late:?}) was taken for a restart"
    );
    // An operator reads them in the status, on any node.
    let status = http_get(nodes[&second].http_addr(), "/v1/status");
    assert!(
        status.contains("\"boots\":{\"boot\":15,\"retired\":[20],\"restored\":false}"),
        "{status}"
    );
    for (_, d) in nodes {
        d.shutdown().await.expect("stops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_names_the_leader_and_a_new_leader_takes_over_with_a_larger_term() {
    let dir = TempDir::new().expect("temporary directory");
    let (mut nodes, peers) = start_three(dir.path()).await;
    // Leadership may move before the checks run (an election in a loaded machine's pause):
    // a follower must then name whichever node leads now, so the check is retried until a
    // leader stays put through it.
    let deadline = Instant::now() + PATIENCE;
    let first = loop {
        let first = agreed_leader(&nodes).await;
        wait_for("limits put", || {
            state(&nodes[&first]).table().config_version() == 1
        })
        .await;
        let follower = nodes
            .keys()
            .copied()
            .find(|id| *id != first)
            .expect("three");
        let redirect = send(nodes[&follower].grpc_addr(), up("a", 1)).await;
        // A configuration put on a follower commits nothing: 421, naming the leader.
        let (line, body) = http_put(nodes[&follower].http_addr(), &config_put(5));
        assert_eq!(state(&nodes[&follower]).table().config_version(), 1);
        let named = match &redirect {
            Ok(pb::sync_answer::Answer::NotLeader(n)) => {
                Some((n.leader_address.clone(), n.leader_node_id))
            }
            _ => None,
        };
        if named == Some((peers[&first].clone(), Some(first)))
            && line.contains("421")
            && body.contains(&peers[&first])
        {
            break first;
        }
        let now_leading = leader_of(&nodes);
        assert!(
            now_leading != Some(first) && Instant::now() < deadline,
            "a follower of a settled leader {first} answers {redirect:?}, {line} {body}"
        );
    };
    let before = sync_down(nodes[&first].grpc_addr(), "a").await;
    let grow = before.grants.first().expect("a grow");
    // The grow's own counter, not one built from the clock: an hour may turn during the test,
    // and the next window's counter starts at the default share.
    let (grown, grown_counter) = (grow.allowance_units, grow.counter.clone());

    // The leader records the regions' clock samples with its probes of the other nodes'
    // clocks (every 5 s): the next leader carries the samples over to its own clock by them.
    let mut sampled = up("a", 2);
    sampled.clock = Some(ClockSample {
        offset_nanos: 2_000_000_000,
        round_trip_nanos: 10_000_000,
    });
    sampled.clock_leader_term = before.leader_term;
    assert!(matches!(
        send(nodes[&first].grpc_addr(), sampled).await,
        Ok(pb::sync_answer::Answer::SyncDown(_))
    ));
    let follower = *nodes.keys().find(|id| **id != first).expect("three");
    // Both followers' clocks, and the leader's own against cluster time (D47).
    wait_for("a clock frame with every node's clock", || {
        let s = state(&nodes[&follower]);
        let from_first = s.clock_source().is_some_and(|c| {
            c.leader == first && c.leader_term == before.leader_term && c.nodes.len() == 3
        });
        from_first
            && s.clocks()
                .get(&RegionId::from("a"))
                .is_some_and(|c| c.sample.offset_nanos == 2_000_000_000)
    })
    .await;
    let status = http_get(nodes[&first].http_addr(), "/v1/status");
    assert!(status.contains("\"node_clocks\":[{\"node\":"), "{status}");
    // The version the leader heard `a` on is replicated (D64): a follower holds it, and
    // states it, before it ever leads.
    wait_for("a's version recorded on a follower", || {
        state(&nodes[&follower])
            .table()
            .recorded_version(&RegionId::from("a"))
            == Some(1)
    })
    .await;
    let status = http_get(nodes[&follower].http_addr(), "/v1/status");
    assert!(
        status.contains("\"removed\":false,\"recorded_version\":1"),
        "{status}"
    );
    let source = state(&nodes[&follower])
        .clock_source()
        .cloned()
        .expect("a frame");
    for n in &source.nodes {
        // One machine, one clock: each probe finds the other node within its round trip.
        assert!(
            n.sample.offset_nanos.unsigned_abs() <= n.sample.round_trip_nanos.max(1_000_000),
            "{n:?}"
        );
    }

    // The leader's node stops; another is elected and its rebalancer answers from the
    // replicated table under a larger term (agents resend everything on seeing it).
    let second = stop_and_elect(&mut nodes, first).await;
    let after = sync_down(nodes[&second].grpc_addr(), "a").await;
    assert!(after.leader_term > before.leader_term, "{after:?}");
    // The new leader started from the recorded frame: a's sample, carried over by the old
    // leader's probe of this node (one clock here: the same offset, within the probe's error),
    // is in its own frame though a has sent it no sample.
    wait_for("the new leader's frame with a's carried sample", || {
        let s = state(&nodes[&second]);
        let from_second = s.clock_source().is_some_and(|c| c.leader == second);
        from_second
            && s.clocks().get(&RegionId::from("a")).is_some_and(|c| {
                c.sample.offset_nanos.abs_diff(2_000_000_000) <= 5_000_000
                    && c.sample.round_trip_nanos >= 10_000_000
            })
    })
    .await;
    assert_eq!(
        state(&nodes[&second])
            .table()
            .allowance(&grown_counter, &RegionId::from("a")),
        grown
    );
    // `a` restored from an old copy: the new leader's answer says how far the clock of its
    // boot before may read now, from the carried sample (2 s behind cluster time), with half
    // its round trip, the probe's error and 1% drift since (the test's few seconds) on top.
    let mut restored = up("a", 1);
    restored.boot = 2;
    restored.restored = true;
    let Ok(pb::sync_answer::Answer::SyncDown(down)) =
        send(nodes[&second].grpc_addr(), restored).await
    else {
        panic!("the leader answers");
    };
    let down = sync_down_from_wire(down).expect("converts");
    let reach = down.earlier_boot_clock_reach.expect("a reach");
    let behind = |t: Timestamp| down.sent_at.as_unix_nanos() - t.as_unix_nanos();
    assert!(
        (1_000_000_000..=2_000_000_000).contains(&behind(reach)),
        "{reach:?} against {:?}",
        down.sent_at
    );

    // A put on the new leader commits version 2 with its files; a region still on version 1
    // gets them in its answer, one on version 2 does not.
    let (line, body) = http_put(nodes[&second].http_addr(), &config_put(500));
    assert!(line.contains("200"), "{line} {body}");
    assert!(body.contains("\"version\":2"), "{body}");
    let old = sync_down(nodes[&second].grpc_addr(), "a").await;
    assert_eq!(old.config_version, 2);
    let files = old.config.expect("the files of version 2");
    assert_eq!(files.version, 2);
    assert!(
        files.files[0].text.contains("requests_per_unit: 500"),
        "{files:?}"
    );
    let mut current = up("a", 1_000);
    current.config_version = 2;
    let Ok(pb::sync_answer::Answer::SyncDown(down)) =
        send(nodes[&second].grpc_addr(), current).await
    else {
        panic!("the leader answers");
    };
    assert_eq!(sync_down_from_wire(down).expect("converts").config, None);
    for (_, d) in nodes {
        d.shutdown().await.expect("stops");
    }
}

/// A `PUT /v1/config` body: the test's limit at `quota` units, as a file.
fn config_put(quota: u64) -> String {
    let text = format!(
        "domain: api\ndescriptors:\n  - key: t\n    rate_limit: {{unit: hour, requests_per_unit: {quota}}}\n    allot: {{weights: {{a: 0.3, b: 0.3}}}}\n"
    );
    serde_json::json!({ "files": [{ "name": "limits.yaml", "text": text }] }).to_string()
}

/// The status line and body of a `PUT /v1/config`.
fn http_put(addr: SocketAddr, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "PUT /v1/config HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// A put whose answer was lost (its leader killed after the commit) is put again: the node
/// answers the version in force and commits nothing, where it used to commit the same files
/// as one version more (a put during a leader kill bumped the version twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_of_the_files_in_force_commits_nothing_and_names_their_version() {
    let dir = TempDir::new().expect("temporary directory");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let d = start(1, dir.path(), grpc, BTreeMap::new()).await;
    wait_for("limits put", || state(&d).table().config_version() == 1).await;
    let (line, body) = http_put(d.http_addr(), &config_put(5));
    assert!(line.contains("200"), "{line} {body}");
    assert_eq!(state(&d).table().config_version(), 2);
    for again in [config_put(5), config_put_at(5, 2)] {
        let (line, body) = http_put(d.http_addr(), &again);
        assert!(line.contains("200"), "{line} {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(
            (v["version"].as_u64(), v["unchanged"].as_bool()),
            (Some(2), Some(true))
        );
        assert_eq!(state(&d).table().config_version(), 2);
    }
    // Other files at that version are stale; the same files at a later version, a new one.
    let (line, _) = http_put(d.http_addr(), &config_put_at(6, 2));
    assert!(line.contains("409"), "{line}");
    let (line, body) = http_put(d.http_addr(), &config_put_at(5, 3));
    assert!(
        line.contains("200") && !body.contains("unchanged"),
        "{line} {body}"
    );
    assert_eq!(state(&d).table().config_version(), 3);
    d.shutdown().await.expect("stops");
}

/// [`config_put`] at an explicit `version`.
fn config_put_at(quota: u64, version: u64) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&config_put(quota)).expect("JSON");
    v["version"] = version.into();
    v.to_string()
}

/// The head (status line and headers) and body of a GET that answers 200.
fn http_get_with_head(addr: SocketAddr, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp}");
    let (head, body) = resp.split_once("\r\n\r\n").expect("a head");
    (head.to_ascii_lowercase(), body.to_owned())
}

/// The admin paths a page's script names: every `"/v1/...` string literal.
fn paths_named(page: &str) -> BTreeSet<String> {
    page.split('"')
        .filter(|s| s.starts_with("/v1/"))
        .map(str::to_owned)
        .collect()
}

/// The dashboard on any node: `/` is the page, as HTML; the page reads only routes that are
/// served, and the leader's status on a follower, at the address the follower names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_the_dashboard_and_a_follower_names_the_leaders_admin_address() {
    use allot_coordinator::daemon::dashboard::{PAGE, READS};
    let dir = TempDir::new().expect("temporary directory");
    let (nodes, _) = start_three(dir.path()).await;
    for d in nodes.values() {
        let (head, body) = http_get_with_head(d.http_addr(), "/");
        assert!(head.contains("content-type: text/html"), "{head}");
        assert_eq!(body, PAGE);
    }
    let named = paths_named(PAGE);
    assert_eq!(named, READS.iter().map(|p| (*p).to_owned()).collect());
    for path in READS {
        let (head, _) = http_get_with_head(nodes[&1].http_addr(), path);
        // A follower's page reads the leader's status from another origin.
        assert!(head.contains("access-control-allow-origin: *"), "{head}");
    }
    // The leader names itself; a follower names it once the leader's clock probe reached it
    // (every second). Leadership may move meanwhile: the check is retried.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let leader = agreed_leader(&nodes).await;
        let leader_addr = nodes[&leader].http_addr();
        let leader_http = leader_addr.to_string();
        let named: Vec<Option<String>> = nodes
            .values()
            .map(|d| {
                let status: serde_json::Value =
                    serde_json::from_str(&http_get(d.http_addr(), "/v1/status")).expect("JSON");
                status["leader_admin_http"].as_str().map(str::to_owned)
            })
            .collect();
        // The leader lists every node's admin address, from their answers to its probes:
        // a page whose own node dies reads on through another.
        let leader_status: serde_json::Value =
            serde_json::from_str(&http_get(leader_addr, "/v1/status")).expect("JSON");
        let listed: BTreeMap<u64, String> = leader_status["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| Some((m["id"].as_u64()?, m["admin_http"].as_str()?.to_owned())))
            .collect();
        let every: BTreeMap<u64, String> = nodes
            .iter()
            .map(|(id, d)| (*id, d.http_addr().to_string()))
            .collect();
        if named
            .iter()
            .all(|n| n.as_deref() == Some(leader_http.as_str()))
            && listed == every
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never named {leader_http}: {named:?}, or not every node's listed: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The admin HTTP reads a request's body before the request takes one of its
/// `MAX_ADMIN_CALLS_IN_FLIGHT` places: more slow senders than places leave the status
/// answered, and each is answered 408 once its body is `ADMIN_BODY_TIMEOUT` late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_request_bodies_hold_no_admin_place_and_are_answered_408() {
    use std::io::{Read, Write};

    use allot_coordinator::daemon::admin::{ADMIN_BODY_TIMEOUT, MAX_ADMIN_CALLS_IN_FLIGHT};
    let dir = TempDir::new().expect("temporary directory");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let d = start(1, dir.path(), grpc, BTreeMap::new()).await;
    let addr = d.http_addr();
    let mut slow: Vec<std::net::TcpStream> = (0..MAX_ADMIN_CALLS_IN_FLIGHT + 16)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).expect("connects");
            write!(
                s,
                "PUT /v1/config HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{"
            )
            .expect("half a body");
            s
        })
        .collect();
    let started = Instant::now();
    // Every place is free: the status answers 200 (asserted by the helper) at once.
    let status: serde_json::Value =
        serde_json::from_str(&http_get(addr, "/v1/status")).expect("JSON");
    assert_eq!(status["node"], 1);
    assert!(started.elapsed() < ADMIN_BODY_TIMEOUT, "the status waited");
    let s = slow.last_mut().expect("a slow sender");
    s.set_read_timeout(Some(ADMIN_BODY_TIMEOUT * 3))
        .expect("timeout");
    let mut head = [0u8; 12];
    s.read_exact(&mut head).expect("an answer");
    assert_eq!(&head, b"HTTP/1.1 408", "{}", String::from_utf8_lossy(&head));
    assert!(
        started.elapsed() >= ADMIN_BODY_TIMEOUT,
        "answered before the deadline"
    );
}
