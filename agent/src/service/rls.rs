//! Envoy's rate limit service v3, `ShouldRateLimit`, with envoyproxy/ratelimit's semantics.

use std::sync::Arc;

use allot_core::budget::Reason;
use allot_proto::envoy::core::HeaderValue;
use allot_proto::envoy::rls::rate_limit_response::Code;
use allot_proto::envoy::rls::rate_limit_service_server::RateLimitService;
use allot_proto::envoy::rls::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use super::headers::rate_limit_headers;
use super::status;
use crate::convert;
use crate::request::Checked;
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
        let caller = super::caller_of(&request);
        let (domain, descriptors) =
            convert::rls_request(request.into_inner()).map_err(|e| status(SERVICE, e))?;
        super::authorize(caller.as_ref(), &domain)?;
        let checked = self
            .agent
            .should_rate_limit(&domain, &descriptors)
            .await
            .map_err(|e| status(SERVICE, e))?;
        let statuses: Vec<_> = checked.iter().map(convert::descriptor_status).collect();
        let over = over_limit(&checked);
        let headers = rate_limit_headers(&checked, over, |wait| self.agent.retry_after_secs(wait));
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

/// The overall code, as envoyproxy/ratelimit decides it: over the limit when a descriptor
/// whose rule is not in quota mode is over, or when the request has quota-mode descriptors and
/// every one of them is over. Unlimited and disabled rules take no part (upstream leaves
/// unlimited ones out of the quota count; a disabled rule is as if absent).
fn over_limit(checked: &[Checked]) -> bool {
    let (mut quota, mut quota_over) = (0usize, 0usize);
    for c in checked {
        let (rule, allowed) = match c {
            Checked::NoRule => continue,
            Checked::Decided { decision, .. }
                if matches!(decision.reason, Reason::Unlimited | Reason::Disabled) =>
            {
                continue;
            }
            Checked::Decided { rule, decision } => (rule, decision.allowed),
            Checked::Degraded { rule, allowed } => (rule, *allowed),
        };
        if !rule.quota_mode {
            if !allowed {
                return true;
            }
            continue;
        }
        quota += 1;
        quota_over += usize::from(!allowed);
    }
    quota > 0 && quota == quota_over
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use allot_core::budget::Decision;
    use allot_core::limit::LimitSpec;

    use super::*;
    use crate::limits::{self, RuleInfo};

    fn rule(id: &str, quota_mode: bool) -> Arc<RuleInfo> {
        let spec = LimitSpec::simple(id, 10, Duration::from_secs(60));
        Arc::new(RuleInfo {
            quota_mode,
            ..limits::rule_info(&spec, 0.8)
        })
    }

    fn decided(rule: &Arc<RuleInfo>, allowed: bool, reason: Reason) -> Checked {
        Checked::Decided {
            rule: rule.clone(),
            decision: Decision {
                allowed,
                remaining_units: 0,
                retry_after: None,
                reset_after: Duration::from_secs(1),
                limit_units: 10,
                shadow_denied: false,
                reason,
            },
        }
    }

    /// upstream's rule (service/ratelimit.go): quota-mode descriptors refuse together or not
    /// at all; any other over-limit descriptor refuses alone.
    #[test]
    fn quota_mode_refuses_only_when_every_quota_descriptor_is_over() {
        let (q1, q2) = (rule("rl/service=1", true), rule("rl/service=2", true));
        let plain = rule("rl/foo", false);
        let unlimited = rule("rl/qux", true);
        let over = |r: &Arc<RuleInfo>| decided(r, false, Reason::Allowance);
        let ok = |r: &Arc<RuleInfo>| decided(r, true, Reason::Allowance);
        let table: &[(&[Checked], bool)] = &[
            (&[], false),
            (&[Checked::NoRule], false),
            (&[over(&plain)], true),
            (&[ok(&plain)], false),
            // One quota descriptor over, another within: admitted.
            (&[over(&q1), ok(&q2)], false),
            // All quota descriptors over: refused.
            (&[over(&q1), over(&q2)], true),
            (&[over(&q1)], true),
            // A plain refusal refuses whatever the quota descriptors say.
            (&[ok(&q1), over(&plain)], true),
            (&[over(&q1), ok(&plain)], true),
            // Unlimited takes no part: the one counted quota descriptor is over.
            (
                &[over(&q1), decided(&unlimited, true, Reason::Unlimited)],
                true,
            ),
            // A degraded closed quota descriptor counts as over.
            (
                &[
                    Checked::Degraded {
                        rule: q1.clone(),
                        allowed: false,
                    },
                    ok(&q2),
                ],
                false,
            ),
            (
                &[Checked::Degraded {
                    rule: q1.clone(),
                    allowed: false,
                }],
                true,
            ),
        ];
        for (i, (checked, refused)) in table.iter().enumerate() {
            assert_eq!(over_limit(checked), *refused, "case {i}");
        }
    }
}
