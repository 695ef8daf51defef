//! Hostile input over the wire against a real agent, all at once, while a well-behaved gateway
//! keeps calling (docs/security.md, "Bad input over the wire"): oversized messages, huge
//! descriptors, invalid UTF-8 in a protobuf string, a million distinct keys against a cap of
//! 100,000 per limit, an RLQS stream that never reads its answers, and slow HTTP clients
//! holding connections with half-sent headers.
//!
//! Checked: every hostile call gets a clear status (no success, no internal error); the
//! well-behaved gateway gets every answer, allowed, and its key counts exactly its calls; the
//! agent's keys stay within the cap and its resident memory within a bound; it answers after.
//! Its latency is measured before and during the attack and printed with the ratio (a figure
//! for docs/security.md, not a timed assertion).
//!
//! Slow tier (`ALLOT_SLOW_TESTS=1`): a million keys take a while in a debug build.

mod support;
#[path = "support/wire.rs"]
mod wire;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use allot_proto::envoy::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use allot_proto::envoy::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use allot_proto::envoy::rlqs::{BucketId, RateLimitQuotaUsageReports};
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use support::{Process, scratch, slow_tier};
use tonic::Code;
use tonic::transport::Channel;
use wire::{RawCodec, percentile, rss_bytes, slow_clients};

const LIMITS: &str = "\
domain: api
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000000000}
";
const KEY_CAP: usize = 100_000;
const HOSTILE_KEYS: usize = 1_000_000;
const VICTIM_CALLS: usize = 2_000;
const SLOW_CLIENTS: usize = 200;
/// What each slow client sends before its byte now and then: half a request header.
const SLOW_HEAD: &[u8] = b"POST /v1/acquire HTTP/1.1\r\nHost: x\r\n";
/// Largest growth of the agent's resident memory the attack may cause.
const MAX_RSS_GROWTH_BYTES: u64 = 512 << 20;

fn target(domain: &str, value: &str) -> Option<pb::Target> {
    Some(pb::Target {
        domain: domain.to_owned(),
        entries: vec![pb::Entry {
            key: "user".to_owned(),
            value: value.to_owned(),
        }],
    })
}

/// One allowed unit for `victim`; the call's latency.
async fn victim_call(client: &mut LeaseServiceClient<Channel>, token: Option<&str>) -> Duration {
    let started = Instant::now();
    let request = pb::AcquireRequest {
        target: target("api", "victim"),
        cost_units: 1,
        idempotency_key: String::new(),
    };
    let r = client
        .acquire(with_token(request, token))
        .await
        .expect("the well-behaved gateway is answered");
    assert!(r.into_inner().decision.expect("decision").allowed);
    started.elapsed()
}

enum Phase {
    Run,
}

/// The well-behaved gateway, on its own thread and runtime, so that its latency is the agent's
/// and the machine's, not a wait behind the attackers' tasks in this process.
struct Victim {
    runs: std::sync::mpsc::Sender<Phase>,
    results: std::sync::mpsc::Receiver<Vec<Duration>>,
    thread: std::thread::JoinHandle<()>,
}

impl Victim {
    fn start(grpc: &str, token: Option<&'static str>) -> Victim {
        let (runs, phases) = std::sync::mpsc::channel::<Phase>();
        let (answers, results) = std::sync::mpsc::channel::<Vec<Duration>>();
        let grpc = grpc.to_owned();
        let thread = std::thread::spawn(move || victim_thread(&grpc, token, &phases, &answers));
        Victim {
            runs,
            results,
            thread,
        }
    }

    /// `runs` times `VICTIM_CALLS` calls: their latencies, sorted.
    fn measure(&self, runs: usize) -> Vec<Duration> {
        let mut all = Vec::new();
        for _ in 0..runs {
            self.runs.send(Phase::Run).expect("victim");
            all.extend(self.results.recv().expect("a run"));
        }
        all.sort();
        all
    }

    fn finish(self) {
        drop(self.runs);
        self.thread.join().expect("the victim thread");
    }
}

/// Runs `VICTIM_CALLS` calls for each `Phase::Run` received, answering their latencies, until
/// the sender is dropped.
fn victim_thread(
    grpc: &str,
    token: Option<&str>,
    phases: &std::sync::mpsc::Receiver<Phase>,
    results: &std::sync::mpsc::Sender<Vec<Duration>>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let channel = Channel::from_shared(format!("http://{grpc}"))
            .expect("uri")
            .connect()
            .await
            .expect("connects");
        let mut client = LeaseServiceClient::new(channel);
        while let Ok(Phase::Run) = phases.recv() {
            let run = victim_run(&mut client, token).await;
            if results.send(run).is_err() {
                return;
            }
        }
    });
}

