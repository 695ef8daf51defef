//! The sync stream end to end, on loopback: the coordinator crate's test server
//! (`MemoryCoordinator` behind `SyncService`, in this process) and real `allot agent`
//! processes for two regions. Units admitted in one region reach the other's view, a strict
//! limit's allowance grows where the demand is, a server outage shows in both agents' links
//! and partition state and heals when it comes back, a follower's redirect is followed, and
//! broken servers (garbage bytes, bad answers, closed streams) never stop an agent answering.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use allot_coordinator::sync_service::{
    LeaderHint, MemoryCoordinator, RedirectTo, SyncHandler, SyncService,
};
use allot_core::config::{LimitsConfig, LoadOptions, SourceFile};
use allot_core::ids::RegionId;
use allot_core::rebalance::CoordinatorConfig;
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use allot_proto::sync::v1 as sync_pb;
use allot_proto::sync::v1::sync_server::{Sync, SyncServer};
use serde_json::Value;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::Channel;

use tonic::{Request, Response, Status, Streaming};

/// Longest a test waits for something that should happen within a few sync intervals (or,
/// for a reconnect, a few backoffs): a bound on a hang, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(20);

/// Windows of a day: a test never straddles a window boundary in practice. `shared` is
/// eventual, split evenly; `strict` leaves 40% of its quota unassigned, for the coordinator
/// to grow a region into.
const LIMITS: &str = "\
domain: shop
descriptors:
  - key: shared
    rate_limit: {unit: day, requests_per_unit: 100}
    allot: {consistency: eventual, weights: {a: 0.5, b: 0.5}}
  - key: strict
    rate_limit: {unit: day, requests_per_unit: 100000}
    allot: {weights: {a: 0.3, b: 0.3}}
";

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("sync_stream")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("limits.yaml"), LIMITS).expect("config");
    dir
}

/// A sync server on its own runtime and thread: stopping it drops the runtime, which ends
/// every connection at once, as a killed process would.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start<S: Sync>(service: SyncServer<S>, addr: &str) -> Server {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let addr = addr.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = bind_retrying(&addr).await;
                let local = listener.local_addr().expect("address");
                let serve = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(TcpListenerStream::new(listener));
                tokio::spawn(serve);
                ready_tx.send(local).expect("ready");
                let _ = stopped.await;
            });
        });
        let addr = ready_rx.recv().expect("the server starts");
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn memory(handler: Arc<MemoryCoordinator>, addr: &str) -> Server {
        Server::start(SyncService::new(handler).into_server(), addr)
    }

    fn handler<H: SyncHandler>(handler: H) -> Server {
        Server::start(
            SyncService::new(Arc::new(handler)).into_server(),
            "127.0.0.1:0",
        )
    }

    fn address(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `addr`, retrying while a just-stopped server's socket is still being released.
async fn bind_retrying(addr: &str) -> tokio::net::TcpListener {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                eprintln!("bind {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot bind {addr}: {e}"),
        }
    }
}

/// The single-node coordinator over the same limits the agents load (version 1, as their
/// first load is) for regions `a` and `b`.
fn memory_coordinator() -> Arc<MemoryCoordinator> {
    let config = LimitsConfig::load(
        &[SourceFile::new("limits.yaml", LIMITS)],
        &LoadOptions::default(),
    )
    .expect("limits load");
    let limits = config.rules().map(|r| r.spec.clone()).collect();
    let regions = vec![RegionId::from("a"), RegionId::from("b")];
    let c = MemoryCoordinator::new(CoordinatorConfig::default(), 1, limits, regions, 1)
        .expect("configuration applies");
    Arc::new(c)
}

/// One running agent process; killed when dropped.
struct Agent {
    child: Child,
    grpc: String,
    http: String,
}

