//! Three coordinator nodes in one process on loopback ports: raft over the gRPC network with
//! the sled storage, through a leader's loss and a node's restart from its data directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use allot_coordinator::node::{NodeSettings, RaftNode};
use allot_coordinator::{ClusterCommand, ClusterState, CommandOutcome, NodeId};
use allot_core::ids::RegionId;
use allot_core::limit::LimitSpec;
use openraft::{BasicNode, Config, SnapshotPolicy};
use tempfile::TempDir;
use tokio::net::TcpListener;

const CLUSTER: &str = "allot-test";
/// Long enough for an election on a loaded 2-core machine, short enough for a quick test.
const WAIT: Duration = Duration::from_secs(20);

/// Fast timers, and a snapshot every few entries with nothing kept below it, so that a node
/// that was away catches up from a snapshot sent over the network.
fn raft_config() -> Config {
    Config {
        cluster_name: CLUSTER.to_string(),
        heartbeat_interval: 50,
        election_timeout_min: 300,
        election_timeout_max: 600,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(3),
        max_in_snapshot_log_to_keep: 0,
        ..Config::default()
    }
    .validate()
    .expect("valid raft config")
}

async fn start(id: NodeId, dir: &Path, listener: TcpListener) -> RaftNode {
    let settings = NodeSettings {
        id,
        data_dir: dir.join(format!("node-{id}")),
        raft: raft_config(),
        tls: None,
    };
    RaftNode::start(settings, listener)
        .await
        .expect("node starts")
}

async fn leader_among(nodes: &BTreeMap<NodeId, RaftNode>, not: Option<NodeId>) -> NodeId {
    let any = nodes.values().next().expect("a node");
    let metrics = any
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| {
                m.current_leader
                    .is_some_and(|l| Some(l) != not && nodes.contains_key(&l))
            },
            "a leader among the running nodes",
        )
        .await
        .expect("a leader is elected");
    metrics.current_leader.expect("checked above")
}

/// Commits `cmd` through the leader and returns its outcome and log index.
async fn commit(node: &RaftNode, cmd: ClusterCommand) -> (CommandOutcome, u64) {
    let written = node.raft.client_write(cmd).await.expect("committed");
    (written.data, written.log_id.index)
}

async fn applied_state(node: &RaftNode, index: u64) -> ClusterState {
    node.raft
        .wait(Some(WAIT))
        .applied_index_at_least(Some(index), "entry applied")
        .await
        .expect("the entry reaches the node");
    node.state.read(|a| a.state.clone())
}

fn add_region(name: &str) -> ClusterCommand {
    ClusterCommand::AddRegion {
        region: RegionId::new(name),
        weight_ppm: None,
    }
}

