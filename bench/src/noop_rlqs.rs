//! The no-op rate limit quota service (RLQS, `StreamRateLimitQuotas`): every message of bucket
//! usage reports is answered at once with one assignment per bucket that never refuses, and
//! nothing is counted, leased or remembered. Envoy's quota filter against it costs what the
//! protocol costs and nothing more: the ceiling the agent's RLQS path is held to.
//!
//! By default the assignment is a token bucket that never runs dry ([`NEVER_DRY_TOKENS`]
//! tokens, refilled in full every second), so Envoy does per request exactly the work it does
//! under the agent's token buckets; [`NoopRlqsAssignment::AllowAll`] sends Envoy's blanket
//! allow-all instead, the cheapest assignment Envoy enforces.

use std::time::Duration;

use allot_proto::envoy::rlqs::rate_limit_quota_response::BucketAction;
use allot_proto::envoy::rlqs::rate_limit_quota_response::bucket_action::{
    BucketAction as Action, QuotaAssignmentAction,
};
use allot_proto::envoy::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use allot_proto::envoy::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use allot_proto::envoy::types::rate_limit_strategy::{BlanketRule, Strategy};
use allot_proto::envoy::types::{RateLimitStrategy, TokenBucket};
use allot_proto::envoy::wkt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Tokens of the never-dry token bucket, and its refill per [`NEVER_DRY_FILL_INTERVAL`]:
/// Envoy's counter is a `u32`, and no run sends this many requests in a second.
pub const NEVER_DRY_TOKENS: u32 = u32::MAX;

/// How often the never-dry bucket refills in full.
pub const NEVER_DRY_FILL_INTERVAL: Duration = Duration::from_secs(1);

/// The TTL of every assignment: the agent's longest (`MAX_TTL_SECS`), longer than Envoy's
/// reporting interval, so an assignment is renewed by the next report before it lapses.
pub const NOOP_RLQS_TTL: Duration = Duration::from_secs(20);

/// Answers queued per stream, as the agent's `RESPONSE_QUEUE`: a stream that does not read
/// stops being read.
pub const NOOP_RLQS_RESPONSE_QUEUE: usize = 16;

/// The assignment the no-op service sends every bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NoopRlqsAssignment {
    /// A token bucket of [`NEVER_DRY_TOKENS`], refilled in full every second.
    #[default]
    TokenBucket,
    /// Envoy's blanket `ALLOW_ALL`.
    AllowAll,
}

/// The no-op RLQS service, cheap to clone (tonic clones it per connection).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopRlqs {
    assignment: NoopRlqsAssignment,
}

impl NoopRlqs {
    pub fn new(assignment: NoopRlqsAssignment) -> Self {
        NoopRlqs { assignment }
    }

    /// One assignment per bucket of `reports`, in order; a report without a bucket id is
    /// skipped (there is nothing to name in the answer).
    pub fn answer(&self, reports: &RateLimitQuotaUsageReports) -> RateLimitQuotaResponse {
        let bucket_action = reports
            .bucket_quota_usages
            .iter()
            .filter_map(|usage| usage.bucket_id.clone())
            .map(|bucket_id| BucketAction {
                bucket_id: Some(bucket_id),
                bucket_action: Some(self.action()),
            })
            .collect();
        RateLimitQuotaResponse { bucket_action }
    }

    fn action(&self) -> Action {
        let strategy = match self.assignment {
            NoopRlqsAssignment::TokenBucket => Strategy::TokenBucket(TokenBucket {
                max_tokens: NEVER_DRY_TOKENS,
                tokens_per_fill: Some(wkt::UInt32Value {
                    value: NEVER_DRY_TOKENS,
                }),
                fill_interval: Some(proto_duration(NEVER_DRY_FILL_INTERVAL)),
            }),
            NoopRlqsAssignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        };
        Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(proto_duration(NOOP_RLQS_TTL)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })
    }
}

