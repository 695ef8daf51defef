//! The agent's RLQS service over the wire, with a test client in Envoy's place: the input
//! bounds of docs/rlqs.md ("Bounds") hold on a running agent, each with its status and its
//! metric, and a refused bucket costs the others nothing.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use allot_proto::envoy::rlqs::rate_limit_quota_response::bucket_action::BucketAction as Action;
use allot_proto::envoy::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use allot_proto::envoy::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
use allot_proto::envoy::rlqs::{BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use allot_proto::envoy::types::rate_limit_strategy::{BlanketRule, Strategy};
use serde_json::Value;
use support::{Process, scratch, slow_tier};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const LIMITS: &str = "\
domain: wire
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000000}
";
/// The agent's caps (agent/src/rlqs/mod.rs), as documented.
const MAX_REPORTS_PER_MESSAGE: usize = 1_000;
const MAX_BUCKETS_PER_STREAM: usize = 10_000;
const MAX_BUCKETS_PER_AGENT: usize = 100_000;
/// At most one assignment per bucket in this long (agent/src/rlqs/stream.rs).
const MIN_REASSIGN_GAP: Duration = Duration::from_millis(500);
/// Longest a test waits for one answer from the agent.
const ANSWER_WAIT: Duration = Duration::from_secs(20);

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

fn usage(id: BucketId) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    }
}

fn reports(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "wire".to_owned(),
        bucket_quota_usages: usages,
    }
}

/// One open stream to the agent: what the test sends, and what comes back.
struct Stream {
    send: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(agent: &Process) -> Stream {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", agent.grpc))
            .await
            .expect("connects to the agent")
            .max_decoding_message_size(64 << 20);
        let (send, rx) = mpsc::channel(16);
        let answers = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .expect("the stream opens")
            .into_inner();
        Stream { send, answers }
    }

    async fn send(&self, m: RateLimitQuotaUsageReports) {
        self.send.send(m).await.expect("the stream takes it");
    }

    /// The next answer, or the status the stream ended with.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        tokio::time::timeout(ANSWER_WAIT, self.answers.message())
            .await
            .expect("the agent answers")
            .and_then(|m| m.ok_or_else(|| tonic::Status::unknown("the stream ended")))
    }
}

fn refused(agent: &Process, reason: &str) -> f64 {
    agent.metric(&format!("allot_rlqs_refused_total{{reason=\"{reason}\"}}"))
}

/// The bucket ids of an answer's token bucket assignments.
/// A new stream's report of one new bucket, `api_key` = `key`, is answered with its
/// assignment: the agent still serves other streams.
async fn a_new_stream_is_served(agent: &Process, key: &str) {
    let mut other = Stream::open(agent).await;
    other
        .send(reports(vec![usage(bucket(&[("api_key", key)]))]))
        .await;
    let answer = other.next().await.expect("an answer");
    assert_eq!(assigned(&answer).len(), 1, "{answer:?}");
}

fn assigned(r: &RateLimitQuotaResponse) -> Vec<HashMap<String, String>> {
    r.bucket_action
        .iter()
        .filter(|a| matches!(a.bucket_action, Some(Action::QuotaAssignmentAction(_))))
        .filter_map(|a| a.bucket_id.as_ref().map(|b| b.bucket.clone()))
        .collect()
}

#[tokio::test]
async fn a_message_with_too_many_reports_ends_its_stream_and_no_other() {
    let dir = scratch("rlqs_wire", "too_many_reports", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let usages = (0..=MAX_REPORTS_PER_MESSAGE)
        .map(|i| usage(bucket(&[("api_key", &format!("k{i}"))])))
        .collect();
    stream.send(reports(usages)).await;
    let status = stream.next().await.expect_err("the stream ends");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("at most 1000 bucket usage reports"),
        "{status:?}"
    );
    assert_eq!(refused(&agent, "too_many_reports"), 1.0);
    // Another stream is served as before.
    a_new_stream_is_served(&agent, "k1").await;
}

