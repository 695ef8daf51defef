//! Mutual TLS between the daemons (D58, docs/security.md), with real processes on loopback
//! and certificates from `allot certs init`.
//!
//! - Every `cargo test`: bad TLS flags and files stop a daemon at start with a message naming
//!   the problem; a single coordinator node and an agent on TLS sync; the coordinator refuses
//!   a SyncUp for a region other than the one its stream's certificate names, a sync stream
//!   from a gateway's certificate, raft from a node that is not a member, a certificate of
//!   another CA and a plaintext client, and counts the refusals.
//! - Slow tier (`ALLOT_SLOW_TESTS=1`): three nodes whose raft runs over TLS elect a leader and
//!   both regions sync through it; after the leader is killed, the next one leads over TLS too,
//!   and a fourth node started with `--join` is added and becomes a voter holding the table.
//! - Every `cargo test` too: every certificate file replaced on disk, by a set of another CA,
//!   while the daemons run: new connections need the new CA, open ones carry on.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_core::ids::{KeyId, LimitId, RegionId};
use allot_core::sync::{CounterEntry, CounterRef, SyncUp};
use allot_core::time::{Timestamp, Window};
use allot_proto::raft::v1::RaftRequest;
use allot_proto::raft::v1::raft_service_client::RaftServiceClient;
use allot_proto::sync::v1::sync_client::SyncClient;
use allot_proto::sync_convert::sync_up_to_wire;
use allot_proto::tls::{Dialer, TlsFiles};
use serde_json::Value;
use support::{Process, eventually, free_port, get_json, slow_tier, tls_args};
use tonic::Code;
use tonic::transport::Channel;

const LIMITS: &str = "\
domain: shop
descriptors:
  - key: strict
    rate_limit: {unit: day, requests_per_unit: 100000}
    allot: {weights: {a: 0.3, b: 0.3}}
";

/// `allot certs init DIR/NAME` for nodes 1-3 and 9, regions a and b, gateway edge.
fn certs(dir: &Path, name: &str) -> PathBuf {
    support::certs_init(
        &dir.join(name),
        &[
            "--nodes",
            "1,2,3,9",
            "--regions",
            "a,b",
            "--gateways",
            "edge",
        ],
    )
}

fn coordinator(dir: &Path, certs: &Path, id: u64, grpc: &str, peers: &str) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.arg("coordinator")
        .args([
            "--id",
            &id.to_string(),
            "--grpc",
            grpc,
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--data")
        .arg(dir.join(format!("node-{id}")))
        .arg("--limits")
        .arg(dir.join("limits.yaml"));
    if !peers.is_empty() {
        cmd.args(["--peers", peers]);
    }
    tls_args(&mut cmd, certs, &format!("node-{id}"));
    Process::start(cmd, "coordinator")
}

fn agent(dir: &Path, certs: &Path, region: &str, coordinators: &str) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, dir, region, Some(coordinators));
    tls_args(&mut cmd, certs, &format!("region-{region}"));
    Process::start(cmd, "agent")
}

/// A TLS channel to `addr` presenting `cert_dir`'s `stem` certificate, trusting `ca_dir`'s CA.
async fn dial(addr: &str, cert_dir: &Path, stem: &str, ca_dir: &Path) -> Result<Channel, String> {
    let files = TlsFiles {
        cert: cert_dir.join(format!("{stem}.pem")),
        key: cert_dir.join(format!("{stem}-key.pem")),
        ca: ca_dir.join("ca.pem"),
    };
    let tls = files.load().map_err(|e| e.to_string())?;
    Dialer::with_tls(&tls)
        .endpoint(addr)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))
}

/// A well-formed SyncUp for `region`: one counter of the limit above.
fn sync_up(region: &str) -> allot_proto::sync::v1::SyncUp {
    let now = Timestamp::from_unix_nanos(
        u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970")
                .as_nanos(),
        )
        .expect("in range"),
    );
    let counter = CounterRef {
        limit: LimitId::from("shop/strict"),
        key: KeyId::from("strict"),
        window: Window::new(Duration::from_secs(86_400)).index(now),
    };
    sync_up_to_wire(SyncUp {
        entries: vec![CounterEntry {
            counter,
            region: RegionId::from(region),
            granted_units: 0,
            refunded_units: 0,
        }],
        ..SyncUp::new(RegionId::from(region), 1, 1, now, 1)
    })
}

/// The status a sync stream over `channel` ends with, or `Ok` when it answers.
async fn sync_once(channel: Channel, region: &str) -> Result<(), tonic::Status> {
    let mut client = SyncClient::new(channel);
    let outbound = tokio_stream::iter(vec![sync_up(region)]);
    let mut answers = client.stream(outbound).await?.into_inner();
    match tokio::time::timeout(Duration::from_secs(10), answers.message()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer in 10 s")),
    }
}