async fn victim_run(
    client: &mut LeaseServiceClient<Channel>,
    token: Option<&str>,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(VICTIM_CALLS);
    for _ in 0..VICTIM_CALLS {
        latencies.push(victim_call(client, token).await);
    }
    latencies.sort();
    latencies
}

/// `message` with `authorization: Bearer TOKEN` when a token is given.
fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    if let Some(t) = token {
        let value = format!("Bearer {t}").parse().expect("ascii");
        r.metadata_mut().insert("authorization", value);
    }
    r
}

/// An AcquireRequest whose target's domain is the bytes 0xff 0xfe: not UTF-8.
async fn invalid_utf8(channel: Channel) -> Code {
    // field 1 (target, length 4) { field 1 (domain, length 2) ff fe }
    let body = vec![0x0a, 0x04, 0x0a, 0x02, 0xff, 0xfe];
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::from_static("/allot.lease.v1.LeaseService/Acquire");
    match grpc.unary(tonic::Request::new(body), path, RawCodec).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// A clear refusal of bad input: not a success, not the server failing.
fn clear(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument | Code::OutOfRange | Code::ResourceExhausted
    )
}

/// Oversized, huge and invalid requests, in a loop until `stop`; counts each refusal.
async fn bad_requests(channel: Channel, stop: Arc<AtomicBool>, refused: Arc<AtomicU64>) {
    let mut client = LeaseServiceClient::new(channel.clone());
    let huge_value = "v".repeat(200_000);
    let long_value = "v".repeat(5_000);
    while !stop.load(Ordering::Relaxed) {
        let oversized = client
            .acquire(pb::AcquireRequest {
                target: target("api", &huge_value),
                cost_units: 1,
                idempotency_key: String::new(),
            })
            .await;
        let many_entries = client
            .acquire(pb::AcquireRequest {
                target: Some(pb::Target {
                    domain: "api".to_owned(),
                    entries: (0..1_000)
                        .map(|i| pb::Entry {
                            key: format!("k{i}"),
                            value: "v".to_owned(),
                        })
                        .collect(),
                }),
                cost_units: 1,
                idempotency_key: String::new(),
            })
            .await;
        let long_entry = client
            .acquire(pb::AcquireRequest {
                target: target("api", &long_value),
                cost_units: 1,
                idempotency_key: String::new(),
            })
            .await;
        for r in [oversized, many_entries, long_entry] {
            let code = r.map_or_else(|s| s.code(), |_| Code::Ok);
            assert!(clear(code), "bad input answered {code:?}");
        }
        let code = invalid_utf8(channel.clone()).await;
        assert!(clear(code), "invalid UTF-8 answered {code:?}");
        refused.fetch_add(4, Ordering::Relaxed);
    }
}

/// `HOSTILE_KEYS` distinct keys in batches of 64 leases, from `tasks` tasks.
async fn many_keys(channel: Channel, task: usize, tasks: usize) -> u64 {
    let mut client = LeaseServiceClient::new(channel);
    let mut degraded = 0;
    let mut next = task * 64;
    while next < HOSTILE_KEYS {
        let leases = (next..(next + 64).min(HOSTILE_KEYS))
            .map(|i| pb::LeaseRequest {
                target: target("api", &format!("k{i}")),
                units_wanted: 1,
                min_units: 1,
                ttl_ms: 1_000,
                ..Default::default()
            })
            .collect();
        let r = client
            .lease_batch(pb::LeaseBatchRequest { leases })
            .await
            .expect("a batch is answered")
            .into_inner();
        for item in r.results {
            if let Some(pb::lease_batch_result::Result::Lease(l)) = item.result
                && l.lease.is_none_or(|l| l.units == 0)
            {
                degraded += 1;
            }
        }
        next += 64 * tasks;
    }
    degraded
}

