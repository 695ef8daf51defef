//! The coordinator's admin token (D60, docs/security.md) on a real `allot coordinator`: a
//! change through the admin HTTP (a configuration put, a region removed, a node added) needs
//! `Authorization: Bearer TOKEN` of the digest the node was started with; the CLI sends
//! `ALLOT_ADMIN_TOKEN`. Without it, or with another token, the change is refused with 401,
//! counted, and nothing changes; reads stay open. A bad digest stops the node at start.

mod support;

use std::process::{Command, Output};

use support::{Process, eventually, scratch, sha256_hex};

const TOKEN: &str = "admin-4d1f9c";

fn limits(quota: u64) -> String {
    format!(
        "domain: shop\ndescriptors:\n  - key: strict\n    rate_limit: {{unit: day, requests_per_unit: {quota}}}\n"
    )
}

fn coordinator_cmd(dir: &std::path::Path, digest: &str) -> Command {
    let mut cmd = support::coordinator_cmd(dir);
    cmd.args(["--admin-token-sha256", digest]);
    cmd
}

/// `allot ARGS` with ALLOT_ADMIN_TOKEN set to `token`, or unset.
fn allot(token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(args).env_remove("ALLOT_ADMIN_TOKEN");
    if let Some(t) = token {
        cmd.env("ALLOT_ADMIN_TOKEN", t);
    }
    cmd.output().expect("allot runs")
}

/// One request with an optional `Authorization` value: the status code.
fn status_of(addr: &str, method: &str, path: &str, authorization: Option<&str>) -> u16 {
    let auth = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    support::http_request(addr, method, path, &auth, "").0
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_need_the_admin_token_and_reads_do_not() {
    let dir = scratch("admin_token", "changes", None);
    std::fs::write(dir.join("limits.yaml"), limits(100)).expect("limits");
    let node = Process::start(coordinator_cmd(&dir, &sha256_hex(TOKEN)), "coordinator");
    let http = node.http.as_str();
    eventually(
        "the start limits are committed",
        || node.json("/v1/config")["version"].clone(),
        |v| *v == 1,
    )
    .await;
    std::fs::write(dir.join("smaller.yaml"), limits(5)).expect("limits");
    let smaller = dir.join("smaller.yaml").display().to_string();
    let put = ["config", "put", &smaller, "--coordinator", http];

    for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let out = allot(token, &put);
        assert!(!out.status.success(), "{token:?}: {out:?}");
        assert!(text(&out.stderr).contains("Bearer"), "{token:?}: {out:?}");
    }
    assert_eq!(node.json("/v1/config")["version"], 1, "nothing was put");
    let out = allot(
        None,
        &["cluster", "remove-region", "eu", "--coordinator", http],
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("Bearer"), "{out:?}");
    // Raw: a token not sent as a bearer, and a change with no body at all, are refused before
    // the handler reads anything.
    assert_eq!(status_of(http, "POST", "/v1/regions/eu", Some(TOKEN)), 401);
    assert_eq!(
        status_of(http, "DELETE", "/v1/cluster/nodes/7", Some("Bearer nope")),
        401
    );
    assert_eq!(status_of(http, "GET", "/v1/status", None), 200);
    assert_eq!(status_of(http, "GET", "/v1/regions", None), 200);
    assert_eq!(
        node.metric("allot_coordinator_refused_peers_total{kind=\"admin_token\"}"),
        6.0
    );

    let out = allot(Some(TOKEN), &put);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stdout).starts_with("version 2 committed"),
        "{out:?}"
    );
    assert_eq!(node.json("/v1/config")["version"], 2);
    let out = allot(
        Some("two words"),
        &["config", "put", &smaller, "--coordinator", http],
    );
    assert!(
        text(&out.stderr).contains("ALLOT_ADMIN_TOKEN must be"),
        "{out:?}"
    );
}

#[test]
fn a_bad_admin_digest_stops_the_node_at_start() {
    let dir = scratch("admin_token", "bad_digest", None);
    std::fs::write(dir.join("limits.yaml"), limits(100)).expect("limits");
    for digest in ["abc", &"g".repeat(64), &sha256_hex(TOKEN)[..63]] {
        let out = coordinator_cmd(&dir, digest).output().expect("allot runs");
        assert!(!out.status.success(), "{digest}: started");
        let err = text(&out.stderr);
        assert!(err.contains("--admin-token-sha256"), "{err}");
        assert!(err.contains("64 hex digits"), "{err}");
    }
}

/// `allot ARGS` with the environment `vars` (and neither admin variable otherwise).
fn allot_with(vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(args)
        .env_remove("ALLOT_ADMIN_TOKEN")
        .env_remove("ALLOT_TLS_CA");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("allot runs")
}

#[test]
fn the_admin_http_over_tls_takes_the_cli_with_the_ca() {
    let dir = scratch("admin_token", "tls", None);
    std::fs::write(dir.join("limits.yaml"), limits(100)).expect("limits");
    let certs = support::certs_init(&dir.join("certs"), &["--nodes", "1"]);
    // A second CA's set, for a client that must not trust the node.
    let other = support::certs_init(&dir.join("other"), &["--nodes", "1"]);
    let mut cmd = coordinator_cmd(&dir, &sha256_hex(TOKEN));
    support::tls_args(&mut cmd, &certs, "node-1");
    cmd.arg("--admin-tls");
    let node = Process::start(cmd, "coordinator");
    let https = format!("https://{}", node.http);
    let ca = certs.join("ca.pem").display().to_string();
    let other_ca = other.join("ca.pem").display().to_string();

    // Plaintext gets no answer from the TLS port.
    assert_ne!(status_of(&node.http, "GET", "/v1/status", None), 200);
    let out = allot_with(
        &[("ALLOT_TLS_CA", &ca)],
        &["status", "--coordinator", &https, "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["node"], 1, "{status}");
    let out = allot_with(&[], &["status", "--coordinator", &https]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("needs ALLOT_TLS_CA"), "{out:?}");
    let out = allot_with(
        &[("ALLOT_TLS_CA", &other_ca)],
        &["status", "--coordinator", &https],
    );
    assert!(
        !out.status.success(),
        "a certificate of another CA is trusted"
    );
    assert!(text(&out.stderr).contains("TLS"), "{out:?}");

    std::fs::write(dir.join("smaller.yaml"), limits(5)).expect("limits");
    let smaller = dir.join("smaller.yaml").display().to_string();
    let put = ["config", "put", &smaller, "--coordinator", &https];
    let out = allot_with(&[("ALLOT_TLS_CA", &ca)], &put);
    assert!(!out.status.success(), "a change without the token: {out:?}");
    let out = allot_with(&[("ALLOT_TLS_CA", &ca), ("ALLOT_ADMIN_TOKEN", TOKEN)], &put);
    assert!(out.status.success(), "{out:?}");
    // Version 1 or 2: the node's own put of its start limits may not have landed yet.
    assert!(
        text(&out.stdout).contains(" committed (1 rules)"),
        "{out:?}"
    );
}
