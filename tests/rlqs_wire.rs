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
use support::{Process, scratch};
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
    let mut other = Stream::open(&agent).await;
    other
        .send(reports(vec![usage(bucket(&[("api_key", "k1")]))]))
        .await;
    let answer = other.next().await.expect("an answer");
    assert_eq!(assigned(&answer).len(), 1, "{answer:?}");
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
    let mut other = Stream::open(&agent).await;
    other
        .send(reports(vec![usage(bucket(&[("api_key", "after")]))]))
        .await;
    assert_eq!(assigned(&other.next().await.expect("an answer")).len(), 1);
}
