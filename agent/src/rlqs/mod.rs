//! Envoy's rate limit quota service v3 (RLQS, `StreamRateLimitQuotas`): Envoy's
//! `envoy.filters.http.rate_limit_quota` filter reports usage per bucket over one stream and
//! enforces, with no call per request, the assignments the agent sends back.
//!
//! - [`bucket`]: a bucket id as a target (the `domain` entry convention) and the leases
//!   behind a bucket's assignments.
//! - [`policy`]: how an assignment's token bucket, TTL and lease are sized (pure).
//! - [`stream`]: one stream's task: reports in, assignments out, reloads and bounds.
//!
//! Every token bucket sent is backed by a lease of the region's allowance, so the quota, the
//! bound and the multi-region guarantees hold for Envoy's traffic as for the lease API's.

pub mod bucket;
pub mod policy;
pub mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use allot_proto::envoy::rlqs::rate_limit_quota_service_server::RateLimitQuotaService;
use allot_proto::envoy::rlqs::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::state::Agent;

/// Buckets one stream may hold; one more ends the stream with `RESOURCE_EXHAUSTED`.
pub const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Buckets all streams together may hold; one more ends that stream with
/// `RESOURCE_EXHAUSTED`.
pub const MAX_BUCKETS_PER_AGENT: usize = 100_000;
/// Bucket usage reports in one message; more ends the stream with `RESOURCE_EXHAUSTED` (the
/// gRPC message size cap, `MAX_MESSAGE_BYTES`, bounds a message's bytes before that).
pub const MAX_REPORTS_PER_MESSAGE: usize = 1_000;
/// Answers queued for Envoy per stream; a stream that does not read stops being read.
pub const RESPONSE_QUEUE: usize = 16;

/// The gRPC service: one task per stream ([`stream::serve`]).
#[derive(Clone)]
pub struct Rlqs {
    agent: Arc<Agent>,
    buckets: Arc<AtomicUsize>,
    /// Envoy's reporting interval as last learnt by a stream, in milliseconds (0: none).
    learned_interval_ms: Arc<AtomicU64>,
}

impl Rlqs {
    pub fn new(agent: Arc<Agent>) -> Self {
        Rlqs {
            agent,
            buckets: Arc::new(AtomicUsize::new(0)),
            learned_interval_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let (tx, rx) = mpsc::channel(RESPONSE_QUEUE);
        metrics::stream_opened();
        let caller = crate::service::caller_of(&request);
        tokio::spawn(stream::serve(
            stream::Shared {
                agent: self.agent.clone(),
                agent_buckets: self.buckets.clone(),
                learned_interval_ms: self.learned_interval_ms.clone(),
                caller,
            },
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The RLQS metrics (names in docs/agent.md).
pub mod metrics {
    use metrics::{counter, gauge};

    pub const STREAMS: &str = "allot_rlqs_streams_total";
    pub const REPORTS: &str = "allot_rlqs_bucket_reports_total";
    pub const RESPONSES: &str = "allot_rlqs_responses_total";
    pub const ASSIGNMENTS: &str = "allot_rlqs_assignments_total";
    pub const REFUSED: &str = "allot_rlqs_refused_total";
    pub const BUCKETS: &str = "allot_rlqs_buckets";
    pub const OVERAGE_UNITS: &str = "allot_rlqs_overage_units_total";
    pub const UNCHARGED_UNITS: &str = "allot_rlqs_uncharged_units_total";
    pub const FALLBACK_UNITS: &str = "allot_rlqs_fallback_units_total";
    pub const BUCKETS_DROPPED: &str = "allot_rlqs_buckets_dropped_total";
    pub const SHORT_WINDOW: &str = "allot_rlqs_short_window_denials_total";

    pub fn stream_opened() {
        counter!(STREAMS).increment(1);
    }

    pub fn report() {
        counter!(REPORTS).increment(1);
    }

    pub fn responses() {
        counter!(RESPONSES).increment(1);
    }

    /// An assignment sent: `token_bucket`, `allow_all`, `deny_all` or `abandon`.
    pub fn assignment(action: &'static str) {
        counter!(ASSIGNMENTS, "action" => action).increment(1);
    }

    /// Input refused: `bad_bucket` (that bucket only), `too_many_reports`,
    /// `too_many_buckets_stream`, `too_many_buckets_agent` (the stream ends).
    pub fn refused(reason: &'static str) {
        counter!(REFUSED, "reason" => reason).increment(1);
    }

    /// A bucket abandoned: `reload` (its rule gone), `idle` (reports with no request) or
    /// `unreported` (Envoy no longer reports it).
    pub fn dropped(reason: &'static str) {
        counter!(BUCKETS_DROPPED, "reason" => reason).increment(1);
    }

    /// A deny-all sent because the rule's windows are shorter than a lease span.
    pub fn short_window() {
        counter!(SHORT_WINDOW).increment(1);
    }

    pub fn buckets(n: usize) {
        gauge!(BUCKETS).set(n as f64);
    }

    /// Usage Envoy reported above the units of the lease it was charged to.
    pub fn overage(units: u64) {
        counter!(OVERAGE_UNITS).increment(units);
    }

    /// Usage Envoy reported beyond every lease (its fallback behaviours) within the rule's
    /// `rlqs_fallback_units` (D69).
    pub fn fallback(units: u64) {
        if units > 0 {
            counter!(FALLBACK_UNITS).increment(units);
        }
    }

    /// Usage Envoy reported beyond every lease and past the rule's `rlqs_fallback_units`:
    /// charged nowhere, its window stated unbounded.
    pub fn uncharged(units: u64) {
        if units > 0 {
            counter!(UNCHARGED_UNITS).increment(units);
        }
    }
}
