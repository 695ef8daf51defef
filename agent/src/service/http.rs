//! The lease API over HTTP/JSON, on the agent's HTTP port, for gateways in languages without
//! a gRPC stack (Python LLM gateways first). Each route decodes its JSON body into the lease
//! API's protobuf request and calls the very `LeaseService` method gRPC calls, so validation,
//! idempotency, refills, returns and errors are the gRPC API's; only the envelope differs.
//!
//! Bodies use the protobuf field names (`target`, `cost_units`, `idempotency_key`, ...);
//! absent fields read as protobuf's defaults, unknown fields are refused. A refusal of the
//! quota is an answer (200 with `"allowed": false`), as on gRPC; an error is a 4xx or 5xx with
//! `{"error": MESSAGE, "code": GRPC_CODE}` (docs/agent.md, "HTTP/JSON").

use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_server::LeaseService;
use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::{Code, Request, Status};

use std::sync::Arc;

use super::drain::DrainOnDrop;
use super::lease::LeaseApi;
use super::shed::Shed;
use crate::callers::{Caller, LiveCallers, Refusal};
use crate::metrics;
use crate::settings::MAX_MESSAGE_BYTES;

/// The label malformed JSON bodies are counted under: the calls are the lease API's.
const SERVICE: &str = "lease";

/// The gateway calls, each a `POST` of one JSON object, bounded as a gRPC message is.
pub fn router(api: LeaseApi, callers: Arc<LiveCallers>, shed: Shed) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire).fallback(not_post))
        .route("/v1/lease", post(lease).fallback(not_post))
        .route("/v1/lease/batch", post(lease_batch).fallback(not_post))
        .route("/v1/renew", post(renew).fallback(not_post))
        .route("/v1/release", post(release).fallback(not_post))
        .route("/v1/settle", post(settle).fallback(not_post))
        .route("/v1/slots/acquire", post(acquire_slot).fallback(not_post))
        .route("/v1/slots/release", post(release_slot).fallback(not_post))
        .route_layer(middleware::from_fn_with_state(callers, authenticate))
        .route_layer(middleware::from_fn_with_state(shed, shed_past_the_cap))
        .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
        .layer(middleware::map_request(drain_unread))
        .with_state(api)
}

