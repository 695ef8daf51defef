//! Read tokens (D63, docs/security.md) on a real `allot coordinator` and a real `allot agent`:
//! with `--read-token-sha256`, the operators' reads (status, configuration, members, regions,
//! metrics; on the agent also keys and key watches) need `Authorization: Bearer TOKEN` of that
//! digest, 401 and counted otherwise; a coordinator also takes its admin token for them, and
//! a read token changes nothing. Health checks, the dashboard's page and the agent's lease API
//! stay as they were. The CLI sends ALLOT_READ_TOKEN.

mod support;

use std::process::{Command, Output};

use support::{Process, bearer_header, http_request, scratch, sha256_hex};

const READ: &str = "read-7c21e0";
const ADMIN: &str = "admin-93bb4a";

const LIMITS: &str = "\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 1000}
";

fn status_of(addr: &str, method: &str, path: &str, token: Option<&str>) -> u16 {
    http_request(addr, method, path, &bearer_header(token), "").0
}

/// `allot ARGS` with the environment `vars` and no token variable otherwise.
fn allot_with(vars: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(args)
        .env_remove("ALLOT_ADMIN_TOKEN")
        .env_remove("ALLOT_READ_TOKEN");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.output().expect("allot runs")
}

/// `/metrics` read with the read token: the value of the line starting with `prefix`.
fn metric(addr: &str, prefix: &str) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connects");
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{}\r\n",
        bearer_header(Some(READ))
    );
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_coordinator_s_reads_need_the_read_or_admin_token() {
    let dir = scratch("read_token", "coordinator", Some(LIMITS));
    let mut cmd = support::coordinator_cmd(&dir);
    cmd.args(["--admin-token-sha256", &sha256_hex(ADMIN)])
        .args(["--read-token-sha256", &sha256_hex(READ)]);
    let node = Process::start(cmd, "coordinator");
    let http = node.http.as_str();

    for path in [
        "/v1/status",
        "/v1/config",
        "/v1/cluster/nodes",
        "/v1/regions",
        "/metrics",
    ] {
        for token in [None, Some("wrong"), Some(&READ[1..])] {
            assert_eq!(status_of(http, "GET", path, token), 401, "{path} {token:?}");
        }
        assert_eq!(status_of(http, "GET", path, Some(READ)), 200, "{path}");
        assert_eq!(status_of(http, "GET", path, Some(ADMIN)), 200, "{path}");
    }
    // Three refusals per path.
    let refused = r#"allot_coordinator_refused_peers_total{kind="read_token"}"#;
    assert_eq!(metric(http, refused), 15.0);
    // Open: the dashboard's page (its reads carry the token), health, the CORS preflight.
    assert_eq!(status_of(http, "GET", "/", None), 200);
    assert_eq!(status_of(http, "GET", "/healthz", None), 200);
    assert_eq!(status_of(http, "OPTIONS", "/v1/status", None), 204);
    // A read token changes nothing.
    let (code, answer) = http_request(
        http,
        "DELETE",
        "/v1/regions/eu",
        &bearer_header(Some(READ)),
        "",
    );
    assert_eq!(code, 401, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("--admin-token-sha256")),
        "{answer}"
    );

    let status = ["status", "--coordinator", http, "--json"];
    let out = allot_with(&[], &status);
    assert!(!out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("401"), "{out:?}");
    for var in ["ALLOT_READ_TOKEN", "ALLOT_ADMIN_TOKEN"] {
        let token = if var == "ALLOT_READ_TOKEN" {
            READ
        } else {
            ADMIN
        };
        let out = allot_with(&[(var, token)], &status);
        assert!(out.status.success(), "{var}: {out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(json["node"], 1, "{json}");
    }
    let members = ["cluster", "members", "--coordinator", http];
    let out = allot_with(&[("ALLOT_READ_TOKEN", READ)], &members);
    assert!(out.status.success(), "{out:?}");
    // Both set: a read goes with the read token, a change with the admin token.
    std::fs::write(dir.join("more.yaml"), LIMITS.replace("1000", "2000")).expect("limits");
    let more = dir.join("more.yaml").display().to_string();
    let both = [("ALLOT_READ_TOKEN", READ), ("ALLOT_ADMIN_TOKEN", ADMIN)];
    let out = allot_with(&both, &["config", "put", &more, "--coordinator", http]);
    assert!(out.status.success(), "{out:?}");
    let out = allot_with(&both, &status);
    assert!(out.status.success(), "{out:?}");
    let out = allot_with(&[("ALLOT_READ_TOKEN", "two words")], &status);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        text(&out.stderr).contains("ALLOT_READ_TOKEN must be printable ASCII"),
        "{out:?}"
    );
}

#[test]
fn an_agent_s_reads_and_watches_need_the_read_token() {
    let dir = scratch("read_token", "agent", Some(LIMITS));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut cmd, &dir, "a", None);
    cmd.args(["--read-token-sha256", &sha256_hex(READ)]);
    let agent = Process::start(cmd, "agent");
    let http = agent.http.as_str();
    let key = "/v1/keys?domain=shop&descriptor=user=u1";
    for (method, path) in [
        ("GET", "/v1/status"),
        ("GET", "/metrics"),
        ("GET", key),
        ("POST", &key.replacen("/v1/keys", "/v1/keys/watch", 1)),
    ] {
        for token in [None, Some("wrong"), Some(ADMIN)] {
            assert_eq!(
                status_of(http, method, path, token),
                401,
                "{method} {path} {token:?}"
            );
        }
        assert_eq!(status_of(http, method, path, Some(READ)), 200, "{path}");
    }
    let refused = r#"allot_refused_callers_total{kind="read_token"}"#;
    assert_eq!(metric(http, refused), 12.0);
    assert_eq!(status_of(http, "GET", "/healthz", None), 200);
    assert_eq!(status_of(http, "GET", "/readyz", None), 200);
    // The lease API is the callers' (none configured here: open), not the operators'.
    let (code, answer) = http_request(
        http,
        "POST",
        "/v1/acquire",
        "",
        r#"{"target": {"domain": "shop", "entries": [{"key": "user", "value": "u1"}]}, "cost_units": 1}"#,
    );
    assert_eq!(code, 200, "{answer}");
    assert_eq!(answer["decision"]["allowed"], true, "{answer}");
}

#[test]
fn a_bad_read_digest_stops_either_daemon_at_start() {
    let dir = scratch("read_token", "bad_digest", Some(LIMITS));
    let mut agent = Command::new(env!("CARGO_BIN_EXE_allot"));
    support::agent_args(&mut agent, &dir, "a", None);
    let coordinator = support::coordinator_cmd(&dir);
    for mut cmd in [agent, coordinator] {
        cmd.args(["--read-token-sha256", "abc"]);
        let out = cmd.output().expect("allot runs");
        assert!(!out.status.success(), "started with a bad digest");
        let err = text(&out.stderr);
        assert!(err.contains("--read-token-sha256"), "{err}");
        assert!(err.contains("64 hex digits"), "{err}");
    }
}
