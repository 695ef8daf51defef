//! Hostile input over the wire against a real coordinator while a real agent syncs through it
//! (docs/security.md, "Bad input over the wire"): sync streams opened and left idle past the
//! coordinator's cap, undecodable and oversized sync messages, a flood of admin status reads,
//! and slow HTTP clients holding admin connections with half-sent headers; each alone, then
//! all at once. After them, messages that decode but are wrong: SyncUps from an unknown
//! region, from none, and on another configuration version for an unconfigured limit; raft
//! messages of another cluster, and garbage.
//!
//! Checked: every hostile call gets a clear status (no success, no internal error); the agent
//! stays synced through all of it (connected, its view never expired) and its counter reaches
//! the coordinator after; the coordinator's resident memory stays within a bound. Printed: the
//! agent's sync answer age and a well-behaved operator's status latency, before and during
//! (figures for docs/security.md, not timed assertions).
//!
//! Slow tier (`ALLOT_SLOW_TESTS=1`).

mod support;
#[path = "support/wire.rs"]
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_coordinator::daemon::admin::MAX_ADMIN_CALLS_IN_FLIGHT;
use allot_coordinator::sync_service::MAX_SYNC_STREAMS;
use allot_proto::raft::v1::RaftRequest;
use allot_proto::raft::v1::raft_service_client::RaftServiceClient;
use allot_proto::sync::v1 as pb;
use allot_proto::sync::v1::sync_client::SyncClient;
use allot_proto::sync_convert::MAX_SYNC_MESSAGE_BYTES;
use serde_json::Value;
use support::{Process, get_json, scratch, slow_tier};
use tonic::Code;
use tonic::transport::Channel;
use wire::{RawCodec, percentile, rss_bytes, slow_clients};

const LIMITS: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000}
    allot: {weights: {a: 0.5, b: 0.5}}
";
/// How long each phase attacks while the figures are taken.
const PHASE: Duration = Duration::from_secs(4);
/// Tasks reading the status in a loop, each with its own connection.
const STATUS_FLOODERS: usize = 2 * MAX_ADMIN_CALLS_IN_FLIGHT;
const SLOW_CLIENTS: usize = 200;
const SLOW_HEAD: &[u8] = b"GET /v1/status HTTP/1.1\r\nHost: x\r\n";
/// Largest growth of the coordinator's resident memory the attack may cause.
const MAX_RSS_GROWTH_BYTES: u64 = 256 << 20;

/// Refusals counted by kind, over a phase.
#[derive(Default)]
struct Counts {
    streams_refused: AtomicU64,
    bad_messages_refused: AtomicU64,
    status_shed: AtomicU64,
    status_served: AtomicU64,
}

/// A clear refusal of bad input: not a success, not the server failing.
fn clear(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted
    )
}