fn refused(result: Result<(), tonic::Status>, naming: &str) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(naming), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_flags_and_files_stop_a_daemon_at_start_with_the_problem_named() {
    let dir = support::scratch("tls", "bad_flags", Some(LIMITS));
    let certs = certs(&dir, "certs");
    std::fs::write(dir.join("garbage.pem"), "not a certificate").expect("write");
    let run = |args: &[&str], tls: &[(&str, PathBuf)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args(args);
        for (flag, path) in tls {
            cmd.arg(flag).arg(path);
        }
        let out = cmd.output().expect("allot runs");
        assert!(!out.status.success(), "{args:?} {tls:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let node = [
        "coordinator",
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--data",
    ];
    let data = dir.join("node");
    let data = data.to_str().expect("utf-8");
    let full = |stem: &str| {
        vec![
            ("--tls-cert", certs.join(format!("{stem}.pem"))),
            ("--tls-key", certs.join(format!("{stem}-key.pem"))),
            ("--tls-ca", certs.join("ca.pem")),
        ]
    };
    let err = run(&[&node[..], &[data]].concat(), &full("region-a")[..1]);
    assert!(err.contains("all three"), "{err}");
    let err = run(&[&node[..], &[data]].concat(), &full("region-a"));
    assert!(err.contains("names region a, but this is node 1"), "{err}");
    let mut garbage = full("node-1");
    garbage[1].1 = dir.join("garbage.pem");
    let err = run(&[&node[..], &[data]].concat(), &garbage);
    assert!(err.contains("garbage.pem") && err.contains("PEM"), "{err}");
    let mut cert_as_key = full("node-1");
    cert_as_key[1].1 = certs.join("node-1.pem");
    let err = run(&[&node[..], &[data]].concat(), &cert_as_key);
    assert!(
        err.contains("node-1.pem") && err.contains("CERTIFICATE"),
        "{err}"
    );
    let agent = [
        "agent",
        "--grpc",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--region",
        "a",
        "--coordinator",
        "127.0.0.1:1",
        "--data",
        data,
    ];
    let err = run(&agent, &full("region-b"));
    assert!(
        err.contains("names region b, but this agent is region a"),
        "{err}"
    );
    let err = run(&agent[..agent.len() - 4], &full("region-a"));
    assert!(err.contains("--coordinator"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_on_mutual_tls_takes_each_region_only_from_its_own_certificate() {
    let dir = support::scratch("tls", "single_node", Some(LIMITS));
    let certs = certs(&dir, "certs");
    let other_ca = certs_of_another_ca(&dir);
    let grpc = format!("127.0.0.1:{}", free_port());
    let node = coordinator(&dir, &certs, 1, &grpc, "");
    let a = agent(&dir, &certs, "a", &node.grpc);
    a.synced().await;
    eventually(
        "the coordinator hears region a over TLS",
        || get_json(&node.http, "/v1/status"),
        |s| heard(s, "a"),
    )
    .await;

    // Region b's certificate, a SyncUp for a: the stream ends, a's view untouched.
    let as_b = dial(&node.grpc, &certs, "region-b", &certs)
        .await
        .expect("b dials");
    refused(
        sync_once(as_b.clone(), "a").await,
        "certificate names region b",
    );
    sync_once(as_b, "b")
        .await
        .expect("a SyncUp for its own region is answered");
    // A gateway is no region; node 9 is no member; neither speaks for anyone here.
    let gateway = dial(&node.grpc, &certs, "gateway-edge", &certs)
        .await
        .expect("dials");
    refused(sync_once(gateway, "a").await, "gateway edge");
    let node9 = dial(&node.grpc, &certs, "node-9", &certs)
        .await
        .expect("dials");
    let vote = RaftServiceClient::new(node9)
        .vote(RaftRequest {
            cluster: "allot".to_owned(),
            payload: Vec::new(),
        })
        .await
        .map(|_| ());
    refused(vote, "node 9 is not a member");
    // A certificate of another CA, and no certificate at all: no call gets through.
    let foreign = dial(&node.grpc, &other_ca, "region-a", &certs).await;
    if let Ok(channel) = foreign {
        let result = sync_once(channel, "a").await;
        assert!(result.is_err(), "another CA's certificate was taken");
        assert_ne!(result.unwrap_err().code(), Code::PermissionDenied);
    }
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc))
        .expect("url")
        .connect()
        .await;
    if let Ok(channel) = plain {
        assert!(
            sync_once(channel, "a").await.is_err(),
            "plaintext was taken"
        );
    }
    let refusals = node.metric("allot_coordinator_refused_peers_total{kind=\"other_region\"}")
        + node.metric("allot_coordinator_refused_peers_total{kind=\"not_a_region\"}")
        + node.metric("allot_coordinator_refused_peers_total{kind=\"not_a_member\"}");
    assert_eq!(refusals, 3.0, "each refusal counted");
    // The agent's own stream kept going through all of it.
    a.synced().await;
}

/// A second CA's certificates, for a peer the cluster must not trust.
fn certs_of_another_ca(dir: &Path) -> PathBuf {
    certs(dir, "other-ca")
}

/// Whether a coordinator's status says it heard `region`.
fn heard(status: &Value, region: &str) -> bool {
    status["regions"].as_array().is_some_and(|rs| {
        rs.iter()
            .any(|r| r["region"] == region && r["last_heard_unix_ms"].is_u64())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_run_raft_over_mutual_tls_through_a_leader_kill() {
    if !slow_tier() {
        return;
    }
    let dir = support::scratch("tls", "three_nodes", Some(LIMITS));
    let certs = certs(&dir, "certs");
    let addrs: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let peers = format!("1={},2={},3={}", addrs[0], addrs[1], addrs[2]);
    let mut nodes: Vec<Option<Process>> = (1..=3)
        .map(|id| {
            Some(coordinator(
                &dir,
                &certs,
                id,
                &addrs[id as usize - 1],
                &peers,
            ))
        })
        .collect();
    let all = addrs.join(",");
    let (a, b) = (
        agent(&dir, &certs, "a", &all),
        agent(&dir, &certs, "b", &all),
    );
    let leader = leader_with_both_regions(&nodes).await;
    nodes[leader as usize - 1] = None;
    let next = leader_with_both_regions(&nodes).await;
    assert_ne!(next, leader);
    a.synced().await;
    b.synced().await;

    // Node 9 starts empty with --join: it knows no member yet, so it takes the leader's
    // first messages on the CA's word, and from then on only its members'.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.arg("coordinator")
        .args([
            "--id",
            "9",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--join",
        ])
        .arg("--data")
        .arg(dir.join("node-9"));
    tls_args(&mut cmd, &certs, "node-9");
    let nine = Process::start(cmd, "coordinator");
    let admins: Vec<String> = nodes.iter().flatten().map(|n| n.http.clone()).collect();
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["cluster", "add-node", "--coordinator", &admins.join(",")])
        .args(["--id", "9", "--grpc", &nine.grpc])
        .output()
        .expect("allot runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        "node 9 is a voter holding the table, over TLS",
        || get_json(&nine.http, "/v1/status"),
        |s| s["role"] == "voter" && s["config_version"] == 1,
    )
    .await;
}

/// Waits for a running node to lead and to have heard both regions; returns its id.
async fn leader_with_both_regions(nodes: &[Option<Process>]) -> u64 {
    let (id, _) = eventually(
        "a leader over TLS that hears both regions",
        || {
            nodes.iter().flatten().find_map(|n| {
                let s = get_json(&n.http, "/v1/status");
                (s["state"] == "leader" && heard(&s, "a") && heard(&s, "b"))
                    .then(|| (s["node"].as_u64().unwrap_or(0), ()))
            })
        },
        Option::is_some,
    )
    .await
    .expect("checked");
    id
}

/// Copies `from`'s certificate files over `to`'s as a deploy tool would: each written beside
/// its target, then renamed onto it.
fn replace_files(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("certificates") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("a file name");
        let staged = to.join(format!(".{}.new", name.to_string_lossy()));
        std::fs::copy(&path, &staged).expect("copied");
        std::fs::rename(&staged, to.join(name)).expect("renamed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificate_files_apply_to_the_next_connection_without_a_restart() {
    let dir = support::scratch("tls", "reload", Some(LIMITS));
    let first = certs(&dir, "first");
    let next = certs(&dir, "next");
    let live = dir.join("live");
    std::fs::create_dir_all(&live).expect("live folder");
    replace_files(&first, &live);
    let grpc = format!("127.0.0.1:{}", free_port());
    let node = coordinator(&dir, &live, 1, &grpc, "");
    let a = agent(&dir, &live, "a", &node.grpc);
    a.synced().await;
    sync_once(
        dial(&node.grpc, &first, "region-b", &first)
            .await
            .expect("dials"),
        "b",
    )
    .await
    .expect("the first CA's certificate is taken");

    // Every file replaced by a set of another CA, while both daemons run.
    replace_files(&next, &live);
    tokio::time::sleep(allot_proto::tls::RELOAD_CHECK_INTERVAL + Duration::from_millis(500)).await;
    // The coordinator's next connections need the new CA's certificates.
    eventually(
        "the coordinator takes the new CA's certificate",
        || {
            let (grpc, next) = (node.grpc.clone(), next.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().expect("runtime");
                rt.block_on(async {
                    let ch = dial(&grpc, &next, "region-b", &next).await.ok()?;
                    sync_once(ch, "b").await.ok()
                })
            })
            .join()
            .expect("joined")
        },
        Option::is_some,
    )
    .await;
    let old = match dial(&node.grpc, &first, "region-b", &first).await {
        Ok(channel) => sync_once(channel, "b").await.is_ok(),
        Err(_) => false,
    };
    assert!(!old, "the replaced CA's certificate is still taken");
    // The agent's open stream kept its session.
    a.synced().await;

    // The coordinator restarts (reading the new files, as it would anyway); the agent, not
    // restarted, reconnects with the new files it has never been started with.
    drop(node);
    let node = coordinator(&dir, &live, 1, &grpc, "");
    eventually(
        "the agent reconnects over the new CA",
        || get_json(&node.http, "/v1/status"),
        |s| heard(s, "a"),
    )
    .await;
    a.synced().await;
}
