//! `allot.lease.v1.LeaseService`: every RPC of the lease API.

use std::sync::Arc;
use std::time::Duration;

use allot_core::algo::concurrency::SlotId;
use allot_core::budget::SlotOutcome;
use allot_core::ids::LeaseId;
use allot_core::time::{Timestamp, Window};
use allot_proto::lease::v1::lease_service_server::LeaseService;
use allot_proto::lease::v1::{self as pb, MAX_LEASES_PER_BATCH};
use futures_util::future::join_all;
use tonic::{Request, Response, Status};

use super::{authorize, authorize_limit, caller_of, status};
use crate::callers::Caller;
use crate::convert::{self, Scope, ceil_ms};
use crate::request::{LeaseAsk, Leased, Slotted};
use crate::state::Agent;

const SERVICE: &str = "lease";

#[derive(Clone)]
pub struct LeaseApi {
    agent: Arc<Agent>,
}

impl LeaseApi {
    pub fn new(agent: Arc<Agent>) -> Self {
        LeaseApi { agent }
    }
}

fn err(e: crate::Error) -> Status {
    status(SERVICE, e)
}

/// Time left until `at`, rounded down: a gateway counts it from its own send time, so rounding
/// up would let it spend up to a millisecond past the agent's expiry.
fn until(now: Timestamp, at: Timestamp) -> u64 {
    u64::try_from(at.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
}

#[tonic::async_trait]
impl LeaseService for LeaseApi {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        let target = convert::target(req.target).map_err(err)?;
        authorize(caller.as_ref(), &target.domain)?;
        let id = convert::request_id(&req.idempotency_key, Scope::Target(&target)).map_err(err)?;
        let checked = self
            .agent
            .acquire(&target, convert::cost(req.cost_units), id)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::AcquireResponse {
            decision: Some(convert::checked_decision(&checked)),
        }))
    }

    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let caller = caller_of(&request);
        self.lease_one(caller.as_ref(), request.into_inner())
            .await
            .map(Response::new)
    }

    async fn lease_batch(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        let caller = caller_of(&request);
        let leases = request.into_inner().leases;
        if leases.len() > MAX_LEASES_PER_BATCH {
            return Err(err(crate::Error::InvalidRequest(format!(
                "a LeaseBatch takes at most {MAX_LEASES_PER_BATCH} leases, not {}",
                leases.len()
            ))));
        }
        // The items run together: each applies to the machine when first polled (in the
        // request's order), and their waits for durability share the same commits.
        let answers = join_all(
            leases
                .into_iter()
                .map(|req| self.lease_one(caller.as_ref(), req)),
        )
        .await;
        let results = answers
            .into_iter()
            .map(|answer| pb::LeaseBatchResult {
                result: Some(match answer {
                    Ok(lease) => pb::lease_batch_result::Result::Lease(lease),
                    Err(status) => pb::lease_batch_result::Result::Error(pb::LeaseError {
                        code: status.code() as i32,
                        message: status.message().to_owned(),
                    }),
                }),
            })
            .collect();
        Ok(Response::new(pb::LeaseBatchResponse { results }))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        self.authorize_lease(caller.as_ref(), req.lease_id)?;
        let id =
            convert::request_id(&req.idempotency_key, Scope::Lease(req.lease_id)).map_err(err)?;
        let out = self
            .agent
            .renew(LeaseId(req.lease_id), convert::lease_ttl(req.ttl_ms), id)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::RenewResponse {
            expires_at_unix_ms: out.expires_at.as_unix_millis(),
            ttl_ms: until(self.agent.now(), out.expires_at),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        self.authorize_lease(caller.as_ref(), req.lease_id)?;
        let id =
            convert::request_id(&req.idempotency_key, Scope::Lease(req.lease_id)).map_err(err)?;
        let out = self
            .agent
            .release(LeaseId(req.lease_id), req.unused_units, id)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::ReleaseResponse {
            refunded_units: out.refunded_units,
        }))
    }

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        self.authorize_lease(caller.as_ref(), req.lease_id)?;
        let id =
            convert::request_id(&req.idempotency_key, Scope::Lease(req.lease_id)).map_err(err)?;
        let out = self
            .agent
            .settle(LeaseId(req.lease_id), req.actual_units, id)
            .await
            .map_err(err)?;
        Ok(Response::new(pb::SettleResponse {
            refunded_units: out.refunded_units,
            overage_units: out.overage_units,
            clamped_units: out.clamped_units,
        }))
    }

    async fn acquire_slot(
        &self,
        request: Request<pb::AcquireSlotRequest>,
    ) -> Result<Response<pb::AcquireSlotResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        let target = convert::target(req.target).map_err(err)?;
        authorize(caller.as_ref(), &target.domain)?;
        let id = convert::request_id(&req.idempotency_key, Scope::Target(&target)).map_err(err)?;
        let slotted = self.agent.acquire_slot(&target, id).await.map_err(err)?;
        Ok(Response::new(slot_response(slotted)))
    }

    async fn release_slot(
        &self,
        request: Request<pb::ReleaseSlotRequest>,
    ) -> Result<Response<pb::ReleaseSlotResponse>, Status> {
        let caller = caller_of(&request);
        let slot = SlotId(request.into_inner().slot_id);
        if caller.is_some() {
            authorize_limit(caller.as_ref(), self.agent.slot_limit(slot).as_ref())?;
        }
        let released = self.agent.release_slot(slot).await.map_err(err)?;
        Ok(Response::new(pb::ReleaseSlotResponse { released }))
    }
}