/// Three nodes on loopback, each in its own directory under `dir`, initialised as one cluster.
async fn start_three(dir: &Path) -> (BTreeMap<NodeId, BasicNode>, BTreeMap<NodeId, RaftNode>) {
    let mut listeners = BTreeMap::new();
    let mut members = BTreeMap::new();
    for id in 1..=3 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("address");
        members.insert(id, BasicNode::new(addr.to_string()));
        listeners.insert(id, listener);
    }
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        nodes.insert(id, start(id, dir, listener).await);
    }
    nodes[&1]
        .raft
        .initialize(members.clone())
        .await
        .expect("cluster initialised");
    (members, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_commits_after_the_leader_is_lost_and_a_restarted_node_catches_up() {
    let dir = TempDir::new().expect("temporary directory");
    let (members, mut nodes) = start_three(dir.path()).await;

    let first = leader_among(&nodes, None).await;
    let (outcome, index) = commit(&nodes[&first], add_region("eu")).await;
    assert_eq!(outcome.configured_version(), Some(1));
    for node in nodes.values() {
        let state = applied_state(node, index).await;
        assert!(state.regions().contains_key(&RegionId::new("eu")));
    }

    // The leader's node goes away; the other two elect one of themselves and go on.
    let old = nodes.remove(&first).expect("the leader's node");
    let away_from = old.raft.metrics().borrow().last_log_index.expect("a log");
    old.shutdown().await.expect("node stops");
    let second = leader_among(&nodes, Some(first)).await;
    let (outcome, _) = commit(&nodes[&second], add_region("us")).await;
    assert_eq!(outcome.configured_version(), Some(2));
    let limits = ClusterCommand::PutLimits {
        version: 2,
        limits: vec![LimitSpec::simple("api", 900, Duration::from_secs(60))],
    };
    let (outcome, _) = commit(&nodes[&second], limits).await;
    assert!(matches!(outcome, CommandOutcome::Refused(_)), "{outcome:?}");
    let limits = ClusterCommand::PutLimits {
        version: 3,
        limits: vec![LimitSpec::simple("api", 900, Duration::from_secs(60))],
    };
    let (outcome, index) = commit(&nodes[&second], limits).await;
    assert_eq!(outcome.configured_version(), Some(3));
    let expected = applied_state(&nodes[&second], index).await;
    for node in nodes.values() {
        assert_eq!(applied_state(node, index).await, expected);
    }

    // The old leader restarts from its directory: its log was compacted away on the others,
    // so it catches up from a snapshot, and holds what the cluster holds.
    let purged = nodes[&second]
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.purged.is_some_and(|p| p.index > away_from),
            "the log the old leader misses purged",
        )
        .await
        .expect("the leader compacts its log");
    assert!(purged.snapshot.is_some());
    let listener = TcpListener::bind(&members[&first].addr)
        .await
        .expect("rebind the old address");
    let back = start(first, dir.path(), listener).await;
    assert_eq!(applied_state(&back, index).await, expected);
    let (outcome, index) = commit(&nodes[&second], add_region("ap")).await;
    assert_eq!(outcome.configured_version(), Some(4));
    let expected = applied_state(&nodes[&second], index).await;
    assert_eq!(applied_state(&back, index).await, expected);

    back.shutdown().await.expect("node stops");
    for (_, node) in nodes {
        node.shutdown().await.expect("node stops");
    }
}

/// A message of another cluster, or one that does not decode, is refused with a status and
/// leaves the node's raft untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_another_clusters_messages_and_garbage() {
    use allot_proto::raft::v1::RaftRequest;
    use allot_proto::raft::v1::raft_service_client::RaftServiceClient;

    let dir = TempDir::new().expect("temporary directory");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let node = start(1, dir.path(), listener).await;
    let mut client = RaftServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    let foreign = RaftRequest {
        cluster: "another".to_string(),
        payload: vec![0x01],
    };
    let status = client.vote(foreign).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let garbage = RaftRequest {
        cluster: CLUSTER.to_string(),
        payload: vec![0x01, 0xff, 0xff, 0xff],
    };
    let status = client.append_entries(garbage).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let metrics = node.raft.metrics().borrow().clone();
    assert_eq!(metrics.current_term, 0);
    assert_eq!(metrics.last_log_index, None);
    node.shutdown().await.expect("node stops");
}

/// Every node stops and starts again from its directory (nothing is written at shutdown, so
/// this is what a kill leaves): the votes come back (the term never goes back; a leader that
/// finds its own committed vote stands for a new term, D36), and the state is back whole
/// before the next entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_cluster_restarts_from_disk_with_its_state() {
    let dir = TempDir::new().expect("temporary directory");
    let (members, mut nodes) = start_three(dir.path()).await;
    let leader = leader_among(&nodes, None).await;
    for name in ["eu", "us"] {
        commit(&nodes[&leader], add_region(name)).await;
    }
    let limits = ClusterCommand::PutLimits {
        version: 5,
        limits: vec![LimitSpec::simple("api", 900, Duration::from_secs(60))],
    };
    let (_, index) = commit(&nodes[&leader], limits).await;
    let before = applied_state(&nodes[&leader], index).await;
    let term = nodes[&leader].raft.metrics().borrow().current_term;
    for node in nodes.values() {
        applied_state(node, index).await;
    }
    for (_, node) in std::mem::take(&mut nodes) {
        node.shutdown().await.expect("node stops");
    }

    for (id, member) in &members {
        let listener = TcpListener::bind(&member.addr).await.expect("rebind");
        nodes.insert(*id, start(*id, dir.path(), listener).await);
    }
    let leader = leader_among(&nodes, None).await;
    let metrics = nodes[&leader].raft.metrics().borrow().clone();
    assert!(
        metrics.current_term >= term,
        "{} after {term}",
        metrics.current_term
    );
    for node in nodes.values() {
        assert_eq!(applied_state(node, index).await, before);
    }
    let (outcome, _) = commit(&nodes[&leader], add_region("ap")).await;
    assert_eq!(outcome.configured_version(), Some(6));
    for (_, node) in nodes {
        node.shutdown().await.expect("node stops");
    }
}

