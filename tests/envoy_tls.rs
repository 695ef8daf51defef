//! The real Envoy as a TLS client of an agent run with `--gateway-tls` and a callers file
//! (D59, docs/security.md): Envoy's cluster for the agent presents a gateway certificate from
//! `allot certs init` and checks the agent's (its URI SAN must name the region).
//!
//! - RLS: Envoy holding `edge`'s certificate, which the callers file allows the domain, gets
//!   the quota enforced (200s, then 429); Envoy holding `rogue`'s (signed by the same CA, not
//!   in the file) is refused every call by the agent, counted, and falls back to its own
//!   failure mode (`failure_mode_deny: false`: traffic passes).
//! - RLQS: Envoy's quota stream over the same TLS cluster is served.
//!
//! Slow tier (`ALLOT_SLOW_TESTS=1`), as every test of the real Envoy.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use allot_bench::envoy::{
    EnvoyPorts, EnvoyProcess, EnvoySetup, HttpResponse, http_get, render_bootstrap,
    render_rlqs_bootstrap,
};
use serde_json::json;
use support::{Process, eventually, scratch};

#[path = "support/envoy.rs"]
mod envoy_support;
use envoy_support::envoy_or_skip;

const QUOTA: u64 = 3;
const DOMAIN: &str = "envoy_tls";
const HEADER: &str = "x-api-key";
const DESCRIPTOR_KEY: &str = "api_key";

/// The cluster line every bootstrap template opens the agent's cluster with.
const CLUSTER_OPENING: &str =
    "    - name: allot_agent\n      type: STATIC\n      connect_timeout: 1s\n";