/// An RLQS stream that sends reports of many buckets and never reads an answer.
async fn never_reads(channel: Channel, stop: Arc<AtomicBool>) {
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let (send, rx) = tokio::sync::mpsc::channel(1);
    let _answers = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let usages = (0..100)
            .map(|j| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [
                        ("domain".to_owned(), "api".to_owned()),
                        ("user".to_owned(), format!("rlqs-{}", (i * 100 + j) % 5_000)),
                    ]
                    .into_iter()
                    .collect(),
                }),
                time_elapsed: None,
                num_requests_allowed: 1,
                num_requests_denied: 0,
            })
            .collect();
        let m = RateLimitQuotaUsageReports {
            domain: "api".to_owned(),
            bucket_quota_usages: usages,
        };
        // Blocks once the agent stops taking them: that is the point.
        if tokio::time::timeout(Duration::from_millis(200), send.send(m))
            .await
            .is_ok_and(|r| r.is_err())
        {
            return;
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clear_statuses_and_leaves_other_callers_served() {
    if !slow_tier() {
        return;
    }
    let dir = scratch("hostile", "all", Some(LIMITS));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, &dir, "local", None);
    cmd.args(["--max-keys-per-limit", &KEY_CAP.to_string()]);
    let agent = Process::start(cmd, "agent");
    let pid = agent.child.id();
    let connect = || async {
        Channel::from_shared(format!("http://{}", agent.grpc))
            .expect("uri")
            .connect()
            .await
            .expect("connects")
    };
    let victim = Victim::start(&agent.grpc, None);
    let measure = |runs| victim.measure(runs);
    measure(1); // warm up
    let rss_before = rss_bytes(pid);
    let mut table = vec![("nothing (baseline)", measure(2))];
    let refused = Arc::new(AtomicU64::new(0));

    // Each attack alone, then all of them together.
    let stop = Arc::new(AtomicBool::new(false));
    let bad = tokio::spawn(bad_requests(connect().await, stop.clone(), refused.clone()));
    table.push(("bad messages in a loop", measure(2)));
    stop.store(true, Ordering::Relaxed);
    bad.await.expect("bad requests");

    let stop = Arc::new(AtomicBool::new(false));
    let rlqs = tokio::spawn(never_reads(connect().await, stop.clone()));
    table.push(("an RLQS stream that never reads", measure(2)));
    stop.store(true, Ordering::Relaxed);
    let _ = rlqs.await;

    let stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let (addr, stop) = (agent.http.clone(), stop.clone());
        std::thread::spawn(move || slow_clients(&addr, SLOW_CLIENTS, SLOW_HEAD, &stop))
    };
    table.push(("200 slow HTTP clients", measure(2)));
    stop.store(true, Ordering::Relaxed);
    slow.join().expect("slow clients");

    let stop = Arc::new(AtomicBool::new(false));
    let bad = tokio::spawn(bad_requests(connect().await, stop.clone(), refused.clone()));
    let rlqs = tokio::spawn(never_reads(connect().await, stop.clone()));
    let slow = {
        let (addr, stop) = (agent.http.clone(), stop.clone());
        std::thread::spawn(move || slow_clients(&addr, SLOW_CLIENTS, SLOW_HEAD, &stop))
    };
    let keys: Vec<_> = (0..2)
        .map(|t| tokio::spawn(many_keys_on(agent.grpc.clone(), t, 2)))
        .collect();
    let attack_started = Instant::now();
    let mut during = Vec::new();
    loop {
        during.extend(measure(1));
        if keys.iter().all(tokio::task::JoinHandle::is_finished) {
            break;
        }
    }
    during.sort();
    let attack_secs = attack_started.elapsed().as_secs_f64();
    table.push(("all of them and a million keys", during));
    victim.finish();
    let mut degraded = 0;
    for k in keys {
        degraded += k.await.expect("the key flood");
    }
    stop.store(true, Ordering::Relaxed);
    bad.await.expect("bad requests");
    let _ = rlqs.await;
    slow.join().expect("slow clients");
    let rss_after = rss_bytes(pid);

    // The warm-up run, then every phase's.
    let calls = VICTIM_CALLS as u64 + table.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
    let key = agent.json("/v1/keys?domain=api&descriptor=user=victim");
    assert_eq!(key["granted_units"].as_u64(), Some(calls), "{key}");
    let tracked = agent.metric("allot_keys{rule=\"api/user\"}");
    assert!(
        tracked > 0.0 && tracked <= KEY_CAP as f64 + 1.0,
        "keys tracked {tracked} past the cap"
    );
    assert!(
        rss_after.saturating_sub(rss_before) < MAX_RSS_GROWTH_BYTES,
        "resident memory grew from {rss_before} to {rss_after}"
    );
    assert_eq!(support::get_text(&agent.http, "/readyz").trim(), "ready");
    let p = |v: &[Duration], q| percentile(v, q).as_secs_f64() * 1e3;
    let base_p99 = p(&table[0].1, 0.99);
    println!("| the well-behaved gateway, during | calls | p50 | p99 | p99 / baseline |");
    println!("| --- | --- | --- | --- | --- |");
    for (what, v) in &table {
        println!(
            "| {what} | {} | {:.2} ms | {:.2} ms | {:.1}x |",
            v.len(),
            p(v, 0.5),
            p(v, 0.99),
            p(v, 0.99) / base_p99
        );
    }
    println!(
        "all at once for {attack_secs:.0} s; {} bad requests refused; {HOSTILE_KEYS} keys, \
         {degraded} refused past the cap; RSS {} -> {} MiB",
        refused.load(Ordering::Relaxed),
        rss_before >> 20,
        rss_after >> 20,
    );
}