/// Copies a stopped node's directory (`cp -a`: the sled files as it left them).
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .expect("cp runs");
    assert!(out.status.success(), "cp: {out:?}");
}

/// Stops every node, then starts each again from its directory at its old address.
async fn restart_all(
    nodes: &mut BTreeMap<NodeId, RaftNode>,
    members: &BTreeMap<NodeId, BasicNode>,
    dir: &Path,
    before_start: impl FnOnce(),
) {
    for (_, node) in std::mem::take(nodes) {
        node.shutdown().await.expect("node stops");
    }
    before_start();
    for (id, member) in members {
        let listener = TcpListener::bind(&member.addr).await.expect("rebind");
        nodes.insert(*id, start(*id, dir, listener).await);
    }
}

/// The leader's directory goes back to a copy taken before later entries committed, and the
/// whole cluster restarts: every node must end with the same state, holding every entry that
/// committed. Before a node stood down from the leadership it found stored (D36), the old copy
/// (a committed vote for itself, in the term the others still held) led again in that term at
/// once and wrote new entries under log ids the others held for the later entries: they took
/// them for the same, the leader committed them, and each node applied its own entry at the
/// same index (the others kept `us` and `ap`, the old copy had `sa` in their place).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_from_an_old_copy_of_its_directory_does_not_fork_the_log() {
    let dir = TempDir::new().expect("temporary directory");
    let (members, mut nodes) = start_three(dir.path()).await;
    let leader = leader_among(&nodes, None).await;
    let (_, index) = commit(&nodes[&leader], add_region("eu")).await;
    for node in nodes.values() {
        applied_state(node, index).await;
    }
    let leader_dir = dir.path().join(format!("node-{leader}"));
    let old_copy = dir.path().join("old-copy");
    restart_all(&mut nodes, &members, dir.path(), || {
        copy_dir(&leader_dir, &old_copy)
    })
    .await;

    // Later entries commit, through whichever node leads now.
    let now = leader_among(&nodes, None).await;
    commit(&nodes[&now], add_region("us")).await;
    let (_, index) = commit(&nodes[&now], add_region("ap")).await;
    for node in nodes.values() {
        applied_state(node, index).await;
    }

    // The first leader comes back from its old copy, the others from their directories.
    restart_all(&mut nodes, &members, dir.path(), || {
        std::fs::remove_dir_all(&leader_dir).expect("remove");
        copy_dir(&old_copy, &leader_dir);
    })
    .await;
    let now = leader_among(&nodes, None).await;
    let (_, index) = commit(&nodes[&now], add_region("sa")).await;
    let states: BTreeMap<NodeId, ClusterState> = {
        let mut states = BTreeMap::new();
        for (id, node) in &nodes {
            states.insert(*id, applied_state(node, index).await);
        }
        states
    };
    let regions = |s: &ClusterState| -> Vec<String> {
        s.regions().keys().map(|r| r.as_str().to_owned()).collect()
    };
    for (id, state) in &states {
        assert_eq!(
            regions(state),
            ["ap", "eu", "sa", "us"],
            "node {id} (node {leader} restarted from its old copy, node {now} led)"
        );
        assert_eq!(state, &states[&now], "node {id} differs from the leader's");
    }
    for (_, node) in nodes {
        node.shutdown().await.expect("node stops");
    }
}
