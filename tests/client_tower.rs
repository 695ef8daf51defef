//! The client's tower layer (`allot_client::AllotLayer`) in front of an HTTP service, against a
//! real `allot agent` on loopback: requests of a key pass until its quota is used, then get the
//! 429 with the policy's headers; other keys and uncounted requests still pass.

mod support;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use allot_client::{AllotLayer, Client, ClientConfig, Descriptor, Policy};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt, service_fn};

use support::Process;

const QUOTA_10: &str = "\
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 10}
";

fn start_agent(dir: &Path) -> Process {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(["agent", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .arg("--data")
        .arg(dir.join("data"))
        .arg("--config")
        .arg(dir.join("limits.yaml"));
    Process::start(cmd, "agent")
}

fn scratch(test: &str, limits: &str) -> PathBuf {
    support::scratch("client_tower", test, Some(limits))
}

fn by_api_key(parts: &Parts) -> Option<Descriptor<'_>> {
    let api_key = parts.headers.get("x-api-key")?.to_str().ok()?;
    Some(Descriptor::new("api").entry("api_key", api_key))
}

fn request(api_key: Option<&str>) -> Request<String> {
    let mut builder = Request::builder().uri("/");
    if let Some(k) = api_key {
        builder = builder.header("x-api-key", k);
    }
    builder.body(String::new()).expect("request")
}

fn header(response: &Response<String>, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// 15 requests of one key with a quota of 10 a day: exactly 10 reach the service, the other
/// 5 get 429 with `RateLimit-Policy`, `RateLimit`, `X-RateLimit-*` and a Retry-After within
/// the day. Another key, and a request naming no key, still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_answers_429_once_a_keys_quota_is_used() {
    let dir = scratch("quota", QUOTA_10);
    let agent = start_agent(&dir);
    let mut config = ClientConfig::new(format!("http://{}", agent.grpc));
    config.gateway.initial_lease_units = 4;
    config.gateway.max_lease_units = 4;
    let client = Arc::new(Client::start(config).expect("client"));
    let policy = Policy {
        name: "per-api-key".into(),
        quota_units: 10,
        window: Some(Duration::from_secs(86_400)),
    };
    let layer = AllotLayer::new(client.clone(), by_api_key).policy("api", policy);
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new("served".to_owned()))
    }));

    let mut admitted = 0;
    let mut refusals = Vec::new();
    for _ in 0..15 {
        let response = service.clone().oneshot(request(Some("k1"))).await;
        let response = response.expect("infallible");
        match response.status() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => refusals.push(response),
            other => panic!("status {other}"),
        }
    }
    assert_eq!(admitted, 10, "the quota, no more and no less");
    assert_eq!(refusals.len(), 5);
    for r in &refusals {
        assert_eq!(
            header(r, "ratelimit-policy"),
            r#""per-api-key";q=10;w=86400"#
        );
        assert!(header(r, "ratelimit").starts_with(r#""per-api-key";r=0;t="#));
        assert_eq!(header(r, "x-ratelimit-limit"), "10");
        assert_eq!(header(r, "x-ratelimit-remaining"), "0");
        let retry: u64 = header(r, "retry-after").parse().expect("seconds");
        assert!((1..=86_400 + 60).contains(&retry), "Retry-After {retry}");
    }
    let other = service.clone().oneshot(request(Some("k2"))).await;
    assert_eq!(other.expect("infallible").status(), StatusCode::OK);
    let uncounted = service.oneshot(request(None)).await;
    assert_eq!(uncounted.expect("infallible").status(), StatusCode::OK);
    let stats = client.stats();
    assert_eq!(
        (stats.failed_open, stats.failed_closed),
        (0, 0),
        "{stats:?}"
    );

    // What reached the service is what the agent granted and did not get back.
    drop(layer);
    let client = Arc::into_inner(client).expect("the services are gone");
    client.shutdown().await;
    let rule = "{rule=\"api/api_key\"}";
    let granted = agent.metric(&format!("allot_lease_granted_units_total{rule}"));
    let returned = agent.metric(&format!("allot_lease_returned_units_total{rule}"));
    // k2 and its one admitted request count too.
    assert_eq!(
        granted - returned,
        11.0,
        "granted {granted}, returned {returned}"
    );
}