async fn many_keys_on(grpc: String, task: usize, tasks: usize) -> u64 {
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    many_keys(channel, task, tasks).await
}

const CAPPED_FLOOD_PER_SEC: u64 = 100;

/// Lease batches of 64 new keys as `token` until `stop`: calls answered, and refused as past
/// the caller's rate.
async fn flood_until(
    grpc: String,
    token: &'static str,
    task: usize,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut client = LeaseServiceClient::new(channel);
    let (mut answered, mut over) = (0, 0);
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let leases = (next..next + 64)
            .map(|i| pb::LeaseRequest {
                target: target("api", &format!("{token}-{task}-{i}")),
                units_wanted: 1,
                min_units: 1,
                ttl_ms: 1_000,
                ..Default::default()
            })
            .collect();
        next += 64;
        match client
            .lease_batch(with_token(pb::LeaseBatchRequest { leases }, Some(token)))
            .await
        {
            Ok(_) => answered += 1,
            Err(e) if e.code() == Code::ResourceExhausted => over += 1,
            Err(e) => panic!("the flood got {e:?}"),
        }
    }
    (answered, over)
}

/// The same key flood from a named caller without a cap, then from one capped by
/// `max_calls_per_sec` (D59): the capped flood's calls past its rate are refused before they
/// are read, and the well-behaved gateway's latency is printed for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_callers_flood_is_refused_before_it_is_read() {
    if !slow_tier() {
        return;
    }
    let dir = scratch("hostile", "capped", Some(LIMITS));
    let callers = dir.join("callers.json");
    let entry = |name: &str, token: &str, cap: Option<u64>| {
        let mut e = serde_json::json!({ "name": name, "token_sha256": support::sha256_hex(token),
                                        "domains": ["*"] });
        if let Some(c) = cap {
            e["max_calls_per_sec"] = c.into();
        }
        e
    };
    let file = serde_json::json!({ "callers": [
        entry("victim", "victim-t", None),
        entry("flood", "flood-t", None),
        entry("capped", "capped-t", Some(CAPPED_FLOOD_PER_SEC)),
    ]});
    std::fs::write(&callers, file.to_string()).expect("callers file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, &dir, "local", None);
    cmd.arg("--callers").arg(&callers);
    let agent = Process::start(cmd, "agent");

    let victim = Victim::start(&agent.grpc, Some("victim-t"));
    let measure = |runs| victim.measure(runs);
    measure(1); // warm up
    let mut table = vec![("nothing (baseline)".to_owned(), measure(2), 0, 0)];
    for (what, token) in [
        ("a key flood, uncapped", "flood-t"),
        ("the same flood, capped at 100 calls a second", "capped-t"),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let floods: Vec<_> = (0..2)
            .map(|t| tokio::spawn(flood_until(agent.grpc.clone(), token, t, stop.clone())))
            .collect();
        let started = Instant::now();
        let during = measure(2);
        let secs = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let (mut answered, mut over) = (0, 0);
        for f in floods {
            let (a, o) = f.await.expect("a flood");
            answered += a;
            over += o;
        }
        if token == "capped-t" {
            let most = CAPPED_FLOOD_PER_SEC as f64 * (1.0 + secs + 1.0);
            assert!(
                answered as f64 <= most,
                "{answered} calls answered in {secs:.2} s"
            );
            assert!(over > 0, "the flood never passed its rate");
        }
        table.push((what.to_owned(), during, answered, over));
    }
    victim.finish();

    let victim_calls = VICTIM_CALLS as u64 + table.iter().map(|t| t.1.len() as u64).sum::<u64>();
    let key = agent.json("/v1/keys?domain=api&descriptor=user=victim");
    assert_eq!(key["granted_units"].as_u64(), Some(victim_calls), "{key}");
    let p = |v: &[Duration], q| percentile(v, q).as_secs_f64() * 1e3;
    let base_p99 = p(&table[0].1, 0.99);
    println!(
        "| the well-behaved gateway, during | p50 | p99 | p99 / baseline | flood calls answered | refused |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (what, v, answered, over) in &table {
        println!(
            "| {what} | {:.2} ms | {:.2} ms | {:.1}x | {answered} | {over} |",
            p(v, 0.5),
            p(v, 0.99),
            p(v, 0.99) / base_p99
        );
    }
}
