//! `allot agent`, run as the real binary on free loopback ports with a data directory of its
//! own, driven over gRPC and HTTP: the lease API and RLS semantics end to end, bad input, the
//! store surviving SIGKILL under load, configuration reloads, graceful shutdown, and the
//! `acquire` / `rls` commands' exit codes.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output};
use std::time::{Duration, Instant};

use allot_proto::envoy::common::RateLimitDescriptor;
use allot_proto::envoy::common::rate_limit_descriptor::Entry as RlsEntry;
use allot_proto::envoy::rls::rate_limit_response::{Code, rate_limit::Unit};
use allot_proto::envoy::rls::rate_limit_service_client::RateLimitServiceClient;
use allot_proto::envoy::rls::{RateLimitRequest, RateLimitResponse};
use allot_proto::lease::v1 as pb;
use allot_proto::lease::v1::lease_service_client::LeaseServiceClient;
use serde_json::Value;
use tonic::transport::Channel;

use support::Ready;

/// Longest any test waits for the agent to do something it should do promptly (start, pick
/// up a reload, exit): a bound on a hang, not a timing claim.
const PATIENCE: Duration = Duration::from_secs(20);

/// One running agent; killed when dropped.
struct Agent {
    child: Child,
    grpc: String,
    http: String,
    stderr: Option<ChildStderr>,
}

fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("agent")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("limits.yaml");
    // Write then rename, so a watcher never reads half a file.
    let tmp = dir.join("limits.yaml.tmp");
    std::fs::write(&tmp, text).expect("config");
    std::fs::rename(&tmp, &path).expect("config");
    path
}

impl Agent {
    fn start(dir: &Path, extra: &[&str]) -> Agent {
        let data = dir.join("data");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
        cmd.args([
            "agent",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--data",
        ])
        .arg(&data)
        .args(["--config"])
        .arg(dir.join("limits.yaml"))
        .args(extra);
        let Ready {
            child,
            grpc,
            http,
            stderr,
        } = support::spawn_ready(cmd, "agent");
        Agent {
            child,
            grpc,
            http,
            stderr,
        }
    }

    async fn lease_api(&self) -> LeaseServiceClient<Channel> {
        LeaseServiceClient::new(channel(&self.grpc).await)
    }

    async fn rls(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(channel(&self.grpc).await)
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits for the process to exit; returns its exit code and what it logged.
    fn wait(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut err = String::new();
                if let Some(mut e) = self.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return (status.code(), err);
            }
            assert!(Instant::now() < deadline, "the agent did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn get(&self, path: &str) -> (u16, String) {
        http_get(&self.http, path)
    }

    /// The admin view of one key.
    fn key(&self, domain: &str, descriptor: &str) -> Value {
        let (code, body) = self.get(&format!("/v1/keys?domain={domain}&descriptor={descriptor}"));
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).expect("JSON")
    }

    fn metric(&self, line_prefix: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("url")
        .connect()
        .await
        .expect("connects to the agent")
}

fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("admin HTTP");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_owned())
}

fn target(domain: &str, entries: &[(&str, &str)]) -> Option<pb::Target> {
    Some(pb::Target {
        domain: domain.to_owned(),
        entries: entries
            .iter()
            .map(|(k, v)| pb::Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
    })
}

async fn acquire(
    c: &mut LeaseServiceClient<Channel>,
    domain: &str,
    entries: &[(&str, &str)],
    cost: u64,
    idempotency_key: &str,
) -> pb::Decision {
    c.acquire(pb::AcquireRequest {
        target: target(domain, entries),
        cost_units: cost,
        idempotency_key: idempotency_key.to_owned(),
    })
    .await
    .expect("acquire")
    .into_inner()
    .decision
    .expect("decision")
}

/// A lease of `units` (at least 1) on the "shop" domain, handing `returns` back.
fn lease_request(
    entries: &[(&str, &str)],
    units: u64,
    returns: Vec<pb::LeaseReturn>,
) -> pb::LeaseRequest {
    pb::LeaseRequest {
        target: target("shop", entries),
        units_wanted: units,
        min_units: 1,
        ttl_ms: 60_000,
        idempotency_key: String::new(),
        returns,
        top_up_lease_id: 0,
    }
}

fn release_request(lease_id: u64, unused_units: u64) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        lease_id,
        unused_units,
        idempotency_key: String::new(),
    }
}