async fn connect(grpc: &str) -> Channel {
    Channel::from_shared(format!("http://{grpc}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects")
}

/// Opens sync streams that send nothing until `stop`, more than the cap; each refusal must be
/// `RESOURCE_EXHAUSTED`. The streams opened are held until `stop`.
async fn idle_streams(grpc: String, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let mut held = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..(MAX_SYNC_STREAMS / 100 + 2) {
        clients.push(SyncClient::new(connect(&grpc).await));
    }
    let n = clients.len();
    for i in 0..(MAX_SYNC_STREAMS + 50) {
        let (send, ups) = tokio::sync::mpsc::channel::<pb::SyncUp>(1);
        let ups = tokio_stream::wrappers::ReceiverStream::new(ups);
        match clients[i % n].stream(ups).await {
            Ok(answers) => held.push((send, answers)),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                counts.streams_refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One sync stream carrying `body` as its first message: the status it ends with.
async fn raw_sync_stream(channel: Channel, body: Vec<u8>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::from_static("/allot.sync.v1.Sync/Stream");
    let request = tonic::Request::new(tokio_stream::iter([body]));
    let mut answers = match grpc.streaming(request, path, RawCodec).await {
        Ok(a) => a.into_inner(),
        Err(s) => return s.code(),
    };
    // An answer, or the stream's end with no error, is a success: what the test refuses.
    match answers.message().await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Undecodable and oversized sync messages in a loop until `stop`.
async fn bad_messages(grpc: String, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let channel = connect(&grpc).await;
    // Field 1 (region) as a length running past the message; then a string that is not UTF-8.
    let bodies = [
        vec![0x0a, 0x7f, b'a'],
        vec![0x0a, 0x02, 0xff, 0xfe],
        vec![0u8; MAX_SYNC_MESSAGE_BYTES + 1],
    ];
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let code = raw_sync_stream(channel.clone(), bodies[i % bodies.len()].clone()).await;
        assert!(clear(code), "bad message {i}: {code:?}");
        counts.bad_messages_refused.fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
}

/// SyncUps that decode but are wrong: from a region the cluster does not know (refused,
/// naming it), from no region (refused), and from a configured region no agent runs, on a
/// configuration version the cluster never had, carrying the entry of a limit nobody
/// configured (answered, counted as another version's, and no table row comes of it).
async fn wrong_but_decodable(coordinator: &Process) {
    let channel = connect(&coordinator.grpc).await;
    let up = |region: &str, limit: &str| pb::SyncUp {
        region: region.to_owned(),
        boot: 1,
        seq: 1,
        config_version: 77,
        entries: vec![pb::CounterEntry {
            counter: Some(pb::CounterRef {
                limit: limit.to_owned(),
                key: "k".to_owned(),
                window: 0,
            }),
            region: region.to_owned(),
            granted_units: 1_000_000_000,
            refunded_units: 0,
        }],
        ..pb::SyncUp::default()
    };
    let first_answer = |msg: pb::SyncUp| {
        let mut client = SyncClient::new(channel.clone());
        async move {
            let mut answers = client.stream(tokio_stream::iter([msg])).await?.into_inner();
            answers.message().await
        }
    };
    for (region, want) in [
        ("mars", Code::FailedPrecondition),
        ("", Code::InvalidArgument),
    ] {
        let answer = first_answer(up(region, "api/user")).await;
        let code = answer.as_ref().err().map(tonic::Status::code);
        assert_eq!(
            code,
            Some(want),
            "a SyncUp from region {region:?}: {answer:?}"
        );
    }
    let other_before = coordinator.metric("allot_coordinator_other_version_sync_ups_total");
    let answer = first_answer(up("b", "nobody/configured")).await;
    match &answer {
        Ok(Some(_)) => {}
        Err(status) => assert!(clear(status.code()), "{status:?}"),
        Ok(None) => panic!("no answer and no status"),
    }
    support::eventually(
        "the other version's SyncUp is counted",
        || coordinator.metric("allot_coordinator_other_version_sync_ups_total"),
        |n| *n > other_before,
    )
    .await;
    let status = get_json(&coordinator.http, "/v1/status");
    assert!(
        !status.to_string().contains("nobody/configured"),
        "{status}"
    );
    assert_eq!(status["config_version"], 1, "{status}");

    // Raft messages of another cluster, and one of this cluster that does not decode: refused,
    // and the node's term and log stay as they were.
    let before = get_json(&coordinator.http, "/v1/status");
    let mut raft = RaftServiceClient::new(connect(&coordinator.grpc).await);
    let foreign = RaftRequest {
        cluster: "another-cluster".to_owned(),
        payload: vec![0x01],
    };
    let refused = raft
        .vote(foreign)
        .await
        .expect_err("another cluster's vote");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let cluster = before["cluster"].as_str().unwrap_or("allot").to_owned();
    let garbage = RaftRequest {
        cluster,
        payload: vec![0x01, 0xff, 0xff, 0xff],
    };
    let refused = raft.append_entries(garbage).await.expect_err("garbage");
    assert!(clear(refused.code()), "{refused:?}");
    let after = get_json(&coordinator.http, "/v1/status");
    assert_eq!(
        (&after["term"], &after["state"]),
        (&before["term"], &before["state"]),
        "{after}"
    );
}

/// Reads the status in a loop until `stop`: served or shed (503), nothing else.
fn status_flood(http: &str, stop: &AtomicBool, counts: &Counts) {
    while !stop.load(Ordering::Relaxed) {
        let (code, _) = support::http_request(http, "GET", "/v1/status", "", "");
        match code {
            200 => counts.status_served.fetch_add(1, Ordering::Relaxed),
            503 => counts.status_shed.fetch_add(1, Ordering::Relaxed),
            other => panic!("the status answered {other}"),
        };
    }
}

/// What the well-behaved parties saw over one phase: the agent's sync answer ages and an
/// operator's status latencies (a status shed counts as a failed read).
struct Observed {
    answer_ages: Vec<Duration>,
    status_latencies: Vec<Duration>,
    status_failed: u64,
}

/// Samples the agent's sync link and an operator's status read every 100 ms for `PHASE`;
/// the agent must stay connected with a fresh view throughout.
async fn observe(agent: &Process, coordinator_http: &str) -> Observed {
    let mut o = Observed {
        answer_ages: Vec::new(),
        status_latencies: Vec::new(),
        status_failed: 0,
    };
    let end = Instant::now() + PHASE;
    while Instant::now() < end {
        let sync = agent.json("/v1/status")["sync"].clone();
        assert_eq!(sync["connected"], true, "{sync}");
        assert_eq!(sync["view_expired"], false, "{sync}");
        if let Some(age) = sync["last_answer_age_secs"].as_f64() {
            o.answer_ages.push(Duration::from_secs_f64(age));
        }
        let started = Instant::now();
        let (code, _) = support::http_request(coordinator_http, "GET", "/v1/status", "", "");
        if code == 200 {
            o.status_latencies.push(started.elapsed());
        } else {
            assert_eq!(code, 503, "the operator's status read");
            o.status_failed += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    o.answer_ages.sort();
    o.status_latencies.sort();
    o
}

/// Which attacks a phase runs.
#[derive(Clone, Copy)]
struct Attacks {
    streams: bool,
    messages: bool,
    status: bool,
    slow: bool,
}

/// Runs `attacks` for one phase while observing; the attackers stop after it.
async fn phase(
    attacks: Attacks,
    agent: &Process,
    coordinator: &Process,
    counts: &Arc<Counts>,
) -> Observed {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut threads = Vec::new();
    if attacks.streams {
        let go = idle_streams(coordinator.grpc.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(go));
    }
    if attacks.messages {
        let go = bad_messages(coordinator.grpc.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(go));
    }
    if attacks.status {
        for _ in 0..STATUS_FLOODERS {
            let (http, stop, counts) = (coordinator.http.clone(), stop.clone(), counts.clone());
            threads.push(std::thread::spawn(move || {
                status_flood(&http, &stop, &counts)
            }));
        }
    }
    if attacks.slow {
        let (http, stop) = (coordinator.http.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            slow_clients(&http, SLOW_CLIENTS, SLOW_HEAD, &stop)
        }));
    }
    // The attackers get going before the figures are taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = observe(agent, &coordinator.http).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("an attacker");
    }
    for t in threads {
        t.join().expect("an attacker thread");
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_under_hostile_input_keeps_its_agents_synced() {
    if !slow_tier() {
        return;
    }
    let dir = scratch("hostile_coordinator", "all", Some(LIMITS));
    let coordinator = Process::start(support::coordinator_cmd(&dir), "coordinator");
    let agent = Process::agent(&dir, "a", Some(&coordinator.grpc));
    agent.synced().await;
    let rss_before = rss_bytes(coordinator.child.id());
    let counts = Arc::new(Counts::default());
    let none = Attacks {
        streams: false,
        messages: false,
        status: false,
        slow: false,
    };
    let phases = [
        ("nothing (baseline)", none),
        (
            "sync streams left idle, past the cap",
            Attacks {
                streams: true,
                ..none
            },
        ),
        (
            "undecodable and oversized sync messages",
            Attacks {
                messages: true,
                ..none
            },
        ),
        (
            "a flood of status reads",
            Attacks {
                status: true,
                ..none
            },
        ),
        ("slow HTTP clients", Attacks { slow: true, ..none }),
        (
            "all of them at once",
            Attacks {
                streams: true,
                messages: true,
                status: true,
                slow: true,
            },
        ),
    ];
    let mut table = Vec::new();
    let mut rss_peak = rss_before;
    for (what, attacks) in phases {
        let seen = phase(attacks, &agent, &coordinator, &counts).await;
        rss_peak = rss_peak.max(rss_bytes(coordinator.child.id()));
        table.push((what, seen));
    }
    assert!(
        counts.streams_refused.load(Ordering::Relaxed) > 0,
        "no stream was refused"
    );
    assert!(counts.bad_messages_refused.load(Ordering::Relaxed) > 0);
    assert!(counts.status_served.load(Ordering::Relaxed) > 0);
    assert!(
        rss_peak - rss_before < MAX_RSS_GROWTH_BYTES,
        "the coordinator grew from {rss_before} to {rss_peak} bytes"
    );

    wrong_but_decodable(&coordinator).await;

    // After it all, the agent's counter still reaches the coordinator.
    assert!(agent.acquire("api", "user", "after", 7).await);
    support::eventually(
        "the coordinator hears the agent's use",
        || get_json(&coordinator.http, "/v1/status"),
        |s: &Value| {
            s["regions"][0]["sync_lag_ms"]
                .as_u64()
                .is_some_and(|l| l < 2_000)
        },
    )
    .await;

    let ms = |v: &[Duration], q| {
        if v.is_empty() {
            f64::NAN
        } else {
            percentile(v, q).as_secs_f64() * 1e3
        }
    };
    let base_status_p99 = ms(&table[0].1.status_latencies, 0.99);
    println!(
        "| during | agent's sync answer age, max | operator's status p50 | p99 | p99 / baseline | status reads shed |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (what, o) in &table {
        let max_age = o.answer_ages.last().copied().unwrap_or_default();
        println!(
            "| {what} | {:.0} ms | {:.2} ms | {:.2} ms | {:.1}x | {} |",
            max_age.as_secs_f64() * 1e3,
            ms(&o.status_latencies, 0.5),
            ms(&o.status_latencies, 0.99),
            ms(&o.status_latencies, 0.99) / base_status_p99,
            o.status_failed
        );
    }
    println!(
        "streams refused {}, bad messages refused {}, status reads served {} and shed {}; \
         RSS {} -> {} MiB",
        counts.streams_refused.load(Ordering::Relaxed),
        counts.bad_messages_refused.load(Ordering::Relaxed),
        counts.status_served.load(Ordering::Relaxed),
        counts.status_shed.load(Ordering::Relaxed),
        rss_before >> 20,
        rss_peak >> 20
    );
}