#[tokio::test]
async fn a_bad_bucket_is_refused_alone_and_the_others_are_assigned() {
    let dir = scratch("rlqs_wire", "bad_bucket", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let too_many_entries: Vec<(String, String)> =
        (0..40).map(|i| (format!("e{i}"), "v".to_owned())).collect();
    let too_many_entries: Vec<(&str, &str)> = too_many_entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let usages = vec![
        // No entry but the domain: nothing to match a rule with.
        usage(bucket(&[("domain", "wire")])),
        usage(bucket(&too_many_entries)),
        BucketQuotaUsage {
            bucket_id: None,
            ..usage(bucket(&[]))
        },
        usage(bucket(&[("api_key", "good")])),
    ];
    stream.send(reports(usages)).await;
    let answer = stream.next().await.expect("an answer, not an error");
    let good: HashMap<String, String> = [("api_key".to_owned(), "good".to_owned())].into();
    assert_eq!(assigned(&answer), vec![good], "{answer:?}");
    assert_eq!(refused(&agent, "bad_bucket"), 3.0);
    // The stream is still open: the good bucket's next report is answered too.
    tokio::time::sleep(Duration::from_millis(600)).await;
    stream
        .send(reports(vec![usage(bucket(&[("api_key", "good")]))]))
        .await;
    let again = stream.next().await.expect("the stream lives on");
    assert_eq!(assigned(&again).len(), 1, "{again:?}");
}

#[tokio::test]
async fn a_stream_past_its_bucket_cap_ends_with_resource_exhausted() {
    let dir = scratch("rlqs_wire", "bucket_cap", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let mut sent = 0;
    let status = loop {
        let usages: Vec<BucketQuotaUsage> = (sent..sent + MAX_REPORTS_PER_MESSAGE)
            .map(|i| usage(bucket(&[("api_key", &format!("k{i}"))])))
            .collect();
        sent += usages.len();
        stream.send(reports(usages)).await;
        match stream.next().await {
            Ok(_) => assert!(
                sent <= MAX_BUCKETS_PER_STREAM,
                "{sent} buckets held by one stream"
            ),
            Err(status) => break status,
        }
    };
    assert_eq!(sent, MAX_BUCKETS_PER_STREAM + MAX_REPORTS_PER_MESSAGE);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(refused(&agent, "too_many_buckets_stream"), 1.0);
    // The stream's buckets were given back: a new stream takes new buckets.
    a_new_stream_is_served(&agent, "after").await;
}

/// A report within `MIN_REASSIGN_GAP` of the bucket's last assignment is counted and not
/// answered (a flood of reports costs no lease call each); the first report after the gap is.
#[tokio::test]
async fn reports_inside_the_reassign_gap_are_counted_not_answered() {
    let dir = scratch("rlqs_wire", "reassign_gap", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let k = || reports(vec![usage(bucket(&[("api_key", "k")]))]);
    stream.send(k()).await;
    let first = stream.next().await.expect("an answer");
    assert_eq!(assigned(&first).len(), 1, "{first:?}");
    let reports_before = agent.metric("allot_rlqs_bucket_reports_total");
    for _ in 0..20 {
        stream.send(k()).await;
    }
    let quiet = tokio::time::timeout(MIN_REASSIGN_GAP / 2, stream.answers.message()).await;
    assert!(quiet.is_err(), "answered inside the gap: {quiet:?}");
    support::eventually(
        "the 20 reports counted",
        || agent.metric("allot_rlqs_bucket_reports_total"),
        |n| *n >= reports_before + 20.0,
    )
    .await;
    tokio::time::sleep(MIN_REASSIGN_GAP).await;
    stream.send(k()).await;
    let after = stream.next().await.expect("answered after the gap");
    assert_eq!(assigned(&after).len(), 1, "{after:?}");
}

/// The TTL and strategy of the answer's one assignment.
fn only_assignment(r: &RateLimitQuotaResponse) -> (i64, &Strategy) {
    let [action] = r.bucket_action.as_slice() else {
        panic!("one bucket action: {r:?}");
    };
    let Some(Action::QuotaAssignmentAction(a)) = &action.bucket_action else {
        panic!("an assignment: {r:?}");
    };
    let ttl_secs = a.assignment_time_to_live.expect("a TTL").seconds;
    let strategy = a
        .rate_limit_strategy
        .as_ref()
        .and_then(|s| s.strategy.as_ref());
    (ttl_secs, strategy.expect("a strategy"))
}

/// The TTL and token bucket of the answer's one token bucket assignment.
fn token_bucket(r: &RateLimitQuotaResponse) -> (i64, u32, u32) {
    let (ttl_secs, strategy) = only_assignment(r);
    let Strategy::TokenBucket(tb) = strategy else {
        panic!("a token bucket: {r:?}");
    };
    let fill = tb.tokens_per_fill.expect("a fill").value;
    (ttl_secs, tb.max_tokens, fill)
}

/// Before a stream has seen Envoy's reporting interval, a bucket's first assignment assumes
/// 5 s (TTL 10 s) and is paced on what the region holds for the key to the window's end;
/// the next assignment is sized from the reported rate. The interval is learnt from the gap
/// between a bucket's second and third reports (the first report comes at once), and a new
/// stream assumes it.
#[tokio::test]
async fn first_assignments_assume_the_interval_last_learnt_and_are_paced_on_the_window() {
    let dir = scratch("rlqs_wire", "first_assignment", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let k = |elapsed_secs: i64| {
        let mut u = usage(bucket(&[("api_key", "k")]));
        u.time_elapsed = Some(allot_proto::envoy::wkt::Duration {
            seconds: elapsed_secs,
            nanos: 0,
        });
        reports(vec![u])
    };
    stream.send(k(0)).await;
    let (ttl_secs, _, fill) = token_bucket(&stream.next().await.expect("an answer"));
    assert_eq!(ttl_secs, 10, "the assumed 5 s interval, twice");
    // 1,000,000 a day: at least 12 a second to the day's end, 18 with the headroom; the
    // report itself says 1 a second.
    assert!(
        fill >= 18,
        "paced on the window, not on the one request: {fill}"
    );
    // The gap after the first report is not an interval; the next one is (about 1.2 s).
    tokio::time::sleep(Duration::from_millis(700)).await;
    stream.send(k(1)).await;
    let (_, _, fill) = token_bucket(&stream.next().await.expect("an answer"));
    assert_eq!(fill, 2, "sized from the reported rate of 1 a second");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    stream.send(k(1)).await;
    let (learnt_ttl_secs, _, _) = token_bucket(&stream.next().await.expect("an answer"));
    assert!(
        (4..10).contains(&learnt_ttl_secs),
        "twice the learnt interval (about 1.2 s, whole seconds up): {learnt_ttl_secs}"
    );
    let mut other = Stream::open(&agent).await;
    other
        .send(reports(vec![usage(bucket(&[("api_key", "new")]))]))
        .await;
    let (ttl_secs, _, _) = token_bucket(&other.next().await.expect("an answer"));
    assert_eq!(
        ttl_secs, learnt_ttl_secs,
        "a new stream assumes the interval learnt"
    );
}

/// A rule of one-second windows cannot be served by RLQS (no lease outlives its window, and
/// an assignment needs seconds): the bucket is answered deny-all, counted, every time, and the
/// agent says why in its log.
#[tokio::test]
async fn a_rule_of_one_second_windows_is_answered_deny_all_and_counted() {
    const PER_SECOND: &str = "\
domain: wire
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000}
";
    let dir = scratch("rlqs_wire", "one_second_windows", Some(PER_SECOND));
    let agent = Process::agent(&dir, "local", None);
    let mut stream = Stream::open(&agent).await;
    let k = || reports(vec![usage(bucket(&[("api_key", "k")]))]);
    for round in 0..2 {
        if round > 0 {
            tokio::time::sleep(MIN_REASSIGN_GAP).await;
        }
        stream.send(k()).await;
        let answer = stream.next().await.expect("an answer");
        let (_, strategy) = only_assignment(&answer);
        assert_eq!(
            strategy,
            &Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            "{answer:?}"
        );
    }
    assert_eq!(agent.metric("allot_rlqs_short_window_denials_total"), 2.0);
    let log = std::fs::read_to_string(&agent.log).expect("the agent's log");
    assert_eq!(
        log.matches("RLQS cannot serve this rule").count(),
        1,
        "said once per rule and stream"
    );
}

/// A coordinator and region `a`'s agent, synced, over `limits`.
async fn coordinated(name: &str, limits: &str) -> (Process, Process) {
    let dir = scratch("rlqs_wire", name, Some(limits));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_allot"));
    let (grpc, http) = (support::free_port(), support::free_port());
    cmd.current_dir(&dir)
        .arg("coordinator")
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--data", "coordinator", "--limits", "limits.yaml"]);
    let coordinator = Process::start(cmd, "coordinator");
    let agent = Process::agent(&dir, "a", Some(&coordinator.grpc));
    agent.synced().await;
    (coordinator, agent)
}

/// A report of key `k`'s bucket with `allowed` requests.
fn k(allowed: u64) -> RateLimitQuotaUsageReports {
    let mut u = usage(bucket(&[("api_key", "k")]));
    u.num_requests_allowed = allowed;
    reports(vec![u])
}

/// On a new stream: key `k`'s first report (answered with its first assignment, on a lease),
/// then a report of `allowed` more inside the reassign gap (counted beyond the lease, not
/// answered); the stream then ends, so what the lease did not hold is Envoy's fallback.
async fn report_beyond_a_first_lease(agent: &Process, allowed: u64) {
    let mut stream = Stream::open(agent).await;
    stream.send(k(1)).await;
    let first = stream.next().await.expect("an answer");
    assert_eq!(assigned(&first).len(), 1, "{first:?}");
    let reports_before = agent.metric("allot_rlqs_bucket_reports_total");
    stream.send(k(allowed)).await;
    support::eventually(
        "the report counted",
        || agent.metric("allot_rlqs_bucket_reports_total"),
        |n| *n > reports_before,
    )
    .await;
    drop(stream);
}

/// The coordinator's statement of `window` of the only limit, once it has one.
async fn bound_of(coordinator: &Process, window: u64, ok: impl Fn(&Value) -> bool) -> Value {
    let status = support::eventually(
        "the coordinator's bound of the window",
        || coordinator.json("/v1/status"),
        |s| {
            s["limits"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|l| l["bound"]["window"] == window && ok(&l["bound"]))
        },
    )
    .await;
    status["limits"][0]["bound"].clone()
}

/// A rule that states Envoy's fallback (`rlqs_fallback_units`, D69): usage reported beyond
/// every lease is charged to that allowance and covered by the bound's `rlqs_fallback` term
/// (2 regions x 300), so the window keeps a finite bound; more than the allowance in the
/// same window and key breaks the statement, and the coordinator states it unbounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stated_fallback_is_a_term_and_fallback_past_it_unbounds_the_window() {
    const STATED: &str = "\
domain: wire
descriptors:
  - key: api_key
    rate_limit: {requests_per_unit: 100}
    allot: {window: 20s, weights: {a: 0.5, b: 0.5}, rlqs_fallback_units: 300}
";
    let (coordinator, agent) = coordinated("stated_fallback", STATED).await;
    // A window that begins after the agent first ran: one begun before has no allowance
    // (the agent cannot know what an earlier start charged in it).
    let window = support::next_window_start(Duration::from_secs(20)).await;
    // A first lease of at most a's share, 50, and 150 reported beyond it.
    report_beyond_a_first_lease(&agent, 150).await;
    let within = support::eventually(
        "the usage beyond the lease charged to the allowance",
        || agent.metric("allot_rlqs_fallback_units_total"),
        |n| *n > 0.0,
    )
    .await;
    assert!((101.0..=150.0).contains(&within), "{within}");
    assert_eq!(agent.metric("allot_rlqs_uncharged_units_total"), 0.0);
    let bound = bound_of(&coordinator, window, |b| {
        b["terms"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == "rlqs_fallback" && t["units"] == 600)
    })
    .await;
    assert!(bound["unbounded"].is_null(), "{bound}");
    // The same key and window again, past what is left of its 300.
    let mut stream = Stream::open(&agent).await;
    stream.send(k(400)).await;
    stream.next().await.expect("an answer");
    drop(stream);
    let beyond = support::eventually(
        "the usage past the allowance charged nowhere",
        || agent.metric("allot_rlqs_uncharged_units_total"),
        |n| *n > 0.0,
    )
    .await;
    let total = agent.metric("allot_rlqs_fallback_units_total");
    assert_eq!(total, 300.0, "the allowance is used up, no more");
    assert!(beyond >= 400.0 - (300.0 - within) - 50.0, "{beyond}");
    let bound = bound_of(&coordinator, window, |b| b["unbounded"].is_string()).await;
    assert!(
        bound["unbounded"]
            .as_str()
            .is_some_and(|why| why.contains("a's gateways reported")),
        "{bound}"
    );
}

/// Envoy's fallback admissions beyond every lease, reported and then charged nowhere (the
/// stream ends before a lease could be settled with them), make the coordinator state the
/// window unbounded, naming the region's gateways: the bound never stays finite over
/// admissions the agent heard of and could not charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_charged_nowhere_leave_the_window_unbounded_at_the_coordinator() {
    const COORDINATED: &str = "\
domain: wire
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 100}
    allot: {weights: {a: 0.5, b: 0.5}}
";
    support::clear_of_the_day_boundary().await;
    let (coordinator, agent) = coordinated("charged_nowhere", COORDINATED).await;
    report_beyond_a_first_lease(&agent, 500).await;
    support::eventually(
        "the usage beyond the lease charged nowhere",
        || agent.metric("allot_rlqs_uncharged_units_total"),
        |n| *n > 0.0,
    )
    .await;
    let status = support::eventually(
        "the coordinator states the window unbounded",
        || coordinator.json("/v1/status"),
        |s| {
            s["limits"].as_array().into_iter().flatten().any(|l| {
                l["bound"]["unbounded"]
                    .as_str()
                    .is_some_and(|why| why.contains("a's gateways reported"))
            })
        },
    )
    .await;
    eprintln!("{}", status["limits"]);
}

