//! Envoy's rate limit service v3, `ShouldRateLimit`, with envoyproxy/ratelimit's semantics.

use std::sync::Arc;

use allot_proto::envoy::core::HeaderValue;
use allot_proto::envoy::rls::rate_limit_response::Code;
use allot_proto::envoy::rls::rate_limit_service_server::RateLimitService;
use allot_proto::envoy::rls::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use super::headers::rate_limit_headers;
use super::status;
use crate::convert;
use crate::state::Agent;

const SERVICE: &str = "rls";

#[derive(Clone)]
pub struct Rls {
    agent: Arc<Agent>,
}

impl Rls {
    pub fn new(agent: Arc<Agent>) -> Self {
        Rls { agent }
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (domain, descriptors) =
            convert::rls_request(request.into_inner()).map_err(|e| status(SERVICE, e))?;
        let checked = self
            .agent
            .should_rate_limit(&domain, &descriptors)
            .await
            .map_err(|e| status(SERVICE, e))?;
        let statuses: Vec<_> = checked.iter().map(convert::descriptor_status).collect();
        let over = statuses.iter().any(|s| s.code == Code::OverLimit as i32);
        let headers = rate_limit_headers(&checked, |wait| self.agent.retry_after_secs(wait));
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key: key.to_owned(),
                    value,
                    ..HeaderValue::default()
                })
                .collect(),
            ..RateLimitResponse::default()
        }))
    }
}
