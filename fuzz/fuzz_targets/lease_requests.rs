//! The lease API's requests as a gateway sends them: protobuf messages decoded as the gRPC
//! server decodes them and handed to the agent's `LeaseApi` (which converts each into the
//! agent's request through `convert.rs` and runs it), JSON bodies posted to the HTTP routes
//! (`service::http::router`), and Envoy's ShouldRateLimit through the agent's RLS service.
//! One fresh agent per input (in-memory store, manual clock, the embedded default limits:
//! domain `default`, keys `remote_address` and `generic_key`), so that calls can act on the
//! leases and slots earlier calls of the same input got.
//!
//! Input: up to `MAX_CALLS` calls, each `selector: u8 | len: u16 LE | body`. The selector's
//! low 4 bits pick the call (`CALLS`), its high 4 bits move the clock by that many 100 ms
//! before it.

#![no_main]

#[path = "common.rs"]
mod common;

use std::sync::atomic::Ordering;

use allot_agent::service::http::router;
use allot_agent::service::lease::LeaseApi;
use allot_agent::service::rls::Rls;
use allot_proto::envoy::rls::RateLimitRequest;
use allot_proto::envoy::rls::rate_limit_service_server::RateLimitService;
use allot_proto::lease::v1::lease_service_server::LeaseService;
use axum::body::Body;
use common::STEP;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tonic::Request;
use tower::ServiceExt;

/// Most calls one input makes.
const MAX_CALLS: usize = 16;

/// What each selector (low 4 bits) calls: the eight gRPC methods, ShouldRateLimit, then the
/// eight HTTP routes.
const CALLS: usize = 17;

const ROUTES: [&str; 8] = [
    "/v1/acquire",
    "/v1/lease",
    "/v1/lease/batch",
    "/v1/renew",
    "/v1/release",
    "/v1/settle",
    "/v1/slots/acquire",
    "/v1/slots/release",
];

fuzz_target!(|data: &[u8]| {
    let (runtime, agent, cell) = common::agent();
    let api = LeaseApi::new(agent.clone());
    let rls = Rls::new(agent);
    for (selector, body) in common::frames(data, MAX_CALLS) {
        let step = STEP.as_nanos() as u64 * u64::from(selector >> 4);
        cell.fetch_add(step, Ordering::Relaxed);
        let call = usize::from(selector & 0x0f) % CALLS;
        runtime.block_on(one_call(&api, &rls, call, body));
    }
});

async fn one_call(api: &LeaseApi, rls: &Rls, call: usize, body: &[u8]) {
    match call {
        0 => grpc(body, |r| api.acquire(r)).await,
        1 => grpc(body, |r| api.lease(r)).await,
        2 => grpc(body, |r| api.lease_batch(r)).await,
        3 => grpc(body, |r| api.renew(r)).await,
        4 => grpc(body, |r| api.release(r)).await,
        5 => grpc(body, |r| api.settle(r)).await,
        6 => grpc(body, |r| api.acquire_slot(r)).await,
        7 => grpc(body, |r| api.release_slot(r)).await,
        8 => grpc::<RateLimitRequest, _, _>(body, |r| rls.should_rate_limit(r)).await,
        _ => http(api, ROUTES[call - 9], body).await,
    }
}

/// A message decoded as the gRPC server decodes it (an undecodable one never reaches the
/// service), then the method.
async fn grpc<M, T, F>(body: &[u8], method: impl FnOnce(Request<M>) -> F)
where
    M: Message + Default,
    F: Future<Output = Result<T, tonic::Status>>,
{
    if let Ok(message) = M::decode(body) {
        let _ = method(Request::new(message)).await;
    }
}

async fn http(api: &LeaseApi, path: &str, body: &[u8]) {
    let request = http::Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a request");
    let response = router(
        api.clone(),
        std::sync::Arc::default(),
        allot_agent::service::shed::Shed::new(1),
    )
    .oneshot(request)
    .await
    .expect("the router answers every request");
    let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
}