/// Slow tier: the agent-wide cap. Ten streams hold 10,000 buckets each; the next new bucket,
/// on an eleventh stream, ends that stream with RESOURCE_EXHAUSTED and
/// `too_many_buckets_agent`, and the ten go on being answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_past_the_agent_cap_end_only_the_stream_that_asks() {
    if !slow_tier() {
        return;
    }
    let dir = scratch("rlqs_wire", "agent_cap", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let streams_needed = MAX_BUCKETS_PER_AGENT / MAX_BUCKETS_PER_STREAM;
    let mut full = Vec::new();
    for s in 0..streams_needed {
        let mut stream = Stream::open(&agent).await;
        for first in (0..MAX_BUCKETS_PER_STREAM).step_by(MAX_REPORTS_PER_MESSAGE) {
            let usages = (first..first + MAX_REPORTS_PER_MESSAGE)
                .map(|i| usage(bucket(&[("api_key", &format!("s{s}k{i}"))])))
                .collect();
            stream.send(reports(usages)).await;
            stream.next().await.expect("under the caps");
        }
        full.push(stream);
    }
    assert_eq!(
        agent.metric("allot_rlqs_buckets"),
        MAX_BUCKETS_PER_AGENT as f64
    );
    let mut last = Stream::open(&agent).await;
    last.send(reports(vec![usage(bucket(&[("api_key", "one-more")]))]))
        .await;
    let status = last.next().await.expect_err("the stream ends");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("100000 RLQS buckets"),
        "{status:?}"
    );
    assert_eq!(refused(&agent, "too_many_buckets_agent"), 1.0);
    // The streams at the cap are served as before: a held bucket's report is answered.
    tokio::time::sleep(MIN_REASSIGN_GAP).await;
    let first = &mut full[0];
    first
        .send(reports(vec![usage(bucket(&[("api_key", "s0k0")]))]))
        .await;
    let answer = first.next().await.expect("still served");
    assert_eq!(assigned(&answer).len(), 1, "{answer:?}");
}

/// A stream whose client sends reports and never reads the answers holds only its own task
/// (the answers wait in a bounded queue, then in HTTP/2 flow control): another stream opened
/// meanwhile is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_reads_its_answers_holds_up_no_other() {
    let dir = scratch("rlqs_wire", "never_reads", Some(LIMITS));
    let agent = Process::agent(&dir, "local", None);
    let stuck = Stream::open(&agent).await;
    let flood = tokio::spawn(async move {
        // About 100 KB of answer per message, every message past the reassign gap.
        for _ in 0..10 {
            let usages = (0..MAX_REPORTS_PER_MESSAGE)
                .map(|i| usage(bucket(&[("api_key", &format!("stuck{i}"))])))
                .collect();
            if stuck.send.send(reports(usages)).await.is_err() {
                break;
            }
            tokio::time::sleep(MIN_REASSIGN_GAP + Duration::from_millis(100)).await;
        }
        stuck
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Answered within `ANSWER_WAIT`: a stuck stream holding anything the others need (the
    // machine's lock, the lease path) would hold this answer for as long as it stays stuck.
    a_new_stream_is_served(&agent, "other").await;
    let stuck = flood.await.expect("the flood ends");
    drop(stuck);
}