/// Every call's body read to its end even when it is answered without it (`drain.rs`).
async fn drain_unread(request: axum::extract::Request) -> axum::extract::Request {
    request.map(|body| axum::body::Body::new(DrainOnDrop::new(body)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetJson {
    domain: String,
    #[serde(default)]
    entries: Vec<EntryJson>,
}

impl From<TargetJson> for pb::Target {
    fn from(t: TargetJson) -> Self {
        pb::Target {
            domain: t.domain,
            entries: t
                .entries
                .into_iter()
                .map(|e| pb::Entry {
                    key: e.key,
                    value: e.value,
                })
                .collect(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireJson {
    target: Option<TargetJson>,
    #[serde(default)]
    cost_units: u64,
    #[serde(default)]
    idempotency_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReturnJson {
    lease_id: u64,
    #[serde(default)]
    unused_units: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseJson {
    target: Option<TargetJson>,
    #[serde(default)]
    units_wanted: u64,
    #[serde(default)]
    min_units: u64,
    #[serde(default)]
    ttl_ms: u64,
    #[serde(default)]
    idempotency_key: String,
    #[serde(default)]
    returns: Vec<ReturnJson>,
    #[serde(default)]
    top_up_lease_id: u64,
}

impl From<LeaseJson> for pb::LeaseRequest {
    fn from(b: LeaseJson) -> Self {
        pb::LeaseRequest {
            target: b.target.map(Into::into),
            units_wanted: b.units_wanted,
            min_units: b.min_units,
            ttl_ms: b.ttl_ms,
            idempotency_key: b.idempotency_key,
            returns: b
                .returns
                .into_iter()
                .map(|r| pb::LeaseReturn {
                    lease_id: r.lease_id,
                    unused_units: r.unused_units,
                })
                .collect(),
            top_up_lease_id: b.top_up_lease_id,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBatchJson {
    leases: Vec<LeaseJson>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewJson {
    lease_id: u64,
    #[serde(default)]
    ttl_ms: u64,
    #[serde(default)]
    idempotency_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseJson {
    lease_id: u64,
    #[serde(default)]
    unused_units: u64,
    #[serde(default)]
    idempotency_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleJson {
    lease_id: u64,
    actual_units: u64,
    #[serde(default)]
    idempotency_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireSlotJson {
    target: Option<TargetJson>,
    #[serde(default)]
    idempotency_key: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseSlotJson {
    slot_id: u64,
}

/// A body that is not the call's JSON object: 400 for bad JSON, 422 for a field that is
/// unknown, missing or of the wrong type, 413 past the size bound, 415 without
/// `Content-Type: application/json` (axum's statuses), each with a JSON body saying why.
fn rejected(r: JsonRejection) -> Response {
    metrics::invalid_request(SERVICE);
    let body = json!({ "error": r.body_text(), "code": "invalid_argument" });
    (r.status(), Json(body)).into_response()
}

/// 503 with `Retry-After: 1` when `--max-in-flight-calls` are running (`service::shed`).
async fn shed_past_the_cap(
    State(shed): State<Shed>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let key = shed.caller_key(request.headers(), request.extensions());
    let entered = match shed.try_enter("http", key) {
        Ok(entered) => entered,
        Err(why) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1")],
                Json(error_json(Code::ResourceExhausted, &shed.message(why))),
            )
                .into_response();
        }
    };
    let answer = next.run(request).await;
    drop(entered);
    answer
}

/// Names the caller from `Authorization: Bearer TOKEN` when the agent has a callers file
/// (D59): 401 for none it knows. The HTTP port has no TLS of its own, so no certificate.
async fn authenticate(
    State(callers): State<Arc<LiveCallers>>,
    mut request: axum::extract::Request,
    next: Next,
) -> Response {
    let Some(callers) = callers.get() else {
        return next.run(request).await;
    };
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(caller) = callers.identify(None, authorization) else {
        let s = super::refused(Refusal::Unauthenticated);
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Json(error_json(s.code(), s.message())),
        )
            .into_response();
    };
    if let Err(per_sec) = caller.take_call() {
        let s = super::refused(Refusal::OverRate {
            caller: caller.name.clone(),
            per_sec,
        });
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            Json(error_json(s.code(), s.message())),
        )
            .into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// The caller `authenticate` named, if any, carried into the lease API's request as the
/// gRPC interceptor carries it.
struct Who(Option<Arc<Caller>>);

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Who, Self::Rejection> {
        Ok(Who(parts.extensions.get::<Arc<Caller>>().cloned()))
    }
}

impl Who {
    fn request<T>(self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(caller) = self.0 {
            request.extensions_mut().insert(caller);
        }
        request
    }
}

async fn not_post() -> Response {
    let body =
        json!({ "error": "this call is a POST of a JSON object", "code": "invalid_argument" });
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        Json(body),
    )
        .into_response()
}

/// The HTTP status of a gRPC error, as gRPC-to-HTTP gateways map them, except a reused
/// idempotency key: 409, since the request conflicts with an earlier one.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// `invalid_argument`, `not_found`, ...: gRPC's code names, in snake case.
fn code_name(code: Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn answer<T>(
    result: Result<tonic::Response<T>, Status>,
    to_json: impl FnOnce(T) -> Value,
) -> Response {
    match result {
        Ok(r) => Json(to_json(r.into_inner())).into_response(),
        Err(s) => (
            http_status(s.code()),
            Json(error_json(s.code(), s.message())),
        )
            .into_response(),
    }
}

fn error_json(code: Code, message: &str) -> Value {
    json!({ "error": message, "code": code_name(code) })
}

fn decision_json(d: Option<pb::Decision>) -> Value {
    let d = d.unwrap_or_default();
    json!({
        "allowed": d.allowed,
        "remaining_units": d.remaining_units,
        "limit_units": d.limit_units,
        "retry_after_ms": d.retry_after_ms,
        "reset_after_ms": d.reset_after_ms,
        "rule": d.rule,
        "shadow_denied": d.shadow_denied,
        "reason": d.reason,
    })
}

async fn acquire(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<AcquireJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::AcquireRequest {
            target: b.target.map(Into::into),
            cost_units: b.cost_units,
            idempotency_key: b.idempotency_key,
        },
        Err(r) => return rejected(r),
    };
    answer(
        api.acquire(who.request(req)).await,
        |r| json!({ "decision": decision_json(r.decision) }),
    )
}

async fn lease(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<LeaseJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => b.into(),
        Err(r) => return rejected(r),
    };
    answer(api.lease(who.request(req)).await, lease_json)
}

/// `LeaseBatch`: `{"leases": [LEASE, ...]}` answered by `{"results": [...]}`, one per item in
/// order, each a Lease answer or that item's `{"error", "code"}` (the body an error of
/// `/v1/lease` would have had); the call's own errors (too many items) are the route's.
async fn lease_batch(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<LeaseBatchJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::LeaseBatchRequest {
            leases: b.leases.into_iter().map(Into::into).collect(),
        },
        Err(r) => return rejected(r),
    };
    answer(api.lease_batch(who.request(req)).await, |r| {
        let results: Vec<Value> = r.results.into_iter().map(batch_result_json).collect();
        json!({ "results": results })
    })
}

fn batch_result_json(r: pb::LeaseBatchResult) -> Value {
    use pb::lease_batch_result::Result as Item;
    match r.result {
        Some(Item::Lease(lease)) => lease_json(lease),
        Some(Item::Error(e)) => error_json(Code::from_i32(e.code), &e.message),
        // The agent always fills an item; an empty one would be its bug, said as one.
        None => error_json(
            Code::Internal,
            "the agent answered a batch item with nothing",
        ),
    }
}

fn lease_json(r: pb::LeaseResponse) -> Value {
    let lease = r.lease.map(|l| {
        json!({
            "lease_id": l.lease_id,
            "units": l.units,
            "expires_at_unix_ms": l.expires_at_unix_ms,
            "ttl_ms": l.ttl_ms,
        })
    });
    json!({ "lease": lease, "decision": decision_json(r.decision) })
}

async fn renew(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<RenewJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::RenewRequest {
            lease_id: b.lease_id,
            ttl_ms: b.ttl_ms,
            idempotency_key: b.idempotency_key,
        },
        Err(r) => return rejected(r),
    };
    answer(
        api.renew(who.request(req)).await,
        |r| json!({ "expires_at_unix_ms": r.expires_at_unix_ms, "ttl_ms": r.ttl_ms }),
    )
}

async fn release(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<ReleaseJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::ReleaseRequest {
            lease_id: b.lease_id,
            unused_units: b.unused_units,
            idempotency_key: b.idempotency_key,
        },
        Err(r) => return rejected(r),
    };
    answer(
        api.release(who.request(req)).await,
        |r| json!({ "refunded_units": r.refunded_units }),
    )
}

async fn settle(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<SettleJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::SettleRequest {
            lease_id: b.lease_id,
            actual_units: b.actual_units,
            idempotency_key: b.idempotency_key,
        },
        Err(r) => return rejected(r),
    };
    answer(api.settle(who.request(req)).await, |r| {
        json!({
            "refunded_units": r.refunded_units,
            "overage_units": r.overage_units,
            "clamped_units": r.clamped_units,
        })
    })
}

async fn acquire_slot(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<AcquireSlotJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::AcquireSlotRequest {
            target: b.target.map(Into::into),
            idempotency_key: b.idempotency_key,
        },
        Err(r) => return rejected(r),
    };
    answer(api.acquire_slot(who.request(req)).await, |r| {
        json!({
            "acquired": r.acquired,
            "slot_id": r.slot_id,
            "expires_at_unix_ms": r.expires_at_unix_ms,
            "retry_after_ms": r.retry_after_ms,
            "in_use": r.in_use,
            "max_slots": r.max_slots,
            "rule": r.rule,
        })
    })
}

async fn release_slot(
    State(api): State<LeaseApi>,
    who: Who,
    body: Result<Json<ReleaseSlotJson>, JsonRejection>,
) -> Response {
    let req = match body {
        Ok(Json(b)) => pb::ReleaseSlotRequest { slot_id: b.slot_id },
        Err(r) => return rejected(r),
    };
    answer(
        api.release_slot(who.request(req)).await,
        |r| json!({ "released": r.released }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_read_as_http_statuses_and_names() {
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::FailedPrecondition), StatusCode::CONFLICT);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
        assert_eq!(code_name(Code::InvalidArgument), "invalid_argument");
        assert_eq!(code_name(Code::FailedPrecondition), "failed_precondition");
        assert_eq!(code_name(Code::NotFound), "not_found");
    }
}