async fn lease_units(
    c: &mut LeaseServiceClient<Channel>,
    entries: &[(&str, &str)],
    units: u64,
    returns: Vec<pb::LeaseReturn>,
) -> Option<pb::Lease> {
    c.lease(lease_request(entries, units, returns))
        .await
        .expect("lease")
        .into_inner()
        .lease
}

// Windows of a day: a test never straddles a window boundary in practice.
const SHOP: &str = "\
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 10}
    allot:
      max_settle_overage: 0.5
  - key: worker
    rate_limit: {unit: day, requests_per_unit: 1000}
    allot:
      concurrency: {max_slots: 1, slot_ttl: 30s}
";

#[tokio::test]
async fn the_lease_api_end_to_end() {
    let dir = scratch("lease_api");
    write_config(&dir, SHOP);
    let agent = Agent::start(&dir, &[]);
    let mut c = agent.lease_api().await;
    let t = [("tenant", "acme")];

    // 10 per day: 4 leave 6; 7 more do not fit (all or nothing) and wait for the window.
    let d = acquire(&mut c, "shop", &t, 4, "").await;
    assert!(d.allowed);
    assert_eq!((d.remaining_units, d.limit_units), (6, 10));
    assert_eq!(
        (d.rule.as_str(), d.reason.as_str()),
        ("shop/tenant", "allowance")
    );
    let d = acquire(&mut c, "shop", &t, 7, "").await;
    assert!(!d.allowed);
    assert_eq!(d.remaining_units, 6);
    assert_eq!(d.retry_after_ms, Some(d.reset_after_ms));

    // A retried call with the same idempotency key is charged once: 6 - 2 = 4 both times.
    let first = acquire(&mut c, "shop", &t, 2, "order-1").await;
    let retry = acquire(&mut c, "shop", &t, 2, "order-1").await;
    assert_eq!(first.remaining_units, 4);
    assert_eq!(retry.remaining_units, 4);

    // No rule: allowed, counted nowhere (as envoyproxy/ratelimit does).
    let d = acquire(&mut c, "shop", &[("nobody", "x")], 1, "").await;
    assert!(d.allowed);
    assert_eq!((d.rule.as_str(), d.reason.as_str()), ("", "no_rule"));
    let d = acquire(&mut c, "unknown-domain", &t, 1, "").await;
    assert_eq!(d.reason, "no_rule");

    // A lease of 3 of the 4 left; 2 unused come back on release: 4 - 3 + 2 = 3 left.
    let resp = c
        .lease(lease_request(&t, 3, Vec::new()))
        .await
        .expect("lease")
        .into_inner();
    let lease = resp.lease.expect("granted");
    assert_eq!(lease.units, 3);
    assert_eq!(resp.decision.expect("decision").remaining_units, 1);
    assert_eq!(agent.key("shop", "tenant=acme")["leases"][0]["units"], 3);
    let released = c
        .release(release_request(lease.lease_id, 2))
        .await
        .expect("release")
        .into_inner();
    assert_eq!(released.refunded_units, 2);
    let view = agent.key("shop", "tenant=acme");
    assert_eq!(view["remaining_units"], 3);
    assert_eq!(view["leases"].as_array().map(Vec::len), Some(0));

    // At least 5 wanted, 3 left: nothing is granted, and nothing is charged.
    let resp = c
        .lease(pb::LeaseRequest {
            min_units: 5,
            ..lease_request(&t, 8, Vec::new())
        })
        .await
        .expect("lease")
        .into_inner();
    assert!(resp.lease.is_none());
    assert!(!resp.decision.expect("decision").allowed);
    assert_eq!(agent.key("shop", "tenant=acme")["remaining_units"], 3);

    // A lease refilled: 1 unit, then 2 more into the same lease (0 left).
    let spent = lease_units(&mut c, &t, 1, Vec::new())
        .await
        .expect("granted");
    let mut refill = lease_request(&t, 2, Vec::new());
    refill.top_up_lease_id = spent.lease_id;
    let topped = c
        .lease(refill)
        .await
        .expect("top up")
        .into_inner()
        .lease
        .expect("granted");
    assert_eq!((topped.lease_id, topped.units), (spent.lease_id, 2));
    let view = agent.key("shop", "tenant=acme");
    assert_eq!(view["leases"].as_array().map(Vec::len), Some(1), "{view}");
    assert_eq!(view["leases"][0]["units"], 3);
    assert_eq!(view["remaining_units"], 0);

    // A spent lease handed back with the next request ends before the grant: its 3 units,
    // returned unused with a request for 3, are what make that request fit.
    let back = pb::LeaseReturn {
        lease_id: spent.lease_id,
        unused_units: 3,
    };
    let next = lease_units(&mut c, &t, 3, vec![back])
        .await
        .expect("granted");
    assert_eq!(next.units, 3);
    let view = agent.key("shop", "tenant=acme");
    assert_eq!(view["leases"].as_array().map(Vec::len), Some(1), "{view}");
    // Giving back more than a lease holds changes nothing.
    let too_much = pb::LeaseReturn {
        lease_id: next.lease_id,
        unused_units: 4,
    };
    let err = c
        .lease(lease_request(&t, 1, vec![too_much]))
        .await
        .expect_err("invalid return");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert_eq!(agent.key("shop", "tenant=acme")["leases"][0]["units"], 3);
    c.release(release_request(next.lease_id, 3))
        .await
        .expect("release");
    // Three leases ended by release so far (one handed back with a request), refunding
    // 2 + 3 + 3 units, counted under their rule.
    assert_eq!(
        agent.metric("allot_lease_returns_total{rule=\"shop/tenant\",kind=\"release\"}"),
        Some(3.0)
    );
    assert_eq!(
        agent.metric("allot_lease_returned_units_total{rule=\"shop/tenant\"}"),
        Some(8.0)
    );

    // Reserve 2, use 3: the extra unit is charged as overage (3 - 3 = 0 left); the rule lets a
    // settle charge up to half its reservation above it, 1 unit here.
    let lease = c
        .lease(pb::LeaseRequest {
            min_units: 2,
            ..lease_request(&t, 2, Vec::new())
        })
        .await
        .expect("lease")
        .into_inner()
        .lease
        .expect("granted");
    let renewed = c
        .renew(pb::RenewRequest {
            lease_id: lease.lease_id,
            ttl_ms: 120_000,
            idempotency_key: String::new(),
        })
        .await
        .expect("renew")
        .into_inner();
    assert!(renewed.expires_at_unix_ms >= lease.expires_at_unix_ms);
    // A renewal says how long is left as a duration too, for a gateway whose clock is not the
    // agent's: rounded down, and never more than the agent's 30 s maximum.
    assert!(
        (1..=30_000).contains(&renewed.ttl_ms),
        "renewal ttl_ms {}",
        renewed.ttl_ms
    );
    assert!(lease.ttl_ms <= 30_000, "lease ttl_ms {}", lease.ttl_ms);
    let settled = c
        .settle(pb::SettleRequest {
            lease_id: lease.lease_id,
            actual_units: 3,
            idempotency_key: String::new(),
        })
        .await
        .expect("settle")
        .into_inner();
    assert_eq!(
        (
            settled.refunded_units,
            settled.overage_units,
            settled.clamped_units
        ),
        (0, 1, 0)
    );
    assert_eq!(agent.key("shop", "tenant=acme")["remaining_units"], 0);
    let gone = c
        .release(release_request(lease.lease_id, 0))
        .await
        .expect_err("settled lease is gone");
    assert_eq!(gone.code(), tonic::Code::NotFound);

    // One concurrency slot per worker: the second waits until the first is released.
    let w = [("worker", "w1")];
    let slot = |c: &mut LeaseServiceClient<Channel>| {
        let req = pb::AcquireSlotRequest {
            target: target("shop", &w),
            idempotency_key: String::new(),
        };
        let mut c = c.clone();
        async move { c.acquire_slot(req).await.expect("slot").into_inner() }
    };
    let first = slot(&mut c).await;
    assert!(first.acquired);
    let second = slot(&mut c).await;
    assert!(!second.acquired);
    assert_eq!((second.in_use, second.max_slots), (1, 1));
    let released = c
        .release_slot(pb::ReleaseSlotRequest {
            slot_id: first.slot_id,
        })
        .await
        .expect("release slot")
        .into_inner();
    assert!(released.released);
    assert!(slot(&mut c).await.acquired);
}