impl LeaseApi {
    /// A lease's holder may renew, release, settle or return it only within its domains
    /// (D59). An unknown lease is left to the call, which answers for it.
    fn authorize_lease(&self, caller: Option<&Arc<Caller>>, lease: u64) -> Result<(), Status> {
        if caller.is_none() {
            return Ok(());
        }
        authorize_limit(caller, self.agent.lease_limit(LeaseId(lease)).as_ref())
    }

    async fn lease_one(
        &self,
        caller: Option<&Arc<Caller>>,
        req: pb::LeaseRequest,
    ) -> Result<pb::LeaseResponse, Status> {
        let target = convert::target(req.target).map_err(err)?;
        authorize(caller, &target.domain)?;
        let id = convert::request_id(&req.idempotency_key, Scope::Target(&target)).map_err(err)?;
        let ttl = convert::lease_ttl(req.ttl_ms);
        let returns = convert::lease_returns(&req.returns).map_err(err)?;
        // Checked once the returns are known to be within their bound.
        for r in &req.returns {
            self.authorize_lease(caller, r.lease_id)?;
        }
        if req.top_up_lease_id != 0 {
            self.authorize_lease(caller, req.top_up_lease_id)?;
        }
        let leased = self
            .agent
            .lease(
                &target,
                LeaseAsk {
                    units_wanted: req.units_wanted,
                    min_units: convert::cost(req.min_units),
                    ttl,
                    returns,
                    top_up: (req.top_up_lease_id != 0).then_some(LeaseId(req.top_up_lease_id)),
                },
                id,
            )
            .await
            .map_err(err)?;
        Ok(lease_response(self.agent.now(), leased, ttl))
    }
}

fn lease_response(now: Timestamp, leased: Leased, ttl: Duration) -> pb::LeaseResponse {
    match leased {
        Leased::NoRule => unmetered_lease(now, convert::no_rule_decision(), 0, ttl),
        Leased::Unmetered {
            rule,
            units,
            reason,
        } => {
            let decision = pb::Decision {
                allowed: true,
                rule: rule.id.to_string(),
                reason: convert::reason_name(reason).to_owned(),
                ..pb::Decision::default()
            };
            unmetered_lease(now, decision, units, ttl)
        }
        Leased::Granted { rule, grant } => {
            let reset = rule.window.map_or(Duration::ZERO, |w| {
                Window::new(w)
                    .end(grant.window)
                    .saturating_duration_since(now)
            });
            pb::LeaseResponse {
                lease: Some(pb::Lease {
                    lease_id: grant.lease.0,
                    units: grant.units,
                    expires_at_unix_ms: grant.expires_at.as_unix_millis(),
                    ttl_ms: until(now, grant.expires_at),
                }),
                decision: Some(pb::Decision {
                    allowed: true,
                    remaining_units: grant.remaining_units,
                    limit_units: rule.quota_units,
                    retry_after_ms: None,
                    reset_after_ms: ceil_ms(reset),
                    rule: rule.id.to_string(),
                    shadow_denied: grant.shadow_denied,
                    reason: convert::reason_name(grant.reason).to_owned(),
                }),
            }
        }
        Leased::Denied { rule, decision } => pb::LeaseResponse {
            lease: None,
            decision: Some(convert::decision(&decision, &rule)),
        },
        Leased::Degraded { rule, allowed } => {
            let decision = convert::degraded_decision(&rule, allowed);
            if allowed {
                unmetered_lease(now, decision, 1, ttl)
            } else {
                pb::LeaseResponse {
                    lease: None,
                    decision: Some(decision),
                }
            }
        }
    }
}