impl Agent {
    fn start(dir: &Path, region: &str, coordinators: &str) -> Agent {
        let data = dir.join(format!("data-{region}"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args(["agent", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .arg("--data")
            .arg(&data)
            .arg("--config")
            .arg(dir.join("limits.yaml"))
            .args(["--region", region, "--coordinator", coordinators]);
        let (child, grpc, http, _log) = support::spawn_ready(cmd, "agent").logged("agent");
        Agent { child, grpc, http }
    }

    fn json(&self, path: &str) -> Value {
        let (code, body) = http_get(&self.http, path);
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).expect("JSON")
    }

    fn status(&self) -> Value {
        self.json("/v1/status")
    }

    fn key(&self, key: &str) -> Value {
        self.json(&format!("/v1/keys?domain=shop&descriptor={key}"))
    }

    fn metric(&self, line_prefix: &str) -> Option<f64> {
        let (_, body) = http_get(&self.http, "/metrics");
        body.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    async fn acquire(&self, key: &str, cost: u64) -> pb::Decision {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .expect("url")
            .connect()
            .await
            .expect("connects to the agent");
        LeaseServiceClient::new(channel)
            .acquire(pb::AcquireRequest {
                target: Some(pb::Target {
                    domain: "shop".to_owned(),
                    entries: vec![pb::Entry {
                        key: key.to_owned(),
                        value: String::new(),
                    }],
                }),
                cost_units: cost,
                idempotency_key: String::new(),
            })
            .await
            .expect("the agent answers")
            .into_inner()
            .decision
            .expect("decision")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_owned())
}

/// Polls `check` until it holds; panics with `what` and the last value seen otherwise.
async fn eventually<T: std::fmt::Debug>(
    what: &str,
    mut probe: impl FnMut() -> T,
    check: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = probe();
        if check(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: never held; last {v:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits past the end of the day if it is less than a minute away: the test's counters are
/// of the day's window and must not roll over mid-test.
async fn clear_of_the_day_boundary() {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let left = 86_400 - secs % 86_400;
    if left < 60 {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

fn sync_of(s: &Value) -> (bool, String) {
    let sync = &s["sync"];
    (
        sync["connected"].as_bool().unwrap_or(false),
        sync["partition_state"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_share_quota_through_the_test_server_and_survive_its_outage() {
    clear_of_the_day_boundary().await;
    let dir = scratch("two_regions");
    let coordinator = memory_coordinator();
    let server = Server::memory(coordinator.clone(), "127.0.0.1:0");
    let address = server.address();
    let a = Agent::start(&dir, "a", &address);
    let b = Agent::start(&dir, "b", &address);
    for agent in [&a, &b] {
        let s = eventually("connected", || agent.status(), |s| sync_of(s).0).await;
        assert_eq!(s["sync"]["leader"], address.as_str(), "{s}");
        assert_eq!(s["sync"]["partition_state"], "connected", "{s}");
        assert_eq!(agent.metric("allot_sync_connected"), Some(1.0));
    }

    // Eventual: 40 of a's default 50 go through; 20 more are refused until the coordinator
    // knows the counter (reported on the refusal, or already on the projection of the 40);
    // with the view, a may use what b leaves.
    assert!(a.acquire("shared", 40).await.allowed);
    let mut tries = 0;
    while !a.acquire("shared", 20).await.allowed {
        tries += 1;
        assert!(tries < 200, "a never got the global view");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // a's 60 reach b's view: b may use only the 40 left.
    let view = eventually(
        "a's units in b's view",
        || b.key("shared"),
        |v| v["allowance_units"].as_u64() == Some(40),
    )
    .await;
    assert_eq!(view["granted_units"], 0, "{view}");
    assert!(!b.acquire("shared", 41).await.allowed);

    // Strict: a's default is 30,000; demand beyond it grows a's allowance into the
    // unassigned 40% (the 10,000 more are refused, unless the grow came first).
    assert!(a.acquire("strict", 30_000).await.allowed);
    a.acquire("strict", 10_000).await;
    let grown = eventually(
        "a's strict allowance grows",
        || a.key("strict"),
        |v| v["allowance_units"].as_u64().is_some_and(|u| u > 30_000),
    )
    .await;
    assert_eq!(grown["explicit_allowance"], true, "{grown}");
    assert_eq!(coordinator.rejected_commands(), 0);

    // The server goes away: both links report it, both views expire (floor policy: each
    // keeps its default share), and both agents keep answering.
    drop(server);
    for agent in [&a, &b] {
        let s = eventually(
            "disconnected and expired",
            || agent.status(),
            |s| sync_of(s) == (false, "expired".to_owned()),
        )
        .await;
        assert!(s["sync"]["reconnects"].as_u64() >= Some(1), "{s}");
        let limits = s["limits"].as_array().expect("limits");
        assert!(limits.iter().all(|l| l["view_expired"] == true), "{s}");
        assert_eq!(agent.metric("allot_sync_connected"), Some(0.0));
        assert_eq!(
            agent.metric("allot_partition_policy_state{state=\"expired\"}"),
            Some(1.0)
        );
        let age = agent
            .metric("allot_sync_last_answer_age_seconds")
            .expect("age");
        assert!(age >= 1.0, "{age}");
        // The floor policy keeps what each holds: its default share, or less if it released
        // some to a before the outage (b, idle, releases to a busy a once its ack lands; the
        // server may go before or after that round).
        let held = agent.key("strict");
        let room = held["allowance_units"].as_u64() > held["net_units"].as_u64();
        let d = agent.acquire("strict", 1).await;
        assert_eq!(d.allowed, room, "{d:?} {held}");
    }
    {
        let d = a.acquire("strict", 1).await;
        assert!(
            d.allowed,
            "a keeps the share it grew into: {d:?} {}",
            a.key("strict")
        );
    }

    // Back at the same address: both reconnect, their views are fresh again.
    let server = Server::memory(coordinator.clone(), &address);
    for agent in [&a, &b] {
        eventually(
            "reconnected",
            || agent.status(),
            |s| sync_of(s) == (true, "connected".to_owned()),
        )
        .await;
    }
    let view = eventually(
        "b's view after the outage",
        || b.key("shared"),
        |v| v["allowance_units"].as_u64() == Some(40),
    )
    .await;
    assert_eq!(view["sync"]["connected"], true, "{view}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_a_followers_redirect_to_the_leader() {
    let dir = scratch("redirect");
    let leader = Server::memory(memory_coordinator(), "127.0.0.1:0");
    let follower = Server::handler(RedirectTo(Some(LeaderHint {
        node_id: 1,
        address: leader.address(),
    })));
    let nobody = Server::handler(RedirectTo(None));
    // The first node knows no leader, the second names it.
    let a = Agent::start(
        &dir,
        "a",
        &format!("{},{}", nobody.address(), follower.address()),
    );
    let s = eventually("connected to the leader", || a.status(), |s| sync_of(s).0).await;
    assert_eq!(s["sync"]["leader"], leader.address().as_str(), "{s}");
    assert!(s["sync"]["reconnects"].as_u64() >= Some(1), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_redirected_to_a_node_it_has_its_own_address_for_goes_there() {
    let dir = scratch("redirect_mapped");
    // The leader as this agent reaches it (through a proxy, say), and another coordinator at
    // the address the membership names: an agent that followed the named address would sync
    // with it and stay there.
    let leader = Server::memory(memory_coordinator(), "127.0.0.1:0");
    let named = Server::memory(memory_coordinator(), "127.0.0.1:0");
    let follower = Server::handler(RedirectTo(Some(LeaderHint {
        node_id: 2,
        address: named.address(),
    })));
    // The follower is tried first.
    let a = Agent::start(
        &dir,
        "a",
        &format!("1={},2={}", follower.address(), leader.address()),
    );
    let s = eventually("connected to the leader", || a.status(), |s| sync_of(s).0).await;
    assert_eq!(s["sync"]["leader"], leader.address().as_str(), "{s}");
    assert!(s["sync"]["reconnects"].as_u64() >= Some(1), "{s}");
}

/// A server that answers every stream with one answer that does not convert (a counter
/// entry without its counter), then waits.
struct BadAnswers;

type AnswerStream = Pin<Box<dyn Stream<Item = Result<sync_pb::SyncAnswer, Status>> + Send>>;

#[tonic::async_trait]
impl Sync for BadAnswers {
    type StreamStream = AnswerStream;

    async fn stream(
        &self,
        _request: Request<Streaming<sync_pb::SyncUp>>,
    ) -> Result<Response<AnswerStream>, Status> {
        let bad = sync_pb::SyncAnswer {
            answer: Some(sync_pb::sync_answer::Answer::SyncDown(sync_pb::SyncDown {
                entries: vec![sync_pb::CounterEntry {
                    counter: None,
                    region: "b".to_owned(),
                    granted_units: 1_000_000,
                    refunded_units: 0,
                }],
                ..sync_pb::SyncDown::default()
            })),
        };
        let stream = tokio_stream::iter([Ok(bad)]).chain(tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A server that ends every stream at once, without an answer.
struct Closer;

#[tonic::async_trait]
impl Sync for Closer {
    type StreamStream = AnswerStream;

    async fn stream(
        &self,
        _request: Request<Streaming<sync_pb::SyncUp>>,
    ) -> Result<Response<AnswerStream>, Status> {
        Ok(Response::new(Box::pin(tokio_stream::empty())))
    }
}

/// Accepts connections and writes bytes that are not HTTP/2 at all.
fn garbage_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = listener.accept() {
            let _ = s.write_all(&[0xde, 0xad, 0xbe, 0xef].repeat(64));
        }
    });
    addr
}

/// Accepts connections, keeps them open and never says a word.
fn silent_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept() {
            held.push(s);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_bad_answers_and_closed_streams_leave_the_agent_serving() {
    clear_of_the_day_boundary().await;
    let dir = scratch("garbage");
    // A region that was never answered may have lost its store (it cannot tell a first start
    // from a lost disk) and admits nothing from its allowances until an answer: let it be
    // answered once, so that what follows is a region with its store, cut off.
    answered_once(&dir, "a").await;
    let silent = silent_server();
    let garbage = garbage_server();
    let bad = Server::start(SyncServer::new(BadAnswers), "127.0.0.1:0");
    let closer = Server::start(SyncServer::new(Closer), "127.0.0.1:0");
    let a = Agent::start(
        &dir,
        "a",
        &format!("{silent},{garbage},{},{}", bad.address(), closer.address()),
    );
    // The agent cycles through all four (the silent one too: it gives up on it), never
    // connected, and keeps answering meanwhile.
    let s = eventually(
        "every bad node tried, twice",
        || a.status(),
        |s| {
            s["sync"]["reconnects"].as_u64() >= Some(8)
                && s["sync"]["bad_answers"].as_u64() >= Some(2)
        },
    )
    .await;
    assert_eq!(s["sync"]["connected"], false, "{s}");
    for _ in 0..5 {
        // The floor policy: a's default share of `shared` is 50.
        let d = a.acquire("shared", 1).await;
        assert!(d.allowed, "{d:?}");
    }
    // The bad answer's entry (a million units of b's) was never applied.
    let view = a.key("shared");
    assert_eq!(view["allowance_units"], 50, "{view}");
    assert_eq!(view["granted_units"], 5, "{view}");
    assert_eq!(a.status()["sync"]["partition_state"], "expired");
    assert!(
        a.metric("allot_sync_bad_answers_total")
            .is_some_and(|n| n >= 1.0)
    );
}

/// The server's side of bad input: a SyncUp that does not convert, or from a region the
/// configuration does not know, ends that stream with a status naming the problem; the table
/// is untouched and the next stream is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_malformed_and_unknown_sync_ups_with_a_clear_status() {
    use allot_proto::sync::v1::sync_client::SyncClient;

    let coordinator = memory_coordinator();
    let server = Server::memory(coordinator.clone(), "127.0.0.1:0");
    let url = format!("http://{}", server.address());
    let up = |region: &str, seq: u64| sync_pb::SyncUp {
        region: region.to_owned(),
        boot: 1,
        seq,
        config_version: 1,
        ..sync_pb::SyncUp::default()
    };
    let first_status = |ups: Vec<sync_pb::SyncUp>| {
        let url = url.clone();
        async move {
            let mut client = SyncClient::connect(url).await.expect("connects");
            let mut answers = client
                .stream(tokio_stream::iter(ups))
                .await
                .expect("stream opens")
                .into_inner();
            let mut downs = 0;
            loop {
                match answers.message().await {
                    Ok(Some(_)) => downs += 1,
                    Ok(None) => return (downs, None),
                    Err(status) => return (downs, Some(status)),
                }
            }
        }
    };
    let (downs, status) = first_status(vec![up("a", 1), up("", 2), up("a", 3)]).await;
    let status = status.expect("refused");
    assert_eq!(downs, 1);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "SyncUp: region: must not be empty");
    let (downs, status) = first_status(vec![up("mars", 1)]).await;
    let status = status.expect("refused");
    assert_eq!(downs, 0);
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("unknown region mars"),
        "{status:?}"
    );
    let (downs, status) = first_status(vec![up("b", 1), up("b", 2)]).await;
    assert_eq!((downs, status.map(|s| s.code())), (2, None));
    assert_eq!(coordinator.rejected_commands(), 0);
}

/// Streams opened and left idle cannot pile up: past `MAX_SYNC_STREAMS` open at once, one
/// more is refused at once with `RESOURCE_EXHAUSTED`, and a stream that ends gives its place
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_streams_past_the_cap_are_refused_at_once_and_places_come_back() {
    use allot_coordinator::sync_service::MAX_SYNC_STREAMS;
    use allot_proto::sync::v1::sync_client::SyncClient;

    let server = Server::memory(memory_coordinator(), "127.0.0.1:0");
    let url = format!("http://{}", server.address());
    // An HTTP/2 connection carries a bounded number of streams: several connections.
    let mut clients = Vec::new();
    for _ in 0..(MAX_SYNC_STREAMS / 100 + 2) {
        clients.push(SyncClient::connect(url.clone()).await.expect("connects"));
    }
    // Each stream sends nothing; dropping its sender ends it.
    let connections = clients.len();
    let mut open = Vec::new();
    let mut refused = 0;
    for i in 0..(MAX_SYNC_STREAMS + 10) {
        let (send, ups) = tokio::sync::mpsc::channel::<sync_pb::SyncUp>(1);
        let ups = tokio_stream::wrappers::ReceiverStream::new(ups);
        match clients[i % connections].stream(ups).await {
            Ok(answers) => open.push((send, answers)),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((open.len(), refused), (MAX_SYNC_STREAMS, 10));
    // One ends: its place comes back once the server has seen it end.
    drop(open.pop());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (send, ups) = tokio::sync::mpsc::channel::<sync_pb::SyncUp>(1);
        let ups = tokio_stream::wrappers::ReceiverStream::new(ups);
        match clients[0].stream(ups).await {
            Ok(answers) => {
                open.push((send, answers));
                break;
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted),
        }
        assert!(Instant::now() < deadline, "the place never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Takes every SyncUp and never answers.
struct NeverAnswers;

impl SyncHandler for NeverAnswers {
    async fn handle(
        &self,
        _received_at: allot_core::time::Timestamp,
        _up: allot_core::sync::SyncUp,
    ) -> allot_coordinator::sync_service::Answer {
        std::future::pending().await
    }
}

/// A leader that opens the stream and then never answers holds neither the agent's timers
/// (its view expires, which only the timer task reports in the metrics) nor the link (given
/// up after the answer timeout, then tried again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_never_answers_is_given_up_and_the_timers_keep_running() {
    let dir = scratch("never_answers");
    let stuck = Server::handler(NeverAnswers);
    let a = Agent::start(&dir, "a", &stuck.address());
    let s = eventually(
        "given up",
        || a.status(),
        |s| s["sync"]["reconnects"].as_u64() >= Some(1),
    )
    .await;
    let error = s["sync"]["last_error"].as_str().unwrap_or("");
    assert!(error.contains("no answer from"), "{s}");
    assert_eq!(s["sync"]["connected"], false, "{s}");
    assert_eq!(
        a.metric("allot_partition_policy_state{state=\"expired\"}"),
        Some(1.0)
    );
    // Never answered, its store empty: it may be a region that lost its disk, so it admits
    // nothing from its allowances until a coordinator says it never knew it
    // (docs/budget.md, "Restores").
    let d = a.acquire("shared", 1).await;
    assert!(!d.allowed && d.reason == "restoring", "{d:?}");
}

/// Starts region `region`'s agent in `dir` against an in-process coordinator until it has
/// been answered and has admitted one unit of `strict` (so its store is not empty), then
/// stops both, as a kill would.
async fn answered_once(dir: &Path, region: &str) {
    let server = Server::memory(memory_coordinator(), "127.0.0.1:0");
    let agent = Agent::start(dir, region, &server.address());
    let deadline = Instant::now() + PATIENCE;
    while !agent.acquire("strict", 1).await.allowed {
        assert!(
            Instant::now() < deadline,
            "never answered: {}",
            agent.status()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(agent);
    drop(server);
}
