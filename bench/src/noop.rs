//! The no-op server: the lease API and Envoy's RLS answered "allowed" without any work, and
//! Envoy's rate limit quota service answered with assignments that never refuse
//! ([`crate::noop_rlqs`]). Run with the same tonic settings as a real server
//! ([`server_builder`]), its throughput and CPU per call are the transport's ceiling on this
//! machine, the figure a limiter is held to.
//!
//! With [`NoopOptions::deny_after_calls`] it denies every decision past the first N, with the
//! headers an agent sends (`Retry-After`, `RateLimit`, `RateLimit-Policy`): enough of a limiter
//! to prove a gateway's wiring (the Envoy test) without the agent.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use allot_proto::envoy::core::HeaderValue;
use allot_proto::envoy::rlqs::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use allot_proto::envoy::rls::rate_limit_response::{
    Code as RlsCode, DescriptorStatus, RateLimit as RlsLimit, rate_limit::Unit as RlsUnit,
};
use allot_proto::envoy::rls::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use allot_proto::envoy::rls::{RateLimitRequest, RateLimitResponse};
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_server::{LeaseService, LeaseServiceServer};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::error::Result;
use crate::noop_rlqs::{NoopRlqs, NoopRlqsAssignment};

/// The quota the no-op server claims in its answers (it counts nothing against it).
pub const NOOP_LIMIT_UNITS: u64 = 1_000_000_000;

/// The window the no-op server claims, in seconds (one minute, as `rate_limit.unit: minute`).
pub const NOOP_WINDOW_SECS: u64 = 60;

/// `Retry-After` on the no-op server's denials, in seconds.
pub const NOOP_RETRY_AFTER_SECS: u64 = 7;

/// Lease length when the caller asks for none.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// The rule the no-op server names in its answers: same shape as an agent's, so the answers
/// weigh the same on the wire.
const NOOP_RULE: &str = "bench/key";

/// What the no-op server does besides answering "allowed".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoopOptions {
    /// Deny every decision (`Acquire`, `Lease`, `ShouldRateLimit`) after this many, counted
    /// across all callers and keys. `None`: never deny.
    pub deny_after_calls: Option<u64>,
    /// What the rate limit quota service assigns every bucket (it never counts or denies).
    pub rlqs_assignment: NoopRlqsAssignment,
}

/// The no-op service, cheap to clone (tonic clones it per connection).
#[derive(Clone, Debug, Default)]
pub struct NoopService {
    state: Arc<NoopState>,
}

#[derive(Debug, Default)]
struct NoopState {
    options: NoopOptions,
    decisions: AtomicU64,
    next_lease_id: AtomicU64,
}

impl NoopService {
    pub fn new(options: NoopOptions) -> Self {
        NoopService {
            state: Arc::new(NoopState {
                options,
                ..NoopState::default()
            }),
        }
    }

    /// Whether this decision is allowed. Without a deny threshold, no shared counter is
    /// touched: the ceiling must not pay for a contended atomic a real server may not have.
    fn allow(&self) -> bool {
        match self.state.options.deny_after_calls {
            None => true,
            Some(n) => self.state.decisions.fetch_add(1, Ordering::Relaxed) < n,
        }
    }

    fn decision(&self, allowed: bool) -> pb::Decision {
        pb::Decision {
            allowed,
            remaining_units: if allowed { NOOP_LIMIT_UNITS - 1 } else { 0 },
            limit_units: NOOP_LIMIT_UNITS,
            retry_after_ms: (!allowed).then_some(NOOP_RETRY_AFTER_SECS * 1_000),
            reset_after_ms: NOOP_WINDOW_SECS * 1_000,
            rule: NOOP_RULE.to_owned(),
            shadow_denied: false,
            reason: "allowance".to_owned(),
        }
    }
}

#[tonic::async_trait]
impl LeaseService for NoopService {
    async fn acquire(
        &self,
        _request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let decision = Some(self.decision(self.allow()));
        Ok(Response::new(pb::AcquireResponse { decision }))
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let req = request.into_inner();
        let allowed = self.allow();
        let lease = allowed.then(|| {
            let ttl = match req.ttl_ms {
                0 => DEFAULT_LEASE_TTL,
                ms => Duration::from_millis(ms),
            };
            pb::Lease {
                lease_id: self.state.next_lease_id.fetch_add(1, Ordering::Relaxed) + 1,
                units: req.units_wanted.max(req.min_units).max(1),
                expires_at_unix_ms: unix_ms_after(ttl),
                ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            }
        });
        let decision = Some(self.decision(allowed));
        Ok(Response::new(pb::LeaseResponse { lease, decision }))
    }