/// Envoy's TLS to the agent: this gateway's certificate, the CA, and the agent's identity.
fn transport_socket(certs: &Path, gateway: &str) -> String {
    let file = |name: String| certs.join(name).display().to_string();
    format!(
        "      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: [h2]
            tls_certificates:
              - certificate_chain: {{ filename: {cert} }}
                private_key: {{ filename: {key} }}
            validation_context:
              trusted_ca: {{ filename: {ca} }}
              match_typed_subject_alt_names:
                - san_type: URI
                  matcher: {{ exact: \"spiffe://allot/region/local\" }}
",
        cert = file(format!("gateway-{gateway}.pem")),
        key = file(format!("gateway-{gateway}-key.pem")),
        ca = file("ca.pem".to_owned()),
    )
}

fn with_tls(bootstrap: String, certs: &Path, gateway: &str) -> String {
    assert!(
        bootstrap.contains(CLUSTER_OPENING),
        "the template's agent cluster changed"
    );
    bootstrap.replace(
        CLUSTER_OPENING,
        &format!("{CLUSTER_OPENING}{}", transport_socket(certs, gateway)),
    )
}

struct Setup {
    agent: Process,
    certs: PathBuf,
    dir: PathBuf,
}

fn start(test: &str) -> Setup {
    let limits = allot_bench::agent::day_limits_yaml(DOMAIN, DESCRIPTOR_KEY, QUOTA);
    let dir = scratch("envoy_tls", test, Some(&limits));
    let certs = dir.join("certs");
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["certs", "init"])
        .arg(&certs)
        .args([
            "--nodes",
            "1",
            "--regions",
            "local",
            "--gateways",
            "edge,rogue",
        ])
        .output()
        .expect("allot runs");
    assert!(out.status.success(), "{out:?}");
    let callers = dir.join("callers.json");
    let text = json!({ "callers": [{ "name": "edge", "certificate": true, "domains": [DOMAIN] }] });
    std::fs::write(&callers, text.to_string()).expect("callers file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, &dir, "local", None);
    support::tls_args(&mut cmd, &certs, "region-local");
    cmd.arg("--gateway-tls").arg("--callers").arg(&callers);
    Setup {
        agent: Process::start(cmd, "agent"),
        certs,
        dir,
    }
}

impl Setup {
    fn envoy_setup(&self) -> EnvoySetup {
        EnvoySetup {
            rls_addr: self.agent.grpc.parse().expect("an address"),
            domain: DOMAIN.to_owned(),
            descriptor_header: HEADER.to_owned(),
            descriptor_key: DESCRIPTOR_KEY.to_owned(),
            rls_timeout: Duration::from_secs(2),
        }
    }

    fn envoy(
        &self,
        bin: &Path,
        gateway: &str,
        render: impl FnOnce(&EnvoySetup, EnvoyPorts) -> allot_bench::Result<String>,
    ) -> EnvoyProcess {
        let work = self.dir.join(format!("envoy-{gateway}"));
        std::fs::create_dir_all(&work).expect("work dir");
        let setup = self.envoy_setup();
        EnvoyProcess::start_rendered(bin, 1, &work, |ports| {
            Ok(with_tls(render(&setup, ports)?, &self.certs, gateway))
        })
        .expect("Envoy starts")
    }

    fn refused(&self, kind: &str) -> f64 {
        self.agent
            .metric(&format!("allot_refused_callers_total{{kind=\"{kind}\"}}"))
    }
}

fn get(envoy: &EnvoyProcess, api_key: &str) -> HttpResponse {
    http_get(envoy.listen_addr(), "/", &[(HEADER, api_key)])
        .unwrap_or_else(|e| panic!("request through Envoy failed: {e}\n{}", envoy.log_tail()))
}

#[test]
fn envoy_with_a_listed_certificate_is_enforced_and_an_unlisted_one_refused() {
    let test = "envoy_with_a_listed_certificate_is_enforced_and_an_unlisted_one_refused";
    let Some(bin) = envoy_or_skip(test) else {
        return;
    };
    let s = start("rls");
    let edge = s.envoy(&bin, "edge", render_bootstrap);
    for i in 0..QUOTA {
        let r = get(&edge, "k1");
        assert_eq!(r.status, 200, "request {i}: {r:?}\n{}", edge.log_tail());
    }
    let refused = get(&edge, "k1");
    assert_eq!(refused.status, 429, "{refused:?}\n{}", edge.log_tail());
    assert_eq!(s.refused("unauthenticated"), 0.0);
    let key = s.agent.json(&format!(
        "/v1/keys?domain={DOMAIN}&descriptor={DESCRIPTOR_KEY}=k1"
    ));
    assert_eq!(key["granted_units"], QUOTA, "{key}");
    drop(edge);

    // rogue's certificate is the CA's, but the callers file does not name it: every call is
    // refused, and Envoy's own failure mode lets the traffic pass uncounted.
    let rogue = s.envoy(&bin, "rogue", render_bootstrap);
    for _ in 0..QUOTA + 2 {
        assert_eq!(get(&rogue, "k2").status, 200);
    }
    assert!(s.refused("unauthenticated") >= (QUOTA + 2) as f64);
    let key = s.agent.json(&format!(
        "/v1/keys?domain={DOMAIN}&descriptor={DESCRIPTOR_KEY}=k2"
    ));
    assert_eq!(key["granted_units"].as_u64().unwrap_or(0), 0, "{key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_quota_stream_runs_over_tls() {
    let test = "envoys_quota_stream_runs_over_tls";
    let Some(bin) = envoy_or_skip(test) else {
        return;
    };
    let s = start("rlqs");
    let interval = Duration::from_secs(1);
    let edge = s.envoy(&bin, "edge", |setup, ports| {
        render_rlqs_bootstrap(setup, ports, interval)
    });
    for _ in 0..3 {
        assert_eq!(get(&edge, "k3").status, 200, "{}", edge.log_tail());
    }
    eventually(
        "Envoy reports its bucket over TLS and is assigned",
        || s.agent.metric("allot_rlqs_bucket_reports_total"),
        |n| *n >= 1.0,
    )
    .await;
    assert_eq!(s.refused("unauthenticated"), 0.0);
    assert!(s.agent.metric("allot_rlqs_streams_total") >= 1.0);
}