/// Units to spend freely: lease id 0 (nothing to release or renew).
fn unmetered_lease(
    now: Timestamp,
    decision: pb::Decision,
    units: u64,
    ttl: Duration,
) -> pb::LeaseResponse {
    let expires = now + ttl;
    pb::LeaseResponse {
        lease: Some(pb::Lease {
            lease_id: 0,
            units,
            expires_at_unix_ms: expires.as_unix_millis(),
            ttl_ms: ceil_ms(ttl),
        }),
        decision: Some(decision),
    }
}

fn slot_response(slotted: Slotted) -> pb::AcquireSlotResponse {
    let rule = match &slotted {
        Slotted::NoRule => String::new(),
        Slotted::Decided { rule, .. } | Slotted::Degraded { rule, .. } => rule.id.to_string(),
    };
    let base = pb::AcquireSlotResponse {
        rule,
        ..pb::AcquireSlotResponse::default()
    };
    match slotted {
        Slotted::NoRule
        | Slotted::Decided {
            outcome: SlotOutcome::Unmetered,
            ..
        } => pb::AcquireSlotResponse {
            acquired: true,
            ..base
        },
        Slotted::Degraded { allowed, .. } => pb::AcquireSlotResponse {
            acquired: allowed,
            ..base
        },
        Slotted::Decided {
            outcome: SlotOutcome::Acquired {
                slot, expires_at, ..
            },
            ..
        } => pb::AcquireSlotResponse {
            acquired: true,
            slot_id: slot.0,
            expires_at_unix_ms: expires_at.as_unix_millis(),
            ..base
        },
        Slotted::Decided {
            outcome:
                SlotOutcome::Denied {
                    retry_after,
                    in_use,
                    max_slots,
                },
            ..
        } => pb::AcquireSlotResponse {
            acquired: false,
            retry_after_ms: retry_after.map(ceil_ms),
            in_use,
            max_slots,
            ..base
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use allot_core::ids::RegionId;

    use super::*;
    use crate::settings::Settings;
    use crate::store::MemoryStore;

    fn api() -> LeaseApi {
        let s = Settings::new(RegionId::from("r"), PathBuf::from("unused"));
        LeaseApi::new(Arc::new(
            Agent::open(s, Arc::new(MemoryStore::new())).expect("agent"),
        ))
    }

    fn lease_request(key: &str, idempotency_key: &str, units: u64) -> pb::LeaseRequest {
        pb::LeaseRequest {
            target: Some(pb::Target {
                domain: "default".into(),
                entries: vec![pb::Entry {
                    key: "generic_key".into(),
                    value: key.into(),
                }],
            }),
            units_wanted: units,
            min_units: 1,
            ttl_ms: 1_000,
            idempotency_key: idempotency_key.into(),
            ..pb::LeaseRequest::default()
        }
    }

    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn lease_of(api: &LeaseApi, key: &str, idempotency_key: &str) -> u64 {
        let req = lease_request(key, idempotency_key, 5);
        let answer = block_on(api.lease(Request::new(req)))
            .expect("lease")
            .into_inner();
        answer.lease.expect("granted").lease_id
    }

    /// Two callers (or tenants) that happen to send the same idempotency key for different
    /// targets: before keys were scoped, the second got the first's lease (its id, for
    /// another key), and its own target was never charged.
    #[test]
    fn the_same_idempotency_key_for_another_target_is_another_request() {
        let api = api();
        let a = lease_of(&api, "tenant-a", "retry-1");
        assert_eq!(
            lease_of(&api, "tenant-a", "retry-1"),
            a,
            "a retry is a replay"
        );
        let b = lease_of(&api, "tenant-b", "retry-1");
        assert_ne!(a, b, "another target's call is not a replay of the first");
    }

    /// A key sent again for the same target with other parameters (another lease size, then
    /// another cost) is refused with FAILED_PRECONDITION and a message saying why; nothing is
    /// charged. Before requests were fingerprinted the lease of 9 units was answered with the
    /// first lease (its id, its 5 units); and a refused acquire was answered `allowed` with
    /// reason `no_rule` (the agent read any refusal of an acquire as "no rule").
    #[test]
    fn a_reused_idempotency_key_with_other_parameters_is_refused() {
        let api = api();
        let first = lease_of(&api, "tenant-a", "retry-1");
        let other = block_on(api.lease(Request::new(lease_request("tenant-a", "retry-1", 9))));
        let status = other.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(
            status.message().contains("idempotency key already used"),
            "{}",
            status.message()
        );
        // The same request again is still a retry of the first.
        assert_eq!(lease_of(&api, "tenant-a", "retry-1"), first);

        let acquire = |cost_units: u64| pb::AcquireRequest {
            target: lease_request("tenant-a", "", 0).target,
            cost_units,
            idempotency_key: "order-7".into(),
        };
        let once = block_on(api.acquire(Request::new(acquire(2))))
            .expect("acquire")
            .into_inner();
        let status = block_on(api.acquire(Request::new(acquire(3)))).expect_err("refused");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        let again = block_on(api.acquire(Request::new(acquire(2))))
            .expect("retry")
            .into_inner();
        assert_eq!(again, once);
    }

    fn batch(leases: Vec<pb::LeaseRequest>) -> Result<Vec<pb::lease_batch_result::Result>, Status> {
        let api = api();
        let first = lease_of(&api, "tenant-a", "k1");
        let mut with_first = vec![lease_request("tenant-a", "k1", 5)];
        with_first.extend(leases);
        let answer =
            block_on(api.lease_batch(Request::new(pb::LeaseBatchRequest { leases: with_first })))?;
        let mut results: Vec<_> = answer
            .into_inner()
            .results
            .into_iter()
            .map(|r| r.result.expect("a result"))
            .collect();
        match results.remove(0) {
            pb::lease_batch_result::Result::Lease(l) => {
                assert_eq!(
                    l.lease.expect("replayed").lease_id,
                    first,
                    "a retry in a batch"
                )
            }
            other => panic!("{other:?}"),
        }
        Ok(results)
    }

    /// Each item of a batch is answered as `Lease` would answer it alone: a replay, a refusal
    /// (its idempotency key reused with other parameters) and a grant side by side, one
    /// item's error leaving the others alone.
    #[test]
    fn a_batch_answers_each_item_as_lease_would_alone() {
        use pb::lease_batch_result::Result as Item;
        let results = batch(vec![
            lease_request("tenant-a", "k1", 9),
            lease_request("tenant-b", "", 5),
            pb::LeaseRequest::default(),
        ])
        .expect("answered");
        assert_eq!(results.len(), 3);
        match &results[0] {
            Item::Error(e) => {
                assert_eq!(e.code, tonic::Code::FailedPrecondition as i32, "{e:?}");
                assert!(e.message.contains("idempotency key already used"), "{e:?}");
            }
            other => panic!("{other:?}"),
        }
        match &results[1] {
            Item::Lease(l) => assert_eq!(l.lease.as_ref().expect("granted").units, 5),
            other => panic!("{other:?}"),
        }
        match &results[2] {
            Item::Error(e) => assert_eq!(e.code, tonic::Code::InvalidArgument as i32, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// A batch over the limit is refused whole, before any item runs: none of its
    /// idempotency keys is taken.
    #[test]
    fn a_batch_over_the_limit_is_refused_with_nothing_done() {
        let api = api();
        let leases = (0..=MAX_LEASES_PER_BATCH)
            .map(|i| lease_request("tenant-c", &format!("big-{i}"), 5))
            .collect();
        let status = block_on(api.lease_batch(Request::new(pb::LeaseBatchRequest { leases })))
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("at most 64"), "{status:?}");
        // Had the first item run, this would be a reuse of its key with other parameters.
        let again = block_on(api.lease(Request::new(lease_request("tenant-c", "big-0", 9))));
        assert!(again.is_ok(), "{again:?}");
    }
}
