//! The gRPC services: the lease API (`allot.lease.v1.LeaseService`) and Envoy's rate limit
//! service v3 (`ShouldRateLimit`), and the lease API again as HTTP/JSON (`http.rs`). Thin: convert the request (`crate::convert`), ask the
//! agent, convert the answer. The only place `tonic::Status` is built.

pub mod headers;
pub mod http;
pub mod lease;
pub mod rls;

use tonic::Status;

use crate::error::Error;
use crate::metrics;

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