/// Whole seconds only: Envoy reads a fill interval's and a TTL's seconds.
fn proto_duration(d: Duration) -> wkt::Duration {
    wkt::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for NoopRlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let (tx, rx) = mpsc::channel(NOOP_RLQS_RESPONSE_QUEUE);
        let service = *self;
        let mut reports = request.into_inner();
        tokio::spawn(async move {
            // Until Envoy ends the stream (or breaks it) or stops taking answers.
            while let Ok(Some(m)) = reports.message().await {
                let answer = service.answer(&m);
                if answer.bucket_action.is_empty() {
                    continue;
                }
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::net::SocketAddr;

    use allot_proto::envoy::rlqs::BucketId;
    use allot_proto::envoy::rlqs::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use allot_proto::envoy::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
    use allot_proto::envoy::rlqs::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use tokio::net::TcpListener;
    use tonic::transport::server::TcpIncoming;

    use super::*;

    /// Longest a test waits for an answer.
    const ANSWER_WAIT: Duration = Duration::from_secs(10);

    fn usage(api_key: &str, allowed: u64) -> BucketQuotaUsage {
        BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: HashMap::from([
                    ("domain".to_owned(), "bench".to_owned()),
                    ("api_key".to_owned(), api_key.to_owned()),
                ]),
            }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }
    }

    fn reports(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
        RateLimitQuotaUsageReports {
            domain: "bench".to_owned(),
            bucket_quota_usages: usages,
        }
    }

    /// Serves `service` alone on a loopback port.
    async fn serve(service: NoopRlqs) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitQuotaServiceServer::new(service))
                .serve_with_incoming(TcpIncoming::from(listener)),
        );
        addr
    }

    fn api_keys(r: &RateLimitQuotaResponse) -> Vec<String> {
        r.bucket_action
            .iter()
            .map(|a| a.bucket_id.as_ref().unwrap().bucket["api_key"].clone())
            .collect()
    }

    fn strategy(a: &BucketAction) -> Strategy {
        match a.bucket_action.as_ref().unwrap() {
            Action::QuotaAssignmentAction(q) => {
                assert_eq!(
                    q.assignment_time_to_live.unwrap().seconds,
                    NOOP_RLQS_TTL.as_secs() as i64
                );
                q.rate_limit_strategy.unwrap().strategy.unwrap()
            }
            Action::AbandonAction(_) => panic!("the no-op service never abandons"),
        }
    }

    #[tokio::test]
    async fn every_bucket_of_every_report_gets_a_never_dry_token_bucket_over_the_wire() {
        let addr = serve(NoopRlqs::new(NoopRlqsAssignment::TokenBucket)).await;
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        let (send, rx) = mpsc::channel(4);
        let mut answers = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        // Two messages on one stream: each is answered, bucket for bucket.
        for keys in [vec!["a", "b", "c"], vec!["b", "d"]] {
            let usages = keys.iter().map(|k| usage(k, 1_000_000)).collect();
            send.send(reports(usages)).await.unwrap();
            let answer = tokio::time::timeout(ANSWER_WAIT, answers.message())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(api_keys(&answer), keys);
            for a in &answer.bucket_action {
                let Strategy::TokenBucket(tb) = strategy(a) else {
                    panic!("a token bucket, got {a:?}");
                };
                assert_eq!(tb.max_tokens, u32::MAX);
                assert_eq!(tb.tokens_per_fill.unwrap().value, u32::MAX);
                assert_eq!(tb.fill_interval.unwrap().seconds, 1);
            }
        }
        // The client ending its side ends the stream.
        drop(send);
        let end = tokio::time::timeout(ANSWER_WAIT, answers.message()).await;
        assert!(matches!(end, Ok(Ok(None))), "{end:?}");
    }

    #[test]
    fn allow_all_is_sent_as_the_blanket_rule_and_buckets_without_an_id_are_skipped() {
        let service = NoopRlqs::new(NoopRlqsAssignment::AllowAll);
        let mut no_id = usage("x", 1);
        no_id.bucket_id = None;
        let answer = service.answer(&reports(vec![usage("a", 1), no_id, usage("b", 0)]));
        assert_eq!(api_keys(&answer), ["a", "b"]);
        for a in &answer.bucket_action {
            assert_eq!(
                strategy(a),
                Strategy::BlanketRule(BlanketRule::AllowAll as i32)
            );
        }
        assert!(
            service
                .answer(&reports(Vec::new()))
                .bucket_action
                .is_empty()
        );
    }
}