    async fn lease_batch(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        let mut results = Vec::new();
        for req in request.into_inner().leases {
            let lease = self.lease(Request::new(req)).await?.into_inner();
            results.push(pb::LeaseBatchResult {
                result: Some(pb::lease_batch_result::Result::Lease(lease)),
            });
        }
        Ok(Response::new(pb::LeaseBatchResponse { results }))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let ttl = Duration::from_millis(request.into_inner().ttl_ms);
        let expires_at_unix_ms = unix_ms_after(ttl.max(DEFAULT_LEASE_TTL));
        Ok(Response::new(pb::RenewResponse {
            expires_at_unix_ms,
            ttl_ms: u64::try_from(ttl.max(DEFAULT_LEASE_TTL).as_millis()).unwrap_or(u64::MAX),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let refunded_units = request.into_inner().unused_units;
        Ok(Response::new(pb::ReleaseResponse { refunded_units }))
    }

    async fn settle(
        &self,
        _request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        Ok(Response::new(pb::SettleResponse::default()))
    }

    async fn acquire_slot(
        &self,
        _request: Request<pb::AcquireSlotRequest>,
    ) -> Result<Response<pb::AcquireSlotResponse>, Status> {
        Ok(Response::new(pb::AcquireSlotResponse {
            acquired: true,
            slot_id: self.state.next_lease_id.fetch_add(1, Ordering::Relaxed) + 1,
            expires_at_unix_ms: unix_ms_after(DEFAULT_LEASE_TTL),
            rule: NOOP_RULE.to_owned(),
            ..pb::AcquireSlotResponse::default()
        }))
    }

    async fn release_slot(
        &self,
        _request: Request<pb::ReleaseSlotRequest>,
    ) -> Result<Response<pb::ReleaseSlotResponse>, Status> {
        Ok(Response::new(pb::ReleaseSlotResponse { released: true }))
    }
}

#[tonic::async_trait]
impl RateLimitService for NoopService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        let allowed = self.allow();
        let code = if allowed {
            RlsCode::Ok
        } else {
            RlsCode::OverLimit
        };
        // One status per descriptor, as envoyproxy/ratelimit answers.
        let statuses = req
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: code.into(),
                current_limit: Some(noop_rls_limit()),
                limit_remaining: if allowed { u32::MAX } else { 0 },
                ..DescriptorStatus::default()
            })
            .collect();
        let response_headers_to_add = if allowed {
            Vec::new()
        } else {
            denial_headers(self.state.options.deny_after_calls.unwrap_or(0))
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code.into(),
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}

fn noop_rls_limit() -> RlsLimit {
    RlsLimit {
        name: NOOP_RULE.to_owned(),
        requests_per_unit: u32::MAX,
        unit: RlsUnit::Minute.into(),
    }
}

/// The headers an agent puts on a denial (draft-ietf-httpapi-ratelimit-headers-11):
/// `RateLimit-Policy: "name";q=quota;w=window_secs`, `RateLimit: "name";r=remaining;t=secs`.
pub fn denial_headers(quota_units: u64) -> Vec<HeaderValue> {
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header("retry-after", NOOP_RETRY_AFTER_SECS.to_string()),
        header(
            "ratelimit-policy",
            format!("\"noop\";q={quota_units};w={NOOP_WINDOW_SECS}"),
        ),
        header(
            "ratelimit",
            format!("\"noop\";r=0;t={NOOP_RETRY_AFTER_SECS}"),
        ),
    ]
}

fn unix_ms_after(ttl: Duration) -> u64 {
    let at = SystemTime::now() + ttl;
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The tonic server settings of a real gRPC server in this project: tonic's defaults (HTTP/2
/// only, no concurrency limit, default window sizes) with `TCP_NODELAY`, so a small answer is
/// not held back by Nagle's algorithm. A server measured against the no-op must use the same.
pub fn server_builder() -> Server {
    Server::builder().tcp_nodelay(true)
}

/// Serves the three services on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    options: NoopOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let service = NoopService::new(options);
    // `serve_with_incoming` ignores the builder's TCP settings: set them on the listener.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    server_builder()
        .add_service(LeaseServiceServer::new(service.clone()))
        .add_service(RateLimitServiceServer::new(service))
        .add_service(RateLimitQuotaServiceServer::new(NoopRlqs::new(
            options.rlqs_assignment,
        )))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
