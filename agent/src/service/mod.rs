//! The gRPC services: the lease API (`allot.lease.v1.LeaseService`) and Envoy's rate limit
//! service v3 (`ShouldRateLimit`), and the lease API again as HTTP/JSON (`http.rs`). Thin:
//! convert the request (`crate::convert`), ask the agent, convert the answer. In front of
//! them: [`Authenticate`] names each call's caller (D59), and `shed.rs` refuses calls past the
//! in-flight cap (D61). The only place `tonic::Status` is built (RLQS builds its stream's own).

pub mod drain;
pub mod headers;
pub mod http;
pub mod lease;
pub mod rls;
pub mod shed;

use std::sync::Arc;

use allot_core::ids::LimitId;
use allot_proto::tls;
use tonic::{Request, Status};

use crate::callers::{self, Caller, LiveCallers, Refusal};
use crate::error::Error;
use crate::metrics;

/// Names the caller of every gateway-facing gRPC call (D59): from the connection's client
/// certificate or the call's `authorization` bearer token, put in the request's extensions
/// for the handlers' domain checks. With no callers file, everyone passes unnamed.
#[derive(Clone)]
pub struct Authenticate {
    pub callers: Arc<LiveCallers>,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(callers) = self.callers.get() else {
            return Ok(request);
        };
        let peer = tls::peer_of(&request).ok().flatten();
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let caller = callers
            .identify(peer.as_ref(), authorization)
            .ok_or_else(|| refused(Refusal::Unauthenticated))?;
        if let Err(per_sec) = caller.take_call() {
            return Err(refused(Refusal::OverRate {
                caller: caller.name.clone(),
                per_sec,
            }));
        }
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// The caller the interceptor named, if any.
pub fn caller_of<T>(request: &Request<T>) -> Option<Arc<Caller>> {
    request.extensions().get::<Arc<Caller>>().cloned()
}

/// `PERMISSION_DENIED` when `caller` may not spend `domain`'s quotas.
pub fn authorize(caller: Option<&Arc<Caller>>, domain: &str) -> Result<(), Status> {
    callers::check(caller, domain).map_err(refused)
}

/// `PERMISSION_DENIED` when `caller` may not act on a lease or slot of `limit`; nothing to
/// check when it is unknown (the call answers for that).
pub fn authorize_limit(
    caller: Option<&Arc<Caller>>,
    limit: Option<&LimitId>,
) -> Result<(), Status> {
    match limit {
        Some(l) => callers::check_limit(caller, l.as_str()).map_err(refused),
        None => Ok(()),
    }
}

/// The status of a refusal, counted.
pub fn refused(r: Refusal) -> Status {
    match r {
        Refusal::Unauthenticated => {
            metrics::refused_caller("unauthenticated");
            Status::unauthenticated(
                "no known caller: present a gateway certificate or an `authorization: Bearer` \
                 token the agent's callers file names",
            )
        }
        Refusal::OverRate { caller, per_sec } => {
            metrics::refused_caller("over_rate");
            Status::resource_exhausted(format!(
                "caller {caller} is past its {per_sec} calls a second (max_calls_per_sec in \
                 the callers file)"
            ))
        }
        Refusal::OutOfScope { caller, what } => {
            metrics::refused_caller("out_of_scope");
            Status::permission_denied(format!(
                "caller {caller} may not use {what}: the callers file does not list it"
            ))
        }
    }
}

/// The gRPC status for an error, counting malformed requests per service.
pub(crate) fn status(service: &'static str, e: Error) -> Status {
    match e {
        Error::InvalidRequest(msg) | Error::Core(allot_core::Error::InvalidRequest(msg)) => {
            metrics::invalid_request(service);
            Status::invalid_argument(msg)
        }
        Error::Core(e @ allot_core::Error::UnknownLease(_)) => Status::not_found(e.to_string()),
        Error::Core(e @ allot_core::Error::UnknownLimit(_)) => Status::not_found(e.to_string()),
        // Repeating the call cannot help: the key belongs to another request.
        Error::Core(e @ allot_core::Error::IdempotencyConflict { .. }) => {
            Status::failed_precondition(e.to_string())
        }
        Error::Core(e @ allot_core::Error::TooManyKeys { .. }) => {
            Status::resource_exhausted(e.to_string())
        }
        e @ Error::NotPersisted(_) => Status::unavailable(e.to_string()),
        other => {
            tracing::error!(error = %other, service, "internal error");
            Status::internal(other.to_string())
        }
    }
}