const EDGE: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1, name: paths}
  - key: api_key
    value: lb-health
    rate_limit: {unlimited: true}
";

fn rls_request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| RlsEntry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: hits,
    }
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn should_rate_limit_answers_as_envoyproxy_ratelimit_does() {
    let dir = scratch("rls");
    write_config(&dir, EDGE);
    let agent = Agent::start(&dir, &[]);
    let mut c = agent.rls().await;
    let ip: &[(&str, &str)] = &[("remote_address", "10.0.0.1")];

    // 3 per day: one hit leaves 2.
    let r = c
        .should_rate_limit(rls_request("edge", &[ip], 0))
        .await
        .expect("rls")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().expect("limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (3, Unit::Day as i32));
    assert_eq!(s.limit_remaining, 2);
    assert!(s.duration_until_reset.is_some());
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some(r#""edge/remote_address";q=3;w=86400"#)
    );
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("2"));
    assert_eq!(header(&r, "Retry-After"), None);

    // hits_addend 3 with 2 left: over the limit, nothing charged, a Retry-After no earlier
    // than the RateLimit field's `t`.
    let r = c
        .should_rate_limit(rls_request("edge", &[ip], 3))
        .await
        .expect("rls")
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let t: u64 = header(&r, "RateLimit")
        .and_then(|v| v.rsplit("t=").next())
        .and_then(|t| t.parse().ok())
        .expect("t");
    let retry: u64 = header(&r, "Retry-After")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(
        retry >= t && retry <= t + t / 10 + 1,
        "retry {retry}, t {t}"
    );
    assert_eq!(header(&r, "X-RateLimit-Remaining"), Some("0"));
    assert_eq!(
        agent.key("edge", "remote_address=10.0.0.1")["remaining_units"],
        2
    );

    // Shadow mode: the second hit would be denied; the answer is OK with nothing left, and
    // the would-deny is counted.
    let path: &[(&str, &str)] = &[("path", "/x")];
    for _ in 0..2 {
        let r = c
            .should_rate_limit(rls_request("edge", &[path], 1))
            .await
            .expect("rls")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.name.as_str()),
            Some("paths")
        );
    }
    assert_eq!(
        agent.metric("allot_shadow_would_deny_total{rule=\"edge/path\"}"),
        Some(1.0)
    );

    // Unlimited, no rule, unknown domain: OK; unlimited says u32::MAX remaining, the others
    // carry no limit. Over-limit in any descriptor makes the whole answer over the limit.
    let health: &[(&str, &str)] = &[("api_key", "lb-health")];
    let other: &[(&str, &str)] = &[("user_agent", "curl")];
    let r = c
        .should_rate_limit(rls_request("edge", &[health, other, ip], 5))
        .await
        .expect("rls")
        .into_inner();
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].code, Code::Ok as i32);
    assert!(r.statuses[1].current_limit.is_none());
    assert_eq!(r.statuses[2].code, Code::OverLimit as i32);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = c
        .should_rate_limit(rls_request("elsewhere", &[ip], 1))
        .await
        .expect("rls")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
}

/// envoyproxy/ratelimit's fields (as in examples/limits/envoy_compat.yaml, with day windows so
/// no window ends mid-test).
const ENVOY_FIELDS: &str = "\
domain: compat
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: path
    value: /api/*/action
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: day, requests_per_unit: 60}
";

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

#[tokio::test]
async fn envoyproxy_ratelimit_fields_shape_rls_answers_and_metrics() {
    let dir = scratch("envoy-fields");
    write_config(&dir, ENVOY_FIELDS);
    let agent = Agent::start(&dir, &[]);
    let mut c = agent.rls().await;
    let mut ask = async |descriptors: &[&[(&str, &str)]]| {
        c.should_rate_limit(rls_request("compat", descriptors, 1))
            .await
            .expect("rls")
            .into_inner()
    };
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let s1: &[(&str, &str)] = &[("service", "service_1")];
    let s2: &[(&str, &str)] = &[("service", "service_2")];

    // quota_mode: service_1 (1 a day) alone and over refuses the request ...
    assert_eq!(codes(&ask(&[s1]).await), (ok, vec![ok]));
    let r = ask(&[s1]).await;
    assert_eq!(codes(&r), (over, vec![over]));
    assert!(header(&r, "Retry-After").is_some());
    // ... but not while another quota-mode descriptor is within its limit; its own status
    // still says over, and nothing asks the caller to retry.
    let r = ask(&[s1, s2]).await;
    assert_eq!(codes(&r), (ok, vec![over, ok]));
    assert_eq!(header(&r, "Retry-After"), None);
    assert_eq!(codes(&ask(&[s1, s2]).await), (ok, vec![over, ok]));
    // Both over: refused.
    assert_eq!(codes(&ask(&[s1, s2]).await), (over, vec![over, over]));

    // share_threshold: every value files/* matches spends from one counter of 2.
    let file = |name: &'static str| [("files", name)];
    assert_eq!(codes(&ask(&[&file("files/a.pdf")]).await).0, ok);
    assert_eq!(codes(&ask(&[&file("files/b.csv")]).await).0, ok);
    assert_eq!(codes(&ask(&[&file("files/c.txt")]).await).0, over);

    // A middle wildcard: one counter per value (1 a day each), other values match nothing.
    let path = |p: &'static str| [("path", p)];
    assert_eq!(codes(&ask(&[&path("/api/1/action")]).await).0, ok);
    assert_eq!(codes(&ask(&[&path("/api/2/action")]).await).0, ok);
    assert_eq!(codes(&ask(&[&path("/api/1/action")]).await).0, over);
    let r = ask(&[&path("/api/1/other")]).await;
    assert!(r.statuses[0].current_limit.is_none(), "no rule matches");

    // value_to_metric: decisions counted per request value.
    let route: &[(&str, &str)] = &[
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "7"),
    ];
    ask(&[route]).await;
    ask(&[route]).await;
    let (_, body) = agent.get("/metrics");
    let line = body
        .lines()
        .find(|l| {
            l.starts_with("allot_value_decisions_total{")
                && l.contains(r#"value="route=api/http_method=GET/subject_id""#)
                && l.contains(r#"result="allowed""#)
        })
        .unwrap_or_else(|| panic!("no per-value series in:\n{body}"));
    assert!(
        line.contains(r#"rule="compat/route/http_method/subject_id""#),
        "{line}"
    );
    assert!(line.ends_with(" 2"), "{line}");
}

#[tokio::test]
async fn bad_input_gets_grpc_errors_and_the_agent_keeps_answering() {
    let dir = scratch("bad_input");
    write_config(&dir, EDGE);
    let agent = Agent::start(&dir, &[]);
    let mut rls = agent.rls().await;
    let mut lease = agent.lease_api().await;
    let ip: &[(&str, &str)] = &[("remote_address", "10.0.0.1")];
    let long = "v".repeat(2_000);
    let long_entry: &[(&str, &str)] = &[("remote_address", &long)];
    let many: Vec<&[(&str, &str)]> = vec![ip; 65];
    let no_entries: &[(&str, &str)] = &[];
    let invalid = [
        rls_request("", &[ip], 1),
        rls_request("edge", &[], 1),
        rls_request("edge", &many, 1),
        rls_request("edge", &[long_entry], 1),
        rls_request("edge", &[no_entries], 1),
    ];
    for req in invalid {
        let e = rls.should_rate_limit(req).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
    let mut negative = rls_request("edge", &[ip], 1);
    negative.descriptors[0].is_negative_hits = true;
    let e = rls.should_rate_limit(negative).await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // Past the message size bound the request is not even decoded.
    let huge = "v".repeat(100_000);
    let e = rls
        .should_rate_limit(rls_request("edge", &[&[("remote_address", &huge)]], 1))
        .await
        .expect_err("refused");
    assert_ne!(e.code(), tonic::Code::Ok);

    let e = lease
        .acquire(pb::AcquireRequest::default())
        .await
        .expect_err("no target");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = lease
        .release(release_request(99, 1))
        .await
        .expect_err("unknown lease");
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = lease
        .lease(pb::LeaseRequest {
            target: target("edge", ip),
            units_wanted: 0,
            ..pb::LeaseRequest::default()
        })
        .await
        .expect_err("zero units");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // Still answering, and the refusals were counted.
    let r = rls
        .should_rate_limit(rls_request("edge", &[ip], 1))
        .await
        .expect("rls");
    assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
    assert!(agent.metric("allot_invalid_requests_total{service=\"rls\"}") >= Some(6.0));
    let (code, _) = agent.get("/v1/keys?domain=edge&descriptor=");
    assert_eq!(code, 400);
}

const BULK: &str = "\
domain: bulk
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 100000000}
";

/// Clients count the units they were told were admitted; the agent is killed with SIGKILL
/// in the middle of the load; after a restart its counter holds at least that many.
async fn no_admitted_unit_is_lost_to_sigkill(test: &str, durability: &str) {
    let dir = scratch(test);
    write_config(&dir, BULK);
    let agent = Agent::start(&dir, &["--durability", durability]);
    let channel = channel(&agent.grpc).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = LeaseServiceClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u64;
            loop {
                let req = pb::AcquireRequest {
                    target: target("bulk", &[("tenant", "t1")]),
                    cost_units: 1,
                    idempotency_key: String::new(),
                };
                match c.acquire(req).await {
                    Ok(r) if r.get_ref().decision.as_ref().is_some_and(|d| d.allowed) => {
                        admitted += 1;
                    }
                    Ok(_) => {}
                    Err(_) => return admitted,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(agent); // SIGKILL
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("client task");
    }
    assert!(admitted > 0, "the load ran");
    let again = Agent::start(&dir, &["--durability", durability]);
    let view = again.key("bulk", "tenant=t1");
    let net = view["net_units"].as_u64().expect("net units");
    assert!(
        net >= admitted,
        "restart sees {net} units, {admitted} were admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_mode_loses_no_admitted_unit_to_sigkill() {
    no_admitted_unit_is_lost_to_sigkill("sigkill_buffered", "buffered").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mode_loses_no_admitted_unit_to_sigkill() {
    no_admitted_unit_is_lost_to_sigkill("sigkill_sync", "sync").await;
}

const RELOAD: &str = "\
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: QUOTA}
";

/// Acquires until the rule answers with `quota` as its limit (a reload is asynchronous).
async fn wait_for_quota(c: &mut LeaseServiceClient<Channel>, quota: u64) -> pb::Decision {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let d = acquire(c, "shop", &[("tenant", "acme")], 1, "").await;
        if d.limit_units == quota {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "quota {quota} never took effect: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn reloads_on_sighup_and_on_file_change_keep_counters_and_survive_bad_files() {
    let dir = scratch("reload");
    write_config(&dir, &RELOAD.replace("QUOTA", "5"));
    let agent = Agent::start(&dir, &[]);
    let mut c = agent.lease_api().await;
    let d = acquire(&mut c, "shop", &[("tenant", "acme")], 3, "").await;
    assert_eq!((d.limit_units, d.remaining_units), (5, 2));

    // A good file on SIGHUP: the new quota, the same counter.
    write_config(&dir, &RELOAD.replace("QUOTA", "50"));
    agent.signal("HUP");
    let d = wait_for_quota(&mut c, 50).await;
    let used = d.limit_units - d.remaining_units;
    assert!(
        used >= 4,
        "the 3 units from before the reload still count: {d:?}"
    );

    // A bad file: logged, counted, and the configuration in force stays.
    write_config(
        &dir,
        "domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight}\n",
    );
    agent.signal("HUP");
    let deadline = Instant::now() + PATIENCE;
    while agent
        .metric("allot_config_reloads_total{result=\"error\"}")
        .is_none()
    {
        assert!(Instant::now() < deadline, "the bad file was never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = acquire(&mut c, "shop", &[("tenant", "acme")], 1, "").await;
    assert_eq!(d.limit_units, 50);

    // A good file again, without a signal: the change is noticed.
    write_config(&dir, &RELOAD.replace("QUOTA", "70"));
    wait_for_quota(&mut c, 70).await;

    agent.signal("TERM");
    let (code, log) = agent.wait();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("fortnight"), "every error is logged: {log}");
}

#[tokio::test]
async fn sigterm_finishes_flushes_and_exits_zero() {
    let dir = scratch("sigterm");
    write_config(&dir, SHOP);
    let agent = Agent::start(&dir, &[]);
    let mut c = agent.lease_api().await;
    acquire(&mut c, "shop", &[("tenant", "acme")], 3, "").await;
    let (code, body) = agent.get("/readyz");
    assert_eq!((code, body.trim()), (200, "ready"));
    assert_eq!(agent.get("/healthz").0, 200);
    agent.signal("TERM");
    let (code, log) = agent.wait();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("state flushed"), "{log}");
    let again = Agent::start(&dir, &[]);
    assert_eq!(again.key("shop", "tenant=acme")["net_units"], 3);
}

fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .output()
        .expect("the allot binary runs")
}

#[tokio::test]
async fn acquire_and_rls_commands_exit_zero_on_answers_and_two_on_errors() {
    let dir = scratch("cli");
    write_config(
        &dir,
        SHOP.replace("requests_per_unit: 10", "requests_per_unit: 1")
            .as_str(),
    );
    let agent = Agent::start(&dir, &[]);
    let args = [
        "acquire",
        "--agent",
        &agent.grpc,
        "--domain",
        "shop",
        "--descriptor",
        "tenant=a",
    ];
    let allowed = allot(&args);
    assert_eq!(allowed.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&allowed.stdout).expect("one JSON object");
    assert_eq!(v["allowed"], true);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["rule"], "shop/tenant");
    let denied = allot(&args);
    assert_eq!(denied.status.code(), Some(0), "denied is an answer too");
    let v: Value = serde_json::from_slice(&denied.stdout).expect("one JSON object");
    assert_eq!(v["allowed"], false);
    assert!(v["retry_after_ms"].as_u64().is_some());
    assert!(v["reset_ms"].as_u64().is_some());

    let rls = allot(&[
        "rls",
        "--agent",
        &agent.grpc,
        "--domain",
        "shop",
        "--descriptor",
        "tenant=a",
    ]);
    assert_eq!(rls.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&rls.stdout).expect("JSON");
    assert_eq!(v["overall_code"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["current_limit"]["unit"], "DAY");

    let bad = allot(&[
        "acquire",
        "--agent",
        &agent.grpc,
        "--domain",
        "",
        "--descriptor",
        "tenant=a",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("domain must not be empty"));
    let no_agent = allot(&[
        "acquire",
        "--agent",
        "127.0.0.1:1",
        "--domain",
        "shop",
        "--descriptor",
        "tenant=a",
    ]);
    assert_eq!(no_agent.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_agent.stderr).contains("cannot connect"));
    let malformed = allot(&[
        "acquire",
        "--agent",
        &agent.grpc,
        "--domain",
        "shop",
        "--descriptor",
        "=x",
    ]);
    assert_eq!(malformed.status.code(), Some(2));
}

const TWO_REGIONS: &str = "\
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 10}
    allot: {weights: {eu: 0.5, us: 0.5}}
";

#[test]
fn coordinator_addresses_and_the_region_are_checked_at_start() {
    let dir = scratch("coordinator");
    write_config(&dir, SHOP);
    let data = dir.join("data");
    let config = dir.join("limits.yaml");
    let start = |extra: &[&str]| {
        let mut args = vec![
            "agent",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--data",
            data.to_str().expect("utf-8"),
            "--config",
            config.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(extra);
        allot(&args)
    };
    let bad = start(&["--coordinator", "no-port"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("coordinator 'no-port'"));
    // SHOP names no region: a coordinated agent would have no share of anything.
    let unnamed = start(&["--coordinator", "127.0.0.1:1"]);
    assert_eq!(unnamed.status.code(), Some(1));
    let err = String::from_utf8_lossy(&unnamed.stderr);
    assert!(
        err.contains("region 'local'") && err.contains("names none"),
        "{err}"
    );
    write_config(&dir, TWO_REGIONS);
    let other = start(&["--coordinator", "127.0.0.1:1", "--region", "ap"]);
    assert_eq!(other.status.code(), Some(1));
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(
        err.contains("region 'ap' is not named") && err.contains("eu, us"),
        "{err}"
    );
}

const TWO_RULES: &str = "\
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 10}
    allot: {failure_mode: closed}
";

#[tokio::test]
async fn past_the_key_cap_the_rules_failure_mode_decides() {
    let dir = scratch("key_cap");
    write_config(&dir, TWO_RULES);
    let agent = Agent::start(&dir, &["--max-keys-per-limit", "1"]);
    let mut c = agent.lease_api().await;
    // One key per rule: a second key with use this window cannot evict the first (it is not
    // idle), so the agent cannot decide and the rule's failure mode answers.
    assert!(
        acquire(&mut c, "shop", &[("tenant", "a")], 1, "")
            .await
            .allowed
    );
    let open = acquire(&mut c, "shop", &[("tenant", "b")], 1, "").await;
    assert_eq!((open.allowed, open.reason.as_str()), (true, "degraded"));
    assert!(
        acquire(&mut c, "shop", &[("user", "a")], 1, "")
            .await
            .allowed
    );
    let closed = acquire(&mut c, "shop", &[("user", "b")], 1, "").await;
    assert_eq!(
        (closed.allowed, closed.reason.as_str()),
        (false, "degraded")
    );
    assert_eq!(
        agent.metric("allot_keys_refused_total{rule=\"shop/tenant\"}"),
        Some(1.0)
    );
    assert_eq!(
        agent.metric("allot_degraded_decisions_total{rule=\"shop/user\",mode=\"closed\"}"),
        Some(1.0)
    );
}

/// A declared restore waits for its coordinator's first answer, which cannot come here
/// (nothing listens at the address). Killed and started again without `--restored`, it reads
/// the store its restored boot wrote, which still lacks what the lost copy admitted: it must
/// wait again, not take that store for its own latest state and admit its share a second
/// time (swarm seeds 3145780 and 3144582).
#[tokio::test]
async fn a_restore_killed_before_its_first_answer_still_waits_after_a_restart() {
    let dir = scratch("restore_killed_unanswered");
    write_config(&dir, TWO_REGIONS);
    let args = ["--coordinator", "127.0.0.1:1", "--region", "eu"];
    let restored = Agent::start(&dir, &[&args[..], &["--restored"]].concat());
    let mut c = restored.lease_api().await;
    let d = acquire(&mut c, "shop", &[("tenant", "t1")], 1, "").await;
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.reason, "restoring", "{d:?}");
    drop(c);
    drop(restored); // SIGKILL
    let again = Agent::start(&dir, &args);
    let mut c = again.lease_api().await;
    let d = acquire(&mut c, "shop", &[("tenant", "t1")], 1, "").await;
    assert!(!d.allowed, "the restart admitted before any answer: {d:?}");
    assert_eq!(d.reason, "restoring", "{d:?}");
}
